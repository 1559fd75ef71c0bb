// Page-level top-K sparse attention on the CPU (oomb-sparse.h, the chunk driver's sparse mode):
//  * page_summary against a naive mean / min / max over the pool (f32 and bf16 pools, a shuffled
//    page table, a chunk starting mid-page: page 5, chunk 13);
//  * page_select against the test's own double-precision scores: every tile lists K pages,
//    ascending, the always-kept ones included, and no unselected page scores above a selected
//    free one (a tolerance only for near ties); dense below the budget; mean and quest; GQA 3;
//  * input errors;
//  * the driver: a two-layer attention model trained with chunk 13, page 5: with K at least the
//    history it is bit-identical to dense; with K = 3 (and sink / local / quest) its loss and every
//    gradient equal those of one full-sequence graph of primitive ops (mul_mat, soft_max) whose
//    additive mask the test builds itself from the driver's stored selection, and differ from
//    dense (the selection dropped keys);
//  * sparse over a host tier (offload): equal to the resident sparse run, and only the listed
//    history pages copied (bytes counted against dense offload).
#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-chunk.h"
#include "oomb-sparse.h"
#include "oomb-offload.h"
#include "sparse-ref.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

oomb_backend_t cpu() {
    static oomb_backend_t b = oomb_backend_cpu_init(2);
    return b;
}

void compute(oomb_context * ctx, oomb_tensor * out) {
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, out);
    ASSERT_EQ(oombtest::compute_checked(cpu(), g, __FILE__, __LINE__), OOMB_STATUS_OK);
}

void set_i32(oomb_tensor * t, const std::vector<int32_t> & v) { memcpy(t->data, v.data(), v.size() * 4); }

// ---- page_summary -----------------------------------------------------------------------------

struct SumCase {
    int D, Hkv, P, pos0, T;
    oomb_type type;
    int S;
};

TEST(SparseSummary, MatchesNaive) {
    for (const SumCase & c : {SumCase{8, 2, 5, 7, 13, OOMB_TYPE_F32, 1}, SumCase{8, 2, 5, 7, 13, OOMB_TYPE_BF16, 2},
                              SumCase{16, 3, 4, 0, 9, OOMB_TYPE_F32, 2}, SumCase{6, 1, 5, 12, 3, OOMB_TYPE_BF16, 1}, SumCase{6, 1, 5, 10, 3, OOMB_TYPE_F32, 2}}) {
        SCOPED_TRACE("D" + std::to_string(c.D) + " Hkv" + std::to_string(c.Hkv) + " P" + std::to_string(c.P) + " pos0 " +
                     std::to_string(c.pos0) + " T" + std::to_string(c.T) + " S" + std::to_string(c.S));
        std::mt19937 rng(11 + c.D + c.S);
        const int n_logical = (c.pos0 + c.T + c.P - 1) / c.P + 1, n_phys = n_logical + 2;
        oomb_context * ctx = oomb_init({0, false});
        oomb_tensor * kp = oomb_new_tensor_4d(ctx, c.type, c.D, c.Hkv, c.P, n_phys);
        oomb_tensor * pt = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n_logical);
        oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, c.T);
        oomb_tensor * sm = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, c.D, c.S, c.Hkv, n_logical);
        oombtest::fill_uniform(kp, rng, -2.0f, 2.0f);
        std::vector<int32_t> perm(n_phys);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        set_i32(pt, std::vector<int32_t>(perm.begin(), perm.begin() + n_logical));
        std::vector<int32_t> p(c.T);
        std::iota(p.begin(), p.end(), c.pos0);
        set_i32(pos, p);
        const float sentinel = 42.5f;
        std::fill((float *) sm->data, (float *) sm->data + oomb_nelements(sm), sentinel);
        compute(ctx, oomb_page_summary(ctx, kp, pt, pos, sm, nullptr));
        const std::vector<double> k = oombtest::to_vector(kp);
        const float * got = (const float *) sm->data;
        const int lp0 = c.pos0 / c.P, lp1 = (c.pos0 + c.T) / c.P;
        int checked = 0;
        for (int lp = 0; lp < n_logical; lp++)
            for (int g = 0; g < c.Hkv; g++)
                for (int s = 0; s < c.S; s++)
                    for (int d = 0; d < c.D; d++) {
                        const float v = got[((lp * c.Hkv + g) * c.S + s) * c.D + d];
                        if (lp < lp0 || lp >= lp1) {
                            EXPECT_EQ(v, sentinel) << "page " << lp << " is not completed by the chunk";
                            continue;
                        }
                        double mean = 0, mn = INFINITY, mx = -INFINITY;
                        for (int i = 0; i < c.P; i++) {
                            const double x = k[(((size_t) perm[lp] * c.P + i) * c.Hkv + g) * c.D + d];
                            mean += x / c.P;
                            mn = std::min(mn, x);
                            mx = std::max(mx, x);
                        }
                        const double want = c.S == 1 ? mean : s == 0 ? mn : mx;
                        EXPECT_NEAR(v, want, 1e-5) << "page " << lp << " head " << g << " slot " << s << " dim " << d;
                        checked++;
                    }
        EXPECT_EQ(checked, (lp1 - lp0) * c.Hkv * c.S * c.D);  // pages completed: none in the last case
        oomb_free(ctx);
    }
}

