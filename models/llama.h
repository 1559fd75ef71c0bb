// Llama (Llama 2 / 3.x with its RoPE frequency factors, SmolLM2, Mistral-style) on ggml-oomb:
// weights, GGUF load / save and the chunk graph for the OOMB ChunkDriver (oomb-chunk.h).
//
// The model follows HF transformers' LlamaForCausalLM: token embedding, per layer RMSNorm -> q/k/v
// projections (no biases) -> RoPE (NEOX layout, HF's rotate_half) -> grouped-query causal
// attention -> o_proj -> residual, RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (tied
// or separate). That is Qwen2's decoder without the biases, so the weights container, the loader
// (check, then allocate), the saver and the chunk-graph builder are Qwen2's (qwen2.h), run with
// arch = DecoderArch::Llama; nothing of the block graph is written twice. What is Llama's own is
// the layout (llama-layout.h): llama.* keys and the attn_q / attn_k row order of its files, which
// the loader un-permutes (weights and gradients in memory are in HF's order).
#pragma once

#include "llama-layout.h"
#include "qwen2.h"

namespace oomb {

/// A Llama model: the decoder weights with cfg.arch == DecoderArch::Llama (no bq / bk / bv).
using LlamaModel = Qwen2Model;

/// Loads a Llama GGUF (llama.cpp's names and keys; F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors converted to
/// wtype, f32 or bf16): the metadata and every tensor are checked before anything is allocated
/// (llama_read_config, qwen2_check_tensors). rope_freqs.weight (Llama 3.x RoPE frequency factors,
/// F32 {head_dim / 2}, values finite and > 0) is loaded as m->rope_freqs (f32, never trainable) and
/// divides q and k's RoPE frequencies. A file with q/k/v/o biases, a rope.scaling.type key other
/// than none, or partial RoPE is refused by name. Errors:
/// nullptr and a message naming the file and the key or tensor in *err.
std::unique_ptr<LlamaModel> llama_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                            bool keep_quantized = false);

/// Creates a zero Llama model of cfg (cfg.arch must be DecoderArch::Llama); as qwen2_create.
std::unique_ptr<LlamaModel> llama_create(const LlamaConfig & cfg, oomb_backend_t backend, oomb_type wtype);

/// Writes a Llama model as llama.cpp writes one (llama.* keys, attn_q / attn_k rows in the file's
/// order); as qwen2_save_gguf. false + *err on error, also when m is not a Llama model.
bool llama_save_gguf(const LlamaModel & m, const std::string & path, const std::string & vocab_gguf, gguf_tensor_type out_type,
                     const std::string & name, std::string * err);

/// The Llama chunk graph for the OOMB driver: qwen2_chunk_builder's graph (without biases). The
/// model must outlive the builder.
std::unique_ptr<ChunkGraphBuilder> llama_chunk_builder(const LlamaModel & m);

} // namespace oomb
