// RMSNorm (see norm.cuh).

#include "norm.cuh"

#include <cstdlib>
#include <type_traits>

using oomb::shape_str;

namespace {

// The weighted forms (oomb_rms_norm_mul, W = true) fold in what oomb_mul did after the plain norm,
// with the same roundings: y = f32(x * s) * w stored as TO, and for the backward g = f32(dy * w)
// read where the plain backward reads dy. The backward recomputes s from x (nothing of the forward is
// kept), its c1, c2 in double as before, and hands each row's c1 (the f32 s) to dw's column sums.

// Stores v at p as TO (f32 or bf16, round to nearest even).
template <typename TO> __device__ __forceinline__ void st_out(char * p, int64_t i, float v) { ((TO *) p)[i] = oomb_from_f<TO>(v); }

// Sums of squares / products accumulate in double, as on the CPU: the backward's two terms cancel
// almost exactly for short rows, so its result is only as good as these sums.
template <typename TO, bool W>
__global__ void k_rms_norm(oomb_tv dst, oomb_tv a, const float * __restrict__ w, float eps) {
    __shared__ double sh[32];
    const int64_t r = blockIdx.x;
    const float * x = (const float *) (a.d + oomb_row_off(a, r));
    char * y = dst.d + oomb_row_off(dst, r);
    const int64_t n = a.ne[0];
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double) x[i] * (double) x[i];
    ss = oomb_block_sum(ss, sh);
    const float s = (float) (1.0 / sqrt(ss / (double) n + (double) eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = __fmul_rn(x[i], s);
        st_out<TO>(y, i, W ? __fmul_rn(v, w[i]) : v);
    }
}

// srow (W, when not null): each row's scale s for dw's column sums after: c1, the forward's formula
// on this kernel's own double sums (the forward may have taken the other kernel, whose sums add in
// another order: s can then differ in its last bit on a rare row, which moves dw by far less than
// its own rounding)
// ACC: dst += dx (the fused accumulation of dx into a gradient sum, backend-cuda.cu fuse_accumulations: the
// same f32 dx, then one f32 add, as the separate add node would do)
template <bool W, bool ACC = false>
__global__ void k_rms_norm_back(oomb_tv dst, oomb_tv xa, oomb_tv dya, const float * __restrict__ w, float * __restrict__ srow, float eps) {
    __shared__ double sh[32];
    const int64_t r = blockIdx.x;
    const float * x = (const float *) (xa.d + oomb_row_off(xa, r));
    const float * dy = (const float *) (dya.d + oomb_row_off(dya, r));
    float * d = (float *) (dst.d + oomb_row_off(dst, r));
    const int64_t n = xa.ne[0];
    auto g = [&](int64_t i) { return W ? __fmul_rn(dy[i], w[i]) : dy[i]; };
    double ss = 0.0, xg = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        ss += (double) x[i] * (double) x[i];
        xg += (double) x[i] * (double) g(i);
    }
    ss = oomb_block_sum(ss, sh);
    xg = oomb_block_sum(xg, sh);
    const double s = 1.0 / sqrt(ss / (double) n + (double) eps);
    const float c1 = (float) s;
    const float c2 = (float) (s * s * s / (double) n * xg);
    if (W && srow && threadIdx.x == 0) srow[r] = c1;
    // separately rounded products (no FMA contraction), as the CPU kernel computes them: for short rows
    // the two terms nearly cancel and a fused multiply-add would round differently
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = __fsub_rn(__fmul_rn(c1, g(i)), __fmul_rn(c2, x[i]));
        d[i] = ACC ? __fadd_rn(d[i], v) : v;
    }
}