// A NaN key makes its page's summary NaN in that dimension (quest min and max, mean), never
// skipped; the other dimensions and pages are unchanged. Selection ranks the NaN-scored page
// below every number (ps_ranks_before, the CPU's and the CUDA top-K's one rule): with one page to
// drop it is the one dropped, though its keys are the largest (it would score first otherwise).
TEST(SparseSummary, NanKeyMakesThePageNaN) {
    const int D = 8, Hkv = 2, H = 4, P = 5, n_hist = 8, T0 = n_hist * P, n_logical = n_hist + 3, bad = 3, bad_d = 2;
    for (int S : {2, 1}) {
        SCOPED_TRACE(S == 2 ? "quest" : "mean");
        std::mt19937 rng(29 + S);
        oomb_context * ctx = oomb_init({0, false});
        oomb_tensor * kp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, D, Hkv, P, n_logical);
        oomb_tensor * pt = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n_logical);
        oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T0);
        oomb_tensor * sm = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, D, S, Hkv, n_logical);
        oombtest::fill_uniform(kp, rng, -1.0f, 1.0f);
        float * k = (float *) kp->data;
        for (int i = 0; i < P * Hkv * D; i++) k[(size_t) bad * P * Hkv * D + i] *= 8.0f;  // page 3: the largest keys
        k[(((size_t) bad * P + 1) * Hkv + 0) * D + bad_d] = NAN;  // slot 1, KV head 0, dimension 2
        std::vector<int32_t> ids(n_logical), p(T0);
        std::iota(ids.begin(), ids.end(), 0);
        set_i32(pt, ids);
        std::iota(p.begin(), p.end(), 0);
        set_i32(pos, p);
        compute(ctx, oomb_page_summary(ctx, kp, pt, pos, sm, nullptr));
        const float * got = (const float *) sm->data;
        for (int lp = 0; lp < n_hist; lp++)
            for (int g = 0; g < Hkv; g++)
                for (int s = 0; s < S; s++)
                    for (int d = 0; d < D; d++) {
                        const float v = got[((lp * Hkv + g) * S + s) * D + d];
                        if (lp == bad && g == 0 && d == bad_d) EXPECT_TRUE(std::isnan(v)) << "slot " << s << ": the NaN key was skipped";
                        else EXPECT_TRUE(std::isfinite(v)) << "page " << lp << " head " << g << " slot " << s << " dim " << d;
                    }
        // the next chunk (2 query tiles) selects K = 7 of the 8 history pages: page 3 is dropped
        const int T = 7, K = n_hist - 1, nqt = (int) oomb_page_select_max_qtiles(T, P);
        oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
        oomb_tensor * qpos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
        oombtest::fill_uniform(q, rng, 0.5f, 1.5f);
        std::vector<int32_t> qp(T);
        std::iota(qp.begin(), qp.end(), T0);
        set_i32(qpos, qp);
        oomb_sparse_params sp = {K, S == 2 ? OOMB_SPARSE_SCORE_QUEST : OOMB_SPARSE_SCORE_MEAN, 0, 0};
        oomb_tensor * sel = oomb_page_select(ctx, q, sm, qpos, P, nqt, &sp);
        compute(ctx, sel);
        const int32_t * off = (const int32_t *) sel->data, * lists = off + nqt + 1;
        std::vector<int32_t> want;
        for (int lp = 0; lp < n_hist; lp++)
            if (lp != bad || S == 1) want.push_back(lp);
        if (S == 1) want.pop_back();  // mean: every score is NaN (the softmax's sum is): the lowest pages, by the tie rule
        for (int j = 0; j < 2; j++) {
            ASSERT_EQ(off[j + 1] - off[j], K);
            EXPECT_EQ(std::vector<int32_t>(lists + off[j], lists + off[j + 1]), want) << "tile " << j;
        }
        oomb_free(ctx);
    }
}

// ---- page_select ------------------------------------------------------------------------------

void check_select(const oombtest::SparseRefCase & c, uint32_t seed) {
    std::mt19937 rng(seed);
    const int S = c.score == OOMB_SPARSE_SCORE_QUEST ? 2 : 1, c0 = c.pos0 / c.P, n_logical = c0 + c.T / c.P + 3;
    const int nqt = (int) oomb_page_select_max_qtiles(c.T, c.P);
    oomb_context * ctx = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, c.D, c.H, c.T);
    oomb_tensor * sm = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, c.D, S, c.Hkv, n_logical);
    oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, c.T);
    oombtest::fill_uniform(q, rng, -1.5f, 1.5f);
    oombtest::fill_uniform(sm, rng, -1.0f, 1.0f);
    if (S == 2) {  // min <= max
        float * a = (float *) sm->data;
        for (int64_t i = 0; i < oomb_nelements(sm) / (2 * c.D); i++)
            for (int d = 0; d < c.D; d++) {
                float & mn = a[i * 2 * c.D + d], & mx = a[i * 2 * c.D + c.D + d];
                if (mn > mx) std::swap(mn, mx);
            }
    }
    std::vector<int32_t> p(c.T);
    std::iota(p.begin(), p.end(), c.pos0);
    set_i32(pos, p);
    oomb_sparse_params sp = {c.K, c.score, c.sink, c.local};
    oomb_tensor * sel = oomb_page_select(ctx, q, sm, pos, c.P, nqt, &sp);
    compute(ctx, sel);
    oombtest::sparse_check_lists(c, (const int32_t *) sel->data, nqt,
                                 oombtest::sparse_ref_scores(c, oombtest::to_vector(q), oombtest::to_vector(sm)));
    oomb_free(ctx);
}

