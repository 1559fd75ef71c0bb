// The Llama GGUF layout (llama.cpp's "llama" architecture: Llama 2/3.x, SmolLM2, Mistral-style
// files): the configuration and its llama.* keys, the tensor list, the checks before allocation,
// and the one thing in which its files differ from HF's tensors, the row order of attn_q / attn_k.
//
// Design: Llama and Qwen2 are the same decoder to within the layout's tables, so this file adds no
// second key table or checker: the config is Qwen2Config with arch = DecoderArch::Llama, and the
// functions of qwen2-layout.h (tensor list, key reading and writing, checks) read the arch from it.
// Llama's blocks have no biases (q/k/v/o biases are optional in llama.cpp's layout and refused
// here, by name). rope_freqs.weight (Llama 3.x RoPE frequency factors, optional in llama.cpp's
// layout) is part of the layout when the file has it (Qwen2Config::rope_freqs).
//
// RoPE row order: llama.cpp's converter permutes the rows of HF's q_proj / k_proj per head,
//   w.reshape(n_head, 2, head_dim / 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)
// (n_head_kv heads for k_proj), because llama.cpp applies interleaved ("normal", GPT-J) RoPE to
// Llama, which rotates the pairs (2i, 2i+1) where HF's rotate_half rotates (i, i + head_dim / 2).
// This library un-permutes the rows on load (llama_unpermute_qk_rows) and applies its NEOX
// oomb_rope, exactly as HF does; saving permutes them back. So a model's weights and gradients are
// in HF's row order in memory, in llama.cpp's order in files.
#pragma once

#include "qwen2-layout.h"

#include <cstddef>
#include <cstdint>

namespace oomb {

/// general.architecture of a Llama file, and the prefix of its keys.
constexpr const char * LLAMA_ARCH = "llama";

/// A Llama model's configuration: the decoder configuration with arch = DecoderArch::Llama (no
/// biases). Keys: llama.block_count, llama.embedding_length, ..., llama.vocab_size,
/// llama.rope.dimension_count.
using LlamaConfig = Qwen2Config;

/// SmolLM2-135M's shape ("smollm2-135m": 30 layers, 576 hidden, 1536 ffn, 9/3 heads, head dim 64,
/// vocab 49152, tied, rope_theta 1e5, rms_eps 1e-5, context 8192). False for another name.
bool llama_preset(const std::string & name, LlamaConfig * cfg);

/// Reads and checks a Llama file's configuration (decoder_read_config with DecoderArch::Llama).
gguf_status llama_read_config(const GGUFReader & r, LlamaConfig * cfg, std::string * err);

/// The file row order of attn_q / attn_k (llama.cpp's permutation, see the top of this file) for a
/// [n_out = n_head * head_dim, row] matrix of `row_bytes` bytes per row (any element type),
/// in place: llama_permute_qk_rows maps HF's order to the file's, llama_unpermute_qk_rows back.
/// n_head: the heads of that matrix (n_head for attn_q, n_head_kv for attn_k). head_dim even.
void llama_permute_qk_rows(void * rows, int64_t n_head, int64_t head_dim, size_t row_bytes);
void llama_unpermute_qk_rows(void * rows, int64_t n_head, int64_t head_dim, size_t row_bytes);

/// Heads of the permuted matrix of a layout entry: n_head for attn_q, n_head_kv for attn_k, 0 for
/// every other tensor (and for every tensor of a Qwen2 config, whose files keep HF's order).
int64_t llama_qk_heads(const LlamaConfig & cfg, Qwen2Slot slot);

} // namespace oomb
