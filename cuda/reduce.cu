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

// Sum of squares of up to OOMB_MAX_SRC contiguous f32 arrays in one launch: blocks [b0[k], b0[k + 1]) take
// array k (grid-stride over it), each writing its partial to part[blockIdx.x].
struct sq_list {
    const float * p[OOMB_MAX_SRC];
    int64_t n[OOMB_MAX_SRC];
    unsigned b0[OOMB_MAX_SRC + 1];
    int count;
};
__global__ void k_sum_sq_list(const sq_list l, double * part) {
    __shared__ double sh[32];
    int k = 0;
    while (k + 1 < l.count && blockIdx.x >= l.b0[k + 1]) k++;
    const unsigned nb = l.b0[k + 1] - l.b0[k], b = blockIdx.x - l.b0[k];
    const float * x = l.p[k];
    double s = 0.0;
    for (int64_t i = b * (int64_t) blockDim.x + threadIdx.x; i < l.n[k]; i += (int64_t) nb * blockDim.x) {
        const double v = x[i];
        s += v * v;
    }
    s = oomb_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
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

void oomb_cuda_sum(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * const * s) {
    if (oomb_nelements(dst) != 1) oomb_error("%s: result %s must have one element", oomb_op_name(dst->op), shape_str(dst).c_str());
    const oomb_tensor * a = s[0];
    int n_src = 1;
    if (dst->op == OOMB_OP_SUM_SQ) {
        n_src = 0;
        for (int k = 0; k < OOMB_MAX_SRC; k++) {
            if (!s[k]) continue;
            if (s[k]->type != OOMB_TYPE_F32) oomb_error("sum_sq: source %d %s must be f32", k, shape_str(s[k]).c_str());
            n_src++;
        }
    }
    if (n_src > 1) {
        // every source's partials side by side, then one sum over them all (in source order)
        sq_list l{};
        bool contig = true;
        unsigned blocks = 0;
        std::vector<unsigned> grids;
        for (int k = 0; k < OOMB_MAX_SRC; k++) {
            if (!s[k]) continue;
            const int64_t nk = oomb_nelements(s[k]);
            const unsigned gk = oomb_cuda_grid(nk, k_threads * 4, k_max_blocks);
            contig = contig && oomb_is_contiguous(s[k]);
            l.p[l.count] = (const float *) s[k]->data;
            l.n[l.count] = nk;
            l.b0[l.count] = blocks;
            l.count++;
            grids.push_back(gk);
            blocks += gk;
        }
        l.b0[l.count] = blocks;
        double * part = (double *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) blocks * sizeof(double));
        if (contig) {
            k_sum_sq_list<<<blocks, k_threads, 0, c.stream>>>(l, part);
            OOMB_CUDA_LAUNCHED(c, "sum_sq (list)");
        } else {
            for (int k = 0, j = 0; k < OOMB_MAX_SRC; k++) {
                if (!s[k]) continue;
                launch_part<true>(c, s[k], oomb_nelements(s[k]), grids[j], part + l.b0[j]);
                j++;
            }
        }
        oomb_cuda_sum_partials(c, part, blocks, 1.0, (float *) dst->data);
        return;
    }
    const int64_t n = oomb_nelements(a);
    const unsigned grid = oomb_cuda_grid(n, k_threads * 4, k_max_blocks);
    double * part = (double *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) grid * sizeof(double));
    if (dst->op == OOMB_OP_SUM_SQ) launch_part<true>(c, a, n, grid, part);
    else launch_part<false>(c, a, n, grid, part);
    const double mul = dst->op == OOMB_OP_MEAN ? (n > 0 ? 1.0 / (double) n : NAN) : 1.0;
    oomb_cuda_sum_partials(c, part, grid, mul, (float *) dst->data);
}
