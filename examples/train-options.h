// oomb-train's options: the command line, its checks (each in one place; the ones oomb-eval shares
// are check_chunk_options of train-common.h) and their JSON form, stored in checkpoints.
#pragma once

#include "train-common.h"
#include "train-progress.h"
#include "train-offload.h"
#include "train-sparse.h"

#include "lora.h"
#include "qwen2.h"  // qwen2_random_base_type_known

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace train {

constexpr const char * TRAIN_PROG = "oomb-train";

// Storage type of the linear weights and of the KV pages: f32 on the CPU, bf16 on a GPU (bf16
// operands with f32 accumulation; the KV-gradient pages stay f32).
inline oomb_type compute_type(oomb_backend_t be) { return oomb_backend_is_host(be) ? OOMB_TYPE_F32 : OOMB_TYPE_BF16; }
/// The weight type a -m file is converted to on load under --base-type (keep / bf16 / f32): keep
/// converts what it does not keep (everything but block-type projections) to compute_type(be).
inline oomb_type base_weight_type(const std::string & base_type, oomb_backend_t be) {
    return base_type == "f32" ? OOMB_TYPE_F32 : base_type == "bf16" ? OOMB_TYPE_BF16 : compute_type(be);
}

/// true for the --base-type values that make a preset's projections random blocks of a block type
/// (q4_k_m, q4_k, q6_k, q8_0: qwen2_random_base_types; --preset with --trainable lora only).
inline bool base_type_is_block(const std::string & t) { return qwen2_random_base_type_known(t); }

struct Options {
    std::string model, preset, vocab;
    bool preset_given = false;  // --preset on the command line (not the default run's or "no model given"'s tiny)
    std::vector<std::string> data;
    std::string data_bin;
    std::vector<std::string> eval_data;
    // chat data (train-chat.h): --data / --eval-data are JSONL conversations
    std::string data_format = "text";  // text or chat
    std::string train_on;              // chat: assistant (default) or all
    bool chat_pack = false;            // chat: several conversations per sequence (else one, padded)
    std::string chat_long = "error";   // chat: a conversation longer than --ctx: split, skip or error
    bool skip_bad_lines = false;       // chat: skip (and count) bad JSONL lines instead of stopping
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
    std::string trainable = "all";     // all, linear or lora
    // --trainable lora (models/lora.h): rank, alpha (scale alpha / rank; 32 = 2 x the default rank, the
    // common choice; PEFT's own default is 8), targets
    int64_t lora_rank = 16;
    double lora_alpha = 32;
    std::string lora_targets = "q,k,v,o,gate,up,down";
    std::string lora_init = "default";  // --lora-init: PEFT's init_lora_weights, default or gaussian (new adapters only)
    std::string opt_state = "f32";
    std::string out_type = "bf16";  // --out-type: model.gguf's 2-D weights (full-model checkpoints)
    // --base-type: a -m file's block-type (quantized) projections. keep: stay in their GGUF type in
    // backend memory (frozen base: --trainable lora only; with all / linear the default falls back
    // to dequantizing, an explicit keep is an error); bf16 / f32: every weight converted to it.
    // With --preset --trainable lora: keep = the compute type, bf16 / f32, or q4_k_m / q4_k / q6_k /
    // q8_0 (the projections made as random blocks of that type: base_type_is_block).
    std::string base_type = "keep";
    bool attn_cache = false;
    std::string attn_cache_type = "f32";
    std::string kv_grad_type = "f32";  // --kv-grad-type: KV-gradient pages, f32 or bf16 (stochastic rounding)
    OffloadOptions offload;  // --offload, --gpu-kv-budget, --offload-block
    SparseOptions sparse;    // --sparse-pages, --sparse-score, --sparse-sink, --sparse-local
    int threads = 0;
    std::string device = "cpu";
    double rope_theta = 0;
    std::string out = "out";
    int save_every = 100;
    bool resume = false;
    uint64_t seed = 42;
    int log_every = 1;
    double progress_every = 30;  // --progress-every: seconds between progress lines inside a step (0: off)
    int stop_after = 0;
    int max_bad_steps = 3;
    // verification
    std::string tokens, dump_grads, dump_logits;
};

// The parsed command line and the mode it selects.
struct TrainCommand {
    Options o;
    bool verify = false;            // --tokens with --dump-grads (one forward/backward) or --dump-logits (one forward), no training
    bool default_run = false;       // no model and no data: the built-in run (DefaultRun)
    bool eval_every_given = false;  // --eval-every on the command line
};

/// Parses and checks argv (every range and combination check of oomb-train's options); fills the
/// defaults that depend on other options (the built-in default run, --warmup, --vocab). Returns -1
/// when the program should go on, else its exit code (0 after --help, 1 after an error, printed).
int parse_train_options(int argc, char ** argv, TrainCommand * cmd);
/// oomb-train's option table (bound to a private Options, never parsed): for another tool's
/// parse_command_line, to say that an option it does not have belongs to oomb-train.
const CLI::App & train_option_table();

/// --trainable lora: the adapter's configuration of the options (checked by parse_train_options).
LoraConfig lora_config_of(const Options & o);
/// --lora-init as a LoraInit (validated with the options).
LoraInit lora_init_of(const Options & o);
/// The checkpoint's model file in OUT: "adapter.gguf" with --trainable lora, else "model.gguf".
std::string checkpoint_model_name(const Options & o);

/// --out-type as a GGUF tensor type: f32, f16, bf16 or q8_0 (checked by parse_train_options).
gguf_tensor_type out_type_of(const Options & o);

/// The final learning rate of the cosine decay (--min-lr, default --lr / 10).
double min_lr_of(const Options & o);

/// The options as stored in a checkpoint's metadata (the keys are the options' names with '_').
nlohmann::json config_json(const Options & o);

} // namespace train
} // namespace oomb
