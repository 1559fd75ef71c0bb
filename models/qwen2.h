// Qwen2 / Qwen2.5 defined on ggml-oomb, and OOMB chunk-recurrent training of it.
//
// The model follows HF transformers' Qwen2ForCausalLM: token embedding, per layer RMSNorm ->
// q/k/v projections with biases -> RoPE (NEOX layout) -> grouped-query causal attention -> o_proj
// -> residual, RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (tied to the embedding or
// separate). Weights use llama.cpp's GGUF names and layouts (a Linear weight [out, in] is a tensor
// with ne = {in, out}), so mul_mat(W, x) = x W^T.
//
// Training (OOMB, arXiv 2602.02108, mechanisms 1 and 2): a sequence is split into chunks. One
// chunk's graph is built and planned once (per chunk length) and re-run for every chunk; the
// history enters only through the paged KV cache's page table. Stage 1 runs the chunks forward in
// order (filling the KV cache, summing the loss); stage 2 runs them in reverse, recomputing each
// chunk's forward with gradients and its backward, whose attention accumulates dK/dV into the
// KV-gradient pages; parameter gradients accumulate over chunks and sequences.
#pragma once

#include "oomb.h"
#include "oomb-alloc.h"
#include "oomb-backend.h"
#include "oomb-paged.h"
#include "qwen2-layout.h"  // Qwen2Config, presets, the GGUF layout

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace oomb {

struct Qwen2Layer {
    oomb_tensor *attn_norm, *wq, *bq, *wk, *bk, *wv, *bv, *wo;
    oomb_tensor *ffn_norm, *w_gate, *w_up, *w_down;
};

/// The weights, in one buffer of the backend. `params` lists every weight in GGUF order under its
/// GGUF name.
struct Qwen2Model {
    Qwen2Config cfg;
    oomb_backend_t backend = nullptr;
    oomb_context * ctx = nullptr;     // weights and gradients (metadata)
    oomb_buffer_t  buf = nullptr;     // weight memory
    oomb_buffer_t  grad_buf = nullptr;
    oomb_tensor * tok_embd = nullptr;
    oomb_tensor * output_norm = nullptr;
    oomb_tensor * output = nullptr;   // NULL when tied
    std::vector<Qwen2Layer> layers;
    std::vector<oomb_tensor *> params;
    std::vector<Qwen2TensorSpec> specs;  // specs[i]: the layout's entry of params[i] (kind, layer, slot)

    Qwen2Model() = default;
    Qwen2Model(const Qwen2Model &) = delete;
    Qwen2Model & operator=(const Qwen2Model &) = delete;
    ~Qwen2Model();

    oomb_tensor * lm_head() const { return output ? output : tok_embd; }
    oomb_tensor * find(const std::string & gguf_name) const;
    /// The layout's entry of weight t (one of params); nullptr for another tensor.
    const Qwen2TensorSpec * spec(const oomb_tensor * t) const;
    int64_t n_params() const;
};

/// Creates the weight tensors (zero) of cfg, qwen2_tensors(cfg) in that order, in `backend`'s memory
/// with type `wtype` (f32 or bf16; norms and biases stay f32). An invalid cfg or wtype, or memory
/// that cannot be allocated, is an oomb_error; qwen2_create_or_error returns nullptr and a message
/// in *err instead.
std::unique_ptr<Qwen2Model> qwen2_create(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype);
std::unique_ptr<Qwen2Model> qwen2_create_or_error(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype, std::string * err);
/// HF's initialisation: normal(0, 0.02) for linear and embedding weights, ones for RMSNorm
/// weights, zeros for biases. Deterministic for a seed (values depend on the seed and the tensor
/// name, not on the thread count; the same as oomb-gguf-init's with that seed). Uses all cores.
void qwen2_init_random(Qwen2Model & m, uint64_t seed);
/// Loads a Qwen2 GGUF (llama.cpp's names and keys; F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors are
/// converted to wtype). The metadata is checked against the tensor table before anything is
/// allocated (qwen2_read_config, qwen2_check_tensors). Errors (missing file, other architecture,
/// bad or inconsistent key, missing, misshapen, unreadable or unknown tensor, no memory): nullptr
/// and a message naming the file and the key or tensor in *err; never an oomb_error.
std::unique_ptr<Qwen2Model> qwen2_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err);
/// Writes the model as a GGUF llama.cpp can load (weights in `out_type`: f32 or bf16; norms f32),
/// with the qwen2.* keys and, when vocab_gguf is not empty, the tokenizer.* keys copied from that
/// file (the token list padded to n_vocab with [PAD<id>] entries). Atomic. false + *err on error.
bool qwen2_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & vocab_gguf, oomb_type out_type,
                     const std::string & name, std::string * err);

/// Which weights train: every one, or the reference's choice ("linear": the linear projections of
/// the blocks and the LM head; with tied embeddings that is the shared embedding).
enum class Qwen2Trainable { All, Linear };
/// Flags the chosen weights as parameters and gives each an f32 gradient tensor (one buffer).
/// Returns them in GGUF order.
std::vector<oomb_tensor *> qwen2_set_trainable(Qwen2Model & m, Qwen2Trainable which);

