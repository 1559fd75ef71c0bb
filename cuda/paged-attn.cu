// Paged flash attention on CUDA: forward and backward of oomb_paged_attn (see oomb.h), computing the
// same function as the CPU reference kernels of src/paged-cpu.cpp.
//
// Fast path (bf16 pools, head dim 64 or 128, any page size): FlashAttention-2 style kernels on the
// tensor cores (mma.sync m16n8k16 bf16 -> f32, ldmatrix, cp.async double buffering).
//   - forward: one block = a tile of BM query rows of one GQA group (the rows are (token, head)
//     pairs of the group, so the G query heads sharing a KV head reuse every K/V tile) against the
//     keys 0..max pos of its rows, 64 keys at a time, read through the page table (one page-table
//     lookup per key row); online softmax in f32 with exp2; causal mask per row (key <= pos[t]).
//     The op's node is packed (oomb.h): out [T][H][D], then each row's log-sum-exp in natural-log
//     units, (m + log2 l) * ln 2 (the kernel's scores are in log2 units: s * scale * log2 e); the
//     backward reads both (FlashAttention-2 keeps L = m + log l the same way).
//   - backward: (1) a prep kernel converts q and dout to bf16 in group-row order and, when the op has
//     the forward's node (src[8]), computes each row's delta = bf16(dout) . out from the saved out and
//     converts the saved LSE to log2 units, in the backward's row order; a meta kernel finds, per
//     tile of rows, the min/max position; (2) only without saved statistics (src[8] NULL, or saved
//     out not 16-byte aligned): the forward kernel in "lse" mode recomputes each row's log-sum-exp
//     and delta; (3) a key-major kernel owns a tile of 128 keys of one KV head, loops over the row
//     tiles that attend it, accumulates dK/dV in registers (no atomics: it alone writes those
//     gradient rows in this launch) and adds dQ = dS K into the f32 dq output with atomics; (4)
//     dk_cur/dv_cur are read back from the gradient pages at pos.
// On Hopper (an sm_90a build on a compute capability 9.0 GPU) the same forward and backward run on
// warpgroup MMA instead (paged-attn-sm90.inc: wgmma, 128-row / 128-key tiles; the forward needs a
// page size multiple of 128); OOMB_PAGED_ATTN_WGMMA=0 keeps the mma.sync kernels above.
// Generic path (f32 / f16 pools, other head dims up to 256, unaligned strides): simple f32 kernels,
// one warp per query row (forward, dq) or per key (dK/dV): exact f32 arithmetic like the CPU. Its
// forward saves the LSE too; its backward reads the saved LSE (and computes delta from the saved
// out) when the forward also ran the generic kernels, else it recomputes them in f32.

#include "paged-attn.cuh"
#include "common.cuh"
#include "wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#define PA_CHECK(call) CUDA_CHECK(call)   // the backend's error macros (common.cuh)
#define PA_LAUNCH_CHECK() PA_CHECK(cudaGetLastError())

namespace {

typedef __nv_bfloat16 bf16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------
// small device helpers
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void * p) { return (uint32_t) __cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void * src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// d += a * b (16x8x16, bf16 in, f32 accumulate)
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint4 pack8(float4 a, float4 b) {
    uint4 r;
    r.x = pack_bf16(a.x, a.y); r.y = pack_bf16(a.z, a.w);
    r.z = pack_bf16(b.x, b.y); r.w = pack_bf16(b.z, b.w);
    return r;
}

// Element offset of (row, col) in a [rows][D] bf16 tile whose 16-byte chunks are XOR-swizzled by
// row (conflict-free ldmatrix over 8 consecutive rows). Needs D >= 64.
template <int D> __device__ __forceinline__ int swz(int row, int col) {
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// Physical page of position p (-1 when unmapped or out of range).
__device__ __forceinline__ int page_of(const int32_t * pt, int n_logical, int n_pages, int P, int p) {
    const int lp = p / P;
    if (p < 0 || lp >= n_logical) return -1;
    const int pg = pt[lp];
    return (pg >= 0 && pg < n_pages) ? pg : -1;
}

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<bf16>(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Geometry (host)
// ---------------------------------------------------------------------------------------------

struct Geom {
    int D, H, Hkv, T, P, n_pages, n_logical, G;
    const int32_t * pt;
    const int32_t * pos;
};

static Geom make_geom(const oomb_tensor * q, const oomb_tensor * pages, const oomb_tensor * pt, const oomb_tensor * pos) {
    Geom g;
    g.D = (int) q->ne[0]; g.H = (int) q->ne[1]; g.T = (int) q->ne[2];
    g.Hkv = (int) pages->ne[1]; g.P = (int) pages->ne[2]; g.n_pages = (int) pages->ne[3];
    g.n_logical = (int) oomb_nelements(pt);
    g.G = g.H / g.Hkv;
    g.pt = (const int32_t *) pt->data;
    g.pos = (const int32_t *) pos->data;
    return g;
}

// ---------------------------------------------------------------------------------------------
// store k_cur / v_cur into the pools at pos
// ---------------------------------------------------------------------------------------------

template <typename KT>
__global__ void pa_store_kernel(const char * kc, const char * vc, size_t c_nb0, size_t c_nb1, size_t c_nb2,
                                char * kp, char * vp, size_t p_nb0, size_t p_nb1, size_t p_nb2, size_t p_nb3,
                                const int32_t * pt, const int32_t * pos, int n_logical, int n_pages, int P, int D, int Hkv, int T) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t) D * Hkv * T) return;
    const int d = (int) (i % D), g = (int) ((i / D) % Hkv), t = (int) (i / ((int64_t) D * Hkv));
    const int p = pos[t];
    const int pg = page_of(pt, n_logical, n_pages, P, p);
    if (pg < 0) return;
    const size_t so = d * c_nb0 + g * c_nb1 + t * c_nb2;
    const size_t po = (size_t) pg * p_nb3 + (size_t) (p % P) * p_nb2 + g * p_nb1 + d * p_nb0;
    *(KT *) (kp + po) = from_f32<KT>(*(const float *) (kc + so));
    *(KT *) (vp + po) = from_f32<KT>(*(const float *) (vc + so));
}

// ---------------------------------------------------------------------------------------------
// Fast forward (bf16 pools, tensor cores)
// ---------------------------------------------------------------------------------------------

enum { MODE_OUT = 0, MODE_LSE = 1 };

struct FwdArgs {
    const float * q; int64_t q_s1, q_s2;             // strides in floats
    const bf16 * kp; const bf16 * vp; int64_t kv_s1, kv_s2, kv_s3; // strides in elements
    const int32_t * pt; int n_logical, n_pages, P;
    const int32_t * pos;
    int T, H, G;
    float c;                                          // scale * log2(e)
    float * out;                                      // MODE_OUT: [T][H][D]
    float * lse_out;                                  // MODE_OUT: [T][H], natural-log units (the op's saved LSE)
    const float * dout; int64_t do_s1, do_s2;         // MODE_LSE
    float * lse; float * delta; int64_t lse_stride;   // MODE_LSE: [g * lse_stride + R], lse in log2 units
};

template <int D, int WM, int BN, int NW>
struct FwdCfg {
    static constexpr int BM = NW * 16 * WM;
    static constexpr size_t smem = (size_t) (BM * D + 4 * BN * D) * sizeof(bf16) + BM * sizeof(int);
};

