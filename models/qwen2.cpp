// Qwen2 on ggml-oomb: weights, GGUF load/save, and OOMB chunk-recurrent training (see qwen2.h).

#include "qwen2.h"

#include "gguf.h"
#include "../src/fp16.h"
#include "../src/init-normal.h"

#include <cinttypes>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <thread>

namespace oomb {

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

Qwen2Model::~Qwen2Model() {
    oomb_buffer_free(grad_buf);
    oomb_buffer_free(buf);
    oomb_free(ctx);
}

oomb_tensor * Qwen2Model::find(const std::string & gguf_name) const {
    for (oomb_tensor * t : params) if (gguf_name == t->name) return t;
    return nullptr;
}

const Qwen2TensorSpec * Qwen2Model::spec(const oomb_tensor * t) const {
    for (size_t i = 0; i < params.size(); i++)
        if (params[i] == t) return &specs[i];
    return nullptr;
}

int64_t Qwen2Model::n_params() const {
    int64_t n = 0;
    for (oomb_tensor * t : params) n += oomb_nelements(t);
    return n;
}

std::unique_ptr<Qwen2Model> qwen2_create_or_error(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype, std::string * err) {
    if (!qwen2_config_valid(cfg, err)) return nullptr;
    if (wtype != OOMB_TYPE_F32 && wtype != OOMB_TYPE_BF16) {
        if (err) *err = "qwen2_create: weight type must be f32 or bf16";
        return nullptr;
    }
    auto m = std::make_unique<Qwen2Model>();
    m->cfg = cfg;
    m->backend = backend;
    m->ctx = oomb_init({0, true});
    m->layers.resize((size_t) cfg.n_layer);
    m->specs = qwen2_tensors(cfg);
    for (const Qwen2TensorSpec & s : m->specs) {
        const oomb_type type = s.kind == Qwen2TensorKind::Weight ? wtype : OOMB_TYPE_F32;  // norms and biases stay f32
        oomb_tensor * t = s.is_1d() ? oomb_new_tensor_1d(m->ctx, type, s.ne[0]) : oomb_new_tensor_2d(m->ctx, type, s.ne[0], s.ne[1]);
        oomb_set_name(t, s.name.c_str());
        m->params.push_back(t);
        Qwen2Layer * L = s.layer >= 0 ? &m->layers[(size_t) s.layer] : nullptr;
        switch (s.slot) {
        case Qwen2Slot::TokEmbd: m->tok_embd = t; break;
        case Qwen2Slot::OutputNorm: m->output_norm = t; break;
        case Qwen2Slot::Output: m->output = t; break;
        case Qwen2Slot::AttnNorm: L->attn_norm = t; break;
        case Qwen2Slot::Wq: L->wq = t; break;
        case Qwen2Slot::Bq: L->bq = t; break;
        case Qwen2Slot::Wk: L->wk = t; break;
        case Qwen2Slot::Bk: L->bk = t; break;
        case Qwen2Slot::Wv: L->wv = t; break;
        case Qwen2Slot::Bv: L->bv = t; break;
        case Qwen2Slot::Wo: L->wo = t; break;
        case Qwen2Slot::FfnNorm: L->ffn_norm = t; break;
        case Qwen2Slot::WGate: L->w_gate = t; break;
        case Qwen2Slot::WUp: L->w_up = t; break;
        case Qwen2Slot::WDown: L->w_down = t; break;
        case Qwen2Slot::Bo: break;  // optional, not in qwen2_tensors(cfg)
        }
    }
    size_t bytes = 0;
    m->buf = oomb_backend_try_alloc_ctx_tensors(m->ctx, backend, &bytes);
    if (!m->buf) {
        if (err) *err = "qwen2_create: " + std::string(oomb_backend_name(backend)) + " cannot allocate the weights (" + std::to_string(bytes) + " bytes)";
        return nullptr;
    }
    return m;
}

std::unique_ptr<Qwen2Model> qwen2_create(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype) {
    std::string err;
    auto m = qwen2_create_or_error(cfg, backend, wtype, &err);
    if (!m) oomb_error("qwen2_create: %s", err.c_str());
    return m;
}

namespace {

// Writes n f32 values into t (converting to t's type), through a host staging vector.
void upload(oomb_tensor * t, const float * v) {
    const int64_t n = oomb_nelements(t);
    if (t->type == OOMB_TYPE_F32) { oomb_tensor_set(t, v, 0, (size_t) n * 4); return; }
    std::vector<uint16_t> h((size_t) n);
    for (int64_t i = 0; i < n; i++) h[i] = t->type == OOMB_TYPE_BF16 ? fp32_to_bf16(v[i]) : fp32_to_fp16(v[i]);
    oomb_tensor_set(t, h.data(), 0, (size_t) n * 2);
}

// Reads t as f32 values.
std::vector<float> download(const oomb_tensor * t) {
    const int64_t n = oomb_nelements(t);
    std::vector<float> v((size_t) n);
    if (t->type == OOMB_TYPE_F32) { oomb_tensor_get(t, v.data(), 0, (size_t) n * 4); return v; }
    std::vector<uint16_t> h((size_t) n);
    oomb_tensor_get(t, h.data(), 0, (size_t) n * 2);
    for (int64_t i = 0; i < n; i++) v[i] = t->type == OOMB_TYPE_BF16 ? bf16_to_fp32(h[i]) : fp16_to_fp32(h[i]);
    return v;
}

} // namespace

void qwen2_init_random(Qwen2Model & m, uint64_t seed) {
    // chunked, seekable streams (src/init-normal.h): values depend on (seed, name) only, so the
    // chunks of a tensor are generated on all cores (a 7B model's 7.6e9 values in seconds)
    const int n_threads = (int) std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
    std::vector<std::vector<float>> scratch((size_t) n_threads, std::vector<float>((size_t) kInitChunk));
    for (size_t ti = 0; ti < m.params.size(); ti++) {
        oomb_tensor * t = m.params[ti];
        const std::string name = t->name;
        const Qwen2TensorKind kind = m.specs[ti].kind;
        const int64_t n = oomb_nelements(t);
        const bool bf = t->type == OOMB_TYPE_BF16, f16 = t->type == OOMB_TYPE_F16;
        const size_t es = oomb_type_size(t->type);
        std::vector<uint8_t> host((size_t) n * es);
        const int64_t n_chunks = (n + kInitChunk - 1) / kInitChunk;
        const int nt = (int) std::min<int64_t>(n_threads, n_chunks);
        auto work = [&](int k) {
            float * v = scratch[(size_t) k].data();
            for (int64_t c = k; c < n_chunks; c += nt) {
                const int64_t off = c * kInitChunk, len = std::min(kInitChunk, n - off);
                if (kind == Qwen2TensorKind::Norm) std::fill(v, v + len, 1.0f);
                else if (kind == Qwen2TensorKind::Bias) std::fill(v, v + len, 0.0f);
                else fill_normal(init_chunk_seed(seed, name, c), 0.02f, v, len);
                if (bf || f16) {
                    uint16_t * h = (uint16_t *) host.data() + off;
                    for (int64_t i = 0; i < len; i++) h[i] = bf ? fp32_to_bf16(v[i]) : fp32_to_fp16(v[i]);
                } else {
                    std::copy(v, v + len, (float *) host.data() + off);
                }
            }
        };
        std::vector<std::thread> pool;
        for (int k = 1; k < nt; k++) pool.emplace_back(work, k);
        if (nt > 0) work(0);
        for (auto & th : pool) th.join();
        oomb_tensor_set(t, host.data(), 0, host.size());
    }
}

std::unique_ptr<Qwen2Model> qwen2_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err) {
    GGUFReader r;
    if (r.open(path, err) != GGUF_OK) return nullptr;
    // check, then allocate: the metadata against the tensor table, every tensor's shape and type
    Qwen2Config c;
    if (qwen2_read_config(r, &c, err) != GGUF_OK) return nullptr;
    if (qwen2_check_tensors(r, c, false, err) != GGUF_OK) return nullptr;
    auto m = qwen2_create_or_error(c, backend, wtype, err);
    if (!m) {
        if (err) *err = path + ": " + *err;
        return nullptr;
    }
    for (oomb_tensor * t : m->params) {
        const GGUFTensorInfo & ti = *r.find_tensor(t->name);  // present: qwen2_check_tensors
        if (t->type == OOMB_TYPE_BF16 && ti.type == GGUF_TENSOR_BF16) {
            // bit-exact: copy the bf16 payload
            std::vector<uint16_t> h((size_t) oomb_nelements(t));
            if (r.read_tensor(ti, GGUF_TENSOR_BF16, h.data(), h.size() * 2, err) != GGUF_OK) return nullptr;
            oomb_tensor_set(t, h.data(), 0, h.size() * 2);
            continue;
        }
        std::vector<float> v;
        if (r.read_tensor_f32(t->name, &v, err) != GGUF_OK) return nullptr;
        upload(t, v.data());
    }
    return m;
}

