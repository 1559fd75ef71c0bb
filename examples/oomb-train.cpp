// oomb-train: trains or fine-tunes a Qwen2 / Qwen2.5 model with OOMB chunk-recurrent training over
// paged KV caches (models/qwen2.h ChunkTrainer), AdamW, a warmup + cosine learning-rate schedule,
// held-out evaluation, a JSONL log, a loss-curve PNG and exactly resumable checkpoints.
//
//   oomb-train                                       the built-in default run: pre-train the tiny
//                                                    preset on data/python-docs.txt.gz
//   oomb-train -m MODEL.gguf --data TEXT... --ctx 8192 --steps 500 --lr 5e-5 --trainable linear
//   oomb-train --preset qwen2.5-0.5b --data-bin IDS.bin --ctx 65536 --chunk 4096
//   oomb-train ... --resume                         continue from OUT/model.gguf + OUT/state.safetensors
//   oomb-train -m M.gguf --tokens IDS.safetensors --chunk C --page P --dump-grads G.safetensors
//                                                    (verification: loss and d(mean loss)/d(param))
//
// Checkpoints (every --save-every steps and at the end) are OUT/model.gguf (f32 weights,
// llama.cpp-loadable, tokenizer keys from the vocabulary) and OUT/state.safetensors (AdamW moments
// and metadata: step, data position, RNG state, configuration, hashes of the data and the
// weights). Both are first written completely under temporary names and then renamed, so an
// interrupted save never damages the previous checkpoint.
#include "train-common.h"

#include "oomb-opt.h"
#include "gguf.h"
#include "qwen2.h"
#include "safetensors.h"
#include "tokenizer.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

using namespace oomb;
using namespace oomb::train;
using json = nlohmann::json;

