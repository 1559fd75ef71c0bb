// bf16 KV-gradient pages (oomb_kv_cache_params::grad_type, oomb_paged_attn_back) on the CPU backend,
// against the same backward into f32 gradient pages. A sequence of 157 positions in chunks of 50
// over pages of 24 (neither divides the other nor the sequence; head dim 40, a GQA group of 3) runs
// the stage-2 order: the chunks' backward calls from the last to the first, each adding its
// contribution into the pages. With bf16 pages every call rounds each touched element once,
// stochastically, so the error of an element touched by n calls is below n bf16 ulps of its
// largest running sum (2^-7 relative each: the bound checked per element), zero in expectation
// (the mean over seeds approaches the f32 result as 1/sqrt(seeds)), and the rounding is
// reproducible (same seed: same bits, whatever the thread count; another seed: other bits).
#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-paged.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

struct Problem {
    int D = 40, H = 6, Hkv = 2, page = 24;
    int64_t S = 157, chunk = 50;
    std::vector<float> k, v;                  // [S][Hkv][D], bf16-exact (the pools are f32)
    std::vector<std::vector<float>> q, dout;  // per chunk: [T][H][D]
    Problem() {
        std::mt19937 rng(97);
        std::uniform_real_distribution<float> U(-1.0f, 1.0f);
        auto bf = [](float x) { uint32_t u; memcpy(&u, &x, 4); u &= 0xffff0000u; memcpy(&x, &u, 4); return x; };
        k.resize((size_t) (S * Hkv * D));
        v.resize(k.size());
        for (size_t i = 0; i < k.size(); i++) { k[i] = bf(U(rng)); v[i] = bf(U(rng)); }
        for (int64_t c0 = 0; c0 < S; c0 += chunk) {
            const int64_t T = std::min(chunk, S - c0);
            std::vector<float> qc((size_t) (T * H * D)), dc(qc.size());
            for (size_t i = 0; i < qc.size(); i++) { qc[i] = 2.0f * U(rng); dc[i] = U(rng); }
            q.push_back(qc);
            dout.push_back(dc);
        }
    }
    int n_chunks() const { return (int) q.size(); }
};