bool qwen2_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & vocab_gguf, oomb_type out_type,
                     const std::string & name, std::string * err) {
    GGUFWriter w;
    const Qwen2Config & c = m.cfg;
    w.set_string("general.architecture", QWEN2_ARCH);
    w.set_string("general.name", name);
    w.set_u32("general.file_type", out_type == OOMB_TYPE_BF16 ? 32 : 0);  // llama_ftype: ALL_F32 = 0, MOSTLY_BF16 = 32
    qwen2_write_hparams(w, c);
    if (!vocab_gguf.empty()) {
        GGUFReader v;
        if (v.open(vocab_gguf, err) != GGUF_OK) return false;
        for (const auto & kv : v.metadata()) {
            if (kv.first.rfind("tokenizer.", 0) != 0) continue;
            if (kv.first == "tokenizer.ggml.tokens" || kv.first == "tokenizer.ggml.token_type") continue;
            w.set(kv.first, kv.second);
        }
        std::vector<std::string> tokens;
        if (v.get_string_array("tokenizer.ggml.tokens", &tokens, err) != GGUF_OK) return false;
        std::vector<int32_t> types;
        if (v.get_i32_array("tokenizer.ggml.token_type", &types, err) != GGUF_OK) return false;
        if ((int64_t) tokens.size() > c.n_vocab) {
            if (err) *err = vocab_gguf + ": " + std::to_string(tokens.size()) + " tokens exceed the model's " +
                            std::to_string(c.n_vocab) + " embedding rows";
            return false;
        }
        for (int64_t i = (int64_t) tokens.size(); i < c.n_vocab; i++) {
            tokens.push_back("[PAD" + std::to_string(i) + "]");
            types.push_back(5);
        }
        w.set("tokenizer.ggml.tokens", GGUFValue::string_array(tokens));
        w.set("tokenizer.ggml.token_type", GGUFValue::array(types));
    }
    // norms and biases stay f32 (as llama.cpp writes them)
    const std::vector<Qwen2TensorSpec> & specs = m.specs;
    std::vector<bool> f32(specs.size());
    for (size_t i = 0; i < specs.size(); i++) {
        f32[i] = specs[i].kind != Qwen2TensorKind::Weight || out_type == OOMB_TYPE_F32;
        if (w.add_tensor(specs[i].name, f32[i] ? GGUF_TENSOR_F32 : GGUF_TENSOR_BF16, specs[i].ne, err) != GGUF_OK) return false;
    }
    if (w.open(path, err) != GGUF_OK) return false;
    for (size_t i = 0; i < specs.size(); i++) {
        const oomb_tensor * t = m.params[i];
        if (t->type == OOMB_TYPE_BF16 && !f32[i]) {
            std::vector<uint16_t> h((size_t) oomb_nelements(t));
            oomb_tensor_get(t, h.data(), 0, h.size() * 2);
            if (w.write_tensor(t->name, h.data(), h.size() * 2, err) != GGUF_OK) return false;
            continue;
        }
        std::vector<float> v = download(t);
        if (f32[i]) {
            if (w.write_tensor(t->name, v.data(), v.size() * 4, err) != GGUF_OK) return false;
        } else {
            std::vector<uint16_t> h(v.size());
            for (size_t k = 0; k < v.size(); k++) h[k] = fp32_to_bf16(v[k]);
            if (w.write_tensor(t->name, h.data(), h.size() * 2, err) != GGUF_OK) return false;
        }
    }
    return w.finish(err) == GGUF_OK;
}

