// Sparse attention settings of oomb-train and oomb-eval (--sparse-pages, --sparse-score,
// --sparse-sink, --sparse-local; OOMB mechanism 4, oomb-sparse.h): one definition of the options,
// their checks and how they set the chunk driver's parameters, so training, its verification
// (--dump-grads / --dump-logits) and evaluation apply the same selection rule.
#pragma once

#include "oomb-chunk.h"

#include <CLI/CLI.hpp>

#include <string>

namespace oomb {
namespace train {

struct SparseOptions {
    int pages = 0;               // K history pages per query tile; 0: dense attention
    std::string score = "mean";  // mean (the reference's) or quest
    int sink = 0;                // first history pages always kept (inside K)
    int local = 0;               // latest history pages always kept (inside K)
};

/// The options on app; training: the help text of oomb-train (the attention cache's stage 2), else of
/// an evaluation tool.
void add_sparse_options(CLI::App & app, SparseOptions & o, bool training = true);
/// Errors (fail): K < 0, an unknown score, --sparse-score / -sink / -local without --sparse-pages,
/// sink or local < 0, sink + local > K. Host offload (only the selected pages stream) and the
/// attention cache (it keeps the result over the selected pages) are allowed.
void check_sparse_options(const char * prog, const CLI::App & app, const SparseOptions & o);
/// Sets tp->sparse from o (off when o.pages == 0).
void apply_sparse_options(const SparseOptions & o, ChunkParams * tp);
/// One line for the run's header: "sparse attention: K 64 pages/tile, mean, sink 0, local 0;
/// summaries 448 B/token" (empty when off).
std::string sparse_summary_line(const SparseOptions & o, int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t page);

} // namespace train
} // namespace oomb
