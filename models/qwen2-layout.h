// The Qwen2 GGUF layout (llama.cpp's "qwen2" architecture), written once: the configuration and
// its metadata keys (GGUF qwen2.* keys and HF config.json names), the tensors of a model file
// (GGUF and HF names, ggml shapes ne, optional ones, the tied LM head), the presets, and the checks
// a file passes before anything is allocated for it.
//
// Users: the model (qwen2_create / qwen2_load_gguf / qwen2_save_gguf), oomb-convert-hf,
// oomb-gguf-init, the trainer and the benchmarks. Nothing else spells a qwen2.* key or a blk.N
// tensor name.
//
// The tables here describe the llama.cpp decoder family, not only Qwen2: a DecoderArch picks the
// key prefix ("qwen2." / "llama.") and which tensors a block has (Qwen2: q/k/v biases; Llama: none,
// biases optional in llama.cpp's layout; rope_freqs.weight when Qwen2Config::rope_freqs). llama-layout.{h,cpp} names the
// Llama side (its keys, its checks) through these same tables, so the two never drift apart.
//
// Design: the loader's contract is "check, then allocate". qwen2_read_config() derives the
// configuration from the metadata and checks it against the tensor table (layer count against the
// blk.N tensors present, every shape product with overflow checks, head_dim * n_head against
// attn_q, the vocabulary against token_embd) and qwen2_check_tensors() checks every tensor's
// presence, shape and type, so a file that declares 4e9 layers or a 2^62 key length fails in
// microseconds with a message naming the key or tensor, before a byte is allocated.
#pragma once

#include "gguf.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {

/// general.architecture of a Qwen2 file, and the prefix of its keys.
constexpr const char * QWEN2_ARCH = "qwen2";

/// An architecture of the decoder family of these tables. Qwen2: q/k/v biases. Llama: no biases,
/// and its files store the rows of attn_q / attn_k in llama.cpp's interleaved-RoPE order (see
/// llama-layout.h); the model un-permutes them on load.
enum class DecoderArch { Qwen2, Llama };
/// general.architecture of arch ("qwen2", "llama"): also the prefix of its keys.
const char * decoder_arch_name(DecoderArch arch);
/// The DecoderArch of a general.architecture value; false for another.
bool decoder_arch_from_name(const std::string & name, DecoderArch * arch);

/// A Qwen2 (or, with arch = Llama, a Llama) model's configuration. Each field is written to / read
/// from one GGUF key (<arch>.block_count ...) and one HF config.json field (qwen2-layout.cpp's key
/// table); n_vocab and tied come from the tensors.
struct Qwen2Config {
    DecoderArch arch = DecoderArch::Qwen2;  // general.architecture
    int64_t n_vocab = 0;          // rows of token_embd.weight (HF vocab_size)
    int64_t n_embd = 0;           // qwen2.embedding_length (hidden_size)
    int64_t n_ff = 0;             // qwen2.feed_forward_length (intermediate_size)
    int64_t n_layer = 0;          // qwen2.block_count (num_hidden_layers)
    int64_t n_head = 0;           // qwen2.attention.head_count (num_attention_heads)
    int64_t n_head_kv = 0;        // qwen2.attention.head_count_kv (num_key_value_heads)
    int64_t head_dim = 0;         // qwen2.attention.key_length; n_embd / n_head when absent
    int64_t n_ctx_train = 32768;  // qwen2.context_length (max_position_embeddings)
    float   rope_theta = 1e6f;    // qwen2.rope.freq_base (rope_theta)
    float   rms_eps = 1e-6f;      // qwen2.attention.layer_norm_rms_epsilon (rms_norm_eps)
    bool    tied = false;         // no output.weight: the LM head is token_embd.weight (tie_word_embeddings)
    bool    rope_freqs = false;   // Llama only: the file has rope_freqs.weight (Llama 3.x RoPE frequency
                                  // factors, f32 {head_dim / 2}; HF rope_scaling llama3), which q and k's
                                  // RoPE divide each frequency by (oomb_rope_ext)
};

/// Shapes of the Qwen2.5 family ("qwen2.5-0.5b", "-1.5b", "-3b", "-7b": the published configs)
/// and "tiny" (a small model with the real 151,936-token vocabulary, for the default CPU run).
/// Returns false for other names.
bool qwen2_preset(const std::string & name, Qwen2Config * cfg);
/// The preset names, in the order of the help texts ("tiny" first).
const std::vector<std::string> & qwen2_preset_names();
/// The names for a message: "tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b or qwen2.5-7b".
std::string qwen2_preset_choices();

/// Checks a configuration: every dimension positive and at most INT32_MAX, n_head a multiple of
/// n_head_kv, head_dim even (RoPE rotates pairs), n_head * head_dim and the whole model's element
/// count without overflow, rope_theta and rms_eps finite and > 0. False with a message naming the
/// field (its name here, its GGUF key and its HF name) when not.
bool qwen2_config_valid(const Qwen2Config & cfg, std::string * err);

/// Elements of all the weights of cfg (optional tensors excluded); false on int64 overflow.
bool qwen2_n_elements(const Qwen2Config & cfg, int64_t * n);

/// What a tensor is, which decides its initialisation (normal / ones / zeros) and that norms and
/// biases stay f32 in every file.
enum class Qwen2TensorKind { Weight, Norm, Bias };

