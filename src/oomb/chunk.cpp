// The chunk-recurrent driver (see oomb-chunk.h): KV cache, attention-result cache, the stage-1 /
// stage-2 schedule and the per-(chunk length, kind) graphs; the model's part is its
// ChunkGraphBuilder.

#include "oomb-chunk.h"

#include <algorithm>
#include <cinttypes>
#include <memory>
#include <set>
#include <type_traits>

namespace oomb {

struct ChunkDriver::Graph {
    oomb_context * ctx = nullptr;
    oomb_cgraph * g = nullptr;
    // The arena allocator, shared by the dense and the page-list variant of one (T, kind): only one of
    // them runs at a time and every run re-plans its graph (run_chunk), so one arena serves both
    // (two arenas cost a whole second chunk arena: 17.6 GiB for 7B sparse at 128K on the H200).
    std::shared_ptr<std::remove_pointer_t<oomb_gallocr_t>> galloc_ref;
    oomb_gallocr_t galloc = nullptr;
    oomb_tensor * tokens = nullptr;  // i32 [T]
    oomb_tensor * labels = nullptr;  // i32 [T]
    oomb_tensor * pos = nullptr;     // i32 [T]
    oomb_tensor * loss = nullptr;    // f32 [2]: sum, count (NULL for Fill)
    std::vector<oomb_tensor *> hidden;
    oomb_tensor * logits = nullptr;  // captured logits (capture mode only)
    oomb_kv_stream_t stream = nullptr;  // with a host tier: computes the graph over it
    std::unique_ptr<ChunkSparseGraph> sparse;  // sparse attention on
    ~Graph() {
        oomb_kv_stream_free(stream);
        galloc_ref.reset();
        oomb_free(ctx);
    }
};

oomb_tensor * chunk_attention(oomb_context * ctx, const ChunkGraphInputs & in, int layer, oomb_tensor * q, oomb_tensor * k,
                              oomb_tensor * v, float scale) {
    const int store = in.kind == ChunkKind::Backward ? 0 : 1;  // stage 2 reads its K/V from the cache
    oomb_tensor * kp = oomb_kv_cache_k(in.kv, layer), * vp = oomb_kv_cache_v(in.kv, layer);
    ChunkSparseGraph * sp = in.sparse;
    // with the attention cache, stage 1 (Fill) saves each layer's result and stage 2 (Backward)
    // loads it instead of recomputing; a one-chunk sequence (BackwardStore) and evaluation compute
    oomb_tensor * a;
    if (sp && sp->lists) {
        // sparse: stage 1 / evaluation select the pages in the graph; stage 2 gets them uploaded
        oomb_paged_attn_args pa{};
        pa.q = q; pa.k_cur = k; pa.v_cur = v; pa.k_pages = kp; pa.v_pages = vp;
        pa.page_table = in.page_table; pa.pos = in.pos; pa.scale = scale; pa.store = store;
        if (in.kind == ChunkKind::Backward) {
            const int64_t cap = std::max<int64_t>(1, sp->n_qtiles * sp->params.pages);
            const int64_t ne[4] = {sp->n_qtiles + 1, cap, sp->n_hist + 1, cap};
            static const char * names[4] = {"sparse.%d.offsets", "sparse.%d.pages", "sparse.%d.inv_offsets", "sparse.%d.inv_qtiles"};
            oomb_tensor * t[4];
            for (int i = 0; i < 4; i++) {
                t[i] = oomb_format_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, ne[i]), names[i], layer);
                oomb_set_input(t[i]);
                sp->inputs[(size_t) layer * 4 + i] = t[i];
            }
            pa.schedule = oomb_schedule_lists(t[0], t[1], t[2], t[3]);
        } else {
            oomb_tensor * qc = oomb_is_contiguous(q) ? q : oomb_cont(ctx, q);
            oomb_tensor * sel = oomb_page_select(ctx, qc, (*sp->summary)[(size_t) layer], in.pos, (int32_t) kp->ne[2], sp->n_qtiles,
                                                 &sp->params);
            oomb_format_name(sel, "sparse.%d.select", layer);
            sp->select[(size_t) layer] = sel;
            pa.schedule = oomb_schedule_lists(oomb_page_select_offsets(ctx, sel), oomb_page_select_pages(ctx, sel), nullptr, nullptr);
        }
        // the attention cache over the selected pages: stage 2 attends exactly stage 1's lists, so the
        // saved result is the one it would recompute
        if (in.attn_cache && !in.attn_cache->empty() && (in.kind == ChunkKind::Fill || in.kind == ChunkKind::Backward)) {
            pa.out_cache = (*in.attn_cache)[(size_t) layer];
            pa.load = in.kind == ChunkKind::Backward ? 1 : 0;
        }
        a = oomb_paged_attn_ext(ctx, &pa);
    } else if (in.attn_cache && !in.attn_cache->empty() && (in.kind == ChunkKind::Fill || in.kind == ChunkKind::Backward)) {
        a = oomb_paged_attn_cached(ctx, q, k, v, kp, vp, in.page_table, in.pos, scale, store, (*in.attn_cache)[(size_t) layer],
                                   in.kind == ChunkKind::Backward ? 1 : 0);
    } else {
        a = oomb_paged_attn(ctx, q, k, v, kp, vp, in.page_table, in.pos, scale, store);
    }
    // a is the out view [hd, n_head, T] of the op's node, which also keeps each row's LSE for the
    // backward
    oomb_format_name(a, "attn.%d", layer);
    oomb_format_name(a->view_src, "attn.%d.packed", layer);
    // the chunk's completed pages get their summaries once its keys are stored (stage 1, evaluation)
    if (sp && (in.kind == ChunkKind::Fill || in.kind == ChunkKind::Loss))
        sp->side.push_back(oomb_format_name(oomb_page_summary(ctx, kp, in.page_table, in.pos, (*sp->summary)[(size_t) layer], a->view_src),
                                            "sparse.%d.summary", layer));
    return a;
}

