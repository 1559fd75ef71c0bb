// ggml-oomb chunk-recurrent driver (OOMB, arXiv 2602.02108, mechanisms 1 and 2), independent of
// the model architecture.
//
// Design: the driver owns everything that is about stages and memory: the paged KV cache (and its
// gradient pages, only when it trains), the attention-result cache, the per-(chunk length, kind)
// graphs (built and planned once, re-run for every chunk), and the schedule. Stage 1 runs the
// chunks forward in order, filling the KV cache; stage 2 runs them in reverse, recomputing each
// chunk's forward with gradients and its backward, whose attention accumulates dK/dV into the
// KV-gradient pages; a sequence of one chunk skips stage 1 (its backward graph stores its own K/V).
// A model supplies only a ChunkGraphBuilder: given the chunk length and the kind, it builds the
// chunk's forward into a context from the driver's inputs (token ids, positions, labels) and calls
// chunk_attention() for each layer's attention, which reads and writes the KV cache through the
// page table as the stage needs. The builder knows nothing of stages; a new architecture writes
// its builder and plugs into the same driver.
#pragma once

#include "oomb.h"
#include "oomb-alloc.h"
#include "oomb-backend.h"
#include "oomb-paged.h"
#include "oomb-offload.h"
#include "oomb-sparse.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace oomb {

/// The graphs of a chunk length: Fill (stage 1 of training: only what fills the KV cache, no LM
/// head or loss), Loss (forward with the loss: evaluation) and Backward (stage 2: the forward with
/// the loss, recomputed; the driver appends the backward). BackwardStore is Backward that also
/// stores the chunk's K/V: a sequence of one chunk needs no stage 1.
enum class ChunkKind { Fill = 0, Loss = 1, Backward = 2, BackwardStore = 3 };

struct ChunkParams {
    int64_t chunk = 4096;     // tokens per chunk
    int     page = 128;       // tokens per KV page
    int64_t max_tokens = 0;   // longest sequence (the KV cache capacity)
    oomb_type kv_type = OOMB_TYPE_F32;
    int32_t ignore_index = -100;
    // Allocate the f32 KV-gradient pages (as large as the K/V pools): needed by forward_backward();
    // an evaluation-only driver (forward() only, e.g. oomb-eval) sets false and has none.
    bool with_grad = true;
    // KV-gradient page type: f32, or bf16 (stochastic rounding, oomb_paged_attn_back; with bf16 K/V
    // 112 instead of 168 KiB per token for Qwen2.5-7B). Seed the rounding per step with
    // oomb_kv_cache_set_grad_seed(kv_cache(), step) (default seed 0).
    oomb_type kv_grad_type = OOMB_TYPE_F32;
    // Keep stage 1's attention results (out and LSE, f32) for stage 2 instead of recomputing the
    // attention forward there (oomb_paged_attn_cached): (H*D + H) * 4 bytes per token and layer,
    // i.e. 87 KB per token over all layers of Qwen2.5-0.5B, 404 KB for 7B. Bit-identical results.
    // Not allocated when max_tokens <= chunk (one chunk: no stage 1) or without with_grad.
    bool cache_attn = false;
    // The cache's type: f32 (bit-identical) or bf16 (out rounded to bf16, LSE exact: about half the
    // memory, (H*D + 2H) * 2 bytes per token and layer, 204 KB per token for 7B).
    oomb_type cache_attn_type = OOMB_TYPE_F32;
    // Storage of the activations that only feed matrix products (for Qwen2: the normed inputs of
    // the Q/K/V and gate/up projections, the SwiGLU output, and the SwiGLU's gradients):
    // OOMB_TYPE_BF16 or OOMB_TYPE_F32; OOMB_TYPE_COUNT (default): bf16 on a GPU backend, whose
    // products read bf16 operands anyway (the same results, less memory and traffic), f32 on the
    // CPU (f32 products). The driver resolves it and passes it to the builder.
    oomb_type gemm_input_type = OOMB_TYPE_COUNT;
    // Host offload (OOMB mechanism 3, oomb-offload.h): keep the first resident_pages logical pages
    // of the KV cache (and of its gradient pages) on the device and the rest in pinned host memory,
    // streamed in blocks of stream_block_pages pages. -1 (default), or at least the cache's page
    // count: everything on the device. A host tier needs cache_attn off (when it would be used).
    int64_t resident_pages = -1;
    int stream_block_pages = 16;
    // Page-level top-K sparse attention (OOMB mechanism 4, oomb-sparse.h); sparse.pages = 0: off.
    // On: stage 1 (and forward()) keeps page summaries of every layer (summary_bytes()) and, for
    // every chunk whose history has more than sparse.pages pages, selects each query tile's pages
    // in the chunk's graph; stage 2 reuses exactly those lists (selection()). A chunk whose history
    // fits the budget runs the dense graphs (bit-identical to dense attention). With a host tier
    // (resident_pages) only the selected history pages move (oomb-offload.h; results equal to the
    // resident sparse run to rounding). With the attention-result cache (cache_attn), stage 1
    // saves each layer's result over its lists and stage 2 loads it (f32: bit-identical to recomputing).
    oomb_sparse_params sparse = {0, OOMB_SPARSE_SCORE_MEAN, 0, 0};
};