TEST(SparseSelect, TopKMatchesReference) {
    const oombtest::SparseRefCase cases[] = {
        {8, 6, 2, 5, 37, 13, 3, 0, 0, OOMB_SPARSE_SCORE_MEAN},   // c0 7, tiles start mid-page, GQA 3
        {8, 6, 2, 5, 37, 13, 3, 1, 1, OOMB_SPARSE_SCORE_MEAN},   // sink + local inside K
        {8, 4, 2, 5, 52, 13, 4, 1, 0, OOMB_SPARSE_SCORE_QUEST},  // quest
        {16, 4, 4, 4, 61, 7, 5, 0, 2, OOMB_SPARSE_SCORE_MEAN},   // MHA, K 5 of 15
        {8, 4, 2, 5, 20, 13, 4, 0, 0, OOMB_SPARSE_SCORE_MEAN},   // c0 4 <= K: dense
        {8, 4, 2, 5, 23, 13, 3, 3, 0, OOMB_SPARSE_SCORE_QUEST},  // all kept pages (sink = K)
    };
    uint32_t seed = 5;
    for (const oombtest::SparseRefCase & c : cases) {
        SCOPED_TRACE("D" + std::to_string(c.D) + " H" + std::to_string(c.H) + "/" + std::to_string(c.Hkv) + " P" + std::to_string(c.P) +
                     " pos0 " + std::to_string(c.pos0) + " T" + std::to_string(c.T) + " K" + std::to_string(c.K) + " sink" +
                     std::to_string(c.sink) + " local" + std::to_string(c.local) + (c.score ? " quest" : " mean"));
        check_select(c, seed++);
    }
}

TEST(SparseSelect, Errors) {
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, 8, 4, 13);
    oomb_tensor * sm1 = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, 8, 1, 2, 20);
    oomb_tensor * sm3 = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, 8, 1, 3, 20);
    oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, 13);
    oomb_sparse_params p = {3, OOMB_SPARSE_SCORE_MEAN, 2, 2};
    EXPECT_OOMB_ERROR(oomb_page_select(ctx, q, sm1, pos, 5, 4, &p), "exceed the budget");
    p = {0, OOMB_SPARSE_SCORE_MEAN, 0, 0};
    EXPECT_OOMB_ERROR(oomb_page_select(ctx, q, sm1, pos, 5, 4, &p), "must be >= 1");
    p = {3, OOMB_SPARSE_SCORE_QUEST, 0, 0};
    EXPECT_OOMB_ERROR(oomb_page_select(ctx, q, sm1, pos, 5, 4, &p), "quest score needs S = 2");
    p = {3, OOMB_SPARSE_SCORE_MEAN, 0, 0};
    EXPECT_OOMB_ERROR(oomb_page_select(ctx, q, sm3, pos, 5, 4, &p), "multiple of Hkv");
    EXPECT_OOMB_ERROR(oomb_page_select_offsets(ctx, q), "not a page_select result");
    oomb_free(ctx);
    // positions that are not consecutive: a compute-time error naming them
    oomb_context * c2 = oomb_init({0, false});
    oomb_tensor * q2 = oomb_new_tensor_3d(c2, OOMB_TYPE_F32, 8, 4, 4);
    oomb_tensor * s2 = oomb_new_tensor_4d(c2, OOMB_TYPE_F32, 8, 1, 2, 20);
    oomb_tensor * p2 = oomb_new_tensor_1d(c2, OOMB_TYPE_I32, 4);
    std::mt19937 rng(1);
    oombtest::fill_uniform(q2, rng);
    oombtest::fill_uniform(s2, rng);
    set_i32(p2, {40, 41, 43, 44});
    oomb_sparse_params ok = {3, OOMB_SPARSE_SCORE_MEAN, 0, 0};
    oomb_tensor * sel = oomb_page_select(c2, q2, s2, p2, 5, 2, &ok);
    oomb_cgraph * g = oomb_new_graph(c2);
    oomb_build_forward_expand(g, sel);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cpu(), g), "consecutive");
    oomb_free(c2);
}

