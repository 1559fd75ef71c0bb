// Paged flash attention on CUDA: forward and backward of oomb_paged_attn (see oomb.h), computing the
// same function as the CPU reference kernels of src/cpu/paged-attn.cpp.
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
//     the forward's node (args.fwd), computes each row's delta = bf16(dout) . out from the saved out and
//     converts the saved LSE to log2 units, in the backward's row order; a meta kernel finds, per
//     tile of rows, the min/max position; (2) only without saved statistics (args.fwd NULL, or saved
//     out not 16-byte aligned): the forward kernel in "lse" mode recomputes each row's log-sum-exp
//     and delta; (3) a key-major kernel owns a tile of 128 keys of one KV head, loops over the row
//     tiles that attend it, accumulates dK/dV in registers (no atomics: it alone writes those
//     gradient rows in this launch) and adds dQ = dS K into the f32 dq output with atomics (the
//     pipelined wgmma kernel: into a tile-contiguous f32 accumulator, written into dq after by
//     pa_dq_acc_kernel, config.bwd_dqacc); (4) dk_cur/dv_cur are read back from the gradient pages at pos.
// On Hopper (an sm_90a build on a compute capability 9.0 GPU) the same forward and backward run on
// warpgroup MMA instead (paged-attn-wgmma.cuh: wgmma, 128-row / 128-key tiles; the forward needs a
// page size multiple of 128); config.wgmma = 0 (OOMB_PAGED_ATTN_WGMMA=0) keeps the mma.sync kernels above.
// The Hopper forward is warp-specialised (paged-attn-ws.cuh, FlashAttention-3's structure: a TMA
// producer warpgroup reading K/V through the page table as a 4-d tensor map, two consumer
// warpgroups, or three at head dim 64 where chosen (fwd_wg3), taking turns on the tensor cores, the
// intra-warpgroup overlap) for every schedule;
// config.fwd_ws = 0 runs the two-warpgroup wgmma forward of paged-attn-wgmma.cuh instead, which is
// also the fallback when the driver cannot encode the tensor maps.
// Generic path (f32 / f16 pools, other head dims up to 256, unaligned strides): simple f32 kernels,
// one warp per query row (forward, dq) or per key (dK/dV): exact f32 arithmetic like the CPU. Its
// forward saves the LSE too; its backward reads the saved LSE (and computes delta from the saved
// out) when the forward also ran the generic kernels, else it recomputes them in f32.
// Page schedules (oomb-schedule.h): DENSE and RANGE on every family (a range through a shifted page
// table and clamped positions, range_geom: the kernels themselves unchanged); LISTS on every family
// too: the generic kernels test each page against the lists, the tensor-core kernels have LISTS
// variants (a template flag; the DENSE / RANGE instantiations are unchanged) that walk per-block
// work lists built on the device by two prep kernels, no host sync (paged-attn-lists.cuh: the
// forward's union of its rows' lists, the backward's key-tile x row-tile bitmap). Page sizes that
// are not a multiple of 64 (the LISTS forward's key tile) stay on the generic kernels (fast_family).
// LISTS_RANGE (the offload's blocks of a sparse history) runs on the LISTS variants of the
// tensor-core kernels, the window carried in their lists view (PaLists::win_first / win_last; the
// prep kernels drop the entries outside it, the kernels walk and mask only the window's keys:
// paged-attn-lists.cuh); config.lists_range_fast = false (OOMB_PAGED_ATTN_LISTS_RANGE_FAST=0) puts
// it back on the generic kernels, whose loops visit only a window's keys. On by default since the
// H200 run of 2026-12-02 (ListsRangeFastKernels passed; the 7B 1M sparse + offload step: 512 s).
//
// The family, one translation unit: paged-attn-common.cuh (helpers, store / read-back kernels),
// paged-attn-lists.cuh (page lists on the tensor-core kernels: work lists, prep kernels),
// paged-attn-mma.cuh (mma.sync kernels), paged-attn-wgmma.cuh (wgmma kernels), paged-attn-ws.cuh
// (the warp-specialised wgmma forward; sm90.cuh: its mbarrier / TMA / named-barrier primitives),
// paged-attn-generic.cuh (f32 kernels); this file checks the operands, picks the kernels and
// launches them.

#include "paged-attn.cuh"
#include "common.cuh"
#include "paged-attn-common.cuh"
#include "paged-attn-mma.cuh"
#include "paged-attn-wgmma.cuh"
#include "paged-attn-ws.cuh"
#include "paged-attn-generic.cuh"
#include "oomb/paged-attn-sched.h"

#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <mutex>

#define PA_CHECK(call) CUDA_CHECK(call)   // the backend's error macros (common.cuh)
#define PA_LAUNCH_CHECK() PA_CHECK(cudaGetLastError())

namespace {

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

// Kernel variants (oomb_paged_attn_config in paged-attn.cuh; defaults measured, see bench/NOTES.md).
const oomb_paged_attn_config & cfg() { return oomb_cuda_paged_attn_config(); }
// forward D=128 variants: 0: 4 warps x 32 rows, 32-key tiles; 1: 8 warps x 16 rows, 64-key tiles;
// 2 (default): 4 warps x 32 rows, 64-key tiles (measured at 32K on the H200: 234 / 218 / 278 TFLOP/s)
int fwd_bn(int D) { return D == 64 ? 64 : (cfg().fwd == 0 ? 32 : 64); }
// backward D=128 variants: rows per step 0: 32, 1 (default): 64, 2: 16 (op backward incl. the LSE
// pass at 32K: 144 / 160 / 115 counted TFLOP/s)

// SMs of the current device (132, the H200's, where it cannot be asked)
int sm_count() {
    int dev = 0, n_sm = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    return n_sm;
}

// Blocks per key tile in the backward. Parallelism is over (key tile, KV head) only: a chunk's
// own keys alone give T/128 * Hkv tiles (64 for Qwen2.5-0.5B at chunk 4096), half the H200's 132
// SMs at one block per SM, and a few tiles more than a wave leave most of the last wave idle. So
// the row tiles of a key tile are dealt to nsplit blocks, enough that the chunk's own tiles fill
// about two waves; dK/dV are then added with atomics. config.split >= 0 forces it. At most 4, and
// each block keeps at least ~7,168 group rows (TG / 7168 blocks per key tile): a block pays a pipeline
// start and its dK/dV atomics, worth it only while it is long. Measured (H200, bench/NOTES.md version
// 20, backward TFLOP/s with the split forced to 2 / 4 / 6 / 8): 7B layer at 128K, chunk 2048 (TG 14,336)
// 460 / 448 / 435 / 422; 0.5B layer at 32K, chunk 4096 (TG 28,672) 337 / 353 / 353 / 351. (Lowering it
// further on the device where a long history alone fills the waves measured slower: fewer, longer
// blocks leave more of the last wave idle.) A long chunk whose own tiles already fill the waves still
// splits in 2 (head dim 128; at 64 below 1,024 own tiles): measured (H100, bench/NOTES.md "Session 24"),
// backward TFLOP/s unsplit -> split 2 at one chunk: 7B layer 16K 413 -> 439-452, 32K 424 -> 442-444,
// 64K 442 -> 454-457; 0.5B layer 32K (512 own tiles) 352-357 -> 365-366, SmolLM2 32K (768) 366 -> 372,
// 0.5B 64K (1,024) 374 -> 370 (kept unsplit).
int bwd_split(int own_tiles, int n_rt, int64_t TG, int D) {
    int ns;
    if (cfg().split >= 0) ns = cfg().split;
    else {
        const int n_sm = sm_count();
        ns = (2 * n_sm + own_tiles - 1) / std::max(own_tiles, 1);
        if (ns == 1 && (D == 128 || own_tiles < 1024)) ns = 2;
        ns = std::min<int64_t>({(int64_t) ns, 4, std::max<int64_t>(1, TG / 7168)});
    }
    return std::max(1, std::min(ns, std::max(n_rt, 1)));
}

// D = 64 variants: registers are not the limit there, so more blocks per SM (latency hiding) can be
// asked of the compiler.
//   forward 0 (default): 4 warps x 32 rows, 64-key tiles, 220 registers (2 blocks/SM);
//           1: the same with at most 168 registers (3 blocks/SM, 44 B of spills); 2: 8 warps x 16 rows,
//           64-key tiles (145 registers)
//   backward 0 (default): 64 rows per step, 1 block/SM (240 registers); 1: 32 rows, 2 blocks/SM
//           (128 registers, 44 B of spills); 2: 32 rows, 1 block/SM
int bwd_bm(int D) { return D == 64 ? (cfg().bwd64 >= 1 ? 32 : 64) : (cfg().bwd == 1 ? 64 : cfg().bwd == 2 ? 16 : 32); }

// The wgmma kernels (paged-attn-wgmma.cuh) for head dims 64 and 128 run on a compute capability 9.0 device
// with this file compiled for sm_90a (a probe kernel says so, once per process).
// config.wgmma selects them: bit 0 the forward (page size a multiple of 128), bit 1 the backward;
// 3 (default): both, 0: the mma.sync kernels.
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
// (scale > 0: their softmax takes the row max over the raw products, fwd_softmax_p; a zero, negative or NaN
// scale runs the mma.sync kernels)
bool fwd_wgmma(int D, int P, float scale = 1.0f) {
    return (D == 64 || D == 128) && P % FwdW<128, false>::BN == 0 && scale > 0.0f && (cfg().wgmma & 1) && wgmma_available();
}
bool bwd_wgmma(int D) { return (D == 64 || D == 128) && (cfg().wgmma & 2) && wgmma_available(); }

// Can the tensor-core kernels run on these operands?
bool fast_ok(const oomb_tensor * q, const oomb_tensor * kp, const oomb_tensor * vp, const oomb_tensor * dout) {
    if (cfg().generic) return false;
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
    PA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) smem));
    // all of the SM's unified memory as shared memory: two CTAs of the head-dim-64 wgmma kernels fit
    PA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
}
// set_smem once per kernel and device: a function attribute belongs to the current device, so a
// second GPU needs its own (one bit per device id; ids from 64 on set it on every launch). One static
// instance per launcher instantiation, i.e. per kernel.
struct SmemAttrOnce {
    std::atomic<uint64_t> done{0};
    template <typename F> void operator()(F * kernel, size_t smem) {
        int dev = 0;
        PA_CHECK(cudaGetDevice(&dev));
        const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t) 1 << dev : 0;
        if (bit && (done.load(std::memory_order_acquire) & bit)) return;
        set_smem(kernel, smem);  // (two threads may both set it: harmless)
        done.fetch_or(bit, std::memory_order_release);
    }
};

