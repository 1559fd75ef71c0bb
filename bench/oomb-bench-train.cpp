// Throughput of one OOMB training step (forward + backward, every parameter trainable, no
// optimizer update) on the CPU: tokens per second for one sequence of --ctx tokens, median of
// --reps timed steps after --warmup untimed ones. The token ids follow the formula of
// bench/cpu/bench_torch.py, so with the fixture's weights both report the same loss.
//
//   oomb-bench-train -m qwen2-micro.gguf --ctx 4096 --chunk 4096 --page 64 --threads 2 --reps 3
//
// Prints one JSON line (per-rep seconds, median, tokens/s, loss; the stage-1 forward alone is timed
// too with --time-forward).
#include "bench-common.h"

#include "oomb-backend.h"
#include "qwen2.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include "../gguf-tools/tool-cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace oomb;

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char ** argv) {
    CLI::App app{"oomb-bench-train: tokens/s of one chunk-recurrent training step on the CPU"};
    bench::ModelOptions mo;
    mo.add(app);
    int64_t ctx = 4096, chunk = 0;
    int page = 64, threads = 2, reps = 3, warmup = 1;
    bool time_fwd = false;
    app.add_option("--ctx", ctx, "tokens in the sequence (batch 1)");
    app.add_option("--chunk", chunk, "tokens per chunk (default: the whole sequence)");
    app.add_option("--page", page, "tokens per KV page (default 64, or --ctx when shorter)");
    app.add_option("-t,--threads", threads, "CPU threads");
    app.add_option("--reps", reps, "timed steps");
    app.add_option("--warmup", warmup, "untimed steps first");
    app.add_flag("--time-forward", time_fwd, "also time the stage-1 forward alone");
    OOMB_TOOL_PARSE(app, argc, argv);  // a bad option: exit 1, as every tool
    if (!app.count("--chunk")) chunk = ctx;
    if (!app.count("--page") && ctx >= 1 && ctx < page) page = (int) ctx;  // the default fits a short --ctx
    std::string bad = bench::step_options_error(ctx, chunk, page, threads);
    if (bad.empty() && reps < 1) bad = "--reps " + std::to_string(reps) + " is out of range: it must be >= 1 (the median of no steps)";
    if (bad.empty() && warmup < 0) bad = "--warmup " + std::to_string(warmup) + " is out of range: it must be >= 0";
    if (!bad.empty()) {
        fprintf(stderr, "oomb-bench-train: error: %s\n", bad.c_str());
        return 1;
    }
    bench::exit_on_oomb_error("oomb-bench-train");

    try {
        oomb_backend_t be = oomb_backend_cpu_init(threads);
        auto m = bench::make_model(mo, be);
        std::vector<oomb_tensor *> params = qwen2_set_trainable(*m, Qwen2Trainable::All);
        const std::vector<int32_t> ids = bench::make_ids(ctx, m->cfg.n_vocab);
        ChunkParams tp;
        tp.chunk = std::min(chunk, ctx);
        tp.page = page;
        tp.max_tokens = ctx;
        std::vector<double> secs, fsecs;
        ChunkStats st;
        {
        ChunkDriver tr(qwen2_chunk_builder(*m), tp);
        for (int r = 0; r < warmup + reps; r++) {
            for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
            const double t0 = bench::now_s();
            st = tr.forward_backward(ids.data(), ctx);
            const double dt = bench::now_s() - t0;
            if (r >= warmup) secs.push_back(dt);
            fprintf(stderr, "step %d: %.3f s (%s)\n", r, dt, r < warmup ? "warmup" : "timed");
        }
        if (time_fwd) {
            for (int r = 0; r < reps; r++) {
                const double t0 = bench::now_s();
                tr.forward(ids.data(), ctx);
                fsecs.push_back(bench::now_s() - t0);
            }
        }
        }  // the trainer goes before the model and the backend
        // gradient norm (a cheap cross-check against PyTorch's)
        double gn2 = 0;
        for (oomb_tensor * p : params) {
            std::vector<float> g((size_t) oomb_nelements(p->grad));
            oomb_tensor_get_f32(p->grad, g.data(), (int64_t) g.size());
            for (float x : g) gn2 += (double) x * x;
        }
        const double med = median(secs);
        nlohmann::json j;
        j["impl"] = "ggml-oomb";
        j["model"] = mo.model.empty() ? mo.shape_str(m->cfg) : mo.model;
        j["ctx"] = ctx; j["chunk"] = tp.chunk; j["page"] = page; j["threads"] = threads;
        j["n_params"] = m->n_params();
        j["step_s"] = secs; j["median_s"] = med; j["tokens_per_s"] = (double) ctx / med;
        if (time_fwd) j["forward_median_s"] = median(fsecs);
        j["loss"] = st.loss_sum / (double) st.n_targets;
        j["grad_norm"] = std::sqrt(gn2) / (double) st.n_targets;  // of the mean loss
        j["peak_rss"] = bench::peak_rss_bytes();
        printf("%s\n", j.dump().c_str());
        m.reset();
        oomb_backend_free(be);
    } catch (const std::exception & e) {
        fprintf(stderr, "oomb-bench-train: %s\n", e.what());
        return 1;
    }
    return 0;
}