/// Which weight of the model a tensor is (the model binds its fields by this, not by name).
enum class Qwen2Slot {
    TokEmbd, AttnNorm, Wq, Bq, Wk, Bk, Wv, Bv, Wo, FfnNorm, WGate, WUp, WDown, Bo, OutputNorm, Output, RopeFreqs,
};

/// One tensor of the layout.
struct Qwen2TensorSpec {
    std::string name;          // GGUF (llama.cpp) name, e.g. blk.0.attn_q.weight
    std::string hf_name;       // HF Qwen2ForCausalLM name, e.g. model.layers.0.self_attn.q_proj.weight
    std::vector<int64_t> ne;   // ggml order: ne[0] = in_features of a Linear weight
    Qwen2TensorKind kind = Qwen2TensorKind::Weight;
    bool optional = false;     // llama.cpp accepts it, Qwen2 checkpoints do not have it
    int64_t layer = -1;        // block index, -1 for the embedding / final norm / head
    Qwen2Slot slot = Qwen2Slot::TokEmbd;
    bool is_1d() const { return ne.size() == 1; }
};

/// Every tensor of a model of configuration cfg, in file order: token_embd, each block's 12 (Qwen2)
/// or 9 (Llama: no biases), the final norm, when untied output.weight, and for a Llama cfg with
/// rope_freqs rope_freqs.weight {head_dim / 2} (kind Norm: f32 in memory and in every file; slot
/// RopeFreqs, never trainable). With `with_optional`, the optional ones follow
/// (blk.N.attn_output.bias; Llama: the q/k/v/o biases and, when cfg.rope_freqs is false,
/// rope_freqs.weight). Shapes use cfg.head_dim (attn_q: {n_embd, n_head * head_dim}).
/// Precondition: qwen2_config_valid(cfg).
std::vector<Qwen2TensorSpec> qwen2_tensors(const Qwen2Config & cfg, bool with_optional = false);

/// Maps an HF Qwen2ForCausalLM (or LlamaForCausalLM: the same names) parameter name to its GGUF
/// name; empty when it has none.
std::string qwen2_gguf_name(const std::string & hf_name);

/// Writes the <arch>.* hyperparameter keys (cfg.arch: qwen2.*, llama.*) of a valid cfg in llama.cpp's order (block_count, context_length,
/// embedding_length, feed_forward_length, head_count, head_count_kv, rope.freq_base,
/// layer_norm_rms_epsilon, then key_length / value_length when head_dim != n_embd / n_head; Llama
/// also vocab_size and rope.dimension_count, as llama.cpp's converter writes them).
/// `write_rope_theta` = false leaves rope.freq_base out (an HF config without rope_theta: readers
/// use llama.cpp's default, 10000). general.* keys are the caller's.
void qwen2_write_hparams(GGUFWriter & w, const Qwen2Config & cfg, bool write_rope_theta = true);

/// Reads the configuration of a Qwen2 model file and checks it against the file's tensor table,
/// allocating nothing that depends on the metadata: general.architecture is "qwen2"; every key has
/// its type and a value in range (u32 keys; a missing required key is an error naming it);
/// block_count equals the number of blk.N blocks present (and N < block_count for every blk.N
/// tensor); token_embd.weight is 2-D with ne[0] = embedding_length (its ne[1] is n_vocab); tied
/// when there is no output.weight; rope_freqs (Llama) when there is rope_freqs.weight; then
/// qwen2_config_valid. Errors: GGUF_ERR_NOT_FOUND (missing key
/// or token_embd.weight), GGUF_ERR_TYPE (wrong architecture, key type, value or inconsistency),
/// with a message "<path>: <key or tensor>: <problem>" in *err.
gguf_status qwen2_read_config(const GGUFReader & r, Qwen2Config * cfg, std::string * err);
/// qwen2_read_config for the architecture `arch` (general.architecture must name it). Llama also
/// checks llama.vocab_size against token_embd and llama.rope.dimension_count against head_dim
/// (partial RoPE is not supported); for both, <arch>.rope.scaling.type other than "none" is refused
/// (the model has no scaled RoPE: use --rope-theta).
gguf_status decoder_read_config(const GGUFReader & r, DecoderArch arch, Qwen2Config * cfg, std::string * err);

/// Checks that the file holds every tensor of cfg (as qwen2_read_config(r) returned it: its layer
/// count is bounded by the file's tensors) with its ne and a readable type, and no tensor outside
/// the layout (an optional one is an error too when `allow_optional` is false: the model
/// has no place for it). rope_freqs.weight must be F32 (its values, finite and > 0, are the
/// loader's check after reading: rope_freqs_valid). GGUF_ERR_NOT_FOUND (missing tensor),
/// GGUF_ERR_TYPE (shape, type, unknown or unsupported tensor); the message names the tensor.
/// Checks cfg.arch's layout.
gguf_status qwen2_check_tensors(const GGUFReader & r, const Qwen2Config & cfg, bool allow_optional, std::string * err);

/// Checks the values of rope_freqs.weight (n = head_dim / 2 floats): every one finite and > 0 (a
/// zero or negative factor makes the RoPE angle infinite or reversed). False with a message naming
/// rope_freqs.weight, the index and the value.
bool rope_freqs_valid(const float * v, int64_t n, std::string * err);

} // namespace oomb