// Two CTAs per SM for the head-dim-64 wgmma kernels (registers capped at 128), so that one CTA's
// softmax overlaps the other's products: config.occ64 bit 0 the forward, bit 1 the backward.
// Default 1, the forward only: Qwen2.5-0.5B layer at 32K (dea97ac, same call) forward 245 -> 273
// TFLOP/s (64 bytes of spills), backward 270 -> 181 (512 bytes of spills).
int occ64_bits() { return cfg().occ64; }

template <int D, int MODE, bool PIPE, int MINB, bool LISTS = false> void launch_fwd_wgmma(cudaStream_t stream, const FwdArgs & a, int Hkv) {
    using W = FwdW<D, PIPE>;
    static SmemAttrOnce smem_attr;
    smem_attr(pa_fwd_wgmma_kernel<D, MODE, PIPE, MINB, LISTS>, W::smem);
    dim3 grid((a.T * a.G + W::BM - 1) / W::BM, Hkv);
    pa_fwd_wgmma_kernel<D, MODE, PIPE, MINB, LISTS><<<grid, W::NT, W::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}

// The K and V pools as TMA tensor maps for pa_fwd_ws_kernel: 4-d (dims, KV heads, slots, pages;
// byte strides from the args), boxes of 64 dims x 1 head x 128 slots x 1 page, 128-byte swizzle.
// False when the driver lacks cuTensorMapEncodeTiled or refuses the geometry (the caller then runs
// the two-warpgroup kernel).
bool kv_tensor_maps(const FwdArgs & a, int D, int Hkv, CUtensorMap * tk, CUtensorMap * tv) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void * fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            fn = nullptr;
        }
        return (PFN_cuTensorMapEncodeTiled_v12000) fn;
    }();
    if (!encode) return false;
    const cuuint64_t dims[4] = {(cuuint64_t) D, (cuuint64_t) Hkv, (cuuint64_t) a.P, (cuuint64_t) a.n_pages};
    const cuuint64_t strides[3] = {(cuuint64_t) a.kv_s1 * 2, (cuuint64_t) a.kv_s2 * 2, (cuuint64_t) a.kv_s3 * 2};
    const cuuint32_t box[4] = {64, 1, 128, 1}, estr[4] = {1, 1, 1, 1};
    for (int i = 0; i < 2; i++) {
        if (encode(i ? tv : tk, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *) (i ? a.vp : a.kp), dims, strides, box, estr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return false;
    }
    return true;
}

// The family each direction ran last (oomb_cuda_paged_attn_last_family) and the last output
// forward's key shares (oomb_cuda_paged_attn_last_fwd_split).
std::atomic<const char *> g_last_family[2] = {{""}, {""}};
void record_family(int backward, const char * f) { g_last_family[backward].store(f, std::memory_order_relaxed); }
std::atomic<int> g_last_fwd_split{0};
void record_fwd_split(int ns) { g_last_fwd_split.store(ns, std::memory_order_relaxed); }

template <int D, int MODE, int NS, bool LISTS, bool OVL = false, int NC = 2> bool launch_fwd_ws(cudaStream_t stream, const FwdArgs & a, int Hkv) {
    using W = FwdWS<D, NS, NC>;
    static_assert(W::BN == FwdW<D, false>::BN && (NC == 3 || W::BM == FwdW<D, false>::BM), "the same tiles as the two-warpgroup forward");
    CUtensorMap tk, tv;
    if (!kv_tensor_maps(a, D, Hkv, &tk, &tv)) return false;
    static SmemAttrOnce smem_attr;
    smem_attr(pa_fwd_ws_kernel<D, MODE, NS, LISTS, OVL, NC>, W::smem);
    dim3 grid((a.T * a.G + W::BM - 1) / W::BM, Hkv, !LISTS && MODE == MODE_OUT && NC == 2 && a.fsplit > 1 ? a.fsplit : 1);
    pa_fwd_ws_kernel<D, MODE, NS, LISTS, OVL, NC><<<grid, W::NT, W::smem, stream>>>(a, tk, tv);
    PA_LAUNCH_CHECK();
    if (MODE == MODE_OUT) record_fwd_split((int) grid.z);
    return true;
}

// Three consumer warpgroups for the head-dim-64 forward (config.fwd_wg3; 2: decide here)? A block
// holds 192 rows instead of 128, so fewer, larger blocks can leave more of the last wave idle: with
// chunk 4096 (300 blocks of 192 rows, 448 of 128 on 132 SMs) they measured 310 -> 287 TFLOP/s. Per
// block they ran ~1.07x faster in version 18 (0.5B layer, one chunk of 32K: 362 -> 381), but the
// two-warpgroup kernel as built since f54e606 runs that call at 405 against the three's 382 (H200,
// bench/NOTES.md version 20; SmolLM2's 9 / 3 heads: 375 against 377). So three are chosen only where
// the fraction of the waves' row slots (SMs x block rows) that real rows fill with 192-row blocks
// beats that fraction with 128 (blocks counted as equally long: the chunk's rows all attend the
// history); it was 1.05 x that fraction before. Counting rows, not blocks, keeps two where a 192-row
// block would be mostly padding (T G <= 128: the same number of blocks either way).
bool fwd_wg3(const FwdArgs & a, int Hkv) {
    if (cfg().fwd_wg3 != 2) return cfg().fwd_wg3 == 1;
    const int n_sm = sm_count();
    const int64_t TG = (int64_t) a.T * a.G;
    if (TG <= 0 || Hkv <= 0) return false;
    auto fill = [&](int64_t bm) {
        const int64_t b = (TG + bm - 1) / bm * Hkv, waves = (b + n_sm - 1) / n_sm;
        return (double) (TG * Hkv) / (double) (waves * n_sm * bm);
    };
    return fill(192) > fill(128);
}

