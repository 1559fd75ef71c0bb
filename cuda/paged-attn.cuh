// Paged flash attention on the CUDA backend (OOMB_OP_PAGED_ATTN / OOMB_OP_PAGED_ATTN_BACK, and the
// merge of partial results OOMB_OP_PAGED_ATTN_MERGE).
// The backend (backend-cuda.cu) dispatches these nodes here; semantics are those of
// oomb_paged_attn_ext / oomb_paged_attn_back_ext in oomb.h (CPU reference: src/cpu/paged-attn.cpp).
#pragma once

#include <cuda_runtime.h>

#include "oomb.h"

// Launchers: queue the kernels on c.stream; workspace from c's scratch (slot SLOT_PAGED).
struct oomb_cuda_ctx;
void oomb_cuda_paged_attn(oomb_cuda_ctx & c, oomb_tensor * dst);
void oomb_cuda_paged_attn_back(oomb_cuda_ctx & c, oomb_tensor * dst);
// The merge of two partial results (OOMB_OP_PAGED_ATTN_MERGE; cuda/paged-attn-merge.cu): acc and
// part as checked by check_op_operands, dst the view of acc.
void oomb_cuda_paged_attn_merge(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * acc, const oomb_tensor * part);
// The same merge on raw packed buffers (R = T*H rows of D floats, then R LSEs each): acc <- merge(acc,
// part), queued on stream (the forward's key split, paged-attn.cu, merges its partial results so).
void oomb_cuda_pa_merge_packed(cudaStream_t stream, float * acc, const float * part, int64_t D, int64_t R);
/// The context of a CUDA backend (oomb_backend_cuda_init), for code that calls the launchers
/// directly (kernel tests, benchmarks). Errors: a backend that is not a CUDA backend.
oomb_cuda_ctx & oomb_cuda_ctx_of(struct oomb_backend * backend);