// One warp per row for rows of packed, 16-byte aligned float4s (ne0 % 4 == 0): the block-per-row
// kernels above leave most threads idle on short rows (896 for Qwen2.5-0.5B). Same sums in double
// and the same final products; only the order of the double additions differs.
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
    return make_float4(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y), __fmul_rn(a.z, b.z), __fmul_rn(a.w, b.w));
}
// The backward's row coefficients from the row's double sums ss = sum x^2, xg = sum x g (g = dy or dy * w):
// dx = c1 g - c2 x with c1 = s (the f32 s the dw sums take), c2 = s^3 / n * xg.
__device__ __forceinline__ void rms_back_coefs(double ss, double xg, double n, float eps, float & c1, float & c2) {
    const double sd = 1.0 / sqrt(ss / n + (double) eps);
    c1 = (float) sd;
    c2 = (float) (sd * sd * sd / n * xg);
}
// Stores dx = c1 q - c2 v at d4[i] (ACC: adds it to what is there), rounded as every warp-per-row backward rounds it.
template <bool ACC> __device__ __forceinline__ void st_dx4(float4 * d4, int64_t i, float c1, float c2, float4 q, float4 v) {
    float4 o = make_float4(__fsub_rn(__fmul_rn(c1, q.x), __fmul_rn(c2, v.x)), __fsub_rn(__fmul_rn(c1, q.y), __fmul_rn(c2, v.y)),
                           __fsub_rn(__fmul_rn(c1, q.z), __fmul_rn(c2, v.z)), __fsub_rn(__fmul_rn(c1, q.w), __fmul_rn(c2, v.w)));
    if constexpr (ACC) {
        const float4 a = d4[i];
        o = make_float4(__fadd_rn(a.x, o.x), __fadd_rn(a.y, o.y), __fadd_rn(a.z, o.z), __fadd_rn(a.w, o.w));
    }
    d4[i] = o;
}
template <typename TO> __device__ __forceinline__ void st_out4(char * p, int64_t i4, float4 v) {
    if constexpr (sizeof(TO) == 4) {
        ((float4 *) p)[i4] = v;
    } else {
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *(const uint32_t *) &lo;
        u.y = *(const uint32_t *) &hi;
        ((uint2 *) p)[i4] = u;
    }
}
template <bool BACK, typename TO, bool W, bool ACC = false>
__global__ void k_rms_norm_warp(oomb_tv dst, oomb_tv xa, oomb_tv dya, const float * __restrict__ w, float * __restrict__ srow, int64_t nr,
                                float eps) {
    const int64_t r = blockIdx.x * (int64_t) (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= nr) return;
    const int lane = threadIdx.x & 31;
    const int64_t n4 = xa.ne[0] / 4;
    const float4 * x = (const float4 *) (xa.d + oomb_row_off(xa, r));
    const float4 * dy = BACK ? (const float4 *) (dya.d + oomb_row_off(dya, r)) : nullptr;
    const float4 * w4 = (const float4 *) w;
    char * d = dst.d + oomb_row_off(dst, r);
    auto g = [&](int64_t i) { return W ? mul4(dy[i], w4[i]) : dy[i]; };
    double ss = 0.0, xg = 0.0;
    for (int64_t i = lane; i < n4; i += 32) {
        const float4 v = x[i];
        ss += (double) v.x * v.x + (double) v.y * v.y + (double) v.z * v.z + (double) v.w * v.w;
        if constexpr (BACK) {
            const float4 q = g(i);
            xg += (double) v.x * q.x + (double) v.y * q.y + (double) v.z * q.z + (double) v.w * q.w;
        }
    }
    ss = oomb_warp_sum(ss);
    const double n = (double) xa.ne[0];
    if constexpr (!BACK) {
        const float s = (float) (1.0 / sqrt(ss / n + (double) eps));
        for (int64_t i = lane; i < n4; i += 32) {
            const float4 v = x[i];
            const float4 y = make_float4(__fmul_rn(v.x, s), __fmul_rn(v.y, s), __fmul_rn(v.z, s), __fmul_rn(v.w, s));
            st_out4<TO>(d, i, W ? mul4(y, w4[i]) : y);
        }
    } else {
        xg = oomb_warp_sum(xg);
        float c1, c2;
        rms_back_coefs(ss, xg, n, eps, c1, c2);
        if (W && srow && lane == 0) srow[r] = c1;
        float4 * d4 = (float4 *) d;
        for (int64_t i = lane; i < n4; i += 32) st_dx4<ACC>(d4, i, c1, c2, g(i), x[i]);
    }
}

