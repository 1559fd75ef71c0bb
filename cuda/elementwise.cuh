// Element-wise, broadcasting and copy kernels of the CUDA backend (any strides).
#pragma once

#include "common.cuh"

// Copies src into dst element by element in logical order (same element count; shapes may differ),
// converting between f32 / f16 / bf16 (or copying i32 to i32). Any strides on both sides.
// No checks: callers validate the types (OOMB_OP_CONT / CPY / CAST: check_op_operands, src/op-checks.cpp).
void oomb_cuda_copy_tensor(oomb_cuda_ctx & c, const oomb_tensor * src, const oomb_tensor * dst);

// OOMB_OP_FILL: every element of dst = op_params[0].
void oomb_cuda_fill(oomb_cuda_ctx & c, oomb_tensor * dst);

// dst = f(a, b) for dst->op in add / sub / mul / add_inplace (b broadcast to a: b indexed with
// i % b->ne[i]), silu_back (a = x, b = dy), swiglu (a = gate, b = up).
void oomb_cuda_binary(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);
// dst = f(a) for dst->op in scale / silu.
void oomb_cuda_unary(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
// oomb_swiglu_back: [dgate; dup] in one pass (see oomb.h).
void oomb_cuda_swiglu_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u, const oomb_tensor * dy);

// OOMB_OP_REPEAT (dst has src[1]'s shape) / OOMB_OP_REPEAT_BACK (sum a down to dst's shape).
void oomb_cuda_repeat(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void oomb_cuda_repeat_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
