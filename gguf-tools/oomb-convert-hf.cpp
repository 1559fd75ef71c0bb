// oomb-convert-hf: converts a Hugging Face Qwen2 or Llama checkpoint folder to GGUF with llama.cpp's
// tensor names and metadata keys (what llama.cpp's convert_hf_to_gguf.py writes for Qwen2 / Llama,
// including Llama's permutation of the q_proj / k_proj rows for interleaved RoPE: llama-layout.h).
//
//   oomb-convert-hf HF_DIR -o OUT.gguf [--outtype f32|f16|bf16] [--vocab-only]
//
// HF_DIR holds config.json (transformers 4 or 5 style), model.safetensors or sharded
// *.safetensors with model.safetensors.index.json, and optionally tokenizer.json /
// tokenizer_config.json. Linear weights keep their bytes: a PyTorch [out, in] tensor becomes a
// GGUF tensor with ne = {in, out}. 2-D tensors get the output type (default: the checkpoint's own,
// so the default conversion is bit-exact); 1-D tensors (norms, biases) are F32, as llama.cpp does.
// A Llama config with rope_type llama3 (Llama 3.1+) gets rope_freqs.weight, F32 {head_dim / 2},
// computed from its rope scaling (models/rope-scaling.h), as llama.cpp's converter writes it.
#include "qwen2-gguf.h"
#include "llama-layout.h"

#include "gguf.h"
#include "safetensors.h"

#include <CLI/CLI.hpp>
#include "tool-cli.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>

using namespace oomb;
using namespace oomb::tools;

namespace {

uint32_t ggml_type_of(SafetensorsDtype t) {
    switch (t) {
    case SafetensorsDtype::F16: return GGUF_TENSOR_F16;
    case SafetensorsDtype::BF16: return GGUF_TENSOR_BF16;
    default: return GGUF_TENSOR_F32;
    }
}

// Streams one tensor's values, converted to `out_type`, into the writer.
bool write_converted(GGUFWriter& w, const SafetensorsTensor& t, uint32_t out_type, std::string* err) {
    const int64_t n = t.numel();
    constexpr int64_t kChunk = 1 << 20;
    const size_t out_size = gguf_tensor_type_block_bytes(out_type);
    std::vector<uint8_t> buf((size_t)std::min(n, kChunk) * out_size);
    std::vector<float> f32;
    for (int64_t i = 0; i < n; i += kChunk) {
        const int64_t m = std::min(kChunk, n - i);
        const uint8_t* src = t.data + (size_t)i * safetensors_dtype_size(t.dtype);
        if (t.dtype == SafetensorsDtype::F64) {
            f32.resize((size_t)m);
            for (int64_t j = 0; j < m; j++) {
                double d;
                memcpy(&d, src + 8 * j, 8);
                f32[(size_t)j] = (float)d;
            }
            if (gguf_convert(GGUF_TENSOR_F32, f32.data(), out_type, buf.data(), m, err)) return false;
        } else {
            if (gguf_convert(ggml_type_of(t.dtype), src, out_type, buf.data(), m, err)) return false;
        }
        if (w.write_data(buf.data(), (size_t)m * out_size, err)) return false;
    }
    return true;
}

// N of an HF name "model.layers.N.<rest>", or -1.
int64_t hf_layer_index(const std::string& name) {
    static const std::string pre = "model.layers.";
    if (name.compare(0, pre.size(), pre) != 0) return -1;
    size_t j = pre.size();
    int64_t v = 0;
    while (j < name.size() && isdigit((unsigned char)name[j]) && v < INT32_MAX) v = v * 10 + (name[j++] - '0');
    if (j == pre.size() || j >= name.size() || name[j] != '.') return -1;
    return v;
}

std::string basename_of(std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    size_t k = p.rfind('/');
    return k == std::string::npos ? p : p.substr(k + 1);
}

} // namespace

