// The CPU paged-attention kernels (src/cpu/paged-attn.cpp: tiled, per-ISA) against a plain double
// precision reference: forward output, dq, the dK/dV accumulated into the gradient pages (on top of
// what they held) and dk_cur/dv_cur, over shapes that exercise the tails: head dims that are and
// are not multiples of the vector width, GQA groups of 1..7, pages smaller and larger than the key
// block, a chunk whose positions start mid-page, bf16 pools, and a non-contiguous page table.
// Results must also be bit-identical with 1 and 2 threads. Every case runs with each kernel variant
// (OOMB_PAGED_ISA=avx512, avx2, base; a variant the CPU lacks falls back to the best it has).
// The forward's saved log-sum-exp (the tail of the op's packed node) is checked against the
// reference, and the backward runs both with the saved statistics (fwd given) and recomputing them
// (fwd NULL): the two agree to 1e-6.
#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-paged.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

struct Case {
    int D, H, Hkv, page;
    int64_t hist, T;
    oomb_type type;
    bool store;
};

class PagedCpu : public ::testing::TestWithParam<std::tuple<Case, const char *>> {};

float get_pool(const oomb_tensor * pool, int64_t d, int64_t g, int64_t slot, int64_t page) {
    const char * p = (const char *) pool->data + d * pool->nb[0] + g * pool->nb[1] + slot * pool->nb[2] + page * pool->nb[3];
    if (pool->type == OOMB_TYPE_F32) return *(const float *) p;
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t) h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
void set_pool(oomb_tensor * pool, int64_t d, int64_t g, int64_t slot, int64_t page, float v) {
    char * p = (char *) pool->data + d * pool->nb[0] + g * pool->nb[1] + slot * pool->nb[2] + page * pool->nb[3];
    if (pool->type == OOMB_TYPE_F32) { *(float *) p = v; return; }
    uint32_t u;
    v = bf16_round(v);
    memcpy(&u, &v, 4);
    const uint16_t h = (uint16_t) (u >> 16);
    memcpy(p, &h, 2);
}

