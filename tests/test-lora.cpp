// LoRA (models/lora.h) on the decoder, both architectures, CPU backend, through the OOMB chunk driver
// with chunks and pages that do not divide the sequence:
//   - the gradients of A and B (both non-zero) against central finite differences of the loss;
//   - the same gradients against the identity dL/dA = s B^T G, dL/dB = s G A^T, where G is the
//     gradient of the merged weight W + s B A computed by the (fixture-verified) full-model path,
//     and the loss of base + adapter against the merged model's;
//   - PEFT's initialisation (B = 0) gives exactly the base model's loss, A within 1/sqrt(n_in);
//   - the adapter GGUF round trip (Llama: B's attn_q / attn_k rows in the file's order) and the
//     loader's refusals.
#include "test-common.h"

#include "gguf.h"
#include "lora.h"
#include "model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>

using namespace oomb;

namespace {

Qwen2Config tiny_config(DecoderArch arch) {
    Qwen2Config c;
    c.arch = arch;
    c.n_vocab = 40; c.n_embd = 16; c.n_ff = 24; c.n_layer = 2; c.n_head = 2; c.n_head_kv = 1; c.head_dim = 8;
    c.rope_theta = 10000.0f; c.rms_eps = 1e-6f; c.tied = false;
    return c;
}

std::vector<float> get(const oomb_tensor * t) {
    std::vector<float> v((size_t) oomb_nelements(t));
    oomb_tensor_get(t, v.data(), 0, v.size() * 4);
    return v;
}

void set(oomb_tensor * t, const std::vector<float> & v) { oomb_tensor_set(t, v.data(), 0, v.size() * 4); }

void fill_random(oomb_tensor * t, std::mt19937 & rng, float bound) {
    std::uniform_real_distribution<float> u(-bound, bound);
    std::vector<float> v((size_t) oomb_nelements(t));
    for (float & x : v) x = u(rng);
    set(t, v);
}

// Qwen2's q/k/v biases non-zero (they stay frozen beside W); deterministic.
void randomize_biases(Qwen2Model & m) {
    std::mt19937 rng(17);
    for (const Qwen2Layer & L : m.layers)
        for (oomb_tensor * b : {L.bq, L.bk, L.bv})
            if (b) fill_random(b, rng, 0.5f);
}

struct TinyLora {
    oomb_backend_t cpu = oomb_backend_cpu_init(2);
    std::unique_ptr<Qwen2Model> m;
    std::vector<int32_t> ids;
    ChunkParams tp;
    TinyLora(DecoderArch arch, uint32_t targets) {
        m = qwen2_create(tiny_config(arch), cpu, OOMB_TYPE_F32);
        qwen2_init_random(*m, 11);
        randomize_biases(*m);
        LoraConfig lc;
        lc.rank = 3;
        lc.alpha = 5.0f;
        lc.targets = targets;
        std::string err;
        EXPECT_TRUE(lora_attach(*m, lc, &err)) << err;
        std::mt19937 rng(5);
        for (oomb_tensor * t : m->lora->params) fill_random(t, rng, 0.4f);  // A and B non-zero
        std::mt19937 r2(9);
        for (int i = 0; i < 13; i++) ids.push_back((int32_t) (r2() % 40));
        tp.chunk = 5;
        tp.page = 3;
        tp.max_tokens = 13;
    }
    ~TinyLora() {
        m.reset();
        oomb_backend_free(cpu);
    }
};

// Central differences of the loss sum for a few elements of every A and B, against the backward.
void check_finite_differences(DecoderArch arch) {
    TinyLora s(arch, kLoraAllTargets);
    std::vector<oomb_tensor *> params = lora_set_trainable(*s.m);
    EXPECT_EQ(params.size(), (size_t) (2 * kLoraTargets * 2));
    ChunkDriver tr(model_chunk_builder(*s.m), s.tp);
    for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
    const ChunkStats st = tr.forward_backward(s.ids.data(), (int64_t) s.ids.size());
    EXPECT_GT(st.n_targets, 0);
    const double eps = 1e-2;
    double worst = 0;
    std::string worst_name;
    for (oomb_tensor * p : params) {
        const std::vector<float> g = get(p->grad), v0 = get(p);
        double gmax = 0;
        for (float x : g) gmax = std::max(gmax, (double) std::fabs(x));
        ASSERT_GT(gmax, 0) << p->name << ": zero gradient";
        for (size_t k = 0; k < 3; k++) {
            const size_t i = (k * 7919 + 13) % v0.size();
            std::vector<float> v = v0;
            v[i] = v0[i] + (float) eps;
            set(p, v);
            const double lp = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
            v[i] = v0[i] - (float) eps;
            set(p, v);
            const double lm = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
            set(p, v0);
            const double fd = (lp - lm) / (2 * eps);
            const double e = std::fabs(fd - g[i]) / gmax;
            if (e > worst) { worst = e; worst_name = std::string(p->name) + "[" + std::to_string(i) + "]"; }
            EXPECT_NEAR(fd, g[i], 2e-2 * gmax) << p->name << "[" << i << "]";
        }
    }
    printf("  %s: worst |fd - grad| / max|grad| = %.2e (%s)\n", decoder_arch_name(arch), worst, worst_name.c_str());
}

// The adapter's gradients and loss against the merged model W' = W + s B A (full-model path).
void check_against_merged(DecoderArch arch, uint32_t targets) {
    TinyLora s(arch, targets);
    std::vector<oomb_tensor *> params = lora_set_trainable(*s.m);
    double loss_lora = 0;
    {
        ChunkDriver tr(model_chunk_builder(*s.m), s.tp);
        for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
        loss_lora = tr.forward_backward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
    }
    // the merged model: same base, W += s B A, every weight trainable
    auto merged = qwen2_create(s.m->cfg, s.cpu, OOMB_TYPE_F32);
    qwen2_init_random(*merged, 11);
    randomize_biases(*merged);
    const LoraAdapter & a = *s.m->lora;
    for (int64_t l = 0; l < s.m->cfg.n_layer; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            const LoraWeight * lw = a.find(l, lora_target_slot((LoraTarget) t));
            if (!lw) continue;
            oomb_tensor * w = merged->find(std::string(lw->a->name).substr(0, strlen(lw->a->name) - 7));
            ASSERT_NE(w, nullptr);
            const int64_t n_in = w->ne[0], n_out = w->ne[1], r = lw->a->ne[1];
            std::vector<float> W = get(w), A = get(lw->a), B = get(lw->b);
            for (int64_t o = 0; o < n_out; o++)
                for (int64_t i = 0; i < n_in; i++) {
                    double d = 0;
                    for (int64_t k = 0; k < r; k++) d += (double) B[o * r + k] * A[k * n_in + i];
                    W[o * n_in + i] += (float) (lw->scale * d);
                }
            set(w, W);
        }
    std::vector<oomb_tensor *> mp = qwen2_set_trainable(*merged, Qwen2Trainable::All);
    ChunkDriver tr(model_chunk_builder(*merged), s.tp);
    for (oomb_tensor * p : mp) oomb_tensor_memset(p->grad, 0);
    const double loss_merged = tr.forward_backward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
    EXPECT_NEAR(loss_lora, loss_merged, 2e-5 * std::fabs(loss_merged));
    double worst = 0;
    for (int64_t l = 0; l < s.m->cfg.n_layer; l++)
        for (int t = 0; t < kLoraTargets; t++) {
            const LoraWeight * lw = a.find(l, lora_target_slot((LoraTarget) t));
            if (!lw) continue;
            const oomb_tensor * w = merged->find(std::string(lw->a->name).substr(0, strlen(lw->a->name) - 7));
            const int64_t n_in = w->ne[0], n_out = w->ne[1], r = lw->a->ne[1];
            const std::vector<float> G = get(w->grad), A = get(lw->a), B = get(lw->b), gA = get(lw->a->grad), gB = get(lw->b->grad);
            std::vector<double> eA(A.size()), eB(B.size());
            for (int64_t k = 0; k < r; k++)
                for (int64_t i = 0; i < n_in; i++) {
                    double d = 0;
                    for (int64_t o = 0; o < n_out; o++) d += (double) B[o * r + k] * G[o * n_in + i];
                    eA[k * n_in + i] = lw->scale * d;
                }
            for (int64_t o = 0; o < n_out; o++)
                for (int64_t k = 0; k < r; k++) {
                    double d = 0;
                    for (int64_t i = 0; i < n_in; i++) d += (double) G[o * n_in + i] * A[k * n_in + i];
                    eB[o * r + k] = lw->scale * d;
                }
            auto rel = [](const std::vector<float> & got, const std::vector<double> & want) {
                double num = 0, den = 0;
                for (size_t i = 0; i < got.size(); i++) { num += (got[i] - want[i]) * (got[i] - want[i]); den += want[i] * want[i]; }
                return std::sqrt(num / std::max(den, 1e-300));
            };
            const double ra = rel(gA, eA), rb = rel(gB, eB);
            worst = std::max(worst, std::max(ra, rb));
            EXPECT_LT(ra, 1e-4) << lw->a->name;
            EXPECT_LT(rb, 1e-4) << lw->b->name;
        }
    printf("  %s targets %s: loss %.6f vs merged %.6f, worst gradient relative error %.2e\n", decoder_arch_name(arch),
           lora_targets_string(targets).c_str(), loss_lora, loss_merged, worst);
}

std::string tmp_path(const char * name) { return "/tmp/oomb-test-lora-" + std::to_string(getpid()) + "-" + name; }

} // namespace

