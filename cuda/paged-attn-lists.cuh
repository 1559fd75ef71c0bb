// Paged attention on CUDA, the page-list schedules (OOMB_SCHEDULE_LISTS and LISTS_RANGE,
// oomb-schedule.h) on the tensor-core kernels (paged-attn-mma.cuh, paged-attn-wgmma.cuh): the kernels' view of the lists,
// the two prep kernels that turn the per-query-tile lists into per-block work lists, and the row
// visibility tests. Included by paged-attn-mma.cuh only.
//
// Design (one decision per direction; no host sync: the lists stay device tensors, op sources):
//   - Forward: a block still owns BM = 128 group rows of one KV head (BM / G tokens, which may span
//     two or more query tiles). Its key set is the union of the lists of the query tiles
//     qt_lo .. qt_hi its rows fall in, plus the current region. pa_lists_union_kernel writes, per
//     forward row tile, that union (each history page once, in the order of the concatenated
//     lists) with a 32-bit mask: bit b = query tile qt_lo + b chose the page. The kernel walks the
//     union's key tiles (P / BN per page, through the page table), then the current region's tiles
//     (causal, as DENSE); in a history tile a row whose tile did not choose the page is masked to
//     -inf (its bit: no search in the kernel, whose softmax then keeps the wgmma pipeline).
//     Rows spanning more than 32 query tiles (only scattered positions do that) are split into
//     windows of 32 tiles: an entry belongs to one window, and a page chosen in two windows has two
//     entries (each row sees it once). Key tiles no row needs are never loaded.
//   - Backward (key-major, dK/dV in registers, dq by atomics as for DENSE): a block owns a tile of
//     BN = 128 keys of one KV head. pa_lists_bits_kernel marks, for every key tile, the backward
//     row tiles (BM rows) with a row whose query tile chose one of the key tile's history pages:
//     a bitmap [n_key_tiles][n_rt / 32] built from the forward lists per row tile (atomicOr; the
//     same relation as the inverse lists, in row-tile units). A key tile visits the row tiles of
//     its bits plus, where it holds current-region keys, the causal rows (rt_max >= key, as
//     DENSE). Per visited row tile, each row's bits over the (at most 32) pages the key tile
//     touches say which of its keys the row sees (binary search in the row's own list, once per
//     row tile and step, overlapped with the loads); current-region keys keep the causal mask.
//   - LISTS_RANGE (a window of logical pages [first, last), the offload's blocks): the same
//     kernels and work lists, no variant. The prep kernels drop the list entries outside the
//     window (the union, the bitmap); the forward walks the current region's key tiles inside the
//     window only (P % BN == 0: a window edge is a tile edge), or, where none is, one tile past
//     every row (all masked, nothing loaded: the kernels' loops keep at least one tile); the
//     backward's key tile masks, through the per-row page bits, the pages outside the window
//     (a 128-key tile can straddle an edge when P = 64) and skips a tile wholly outside it. LISTS
//     is the window [0, INT_MAX) (PaLists::win_first / win_last), which changes nothing.
//   - Rows of one query tile (config.lists_bwd bit 3, the default): a forward block or backward row tile
//     whose rows all lie in one query tile (every one, at page 128 of a page-aligned chunk) visits only
//     history pages that tile chose, so its history tiles take no page mask at all (FwdListsTiles::single,
//     BwdListsTile::page_bits in paged-attn-mma.cuh): the unmasked softmax of a dense tile. The backward
//     also starts the current region's key tiles first (bwd_block) and, where rows still need page bits,
//     builds them from per-block query-tile masks (BwdListsTile::qmasks) rather than a search per row.
// Neither kernel validates the lists (the CPU kernels do, oomb-schedule.h): entries outside
// [0, c0) are skipped (the current region already covers pages >= c0).
#pragma once

#include "paged-attn-common.cuh"
#include "oomb/paged-attn-sched.h"