template <int D, int WM, int BN, int NW, int MODE, int MINB = 1>
__global__ void __launch_bounds__(NW * 32, MINB) pa_fwd_kernel(const FwdArgs a) {
    constexpr int BM = NW * 16 * WM;
    constexpr int NCH = D / 8;
    constexpr int NT = NW * 32;
    static_assert((BN * NCH) % NT == 0, "K/V tile load");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 * sQ = (bf16 *) smem;
    bf16 * sK = sQ + BM * D;
    bf16 * sV = sK + 2 * BN * D;
    int * sPos = (int *) (sV + 2 * BN * D);
    __shared__ int sMax, sMin;

    const int g = blockIdx.y;
    const int rt = gridDim.x - 1 - blockIdx.x; // heaviest tiles (largest positions) first
    const int TG = a.T * a.G;
    const int r0 = rt * BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    if (tid == 0) { sMax = -1; sMin = INT_MAX; }
    __syncthreads();
    for (int i = tid; i < BM; i += NT) {
        const int R = r0 + i;
        int p = -1;
        if (R < TG) {
            p = a.pos[R / a.G];
            atomicMax(&sMax, p);
            atomicMin(&sMin, p);
        }
        sPos[i] = p;
    }
    for (int idx = tid; idx < BM * NCH; idx += NT) {
        const int row = idx / NCH, ch = idx % NCH;
        const int R = r0 + row;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (R < TG) {
            const int t = R / a.G, h = g * a.G + R % a.G;
            const float4 * src = (const float4 *) (a.q + t * a.q_s2 + h * a.q_s1 + ch * 8);
            v = pack8(src[0], src[1]);
        }
        *(uint4 *) (sQ + swz<D>(row, ch * 8)) = v;
    }
    __syncthreads();
    const int maxp = sMax, minp = sMin;
    if (maxp < 0) return;
    const int n_tiles = maxp / BN + 1;

    // A tile of BN keys lies in one page (host checks P % BN == 0): one page-table lookup per tile,
    // issued a tile ahead so that its latency hides behind the current tile's math.
    auto tile_page = [&](int tile) -> int {
        return page_of(a.pt, a.n_logical, a.n_pages, a.P, tile * BN);
    };
    auto load_kv = [&](int tile, int buf, int pg) {
        const int k0 = tile * BN;
        bf16 * dK = sK + buf * BN * D;
        bf16 * dV = sV + buf * BN * D;
        const int64_t base = (int64_t) pg * a.kv_s3 + (int64_t) (k0 % a.P) * a.kv_s2 + (int64_t) g * a.kv_s1;
#pragma unroll
        for (int i = 0; i < BN * NCH / NT; i++) {
            const int idx = tid + i * NT;
            const int row = idx / NCH, ch = idx % NCH;
            const bool ok = pg >= 0 && k0 + row <= maxp;
            const int64_t off = ok ? base + (int64_t) row * a.kv_s2 + ch * 8 : 0;
            cp_async16(smem_u32(dK + swz<D>(row, ch * 8)), a.kp + off, ok ? 16 : 0);
            cp_async16(smem_u32(dV + swz<D>(row, ch * 8)), a.vp + off, ok ? 16 : 0);
        }
    };

    float o[WM][D / 8][4];
    float m[WM][2], l[WM][2];
    int prow[WM][2];
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
#pragma unroll
        for (int nb = 0; nb < D / 8; nb++) o[mt][nb][0] = o[mt][nb][1] = o[mt][nb][2] = o[mt][nb][3] = 0.0f;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            m[mt][hf] = -INFINITY; l[mt][hf] = 0.0f;
            prow[mt][hf] = sPos[warp * WM * 16 + mt * 16 + (lane >> 2) + hf * 8];
        }
    }

    load_kv(0, 0, tile_page(0));
    cp_async_commit();
    int pg_next = n_tiles > 1 ? tile_page(1) : -1;
    for (int it = 0; it < n_tiles; it++) {
        const int buf = it & 1;
        if (it + 1 < n_tiles) load_kv(it + 1, buf ^ 1, pg_next);
        pg_next = it + 2 < n_tiles ? tile_page(it + 2) : -1;
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 * cK = sK + buf * BN * D;
        const bf16 * cV = sV + buf * BN * D;

        float s[WM][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++)
#pragma unroll
            for (int nb = 0; nb < BN / 8; nb++) s[mt][nb][0] = s[mt][nb][1] = s[mt][nb][2] = s[mt][nb][3] = 0.0f;

#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t af[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++)
                ldsm_x4(af[mt], smem_u32(sQ + swz<D>(warp * WM * 16 + mt * 16 + (lane & 15), kk * 16 + ((lane >> 4) << 3))));
#pragma unroll
            for (int nb2 = 0; nb2 < BN / 16; nb2++) {
                uint32_t b[4];
                ldsm_x4(b, smem_u32(cK + swz<D>(nb2 * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + (((lane >> 3) & 1) << 3))));
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16(s[mt][2 * nb2], af[mt], b[0], b[1]);
                    mma_bf16(s[mt][2 * nb2 + 1], af[mt], b[2], b[3]);
                }
            }
        }

        const int k0 = it * BN;
        const bool need_mask = k0 + BN - 1 > minp;
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nb = 0; nb < BN / 8; nb++) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float v = s[mt][nb][hf * 2 + j] * a.c;
                        if (need_mask) {
                            const int kp = k0 + nb * 8 + (lane & 3) * 2 + j;
                            if (kp > prow[mt][hf]) v = -INFINITY;
                        }
                        s[mt][nb][hf * 2 + j] = v;
                        mx = fmaxf(mx, v);
                    }
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[mt][hf], mx);
                const float muse = mnew == -INFINITY ? 0.0f : mnew;
                const float corr = ex2(m[mt][hf] - muse);
                m[mt][hf] = mnew;
                float rs = 0.0f;
#pragma unroll
                for (int nb = 0; nb < BN / 8; nb++) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const float p = ex2(s[mt][nb][hf * 2 + j] - muse);
                        s[mt][nb][hf * 2 + j] = p;
                        rs += p;
                    }
                }
                l[mt][hf] = l[mt][hf] * corr + rs;
#pragma unroll
                for (int nb = 0; nb < D / 8; nb++) { o[mt][nb][hf * 2] *= corr; o[mt][nb][hf * 2 + 1] *= corr; }
            }
        }