TEST(LoraGrad, FiniteDifferencesQwen2) { check_finite_differences(DecoderArch::Qwen2); }
TEST(LoraGrad, FiniteDifferencesLlama) { check_finite_differences(DecoderArch::Llama); }
TEST(LoraGrad, MatchesMergedModelQwen2) { check_against_merged(DecoderArch::Qwen2, kLoraAllTargets); }
TEST(LoraGrad, MatchesMergedModelLlama) { check_against_merged(DecoderArch::Llama, kLoraAllTargets); }
TEST(LoraGrad, MatchesMergedModelSomeTargets) {
    uint32_t mask = 0;
    std::string err;
    ASSERT_TRUE(lora_parse_targets("k,down,o", &mask, &err)) << err;
    check_against_merged(DecoderArch::Qwen2, mask);
}

// bf16 activations (the GPU's storage: gemm_input_type bf16, gate and up products in bf16) with an
// adapter on only one of gate / up: the model keeps both in f32 (the SwiGLU takes one type), the step
// runs and its loss and adapter gradients stay within bf16 rounding of the f32 run.
TEST(LoraGrad, Bf16ActivationsAdapterOnGateOrUp) {
    for (const char * tg : {"gate", "up", "gate,up,down"}) {
        uint32_t mask = 0;
        std::string err;
        ASSERT_TRUE(lora_parse_targets(tg, &mask, &err)) << err;
        double loss[2];
        std::vector<std::vector<float>> grads[2];
        for (int bf = 0; bf < 2; bf++) {
            TinyLora s(DecoderArch::Qwen2, mask);
            std::vector<oomb_tensor *> params = lora_set_trainable(*s.m);
            s.tp.gemm_input_type = bf ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
            ChunkDriver tr(model_chunk_builder(*s.m), s.tp);
            for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
            loss[bf] = tr.forward_backward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
            for (oomb_tensor * p : params) grads[bf].push_back(get(p->grad));
        }
        EXPECT_TRUE(std::isfinite(loss[1])) << tg;
        EXPECT_NEAR(loss[1], loss[0], 1e-2 * std::fabs(loss[0])) << tg;
        ASSERT_EQ(grads[0].size(), grads[1].size());
        for (size_t i = 0; i < grads[0].size(); i++) {
            double num = 0, den = 0;
            for (size_t k = 0; k < grads[0][i].size(); k++) {
                const double d = (double) grads[1][i][k] - grads[0][i][k];
                num += d * d;
                den += (double) grads[0][i][k] * grads[0][i][k];
            }
            EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 3e-2) << tg << " parameter " << i;
        }
    }
}

