// gguf-tools end to end: oomb-convert-hf on the qwen2-micro / qwen2-mini fixtures (every tensor
// bit-exact with the default type and with f32), transformers 4/5 configs, sharded checkpoints,
// tokenizers padded to the embedding rows, errors; oomb-gguf-init; oomb-tokenize; oomb-gguf-dump.
// Also the safetensors reader/writer.
#include "gguf.h"
#include "safetensors.h"

#include "../src/fp16.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace oomb;

namespace {

std::string tmp_dir() {
    static std::string d;
    if (d.empty()) {
        char tmpl[] = "/tmp/oomb-test-convert-XXXXXX";
        d = mkdtemp(tmpl);
    }
    return d;
}

std::string tool(const std::string& name) { return oombtest::bin_dir() + "/" + name; }

bool have_tools() {
    for (auto t : {"oomb-convert-hf", "oomb-gguf-init", "oomb-tokenize", "oomb-gguf-dump"})
        if (access(tool(t).c_str(), X_OK) != 0) return false;
    return true;
}

// Runs a shell command; returns its exit status, output (stdout + stderr) in *out.
int run(const std::string& cmd, std::string* out = nullptr) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return -1;
    std::string o;
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, p)) > 0) o.append(buf, k);
    const int st = pclose(p);
    if (out) *out = o;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Runs a shell command with its output discarded; returns the peak resident set of the command
// (the shell's largest child, KiB), or -1 when it did not exit with status 0.
long peak_rss_kb(const std::string& cmd) {
    const pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >/dev/null 2>&1").c_str(), (char*)nullptr);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    return ru.ru_maxrss;
}

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_all(const std::string& path, const std::string& s) {
    std::ofstream f(path, std::ios::binary);
    f << s;
}

// Removes the temporary folder when the tests end.
struct TmpCleanup : ::testing::Environment {
    void TearDown() override {
        if (access(tmp_dir().c_str(), F_OK) == 0) run("rm -rf '" + tmp_dir() + "'");
    }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TmpCleanup);

#define REQUIRE_TOOLS() \
    if (!have_tools()) GTEST_SKIP() << "gguf-tools not built in " << oombtest::bin_dir()

// Checks a conversion of fixture `model` against its safetensors, bit for bit.
void check_conversion(const std::string& model, const std::string& gguf, bool f32) {
    SafetensorsModel st;
    std::string err;
    ASSERT_EQ(st.open(oombtest::fixture_path(model), &err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(gguf, &err), GGUF_OK) << err;
    nlohmann::json cfg = nlohmann::json::parse(read_all(oombtest::fixture_path(model + "/config.json")));
    GGUFQwen2Hparams hp;
    ASSERT_EQ(gguf_read_qwen2_hparams(r, &hp, &err), GGUF_OK) << err;
    EXPECT_EQ(hp.n_vocab, cfg["vocab_size"].get<uint32_t>());
    EXPECT_EQ(hp.n_embd, cfg["hidden_size"].get<uint32_t>());
    EXPECT_EQ(hp.n_ff, cfg["intermediate_size"].get<uint32_t>());
    EXPECT_EQ(hp.n_layer, cfg["num_hidden_layers"].get<uint32_t>());
    EXPECT_EQ(hp.n_head, cfg["num_attention_heads"].get<uint32_t>());
    EXPECT_EQ(hp.n_head_kv, cfg["num_key_value_heads"].get<uint32_t>());
    EXPECT_EQ(hp.n_ctx_train, cfg["max_position_embeddings"].get<uint32_t>());
    EXPECT_EQ(hp.rope_freq_base, 1e6f);
    EXPECT_EQ(hp.rms_norm_eps, 1e-6f);
    EXPECT_EQ(hp.tied_embeddings, cfg["tie_word_embeddings"].get<bool>());
    uint32_t ft = 99, qv = 0;
    EXPECT_EQ(r.get_u32("general.file_type", &ft, &err), GGUF_OK);
    EXPECT_EQ(ft, f32 ? 0u : 32u);
    EXPECT_EQ(r.get_u32("general.quantization_version", &qv, &err), GGUF_OK);
    EXPECT_EQ(qv, 2u);
    std::string name;
    EXPECT_EQ(r.get_string("general.name", &name, &err), GGUF_OK);
    EXPECT_EQ(name, model);
    EXPECT_EQ(r.find("tokenizer.ggml.tokens"), nullptr); // no tokenizer in these folders

    size_t n_matched = 0;
    for (const SafetensorsTensor* t : st.tensors()) {
        std::string g = t->name;
        // llama.cpp names
        static const std::pair<const char*, const char*> subs[] = {
            {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
            {"lm_head.weight", "output.weight"}, {"model.layers.", "blk."}, {"input_layernorm", "attn_norm"},
            {"post_attention_layernorm", "ffn_norm"}, {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
            {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"},
            {"mlp.up_proj", "ffn_up"}, {"mlp.down_proj", "ffn_down"}};
        for (auto& s : subs) {
            size_t k = g.find(s.first);
            if (k != std::string::npos) g.replace(k, strlen(s.first), s.second);
        }
        const GGUFTensorInfo* ti = r.find_tensor(g);
        ASSERT_TRUE(ti) << t->name << " -> " << g << " missing";
        n_matched++;
        EXPECT_EQ(ti->shape(), t->shape) << g;                      // GGUF ne is the reversed shape
        ASSERT_EQ(t->dtype, SafetensorsDtype::BF16);
        const uint32_t want_type = (f32 || t->shape.size() == 1) ? GGUF_TENSOR_F32 : GGUF_TENSOR_BF16;
        EXPECT_EQ(ti->type, want_type) << g;
        // Read back as BF16: the checkpoint's exact bytes.
        std::vector<uint8_t> bf(t->nbytes);
        ASSERT_EQ(r.read_tensor(*ti, GGUF_TENSOR_BF16, bf.data(), bf.size(), &err), GGUF_OK) << err;
        EXPECT_EQ(memcmp(bf.data(), t->data, t->nbytes), 0) << g;
        // Stored values: bf16 bytes or their exact f32 widening.
        if (want_type == GGUF_TENSOR_BF16) {
            EXPECT_EQ(memcmp(r.tensor_data(*ti), t->data, t->nbytes), 0) << g;
        } else {
            const size_t n = (size_t)t->numel();
            for (size_t i = 0; i < n; i++) {
                uint16_t h;
                float f;
                memcpy(&h, t->data + 2 * i, 2);
                memcpy(&f, r.tensor_data(*ti) + 4 * i, 4);
                const float want = bf16_to_fp32(h);
                ASSERT_EQ(memcmp(&f, &want, 4), 0) << g << " element " << i;
            }
        }
    }
    EXPECT_EQ(n_matched, r.tensors().size());
}

// Writes a small synthetic Qwen2 checkpoint (bf16) into `dir`.
void write_synthetic(const std::string& dir, int64_t vocab, int64_t hidden, int64_t ffn, int64_t heads, int64_t kv,
                     bool tied, const std::string& extra_tensor = "", int64_t n_layers = 1) {
    mkdir(dir.c_str(), 0755);
    nlohmann::json cfg = {{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}, {"vocab_size", vocab},
                          {"hidden_size", hidden}, {"intermediate_size", ffn}, {"num_hidden_layers", n_layers},
                          {"num_attention_heads", heads}, {"num_key_value_heads", kv}, {"max_position_embeddings", 4096},
                          {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"tie_word_embeddings", tied},
                          {"bos_token_id", 151643}, {"eos_token_id", 151645}};
    write_all(dir + "/config.json", cfg.dump(2));
    const int64_t hd = hidden / heads;
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"model.embed_tokens.weight", {vocab, hidden}}, {"model.norm.weight", {hidden}}};
    for (int64_t l = 0; l < n_layers; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
            {p + "input_layernorm.weight", {hidden}}, {p + "post_attention_layernorm.weight", {hidden}},
            {p + "self_attn.q_proj.weight", {hidden, hidden}}, {p + "self_attn.q_proj.bias", {hidden}},
            {p + "self_attn.k_proj.weight", {kv * hd, hidden}}, {p + "self_attn.k_proj.bias", {kv * hd}},
            {p + "self_attn.v_proj.weight", {kv * hd, hidden}}, {p + "self_attn.v_proj.bias", {kv * hd}},
            {p + "self_attn.o_proj.weight", {hidden, hidden}}, {p + "mlp.gate_proj.weight", {ffn, hidden}},
            {p + "mlp.up_proj.weight", {ffn, hidden}}, {p + "mlp.down_proj.weight", {hidden, ffn}}};
        shapes.insert(shapes.end(), layer.begin(), layer.end());
    }
    if (!tied) shapes.push_back({"lm_head.weight", {vocab, hidden}});
    if (!extra_tensor.empty()) shapes.push_back({extra_tensor, {4}});
    SafetensorsWriter w;
    uint16_t seed = 1;
    for (auto& s : shapes) {
        int64_t n = 1;
        for (auto d : s.second) n *= d;
        std::vector<uint16_t> v((size_t)n);
        for (auto& x : v) x = oomb::fp32_to_bf16((float)((seed = (uint16_t)(seed * 75 + 74)) % 1000) / 1000.0f - 0.5f);
        ASSERT_EQ(w.add_copy(s.first, SafetensorsDtype::BF16, s.second, v.data()), GGUF_OK);
    }
    std::string err;
    ASSERT_EQ(w.write(dir + "/model.safetensors", &err), GGUF_OK) << err;
}

} // namespace

