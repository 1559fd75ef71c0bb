// Paged attention on Hopper warpgroup MMA (wgmma, sm_90a), head dims 64 and 128: forward and
// backward kernels using the mma.sync family's argument structs (FwdArgs, BwdArgs). Included by
// paged-attn.cu only.
#pragma once

#include "paged-attn-mma.cuh"
#include "sm90.cuh"
#include "wgmma.cuh"

namespace {

// Paged attention forward and backward on Hopper warpgroup MMA (wgmma, sm_90a), head dims 64 and 128.
// (Uses the helpers of paged-attn-common.cuh and the argument structs of paged-attn-mma.cuh.)
//
// Backward: same algorithm and work split as pa_bwd_kernel (FlashAttention-2 backward,
// key-major): a block owns a tile of BN = 128 keys of one KV head (two warpgroups, 64 keys each)
// and loops over the tiles of BM = 64 group rows that attend it (every nsplit-th one). Per row
// tile, each warpgroup:
//   S^T = K Q^T and dP^T = V dO^T (64 keys x 64 rows, K-major operands from shared memory)
//   P^T = exp2(S^T c - L), masked; dS^T = P^T (dP^T - delta) scale         (registers, f32)
//   dV += P^T dO, dK += dS^T Q   (P^T / dS^T as bf16 register fragments, dO / Q MN-major)
//   dS^T -> shared memory; then dQ = dS K (dS and K MN-major) for columns D/2 wg .. D/2 wg + D/2 - 1
//   over all 128 keys of the tile, added to the f32 dq output with atomics (pa_bwd_pipe_kernel: or
//   into a tile-contiguous accumulator, bwd_add_dq_acc).
// Two kernels run these steps: pa_bwd_wgmma_kernel one row tile after the other (two block
// barriers per tile, q / dO double-buffered), pa_bwd_pipe_kernel with the row tiles overlapped
// (config.bwd_pipe; see there). Shared memory: K, V [D/64 halves of 64 dims][128 keys][64], q and dO
// [D/64][64 rows][64] per buffer, dS^T [128 keys][64 rows] (16 KB) per buffer, all with the 128-byte
// swizzle wgmma reads (see wgmma.cuh), 1024-byte aligned. Formula: FlashAttention-2 (Dao 2023), Alg. 2.

// NQB q / dO buffers, NSB dS^T buffers
template <int D, int NQB = 2, int NSB = 1>
struct BwdW {
    static constexpr int BN = 128, BM = 64, NT = 256;
    static constexpr uint32_t tile_kv = BN * D * 2, tile_q = BM * D * 2, tile_ds = BN * BM * 2;
    static constexpr size_t smem = 1024 + 2 * tile_kv + 2 * NQB * tile_q + NSB * tile_ds + 3 * NQB * BM * sizeof(float);
};

// D[64 x D] (+)= A (registers) * B (smem, MN-major): the n64 or n128 instruction
template <int D> __device__ __forceinline__ void mma_rs_nd(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t db, int scale_d) {
#ifdef OOMB_WGMMA
    if constexpr (D == 128) oomb_wgmma::mma_rs_n128<1>(d, a, db, scale_d);
    else oomb_wgmma::mma_rs_n64<1>(d, a, db, scale_d);
#endif
}

// element offset of 16-byte chunk ch (0..15) of row `row` in a [2][R][64] swizzled tile
template <int R> __device__ __forceinline__ int sw128(int row, int ch) {
    return (ch >> 3) * (R * 64) + row * 64 + (((ch & 7) ^ (row & 7)) << 3);
}

// ---------------------------------------------------------------------------------------------
// Backward pieces shared by pa_bwd_wgmma_kernel and pa_bwd_pipe_kernel. A warpgroup's accumulators
// (wgmma.cuh layout): rows = its 64 keys (a thread: keys krow0 + lane/4 and + 8, krow0 = 16 warp),
// columns = the 64 group rows (S^T, dP^T) or the dims (dK, dV).
// ---------------------------------------------------------------------------------------------

// K and V of key tile k0 (BN keys of KV head g) into the swizzled sK / sV tiles by cp.async, not
// committed; keys past maxp or on unmapped pages read as zeros.
template <int D> __device__ __forceinline__ void bwd_load_kv(const BwdArgs & a, int g, int k0, int maxp, bf16 * sK, bf16 * sV, int tid) {
    constexpr int BN = BwdW<D>::BN, NCH = D / 8;
    for (int idx = tid; idx < BN * NCH; idx += BwdW<D>::NT) {
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
        cp_async16(smem_u32(sK + sw128<BN>(row, ch)), srcK, sz);
        cp_async16(smem_u32(sV + sw128<BN>(row, ch)), srcV, sz);
    }
}

// Row tile j of KV head g into one buffer: q and dO (bf16 [D/64][BM][64], swizzled: in global memory
// already in this layout, pa_prep_kernel swz, so a flat copy), lse, delta and the row positions ([BM]
// each), by cp.async, not committed. (pa_bwd_pipe_kernel: bwd_bulk_rows.)
template <int D>
__device__ __forceinline__ void bwd_load_rows(const BwdArgs & a, int g, int j, bf16 * sq, bf16 * sdo, float * L, float * Dl, int * Rp, int tid) {
    constexpr int BM = BwdW<D>::BM;
    const int64_t rbase = (int64_t) g * a.TGp + (int64_t) j * BM;
    const bf16 * q = a.qb + rbase * D;
    const bf16 * d = a.dob + rbase * D;
#pragma unroll
    for (int idx = tid; idx < BM * D / 8; idx += BwdW<D>::NT) {
        cp_async16(smem_u32(sq + idx * 8), q + idx * 8, 16);
        cp_async16(smem_u32(sdo + idx * 8), d + idx * 8, 16);
    }
    if (tid < BM / 4) cp_async16(smem_u32(L + tid * 4), a.lse + rbase + tid * 4, 16);
    else if (tid < BM / 2) cp_async16(smem_u32(Dl + (tid - BM / 4) * 4), a.delta + rbase + (tid - BM / 4) * 4, 16);
    else if (tid < 3 * BM / 4) cp_async16(smem_u32(Rp + (tid - BM / 2) * 4), a.rowpos + (int64_t) j * BM + (tid - BM / 2) * 4, 16);
}

#ifdef OOMB_WGMMA
// Row tile j of KV head g into buffer (aq, ado, L, Dl, Rp) as bwd_load_rows, by one thread: five bulk
// copies (q and dO: BM * D bf16 each, contiguous in pa_prep_kernel's swizzled layout; lse, delta, row
// positions: BM * 4 bytes each) completing on the buffer's mbarrier bar, which this arms with their
// bytes (bwd_rows_bytes).
template <int D> constexpr uint32_t bwd_rows_bytes() { return 2 * BwdW<D>::tile_q + 3 * BwdW<D>::BM * 4; }
template <int D>
__device__ __forceinline__ void bwd_bulk_rows(const BwdArgs & a, int g, int j, uint32_t aq, uint32_t ado, uint32_t L, uint32_t Dl, uint32_t Rp,
                                              uint32_t bar) {
    using namespace oomb_sm90;
    constexpr int BM = BwdW<D>::BM;
    const int64_t rbase = (int64_t) g * a.TGp + (int64_t) j * BM;
    mbar_arrive_expect_tx(bar, bwd_rows_bytes<D>());
    bulk_load(aq, a.qb + rbase * D, BwdW<D>::tile_q, bar);
    bulk_load(ado, a.dob + rbase * D, BwdW<D>::tile_q, bar);
    bulk_load(L, a.lse + rbase, BM * 4, bar);
    bulk_load(Dl, a.delta + rbase, BM * 4, bar);
    bulk_load(Rp, a.rowpos + (int64_t) j * BM, BM * 4, bar);
}
#endif

// S^T = K Q^T into st and dP^T = V dO^T into dpt for warpgroup wg's 64 keys (A = its keys, B = the
// 64 rows, K = D; both K-major), issued and committed as one wgmma group.
template <int D>
__device__ __forceinline__ void bwd_issue_sdp(float (&st)[32], float (&dpt)[32], uint32_t aK, uint32_t aV, uint32_t cQ, uint32_t cdO, int wg) {
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    constexpr int BN = BwdW<D>::BN, BM = BwdW<D>::BM;
    const uint64_t dK = desc_sw128(aK + wg * (64 * 128), 16, 1024), dV = desc_sw128(aV + wg * (64 * 128), 16, 1024);
    const uint64_t dQ = desc_sw128(cQ, 16, 1024), ddO = desc_sw128(cdO, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t ka = (kk >> 2) * (BN * 128) + (kk & 3) * 32;
        const uint32_t kb = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
        mma_ss_n64<0, 0>(st, desc_add(dK, ka), desc_add(dQ, kb), kk > 0);
        mma_ss_n64<0, 0>(dpt, desc_add(dV, ka), desc_add(ddO, kb), kk > 0);
    }
    wgmma_commit();
#endif
}

// K and V of warpgroup wg's 64 keys as bf16 A fragments (head dim 64: D / 16 k-steps of 4 registers
// each), read once from the swizzled sK / sV tiles (a thread: keys krow0 + lane/4 and + 8).
template <int D>
__device__ __forceinline__ void bwd_load_kv_frags(const bf16 * sK, const bf16 * sV, uint32_t (&kf)[D / 16][4], uint32_t (&vf)[D / 16][4],
                                                  int krow0, int lane) {
    constexpr int BN = BwdW<D>::BN;
    const int r = krow0 + (lane >> 2), c = (lane & 3) * 2;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r + (e & 1) * 8, ch = 2 * kk + (e >> 1);
            kf[kk][e] = *(const uint32_t *) (sK + sw128<BN>(row, ch) + c);
            vf[kk][e] = *(const uint32_t *) (sV + sw128<BN>(row, ch) + c);
        }
    }
}

