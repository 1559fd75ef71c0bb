// oomb-train --dump-grads (see train-verify.h).
#include "train-verify.h"

#include "train-checkpoint.h"

#include "gguf.h"
#include "model.h"
#include "safetensors.h"

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

namespace oomb {
namespace train {

namespace {

const char * PROG = TRAIN_PROG;

std::vector<float> get_f32(const oomb_tensor * t) {
    std::vector<float> v((size_t) oomb_nelements(t));
    oomb_tensor_get_f32(t, v.data(), (int64_t) v.size());
    return v;
}

// --tokens: input_ids [B, T] (or [T]) as i32, checked against the model's vocabulary.
std::vector<int32_t> read_input_ids(const Options & o, int64_t n_vocab, int64_t * B_out, int64_t * T_out) {
    std::string err;
    SafetensorsFile f;
    if (f.open(o.tokens, &err) != GGUF_OK) fail(PROG, err);
    const SafetensorsTensor * it = f.find("input_ids");
    if (!it) fail(PROG, o.tokens + ": no tensor 'input_ids'");
    if (it->shape.empty() || it->shape.size() > 2) fail(PROG, o.tokens + ": input_ids must be [B, T] or [T]");
    const int64_t B = it->shape.size() == 2 ? it->shape[0] : 1, T = it->shape.back();
    if (T < 2 || B < 1) fail(PROG, o.tokens + ": input_ids needs at least one sequence of 2 tokens");
    if (it->dtype != SafetensorsDtype::I32 && it->dtype != SafetensorsDtype::I64) fail(PROG, o.tokens + ": input_ids must be I32 or I64");
    // every id checked as the file holds it (an int64 beyond int32 is named by its own value, not a narrowed one)
    std::vector<int32_t> ids((size_t) (B * T));
    for (size_t i = 0; i < ids.size(); i++) {
        int64_t v;
        if (it->dtype == SafetensorsDtype::I32) {
            int32_t x;
            memcpy(&x, it->data + 4 * i, 4);
            v = x;
        } else {
            memcpy(&v, it->data + 8 * i, 8);
        }
        if (v < 0 || v >= n_vocab)
            fail(PROG, o.tokens + ": token id " + std::to_string(v) + " at position " + std::to_string(i) +
                           " is outside the model's vocabulary (" + std::to_string(n_vocab) + " entries)");
        ids[i] = (int32_t) v;
    }
    *B_out = B;
    *T_out = T;
    return ids;
}

// The verification's inputs: the model (-m, --device, --threads, --rope-theta), the --tokens ids
// and the driver parameters of a sequence of T tokens (--chunk, --page). `flag`: the option asking.
struct VerifyRun {
    oomb_backend_t be = nullptr;
    std::unique_ptr<Qwen2Model> model;
    std::vector<int32_t> ids;
    int64_t B = 0, T = 0;
    ChunkParams tp;
};

VerifyRun load_verify_run(const Options & o, const char * flag) {
    if (o.model.empty()) fail(PROG, std::string(flag) + " needs -m MODEL.gguf");
    VerifyRun v;
    std::string err;
    v.be = make_backend(o.device, threads_default(o.threads), &err);
    if (!v.be) fail(PROG, err);
    // --trainable lora (--dump-grads): the frozen base as oomb-train loads it (--base-type)
    const bool lora = o.trainable == "lora";
    v.model = model_load_gguf(o.model, v.be, lora ? base_weight_type(o.base_type, v.be) : compute_type(v.be), &err,
                              lora && o.base_type == "keep");
    if (!v.model) fail(PROG, err);
    if (o.rope_theta > 0) v.model->cfg.rope_theta = (float) o.rope_theta;
    v.ids = read_input_ids(o, v.model->cfg.n_vocab, &v.B, &v.T);
    v.tp.chunk = std::min<int64_t>(o.chunk, v.T);
    v.tp.page = o.page;
    v.tp.max_tokens = v.T;
    v.tp.kv_type = compute_type(v.be);
    apply_sparse_options(o.sparse, &v.tp);
    return v;
}

} // namespace

int dump_logits(const Options & o) {
    VerifyRun v = load_verify_run(o, "--dump-logits");
    if (v.B != 1) fail(PROG, o.tokens + ": --dump-logits takes one sequence (input_ids [T] or [1, T]), got B=" + std::to_string(v.B));
    const int64_t T = v.T;
    ChunkParams & tp = v.tp;
    tp.with_grad = false;  // forward only
    plan_memory(PROG, o.offload, v.be, *v.model, &tp);
    ChunkDriver tr(model_chunk_builder(*v.model), tp);
    tr.set_capture_hidden(true);
    const ChunkStats st = tr.forward(v.ids.data(), T);
    // the driver keeps the last chunk's logits: positions p0 .. T-1 after the earlier chunks' KV
    const int64_t p0 = ((T - 1) / tp.chunk) * tp.chunk, n = T - p0, V = v.model->cfg.n_vocab;
    std::vector<float> logits = tr.logits();  // [n_vocab, n] (ne order): row-major [n, n_vocab]
    if ((int64_t) logits.size() != n * V) fail(PROG, "internal: the last chunk's logits have " + std::to_string(logits.size()) + " values, expected " + std::to_string(n * V));
    const float loss = (float) (st.loss_sum / (double) std::max<int64_t>(1, st.n_targets));
    std::string err;
    SafetensorsWriter w;
    w.add_copy("loss", SafetensorsDtype::F32, {1}, &loss);
    if (w.add_copy("logits", SafetensorsDtype::F32, {n, V}, logits.data(), &err) != GGUF_OK) fail(PROG, err);
    w.set_metadata("model", o.model);
    w.set_metadata("chunk", std::to_string(tp.chunk));
    w.set_metadata("page", std::to_string(tp.page));
    w.set_metadata("first_position", std::to_string(p0));
    if (w.write(o.dump_logits, &err) != GGUF_OK) fail(PROG, err);
    printf("loss %.8f over %" PRId64 " targets (T=%" PRId64 ", chunk %" PRId64 ", page %d, %s); logits of positions %" PRId64 "..%" PRId64 " -> %s\n",
           loss, st.n_targets, T, tp.chunk, tp.page, oomb_backend_name(v.be), p0, T - 1, o.dump_logits.c_str());
    return 0;
}

int dump_grads(const Options & o) {
    VerifyRun v = load_verify_run(o, "--dump-grads");
    const int64_t B = v.B, T = v.T;
    const std::vector<int32_t> & ids = v.ids;
    oomb_backend_t be = v.be;
    std::string err;
    // every weight, or with --trainable lora the adapter's A and B (PEFT's initialisation with --seed:
    // B = 0, so the A gradients are 0 and the B gradients carry the check) on the frozen base
    std::vector<oomb_tensor *> params;
    if (o.trainable == "lora") {
        if (!lora_attach(*v.model, lora_config_of(o), &err)) fail(PROG, err);
        lora_init_peft(*v.model->lora, o.seed, lora_init_of(o));
        params = lora_set_trainable(*v.model);
    } else {
        params = qwen2_set_trainable(*v.model, Qwen2Trainable::All);
    }
    for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
    ChunkParams & tp = v.tp;
    tp.cache_attn = o.attn_cache;  // the verification can check the attention-cache path too
    tp.cache_attn_type = o.attn_cache_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    tp.kv_grad_type = o.kv_grad_type == "bf16" ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
    plan_memory(PROG, o.offload, v.be, *v.model, &tp, /*optimizer=*/false);  // no optimizer: gradients only
    ChunkDriver tr(model_chunk_builder(*v.model), tp);
    double loss_sum = 0;
    int64_t count = 0;
    for (int64_t b = 0; b < B; b++) {
        oomb_kv_cache_set_grad_seed(tr.kv_cache(), (uint32_t) b);  // bf16 gradient pages: reproducible rounding
        ChunkStats st = tr.forward_backward(ids.data() + b * T, T);
        loss_sum += st.loss_sum;
        count += st.n_targets;
    }
    if (count <= 0) fail(PROG, "no targets");
    const float loss = (float) (loss_sum / (double) count);
    const float scale = 1.0f / (float) count;
    SafetensorsWriter w;
    w.add_copy("loss", SafetensorsDtype::F32, {1}, &loss);
    for (oomb_tensor * p : params) {
        std::vector<float> g = get_f32(p->grad);
        for (float & x : g) x *= scale;
        if (w.add_copy(std::string("grad.") + p->name, SafetensorsDtype::F32, torch_shape(p), g.data(), &err) != GGUF_OK)
            fail(PROG, err);
    }
    w.set_metadata("model", o.model);
    w.set_metadata("chunk", std::to_string(tp.chunk));
    w.set_metadata("page", std::to_string(tp.page));
    w.set_metadata("n_targets", std::to_string(count));
    w.set_metadata("kv_grad_type", oomb_type_name(tp.kv_grad_type));
    if (w.write(o.dump_grads, &err) != GGUF_OK) fail(PROG, err);
    printf("loss %.8f over %" PRId64 " targets (B=%" PRId64 ", T=%" PRId64 ", chunk %" PRId64 ", page %d, %s); %zu gradients -> %s\n",
           loss, count, B, T, tp.chunk, tp.page, oomb_backend_name(be), params.size(), o.dump_grads.c_str());
    return 0;
}

} // namespace train
} // namespace oomb
