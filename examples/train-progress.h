// Progress lines inside a long call of the chunk driver (oomb-train's step, oomb-eval's windows):
// ChunkDriver::set_progress reports every chunk of both stages; this turns those reports into at
// most one stdout line every --progress-every seconds, the first one only that long after the job
// (a step, an evaluation) started, so short jobs print nothing:
//   "  step 1/1 | stage 1 chunk 123/512 | 2345 tok/s | step ETA 3m12s | GPU 129.70 GiB of 139.80 GiB | RSS 72.20 GiB"
// Design: the driver only counts chunks and tokens; the clock, the ETA rule and the formatting are
// here, in one place for both tools (fmt_bytes / fmt_duration / rss_bytes / gpu_memory_field of
// train-common).
#pragma once

#include "oomb-backend.h"
#include "oomb-chunk.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace oomb {
namespace train {

/// Adds --progress-every SECONDS (a double; default 30; 0: off) to a tool's command line.
void add_progress_option(CLI::App & app, double & every_s);
/// Checks it: finite and >= 0, else fails (exit 1) naming the option and its range.
void check_progress_option(const char * prog, double every_s);

/// The reporter of one tool. A job (begin_job) is a sequence of n_items driver calls (the
/// sequences of a step, the windows of an evaluation); install() hooks it into a driver.
class ChunkProgressLine {
public:
    /// every_s: seconds between lines (0: never print); be: whose memory the line shows.
    ChunkProgressLine(double every_s, oomb_backend_t be) : every_s_(every_s), be_(be) {}
    /// Sets driver's progress hook to this reporter (nothing when every_s is 0).
    void install(ChunkDriver & driver);
    /// A new job of n_items driver calls: resets the clock (the first line comes every_s later).
    /// eta_name: what the ETA is of ("step ETA", "ETA").
    void begin_job(int64_t n_items, const std::string & eta_name);
    /// Item i (0-based) of the job starts; label leads its lines ("step 3/100", "windows 2/10 done").
    void begin_item(int64_t i, const std::string & label);
    /// The driver's report (installed as its hook).
    void on_chunk(const ChunkProgress & p);

private:
    using clock = std::chrono::steady_clock;
    double every_s_ = 0;
    oomb_backend_t be_ = nullptr;
    std::string eta_name_, label_;
    int64_t n_items_ = 1, item_ = 0;
    clock::time_point t_last_{}, t_item_{}, t_stage_{};
    double s1_ = 0, s2_ = 0;    // seconds per token of stage 1 / stage 2 measured so far in this job (0: not yet)
    double item_s_ = 0;         // seconds of the last completed item (0: none yet)
};

} // namespace train
} // namespace oomb
