// Reference attention (see attn.cuh).
//
// Forward: one block per query row (h, t, b); keys in chunks of blockDim: each thread scores one key
// (a serial dot product), then an online-softmax update of the row's output accumulator (each thread
// owns dimensions i = tid, tid + blockDim, ...).
// Backward: pass 1, one block per query row: the forward again for m, l and O, delta = dout . O,
// then dq = scale * sum_j p_j (dp_j - delta) k_j; saves lse and delta. Pass 2, one block per key row
// (g, j, b): dk_j = scale * sum ds q, dv_j = sum p dout over the group's heads and the queries that
// see key j. Every output row has one writer.

#include "attn.cuh"
#include "op-checks.h"

using oomb::shape_str;

namespace {

const int k_threads = 128;

using dims = oomb::attn_dims;  // src/op-checks.h

__device__ __forceinline__ const float * row(const oomb_tv & t, int64_t i1, int64_t i2, int64_t i3) {
    return (const float *) (t.d + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]);
}
__device__ __forceinline__ float dot(const float * a, const float * b, int64_t n) {
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

// Online-softmax forward for query row (h, t, b): leaves the unnormalized output in acc (shared,
// D floats), and returns m and l.
__device__ void attn_row(const dims & d, const oomb_tv & k, const oomb_tv & v, const float * sq, float scale, int64_t h, int64_t t,
                         int64_t b, float * acc, float * sp, float * sh, float & m_out, float & l_out) {
    const int64_t g = h / d.G;
    const int64_t nk = t + (d.S - d.T) + 1;
    const int64_t D = d.D;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = 0; j0 < nk; j0 += blockDim.x) {
        const int64_t j = j0 + threadIdx.x;
        const float s = j < nk ? scale * dot(sq, row(k, g, j, b), D) : -INFINITY;
        const float cm = oomb_block_max(s, sh);
        const float mn = fmaxf(m, cm);
        const float p = j < nk ? expf(s - mn) : 0.0f;
        sp[threadIdx.x] = p;
        const float ps = oomb_block_sum(p, sh); // its barriers also publish sp
        const float alpha = expf(m - mn);      // m = -inf on the first chunk: 0
        l = l * alpha + ps;
        const int64_t nc = min((int64_t) blockDim.x, nk - j0);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float a = acc[i] * alpha;
            for (int64_t jj = 0; jj < nc; jj++) a += sp[jj] * row(v, g, j0 + jj, b)[i];
            acc[i] = a;
        }
        m = mn;
        __syncthreads(); // sp is rewritten by the next chunk
    }
    m_out = m;
    l_out = l;
}

__global__ void k_attn(oomb_tv dst, oomb_tv q, oomb_tv k, oomb_tv v, dims d, float scale) {
    extern __shared__ float smem[];
    __shared__ float sh[32];
    float * sq = smem;            // D
    float * acc = sq + d.D;       // D
    float * sp = acc + d.D;       // blockDim
    const int64_t r = blockIdx.x;
    const int64_t h = r % d.H, t = (r / d.H) % d.T, b = r / (d.H * d.T);
    const float * qr = row(q, h, t, b);
    for (int64_t i = threadIdx.x; i < d.D; i += blockDim.x) sq[i] = qr[i];
    __syncthreads();
    float m, l;
    attn_row(d, k, v, sq, scale, h, t, b, acc, sp, sh, m, l);
    float * o = (float *) (dst.d + h * dst.nb[1] + t * dst.nb[2] + b * dst.nb[3]);
    const float inv = 1.0f / l;
    for (int64_t i = threadIdx.x; i < d.D; i += blockDim.x) o[i] = acc[i] * inv;
}