// bwd_issue_sdp with K and V from registers (bwd_load_kv_frags): S^T, dP^T read only q / dO from
// shared memory (half the bytes of the shared-memory operand form).
template <int D>
__device__ __forceinline__ void bwd_issue_sdp_rs(float (&st)[32], float (&dpt)[32], const uint32_t (&kf)[D / 16][4], const uint32_t (&vf)[D / 16][4],
                                                 uint32_t cQ, uint32_t cdO) {
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    constexpr int BM = BwdW<D>::BM;
    const uint64_t dQ = desc_sw128(cQ, 16, 1024), ddO = desc_sw128(cdO, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t kb = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
        mma_rs_n64<0>(st, kf[kk], desc_add(dQ, kb), kk > 0);
        mma_rs_n64<0>(dpt, vf[kk], desc_add(ddO, kb), kk > 0);
    }
    wgmma_commit();
#endif
}

// In place: st (S^T) -> P^T = exp2(S^T c - L), 0 where masked; dpt (dP^T) -> dS^T = P^T (dP^T -
// delta) scale. cL, cDl, cRp: the row tile's lse, delta, positions; kq: the thread's first key (its
// second: kq + 8); MASK: some key of the tile lies past some row's position (or LISTS: a row's page
// bits apply, hist); see / kpi: LISTS row bits (BwdListsTile::row_bits) and the keys' page indices.
// The MASK = false copy (most row tiles of a key tile) has no compares, selects or position reads.
template <bool LISTS, bool MASK>
__device__ __forceinline__ void bwd_softmax_t(float (&st)[32], float (&dpt)[32], const BwdArgs & a, const float * cL, const float * cDl,
                                              const int * cRp, int kq, bool hist, const uint32_t * see, const int (&kpi)[2], int lane) {
#if OOMB_PA_ABLATION == 2
    return;  // ablation (bench/attention/ablate.sh): no softmax
#endif
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int nb = i >> 2, e = i & 3;
        const int qc = nb * 8 + (lane & 3) * 2 + (e & 1);
#if OOMB_PA_ABLATION == 1
        float p = st[i] * a.c - cL[qc];  // ablation: no exp2
#else
        float p = ex2(st[i] * a.c - cL[qc]);
#endif
        if constexpr (MASK) {
            const int kp = kq + ((e >> 1) << 3);
            if constexpr (LISTS) {
                if (kp > cRp[qc] || (hist && !((see[qc] >> kpi[e >> 1]) & 1u))) p = 0.0f;
            } else {
                if (kp > cRp[qc]) p = 0.0f;
            }
        }
        st[i] = p;
        dpt[i] = p * (dpt[i] - cDl[qc]) * a.scale;
    }
}
template <bool LISTS>
__device__ __forceinline__ void bwd_softmax(float (&st)[32], float (&dpt)[32], const BwdArgs & a, const float * cL, const float * cDl,
                                            const int * cRp, int kq, bool need_mask, bool hist, const uint32_t * see, const int (&kpi)[2],
                                            int lane) {
    if (need_mask) bwd_softmax_t<LISTS, true>(st, dpt, a, cL, cDl, cRp, kq, hist, see, kpi, lane);
    else bwd_softmax_t<LISTS, false>(st, dpt, a, cL, cDl, cRp, kq, hist, see, kpi, lane);
}

// An accumulator of 64 keys x 64 rows as the bf16 A fragments of four k16 steps (rows as K)
__device__ __forceinline__ void bwd_pack(const float (&x)[32], uint32_t (&f)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        f[kk][0] = pack_bf16(x[8 * kk + 0], x[8 * kk + 1]);
        f[kk][1] = pack_bf16(x[8 * kk + 2], x[8 * kk + 3]);
        f[kk][2] = pack_bf16(x[8 * kk + 4], x[8 * kk + 5]);
        f[kk][3] = pack_bf16(x[8 * kk + 6], x[8 * kk + 7]);
    }
}

// dV += P^T dO, dK += dS^T Q (K = the 64 rows; B MN-major: rows of 64 dims, halves 64*128 B apart),
// issued and committed as one group; pa / da must stay live until it retires.
template <int D>
__device__ __forceinline__ void bwd_issue_dkdv(float (&dk)[D / 2], float (&dv)[D / 2], const uint32_t (&pa)[4][4], const uint32_t (&da)[4][4],
                                               uint32_t cQ, uint32_t cdO) {
#if OOMB_PA_ABLATION == 5 && defined(OOMB_WGMMA)
    oomb_wgmma::wgmma_commit();  // ablation: no dV / dK products (an empty group)
    return;
#endif
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    constexpr int BM = BwdW<D>::BM;
    const uint64_t dQ = desc_sw128(cQ, BM * 128, 1024), ddO = desc_sw128(cdO, BM * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; kk++) {
        mma_rs_nd<D>(dv, pa[kk], desc_add(ddO, kk * 2048), 1);
        mma_rs_nd<D>(dk, da[kk], desc_add(dQ, kk * 2048), 1);
    }
    wgmma_commit();
#endif
}

// dS^T (the thread's bf16 pairs da, as packed by bwd_pack) into the [BN keys][BM rows] swizzled tile
__device__ __forceinline__ void bwd_store_ds(bf16 * sdS, const uint32_t (&da)[4][4], int krow0, int lane) {
    constexpr int BM = BwdW<128>::BM;
    const int r = krow0 + (lane >> 2);
#pragma unroll
    for (int nb = 0; nb < BM / 8; nb++) {
        const int c = nb * 8 + (lane & 3) * 2;
        *(uint32_t *) (sdS + r * BM + (((nb ^ (r & 7))) << 3) + (c & 7)) = da[nb >> 1][(nb & 1) * 2];
        *(uint32_t *) (sdS + (r + 8) * BM + (((nb ^ ((r + 8) & 7))) << 3) + (c & 7)) = da[nb >> 1][(nb & 1) * 2 + 1];
    }
}

