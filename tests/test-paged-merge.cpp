// oomb_paged_attn_merge on the CPU: the log-sum-exp merge of two partial paged-attention results
// against a double-precision reference on random data (rows where one side or both sides saw no
// key: LSE -inf, the -inf side's out filled with garbage that must not be read), bit-identical with
// 1 and 2 threads; the property the streaming engine relies on: oomb_paged_attn_ext DENSE equals
// the merge of RANGE results over disjoint page blocks that cover the history and the chunk (page 5,
// a chunk starting mid-page, an empty block, f32 and bf16 pools, in one graph and in separate
// graphs); input errors; and a backward built through the merge is an error.
#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-schedule.h"
#include "oomb-alloc.h"
#include "../src/oomb/paged-attn-sched.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

oomb_backend_t cpu(int threads) {
    static oomb_backend_t b = oomb_backend_cpu_init(2);
    oomb_backend_cpu_set_n_threads(b, threads);
    return b;
}

void compute(oomb_context * ctx, oomb_tensor * t, int threads = 2) {
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, t);
    ASSERT_EQ(oombtest::compute_checked(cpu(threads), g, __FILE__, __LINE__), OOMB_STATUS_OK);
}

std::vector<float> vec(const oomb_tensor * t) {
    const float * p = (const float *) t->data;
    return std::vector<float>(p, p + oomb_nelements(t));
}

// Random packed results of D*H*T + H*T: outs in [-1, 1), LSEs in [-4, 6); row kinds by r % 7:
// 0: acc's LSE -inf, 1: part's LSE -inf, 2: both -inf, 3: equal LSEs, 4: LSEs 120 apart (the small
// weight underflows in f32), else random. The out of an -inf side holds garbage (+-1e30), never to be read.
void fill_pair(std::vector<float> & a, std::vector<float> & p, int64_t D, int64_t R, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), l(-4.0f, 6.0f);
    a.resize((size_t) (D * R + R));
    p.resize(a.size());
    for (int64_t r = 0; r < R; r++) {
        float la = l(rng), lp = l(rng);
        const int kind = (int) (r % 7);
        if (kind == 0 || kind == 2) la = -INFINITY;
        if (kind == 1 || kind == 2) lp = -INFINITY;
        if (kind == 3) lp = la;
        if (kind == 4) lp = la - 120.0f;
        a[(size_t) (D * R + r)] = la;
        p[(size_t) (D * R + r)] = lp;
        for (int64_t d = 0; d < D; d++) {
            a[(size_t) (r * D + d)] = la == -INFINITY ? (d % 2 ? 1e30f : -1e30f) : u(rng);
            p[(size_t) (r * D + d)] = lp == -INFINITY ? (d % 2 ? -1e30f : 1e30f) : u(rng);
        }
    }
}

// The merge in double precision, written from the definition (not the kernels' helper).
void reference(const std::vector<float> & a, const std::vector<float> & p, int64_t D, int64_t R, std::vector<double> & out,
               std::vector<double> & lse) {
    out.assign((size_t) (D * R), 0.0);
    lse.assign((size_t) R, -INFINITY);
    for (int64_t r = 0; r < R; r++) {
        const double la = a[(size_t) (D * R + r)], lp = p[(size_t) (D * R + r)];
        if (la == -INFINITY && lp == -INFINITY) continue;
        const double m = std::max(la, lp);
        const double L = m + std::log((la == -INFINITY ? 0.0 : std::exp(la - m)) + (lp == -INFINITY ? 0.0 : std::exp(lp - m)));
        lse[(size_t) r] = L;
        const double wa = la == -INFINITY ? 0.0 : std::exp(la - L), wp = lp == -INFINITY ? 0.0 : std::exp(lp - L);
        for (int64_t d = 0; d < D; d++) {
            const size_t i = (size_t) (r * D + d);
            out[i] = (wa ? wa * a[i] : 0.0) + (wp ? wp * p[i] : 0.0);
        }
    }
}

struct Dims {
    int64_t D, H, T;
};

class PagedMerge : public ::testing::TestWithParam<Dims> {};

