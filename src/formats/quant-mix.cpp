// The tensor types of a quantized GGUF file: llama.cpp's Q4_K_M mix rule and its row-length
// fallbacks, one truth for oomb-export (writing files) and oomb-train's random quantized presets
// (models made in memory, --preset NAME --base-type q4_k_m). See gguf_plan_weight_types (gguf.h).
#include "gguf.h"

namespace oomb {

namespace {

bool ends_with(const std::string& s, const std::string& t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// A block type that fits rows of ne0 elements: `want`, else llama.cpp's fallback, else F16.
uint32_t fit_row(uint32_t want, int64_t ne0) {
    if (ne0 % gguf_tensor_type_block_size(want) == 0) return want;
    uint32_t fb = want == GGUF_TENSOR_Q4_K ? GGUF_TENSOR_Q5_0 : GGUF_TENSOR_Q8_0;
    if (want == GGUF_TENSOR_Q8_0 || want == GGUF_TENSOR_Q5_0) fb = GGUF_TENSOR_F16;
    return ne0 % gguf_tensor_type_block_size(fb) == 0 ? fb : GGUF_TENSOR_F16;
}

} // namespace

bool gguf_use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

std::vector<uint32_t> gguf_plan_weight_types(const std::vector<GGUFTensorInfo>& ts, uint32_t type, bool q4_k_m_mix) {
    bool has_output = false;
    int64_t n_attn_v = 0, n_ffn_down = 0, i_attn_v = 0, i_ffn_down = 0;
    for (const GGUFTensorInfo& t : ts) {
        has_output |= t.name == "output.weight";
        n_attn_v += t.name.find("attn_v.weight") != std::string::npos;
        n_ffn_down += t.name.find("ffn_down") != std::string::npos;
    }
    std::vector<uint32_t> out;
    out.reserve(ts.size());
    for (const GGUFTensorInfo& t : ts) {
        const bool weight = t.n_dims >= 2 && ends_with(t.name, "weight") && !ends_with(t.name, "_norm.weight");
        if (!weight) { out.push_back(GGUF_TENSOR_F32); continue; }
        uint32_t want = type;
        if (q4_k_m_mix) {
            if (t.name == "output.weight" || (!has_output && t.name == "token_embd.weight")) {
                want = t.ne[0] % 256 == 0 ? GGUF_TENSOR_Q6_K : GGUF_TENSOR_Q8_0;
            } else if (t.name.find("attn_qkv.weight") != std::string::npos) {
                want = GGUF_TENSOR_Q5_K;
            } else if (t.name.find("attn_v.weight") != std::string::npos) {
                if (gguf_use_more_bits(i_attn_v, n_attn_v)) want = GGUF_TENSOR_Q6_K;
                i_attn_v++;
            } else if (t.name.find("ffn_down") != std::string::npos) {
                if (gguf_use_more_bits(i_ffn_down, n_ffn_down)) want = GGUF_TENSOR_Q6_K;
                i_ffn_down++;
            }
        }
        out.push_back(gguf_tensor_type_block_size(want) == 1 ? want : fit_row(want, t.ne[0]));
    }
    return out;
}

} // namespace oomb