namespace {

// The kernels' view of a page-list schedule (all device pointers; unused members NULL for DENSE/RANGE).
struct PaLists {
    const int32_t * offsets;   // [n_qtiles + 1] (CSR over query tiles)
    const int32_t * pages;     // [nnz] history pages per query tile, ascending
    int n_qtiles;
    const int32_t * pos;       // the op's positions: c0 = pos[0] / P
    // LISTS_RANGE: the window's logical pages [win_first, win_last) (win_first <= n_logical, so
    // win_first * P fits an int); LISTS: [0, INT_MAX), every page
    int win_first, win_last;
    // forward: per forward row tile rt, union[rt * cap + i] = (page, query-tile mask, window, 0),
    // i < n_union[rt]: bit b of the mask = query tile qt_lo + 32 window + b chose the page
    const int4 * uni;
    const int * n_union;
    int cap;
    // backward: bits[kt * n_words + j / 32] bit j % 32: row tile j has a row that chose a history
    // page of key tile kt
    const uint32_t * bits;
    int n_words;
    // config.lists_bwd bit 3: a tile of rows of one query tile needs no page mask (FwdListsTiles::single,
    // BwdListsTile::page_bits): its query tile chose every history page it visits
    int whole;
};

// Is logical page lp in the window (LISTS: always, for lp >= 0)?
__device__ __forceinline__ bool pa_lists_in_window(const PaLists & L, int lp) { return lp >= L.win_first && lp < L.win_last; }
// The last key of the window, capped at `cap` (no overflow for win_last = INT_MAX).
__device__ __forceinline__ int pa_lists_window_end(const PaLists & L, int P, int cap) {
    return L.win_last > cap / P ? cap : L.win_last * P - 1;
}

// Does a row of query tile qt see history page lp (qt outside the lists: no history)?
__device__ __forceinline__ bool pa_lists_has(const PaLists & L, int qt, int lp) {
    if (qt < 0 || qt >= L.n_qtiles) return false;
    return oomb::pa_list_has(L.pages, L.offsets[qt], L.offsets[qt + 1], lp);
}

// A forward row's view of a history tile (union entry e): b = the row's query tile - the block's
// qt_lo (-1: a padding row).
__device__ __forceinline__ bool pa_lists_row_sees(const int4 & e, int b) {
    return b >= 0 && (b >> 5) == e.z && (((uint32_t) e.y >> (b & 31)) & 1u);
}

// A forward block's key tiles (BN keys, P % BN == 0) under LISTS: tiles 0 .. n_hist_t - 1 are the
// union's history pages (P / BN tiles each), the rest the current region's key tiles cur_t0 ..
// cur_t1 (from page max(c0, win_first), a tile start, to the block's max position or the
// window's end). No current key in the window (LISTS_RANGE): cur_t0 = cur_t1 = the tile after
// maxp, whose keys every row masks. rt: the block's row tile; minp / maxp: its rows' positions.
struct FwdListsTiles {
    int P, BN, c0, tpp, n_hist_t, cur_t0, cur_t1, qpage_lo;
    bool single;  // L.whole and the block's rows in one query tile: the union is that tile's list, every row sees it
    const int4 * uni;

    __device__ __forceinline__ void init(const PaLists & L, int P_, int BN_, int rt, int minp, int maxp) {
        P = P_; BN = BN_;
        c0 = L.pos[0] / P;
        tpp = P / BN;
        n_hist_t = L.n_union[rt] * tpp;
        const int cur_lo = max(c0, L.win_first) * P, cur_hi = pa_lists_window_end(L, P, maxp);
        cur_t0 = cur_hi >= cur_lo ? cur_lo / BN : maxp / BN + 1;
        cur_t1 = cur_hi >= cur_lo ? cur_hi / BN : cur_t0;
        qpage_lo = minp / P;  // a row's bit in an entry: its query tile - the block's first
        single = L.whole && minp / P == maxp / P;
        uni = L.uni + (int64_t) rt * L.cap;
    }
    // written so that ptxas sees at least one tile (n_hist_t + maxp / BN - cur_t0 + 1 made it
    // serialize the wgmma forward's wgmmas, C7515); the same value for valid lists (LISTS:
    // cur_t1 = maxp / BN)
    __device__ __forceinline__ int n_tiles(int) const { return max(n_hist_t, 0) + max(cur_t1 - cur_t0, 0) + 1; }
    __device__ __forceinline__ bool hist(int tile) const { return tile < n_hist_t; }
    // a history tile whose rows need their page mask (not single)
    __device__ __forceinline__ bool hist_masked(int tile) const { return tile < n_hist_t && !single; }
    __device__ __forceinline__ int k0(int tile) const {
        return tile < n_hist_t ? uni[tile / tpp].x * P + (tile % tpp) * BN : (tile - n_hist_t + cur_t0) * BN;
    }
    // history tile `tile`: the mask limit of a row at position p (-1: padding): keys > the limit are
    // masked, so INT_MAX where the row's query tile chose the page, -1 where not
    __device__ __forceinline__ int hist_lim(const int4 & e, int p) const {
        return pa_lists_row_sees(e, p < 0 ? -1 : p / P - qpage_lo) ? INT_MAX : -1;
    }
};

// Block-wide ordered compaction helper: exclusive prefix of `flag` over the block's threads (in
// thread order) and the block's total; blockDim.x a multiple of 32, at most 1024. Uses sWarp[32].
__device__ __forceinline__ int pa_block_prefix(bool flag, int * sWarp, int & total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const uint32_t bal = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) sWarp[warp] = __popc(bal);
    __syncthreads();
    int before = 0;
    total = 0;
    for (int w = 0; w < nw; w++) {
        const int n = sWarp[w];
        if (w < warp) before += n;
        total += n;
    }
    __syncthreads();  // sWarp reusable
    return before + __popc(bal & ((1u << lane) - 1u));
}

