// oomb-eval's windows: which tokens are evaluated together and which of them are scored. Two
// conventions, one function each so that both are unit-tested (tests/test-eval-windows.cpp):
//   - ours (the default): consecutive windows of ctx tokens, the last shorter one included, every
//     position but a window's last one predicts the next id;
//   - llama-perplexity's (--score-second-half; llama.cpp tools/perplexity/perplexity.cpp,
//     perplexity()): floor(n / ctx) windows of exactly ctx tokens (the remainder is not scored), the
//     window's first token replaced by BOS when the vocabulary says add_bos, and only positions
//     i in [ctx/2, ctx - 1) scored (the target ids[i + 1]): ctx - ctx/2 - 1 targets per window, so
//     every scored token has at least ctx/2 tokens of context. Same numbers as llama-perplexity
//     on the same ids (its mean NLL, printed by --ppl-output-type 1). llama-perplexity's ids are
//     the whole text tokenized with BOS first when add_bos: oomb-eval prepends it to a text's ids
//     too (not to --data-bin ids, which are taken as they are).
// Design: the convention is expressed as the ChunkDriver's per-position labels (ignore_index where
// nothing is scored), so the model's forward is the same code in both conventions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace train {

struct EvalWindowing {
    int64_t ctx = 4096;          // tokens per window
    bool second_half = false;    // llama-perplexity's convention (see above)
    int32_t bos = -1;            // second_half only: id put at each window's start, -1: none
    int32_t ignore_index = -100; // label of an unscored position (ChunkParams::ignore_index)
};

// One window: ids[offset, offset + ids.size()) of the stream (the first one possibly replaced by
// BOS) and its labels (empty: the driver's default, every next id a target).
struct EvalWindow {
    int64_t offset = 0;
    std::vector<int32_t> ids;
    std::vector<int32_t> labels;
    int64_t n_targets = 0;       // positions with a target
};

// Number of windows over n ids; false with *err naming the problem when the convention cannot be
// applied (second_half: ctx < 3 has no scored position; n < ctx not one whole window).
bool eval_window_count(int64_t n, const EvalWindowing & w, int64_t * count, std::string * err);

// Window k (0 <= k < eval_window_count) of the n ids.
EvalWindow eval_window(const int32_t * ids, int64_t n, int64_t k, const EvalWindowing & w);

} // namespace train
} // namespace oomb