#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dn2 = 0; dn2 < D / 16; dn2++) {
                uint32_t b[4];
                ldsm_x4_t(b, smem_u32(cV + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dn2 * 16 + ((lane >> 4) << 3))));
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    mma_bf16(o[mt][2 * dn2], pa[mt], b[0], b[1]);
                    mma_bf16(o[mt][2 * dn2 + 1], pa[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }

    // epilogue
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float lsum = l[mt][hf];
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
            const int row = warp * WM * 16 + mt * 16 + (lane >> 2) + hf * 8;
            const int R = r0 + row;
            const bool valid = R < TG;
            const int t = valid ? R / a.G : 0, h = g * a.G + (valid ? R % a.G : 0);
            if (MODE == MODE_OUT) {
                if (valid) {
                    float * dst = a.out + ((int64_t) t * a.H + h) * D + (lane & 3) * 2;
#pragma unroll
                    for (int nb = 0; nb < D / 8; nb++)
                        *(float2 *) (dst + nb * 8) = make_float2(o[mt][nb][hf * 2] * inv, o[mt][nb][hf * 2 + 1] * inv);
                    if ((lane & 3) == 0) {
                        // as the MODE_LSE epilogue below (log2 units), then in natural-log units;
                        // a row without keys: -inf
                        const float mu = m[mt][hf] == -INFINITY ? 0.0f : m[mt][hf];
                        a.lse_out[(int64_t) t * a.H + h] = (mu + __log2f(lsum)) * kLn2;
                    }
                }
            } else {
                float dot = 0.0f;
                if (valid) {
                    const float * dov = a.dout + t * a.do_s2 + h * a.do_s1 + (lane & 3) * 2;
#pragma unroll
                    for (int nb = 0; nb < D / 8; nb++) {
                        const float2 x = *(const float2 *) (dov + nb * 8);
                        // dout rounded to bf16 as the backward kernel uses it: keeps delta = sum_j P dP
                        const float x0 = __bfloat162float(__float2bfloat16_rn(x.x));
                        const float x1 = __bfloat162float(__float2bfloat16_rn(x.y));
                        dot += x0 * o[mt][nb][hf * 2] + x1 * o[mt][nb][hf * 2 + 1];
                    }
                }
                dot += __shfl_xor_sync(0xffffffffu, dot, 1);
                dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                if (valid && (lane & 3) == 0) {
                    const float mu = m[mt][hf] == -INFINITY ? 0.0f : m[mt][hf];
                    a.lse[g * a.lse_stride + R] = mu + __log2f(lsum);
                    a.delta[g * a.lse_stride + R] = dot * inv;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fast backward (bf16 pools, tensor cores)
// ---------------------------------------------------------------------------------------------

struct BwdArgs {
    const bf16 * qb; const bf16 * dob;        // [Hkv][TGp][D], rows R = t * G + hh
    const float * lse; const float * delta;   // [Hkv][TGp]
    const int * rowpos;                       // [TGp] (-1 for padding rows)
    const int * rt_max; const int * rt_min;   // [n_rt] per tile of BM rows
    const int * maxpos;                       // [1]
    int n_rt;
    const bf16 * kp; const bf16 * vp; int64_t kv_s1, kv_s2, kv_s3;   // elements
    float * dkp; float * dvp; int64_t gr_s1, gr_s2, gr_s3;          // floats
    const int32_t * pt; int n_logical, n_pages, P;
    int T, H, G, TGp;
    float c, scale;
    float * dq;                               // [T][H][D] f32, accumulated with atomics
    int nsplit;                               // blocks per key tile (blockIdx.z): each takes every
                                              // nsplit-th row tile; > 1: dK/dV added with atomics
};

template <int D, int BM, int NW>
struct BwdCfg {
    static constexpr int BN = NW * 16;
    static constexpr int SDS = BM + 8;
    static constexpr size_t smem = (size_t) (2 * BN * D + 4 * BM * D + BN * SDS) * sizeof(bf16) + 6 * BM * sizeof(float);
};

template <int D, int BM, int NW, int MINB = 1>
__global__ void __launch_bounds__(NW * 32, MINB) pa_bwd_kernel(const BwdArgs a) {
    constexpr int BN = NW * 16;
    constexpr int NCH = D / 8;
    constexpr int NT = NW * 32;
    constexpr int SDS = BM + 8;
    constexpr int TM = BM / 16;                  // m-tiles of the dQ product
    constexpr int NBW = TM * (D / 8) / NW;       // n-blocks (of 8 dims) per warp in the dQ product
    static_assert(NBW % 2 == 0 && NBW >= 2, "dQ partition");
    static_assert((D / 8) % NBW == 0, "dQ partition");
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 * sK = (bf16 *) smem;
    bf16 * sV = sK + BN * D;
    bf16 * sQ = sV + BN * D;          // [2][BM*D]
    bf16 * sdO = sQ + 2 * BM * D;     // [2][BM*D]
    bf16 * sdS = sdO + 2 * BM * D;    // [BN][SDS]  (dS transposed: keys x rows)
    float * sL = (float *) (sdS + BN * SDS); // [2][BM]
    float * sDl = sL + 2 * BM;               // [2][BM]
    int * sRp = (int *) (sDl + 2 * BM);      // [2][BM]

    const int g = blockIdx.y;
    const int k0 = blockIdx.x * BN;
    const int maxp = *a.maxpos;
    if (k0 > maxp) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int TG = a.T * a.G;

    // K/V tile (zero rows past the last attended key)
    for (int idx = tid; idx < BN * NCH; idx += NT) {
        const int row = idx / NCH, ch = idx % NCH;
        const int p = k0 + row;
        const bf16 * srcK = a.kp;
        const bf16 * srcV = a.vp;
        int sz = 0;
        if (p <= maxp) {
            const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
            if (pg >= 0) {
                const int64_t off = (int64_t) pg * a.kv_s3 + (int64_t) (p % a.P) * a.kv_s2 + (int64_t) g * a.kv_s1 + ch * 8;
                srcK += off; srcV += off; sz = 16;
            }
        }
        cp_async16(smem_u32(sK + swz<D>(row, ch * 8)), srcK, sz);
        cp_async16(smem_u32(sV + swz<D>(row, ch * 8)), srcV, sz);
    }
    cp_async_commit();

    // this block's row tiles: z, z + nsplit, z + 2 nsplit, ... (those attending this key tile)
    const int zs = a.nsplit;
    auto next_rt = [&](int j) {
        while (j < a.n_rt && a.rt_max[j] < k0) j += zs;
        return j;
    };
    auto load_rows = [&](int j, int buf) {
        const int64_t base = (int64_t) g * a.TGp + (int64_t) j * BM;
        const bf16 * q = a.qb + base * D;
        const bf16 * d = a.dob + base * D;
        bf16 * dq_ = sQ + buf * BM * D;
        bf16 * dd_ = sdO + buf * BM * D;
        for (int idx = tid; idx < BM * NCH; idx += NT) {
            const int row = idx / NCH, ch = idx % NCH;
            cp_async16(smem_u32(dq_ + swz<D>(row, ch * 8)), q + row * D + ch * 8, 16);
            cp_async16(smem_u32(dd_ + swz<D>(row, ch * 8)), d + row * D + ch * 8, 16);
        }
        if (tid < BM / 4) cp_async16(smem_u32(sL + buf * BM + tid * 4), a.lse + base + tid * 4, 16);
        else if (tid < BM / 2) cp_async16(smem_u32(sDl + buf * BM + (tid - BM / 4) * 4), a.delta + base + (tid - BM / 4) * 4, 16);
        else if (tid < 3 * BM / 4) cp_async16(smem_u32(sRp + buf * BM + (tid - BM / 2) * 4), a.rowpos + (int64_t) j * BM + (tid - BM / 2) * 4, 16);
    };

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int nb = 0; nb < D / 8; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[nb][e] = dv[nb][e] = 0.0f;

    const int krow0 = warp * 16;
    int j = next_rt((int) blockIdx.z);
    int jn = j < a.n_rt ? next_rt(j + zs) : a.n_rt;
    if (j < a.n_rt) load_rows(j, 0);
    cp_async_commit();
    int buf = 0;
    while (j < a.n_rt) {
        if (jn < a.n_rt) load_rows(jn, buf ^ 1);
        cp_async_commit();
        // the tile after jn: its max position is loaded now and looked at after this step's math
        const int cand = jn + zs;
        const int cand_max = cand < a.n_rt ? a.rt_max[cand] : -1;
        const int rt_min_j = a.rt_min[j];
        cp_async_wait<1>();
        __syncthreads();
        const bf16 * cQ = sQ + buf * BM * D;
        const bf16 * cdO = sdO + buf * BM * D;
        const float * cL = sL + buf * BM;
        const float * cDl = sDl + buf * BM;
        const int * cRp = sRp + buf * BM;
        const bool need_mask = rt_min_j < k0 + BN - 1;

        // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and all BM rows
        float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
        for (int nb = 0; nb < BM / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[nb][e] = dpt[nb][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ak[4], av[4];
            const int aoff = swz<D>(krow0 + (lane & 15), kk * 16 + ((lane >> 4) << 3));
            ldsm_x4(ak, smem_u32(sK + aoff));
            ldsm_x4(av, smem_u32(sV + aoff));
#pragma unroll
            for (int nb2 = 0; nb2 < BM / 16; nb2++) {
                uint32_t bq[4], bo[4];
                const int boff = swz<D>(nb2 * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + (((lane >> 3) & 1) << 3));
                ldsm_x4(bq, smem_u32(cQ + boff));
                ldsm_x4(bo, smem_u32(cdO + boff));
                mma_bf16(st[2 * nb2], ak, bq[0], bq[1]);
                mma_bf16(st[2 * nb2 + 1], ak, bq[2], bq[3]);
                mma_bf16(dpt[2 * nb2], av, bo[0], bo[1]);
                mma_bf16(dpt[2 * nb2 + 1], av, bo[2], bo[3]);
            }
        }
        // P^T and dS^T (scaled)
#pragma unroll
        for (int nb = 0; nb < BM / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = nb * 8 + (lane & 3) * 2 + (e & 1);
                const int kp = k0 + krow0 + (lane >> 2) + ((e >> 1) << 3);
                float p = ex2(st[nb][e] * a.c - cL[qc]);
                if (need_mask && kp > cRp[qc]) p = 0.0f;
                st[nb][e] = p;
                dpt[nb][e] = p * (dpt[nb][e] - cDl[qc]) * a.scale;
            }
        }
        // dV += P^T dO, dK += dS^T Q
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t pa[4], da[4];
            pa[0] = pack_bf16(st[2 * kk][0], st[2 * kk][1]);
            pa[1] = pack_bf16(st[2 * kk][2], st[2 * kk][3]);
            pa[2] = pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]);
            pa[3] = pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3]);
            da[0] = pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]);
            da[1] = pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]);
            da[2] = pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
            da[3] = pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
            // dS^T to shared memory for the dQ product
            {
                const int r = krow0 + (lane >> 2);
                const int cc = kk * 16 + (lane & 3) * 2;
                *(uint32_t *) (sdS + r * SDS + cc) = da[0];
                *(uint32_t *) (sdS + (r + 8) * SDS + cc) = da[1];
                *(uint32_t *) (sdS + r * SDS + cc + 8) = da[2];
                *(uint32_t *) (sdS + (r + 8) * SDS + cc + 8) = da[3];
            }
#pragma unroll
            for (int dn2 = 0; dn2 < D / 16; dn2++) {
                uint32_t bo[4], bq[4];
                const int boff = swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dn2 * 16 + ((lane >> 4) << 3));
                ldsm_x4_t(bo, smem_u32(cdO + boff));
                ldsm_x4_t(bq, smem_u32(cQ + boff));
                mma_bf16(dv[2 * dn2], pa, bo[0], bo[1]);
                mma_bf16(dv[2 * dn2 + 1], pa, bo[2], bo[3]);
                mma_bf16(dk[2 * dn2], da, bq[0], bq[1]);
                mma_bf16(dk[2 * dn2 + 1], da, bq[2], bq[3]);
            }
        }
        __syncthreads();
        // dQ (BM x D) += dS (BM x BN) K (BN x D): warp owns m-tile mt, n-blocks nbase .. nbase + NBW
        {
            const int mt = warp % TM, nbase = (warp / TM) * NBW;
            float acc[NBW][4];
#pragma unroll
            for (int n = 0; n < NBW; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t af[4];
                ldsm_x4_t(af, smem_u32(sdS + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * SDS + mt * 16 + (((lane >> 3) & 1) << 3)));
#pragma unroll
                for (int nn = 0; nn < NBW / 2; nn++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, smem_u32(sK + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), (nbase + nn * 2) * 8 + ((lane >> 4) << 3))));
                    mma_bf16(acc[2 * nn], af, b[0], b[1]);
                    mma_bf16(acc[2 * nn + 1], af, b[2], b[3]);
                }
            }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int R = j * BM + mt * 16 + (lane >> 2) + hf * 8;
                if (R < TG) {
                    const int t = R / a.G, h = g * a.G + R % a.G;
                    float * dst = a.dq + ((int64_t) t * a.H + h) * D + (lane & 3) * 2;
#pragma unroll
                    for (int n = 0; n < NBW; n++)
                        atomicAdd((float2 *) (dst + (nbase + n) * 8), make_float2(acc[n][hf * 2], acc[n][hf * 2 + 1]));
                }
            }
        }
        __syncthreads();
        const int jnn = cand >= a.n_rt ? a.n_rt : (cand_max >= k0 ? cand : next_rt(cand + zs));
        j = jn;
        jn = jnn;
        buf ^= 1;
    }
    cp_async_wait<0>();

    // add dK/dV into the gradient pages (with nsplit == 1 this block alone owns these rows in this
    // launch; otherwise the nsplit blocks of the key tile add with atomics)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int p = k0 + krow0 + (lane >> 2) + hf * 8;
        if (p > maxp) continue;
        const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
        if (pg < 0) continue;
        const int64_t off = (int64_t) pg * a.gr_s3 + (int64_t) (p % a.P) * a.gr_s2 + (int64_t) g * a.gr_s1 + (lane & 3) * 2;
        float * dkr = a.dkp + off;
        float * dvr = a.dvp + off;
        if (zs > 1) {
#pragma unroll
            for (int nb = 0; nb < D / 8; nb++) {
                atomicAdd((float2 *) (dkr + nb * 8), make_float2(dk[nb][hf * 2], dk[nb][hf * 2 + 1]));
                atomicAdd((float2 *) (dvr + nb * 8), make_float2(dv[nb][hf * 2], dv[nb][hf * 2 + 1]));
            }
            continue;
        }
