// Qwen2 parity with HF transformers (float64 references in the fixtures) through the OOMB
// chunk-recurrent trainer on the CPU: loss, logits, hidden states and every parameter gradient,
// for whole-sequence chunks and for chunked runs (chunk not a multiple of the page included).
#include "test-common.h"
#include "qwen2-parity.h"

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

using namespace oombtest;

void check_cpu(const std::string & model, const std::string & ref, int64_t chunk, int page) {
    ModelRun run(converted(model));
    check_gradients(run, model, ref, chunk, page);
}

TEST(Qwen2Parity, MicroShortForwardLogitsHidden) {
    for (const std::string model_name : {"qwen2-micro", "qwen2-mini"}) check_forward(model_name);
}

TEST(Qwen2Parity, MicroShortGradients) { check_cpu("qwen2-micro", "short", 64, 16); }
TEST(Qwen2Parity, MiniShortGradients) { check_cpu("qwen2-mini", "short", 64, 16); }
TEST(Qwen2Parity, MiniShortGradientsChunked) { check_cpu("qwen2-mini", "short", 24, 16); }
TEST(Qwen2Parity, MicroShortGradientsTinyChunks) { check_cpu("qwen2-micro", "short", 7, 4); }

// The long reference (4096 tokens) through chunk 512 / page 64, a chunk that is not a multiple of
// the page (1000), and chunk = sequence.
TEST(Qwen2Parity, MicroLongChunk512) { check_cpu("qwen2-micro", "long", 512, 64); }
TEST(Qwen2Parity, MicroLongChunk1000) { check_cpu("qwen2-micro", "long", 1000, 64); }
TEST(Qwen2Parity, MicroLongWholeSequence) { check_cpu("qwen2-micro", "long", 4096, 64); }
// stage 2 loading stage 1's attention results (ChunkParams::cache_attn) instead of
// recomputing them: the references as above, and bit-identical gradients to the recompute
TEST(Qwen2Parity, MicroLongChunk512AttnCache) {
    ModelRun run(converted("qwen2-micro"));
    check_gradients(run, "qwen2-micro", "long", 512, 64, {}, OOMB_TYPE_F32, true);
}
// a bf16 cache: out rounded to bf16 in stage 2 (the LSE exact), so the f32 CPU run carries bf16
// rounding of the attention output into the output projection and the backward
TEST(Qwen2Parity, MicroLongChunk512AttnCacheBf16) {
    ModelRun run(converted("qwen2-micro"));
    ParityTolerance tol;
    tol.loss = 1e-3;
    tol.grad = 1e-2;  // measured: 0.7-1e-3 for most tensors, 6.7e-3 for blk.1.attn_k.bias
    check_gradients(run, "qwen2-micro", "long", 512, 64, tol, OOMB_TYPE_F32, true, OOMB_TYPE_BF16);
}
// the GPU backend's graph on the CPU: bf16 storage of the activations and SwiGLU gradients that
// only feed matrix products (ChunkParams::gemm_input_type; the CPU's f32 products then see
// bf16-rounded operands, as the GPU's bf16 products do), against the float64 references at the
// issue's bf16 gate
TEST(Qwen2Parity, MicroLongChunk512Bf16GemmInputs) {
    ModelRun run(converted("qwen2-micro"));
    ParityTolerance tol;
    tol.loss = 1e-2;
    tol.grad = 3e-2;  // measured by a review: 0.4-1.1e-2 (before the gate / up products were stored in bf16 too)
    check_gradients(run, "qwen2-micro", "long", 512, 64, tol, OOMB_TYPE_F32, false, OOMB_TYPE_F32, OOMB_TYPE_BF16);
}
TEST(Qwen2Parity, MiniShortChunkedBf16GemmInputs) {
    ModelRun run(converted("qwen2-mini"));
    ParityTolerance tol;
    tol.loss = 1e-2;
    tol.grad = 3e-2;
    check_gradients(run, "qwen2-mini", "short", 24, 16, tol, OOMB_TYPE_F32, false, OOMB_TYPE_F32, OOMB_TYPE_BF16);
    // the setting takes effect: the bf16 run's loss differs from the f32 run's (rounding), slightly
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    double loss[2];
    for (int i = 0; i < 2; i++) {
        ChunkParams tp;
        tp.chunk = 24;
        tp.page = 16;
        tp.max_tokens = ref.T;
        tp.gemm_input_type = i ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
        ChunkDriver tr(qwen2_chunk_builder(*run.model), tp);
        loss[i] = tr.forward_backward(ref.ids.data(), ref.T).loss_sum;
    }
    EXPECT_NE(loss[0], loss[1]);
    EXPECT_LT(std::fabs(loss[0] - loss[1]) / std::fabs(loss[0]), 1e-2);
}
TEST(Qwen2Errors, BadGemmInputType) {
    ModelRun run(converted("qwen2-micro"));
    ChunkParams tp;
    tp.max_tokens = 64;
    tp.gemm_input_type = OOMB_TYPE_I32;
    EXPECT_OOMB_ERROR(ChunkDriver(qwen2_chunk_builder(*run.model), tp), "gemm_input_type must be f32, bf16");
}
TEST(Qwen2Parity, MiniShortChunkedAttnCacheBitIdentical) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    std::vector<std::vector<float>> g[2];
    double loss[2] = {0, 0};
    for (int c = 0; c < 2; c++) {
        ModelRun run(converted("qwen2-mini"));
        ChunkParams tp;
        tp.chunk = 24;
        tp.page = 16;
        tp.max_tokens = ref.T;
        tp.cache_attn = c == 1;
        ChunkDriver tr(qwen2_chunk_builder(*run.model), tp);
        EXPECT_EQ(tr.attn_cache_bytes() > 0, c == 1);
        if (c == 1) {  // one chunk per sequence: no stage 1, so no cache is allocated
            ChunkParams one = tp;
            one.chunk = ref.T;
            EXPECT_EQ(ChunkDriver(qwen2_chunk_builder(*run.model), one).attn_cache_bytes(), 0u);
        }
        for (int64_t b = 0; b < ref.B; b++) loss[c] += tr.forward_backward(ref.ids.data() + b * ref.T, ref.T).loss_sum;
        for (oomb_tensor * p : run.params) g[c].push_back(run.grad(p->name));
    }
    EXPECT_EQ(loss[0], loss[1]);
    ASSERT_EQ(g[0].size(), g[1].size());
    ASSERT_GT(g[0].size(), 10u);
    for (size_t i = 0; i < g[0].size(); i++) EXPECT_EQ(g[0][i], g[1][i]) << "gradient " << i;
}

