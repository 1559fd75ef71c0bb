// Host offload (oomb-offload.h) on the CPU backend, the stand-in of the GPU path: the same engine
// (tiered KV cache, page-block streaming, copies and events) with plain host memory for the host
// tier. Offloaded gradients equal the resident ones (to the rounding of the block-wise sums) and
// HF's float64 gradients (the fixtures), for chunk and page sizes that do not divide the sequence,
// every resident-page count from none to almost all, and blocks of one page and more; the device
// pools stay the same size whatever the context; a failed copy stops with a message; sparse
// attention over the host tier equals resident sparse attention and copies less.
#include "test-common.h"
#include "qwen2-parity.h"

#include "oomb-offload.h"
#include "oomb-sparse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace oomb;
using namespace oombtest;

namespace {

struct Grads {
    double loss = 0;
    std::vector<std::vector<float>> g;
};

Grads run_grads(const std::string & model, const Reference & ref, int64_t chunk, int page, int64_t resident, int block,
                bool with_labels = false, oomb_type grad_type = OOMB_TYPE_F32, size_t * host_bytes = nullptr,
                oomb_sparse_params sparse = {0, OOMB_SPARSE_SCORE_MEAN, 0, 0}) {
    ModelRun run(converted(model));
    ChunkParams tp;
    tp.sparse = sparse;
    tp.chunk = chunk;
    tp.page = page;
    tp.max_tokens = ref.T;
    tp.resident_pages = resident;
    tp.stream_block_pages = block;
    tp.kv_grad_type = grad_type;
    ChunkDriver tr(model_chunk_builder(*run.model), tp);
    if (host_bytes) *host_bytes = oomb_kv_cache_host_nbytes(tr.kv_cache());
    std::vector<int32_t> labels;
    Grads r;
    for (int64_t b = 0; b < ref.B; b++) {
        const int32_t * ids = ref.ids.data() + b * ref.T;
        if (with_labels) {  // mask every third target: the chat path's ignore-index labels
            labels.assign((size_t) ref.T, tp.ignore_index);
            for (int64_t i = 0; i + 1 < ref.T; i++)
                if (i % 3 != 1) labels[(size_t) i] = ids[i + 1];
        }
        r.loss += tr.forward_backward(ids, ref.T, with_labels ? labels.data() : nullptr).loss_sum;
    }
    for (oomb_tensor * p : run.params) r.g.push_back(run.grad(p->name));
    return r;
}

// max |a - b| / max |b| over every tensor
double worst_rel(const Grads & a, const Grads & b) {
    double w = 0;
    for (size_t i = 0; i < b.g.size(); i++) {
        double d = 0, m = 1e-30;
        for (size_t k = 0; k < b.g[i].size(); k++) {
            d = std::max(d, (double) std::fabs(a.g[i][k] - b.g[i][k]));
            m = std::max(m, (double) std::fabs(b.g[i][k]));
        }
        w = std::max(w, d / m);
    }
    return w;
}

} // namespace

// Offloaded vs resident, the same model and tokens: chunk 13 / page 5 (64 tokens: 13 pages, a
// chunk starting mid-page), every resident count, blocks of 1, 2 and 5 pages.
TEST(Offload, GradientsEqualResident) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    const Grads base = run_grads("qwen2-mini", ref, 13, 5, -1, 16);
    ASSERT_GT(base.g.size(), 10u);
    for (int64_t R : {0, 1, 3, 7, 12}) {
        for (int block : {1, 2, 5}) {
            SCOPED_TRACE("resident " + std::to_string(R) + " block " + std::to_string(block));
            const Grads off = run_grads("qwen2-mini", ref, 13, 5, R, block);
            EXPECT_LT(std::fabs(off.loss - base.loss) / std::fabs(base.loss), 1e-6);
            EXPECT_LT(worst_rel(off, base), 1e-5);
        }
    }
}