TEST(SparseParams, BytesPerToken) {
    // Qwen2.5-7B: 4 KV heads, head dim 128, page 128: 16 B (mean), 32 B (quest) per token and layer
    EXPECT_DOUBLE_EQ(oomb_sparse_summary_bytes_per_token(OOMB_SPARSE_SCORE_MEAN, 4, 128, 128), 16.0);
    EXPECT_DOUBLE_EQ(oomb_sparse_summary_bytes_per_token(OOMB_SPARSE_SCORE_QUEST, 4, 128, 128), 32.0);
}

// ---- the chunk driver --------------------------------------------------------------------------

const int kD = 8, kH = 4, kHkv = 2, kV = 11, kL = 2;

// Parameters of a two-layer attention model: per layer tables Eq [D*H, V], Ek / Ev [D*Hkv, V];
// layer 1 also reads layer 0's output through Wq1 [D*H, D*H], Wk1 / Wv1 [D*H, D*Hkv]; the LM head
// Wo [D*H, V] reads the sum of both layers' outputs.
struct Params {
    oomb_context * ctx = nullptr;
    std::vector<oomb_tensor *> all;
    oomb_tensor * E[kL][3];
    oomb_tensor * W1[3];
    oomb_tensor * Wo;
    explicit Params(uint32_t seed) {
        ctx = oomb_init({0, false});
        std::mt19937 rng(seed);
        auto mk = [&](int64_t a, int64_t b, float s) {
            oomb_tensor * t = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, a, b);
            oombtest::fill_uniform(t, rng, -s, s);
            oomb_set_param(t);
            oomb_new_grad(ctx, t);
            all.push_back(t);
            return t;
        };
        for (int l = 0; l < kL; l++) {
            E[l][0] = mk(kD * kH, kV, 1.5f);
            E[l][1] = mk(kD * kHkv, kV, 1.5f);
            E[l][2] = mk(kD * kHkv, kV, 1.0f);
        }
        W1[0] = mk(kD * kH, kD * kH, 0.4f);
        W1[1] = mk(kD * kH, kD * kHkv, 0.4f);
        W1[2] = mk(kD * kH, kD * kHkv, 0.4f);
        Wo = mk(kD * kH, kV, 1.0f);
    }
    ~Params() { oomb_free(ctx); }
    void zero_grads() {
        for (oomb_tensor * t : all) oomb_tensor_memset(t->grad, 0);
    }
    std::vector<float> grads() const {
        std::vector<float> g;
        for (oomb_tensor * t : all) g.insert(g.end(), (const float *) t->grad->data, (const float *) t->grad->data + oomb_nelements(t));
        return g;
    }
};

class TinyBuilder : public oomb::ChunkGraphBuilder {
public:
    explicit TinyBuilder(Params & p) : p_(p) {}
    oomb::ChunkModelShape shape() const override { return {cpu(), kV, kL, kH, kHkv, kD}; }
    oomb::ChunkGraphOutputs build(oomb_context * ctx, const oomb::ChunkGraphInputs & in) override {
        const int64_t T = in.T;
        oomb_tensor * h = nullptr, * sum = nullptr, * a = nullptr;
        for (int l = 0; l < kL; l++) {
            oomb_tensor * x[3];
            const int64_t heads[3] = {kH, kHkv, kHkv};
            for (int i = 0; i < 3; i++) {
                oomb_tensor * r = oomb_get_rows(ctx, p_.E[l][i], in.tokens);
                if (h) r = oomb_add(ctx, r, oomb_mul_mat(ctx, p_.W1[i], h));
                x[i] = oomb_reshape_3d(ctx, r, kD, heads[i], T);
            }
            a = oomb::chunk_attention(ctx, in, l, x[0], x[1], x[2], 1.0f / std::sqrt((float) kD));
            h = oomb_reshape_2d(ctx, a, kD * kH, T);
            sum = sum ? oomb_add(ctx, sum, h) : h;
        }
        oomb::ChunkGraphOutputs o;
        if (in.kind == oomb::ChunkKind::Fill) {
            o.out = a->view_src;
            return o;
        }
        o.out = oomb_cross_entropy_loss(ctx, oomb_mul_mat(ctx, p_.Wo, sum), in.labels, in.ignore_index);
        o.has_loss = true;
        return o;
    }

private:
    Params & p_;
};

struct RunResult {
    double loss = 0;
    std::vector<float> grads;
    std::vector<std::vector<std::vector<int32_t>>> allowed;  // [layer][query t] history pages (-1: all), the mask's lists
    uint64_t bytes_in = 0, bytes_out = 0;                      // host tier: the step's copies
    std::vector<std::pair<int64_t, int64_t>> listed;           // per chunk with lists and layer: (c0, listed host-tier pages)
    size_t arena_allocated = 0, arena_peak = 0;                 // ChunkDriver::arena_allocated_bytes / arena_bytes
};

const int kP = 5, kC = 13;

// A host tier for run_driver: R resident pages, blocks of B, gradient pages of grad_type (R < 0: none).
struct Tier {
    int64_t R = -1;
    int B = 16;
    oomb_type grad_type = OOMB_TYPE_F32;
};

