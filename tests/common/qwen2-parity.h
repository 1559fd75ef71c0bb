// Shared by the Qwen2 and Llama parity tests (CPU and CUDA): fixture conversion, HF references, and the
// gradient check of one chunked forward/backward against HF's float64 gradients.
#pragma once

#include "model.h"
#include "safetensors.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace oombtest {

/// A per-test temporary folder.
std::string tmp_dir();
/// The HF folder of a fixture model: tests/fixtures/<model> for "llama-*", else fixtures_dir()/<model>.
std::string model_fixture_dir(const std::string & model);
/// Converts a fixture's HF folder to GGUF with oomb-convert-hf (once per model and type).
std::string converted(const std::string & model, const std::string & outtype = "");
/// HF parameter name -> GGUF tensor name ("" when unknown).
std::string hf_to_gguf(const std::string & hf);
/// ||a - ref|| / ||ref||; infinite when a holds NaN.
double rel_err(const std::vector<float> & a, const std::vector<double> & ref);

/// reference-<case>.safetensors of a fixture model.
struct Reference {
    oomb::SafetensorsFile f;
    int64_t B = 0, T = 0;
    std::vector<int32_t> ids;
    double loss = 0;
    explicit Reference(const std::string & path);
    std::vector<double> get(const std::string & name) const;
};

/// A fixture model loaded on a backend (the CPU with 2 threads when NULL) with every weight trainable.
struct ModelRun {
    std::unique_ptr<oomb::Qwen2Model> model;
    std::vector<oomb_tensor *> params;
    oomb_backend_t backend = nullptr;
    bool owned = false;
    explicit ModelRun(const std::string & gguf, oomb_backend_t b = nullptr, oomb_type wtype = OOMB_TYPE_F32);
    ~ModelRun();
    std::vector<float> grad(const std::string & gguf_name) const;  // accumulated gradient (of the loss sum)
};

struct ParityTolerance {
    double loss = 1e-5;  // relative
    double grad = 1e-4;  // ||g - ref|| / ||ref|| per tensor
};

/// The short reference's forward with one chunk per sequence (page 16): logits and every hidden
/// state to 1e-5 relative, the loss to 1e-5.
void check_forward(const std::string & model_name);

/// One forward/backward over every sequence of the reference through the chunk trainer; checks
/// the loss and every parameter's gradient. Returns the number of targets (to normalise grads).
int64_t check_gradients(ModelRun & run, const std::string & model_name, const std::string & ref_name, int64_t chunk, int page,
                        const ParityTolerance & tol = {}, oomb_type kv_type = OOMB_TYPE_F32, bool cache_attn = false,
                        oomb_type cache_type = OOMB_TYPE_F32, oomb_type gemm_input_type = OOMB_TYPE_COUNT,
                        int64_t resident_pages = -1, int stream_block_pages = 16);

} // namespace oombtest