// One chunk per sequence (no stage 1: the backward graph stores its own K/V into the slots), and
// masked labels through chunks of 7 over pages of 3.
TEST(Offload, OneChunkAndMaskedLabels) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    const Grads one = run_grads("qwen2-mini", ref, ref.T, 16, -1, 16);
    EXPECT_LT(worst_rel(run_grads("qwen2-mini", ref, ref.T, 16, 1, 1), one), 1e-5);
    const Grads masked = run_grads("qwen2-mini", ref, 7, 3, -1, 16, true);
    const Grads masked_off = run_grads("qwen2-mini", ref, 7, 3, 2, 3, true);
    EXPECT_LT(std::fabs(masked_off.loss - masked.loss) / std::fabs(masked.loss), 1e-6);
    EXPECT_LT(worst_rel(masked_off, masked), 1e-5);
}

// bf16 KV-gradient pages, streamed: the host tier holds and copies 16-bit gradient pages (K/V f32 on
// the CPU: 12 instead of 16 bytes per element of a page over K, V, dK, dV), and the gradients stay
// within the stochastic rounding of the f32 pages' gradients, resident and streamed (measured here:
// a worst max-error / max-value of 5.6e-3 resident, 6.1e-3 streamed; the bound 1e-2 is far below
// what a wrong or garbage page gives, and far above the 1e-5 of f32 offload vs resident).
TEST(Offload, Bf16GradPages) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    size_t host32 = 0, host16 = 0;
    const Grads f32 = run_grads("qwen2-mini", ref, 13, 5, 3, 2, false, OOMB_TYPE_F32, &host32);
    const Grads res = run_grads("qwen2-mini", ref, 13, 5, -1, 16, false, OOMB_TYPE_BF16);
    const Grads off = run_grads("qwen2-mini", ref, 13, 5, 3, 2, false, OOMB_TYPE_BF16, &host16);
    ASSERT_GT(host32, 0u);
    EXPECT_LT(host16, host32);
    EXPECT_NEAR((double) host16 / (double) host32, 12.0 / 16.0, 0.02) << "host tier bytes: K/V f32 + dK/dV bf16";
    EXPECT_LT(std::fabs(off.loss - f32.loss) / std::fabs(f32.loss), 1e-6) << "the loss does not depend on the gradient pages";
    const double e_res = worst_rel(res, f32), e_off = worst_rel(off, f32);
    printf("bf16 gradient pages vs f32 (worst relative error over tensors): resident %.2e, offloaded %.2e\n", e_res, e_off);
    EXPECT_LT(e_res, 1e-2);
    EXPECT_LT(e_off, 1e-2);
    EXPECT_GT(e_off, 1e-7) << "bf16 pages give the f32 gradients bit for bit: not rounded?";
}

// Sparse attention (top-K pages, oomb-sparse.h) over a host tier, Qwen2 (RoPE, GQA): the loss and
// gradients of the resident sparse run, mean and quest (with sink / local pages), no page and 3
// pages resident, blocks of 1 and 2 listed pages; and fewer bytes copied than dense streaming.
TEST(Offload, SparseEqualsResidentSparse) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    for (const oomb_sparse_params & sp : {oomb_sparse_params{3, OOMB_SPARSE_SCORE_MEAN, 0, 0}, oomb_sparse_params{3, OOMB_SPARSE_SCORE_QUEST, 1, 1}}) {
        const Grads base = run_grads("qwen2-mini", ref, 13, 5, -1, 16, false, OOMB_TYPE_F32, nullptr, sp);
        ASSERT_GT(base.g.size(), 10u);
        for (int64_t R : {0, 3}) {
            for (int block : {1, 2}) {
                SCOPED_TRACE(std::string(sp.score ? "quest" : "mean") + " resident " + std::to_string(R) + " block " + std::to_string(block));
                const oomb_kv_stream_stats s0 = oomb_kv_stream_totals();
                const Grads dense = run_grads("qwen2-mini", ref, 13, 5, R, block);
                const oomb_kv_stream_stats s1 = oomb_kv_stream_totals();
                const Grads off = run_grads("qwen2-mini", ref, 13, 5, R, block, false, OOMB_TYPE_F32, nullptr, sp);
                const oomb_kv_stream_stats s2 = oomb_kv_stream_totals();
                EXPECT_LT(std::fabs(off.loss - base.loss) / std::fabs(base.loss), 1e-6);
                EXPECT_LT(worst_rel(off, base), 1e-5);
                EXPECT_GT(worst_rel(off, dense), 1e-3) << "sparse, not dense";
                EXPECT_LT(s2.bytes_in - s1.bytes_in, s1.bytes_in - s0.bytes_in) << "sparse streaming copies only the selected pages";
                EXPECT_GT(s2.bytes_in - s1.bytes_in, 0u);
            }
        }
    }
}