TEST(Convert, FixturesBitExactDefaultAndF32) {
    REQUIRE_TOOLS();
    for (const std::string model : {"qwen2-micro", "qwen2-mini"}) {
        for (const std::string outtype : {"", "f32", "bf16"}) {
            const std::string out = tmp_dir() + "/" + model + (outtype.empty() ? "" : "-" + outtype) + ".gguf";
            std::string log;
            ASSERT_EQ(run(tool("oomb-convert-hf") + " " + oombtest::fixture_path(model) + " -o " + out +
                              (outtype.empty() ? "" : " --outtype " + outtype), &log), 0) << log;
            EXPECT_EQ(log.find("lossy"), std::string::npos) << log;
            check_conversion(model, out, outtype == "f32");
            if (outtype == "bf16") EXPECT_EQ(read_all(out), read_all(tmp_dir() + "/" + model + ".gguf"));
        }
    }
}

TEST(Convert, F16IsLossyAndWarns) {
    REQUIRE_TOOLS();
    const std::string out = tmp_dir() + "/micro-f16.gguf";
    std::string log, err;
    ASSERT_EQ(run(tool("oomb-convert-hf") + " " + oombtest::fixture_path("qwen2-micro") + " -o " + out + " --outtype f16", &log), 0) << log;
    EXPECT_NE(log.find("lossy"), std::string::npos) << log;
    GGUFReader r;
    ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
    SafetensorsModel st;
    ASSERT_EQ(st.open(oombtest::fixture_path("qwen2-micro"), &err), GGUF_OK);
    const GGUFTensorInfo* t = r.find_tensor("blk.1.ffn_down.weight");
    ASSERT_TRUE(t);
    EXPECT_EQ(t->type, (uint32_t)GGUF_TENSOR_F16);
    const SafetensorsTensor* s = st.find("model.layers.1.mlp.down_proj.weight");
    for (int64_t i = 0; i < s->numel(); i++) {
        uint16_t a, b;
        memcpy(&a, s->data + 2 * i, 2);
        memcpy(&b, r.tensor_data(*t) + 2 * i, 2);
        ASSERT_EQ(b, fp32_to_fp16(bf16_to_fp32(a)));
    }
    uint32_t ft;
    EXPECT_EQ(r.get_u32("general.file_type", &ft, &err), GGUF_OK);
    EXPECT_EQ(ft, 1u);
}

TEST(Convert, Transformers4ConfigAndShardedCheckpoint) {
    REQUIRE_TOOLS();
    const std::string dir = tmp_dir() + "/micro-sharded";
    mkdir(dir.c_str(), 0755);
    nlohmann::json cfg = nlohmann::json::parse(read_all(oombtest::fixture_path("qwen2-micro/config.json")));
    cfg.erase("rope_parameters");
    cfg["rope_theta"] = 500000.0; // transformers 4 style
    write_all(dir + "/config.json", cfg.dump(2));
    SafetensorsModel st;
    std::string err;
    ASSERT_EQ(st.open(oombtest::fixture_path("qwen2-micro/model.safetensors"), &err), GGUF_OK) << err;
    SafetensorsWriter a, b;
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (const SafetensorsTensor* t : st.tensors()) {
        const bool first = t->name.find("layers.1.") == std::string::npos;
        ASSERT_EQ((first ? a : b).add(t->name, t->dtype, t->shape, t->data), GGUF_OK);
        index["weight_map"][t->name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    ASSERT_EQ(a.write(dir + "/model-00001-of-00002.safetensors", &err), GGUF_OK) << err;
    ASSERT_EQ(b.write(dir + "/model-00002-of-00002.safetensors", &err), GGUF_OK) << err;
    write_all(dir + "/model.safetensors.index.json", index.dump(2));
    const std::string out = tmp_dir() + "/micro-sharded.gguf";
    std::string log;
    ASSERT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 0) << log;
    GGUFReader r, ref;
    ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
    float theta = 0;
    EXPECT_EQ(r.get_f32("qwen2.rope.freq_base", &theta, &err), GGUF_OK);
    EXPECT_EQ(theta, 500000.0f);
    // Same tensors as the single-file conversion.
    const std::string single = tmp_dir() + "/micro-single.gguf";
    ASSERT_EQ(run(tool("oomb-convert-hf") + " " + oombtest::fixture_path("qwen2-micro") + " -o " + single, &log), 0) << log;
    ASSERT_EQ(ref.open(single, &err), GGUF_OK);
    ASSERT_EQ(r.tensors().size(), ref.tensors().size());
    for (size_t i = 0; i < r.tensors().size(); i++) {
        const GGUFTensorInfo& x = r.tensors()[i];
        const GGUFTensorInfo* y = ref.find_tensor(x.name);
        ASSERT_TRUE(y);
        ASSERT_EQ(x.nbytes, y->nbytes);
        EXPECT_EQ(memcmp(r.tensor_data(x), ref.tensor_data(*y), x.nbytes), 0) << x.name;
    }
    // An index naming a missing tensor is an error.
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors";
    write_all(dir + "/model.safetensors.index.json", index.dump(2));
    EXPECT_NE(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 0);
    EXPECT_NE(log.find("model.layers.9.mlp.up_proj.weight"), std::string::npos) << log;
}

TEST(Convert, TokenizerPaddedToEmbeddingRows) {
    REQUIRE_TOOLS();
    const std::string dir = tmp_dir() + "/synthetic-tok";
    write_synthetic(dir, 151936, 8, 16, 2, 1, true);
    for (auto f : {"tokenizer.json", "tokenizer_config.json"}) {
        char* abs = realpath(oombtest::fixture_path("qwen-tokenizer/" + std::string(f)).c_str(), nullptr);
        ASSERT_TRUE(abs) << f;
        ASSERT_EQ(symlink(abs, (dir + "/" + f).c_str()), 0);
        free(abs);
    }
    const std::string out = tmp_dir() + "/synthetic-tok.gguf";
    std::string log, err;
    ASSERT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 0) << log;
    GGUFReader r;
    ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    ASSERT_EQ(r.get_string_array("tokenizer.ggml.tokens", &tokens, &err), GGUF_OK);
    ASSERT_EQ(r.get_i32_array("tokenizer.ggml.token_type", &types, &err), GGUF_OK);
    ASSERT_EQ(tokens.size(), 151936u);
    ASSERT_EQ(types.size(), 151936u);
    EXPECT_EQ(tokens[151643], "<|endoftext|>");
    EXPECT_EQ(types[151643], 3);
    EXPECT_EQ(tokens[151665], "[PAD151665]");
    EXPECT_EQ(types[151665], 5);
    EXPECT_EQ(tokens[151935], "[PAD151935]");
    EXPECT_EQ(types[9707], 1);
    std::string s;
    EXPECT_EQ(r.get_string("tokenizer.ggml.model", &s, &err), GGUF_OK);
    EXPECT_EQ(s, "gpt2");
    EXPECT_EQ(r.get_string("tokenizer.ggml.pre", &s, &err), GGUF_OK);
    EXPECT_EQ(s, "qwen2");
    uint32_t id;
    EXPECT_EQ(r.get_u32("tokenizer.ggml.eos_token_id", &id, &err), GGUF_OK);
    EXPECT_EQ(id, 151645u);
    EXPECT_EQ(r.get_u32("tokenizer.ggml.padding_token_id", &id, &err), GGUF_OK);
    EXPECT_EQ(id, 151643u);
    EXPECT_EQ(r.get_u32("tokenizer.ggml.bos_token_id", &id, &err), GGUF_OK); // from config.json
    EXPECT_EQ(id, 151643u);
    bool add_bos = true;
    EXPECT_EQ(r.get_bool("tokenizer.ggml.add_bos_token", &add_bos, &err), GGUF_OK);
    EXPECT_FALSE(add_bos);
    // The model file tokenizes like the vocab file.
    std::string log2;
    write_all(tmp_dir() + "/hello.txt", "Hello world<|im_end|>\n");
    ASSERT_EQ(run(tool("oomb-tokenize") + " -m " + out + " -f " + tmp_dir() + "/hello.txt", &log2), 0) << log2;
    EXPECT_EQ(log2, "9707 1879 151645 198\n");
}