#pragma unroll
        for (int nb = 0; nb < D / 8; nb++) {
            float2 x = *(float2 *) (dkr + nb * 8);
            x.x += dk[nb][hf * 2]; x.y += dk[nb][hf * 2 + 1];
            *(float2 *) (dkr + nb * 8) = x;
            float2 y = *(float2 *) (dvr + nb * 8);
            y.x += dv[nb][hf * 2]; y.y += dv[nb][hf * 2 + 1];
            *(float2 *) (dvr + nb * 8) = y;
        }
    }
}

#include "paged-attn-sm90.inc"

// Row positions, per-tile min/max and the global max position (one block).
__global__ void pa_meta_kernel(const int32_t * pos, int T, int G, int TGp, int BM, int * rowpos, int * rt_max, int * rt_min, int * maxpos) {
    __shared__ int smax;
    if (threadIdx.x == 0) smax = -1;
    __syncthreads();
    const int TG = T * G;
    int mx = -1;
    for (int R = threadIdx.x; R < TGp; R += blockDim.x) {
        const int p = R < TG ? pos[R / G] : -1;
        rowpos[R] = p;
        mx = max(mx, p);
    }
    atomicMax(&smax, mx);
    const int n_rt = TGp / BM;
    for (int j = threadIdx.x; j < n_rt; j += blockDim.x) {
        int lo = INT_MAX, hi = -1;
        for (int r = j * BM; r < (j + 1) * BM; r++) {
            const int p = r < TG ? pos[r / G] : -1;
            lo = min(lo, p);
            hi = max(hi, p);
        }
        rt_max[j] = hi;
        rt_min[j] = lo;
    }
    __syncthreads();
    if (threadIdx.x == 0) *maxpos = smax;
}

// q, dout (f32 [D, H, T] with strides) -> bf16 [Hkv][TGp][D] in group-row order; padding rows zero,
// and lse/delta of padding rows zero. With the forward's saved statistics (out_s: out [T][H][D],
// 16-byte aligned; lse_s: [T][H] natural log), also the lse (log2 units, as the backward kernel uses
// it) and delta = sum_d bf16(dout[d]) * out[d] of every row (dout rounded to bf16 as the backward
// kernel's dP uses it, as the MODE_LSE epilogue does). One thread per (row, 8 dims): the NCH
// threads of a row are consecutive lanes of one warp (NCH divides 32) and sum delta with shuffles.
template <int D>
__global__ void pa_prep_kernel(const float * q, int64_t q_s1, int64_t q_s2, const float * dout, int64_t do_s1, int64_t do_s2,
                               int T, int H, int G, int Hkv, int TGp, bf16 * qb, bf16 * dob, float * lse, float * delta,
                               const float * out_s, const float * lse_s) {
    constexpr int NCH = D / 8;
    static_assert(32 % NCH == 0, "a row's threads must lie in one warp");
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    // no early return: every lane of a warp takes part in the shuffles below
    const bool inb = i < (int64_t) Hkv * TGp * NCH;
    const int ch = (int) (i % NCH);
    const int64_t gr = i / NCH;              // g * TGp + R
    const int R = (int) (gr % TGp), g = (int) (gr / TGp);
    const int TG = T * G;
    const bool row = inb && R < TG;
    uint4 vq = make_uint4(0, 0, 0, 0), vd = make_uint4(0, 0, 0, 0);
    float dot = 0.0f;
    int64_t orow = 0;
    if (row) {
        const int t = R / G, h = g * G + R % G;
        const float4 * sq = (const float4 *) (q + t * q_s2 + h * q_s1 + ch * 8);
        const float4 * sd = (const float4 *) (dout + t * do_s2 + h * do_s1 + ch * 8);
        const float4 d0 = sd[0], d1 = sd[1];
        vq = pack8(sq[0], sq[1]);
        vd = pack8(d0, d1);
        if (out_s) {
            orow = (int64_t) t * H + h;
            const float4 * so = (const float4 *) (out_s + orow * D + ch * 8);
            const float4 o0 = so[0], o1 = so[1];
            auto r = [](float x) { return __bfloat162float(__float2bfloat16_rn(x)); };
            dot = r(d0.x) * o0.x + r(d0.y) * o0.y + r(d0.z) * o0.z + r(d0.w) * o0.w +
                  r(d1.x) * o1.x + r(d1.y) * o1.y + r(d1.z) * o1.z + r(d1.w) * o1.w;
        }
    }
    if (out_s) {
#pragma unroll
        for (int o = NCH / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    }
    if (!inb) return;
    if (row) {
        if (out_s && ch == 0) {
            lse[gr] = lse_s[orow] * kLog2e;
            delta[gr] = dot;
        }
    } else if (ch == 0) {
        lse[gr] = 0.0f;
        delta[gr] = 0.0f;
    }
    *(uint4 *) (qb + gr * D + ch * 8) = vq;
    *(uint4 *) (dob + gr * D + ch * 8) = vd;
}

// dk_cur / dv_cur [D, Hkv, T] from the gradient pages at pos.
__global__ void pa_readback_kernel(const float * dkp, const float * dvp, int64_t s1, int64_t s2, int64_t s3, const int32_t * pt,
                                   const int32_t * pos, int n_logical, int n_pages, int P, int D, int Hkv, int T, float * dkc, float * dvc) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t) D * Hkv * T) return;
    const int d = (int) (i % D), g = (int) ((i / D) % Hkv), t = (int) (i / ((int64_t) D * Hkv));
    const int p = pos[t];
    const int pg = page_of(pt, n_logical, n_pages, P, p);
    float vk = 0.0f, vv = 0.0f;
    if (pg >= 0) {
        const int64_t off = (int64_t) pg * s3 + (int64_t) (p % P) * s2 + (int64_t) g * s1 + d;
        vk = dkp[off];
        vv = dvp[off];
    }
    dkc[i] = vk;
    dvc[i] = vv;
}

// ---------------------------------------------------------------------------------------------
// Generic kernels (any pool type, D <= 256): exact f32, one warp per query row / per key
// ---------------------------------------------------------------------------------------------

constexpr int GMAX = 8; // D <= 32 * GMAX

struct GenArgs {
    const float * q; int64_t q_s1, q_s2;        // floats
    const char * kp; const char * vp; int64_t p_s0, p_s1, p_s2, p_s3;  // bytes
    const int32_t * pt; int n_logical, n_pages, P;
    const int32_t * pos;
    int D, T, H, G;
    float scale;
    float * out;                                 // [T][H][D]
    const float * dout; int64_t do_s1, do_s2;    // floats
    float * lse; float * delta;                  // [T*H] natural-log units (forward: the op's saved LSE)
    float * dkp; float * dvp; int64_t gr_s1, gr_s2, gr_s3; // floats
    const int * maxpos;
    int Hkv;
};

template <typename KT>
__device__ __forceinline__ float gload(const char * base, int64_t off, int64_t s0, int d) {
    return to_f32<KT>(*(const KT *) (base + off + d * s0));
}

// MODE_OUT: out and lse (the op's packed node); MODE_LSE: lse and delta (with dout)
template <typename KT, int MODE>
__global__ void pa_fwd_generic(const GenArgs a) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= (int64_t) a.T * a.H) return;
    const int t = (int) (r / a.H), h = (int) (r % a.H), g = h / a.G;
    float qv[GMAX], acc[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < a.D ? a.q[t * a.q_s2 + h * a.q_s1 + d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int pt_ = a.pos[t];
    for (int p = 0; p <= pt_; p++) {
        const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
        if (pg < 0) continue;
        const int64_t off = (int64_t) pg * a.p_s3 + (int64_t) (p % a.P) * a.p_s2 + (int64_t) g * a.p_s1;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) s += qv[i] * gload<KT>(a.kp, off, a.p_s0, d);
        }
        s = warp_sum(s) * a.scale;
        if (s > m) {
            const float c = expf(m - s);
            l *= c;
#pragma unroll
            for (int i = 0; i < GMAX; i++) acc[i] *= c;
            m = s;
        }
        const float w = expf(s - m);
        l += w;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) acc[i] += w * gload<KT>(a.vp, off, a.p_s0, d);
        }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (MODE == MODE_OUT) {
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) a.out[r * a.D + d] = acc[i] * inv;
        }
        if (lane == 0) a.lse[r] = m + logf(l);  // as MODE_LSE below; a row without keys: -inf
    } else {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) dot += a.dout[t * a.do_s2 + h * a.do_s1 + d] * acc[i] * inv;
        }
        dot = warp_sum(dot);
        if (lane == 0) {
            a.lse[r] = m + logf(l);
            a.delta[r] = dot;
        }
    }
}

// delta = dout . out per row from the forward's saved out [T][H][D] (one warp per row), with the
// same f32 sum as the MODE_LSE forward.
__global__ void pa_delta_generic(const GenArgs a, const float * out_s) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= (int64_t) a.T * a.H) return;
    const int t = (int) (r / a.H), h = (int) (r % a.H);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        if (d < a.D) dot += a.dout[t * a.do_s2 + h * a.do_s1 + d] * out_s[r * a.D + d];
    }
    dot = warp_sum(dot);
    if (lane == 0) a.delta[r] = dot;
}

