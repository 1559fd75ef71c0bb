// bf16 KV-gradient pages on CUDA (cuda/paged-attn*: GradSR) against the CPU kernels on random data:
// the same backward (dense and a page range) into bf16 gradient pages holding random bf16 values,
// on the tensor-core kernels (bf16 pools, head dims 128 / 64, a chunk of 37 after 1000 positions:
// neither a multiple of the page nor of the key tile) and on the generic kernels (f32 pools, head
// dim 40). Checked: the CUDA bf16 pages' increments against the CPU's (the kernels' own tolerance,
// as for f32 pages), against CUDA's own f32-page increments within the rounding bound (one
// stochastic rounding per element and call: below one bf16 ulp of the page value), dk_cur / dv_cur
// equal to the pages, and the same bits from two runs with the same seed. Skips without a GPU.

#include <gtest/gtest.h>

#include "oomb.h"
#include "oomb-backend.h"
#include "test-common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#ifdef OOMB_USE_CUDA
#include <cuda_runtime.h>
#include "cuda/paged-attn.cuh"
#pragma weak oomb_cuda_available
#endif

namespace {

bool have_gpu() {
#ifdef OOMB_USE_CUDA
    if (&oomb_cuda_available != nullptr) return oomb_cuda_available();
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
}

#ifdef OOMB_USE_CUDA

struct Case {
    int D, P, H, Hkv, T, hist;
    oomb_type pool;
    bool range;  // RANGE schedule from the middle of the history (the fast kernels' shifted geometry)
};

std::vector<float> pool_f32(const oomb_tensor * t, bool device) {
    std::vector<unsigned char> raw(oomb_nbytes(t));
    if (device) cudaMemcpy(raw.data(), t->data, raw.size(), cudaMemcpyDeviceToHost);
    else memcpy(raw.data(), t->data, raw.size());
    std::vector<float> v((size_t) oomb_nelements(t));
    for (size_t i = 0; i < v.size(); i++)
        v[i] = t->type == OOMB_TYPE_F32 ? ((const float *) raw.data())[i] : oomb_bf16_to_fp32(((const uint16_t *) raw.data())[i]);
    return v;
}

double rel_err(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        num += ((double) a[i] - b[i]) * ((double) a[i] - b[i]);
        den += (double) b[i] * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

void run_case(const Case & c, uint32_t seed) {
    SCOPED_TRACE("D" + std::to_string(c.D) + " P" + std::to_string(c.P) + " " + oomb_type_name(c.pool) + (c.range ? " range" : ""));
    std::mt19937 rng(seed);
    const int n_pos = c.hist + c.T, n_need = (n_pos + c.P - 1) / c.P, n_pages = n_need + 2;
    const float scale = 1.0f / std::sqrt((float) c.D);
    oomb_context * hc = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.H, c.T);
    oomb_tensor * dout = oomb_new_tensor_3d(hc, OOMB_TYPE_F32, c.D, c.H, c.T);
    oomb_tensor * kp = oomb_new_tensor_4d(hc, c.pool, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * vp = oomb_new_tensor_4d(hc, c.pool, c.D, c.Hkv, c.P, n_pages);
    oomb_tensor * dk[2], * dv[2];  // [0]: f32 gradient pages, [1]: bf16
    for (int b = 0; b < 2; b++) {
        dk[b] = oomb_new_tensor_4d(hc, b ? OOMB_TYPE_BF16 : OOMB_TYPE_F32, c.D, c.Hkv, c.P, n_pages);
        dv[b] = oomb_new_tensor_4d(hc, b ? OOMB_TYPE_BF16 : OOMB_TYPE_F32, c.D, c.Hkv, c.P, n_pages);
    }
    oomb_tensor * pt = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, n_need);
    oomb_tensor * pos = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, c.T);
    oombtest::fill_uniform(q, rng, -2.0f, 2.0f);
    oombtest::fill_uniform(dout, rng, -1.0f, 1.0f);
    oombtest::fill_uniform(kp, rng);
    oombtest::fill_uniform(vp, rng);
    oombtest::fill_uniform(dk[1], rng, -0.5f, 0.5f);
    oombtest::fill_uniform(dv[1], rng, -0.5f, 0.5f);
    // the f32 pages start from the same (bf16) values
    const std::vector<float> dk0 = pool_f32(dk[1], false), dv0 = pool_f32(dv[1], false);
    memcpy(dk[0]->data, dk0.data(), oomb_nbytes(dk[0]));
    memcpy(dv[0]->data, dv0.data(), oomb_nbytes(dv[0]));
    std::vector<int> perm(n_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < n_need; i++) ((int32_t *) pt->data)[i] = perm[i];
    for (int t = 0; t < c.T; t++) ((int32_t *) pos->data)[t] = c.hist + t;
    for (int b = 0; b < 2; b++) {
        oomb_paged_attn_set_grad_seed(dk[b], 11);
        oomb_paged_attn_set_grad_seed(dv[b], 12);
    }
    const oomb_page_schedule sched = c.range ? oomb_schedule_range(c.hist / c.P / 2, n_need) : oomb_schedule_dense();
    auto back_op = [&](oomb_context * x, oomb_tensor * q_, oomb_tensor * kp_, oomb_tensor * vp_, oomb_tensor * dkp_, oomb_tensor * dvp_,
                       oomb_tensor * pt_, oomb_tensor * pos_, oomb_tensor * dout_) {
        oomb_paged_attn_args a{};
        a.q = q_; a.k_pages = kp_; a.v_pages = vp_; a.dk_pages = dkp_; a.dv_pages = dvp_; a.page_table = pt_; a.pos = pos_;
        a.dout = dout_; a.schedule = sched; a.scale = scale;
        return oomb_paged_attn_back_ext(x, &a);
    };
    // CPU, bf16 pages
    oomb_tensor * cb = back_op(hc, q, kp, vp, dk[1], dv[1], pt, pos, dout);
    oomb_backend_t cpu = oomb_backend_cpu_init(0);
    oomb_cgraph * g = oomb_new_graph(hc);
    oomb_build_forward_expand(g, cb);
    oomb_backend_graph_compute(cpu, g);
    const std::vector<float> c_dk = pool_f32(dk[1], false), c_dv = pool_f32(dv[1], false);

