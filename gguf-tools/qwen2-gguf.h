// Helpers shared by the gguf-tools: llama.cpp's Qwen2 layout (keys, tensor names, shapes), the
// conversion of a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) into
// tokenizer.ggml.* metadata, and copying a tokenizer from one GGUF file into another.
#pragma once

#include "gguf.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace tools {

// Qwen2 model dimensions (the fields of HF's Qwen2Config that llama.cpp keeps).
struct Qwen2Dims {
    int64_t n_vocab = 0;     // embedding rows (vocab_size)
    int64_t n_embd = 0;      // hidden_size
    int64_t n_ff = 0;        // intermediate_size
    int64_t n_layer = 0;     // num_hidden_layers
    int64_t n_head = 0;      // num_attention_heads
    int64_t n_head_kv = 0;   // num_key_value_heads
    int64_t n_ctx = 32768;   // max_position_embeddings
    double rope_theta = 1e6; // rope_theta (transformers 4) / rope_parameters.rope_theta (5)
    bool has_rope_theta = true;
    double rms_eps = 1e-6;   // rms_norm_eps
    bool tied = false;       // tie_word_embeddings: no output.weight

    // Checks the dimensions are positive and consistent (heads divide the hidden size, ...).
    bool valid(std::string* err) const;
};

// One tensor of the llama.cpp Qwen2 layout.
struct Qwen2Tensor {
    std::string gguf_name;      // e.g. blk.0.attn_q.weight
    std::string hf_name;        // e.g. model.layers.0.self_attn.q_proj.weight
    std::vector<int64_t> ne;    // ggml order (ne[0] = in_features for Linear weights)
    bool is_1d() const { return ne.size() == 1; }
};

// Every tensor of a Qwen2 model, in the order the tools write them.
std::vector<Qwen2Tensor> qwen2_tensors(const Qwen2Dims& d);

// Maps an HF Qwen2ForCausalLM parameter name to its llama.cpp name; empty when it has none.
std::string qwen2_gguf_name(const std::string& hf_name);

// Writes general.architecture = qwen2 and the qwen2.* hyperparameter keys as llama.cpp does.
void write_qwen2_hparams(GGUFWriter& w, const Qwen2Dims& d);

// llama.cpp's general.file_type for an output type (F32 -> 0, F16 -> 1, BF16 -> 32).
uint32_t llama_file_type(uint32_t ggml_type);

// Reads config.json of an HF Qwen2 checkpoint (transformers 4 or 5 style).
bool read_hf_config(const std::string& path, Qwen2Dims* d, std::string* name_or_path, std::string* err);

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