TEST_P(PagedMerge, MatchesDoubleReference) {
    const Dims s = GetParam();
    const int64_t R = s.H * s.T, n = s.D * R + R;
    std::vector<float> a, p;
    fill_pair(a, p, s.D, R, (uint32_t) (7 * s.D + s.T));
    std::vector<double> ro, rl;
    reference(a, p, s.D, R, ro, rl);
    std::vector<float> first;
    for (int threads : {1, 2}) {
        SCOPED_TRACE("threads " + std::to_string(threads));
        oomb_context * ctx = oomb_init({0, false});
        oomb_tensor * acc = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
        oomb_tensor * part = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
        memcpy(acc->data, a.data(), a.size() * 4);
        memcpy(part->data, p.data(), p.size() * 4);
        oomb_tensor * m = oomb_paged_attn_merge(ctx, acc, part, s.D, s.H, s.T);
        EXPECT_EQ(m->op, OOMB_OP_PAGED_ATTN_MERGE);
        EXPECT_EQ(m->data, acc->data) << "the result is a view of acc";
        compute(ctx, m, threads);
        const std::vector<float> got = vec(acc);
        EXPECT_EQ(vec(part), p) << "part is not written";
        double num = 0, den = 0;
        int bad = 0;
        for (int64_t r = 0; r < R; r++) {
            const double la = a[(size_t) (s.D * R + r)], lp = p[(size_t) (s.D * R + r)];
            for (int64_t d = 0; d < s.D; d++) {
                const size_t i = (size_t) (r * s.D + d);
                if (!std::isfinite(got[i])) { bad++; continue; }
                // one -inf side: exactly the other side; both: exactly 0
                if (la == -INFINITY) bad += got[i] != (lp == -INFINITY ? 0.0f : p[i]);
                else if (lp == -INFINITY) bad += got[i] != a[i];
                num += (got[i] - ro[i]) * (got[i] - ro[i]);
                den += ro[i] * ro[i];
            }
            const double gl = got[(size_t) (s.D * R + r)];
            if (rl[(size_t) r] == -INFINITY) bad += gl != -INFINITY;
            else bad += !(std::fabs(gl - rl[(size_t) r]) <= 1e-6 * std::max(1.0, std::fabs(rl[(size_t) r])));
            if (la == -INFINITY && lp != -INFINITY) bad += (float) gl != (float) lp;
            if (lp == -INFINITY && la != -INFINITY) bad += (float) gl != (float) la;
        }
        EXPECT_EQ(bad, 0) << "non-finite outs, -inf rows not taken exactly, or LSEs off";
        EXPECT_LT(std::sqrt(num / den), 1e-6) << "out vs the double reference";
        if (threads == 1) first = got;
        else EXPECT_EQ(got, first) << "1 and 2 threads differ";
        oomb_free(ctx);
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedMerge, ::testing::Values(Dims{24, 3, 37}, Dims{64, 5, 130}, Dims{1, 1, 1}),
                         [](const ::testing::TestParamInfo<Dims> & i) {
                             return "D" + std::to_string(i.param.D) + "_H" + std::to_string(i.param.H) + "_T" + std::to_string(i.param.T);
                         });

// A small KV cache: pools of page size P (shuffled page table), a history of `hist` positions, a
// chunk of T queries at positions hist.. (starting mid-page), random q / K / V.
struct Cache {
    int D, H, Hkv, P, hist, T, n_logical;
    oomb_context * ctx;
    oomb_tensor * q, * kc, * vc, * kp, * vp, * pt, * pos;

    Cache(int D_, int H_, int Hkv_, int P_, int hist_, int T_, oomb_type type, uint32_t seed)
        : D(D_), H(H_), Hkv(Hkv_), P(P_), hist(hist_), T(T_) {
        std::mt19937 rng(seed);
        n_logical = (hist + T + P - 1) / P;
        const int n_pages = n_logical + 3;
        ctx = oomb_init({0, false});
        q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
        kc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
        vc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
        kp = oomb_new_tensor_4d(ctx, type, D, Hkv, P, n_pages);
        vp = oomb_new_tensor_4d(ctx, type, D, Hkv, P, n_pages);
        pt = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n_logical);
        pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
        oombtest::fill_uniform(q, rng, -2.0f, 2.0f);
        for (oomb_tensor * t : {kc, vc, kp, vp}) oombtest::fill_uniform(t, rng, -1.0f, 1.0f);
        std::vector<int32_t> perm(n_pages);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::copy(perm.begin(), perm.begin() + n_logical, (int32_t *) pt->data);
        for (int t = 0; t < T; t++) ((int32_t *) pos->data)[t] = hist + t;
    }
    ~Cache() { oomb_free(ctx); }
    // The packed node (out, then the LSE) of the chunk's attention under schedule sc (store 0: the
    // pools already hold the chunk's K/V, as in stage 2 and in inference over a filled cache).
    oomb_tensor * attn(const oomb_page_schedule & sc) {
        oomb_paged_attn_args a{};
        a.q = q; a.k_cur = kc; a.v_cur = vc; a.k_pages = kp; a.v_pages = vp; a.page_table = pt; a.pos = pos;
        a.schedule = sc;
        a.scale = 1.0f / std::sqrt((float) D);
        return oomb_paged_attn_ext(ctx, &a)->view_src;
    }
};