// dw of rms_norm_mul: dw[j] = sum over rows r of f32(dy[r][j] * f32(x[r][j] * s_r)) in double, the
// products rounded as oomb_mul rounded them. Pass 1 as repeat_back's column sums (elementwise.cu):
// a (32 columns x 8 row-threads) block sums a strided subset of the rows of 32 columns and reduces
// over its row-threads into partial[blockIdx.y][col]; pass 2 adds the partials of each column in a
// fixed order (deterministic, no atomics).
// FLAT: row r of x and dy starts at r * nb[1] (dims 1..3 packed), no index division per element.
constexpr int k_dw_cols = 32, k_dw_rows = 8;
template <bool FLAT>
__global__ void k_rms_norm_dw_partial(oomb_tv xa, oomb_tv dya, const float * __restrict__ srow, int64_t nr, double * partial) {
    __shared__ double sh[k_dw_rows][k_dw_cols + 1];
    const int64_t j = blockIdx.x * (int64_t) k_dw_cols + threadIdx.x;
    double acc = 0.0;
    if (j < xa.ne[0]) {
        for (int64_t r = blockIdx.y * (int64_t) k_dw_rows + threadIdx.y; r < nr; r += (int64_t) gridDim.y * k_dw_rows) {
            const float x = ((const float *) (xa.d + (FLAT ? r * (int64_t) xa.nb[1] : oomb_row_off(xa, r))))[j];
            const float dy = ((const float *) (dya.d + (FLAT ? r * (int64_t) dya.nb[1] : oomb_row_off(dya, r))))[j];
            acc += (double) __fmul_rn(dy, __fmul_rn(x, srow[r]));
        }
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < xa.ne[0]) {
        double t = 0.0;
        for (int y = 0; y < k_dw_rows; y++) t += sh[y][threadIdx.x];
        partial[blockIdx.y * xa.ne[0] + j] = t;
    }
}
__global__ void k_rms_norm_dw_final(const double * partial, int64_t n_part, int64_t ne0, float * dw) {
    const int64_t j = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (j >= ne0) return;
    double t = 0.0;
    for (int64_t y = 0; y < n_part; y++) t += partial[y * ne0 + j];
    dw[j] = (float) t;
}