float page_value(const oomb_tensor * pool, const int32_t * pt, int page, int64_t p, int64_t g, int64_t d) {
    const char * e = (const char *) pool->data + (size_t) pt[p / page] * pool->nb[3] + (size_t) (p % page) * pool->nb[2] +
                      (size_t) g * pool->nb[1] + (size_t) d * pool->nb[0];
    if (pool->type == OOMB_TYPE_F32) return *(const float *) e;
    uint16_t h;
    memcpy(&h, e, 2);
    const uint32_t u = (uint32_t) h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct Result {
    std::vector<float> pages;   // dK then dV, [S][Hkv][D] each, as f32
    std::vector<float> maxabs;  // f32 runs: the largest |running sum| of each element over the calls
    std::vector<float> cur0;    // the first chunk's dk_cur, dv_cur (its backward runs last)
};

// The stage-2 sweep: backward of chunk n-1 down to 0 into zeroed gradient pages of grad_type.
Result run(const Problem & P, oomb_type grad_type, uint32_t seed, int threads) {
    oomb_backend_t be = oomb_backend_cpu_init(threads);
    oomb_kv_cache_params kp{};
    kp.n_layer = 1; kp.n_head_kv = P.Hkv; kp.head_dim = P.D; kp.page_size = P.page;
    kp.max_tokens = P.S + 2 * P.page;
    kp.type = OOMB_TYPE_F32; kp.with_grad = true; kp.grad_type = grad_type;
    oomb_kv_cache_t kv = oomb_kv_cache_init(be, kp);
    EXPECT_NE(kv, nullptr);
    oomb_kv_cache_reserve(kv, P.page);  // scatter the mapping: logical page 0 is not physical page 0
    oomb_kv_cache_clear(kv);
    oomb_kv_cache_reserve(kv, P.S);
    oomb_kv_cache_zero_grad(kv);
    oomb_kv_cache_set_grad_seed(kv, seed);
    oomb_tensor * kpool = oomb_kv_cache_k(kv, 0), * vpool = oomb_kv_cache_v(kv, 0);
    oomb_tensor * dkp = oomb_kv_cache_dk(kv, 0), * dvp = oomb_kv_cache_dv(kv, 0);
    EXPECT_EQ(dkp->type, grad_type);
    const int32_t * pt = (const int32_t *) oomb_kv_cache_page_table(kv)->data;
    for (int64_t p = 0; p < P.S; p++)
        for (int64_t g = 0; g < P.Hkv; g++) {
            const size_t off = (size_t) pt[p / P.page] * kpool->nb[3] + (size_t) (p % P.page) * kpool->nb[2] + (size_t) g * kpool->nb[1];
            memcpy((char *) kpool->data + off, &P.k[(size_t) ((p * P.Hkv + g) * P.D)], (size_t) P.D * 4);
            memcpy((char *) vpool->data + off, &P.v[(size_t) ((p * P.Hkv + g) * P.D)], (size_t) P.D * 4);
        }
    const size_t n = (size_t) (P.S * P.Hkv * P.D);
    Result r;
    r.pages.assign(2 * n, 0.0f);
    r.maxabs.assign(2 * n, 0.0f);
    auto read_pages = [&]() {
        for (int64_t p = 0; p < P.S; p++)
            for (int64_t g = 0; g < P.Hkv; g++)
                for (int64_t d = 0; d < P.D; d++) {
                    const size_t i = (size_t) ((p * P.Hkv + g) * P.D + d);
                    r.pages[i] = page_value(dkp, pt, P.page, p, g, d);
                    r.pages[n + i] = page_value(dvp, pt, P.page, p, g, d);
                    r.maxabs[i] = std::max(r.maxabs[i], std::fabs(r.pages[i]));
                    r.maxabs[n + i] = std::max(r.maxabs[n + i], std::fabs(r.pages[n + i]));
                }
    };
    const float scale = 1.0f / std::sqrt((float) P.D);
    for (int ci = P.n_chunks() - 1; ci >= 0; ci--) {
        const int64_t c0 = ci * P.chunk, T = std::min(P.chunk, P.S - c0);
        oomb_context * ctx = oomb_init({0, false});
        oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, P.D, P.H, T);
        oomb_tensor * dout = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, P.D, P.H, T);
        oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
        memcpy(q->data, P.q[(size_t) ci].data(), oomb_nbytes(q));
        memcpy(dout->data, P.dout[(size_t) ci].data(), oomb_nbytes(dout));
        for (int64_t t = 0; t < T; t++) ((int32_t *) pos->data)[t] = (int32_t) (c0 + t);
        oomb_tensor * back = oomb_paged_attn_back(ctx, q, kpool, vpool, dkp, dvp, oomb_kv_cache_page_table(kv), pos, dout, nullptr, scale);
        oomb_cgraph * gb = oomb_new_graph(ctx);
        oomb_build_forward_expand(gb, back);
        EXPECT_EQ(oomb_backend_graph_compute(be, gb), OOMB_STATUS_OK);
        read_pages();
        if (ci == 0) {
            const float * bd = (const float *) back->data + P.D * P.H * T;
            r.cur0.assign(bd, bd + 2 * P.D * P.Hkv * T);
        }
        oomb_free(ctx);
    }
    oomb_kv_cache_free(kv);
    oomb_backend_free(be);
    return r;
}

double rel_err(const std::vector<float> & got, const std::vector<float> & ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        num += ((double) got[i] - ref[i]) * ((double) got[i] - ref[i]);
        den += (double) ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

} // namespace

