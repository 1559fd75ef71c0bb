// oomb-train's data and sampler (see train-data.h).
#include "train-data.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace oomb {
namespace train {

namespace {
const char * PROG = TRAIN_PROG;
} // namespace

void check_data_paths(const Options & o) {
    for (const auto & p : o.data)
        if (!is_file(p) && !is_dir(p)) fail(PROG, "--data: '" + p + "': no such file or folder");
    for (const auto & p : o.eval_data)
        if (!is_file(p) && !is_dir(p)) fail(PROG, "--eval-data: '" + p + "': no such file or folder");
    if (!o.data_bin.empty() && !is_file(o.data_bin)) fail(PROG, "--data-bin: '" + o.data_bin + "': no such file");
}

void load_data(const Options & o, int64_t n_vocab, const Tokenizer * tok, int32_t eos, int threads, Data * d) {
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    size_t n_bytes = 0;
    if (!o.data_bin.empty()) {
        if (!read_ids_bin(o.data_bin, n_vocab, &d->train, &err)) fail(PROG, "--data-bin: " + err);
        for (const auto & e : o.eval_data)
            if (!read_ids_bin(e, n_vocab, &d->eval, &err)) fail(PROG, "--eval-data: " + err);
    } else {
        if (!tok) fail(PROG, "text data needs a tokenizer: the model file has none; give --vocab FILE.gguf or use --data-bin");
        if (!tokenize_paths(*tok, o.data, eos, threads, &d->train, &n_bytes, &err)) fail(PROG, "--data: " + err);
        if (!o.eval_data.empty() && !tokenize_paths(*tok, o.eval_data, eos, threads, &d->eval, nullptr, &err))
            fail(PROG, "--eval-data: " + err);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t n_all = (int64_t) d->train.size();
    if (o.eval_data.empty() && o.eval_split > 0) {
        const int64_t n_eval = (int64_t) std::floor((double) n_all * o.eval_split / 100.0);
        d->eval.assign(d->train.end() - n_eval, d->train.end());
        d->train.resize((size_t) (n_all - n_eval));
    }
    const int64_t n_train = (int64_t) d->train.size();
    if (n_train < o.ctx) {
        char b[512];
        snprintf(b, sizeof(b), "--ctx %" PRId64 " is longer than the training data: %" PRId64 " tokens%s (lower --ctx or give more data)",
                 o.ctx, n_train, (o.eval_data.empty() && o.eval_split > 0) ? " after the held-out split" : "");
        fail(PROG, b);
    }
    d->n_seqs = n_train / o.ctx;
    const int64_t n_eval = (int64_t) d->eval.size();
    for (int64_t off = 0; off + 1 < n_eval && (int) d->eval_off.size() < o.eval_seqs; off += o.ctx) {
        d->eval_off.push_back(off);
        d->eval_len.push_back(std::min<int64_t>(o.ctx, n_eval - off));
    }
    uint64_t h = hash64(d->train.data(), d->train.size() * 4);
    h = hash64(d->eval.data(), d->eval.size() * 4, h);
    d->hash = h;
    printf("data: %" PRId64 " tokens", n_all);
    if (n_bytes) printf(" from %.1f MB of text (%.2f bytes/token, tokenized in %.1f s)", n_bytes / 1e6, (double) n_bytes / std::max<int64_t>(1, n_all), dt);
    printf("\n      train %" PRId64 " tokens = %" PRId64 " sequences of %" PRId64 "; held-out %" PRId64 " tokens (%zu eval sequences)\n",
           n_train, d->n_seqs, o.ctx, n_eval, d->eval_off.size());
}

} // namespace train
} // namespace oomb
