// oomb-export: merges a LoRA adapter into its base model and writes the result as one GGUF file in
// a chosen tensor type (or only re-types a base when no adapter is given).
//
//   oomb-export -m BASE.gguf [--lora ADAPTER.gguf] --out-type f16|bf16|q8_0|q4_k_m -o OUT.gguf
//
// The merge is the rule llama.cpp applies at run time (build_lora_mm) and in its export-lora tool:
// for every base weight W (ggml ne [n_in, n_out]) with a pair "<W>.lora_a" (ne [n_in, r]) and
// "<W>.lora_b" (ne [r, n_out]), W' = W + s * B A with s = alpha / r (adapter.lora.alpha; absent or
// 0: s = 1), computed in f32 on W dequantized from whatever readable type the base holds, then
// converted to the output type. The adapter is checked before anything is written: general.type
// "adapter", adapter.type "lora", general.architecture equal to the base's, every tensor a
// .lora_a/.lora_b of a base tensor with its pair present, shapes as llama.cpp checks them
// (W ne[0] == A ne[0], W ne[1] == B ne[1], A ne[1] == B ne[0]), F32/F16/BF16 data.
//
// Output: the base's metadata in its order, unchanged (tokenizer included) except
// general.file_type, which names the new type (LLAMA_FTYPE numbering), and
// general.quantization_version (2), added when a quantized type is written. 2-D tensors whose name
// ends in "weight" get the output type, every other tensor (norms, biases: 1-D) F32. q4_k_m is
// llama.cpp's Q4_K_M mix (llama-quant.cpp, llama_tensor_get_type): Q4_K by default; Q6_K for
// output.weight (for token_embd.weight when the model has no output.weight: tied embeddings); Q5_K
// for a fused attn_qkv; Q6_K for attn_v and ffn_down where use_more_bits(i, n) holds, i the index
// of that tensor among the n of its kind in file order (= the layer):
//     use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2      (integer division)
// A row length that is not a multiple of 256 falls back as llama.cpp does (Q4_K -> Q5_0,
// Q6_K -> Q8_0; Q5_K -> Q8_0 here, llama.cpp takes Q5_1), and one that is not a multiple of 32 to
// F16; q8_0 output falls back to F16 the same way (gguf_plan_weight_types, gguf.h: one rule with
// oomb-train's random quantized presets). The extra types f32, q4_k, q5_k and q6_k put
// every such weight in that one type (same fallbacks).
//
// Memory stays bounded: the base is memory-mapped, tensors are written one at a time in row
// chunks of at most 64 MiB (GGUFWriter::write_tensor_chunks), and only the adapter pair of the
// tensor being written is held in f32. The file is written atomically (OUT.tmp.<pid>, then
// rename; removed on error, Ctrl-C or SIGTERM; one a SIGKILL left is removed by the next run
// writing the same OUT, once its process is gone).
#include "gguf.h"
#include "oomb-backend.h"

#include <CLI/CLI.hpp>
#include "tool-cli.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

using namespace oomb;