// Dense vs the merged page blocks, out (relative) and LSE (per row) within 1e-5.
void expect_close(const std::vector<float> & dense, const std::vector<float> & merged, int64_t n_out, const char * what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(dense.size(), merged.size());
    double num = 0, den = 0;
    for (int64_t i = 0; i < n_out; i++) {
        num += ((double) merged[i] - dense[i]) * ((double) merged[i] - dense[i]);
        den += (double) dense[i] * dense[i];
    }
    EXPECT_GT(den, 0.0) << "dense out is not all zeros";
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "out";
    int bad = 0;
    for (size_t i = (size_t) n_out; i < dense.size(); i++) {
        bad += !std::isfinite(merged[i]) || !(std::fabs(merged[i] - dense[i]) <= 1e-5 * std::max(1.0f, std::fabs(dense[i])));
    }
    EXPECT_EQ(bad, 0) << "LSE";
}

class PagedMergeDense : public ::testing::TestWithParam<oomb_type> {};

// Page blocks [0, 2), [2, 5), [5, last) and an empty block past the end (every row LSE -inf) of a
// history of 23 positions and a chunk at positions 23..35 (page 4 slot 3 .. page 7): the first
// block holds history only, the second the rest of the history and the chunk's first page, the
// third the chunk's later pages, which the chunk's first two rows do not see (LSE -inf there).
TEST_P(PagedMergeDense, MergedRangesEqualDense) {
    for (int variant = 0; variant < 2; variant++) {
        Cache C(24, 6, 2, 5, 23, 13, GetParam(), 31 + variant);
        const int last = C.n_logical;  // one past the last logical page
        const int64_t n_out = (int64_t) C.D * C.H * C.T;
        oomb_tensor * dense = C.attn(oomb_schedule_dense());
        compute(C.ctx, dense);
        const std::vector<float> want = vec(dense);
        const int cuts[][2] = {{0, 2}, {2, 5}, {5, last}, {last, last + 2}};
        if (variant == 0) {  // one graph: acc = block 0, merged with each later block in order
            oomb_tensor * acc = C.attn(oomb_schedule_range(cuts[0][0], cuts[0][1]));
            oomb_tensor * m = acc;
            for (int b = 1; b < 4; b++) m = oomb_paged_attn_merge(C.ctx, m, C.attn(oomb_schedule_range(cuts[b][0], cuts[b][1])), C.D, C.H, C.T);
            compute(C.ctx, m);
            expect_close(want, vec(acc), n_out, "one graph");
        } else {  // separate graphs, as the engine streams: acc a buffer of its own (a leaf), each graph
                  // computing one block (in reverse order: the merge is commutative) and merging it into acc
            oomb_tensor * empty = C.attn(oomb_schedule_range(cuts[3][0], cuts[3][1]));
            compute(C.ctx, empty);
            for (int64_t i = n_out; i < oomb_nelements(empty); i++)
                ASSERT_EQ(((const float *) empty->data)[i], -INFINITY) << "the empty block sees no key";
            oomb_tensor * acc = oomb_new_tensor_1d(C.ctx, OOMB_TYPE_F32, oomb_nelements(empty));
            memcpy(acc->data, empty->data, oomb_nbytes(empty));
            for (int b = 2; b >= 0; b--)
                compute(C.ctx, oomb_paged_attn_merge(C.ctx, acc, C.attn(oomb_schedule_range(cuts[b][0], cuts[b][1])), C.D, C.H, C.T));
            expect_close(want, vec(acc), n_out, "separate graphs");
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Pools, PagedMergeDense, ::testing::Values(OOMB_TYPE_F32, OOMB_TYPE_BF16),
                         [](const ::testing::TestParamInfo<oomb_type> & i) { return std::string(oomb_type_name(i.param)); });

// accumulate = 1 (oomb_paged_attn_args): the host-offload engine's page blocks, each one kernel call
// that adds its partial result into the node's own memory. Forward: the chunk's own pages first
// (RANGE [c0, last): writes out / LSE), then the history blocks [2, 4), [0, 2) and an empty block,
// each an accumulating node placed on that memory: equals the merge op's result (same weights) and
// dense. Backward (the engine's way: built with the dense forward's saved statistics, the schedule
// patched to a range per block): the chunk's pages first (dq, dk_cur / dv_cur read back), then the
// history blocks adding only dq; equals the dense backward's dq, gradient pages and dk_cur / dv_cur.
// The blocks are built through the public API (a RANGE backward with the dense forward as fwd, the
// split backward of oomb.h) and, as the engine builds them, dense with the schedule patched.
TEST_P(PagedMergeDense, AccumulatedBlocksEqualMergeAndDense) {
    Cache C(24, 6, 2, 5, 23, 13, GetParam(), 77);
    const int c0 = 23 / C.P, last = C.n_logical;
    const int64_t n_out = (int64_t) C.D * C.H * C.T, n = oomb_nelements(C.attn(oomb_schedule_dense()));
    const int blocks[][2] = {{c0, last}, {2, c0}, {0, 2}, {last, last + 2}};
    // forward
    oomb_tensor * dense = C.attn(oomb_schedule_dense());
    compute(C.ctx, dense);
    oomb_tensor * node = C.attn(oomb_schedule_range(blocks[0][0], blocks[0][1]));
    compute(C.ctx, node);
    std::vector<float> merged = vec(node);
    for (int b = 1; b < 4; b++) {
        oomb_paged_attn_args a = oomb_paged_attn_args_of(node);
        a.schedule = oomb_schedule_range(blocks[b][0], blocks[b][1]);
        a.accumulate = 1;
        oomb_tensor * blk = oomb_paged_attn_ext(C.ctx, &a)->view_src;
        blk->data = node->data;  // placed on the node's memory, as the engine does
        compute(C.ctx, blk);
        // the same partial result merged by the merge op into a copy of the running result
        oomb_tensor * acc = oomb_new_tensor_1d(C.ctx, OOMB_TYPE_F32, n);
        memcpy(acc->data, merged.data(), merged.size() * sizeof(float));
        compute(C.ctx, oomb_paged_attn_merge(C.ctx, acc, C.attn(oomb_schedule_range(blocks[b][0], blocks[b][1])), C.D, C.H, C.T));
        merged = vec(acc);
        const std::vector<float> got = vec(node);
        double worst = 0;
        for (size_t i = 0; i < got.size(); i++) {
            if (std::isinf(merged[i]) && got[i] == merged[i]) continue;
            worst = std::max(worst, std::fabs((double) got[i] - merged[i]) / std::max(1.0, std::fabs((double) merged[i])));
        }
        EXPECT_LT(worst, 1e-6) << "block " << b << ": accumulated vs the merge op";
    }
    expect_close(vec(dense), vec(node), n_out, "accumulated forward vs dense");

    // backward: gradient pages from zero each time
    std::mt19937 rng(5);
    oomb_tensor * dout = oomb_new_tensor_3d(C.ctx, OOMB_TYPE_F32, C.D, C.H, C.T);
    oombtest::fill_uniform(dout, rng, -1.0f, 1.0f);
    oomb_tensor * dk = oomb_new_tensor_4d(C.ctx, OOMB_TYPE_F32, C.kp->ne[0], C.kp->ne[1], C.kp->ne[2], C.kp->ne[3]);
    oomb_tensor * dv = oomb_new_tensor_4d(C.ctx, OOMB_TYPE_F32, C.kp->ne[0], C.kp->ne[1], C.kp->ne[2], C.kp->ne[3]);
    auto back = [&](int accumulate, const oomb_page_schedule & sc) {
        oomb_paged_attn_args a = oomb_paged_attn_args_of(dense);
        a.dout = dout; a.fwd = dense; a.dk_pages = dk; a.dv_pages = dv;
        a.accumulate = accumulate;
        a.schedule = sc;
        return oomb_paged_attn_back_ext(C.ctx, &a);
    };
    auto zero = [](oomb_tensor * t) { memset(t->data, 0, oomb_nbytes(t)); };
    zero(dk); zero(dv);
    oomb_tensor * bd = back(0, oomb_schedule_dense());
    compute(C.ctx, bd);
    const std::vector<float> want = vec(bd), want_dk = vec(dk), want_dv = vec(dv);
    for (int way = 0; way < 2; way++) {
        SCOPED_TRACE(way ? "dense nodes, schedule patched (the engine)" : "RANGE nodes with the dense fwd (the public API)");
        zero(dk); zero(dv);
        oomb_tensor * bn = nullptr;
        for (int b = 0; b < 4; b++) {
            const oomb_page_schedule sc = way ? oomb_schedule_dense() : oomb_schedule_range(blocks[b][0], blocks[b][1]);
            oomb_tensor * t = back(b ? 1 : 0, sc);
            if (b) t->data = bn->data;
            else bn = t;
            if (way) {
                t->op_params[oomb::PA_PARAM_SCHED_KIND] = OOMB_SCHEDULE_RANGE;
                t->op_params[oomb::PA_PARAM_SCHED_FIRST] = blocks[b][0];
                t->op_params[oomb::PA_PARAM_SCHED_LAST] = blocks[b][1];
            }
            compute(C.ctx, t);
        }
        const std::vector<float> got = vec(bn);
        for (int part = 0; part < 3; part++) {  // dq, dk_cur, dv_cur
            const int64_t off = part == 0 ? 0 : n_out + (part - 1) * (int64_t) C.D * C.Hkv * C.T;
            const int64_t len = part == 0 ? n_out : (int64_t) C.D * C.Hkv * C.T;
            expect_close(std::vector<float>(want.begin() + off, want.begin() + off + len), std::vector<float>(got.begin() + off, got.begin() + off + len),
                         len, part == 0 ? "dq" : part == 1 ? "dk_cur" : "dv_cur");
        }
        expect_close(want_dk, vec(dk), (int64_t) want_dk.size(), "dK pages");
        expect_close(want_dv, vec(dv), (int64_t) want_dv.size(), "dV pages");
    }
}

TEST(PagedMergeErrors, AccumulateMisuse) {
    oombtest::ErrorCapture cap;
    Cache C(8, 2, 1, 4, 5, 3, OOMB_TYPE_F32, 3);
    oomb_paged_attn_args a = oomb_paged_attn_args_of(C.attn(oomb_schedule_dense()));
    a.accumulate = 2;
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(C.ctx, &a), "accumulate (2) must be 0 or 1");
    a.accumulate = 1;
    a.store = 1;
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(C.ctx, &a), "no store");
    a.store = 0;
    oomb_tensor * acc_node = oomb_paged_attn_ext(C.ctx, &a);
    EXPECT_EQ(oomb_paged_attn_args_of(acc_node).accumulate, 1);
    // the backward: accumulate needs the saved statistics; a window's fwd must be the enclosing schedule's
    {
        oomb_tensor * dense = C.attn(oomb_schedule_dense());
        oomb_tensor * dk = oomb_new_tensor_4d(C.ctx, OOMB_TYPE_F32, C.kp->ne[0], C.kp->ne[1], C.kp->ne[2], C.kp->ne[3]);
        oomb_paged_attn_args b = oomb_paged_attn_args_of(dense);
        b.dout = C.q; b.dk_pages = dk; b.dv_pages = dk;
        b.accumulate = 1;
        b.fwd = nullptr;
        EXPECT_OOMB_ERROR(oomb_paged_attn_back_ext(C.ctx, &b), "accumulate = 1 needs fwd");
        b.fwd = dense;
        b.schedule = oomb_schedule_range(0, 1);
        EXPECT_NE(oomb_paged_attn_back_ext(C.ctx, &b), nullptr);  // a window of the dense forward
        b.fwd = C.attn(oomb_schedule_range(0, 2));
        EXPECT_OOMB_ERROR(oomb_paged_attn_back_ext(C.ctx, &b), "another page schedule");  // another range's statistics
    }
    // the graph allocator gives fresh memory: refused
    oomb_context * nc = oomb_init({0, true});
    oomb_paged_attn_args b = a;
    oomb_tensor * fresh = oomb_paged_attn_ext(nc, &b)->view_src;
    oomb_cgraph * g = oomb_new_graph(nc);
    oomb_build_forward_expand(g, fresh);
    oomb_gallocr_t ga = oomb_gallocr_new(cpu(1));
    EXPECT_OOMB_ERROR(oomb_gallocr_alloc_graph(ga, g), "accumulate = 1");
    oomb_gallocr_free(ga);
    oomb_free(nc);
    // not differentiable
    oomb_set_param(C.q);
    oomb_new_grad(C.ctx, C.q);
    oomb_new_grad(C.ctx, C.kp);  // the gradient pages (else the dry run reports their absence first)
    oomb_new_grad(C.ctx, C.vp);
    oomb_tensor * loss = oomb_sum(C.ctx, oomb_paged_attn_ext(C.ctx, &a));
    oomb_cgraph * g2 = oomb_new_graph(C.ctx);
    oomb_build_forward_expand(g2, loss);
    EXPECT_OOMB_ERROR(oomb_build_backward_expand(C.ctx, g2, loss, nullptr), "not differentiable");
}