double rel(const std::vector<double> & ref, const float * got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}
double rel_f(const std::vector<float> & ref, const std::vector<float> & got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += ((double) got[i] - ref[i]) * ((double) got[i] - ref[i]);
        den += (double) ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

struct IsaEnv {  // sets OOMB_PAGED_ISA for the scope, restores it after
    std::string old;
    bool had;
    explicit IsaEnv(const char * isa) {
        const char * o = getenv("OOMB_PAGED_ISA");
        had = o != nullptr;
        if (had) old = o;
        setenv("OOMB_PAGED_ISA", isa, 1);
    }
    ~IsaEnv() {
        if (had) setenv("OOMB_PAGED_ISA", old.c_str(), 1);
        else unsetenv("OOMB_PAGED_ISA");
    }
};

TEST_P(PagedCpu, MatchesReference) {
    const Case c = std::get<0>(GetParam());
    IsaEnv isa(std::get<1>(GetParam()));
    const int64_t D = c.D, H = c.H, Hkv = c.Hkv, T = c.T, S = c.hist + c.T, group = H / Hkv;
    oomb_backend_t be = oomb_backend_cpu_init(2);
    oomb_kv_cache_params kp{};
    kp.n_layer = 1; kp.n_head_kv = c.Hkv; kp.head_dim = c.D; kp.page_size = c.page;
    kp.max_tokens = S + 3 * c.page;  // spare pages: the mapping below is not the identity
    kp.type = c.type; kp.with_grad = true;
    oomb_kv_cache_t kv = oomb_kv_cache_init(be, kp);
    ASSERT_NE(kv, nullptr);
    // take a few pages first and give them back, so logical pages map to scattered physical ones
    oomb_kv_cache_reserve(kv, 2 * c.page);
    oomb_kv_cache_clear(kv);
    oomb_kv_cache_reserve(kv, S);
    oomb_tensor * kpool = oomb_kv_cache_k(kv, 0), * vpool = oomb_kv_cache_v(kv, 0);
    oomb_tensor * dkpool = oomb_kv_cache_dk(kv, 0), * dvpool = oomb_kv_cache_dv(kv, 0);
    const int32_t * pt = (const int32_t *) oomb_kv_cache_page_table(kv)->data;

    std::mt19937 rng(1234 + c.D * 7 + c.H);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    const int64_t n_pages = kpool->ne[3];
    for (int64_t pg = 0; pg < n_pages; pg++)
        for (int64_t sl = 0; sl < c.page; sl++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t d = 0; d < D; d++) {
                    set_pool(kpool, d, g, sl, pg, U(rng));
                    set_pool(vpool, d, g, sl, pg, U(rng));
                    set_pool(dkpool, d, g, sl, pg, U(rng));  // gradients accumulate on top of this
                    set_pool(dvpool, d, g, sl, pg, U(rng));
                }
    oomb_context * ctx = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * kc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * vc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * dout = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
    for (oomb_tensor * t : {q, kc, vc, dout})
        for (int64_t i = 0; i < oomb_nelements(t); i++) ((float *) t->data)[i] = 2.0f * U(rng);
    for (int64_t t = 0; t < T; t++) ((int32_t *) pos->data)[t] = (int32_t) (c.hist + t);
    const float scale = 1.0f / std::sqrt((float) D);

    // copies of the pools as the reference sees them (after the forward's store, if any)
    auto pool_at = [&](const oomb_tensor * pool, int64_t p, int64_t g, int64_t d) {
        return (double) get_pool(pool, d, g, p % c.page, pt[p / c.page]);
    };
    std::vector<double> dk0((size_t) (S * Hkv * D)), dv0(dk0.size());
    for (int64_t p = 0; p < S; p++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t d = 0; d < D; d++) {
                dk0[(p * Hkv + g) * D + d] = pool_at(dkpool, p, g, d);
                dv0[(p * Hkv + g) * D + d] = pool_at(dvpool, p, g, d);
            }

    oomb_tensor * out = oomb_paged_attn(ctx, q, kc, vc, kpool, vpool, oomb_kv_cache_page_table(kv), pos, scale, c.store ? 1 : 0);
    // the result is the out view [D, H, T] at offset 0 of the packed node (out, then the LSE per row)
    oomb_tensor * packed = out->view_src;
    ASSERT_NE(packed, nullptr);
    ASSERT_EQ(packed->op, OOMB_OP_PAGED_ATTN);
    ASSERT_EQ(oomb_nelements(packed), D * H * T + H * T);
    ASSERT_TRUE(out->ne[0] == D && out->ne[1] == H && out->ne[2] == T && out->ne[3] == 1 && oomb_is_contiguous(out) && out->view_offs == 0);
    oomb_cgraph * gf = oomb_new_graph(ctx);
    oomb_build_forward_expand(gf, out);
    oomb_backend_graph_compute(be, gf);
    if (c.store) {  // the chunk's K/V are now in the pages, rounded to the pool type
        for (int64_t t = 0; t < T; t++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t d = 0; d < D; d++) {
                    const float kx = ((float *) kc->data)[(t * Hkv + g) * D + d];
                    const float vx = ((float *) vc->data)[(t * Hkv + g) * D + d];
                    ASSERT_EQ((float) pool_at(kpool, c.hist + t, g, d), c.type == OOMB_TYPE_F32 ? kx : bf16_round(kx));
                    ASSERT_EQ((float) pool_at(vpool, c.hist + t, g, d), c.type == OOMB_TYPE_F32 ? vx : bf16_round(vx));
                }
    }

    // reference, in double
    std::vector<double> ro((size_t) (T * H * D)), rdq(ro.size()), rdk = dk0, rdv = dv0, rlse((size_t) (T * H));
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group, n = c.hist + t + 1;
            const float * qv = (const float *) q->data + (t * H + h) * D;
            const float * dov = (const float *) dout->data + (t * H + h) * D;
            std::vector<double> s((size_t) n), dp((size_t) n);
            double mx = -INFINITY;
            for (int64_t p = 0; p < n; p++) {
                double a = 0, b = 0;
                for (int64_t d = 0; d < D; d++) { a += qv[d] * pool_at(kpool, p, g, d); b += dov[d] * pool_at(vpool, p, g, d); }
                s[p] = a * scale;
                dp[p] = b;
                mx = std::max(mx, s[p]);
            }
            double l = 0;
            for (int64_t p = 0; p < n; p++) { s[p] = std::exp(s[p] - mx); l += s[p]; }
            rlse[t * H + h] = mx + std::log(l);  // log sum_p exp(scale * q . k_p)
            double delta = 0;
            for (int64_t p = 0; p < n; p++) { s[p] /= l; delta += s[p] * dp[p]; }
            for (int64_t p = 0; p < n; p++) {
                const double ds = s[p] * (dp[p] - delta);
                for (int64_t d = 0; d < D; d++) {
                    ro[(t * H + h) * D + d] += s[p] * pool_at(vpool, p, g, d);
                    rdq[(t * H + h) * D + d] += scale * ds * pool_at(kpool, p, g, d);
                    rdk[(p * Hkv + g) * D + d] += scale * ds * qv[d];
                    rdv[(p * Hkv + g) * D + d] += s[p] * dov[d];
                }
            }
        }
    EXPECT_LT(rel(ro, (const float *) out->data, ro.size()), 1e-5);
    {  // the saved LSE, natural log, row t*H + h after out
        const float * lse = (const float *) packed->data + D * H * T;
        double worst = 0;
        for (int64_t r = 0; r < T * H; r++) worst = std::max(worst, std::fabs(lse[r] - rlse[r]) / std::max(1.0, std::fabs(rlse[r])));
        EXPECT_LT(worst, 2e-6) << "saved log-sum-exp";
    }

    // backward, with 2 threads then (from the same starting gradient pages) with 1 thread; each with
    // the forward's saved statistics (fwd: the view, or the packed node) and recomputing them (NULL)
    std::vector<std::vector<float>> results[2];  // [saved]
    std::vector<float> incs[2];                  // [saved]: dq, then the gradient pages' increments (2 threads)
    for (int run = 0; run < 4; run++) {
        const int threads = run < 2 ? 2 : 1;
        const bool saved = run % 2 == 0;
        oomb_tensor * fwd = saved ? (threads == 2 ? out : packed) : nullptr;
        SCOPED_TRACE(std::string(saved ? "saved statistics" : "recomputed statistics") + ", threads " + std::to_string(threads));
        for (int64_t p = 0; p < S; p++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t d = 0; d < D; d++) {
                    set_pool(dkpool, d, g, p % c.page, pt[p / c.page], (float) dk0[(p * Hkv + g) * D + d]);
                    set_pool(dvpool, d, g, p % c.page, pt[p / c.page], (float) dv0[(p * Hkv + g) * D + d]);
                }
        oomb_backend_cpu_set_n_threads(be, threads);
        oomb_tensor * back = oomb_paged_attn_back(ctx, q, kpool, vpool, dkpool, dvpool, oomb_kv_cache_page_table(kv), pos, dout, fwd, scale);
        ASSERT_EQ(oomb_paged_attn_args_of(back).fwd, saved ? packed : nullptr);
        oomb_cgraph * gb = oomb_new_graph(ctx);
        oomb_build_forward_expand(gb, back);
        oomb_backend_graph_compute(be, gb);
        const float * bd = (const float *) back->data;
        EXPECT_LT(rel(rdq, bd, rdq.size()), 1e-5) << "dq, threads " << threads;
        std::vector<float> gk(rdk.size()), gv(rdv.size());
        for (int64_t p = 0; p < S; p++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t d = 0; d < D; d++) {
                    gk[(p * Hkv + g) * D + d] = (float) pool_at(dkpool, p, g, d);
                    gv[(p * Hkv + g) * D + d] = (float) pool_at(dvpool, p, g, d);
                }
        EXPECT_LT(rel(rdk, gk.data(), gk.size()), 1e-5) << "dK pages, threads " << threads;
        EXPECT_LT(rel(rdv, gv.data(), gv.size()), 1e-5) << "dV pages, threads " << threads;
        // dk_cur / dv_cur: the gradient pages at the chunk's positions
        const float * dkc = bd + D * H * T, * dvc = dkc + D * Hkv * T;
        for (int64_t t = 0; t < T; t++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t d = 0; d < D; d++) {
                    ASSERT_EQ(dkc[(t * Hkv + g) * D + d], gk[((c.hist + t) * Hkv + g) * D + d]);
                    ASSERT_EQ(dvc[(t * Hkv + g) * D + d], gv[((c.hist + t) * Hkv + g) * D + d]);
                }
        std::vector<float> all(bd, bd + oomb_nelements(back));
        all.insert(all.end(), gk.begin(), gk.end());
        all.insert(all.end(), gv.begin(), gv.end());
        results[saved].push_back(all);
        if (threads == 2) {
            std::vector<float> inc(bd, bd + D * H * T);
            for (size_t i = 0; i < gk.size(); i++) inc.push_back((float) (gk[i] - dk0[i]));
            for (size_t i = 0; i < gv.size(); i++) inc.push_back((float) (gv[i] - dv0[i]));
            incs[saved] = inc;
        }
    }
    EXPECT_TRUE(results[0][0] == results[0][1]) << "recomputed statistics: results differ between 1 and 2 threads";
    EXPECT_TRUE(results[1][0] == results[1][1]) << "saved statistics: results differ between 1 and 2 threads";
    // saved vs recomputed statistics: dq and the increments of the gradient pages
    EXPECT_LT(rel_f(incs[0], incs[1]), 1e-6) << "backward with saved statistics vs recomputed";
    oomb_free(ctx);
    oomb_kv_cache_free(kv);
    oomb_backend_free(be);
}