// Key shares per row tile of the warp-specialised forward (MODE_OUT, dense and range schedules;
// config.fwd_split >= 1 forces it, clamped to 1-4). A forward block is a row tile against all keys up to
// its rows' positions, so after a long history the blocks are equally long and their count alone sets
// the waves: 7B at chunk 2048 has 16 x 7 row tiles x 4 KV heads = 448 blocks, 3.4 waves of 132 SMs,
// the fourth 40 % full (85 % of the SM time used). Splitting each row tile's keys in ns shares
// (flash-decoding's split-K; the partial results merged by their LSEs after) gives 896 blocks, 6.8
// waves (97 %). Chosen: the ns of 1-4 with the best wave fill less 2 % per extra share (the merge
// passes and each share's pipeline start); a block with fewer than ns * 8 key tiles (a chunk without
// history, mostly) is not split (its last share takes all). BM: the block's rows (128; the kernel with
// three consumer warpgroups, 192 rows, is not split: fwd_wg3 picks it only where its blocks fill the
// waves).
int fwd_kv_split(int64_t TG, int BM, int Hkv) {
    if (cfg().fwd_split >= 1) return std::min(cfg().fwd_split, 4);
    const int64_t n_sm = sm_count(), blocks = (TG + BM - 1) / BM * Hkv;
    if (blocks <= 0) return 1;
    auto fill = [&](int ns) {
        const int64_t b = blocks * ns, waves = (b + n_sm - 1) / n_sm;
        return (double) b / (double) (waves * n_sm);
    };
    int best = 1;
    double best_v = fill(1);
    for (int ns = 2; ns <= 4; ns++) {
        const double v = fill(ns) - 0.02 * (ns - 1);
        if (v > best_v) best = ns, best_v = v;
    }
    return best;
}
constexpr int FWD_SPLIT_MIN_TILES = 8;  // key tiles per share at least (FwdArgs::fsplit_min)

// The warp-specialised forward (config.fwd_ws) where it can run; false: run another kernel.
template <int MODE, bool LISTS> bool fwd_ws(cudaStream_t stream, const FwdArgs & a, int D, int Hkv) {
    switch (cfg().fwd_ws) {
        // H200, forward alone (oomb-bench-attn, same call): 3 K/V stages at head dim 128, 32K / 128K
        // 533 / 515 TFLOP/s, 2 stages 465 / 460 (affeb9c); with the intra-warpgroup overlap 550 / 539
        // vs 510 / 508 without (e791cab); the two-warpgroup kernel 381-405. Head dim 64 at 32K: 4
        // stages 304-309, overlap 313, 2 stages 298, the two-warpgroup kernel (two CTAs/SM) 275.
        case 1:
            if (D == 128) return launch_fwd_ws<128, MODE, 3, LISTS, true>(stream, a, Hkv);
            if constexpr (!LISTS) {
                if (fwd_wg3(a, Hkv)) return launch_fwd_ws<64, MODE, 4, false, true, 3>(stream, a, Hkv);
            }
            return launch_fwd_ws<64, MODE, 4, LISTS, true>(stream, a, Hkv);
        case 2: return D == 128 ? launch_fwd_ws<128, MODE, 3, LISTS>(stream, a, Hkv) : launch_fwd_ws<64, MODE, 4, LISTS>(stream, a, Hkv);
        case 3: return D == 128 ? launch_fwd_ws<128, MODE, 2, LISTS>(stream, a, Hkv) : launch_fwd_ws<64, MODE, 2, LISTS>(stream, a, Hkv);
        default: return false;
    }
}

// The wgmma forward issuing the next key tile's S before the current tile's softmax (a second S
// accumulator: registers allow it at head dim 64 only): config.fwd_pipe. Off by default: ptxas
// serializes its wgmmas (C7515), and it measured slower (0.5B layer at 32K: 223 vs 247 TFLOP/s,
// bench/NOTES.md version 11).
bool fwd_pipe(int D) { return D == 64 && cfg().fwd_pipe; }

template <int D, int MINB, bool LISTS = false> void launch_bwd_wgmma(cudaStream_t stream, const BwdArgs & a, int n_key_tiles, int Hkv) {
    using W = BwdW<D>;
    static SmemAttrOnce smem_attr;
    smem_attr(pa_bwd_wgmma_kernel<D, MINB, LISTS>, W::smem);
    dim3 grid(n_key_tiles, Hkv, a.nsplit);
    pa_bwd_wgmma_kernel<D, MINB, LISTS><<<grid, W::NT, W::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}

template <int D, bool LISTS, bool KVR, bool DQA> void launch_bwd_pipe_v(cudaStream_t stream, const BwdArgs & a, int n_key_tiles, int Hkv) {
    using W = BwdW<D, 3, 2>;
    static SmemAttrOnce smem_attr;
    smem_attr(pa_bwd_pipe_kernel<D, LISTS, KVR, DQA>, W::smem);
    dim3 grid(n_key_tiles, Hkv, a.nsplit);
    pa_bwd_pipe_kernel<D, LISTS, KVR, DQA><<<grid, W::NT, W::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}
// a.dq_acc set: dQ into the accumulator (config.bwd_dqacc), else into dq
template <int D, bool LISTS, bool KVR = false> void launch_bwd_pipe(cudaStream_t stream, const BwdArgs & a, int n_key_tiles, int Hkv) {
    if (a.dq_acc) launch_bwd_pipe_v<D, LISTS, KVR, true>(stream, a, n_key_tiles, Hkv);
    else launch_bwd_pipe_v<D, LISTS, KVR, false>(stream, a, n_key_tiles, Hkv);
}

// The wgmma backward: the row-tile-overlapped kernel (config.bwd_pipe, the default) or
// pa_bwd_wgmma_kernel (two CTAs per SM at head dim 64 with config.occ64 bit 1). H200, backward alone
// (oomb-bench-attn, same call, 72684d5): 7B layer 32K / 128K 351 / 367 -> 377 / 389 TFLOP/s, 0.5B
// layer 32K 262 -> 294 (bench/NOTES.md version 17).
// Whether the wgmma backward adds dQ into the accumulator (a.dq_acc; pa_bwd_pipe_kernel only): the
// dispatcher sizes, zeroes and converts it by this, launch_bwd_wgmma_any checks it.
bool bwd_dq_acc() { return cfg().bwd_pipe && cfg().bwd_dqacc; }

template <bool LISTS> void launch_bwd_wgmma_any(cudaStream_t stream, const BwdArgs & a, int D, int n_key_tiles, int Hkv) {
    if ((a.dq_acc != nullptr) != bwd_dq_acc()) oomb_error("paged_attn_back (cuda): internal: dq accumulator set for the wrong kernel");
    if (cfg().bwd_pipe) {
        if (D == 128) launch_bwd_pipe<128, LISTS>(stream, a, n_key_tiles, Hkv);
        else if (cfg().bwd_kvr) launch_bwd_pipe<64, LISTS, true>(stream, a, n_key_tiles, Hkv);
        else launch_bwd_pipe<64, LISTS>(stream, a, n_key_tiles, Hkv);
        return;
    }
    if (D == 128) launch_bwd_wgmma<128, 1, LISTS>(stream, a, n_key_tiles, Hkv);
    else if (occ64_bits() & 2) launch_bwd_wgmma<64, 2, LISTS>(stream, a, n_key_tiles, Hkv);
    else launch_bwd_wgmma<64, 1, LISTS>(stream, a, n_key_tiles, Hkv);
}

