// models/rope-scaling.h: the llama3 frequency factors against HF transformers' own computation
// (modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"] on a LlamaConfig built from the same config.json
// text, transformers 4 and 5 styles): theta^(-2i/n_dims) / factor_i must equal HF's inv_freq (f32) to
// f32 accuracy. Skipped (with the reason) when python3 with transformers and torch is not installed.
// Also the config reader's and the formula's errors.
#include "rope-scaling.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace oomb;

namespace {

// Runs HF on every config (JSON text) and returns, per config, HF's inv_freq; empty + *why on failure.
std::vector<std::vector<double>> hf_inv_freqs(const std::vector<std::string> & configs, std::string * why) {
    char tmpl[] = "/tmp/oomb-test-rope-scaling-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) { *why = "mkstemp failed"; return {}; }
    close(fd);
    const std::string in = std::string(tmpl), script = in + ".py";
    {
        nlohmann::json j = nlohmann::json::array();
        for (auto & c : configs) j.push_back(nlohmann::json::parse(c));
        std::ofstream(in) << j.dump();
        std::ofstream(script) << R"PY(
import json, sys
try:
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
except Exception as e:
    print("SKIP", e); sys.exit(0)
out = []
for c in json.load(open(sys.argv[1])):
    cfg = LlamaConfig(**c)
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    out.append([float(x) for x in inv.tolist()])
print("OK", json.dumps(out))
)PY";
    }
    const std::string cmd = "python3 " + script + " " + in + " 2>/dev/null";
    FILE * p = popen(cmd.c_str(), "r");
    std::string text;
    if (p) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
        const int rc = pclose(p);
        if (rc != 0) text = "python3 exited with status " + std::to_string(rc) + ": " + text;
    }
    std::remove(in.c_str());
    std::remove(script.c_str());
    if (text.rfind("OK ", 0) != 0) { *why = text.empty() ? "python3 not runnable" : text; return {}; }
    return nlohmann::json::parse(text.substr(3)).get<std::vector<std::vector<double>>>();
}

double json_num(const nlohmann::json & j, const char * k, double dflt) { return j.contains(k) ? j[k].get<double>() : dflt; }

} // namespace

TEST(RopeScaling, Llama3FactorsMatchTransformers) {
    // Llama 3.1 8B and 3.2 1B (transformers 4 style: rope_scaling + top-level rope_theta), a 5-style
    // config, and small odd ones with many medium frequencies (wavelengths between the bounds).
    const std::vector<std::string> configs = {
        R"({"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}})",
        R"({"hidden_size": 2048, "num_attention_heads": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}})",
        R"({"hidden_size": 96, "num_attention_heads": 4, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 8.0, "original_max_position_embeddings": 256}})",
        R"({"hidden_size": 120, "num_attention_heads": 3, "head_dim": 40, "max_position_embeddings": 8192, "rope_theta": 1000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 2.0, "high_freq_factor": 32.0,
                             "original_max_position_embeddings": 1000}})",
    };
    std::string why;
    const auto hf = hf_inv_freqs(configs, &why);
    if (hf.empty()) GTEST_SKIP() << "HF transformers not usable here: " << why;
    ASSERT_EQ(hf.size(), configs.size());
    for (size_t c = 0; c < configs.size(); c++) {
        const nlohmann::json j = nlohmann::json::parse(configs[c]);
        Llama3RopeScaling s;
        bool found = false;
        std::string err;
        ASSERT_TRUE(hf_llama3_rope_scaling(configs[c], &s, &found, &err)) << err;
        ASSERT_TRUE(found) << c;
        const int n_dims = j.contains("head_dim") ? j["head_dim"].get<int>() : j["hidden_size"].get<int>() / j["num_attention_heads"].get<int>();
        const double theta = j.contains("rope_parameters") ? json_num(j["rope_parameters"], "rope_theta", 10000.0) : json_num(j, "rope_theta", 10000.0);
        std::vector<float> f;
        ASSERT_TRUE(llama3_rope_freq_factors(s, n_dims, theta, &f, &err)) << err;
        ASSERT_EQ(f.size(), hf[c].size()) << c;
        int n_one = 0, n_full = 0, n_mid = 0;
        for (size_t i = 0; i < f.size(); i++) {
            const double ours = std::pow(theta, -2.0 * (double) i / n_dims) / (double) f[i];
            EXPECT_NEAR(ours / hf[c][i], 1.0, 2e-6) << "config " << c << " pair " << i << " factor " << f[i];
            n_one += f[i] == 1.0f;
            n_full += f[i] == (float) s.factor;
            n_mid += f[i] != 1.0f && f[i] != (float) s.factor;
        }
        // every config exercises all three branches of the formula
        EXPECT_GT(n_one, 0) << c;
        EXPECT_GT(n_full, 0) << c;
        EXPECT_GT(n_mid, 0) << c;
    }
}

TEST(RopeScaling, ConfigReaderAndErrors) {
    Llama3RopeScaling s;
    bool found = true;
    std::string err;
    EXPECT_TRUE(hf_llama3_rope_scaling(R"({"rope_theta": 10000.0})", &s, &found, &err));
    EXPECT_FALSE(found);
    EXPECT_TRUE(hf_llama3_rope_scaling(R"({"rope_scaling": null})", &s, &found, &err));
    EXPECT_FALSE(found);
    EXPECT_TRUE(hf_llama3_rope_scaling(R"({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})", &s, &found, &err));
    EXPECT_FALSE(found);
    EXPECT_FALSE(hf_llama3_rope_scaling("[1, 2]", &s, &found, &err));
    EXPECT_NE(err.find("not a JSON object"), std::string::npos) << err;
    EXPECT_FALSE(hf_llama3_rope_scaling(R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})", &s, &found, &err));
    EXPECT_NE(err.find("rope_type 'yarn' is not supported"), std::string::npos) << err;
    EXPECT_FALSE(hf_llama3_rope_scaling(R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0}})", &s, &found, &err));
    EXPECT_NE(err.find("rope_scaling.original_max_position_embeddings must be given"), std::string::npos) << err;
    std::vector<float> f;
    Llama3RopeScaling bad;
    bad.high_freq_factor = bad.low_freq_factor;
    EXPECT_FALSE(llama3_rope_freq_factors(bad, 64, 5e5, &f, &err));
    EXPECT_NE(err.find("low_freq_factor < high_freq_factor"), std::string::npos) << err;
    EXPECT_FALSE(llama3_rope_freq_factors(Llama3RopeScaling{}, 63, 5e5, &f, &err));
    EXPECT_NE(err.find("n_dims = 63"), std::string::npos) << err;
    EXPECT_FALSE(llama3_rope_freq_factors(Llama3RopeScaling{}, 64, 0.0, &f, &err));
    EXPECT_NE(err.find("rope_theta"), std::string::npos) << err;
}
