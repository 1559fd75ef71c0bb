// Element-wise, broadcasting and copy kernels (see elementwise.cuh).

#include "elementwise.cuh"
#include "dequant.cuh"

#include <algorithm>

#include <type_traits>

using oomb::shape_str;

namespace {

const int k_threads = 256;

// ---------------------------------------------------------------------------------------------
// Copies with conversion
// ---------------------------------------------------------------------------------------------

template <typename S, typename D> __device__ __forceinline__ D cvt(S x) {
    if constexpr (std::is_same<S, D>::value) return x;
    else return oomb_from_f<D>(oomb_to_f(x));
}

// CONTIG: both sides contiguous (flat offsets).
template <typename S, typename D, typename I, bool CONTIG>
__global__ void k_copy(oomb_tv dst, oomb_tv src, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        if constexpr (CONTIG) {
            ((D *) dst.d)[k] = cvt<S, D>(((const S *) src.d)[k]);
        } else {
            const S x = *(const S *) (src.d + oomb_flat_off<I>(src, (I) k));
            *(D *) (dst.d + oomb_flat_off<I>(dst, (I) k)) = cvt<S, D>(x);
        }
    }
}

// f32 -> bf16, contiguous, 4 elements at a time (n % 4 == 0, src 16-byte and dst 8-byte aligned)
__global__ void k_f32_to_bf16_4(uint2 * dst, const float4 * src, int64_t n4) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n4; k += (int64_t) gridDim.x * blockDim.x) {
        const float4 x = src[k];
        const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
        uint2 o;
        o.x = *(const uint32_t *) &lo;
        o.y = *(const uint32_t *) &hi;
        dst[k] = o;
    }
}

template <typename S, typename D>
void launch_copy(oomb_cuda_ctx & c, const oomb_tensor * src, const oomb_tensor * dst, int64_t n) {
    const oomb_tv s = oomb_make_tv(src), d = oomb_make_tv(dst);
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    if constexpr (std::is_same<S, float>::value && std::is_same<D, __nv_bfloat16>::value) {
        if (oomb_is_contiguous(src) && oomb_is_contiguous(dst) && n % 4 == 0 && (uintptr_t) src->data % 16 == 0 &&
            (uintptr_t) dst->data % 8 == 0) {
            k_f32_to_bf16_4<<<oomb_cuda_grid(n / 4, k_threads), k_threads, 0, c.stream>>>((uint2 *) dst->data, (const float4 *) src->data, n / 4);
            OOMB_CUDA_LAUNCHED(c, "copy f32 -> bf16");
            return;
        }
    }
    if (oomb_is_contiguous(src) && oomb_is_contiguous(dst)) {
        k_copy<S, D, uint64_t, true><<<grid, k_threads, 0, c.stream>>>(d, s, n);
    } else if (oomb_fits_u32(src)) {
        k_copy<S, D, uint32_t, false><<<grid, k_threads, 0, c.stream>>>(d, s, n);
    } else {
        k_copy<S, D, uint64_t, false><<<grid, k_threads, 0, c.stream>>>(d, s, n);
    }
    OOMB_CUDA_LAUNCHED(c, "copy");
}



// ---------------------------------------------------------------------------------------------
// Element-wise
// ---------------------------------------------------------------------------------------------

enum { OP_ADD, OP_SUB, OP_MUL, OP_SILU_BACK, OP_SWIGLU, OP_SCALE, OP_SILU };

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

template <int OP> __device__ __forceinline__ float bop(float x, float y) {
    if constexpr (OP == OP_ADD) return x + y;
    else if constexpr (OP == OP_SUB) return x - y;
    else if constexpr (OP == OP_MUL) return x * y;
    else if constexpr (OP == OP_SILU_BACK) {
        const float s = sigmoid_f(x);
        return y * s * (1.0f + x * (1.0f - s));
    } else { // swiglu: silu(gate) * up
        return x / (1.0f + expf(-x)) * y;
    }
}

