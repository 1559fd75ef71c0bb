// RMSNorm forward / backward on the CUDA backend, plain and weighted (rms_norm_mul): a warp per row
// (rows of float4s) or a block per row (rows need unit stride in dim 0; the dispatcher prepares them).
#pragma once

#include "common.cuh"

// y = x / sqrt(mean(x^2) + eps).
void oomb_cuda_rms_norm(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
// dx = s*dy - s^3/n * x * sum(x*dy), s = 1/sqrt(mean(x^2) + eps).
void oomb_cuda_rms_norm_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy);

// y = f32(x * s) * w stored as dst's type (f32 or bf16): oomb_rms_norm_mul_ext.
void oomb_cuda_rms_norm_mul(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * w);
// dx = rms_norm_back(x, f32(dy * w)), and with dst->op_params[1] dw in the packed result's last row
// (dw[j] = sum_r f32(dy[r][j] * f32(x[r][j] * s_r)), in double): oomb_rms_norm_mul_back.
// acc_dx (optional): f32 memory of x's shape, contiguous, that receives acc_dx += dx instead of dx being
// written to dst (dw, when packed, still goes to dst): backend-cuda.cu, fuse_accumulations.
void oomb_cuda_rms_norm_mul_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * w, const oomb_tensor * dy,
                                 float * acc_dx = nullptr);

// Threads per block for a row of ne0 elements (a power of two in [32, 1024]).
int oomb_cuda_row_threads(int64_t ne0, int max_threads = 512);
