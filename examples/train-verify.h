// oomb-train's verification mode: --dump-grads G.safetensors --tokens IDS.safetensors runs one
// forward/backward over input_ids [B, T] (or [T]) with every weight trainable and no update, and
// writes the mean loss and d(mean loss)/d(param) of every weight ("grad.<GGUF name>", f32, PyTorch
// shapes), for comparison with a reference implementation. --dump-logits L.safetensors --tokens
// IDS.safetensors runs the forward only over one sequence input_ids [T] (or [1, T]) and writes the
// logits of its last chunk ("logits", f32 [n, n_vocab] for positions first_position .. T-1, the
// metadata's first_position; with --chunk >= T: all T positions) and the mean loss.
#pragma once

#include "train-options.h"

namespace oomb {
namespace train {

/// Runs the verification of o (-m, --tokens, --dump-grads, --chunk, --page, --attn-cache(-type),
/// --device, --threads, --rope-theta). Returns the exit code; fails (exit 1) with a message on bad
/// input.
int dump_grads(const Options & o);

/// The forward-only verification of o (-m, --tokens, --dump-logits, --chunk, --page, --device,
/// --threads, --rope-theta): the last chunk's logits (see the top of this file). Returns the exit
/// code; fails (exit 1) with a message on bad input (e.g. B > 1).
int dump_logits(const Options & o);

} // namespace train
} // namespace oomb