// Against HF transformers' float64 gradients (the fixture's tolerance), streamed.
TEST(Offload, GradientsMatchHF) {
    ModelRun mini(converted("qwen2-mini"));
    check_gradients(mini, "qwen2-mini", "short", 13, 5, {}, OOMB_TYPE_F32, false, OOMB_TYPE_F32, OOMB_TYPE_COUNT, 0, 2);
    ModelRun micro(converted("qwen2-micro"));
    check_gradients(micro, "qwen2-micro", "long", 1000, 64, {}, OOMB_TYPE_F32, false, OOMB_TYPE_F32, OOMB_TYPE_COUNT, 5, 4);
}

// Evaluation (forward only, no gradient pages): the Loss graphs store and stream.
TEST(Offload, ForwardLossEqualsResident) {
    Reference ref(fixtures_dir() + "/qwen2-micro/reference-long.safetensors");
    ModelRun run(converted("qwen2-micro"));
    double loss[2];
    for (int c = 0; c < 2; c++) {
        ChunkParams tp;
        tp.chunk = 300;
        tp.page = 48;
        tp.max_tokens = ref.T;
        tp.with_grad = false;
        tp.resident_pages = c ? 3 : -1;
        tp.stream_block_pages = 5;
        ChunkDriver tr(model_chunk_builder(*run.model), tp);
        loss[c] = tr.forward(ref.ids.data(), ref.T).loss_sum;
    }
    EXPECT_LT(std::fabs(loss[1] - loss[0]) / std::fabs(loss[0]), 1e-6) << loss[1] << " vs " << loss[0];
}

// The device pools do not grow with the context: resident pages + chunk slots + two block sets
// (the page table, 4 bytes per page, does); the host tier takes the rest. And the copies are counted.
TEST(Offload, DevicePoolsFlatInContext) {
    ModelRun run(converted("qwen2-micro"));
    size_t dev[2], host[2];
    const int64_t ctxs[2] = {4096, 65536};
    for (int i = 0; i < 2; i++) {
        ChunkParams tp;
        tp.chunk = 256;
        tp.page = 64;
        tp.max_tokens = ctxs[i];
        tp.resident_pages = 4;
        tp.stream_block_pages = 8;
        ChunkDriver tr(model_chunk_builder(*run.model), tp);
        EXPECT_EQ(oomb_kv_cache_resident_pages(tr.kv_cache()), 4);
        dev[i] = oomb_kv_cache_nbytes(tr.kv_cache());
        host[i] = oomb_kv_cache_host_nbytes(tr.kv_cache());
    }
    // only the page table (4 bytes per logical page) grows with the context
    EXPECT_LE(dev[1] - dev[0], (size_t) (ctxs[1] / 64) * 4);
    EXPECT_GT(host[1], 15 * host[0]);
    Reference ref(fixtures_dir() + "/qwen2-micro/reference-long.safetensors");
    const oomb_kv_stream_stats s0 = oomb_kv_stream_totals();
    ChunkParams tp;
    tp.chunk = 500;
    tp.page = 64;
    tp.max_tokens = ref.T;
    tp.resident_pages = 2;
    tp.stream_block_pages = 3;
    ChunkDriver tr(model_chunk_builder(*run.model), tp);
    tr.forward_backward(ref.ids.data(), ref.T);
    const oomb_kv_stream_stats s1 = oomb_kv_stream_totals();
    EXPECT_GT(s1.bytes_in, s0.bytes_in);
    EXPECT_GT(s1.bytes_out, s0.bytes_out);
    EXPECT_GT(s1.n_blocks, s0.n_blocks);
}