// Per element: |bf16 - f32| < n * 2^-7 * (largest |running sum|) with n the calls that touched it
// (chunks whose positions reach it); in norm about 2^-9 relative. dk_cur / dv_cur are the bf16 page
// values, converted.
TEST(PagedGradBf16, MatchesF32PagesWithinRoundingBound) {
    const Problem P;
    const Result f = run(P, OOMB_TYPE_F32, 0, 2);
    const Result b = run(P, OOMB_TYPE_BF16, 7, 2);
    const size_t n = (size_t) (P.S * P.Hkv * P.D);
    int64_t nonzero = 0, exact = 0;
    for (size_t i = 0; i < 2 * n; i++) {
        const int64_t p = (int64_t) ((i % n) / (size_t) (P.Hkv * P.D));
        const int64_t calls = P.n_chunks() - p / P.chunk;  // chunks ci >= p / chunk attend position p
        const double bound = (double) calls * std::ldexp(1.0, -7) * f.maxabs[i] * (1.0 + std::ldexp(1.0, -6));
        ASSERT_LE(std::fabs((double) b.pages[i] - f.pages[i]), bound) << "element " << i << " (position " << p << ", " << calls
                                                                       << " calls): bf16 " << b.pages[i] << " vs f32 " << f.pages[i];
        nonzero += f.pages[i] != 0.0f;
        exact += b.pages[i] == f.pages[i];
    }
    EXPECT_EQ(nonzero, (int64_t) (2 * n)) << "every position gets a gradient (random data)";
    EXPECT_LT(exact, (int64_t) n / 8) << "the bf16 pages are rounded, not f32";
    const double rel = rel_err(b.pages, f.pages);
    EXPECT_GT(rel, 1e-4);
    EXPECT_LT(rel, 4.0 * std::ldexp(1.0, -9)) << "relative error in norm";
    printf("bf16 gradient pages vs f32: relative error %.3e (norm), %d calls at most\n", rel, P.n_chunks());
    // dk_cur, dv_cur of chunk 0 (positions 0..49): the bf16 values of the pages at its positions
    const int64_t T0 = P.chunk, m = T0 * P.Hkv * P.D;
    for (int64_t i = 0; i < m; i++) {
        ASSERT_EQ(b.cur0[(size_t) i], b.pages[(size_t) i]) << "dk_cur " << i;
        ASSERT_EQ(b.cur0[(size_t) (m + i)], b.pages[n + (size_t) i]) << "dv_cur " << i;
    }
}

// The expectation is the f32 result: the mean over 48 seeds is about sqrt(48) ~ 7 times closer to
// the f32 pages than one run (checked: more than 3.5 times; a biased rounding would not improve).
TEST(PagedGradBf16, UnbiasedOverSeeds) {
    const Problem P;
    const Result f = run(P, OOMB_TYPE_F32, 0, 2);
    const int N = 48;
    std::vector<double> mean(f.pages.size(), 0.0);
    double single = 0;
    for (int s = 0; s < N; s++) {
        const Result b = run(P, OOMB_TYPE_BF16, 1000u + (uint32_t) s, 2);
        if (s == 0) single = rel_err(b.pages, f.pages);
        for (size_t i = 0; i < mean.size(); i++) mean[i] += b.pages[i] / (double) N;
    }
    std::vector<float> mf(mean.begin(), mean.end());
    const double rel_mean = rel_err(mf, f.pages);
    printf("relative error: one seed %.3e, mean of %d seeds %.3e (ratio %.1f)\n", single, N, rel_mean, single / rel_mean);
    EXPECT_LT(rel_mean * 3.5, single);
}