struct ChunkTrainerParams {
    int64_t chunk = 4096;     // tokens per chunk
    int     page = 128;       // tokens per KV page
    int64_t max_tokens = 0;   // longest sequence (the KV cache capacity)
    oomb_type kv_type = OOMB_TYPE_F32;
    int32_t ignore_index = -100;
    // Keep stage 1's attention results (out and LSE, f32) for stage 2 instead of recomputing the
    // attention forward there (oomb_paged_attn_cached): (H*D + H) * 4 bytes per token and layer,
    // i.e. 87 KB per token over all layers of Qwen2.5-0.5B, 404 KB for 7B. Bit-identical results.
    // Not allocated when max_tokens <= chunk (one chunk: no stage 1).
    bool cache_attn = false;
    // The cache's type: f32 (bit-identical) or bf16 (out rounded to bf16, LSE exact: about half the
    // memory, (H*D + 2H) * 2 bytes per token and layer, 204 KB per token for 7B).
    oomb_type cache_attn_type = OOMB_TYPE_F32;
    // Storage of the activations that only feed matrix products (the normed inputs of the Q/K/V and
    // gate/up projections, the SwiGLU output, and the SwiGLU's gradients): OOMB_TYPE_BF16 or
    // OOMB_TYPE_F32; OOMB_TYPE_COUNT (default): bf16 on a GPU backend, whose products read bf16
    // operands anyway (the same results, less memory and traffic), f32 on the CPU (f32 products).
    oomb_type gemm_input_type = OOMB_TYPE_COUNT;
};

/// Statistics of one forward(/backward) over a sequence.
struct ChunkStats {
    double  loss_sum = 0.0;  // sum of the per-target cross-entropies
    int64_t n_targets = 0;   // number of targets counted
};

/// OOMB chunk-recurrent training of a Qwen2 model over paged KV caches. Graphs are built and
/// planned once per (chunk length, with/without backward) and re-run. The LM head and the loss are
/// one oomb_linear_cross_entropy (vocabulary tiles: no [n_vocab, T] logits in the arena), except in
/// the Loss graph with set_capture_hidden on, which keeps mul_mat + cross_entropy_loss for logits().
class ChunkTrainer {
public:
    ChunkTrainer(Qwen2Model & model, const ChunkTrainerParams & p);
    ~ChunkTrainer();
    ChunkTrainer(const ChunkTrainer &) = delete;
    ChunkTrainer & operator=(const ChunkTrainer &) = delete;

    /// Stage 1 only (no gradients): the loss of one sequence of n tokens (targets ids[1..n)).
    ChunkStats forward(const int32_t * ids, int64_t n);
    /// Stage 1 (KV fill only) then stage 2 (recompute with gradients, reverse chunk order; the loss
    /// is summed here): the loss, and the gradient of the loss SUM accumulated into the
    /// parameters' gradient tensors (divide by the total target count, e.g. through the
    /// optimizer's grad_scale).
    ChunkStats forward_backward(const int32_t * ids, int64_t n);

    /// The three graphs of a chunk length: Fill (stage 1 of training: only what fills the KV cache,
    /// no LM head or loss), Loss (forward with the loss: evaluation) and Backward (stage 2).
    /// BackwardStore is Backward that also stores the chunk's K/V: a sequence of one chunk needs
    /// no stage 1.
    enum class Kind { Fill = 0, Loss = 1, Backward = 2, BackwardStore = 3 };
    /// Arena bytes planned for the chunk graph of length T and kind; plans it if needed.
    size_t planned_bytes(int64_t T, Kind kind);
    oomb_kv_cache_t kv_cache() const { return kv_; }
    /// Bytes of the attention-result cache (0 unless ChunkTrainerParams::cache_attn).
    size_t attn_cache_bytes() const;
    /// Peak arena bytes over the graphs used so far.
    size_t arena_bytes() const;

    /// Optional hook: hidden state outputs (for parity tests): when set before the first call,
    /// the forward graphs expose the embedding output, each layer's output and the final norm.
    void set_capture_hidden(bool on) { capture_hidden_ = on; }
    /// After forward(): hidden state k (0 = embeddings, 1..L-1 = layer outputs, L = final norm)
    /// of the last chunk run, [n_embd, T] f32 copied to host; and its logits when captured.
    std::vector<float> hidden(int k) const;
    /// After forward() with capture on: the last chunk's logits, [n_vocab, T] f32.
    std::vector<float> logits() const;

private:
    struct Graph;
    Graph & graph(int64_t T, Kind kind);
    void run_chunk(Graph & g, const int32_t * ids, int64_t n, int64_t p0, int64_t T, ChunkStats & st);
    void check_sequence(const int32_t * ids, int64_t n) const;
    // Clears the KV cache and runs the chunks of ids in order with graphs of this kind.
    void forward_chunks(const int32_t * ids, int64_t n, Kind kind, ChunkStats & st);

    Qwen2Model & m_;
    ChunkTrainerParams p_;
    oomb_kv_cache_t kv_ = nullptr;
    oomb_context * attn_ctx_ = nullptr;          // cache_attn: one tensor per layer
    oomb_buffer_t attn_buf_ = nullptr;
    std::vector<oomb_tensor *> attn_cache_;
    std::map<std::pair<int64_t, int>, std::unique_ptr<Graph>> graphs_;
    bool capture_hidden_ = false;
    Graph * last_ = nullptr;
};

} // namespace oomb
