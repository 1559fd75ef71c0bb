// LoRA (Hu et al. 2021, arXiv 2106.09685) on the decoder of qwen2.h (Qwen2 and Llama): low-rank
// adapters on the blocks' linear projections, trained while the base weights stay frozen, and
// saved / loaded in llama.cpp's GGUF LoRA adapter format (and saved in HF PEFT's format).
//
// A target projection y = W x (+ b) becomes y = W x + s * B (A x) (+ b), s = alpha / r, with
// A ne [n_in, r] and B ne [r, n_out] (ggml order: mul_mat(A, x) is [r, T], mul_mat(B, .) [n_out, T]),
// f32 master weights in their own buffer; biases stay with W (frozen). This is what llama.cpp's
// build_lora_mm computes (llama-graph.cpp: res = W cur; res += scale * mul_mat(b, mul_mat(a, cur));
// scale = alpha / b->ne[0], or 1 when alpha is 0), so an adapter trained here means the same there.
// The chunk graph (qwen2_chunk_builder) adds the two products where Qwen2Model::lora has a pair for
// a projection: one decoder, written once; without an adapter its graph is unchanged.
//
// File format (llama.cpp's llama-adapter.cpp reader): general.type = "adapter", adapter.type =
// "lora", adapter.lora.alpha (f32), general.architecture = the base's; tensors
// "<base tensor name>.lora_a" ne [n_in, r] and ".lora_b" ne [r, n_out], F32 here. llama.cpp checks
// base ne[0] == a ne[0], base ne[1] == b ne[1] and a ne[1] == b ne[0]. Llama bases: llama.cpp's
// attn_q / attn_k have their rows permuted (llama-layout.h), so W_file = P W and the file's B is P B
// (the rows of B are the output rows); A is unchanged. In memory B is in HF's order, as W is.
//
// Initialisation as PEFT (LoraLayer.reset_lora_parameters), B zero in both, so the adapted model
// starts as the base: init_lora_weights = True ("default" here) A Kaiming-uniform with a = sqrt(5),
// i.e. uniform in [-1/sqrt(n_in), 1/sqrt(n_in)); "gaussian" A ~ Normal(0, std 1/r).
#pragma once

#include "qwen2-layout.h"
#include "oomb.h"
#include "oomb-backend.h"

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace oomb {

struct Qwen2Model;

/// The projections an adapter can target, in the order of --lora-targets and of the file.
enum class LoraTarget { Q, K, V, O, Gate, Up, Down };
constexpr int kLoraTargets = 7;
constexpr uint32_t kLoraAllTargets = (1u << kLoraTargets) - 1;

/// "q", "k", "v", "o", "gate", "up", "down".
const char * lora_target_name(LoraTarget t);
/// The layout slot of a target (Wq ... WDown).
Qwen2Slot lora_target_slot(LoraTarget t);
/// Parses a comma-separated list of target names (each once at most, at least one) into a bit
/// mask (bit i = LoraTarget i). False with a message naming the bad entry and the choices.
bool lora_parse_targets(const std::string & list, uint32_t * mask, std::string * err);
/// The mask as a list in the canonical order: "q,k,v,o,gate,up,down".
std::string lora_targets_string(uint32_t mask);

/// An adapter's shape: rank r (>= 1), alpha (finite; scale = alpha / r), target mask (non-zero).
/// PEFT's init_lora_weights choices (--lora-init): Default (PEFT's True) and Gaussian ("gaussian").
enum class LoraInit { Default, Gaussian };

struct LoraConfig {
    int64_t rank = 16;
    float alpha = 32.0f;
    uint32_t targets = kLoraAllTargets;
    LoraInit init = LoraInit::Default;  // how A was drawn (lora_init_peft; adapter GGUF key oomb.lora.init): PEFT's
                                        // adapter_config.json init_lora_weights
};

/// One adapted projection: A ne [n_in, r], B ne [r, n_out] (f32), and its scale s.
struct LoraWeight {
    oomb_tensor * a = nullptr;
    oomb_tensor * b = nullptr;
    float scale = 0.0f;
};

/// The adapter of a model: the A/B pairs (in their own context and buffer of the model's backend)
/// and their gradients once trainable.
struct LoraAdapter {
    LoraConfig cfg;                   // rank: that of every pair
    oomb_context * ctx = nullptr;
    oomb_buffer_t buf = nullptr, grad_buf = nullptr;
    std::vector<std::array<LoraWeight, kLoraTargets>> layers;  // [layer][target]; a == nullptr: not adapted
    std::vector<oomb_tensor *> params;  // a, b of each pair, by layer then target (the file's order)

    LoraAdapter() = default;
    LoraAdapter(const LoraAdapter &) = delete;
    LoraAdapter & operator=(const LoraAdapter &) = delete;
    ~LoraAdapter();

    /// The pair of (layer, slot), nullptr when that projection is not adapted.
    const LoraWeight * find(int64_t layer, Qwen2Slot slot) const;
    int64_t n_params() const;
    /// min(n_in, n_out) over the adapted projections (INT64_MAX without any): a rank past it adds
    /// parameters and time but no expressiveness to that pair.
    int64_t max_useful_rank() const;
    /// "" when every layer has a pair for every target of cfg.targets (as lora_attach makes them),
    /// else the first that lacks one, e.g. "layer 1's q projection" (a partial adapter's file).
    std::string first_missing() const;
};

/// Checks a configuration: rank from 1 to 2^31-1, alpha finite, targets a non-empty subset of
/// kLoraAllTargets. False with a message naming the option (--lora-rank, --lora-alpha, --lora-targets).
bool lora_config_valid(const LoraConfig & c, std::string * err);

/// Parameters an adapter of configuration c on m would have (rank x (n_in + n_out) per adapted projection), computed
/// without allocating: for a memory check before lora_attach.
int64_t lora_param_count(const Qwen2Model & m, const LoraConfig & c);

/// Gives m an adapter of configuration c (m.lora, replacing any), A and B zero, in m's backend.
/// False + *err for an invalid c or memory that cannot be allocated.
bool lora_attach(Qwen2Model & m, const LoraConfig & c, std::string * err);

/// "default", "gaussian".
const char * lora_init_name(LoraInit i);
/// Parses an --lora-init value ("default" or "gaussian", as PEFT names them). False with a message
/// naming the bad value and the accepted ones.
bool lora_parse_init(const std::string & name, LoraInit * init, std::string * err);

/// PEFT's initialisation, every B zero and every A: Default: uniform in [-1/sqrt(n_in), 1/sqrt(n_in))
/// (Kaiming-uniform, a = sqrt(5)); Gaussian: Normal(0, std 1/r). Deterministic for a seed (values
/// depend on the seed and the tensor name; Default's are those of the versions before --lora-init).
/// Records init in a.cfg.init.
void lora_init_peft(LoraAdapter & a, uint64_t seed, LoraInit init = LoraInit::Default);

/// Flags every A and B of m.lora as parameters with an f32 gradient (one buffer) and returns them
/// (LoraAdapter::params). The base weights get no gradient (frozen). m.lora must exist.
std::vector<oomb_tensor *> lora_set_trainable(Qwen2Model & m);

/// y + s * mul_mat(B, mul_mat(A, x)): the adapter's term of a projection y = mul_mat(W, x), as the
/// chunk graph adds it. x: the projection's input [n_in, T] (f32 or bf16), y: [n_out, T] f32.
oomb_tensor * lora_apply(oomb_context * ctx, const LoraWeight & w, oomb_tensor * y, oomb_tensor * x);

/// Writes m.lora as a llama.cpp LoRA adapter GGUF (see the top of this file; F32 tensors, general.name
/// `name`). Atomic. false + *err on error (also when m has no adapter).
bool lora_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & name, std::string * err);