TEST(Convert, VocabOnlyReproducesShippedFile) {
    REQUIRE_TOOLS();
    const std::string out = tmp_dir() + "/vocab.gguf";
    std::string log;
    ASSERT_EQ(run(tool("oomb-convert-hf") + " --vocab-only " + oombtest::fixture_path("qwen-tokenizer") + " -o " + out, &log), 0) << log;
    const std::string shipped = read_all(oombtest::source_dir() + "/models/qwen2.5-vocab.gguf");
    ASSERT_FALSE(shipped.empty());
    EXPECT_TRUE(read_all(out) == shipped) << "models/qwen2.5-vocab.gguf is not what the converter writes";
    GGUFReader r;
    std::string err;
    ASSERT_EQ(r.open(out, &err), GGUF_OK);
    EXPECT_TRUE(r.tensors().empty());
}

TEST(Convert, Errors) {
    REQUIRE_TOOLS();
    std::string log;
    const std::string conv = tool("oomb-convert-hf");
    EXPECT_NE(run(conv + " /nonexistent -o " + tmp_dir() + "/x.gguf", &log), 0);
    EXPECT_NE(log.find("/nonexistent"), std::string::npos) << log;
    EXPECT_NE(run(conv + " " + oombtest::fixture_path("qwen-tokenizer") + " -o " + tmp_dir() + "/x.gguf", &log), 0);
    EXPECT_NE(log.find("config.json"), std::string::npos) << log;
    EXPECT_NE(run(conv + " " + oombtest::fixture_path("qwen2-micro") + " -o " + tmp_dir() + "/x.gguf --vocab-only", &log), 0);
    EXPECT_NE(log.find("tokenizer.json"), std::string::npos) << log;
    EXPECT_NE(run(conv + " " + oombtest::fixture_path("qwen2-micro") + " -o " + tmp_dir() + "/x.gguf --outtype q4_k", &log), 0);
    EXPECT_NE(run(conv, &log), 0);
    const std::string dir = tmp_dir() + "/synthetic-extra";
    write_synthetic(dir, 64, 8, 16, 2, 1, false, "model.layers.0.mystery.weight");
    EXPECT_NE(run(conv + " " + dir + " -o " + tmp_dir() + "/x.gguf", &log), 0);
    EXPECT_NE(log.find("cannot map tensor 'model.layers.0.mystery.weight'"), std::string::npos) << log;
    const std::string dir2 = tmp_dir() + "/synthetic-shape";
    write_synthetic(dir2, 64, 8, 16, 2, 1, false);
    nlohmann::json cfg = nlohmann::json::parse(read_all(dir2 + "/config.json"));
    cfg["intermediate_size"] = 24;
    write_all(dir2 + "/config.json", cfg.dump());
    EXPECT_NE(run(conv + " " + dir2 + " -o " + tmp_dir() + "/x.gguf", &log), 0);
    EXPECT_NE(log.find("config.json implies"), std::string::npos) << log;
    // num_hidden_layers disagreeing with the checkpoint's layers: an error naming the tensors,
    // never a file whose block_count disagrees with its blk.N tensors.
    const std::string dir3 = tmp_dir() + "/synthetic-layers";
    write_synthetic(dir3, 64, 8, 16, 2, 1, false, "", 3);
    ASSERT_EQ(run(conv + " " + dir3 + " -o " + tmp_dir() + "/three.gguf", &log), 0) << log; // consistent
    {
        GGUFReader r;
        std::string err;
        GGUFQwen2Hparams hp;
        ASSERT_EQ(r.open(tmp_dir() + "/three.gguf", &err), GGUF_OK) << err;
        ASSERT_EQ(gguf_read_qwen2_hparams(r, &hp, &err), GGUF_OK) << err;
        EXPECT_EQ(hp.n_layer, 3u);
        EXPECT_TRUE(r.find_tensor("blk.2.ffn_down.weight"));
    }
    cfg = nlohmann::json::parse(read_all(dir3 + "/config.json"));
    cfg["num_hidden_layers"] = 1; // fewer than the checkpoint's 3
    write_all(dir3 + "/config.json", cfg.dump());
    EXPECT_NE(run(conv + " " + dir3 + " -o " + tmp_dir() + "/x.gguf", &log), 0) << log;
    EXPECT_NE(log.find("num_hidden_layers = 1"), std::string::npos) << log;
    EXPECT_NE(log.find("model.layers.1.input_layernorm.weight"), std::string::npos) << log;
    EXPECT_NE(log.find("up to 2"), std::string::npos) << log;
    EXPECT_NE(log.find("24 tensors"), std::string::npos) << log; // 2 extra layers of 12
    cfg["num_hidden_layers"] = 4; // more than the checkpoint's 3
    write_all(dir3 + "/config.json", cfg.dump());
    EXPECT_NE(run(conv + " " + dir3 + " -o " + tmp_dir() + "/x.gguf", &log), 0) << log;
    EXPECT_NE(log.find("no tensor 'model.layers.3.input_layernorm.weight'"), std::string::npos) << log;
    EXPECT_NE(log.find("num_hidden_layers = 4"), std::string::npos) << log;
    // Known buffers that llama.cpp recomputes are dropped with a note.
    const std::string dir4 = tmp_dir() + "/synthetic-inv-freq";
    write_synthetic(dir4, 64, 8, 16, 2, 1, false, "model.layers.0.self_attn.rotary_emb.inv_freq");
    ASSERT_EQ(run(conv + " " + dir4 + " -o " + tmp_dir() + "/inv.gguf", &log), 0) << log;
    EXPECT_NE(log.find("note: dropping 'model.layers.0.self_attn.rotary_emb.inv_freq'"), std::string::npos) << log;
    // RoPE scaling and sliding-window attention change the model: refused, never dropped (review)
    const std::string dir5 = tmp_dir() + "/synthetic-yarn";
    write_synthetic(dir5, 64, 8, 16, 2, 1, false);
    nlohmann::json c5 = nlohmann::json::parse(read_all(dir5 + "/config.json"));
    c5["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
    write_all(dir5 + "/config.json", c5.dump());
    EXPECT_NE(run(conv + " " + dir5 + " -o " + tmp_dir() + "/x.gguf", &log), 0) << log;
    EXPECT_NE(log.find("rope_scaling of type 'yarn' is not supported"), std::string::npos) << log;
    c5["rope_scaling"] = nullptr;
    c5["use_sliding_window"] = true;
    c5["sliding_window"] = 16;
    write_all(dir5 + "/config.json", c5.dump());
    EXPECT_NE(run(conv + " " + dir5 + " -o " + tmp_dir() + "/x.gguf", &log), 0) << log;
    EXPECT_NE(log.find("use_sliding_window is true"), std::string::npos) << log;
    c5["use_sliding_window"] = false;  // Qwen2.5's published configs: the key present, the window off
    write_all(dir5 + "/config.json", c5.dump());
    EXPECT_EQ(run(conv + " " + dir5 + " -o " + tmp_dir() + "/swa-off.gguf", &log), 0) << log;
    EXPECT_NE(access((tmp_dir() + "/x.gguf").c_str(), F_OK), 0); // nothing written on failure
    for (auto t : {"oomb-convert-hf", "oomb-gguf-init", "oomb-tokenize", "oomb-gguf-dump"}) {
        EXPECT_EQ(run(tool(t) + " --help", &log), 0) << t;
        EXPECT_NE(log.find("Usage"), std::string::npos) << t << ": " << log;
    }
}

TEST(Init, DeterministicShapesAndStatistics) {
    REQUIRE_TOOLS();
    const std::string a = tmp_dir() + "/init-a.gguf", b = tmp_dir() + "/init-b.gguf", c = tmp_dir() + "/init-c.gguf";
    const std::string args = " --vocab-size 4096 --hidden 128 --ffn 352 --layers 2 --heads 2 --kv-heads 1 --vocab " +
                             oombtest::source_dir() + "/models/qwen2.5-vocab.gguf";
    std::string log, err;
    // Fewer embedding rows than tokens is an error; 151936 rows pads the tokenizer.
    EXPECT_NE(run(tool("oomb-gguf-init") + args + " -o " + a, &log), 0);
    EXPECT_NE(log.find("do not fit"), std::string::npos) << log;
    const std::string args2 = " --vocab-size 151936 --hidden 64 --ffn 96 --layers 2 --heads 2 --kv-heads 1 --tied --vocab " +
                              oombtest::source_dir() + "/models/qwen2.5-vocab.gguf";
    ASSERT_EQ(run(tool("oomb-gguf-init") + args2 + " --seed 7 -t 2 -o " + a, &log), 0) << log;
    ASSERT_EQ(run(tool("oomb-gguf-init") + args2 + " --seed 7 -t 1 -o " + b, &log), 0) << log;
    ASSERT_EQ(run(tool("oomb-gguf-init") + args2 + " --seed 8 -o " + c, &log), 0) << log;
    EXPECT_TRUE(read_all(a) == read_all(b)) << "same seed, different threads: files differ";
    EXPECT_FALSE(read_all(a) == read_all(c));
    GGUFReader r;
    ASSERT_EQ(r.open(a, &err), GGUF_OK) << err;
    GGUFQwen2Hparams hp;
    ASSERT_EQ(gguf_read_qwen2_hparams(r, &hp, &err), GGUF_OK) << err;
    EXPECT_EQ(hp.n_vocab, 151936u);
    EXPECT_EQ(hp.n_embd, 64u);
    EXPECT_EQ(hp.n_layer, 2u);
    EXPECT_TRUE(hp.tied_embeddings);
    EXPECT_EQ(r.tensors().size(), 1u + 2 * 12 + 1);
    std::vector<std::string> tokens;
    ASSERT_EQ(r.get_string_array("tokenizer.ggml.tokens", &tokens, &err), GGUF_OK);
    EXPECT_EQ(tokens.size(), 151936u);
    EXPECT_EQ(tokens[151700], "[PAD151700]");
    for (auto& t : r.tensors()) {
        std::vector<float> v;
        ASSERT_EQ(r.read_tensor_f32(t.name, &v, &err), GGUF_OK) << err;
        double s = 0, s2 = 0;
        for (float x : v) { s += x; s2 += (double)x * x; }
        const double mean = s / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
        if (t.name.find("_norm.") != std::string::npos) { EXPECT_EQ(mean, 1.0) << t.name; EXPECT_EQ(t.type, 0u); }
        else if (t.name.find(".bias") != std::string::npos) { EXPECT_EQ(s2, 0.0) << t.name; EXPECT_EQ(t.type, 0u); }
        else {
            EXPECT_EQ(t.type, (uint32_t)GGUF_TENSOR_BF16) << t.name;
            EXPECT_NEAR(mean, 0.0, 0.002) << t.name;
            EXPECT_NEAR(sd, 0.02, 0.001) << t.name;
        }
    }
    EXPECT_NE(run(tool("oomb-gguf-init") + " -o " + a, &log), 0); // no dimensions
}

// Nonsense values are refused (exit 1, a message naming the option), nothing is written.
TEST(Init, RejectsBadOptions) {
    REQUIRE_TOOLS();
    const std::string out = tmp_dir() + "/bad-init.gguf";
    const std::string init = tool("oomb-gguf-init") + " -o " + out + " ";
    const std::string ok = "--vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 2 ";
    std::string log;
    ASSERT_EQ(run(init + ok + "--kv-heads 1 -t 1", &log), 0) << log; // the base is fine
    unlink(out.c_str());
    const std::pair<std::string, const char*> cases[] = {
        {ok + "--init-std nan", "--init-std"},
        {ok + "--init-std -1", "--init-std"},
        {ok + "--init-std 0", "--init-std"},
        {ok + "--init-std inf", "--init-std"},
        {ok + "--rms-eps -1", "--rms-eps"},
        {ok + "--rms-eps 0", "--rms-eps"},
        {ok + "--rms-eps 1e-60", "--rms-eps"}, // 0 once stored as float32
        {ok + "--rope-theta 0", "--rope-theta"},
        {ok + "--rope-theta -10000", "--rope-theta"},
        {ok + "--rope-theta nan", "--rope-theta"},
        {ok + "-t 0", "--threads"},
        {ok + "-t -5", "--threads"},
        {ok + "-t 1025", "-t/--threads must be from 1 to 1024, not 1025"}, // the CPU backend's cap (was: none)
        // weights that would not be finite in the output type (were written as inf, exit 0)
        {ok + "--init-std 30000 --outtype f16", "--init-std 30000 is too large for --outtype f16"},
        {ok + "--init-std 1e38 --outtype f32", "--init-std 1e+38 is too large for --outtype f32"},
        {ok + "--init-std 1e38 --outtype bf16", "--init-std 1e+38 is too large for --outtype bf16"},
        // ... and weights that would all round to zero (were written as an all-zero model, exit 0)
        {ok + "--init-std 1e-9 --outtype f16", "--init-std 1e-09 is too small for --outtype f16"},
        {ok + "--init-std 1e-44 --outtype bf16", "is too small for --outtype bf16"},  // (printed as the float it is read into)
        {ok + "--kv-heads 0", "--kv-heads"},
        {ok + "--ctx 0", "--ctx"},
        {"--vocab-size 256 --ffn 96 --layers 1 --hidden 0 --heads 2", "--hidden"},
        {"--vocab-size 256 --ffn 96 --layers 1 --hidden -64 --heads 2", "--hidden"},
        {"--vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 0", "--heads"},
        {"--vocab-size 256 --ffn 96 --layers 0 --hidden 64 --heads 2", "--layers"},
        {"--vocab-size -1 --ffn 96 --layers 1 --hidden 64 --heads 2", "--vocab-size"},
        {"--vocab-size 256 --ffn 3000000000 --layers 1 --hidden 64 --heads 2", "--ffn"},
        {"--vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 3", "--hidden 64 is not a multiple of --heads 3"},
        {"--vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 4 --kv-heads 3", "--heads 4 is not a multiple of --kv-heads 3"},
        {"--vocab-size 256 --ffn 96 --layers 1 --hidden 6 --heads 2", "--hidden / --heads = 3 must be even"},
        {"--preset qwen2.5-0.5b --heads 7", "--heads 7 is not a multiple of --kv-heads 2"},
        {"--layers 2", "missing: --vocab-size --hidden --ffn --heads"},
    };
    for (auto& c : cases) {
        EXPECT_EQ(run(init + c.first, &log), 1) << c.first << ": " << log;
        EXPECT_NE(log.find(std::string("oomb-gguf-init: error: ")), std::string::npos) << c.first << ": " << log;
        EXPECT_NE(log.find(c.second), std::string::npos) << c.first << ": " << log;
        EXPECT_NE(access(out.c_str(), F_OK), 0) << c.first << ": wrote " << out;
    }
    // whole-number options take decimal whole numbers in their type's range (OOMB_TOOL_PARSE's checks): --seed -1 was
    // wrapped to 2^64 - 1, 0x10 read as hex
    for (const char* a : {"--seed -1", "--seed 0x10", "--seed 18446744073709551616", "--layers 1e3"}) {
        EXPECT_EQ(run(init + ok + a, &log), 1) << a << ": " << log;
        EXPECT_TRUE(log.find("is not a whole number") != std::string::npos || log.find("an empty value") != std::string::npos)
            << a << ": " << log;
        EXPECT_NE(access(out.c_str(), F_OK), 0) << a << ": wrote " << out;
    }
    EXPECT_EQ(run(init + ok + "--seed 18446744073709551615", &log), 0) << log;  // 2^64 - 1 is a seed
    unlink(out.c_str());
    // a std below the type's smallest normal value: written, with a warning (subnormal weights)
    EXPECT_EQ(run(init + ok + "--init-std 1e-5 --outtype f16", &log), 0) << log;
    EXPECT_NE(log.find("warning: --init-std 1e-05 is below f16's smallest normal value"), std::string::npos) << log;
    unlink(out.c_str());
    // the largest --init-std the error suggests is accepted (f32's was printed rounded up: 3.66684e+37, refused)
    for (const char* t : {"f16", "bf16", "f32"}) {
        EXPECT_EQ(run(init + ok + "--init-std 1e38 --outtype " + t, &log), 1) << log;
        const size_t at = log.find("(use at most ");
        ASSERT_NE(at, std::string::npos) << log;
        const std::string most = log.substr(at + 13, log.find(')', at) - at - 13);
        EXPECT_EQ(run(init + ok + "--init-std " + most + " --outtype " + t, &log), 0) << t << " --init-std " << most << ": " << log;
        unlink(out.c_str());
    }
    // The converter applies the same checks to config.json.
    const std::string dir = tmp_dir() + "/synthetic-bad-config";
    write_synthetic(dir, 64, 8, 16, 2, 1, false);
    const nlohmann::json good = nlohmann::json::parse(read_all(dir + "/config.json"));
    for (auto& c : {std::make_pair("rms_norm_eps", 0.0), std::make_pair("rope_theta", -1.0)}) {
        nlohmann::json cfg = good;
        cfg[c.first] = c.second;
        write_all(dir + "/config.json", cfg.dump());
        EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 1) << log;
        EXPECT_NE(log.find(c.first), std::string::npos) << log;
        EXPECT_NE(access(out.c_str(), F_OK), 0);
    }
    // a value that is not a number is named (it used to be dropped: another RoPE base or epsilon, silently), top level and
    // inside transformers 5's rope_parameters; null is unset (the default), as in transformers
    for (const char* key : {"rms_norm_eps", "rope_theta", "rope_parameters"}) {
        nlohmann::json cfg = good;
        if (std::string(key) == "rope_parameters") {
            cfg.erase("rope_theta");
            cfg[key] = {{"rope_type", "default"}, {"rope_theta", "abc"}};
        } else {
            cfg[key] = "abc";
        }
        write_all(dir + "/config.json", cfg.dump());
        EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 1) << key << ": " << log;
        EXPECT_NE(log.find("is not a number"), std::string::npos) << log;
        EXPECT_NE(log.find(std::string(key) == "rope_parameters" ? "rope_parameters.rope_theta" : key), std::string::npos) << log;
        EXPECT_NE(access(out.c_str(), F_OK), 0);
    }
    nlohmann::json cfg = good;
    cfg["rms_norm_eps"] = nullptr;
    write_all(dir + "/config.json", cfg.dump());
    EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 0) << "null: unset, the default: " << log;
    unlink(out.c_str());
}

