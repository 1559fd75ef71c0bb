// Reductions (see reduce.cuh).

#include "reduce.cuh"

using oomb::shape_str;

namespace {

const int k_threads = 256;
const int k_max_blocks = 1024;

template <typename I, bool CONTIG, bool SQ>
__global__ void k_sum_part(oomb_tv a, int64_t n, double * part) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        double v;
        if constexpr (CONTIG) v = ((const float *) a.d)[k];
        else v = *(const float *) (a.d + oomb_flat_off<I>(a, (I) k));
        s += SQ ? v * v : v;
    }
    s = oomb_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_final(const double * part, int64_t n, double mul, float * out) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += part[k];
    s = oomb_block_sum(s, sh);
    if (threadIdx.x == 0) *out = (float) (s * mul);
}

template <bool SQ>
void launch_part(oomb_cuda_ctx & c, const oomb_tensor * a, int64_t n, unsigned grid, double * part) {
    const oomb_tv ta = oomb_make_tv(a);
    if (oomb_is_contiguous(a)) k_sum_part<uint64_t, true, SQ><<<grid, k_threads, 0, c.stream>>>(ta, n, part);
    else if (oomb_fits_u32(a)) k_sum_part<uint32_t, false, SQ><<<grid, k_threads, 0, c.stream>>>(ta, n, part);
    else k_sum_part<uint64_t, false, SQ><<<grid, k_threads, 0, c.stream>>>(ta, n, part);
    OOMB_CUDA_LAUNCHED(c, "sum (partials)");
}

} // namespace

void oomb_cuda_sum_partials(oomb_cuda_ctx & c, const double * part, int64_t n, double mul, float * out) {
    k_sum_final<<<1, 1024, 0, c.stream>>>(part, n, mul, out);
    OOMB_CUDA_LAUNCHED(c, "sum (final)");
}

void oomb_cuda_sum(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    if (oomb_nelements(dst) != 1) oomb_error("%s: result %s must have one element", oomb_op_name(dst->op), shape_str(dst).c_str());
    const int64_t n = oomb_nelements(a);
    const unsigned grid = oomb_cuda_grid(n, k_threads * 4, k_max_blocks);
    double * part = (double *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) grid * sizeof(double));
    if (dst->op == OOMB_OP_SUM_SQ) launch_part<true>(c, a, n, grid, part);
    else launch_part<false>(c, a, n, grid, part);
    const double mul = dst->op == OOMB_OP_MEAN ? (n > 0 ? 1.0 / (double) n : NAN) : 1.0;
    oomb_cuda_sum_partials(c, part, grid, mul, (float *) dst->data);
}