template <typename KT>
__global__ void pa_dq_generic(const GenArgs a) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= (int64_t) a.T * a.H) return;
    const int t = (int) (r / a.H), h = (int) (r % a.H), g = h / a.G;
    float qv[GMAX], dov[GMAX], acc[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < a.D ? a.q[t * a.q_s2 + h * a.q_s1 + d] : 0.0f;
        dov[i] = d < a.D ? a.dout[t * a.do_s2 + h * a.do_s1 + d] : 0.0f;
        acc[i] = 0.0f;
    }
    const float lse = a.lse[r], delta = a.delta[r];
    for (int p = 0; p <= a.pos[t]; p++) {
        const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
        if (pg < 0) continue;
        const int64_t off = (int64_t) pg * a.p_s3 + (int64_t) (p % a.P) * a.p_s2 + (int64_t) g * a.p_s1;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) { s += qv[i] * gload<KT>(a.kp, off, a.p_s0, d); dp += dov[i] * gload<KT>(a.vp, off, a.p_s0, d); }
        }
        s = warp_sum(s);
        dp = warp_sum(dp);
        const float pr = expf(s * a.scale - lse);
        const float ds = pr * (dp - delta) * a.scale;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) acc[i] += ds * gload<KT>(a.kp, off, a.p_s0, d);
        }
    }
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        if (d < a.D) a.out[r * a.D + d] = acc[i];
    }
}

// one warp per (key position, kv head)
template <typename KT>
__global__ void pa_dkdv_generic(const GenArgs a, int64_t n_items) {
    const int lane = threadIdx.x & 31;
    const int64_t it = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (it >= n_items) return;
    const int p = (int) (it / a.Hkv), g = (int) (it % a.Hkv);
    if (p > *a.maxpos) return;
    const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
    if (pg < 0) return;
    const int64_t off = (int64_t) pg * a.p_s3 + (int64_t) (p % a.P) * a.p_s2 + (int64_t) g * a.p_s1;
    float kv[GMAX], vv[GMAX], dk[GMAX], dv[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        kv[i] = d < a.D ? gload<KT>(a.kp, off, a.p_s0, d) : 0.0f;
        vv[i] = d < a.D ? gload<KT>(a.vp, off, a.p_s0, d) : 0.0f;
        dk[i] = dv[i] = 0.0f;
    }
    for (int t = 0; t < a.T; t++) {
        if (a.pos[t] < p) continue;
        for (int h = g * a.G; h < (g + 1) * a.G; h++) {
            const int64_t r = (int64_t) t * a.H + h;
            const float * qr = a.q + t * a.q_s2 + h * a.q_s1;
            const float * dr = a.dout + t * a.do_s2 + h * a.do_s1;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < GMAX; i++) {
                const int d = lane + 32 * i;
                if (d < a.D) { s += qr[d] * kv[i]; dp += dr[d] * vv[i]; }
            }
            s = warp_sum(s);
            dp = warp_sum(dp);
            const float pr = expf(s * a.scale - a.lse[r]);
            const float ds = pr * (dp - a.delta[r]) * a.scale;
#pragma unroll
            for (int i = 0; i < GMAX; i++) {
                const int d = lane + 32 * i;
                if (d < a.D) { dv[i] += pr * dr[d]; dk[i] += ds * qr[d]; }
            }
        }
    }
    const int64_t goff = (int64_t) pg * a.gr_s3 + (int64_t) (p % a.P) * a.gr_s2 + (int64_t) g * a.gr_s1;
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        if (d < a.D) { a.dkp[goff + d] += dk[i]; a.dvp[goff + d] += dv[i]; }
    }
}

__global__ void pa_maxpos_kernel(const int32_t * pos, int T, int * maxpos) {
    __shared__ int smax;
    if (threadIdx.x == 0) smax = -1;
    __syncthreads();
    int mx = -1;
    for (int t = threadIdx.x; t < T; t += blockDim.x) mx = max(mx, pos[t]);
    atomicMax(&smax, mx);
    __syncthreads();
    if (threadIdx.x == 0) *maxpos = smax;
}

// ---------------------------------------------------------------------------------------------
// Workspace: the backend context's scratch (stream-ordered growth, common.cuh)
// ---------------------------------------------------------------------------------------------

void * workspace(oomb_cuda_ctx & c, size_t bytes) { return c.scratch(oomb_cuda_ctx::SLOT_PAGED, bytes); }

struct Carver {
    char * p;
    template <typename T> T * take(size_t n) {
        T * r = (T *) p;
        p += (n * sizeof(T) + 255) & ~(size_t) 255;
        return r;
    }
};
size_t carve_size(size_t n_bytes) { return (n_bytes + 255) & ~(size_t) 255; }

// ---------------------------------------------------------------------------------------------
// Host dispatch helpers
// ---------------------------------------------------------------------------------------------

bool aligned16(const void * p) { return ((uintptr_t) p & 15) == 0; }

// Kernel variants, for tuning (OOMB_PAGED_ATTN_FWD / OOMB_PAGED_ATTN_BWD = variant number; the
// default is the fastest one measured, see bench/NOTES.md). Head dim 128 only; 64 has one of each.
int env_variant(const char * name, int def) {
    const char * v = getenv(name);
    return v && *v ? atoi(v) : def;
}
int fwd_variant() { static const int v = env_variant("OOMB_PAGED_ATTN_FWD", 2); return v; }
int bwd_variant() { static const int v = env_variant("OOMB_PAGED_ATTN_BWD", 1); return v; }
// forward D=128 variants: 0: 4 warps x 32 rows, 32-key tiles; 1: 8 warps x 16 rows, 64-key tiles;
// 2 (default): 4 warps x 32 rows, 64-key tiles (measured at 32K on the H200: 234 / 218 / 278 TFLOP/s)
int fwd_bn(int D) { return D == 64 ? 64 : (fwd_variant() == 0 ? 32 : 64); }
// backward D=128 variants: rows per step 0: 32, 1 (default): 64, 2: 16 (op backward incl. the LSE
// pass at 32K: 144 / 160 / 115 counted TFLOP/s)
// Blocks per key tile in the backward. Parallelism is over (key tile, KV head) only: a chunk's
// own keys alone give T/128 * Hkv tiles (64 for Qwen2.5-0.5B at chunk 4096), half the H200's 132
// SMs at one block per SM, and a few tiles more than a wave leave most of the last wave idle. So
// the row tiles of a key tile are dealt to nsplit blocks, enough that the chunk's own tiles fill
// about two waves; dK/dV are then added with atomics. OOMB_PAGED_ATTN_SPLIT=n forces n.
int bwd_split(int own_tiles, int n_rt) {
    const char * e = getenv("OOMB_PAGED_ATTN_SPLIT");
    int ns;
    if (e && *e) ns = atoi(e);
    else {
        int dev = 0, n_sm = 132;
        if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
        ns = (2 * n_sm + own_tiles - 1) / std::max(own_tiles, 1);
        ns = std::min(ns, 4);
    }
    return std::max(1, std::min(ns, std::max(n_rt, 1)));
}

// D = 64 variants (OOMB_PAGED_ATTN_FWD64 / OOMB_PAGED_ATTN_BWD64, for tuning): registers are not
// the limit there, so more blocks per SM (latency hiding) can be asked of the compiler.
//   forward 0 (default): 4 warps x 32 rows, 64-key tiles, 220 registers (2 blocks/SM);
//           1: the same with at most 168 registers (3 blocks/SM, 44 B of spills); 2: 8 warps x 16 rows,
//           64-key tiles (145 registers)
//   backward 0 (default): 64 rows per step, 1 block/SM (240 registers); 1: 32 rows, 2 blocks/SM
//           (128 registers, 44 B of spills); 2: 32 rows, 1 block/SM
int fwd64_variant() { static const int v = env_variant("OOMB_PAGED_ATTN_FWD64", 0); return v; }
int bwd64_variant() { static const int v = env_variant("OOMB_PAGED_ATTN_BWD64", 0); return v; }
int bwd_bm(int D) { return D == 64 ? (bwd64_variant() >= 1 ? 32 : 64) : (bwd_variant() == 1 ? 64 : bwd_variant() == 2 ? 16 : 32); }

// The wgmma kernels (paged-attn-sm90.inc) for head dims 64 and 128 run on a compute capability 9.0 device
// with this file compiled for sm_90a (a probe kernel says so, once per process).
// OOMB_PAGED_ATTN_WGMMA (read at every call: the tests compare the kernels) selects them: bit 0 the
// forward (page size a multiple of 128), bit 1 the backward; unset: 3 (both), 0: the mma.sync kernels.
bool wgmma_available() {
    static int avail = -1;
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    if (avail < 0) {
        avail = 0;
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            major == 9) {
            int * flag = nullptr;
            int h = 0;
            PA_CHECK(cudaMalloc(&flag, sizeof(int)));
            pa_wgmma_probe_kernel<<<1, 1>>>(flag);
            PA_LAUNCH_CHECK();
            PA_CHECK(cudaMemcpy(&h, flag, sizeof(int), cudaMemcpyDeviceToHost));
            PA_CHECK(cudaFree(flag));
            avail = h;
        }
    }
    return avail == 1;
}
int wgmma_bits() {
    const char * e = getenv("OOMB_PAGED_ATTN_WGMMA");
    if (!e || !*e) return 3;
    if (e[1] || e[0] < '0' || e[0] > '3')
        oomb_error("OOMB_PAGED_ATTN_WGMMA must be 0-3 (bit 0: wgmma forward, bit 1: wgmma backward), got '%s'", e);
    return e[0] - '0';
}
bool fwd_wgmma(int D, int P) { return (D == 64 || D == 128) && P % FwdW<128, false>::BN == 0 && (wgmma_bits() & 1) && wgmma_available(); }
bool bwd_wgmma(int D) { return (D == 64 || D == 128) && (wgmma_bits() & 2) && wgmma_available(); }

