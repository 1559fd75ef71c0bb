// oomb-train: trains or fine-tunes a Qwen2 / Qwen2.5 model with OOMB chunk-recurrent training over
// paged KV caches (ggml-oomb/oomb-chunk.h ChunkDriver with the Qwen2 chunk graph), AdamW, a
// warmup + cosine learning-rate schedule, held-out evaluation, a JSONL log, a loss-curve PNG and
// exactly resumable checkpoints.
//
//   oomb-train                                       the built-in default run: pre-train the tiny
//                                                    preset on data/python-docs.txt.gz
//   oomb-train -m MODEL.gguf --data TEXT... --ctx 8192 --steps 500 --lr 5e-5 --trainable linear
//   oomb-train --preset qwen2.5-0.5b --data-bin IDS.bin --ctx 65536 --chunk 4096
//   oomb-train ... --resume                         continue from OUT/model.gguf + OUT/state.safetensors
//   oomb-train -m BASE.gguf --data TEXT --trainable lora --lora-rank 16 --lora-alpha 32
//                                                    LoRA on a frozen base: OUT/adapter.gguf (llama.cpp's format)
//   oomb-train -m M.gguf --tokens IDS.safetensors --chunk C --page P --dump-grads G.safetensors
//   oomb-train -m M.gguf --tokens IDS.safetensors --chunk C --page P --dump-logits L.safetensors
//                                                    (verification: loss and d(mean loss)/d(param))
//
// This file is the run, top-down: set-up (output folder, model, tokenizer, data, optimizer,
// driver, resume), then the loop (steps, log, evaluation, checkpoints). The options are in
// train-options, the data and sampler in train-data, the checkpoints (atomic saves, resume) in
// train-checkpoint, --dump-grads in train-verify.
#include "train-checkpoint.h"
#include "train-common.h"
#include "train-data.h"
#include "train-options.h"
#include "train-verify.h"

#include "oomb-chunk.h"
#include "oomb-opt.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

#include <nlohmann/json.hpp>
#include "../gguf-tools/tool-cli.h"  // output_is_input_error

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>

using namespace oomb;
using namespace oomb::train;
using json = nlohmann::json;

namespace {

const char * PROG = TRAIN_PROG;

// ---- a graceful stop: the first SIGINT / SIGTERM / SIGHUP lets the step end, saves a checkpoint (as at the run's end)
// and exits with 128 + the signal's number; a second one stops at once (the temporary files of a save in progress
// removed, then the signal's default action, as install_temp_file_cleanup's handler does). A scheduler's SIGTERM
// (preemption) or a Ctrl-C then loses no steps; --resume continues. Signals ignored at start (nohup) stay ignored.
// With --save-every -1 (no checkpoint to write) the handler is not installed: a signal stops the run at once.
volatile sig_atomic_t g_stop_signal = 0;

void stop_handler(int sig) {
    if (g_stop_signal) {
        remove_temp_files();
        signal(sig, SIG_DFL);
        raise(sig);  // pending until this handler returns (the signal is blocked in it), then the default action
        return;
    }
    g_stop_signal = sig;
    static const char msg[] = "\noomb-train: stopping after this step with a checkpoint (--resume continues it; signal again to stop now)\n";
    const ssize_t r = write(2, msg, sizeof msg - 1);
    (void) r;
}

// The signals whose disposition was the default at start (record_default_signals, before install_temp_file_cleanup
// replaces it): install_stop_handler takes over those, at the training loop's start. Before it (loading, tokenizing)
// and in --dump-grads runs, a signal stops the program at once, as it would have.
bool g_default_signal[3] = {false, false, false};
const int kStopSignals[3] = {SIGINT, SIGTERM, SIGHUP};

void record_default_signals() {
    for (int i = 0; i < 3; i++) {
        struct sigaction old;
        g_default_signal[i] = sigaction(kStopSignals[i], nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL;
    }
}

void install_stop_handler() {
    for (int i = 0; i < 3; i++) {
        const int sig = kStopSignals[i];
        if (!g_default_signal[i]) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = stop_handler;
        sigemptyset(&sa.sa_mask);
        for (int s : kStopSignals) sigaddset(&sa.sa_mask, s);
        sa.sa_flags = SA_RESTART;
        sigaction(sig, &sa, nullptr);
    }
}

// OOMB_PROFILE_FIRST_STEP=1: a profile (OOMB_CUDA_PROFILE) keeps the first step's one-time costs (a number, 0
// off; unset or empty: off). Anything else is an error naming the variable, read before the first step: a
// typo never passes for 0 (atoi's reading) after a step's work.
bool profile_first_step() {
    const char * e = getenv("OOMB_PROFILE_FIRST_STEP");
    if (!e || !*e) return false;
    long long v = 0;
    const char * end = e + strlen(e);
    const char * b = *e == '+' && e[1] != '-' ? e + 1 : e;  // "+1" as strtol reads it (the OOMB_CUDA_* variables); from_chars takes no '+'
    const auto r = std::from_chars(b, end, v);
    if (b == end || r.ec != std::errc() || r.ptr != end)
        fail(PROG, std::string("OOMB_PROFILE_FIRST_STEP=") + e + ": expected a number (0: off, 1: keep the first step in the profile)");
    return v != 0;
}

double lr_at(const Options & o, int64_t step) {   // step: 0-based
    const double min_lr = min_lr_of(o);
    if (o.warmup > 0 && step < o.warmup) return o.lr * (double) (step + 1) / (double) o.warmup;
    const double span = std::max<int64_t>(1, o.steps - o.warmup);
    const double p = std::min(1.0, (double) (step - o.warmup) / span);
    return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * p));
}

