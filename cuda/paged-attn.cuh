// Paged flash attention on the CUDA backend (OOMB_OP_PAGED_ATTN / OOMB_OP_PAGED_ATTN_BACK).
// The backend (backend-cuda.cu) dispatches these nodes here; semantics are those of
// oomb_paged_attn / oomb_paged_attn_back in oomb.h (CPU reference: src/cpu/paged-attn.cpp).
#pragma once

#include <cuda_runtime.h>

#include "oomb.h"

void oomb_cuda_paged_attn(cudaStream_t stream, oomb_tensor * dst);
void oomb_cuda_paged_attn_back(cudaStream_t stream, oomb_tensor * dst);

/// Whether the Hopper wgmma kernels run the forward (backward = 0) or the backward (1) of paged
/// attention with bf16 pools of this head dim and page size on the current device: an sm_90a build
/// on a compute capability 9.0 GPU, head dim 64 or 128 (the forward: a page size multiple of 128),
/// not turned off by OOMB_PAGED_ATTN_WGMMA. An invalid OOMB_PAGED_ATTN_WGMMA is an error.
bool oomb_cuda_paged_attn_uses_wgmma(int head_dim, int page_size, int backward);