// config.json's tie_word_embeddings false with no lm_head.weight in the checkpoint is a missing tensor (a lost shard), an
// error naming both (it used to become a tied model with a note: another output layer); without the key, a checkpoint
// with no lm_head.weight is tied, as before (transformers' own default ties).
TEST(Convert, UntiedConfigWithoutLmHeadIsAnError) {
    REQUIRE_TOOLS();
    const std::string dir = tmp_dir() + "/synthetic-untied-no-head", out = tmp_dir() + "/untied-no-head.gguf";
    write_synthetic(dir, 64, 8, 16, 2, 1, true);  // no lm_head.weight
    nlohmann::json cfg = nlohmann::json::parse(read_all(dir + "/config.json"));
    std::string log, err;
    cfg["tie_word_embeddings"] = false;
    write_all(dir + "/config.json", cfg.dump());
    EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 1) << log;
    EXPECT_NE(log.find("tie_word_embeddings"), std::string::npos) << log;
    EXPECT_NE(log.find("lm_head.weight"), std::string::npos) << log;
    EXPECT_NE(access(out.c_str(), F_OK), 0);
    for (const bool drop : {true, false}) {  // no key: tied with a note; true: tied
        if (drop) cfg.erase("tie_word_embeddings");
        else cfg["tie_word_embeddings"] = true;
        write_all(dir + "/config.json", cfg.dump());
        ASSERT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 0) << log;
        GGUFReader r;
        ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
        EXPECT_EQ(r.find_tensor("output.weight"), nullptr);
        unlink(out.c_str());
    }
}

