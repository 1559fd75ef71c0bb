// oomb-eval's windows (examples/eval-windows.h): our default (every next id of each window of ctx,
// the last shorter window included) and llama-perplexity's --score-second-half convention (whole
// windows only, BOS first, positions ctx/2 .. ctx-2 scored), on lengths that do not divide ctx;
// the bad inputs are named. The end-to-end check against llama.cpp itself is
// tests/py/test_llamacpp_interop.py.
#include "eval-windows.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

using namespace oomb::train;

namespace {

std::vector<int32_t> stream(int64_t n) {
    std::vector<int32_t> ids((size_t) n);
    for (int64_t i = 0; i < n; i++) ids[(size_t) i] = (int32_t) (1000 + 7 * i);  // distinct, never 0 / -100
    return ids;
}

} // namespace

TEST(EvalWindows, DefaultCoversEveryNextId) {
    const auto ids = stream(23);
    EvalWindowing w;
    w.ctx = 8;
    int64_t count = 0;
    std::string err;
    ASSERT_TRUE(eval_window_count(23, w, &count, &err)) << err;
    EXPECT_EQ(count, 3);  // 8 + 8 + 7
    int64_t targets = 0, covered = 0;
    for (int64_t k = 0; k < count; k++) {
        const EvalWindow r = eval_window(ids.data(), 23, k, w);
        EXPECT_EQ(r.offset, 8 * k);
        EXPECT_TRUE(r.labels.empty());
        EXPECT_EQ(r.ids, std::vector<int32_t>(ids.begin() + r.offset, ids.begin() + r.offset + (k < 2 ? 8 : 7)));
        targets += r.n_targets;
        covered += (int64_t) r.ids.size();
    }
    EXPECT_EQ(covered, 23);
    EXPECT_EQ(targets, 7 + 7 + 6);
    // a last window of one token has no target: not a window
    ASSERT_TRUE(eval_window_count(17, w, &count, &err));
    EXPECT_EQ(count, 2);
    // ctx longer than the data: one window of all of it
    w.ctx = 100;
    ASSERT_TRUE(eval_window_count(23, w, &count, &err));
    EXPECT_EQ(count, 1);
    EXPECT_EQ(eval_window(ids.data(), 23, 0, w).ids.size(), 23u);
    EXPECT_FALSE(eval_window_count(1, w, &count, &err));
    EXPECT_NE(err.find("at least 2"), std::string::npos) << err;
}

TEST(EvalWindows, SecondHalfAsLlamaPerplexity) {
    // llama-perplexity: n_chunk = n / n_ctx, first = n_ctx / 2, logits of positions first .. n_ctx-2
    // scored against tokens first+1 .. n_ctx-1; BOS replaces each chunk's first token
    for (const int64_t ctx : {3, 7, 10, 16}) {
        for (const int32_t bos : {-1, 5}) {
            const int64_t n = 3 * ctx + ctx / 2 + 1;  // a remainder that is not scored
            const auto ids = stream(n);
            EvalWindowing w;
            w.ctx = ctx;
            w.second_half = true;
            w.bos = bos;
            int64_t count = 0;
            std::string err;
            ASSERT_TRUE(eval_window_count(n, w, &count, &err)) << err;
            EXPECT_EQ(count, 3);
            for (int64_t k = 0; k < count; k++) {
                const EvalWindow r = eval_window(ids.data(), n, k, w);
                ASSERT_EQ((int64_t) r.ids.size(), ctx);
                ASSERT_EQ((int64_t) r.labels.size(), ctx);
                EXPECT_EQ(r.offset, k * ctx);
                EXPECT_EQ(r.ids[0], bos >= 0 ? bos : ids[(size_t) (k * ctx)]) << "ctx " << ctx;
                for (int64_t i = 1; i < ctx; i++) EXPECT_EQ(r.ids[(size_t) i], ids[(size_t) (k * ctx + i)]);
                int64_t scored = 0;
                for (int64_t i = 0; i < ctx; i++) {
                    const bool want = i >= ctx / 2 && i <= ctx - 2;
                    EXPECT_EQ(r.labels[(size_t) i], want ? ids[(size_t) (k * ctx + i + 1)] : w.ignore_index)
                        << "ctx " << ctx << " window " << k << " position " << i;
                    scored += want;
                }
                EXPECT_EQ(r.n_targets, scored);
                EXPECT_EQ(r.n_targets, ctx - ctx / 2 - 1);
            }
        }
    }
}

TEST(EvalWindows, SecondHalfBadInputsNamed) {
    EvalWindowing w;
    w.second_half = true;
    int64_t count = 0;
    std::string err;
    w.ctx = 2;
    EXPECT_FALSE(eval_window_count(100, w, &count, &err));
    EXPECT_NE(err.find("--ctx >= 3"), std::string::npos) << err;
    w.ctx = 64;
    EXPECT_FALSE(eval_window_count(63, w, &count, &err));
    EXPECT_NE(err.find("fewer than one window of --ctx 64"), std::string::npos) << err;
    EXPECT_TRUE(eval_window_count(64, w, &count, &err)) << err;
    EXPECT_EQ(count, 1);
}