class Trainer {
public:
    Options o;
    oomb_backend_t be = nullptr;
    std::unique_ptr<Qwen2Model> model;
    std::string vocab_src;            // GGUF whose tokenizer keys go into saved models
    std::vector<oomb_tensor *> params;
    oomb_optimizer_t opt = nullptr;
    std::unique_ptr<ChunkDriver> tr;
    std::unique_ptr<ChunkProgressLine> progress;  // --progress-every lines inside a step / an evaluation
    Data data;
    Sampler sampler;
    int64_t step = 0;                 // completed steps
    int bad_run = 0;                  // consecutive non-finite steps
    double elapsed_prev = 0;          // training seconds before this process (resume)
    int64_t tokens_seen = 0;
    std::vector<LogEntry> history;
    FILE * jsonl = nullptr;

    std::string path(const std::string & name) const { return o.out + "/" + name; }

    ~Trainer() {
        if (jsonl) fclose(jsonl);
        tr.reset();
        if (opt) oomb_opt_free(opt);
        model.reset();
        if (be) oomb_backend_free(be);
    }

    double eval_loss(int64_t * n_targets) {
        double s = 0;
        int64_t n = 0;
        progress->begin_job((int64_t) data.eval_off.size(), "eval ETA");
        for (size_t i = 0; i < data.eval_off.size(); i++) {
            progress->begin_item((int64_t) i, "eval seq " + std::to_string(i + 1) + "/" + std::to_string(data.eval_off.size()));
            const int32_t * lab = data.eval_labels.empty() ? nullptr : data.eval_labels.data() + data.eval_off[i];  // chat: masked
            ChunkStats st = tr->forward(data.eval.data() + data.eval_off[i], data.eval_len[i], lab);
            s += st.loss_sum;
            n += st.n_targets;
        }
        *n_targets = n;
        return n ? s / (double) n : NAN;
    }

    // an output (train.jsonl, loss.png) that could not be written: said when it happens, and the run's exit status is 1
    bool output_failed = false;

    void log_json(const json & j) {
        if (!jsonl) return;
        const std::string s = j.dump();
        if (fprintf(jsonl, "%s\n", s.c_str()) < 0 || fflush(jsonl) != 0) {
            if (!output_failed) print_error(PROG, "cannot write " + path("train.jsonl") + ": " + strerror(errno));
            output_failed = true;
            clearerr(jsonl);
        }
    }

    void plot() {
        std::vector<CurvePoint> tr_pts, ev_pts;
        for (const auto & e : history) (e.eval ? ev_pts : tr_pts).push_back({(double) e.step, e.loss});
        std::string err;
        char title[256];
        snprintf(title, sizeof(title), "oomb-train: %s, ctx %" PRId64 ", chunk %" PRId64,
                 o.model.empty() ? ("preset " + o.preset).c_str() : o.model.c_str(), o.ctx, o.chunk);
        plot_ok = write_loss_png(path("loss.png"), tr_pts, ev_pts, title, &err);
        if (!plot_ok) {
            if (!plot_failed) print_error(PROG, "loss plot: " + err);  // (said once: the curve is drawn again at every save)
            plot_failed = output_failed = true;
        }
    }
    bool plot_ok = false, plot_failed = false;  // the last drawing written; any failed

    bool save(std::string * err) const {
        const TrainProgress p{step, bad_run, tokens_seen, elapsed_prev + run_seconds()};
        return save_checkpoint(o, *model, vocab_src, opt, sampler, data.hash, p, err);
    }

    std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
    double run_seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    }
};

