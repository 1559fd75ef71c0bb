// get_rows / get_rows_back (see get-rows.cuh).

#include "get-rows.cuh"

using oomb::shape_str;

namespace {

const int k_threads = 256;

// One block per id (r over ids' two dims), threads over the row.
template <typename T>
__global__ void k_get_rows(oomb_tv dst, oomb_tv a, oomb_tv ids, int64_t n_rows, oomb_cuda_err_rec * err, int node) {
    const int64_t r = blockIdx.x;
    const int64_t i = r % ids.ne[0], j = r / ids.ne[0];
    const int32_t id = *(const int32_t *) (ids.d + i * ids.nb[0] + j * ids.nb[1]);
    float * y = (float *) (dst.d + i * dst.nb[1] + j * dst.nb[2]);
    const int64_t ne0 = dst.ne[0];
    if (id < 0 || id >= n_rows) {
        if (threadIdx.x == 0) oomb_cuda_record_err(err, OOMB_CUDA_ERR_ID, node, r, id);
        for (int64_t k = threadIdx.x; k < ne0; k += blockDim.x) *(float *) ((char *) y + k * dst.nb[0]) = 0.0f;
        return;
    }
    const char * x = a.d + (int64_t) id * a.nb[1];
    for (int64_t k = threadIdx.x; k < ne0; k += blockDim.x) {
        *(float *) ((char *) y + k * dst.nb[0]) = oomb_to_f(*(const T *) (x + k * a.nb[0]));
    }
}

__global__ void k_get_rows_back(oomb_tv dst, oomb_tv dy, oomb_tv ids, oomb_cuda_err_rec * err, int node) {
    const int64_t r = blockIdx.x;
    const int64_t i = r % ids.ne[0], j = r / ids.ne[0];
    const int32_t id = *(const int32_t *) (ids.d + i * ids.nb[0] + j * ids.nb[1]);
    if (id < 0 || id >= dst.ne[1]) {
        if (threadIdx.x == 0) oomb_cuda_record_err(err, OOMB_CUDA_ERR_ID, node, r, id);
        return;
    }
    const char * g = dy.d + i * dy.nb[1] + j * dy.nb[2];
    char * d = dst.d + (int64_t) id * dst.nb[1];
    for (int64_t k = threadIdx.x; k < dst.ne[0]; k += blockDim.x) {
        atomicAdd((float *) (d + k * dst.nb[0]), *(const float *) (g + k * dy.nb[0]));
    }
}

__global__ void k_zero(oomb_tv dst, int64_t n) {
    for (int64_t k = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; k < n; k += (int64_t) gridDim.x * blockDim.x) {
        *(float *) (dst.d + oomb_flat_off<uint64_t>(dst, (uint64_t) k)) = 0.0f;
    }
}

int threads_for(int64_t ne0) {
    int t = 32;
    while (t < k_threads && t < ne0) t *= 2;
    return t;
}

} // namespace

void oomb_cuda_get_rows(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * ids) {
    if (a->type == OOMB_TYPE_I32) oomb_error("get_rows: a %s must be a float type", shape_str(a).c_str());
    if (ids->type != OOMB_TYPE_I32) oomb_error("get_rows: ids %s must be i32", shape_str(ids).c_str());
    if (dst->ne[0] != a->ne[0] || dst->ne[1] != ids->ne[0] || dst->ne[2] != ids->ne[1] ||
        oomb_nelements(dst) != a->ne[0] * oomb_nelements(ids)) {
        oomb_error("get_rows: result %s does not match a %s and ids %s", shape_str(dst).c_str(), shape_str(a).c_str(), shape_str(ids).c_str());
    }
    const int64_t n = oomb_nelements(ids);
    if (n == 0 || a->ne[0] == 0) return;
    if (n > 0x7fffffffll) oomb_error("get_rows: too many ids %s", shape_str(ids).c_str());
    const oomb_tv d = oomb_make_tv(dst), ta = oomb_make_tv(a), ti = oomb_make_tv(ids);
    const int th = threads_for(a->ne[0]);
    switch (a->type) {
        case OOMB_TYPE_F16: k_get_rows<__half><<<(unsigned) n, th, 0, c.stream>>>(d, ta, ti, a->ne[1], c.d_err, c.cur_node); break;
        case OOMB_TYPE_BF16: k_get_rows<__nv_bfloat16><<<(unsigned) n, th, 0, c.stream>>>(d, ta, ti, a->ne[1], c.d_err, c.cur_node); break;
        default: k_get_rows<float><<<(unsigned) n, th, 0, c.stream>>>(d, ta, ti, a->ne[1], c.d_err, c.cur_node); break;
    }
    OOMB_CUDA_LAUNCHED(c, "get_rows");
    c.check_err = true;
}

void oomb_cuda_get_rows_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * dy, const oomb_tensor * ids) {
    if (ids->type != OOMB_TYPE_I32) oomb_error("get_rows_back: ids %s must be i32", shape_str(ids).c_str());
    if (dy->ne[0] != dst->ne[0] || dy->ne[1] != ids->ne[0] || dy->ne[2] != ids->ne[1] || dy->ne[3] != 1) {
        oomb_error("get_rows_back: dy %s does not match ids %s and result %s", shape_str(dy).c_str(), shape_str(ids).c_str(), shape_str(dst).c_str());
    }
    const int64_t nd = oomb_nelements(dst);
    if (nd == 0) return;
    if (oomb_is_contiguous(dst)) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, oomb_nbytes(dst), c.stream));
    } else {
        k_zero<<<oomb_cuda_grid(nd, k_threads), k_threads, 0, c.stream>>>(oomb_make_tv(dst), nd);
        OOMB_CUDA_LAUNCHED(c, "get_rows_back (zero)");
    }
    const int64_t n = oomb_nelements(ids);
    if (n == 0) return;
    if (n > 0x7fffffffll) oomb_error("get_rows_back: too many ids %s", shape_str(ids).c_str());
    k_get_rows_back<<<(unsigned) n, threads_for(dst->ne[0]), 0, c.stream>>>(oomb_make_tv(dst), oomb_make_tv(dy), oomb_make_tv(ids),
                                                                            c.d_err, c.cur_node);
    OOMB_CUDA_LAUNCHED(c, "get_rows_back");
    c.check_err = true;
}