// MODE 0: any strides (b broadcast); 1: a, b, dst contiguous, same shape;
// 2: a and dst contiguous, b one contiguous row broadcast over dims 1..3 (b index = (k % ne0) % bne0).
// D: the result type (f32, or bf16 for oomb_mul_ext / oomb_swiglu_ext).
template <int OP, typename I, int MODE, typename D>
__global__ void k_binary(oomb_tv dst, oomb_tv a, oomb_tv b, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        if constexpr (MODE == 1) {
            ((D *) dst.d)[k] = oomb_from_f<D>(bop<OP>(((const float *) a.d)[k], ((const float *) b.d)[k]));
        } else if constexpr (MODE == 2) {
            const I i0 = (I) k % (I) dst.ne[0];
            ((D *) dst.d)[k] = oomb_from_f<D>(bop<OP>(((const float *) a.d)[k], ((const float *) b.d)[i0 % (I) b.ne[0]]));
        } else {
            I i0, i1, i2, i3;
            oomb_unravel<I>((I) k, dst.ne, i0, i1, i2, i3);
            const float x = *(const float *) (a.d + oomb_off(a, i0, i1, i2, i3));
            const float y = *(const float *) (b.d + oomb_off(b, i0 % (I) b.ne[0], i1 % (I) b.ne[1], i2 % (I) b.ne[2], i3 % (I) b.ne[3]));
            *(D *) (dst.d + oomb_off(dst, i0, i1, i2, i3)) = oomb_from_f<D>(bop<OP>(x, y));
        }
    }
}

__device__ __forceinline__ void store4(float4 * p, float4 v) { *p = v; }
__device__ __forceinline__ void store4(uint2 * p, float4 v) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 o;
    o.x = *(const uint32_t *) &lo;
    o.y = *(const uint32_t *) &hi;
    *p = o;
}

// MODE 1 / 2 four elements at a time (n, ne0 and b's ne0 multiples of 4, a / b 16-byte and dst
// 4-element aligned): same results as the scalar kernel, fewer index operations and wider accesses.
// V: float4 (f32 result) or uint2 (four bf16).
template <int OP, int MODE, typename I, typename V>
__global__ void k_binary4(V * dst, const float4 * a, const float4 * b, int64_t n4, uint32_t ne0_4, uint32_t bne0_4) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n4; k += (int64_t) gridDim.x * blockDim.x) {
        const float4 x = a[k];
        float4 y;
        if constexpr (MODE == 1) y = b[k];
        else y = b[((uint32_t) ((I) k % (I) ne0_4)) % bne0_4];
        store4(dst + k, make_float4(bop<OP>(x.x, y.x), bop<OP>(x.y, y.y), bop<OP>(x.z, y.z), bop<OP>(x.w, y.w)));
    }
}

// swiglu and swiglu_back with bf16 gate and up (oomb_mul_mat_ext results): the same formulas as
// bop<OP_SWIGLU> and k_swiglu_back on the values widened to f32. *4: contiguous operands, n % 4 ==
// 0, gate / up 8-byte and dy 16-byte aligned, four elements per iteration; the others any strides.
__device__ __forceinline__ float4 bf16x4_to_f4(uint2 v) {
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}
__device__ __forceinline__ float bf16_at(const char * p) { return __uint_as_float((uint32_t) *(const uint16_t *) p << 16); }

