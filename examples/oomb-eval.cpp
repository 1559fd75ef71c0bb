// oomb-eval: perplexity of a long text under a Qwen2 or Llama GGUF model, computed chunk by chunk through
// the same paged-KV path as training (ChunkDriver::forward: stage 1 only; no gradients and no
// KV-gradient pages).
//
//   oomb-eval -m MODEL.gguf --data FILE [--ctx N] [--chunk C] [--page P] [--threads T]
//   oomb-eval -m BASE.gguf --lora ADAPTER.gguf ...   base + a llama.cpp LoRA adapter (models/lora.h),
//                                                    applied as llama.cpp does: W x + alpha / r * B (A x)
//
// The text (plain or .gz; files or folders; documents separated by <|endoftext|> as in
// oomb-train) is tokenized with the model's tokenizer (or --vocab) and cut into windows of --ctx
// tokens (the last, shorter window included); every window is one sequence whose tokens attend
// to all earlier tokens of that window. Prints the token count, the mean negative log-likelihood
// over all predicted tokens (nats) and the perplexity exp(mean NLL). --score-second-half scores as
// llama.cpp's llama-perplexity does instead (examples/eval-windows.h): whole windows of --ctx only,
// BOS first when the vocabulary says add_bos, the second half of each window scored.
#include "eval-windows.h"
#include "train-common.h"
#include "train-offload.h"
#include "train-progress.h"
#include "train-options.h"  // train_option_table: oomb-train's options named as such
#include "train-sparse.h"

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include "../gguf-tools/tool-cli.h"  // output_is_input_error

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <thread>
#include <unistd.h>

using namespace oomb;
using namespace oomb::train;

static const char * PROG = "oomb-eval";

