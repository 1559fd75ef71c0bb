// Paged attention forward on Hopper, warp-specialised (FlashAttention-3's structure, Shah et al.
// 2024, sec. 3.1): a producer warpgroup loads K/V tiles with TMA through the page table while two
// (or three, at head dim 64) consumer warpgroups compute, and the consumers take turns on the tensor
// cores ("ping-pong").
// Included by paged-attn.cu only.
//
// Why: the two-warpgroup kernel of paged-attn-wgmma.cuh (pa_fwd_wgmma_kernel) loads with cp.async
// from every thread and meets at one block barrier per key tile, so both warpgroups run their
// softmax at the same time and the tensor cores idle meanwhile (410 TFLOP/s at 128K, head dim 128,
// against a bf16 matrix ceiling near 790). Here:
//   - warpgroup 0 (setmaxnreg 24) is the producer: one thread walks the block's key tiles, looks up
//     each tile's page and issues four (head dim 128; two at 64) TMA box loads of 64 dims x 128
//     slots (the pools as a 4-d tensor map: dims, KV heads, slots, pages; 128-byte swizzle, the
//     layout wgmma reads) into a ring of NS stages, each with a "full" mbarrier (transaction bytes)
//     and an "empty" one (the consumer threads release it);
//   - the consumer warpgroups 1 .. NC (NC = 2: setmaxnreg 240; NC = 3, head dim 64 and dense
//     schedules only, config.fwd_wg3: setmaxnreg 160, as FA3's 192-row tiles there) own 64 query
//     rows each (the block: 64 NC rows of one GQA group; 128 as pa_fwd_wgmma_kernel with two) and
//     run, per key tile j: softmax(S_j) -> P_j, then one "GEMM phase" issuing O += P_j V_j and
//     S_{j+1} = Q K_{j+1}^T together. The GEMM phases go round the consumer warpgroups through NC
//     named barriers (one per warpgroup: it waits on its own, then arrives on the next one's), so
//     one warpgroup's softmax runs under the others' products.
// No wgmma is in flight while ordinary instructions touch its accumulators (the o rescale happens
// in the softmax, after the phase's wait), so ptxas keeps the wgmmas asynchronous. With OVL
// (the default) FA3's intra-warpgroup overlap too, see below. Measured on the H200 (7B layer, head
// dim 128, 28 / 4 heads): 575 / 529 TFLOP/s at 32K / 128K against 390-405 for the two-warpgroup
// kernel and 666 / 594 for cuDNN in the same call (bench/attention/RESULTS.md, bench/NOTES.md v15).
// Keys past the block's last position in its last tile are whatever the pool holds there: the
// consumers zero those V rows of the last tile before their O += P V (P is 0 there, and 0 * NaN
// would be NaN); an unmapped page (page table < 0) is read at a page index outside the tensor map,
// which TMA fills with zeros. Schedules: DENSE and RANGE (the range's shifted page table and
// clamped positions, paged-attn.cu range_geom), and with LISTS the page-list schedules (LISTS,
// LISTS_RANGE: the block walks its row tile's union of history pages, then the current region,
// FwdListsTiles of paged-attn-lists.cuh, as pa_fwd_wgmma_kernel; the producer and the consumers
// walk the same tile sequence).
// Key split (dense and range schedules, two consumer warpgroups; FwdArgs::fsplit, chosen by
// fwd_kv_split in paged-attn.cu): blockIdx.z takes a share of the row tile's key tiles and writes a
// partial result (out and LSE), merged by the launcher after: flash-decoding's split-K, for chunks whose
// row tiles alone leave the last wave of SMs mostly idle.
#pragma once

#include <cuda.h>

#include "paged-attn-wgmma.cuh"
#include "sm90.cuh"

