// The tests' own definition of the sparse page-selection rule (oomb-sparse.h), shared by
// test-sparse (CPU kernel) and test-cuda-sparse (CUDA kernel): double-precision page scores
// written from the rule's text, and a check of a page_select result against them.
#pragma once

#include "oomb-sparse.h"

#include <cstdint>
#include <vector>

namespace oombtest {

struct SparseRefCase {
    int D, H, Hkv, P, pos0, T, K, sink, local;
    oomb_sparse_score score;
};

/// score[j][p] of history page p for query tile j of the chunk (c.T consecutive positions from
/// c.pos0): q f32 [D, H, T] and the summaries [D, S, Hkv, n_pages] as flat vectors.
std::vector<std::vector<double>> sparse_ref_scores(const SparseRefCase & c, const std::vector<double> & q, const std::vector<double> & sm);

/// GoogleTest checks of a page_select result sel (offsets [nqt + 1], then the pages) against the
/// rule: offsets, each tile's K (or every history page below the budget) pages ascending, the
/// always-kept pages in, and no unselected free page scoring above a selected one (beyond a
/// relative 1e-5: a near tie may order either way in float).
void sparse_check_lists(const SparseRefCase & c, const int32_t * sel, int64_t nqt, const std::vector<std::vector<double>> & score);

} // namespace oombtest
