// Helpers shared by the gguf-tools: reading an HF config.json into a Qwen2Config (the layout itself,
// keys, tensor names and shapes, is models/qwen2-layout.h), the conversion of a Hugging Face
// tokenizer (tokenizer.json + tokenizer_config.json) into tokenizer.ggml.* metadata, and copying a
// tokenizer from one GGUF file into another.
#pragma once

#include "gguf.h"
#include "qwen2-layout.h"
#include "rope-scaling.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace tools {

// llama.cpp's general.file_type for an output type (F32 -> 0, F16 -> 1, BF16 -> 32).
uint32_t llama_file_type(uint32_t ggml_type);

// Reads config.json of an HF Qwen2 or Llama checkpoint (transformers 4 or 5 style; model_type picks
// the arch) into a configuration checked by qwen2_config_valid (n_vocab = vocab_size, head_dim =
// hidden_size / heads, or Llama's head_dim). Llama with biases is an error; so is scaled RoPE,
// except Llama's rope_type "llama3" (rope_scaling or rope_parameters: hf_llama3_rope_scaling),
// which sets c->rope_freqs and *rope_freqs to the factors of rope_freqs.weight (f32
// [head_dim / 2], llama3_rope_freq_factors of head_dim and rope_theta, 10000 when absent, as
// llama.cpp's converter computes them); *rope_freqs is emptied otherwise.
// *has_rope_theta: whether the file gives rope_theta (else qwen2.rope.freq_base is not written).
// *tie_given (may be null): whether the file gives tie_word_embeddings (c->tied is its value, false
// when absent).
bool read_hf_config(const std::string& path, Qwen2Config* c, bool* has_rope_theta, std::string* name_or_path,
                    std::vector<float>* rope_freqs, std::string* err, bool* tie_given = nullptr);

// Converts the HF tokenizer in `dir` (tokenizer.json, tokenizer_config.json and, if present,
// config.json) into tokenizer.ggml.* keys following llama.cpp's convert_hf_to_gguf.py for
// gpt2-style BPE: tokens padded to `n_rows` (0: the tokenizer's own size) with [PAD<id>] UNUSED
// entries, added tokens CONTROL (special or <|...|>) or USER_DEFINED, merges, special token ids,
// add_*_token flags and the chat template. Returns the number of tokens written.
bool write_hf_tokenizer(const std::string& dir, int64_t n_rows, GGUFWriter& w, int64_t* n_tokens,
                        std::string* err);

// Copies the tokenizer.* keys of `src` into `w`, padding tokens/token_type to `n_rows` (0: keep)
// with [PAD<id>] UNUSED entries. Error if the tokenizer holds more tokens than `n_rows`.
bool copy_tokenizer(const GGUFReader& src, int64_t n_rows, GGUFWriter& w, std::string* err);

// True if `s` is a directory / a regular file.
bool is_dir(const std::string& s);
bool is_file(const std::string& s);

} // namespace tools
} // namespace oomb
