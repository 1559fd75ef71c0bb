// Qwen2 / Qwen2.5 defined on ggml-oomb, and its chunk graph for OOMB chunk-recurrent training.
// The same weights, loader, saver and chunk graph serve Llama (llama.h): the two differ only in
// the layout's tables (Qwen2Config::arch: biases, key prefix, the attn_q / attn_k row order of
// Llama files, see llama-layout.h), so there is one decoder block, written once, here.
//
// The model follows HF transformers' Qwen2ForCausalLM: token embedding, per layer RMSNorm ->
// q/k/v projections with biases -> RoPE (NEOX layout) -> grouped-query causal attention -> o_proj
// -> residual, RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (tied to the embedding or
// separate). Weights use llama.cpp's GGUF names and layouts (a Linear weight [out, in] is a tensor
// with ne = {in, out}), so mul_mat(W, x) = x W^T.
//
// Training (OOMB, arXiv 2602.02108, mechanisms 1 and 2) is the architecture-independent
// ChunkDriver of oomb-chunk.h (KV cache, stages, graphs); this file supplies its chunk-graph
// builder (qwen2_chunk_builder), which knows nothing of stages.
#pragma once

#include "oomb.h"
#include "oomb-alloc.h"
#include "oomb-backend.h"
#include "oomb-paged.h"
#include "oomb-chunk.h"
#include "qwen2-layout.h"  // Qwen2Config, presets, the GGUF layout
#include "lora.h"          // LoraAdapter: the optional low-rank adapters of the projections

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace oomb {

struct Qwen2Layer {
    oomb_tensor *attn_norm, *wq, *bq, *wk, *bk, *wv, *bv, *wo;  // bq / bk / bv: nullptr for Llama
    oomb_tensor *ffn_norm, *w_gate, *w_up, *w_down;
};

/// The weights, in one buffer of the backend. `params` lists every weight in GGUF order under its
/// GGUF name (with rope_freqs.weight, a constant of the file, when the model has it).
struct Qwen2Model {
    Qwen2Config cfg;
    oomb_backend_t backend = nullptr;
    oomb_context * ctx = nullptr;     // weights and gradients (metadata)
    oomb_buffer_t  buf = nullptr;     // weight memory
    oomb_buffer_t  grad_buf = nullptr;
    oomb_tensor * tok_embd = nullptr;
    oomb_tensor * output_norm = nullptr;
    oomb_tensor * output = nullptr;   // NULL when tied
    oomb_tensor * rope_freqs = nullptr;  // Llama 3.x RoPE frequency factors, f32 [head_dim / 2]; NULL when
                                         // cfg.rope_freqs is false. In params (saved) but never trainable
    std::vector<Qwen2Layer> layers;
    std::vector<oomb_tensor *> params;
    std::vector<Qwen2TensorSpec> specs;  // specs[i]: the layout's entry of params[i] (kind, layer, slot)
    std::unique_ptr<LoraAdapter> lora;   // LoRA adapters of the block projections (lora.h); NULL: none.
                                         // The chunk graph adds their term where present.

    Qwen2Model() = default;
    Qwen2Model(const Qwen2Model &) = delete;
    Qwen2Model & operator=(const Qwen2Model &) = delete;
    ~Qwen2Model();

    oomb_tensor * lm_head() const { return output ? output : tok_embd; }
    oomb_tensor * find(const std::string & gguf_name) const;
    /// The layout's entry of weight t (one of params); nullptr for another tensor.
    const Qwen2TensorSpec * spec(const oomb_tensor * t) const;
    int64_t n_params() const;  // elements of the weights, rope_freqs.weight excluded
};

/// Creates the weight tensors (zero) of cfg, qwen2_tensors(cfg) in that order, in `backend`'s memory
/// with type `wtype` (f32 or bf16; norms and biases stay f32). An invalid cfg or wtype, or memory
/// that cannot be allocated, is an oomb_error; qwen2_create_or_error returns nullptr and a message
/// in *err instead.
std::unique_ptr<Qwen2Model> qwen2_create(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype);
/// types (optional): per entry of qwen2_tensors(cfg), a type that replaces wtype for that tensor
/// (OOMB_TYPE_COUNT: keep wtype), e.g. a projection kept in its GGUF block type.
std::unique_ptr<Qwen2Model> qwen2_create_or_error(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                                  const std::vector<oomb_type> * types = nullptr);
/// HF's initialisation: normal(0, 0.02) for linear and embedding weights, ones for RMSNorm
/// weights, zeros for biases. Deterministic for a seed (values depend on the seed and the tensor
/// name, not on the thread count; the same as oomb-gguf-init's with that seed). Uses all cores.
/// Projections created in a block type (qwen2_random_base_types) are made as random blocks
/// directly (src/formats/quants.h, quant_random_blocks: mean 0, RMS ~0.02, no quantizer), also
/// deterministic in (seed, name, chunk) and on all cores; an oomb_error for a block type without
/// random blocks (supported: Q8_0, Q5_0, Q4_K, Q5_K, Q6_K).
void qwen2_init_random(Qwen2Model & m, uint64_t seed);
/// The types argument of qwen2_create_or_error for a frozen random base in a block type (a model
/// made in memory: oomb-train --preset NAME --trainable lora --base-type q4_k_m): base_type q4_k_m
/// (llama.cpp's Q4_K_M mix by gguf_plan_weight_types: Q4_K, Q6_K for attn_v / ffn_down of the
/// use_more_bits layers), q4_k, q6_k or q8_0; the seven projections of every layer get their type
/// (with llama.cpp's row-length fallbacks: Q4_K -> Q5_0, Q6_K -> Q8_0; a fallback to F16 keeps
/// wtype), every other entry OOMB_TYPE_COUNT (wtype / f32 as without types). Another base_type:
/// false and a message naming it and the choices in *err.
bool qwen2_random_base_types(const Qwen2Config & cfg, const std::string & base_type, std::vector<oomb_type> * types, std::string * err);
/// true for the base_type names qwen2_random_base_types takes (q4_k_m, q4_k, q6_k, q8_0).
bool qwen2_random_base_type_known(const std::string & base_type);
/// Loads a Qwen2 GGUF (llama.cpp's names and keys; F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors are
/// converted to wtype). The metadata is checked against the tensor table before anything is
/// allocated (qwen2_read_config, qwen2_check_tensors). Errors (missing file, other architecture,
/// bad or inconsistent key, missing, misshapen, unreadable or unknown tensor, no memory): nullptr
/// and a message naming the file and the key or tensor in *err; never an oomb_error.
std::unique_ptr<Qwen2Model> qwen2_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                            bool keep_quantized = false);
/// qwen2_load_gguf for the architecture `arch` (general.architecture must name it). Llama files'
/// attn_q / attn_k rows are un-permuted to HF's order on load (llama-layout.h); a Llama file's
/// rope_freqs.weight (F32 {head_dim / 2}, checked before allocation; its values finite and > 0,
/// checked after reading: rope_freqs_valid) is loaded as m->rope_freqs.
/// keep_quantized: the seven projections of each layer (q, k, v, o, gate, up, down: Qwen2TensorKind
/// of the layers' linear weights) that the file stores in a block type (Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q2_K .. Q6_K) keep it in backend memory, bit for bit (a frozen base: they cannot be
/// trainable, oomb_set_param refuses block types); every other tensor is converted to wtype as
/// without it. Such a model cannot be saved (qwen2_save_gguf: an error).
std::unique_ptr<Qwen2Model> decoder_load_gguf(const std::string & path, DecoderArch arch, oomb_backend_t backend, oomb_type wtype,
                                              std::string * err, bool keep_quantized = false);
