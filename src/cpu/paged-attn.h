// CPU kernels of the paged-attention ops (called by the CPU backend).
#pragma once
#include "oomb.h"

namespace oomb {
/// dst = paged_attn(...) (see oomb_paged_attn): the packed node (out, then the LSE per row); n_threads workers.
void cpu_paged_attn(oomb_tensor * dst, int n_threads);
/// dst = paged_attn_back(...) (see oomb_paged_attn_back); accumulates into the gradient pages; uses the
/// forward's saved statistics when src[8] is set.
void cpu_paged_attn_back(oomb_tensor * dst, int n_threads);
} // namespace oomb