// Slots past what can ever be used are not allocated: a block (or chunk) larger than the host
// tier's pages is capped at them (kv_cache_init_tiered), and a driver given such a block streams
// the same gradients as with the capped one.
TEST(Offload, SlotsCappedAtHostPages) {
    ModelRun run(converted("qwen2-micro"));
    oomb_kv_cache_params kp{};
    kp.n_layer = 2;
    kp.n_head_kv = 1;
    kp.head_dim = 8;
    kp.page_size = 4;
    kp.max_tokens = 37;  // 10 pages, the last one partial
    kp.type = OOMB_TYPE_F32;
    kp.with_grad = true;
    kp.grad_type = OOMB_TYPE_F32;
    const int64_t R = 3, n_host = 10 - R;
    for (const oomb_kv_tier_params t : {oomb_kv_tier_params{R, 4096, 2}, oomb_kv_tier_params{R, 2, 1000}, oomb_kv_tier_params{R, 5, 3}}) {
        oomb_kv_cache_t kv = oomb_kv_cache_init_tiered(run.backend, kp, t);
        ASSERT_NE(kv, nullptr);
        const int64_t want = R + std::min<int64_t>(t.chunk_pages, n_host) + 2 * std::min<int64_t>(t.block_pages, n_host);
        for (int l = 0; l < kp.n_layer; l++) {
            EXPECT_EQ(oomb_kv_cache_k(kv, l)->ne[3], want) << "block " << t.block_pages << " chunk " << t.chunk_pages;
            EXPECT_EQ(oomb_kv_cache_dv(kv, l)->ne[3], want);
        }
        EXPECT_EQ(oomb_kv_cache_resident_pages(kv), R);
        oomb_kv_cache_free(kv);
    }
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    const Grads capped = run_grads("qwen2-mini", ref, 13, 5, 2, 11);  // 13 pages, 11 streamed
    const Grads huge = run_grads("qwen2-mini", ref, 13, 5, 2, 1 << 20);
    EXPECT_EQ(capped.loss, huge.loss);
    ASSERT_EQ(capped.g.size(), huge.g.size());
    for (size_t i = 0; i < capped.g.size(); i++) EXPECT_EQ(capped.g[i], huge.g[i]) << "tensor " << i;
}

namespace {

// The streams' queue order (OOMB_DEBUG_OFFLOAD_TRACE) of one run, per compute: per attention node k
// its kind and the positions of "p<k>" (its part launched) and "i<k>.0" (its first block queued).
struct NodeOrder { int kind = -1; long part = -1, first = -1, self = -1; };
std::vector<std::vector<NodeOrder>> parse_trace(const std::string & t, std::string * tokens) {
    std::vector<std::vector<NodeOrder>> out;
    size_t pos = 0;
    while (pos < t.size()) {
        const size_t eol = std::min(t.find('\n', pos), t.size());
        std::vector<NodeOrder> nodes;
        long n = 0;
        for (size_t a = pos; a < eol;) {
            size_t b = t.find(' ', a);
            if (b == std::string::npos || b > eol) b = eol;
            const std::string tok = t.substr(a, b - a);
            a = b + 1;
            if (tok.empty()) continue;
            *tokens += tok + " ";
            int k = -1, x = -1;
            if (sscanf(tok.c_str() + 1, "%d", &k) != 1 || k < 0 || tok[0] == 'c') { n++; continue; }
            if ((size_t) k >= nodes.size()) nodes.resize((size_t) k + 1);
            if (tok[0] == 'p') nodes[(size_t) k].part = n;
            if (tok[0] == 'i' && sscanf(tok.c_str(), "i%d.%d", &k, &x) == 2 && x == 0) nodes[(size_t) k].first = n;
            if (tok[0] == 'n' && sscanf(tok.c_str(), "n%d:%d", &k, &x) == 2) {
                nodes[(size_t) k].kind = x;
                nodes[(size_t) k].self = n;
            }
            n++;
        }
        out.push_back(nodes);
        pos = eol + 1;
    }
    return out;
}

} // namespace

