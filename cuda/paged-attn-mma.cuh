// Paged attention on CUDA, the mma.sync family (sm_80+ tensor cores, bf16 pools, head dims 64 and
// 128): the FlashAttention-2 style forward (pa_fwd_kernel, output and LSE modes) and key-major
// backward (pa_bwd_kernel), plus the backward's row metadata and q/dout preparation kernels that
// the wgmma backward shares. Design notes: the top of paged-attn.cu. Included by paged-attn.cu only.
#pragma once

#include "paged-attn-common.cuh"
#include "paged-attn-lists.cuh"

namespace {

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
    PaLists lists;                                    // LISTS kernels only (paged-attn-lists.cuh)
    int acc;                                          // MODE_OUT: accumulate (oomb_paged_attn_args), pa_epilogue_out
    // MODE_OUT, the warp-specialised forward's key split (fwd_kv_split, paged-attn.cu; 0 or 1: none):
    // fsplit blocks per row tile (blockIdx.z) share its key tiles, at least fsplit_min tiles each (fewer:
    // the last block takes them all); the last writes out / lse_out (with acc), block z < fsplit - 1
    // the packed partial result part + z * part_stride (out [T][H][D], then the LSE), merged into out after.
    float * part; int64_t part_stride; int fsplit, fsplit_min;
};

// A forward block's rows r0 .. r0 + BM - 1 (row R < TG = T G: token R / G): each row's position into sPos (-1
// past T G), the block's max / min position into *sMax / *sMin (set to -1 / INT_MAX and synchronised
// before), by NT threads; a barrier before they are read.
template <int BM, int NT>
__device__ __forceinline__ void fwd_row_positions(const FwdArgs & a, int TG, int r0, int tid, int * sPos, int * sMax, int * sMin) {
    for (int i = tid; i < BM; i += NT) {
        const int R = r0 + i;
        int p = -1;
        if (R < TG) {
            p = a.pos[R / a.G];
            atomicMax(sMax, p);
            atomicMin(sMin, p);
        }
        sPos[i] = p;
    }
}

template <int D, int WM, int BN, int NW>
struct FwdCfg {
    static constexpr int BM = NW * 16 * WM;
    static constexpr size_t smem = (size_t) (BM * D + 4 * BN * D) * sizeof(bf16) + BM * sizeof(int);
};