    // CUDA: f32 pages, then bf16 pages twice (from the same starting values)
    static oomb_backend_t cuda = oomb_backend_cuda_init(0);
    oomb_context * dc = oomb_init({0, true});
    std::vector<void *> mem;
    auto dev = [&](const oomb_tensor * h, const void * init) {
        oomb_tensor * t = oomb_dup_tensor(dc, h);
        void * p = nullptr;
        if (cudaMalloc(&p, oomb_nbytes(t)) != cudaSuccess) { ADD_FAILURE() << "cudaMalloc"; return t; }
        mem.push_back(p);
        t->data = p;
        if (init) cudaMemcpy(p, init, oomb_nbytes(t), cudaMemcpyHostToDevice);
        else cudaMemset(p, 0xff, oomb_nbytes(t));
        return t;
    };
    std::vector<uint16_t> dk0b(dk0.size()), dv0b(dv0.size());
    for (size_t i = 0; i < dk0.size(); i++) { dk0b[i] = oomb_fp32_to_bf16(dk0[i]); dv0b[i] = oomb_fp32_to_bf16(dv0[i]); }
    oomb_tensor * d_q = dev(q, q->data), * d_do = dev(dout, dout->data), * d_kp = dev(kp, kp->data), * d_vp = dev(vp, vp->data);
    oomb_tensor * d_pt = dev(pt, pt->data), * d_pos = dev(pos, pos->data);
    std::vector<float> g_dk[3], g_dv[3], g_cur[3];
    for (int run = 0; run < 3; run++) {
        const int b = run > 0;
        oomb_tensor * d_dk = dev(dk[b], b ? (const void *) dk0b.data() : dk0.data());
        oomb_tensor * d_dv = dev(dv[b], b ? (const void *) dv0b.data() : dv0.data());
        oomb_paged_attn_set_grad_seed(d_dk, 11);
        oomb_paged_attn_set_grad_seed(d_dv, 12);
        oomb_tensor * d_back = back_op(dc, d_q, d_kp, d_vp, d_dk, d_dv, d_pt, d_pos, d_do);
        oomb_tensor * d_res = dev(d_back, nullptr);
        d_back->data = d_res->data;
        cudaDeviceSynchronize();
        oomb_cuda_paged_attn_back(oomb_cuda_ctx_of(cuda), d_back);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        g_dk[run] = pool_f32(d_dk, true);
        g_dv[run] = pool_f32(d_dv, true);
        g_cur[run] = pool_f32(d_back, true);
        if (run == 1) {
            const bool fast = c.pool == OOMB_TYPE_BF16 && (c.D == 64 || c.D == 128);
            EXPECT_EQ(std::string(oomb_cuda_paged_attn_last_family(1)) == "generic", !fast) << oomb_cuda_paged_attn_last_family(1);
        }
    }
    auto inc = [](std::vector<float> v, const std::vector<float> & v0) { for (size_t i = 0; i < v.size(); i++) v[i] -= v0[i]; return v; };
    const double tol = c.pool == OOMB_TYPE_F32 ? 1e-3 : 3e-2;
    EXPECT_LT(rel_err(inc(g_dk[1], dk0), inc(c_dk, dk0)), tol + 1e-2) << "CUDA vs CPU, bf16 dK pages (increments)";
    EXPECT_LT(rel_err(inc(g_dv[1], dv0), inc(c_dv, dv0)), tol + 1e-2) << "CUDA vs CPU, bf16 dV pages (increments)";
    // one rounding per element: |bf16 - f32| <= one bf16 ulp of the value (2^-7 relative), plus the
    // f32 sums' own difference (the f32 run may split key tiles over blocks: another order)
    auto bound = [&](float f, float f0) { return std::ldexp(1.0, -7) * std::fabs(f) * 1.01 + 1e-4 * std::fabs(f - f0) + 1e-7; };
    for (size_t i = 0; i < g_dk[0].size(); i++) {
        ASSERT_LE(std::fabs(g_dk[1][i] - g_dk[0][i]), bound(g_dk[0][i], dk0[i])) << "dK element " << i;
        ASSERT_LE(std::fabs(g_dv[1][i] - g_dv[0][i]), bound(g_dv[0][i], dv0[i])) << "dV element " << i;
    }
    EXPECT_TRUE(g_dk[1] == g_dk[2] && g_dv[1] == g_dv[2] && g_cur[1] == g_cur[2]) << "two runs with the same seed differ";
    // dk_cur / dv_cur (after dq in the result) are the pages at the chunk's positions
    const int64_t nq = (int64_t) c.D * c.H * c.T, nkv = (int64_t) c.D * c.Hkv * c.T;
    for (int t = 0; t < c.T; t++)
        for (int h = 0; h < c.Hkv; h++)
            for (int d = 0; d < c.D; d++) {
                const int p = c.hist + t;
                const size_t e = (((size_t) perm[p / c.P] * c.P + p % c.P) * c.Hkv + h) * c.D + d;
                const size_t r = ((size_t) t * c.Hkv + h) * c.D + d;
                ASSERT_EQ(g_cur[1][(size_t) nq + r], g_dk[1][e]);
                ASSERT_EQ(g_cur[1][(size_t) (nq + nkv) + r], g_dv[1][e]);
            }
    for (void * p : mem) cudaFree(p);
    oomb_free(dc);
    oomb_free(hc);
    oomb_backend_free(cpu);
}

#endif

} // namespace

TEST(CudaPagedGradBf16, MatchesCpu) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
#ifdef OOMB_USE_CUDA
    const Case cases[] = {
        {128, 64, 14, 2, 37, 1000, OOMB_TYPE_BF16, false},
        {128, 128, 28, 4, 37, 1000, OOMB_TYPE_BF16, true},
        {64, 64, 14, 2, 37, 1000, OOMB_TYPE_BF16, false},
        {40, 24, 6, 2, 37, 100, OOMB_TYPE_F32, false},
    };
    uint32_t seed = 77;
    for (const Case & c : cases) run_case(c, seed++);
#endif
}
