// Page schedules of paged attention (oomb-schedule.h): constructors, the host check of page lists
// and their inversion for the backward's key-major loops.

#include "oomb-schedule.h"
#include "oomb-impl.h"

#include <cinttypes>
#include <vector>

struct oomb_page_schedule oomb_schedule_dense(void) {
    oomb_page_schedule s{};
    s.kind = OOMB_SCHEDULE_DENSE;
    return s;
}

struct oomb_page_schedule oomb_schedule_range(int32_t first, int32_t last) {
    if (first < 0 || last < first) oomb_error("schedule_range: page range [%d, %d) must have 0 <= first <= last", first, last);
    oomb_page_schedule s{};
    s.kind = OOMB_SCHEDULE_RANGE;
    s.first = first;
    s.last = last;
    return s;
}

struct oomb_page_schedule oomb_schedule_lists(struct oomb_tensor * offsets, struct oomb_tensor * pages,
                                              struct oomb_tensor * inv_offsets, struct oomb_tensor * inv_qtiles) {
    oomb_page_schedule s{};
    s.kind = OOMB_SCHEDULE_LISTS;
    s.offsets = offsets;
    s.pages = pages;
    s.inv_offsets = inv_offsets;
    s.inv_qtiles = inv_qtiles;
    return s;
}

struct oomb_page_schedule oomb_schedule_lists_range(struct oomb_tensor * offsets, struct oomb_tensor * pages,
                                                    struct oomb_tensor * inv_offsets, struct oomb_tensor * inv_qtiles,
                                                    int32_t first, int32_t last) {
    if (first < 0 || last < first)
        oomb_error("schedule_lists_range: page range [%d, %d) must have 0 <= first <= last", first, last);
    oomb_page_schedule s = oomb_schedule_lists(offsets, pages, inv_offsets, inv_qtiles);
    s.kind = OOMB_SCHEDULE_LISTS_RANGE;
    s.first = first;
    s.last = last;
    return s;
}

int oomb_schedule_has_lists(enum oomb_page_schedule_kind kind) {
    return kind == OOMB_SCHEDULE_LISTS || kind == OOMB_SCHEDULE_LISTS_RANGE;
}

void oomb_schedule_check_lists(const int32_t * offsets, int64_t n_qtiles, const int32_t * pages, int64_t nnz, int64_t n_hist,
                               const char * op) {
    if (n_qtiles < 0) oomb_error("%s: %" PRId64 " query tiles", op, n_qtiles);
    if (offsets[0] != 0) oomb_error("%s: page lists: offsets[0] = %d, must be 0", op, offsets[0]);
    for (int64_t j = 0; j < n_qtiles; j++)
        if (offsets[j + 1] < offsets[j])
            oomb_error("%s: page lists: offsets[%" PRId64 "] = %d < offsets[%" PRId64 "] = %d (must not decrease)", op, j + 1,
                       offsets[j + 1], j, offsets[j]);
    if (offsets[n_qtiles] != nnz)
        oomb_error("%s: page lists: offsets[%" PRId64 "] = %d, but the lists hold %" PRId64 " entries", op, n_qtiles,
                   offsets[n_qtiles], nnz);
    for (int64_t j = 0; j < n_qtiles; j++) {
        for (int32_t i = offsets[j]; i < offsets[j + 1]; i++) {
            if (pages[i] < 0 || pages[i] >= n_hist)
                oomb_error("%s: page lists: query tile %" PRId64 " lists page %d, outside the history [0, %" PRId64 ")", op, j,
                           pages[i], n_hist);
            if (i > offsets[j] && pages[i] <= pages[i - 1])
                oomb_error("%s: page lists: query tile %" PRId64 " lists page %d after %d (must be strictly ascending)", op, j,
                           pages[i], pages[i - 1]);
        }
    }
}

void oomb_schedule_invert(const int32_t * offsets, int64_t n_qtiles, const int32_t * pages, int64_t n_hist,
                          int32_t * inv_offsets, int32_t * inv_qtiles) {
    const int64_t nnz = offsets[n_qtiles];
    oomb_schedule_check_lists(offsets, n_qtiles, pages, nnz, n_hist, "schedule_invert");
    std::vector<int32_t> count(n_hist + 1, 0);
    for (int64_t i = 0; i < nnz; i++) count[pages[i] + 1]++;
    inv_offsets[0] = 0;
    for (int64_t h = 0; h < n_hist; h++) inv_offsets[h + 1] = inv_offsets[h] + count[h + 1];
    std::vector<int32_t> fill(inv_offsets, inv_offsets + n_hist);
    // query tiles in ascending order, so each inverse list comes out ascending
    for (int64_t j = 0; j < n_qtiles; j++)
        for (int32_t i = offsets[j]; i < offsets[j + 1]; i++) inv_qtiles[fill[pages[i]]++] = (int32_t) j;
}
