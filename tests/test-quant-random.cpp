// Random quantized bases (oomb-train --preset NAME --trainable lora --base-type q4_k_m): the random
// blocks of src/formats/quants.h (quant_random_blocks) dequantize to finite values with mean ~0 and
// the stated RMS (~0.02, like the normal(0, 0.02) f32 init); they are deterministic in the seed;
// the Q4_K_M mix rule (gguf_plan_weight_types, shared with oomb-export) types a 7B preset's
// projections as llama.cpp does; a model made that way (K-quant rows) runs LoRA forward/backward on
// the CPU with a finite loss and non-zero adapter gradients.
#include "test-common.h"

#include "../src/formats/quants.h"
#include "gguf.h"
#include "lora.h"
#include "model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace oomb;

namespace {

struct Stats { double mean = 0, rms = 0; bool finite = true; };

Stats stats_of(uint32_t type, const std::vector<uint8_t> & blocks, int64_t n_blocks) {
    std::vector<float> y((size_t) (n_blocks * quant_block_size(type)));
    dequantize_blocks(type, blocks.data(), y.data(), n_blocks);
    Stats s;
    double sum = 0, sq = 0;
    for (float v : y) {
        s.finite &= std::isfinite(v);
        sum += v;
        sq += (double) v * v;
    }
    s.mean = sum / (double) y.size();
    s.rms = std::sqrt(sq / (double) y.size());
    return s;
}

} // namespace

TEST(QuantRandom, BlocksHaveMeanZeroAndTheStatedRms) {
    const uint32_t types[] = {GGUF_TENSOR_Q8_0, GGUF_TENSOR_Q5_0, GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q5_K, GGUF_TENSOR_Q6_K};
    for (uint32_t t : types) {
        ASSERT_TRUE(quant_random_supported(t)) << gguf_tensor_type_name(t);
        const int64_t n_blocks = (1 << 21) / quant_block_size(t);  // 2M values
        std::vector<uint8_t> b((size_t) n_blocks * quant_block_bytes(t));
        ASSERT_TRUE(quant_random_blocks(t, 1234, b.data(), n_blocks));
        const Stats s = stats_of(t, b, n_blocks);
        const double want = quant_random_rms(t);
        printf("  %-5s mean %+.2e, rms %.5f (stated %.5f)\n", gguf_tensor_type_name(t), s.mean, s.rms, want);
        EXPECT_TRUE(s.finite) << gguf_tensor_type_name(t);
        // the stated RMS is ~0.02 (within 3 %), the sample's within 0.5 % of it; |mean| within ~7
        // standard errors (0.02 / sqrt(2M) = 1.4e-5)
        EXPECT_NEAR(want, 0.02, 0.0006) << gguf_tensor_type_name(t);
        EXPECT_NEAR(s.rms, want, 0.005 * want) << gguf_tensor_type_name(t);
        EXPECT_LT(std::fabs(s.mean), 1e-4) << gguf_tensor_type_name(t);
    }
}

TEST(QuantRandom, DeterministicInTheSeedAndRefusesOtherTypes) {
    const int64_t n = 10;  // 10 Q4_K blocks
    std::vector<uint8_t> a(n * 144), b(n * 144), c(n * 144);
    ASSERT_TRUE(quant_random_blocks(GGUF_TENSOR_Q4_K, 7, a.data(), n));
    ASSERT_TRUE(quant_random_blocks(GGUF_TENSOR_Q4_K, 7, b.data(), n));
    ASSERT_TRUE(quant_random_blocks(GGUF_TENSOR_Q4_K, 8, c.data(), n));
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    std::vector<uint8_t> d(64, 0xab);
    EXPECT_FALSE(quant_random_blocks(GGUF_TENSOR_Q4_0, 7, d.data(), 1));
    EXPECT_FALSE(quant_random_blocks(GGUF_TENSOR_F32, 7, d.data(), 1));
    EXPECT_EQ(d, std::vector<uint8_t>(64, 0xab));  // nothing written
    EXPECT_EQ(quant_random_rms(GGUF_TENSOR_Q4_0), 0.0);
}