namespace {

const char* kSuffixA = ".lora_a";
const char* kSuffixB = ".lora_b";

bool ends_with(const std::string& s, const std::string& t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::string ne_str(const GGUFTensorInfo& t) {
    std::string s = "[";
    for (uint32_t i = 0; i < t.n_dims; i++) s += (i ? ", " : "") + std::to_string(t.ne[i]);
    return s + "]";
}

std::string type_name(uint32_t t) {
    const char* n = gguf_tensor_type_name(t);
    return n ? n : "ggml type " + std::to_string(t);
}

// One adapted weight: its adapter tensors.
struct LoraPair {
    const GGUFTensorInfo* a = nullptr;
    const GGUFTensorInfo* b = nullptr;
};

// The adapter, checked against the base. False + *err naming the file and the problem.
bool load_adapter(const GGUFReader& base, const GGUFReader& ad, std::map<std::string, LoraPair>* pairs, float* scale_alpha,
                  std::string* err) {
    auto fail = [&](const std::string& m) {
        *err = ad.path() + ": " + m;
        return false;
    };
    auto get_str = [&](const GGUFReader& r, const char* key, std::string* v) {
        const GGUFValue* x = r.find(key);
        if (!x || x->type() != GGUF_TYPE_STRING) return false;
        *v = x->str();
        return true;
    };
    std::string type, adapter_type, arch, base_arch;
    if (!get_str(ad, "general.type", &type) || type != "adapter")
        return fail("general.type is " + (type.empty() ? std::string("missing") : "'" + type + "'") +
                    ", expected 'adapter' (not a llama.cpp LoRA adapter?)");
    if (!get_str(ad, "adapter.type", &adapter_type) || adapter_type != "lora")
        return fail("adapter.type is " + (adapter_type.empty() ? std::string("missing") : "'" + adapter_type + "'") +
                    ", expected 'lora'");
    if (!get_str(ad, "general.architecture", &arch)) return fail("key 'general.architecture' is missing or not a string");
    if (!get_str(base, "general.architecture", &base_arch))
        return fail("the base model " + base.path() + " has no general.architecture to compare with");
    if (arch != base_arch)
        return fail("general.architecture is '" + arch + "' but the base model " + base.path() + " is '" + base_arch + "'");
    float alpha = 0.0f; // llama.cpp: absent means 0, i.e. scale 1
    if (const GGUFValue* x = ad.find("adapter.lora.alpha")) {
        if (x->type() != GGUF_TYPE_FLOAT32) return fail("key 'adapter.lora.alpha' is not an f32");
        ad.get_f32("adapter.lora.alpha", &alpha, nullptr);
        if (!std::isfinite(alpha)) return fail("adapter.lora.alpha is not finite");
    }
    *scale_alpha = alpha;
    for (const GGUFTensorInfo& t : ad.tensors()) {
        const bool is_a = ends_with(t.name, kSuffixA), is_b = ends_with(t.name, kSuffixB);
        if (!is_a && !is_b) return fail("tensor '" + t.name + "' is neither a .lora_a nor a .lora_b");
        const std::string bname = t.name.substr(0, t.name.size() - 7);
        const GGUFTensorInfo* w = base.find_tensor(bname);
        if (!w) return fail("tensor '" + t.name + "' adapts '" + bname + "', which the base model " + base.path() + " does not have");
        if (bname.rfind("token_embd", 0) == 0)
            return fail("tensor '" + t.name + "' adapts the token embedding, which oomb-export does not merge");
        if (t.type != GGUF_TENSOR_F32 && t.type != GGUF_TENSOR_F16 && t.type != GGUF_TENSOR_BF16)
            return fail("tensor '" + t.name + "' has type " + type_name(t.type) + ", expected F32, F16 or BF16");
        LoraPair& p = (*pairs)[bname];
        (is_a ? p.a : p.b) = &t;
    }
    if (pairs->empty()) return fail("the adapter holds no tensors");
    for (const auto& kv : *pairs) {
        const GGUFTensorInfo* w = base.find_tensor(kv.first);
        const GGUFTensorInfo *a = kv.second.a, *b = kv.second.b;
        if (!a || !b) return fail("the pair of '" + kv.first + "' lacks its " + (a ? kSuffixB : kSuffixA));
        if (w->n_dims != 2) return fail("'" + kv.first + "' is not a matrix (ne " + ne_str(*w) + ") and cannot be adapted");
        if (a->n_dims != 2 || b->n_dims != 2 || a->ne[0] != w->ne[0] || b->ne[1] != w->ne[1] || a->ne[1] != b->ne[0])
            return fail("tensors '" + a->name + "' ne " + ne_str(*a) + " and '" + b->name + "' ne " + ne_str(*b) +
                        " do not fit the base's '" + kv.first + "' ne " + ne_str(*w) + " (expected [" +
                        std::to_string(w->ne[0]) + ", r] and [r, " + std::to_string(w->ne[1]) + "])");
    }
    return true;
}

struct OutType {
    const char* name;
    uint32_t type;      // the type of weights (Q4_K for the q4_k_m mix)
    bool mix;           // q4_k_m
    uint32_t file_type; // general.file_type (llama.cpp's LLAMA_FTYPE)
};
const OutType kOutTypes[] = {
    {"f16", GGUF_TENSOR_F16, false, 1},     {"bf16", GGUF_TENSOR_BF16, false, 32}, {"q8_0", GGUF_TENSOR_Q8_0, false, 7},
    {"q4_k_m", GGUF_TENSOR_Q4_K, true, 15}, {"f32", GGUF_TENSOR_F32, false, 0},    {"q4_k", GGUF_TENSOR_Q4_K, false, 14},
    {"q5_k", GGUF_TENSOR_Q5_K, false, 16},  {"q6_k", GGUF_TENSOR_Q6_K, false, 18},
};

} // namespace

int main(int argc, char** argv) {
    install_temp_file_cleanup(); // Ctrl-C / SIGTERM: remove OUT.tmp.<pid>, keep any previous OUT
    CLI::App app{"Merge a LoRA adapter (llama.cpp's GGUF format) into its base model and write one GGUF file "
                 "in a chosen type: W' = W + alpha/r * B A, as llama.cpp applies the adapter."};
    std::string base_path, lora_path, out_path, out_type;
    int threads = (int)std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::string> type_names;
    for (const OutType& o : kOutTypes) type_names.push_back(o.name);
    app.add_option("-m,--model", base_path, "base model GGUF (any readable tensor types)")->required();
    app.add_option("--lora", lora_path, "LoRA adapter GGUF to merge (llama.cpp format, e.g. oomb-train's DIR/adapter.gguf); "
                                        "without it the base is only converted");
    app.add_option("--out-type", out_type,
                   "type of the 2-D weights: f16, bf16, q8_0 or q4_k_m (llama.cpp's Q4_K_M mix); also f32, q4_k, "
                   "q5_k, q6_k (every weight in that type). Other tensors are F32")
        ->required()
        ->check(CLI::IsMember(type_names));
    app.add_option("-o,--output", out_path, "output GGUF file (written atomically)")->required();
    CLI::Option* o_threads = app.add_option("-t,--threads", threads, "threads for dequantizing, merging and quantizing (default: all cores)");
    OOMB_TOOL_PARSE(app, argc, argv);

    auto fail = [](const std::string& m) {
        fprintf(stderr, "oomb-export: error: %s\n", m.c_str());
        return 1;
    };
    if (o_threads->count() && (threads < 1 || threads > OOMB_CPU_MAX_THREADS))  // the CPU backend's cap, as the other tools
        return fail("-t/--threads must be from 1 to " + std::to_string(OOMB_CPU_MAX_THREADS) + ", not " + std::to_string(threads));
    // checked before any work: otherwise the whole file is converted into OUT.tmp.<pid> and only the final rename fails
    if (const std::string e = tools::output_path_error(out_path); !e.empty()) return fail(e);
    // the same file (also through another path or a link)
    if (const std::string e = tools::output_is_input_error("-o/--output", out_path, {base_path, lora_path}); !e.empty()) return fail(e);
    tools::remove_orphan_outputs("oomb-export", out_path);  // a run killed by SIGKILL left OUT.tmp.<pid>
    const OutType& ot = *std::find_if(std::begin(kOutTypes), std::end(kOutTypes), [&](const OutType& o) { return out_type == o.name; });

    std::string err;
    GGUFReader base;
    if (base.open(base_path, &err) != GGUF_OK) return fail(err);
    if (const GGUFValue* t = base.find("general.type"); t && t->type() == GGUF_TYPE_STRING && t->str() == "adapter")
        return fail(base_path + ": general.type is 'adapter': -m takes the base model, --lora the adapter");
    GGUFReader adapter;
    std::map<std::string, LoraPair> pairs;
    float alpha = 0.0f;
    if (!lora_path.empty()) {
        if (adapter.open(lora_path, &err) != GGUF_OK) return fail(err);
        if (!load_adapter(base, adapter, &pairs, &alpha, &err)) return fail(err);
    }

    const std::vector<uint32_t> types = gguf_plan_weight_types(base.tensors(), ot.type, ot.mix);  // the mix rule: gguf.h
    GGUFWriter w;
    bool quantized = false;
    for (uint32_t t : types) quantized |= gguf_tensor_type_block_size(t) > 1;
    for (const auto& kv : base.metadata())
        if (w.set(kv.first, kv.second, &err) != GGUF_OK) return fail(base_path + ": metadata '" + kv.first + "': " + err);
    w.set_u32("general.file_type", ot.file_type); // replaces the base's in its place (appended when absent)
    if (quantized && !w.has("general.quantization_version")) w.set_u32("general.quantization_version", 2);
    const auto& ts = base.tensors();
    for (size_t i = 0; i < ts.size(); i++) {
        std::vector<int64_t> ne(ts[i].ne, ts[i].ne + ts[i].n_dims);
        if (w.add_tensor(ts[i].name, types[i], ne, &err) != GGUF_OK) return fail(ts[i].name + ": " + err);
    }
    std::map<uint32_t, int> counts;
    for (uint32_t t : types) counts[t]++;
    std::string mix;
    for (const auto& c : counts) mix += (mix.empty() ? "" : ", ") + std::to_string(c.second) + " " + type_name(c.first);
    fprintf(stderr, "oomb-export: %s%s -> %s (%s): %zu tensors (%s), %zu merged\n", base_path.c_str(),
            lora_path.empty() ? "" : (" + " + lora_path).c_str(), out_path.c_str(), ot.name, ts.size(), mix.c_str(), pairs.size());
    const auto t0 = std::chrono::steady_clock::now();
    if (w.open(out_path, &err) != GGUF_OK) return fail(err);

    for (size_t i = 0; i < ts.size(); i++) {
        const GGUFTensorInfo& t = ts[i];
        const uint32_t dst_type = types[i];
        const int64_t ne0 = t.ne[0], n_rows = ne0 ? t.nelements() / ne0 : 0;
        const size_t src_row = (size_t)(ne0 / gguf_tensor_type_block_size(t.type)) * gguf_tensor_type_block_bytes(t.type);
        const size_t dst_row = (size_t)(ne0 / gguf_tensor_type_block_size(dst_type)) * gguf_tensor_type_block_bytes(dst_type);
        // the adapter pair, f32: A [r][n_in] (row k = ne0 values), B [n_out][r]
        std::vector<float> a, b;
        int64_t rank = 0;
        float scale = 0.0f;
        if (auto it = pairs.find(t.name); it != pairs.end()) {
            rank = it->second.a->ne[1];
            scale = alpha != 0.0f ? alpha / (float)rank : 1.0f;
            if (adapter.read_tensor_f32(it->second.a->name, &a, &err) != GGUF_OK) return fail(err);
            if (adapter.read_tensor_f32(it->second.b->name, &b, &err) != GGUF_OK) return fail(err);
        }
        const uint8_t* src = base.tensor_data(t);
        auto fill = [&](void* dst, uint64_t offset, size_t n, std::string* e) -> gguf_status {
            const int64_t r0 = (int64_t)(offset / dst_row), nr = (int64_t)(n / dst_row);
            const int nt = (int)std::min<int64_t>(threads, std::max<int64_t>(1, nr / 4));
            std::vector<gguf_status> st((size_t)nt, GGUF_OK);
            std::vector<std::string> msg((size_t)nt);
            auto work = [&](int k) {
                std::vector<float> row((size_t)ne0);
                for (int64_t r = r0 + k; r < r0 + nr; r += nt) {
                    std::string m;
                    gguf_status s = gguf_convert(t.type, src + (size_t)r * src_row, GGUF_TENSOR_F32, row.data(), ne0, &m);
                    if (s == GGUF_OK && rank) {
                        for (int64_t q = 0; q < rank; q++) {
                            const float c = scale * b[(size_t)(r * rank + q)];
                            const float* ak = a.data() + (size_t)(q * ne0);
                            for (int64_t j = 0; j < ne0; j++) row[(size_t)j] += c * ak[j];
                        }
                    }
                    // the quantized types refuse non-finite values themselves; f32 / f16 / bf16 would write them (and f16
                    // turns a finite |x| > 65504 into inf): a model that evaluates to NaN, so refuse those here too (the
                    // check oomb-train's checkpoints make)
                    if (s == GGUF_OK && !gguf_check_finite_as(row.data(), ne0, 0, dst_type, &m)) s = GGUF_ERR_ARG;
                    if (s == GGUF_OK)
                        s = gguf_convert(GGUF_TENSOR_F32, row.data(), dst_type, (uint8_t*)dst + (size_t)(r - r0) * dst_row, ne0, &m);
                    if (s != GGUF_OK) {
                        st[(size_t)k] = s;
                        msg[(size_t)k] = "tensor '" + t.name + "' row " + std::to_string(r) + ": " + m;
                        return;
                    }
                }
            };
            std::vector<std::thread> pool;
            for (int k = 1; k < nt; k++) pool.emplace_back(work, k);
            work(0);
            for (auto& th : pool) th.join();
            for (int k = 0; k < nt; k++)
                if (st[(size_t)k] != GGUF_OK) { *e = msg[(size_t)k]; return st[(size_t)k]; }
            return GGUF_OK;
        };
        if (n_rows == 0) continue;
        if (w.write_tensor_chunks(t.name, dst_row, fill, &err) != GGUF_OK) return fail(err);
    }
    if (w.finish(&err) != GGUF_OK) return fail(err);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fprintf(stderr, "oomb-export: wrote %s (%.3f GB in %.1f s)\n", out_path.c_str(), w.bytes_written() / 1e9, s);
    return 0;
}
