// Cross-entropy (see cross-entropy.cuh).

#include "cross-entropy.cuh"
#include "norm.cuh"
#include "reduce.cuh"

using oomb::shape_str;

namespace {

__device__ __forceinline__ int32_t label_of(const oomb_tv & labels, int64_t r) {
    return *(const int32_t *) (labels.d + oomb_flat_off<uint64_t>(labels, (uint64_t) r));
}

// part[r] = loss of row r (0 when ignored or invalid), cnt[r] = 1 when counted.
__global__ void k_ce(oomb_tv x_, oomb_tv labels, int32_t ignore, double * part, double * cnt, oomb_cuda_err_rec * err, int node) {
    __shared__ float sh[32];
    __shared__ double shd[32];
    const int64_t r = blockIdx.x;
    const int64_t V = x_.ne[0];
    const int32_t lab = label_of(labels, r);
    if (lab == ignore) {
        if (threadIdx.x == 0) { part[r] = 0.0; cnt[r] = 0.0; }
        return;
    }
    if (lab < 0 || lab >= V) {
        if (threadIdx.x == 0) {
            oomb_cuda_record_err(err, OOMB_CUDA_ERR_LABEL, node, r, lab);
            part[r] = 0.0;
            cnt[r] = 1.0;
        }
        return;
    }
    const float * x = (const float *) (x_.d + oomb_row_off(x_, r));
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = oomb_block_max(mx, sh);
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += (double) expf(x[i] - mx);
    s = oomb_block_sum(s, shd);
    if (threadIdx.x == 0) {
        part[r] = (double) mx + log(s) - (double) x[lab];
        cnt[r] = 1.0;
    }
}

__global__ void k_ce_back(oomb_tv dst, oomb_tv x_, oomb_tv labels, const float * dloss, int32_t ignore, oomb_cuda_err_rec * err, int node) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x;
    const int64_t V = x_.ne[0];
    const int32_t lab = label_of(labels, r);
    const float * x = (const float *) (x_.d + oomb_row_off(x_, r));
    float * y = (float *) (dst.d + oomb_row_off(dst, r));
    const bool bad = lab != ignore && (lab < 0 || lab >= V);
    if (bad && threadIdx.x == 0) oomb_cuda_record_err(err, OOMB_CUDA_ERR_LABEL, node, r, lab);
    if (lab == ignore || bad) {
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) y[i] = 0.0f;
        return;
    }
    const float gs = *dloss;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = oomb_block_max(mx, sh);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) s += expf(x[i] - mx);
    s = oomb_block_sum(s, sh);
    const float f = (float) ((double) gs / (double) s);
    // in place (y == x) is safe: each element is read and written by the same thread
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(x[i] - mx) * f;
        if (i == lab) e -= gs;
        y[i] = e;
    }
}

void check_labels(const char * op, const oomb_tensor * logits, const oomb_tensor * labels) {
    if (labels->type != OOMB_TYPE_I32 || oomb_nelements(labels) != oomb_nrows(logits)) {
        oomb_error("%s: labels %s must be i32 with one entry per row of logits %s", op, shape_str(labels).c_str(), shape_str(logits).c_str());
    }
    if (oomb_nrows(logits) > 0x7fffffffll) oomb_error("%s: too many rows in %s", op, shape_str(logits).c_str());
}

} // namespace

void oomb_cuda_cross_entropy(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels) {
    check_labels("cross_entropy_loss", logits, labels);
    if (oomb_nelements(dst) != 2 || !oomb_is_contiguous(dst)) {
        oomb_error("cross_entropy_loss: result %s must have 2 contiguous elements", shape_str(dst).c_str());
    }
    const int64_t nr = oomb_nrows(logits);
    if (nr == 0) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, 2 * sizeof(float), c.stream));
        return;
    }
    double * part = (double *) c.scratch(oomb_cuda_ctx::SLOT_K0, (size_t) nr * 2 * sizeof(double));
    double * cnt = part + nr;
    if (logits->ne[0] == 0) oomb_error("cross_entropy_loss: logits %s have no classes", shape_str(logits).c_str());
    k_ce<<<(unsigned) nr, oomb_cuda_row_threads(logits->ne[0]), 0, c.stream>>>(oomb_make_tv(logits), oomb_make_tv(labels),
                                                                              dst->op_params[0], part, cnt, c.d_err, c.cur_node);
    OOMB_CUDA_LAUNCHED(c, "cross_entropy_loss");
    c.check_err = true;
    float * out = (float *) dst->data;
    oomb_cuda_sum_partials(c, part, nr, 1.0, out);
    oomb_cuda_sum_partials(c, cnt, nr, 1.0, out + 1);
}

void oomb_cuda_cross_entropy_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels,
                                  const oomb_tensor * dloss) {
    if (!oomb_are_same_shape(dst, logits)) {
        oomb_error("cross_entropy_loss_back: shapes differ: %s vs %s", shape_str(dst).c_str(), shape_str(logits).c_str());
    }
    check_labels("cross_entropy_loss_back", logits, labels);
    if (dloss->type != OOMB_TYPE_F32 || oomb_nelements(dloss) < 1) {
        oomb_error("cross_entropy_loss_back: dloss %s must be f32 [2]", shape_str(dloss).c_str());
    }
    const int64_t nr = oomb_nrows(logits);
    if (nr == 0 || logits->ne[0] == 0) return;
    k_ce_back<<<(unsigned) nr, oomb_cuda_row_threads(logits->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(logits),
                                                                                   oomb_make_tv(labels), (const float *) dloss->data,
                                                                                   dst->op_params[0], c.d_err, c.cur_node);
    OOMB_CUDA_LAUNCHED(c, "cross_entropy_loss_back");
    c.check_err = true;
}