TEST(QuantRandom, Q4KMMixOfThe7BPreset) {
    Qwen2Config c;
    ASSERT_TRUE(qwen2_preset("qwen2.5-7b", &c));
    std::vector<oomb_type> types;
    std::string err;
    ASSERT_TRUE(qwen2_random_base_types(c, "q4_k_m", &types, &err)) << err;
    const std::vector<Qwen2TensorSpec> specs = qwen2_tensors(c);
    ASSERT_EQ(types.size(), specs.size());
    // use_more_bits(i, 28): i < 3, i >= 24, or (i - 3) % 3 == 2
    auto more = [](int64_t i) { return i < 3 || i >= 24 || (i - 3) % 3 == 2; };
    int n_q6 = 0, n_q4 = 0;
    for (size_t i = 0; i < specs.size(); i++) {
        const Qwen2TensorSpec & s = specs[i];
        if (!qwen2_slot_is_projection(s.slot)) {
            EXPECT_EQ(types[i], OOMB_TYPE_COUNT) << s.name;  // embedding, head, norms, biases: as today
            continue;
        }
        const bool v_or_down = s.slot == Qwen2Slot::Wv || s.slot == Qwen2Slot::WDown;
        const oomb_type want = v_or_down && more(s.layer) ? OOMB_TYPE_Q6_K : OOMB_TYPE_Q4_K;
        EXPECT_EQ(types[i], want) << s.name;
        (types[i] == OOMB_TYPE_Q6_K ? n_q6 : n_q4)++;
    }
    EXPECT_EQ(n_q6, 2 * 14);  // attn_v and ffn_down of layers 0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27
    EXPECT_EQ(n_q4, 7 * 28 - 28);
    // one type for every projection; the tiny preset's 64-wide rows fall back (Q4_K -> Q5_0, Q6_K -> Q8_0)
    ASSERT_TRUE(qwen2_random_base_types(c, "q8_0", &types, &err)) << err;
    for (size_t i = 0; i < specs.size(); i++)
        EXPECT_EQ(types[i], qwen2_slot_is_projection(specs[i].slot) ? OOMB_TYPE_Q8_0 : OOMB_TYPE_COUNT) << specs[i].name;
    Qwen2Config t;
    ASSERT_TRUE(qwen2_preset("tiny", &t));
    const std::vector<Qwen2TensorSpec> ts = qwen2_tensors(t);
    ASSERT_TRUE(qwen2_random_base_types(t, "q4_k", &types, &err)) << err;
    for (size_t i = 0; i < ts.size(); i++)
        if (qwen2_slot_is_projection(ts[i].slot)) EXPECT_EQ(types[i], ts[i].ne[0] % 32 == 0 ? OOMB_TYPE_Q5_0 : OOMB_TYPE_COUNT) << ts[i].name;
    ASSERT_TRUE(qwen2_random_base_types(t, "q6_k", &types, &err)) << err;
    for (size_t i = 0; i < ts.size(); i++)
        if (qwen2_slot_is_projection(ts[i].slot)) EXPECT_EQ(types[i], OOMB_TYPE_Q8_0) << ts[i].name;
    EXPECT_FALSE(qwen2_random_base_types(t, "q4_0", &types, &err));
    EXPECT_NE(err.find("'q4_0'"), std::string::npos) << err;
    EXPECT_NE(err.find("q4_k_m, q4_k, q6_k or q8_0"), std::string::npos) << err;
}