oomb_kv_tier_params chunk_kv_tier(const ChunkParams & p) {
    const int64_t n_pages = (p.max_tokens + p.page - 1) / p.page;
    oomb_kv_tier_params t;
    t.resident_pages = p.resident_pages >= 0 && p.resident_pages < n_pages ? p.resident_pages : n_pages;
    const int64_t streamed = std::max<int64_t>(1, n_pages - t.resident_pages);
    t.chunk_pages = (int) std::min<int64_t>((std::min(p.chunk, p.max_tokens) + p.page - 1) / p.page + 1, streamed);
    t.block_pages = (int) std::min<int64_t>(std::max(1, p.stream_block_pages), streamed);
    return t;
}

ChunkDriver::ChunkDriver(std::unique_ptr<ChunkGraphBuilder> builder, const ChunkParams & p) : builder_(std::move(builder)), p_(p) {
    if (!builder_) oomb_error("ChunkDriver: no chunk-graph builder");
    shape_ = builder_->shape();
    if (p.chunk <= 0) oomb_error("ChunkDriver: chunk = %" PRId64 " must be positive", p.chunk);
    if (p.page <= 0) oomb_error("ChunkDriver: page = %d must be positive", p.page);
    if (p.max_tokens <= 0) oomb_error("ChunkDriver: max_tokens = %" PRId64 " must be positive", p.max_tokens);
    if (p.gemm_input_type != OOMB_TYPE_F32 && p.gemm_input_type != OOMB_TYPE_BF16 && p.gemm_input_type != OOMB_TYPE_COUNT)
        oomb_error("ChunkDriver: gemm_input_type must be f32, bf16 or OOMB_TYPE_COUNT (automatic), got %d", (int) p.gemm_input_type);
    // Activations that only feed matrix products are stored in bf16 on the CUDA backend, whose
    // products read bf16 operands anyway; in f32 on the CPU, whose products are f32.
    gemm_in_ = p.gemm_input_type != OOMB_TYPE_COUNT ? p.gemm_input_type
               : oomb_backend_is_host(shape_.backend) ? OOMB_TYPE_F32
                                                      : OOMB_TYPE_BF16;
    oomb_kv_cache_params kp{};
    kp.n_layer = (int) shape_.n_layer;
    kp.n_head_kv = (int) shape_.n_head_kv;
    kp.head_dim = (int) shape_.head_dim;
    kp.page_size = p.page;
    kp.max_tokens = p.max_tokens;
    kp.type = p.kv_type;
    kp.with_grad = p.with_grad;
    kp.grad_type = p.kv_grad_type;
    const int64_t n_pages = (p.max_tokens + p.page - 1) / p.page;
    if (p.sparse.pages != 0) oomb_sparse_check_params(&p.sparse, "ChunkDriver (sparse attention)");
    if (p.resident_pages >= 0 && p.resident_pages < n_pages) {
        if (p.stream_block_pages < 1) oomb_error("ChunkDriver: stream_block_pages = %d must be positive", p.stream_block_pages);
        if (p.cache_attn && p.with_grad && p.max_tokens > p.chunk)
            oomb_error("ChunkDriver: the attention-result cache (cache_attn, oomb-train --attn-cache) does not work with a host tier "
                       "(resident_pages %" PRId64 " < %" PRId64 " pages): drop one of them", p.resident_pages, n_pages);
        kv_ = oomb_kv_cache_init_tiered(shape_.backend, kp, chunk_kv_tier(p));
    } else {
        kv_ = oomb_kv_cache_init(shape_.backend, kp);
    }
    if (!kv_) oomb_error("ChunkDriver: cannot allocate the KV cache for %" PRId64 " tokens", p.max_tokens);
    if (p.sparse.pages != 0) {
        const int64_t S = oomb_sparse_summary_slots(p.sparse.score);
        const size_t bytes = ((size_t) (shape_.head_dim * S * shape_.n_head_kv * n_pages) * 4 + 255) / 256 * 256;
        sum_ctx_ = oomb_init({0, true});
        sum_buf_ = oomb_backend_alloc_buffer(shape_.backend, bytes * (size_t) shape_.n_layer);
        if (!sum_buf_)
            oomb_error("ChunkDriver: cannot allocate the sparse page summaries: %.2f MiB", (double) bytes * (double) shape_.n_layer / (1 << 20));
        for (int64_t l = 0; l < shape_.n_layer; l++) {
            oomb_tensor * t = oomb_new_tensor_4d(sum_ctx_, OOMB_TYPE_F32, shape_.head_dim, S, shape_.n_head_kv, n_pages);
            oomb_tensor_alloc(sum_buf_, t, (size_t) l * bytes);
            oomb_tensor_memset(t, 0);
            summary_.push_back(oomb_format_name(t, "sparse_summary.%" PRId64, l));
        }
    }
    // a one-chunk sequence has no stage 1 to keep results from, and forward() alone no stage 2
    if (p.cache_attn && p.with_grad && p.max_tokens > p.chunk) {
        const int64_t row = oomb_paged_attn_cache_row(shape_.head_dim, shape_.n_head, p.cache_attn_type);  // per position
        const size_t bytes = ((size_t) (row * p.max_tokens) * oomb_type_size(p.cache_attn_type) + 255) / 256 * 256;
        attn_ctx_ = oomb_init({0, true});
        attn_buf_ = oomb_backend_alloc_buffer(shape_.backend, bytes * (size_t) shape_.n_layer);
        if (!attn_buf_)
            oomb_error("ChunkDriver: cannot allocate the attention cache (cache_attn, oomb-train --attn-cache): %.2f GiB for %" PRId64
                       " tokens x %" PRId64 " layers", (double) bytes * (double) shape_.n_layer / (1 << 30), p.max_tokens, shape_.n_layer);
        for (int64_t l = 0; l < shape_.n_layer; l++) {
            oomb_tensor * t = oomb_new_tensor_1d(attn_ctx_, p.cache_attn_type, row * p.max_tokens);
            oomb_tensor_alloc(attn_buf_, t, (size_t) l * bytes);
            oomb_tensor_memset(t, 0);  // a block never saved loads as zeros, not as stale memory
            attn_cache_.push_back(oomb_format_name(t, "attn_cache.%" PRId64, l));
        }
    }
}