// PEFT's initialisation: B = 0 gives the base model's loss exactly; A in [-1/sqrt(n_in), 1/sqrt(n_in)).
TEST(LoraInit, ZeroBIsExactlyTheBase) {
    for (DecoderArch arch : {DecoderArch::Qwen2, DecoderArch::Llama}) {
        TinyLora s(arch, kLoraAllTargets);
        lora_init_peft(*s.m->lora, 42);
        for (const oomb_tensor * t : s.m->lora->params) {
            const std::vector<float> v = get(t);
            const bool is_a = std::string(t->name).find(".lora_a") != std::string::npos;
            double mx = 0;
            for (float x : v) mx = std::max(mx, (double) std::fabs(x));
            if (is_a) {
                EXPECT_GT(mx, 0.5 / std::sqrt((double) t->ne[0])) << t->name;
                EXPECT_LE(mx, 1.0 / std::sqrt((double) t->ne[0])) << t->name;
            } else {
                EXPECT_EQ(mx, 0.0) << t->name;
            }
        }
        lora_set_trainable(*s.m);
        double with = 0, without = 0;
        {
            ChunkDriver tr(model_chunk_builder(*s.m), s.tp);
            with = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
            EXPECT_EQ(tr.forward_backward(s.ids.data(), (int64_t) s.ids.size()).loss_sum, with);
        }
        s.m->lora.reset();
        {
            ChunkDriver tr(model_chunk_builder(*s.m), s.tp);
            without = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
        }
        EXPECT_EQ(with, without) << decoder_arch_name(arch);
    }
    // deterministic for a seed, different for another
    TinyLora a(DecoderArch::Qwen2, kLoraAllTargets), b(DecoderArch::Qwen2, kLoraAllTargets);
    lora_init_peft(*a.m->lora, 1);
    lora_init_peft(*b.m->lora, 1);
    EXPECT_EQ(get(a.m->lora->params[0]), get(b.m->lora->params[0]));
    lora_init_peft(*b.m->lora, 2);
    EXPECT_NE(get(a.m->lora->params[0]), get(b.m->lora->params[0]));
}

