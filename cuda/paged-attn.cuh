// Paged flash attention on the CUDA backend (OOMB_OP_PAGED_ATTN / OOMB_OP_PAGED_ATTN_BACK).
// The backend (backend-cuda.cu) dispatches these nodes here; semantics are those of
// oomb_paged_attn / oomb_paged_attn_back in oomb.h (CPU reference: src/paged-cpu.cpp).
#pragma once

#include <cuda_runtime.h>

#include "oomb.h"

void oomb_cuda_paged_attn(cudaStream_t stream, oomb_tensor * dst);
void oomb_cuda_paged_attn_back(cudaStream_t stream, oomb_tensor * dst);