ChunkDriver::~ChunkDriver() {
    graphs_.clear();
    oomb_buffer_free(attn_buf_);
    oomb_free(attn_ctx_);
    oomb_buffer_free(sum_buf_);
    oomb_free(sum_ctx_);
    oomb_kv_cache_free(kv_);
}

size_t ChunkDriver::attn_cache_bytes() const {
    size_t n = 0;
    for (const oomb_tensor * t : attn_cache_) n += oomb_nbytes(t);
    return n;
}

size_t ChunkDriver::summary_bytes() const {
    size_t n = 0;
    for (const oomb_tensor * t : summary_) n += oomb_nbytes(t);
    return n;
}

const PageSelection * ChunkDriver::selection(int64_t chunk, int layer) const {
    if (chunk < 0 || chunk >= (int64_t) sel_.size() || sel_[(size_t) chunk].empty() || layer < 0 || layer >= (int) sel_[(size_t) chunk].size())
        return nullptr;
    return &sel_[(size_t) chunk][(size_t) layer];
}

bool ChunkDriver::chunk_lists(int64_t p0) const { return p_.sparse.pages > 0 && p0 / p_.page > p_.sparse.pages; }

ChunkDriver::Graph & ChunkDriver::graph(int64_t T, ChunkKind kind, bool lists) {
    const bool backward = kind == ChunkKind::Backward || kind == ChunkKind::BackwardStore;
    if (backward && !p_.with_grad) oomb_error("ChunkDriver: a backward graph needs the KV-gradient pages (ChunkParams::with_grad)");
    auto key = std::make_tuple(T, (int) kind, lists ? 1 : 0);
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return *it->second;
    auto G = std::make_unique<Graph>();
    G->ctx = oomb_init({0, true});
    oomb_context * ctx = G->ctx;
    G->tokens = oomb_set_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T), "tokens");
    G->labels = oomb_set_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T), "labels");
    G->pos = oomb_set_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T), "pos");
    oomb_set_input(G->tokens);
    oomb_set_input(G->labels);
    oomb_set_input(G->pos);

    ChunkGraphInputs in;
    in.kind = kind;
    in.T = T;
    in.tokens = G->tokens;
    in.labels = G->labels;
    in.pos = G->pos;
    in.kv = kv_;
    in.page_table = oomb_kv_cache_page_table(kv_);
    in.attn_cache = &attn_cache_;
    in.ignore_index = p_.ignore_index;
    in.gemm_input_type = gemm_in_;
    in.capture = capture_hidden_ && kind == ChunkKind::Loss;
    if (p_.sparse.pages > 0 && kind != ChunkKind::BackwardStore) {  // one chunk: no history, nothing to summarise
        G->sparse = std::make_unique<ChunkSparseGraph>();
        ChunkSparseGraph & sp = *G->sparse;
        sp.params = p_.sparse;
        sp.summary = &summary_;
        sp.lists = lists;
        sp.n_qtiles = oomb_page_select_max_qtiles(T, p_.page);
        sp.n_hist = (p_.max_tokens + p_.page - 1) / p_.page;
        sp.select.assign((size_t) shape_.n_layer, nullptr);
        sp.inputs.assign((size_t) shape_.n_layer * 4, nullptr);
        in.sparse = &sp;
    }
    ChunkGraphOutputs out = builder_->build(ctx, in);
    if (!out.out || out.has_loss != (kind != ChunkKind::Fill))
        oomb_error("ChunkDriver: the chunk-graph builder gave no %s output (T = %" PRId64 ")", kind == ChunkKind::Fill ? "KV-fill" : "loss", T);
    for (oomb_tensor * h : out.hidden) oomb_set_output(h);
    if (out.logits) oomb_set_output(out.logits);
    G->hidden = std::move(out.hidden);
    G->logits = out.logits;
    if (out.has_loss) {
        G->loss = oomb_set_name(out.out, "loss");
        oomb_set_loss(G->loss);
    }
    G->g = oomb_new_graph_custom(ctx, 65536);
    oomb_set_output(out.out);
    oomb_build_forward_expand(G->g, out.out);
    if (G->sparse) {
        for (oomb_tensor * sel : G->sparse->select)
            if (sel) oomb_set_output(sel);  // copied to host after the run
        if (lists && kind != ChunkKind::Backward)
            for (int64_t l = 0; l < shape_.n_layer; l++)
                if (!G->sparse->select[(size_t) l]) oomb_error("ChunkDriver: sparse attention: layer %" PRId64 " made no chunk_attention() call", l);
        for (oomb_tensor * s : G->sparse->side) oomb_build_forward_expand(G->g, s);
    }
    if (backward) oomb_build_backward_expand(ctx, G->g, G->loss, nullptr);
    auto sibling = graphs_.find(std::make_tuple(T, (int) kind, lists ? 0 : 1));
    G->galloc_ref = sibling != graphs_.end() ? sibling->second->galloc_ref
                                             : std::shared_ptr<std::remove_pointer_t<oomb_gallocr_t>>(oomb_gallocr_new(shape_.backend), oomb_gallocr_free);
    G->galloc = G->galloc_ref.get();
    if (!oomb_gallocr_alloc_graph(G->galloc, G->g)) {
        oomb_error("ChunkDriver: cannot allocate the %s graph (T = %" PRId64 ", %zu bytes)", kind == ChunkKind::Fill ? "KV-fill" : "chunk",
                   T, oomb_gallocr_planned_size(G->galloc));
    }
    if (oomb_kv_cache_resident_pages(kv_) < (p_.max_tokens + p_.page - 1) / p_.page) {
        G->stream = oomb_kv_stream_new(kv_, shape_.backend, G->g);
        if (!G->stream) oomb_error("ChunkDriver: cannot allocate the offload page tables (T = %" PRId64 ")", T);
    }
    Graph & ref = *G;
    graphs_[key] = std::move(G);
    return ref;
}

