// RoPE frequency factors from an HF checkpoint's rope scaling, for the GGUF tensor rope_freqs.weight
// (f32 [n_dims/2]) that llama.cpp writes for Llama 3.x and that oomb_rope_ext divides each
// frequency by. One place for the formula, used by the converter (gguf-tools) and the tests.
//
// rope_type "llama3" (HF transformers' _compute_llama3_parameters, modeling_rope_utils.py; llama.cpp's
// convert_hf_to_gguf.py LlamaModel.generate_extra_tensors computes the same factors): with
// inv_freq_i = theta^(-2i/n_dims), wavelen_i = 2 pi / inv_freq_i, L = original_max_position_embeddings,
// high = L / high_freq_factor, low = L / low_freq_factor:
//   factor_i = 1                                  if wavelen_i < high   (high frequencies: unchanged)
//            = factor                             if wavelen_i > low    (low frequencies: / factor)
//            = 1 / ((1 - s) / factor + s)         otherwise, s = (L / wavelen_i - low_freq_factor) /
//                                                 (high_freq_factor - low_freq_factor)
// so that inv_freq_i / factor_i is HF's inv_freq_llama (HF: (1 - s) inv_freq / factor + s inv_freq).
// L is read from rope_scaling as HF reads it (llama.cpp's converter reads the top-level
// original_max_position_embeddings, default 8192; Llama 3.1 / 3.2 configs give 8192 in both forms).
#pragma once

#include <string>
#include <vector>

namespace oomb {

/// HF rope scaling of rope_type "llama3" (Llama 3.1+). Defaults: the values of Llama 3.1.
struct Llama3RopeScaling {
    double factor = 8.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    double original_max_position_embeddings = 8192.0;  // L, in tokens
};

/// The frequency factors (formula above) for rotation width n_dims (even, > 0: the head dimension)
/// and base theta (> 0), in double, rounded to f32 into *out (n_dims/2 values, all >= 1 when
/// factor >= 1). Returns false with *err naming the bad value: n_dims odd or <= 0, theta <= 0,
/// factor <= 0, L <= 0, low_freq_factor <= 0 or high_freq_factor <= low_freq_factor.
bool llama3_rope_freq_factors(const Llama3RopeScaling & s, int n_dims, double theta, std::vector<float> * out, std::string * err);

/// Reads the rope scaling of an HF config.json (its text): "rope_parameters" (transformers 5) or
/// "rope_scaling" (transformers 4; its type under "rope_type" or "type"). *found = true and *s set
/// when the type is "llama3" (factor, low_freq_factor, high_freq_factor and
/// original_max_position_embeddings must all be given there, as HF requires); *found = false when
/// there is no scaling or its type is "default". Returns false with *err for text that is not a
/// JSON object, a rope type other than default / llama3 (named: no factors for it here), or a
/// missing or non-numeric field (named).
bool hf_llama3_rope_scaling(const std::string & config_json, Llama3RopeScaling * s, bool * found, std::string * err);

} // namespace oomb
