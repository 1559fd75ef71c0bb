// RMSNorm forward / backward on the CUDA backend: one block per row (rows need unit stride in dim 0;
// the dispatcher prepares them).
#pragma once

#include "common.cuh"

// y = x / sqrt(mean(x^2) + eps).
void oomb_cuda_rms_norm(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
// dx = s*dy - s^3/n * x * sum(x*dy), s = 1/sqrt(mean(x^2) + eps).
void oomb_cuda_rms_norm_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy);

// Threads per block for a row of ne0 elements (a power of two in [32, 1024]).
int oomb_cuda_row_threads(int64_t ne0, int max_threads = 512);