// Save and load: bit-exact in memory; Llama's file B of attn_q / attn_k is in the file's row order.
TEST(LoraFile, RoundTripAndLlamaRowOrder) {
    for (DecoderArch arch : {DecoderArch::Qwen2, DecoderArch::Llama}) {
        TinyLora s(arch, kLoraAllTargets);
        const std::string p = tmp_path("rt.gguf");
        std::string err;
        ASSERT_TRUE(lora_save_gguf(*s.m, p, "test", &err)) << err;
        auto m2 = qwen2_create(s.m->cfg, s.cpu, OOMB_TYPE_F32);
        ASSERT_TRUE(lora_load_gguf(*m2, p, &err)) << err;
        EXPECT_EQ(m2->lora->cfg.rank, 3);
        EXPECT_EQ(m2->lora->cfg.alpha, 5.0f);
        EXPECT_EQ(m2->lora->cfg.targets, kLoraAllTargets);
        EXPECT_EQ(m2->lora->cfg.init, s.m->lora->cfg.init);
        ASSERT_EQ(m2->lora->params.size(), s.m->lora->params.size());
        for (size_t i = 0; i < m2->lora->params.size(); i++) {
            EXPECT_STREQ(m2->lora->params[i]->name, s.m->lora->params[i]->name);
            EXPECT_EQ(get(m2->lora->params[i]), get(s.m->lora->params[i])) << s.m->lora->params[i]->name;
        }
        GGUFReader r;
        ASSERT_EQ(r.open(p, &err), GGUF_OK) << err;
        const oomb_tensor * bq = s.m->lora->find(0, Qwen2Slot::Wq)->b;
        std::vector<float> file;
        ASSERT_EQ(r.read_tensor_f32(bq->name, &file, &err), GGUF_OK) << err;
        std::vector<float> mem = get(bq);
        if (arch == DecoderArch::Llama) llama_permute_qk_rows(mem.data(), s.m->cfg.n_head, s.m->cfg.head_dim, (size_t) bq->ne[0] * 4);
        EXPECT_EQ(file, mem) << decoder_arch_name(arch);
        if (arch == DecoderArch::Llama) EXPECT_NE(file, get(bq)) << "the Llama file's B rows of attn_q are permuted";
        unlink(p.c_str());
    }
}