template <typename V>
__global__ void k_swiglu_bfin4(V * dst, const uint2 * g, const uint2 * u, int64_t n4) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n4; k += (int64_t) gridDim.x * blockDim.x) {
        const float4 x = bf16x4_to_f4(g[k]), y = bf16x4_to_f4(u[k]);
        store4(dst + k, make_float4(bop<OP_SWIGLU>(x.x, y.x), bop<OP_SWIGLU>(x.y, y.y), bop<OP_SWIGLU>(x.z, y.z), bop<OP_SWIGLU>(x.w, y.w)));
    }
}
template <typename I, typename D>
__global__ void k_swiglu_bfin(oomb_tv dst, oomb_tv g, oomb_tv u, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        I i0, i1, i2, i3;
        oomb_unravel<I>((I) k, dst.ne, i0, i1, i2, i3);
        const float x = bf16_at(g.d + oomb_off(g, i0, i1, i2, i3)), y = bf16_at(u.d + oomb_off(u, i0, i1, i2, i3));
        *(D *) (dst.d + oomb_off(dst, i0, i1, i2, i3)) = oomb_from_f<D>(bop<OP_SWIGLU>(x, y));
    }
}
template <typename V>
__global__ void k_swiglu_back_bfin4(V * dst, const uint2 * g, const uint2 * u, const float4 * dy, int64_t n4) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n4; k += (int64_t) gridDim.x * blockDim.x) {
        const float4 gv = bf16x4_to_f4(g[k]), uv = bf16x4_to_f4(u[k]), yv = dy[k];
        float dg[4], du[4];
        const float gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w}, ys[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float s = sigmoid_f(gs[j]);
            dg[j] = ys[j] * us[j] * s * (1.0f + gs[j] * (1.0f - s));
            du[j] = ys[j] * gs[j] * s;
        }
        store4(dst + k, make_float4(dg[0], dg[1], dg[2], dg[3]));
        store4(dst + n4 + k, make_float4(du[0], du[1], du[2], du[3]));
    }
}
template <typename I, typename D>
__global__ void k_swiglu_back_bfin(D * dst, oomb_tv g, oomb_tv u, oomb_tv dy, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        I i0, i1, i2, i3;
        oomb_unravel<I>((I) k, g.ne, i0, i1, i2, i3);
        const float gv = bf16_at(g.d + oomb_off(g, i0, i1, i2, i3)), uv = bf16_at(u.d + oomb_off(u, i0, i1, i2, i3));
        const float yv = *(const float *) (dy.d + oomb_off(dy, i0, i1, i2, i3));
        const float s = sigmoid_f(gv);
        dst[k] = oomb_from_f<D>(yv * uv * s * (1.0f + gv * (1.0f - s)));
        dst[n + k] = oomb_from_f<D>(yv * gv * s);
    }
}

bool aligned16(const void * p) { return (uintptr_t) p % 16 == 0; }

template <int OP, typename D>
void launch_binary_t(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    using V = typename std::conditional<std::is_same<D, float>::value, float4, uint2>::type;
    const int64_t n = oomb_nelements(dst);
    if (n == 0) return;
    const oomb_tv d = oomb_make_tv(dst), ta = oomb_make_tv(a), tb = oomb_make_tv(b);
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    const bool contig = oomb_is_contiguous(dst) && oomb_is_contiguous(a) && oomb_is_contiguous(b);
    const bool row_b = b->ne[1] == 1 && b->ne[2] == 1 && b->ne[3] == 1;
    const bool al = (uintptr_t) dst->data % sizeof(V) == 0 && aligned16(a->data) && aligned16(b->data) && n % 4 == 0;
    V * dv = (V *) dst->data;
    const float4 * av = (const float4 *) a->data, * bv = (const float4 *) b->data;
    if (contig && al && oomb_are_same_shape(a, b)) {
        const unsigned g4 = oomb_cuda_grid(n / 4, k_threads);
        k_binary4<OP, 1, uint64_t, V><<<g4, k_threads, 0, c.stream>>>(dv, av, bv, n / 4, 1, 1);
    } else if (contig && al && row_b && dst->ne[0] % 4 == 0 && b->ne[0] % 4 == 0 && dst->ne[0] / 4 <= 0xFFFFFFFFll) {
        const unsigned g4 = oomb_cuda_grid(n / 4, k_threads);
        const uint32_t ne0_4 = (uint32_t) (dst->ne[0] / 4), bne0_4 = (uint32_t) (b->ne[0] / 4);
        if (n / 4 <= 0xFFFFFFFFll) k_binary4<OP, 2, uint32_t, V><<<g4, k_threads, 0, c.stream>>>(dv, av, bv, n / 4, ne0_4, bne0_4);
        else k_binary4<OP, 2, uint64_t, V><<<g4, k_threads, 0, c.stream>>>(dv, av, bv, n / 4, ne0_4, bne0_4);
    } else if (contig && oomb_are_same_shape(a, b)) {
        k_binary<OP, uint64_t, 1, D><<<grid, k_threads, 0, c.stream>>>(d, ta, tb, n);
    } else if (contig && row_b && oomb_fits_u32(dst)) {
        k_binary<OP, uint32_t, 2, D><<<grid, k_threads, 0, c.stream>>>(d, ta, tb, n);
    } else if (oomb_fits_u32(dst)) {
        k_binary<OP, uint32_t, 0, D><<<grid, k_threads, 0, c.stream>>>(d, ta, tb, n);
    } else {
        k_binary<OP, uint64_t, 0, D><<<grid, k_threads, 0, c.stream>>>(d, ta, tb, n);
    }
    OOMB_CUDA_LAUNCHED(c, oomb_op_name(dst->op));
}