// rms_norm_mul_back's dx and dw in one pass over x and dy, for rows of at most 128 * NV floats (ne0 % 4 == 0,
// rows 16-byte aligned): the separate dw pass above re-reads x and dy (at 0.5B, [896, 32768] each: ~40 % of the
// op's bytes). Block b's warp w takes the rows b * 8 + w + k * (n_part * 8), k = 0, 1, ..., exactly the rows
// k_rms_norm_dw_partial's thread (column, threadIdx.y = w) of block y = b sums, in the same order; lane l keeps
// its columns 4 * (l + 32 k) .. +3 in double, and the warps' sums are added in warp order 0..7, as that kernel
// adds its threadIdx.y rows: partial[b][col] and so dw are bit-identical to the two-pass path, with c1 (the f32
// s of the row) and dx by the same helpers as k_rms_norm_warp's (rms_back_coefs, st_dx4).
template <int NV, bool ACC>
__global__ void __launch_bounds__(256) k_rms_norm_back_dw(oomb_tv dst, oomb_tv xa, oomb_tv dya, const float * __restrict__ w, int64_t nr,
                                                          float eps, double * partial) {
    __shared__ double sh[128 * NV];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t n4 = xa.ne[0] / 4;
    const float4 * w4 = (const float4 *) w;
    double acc[NV][4];
#pragma unroll
    for (int k = 0; k < NV; k++) acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.0;
    const double n = (double) xa.ne[0];
    for (int64_t r = blockIdx.x * (int64_t) 8 + warp; r < nr; r += (int64_t) gridDim.x * 8) {
        const float4 * x = (const float4 *) (xa.d + oomb_row_off(xa, r));
        const float4 * dy = (const float4 *) (dya.d + oomb_row_off(dya, r));
        double ss = 0.0, xg = 0.0;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t i = lane + 32 * k;
            if (i < n4) {
                const float4 v = x[i], q = mul4(dy[i], w4[i]);
                ss += (double) v.x * v.x + (double) v.y * v.y + (double) v.z * v.z + (double) v.w * v.w;
                xg += (double) v.x * q.x + (double) v.y * q.y + (double) v.z * q.z + (double) v.w * q.w;
            }
        }
        ss = oomb_warp_sum(ss);
        xg = oomb_warp_sum(xg);
        float c1, c2;
        rms_back_coefs(ss, xg, n, eps, c1, c2);
        float4 * d4 = (float4 *) (dst.d + oomb_row_off(dst, r));
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t i = lane + 32 * k;
            if (i < n4) {
                const float4 v = x[i], g = dy[i];
                st_dx4<ACC>(d4, i, c1, c2, mul4(g, w4[i]), v);
                acc[k][0] += (double) __fmul_rn(g.x, __fmul_rn(v.x, c1));
                acc[k][1] += (double) __fmul_rn(g.y, __fmul_rn(v.y, c1));
                acc[k][2] += (double) __fmul_rn(g.z, __fmul_rn(v.z, c1));
                acc[k][3] += (double) __fmul_rn(g.w, __fmul_rn(v.w, c1));
            }
        }
    }
    // the warps' sums in warp order (0 + warp 0 + warp 1 ...: k_rms_norm_dw_partial's order over threadIdx.y)
    for (int i = threadIdx.x; i < 128 * NV; i += blockDim.x) sh[i] = 0.0;
    __syncthreads();
    for (int wi = 0; wi < 8; wi++) {
        if (warp == wi) {
#pragma unroll
            for (int k = 0; k < NV; k++)
#pragma unroll
                for (int e = 0; e < 4; e++) sh[4 * (lane + 32 * k) + e] += acc[k][e];
        }
        __syncthreads();
    }
    for (int64_t j = threadIdx.x; j < xa.ne[0]; j += blockDim.x) partial[blockIdx.x * xa.ne[0] + j] = sh[j];
}

// rows usable by k_rms_norm_warp: unit stride, ne0 % 4 == 0, rows 16-byte aligned (8-byte for a
// bf16 result: es = its element size)
bool rows_vec4(const oomb_tensor * t, size_t es = sizeof(float)) {
    if (t->nb[0] != es || t->ne[0] % 4 != 0 || (uintptr_t) t->data % (4 * es) != 0) return false;
    for (int i = 1; i < 4; i++)
        if (t->nb[i] % (4 * es) != 0) return false;
    return true;
}

// The forward of rms_norm (w null) and rms_norm_mul (result f32 or bf16).
template <typename TO, bool W>
void launch_forward(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const float * w, int64_t nr, float eps) {
    if (rows_vec4(a) && rows_vec4(dst, sizeof(TO)) && (uintptr_t) w % 16 == 0 && a->ne[0] <= 4096) {
        k_rms_norm_warp<false, TO, W><<<(unsigned) ((nr + 7) / 8), 256, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), oomb_make_tv(a), w,
                                                                                     nullptr, nr, eps);
    } else {
        k_rms_norm<TO, W><<<(unsigned) nr, oomb_cuda_row_threads(a->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), w, eps);
    }
}