template <int D, int WM, int BN, int NW, int MODE, int MINB = 1, bool LISTS = false>
void launch_fwd(cudaStream_t stream, const FwdArgs & a, int Hkv) {
    using C = FwdCfg<D, WM, BN, NW>;
    static_assert(!LISTS || C::BM == 128, "the page-list forward's work lists are per 128 rows (lists_union)");
    static SmemAttrOnce smem_attr;
    smem_attr(pa_fwd_kernel<D, WM, BN, NW, MODE, MINB, LISTS>, C::smem);
    const int TG = a.T * a.G;
    dim3 grid((TG + C::BM - 1) / C::BM, Hkv);
    pa_fwd_kernel<D, WM, BN, NW, MODE, MINB, LISTS><<<grid, NW * 32, C::smem, stream>>>(a);
    PA_LAUNCH_CHECK();
}


// The page-list schedule (LISTS, a.lists set by lists_union) runs on one variant per family and
// head dim (the defaults; config.fwd = 1 kept at head dim 128), not the PIPE loop. ptxas (sm_90a,
// this version): mma.sync D=128 96 B of spills (the dense variant 80), D=64 none; wgmma D=128 249
// registers, D=64 222, no spills.
template <int MODE>
void fwd_fast_lists(cudaStream_t stream, const FwdArgs & a, int D, int Hkv) {
    if (fwd_wgmma(D, a.P, a.c)) {
        if (fwd_ws<MODE, true>(stream, a, D, Hkv)) return;
        // one CTA per SM at head dim 64 (config.occ64 ignored: capped at 128 registers the LISTS
        // variant spills 212 bytes, ptxas)
        if (D == 128) launch_fwd_wgmma<128, MODE, false, 1, true>(stream, a, Hkv);
        else launch_fwd_wgmma<64, MODE, false, 1, true>(stream, a, Hkv);
    } else if (D == 64) {
        launch_fwd<64, 2, 64, 4, MODE, 1, true>(stream, a, Hkv);
    } else if (cfg().fwd == 1) {
        launch_fwd<128, 1, 64, 8, MODE, 1, true>(stream, a, Hkv);
    } else {
        launch_fwd<128, 2, 64, 4, MODE, 1, true>(stream, a, Hkv);
    }
}

template <int MODE, bool LISTS = false>
void fwd_fast(cudaStream_t stream, const FwdArgs & a, int D, int Hkv) {
    if constexpr (LISTS) {
        fwd_fast_lists<MODE>(stream, a, D, Hkv);
        return;
    }
    if (fwd_wgmma(D, a.P, a.c)) {
        if (fwd_ws<MODE, false>(stream, a, D, Hkv)) return;
        if (D == 128) launch_fwd_wgmma<128, MODE, false, 1>(stream, a, Hkv);
        else if (fwd_pipe(D)) launch_fwd_wgmma<64, MODE, true, 1>(stream, a, Hkv);
        else if (occ64_bits() & 1) launch_fwd_wgmma<64, MODE, false, 2>(stream, a, Hkv);
        else launch_fwd_wgmma<64, MODE, false, 1>(stream, a, Hkv);
        return;
    }
    if (D == 64) {
        switch (cfg().fwd64) {
            case 1: launch_fwd<64, 2, 64, 4, MODE, 3>(stream, a, Hkv); break;
            case 2: launch_fwd<64, 1, 64, 8, MODE>(stream, a, Hkv); break;
            default: launch_fwd<64, 2, 64, 4, MODE>(stream, a, Hkv); break;
        }
        return;
    }
    switch (cfg().fwd) {
        case 1: launch_fwd<128, 1, 64, 8, MODE>(stream, a, Hkv); break;
        case 2: launch_fwd<128, 2, 64, 4, MODE>(stream, a, Hkv); break;
        default: launch_fwd<128, 2, 32, 4, MODE>(stream, a, Hkv); break;
    }
}

constexpr int BWD_NW = 8;

template <int D, int BM, int MINB = 1, bool LISTS = false>
void launch_bwd(cudaStream_t stream, const BwdArgs & a, int n_key_tiles, int Hkv) {
    using C = BwdCfg<D, BM, BWD_NW>;
    static SmemAttrOnce smem_attr;
    smem_attr(pa_bwd_kernel<D, BM, BWD_NW, MINB, LISTS>, C::smem);
    dim3 grid(n_key_tiles, Hkv, a.nsplit);
    pa_bwd_kernel<D, BM, BWD_NW, MINB, LISTS><<<grid, BWD_NW * 32, C::smem, stream>>>(a);
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

GenArgs gen_args(const Geom & G, const oomb_tensor * q, const oomb_tensor * kp, const oomb_tensor * vp, float scale,
                 const oomb_page_schedule & sched) {
    GenArgs a{};
    a.q = (const float *) q->data; a.q_s1 = q->nb[1] / 4; a.q_s2 = q->nb[2] / 4;
    a.kp = (const char *) kp->data; a.vp = (const char *) vp->data;
    a.p_s0 = kp->nb[0]; a.p_s1 = kp->nb[1]; a.p_s2 = kp->nb[2]; a.p_s3 = kp->nb[3];
    a.pt = G.pt; a.n_logical = G.n_logical; a.n_pages = G.n_pages; a.P = G.P;
    a.pos = G.pos;
    a.D = G.D; a.T = G.T; a.H = G.H; a.G = G.G; a.Hkv = G.Hkv;
    a.scale = scale;
    a.sched = oomb::pa_sched_of(sched);  // the tensors' data are device pointers
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

// Which kernels a call may use besides the generic ones. DENSE and RANGE run on the fast kernels
// (RANGE through range_geom below, the kernels unchanged). LISTS run on them too (the kernels'
// LISTS variants, paged-attn-lists.cuh) where the page size is a multiple of 64 (their forward's
// key tile; every page size fast_ok takes at the default config); other page sizes go to the
// generic kernels. LISTS_RANGE (the offload's blocks of a sparse history): as LISTS where
// config.lists_range_fast is set, else the generic kernels.
bool fast_family(const oomb_paged_attn_args & A, const oomb_tensor * dout) {
    if (!fast_ok(A.q, A.k_pages, A.v_pages, dout)) return false;
    if (A.schedule.kind == OOMB_SCHEDULE_LISTS_RANGE && !cfg().lists_range_fast) return false;
    return !oomb_schedule_has_lists(A.schedule.kind) || A.k_pages->ne[2] % 64 == 0;
}
// Does a call on the fast kernels take their LISTS variants (LISTS, LISTS_RANGE)?
bool fast_lists(const oomb_page_schedule & s) { return oomb_schedule_has_lists(s.kind) != 0; }

// ---- LISTS on the fast kernels (paged-attn-lists.cuh) ----
constexpr int LISTS_FWD_BM = 128;  // rows of a forward block (every family and variant the lists run on)
static_assert(FwdW<128, false>::BM == LISTS_FWD_BM && FwdW<64, false>::BM == LISTS_FWD_BM, "wgmma forward rows per block");

// The schedule's device view; the work lists are added by lists_union / lists_bits. The window:
// LISTS_RANGE's [first, last) (first capped at n_logical: win_first * P fits an int, and the pages
// from n_logical on have no keys), LISTS every page.
PaLists lists_view(const oomb_page_schedule & s, const Geom & G) {
    const oomb::pa_sched v = oomb::pa_sched_of(s);
    PaLists L{};
    L.offsets = v.offsets;
    L.pages = v.pages;
    L.n_qtiles = v.n_qtiles;
    L.pos = G.pos;
    const bool windowed = s.kind == OOMB_SCHEDULE_LISTS_RANGE;
    L.win_first = windowed ? std::max(0, std::min<int>(s.first, G.n_logical)) : 0;
    L.win_last = windowed ? std::max<int>(s.last, L.win_first) : INT_MAX;
    // a row tile's union holds at most one entry per list entry
    L.cap = (int) std::max<int64_t>(1, oomb_nelements(s.pages));
    L.whole = (cfg().lists_bwd & 8) ? 1 : 0;
    return L;
}
int lists_fwd_rt(const Geom & G) { return (G.T * G.G + LISTS_FWD_BM - 1) / LISTS_FWD_BM; }
size_t lists_union_bytes(const Geom & G, const PaLists & L) {
    const size_t n_rt = (size_t) lists_fwd_rt(G);
    return carve_size(n_rt * L.cap * sizeof(int4)) + carve_size(n_rt * sizeof(int));
}
// The forward's per-row-tile union of history pages (pa_lists_union_kernel), into L.
void lists_union(cudaStream_t stream, Carver & cv, const Geom & G, PaLists & L) {
    const int n_rt = lists_fwd_rt(G);
    int4 * uni = cv.take<int4>((size_t) n_rt * L.cap);
    int * nu = cv.take<int>((size_t) n_rt);
    pa_lists_union_kernel<<<n_rt, 256, 0, stream>>>(L, G.T, G.G, LISTS_FWD_BM, G.P, uni, nu);
    PA_LAUNCH_CHECK();
    L.uni = uni;
    L.n_union = nu;
}
size_t lists_bits_bytes(int n_key_tiles, int n_rt) { return carve_size((size_t) n_key_tiles * ((n_rt + 31) / 32) * sizeof(uint32_t)); }
// The backward's key-tile x row-tile bitmap (pa_lists_bits_kernel), into L.
void lists_bits(cudaStream_t stream, Carver & cv, const Geom & G, int BM, int BN, int n_key_tiles, int n_rt, PaLists & L) {
    L.n_words = (n_rt + 31) / 32;
    const size_t n = (size_t) n_key_tiles * L.n_words;
    uint32_t * bits = cv.take<uint32_t>(n);
    PA_CHECK(cudaMemsetAsync(bits, 0, n * sizeof(uint32_t), stream));
    pa_lists_bits_kernel<<<n_rt, 128, 0, stream>>>(L, G.T, G.G, BM, G.P, BN, n_key_tiles, bits);
    PA_LAUNCH_CHECK();
    L.bits = bits;
}

// A page range [first, last) on the fast kernels without touching them: they see only the range's
// pages (the page table from logical page first, last - first pages) and every position relative
// to the range's start, clamped to its end: row t then attends keys first*P <= p <= min(pos[t],
// last*P - 1), exactly the RANGE schedule; a row before the range gets a negative position and
// sees no key (out 0, LSE -inf, as the kernels' epilogues write for a row without keys; a forward
// block whose rows all see none returns early, so the callers pre-fill out / LSE). The tile
// alignment the forward needs (P a multiple of its key tile) is kept: the shift is whole pages.
// The dense schedule returns G itself (no extra kernel, the same launches as before).
__global__ void pa_range_pos_kernel(const int32_t * pos, int T, int lo, int hi, int32_t * out) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T) out[t] = min(pos[t], hi) - lo;
}
__global__ void pa_fill_kernel(float * x, int64_t n, float v) {
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) x[i] = v;
}
Geom range_geom(const Geom & G, const oomb_page_schedule & s, int32_t * pos_buf, cudaStream_t stream) {
    if (s.kind != OOMB_SCHEDULE_RANGE) return G;
    Geom K = G;
    const int first = std::min<int>(s.first, G.n_logical), last = std::max(first, std::min<int>(s.last, G.n_logical));
    K.pt = G.pt + first;
    K.n_logical = last - first;
    pa_range_pos_kernel<<<(unsigned) ((G.T + 255) / 256), 256, 0, stream>>>(G.pos, G.T, first * G.P, last * G.P - 1, pos_buf);
    PA_LAUNCH_CHECK();
    K.pos = pos_buf;
    return K;
}