// oomb_paged_attn_back checks its fwd argument: the result of oomb_paged_attn (view or packed node)
// for q's shape and the pools' shape and type.
TEST(PagedCpuErrors, BackwardFwdArgument) {
    oomb_context * ctx = oomb_init({0, true});
    const int64_t D = 8, H = 4, Hkv = 2, T = 5, P = 4, NP = 3;
    oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * q2 = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T + 1);
    oomb_tensor * kc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * kc2 = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T + 1);
    oomb_tensor * kp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, D, Hkv, P, NP);
    oomb_tensor * dkp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, D, Hkv, P, NP);
    oomb_tensor * pt = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, NP);
    oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
    oomb_tensor * pos2 = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T + 1);
    oomb_tensor * dout = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * out = oomb_paged_attn(ctx, q, kc, kc, kp, kp, pt, pos, 0.5f, 1);
    oomb_tensor * other = oomb_paged_attn(ctx, q2, kc2, kc2, kp, kp, pt, pos2, 0.5f, 1);
    // accepted: the view and the packed node, both stored as the packed node
    EXPECT_EQ(oomb_paged_attn_args_of(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, out, 0.5f)).fwd, out->view_src);
    EXPECT_EQ(oomb_paged_attn_args_of(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, out->view_src, 0.5f)).fwd, out->view_src);
    EXPECT_EQ(oomb_paged_attn_args_of(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, nullptr, 0.5f)).fwd, nullptr);
    EXPECT_OOMB_ERROR(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, dout, 0.5f), "must be the result of oomb_paged_attn");
    EXPECT_OOMB_ERROR(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, oomb_scale(ctx, out, 1.0f), 0.5f),
                      "must be the result of oomb_paged_attn");
    EXPECT_OOMB_ERROR(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, other, 0.5f), "is the paged_attn of q");
    // a reshape of the out view is the same forward
    EXPECT_EQ(oomb_paged_attn_args_of(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, oomb_reshape_2d(ctx, out, D * H, T), 0.5f)).fwd,
              out->view_src);
    // same shapes, other inputs: its saved statistics would be wrong for this backward (review finding:
    // relative errors 0.2-1.3 against the recompute path, silently)
    oomb_tensor * q_other = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * pos_other = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
    oomb_tensor * f_scale = oomb_paged_attn(ctx, q, kc, kc, kp, kp, pt, pos, 0.25f, 1);
    oomb_tensor * f_q = oomb_paged_attn(ctx, q_other, kc, kc, kp, kp, pt, pos, 0.5f, 1);
    oomb_tensor * f_pos = oomb_paged_attn(ctx, q, kc, kc, kp, kp, pt, pos_other, 0.5f, 1);
    for (oomb_tensor * f : {f_scale, f_q, f_pos})
        EXPECT_OOMB_ERROR(oomb_paged_attn_back(ctx, q, kp, kp, dkp, dkp, pt, pos, dout, f, 0.5f), "computed from other inputs");
    oomb_free(ctx);
}

