// Shared pieces of the training benchmarks (bench/oomb-bench-*.cpp): a Qwen2 model from a GGUF
// or from explicit shapes (default: the qwen2-micro fixture's shapes), deterministic token ids
// (the same formula as bench/cpu/bench_torch.py), peak RSS, wall clock.
#pragma once

#include "qwen2.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bench {

struct ModelOptions {
    std::string model;                  // GGUF path; empty: fresh random weights of the shapes below
    int64_t vocab = 4096, embd = 128, ff = 352, layers = 2, heads = 2, kv_heads = 1, head_dim = 64;
    bool untied = false;
    uint64_t seed = 42;
    void add(CLI::App & app);
    std::string shape_str(const oomb::Qwen2Config & c) const;
};

std::unique_ptr<oomb::Qwen2Model> make_model(const ModelOptions & o, oomb_backend_t be);

/// "" when the options of one training step are valid, else the error naming the first bad one:
/// --ctx >= 2 (one token has nothing to predict), --chunk >= 1, --page from 1 to --ctx, --threads
/// from 1 to OOMB_CPU_MAX_THREADS (the rules oomb-train applies).
std::string step_options_error(int64_t ctx, int64_t chunk, int page, int threads);

/// An oomb_error (e.g. memory that cannot be allocated) prints "<prog>: error: <message>" and exits
/// with status 1, as the other tools do, instead of aborting.
void exit_on_oomb_error(const char * prog);

/// ids[i] = ((i * 2654435761 + 12345) mod 2^32) mod vocab: the formula bench_torch.py uses too.
std::vector<int32_t> make_ids(int64_t n, int64_t vocab);

/// Peak resident set of this process (getrusage ru_maxrss), bytes.
size_t peak_rss_bytes();
/// Current resident set (/proc/self/statm), bytes.
size_t cur_rss_bytes();
double now_s();

} // namespace bench