int env_digit(const char * name, int max_value, const char * what) {
    const char * e = getenv(name);
    if (!e || !*e) return -1;
    if (e[1] || e[0] < '0' || e[0] > '0' + max_value) oomb_error("%s must be %s, got '%s'", name, what, e);
    return e[0] - '0';
}
int env_int(const char * name, int def) {
    const char * v = getenv(name);
    return v && *v ? atoi(v) : def;
}

std::mutex g_cfg_mutex;
oomb_paged_attn_config g_cfg;
std::atomic<bool> g_cfg_set{false};

} // namespace

oomb_paged_attn_config oomb_paged_attn_config_from_env() {
    oomb_paged_attn_config c;
    c.generic = getenv("OOMB_PAGED_ATTN_GENERIC") != nullptr;
    int d;
    if ((d = env_digit("OOMB_PAGED_ATTN_WGMMA", 3, "0-3 (bit 0: wgmma forward, bit 1: wgmma backward)")) >= 0) c.wgmma = d;
    c.fwd = env_int("OOMB_PAGED_ATTN_FWD", c.fwd);
    c.bwd = env_int("OOMB_PAGED_ATTN_BWD", c.bwd);
    c.fwd64 = env_int("OOMB_PAGED_ATTN_FWD64", c.fwd64);
    c.bwd64 = env_int("OOMB_PAGED_ATTN_BWD64", c.bwd64);
    c.split = env_int("OOMB_PAGED_ATTN_SPLIT", c.split);
    c.fwd_split = env_int("OOMB_PAGED_ATTN_FWDSPLIT", c.fwd_split);
    if ((d = env_digit("OOMB_PAGED_ATTN_OCC64", 3, "0-3 (two CTAs per SM at head dim 64, bit 0: the two-warpgroup forward, FWDWS=0; bit 1: the backward with BWDPIPE=0)")) >= 0) c.occ64 = d;
    if ((d = env_digit("OOMB_PAGED_ATTN_FWDPIPE", 1, "0 or 1")) >= 0) c.fwd_pipe = d == 1;
    if ((d = env_digit("OOMB_PAGED_ATTN_FWDWS", 3, "0-3 (0: the two-warpgroup wgmma forward; warp-specialised: 1 with the intra-warpgroup overlap, 2 without, 3 without and 2 K/V stages)")) >= 0) c.fwd_ws = d;
    if ((d = env_digit("OOMB_PAGED_ATTN_LISTS_RANGE_FAST", 1, "0 or 1")) >= 0) c.lists_range_fast = d == 1;
    if ((d = env_digit("OOMB_PAGED_ATTN_BWDPIPE", 1, "0 or 1 (1: the wgmma backward with the row tiles overlapped)")) >= 0) c.bwd_pipe = d == 1;
    if ((d = env_digit("OOMB_PAGED_ATTN_FWDWG3", 2, "0-2 (head dim 64, the warp-specialised forward's consumer warpgroups: 0: two, 1: three, 2: three where the blocks fill the waves)")) >= 0) c.fwd_wg3 = d;
    if ((d = env_digit("OOMB_PAGED_ATTN_BWDKVR", 1, "0 or 1 (1: head dim 64, K and V of the pipelined backward in registers)")) >= 0) c.bwd_kvr = d == 1;
    if ((d = env_digit("OOMB_PAGED_ATTN_BWDDQACC", 1, "0 or 1 (1: the pipelined backward adds dQ into a tile-contiguous accumulator; 0: into dq's rows)")) >= 0) c.bwd_dqacc = d == 1;
    if (const char * e = getenv("OOMB_PAGED_ATTN_LISTSBWD"); e && *e) {
        char * end = nullptr;
        const long v = strtol(e, &end, 10);
        if (*end || v < 0 || v > 15)
            oomb_error("OOMB_PAGED_ATTN_LISTSBWD must be 0-15 (page lists, bit 0: backward blocks heaviest first, bit 1: history key "
                       "tiles unsplit, bit 2: row bits from query-tile masks, bit 3: no page mask for rows of one query tile), got '%s'", e);
        c.lists_bwd = (int) v;
    }
    c.lists_hist_fill = env_int("OOMB_PAGED_ATTN_LISTSFILL", c.lists_hist_fill);
    return c;
}

const oomb_paged_attn_config & oomb_cuda_paged_attn_config() {
    if (!g_cfg_set.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(g_cfg_mutex);
        if (!g_cfg_set.load(std::memory_order_relaxed)) {
            g_cfg = oomb_paged_attn_config_from_env();
            g_cfg_set.store(true, std::memory_order_release);
        }
    }
    return g_cfg;
}

