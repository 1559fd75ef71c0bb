// CUDA kernels of sparse attention (cuda/sparse.cu) against the CPU reference kernels
// (src/oomb/sparse.cpp) on random data, through the backends' graph_compute:
//  * page_summary: f32 and bf16 pools, a shuffled page table, chunks starting mid-page, mean and
//    quest: bit-identical (the same summation order);
//  * page_select: head dims 64 / 128, GQA 7 and 1, page 16, histories of 37 and 301 pages with
//    budgets 7 and 64 (none divides another), chunks of 45 / 100 positions starting mid-page,
//    sink and local pages, mean and quest, a history within the budget (dense): the same offsets
//    as the CPU, page lists that obey the rule against the tests' double-precision scores
//    (tests/common/sparse-ref.h, as test-sparse checks the CPU kernel), and the count of entries
//    that differ from the CPU's printed (the GPU's softmax sums over pages in a tree and its expf
//    differs in the last bits, so only a near tie can order differently).
// Every test skips with a visible reason where no GPU is present.
#include "oomb.h"
#include "oomb-alloc.h"
#include "oomb-backend.h"
#include "oomb-sparse.h"
#include "sparse-ref.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

#define SKIP_WITHOUT_GPU() \
    do { if (!oomb_cuda_available()) GTEST_SKIP() << "no CUDA GPU"; } while (0)

oomb_backend_t backend(bool cuda) {
    // each made on first use (a static initialised from the first call's argument would stay NULL
    // for the GPU when the CPU run comes first)
    if (!cuda) {
        static oomb_backend_t c = oomb_backend_cpu_init(2);
        return c;
    }
    static oomb_backend_t g = oomb_cuda_available() ? oomb_backend_cuda_init(0) : nullptr;
    return g;
}

// Host data of one case's operands; run() builds the op on a backend and returns its result bytes.
struct Operand {
    oomb_type type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
};

std::vector<uint8_t> run(bool cuda, const std::vector<Operand> & ops,
                         const std::function<oomb_tensor *(oomb_context *, std::vector<oomb_tensor *> &)> & build) {
    oomb_context * ctx = oomb_init({0, true});
    std::vector<oomb_tensor *> t;
    for (const Operand & o : ops) t.push_back(oomb_new_tensor(ctx, o.type, (int) o.ne.size(), o.ne.data()));
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(ctx, backend(cuda));
    for (size_t i = 0; i < ops.size(); i++) oomb_tensor_set(t[i], ops[i].bytes.data(), 0, ops[i].bytes.size());
    oomb_tensor * out = build(ctx, t);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, out);
    oomb_gallocr_t ga = oomb_gallocr_new(backend(cuda));
    EXPECT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    EXPECT_EQ(oombtest::compute_checked(backend(cuda), g, __FILE__, __LINE__), OOMB_STATUS_OK);
    std::vector<uint8_t> r(oomb_nbytes(out));
    oomb_tensor_get(out, r.data(), 0, r.size());
    oomb_gallocr_free(ga);
    oomb_buffer_free(buf);
    oomb_free(ctx);
    return r;
}

Operand random_op(oomb_type type, std::vector<int64_t> ne, std::mt19937 & rng, float lo, float hi) {
    oomb_context * c = oomb_init({0, false});
    oomb_tensor * t = oomb_new_tensor(c, type, (int) ne.size(), ne.data());
    oombtest::fill_uniform(t, rng, lo, hi);
    Operand o{type, ne, std::vector<uint8_t>((const uint8_t *) t->data, (const uint8_t *) t->data + oomb_nbytes(t))};
    oomb_free(c);
    return o;
}

Operand i32_op(const std::vector<int32_t> & v) {
    return Operand{OOMB_TYPE_I32, {(int64_t) v.size()}, std::vector<uint8_t>((const uint8_t *) v.data(), (const uint8_t *) (v.data() + v.size()))};
}

std::vector<int32_t> positions(int pos0, int T) {
    std::vector<int32_t> p(T);
    std::iota(p.begin(), p.end(), pos0);
    return p;
}

