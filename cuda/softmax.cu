// Softmax (see softmax.cuh). Semantics as in ops-cpu.cpp: causal >= 0 masks i0 > i1 + causal; a row
// with nothing left (or only -inf) becomes zeros.

#include "softmax.cuh"
#include "norm.cuh"

using oomb::shape_str;

namespace {

__global__ void k_soft_max(oomb_tv dst, oomb_tv a, float scale, int64_t causal) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    const int64_t i1 = r % a.ne[1];
    const float * x = (const float *) (a.d + oomb_row_off(a, r));
    float * y = (float *) (dst.d + oomb_row_off(dst, r));
    const int64_t ne0 = a.ne[0];
    int64_t nv = ne0;
    if (causal >= 0) {
        nv = i1 + causal + 1;
        if (nv < 0) nv = 0;
        if (nv > ne0) nv = ne0;
    }
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) mx = fmaxf(mx, x[i] * scale);
    mx = oomb_block_max(mx, sh);
    if (nv == 0 || mx == -INFINITY) {
        __syncthreads(); // every thread has read its x before any writes (in place)
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = 0.0f;
        return;
    }
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float e = i < nv ? expf(x[i] * scale - mx) : 0.0f;
        y[i] = e;
        s += e;
    }
    s = oomb_block_sum(s, sh);
    const float inv = (float) (1.0 / (double) s);
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) y[i] *= inv;
}

__global__ void k_soft_max_back(oomb_tv dst, oomb_tv ya, oomb_tv dya, float scale) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    const float * y = (const float *) (ya.d + oomb_row_off(ya, r));
    const float * g = (const float *) (dya.d + oomb_row_off(dya, r));
    float * d = (float *) (dst.d + oomb_row_off(dst, r));
    const int64_t n = ya.ne[0];
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dot += y[i] * g[i];
    dot = oomb_block_sum(dot, sh);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = scale * y[i] * (g[i] - dot);
}

} // namespace

void oomb_cuda_soft_max(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    const int64_t nr = oomb_nrows(a);
    if (a->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("soft_max: too many rows in %s", shape_str(a).c_str());
    k_soft_max<<<(unsigned) nr, oomb_cuda_row_threads(a->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(a), oomb::get_op_f32(dst, 0),
                                                                               (int64_t) dst->op_params[1]);
    OOMB_CUDA_LAUNCHED(c, "soft_max");
}

void oomb_cuda_soft_max_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * y, const oomb_tensor * dy) {
    const int64_t nr = oomb_nrows(y);
    if (y->ne[0] == 0 || nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("soft_max_back: too many rows in %s", shape_str(y).c_str());
    k_soft_max_back<<<(unsigned) nr, oomb_cuda_row_threads(y->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(y), oomb_make_tv(dy),
                                                                                    oomb::get_op_f32(dst, 0));
    OOMB_CUDA_LAUNCHED(c, "soft_max_back");
}