template <typename D>
void launch_swiglu_bfin(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u) {
    using V = typename std::conditional<std::is_same<D, float>::value, float4, uint2>::type;
    const int64_t n = oomb_nelements(dst);
    if (n == 0) return;
    const bool contig = oomb_is_contiguous(dst) && oomb_is_contiguous(g) && oomb_is_contiguous(u);
    if (contig && n % 4 == 0 && (uintptr_t) dst->data % sizeof(V) == 0 && (uintptr_t) g->data % 8 == 0 && (uintptr_t) u->data % 8 == 0)
        k_swiglu_bfin4<V><<<oomb_cuda_grid(n / 4, k_threads), k_threads, 0, c.stream>>>((V *) dst->data, (const uint2 *) g->data,
                                                                                        (const uint2 *) u->data, n / 4);
    else if (oomb_fits_u32(dst))
        k_swiglu_bfin<uint32_t, D><<<oomb_cuda_grid(n, k_threads), k_threads, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(g), oomb_make_tv(u), n);
    else
        k_swiglu_bfin<uint64_t, D><<<oomb_cuda_grid(n, k_threads), k_threads, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(g), oomb_make_tv(u), n);
    OOMB_CUDA_LAUNCHED(c, "swiglu (bf16 gate, up)");
}

template <int OP>
void launch_binary(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    if constexpr (OP == OP_SWIGLU) {
        if (a->type == OOMB_TYPE_BF16) {  // gate and up both bf16 (check_op_operands)
            if (dst->type == OOMB_TYPE_BF16) launch_swiglu_bfin<__nv_bfloat16>(c, dst, a, b);
            else launch_swiglu_bfin<float>(c, dst, a, b);
            return;
        }
    }
    if constexpr (OP == OP_MUL || OP == OP_SWIGLU) {
        if (dst->type == OOMB_TYPE_BF16) {
            launch_binary_t<OP, __nv_bfloat16>(c, dst, a, b);
            return;
        }
    }
    if (dst->type != OOMB_TYPE_F32) oomb_error("%s: result %s must be f32", oomb_op_name(dst->op), shape_str(dst).c_str());
    launch_binary_t<OP, float>(c, dst, a, b);
}

// swiglu_back: dst = [dgate; dup] contiguous (2n elements), g / u / dy of one shape (any strides
// unless CONTIG).
template <typename I, bool CONTIG, typename D>
__global__ void k_swiglu_back(D * dst, oomb_tv g, oomb_tv u, oomb_tv dy, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        float gv, uv, yv;
        if constexpr (CONTIG) {
            gv = ((const float *) g.d)[k]; uv = ((const float *) u.d)[k]; yv = ((const float *) dy.d)[k];
        } else {
            I i0, i1, i2, i3;
            oomb_unravel<I>((I) k, g.ne, i0, i1, i2, i3);
            gv = *(const float *) (g.d + oomb_off(g, i0, i1, i2, i3));
            uv = *(const float *) (u.d + oomb_off(u, i0, i1, i2, i3));
            yv = *(const float *) (dy.d + oomb_off(dy, i0, i1, i2, i3));
        }
        const float s = sigmoid_f(gv);
        dst[k] = oomb_from_f<D>(yv * uv * s * (1.0f + gv * (1.0f - s)));
        dst[n + k] = oomb_from_f<D>(yv * gv * s);
    }
}

// contiguous operands, n % 4 == 0, 16-byte aligned
template <typename V>
__global__ void k_swiglu_back4(V * dst, const float4 * g, const float4 * u, const float4 * dy, int64_t n4) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n4; k += (int64_t) gridDim.x * blockDim.x) {
        const float4 gv = g[k], uv = u[k], yv = dy[k];
        float dg[4], du[4];
        const float gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w}, ys[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float s = sigmoid_f(gs[j]);
            dg[j] = ys[j] * us[j] * s * (1.0f + gs[j] * (1.0f - s));
            du[j] = ys[j] * gs[j] * s;
        }
        store4(dst + k, make_float4(dg[0], dg[1], dg[2], dg[3]));
        store4(dst + n4 + k, make_float4(du[0], du[1], du[2], du[3]));
    }
}

