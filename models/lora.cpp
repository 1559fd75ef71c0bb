// LoRA adapters of the decoder: targets, creation, PEFT initialisation, the graph term, and the
// llama.cpp adapter GGUF (see lora.h).
#include "lora.h"

#include "qwen2.h"
#include "llama-layout.h"  // the attn_q / attn_k row order of Llama files
#include "gguf.h"
#include "safetensors.h"
#include "../src/init-normal.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

namespace oomb {

namespace {

struct TargetInfo {
    const char * name;
    Qwen2Slot slot;
};
// HF's module of each target (PEFT's target_modules names, the module paths of its state dict)
const char * const kHfModule[kLoraTargets] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
const TargetInfo kTargets[kLoraTargets] = {
    {"q", Qwen2Slot::Wq}, {"k", Qwen2Slot::Wk}, {"v", Qwen2Slot::Wv}, {"o", Qwen2Slot::Wo},
    {"gate", Qwen2Slot::WGate}, {"up", Qwen2Slot::WUp}, {"down", Qwen2Slot::WDown},
};

constexpr const char * SUFFIX_A = ".lora_a";
constexpr const char * SUFFIX_B = ".lora_b";

oomb_tensor * base_weight(const Qwen2Layer & L, Qwen2Slot s) {
    switch (s) {
    case Qwen2Slot::Wq: return L.wq;
    case Qwen2Slot::Wk: return L.wk;
    case Qwen2Slot::Wv: return L.wv;
    case Qwen2Slot::Wo: return L.wo;
    case Qwen2Slot::WGate: return L.w_gate;
    case Qwen2Slot::WUp: return L.w_up;
    case Qwen2Slot::WDown: return L.w_down;
    default: return nullptr;
    }
}

std::string shape_str(const int64_t * ne, int n) {
    std::string s = "[";
    for (int i = 0; i < n; i++) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// A new adapter of c on m (zero A/B, allocated), or nullptr + *err. present (optional, [layer][target]):
// only the pairs it marks (a partial adapter, as a file may hold), else every target of c in every layer.
std::unique_ptr<LoraAdapter> make_adapter(const Qwen2Model & m, const LoraConfig & c, std::string * err,
                                          const std::vector<std::array<bool, kLoraTargets>> * present = nullptr) {
    auto a = std::make_unique<LoraAdapter>();
    a->cfg = c;
    a->ctx = oomb_init({0, true});
    a->layers.resize((size_t) m.cfg.n_layer);
    for (int64_t l = 0; l < m.cfg.n_layer; l++) {
        for (int t = 0; t < kLoraTargets; t++) {
            if (!(c.targets & (1u << t)) || (present && !(*present)[(size_t) l][(size_t) t])) continue;
            const oomb_tensor * w = base_weight(m.layers[(size_t) l], kTargets[t].slot);
            const int64_t r = c.rank;
            LoraWeight & lw = a->layers[(size_t) l][(size_t) t];
            lw.a = oomb_format_name(oomb_new_tensor_2d(a->ctx, OOMB_TYPE_F32, w->ne[0], r), "%s%s", w->name, SUFFIX_A);
            lw.b = oomb_format_name(oomb_new_tensor_2d(a->ctx, OOMB_TYPE_F32, r, w->ne[1]), "%s%s", w->name, SUFFIX_B);
            // llama.cpp: scale = alpha / rank, or 1 when alpha is 0
            lw.scale = c.alpha != 0.0f ? c.alpha / (float) r : 1.0f;
            a->params.push_back(lw.a);
            a->params.push_back(lw.b);
        }
    }
    size_t bytes = 0;
    a->buf = oomb_backend_try_alloc_ctx_tensors(a->ctx, m.backend, &bytes);
    if (!a->buf) {
        if (err) *err = "lora: " + std::string(oomb_backend_name(m.backend)) + " cannot allocate the adapter (" + std::to_string(bytes) + " bytes)";
        return nullptr;
    }
    for (oomb_tensor * t : a->params) oomb_tensor_memset(t, 0);
    return a;
}

// Calls fn(layer, target, tensor, is_b, values) for A then B of every pair of m.lora, by layer then
// target (the files' order), with the tensor's f32 values read to the host; false as soon as fn is.
template <class Fn> bool for_each_pair_values(const Qwen2Model & m, Fn && fn) {
    std::vector<float> v;
    for (int64_t l = 0; l < m.cfg.n_layer; l++) {
        for (int t = 0; t < kLoraTargets; t++) {
            const LoraWeight & lw = m.lora->layers[(size_t) l][(size_t) t];
            if (!lw.a) continue;
            for (const oomb_tensor * x : {lw.a, lw.b}) {
                v.resize((size_t) oomb_nelements(x));
                oomb_tensor_get(x, v.data(), 0, v.size() * 4);
                if (!fn(l, t, x, x == lw.b, v)) return false;
            }
        }
    }
    return true;
}

} // namespace

const char * lora_target_name(LoraTarget t) { return kTargets[(int) t].name; }
Qwen2Slot lora_target_slot(LoraTarget t) { return kTargets[(int) t].slot; }

bool lora_parse_targets(const std::string & list, uint32_t * mask, std::string * err) {
    uint32_t m = 0;
    size_t i = 0;
    const std::string choices = lora_targets_string(kLoraAllTargets);
    while (i <= list.size()) {
        const size_t j = std::min(list.find(',', i), list.size());
        const std::string name = list.substr(i, j - i);
        int t = 0;
        while (t < kLoraTargets && name != kTargets[t].name) t++;
        if (t == kLoraTargets) {
            if (err) *err = "--lora-targets: unknown target '" + name + "' (choose from " + choices + ")";
            return false;
        }
        if (m & (1u << t)) {
            if (err) *err = "--lora-targets: target '" + name + "' is given twice";
            return false;
        }
        m |= 1u << t;
        i = j + 1;
    }
    *mask = m;
    return true;
}

std::string lora_targets_string(uint32_t mask) {
    std::string s;
    for (int t = 0; t < kLoraTargets; t++)
        if (mask & (1u << t)) s += (s.empty() ? "" : ",") + std::string(kTargets[t].name);
    return s;
}

LoraAdapter::~LoraAdapter() {
    oomb_buffer_free(grad_buf);
    oomb_buffer_free(buf);
    oomb_free(ctx);
}

const LoraWeight * LoraAdapter::find(int64_t layer, Qwen2Slot slot) const {
    if (layer < 0 || layer >= (int64_t) layers.size()) return nullptr;
    for (int t = 0; t < kLoraTargets; t++)
        if (kTargets[t].slot == slot) {
            const LoraWeight & w = layers[(size_t) layer][(size_t) t];
            return w.a ? &w : nullptr;
        }
    return nullptr;
}

std::string LoraAdapter::first_missing() const {
    for (size_t l = 0; l < layers.size(); l++)
        for (int t = 0; t < kLoraTargets; t++)
            if ((cfg.targets & (1u << t)) && !layers[l][(size_t) t].a)
                return "layer " + std::to_string(l) + "'s " + kTargets[t].name + " projection";
    return "";
}

int64_t LoraAdapter::n_params() const {
    int64_t n = 0;
    for (const oomb_tensor * t : params) n += oomb_nelements(t);
    return n;
}

int64_t LoraAdapter::max_useful_rank() const {
    int64_t r = INT64_MAX;
    for (const auto & layer : layers)
        for (const LoraWeight & w : layer)
            if (w.a) r = std::min(r, std::min(w.a->ne[0], w.b->ne[1]));  // A [n_in, r], B [r, n_out]
    return r;
}

bool lora_config_valid(const LoraConfig & c, std::string * err) {
    if (c.rank < 1 || c.rank > INT32_MAX) {
        if (err) *err = "--lora-rank must be from 1 to 2147483647, got " + std::to_string(c.rank);
        return false;
    }
    if (!std::isfinite(c.alpha)) {
        if (err) *err = "--lora-alpha must be a finite number";
        return false;
    }
    if (c.targets == 0 || (c.targets & ~kLoraAllTargets)) {
        if (err) *err = "--lora-targets must name at least one of " + lora_targets_string(kLoraAllTargets);
        return false;
    }
    return true;
}

int64_t lora_param_count(const Qwen2Model & m, const LoraConfig & c) {
    int64_t n = 0;
    for (int64_t l = 0; l < m.cfg.n_layer; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            if (!(c.targets & (1u << t))) continue;
            const oomb_tensor * w = base_weight(m.layers[(size_t) l], kTargets[t].slot);
            n += c.rank * (w->ne[0] + w->ne[1]);
        }
    return n;
}

bool lora_attach(Qwen2Model & m, const LoraConfig & c, std::string * err) {
    if (!lora_config_valid(c, err)) return false;
    auto a = make_adapter(m, c, err);
    if (!a) return false;
    m.lora = std::move(a);
    return true;
}

const char * lora_init_name(LoraInit i) { return i == LoraInit::Gaussian ? "gaussian" : "default"; }

bool lora_parse_init(const std::string & name, LoraInit * init, std::string * err) {
    for (LoraInit i : {LoraInit::Default, LoraInit::Gaussian})
        if (name == lora_init_name(i)) {
            *init = i;
            return true;
        }
    if (err) *err = "--lora-init: unknown value '" + name + "' (choose default or gaussian, PEFT's init_lora_weights True / \"gaussian\")";
    return false;
}

void lora_init_peft(LoraAdapter & a, uint64_t seed, LoraInit init) {
    a.cfg.init = init;
    for (oomb_tensor * t : a.params) {
        const bool is_a = strstr(t->name, SUFFIX_A) != nullptr;
        std::vector<float> v((size_t) oomb_nelements(t), 0.0f);
        if (is_a) {
            // Default: torch.nn.init.kaiming_uniform_(a = sqrt(5)) of PEFT's lora_A [r, n_in]: fan_in = n_in,
            // gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1 / sqrt(n_in).
            // Gaussian: nn.init.normal_(std = 1 / r); r = ne[1] of A
            const float bound = 1.0f / std::sqrt((float) t->ne[0]), std_dev = 1.0f / (float) t->ne[1];
            const int64_t n = (int64_t) v.size();
            for (int64_t c = 0; c * kInitChunk < n; c++) {
                const uint64_t cs = init_chunk_seed(seed, t->name, c);
                float * out = v.data() + c * kInitChunk;
                const int64_t len = std::min(kInitChunk, n - c * kInitChunk);
                if (init == LoraInit::Gaussian) fill_normal(cs, std_dev, out, len);
                else fill_uniform(cs, bound, out, len);
            }
        }
        oomb_tensor_set(t, v.data(), 0, v.size() * 4);
    }
}

std::vector<oomb_tensor *> lora_set_trainable(Qwen2Model & m) {
    if (!m.lora) oomb_error("lora_set_trainable: the model has no adapter");
    LoraAdapter & a = *m.lora;
    for (oomb_tensor * t : a.params) {
        oomb_set_param(t);
        if (!t->grad) oomb_new_grad(a.ctx, t);
    }
    oomb_buffer_free(a.grad_buf);
    a.grad_buf = oomb_backend_alloc_ctx_tensors(a.ctx, m.backend);
    return a.params;
}

oomb_tensor * lora_apply(oomb_context * ctx, const LoraWeight & w, oomb_tensor * y, oomb_tensor * x) {
    oomb_tensor * d = oomb_mul_mat(ctx, w.b, oomb_mul_mat(ctx, w.a, x));
    return oomb_add(ctx, y, oomb_scale(ctx, d, w.scale));
}

bool lora_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & name, std::string * err) {
    if (!m.lora) {
        if (err) *err = "lora_save_gguf: the model has no adapter";
        return false;
    }
    const LoraAdapter & a = *m.lora;
    GGUFWriter w;
    w.set_string("general.architecture", decoder_arch_name(m.cfg.arch));
    w.set_string("general.type", "adapter");
    w.set_string("general.name", name);
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", a.cfg.alpha);
    // ours (llama.cpp ignores keys it does not read): how A was drawn, for adapter_config.json after a resume
    if (a.cfg.init != LoraInit::Default) w.set_string("oomb.lora.init", lora_init_name(a.cfg.init));
    for (const oomb_tensor * t : a.params)
        if (w.add_tensor(t->name, GGUF_TENSOR_F32, {t->ne[0], t->ne[1]}, err) != GGUF_OK) return false;
    if (w.open(path, err) != GGUF_OK) return false;
    return for_each_pair_values(m, [&](int64_t, int t, const oomb_tensor * x, bool is_b, std::vector<float> & v) {
        // Llama: B's output rows in the file's order of attn_q / attn_k (W_file = P W, so B_file = P B)
        const int64_t qk_heads = llama_qk_heads(m.cfg, kTargets[t].slot);
        if (is_b && qk_heads) llama_permute_qk_rows(v.data(), qk_heads, m.cfg.head_dim, (size_t) x->ne[0] * 4);
        // as the model files' weights (qwen2_tensor_read_as): an adapter holding a NaN or an infinity is not written
        std::string e;
        if (!gguf_check_finite_as(v.data(), (int64_t) v.size(), 0, GGUF_TENSOR_F32, &e)) {
            if (err) *err = std::string("cannot save tensor '") + x->name + "' as F32: " + e;
            return false;
        }
        return w.write_tensor(x->name, v.data(), v.size() * 4, err) == GGUF_OK;
    }) && w.finish(err) == GGUF_OK;
}

std::string lora_peft_tensor_name(int64_t layer, LoraTarget t, bool b) {
    return "base_model.model.model.layers." + std::to_string(layer) + "." + kHfModule[(int) t] + (b ? ".lora_B.weight" : ".lora_A.weight");
}

bool lora_save_peft_safetensors(const Qwen2Model & m, const std::string & path, std::string * err,
                                const std::map<std::string, std::string> & metadata) {
    if (!m.lora) {
        if (err) *err = "lora_save_peft_safetensors: the model has no adapter";
        return false;
    }
    SafetensorsWriter w;
    for (const auto & kv : metadata) w.set_metadata(kv.first, kv.second);
    w.set_metadata("format", "pt");  // as PEFT's save_pretrained (safetensors.torch.save_file)
    // ne [n_in, r] is torch [r, n_in] (lora_A), ne [r, n_out] torch [n_out, r] (lora_B): the same bytes;
    // B's rows are in HF's order in memory (no permutation, unlike the GGUF file)
    const bool ok = for_each_pair_values(m, [&](int64_t l, int t, const oomb_tensor * x, bool is_b, std::vector<float> & v) {
        return w.add_copy(lora_peft_tensor_name(l, (LoraTarget) t, is_b), SafetensorsDtype::F32, {x->ne[1], x->ne[0]}, v.data(), err) == GGUF_OK;
    });
    return ok && w.write(path, err) == GGUF_OK;
}

std::string lora_peft_config_json(const LoraConfig & c, const std::string & base_model) {
    nlohmann::json j;
    nlohmann::json targets = nlohmann::json::array();
    for (int t = 0; t < kLoraTargets; t++) {
        if (!(c.targets & (1u << t))) continue;
        const std::string mod = kHfModule[t];
        targets.push_back(mod.substr(mod.find('.') + 1));
    }
    j["peft_type"] = "LORA";
    j["task_type"] = "CAUSAL_LM";
    j["base_model_name_or_path"] = base_model;
    j["revision"] = nullptr;
    j["inference_mode"] = true;
    j["r"] = c.rank;
    // PEFT's scale is lora_alpha / r always; alpha 0 means scale 1 here (llama.cpp's rule): write r
    j["lora_alpha"] = c.alpha != 0.0f ? (double) c.alpha : (double) c.rank;
    j["lora_dropout"] = 0.0;
    j["target_modules"] = targets;
    j["bias"] = "none";
    j["fan_in_fan_out"] = false;
    j["use_rslora"] = false;
    j["use_dora"] = false;
    if (c.init == LoraInit::Gaussian) j["init_lora_weights"] = "gaussian";
    else j["init_lora_weights"] = true;
    j["modules_to_save"] = nullptr;
    j["layers_to_transform"] = nullptr;
    j["layers_pattern"] = nullptr;
    j["rank_pattern"] = nlohmann::json::object();
    j["alpha_pattern"] = nlohmann::json::object();
    return j.dump(2) + "\n";
}

bool lora_load_gguf(Qwen2Model & m, const std::string & path, std::string * err) {
    auto fail = [&](const std::string & msg) {
        if (err) *err = path + ": " + msg;
        return false;
    };
    GGUFReader r;
    if (r.open(path, err) != GGUF_OK) return false;
    auto get_str = [&](const char * key, std::string * v) {
        const GGUFValue * x = r.find(key);
        if (!x) return fail(std::string("key '") + key + "' is missing (not a llama.cpp LoRA adapter?)");
        if (x->type() != GGUF_TYPE_STRING) return fail(std::string("key '") + key + "' is not a string");
        *v = x->str();
        return true;
    };
    std::string type, arch, adapter_type;
    if (!get_str("general.type", &type)) return false;
    if (type != "adapter") return fail("general.type is '" + type + "', expected 'adapter'");
    if (!get_str("adapter.type", &adapter_type)) return false;
    if (adapter_type != "lora") return fail("adapter.type is '" + adapter_type + "', expected 'lora'");
    if (!get_str("general.architecture", &arch)) return false;
    if (arch != decoder_arch_name(m.cfg.arch))
        return fail("general.architecture is '" + arch + "' but the base model is '" + decoder_arch_name(m.cfg.arch) + "'");
    LoraConfig c;
    c.alpha = 0.0f;  // llama.cpp: absent means 0, i.e. scale 1
    if (const GGUFValue * x = r.find("adapter.lora.alpha")) {
        if (x->type() != GGUF_TYPE_FLOAT32) return fail("key 'adapter.lora.alpha' is not an f32");
        if (r.get_f32("adapter.lora.alpha", &c.alpha, err) != GGUF_OK) return false;
        if (!std::isfinite(c.alpha)) return fail("adapter.lora.alpha is not finite");
    }
    if (r.find("oomb.lora.init")) {
        std::string init;
        if (!get_str("oomb.lora.init", &init)) return false;
        std::string perr;
        if (!lora_parse_init(init, &c.init, &perr)) return fail("oomb.lora.init is '" + init + "' (default or gaussian)");
    }
    // every tensor: <base block projection>.lora_a / .lora_b
    std::map<std::string, std::pair<int64_t, int>> base;  // base name -> (layer, target)
    for (int64_t l = 0; l < m.cfg.n_layer; l++)
        for (int t = 0; t < kLoraTargets; t++) base[base_weight(m.layers[(size_t) l], kTargets[t].slot)->name] = {l, t};
    std::map<std::pair<int64_t, int>, std::pair<const GGUFTensorInfo *, const GGUFTensorInfo *>> pairs;
    for (const GGUFTensorInfo & ti : r.tensors()) {
        const std::string & n = ti.name;
        const bool is_a = n.size() > 7 && n.compare(n.size() - 7, 7, SUFFIX_A) == 0;
        const bool is_b = n.size() > 7 && n.compare(n.size() - 7, 7, SUFFIX_B) == 0;
        if (!is_a && !is_b) return fail("tensor '" + n + "' is neither a .lora_a nor a .lora_b");
        auto it = base.find(n.substr(0, n.size() - 7));
        if (it == base.end())
            return fail("tensor '" + n + "' adapts '" + n.substr(0, n.size() - 7) + "', which is not a block projection (" +
                        lora_targets_string(kLoraAllTargets) + ") of the base model");
        if (ti.type != GGUF_TENSOR_F32 && ti.type != GGUF_TENSOR_F16 && ti.type != GGUF_TENSOR_BF16) {
            const char * tn = gguf_tensor_type_name(ti.type);
            return fail("tensor '" + n + "' has type " + (tn ? tn : std::to_string(ti.type)) + ", expected F32, F16 or BF16");
        }
        auto & p = pairs[it->second];
        (is_a ? p.first : p.second) = &ti;
    }
    if (pairs.empty()) return fail("the adapter holds no tensors");
    c.targets = 0;
    c.rank = 0;
    for (const auto & kv : pairs) {
        const oomb_tensor * w = base_weight(m.layers[(size_t) kv.first.first], kTargets[kv.first.second].slot);
        const GGUFTensorInfo * ta = kv.second.first, * tb = kv.second.second;
        if (!ta || !tb) return fail(std::string("the pair of '") + w->name + "' lacks its " + (ta ? ".lora_b" : ".lora_a"));
        // llama.cpp's checks: base ne[0] == a ne[0], base ne[1] == b ne[1], a ne[1] == b ne[0]
        if (ta->n_dims != 2 || tb->n_dims != 2 || ta->ne[0] != w->ne[0] || tb->ne[1] != w->ne[1] || ta->ne[1] != tb->ne[0])
            return fail(std::string("tensors '") + ta->name + "' ne " + shape_str(ta->ne, (int) ta->n_dims) + " and '" + tb->name + "' ne " +
                        shape_str(tb->ne, (int) tb->n_dims) + " do not fit '" + w->name + "' ne " + shape_str(w->ne, 2) +
                        " (expected [" + std::to_string(w->ne[0]) + ", r] and [r, " + std::to_string(w->ne[1]) + "])");
        if (c.rank == 0) c.rank = ta->ne[1];
        if (ta->ne[1] != c.rank)
            return fail(std::string("tensor '") + ta->name + "' has rank " + std::to_string(ta->ne[1]) + ", the others " + std::to_string(c.rank) +
                        " (one rank per adapter is supported)");
        c.targets |= 1u << kv.first.second;
    }
    // a partial adapter (some layers, some targets) adapts exactly the pairs it holds, as llama.cpp
    // applies one: c.targets is the union, the other projections get no delta
    std::vector<std::array<bool, kLoraTargets>> present((size_t) m.cfg.n_layer);
    for (auto & p : present) p.fill(false);
    for (const auto & kv : pairs) present[(size_t) kv.first.first][(size_t) kv.first.second] = true;
    auto a = make_adapter(m, c, err, &present);
    if (!a) return fail(*err);
    for (int64_t l = 0; l < m.cfg.n_layer; l++) {
        for (int t = 0; t < kLoraTargets; t++) {
            const LoraWeight & lw = a->layers[(size_t) l][(size_t) t];
            if (!lw.a) continue;
            for (oomb_tensor * x : {lw.a, lw.b}) {
                std::vector<float> v((size_t) oomb_nelements(x));
                if (r.read_tensor(x->name, GGUF_TENSOR_F32, v.data(), v.size() * 4, err) != GGUF_OK) return false;
                const int64_t qk_heads = llama_qk_heads(m.cfg, kTargets[t].slot);
                if (x == lw.b && qk_heads) llama_unpermute_qk_rows(v.data(), qk_heads, m.cfg.head_dim, (size_t) x->ne[0] * 4);
                oomb_tensor_set(x, v.data(), 0, v.size() * 4);
            }
        }
    }
    m.lora = std::move(a);
    return true;
}

} // namespace oomb