// dx (into dxv, a tensor of x's shape) of rms_norm_back (w null) or rms_norm_mul_back; srow as above;
// ACC: dxv += dx
template <bool W, bool ACC = false>
void launch_back(oomb_cuda_ctx & c, oomb_tensor * dxv, const oomb_tensor * x, const oomb_tensor * dy, const float * w, float * srow, int64_t nr,
                 float eps) {
    if (rows_vec4(x) && rows_vec4(dy) && rows_vec4(dxv) && (uintptr_t) w % 16 == 0 && x->ne[0] <= 4096) {
        k_rms_norm_warp<true, float, W, ACC><<<(unsigned) ((nr + 7) / 8), 256, 0, c.stream>>>(oomb_make_tv(dxv), oomb_make_tv(x),
                                                                                            oomb_make_tv(dy), w, srow, nr, eps);
    } else {
        k_rms_norm_back<W, ACC><<<(unsigned) nr, oomb_cuda_row_threads(x->ne[0]), 0, c.stream>>>(oomb_make_tv(dxv), oomb_make_tv(x),
                                                                                                oomb_make_tv(dy), w, srow, eps);
    }
}

} // namespace

int oomb_cuda_row_threads(int64_t ne0, int max_threads) {
    int t = 32;
    while (t < max_threads && t < ne0) t *= 2;
    return t;
}

