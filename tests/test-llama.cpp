// Llama parity with HF transformers' LlamaForCausalLM (float64 references made by
// tests/fixtures/make-llama-fixtures.py) through the OOMB chunk driver on the CPU: logits, hidden
// states, loss and every gradient, with chunks that do and do not divide the sequence and the page;
// the attn_q / attn_k row order (llama.cpp's permutation) on convert, load and save; the
// architecture dispatch; rope_freqs.weight (Llama 3.x RoPE frequency factors: load, save, checks); and
// the Llama layout's refusals (biases, scaled RoPE keys, partial RoPE).
#include "test-common.h"
#include "qwen2-parity.h"

#include "gguf.h"
#include "llama.h"
#include "model.h"
#include "safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>

using namespace oomb;

namespace {

using namespace oombtest;

void check_cpu(const std::string & model, int64_t chunk, int page) {
    ModelRun run(converted(model));
    EXPECT_EQ(run.model->cfg.arch, DecoderArch::Llama);
    check_gradients(run, model, "short", chunk, page);
}

TEST(LlamaParity, ShortForwardLogitsHidden) {
    for (const std::string model_name : {"llama-micro", "llama-mini", "llama-rope3"}) check_forward(model_name);
}
TEST(LlamaParity, MicroTiedGradients) { check_cpu("llama-micro", 64, 16); }
TEST(LlamaParity, MicroTiedGradientsChunked) { check_cpu("llama-micro", 24, 16); }  // 64 = 24 + 24 + 16
TEST(LlamaParity, MiniUntiedGradients) { check_cpu("llama-mini", 64, 16); }
TEST(LlamaParity, MiniUntiedGradientsTinyChunks) { check_cpu("llama-mini", 7, 4); }  // chunk not a multiple of the page
TEST(LlamaParity, MiniUntiedGradientsChunkNotPageMultiple) { check_cpu("llama-mini", 20, 8); }
// Llama 3.x RoPE frequency factors (rope_type llama3, converted to rope_freqs.weight)
TEST(LlamaParity, Rope3Gradients) { check_cpu("llama-rope3", 64, 16); }
TEST(LlamaParity, Rope3GradientsChunked) { check_cpu("llama-rope3", 24, 16); }   // 64 = 24 + 24 + 16
TEST(LlamaParity, Rope3GradientsTinyChunks) { check_cpu("llama-rope3", 7, 4); }  // chunk not a multiple of the page
TEST(LlamaParity, Rope3GradientsChunkNotPageMultiple) { check_cpu("llama-rope3", 20, 8); }

// The converter wrote HF's llama3 factors (one unchanged, one interpolated, the rest / 8: the
// fixture's frequencies fall in all three branches), and without them the loss is not the
// reference's (so the parity tests above test the factors).
TEST(LlamaRopeFreqs, ConvertedFactorsMatter) {
    ModelRun run(converted("llama-rope3"));
    ASSERT_NE(run.model->rope_freqs, nullptr);
    std::vector<float> f(8);
    oomb_tensor_get_f32(run.model->rope_freqs, f.data(), 8);
    EXPECT_EQ(f[0], 1.0f);
    EXPECT_GT(f[1], 1.5f);
    EXPECT_LT(f[1], 7.5f);
    for (int i = 2; i < 8; i++) EXPECT_EQ(f[i], 8.0f) << i;
    Reference ref(model_fixture_dir("llama-rope3") + "/reference-short.safetensors");
    auto loss = [&]() {
        ChunkParams tp;
        tp.chunk = 24;
        tp.page = 16;
        tp.max_tokens = ref.T;
        ChunkDriver tr(model_chunk_builder(*run.model), tp);
        double sum = 0;
        int64_t n = 0;
        for (int64_t b = 0; b < ref.B; b++) {
            const ChunkStats st = tr.forward(ref.ids.data() + b * ref.T, ref.T);
            sum += st.loss_sum;
            n += st.n_targets;
        }
        return sum / (double) n;
    };
    EXPECT_LT(std::fabs(loss() - ref.loss) / ref.loss, 1e-5);
    const std::vector<float> ones(8, 1.0f);
    oomb_tensor_set(run.model->rope_freqs, ones.data(), 0, ones.size() * 4);
    EXPECT_GT(std::fabs(loss() - ref.loss) / ref.loss, 1e-3) << "the frequency factors do not change the loss";
}

// ChunkDriver::set_progress: a report when each stage starts and after each chunk, stage 1 in order,
// stage 2 in reverse (tokens counted from the end), forward() stage 1 only, a one-chunk
// forward_backward() stage 2 only; the hook changes no result.
TEST(ChunkDriverProgress, ReportsEveryChunkOfBothStages) {
    ModelRun run(converted("llama-micro"));
    Reference ref(model_fixture_dir("llama-micro") + "/reference-short.safetensors");
    ASSERT_EQ(ref.T, 64);
    using R = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t>;  // stage, n_stages, chunks done, n_chunks, tokens done, n
    auto reports = [&](int64_t chunk, bool backward, double * loss) {
        ChunkParams tp;
        tp.chunk = chunk;
        tp.page = 16;
        tp.max_tokens = ref.T;
        ChunkDriver tr(model_chunk_builder(*run.model), tp);
        std::vector<R> got;
        tr.set_progress([&](const ChunkProgress & p) {
            got.emplace_back(p.stage, p.n_stages, p.chunks_done, p.n_chunks, p.tokens_done, p.n_tokens);
        });
        const ChunkStats st = backward ? tr.forward_backward(ref.ids.data(), ref.T) : tr.forward(ref.ids.data(), ref.T);
        *loss = st.loss_sum;
        return got;
    };
    double l_fb = 0, l_f = 0, l_one = 0;
    EXPECT_EQ(reports(24, true, &l_fb), (std::vector<R>{{1, 2, 0, 3, 0, 64}, {1, 2, 1, 3, 24, 64}, {1, 2, 2, 3, 48, 64}, {1, 2, 3, 3, 64, 64},
                                                         {2, 2, 0, 3, 0, 64}, {2, 2, 1, 3, 16, 64}, {2, 2, 2, 3, 40, 64}, {2, 2, 3, 3, 64, 64}}));
    EXPECT_EQ(reports(24, false, &l_f), (std::vector<R>{{1, 1, 0, 3, 0, 64}, {1, 1, 1, 3, 24, 64}, {1, 1, 2, 3, 48, 64}, {1, 1, 3, 3, 64, 64}}));
    EXPECT_EQ(reports(64, true, &l_one), (std::vector<R>{{2, 1, 0, 1, 0, 64}, {2, 1, 1, 1, 64, 64}}));
    EXPECT_GT(l_fb, 0);
    EXPECT_NEAR(l_fb, l_f, 1e-4 * l_f);  // stage 2's loss is the forward's
    EXPECT_NEAR(l_one, l_f, 1e-4 * l_f);
}

// Other rope types of a Llama config are refused by name by the converter; so is llama3 scaling
// for Qwen2 (only Llama has rope_freqs.weight).
TEST(LlamaRopeFreqs, ConverterRefusesOtherRopeTypes) {
    const std::string src = model_fixture_dir("llama-rope3");
    struct Case {
        const char * name;
        const char * from;
        const char * to;
        const char * want;
    } cases[] = {
        {"yarn", "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "'yarn'"},
        {"linear", "\"rope_type\": \"llama3\"", "\"rope_type\": \"linear\"", "'linear'"},
        {"qwen2-llama3", "\"model_type\": \"llama\"", "\"model_type\": \"qwen2\"", "'llama3'"},
        {"no-factor", "\"factor\": 8.0,", "", "factor"},
    };
    for (const Case & c : cases) {
        const std::string dir = tmp_dir() + "/rope-" + c.name;
        ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir + " && ln -s " + src + "/model.safetensors " + dir).c_str()), 0);
        std::ifstream in(src + "/config.json");
        std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const size_t at = cfg.find(c.from);
        ASSERT_NE(at, std::string::npos) << c.name;
        cfg.replace(at, strlen(c.from), c.to);
        std::ofstream(dir + "/config.json") << cfg;
        const std::string log = dir + "/log";
        const int rc = system((bin_dir() + "/oomb-convert-hf " + dir + " -o " + dir + "/out.gguf > " + log + " 2>&1").c_str());
        EXPECT_NE(rc, 0) << c.name;
        std::ifstream l(log);
        const std::string msg((std::istreambuf_iterator<char>(l)), std::istreambuf_iterator<char>());
        EXPECT_NE(msg.find(c.want), std::string::npos) << c.name << ": " << msg;
        EXPECT_NE(msg.find("config.json"), std::string::npos) << c.name << ": " << msg;
    }
}

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
    ASSERT_TRUE(model_save_gguf(*run.model, out, "", GGUF_TENSOR_F32, "llama-mini", &err)) << err;
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

