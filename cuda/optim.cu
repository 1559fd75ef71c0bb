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
// a moment's stored value; bf16 moments: stochastic rounding hashed on the element index i, bit-identical
// to the CPU backend's (src/sround.h)
__device__ __forceinline__ void st_put(float & o, float x, uint32_t, uint32_t) { o = x; }
__device__ __forceinline__ void st_put(uint16_t & o, float x, uint32_t i, uint32_t salt) { o = oomb::sr_bf16_bits(__float_as_uint(x), i, salt); }

// VEC4: four elements per thread and step with one vector access per operand (n % 4 == 0 and every
// pointer aligned to its 4-element vector: adamw_vec4); the same arithmetic per element either way, so the
// results are bit-identical (and to the CPU backend's).
template <typename T> struct vec4_of;
template <> struct vec4_of<float> { using type = float4; };
template <> struct vec4_of<uint16_t> { using type = ushort4; };
template <> struct vec4_of<__nv_bfloat16> { using type = ushort4; };

template <typename P, typename S, bool VEC4>
__global__ void k_adamw(P * w, const float * grad, S * m, S * v, oomb_tv hp, int64_t n) {
    const float lr = hp_at(hp, 0), b1 = hp_at(hp, 1), b2 = hp_at(hp, 2), eps = hp_at(hp, 3);
    const float wd = hp_at(hp, 4), gs = hp_at(hp, 5), bc1 = hp_at(hp, 6), bc2 = hp_at(hp, 7);
    const uint32_t salt = sizeof(S) == 2 ? oomb::sr_salt(hp_at(hp, 8)) : 0u;  // bf16 moments: hp[8] = step
    // one element: its gradient, moments in and out (stored at index i), weight in and out
    auto one = [&](int64_t i, float gi, float m0, float v0, float x, S & mo, S & vo) -> float {
        const float g = gi * gs;
        const float mi = b1 * m0 + (1.0f - b1) * g;
        const float vi = b2 * v0 + (1.0f - b2) * g * g;
        st_put(mo, mi, (uint32_t) i, salt);
        st_put(vo, vi, (uint32_t) i, salt ^ 0x5bd1e995u);
        return x - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * x);
    };
    if constexpr (VEC4) {
        using SV = typename vec4_of<S>::type;
        using PV = typename vec4_of<P>::type;
        const int64_t n4 = n / 4;
        for (int64_t j = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; j < n4; j += (int64_t) gridDim.x * blockDim.x) {
            const float4 g4 = ((const float4 *) grad)[j];
            SV m4 = ((SV *) m)[j], v4 = ((SV *) v)[j];
            PV w4 = ((PV *) w)[j];
            S * mp = (S *) &m4, * vp = (S *) &v4;
            P * wp = (P *) &w4;
            const float gg[4] = {g4.x, g4.y, g4.z, g4.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t i = 4 * j + e;
                wp[e] = oomb_from_f<P>(one(i, gg[e], st_load(mp, e), st_load(vp, e), oomb_to_f(wp[e]), mp[e], vp[e]));
            }
            ((SV *) m)[j] = m4;
            ((SV *) v)[j] = v4;
            ((PV *) w)[j] = w4;
        }
    } else {
        for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
            S mo, vo;
            w[i] = oomb_from_f<P>(one(i, grad[i], st_load(m, i), st_load(v, i), oomb_to_f(w[i]), mo, vo));
            m[i] = mo;
            v[i] = vo;
        }
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
    const oomb_tv tv = oomb_make_tv(hp);
    const float * g = (const float *) grad->data;
    // four elements per thread where every operand is aligned to its 4-element vector
    auto al = [](const void * q, size_t bytes) { return (uintptr_t) q % bytes == 0; };
    const size_t ws = oomb_type_size(p->type), ss = sbf ? 2 : 4;
    static const bool vec_on = getenv("OOMB_CUDA_ADAMW_VEC") == nullptr || atoi(getenv("OOMB_CUDA_ADAMW_VEC")) != 0;  // 0: scalar (A/B)
    const bool vec = vec_on && n % 4 == 0 && al(dst->data, 4 * ws) && al(g, 16) && al(m->data, 4 * ss) && al(v->data, 4 * ss);
    const unsigned grid = oomb_cuda_grid(vec ? n / 4 : n, k_threads, 4096);
    auto launch = [&](auto * w) {
        using P = std::remove_pointer_t<decltype(w)>;
        if (sbf) {
            if (vec) k_adamw<P, uint16_t, true><<<grid, k_threads, 0, c.stream>>>(w, g, (uint16_t *) m->data, (uint16_t *) v->data, tv, n);
            else     k_adamw<P, uint16_t, false><<<grid, k_threads, 0, c.stream>>>(w, g, (uint16_t *) m->data, (uint16_t *) v->data, tv, n);
        } else {
            if (vec) k_adamw<P, float, true><<<grid, k_threads, 0, c.stream>>>(w, g, (float *) m->data, (float *) v->data, tv, n);
            else     k_adamw<P, float, false><<<grid, k_threads, 0, c.stream>>>(w, g, (float *) m->data, (float *) v->data, tv, n);
        }
    };
    if (p->type == OOMB_TYPE_BF16) launch((__nv_bfloat16 *) dst->data);
    else launch((float *) dst->data);
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