// dQ[64 rows][D/2 columns from D/2 * wg] = dS (A: M = rows, MN-major) K (B: N = dims, MN-major) over
// all 128 keys of the tile (both warpgroups' dS^T in adS), issued and committed as one group. D = 64:
// the 32 columns of a warpgroup start 64 bytes into each 128-byte row of the K tile (the descriptor
// start is still 1024-byte aligned up to those 64 bytes: base offset 0).
template <int D> __device__ __forceinline__ void bwd_issue_dq(float (&dqa)[D / 4], uint32_t adS, uint32_t aK, int wg) {
#if OOMB_PA_ABLATION == 4 && defined(OOMB_WGMMA)
    oomb_wgmma::wgmma_commit();  // ablation: no dQ product (an empty group)
    return;
#endif
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    constexpr int BN = BwdW<D>::BN;
    const uint32_t kq = D == 128 ? wg * BwdW<D>::tile_kv / 2 : wg * 64;
    const uint64_t ddS = desc_sw128(adS, BN * 128, 1024), dK = desc_sw128(aK + kq, BN * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        const uint64_t dA = desc_add(ddS, kk * 2048), dB = desc_add(dK, kk * 2048);
        if constexpr (D == 128) mma_ss_n64<1, 1>(dqa, dA, dB, kk > 0);
        else mma_ss_n32<1, 1>(dqa, dA, dB, kk > 0);
    }
    wgmma_commit();
#endif
}

// dq[rows of row tile j] += dqa (f32 atomics; rows past T G skipped; j < 0: nothing)
template <int D> __device__ __forceinline__ void bwd_add_dq(const BwdArgs & a, const float (&dqa)[D / 4], int j, int g, int wg, int warp, int lane) {
#if OOMB_PA_ABLATION == 3 || OOMB_PA_ABLATION == 4
    return;  // ablation: no dQ atomics
#endif
    constexpr int NQ = D / 2, BM = BwdW<D>::BM;
    const int TG = a.T * a.G;
    const int dq_col0 = wg * NQ;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int R = j * BM + (warp & 3) * 16 + (lane >> 2) + hf * 8;
        if (j >= 0 && R < TG) {
            const int t = R / a.G, h = g * a.G + R % a.G;
            float * dst = a.dq + ((int64_t) t * a.H + h) * D + dq_col0 + (lane & 3) * 2;
#pragma unroll
            for (int nb = 0; nb < NQ / 8; nb++)
                atomicAdd((float2 *) (dst + nb * 8), make_float2(dqa[4 * nb + hf * 2], dqa[4 * nb + hf * 2 + 1]));
        }
    }
}

// dQ of row tile j (dqa: this warpgroup's D/2 columns) added to the f32 accumulator a.dq_acc with
// 16-byte float atomics in fragment order: thread t's quad q at [q][t] of the warpgroup's half of the
// row tile, so each warp's atomic covers 512 contiguous bytes (four whole lines) where one into dq's
// rows (bwd_add_dq) touches eight rows' 32-byte pieces. The accumulator is written into dq after the
// kernel (pa_dq_acc_kernel). FlashAttention-3 adds dQ into such a tile-contiguous accumulator by bulk
// reductions from shared memory; here that measured slower (the staging stores compete with the
// products' shared-memory operands; bench/NOTES.md version 19). j < 0: nothing.
template <int D> __device__ __forceinline__ void bwd_add_dq_acc(const BwdArgs & a, const float (&dqa)[D / 4], int j, int g, int wg, int tid) {
#if OOMB_PA_ABLATION == 3 || OOMB_PA_ABLATION == 4
    return;  // ablation: no dQ adds
#endif
    constexpr int BM = BwdW<D>::BM;
    if (j < 0) return;
    float4 * acc = (float4 *) (a.dq_acc + ((int64_t) g * a.n_rt + j) * BM * D + wg * (BM * D / 2)) + (tid & 127);
#pragma unroll
    for (int q = 0; q < D / 16; q++) atomicAdd(acc + q * 128, make_float4(dqa[4 * q], dqa[4 * q + 1], dqa[4 * q + 2], dqa[4 * q + 3]));
}

// dq (+)= the accumulator of bwd_add_dq_acc ([Hkv][n_rt][2 warpgroups][D/16 quads][128 threads] float4):
// one thread per quad, rows past T G (padding) dropped. accumulate: added to dq, else written.
template <int D>
__global__ void pa_dq_acc_kernel(const float4 * __restrict__ acc, int64_t n_quads, int n_rt, int T, int H, int G, float * __restrict__ dq,
                                 int accumulate) {
    constexpr int BM = BwdW<D>::BM, QWG = BM * D / 8;  // quads per warpgroup's half of a row tile
    const int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x;
    if (i >= n_quads) return;
    const int64_t tile = i / (2 * QWG);
    const int r = (int) (i % (2 * QWG));
    const int wg = r / QWG, q = (r % QWG) / 128, t = r % 128, lane = t & 31;
    const int g = (int) (tile / n_rt), j = (int) (tile % n_rt);
    const int R0 = j * BM + (t >> 5) * 16 + (lane >> 2);
    const int col = wg * (D / 2) + q * 8 + (lane & 3) * 2;
    const float4 v = acc[i];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int R = R0 + hf * 8;
        if (R >= T * G) continue;
        float2 * p = (float2 *) (dq + ((int64_t) (R / G) * H + g * G + R % G) * D + col);
        float2 x = hf ? make_float2(v.z, v.w) : make_float2(v.x, v.y);
        if (accumulate) {
            const float2 o = *p;
            x.x += o.x;
            x.y += o.y;
        }
        *p = x;
    }
}

// The block's dK, dV added into the gradient pages: bf16 pages read-add-round (one block per key
// tile), f32 pages with atomics when several blocks share the key tile (zs > 1, bwd_block), else read-add.
template <int D>
__device__ __forceinline__ void bwd_store_dkdv(const BwdArgs & a, const float (&dk)[D / 2], const float (&dv)[D / 2], int g, int k0, int krow0,
                                               int maxp, int lane, int zs) {
    const uint32_t sk = a.gsr.bf16 ? oomb::sr_kv_salt(a.gsr.seed_k, a.gsr.pos[0]) : 0u;  // bf16 gradient pages
    const uint32_t sv = a.gsr.bf16 ? oomb::sr_kv_salt(a.gsr.seed_v, a.gsr.pos[0]) : 0u;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int p = k0 + krow0 + (lane >> 2) + hf * 8;
        if (p > maxp) continue;
        const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
        if (pg < 0) continue;
        const int64_t off = (int64_t) pg * a.gr_s3 + (int64_t) (p % a.P) * a.gr_s2 + (int64_t) g * a.gr_s1 + (lane & 3) * 2;
        if (a.gsr.bf16) {
#pragma unroll
            for (int nb = 0; nb < D / 8; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    grad_add_bf16(a.gsr, a.dkp, a.dvp, off + nb * 8 + e, p, g, nb * 8 + (lane & 3) * 2 + e, D, dk[4 * nb + hf * 2 + e],
                                  dv[4 * nb + hf * 2 + e], sk, sv);
            continue;
        }
        float * dkr = a.dkp + off;
        float * dvr = a.dvp + off;
        if (zs > 1) {
#pragma unroll
            for (int nb = 0; nb < D / 8; nb++) {
                atomicAdd((float2 *) (dkr + nb * 8), make_float2(dk[4 * nb + hf * 2], dk[4 * nb + hf * 2 + 1]));
                atomicAdd((float2 *) (dvr + nb * 8), make_float2(dv[4 * nb + hf * 2], dv[4 * nb + hf * 2 + 1]));
            }
            continue;
        }
#pragma unroll
        for (int nb = 0; nb < D / 8; nb++) {
            float2 x = *(float2 *) (dkr + nb * 8);
            x.x += dk[4 * nb + hf * 2]; x.y += dk[4 * nb + hf * 2 + 1];
            *(float2 *) (dkr + nb * 8) = x;
            float2 y = *(float2 *) (dvr + nb * 8);
            y.x += dv[4 * nb + hf * 2]; y.y += dv[4 * nb + hf * 2 + 1];
            *(float2 *) (dvr + nb * 8) = y;
        }
    }
}