// A NaN key makes exactly the rows that attend it NaN (output and LSE), on every kernel variant;
// rows before it are bit-identical to the run without it. Review finding (s5b): the lane max
// (a > b ? a : b) skips a NaN score, and the normalisation (l > 0 ? 1 / l : 0) turned a NaN sum
// into 0, so such rows came out as a finite 0 (oomb-eval of a model with NaN K weights printed a
// finite mean NLL); a row whose every visible score was NaN was taken for "nothing visible".
TEST(PagedCpuNonFinite, NanKeyPoisonsExactlyTheRowsThatSeeIt) {
    const int64_t D = 20, H = 2, Hkv = 1, P = 7, hist = 10, T = 9, S = hist + T;
    for (const char * isa_name : {"avx512", "avx2", "base"}) {
        IsaEnv isa(isa_name);
        // nan_at: -1 none; >= 0 one NaN element in the chunk key at that row; -2: every key's element 0 NaN
        for (int64_t nan_at : {(int64_t) 3, (int64_t) -2}) {
            std::vector<float> res[2], lse[2];
            for (int with_nan = 0; with_nan < 2; with_nan++) {
                oomb_backend_t be = oomb_backend_cpu_init(2);
                oomb_kv_cache_params kp{};
                kp.n_layer = 1; kp.n_head_kv = Hkv; kp.head_dim = D; kp.page_size = P;
                kp.max_tokens = S; kp.type = OOMB_TYPE_F32; kp.with_grad = false;
                oomb_kv_cache_t kv = oomb_kv_cache_init(be, kp);
                ASSERT_NE(kv, nullptr);
                oomb_kv_cache_reserve(kv, S);
                oomb_tensor * kpool = oomb_kv_cache_k(kv, 0), * vpool = oomb_kv_cache_v(kv, 0);
                std::mt19937 rng(77);
                std::uniform_real_distribution<float> U(-1.0f, 1.0f);
                for (int64_t pg = 0; pg < kpool->ne[3]; pg++)
                    for (int64_t sl = 0; sl < P; sl++)
                        for (int64_t d = 0; d < D; d++) {
                            set_pool(kpool, d, 0, sl, pg, with_nan && nan_at == -2 && d == 0 ? NAN : U(rng));
                            set_pool(vpool, d, 0, sl, pg, U(rng));
                        }
                oomb_context * ctx = oomb_init({0, false});
                oomb_tensor * qkv[3];  // q [D, H, T], k_cur and v_cur [D, Hkv, T], random
                for (int j = 0; j < 3; j++) {
                    qkv[j] = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, j ? Hkv : H, T);
                    for (int64_t i = 0; i < oomb_nelements(qkv[j]); i++) ((float *) qkv[j]->data)[i] = 2.0f * U(rng);
                }
                oomb_tensor * q = qkv[0], * kc = qkv[1], * vc = qkv[2];
                oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
                if (with_nan && nan_at >= 0) ((float *) kc->data)[nan_at * Hkv * D + 5] = NAN;
                if (with_nan && nan_at == -2)
                    for (int64_t t = 0; t < T; t++) ((float *) kc->data)[t * Hkv * D] = NAN;
                for (int64_t t = 0; t < T; t++) ((int32_t *) pos->data)[t] = (int32_t) (hist + t);
                oomb_tensor * out = oomb_paged_attn(ctx, q, kc, vc, kpool, vpool, oomb_kv_cache_page_table(kv), pos, 0.3f, 1);
                oomb_cgraph * gf = oomb_new_graph(ctx);
                oomb_build_forward_expand(gf, out);
                oomb_backend_graph_compute(be, gf);
                const float * o = (const float *) out->view_src->data;
                res[with_nan].assign(o, o + D * H * T);
                lse[with_nan].assign(o + D * H * T, o + D * H * T + H * T);
                oomb_free(ctx);
                oomb_kv_cache_free(kv);
                oomb_backend_free(be);
            }
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < H; h++) {
                    const bool sees = nan_at == -2 || t >= nan_at;
                    const int64_t r = t * H + h;
                    EXPECT_EQ(std::isnan(lse[1][r]), sees) << isa_name << " nan_at " << nan_at << " row " << t << " head " << h << " lse " << lse[1][r];
                    if (!sees) EXPECT_EQ(lse[1][r], lse[0][r]) << isa_name << " row " << t;
                    for (int64_t d = 0; d < D; d++) {
                        const float a = res[1][r * D + d], b = res[0][r * D + d];
                        if (sees) EXPECT_TRUE(std::isnan(a)) << isa_name << " nan_at " << nan_at << " row " << t << " head " << h << " d " << d << ": " << a;
                        else EXPECT_EQ(a, b) << isa_name << " row " << t << " d " << d;
                    }
                }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedCpu,
                         ::testing::Combine(::testing::Values(Case{64, 2, 1, 64, 150, 100, OOMB_TYPE_F32, false},   // qwen2-micro heads
                                           Case{64, 4, 2, 64, 0, 130, OOMB_TYPE_F32, true},      // first chunk, stores
                                           Case{128, 7, 1, 128, 200, 33, OOMB_TYPE_F32, false},  // 7B-like group, D 128
                                           Case{80, 6, 2, 16, 70, 37, OOMB_TYPE_F32, true},      // D 80, small pages
                                           Case{72, 3, 3, 100, 90, 45, OOMB_TYPE_BF16, true},    // bf16 pools, pages > block
                                           Case{6, 3, 1, 5, 11, 9, OOMB_TYPE_F32, false},        // tiny head dim
                                           Case{20, 2, 2, 7, 3, 200, OOMB_TYPE_BF16, false}),    // many query tiles
                                            ::testing::Values("avx512", "avx2", "base")));

} // namespace