std::vector<oomb_tensor *> qwen2_set_trainable(Qwen2Model & m, Qwen2Trainable which) {
    std::vector<oomb_tensor *> out;
    for (size_t i = 0; i < m.params.size(); i++) {
        oomb_tensor * t = m.params[i];
        const Qwen2TensorSpec & s = m.specs[i];
        // "linear": the blocks' projections and the LM head (the shared embedding when tied)
        const bool linear = s.kind == Qwen2TensorKind::Weight &&
                            (s.layer >= 0 || s.slot == Qwen2Slot::Output || (m.cfg.tied && s.slot == Qwen2Slot::TokEmbd));
        if (which == Qwen2Trainable::Linear && !linear) continue;
        oomb_set_param(t);
        oomb_new_grad(m.ctx, t);
        out.push_back(t);
    }
    oomb_buffer_free(m.grad_buf);
    m.grad_buf = oomb_backend_alloc_ctx_tensors(m.ctx, m.backend);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Chunk-recurrent training
// ---------------------------------------------------------------------------------------------

struct ChunkTrainer::Graph {
    oomb_context * ctx = nullptr;
    oomb_cgraph * g = nullptr;
    oomb_gallocr_t galloc = nullptr;
    oomb_tensor * tokens = nullptr;  // i32 [T]
    oomb_tensor * labels = nullptr;  // i32 [T]
    oomb_tensor * pos = nullptr;     // i32 [T]
    oomb_tensor * loss = nullptr;    // f32 [2]: sum, count
    std::vector<oomb_tensor *> hidden;
    oomb_tensor * logits = nullptr;  // captured logits (capture mode only)
    ~Graph() {
        oomb_gallocr_free(galloc);
        oomb_free(ctx);
    }
};

ChunkTrainer::ChunkTrainer(Qwen2Model & model, const ChunkTrainerParams & p) : m_(model), p_(p) {
    if (p.chunk <= 0) oomb_error("ChunkTrainer: chunk = %" PRId64 " must be positive", p.chunk);
    if (p.page <= 0) oomb_error("ChunkTrainer: page = %d must be positive", p.page);
    if (p.max_tokens <= 0) oomb_error("ChunkTrainer: max_tokens = %" PRId64 " must be positive", p.max_tokens);
    if (p.gemm_input_type != OOMB_TYPE_F32 && p.gemm_input_type != OOMB_TYPE_BF16 && p.gemm_input_type != OOMB_TYPE_COUNT)
        oomb_error("ChunkTrainer: gemm_input_type must be f32, bf16 or OOMB_TYPE_COUNT (automatic), got %d", (int) p.gemm_input_type);
    oomb_kv_cache_params kp;
    kp.n_layer = (int) m_.cfg.n_layer;
    kp.n_head_kv = (int) m_.cfg.n_head_kv;
    kp.head_dim = (int) m_.cfg.head_dim;
    kp.page_size = p.page;
    kp.max_tokens = p.max_tokens;
    kp.type = p.kv_type;
    kp.with_grad = true;
    kv_ = oomb_kv_cache_init(m_.backend, kp);
    if (!kv_) oomb_error("ChunkTrainer: cannot allocate the KV cache for %" PRId64 " tokens", p.max_tokens);
    if (p.cache_attn && p.max_tokens > p.chunk) {  // a one-chunk sequence has no stage 1 to keep results from
        const int64_t row = oomb_paged_attn_cache_row(m_.cfg.head_dim, m_.cfg.n_head, p.cache_attn_type);  // per position
        const size_t bytes = ((size_t) (row * p.max_tokens) * oomb_type_size(p.cache_attn_type) + 255) / 256 * 256;
        attn_ctx_ = oomb_init({0, true});
        attn_buf_ = oomb_backend_alloc_buffer(m_.backend, bytes * (size_t) m_.cfg.n_layer);
        if (!attn_buf_)
            oomb_error("ChunkTrainer: cannot allocate the attention cache (cache_attn, oomb-train --attn-cache): %.2f GiB for %" PRId64
                       " tokens x %" PRId64 " layers", (double) bytes * (double) m_.cfg.n_layer / (1 << 30), p.max_tokens, m_.cfg.n_layer);
        for (int64_t l = 0; l < m_.cfg.n_layer; l++) {
            oomb_tensor * t = oomb_new_tensor_1d(attn_ctx_, p.cache_attn_type, row * p.max_tokens);
            oomb_tensor_alloc(attn_buf_, t, (size_t) l * bytes);
            oomb_tensor_memset(t, 0);  // a block never saved loads as zeros, not as stale memory
            attn_cache_.push_back(oomb_format_name(t, "attn_cache.%" PRId64, l));
        }
    }
}

ChunkTrainer::~ChunkTrainer() {
    graphs_.clear();
    oomb_buffer_free(attn_buf_);
    oomb_free(attn_ctx_);
    oomb_kv_cache_free(kv_);
}

size_t ChunkTrainer::attn_cache_bytes() const {
    size_t n = 0;
    for (const oomb_tensor * t : attn_cache_) n += oomb_nbytes(t);
    return n;
}

ChunkTrainer::Graph & ChunkTrainer::graph(int64_t T, Kind kind) {
    const bool backward = kind == Kind::Backward || kind == Kind::BackwardStore;
    const int store = kind == Kind::Backward ? 0 : 1;  // stage 2 reads its K/V from the cache
    auto key = std::make_pair(T, (int) kind);
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return *it->second;
    auto G = std::make_unique<Graph>();
    G->ctx = oomb_init({0, true});
    oomb_context * ctx = G->ctx;
    const Qwen2Config & c = m_.cfg;
    const int64_t hd = c.head_dim;
    G->tokens = oomb_set_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T), "tokens");
    G->labels = oomb_set_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T), "labels");
    G->pos = oomb_set_name(oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T), "pos");
    oomb_set_input(G->tokens);
    oomb_set_input(G->labels);
    oomb_set_input(G->pos);
    const float scale = 1.0f / std::sqrt((float) hd);
    oomb_tensor * pt = oomb_kv_cache_page_table(kv_);

    auto capture = [&](oomb_tensor * t) {
        if (!capture_hidden_ || kind != Kind::Loss) return;
        oomb_set_output(t);
        G->hidden.push_back(t);
    };

    // Activations that only feed matrix products (the normed inputs of the Q/K/V and gate/up
    // projections, the SwiGLU output) are stored in bf16 on the CUDA backend, whose products read
    // bf16 operands anyway (the same results, without a conversion pass per product and with half
    // the bytes); in f32 on the CPU, whose products are f32 (ChunkTrainerParams::gemm_input_type).
    const oomb_type gemm_in = p_.gemm_input_type != OOMB_TYPE_COUNT ? p_.gemm_input_type
                              : oomb_backend_is_host(m_.backend)  ? OOMB_TYPE_F32
                                                                  : OOMB_TYPE_BF16;
    oomb_tensor * x = oomb_set_name(oomb_get_rows(ctx, m_.tok_embd, G->tokens), "inp_embd");
    capture(x);
    for (int64_t l = 0; l < c.n_layer; l++) {
        const Qwen2Layer & L = m_.layers[l];
        oomb_tensor * h = oomb_mul_ext(ctx, oomb_rms_norm(ctx, x, c.rms_eps), L.attn_norm, gemm_in);
        oomb_tensor * q = oomb_add(ctx, oomb_mul_mat(ctx, L.wq, h), L.bq);
        oomb_tensor * k = oomb_add(ctx, oomb_mul_mat(ctx, L.wk, h), L.bk);
        oomb_tensor * v = oomb_add(ctx, oomb_mul_mat(ctx, L.wv, h), L.bv);
        q = oomb_rope(ctx, oomb_reshape_3d(ctx, q, hd, c.n_head, T), G->pos, (int) hd, c.rope_theta);
        k = oomb_rope(ctx, oomb_reshape_3d(ctx, k, hd, c.n_head_kv, T), G->pos, (int) hd, c.rope_theta);
        v = oomb_reshape_3d(ctx, v, hd, c.n_head_kv, T);
        oomb_format_name(q, "q.%" PRId64, l);
        oomb_format_name(k, "k.%" PRId64, l);
        // with the attention cache, stage 1 (Fill) saves each layer's result and stage 2 (Backward)
        // loads it instead of recomputing; a one-chunk sequence (BackwardStore) and evaluation compute
        oomb_tensor * a;
        if (!attn_cache_.empty() && (kind == Kind::Fill || kind == Kind::Backward)) {
            a = oomb_paged_attn_cached(ctx, q, k, v, oomb_kv_cache_k(kv_, (int) l), oomb_kv_cache_v(kv_, (int) l), pt, G->pos, scale,
                                       store, attn_cache_[l], kind == Kind::Backward ? 1 : 0);
        } else {
            a = oomb_paged_attn(ctx, q, k, v, oomb_kv_cache_k(kv_, (int) l), oomb_kv_cache_v(kv_, (int) l), pt, G->pos, scale, store);
        }
        // a is the out view [hd, n_head, T] of the op's node, which also keeps each row's LSE for
        // the backward
        oomb_format_name(a, "attn.%" PRId64, l);
        oomb_format_name(a->view_src, "attn.%" PRId64 ".packed", l);
        if (kind == Kind::Fill && l + 1 == c.n_layer) {
            // stage 1 only fills the KV cache: the last layer's K/V are stored by this node (the
            // packed paged_attn node itself, the graph's output); the rest of the layer, the LM
            // head and the loss are left to stage 2
            x = a->view_src;
            break;
        }
        a = oomb_reshape_2d(ctx, a, c.n_head * hd, T);
        x = oomb_add(ctx, x, oomb_mul_mat(ctx, L.wo, a));
        oomb_tensor * h2 = oomb_mul_ext(ctx, oomb_rms_norm(ctx, x, c.rms_eps), L.ffn_norm, gemm_in);
        oomb_tensor * f = oomb_mul_mat(ctx, L.w_down, oomb_swiglu_ext(ctx, oomb_mul_mat(ctx, L.w_gate, h2), oomb_mul_mat(ctx, L.w_up, h2), gemm_in));
        x = oomb_format_name(oomb_add(ctx, x, f), "l_out.%" PRId64, l);
        if (l + 1 < c.n_layer) capture(x);
    }
    G->g = oomb_new_graph_custom(ctx, 65536);
    oomb_tensor * out = x;  // KV fill: the last layer's paged_attn node (packed: out and LSE)
    if (kind != Kind::Fill) {
        x = oomb_set_name(oomb_mul(ctx, oomb_rms_norm(ctx, x, c.rms_eps), m_.output_norm), "result_norm");
        capture(x);
        if (capture_hidden_ && kind == Kind::Loss) {
            // the parity hook reads the logits: the unfused head
            oomb_tensor * logits = oomb_set_name(oomb_mul_mat(ctx, m_.lm_head(), x), "logits");
            oomb_set_output(logits);
            G->logits = logits;
            G->loss = oomb_cross_entropy_loss(ctx, logits, G->labels, p_.ignore_index);
        } else {
            // LM head fused with the loss over vocabulary tiles: the [V, T] logits (and, in the
            // backward, their gradient) are never stored whole
            G->loss = oomb_linear_cross_entropy(ctx, m_.lm_head(), x, G->labels, p_.ignore_index);
        }
        G->loss = out = oomb_set_name(G->loss, "loss");
        oomb_set_loss(G->loss);
    }
    oomb_set_output(out);
    oomb_build_forward_expand(G->g, out);
    if (backward) oomb_build_backward_expand(ctx, G->g, G->loss, nullptr);
    G->galloc = oomb_gallocr_new(m_.backend);
    if (!oomb_gallocr_alloc_graph(G->galloc, G->g)) {
        oomb_error("ChunkTrainer: cannot allocate the %s graph (T = %" PRId64 ", %zu bytes)", kind == Kind::Fill ? "KV-fill" : "chunk",
                   T, oomb_gallocr_planned_size(G->galloc));
    }
    Graph & ref = *G;
    graphs_[key] = std::move(G);
    return ref;
}

