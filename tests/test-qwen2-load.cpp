// The Qwen2 GGUF layout (models/qwen2-layout.h) and the model loader's checks: tiny GGUF files
// written here, each with one defect (a layer count of 4e9, a 2^62 key length, a missing,
// misshapen, mistyped or unknown tensor, a wrong vocabulary), must fail fast, in bounded memory,
// with a message naming the key or tensor, and never through oomb_error. A valid file and a
// save/load round trip (head_dim != n_embd / n_head included) must load exactly.
#include "test-common.h"

#include "gguf.h"
#include "qwen2.h"
#include "qwen2-layout.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <sys/resource.h>
#include <unistd.h>

using namespace oomb;

namespace {

std::string tmp_path(const std::string & name) {
    static std::string dir;
    if (dir.empty()) {
        char tmpl[] = "/tmp/oomb-test-qwen2-load-XXXXXX";
        dir = mkdtemp(tmpl);
    }
    return dir + "/" + name;
}

Qwen2Config tiny_config() {
    Qwen2Config c;
    c.n_vocab = 40; c.n_embd = 16; c.n_ff = 24; c.n_layer = 2; c.n_head = 2; c.n_head_kv = 1; c.head_dim = 8;
    c.n_ctx_train = 128; c.rope_theta = 1e4f; c.rms_eps = 1e-5f; c.tied = false;
    return c;
}

// A model file of config c written by hand (not by the saver), with the edits of a test applied.
struct TinyFile {
    Qwen2Config c = tiny_config();
    std::map<std::string, GGUFValue> keys;             // set after the qwen2.* keys (replace in place)
    std::set<std::string> remove_keys;
    std::set<std::string> drop;                        // tensors left out
    std::map<std::string, std::vector<int64_t>> ne;    // tensors with another shape
    std::map<std::string, uint32_t> type;              // tensors of another type
    std::vector<std::pair<std::string, std::vector<int64_t>>> extra;  // tensors added at the end

