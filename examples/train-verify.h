// oomb-train's verification mode: --dump-grads G.safetensors --tokens IDS.safetensors runs one
// forward/backward over input_ids [B, T] (or [T]) with every weight trainable and no update, and
// writes the mean loss and d(mean loss)/d(param) of every weight ("grad.<GGUF name>", f32, PyTorch
// shapes), for comparison with a reference implementation.
#pragma once

#include "train-options.h"

namespace oomb {
namespace train {

/// Runs the verification of o (-m, --tokens, --dump-grads, --chunk, --page, --attn-cache(-type),
/// --device, --threads, --rope-theta). Returns the exit code; fails (exit 1) with a message on bad
/// input.
int dump_grads(const Options & o);

} // namespace train
} // namespace oomb