template <int OP, typename I, bool CONTIG>
__global__ void k_unary(oomb_tv dst, oomb_tv a, int64_t n, float s) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        float x;
        int64_t od;
        if constexpr (CONTIG) {
            x = ((const float *) a.d)[k];
            od = k * (int64_t) sizeof(float);
        } else {
            I i0, i1, i2, i3;
            oomb_unravel<I>((I) k, dst.ne, i0, i1, i2, i3);
            x = *(const float *) (a.d + oomb_off(a, i0, i1, i2, i3));
            od = oomb_off(dst, i0, i1, i2, i3);
        }
        float y;
        if constexpr (OP == OP_SCALE) y = x * s;
        else y = x / (1.0f + expf(-x));
        *(float *) (dst.d + od) = y;
    }
}

template <int OP>
void launch_unary(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, float s) {
    const int64_t n = oomb_nelements(dst);
    if (n == 0) return;
    const oomb_tv d = oomb_make_tv(dst), ta = oomb_make_tv(a);
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    if (oomb_is_contiguous(dst) && oomb_is_contiguous(a)) {
        k_unary<OP, uint64_t, true><<<grid, k_threads, 0, c.stream>>>(d, ta, n, s);
    } else if (oomb_fits_u32(dst)) {
        k_unary<OP, uint32_t, false><<<grid, k_threads, 0, c.stream>>>(d, ta, n, s);
    } else {
        k_unary<OP, uint64_t, false><<<grid, k_threads, 0, c.stream>>>(d, ta, n, s);
    }
    OOMB_CUDA_LAUNCHED(c, oomb_op_name(dst->op));
}

// ---------------------------------------------------------------------------------------------
// Fill, repeat, repeat_back
// ---------------------------------------------------------------------------------------------

template <typename I>
__global__ void k_fill(oomb_tv dst, int64_t n, float v) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        *(float *) (dst.d + oomb_flat_off<I>(dst, (I) k)) = v;
    }
}

template <typename I>
__global__ void k_repeat(oomb_tv dst, oomb_tv a, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        I i0, i1, i2, i3;
        oomb_unravel<I>((I) k, dst.ne, i0, i1, i2, i3);
        const float x = *(const float *) (a.d + oomb_off(a, i0 % (I) a.ne[0], i1 % (I) a.ne[1], i2 % (I) a.ne[2], i3 % (I) a.ne[3]));
        *(float *) (dst.d + oomb_off(dst, i0, i1, i2, i3)) = x;
    }
}

// One thread per element of dst: sums the a elements that repeat maps onto it (in double).
template <typename I>
__global__ void k_repeat_back(oomb_tv dst, oomb_tv a, int64_t n) {
    const int64_t k0 = a.ne[0] / dst.ne[0], k1 = a.ne[1] / dst.ne[1], k2 = a.ne[2] / dst.ne[2], k3 = a.ne[3] / dst.ne[3];
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        I j0, j1, j2, j3;
        oomb_unravel<I>((I) k, dst.ne, j0, j1, j2, j3);
        double acc = 0.0;
        for (int64_t m3 = 0; m3 < k3; m3++)
        for (int64_t m2 = 0; m2 < k2; m2++)
        for (int64_t m1 = 0; m1 < k1; m1++) {
            const char * row = a.d + (j1 + m1 * dst.ne[1]) * a.nb[1] + (j2 + m2 * dst.ne[2]) * a.nb[2] + (j3 + m3 * dst.ne[3]) * a.nb[3];
            for (int64_t m0 = 0; m0 < k0; m0++) acc += *(const float *) (row + (j0 + m0 * dst.ne[0]) * a.nb[0]);
        }
        *(float *) (dst.d + oomb_off(dst, j0, j1, j2, j3)) = (float) acc;
    }
}

// Column sums (the gradient of a bias or norm weight broadcast over rows): a [ne0, rows...] summed
// to dst [ne0]. Pass 1: a (32 columns x 8 row-threads) block sums a strided subset of the rows of
// 32 columns in double and reduces over its row-threads; block row y writes partial[y][col].
// Pass 2 adds the partials of each column in a fixed order (deterministic, no atomics).
constexpr int k_cs_cols = 32, k_cs_rows = 8;

