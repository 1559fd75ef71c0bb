// Page schedules of paged attention (oomb_paged_attn_ext / oomb_paged_attn_back_ext in oomb.h):
// which logical pages of the KV cache each query tile attends.
//
// Terms. P is the page size (k_pages->ne[2]); pos is the op's i32 [T] position of each query. The
// chunk's *current region* starts at logical page c0 = pos[0] / P; its *history* is the logical
// pages 0 .. c0-1. Query t belongs to *query tile* qt(t) = pos[t] / P - c0 (one logical page of
// queries; with consecutive positions a chunk of T queries starting mid-page has
// (pos[0] % P + T + P - 1) / P tiles). A key at position p lies in logical page p / P. The causal
// mask p <= pos[t] always applies.
//
// Kinds:
//   DENSE  every position 0..pos[t] (today's oomb_paged_attn; no tensors).
//   RANGE  only keys of logical pages first <= p / P < last (and p <= pos[t]); no automatic current
//          region: for streaming the history in blocks whose results are merged through the LSE.
//          A row that sees no key gets out = 0 and LSE = -inf (oomb.h).
//   LISTS  the current region (p / P >= c0, p <= pos[t]) plus, for query tile j, the history pages
//          pages[offsets[j] .. offsets[j+1]) (CSR, sorted strictly ascending, each < c0): for top-K
//          sparse selection. offsets: i32 [n_qtiles + 1] (offsets[0] = 0, non-decreasing); pages:
//          i32 [nnz], nnz = offsets[n_qtiles] (a tensor of at least one element: pad with any
//          value when nnz = 0). Every query tile qt(t) of the chunk must be < n_qtiles.
//          The backward also takes the *inverse lists* (for each history page h < n_hist, the query
//          tiles that chose it, ascending): inv_offsets i32 [n_hist + 1], inv_qtiles i32 [nnz],
//          built by oomb_schedule_invert and uploaded like the lists. n_hist must be > every
//          listed page (c0 is the natural choice). LISTS need pos[0] to be the chunk's smallest position
//          (query tiles are counted from it).
//   LISTS_RANGE  LISTS restricted to the logical pages first <= p / P < last: a query of tile j sees
//          the keys of the pages in the window that its list names, and the current region's pages in
//          the window (causally); nothing outside it, so no automatic current region. The same list
//          tensors as LISTS (the backward also the inverse). For streaming a sparse history in page
//          blocks whose results are merged through the LSE (oomb-offload.h): LISTS_RANGE [c0, c1) is
//          the current region, and the windows of the history blocks partition [0, c0), so the blocks
//          together attend exactly what LISTS attends. A row that sees no key: out = 0, LSE = -inf.
// The schedule tensors are op sources (i32 tensors in the backend's memory, contiguous), so a graph
// stays plannable and can be re-run after new lists are uploaded. The CPU kernels validate the
// lists (order, range, inverse consistent with the lists); the CUDA kernels do not (like pos).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct oomb_tensor;

enum oomb_page_schedule_kind {
    OOMB_SCHEDULE_DENSE = 0,
    OOMB_SCHEDULE_RANGE = 1,
    OOMB_SCHEDULE_LISTS = 2,
    OOMB_SCHEDULE_LISTS_RANGE = 3,
};

struct oomb_page_schedule {
    enum oomb_page_schedule_kind kind;
    int32_t first, last;               // RANGE, LISTS_RANGE: logical pages [first, last), 0 <= first <= last
    struct oomb_tensor * offsets;      // LISTS, LISTS_RANGE: i32 [n_qtiles + 1]
    struct oomb_tensor * pages;        // LISTS, LISTS_RANGE: i32 [nnz]
    struct oomb_tensor * inv_offsets;  // LISTS, LISTS_RANGE, backward only: i32 [n_hist + 1]
    struct oomb_tensor * inv_qtiles;   // LISTS, LISTS_RANGE, backward only: i32 [nnz]
};

/// The dense causal schedule (every page; what oomb_paged_attn uses).
struct oomb_page_schedule oomb_schedule_dense(void);
/// Keys of logical pages [first, last) only (causal mask still applied). Error: first < 0 or last < first.
struct oomb_page_schedule oomb_schedule_range(int32_t first, int32_t last);
/// Per-query-tile history page lists plus the current region. offsets / pages: see above;
/// inv_offsets / inv_qtiles: their inverse (oomb_schedule_invert), NULL for a forward only.
struct oomb_page_schedule oomb_schedule_lists(struct oomb_tensor * offsets, struct oomb_tensor * pages,
                                              struct oomb_tensor * inv_offsets, struct oomb_tensor * inv_qtiles);
/// The page lists restricted to the logical pages [first, last) (LISTS_RANGE above); tensors as
/// oomb_schedule_lists. Error: first < 0 or last < first.
struct oomb_page_schedule oomb_schedule_lists_range(struct oomb_tensor * offsets, struct oomb_tensor * pages,
                                                    struct oomb_tensor * inv_offsets, struct oomb_tensor * inv_qtiles,
                                                    int32_t first, int32_t last);
/// Whether kind takes page lists (LISTS or LISTS_RANGE).
int oomb_schedule_has_lists(enum oomb_page_schedule_kind kind);

/// Checks host lists: offsets[0] = 0, non-decreasing, offsets[n_qtiles] = nnz; each tile's pages
/// strictly ascending and in [0, n_hist). Errors (oomb_error) name `op` and the first bad entry.
void oomb_schedule_check_lists(const int32_t * offsets, int64_t n_qtiles, const int32_t * pages, int64_t nnz, int64_t n_hist,
                               const char * op);
/// Inverse lists of a valid page-list schedule (checked as oomb_schedule_check_lists): for each
/// history page h in [0, n_hist), the query tiles j whose list holds h, ascending.
/// inv_offsets: [n_hist + 1] (written), inv_qtiles: [nnz] (written), nnz = offsets[n_qtiles].
void oomb_schedule_invert(const int32_t * offsets, int64_t n_qtiles, const int32_t * pages, int64_t n_hist,
                          int32_t * inv_offsets, int32_t * inv_qtiles);

#ifdef __cplusplus
}
#endif