TEST(LoraFile, LoaderRefusals) {
    TinyLora s(DecoderArch::Qwen2, kLoraAllTargets);
    const std::string p = tmp_path("ref.gguf"), mp = tmp_path("model.gguf");
    std::string err;
    ASSERT_TRUE(lora_save_gguf(*s.m, p, "test", &err)) << err;
    // another architecture
    auto llama = qwen2_create(tiny_config(DecoderArch::Llama), s.cpu, OOMB_TYPE_F32);
    EXPECT_FALSE(lora_load_gguf(*llama, p, &err));
    EXPECT_NE(err.find("general.architecture is 'qwen2' but the base model is 'llama'"), std::string::npos) << err;
    EXPECT_EQ(llama->lora, nullptr);
    // another shape (n_embd 24)
    Qwen2Config c = tiny_config(DecoderArch::Qwen2);
    c.n_embd = 24;
    auto wide = qwen2_create(c, s.cpu, OOMB_TYPE_F32);
    EXPECT_FALSE(lora_load_gguf(*wide, p, &err));
    EXPECT_NE(err.find("blk.0.attn_q.weight.lora_a' ne [16, 3]"), std::string::npos) << err;
    EXPECT_NE(err.find("do not fit 'blk.0.attn_q.weight' ne [24, 16]"), std::string::npos) << err;
    // a model file, not an adapter
    ASSERT_TRUE(model_save_gguf(*s.m, mp, "", GGUF_TENSOR_F32, "m", &err)) << err;
    EXPECT_FALSE(lora_load_gguf(*s.m, mp, &err));
    EXPECT_NE(err.find("key 'general.type' is missing"), std::string::npos) << err;
    EXPECT_NE(s.m->lora, nullptr) << "a failed load leaves the adapter as it was";
    // hand-made adapters: a lone lora_a, a tensor of no block projection, general.type model
    auto write = [&](const std::string & type, const std::vector<std::pair<std::string, std::vector<int64_t>>> & ts) {
        GGUFWriter w;
        w.set_string("general.architecture", "qwen2");
        w.set_string("general.type", type);
        w.set_string("adapter.type", "lora");
        w.set_f32("adapter.lora.alpha", 8.0f);
        for (auto & t : ts) EXPECT_EQ(w.add_tensor(t.first, GGUF_TENSOR_F32, t.second, &err), GGUF_OK);
        EXPECT_EQ(w.open(p, &err), GGUF_OK) << err;
        for (auto & t : ts) {
            std::vector<float> z((size_t) (t.second[0] * t.second[1]), 0.5f);
            EXPECT_EQ(w.write_tensor(t.first, z.data(), z.size() * 4, &err), GGUF_OK) << err;
        }
        EXPECT_EQ(w.finish(&err), GGUF_OK) << err;
    };
    write("adapter", {{"blk.0.attn_q.weight.lora_a", {16, 3}}});
    EXPECT_FALSE(lora_load_gguf(*s.m, p, &err));
    EXPECT_NE(err.find("lacks its .lora_b"), std::string::npos) << err;
    write("adapter", {{"output.weight.lora_a", {16, 3}}, {"output.weight.lora_b", {3, 40}}});
    EXPECT_FALSE(lora_load_gguf(*s.m, p, &err));
    EXPECT_NE(err.find("not a block projection"), std::string::npos) << err;
    write("model", {{"blk.0.attn_q.weight.lora_a", {16, 3}}, {"blk.0.attn_q.weight.lora_b", {3, 16}}});
    EXPECT_FALSE(lora_load_gguf(*s.m, p, &err));
    EXPECT_NE(err.find("general.type is 'model', expected 'adapter'"), std::string::npos) << err;
    // a layer the base does not have (2 layers)
    write("adapter", {{"blk.2.attn_q.weight.lora_a", {16, 3}}, {"blk.2.attn_q.weight.lora_b", {3, 16}}});
    EXPECT_FALSE(lora_load_gguf(*s.m, p, &err));
    EXPECT_NE(err.find("tensor 'blk.2.attn_q.weight.lora_a' adapts 'blk.2.attn_q.weight', which is not a block projection"), std::string::npos) << err;
    // a partial adapter with one misshapen pair among good ones: named
    write("adapter", {{"blk.0.attn_q.weight.lora_a", {16, 3}}, {"blk.0.attn_q.weight.lora_b", {3, 16}},
                      {"blk.1.ffn_up.weight.lora_a", {16, 3}}, {"blk.1.ffn_up.weight.lora_b", {3, 23}}});
    EXPECT_FALSE(lora_load_gguf(*s.m, p, &err));
    EXPECT_NE(err.find("'blk.1.ffn_up.weight.lora_b' ne [3, 23] do not fit 'blk.1.ffn_up.weight' ne [16, 24]"), std::string::npos) << err;
    // a lone lora_b beside a complete pair
    write("adapter", {{"blk.0.attn_q.weight.lora_a", {16, 3}}, {"blk.0.attn_q.weight.lora_b", {3, 16}}, {"blk.1.attn_v.weight.lora_b", {3, 8}}});
    EXPECT_FALSE(lora_load_gguf(*s.m, p, &err));
    EXPECT_NE(err.find("the pair of 'blk.1.attn_v.weight' lacks its .lora_a"), std::string::npos) << err;
    // one pair of one layer: a partial adapter, accepted (llama.cpp applies exactly the pairs a file holds)
    write("adapter", {{"blk.0.attn_q.weight.lora_a", {16, 3}}, {"blk.0.attn_q.weight.lora_b", {3, 16}}});
    ASSERT_TRUE(lora_load_gguf(*s.m, p, &err)) << err;
    EXPECT_EQ(s.m->lora->cfg.targets, 1u << (int) LoraTarget::Q);
    EXPECT_EQ(s.m->lora->params.size(), 2u);
    EXPECT_NE(s.m->lora->find(0, Qwen2Slot::Wq), nullptr);
    EXPECT_EQ(s.m->lora->find(1, Qwen2Slot::Wq), nullptr);
    EXPECT_EQ(s.m->lora->first_missing(), "layer 1's q projection");
    unlink(p.c_str());
    unlink(mp.c_str());
}