// An extra tensor of a variant: its name, ne, type (F32 or F16) and the value of every element.
struct Extra {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type = GGUF_TENSOR_F32;
    float value = 1.0f;
};

// Writes a copy of a converted fixture with one change: extra tensors and keys.
std::string variant(const std::string & src, const std::string & name, const std::function<void(GGUFWriter &, const GGUFReader &)> & edit,
                    const std::vector<Extra> & extra = {}) {
    GGUFReader r;
    std::string err;
    EXPECT_EQ(r.open(src, &err), GGUF_OK) << err;
    GGUFWriter w;
    for (const auto & kv : r.metadata()) w.set(kv.first, kv.second);
    edit(w, r);
    for (const GGUFTensorInfo & t : r.tensors())
        EXPECT_EQ(w.add_tensor(t.name, GGUF_TENSOR_F32, std::vector<int64_t>(t.ne, t.ne + t.n_dims), &err), GGUF_OK) << err;
    for (const Extra & e : extra) EXPECT_EQ(w.add_tensor(e.name, e.type, e.ne, &err), GGUF_OK) << err;
    const std::string out = tmp_dir() + "/" + name + ".gguf";
    EXPECT_EQ(w.open(out, &err), GGUF_OK) << err;
    for (const GGUFTensorInfo & t : r.tensors()) {
        std::vector<float> v;
        EXPECT_EQ(r.read_tensor_f32(t.name, &v, &err), GGUF_OK) << err;
        EXPECT_EQ(w.write_tensor(t.name, v.data(), v.size() * 4, &err), GGUF_OK) << err;
    }
    for (const Extra & e : extra) {
        const int64_t n = std::accumulate(e.ne.begin(), e.ne.end(), (int64_t) 1, std::multiplies<int64_t>());
        std::vector<float> v((size_t) n, e.value);
        std::vector<uint8_t> bytes((size_t) n * gguf_tensor_type_block_bytes(e.type));
        EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, v.data(), e.type, bytes.data(), n, &err), GGUF_OK) << err;
        EXPECT_EQ(w.write_tensor(e.name, bytes.data(), bytes.size(), &err), GGUF_OK) << err;
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