TEST(CudaSparse, SummaryMatchesCpu) {
    SKIP_WITHOUT_GPU();
    struct C { int D, Hkv, P, pos0, T, S; oomb_type type; };
    for (const C & c : {C{64, 2, 16, 37, 45, 1, OOMB_TYPE_BF16}, C{128, 4, 16, 5, 100, 2, OOMB_TYPE_F32}, C{64, 1, 16, 30, 3, 2, OOMB_TYPE_BF16}}) {
        SCOPED_TRACE("D" + std::to_string(c.D) + " Hkv" + std::to_string(c.Hkv) + " pos0 " + std::to_string(c.pos0) + " T" + std::to_string(c.T) +
                     " S" + std::to_string(c.S));
        std::mt19937 rng(7 + c.D + c.S);
        const int n_logical = (c.pos0 + c.T) / c.P + 2, n_phys = n_logical + 3;
        std::vector<int32_t> perm(n_phys);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        perm.resize(n_logical);
        const std::vector<Operand> ops = {random_op(c.type, {c.D, c.Hkv, c.P, n_phys}, rng, -2, 2), i32_op(perm), i32_op(positions(c.pos0, c.T)),
                                          random_op(OOMB_TYPE_F32, {c.D, c.S, c.Hkv, n_logical}, rng, -1, 1)};
        auto build = [](oomb_context * ctx, std::vector<oomb_tensor *> & t) { return oomb_page_summary(ctx, t[0], t[1], t[2], t[3], nullptr); };
        EXPECT_EQ(run(true, ops, build), run(false, ops, build));
    }
}

// A NaN key makes its page's summary NaN on both backends (mean through the sum, quest through
// oomb::ps_min_nan / ps_max_nan: fminf / fmaxf would skip it), bit for bit as the CPU: one NaN in
// the K pool at (dim 3, KV head 1, slot 5) of a page the chunk stores, f32 and bf16 pools.
TEST(CudaSparse, SummaryNanKeyMatchesCpu) {
    SKIP_WITHOUT_GPU();
    const int D = 64, Hkv = 2, P = 16, pos0 = 37, T = 45;
    for (oomb_type type : {OOMB_TYPE_F32, OOMB_TYPE_BF16})
        for (int S : {1, 2}) {
            SCOPED_TRACE(std::string(oomb_type_name(type)) + " S" + std::to_string(S));
            std::mt19937 rng(11 + S);
            const int n_logical = (pos0 + T) / P + 2, n_phys = n_logical + 3;
            std::vector<int32_t> perm(n_phys);
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            perm.resize(n_logical);
            Operand kp = random_op(type, {D, Hkv, P, n_phys}, rng, -2, 2);
            const int lp = pos0 / P + 1;  // a logical page the chunk covers whole
            const size_t at = (((size_t) perm[lp] * P + 5) * Hkv + 1) * D + 3;
            if (type == OOMB_TYPE_F32) ((float *) kp.bytes.data())[at] = NAN;
            else ((uint16_t *) kp.bytes.data())[at] = 0x7fc0;
            const std::vector<Operand> ops = {kp, i32_op(perm), i32_op(positions(pos0, T)), random_op(OOMB_TYPE_F32, {D, S, Hkv, n_logical}, rng, -1, 1)};
            auto build = [](oomb_context * ctx, std::vector<oomb_tensor *> & t) { return oomb_page_summary(ctx, t[0], t[1], t[2], t[3], nullptr); };
            const std::vector<uint8_t> g = run(true, ops, build), h = run(false, ops, build);
            // bit for bit, except a NaN's payload (the mean's NaN comes out of the GPU's arithmetic as
            // the canonical NaN, the CPU's keeps the key's: both NaN is equal here)
            ASSERT_EQ(g.size(), h.size());
            const float * gf = (const float *) g.data(), * sf = (const float *) h.data();
            int differ = 0;
            for (size_t i = 0; i < h.size() / 4; i++)
                differ += std::isnan(gf[i]) != std::isnan(sf[i]) || (!std::isnan(sf[i]) && memcmp(gf + i, sf + i, 4) != 0);
            EXPECT_EQ(differ, 0) << "summary elements that differ from the CPU's";
            int nan_count = 0;
            for (size_t i = 0; i < h.size() / 4; i++) nan_count += std::isnan(sf[i]);
            EXPECT_EQ(nan_count, S) << "the NaN key's page: its summary element(s) of dim 3, KV head 1 (mean; min and max)";
        }
}