size_t ChunkTrainer::planned_bytes(int64_t T, Kind kind) { return oomb_gallocr_planned_size(graph(T, kind).galloc); }

size_t ChunkTrainer::arena_bytes() const {
    size_t mx = 0;
    for (const auto & kv : graphs_) mx = std::max(mx, oomb_gallocr_buffer_size(kv.second->galloc));
    return mx;
}

void ChunkTrainer::run_chunk(Graph & G, const int32_t * ids, int64_t n, int64_t p0, int64_t T, ChunkStats & st) {
    std::vector<int32_t> tok((size_t) T), lab((size_t) T), pos((size_t) T);
    for (int64_t t = 0; t < T; t++) {
        const int64_t i = p0 + t;
        tok[t] = ids[i];
        lab[t] = i + 1 < n ? ids[i + 1] : p_.ignore_index;
        pos[t] = (int32_t) i;
    }
    oomb_gallocr_alloc_graph(G.galloc, G.g);
    oomb_tensor_set(G.tokens, tok.data(), 0, tok.size() * 4);
    if (G.loss) oomb_tensor_set(G.labels, lab.data(), 0, lab.size() * 4);  // the KV-fill graph has no loss
    oomb_tensor_set(G.pos, pos.data(), 0, pos.size() * 4);
    oomb_backend_graph_compute(m_.backend, G.g);
    if (G.loss) {
        float loss[2];
        oomb_tensor_get(G.loss, loss, 0, sizeof(loss));
        st.loss_sum += loss[0];
        st.n_targets += (int64_t) loss[1];
    }
    last_ = &G;
}