// MINB: CTAs per SM the registers are capped for (2 at head dim 64: one CTA's softmax overlaps the
// other's products; see bwd_minb)
// LISTS: the page-list schedule, as pa_bwd_kernel (paged-attn-lists.cuh, BwdListsTile).
template <int D, int MINB, bool LISTS = false>
__global__ void __launch_bounds__(256, MINB) pa_bwd_wgmma_kernel(const BwdArgs a) {
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    using W = BwdW<D>;
    constexpr int BN = W::BN, BM = W::BM, NT = W::NT;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw_s = smem_u32(smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    unsigned char * base = smem_raw + (base_s - raw_s);
    bf16 * sK = (bf16 *) base;
    bf16 * sV = sK + BN * D;
    bf16 * sQ = sV + BN * D;          // [2 bufs][BM * D]
    bf16 * sdO = sQ + 2 * BM * D;     // [2 bufs][BM * D]
    bf16 * sdS = sdO + 2 * BM * D;    // [BN][BM]
    float * sL = (float *) (sdS + BN * BM); // [2][BM]
    float * sDl = sL + 2 * BM;              // [2][BM]
    int * sRp = (int *) (sDl + 2 * BM);     // [2][BM]
    const uint32_t aK = base_s, aV = aK + W::tile_kv, aQ = aV + W::tile_kv, adO = aQ + 2 * W::tile_q, adS = adO + 2 * W::tile_q;

    const int maxp = *a.maxpos;
    const BwdBlock blk = bwd_block<LISTS>(a, BN, maxp);
    if (blk.z >= blk.zs) return;
    const int g = blk.g;
    const int k0 = blk.kt * BN;
    if (k0 > maxp) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warpgroup: keys 64 wg .. 64 wg + 63 of the tile (lane 0's: seen warp-uniform)
    BwdListsTile lt;
    __shared__ uint32_t sSee[LISTS ? BM : 1];  // LISTS: row bits of the current row tile (lt.row_bits)
    __shared__ uint32_t sQm[LISTS ? 2 * BwdListsTile::QM_WORDS : 1];  // LISTS: query-tile masks (lt.qmasks)
    int kpi[2] = {0, 0};                       // LISTS: page index (from lt.lp_a) of this thread's two keys
    if constexpr (LISTS) {
        if (!lt.begin(a, k0, BN, maxp, k0 + warp * 16 + (lane >> 2), kpi, blk.z, blk.zs)) return;  // no row chose these keys
    }

    bwd_load_kv<D>(a, g, k0, maxp, sK, sV, tid);
    cp_async_commit();
    if constexpr (LISTS) lt.qmasks(a, tid, NT, sQm);  // (its barriers and searches under the K/V copies)

    const int zs = blk.zs;
    auto rt_needed = [&](int j) -> bool {
        if constexpr (LISTS) return lt.needed(a, j);
        else return a.rt_max[j] >= k0;
    };
    auto next_rt = [&](int j) {
        while (j < a.n_rt && !rt_needed(j)) j += zs;
        return j;
    };
    auto load_rows = [&](int j, int buf) {
        bwd_load_rows<D>(a, g, j, sQ + buf * BM * D, sdO + buf * BM * D, sL + buf * BM, sDl + buf * BM, sRp + buf * BM, tid);
    };

    float dk[D / 2], dv[D / 2];   // 64 keys x 128 dims per warpgroup (wgmma accumulator layout)
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.0f;

    const int krow0 = warp * 16;  // this warp's first key of the tile (= 64 wg + 16 (warp % 4))
    int j = next_rt(blk.z);
    int jn = j < a.n_rt ? next_rt(j + zs) : a.n_rt;
    if (j < a.n_rt) load_rows(j, 0);
    cp_async_commit();
    int buf = 0;
    while (j < a.n_rt) {
        if (jn < a.n_rt) load_rows(jn, buf ^ 1);
        cp_async_commit();
        const int cand = jn + zs;
        const int cand_max = cand < a.n_rt ? a.rt_max[cand] : -1;
        bool cand_ok = false;  // LISTS: whether cand is needed (DENSE: cand_max >= k0, tested after the math)
        if constexpr (LISTS) cand_ok = cand < a.n_rt && lt.needed(a, cand);
        const int rt_min_j = a.rt_min[j];
        bool pb = false;  // LISTS: the rows' page bits apply
        if constexpr (LISTS) {
            pb = lt.page_bits(a, j);
            if (pb) lt.row_bits(a, j, BM, tid, NT, sSee);  // the previous step's readers passed its last barrier
        }
        cp_async_wait<1>();
        fence_proxy_async();   // the cp.async data is read by wgmma (async proxy)
        __syncthreads();
        const float * cL = sL + buf * BM;
        const float * cDl = sDl + buf * BM;
        const int * cRp = sRp + buf * BM;
        const uint32_t cQ = aQ + buf * W::tile_q, cdO = adO + buf * W::tile_q;
        const bool need_mask = pb || rt_min_j < k0 + BN - 1;

        float st[BM / 2], dpt[BM / 2];
        bwd_issue_sdp<D>(st, dpt, aK, aV, cQ, cdO, wg);
        wgmma_wait<0>();
        bwd_softmax<LISTS>(st, dpt, a, cL, cDl, cRp, k0 + krow0 + (lane >> 2), need_mask, pb, sSee, kpi, lane);
        uint32_t pa[BM / 16][4], da[BM / 16][4];
        bwd_pack(st, pa);
        bwd_pack(dpt, da);
        bwd_issue_dkdv<D>(dk, dv, pa, da, cQ, cdO);
        bwd_store_ds(sdS, da, krow0, lane);   // for dQ = dS K
        fence_proxy_async();
        float dqa[D / 4];
        __syncthreads();   // both warpgroups' dS^T
        bwd_issue_dq<D>(dqa, adS, aK, wg);
        wgmma_wait<0>();
        bwd_add_dq<D>(a, dqa, j, g, wg, warp, lane);
        __syncthreads();
        const int jnn = cand >= a.n_rt ? a.n_rt : ((LISTS ? cand_ok : cand_max >= k0) ? cand : next_rt(cand + zs));
        j = jn;
        jn = jnn;
        buf ^= 1;
    }
    cp_async_wait<0>();
    bwd_store_dkdv<D>(a, dk, dv, g, k0, krow0, maxp, lane, zs);
#else
    __trap();  // launched only where wgmma_available() said the sm_90a code is there
#endif
}

template <bool B> struct BwdLast { static constexpr bool value = B; };

// The backward with the row tiles overlapped (config.bwd_pipe): the products and work split of
// pa_bwd_wgmma_kernel, ordered so that the tensor cores wait for neither a second block barrier,
// nor the dQ atomics, nor a load, and row tile j + 1's softmax runs while dQ(j) computes:
//   - q / dO in three buffers: row tile j + 2 loads while tile j computes (one barrier of slack), by
//     bulk copies from thread 0 (bwd_bulk_rows; q / dO stored per tile in shared memory's layout by
//     pa_prep_kernel), each buffer completing on its own mbarrier, so no consumer thread computes addresses;
//     dS^T in two, so that tile j + 1's dS^T does not overwrite what dQ(j) still reads;
//   - one block barrier per row tile: both warpgroups' dS^T stored (the next tile's loads: its mbarrier);
//   - after it, once dV / dK(j) have retired (their P^T / dS^T register operands free: registers
//     hold one more accumulator set, not two), S^T / dP^T(j + 1) and then dQ(j) are issued; the
//     next step's softmax needs only the first, so it runs under dQ(j), and dQ(j)'s atomics follow
//     (under dV / dK(j + 1) they measured slower at head dim 64, the same at 128: NOTES version 17).
// ptxas keeps the wgmmas asynchronous only in such shapes (bench/NOTES.md version 17): the wait that
// splits two groups stands before the loop's back edge (two groups across it: C7514; so S^T and
// dP^T are one group, and the softmax of P cannot start under dP^T); dQ(j) issued first with its
// atomics under S^T / dP^T(j + 1) was serialised too (C7518). The last row tile is peeled (BwdLast):
// no next tile to issue, so no wgmma is issued conditionally inside the loop. Shared memory: 195 KB
// at head dim 128, 115 KB at 64; one CTA per SM.
// KVR (head dim 64, config.bwd_kvr): K and V held in registers as the A operands of S^T and dP^T
// (bwd_load_kv_frags, 32 registers) instead of read from shared memory by every row tile.
// DQA (config.bwd_dqacc): dQ added into a.dq_acc (bwd_add_dq_acc), else into a.dq (bwd_add_dq).
template <int D, bool LISTS = false, bool KVR = false, bool DQA = false>
__global__ void __launch_bounds__(256, 1) pa_bwd_pipe_kernel(const BwdArgs a) {
    static_assert(!KVR || D == 64, "K / V fragments in registers: head dim 64 only");
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    using W = BwdW<D, 3, 2>;
    constexpr int BN = W::BN, BM = W::BM, NT = W::NT;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw_s = smem_u32(smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    unsigned char * base = smem_raw + (base_s - raw_s);
    bf16 * sK = (bf16 *) base;
    bf16 * sV = sK + BN * D;
    bf16 * sQ = sV + BN * D;               // [3 bufs][BM * D]
    bf16 * sdO = sQ + 3 * BM * D;          // [3 bufs][BM * D]
    bf16 * sdS = sdO + 3 * BM * D;         // [2 bufs][BN][BM]
    float * sL = (float *) (sdS + 2 * BN * BM);  // [3][BM]
    float * sDl = sL + 3 * BM;                   // [3][BM]
    int * sRp = (int *) (sDl + 3 * BM);          // [3][BM]
    const uint32_t aK = base_s, aV = aK + W::tile_kv, aQ = aV + W::tile_kv, adO = aQ + 3 * W::tile_q, adS = adO + 3 * W::tile_q;

    const int maxp = *a.maxpos;
    const BwdBlock blk = bwd_block<LISTS>(a, BN, maxp);
    if (blk.z >= blk.zs) return;
    const int g = blk.g;
    const int k0 = blk.kt * BN;
    if (k0 > maxp) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // (from lane 0: the compiler sees it warp-uniform, so descriptors stay in uniform registers)
    const int krow0 = warp * 16;
    BwdListsTile lt{};  // (set by begin under LISTS; {}: the lambdas below capture it)
    __shared__ uint32_t sSee[LISTS ? 2 * BM : 1];  // LISTS: row bits, one slot per dS^T buffer
    __shared__ uint32_t sQm[LISTS ? 2 * BwdListsTile::QM_WORDS : 1];  // LISTS: query-tile masks (lt.qmasks)
    int kpi[2] = {0, 0};
    if constexpr (LISTS) {
        if (!lt.begin(a, k0, BN, maxp, k0 + krow0 + (lane >> 2), kpi, blk.z, blk.zs)) return;
    }
    const int zs = blk.zs;
    auto rt_needed = [&](int j) -> bool {
        if constexpr (LISTS) return lt.needed(a, j);
        else return a.rt_max[j] >= k0;
    };
    auto next_rt = [&](int j) {
        while (j < a.n_rt && !rt_needed(j)) j += zs;
        return j;
    };
    int j = next_rt(blk.z);
    if (j >= a.n_rt) return;  // no row tile of this split attends the keys: no gradient to add
    // row tiles by bulk copies from thread 0, each buffer's completing on its mbarrier (rows_bar; the
    // parity a thread waits for next on buffer b: bit b of rows_ph)
    __shared__ alignas(8) uint64_t sBar[3];
    const uint32_t rows_bar = smem_u32(sBar);
    uint32_t rows_ph = 0;
    auto load_rows = [&](int jj, int b) {
        if (tid == 0)
            bwd_bulk_rows<D>(a, g, jj, aQ + b * W::tile_q, adO + b * W::tile_q, smem_u32(sL + b * BM), smem_u32(sDl + b * BM),
                             smem_u32(sRp + b * BM), rows_bar + 8 * b);
    };
    auto wait_rows = [&](int b) {
        oomb_sm90::mbar_wait(rows_bar + 8 * b, (rows_ph >> b) & 1u);
        rows_ph ^= 1u << b;
    };
    if (tid == 0) {
        for (int b = 0; b < 3; b++) oomb_sm90::mbar_init(rows_bar + 8 * b, 1);
        oomb_sm90::fence_mbar_init();
    }

    bwd_load_kv<D>(a, g, k0, maxp, sK, sV, tid);
    cp_async_commit();
    int jn = next_rt(j + zs);
    load_rows(j, 0);
    if (jn < a.n_rt) load_rows(jn, 1);
    if constexpr (LISTS) {
        lt.qmasks(a, tid, NT, sQm);  // (its barriers and searches under the copies)
        if (lt.page_bits(a, j)) lt.row_bits(a, j, BM, tid, NT, sSee);
    }
    cp_async_wait<0>();   // K, V
    fence_proxy_async();
    __syncthreads();
    wait_rows(0);         // row tile j

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.0f;
    uint32_t kf[KVR ? D / 16 : 1][4], vf[KVR ? D / 16 : 1][4];
    if constexpr (KVR) bwd_load_kv_frags<D>(sK, sV, kf, vf, krow0, lane);
    auto issue_sdp = [&](float (&st_)[BM / 2], float (&dpt_)[BM / 2], uint32_t cQ, uint32_t cdO) {
        if constexpr (KVR) bwd_issue_sdp_rs<D>(st_, dpt_, kf, vf, cQ, cdO);
        else bwd_issue_sdp<D>(st_, dpt_, aK, aV, cQ, cdO, wg);
    };
    float st[BM / 2], dpt[BM / 2], dqa[D / 4];
    // dQ of row tile jj into the accumulator or dq
    auto add_dq = [&](int jj) {
        if constexpr (DQA) bwd_add_dq_acc<D>(a, dqa, jj, g, wg, tid);
        else bwd_add_dq<D>(a, dqa, jj, g, wg, warp, lane);
    };
    issue_sdp(st, dpt, aQ, adO);
    wgmma_wait<0>();

    // A step starts with S/dP(j) retired and dQ of the previous row tile jp in flight; each step but
    // the last ends in that state for the next.
    int bq = 0, bs = 0, jp = -1;  // row tile j's q / dO buffer and dS^T buffer; the previous row tile
    auto step = [&](auto last) {
        constexpr bool LAST = decltype(last)::value;
        const int jn2 = LAST ? a.n_rt : next_rt(jn + zs);
        const float * cL = sL + bq * BM;
        const float * cDl = sDl + bq * BM;
        const int * cRp = sRp + bq * BM;
        const uint32_t cQ = aQ + bq * W::tile_q, cdO = adO + bq * W::tile_q;
        const bool pb = LISTS && lt.page_bits(a, j);  // the rows' page bits apply
        const bool need_mask = pb || a.rt_min[j] < k0 + BN - 1;
        const int kq = k0 + krow0 + (lane >> 2);
        bwd_softmax<LISTS>(st, dpt, a, cL, cDl, cRp, kq, need_mask, pb, sSee + bs * BM, kpi, lane);  // under dQ(jp)
        wgmma_wait<0>();
        add_dq(jp);  // (jp < 0: nothing)
        uint32_t pa[BM / 16][4], da[BM / 16][4];
        bwd_pack(st, pa);
        bwd_pack(dpt, da);
        bwd_issue_dkdv<D>(dk, dv, pa, da, cQ, cdO);
        bwd_store_ds(sdS + bs * BN * BM, da, krow0, lane);
        if constexpr (LISTS && !LAST) {
            if (lt.page_bits(a, jn)) lt.row_bits(a, jn, BM, tid, NT, sSee + (bs ^ 1) * BM);  // its slot's readers (tile jp) passed the last barrier
        }
        fence_proxy_async();  // dS^T, read by wgmma (and this thread's reads of the row buffers before the bulk writes below)
        __syncthreads();      // both warpgroups' dS^T
        if constexpr (!LAST) {
            // jn2 into the buffer of the previous row tile, whose readers (S/dP, dV/dK(jp), the
            // softmax's lse / delta / positions) retired in both warpgroups before the barrier
            if (jn2 < a.n_rt) load_rows(jn2, bq == 0 ? 2 : bq - 1);
        }
        const uint32_t cdS = adS + bs * W::tile_ds;
        const int bqn = bq == 2 ? 0 : bq + 1;
        if constexpr (LAST) {
            bwd_issue_dq<D>(dqa, cdS, aK, wg);
        } else {
            wgmma_wait<0>();   // dV/dK(j): pa, da free
            wait_rows(bqn);    // row tile jn landed
            issue_sdp(st, dpt, aQ + bqn * W::tile_q, adO + bqn * W::tile_q);
            bwd_issue_dq<D>(dqa, cdS, aK, wg);
            wgmma_wait<1>();   // S/dP(j + 1)
        }
        jp = j;
        j = jn;
        jn = jn2;
        bq = bqn;
        bs ^= 1;
    };
    while (jn < a.n_rt) step(BwdLast<false>{});
    step(BwdLast<true>{});
    wgmma_wait<0>();
    add_dq(jp);
    bwd_store_dkdv<D>(a, dk, dv, g, k0, krow0, maxp, lane, zs);
#else
    __trap();  // launched only where wgmma_available() said the sm_90a code is there
#endif
}

// Compiled for sm_90a (so the kernel above has its body)?
__global__ void pa_wgmma_probe_kernel(int * flag) {
#ifdef OOMB_WGMMA
    *flag = 1;
#else
    *flag = 0;
#endif
}

// ---------------------------------------------------------------------------------------------
// Forward pieces shared by the wgmma forward kernels (pa_fwd_wgmma_kernel below, pa_fwd_ws_kernel of
// paged-attn-ws.cuh): the block's q rows into shared memory, one key tile's online softmax, the
// epilogue. Accumulator layout of wgmma.cuh: a thread holds rows lane/4 and lane/4 + 8 (hf = 0, 1)
// of its warp's 16, columns nb * 8 + 2 (lane % 4) + {0, 1}.
// ---------------------------------------------------------------------------------------------

// q rows r0 .. r0 + BM - 1 of KV head g (row R = token R / G, head g G + R % G; past T G: zeros) as
// bf16 into sQ, [D/64 halves][BM rows][64] with the 128-byte swizzle (sw128), by NT threads.
template <int D, int BM, int NT>
__device__ __forceinline__ void fwd_load_q(const FwdArgs & a, bf16 * sQ, int r0, int g, int tid) {
    constexpr int NCH = D / 8;
    const int TG = a.T * a.G;
    for (int idx = tid; idx < BM * NCH; idx += NT) {
        const int row = idx / NCH, ch = idx % NCH;
        const int R = r0 + row;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (R < TG) {
            const int t = R / a.G, h = g * a.G + R % a.G;
            const float4 * src = (const float4 *) (a.q + t * a.q_s2 + h * a.q_s1 + ch * 8);
            v = pack8(src[0], src[1]);
        }
        *(uint4 *) (sQ + sw128<BM>(row, ch)) = v;
    }
}

// S = Q K^T for a warpgroup's 64 rows (row block wq of the BM-row q tile at shared address aQ, both
// K-major, sw128) against the BN-key tile at cK: D / 16 wgmmas issued into s (no fence, no commit).
template <int D, int BM, int BN>
__device__ __forceinline__ void fwd_issue_s(float (&s)[BN / 2], uint32_t aQ, int wq, uint32_t cK) {
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    const uint64_t dQ = desc_sw128(aQ + wq * (64 * 128), 16, 1024), dK = desc_sw128(cK, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        mma_ss_n128<0, 0>(s, desc_add(dQ, (kk >> 2) * (BM * 128) + (kk & 3) * 32), desc_add(dK, (kk >> 2) * (BN * 128) + (kk & 3) * 32), kk > 0);
#endif
}

// O += P V: the P fragments pa against the BN-key V tile at cV (MN-major): BN / 16 wgmmas issued
// (no fence, no commit).
template <int D, int BN>
__device__ __forceinline__ void fwd_issue_pv(float (&o)[D / 2], const uint32_t (&pa)[BN / 16][4], uint32_t cV) {
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    const uint64_t dV = desc_sw128(cV, BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) mma_rs_nd<D>(o, pa[kk], desc_add(dV, kk * 2048), 1);
#endif
}

// Online softmax of one key tile (keys k0 .. k0 + BN - 1) for a warpgroup's 64 rows, without o:
// s = S (raw products) in, masked (keys > lim[hf] of the thread's row hf get -inf when MASK), P =
// exp2(c s - m) out in place (c = scale * log2 e > 0: the launcher runs the wgmma forwards only then,
// fwd_wgmma); m, l: running max and sum (log2 units), updated; corr[hf] = exp2(m_old - m_new), the
// factor o must be rescaled by before O += P V. As FlashAttention-3: the row max over the raw products
// (c > 0: max(c s) = c max(s), rounding being monotone) and one FFMA per element into the exp2, instead
// of scaling every product first; the mask's compares and selects only in the tiles that need them
// (the others, all but a row tile's last one or two, take the MASK = false copy).
// Writes only s and the row statistics: it may run while an O += P V is in flight.
template <int BN, bool MASK>
__device__ __forceinline__ void fwd_softmax_p_t(float (&s)[BN / 2], float (&m)[2], float (&l)[2], const int (&lim)[2], int k0, float c,
                                                int lane, float (&corr)[2]) {
#if OOMB_PA_ABLATION == 7
    corr[0] = corr[1] = 1.0f;  // ablation (bench/attention/ablate.sh): no softmax in the forward
    return;
#endif
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < BN / 8; nb++) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float v = s[4 * nb + hf * 2 + j];
                if constexpr (MASK) {
                    const int kp = k0 + nb * 8 + (lane & 3) * 2 + j;
                    if (kp > lim[hf]) v = -INFINITY;
                    s[4 * nb + hf * 2 + j] = v;
                }
                mx = fmaxf(mx, v);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[hf], mx * c);
        const float muse = mnew == -INFINITY ? 0.0f : mnew;
        corr[hf] = ex2(m[hf] - muse);
        m[hf] = mnew;
        float rs = 0.0f;
#pragma unroll
        for (int nb = 0; nb < BN / 8; nb++) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
#if OOMB_PA_ABLATION == 6
                const float p = fmaf(s[4 * nb + hf * 2 + j], c, -muse);  // ablation: no exp2 in the forward
#else
                const float p = ex2(fmaf(s[4 * nb + hf * 2 + j], c, -muse));
#endif
                s[4 * nb + hf * 2 + j] = p;
                rs += p;
            }
        }
        l[hf] = l[hf] * corr[hf] + rs;
    }
}
template <int BN>
__device__ __forceinline__ void fwd_softmax_p(float (&s)[BN / 2], float (&m)[2], float (&l)[2], const int (&lim)[2], int k0, bool need_mask,
                                              float c, int lane, float (&corr)[2]) {
    if (need_mask) fwd_softmax_p_t<BN, true>(s, m, l, lim, k0, c, lane, corr);
    else fwd_softmax_p_t<BN, false>(s, m, l, lim, k0, c, lane, corr);
}