size_t ChunkDriver::planned_bytes(int64_t T, ChunkKind kind) { return oomb_gallocr_planned_size(graph(T, kind).galloc); }

size_t ChunkDriver::backend_scratch_bytes(int64_t T, ChunkKind kind) { return oomb_backend_graph_scratch(shape_.backend, graph(T, kind).g); }

size_t ChunkDriver::arena_allocated_bytes() const {
    std::set<oomb_gallocr_t> seen;
    size_t sum = 0;
    for (const auto & kv : graphs_)
        if (seen.insert(kv.second->galloc).second) sum += oomb_gallocr_buffer_size(kv.second->galloc);
    return sum;
}

size_t ChunkDriver::arena_bytes() const {
    size_t mx = 0;
    for (const auto & kv : graphs_) mx = std::max(mx, oomb_gallocr_buffer_size(kv.second->galloc));
    return mx;
}

void ChunkDriver::run_chunk(Graph & G, const int32_t * ids, const int32_t * labels, int64_t n, int64_t p0, int64_t T, ChunkStats & st) {
    std::vector<int32_t> tok((size_t) T), lab((size_t) T), pos((size_t) T);
    for (int64_t t = 0; t < T; t++) {
        const int64_t i = p0 + t;
        tok[t] = ids[i];
        lab[t] = labels ? labels[i] : i + 1 < n ? ids[i + 1] : p_.ignore_index;
        pos[t] = (int32_t) i;
    }
    oomb_gallocr_alloc_graph(G.galloc, G.g);
    oomb_tensor_set(G.tokens, tok.data(), 0, tok.size() * 4);
    if (G.loss) oomb_tensor_set(G.labels, lab.data(), 0, lab.size() * 4);  // the KV-fill graph has no loss
    oomb_tensor_set(G.pos, pos.data(), 0, pos.size() * 4);
    const int64_t ci = p0 / p_.chunk;
    ChunkSparseGraph * sp = G.sparse.get();
    if (sp && sp->lists && !sp->inputs.empty() && sp->inputs[0]) {  // stage 2: exactly stage 1's lists, and their inverse
        for (int64_t l = 0; l < shape_.n_layer; l++) {
            const PageSelection * s = selection(ci, (int) l);
            if (!s) oomb_error("ChunkDriver: sparse attention: no stored selection of chunk %" PRId64 " layer %" PRId64 " (stage 1 not run)", ci, l);
            oomb_tensor * const * t = &sp->inputs[(size_t) l * 4];
            const int64_t nqt = (int64_t) s->offsets.size() - 1, nnz = (int64_t) s->pages.size();
            std::vector<int32_t> io((size_t) sp->n_hist + 1), iq((size_t) std::max<int64_t>(1, nnz));
            oomb_schedule_invert(s->offsets.data(), nqt, s->pages.data(), sp->n_hist, io.data(), iq.data());
            oomb_tensor_set(t[0], s->offsets.data(), 0, s->offsets.size() * 4);
            if (nnz) oomb_tensor_set(t[1], s->pages.data(), 0, (size_t) nnz * 4);
            oomb_tensor_set(t[2], io.data(), 0, io.size() * 4);
            if (nnz) oomb_tensor_set(t[3], iq.data(), 0, (size_t) nnz * 4);
        }
    }
    if (G.stream) {
        if (oomb_kv_stream_compute(G.stream, p0, T) != OOMB_STATUS_OK) oomb_error("ChunkDriver: %s", oomb_kv_stream_last_error(G.stream));
    } else if (oomb_backend_graph_compute(shape_.backend, G.g) != OOMB_STATUS_OK) {
        oomb_error("ChunkDriver: %s", oomb_backend_last_error(shape_.backend));
    }
    if (sp && sp->lists && !sp->select.empty() && sp->select[0]) {  // stage 1 / evaluation: keep the lists
        if ((int64_t) sel_.size() <= ci) sel_.resize((size_t) ci + 1);
        sel_[(size_t) ci].assign((size_t) shape_.n_layer, PageSelection{});
        for (int64_t l = 0; l < shape_.n_layer; l++) {
            PageSelection & s = sel_[(size_t) ci][(size_t) l];
            s.offsets.resize((size_t) sp->n_qtiles + 1);
            oomb_tensor_get(sp->select[(size_t) l], s.offsets.data(), 0, s.offsets.size() * 4);
            s.pages.resize((size_t) s.offsets.back());
            if (!s.pages.empty()) oomb_tensor_get(sp->select[(size_t) l], s.pages.data(), s.offsets.size() * 4, s.pages.size() * 4);
        }
    }
    if (G.loss) {
        float loss[2];
        oomb_tensor_get(G.loss, loss, 0, sizeof(loss));
        st.loss_sum += loss[0];
        st.n_targets += (int64_t) loss[1];
    }
    last_ = &G;
}

