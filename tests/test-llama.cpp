// Llama parity with HF transformers' LlamaForCausalLM (float64 references made by
// tests/fixtures/make-llama-fixtures.py) through the OOMB chunk driver on the CPU: logits, hidden
// states, loss and every gradient, with chunks that do and do not divide the sequence and the page;
// the attn_q / attn_k row order (llama.cpp's permutation) on convert, load and save; the
// architecture dispatch; and the Llama layout's refusals (rope_freqs, biases, scaled RoPE).
#include "test-common.h"
#include "qwen2-parity.h"

#include "gguf.h"
#include "llama.h"
#include "model.h"
#include "safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <string>

using namespace oomb;

namespace {

using namespace oombtest;

void check_cpu(const std::string & model, int64_t chunk, int page) {
    ModelRun run(converted(model));
    EXPECT_EQ(run.model->cfg.arch, DecoderArch::Llama);
    check_gradients(run, model, "short", chunk, page);
}

TEST(LlamaParity, ShortForwardLogitsHidden) {
    for (const std::string model_name : {"llama-micro", "llama-mini"}) check_forward(model_name);
}
TEST(LlamaParity, MicroTiedGradients) { check_cpu("llama-micro", 64, 16); }
TEST(LlamaParity, MicroTiedGradientsChunked) { check_cpu("llama-micro", 24, 16); }  // 64 = 24 + 24 + 16
TEST(LlamaParity, MiniUntiedGradients) { check_cpu("llama-mini", 64, 16); }
TEST(LlamaParity, MiniUntiedGradientsTinyChunks) { check_cpu("llama-mini", 7, 4); }  // chunk not a multiple of the page
TEST(LlamaParity, MiniUntiedGradientsChunkNotPageMultiple) { check_cpu("llama-mini", 20, 8); }

// The permutation is llama.cpp's: file row h*D + 2i + j holds HF row h*D + j*D/2 + i, and
// unpermute inverts it (on rows of any byte size).
TEST(LlamaLayout, QkRowPermutation) {
    const int64_t H = 3, D = 6, row = 5;
    std::vector<int32_t> hf((size_t) (H * D * row));
    std::iota(hf.begin(), hf.end(), 0);
    std::vector<int32_t> file = hf;
    llama_permute_qk_rows(file.data(), H, D, row * 4);
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < D / 2; i++)
                for (int64_t c = 0; c < row; c++)
                    ASSERT_EQ(file[(size_t) ((h * D + 2 * i + j) * row + c)], hf[(size_t) ((h * D + j * (D / 2) + i) * row + c)]);
    llama_unpermute_qk_rows(file.data(), H, D, row * 4);
    EXPECT_EQ(file, hf);
}

