// Page schedules of paged attention on the CPU (oomb-schedule.h, oomb_paged_attn_ext /
// oomb_paged_attn_back_ext): page ranges and per-query-tile page lists against dense attention
// with the equivalent mask (a double-precision reference that masks a dense score matrix: its own
// definition of the mask, not the kernels' helper), forward (out, saved LSE) and backward (dq, the
// dK/dV added into the gradient pages, dk_cur/dv_cur), with the saved and the recomputed
// statistics; against finite differences; lists holding every history page equal to the dense
// schedule bit for bit; the inverse lists; input errors; the autodiff through a page-list op.
// Sizes where pages, chunks and query tiles do not divide each other: page 5, chunks of 13 / 7
// positions starting mid-page, GQA groups 2 and 3, head dims 8 and 64, f32 and bf16 pools, a
// shuffled page table.
#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-schedule.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

struct Shape {
    int D, H, Hkv, P;
    int hist, T;
    oomb_type type;
};

std::string shape_name(const Shape & s) {
    return "D" + std::to_string(s.D) + " H" + std::to_string(s.H) + "/" + std::to_string(s.Hkv) + " P" + std::to_string(s.P) + " hist" +
           std::to_string(s.hist) + " T" + std::to_string(s.T) + " " + oomb_type_name(s.type);
}

// A schedule as the test defines it: allowed(t, p) for query t (position pos[t]) and key p <= pos[t].
struct TestSched {
    oomb_page_schedule_kind kind = OOMB_SCHEDULE_DENSE;
    int first = 0, last = 0;
    std::vector<std::vector<int32_t>> lists;  // per query tile, the history pages
};

// One chunk's operands in host memory (f32 q, k_cur, v_cur, dout; pools of s.type; f32 gradient pages).
struct Chunk {
    Shape s;
    int c0, n_qtiles, n_pages;
    oomb_context * ctx;
    oomb_tensor * q, * kc, * vc, * kp, * vp, * dkp, * dvp, * pt, * pos, * dout;
    std::vector<float> dk0, dv0;  // the gradient pages' initial contents
    float scale;