TEST(QuantRandom, Q4KMBaseTrainsLoraOnTheCpu) {
    // K-quant rows (256 | n_embd, n_ff) and the mix's Q6_K layer (use_more_bits(1, 2))
    Qwen2Config c;
    c.n_vocab = 300; c.n_embd = 256; c.n_ff = 512; c.n_layer = 2; c.n_head = 4; c.n_head_kv = 2; c.head_dim = 64;
    c.rope_theta = 10000.0f; c.rms_eps = 1e-6f; c.tied = true;
    oomb_backend_t cpu = oomb_backend_cpu_init(2);
    std::vector<oomb_type> types;
    std::string err;
    ASSERT_TRUE(qwen2_random_base_types(c, "q4_k_m", &types, &err)) << err;
    auto m = qwen2_create_or_error(c, cpu, OOMB_TYPE_F32, &err, &types);
    ASSERT_TRUE(m) << err;
    qwen2_init_random(*m, 3);
    auto m2 = qwen2_create_or_error(c, cpu, OOMB_TYPE_F32, &err, &types);
    ASSERT_TRUE(m2) << err;
    qwen2_init_random(*m2, 3);
    int n_q4 = 0, n_q6 = 0;
    for (size_t i = 0; i < m->params.size(); i++) {
        const oomb_tensor * t = m->params[i];
        if (!oomb_type_is_quantized(t->type)) continue;
        (t->type == OOMB_TYPE_Q6_K ? n_q6 : n_q4)++;
        std::vector<uint8_t> b(oomb_nbytes(t)), b2(oomb_nbytes(t));
        oomb_tensor_get(t, b.data(), 0, b.size());
        oomb_tensor_get(m2->params[i], b2.data(), 0, b2.size());
        EXPECT_EQ(b, b2) << t->name << ": not deterministic in the seed";
        const uint32_t gt = oomb_type_to_ggml(t->type);
        const Stats s = stats_of(gt, b, oomb_nelements(t) / quant_block_size(gt));
        EXPECT_TRUE(s.finite) << t->name;
        EXPECT_NEAR(s.rms, 0.02, 0.002) << t->name;  // >= 65K values: a few % of sampling spread
        EXPECT_LT(std::fabs(s.mean), 5e-4) << t->name;
    }
    EXPECT_EQ(n_q6, 2);   // attn_v and ffn_down of layer 1 (use_more_bits(i, 2): i >= 7n/8 = 1)
    EXPECT_EQ(n_q4, 12);
    m2.reset();
    LoraConfig lc;
    lc.rank = 4;
    lc.alpha = 8.0f;
    ASSERT_TRUE(lora_attach(*m, lc, &err)) << err;
    lora_init_peft(*m->lora, 5);
    std::vector<oomb_tensor *> params = lora_set_trainable(*m);
    ChunkParams tp;
    tp.chunk = 7;
    tp.page = 5;
    tp.max_tokens = 19;
    std::mt19937 rng(1);
    std::vector<int32_t> ids;
    for (int i = 0; i < 19; i++) ids.push_back((int32_t) (rng() % 300));
    double first = 0, last = 0;
    {  // the driver goes before the model and the backend
        ChunkDriver tr(model_chunk_builder(*m), tp);
        for (int step = 0; step < 3; step++) {
            for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
            const ChunkStats st = tr.forward_backward(ids.data(), (int64_t) ids.size());
            ASSERT_TRUE(std::isfinite(st.loss_sum)) << "step " << step;
            ASSERT_GT(st.n_targets, 0);
            if (step == 0) first = st.loss_sum;
            last = st.loss_sum;
            // plain SGD on A and B (B starts at 0: its gradient is the non-zero one at step 0)
            double gmax = 0;
            for (oomb_tensor * p : params) {
                std::vector<float> v((size_t) oomb_nelements(p)), g(v.size());
                oomb_tensor_get(p, v.data(), 0, v.size() * 4);
                oomb_tensor_get(p->grad, g.data(), 0, g.size() * 4);
                for (size_t i = 0; i < v.size(); i++) {
                    ASSERT_TRUE(std::isfinite(g[i])) << p->name;
                    gmax = std::max(gmax, (double) std::fabs(g[i]));
                    v[i] -= 0.05f * g[i];
                }
                oomb_tensor_set(p, v.data(), 0, v.size() * 4);
            }
            EXPECT_GT(gmax, 0) << "step " << step << ": zero adapter gradients";
        }
    }
    printf("  loss sum: step 0 %.4f, step 2 %.4f\n", first, last);
    EXPECT_LT(last, first);  // SGD on the same tokens lowers the loss
    m.reset();
    oomb_backend_free(cpu);
}