// FLAT: row r starts at r * nb[1] (dims 1..3 packed), no index division per element.
template <bool FLAT>
__global__ void k_colsum_partial(oomb_tv a, int64_t n_rows, double * partial) {
    __shared__ double sh[k_cs_rows][k_cs_cols + 1];
    const int64_t j = blockIdx.x * (int64_t) k_cs_cols + threadIdx.x;
    double acc = 0.0;
    if (j < a.ne[0]) {
        for (int64_t r = blockIdx.y * (int64_t) k_cs_rows + threadIdx.y; r < n_rows; r += (int64_t) gridDim.y * k_cs_rows) {
            if constexpr (FLAT) {
                acc += *(const float *) (a.d + r * a.nb[1] + j * a.nb[0]);
            } else {
                const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
                acc += *(const float *) (a.d + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3] + j * a.nb[0]);
            }
        }
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < a.ne[0]) {
        double t = 0.0;
        for (int y = 0; y < k_cs_rows; y++) t += sh[y][threadIdx.x];
        partial[blockIdx.y * a.ne[0] + j] = t;
    }
}

__global__ void k_colsum_final(const double * partial, int64_t n_part, int64_t ne0, oomb_tv dst) {
    const int64_t j = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (j >= ne0) return;
    double t = 0.0;
    for (int64_t y = 0; y < n_part; y++) t += partial[y * ne0 + j];
    *(float *) (dst.d + j * dst.nb[0]) = (float) t;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

void oomb_cuda_copy_tensor(oomb_cuda_ctx & c, const oomb_tensor * src, const oomb_tensor * dst) {
    const int64_t n = oomb_nelements(src);
    if (n == 0) return;
    if (oomb_type_is_quantized(src->type)) {
        // cast / cpy of row-major blocks: dequantized (f32 / bf16 results of the same shape, contiguous)
        if (!oomb_are_same_shape(src, dst) || oomb::quant_block_dim(src) != 0 || !oomb_is_contiguous(dst) ||
            (src->ne[2] * src->ne[3] != 1 && !oomb_is_contiguous(src)) ||
            (dst->type != OOMB_TYPE_F32 && dst->type != OOMB_TYPE_BF16))
            oomb_error("%s: dequantizing %s into %s on the GPU needs row-major blocks and a contiguous f32 / bf16 result of the same shape",
                       oomb_op_name(dst->op), shape_str(src).c_str(), shape_str(dst).c_str());
        oomb_cuda_dequantize_rows(c, src->type, src->data, src->nb[1], oomb_nrows(src), src->ne[0], dst->data, dst->type);
        return;
    }
    if (src->type == dst->type) {
        if (oomb::tensors_same_layout(src, dst)) return; // copying onto itself
        if (oomb_is_contiguous(src) && oomb_is_contiguous(dst)) {
            const char * s0 = (const char *) src->data;
            char * d0 = (char *) dst->data;
            const size_t nb = oomb_nbytes(src);
            if (s0 + nb <= d0 || d0 + nb <= s0) {
                CUDA_CHECK(cudaMemcpyAsync(d0, s0, nb, cudaMemcpyDeviceToDevice, c.stream));
                return;
            }
        }
        if (oomb_type_size(src->type) == 4) launch_copy<uint32_t, uint32_t>(c, src, dst, n);
        else launch_copy<uint16_t, uint16_t>(c, src, dst, n);
        return;
    }
#define OOMB_CVT(ST, S, DT, D) \
    if (src->type == ST && dst->type == DT) { launch_copy<S, D>(c, src, dst, n); return; }
    OOMB_CVT(OOMB_TYPE_F32, float, OOMB_TYPE_F16, __half)
    OOMB_CVT(OOMB_TYPE_F32, float, OOMB_TYPE_BF16, __nv_bfloat16)
    OOMB_CVT(OOMB_TYPE_F16, __half, OOMB_TYPE_F32, float)
    OOMB_CVT(OOMB_TYPE_BF16, __nv_bfloat16, OOMB_TYPE_F32, float)
    OOMB_CVT(OOMB_TYPE_F16, __half, OOMB_TYPE_BF16, __nv_bfloat16)
    OOMB_CVT(OOMB_TYPE_BF16, __nv_bfloat16, OOMB_TYPE_F16, __half)
#undef OOMB_CVT
    oomb_error("copy: cannot convert %s to %s", shape_str(src).c_str(), shape_str(dst).c_str());
}

void oomb_cuda_fill(oomb_cuda_ctx & c, oomb_tensor * dst) {
    const int64_t n = oomb_nelements(dst);
    if (n == 0) return;
    const float v = oomb::get_op_f32(dst, 0);
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    if (oomb_fits_u32(dst)) k_fill<uint32_t><<<grid, k_threads, 0, c.stream>>>(oomb_make_tv(dst), n, v);
    else k_fill<uint64_t><<<grid, k_threads, 0, c.stream>>>(oomb_make_tv(dst), n, v);
    OOMB_CUDA_LAUNCHED(c, "fill");
}

namespace {

template <typename D>
void launch_swiglu_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u, const oomb_tensor * dy, int64_t n) {
    using V = typename std::conditional<std::is_same<D, float>::value, float4, uint2>::type;
    const oomb_tv tg = oomb_make_tv(g), tu = oomb_make_tv(u), ty = oomb_make_tv(dy);
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    D * d = (D *) dst->data;
    const bool contig = oomb_is_contiguous(g) && oomb_is_contiguous(u) && oomb_is_contiguous(dy);
    if (g->type == OOMB_TYPE_BF16) {  // gate and up both bf16 (check_op_operands)
        if (contig && n % 4 == 0 && (uintptr_t) dst->data % sizeof(V) == 0 && (uintptr_t) g->data % 8 == 0 && (uintptr_t) u->data % 8 == 0 &&
            aligned16(dy->data))
            k_swiglu_back_bfin4<V><<<oomb_cuda_grid(n / 4, k_threads), k_threads, 0, c.stream>>>((V *) dst->data, (const uint2 *) g->data,
                                                                                                 (const uint2 *) u->data, (const float4 *) dy->data, n / 4);
        else if (oomb_fits_u32(g))
            k_swiglu_back_bfin<uint32_t, D><<<grid, k_threads, 0, c.stream>>>(d, tg, tu, ty, n);
        else
            k_swiglu_back_bfin<uint64_t, D><<<grid, k_threads, 0, c.stream>>>(d, tg, tu, ty, n);
        OOMB_CUDA_LAUNCHED(c, "swiglu_back (bf16 gate, up)");
        return;
    }
    if (contig && n % 4 == 0 && (uintptr_t) dst->data % sizeof(V) == 0 && aligned16(g->data) && aligned16(u->data) && aligned16(dy->data))
        k_swiglu_back4<V><<<oomb_cuda_grid(n / 4, k_threads), k_threads, 0, c.stream>>>((V *) dst->data, (const float4 *) g->data,
                                                                                        (const float4 *) u->data, (const float4 *) dy->data, n / 4);
    else if (contig)
        k_swiglu_back<uint64_t, true, D><<<grid, k_threads, 0, c.stream>>>(d, tg, tu, ty, n);
    else if (oomb_fits_u32(g))
        k_swiglu_back<uint32_t, false, D><<<grid, k_threads, 0, c.stream>>>(d, tg, tu, ty, n);
    else
        k_swiglu_back<uint64_t, false, D><<<grid, k_threads, 0, c.stream>>>(d, tg, tu, ty, n);
    OOMB_CUDA_LAUNCHED(c, "swiglu_back");
}

} // namespace