// P (s after fwd_softmax_p) as bf16 A fragments for O += P V.
template <int BN> __device__ __forceinline__ void fwd_pack_p(const float (&s)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

// o (a warpgroup's 64 x D accumulator) rescaled by corr of its rows (hf = 0, 1). At head dim 128, skipped
// by a warp whose rows' maxima all stayed (corr exactly 1: o * 1 = o, NaN and signed zeros included), as
// most tiles of a long history are (the row max settles early); a warp-uniform branch, taken with no wgmma
// writing o in flight (the PIPE kernel may have the next S in flight, whose accumulator is not o). H100,
// forward TFLOP/s with / without the skip: 7B layer at 32K 645 / 634 against 620 / 605; 0.5B layer (head
// dim 64: 32 multiplies to save) 442 / 439 against 450 / 447, so not there (bench/NOTES.md "Session 26").
// (Ablation 7 sets corr = 1, so there it skips the rescale too.)
template <int D> __device__ __forceinline__ void fwd_rescale_o(float (&o)[D / 2], const float (&corr)[2]) {
    if constexpr (D == 128) {
        if (__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) return;
    }
#pragma unroll
    for (int nb = 0; nb < D / 8; nb++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) { o[4 * nb + hf * 2] *= corr[hf]; o[4 * nb + hf * 2 + 1] *= corr[hf]; }
    }
}

