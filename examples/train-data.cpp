// oomb-train's data and sampler (see train-data.h).
#include "train-data.h"

#include "oomb-chunk.h"  // ChunkParams::ignore_index

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
        if (!is_file(p) && !is_dir(p)) fail(PROG, "--data: " + not_a_file_or_folder(p));
    for (const auto & p : o.eval_data)
        if (!is_file(p) && !is_dir(p)) fail(PROG, "--eval-data: " + not_a_file_or_folder(p));
    if (!o.data_bin.empty() && !is_file(o.data_bin)) fail(PROG, "--data-bin: " + not_a_file(o.data_bin));
}

ChatSequences chat_sequences(const Options & o, const std::vector<std::string> & paths, const char * opt, const Tokenizer & tok,
                            const ChatTemplate & t, int32_t pad) {
    const bool assistant_only = o.train_on != "all";
    std::vector<std::vector<ChatMessage>> convs;
    std::vector<std::string> where;
    ChatFileStats fs;
    read_chat_files(paths, opt, assistant_only, o.skip_bad_lines, &convs, &where, &fs);
    if (fs.n_bad) printf("%s: skipped %" PRId64 " bad line(s) of %" PRId64 " (--skip-bad-lines)\n", opt, fs.n_bad, fs.n_lines);
    ChatLayout L;
    L.ctx = o.ctx;
    L.pack = o.chat_pack;
    L.long_mode = o.chat_long;
    L.pad = pad;
    L.ignore_index = ChunkParams().ignore_index;
    ChatSequences s;
    std::string err;
    for (size_t i = 0; i < convs.size(); i++) {
        ChatTokens c;
        if (!tokenize_chat(tok, t, convs[i], assistant_only, &c, &err)) fail(PROG, std::string(opt) + ": " + err);
        if (!layout_chat(L, c, &s, &err)) fail(PROG, std::string(opt) + ": " + where[i] + ": " + err);
    }
    layout_chat_finish(L, &s);
    if (s.n_skipped_long) printf("%s: skipped %" PRId64 " conversation(s) longer than --ctx %" PRId64 " (--chat-long skip)\n", opt, s.n_skipped_long, o.ctx);
    if (s.n_split_long) printf("%s: split %" PRId64 " conversation(s) longer than --ctx %" PRId64 " (--chat-long split)\n", opt, s.n_split_long, o.ctx);
    if (s.n_no_target) printf("%s: dropped %" PRId64 " sequence(s) with no %s token to learn\n", opt, s.n_no_target, assistant_only ? "assistant" : "target");
    return s;
}

