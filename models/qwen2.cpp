// Qwen2 on ggml-oomb: weights, GGUF load/save, and the chunk graph for OOMB training (see qwen2.h).

#include "qwen2.h"
#include "llama-layout.h"  // the attn_q / attn_k row order of Llama files

#include "gguf.h"
#include "../src/fp16.h"
#include "../src/init-normal.h"
#include "../src/cpu/thread-pool.h"
#include "../src/formats/quants.h"  // quant_random_blocks

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
    for (oomb_tensor * t : params)
        if (t != rope_freqs) n += oomb_nelements(t);
    return n;
}

std::unique_ptr<Qwen2Model> qwen2_create_or_error(const Qwen2Config & cfg, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                                  const std::vector<oomb_type> * types) {
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
    for (size_t si = 0; si < m->specs.size(); si++) {
        const Qwen2TensorSpec & s = m->specs[si];
        oomb_type type = s.kind == Qwen2TensorKind::Weight ? wtype : OOMB_TYPE_F32;  // norms and biases stay f32
        if (types && si < types->size() && (*types)[si] != OOMB_TYPE_COUNT) type = (*types)[si];
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
        case Qwen2Slot::RopeFreqs: m->rope_freqs = t; break;  // only with cfg.rope_freqs (Llama)
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

} // namespace

gguf_tensor_type qwen2_saved_type(const Qwen2Model & m, size_t i, gguf_tensor_type out_type) {
    return m.specs[i].kind == Qwen2TensorKind::Weight ? out_type : GGUF_TENSOR_F32;
}

// A copy when the file's type is t's own; else converted through f32 in pieces of at most
// kStagingBytes of f32 values (gguf_convert: the one rounding / quantization of every type), so
// that nothing the size of t is allocated. Every value is checked in f32 on the way
// (gguf_check_finite_as): a checkpoint or a model file never holds an infinity or a NaN.
gguf_status qwen2_tensor_read_as(const oomb_tensor * t, gguf_tensor_type type, void * dst, uint64_t off, size_t n, std::string * err) {
    auto fail = [&](const std::string & m) {
        if (err) {
            *err = std::string("cannot save tensor '") + t->name + "' as " + gguf_tensor_type_name(type) + ": " + m;
            // the quantizers' own errors (an overflowing block scale) do not name the way out; a NaN or an
            // infinity has none (no type holds it)
            if (m.find("--out-type") == std::string::npos && m.find("non-finite") == std::string::npos && type != GGUF_TENSOR_F32)
                *err += type == GGUF_TENSOR_BF16 ? ": use --out-type f32" : ": use --out-type bf16 or f32";
        }
        return GGUF_ERR_ARG;
    };
    std::string m;
    const bool same = (type == GGUF_TENSOR_F32 && t->type == OOMB_TYPE_F32) || (type == GGUF_TENSOR_BF16 && t->type == OOMB_TYPE_BF16) ||
                      (type == GGUF_TENSOR_F16 && t->type == OOMB_TYPE_F16);
    if (same) {
        oomb_tensor_get(t, dst, (size_t) off, n);
        // the copy checked in place: a value of the type's own is in its range, so only NaN / inf can be wrong
        // (the exponent's bits all set; no conversion, nothing allocated: a 7B bf16 save reads its 15 GB once)
        if (type == GGUF_TENSOR_F32) {
            if (!gguf_check_finite_as((const float *) dst, (int64_t) (n / 4), (int64_t) (off / 4), type, &m)) return fail(m);
            return GGUF_OK;
        }
        const uint16_t exp_mask = type == GGUF_TENSOR_BF16 ? 0x7f80 : 0x7c00;
        const uint8_t * b = (const uint8_t *) dst;
        for (size_t k = 0; k < n / 2; k++) {
            uint16_t u;
            memcpy(&u, b + 2 * k, 2);
            if ((u & exp_mask) == exp_mask) {
                float v = 0.0f;
                gguf_convert(type, b + 2 * k, GGUF_TENSOR_F32, &v, 1, nullptr);
                gguf_check_finite_as(&v, 1, (int64_t) (off / 2 + k), type, &m);  // its message (NaN / inf, the element)
                return fail(m);
            }
        }
        return GGUF_OK;
    }
    const int64_t blk = gguf_tensor_type_block_size(type);
    const size_t bb = gguf_tensor_type_block_bytes(type), in_es = oomb_type_size(t->type);
    const size_t n_blk = n / bb, first_el = (size_t) (off / bb) * (size_t) blk;
    const size_t step = std::max<size_t>(1, kStagingBytes / 4 / (size_t) blk);  // blocks per piece
    std::vector<uint8_t> src(std::min(step, n_blk) * (size_t) blk * in_es);
    std::vector<float> f(std::min(step, n_blk) * (size_t) blk);
    for (size_t k = 0; k < n_blk; k += step) {
        const size_t nb = std::min(step, n_blk - k), ne = nb * (size_t) blk, el0 = first_el + k * (size_t) blk;
        if (t->type == OOMB_TYPE_F32) {
            oomb_tensor_get(t, f.data(), el0 * 4, ne * 4);
        } else {
            oomb_tensor_get(t, src.data(), el0 * in_es, ne * in_es);
            gguf_convert(t->type == OOMB_TYPE_BF16 ? GGUF_TENSOR_BF16 : GGUF_TENSOR_F16, src.data(), GGUF_TENSOR_F32, f.data(), (int64_t) ne, nullptr);
        }
        if (!gguf_check_finite_as(f.data(), (int64_t) ne, (int64_t) el0, type, &m)) return fail(m);
        if (gguf_convert(GGUF_TENSOR_F32, f.data(), type, (uint8_t *) dst + k * bb, (int64_t) ne, &m) != GGUF_OK) {
            // gguf_convert numbers elements from the piece's start
            return fail(el0 ? m + " (counted from element " + std::to_string(el0) + ")" : m);
        }
    }
    return GGUF_OK;
}

void qwen2_init_random(Qwen2Model & m, uint64_t seed) {
    // chunked, seekable streams (src/init-normal.h): values depend on (seed, name, chunk) only, so
    // the chunks of a tensor are generated on all cores (a 7B model's 7.6e9 values in seconds), on
    // the library's thread pool (src/cpu/thread-pool.h), made once for the whole model. A tensor in
    // a block type (qwen2_random_base_types) is made as random blocks directly (quant_random_blocks:
    // mean 0, RMS ~0.02), kInitChunk values' worth of blocks per chunk.
    const int n_threads = (int) std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
    cpu::thread_pool pool(n_threads);
    std::vector<std::vector<float>> scratch((size_t) pool.size(), std::vector<float>((size_t) kInitChunk));
    for (size_t ti = 0; ti < m.params.size(); ti++) {
        oomb_tensor * t = m.params[ti];
        const std::string name = t->name;
        const Qwen2TensorKind kind = m.specs[ti].kind;
        const int64_t n = oomb_nelements(t);
        if (oomb_type_is_quantized(t->type)) {
            const uint32_t gt = oomb_type_to_ggml(t->type);
            if (!quant_random_supported(gt))
                oomb_error("qwen2_init_random: %s: no random blocks of type %s", t->name, oomb_type_name(t->type));
            const int64_t blk = oomb_blck_size(t->type), n_blk = n / blk, per_chunk = kInitChunk / blk;
            const size_t bb = quant_block_bytes(gt);
            std::vector<uint8_t> host(oomb_nbytes(t));
            cpu::parallel_for(pool, (n_blk + per_chunk - 1) / per_chunk, 1, [&](int64_t c0, int64_t c1, int) {
                for (int64_t c = c0; c < c1; c++) {
                    const int64_t b0 = c * per_chunk;
                    quant_random_blocks(gt, init_chunk_seed(seed, name, c), host.data() + (size_t) b0 * bb, std::min(per_chunk, n_blk - b0));
                }
            });
            oomb_tensor_set(t, host.data(), 0, host.size());
            continue;
        }
        const bool bf = t->type == OOMB_TYPE_BF16, f16 = t->type == OOMB_TYPE_F16;
        const size_t es = oomb_type_size(t->type);
        std::vector<uint8_t> host((size_t) n * es);
        const int64_t n_chunks = (n + kInitChunk - 1) / kInitChunk;
        cpu::parallel_for(pool, n_chunks, 1, [&](int64_t c0, int64_t c1, int ith) {
            float * v = scratch[(size_t) ith].data();
            for (int64_t c = c0; c < c1; c++) {
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
        });
        oomb_tensor_set(t, host.data(), 0, host.size());
    }
}

namespace {
// the --base-type names of qwen2_random_base_types: the block type of the projections, llama.cpp's mix
struct RandomBaseType { const char * name; uint32_t ggml; bool mix; };
constexpr RandomBaseType k_random_base_types[] = {{"q4_k_m", GGUF_TENSOR_Q4_K, true}, {"q4_k", GGUF_TENSOR_Q4_K, false},
                                                  {"q6_k", GGUF_TENSOR_Q6_K, false}, {"q8_0", GGUF_TENSOR_Q8_0, false}};
const RandomBaseType * random_base_type(const std::string & name) {
    for (const RandomBaseType & k : k_random_base_types) if (name == k.name) return &k;
    return nullptr;
}
} // namespace

bool qwen2_random_base_type_known(const std::string & base_type) { return random_base_type(base_type) != nullptr; }

bool qwen2_random_base_types(const Qwen2Config & cfg, const std::string & base_type, std::vector<oomb_type> * types, std::string * err) {
    const RandomBaseType * bt = random_base_type(base_type);
    if (!bt) {
        if (err) *err = "random quantized base: unknown block type '" + base_type + "' (choose q4_k_m, q4_k, q6_k or q8_0)";
        return false;
    }
    const std::vector<Qwen2TensorSpec> specs = qwen2_tensors(cfg);
    std::vector<GGUFTensorInfo> infos(specs.size());
    for (size_t i = 0; i < specs.size(); i++) {
        infos[i].name = specs[i].name;
        infos[i].n_dims = (uint32_t) specs[i].ne.size();
        for (size_t d = 0; d < specs[i].ne.size() && d < GGUF_MAX_DIMS; d++) infos[i].ne[d] = specs[i].ne[d];
    }
    const std::vector<uint32_t> planned = gguf_plan_weight_types(infos, bt->ggml, bt->mix);  // the one mix rule (gguf.h)
    types->assign(specs.size(), OOMB_TYPE_COUNT);
    for (size_t i = 0; i < specs.size(); i++) {
        oomb_type qt = OOMB_TYPE_COUNT;
        // only the projections; a row-length fallback to F16 stays in the model's float type
        if (qwen2_slot_is_projection(specs[i].slot) && quant_random_supported(planned[i]) && oomb_type_from_ggml(planned[i], &qt))
            (*types)[i] = qt;
    }
    return true;
}

std::unique_ptr<Qwen2Model> qwen2_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                            bool keep_quantized) {
    return decoder_load_gguf(path, DecoderArch::Qwen2, backend, wtype, err, keep_quantized);
}

bool qwen2_slot_is_projection(Qwen2Slot s) {
    return s == Qwen2Slot::Wq || s == Qwen2Slot::Wk || s == Qwen2Slot::Wv || s == Qwen2Slot::Wo || s == Qwen2Slot::WGate ||
           s == Qwen2Slot::WUp || s == Qwen2Slot::WDown;
}

size_t qwen2_weight_bytes(const Qwen2Model & m) {
    size_t n = 0;
    for (const oomb_tensor * t : m.params) n += oomb_nbytes(t);
    return n;
}

std::unique_ptr<Qwen2Model> decoder_load_gguf(const std::string & path, DecoderArch arch, oomb_backend_t backend, oomb_type wtype,
                                              std::string * err, bool keep_quantized) {
    GGUFReader r;
    if (r.open(path, err) != GGUF_OK) return nullptr;
    // check, then allocate: the metadata against the tensor table, every tensor's shape and type
    Qwen2Config c;
    if (decoder_read_config(r, arch, &c, err) != GGUF_OK) return nullptr;
    if (qwen2_check_tensors(r, c, false, err) != GGUF_OK) return nullptr;
    std::vector<oomb_type> types;
    if (keep_quantized) {
        for (const Qwen2TensorSpec & s : qwen2_tensors(c)) {
            const GGUFTensorInfo * ti = r.find_tensor(s.name);  // present: qwen2_check_tensors
            oomb_type qt = OOMB_TYPE_COUNT;
            if (!(qwen2_slot_is_projection(s.slot) && ti && oomb_type_from_ggml(ti->type, &qt) && oomb_type_is_quantized(qt)))
                qt = OOMB_TYPE_COUNT;
            types.push_back(qt);
        }
    }
    auto m = qwen2_create_or_error(c, backend, wtype, err, keep_quantized ? &types : nullptr);
    if (!m) {
        if (err) *err = path + ": " + *err;
        return nullptr;
    }
    for (size_t i = 0; i < m->params.size(); i++) {
        oomb_tensor * t = m->params[i];
        const GGUFTensorInfo & ti = *r.find_tensor(t->name);  // present: qwen2_check_tensors
        // the file's bytes of this tensor leave the resident set once it is loaded (a 7B model is 15 GB of mapping)
        struct Release {
            const GGUFReader & r;
            const GGUFTensorInfo & ti;
            ~Release() { r.release(r.tensor_data(ti), ti.nbytes); }
        } release{r, ti};
        // Llama's attn_q / attn_k rows: the file's interleaved-RoPE order back to HF's (llama-layout.h)
        const int64_t qk_heads = llama_qk_heads(c, m->specs[i].slot);
        if (oomb_type_is_quantized(t->type)) {
            // kept in its block type: the file's blocks, bit for bit (whole rows: the q/k un-permutation moves rows)
            const size_t n = oomb_nbytes(t);
            const uint8_t * src = r.tensor_data(ti);
            if (!src) {
                if (err) *err = path + ": " + t->name + ": cannot read the tensor's data";
                return nullptr;
            }
            std::vector<uint8_t> h(src, src + n);
            if (qk_heads) llama_unpermute_qk_rows(h.data(), qk_heads, c.head_dim, oomb_row_size(t->type, t->ne[0]));
            oomb_tensor_set(t, h.data(), 0, n);
            continue;
        }
        if (t->type == OOMB_TYPE_BF16 && ti.type == GGUF_TENSOR_BF16) {
            // bit-exact: copy the bf16 payload
            std::vector<uint16_t> h((size_t) oomb_nelements(t));
            if (r.read_tensor(ti, GGUF_TENSOR_BF16, h.data(), h.size() * 2, err) != GGUF_OK) return nullptr;
            if (qk_heads) llama_unpermute_qk_rows(h.data(), qk_heads, c.head_dim, (size_t) t->ne[0] * 2);
            oomb_tensor_set(t, h.data(), 0, h.size() * 2);
            continue;
        }
        std::vector<float> v;
        if (r.read_tensor_f32(t->name, &v, err) != GGUF_OK) return nullptr;
        if (t == m->rope_freqs && !rope_freqs_valid(v.data(), (int64_t) v.size(), err)) {
            if (err) *err = path + ": " + *err;
            return nullptr;
        }
        if (qk_heads) llama_unpermute_qk_rows(v.data(), qk_heads, c.head_dim, (size_t) t->ne[0] * 4);
        upload(t, v.data());
    }
    return m;
}

bool qwen2_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & vocab_gguf, gguf_tensor_type out_type,
                     const std::string & name, std::string * err) {
    for (const oomb_tensor * t : m.params)
        if (oomb_type_is_quantized(t->type)) {
            if (err) *err = "qwen2_save_gguf: " + std::string(t->name) + " is kept in its block type " + oomb_type_name(t->type) +
                            " (a frozen base); load the model with block types converted (--base-type f32 or bf16) to save it";
            return false;
        }
    GGUFWriter w;
    const Qwen2Config & c = m.cfg;
    uint32_t ftype = 0;  // llama_ftype: ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q8_0 = 7, MOSTLY_BF16 = 32
    switch (out_type) {
    case GGUF_TENSOR_F32: ftype = 0; break;
    case GGUF_TENSOR_F16: ftype = 1; break;
    case GGUF_TENSOR_Q8_0: ftype = 7; break;
    case GGUF_TENSOR_BF16: ftype = 32; break;
    default: {
        const char * tn = gguf_tensor_type_name(out_type);
        if (err) *err = std::string("qwen2_save_gguf: cannot write weights of type ") + (tn ? tn : std::to_string(out_type)) +
                        " (supported: F32, F16, BF16, Q8_0)";
        return false;
    }
    }
    w.set_string("general.architecture", decoder_arch_name(c.arch));
    w.set_string("general.name", name);
    w.set_u32("general.file_type", ftype);
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
    // norms and biases stay f32 (as llama.cpp writes them); 2-D weights in out_type
    const std::vector<Qwen2TensorSpec> & specs = m.specs;
    std::vector<gguf_tensor_type> ft(specs.size());
    for (size_t i = 0; i < specs.size(); i++) {
        ft[i] = qwen2_saved_type(m, i, out_type);
        const int64_t blk = gguf_tensor_type_block_size(ft[i]);
        if (specs[i].ne[0] % blk != 0) {
            if (err) *err = "cannot save " + specs[i].name + " (ne[0] = " + std::to_string(specs[i].ne[0]) + ") as " +
                            gguf_tensor_type_name(ft[i]) + ": its rows must be a multiple of " + std::to_string(blk) + " values";
            return false;
        }
        if (w.add_tensor(specs[i].name, ft[i], specs[i].ne, err) != GGUF_OK) return false;
    }
    if (w.open(path, err) != GGUF_OK) return false;
    for (size_t i = 0; i < specs.size(); i++) {
        const oomb_tensor * t = m.params[i];
        const int64_t qk_heads = llama_qk_heads(c, specs[i].slot);  // Llama: HF's row order to the file's
        const size_t row_bytes = (size_t) (t->ne[0] / gguf_tensor_type_block_size(ft[i])) * gguf_tensor_type_block_bytes(ft[i]);
        // Chunks of whole heads when rows are permuted (the permutation stays within a head).
        const size_t granule = qk_heads ? (size_t) c.head_dim * row_bytes : gguf_tensor_type_block_bytes(ft[i]);
        auto fill = [&](void * dst, uint64_t off, size_t n, std::string * e) {
            if (const gguf_status st = qwen2_tensor_read_as(t, ft[i], dst, off, n, e)) return st;
            if (qk_heads) llama_permute_qk_rows(dst, (int64_t) (n / granule), c.head_dim, row_bytes);
            return GGUF_OK;
        };
        if (w.write_tensor_chunks(t->name, granule, fill, err) != GGUF_OK) return false;
    }
    return w.finish(err) == GGUF_OK;
}