void oomb_cuda_swiglu_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u, const oomb_tensor * dy) {
    if (!oomb_is_contiguous(dst) || dst->ne[0] != g->ne[0] || dst->ne[1] != g->ne[1] || dst->ne[2] != g->ne[2] || dst->ne[3] != 2 * g->ne[3])
        oomb_error("swiglu_back: result %s must be contiguous [%s with ne3 doubled]", shape_str(dst).c_str(), shape_str(g).c_str());
    const int64_t n = oomb_nelements(g);
    if (n == 0) return;
    if (dst->type == OOMB_TYPE_BF16) launch_swiglu_back<__nv_bfloat16>(c, dst, g, u, dy, n);
    else if (dst->type == OOMB_TYPE_F32) launch_swiglu_back<float>(c, dst, g, u, dy, n);
    else oomb_error("swiglu_back: result %s must be f32 or bf16", shape_str(dst).c_str());
}

void oomb_cuda_binary(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    switch (dst->op) {
        case OOMB_OP_ADD: case OOMB_OP_ADD_INPLACE:
            launch_binary<OP_ADD>(c, dst, a, b);
            break;
        case OOMB_OP_SUB:
            launch_binary<OP_SUB>(c, dst, a, b);
            break;
        case OOMB_OP_MUL:
            launch_binary<OP_MUL>(c, dst, a, b);
            break;
        case OOMB_OP_SILU_BACK:
            launch_binary<OP_SILU_BACK>(c, dst, a, b);
            break;
        case OOMB_OP_SWIGLU:
            launch_binary<OP_SWIGLU>(c, dst, a, b);
            break;
        default:
            oomb_error("cuda binary: op %s is not element-wise binary", oomb_op_name(dst->op));
    }
}