    std::string write(const std::string & name) const {
        GGUFWriter w;
        std::string err;
        w.set_string("general.architecture", "qwen2");
        qwen2_write_hparams(w, c);
        for (auto & k : keys) w.set(k.first, k.second);
        for (auto & k : remove_keys) w.remove(k);
        for (const Qwen2TensorSpec & s : qwen2_tensors(c)) {
            if (drop.count(s.name)) continue;
            auto n = ne.find(s.name);
            auto t = type.find(s.name);
            EXPECT_EQ(w.add_tensor(s.name, t != type.end() ? t->second : GGUF_TENSOR_F32, n != ne.end() ? n->second : s.ne, &err),
                      GGUF_OK) << err;
        }
        for (auto & e : extra) EXPECT_EQ(w.add_tensor(e.first, GGUF_TENSOR_F32, e.second, &err), GGUF_OK) << err;
        const std::string path = tmp_path(name);
        EXPECT_EQ(w.open(path, &err), GGUF_OK) << err;
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (const GGUFTensorInfo & t : w.tensors()) {
            std::vector<uint8_t> bytes(t.nbytes);
            if (t.type == GGUF_TENSOR_F32)
                for (size_t i = 0; i < bytes.size() / 4; i++) ((float *) bytes.data())[i] = u(rng);
            EXPECT_EQ(w.write_tensor(t.name, bytes.data(), bytes.size(), &err), GGUF_OK) << err;
        }
        EXPECT_EQ(w.finish(&err), GGUF_OK) << err;
        return path;
    }
};

struct LoadResult {
    std::unique_ptr<Qwen2Model> model;
    std::string err;
    double seconds = 0;
    long rss_growth_kb = 0;  // growth of the peak RSS during the load
};

long peak_rss_kb() {
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

// Loads through qwen2_load_gguf with library errors turned into exceptions: an oomb_error is a
// test failure (the loader must return its errors).
LoadResult load(const std::string & path, oomb_type wtype = OOMB_TYPE_F32) {
    LoadResult r;
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    const long rss0 = peak_rss_kb();
    const auto t0 = std::chrono::steady_clock::now();
    {
        oombtest::ErrorCapture cap;
        try {
            r.model = qwen2_load_gguf(path, cpu, wtype, &r.err);
        } catch (const oombtest::OombError & e) {
            ADD_FAILURE() << "qwen2_load_gguf went through oomb_error: " << e.what();
        }
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.rss_growth_kb = peak_rss_kb() - rss0;
    if (!r.model) oomb_backend_free(cpu);  // else free_model frees it (r.model->backend)
    return r;
}

void free_model(LoadResult & r) {
    if (!r.model) return;
    oomb_backend_t be = r.model->backend;
    r.model.reset();
    oomb_backend_free(be);
}

// Expects the load to fail fast with a message containing every one of `parts`.
void expect_fails(const TinyFile & f, const std::string & name, std::initializer_list<const char *> parts) {
    SCOPED_TRACE(name);
    LoadResult r = load(f.write(name + ".gguf"));
    EXPECT_EQ(r.model, nullptr) << "loaded a file with a defect";
    EXPECT_NE(r.err.find(name + ".gguf"), std::string::npos) << "the message names the file: " << r.err;
    for (const char * p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << "'" << p << "' not in: " << r.err;
    EXPECT_LT(r.seconds, 1.0) << r.err;
    EXPECT_LT(r.rss_growth_kb, 64 * 1024) << r.err;
    free_model(r);
}

TEST(Qwen2Layout, TensorList) {
    Qwen2Config c = tiny_config();
    std::vector<Qwen2TensorSpec> t = qwen2_tensors(c);
    ASSERT_EQ(t.size(), 1u + 12 * 2 + 2);
    EXPECT_EQ(t.front().name, "token_embd.weight");
    EXPECT_EQ(t.front().ne, (std::vector<int64_t>{16, 40}));
    EXPECT_EQ(t.back().name, "output.weight");
    int64_t n = 0, n_ref = 0;
    for (auto & s : t) {
        int64_t k = 1;
        for (int64_t d : s.ne) k *= d;
        n += k;
        EXPECT_EQ(qwen2_gguf_name(s.hf_name), s.name) << s.hf_name;
        EXPECT_EQ(s.is_1d(), s.kind != Qwen2TensorKind::Weight) << s.name;
    }
    ASSERT_TRUE(qwen2_n_elements(c, &n_ref));
    EXPECT_EQ(n, n_ref);
    // attn_q uses head_dim, not n_embd / n_head
    c.head_dim = 12;
    for (auto & s : qwen2_tensors(c))
        if (s.name == "blk.1.attn_q.weight") EXPECT_EQ(s.ne, (std::vector<int64_t>{16, 24}));
    c.tied = true;
    std::vector<Qwen2TensorSpec> all = qwen2_tensors(c, true);
    ASSERT_EQ(all.size(), 1u + 12 * 2 + 1 + 2);
    EXPECT_EQ(all.back().name, "blk.1.attn_output.bias");
    EXPECT_TRUE(all.back().optional);
    EXPECT_EQ(qwen2_gguf_name("model.layers.3.mystery.weight"), "");
    for (const std::string & p : qwen2_preset_names()) {
        Qwen2Config pc;
        ASSERT_TRUE(qwen2_preset(p, &pc)) << p;
        std::string err;
        EXPECT_TRUE(qwen2_config_valid(pc, &err)) << p << ": " << err;
    }
}

TEST(Qwen2Layout, ConfigChecksNameTheField) {
    std::string err;
    Qwen2Config c = tiny_config();
    c.head_dim = int64_t(1) << 62;
    EXPECT_FALSE(qwen2_config_valid(c, &err));
    EXPECT_NE(err.find("qwen2.attention.key_length"), std::string::npos) << err;
    c.head_dim = int64_t(1) << 30;  // fits int32, but n_head * head_dim does not
    EXPECT_FALSE(qwen2_config_valid(c, &err));
    EXPECT_NE(err.find("n_head * head_dim"), std::string::npos) << err;
    c = tiny_config();
    c.n_layer = INT32_MAX;  // every product fits int64 but the model's element count
    c.n_embd = c.n_ff = INT32_MAX - 1;
    c.n_vocab = INT32_MAX;
    c.head_dim = 2;
    EXPECT_FALSE(qwen2_config_valid(c, &err));
    EXPECT_NE(err.find("overflows"), std::string::npos) << err;
    c = tiny_config();
    c.rms_eps = 0;
    EXPECT_FALSE(qwen2_config_valid(c, &err));
    EXPECT_NE(err.find("rms_norm_eps"), std::string::npos) << err;
    c = tiny_config();
    c.head_dim = 7;
    EXPECT_FALSE(qwen2_config_valid(c, &err));
    EXPECT_NE(err.find("even"), std::string::npos) << err;
}

TEST(Qwen2Load, ValidFileLoads) {
    TinyFile f;
    LoadResult r = load(f.write("valid.gguf"));
    ASSERT_NE(r.model, nullptr) << r.err;
    const Qwen2Config & c = r.model->cfg;
    EXPECT_EQ(c.n_vocab, 40);
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.n_ctx_train, 128);
    EXPECT_EQ(c.rope_theta, 1e4f);
    EXPECT_FALSE(c.tied);
    GGUFReader g;
    std::string err;
    ASSERT_EQ(g.open(tmp_path("valid.gguf"), &err), GGUF_OK) << err;
    for (oomb_tensor * t : r.model->params) {
        std::vector<float> want, got((size_t) oomb_nelements(t));
        ASSERT_EQ(g.read_tensor_f32(t->name, &want, &err), GGUF_OK) << err;
        oomb_tensor_get(t, got.data(), 0, got.size() * 4);
        EXPECT_EQ(got, want) << t->name;
    }
    free_model(r);
}

// The fuzzer's file: a few KB declaring 4e9 layers used to run 36 s and reach 6.9 GB.
TEST(Qwen2Load, HugeLayerCountFailsFast) {
    TinyFile f;
    f.keys["qwen2.block_count"] = GGUFValue::u32(4000000000u);
    expect_fails(f, "layers-4e9", {"qwen2.block_count", "4000000000", "2 blocks"});
    // a block number far beyond the others does not make the count right
    f.keys["qwen2.block_count"] = GGUFValue::u32(2000000001u);
    f.extra = {{"blk.2000000000.attn_norm.weight", {16}}};
    expect_fails(f, "layers-2e9-sparse", {"qwen2.block_count", "3 blocks"});
    f.extra = {{"blk.99999999999.attn_norm.weight", {16}}};
    expect_fails(f, "layers-bad-number", {"blk.99999999999.attn_norm.weight", "invalid block number"});
}

TEST(Qwen2Load, LayerCountMustMatchTheBlocks) {
    TinyFile f;
    f.keys["qwen2.block_count"] = GGUFValue::u32(3);
    expect_fails(f, "layers-3-of-2", {"qwen2.block_count = 3", "2 blocks"});
    f.keys["qwen2.block_count"] = GGUFValue::u32(1);
    expect_fails(f, "layers-1-of-2", {"blk.1.", "block 1", "qwen2.block_count = 1"});
    f.keys["qwen2.block_count"] = GGUFValue::u32(0);
    expect_fails(f, "layers-0", {"qwen2.block_count", "is 0"});
}

// 2^62 used to overflow n_head * head_dim (a signed multiply: undefined behaviour).
TEST(Qwen2Load, HugeKeyLengthFails) {
    TinyFile f;
    f.keys["qwen2.attention.key_length"] = GGUFValue::u64(uint64_t(1) << 62);
    expect_fails(f, "key-length-2p62", {"qwen2.attention.key_length"});
    f.keys["qwen2.attention.key_length"] = GGUFValue::u32(1u << 31);
    expect_fails(f, "key-length-2p31", {"qwen2.attention.key_length", "2147483648"});
    f.keys["qwen2.attention.key_length"] = GGUFValue::u32(1u << 30);
    expect_fails(f, "key-length-2p30", {"n_head * head_dim"});
    // in range, but not the size of the tensors: head_dim * n_head against attn_q
    f.keys["qwen2.attention.key_length"] = GGUFValue::u32(4);
    expect_fails(f, "key-length-4", {"blk.0.attn_q.weight", "[16, 16]", "expected [16, 8]"});
    f.keys.clear();
    f.keys["qwen2.attention.value_length"] = GGUFValue::u32(6);
    expect_fails(f, "value-length", {"qwen2.attention.value_length", "differs"});
}

TEST(Qwen2Load, BadKeys) {
    TinyFile f;
    f.remove_keys = {"qwen2.embedding_length"};
    expect_fails(f, "no-embd", {"qwen2.embedding_length", "missing"});
    f.remove_keys.clear();
    f.keys["qwen2.block_count"] = GGUFValue::string("two");
    expect_fails(f, "layers-string", {"qwen2.block_count"});
    f.keys.clear();
    f.keys["qwen2.attention.head_count"] = GGUFValue::u32(3);
    expect_fails(f, "heads-3", {"embedding_length 16", "head_count 3"});
    f.keys["qwen2.attention.head_count"] = GGUFValue::u32(4);  // head_dim 4: tensors of 8 per head
    f.keys["qwen2.attention.head_count_kv"] = GGUFValue::u32(3);
    expect_fails(f, "heads-kv-3", {"n_head 4 is not a multiple of n_head_kv 3"});
    f.keys.clear();
    f.keys["qwen2.rope.freq_base"] = GGUFValue::f32(-1.0f);
    expect_fails(f, "theta", {"qwen2.rope.freq_base"});
    f.keys.clear();
    f.keys["general.architecture"] = GGUFValue::string("llama");
    expect_fails(f, "arch", {"general.architecture", "llama"});
}

// Found by review: RoPE scaling was dropped silently (trained with plain RoPE), context_length 0 accepted.
TEST(Qwen2Load, RopeScalingAndZeroContextAreRefused) {
    TinyFile f;
    f.keys["qwen2.rope.scaling.type"] = GGUFValue::string("yarn");
    f.keys["qwen2.rope.scaling.factor"] = GGUFValue::f32(4.0f);
    expect_fails(f, "yarn", {"qwen2.rope.scaling.type", "yarn", "not supported"});
    f.keys["qwen2.rope.scaling.type"] = GGUFValue::string("linear");
    expect_fails(f, "linear-4", {"qwen2.rope.scaling.type", "linear"});
    f.keys.clear();
    f.keys["qwen2.context_length"] = GGUFValue::u32(0);
    expect_fails(f, "ctx-0", {"qwen2.context_length", "is 0"});
}

TEST(Qwen2Load, RopeScalingNoneLoads) {
    TinyFile f;
    f.keys["qwen2.rope.scaling.type"] = GGUFValue::string("none");
    LoadResult r = load(f.write("rope-none.gguf"));
    EXPECT_NE(r.model, nullptr) << r.err;
    free_model(r);
}

TEST(Qwen2Load, MissingTensor) {
    TinyFile f;
    f.drop = {"blk.1.ffn_up.weight"};
    expect_fails(f, "missing", {"tensor 'blk.1.ffn_up.weight' is missing"});
    f.drop = {"token_embd.weight"};
    expect_fails(f, "missing-embd", {"token_embd.weight"});
}

TEST(Qwen2Load, WrongShape) {
    TinyFile f;
    f.ne["blk.0.attn_k.weight"] = {16, 9};
    expect_fails(f, "shape", {"blk.0.attn_k.weight", "[16, 9]", "expected [16, 8]"});
    f.ne = {{"blk.1.attn_norm.weight", {16, 1}}};  // the same elements, another rank
    expect_fails(f, "rank", {"blk.1.attn_norm.weight", "[16, 1]", "expected [16]"});
    f.ne = {{"token_embd.weight", {12, 40}}};
    expect_fails(f, "embd-width", {"token_embd.weight", "[12, 40]", "qwen2.embedding_length"});
}

TEST(Qwen2Load, WrongVocabulary) {
    TinyFile f;
    f.ne["token_embd.weight"] = {16, 30};  // the LM head keeps 40 rows
    expect_fails(f, "vocab", {"output.weight", "[16, 40]", "expected [16, 30]"});
}

TEST(Qwen2Load, WrongType) {
    TinyFile f;
    f.type["blk.0.ffn_norm.weight"] = 26;  // ggml I32: valid GGUF, not a float type
    expect_fails(f, "type-i32", {"blk.0.ffn_norm.weight", "I32"});
    f.type = {{"blk.0.attn_q.weight", GGUF_TENSOR_F16}};  // readable: converted
    LoadResult r = load(f.write("type-f16.gguf"));
    EXPECT_NE(r.model, nullptr) << r.err;
    free_model(r);
}

TEST(Qwen2Load, TensorsOutsideTheLayout) {
    TinyFile f;
    f.extra = {{"rope_freqs.weight", {4}}};
    expect_fails(f, "unknown", {"rope_freqs.weight", "not part of the Qwen2 layout"});
    f.extra = {{"blk.0.attn_output.bias", {16}}};
    expect_fails(f, "o-bias", {"blk.0.attn_output.bias", "not supported"});
    f.extra = {{"blk.01.attn_norm.weight", {16}}};
    expect_fails(f, "leading-zero", {"blk.01.attn_norm.weight"});
}

// The saver writes what the loader reads back exactly, with a head size that is not n_embd / n_head
// (qwen2.attention.key_length / value_length) and a tied head.
TEST(Qwen2Load, SaveLoadRoundTrip) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    Qwen2Config c = tiny_config();
    c.head_dim = 12;
    c.tied = true;
    auto m = qwen2_create(c, cpu, OOMB_TYPE_F32);
    qwen2_init_random(*m, 3);
    const std::string path = tmp_path("saved.gguf");
    std::string err;
    ASSERT_TRUE(qwen2_save_gguf(*m, path, "", GGUF_TENSOR_F32, "t", &err)) << err;
    GGUFReader g;
    ASSERT_EQ(g.open(path, &err), GGUF_OK) << err;
    uint32_t kl = 0;
    EXPECT_EQ(g.get_u32("qwen2.attention.key_length", &kl, &err), GGUF_OK) << err;
    EXPECT_EQ(kl, 12u);
    EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
    LoadResult r = load(path);
    ASSERT_NE(r.model, nullptr) << r.err;
    EXPECT_EQ(r.model->cfg.head_dim, 12);
    EXPECT_TRUE(r.model->cfg.tied);
    ASSERT_EQ(r.model->params.size(), m->params.size());
    for (size_t i = 0; i < m->params.size(); i++) {
        std::vector<float> a((size_t) oomb_nelements(m->params[i])), b(a.size());
        oomb_tensor_get(m->params[i], a.data(), 0, a.size() * 4);
        oomb_tensor_get(r.model->params[i], b.data(), 0, b.size() * 4);
        EXPECT_EQ(a, b) << m->params[i]->name;
        EXPECT_EQ(r.model->specs[i].name, m->params[i]->name);
    }
    free_model(r);
    m.reset();
    oomb_backend_free(cpu);
}

} // namespace
