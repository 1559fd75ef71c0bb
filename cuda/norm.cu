// RMSNorm (see norm.cuh).

#include "norm.cuh"

using oomb::shape_str;

namespace {

// Sums of squares / products accumulate in double, as on the CPU: the backward's two terms cancel
// almost exactly for short rows, so its result is only as good as these sums.
__global__ void k_rms_norm(oomb_tv dst, oomb_tv a, float eps) {
    __shared__ double sh[32];
    const int64_t r = blockIdx.x;
    const float * x = (const float *) (a.d + oomb_row_off(a, r));
    float * y = (float *) (dst.d + oomb_row_off(dst, r));
    const int64_t n = a.ne[0];
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double) x[i] * (double) x[i];
    ss = oomb_block_sum(ss, sh);
    const float s = (float) (1.0 / sqrt(ss / (double) n + (double) eps));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] * s;
}

__global__ void k_rms_norm_back(oomb_tv dst, oomb_tv xa, oomb_tv dya, float eps) {
    __shared__ double sh[32];
    const int64_t r = blockIdx.x;
    const float * x = (const float *) (xa.d + oomb_row_off(xa, r));
    const float * g = (const float *) (dya.d + oomb_row_off(dya, r));
    float * d = (float *) (dst.d + oomb_row_off(dst, r));
    const int64_t n = xa.ne[0];
    double ss = 0.0, xg = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        ss += (double) x[i] * (double) x[i];
        xg += (double) x[i] * (double) g[i];
    }
    ss = oomb_block_sum(ss, sh);
    xg = oomb_block_sum(xg, sh);
    const double s = 1.0 / sqrt(ss / (double) n + (double) eps);
    const float c1 = (float) s;
    const float c2 = (float) (s * s * s / (double) n * xg);
    // separately rounded products (no FMA contraction), as the CPU kernel computes them: for short rows
    // the two terms nearly cancel and a fused multiply-add would round differently
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = __fsub_rn(__fmul_rn(c1, g[i]), __fmul_rn(c2, x[i]));
}

// One warp per row for rows of packed, 16-byte aligned float4s (ne0 % 4 == 0): the block-per-row
// kernels above leave most threads idle on short rows (896 for Qwen2.5-0.5B). Same sums in double
// and the same final products; only the order of the double additions differs.
template <bool BACK>
__global__ void k_rms_norm_warp(oomb_tv dst, oomb_tv xa, oomb_tv dya, int64_t nr, float eps) {
    const int64_t r = blockIdx.x * (int64_t) (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= nr) return;
    const int lane = threadIdx.x & 31;
    const int64_t n4 = xa.ne[0] / 4;
    const float4 * x = (const float4 *) (xa.d + oomb_row_off(xa, r));
    const float4 * g = BACK ? (const float4 *) (dya.d + oomb_row_off(dya, r)) : nullptr;
    float4 * d = (float4 *) (dst.d + oomb_row_off(dst, r));
    double ss = 0.0, xg = 0.0;
    for (int64_t i = lane; i < n4; i += 32) {
        const float4 v = x[i];
        ss += (double) v.x * v.x + (double) v.y * v.y + (double) v.z * v.z + (double) v.w * v.w;
        if constexpr (BACK) {
            const float4 w = g[i];
            xg += (double) v.x * w.x + (double) v.y * w.y + (double) v.z * w.z + (double) v.w * w.w;
        }
    }
    ss = oomb_warp_sum(ss);
    const double n = (double) xa.ne[0];
    if constexpr (!BACK) {
        const float s = (float) (1.0 / sqrt(ss / n + (double) eps));
        for (int64_t i = lane; i < n4; i += 32) {
            const float4 v = x[i];
            d[i] = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
        }
    } else {
        xg = oomb_warp_sum(xg);
        const double sd = 1.0 / sqrt(ss / n + (double) eps);
        const float c1 = (float) sd;
        const float c2 = (float) (sd * sd * sd / n * xg);
        for (int64_t i = lane; i < n4; i += 32) {
            const float4 v = x[i], w = g[i];
            d[i] = make_float4(__fsub_rn(__fmul_rn(c1, w.x), __fmul_rn(c2, v.x)), __fsub_rn(__fmul_rn(c1, w.y), __fmul_rn(c2, v.y)),
                               __fsub_rn(__fmul_rn(c1, w.z), __fmul_rn(c2, v.z)), __fsub_rn(__fmul_rn(c1, w.w), __fmul_rn(c2, v.w)));
        }
    }
}

// rows usable by k_rms_norm_warp: unit stride, ne0 % 4 == 0, rows 16-byte aligned
bool rows_vec4(const oomb_tensor * t) {
    if (t->nb[0] != sizeof(float) || t->ne[0] % 4 != 0 || (uintptr_t) t->data % 16 != 0) return false;
    for (int i = 1; i < 4; i++)
        if (t->nb[i] % 16 != 0) return false;
    return true;
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
    if (rows_vec4(a) && rows_vec4(dst) && a->ne[0] <= 4096) {
        k_rms_norm_warp<false><<<(unsigned) ((nr + 7) / 8), 256, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), oomb_make_tv(a), nr,
                                                                               oomb::get_op_f32(dst, 0));
    } else {
        k_rms_norm<<<(unsigned) nr, oomb_cuda_row_threads(a->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a),
                                                                                    oomb::get_op_f32(dst, 0));
    }
    OOMB_CUDA_LAUNCHED(c, "rms_norm");
}

void oomb_cuda_rms_norm_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    const int64_t nr = oomb_nrows(x);
    if (x->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm_back: too many rows in %s", shape_str(x).c_str());
    if (rows_vec4(x) && rows_vec4(dy) && rows_vec4(dst) && x->ne[0] <= 4096) {
        k_rms_norm_warp<true><<<(unsigned) ((nr + 7) / 8), 256, 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(x), oomb_make_tv(dy), nr,
                                                                              oomb::get_op_f32(dst, 0));
    } else {
        k_rms_norm_back<<<(unsigned) nr, oomb_cuda_row_threads(x->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(x),
                                                                                        oomb_make_tv(dy), oomb::get_op_f32(dst, 0));
    }
    OOMB_CUDA_LAUNCHED(c, "rms_norm_back");
}