namespace {
// --data-format chat: conversations -> sequences of ctx tokens with labels.
void load_chat_data(const Options & o, const Tokenizer * tok, const std::string & tok_gguf, Data * d) {
    if (!tok) fail(PROG, "chat data needs a tokenizer: the model file has none; give --vocab FILE.gguf");
    std::string tmpl, err;
    bool has = false;
    if (!read_chat_template(tok_gguf, &tmpl, &has, &err)) fail(PROG, "chat template: " + err);
    ChatTemplate t;
    if (!chat_template_recognise(has ? &tmpl : nullptr, tok_gguf, &t, &err)) fail(PROG, err);
    printf("chat: %s; loss on %s tokens; %s\n", t.source.c_str(), o.train_on == "all" ? "all" : "assistant",
           o.chat_pack ? "conversations packed into sequences of --ctx tokens" : "one conversation per sequence, padded to --ctx");
    int32_t pad = tok->pad_id();
    if (pad < 0) pad = tok->eos_id();
    if (pad < 0) pad = 0;  // any id: padding has no label and, after the conversation, no effect on it (causal)
    ChatSequences tr = chat_sequences(o, o.data, "--data", *tok, t, pad), ev;
    if (tr.n_seqs == 0)
        fail(PROG, "--data: no conversation to train on: the files hold no usable conversation (empty, or every line skipped)");
    if (!o.eval_data.empty()) {
        ev = chat_sequences(o, o.eval_data, "--eval-data", *tok, t, pad);
    } else if (o.eval_split > 0) {  // the last --eval-split percent of the sequences
        const int64_t n_ev = (int64_t) std::floor((double) tr.n_seqs * o.eval_split / 100.0);
        const size_t cut = (size_t) ((tr.n_seqs - n_ev) * o.ctx);
        ev.ids.assign(tr.ids.begin() + cut, tr.ids.end());
        ev.labels.assign(tr.labels.begin() + cut, tr.labels.end());
        ev.n_seqs = n_ev;
        tr.ids.resize(cut);
        tr.labels.resize(cut);
        tr.n_seqs -= n_ev;
    }
    if (tr.n_seqs == 0) fail(PROG, "--data: no training sequence (no conversation with a token to learn" +
                                       std::string(o.eval_data.empty() && o.eval_split > 0 ? " after the held-out split)" : ")"));
    d->train = std::move(tr.ids);
    d->train_labels = std::move(tr.labels);
    d->eval = std::move(ev.ids);
    d->eval_labels = std::move(ev.labels);
    d->n_seqs = tr.n_seqs;
    for (int64_t i = 0; i < ev.n_seqs && (int) d->eval_off.size() < o.eval_seqs; i++) {
        d->eval_off.push_back(i * o.ctx);
        d->eval_len.push_back(o.ctx);
    }
    int64_t n_tr_t = 0, n_ev_t = 0;
    for (int32_t l : d->train_labels) n_tr_t += l != ChunkParams().ignore_index;
    for (int32_t l : d->eval_labels) n_ev_t += l != ChunkParams().ignore_index;
    uint64_t h = hash64(d->train.data(), d->train.size() * 4);
    h = hash64(d->train_labels.data(), d->train_labels.size() * 4, h);
    h = hash64(d->eval.data(), d->eval.size() * 4, h);
    d->hash = hash64(d->eval_labels.data(), d->eval_labels.size() * 4, h);
    printf("data: train %" PRId64 " sequences of %" PRId64 " (%" PRId64 " tokens with a loss); held-out %" PRId64 " sequences (%" PRId64
           " tokens with a loss; %zu eval sequences)\n", d->n_seqs, o.ctx, n_tr_t, ev.n_seqs, n_ev_t, d->eval_off.size());
}
} // namespace

void load_data(const Options & o, int64_t n_vocab, const Tokenizer * tok, int32_t eos, int threads, Data * d, const std::string & tok_gguf) {
    if (o.data_format == "chat") return load_chat_data(o, tok, tok_gguf, d);
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    size_t n_bytes = 0;
    if (!o.data_bin.empty()) {
        if (!read_ids_bin(o.data_bin, n_vocab, &d->train, &err)) fail(PROG, "--data-bin: " + err);
        for (const auto & e : o.eval_data)
            if (!read_ids_bin(e, n_vocab, &d->eval, &err)) fail(PROG, "--eval-data: " + err);
    } else {
        if (!tok) fail(PROG, "text data needs a tokenizer: the model file has none; give --vocab FILE.gguf or use --data-bin");
        for (const std::string & p : o.data)  // conversations read as plain text train on the JSON syntax too
            if (std::any_of(chat_file_extensions().begin(), chat_file_extensions().end(), [&](const std::string & e) { return ends_with(p, e); }))
                fprintf(stderr, "%s: note: --data %s is read as plain text (JSON included); for conversations give --data-format chat\n",
                        PROG, p.c_str());
        if (!tokenize_paths(*tok, o.data, eos, threads, &d->train, &n_bytes, &err)) fail(PROG, "--data: " + err);
        if (n_bytes == 0) fail(PROG, "--data: the text is empty (0 bytes in " + std::to_string(o.data.size()) + " path(s))");
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