// Can the tensor-core kernels run on these operands?
bool fast_ok(const oomb_tensor * q, const oomb_tensor * kp, const oomb_tensor * vp, const oomb_tensor * dout) {
    if (getenv("OOMB_PAGED_ATTN_GENERIC")) return false;
    const int64_t D = q->ne[0];
    if (kp->type != OOMB_TYPE_BF16 || vp->type != OOMB_TYPE_BF16) return false;
    if (D != 64 && D != 128) return false;
    for (int i = 0; i < 4; i++) if (kp->nb[i] != vp->nb[i]) return false;
    if (kp->nb[0] != 2 || kp->nb[1] % 16 || kp->nb[2] % 16 || kp->nb[3] % 16) return false;
    if (!aligned16(kp->data) || !aligned16(vp->data)) return false;
    if (q->nb[0] != 4 || q->nb[1] % 16 || q->nb[2] % 16 || !aligned16(q->data)) return false;
    if (dout && (dout->nb[0] != 4 || dout->nb[1] % 16 || dout->nb[2] % 16 || !aligned16(dout->data))) return false;
    if (q->ne[2] * q->ne[1] >= (int64_t) INT_MAX / 2) return false;
    if (kp->ne[2] % fwd_bn((int) D)) return false; // a forward key tile must lie in one page
    return true;
}

template <typename F> void set_smem(F * kernel, size_t smem) {
    // once per kernel and device is enough, but the call is cheap
    PA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    // all of the SM's unified memory as shared memory: two CTAs of the head-dim-64 wgmma kernels fit
    PA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
}

// Two CTAs per SM for the head-dim-64 wgmma kernels (registers capped at 128), so that one CTA's
// softmax overlaps the other's products: OOMB_PAGED_ATTN_OCC64 bit 0 the forward, bit 1 the backward
// (read at every call). Default 1, the forward only: Qwen2.5-0.5B layer at 32K (dea97ac, same call)
// forward 245 -> 273 TFLOP/s (64 bytes of spills), backward 270 -> 181 (512 bytes of spills).
constexpr int k_occ64_default = 1;
int occ64_bits() {
    const char * e = getenv("OOMB_PAGED_ATTN_OCC64");
    if (!e || !*e) return k_occ64_default;
    if (e[1] || e[0] < '0' || e[0] > '3')
        oomb_error("OOMB_PAGED_ATTN_OCC64 must be 0-3 (bit 0: forward, bit 1: backward with two CTAs per SM), got '%s'", e);
    return e[0] - '0';
}

template <int D, int MODE, bool PIPE, int MINB> void launch_fwd_wgmma(cudaStream_t stream, const FwdArgs & a, int Hkv) {
    using W = FwdW<D, PIPE>;
    static bool attr_set = false;
    if (!attr_set) { set_smem(pa_fwd_wgmma_kernel<D, MODE, PIPE, MINB>, W::smem); attr_set = true; }
    dim3 grid((a.T * a.G + W::BM - 1) / W::BM, Hkv);
    pa_fwd_wgmma_kernel<D, MODE, PIPE, MINB><<<grid, W::NT, W::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}

// The wgmma forward issuing the next key tile's S before the current tile's softmax (a second S
// accumulator: registers allow it at head dim 64 only): OOMB_PAGED_ATTN_FWDPIPE=1 (read at every
// call). Off by default: ptxas serializes its wgmmas (C7515), and it measured slower (0.5B layer
// at 32K: 223 vs 247 TFLOP/s, bench/NOTES.md version 11).
bool fwd_pipe(int D) {
    const char * e = getenv("OOMB_PAGED_ATTN_FWDPIPE");
    if (!e || !*e) return false;
    if (e[1] || (e[0] != '0' && e[0] != '1')) oomb_error("OOMB_PAGED_ATTN_FWDPIPE must be 0 or 1, got '%s'", e);
    return D == 64 && e[0] == '1';
}

template <int D, int MINB> void launch_bwd_wgmma(cudaStream_t stream, const BwdArgs & a, int n_key_tiles, int Hkv) {
    using W = BwdW<D>;
    static bool attr_set = false;
    if (!attr_set) { set_smem(pa_bwd_wgmma_kernel<D, MINB>, W::smem); attr_set = true; }
    dim3 grid(n_key_tiles, Hkv, a.nsplit);
    pa_bwd_wgmma_kernel<D, MINB><<<grid, W::NT, W::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}

template <int D, int WM, int BN, int NW, int MODE, int MINB = 1>
void launch_fwd(cudaStream_t stream, const FwdArgs & a, int Hkv) {
    using C = FwdCfg<D, WM, BN, NW>;
    static bool attr_set = false; // benign race: setting the attribute twice is harmless
    if (!attr_set) { set_smem(pa_fwd_kernel<D, WM, BN, NW, MODE, MINB>, C::smem); attr_set = true; }
    const int TG = a.T * a.G;
    dim3 grid((TG + C::BM - 1) / C::BM, Hkv);
    pa_fwd_kernel<D, WM, BN, NW, MODE, MINB><<<grid, NW * 32, C::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}


template <int MODE>
void fwd_fast(cudaStream_t stream, const FwdArgs & a, int D, int Hkv) {
    if (fwd_wgmma(D, a.P)) {
        if (D == 128) launch_fwd_wgmma<128, MODE, false, 1>(stream, a, Hkv);
        else if (fwd_pipe(D)) launch_fwd_wgmma<64, MODE, true, 1>(stream, a, Hkv);
        else if (occ64_bits() & 1) launch_fwd_wgmma<64, MODE, false, 2>(stream, a, Hkv);
        else launch_fwd_wgmma<64, MODE, false, 1>(stream, a, Hkv);
        return;
    }
    if (D == 64) {
        switch (fwd64_variant()) {
            case 1: launch_fwd<64, 2, 64, 4, MODE, 3>(stream, a, Hkv); break;
            case 2: launch_fwd<64, 1, 64, 8, MODE>(stream, a, Hkv); break;
            default: launch_fwd<64, 2, 64, 4, MODE>(stream, a, Hkv); break;
        }
        return;
    }
    switch (fwd_variant()) {
        case 1: launch_fwd<128, 1, 64, 8, MODE>(stream, a, Hkv); break;
        case 2: launch_fwd<128, 2, 64, 4, MODE>(stream, a, Hkv); break;
        default: launch_fwd<128, 2, 32, 4, MODE>(stream, a, Hkv); break;
    }
}

constexpr int BWD_NW = 8;

template <int D, int BM, int MINB = 1>
void launch_bwd(cudaStream_t stream, const BwdArgs & a, int n_key_tiles, int Hkv) {
    using C = BwdCfg<D, BM, BWD_NW>;
    static bool attr_set = false;
    if (!attr_set) { set_smem(pa_bwd_kernel<D, BM, BWD_NW, MINB>, C::smem); attr_set = true; }
    dim3 grid(n_key_tiles, Hkv, a.nsplit);
    pa_bwd_kernel<D, BM, BWD_NW, MINB><<<grid, BWD_NW * 32, C::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}

// Arguments of the tensor-core forward kernel common to its output and LSE modes.
FwdArgs fwd_args(const Geom & G, const oomb_tensor * q, const oomb_tensor * kp, const oomb_tensor * vp, float scale) {
    FwdArgs a{};
    a.q = (const float *) q->data; a.q_s1 = q->nb[1] / 4; a.q_s2 = q->nb[2] / 4;
    a.kp = (const bf16 *) kp->data; a.vp = (const bf16 *) vp->data;
    a.kv_s1 = kp->nb[1] / 2; a.kv_s2 = kp->nb[2] / 2; a.kv_s3 = kp->nb[3] / 2;
    a.pt = G.pt; a.n_logical = G.n_logical; a.n_pages = G.n_pages; a.P = G.P;
    a.pos = G.pos;
    a.T = G.T; a.H = G.H; a.G = G.G;
    a.c = scale * kLog2e;
    return a;
}

GenArgs gen_args(const Geom & G, const oomb_tensor * q, const oomb_tensor * kp, const oomb_tensor * vp, float scale) {
    GenArgs a{};
    a.q = (const float *) q->data; a.q_s1 = q->nb[1] / 4; a.q_s2 = q->nb[2] / 4;
    a.kp = (const char *) kp->data; a.vp = (const char *) vp->data;
    a.p_s0 = kp->nb[0]; a.p_s1 = kp->nb[1]; a.p_s2 = kp->nb[2]; a.p_s3 = kp->nb[3];
    a.pt = G.pt; a.n_logical = G.n_logical; a.n_pages = G.n_pages; a.P = G.P;
    a.pos = G.pos;
    a.D = G.D; a.T = G.T; a.H = G.H; a.G = G.G; a.Hkv = G.Hkv;
    a.scale = scale;
    return a;
}

