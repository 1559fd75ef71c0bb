// The Llama GGUF layout: presets, config reading, the attn_q / attn_k row order (see llama-layout.h).
#include "llama-layout.h"

#include <cstring>
#include <vector>

namespace oomb {

bool llama_preset(const std::string & name, LlamaConfig * cfg) {
    if (name != "smollm2-135m") return false;
    LlamaConfig c;  // HuggingFaceTB/SmolLM2-135M config.json
    c.arch = DecoderArch::Llama;
    c.n_vocab = 49152; c.n_embd = 576; c.n_ff = 1536; c.n_layer = 30; c.n_head = 9; c.n_head_kv = 3; c.head_dim = 64;
    c.n_ctx_train = 8192; c.rope_theta = 1e5f; c.rms_eps = 1e-5f; c.tied = true;
    *cfg = c;
    return true;
}

gguf_status llama_read_config(const GGUFReader & r, LlamaConfig * cfg, std::string * err) {
    return decoder_read_config(r, DecoderArch::Llama, cfg, err);
}

namespace {

// Row h * D + j * D/2 + i of HF's order is row h * D + 2 i + j of the file's (j in {0, 1}).
void reorder(void * rows, int64_t n_head, int64_t D, size_t row_bytes, bool to_file) {
    uint8_t * p = (uint8_t *) rows;
    std::vector<uint8_t> head((size_t) D * row_bytes);
    for (int64_t h = 0; h < n_head; h++) {
        uint8_t * base = p + (size_t) (h * D) * row_bytes;
        memcpy(head.data(), base, head.size());
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < D / 2; i++) {
                const int64_t hf = j * (D / 2) + i, file = 2 * i + j;
                const int64_t dst = to_file ? file : hf, src = to_file ? hf : file;
                memcpy(base + (size_t) dst * row_bytes, head.data() + (size_t) src * row_bytes, row_bytes);
            }
    }
}

} // namespace

void llama_permute_qk_rows(void * rows, int64_t n_head, int64_t head_dim, size_t row_bytes) {
    reorder(rows, n_head, head_dim, row_bytes, true);
}

void llama_unpermute_qk_rows(void * rows, int64_t n_head, int64_t head_dim, size_t row_bytes) {
    reorder(rows, n_head, head_dim, row_bytes, false);
}

int64_t llama_qk_heads(const LlamaConfig & c, Qwen2Slot slot) {
    if (c.arch != DecoderArch::Llama) return 0;
    return slot == Qwen2Slot::Wq ? c.n_head : slot == Qwen2Slot::Wk ? c.n_head_kv : 0;
}

} // namespace oomb