    explicit Chunk(const Shape & sh, uint32_t seed) : s(sh) {
        std::mt19937 rng(seed);
        const int n_pos = s.hist + s.T;
        const int n_logical = (n_pos + s.P - 1) / s.P;
        n_pages = n_logical + 2;
        c0 = s.hist / s.P;
        n_qtiles = (n_pos - 1) / s.P - c0 + 1;
        scale = 1.0f / std::sqrt((float) s.D);
        ctx = oomb_init({0, false});
        q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, s.D, s.H, s.T);
        kc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, s.D, s.Hkv, s.T);
        vc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, s.D, s.Hkv, s.T);
        dout = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, s.D, s.H, s.T);
        kp = oomb_new_tensor_4d(ctx, s.type, s.D, s.Hkv, s.P, n_pages);
        vp = oomb_new_tensor_4d(ctx, s.type, s.D, s.Hkv, s.P, n_pages);
        dkp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, s.D, s.Hkv, s.P, n_pages);
        dvp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, s.D, s.Hkv, s.P, n_pages);
        pt = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n_logical);
        pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, s.T);
        oombtest::fill_uniform(q, rng, -2.0f, 2.0f);  // random data, gradient pages holding earlier sums
        for (oomb_tensor * t : {kc, vc, dout, kp, vp}) oombtest::fill_uniform(t, rng, -1.0f, 1.0f);
        for (oomb_tensor * t : {dkp, dvp}) oombtest::fill_uniform(t, rng, -0.5f, 0.5f);
        std::vector<int32_t> perm(n_pages);  // a shuffled page table
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::copy(perm.begin(), perm.begin() + n_logical, (int32_t *) pt->data);
        for (int t = 0; t < s.T; t++) ((int32_t *) pos->data)[t] = s.hist + t;
        dk0 = vec(dkp);
        dv0 = vec(dvp);
    }
    ~Chunk() { oomb_free(ctx); }

    static std::vector<float> vec(const oomb_tensor * t) {
        const float * p = (const float *) t->data;
        return std::vector<float>(p, p + oomb_nelements(t));
    }
    void reset_grads() {
        memcpy(dkp->data, dk0.data(), dk0.size() * sizeof(float));
        memcpy(dvp->data, dv0.data(), dv0.size() * sizeof(float));
    }
    double pool(const oomb_tensor * t, int p, int g, int d) const {
        const int pg = ((const int32_t *) pt->data)[p / s.P];
        const char * e = (const char *) t->data + d * t->nb[0] + g * t->nb[1] + (p % s.P) * t->nb[2] + (size_t) pg * t->nb[3];
        if (t->type == OOMB_TYPE_F32) return *(const float *) e;
        uint16_t h;
        memcpy(&h, e, 2);
        return oomb_bf16_to_fp32(h);
    }
    size_t grad_index(int p, int g, int d) const {  // element of (p, g, d) in the f32 gradient pages
        const int pg = ((const int32_t *) pt->data)[p / s.P];
        return (((size_t) pg * s.P + p % s.P) * s.Hkv + g) * s.D + d;
    }
    bool allowed(const TestSched & S, int t, int p) const {
        const int pt_ = s.hist + t, lp = p / s.P;
        if (p > pt_) return false;
        switch (S.kind) {
            case OOMB_SCHEDULE_DENSE: return true;
            case OOMB_SCHEDULE_RANGE: return lp >= S.first && lp < S.last;
            case OOMB_SCHEDULE_LISTS_RANGE:
                if (lp < S.first || lp >= S.last) return false;
                [[fallthrough]];
            default: {
                if (lp >= c0) return true;
                const auto & l = S.lists[pt_ / s.P - c0];
                return std::find(l.begin(), l.end(), lp) != l.end();
            }
        }
    }

    // The schedule's tensors (host), kept alive by the context.
    oomb_page_schedule make(const TestSched & S, bool with_inverse) {
        if (S.kind == OOMB_SCHEDULE_DENSE) return oomb_schedule_dense();
        if (S.kind == OOMB_SCHEDULE_RANGE) return oomb_schedule_range(S.first, S.last);
        std::vector<int32_t> off{0}, pg;
        for (const auto & l : S.lists) {
            pg.insert(pg.end(), l.begin(), l.end());
            off.push_back((int32_t) pg.size());
        }
        const int64_t nnz = (int64_t) pg.size();
        oomb_tensor * to = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, (int64_t) off.size());
        oomb_tensor * tp = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, std::max<int64_t>(nnz, 1));
        memcpy(to->data, off.data(), off.size() * 4);
        ((int32_t *) tp->data)[0] = -7;  // padding when empty
        if (nnz) memcpy(tp->data, pg.data(), nnz * 4);
        oomb_tensor * io = nullptr, * iq = nullptr;
        if (with_inverse) {
            io = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, c0 + 1);
            iq = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, std::max<int64_t>(nnz, 1));
            ((int32_t *) iq->data)[0] = -7;
            oomb_schedule_invert(off.data(), (int64_t) S.lists.size(), pg.data(), c0, (int32_t *) io->data, (int32_t *) iq->data);
        }
        if (S.kind == OOMB_SCHEDULE_LISTS_RANGE) return oomb_schedule_lists_range(to, tp, io, iq, S.first, S.last);
        return oomb_schedule_lists(to, tp, io, iq);
    }
    oomb_paged_attn_args args(const oomb_page_schedule & sc) const {
        oomb_paged_attn_args a{};
        a.q = q; a.k_cur = kc; a.v_cur = vc; a.k_pages = kp; a.v_pages = vp; a.page_table = pt; a.pos = pos;
        a.schedule = sc; a.scale = scale;
        a.dout = dout; a.dk_pages = dkp; a.dv_pages = dvp;
        return a;
    }
};

struct Ref {
    std::vector<double> out, lse, dq, dk, dv;  // dk / dv: increments, indexed like the gradient pages
};