// Pass 1 of the backward: dq and the per-row lse / delta.
__global__ void k_attn_back_q(float * dq, float * lse, float * delta, oomb_tv q, oomb_tv k, oomb_tv v, oomb_tv dout, dims d, float scale) {
    extern __shared__ float smem[];
    __shared__ float sh[32];
    float * sq = smem;        // D
    float * acc = sq + d.D;   // D (O, then dq)
    float * sg = acc + d.D;   // D (dout row)
    float * sp = sg + d.D;    // blockDim
    const int64_t r = blockIdx.x;
    const int64_t h = r % d.H, t = (r / d.H) % d.T, b = r / (d.H * d.T);
    const int64_t D = d.D, g = h / d.G;
    const float * qr = row(q, h, t, b);
    const float * gr = row(dout, h, t, b);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) { sq[i] = qr[i]; sg[i] = gr[i]; }
    __syncthreads();
    float m, l;
    attn_row(d, k, v, sq, scale, h, t, b, acc, sp, sh, m, l);
    const float inv = 1.0f / l;
    float dl = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) dl += sg[i] * acc[i] * inv;
    dl = oomb_block_sum(dl, sh);
    const float ls = m + logf(l);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) acc[i] = 0.0f;
    const int64_t nk = t + (d.S - d.T) + 1;
    for (int64_t j0 = 0; j0 < nk; j0 += blockDim.x) {
        const int64_t j = j0 + threadIdx.x;
        float ds = 0.0f;
        if (j < nk) {
            const float p = expf(scale * dot(sq, row(k, g, j, b), D) - ls);
            ds = p * (dot(sg, row(v, g, j, b), D) - dl);
        }
        sp[threadIdx.x] = ds;
        __syncthreads();
        const int64_t nc = min((int64_t) blockDim.x, nk - j0);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float a = acc[i];
            for (int64_t jj = 0; jj < nc; jj++) a += sp[jj] * row(k, g, j0 + jj, b)[i];
            acc[i] = a;
        }
        __syncthreads();
    }
    float * o = dq + r * D;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) o[i] = scale * acc[i];
    if (threadIdx.x == 0) {
        lse[r] = ls;
        delta[r] = dl;
    }
}

// Pass 2 of the backward: dk, dv for key row (g, j, b).
__global__ void k_attn_back_kv(float * dk, float * dv, const float * lse, const float * delta, oomb_tv q, oomb_tv k, oomb_tv v,
                               oomb_tv dout, dims d, float scale) {
    extern __shared__ float smem[];
    const int64_t D = d.D;
    float * sk = smem;        // D
    float * sv = sk + D;      // D
    float * ak = sv + D;      // D
    float * av = ak + D;      // D
    float * sp = av + D;      // blockDim
    float * sds = sp + blockDim.x;                  // blockDim
    int64_t * srow = (int64_t *) (sds + blockDim.x); // blockDim (query row index h + H*(t + T*b))
    const int64_t r = blockIdx.x;
    const int64_t g = r % d.Hkv, j = (r / d.Hkv) % d.S, b = r / (d.Hkv * d.S);
    const float * kr = row(k, g, j, b);
    const float * vr = row(v, g, j, b);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) { sk[i] = kr[i]; sv[i] = vr[i]; ak[i] = 0.0f; av[i] = 0.0f; }
    __syncthreads();
    int64_t t0 = j - (d.S - d.T);
    if (t0 < 0) t0 = 0;
    const int64_t nt = d.T - t0;
    const int64_t npairs = d.G * (nt > 0 ? nt : 0);
    for (int64_t p0 = 0; p0 < npairs; p0 += blockDim.x) {
        const int64_t pi = p0 + threadIdx.x;
        float p = 0.0f, ds = 0.0f;
        int64_t rr = 0;
        if (pi < npairs) {
            const int64_t hh = pi / nt, t = t0 + pi % nt;
            const int64_t h = g * d.G + hh;
            rr = h + d.H * (t + d.T * b);
            p = expf(scale * dot(row(q, h, t, b), sk, D) - lse[rr]);
            ds = p * (dot(row(dout, h, t, b), sv, D) - delta[rr]);
        }
        sp[threadIdx.x] = p;
        sds[threadIdx.x] = ds;
        srow[threadIdx.x] = rr;
        __syncthreads();
        const int64_t nc = min((int64_t) blockDim.x, npairs - p0);
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float a1 = ak[i], a2 = av[i];
            for (int64_t c = 0; c < nc; c++) {
                const int64_t rw = srow[c];
                const int64_t h = rw % d.H, t = (rw / d.H) % d.T;
                a1 += sds[c] * row(q, h, t, b)[i];
                a2 += sp[c] * row(dout, h, t, b)[i];
            }
            ak[i] = a1;
            av[i] = a2;
        }
        __syncthreads();
    }
    float * okr = dk + ((b * d.S + j) * d.Hkv + g) * D;
    float * ovr = dv + ((b * d.S + j) * d.Hkv + g) * D;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        okr[i] = scale * ak[i];
        ovr[i] = av[i];
    }
}