/// The page lists a chunk's layer attended (stage 1 / forward(), reused by stage 2): CSR over the
/// chunk's query tiles, offsets [n_qtiles + 1] and pages [offsets[n_qtiles]] (oomb-schedule.h).
struct PageSelection {
    std::vector<int32_t> offsets, pages;
};

/// A chunk graph's sparse-attention state, filled by chunk_attention() (driver-internal; builders
/// only pass ChunkGraphInputs on).
struct ChunkSparseGraph {
    oomb_sparse_params params{};
    const std::vector<oomb_tensor *> * summary = nullptr;  // per layer: f32 [D, S, Hkv, n_pages]
    bool lists = false;           // attend through page lists (else dense; summaries still written)
    int64_t n_qtiles = 0;         // list capacity: query tiles of the graph's chunk length
    int64_t n_hist = 0;           // inverse-list capacity: history pages (the cache's page count)
    std::vector<oomb_tensor *> select;      // per layer, Fill / Loss with lists: the page_select node
    std::vector<oomb_tensor *> inputs;      // per layer x 4, Backward with lists: offsets, pages, inv_offsets, inv_qtiles
    std::vector<oomb_tensor *> side;        // page_summary nodes to compute after the chunk (not ancestors of the output)
};

/// The host tier a driver of these parameters gives its KV cache (p.resident_pages at least the
/// cache's page count, or negative: resident_pages = the page count, no host tier): the chunk slots
/// (the pages a chunk spans, at most the streamed pages) and the block sets' size (at most the
/// streamed pages).
oomb_kv_tier_params chunk_kv_tier(const ChunkParams & p);

/// Statistics of one forward(/backward) over a sequence.
struct ChunkStats {
    double  loss_sum = 0.0;  // sum of the per-target cross-entropies
    int64_t n_targets = 0;   // number of targets counted
};

/// Where a forward() / forward_backward() is: reported to the progress hook (set_progress) when a
/// stage starts (chunks_done = 0) and after each of its chunks, on the calling thread, between
/// chunks (nothing is running then). Time is the caller's to measure.
struct ChunkProgress {
    // 1: the chunks in order (forward(), or stage 1 of forward_backward(): the KV fill);
    // 2: stage 2 (the chunks in reverse: recompute + backward).
    int stage = 1;
    // Stages this call runs: 2 for a forward_backward() of several chunks; 1 for forward() (stage 1
    // only) and for a one-chunk forward_backward() (stage 2 only: its backward graph stores its K/V).
    int n_stages = 1;
    int64_t chunks_done = 0;  // chunks of this stage completed (0 .. n_chunks)
    int64_t n_chunks = 0;     // chunks of the sequence (each stage runs all of them)
    int64_t tokens_done = 0;  // tokens of the completed chunks of this stage
    int64_t n_tokens = 0;     // tokens of the sequence
};
using ChunkProgressFn = std::function<void(const ChunkProgress &)>;

/// What the driver needs to know of a model: its backend and the attention shapes (KV cache and
/// attention-cache sizes; token ids are checked against n_vocab).
struct ChunkModelShape {
    oomb_backend_t backend = nullptr;
    int64_t n_vocab = 0;
    int64_t n_layer = 0;
    int64_t n_head = 0;     // query heads
    int64_t n_head_kv = 0;  // K/V heads
    int64_t head_dim = 0;
};