// The whole online-softmax step of one key tile: fwd_softmax_p, then o rescaled. Call with no wgmma
// writing o or s in flight.
template <int D, int BN>
__device__ __forceinline__ void fwd_softmax_tile(float (&s)[BN / 2], float (&o)[D / 2], float (&m)[2], float (&l)[2], const int (&lim)[2],
                                                 int k0, bool need_mask, float c, int lane, uint32_t (&pa)[BN / 16][4]) {
    float corr[2];
    fwd_softmax_p<BN>(s, m, l, lim, k0, need_mask, c, lane, corr);
    fwd_pack_p<BN>(s, pa);
    fwd_rescale_o<D>(o, corr);
}

// The forward's epilogue for a warp's 16 rows (block rows row0 .. row0 + 15 of the tile at r0):
// MODE_OUT out + natural-log LSE (pa_epilogue_out); MODE_LSE the log2 LSE and delta = bf16(dout) . out.
template <int D, int MODE>
__device__ __forceinline__ void fwd_epilogue(const FwdArgs & a, const float (&o)[D / 2], const float (&m)[2], const float (&l)[2], int r0,
                                             int row0, int g, int lane, float * out, float * lse_out, int acc) {
    const int TG = a.T * a.G;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float lsum = l[hf];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        const int R = r0 + row0 + (lane >> 2) + hf * 8;
        const bool valid = R < TG;
        const int t = valid ? R / a.G : 0, h = g * a.G + (valid ? R % a.G : 0);
        if (MODE == MODE_OUT) {
            const float mu = m[hf] == -INFINITY ? 0.0f : m[hf];
            pa_epilogue_out<D>(out, lse_out, acc, valid, (int64_t) t * a.H + h, lane, (mu + __log2f(lsum)) * kLn2,
                               [&](int nb, int j) { return o[4 * nb + hf * 2 + j] * inv; });
        } else {
            float dot = 0.0f;
            if (valid) {
                const float * dov = a.dout + t * a.do_s2 + h * a.do_s1 + (lane & 3) * 2;
#pragma unroll
                for (int nb = 0; nb < D / 8; nb++) {
                    const float2 x = *(const float2 *) (dov + nb * 8);
                    const float x0 = __bfloat162float(__float2bfloat16_rn(x.x));
                    const float x1 = __bfloat162float(__float2bfloat16_rn(x.y));
                    dot += x0 * o[4 * nb + hf * 2] + x1 * o[4 * nb + hf * 2 + 1];
                }
            }
            dot += __shfl_xor_sync(0xffffffffu, dot, 1);
            dot += __shfl_xor_sync(0xffffffffu, dot, 2);
            if (valid && (lane & 3) == 0) {
                const float mu = m[hf] == -INFINITY ? 0.0f : m[hf];
                a.lse[g * a.lse_stride + R] = mu + __log2f(lsum);
                a.delta[g * a.lse_stride + R] = dot * inv;
            }
        }
    }
}
template <int D, int MODE>
__device__ __forceinline__ void fwd_epilogue(const FwdArgs & a, const float (&o)[D / 2], const float (&m)[2], const float (&l)[2], int r0,
                                             int row0, int g, int lane) {
    fwd_epilogue<D, MODE>(a, o, m, l, r0, row0, g, lane, a.out, a.lse_out, a.acc);
}