// -t up to the cap: no more chunk buffers than the model has chunks (was: 2 MB per thread, 10 GB
// for -t 5000); the largest --init-std an f16 file takes gives finite weights.
TEST(Init, ThreadsCostOnlyWhatTheModelNeeds) {
    REQUIRE_TOOLS();
    const std::string out = tmp_dir() + "/init-threads.gguf";
    const std::string init = tool("oomb-gguf-init") + " -o " + out + " --vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 2 ";
    const long kb = peak_rss_kb(init + "-t 1024");
    ASSERT_GT(kb, 0) << "oomb-gguf-init -t 1024 failed";
    EXPECT_LT(kb, 200 * 1024) << "peak RSS " << kb << " KiB for a 40 KB model";
    // the largest stds the range check lets through: 7000 * 9.28 < 65504 (f16); 3.6e37 * 9.28 < 3.39e38 (f32 and bf16:
    // the sampler's factor sqrt(-2 ln s / s) is ~1e3 for the smallest s among this model's samples (2e10 at worst), and
    // was multiplied by the std first, so stds above ~1e35 overflowed to inf in the generator and failed while writing)
    for (const char* a : {"--init-std 7000 --outtype f16", "--init-std 3.6e37 --outtype f32", "--init-std 3.6e37 --outtype bf16",
                          "--init-std 1e36 --outtype f32"}) {
        std::string log, err;
        ASSERT_EQ(run(init + "-t 4 " + a, &log), 0) << a << ": " << log;
        GGUFReader r;
        ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
        size_t n = 0, big = 0;
        for (auto& t : r.tensors()) {
            std::vector<float> v;
            ASSERT_EQ(r.read_tensor_f32(t.name, &v, &err), GGUF_OK) << err;
            for (float x : v) n += !std::isfinite(x), big += std::fabs(x) > 1e30f;
        }
        EXPECT_EQ(n, 0u) << a;
        if (std::string(a).find("e3") != std::string::npos) EXPECT_GT(big, 1000u) << a << ": the std was applied";
    }
}

// The free space of the output's file system is checked before the data is written (a
// 140,042 GB model used to start writing). The file size limit makes a run without the check
// fail fast (SIGXFSZ) instead of filling the disk.
TEST(Init, RefusesAModelLargerThanTheFreeDiskSpace) {
    REQUIRE_TOOLS();
    const std::string out = tmp_dir() + "/huge.gguf";
    std::string log;
    EXPECT_EQ(run("ulimit -f 65536; " + tool("oomb-gguf-init") + " -o " + out +
                      " --vocab-size 1000000 --hidden 16384 --ffn 1000000 --layers 200 --heads 128 -t 2", &log), 1) << log;
    EXPECT_NE(log.find("needs"), std::string::npos) << log;
    EXPECT_NE(log.find("GB free"), std::string::npos) << log;
    EXPECT_NE(access(out.c_str(), F_OK), 0);
    EXPECT_EQ(run("ls " + tmp_dir() + " | grep -c 'huge.gguf.tmp'", &log), 1) << "temporary file left: " << log;
}