// Min / max position of the valid rows [r0, r0 + BM) of a row tile (one block; -1 / INT_MAX when none).
__device__ __forceinline__ void pa_rows_minmax(const int32_t * pos, int TG, int G, int r0, int BM, int * sMin, int * sMax) {
    if (threadIdx.x == 0) { *sMin = INT_MAX; *sMax = -1; }
    __syncthreads();
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
        const int R = r0 + i;
        if (R < TG) {
            const int p = pos[R / G];
            atomicMin(sMin, p);
            atomicMax(sMax, p);
        }
    }
    __syncthreads();
}

// Forward work lists: one block per forward row tile rt (rows rt * BM ..), any blockDim multiple
// of 32. uni / n_union as PaLists; cap >= nnz (at most one entry per list entry).
__global__ void pa_lists_union_kernel(PaLists L, int T, int G, int BM, int P, int4 * uni, int * n_union) {
    __shared__ int sMin, sMax, sWarp[32], sCount;
    const int rt = blockIdx.x, TG = T * G;
    pa_rows_minmax(L.pos, TG, G, rt * BM, BM, &sMin, &sMax);
    const int c0 = L.pos[0] / P;
    if (sMax < 0) {
        if (threadIdx.x == 0) n_union[rt] = 0;
        return;
    }
    const int qlo = sMin / P - c0, qhi = sMax / P - c0;
    const int a = max(qlo, 0), b = min(qhi, L.n_qtiles - 1);
    if (threadIdx.x == 0) sCount = 0;
    __syncthreads();
    if (a <= b) {
        const int i0 = L.offsets[a], i1 = L.offsets[b + 1];
        for (int base = i0; base < i1; base += blockDim.x) {
            const int i = base + threadIdx.x;
            bool keep = false;
            int lp = -1, w = 0;
            uint32_t mask = 0;
            if (i < i1) {
                lp = L.pages[i];
                // the query tile whose list holds entry i: last q in [a, b] with offsets[q] <= i
                int lo = a, hi = b;
                while (lo < hi) {
                    const int mid = (lo + hi + 1) >> 1;
                    if (L.offsets[mid] <= i) lo = mid;
                    else hi = mid - 1;
                }
                keep = lp >= 0 && lp < c0 && pa_lists_in_window(L, lp);
                // window w = tiles qlo + 32 w .. qlo + 32 w + 31: the window's first tile holding lp
                // keeps it, every tile of the window holding it sets its bit
                w = (lo - qlo) >> 5;
                const int wa = max(a, qlo + 32 * w), wb = min(b, qlo + 32 * w + 31);
                for (int q = wa; q <= wb && keep; q++) {
                    if (q == lo || pa_lists_has(L, q, lp)) {
                        if (q < lo) keep = false;
                        else mask |= 1u << ((q - qlo) & 31);
                    }
                }
            }
            int total;
            const int at = pa_block_prefix(keep, sWarp, total);
            if (keep) uni[(int64_t) rt * L.cap + sCount + at] = make_int4(lp, (int) mask, w, 0);
            __syncthreads();
            if (threadIdx.x == 0) sCount += total;
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) n_union[rt] = sCount;
}

// Backward row-tile bitmap: one block per backward row tile j (rows j * BM ..); bits zeroed
// before. Key tiles of BN keys; n_kt key tiles in all.
__global__ void pa_lists_bits_kernel(PaLists L, int T, int G, int BM, int P, int BN, int n_kt, uint32_t * bits) {
    __shared__ int sMin, sMax;
    const int j = blockIdx.x, TG = T * G;
    pa_rows_minmax(L.pos, TG, G, j * BM, BM, &sMin, &sMax);
    if (sMax < 0) return;
    const int c0 = L.pos[0] / P;
    const int a = max(sMin / P - c0, 0), b = min(sMax / P - c0, L.n_qtiles - 1);
    if (a > b) return;
    const int i0 = L.offsets[a], i1 = L.offsets[b + 1];
    const uint32_t bit = 1u << (j & 31);
    for (int i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const int lp = L.pages[i];
        if (lp < 0 || lp >= c0 || !pa_lists_in_window(L, lp)) continue;
        const int kt1 = min((lp * P + P - 1) / BN, n_kt - 1);
        for (int kt = lp * P / BN; kt <= kt1; kt++) atomicOr(&bits[(int64_t) kt * L.n_words + (j >> 5)], bit);
    }
}

} // namespace