// Dense attention over positions 0..pos[t] with the schedule's mask applied to the score matrix.
Ref reference(const Chunk & U, const TestSched & S) {
    const Shape & s = U.s;
    const int G = s.H / s.Hkv, n = s.hist + s.T;
    Ref r;
    r.out.assign((size_t) s.D * s.H * s.T, 0.0);
    r.dq = r.out;
    r.lse.assign((size_t) s.H * s.T, -INFINITY);
    r.dk.assign(U.dk0.size(), 0.0);
    r.dv = r.dk;
    for (int t = 0; t < s.T; t++)
        for (int h = 0; h < s.H; h++) {
            const int g = h / G;
            const float * qv = (const float *) U.q->data + ((size_t) t * s.H + h) * s.D;
            const float * dv = (const float *) U.dout->data + ((size_t) t * s.H + h) * s.D;
            std::vector<double> sc(n, -INFINITY), dp(n, 0.0);
            double mx = -INFINITY;
            for (int p = 0; p < n; p++) {
                if (!U.allowed(S, t, p)) continue;
                double a = 0, b = 0;
                for (int d = 0; d < s.D; d++) { a += qv[d] * U.pool(U.kp, p, g, d); b += dv[d] * U.pool(U.vp, p, g, d); }
                sc[p] = a * U.scale;
                dp[p] = b;
                mx = std::max(mx, sc[p]);
            }
            if (mx == -INFINITY) continue;  // no key: out 0, LSE -inf, no gradients
            double l = 0;
            for (int p = 0; p < n; p++) l += sc[p] == -INFINITY ? 0.0 : std::exp(sc[p] - mx);
            r.lse[(size_t) t * s.H + h] = mx + std::log(l);
            std::vector<double> pr(n, 0.0);
            double delta = 0;
            for (int p = 0; p < n; p++) {
                if (sc[p] == -INFINITY) continue;
                pr[p] = std::exp(sc[p] - mx) / l;
                delta += pr[p] * dp[p];
            }
            for (int p = 0; p < n; p++) {
                if (pr[p] == 0.0) continue;
                const double ds = pr[p] * (dp[p] - delta);
                for (int d = 0; d < s.D; d++) {
                    r.out[((size_t) t * s.H + h) * s.D + d] += pr[p] * U.pool(U.vp, p, g, d);
                    r.dq[((size_t) t * s.H + h) * s.D + d] += U.scale * ds * U.pool(U.kp, p, g, d);
                    r.dk[U.grad_index(p, g, d)] += U.scale * ds * qv[d];
                    r.dv[U.grad_index(p, g, d)] += pr[p] * dv[d];
                }
            }
        }
    return r;
}

double rel(const std::vector<double> & ref, const std::vector<double> & got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

oomb_backend_t cpu(int threads = 2) {
    static oomb_backend_t b = oomb_backend_cpu_init(2);
    oomb_backend_cpu_set_n_threads(b, threads);
    return b;
}
void compute(oomb_context * ctx, oomb_tensor * t) {
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, t);
    oomb_backend_graph_compute(cpu(), g);
}

struct Result {
    std::vector<float> packed, back, dk, dv;  // forward node; backward node; gradient pages after
};
// Forward, then the backward with the saved (saved = true) or recomputed statistics.
Result run(Chunk & U, const oomb_page_schedule & sc, bool saved) {
    Result R;
    const oomb_paged_attn_args a = U.args(sc);
    oomb_tensor * out = oomb_paged_attn_ext(U.ctx, &a);
    compute(U.ctx, out);
    R.packed = Chunk::vec(out->view_src);
    U.reset_grads();
    oomb_paged_attn_args b = a;
    b.fwd = saved ? out : nullptr;
    oomb_tensor * back = oomb_paged_attn_back_ext(U.ctx, &b);
    compute(U.ctx, back);
    R.back = Chunk::vec(back);
    R.dk = Chunk::vec(U.dkp);
    R.dv = Chunk::vec(U.dvp);
    return R;
}

void check_against_reference(Chunk & U, const TestSched & S, const char * what) {
    SCOPED_TRACE(shape_name(U.s) + ", " + what);
    const Shape & s = U.s;
    const Ref r = reference(U, S);
    const size_t nq = (size_t) s.D * s.H * s.T, nkv = (size_t) s.D * s.Hkv * s.T;
    const double tol = 1e-5;
    const oomb_page_schedule sc = U.make(S, true);
    for (bool saved : {true, false}) {
        SCOPED_TRACE(saved ? "saved statistics" : "recomputed statistics");
        const Result R = run(U, sc, saved);
        std::vector<double> out(R.packed.begin(), R.packed.begin() + nq), dq(R.back.begin(), R.back.begin() + nq);
        EXPECT_LT(rel(r.out, out), tol) << "out";
        int bad_lse = 0;
        for (size_t i = 0; i < r.lse.size(); i++) {
            const double g = R.packed[nq + i];
            if (r.lse[i] == -INFINITY) bad_lse += g != -INFINITY;
            else bad_lse += !(std::fabs(g - r.lse[i]) <= 2e-6 * std::max(1.0, std::fabs(r.lse[i])));
        }
        EXPECT_EQ(bad_lse, 0) << "saved log-sum-exp";
        EXPECT_LT(rel(r.dq, dq), tol) << "dq";
        std::vector<double> dk(R.dk.size()), dv(R.dv.size());
        for (size_t i = 0; i < dk.size(); i++) { dk[i] = (double) R.dk[i] - U.dk0[i]; dv[i] = (double) R.dv[i] - U.dv0[i]; }
        EXPECT_LT(rel(r.dk, dk), tol) << "dK pages increment";
        EXPECT_LT(rel(r.dv, dv), tol) << "dV pages increment";
        int bad_cur = 0;  // dk_cur / dv_cur: the gradient pages at the chunk's positions
        for (int t = 0; t < s.T; t++)
            for (int g = 0; g < s.Hkv; g++)
                for (int d = 0; d < s.D; d++) {
                    const size_t i = ((size_t) t * s.Hkv + g) * s.D + d, j = U.grad_index(s.hist + t, g, d);
                    bad_cur += R.back[nq + i] != R.dk[j] || R.back[nq + nkv + i] != R.dv[j];
                }
        EXPECT_EQ(bad_cur, 0) << "dk_cur / dv_cur";
    }
}

