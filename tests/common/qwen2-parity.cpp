#include "qwen2-parity.h"
#include "test-common.h"

#include "gguf.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <unistd.h>

using namespace oomb;

namespace oombtest {

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

// The Llama fixtures are the project's own (tests/fixtures, made by make-llama-fixtures.py); the
// Qwen2 ones are shared.
std::string model_fixture_dir(const std::string & model) {
    if (model.rfind("llama-", 0) == 0) return oombtest::source_dir() + "/tests/fixtures/" + model;
    return oombtest::fixtures_dir() + "/" + model;
}

// Converts a fixture's HF folder to GGUF with oomb-convert-hf (once per model and type).
std::string converted(const std::string & model, const std::string & outtype) {
    static std::map<std::string, std::string> done;
    const std::string key = model + outtype;
    if (done.count(key)) return done[key];
    const std::string out = tmp_dir() + "/" + model + (outtype.empty() ? "" : "-" + outtype) + ".gguf";
    std::string cmd = oombtest::bin_dir() + "/oomb-convert-hf " + model_fixture_dir(model) + " -o " + out;
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

Reference::Reference(const std::string & path) {
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
std::vector<double> Reference::get(const std::string & name) const {
        const SafetensorsTensor * t = f.find(name);
        if (!t) throw std::runtime_error("reference has no " + name);
        std::vector<double> v;
        std::string err;
        safetensors_read_f64(*t, &v, &err);
        return v;
}

ModelRun::ModelRun(const std::string & gguf, oomb_backend_t b, oomb_type wtype) {
    owned = b == nullptr;
    backend = b ? b : oomb_backend_cpu_init(2);
    std::string err;
    model = model_load_gguf(gguf, backend, wtype, &err);
    if (!model) throw std::runtime_error(err);
    params = qwen2_set_trainable(*model, Qwen2Trainable::All);
}
ModelRun::~ModelRun() {
    model.reset();
    if (owned) oomb_backend_free(backend);
}

std::vector<float> ModelRun::grad(const std::string & gguf_name) const {
    oomb_tensor * p = model->find(gguf_name);
    if (!p || !p->grad) throw std::runtime_error("no gradient for " + gguf_name);
    std::vector<float> g((size_t) oomb_nelements(p));
    oomb_tensor_get(p->grad, g.data(), 0, g.size() * 4);
    return g;
}

// Adds one sequence's statistics to a total.
static void accumulate(ChunkStats & total, const ChunkStats & st) {
    total.loss_sum += st.loss_sum;
    total.n_targets += st.n_targets;
}

// The forward of the short reference, one chunk per sequence: logits, hidden states, loss.
void check_forward(const std::string & model_name) {
    SCOPED_TRACE(model_name);
    Reference ref(model_fixture_dir(model_name) + "/reference-short.safetensors");
    ModelRun run(converted(model_name));
    ChunkParams tp;
    tp.chunk = ref.T;
    tp.page = 16;
    tp.max_tokens = ref.T;
    ChunkDriver tr(model_chunk_builder(*run.model), tp);
    tr.set_capture_hidden(true);
    const int64_t V = run.model->cfg.n_vocab, E = run.model->cfg.n_embd, L = run.model->cfg.n_layer;
    const std::vector<double> logits = ref.get("logits");
    ChunkStats total;
    for (int64_t b = 0; b < ref.B; b++) {
        accumulate(total, tr.forward(ref.ids.data() + b * ref.T, ref.T));
        std::vector<double> lr(logits.begin() + b * ref.T * V, logits.begin() + (b + 1) * ref.T * V);
        EXPECT_LT(rel_err(tr.logits(), lr), 1e-5) << "logits of sequence " << b;
        for (int k = 0; k <= L; k++) {
            const std::vector<double> h = ref.get("hidden_states." + std::to_string(k));
            std::vector<double> hr(h.begin() + b * ref.T * E, h.begin() + (b + 1) * ref.T * E);
            EXPECT_LT(rel_err(tr.hidden(k), hr), 1e-5) << "hidden state " << k << " of sequence " << b;
        }
    }
    EXPECT_LT(std::fabs(total.loss_sum / total.n_targets - ref.loss) / ref.loss, 1e-5);
}

// One forward/backward over every sequence of the reference; checks loss and all gradients.
int64_t check_gradients(ModelRun & run, const std::string & model_name, const std::string & ref_name, int64_t chunk, int page,
                        const ParityTolerance & tol, oomb_type kv_type, bool cache_attn, oomb_type cache_type,
                        oomb_type gemm_input_type, int64_t resident_pages, int stream_block_pages) {
    SCOPED_TRACE(model_name + " " + ref_name + " chunk " + std::to_string(chunk) + " page " + std::to_string(page));
    Reference ref(model_fixture_dir(model_name) + "/reference-" + ref_name + ".safetensors");
    ChunkParams tp;
    tp.chunk = chunk;
    tp.page = page;
    tp.max_tokens = ref.T;
    tp.kv_type = kv_type;
    tp.cache_attn = cache_attn;
    tp.cache_attn_type = cache_type;
    tp.gemm_input_type = gemm_input_type;
    tp.resident_pages = resident_pages;  // host offload: pages past it stream (oomb-offload.h)
    tp.stream_block_pages = stream_block_pages;
    ChunkDriver tr(model_chunk_builder(*run.model), tp);
    ChunkStats total;
    for (int64_t b = 0; b < ref.B; b++) accumulate(total, tr.forward_backward(ref.ids.data() + b * ref.T, ref.T));
    const double loss_sum = total.loss_sum;
    const int64_t count = total.n_targets;
    EXPECT_EQ(count, ref.B * (ref.T - 1));
    const double loss = loss_sum / count;
    EXPECT_LT(std::fabs(loss - ref.loss) / ref.loss, tol.loss) << "loss " << loss << " vs reference " << ref.loss;

    int checked = 0;
    for (const auto & t : ref.f.tensors()) {
        if (t.name.rfind("grad.", 0) != 0) continue;
        const std::string gname = hf_to_gguf(t.name.substr(5));
        EXPECT_FALSE(gname.empty()) << "unmapped reference gradient " << t.name;
        if (gname.empty()) continue;
        std::vector<float> g = run.grad(gname);
        for (float & x : g) x /= (float) count;
        const std::vector<double> r = ref.get(t.name);
        EXPECT_EQ(r.size(), g.size()) << gname;
        if (r.size() != g.size()) continue;
        const double e = rel_err(g, r);
        EXPECT_LT(e, tol.grad) << "gradient of " << gname << " (" << t.name << ") relative error " << e;
        checked++;
    }
    EXPECT_EQ(checked, (int) run.params.size()) << "every parameter has a reference gradient";
    return count;
}


} // namespace oombtest
