// Matrix product (oomb_mul_mat) on the CUDA backend through cuBLAS: bf16 operands, f32
// accumulation (CUBLAS_COMPUTE_32F), f32 result.
//
// a [K, M, A2, A3] (f32, f16 or bf16), b [K, N, B2, B3] f32, dst [M, N, B2, B3] f32 contiguous with
// dst[n][m] = sum_k a[m][k] b[n][k]. In cuBLAS's column-major terms, dst is the M x N matrix
// C = op(A) * B with B the K x N matrix of b's rows and A the K x M matrix of a's rows (op = T), or,
// for a transposed view of a (unit stride in dim 1), the M x K matrix with op = N.
//   - b is converted to a contiguous bf16 copy in scratch (any strides).
//   - a is used in place when it is bf16 with unit stride in dim 0 or dim 1; otherwise (f32, f16,
//     other strides) it is converted to a contiguous bf16 copy in scratch.
//   - Batches: b's batch (i2, i3) uses a's batch (i2 / (B2/A2), i3 / (B3/A3)). The B2/A2 batches of
//     b that share one a batch are consecutive in the contiguous copy, so they form one product with
//     N * (B2/A2) columns; the A2 batches of one i3 are one strided batched call.
#pragma once

#include "common.cuh"

// acc (optional): f32 memory of dst's shape, contiguous, that receives acc += the product instead
// of dst = the product (cuBLAS beta = 1; dst's own memory is not written): the CUDA backend's fused
// accumulation of a product that only an add_inplace reads (backend-cuda.cu, fuse_accumulations).
// epi (optional, f32 dst, one GEMM, no acc): the product is written to epi->add's bytes (f32, dst's shape,
// contiguous) plus epi->c (f32 of dst's shape) or plus epi->bias (f32 [dst->ne[0]], broadcast over the
// columns), through cuBLASLt (C apart from D; its bias epilogue), and dst's own memory is not written
// (backend-cuda.cu, fuse_epilogues). Returns false when epi was given but not applied (cuBLASLt has no
// algorithm for the shape, alignments or epilogue, or the product is batched): dst then holds the product
// as without epi. Returns true otherwise.
bool oomb_cuda_mul_mat(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b, float * acc = nullptr,
                       const oomb_cuda_ctx::epilogue * epi = nullptr);