int train_main(const Options & o, bool default_run, bool app_eval_every_given) {
    std::string err;
    const int threads = threads_default(o.threads);

    const bool keep_first_step_profile = profile_first_step();  // its errors before any work
    // ---- output folder
    const bool lora = o.trainable == "lora";
    const std::string ckpt_name = checkpoint_model_name(o);  // adapter.gguf with --trainable lora, else model.gguf
    if (struct stat os; stat(o.out.c_str(), &os) == 0 && !S_ISDIR(os.st_mode))
        fail(PROG, "--out '" + o.out + "' is " + file_kind(os.st_mode) + ", not a folder: --out names the folder for train.jsonl, "
                   "the checkpoints and loss.png");
    // the run's log there as a FIFO (or a folder): an error now, not a blocked open (or a failure) after loading
    if (struct stat ls; stat((o.out + "/train.jsonl").c_str(), &ls) == 0 && !S_ISREG(ls.st_mode))
        fail(PROG, "--out: the run's log " + not_a_file(o.out + "/train.jsonl") + "; remove it or give another --out");
    // the checkpoint's files and the curve there as folders (or FIFOs, devices): an error now, not at the first save after
    // the training it would lose
    for (const std::string f : {ckpt_name, std::string("state.safetensors"), std::string("loss.png"), std::string("adapter_model.safetensors"),
                                std::string("adapter_config.json")}) {
        if (f.rfind("adapter_", 0) == 0 && !lora) continue;
        if (struct stat ls; stat((o.out + "/" + f).c_str(), &ls) == 0 && !S_ISREG(ls.st_mode))
            fail(PROG, "--out: " + not_a_file(o.out + "/" + f) + ", where the run writes its " + (f == "loss.png" ? "loss curve" : "checkpoint") +
                           "; remove it or give another --out");
    }
    if (o.resume && !is_file(o.out + "/" + ckpt_name)) {
        // the other kind of checkpoint there: say which option continues it (not just that the file is missing)
        if (!lora && is_file(o.out + "/adapter.gguf"))
            fail(PROG, "--resume: '" + o.out + "' holds a LoRA checkpoint (" + o.out + "/adapter.gguf), not a full model's (model.gguf): "
                       "give --trainable lora (with the same -m base) to continue it");
        if (lora && is_file(o.out + "/model.gguf"))
            fail(PROG, "--resume: '" + o.out + "' holds a full model's checkpoint (" + o.out + "/model.gguf), not a LoRA adapter "
                       "(adapter.gguf): continue it with the --trainable it was trained with (all or linear), not lora");
        fail(PROG, "--resume: no checkpoint in '" + o.out + "' (" + not_a_file(o.out + "/" + ckpt_name) + ")");
    }
    if (!make_dirs(o.out, &err)) fail(PROG, err);
    data_exclude_folder(o.out);  // an --out inside a --data folder is not read as data
    lock_output_folder(o.out);
    remove_stale_temp_files(o.out);

    Trainer T;
    T.o = o;
    T.be = make_backend(o.device, threads, &err);
    if (!T.be) fail(PROG, err);

    check_data_paths(o);

    // ---- model
    const std::string ckpt_model = T.path(ckpt_name), ckpt_state = T.path("state.safetensors");
    if (o.save_every < 0 && o.resume)
        fail(PROG, "--resume with --save-every -1 would train past the checkpoint without saving, leaving the log ahead of it: "
                   "give --save-every 0 (save at the end) or more");
    if (o.save_every < 0 && (is_file(ckpt_state) || is_file(ckpt_model)))
        // a run that never saves would leave the old checkpoint beside its new log: a later --resume
        // would continue the old run under the new run's first log lines
        fail(PROG, o.out + " already holds a checkpoint, which --save-every -1 would leave beside this run's log; use another "
                       "--out, or remove " + ckpt_name + " and state.safetensors there");
    if (o.resume && !lora) {
        if (!is_file(ckpt_model)) fail(PROG, "--resume: no checkpoint in '" + o.out + "' (" + not_a_file(ckpt_model) + ")");
        T.model = model_load_gguf(ckpt_model, T.be, compute_type(T.be), &err);
        if (!T.model) fail(PROG, "--resume: " + err);
        // the checkpoint continues the model the options name: one of another shape (another --preset or -m) is a
        // model mismatch, said here before the tokenizer or the optimizer state disagree with it in their own terms
        Qwen2Config want;
        std::string named, e;
        if (!o.model.empty()) {
            // (a -m that cannot be read is an error, as without --resume: not a "changed" note and a run that ignores it)
            if (!is_file(o.model)) fail(PROG, "-m: " + not_a_file(o.model));
            GGUFReader r;
            std::string an;
            DecoderArch arch;
            if (r.open(o.model, &e) != GGUF_OK) fail(PROG, "-m: " + e);
            if (r.get_string("general.architecture", &an, &e) == GGUF_OK && decoder_arch_from_name(an, &arch) &&
                decoder_read_config(r, arch, &want, &e) == GGUF_OK)
                named = "-m " + o.model;
        } else if (o.preset_given && qwen2_preset(o.preset, &want)) {
            named = "--preset " + o.preset;
        }
        const Qwen2Config & c = T.model->cfg;
        auto shape = [](const Qwen2Config & x) {
            return std::string(decoder_arch_name(x.arch)) + ", vocab " + std::to_string(x.n_vocab) + ", embd " + std::to_string(x.n_embd) +
                   ", ff " + std::to_string(x.n_ff) + ", layers " + std::to_string(x.n_layer) + ", heads " + std::to_string(x.n_head) + "/" +
                   std::to_string(x.n_head_kv) + ", head dim " + std::to_string(x.head_dim);
        };
        if (!named.empty() && shape(c) != shape(want))
            fail(PROG, "--resume: the checkpoint " + ckpt_model + " is another model than " + named + " (checkpoint: " + shape(c) + "; " + named +
                           ": " + shape(want) + "): give the -m or --preset the checkpoint was trained from");
    } else if (!o.model.empty()) {  // with lora also on --resume: the frozen base
        if (!is_file(o.model)) fail(PROG, "-m: " + not_a_file(o.model));
        T.model = model_load_gguf(o.model, T.be, base_weight_type(o.base_type, T.be), &err, lora && o.base_type == "keep");
        if (!T.model) fail(PROG, err);
    } else {
        Qwen2Config c;
        if (!qwen2_preset(o.preset, &c)) fail(PROG, "unknown preset '" + o.preset + "'");  // checked with the options
        if (o.rope_theta > 0) c.rope_theta = (float) o.rope_theta;
        // --trainable lora: a frozen random base in --base-type (bf16 / f32 / the compute type, or the
        // projections as random blocks of q4_k_m / q4_k / q6_k / q8_0)
        std::vector<oomb_type> qtypes;
        const bool qbase = lora && base_type_is_block(o.base_type);
        if (qbase && !qwen2_random_base_types(c, o.base_type, &qtypes, &err)) fail(PROG, err);
        T.model = qwen2_create_or_error(c, T.be, lora ? base_weight_type(o.base_type, T.be) : compute_type(T.be), &err, qbase ? &qtypes : nullptr);
        if (!T.model) fail(PROG, "--preset " + o.preset + ": " + err);
        const auto t_init = std::chrono::steady_clock::now();
        qwen2_init_random(*T.model, o.seed);
        printf("init: preset %s, random weights made in %.1f s%s\n", o.preset.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count(),
               lora ? (" (frozen base, --base-type " + o.base_type + ")").c_str() : "");
    }
    Qwen2Model & M = *T.model;
    if (o.rope_theta > 0) M.cfg.rope_theta = (float) o.rope_theta;
    if (lora) {
        // the adapter: PEFT's initialisation (B = 0: the run starts at the base model), or the checkpoint's
        const LoraConfig lc = lora_config_of(o);
        // the adapter, its gradients and two f32 Adam moments, checked against the backend's free memory (the host's on
        // CPU) before any of it is allocated: a rank typed wrong (16000 for 16) would otherwise fill a CPU machine until
        // the kernel kills the process
        {
            size_t used = 0, total = 0;
            const bool dev = oomb_backend_memory(T.be, &used, &total);
            const double avail = dev ? (double) total - (double) used : (double) host_available();
            const double need = 16.0 * (double) lora_param_count(M, lc);
            if (avail > 0 && need > 0.9 * avail)
                fail(PROG, "--lora-rank " + std::to_string(lc.rank) + ": the adapter with its gradients and optimizer state needs " + fmt_bytes(need) +
                               ", " + (dev ? std::string(oomb_backend_name(T.be)) + " has " : std::string("the machine has ")) + fmt_bytes(avail) +
                               " available: use a smaller --lora-rank (at most about " +
                               std::to_string(std::max<int64_t>(1, (int64_t) ((double) lc.rank * 0.9 * avail / need))) + " fits)");
        }
        if (o.resume) {
            if (!lora_load_gguf(M, ckpt_model, &err)) fail(PROG, "--resume: " + err);
            const LoraConfig & fc = M.lora->cfg;
            // oomb-train writes complete adapters; a partial one (another tool's) would not match the optimizer state
            if (!M.lora->first_missing().empty())
                fail(PROG, "--resume: " + ckpt_model + " is a partial adapter (" + M.lora->first_missing() + " has no pair, other layers' have one); "
                               "--resume continues the complete adapters oomb-train writes");
            auto num = [](double v) { char b[32]; snprintf(b, sizeof b, "%g", v); return std::string(b); };  // 32, not 32.000000
            if (fc.rank != lc.rank || fc.alpha != lc.alpha || fc.targets != lc.targets)
                fail(PROG, "--resume: " + ckpt_model + " is an adapter of rank " + std::to_string(fc.rank) + ", alpha " + num(fc.alpha) +
                               ", targets " + lora_targets_string(fc.targets) + "; this run asks for rank " + std::to_string(lc.rank) + ", alpha " +
                               num(lc.alpha) + ", targets " + lora_targets_string(lc.targets) + " (--lora-rank, --lora-alpha, --lora-targets)");
        } else {
            if (!lora_attach(M, lc, &err)) fail(PROG, err);
            lora_init_peft(*M.lora, o.seed, lora_init_of(o));
            if (const int64_t full = M.lora->max_useful_rank(); lc.rank > full)
                fprintf(stderr, "%s: warning: --lora-rank %lld exceeds %lld, the smaller dimension of the smallest adapted projection: "
                                "a pair of that rank is no more expressive than rank %lld, only larger and slower\n",
                        PROG, (long long) lc.rank, (long long) full, (long long) full);
        }
    }

    // ---- tokenizer and the vocabulary written into saved models
    std::unique_ptr<Tokenizer> tok;
    std::string tok_src;
    if (!o.model.empty()) {  // the model's own tokenizer, when it has one
        auto t = std::make_unique<Tokenizer>();
        std::string e;
        const ModelTokenizer mt = load_model_tokenizer(o.model, t.get(), &e);
        if (mt == ModelTokenizer::Failed && o.data_bin.empty()) fail(PROG, "the model's tokenizer: " + e);
        if (mt == ModelTokenizer::Loaded) {
            tok = std::move(t);
            tok_src = o.model;
        }
        if (tok && !o.vocab.empty()) printf("note: --vocab %s is not used: the model has its own tokenizer\n", o.vocab.c_str());
    }
    if (!tok && !o.vocab.empty()) {
        if (!is_file(o.vocab)) {
            if (o.data_bin.empty()) fail(PROG, "--vocab: " + not_a_file(o.vocab));
        } else {
            tok = std::make_unique<Tokenizer>();
            if (tok->load_file(o.vocab, &err) != GGUF_OK) fail(PROG, "tokenizer: " + err);
            tok_src = o.vocab;
        }
    }
    if (tok) {
        if ((int64_t) tok->n_vocab() > M.cfg.n_vocab)
            fail(PROG, tok_src + ": the tokenizer has " + std::to_string(tok->n_vocab()) + " tokens but the model only " +
                           std::to_string(M.cfg.n_vocab) + " embedding rows");
        T.vocab_src = tok_src;
    } else if (o.data_bin.empty()) {
        // chat data are text only (--data-bin is refused with --data-format chat): advise only what works
        fail(PROG, o.model.empty() ? "no vocabulary: give --vocab FILE.gguf (default models/qwen2.5-vocab.gguf was not found)"
                                   : "'" + o.model + "' has no tokenizer: give --vocab FILE.gguf" +
                                         (o.data_format == "chat" ? " (chat data are tokenized: --data-format chat needs one)" : " or use --data-bin"));
    } else {
        printf("note: no tokenizer; saved models will carry no tokenizer keys\n");
    }
    int32_t eos = -1;
    if (tok) {
        eos = tok->find_token("<|endoftext|>");
        if (eos < 0) eos = tok->eos_id();
        if (eos < 0 && o.data_bin.empty()) fail(PROG, tok_src + ": the tokenizer has no end-of-text token");
    }

    printf("model: %s | vocab %" PRId64 ", embd %" PRId64 ", ff %" PRId64 ", layers %" PRId64 ", heads %" PRId64 "/%" PRId64
           ", head dim %" PRId64 ", %s, rope theta %g | %.2fM parameters\n",
           o.resume && !lora ? ckpt_model.c_str() : (!o.model.empty() ? o.model.c_str() : ("preset " + o.preset).c_str()), M.cfg.n_vocab,
           M.cfg.n_embd, M.cfg.n_ff, M.cfg.n_layer, M.cfg.n_head, M.cfg.n_head_kv, M.cfg.head_dim, M.cfg.tied ? "tied" : "untied",
           M.cfg.rope_theta, M.n_params() / 1e6);

    // ---- data
    load_data(o, M.cfg.n_vocab, tok.get(), eos, threads, &T.data, tok_src);
    if (T.data.eval_off.empty()) {
        const std::string why = o.eval_seqs == 0 ? "--eval-seqs 0"
                              : (o.eval_data.empty() && o.eval_split == 0) ? "--eval-split 0 and no --eval-data"
                                                                           : "no held-out tokens";
        printf("note: evaluation is off (%s)%s\n", why.c_str(), o.eval_every > 0 && app_eval_every_given ? ": --eval-every is ignored" : "");
    }
    if (o.seqs_per_step > T.data.n_seqs)
        printf("warning: --seqs-per-step %d is larger than the %" PRId64 " training sequence(s): one step spans several passes over the data\n",
               o.seqs_per_step, T.data.n_seqs);

    // ---- trainer and optimizer
    // lora: only A and B train (the base gets no gradients)
    T.params = lora ? lora_set_trainable(M) : qwen2_set_trainable(M, o.trainable == "all" ? Qwen2Trainable::All : Qwen2Trainable::Linear);
    std::vector<char> decay_c(T.params.size());
    int64_t n_train_params = 0;
    for (size_t i = 0; i < T.params.size(); i++) {
        decay_c[i] = lora || M.spec(T.params[i])->kind == Qwen2TensorKind::Weight;  // no decay on norms and biases
        n_train_params += oomb_nelements(T.params[i]);
    }
    std::unique_ptr<bool[]> decay(new bool[T.params.size()]);
    for (size_t i = 0; i < T.params.size(); i++) decay[i] = decay_c[i];
    oomb_opt_params op = oomb_opt_default_params(OOMB_OPT_ADAMW);
    op.lr = (float) o.lr;
    op.beta1 = (float) o.beta1;
    op.beta2 = (float) o.beta2;
    op.eps = (float) o.adam_eps;
    op.weight_decay = (float) o.weight_decay;
    op.state_type = o.opt_state == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    T.opt = oomb_opt_init(T.be, T.params.data(), (int) T.params.size(), decay.get(), op);
    ChunkParams tp;
    tp.chunk = o.chunk;
    tp.page = o.page;
    tp.max_tokens = o.ctx;
    tp.kv_type = compute_type(T.be);
    tp.cache_attn = o.attn_cache;
    tp.cache_attn_type = o.attn_cache_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    apply_sparse_options(o.sparse, &tp);
    if (o.sparse.pages > 0) printf("%s\n", sparse_summary_line(o.sparse, M.cfg.n_layer, M.cfg.n_head_kv, M.cfg.head_dim, o.page).c_str());
    tp.kv_grad_type = o.kv_grad_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    if (o.attn_cache && o.chunk >= o.ctx)
        printf("note: --attn-cache is unused: a sequence of --ctx %" PRId64 " tokens is one chunk (no stage 1 to keep results from)\n", o.ctx);
    plan_memory(PROG, o.offload, T.be, M, &tp);  // stops here when the run cannot fit
    T.tr = std::make_unique<ChunkDriver>(model_chunk_builder(M), tp);
    T.progress = std::make_unique<ChunkProgressLine>(o.progress_every, T.be);
    T.progress->install(*T.tr);

    // ---- resume
    T.sampler.init(T.data.n_seqs, o.seed);
    if (o.resume) {
        TrainProgress p;
        resume_checkpoint(o, M, T.opt, T.data.hash, T.data.n_seqs, threads, &T.sampler, &p, &T.history);
        T.step = p.step;
        T.bad_run = p.bad_run;
        T.tokens_seen = p.tokens_seen;
        T.elapsed_prev = p.elapsed_s;
        if (T.step >= o.steps) {
            printf("resume: the checkpoint is already at step %" PRId64 " of %d; nothing to do\n", T.step, o.steps);
            return 0;
        }
        if (o.stop_after > 0 && T.step >= o.stop_after) {
            printf("resume: the checkpoint is already at step %" PRId64 ", at or past --stop-after %d; nothing to do\n", T.step, o.stop_after);
            return 0;
        }
    }
    if (!o.resume && is_file(ckpt_state)) {
        printf("note: %s already holds a checkpoint; this fresh run replaces it at its first save (--resume continues it)\n", o.out.c_str());
    }
    T.jsonl = fopen(T.path("train.jsonl").c_str(), o.resume ? "a" : "w");
    if (!T.jsonl) fail(PROG, "cannot write " + T.path("train.jsonl") + ": " + strerror(errno));

    printf("train: %s %d steps x %d sequence(s) of %" PRId64 " tokens, chunk %" PRId64 ", page %d | %s, %d thread(s) | %.2fM trainable (%s)\n",
           default_run ? "default run:" : "", o.steps, o.seqs_per_step, o.ctx, o.chunk, o.page, oomb_backend_name(T.be), threads,
           n_train_params / 1e6, o.trainable.c_str());
    printf("       weights %s in %s memory%s\n", fmt_bytes((double) qwen2_weight_bytes(M)).c_str(), oomb_backend_name(T.be),
           lora && o.base_type == "keep" && !o.model.empty()
               ? (std::any_of(M.params.begin(), M.params.end(), [](const oomb_tensor * t) { return oomb_type_is_quantized(t->type); })
                      ? " (quantized projections kept in their GGUF type: --base-type keep)"
                      : " (frozen projections kept in the file's types: --base-type keep)")
           : lora && base_type_is_block(o.base_type) ? (" (random projections in block types: --base-type " + o.base_type + ")").c_str() : "");
    printf("       AdamW lr %g (warmup %d, cosine to %g), betas %g/%g, weight decay %g, grad clip %g | out %s/\n", o.lr, o.warmup,
           min_lr_of(o), o.beta1, o.beta2, o.weight_decay, o.grad_clip, o.out.c_str());
    fflush(stdout);

    // held-out evaluation at T.step: a line, a JSONL entry, a point of the curve
    auto evaluate = [&]() {
        const auto e0 = std::chrono::steady_clock::now();
        int64_t eval_targets = 0;
        const double el = T.eval_loss(&eval_targets);
        const double es = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
        printf("eval step %" PRId64 " | held-out loss %.4f | perplexity %.2f | %zu sequence(s) in %.1f s\n", T.step, el, std::exp(el),
               T.data.eval_off.size(), es);
        json je;
        je["step"] = T.step;
        je["eval_loss"] = std::isfinite(el) ? json(el) : json(nullptr);
        je["eval_ppl"] = std::isfinite(el) ? json(std::exp(el)) : json(nullptr);
        je["eval_targets"] = eval_targets;
        T.log_json(je);
        if (std::isfinite(el)) T.history.push_back({T.step, el, true});
        T.plot();
        fflush(stdout);
    };
    // fine-tuning a given model: its held-out perplexity before the first step (step 0), the baseline
    if (!o.model.empty() && !o.resume && T.step == 0 && !T.data.eval_off.empty() && o.eval_every > 0) evaluate();

    // ---- loop
    std::vector<int32_t> seq((size_t) o.ctx);
    double step_time_sum = 0;
    int64_t steps_run = 0;
    int64_t last_good_ckpt = o.resume ? T.step : -1;
    auto kept_checkpoint = [&]() {  // what a run stopped by non-finite steps leaves
        return last_good_ckpt >= 0 ? "the last good checkpoint (step " + std::to_string(last_good_ckpt) + ") in " + o.out + "/ is kept"
                                   : std::string("no checkpoint was written");
    };
    // the cause named when the steps are non-finite: a weight that holds a NaN / inf (skipped updates leave the weights as
    // they were, so when every step of the run was bad it is the input model's), else the learning rate
    auto bad_steps_cause = [&](int64_t n_run) {
        const std::string w = non_finite_weight(M);
        if (w.empty()) return std::string("try a lower --lr");
        return "the weight " + w + " is not finite" +
               (T.bad_run >= n_run ? std::string(" in the model this run started from (") + (o.resume ? "the checkpoint" : "-m") +
                                         "): that file is damaged, a learning rate does not fix it"
                                   : std::string(" after an update (try a lower --lr)"));
    };
    const int64_t stop_at = o.stop_after > 0 ? std::min<int64_t>(o.stop_after, o.steps) : o.steps;
    const bool offloaded = oomb_kv_cache_host_nbytes(T.tr->kv_cache()) > 0;
    // from here a first SIGINT / SIGTERM / SIGHUP ends the step and saves it; with --save-every -1 nothing would be saved,
    // so a signal stops the run at once (train.jsonl is flushed each step), not minutes later at the step's end
    if (o.save_every >= 0) install_stop_handler();
    while (T.step < stop_at) {
        const auto t0 = std::chrono::steady_clock::now();
        const oomb_kv_stream_stats off0 = oomb_kv_stream_totals();
        const double lr = lr_at(o, T.step);
        oomb_opt_zero_grads(T.opt);
        double loss_sum = 0;
        int64_t count = 0;
        T.progress->begin_job(o.seqs_per_step, "step ETA");
        for (int s = 0; s < o.seqs_per_step; s++) {
            T.progress->begin_item(s, "step " + std::to_string(T.step + 1) + "/" + std::to_string(o.steps) +
                                          (o.seqs_per_step > 1 ? " seq " + std::to_string(s + 1) + "/" + std::to_string(o.seqs_per_step) : ""));
            const int64_t si = T.sampler.next();
            const int32_t * src = T.data.train.data() + si * o.ctx;
            const int32_t * lab = T.data.train_labels.empty() ? nullptr : T.data.train_labels.data() + si * o.ctx;  // chat: masked
            // bf16 KV-gradient pages: rounding bits from the step and the sequence (a resumed run draws the same)
            oomb_kv_cache_set_grad_seed(T.tr->kv_cache(), (uint32_t) (T.step * o.seqs_per_step + s));
            ChunkStats st = T.tr->forward_backward(src, o.ctx, lab);
            loss_sum += st.loss_sum;
            count += st.n_targets;
        }
        const double loss = loss_sum / (double) std::max<int64_t>(1, count);
        float gnorm = NAN;
        if (std::isfinite(loss)) gnorm = oomb_opt_step(T.opt, (float) lr, 1.0f / (float) count, (float) o.grad_clip);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        T.step++;
        steps_run++;
        step_time_sum += dt;
        T.tokens_seen += (int64_t) o.seqs_per_step * o.ctx;
        const bool good = std::isfinite(loss) && std::isfinite(gnorm);
        if (!good) {
            T.bad_run++;
            print_error(PROG, "step " + std::to_string(T.step) + ": non-finite " + (std::isfinite(loss) ? "gradient norm" : "loss") +
                                  " (loss " + std::to_string(loss) + ", grad norm " + std::to_string(gnorm) + "): update skipped (" +
                                  std::to_string(T.bad_run) + "/" + std::to_string(o.max_bad_steps) + " consecutive)");
        } else {
            T.bad_run = 0;
        }
        json j;
        j["step"] = T.step;
        j["loss"] = std::isfinite(loss) ? json(loss) : json(nullptr);
        j["lr"] = lr;
        j["grad_norm"] = std::isfinite(gnorm) ? json(gnorm) : json(nullptr);
        j["tokens"] = T.tokens_seen;
        j["n_targets"] = count;  // tokens whose loss counted (chat: the masked ones excluded)
        j["tok_per_s"] = (double) o.seqs_per_step * o.ctx / dt;
        j["step_s"] = dt;
        j["elapsed_s"] = T.elapsed_prev + T.run_seconds();
        j["rss_bytes"] = rss_bytes();
        size_t dev_used = 0, dev_total = 0;
        const bool has_dev = oomb_backend_memory(T.be, &dev_used, &dev_total);
        if (has_dev) j["device_mem_bytes"] = dev_used;  // in use after the step = its peak (nothing is freed in a step)
        j["epoch"] = T.sampler.epoch;
        if (!good) j["skipped"] = true;
        std::string off_line;
        if (offloaded) {  // this step's transfers: bytes, and copy time hidden behind compute vs exposed
            const oomb_kv_stream_stats off1 = oomb_kv_stream_totals();
            const uint64_t in_b = off1.bytes_in - off0.bytes_in, out_b = off1.bytes_out - off0.bytes_out;
            const double in = (double) in_b, out = (double) out_b;
            const double copy_s = (off1.copy_ms - off0.copy_ms) / 1e3, wait_s = (off1.wait_ms - off0.wait_ms) / 1e3;
            j["offload_bytes_in"] = in_b;
            j["offload_bytes_out"] = out_b;
            j["offload_copies"] = off1.n_copies - off0.n_copies;
            j["offload_copy_s"] = copy_s;
            j["offload_exposed_s"] = wait_s;
            j["host_kv_bytes"] = oomb_kv_cache_host_nbytes(T.tr->kv_cache());
            char buf[200];
            snprintf(buf, sizeof(buf), " | host KV %s, copied %s in + %s out, %.1f s (%.0f%% hidden, %.1f GB/s)",
                     fmt_bytes((double) oomb_kv_cache_host_nbytes(T.tr->kv_cache())).c_str(), fmt_bytes(in).c_str(), fmt_bytes(out).c_str(),
                     copy_s, copy_s > 0 ? 100.0 * std::max(0.0, 1.0 - wait_s / copy_s) : 0.0, copy_s > 0 ? (in + out) / copy_s / 1e9 : 0.0);
            off_line = buf;
        }
        T.log_json(j);
        if (std::isfinite(loss)) T.history.push_back({T.step, loss, false});
        // a profiling backend (OOMB_CUDA_PROFILE) reports the steps after the first: the first step's one-time costs
        // (kernel modules loaded, cuBLAS's algorithm choices) would be charged to whichever ops ran first
        if (steps_run == 1 && T.step < stop_at && !keep_first_step_profile && oomb_backend_profile_reset(T.be))
            fprintf(stderr, "%s: profile: from step %" PRId64 " on (the first step's one-time costs left out; OOMB_PROFILE_FIRST_STEP=1 keeps them)\n",
                    PROG, T.step + 1);
        if (T.bad_run >= o.max_bad_steps) {
            T.plot();
            print_error(PROG, "stopping: " + std::to_string(T.bad_run) + " consecutive steps with a non-finite loss or gradient (" +
                                  bad_steps_cause(steps_run) + "); " + kept_checkpoint());
            return 2;
        }
        if (o.log_every > 0 && (T.step % o.log_every == 0 || T.step == 1 || T.step == stop_at)) {
            const double eta = step_time_sum / steps_run * (double) (o.steps - T.step);
            const std::string dev = gpu_memory_field(T.be);
            printf("step %*" PRId64 "/%d | loss %8.4f | lr %.3e | gnorm %7.3f | %7.0f tok/s | ETA %s | RSS %s | KV %s + arena %s%s\n",
                   (int) std::to_string(o.steps).size(), T.step, o.steps, loss, lr, gnorm, (double) o.seqs_per_step * o.ctx / dt,
                   fmt_duration(eta).c_str(), fmt_bytes((double) rss_bytes()).c_str(),
                   fmt_bytes((double) (oomb_kv_cache_nbytes(T.tr->kv_cache()) + T.tr->attn_cache_bytes())).c_str(),
                   fmt_bytes((double) T.tr->arena_bytes()).c_str(), (dev + off_line).c_str());
            fflush(stdout);
        }
        // a stop signal (g_stop_signal): no evaluation; the step is saved as at the run's end
        if (!g_stop_signal && !T.data.eval_off.empty() && o.eval_every > 0 && (T.step % o.eval_every == 0 || T.step == o.steps))
            evaluate();
        auto save_step = [&]() {
            if (T.bad_run > 0) {
                printf("checkpoint: skipped at step %" PRId64 " (the last step was not finite)\n", T.step);
            } else {
                const auto s0 = std::chrono::steady_clock::now();
                // a save that fails (a weight its --out-type cannot hold, a NaN from the step, a full disk) leaves the previous
                // checkpoint as it was, and the run stops: the weights it would go on from are the ones that could not be saved
                if (!T.save(&err)) {
                    T.plot();
                    fail(PROG, "checkpoint: step " + std::to_string(T.step) + " not saved: " + err + "; " + kept_checkpoint());
                }
                last_good_ckpt = T.step;
                printf("checkpoint: step %" PRId64 " -> %s, %s (%.1f s)\n", T.step, ckpt_model.c_str(),
                       T.path("state.safetensors").c_str(),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
            }
            T.plot();
            fflush(stdout);
        };
        const bool at_end = T.step == stop_at;
        if ((o.save_every > 0 && T.step % o.save_every == 0) || (at_end && o.save_every >= 0)) save_step();
        if (const int sig = g_stop_signal; sig && !at_end) {  // (also one that came during the evaluation or the save)
            if (o.save_every >= 0 && last_good_ckpt != T.step) save_step();
            T.plot();
            const std::string why = last_good_ckpt == T.step ? ": --resume continues from this checkpoint"
                                                              : " (the step was not finite, so not saved; " + kept_checkpoint() + ")";
            printf("stopped by %s after step %" PRId64 "/%d%s\n", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP", T.step,
                   o.steps, why.c_str());
            fflush(stdout);
            return 128 + sig;
        }
    }
    // summary
    T.plot();  // the curve exists even when no evaluation or checkpoint drew it
    double first = NAN, last = NAN;
    for (const auto & e : T.history)
        if (!e.eval) { if (std::isnan(first)) first = e.loss; last = e.loss; }
    printf("done: %" PRId64 " steps in %s (%.0f tok/s mean), train loss %.4f -> %.4f; log %s, curve %s\n", T.step,
           fmt_duration(T.elapsed_prev + T.run_seconds()).c_str(),
           (double) steps_run * o.seqs_per_step * o.ctx / std::max(1e-9, step_time_sum), first, last, T.path("train.jsonl").c_str(),
           T.plot_ok ? T.path("loss.png").c_str() : "not written (above)");
    if (T.bad_run > 0) {  // the last steps were skipped: the weights at the end give a non-finite loss, so no final checkpoint
        print_error(PROG, "the run ended with " + std::to_string(T.bad_run) + " consecutive step(s) with a non-finite loss or gradient "
                          "(updates skipped; " + bad_steps_cause(steps_run) + "); " + kept_checkpoint());
        return 2;
    }
    if (T.output_failed) {
        print_error(PROG, "the training finished, but " + T.path("train.jsonl") + " or " + T.path("loss.png") + " could not be written (above)");
        return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    install_error_handler(PROG, 1);
    record_default_signals();  // before install_temp_file_cleanup: the training loop's stop handler takes these over
    install_temp_file_cleanup();  // Ctrl-C / SIGTERM during a checkpoint save leaves no temporary file
    try {
        TrainCommand cmd;
        if (const int rc = parse_train_options(argc, argv, &cmd); rc >= 0) return rc;
        (void) oomb_linear_cross_entropy_tile_request(0);  // a bad OOMB_LCE_TILE fails here (naming it), not in step 1
        if (cmd.verify) {
            // the dump is renamed over its path at the end: one naming an input would replace it
            const bool grads = cmd.o.dump_logits.empty();
            // a folder (or a path ending in '/') fails before the model runs, not at the rename after it
            if (const std::string e = oomb::tools::output_path_error(grads ? cmd.o.dump_grads : cmd.o.dump_logits,
                                                                     grads ? "--dump-grads" : "--dump-logits");
                !e.empty())
                fail(PROG, e);
            if (const std::string e = oomb::tools::output_is_input_error(grads ? "--dump-grads" : "--dump-logits",
                                                                         grads ? cmd.o.dump_grads : cmd.o.dump_logits,
                                                                         {cmd.o.tokens, cmd.o.model});
                !e.empty())
                fail(PROG, e);
            return grads ? dump_grads(cmd.o) : dump_logits(cmd.o);
        }
        return train_main(cmd.o, cmd.default_run, cmd.eval_every_given);
    } catch (const std::exception & e) {
        fail(PROG, e.what());
    }
}