/// The driver's inputs of one chunk graph (T tokens at positions p0 .. p0+T-1 of the sequence).
/// The tensors are graph inputs the driver fills before every run.
struct ChunkGraphInputs {
    ChunkKind kind = ChunkKind::Loss;
    int64_t T = 0;
    oomb_tensor * tokens = nullptr;      // i32 [T]: token ids
    oomb_tensor * labels = nullptr;      // i32 [T]: targets (next token ids, or the caller's labels), ignore_index: none
    oomb_tensor * pos = nullptr;         // i32 [T]: absolute positions
    oomb_kv_cache_t kv = nullptr;        // the KV cache: pools of each layer (oomb_kv_cache_k / _v)
    oomb_tensor * page_table = nullptr;  // i32 [n_pages] (oomb_kv_cache_page_table(kv))
    // The attention-result cache of each layer (empty when off); chunk_attention() chooses whether
    // this graph saves to or loads from it.
    const std::vector<oomb_tensor *> * attn_cache = nullptr;
    int32_t ignore_index = -100;
    oomb_type gemm_input_type = OOMB_TYPE_F32;  // resolved: f32 or bf16
    // Parity hook: expose the hidden states (embedding output, each layer's output but the last,
    // final norm) as outputs, and compute the loss through explicit [n_vocab, T] logits.
    bool capture = false;
    ChunkSparseGraph * sparse = nullptr;  // sparse attention on (ChunkParams::sparse), else NULL
};

/// The outputs a builder names.
struct ChunkGraphOutputs {
    // The graph's result: for Fill, the node that stores the last layer's K/V (the packed
    // paged-attention node, ChunkGraphInputs::kind == Fill stops there); otherwise the loss,
    // f32 [2] = {sum of the per-target cross-entropies, number of targets}.
    oomb_tensor * out = nullptr;
    bool has_loss = false;                 // out is the loss (every kind but Fill)
    std::vector<oomb_tensor *> hidden;     // capture only: f32 [n_embd, T] each
    oomb_tensor * logits = nullptr;        // capture only: f32 [n_vocab, T]
};

/// A model's chunk graph: one forward of T tokens that attends to the KV cache's history.
/// Implementations build only forward nodes into ctx (the driver marks the outputs, expands the
/// graph, appends the backward for Backward / BackwardStore and plans the memory). For kind Fill
/// they may stop after the last layer's attention (nothing later feeds the KV cache).
class ChunkGraphBuilder {
public:
    virtual ~ChunkGraphBuilder() = default;
    virtual ChunkModelShape shape() const = 0;
    virtual ChunkGraphOutputs build(oomb_context * ctx, const ChunkGraphInputs & in) = 0;
};

/// Layer `layer`'s causal attention over the KV cache in a chunk graph, the one call a builder
/// makes per layer: q [head_dim, n_head, T], k / v [head_dim, n_head_kv, T] (RoPE applied to q and
/// k), scale = 1/sqrt(head_dim) usually. Stores the chunk's K/V into the cache unless the kind is
/// Backward (stage 2 reads stage 1's); with the attention cache, Fill saves the result and
/// Backward loads it instead of recomputing. Returns the out view [head_dim, n_head, T] of the
/// packed node (a->view_src, which also holds each row's LSE), named "attn.<layer>".
oomb_tensor * chunk_attention(oomb_context * ctx, const ChunkGraphInputs & in, int layer, oomb_tensor * q, oomb_tensor * k,
                              oomb_tensor * v, float scale);

/// OOMB chunk-recurrent forward / backward over paged KV caches for any ChunkGraphBuilder.
/// Errors (oomb_error): bad parameters, memory that cannot be allocated, bad sequences (fewer
/// than 2 tokens, longer than max_tokens, ids outside the vocabulary), forward_backward() without
/// gradient pages.
class ChunkDriver {
public:
    ChunkDriver(std::unique_ptr<ChunkGraphBuilder> builder, const ChunkParams & p);
    ~ChunkDriver();
    ChunkDriver(const ChunkDriver &) = delete;
    ChunkDriver & operator=(const ChunkDriver &) = delete;

    /// Stage 1 only (no gradients): the loss of one sequence of n tokens (targets ids[1..n)).
    /// labels: optional, n entries: labels[i] is the target of position i (an id in [0, n_vocab),
    /// or ChunkParams::ignore_index: no loss there, e.g. outside a chat's assistant turns); NULL:
    /// the next ids (labels[i] = ids[i + 1], the last position has none). ChunkStats::n_targets
    /// counts the positions that have a target. Error (oomb_error): a label outside the vocabulary.
    ChunkStats forward(const int32_t * ids, int64_t n, const int32_t * labels = nullptr);
    /// Stage 1 (KV fill only) then stage 2 (recompute with gradients, reverse chunk order; the loss
    /// is summed here): the loss, and the gradient of the loss SUM accumulated into the
    /// parameters' gradient tensors (divide by the total target count, e.g. through the
    /// optimizer's grad_scale). Needs ChunkParams::with_grad.
    /// labels: as for forward().
    ChunkStats forward_backward(const int32_t * ids, int64_t n, const int32_t * labels = nullptr);