namespace {

// NS: stages of the K/V ring (head dim 128: 3 just fit in 227 KB with q; 2 measured 10-13 % slower).
// NC: consumer warpgroups of 64 rows each (2; 3 at head dim 64, as FA3's 192-row tiles there: the
// products of a tile are half as long as at 128 against the same softmax, so a third warpgroup's
// softmax fills the tensor cores' turn; registers 24 / 160 instead of 24 / 240).
template <int D, int NS, int NC = 2>
struct FwdWS {
    static constexpr int BM = 64 * NC, BN = 128, NT = 128 * (NC + 1);
    static constexpr uint32_t tile_q = BM * D * 2, tile_kv = BN * D * 2;
    static constexpr size_t smem = 1024 + tile_q + 2 * NS * tile_kv + BM * sizeof(int) + 2 * NS * sizeof(uint64_t);
    static_assert(smem <= 232448 - 128, "shared memory per block (and the kernel's static shared memory)");
};

// named barriers: the consumers' turns (1 .. NC), all consumer warpgroups (NC + 1)
enum { WS_BAR_TURN = 1 };

// OVL: FlashAttention-3's intra-warpgroup overlap on top (sec. 3.2): a GEMM phase issues S_{j+1}
// first and O += P_j V_j second and waits for S_{j+1} only, so the softmax of tile j + 1 (which
// writes only s and the row statistics) runs while P_j V_j is in flight; P is packed into its
// fragments and o rescaled after that product completes (as FA3: no register an in-flight wgmma
// reads is written, or ptxas serializes the wgmmas, C7513).
template <int D, int MODE, int NS, bool LISTS = false, bool OVL = false, int NC = 2>
__global__ void __launch_bounds__(128 * (NC + 1), 1)
    pa_fwd_ws_kernel(const FwdArgs a, const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV) {
#ifdef OOMB_WGMMA
    using namespace oomb_wgmma;
    using namespace oomb_sm90;
    using W = FwdWS<D, NS, NC>;
    static_assert(NC == 2 || (NC == 3 && D == 64 && !LISTS), "three consumer warpgroups: head dim 64, dense schedules");
    constexpr int NCT = 128 * NC;                 // consumer threads
    constexpr int BAR_CONSUMERS = WS_BAR_TURN + NC;
    constexpr int BM = W::BM, BN = W::BN, NT = W::NT;
    // NS 1 deadlocks (a consumer waits for tile it + 1 before releasing tile it); OVL releases a
    // tile one step later, so with 2 stages every load would wait for the release just before it
    static_assert(NS >= 2 && (!OVL || NS >= 3), "K/V stages");
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw_s = smem_u32(smem_raw);
    const uint32_t base_s = (raw_s + 1023u) & ~1023u;
    unsigned char * base = smem_raw + (base_s - raw_s);
    bf16 * sQ = (bf16 *) base;                  // [D/64 halves][BM][64]
    bf16 * sV = sQ + BM * D + NS * BN * D;      // [NS][D/64 halves][BN][64] (K: the NS tiles before)
    int * sPos = (int *) (sV + NS * BN * D);    // [BM]
    const uint32_t aQ = base_s, aK = aQ + W::tile_q, aV = aK + NS * W::tile_kv;
    const uint32_t aFull = smem_u32(sPos + BM), aEmpty = aFull + NS * 8;  // [NS] mbarriers each
    __shared__ int sMax, sMin;

    const int g = blockIdx.y;
    const int rt = gridDim.x - 1 - blockIdx.x;  // heaviest tiles (largest positions) first
    const int TG = a.T * a.G;
    const int r0 = rt * BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // (wg from lane 0: seen warp-uniform)

    if (tid == 0) {
        sMax = -1;
        sMin = INT_MAX;
        for (int st = 0; st < NS; st++) {
            mbar_init(aFull + 8 * st, 1);
            mbar_init(aEmpty + 8 * st, NCT);
        }
        fence_mbar_init();
    }
    if (tid == 32) {
        prefetch_tmap(&tmK);
        prefetch_tmap(&tmV);
    }
    __syncthreads();
    fwd_row_positions<BM, NT>(a, TG, r0, tid, sPos, &sMax, &sMin);
    fwd_load_q<D, BM, NT>(a, sQ, r0, g, tid);
    fence_proxy_async();
    __syncthreads();
    const int maxp = sMax, minp = sMin;
    if (maxp < 0) return;
    FwdListsTiles lt;  // LISTS: the union's history tiles, then the current region's
    if constexpr (LISTS) lt.init(a.lists, a.P, BN, rt, minp, maxp);
    int n_tiles = LISTS ? lt.n_tiles(maxp) : maxp / BN + 1;
    // the key split (a.fsplit > 1, fwd_kv_split): this block's share [t0, t0 + n_tiles) of the tiles,
    // and where its result goes (the last share: out; the others: their partial results)
    int t0 = 0;
    // (not with three consumer warpgroups: at 160 registers the share's bounds made ptxas spill 100 bytes)
    if constexpr (!LISTS && MODE == MODE_OUT && NC == 2) {
        if (a.fsplit > 1) {
            const int ns = n_tiles >= a.fsplit * a.fsplit_min ? a.fsplit : 1;
            const int z = (int) blockIdx.z - (a.fsplit - ns);  // the last ns blocks of the row tile share its tiles
            if (z < 0) return;                                  // (its partial LSE stays -inf: merged as nothing)
            const int n = n_tiles;
            t0 = n * z / ns;
            n_tiles = max(n * (z + 1) / ns - t0, 1);  // (>= fsplit_min >= 1; max: for the compiler's proofs)
        }
    }
    auto tile_k0 = [&](int tile) -> int {
        if constexpr (!LISTS) return (t0 + tile) * BN;
        else return lt.k0(tile);
    };

    if (wg == 0) {
        // producer
        setmaxnreg_dec<24>();
        if (tid == 0) {
            for (int it = 0; it < n_tiles; it++) {
                const int st = it % NS;
                if (it >= NS) mbar_wait(aEmpty + 8 * st, ((it / NS) - 1) & 1);  // the consumers released tile it - NS
                const int k0 = tile_k0(it);
                int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, k0);
                if (pg < 0) pg = a.n_pages;  // past the tensor map's pages: the box reads zeros
                const uint32_t bar = aFull + 8 * st;
                mbar_arrive_expect_tx(bar, 2 * W::tile_kv);
#pragma unroll
                for (int h = 0; h < D / 64; h++) {
                    tma_load_4d(aK + st * W::tile_kv + h * (BN * 128), &tmK, bar, h * 64, g, k0 % a.P, pg);
                    tma_load_4d(aV + st * W::tile_kv + h * (BN * 128), &tmV, bar, h * 64, g, k0 % a.P, pg);
                }
            }
        }
        return;
    }