namespace {

const char * PROG = "oomb-train";
constexpr const char * STATE_FORMAT = "oomb-train-state-1";

// Storage type of the linear weights and of the KV pages: f32 on the CPU, bf16 on a GPU (bf16
// operands with f32 accumulation; the KV-gradient pages stay f32).
oomb_type compute_type(oomb_backend_t be) { return oomb_backend_is_host(be) ? OOMB_TYPE_F32 : OOMB_TYPE_BF16; }

// Settings of the built-in default run (no model and no data given); each applies only when the
// option is not given on the command line. Measured on a 2-core CPU: see README "Training".
struct DefaultRun {
    int64_t ctx = 256, chunk = 128;
    int steps = 300, warmup = 30, eval_every = 50, save_every = 100, eval_seqs = 8;
    double lr = 3e-3, min_lr = 3e-4;
};

struct Options {
    std::string model, preset, vocab;
    std::vector<std::string> data;
    std::string data_bin;
    std::vector<std::string> eval_data;
    double eval_split = 5.0;
    int eval_every = 100;
    int eval_seqs = 8;
    int64_t ctx = 4096;
    int64_t chunk = 4096;
    int page = 128;
    int steps = 1000;
    int seqs_per_step = 1;
    double lr = 3e-4;
    double min_lr = -1;   // < 0: lr / 10
    int warmup = 100;
    double weight_decay = 0.1;
    double beta1 = 0.9, beta2 = 0.98, adam_eps = 1e-8;
    double grad_clip = 1.0;
    std::string trainable = "all";
    std::string opt_state = "f32";
    bool attn_cache = false;
    std::string attn_cache_type = "f32";
    int threads = 0;
    std::string device = "cpu";
    double rope_theta = 0;
    std::string out = "out";
    int save_every = 100;
    bool resume = false;
    uint64_t seed = 42;
    int log_every = 1;
    int stop_after = 0;
    int max_bad_steps = 3;
    // verification
    std::string tokens, dump_grads;
};

// ---------------------------------------------------------------------------------------------

std::vector<int64_t> torch_shape(const oomb_tensor * t) {
    std::vector<int64_t> s;
    for (int i = oomb_n_dims(t) - 1; i >= 0; i--) s.push_back(t->ne[i]);
    return s;
}

std::vector<float> get_f32(const oomb_tensor * t) {
    std::vector<float> v((size_t) oomb_nelements(t));
    oomb_tensor_get_f32(t, v.data(), (int64_t) v.size());
    return v;
}

// Hash of every weight's bytes, in GGUF order (weights are f32).
uint64_t weights_hash(const Qwen2Model & m) {
    uint64_t h = hash64("qwen2", 5);
    std::vector<uint8_t> buf;
    for (const oomb_tensor * t : m.params) {
        buf.resize(oomb_nbytes(t));
        oomb_tensor_get(t, buf.data(), 0, buf.size());
        h = hash64(t->name, strlen(t->name), h);
        h = hash64(buf.data(), buf.size(), h);
    }
    return h;
}

// Removes temporary files of saves that a killed process left in `out` ("<name>.tmp.<pid>" of our
// output files, e.g. model.gguf.saving.tmp.1234) whose process no longer exists.
void remove_stale_temp_files(const std::string & out) {
    static const char * bases[] = {"model.gguf.saving", "state.safetensors.saving", "loss.png", "train.jsonl"};
    DIR * d = opendir(out.c_str());
    if (!d) return;
    std::vector<std::string> names;
    while (dirent * e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto & n : names) {
        const size_t t = n.rfind(".tmp.");
        if (t == std::string::npos || t + 5 >= n.size()) continue;
        const std::string base = n.substr(0, t), num = n.substr(t + 5);
        if (num.find_first_not_of("0123456789") != std::string::npos || num.size() > 9) continue;
        bool ours = false;
        for (const char * b : bases) ours |= base == b;
        if (!ours) continue;
        const long pid = std::atol(num.c_str());
        if (pid <= 0 || pid == (long) getpid()) continue;
        if (kill((pid_t) pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
        const std::string p = out + "/" + n;
        if (unlink(p.c_str()) == 0) printf("note: removed %s, left by an interrupted save of process %ld (no longer running)\n", p.c_str(), pid);
    }
}

int threads_default(int n) {
    if (n > 0) return n;
    const unsigned h = std::thread::hardware_concurrency();
    return h ? (int) h : 1;
}

// ---------------------------------------------------------------------------------------------
// --dump-grads: one forward/backward over input_ids [B, T], every weight trainable, no update.
// ---------------------------------------------------------------------------------------------

int dump_grads(const Options & o) {
    if (o.model.empty()) fail(PROG, "--dump-grads needs -m MODEL.gguf");
    if (o.tokens.empty() || o.dump_grads.empty()) fail(PROG, "--dump-grads and --tokens go together");
    std::string err;
    oomb_backend_t be = make_backend(o.device, threads_default(o.threads), &err);
    if (!be) fail(PROG, err);
    SafetensorsFile f;
    if (f.open(o.tokens, &err) != GGUF_OK) fail(PROG, err);
    const SafetensorsTensor * it = f.find("input_ids");
    if (!it) fail(PROG, o.tokens + ": no tensor 'input_ids'");
    if (it->shape.empty() || it->shape.size() > 2) fail(PROG, o.tokens + ": input_ids must be [B, T] or [T]");
    const int64_t B = it->shape.size() == 2 ? it->shape[0] : 1, T = it->shape.back();
    if (T < 2 || B < 1) fail(PROG, o.tokens + ": input_ids needs at least one sequence of 2 tokens");
    std::vector<int32_t> ids((size_t) (B * T));
    if (it->dtype == SafetensorsDtype::I32) memcpy(ids.data(), it->data, ids.size() * 4);
    else if (it->dtype == SafetensorsDtype::I64) {
        for (size_t i = 0; i < ids.size(); i++) {
            int64_t v;
            memcpy(&v, it->data + 8 * i, 8);
            ids[i] = (v < INT32_MIN || v > INT32_MAX) ? -1 : (int32_t) v;
        }
    } else fail(PROG, o.tokens + ": input_ids must be I32 or I64");

    auto model = qwen2_load_gguf(o.model, be, compute_type(be), &err);
    if (!model) fail(PROG, err);
    if (o.rope_theta > 0) model->cfg.rope_theta = (float) o.rope_theta;
    for (size_t i = 0; i < ids.size(); i++)
        if (ids[i] < 0 || ids[i] >= model->cfg.n_vocab)
            fail(PROG, o.tokens + ": token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                           " is outside the model's vocabulary (" + std::to_string(model->cfg.n_vocab) + " entries)");
    std::vector<oomb_tensor *> params = qwen2_set_trainable(*model, Qwen2Trainable::All);
    for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
    ChunkTrainerParams tp;
    tp.chunk = std::min<int64_t>(o.chunk, T);
    tp.page = o.page;
    tp.max_tokens = T;
    tp.kv_type = compute_type(be);
    tp.cache_attn = o.attn_cache;  // the verification can check the attention-cache path too
    tp.cache_attn_type = o.attn_cache_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    if (tp.chunk <= 0 || tp.page <= 0) fail(PROG, "--chunk and --page must be positive");
    ChunkTrainer tr(*model, tp);
    double loss_sum = 0;
    int64_t count = 0;
    for (int64_t b = 0; b < B; b++) {
        ChunkStats st = tr.forward_backward(ids.data() + b * T, T);
        loss_sum += st.loss_sum;
        count += st.n_targets;
    }
    if (count <= 0) fail(PROG, "no targets");
    const float loss = (float) (loss_sum / (double) count);
    const float scale = 1.0f / (float) count;
    SafetensorsWriter w;
    w.add_copy("loss", SafetensorsDtype::F32, {1}, &loss);
    for (oomb_tensor * p : params) {
        std::vector<float> g = get_f32(p->grad);
        for (float & x : g) x *= scale;
        if (w.add_copy(std::string("grad.") + p->name, SafetensorsDtype::F32, torch_shape(p), g.data(), &err) != GGUF_OK)
            fail(PROG, err);
    }
    w.set_metadata("model", o.model);
    w.set_metadata("chunk", std::to_string(tp.chunk));
    w.set_metadata("page", std::to_string(tp.page));
    w.set_metadata("n_targets", std::to_string(count));
    if (w.write(o.dump_grads, &err) != GGUF_OK) fail(PROG, err);
    printf("loss %.8f over %" PRId64 " targets (B=%" PRId64 ", T=%" PRId64 ", chunk %" PRId64 ", page %d, %s); %zu gradients -> %s\n",
           loss, count, B, T, tp.chunk, tp.page, oomb_backend_name(be), params.size(), o.dump_grads.c_str());
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------------

struct Data {
    std::vector<int32_t> train, eval;
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

// ---------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------

struct LogEntry { int64_t step; double loss; bool eval; };

double lr_at(const Options & o, int64_t step) {   // step: 0-based
    const double min_lr = o.min_lr < 0 ? o.lr * 0.1 : o.min_lr;
    if (o.warmup > 0 && step < o.warmup) return o.lr * (double) (step + 1) / (double) o.warmup;
    const double span = std::max<int64_t>(1, o.steps - o.warmup);
    const double p = std::min(1.0, (double) (step - o.warmup) / span);
    return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * p));
}

json config_json(const Options & o) {
    json j;
    j["model"] = o.model; j["preset"] = o.preset; j["vocab"] = o.vocab;
    j["data"] = o.data; j["data_bin"] = o.data_bin; j["eval_data"] = o.eval_data; j["eval_split"] = o.eval_split;
    j["eval_every"] = o.eval_every; j["eval_seqs"] = o.eval_seqs;
    j["ctx"] = o.ctx; j["chunk"] = o.chunk; j["page"] = o.page; j["steps"] = o.steps; j["seqs_per_step"] = o.seqs_per_step;
    j["lr"] = o.lr; j["min_lr"] = o.min_lr < 0 ? o.lr * 0.1 : o.min_lr; j["warmup"] = o.warmup;
    j["weight_decay"] = o.weight_decay; j["adam_beta1"] = o.beta1; j["adam_beta2"] = o.beta2; j["adam_eps"] = o.adam_eps;
    j["grad_clip"] = o.grad_clip; j["trainable"] = o.trainable; j["opt_state"] = o.opt_state; j["attn_cache"] = o.attn_cache; j["attn_cache_type"] = o.attn_cache ? o.attn_cache_type : "none"; j["threads"] = o.threads; j["device"] = o.device;
    j["rope_theta"] = o.rope_theta; j["seed"] = o.seed;
    j["threads_used"] = threads_default(o.threads);
    return j;
}

// Crash hook for tests of checkpoint atomicity: OOMB_TRAIN_CRASH_IN_SAVE=<stage>:<step> kills the
// process (SIGKILL) at that point of the save of that step (stage "model": the new model is
// written under its temporary name; "rename": the new model has replaced the old one, the new
// state file is still under its temporary name).
void crash_hook(const char * stage, int64_t step) {
    const char * e = getenv("OOMB_TRAIN_CRASH_IN_SAVE");
    if (!e) return;
    const std::string s(e);
    const size_t c = s.find(':');
    if (s.substr(0, c) != stage) return;
    if (c != std::string::npos && std::atoll(s.c_str() + c + 1) != step) return;
    fflush(stdout);
    fflush(stderr);
    raise(SIGKILL);
}

class Trainer {
public:
    Options o;
    oomb_backend_t be = nullptr;
    std::unique_ptr<Qwen2Model> model;
    std::string vocab_src;            // GGUF whose tokenizer keys go into saved models
    std::vector<oomb_tensor *> params;
    oomb_optimizer_t opt = nullptr;
    std::unique_ptr<ChunkTrainer> tr;
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

    double eval_loss() {
        double s = 0;
        int64_t n = 0;
        for (size_t i = 0; i < data.eval_off.size(); i++) {
            ChunkStats st = tr->forward(data.eval.data() + data.eval_off[i], data.eval_len[i]);
            s += st.loss_sum;
            n += st.n_targets;
        }
        return n ? s / (double) n : NAN;
    }

    void log_json(const json & j) {
        if (!jsonl) return;
        const std::string s = j.dump();
        fprintf(jsonl, "%s\n", s.c_str());
        fflush(jsonl);
    }

    void plot() {
        std::vector<CurvePoint> tr_pts, ev_pts;
        for (const auto & e : history) (e.eval ? ev_pts : tr_pts).push_back({(double) e.step, e.loss});
        std::string err;
        char title[256];
        snprintf(title, sizeof(title), "oomb-train: %s, ctx %" PRId64 ", chunk %" PRId64,
                 o.model.empty() ? ("preset " + o.preset).c_str() : o.model.c_str(), o.ctx, o.chunk);
        if (!write_loss_png(path("loss.png"), tr_pts, ev_pts, title, &err)) print_error(PROG, "loss plot: " + err);
    }

    bool save(std::string * err) {
        const std::string m_tmp = path("model.gguf.saving"), s_tmp = path("state.safetensors.saving");
        std::string name = o.preset.empty() ? "oomb-train" : ("oomb-train " + o.preset);
        if (!qwen2_save_gguf(*model, m_tmp, vocab_src, OOMB_TYPE_F32, name, err)) return false;
        crash_hook("model", step);
        SafetensorsWriter w;
        std::vector<std::vector<uint8_t>> keep;  // raw f32 or bf16 moments (--opt-state)
        keep.reserve((size_t) oomb_opt_n_state(opt));
        for (int i = 0; i < oomb_opt_n_state(opt); i++) {
            oomb_tensor * t = oomb_opt_state(opt, i);
            keep.emplace_back(oomb_nbytes(t));
            oomb_tensor_get(t, keep.back().data(), 0, keep.back().size());
            const SafetensorsDtype dt = t->type == OOMB_TYPE_BF16 ? SafetensorsDtype::BF16 : SafetensorsDtype::F32;
            if (w.add(t->name, dt, torch_shape(t), keep.back().data(), err) != GGUF_OK) return false;
        }
        w.set_metadata("format", STATE_FORMAT);
        w.set_metadata("step", std::to_string(step));
        w.set_metadata("opt_steps", std::to_string(oomb_opt_n_steps(opt)));
        w.set_metadata("epoch", std::to_string(sampler.epoch));
        w.set_metadata("seq_pos", std::to_string(sampler.pos));
        w.set_metadata("n_seqs", std::to_string(sampler.n));
        w.set_metadata("rng_epoch_start", sampler.rng_epoch_start);
        w.set_metadata("bad_steps", std::to_string(bad_run));
        w.set_metadata("tokens_seen", std::to_string(tokens_seen));
        char el[64];
        snprintf(el, sizeof(el), "%.17g", elapsed_prev + run_seconds());
        w.set_metadata("elapsed_s", el);
        w.set_metadata("data_hash", hex64(data.hash));
        w.set_metadata("weights_hash", hex64(weights_hash(*model)));
        w.set_metadata("config", config_json(o).dump());
        if (w.write(s_tmp, err) != GGUF_OK) return false;
        if (rename(m_tmp.c_str(), path("model.gguf").c_str()) != 0) {
            *err = "cannot rename " + m_tmp + ": " + strerror(errno);
            return false;
        }
        crash_hook("rename", step);
        if (rename(s_tmp.c_str(), path("state.safetensors").c_str()) != 0) {
            *err = "cannot rename " + s_tmp + ": " + strerror(errno);
            return false;
        }
        return true;
    }

    std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
    double run_seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    }
};

// Loads and checks the data; fills d (sequences of ctx tokens; held-out split).
void load_data(const Options & o, const Qwen2Model & m, const Tokenizer * tok, int32_t eos, int threads, Data * d) {
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    size_t n_bytes = 0;
    if (!o.data_bin.empty()) {
        if (!read_ids_bin(o.data_bin, m.cfg.n_vocab, &d->train, &err)) fail(PROG, "--data-bin: " + err);
        for (const auto & e : o.eval_data)
            if (!read_ids_bin(e, m.cfg.n_vocab, &d->eval, &err)) fail(PROG, "--eval-data: " + err);
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

int train_main(Options & o, bool default_run, bool app_eval_every_given) {
    std::string err;
    const int threads = threads_default(o.threads);
    if (o.ctx < 2) fail(PROG, "--ctx must be at least 2");
    if (o.chunk <= 0) fail(PROG, "--chunk must be positive");
    if (o.page <= 0) fail(PROG, "--page must be positive");
    if (o.steps <= 0) fail(PROG, "--steps must be positive");
    if (o.seqs_per_step <= 0) fail(PROG, "--seqs-per-step must be positive");
    if (!(o.lr > 0)) fail(PROG, "--lr must be positive");
    if (o.trainable != "all" && o.trainable != "linear") fail(PROG, "--trainable must be all or linear");
    if (o.opt_state != "f32" && o.opt_state != "bf16") fail(PROG, "--opt-state must be f32 or bf16, got '" + o.opt_state + "'");
    if (o.eval_split < 0 || o.eval_split >= 100) fail(PROG, "--eval-split must be in [0, 100)");
    o.chunk = std::min(o.chunk, o.ctx);

    // ---- output folder
    if (o.resume && !is_file(o.out + "/model.gguf"))
        fail(PROG, "--resume: no checkpoint in '" + o.out + "' (" + o.out + "/model.gguf not found)");
    if (!make_dirs(o.out, &err)) fail(PROG, err);
    {
        // One trainer per output folder: an exclusive lock on OUT/.lock, held until the process exits.
        const std::string lp = o.out + "/.lock";
        const int fd = open(lp.c_str(), O_RDWR | O_CREAT, 0644);
        if (fd < 0) fail(PROG, "cannot open " + lp + ": " + strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char b[32] = {0};
            const ssize_t n = pread(fd, b, sizeof(b) - 1, 0);
            const long pid = n > 0 ? std::atol(b) : 0;
            fail(PROG, "output folder " + o.out + " is in use by another oomb-train" + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : ""));
        }
        const std::string me = std::to_string((long) getpid()) + "\n";
        if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != (ssize_t) me.size()) { /* the pid is informative only */ }
        // fd stays open (and locked) for the run's lifetime.
    }
    remove_stale_temp_files(o.out);

    Trainer T;
    T.o = o;
    T.be = make_backend(o.device, threads, &err);
    if (!T.be) fail(PROG, err);

    for (const auto & p : o.data)
        if (!is_file(p) && !is_dir(p)) fail(PROG, "--data: '" + p + "': no such file or folder");
    for (const auto & p : o.eval_data)
        if (!is_file(p) && !is_dir(p)) fail(PROG, "--eval-data: '" + p + "': no such file or folder");
    if (!o.data_bin.empty() && !is_file(o.data_bin)) fail(PROG, "--data-bin: '" + o.data_bin + "': no such file");

    // ---- model
    const std::string ckpt_model = T.path("model.gguf"), ckpt_state = T.path("state.safetensors");
    if (o.save_every < 0 && o.resume)
        fail(PROG, "--resume with --save-every -1 would train past the checkpoint without saving, leaving the log ahead of it: "
                   "give --save-every 0 (save at the end) or more");
    if (o.save_every < 0 && (is_file(ckpt_state) || is_file(ckpt_model)))
        // a run that never saves would leave the old checkpoint beside its new log: a later --resume
        // would continue the old run under the new run's first log lines
        fail(PROG, o.out + " already holds a checkpoint, which --save-every -1 would leave beside this run's log; use another "
                       "--out, or remove model.gguf and state.safetensors there");
    if (o.resume) {
        if (!is_file(ckpt_model)) fail(PROG, "--resume: no checkpoint in '" + o.out + "' (" + ckpt_model + " not found)");
        T.model = qwen2_load_gguf(ckpt_model, T.be, compute_type(T.be), &err);
        if (!T.model) fail(PROG, "--resume: " + err);
    } else if (!o.model.empty()) {
        if (!is_file(o.model)) fail(PROG, "-m: '" + o.model + "': no such file");
        T.model = qwen2_load_gguf(o.model, T.be, compute_type(T.be), &err);
        if (!T.model) fail(PROG, err);
    } else {
        Qwen2Config c;
        if (!qwen2_preset(o.preset, &c)) fail(PROG, "unknown preset '" + o.preset + "' (choose " + qwen2_preset_choices() + ")");
        if (o.rope_theta > 0) c.rope_theta = (float) o.rope_theta;
        T.model = qwen2_create(c, T.be, compute_type(T.be));
        qwen2_init_random(*T.model, o.seed);
    }
    Qwen2Model & M = *T.model;
    if (o.rope_theta > 0) M.cfg.rope_theta = (float) o.rope_theta;

    // ---- tokenizer and the vocabulary written into saved models
    std::unique_ptr<Tokenizer> tok;
    std::string tok_src;
    if (!o.model.empty()) {  // the model's own tokenizer, when it has one
        auto t = std::make_unique<Tokenizer>();
        std::string e;
        if (t->load_file(o.model, &e) == GGUF_OK) {
            tok = std::move(t);
            tok_src = o.model;
        }
    }
    if (!tok && !o.vocab.empty()) {
        if (!is_file(o.vocab)) {
            if (o.data_bin.empty()) fail(PROG, "--vocab: '" + o.vocab + "': no such file");
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
        fail(PROG, o.model.empty() ? "no vocabulary: give --vocab FILE.gguf (default models/qwen2.5-vocab.gguf was not found)"
                                   : "'" + o.model + "' has no tokenizer: give --vocab FILE.gguf or use --data-bin");
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
           o.resume ? ckpt_model.c_str() : (!o.model.empty() ? o.model.c_str() : ("preset " + o.preset).c_str()), M.cfg.n_vocab,
           M.cfg.n_embd, M.cfg.n_ff, M.cfg.n_layer, M.cfg.n_head, M.cfg.n_head_kv, M.cfg.head_dim, M.cfg.tied ? "tied" : "untied",
           M.cfg.rope_theta, M.n_params() / 1e6);

    // ---- data
    load_data(o, M, tok.get(), eos, threads, &T.data);
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
    T.params = qwen2_set_trainable(M, o.trainable == "all" ? Qwen2Trainable::All : Qwen2Trainable::Linear);
    std::vector<char> decay_c(T.params.size());
    int64_t n_train_params = 0;
    for (size_t i = 0; i < T.params.size(); i++) {
        decay_c[i] = M.spec(T.params[i])->kind == Qwen2TensorKind::Weight;  // no decay on norms and biases
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
    ChunkTrainerParams tp;
    tp.chunk = o.chunk;
    tp.page = o.page;
    tp.max_tokens = o.ctx;
    tp.kv_type = compute_type(T.be);
    tp.cache_attn = o.attn_cache;
    tp.cache_attn_type = o.attn_cache_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    if (o.attn_cache && o.chunk >= o.ctx)
        printf("note: --attn-cache is unused: a sequence of --ctx %" PRId64 " tokens is one chunk (no stage 1 to keep results from)\n", o.ctx);
    T.tr = std::make_unique<ChunkTrainer>(M, tp);

    // ---- resume
    T.sampler.init(T.data.n_seqs, o.seed);
    if (o.resume) {
        SafetensorsFile sf;
        const uint64_t wh = weights_hash(M);
        std::string use = ckpt_state;
        auto state_hash = [&](const std::string & p, std::string * e) -> std::string {
            SafetensorsFile f;
            if (f.open(p, e) != GGUF_OK) return "";
            auto it = f.metadata().find("weights_hash");
            return it == f.metadata().end() ? "" : it->second;
        };
        std::string e1, e2;
        if (state_hash(ckpt_state, &e1) != hex64(wh)) {
            // An interrupted save may have replaced the model but not yet the state: roll forward.
            const std::string pending = T.path("state.safetensors.saving");
            if (is_file(pending) && state_hash(pending, &e2) == hex64(wh)) {
                if (rename(pending.c_str(), ckpt_state.c_str()) != 0) fail(PROG, "--resume: cannot rename " + pending);
                printf("resume: completed an interrupted save (%s -> %s)\n", pending.c_str(), ckpt_state.c_str());
            } else if (!is_file(ckpt_state)) {
                fail(PROG, "--resume: " + ckpt_state + " not found");
            } else if (!e1.empty()) {
                fail(PROG, "--resume: " + e1);
            } else {
                fail(PROG, "--resume: " + ckpt_state + " does not belong to " + ckpt_model + " (weights hash differs)");
            }
        }
        if (sf.open(ckpt_state, &err) != GGUF_OK) fail(PROG, "--resume: " + err);
        const auto & md = sf.metadata();
        auto get = [&](const char * k) -> std::string {
            auto it = md.find(k);
            if (it == md.end()) fail(PROG, "--resume: " + ckpt_state + " lacks metadata '" + k + "'");
            return it->second;
        };
        if (get("format") != STATE_FORMAT) fail(PROG, "--resume: " + ckpt_state + " has format '" + get("format") + "', expected " + STATE_FORMAT);
        if (get("data_hash") != hex64(T.data.hash))
            fail(PROG, "--resume: the training data differ from the checkpoint's (data hash " + hex64(T.data.hash) + " vs " +
                           get("data_hash") + "): give the same --data/--data-bin, --ctx and --eval-* options");
        json saved = json::parse(get("config"), nullptr, false);
        if (saved.is_discarded()) fail(PROG, "--resume: bad config metadata in " + ckpt_state);
        const json now = config_json(o);
        auto opt_name = [](std::string k) {   // config key -> the option's spelling
            for (char & c : k) if (c == '_') c = '-';
            return "--" + k;
        };
        for (const char * k : {"ctx", "seqs_per_step", "seed", "trainable", "opt_state"}) {
            if (!saved.contains(k) && std::string(k) == "opt_state") continue;  // older checkpoints: f32 (the dtype check below)
            if (saved[k] != now[k])
                fail(PROG, "--resume: " + opt_name(k) + " differs from the checkpoint's (" + saved[k].dump() + " vs " + now[k].dump() + ")");
        }
        for (auto it = now.begin(); it != now.end(); ++it) {
            if (saved.contains(it.key()) && saved[it.key()] != it.value() && it.key() != "threads" && it.key() != "threads_used")
                printf("resume: note: %s changed from %s to %s\n", opt_name(it.key()).c_str(), saved[it.key()].dump().c_str(), it.value().dump().c_str());
        }
        if (saved.contains("threads_used") && saved["threads_used"].is_number_integer() && saved["threads_used"].get<int>() != threads)
            printf("resume: note: the checkpoint was trained with %d thread(s), this run uses %d; a bit-exact continuation needs the same "
                   "thread count (--threads %d)\n", saved["threads_used"].get<int>(), threads, saved["threads_used"].get<int>());
        if ((int) sf.tensors().size() != oomb_opt_n_state(T.opt))
            fail(PROG, "--resume: " + ckpt_state + " holds " + std::to_string(sf.tensors().size()) + " optimizer tensors, expected " +
                           std::to_string(oomb_opt_n_state(T.opt)));
        for (int i = 0; i < oomb_opt_n_state(T.opt); i++) {
            oomb_tensor * t = oomb_opt_state(T.opt, i);
            const SafetensorsTensor * st = sf.find(t->name);
            if (!st || st->shape != torch_shape(t))
                fail(PROG, std::string("--resume: optimizer tensor '") + t->name + "' is missing or misshapen in " + ckpt_state);
            const SafetensorsDtype want = t->type == OOMB_TYPE_BF16 ? SafetensorsDtype::BF16 : SafetensorsDtype::F32;
            if (st->dtype != want)
                fail(PROG, std::string("--resume: optimizer tensor '") + t->name + "' is " + safetensors_dtype_name(st->dtype) + " in " +
                               ckpt_state + ", this run keeps " + safetensors_dtype_name(want) + " moments (--opt-state)");
            oomb_tensor_set(t, st->data, 0, st->nbytes);
        }
        oomb_opt_set_n_steps(T.opt, std::atoll(get("opt_steps").c_str()));
        T.step = std::atoll(get("step").c_str());
        T.bad_run = std::atoi(get("bad_steps").c_str());
        T.tokens_seen = std::atoll(get("tokens_seen").c_str());
        T.elapsed_prev = std::atof(get("elapsed_s").c_str());
        if (std::atoll(get("n_seqs").c_str()) != T.data.n_seqs) fail(PROG, "--resume: the number of sequences differs from the checkpoint's");
        if (!T.sampler.restore(T.data.n_seqs, std::atoll(get("epoch").c_str()), std::atoll(get("seq_pos").c_str()), get("rng_epoch_start")))
            fail(PROG, "--resume: bad data position / RNG state in " + ckpt_state);
        // The log keeps the entries up to the checkpoint.
        std::ifstream in(T.path("train.jsonl"));
        std::string line, kept;
        while (std::getline(in, line)) {
            json j = json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
                j["step"].get<int64_t>() > T.step)
                continue;
            kept += line + "\n";
            if (j.contains("loss") && j["loss"].is_number()) T.history.push_back({j["step"].get<int64_t>(), j["loss"].get<double>(), false});
            if (j.contains("eval_loss") && j["eval_loss"].is_number())
                T.history.push_back({j["step"].get<int64_t>(), j["eval_loss"].get<double>(), true});
        }
        in.close();
        if (!write_file_atomic(T.path("train.jsonl"), kept, &err)) fail(PROG, err);
        printf("resume: from step %" PRId64 " (epoch %" PRId64 ", sequence %" PRId64 "/%" PRId64 ")\n", T.step, T.sampler.epoch,
               T.sampler.pos, T.sampler.n);
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
    printf("       AdamW lr %g (warmup %d, cosine to %g), betas %g/%g, weight decay %g, grad clip %g | out %s/\n", o.lr, o.warmup,
           o.min_lr < 0 ? o.lr * 0.1 : o.min_lr, o.beta1, o.beta2, o.weight_decay, o.grad_clip, o.out.c_str());
    fflush(stdout);

    // ---- loop
    std::vector<int32_t> seq((size_t) o.ctx);
    double step_time_sum = 0;
    int64_t steps_run = 0;
    int64_t last_good_ckpt = o.resume ? T.step : -1;
    const int64_t stop_at = o.stop_after > 0 ? std::min<int64_t>(o.stop_after, o.steps) : o.steps;
    while (T.step < stop_at) {
        const auto t0 = std::chrono::steady_clock::now();
        const double lr = lr_at(o, T.step);
        oomb_opt_zero_grads(T.opt);
        double loss_sum = 0;
        int64_t count = 0;
        for (int s = 0; s < o.seqs_per_step; s++) {
            const int64_t si = T.sampler.next();
            const int32_t * src = T.data.train.data() + si * o.ctx;
            ChunkStats st = T.tr->forward_backward(src, o.ctx);
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
        j["tok_per_s"] = (double) o.seqs_per_step * o.ctx / dt;
        j["step_s"] = dt;
        j["elapsed_s"] = T.elapsed_prev + T.run_seconds();
        j["rss_bytes"] = rss_bytes();
        size_t dev_used = 0, dev_total = 0;
        const bool has_dev = oomb_backend_memory(T.be, &dev_used, &dev_total);
        if (has_dev) j["device_mem_bytes"] = dev_used;  // in use after the step = its peak (nothing is freed in a step)
        j["epoch"] = T.sampler.epoch;
        if (!good) j["skipped"] = true;
        T.log_json(j);
        if (std::isfinite(loss)) T.history.push_back({T.step, loss, false});
        if (T.bad_run >= o.max_bad_steps) {
            T.plot();
            const std::string kept = last_good_ckpt >= 0 ? "the last good checkpoint (step " + std::to_string(last_good_ckpt) + ") in " + o.out + "/ is kept"
                                                         : "no checkpoint was written";
            print_error(PROG, "stopping: " + std::to_string(T.bad_run) + " consecutive steps with a non-finite loss or gradient (try a lower --lr); " + kept);
            return 2;
        }
        if (o.log_every > 0 && (T.step % o.log_every == 0 || T.step == 1 || T.step == stop_at)) {
            const double eta = step_time_sum / steps_run * (double) (o.steps - T.step);
            const std::string dev = has_dev ? " | GPU " + fmt_bytes((double) dev_used) + " of " + fmt_bytes((double) dev_total) : "";
            printf("step %*" PRId64 "/%d | loss %8.4f | lr %.3e | gnorm %7.3f | %7.0f tok/s | ETA %s | RSS %s | KV %s + arena %s%s\n",
                   (int) std::to_string(o.steps).size(), T.step, o.steps, loss, lr, gnorm, (double) o.seqs_per_step * o.ctx / dt,
                   fmt_duration(eta).c_str(), fmt_bytes((double) rss_bytes()).c_str(),
                   fmt_bytes((double) (oomb_kv_cache_nbytes(T.tr->kv_cache()) + T.tr->attn_cache_bytes())).c_str(),
                   fmt_bytes((double) T.tr->arena_bytes()).c_str(), dev.c_str());
            fflush(stdout);
        }
        if (!T.data.eval_off.empty() && o.eval_every > 0 && (T.step % o.eval_every == 0 || T.step == o.steps)) {
            const auto e0 = std::chrono::steady_clock::now();
            const double el = T.eval_loss();
            const double es = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
            printf("eval step %" PRId64 " | held-out loss %.4f | perplexity %.2f | %zu sequence(s) in %.1f s\n", T.step, el, std::exp(el),
                   T.data.eval_off.size(), es);
            json je;
            je["step"] = T.step;
            je["eval_loss"] = std::isfinite(el) ? json(el) : json(nullptr);
            je["eval_ppl"] = std::isfinite(el) ? json(std::exp(el)) : json(nullptr);
            T.log_json(je);
            if (std::isfinite(el)) T.history.push_back({T.step, el, true});
            T.plot();
            fflush(stdout);
        }
        const bool at_end = T.step == stop_at;
        if ((o.save_every > 0 && T.step % o.save_every == 0) || (at_end && o.save_every >= 0)) {
            if (T.bad_run > 0) {
                printf("checkpoint: skipped at step %" PRId64 " (the last step was not finite)\n", T.step);
            } else {
                const auto s0 = std::chrono::steady_clock::now();
                if (!T.save(&err)) fail(PROG, "checkpoint: " + err);
                last_good_ckpt = T.step;
                printf("checkpoint: step %" PRId64 " -> %s, %s (%.1f s)\n", T.step, T.path("model.gguf").c_str(),
                       T.path("state.safetensors").c_str(),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
            }
            T.plot();
            fflush(stdout);
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
           T.path("loss.png").c_str());
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    install_error_handler(PROG, 1);
    install_temp_file_cleanup();  // Ctrl-C / SIGTERM during a checkpoint save leaves no temporary file
    Options o;
    DefaultRun dr;
    CLI::App app{"oomb-train: train or fine-tune a Qwen2/Qwen2.5 model with OOMB chunk-recurrent training over paged KV caches.\n"
                 "With no arguments: pre-train the 'tiny' preset (real Qwen vocabulary) on the shipped Python documentation text\n"
                 "(data/python-docs.txt.gz), ctx 256, chunk 128, 300 steps; outputs in out/.",
                 "oomb-train"};
    app.get_formatter()->column_width(34);
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later value wins
    app.add_option("-m,--model", o.model, "GGUF model to train (qwen2 architecture)");
    app.add_option("--preset", o.preset, "fresh model: " + qwen2_preset_choices());
    app.add_option("--vocab", o.vocab, "tokenizer GGUF for --preset (default: models/qwen2.5-vocab.gguf of the source tree)");
    app.add_option("--data", o.data, "training text: files or folders (recursive; .gz read directly); repeatable")->take_all();
    app.add_option("--data-bin", o.data_bin, "training ids: little-endian uint32, no header");
    app.add_option("--eval-data", o.eval_data, "held-out data (same format as the training data); default: the last --eval-split %")->take_all();
    app.add_option("--eval-split", o.eval_split, "percent of the data held out when no --eval-data")->capture_default_str();
    app.add_option("--eval-every", o.eval_every, "evaluate every N steps (0: never; always at the last step)")->capture_default_str();
    app.add_option("--eval-seqs", o.eval_seqs, "held-out sequences of --ctx tokens per evaluation")->capture_default_str();
    app.add_option("--ctx", o.ctx, "tokens per training sequence")->capture_default_str();
    app.add_option("--chunk", o.chunk, "tokens per chunk (capped to --ctx)")->capture_default_str();
    app.add_option("--page", o.page, "tokens per KV page")->capture_default_str();
    app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
    app.add_option("--seqs-per-step", o.seqs_per_step, "sequences per step (gradient accumulation)")->capture_default_str();
    app.add_option("--lr", o.lr, "peak learning rate")->capture_default_str();
    app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine decay (default lr/10)");
    app.add_option("--warmup", o.warmup, "linear warmup steps (default: min(100, steps/10))");
    app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (not on norms and biases)")->capture_default_str();
    app.add_option("--adam-beta1", o.beta1, "AdamW beta1")->capture_default_str();
    app.add_option("--adam-beta2", o.beta2, "AdamW beta2")->capture_default_str();
    app.add_option("--adam-eps", o.adam_eps, "AdamW epsilon")->capture_default_str();
    app.add_option("--grad-clip", o.grad_clip, "clip the global gradient norm to this (0: off)")->capture_default_str();
    app.add_option("--trainable", o.trainable, "all, or linear (block projections + LM head, as the OOMB reference)")->capture_default_str();
    app.add_flag("--attn-cache", o.attn_cache,
                 "keep stage 1's attention results for stage 2 instead of recomputing them: faster, (heads * (head dim + 1)) "
                 "* 4 bytes per token and layer more memory (0.5B: 87 KB/token, 7B: 404 KB/token)");
    app.add_option("--attn-cache-type", o.attn_cache_type,
                   "with --attn-cache: f32 (bit-identical to recomputing) or bf16 (attention output rounded to bf16, as the "
                   "output projection's bf16 GEMM reads it; about half the memory: 7B 204 KB/token)")
        ->capture_default_str();
    app.add_option("--opt-state", o.opt_state, "AdamW moments: f32, or bf16 (half the memory, stochastic rounding; e.g. for 7B)")
        ->capture_default_str();
    app.add_option("-t,--threads", o.threads, "CPU threads (default: all)");
    app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
    app.add_option("--rope-theta", o.rope_theta, "override the RoPE base (context extension)");
    app.add_option("-o,--out", o.out, "output folder: train.jsonl, loss.png, model.gguf, state.safetensors")->capture_default_str();
    app.add_option("--save-every", o.save_every, "checkpoint every N steps (0: only at the end; -1: never, e.g. benchmarks)")->capture_default_str();
    app.add_flag("--resume", o.resume, "continue from OUT/model.gguf + OUT/state.safetensors (same command line otherwise)");
    app.add_option("--seed", o.seed, "seed of the initialisation and of the data order")->capture_default_str();
    app.add_option("--log-every", o.log_every, "progress line every N steps")->capture_default_str();
    app.add_option("--stop-after", o.stop_after, "stop (with a checkpoint) after this step, as if interrupted; resume later");
    app.add_option("--max-bad-steps", o.max_bad_steps, "stop (exit 2) after this many consecutive non-finite steps")->capture_default_str();
    app.add_option("--tokens", o.tokens, "verification: safetensors file with input_ids int32 [B, T] (with --dump-grads)");
    app.add_option("--dump-grads", o.dump_grads,
                   "verification: one forward/backward over --tokens (every weight trainable, no update); writes loss and grad.<GGUF name>");
    if (const int rc = parse_command_line(app, argc, argv, PROG); rc >= 0) return rc;
    // Range checks of the numeric options: exit 1 naming the option and its allowed range.
    auto given = [&](const char * name) { return app.count(name) > 0; };
    auto need = [&](bool ok, const char * name, double v, const std::string & range) { need_in_range(PROG, ok, name, v, range); };
    auto validate = [&]() {
        if (given("--rope-theta")) need(std::isfinite(o.rope_theta) && o.rope_theta > 0, "--rope-theta", o.rope_theta, "a finite number > 0");
        need(std::isfinite(o.lr) && o.lr > 0, "--lr", o.lr, "a finite number > 0");
        if (given("--min-lr")) need(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr", o.min_lr, "in [0, --lr]");
        need(o.beta1 >= 0 && o.beta1 < 1, "--adam-beta1", o.beta1, "in [0, 1)");
        need(o.beta2 >= 0 && o.beta2 < 1, "--adam-beta2", o.beta2, "in [0, 1)");
        need(std::isfinite(o.adam_eps) && o.adam_eps > 0, "--adam-eps", o.adam_eps, "a finite number > 0");
        need(o.warmup >= 0, "--warmup", o.warmup, ">= 0");
        need(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "--weight-decay", o.weight_decay, "a finite number >= 0");
        need(std::isfinite(o.grad_clip) && o.grad_clip >= 0, "--grad-clip", o.grad_clip, ">= 0 (0: off)");
        if (given("--threads")) need(o.threads >= 1, "--threads", o.threads, ">= 1");
        need(o.save_every >= -1, "--save-every", o.save_every, ">= -1 (0: only at the end, -1: never)");
        if (given("--stop-after")) need(o.stop_after >= 1, "--stop-after", o.stop_after, ">= 1");
        if (given("--stop-after") && o.save_every < 0)
            fail(PROG, "--stop-after stops with a checkpoint to resume from, which --save-every -1 never writes: drop one of them");
        need(o.eval_every >= 0, "--eval-every", o.eval_every, ">= 0 (0: only at the last step)");
        need(o.eval_seqs >= 0, "--eval-seqs", o.eval_seqs, ">= 0");
        need(o.eval_split >= 0 && o.eval_split < 100, "--eval-split", o.eval_split, "in [0, 100) (percent)");
        need(o.log_every >= 1, "--log-every", o.log_every, ">= 1");
        need(o.max_bad_steps >= 1, "--max-bad-steps", o.max_bad_steps, ">= 1");
        need(o.ctx >= 2, "--ctx", (double) o.ctx, ">= 2");
        need(o.chunk >= 1, "--chunk", (double) o.chunk, ">= 1");
        need(o.page >= 1, "--page", o.page, ">= 1");
        if (given("--page")) need(o.page <= o.ctx, "--page", o.page, ("at most --ctx (" + std::to_string(o.ctx) + "): the page size is too large").c_str());
        need(o.steps >= 1, "--steps", o.steps, ">= 1");
        need(o.seqs_per_step >= 1, "--seqs-per-step", o.seqs_per_step, ">= 1");
        if (o.attn_cache_type != "f32" && o.attn_cache_type != "bf16")
            fail(PROG, "--attn-cache-type must be f32 or bf16, got '" + o.attn_cache_type + "'");
        if (given("--attn-cache-type") && !o.attn_cache) fail(PROG, "--attn-cache-type needs --attn-cache");
    };
    try {
        if (!o.tokens.empty() || !o.dump_grads.empty()) {
            validate();
            // the verification run reads only the model, the tokens, --chunk, --page, --attn-cache(-type), --device, --threads
            std::string ignored;
            for (const char * opt : {"--preset", "--data", "--data-bin", "--eval-data", "--eval-split", "--eval-every", "--eval-seqs",
                                     "--ctx", "--steps", "--seqs-per-step", "--lr", "--min-lr", "--warmup", "--weight-decay",
                                     "--adam-beta1", "--adam-beta2", "--adam-eps", "--grad-clip", "--trainable", "--out",
                                     "--save-every", "--resume", "--stop-after", "--max-bad-steps", "--log-every", "--opt-state",
                                     "--seed"}) {
                if (given(opt)) ignored += std::string(ignored.empty() ? "" : ", ") + opt;
            }
            if (!ignored.empty()) fprintf(stderr, "%s: note: --dump-grads ignores the training options given: %s\n", PROG, ignored.c_str());
            return dump_grads(o);
        }

        if (!o.model.empty() && !o.preset.empty()) fail(PROG, "give either -m MODEL.gguf or --preset NAME, not both");
        if (!o.data.empty() && !o.data_bin.empty()) fail(PROG, "give either --data or --data-bin, not both");
        if (!o.preset.empty()) {
            Qwen2Config c;
            if (!qwen2_preset(o.preset, &c)) fail(PROG, "unknown preset '" + o.preset + "' (choose " + qwen2_preset_choices() + ")");
        }
        const bool default_run = o.model.empty() && o.preset.empty() && o.data.empty() && o.data_bin.empty();
        if (default_run) {
            const std::string d = find_project_file("data/python-docs.txt.gz");
            if (d.empty()) fail(PROG, "default run: data/python-docs.txt.gz not found next to the executable or in the current folder "
                                      "(regenerate it with scripts/make-default-data.sh)");
            o.data = {d};
            o.preset = "tiny";
            auto unset = [&](const char * name) { return app.count(name) == 0; };
            if (unset("--ctx")) o.ctx = dr.ctx;
            if (unset("--chunk")) o.chunk = dr.chunk;
            if (unset("--steps")) o.steps = dr.steps;
            if (unset("--warmup")) o.warmup = dr.warmup;
            if (unset("--eval-every")) o.eval_every = dr.eval_every;
            if (unset("--eval-seqs")) o.eval_seqs = dr.eval_seqs;
            if (unset("--save-every")) o.save_every = dr.save_every;
            if (unset("--lr")) o.lr = dr.lr;
            if (unset("--min-lr")) o.min_lr = dr.min_lr;
            printf("default run: pre-training the tiny preset on %s (give -m/--preset and --data to train something else; --help)\n", d.c_str());
        } else if (o.data.empty() && o.data_bin.empty()) {
            fail(PROG, "no training data: give --data FILES/FOLDERS or --data-bin IDS.bin");
        } else if (o.model.empty() && o.preset.empty()) {
            o.preset = "tiny";
            printf("note: no model given: training a fresh --preset tiny\n");
        }
        validate();
        if (!default_run && app.count("--warmup") == 0) o.warmup = std::min(o.warmup, o.steps / 10);
        if (o.model.empty() && o.vocab.empty()) o.vocab = find_project_file("models/qwen2.5-vocab.gguf");
        return train_main(o, default_run, app.count("--eval-every") > 0);
    } catch (const std::exception & e) {
        fail(PROG, e.what());
    }
}