// oomb_paged_attn_cached: a load-mode node reproduces the computed result exactly, positions must
// be consecutive and inside the cache, and store + load together is refused.
// One layer's f32 KV pool (page 4, 32 positions, reserved up to p0 + T), random q / k_cur / v_cur
// of a chunk at positions p0 .. p0 + T - 1: the set-up of the result-cache tests below.
struct CacheChunk {
    oomb_backend_t be;
    oomb_kv_cache_t kv;
    oomb_context * ctx;
    std::mt19937 rng{5};
    oomb_tensor * q, * kc, * vc, * pos, * kpool, * vpool, * pt;
    CacheChunk(int64_t D, int64_t H, int64_t Hkv, int64_t T, int p0, int64_t P = 4, int64_t S = 32) {
        be = oomb_backend_cpu_init(2);
        oomb_kv_cache_params kp{};
        kp.n_layer = 1; kp.n_head_kv = (int) Hkv; kp.head_dim = (int) D; kp.page_size = (int) P; kp.max_tokens = S;
        kp.type = OOMB_TYPE_F32; kp.with_grad = false;
        kv = oomb_kv_cache_init(be, kp);
        oomb_kv_cache_reserve(kv, p0 + T);
        ctx = oomb_init({0, false});
        q = rnd(oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T));
        kc = rnd(oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T));
        vc = rnd(oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T));
        pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
        for (int64_t t = 0; t < T; t++) oomb_set_i32_1d(pos, t, (int32_t) (p0 + t));
        kpool = oomb_kv_cache_k(kv, 0); vpool = oomb_kv_cache_v(kv, 0); pt = oomb_kv_cache_page_table(kv);
    }
    ~CacheChunk() {
        oomb_free(ctx);
        oomb_kv_cache_free(kv);
        oomb_backend_free(be);
    }
    oomb_tensor * rnd(oomb_tensor * t) {
        std::uniform_real_distribution<float> U(-1.0f, 1.0f);
        for (int64_t i = 0; i < oomb_nelements(t); i++) oomb_set_f32_1d(t, i, U(rng));
        return t;
    }
};

