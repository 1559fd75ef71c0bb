// Dequantization of ggml's block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K): the one
// truth for their layouts, shared by the GGUF reader (gguf.cpp), the core's CPU kernels
// (src/cpu/ops-matmul.cpp, copies) and, through quants-blocks.h, the CUDA kernels (cuda/dequant.cu).
// Part of the format library (no oomb.h): types are the GGUF / ggml type ids (gguf_tensor_type).
// Results are bit-exact against gguf-py's gguf.quants.dequantize (tests/test-gguf-quants.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace oomb {

/// true for the block types above (ggml type ids 2, 3, 6, 7, 8, 10..14).
bool quant_type_supported(uint32_t ggml_type);
/// Elements per block (32 or 256) of a supported block type, else 0.
int64_t quant_block_size(uint32_t ggml_type);
/// Bytes per block of a supported block type, else 0.
size_t quant_block_bytes(uint32_t ggml_type);
/// Dequantizes n_blocks consecutive blocks of `ggml_type` at src into n_blocks * block_size f32
/// values at dst. The type must be supported (checked by the callers; otherwise nothing is written).
void dequantize_blocks(uint32_t ggml_type, const void * src, float * dst, int64_t n_blocks);

/// true for the block types quant_random_blocks writes: Q8_0, Q5_0, Q4_K, Q5_K, Q6_K (ids 8, 6, 12, 13, 14).
bool quant_random_supported(uint32_t ggml_type);
/// Random weights made directly as blocks (no quantizer: a 7B model in seconds), for models made
/// in memory (oomb-train --preset NAME --base-type q4_k_m): the quant bits of n_blocks blocks at dst
/// are uniform random bits from the stream `seed` (src/init-normal.h's xoshiro256+), the scale
/// fields are fixed, chosen so that the dequantized values have mean 0 and an RMS of about 0.02,
/// like the normal(0, 0.02) f32 init (the choice per type in quants.cpp). Deterministic in (seed,
/// n_blocks). An even n_blocks keeps the sign alternation of Q8_0 / Q5_0 in step between calls.
/// Returns false (nothing written) for a type quant_random_supported rejects.
bool quant_random_blocks(uint32_t ggml_type, uint64_t seed, void * dst, int64_t n_blocks);
/// The RMS of the values quant_random_blocks makes, in expectation (0 for an unsupported type).
double quant_random_rms(uint32_t ggml_type);

} // namespace oomb