// An output that is one of the tool's inputs (also through a symbolic or a hard link) is refused
// before any work, and the input is left as it was: the output is renamed over its path at the end,
// so it used to replace the source weights or config.json (exit 0).
TEST(Tools, OutputThatIsAnInputIsRefused) {
    REQUIRE_TOOLS();
    const std::string dir = tmp_dir() + "/own-input";
    ASSERT_EQ(run("rm -rf '" + dir + "' && cp -r '" + oombtest::fixture_path("qwen2-micro") + "' '" + dir + "'"), 0);
    ASSERT_EQ(symlink((dir + "/model.safetensors").c_str(), (tmp_dir() + "/own-link.safetensors").c_str()), 0);
    ASSERT_EQ(link((dir + "/config.json").c_str(), (tmp_dir() + "/own-hard.json").c_str()), 0);
    write_all(dir + "/tokenizer.json", read_all(oombtest::fixture_path("qwen-tokenizer/tokenizer.json")));
    const std::string weights = read_all(dir + "/model.safetensors"), config = read_all(dir + "/config.json");
    std::string log;
    for (const std::string out : {dir + "/model.safetensors", dir + "/config.json", dir + "/tokenizer.json",
                                  dir + "/../own-input/model.safetensors", tmp_dir() + "/own-link.safetensors",
                                  tmp_dir() + "/own-hard.json"}) {
        EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 1) << out << ": " << log;
        EXPECT_NE(log.find("oomb-convert-hf: error: -o/--output " + out + " is the input " + dir + "/"), std::string::npos)
            << out << ": " << log;
    }
    EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " --vocab-only -o " + dir + "/tokenizer.json", &log), 1) << log;
    EXPECT_NE(log.find("is the input"), std::string::npos) << log;
    EXPECT_TRUE(read_all(dir + "/model.safetensors") == weights);
    EXPECT_EQ(read_all(dir + "/config.json"), config);
    unlink((dir + "/tokenizer.json").c_str());  // (Qwen's 151k tokens do not fit the fixture's 4096 rows)
    ASSERT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + dir + "/model.gguf", &log), 0) << log;  // beside them: fine
    // a shard named by the index
    const std::string sh = tmp_dir() + "/own-input-sharded";
    write_synthetic(sh, 64, 8, 16, 2, 1, false);
    ASSERT_EQ(rename((sh + "/model.safetensors").c_str(), (sh + "/weights-1.safetensors").c_str()), 0);
    SafetensorsFile f;
    std::string err;
    ASSERT_EQ(f.open(sh + "/weights-1.safetensors", &err), GGUF_OK) << err;
    nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
    for (auto& t : f.tensors()) index["weight_map"][t.name] = "weights-1.safetensors";
    write_all(sh + "/model.safetensors.index.json", index.dump());
    EXPECT_EQ(run(tool("oomb-convert-hf") + " " + sh + " -o " + sh + "/weights-1.safetensors", &log), 1) << log;
    EXPECT_NE(log.find("is the input " + sh + "/weights-1.safetensors"), std::string::npos) << log;
    EXPECT_EQ(run(tool("oomb-convert-hf") + " " + sh + " -o " + sh + "/model.safetensors.index.json", &log), 1) << log;
    EXPECT_NE(log.find("is the input"), std::string::npos) << log;
    // oomb-gguf-init reads --vocab
    const std::string vocab = tmp_dir() + "/own-vocab.gguf";
    write_all(vocab, read_all(oombtest::source_dir() + "/models/qwen2.5-vocab.gguf"));
    const std::string before = read_all(vocab);
    EXPECT_EQ(run(tool("oomb-gguf-init") + " --vocab-size 151936 --hidden 64 --ffn 96 --layers 1 --heads 2 --vocab " + vocab +
                      " -o " + vocab, &log), 1) << log;
    EXPECT_NE(log.find("-o/--output " + vocab + " is the input " + vocab), std::string::npos) << log;
    EXPECT_TRUE(read_all(vocab) == before);
}

// An unknown option is named even when a required one is missing too (was: "--output is required",
// which hides the misspelt --ouput); exit 1.
TEST(Tools, UnknownOptionNamedBeforeMissingRequired) {
    REQUIRE_TOOLS();
    std::string log;
    const std::string micro = oombtest::fixture_path("qwen2-micro");
    const std::pair<std::string, const char*> cases[] = {{tool("oomb-convert-hf") + " " + micro + " --ouput x.gguf", "--ouput"},
                                                         {tool("oomb-convert-hf") + " --bogus", "--bogus"},
                                                         {tool("oomb-gguf-dump") + " --bogus", "--bogus"},
                                                         {tool("oomb-tokenize") + " -m x.gguf --bogus", "--bogus"},
                                                         {tool("oomb-gguf-init") + " --bogus", "--bogus"},
                                                         {tool("oomb-export") + " -m x.gguf --bogus", "--bogus"}};
    for (auto& c : cases) {
        if (c.first.find("oomb-export") != std::string::npos && access(tool("oomb-export").c_str(), X_OK) != 0) continue;
        EXPECT_EQ(run(c.first, &log), 1) << c.first << ": " << log;
        EXPECT_NE(log.find("not expected: "), std::string::npos) << c.first << ": " << log;
        EXPECT_NE(log.find(c.second), std::string::npos) << c.first << ": " << log;
        EXPECT_EQ(log.find("is required"), std::string::npos) << c.first << ": " << log;
    }
    // the threads option of oomb-export has the same cap as the others
    if (access(tool("oomb-export").c_str(), X_OK) == 0) {
        EXPECT_EQ(run(tool("oomb-export") + " -m x.gguf --out-type f16 -o y.gguf -t 1025", &log), 1) << log;
        EXPECT_NE(log.find("-t/--threads must be from 1 to 1024"), std::string::npos) << log;
    }
}

TEST(Tools, TokenizeDecodeAndDump) {
    REQUIRE_TOOLS();
    const std::string vocab = oombtest::source_dir() + "/models/qwen2.5-vocab.gguf";
    const std::string text = tmp_dir() + "/t.txt", ids = tmp_dir() + "/ids.txt", back = tmp_dir() + "/back.txt";
    const std::string content = "<|im_start|>user\nHi there \xF0\x9F\x99\x82<|im_end|>\n";
    write_all(text, content);
    std::string out;
    ASSERT_EQ(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + text + " > " + ids), 0);
    EXPECT_EQ(read_all(ids), "151644 872 198 13048 1052 27484 151645 198\n");
    ASSERT_EQ(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + ids + " --decode > " + back), 0);
    EXPECT_EQ(read_all(back), content);
    write_all(ids, "9707 abc");
    EXPECT_NE(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + ids + " --decode", &out), 0);
    EXPECT_NE(out.find("not a token id"), std::string::npos) << out;
    write_all(ids, "9707 999999");
    EXPECT_NE(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + ids + " --decode", &out), 0);
    EXPECT_NE(out.find("999999"), std::string::npos) << out;
    EXPECT_NE(run(tool("oomb-tokenize") + " -m /nonexistent.gguf -f " + text, &out), 0);
    EXPECT_NE(out.find("/nonexistent.gguf"), std::string::npos) << out;
    const std::string model = tmp_dir() + "/dump-micro.gguf";
    ASSERT_EQ(run(tool("oomb-convert-hf") + " " + oombtest::fixture_path("qwen2-micro") + " -o " + model, &out), 0) << out;
    ASSERT_EQ(run(tool("oomb-gguf-dump") + " " + model, &out), 0) << out;
    EXPECT_NE(out.find("token_embd.weight"), std::string::npos);
    EXPECT_NE(out.find("qwen2.attention.head_count_kv"), std::string::npos);
    EXPECT_NE(out.find("BF16"), std::string::npos);
    ASSERT_EQ(run(tool("oomb-gguf-dump") + " --json " + model + " > " + tmp_dir() + "/dump.json", &out), 0) << out;
    nlohmann::json j = nlohmann::json::parse(read_all(tmp_dir() + "/dump.json"));
    EXPECT_EQ(j["metadata"]["qwen2.block_count"]["value"], 2);
    EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
    EXPECT_EQ(j["tensors"][0]["ne"], nlohmann::json({128, 4096}));
    EXPECT_NE(run(tool("oomb-gguf-dump") + " " + text, &out), 0);
    EXPECT_NE(out.find("bad magic"), std::string::npos) << out;
}

