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

static bool read_hf_config_checked(const std::string& path, Qwen2Config* d, bool* has_rope_theta, std::string* name_or_path,
                                   std::vector<float>* rope_freqs, std::string* err, bool* tie_given) {
    rope_freqs->clear();
    if (tie_given) *tie_given = false;
    json c;
    if (!read_json(path, &c, err)) return false;
    if (!c.is_object()) { *err = path + ": not a JSON object"; return false; }
    // Multimodal wrappers keep the language model under text_config.
    if (c.contains("text_config") && c["text_config"].is_object() && !c.contains("hidden_size")) c = c["text_config"];
    // a flag or a name present with another JSON type is an error naming it (json::value would throw); null is unset
    auto typed = [&](const char* key, bool (json::*is)() const noexcept, const char* what) {
        if (!c.contains(key) || c[key].is_null() || (c[key].*is)()) return true;
        *err = path + ": '" + key + "' is not " + what + " (" + c[key].dump() + ")";
        return false;
    };
    for (const char* b : {"tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias"})
        if (!typed(b, &json::is_boolean, "a boolean")) return false;
    if (!typed("model_type", &json::is_string, "a string")) return false;  // (_name_or_path, only the file's name: not checked)
    auto flag = [&](const char* key) { return c.contains(key) && c[key].is_boolean() && c[key].get<bool>(); };
    std::string mt = c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : std::string();
    if (mt.empty()) mt = QWEN2_ARCH;
    if (!decoder_arch_from_name(mt, &d->arch)) {
        *err = path + ": model_type is '" + mt + "'; only qwen2 and llama checkpoints are supported";
        return false;
    }
    const bool llama = d->arch == DecoderArch::Llama;
    if (llama) {
        // the model has no q/k/v/o or MLP biases
        for (const char* b : {"attention_bias", "mlp_bias"})
            if (flag(b)) { *err = path + ": " + b + " is true; Llama checkpoints with biases are not supported"; return false; }
    }
    struct Req { const char* key; int64_t* dst; };
    Req req[] = {{"vocab_size", &d->n_vocab}, {"hidden_size", &d->n_embd}, {"intermediate_size", &d->n_ff},
                 {"num_hidden_layers", &d->n_layer}, {"num_attention_heads", &d->n_head}};
    for (auto& r : req)
        if (!get_int(c, r.key, r.dst)) { *err = path + ": missing or non-integer '" + r.key + "'"; return false; }
    if (!get_int(c, "num_key_value_heads", &d->n_head_kv)) d->n_head_kv = d->n_head;
    if (!get_int(c, "max_position_embeddings", &d->n_ctx_train)) d->n_ctx_train = 32768;
    *has_rope_theta = false;
    // a key present with a value that is not a number is an error naming it (it used to be dropped: the model then
    // ran with another RoPE base or norm epsilon than it was trained with); null stands for unset, as in transformers
    auto present = [](const json& src, const char* key) { return src.contains(key) && !src[key].is_null(); };
    auto not_number = [&](const json& src, const char* key, const std::string& where) {
        if (!present(src, key) || src[key].is_number()) return false;
        *err = path + ": '" + where + key + "' is not a number (" + src[key].dump() + ")";
        return true;
    };
    auto theta = [&](const json& src, const std::string& where) {
        if (not_number(src, "rope_theta", where)) return false;
        if (!present(src, "rope_theta")) return true;
        d->rope_theta = (float)src["rope_theta"].get<double>();
        *has_rope_theta = true;
        return true;
    };
    if (present(c, "rope_theta")) {                                                 // transformers 4
        if (!theta(c, "")) return false;
        // both spellings with different values: which one a loader takes is not for the converter to guess
        if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
            const json& rp = c["rope_parameters"];
            const json& src = rp.contains("full_attention") && rp["full_attention"].is_object() ? rp["full_attention"] : rp;
            if (present(src, "rope_theta") && src["rope_theta"].is_number() && (float) src["rope_theta"].get<double>() != d->rope_theta) {
                *err = path + ": 'rope_theta' (" + c["rope_theta"].dump() + ") and 'rope_parameters' rope_theta (" + src["rope_theta"].dump() +
                       ") differ: keep the one the model was trained with";
                return false;
            }
        }
    } else if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) { // transformers 5
        const json& rp = c["rope_parameters"];
        const bool full = rp.contains("full_attention") && rp["full_attention"].is_object();
        if (!theta(full ? rp["full_attention"] : rp, full ? "rope_parameters.full_attention." : "rope_parameters.")) return false;
    }
    // RoPE scaling and sliding-window attention change the model's function: refused, never dropped
    // (except Llama 3.x's llama3 scaling, which becomes rope_freqs.weight, as in llama.cpp)
    auto rope_kind = [](const json& src, const char* key) -> std::string {
        if (!src.contains(key) || !src[key].is_object()) return "";
        const json& o = src[key];
        for (const char* t : {"rope_type", "type"})
            if (o.contains(t) && o[t].is_string()) return o[t].get<std::string>();
        return "";
    };
    bool llama3 = false;
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
        const std::string kind = rope_kind(c, key);
        if (kind.empty() || kind == "default") continue;
        if (llama && kind == "llama3") { llama3 = true; continue; }
        *err = path + ": " + key + " of type '" + kind + "' is not supported (" +
               (llama ? "plain RoPE or Llama 3.x's llama3 frequency factors only" : "plain RoPE only") + ")";
        return false;
    }
    if (flag("use_sliding_window")) {
        *err = path + ": use_sliding_window is true: sliding-window attention is not supported (full causal attention only)";
        return false;
    }
    if (not_number(c, "rms_norm_eps", "")) return false;
    if (present(c, "rms_norm_eps")) d->rms_eps = (float)c["rms_norm_eps"].get<double>();
    d->tied = flag("tie_word_embeddings");
    if (tie_given) *tie_given = c.contains("tie_word_embeddings") && c["tie_word_embeddings"].is_boolean();
    if (name_or_path) {
        auto it = c.find("_name_or_path");
        *name_or_path = it != c.end() && it->is_string() ? it->get<std::string>() : "";
    }
    // Qwen2's head size is hidden_size / num_attention_heads; Llama's config may give head_dim
    if (!(llama && get_int(c, "head_dim", &d->head_dim) && d->head_dim > 0)) {
        if (d->n_head > 0 && d->n_embd % d->n_head != 0) {
            *err = path + ": hidden_size " + std::to_string(d->n_embd) + " is not a multiple of num_attention_heads " +
                   std::to_string(d->n_head);
            return false;
        }
        d->head_dim = d->n_head > 0 ? d->n_embd / d->n_head : 0;
    }
    d->rope_freqs = llama3;
    if (!qwen2_config_valid(*d, err)) { *err = path + ": " + *err; return false; }
    if (llama3) {
        // llama.cpp's LlamaModel.generate_extra_tensors: rope_freqs.weight from the llama3 scaling
        Llama3RopeScaling s;
        bool found = false;
        if (!hf_llama3_rope_scaling(c.dump(), &s, &found, err) ||
            !llama3_rope_freq_factors(s, (int)d->head_dim, *has_rope_theta ? (double)d->rope_theta : 10000.0, rope_freqs, err)) {
            *err = path + ": " + *err;
            return false;
        }
    }
    return true;
}

