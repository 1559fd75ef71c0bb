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

// The table of a call's angles: tab[t][i] = rope_cs(pos[t], i) for the n_pos positions (dim 2) and
// half = n_dims / 2 pairs, one thread per entry (the double pow / sincos spread over the whole GPU,
// once per token instead of once per token and head).
template <bool HAS_FF>
__global__ void k_rope_table(float2 * __restrict__ tab, oomb_tv pos, int64_t n_pos, int half, int n_dims, double theta, float sign,
                             const float * ff) {
    const int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (k >= n_pos * half) return;
    const int64_t t = k / half;
    const int i = (int) (k - t * half);
    const double p = (double) *(const int32_t *) (pos.d + oomb_flat_off<uint64_t>(pos, (uint64_t) t));
    tab[k] = rope_cs<HAS_FF>(p, i, n_dims, theta, sign, ff);
}

template <int V> struct vecf;
template <> struct vecf<1> { using T = float; };
template <> struct vecf<2> { using T = float2; };
template <> struct vecf<4> { using T = float4; };

// Rotation of whole rows (n_dims == ne0) from the table: thread k takes V consecutive pairs (i .. i +
// V - 1 with their partners at + half) of row (token, head) k / (half / V), V-wide loads and stores.
// The same products as k_rope (x0 c - x1 s, x0 s + x1 c).
template <int V>
__global__ void k_rope_apply(oomb_tv dst, oomb_tv a, const float2 * __restrict__ tab, int half, int64_t n_items) {
    using VT = typename vecf<V>::T;
    const int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (k >= n_items) return;
    const int hv = half / V;
    const int64_t row = k / hv;
    const int i = (int) (k - row * hv) * V;
    const int64_t h = row % a.ne[1], tt = row / a.ne[1], i2 = tt % a.ne[2], i3 = tt / a.ne[2];
    const float * x = (const float *) (a.d + h * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
    float * y = (float *) (dst.d + h * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3]);
    const float2 * c = tab + i2 * half + i;
    float x0[V], x1[V], y0[V], y1[V];
    *(VT *) x0 = *(const VT *) (x + i);
    *(VT *) x1 = *(const VT *) (x + i + half);
#pragma unroll
    for (int v = 0; v < V; v++) {
        const float2 cs = c[v];
        y0[v] = x0[v] * cs.x - x1[v] * cs.y;
        y1[v] = x0[v] * cs.y + x1[v] * cs.x;
    }
    *(VT *) (y + i) = *(const VT *) y0;
    *(VT *) (y + i + half) = *(const VT *) y1;
}

// rows of t (dims 1..3) start at multiples of `align` bytes
bool rows_aligned(const oomb_tensor * t, size_t align) {
    if ((uintptr_t) t->data % align != 0) return false;
    for (int i = 1; i < 4; i++)
        if (t->ne[i] > 1 && t->nb[i] % align != 0) return false;
    return true;
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
    const int half = n_dims / 2;
    // whole rows rotated (Qwen2, Llama): the angles once per token into a table (at most 256 MiB of
    // scratch: 1M positions at head dim 64; else, or when the device has no room, the kernels below),
    // then a streaming pass
    const int64_t n_tab = a->ne[2] * (int64_t) half;
    float2 * tab = nullptr;
    if (a->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float) && n_dims == a->ne[0] && n_tab <= ((int64_t) 1 << 25))
        tab = (float2 *) c.try_scratch(oomb_cuda_ctx::SLOT_K0, (size_t) n_tab * sizeof(float2));
    if (tab) {
        const int V = half % 4 == 0 && rows_aligned(a, 16) && rows_aligned(dst, 16) ? 4
                      : half % 2 == 0 && rows_aligned(a, 8) && rows_aligned(dst, 8) ? 2
                                                                                     : 1;
        const unsigned g1 = (unsigned) ((n_tab + 255) / 256);
        if (ffd) k_rope_table<true><<<g1, 256, 0, c.stream>>>(tab, tv_pos, a->ne[2], half, n_dims, theta, sign, ffd);
        else k_rope_table<false><<<g1, 256, 0, c.stream>>>(tab, tv_pos, a->ne[2], half, n_dims, theta, sign, nullptr);
        OOMB_CUDA_LAUNCHED(c, opn);
        const int64_t n_items = nr * (half / V);
        const unsigned g2 = (unsigned) ((n_items + 255) / 256);
        if (V == 4) k_rope_apply<4><<<g2, 256, 0, c.stream>>>(tv_dst, tv_a, tab, half, n_items);
        else if (V == 2) k_rope_apply<2><<<g2, 256, 0, c.stream>>>(tv_dst, tv_a, tab, half, n_items);
        else k_rope_apply<1><<<g2, 256, 0, c.stream>>>(tv_dst, tv_a, tab, half, n_items);
        OOMB_CUDA_LAUNCHED(c, opn);
        return;
    }
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