// A few schedules of each kind for a set-up: ranges over the history, over history and current
// pages, and one seeing no key for the first rows; random lists (some empty, some full).
std::vector<std::pair<std::string, TestSched>> schedules(const Chunk & U, uint32_t seed) {
    std::vector<std::pair<std::string, TestSched>> v;
    std::mt19937 rng(seed);
    const int last_page = (U.s.hist + U.s.T - 1) / U.s.P;
    auto range = [&](int f, int l) {
        TestSched S;
        S.kind = OOMB_SCHEDULE_RANGE;
        S.first = f;
        S.last = l;
        v.push_back({"range [" + std::to_string(f) + ", " + std::to_string(l) + ")", S});
    };
    range(0, U.c0);                      // the history only (streaming block)
    range(1, std::max(2, U.c0 - 1));     // a middle block
    range(U.c0 - 1, last_page + 1);      // the last history page and the current region
    range(U.c0 + 1, last_page + 5);      // no key for the chunk's first rows (out 0, LSE -inf)
    TestSched L;
    L.kind = OOMB_SCHEDULE_LISTS;
    for (int j = 0; j < U.n_qtiles; j++) {
        std::vector<int32_t> l;
        for (int h = 0; h < U.c0; h++)
            if (j == 1 || (j != 0 && rng() % 3 == 0)) l.push_back(h);  // tile 0 empty, tile 1 full
        L.lists.push_back(l);
    }
    v.push_back({"random lists", L});
    // the lists restricted to windows (LISTS_RANGE, the offload's blocks of a sparse history): the
    // history only, a middle block, the last history page with the current region, and a window
    // past the chunk's first rows (they see no key)
    for (auto [f, l] : {std::pair<int, int>{0, U.c0}, {1, std::max(2, U.c0 - 1)}, {U.c0 - 1, last_page + 1}, {U.c0 + 1, last_page + 5}}) {
        TestSched W = L;
        W.kind = OOMB_SCHEDULE_LISTS_RANGE;
        W.first = f;
        W.last = l;
        v.push_back({"lists in [" + std::to_string(f) + ", " + std::to_string(l) + ")", W});
    }
    return v;
}

class PagedSchedule : public ::testing::TestWithParam<Shape> {};

TEST_P(PagedSchedule, MatchesMaskedDenseReference) {
    Chunk U(GetParam(), 4242 + GetParam().D);
    uint32_t seed = 17;
    for (const auto & [name, S] : schedules(U, seed++)) check_against_reference(U, S, name.c_str());
}