template <int MODE>
void fwd_generic(cudaStream_t stream, const GenArgs & a, oomb_type type) {
    const int64_t rows = (int64_t) a.T * a.H;
    const int wpb = 4;
    const dim3 grid((unsigned) ((rows + wpb - 1) / wpb));
    switch (type) {
        case OOMB_TYPE_F32: pa_fwd_generic<float, MODE><<<grid, wpb * 32, 0, stream>>>(a); break;
        case OOMB_TYPE_F16: pa_fwd_generic<__half, MODE><<<grid, wpb * 32, 0, stream>>>(a); break;
        default: pa_fwd_generic<bf16, MODE><<<grid, wpb * 32, 0, stream>>>(a); break;
    }
    PA_LAUNCH_CHECK();
}

void check_common(const Geom & G, const oomb_tensor * kp, const char * op) {
    if (G.D > 32 * GMAX) oomb_error("%s (cuda): head dim %d > %d is not supported", op, G.D, 32 * GMAX);
    if (G.Hkv <= 0 || G.H % G.Hkv) oomb_error("%s (cuda): %d heads not a multiple of %d kv heads", op, G.H, G.Hkv);
    if (kp->type != OOMB_TYPE_F32 && kp->type != OOMB_TYPE_F16 && kp->type != OOMB_TYPE_BF16)
        oomb_error("%s (cuda): pool type %s not supported", op, oomb_type_name(kp->type));
    if ((int64_t) G.n_logical * G.P >= INT_MAX) oomb_error("%s (cuda): page table spans too many positions", op);
}

} // namespace

bool oomb_cuda_paged_attn_uses_wgmma(int head_dim, int page_size, int backward) {
    return backward ? bwd_wgmma(head_dim) : fwd_wgmma(head_dim, page_size);
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

// oomb_paged_attn_cached: copies the chunk's block of the result cache (it starts at element
// pos[0] * row, read on the device) into the packed node (to_cache 0) or the packed node into it
// (to_cache 1). f32 cache: the packed node as is; bf16 cache: the n_out outputs rounded to bf16,
// then the n_lse LSEs as f32 bits (two elements each). A block outside the cache loads as NaN (the
// loss then says so) and is not saved.
template <typename CT>
static __global__ void pa_cache_copy_kernel(CT * cache, int64_t cache_n, float * packed, int64_t n_out, int64_t n_lse, int64_t row,
                                            const int32_t * pos, int to_cache) {
    constexpr int lse_el = 4 / (int) sizeof(CT);  // cache elements per LSE
    const int64_t off = (int64_t) pos[0] * row;
    const bool ok = pos[0] >= 0 && off + n_out + n_lse * lse_el <= cache_n;
    const int64_t n = n_out + n_lse;
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        if (i < n_out) {
            CT * c = cache + off + i;
            if (to_cache) { if (ok) *c = from_f32<CT>(packed[i]); }
            else packed[i] = ok ? to_f32<CT>(*c) : __int_as_float(0x7fc00000);
        } else {
            // the LSE as its 32 bits, in lse_el elements (two 16-bit halves in a bf16 cache, whose LSE
            // part need not be 4-byte aligned: D*H may be odd)
            uint16_t * c = (uint16_t *) (cache + off + n_out) + (i - n_out) * (4 / sizeof(uint16_t));
            if (to_cache) {
                if (ok) {
                    const uint32_t b = __float_as_uint(packed[i]);
                    c[0] = (uint16_t) (b & 0xffffu);
                    c[1] = (uint16_t) (b >> 16);
                }
            } else {
                packed[i] = ok ? __uint_as_float((uint32_t) c[0] | ((uint32_t) c[1] << 16)) : __int_as_float(0x7fc00000);
            }
        }
    }
}

static void cache_copy(cudaStream_t stream, oomb_tensor * dst, const int32_t * pos, int64_t n_out, int64_t n_lse, int64_t row,
                       int to_cache) {
    const oomb_tensor * cache = dst->src[7];
    const unsigned blocks = (unsigned) std::min<int64_t>((n_out + n_lse + 255) / 256, 4096);
    if (cache->type == OOMB_TYPE_BF16)
        pa_cache_copy_kernel<bf16><<<blocks, 256, 0, stream>>>((bf16 *) cache->data, oomb_nelements(cache), (float *) dst->data, n_out,
                                                               n_lse, row, pos, to_cache);
    else
        pa_cache_copy_kernel<float><<<blocks, 256, 0, stream>>>((float *) cache->data, oomb_nelements(cache), (float *) dst->data, n_out,
                                                                n_lse, row, pos, to_cache);
    PA_LAUNCH_CHECK();
}

void oomb_cuda_paged_attn(oomb_cuda_ctx & c, oomb_tensor * dst) {
    cudaStream_t stream = c.stream;
    const oomb_tensor * q = dst->src[0];
    const oomb_tensor * kc = dst->src[1];
    const oomb_tensor * vc = dst->src[2];
    oomb_tensor * kp = dst->src[3];
    oomb_tensor * vp = dst->src[4];
    const float scale = oomb::get_op_f32(dst, 0);
    const int store = dst->op_params[1];
    const Geom G = make_geom(q, kp, dst->src[5], dst->src[6]);
    check_common(G, kp, "paged_attn");
    if (G.T == 0) return;
    // dst is the packed node: out [T][H][D], then the natural-log LSE of row t*H + h
    if (oomb_nelements(dst) != (int64_t) G.D * G.H * G.T + (int64_t) G.H * G.T)
        oomb_error("paged_attn (cuda): %s is not the op's packed node (out and LSE, %lld elements)", oomb::shape_str(dst).c_str(),
                   (long long) G.D * G.H * G.T + (long long) G.H * G.T);
    float * out = (float *) dst->data;
    float * lse = out + (int64_t) G.D * G.H * G.T;
    const int cache_mode = dst->op_params[2];  // oomb_paged_attn_cached: 1 save, 2 load
    const int64_t cache_row = cache_mode ? oomb_paged_attn_cache_row(G.D, G.H, dst->src[7]->type) : 0;
    const int64_t n_out = (int64_t) G.D * G.H * G.T, n_lse = (int64_t) G.H * G.T;
    if (cache_mode == 2) {
        cache_copy(stream, dst, G.pos, n_out, n_lse, cache_row, 0);
        return;
    }

    if (store) {
        const int64_t n = (int64_t) G.D * G.Hkv * G.T;
        const unsigned blocks = (unsigned) ((n + 255) / 256);
#define PA_STORE(KT)                                                                                                   \
    pa_store_kernel<KT><<<blocks, 256, 0, stream>>>((const char *) kc->data, (const char *) vc->data, kc->nb[0], kc->nb[1], \
                                                    kc->nb[2], (char *) kp->data, (char *) vp->data, kp->nb[0], kp->nb[1],  \
                                                    kp->nb[2], kp->nb[3], G.pt, G.pos, G.n_logical, G.n_pages, G.P, G.D,   \
                                                    G.Hkv, G.T)
        switch (kp->type) {
            case OOMB_TYPE_F32: PA_STORE(float); break;
            case OOMB_TYPE_F16: PA_STORE(__half); break;
            default: PA_STORE(bf16); break;
        }
#undef PA_STORE
        PA_LAUNCH_CHECK();
    }

    if (fast_ok(q, kp, vp, nullptr)) {
        FwdArgs a = fwd_args(G, q, kp, vp, scale);
        a.out = out;
        a.lse_out = lse;
        fwd_fast<MODE_OUT>(stream, a, G.D, G.Hkv);
    } else {
        GenArgs a = gen_args(G, q, kp, vp, scale);
        a.out = out;
        a.lse = lse;
        fwd_generic<MODE_OUT>(stream, a, kp->type);
    }
    if (cache_mode == 1) cache_copy(stream, dst, G.pos, n_out, n_lse, cache_row, 1);
}

