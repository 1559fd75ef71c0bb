// Internal layout of the paged-attention nodes and the one definition of "which keys a query row
// attends" under a page schedule (oomb-schedule.h), shared by the op constructors (oomb.cpp), the
// CPU kernels (cpu/paged-attn.cpp) and the CUDA kernels (cuda/paged-attn*.cuh): host and device.
// Only oomb.cpp (oomb_paged_attn_args_of) indexes node->src with the constants below; everything
// else reads the operands through oomb_paged_attn_args.
#pragma once

#include <stdint.h>

#include "oomb.h"

#ifdef __CUDACC__
#define PA_HD __host__ __device__ __forceinline__
#else
#define PA_HD inline
#endif

namespace oomb {

// Sources of OOMB_OP_PAGED_ATTN (the packed node).
enum { PA_SRC_Q = 0, PA_SRC_K_CUR, PA_SRC_V_CUR, PA_SRC_K_PAGES, PA_SRC_V_PAGES, PA_SRC_PAGE_TABLE, PA_SRC_POS, PA_SRC_OUT_CACHE,
       PA_SRC_SCHED_OFFSETS, PA_SRC_SCHED_PAGES, PA_SRC_INV_OFFSETS, PA_SRC_INV_QTILES };
// Sources of OOMB_OP_PAGED_ATTN_BACK.
enum { PAB_SRC_Q = 0, PAB_SRC_K_PAGES, PAB_SRC_V_PAGES, PAB_SRC_DK_PAGES, PAB_SRC_DV_PAGES, PAB_SRC_PAGE_TABLE, PAB_SRC_POS,
       PAB_SRC_DOUT, PAB_SRC_FWD, PAB_SRC_SCHED_OFFSETS, PAB_SRC_SCHED_PAGES, PAB_SRC_INV_OFFSETS, PAB_SRC_INV_QTILES };
// op_params of both: [0] scale (f32 bits), [1] store, [2] cache mode (0 none, 1 save, 2 load),
// [3] schedule kind, [4] range first, [5] range last, [6] accumulate (oomb_paged_attn_args).
enum { PA_PARAM_SCALE = 0, PA_PARAM_STORE, PA_PARAM_CACHE, PA_PARAM_SCHED_KIND, PA_PARAM_SCHED_FIRST, PA_PARAM_SCHED_LAST,
       PA_PARAM_ACCUM };

// A schedule as the kernels see it (pointers to the i32 lists in the kernel's memory).
struct pa_sched {
    int kind;                    // enum oomb_page_schedule_kind
    int first, last;             // RANGE
    const int32_t * offsets;     // LISTS [n_qtiles + 1]
    const int32_t * pages;       // LISTS [nnz]
    int n_qtiles;
    const int32_t * inv_offsets; // LISTS backward [n_hist + 1] (may be NULL in a forward)
    const int32_t * inv_qtiles;  // LISTS backward [nnz]
    int n_hist;
};

// Does ascending list a[lo, hi) hold v?
PA_HD bool pa_list_has(const int32_t * a, int lo, int hi, int v) {
    const int end = hi;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < end && a[lo] == v;
}

// Whether a query of tile qt (= its position / P - c0, c0 = pos[0] / P) attends keys of logical
// page lp (the causal mask p <= pos[t] applies on top), read from the forward lists.
// Is logical page lp inside the window of a RANGE or LISTS_RANGE schedule (always, for the others)?
PA_HD bool pa_sched_in_window(const pa_sched & s, int lp) {
    return (s.kind != 1 && s.kind != 3) || (lp >= s.first && lp < s.last);
}
PA_HD bool pa_sched_attends(const pa_sched & s, int c0, int qt, int lp) {
    if (s.kind == 0) return true;                          // DENSE
    if (!pa_sched_in_window(s, lp)) return false;          // RANGE, LISTS_RANGE: outside the window
    if (s.kind == 1 || lp >= c0) return true;              // RANGE; LISTS: the current region
    if (qt < 0 || qt >= s.n_qtiles) return false;
    return pa_list_has(s.pages, s.offsets[qt], s.offsets[qt + 1], lp);
}
// The same question for the backward's key-major loops, read from the inverse lists (history page
// lp chosen by query tile qt?). Equal to pa_sched_attends for a valid inverse.
PA_HD bool pa_sched_attends_inv(const pa_sched & s, int c0, int qt, int lp) {
    if (s.kind < 2 || lp >= c0) return pa_sched_attends(s, c0, qt, lp);
    if (!pa_sched_in_window(s, lp) || lp < 0 || lp >= s.n_hist) return false;
    return pa_list_has(s.inv_qtiles, s.inv_offsets[lp], s.inv_offsets[lp + 1], qt);
}
// Can any query row see keys of logical page lp (before the causal mask)? False for a page outside
// a window and for a history page no list names (read from the inverse lists): the backward's
// key-major loops skip such a page before reading it, so its page-table entry may be unmapped
// (the offload engine maps only the pages some tile listed).
PA_HD bool pa_sched_page_used(const pa_sched & s, int c0, int lp) {
    if (s.kind == 0) return true;
    if (!pa_sched_in_window(s, lp)) return false;
    if (s.kind == 1 || lp >= c0 || !s.inv_offsets) return true;
    return lp >= 0 && lp < s.n_hist && s.inv_offsets[lp + 1] > s.inv_offsets[lp];
}
// The kernels' view of an op's schedule (host pointers into the tensors' data, wherever it lives).
inline pa_sched pa_sched_of(const oomb_page_schedule & s) {
    pa_sched r{};
    r.kind = (int) s.kind;
    r.first = s.first;
    r.last = s.last;
    if (s.kind == OOMB_SCHEDULE_LISTS || s.kind == OOMB_SCHEDULE_LISTS_RANGE) {
        r.offsets = (const int32_t *) s.offsets->data;
        r.pages = (const int32_t *) s.pages->data;
        r.n_qtiles = (int) (oomb_nelements(s.offsets) - 1);
        if (s.inv_offsets && s.inv_qtiles) {
            r.inv_offsets = (const int32_t *) s.inv_offsets->data;
            r.inv_qtiles = (const int32_t *) s.inv_qtiles->data;
            r.n_hist = (int) (oomb_nelements(s.inv_offsets) - 1);
        }
    }
    return r;
}

// Query tile of a query at position p.
PA_HD int pa_qtile(int p, int c0, int P) { return p / P - c0; }

} // namespace oomb