// A partial adapter (pairs dropped from a full one's file) computes what the full one does with those
// pairs' B zero: the missing projections get no delta. Both architectures (Llama: B rows permuted in
// the file); the dropped pairs cover a whole target in one layer only, and all of one layer's.
TEST(LoraFile, PartialAdapterIsTheFullWithZeroB) {
    for (DecoderArch arch : {DecoderArch::Qwen2, DecoderArch::Llama}) {
        TinyLora s(arch, kLoraAllTargets);
        const std::string full = tmp_path("full.gguf"), part = tmp_path("part.gguf");
        std::string err;
        ASSERT_TRUE(lora_save_gguf(*s.m, full, "test", &err)) << err;
        // dropped: layer 0's v and down, every target of layer 1 but k and gate
        auto dropped = [](const std::string & n) {
            for (const char * d : {"blk.0.attn_v.", "blk.0.ffn_down.", "blk.1.attn_q.", "blk.1.attn_v.", "blk.1.attn_output.", "blk.1.ffn_up.", "blk.1.ffn_down."})
                if (n.rfind(d, 0) == 0) return true;
            return false;
        };
        {
            GGUFReader r;
            ASSERT_EQ(r.open(full, &err), GGUF_OK) << err;
            GGUFWriter w;
            for (const char * k : {"general.architecture", "general.type", "adapter.type"}) w.set_string(k, r.find(k)->str());
            w.set_f32("adapter.lora.alpha", 5.0f);
            std::vector<const GGUFTensorInfo *> kept;
            for (const GGUFTensorInfo & t : r.tensors())
                if (!dropped(t.name)) kept.push_back(&t);
            for (const GGUFTensorInfo * t : kept) ASSERT_EQ(w.add_tensor(t->name, GGUF_TENSOR_F32, {t->ne[0], t->ne[1]}, &err), GGUF_OK) << err;
            ASSERT_EQ(w.open(part, &err), GGUF_OK) << err;
            for (const GGUFTensorInfo * t : kept) {
                std::vector<float> v;
                ASSERT_EQ(r.read_tensor_f32(t->name, &v, &err), GGUF_OK) << err;
                ASSERT_EQ(w.write_tensor(t->name, v.data(), v.size() * 4, &err), GGUF_OK) << err;
            }
            ASSERT_EQ(w.finish(&err), GGUF_OK) << err;
            ASSERT_EQ(kept.size(), 2u * (2 * kLoraTargets - 7));
        }
        auto m2 = qwen2_create(s.m->cfg, s.cpu, OOMB_TYPE_F32);
        qwen2_init_random(*m2, 11);
        randomize_biases(*m2);
        ASSERT_TRUE(lora_load_gguf(*m2, part, &err)) << err;
        EXPECT_EQ(m2->lora->params.size(), 2u * 7);
        // v and down are dropped in both layers: not in the union
        EXPECT_EQ(m2->lora->cfg.targets, kLoraAllTargets & ~(1u << (int) LoraTarget::V) & ~(1u << (int) LoraTarget::Down));
        EXPECT_EQ(m2->lora->first_missing(), "layer 1's q projection");
        // the full adapter with the dropped pairs' B zero
        for (oomb_tensor * t : s.m->lora->params)
            if (dropped(t->name) && std::string(t->name).find(".lora_b") != std::string::npos) set(t, std::vector<float>((size_t) oomb_nelements(t), 0.0f));
        double want = 0, got = 0, base = 0;
        {
            ChunkDriver tr(model_chunk_builder(*s.m), s.tp);
            want = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
        }
        {
            ChunkDriver tr(model_chunk_builder(*m2), s.tp);
            got = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
        }
        m2->lora.reset();
        {
            ChunkDriver tr(model_chunk_builder(*m2), s.tp);
            base = tr.forward(s.ids.data(), (int64_t) s.ids.size()).loss_sum;
        }
        EXPECT_EQ(got, want) << decoder_arch_name(arch);
        EXPECT_GT(std::fabs(got - base), 1e-3) << "the kept pairs change the loss";
        unlink(full.c_str());
        unlink(part.c_str());
    }
}

