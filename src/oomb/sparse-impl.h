// The one definition of the sparse-selection rule's pieces (oomb-sparse.h), shared by the op
// constructors and CPU reference kernels (src/oomb/sparse.cpp) and the CUDA kernels
// (cuda/sparse.cu): node layout, tile ranges, always-kept pages, the ranking order, the Quest
// bound. Host and device.
#pragma once

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PS_HD __host__ __device__ __forceinline__
#else
#define PS_HD inline
#endif

struct oomb_tensor;

namespace oomb {

namespace cpu { class thread_pool; }
/// CPU reference kernels (src/oomb/sparse.cpp), called by the CPU backend: dst is the node; work
/// split over pool (NULL: the calling thread alone).
void cpu_page_summary(oomb_tensor * dst, cpu::thread_pool * pool);
void cpu_page_select(oomb_tensor * dst, cpu::thread_pool * pool);

// Sources of OOMB_OP_PAGE_SUMMARY (the result is a view of src[PSUM_SRC_SUMMARY]).
enum { PSUM_SRC_SUMMARY = 0, PSUM_SRC_K_PAGES, PSUM_SRC_PAGE_TABLE, PSUM_SRC_POS, PSUM_SRC_AFTER };
// Sources of OOMB_OP_PAGE_SELECT.
enum { PSEL_SRC_Q = 0, PSEL_SRC_SUMMARY, PSEL_SRC_POS };
// op_params of both.
enum { PS_PARAM_PAGE = 0, PS_PARAM_K, PS_PARAM_SCORE, PS_PARAM_SINK, PS_PARAM_LOCAL, PS_PARAM_NQT };

// Query rows [t0, t1) of tile j of a chunk of T consecutive positions from pos0 (c0 = pos0 / P).
PS_HD void ps_tile_rows(int64_t pos0, int64_t T, int64_t P, int64_t j, int64_t * t0, int64_t * t1) {
    const int64_t c0 = pos0 / P;
    int64_t a = (c0 + j) * P - pos0, b = (c0 + j + 1) * P - pos0;
    if (a < 0) a = 0;
    if (b > T) b = T;
    *t0 = a;
    *t1 = b > a ? b : a;
}

// Pages a tile lists with c0 history pages and budget K.
PS_HD int64_t ps_list_len(int64_t c0, int64_t K) { return c0 <= K ? c0 : K; }

// Whether history page p (< c0) is always kept: the first `sink` or the last `local` pages.
PS_HD bool ps_always_kept(int64_t p, int64_t c0, int64_t sink, int64_t local) { return p < sink || p >= c0 - local; }

// The ranking: does (score sa, page pa) come before (sb, pb)? Higher score first, ties: the lower
// page; a NaN score ranks below every number (NaN against NaN: the lower page).
PS_HD bool ps_ranks_before(float sa, int64_t pa, float sb, int64_t pb) {
    const bool na = sa != sa, nb = sb != sb;
    if (na || nb) return na == nb ? pa < pb : nb;
    if (sa != sb) return sa > sb;
    return pa < pb;
}

// The Quest summary's running min / max over a page's keys, NaN-propagating: a NaN key makes the
// page's min and max NaN (so its Quest bound, and its score, are NaN: ranked below every number by
// ps_ranks_before, and visible to a non-finite check), never silently skipped as fminf / std::min
// would. Otherwise std::min / std::max's result (b < a ? b : a; a < b ? b : a), bit for bit.
PS_HD float ps_min_nan(float a, float b) { return a != a ? a : b != b ? b : (b < a ? b : a); }
PS_HD float ps_max_nan(float a, float b) { return a != a ? a : b != b ? b : (a < b ? b : a); }

// One dimension's Quest bound: max over the page's keys of q_d * k_d given the key range.
PS_HD float ps_quest_term(float q, float mn, float mx) {
    const float a = q * mn, b = q * mx;
    return a > b ? a : b;
}

} // namespace oomb