/// Kernel choices of paged attention on CUDA. The defaults are the fastest measured (bench/NOTES.md);
/// every field but `generic` only matters on the fast path (bf16 pools, head dim 64 or 128).
/// Benchmark overrides from the environment (oomb_paged_attn_config_from_env, the one place that
/// reads them): OOMB_PAGED_ATTN_<NAME> for each field below.
struct oomb_paged_attn_config {
    bool generic = false;   // GENERIC (set, any value): the generic f32 kernels only
    int wgmma = 3;          // WGMMA 0-3: bit 0 the wgmma forward (page size a multiple of 128), bit 1 the wgmma backward
    int fwd = 2;            // FWD: mma.sync forward at head dim 128: 0: 4 warps x 32 rows, 32-key tiles; 1: 8 warps x
                            //   16 rows, 64-key tiles; 2: 4 warps x 32 rows, 64-key tiles
    int bwd = 1;            // BWD: mma.sync backward at head dim 128, rows per step 0: 32, 1: 64, 2: 16
    int fwd64 = 0;          // FWD64: mma.sync forward at head dim 64: 0: 4 warps x 32 rows (2 blocks/SM); 1: the
                            //   same at 3 blocks/SM; 2: 8 warps x 16 rows
    int bwd64 = 0;          // BWD64: mma.sync backward at head dim 64: 0: 64 rows, 1 block/SM; 1: 32 rows, 2 blocks/SM;
                            //   2: 32 rows, 1 block/SM
    int split = -1;         // SPLIT: blocks per key tile of the backward (clamped to [1, row tiles]); -1 automatic
    int fwd_split = -1;     // FWDSPLIT: key shares per row tile of the warp-specialised forward (1-4, clamped; each
                            //   share at least 8 key tiles, partial results merged after); -1 or 0 automatic: where
                            //   the row tiles alone leave the last wave of SMs mostly idle (fwd_kv_split)
    int occ64 = 1;          // OCC64 0-3: two CTAs per SM for the head-dim-64 wgmma kernels, bit 0 forward (the
                            //   two-warpgroup kernel, fwd_ws 0), bit 1 backward (pa_bwd_wgmma_kernel, bwd_pipe off)
    bool fwd_pipe = false;  // FWDPIPE 0/1: the head-dim-64 wgmma forward issuing the next tile's S before the softmax
    int fwd_ws = 1;         // FWDWS 0-3: the warp-specialised wgmma forward (paged-attn-ws.cuh: TMA producer, ping-pong
                            //   consumers) for every schedule; 1: K/V stages 3 (head dim 128) / 4 (64) with FA3's
                            //   intra-warpgroup overlap; 2: the same without it; 3: without, 2 / 2 stages; 0: the
                            //   two-warpgroup wgmma forward
    bool lists_range_fast = true;   // LISTS_RANGE_FAST 0/1: the LISTS_RANGE schedule (the offload's blocks of a sparse
                            //   history) on the tensor-core kernels (their LISTS variants); 0: the generic kernels
    bool bwd_pipe = true;   // BWDPIPE 0/1: the wgmma backward with the row tiles overlapped (paged-attn-wgmma.cuh,
                            //   pa_bwd_pipe_kernel: q / dO in three buffers, dS in two, one block barrier per row
                            //   tile, the next tile's softmax under dQ); 0: pa_bwd_wgmma_kernel, one row tile at a time
    int fwd_wg3 = 2;        // FWDWG3 0-2: head dim 64, fwd_ws 1, dense schedules: 1: three consumer warpgroups (192
                            //   rows per block, as FA3 at head dim 64), 0: two; 2: three where the blocks fill the SMs'
                            //   waves better (paged-attn.cu, fwd_wg3)
    bool bwd_kvr = true;    // BWDKVR 0/1: head dim 64, with bwd_pipe: K and V held in registers as the A operands of
                            //   S^T and dP^T (register-operand wgmma); 0: read from shared memory per row tile
    bool bwd_dqacc = true;  // BWDDQACC 0/1: with bwd_pipe: dQ added with 16-byte float atomics into an f32 accumulator in
                            //   the products' fragment order (whole lines per warp), then into dq by a small kernel;
                            //   0: float2 atomics into dq's rows from the warpgroups' registers. The accumulator is
                            //   workspace of dq's size (rows padded to 128 per KV head): 117 MB at 0.5B, one chunk of 32K
    int lists_bwd = 13;     // LISTSBWD 0-15: the page-list kernels (paged-attn-mma.cuh, paged-attn-lists.cuh): bit 0 the
                            //   backward's blocks heaviest first (the current region's key tiles; bwd_block), bit 1 a
                            //   history key tile unsplit where the history's tiles x KV heads reach lists_hist_fill, bit 2
                            //   the rows' page bits from query-tile masks built once per block (BwdListsTile::qmasks),
                            //   bit 3 no page mask (nor bits) for a tile of rows of one query tile, forward and backward
                            //   (FwdListsTiles::single, BwdListsTile::page_bits); 0: as before (the dense order and split,
                            //   a search per row and row tile, the mask on every history tile). Default 13: bit 1 measured
                            //   slower (H100, 7B layer at 128K, sparse 64: backward 198 ms at 0, 210 with bit 1 alone,
                            //   156 with bit 3 alone, 147 with 1 + 4 + 8; bench/NOTES.md)
    int lists_hist_fill = -1;  // LISTSFILL: that threshold in blocks; -1: two waves (2 x the SM count)
};
/// The defaults overridden by the OOMB_PAGED_ATTN_* variables that are set (GENERIC: set at all;
/// WGMMA, OCC64: one digit 0-3; FWDWS: 0-3; FWDWG3: 0-2; FWDPIPE, BWDPIPE, BWDKVR, BWDDQACC, LISTS_RANGE_FAST: 0 or 1; LISTSBWD: 0-15; else an error naming the variable; FWD, BWD,
/// FWD64, BWD64, SPLIT, FWDSPLIT, LISTSFILL: an integer, as atoi).
oomb_paged_attn_config oomb_paged_attn_config_from_env();
/// The configuration the kernels use: oomb_paged_attn_config_from_env() read at the first call,
/// unless set. set_config(NULL): read the environment again now (an error there is reported now).
const oomb_paged_attn_config & oomb_cuda_paged_attn_config();
void oomb_cuda_paged_attn_set_config(const oomb_paged_attn_config * cfg);

/// Whether the Hopper wgmma kernels run the forward (backward = 0) or the backward (1) of paged
/// attention with bf16 pools of this head dim and page size on the current device: an sm_90a build
/// on a compute capability 9.0 GPU, head dim 64 or 128 (the forward: a page size multiple of 128),
/// not turned off by the configuration (wgmma bits). A forward call also needs a positive scale (the
/// wgmma softmax takes the row max over the raw products); one with a zero, negative or NaN scale runs
/// the mma.sync kernels.
bool oomb_cuda_paged_attn_uses_wgmma(int head_dim, int page_size, int backward);

/// The kernel family that ran the last forward (backward = 0) or backward (1) of this process
/// (the dispatcher records its choice): "wgmma", "mma" or "generic"; "" before any call.
const char * oomb_cuda_paged_attn_last_family(int backward);

/// The key shares per row tile launched (grid z) by this process's last paged_attn forward (the
/// output op, not the backward's recompute): 2-4 where the warp-specialised kernel split its keys
/// (fwd_kv_split, or config.fwd_split forced), 1 otherwise (unsplit, another kernel, an attention-cache
/// load, no rows); 0 before any call. A block with fewer than shares x 8 key tiles still leaves all its
/// keys to one share, so this counts the shares launched, not the ones that got keys. For tests.
int oomb_cuda_paged_attn_last_fwd_split();
