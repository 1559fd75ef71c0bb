// Shared helpers of the gguf-tools. See qwen2-gguf.h.
#include "qwen2-gguf.h"

#include "tokenizer.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/stat.h>

namespace oomb {
namespace tools {

using nlohmann::json;

bool is_dir(const std::string& s) {
    struct stat st;
    return stat(s.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& s) {
    struct stat st;
    return stat(s.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

static bool read_json(const std::string& path, json* out, std::string* err) {
    std::ifstream f(path, std::ios::binary);
    if (!f) { *err = path + ": cannot open"; return false; }
    std::stringstream ss;
    ss << f.rdbuf();
    *out = json::parse(ss.str(), nullptr, false);
    if (out->is_discarded()) { *err = path + ": invalid JSON"; return false; }
    return true;
}

bool Qwen2Dims::valid(std::string* err) const {
    auto bad = [&](const std::string& m) { *err = "invalid Qwen2 dimensions: " + m; return false; };
    if (n_vocab <= 0 || n_embd <= 0 || n_ff <= 0 || n_layer <= 0 || n_head <= 0 || n_head_kv <= 0 || n_ctx <= 0)
        return bad("vocab, hidden, ffn, layers, heads, kv heads and context must all be positive");
    if (n_embd % n_head != 0) return bad("hidden size " + std::to_string(n_embd) + " is not a multiple of heads " + std::to_string(n_head));
    if (n_head % n_head_kv != 0) return bad("heads " + std::to_string(n_head) + " is not a multiple of kv heads " + std::to_string(n_head_kv));
    if (n_vocab > INT32_MAX || n_embd > INT32_MAX || n_ff > INT32_MAX || n_layer > INT32_MAX || n_head > INT32_MAX ||
        n_ctx > INT32_MAX)
        return bad("dimension too large");
    if ((n_embd / n_head) % 2 != 0) return bad("head size " + std::to_string(n_embd / n_head) + " is odd (RoPE rotates pairs)");
    // Written as float32: must stay finite and positive once rounded.
    if (!(std::isfinite((float)rope_theta) && (float)rope_theta > 0.0f)) return bad("rope_theta must be finite and > 0");
    if (!(std::isfinite((float)rms_eps) && (float)rms_eps > 0.0f)) return bad("rms_norm_eps must be finite and > 0");
    return true;
}

std::vector<Qwen2Tensor> qwen2_tensors(const Qwen2Dims& d) {
    const int64_t hd = d.n_embd / d.n_head, kv = d.n_head_kv * hd;
    std::vector<Qwen2Tensor> t;
    t.push_back({"token_embd.weight", "model.embed_tokens.weight", {d.n_embd, d.n_vocab}});
    for (int64_t l = 0; l < d.n_layer; l++) {
        const std::string b = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
        t.push_back({b + "attn_norm.weight", h + "input_layernorm.weight", {d.n_embd}});
        t.push_back({b + "attn_q.weight", h + "self_attn.q_proj.weight", {d.n_embd, d.n_embd}});
        t.push_back({b + "attn_q.bias", h + "self_attn.q_proj.bias", {d.n_embd}});
        t.push_back({b + "attn_k.weight", h + "self_attn.k_proj.weight", {d.n_embd, kv}});
        t.push_back({b + "attn_k.bias", h + "self_attn.k_proj.bias", {kv}});
        t.push_back({b + "attn_v.weight", h + "self_attn.v_proj.weight", {d.n_embd, kv}});
        t.push_back({b + "attn_v.bias", h + "self_attn.v_proj.bias", {kv}});
        t.push_back({b + "attn_output.weight", h + "self_attn.o_proj.weight", {d.n_embd, d.n_embd}});
        t.push_back({b + "ffn_norm.weight", h + "post_attention_layernorm.weight", {d.n_embd}});
        t.push_back({b + "ffn_gate.weight", h + "mlp.gate_proj.weight", {d.n_embd, d.n_ff}});
        t.push_back({b + "ffn_up.weight", h + "mlp.up_proj.weight", {d.n_embd, d.n_ff}});
        t.push_back({b + "ffn_down.weight", h + "mlp.down_proj.weight", {d.n_ff, d.n_embd}});
    }
    t.push_back({"output_norm.weight", "model.norm.weight", {d.n_embd}});
    if (!d.tied) t.push_back({"output.weight", "lm_head.weight", {d.n_embd, d.n_vocab}});
    return t;
}

std::string qwen2_gguf_name(const std::string& hf) {
    static const std::map<std::string, std::string> top = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
    };
    auto it = top.find(hf);
    if (it != top.end()) return it->second;
    static const std::string pre = "model.layers.";
    if (hf.compare(0, pre.size(), pre) != 0) return "";
    size_t i = pre.size(), j = i;
    while (j < hf.size() && isdigit((unsigned char)hf[j])) j++;
    if (j == i || j >= hf.size() || hf[j] != '.') return "";
    const std::string layer = hf.substr(i, j - i), rest = hf.substr(j + 1);
    static const std::map<std::string, std::string> per = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.o_proj.bias", "attn_output.bias"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    auto p = per.find(rest);
    if (p == per.end()) return "";
    return "blk." + std::to_string(std::stoll(layer)) + "." + p->second;
}

void write_qwen2_hparams(GGUFWriter& w, const Qwen2Dims& d) {
    w.set_u32("qwen2.block_count", (uint32_t)d.n_layer);
    w.set_u32("qwen2.context_length", (uint32_t)d.n_ctx);
    w.set_u32("qwen2.embedding_length", (uint32_t)d.n_embd);
    w.set_u32("qwen2.feed_forward_length", (uint32_t)d.n_ff);
    w.set_u32("qwen2.attention.head_count", (uint32_t)d.n_head);
    w.set_u32("qwen2.attention.head_count_kv", (uint32_t)d.n_head_kv);
    if (d.has_rope_theta) w.set_f32("qwen2.rope.freq_base", (float)d.rope_theta);
    w.set_f32("qwen2.attention.layer_norm_rms_epsilon", (float)d.rms_eps);
}

uint32_t llama_file_type(uint32_t t) {
    switch (t) {
    case GGUF_TENSOR_F32: return 0;  // LLAMA_FTYPE_ALL_F32
    case GGUF_TENSOR_F16: return 1;  // LLAMA_FTYPE_MOSTLY_F16
    case GGUF_TENSOR_BF16: return 32; // LLAMA_FTYPE_MOSTLY_BF16
    case GGUF_TENSOR_Q8_0: return 7;
    case GGUF_TENSOR_Q4_0: return 2;
    case GGUF_TENSOR_Q4_1: return 3;
    default: return 1024; // LLAMA_FTYPE_GUESSED
    }
}

static bool get_int(const json& c, const char* key, int64_t* out) {
    auto it = c.find(key);
    if (it == c.end() || !it->is_number_integer()) return false;
    *out = it->get<int64_t>();
    return true;
}

bool read_hf_config(const std::string& path, Qwen2Dims* d, std::string* name_or_path, std::string* err) {
    json c;
    if (!read_json(path, &c, err)) return false;
    if (!c.is_object()) { *err = path + ": not a JSON object"; return false; }
    // Multimodal wrappers keep the language model under text_config.
    if (c.contains("text_config") && c["text_config"].is_object() && !c.contains("hidden_size")) c = c["text_config"];
    std::string mt = c.value("model_type", std::string());
    if (!mt.empty() && mt != "qwen2") {
        *err = path + ": model_type is '" + mt + "'; only qwen2 checkpoints are supported";
        return false;
    }
    struct Req { const char* key; int64_t* dst; };
    Req req[] = {{"vocab_size", &d->n_vocab}, {"hidden_size", &d->n_embd}, {"intermediate_size", &d->n_ff},
                 {"num_hidden_layers", &d->n_layer}, {"num_attention_heads", &d->n_head}};
    for (auto& r : req)
        if (!get_int(c, r.key, r.dst)) { *err = path + ": missing or non-integer '" + r.key + "'"; return false; }
    if (!get_int(c, "num_key_value_heads", &d->n_head_kv)) d->n_head_kv = d->n_head;
    if (!get_int(c, "max_position_embeddings", &d->n_ctx)) d->n_ctx = 32768;
    d->has_rope_theta = false;
    if (c.contains("rope_theta") && c["rope_theta"].is_number()) {                 // transformers 4
        d->rope_theta = c["rope_theta"].get<double>();
        d->has_rope_theta = true;
    } else if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) { // transformers 5
        const json& rp = c["rope_parameters"];
        const json* src = &rp;
        if (rp.contains("full_attention") && rp["full_attention"].is_object()) src = &rp["full_attention"];
        if (src->contains("rope_theta") && (*src)["rope_theta"].is_number()) {
            d->rope_theta = (*src)["rope_theta"].get<double>();
            d->has_rope_theta = true;
        }
    }
    if (c.contains("rms_norm_eps") && c["rms_norm_eps"].is_number()) d->rms_eps = c["rms_norm_eps"].get<double>();
    d->tied = c.value("tie_word_embeddings", false);
    if (name_or_path) {
        auto it = c.find("_name_or_path");
        *name_or_path = it != c.end() && it->is_string() ? it->get<std::string>() : "";
    }
    return d->valid(err);
}

// llama.cpp's TextModel.does_token_look_special().
static bool looks_special(const std::string& t) {
    auto starts = [&](const char* p) { return t.compare(0, strlen(p), p) == 0; };
    auto ends = [&](const char* p) { size_t n = strlen(p); return t.size() >= n && t.compare(t.size() - n, n, p) == 0; };
    if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
    if (starts("<|") && ends("|>")) return true;
    if (starts("<\xEF\xBD\x9C") && ends("\xEF\xBD\x9C>")) return true; // <｜...｜>
    if (starts("<unused") && ends(">")) return true;
    return false;
}

bool write_hf_tokenizer(const std::string& dir, int64_t n_rows, GGUFWriter& w, int64_t* n_tokens, std::string* err) {
    json tok, cfg, conf;
    if (!read_json(dir + "/tokenizer.json", &tok, err)) return false;
    const bool has_cfg = is_file(dir + "/tokenizer_config.json");
    if (has_cfg && !read_json(dir + "/tokenizer_config.json", &cfg, err)) return false;
    const bool has_conf = is_file(dir + "/config.json");
    if (has_conf && !read_json(dir + "/config.json", &conf, err)) return false;
    const std::string tp = dir + "/tokenizer.json";
    if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) { *err = tp + ": no \"model\" object"; return false; }
    const json& model = tok["model"];
    if (model.value("type", std::string()) != "BPE") { *err = tp + ": model type is not BPE"; return false; }
    if (!model.contains("vocab") || !model["vocab"].is_object()) { *err = tp + ": model has no vocab"; return false; }

    // Pre-tokenizer: this converter knows the Qwen2 one (llama.cpp identifies it by hashing the
    // encoding of a test text; we check the regex instead).
    std::string pattern;
    if (tok.contains("pre_tokenizer") && tok["pre_tokenizer"].is_object()) {
        const json& pt = tok["pre_tokenizer"];
        std::vector<const json*> parts;
        if (pt.value("type", std::string()) == "Sequence" && pt.contains("pretokenizers"))
            for (auto& p : pt["pretokenizers"]) parts.push_back(&p);
        else parts.push_back(&pt);
        for (auto* p : parts)
            if (p->value("type", std::string()) == "Split" && p->contains("pattern") && (*p)["pattern"].contains("Regex"))
                pattern = (*p)["pattern"]["Regex"].get<std::string>();
    }
    const std::string qwen2_regex =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (pattern != qwen2_regex) {
        *err = tp + ": pre-tokenizer is not Qwen2's split regex (found '" + pattern + "'); only qwen2 is supported";
        return false;
    }

    // id -> token text, and which ids are added tokens.
    std::map<int64_t, std::string> id_to_tok;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it.value().is_number_integer()) { *err = tp + ": vocab entry '" + it.key() + "' has no integer id"; return false; }
        id_to_tok[it.value().get<int64_t>()] = it.key();
    }
    struct Added { std::string content; bool special; };
    std::map<int64_t, Added> added;
    if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
        for (auto& a : tok["added_tokens"]) {
            if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string()) {
                *err = tp + ": malformed added_tokens entry";
                return false;
            }
            const int64_t id = a["id"].get<int64_t>();
            added[id] = {a["content"].get<std::string>(), a.value("special", false)};
            id_to_tok[id] = a["content"].get<std::string>();
        }
    if (id_to_tok.empty() || id_to_tok.begin()->first < 0) { *err = tp + ": empty vocabulary or negative id"; return false; }
    const int64_t max_id = id_to_tok.rbegin()->first;
    int64_t n = n_rows;
    if (n == 0 && has_conf && conf.contains("vocab_size") && conf["vocab_size"].is_number_integer())
        n = conf["vocab_size"].get<int64_t>();
    if (n == 0) n = (int64_t)id_to_tok.size(); // llama.cpp: len(tokenizer.vocab)
    if (max_id >= n) {
        *err = tp + ": token id " + std::to_string(max_id) + " does not fit in " + std::to_string(n) + " embedding rows";
        return false;
    }
    std::vector<std::string> tokens((size_t)n);
    std::vector<int32_t> types((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        auto it = id_to_tok.find(i);
        if (it == id_to_tok.end()) {
            tokens[(size_t)i] = "[PAD" + std::to_string(i) + "]";
            types[(size_t)i] = GGUF_TOKEN_UNUSED;
            continue;
        }
        tokens[(size_t)i] = it->second;
        auto ad = added.find(i);
        if (ad != added.end())
            types[(size_t)i] = ad->second.special || looks_special(ad->second.content) ? GGUF_TOKEN_CONTROL : GGUF_TOKEN_USER_DEFINED;
        else
            types[(size_t)i] = GGUF_TOKEN_NORMAL;
    }

    std::vector<std::string> merges;
    if (model.contains("merges") && model["merges"].is_array()) {
        for (auto& m : model["merges"]) {
            if (m.is_string()) merges.push_back(m.get<std::string>());
            else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                // transformers >= 4.45 pairs; a space inside a part is written as U+0120 (llama.cpp)
                auto enc = [](const std::string& s) {
                    std::string o;
                    for (char ch : s) { if (ch == ' ') o += "\xC4\xA0"; else o += ch; }
                    return o;
                };
                merges.push_back(enc(m[0].get<std::string>()) + " " + enc(m[1].get<std::string>()));
            } else { *err = tp + ": unknown merges format"; return false; }
        }
    }
    if (merges.empty()) { *err = tp + ": no merges"; return false; }

    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set("tokenizer.ggml.tokens", GGUFValue::string_array(tokens));
    w.set("tokenizer.ggml.token_type", GGUFValue::array(types));
    w.set("tokenizer.ggml.merges", GGUFValue::string_array(merges));

    // gguf-py SpecialVocab: <typ>_token of tokenizer_config.json (string or {content}) looked up
    // among the added tokens, then <typ>_token_id of config.json; add_<typ>_token flags.
    static const std::pair<const char*, const char*> kinds[] = {
        {"bos", "tokenizer.ggml.bos_token_id"}, {"eos", "tokenizer.ggml.eos_token_id"},
        {"unk", "tokenizer.ggml.unknown_token_id"}, {"sep", "tokenizer.ggml.seperator_token_id"},
        {"pad", "tokenizer.ggml.padding_token_id"}, {"cls", "tokenizer.ggml.cls_token_id"},
        {"mask", "tokenizer.ggml.mask_token_id"}};
    std::map<std::string, int64_t> ids;
    if (has_cfg && cfg.is_object()) {
        for (auto& k : kinds) {
            const std::string typ = k.first;
            auto e = cfg.find(typ + "_token");
            std::string content;
            if (e == cfg.end()) continue;
            if (e->is_string()) content = e->get<std::string>();
            else if (e->is_object() && e->contains("content") && (*e)["content"].is_string()) content = (*e)["content"].get<std::string>();
            else continue;
            if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
                for (auto& a : tok["added_tokens"])
                    if (a.value("content", std::string()) == content) {
                        const int64_t id = a["id"].get<int64_t>();
                        if (id < n && !ids.count(typ)) ids[typ] = id;
                        break;
                    }
        }
    }
    if (has_conf && conf.is_object())
        for (auto& k : kinds) {
            const std::string typ = k.first;
            auto e = conf.find(typ + "_token_id");
            if (e != conf.end() && e->is_number_integer() && !ids.count(typ)) {
                const int64_t id = e->get<int64_t>();
                if (id >= 0 && id < n) ids[typ] = id;
            }
        }
    // Qwen2.5's published config.json sets bos_token_id = <|endoftext|>; without a config.json
    // (a tokenizer-only folder) use the same so vocab files match the published GGUFs.
    if (!ids.count("bos"))
        for (auto& a : added)
            if (a.second.content == "<|endoftext|>") { ids["bos"] = a.first; break; }
    for (auto& k : kinds) {
        auto it = ids.find(k.first);
        if (it != ids.end()) w.set_u32(k.second, (uint32_t)it->second);
    }
    if (has_cfg && cfg.is_object()) {
        for (auto& k : kinds) {
            auto e = cfg.find(std::string("add_") + k.first + "_token");
            if (e != cfg.end() && e->is_boolean())
                w.set_bool(std::string("tokenizer.ggml.add_") + k.first + "_token", e->get<bool>());
        }
        auto ct = cfg.find("chat_template");
        if (ct != cfg.end() && ct->is_string()) w.set_string("tokenizer.chat_template", ct->get<std::string>());
    }
    if (n_tokens) *n_tokens = n;
    return true;
}

