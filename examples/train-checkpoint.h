// oomb-train's checkpoints: OUT/model.gguf (2-D weights in --out-type, default bf16, llama.cpp-loadable, tokenizer keys from
// the vocabulary) and OUT/state.safetensors (AdamW moments and metadata: step, data position, RNG
// state, configuration, hashes of the data and the weights). Both are first written completely
// under temporary names ("<name>.saving") and then renamed, model first: an interrupted save never
// damages the previous checkpoint, and a save interrupted between the renames is completed by
// --resume (the pending state file matches the new model's weights hash). A save that fails before
// the model's rename removes its "*.saving" files; a save first removes those a killed save left
// (so that it never needs the space of two checkpoints in flight). Also the output folder's
// lock and the clean-up of temporary files that a killed process left.
// With --trainable lora the model file is OUT/adapter.gguf instead (llama.cpp's LoRA adapter format,
// models/lora.h; the base, given by -m, is not rewritten) and the weights hash covers the adapter.
// Beside it, PEFT's adapter_model.safetensors + adapter_config.json, renamed just before adapter.gguf
// and carrying the same weights hash (metadata oomb_weights_hash, equal to state.safetensors'
// weights_hash): a reader can tell whether the PEFT files and the checkpoint belong together, and
// --resume, which trains from adapter.gguf only, rewrites PEFT files that do not match it (a save
// killed between the two renames leaves them one save ahead), saying so.
#pragma once

#include "train-data.h"
#include "train-options.h"

#include "oomb-opt.h"
#include "model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace train {

/// One point of the loss curve: a training step's loss, or a held-out evaluation's.
struct LogEntry { int64_t step; double loss; bool eval; };

/// The run's progress, stored in the state file beside the moments and the sampler's position.
struct TrainProgress {
    int64_t step = 0;          // completed steps
    int bad_run = 0;           // consecutive non-finite steps
    int64_t tokens_seen = 0;
    double elapsed_s = 0;      // training seconds up to this point, over all resumed runs
};

/// PyTorch's shape of t (ne reversed), as safetensors stores it.
std::vector<int64_t> torch_shape(const oomb_tensor * t);
/// Hash of every weight's bytes, in GGUF order: ties a state file to its model file. `saved`: the
/// --out-type of the model file; the hash is of the weights as that file loads them back into m's
/// types (2-D weights rounded to `saved` and back), so that it equals weights_hash(loaded model)
/// at --resume. GGUF_TENSOR_F32 (and any type equal to a tensor's own): the raw bytes.
uint64_t weights_hash(const Qwen2Model & m, gguf_tensor_type saved = GGUF_TENSOR_F32);

/// The first weight of m (its LoRA adapter's too) holding a NaN or an infinity, as "'NAME' (NaN at element I)"; "" when
/// every f32 / bf16 / f16 weight is finite (a block-quantized frozen base is not read). Read in 16 MiB pieces: a
/// diagnosis for a run whose steps are all non-finite (a damaged input model, not a learning rate), not a per-step check.
std::string non_finite_weight(const Qwen2Model & m);

/// With --trainable lora: a fingerprint (hex) of the frozen base, stored in the state file and
/// compared at --resume, so that an adapter does not continue on another base (another file, another
/// quantization of the same model, another random --preset / block --base-type). For -m: the tensor
/// table (names, GGUF types, shapes) and sampled bytes of each tensor; "" when -m cannot be read.
std::string lora_base_fingerprint(const Options & o);

/// One trainer per output folder: takes an exclusive lock on OUT/.lock (writing the pid into it),
/// held until the process exits. Fails (exit 1) naming the other process when it is taken.
void lock_output_folder(const std::string & out);
/// Removes the temporary files of saves ("<name>.tmp.<pid>" of our output files) that a killed
/// process, no longer running, left in `out`.
void remove_stale_temp_files(const std::string & out);

/// Writes the checkpoint of the run (see the top of this file). false + *err on error; the
/// previous checkpoint is then intact. A weight that is NaN or infinite, or that --out-type cannot
/// hold (beyond F16's range, a Q8_0 block scale beyond f16), is such an error, naming the tensor and
/// the type (qwen2_tensor_read_as, the one conversion of the weights for saving).
bool save_checkpoint(const Options & o, const Qwen2Model & m, const std::string & vocab_src, oomb_optimizer_t opt, const Sampler & s,
                     uint64_t data_hash, const TrainProgress & p, std::string * err);

/// --resume: checks OUT/state.safetensors against the loaded checkpoint model m (weights hash;
/// completes a save interrupted between its renames), the data (hash, sequence count) and the
/// options that must not change (--ctx, --seqs-per-step, --seed, --trainable, --opt-state; notes
/// the others that changed); loads the AdamW moments and step count into opt, the data position
/// into *sampler and the progress into *p; truncates OUT/train.jsonl to the checkpoint's step and
/// refills *history from it. Fails (exit 1) with a message naming the mismatch.
void resume_checkpoint(const Options & o, const Qwen2Model & m, oomb_optimizer_t opt, uint64_t data_hash, int64_t n_seqs, int threads,
                       Sampler * sampler, TrainProgress * p, std::vector<LogEntry> * history);

} // namespace train
} // namespace oomb