// LISTS: the page-list schedule (paged-attn-lists.cuh: the block walks its row tile's union of
// history pages, then the current region; rows masked by their query tile's list).
template <int D, int WM, int BN, int NW, int MODE, int MINB = 1, bool LISTS = false>
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
    fwd_row_positions<BM, NT>(a, TG, r0, tid, sPos, &sMax, &sMin);
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
    FwdListsTiles lt;  // LISTS: the union's history tiles, then the current region's
    if constexpr (LISTS) lt.init(a.lists, a.P, BN, rt, minp, maxp);
    const int n_tiles = LISTS ? lt.n_tiles(maxp) : maxp / BN + 1;
    auto tile_k0 = [&](int tile) -> int {
        if constexpr (!LISTS) return tile * BN;
        else return lt.k0(tile);
    };

    // A tile of BN keys lies in one page (host checks P % BN == 0): one page-table lookup per tile,
    // issued a tile ahead so that its latency hides behind the current tile's math.
    auto tile_page = [&](int tile) -> int {
        return page_of(a.pt, a.n_logical, a.n_pages, a.P, tile_k0(tile));
    };
    auto load_kv = [&](int tile, int buf, int pg) {
        const int k0 = tile_k0(tile);
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

        const int k0 = tile_k0(it);
        // LISTS history tile: every key is before every row; a row sees all of it or none (all: single)
        const bool hist = LISTS && lt.hist_masked(it);
        const int4 ue = hist ? lt.uni[it / lt.tpp] : make_int4(0, 0, 0, 0);
        const bool need_mask = hist || k0 + BN - 1 > minp;
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                float mx = -INFINITY;
                int lim = prow[mt][hf];  // keys kp > lim are masked
                if constexpr (LISTS) {
                    if (hist) lim = lt.hist_lim(ue, prow[mt][hf]);
                }
#pragma unroll
                for (int nb = 0; nb < BN / 8; nb++) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float v = s[mt][nb][hf * 2 + j] * a.c;
                        if (need_mask) {
                            const int kp = k0 + nb * 8 + (lane & 3) * 2 + j;
                            if (kp > lim) v = -INFINITY;
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
                // as the MODE_LSE epilogue below (log2 units), then in natural-log units; a row
                // without keys: -inf
                const float mu = m[mt][hf] == -INFINITY ? 0.0f : m[mt][hf];
                pa_epilogue_out<D>(a.out, a.lse_out, a.acc, valid, (int64_t) t * a.H + h, lane, (mu + __log2f(lsum)) * kLn2,
                                   [&](int nb, int j) { return o[mt][nb][hf * 2 + j] * inv; });
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
    const bf16 * qb; const bf16 * dob;        // [Hkv][TGp][D], rows R = t * G + hh (wgmma kernels: per 64-row tile swizzled, pa_prep_kernel swz)
    const float * lse; const float * delta;   // [Hkv][TGp]
    const int * rowpos;                       // [TGp] (-1 for padding rows)
    const int * rt_max; const int * rt_min;   // [n_rt] per tile of BM rows
    const int * maxpos;                       // [1]
    int n_rt;
    const bf16 * kp; const bf16 * vp; int64_t kv_s1, kv_s2, kv_s3;   // elements
    float * dkp; float * dvp; int64_t gr_s1, gr_s2, gr_s3;          // elements (f32, or bf16 with gsr.bf16)
    GradSR gsr;                               // bf16 gradient pages (then nsplit == 1)
    const int32_t * pt; int n_logical, n_pages, P;
    int T, H, G, TGp;
    float c, scale;
    float * dq;                               // [T][H][D] f32, accumulated with atomics
    float * dq_acc;                           // pa_bwd_pipe_kernel with config.bwd_dqacc: dQ added here instead,
                                              // [Hkv][n_rt][BM x D] f32 in fragment order (bwd_add_dq_acc), then
                                              // into dq by pa_dq_acc_kernel; null: atomics into dq
    int nsplit;                               // blocks per key tile (blockIdx.z): each takes every
                                              // nsplit-th row tile; > 1: dK/dV added with atomics
    PaLists lists;                            // LISTS kernels only (paged-attn-lists.cuh)
    int lists_order;                          // LISTS: 1: blocks heaviest first (bwd_block); 0: as DENSE
    int hist_fill;                            // LISTS: history key tiles x KV heads from which a history
                                              // tile is unsplit (INT_MAX: never)
    int lists_qmask;                          // LISTS: row bits from query-tile masks (BwdListsTile::qmasks)
};

// A backward block's work: key tile kt of KV head g, share z of zs of the key tile's row tiles (rows
// z, z + zs, ...). DENSE: (blockIdx.x, blockIdx.y, blockIdx.z) of a.nsplit; a history key tile there
// visits every row tile, the current region's fewer (causal), so the grid's order already starts the
// longest blocks first. LISTS: a history key tile visits only the row tiles of the query tiles that
// chose one of its pages (a few of a chunk's), while the current region's visit every later row tile
// of the chunk. With a.lists_order the grid runs in decreasing key tile, a tile's KV heads and shares
// adjacent, so the current region's blocks start first and the short history blocks fill the waves
// after them; the tiles past the chunk's last position (the grid spans the page table's keys, the
// whole context's) come last (z = zs: return), as in the DENSE order. A history-only key tile is
// unsplit (one K/V load, no dK/dV atomics) where the history's tiles x KV heads reach a.hist_fill
// blocks, its other blocks return (z >= zs); a tile holding any current-region key keeps a.nsplit.
struct BwdBlock { int kt, g, z, zs; };
template <bool LISTS> __device__ __forceinline__ BwdBlock bwd_block(const BwdArgs & a, int BN, int maxp) {
    BwdBlock b{(int) blockIdx.x, (int) blockIdx.y, (int) blockIdx.z, a.nsplit};
    if constexpr (LISTS) {
        if (a.lists_order) {
            const int per = (int) (gridDim.y * gridDim.z);
            const int lin = (int) (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
            b.kt = min(maxp / BN, (int) gridDim.x - 1) - lin / per;
            b.g = (lin % per) / (int) gridDim.z;
            b.z = lin % (int) gridDim.z;
        }
        const int cur0 = a.lists.pos[0] / a.P * a.P;
        if (b.kt < 0) b.z = b.zs;  // past the last key tile: nothing to do
        else if ((b.kt + 1) * BN <= cur0 && cur0 / BN * (int) gridDim.y >= a.hist_fill) b.zs = 1;
    }
    return b;
}

// The LISTS backward's view of one key tile [k0, k0 + BN) (paged-attn-lists.cuh): which row tiles
// it visits and, per visited row tile, each row's bits over the pages the tile touches. Under
// LISTS_RANGE only the keys of the window's pages: a tile that crosses a window edge takes the
// per-row page bits (hist) even in the current region, and a tile outside the window is skipped.
struct BwdListsTile {
    int c0, cur0;          // first current page, its first position
    bool hist, has_cur;    // per-row page bits needed (keys before cur0, or a window edge in the tile) / current-region keys in the window
    bool one_page;         // a.lists.whole and the tile in one page (page_bits)
    int cur_lo;            // first current-region key of the tile in the window
    int lp_a, n_tp;        // first page, pages touched (<= 32: P >= 32 on the fast path)
    uint32_t win;          // bit i: page lp_a + i lies in the window
    const uint32_t * bits; // this key tile's row-tile bitmap (hist only)
    // Row bits from query-tile masks (config.lists_bwd bit 2): qmask[i * QM_WORDS + w] bit b: query tile
    // 32 w + b chose page lp_a + i, built once per block (qmasks) by one search per (page, query tile),
    // so a row's bits are shared-memory lookups; without them (more than 2 pages or 32 QM_WORDS query
    // tiles, or the bit off) each row searches its own list per row tile: dependent global loads on the
    // row-tile loop's critical path.
    static constexpr int QM_WORDS = 8;
    const uint32_t * qmask; // shared memory [2 * QM_WORDS], or NULL: the per-row search

    __device__ __forceinline__ void init(const BwdArgs & a, int k0, int BN, int maxp) {
        const PaLists & L = a.lists;
        c0 = L.pos[0] / a.P;
        cur0 = c0 * a.P;
        const int k1 = k0 + BN - 1;
        const int wlo = L.win_first * a.P, whi = pa_lists_window_end(L, a.P, k1);  // the window's keys in the tile: [max(k0, wlo), whi]
        hist = k0 < cur0 || k0 < wlo || whi < k1;
        cur_lo = max(k0, max(cur0, wlo));
        has_cur = cur_lo <= min(k1, whi);
        lp_a = k0 / a.P;
        n_tp = min(k1, max(maxp, k0)) / a.P - lp_a + 1;
        win = 0;
        for (int i = 0; i < n_tp; i++) win |= (uint32_t) pa_lists_in_window(L, lp_a + i) << i;
        bits = L.bits + (int64_t) (k0 / BN) * L.n_words;
        one_page = L.whole && n_tp == 1;
    }
    // init, and whether this block (share z of zs of the row tiles, bwd_block) has a row tile to visit;
    // kpi: the page index (from lp_a) of the thread's keys k and k + 8
    __device__ __forceinline__ bool begin(const BwdArgs & a, int k0, int BN, int maxp, int k, int (&kpi)[2], int z, int zs) {
        init(a, k0, BN, maxp);
        if (!win) return false;  // no page of the tile in the window
        int j = z;
        while (j < a.n_rt && !needed(a, j)) j += zs;
        kpi[0] = k / a.P - lp_a;
        kpi[1] = (k + 8) / a.P - lp_a;
        return j < a.n_rt;
    }
    // The query-tile masks into s ([2 * QM_WORDS] shared), where they apply (hist, n_tp <= 2, few query
    // tiles, on); every thread of the block calls it (it holds barriers; the conditions are the
    // block's).
    __device__ __forceinline__ void qmasks(const BwdArgs & a, int tid, int nt, uint32_t * s) {
        const PaLists & L = a.lists;
        qmask = nullptr;
        if (!hist || !a.lists_qmask || n_tp > 2 || L.n_qtiles > 32 * QM_WORDS) return;
        // one page and a page-aligned chunk: a row tile (64 rows, a divisor of P G) lies in one query tile
        // whenever positions run on, so page_bits asks for bits only of scattered positions (then searched)
        if (one_page && L.pos[0] % a.P == 0) return;
        for (int w = tid; w < 2 * QM_WORDS; w += nt) s[w] = 0u;
        __syncthreads();
        for (int t = tid; t < n_tp * L.n_qtiles; t += nt) {
            const int i = t / L.n_qtiles, qt = t % L.n_qtiles, lp = lp_a + i;
            if (lp < c0 && oomb::pa_list_has(L.pages, L.offsets[qt], L.offsets[qt + 1], lp)) atomicOr(&s[i * QM_WORDS + (qt >> 5)], 1u << (qt & 31));
        }
        __syncthreads();
        qmask = s;
    }
    // Does row tile j need its rows' page bits (and the page mask)? A history tile does, unless it is one
    // page (one_page) and j's rows lie in one query tile: the bitmap visits j only if that tile chose the
    // page, so every row sees every key (as in a dense tile below the rows' positions). A row tile with
    // padding rows has rt_min -1 (pa_meta_kernel), so it keeps the mask (and c0 >= 1 here); unmasked, its
    // padding rows would add nothing anyway (zero q, dO, LSE and delta).
    __device__ __forceinline__ bool page_bits(const BwdArgs & a, int j) const {
        return hist && !(one_page && a.rt_min[j] / a.P == a.rt_max[j] / a.P);
    }
    // does row tile j have rows attending this key tile?
    __device__ __forceinline__ bool needed(const BwdArgs & a, int j) const {
        return (has_cur && a.rt_max[j] >= cur_lo) || (hist && ((bits[j >> 5] >> (j & 31)) & 1u));
    }
    // bit i of row r of row tile j: the row sees page lp_a + i (current pages: always; the causal
    // mask applies on top). Threads tid, tid + nt, ... of the block; s: [BM].
    __device__ __forceinline__ void row_bits(const BwdArgs & a, int j, int BM, int tid, int nt, uint32_t * s) const {
        for (int r = tid; r < BM; r += nt) {
            const int p = a.rowpos[(int64_t) j * BM + r];
            uint32_t b = 0;
            if (p >= 0) {
                const int qt = p / a.P - c0;
                const bool qt_in = qt >= 0 && qt < a.lists.n_qtiles;
                for (int i = 0; i < n_tp; i++) {
                    const int lp = lp_a + i;
                    const bool chose = qmask ? qt_in && ((qmask[i * QM_WORDS + (qt >> 5)] >> (qt & 31)) & 1u) : pa_lists_has(a.lists, qt, lp);
                    if (((win >> i) & 1u) && (lp >= c0 || chose)) b |= 1u << i;
                }
            }
            s[r] = b;
        }
    }
};

template <int D, int BM, int NW>
struct BwdCfg {
    static constexpr int BN = NW * 16;
    static constexpr int SDS = BM + 8;
    static constexpr size_t smem = (size_t) (2 * BN * D + 4 * BM * D + BN * SDS) * sizeof(bf16) + 6 * BM * sizeof(float);
};

// LISTS: the page-list schedule (paged-attn-lists.cuh, BwdListsTile).
template <int D, int BM, int NW, int MINB = 1, bool LISTS = false>
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

    const int maxp = *a.maxpos;
    const BwdBlock blk = bwd_block<LISTS>(a, BN, maxp);
    if (blk.z >= blk.zs) return;
    const int g = blk.g;
    const int k0 = blk.kt * BN;
    if (k0 > maxp) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int TG = a.T * a.G;
    BwdListsTile lt;
    __shared__ uint32_t sSee[LISTS ? BM : 1];  // LISTS: row bits of the current row tile (lt.row_bits)
    __shared__ uint32_t sQm[LISTS ? 2 * BwdListsTile::QM_WORDS : 1];  // LISTS: query-tile masks (lt.qmasks)
    int kpi[2] = {0, 0};                       // LISTS: page index (from lt.lp_a) of this thread's two keys
    if constexpr (LISTS) {
        if (!lt.begin(a, k0, BN, maxp, k0 + warp * 16 + (lane >> 2), kpi, blk.z, blk.zs)) return;  // no row chose these keys
    }

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
    if constexpr (LISTS) lt.qmasks(a, tid, NT, sQm);  // (its barriers and searches under the K/V copies)

    // this block's row tiles: z, z + zs, z + 2 zs, ... (those attending this key tile)
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
    int j = next_rt(blk.z);
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
        bool cand_ok = false;  // LISTS: whether cand is needed (DENSE: cand_max >= k0, tested after the math)
        if constexpr (LISTS) cand_ok = cand < a.n_rt && lt.needed(a, cand);
        const int rt_min_j = a.rt_min[j];
        bool pb = false;  // LISTS: the rows' page bits apply
        if constexpr (LISTS) {
            pb = lt.page_bits(a, j);
            if (pb) lt.row_bits(a, j, BM, tid, NT, sSee);  // the previous step's readers passed its last barrier
        }
        cp_async_wait<1>();
        __syncthreads();
        const bf16 * cQ = sQ + buf * BM * D;
        const bf16 * cdO = sdO + buf * BM * D;
        const float * cL = sL + buf * BM;
        const float * cDl = sDl + buf * BM;
        const int * cRp = sRp + buf * BM;
        const bool need_mask = pb || rt_min_j < k0 + BN - 1;

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
                if constexpr (LISTS) {
                    if (need_mask && (kp > cRp[qc] || (pb && !((sSee[qc] >> kpi[e >> 1]) & 1u)))) p = 0.0f;
                } else {
                    if (need_mask && kp > cRp[qc]) p = 0.0f;
                }
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
        const int jnn = cand >= a.n_rt ? a.n_rt : ((LISTS ? cand_ok : cand_max >= k0) ? cand : next_rt(cand + zs));
        j = jn;
        jn = jnn;
        buf ^= 1;
    }
    cp_async_wait<0>();

    // add dK/dV into the gradient pages (with zs == 1 this block alone owns these rows in this
    // launch; otherwise the zs blocks of the key tile add with atomics)
    const uint32_t sk = a.gsr.bf16 ? oomb::sr_kv_salt(a.gsr.seed_k, a.gsr.pos[0]) : 0u;
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
                    grad_add_bf16(a.gsr, a.dkp, a.dvp, off + nb * 8 + e, p, g, nb * 8 + (lane & 3) * 2 + e, D, dk[nb][hf * 2 + e],
                                  dv[nb][hf * 2 + e], sk, sv);
            continue;
        }
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
// swz (the wgmma backward kernels): q / dout stored per tile of 64 rows in the layout the kernels'
// shared memory holds ([D/64 halves][64 rows][64] with the 128-byte swizzle, paged-attn-wgmma.cuh
// sw128), so that a row tile is one contiguous copy (a bulk copy, no per-thread addresses).
template <int D>
__global__ void pa_prep_kernel(const float * q, int64_t q_s1, int64_t q_s2, const float * dout, int64_t do_s1, int64_t do_s2,
                               int T, int H, int G, int Hkv, int TGp, bf16 * qb, bf16 * dob, float * lse, float * delta,
                               const float * out_s, const float * lse_s, int swz) {
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
    int64_t dst = gr * D + ch * 8;
    if (swz) {
        const int r = R % 64;  // (TGp is a multiple of 64: tiles start at R % 64 == 0 in every head)
        dst = (gr - r) * D + (ch >> 3) * (64 * 64) + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
    }
    *(uint4 *) (qb + dst) = vq;
    *(uint4 *) (dob + dst) = vd;
}

} // namespace
