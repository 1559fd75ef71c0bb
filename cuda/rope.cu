// RoPE (see rope.cuh).

#include "rope.cuh"

using oomb::shape_str;

namespace {

// cos and sign * sin of the angle of pair i at position p: p * theta^(-2i / n_dims), divided by
// ff[i] when the node has frequency factors (HAS_FF; without them nothing is divided), in double
// (as the CPU kernel), rounded to f32
template <bool HAS_FF>
__device__ __forceinline__ float2 rope_cs(double p, int i, int n_dims, double theta, float sign, const float * ff) {
    double ang = p * pow(theta, -2.0 * (double) i / (double) n_dims);
    if (HAS_FF) ang /= (double) ff[i];
    double sd, cd;
    sincos(ang, &sd, &cd);
    return make_float2((float) cd, sign * (float) sd);
}

// One block per row (head i1, token i2, batch i3); threads over the n_dims/2 rotated pairs, then
// over the dimensions past n_dims (copied unless in place).
template <bool HAS_FF>
__global__ void k_rope(oomb_tv dst, oomb_tv a, oomb_tv pos, int n_dims, double theta, float sign, const float * ff) {
    const int64_t r = blockIdx.x;
    const int64_t i2 = (r / a.ne[1]) % a.ne[2];
    const float * x = (const float *) (a.d + oomb_row_off(a, r));
    float * y = (float *) (dst.d + oomb_row_off(dst, r));
    const double p = (double) *(const int32_t *) (pos.d + oomb_flat_off<uint64_t>(pos, (uint64_t) i2));
    const int half = n_dims / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float2 c = rope_cs<HAS_FF>(p, i, n_dims, theta, sign, ff);
        const float cs = c.x, sn = c.y;
        const float x0 = x[i], x1 = x[i + half];
        y[i] = x0 * cs - x1 * sn;
        y[i + half] = x0 * sn + x1 * cs;
    }
    if (y != x) {
        for (int64_t i = n_dims + threadIdx.x; i < a.ne[0]; i += blockDim.x) y[i] = x[i];
    }
}

// One block per token (i2, i3) for every head of it: the n_dims/2 angles of the token (double, as in
// k_rope) once into shared memory, then threads over (head, pair). k_rope computes each angle once
// per head, in blocks of n_dims/2 threads.
template <bool HAS_FF>
__global__ void k_rope_tok(oomb_tv dst, oomb_tv a, oomb_tv pos, int n_dims, double theta, float sign, const float * ff) {
    extern __shared__ float2 cs_sh[];
    const int64_t t = blockIdx.x;
    const int64_t i2 = t % a.ne[2], i3 = t / a.ne[2];
    const double p = (double) *(const int32_t *) (pos.d + oomb_flat_off<uint64_t>(pos, (uint64_t) i2));
    const int half = n_dims / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) cs_sh[i] = rope_cs<HAS_FF>(p, i, n_dims, theta, sign, ff);
    __syncthreads();
    const int nh = (int) a.ne[1];
    const char * xb = a.d + i2 * a.nb[2] + i3 * a.nb[3];
    char * yb = dst.d + i2 * dst.nb[2] + i3 * dst.nb[3];
    for (int k = threadIdx.x; k < nh * half; k += blockDim.x) {
        const int h = k / half, i = k - h * half;
        const float * x = (const float *) (xb + h * a.nb[1]);
        float * y = (float *) (yb + h * dst.nb[1]);
        const float2 c = cs_sh[i];
        const float x0 = x[i], x1 = x[i + half];
        y[i] = x0 * c.x - x1 * c.y;
        y[i + half] = x0 * c.y + x1 * c.x;
    }
    if (xb != yb || a.nb[1] != dst.nb[1]) {
        const int rest = (int) a.ne[0] - n_dims;
        for (int k = threadIdx.x; k < nh * rest; k += blockDim.x) {
            const int h = k / rest, i = n_dims + (k - h * rest);
            ((float *) (yb + h * dst.nb[1]))[i] = ((const float *) (xb + h * a.nb[1]))[i];
        }
    }
}

} // namespace

// Operands are checked by check_rope (op-checks.cpp); the factors' values are not read back.
void oomb_cuda_rope(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * pos, const oomb_tensor * ff) {
    const char * opn = oomb_op_name(dst->op);
    const int n_dims = dst->op_params[0];
    const double theta = oomb::get_op_f32(dst, 1);
    const int64_t nr = oomb_nrows(a);
    if (nr == 0) return;
    if (nr > 0x7fffffffll) oomb_error("%s: too many rows in %s", opn, shape_str(a).c_str());
    const float sign = dst->op == OOMB_OP_ROPE_BACK ? -1.0f : 1.0f;
    const float * ffd = ff ? (const float *) ff->data : nullptr;
    const oomb_tv tv_dst = oomb_make_tv(dst), tv_a = oomb_make_tv(a), tv_pos = oomb_make_tv(pos);
    const int64_t n_tok = a->ne[2] * a->ne[3];
    if (a->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float) && a->ne[1] * (n_dims / 2) <= (int64_t) 1 << 24 && n_dims <= 8192 &&
        n_tok <= 0x7fffffffll) {
        int th = 32;
        while (th < 256 && th < a->ne[1] * (n_dims / 2)) th *= 2;
        const size_t sh = (size_t) (n_dims / 2) * sizeof(float2);
        if (ffd) k_rope_tok<true><<<(unsigned) n_tok, th, sh, c.stream>>>(tv_dst, tv_a, tv_pos, n_dims, theta, sign, ffd);
        else k_rope_tok<false><<<(unsigned) n_tok, th, sh, c.stream>>>(tv_dst, tv_a, tv_pos, n_dims, theta, sign, nullptr);
    } else {
        int th = 32;
        while (th < 256 && th < n_dims / 2) th *= 2;
        if (ffd) k_rope<true><<<(unsigned) nr, th, 0, c.stream>>>(tv_dst, tv_a, tv_pos, n_dims, theta, sign, ffd);
        else k_rope<false><<<(unsigned) nr, th, 0, c.stream>>>(tv_dst, tv_a, tv_pos, n_dims, theta, sign, nullptr);
    }
    OOMB_CUDA_LAUNCHED(c, opn);
}