TEST(PagedMergeErrors, BadOperands) {
    oombtest::ErrorCapture cap;
    oomb_context * ctx = oomb_init({0, true});
    const int64_t D = 4, H = 2, T = 3, n = D * H * T + H * T;
    oomb_tensor * acc = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
    oomb_tensor * part = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, acc, oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n - 1), D, H, T), "D*H*T + H*T = 30");
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, acc, part, D, H, T + 1), "elements");
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, acc, part, 0, H, T), "must each be in [1, 2^31)");
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, acc, oomb_new_tensor_1d(ctx, OOMB_TYPE_BF16, n), D, H, T), "part must be f32");
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n), part, D, H, T), "acc must be f32");
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, acc, acc, D, H, T), "the same tensor");
    oomb_tensor * big = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 3 * n);
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, oomb_view_1d(ctx, big, n, 0), oomb_view_1d(ctx, big, n, 4 * (n - 1)), D, H, T), "overlap");
    EXPECT_NE(oomb_paged_attn_merge(ctx, oomb_view_1d(ctx, big, n, 0), oomb_view_1d(ctx, big, n, 4 * n), D, H, T), nullptr);
    EXPECT_OOMB_ERROR(oomb_paged_attn_merge(ctx, oomb_transpose(ctx, oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 2, n / 2)), part, D, H, T),
                      "contiguous");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_PAGED_ATTN_MERGE), "paged_attn_merge");
    oomb_free(ctx);
}

