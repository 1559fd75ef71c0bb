// Fused linear + cross-entropy over vocabulary tiles (oomb_linear_cross_entropy / _back) on the CUDA
// backend: the [V, N] logits are never stored whole.
//
// Per tile of Vt rows of w (Vt = oomb_linear_cross_entropy_tile(V, N, op_params[1])):
//   - logits tile C [Vt, N] f32 (column n = token n's Vt logits) = cuBLAS bf16 GEMM with f32
//     accumulation of w's tile rows and x (converted to bf16 once per op, not per tile; w used in
//     place when it is bf16 with unit-stride rows, else its tile rows are converted to bf16);
//   - forward: one block per token merges the tile's max and sum of exp into the token's running
//     (max, sum) (online log-sum-exp) and picks the label's logit; at the end each row's loss and
//     log-sum-exp (written to the node's tail) and a fixed-order sum of the per-row losses;
//   - backward: the tile's logits again, dlogits = (exp(logit - lse) - onehot) * dloss[0] written
//     as bf16 (0 for ignored rows), then dx += w_tile dlogits (beta = 1 after the first tile) and
//     dw_tile = x dlogits^T, two bf16 GEMMs with f32 accumulation; each gradient only when asked
//     for (op_params[2]). Without an lse source the backward first runs the forward's tile pass.
// Scratch (slots from SLOT_K0): x in bf16 (E*N*2 bytes), the f32 tile (Vt*N*4), the bf16 dlogits
// tile (Vt*N*2, backward), w's bf16 tile rows when converted (E*Vt*2), O(N) per-row state.
// Labels out of range are recorded (ctx.d_err) and reported at the end of graph_compute.
#pragma once

#include "common.cuh"

// dst f32 [2 + N] = { sum over counted rows of lse - logit[label], count, lse[0..N) }.
void oomb_cuda_linear_ce(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                         const oomb_tensor * labels);
// dst f32 = [dx (E*N, when op_params[2] has OOMB_LCE_GRAD_X) ; dw (E*V, when it has OOMB_LCE_GRAD_W)].
// lse: f32 [N] contiguous (the forward's tail) or NULL (recomputed). acc_dw: NULL, or f32 [E, V] that dw
// is added into instead of being written to dst (fuse_accumulations, backend-cuda.cu; dst's dw part is
// then left unwritten).
void oomb_cuda_linear_ce_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                              const oomb_tensor * labels, const oomb_tensor * dloss, const oomb_tensor * lse, float * acc_dw);

// The forward and its backward in one pass (the backend's graph pass fuse_linear_ce, backend-cuda.cu,
// when a graph holds both): per block of R rows (oomb_cuda_linear_ce_fused_rows) the [V, R] f32
// logits of every class once (one GEMM), each row's max / sum of exp, lse and loss (written to the
// forward's node fwd, as oomb_cuda_linear_ce would), dlogits in bf16 in place of the logits, then
// dx_rows = w dlogits and dw (+)= x_rows dlogits^T. Three products per row instead of the separate
// ops' four (the backward's tiles recompute the logits), and the f32 logits written and read once
// instead of twice. dst of back and grads as for oomb_cuda_linear_ce_back; dloss: f32 [2] (dloss[0]).
// Needs w bf16 with unit-stride rows (oomb_cuda_linear_ce_fusable). dw sums its row blocks in f32
// (beta = 1 after the first block): equal to the separate ops to rounding.
// acc_dw as for oomb_cuda_linear_ce_back.
void oomb_cuda_linear_ce_fused(oomb_cuda_ctx & c, oomb_tensor * fwd, oomb_tensor * back, const oomb_tensor * w, const oomb_tensor * x,
                               const oomb_tensor * labels, const oomb_tensor * dloss, float * acc_dw);
bool oomb_cuda_linear_ce_fusable(const oomb_tensor * w);
// The scratch requests of one node, per slot of the linear_cross_entropy kernels (bytes[0..4]: x in bf16,
// the logits block, w's converted rows, dlogits, the row state), as its launch will make them: node a
// linear_cross_entropy or a linear_cross_entropy_back run apart, or (fused_fwd its forward) the backward of
// a fused pair. For oomb_backend_graph_scratch.
void oomb_cuda_linear_ce_scratch(const oomb_cuda_ctx & c, const oomb_tensor * node, const oomb_tensor * fused_fwd, size_t bytes[5]);
// The fused pass's default logits block: 1.25 GiB of f32 (oomb_backend_set_linear_cross_entropy_block raises it).
constexpr size_t k_lce_block_default = (size_t) 5 << 28;
// Rows per block of the fused pass for V classes and N rows: the most whose [V, rows] f32 logits
// fit block_bytes (0: k_lce_block_default, 1.25 GiB), or, with tile > 0 (a vocabulary tile set on the op
// or OOMB_LCE_TILE), the tiled path's [min(tile, V), N] (at least one row); OOMB_LCE_ROWS > 0 instead,
// for tests; at most N, then evened out over the blocks (7B: V 152,064 holds 2,206 rows in 1.25 GiB: a
// chunk of 2,048 in one block).
int64_t oomb_cuda_linear_ce_fused_rows(int64_t V, int64_t N, int64_t tile, size_t block_bytes);