// Lists holding every history page are the dense schedule: the same kernels' results bit for bit
// (forward node, backward node, gradient pages), with 1 and 2 threads.
TEST_P(PagedSchedule, FullListsEqualDenseBitForBit) {
    Chunk U(GetParam(), 99 + GetParam().H);
    TestSched full;
    full.kind = OOMB_SCHEDULE_LISTS;
    for (int j = 0; j < U.n_qtiles; j++) {
        std::vector<int32_t> l(U.c0);
        std::iota(l.begin(), l.end(), 0);
        full.lists.push_back(l);
    }
    const oomb_page_schedule lists = U.make(full, true);
    for (int threads : {2, 1}) {
        cpu(threads);
        for (bool saved : {true, false}) {
            const Result d = run(U, oomb_schedule_dense(), saved), l = run(U, lists, saved);
            EXPECT_TRUE(d.packed == l.packed) << "forward, threads " << threads;
            EXPECT_TRUE(d.back == l.back) << "backward, threads " << threads << (saved ? ", saved" : ", recomputed");
            EXPECT_TRUE(d.dk == l.dk && d.dv == l.dv) << "gradient pages, threads " << threads;
        }
    }
    cpu(2);
    // and the dense schedule through the general constructors is oomb_paged_attn's node
    const oomb_paged_attn_args a = U.args(oomb_schedule_dense());
    oomb_tensor * x = oomb_paged_attn_ext(U.ctx, &a);
    oomb_tensor * y = oomb_paged_attn(U.ctx, U.q, U.kc, U.vc, U.kp, U.vp, U.pt, U.pos, U.scale, 0);
    compute(U.ctx, x);
    const std::vector<float> vx = Chunk::vec(x->view_src);
    compute(U.ctx, y);
    EXPECT_TRUE(vx == Chunk::vec(y->view_src));
    EXPECT_EQ(memcmp(x->view_src->op_params, y->view_src->op_params, sizeof(x->op_params)), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedSchedule,
                         ::testing::Values(Shape{8, 4, 2, 5, 27, 13, OOMB_TYPE_F32},     // group 2, chunk 13 from mid-page
                                           Shape{64, 6, 2, 5, 22, 13, OOMB_TYPE_F32},    // group 3, D 64
                                           Shape{64, 4, 2, 5, 33, 7, OOMB_TYPE_BF16},    // bf16 pools
                                           Shape{8, 3, 1, 5, 41, 70, OOMB_TYPE_F32},     // group 3, many query tiles
                                           Shape{20, 6, 3, 7, 75, 90, OOMB_TYPE_F32}));  // CPU tiles span query tiles

// Finite differences of loss = sum(out * W) (f32 pools) with respect to q and to K/V pool entries
// (history and current), against the backward's dq and gradient-page increments.
TEST(PagedScheduleGrad, FiniteDifferences) {
    const Shape sh{8, 4, 2, 5, 12, 8, OOMB_TYPE_F32};
    Chunk U(sh, 5);
    std::vector<std::pair<std::string, TestSched>> scheds;
    {
        TestSched r;
        r.kind = OOMB_SCHEDULE_RANGE;
        r.first = 1;
        r.last = 3;
        scheds.push_back({"range [1, 3)", r});
        TestSched l;
        l.kind = OOMB_SCHEDULE_LISTS;
        l.lists = {{0}, {1}};  // c0 = 2, two query tiles (positions 12..14, 15..19)
        scheds.push_back({"lists", l});
        TestSched w = l;
        w.kind = OOMB_SCHEDULE_LISTS_RANGE;
        w.first = 1;
        w.last = 3;  // history page 1 (tile 1's) and the current page 2
        w.lists = {{0, 1}, {1}};
        scheds.push_back({"lists in [1, 3)", w});
    }
    ASSERT_EQ(U.c0, 2);
    ASSERT_EQ(U.n_qtiles, 2);
    for (const auto & [name, S] : scheds) {
        SCOPED_TRACE(name);
        const oomb_page_schedule sc = U.make(S, true);
        // the dout of the backward is W
        auto loss = [&]() {
            const oomb_paged_attn_args a = U.args(sc);
            oomb_tensor * out = oomb_paged_attn_ext(U.ctx, &a);
            compute(U.ctx, out);
            double l = 0;
            const float * o = (const float *) out->data, * w = (const float *) U.dout->data;
            for (int64_t i = 0; i < oomb_nelements(U.dout); i++) l += (double) o[i] * w[i];
            return l;
        };
        const Result R = run(U, sc, true);
        const float eps = 1e-2f;
        auto fd = [&](float * x) {
            const float x0 = *x;
            *x = x0 + eps;
            const double lp = loss();
            *x = x0 - eps;
            const double lm = loss();
            *x = x0;
            return (lp - lm) / (2 * eps);
        };
        double worst = 0, scale_ = 0;
        for (int i = 0; i < 40; i++) {
            const size_t k = (size_t) (i * 7919) % oomb_nelements(U.q);
            const double num = fd((float *) U.q->data + k), an = R.back[k];
            worst = std::max(worst, std::fabs(num - an));
            scale_ = std::max(scale_, std::fabs(an));
        }
        for (int p : {0, 3, 6, 9, 12, 14, 19})  // history pages 0 and 1, the current region
            for (int g = 0; g < sh.Hkv; g++)
                for (int d = 0; d < sh.D; d += 3) {
                    const size_t j = U.grad_index(p, g, d);
                    const double nk = fd((float *) U.kp->data + j), nv = fd((float *) U.vp->data + j);
                    const double ak = (double) R.dk[j] - U.dk0[j], av = (double) R.dv[j] - U.dv0[j];
                    worst = std::max({worst, std::fabs(nk - ak), std::fabs(nv - av)});
                    scale_ = std::max({scale_, std::fabs(ak), std::fabs(av)});
                }
        EXPECT_GT(scale_, 1e-2) << "gradients of a sensible size";
        EXPECT_LT(worst, 2e-3 * std::max(1.0, scale_)) << "largest |finite difference - backward|";
    }
}

TEST(PagedScheduleHelpers, InvertAndCheck) {
    const int32_t off[] = {0, 2, 2, 5};
    const int32_t pg[] = {1, 3, 0, 1, 2};
    int32_t io[5], iq[5];
    oomb_schedule_invert(off, 3, pg, 4, io, iq);
    const int32_t want_o[] = {0, 1, 3, 4, 5}, want_q[] = {2, 0, 2, 2, 0};
    EXPECT_TRUE(std::equal(io, io + 5, want_o));
    EXPECT_TRUE(std::equal(iq, iq + 5, want_q));
    const int32_t unsorted[] = {3, 1, 0, 1, 2};
    EXPECT_OOMB_ERROR(oomb_schedule_invert(off, 3, unsorted, 4, io, iq), "strictly ascending");
    EXPECT_OOMB_ERROR(oomb_schedule_invert(off, 3, pg, 3, io, iq), "outside the history");
    const int32_t bad_off[] = {0, 3, 2, 5};
    EXPECT_OOMB_ERROR(oomb_schedule_check_lists(bad_off, 3, pg, 5, 4, "t"), "must not decrease");
    EXPECT_OOMB_ERROR(oomb_schedule_range(3, 2), "0 <= first <= last");
}

TEST(PagedScheduleErrors, BadOperands) {
    Chunk U(Shape{8, 4, 2, 5, 27, 13, OOMB_TYPE_F32}, 3);  // c0 = 5, 3 query tiles
    TestSched L;
    L.kind = OOMB_SCHEDULE_LISTS;
    L.lists = {{0, 2}, {}, {4}};
    // the backward needs the inverse lists; the inverse must match the lists
    {
        oomb_paged_attn_args a = U.args(U.make(L, false));
        EXPECT_OOMB_ERROR(oomb_paged_attn_back_ext(U.ctx, &a), "inverse lists");
        oomb_page_schedule sc = U.make(L, true);
        ((int32_t *) sc.inv_qtiles->data)[0] = 1;  // page 0 chosen by tile 1 instead of 0
        a = U.args(sc);
        oomb_tensor * back = oomb_paged_attn_back_ext(U.ctx, &a);
        EXPECT_OOMB_ERROR(compute(U.ctx, back), "not the inversion");
    }
    // a listed page in the current region; pages out of order; too few query tiles
    auto fwd_error = [&](const TestSched & S, const char * msg) {
        const oomb_paged_attn_args a = U.args(U.make(S, false));
        oomb_tensor * out = oomb_paged_attn_ext(U.ctx, &a);
        EXPECT_OOMB_ERROR(compute(U.ctx, out), msg);
    };
    TestSched cur = L;
    cur.lists[1] = {5};
    fwd_error(cur, "outside the history");
    TestSched order = L;
    order.lists[0] = {2, 0};
    fwd_error(order, "strictly ascending");
    TestSched few = L;
    few.lists.pop_back();
    fwd_error(few, "query tile 2");
    // wrong tensor types; list tensors on a dense schedule; a result cache with a schedule
    oomb_page_schedule bad = U.make(L, false);
    bad.pages = oomb_new_tensor_1d(U.ctx, OOMB_TYPE_F32, 3);
    oomb_paged_attn_args a = U.args(bad);
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(U.ctx, &a), "contiguous i32");
    oomb_page_schedule dense = oomb_schedule_dense();
    dense.offsets = U.make(L, false).offsets;
    a = U.args(dense);
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(U.ctx, &a), "takes no list tensors");
    // (a window's result is partial: RANGE / LISTS_RANGE refused; whole-row LISTS accepted)
    a = U.args(oomb_schedule_range(0, 2));
    a.out_cache = oomb_new_tensor_1d(U.ctx, OOMB_TYPE_F32, 10000);
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(U.ctx, &a), "not a window's");
    oomb_page_schedule lwin = U.make(L, false);
    lwin.kind = OOMB_SCHEDULE_LISTS_RANGE;
    lwin.first = 0;
    lwin.last = 1;
    a = U.args(lwin);
    a.out_cache = oomb_new_tensor_1d(U.ctx, OOMB_TYPE_F32, 10000);
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(U.ctx, &a), "not a window's");
    a = U.args(U.make(L, false));
    a.out_cache = oomb_new_tensor_1d(U.ctx, OOMB_TYPE_F32, 10000);
    EXPECT_NE(oomb_paged_attn_ext(U.ctx, &a), nullptr);
    // a page-list window with last < first; a LISTS_RANGE backward whose forward had another window
    EXPECT_OOMB_ERROR(oomb_schedule_lists_range(bad.offsets, bad.pages, nullptr, nullptr, 3, 2), "0 <= first <= last");
    oomb_page_schedule win = U.make(L, true);
    win.kind = OOMB_SCHEDULE_LISTS_RANGE;
    win.first = 4;
    win.last = 2;
    a = U.args(win);
    EXPECT_OOMB_ERROR(oomb_paged_attn_ext(U.ctx, &a), "window [4, 2)");
    win.first = 0;
    a = U.args(win);
    oomb_tensor * wout = oomb_paged_attn_ext(U.ctx, &a);
    oomb_paged_attn_args wb = a;
    wb.schedule.last = 3;
    wb.fwd = wout;
    EXPECT_OOMB_ERROR(oomb_paged_attn_back_ext(U.ctx, &wb), "another page schedule");
    // a backward with another schedule than its forward's saved statistics
    a = U.args(oomb_schedule_range(0, 2));
    oomb_tensor * out = oomb_paged_attn_ext(U.ctx, &a);
    oomb_paged_attn_args b = U.args(oomb_schedule_range(0, 3));
    b.fwd = out;
    EXPECT_OOMB_ERROR(oomb_paged_attn_back_ext(U.ctx, &b), "another page schedule");
}