void oomb_cuda_unary(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    switch (dst->op) {
        case OOMB_OP_SCALE:
            launch_unary<OP_SCALE>(c, dst, a, oomb::get_op_f32(dst, 0));
            break;
        case OOMB_OP_SILU:
            launch_unary<OP_SILU>(c, dst, a, 0.0f);
            break;
        default:
            oomb_error("cuda unary: op %s is not element-wise unary", oomb_op_name(dst->op));
    }
}

void oomb_cuda_repeat(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    for (int i = 0; i < 4; i++) {
        if (a->ne[i] == 0 ? dst->ne[i] != 0 : dst->ne[i] % a->ne[i] != 0) {
            oomb_error("repeat: %s cannot be repeated to %s", shape_str(a).c_str(), shape_str(dst).c_str());
        }
    }
    const int64_t n = oomb_nelements(dst);
    if (n == 0) return;
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    if (oomb_fits_u32(dst)) k_repeat<uint32_t><<<grid, k_threads, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), n);
    else k_repeat<uint64_t><<<grid, k_threads, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), n);
    OOMB_CUDA_LAUNCHED(c, "repeat");
}

void oomb_cuda_repeat_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    for (int i = 0; i < 4; i++) {
        if (dst->ne[i] == 0 ? a->ne[i] != 0 : a->ne[i] % dst->ne[i] != 0) {
            oomb_error("repeat_back: %s cannot be summed down to %s", shape_str(a).c_str(), shape_str(dst).c_str());
        }
    }
    const int64_t n = oomb_nelements(dst);
    if (n == 0) return;
    const int64_t n_rows = oomb_nrows(a);
    if (dst->ne[0] == a->ne[0] && oomb_nrows(dst) == 1 && n_rows > 1) {
        // fast path: sum of every row (bias / norm-weight gradients), many threads per column
        const int64_t n_part = std::max<int64_t>(1, std::min<int64_t>(512, n_rows / (k_cs_rows * 16)));
        double * partial = (double *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) n_part * (size_t) a->ne[0] * sizeof(double));
        const dim3 grid1((unsigned) ((a->ne[0] + k_cs_cols - 1) / k_cs_cols), (unsigned) n_part), block1(k_cs_cols, k_cs_rows);
        const bool flat = a->nb[2] == a->nb[1] * (size_t) a->ne[1] && a->nb[3] == a->nb[2] * (size_t) a->ne[2];
        if (flat) k_colsum_partial<true><<<grid1, block1, 0, c.stream>>>(oomb_make_tv(a), n_rows, partial);
        else k_colsum_partial<false><<<grid1, block1, 0, c.stream>>>(oomb_make_tv(a), n_rows, partial);
        OOMB_CUDA_LAUNCHED(c, "repeat_back (column partial sums)");
        k_colsum_final<<<(unsigned) ((a->ne[0] + 255) / 256), 256, 0, c.stream>>>(partial, n_part, a->ne[0], oomb_make_tv(dst));
        OOMB_CUDA_LAUNCHED(c, "repeat_back (column sums)");
        return;
    }
    const unsigned grid = oomb_cuda_grid(n, k_threads);
    if (oomb_fits_u32(dst)) k_repeat_back<uint32_t><<<grid, k_threads, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), n);
    else k_repeat_back<uint64_t><<<grid, k_threads, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), n);
    OOMB_CUDA_LAUNCHED(c, "repeat_back");
}
