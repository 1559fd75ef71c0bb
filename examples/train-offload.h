// Host offload settings of oomb-train and oomb-eval (--offload, --gpu-kv-budget, --offload-block)
// and the memory plan printed before any work: what the run holds on the device and on the host,
// checked against what the device and the machine have, so that a run that cannot fit stops at
// once with the figure and the setting to change, never with an allocation failure minutes in.
#pragma once

#include "oomb-chunk.h"
#include "qwen2.h"

#include <CLI/CLI.hpp>

#include <string>

namespace oomb {
namespace train {

struct OffloadOptions {
    std::string mode = "auto";     // auto: stream only what does not fit; on: stream past the budget (0 without one); off: all on the device
    double gpu_kv_budget = -1;     // GiB of device memory for KV pages (resident + streaming slots); < 0: what is left
    int block_pages = 0;           // pages per streamed history block; 0: 32,768 tokens' worth (a block is one kernel call: fewer, larger blocks cost less)
};

/// The options on app; training: the help text of oomb-train (KV gradients, optimizer state), else
/// of an evaluation tool (oomb-eval: K/V pages only).
void add_offload_options(CLI::App & app, OffloadOptions & o, bool training = true);
/// Errors (fail): an unknown mode, a negative budget given, block < 1.
void check_offload_options(const char * prog, const CLI::App & app, const OffloadOptions & o);

/// The LM head's logits block (bytes; CUDA's fused linear cross-entropy pass) that the memory plan
/// raises the default `def` to where the device has room: total - need - margin - 1 GiB (kept free
/// for the kernels' uncounted workspaces) added to def, at most 4 def, rounded down to 256 MiB. need:
/// the device bytes the plan holds with the default block (weights, arena, scratch, KV cache, ...).
/// 0: keep the default (no whole 256 MiB step beyond it). room (optional): that room, in bytes (< 0:
/// none). bench/NOTES.md "Session 26".
size_t lm_head_block_cap(double total, double need, double margin, double def, double * room = nullptr);

/// Decides the KV cache's tiers (tp->resident_pages, tp->stream_block_pages) from the options, the
/// model's KV shape and the device's free memory (after the weights, gradients and optimizer state
/// already allocated on `be`), prints the memory plan and stops (fail) when the run cannot fit:
/// device memory for the arena and the resident KV, or pinned host memory against the machine's.
/// The chunk arena is measured by planning the chunk graphs once (a driver of one chunk, freed).
/// tp: chunk, page, max_tokens, kv_type, with_grad, cache_attn set. optimizer: whether optimizer state
/// is part of what is already allocated (the plan's label; false for --dump-grads).
void plan_memory(const char * prog, const OffloadOptions & oo, oomb_backend_t be, const Qwen2Model & m, ChunkParams * tp,
                 bool optimizer = true);

} // namespace train
} // namespace oomb
