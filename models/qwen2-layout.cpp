// The Qwen2 GGUF layout: key table, tensor list, presets and the checks before allocation (see
// qwen2-layout.h).
#include "qwen2-layout.h"

#include <cinttypes>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

namespace oomb {

namespace {

std::string fmt(const char * f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char * f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof(buf), f, ap);
    va_end(ap);
    return buf;
}

void set_err(std::string * err, const std::string & m) {
    if (err) *err = m;
}

// One hyperparameter: its field in Qwen2Config, its GGUF key (after "<arch>.") and its HF
// config.json name. The order is llama.cpp's order of writing them.
struct Key {
    const char * field;
    const char * gguf;
    const char * hf;
    int64_t Qwen2Config::* i;  // integer field (u32 key), or
    float Qwen2Config::* f;    // float field (f32 key)
    bool required;             // in a GGUF file
};

const Key kKeys[] = {
    {"n_layer", "block_count", "num_hidden_layers", &Qwen2Config::n_layer, nullptr, true},
    {"n_ctx_train", "context_length", "max_position_embeddings", &Qwen2Config::n_ctx_train, nullptr, true},
    {"n_embd", "embedding_length", "hidden_size", &Qwen2Config::n_embd, nullptr, true},
    {"n_ff", "feed_forward_length", "intermediate_size", &Qwen2Config::n_ff, nullptr, true},
    {"n_head", "attention.head_count", "num_attention_heads", &Qwen2Config::n_head, nullptr, true},
    {"n_head_kv", "attention.head_count_kv", "num_key_value_heads", &Qwen2Config::n_head_kv, nullptr, false},
    {"rope_theta", "rope.freq_base", "rope_theta", nullptr, &Qwen2Config::rope_theta, false},
    {"rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", nullptr, &Qwen2Config::rms_eps, true},
    {"head_dim", "attention.key_length", "head_dim", &Qwen2Config::head_dim, nullptr, false},
};
constexpr const char * KEY_VALUE_LENGTH = "attention.value_length";  // written = key_length
// Llama only (llama.cpp's converter writes them): checked on read
constexpr const char * KEY_VOCAB_SIZE = "vocab_size";
constexpr const char * KEY_ROPE_DIM = "rope.dimension_count";
constexpr const char * KEY_ROPE_SCALING = "rope.scaling.type";
constexpr float DEFAULT_FREQ_BASE = 10000.0f;  // llama.cpp's, when rope.freq_base is absent

const Key & key_of(const char * field) {
    for (const Key & k : kKeys)
        if (strcmp(k.field, field) == 0) return k;
    return kKeys[0];  // unreachable: every caller names a field of the table
}

// "<arch>.<suffix>": the full GGUF key
std::string gkey(DecoderArch a, const char * suffix) { return std::string(decoder_arch_name(a)) + "." + suffix; }

// "n_embd (qwen2.embedding_length, HF hidden_size)"
std::string field_desc(DecoderArch a, const char * field) {
    const Key & k = key_of(field);
    return std::string(field) + " (" + gkey(a, k.gguf) + ", HF " + k.hf + ")";
}

// Whether a tensor is in an architecture's layout: required, optional (llama.cpp accepts it, this
// model refuses it) or not at all.
enum Need : uint8_t { REQ, OPT, NONE };

struct Block {
    const char * gguf;  // after "blk.N."
    const char * hf;    // after "model.layers.N."
    Qwen2TensorKind kind;
    Need need[2];       // by DecoderArch: Qwen2, Llama
    Qwen2Slot slot;
};

// The tensors of a block, in file order, then the optional ones.
const Block kBlock[] = {
    {"attn_norm.weight", "input_layernorm.weight", Qwen2TensorKind::Norm, {REQ, REQ}, Qwen2Slot::AttnNorm},
    {"attn_q.weight", "self_attn.q_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::Wq},
    {"attn_q.bias", "self_attn.q_proj.bias", Qwen2TensorKind::Bias, {REQ, OPT}, Qwen2Slot::Bq},
    {"attn_k.weight", "self_attn.k_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::Wk},
    {"attn_k.bias", "self_attn.k_proj.bias", Qwen2TensorKind::Bias, {REQ, OPT}, Qwen2Slot::Bk},
    {"attn_v.weight", "self_attn.v_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::Wv},
    {"attn_v.bias", "self_attn.v_proj.bias", Qwen2TensorKind::Bias, {REQ, OPT}, Qwen2Slot::Bv},
    {"attn_output.weight", "self_attn.o_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::Wo},
    {"ffn_norm.weight", "post_attention_layernorm.weight", Qwen2TensorKind::Norm, {REQ, REQ}, Qwen2Slot::FfnNorm},
    {"ffn_gate.weight", "mlp.gate_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::WGate},
    {"ffn_up.weight", "mlp.up_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::WUp},
    {"ffn_down.weight", "mlp.down_proj.weight", Qwen2TensorKind::Weight, {REQ, REQ}, Qwen2Slot::WDown},
    {"attn_output.bias", "self_attn.o_proj.bias", Qwen2TensorKind::Bias, {OPT, OPT}, Qwen2Slot::Bo},
};

// Whether arch's blocks have the q/k/v biases.
bool has_qkv_bias(DecoderArch a) { return kBlock[2].need[(int) a] == REQ; }

struct Global {
    const char * gguf;
    const char * hf;
    Qwen2TensorKind kind;
    Qwen2Slot slot;
};
const Global kEmbd = {"token_embd.weight", "model.embed_tokens.weight", Qwen2TensorKind::Weight, Qwen2Slot::TokEmbd};
const Global kOutNorm = {"output_norm.weight", "model.norm.weight", Qwen2TensorKind::Norm, Qwen2Slot::OutputNorm};
const Global kOutput = {"output.weight", "lm_head.weight", Qwen2TensorKind::Weight, Qwen2Slot::Output};
// Llama 3.x RoPE frequency factors (f32 {head_dim / 2}; llama.cpp computes them from HF's
// rope_scaling at conversion): in the Llama layout when the file has it (cfg.rope_freqs)
const Global kRopeFreqs = {"rope_freqs.weight", "", Qwen2TensorKind::Norm, Qwen2Slot::RopeFreqs};

// ggml shape of a block tensor.
std::vector<int64_t> block_ne(const Qwen2Config & c, Qwen2Slot slot) {
    const int64_t E = c.n_embd, Dq = c.n_head * c.head_dim, Dkv = c.n_head_kv * c.head_dim;
    switch (slot) {
    case Qwen2Slot::Wq: return {E, Dq};
    case Qwen2Slot::Bq: return {Dq};
    case Qwen2Slot::Wk: case Qwen2Slot::Wv: return {E, Dkv};
    case Qwen2Slot::Bk: case Qwen2Slot::Bv: return {Dkv};
    case Qwen2Slot::Wo: return {Dq, E};
    case Qwen2Slot::WGate: case Qwen2Slot::WUp: return {E, c.n_ff};
    case Qwen2Slot::WDown: return {c.n_ff, E};
    case Qwen2Slot::RopeFreqs: return {c.head_dim / 2};
    default: return {E};  // attn_norm, ffn_norm, attn_output.bias
    }
}

// Parses "blk.<N>." at the start of a name: N; -1 when the name does not start with "blk.", -2
// when N is not a plain decimal (no leading zero) below 2^31.
int64_t block_index(const std::string & name) {
    if (name.compare(0, 4, "blk.") != 0) return -1;
    size_t i = 4;
    int64_t n = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i < 4 + 10) n = n * 10 + (name[i++] - '0');
    if (i == 4 || i >= name.size() || name[i] != '.' || n > INT32_MAX || (name[4] == '0' && i > 5)) return -2;
    return n;
}

std::string ne_str(const int64_t * ne, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; i++) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

bool mul_ok(int64_t a, int64_t b, int64_t * out) { return !__builtin_mul_overflow(a, b, out); }
bool add_ok(int64_t a, int64_t b, int64_t * out) { return !__builtin_add_overflow(a, b, out); }

} // namespace

// ---------------------------------------------------------------------------------------------
// Configuration

// Published Qwen2.5 configs (Qwen/Qwen2.5-*-Instruct config.json: max_position_embeddings 32768).
bool qwen2_preset(const std::string & name, Qwen2Config * cfg) {
    Qwen2Config c;
    c.rope_theta = 1e6f;
    c.rms_eps = 1e-6f;
    c.n_ctx_train = 32768;
    if (name == "tiny") {
        c.n_vocab = 151936; c.n_embd = 64; c.n_ff = 192; c.n_layer = 2; c.n_head = 4; c.n_head_kv = 2; c.tied = true;
    } else if (name == "qwen2.5-0.5b") {
        c.n_vocab = 151936; c.n_embd = 896; c.n_ff = 4864; c.n_layer = 24; c.n_head = 14; c.n_head_kv = 2; c.tied = true;
    } else if (name == "qwen2.5-1.5b") {
        c.n_vocab = 151936; c.n_embd = 1536; c.n_ff = 8960; c.n_layer = 28; c.n_head = 12; c.n_head_kv = 2; c.tied = true;
    } else if (name == "qwen2.5-3b") {
        c.n_vocab = 151936; c.n_embd = 2048; c.n_ff = 11008; c.n_layer = 36; c.n_head = 16; c.n_head_kv = 2; c.tied = true;
    } else if (name == "qwen2.5-7b") {
        c.n_vocab = 152064; c.n_embd = 3584; c.n_ff = 18944; c.n_layer = 28; c.n_head = 28; c.n_head_kv = 4; c.tied = false;
    } else {
        return false;
    }
    c.head_dim = c.n_embd / c.n_head;
    *cfg = c;
    return true;
}

const std::vector<std::string> & qwen2_preset_names() {
    static const std::vector<std::string> names = {"tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"};
    return names;
}

std::string qwen2_preset_choices() {
    const std::vector<std::string> & n = qwen2_preset_names();
    std::string s;
    for (size_t i = 0; i < n.size(); i++) s += (i == 0 ? "" : i + 1 == n.size() ? " or " : ", ") + n[i];
    return s;
}

bool qwen2_config_valid(const Qwen2Config & c, std::string * err) {
    auto bad = [&](const std::string & what) {
        set_err(err, "bad model configuration: " + what);
        return false;
    };
    if (c.n_vocab <= 0 || c.n_vocab > INT32_MAX)
        return bad("n_vocab (rows of token_embd.weight, HF vocab_size) = " + std::to_string(c.n_vocab) + " must be from 1 to 2147483647");
    for (const Key & k : kKeys) {
        if (!k.i) continue;
        const int64_t v = c.*k.i;
        if (v <= 0 || v > INT32_MAX) return bad(field_desc(c.arch, k.field) + " = " + std::to_string(v) + " must be from 1 to 2147483647");
    }
    if (c.n_head % c.n_head_kv != 0)
        return bad("n_head " + std::to_string(c.n_head) + " is not a multiple of n_head_kv " + std::to_string(c.n_head_kv) + " (" +
                   gkey(c.arch, key_of("n_head").gguf) + ", " + gkey(c.arch, key_of("n_head_kv").gguf) + ")");
    if (c.head_dim % 2 != 0) return bad(field_desc(c.arch, "head_dim") + " = " + std::to_string(c.head_dim) + " must be even (RoPE rotates pairs)");
    int64_t dq = 0;
    if (!mul_ok(c.n_head, c.head_dim, &dq) || dq > INT32_MAX)
        return bad("n_head * head_dim = " + std::to_string(c.n_head) + " * " + std::to_string(c.head_dim) + " exceeds 2147483647");
    int64_t n = 0;
    if (!qwen2_n_elements(c, &n)) return bad("the model's element count overflows 64 bits");
    if (c.rope_freqs && c.arch != DecoderArch::Llama) return bad("rope_freqs.weight (RoPE frequency factors) is only part of the Llama layout");
    // Written as float32: must be finite and positive as such.
    if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0.0f)) return bad(field_desc(c.arch, "rope_theta") + " must be finite and > 0");
    if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0.0f)) return bad(field_desc(c.arch, "rms_eps") + " must be finite and > 0");
    return true;
}

bool qwen2_n_elements(const Qwen2Config & c, int64_t * out) {
    // per block: 2 norms, q/k/v/o weights and q/k/v biases, 3 MLP matrices; every term of int32 sizes
    int64_t dq, dkv, t, blk = 0, n = 0;
    if (!mul_ok(c.n_head, c.head_dim, &dq) || !mul_ok(c.n_head_kv, c.head_dim, &dkv)) return false;
    const int64_t nb = has_qkv_bias(c.arch) ? 1 : 0;  // the q/k/v biases
    const int64_t terms[][2] = {{2, c.n_embd}, {c.n_embd, dq}, {dq, nb}, {2 * c.n_embd, dkv}, {2 * nb, dkv},
                                {dq, c.n_embd}, {3 * c.n_embd, c.n_ff}};
    for (auto & p : terms)
        if (!mul_ok(p[0], p[1], &t) || !add_ok(blk, t, &blk)) return false;
    if (!mul_ok(blk, c.n_layer, &n)) return false;
    if (!mul_ok(c.n_vocab, c.n_embd, &t) || !add_ok(n, t, &n) || !add_ok(n, c.n_embd, &n)) return false;
    if (!c.tied && (!mul_ok(c.n_vocab, c.n_embd, &t) || !add_ok(n, t, &n))) return false;
    *out = n;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Tensors

std::vector<Qwen2TensorSpec> qwen2_tensors(const Qwen2Config & c, bool with_optional) {
    std::vector<Qwen2TensorSpec> t;
    const int a = (int) c.arch;
    auto blocks = [&](Need need) {
        for (int64_t l = 0; l < c.n_layer; l++) {
            const std::string b = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
            for (const Block & k : kBlock)
                if (k.need[a] == need) t.push_back({b + k.gguf, h + k.hf, block_ne(c, k.slot), k.kind, need == OPT, l, k.slot});
        }
    };
    t.push_back({kEmbd.gguf, kEmbd.hf, {c.n_embd, c.n_vocab}, kEmbd.kind, false, -1, kEmbd.slot});
    blocks(REQ);
    t.push_back({kOutNorm.gguf, kOutNorm.hf, {c.n_embd}, kOutNorm.kind, false, -1, kOutNorm.slot});
    if (!c.tied) t.push_back({kOutput.gguf, kOutput.hf, {c.n_embd, c.n_vocab}, kOutput.kind, false, -1, kOutput.slot});
    const bool llama = c.arch == DecoderArch::Llama;
    auto rope_freqs = [&](bool optional) {
        t.push_back({kRopeFreqs.gguf, kRopeFreqs.hf, block_ne(c, kRopeFreqs.slot), kRopeFreqs.kind, optional, -1, kRopeFreqs.slot});
    };
    if (llama && c.rope_freqs) rope_freqs(false);
    if (with_optional) {
        blocks(OPT);
        if (llama && !c.rope_freqs) rope_freqs(true);
    }
    return t;
}

std::string qwen2_gguf_name(const std::string & hf) {
    for (const Global * g : {&kEmbd, &kOutNorm, &kOutput})
        if (hf == g->hf) return g->gguf;
    static const std::string pre = "model.layers.";
    if (hf.compare(0, pre.size(), pre) != 0) return "";
    size_t i = pre.size(), j = i;
    while (j < hf.size() && j - i < 10 && hf[j] >= '0' && hf[j] <= '9') j++;
    if (j == i || j >= hf.size() || hf[j] != '.') return "";
    const std::string rest = hf.substr(j + 1);
    for (const Block & k : kBlock)
        if (rest == k.hf) return "blk." + std::to_string(std::stoll(hf.substr(i, j - i))) + "." + k.gguf;
    return "";
}

// ---------------------------------------------------------------------------------------------
// Metadata

const char * decoder_arch_name(DecoderArch a) { return a == DecoderArch::Llama ? "llama" : QWEN2_ARCH; }

bool decoder_arch_from_name(const std::string & name, DecoderArch * a) {
    for (DecoderArch x : {DecoderArch::Qwen2, DecoderArch::Llama})
        if (name == decoder_arch_name(x)) {
            *a = x;
            return true;
        }
    return false;
}

void qwen2_write_hparams(GGUFWriter & w, const Qwen2Config & c, bool write_rope_theta) {
    const DecoderArch a = c.arch;
    if (a == DecoderArch::Llama) w.set_u32(gkey(a, KEY_VOCAB_SIZE), (uint32_t) c.n_vocab);
    for (const Key & k : kKeys) {
        if (k.i == &Qwen2Config::head_dim) {
            if (c.n_head > 0 && c.head_dim == c.n_embd / c.n_head) continue;  // the default: llama.cpp derives it
            w.set_u32(gkey(a, k.gguf), (uint32_t) c.head_dim);
            w.set_u32(gkey(a, KEY_VALUE_LENGTH), (uint32_t) c.head_dim);
        } else if (k.i) {
            w.set_u32(gkey(a, k.gguf), (uint32_t) (c.*k.i));
        } else if (write_rope_theta || k.f != &Qwen2Config::rope_theta) {
            w.set_f32(gkey(a, k.gguf), c.*k.f);
        }
    }
    if (a == DecoderArch::Llama) w.set_u32(gkey(a, KEY_ROPE_DIM), (uint32_t) c.head_dim);
}

gguf_status qwen2_read_config(const GGUFReader & r, Qwen2Config * out, std::string * err) {
    return decoder_read_config(r, DecoderArch::Qwen2, out, err);
}

gguf_status decoder_read_config(const GGUFReader & r, DecoderArch a, Qwen2Config * out, std::string * err) {
    const std::string & path = r.path();
    std::string arch;
    if (gguf_status s = r.get_string("general.architecture", &arch, err)) return s;
    if (arch != decoder_arch_name(a)) {
        set_err(err, path + ": general.architecture is '" + arch + "', expected '" + decoder_arch_name(a) + "'");
        return GGUF_ERR_TYPE;
    }
    Qwen2Config c;
    c.arch = a;
    c.n_ctx_train = 0;
    c.rope_theta = DEFAULT_FREQ_BASE;
    c.n_head_kv = 0;
    c.head_dim = 0;
    for (const Key & k : kKeys) {
        const std::string key = gkey(a, k.gguf);
        if (!r.find(key)) {
            if (!k.required) continue;
            set_err(err, path + ": key '" + key + "' is missing");
            return GGUF_ERR_NOT_FOUND;
        }
        if (k.f) {
            if (gguf_status s = r.get_f32(key, &(c.*k.f), err)) return s;
            continue;
        }
        uint32_t v = 0;  // llama.cpp's keys are u32: a larger value is out of range, not truncated
        if (gguf_status s = r.get_u32(key, &v, err)) return s;
        if (v == 0) {
            set_err(err, path + ": key '" + key + "' is 0");
            return GGUF_ERR_TYPE;
        }
        c.*k.i = v;
    }
    if (c.n_ctx_train == 0) c.n_ctx_train = 32768;  // key absent: the Qwen2.5 default
    if (c.n_head_kv == 0) c.n_head_kv = c.n_head;
    if (c.head_dim == 0) {
        if (c.n_embd % c.n_head != 0) {
            set_err(err, path + fmt(": inconsistent attention shape: embedding_length %" PRId64 " is not a multiple of head_count %" PRId64
                                    " (and no %s)", c.n_embd, c.n_head, gkey(a, key_of("head_dim").gguf).c_str()));
            return GGUF_ERR_TYPE;
        }
        c.head_dim = c.n_embd / c.n_head;
    }
    // keys that must agree with the others when present: value_length (both), rope.dimension_count
    // (llama.cpp writes it for Llama: partial RoPE is not supported), rope.scaling.type
    for (const char * suffix : {KEY_VALUE_LENGTH, KEY_ROPE_DIM}) {
        const std::string key = gkey(a, suffix);
        if (!r.find(key)) continue;
        uint32_t v = 0;
        if (gguf_status s = r.get_u32(key, &v, err)) return s;
        if ((int64_t) v != c.head_dim) {
            set_err(err, path + fmt(": key '%s' = %u differs from the key head size %" PRId64 " (the attention needs %s)", key.c_str(), v,
                                    c.head_dim, suffix == KEY_ROPE_DIM ? "RoPE over the whole head" : "equal sizes"));
            return GGUF_ERR_TYPE;
        }
    }
    if (r.find(gkey(a, KEY_ROPE_SCALING))) {
        std::string type;
        if (gguf_status s = r.get_string(gkey(a, KEY_ROPE_SCALING), &type, err)) return s;
        if (type != "none") {
            set_err(err, path + ": key '" + gkey(a, KEY_ROPE_SCALING) + "' is '" + type +
                             "': scaled RoPE is not supported (only rope.freq_base; use --rope-theta)");
            return GGUF_ERR_TYPE;
        }
    }
    // the tensor table: vocabulary, blocks present, tied head
    const GGUFTensorInfo * emb = r.find_tensor(kEmbd.gguf);
    if (!emb) {
        set_err(err, path + ": no tensor 'token_embd.weight' (a vocab-only or incomplete file?)");
        return GGUF_ERR_NOT_FOUND;
    }
    if (emb->n_dims != 2 || emb->ne[0] != c.n_embd || emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX) {
        set_err(err, path + fmt(": tensor 'token_embd.weight' has ne %s, expected [%" PRId64 " (%s), n_vocab]",
                                ne_str(emb->ne, emb->n_dims).c_str(), c.n_embd, gkey(a, key_of("n_embd").gguf).c_str()));
        return GGUF_ERR_TYPE;
    }
    std::set<int64_t> blocks;  // at most one entry per tensor of the file
    for (const GGUFTensorInfo & t : r.tensors()) {
        const int64_t b = block_index(t.name);
        if (b == -2) {
            set_err(err, path + ": tensor '" + t.name + "' has an invalid block number");
            return GGUF_ERR_TYPE;
        }
        if (b < 0) continue;
        if (b >= c.n_layer) {
            set_err(err, path + fmt(": tensor '%s' belongs to block %" PRId64 " but %s = %" PRId64, t.name.c_str(), b,
                                    gkey(a, key_of("n_layer").gguf).c_str(), c.n_layer));
            return GGUF_ERR_TYPE;
        }
        blocks.insert(b);
    }
    if ((int64_t) blocks.size() != c.n_layer) {
        set_err(err, path + fmt(": %s = %" PRId64 " but the file has tensors of %zu blocks", gkey(a, key_of("n_layer").gguf).c_str(),
                                c.n_layer, blocks.size()));
        return GGUF_ERR_TYPE;
    }
    c.n_vocab = emb->ne[1];
    c.tied = r.find_tensor(kOutput.gguf) == nullptr;
    c.rope_freqs = a == DecoderArch::Llama && r.find_tensor(kRopeFreqs.gguf) != nullptr;
    if (r.find(gkey(a, KEY_VOCAB_SIZE))) {
        uint32_t v = 0;
        if (gguf_status s = r.get_u32(gkey(a, KEY_VOCAB_SIZE), &v, err)) return s;
        if ((int64_t) v != c.n_vocab) {
            set_err(err, path + fmt(": key '%s' = %u differs from the %" PRId64 " rows of token_embd.weight", gkey(a, KEY_VOCAB_SIZE).c_str(),
                                    v, c.n_vocab));
            return GGUF_ERR_TYPE;
        }
    }
    if (!qwen2_config_valid(c, err)) {
        if (err) *err = path + ": " + *err;
        return GGUF_ERR_TYPE;
    }
    *out = c;
    return GGUF_OK;
}

gguf_status qwen2_check_tensors(const GGUFReader & r, const Qwen2Config & c, bool allow_optional, std::string * err) {
    const std::string & path = r.path();
    std::map<std::string, const Qwen2TensorSpec *> by_name;
    const std::vector<Qwen2TensorSpec> specs = qwen2_tensors(c, true);
    for (const Qwen2TensorSpec & s : specs) by_name[s.name] = &s;
    for (const GGUFTensorInfo & t : r.tensors()) {
        auto it = by_name.find(t.name);
        const std::string arch = c.arch == DecoderArch::Llama ? "Llama" : "Qwen2";
        if (it == by_name.end()) {
            set_err(err, path + ": tensor '" + t.name + "' is not part of the " + arch + " layout");
            return GGUF_ERR_TYPE;
        }
        if (it->second->optional && !allow_optional) {
            set_err(err, path + ": tensor '" + t.name + "' (optional in llama.cpp's layout" +
                             (it->second->slot == Qwen2Slot::RopeFreqs ? ": Llama 3.x RoPE frequency factors" : "") +
                             ") is not supported by this " + arch + " model");
            return GGUF_ERR_TYPE;
        }
    }
    for (const Qwen2TensorSpec & s : specs) {
        const GGUFTensorInfo * t = r.find_tensor(s.name);
        if (!t) {
            if (s.optional) continue;
            set_err(err, path + ": tensor '" + s.name + "' is missing");
            return GGUF_ERR_NOT_FOUND;
        }
        bool same = t->n_dims == s.ne.size();
        for (size_t i = 0; same && i < s.ne.size(); i++) same = t->ne[i] == s.ne[i];
        if (!same) {
            set_err(err, path + ": tensor '" + s.name + "' has ne " + ne_str(t->ne, t->n_dims) + ", expected " +
                             ne_str(s.ne.data(), s.ne.size()));
            return GGUF_ERR_TYPE;
        }
        if (s.slot == Qwen2Slot::RopeFreqs && t->type != GGUF_TENSOR_F32) {
            const char * tn = gguf_tensor_type_name(t->type);
            set_err(err, path + ": tensor '" + s.name + "' (Llama 3.x RoPE frequency factors) has type " + (tn ? tn : std::to_string(t->type)) +
                             ", expected F32 (as llama.cpp writes it)");
            return GGUF_ERR_TYPE;
        }
        if (!gguf_tensor_type_supported(t->type)) {
            const char * tn = gguf_tensor_type_name(t->type);
            set_err(err, path + ": tensor '" + s.name + "' has type " + (tn ? tn : std::to_string(t->type)) +
                             ", which cannot be read (supported: " + gguf_tensor_types_supported_list() + ")");
            return GGUF_ERR_TYPE;
        }
    }
    return GGUF_OK;
}

bool rope_freqs_valid(const float * v, int64_t n, std::string * err) {
    for (int64_t i = 0; i < n; i++)
        if (!(std::isfinite(v[i]) && v[i] > 0.0f)) {
            set_err(err, fmt("tensor '%s' (Llama 3.x RoPE frequency factors): value %" PRId64 " is %g, must be finite and > 0",
                             kRopeFreqs.gguf, i, (double) v[i]));
            return false;
        }
    return true;
}

// The summary view declared in gguf.h (GGUFQwen2Hparams), kept for the tools and tests.
gguf_status gguf_read_qwen2_hparams(const GGUFReader & r, GGUFQwen2Hparams * hp, std::string * err) {
    Qwen2Config c;
    if (gguf_status s = qwen2_read_config(r, &c, err)) return s;
    GGUFQwen2Hparams h;
    h.n_vocab = (uint32_t) c.n_vocab;
    h.n_ctx_train = (uint32_t) c.n_ctx_train;
    h.n_embd = (uint32_t) c.n_embd;
    h.n_ff = (uint32_t) c.n_ff;
    h.n_layer = (uint32_t) c.n_layer;
    h.n_head = (uint32_t) c.n_head;
    h.n_head_kv = (uint32_t) c.n_head_kv;
    h.rope_freq_base = c.rope_theta;
    h.rms_norm_eps = c.rms_eps;
    h.tied_embeddings = c.tied;
    *hp = h;
    return GGUF_OK;
}

} // namespace oomb