/// PEFT's state-dict key of a pair: "base_model.model.model.layers.<layer>.self_attn.q_proj.lora_A.weight"
/// (k/v/o_proj under self_attn, gate/up/down_proj under mlp; lora_B when b).
std::string lora_peft_tensor_name(int64_t layer, LoraTarget t, bool b);

/// Writes m.lora as HF PEFT's adapter_model.safetensors (what save_pretrained writes): for every pair
/// lora_peft_tensor_name's lora_A F32 torch shape [r, n_in] and lora_B F32 [n_out, r], B's rows in HF's
/// order (also for Llama: no llama.cpp permutation), metadata format = pt plus `metadata` (string
/// pairs, e.g. oomb-train's oomb_weights_hash; PEFT ignores other keys). Atomic. false + *err on
/// error (also when m has no adapter).
bool lora_save_peft_safetensors(const Qwen2Model & m, const std::string & path, std::string * err,
                                const std::map<std::string, std::string> & metadata = {});

/// PEFT's adapter_config.json for c (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules
/// as HF module names q_proj ... down_proj, bias none, lora_dropout 0, fan_in_fan_out false, use_rslora
/// false: scale alpha / r as here), base_model_name_or_path = base_model. JSON text. lora_alpha is the
/// alpha of the scale trained here: c.alpha, or r when c.alpha is 0 (llama.cpp's rule, scale 1, which
/// PEFT would read as scale 0).
std::string lora_peft_config_json(const LoraConfig & c, const std::string & base_model);

/// Loads a llama.cpp LoRA adapter GGUF onto m (m.lora, replacing any): checks general.type =
/// "adapter", adapter.type = "lora", general.architecture = m's, adapter.lora.alpha (f32; absent or
/// 0: scale 1, as llama.cpp), that every tensor is "<name>.lora_a" / ".lora_b" of one of m's block
/// projections q, k, v, o, gate, up, down with its pair present, ne as llama.cpp checks them against
/// m's weights, one rank for all pairs, F32 / F16 / BF16 data. As llama.cpp, the adapter applies to
/// exactly the pairs the file holds: a partial one (some layers, some targets) is accepted, the
/// projections it has no pair for get no delta, and cfg.targets is the union of its targets
/// (LoraAdapter::first_missing names a gap). Errors: false and a message naming the file and the
/// key or tensor in *err; m is then unchanged.
bool lora_load_gguf(Qwen2Model & m, const std::string & path, std::string * err);

} // namespace oomb
