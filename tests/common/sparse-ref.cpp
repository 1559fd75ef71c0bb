// The tests' sparse-selection reference (see sparse-ref.h).
#include "sparse-ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace oombtest {

std::vector<std::vector<double>> sparse_ref_scores(const SparseRefCase & c, const std::vector<double> & q, const std::vector<double> & sm) {
    const int c0 = c.pos0 / c.P, n_act = (c.pos0 + c.T - 1) / c.P - c0 + 1, G = c.H / c.Hkv, S = c.score == OOMB_SPARSE_SCORE_QUEST ? 2 : 1;
    std::vector<std::vector<double>> out(n_act, std::vector<double>(c0, 0.0));
    for (int t = 0; t < c.T; t++) {
        const int j = (c.pos0 + t) / c.P - c0;
        for (int g = 0; g < c.Hkv; g++) {
            std::vector<double> qs(c.D, 0.0), l(c0);
            for (int h = g * G; h < (g + 1) * G; h++)
                for (int d = 0; d < c.D; d++) qs[d] += q[((size_t) t * c.H + h) * c.D + d];
            for (int p = 0; p < c0; p++) {
                const double * a = &sm[((size_t) p * c.Hkv + g) * S * c.D];
                double v = 0;
                for (int d = 0; d < c.D; d++) v += S == 1 ? qs[d] * a[d] : std::max(qs[d] * a[d], qs[d] * a[c.D + d]);
                l[p] = v;
            }
            if (S == 2) {
                for (int p = 0; p < c0; p++) out[j][p] += l[p];
                continue;
            }
            const double m = *std::max_element(l.begin(), l.end());
            double z = 0;
            for (int p = 0; p < c0; p++) z += std::exp(l[p] - m);
            for (int p = 0; p < c0; p++) out[j][p] += std::exp(l[p] - m) / z;
        }
    }
    return out;
}

void sparse_check_lists(const SparseRefCase & c, const int32_t * sel, int64_t nqt, const std::vector<std::vector<double>> & score) {
    const int32_t * off = sel, * pages = off + nqt + 1;
    const std::vector<std::vector<double>> & sc = score;
    const int c0 = c.pos0 / c.P, n_act = (c.pos0 + c.T - 1) / c.P - c0 + 1;
    const int len = std::min(c0, c.K);
    ASSERT_EQ(off[0], 0);
    for (int64_t j = 0; j < nqt; j++) {
        SCOPED_TRACE("tile " + std::to_string(j));
        ASSERT_EQ(off[j + 1] - off[j], j < n_act ? len : 0);
        std::vector<int32_t> l(pages + off[j], pages + off[j + 1]);
        for (size_t i = 1; i < l.size(); i++) ASSERT_LT(l[i - 1], l[i]) << "ascending";
        for (int32_t x : l) ASSERT_TRUE(x >= 0 && x < c0);
        if (j >= n_act) continue;
        if (c0 <= c.K) {  // dense below the budget
            for (int i = 0; i < len; i++) EXPECT_EQ(l[i], i);
            continue;
        }
        std::vector<char> in(c0, 0);
        for (int32_t x : l) in[x] = 1;
        for (int x = 0; x < std::min(c.sink, c0); x++) EXPECT_TRUE(in[x]) << "sink page " << x;
        for (int x = std::max(0, c0 - c.local); x < c0; x++) EXPECT_TRUE(in[x]) << "local page " << x;
        double worst_in = INFINITY, best_out = -INFINITY;
        for (int x = 0; x < c0; x++) {
            const bool forced = x < c.sink || x >= c0 - c.local;
            if (forced) continue;
            if (in[x]) worst_in = std::min(worst_in, sc[j][x]);
            else best_out = std::max(best_out, sc[j][x]);
        }
        EXPECT_GE(worst_in, best_out - 1e-5 * std::max(1.0, std::fabs(best_out))) << "an unselected page scores higher";
    }
}

} // namespace oombtest