// rope_freqs.weight (Llama 3.x RoPE frequency factors) is checked: its shape and type before anything
// is allocated, its values (finite, > 0) after reading; each refusal names it.
TEST(LlamaErrors, RopeFreqsRefused) {
    const std::string g = converted("llama-micro");  // head dim 10: 5 factors
    auto none = [](GGUFWriter &, const GGUFReader &) {};
    struct Case {
        const char * name;
        Extra t;
        const char * want;
    } cases[] = {
        {"rope-freqs-shape", {"rope_freqs.weight", {6}}, "expected [5]"},
        {"rope-freqs-2d", {"rope_freqs.weight", {5, 1}}, "expected [5]"},
        {"rope-freqs-f16", {"rope_freqs.weight", {5}, GGUF_TENSOR_F16}, "expected F32"},
        {"rope-freqs-zero", {"rope_freqs.weight", {5}, GGUF_TENSOR_F32, 0.0f}, "must be finite and > 0"},
        {"rope-freqs-negative", {"rope_freqs.weight", {5}, GGUF_TENSOR_F32, -2.0f}, "must be finite and > 0"},
        {"rope-freqs-inf", {"rope_freqs.weight", {5}, GGUF_TENSOR_F32, INFINITY}, "must be finite and > 0"},
    };
    for (const Case & c : cases) {
        const std::string e = load_error(variant(g, c.name, none, {c.t}));
        EXPECT_NE(e.find("rope_freqs.weight"), std::string::npos) << c.name << ": " << e;
        EXPECT_NE(e.find(c.want), std::string::npos) << c.name << ": " << e;
    }
    // a Qwen2 file has no place for it
    const std::string q = load_error(variant(converted("qwen2-micro"), "qwen2-rope-freqs", none, {{"rope_freqs.weight", {32}}}));
    EXPECT_NE(q.find("rope_freqs.weight"), std::string::npos) << q;
}

