// Llama on ggml-oomb: the decoder of qwen2.cpp with the Llama layout (see llama.h).
#include "llama.h"

namespace oomb {

std::unique_ptr<LlamaModel> llama_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                            bool keep_quantized) {
    return decoder_load_gguf(path, DecoderArch::Llama, backend, wtype, err, keep_quantized);
}

std::unique_ptr<LlamaModel> llama_create(const LlamaConfig & cfg, oomb_backend_t backend, oomb_type wtype) {
    if (cfg.arch != DecoderArch::Llama) oomb_error("llama_create: the configuration's arch is not llama");
    return qwen2_create(cfg, backend, wtype);
}

bool llama_save_gguf(const LlamaModel & m, const std::string & path, const std::string & vocab_gguf, gguf_tensor_type out_type,
                     const std::string & name, std::string * err) {
    if (m.cfg.arch != DecoderArch::Llama) {
        if (err) *err = "llama_save_gguf: the model is not a Llama model";
        return false;
    }
    return qwen2_save_gguf(m, path, vocab_gguf, out_type, name, err);
}

std::unique_ptr<ChunkGraphBuilder> llama_chunk_builder(const LlamaModel & m) { return qwen2_chunk_builder(m); }

} // namespace oomb