TEST(Qwen2Parity, MicroLongLastLogits) {
    Reference ref(oombtest::fixtures_dir() + "/qwen2-micro/reference-long.safetensors");
    ModelRun run(converted("qwen2-micro"));
    ChunkParams tp;
    tp.chunk = 512;
    tp.page = 64;
    tp.max_tokens = ref.T;
    ChunkDriver tr(qwen2_chunk_builder(*run.model), tp);
    tr.set_capture_hidden(true);
    ChunkStats st = tr.forward(ref.ids.data(), ref.T);
    EXPECT_LT(std::fabs(st.loss_sum / st.n_targets - ref.loss) / ref.loss, 1e-5);
    const int64_t V = run.model->cfg.n_vocab;
    const std::vector<float> lg = tr.logits();  // last chunk: 512 tokens
    std::vector<float> last8(lg.end() - 8 * V, lg.end());
    EXPECT_LT(rel_err(last8, ref.get("logits_last8")), 1e-5);
}

// An evaluation-only driver (ChunkParams::with_grad = false, as oomb-eval) has no KV-gradient
// pages: with f32 K/V its KV cache is half the training one's (K, V vs K, V, dK, dV; the page
// table aside), forward() gives bit-identical losses over several chunks, and
// forward_backward() and backward graphs are refused with a message.
TEST(Qwen2Eval, NoGradientPages) {
    Reference ref(oombtest::fixtures_dir() + "/qwen2-micro/reference-long.safetensors");
    ModelRun run(converted("qwen2-micro"));
    ChunkParams tp;
    tp.chunk = 1000;  // several chunks, the last one shorter
    tp.page = 64;
    tp.max_tokens = ref.T;
    tp.cache_attn = true;  // unused without stage 2: not allocated
    ChunkDriver train(qwen2_chunk_builder(*run.model), tp);
    tp.with_grad = false;
    ChunkDriver eval(qwen2_chunk_builder(*run.model), tp);
    EXPECT_EQ(oomb_kv_cache_dk(eval.kv_cache(), 0), nullptr);
    EXPECT_EQ(oomb_kv_cache_dv(eval.kv_cache(), 0), nullptr);
    EXPECT_NE(oomb_kv_cache_dk(train.kv_cache(), 0), nullptr);
    EXPECT_EQ(eval.attn_cache_bytes(), 0u);
    EXPECT_GT(train.attn_cache_bytes(), 0u);
    const size_t kv_eval = oomb_kv_cache_nbytes(eval.kv_cache()), kv_train = oomb_kv_cache_nbytes(train.kv_cache());
    EXPECT_LT(kv_eval, kv_train * 51 / 100) << kv_eval << " vs " << kv_train;
    const ChunkStats a = train.forward(ref.ids.data(), ref.T), b = eval.forward(ref.ids.data(), ref.T);
    EXPECT_EQ(a.n_targets, b.n_targets);
    EXPECT_EQ(a.loss_sum, b.loss_sum);
    EXPECT_LT(std::fabs(b.loss_sum / b.n_targets - ref.loss) / ref.loss, 1e-5);
    EXPECT_OOMB_ERROR(eval.forward_backward(ref.ids.data(), ref.T), "no KV-gradient pages");
    EXPECT_OOMB_ERROR(eval.planned_bytes(64, ChunkKind::Backward), "needs the KV-gradient pages");
}