int main(int argc, char** argv) {
    install_temp_file_cleanup(); // Ctrl-C / SIGTERM: remove OUT.tmp.<pid>, keep the previous OUT
    CLI::App app{"Convert a Hugging Face Qwen2 or Llama checkpoint (safetensors) to GGUF, with llama.cpp's names and keys."};
    std::string dir, out, outtype;
    bool vocab_only = false;
    app.add_option("HF_DIR", dir, "Hugging Face model folder (config.json, *.safetensors, tokenizer.json)")->required();
    app.add_option("-o,--output", out, "output GGUF file (written atomically)")->required();
    app.add_option("--outtype", outtype, "type of 2-D tensors: f32, f16 or bf16 (default: the checkpoint's own type)")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}));
    app.add_flag("--vocab-only", vocab_only, "write only the tokenizer (needs only tokenizer.json), no tensors");
    OOMB_TOOL_PARSE(app, argc, argv);

    std::string err;
    auto fail = [&](const std::string& m) {
        fprintf(stderr, "oomb-convert-hf: error: %s\n", m.c_str());
        return 1;
    };
    if (!is_dir(dir)) return fail(dir + ": not a directory");
    if (const std::string e = output_path_error(out); !e.empty()) return fail(e);  // before any work
    // The output is renamed over -o at the end: refuse a path that is one of the files read (the
    // weight shards, named by the index, are checked once it is read).
    std::vector<std::string> inputs;
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json", "model.safetensors"})
        inputs.push_back(dir + "/" + f);
    if (const std::string e = output_is_input_error("-o/--output", out, inputs); !e.empty()) return fail(e);
    const bool has_tok = is_file(dir + "/tokenizer.json");
    const bool has_config = is_file(dir + "/config.json");

    GGUFWriter w;
    Qwen2Config dims;
    bool has_rope_theta = false;
    bool tie_given = false;  // config.json gives tie_word_embeddings
    std::string name_or_path;
    std::vector<float> rope_freqs;  // Llama 3.x: rope_freqs.weight, computed from the config
    if (has_config) {
        if (!read_hf_config(dir + "/config.json", &dims, &has_rope_theta, &name_or_path, &rope_freqs, &err, &tie_given)) return fail(err);
    } else if (!vocab_only) {
        return fail(dir + ": no config.json (needed unless --vocab-only)");
    }
    w.set_string("general.architecture", decoder_arch_name(dims.arch));
    w.set_string("general.type", "model");
    std::string name = basename_of(name_or_path.empty() ? dir : name_or_path);
    w.set_string("general.name", name);

    if (vocab_only) {
        if (!has_tok) return fail(dir + ": --vocab-only needs tokenizer.json");
        if (has_config) qwen2_write_hparams(w, dims, has_rope_theta);
        int64_t n_tok = 0;
        if (!write_hf_tokenizer(dir, 0, w, &n_tok, &err)) return fail(err);
        remove_orphan_outputs("oomb-convert-hf", out);  // a run killed by SIGKILL left OUT.tmp.<pid>
        if (w.open(out, &err) || w.finish(&err)) return fail(err);
        fprintf(stderr, "oomb-convert-hf: wrote %s: vocab only, %lld tokens\n", out.c_str(), (long long)n_tok);
        return 0;
    }

    SafetensorsModel st;
    if (st.open(dir, &err)) return fail(err);
    for (const auto& f : st.files())
        if (const std::string e = output_is_input_error("-o/--output", out, {f->path()}); !e.empty()) return fail(e);

    // Map every checkpoint tensor to its GGUF name. Tensors of layers at or beyond
    // num_hidden_layers are an error (llama.cpp rejects a file whose blk.N tensors disagree with
    // block_count), as are unknown tensors; rotary_emb.inv_freq buffers are dropped.
    std::map<std::string, const SafetensorsTensor*> by_gguf;
    std::vector<std::string> beyond; // tensors of layers >= n_layer
    const SafetensorsTensor* tied_head = nullptr;  // lm_head.weight skipped for tie_word_embeddings
    int64_t max_layer = -1;
    for (const SafetensorsTensor* t : st.tensors()) {
        const int64_t layer = hf_layer_index(t->name);
        if (layer >= dims.n_layer) {
            beyond.push_back(t->name);
            max_layer = std::max(max_layer, layer);
            continue;
        }
        if (t->name.find("rotary_emb.inv_freq") != std::string::npos) { // recomputed at load
            fprintf(stderr, "oomb-convert-hf: note: dropping '%s' (RoPE frequencies are recomputed from rope_theta)\n",
                    t->name.c_str());
            continue;
        }
        const std::string g = qwen2_gguf_name(t->name);
        if (g.empty()) return fail("cannot map tensor '" + t->name + "' to a llama.cpp " + decoder_arch_name(dims.arch) + " name");
        if (g == "output.weight" && dims.tied) {
            fprintf(stderr, "oomb-convert-hf: note: tie_word_embeddings is set; skipping lm_head.weight\n");
            tied_head = t;
            continue;
        }
        by_gguf[g] = t;
    }
    if (!beyond.empty()) {
        std::string list;
        for (size_t i = 0; i < beyond.size() && i < 6; i++) list += (i ? ", " : "") + beyond[i];
        if (beyond.size() > 6) list += ", ... (" + std::to_string(beyond.size()) + " tensors)";
        return fail("config.json has num_hidden_layers = " + std::to_string(dims.n_layer) + " but the checkpoint has " +
                    "tensors of layer(s) up to " + std::to_string(max_layer) + ": " + list +
                    " (fix num_hidden_layers to the number of layers in the checkpoint)");
    }
    // tied, as transformers ties it (the embeddings are the head), but the checkpoint's own head is another matrix: the
    // converted model differs from what that file holds, so say so (a config edited by hand, a fine-tune that untied it)
    if (tied_head && by_gguf.count("token_embd.weight")) {
        const SafetensorsTensor* e = by_gguf["token_embd.weight"];
        if (e->dtype != tied_head->dtype || e->shape != tied_head->shape || e->nbytes != tied_head->nbytes ||
            memcmp(e->data, tied_head->data, e->nbytes) != 0)
            fprintf(stderr, "oomb-convert-hf: warning: lm_head.weight differs from model.embed_tokens.weight, but config.json sets "
                            "tie_word_embeddings: the output layer is the embeddings (as transformers loads it); set "
                            "tie_word_embeddings to false to keep lm_head.weight\n");
    }
    if (!dims.tied && !by_gguf.count("output.weight")) {
        // config.json says the head is its own tensor: a missing lm_head.weight is a missing file or
        // shard, not a tied model (reusing the embeddings would be another model, silently)
        if (tie_given)
            return fail(dir + ": config.json sets tie_word_embeddings to false but the checkpoint has no lm_head.weight "
                        "(a missing shard?); set tie_word_embeddings to true if the output layer is the embeddings");
        fprintf(stderr, "oomb-convert-hf: note: no lm_head.weight; the output layer reuses token_embd.weight\n");
        dims.tied = true;
    }
    // the layout's tensors; the optional ones llama.cpp also accepts (attn_output.bias) follow when
    // the checkpoint has them, in name order
    std::vector<Qwen2TensorSpec> plan;
    std::map<std::string, Qwen2TensorSpec> optional;
    for (auto& p : qwen2_tensors(dims, true)) {
        if (p.optional) optional[p.name] = p;
        else plan.push_back(p);
    }
    for (auto& kv : by_gguf)
        if (optional.count(kv.first)) plan.push_back(optional[kv.first]);
    for (auto& kv : by_gguf) {  // e.g. a Llama checkpoint's biases: never dropped silently
        bool in_plan = false;
        for (auto& p : plan) in_plan = in_plan || p.name == kv.first;
        if (!in_plan) return fail("tensor '" + kv.second->name + "' (" + kv.first + ") is not part of the " +
                                  decoder_arch_name(dims.arch) + " layout");
    }

    // Output type: default is the checkpoint's own (that of token_embd).
    std::vector<std::string> absent;
    bool absent_layer = false;
    for (auto& p : plan)
        if (!by_gguf.count(p.name) && p.slot != Qwen2Slot::RopeFreqs) {
            absent.push_back("'" + p.hf_name + "' (" + p.name + ")");
            absent_layer = absent_layer || hf_layer_index(p.hf_name) >= 0;
        }
    if (!absent.empty()) {
        std::string list;
        for (size_t i = 0; i < absent.size() && i < 6; i++) list += (i ? ", " : "") + absent[i];
        if (absent.size() > 6) list += ", ... (" + std::to_string(absent.size()) + " tensors)";
        return fail("checkpoint has no tensor " + list +
                    (absent_layer ? " (config.json has num_hidden_layers = " + std::to_string(dims.n_layer) +
                                        ": does the checkpoint have fewer layers?)"
                                  : std::string()));
    }
    const SafetensorsTensor* emb = by_gguf["token_embd.weight"];
    uint32_t out_type = ggml_type_of(emb->dtype);
    if (outtype == "f32") out_type = GGUF_TENSOR_F32;
    else if (outtype == "f16") out_type = GGUF_TENSOR_F16;
    else if (outtype == "bf16") out_type = GGUF_TENSOR_BF16;

    bool warned = false;
    for (auto& p : plan) {
        if (p.slot == Qwen2Slot::RopeFreqs) {  // computed, not in the checkpoint
            if (w.add_tensor(p.name, GGUF_TENSOR_F32, p.ne, &err)) return fail(err);
            continue;
        }
        const SafetensorsTensor* t = by_gguf[p.name];
        std::vector<int64_t> ne(t->shape.rbegin(), t->shape.rend());
        if (ne != p.ne) {
            std::string want, got;
            for (auto v : p.ne) want += std::to_string(v) + " ";
            for (auto v : ne) got += std::to_string(v) + " ";
            return fail("tensor '" + t->name + "' has ne [" + got + "], config.json implies [" + want + "]");
        }
        if (t->dtype == SafetensorsDtype::I32 || t->dtype == SafetensorsDtype::I64)
            return fail("tensor '" + t->name + "' has integer dtype " + safetensors_dtype_name(t->dtype));
        const uint32_t tt = p.is_1d() ? GGUF_TENSOR_F32 : out_type;
        const uint32_t src = ggml_type_of(t->dtype);
        const bool lossy = t->dtype == SafetensorsDtype::F64 ||
                           (tt == GGUF_TENSOR_F16 && src != GGUF_TENSOR_F16) ||
                           (tt == GGUF_TENSOR_BF16 && src != GGUF_TENSOR_BF16);
        if (lossy && !warned) {
            fprintf(stderr, "oomb-convert-hf: warning: converting %s to %s is lossy (first: %s)\n",
                    safetensors_dtype_name(t->dtype), gguf_tensor_type_name(tt), t->name.c_str());
            warned = true;
        }
        if (w.add_tensor(p.name, tt, ne, &err)) return fail(err);
    }

    qwen2_write_hparams(w, dims, has_rope_theta);
    w.set_u32("general.file_type", llama_file_type(out_type));
    w.set_u32("general.quantization_version", 2);
    if (has_tok) {
        int64_t n_tok = 0;
        if (!write_hf_tokenizer(dir, dims.n_vocab, w, &n_tok, &err)) return fail(err);
    } else {
        fprintf(stderr, "oomb-convert-hf: note: no tokenizer.json in %s; writing a weights-only file\n", dir.c_str());
    }

    remove_orphan_outputs("oomb-convert-hf", out);
    if (w.open(out, &err)) return fail(err);
    for (size_t i = 0; i < w.tensors().size(); i++) {
        const GGUFTensorInfo& ti = w.tensors()[i];
        if (plan[i].slot == Qwen2Slot::RopeFreqs) {
            if (w.write_tensor(ti.name, rope_freqs.data(), rope_freqs.size() * 4, &err)) return fail(err);
            continue;
        }
        const SafetensorsTensor* t = by_gguf[ti.name];
        const int64_t qk_heads = llama_qk_heads(dims, plan[i].slot);
        if (qk_heads) {
            // Llama: q_proj / k_proj rows in llama.cpp's interleaved-RoPE order (convert_hf_to_gguf's permute)
            std::vector<uint8_t> rows(t->data, t->data + t->nbytes);
            llama_permute_qk_rows(rows.data(), qk_heads, dims.head_dim, t->nbytes / (size_t)t->shape[0]);
            SafetensorsTensor p = *t;
            p.data = rows.data();
            if (!write_converted(w, p, ti.type, &err)) return fail(err);
            continue;
        }
        if (!write_converted(w, *t, ti.type, &err)) return fail(err);
    }
    if (w.finish(&err)) return fail(err);
    if (dims.rope_freqs)
        fprintf(stderr, "oomb-convert-hf: note: rope_scaling llama3: wrote rope_freqs.weight (%zu factors, %.4g to %.4g)\n",
                rope_freqs.size(), (double)*std::min_element(rope_freqs.begin(), rope_freqs.end()),
                (double)*std::max_element(rope_freqs.begin(), rope_freqs.end()));
    fprintf(stderr, "oomb-convert-hf: wrote %s: %zu tensors, %s, %.1f MB\n", out.c_str(), w.tensors().size(),
            gguf_tensor_type_name(out_type), w.bytes_written() / 1e6);
    return 0;
}