TEST(PagedCpuCache, SaveThenLoadIsBitIdentical) {
    const int64_t D = 16, H = 4, Hkv = 2, T = 6, S = 32;
    CacheChunk C(D, H, Hkv, T, 10);
    oomb_backend_t be = C.be;
    oomb_context * ctx = C.ctx;
    auto rnd = [&](oomb_tensor * t) { return C.rnd(t); };
    oomb_tensor * q = C.q, * kc = C.kc, * vc = C.vc, * pos = C.pos;
    oomb_tensor * cache = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, S * (D * H + H));
    oomb_tensor * kpool = C.kpool, * vpool = C.vpool, * pt = C.pt;
    // history 0..9 first (plain), then the chunk at 10..15 saved, then recomputed and loaded
    oomb_tensor * qh = rnd(oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, 10));
    oomb_tensor * kh = rnd(oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, 10));
    oomb_tensor * vh = rnd(oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, 10));
    oomb_tensor * ph = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, 10);
    for (int t = 0; t < 10; t++) oomb_set_i32_1d(ph, t, t);
    oomb_tensor * o_hist = oomb_paged_attn(ctx, qh, kh, vh, kpool, vpool, pt, ph, 0.3f, 1);
    oomb_tensor * o_save = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 1, cache, 0);
    oomb_tensor * o_re = oomb_paged_attn(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0);
    oomb_tensor * o_load = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cache, 1);
    for (oomb_tensor * o : {o_hist, o_save, o_re, o_load}) {
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, o->view_src);
        oomb_backend_graph_compute(be, g);
    }
    const int64_t n = oomb_nelements(o_save->view_src);
    int diff_re = 0, diff_load = 0;
    for (int64_t i = 0; i < n; i++) {
        diff_re += ((float *) o_save->view_src->data)[i] != ((float *) o_re->view_src->data)[i];
        diff_load += ((float *) o_save->view_src->data)[i] != ((float *) o_load->view_src->data)[i];
    }
    EXPECT_EQ(diff_re, 0) << "recompute over the stored K/V equals the first computation";
    EXPECT_EQ(diff_load, 0) << "the loaded block equals the computed result (out and LSE)";
    // the block sits at float pos[0] * (D*H + H)
    EXPECT_EQ(((float *) cache->data)[10 * (D * H + H)], ((float *) o_save->view_src->data)[0]);
    // errors: store and load together; positions not consecutive; outside the cache
    EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 1, cache, 1), "store must be 0");
    EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cache, 7), "must be 0 or 1");
    EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 2, cache, 0), "must be 0 or 1");
    oomb_tensor * bad = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
    for (int64_t t = 0; t < T; t++) oomb_set_i32_1d(bad, t, (int32_t) (t < 5 ? 9 + t : 15));  // 9..13, 15
    oomb_tensor * o_bad = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, bad, 0.3f, 0, cache, 1);
    oomb_cgraph * gb = oomb_new_graph(ctx);
    oomb_build_forward_expand(gb, o_bad->view_src);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(be, gb), "consecutive");
    oomb_tensor * small = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 12 * (D * H + H));
    oomb_tensor * o_out = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, small, 1);
    oomb_cgraph * go = oomb_new_graph(ctx);
    oomb_build_forward_expand(go, o_out->view_src);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(be, go), "outside the cache");

    // bf16 cache: (D*H + 2H) elements per position; out comes back rounded to bf16 (nearest even),
    // the LSE bit for bit
    EXPECT_EQ(oomb_paged_attn_cache_row(D, H, OOMB_TYPE_BF16), D * H + 2 * H);
    EXPECT_OOMB_ERROR(oomb_paged_attn_cache_row(D, H, OOMB_TYPE_F16), "f32 or bf16");
    oomb_tensor * cache16 = oomb_new_tensor_1d(ctx, OOMB_TYPE_BF16, S * (D * H + 2 * H));
    for (int64_t i = 0; i < oomb_nelements(cache16); i++) ((uint16_t *) cache16->data)[i] = 0x7fc0;  // NaN: unsaved blocks show
    oomb_tensor * o_save16 = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cache16, 0);
    oomb_tensor * o_load16 = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cache16, 1);
    for (oomb_tensor * o : {o_save16, o_load16}) {
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, o->view_src);
        oomb_backend_graph_compute(be, g);
    }
    const int64_t n_out = D * H * T;
    int bad_out = 0, bad_lse = 0, diff_save = 0;
    const float * ps = (const float *) o_save16->view_src->data, * pl = (const float *) o_load16->view_src->data;
    for (int64_t i = 0; i < n; i++) {
        diff_save += ps[i] != ((float *) o_save->view_src->data)[i];  // computing is not changed by the cache type
        if (i < n_out) bad_out += pl[i] != oomb_bf16_to_fp32(oomb_fp32_to_bf16(ps[i]));
        else bad_lse += memcmp(&pl[i], &ps[i], 4) != 0;
    }
    EXPECT_EQ(diff_save, 0);
    EXPECT_EQ(bad_out, 0) << "the loaded out is the computed out rounded to bf16";
    EXPECT_EQ(bad_lse, 0) << "the loaded LSE is the computed LSE, bit for bit";
    int rounded = 0;
    for (int64_t i = 0; i < n_out; i++) rounded += pl[i] != ps[i];
    EXPECT_GT(rounded, n_out / 2) << "bf16 rounding changes most outputs (the test would not see a cache kept in f32)";
    // the block sits at element pos[0] * (D*H + 2H); the positions before it were never saved
    EXPECT_EQ(((uint16_t *) cache16->data)[10 * (D * H + 2 * H)], oomb_fp32_to_bf16(ps[0]));
    EXPECT_EQ(((uint16_t *) cache16->data)[10 * (D * H + 2 * H) - 1], 0x7fc0);
    oomb_tensor * small16 = oomb_new_tensor_1d(ctx, OOMB_TYPE_BF16, 16 * (D * H + 2 * H) - 1);
    oomb_tensor * tiny16 = oomb_new_tensor_1d(ctx, OOMB_TYPE_BF16, T * (D * H + 2 * H) - 1);
    EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, tiny16, 1), "holds fewer");  // < T positions
    oomb_tensor * o_out16 = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, small16, 1);
    oomb_cgraph * go16 = oomb_new_graph(ctx);
    oomb_build_forward_expand(go16, o_out16->view_src);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(be, go16), "outside the cache");
    oomb_tensor * c16 = oomb_new_tensor_1d(ctx, OOMB_TYPE_F16, S * (D * H + 2 * H));
    EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, c16, 1), "f32 or bf16");
}