// The optional labels of forward() / forward_backward(): labels = the next ids give the same
// result bit for bit as none; with positions masked (ignore_index) the loss is the sum of the
// single-position losses of the kept positions and n_targets counts exactly those, over several
// chunks; forward_backward() sums the same loss; a label outside the vocabulary is an error.
TEST(Qwen2Labels, MaskedLossIsTheSumOverKeptPositions) {
    ModelRun run(converted("qwen2-micro"));
    const Reference ref(oombtest::fixtures_dir() + "/qwen2-micro/reference-short.safetensors");
    ChunkParams tp;
    tp.max_tokens = ref.T;
    tp.chunk = 7, tp.page = 4;  // several chunks, the last one shorter
    ChunkDriver tr(qwen2_chunk_builder(*run.model), tp);
    const int64_t n = ref.T;
    ASSERT_GT(n, 12);
    std::vector<int32_t> next((size_t) n, tp.ignore_index);
    for (int64_t i = 0; i + 1 < n; i++) next[i] = ref.ids[i + 1];
    const ChunkStats plain = tr.forward(ref.ids.data(), n), same = tr.forward(ref.ids.data(), n, next.data());
    EXPECT_EQ(plain.loss_sum, same.loss_sum);
    EXPECT_EQ(plain.n_targets, same.n_targets);
    EXPECT_EQ(plain.n_targets, n - 1);
    // keep positions 1, 5, 6 and 11 (in three different chunks)
    const std::vector<int64_t> keep = {1, 5, 6, 11};
    std::vector<int32_t> masked((size_t) n, tp.ignore_index);
    double sum_single = 0;
    for (int64_t k : keep) {
        masked[k] = next[k];
        std::vector<int32_t> one((size_t) n, tp.ignore_index);
        one[k] = next[k];
        const ChunkStats s = tr.forward(ref.ids.data(), n, one.data());
        EXPECT_EQ(s.n_targets, 1);
        EXPECT_GT(s.loss_sum, 0.0);
        sum_single += s.loss_sum;
    }
    const ChunkStats m = tr.forward(ref.ids.data(), n, masked.data());
    EXPECT_EQ(m.n_targets, (int64_t) keep.size());
    EXPECT_NEAR(m.loss_sum, sum_single, 1e-5 * sum_single);
    EXPECT_LT(m.loss_sum, plain.loss_sum);
    const ChunkStats mb = tr.forward_backward(ref.ids.data(), n, masked.data());
    EXPECT_EQ(mb.n_targets, (int64_t) keep.size());
    EXPECT_NEAR(mb.loss_sum, m.loss_sum, 1e-5 * m.loss_sum);
    masked[3] = (int32_t) run.model->cfg.n_vocab;
    EXPECT_OOMB_ERROR(tr.forward(ref.ids.data(), n, masked.data()), "label");
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
        ChunkParams tp;
        tp.chunk = 256;
        tp.page = 64;
        tp.max_tokens = ctxs[i];
        ChunkDriver tr(qwen2_chunk_builder(*m), tp);
        planned[i] = tr.planned_bytes(256, ChunkKind::Backward);
        EXPECT_LE(tr.planned_bytes(256, ChunkKind::Loss), planned[i]);
        EXPECT_LE(tr.planned_bytes(256, ChunkKind::Fill), tr.planned_bytes(256, ChunkKind::Loss));
    }
    EXPECT_EQ(planned[0], planned[1]);
    m.reset();
    oomb_backend_free(cpu);
}