// ---------------------------------------------------------------------------------------------
// Forward on wgmma, head dim 64 or 128, key tiles of BN = 128 (the page size a multiple of 128: one
// page-table lookup per tile). A block = BM = 128 group rows of one KV head (two warpgroups of 64
// rows) against the keys 0 .. max pos of its rows; per key tile and warpgroup: S = Q K^T (both
// K-major in shared memory), online softmax in f32 (exp2, causal mask key <= pos of the row),
// O += P V (P as bf16 register fragments, V MN-major). K/V double-buffered by cp.async; the next
// tile's loads are issued after the barrier that ends the use of its buffer. Epilogue and modes as
// pa_fwd_kernel (MODE_OUT: out + natural-log LSE; MODE_LSE: log2 LSE + delta for the backward).
// Formula: FlashAttention-2 (Dao 2023), Alg. 1.
// ---------------------------------------------------------------------------------------------

template <int D, bool PIPE>
struct FwdW {
    static constexpr int BM = 128, BN = 128, NT = 256, NBUF = PIPE ? 3 : 2;
    static constexpr uint32_t tile_q = BM * D * 2, tile_kv = BN * D * 2;
    static constexpr size_t smem = 1024 + tile_q + 2 * NBUF * tile_kv + BM * sizeof(int);
};

