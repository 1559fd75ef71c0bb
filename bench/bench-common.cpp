#include "bench-common.h"

#include "oomb-backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <sys/resource.h>
#include <unistd.h>

namespace bench {

void ModelOptions::add(CLI::App & app) {
    app.add_option("-m,--model", model, "Qwen2 GGUF (default: random weights of the shapes below)");
    app.add_option("--n-vocab", vocab, "vocabulary (default: qwen2-micro's 4096)");
    app.add_option("--n-embd", embd, "hidden size (128)");
    app.add_option("--n-ff", ff, "MLP size (352)");
    app.add_option("--n-layer", layers, "layers (2)");
    app.add_option("--n-head", heads, "query heads (2)");
    app.add_option("--n-head-kv", kv_heads, "KV heads (1)");
    app.add_option("--head-dim", head_dim, "head dimension (64)");
    app.add_flag("--untied", untied, "separate LM head (default: tied, as qwen2-micro)");
    app.add_option("--seed", seed, "weight seed (random weights)");
}

std::string ModelOptions::shape_str(const oomb::Qwen2Config & c) const {
    char b[256];
    snprintf(b, sizeof b, "vocab %lld, hidden %lld, ffn %lld, %lld layers, %lld heads, %lld kv heads, head dim %lld, %s",
             (long long) c.n_vocab, (long long) c.n_embd, (long long) c.n_ff, (long long) c.n_layer, (long long) c.n_head,
             (long long) c.n_head_kv, (long long) c.head_dim, c.tied ? "tied" : "untied");
    return b;
}

std::unique_ptr<oomb::Qwen2Model> make_model(const ModelOptions & o, oomb_backend_t be) {
    if (!o.model.empty()) {
        std::string err;
        auto m = oomb::qwen2_load_gguf(o.model, be, OOMB_TYPE_F32, &err);
        if (!m) throw std::runtime_error(err);
        return m;
    }
    oomb::Qwen2Config c;
    c.n_vocab = o.vocab; c.n_embd = o.embd; c.n_ff = o.ff; c.n_layer = o.layers;
    c.n_head = o.heads; c.n_head_kv = o.kv_heads; c.head_dim = o.head_dim;
    c.tied = !o.untied;
    c.rope_theta = 1e6f; c.rms_eps = 1e-6f;
    std::string err;
    if (!oomb::qwen2_config_valid(c, &err)) throw std::runtime_error(err);
    auto m = oomb::qwen2_create(c, be, OOMB_TYPE_F32);
    oomb::qwen2_init_random(*m, o.seed);
    return m;
}

std::string step_options_error(int64_t ctx, int64_t chunk, int page, int threads) {
    auto bad = [](const char * opt, int64_t v, const std::string & range) {
        return std::string(opt) + " " + std::to_string(v) + " is out of range: it must be " + range;
    };
    if (ctx < 2) return bad("--ctx", ctx, ">= 2 (one token has no next token to predict)");
    if (chunk < 1) return bad("--chunk", chunk, ">= 1");
    if (page < 1 || page > ctx) return bad("--page", page, "from 1 to --ctx (" + std::to_string(ctx) + ")");
    if (threads < 0 || threads > OOMB_CPU_MAX_THREADS)  // 0: every core (oomb_backend_cpu_init's default)
        return bad("--threads", threads, "from 0 (every core) to " + std::to_string(OOMB_CPU_MAX_THREADS));
    return "";
}

namespace {
const char * g_prog = "oomb-bench";
[[noreturn]] void error_exit(const char * msg, void *) {
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\n", g_prog, msg);
    exit(1);
}
} // namespace

void exit_on_oomb_error(const char * prog) {
    g_prog = prog;
    oomb_set_error_handler(error_exit, nullptr);
}

std::vector<int32_t> make_ids(int64_t n, int64_t vocab) {
    std::vector<int32_t> ids((size_t) n);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t x = (uint32_t) ((uint64_t) i * 2654435761ull + 12345ull);
        ids[(size_t) i] = (int32_t) (x % (uint32_t) vocab);
    }
    return ids;
}

size_t peak_rss_bytes() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    size_t peak = (size_t) ru.ru_maxrss * 1024;  // kilobytes on Linux
    // the kernel updates the high-water mark lazily: take the current RSS into account too
    return std::max(peak, cur_rss_bytes());
}

size_t cur_rss_bytes() {
    FILE * f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long long sz = 0, res = 0;
    if (fscanf(f, "%lld %lld", &sz, &res) != 2) res = 0;
    fclose(f);
    return (size_t) res * (size_t) sysconf(_SC_PAGESIZE);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace bench
