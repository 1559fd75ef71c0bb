// The one place that picks a model's architecture from a GGUF file (general.architecture): the
// tools (oomb-train, oomb-eval, --dump-grads) load through model_load_gguf and then see only the
// architecture-free parts: the weights (params, trainable set, save) and a ChunkGraphBuilder.
// A new architecture adds a case here and its builder; the trainer loop does not change.
#pragma once

#include "llama.h"
#include "qwen2.h"

#include <memory>
#include <string>

namespace oomb {

/// The architectures a GGUF can name: "qwen2, llama".
std::string model_arch_choices();

/// general.architecture of a GGUF file; false + *err (missing file, no key) when it cannot be read.
bool model_gguf_arch(const std::string & path, std::string * arch, std::string * err);

/// Loads a GGUF of any supported architecture (qwen2_load_gguf / llama_load_gguf by
/// general.architecture). Another architecture: nullptr and "<path>: general.architecture is 'X':
/// supported are qwen2, llama" in *err; other errors as the loaders'. keep_quantized: the layers'
/// projections stored in a block type stay in it (a frozen base: decoder_load_gguf).
std::unique_ptr<Qwen2Model> model_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                            bool keep_quantized = false);

/// The chunk graph of a loaded model, by its cfg.arch. The model must outlive the builder.
std::unique_ptr<ChunkGraphBuilder> model_chunk_builder(const Qwen2Model & m);

/// Saves a model in its own architecture's layout (qwen2_save_gguf / llama_save_gguf).
bool model_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & vocab_gguf, gguf_tensor_type out_type,
                     const std::string & name, std::string * err);

} // namespace oomb