void oomb_cuda_rms_norm(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    const int64_t nr = oomb_nrows(a);
    if (a->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm: too many rows in %s", shape_str(a).c_str());
    launch_forward<float, false>(c, dst, a, nullptr, nr, oomb::get_op_f32(dst, 0));
    OOMB_CUDA_LAUNCHED(c, "rms_norm");
}

void oomb_cuda_rms_norm_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    const int64_t nr = oomb_nrows(x);
    if (x->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm_back: too many rows in %s", shape_str(x).c_str());
    launch_back<false>(c, dst, x, dy, nullptr, nullptr, nr, oomb::get_op_f32(dst, 0));
    OOMB_CUDA_LAUNCHED(c, "rms_norm_back");
}

void oomb_cuda_rms_norm_mul(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * w) {
    const int64_t nr = oomb_nrows(x);
    if (x->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm_mul: too many rows in %s", shape_str(x).c_str());
    const float eps = oomb::get_op_f32(dst, 0);
    if (dst->type == OOMB_TYPE_BF16) launch_forward<__nv_bfloat16, true>(c, dst, x, (const float *) w->data, nr, eps);
    else launch_forward<float, true>(c, dst, x, (const float *) w->data, nr, eps);
    OOMB_CUDA_LAUNCHED(c, "rms_norm_mul");
}

void oomb_cuda_rms_norm_mul_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * w, const oomb_tensor * dy,
                                 float * acc_dx) {
    const int64_t nr = oomb_nrows(x), ne0 = x->ne[0];
    if (ne0 == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm_mul_back: too many rows in %s", shape_str(x).c_str());
    const float eps = oomb::get_op_f32(dst, 0);
    const bool with_dw = dst->op_params[1] != 0;
    // dx: a contiguous tensor of x's shape at the start of dst (packed [ne0, nr + 1] with dw, or dst itself),
    // or the accumulation it adds into
    oomb_tensor dxv = *x;
    dxv.data = acc_dx ? (void *) acc_dx : dst->data;
    dxv.view_src = nullptr;
    oomb::set_contiguous_nb(&dxv);
    auto back = [&](float * srow) {
        if (acc_dx) launch_back<true, true>(c, &dxv, x, dy, (const float *) w->data, srow, nr, eps);
        else launch_back<true>(c, with_dw ? &dxv : dst, x, dy, (const float *) w->data, srow, nr, eps);
    };
    if (!with_dw) {
        if (nr == 0) return;
        back(nullptr);
        OOMB_CUDA_LAUNCHED(c, "rms_norm_mul_back");
        return;
    }
    float * dw = (float *) dst->data + nr * ne0;
    if (nr == 0) {
        CUDA_CHECK(cudaMemsetAsync(dw, 0, (size_t) ne0 * sizeof(float), c.stream));
        return;
    }
    const int64_t n_part = std::max<int64_t>(1, std::min<int64_t>(512, nr / (k_dw_rows * 16)));
    double * partial = (double *) c.scratch(oomb_cuda_ctx::SLOT_K0 + 1, (size_t) n_part * (size_t) ne0 * sizeof(double));
    // dx and dw's partial sums in one pass (k_rms_norm_back_dw) for rows of up to 1,024 floats; OOMB_CUDA_NORM_ONEPASS=0:
    // two passes (the same bits)
    const char * op_env = getenv("OOMB_CUDA_NORM_ONEPASS");  // read per call (49 calls per 0.5B step): tests switch it
    const bool one_pass_on = !op_env || atoi(op_env) != 0;
    oomb_tensor * dxo = &dxv;  // the dx rows: dst's start, or the accumulation (acc_dx)
    if (one_pass_on && ne0 <= 1024 && rows_vec4(x) && rows_vec4(dy) && rows_vec4(dxo) && (uintptr_t) w->data % 16 == 0) {
        const int nv = (int) ((ne0 / 4 + 31) / 32);
        const float * wd = (const float *) w->data;
        auto go = [&](auto NVc) {
            constexpr int NV = decltype(NVc)::value;
            if (acc_dx) k_rms_norm_back_dw<NV, true><<<(unsigned) n_part, 256, 0, c.stream>>>(oomb_make_tv(dxo), oomb_make_tv(x), oomb_make_tv(dy), wd, nr, eps, partial);
            else k_rms_norm_back_dw<NV, false><<<(unsigned) n_part, 256, 0, c.stream>>>(oomb_make_tv(dxo), oomb_make_tv(x), oomb_make_tv(dy), wd, nr, eps, partial);
        };
        switch (nv) {
            case 1: go(std::integral_constant<int, 1>()); break;
            case 2: go(std::integral_constant<int, 2>()); break;
            case 3: go(std::integral_constant<int, 3>()); break;
            case 4: go(std::integral_constant<int, 4>()); break;
            case 5: go(std::integral_constant<int, 5>()); break;
            case 6: go(std::integral_constant<int, 6>()); break;
            case 7: go(std::integral_constant<int, 7>()); break;
            default: go(std::integral_constant<int, 8>()); break;
        }
        OOMB_CUDA_LAUNCHED(c, "rms_norm_mul_back (dx and dw partial sums)");
        k_rms_norm_dw_final<<<(unsigned) ((ne0 + 255) / 256), 256, 0, c.stream>>>(partial, n_part, ne0, dw);
        OOMB_CUDA_LAUNCHED(c, "rms_norm_mul_back (dw)");
        return;
    }
    float * srow = (float *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) nr * sizeof(float));
    back(srow);
    OOMB_CUDA_LAUNCHED(c, "rms_norm_mul_back (dx)");
    const dim3 grid1((unsigned) ((ne0 + k_dw_cols - 1) / k_dw_cols), (unsigned) n_part), block1(k_dw_cols, k_dw_rows);
    auto flat = [](const oomb_tensor * t) { return t->nb[2] == t->nb[1] * (size_t) t->ne[1] && t->nb[3] == t->nb[2] * (size_t) t->ne[2]; };
    if (flat(x) && flat(dy)) k_rms_norm_dw_partial<true><<<grid1, block1, 0, c.stream>>>(oomb_make_tv(x), oomb_make_tv(dy), srow, nr, partial);
    else k_rms_norm_dw_partial<false><<<grid1, block1, 0, c.stream>>>(oomb_make_tv(x), oomb_make_tv(dy), srow, nr, partial);
    OOMB_CUDA_LAUNCHED(c, "rms_norm_mul_back (dw partial sums)");
    k_rms_norm_dw_final<<<(unsigned) ((ne0 + 255) / 256), 256, 0, c.stream>>>(partial, n_part, ne0, dw);
    OOMB_CUDA_LAUNCHED(c, "rms_norm_mul_back (dw)");
}