void ChunkDriver::check_sequence(const int32_t * ids, const int32_t * labels, int64_t n) const {
    if (n < 2) oomb_error("ChunkDriver: a sequence needs at least 2 tokens, got %" PRId64, n);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= shape_.n_vocab) {
            oomb_error("ChunkDriver: token id %d at position %" PRId64 " is outside the vocabulary (%" PRId64 " entries)", ids[i], i,
                       shape_.n_vocab);
        }
    }
    for (int64_t i = 0; labels && i < n; i++) {
        if (labels[i] != p_.ignore_index && (labels[i] < 0 || labels[i] >= shape_.n_vocab)) {
            oomb_error("ChunkDriver: label %d at position %" PRId64 " is neither a vocabulary id (%" PRId64 " entries) nor the ignore index %d",
                       labels[i], i, shape_.n_vocab, p_.ignore_index);
        }
    }
    if (n > p_.max_tokens) oomb_error("ChunkDriver: sequence of %" PRId64 " tokens exceeds max_tokens %" PRId64, n, p_.max_tokens);
}

void ChunkDriver::report(int stage, int n_stages, int64_t chunks_done, int64_t tokens_done, int64_t n) const {
    if (!progress_) return;
    ChunkProgress pr;
    pr.stage = stage;
    pr.n_stages = n_stages;
    pr.chunks_done = chunks_done;
    pr.n_chunks = (n + p_.chunk - 1) / p_.chunk;
    pr.tokens_done = tokens_done;
    pr.n_tokens = n;
    progress_(pr);
}

