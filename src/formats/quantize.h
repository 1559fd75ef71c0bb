// f32 -> ggml block quantizers for writing GGUF files: Q5_0 and the K-quants Q4_K, Q5_K, Q6_K.
// Internal header of the formats library; callers reach them through gguf_convert (gguf.h), which
// also owns the Q8_0 path.
//
// Design: the blocks are ggml's layouts (ggml-common.h) and are read back by the dequantizers of
// gguf.cpp (bit-exact against gguf-py); the scale search is the simple, well-known scheme of
// ggml's reference quantizers, restated from the format description, without an importance
// matrix:
//   - Q4_K / Q5_K (affine, x ~ d*sc*q - dmin*m): per 32-element sub-block, a weighted least-squares
//     fit of (scale, min >= 0) over a small grid of candidate inverse scales (ggml's make_qkx2
//     search; weights |x| + rms(sub-block)); the 8 sub-block scales and mins are then quantized to
//     6 bits against the block's d = max scale / 63 and dmin = max min / 63 (f16), and q is
//     recomputed against the rounded scales.
//   - Q6_K (symmetric, x ~ d*sc*(q-32)): per 16-element sub-block, the sign-carrying maximum fixes
//     the scale, refined over 19 nearby inverse scales by a x^2-weighted least-squares fit (ggml's
//     make_qx search); the 16 scales are int8 against d = max|scale| / 128.
//   - Q5_0 (symmetric, 32 elements): d = (value of largest magnitude) / -16, q = trunc(x/d + 16.5)
//     clamped to 31, exactly as ggml's quantize_row_q5_0_ref and gguf-py (bit-exact); the fallback
//     llama.cpp uses for Q4_K on rows that are not whole 256-blocks.
// Rounding is round-half-to-even (ggml's nearest_int) except where stated.
#pragma once

#include "gguf.h"

#include <cstdint>
#include <string>

namespace oomb {

// True for the block types quantize_blocks writes: Q5_0, Q4_K, Q5_K, Q6_K.
bool quantize_type_supported(uint32_t type);

// Checks that the n values x[0..n) are finite. On the first NaN or infinity returns false and sets
// *err to "element <index_base + i> is NaN (or inf) ..., cannot quantize to <type>".
bool quantize_check_finite(const float* x, int64_t n, int64_t index_base, uint32_t type, std::string* err);

// Quantizes n f32 values (n a multiple of the type's block size: 32 for Q5_0, 256 for the
// K-quants; every value finite, see quantize_check_finite) into n / block blocks of `type` at dst
// (gguf_tensor_type_block_bytes(type) bytes each). Errors: GGUF_ERR_ARG for a type that
// quantize_type_supported rejects, for a bad n, or when a block's scale overflows f16 (a block
// spanning more than about 6e7 for Q4_K, 1.3e8 for Q5_K, 2.7e8 for Q6_K, |x| above 1e6 for Q5_0); *err names the element index (index_base + i).
gguf_status quantize_blocks(uint32_t type, const float* x, void* dst, int64_t n, int64_t index_base,
                            std::string* err);

} // namespace oomb