void oomb_cuda_paged_attn_back(oomb_cuda_ctx & c, oomb_tensor * dst) {
    cudaStream_t stream = c.stream;
    const oomb_tensor * q = dst->src[0];
    const oomb_tensor * kp = dst->src[1];
    const oomb_tensor * vp = dst->src[2];
    oomb_tensor * dkp = dst->src[3];
    oomb_tensor * dvp = dst->src[4];
    const oomb_tensor * dout = dst->src[7];
    const oomb_tensor * fwd = dst->src[8];  // the forward's packed node (out, LSE) or NULL
    const float scale = oomb::get_op_f32(dst, 0);
    const Geom G = make_geom(q, kp, dst->src[5], dst->src[6]);
    check_common(G, kp, "paged_attn_back");
    if (G.T == 0) return;
    if (dkp->nb[0] != 4 || dvp->nb[0] != 4) oomb_error("paged_attn_back (cuda): gradient pages must be contiguous f32");
    for (int i = 1; i < 4; i++)
        if (dkp->nb[i] != dvp->nb[i]) oomb_error("paged_attn_back (cuda): dk/dv gradient pages must have the same strides");

    float * dq = (float *) dst->data;
    float * dkc = dq + (int64_t) G.D * G.H * G.T;
    float * dvc = dkc + (int64_t) G.D * G.Hkv * G.T;
    const int64_t n_keys_bound = (int64_t) G.n_logical * G.P;
    const float * saved_out = fwd ? (const float *) fwd->data : nullptr;
    const float * saved_lse = fwd ? saved_out + (int64_t) G.D * G.H * G.T : nullptr;

    if (fast_ok(q, kp, vp, dout)) {
        // saved statistics: the prep kernel reads out with 16-byte loads
        const bool saved = saved_out && aligned16(saved_out);
        const bool wg = bwd_wgmma(G.D);
        const int BM = wg ? BwdW<128>::BM : bwd_bm(G.D);
        const int BN = BWD_NW * 16;
        static_assert(BWD_NW * 16 == BwdW<128>::BN && BwdW<128>::BN == BwdW<64>::BN && BwdW<128>::BM == BwdW<64>::BM,
                      "the mma.sync and wgmma backward kernels share the key-tile grid and the row-tile metadata");
        const int TG = G.T * G.G;
        const int TGp = (TG + 127) / 128 * 128; // multiple of every row tile
        const int n_rt = TGp / BM;
        const size_t n_rows = (size_t) G.Hkv * TGp;
        const size_t bytes = 2 * carve_size(n_rows * G.D * sizeof(bf16)) + 2 * carve_size(n_rows * sizeof(float)) +
                             carve_size(TGp * sizeof(int)) + 2 * carve_size(n_rt * sizeof(int)) + carve_size(sizeof(int));
        Carver cv{(char *) workspace(c, bytes)};
        bf16 * qb = cv.take<bf16>(n_rows * G.D);
        bf16 * dob = cv.take<bf16>(n_rows * G.D);
        float * lse = cv.take<float>(n_rows);
        float * delta = cv.take<float>(n_rows);
        int * rowpos = cv.take<int>(TGp);
        int * rt_max = cv.take<int>(n_rt);
        int * rt_min = cv.take<int>(n_rt);
        int * maxpos = cv.take<int>(1);

        pa_meta_kernel<<<1, 1024, 0, stream>>>(G.pos, G.T, G.G, TGp, BM, rowpos, rt_max, rt_min, maxpos);
        PA_LAUNCH_CHECK();
        {
            const int64_t n = (int64_t) n_rows * (G.D / 8);
            const unsigned blocks = (unsigned) ((n + 255) / 256);
            const float * os = saved ? saved_out : nullptr;
            const float * ls = saved ? saved_lse : nullptr;
            if (G.D == 128)
                pa_prep_kernel<128><<<blocks, 256, 0, stream>>>((const float *) q->data, q->nb[1] / 4, q->nb[2] / 4, (const float *) dout->data,
                                                               dout->nb[1] / 4, dout->nb[2] / 4, G.T, G.H, G.G, G.Hkv, TGp, qb, dob, lse, delta,
                                                               os, ls);
            else
                pa_prep_kernel<64><<<blocks, 256, 0, stream>>>((const float *) q->data, q->nb[1] / 4, q->nb[2] / 4, (const float *) dout->data,
                                                              dout->nb[1] / 4, dout->nb[2] / 4, G.T, G.H, G.G, G.Hkv, TGp, qb, dob, lse, delta,
                                                              os, ls);
            PA_LAUNCH_CHECK();
        }
        // log-sum-exp and delta (forward recomputation), only without saved statistics
        if (!saved) {
            FwdArgs a = fwd_args(G, q, kp, vp, scale);
            a.dout = (const float *) dout->data; a.do_s1 = dout->nb[1] / 4; a.do_s2 = dout->nb[2] / 4;
            a.lse = lse; a.delta = delta; a.lse_stride = TGp;
            fwd_fast<MODE_LSE>(stream, a, G.D, G.Hkv);
        }
        PA_CHECK(cudaMemsetAsync(dq, 0, (size_t) G.D * G.H * G.T * sizeof(float), stream));
        {
            BwdArgs a{};
            a.qb = qb; a.dob = dob; a.lse = lse; a.delta = delta; a.rowpos = rowpos;
            a.rt_max = rt_max; a.rt_min = rt_min; a.maxpos = maxpos; a.n_rt = n_rt;
            a.kp = (const bf16 *) kp->data; a.vp = (const bf16 *) vp->data;
            a.kv_s1 = kp->nb[1] / 2; a.kv_s2 = kp->nb[2] / 2; a.kv_s3 = kp->nb[3] / 2;
            a.dkp = (float *) dkp->data; a.dvp = (float *) dvp->data;
            a.gr_s1 = dkp->nb[1] / 4; a.gr_s2 = dkp->nb[2] / 4; a.gr_s3 = dkp->nb[3] / 4;
            a.pt = G.pt; a.n_logical = G.n_logical; a.n_pages = G.n_pages; a.P = G.P;
            a.T = G.T; a.H = G.H; a.G = G.G; a.TGp = TGp;
            a.c = scale * kLog2e; a.scale = scale;
            a.dq = dq;
            const int n_key_tiles = (int) ((n_keys_bound + BN - 1) / BN);
            a.nsplit = bwd_split((int) ((G.T + BN - 1) / BN) * G.Hkv, n_rt);
            if (wg) {
                if (G.D == 128) launch_bwd_wgmma<128, 1>(stream, a, n_key_tiles, G.Hkv);
                else if (occ64_bits() & 2) launch_bwd_wgmma<64, 2>(stream, a, n_key_tiles, G.Hkv);
                else launch_bwd_wgmma<64, 1>(stream, a, n_key_tiles, G.Hkv);
            } else if (G.D == 64) {
                const int v = bwd64_variant();
                if (v == 1) launch_bwd<64, 32, 2>(stream, a, n_key_tiles, G.Hkv);
                else if (v == 2) launch_bwd<64, 32>(stream, a, n_key_tiles, G.Hkv);
                else launch_bwd<64, 64>(stream, a, n_key_tiles, G.Hkv);
            }
            else if (BM == 64) launch_bwd<128, 64>(stream, a, n_key_tiles, G.Hkv);
            else if (BM == 16) launch_bwd<128, 16>(stream, a, n_key_tiles, G.Hkv);
            else launch_bwd<128, 32>(stream, a, n_key_tiles, G.Hkv);
        }
    } else {
        const int64_t rows = (int64_t) G.T * G.H;
        const size_t bytes = 2 * carve_size(rows * sizeof(float)) + carve_size(sizeof(int));
        Carver cv{(char *) workspace(c, bytes)};
        float * lse = cv.take<float>(rows);
        float * delta = cv.take<float>(rows);
        int * maxpos = cv.take<int>(1);
        pa_maxpos_kernel<<<1, 1024, 0, stream>>>(G.pos, G.T, maxpos);
        PA_LAUNCH_CHECK();
        GenArgs a = gen_args(G, q, kp, vp, scale);
        a.dout = (const float *) dout->data; a.do_s1 = dout->nb[1] / 4; a.do_s2 = dout->nb[2] / 4;
        a.lse = lse; a.delta = delta; a.maxpos = maxpos;
        a.dkp = (float *) dkp->data; a.dvp = (float *) dvp->data;
        a.gr_s1 = dkp->nb[1] / 4; a.gr_s2 = dkp->nb[2] / 4; a.gr_s3 = dkp->nb[3] / 4;
        const int wpb = 4;
        const dim3 grid_r((unsigned) ((rows + wpb - 1) / wpb));
        // The saved statistics are used when the forward ran these generic kernels too (same f32
        // arithmetic); a forward on the tensor cores (bf16 q) would give an LSE slightly off the
        // f32 scores computed here, so then they are recomputed in f32.
        if (saved_out && !fast_ok(q, kp, vp, nullptr)) {
            a.lse = const_cast<float *>(saved_lse);  // read only
            pa_delta_generic<<<grid_r, wpb * 32, 0, stream>>>(a, saved_out);
            PA_LAUNCH_CHECK();
        } else {
            fwd_generic<MODE_LSE>(stream, a, kp->type);
        }
        a.out = dq;
        const int64_t items = n_keys_bound * G.Hkv;
        const dim3 grid_k((unsigned) ((items + wpb - 1) / wpb));
        switch (kp->type) {
            case OOMB_TYPE_F32:
                pa_dq_generic<float><<<grid_r, wpb * 32, 0, stream>>>(a);
                pa_dkdv_generic<float><<<grid_k, wpb * 32, 0, stream>>>(a, items);
                break;
            case OOMB_TYPE_F16:
                pa_dq_generic<__half><<<grid_r, wpb * 32, 0, stream>>>(a);
                pa_dkdv_generic<__half><<<grid_k, wpb * 32, 0, stream>>>(a, items);
                break;
            default:
                pa_dq_generic<bf16><<<grid_r, wpb * 32, 0, stream>>>(a);
                pa_dkdv_generic<bf16><<<grid_k, wpb * 32, 0, stream>>>(a, items);
                break;
        }
        PA_LAUNCH_CHECK();
    }

    {
        const int64_t n = (int64_t) G.D * G.Hkv * G.T;
        pa_readback_kernel<<<(unsigned) ((n + 255) / 256), 256, 0, stream>>>((const float *) dkp->data, (const float *) dvp->data,
                                                                            dkp->nb[1] / 4, dkp->nb[2] / 4, dkp->nb[3] / 4, G.pt, G.pos,
                                                                            G.n_logical, G.n_pages, G.P, G.D, G.Hkv, G.T, dkc, dvc);
        PA_LAUNCH_CHECK();
    }
}
