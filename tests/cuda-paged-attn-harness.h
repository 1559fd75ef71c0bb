// The harness shared by the CUDA paged-attention tests (test-cuda-paged-attn.cpp: the kernels against
// the CPU reference; test-cuda-paged-attn-numerics.cpp: merges, bf16 gradient pages, NaN inputs):
// the GPU check, the launchers on a CUDA backend's context, device memory, the test Case and its
// expected kernel family, error measures. Included by one test file per executable; its functions
// are inline so a file that uses a part of it builds without unused-function warnings.
#pragma once


#include <gtest/gtest.h>

#include "oomb.h"
#include "oomb-backend.h"
#include "test-common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#ifdef OOMB_USE_CUDA
#include <cuda_runtime.h>
#include "cuda/paged-attn.cuh"
#include "../src/oomb/paged-attn-sched.h"
// Resolved when the CUDA backend is linked in; otherwise the test asks the runtime itself.
#pragma weak oomb_cuda_available
#endif

namespace {

inline bool have_gpu() {
#ifdef OOMB_USE_CUDA
    if (&oomb_cuda_available != nullptr) return oomb_cuda_available();
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
}

#define SKIP_WITHOUT_GPU() \
    do { if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU"; } while (0)

#ifdef OOMB_USE_CUDA

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// The kernel launchers run on a CUDA backend's context (its stream and scratch); the tests' own
// cudaMemcpy / cudaMemset calls are on the legacy stream, so every launch is fenced by a device
// synchronize on both sides.
inline oomb_cuda_ctx & cuda_ctx() {
    static oomb_backend_t b = oomb_backend_cuda_init(0);
    return oomb_cuda_ctx_of(b);
}
// The most key shares any forward launched since the last reset ran with (Bf16PoolsKeySplit).
inline int g_fwd_split_max = 0;
inline void launch_fwd(oomb_tensor * dst) {
    cudaDeviceSynchronize();
    oomb_cuda_paged_attn(cuda_ctx(), dst);
    cudaDeviceSynchronize();
    g_fwd_split_max = std::max(g_fwd_split_max, oomb_cuda_paged_attn_last_fwd_split());
}
inline void launch_bwd(oomb_tensor * dst) {
    cudaDeviceSynchronize();
    oomb_cuda_paged_attn_back(cuda_ctx(), dst);
    cudaDeviceSynchronize();
}

inline oomb_backend_t cpu() {
    static oomb_backend_t b = oomb_backend_cpu_init(0);
    return b;
}

struct Case {
    int D, P, H, Hkv, T, hist;
    oomb_type type;
    int store;
    bool shuffle_pos; // chunk positions in a random order (rows not sorted by position)
    oomb_page_schedule_kind sched = OOMB_SCHEDULE_DENSE;  // RANGE / LISTS / LISTS_RANGE: built by run_case from hist
    int range_first = -1;  // RANGE, LISTS_RANGE: first page (-1: half the history's pages); last: past the chunk's last page
    int lists_mode = 0;    // LISTS: 0: tile 0 every history page, the others about a third; 1: sparse
                           // (every third tile empty, the others about a quarter, with gaps and pages
                           // shared between tiles); 2: every list empty (current region only)
    int range_last = -1;   // RANGE, LISTS_RANGE: last page (exclusive; -1: past the chunk's last page)
    bool poison_tail = false;  // the pools' slots past the last position and the spare pages hold NaN (no kernel may
                               // weigh them: 0 * NaN is NaN)
    float scale_mul = 1.0f;    // the attention scale is scale_mul / sqrt(D) (<= 0: the forward runs the mma.sync kernels)
};

inline std::string case_name(const Case & c) {
    char buf[200];
    snprintf(buf, sizeof(buf), "D%d_P%d_H%d_%d_T%d_hist%d_%s_store%d%s%s", c.D, c.P, c.H, c.Hkv, c.T, c.hist, oomb_type_name(c.type), c.store,
             c.shuffle_pos ? "_shuffled" : "", c.sched == OOMB_SCHEDULE_RANGE ? (c.range_first >= 0 ? "_range_from" : "_range")
                                               : c.sched == OOMB_SCHEDULE_LISTS ? "_lists"
                                               : c.sched == OOMB_SCHEDULE_LISTS_RANGE ? "_lists_range" : "");
    if (c.poison_tail) snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "_nan_tail");
    if (c.scale_mul != 1.0f) snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "_scale%gx", (double) c.scale_mul);
    if (oomb_schedule_has_lists(c.sched) && c.lists_mode) snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%d", c.lists_mode);
    if (c.range_first >= 0 || c.range_last >= 0)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "_win%d_%d", c.range_first, c.range_last);
    return buf;
}