// Runs the driver (chunk kC, page kP) over ids; sparse.pages = 0: dense. Also returns, per layer and
// query, the history pages the stored selection lets it attend ({-1}: every page), and with a host
// tier the copies the step made (bytes in / out) and, per chunk with lists and layer, the listed
// history pages in the host tier (|U| of oomb-offload.h, the pages that must move).
RunResult run_driver(Params & P, const std::vector<int32_t> & ids, oomb_sparse_params sparse, const Tier & tier = Tier{},
                     oomb_type attn_cache = OOMB_TYPE_COUNT) {
    oomb::ChunkParams cp;
    cp.cache_attn = attn_cache != OOMB_TYPE_COUNT;
    if (cp.cache_attn) cp.cache_attn_type = attn_cache;
    cp.chunk = kC;
    cp.page = kP;
    cp.max_tokens = (int64_t) ids.size();
    cp.sparse = sparse;
    cp.resident_pages = tier.R;
    cp.stream_block_pages = tier.B;
    cp.kv_grad_type = tier.grad_type;
    oomb::ChunkDriver dr(std::make_unique<TinyBuilder>(P), cp);
    P.zero_grads();
    const oomb_kv_stream_stats s0 = oomb_kv_stream_totals();
    const oomb::ChunkStats st = dr.forward_backward(ids.data(), (int64_t) ids.size());
    const oomb_kv_stream_stats s1 = oomb_kv_stream_totals();
    RunResult r;
    r.loss = st.loss_sum;
    r.grads = P.grads();
    r.bytes_in = s1.bytes_in - s0.bytes_in;
    r.bytes_out = s1.bytes_out - s0.bytes_out;
    r.arena_allocated = dr.arena_allocated_bytes();
    r.arena_peak = dr.arena_bytes();
    const int64_t n_chunks = ((int64_t) ids.size() + kC - 1) / kC;
    for (int64_t ci = 0; ci < n_chunks; ci++)
        for (int l = 0; l < kL; l++) {
            const oomb::PageSelection * s = dr.selection(ci, l);
            if (!s) continue;
            std::vector<int32_t> u(s->pages);
            std::sort(u.begin(), u.end());
            u.erase(std::unique(u.begin(), u.end()), u.end());
            const int64_t c0 = ci * kC / kP;
            r.listed.push_back({c0, (int64_t) std::count_if(u.begin(), u.end(), [&](int32_t p) { return p >= std::max<int64_t>(tier.R, 0); })});
        }
    const int n = (int) ids.size();
    r.allowed.assign(kL, std::vector<std::vector<int32_t>>(n, std::vector<int32_t>{-1}));
    for (int l = 0; l < kL; l++)
        for (int t = 0; t < n; t++) {
            const int ci = t / kC, c0 = ci * kC / kP, j = t / kP - c0;
            const oomb::PageSelection * s = dr.selection(ci, l);
            if (!s) continue;
            r.allowed[l][t].assign(s->pages.begin() + s->offsets[j], s->pages.begin() + s->offsets[j + 1]);
        }
    return r;
}