void oomb_cuda_paged_attn_set_config(const oomb_paged_attn_config * c) {
    const oomb_paged_attn_config v = c ? *c : oomb_paged_attn_config_from_env();
    std::lock_guard<std::mutex> lock(g_cfg_mutex);
    g_cfg = v;
    g_cfg_set.store(true, std::memory_order_release);
}

const char * oomb_cuda_paged_attn_last_family(int backward) { return g_last_family[backward ? 1 : 0].load(std::memory_order_relaxed); }
int oomb_cuda_paged_attn_last_fwd_split() { return g_last_fwd_split.load(std::memory_order_relaxed); }

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

static void cache_copy(cudaStream_t stream, oomb_tensor * dst, const oomb_tensor * cache, const int32_t * pos, int64_t n_out,
                       int64_t n_lse, int64_t row, int to_cache) {
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
    const oomb_paged_attn_args A = oomb_paged_attn_args_of(dst);
    const Geom G = make_geom(A.q, A.k_pages, A.page_table, A.pos);
    check_common(G, A.k_pages, "paged_attn");
    record_fwd_split(1);  // unless the warp-specialised launch records its grid's shares
    if (G.T == 0) return;
    // dst is the packed node: out [T][H][D], then the natural-log LSE of row t*H + h
    if (oomb_nelements(dst) != (int64_t) G.D * G.H * G.T + (int64_t) G.H * G.T)
        oomb_error("paged_attn (cuda): %s is not the op's packed node (out and LSE, %lld elements)", oomb::shape_str(dst).c_str(),
                   (long long) G.D * G.H * G.T + (long long) G.H * G.T);
    float * out = (float *) dst->data;
    float * lse = out + (int64_t) G.D * G.H * G.T;
    const oomb_tensor * cache = A.out_cache;
    const int cache_mode = cache ? (A.load ? 2 : 1) : 0;  // oomb_paged_attn_cached: 1 save, 2 load
    const int64_t cache_row = cache_mode ? oomb_paged_attn_cache_row(G.D, G.H, cache->type) : 0;
    const int64_t n_out = (int64_t) G.D * G.H * G.T, n_lse = (int64_t) G.H * G.T;
    if (cache_mode == 2) {
        cache_copy(stream, dst, cache, G.pos, n_out, n_lse, cache_row, 0);
        return;
    }

    if (A.store) {
        const int64_t n = (int64_t) G.D * G.Hkv * G.T;
        const unsigned blocks = (unsigned) ((n + 255) / 256);
#define PA_STORE(KT)                                                                                                   \
    pa_store_kernel<KT><<<blocks, 256, 0, stream>>>((const char *) A.k_cur->data, (const char *) A.v_cur->data, A.k_cur->nb[0], A.k_cur->nb[1], \
                                                    A.k_cur->nb[2], (char *) A.k_pages->data, (char *) A.v_pages->data, A.k_pages->nb[0], A.k_pages->nb[1],  \
                                                    A.k_pages->nb[2], A.k_pages->nb[3], G.pt, G.pos, G.n_logical, G.n_pages, G.P, G.D,   \
                                                    G.Hkv, G.T)
        switch (A.k_pages->type) {
            case OOMB_TYPE_F32: PA_STORE(float); break;
            case OOMB_TYPE_F16: PA_STORE(__half); break;
            default: PA_STORE(bf16); break;
        }
#undef PA_STORE
        PA_LAUNCH_CHECK();
    }

    if (fast_family(A, nullptr)) {
        Geom K = G;
        const bool lists = fast_lists(A.schedule);
        const bool range = A.schedule.kind == OOMB_SCHEDULE_RANGE;
        PaLists L{};
        FwdArgs a = fwd_args(G, A.q, A.k_pages, A.v_pages, A.scale);
        // the warp-specialised forward's key split (dense and range schedules): its partial results
        const bool ws = !lists && fwd_wgmma(G.D, G.P, A.scale) && cfg().fwd_ws != 0;
        const bool wg3 = G.D == 64 && cfg().fwd_ws == 1 && fwd_wg3(a, G.Hkv);  // (three consumer warpgroups: no split)
        const int fsplit = ws && !wg3 ? fwd_kv_split((int64_t) G.T * G.G, 128, G.Hkv) : 1;
        // a share's partial output and LSEs; the stride padded to 64 floats: n_out + n_lse is odd where H T
        // is, and the epilogue's float2 stores need 8-byte alignment in every share
        const int64_t part_stride = (n_out + n_lse + 63) & ~(int64_t) 63;
        Carver cv{nullptr};
        if (range || fsplit > 1)
            cv.p = (char *) workspace(c, (range ? carve_size((size_t) G.T * sizeof(int32_t)) : 0) +
                                             (fsplit > 1 ? carve_size((size_t) (fsplit - 1) * part_stride * sizeof(float)) : 0));
        float * part = nullptr;
        if (fsplit > 1) {
            part = cv.take<float>((size_t) (fsplit - 1) * part_stride);
            // a share a block does not take (too few key tiles, or no kernel split at all: the fallback
            // kernels) merges as nothing: LSE -inf
            for (int z = 0; z < fsplit - 1; z++) {
                pa_fill_kernel<<<(unsigned) std::min<int64_t>((n_lse + 255) / 256, 1024), 256, 0, stream>>>(part + z * part_stride + n_out,
                                                                                                          n_lse, -INFINITY);
                PA_LAUNCH_CHECK();
            }
        }
        if (range) {
            K = range_geom(G, A.schedule, cv.take<int32_t>(G.T), stream);
            if (!A.accumulate) {  // accumulate: the rows a block skips keep their earlier result
                PA_CHECK(cudaMemsetAsync(out, 0, (size_t) n_out * sizeof(float), stream));
                pa_fill_kernel<<<(unsigned) std::min<int64_t>((n_lse + 255) / 256, 1024), 256, 0, stream>>>(lse, n_lse, -INFINITY);
                PA_LAUNCH_CHECK();
            }
        } else if (lists) {
            L = lists_view(A.schedule, G);
            Carver cl{(char *) workspace(c, lists_union_bytes(G, L))};
            lists_union(stream, cl, G, L);
        }
        a = fwd_args(K, A.q, A.k_pages, A.v_pages, A.scale);
        a.out = out;
        a.lse_out = lse;
        a.lists = L;
        a.acc = A.accumulate;
        a.part = part;
        a.part_stride = part_stride;
        a.fsplit = fsplit;
        a.fsplit_min = FWD_SPLIT_MIN_TILES;
        if (lists) fwd_fast<MODE_OUT, true>(stream, a, G.D, G.Hkv);
        else fwd_fast<MODE_OUT>(stream, a, G.D, G.Hkv);
        for (int z = 0; z < fsplit - 1; z++) {
            oomb_cuda_pa_merge_packed(stream, out, part + z * part_stride, G.D, n_lse);
            PA_LAUNCH_CHECK();
        }
        record_family(0, fwd_wgmma(G.D, G.P, A.scale) ? "wgmma" : "mma");
    } else {
        GenArgs a = gen_args(G, A.q, A.k_pages, A.v_pages, A.scale, A.schedule);
        a.out = out;
        a.lse = lse;
        a.acc = A.accumulate;
        fwd_generic<MODE_OUT>(stream, a, A.k_pages->type);
        record_family(0, "generic");
    }
    if (cache_mode == 1) cache_copy(stream, dst, cache, G.pos, n_out, n_lse, cache_row, 1);
}