// The kernel configuration for a scope (oomb_cuda_paged_attn_set_config), back to the defaults
// (the environment's) after it.
struct ConfigScope {
    explicit ConfigScope(const std::function<void(oomb_paged_attn_config &)> & f) {
        oomb_paged_attn_config c = oomb_paged_attn_config_from_env();
        f(c);
        oomb_cuda_paged_attn_set_config(&c);
    }
    ~ConfigScope() { oomb_cuda_paged_attn_set_config(nullptr); }
};

// The family the dispatcher must pick for a case: the fast kernels take bf16 pools of head dim 64
// or 128 (a page size multiple of the forward's key tile: 64) under every schedule; LISTS_RANGE
// (the offload's sparse blocks) only with config.lists_range_fast.
inline std::string expected_family(const Case & c, int backward) {
    const oomb_paged_attn_config & cf = oomb_cuda_paged_attn_config();
    const bool fast = !cf.generic && c.type == OOMB_TYPE_BF16 && (c.D == 64 || c.D == 128) && c.P % 64 == 0 &&
                      (c.sched != OOMB_SCHEDULE_LISTS_RANGE || cf.lists_range_fast);
    if (!fast) return "generic";
    // the wgmma forwards take the row max over the raw products: a positive scale only
    if (!backward && !(c.scale_mul > 0.0f)) return "mma";
    return oomb_cuda_paged_attn_uses_wgmma(c.D, c.P, backward) ? "wgmma" : "mma";
}

// The element with the largest |a - b| of a [T][H][D] (or [pages][P][H][D]) array, as "index
// (t h d) got vs want" for failure messages: a wrong mask or skipped key tile shows its row.
inline std::string worst(const std::vector<float> & a, const std::vector<float> & b, int D, int H) {
    size_t wi = 0;
    double we = -1;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        const double e = std::isfinite(a[i]) ? std::fabs((double) a[i] - b[i]) : INFINITY;
        if (e > we) { we = e; wi = i; }
    }
    char buf[200];
    snprintf(buf, sizeof(buf), "largest error %.3g at element %zu (row %zu, head %zu, dim %zu): got %.6g, want %.6g", we, wi,
             wi / ((size_t) D * H), wi / D % H, wi % D, wi < a.size() ? a[wi] : 0.0f, wi < b.size() ? b[wi] : 0.0f);
    return buf;
}

// ||a - b|| / ||b||; infinity when a holds a NaN / inf. A reference that is zero up to rounding
// (RMS under 1e-5: a query attending only its own key has dq = dK = 0 exactly, the CPU gets
// rounding noise) is compared in absolute terms: the error's RMS over 1e-5, so noise passes and
// anything of a gradient's size fails.
inline double rel_err(const std::vector<float> & a, const std::vector<float> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        const double d = (double) a[i] - b[i];
        num += d * d;
        den += (double) b[i] * b[i];
    }
    const double n = (double) std::max<size_t>(a.size(), 1);
    if (den / n < 1e-10) return std::sqrt(num / n) / 1e-5;
    return std::sqrt(num / den);
}