// bf16 result cache with odd sizes (D*H odd, so the LSE part starts at an odd 16-bit element: the
// CUDA copy kernel moves it in 16-bit halves, tests/test-cuda-paged-attn.cpp), T = 1, odd pos[0], a
// load before any save (zeros), wrong cache types, a non-contiguous view as cache. (From a review.)
TEST(PagedCpuCache, Bf16OddShapes) {
    for (auto [D, H, Hkv, T, p0] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>>{
             {3, 3, 1, 1, 7}, {5, 1, 1, 3, 9}, {3, 3, 3, 5, 11}, {7, 3, 1, 2, 1}}) {
        SCOPED_TRACE("D " + std::to_string(D) + " H " + std::to_string(H) + " T " + std::to_string(T) + " p0 " + std::to_string(p0));
        const int64_t S = 32;
        CacheChunk C(D, H, Hkv, T, p0);
        oomb_backend_t be = C.be;
        oomb_context * ctx = C.ctx;
        oomb_tensor * q = C.q, * kc = C.kc, * vc = C.vc, * pos = C.pos;
        const int64_t row = oomb_paged_attn_cache_row(D, H, OOMB_TYPE_BF16);
        oomb_tensor * cache = oomb_new_tensor_1d(ctx, OOMB_TYPE_BF16, S * row);
        memset(cache->data, 0, oomb_nbytes(cache));
        oomb_tensor * kpool = C.kpool, * vpool = C.vpool, * pt = C.pt;
        // load before save: zeros
        oomb_tensor * o_pre = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cache, 1);
        oomb_tensor * o_save = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 1, cache, 0);
        oomb_tensor * o_load = oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cache, 1);
        for (oomb_tensor * o : {o_pre, o_save, o_load}) {
            oomb_cgraph * g = oomb_new_graph(ctx);
            oomb_build_forward_expand(g, o->view_src);
            oomb_backend_graph_compute(be, g);
        }
        const int64_t n = oomb_nelements(o_save->view_src), n_out = D * H * T;
        int nz_pre = 0, bad_out = 0, bad_lse = 0;
        const float * ps = (const float *) o_save->view_src->data, * pl = (const float *) o_load->view_src->data;
        for (int64_t i = 0; i < n; i++) {
            nz_pre += ((const float *) o_pre->view_src->data)[i] != 0.0f;
            if (i < n_out) bad_out += pl[i] != oomb_bf16_to_fp32(oomb_fp32_to_bf16(ps[i]));
            else bad_lse += memcmp(&pl[i], &ps[i], 4) != 0;
        }
        EXPECT_EQ(nz_pre, 0);
        EXPECT_EQ(bad_out, 0);
        EXPECT_EQ(bad_lse, 0);
        // wrong types / views
        oomb_tensor * ci = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, S * row);
        EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, ci, 1), "f32 or bf16");
        oomb_tensor * c2 = oomb_new_tensor_2d(ctx, OOMB_TYPE_BF16, 2 * row, S);
        oomb_tensor * cv = oomb_view_2d(ctx, c2, row, S, c2->nb[1], 0);  // not contiguous
        EXPECT_OOMB_ERROR(oomb_paged_attn_cached(ctx, q, kc, vc, kpool, vpool, pt, pos, 0.3f, 0, cv, 1), "contiguous");
    }
}