static void check_ids(const int32_t * ids, int64_t n, int64_t n_vocab) {
    if (n < 2) oomb_error("ChunkTrainer: a sequence needs at least 2 tokens, got %" PRId64, n);
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) {
            oomb_error("ChunkTrainer: token id %d at position %" PRId64 " is outside the vocabulary (%" PRId64 " entries)", ids[i], i,
                       n_vocab);
        }
    }
}

void ChunkTrainer::check_sequence(const int32_t * ids, int64_t n) const {
    check_ids(ids, n, m_.cfg.n_vocab);
    if (n > p_.max_tokens) oomb_error("ChunkTrainer: sequence of %" PRId64 " tokens exceeds max_tokens %" PRId64, n, p_.max_tokens);
}

void ChunkTrainer::forward_chunks(const int32_t * ids, int64_t n, Kind kind, ChunkStats & st) {
    oomb_kv_cache_clear(kv_);
    for (int64_t p0 = 0; p0 < n; p0 += p_.chunk) {
        const int64_t T = std::min(p_.chunk, n - p0);
        oomb_kv_cache_reserve(kv_, p0 + T);
        run_chunk(graph(T, kind), ids, n, p0, T, st);
    }
}

ChunkStats ChunkTrainer::forward(const int32_t * ids, int64_t n) {
    check_sequence(ids, n);
    ChunkStats st;
    forward_chunks(ids, n, Kind::Loss, st);
    return st;
}

