// oomb-train's data: the training and held-out token ids (text through the tokenizer, or binary
// ids), cut into sequences of --ctx tokens, and the sampler that draws them (a reproducible
// permutation per epoch whose state a checkpoint stores).
#pragma once

#include "train-chat.h"
#include "train-options.h"

#include "tokenizer.h"

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace oomb {
namespace train {

struct Data {
    std::vector<int32_t> train, eval;
    // chat data only (else empty): per-position labels beside train / eval (ChunkDriver's labels:
    // the target of each position, or ignore_index)
    std::vector<int32_t> train_labels, eval_labels;
    int64_t n_seqs = 0;            // training sequences of ctx tokens
    std::vector<int64_t> eval_off; // eval sequences: offsets into `eval`
    std::vector<int64_t> eval_len;
    uint64_t hash = 0;
};

// Data position: epoch, index into the epoch's permutation, and the RNG that draws permutations
// (its state at the start of the current epoch, so the permutation can be rebuilt on resume).
struct Sampler {
    int64_t n = 0;
    int64_t epoch = 0, pos = 0;
    std::mt19937_64 rng;
    std::string rng_epoch_start;
    std::vector<int64_t> perm;

    static std::string save_rng(const std::mt19937_64 & r) {
        std::ostringstream s;
        s << r;
        return s.str();
    }
    void shuffle() {
        rng_epoch_start = save_rng(rng);
        perm.resize((size_t) n);
        for (int64_t i = 0; i < n; i++) perm[i] = i;
        for (int64_t i = n - 1; i > 0; i--) {   // Fisher-Yates with a portable draw
            const int64_t j = (int64_t) (rng() % (uint64_t) (i + 1));
            std::swap(perm[i], perm[j]);
        }
    }
    void init(int64_t n_, uint64_t seed) {
        n = n_;
        rng.seed(seed);
        epoch = 0;
        pos = 0;
        shuffle();
    }
    bool restore(int64_t n_, int64_t ep, int64_t p, const std::string & rng_state) {
        n = n_;
        std::istringstream s(rng_state);
        s >> rng;
        if (s.fail()) return false;
        epoch = ep;
        pos = p;
        shuffle();
        return pos >= 0 && pos <= n;
    }
    int64_t next() {
        if (pos >= n) {
            epoch++;
            pos = 0;
            shuffle();
        }
        return perm[(size_t) pos++];
    }
};

/// Fails (exit 1) when a --data / --eval-data path or the --data-bin file does not exist (checked
/// before the model is loaded).
void check_data_paths(const Options & o);

/// Loads and checks the data: ids < n_vocab, at least --ctx training tokens; fills d (sequences of
/// --ctx tokens; the held-out split: --eval-data, or the last --eval-split percent; at most
/// --eval-seqs evaluation sequences). tok: NULL with --data-bin. Fails (exit 1) with a message.
/// --data-format chat: the JSONL conversations rendered with the chat template of tok_gguf (the
/// GGUF the tokenizer came from), laid out in sequences of --ctx tokens with labels (train-chat.h);
/// the held-out split is the last --eval-split percent of the conversations (or --eval-data).
void load_data(const Options & o, int64_t n_vocab, const Tokenizer * tok, int32_t eos, int threads, Data * d,
               const std::string & tok_gguf = "");

/// Token-level form of a chat data set: the conversations of `paths` (JSONL) rendered, tokenized
/// and laid out (used by load_data; exposed for tests). Fails (exit 1) naming FILE:LINE.
ChatSequences chat_sequences(const Options & o, const std::vector<std::string> & paths, const char * opt, const Tokenizer & tok,
                            const ChatTemplate & t, int32_t pad);

} // namespace train
} // namespace oomb
