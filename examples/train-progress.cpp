// Progress lines inside a long driver call: see train-progress.h.
#include "train-progress.h"

#include "train-common.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace oomb {
namespace train {

void add_progress_option(CLI::App & app, double & every_s) {
    app.add_option("--progress-every", every_s,
                   "seconds between progress lines inside a step / an evaluation (chunk, stage, tok/s, ETA, memory; "
                   "fractions allowed; the first after that long, so short steps print none; 0: off)")
        ->capture_default_str();
}

void check_progress_option(const char * prog, double every_s) {
    need_in_range(prog, std::isfinite(every_s) && every_s >= 0, "--progress-every", every_s, "a finite number of seconds >= 0 (0: off)");
}

void ChunkProgressLine::install(ChunkDriver & driver) {
    if (every_s_ > 0) driver.set_progress([this](const ChunkProgress & p) { on_chunk(p); });
}

void ChunkProgressLine::begin_job(int64_t n_items, const std::string & eta_name) {
    n_items_ = n_items;
    eta_name_ = eta_name;
    t_last_ = clock::now();
    s1_ = s2_ = item_s_ = 0;
}

void ChunkProgressLine::begin_item(int64_t i, const std::string & label) {
    const clock::time_point now = clock::now();
    if (i > 0) item_s_ = std::chrono::duration<double>(now - t_item_).count();
    item_ = i;
    label_ = label;
    t_item_ = now;
}

void ChunkProgressLine::on_chunk(const ChunkProgress & p) {
    const clock::time_point now = clock::now();
    if (p.chunks_done == 0) {  // a stage starts: its own clock
        t_stage_ = now;
        return;
    }
    const double el = std::chrono::duration<double>(now - t_stage_).count();
    const double per_tok = el / (double) p.tokens_done;  // seconds per token of this stage so far
    (p.stage == 1 ? s1_ : s2_) = per_tok;
    if (std::chrono::duration<double>(now - t_last_).count() < every_s_) return;
    t_last_ = now;
    // The ETA rule: the rest of this stage at its own measured rate; in stage 1, a stage 2 still
    // to come counts twice stage 1's time per token (per chunk of equal length: its recompute is
    // the forward again, and the backward about as much) until a stage 2 of this job has measured
    // itself. Later items of the job take as long as the last completed one, or else this one's
    // estimate.
    const double s2 = s2_ > 0 ? s2_ : 2.0 * s1_;
    double rest = (double) (p.n_tokens - p.tokens_done) * per_tok;
    if (p.stage == 1 && p.n_stages == 2) rest += (double) p.n_tokens * s2;
    const double item_est = item_s_ > 0 ? item_s_ : (double) p.n_tokens * (p.n_stages == 2 ? s1_ + s2 : per_tok);
    rest += (double) (n_items_ - item_ - 1) * item_est;
    const std::string stage = p.n_stages == 2 ? "stage " + std::to_string(p.stage) + " chunk " : p.stage == 2 ? "stage 2 chunk " : "chunk ";
    printf("  %s | %s%" PRId64 "/%" PRId64 " | %.0f tok/s | %s %s%s | RSS %s\n", label_.c_str(), stage.c_str(), p.chunks_done, p.n_chunks,
           (double) p.tokens_done / std::max(1e-9, el), eta_name_.c_str(), fmt_duration(rest).c_str(), gpu_memory_field(be_).c_str(),
           fmt_bytes((double) rss_bytes()).c_str());
    fflush(stdout);
}

} // namespace train
} // namespace oomb
