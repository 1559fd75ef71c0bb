// RoPE frequency factors from HF rope scaling (see rope-scaling.h for the formula and its sources).

#include "rope-scaling.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace oomb {

bool llama3_rope_freq_factors(const Llama3RopeScaling & s, int n_dims, double theta, std::vector<float> * out, std::string * err) {
    auto fail = [err](const std::string & m) {
        if (err) *err = "llama3 rope scaling: " + m;
        return false;
    };
    if (n_dims <= 0 || n_dims % 2 != 0) return fail("n_dims = " + std::to_string(n_dims) + " must be even and positive");
    if (!(theta > 0.0 && std::isfinite(theta))) return fail("rope_theta = " + std::to_string(theta) + " must be positive");
    if (!(s.factor > 0.0 && std::isfinite(s.factor))) return fail("factor = " + std::to_string(s.factor) + " must be positive");
    if (!(s.original_max_position_embeddings > 0.0))
        return fail("original_max_position_embeddings = " + std::to_string(s.original_max_position_embeddings) + " must be positive");
    if (!(s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor)))
        return fail("need 0 < low_freq_factor < high_freq_factor, got " + std::to_string(s.low_freq_factor) + " and " +
                    std::to_string(s.high_freq_factor));
    const double L = s.original_max_position_embeddings;
    const double low_wavelen = L / s.low_freq_factor, high_wavelen = L / s.high_freq_factor;
    const double pi = 3.14159265358979323846;
    out->assign((size_t) (n_dims / 2), 1.0f);
    for (int i = 0; i < n_dims / 2; i++) {
        const double inv_freq = std::pow(theta, -2.0 * (double) i / (double) n_dims);
        const double wavelen = 2.0 * pi / inv_freq;
        double f = 1.0;
        if (wavelen < high_wavelen) {
            f = 1.0;
        } else if (wavelen > low_wavelen) {
            f = s.factor;
        } else {
            const double sm = (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            f = 1.0 / ((1.0 - sm) / s.factor + sm);
        }
        (*out)[(size_t) i] = (float) f;
    }
    return true;
}

bool hf_llama3_rope_scaling(const std::string & config_json, Llama3RopeScaling * s, bool * found, std::string * err) {
    *found = false;
    auto fail = [err](const std::string & m) {
        if (err) *err = "config.json: " + m;
        return false;
    };
    const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
    const char * key = nullptr;
    for (const char * k : {"rope_parameters", "rope_scaling"}) {
        if (j.contains(k) && !j[k].is_null()) { key = k; break; }
    }
    if (!key) return true;
    const nlohmann::json & r = j[key];
    if (!r.is_object()) return fail(std::string(key) + " must be an object");
    std::string type = "default";
    for (const char * k : {"rope_type", "type"}) {
        if (r.contains(k)) {
            if (!r[k].is_string()) return fail(std::string(key) + "." + k + " must be a string");
            type = r[k].get<std::string>();
            break;
        }
    }
    if (type == "default") return true;
    if (type != "llama3")
        return fail(std::string(key) + ": rope_type '" + type + "' is not supported (only default and llama3)");
    struct { const char * name; double * v; } fields[] = {{"factor", &s->factor},
                                                            {"low_freq_factor", &s->low_freq_factor},
                                                            {"high_freq_factor", &s->high_freq_factor},
                                                            {"original_max_position_embeddings", &s->original_max_position_embeddings}};
    for (auto & f : fields) {
        if (!r.contains(f.name) || !r[f.name].is_number())
            return fail(std::string(key) + "." + f.name + " must be given as a number for rope_type llama3");
        *f.v = r[f.name].get<double>();
    }
    *found = true;
    return true;
}

} // namespace oomb