/// true for the slots of the seven per-layer projections (Wq, Wk, Wv, Wo, WGate, WUp, WDown).
bool qwen2_slot_is_projection(Qwen2Slot s);
/// Bytes of the weights in backend memory (block types at their real size).
size_t qwen2_weight_bytes(const Qwen2Model & m);
/// The type qwen2_save_gguf(..., out_type, ...) gives m.params[i] in the file: out_type for the 2-D
/// weights (Qwen2TensorKind::Weight), F32 for norms, biases and other 1-D tensors.
gguf_tensor_type qwen2_saved_type(const Qwen2Model & m, size_t i, gguf_tensor_type out_type);
/// Bytes [off, off + n) of t's data as a GGUF tensor of `type` (F32, F16, BF16 or Q8_0) holds them:
/// a copy when `type` is t's own, else converted / quantized by gguf_convert through a bounded f32
/// scratch (never the size of t). off and n: multiples of the type's block bytes (4, 2, 2, 34).
/// The one conversion of weights for saving, so also their check: a value that is NaN or infinite, or
/// that `type` cannot hold (F16 / BF16 rounding it to an infinity, a Q8_0 block whose scale overflows),
/// is GGUF_ERR_ARG with *err naming the tensor, the type, the element and the way out (--out-type).
gguf_status qwen2_tensor_read_as(const oomb_tensor * t, gguf_tensor_type type, void * dst, uint64_t off, size_t n,
                                 std::string * err = nullptr);
/// Writes the model as a GGUF llama.cpp can load (2-D weights in `out_type`: F32, F16, BF16 or Q8_0,
/// Q8_0 needing rows of a multiple of 32 values; norms and biases f32; another type is an error),
/// with the <arch>.* keys of m.cfg.arch (a Llama model's attn_q / attn_k rows permuted to the file's
/// order) and, when vocab_gguf is not empty, the tokenizer.* keys copied from that
/// file (the token list padded to n_vocab with [PAD<id>] entries). Atomic. Tensors are streamed from their
/// buffers in chunks of at most kStagingBytes (gguf.h), never copied whole. false + *err on error.
bool qwen2_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & vocab_gguf, gguf_tensor_type out_type,
                     const std::string & name, std::string * err);

/// Which weights train: every one, or the reference's choice ("linear": the linear projections of
/// the blocks and the LM head; with tied embeddings that is the shared embedding).
enum class Qwen2Trainable { All, Linear };
/// Flags the chosen weights as parameters and gives each an f32 gradient tensor (one buffer).
/// Returns them in GGUF order. rope_freqs.weight is never among them (a constant of the model).
std::vector<oomb_tensor *> qwen2_set_trainable(Qwen2Model & m, Qwen2Trainable which);

/// The Qwen2 chunk graph for the OOMB driver (oomb-chunk.h): embedding, the blocks (each layer's
/// attention through chunk_attention), final norm, and the LM head with the loss as one
/// oomb_linear_cross_entropy (vocabulary tiles: no [n_vocab, T] logits in the arena), except with
/// ChunkGraphInputs::capture, which keeps mul_mat + cross_entropy_loss for the logits. q and k are
/// rotated by oomb_rope_ext with m.rope_freqs (NULL without: plain RoPE, the same graph as oomb_rope). Hidden
/// states captured: 0 = embeddings, 1..L-1 = layer outputs, L = final norm. The model must outlive
/// the builder. With m.lora, every adapted projection adds its term (lora_apply: W x + s B (A x), the
/// bias after). Use: ChunkDriver tr(qwen2_chunk_builder(model), params);
std::unique_ptr<ChunkGraphBuilder> qwen2_chunk_builder(const Qwen2Model & m);

} // namespace oomb