// One full-sequence graph of primitive ops with the additive mask built from `allowed`: key p is
// visible to query t when p <= t and (p's page >= the first page of t's chunk, or allowed[l][t]
// holds -1 or p's page). The loss sum and the gradients.
RunResult run_reference(Params & P, const std::vector<int32_t> & ids, const RunResult & sel) {
    const int n = (int) ids.size();
    oomb_context * ctx = oomb_init({0, false});
    oomb_tensor * tok = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n), * lab = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n);
    std::vector<int32_t> labels(n);
    for (int t = 0; t < n; t++) labels[t] = t + 1 < n ? ids[t + 1] : -100;
    set_i32(tok, ids);
    set_i32(lab, labels);
    const float scale = 1.0f / std::sqrt((float) kD);
    std::vector<oomb_tensor *> outs[kL];  // per layer, per head: [D, n]
    oomb_tensor * logits = nullptr;
    auto head_cols = [&](oomb_tensor * w, int h) {  // rows h*D .. h*D+D-1 of w's ne0 as a [D, ne1] matrix
        return oomb_cont(ctx, oomb_view_2d(ctx, w, kD, w->ne[1], w->nb[1], (size_t) h * kD * 4));
    };
    auto apply = [&](oomb_tensor * w, const std::vector<oomb_tensor *> & hs) {  // mul_mat(w, concat of heads)
        oomb_tensor * acc = nullptr;
        for (int h = 0; h < kH; h++) {
            oomb_tensor * m = oomb_mul_mat(ctx, head_cols(w, h), hs[h]);
            acc = acc ? oomb_add(ctx, acc, m) : m;
        }
        return acc;
    };
    for (int l = 0; l < kL; l++) {
        oomb_tensor * x[3];
        for (int i = 0; i < 3; i++) {
            oomb_tensor * r = oomb_get_rows(ctx, P.E[l][i], tok);
            if (l > 0) r = oomb_add(ctx, r, apply(P.W1[i], outs[0]));
            x[i] = r;  // [heads*D, n]
        }
        oomb_tensor * mask = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, n, n);  // [key, query]
        float * m = (float *) mask->data;
        for (int t = 0; t < n; t++) {
            const int c0 = (t / kC) * kC / kP;
            const std::vector<int32_t> & al = sel.allowed[l][t];
            for (int p = 0; p < n; p++) {
                bool ok = p <= t && (p / kP >= c0 || al[0] == -1 || std::find(al.begin(), al.end(), p / kP) != al.end());
                m[(size_t) t * n + p] = ok ? 0.0f : -INFINITY;
            }
        }
        for (int h = 0; h < kH; h++) {
            const int g = h / (kH / kHkv);
            oomb_tensor * qh = oomb_cont(ctx, oomb_view_2d(ctx, x[0], kD, n, x[0]->nb[1], (size_t) h * kD * 4));
            oomb_tensor * kh = oomb_cont(ctx, oomb_view_2d(ctx, x[1], kD, n, x[1]->nb[1], (size_t) g * kD * 4));
            oomb_tensor * vh = oomb_cont(ctx, oomb_view_2d(ctx, x[2], kD, n, x[2]->nb[1], (size_t) g * kD * 4));
            oomb_tensor * s = oomb_add(ctx, oomb_mul_mat(ctx, kh, qh), mask);  // [n keys, n queries]
            oomb_tensor * pr = oomb_soft_max(ctx, s, scale, -1);
            outs[l].push_back(oomb_mul_mat(ctx, oomb_cont(ctx, oomb_transpose(ctx, vh)), pr));  // [D, n]
        }
        oomb_tensor * lg = apply(P.Wo, outs[l]);
        logits = logits ? oomb_add(ctx, logits, lg) : lg;
    }
    oomb_tensor * loss = oomb_cross_entropy_loss(ctx, logits, lab, -100);
    oomb_set_loss(loss);
    oomb_cgraph * g = oomb_new_graph_custom(ctx, 8192);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(ctx, g, loss, nullptr);
    P.zero_grads();
    EXPECT_EQ(oombtest::compute_checked(cpu(), g, __FILE__, __LINE__), OOMB_STATUS_OK);
    RunResult r;
    r.loss = ((const float *) loss->data)[0];
    r.grads = P.grads();
    oomb_free(ctx);
    return r;
}

double max_rel_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double mx = 0, scale = 1e-6;
    for (size_t i = 0; i < a.size(); i++) {
        mx = std::max(mx, (double) std::fabs(a[i] - b[i]));
        scale = std::max(scale, (double) std::fabs(b[i]));
    }
    return mx / scale;
}

std::vector<int32_t> random_ids(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(n);
    for (int32_t & x : ids) x = (int32_t) (rng() % kV);
    return ids;
}

TEST(SparseDriver, BudgetCoveringHistoryIsDenseBitForBit) {
    Params P(3);
    const std::vector<int32_t> ids = random_ids(61, 9);  // 5 chunks of 13 (the last 9), 13 pages of 5
    const RunResult dense = run_driver(P, ids, {0, OOMB_SPARSE_SCORE_MEAN, 0, 0});
    for (oomb_sparse_params sp : {oomb_sparse_params{13, OOMB_SPARSE_SCORE_MEAN, 0, 0}, oomb_sparse_params{10, OOMB_SPARSE_SCORE_QUEST, 1, 1}}) {
        const RunResult s = run_driver(P, ids, sp);
        EXPECT_EQ(s.loss, dense.loss);
        ASSERT_EQ(s.grads.size(), dense.grads.size());
        EXPECT_EQ(memcmp(s.grads.data(), dense.grads.data(), s.grads.size() * 4), 0) << "K = " << sp.pages;
        for (const auto & layer : s.allowed)
            for (const auto & a : layer) EXPECT_EQ(a[0], -1) << "no chunk's history exceeds K";
    }
}