int main(int argc, char ** argv) {
    install_error_handler(PROG, 1);
    install_temp_file_cleanup();  // Ctrl-C / SIGTERM during a checkpoint save leaves no temporary file
    std::string model, vocab, data_bin, device = "cpu", json_out, lora, base_type = "keep";
    std::vector<std::string> data;
    int64_t ctx = 4096, chunk = 4096, max_tokens = 0;
    int page = 128, threads = 0;
    double rope_theta = 0, progress_every = 30;
    bool second_half = false;
    CLI::App app{"oomb-eval: perplexity of a long text under a Qwen2 or Llama GGUF model, computed chunk by chunk over the paged KV cache "
                 "(the same path as oomb-train).",
                 "oomb-eval"};
    app.get_formatter()->column_width(30);
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("-m,--model", model, "GGUF model (qwen2 or llama architecture)")->required();
    app.add_option("--data", data, "text files or folders (.gz read directly)")->take_all();
    app.add_option("--data-bin", data_bin, "little-endian uint32 token ids instead of text");
    app.add_option("--lora", lora, "LoRA adapter GGUF (llama.cpp's format, e.g. oomb-train --trainable lora's adapter.gguf) applied to -m");
    app.add_option("--base-type", base_type, "keep (-m's quantized projections stay in their GGUF block type, dequantized per "
                                             "product), bf16 or f32 (weights converted on load)")->capture_default_str();
    app.add_option("--vocab", vocab, "tokenizer GGUF when the model file has none");
    app.add_option("--ctx", ctx, "tokens per window (each window is one sequence)")->capture_default_str();
    app.add_option("--chunk", chunk, "tokens per chunk (capped to --ctx)")->capture_default_str();
    app.add_option("--page", page, "tokens per KV page")->capture_default_str();
    app.add_option("--max-tokens", max_tokens, "evaluate only the first N tokens (0: all)")->capture_default_str();
    app.add_option("-t,--threads", threads, "CPU threads (default: all)");
    app.add_option("--device", device, "cpu or cuda")->capture_default_str();
    app.add_option("--rope-theta", rope_theta, "override the RoPE base");
    app.add_flag("--score-second-half", second_half,
                 "score as llama-perplexity: floor(tokens / ctx) windows of exactly --ctx, each starting with BOS when the "
                 "vocabulary says add_bos, only positions ctx/2 .. ctx-2 scored");
    app.add_option("--json", json_out, "also write the results as JSON to this file");
    add_progress_option(app, progress_every);
    OffloadOptions offload;
    add_offload_options(app, offload, false);
    SparseOptions sparse;
    add_sparse_options(app, sparse, false);
    if (const int rc = parse_command_line(app, argc, argv, PROG, &train_option_table()); rc >= 0) return rc;
    (void) oomb_linear_cross_entropy_tile_request(0);  // a bad OOMB_LCE_TILE fails here (naming it), not in the first window
    check_chunk_options(PROG, app, ctx, chunk, page, threads, rope_theta);
    check_offload_options(PROG, app, offload);
    check_sparse_options(PROG, app, sparse);
    check_progress_option(PROG, progress_every);
    if (app.count("--max-tokens")) need_in_range(PROG, max_tokens >= 1, "--max-tokens", (double) max_tokens, ">= 1");
    if (data.empty() == data_bin.empty())
        fail(PROG, data.empty() ? "give --data FILE (text) or --data-bin FILE (ids)" : "give --data FILE (text) or --data-bin FILE (ids), not both");
    if (base_type != "keep" && base_type != "bf16" && base_type != "f32")
        fail(PROG, "--base-type must be keep, bf16 or f32, got '" + base_type + "'");
    if (!json_out.empty()) {   // fail before evaluating when the result could not be written
        const size_t sl = json_out.rfind('/');
        const std::string dir = sl == std::string::npos ? "." : (sl == 0 ? "/" : json_out.substr(0, sl));
        if (!is_dir(dir) || access(dir.c_str(), W_OK) != 0)
            fail(PROG, "--json: cannot write '" + json_out + "': folder '" + dir + "' " + (is_dir(dir) ? "is not writable" : "does not exist"));
        // written by a rename over --json: one naming an input would replace it
        std::vector<std::string> inputs = {model, lora, vocab, data_bin};
        inputs.insert(inputs.end(), data.begin(), data.end());
        if (const std::string e = oomb::tools::output_is_input_error("--json", json_out, inputs); !e.empty()) fail(PROG, e);
    }
    threads = threads_default(threads);
    if (!is_file(model)) fail(PROG, "-m: " + not_a_file(model));
    if (!lora.empty() && !is_file(lora)) fail(PROG, "--lora: " + not_a_file(lora));

    std::string err;
    oomb_backend_t be = make_backend(device, threads, &err);
    if (!be) fail(PROG, err);
    auto m = model_load_gguf(model, be, base_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32, &err, base_type == "keep");
    if (!m) fail(PROG, err);
    printf("weights: %s in %s memory (--base-type %s)\n", fmt_bytes((double) qwen2_weight_bytes(*m)).c_str(), oomb_backend_name(be),
           base_type.c_str());
    if (!lora.empty() && !lora_load_gguf(*m, lora, &err)) fail(PROG, "--lora: " + err);
    if (rope_theta > 0) m->cfg.rope_theta = (float) rope_theta;

    std::vector<int32_t> ids;
    EvalWindowing win;
    win.second_half = second_half;
    const auto t0 = std::chrono::steady_clock::now();
    if (!data_bin.empty()) {
        if (!read_ids_bin(data_bin, m->cfg.n_vocab, &ids, &err)) fail(PROG, "--data-bin: " + err);
        if (second_half) {  // ids given: BOS as the model's vocabulary says, when it has one
            Tokenizer tok;
            if (load_model_tokenizer(model, &tok, &err) == ModelTokenizer::Loaded && tok.add_bos()) win.bos = tok.bos_id();
        }
    } else {
        Tokenizer tok;
        std::string src = model;
        const ModelTokenizer mt = load_model_tokenizer(model, &tok, &err);
        if (mt == ModelTokenizer::Failed) fail(PROG, "the model's tokenizer: " + err);
        if (mt == ModelTokenizer::Absent) {
            if (vocab.empty()) vocab = find_project_file("models/qwen2.5-vocab.gguf");
            if (vocab.empty()) fail(PROG, "'" + model + "' has no tokenizer: give --vocab FILE.gguf or use --data-bin");
            src = vocab;
            if (tok.load_file(vocab, &err) != GGUF_OK) fail(PROG, "--vocab: " + err);
        }
        if ((int64_t) tok.n_vocab() > m->cfg.n_vocab)
            fail(PROG, src + ": the tokenizer has " + std::to_string(tok.n_vocab()) + " tokens but the model only " +
                           std::to_string(m->cfg.n_vocab) + " embedding rows");
        int32_t eos = tok.find_token("<|endoftext|>");
        if (eos < 0) eos = tok.eos_id();
        if (eos < 0) fail(PROG, src + ": the tokenizer has no end-of-text token");
        size_t n_bytes = 0;
        if (!tokenize_paths(tok, data, eos, threads, &ids, &n_bytes, &err)) fail(PROG, "--data: " + err);
        if (!ids.empty()) ids.pop_back();  // no end-of-text after the last document
        if (second_half) {
            // llama-perplexity tokenizes the text whole, BOS first when add_bos (so its windows start
            // one token earlier), and reads <|endoftext|> as plain text: the documents do not match
            if (tok.add_bos()) {
                win.bos = tok.bos_id();
                if (win.bos < 0) fail(PROG, src + ": tokenizer.ggml.add_bos_token is true but there is no BOS id");
                ids.insert(ids.begin(), win.bos);
            }
            if (std::find(ids.begin(), ids.end(), eos) != ids.end())
                printf("note: --score-second-half: the text has several documents (<|endoftext|>); llama-perplexity reads "
                       "that separator as plain text, so its numbers will differ\n");
        }
        printf("text: %.2f MB -> %zu tokens (%.2f bytes/token)\n", n_bytes / 1e6, ids.size(), (double) n_bytes / std::max<size_t>(1, ids.size()));
    }
    if (max_tokens > 0 && (int64_t) ids.size() > max_tokens) ids.resize((size_t) max_tokens);
    const int64_t n = (int64_t) ids.size();
    win.ctx = ctx;
    int64_t n_windows = 0;
    if (!eval_window_count(n, win, &n_windows, &err)) fail(PROG, err);
    if (!second_half) ctx = std::min<int64_t>(ctx, n);
    chunk = std::min(chunk, ctx);

    ChunkParams tp;
    tp.chunk = chunk;
    tp.page = page;
    tp.max_tokens = ctx;
    tp.with_grad = false;  // forward only: no KV-gradient pages
    apply_sparse_options(sparse, &tp);  // the same selection rule as oomb-train
    if (sparse.pages > 0) printf("%s\n", sparse_summary_line(sparse, m->cfg.n_layer, m->cfg.n_head_kv, m->cfg.head_dim, page).c_str());
    win.ignore_index = tp.ignore_index;
    plan_memory(PROG, offload, be, *m, &tp);
    ChunkDriver tr(model_chunk_builder(*m), tp);
    ChunkProgressLine progress(progress_every, be);  // --progress-every: windows done, chunk, tok/s, ETA
    progress.install(tr);
    progress.begin_job(n_windows, "ETA");
    double nll = 0;
    int64_t targets = 0, windows = 0;
    const auto t1 = std::chrono::steady_clock::now();
    const bool tty = isatty(2);
    for (int64_t k = 0; k < n_windows; k++) {
        const EvalWindow w = eval_window(ids.data(), n, k, win);
        const int64_t len = (int64_t) w.ids.size(), done = w.offset + len;
        progress.begin_item(k, "windows " + std::to_string(k) + "/" + std::to_string(n_windows) + " done");
        ChunkStats st = tr.forward(w.ids.data(), len, w.labels.empty() ? nullptr : w.labels.data());
        nll += st.loss_sum;
        targets += st.n_targets;
        windows++;
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        if (tty) fprintf(stderr, "\r%s: %" PRId64 "/%" PRId64 " tokens, running NLL %.4f, %.0f tok/s   ", PROG, done, n,
                nll / std::max<int64_t>(1, targets), done / std::max(1e-9, dt));
    }
    if (tty) fprintf(stderr, "\n");
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const double mean = nll / (double) targets;
    printf("model: %s\n", model.c_str());
    if (m->lora)
        printf("adapter: %s (LoRA rank %" PRId64 ", alpha %g, targets %s, %zu pairs%s)\n", lora.c_str(), m->lora->cfg.rank, m->lora->cfg.alpha,
               lora_targets_string(m->lora->cfg.targets).c_str(), m->lora->params.size() / 2,
               m->lora->first_missing().empty() ? "" : ": partial, the projections without a pair unchanged");
    printf("tokens: %" PRId64 " in %" PRId64 " window(s) of up to %" PRId64 " (chunk %" PRId64 ", page %d), %" PRId64 " predicted\n", n,
           windows, ctx, chunk, page, targets);
    if (second_half)
        printf("scored: the second half of each window of %" PRId64 " (llama-perplexity's convention), BOS %s\n", ctx,
               win.bos >= 0 ? ("id " + std::to_string(win.bos) + " first").c_str() : "not added");
    printf("mean NLL: %.6f nats/token\n", mean);
    printf("perplexity: %.4f\n", std::exp(mean));
    printf("time: %.2f s (%.0f tok/s; load + tokenize %.2f s)\n", dt, n / std::max(1e-9, dt),
           std::chrono::duration<double>(t1 - t0).count());
    if (!json_out.empty()) {
        nlohmann::json j;
        j["model"] = model; if (!lora.empty()) j["lora"] = lora; j["tokens"] = n; j["targets"] = targets; j["windows"] = windows; j["ctx"] = ctx;
        j["chunk"] = chunk; j["page"] = page;
        j["score_second_half"] = second_half; if (second_half) j["bos"] = win.bos; j["mean_nll"] = mean; j["perplexity"] = std::exp(mean); j["seconds"] = dt;
        if (!write_file_atomic(json_out, j.dump(2) + "\n", &err)) fail(PROG, err);
    }
    if (!std::isfinite(mean)) {  // as oomb-train's non-finite steps: not a result (was: "perplexity: -nan", exit 0)
        fprintf(stderr, "%s: error: the mean NLL is not finite (non-finite weights or an overflow in the model?)\n", PROG);
        return 2;
    }
    return tools::finish_stdout(PROG);  // (the result lines above lost to a full disk or a closed pipe: exit 1)
}