std::vector<oomb_tensor *> qwen2_set_trainable(Qwen2Model & m, Qwen2Trainable which) {
    std::vector<oomb_tensor *> out;
    for (size_t i = 0; i < m.params.size(); i++) {
        oomb_tensor * t = m.params[i];
        const Qwen2TensorSpec & s = m.specs[i];
        if (s.slot == Qwen2Slot::RopeFreqs) continue;  // a constant of the model, never trained
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
// The chunk graph (the ChunkDriver of oomb-chunk.h runs it)
// ---------------------------------------------------------------------------------------------

namespace {

class Qwen2ChunkBuilder final : public ChunkGraphBuilder {
public:
    explicit Qwen2ChunkBuilder(const Qwen2Model & m) : m_(m) {}

    ChunkModelShape shape() const override {
        ChunkModelShape s;
        s.backend = m_.backend;
        s.n_vocab = m_.cfg.n_vocab;
        s.n_layer = m_.cfg.n_layer;
        s.n_head = m_.cfg.n_head;
        s.n_head_kv = m_.cfg.n_head_kv;
        s.head_dim = m_.cfg.head_dim;
        return s;
    }

    ChunkGraphOutputs build(oomb_context * ctx, const ChunkGraphInputs & in) override {
        ChunkGraphOutputs out;
        const Qwen2Config & c = m_.cfg;
        const int64_t hd = c.head_dim, T = in.T;
        const float scale = 1.0f / std::sqrt((float) hd);
        auto capture = [&](oomb_tensor * t) {
            if (in.capture) out.hidden.push_back(t);
        };
        // in.gemm_input_type: the storage of the activations that only feed matrix products (the
        // normed inputs of the Q/K/V and gate/up projections, the SwiGLU output) and of the gate / up
        // products, which only the SwiGLU reads
        const oomb_type gemm_in = in.gemm_input_type;
        oomb_tensor * x = oomb_set_name(oomb_get_rows(ctx, m_.tok_embd, in.tokens), "inp_embd");
        capture(x);
        for (int64_t l = 0; l < c.n_layer; l++) {
            const Qwen2Layer & L = m_.layers[l];
            oomb_tensor * h = oomb_rms_norm_mul_ext(ctx, x, L.attn_norm, c.rms_eps, gemm_in);
            // mul_mat(W, x) = x W^T, plus the LoRA term of W's adapter when the model has one. type: the
            // result's storage where only the SwiGLU reads it (gate, up: gemm_in; f32 with an adapter, whose
            // term adds in f32)
            auto proj = [&](oomb_tensor * w, Qwen2Slot slot, oomb_tensor * in, oomb_type type = OOMB_TYPE_F32) {
                const LoraWeight * lw = m_.lora ? m_.lora->find(l, slot) : nullptr;
                if (lw) return lora_apply(ctx, *lw, oomb_mul_mat(ctx, w, in), in);
                return oomb_mul_mat_ext(ctx, w, in, type);
            };
            // x W^T (+ b): Llama has no biases
            auto linear = [&](oomb_tensor * w, Qwen2Slot slot, oomb_tensor * b) {
                oomb_tensor * y = proj(w, slot, h);
                return b ? oomb_add(ctx, y, b) : y;
            };
            oomb_tensor * q = linear(L.wq, Qwen2Slot::Wq, L.bq);
            oomb_tensor * k = linear(L.wk, Qwen2Slot::Wk, L.bk);
            oomb_tensor * v = linear(L.wv, Qwen2Slot::Wv, L.bv);
            // Llama 3.x frequency factors (NULL: plain RoPE, exactly oomb_rope)
            q = oomb_rope_ext(ctx, oomb_reshape_3d(ctx, q, hd, c.n_head, T), in.pos, (int) hd, c.rope_theta, m_.rope_freqs);
            k = oomb_rope_ext(ctx, oomb_reshape_3d(ctx, k, hd, c.n_head_kv, T), in.pos, (int) hd, c.rope_theta, m_.rope_freqs);
            v = oomb_reshape_3d(ctx, v, hd, c.n_head_kv, T);
            oomb_format_name(q, "q.%" PRId64, l);
            oomb_format_name(k, "k.%" PRId64, l);
            oomb_tensor * a = chunk_attention(ctx, in, (int) l, q, k, v, scale);
            if (in.kind == ChunkKind::Fill && l + 1 == c.n_layer) {
                // filling the KV cache: the last layer's K/V are stored by the packed attention
                // node itself, the graph's output; the rest of the layer, the LM head and the loss
                // are not needed
                out.out = a->view_src;
                return out;
            }
            a = oomb_reshape_2d(ctx, a, c.n_head * hd, T);
            x = oomb_add(ctx, x, proj(L.wo, Qwen2Slot::Wo, a));
            oomb_tensor * h2 = oomb_rms_norm_mul_ext(ctx, x, L.ffn_norm, c.rms_eps, gemm_in);
            // gate and up share one type (the SwiGLU takes both f32 or both bf16): gemm_in unless either has an adapter
            const bool ffn_lora = m_.lora && (m_.lora->find(l, Qwen2Slot::WGate) || m_.lora->find(l, Qwen2Slot::WUp));
            const oomb_type gate_up_t = ffn_lora ? OOMB_TYPE_F32 : gemm_in;
            oomb_tensor * f = proj(L.w_down, Qwen2Slot::WDown,
                                   oomb_swiglu_ext(ctx, proj(L.w_gate, Qwen2Slot::WGate, h2, gate_up_t), proj(L.w_up, Qwen2Slot::WUp, h2, gate_up_t),
                                                   gemm_in));
            x = oomb_format_name(oomb_add(ctx, x, f), "l_out.%" PRId64, l);
            if (l + 1 < c.n_layer) capture(x);
        }
        x = oomb_set_name(oomb_rms_norm_mul(ctx, x, m_.output_norm, c.rms_eps), "result_norm");
        capture(x);
        if (in.capture) {
            // the parity hook reads the logits: the unfused head
            out.logits = oomb_set_name(oomb_mul_mat(ctx, m_.lm_head(), x), "logits");
            out.out = oomb_cross_entropy_loss(ctx, out.logits, in.labels, in.ignore_index);
        } else {
            // LM head fused with the loss over vocabulary tiles: the [V, T] logits (and, in the
            // backward, their gradient) are never stored whole
            out.out = oomb_linear_cross_entropy(ctx, m_.lm_head(), x, in.labels, in.ignore_index);
        }
        out.has_loss = true;
        return out;
    }

private:
    const Qwen2Model & m_;
};

} // namespace

std::unique_ptr<ChunkGraphBuilder> qwen2_chunk_builder(const Qwen2Model & m) { return std::make_unique<Qwen2ChunkBuilder>(m); }

} // namespace oomb
