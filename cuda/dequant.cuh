// Dequantization of ggml's block types on the GPU (one kernel family): blocks of q8_0 .. q6_k to
// f32 or bf16, the layouts of src/formats/quants-blocks.h (the one truth, shared with the CPU).
// Device arithmetic: __fmul_rn / __fadd_rn / __fsub_rn (never contracted into an FMA), in the CPU
// functions' order, so the f32 values are the CPU's bit for bit; bf16 = round to nearest even of
// them (__float2bfloat16_rn, as oomb_fp32_to_bf16). Used by mul_mat's operand preparation (a
// quantized a dequantized into the LRU bf16 copy slots, never the whole base at once) and by
// cast / cpy of a block-type tensor.
#pragma once

#include "common.cuh"

/// Dequantizes `rows` rows of row-major blocks of `type` (each K elements, the rows `row_bytes`
/// apart from src, device memory) into dst, contiguous [rows x K] of dst_type (OOMB_TYPE_F32 or
/// OOMB_TYPE_BF16), on c's stream. No checks: K a multiple of the block size (the core's layout
/// rules), dst_type f32 / bf16 (callers).
void oomb_cuda_dequantize_rows(oomb_cuda_ctx & c, enum oomb_type type, const void * src, size_t row_bytes, int64_t rows, int64_t K,
                               void * dst, enum oomb_type dst_type);