// OOMB_OFFLOAD_EARLY_COPIES: 1 queues a node's first block before the graph part that precedes it
// (dense nodes and stage 2's sparse nodes; stage 1's sparse nodes, whose lists that part computes,
// after it), 0 after that part, as before; the same operations either way (only the order moves)
// and bit-identical gradients, dense and sparse, over chunk 13 / page 5 / blocks of 2 and 3.
TEST(Offload, EarlyCopiesReorderOnly) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    setenv("OOMB_DEBUG_OFFLOAD_TRACE", "1", 1);
    oomb_kv_stream_debug_trace();  // drop what earlier tests left
    for (const oomb_sparse_params & sp : {oomb_sparse_params{0, OOMB_SPARSE_SCORE_MEAN, 0, 0}, oomb_sparse_params{3, OOMB_SPARSE_SCORE_QUEST, 1, 1}}) {
        for (int block : {2, 3}) {
            SCOPED_TRACE(std::string(sp.pages ? "sparse" : "dense") + " block " + std::to_string(block));
            Grads g[2];
            std::string tokens[2];
            int n_early = 0, n_late = 0, n_in_graph = 0;
            for (int early = 0; early < 2; early++) {
                setenv("OOMB_OFFLOAD_EARLY_COPIES", early ? "1" : "0", 1);
                g[early] = run_grads("qwen2-mini", ref, 13, 5, 1, block, false, OOMB_TYPE_F32, nullptr, sp);
                const auto computes = parse_trace(oomb_kv_stream_debug_trace(), &tokens[early]);
                ASSERT_GT(computes.size(), 4u) << "no trace: OOMB_DEBUG_OFFLOAD_TRACE";
                for (const auto & nodes : computes) {
                    for (const NodeOrder & o : nodes) {
                        if (o.kind < 0) continue;  // the rest ("p<n>")
                        ASSERT_GE(o.part, 0);
                        ASSERT_GT(o.self, o.part) << "a node's kernels after its part";
                        if (o.first < 0) continue;  // no streamed history block
                        EXPECT_LT(o.first, o.self) << "the first block is queued before the node's own kernels";
                        const bool want_early = early && o.kind != 2;
                        if (want_early) EXPECT_LT(o.first, o.part) << "kind " << o.kind;
                        else EXPECT_GT(o.first, o.part) << "kind " << o.kind << " early " << early;
                        (o.first < o.part ? n_early : n_late)++;
                        n_in_graph += o.kind == 2;
                    }
                }
            }
            unsetenv("OOMB_OFFLOAD_EARLY_COPIES");
            EXPECT_GT(n_early, 10) << "some first copies were queued early";
            if (sp.pages) EXPECT_GT(n_in_graph, 0) << "stage 1's sparse nodes were seen (and stayed late)";
            // the same operations, reordered
            std::vector<std::string> t[2];
            for (int e = 0; e < 2; e++) {
                for (size_t a = 0, b; a < tokens[e].size(); a = b + 1) {
                    b = tokens[e].find(' ', a);
                    t[e].push_back(tokens[e].substr(a, b - a));
                }
                std::sort(t[e].begin(), t[e].end());
            }
            EXPECT_NE(tokens[0], tokens[1]);
            EXPECT_EQ(t[0], t[1]);
            EXPECT_EQ(g[0].loss, g[1].loss);
            ASSERT_EQ(g[0].g.size(), g[1].g.size());
            for (size_t i = 0; i < g[0].g.size(); i++) EXPECT_EQ(g[0].g[i], g[1].g[i]) << "tensor " << i;
        }
    }
    unsetenv("OOMB_DEBUG_OFFLOAD_TRACE");
    setenv("OOMB_OFFLOAD_EARLY_COPIES", "2", 1);
    EXPECT_OOMB_ERROR(run_grads("qwen2-mini", ref, 13, 5, 1, 2), "OOMB_OFFLOAD_EARLY_COPIES=2: must be 0 or 1");
    unsetenv("OOMB_OFFLOAD_EARLY_COPIES");
}