// LISTS: the page-list schedule, as pa_fwd_kernel (paged-attn-lists.cuh); the two-buffer loop only.
template <int D, int MODE, bool PIPE, int MINB, bool LISTS = false>
__global__ void __launch_bounds__(256, MINB) pa_fwd_wgmma_kernel(const FwdArgs a) {
    static_assert(!(LISTS && PIPE), "page lists run on the two-buffer loop");
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    using W = FwdW<D, PIPE>;
    constexpr int BM = W::BM, BN = W::BN, NT = W::NT, NBUF = W::NBUF;
    constexpr int NCH = D / 8;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw_s = smem_u32(smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    unsigned char * base = smem_raw + (base_s - raw_s);
    bf16 * sQ = (bf16 *) base;                       // [2 halves][BM][64]
    bf16 * sK = sQ + BM * D;                         // [NBUF][D/64 halves][BN][64]
    bf16 * sV = sK + NBUF * BN * D;                  // [NBUF][D/64 halves][BN][64]
    int * sPos = (int *) (sV + NBUF * BN * D);       // [BM]
    const uint32_t aQ = base_s, aK = aQ + W::tile_q, aV = aK + NBUF * W::tile_kv;
    __shared__ int sMax[2], sMin;

    const int g = blockIdx.y;
    const int rt = gridDim.x - 1 - blockIdx.x; // heaviest tiles (largest positions) first
    const int TG = a.T * a.G;
    const int r0 = rt * BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // (lane 0's: seen warp-uniform, descriptors in uniform registers)

    if (tid < 2) sMax[tid] = -1;
    if (tid == 0) sMin = INT_MAX;
    __syncthreads();
    for (int i = tid; i < BM; i += NT) {
        const int R = r0 + i;
        int p = -1;
        if (R < TG) {
            p = a.pos[R / a.G];
            atomicMax(&sMax[i / 64], p);
            atomicMin(&sMin, p);
        }
        sPos[i] = p;
    }
    fwd_load_q<D, BM, NT>(a, sQ, r0, g, tid);
    fence_proxy_async();
    __syncthreads();
    const int maxp = max(sMax[0], sMax[1]), minp = sMin;
    const int maxp_wg = sMax[wg];
    if (maxp < 0) return;
    FwdListsTiles lt;  // LISTS: the union's history tiles, then the current region's (as pa_fwd_kernel)
    if constexpr (LISTS) lt.init(a.lists, a.P, BN, rt, minp, maxp);
    const int n_tiles = LISTS ? lt.n_tiles(maxp) : maxp / BN + 1;
    auto tile_k0 = [&](int tile) -> int {
        if constexpr (!LISTS) return tile * BN;
        else return lt.k0(tile);
    };

    auto tile_page = [&](int tile) -> int { return page_of(a.pt, a.n_logical, a.n_pages, a.P, tile_k0(tile)); };
    auto load_kv = [&](int tile, int buf, int pg) {
        const int k0 = tile_k0(tile);
        bf16 * dK = sK + buf * BN * D;
        bf16 * dV = sV + buf * BN * D;
        const int64_t kbase = (int64_t) pg * a.kv_s3 + (int64_t) (k0 % a.P) * a.kv_s2 + (int64_t) g * a.kv_s1;
#pragma unroll
        for (int i = 0; i < BN * NCH / NT; i++) {
            const int idx = tid + i * NT;
            const int row = idx / NCH, ch = idx % NCH;
            const bool ok = pg >= 0 && k0 + row <= maxp;
            const int64_t off = ok ? kbase + (int64_t) row * a.kv_s2 + ch * 8 : 0;
            cp_async16(smem_u32(dK + sw128<BN>(row, ch)), a.kp + off, ok ? 16 : 0);
            cp_async16(smem_u32(dV + sw128<BN>(row, ch)), a.vp + off, ok ? 16 : 0);
        }
    };

    float o[D / 2];
    float m[2], l[2];
    int prow[2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        m[hf] = -INFINITY; l[hf] = 0.0f;
        prow[hf] = sPos[warp * 16 + (lane >> 2) + hf * 8];
    }

    const int n_wg = maxp_wg < 0 ? 0 : maxp_wg / BN + 1;  // tiles this warpgroup computes (its rows' keys)
    // S = Q K^T of tile `it` into s (issued, not waited)
    auto issue_s = [&](float (&s)[BN / 2], int it) {
        const uint32_t cK = aK + (it % NBUF) * W::tile_kv;
        wgmma_fence();
        fwd_issue_s<D, BM, BN>(s, aQ, wg, cK);
        wgmma_commit();
    };
    // online softmax of tile `it` (s complete), rescale of o (the previous O += P V complete), then
    // O += P V issued (not waited)
    auto softmax_pv = [&](float (&s)[BN / 2], int it) {
        const int k0 = tile_k0(it);
        const uint32_t cV = aV + (it % NBUF) * W::tile_kv;
        // LISTS history tile: every key is before every row; a row sees all of it or none (all: single)
        const bool hist = LISTS && lt.hist_masked(it);
        const int4 ue = hist ? lt.uni[it / lt.tpp] : make_int4(0, 0, 0, 0);
        const bool need_mask = hist || k0 + BN - 1 > minp;
        int lim[2] = {prow[0], prow[1]};  // keys kp > lim are masked
        if constexpr (LISTS) {
            if (hist) { lim[0] = lt.hist_lim(ue, prow[0]); lim[1] = lt.hist_lim(ue, prow[1]); }
        }
        uint32_t pa[BN / 16][4];
        fwd_softmax_tile<D, BN>(s, o, m, l, lim, k0, need_mask, a.c, lane, pa);
        wgmma_fence();
        fwd_issue_pv<D, BN>(o, pa, cV);
        wgmma_commit();
    };

    if constexpr (!PIPE) {
        // two buffers: S of a tile, wait, softmax, P V; the next tile loads meanwhile
        load_kv(0, 0, tile_page(0));
        cp_async_commit();
        int pg_next = n_tiles > 1 ? tile_page(1) : -1;
        float s[BN / 2];
        for (int it = 0; it < n_tiles; it++) {
            wgmma_wait<0>();       // this warpgroup's O += P V of the previous tile has read its buffer
            cp_async_wait<0>();
            fence_proxy_async();
            __syncthreads();       // tile it landed; nobody reads the other buffer any more
            if (it + 1 < n_tiles) load_kv(it + 1, (it + 1) % NBUF, pg_next);
            cp_async_commit();
            pg_next = it + 2 < n_tiles ? tile_page(it + 2) : -1;
            if (LISTS ? maxp_wg < 0 || (!lt.hist(it) && lt.k0(it) > maxp_wg) : it >= n_wg) continue;   // every key of the tile is past this warpgroup's rows
            issue_s(s, it);
            wgmma_wait<0>();
            softmax_pv(s, it);
        }
    } else {
        // three buffers, tiles loaded two ahead; S of tile it + 1 issued before the softmax of tile
        // it (FlashAttention-3's intra-warpgroup overlap). Not a real overlap yet: ptxas serializes
        // this kernel's wgmmas (warning C7515: ordinary instructions define accumulator registers
        // inside a wgmma pipeline stage: the o rescale, and register moves between the two S
        // accumulators), and it measured slower than the two-buffer loop: off unless asked for.
        load_kv(0, 0, tile_page(0));
        cp_async_commit();
        if (n_tiles > 1) load_kv(1, 1, tile_page(1));
        cp_async_commit();
        int pg_next = n_tiles > 2 ? tile_page(2) : -1;
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
        float sA[BN / 2], sB[BN / 2];
        if (n_wg > 0) issue_s(sA, 0);
        auto step = [&](float (&sc)[BN / 2], float (&sn)[BN / 2], int it) {
            wgmma_wait<0>();       // S of tile it and O += P V of tile it - 1 complete
            if (it + 1 < n_tiles) {
                cp_async_wait<0>();
                fence_proxy_async();
            }
            __syncthreads();       // tile it + 1 landed; buffer (it + 2) % 3 = (it - 1) % 3 is free
            if (it + 2 < n_tiles) load_kv(it + 2, (it + 2) % NBUF, pg_next);
            cp_async_commit();
            pg_next = it + 3 < n_tiles ? tile_page(it + 3) : -1;
            if (it + 1 < n_wg) issue_s(sn, it + 1);
            if (it < n_wg) softmax_pv(sc, it);
        };
        for (int it = 0; it < n_tiles; it += 2) {
            step(sA, sB, it);
            if (it + 1 < n_tiles) step(sB, sA, it + 1);
        }
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    fwd_epilogue<D, MODE>(a, o, m, l, r0, warp * 16, g, lane);
#else
    __trap();
#endif
}

} // namespace