void set_smem(const void * fn, size_t bytes, const char * op) {
    if (bytes > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes));
    (void) op;
}

} // namespace

void oomb_cuda_attn(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v) {
    const dims d = oomb::attn_dims_of(q, k);  // operands: check_op_operands (src/op-checks.cpp)
    const int64_t n_rows = d.H * d.T * d.B;
    if (oomb_nelements(dst) == 0 || n_rows == 0) return;
    if (n_rows > 0x7fffffffll) oomb_error("attn: too many query rows in %s", shape_str(q).c_str());
    const size_t smem = (size_t) (2 * d.D + k_threads) * sizeof(float);
    set_smem((const void *) k_attn, smem, "attn");
    k_attn<<<(unsigned) n_rows, k_threads, smem, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(q), oomb_make_tv(k), oomb_make_tv(v), d,
                                                            oomb::get_op_f32(dst, 0));
    OOMB_CUDA_LAUNCHED(c, "attn");
}

void oomb_cuda_attn_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v,
                         const oomb_tensor * dout) {
    const dims d = oomb::attn_dims_of(q, k);  // operands: check_op_operands (src/op-checks.cpp)
    const int64_t nq = oomb_nelements(q), nk = oomb_nelements(k);
    if (oomb_nelements(dst) != nq + 2 * nk || !oomb_is_contiguous(dst)) {
        oomb_error("attn_back: result %s must be contiguous with %lld elements", shape_str(dst).c_str(), (long long) (nq + 2 * nk));
    }
    const float scale = oomb::get_op_f32(dst, 0);
    float * dq = (float *) dst->data;
    float * dk = dq + nq;
    float * dv = dk + nk;
    if (nq == 0) {
        if (nk > 0) CUDA_CHECK(cudaMemsetAsync(dk, 0, (size_t) (2 * nk) * sizeof(float), c.stream));
        return;
    }
    const int64_t n_rows = d.H * d.T * d.B, n_krows = d.Hkv * d.S * d.B;
    if (n_rows > 0x7fffffffll || n_krows > 0x7fffffffll) oomb_error("attn_back: too many rows in q %s / k %s", shape_str(q).c_str(), shape_str(k).c_str());
    float * stats = (float *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) n_rows * 2 * sizeof(float));
    float * lse = stats;
    float * delta = stats + n_rows;
    const oomb_tv tq = oomb_make_tv(q), tk = oomb_make_tv(k), tv = oomb_make_tv(v), tg = oomb_make_tv(dout);

    const size_t smem1 = (size_t) (3 * d.D + k_threads) * sizeof(float);
    set_smem((const void *) k_attn_back_q, smem1, "attn_back");
    k_attn_back_q<<<(unsigned) n_rows, k_threads, smem1, c.stream>>>(dq, lse, delta, tq, tk, tv, tg, d, scale);
    OOMB_CUDA_LAUNCHED(c, "attn_back (dq)");

    if (n_krows == 0) return;
    const size_t smem2 = (size_t) (4 * d.D + 2 * k_threads) * sizeof(float) + (size_t) k_threads * sizeof(int64_t);
    set_smem((const void *) k_attn_back_kv, smem2, "attn_back");
    k_attn_back_kv<<<(unsigned) n_krows, k_threads, smem2, c.stream>>>(dk, dv, lse, delta, tq, tk, tv, tg, d, scale);
    OOMB_CUDA_LAUNCHED(c, "attn_back (dk, dv)");
}