// --lora-init: the statistics of A over a model large enough for tight bounds (n > 50000 values
// pooled, each divided by its expected sd: mean, variance and fourth moment within 5 standard errors
// derived from n and the distribution's moments), B zero; gaussian's tails reach past 3.5 sd,
// default's never past its bound; default is the Kaiming-uniform values of before --lora-init.
TEST(LoraInit, DefaultAndGaussianStatistics) {
    Qwen2Config c = tiny_config(DecoderArch::Qwen2);
    c.n_embd = 128; c.n_ff = 320; c.n_head = 4; c.n_head_kv = 2; c.head_dim = 32; c.n_layer = 4;
    oomb_backend_t cpu = oomb_backend_cpu_init(2);
    auto m = qwen2_create(c, cpu, OOMB_TYPE_F32);
    LoraConfig lc;
    lc.rank = 12;
    std::string err;
    ASSERT_TRUE(lora_attach(*m, lc, &err)) << err;
    LoraInit init = LoraInit::Default;
    EXPECT_TRUE(lora_parse_init("gaussian", &init, &err));
    EXPECT_EQ(init, LoraInit::Gaussian);
    EXPECT_TRUE(lora_parse_init("default", &init, &err));
    EXPECT_EQ(init, LoraInit::Default);
    EXPECT_FALSE(lora_parse_init("kaiming", &init, &err));
    EXPECT_NE(err.find("unknown value 'kaiming' (choose default or gaussian"), std::string::npos) << err;
    for (LoraInit li : {LoraInit::Default, LoraInit::Gaussian}) {
        lora_init_peft(*m->lora, 42, li);
        // A's values over the n_in groups (16: 128 wide inputs, down: 320), normalised by their expected sd
        double s1 = 0, s2 = 0, s4 = 0, mx = 0;
        int64_t n = 0;
        for (const oomb_tensor * t : m->lora->params) {
            const std::vector<float> v = get(t);
            if (std::string(t->name).find(".lora_b") != std::string::npos) {
                for (float x : v) ASSERT_EQ(x, 0.0f) << t->name;
                continue;
            }
            ASSERT_EQ(t->ne[1], 12);
            const double bound = 1.0 / std::sqrt((double) t->ne[0]);
            const double sd = li == LoraInit::Gaussian ? 1.0 / 12.0 : bound / std::sqrt(3.0);
            for (float x : v) {
                if (li == LoraInit::Default) ASSERT_LT(std::fabs(x), bound) << t->name;
                const double z = x / sd;
                s1 += z; s2 += z * z; s4 += z * z * z * z; mx = std::max(mx, std::fabs(z));
                n++;
            }
        }
        ASSERT_GT(n, 50000);
        const double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n;
        SCOPED_TRACE(lora_init_name(li));
        EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt((double) n));
        // sd of the sample variance (unit sd): sqrt((m4 - 1) / n), of the sample fourth moment sqrt((m8 - m4^2) / n);
        // normal m4 3, m8 105; uniform m4 9/5, m8 9
        const double m4 = li == LoraInit::Gaussian ? 3.0 : 1.8, m8 = li == LoraInit::Gaussian ? 105.0 : 9.0;
        EXPECT_LT(std::fabs(var - 1.0), 5.0 * std::sqrt((m4 - 1.0) / n));
        EXPECT_LT(std::fabs(kurt - m4), 5.0 * std::sqrt((m8 - m4 * m4) / n));
        if (li == LoraInit::Gaussian) EXPECT_GT(mx, 3.5);
        else EXPECT_LE(mx, std::sqrt(3.0));
    }
    // default is the values of before --lora-init (the argument's default): the Kaiming-uniform draw
    // of init_chunk_seed(seed, name, chunk), first values of two tensors pinned (computed outside this
    // code, by a Python transcription of src/init-normal.h's xoshiro256+ / splitmix64 / FNV-1a)
    lora_init_peft(*m->lora, 42);
    const std::vector<float> q0 = get(m->lora->find(0, Qwen2Slot::Wq)->a), d1 = get(m->lora->find(1, Qwen2Slot::WDown)->a);
    EXPECT_EQ(std::vector<float>(q0.begin(), q0.begin() + 4), (std::vector<float>{0.0369986743f, -0.0257347487f, 0.0415991694f, -0.0431411862f}));
    EXPECT_EQ(std::vector<float>(d1.begin(), d1.begin() + 4), (std::vector<float>{0.0146668078f, -0.0135305496f, 0.024545731f, -0.0489907227f}));
    std::vector<float> a0 = get(m->lora->params[0]);
    lora_init_peft(*m->lora, 42, LoraInit::Default);
    EXPECT_EQ(get(m->lora->params[0]), a0);
    lora_init_peft(*m->lora, 42, LoraInit::Gaussian);
    EXPECT_NE(get(m->lora->params[0]), a0);
    // the init is recorded: PEFT's adapter_config.json says "gaussian" (was always true), and the
    // adapter GGUF carries it (oomb.lora.init) so that a resumed run writes the same config
    EXPECT_EQ(m->lora->cfg.init, LoraInit::Gaussian);
    EXPECT_NE(lora_peft_config_json(m->lora->cfg, "base").find("\"init_lora_weights\": \"gaussian\""), std::string::npos)
        << lora_peft_config_json(m->lora->cfg, "base");
    {
        const std::string p = tmp_path("gauss.gguf");
        std::string err;
        ASSERT_TRUE(lora_save_gguf(*m, p, "test", &err)) << err;
        auto m2 = qwen2_create(m->cfg, cpu, OOMB_TYPE_F32);
        ASSERT_TRUE(lora_load_gguf(*m2, p, &err)) << err;
        EXPECT_EQ(m2->lora->cfg.init, LoraInit::Gaussian);
        m2.reset();
    }
    lora_init_peft(*m->lora, 42, LoraInit::Default);
    EXPECT_NE(lora_peft_config_json(m->lora->cfg, "base").find("\"init_lora_weights\": true"), std::string::npos);
    m.reset();
    oomb_backend_free(cpu);
}

