// Paged attention on CUDA, the family's shared part: device helpers (cp.async, ldmatrix, mma.sync,
// swizzle, page-table lookup, type conversion), the host geometry of an op, and the kernels every
// path uses (store k_cur/v_cur into the pools, read dk_cur/dv_cur back from the gradient pages).
// Included by paged-attn.cu only (one translation unit for the whole family: the kernels compile
// exactly as one file, the anonymous namespace keeps them private).
#pragma once

#include "oomb-impl.h"
#include "../src/sround.h"
#include "../src/oomb/paged-attn-merge.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

namespace {

typedef __nv_bfloat16 bf16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------
// small device helpers
// ---------------------------------------------------------------------------------------------

// The MODE_OUT epilogue of one query row in the tensor-core forward kernels (mma.sync and wgmma):
// the four lanes of a quad (lane & 3) hold the row's D outputs in float2 pairs at dims
// nb * 8 + (lane & 3) * 2 + j (val(nb, j), normalised); L: the row's natural-log LSE. Plain: out and
// LSE written. accumulate (oomb_paged_attn_args): merged with the row's earlier result in out /
// lse_out by the weights of oomb_paged_attn_merge (src/oomb/paged-attn-merge.h); every lane reads
// the old LSE before the quad's lane 0 overwrites it (__syncwarp: call from warp-uniform code).
template <int D, typename F>
__device__ __forceinline__ void pa_epilogue_out(float * out, float * lse_out, int acc, bool valid, int64_t row, int lane, float L,
                                                F && val) {
    const oomb::pa_merge_w w = acc && valid ? oomb::pa_merge_weights(lse_out[row], L) : oomb::pa_merge_w{0.0f, 1.0f, L};
    if (acc) __syncwarp();
    if (!valid) return;
    float * dst = out + row * D + (lane & 3) * 2;
#pragma unroll
    for (int nb = 0; nb < D / 8; nb++) {
        float2 v = make_float2(val(nb, 0), val(nb, 1));
        if (acc) {
            const float2 old = *(const float2 *) (dst + nb * 8);
            v = make_float2(oomb::pa_merge_out(w, old.x, v.x), oomb::pa_merge_out(w, old.y, v.y));
        }
        *(float2 *) (dst + nb * 8) = v;
    }
    if ((lane & 3) == 0) lse_out[row] = w.L;
}

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

// bf16 gradient pages (oomb_paged_attn_back): the backward kernels' pointers and strides then count
// 16-bit elements, and each element gets old + its f32 sum, stochastically rounded (src/sround.h,
// the same bits as the CPU backend: index (p, g, d), salt from the pool seed and pos[0]).
struct GradSR {
    int bf16;                  // 0: f32 pages (the kernels' plain path)
    uint32_t seed_k, seed_v;   // oomb_paged_attn_grad_seed of dk_pages / dv_pages
    const int32_t * pos;       // the op's positions (device): pos[0] salts the chunk's writes
    int Hkv;
    int p_off;                 // absolute position of the kernel's key position 0 (a RANGE geometry's first page * P)
};
// Adds dk / dv into the bf16 gradient pages at element offset off (pools' element strides), which
// holds (position p, KV head g, dim d); sk / sv: sr_kv_salt of the seeds.
__device__ __forceinline__ void grad_add_bf16(const GradSR & gs, float * dkp, float * dvp, int64_t off, int p, int g, int d, int D,
                                              float dk, float dv, uint32_t sk, uint32_t sv) {
    uint16_t * k = (uint16_t *) dkp + off, * v = (uint16_t *) dvp + off;
    const uint32_t i = oomb::sr_kv_index((int64_t) p + gs.p_off, g, d, gs.Hkv, D);
    *k = oomb::sr_bf16_add(*k, dk, i, sk);
    *v = oomb::sr_bf16_add(*v, dv, i, sv);
}

// dk_cur / dv_cur [D, Hkv, T] from the gradient pages at pos (bf16 pages: strides in elements, converted).
__global__ void pa_readback_kernel(const float * dkp, const float * dvp, int64_t s1, int64_t s2, int64_t s3, const int32_t * pt,
                                   const int32_t * pos, int n_logical, int n_pages, int P, int D, int Hkv, int T, float * dkc, float * dvc,
                                   int grad_bf16) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t) D * Hkv * T) return;
    const int d = (int) (i % D), g = (int) ((i / D) % Hkv), t = (int) (i / ((int64_t) D * Hkv));
    const int p = pos[t];
    const int pg = page_of(pt, n_logical, n_pages, P, p);
    float vk = 0.0f, vv = 0.0f;
    if (pg >= 0) {
        const int64_t off = (int64_t) pg * s3 + (int64_t) (p % P) * s2 + (int64_t) g * s1 + d;
        if (grad_bf16) {
            vk = oomb::sr_bf16_to_f32(((const uint16_t *) dkp)[off]);
            vv = oomb::sr_bf16_to_f32(((const uint16_t *) dvp)[off]);
        } else {
            vk = dkp[off];
            vv = dvp[off];
        }
    }
    dkc[i] = vk;
    dvc[i] = vv;
}

} // namespace