// The converter writes the permuted rows; the loader un-permutes them (HF's q_proj in memory), and
// saving writes the file's order again, bit for bit.
TEST(LlamaLayout, ConvertLoadSaveRowOrder) {
    const std::string g = converted("llama-mini");
    SafetensorsModel st;
    std::string err;
    ASSERT_EQ(st.open(model_fixture_dir("llama-mini"), &err), GGUF_OK) << err;
    const SafetensorsTensor * q = nullptr;
    for (const SafetensorsTensor * t : st.tensors())
        if (t->name == "model.layers.1.self_attn.k_proj.weight") q = t;
    ASSERT_NE(q, nullptr);
    std::vector<float> hf;
    ASSERT_EQ(safetensors_read_f32(*q, &hf, &err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(g, &err), GGUF_OK) << err;
    std::vector<float> file;
    ASSERT_EQ(r.read_tensor_f32("blk.1.attn_k.weight", &file, &err), GGUF_OK) << err;
    std::vector<float> want = hf;
    llama_permute_qk_rows(want.data(), 3, 6, 54 * 4);  // llama-mini: 3 KV heads of 6, 54 inputs
    EXPECT_EQ(file, want);
    EXPECT_NE(file, hf);

    ModelRun run(g);
    std::vector<float> mem((size_t) oomb_nelements(run.model->find("blk.1.attn_k.weight")));
    oomb_tensor_get_f32(run.model->find("blk.1.attn_k.weight"), mem.data(), (int64_t) mem.size());
    EXPECT_EQ(mem, hf);

    const std::string out = tmp_dir() + "/llama-mini-saved.gguf";
    ASSERT_TRUE(model_save_gguf(*run.model, out, "", OOMB_TYPE_F32, "llama-mini", &err)) << err;
    GGUFReader r2;
    ASSERT_EQ(r2.open(out, &err), GGUF_OK) << err;
    std::string arch;
    ASSERT_EQ(r2.get_string("general.architecture", &arch, &err), GGUF_OK);
    EXPECT_EQ(arch, "llama");
    std::vector<float> saved;
    ASSERT_EQ(r2.read_tensor_f32("blk.1.attn_k.weight", &saved, &err), GGUF_OK) << err;
    EXPECT_EQ(saved, want);
    // and it loads back to the same gradients
    ModelRun again(out);
    check_gradients(again, "llama-mini", "short", 24, 16);
}

// Writes a copy of a converted fixture with one change: extra tensors and keys.
std::string variant(const std::string & src, const std::string & name, const std::function<void(GGUFWriter &, const GGUFReader &)> & edit,
                    const std::vector<std::pair<std::string, std::vector<int64_t>>> & extra = {}) {
    GGUFReader r;
    std::string err;
    EXPECT_EQ(r.open(src, &err), GGUF_OK) << err;
    GGUFWriter w;
    for (const auto & kv : r.metadata()) w.set(kv.first, kv.second);
    edit(w, r);
    for (const GGUFTensorInfo & t : r.tensors())
        EXPECT_EQ(w.add_tensor(t.name, GGUF_TENSOR_F32, std::vector<int64_t>(t.ne, t.ne + t.n_dims), &err), GGUF_OK) << err;
    for (const auto & e : extra) EXPECT_EQ(w.add_tensor(e.first, GGUF_TENSOR_F32, e.second, &err), GGUF_OK) << err;
    const std::string out = tmp_dir() + "/" + name + ".gguf";
    EXPECT_EQ(w.open(out, &err), GGUF_OK) << err;
    for (const GGUFTensorInfo & t : r.tensors()) {
        std::vector<float> v;
        EXPECT_EQ(r.read_tensor_f32(t.name, &v, &err), GGUF_OK) << err;
        EXPECT_EQ(w.write_tensor(t.name, v.data(), v.size() * 4, &err), GGUF_OK) << err;
    }
    for (const auto & e : extra) {
        std::vector<float> v((size_t) std::accumulate(e.second.begin(), e.second.end(), (int64_t) 1, std::multiplies<int64_t>()), 1.0f);
        EXPECT_EQ(w.write_tensor(e.first, v.data(), v.size() * 4, &err), GGUF_OK) << err;
    }
    EXPECT_EQ(w.finish(&err), GGUF_OK) << err;
    return out;
}

// The error of loading path through the dispatch (which must fail).
std::string load_error(const std::string & path, bool qwen2_only = false) {
    std::string err;
    oomb_backend_t be = oomb_backend_cpu_init(1);
    {
        auto m = qwen2_only ? qwen2_load_gguf(path, be, OOMB_TYPE_F32, &err) : model_load_gguf(path, be, OOMB_TYPE_F32, &err);
        EXPECT_EQ(m, nullptr) << path << " loaded";
    }
    oomb_backend_free(be);
    return err;
}

TEST(LlamaErrors, RefusedByName) {
    const std::string g = converted("llama-micro");  // head dim 10
    auto none = [](GGUFWriter &, const GGUFReader &) {};
    EXPECT_NE(load_error(variant(g, "rope-freqs", none, {{"rope_freqs.weight", {5}}})).find("rope_freqs.weight"), std::string::npos);
    EXPECT_NE(load_error(variant(g, "rope-freqs", none, {{"rope_freqs.weight", {5}}})).find("RoPE frequency factors"), std::string::npos);
    EXPECT_NE(load_error(variant(g, "bias", none, {{"blk.0.attn_q.bias", {60}}})).find("blk.0.attn_q.bias"), std::string::npos);
    auto scaled = [](GGUFWriter & w, const GGUFReader &) { w.set_string("llama.rope.scaling.type", "linear"); };
    EXPECT_NE(load_error(variant(g, "scaled", scaled)).find("llama.rope.scaling.type"), std::string::npos);
    auto partial = [](GGUFWriter & w, const GGUFReader &) { w.set_u32("llama.rope.dimension_count", 8); };
    EXPECT_NE(load_error(variant(g, "partial", partial)).find("llama.rope.dimension_count"), std::string::npos);
    auto vocab = [](GGUFWriter & w, const GGUFReader &) { w.set_u32("llama.vocab_size", 511); };
    EXPECT_NE(load_error(variant(g, "vocab", vocab)).find("llama.vocab_size"), std::string::npos);
    auto other = [](GGUFWriter & w, const GGUFReader &) { w.set_string("general.architecture", "gemma2"); };
    const std::string e = load_error(variant(g, "gemma2", other));
    EXPECT_NE(e.find("'gemma2'"), std::string::npos) << e;
    EXPECT_NE(e.find("qwen2, llama"), std::string::npos) << e;
    // the architecture-specific loaders refuse each other's files
    const std::string q = load_error(g, true);
    EXPECT_NE(q.find("expected 'qwen2'"), std::string::npos) << q;
}

} // namespace