TEST(SparseDriver, SmallBudgetEqualsMaskedDenseReference) {
    Params P(4);
    const std::vector<int32_t> ids = random_ids(61, 10);
    const RunResult dense = run_driver(P, ids, {0, OOMB_SPARSE_SCORE_MEAN, 0, 0});
    const RunResult dense_ref = run_reference(P, ids, dense);  // the reference itself, unmasked
    EXPECT_NEAR(dense_ref.loss, dense.loss, 1e-4 * std::fabs(dense.loss));
    EXPECT_LT(max_rel_diff(dense.grads, dense_ref.grads), 1e-4);
    for (oomb_sparse_params sp : {oomb_sparse_params{3, OOMB_SPARSE_SCORE_MEAN, 0, 0}, oomb_sparse_params{3, OOMB_SPARSE_SCORE_MEAN, 1, 1},
                                  oomb_sparse_params{4, OOMB_SPARSE_SCORE_QUEST, 0, 1}}) {
        SCOPED_TRACE("K " + std::to_string(sp.pages) + " sink " + std::to_string(sp.sink) + " local " + std::to_string(sp.local) +
                     (sp.score ? " quest" : " mean"));
        const RunResult s = run_driver(P, ids, sp);
        int sparse_rows = 0;
        for (const auto & layer : s.allowed)
            for (const auto & a : layer) {
                if (a[0] == -1) continue;
                sparse_rows++;
                EXPECT_EQ((int) a.size(), sp.pages);
            }
        EXPECT_GT(sparse_rows, 0) << "the test must exercise chunks whose history exceeds K";
        const RunResult ref = run_reference(P, ids, s);
        printf("K %d sink %d local %d %s: loss %.6f (reference %.6f, dense %.6f); gradients vs reference %.2e, vs dense %.2e (max abs diff / max abs)\n",
               sp.pages, sp.sink, sp.local, sp.score ? "quest" : "mean", s.loss, ref.loss, dense.loss, max_rel_diff(s.grads, ref.grads),
               max_rel_diff(s.grads, dense.grads));
        EXPECT_NEAR(s.loss, ref.loss, 1e-4 * std::fabs(ref.loss));
        EXPECT_LT(max_rel_diff(s.grads, ref.grads), 1e-4);
        EXPECT_GT(max_rel_diff(s.grads, dense.grads), 1e-3) << "the selection dropped keys, so the gradients differ from dense";
        // the dense and the page-list variant of each graph share one arena: sparse allocates about what
        // dense does (the selection's nodes add a little), not an arena per variant (about twice)
        printf("arenas: sparse %zu bytes allocated (peak graph %zu), dense %zu (peak %zu)\n", s.arena_allocated, s.arena_peak,
               dense.arena_allocated, dense.arena_peak);
        EXPECT_LE(s.arena_allocated, dense.arena_allocated * 5 / 4);
    }
}

// Sparse attention over a host tier (oomb-offload.h): the same loss and gradients as the resident
// sparse run (to the rounding of the block-wise sums; the same selection, since the summaries are the
// same), for mean and quest scores, sink / local pages, f32 and bf16 gradient pages, resident counts
// from none to most of the 13 pages and blocks of 1 to 3 listed pages (chunk 13 over pages of 5:
// chunks start mid-page).
TEST(SparseOffload, EqualsResidentSparse) {
    Params P(6);
    const std::vector<int32_t> ids = random_ids(61, 11);
    const oomb_sparse_params cases[3] = {{3, OOMB_SPARSE_SCORE_MEAN, 0, 0}, {3, OOMB_SPARSE_SCORE_MEAN, 1, 1}, {4, OOMB_SPARSE_SCORE_QUEST, 0, 1}};
    double worst[2] = {0, 0};  // f32, bf16 gradient pages
    for (const oomb_sparse_params & sp : cases) {
        for (oomb_type gt : {OOMB_TYPE_F32, OOMB_TYPE_BF16}) {
            const RunResult res = run_driver(P, ids, sp, Tier{-1, 16, gt});
            for (const Tier & t : {Tier{0, 1, gt}, Tier{2, 2, gt}, Tier{7, 3, gt}, Tier{1, 16, gt}}) {
                SCOPED_TRACE("K " + std::to_string(sp.pages) + " sink " + std::to_string(sp.sink) + " local " + std::to_string(sp.local) +
                             (sp.score ? " quest" : " mean") + (gt == OOMB_TYPE_BF16 ? " bf16" : " f32") + " grads, resident " +
                             std::to_string(t.R) + " block " + std::to_string(t.B));
                const RunResult off = run_driver(P, ids, sp, t);
                ASSERT_EQ(off.grads.size(), res.grads.size());
                int n_lists = 0;
                for (const auto & u : off.listed) n_lists += u.first > t.R;
                EXPECT_GT(n_lists, 0) << "the test must stream sparse chunks";
                EXPECT_GT(off.bytes_in, 0u);
                EXPECT_LT(std::fabs(off.loss - res.loss) / std::fabs(res.loss), 1e-6);
                // f32 gradient pages: the rounding of the block-wise sums (measured 1.7e-7). bf16: the
                // same, plus a stochastic rounding of a gradient page element that flips when the f32
                // sum before it differs in its last bits (one bf16 ulp is 3.9e-3 relative): measured
                // up to 3.8e-5 here; a wrong or missing page gives about 1e-1 (sparse vs dense: 2.4e-1).
                const double e = max_rel_diff(off.grads, res.grads);
                EXPECT_LT(e, gt == OOMB_TYPE_BF16 ? 1e-3 : 1e-5) << "gradients (max abs diff / max abs) " << e;
                worst[gt == OOMB_TYPE_BF16] = std::max(worst[gt == OOMB_TYPE_BF16], e);
            }
        }
    }
    printf("sparse offload vs resident sparse, worst gradient max abs diff / max abs: f32 pages %.2e, bf16 pages %.2e\n", worst[0], worst[1]);
}

