// CPU kernels of the paged-attention ops (called by the CPU backend).
#pragma once
#include "oomb.h"

namespace oomb {
namespace cpu { class thread_pool; }
/// dst = paged_attn(...) (see oomb_paged_attn): the packed node (out, then the LSE per row); work split over the backend's pool (NULL: the calling thread alone).
void cpu_paged_attn(oomb_tensor * dst, cpu::thread_pool * pool);
/// dst = paged_attn_back(...) (see oomb_paged_attn_back); accumulates into the gradient pages; uses the
/// forward's saved statistics when the op has the forward's node (oomb_paged_attn_args::fwd).
void cpu_paged_attn_back(oomb_tensor * dst, cpu::thread_pool * pool);
} // namespace oomb