// The LM head and the loss are fused over vocabulary tiles: the chunk graph's arena holds no
// [n_vocab, T] logits (nor their gradient), so it no longer grows by ~V*T*4 bytes per chunk. The
// Loss graph with the parity hook on (capture_hidden) keeps the unfused head and is the "before".
TEST(Qwen2Memory, ArenaDoesNotScaleWithVocabTimesTokens) {
    oomb_backend_t cpu = oomb_backend_cpu_init(1);
    Qwen2Config c;
    ASSERT_TRUE(qwen2_preset("tiny", &c));  // the real 151,936-token vocabulary, n_embd 64
    auto m = qwen2_create(c, cpu, OOMB_TYPE_BF16);
    qwen2_set_trainable(*m, Qwen2Trainable::All);
    const int64_t V = c.n_vocab, E = c.n_embd;
    ChunkParams tp;
    tp.chunk = 1024;
    tp.page = 64;
    tp.max_tokens = 1024;
    size_t loss_fused[2], back_fused[2], loss_unfused[2];
    const int64_t Ts[2] = {512, 1024};
    {
        ChunkDriver tr(qwen2_chunk_builder(*m), tp);
        for (int i = 0; i < 2; i++) {
            loss_fused[i] = tr.planned_bytes(Ts[i], ChunkKind::Loss);
            back_fused[i] = tr.planned_bytes(Ts[i], ChunkKind::Backward);
        }
    }
    {
        ChunkDriver tr(qwen2_chunk_builder(*m), tp);
        tr.set_capture_hidden(true);
        for (int i = 0; i < 2; i++) loss_unfused[i] = tr.planned_bytes(Ts[i], ChunkKind::Loss);
    }
    for (int i = 0; i < 2; i++) {
        const size_t vt4 = (size_t) (V * Ts[i] * 4);
        printf("  T = %lld: V*T*4 = %zu; Loss arena %zu fused, %zu unfused; Backward arena %zu fused\n", (long long) Ts[i], vt4,
               loss_fused[i], loss_unfused[i], back_fused[i]);
        EXPECT_GE(loss_unfused[i], vt4) << "the unfused head stores the logits";
        EXPECT_LT(loss_fused[i], vt4 / 8) << "the fused Loss graph holds no [V, T] logits";
        // the Backward graph: a few [E, V] f32 gradient buffers (LM head, embedding), not [V, T]
        EXPECT_LT(back_fused[i], vt4 / 2);
        EXPECT_LT(back_fused[i], (size_t) (4 * E * V * 4) + vt4 / 8);
    }
    // doubling the chunk adds activations of ~E-sized rows per token, not V per token
    const size_t dV = (size_t) (V * (Ts[1] - Ts[0]) * 4);
    EXPECT_GE(loss_unfused[1] - loss_unfused[0], dV);
    EXPECT_LT(loss_fused[1] - loss_fused[0], dV / 16);
    EXPECT_LT(back_fused[1] - back_fused[0], dV / 16);
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
    ChunkParams tp;
    tp.chunk = 8;
    tp.page = 4;
    tp.max_tokens = 16;
    {
        ChunkDriver tr(qwen2_chunk_builder(*m), tp);
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