// Autodiff through a page-list op: q's gradient equals the masked reference's dq; a page-list
// forward without its inverse lists is refused by build_backward_expand.
TEST(PagedScheduleGrad, Autodiff) {
    Chunk U(Shape{8, 4, 2, 5, 27, 13, OOMB_TYPE_F32}, 11);
    TestSched L;
    L.kind = OOMB_SCHEDULE_LISTS;
    L.lists = {{1, 3}, {0}, {2, 3, 4}};
    oomb_set_param(U.q);
    oomb_new_grad(U.ctx, U.q);
    // the pools' gradient pages
    U.kp->grad = U.dkp;
    U.vp->grad = U.dvp;
    for (bool inverse : {false, true}) {
        const oomb_paged_attn_args a = U.args(U.make(L, inverse));
        oomb_tensor * out = oomb_paged_attn_ext(U.ctx, &a);
        oomb_tensor * loss = oomb_sum(U.ctx, oomb_mul(U.ctx, out, U.dout));
        oomb_set_loss(loss);
        oomb_cgraph * g = oomb_new_graph(U.ctx);
        oomb_build_forward_expand(g, loss);
        if (!inverse) {
            EXPECT_OOMB_ERROR(oomb_build_backward_expand(U.ctx, g, loss, nullptr), "without its inverse lists");
            continue;
        }
        oomb_build_backward_expand(U.ctx, g, loss, nullptr);
        U.reset_grads();
        memset(U.q->grad->data, 0, oomb_nbytes(U.q->grad));
        oomb_backend_graph_compute(cpu(), g);
        const Ref r = reference(U, L);
        const float * gq = (const float *) U.q->grad->data;
        EXPECT_LT(rel(r.dq, std::vector<double>(gq, gq + r.dq.size())), 1e-5) << "q's gradient";
        std::vector<double> dk(U.dk0.size());
        for (size_t i = 0; i < dk.size(); i++) dk[i] = (double) ((const float *) U.dkp->data)[i] - U.dk0[i];
        EXPECT_LT(rel(r.dk, dk), 1e-5) << "dK pages increment";
    }
}

} // namespace

