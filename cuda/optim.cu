// AdamW / SGD (see optim.cuh). Same formulas as ops-cpu.cpp, in f32.

#include "optim.cuh"
#include "../src/sround.h"

using oomb::shape_str;

namespace {

const int k_threads = 256;

__device__ __forceinline__ float hp_at(const oomb_tv & hp, int i) {
    return *(const float *) (hp.d + oomb_flat_off<uint32_t>(hp, (uint32_t) i));
}

__device__ __forceinline__ float st_load(const float * p, int64_t i) { return p[i]; }
__device__ __forceinline__ float st_load(const uint16_t * p, int64_t i) { return __uint_as_float((uint32_t) p[i] << 16); }
__device__ __forceinline__ void st_store(float * p, int64_t i, float x, uint32_t) { p[i] = x; }
// bf16 moments: stochastic rounding, bit-identical to the CPU backend's (src/sround.h)
__device__ __forceinline__ void st_store(uint16_t * p, int64_t i, float x, uint32_t salt) {
    p[i] = oomb::sr_bf16_bits(__float_as_uint(x), (uint32_t) i, salt);
}

template <typename P, typename S>
__global__ void k_adamw(P * w, const float * grad, S * m, S * v, oomb_tv hp, int64_t n) {
    const float lr = hp_at(hp, 0), b1 = hp_at(hp, 1), b2 = hp_at(hp, 2), eps = hp_at(hp, 3);
    const float wd = hp_at(hp, 4), gs = hp_at(hp, 5), bc1 = hp_at(hp, 6), bc2 = hp_at(hp, 7);
    const uint32_t salt = sizeof(S) == 2 ? oomb::sr_salt(hp_at(hp, 8)) : 0u;  // bf16 moments: hp[8] = step
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const float g = grad[i] * gs;
        const float mi = b1 * st_load(m, i) + (1.0f - b1) * g;
        const float vi = b2 * st_load(v, i) + (1.0f - b2) * g * g;
        st_store(m, i, mi, salt);
        st_store(v, i, vi, salt ^ 0x5bd1e995u);
        const float x = oomb_to_f(w[i]);
        w[i] = oomb_from_f<P>(x - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * x));
    }
}

template <typename P>
__global__ void k_sgd(P * w, const float * grad, oomb_tv hp, int64_t n) {
    const float lr = hp_at(hp, 0), wd = hp_at(hp, 1), gs = hp_at(hp, 2);
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const float x = oomb_to_f(w[i]);
        w[i] = oomb_from_f<P>(x - lr * (grad[i] * gs + wd * x));
    }
}

} // namespace

void oomb_cuda_adamw_step(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * m,
                          const oomb_tensor * v, const oomb_tensor * hp) {
    // operands: check_op_operands (src/op-checks.cpp)
    const bool sbf = m->type == OOMB_TYPE_BF16;
    const int64_t n = oomb_nelements(p);
    if (n == 0) return;
    // at most 4096 blocks: each thread reads the 8-9 hyper-parameters once (index arithmetic per
    // read), then updates many elements
    const unsigned grid = oomb_cuda_grid(n, k_threads, 4096);
    const oomb_tv tv = oomb_make_tv(hp);
    const float * g = (const float *) grad->data;
    if (p->type == OOMB_TYPE_BF16) {
        __nv_bfloat16 * w = (__nv_bfloat16 *) dst->data;
        if (sbf) k_adamw<<<grid, k_threads, 0, c.stream>>>(w, g, (uint16_t *) m->data, (uint16_t *) v->data, tv, n);
        else     k_adamw<<<grid, k_threads, 0, c.stream>>>(w, g, (float *) m->data, (float *) v->data, tv, n);
    } else {
        float * w = (float *) dst->data;
        if (sbf) k_adamw<<<grid, k_threads, 0, c.stream>>>(w, g, (uint16_t *) m->data, (uint16_t *) v->data, tv, n);
        else     k_adamw<<<grid, k_threads, 0, c.stream>>>(w, g, (float *) m->data, (float *) v->data, tv, n);
    }
    OOMB_CUDA_LAUNCHED(c, "adamw_step");
}

void oomb_cuda_sgd_step(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * hp) {
    // operands: check_op_operands (src/op-checks.cpp)
    const int64_t n = oomb_nelements(p);
    if (n == 0) return;
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    if (p->type == OOMB_TYPE_BF16) {
        k_sgd<__nv_bfloat16><<<grid, k_threads, 0, c.stream>>>((__nv_bfloat16 *) dst->data, (const float *) grad->data, oomb_make_tv(hp), n);
    } else {
        k_sgd<float><<<grid, k_threads, 0, c.stream>>>((float *) dst->data, (const float *) grad->data, oomb_make_tv(hp), n);
    }
    OOMB_CUDA_LAUNCHED(c, "sgd_step");
}
