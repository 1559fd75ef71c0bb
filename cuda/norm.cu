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

void check_same_shape(const char * op, const oomb_tensor * a, const oomb_tensor * b) {
    if (!oomb_are_same_shape(a, b)) oomb_error("%s: shapes differ: %s vs %s", op, shape_str(a).c_str(), shape_str(b).c_str());
}

} // namespace

int oomb_cuda_row_threads(int64_t ne0, int max_threads) {
    int t = 32;
    while (t < max_threads && t < ne0) t *= 2;
    return t;
}

void oomb_cuda_rms_norm(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    check_same_shape("rms_norm", dst, a);
    const int64_t nr = oomb_nrows(a);
    if (a->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm: too many rows in %s", shape_str(a).c_str());
    k_rms_norm<<<(unsigned) nr, oomb_cuda_row_threads(a->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), oomb::get_op_f32(dst, 0));
    OOMB_CUDA_LAUNCHED(c, "rms_norm");
}

void oomb_cuda_rms_norm_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    check_same_shape("rms_norm_back", dst, x);
    check_same_shape("rms_norm_back", dst, dy);
    const int64_t nr = oomb_nrows(x);
    if (x->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("rms_norm_back: too many rows in %s", shape_str(x).c_str());
    k_rms_norm_back<<<(unsigned) nr, oomb_cuda_row_threads(x->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(x), oomb_make_tv(dy),
                                                                                    oomb::get_op_f32(dst, 0));
    OOMB_CUDA_LAUNCHED(c, "rms_norm_back");
}