// ---- review additions ----
namespace {
TestSched rng_sched(int f, int l) { TestSched S; S.kind = OOMB_SCHEDULE_RANGE; S.first = f; S.last = l; return S; }
}
TEST(ReviewSchedule, EdgeRangesMatchReference) {
    for (Shape sh : {Shape{8, 4, 2, 5, 27, 13, OOMB_TYPE_F32}, Shape{8, 3, 1, 1, 6, 5, OOMB_TYPE_F32},
                     Shape{8, 2, 2, 7, 0, 9, OOMB_TYPE_BF16}, Shape{64, 4, 2, 16, 33, 1, OOMB_TYPE_F32}}) {
        Chunk U(sh, 11);
        const int last_page = (sh.hist + sh.T - 1) / sh.P;
        check_against_reference(U, rng_sched(0, 0), "empty range [0,0)");
        check_against_reference(U, rng_sched(last_page + 3, last_page + 100), "range beyond the cache");
        check_against_reference(U, rng_sched(0, 1 << 30), "range [0, 2^30)");
        check_against_reference(U, rng_sched(last_page - 1, last_page + 1), "range = the last two pages");
    }
}
TEST(ReviewSchedule, ListsEdgeCasesMatchReference) {
    // first chunk (no history): lists must be empty; page 1; one query; chunk starting at a page boundary
    for (Shape sh : {Shape{8, 2, 1, 4, 0, 9, OOMB_TYPE_F32}, Shape{8, 4, 2, 1, 7, 4, OOMB_TYPE_F32},
                     Shape{8, 4, 2, 5, 25, 1, OOMB_TYPE_F32}, Shape{8, 4, 2, 5, 25, 10, OOMB_TYPE_F32}}) {
        Chunk U(sh, 5);
        TestSched L;
        L.kind = OOMB_SCHEDULE_LISTS;
        for (int j = 0; j < U.n_qtiles; j++) {
            std::vector<int32_t> l;
            for (int h = 0; h < U.c0; h++) if ((h + j) % 2 == 0) l.push_back(h);
            L.lists.push_back(l);
        }
        check_against_reference(U, L, "alternating lists");
        // more query tiles in the lists than the chunk has: allowed (extra tiles unused)?
        TestSched M = L;
        M.lists.push_back({0});
        if (U.c0 > 0) check_against_reference(U, M, "one extra query tile");
    }
}
TEST(ReviewSchedule, BadListsAreErrors) {
    Chunk U(Shape{8, 4, 2, 5, 27, 13, OOMB_TYPE_F32}, 3);  // c0 = 5, 3 query tiles
    TestSched L;
    L.kind = OOMB_SCHEDULE_LISTS;
    L.lists = {{0, 2}, {}, {4}};
    auto fwd_error = [&](oomb_page_schedule sc, const char * msg) {
        const oomb_paged_attn_args a = U.args(sc);
        oomb_tensor * out = oomb_paged_attn_ext(U.ctx, &a);
        EXPECT_OOMB_ERROR(compute(U.ctx, out), msg);
    };
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.pages->data)[0] = -1; fwd_error(sc, "outside the history"); }
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.offsets->data)[0] = 1; fwd_error(sc, "offsets[0]"); }
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.offsets->data)[3] = 1000; fwd_error(sc, "entries"); }
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.offsets->data)[3] = -3; fwd_error(sc, ""); }
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.offsets->data)[1] = 3; ((int32_t *) sc.offsets->data)[2] = 2; fwd_error(sc, "decrease"); }
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.offsets->data)[1] = -5; fwd_error(sc, ""); }
    { oomb_page_schedule sc = U.make(L, false); ((int32_t *) sc.pages->data)[1] = 0; fwd_error(sc, "strictly ascending"); }
    // positions not starting at the chunk's smallest
    { oomb_page_schedule sc = U.make(L, false); std::swap(((int32_t *) U.pos->data)[0], ((int32_t *) U.pos->data)[12]);
      fwd_error(sc, "query tile"); std::swap(((int32_t *) U.pos->data)[0], ((int32_t *) U.pos->data)[12]); }
    // backward: an inverse with a wrong n_hist (larger than c0) or corrupted offsets
    {
        oomb_page_schedule sc = U.make(L, true);
        ((int32_t *) sc.inv_offsets->data)[2] = 7;  // corrupt
        oomb_paged_attn_args a = U.args(sc);
        oomb_tensor * back = oomb_paged_attn_back_ext(U.ctx, &a);
        EXPECT_OOMB_ERROR(compute(U.ctx, back), "");
    }
}