// A file with rope_freqs.weight loads it as an f32 constant (also with bf16 weights), not
// trainable, and saving writes it back (F32, the same values). With every factor 1 the gradients
// are those of plain RoPE (the HF reference of the fixture without scaling).
TEST(LlamaRopeFreqs, LoadSaveAndUnitFactors) {
    const std::string g = variant(converted("llama-micro"), "rope-freqs-ones", [](GGUFWriter &, const GGUFReader &) {},
                                  {{"rope_freqs.weight", {5}}});
    ModelRun run(g);
    ASSERT_NE(run.model->rope_freqs, nullptr);
    EXPECT_TRUE(run.model->cfg.rope_freqs);
    EXPECT_EQ(run.model->rope_freqs->type, OOMB_TYPE_F32);
    EXPECT_EQ(run.model->rope_freqs->grad, nullptr) << "rope_freqs.weight must not be trainable";
    for (oomb_tensor * p : run.params) EXPECT_NE(p, run.model->rope_freqs);
    check_gradients(run, "llama-micro", "short", 24, 16);
    {
        oomb_backend_t be = oomb_backend_cpu_init(1);
        std::string err;
        auto bf = model_load_gguf(g, be, OOMB_TYPE_BF16, &err);
        ASSERT_NE(bf, nullptr) << err;
        EXPECT_EQ(bf->rope_freqs->type, OOMB_TYPE_F32) << "the factors stay f32 with bf16 weights";
        bf.reset();
        oomb_backend_free(be);
    }
    const std::string out = tmp_dir() + "/rope-freqs-saved.gguf";
    std::string err;
    ASSERT_TRUE(model_save_gguf(*run.model, out, "", GGUF_TENSOR_BF16, "rope-freqs", &err)) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
    const GGUFTensorInfo * t = r.find_tensor("rope_freqs.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, GGUF_TENSOR_F32);
    std::vector<float> v;
    ASSERT_EQ(r.read_tensor_f32("rope_freqs.weight", &v, &err), GGUF_OK) << err;
    EXPECT_EQ(v, std::vector<float>(5, 1.0f));
    // a model without it writes none
    ModelRun plain(converted("llama-micro"));
    EXPECT_EQ(plain.model->rope_freqs, nullptr);
    const std::string out2 = tmp_dir() + "/no-rope-freqs-saved.gguf";
    ASSERT_TRUE(model_save_gguf(*plain.model, out2, "", GGUF_TENSOR_F32, "plain", &err)) << err;
    GGUFReader r2;
    ASSERT_EQ(r2.open(out2, &err), GGUF_OK) << err;
    EXPECT_EQ(r2.find_tensor("rope_freqs.weight"), nullptr);
}

} // namespace