ChunkStats ChunkTrainer::forward_backward(const int32_t * ids, int64_t n) {
    check_sequence(ids, n);
    if (n <= p_.chunk) {
        // one chunk: its backward graph stores its own K/V, no stage 1 needed
        ChunkStats st;
        oomb_kv_cache_clear(kv_);
        oomb_kv_cache_reserve(kv_, n);
        oomb_kv_cache_zero_grad(kv_);
        run_chunk(graph(n, Kind::BackwardStore), ids, n, 0, n, st);
        return st;
    }
    // stage 1: fill the KV cache chunk by chunk, in order
    ChunkStats none;
    forward_chunks(ids, n, Kind::Fill, none);
    // stage 2: reverse order, recompute with gradients; the loss is summed here
    oomb_kv_cache_zero_grad(kv_);
    ChunkStats st;
    const int64_t n_chunks = (n + p_.chunk - 1) / p_.chunk;
    for (int64_t ci = n_chunks - 1; ci >= 0; ci--) {
        const int64_t p0 = ci * p_.chunk;
        const int64_t T = std::min(p_.chunk, n - p0);
        run_chunk(graph(T, Kind::Backward), ids, n, p0, T, st);
    }
    return st;
}

std::vector<float> ChunkTrainer::hidden(int k) const {
    if (!last_ || k < 0 || k >= (int) last_->hidden.size()) oomb_error("ChunkTrainer::hidden: no captured hidden state %d", k);
    const oomb_tensor * t = last_->hidden[k];
    std::vector<float> v((size_t) oomb_nelements(t));
    oomb_tensor_get(t, v.data(), 0, v.size() * 4);
    return v;
}

std::vector<float> ChunkTrainer::logits() const {
    if (!last_ || !last_->logits) oomb_error("ChunkTrainer::logits: logits were not captured (set_capture_hidden before forward)");
    std::vector<float> v((size_t) oomb_nelements(last_->logits));
    oomb_tensor_get(last_->logits, v.data(), 0, v.size() * 4);
    return v;
}

} // namespace oomb
