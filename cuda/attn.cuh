// Reference causal GQA attention (oomb_attn / oomb_attn_back) on the CUDA backend: simple and
// correct, not tiled for speed (the fast path is paged attention, paged-attn.cu).
// Rows of q, k, v, dout need unit stride in dim 0 (the dispatcher prepares them).
#pragma once

#include "common.cuh"

void oomb_cuda_attn(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v);
void oomb_cuda_attn_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v,
                         const oomb_tensor * dout);
