// oomb-gguf-init: writes a randomly initialised Qwen2 model of real shapes as GGUF (llama.cpp
// layout), for benchmarks and pre-training from scratch.
//
//   oomb-gguf-init --preset qwen2.5-0.5b --vocab models/qwen2.5-vocab.gguf -o OUT.gguf --seed 1
//   oomb-gguf-init --vocab-size 4096 --hidden 128 --ffn 352 --layers 2 --heads 2 --kv-heads 1 -o OUT.gguf
//
// Initialisation follows HF Qwen2 (_init_weights): Linear weights and the embedding ~ N(0, std)
// with std = initializer_range (0.02), biases 0, RMSNorm weights 1. Values depend only on the seed
// and the tensor name (not on threads). Tensors are generated in chunks and streamed to disk, so
// memory stays at a few MB whatever the model size.
#include "qwen2-gguf.h"

#include "gguf.h"
#include "../src/init-normal.h"

#include <CLI/CLI.hpp>
#include "tool-cli.h"

#include "oomb-backend.h"

#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

using namespace oomb;
using namespace oomb::tools;

int main(int argc, char** argv) {
    install_temp_file_cleanup(); // Ctrl-C / SIGTERM: remove OUT.tmp.<pid>, keep the previous OUT
    CLI::App app{"Write a randomly initialised Qwen2 model (llama.cpp GGUF layout), streamed to disk."};
    std::string preset, vocab, out, outtype = "bf16";
    uint64_t seed = 42;  // "-1" is refused by OOMB_TOOL_PARSE's checks (it was wrapped to 2^64 - 1)
    float init_std = 0.02f;
    int threads = (int)std::max(1u, std::thread::hardware_concurrency());
    Qwen2Config d;  // the options given (0: not given)
    d.n_vocab = d.n_embd = d.n_ff = d.n_layer = d.n_head = d.n_head_kv = 0;
    double rope_theta = 1e6, rms_eps = 1e-6;  // parsed as double: a value that is 0 or inf as float32 gets our message
    bool tied = false, untied = false;
    std::vector<std::string> names;
    std::string preset_list;
    for (auto& p : qwen2_preset_names()) {  // the same presets as oomb-train's (tiny included)
        names.push_back(p);
        preset_list += (preset_list.empty() ? "" : ", ") + p;
    }
    app.add_option("--preset", preset, "model shape: " + preset_list)->check(CLI::IsMember(names));
    CLI::Option* o_vocab = app.add_option("--vocab-size", d.n_vocab, "embedding rows (explicit dimensions; override the preset)");
    CLI::Option* o_hidden = app.add_option("--hidden", d.n_embd, "hidden size");
    CLI::Option* o_ffn = app.add_option("--ffn", d.n_ff, "feed-forward (intermediate) size");
    CLI::Option* o_layers = app.add_option("--layers", d.n_layer, "number of layers");
    CLI::Option* o_heads = app.add_option("--heads", d.n_head, "attention heads");
    CLI::Option* o_kv = app.add_option("--kv-heads", d.n_head_kv, "key/value heads (default: heads)");
    CLI::Option* o_ctx = app.add_option("--ctx", d.n_ctx_train, "context length (default 32768)");
    CLI::Option* o_theta = app.add_option("--rope-theta", rope_theta, "RoPE base (default 1e6)");
    CLI::Option* o_eps = app.add_option("--rms-eps", rms_eps, "RMSNorm epsilon (default 1e-6)");
    app.add_flag("--tied", tied, "tie the LM head to the embedding (no output.weight)");
    app.add_flag("--untied", untied, "write a separate output.weight");
    app.add_option("--vocab", vocab, "GGUF file whose tokenizer is copied in (e.g. models/qwen2.5-vocab.gguf)");
    app.add_option("-o,--output", out, "output GGUF file (written atomically)")->required();
    app.add_option("--seed", seed, "random seed, >= 0 (default 42)");
    CLI::Option* o_std = app.add_option("--init-std", init_std, "standard deviation of weights (default 0.02, HF initializer_range)");
    app.add_option("--outtype", outtype, "tensor type of 2-D weights: f32, f16 or bf16 (default bf16)")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}));
    CLI::Option* o_threads = app.add_option("-t,--threads", threads, "generator threads (default: all cores)");
    OOMB_TOOL_PARSE(app, argc, argv);

    auto fail = [](const std::string& m) {
        fprintf(stderr, "oomb-gguf-init: error: %s\n", m.c_str());
        return 1;
    };
    // checked before any work (else the whole model is written into OUT.tmp.<pid> and only the rename fails)
    if (const std::string e = output_path_error(out); !e.empty()) return fail(e);
    // Each option given is checked on its own, so that the message names it.
    const std::pair<CLI::Option*, int64_t> int_opts[] = {{o_vocab, d.n_vocab}, {o_hidden, d.n_embd}, {o_ffn, d.n_ff},
                                                         {o_layers, d.n_layer}, {o_heads, d.n_head}, {o_kv, d.n_head_kv},
                                                         {o_ctx, d.n_ctx_train}};
    for (auto& o : int_opts)
        if (o.first->count() && (o.second < 1 || o.second > INT32_MAX))
            return fail(o.first->get_name() + " must be an integer from 1 to 2147483647, not " + std::to_string(o.second));
    // Stored as float32 in the file: the value must stay finite and positive once rounded.
    const std::pair<CLI::Option*, double> pos_opts[] = {{o_theta, rope_theta}, {o_eps, rms_eps}, {o_std, init_std}};
    for (auto& o : pos_opts)
        if (o.first->count() && !(std::isfinite((float)o.second) && (float)o.second > 0.0f))
            return fail(o.first->get_name() + " must be a finite number greater than 0, not " + o.first->as<std::string>());
    // the CPU backend's cap (oomb-train, oomb-eval, oomb-tokenize take the same): a typo such as
    // -t 100000 is an error, not a process that runs out of threads
    if (o_threads->count() && (threads < 1 || threads > OOMB_CPU_MAX_THREADS))
        return fail("-t/--threads must be from 1 to " + std::to_string(OOMB_CPU_MAX_THREADS) + ", not " + std::to_string(threads));
    threads = std::min(threads, OOMB_CPU_MAX_THREADS);  // the default (every core) too
    // The file is renamed over -o at the end: -o naming --vocab would replace the vocabulary read.
    if (const std::string e = output_is_input_error("-o/--output", out, {vocab}); !e.empty()) return fail(e);

    Qwen2Config m;  // a preset (models/qwen2-layout.h), or only the options
    m.n_vocab = m.n_embd = m.n_ff = m.n_layer = m.n_head = m.n_head_kv = 0;
    std::string name = "qwen2-random";
    if (!preset.empty()) {
        qwen2_preset(preset, &m);
        name = preset + "-random";
    }
    if (o_vocab->count()) m.n_vocab = d.n_vocab;
    if (o_hidden->count()) m.n_embd = d.n_embd;
    if (o_ffn->count()) m.n_ff = d.n_ff;
    if (o_layers->count()) m.n_layer = d.n_layer;
    if (o_heads->count()) m.n_head = d.n_head;
    if (o_kv->count()) m.n_head_kv = d.n_head_kv;
    else if (!m.n_head_kv) m.n_head_kv = m.n_head;
    if (o_ctx->count()) m.n_ctx_train = d.n_ctx_train;
    if (o_theta->count()) m.rope_theta = (float)rope_theta;
    if (o_eps->count()) m.rms_eps = (float)rms_eps;
    if (tied && untied) return fail("--tied and --untied are exclusive");
    if (tied) m.tied = true;
    if (untied) m.tied = false;
    std::string missing;
    const std::pair<const char*, int64_t> need[] = {{"--vocab-size", m.n_vocab}, {"--hidden", m.n_embd}, {"--ffn", m.n_ff},
                                                    {"--layers", m.n_layer}, {"--heads", m.n_head}};
    for (auto& n : need)
        if (n.second == 0) missing += std::string(missing.empty() ? "" : " ") + n.first;
    if (!missing.empty()) return fail("no model shape: give --preset, or all of --vocab-size --hidden --ffn --layers --heads (missing: " + missing + ")");
    if (m.n_embd % m.n_head != 0)
        return fail("--hidden " + std::to_string(m.n_embd) + " is not a multiple of --heads " + std::to_string(m.n_head));
    if (m.n_head % m.n_head_kv != 0)
        return fail("--heads " + std::to_string(m.n_head) + " is not a multiple of --kv-heads " + std::to_string(m.n_head_kv));
    if ((m.n_embd / m.n_head) % 2 != 0)
        return fail("the head size --hidden / --heads = " + std::to_string(m.n_embd / m.n_head) + " must be even (RoPE rotates pairs)");
    m.head_dim = m.n_embd / m.n_head;
    std::string err;
    if (!qwen2_config_valid(m, &err)) return fail(err);

    const uint32_t wtype = outtype == "f32" ? GGUF_TENSOR_F32 : outtype == "f16" ? GGUF_TENSOR_F16 : GGUF_TENSOR_BF16;
    // Every weight must be finite in the output type. fill_normal's samples stay within
    // kInitNormalMaxZ standard deviations, so a std up to type_max / kInitNormalMaxZ cannot overflow;
    // a larger one would (for f16, --init-std 30000 gave thousands of infs), whatever the model size.
    const double type_max = wtype == GGUF_TENSOR_F16 ? 65504.0 : wtype == GGUF_TENSOR_BF16 ? 3.3895313892515355e38 : FLT_MAX;
    char std_str[32];
    snprintf(std_str, sizeof std_str, "%g", (double)init_std);
    if ((double)init_std * kInitNormalMaxZ > type_max) {
        // the suggestion rounded down to the 6 digits shown (with a margin for the float it is read into), so that it passes
        const double bound = type_max / kInitNormalMaxZ * (1 - 1e-6), unit = std::pow(10.0, std::floor(std::log10(bound)) - 5);
        const double suggest = std::floor(bound / unit) * unit;
        char b[320];
        snprintf(b, sizeof b, "--init-std %s is too large for --outtype %s: weights up to %.2f x %s = %.6g can be drawn, beyond "
                              "%s's largest value %.6g (use at most %.6g)", std_str, outtype.c_str(), (double)kInitNormalMaxZ, std_str,
                 init_std * (double)kInitNormalMaxZ, outtype.c_str(), type_max, suggest);
        return fail(b);
    }
    // ... and not all zero: a std so small that kInitNormalMaxZ standard deviations round to zero in the
    // output type writes an all-zero model (every weight); one below the type's smallest normal value
    // writes subnormal weights (fewer significant bits): a warning.
    const double type_min_sub = wtype == GGUF_TENSOR_F16 ? 5.960464477539063e-08 : wtype == GGUF_TENSOR_BF16 ? 9.183549615799121e-41 : 1.401298464324817e-45;
    const double type_min_normal = wtype == GGUF_TENSOR_F16 ? 6.103515625e-05 : 1.1754943508222875e-38;  // (bf16 and f32 share it)
    if ((double)init_std * kInitNormalMaxZ < type_min_sub / 2) {
        char b[320];
        snprintf(b, sizeof b, "--init-std %s is too small for --outtype %s: every weight (at most %.2f x %s) would round to zero, below "
                              "%s's smallest value %.6g (use at least %.6g, or a wider --outtype)", std_str, outtype.c_str(),
                 (double)kInitNormalMaxZ, std_str, outtype.c_str(), type_min_sub, type_min_normal);
        return fail(b);
    }
    if ((double)init_std < type_min_normal)
        fprintf(stderr, "oomb-gguf-init: warning: --init-std %s is below %s's smallest normal value %.6g: most weights are stored as subnormal "
                        "numbers (fewer significant bits) or zero\n", std_str, outtype.c_str(), type_min_normal);
    GGUFWriter w;
    w.set_string("general.architecture", QWEN2_ARCH);
    w.set_string("general.type", "model");
    w.set_string("general.name", name);
    qwen2_write_hparams(w, m);
    w.set_u32("general.file_type", llama_file_type(wtype));
    w.set_u32("general.quantization_version", 2);
    if (!vocab.empty()) {
        GGUFReader vr;
        if (vr.open(vocab, &err, GGUFReadOptions{true})) return fail(err);
        if (!copy_tokenizer(vr, m.n_vocab, w, &err)) return fail(err);
    }
    const std::vector<Qwen2TensorSpec> plan = qwen2_tensors(m);
    for (auto& t : plan)
        if (w.add_tensor(t.name, t.kind == Qwen2TensorKind::Weight ? wtype : GGUF_TENSOR_F32, t.ne, &err)) return fail(err);

    uint64_t total = 0;
    for (auto& t : w.tensors()) total += t.nbytes;
    fprintf(stderr, "oomb-gguf-init: %s: %zu tensors, %.2f GB, %s, seed %llu\n", out.c_str(), plan.size(), total / 1e9,
            outtype.c_str(), (unsigned long long)seed);
    const auto t0 = std::chrono::steady_clock::now();
    remove_orphan_outputs("oomb-gguf-init", out);  // a run killed by SIGKILL left OUT.tmp.<pid>
    if (w.open(out, &err)) return fail(err);
    // before the data: a model too large for the disk fails now, not after hours of writing
    const GGUFTensorInfo& last = w.tensors().back();
    if (const std::string e = disk_space_error(out, last.offset + last.nbytes); !e.empty()) return fail(e);

    // One pair of chunk buffers per thread that has work: no more threads than the largest tensor
    // has chunks, no longer than its values. The f32 values are written as they are (f32 tensors,
    // norms and biases included); a conversion buffer only for an f16 / bf16 --outtype.
    constexpr int64_t kChunk = kInitChunk;
    int64_t max_n = 0;
    for (auto& t : w.tensors()) max_n = std::max(max_n, t.nelements());
    const int64_t buf_n = std::min(kChunk, max_n);
    threads = (int)std::min<int64_t>(threads, (max_n + kChunk - 1) / kChunk);
    std::vector<std::vector<float>> f32((size_t)threads, std::vector<float>((size_t)buf_n));
    std::vector<std::vector<uint8_t>> conv(wtype == GGUF_TENSOR_F32 ? 0 : (size_t)threads,
                                           std::vector<uint8_t>((size_t)buf_n * gguf_tensor_type_block_bytes(wtype)));
    // a weight beyond the output type's range: the check of --init-std above rules it out; this is
    // the last guard (the generator's float arithmetic could still overflow for a huge f32 std)
    std::atomic<bool> out_of_range{false};
    for (size_t ti = 0; ti < plan.size(); ti++) {
        const Qwen2TensorSpec& p = plan[ti];
        const GGUFTensorInfo& info = w.tensors()[ti];
        const int64_t n = info.nelements();
        const size_t esz = gguf_tensor_type_block_bytes(info.type);
        const bool is_norm = p.kind == Qwen2TensorKind::Norm, is_bias = p.kind == Qwen2TensorKind::Bias;
        const int64_t n_chunks = (n + kChunk - 1) / kChunk;
        for (int64_t c0 = 0; c0 < n_chunks; c0 += threads) {
            const int nt = (int)std::min<int64_t>(threads, n_chunks - c0);
            auto work = [&](int k) {
                const int64_t c = c0 + k, off = c * kChunk, len = std::min(kChunk, n - off);
                float* v = f32[(size_t)k].data();
                if (is_norm) std::fill(v, v + len, 1.0f);
                else if (is_bias) std::fill(v, v + len, 0.0f);
                else fill_normal(init_chunk_seed(seed, p.name, c), init_std, v, len);
                for (int64_t i = 0; i < len; i++)
                    if (!(std::fabs(v[i]) <= type_max)) out_of_range = true;
                if (info.type != GGUF_TENSOR_F32) gguf_convert(GGUF_TENSOR_F32, v, info.type, conv[(size_t)k].data(), len, nullptr);
            };
            std::vector<std::thread> pool;
            for (int k = 1; k < nt; k++) pool.emplace_back(work, k);
            work(0);
            for (auto& th : pool) th.join();
            if (out_of_range)  // the temporary file is removed: no model with infinite weights
                return fail(std::string("--init-std ") + std_str + ": tensor " + p.name + " has values beyond " + outtype + "'s range");
            for (int k = 0; k < nt; k++) {
                const int64_t len = std::min(kChunk, n - (c0 + k) * kChunk);
                const void* data = info.type == GGUF_TENSOR_F32 ? (const void*)f32[(size_t)k].data() : conv[(size_t)k].data();
                if (w.write_data(data, (size_t)len * esz, &err)) return fail(err);
            }
        }
    }
    if (w.finish(&err)) return fail(err);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fprintf(stderr, "oomb-gguf-init: wrote %s (%.2f GB in %.1f s)\n", out.c_str(), w.bytes_written() / 1e9, s);
    return 0;
}
