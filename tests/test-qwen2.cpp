// Qwen2 parity with HF transformers (float64 references in the fixtures) through the OOMB
// chunk-recurrent trainer on the CPU: loss, logits, hidden states and every parameter gradient,
// for whole-sequence chunks and for chunked runs (chunk not a multiple of the page included).
#include "test-common.h"

#include "gguf.h"
#include "qwen2.h"
#include "safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

using namespace oomb;

namespace {

std::string tmp_dir() {
    static std::string dir;
    if (dir.empty()) {
        char tmpl[] = "/tmp/oomb-test-qwen2-XXXXXX";
        const char * d = mkdtemp(tmpl);
        if (!d) throw std::runtime_error("mkdtemp failed");
        dir = d;
    }
    return dir;
}

// Converts a fixture's HF folder to GGUF with oomb-convert-hf (once per model and type).
std::string converted(const std::string & model, const std::string & outtype = "") {
    static std::map<std::string, std::string> done;
    const std::string key = model + outtype;
    if (done.count(key)) return done[key];
    const std::string out = tmp_dir() + "/" + model + (outtype.empty() ? "" : "-" + outtype) + ".gguf";
    std::string cmd = oombtest::bin_dir() + "/oomb-convert-hf " + oombtest::fixtures_dir() + "/" + model + " -o " + out;
    if (!outtype.empty()) cmd += " --outtype " + outtype;
    cmd += " > " + out + ".log 2>&1";
    if (system(cmd.c_str()) != 0) throw std::runtime_error("conversion failed: " + cmd);
    done[key] = out;
    return out;
}

// HF parameter name -> GGUF tensor name.
std::string hf_to_gguf(const std::string & hf) {
    static const std::pair<const char *, const char *> layer_map[] = {
        {"input_layernorm.weight", "attn_norm.weight"},   {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},         {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.k_proj.bias", "attn_k.bias"},         {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.v_proj.bias", "attn_v.bias"},         {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},          {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    const std::string pre = "model.layers.";
    if (hf.rfind(pre, 0) == 0) {
        const size_t dot = hf.find('.', pre.size());
        const std::string n = hf.substr(pre.size(), dot - pre.size());
        const std::string rest = hf.substr(dot + 1);
        for (auto & kv : layer_map) if (rest == kv.first) return "blk." + n + "." + kv.second;
    }
    return "";
}

double rel_err(const std::vector<float> & a, const std::vector<double> & ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = (double) a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (!(num == num)) return INFINITY;
    return std::sqrt(num / std::max(den, 1e-300));
}

struct Reference {
    SafetensorsFile f;
    int64_t B = 0, T = 0;
    std::vector<int32_t> ids;
    double loss = 0;
    explicit Reference(const std::string & path) {
        std::string err;
        if (f.open(path, &err) != GGUF_OK) throw std::runtime_error(err);
        const SafetensorsTensor * t = f.find("input_ids");
        B = t->shape[0];
        T = t->shape[1];
        std::vector<double> v;
        safetensors_read_f64(*t, &v, &err);
        for (double x : v) ids.push_back((int32_t) x);
        std::vector<double> l;
        safetensors_read_f64(*f.find("loss"), &l, &err);
        loss = l[0];
    }
    std::vector<double> get(const std::string & name) const {
        const SafetensorsTensor * t = f.find(name);
        if (!t) throw std::runtime_error("reference has no " + name);
        std::vector<double> v;
        std::string err;
        safetensors_read_f64(*t, &v, &err);
        return v;
    }
};

struct ModelRun {
    std::unique_ptr<Qwen2Model> model;
    std::vector<oomb_tensor *> params;
    oomb_backend_t cpu = nullptr;
    ModelRun(const std::string & gguf) {
        cpu = oomb_backend_cpu_init(2);
        std::string err;
        model = qwen2_load_gguf(gguf, cpu, OOMB_TYPE_F32, &err);
        if (!model) throw std::runtime_error(err);
        params = qwen2_set_trainable(*model, Qwen2Trainable::All);
    }
    ~ModelRun() {
        model.reset();
        oomb_backend_free(cpu);
    }
};

// One forward/backward over every sequence of the reference; checks loss and all gradients.
void check_gradients(const std::string & model_name, const std::string & ref_name, int64_t chunk, int page) {
    SCOPED_TRACE(model_name + " " + ref_name + " chunk " + std::to_string(chunk) + " page " + std::to_string(page));
    Reference ref(oombtest::fixtures_dir() + "/" + model_name + "/reference-" + ref_name + ".safetensors");
    ModelRun run(converted(model_name));
    ChunkTrainerParams tp;
    tp.chunk = chunk;
    tp.page = page;
    tp.max_tokens = ref.T;
    ChunkTrainer tr(*run.model, tp);
    double loss_sum = 0;
    int64_t count = 0;
    for (int64_t b = 0; b < ref.B; b++) {
        ChunkStats st = tr.forward_backward(ref.ids.data() + b * ref.T, ref.T);
        loss_sum += st.loss_sum;
        count += st.n_targets;
    }
    ASSERT_EQ(count, ref.B * (ref.T - 1));
    const double loss = loss_sum / count;
    EXPECT_LT(std::fabs(loss - ref.loss) / ref.loss, 1e-5) << "loss " << loss << " vs reference " << ref.loss;

    int checked = 0;
    for (const auto & t : ref.f.tensors()) {
        if (t.name.rfind("grad.", 0) != 0) continue;
        const std::string gname = hf_to_gguf(t.name.substr(5));
        ASSERT_FALSE(gname.empty()) << "unmapped reference gradient " << t.name;
        oomb_tensor * p = run.model->find(gname);
        ASSERT_NE(p, nullptr) << gname;
        ASSERT_NE(p->grad, nullptr) << gname;
        std::vector<float> g((size_t) oomb_nelements(p));
        oomb_tensor_get(p->grad, g.data(), 0, g.size() * 4);
        for (float & x : g) x /= (float) count;
        const std::vector<double> r = ref.get(t.name);
        ASSERT_EQ(r.size(), g.size()) << gname;
        const double e = rel_err(g, r);
        EXPECT_LT(e, 1e-4) << "gradient of " << gname << " (" << t.name << ") relative error " << e;
        checked++;
    }
    EXPECT_EQ(checked, (int) run.params.size()) << "every parameter has a reference gradient";
}

TEST(Qwen2Parity, MicroShortForwardLogitsHidden) {
    for (const std::string model_name : {"qwen2-micro", "qwen2-mini"}) {
        SCOPED_TRACE(model_name);
        Reference ref(oombtest::fixtures_dir() + "/" + model_name + "/reference-short.safetensors");
        ModelRun run(converted(model_name));
        ChunkTrainerParams tp;
        tp.chunk = ref.T;
        tp.page = 16;
        tp.max_tokens = ref.T;
        ChunkTrainer tr(*run.model, tp);
        tr.set_capture_hidden(true);
        const int64_t V = run.model->cfg.n_vocab, E = run.model->cfg.n_embd, L = run.model->cfg.n_layer;
        const std::vector<double> logits = ref.get("logits");
        double loss_sum = 0;
        int64_t count = 0;
        for (int64_t b = 0; b < ref.B; b++) {
            ChunkStats st = tr.forward(ref.ids.data() + b * ref.T, ref.T);
            loss_sum += st.loss_sum;
            count += st.n_targets;
            std::vector<double> lr(logits.begin() + b * ref.T * V, logits.begin() + (b + 1) * ref.T * V);
            EXPECT_LT(rel_err(tr.logits(), lr), 1e-5) << "logits of sequence " << b;
            for (int k = 0; k <= L; k++) {
                const std::vector<double> h = ref.get("hidden_states." + std::to_string(k));
                std::vector<double> hr(h.begin() + b * ref.T * E, h.begin() + (b + 1) * ref.T * E);
                EXPECT_LT(rel_err(tr.hidden(k), hr), 1e-5) << "hidden state " << k << " of sequence " << b;
            }
        }
        EXPECT_LT(std::fabs(loss_sum / count - ref.loss) / ref.loss, 1e-5);
    }
}

TEST(Qwen2Parity, MicroShortGradients) { check_gradients("qwen2-micro", "short", 64, 16); }
TEST(Qwen2Parity, MiniShortGradients) { check_gradients("qwen2-mini", "short", 64, 16); }
TEST(Qwen2Parity, MiniShortGradientsChunked) { check_gradients("qwen2-mini", "short", 24, 16); }
TEST(Qwen2Parity, MicroShortGradientsTinyChunks) { check_gradients("qwen2-micro", "short", 7, 4); }

// The long reference (4096 tokens) through chunk 512 / page 64, a chunk that is not a multiple of
// the page (1000), and chunk = sequence.
TEST(Qwen2Parity, MicroLongChunk512) { check_gradients("qwen2-micro", "long", 512, 64); }
TEST(Qwen2Parity, MicroLongChunk1000) { check_gradients("qwen2-micro", "long", 1000, 64); }
TEST(Qwen2Parity, MicroLongWholeSequence) { check_gradients("qwen2-micro", "long", 4096, 64); }

TEST(Qwen2Parity, MicroLongLastLogits) {
    Reference ref(oombtest::fixtures_dir() + "/qwen2-micro/reference-long.safetensors");
    ModelRun run(converted("qwen2-micro"));
    ChunkTrainerParams tp;
    tp.chunk = 512;
    tp.page = 64;
    tp.max_tokens = ref.T;
    ChunkTrainer tr(*run.model, tp);
    tr.set_capture_hidden(true);
    ChunkStats st = tr.forward(ref.ids.data(), ref.T);
    EXPECT_LT(std::fabs(st.loss_sum / st.n_targets - ref.loss) / ref.loss, 1e-5);
    const int64_t V = run.model->cfg.n_vocab;
    const std::vector<float> lg = tr.logits();  // last chunk: 512 tokens
    std::vector<float> last8(lg.end() - 8 * V, lg.end());
    EXPECT_LT(rel_err(last8, ref.get("logits_last8")), 1e-5);
}

// Activation memory does not grow with the sequence: the chunk graph's plan is the same at 4K and 64K.
TEST(Qwen2Memory, PlannedPeakIndependentOfContext) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    Qwen2Config c;
    ASSERT_TRUE(qwen2_preset("tiny", &c));
    c.n_vocab = 512;
    auto m = qwen2_create(c, cpu, OOMB_TYPE_F32);
    qwen2_set_trainable(*m, Qwen2Trainable::All);
    size_t planned[2];
    const int64_t ctxs[2] = {4096, 65536};
    for (int i = 0; i < 2; i++) {
        ChunkTrainerParams tp;
        tp.chunk = 256;
        tp.page = 64;
        tp.max_tokens = ctxs[i];
        ChunkTrainer tr(*m, tp);
        planned[i] = tr.planned_bytes(256, true);
        EXPECT_EQ(tr.planned_bytes(256, false) <= planned[i], true);
    }
    EXPECT_EQ(planned[0], planned[1]);
    m.reset();
    oomb_backend_free(cpu);
}

TEST(Qwen2Errors, BadInputs) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    std::string err;
    EXPECT_EQ(qwen2_load_gguf("/nonexistent/model.gguf", cpu, OOMB_TYPE_F32, &err), nullptr);
    EXPECT_NE(err.find("/nonexistent/model.gguf"), std::string::npos) << err;
    Qwen2Config c;
    ASSERT_TRUE(qwen2_preset("tiny", &c));
    c.n_vocab = 100;
    auto m = qwen2_create(c, cpu, OOMB_TYPE_F32);
    qwen2_set_trainable(*m, Qwen2Trainable::All);
    ChunkTrainerParams tp;
    tp.chunk = 8;
    tp.page = 4;
    tp.max_tokens = 16;
    {
        ChunkTrainer tr(*m, tp);
        std::vector<int32_t> ids(16, 3);
        ids[5] = 100;
        EXPECT_OOMB_ERROR(tr.forward(ids.data(), 16), "token id 100 at position 5 is outside the vocabulary");
        std::vector<int32_t> longer(17, 1);
        EXPECT_OOMB_ERROR(tr.forward(longer.data(), 17), "exceeds max_tokens");
        std::vector<int32_t> one(1, 1);
        EXPECT_OOMB_ERROR(tr.forward(one.data(), 1), "at least 2 tokens");
    }
    m.reset();
    oomb_backend_free(cpu);
}

} // namespace
