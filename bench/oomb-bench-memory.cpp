// Memory of one OOMB training step against context length: run once per length, in its own process,
// so that peak RSS (getrusage ru_maxrss) belongs to that length. bench/memory/run.sh drives it over
// several lengths and fits RSS against tokens.
//
//   oomb-bench-memory --ctx 16384 --chunk 1024 --page 64 --threads 2 [model options]
//
// Prints one JSON line: peak RSS, the KV + KV-gradient cache bytes, the arena bytes planned for the
// chunk graphs (forward-only and forward+backward), weight and gradient bytes, the step's time.
#include "bench-common.h"

#include "oomb-backend.h"
#include "oomb-paged.h"
#include "qwen2.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include "../gguf-tools/tool-cli.h"

#include <cstdio>

using namespace oomb;

int main(int argc, char ** argv) {
    CLI::App app{"oomb-bench-memory: peak memory of one chunk-recurrent training step at one context length"};
    bench::ModelOptions mo;
    mo.add(app);
    int64_t ctx = 4096, chunk = 1024;
    int page = 64, threads = 2;
    app.add_option("--ctx", ctx, "tokens in the sequence");
    app.add_option("--chunk", chunk, "tokens per chunk");
    app.add_option("--page", page, "tokens per KV page (default 64, or --ctx when shorter)");
    app.add_option("-t,--threads", threads, "CPU threads");
    int64_t resident = -1;
    int block = 16;
    app.add_option("--resident-pages", resident, "host offload: KV pages kept in the (stand-in) device pool; the rest stream (-1: all resident)");
    app.add_option("--offload-block", block, "host offload: pages per streamed block");
    std::string kv_grad = "f32";
    app.add_option("--kv-grad-type", kv_grad, "KV-gradient pages: f32 or bf16 (stochastic rounding)")->check(CLI::IsMember({"f32", "bf16"}));
    OOMB_TOOL_PARSE(app, argc, argv);  // a bad option: exit 1, as every tool
    if (!app.count("--page") && ctx >= 1 && ctx < page) page = (int) ctx;  // the default fits a short --ctx
    std::string bad = bench::step_options_error(ctx, chunk, page, threads);
    if (bad.empty() && resident < -1)
        bad = "--resident-pages " + std::to_string(resident) + " is out of range: it must be >= 0, or -1 (all resident)";
    if (bad.empty() && block < 1) bad = "--offload-block " + std::to_string(block) + " is out of range: it must be >= 1";
    if (!bad.empty()) {
        fprintf(stderr, "oomb-bench-memory: error: %s\n", bad.c_str());
        return 1;
    }
    bench::exit_on_oomb_error("oomb-bench-memory");

    try {
        const size_t rss0 = bench::cur_rss_bytes();
        oomb_backend_t be = oomb_backend_cpu_init(threads);
        auto m = bench::make_model(mo, be);
        std::vector<oomb_tensor *> params = qwen2_set_trainable(*m, Qwen2Trainable::All);
        for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
        const size_t w_bytes = oomb_buffer_size(m->buf), g_bytes = oomb_buffer_size(m->grad_buf);
        const std::vector<int32_t> ids = bench::make_ids(ctx, m->cfg.n_vocab);
        const size_t rss_model = bench::cur_rss_bytes();

        size_t host_kv = 0;
        size_t kv_bytes, arena_f, arena_b, arena_max, rss_trainer, rss_after, peak;
        double t_step;
        ChunkStats st;
        {
            ChunkParams tp;
            tp.chunk = std::min(chunk, ctx);
            tp.page = page;
            tp.max_tokens = ctx;
            tp.resident_pages = resident;
            tp.stream_block_pages = block;
            tp.kv_grad_type = kv_grad == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
            ChunkDriver tr(qwen2_chunk_builder(*m), tp);
            kv_bytes = oomb_kv_cache_nbytes(tr.kv_cache());
            host_kv = oomb_kv_cache_host_nbytes(tr.kv_cache());
            rss_trainer = bench::cur_rss_bytes();
            const double t0 = bench::now_s();
            st = tr.forward_backward(ids.data(), ctx);
            t_step = bench::now_s() - t0;
            rss_after = bench::cur_rss_bytes();
            peak = bench::peak_rss_bytes();
            arena_f = tr.planned_bytes(tp.chunk, ChunkKind::Loss);
            arena_b = tr.planned_bytes(tp.chunk, ChunkKind::Backward);
            arena_max = tr.arena_bytes();
        }
        const Qwen2Config & c = m->cfg;
        const size_t grad_es = kv_grad == "bf16" ? 2 : 4;
        const size_t kv_per_token = (size_t) (c.n_layer * c.n_head_kv * c.head_dim) * (2 * 4 + 2 * grad_es);
        nlohmann::json j;
        j["ctx"] = ctx; j["chunk"] = std::min(chunk, ctx); j["page"] = page; j["threads"] = threads;
        j["model"] = mo.model.empty() ? mo.shape_str(c) : mo.model;
        j["n_layer"] = c.n_layer; j["n_head"] = c.n_head; j["n_head_kv"] = c.n_head_kv; j["head_dim"] = c.head_dim;
        j["peak_rss"] = peak;
        j["rss_start"] = rss0; j["rss_model"] = rss_model; j["rss_trainer_init"] = rss_trainer; j["rss_after_step"] = rss_after;
        j["kv_cache_bytes"] = kv_bytes;                  // K, V, dK, dV pools + page table (with offload: the device pools)
        j["host_kv_bytes"] = host_kv;                    // with offload: the host tier
        j["resident_pages"] = resident;
        j["kv_bytes_per_token_expected"] = kv_per_token; // n_layer * Hkv * D * (K, V f32 + dK, dV f32 or bf16)
        j["kv_grad_type"] = kv_grad;
        j["arena_fwd_bytes"] = arena_f; j["arena_fwdbwd_bytes"] = arena_b; j["arena_peak_bytes"] = arena_max;
        j["weights_bytes"] = w_bytes; j["grads_bytes"] = g_bytes;
        j["ids_bytes"] = ids.size() * sizeof(int32_t);
        j["step_s"] = t_step; j["tokens_per_s"] = (double) ctx / t_step;
        j["loss"] = st.loss_sum / (double) st.n_targets;
        printf("%s\n", j.dump().c_str());
        m.reset();
        oomb_backend_free(be);
    } catch (const std::exception & e) {
        fprintf(stderr, "oomb-bench-memory: %s\n", e.what());
        return 1;
    }
    return 0;
}