// Only the selected pages move: against dense offload of the same tier, each sparse chunk's layer
// copies exactly its listed host-tier pages (|U|) instead of its whole host-tier history (c0 - R):
// stage 1's forward and stage 2's forward K/V in, stage 2's backward K/V and dK/dV in and dK/dV
// out. The rest (the chunks' own pages, chunks whose history fits K) is the same in both.
TEST(SparseOffload, MovesOnlySelectedPages) {
    Params P(7);
    const std::vector<int32_t> ids = random_ids(61, 12);
    for (oomb_type gt : {OOMB_TYPE_F32, OOMB_TYPE_BF16}) {
        for (const Tier & t : {Tier{0, 2, gt}, Tier{3, 1, gt}}) {
            SCOPED_TRACE(std::string(gt == OOMB_TYPE_BF16 ? "bf16" : "f32") + " grads, resident " + std::to_string(t.R) + " block " +
                         std::to_string(t.B));
            const RunResult dense = run_driver(P, ids, {0, OOMB_SPARSE_SCORE_MEAN, 0, 0}, t);
            const RunResult sparse = run_driver(P, ids, {3, OOMB_SPARSE_SCORE_MEAN, 1, 0}, t);
            const uint64_t kvb = (uint64_t) kD * kHkv * kP * 4, gb = (uint64_t) kD * kHkv * kP * oomb_type_size(gt);  // one page of K (V), dK (dV)
            uint64_t saved_pages = 0, listed_pages = 0;
            for (const auto & u : sparse.listed) {
                const int64_t hist = std::max<int64_t>(0, u.first - std::max<int64_t>(t.R, 0));
                ASSERT_LE(u.second, hist);
                saved_pages += (uint64_t) (hist - u.second);
                listed_pages += (uint64_t) u.second;
            }
            ASSERT_GT(saved_pages, 0u) << "the selection must leave host-tier pages out";
            ASSERT_GT(listed_pages, 0u);
            EXPECT_LT(sparse.bytes_in, dense.bytes_in);
            EXPECT_LT(sparse.bytes_out, dense.bytes_out);
            EXPECT_EQ(dense.bytes_in - sparse.bytes_in, saved_pages * (2 * kvb + 2 * kvb + 2 * kvb + 2 * gb));
            EXPECT_EQ(dense.bytes_out - sparse.bytes_out, saved_pages * 2 * gb);
            printf("%s grads, resident %" PRId64 ", block %d: dense offload %.1f KiB in / %.1f KiB out, sparse %.1f / %.1f "
                   "(%" PRIu64 " listed host pages moved, %" PRIu64 " left on the host)\n",
                   gt == OOMB_TYPE_BF16 ? "bf16" : "f32", t.R, t.B, dense.bytes_in / 1024.0, dense.bytes_out / 1024.0,
                   sparse.bytes_in / 1024.0, sparse.bytes_out / 1024.0, listed_pages, saved_pages);
        }
    }
}

// The attention-result cache over the selected pages (--attn-cache with --sparse-pages): stage 1 saves
// each layer's result over its lists and stage 2 loads it instead of recomputing over the same lists.
// f32: loss and gradients bit-identical to the run without the cache; bf16: the output rounded to bf16
// (stage 2, which computes the loss, reads the rounded output: loss and gradients close, measured
// 1e-3 relative; the rounding of the dense cache is the same).
TEST(SparseDriver, AttnCacheEqualsRecomputing) {
    Params P(5);
    const std::vector<int32_t> ids = random_ids(61, 13);
    for (oomb_sparse_params sp : {oomb_sparse_params{3, OOMB_SPARSE_SCORE_MEAN, 1, 0}, oomb_sparse_params{4, OOMB_SPARSE_SCORE_QUEST, 0, 1}}) {
        SCOPED_TRACE(sp.score ? "quest" : "mean");
        const RunResult base = run_driver(P, ids, sp);
        const RunResult f32 = run_driver(P, ids, sp, Tier{}, OOMB_TYPE_F32);
        EXPECT_EQ(f32.loss, base.loss);
        ASSERT_EQ(f32.grads.size(), base.grads.size());
        EXPECT_EQ(memcmp(f32.grads.data(), base.grads.data(), f32.grads.size() * 4), 0) << "f32 cache: bit-identical gradients";
        EXPECT_EQ(f32.allowed, base.allowed) << "the same selection";
        const RunResult bf = run_driver(P, ids, sp, Tier{}, OOMB_TYPE_BF16);
        EXPECT_NE(bf.loss, base.loss) << "the bf16 cache rounds the output: the test must see it";
        EXPECT_NEAR(bf.loss, base.loss, 1e-3 * std::fabs(base.loss));
        const double e = max_rel_diff(bf.grads, base.grads);
        printf("%s: bf16 attention cache vs recomputing: gradients %.2e (max abs diff / max abs)\n", sp.score ? "quest" : "mean", e);
        EXPECT_LT(e, 2e-2);
    }
}

TEST(SparseDriver, RefusesBadParams) {
    Params P(5);
    oomb::ChunkParams cp;
    cp.chunk = kC;
    cp.page = kP;
    cp.max_tokens = 61;
    cp.sparse = {3, OOMB_SPARSE_SCORE_MEAN, 2, 2};
    EXPECT_OOMB_ERROR(oomb::ChunkDriver(std::make_unique<TinyBuilder>(P), cp), "exceed the budget");
}

} // namespace
