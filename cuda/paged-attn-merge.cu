// Merge of two partial paged-attention results on the CUDA backend (OOMB_OP_PAGED_ATTN_MERGE,
// oomb_paged_attn_merge in oomb.h; CPU reference:
// compute_forward_paged_attn_merge in src/cpu/ops-attn.cpp).
// The weights of a row are the shared pa_merge_weights (src/oomb/paged-attn-merge.h). A block takes
// a run of whole rows (about 1024 elements); its threads walk the run's outs element by element
// (consecutive threads along d: coalesced), each reading its row's two LSEs, and only after a
// __syncthreads (every read of the run's LSEs done) write the merged LSEs: no thread reads an LSE
// another has already overwritten.

#include "common.cuh"
#include "paged-attn.cuh"
#include "../src/oomb/paged-attn-merge.h"

namespace {

const int k_threads = 256;

__global__ void k_paged_attn_merge(float * acc, const float * part, int64_t D, int64_t R, int64_t rows_per_block) {
    const int64_t n = D * R, r0 = blockIdx.x * rows_per_block, r1 = r0 + rows_per_block < R ? r0 + rows_per_block : R;
    for (int64_t i = r0 * D + threadIdx.x; i < r1 * D; i += blockDim.x) {
        const int64_t r = i / D;
        acc[i] = oomb::pa_merge_out(oomb::pa_merge_weights(acc[n + r], part[n + r]), acc[i], part[i]);
    }
    __syncthreads();
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc[n + r] = oomb::pa_merge_weights(acc[n + r], part[n + r]).L;
}

} // namespace

void oomb_cuda_pa_merge_packed(cudaStream_t stream, float * acc, const float * part, int64_t D, int64_t R) {
    if (R == 0) return;
    const int64_t rows_per_block = D >= 1024 ? 1 : 1024 / (D > 0 ? D : 1);
    const int64_t blocks = (R + rows_per_block - 1) / rows_per_block;
    if (blocks > INT32_MAX) oomb_error("paged_attn_merge: %lld rows are too many for one launch", (long long) R);
    k_paged_attn_merge<<<(unsigned) blocks, k_threads, 0, stream>>>(acc, part, D, R, rows_per_block);
}

void oomb_cuda_paged_attn_merge(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * acc, const oomb_tensor * part) {
    // operands: check_op_operands (src/op-checks.cpp): contiguous f32 of D*H*T + H*T, dst a view of acc
    const int64_t D = dst->op_params[oomb::PAM_PARAM_D];
    const int64_t R = (int64_t) dst->op_params[oomb::PAM_PARAM_H] * dst->op_params[oomb::PAM_PARAM_T];
    if (R == 0) return;
    oomb_cuda_pa_merge_packed(c.stream, (float *) acc->data, (const float *) part->data, D, R);
    OOMB_CUDA_LAUNCHED(c, "paged_attn_merge");
}
