// Softmax over dimension 0 (with an optional causal mask) and its backward on the CUDA backend:
// one block per row (rows need unit stride in dim 0; the dispatcher prepares them).
#pragma once

#include "common.cuh"

void oomb_cuda_soft_max(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void oomb_cuda_soft_max_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * y, const oomb_tensor * dy);