bool copy_tokenizer(const GGUFReader& src, int64_t n_rows, GGUFWriter& w, std::string* err) {
    bool any = false;
    for (auto& kv : src.metadata()) {
        if (kv.first.compare(0, 10, "tokenizer.") != 0) continue;
        any = true;
        w.set(kv.first, kv.second);
    }
    if (!any) { *err = src.path() + ": holds no tokenizer.* metadata"; return false; }
    std::vector<std::string> tokens;
    if (src.get_string_array("tokenizer.ggml.tokens", &tokens, err)) return false;
    std::vector<int32_t> types(tokens.size(), GGUF_TOKEN_NORMAL);
    if (src.find("tokenizer.ggml.token_type") && src.get_i32_array("tokenizer.ggml.token_type", &types, err)) return false;
    if (types.size() != tokens.size()) { *err = src.path() + ": token_type and tokens differ in length"; return false; }
    if (n_rows > 0) {
        if ((int64_t)tokens.size() > n_rows) {
            *err = src.path() + ": " + std::to_string(tokens.size()) + " tokens do not fit in " + std::to_string(n_rows) +
                   " embedding rows";
            return false;
        }
        for (int64_t i = (int64_t)tokens.size(); i < n_rows; i++) {
            tokens.push_back("[PAD" + std::to_string(i) + "]");
            types.push_back(GGUF_TOKEN_UNUSED);
        }
    }
    w.set("tokenizer.ggml.tokens", GGUFValue::string_array(std::move(tokens)));
    w.set("tokenizer.ggml.token_type", GGUFValue::array(types));
    return true;
}

} // namespace tools
} // namespace oomb
