// oomb-train's options (see train-options.h).
#include "train-options.h"
#include "qwen2-layout.h"  // presets (qwen2_preset, qwen2_preset_choices)

#include <CLI/CLI.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <cstdio>

namespace oomb {
namespace train {

namespace {

const char * PROG = TRAIN_PROG;

// Settings of the built-in default run (no model and no data given); each applies only when the
// option is not given on the command line. Measured on a 2-core CPU: see README "Training".
struct DefaultRun {
    int64_t ctx = 256, chunk = 128;
    int steps = 300, warmup = 30, eval_every = 50, save_every = 100, eval_seqs = 8;
    double lr = 3e-3, min_lr = 3e-4;
};
} // namespace

double min_lr_of(const Options & o) { return o.min_lr < 0 ? o.lr * 0.1 : o.min_lr; }

LoraInit lora_init_of(const Options & o) {
    LoraInit i = LoraInit::Default;
    lora_parse_init(o.lora_init, &i, nullptr);  // checked with the options
    return i;
}

LoraConfig lora_config_of(const Options & o) {
    LoraConfig c;
    c.rank = o.lora_rank;
    c.alpha = (float) o.lora_alpha;
    if (!lora_parse_targets(o.lora_targets, &c.targets, nullptr)) c.targets = 0;  // checked with the options
    return c;
}

gguf_tensor_type out_type_of(const Options & o) {
    if (o.out_type == "f32") return GGUF_TENSOR_F32;
    if (o.out_type == "f16") return GGUF_TENSOR_F16;
    if (o.out_type == "q8_0") return GGUF_TENSOR_Q8_0;
    return GGUF_TENSOR_BF16;
}

std::string checkpoint_model_name(const Options & o) { return o.trainable == "lora" ? "adapter.gguf" : "model.gguf"; }

nlohmann::json config_json(const Options & o) {
    nlohmann::json j;
    j["model"] = o.model; j["preset"] = o.preset; j["vocab"] = o.vocab;
    j["data"] = o.data; j["data_bin"] = o.data_bin; j["data_format"] = o.data_format;
    if (o.data_format == "chat") { j["train_on"] = o.train_on; j["chat_pack"] = o.chat_pack; j["chat_long"] = o.chat_long; } j["eval_data"] = o.eval_data; j["eval_split"] = o.eval_split;
    j["eval_every"] = o.eval_every; j["eval_seqs"] = o.eval_seqs;
    j["ctx"] = o.ctx; j["chunk"] = o.chunk; j["page"] = o.page; j["steps"] = o.steps; j["seqs_per_step"] = o.seqs_per_step;
    j["lr"] = o.lr; j["min_lr"] = min_lr_of(o); j["warmup"] = o.warmup;
    j["weight_decay"] = o.weight_decay; j["adam_beta1"] = o.beta1; j["adam_beta2"] = o.beta2; j["adam_eps"] = o.adam_eps;
    j["grad_clip"] = o.grad_clip; j["trainable"] = o.trainable;
    if (o.trainable == "lora") { j["lora_rank"] = o.lora_rank; j["lora_alpha"] = o.lora_alpha; j["lora_targets"] = lora_targets_string(lora_config_of(o).targets); j["lora_init"] = o.lora_init; }
    if (o.trainable != "lora") j["out_type"] = o.out_type;
    j["base_type"] = o.base_type;  // not checked on --resume, but a change is noted (keep vs bf16 / f32 changes the frozen base's numbers)
    j["opt_state"] = o.opt_state; j["attn_cache"] = o.attn_cache; j["attn_cache_type"] = o.attn_cache ? o.attn_cache_type : "none"; j["kv_grad_type"] = o.kv_grad_type; j["threads"] = o.threads; j["device"] = o.device;
    j["offload"] = o.offload.mode; j["gpu_kv_budget"] = o.offload.gpu_kv_budget >= 0 ? nlohmann::json(o.offload.gpu_kv_budget) : nlohmann::json("default"); j["offload_block"] = o.offload.block_pages;
    j["sparse_pages"] = o.sparse.pages;
    if (o.sparse.pages > 0) { j["sparse_score"] = o.sparse.score; j["sparse_sink"] = o.sparse.sink; j["sparse_local"] = o.sparse.local; }
    j["rope_theta"] = o.rope_theta; j["seed"] = o.seed;
    j["threads_used"] = threads_default(o.threads);
    return j;
}

namespace {
// oomb-train's option table: every option bound to a field of o.
void add_train_cli_options(CLI::App & app, Options & o) {
    app.add_option("-m,--model", o.model, "GGUF model to train (qwen2 or llama architecture)");
    app.add_option("--preset", o.preset, "fresh model: " + qwen2_preset_choices());
    app.add_option("--vocab", o.vocab, "tokenizer GGUF for --preset (default: models/qwen2.5-vocab.gguf of the source tree)");
    app.add_option("--data", o.data, "training text: files or folders (recursive; .gz read directly; with --data-format chat a folder's "
                                        "*.jsonl and *.jsonl.gz files only, others skipped with a note); repeatable")->take_all();
    app.add_option("--data-bin", o.data_bin, "training ids: little-endian uint32, no header");
    app.add_option("--eval-data", o.eval_data, "held-out data (same format as the training data); default: the last --eval-split %")->take_all();
    app.add_option("--data-format", o.data_format,
                   "text (plain text files, documents joined by end-of-text) or chat (JSONL, one conversation a line: "
                   "{\"messages\": [{\"role\": \"system|user|assistant\", \"content\": \"...\"}]}, rendered in the model's ChatML "
                   "template)")->capture_default_str();
    app.add_option("--train-on", o.train_on, "chat: the tokens whose loss counts: assistant (each assistant message's content and its "
                                             "<|im_end|>; default) or all");
    app.add_flag("--chat-pack", o.chat_pack, "chat: pack several whole conversations into each --ctx sequence (default: one "
                                             "conversation per sequence, padded; padding has no loss)");
    app.add_option("--chat-long", o.chat_long, "chat: a conversation longer than --ctx: error (stop, naming its line), split "
                                               "(into pieces of --ctx tokens) or skip (counted)")->capture_default_str();
    app.add_flag("--skip-bad-lines", o.skip_bad_lines, "chat: skip bad JSONL lines (counted, the first 10 printed) instead of stopping");
    app.add_option("--eval-split", o.eval_split, "percent of the data held out when no --eval-data")->capture_default_str();
    app.add_option("--eval-every", o.eval_every, "evaluate every N steps and at the last step, and before the first step of a run from -m (0: never)")->capture_default_str();
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
    app.add_option("--trainable", o.trainable, "all, linear (block projections + LM head, as the OOMB reference), or lora (low-rank "
                                               "adapters on a frozen -m base; checkpoints OUT/adapter.gguf in llama.cpp's LoRA format)")->capture_default_str();
    app.add_option("--base-type", o.base_type, "keep (-m's quantized projections stay in their GGUF block type; a frozen base: "
                                               "--trainable lora), bf16 or f32 (weights converted on load); with --preset and "
                                               "--trainable lora also q4_k_m, q4_k, q6_k or q8_0 (the layers' projections made as "
                                               "random blocks of that type; q4_k_m: llama.cpp's mix)")->capture_default_str();
    app.add_option("--lora-rank", o.lora_rank, "--trainable lora: adapter rank r")->capture_default_str();
    app.add_option("--lora-alpha", o.lora_alpha, "--trainable lora: alpha (scale alpha / r; 0: scale 1, as llama.cpp reads alpha 0; default 2 x the default rank)")->capture_default_str();
    app.add_option("--lora-targets", o.lora_targets, "--trainable lora: the projections adapted, a comma-separated subset of q,k,v,o,gate,up,down")
        ->capture_default_str();
    app.add_option("--lora-init", o.lora_init, "--trainable lora: A's initialisation as PEFT's init_lora_weights, B = 0 in both: default "
                                               "(A Kaiming-uniform, a = sqrt(5): uniform in +-1/sqrt(n_in)) or gaussian (A ~ Normal(0, 1/r)); "
                                               "ignored with a warning on --resume (the adapter comes from OUT/adapter.gguf)")
        ->capture_default_str();
    app.add_flag("--attn-cache", o.attn_cache,
                 "keep stage 1's attention results for stage 2 instead of recomputing them: faster, (heads * (head dim + 1)) "
                 "* 4 bytes per token and layer more memory (0.5B: 87 KB/token, 7B: 404 KB/token)");
    app.add_option("--attn-cache-type", o.attn_cache_type,
                   "with --attn-cache: f32 (bit-identical to recomputing) or bf16 (attention output rounded to bf16, as the "
                   "output projection's bf16 GEMM reads it; about half the memory: 7B 204 KB/token)")
        ->capture_default_str();
    app.add_option("--kv-grad-type", o.kv_grad_type,
                   "KV-gradient pages: f32, or bf16 (each chunk's dK/dV added in f32 and rounded back stochastically; "
                   "with bf16 K/V 2/3 of the KV bytes when training: 7B 112 instead of 168 KiB/token)")
        ->capture_default_str();
    add_offload_options(app, o.offload);
    add_sparse_options(app, o.sparse);
    app.add_option("--opt-state", o.opt_state, "AdamW moments: f32, or bf16 (half the memory, stochastic rounding; e.g. for 7B)")
        ->capture_default_str();
    app.add_option("--out-type", o.out_type,
                   "full-model checkpoints: type of model.gguf's 2-D weights, f32, f16, bf16 or q8_0 (norms and biases stay f32; "
                   "--resume from a rounded checkpoint continues from the rounded weights)")
        ->capture_default_str();
    app.add_option("-t,--threads", o.threads, "CPU threads (default: all)");
    app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
    app.add_option("--rope-theta", o.rope_theta, "override the RoPE base (context extension)");
    app.add_option("-o,--out", o.out, "output folder: train.jsonl, loss.png, model.gguf (lora: adapter.gguf), state.safetensors")->capture_default_str();
    app.add_option("--save-every", o.save_every, "checkpoint every N steps (0: only at the end; -1: never, e.g. benchmarks, and Ctrl-C stops at once)")->capture_default_str();
    app.add_flag("--resume", o.resume, "continue from OUT/model.gguf (lora: OUT/adapter.gguf) + OUT/state.safetensors (same command line otherwise)");
    app.add_option("--seed", o.seed, "seed of the initialisation and of the data order")->capture_default_str();
    app.add_option("--log-every", o.log_every, "progress line every N steps")->capture_default_str();
    add_progress_option(app, o.progress_every);
    app.add_option("--stop-after", o.stop_after, "stop (with a checkpoint) after this step, as if interrupted; resume later");
    app.add_option("--max-bad-steps", o.max_bad_steps, "stop (exit 2) after this many consecutive non-finite steps")->capture_default_str();
    app.add_option("--tokens", o.tokens, "verification: safetensors file with input_ids int32 or int64 [B, T] (with --dump-grads or --dump-logits)");
    app.add_option("--dump-grads", o.dump_grads,
                   "verification: one forward/backward over --tokens (every weight trainable, or with --trainable lora the adapters; no update); "
                   "writes loss and grad.<GGUF name>");
    app.add_option("--dump-logits", o.dump_logits,
                   "verification: one forward over --tokens [T]; writes the last chunk's logits (all T with --chunk >= T) and the loss");
}
} // namespace

const CLI::App & train_option_table() {
    struct Table {
        Options o;
        CLI::App app{"", "oomb-train"};
        Table() { add_train_cli_options(app, o); }
    };
    static const Table t;
    return t.app;
}

int parse_train_options(int argc, char ** argv, TrainCommand * cmd) {
    Options & o = cmd->o;
    DefaultRun dr;
    CLI::App app{"oomb-train: train or fine-tune a Qwen2/Qwen2.5 or Llama (SmolLM2, Llama 3.x) model with OOMB chunk-recurrent training over paged KV caches.\n"
                 "With no arguments: pre-train the 'tiny' preset (real Qwen vocabulary) on the shipped Python documentation text\n"
                 "(data/python-docs.txt.gz), ctx 256, chunk 128, 300 steps; outputs in out/.",
                 "oomb-train"};
    app.get_formatter()->column_width(34);
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later value wins
    add_train_cli_options(app, o);
    if (const int rc = parse_command_line(app, argc, argv, PROG); rc >= 0) return rc;
    // Range checks of the numeric options: exit 1 naming the option and its allowed range.
    auto given = [&](const char * name) { return app.count(name) > 0; };
    auto need = [&](bool ok, const char * name, double v, const std::string & range) { need_in_range(PROG, ok, name, v, range); };
    auto validate = [&]() {
        need(std::isfinite(o.lr) && o.lr > 0, "--lr", o.lr, "a finite number > 0");
        if (given("--min-lr")) need(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr", o.min_lr, "in [0, --lr]");
        need(o.beta1 >= 0 && o.beta1 < 1, "--adam-beta1", o.beta1, "in [0, 1)");
        need(o.beta2 >= 0 && o.beta2 < 1, "--adam-beta2", o.beta2, "in [0, 1)");
        need(std::isfinite(o.adam_eps) && o.adam_eps > 0, "--adam-eps", o.adam_eps, "a finite number > 0");
        need(o.warmup >= 0, "--warmup", o.warmup, ">= 0");
        need(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "--weight-decay", o.weight_decay, "a finite number >= 0");
        // decoupled decay scales each weight by 1 - lr x weight decay per step: at 1 or more it zeroes or flips the weights
        // (a given --weight-decay; the default's with an absurd --lr is left to the run's non-finite-loss stop)
        if (given("--weight-decay")) {
            char inv[32];
            snprintf(inv, sizeof inv, "%.6g", 1.0 / o.lr);
            need(o.lr * o.weight_decay < 1, "--weight-decay", o.weight_decay,
                 std::string("below 1 / --lr (") + inv + "): each step multiplies the weights by 1 - lr x weight decay");
        }
        need(std::isfinite(o.grad_clip) && o.grad_clip >= 0, "--grad-clip", o.grad_clip, ">= 0 (0: off)");
        need(o.save_every >= -1, "--save-every", o.save_every, ">= -1 (0: only at the end, -1: never)");
        if (given("--stop-after")) need(o.stop_after >= 1, "--stop-after", o.stop_after, ">= 1");
        if (given("--stop-after") && o.save_every < 0)
            fail(PROG, "--stop-after stops with a checkpoint to resume from, which --save-every -1 never writes: drop one of them");
        need(o.eval_every >= 0, "--eval-every", o.eval_every, ">= 0 (0: never)");
        need(o.eval_seqs >= 0, "--eval-seqs", o.eval_seqs, ">= 0");
        need(o.eval_split >= 0 && o.eval_split < 100, "--eval-split", o.eval_split, "in [0, 100) (percent)");
        need(o.log_every >= 1, "--log-every", o.log_every, ">= 1");
        check_progress_option(PROG, o.progress_every);
        need(o.max_bad_steps >= 1, "--max-bad-steps", o.max_bad_steps, ">= 1");
        check_chunk_options(PROG, app, o.ctx, o.chunk, o.page, o.threads, o.rope_theta);
        need(o.steps >= 1, "--steps", o.steps, ">= 1");
        need(o.seqs_per_step >= 1, "--seqs-per-step", o.seqs_per_step, ">= 1");
        if (o.trainable != "all" && o.trainable != "linear" && o.trainable != "lora")
            fail(PROG, "--trainable must be all, linear or lora, got '" + o.trainable + "'");
        if (o.trainable == "lora") {
            need(o.lora_rank >= 1 && o.lora_rank <= INT32_MAX, "--lora-rank", (double) o.lora_rank, "from 1 to 2147483647");
            need(std::isfinite(o.lora_alpha) && o.lora_alpha >= 0, "--lora-alpha", o.lora_alpha,
                 "a finite number >= 0 (0: scale 1, as llama.cpp reads alpha 0)");
            if (o.lora_alpha == 0)
                fprintf(stderr, "%s: note: --lora-alpha 0 means scale 1 (llama.cpp's rule for alpha 0; PEFT's adapter_config.json "
                                "gets lora_alpha = r), not scale 0\n", PROG);
            uint32_t mask = 0;
            std::string e;
            if (!lora_parse_targets(o.lora_targets, &mask, &e)) fail(PROG, e);
            LoraInit init;
            if (!lora_parse_init(o.lora_init, &init, &e)) fail(PROG, e);
        } else {
            for (const char * opt : {"--lora-rank", "--lora-alpha", "--lora-targets", "--lora-init"})
                if (given(opt)) fail(PROG, std::string(opt) + " needs --trainable lora");
        }
        if (o.base_type != "keep" && o.base_type != "bf16" && o.base_type != "f32" && !base_type_is_block(o.base_type))
            fail(PROG, "--base-type must be keep, bf16 or f32 (with --preset and --trainable lora also q4_k_m, q4_k, q6_k or q8_0), got '" +
                           o.base_type + "'");
        if (base_type_is_block(o.base_type) && !o.model.empty())
            fail(PROG, "--base-type " + o.base_type + " makes a random base of a --preset; -m's quantized projections keep their own "
                           "type (--base-type keep): to re-type a model file, write it with oomb-export --out-type " + o.base_type);
        if (base_type_is_block(o.base_type) && o.trainable != "lora")
            fail(PROG, "--base-type " + o.base_type + " makes a frozen base in a block type, which needs --trainable lora (--trainable " +
                           o.trainable + " trains the weights)");
        if (o.base_type == "keep" && o.trainable != "lora" && given("--base-type"))
            fail(PROG, "--base-type keep keeps quantized weights frozen, which needs --trainable lora (--trainable " + o.trainable +
                           " trains the weights: give --base-type bf16 or f32, or leave it out to dequantize them)");
        if (o.out_type != "f32" && o.out_type != "f16" && o.out_type != "bf16" && o.out_type != "q8_0")
            fail(PROG, "--out-type must be f32, f16, bf16 or q8_0, got '" + o.out_type + "'");
        if (o.trainable == "lora" && given("--out-type"))
            fail(PROG, "--out-type sets model.gguf's weight type, which --trainable lora does not write (the adapter is f32)");
        if (o.opt_state != "f32" && o.opt_state != "bf16") fail(PROG, "--opt-state must be f32 or bf16, got '" + o.opt_state + "'");
        if (o.attn_cache_type != "f32" && o.attn_cache_type != "bf16")
            fail(PROG, "--attn-cache-type must be f32 or bf16, got '" + o.attn_cache_type + "'");
        if (given("--attn-cache-type") && !o.attn_cache) fail(PROG, "--attn-cache-type needs --attn-cache");
        if (o.kv_grad_type != "f32" && o.kv_grad_type != "bf16")
            fail(PROG, "--kv-grad-type must be f32 or bf16, got '" + o.kv_grad_type + "'");
        check_offload_options(PROG, app, o.offload);
        check_sparse_options(PROG, app, o.sparse);
        if (o.data_format != "text" && o.data_format != "chat") fail(PROG, "--data-format must be text or chat, got '" + o.data_format + "'");
        if (o.data_format == "chat") {
            if (o.train_on.empty()) o.train_on = "assistant";
            if (o.train_on != "assistant" && o.train_on != "all") fail(PROG, "--train-on must be assistant or all, got '" + o.train_on + "'");
            if (o.chat_long != "error" && o.chat_long != "split" && o.chat_long != "skip")
                fail(PROG, "--chat-long must be error, split or skip, got '" + o.chat_long + "'");
            if (!o.data_bin.empty()) fail(PROG, "--data-format chat reads JSONL through --data, not --data-bin");
        } else {
            for (const char * opt : {"--train-on", "--chat-pack", "--chat-long", "--skip-bad-lines"})
                if (given(opt)) fail(PROG, std::string(opt) + " needs --data-format chat");
        }
    };
    if (!o.tokens.empty() || !o.dump_grads.empty() || !o.dump_logits.empty()) {
        validate();
        if (o.tokens.empty() || o.dump_grads.empty() == o.dump_logits.empty())
            fail(PROG, "verification: give --tokens IDS.safetensors with one of --dump-grads G.safetensors or --dump-logits L.safetensors");
        if (!o.dump_logits.empty() && (o.attn_cache || given("--attn-cache-type")))
            fail(PROG, "--dump-logits runs the forward only: --attn-cache (a stage-2 cache) does not apply");
        if (!o.dump_logits.empty() && given("--kv-grad-type"))
            fail(PROG, "--dump-logits runs the forward only: --kv-grad-type (the backward's gradient pages) does not apply");
        // the verification run reads only the model, the tokens, --chunk, --page, --attn-cache(-type), --sparse-*, --kv-grad-type,
        // --device, --threads, and --trainable lora with --lora-rank / --lora-alpha / --lora-targets / --seed / --base-type
        std::string ignored;
        for (const char * opt : {"--preset", "--data", "--data-bin", "--data-format", "--train-on", "--chat-pack", "--chat-long", "--skip-bad-lines", "--eval-data", "--eval-split", "--eval-every", "--eval-seqs",
                                 "--ctx", "--steps", "--seqs-per-step", "--lr", "--min-lr", "--warmup", "--weight-decay",
                                 "--adam-beta1", "--adam-beta2", "--adam-eps", "--grad-clip", "--out",
                                 "--save-every", "--resume", "--stop-after", "--max-bad-steps", "--log-every", "--progress-every", "--opt-state", "--out-type"}) {
            if (given(opt)) ignored += std::string(ignored.empty() ? "" : ", ") + opt;
        }
        if (given("--trainable") && o.trainable == "linear")  // only lora changes what is differentiated
            ignored += std::string(ignored.empty() ? "" : ", ") + "--trainable linear (every weight's gradient is written)";
        if (!ignored.empty()) fprintf(stderr, "%s: note: %s ignores the training options given: %s\n", PROG,
                                     o.dump_grads.empty() ? "--dump-logits" : "--dump-grads", ignored.c_str());
        cmd->verify = true;
        return -1;
    }

    if (!o.model.empty() && !o.preset.empty()) fail(PROG, "give either -m MODEL.gguf or --preset NAME, not both");
    o.preset_given = !o.preset.empty();
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
        // the default schedule only where the user set none of its parts: a given --lr or --steps
        // derives the rest as for any run (min-lr = lr/10, warmup <= steps/10), never a rising cosine
        if (unset("--warmup")) o.warmup = unset("--steps") ? dr.warmup : std::min(o.warmup, o.steps / 10);
        if (unset("--eval-every")) o.eval_every = dr.eval_every;
        if (unset("--eval-seqs")) o.eval_seqs = dr.eval_seqs;
        if (unset("--save-every")) o.save_every = dr.save_every;
        if (unset("--lr")) o.lr = dr.lr;
        if (unset("--min-lr") && unset("--lr")) o.min_lr = dr.min_lr;
        printf("default run: pre-training the tiny preset on %s (give -m/--preset and --data to train something else; --help)\n", d.c_str());
    } else if (o.data.empty() && o.data_bin.empty()) {
        fail(PROG, "no training data: give --data FILES/FOLDERS or --data-bin IDS.bin");
    } else if (o.model.empty() && o.preset.empty()) {
        o.preset = "tiny";
        printf("note: no model given: training a fresh --preset tiny\n");
    }
    validate();
    if (given("--warmup") && o.warmup > o.steps)
        fprintf(stderr, "%s: warning: --warmup %d is more than --steps %d: the learning rate never reaches --lr %g (warmup rises "
                        "linearly over %d steps)\n", PROG, o.warmup, o.steps, o.lr, o.warmup);
    {  // the same file or folder twice, or one inside another given folder: read twice, i.e. weighted twice; and
       // held-out data that is also training data (the held-out loss then measures text the model trains on)
        namespace fs = std::filesystem;
        auto canonical = [](const std::string & p) {
            std::error_code ec;  // a missing path: reported by the data reader, not here
            fs::path c = fs::weakly_canonical(p, ec);
            return ec ? fs::path() : c;
        };
        std::vector<fs::path> canon(o.data.size());
        for (size_t i = 0; i < o.data.size(); i++) canon[i] = canonical(o.data[i]);
        auto inside = [](const fs::path & a, const fs::path & dir) {  // a == dir, or a below dir, by whole components
            auto d = dir.begin(), x = a.begin();
            for (; d != dir.end() && !d->empty(); ++d, ++x)
                if (x == a.end() || *x != *d) return false;
            return true;
        };
        for (size_t i = 0; i < o.data.size(); i++) {
            for (size_t j = 0; j < i && !canon[i].empty(); j++) {
                if (canon[j].empty()) continue;
                const bool same = canon[i] == canon[j], i_in_j = inside(canon[i], canon[j]), j_in_i = inside(canon[j], canon[i]);
                if (!same && !i_in_j && !j_in_i) continue;
                fprintf(stderr, "%s: warning: --data %s %s --data %s: its text is read (and trained on) twice\n", PROG,
                        (j_in_i && !same ? o.data[j] : o.data[i]).c_str(),
                        same ? "names the same file or folder as" : "lies inside",
                        (j_in_i && !same ? o.data[i] : o.data[j]).c_str());
                break;
            }
        }
        std::vector<std::pair<fs::path, std::string>> train;  // (canonical, as given): the --data paths and --data-bin
        for (size_t i = 0; i < o.data.size(); i++) train.push_back({canon[i], o.data[i]});
        if (!o.data_bin.empty()) train.push_back({canonical(o.data_bin), o.data_bin});
        for (const auto & e : o.eval_data) {
            const fs::path ce = canonical(e);
            if (ce.empty()) continue;
            for (const auto & [ct, given_path] : train) {
                if (ct.empty()) continue;
                const bool same = ce == ct, e_in_t = inside(ce, ct), t_in_e = inside(ct, ce);
                if (!same && !e_in_t && !t_in_e) continue;
                fprintf(stderr, "%s: warning: --eval-data %s %s the training data %s: the held-out loss is measured on text the model "
                                "trains on\n", PROG, e.c_str(), same ? "is" : e_in_t ? "lies inside" : "holds", given_path.c_str());
                break;
            }
        }
    }
    if (o.resume && given("--lora-init"))
        fprintf(stderr, "%s: warning: --lora-init %s is ignored with --resume: the adapter is loaded from %s/adapter.gguf, not initialised\n",
                PROG, o.lora_init.c_str(), o.out.c_str());
    if (o.trainable == "lora" && o.model.empty() && (default_run || app.count("--preset") == 0))
        fail(PROG, "--trainable lora trains adapters on a frozen base model: give -m BASE.gguf or --preset NAME (a random base), "
                   "not the default run");
    if (!default_run && app.count("--warmup") == 0) o.warmup = std::min(o.warmup, o.steps / 10);
    if (o.model.empty() && o.vocab.empty()) o.vocab = find_project_file("models/qwen2.5-vocab.gguf");
    o.chunk = std::min(o.chunk, o.ctx);
    cmd->default_run = default_run;
    cmd->eval_every_given = app.count("--eval-every") > 0;
    return -1;
}

} // namespace train
} // namespace oomb
