// oomb-eval's windows and their scored positions (see eval-windows.h).
#include "eval-windows.h"

#include <algorithm>

namespace oomb {
namespace train {

bool eval_window_count(int64_t n, const EvalWindowing & w, int64_t * count, std::string * err) {
    if (w.ctx < 1) {
        *err = "window length " + std::to_string(w.ctx) + " must be >= 1";
        return false;
    }
    if (!w.second_half) {
        if (n < 2) {
            *err = "the data hold " + std::to_string(n) + " token(s); at least 2 are needed";
            return false;
        }
        const int64_t ctx = std::min(w.ctx, n);
        // windows start every ctx tokens; a last window of a single token has no target
        *count = (n - 1 + ctx - 1) / ctx;
        return true;
    }
    if (w.ctx < 3) {
        *err = "--score-second-half needs --ctx >= 3 (a window of " + std::to_string(w.ctx) + " has no scored position)";
        return false;
    }
    if (n < w.ctx) {
        *err = "--score-second-half: the data hold " + std::to_string(n) + " tokens, fewer than one window of --ctx " +
               std::to_string(w.ctx) + " (llama-perplexity itself needs at least 2 x ctx)";
        return false;
    }
    *count = n / w.ctx;
    return true;
}

EvalWindow eval_window(const int32_t * ids, int64_t n, int64_t k, const EvalWindowing & w) {
    EvalWindow r;
    if (!w.second_half) {
        const int64_t ctx = std::min(w.ctx, n);
        r.offset = k * ctx;
        const int64_t len = std::min(ctx, n - r.offset);
        r.ids.assign(ids + r.offset, ids + r.offset + len);
        r.n_targets = len - 1;
        return r;
    }
    const int64_t ctx = w.ctx, first = ctx / 2;
    r.offset = k * ctx;
    r.ids.assign(ids + r.offset, ids + r.offset + ctx);
    if (w.bos >= 0) r.ids[0] = w.bos;
    r.labels.assign((size_t) ctx, w.ignore_index);
    for (int64_t i = first; i + 1 < ctx; i++) r.labels[(size_t) i] = ids[r.offset + i + 1];
    r.n_targets = ctx - first - 1;
    return r;
}

} // namespace train
} // namespace oomb