TEST(CudaSparse, SelectMatchesCpu) {
    SKIP_WITHOUT_GPU();
    const oombtest::SparseRefCase cases[] = {
        {64, 14, 2, 16, 37 * 16 + 5, 45, 7, 0, 0, OOMB_SPARSE_SCORE_MEAN},
        {128, 28, 4, 16, 301 * 16 + 9, 100, 64, 1, 2, OOMB_SPARSE_SCORE_MEAN},
        {64, 4, 4, 16, 37 * 16 + 5, 45, 7, 1, 0, OOMB_SPARSE_SCORE_QUEST},
        {128, 28, 4, 16, 301 * 16, 100, 64, 0, 0, OOMB_SPARSE_SCORE_QUEST},
        {64, 14, 2, 16, 6 * 16 + 3, 45, 7, 0, 0, OOMB_SPARSE_SCORE_MEAN},  // 6 history pages <= K: dense
    };
    // budget "": the default logits scratch (one GEMM pass); 4000 / 60000 bytes: the mean score's logits split
    // into passes per KV head and 1 or 2 tiles (cuda/sparse.cu, OOMB_PAGE_SELECT_SCRATCH)
    for (const char * budget : {"", "4000", "60000"})
    for (const oombtest::SparseRefCase & c : cases) {
        if (*budget && c.score != OOMB_SPARSE_SCORE_MEAN) continue;
        setenv("OOMB_PAGE_SELECT_SCRATCH", budget, 1);
        SCOPED_TRACE(std::string("logits budget '") + budget + "' D" + std::to_string(c.D) + " H" + std::to_string(c.H) + "/" + std::to_string(c.Hkv) + " pos0 " + std::to_string(c.pos0) +
                     " T" + std::to_string(c.T) + " K" + std::to_string(c.K) + (c.score ? " quest" : " mean"));
        std::mt19937 rng(3 + c.D + c.K);
        const int S = oomb_sparse_summary_slots(c.score), n_logical = (c.pos0 + c.T) / c.P + 2;
        Operand sm = random_op(OOMB_TYPE_F32, {c.D, S, c.Hkv, n_logical}, rng, -1, 1);
        if (S == 2) {  // min <= max
            float * a = (float *) sm.bytes.data();
            for (int64_t i = 0; i < (int64_t) sm.bytes.size() / 4 / (2 * c.D); i++)
                for (int d = 0; d < c.D; d++)
                    if (a[i * 2 * c.D + d] > a[i * 2 * c.D + c.D + d]) std::swap(a[i * 2 * c.D + d], a[i * 2 * c.D + c.D + d]);
        }
        const std::vector<Operand> ops = {random_op(OOMB_TYPE_F32, {c.D, c.H, c.T}, rng, -1.5f, 1.5f), sm, i32_op(positions(c.pos0, c.T))};
        const int64_t nqt = oomb_page_select_max_qtiles(c.T, c.P);
        const oomb_sparse_params sp = {c.K, c.score, c.sink, c.local};
        auto build = [&](oomb_context * ctx, std::vector<oomb_tensor *> & t) { return oomb_page_select(ctx, t[0], t[1], t[2], c.P, nqt, &sp); };
        const std::vector<uint8_t> g = run(true, ops, build), h = run(false, ops, build);
        const int32_t * go = (const int32_t *) g.data(), * ho = (const int32_t *) h.data();
        for (int64_t j = 0; j <= nqt; j++) ASSERT_EQ(go[j], ho[j]) << "offsets[" << j << "]";
        // the GPU's lists obey the rule (the tests' double-precision scores), and how many entries differ from the CPU's
        const std::vector<float> qf((const float *) ops[0].bytes.data(), (const float *) ops[0].bytes.data() + ops[0].bytes.size() / 4);
        const std::vector<float> sf((const float *) ops[1].bytes.data(), (const float *) ops[1].bytes.data() + ops[1].bytes.size() / 4);
        oombtest::sparse_check_lists(c, go, nqt, oombtest::sparse_ref_scores(c, std::vector<double>(qf.begin(), qf.end()),
                                                                           std::vector<double>(sf.begin(), sf.end())));
        int64_t differ = 0;
        for (int64_t i = 0; i < ho[nqt]; i++) differ += go[nqt + 1 + i] != ho[nqt + 1 + i];
        printf("%s: %lld of %d list entries differ from the CPU's (near ties only: the rule check above passed or failed)\n",
               ::testing::UnitTest::GetInstance()->current_test_info()->name(), (long long) differ, ho[nqt]);
    }
    unsetenv("OOMB_PAGE_SELECT_SCRATCH");
}

} // namespace