    /// Arena bytes planned for the chunk graph of length T and kind; plans it if needed.
    size_t planned_bytes(int64_t T, ChunkKind kind);
    /// Device scratch the backend will hold for that graph beyond the arena (oomb_backend_graph_scratch:
    /// the LM head's logits blocks on CUDA; 0 on the CPU); plans the graph if needed.
    size_t backend_scratch_bytes(int64_t T, ChunkKind kind);
    oomb_kv_cache_t kv_cache() const { return kv_; }
    /// Bytes of the attention-result cache (0 unless ChunkParams::cache_attn).
    size_t attn_cache_bytes() const;
    /// Bytes of the sparse-attention page summaries (0 when off).
    size_t summary_bytes() const;
    /// The page lists of chunk `chunk`, layer `layer` made by the last forward() / stage 1; NULL when
    /// that chunk attended densely (its history fit the budget, or sparse attention is off).
    const PageSelection * selection(int64_t chunk, int layer) const;
    /// Peak arena bytes over the graphs used so far.
    size_t arena_bytes() const;
    /// Bytes of every arena allocated so far, summed (one per chunk length and kind: the dense and the
    /// page-list variant of a graph share theirs).
    size_t arena_allocated_bytes() const;
    const ChunkParams & params() const { return p_; }

    /// Optional hook: called with the progress of every later forward() / forward_backward() (see
    /// ChunkProgress); an empty function (the default) turns it off. It must not call the driver.
    void set_progress(ChunkProgressFn fn) { progress_ = std::move(fn); }

    /// Optional hook: hidden state outputs (for parity tests): when set before the first call,
    /// the Loss graphs expose the builder's hidden states and logits (ChunkGraphInputs::capture).
    void set_capture_hidden(bool on) { capture_hidden_ = on; }
    /// After forward(): hidden state k (for Qwen2: 0 = embeddings, 1..L-1 = layer outputs, L =
    /// final norm) of the last chunk run, [n_embd, T] f32 copied to host.
    std::vector<float> hidden(int k) const;
    /// After forward() with capture on: the last chunk's logits, [n_vocab, T] f32.
    std::vector<float> logits() const;

private:
    struct Graph;
    Graph & graph(int64_t T, ChunkKind kind, bool lists = false);
    // labels: NULL (the next ids) or n targets (see forward()); lists: upload the stored selection
    // of chunk p0 / chunk (Backward graphs with page lists)
    void run_chunk(Graph & g, const int32_t * ids, const int32_t * labels, int64_t n, int64_t p0, int64_t T, ChunkStats & st);
    // Whether the chunk starting at p0 attends through page lists (its history exceeds the budget).
    bool chunk_lists(int64_t p0) const;
    void check_sequence(const int32_t * ids, const int32_t * labels, int64_t n) const;
    // Clears the KV cache and runs the chunks of ids in order with graphs of this kind.
    void forward_chunks(const int32_t * ids, const int32_t * labels, int64_t n, ChunkKind kind, ChunkStats & st, int n_stages);
    // Calls the progress hook, if any.
    void report(int stage, int n_stages, int64_t chunks_done, int64_t tokens_done, int64_t n) const;

    std::unique_ptr<ChunkGraphBuilder> builder_;
    ChunkModelShape shape_;
    ChunkParams p_;
    oomb_type gemm_in_ = OOMB_TYPE_F32;
    oomb_kv_cache_t kv_ = nullptr;
    oomb_context * attn_ctx_ = nullptr;          // cache_attn: one tensor per layer
    oomb_buffer_t attn_buf_ = nullptr;
    std::vector<oomb_tensor *> attn_cache_;
    std::map<std::tuple<int64_t, int, int>, std::unique_ptr<Graph>> graphs_;
    oomb_context * sum_ctx_ = nullptr;           // sparse: one summary tensor per layer
    oomb_buffer_t sum_buf_ = nullptr;
    std::vector<oomb_tensor *> summary_;
    std::vector<std::vector<PageSelection>> sel_;  // [chunk][layer]; empty: that chunk was dense
    bool capture_hidden_ = false;
    Graph * last_ = nullptr;
    ChunkProgressFn progress_;
};

} // namespace oomb