TEST(LoraConfig, TargetsAndChecks) {
    uint32_t m = 0;
    std::string err;
    EXPECT_TRUE(lora_parse_targets("q,k,v,o,gate,up,down", &m, &err));
    EXPECT_EQ(m, kLoraAllTargets);
    EXPECT_EQ(lora_targets_string(m), "q,k,v,o,gate,up,down");
    EXPECT_TRUE(lora_parse_targets("down,q", &m, &err));
    EXPECT_EQ(lora_targets_string(m), "q,down");
    EXPECT_FALSE(lora_parse_targets("q,x", &m, &err));
    EXPECT_NE(err.find("unknown target 'x'"), std::string::npos) << err;
    EXPECT_FALSE(lora_parse_targets("", &m, &err));
    EXPECT_FALSE(lora_parse_targets("q,,k", &m, &err));
    EXPECT_FALSE(lora_parse_targets("q,q", &m, &err));
    EXPECT_NE(err.find("given twice"), std::string::npos) << err;
    LoraConfig c;
    c.rank = 0;
    EXPECT_FALSE(lora_config_valid(c, &err));
    EXPECT_NE(err.find("--lora-rank"), std::string::npos) << err;
    c.rank = 4;
    c.alpha = NAN;
    EXPECT_FALSE(lora_config_valid(c, &err));
    c.alpha = 8;
    c.targets = 0;
    EXPECT_FALSE(lora_config_valid(c, &err));
}