void oomb_cuda_paged_attn_back(oomb_cuda_ctx & c, oomb_tensor * dst) {
    cudaStream_t stream = c.stream;
    const oomb_paged_attn_args A = oomb_paged_attn_args_of(dst);
    const Geom G = make_geom(A.q, A.k_pages, A.page_table, A.pos);
    check_common(G, A.k_pages, "paged_attn_back");
    if (G.T == 0) return;
    const bool grad_bf16 = A.dk_pages->type == OOMB_TYPE_BF16;
    const size_t ges = grad_bf16 ? 2 : 4;  // gradient-page element size: strides below count elements
    if (A.dk_pages->type != A.dv_pages->type || A.dk_pages->nb[0] != ges || A.dv_pages->nb[0] != ges)
        oomb_error("paged_attn_back (cuda): gradient pages must be contiguous, both f32 or both bf16");
    for (int i = 1; i < 4; i++)
        if (A.dk_pages->nb[i] != A.dv_pages->nb[i]) oomb_error("paged_attn_back (cuda): dk/dv gradient pages must have the same strides");
    // bf16 gradient pages: read, add in f32, stochastic rounding (GradSR); p_off set per geometry below
    GradSR gsr{grad_bf16 ? 1 : 0, grad_bf16 ? oomb_paged_attn_grad_seed(A.dk_pages) : 0u,
               grad_bf16 ? oomb_paged_attn_grad_seed(A.dv_pages) : 0u, G.pos, G.Hkv, 0};

    float * dq = (float *) dst->data;
    float * dkc = dq + (int64_t) G.D * G.H * G.T;
    float * dvc = dkc + (int64_t) G.D * G.Hkv * G.T;
    const int64_t n_keys_bound = (int64_t) G.n_logical * G.P;
    const float * saved_out = A.fwd ? (const float *) A.fwd->data : nullptr;
    const float * saved_lse = A.fwd ? saved_out + (int64_t) G.D * G.H * G.T : nullptr;
    // A block of a split backward (accumulate, or a window of the forward's schedule: oomb.h) must
    // read the forward's statistics of the whole rows: recomputed, they would be the block's own.
    const bool need_saved = A.accumulate || (A.fwd && oomb_paged_attn_args_of(A.fwd).schedule.kind != A.schedule.kind);
    if (need_saved && !saved_out)
        oomb_error("paged_attn_back (cuda): a block of a split backward (accumulate or a window of the forward's schedule) needs the "
                   "forward's saved statistics (fwd)");

    if (fast_family(A, A.dout)) {
        // saved statistics: the prep kernel reads out with 16-byte loads
        const bool saved = saved_out && aligned16(saved_out);
        if (need_saved && !saved)
            oomb_error("paged_attn_back (cuda): the forward's saved out is not 16-byte aligned, and a block of a split backward cannot "
                       "recompute the whole rows' statistics");
        const bool wg = bwd_wgmma(G.D);
        static_assert(BwdW<128>::BM == 64 && BwdW<64>::BM == 64, "pa_prep_kernel's swizzled q / dO tiles (swz) are of 64 rows");
        const bool lists = fast_lists(A.schedule);
        // the page-list kernels: 64 rows per step on both families (the defaults)
        const int BM = wg || lists ? BwdW<128>::BM : bwd_bm(G.D);
        const int BN = BWD_NW * 16;
        static_assert(BWD_NW * 16 == BwdW<128>::BN && BwdW<128>::BN == BwdW<64>::BN && BwdW<128>::BM == BwdW<64>::BM,
                      "the mma.sync and wgmma backward kernels share the key-tile grid and the row-tile metadata");
        const int TG = G.T * G.G;
        const int TGp = (TG + 127) / 128 * 128; // multiple of every row tile
        const int n_rt = TGp / BM;
        const size_t n_rows = (size_t) G.Hkv * TGp;
        const bool range = A.schedule.kind == OOMB_SCHEDULE_RANGE;
        const int n_key_tiles_all = (int) ((n_keys_bound + BN - 1) / BN);  // LISTS: no range, the kernels' keys are G's
        PaLists L = lists ? lists_view(A.schedule, G) : PaLists{};
        // dQ added into a tile-contiguous f32 accumulator (the pipelined wgmma backward, config.bwd_dqacc)
        const bool dqacc = wg && bwd_dq_acc();
        const size_t bytes = 2 * carve_size(n_rows * G.D * sizeof(bf16)) + 2 * carve_size(n_rows * sizeof(float)) +
                             (dqacc ? carve_size(n_rows * G.D * sizeof(float)) : 0) +
                             carve_size(TGp * sizeof(int)) + 2 * carve_size(n_rt * sizeof(int)) + carve_size(sizeof(int)) +
                             (range ? carve_size((size_t) G.T * sizeof(int32_t)) : 0) +
                             (lists ? lists_bits_bytes(n_key_tiles_all, n_rt) + (saved ? 0 : lists_union_bytes(G, L)) : 0);
        Carver cv{(char *) workspace(c, bytes)};
        bf16 * qb = cv.take<bf16>(n_rows * G.D);
        bf16 * dob = cv.take<bf16>(n_rows * G.D);
        float * lse = cv.take<float>(n_rows);
        float * delta = cv.take<float>(n_rows);
        int * rowpos = cv.take<int>(TGp);
        int * rt_max = cv.take<int>(n_rt);
        int * rt_min = cv.take<int>(n_rt);
        int * maxpos = cv.take<int>(1);
        float * dq_acc = dqacc ? cv.take<float>(n_rows * G.D) : nullptr;  // [Hkv][n_rt][BM x D]
        // the kernels' view of the keys (range_geom: a page range; else G itself)
        const Geom K = range ? range_geom(G, A.schedule, cv.take<int32_t>(G.T), stream) : G;
        const int64_t n_keys_k = (int64_t) K.n_logical * K.P;

        pa_meta_kernel<<<1, 1024, 0, stream>>>(K.pos, K.T, K.G, TGp, BM, rowpos, rt_max, rt_min, maxpos);
        PA_LAUNCH_CHECK();
        if (lists) {
            lists_bits(stream, cv, G, BM, BN, n_key_tiles_all, n_rt, L);
            if (!saved) lists_union(stream, cv, G, L);  // the forward's work lists, for the statistics pass
        }
        {
            const int64_t n = (int64_t) n_rows * (G.D / 8);
            const unsigned blocks = (unsigned) ((n + 255) / 256);
            const float * os = saved ? saved_out : nullptr;
            const float * ls = saved ? saved_lse : nullptr;
            if (G.D == 128)
                pa_prep_kernel<128><<<blocks, 256, 0, stream>>>((const float *) A.q->data, A.q->nb[1] / 4, A.q->nb[2] / 4, (const float *) A.dout->data,
                                                               A.dout->nb[1] / 4, A.dout->nb[2] / 4, G.T, G.H, G.G, G.Hkv, TGp, qb, dob, lse, delta,
                                                               os, ls, wg ? 1 : 0);
            else
                pa_prep_kernel<64><<<blocks, 256, 0, stream>>>((const float *) A.q->data, A.q->nb[1] / 4, A.q->nb[2] / 4, (const float *) A.dout->data,
                                                              A.dout->nb[1] / 4, A.dout->nb[2] / 4, G.T, G.H, G.G, G.Hkv, TGp, qb, dob, lse, delta,
                                                              os, ls, wg ? 1 : 0);
            PA_LAUNCH_CHECK();
        }
        // log-sum-exp and delta (forward recomputation), only without saved statistics
        if (!saved) {
            if (range) {  // rows of forward blocks that return early (no key in the range) keep these
                PA_CHECK(cudaMemsetAsync(lse, 0, n_rows * sizeof(float), stream));
                PA_CHECK(cudaMemsetAsync(delta, 0, n_rows * sizeof(float), stream));
            }
            FwdArgs a = fwd_args(K, A.q, A.k_pages, A.v_pages, A.scale);
            a.dout = (const float *) A.dout->data; a.do_s1 = A.dout->nb[1] / 4; a.do_s2 = A.dout->nb[2] / 4;
            a.lse = lse; a.delta = delta; a.lse_stride = TGp;
            a.lists = L;
            if (lists) fwd_fast<MODE_LSE, true>(stream, a, G.D, G.Hkv);
            else fwd_fast<MODE_LSE>(stream, a, G.D, G.Hkv);
        }
        const int n_key_tiles = (int) ((n_keys_k + BN - 1) / BN);
        // the kernels add dq with atomics: from zero, or (accumulate) onto the dq the node holds; or
        // into the accumulator (from zero), added to or written into dq after them (an empty page
        // range runs no kernel: dq zeroed or kept)
        const bool use_acc = dqacc && n_key_tiles > 0;
        if (use_acc) PA_CHECK(cudaMemsetAsync(dq_acc, 0, n_rows * G.D * sizeof(float), stream));
        else if (!A.accumulate) PA_CHECK(cudaMemsetAsync(dq, 0, (size_t) G.D * G.H * G.T * sizeof(float), stream));
        {
            BwdArgs a{};
            a.qb = qb; a.dob = dob; a.lse = lse; a.delta = delta; a.rowpos = rowpos;
            a.rt_max = rt_max; a.rt_min = rt_min; a.maxpos = maxpos; a.n_rt = n_rt;
            a.kp = (const bf16 *) A.k_pages->data; a.vp = (const bf16 *) A.v_pages->data;
            a.kv_s1 = A.k_pages->nb[1] / 2; a.kv_s2 = A.k_pages->nb[2] / 2; a.kv_s3 = A.k_pages->nb[3] / 2;
            a.dkp = (float *) A.dk_pages->data; a.dvp = (float *) A.dv_pages->data;
            a.gr_s1 = A.dk_pages->nb[1] / ges; a.gr_s2 = A.dk_pages->nb[2] / ges; a.gr_s3 = A.dk_pages->nb[3] / ges;
            a.gsr = gsr;
            if (range) a.gsr.p_off = std::min<int>(A.schedule.first, G.n_logical) * G.P;  // range_geom's key 0
            a.pt = K.pt; a.n_logical = K.n_logical; a.n_pages = K.n_pages; a.P = K.P;
            a.T = G.T; a.H = G.H; a.G = G.G; a.TGp = TGp;
            a.c = A.scale * kLog2e; a.scale = A.scale;
            a.dq = dq;
            a.dq_acc = use_acc ? dq_acc : nullptr;
            a.lists = L;
            // bf16 gradient pages: one block per key tile owns its rows (read-add-round, no atomics)
            a.nsplit = grad_bf16 ? 1 : bwd_split((int) ((G.T + BN - 1) / BN) * G.Hkv, n_rt, (int64_t) G.T * G.G, G.D);
            // page lists (bwd_block, config.lists_bwd): the current region's tiles first (bit 0); a history tile
            // unsplit once the history's tiles alone make two waves of blocks (bit 1, lists_hist_fill; off by
            // default: measured slower); the rows' page bits from per-block query-tile masks (bit 2)
            a.lists_order = lists && (cfg().lists_bwd & 1) ? 1 : 0;
            a.hist_fill = !(cfg().lists_bwd & 2) ? INT_MAX : cfg().lists_hist_fill >= 0 ? cfg().lists_hist_fill : 2 * sm_count();
            a.lists_qmask = (cfg().lists_bwd & 4) ? 1 : 0;
            if (n_key_tiles == 0) {
                // an empty page range: no key, no gradient
            } else if (lists) {
                if (wg) launch_bwd_wgmma_any<true>(stream, a, G.D, n_key_tiles, G.Hkv);
                else if (G.D == 64) launch_bwd<64, 64, 1, true>(stream, a, n_key_tiles, G.Hkv);
                else launch_bwd<128, 64, 1, true>(stream, a, n_key_tiles, G.Hkv);
            } else if (wg) {
                launch_bwd_wgmma_any<false>(stream, a, G.D, n_key_tiles, G.Hkv);
            } else if (G.D == 64) {
                const int v = cfg().bwd64;
                if (v == 1) launch_bwd<64, 32, 2>(stream, a, n_key_tiles, G.Hkv);
                else if (v == 2) launch_bwd<64, 32>(stream, a, n_key_tiles, G.Hkv);
                else launch_bwd<64, 64>(stream, a, n_key_tiles, G.Hkv);
            }
            else if (BM == 64) launch_bwd<128, 64>(stream, a, n_key_tiles, G.Hkv);
            else if (BM == 16) launch_bwd<128, 16>(stream, a, n_key_tiles, G.Hkv);
            else launch_bwd<128, 32>(stream, a, n_key_tiles, G.Hkv);
            record_family(1, wg ? "wgmma" : "mma");
        }
        if (use_acc) {
            const int64_t n_quads = (int64_t) n_rows * G.D / 4;
            const unsigned blocks = (unsigned) ((n_quads + 255) / 256);
            if (G.D == 128) pa_dq_acc_kernel<128><<<blocks, 256, 0, stream>>>((const float4 *) dq_acc, n_quads, n_rt, G.T, G.H, G.G, dq, A.accumulate ? 1 : 0);
            else pa_dq_acc_kernel<64><<<blocks, 256, 0, stream>>>((const float4 *) dq_acc, n_quads, n_rt, G.T, G.H, G.G, dq, A.accumulate ? 1 : 0);
            PA_LAUNCH_CHECK();
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
        GenArgs a = gen_args(G, A.q, A.k_pages, A.v_pages, A.scale, A.schedule);
        a.dout = (const float *) A.dout->data; a.do_s1 = A.dout->nb[1] / 4; a.do_s2 = A.dout->nb[2] / 4;
        a.lse = lse; a.delta = delta; a.maxpos = maxpos;
        a.dkp = (float *) A.dk_pages->data; a.dvp = (float *) A.dv_pages->data;
        a.gr_s1 = A.dk_pages->nb[1] / ges; a.gr_s2 = A.dk_pages->nb[2] / ges; a.gr_s3 = A.dk_pages->nb[3] / ges;
        a.gsr = gsr;  // absolute positions: p_off 0
        const int wpb = 4;
        const dim3 grid_r((unsigned) ((rows + wpb - 1) / wpb));
        // The saved statistics are used when the forward ran these generic kernels too (same f32
        // arithmetic; always under a schedule other than DENSE); a forward on the tensor cores
        // (bf16 q) would give an LSE slightly off the f32 scores computed here, so then they are
        // recomputed in f32.
        // (a block of a split backward: always the saved ones, whatever kernels the forward ran)
        if (saved_out && (need_saved || !fast_family(A, nullptr))) {
            a.lse = const_cast<float *>(saved_lse);  // read only
            pa_delta_generic<<<grid_r, wpb * 32, 0, stream>>>(a, saved_out);
            PA_LAUNCH_CHECK();
        } else {
            fwd_generic<MODE_LSE>(stream, a, A.k_pages->type);
        }
        a.out = dq;
        a.acc = A.accumulate;  // dq added to the node's
        // a window (RANGE / LISTS_RANGE): one item per key of its pages only
        const bool windowed = A.schedule.kind == OOMB_SCHEDULE_RANGE || A.schedule.kind == OOMB_SCHEDULE_LISTS_RANGE;
        const int64_t key0 = windowed ? std::min<int64_t>((int64_t) A.schedule.first * G.P, n_keys_bound) : 0;
        const int64_t key1 = windowed ? std::max<int64_t>(key0, std::min<int64_t>((int64_t) A.schedule.last * G.P, n_keys_bound)) : n_keys_bound;
        a.key0 = (int) key0;
        const int64_t items = (key1 - key0) * G.Hkv;
        const dim3 grid_k((unsigned) std::max<int64_t>(1, (items + wpb - 1) / wpb));  // an empty window: one idle block
        switch (A.k_pages->type) {
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
        record_family(1, "generic");
    }

    if (!A.accumulate) {  // accumulate: dk_cur / dv_cur were written by the earlier call (oomb.h)
        const int64_t n = (int64_t) G.D * G.Hkv * G.T;
        pa_readback_kernel<<<(unsigned) ((n + 255) / 256), 256, 0, stream>>>((const float *) A.dk_pages->data, (const float *) A.dv_pages->data,
                                                                            A.dk_pages->nb[1] / ges, A.dk_pages->nb[2] / ges, A.dk_pages->nb[3] / ges, G.pt, G.pos,
                                                                            G.n_logical, G.n_pages, G.P, G.D, G.Hkv, G.T, dkc, dvc, grad_bf16 ? 1 : 0);
        PA_LAUNCH_CHECK();
    }
}