// The merge is not differentiable: a loss depending on a parameter through it is an error.
TEST(PagedMergeErrors, BackwardThroughMergeIsAnError) {
    oombtest::ErrorCapture cap;
    oomb_context * ctx = oomb_init({0, true});
    const int64_t D = 4, H = 2, T = 3, n = D * H * T + H * T;
    oomb_tensor * w = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
    oomb_set_param(w);
    oomb_new_grad(ctx, w);
    oomb_tensor * part = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
    oomb_tensor * m = oomb_paged_attn_merge(ctx, oomb_scale(ctx, w, 2.0f), part, D, H, T);
    oomb_tensor * loss = oomb_sum(ctx, oomb_view_1d(ctx, m, D * H * T, 0));
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, loss);
    EXPECT_OOMB_ERROR(oomb_build_backward_expand(ctx, g, loss, nullptr), "paged_attn_merge");
    EXPECT_OOMB_ERROR(oomb_build_backward_expand(ctx, g, loss, nullptr), "is not differentiable");
    // through part too
    oomb_tensor * acc = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
    oomb_tensor * loss2 = oomb_sum(ctx, oomb_paged_attn_merge(ctx, acc, oomb_scale(ctx, w, 0.5f), D, H, T));
    oomb_cgraph * g2 = oomb_new_graph(ctx);
    oomb_build_forward_expand(g2, loss2);
    EXPECT_OOMB_ERROR(oomb_build_backward_expand(ctx, g2, loss2, nullptr), "paged_attn_merge");
    oomb_free(ctx);
}

} // namespace
