// The architecture dispatch of a GGUF file (see model.h).
#include "model.h"

#include "gguf.h"

namespace oomb {

std::string model_arch_choices() { return std::string(QWEN2_ARCH) + ", " + LLAMA_ARCH; }

bool model_gguf_arch(const std::string & path, std::string * arch, std::string * err) {
    GGUFReader r;
    if (r.open(path, err) != GGUF_OK) return false;
    return r.get_string("general.architecture", arch, err) == GGUF_OK;
}

std::unique_ptr<Qwen2Model> model_load_gguf(const std::string & path, oomb_backend_t backend, oomb_type wtype, std::string * err,
                                            bool keep_quantized) {
    std::string name;
    if (!model_gguf_arch(path, &name, err)) return nullptr;
    DecoderArch arch;
    if (!decoder_arch_from_name(name, &arch)) {
        if (err) *err = path + ": general.architecture is '" + name + "': supported are " + model_arch_choices();
        return nullptr;
    }
    return arch == DecoderArch::Llama ? llama_load_gguf(path, backend, wtype, err, keep_quantized)
                                      : qwen2_load_gguf(path, backend, wtype, err, keep_quantized);
}

std::unique_ptr<ChunkGraphBuilder> model_chunk_builder(const Qwen2Model & m) {
    return m.cfg.arch == DecoderArch::Llama ? llama_chunk_builder(m) : qwen2_chunk_builder(m);
}

bool model_save_gguf(const Qwen2Model & m, const std::string & path, const std::string & vocab_gguf, gguf_tensor_type out_type,
                     const std::string & name, std::string * err) {
    return m.cfg.arch == DecoderArch::Llama ? llama_save_gguf(m, path, vocab_gguf, out_type, name, err)
                                            : qwen2_save_gguf(m, path, vocab_gguf, out_type, name, err);
}

} // namespace oomb