inline std::vector<float> host_f32(const oomb_tensor * t) {
    std::vector<float> v(oomb_nelements(t));
    memcpy(v.data(), t->data, v.size() * sizeof(float));
    return v;
}
inline std::vector<float> dev_f32(const oomb_tensor * t) {
    std::vector<float> v(oomb_nelements(t));
    cudaMemcpy(v.data(), t->data, v.size() * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}
inline std::vector<float> host_pool_f32(const oomb_tensor * t) {
    std::vector<float> v(oomb_nelements(t));
    for (size_t i = 0; i < v.size(); i++) {
        if (t->type == OOMB_TYPE_F32) v[i] = ((const float *) t->data)[i];
        else if (t->type == OOMB_TYPE_F16) v[i] = oomb_fp16_to_fp32(((const uint16_t *) t->data)[i]);
        else v[i] = oomb_bf16_to_fp32(((const uint16_t *) t->data)[i]);
    }
    return v;
}
inline std::vector<float> dev_pool_f32(const oomb_tensor * t) {
    std::vector<unsigned char> raw(oomb_nbytes(t));
    cudaMemcpy(raw.data(), t->data, raw.size(), cudaMemcpyDeviceToHost);
    std::vector<float> v(oomb_nelements(t));
    for (size_t i = 0; i < v.size(); i++) {
        if (t->type == OOMB_TYPE_F32) v[i] = ((const float *) raw.data())[i];
        else if (t->type == OOMB_TYPE_F16) v[i] = oomb_fp16_to_fp32(((const uint16_t *) raw.data())[i]);
        else v[i] = oomb_bf16_to_fp32(((const uint16_t *) raw.data())[i]);
    }
    return v;
}

struct DevMem {
    std::vector<void *> ptrs;
    bool failed = false;
    ~DevMem() { for (void * p : ptrs) cudaFree(p); }
    // gives t (a no_alloc tensor) device memory holding a copy of src's bytes (or poison)
    void place(oomb_tensor * t, const oomb_tensor * src) {
        void * p = nullptr;
        const size_t n = oomb_nbytes(t);
        if (cudaMalloc(&p, n) != cudaSuccess) { ADD_FAILURE() << "cudaMalloc " << n; failed = true; return; }
        ptrs.push_back(p);
        t->data = p;
        if (src) cudaMemcpy(p, src->data, n, cudaMemcpyHostToDevice);
        else cudaMemset(p, 0xff, n); // NaN poison
    }
    // a device tensor in the no_alloc context dc shaped and filled like the host tensor h
    oomb_tensor * copy_of(oomb_context * dc, const oomb_tensor * h) {
        oomb_tensor * t = oomb_dup_tensor(dc, h);
        place(t, h);
        return t;
    }
};

// Random page lists of the query tiles of a chunk whose first page is c0 (history pages 0 .. c0-1), in
// host tensors of hc with their inverse (oomb_schedule_invert). mode (Case::lists_mode) 0: tile 0
// every history page, the others about a third; 1: sparse (every third tile empty, the others about a
// quarter, with gaps and shared pages); 2: every list empty.
inline void random_lists(oomb_context * hc, std::mt19937 & rng, int c0, int n_qt, int mode, oomb_tensor *& s_off, oomb_tensor *& s_pg,
                  oomb_tensor *& s_io, oomb_tensor *& s_iq) {
    std::vector<int32_t> off{0}, pg;
    for (int j = 0; j < n_qt; j++) {
        for (int h = 0; h < c0; h++) {
            if (mode == 2) break;
            if (mode == 1 ? (j % 3 != 1 && (h % 5 == 2 || rng() % 4 == 0)) : (j == 0 || rng() % 3 == 0)) pg.push_back(h);
        }
        off.push_back((int32_t) pg.size());
    }
    const int64_t nnz = std::max<int64_t>((int64_t) pg.size(), 1);
    s_off = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, (int64_t) off.size());
    s_pg = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, nnz);
    s_io = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, c0 + 1);
    s_iq = oomb_new_tensor_1d(hc, OOMB_TYPE_I32, nnz);
    ((int32_t *) s_pg->data)[0] = ((int32_t *) s_iq->data)[0] = 0;
    memcpy(s_off->data, off.data(), off.size() * 4);
    if (!pg.empty()) memcpy(s_pg->data, pg.data(), pg.size() * 4);
    oomb_schedule_invert(off.data(), n_qt, pg.data(), c0, (int32_t *) s_io->data, (int32_t *) s_iq->data);
}

#endif // OOMB_USE_CUDA

} // namespace