// (a JSON value of an unexpected type that no check above names: an error naming the file, never an abort)
bool read_hf_config(const std::string& path, Qwen2Config* d, bool* has_rope_theta, std::string* name_or_path,
                    std::vector<float>* rope_freqs, std::string* err, bool* tie_given) {
    try {
        return read_hf_config_checked(path, d, has_rope_theta, name_or_path, rope_freqs, err, tie_given);
    } catch (const json::exception& e) {
        *err = path + ": unexpected JSON: " + e.what();
        return false;
    }
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

static bool write_hf_tokenizer_checked(const std::string& dir, int64_t n_rows, GGUFWriter& w, int64_t* n_tokens, std::string* err);
bool write_hf_tokenizer(const std::string& dir, int64_t n_rows, GGUFWriter& w, int64_t* n_tokens, std::string* err) {
    try {
        return write_hf_tokenizer_checked(dir, n_rows, w, n_tokens, err);
    } catch (const json::exception& e) {  // a value of an unexpected type in tokenizer.json / tokenizer_config.json
        *err = dir + ": tokenizer files: unexpected JSON: " + e.what();
        return false;
    }
}
static bool write_hf_tokenizer_checked(const std::string& dir, int64_t n_rows, GGUFWriter& w, int64_t* n_tokens, std::string* err) {
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
        *err = tp + ": pre-tokenizer is not Qwen2's split regex (found '" + pattern + "'); the converter writes only qwen2 "
               "tokenizers: convert the weights without this tokenizer.json (move it away) and train with --vocab or "
               "--data-bin, or start from a GGUF that carries the tokenizer (llama.cpp's convert_hf_to_gguf.py)";
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
        // the chat template: a string, or HF's named templates (a list of {"name", "template"}) as llama.cpp's
        // converter writes them: "default" as tokenizer.chat_template, the others as tokenizer.chat_template.NAME
        auto ct = cfg.find("chat_template");
        if (ct != cfg.end() && ct->is_string()) {
            w.set_string("tokenizer.chat_template", ct->get<std::string>());
        } else if (ct != cfg.end() && ct->is_array()) {
            for (const json& e : *ct) {
                if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") || !e["template"].is_string()) {
                    *err = dir + "/tokenizer_config.json: chat_template is a list whose entry " + e.dump().substr(0, 120) +
                           " is not {\"name\": string, \"template\": string}";
                    return false;
                }
                const std::string name = e["name"].get<std::string>();
                w.set_string(name == "default" ? std::string("tokenizer.chat_template") : "tokenizer.chat_template." + name,
                             e["template"].get<std::string>());
            }
        } else if (ct != cfg.end() && !ct->is_null()) {
            *err = dir + "/tokenizer_config.json: chat_template is neither a string nor a list of named templates (" +
                   ct->dump().substr(0, 120) + ")";
            return false;
        }
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
