// --sparse-pages / --sparse-score / --sparse-sink / --sparse-local (see train-sparse.h).

#include "train-sparse.h"

#include "train-common.h"

#include <cstdio>

namespace oomb {
namespace train {

void add_sparse_options(CLI::App & app, SparseOptions & o, bool training) {
    app.add_option("--sparse-pages", o.pages,
                   std::string("page-level top-K sparse attention: each query tile (one page of queries) attends its K highest-scoring "
                               "history pages plus its own chunk causally (dense while the history has at most K pages); 0: dense. With "
                               "host offload (--offload) only the selected pages are copied to the device.") +
                       (training ? " With --attn-cache, stage 2 loads stage 1's result over the same pages" : ""))
        ->capture_default_str();
    app.add_option("--sparse-score", o.score,
                   "with --sparse-pages: mean (softmax over pages of the group-summed query . the page's mean key, the reference's) "
                   "or quest (upper bound from per-dimension key min/max)")
        ->capture_default_str();
    app.add_option("--sparse-sink", o.sink, "with --sparse-pages: the first N history pages are always kept (counted inside K)")
        ->capture_default_str();
    app.add_option("--sparse-local", o.local, "with --sparse-pages: the latest N history pages are always kept (counted inside K)")
        ->capture_default_str();
}

void check_sparse_options(const char * prog, const CLI::App & app, const SparseOptions & o) {
    if (o.pages < 0) fail(prog, "--sparse-pages must be >= 0 (0: dense attention), got " + std::to_string(o.pages));
    if (o.score != "mean" && o.score != "quest") fail(prog, "--sparse-score must be mean or quest, got '" + o.score + "'");
    if (o.pages == 0) {
        for (const char * opt : {"--sparse-score", "--sparse-sink", "--sparse-local"})
            if (app.count(opt)) fail(prog, std::string(opt) + " needs --sparse-pages K (K >= 1)");
        return;
    }
    if (o.sink < 0 || o.local < 0) fail(prog, "--sparse-sink and --sparse-local must be >= 0");
    if ((int64_t) o.sink + o.local > o.pages)
        fail(prog, "--sparse-sink " + std::to_string(o.sink) + " + --sparse-local " + std::to_string(o.local) + " exceed --sparse-pages " +
                       std::to_string(o.pages) + " (the always-kept pages count inside the budget)");
}

void apply_sparse_options(const SparseOptions & o, ChunkParams * tp) {
    tp->sparse.pages = o.pages;
    tp->sparse.score = o.score == "quest" ? OOMB_SPARSE_SCORE_QUEST : OOMB_SPARSE_SCORE_MEAN;
    tp->sparse.sink = o.sink;
    tp->sparse.local = o.local;
}

std::string sparse_summary_line(const SparseOptions & o, int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t page) {
    if (o.pages == 0) return "";
    const oomb_sparse_score s = o.score == "quest" ? OOMB_SPARSE_SCORE_QUEST : OOMB_SPARSE_SCORE_MEAN;
    char buf[256];
    snprintf(buf, sizeof(buf), "sparse attention: K %d pages/tile, %s, sink %d, local %d; page summaries %.1f B/token (%lld layers)",
             o.pages, o.score.c_str(), o.sink, o.local, oomb_sparse_summary_bytes_per_token(s, n_head_kv, head_dim, page) * (double) n_layer,
             (long long) n_layer);
    return buf;
}

} // namespace train
} // namespace oomb
