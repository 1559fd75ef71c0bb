// Embedding lookup (get_rows) and its adjoint (get_rows_back) on the CUDA backend.
#pragma once

#include "common.cuh"

// dst[:, i, j] = a[:, ids[i, j]] converted to f32. Ids out of range are recorded (ctx.d_err) and
// reported at the end of graph_compute; their rows are written as zeros.
void oomb_cuda_get_rows(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * ids);
// dst [n_embd, n_rows] = 0, then dst[:, ids[i, j]] += dy[:, i, j] (f32 atomics).
void oomb_cuda_get_rows_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * dy, const oomb_tensor * ids);