    // consumers: warpgroup cw owns rows 64 cw .. 64 cw + 63 of the block
    setmaxnreg_inc<NC == 2 ? 240 : 160>();
    const int cw = wg - 1;
    const int wrow = (warp - 4) * 16;  // this warp's first row in the block
    float o[D / 2];
    float m[2], l[2];
    int lim[2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        m[hf] = -INFINITY;
        l[hf] = 0.0f;
        lim[hf] = sPos[wrow + (lane >> 2) + hf * 8];  // keys past the row's position are masked
    }
    // turns go round the consumer warpgroups: cw's GEMM phase follows cw - 1's (mod NC)
    const int bar_me = WS_BAR_TURN + cw, bar_other = WS_BAR_TURN + (cw + 1) % NC;

    // S = Q K^T of tile it into s, O += P V of tile it (issued)
    auto issue_s = [&](float (&s)[BN / 2], int it) { fwd_issue_s<D, BM, BN>(s, aQ, cw, aK + (it % NS) * W::tile_kv); };
    auto issue_pv = [&](const uint32_t (&pa)[BN / 16][4], int it) { fwd_issue_pv<D, BN>(o, pa, aV + (it % NS) * W::tile_kv); };

    float s[BN / 2];
    uint32_t pa[BN / 16][4];
    if (cw == NC - 1) bar_arrive(WS_BAR_TURN, 256);  // the last warpgroup lets warpgroup 0 go first
    mbar_wait(aFull, 0);
    bar_sync(bar_me, 256);
    wgmma_fence();
    issue_s(s, 0);
    wgmma_commit();
    bar_arrive(bar_other, 256);
    wgmma_wait<0>();
    // tile it: S_it in s (complete); the zeroed V tail of the last tile; the softmax (P in s, the row
    // statistics, corr). OVL: O += P_{it-1} V_{it-1} may be in flight meanwhile (it reads pa and o).
    auto softmax = [&](int it, float (&corr)[2]) {
        const int k0 = tile_k0(it);
        if (it == n_tiles - 1 && k0 + BN - 1 > maxp) {
            // the last tile (the largest keys) past maxp: zeros in V, a share of the rows by each
            // consumer warpgroup, then all of them meet (none has issued its O += P V of this tile
            // yet: each reaches here after its previous GEMM phase, which the previous warpgroup's
            // turn hand-over allowed);
            // LISTS: a block without a current tile walks one tile past maxp, all of it
            bf16 * v = sV + (it % NS) * BN * D;
            const int first = max(maxp + 1 - k0, 0);
            for (int idx = tid - 128; idx < (BN - first) * (D / 8); idx += NCT)
                *(uint4 *) (v + sw128<BN>(first + idx / (D / 8), idx % (D / 8))) = make_uint4(0, 0, 0, 0);
            fence_proxy_async();
            bar_sync(BAR_CONSUMERS, NCT);
        }
        // LISTS history tile: every key is before every row; a row sees all of it or none (all: single)
        const bool hist = LISTS && lt.hist_masked(it);
        int lim_t[2] = {lim[0], lim[1]};
        if constexpr (LISTS) {
            if (hist) {
                const int4 ue = lt.uni[it / lt.tpp];
                lim_t[0] = lt.hist_lim(ue, lim[0]);
                lim_t[1] = lt.hist_lim(ue, lim[1]);
            }
        }
        fwd_softmax_p<BN>(s, m, l, lim_t, k0, hist || k0 + BN - 1 > minp, a.c, lane, corr);
    };
    float corr[2];
    if constexpr (!OVL) {
        for (int it = 0; it < n_tiles; it++) {
            softmax(it, corr);
            fwd_pack_p<BN>(s, pa);
            fwd_rescale_o<D>(o, corr);
            const bool more = it + 1 < n_tiles;
            if (more) mbar_wait(aFull + 8 * ((it + 1) % NS), ((it + 1) / NS) & 1);
            bar_sync(bar_me, 256);
            wgmma_fence();
            issue_pv(pa, it);
            if (more) issue_s(s, it + 1);
            wgmma_commit();
            bar_arrive(bar_other, 256);
            wgmma_wait<0>();
            mbar_arrive(aEmpty + 8 * (it % NS));
        }
    } else {
        // every tile but the last: the same two commit groups in each (ptxas then proves that
        // wait_group 1 leaves only O += P V in flight; a conditional S made it serialize, C7514)
        for (int it = 0; it < n_tiles - 1; it++) {
            softmax(it, corr);
            wgmma_wait<0>();  // O += P_{it-1} V_{it-1} complete: pa and o are free
            if (it > 0) mbar_arrive(aEmpty + 8 * ((it - 1) % NS));
            fwd_pack_p<BN>(s, pa);
            fwd_rescale_o<D>(o, corr);
            mbar_wait(aFull + 8 * ((it + 1) % NS), ((it + 1) / NS) & 1);
            bar_sync(bar_me, 256);
            wgmma_fence();
            issue_s(s, it + 1);
            wgmma_commit();
            issue_pv(pa, it);
            wgmma_commit();
            bar_arrive(bar_other, 256);
            wgmma_wait<1>();  // S_{it+1} complete, P_it V_it in flight
        }
        softmax(n_tiles - 1, corr);
        wgmma_wait<0>();
        if (n_tiles > 1) mbar_arrive(aEmpty + 8 * ((n_tiles - 2) % NS));  // (every stage released: the protocol's invariant)
        fwd_pack_p<BN>(s, pa);
        fwd_rescale_o<D>(o, corr);
        bar_sync(bar_me, 256);
        wgmma_fence();
        issue_pv(pa, n_tiles - 1);
        wgmma_commit();
        bar_arrive(bar_other, 256);
        wgmma_wait<0>();
        mbar_arrive(aEmpty + 8 * ((n_tiles - 1) % NS));
    }
    if (cw == 0) bar_sync(WS_BAR_TURN, 256);  // the last warpgroup's last turn hand-over
    if (!LISTS && MODE == MODE_OUT && NC == 2 && a.fsplit > 1 && (int) blockIdx.z < a.fsplit - 1) {
        // a share but the last: its partial result (pointers formed here: nothing more held through the loop)
        float * part = a.part + (int64_t) blockIdx.z * a.part_stride;
        fwd_epilogue<D, MODE>(a, o, m, l, r0, wrow, g, lane, part, part + (int64_t) a.T * a.H * D, 0);
    } else {
        fwd_epilogue<D, MODE>(a, o, m, l, r0, wrow, g, lane);
    }
#else
    __trap();
#endif
}

} // namespace