TEST(Tools, TokenizeRejectsBadInput) {
    REQUIRE_TOOLS();
    const std::string vocab = oombtest::source_dir() + "/models/qwen2.5-vocab.gguf";
    const std::string tok = tool("oomb-tokenize") + " -m " + vocab;
    const std::string ids = tmp_dir() + "/bad-ids.txt";
    std::string out;
    write_all(ids, "9707 5\n");
    ASSERT_EQ(run(tok + " -f " + ids + " --decode", &out), 0) << out;
    // Only plain decimal ids: a sign, a hex prefix or trailing letters are errors naming the token.
    for (const char* bad : {"+5", "-5", "0x10", "5a", "1e3", "+0"}) {
        write_all(ids, std::string("9707 ") + bad + " 5\n");
        EXPECT_EQ(run(tok + " -f " + ids + " --decode", &out), 1) << bad << ": " << out;
        EXPECT_NE(out.find(std::string("not a token id: '") + bad + "'"), std::string::npos) << bad << ": " << out;
        EXPECT_NE(out.find("byte 5"), std::string::npos) << bad << ": " << out;
    }
    write_all(ids, "99999999999\n");
    EXPECT_EQ(run(tok + " -f " + ids + " --decode", &out), 1) << out;
    EXPECT_NE(out.find("'99999999999' is out of range"), std::string::npos) << out;
    // A directory as the input or the model says so (was: "read error").
    EXPECT_EQ(run(tok + " -f " + tmp_dir(), &out), 1) << out;
    EXPECT_NE(out.find(tmp_dir() + ": is a directory"), std::string::npos) << out;
    EXPECT_EQ(run(tok + " -f " + tmp_dir() + " --decode", &out), 1) << out;
    EXPECT_NE(out.find("is a directory"), std::string::npos) << out;
    EXPECT_EQ(run(tool("oomb-tokenize") + " -m " + tmp_dir() + " -f " + ids, &out), 1) << out;
    EXPECT_NE(out.find(tmp_dir() + ": is a directory"), std::string::npos) << out;
    // A model file cut short in its header says it is truncated.
    const std::string cut = tmp_dir() + "/cut.gguf";
    write_all(cut, read_all(vocab).substr(0, 100));
    EXPECT_EQ(run(tool("oomb-tokenize") + " -m " + cut + " -f " + ids, &out), 1) << out;
    EXPECT_NE(out.find("truncated"), std::string::npos) << out;
    EXPECT_EQ(out.find("absurd"), std::string::npos) << out;
    EXPECT_NE(run(tool("oomb-gguf-dump") + " " + cut, &out), 0) << out;
    EXPECT_NE(out.find("file is truncated"), std::string::npos) << out;
}

// config.json values of another JSON type than the key's (review s29: json::value threw and the converter aborted, exit
// 134) are errors naming the key; tokenizer_config.json's chat_template as HF's list of named templates is written as
// llama.cpp's converter writes it (was: dropped silently), and any other form is an error.
TEST(Convert, ConfigTypesAndNamedChatTemplates) {
    REQUIRE_TOOLS();
    const std::string dir = tmp_dir() + "/synthetic-types", out = tmp_dir() + "/types.gguf";
    write_synthetic(dir, 64, 8, 16, 2, 1, false);
    const nlohmann::json good = nlohmann::json::parse(read_all(dir + "/config.json"));
    std::string log, err;
    const std::pair<const char*, nlohmann::json> bad[] = {{"tie_word_embeddings", "true"}, {"tie_word_embeddings", 1},
                                                          {"use_sliding_window", "no"}, {"model_type", 5}};
    for (const auto& b : bad) {
        nlohmann::json cfg = good;
        cfg[b.first] = b.second;
        write_all(dir + "/config.json", cfg.dump());
        EXPECT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 1) << b.first << ": " << log;
        EXPECT_NE(log.find(std::string("'") + b.first + "' is not a"), std::string::npos) << log;
        EXPECT_EQ(log.find("terminate"), std::string::npos) << log;
        EXPECT_NE(access(out.c_str(), F_OK), 0);
    }
    // rope_theta in both spellings with different values: an error naming both (equal values: accepted)
    for (const double rp : {1e6, 10000.0}) {
        nlohmann::json cfg = good;
        cfg["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rp}};
        write_all(dir + "/config.json", cfg.dump());
        const int rc = run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log);
        if (rp != 10000.0) {
            EXPECT_EQ(rc, 1) << log;
            EXPECT_NE(log.find("differ"), std::string::npos) << log;
        } else {
            EXPECT_EQ(rc, 0) << log;
        }
        unlink(out.c_str());
    }
    // tie_word_embeddings true over a checkpoint whose lm_head.weight is another matrix: converted tied (as transformers
    // loads it), with a warning (was: a note only; the model's output layer changed silently)
    {
        nlohmann::json cfg = good;
        cfg["tie_word_embeddings"] = true;
        write_all(dir + "/config.json", cfg.dump());
        ASSERT_EQ(run(tool("oomb-convert-hf") + " " + dir + " -o " + out, &log), 0) << log;
        EXPECT_NE(log.find("warning: lm_head.weight differs from model.embed_tokens.weight"), std::string::npos) << log;
        unlink(out.c_str());
    }
    write_all(dir + "/config.json", good.dump());
    // the tokenizer with a list of named chat templates
    const std::string tok = tmp_dir() + "/named-templates";
    mkdir(tok.c_str(), 0755);
    write_all(tok + "/tokenizer.json", read_all(oombtest::fixture_path("qwen-tokenizer/tokenizer.json")));
    nlohmann::json tc = nlohmann::json::parse(read_all(oombtest::fixture_path("qwen-tokenizer/tokenizer_config.json")));
    tc["chat_template"] = {{{"name", "default"}, {"template", "{{ messages }}"}}, {{"name", "tool_use"}, {"template", "{{ tools }}"}}};
    write_all(tok + "/tokenizer_config.json", tc.dump());
    ASSERT_EQ(run(tool("oomb-convert-hf") + " --vocab-only " + tok + " -o " + out, &log), 0) << log;
    GGUFReader r;
    ASSERT_EQ(r.open(out, &err), GGUF_OK) << err;
    std::string v;
    ASSERT_EQ(r.get_string("tokenizer.chat_template", &v, &err), GGUF_OK) << err;
    EXPECT_EQ(v, "{{ messages }}");
    ASSERT_EQ(r.get_string("tokenizer.chat_template.tool_use", &v, &err), GGUF_OK) << err;
    EXPECT_EQ(v, "{{ tools }}");
    unlink(out.c_str());
    for (const nlohmann::json& ct : {nlohmann::json(5), nlohmann::json::array({{{"name", "default"}}})}) {
        tc["chat_template"] = ct;
        write_all(tok + "/tokenizer_config.json", tc.dump());
        EXPECT_EQ(run(tool("oomb-convert-hf") + " --vocab-only " + tok + " -o " + out, &log), 1) << ct.dump() << ": " << log;
        EXPECT_NE(log.find("chat_template"), std::string::npos) << log;
        EXPECT_NE(access(out.c_str(), F_OK), 0);
    }
}