// The same seed gives the same bits with 1 and 2 threads; another seed other bits; the seeds are
// kept on the gradient-page tensors.
TEST(PagedGradBf16, ReproducibleAndSeeded) {
    const Problem P;
    const Result a = run(P, OOMB_TYPE_BF16, 5, 2);
    const Result b = run(P, OOMB_TYPE_BF16, 5, 1);
    const Result c = run(P, OOMB_TYPE_BF16, 6, 2);
    EXPECT_TRUE(a.pages == b.pages) << "thread count changed the rounding";
    EXPECT_FALSE(a.pages == c.pages) << "another seed, the same bits";
    // f32 pages do not depend on the seed
    EXPECT_TRUE(run(P, OOMB_TYPE_F32, 1, 2).pages == run(P, OOMB_TYPE_F32, 2, 2).pages);

    oomb_backend_t be = oomb_backend_cpu_init(1);
    oomb_kv_cache_params kp{};
    kp.n_layer = 2; kp.n_head_kv = 1; kp.head_dim = 8; kp.page_size = 4; kp.max_tokens = 16;
    kp.type = OOMB_TYPE_F32; kp.with_grad = true; kp.grad_type = OOMB_TYPE_BF16;
    oomb_kv_cache_t kv = oomb_kv_cache_init(be, kp);
    ASSERT_NE(kv, nullptr);
    oomb_kv_cache_set_grad_seed(kv, 3);
    std::vector<uint32_t> seeds;
    for (int l = 0; l < 2; l++) {
        seeds.push_back(oomb_paged_attn_grad_seed(oomb_kv_cache_dk(kv, l)));
        seeds.push_back(oomb_paged_attn_grad_seed(oomb_kv_cache_dv(kv, l)));
    }
    std::vector<uint32_t> sorted = seeds;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "dK / dV of every layer get distinct seeds";
    oomb_kv_cache_set_grad_seed(kv, 4);
    EXPECT_NE(oomb_paged_attn_grad_seed(oomb_kv_cache_dk(kv, 0)), seeds[0]);
    // bf16 pools: 2/3 of the f32-gradient cache's bytes with bf16 K/V, 3/4 with f32 K/V (here)
    kp.grad_type = OOMB_TYPE_F32;
    oomb_kv_cache_t kv32 = oomb_kv_cache_init(be, kp);
    ASSERT_NE(kv32, nullptr);
    EXPECT_LT(oomb_kv_cache_nbytes(kv), oomb_kv_cache_nbytes(kv32));
    EXPECT_EQ(oomb_nbytes(oomb_kv_cache_dk(kv, 0)) * 2, oomb_nbytes(oomb_kv_cache_dk(kv32, 0)));
    oomb_kv_cache_free(kv32);
    oomb_kv_cache_free(kv);
    oomb_backend_free(be);
}

TEST(PagedGradBf16, Errors) {
    oomb_backend_t be = oomb_backend_cpu_init(1);
    oomb_kv_cache_params kp{};
    kp.n_layer = 1; kp.n_head_kv = 1; kp.head_dim = 8; kp.page_size = 4; kp.max_tokens = 16;
    kp.type = OOMB_TYPE_F32; kp.with_grad = true; kp.grad_type = OOMB_TYPE_F16;
    EXPECT_OOMB_ERROR(oomb_kv_cache_init(be, kp), "gradient-page type must be f32 or bf16, got f16");
    kp.grad_type = OOMB_TYPE_BF16;
    oomb_kv_cache_t kv = oomb_kv_cache_init(be, kp);
    ASSERT_NE(kv, nullptr);
    oomb_context * ctx = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, 8, 1, 2);
    oomb_tensor * dout = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, 8, 1, 2);
    oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, 2);
    oomb_tensor * dv32 = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, 8, 1, 4, 4);
    EXPECT_OOMB_ERROR(oomb_paged_attn_back(ctx, q, oomb_kv_cache_k(kv, 0), oomb_kv_cache_v(kv, 0), oomb_kv_cache_dk(kv, 0), dv32,
                                           oomb_kv_cache_page_table(kv), pos, dout, nullptr, 1.0f),
                      "both f32 or both bf16");
    EXPECT_OOMB_ERROR(oomb_paged_attn_set_grad_seed(nullptr, 1), "grad_pages must not be NULL");
    EXPECT_OOMB_ERROR(oomb_paged_attn_set_grad_seed(oomb_add(ctx, q, q), 1), "not a gradient-page tensor");
    oomb_free(ctx);
    oomb_kv_cache_free(kv);
    oomb_backend_free(be);
}