void ChunkDriver::forward_chunks(const int32_t * ids, const int32_t * labels, int64_t n, ChunkKind kind, ChunkStats & st, int n_stages) {
    oomb_kv_cache_clear(kv_);
    sel_.clear();
    report(1, n_stages, 0, 0, n);
    for (int64_t p0 = 0; p0 < n; p0 += p_.chunk) {
        const int64_t T = std::min(p_.chunk, n - p0);
        oomb_kv_cache_reserve(kv_, p0 + T);
        run_chunk(graph(T, kind, chunk_lists(p0)), ids, labels, n, p0, T, st);
        report(1, n_stages, p0 / p_.chunk + 1, p0 + T, n);
    }
}

ChunkStats ChunkDriver::forward(const int32_t * ids, int64_t n, const int32_t * labels) {
    check_sequence(ids, labels, n);
    ChunkStats st;
    forward_chunks(ids, labels, n, ChunkKind::Loss, st, 1);
    return st;
}

ChunkStats ChunkDriver::forward_backward(const int32_t * ids, int64_t n, const int32_t * labels) {
    if (!p_.with_grad) oomb_error("ChunkDriver::forward_backward: this driver has no KV-gradient pages (ChunkParams::with_grad = false)");
    check_sequence(ids, labels, n);
    if (n <= p_.chunk) {
        // one chunk: its backward graph stores its own K/V, no stage 1 needed
        ChunkStats st;
        oomb_kv_cache_clear(kv_);
        sel_.clear();
        oomb_kv_cache_reserve(kv_, n);
        oomb_kv_cache_zero_grad(kv_);
        report(2, 1, 0, 0, n);
        run_chunk(graph(n, ChunkKind::BackwardStore), ids, labels, n, 0, n, st);
        report(2, 1, 1, n, n);
        return st;
    }
    // stage 1: fill the KV cache chunk by chunk, in order
    ChunkStats none;
    forward_chunks(ids, labels, n, ChunkKind::Fill, none, 2);
    // stage 2: reverse order, recompute with gradients; the loss is summed here
    oomb_kv_cache_zero_grad(kv_);
    ChunkStats st;
    const int64_t n_chunks = (n + p_.chunk - 1) / p_.chunk;
    report(2, 2, 0, 0, n);
    for (int64_t ci = n_chunks - 1; ci >= 0; ci--) {
        const int64_t p0 = ci * p_.chunk;
        const int64_t T = std::min(p_.chunk, n - p0);
        run_chunk(graph(T, ChunkKind::Backward, chunk_lists(p0)), ids, labels, n, p0, T, st);
        report(2, 2, n_chunks - ci, n - p0, n);
    }
    return st;
}

std::vector<float> ChunkDriver::hidden(int k) const {
    if (!last_ || k < 0 || k >= (int) last_->hidden.size()) oomb_error("ChunkDriver::hidden: no captured hidden state %d", k);
    const oomb_tensor * t = last_->hidden[k];
    std::vector<float> v((size_t) oomb_nelements(t));
    oomb_tensor_get(t, v.data(), 0, v.size() * 4);
    return v;
}

std::vector<float> ChunkDriver::logits() const {
    if (!last_ || !last_->logits) oomb_error("ChunkDriver::logits: logits were not captured (set_capture_hidden before forward)");
    std::vector<float> v((size_t) oomb_nelements(last_->logits));
    oomb_tensor_get(last_->logits, v.data(), 0, v.size() * 4);
    return v;
}

} // namespace oomb