// A copy that fails stops the step with a message naming it (the driver raises it), with early
// copies and without.
TEST(Offload, FailedCopyIsAnError) {
    Reference ref(fixtures_dir() + "/qwen2-mini/reference-short.safetensors");
    ModelRun run(converted("qwen2-mini"));
    ChunkParams tp;
    tp.chunk = 13;
    tp.page = 5;
    tp.max_tokens = ref.T;
    tp.resident_pages = 1;
    tp.stream_block_pages = 2;
    for (const char * early : {"1", "0"}) {
        SCOPED_TRACE(std::string("early copies ") + early);
        setenv("OOMB_OFFLOAD_EARLY_COPIES", early, 1);
        setenv("OOMB_DEBUG_OFFLOAD_FAIL_COPY", *early == '1' ? "40" : "41", 1);  // a new value arms it again
        ChunkDriver tr(model_chunk_builder(*run.model), tp);
        EXPECT_OOMB_ERROR(tr.forward_backward(ref.ids.data(), ref.T),
                          std::string("copy ") + (*early == '1' ? "40" : "41") + " failed (injected by OOMB_DEBUG_OFFLOAD_FAIL_COPY)");
        unsetenv("OOMB_DEBUG_OFFLOAD_FAIL_COPY");
    }
    unsetenv("OOMB_OFFLOAD_EARLY_COPIES");
}

TEST(Offload, Errors) {
    ModelRun run(converted("qwen2-micro"));
    ChunkParams tp;
    tp.chunk = 64;
    tp.page = 16;
    tp.max_tokens = 256;
    tp.resident_pages = 2;
    tp.cache_attn = true;
    EXPECT_OOMB_ERROR(ChunkDriver(model_chunk_builder(*run.model), tp), "does not work with a host tier");
    tp.cache_attn = false;
    tp.stream_block_pages = 0;
    EXPECT_OOMB_ERROR(ChunkDriver(model_chunk_builder(*run.model), tp), "stream_block_pages = 0 must be positive");
    oomb_kv_cache_params kp{};
    kp.n_layer = 2;
    kp.n_head_kv = 1;
    kp.head_dim = 8;
    kp.page_size = 4;
    kp.max_tokens = 64;
    kp.type = OOMB_TYPE_F32;
    oomb_kv_tier_params bad{-1, 1, 1};
    EXPECT_OOMB_ERROR(oomb_kv_cache_init_tiered(run.backend, kp, bad), "bad tier sizes");
    // a cache without a host tier has nothing to stream
    oomb_kv_cache_t plain = oomb_kv_cache_init(run.backend, kp);
    oomb_context * ctx = oomb_init({0, true});
    oomb_cgraph * g = oomb_new_graph(ctx);
    EXPECT_OOMB_ERROR(oomb_kv_stream_new(plain, run.backend, g), "has no host tier");
    oomb_free(ctx);
    oomb_kv_cache_free(plain);
    // a streamed backward without the forward's saved statistics (fwd NULL) is refused: its page
    // blocks would recompute them over their own keys only (found by the review of 2026-12-03: the
    // dq of such a graph came out wrong, relative error 4.7, with no error)
    kp.with_grad = true;
    oomb_kv_cache_t tiered = oomb_kv_cache_init_tiered(run.backend, kp, oomb_kv_tier_params{2, 2, 3});
    ASSERT_NE(tiered, nullptr);
    oomb_context * c2 = oomb_init({0, true});
    const int64_t T = 5;
    oomb_tensor * q = oomb_new_tensor_3d(c2, OOMB_TYPE_F32, 8, 2, T);
    oomb_tensor * dout = oomb_new_tensor_3d(c2, OOMB_TYPE_F32, 8, 2, T);
    oomb_tensor * pos = oomb_new_tensor_1d(c2, OOMB_TYPE_I32, T);
    oomb_tensor * back = oomb_paged_attn_back(c2, q, oomb_kv_cache_k(tiered, 0), oomb_kv_cache_v(tiered, 0), oomb_kv_cache_dk(tiered, 0),
                                              oomb_kv_cache_dv(tiered, 0), oomb_kv_cache_page_table(tiered), pos, dout, nullptr, 0.3f);
    oomb_cgraph * g2 = oomb_new_graph(c2);
    oomb_build_forward_expand(g2, back);
    EXPECT_OOMB_ERROR(oomb_kv_stream_new(tiered, run.backend, g2), "needs the forward's saved statistics");
    oomb_free(c2);
    oomb_kv_cache_free(tiered);
}
