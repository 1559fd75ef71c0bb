// GPU dequantization of the block types (see dequant.cuh). One thread per block: it dequantizes
// the block into f32 registers / local memory with quants-blocks.h's functions and stores them.

#include "dequant.cuh"

#include <cstring>

namespace {

#define OOMB_QHD static __device__ __forceinline__
#define OOMB_QMUL(a, b) __fmul_rn((a), (b))
#define OOMB_QADD(a, b) __fadd_rn((a), (b))
#define OOMB_QSUB(a, b) __fsub_rn((a), (b))
#define OOMB_QF16(h) __half2float(__ushort_as_half(h))
#include "formats/quants-blocks.h"
#undef OOMB_QF16
#undef OOMB_QHD
#undef OOMB_QMUL
#undef OOMB_QADD
#undef OOMB_QSUB

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// block i of the grid: row i / nblk, block i % nblk of it
template <int BS, typename T>
__global__ void dequant_kernel(uint32_t gtype, const uint8_t * src, size_t row_bytes, size_t block_bytes, int64_t nblk, int64_t n_blocks,
                               int64_t K, T * dst) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const int64_t r = i / nblk, b = i % nblk;
    float y[BS];
    qb_dequant_block(gtype, src + (size_t) r * row_bytes + (size_t) b * block_bytes, y);
    T * d = dst + r * K + b * BS;
#pragma unroll 8
    for (int j = 0; j < BS; j++) d[j] = from_f32<T>(y[j]);
}

template <int BS, typename T>
void launch(oomb_cuda_ctx & c, uint32_t gtype, const void * src, size_t row_bytes, size_t block_bytes, int64_t rows, int64_t K, T * dst) {
    const int64_t nblk = K / BS, n = rows * nblk;
    if (n == 0) return;
    const int threads = 128;
    const int64_t grid = (n + threads - 1) / threads;
    if (grid > INT32_MAX) oomb_error("dequantize: %lld blocks exceed the launch range", (long long) n);
    dequant_kernel<BS, T><<<(unsigned) grid, threads, 0, c.stream>>>(gtype, (const uint8_t *) src, row_bytes, block_bytes, nblk, n, K, dst);
    CUDA_CHECK(cudaGetLastError());
}

} // namespace

void oomb_cuda_dequantize_rows(oomb_cuda_ctx & c, enum oomb_type type, const void * src, size_t row_bytes, int64_t rows, int64_t K,
                               void * dst, enum oomb_type dst_type) {
    const uint32_t gt = oomb_type_to_ggml(type);
    const size_t bb = oomb_type_size(type);
    const bool bf = dst_type == OOMB_TYPE_BF16;
    if (oomb_blck_size(type) == 32) {
        if (bf) launch<32>(c, gt, src, row_bytes, bb, rows, K, (__nv_bfloat16 *) dst);
        else launch<32>(c, gt, src, row_bytes, bb, rows, K, (float *) dst);
    } else {
        if (bf) launch<256>(c, gt, src, row_bytes, bb, rows, K, (__nv_bfloat16 *) dst);
        else launch<256>(c, gt, src, row_bytes, bb, rows, K, (float *) dst);
    }
}