// Options that another one makes meaningless are refused, not ignored (--decode reads ids, not JSON lines; --data only
// adds to --json's output); an output in a missing folder names that folder, not the writer's temporary file.
TEST(Tools, ConflictingOptionsAndMissingOutputFolder) {
    REQUIRE_TOOLS();
    const std::string vocab = oombtest::source_dir() + "/models/qwen2.5-vocab.gguf";
    const std::string ids = tmp_dir() + "/conflict-ids.txt";
    write_all(ids, "9707 5\n");
    std::string out;
    EXPECT_EQ(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + ids + " --decode --jsonl", &out), 1) << out;
    EXPECT_NE(out.find("--jsonl"), std::string::npos) << out;
    EXPECT_NE(out.find("--decode"), std::string::npos) << out;
    EXPECT_EQ(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + ids + " -t 2", &out), 1) << out;  // -t encodes --jsonl lines only
    EXPECT_NE(out.find("--jsonl"), std::string::npos) << out;
    // --jsonl: a blank line gives an empty line of ids, so output line N is input line N (was: skipped)
    const std::string jl = tmp_dir() + "/blank.jsonl";
    write_all(jl, "\"a\"\n\n\"b\"\n");
    EXPECT_EQ(run(tool("oomb-tokenize") + " -m " + vocab + " -f " + jl + " --jsonl -t 2", &out), 0) << out;
    EXPECT_EQ(out, "64\n\n65\n");
    EXPECT_EQ(run(tool("oomb-gguf-dump") + " " + vocab + " --data", &out), 1) << out;
    EXPECT_NE(out.find("--json"), std::string::npos) << out;
    EXPECT_EQ(run(tool("oomb-gguf-dump") + " " + vocab + " --data --json > /dev/null", &out), 0) << out;
    // output that cannot be written is an error (was: exit 0 with the output cut short)
    if (access("/dev/full", W_OK) == 0) {
        for (const char* a : {"", " --json"}) {
            EXPECT_EQ(run("(" + tool("oomb-gguf-dump") + " " + vocab + a + " > /dev/full)", &out), 1) << a << ": " << out;
            EXPECT_NE(out.find("cannot write output"), std::string::npos) << out;
        }
    }
    // a file-size limit (ulimit -f, SIGXFSZ at its default): an error naming the output and no temporary file left (was:
    // killed by SIGXFSZ mid-write, exit 153, its OUT.tmp.<pid> left behind)
    {
        const std::string fdir = tmp_dir() + "/fsize";
        mkdir(fdir.c_str(), 0755);
        EXPECT_EQ(run("(trap - XFSZ; ulimit -f 100; " + tool("oomb-convert-hf") + " " + oombtest::fixture_path("qwen2-micro") + " -o " + fdir +
                          "/m.gguf)", &out), 1) << out;
        EXPECT_NE(out.find("cannot write " + fdir + "/m.gguf: File too large"), std::string::npos) << out;
        DIR* d = opendir(fdir.c_str());
        ASSERT_TRUE(d);
        while (dirent* e = readdir(d)) EXPECT_EQ(std::string(e->d_name).find(".tmp."), std::string::npos) << e->d_name;
        closedir(d);
    }
    const std::string missing = tmp_dir() + "/no-such-folder";
    EXPECT_EQ(run(tool("oomb-gguf-init") + " -o " + missing + "/x.gguf --vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 2",
                  &out), 1) << out;
    EXPECT_NE(out.find("its folder " + missing + " does not exist"), std::string::npos) << out;
    EXPECT_EQ(out.find(".tmp."), std::string::npos) << out;
    EXPECT_EQ(run(tool("oomb-gguf-init") + " -o " + ids + "/x.gguf --vocab-size 256 --ffn 96 --layers 1 --hidden 64 --heads 2",
                  &out), 1) << out;
    EXPECT_NE(out.find(ids + " is not a folder"), std::string::npos) << out;
}

TEST(Safetensors, RoundTripDtypesAndConversions) {
    const std::string path = tmp_dir() + "/st.safetensors";
    SafetensorsWriter w;
    const float f32[] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-8f, -7.0f};
    const double f64[] = {1.0 / 3.0, -1e300};
    const uint16_t f16[] = {fp32_to_fp16(0.5f), fp32_to_fp16(-65504.0f)};
    const uint16_t bf16[] = {fp32_to_bf16(3.0f), fp32_to_bf16(-0.125f), fp32_to_bf16(1e30f)};
    const int32_t i32[] = {-5, 7};
    const int64_t i64[] = {1ll << 40, -3};
    std::string err;
    ASSERT_EQ(w.add_f32("a.f32", {2, 3}, f32), GGUF_OK);
    ASSERT_EQ(w.add("b.f64", SafetensorsDtype::F64, {2}, f64), GGUF_OK);
    ASSERT_EQ(w.add("c.f16", SafetensorsDtype::F16, {2, 1}, f16), GGUF_OK);
    ASSERT_EQ(w.add("d.bf16", SafetensorsDtype::BF16, {3}, bf16), GGUF_OK);
    ASSERT_EQ(w.add("e.i32", SafetensorsDtype::I32, {2}, i32), GGUF_OK);
    ASSERT_EQ(w.add("f.i64", SafetensorsDtype::I64, {1, 2}, i64), GGUF_OK);
    ASSERT_EQ(w.add("g.empty", SafetensorsDtype::F32, {0, 3}, nullptr), GGUF_OK);
    EXPECT_EQ(w.add("a.f32", SafetensorsDtype::F32, {1}, f32, &err), GGUF_ERR_ARG);
    w.set_metadata("format", "pt");
    ASSERT_EQ(w.write(path, &err), GGUF_OK) << err;
    SafetensorsFile f;
    ASSERT_EQ(f.open(path, &err), GGUF_OK) << err;
    EXPECT_EQ(f.tensors().size(), 7u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    std::vector<float> v;
    std::vector<double> d;
    const SafetensorsTensor* t = f.find("a.f32");
    ASSERT_TRUE(t);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(safetensors_read_f32(*t, &v, &err), GGUF_OK);
    EXPECT_EQ(v, std::vector<float>(f32, f32 + 6));
    ASSERT_EQ(safetensors_read_f64(*f.find("b.f64"), &d, &err), GGUF_OK);
    EXPECT_EQ(d, std::vector<double>(f64, f64 + 2));
    ASSERT_EQ(safetensors_read_f32(*f.find("c.f16"), &v, &err), GGUF_OK);
    EXPECT_EQ(v, (std::vector<float>{0.5f, -65504.0f}));
    ASSERT_EQ(safetensors_read_f32(*f.find("d.bf16"), &v, &err), GGUF_OK);
    EXPECT_EQ(v, (std::vector<float>{3.0f, -0.125f, bf16_to_fp32(fp32_to_bf16(1e30f))}));
    ASSERT_EQ(safetensors_read_f64(*f.find("e.i32"), &d, &err), GGUF_OK);
    EXPECT_EQ(d, (std::vector<double>{-5, 7}));
    ASSERT_EQ(safetensors_read_f64(*f.find("f.i64"), &d, &err), GGUF_OK);
    EXPECT_EQ(d, (std::vector<double>{(double)(1ll << 40), -3}));
    EXPECT_EQ(f.find("g.empty")->numel(), 0);
    // The fixtures read: reference logits are f32, the loss f64.
    SafetensorsFile ref;
    ASSERT_EQ(ref.open(oombtest::fixture_path("qwen2-micro/reference-short.safetensors"), &err), GGUF_OK) << err;
    ASSERT_TRUE(ref.find("loss"));
    EXPECT_EQ(ref.find("loss")->dtype, SafetensorsDtype::F64);
    EXPECT_EQ(ref.find("input_ids")->dtype, SafetensorsDtype::I32);
    EXPECT_EQ(ref.find("input_ids")->shape, (std::vector<int64_t>{2, 64}));
}

TEST(Safetensors, MalformedFiles) {
    const std::string path = tmp_dir() + "/bad.safetensors";
    auto make = [&](const std::string& header, const std::string& data) {
        std::string s;
        uint64_t n = header.size();
        s.append((const char*)&n, 8);
        write_all(path, s + header + data);
    };
    auto expect = [&](gguf_status want, const std::string& substr) {
        SafetensorsFile f;
        std::string err;
        EXPECT_EQ(f.open(path, &err), want) << err;
        EXPECT_NE(err.find(substr), std::string::npos) << "message was: " << err;
    };
    write_all(path, "abc");
    expect(GGUF_ERR_FORMAT, "truncated");
    write_all(path, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}");
    expect(GGUF_ERR_FORMAT, "absurd");
    make("{\"a\": ", "");
    expect(GGUF_ERR_FORMAT, "not a JSON object");
    make(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "xx");
    expect(GGUF_ERR_UNSUPPORTED, "U8");
    make(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "1234");
    expect(GGUF_ERR_FORMAT, "outside");
    make(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678");
    expect(GGUF_ERR_FORMAT, "needs 12");
    make(R"({"a": {"dtype": "F32", "shape": [-3], "data_offsets": [0, 8]}})", "12345678");
    expect(GGUF_ERR_FORMAT, "negative");
    make(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
         "12345678");
    expect(GGUF_ERR_FORMAT, "overlap");
    make(R"({"a": {"dtype": "F32", "shape": [2]}})", "12345678");
    expect(GGUF_ERR_FORMAT, "data_offsets");
    make(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", "12345678");
    expect(GGUF_ERR_FORMAT, "overflows");
    SafetensorsFile f;
    std::string err;
    EXPECT_EQ(f.open("/nonexistent.safetensors", &err), GGUF_ERR_IO);
    SafetensorsModel m;
    EXPECT_EQ(m.open(tmp_dir(), &err), GGUF_ERR_NOT_FOUND);
}
