// Qwen2 on the CUDA backend (bf16 weights and KV pages, f32 accumulation): the chunk trainer's
// loss and every gradient against HF's float64 references and against the CPU backend, at the
// bf16 tolerance of issue 5 (3e-2). Skipped (visibly) without a CUDA GPU.
#include "test-common.h"
#include "qwen2-parity.h"

#include <gtest/gtest.h>

namespace {

using namespace oombtest;
using namespace oomb;

const ParityTolerance k_bf16 = {3e-2, 3e-2};

struct Cuda {
    oomb_backend_t b = nullptr;
    Cuda() { if (oomb_cuda_available()) b = oomb_backend_cuda_init(0); }
    ~Cuda() { oomb_backend_free(b); }
};

#define REQUIRE_GPU(c) \
    if (!(c).b) GTEST_SKIP() << "no CUDA GPU"

void check_cuda(const std::string & model, const std::string & ref, int64_t chunk, int page, bool cache_attn = false,
                oomb_type cache_type = OOMB_TYPE_F32) {
    Cuda c;
    REQUIRE_GPU(c);
    ModelRun run(converted(model), c.b, OOMB_TYPE_BF16);
    check_gradients(run, model, ref, chunk, page, k_bf16, OOMB_TYPE_BF16, cache_attn, cache_type);
}

TEST(CudaQwen2Parity, MicroShort) { check_cuda("qwen2-micro", "short", 64, 64); }
TEST(CudaQwen2Parity, MiniShortChunked) { check_cuda("qwen2-mini", "short", 24, 64); }
TEST(CudaQwen2Parity, MiniShortPage128) { check_cuda("qwen2-mini", "short", 64, 128); }
TEST(CudaQwen2Parity, MicroLongChunk1000) { check_cuda("qwen2-micro", "long", 1000, 64); }
// stage 2 loading stage 1's attention results from the cache (oomb_paged_attn_cached on the GPU)
TEST(CudaQwen2Parity, MicroLongChunk1000AttnCache) { check_cuda("qwen2-micro", "long", 1000, 64, true); }
TEST(CudaQwen2Parity, MicroLongChunk1000AttnCacheBf16) { check_cuda("qwen2-micro", "long", 1000, 64, true, OOMB_TYPE_BF16); }

// Llama (tests/fixtures/llama-*: no biases, GQA 6/2 and 9/3, head dims 10 and 6 on the generic
// kernels; tied and untied heads) through the same chunk driver on the GPU.
TEST(CudaLlamaParity, MicroChunked) { check_cuda("llama-micro", "short", 24, 16); }
TEST(CudaLlamaParity, MiniChunked) { check_cuda("llama-mini", "short", 20, 8); }
TEST(CudaLlamaParity, Rope3Chunked) { check_cuda("llama-rope3", "short", 20, 8); }  // Llama 3.x RoPE frequency factors

// The CUDA backend's gradients against the CPU backend's on the same chunking.
TEST(CudaQwen2Parity, MatchesCpuBackend) {
    Cuda c;
    REQUIRE_GPU(c);
    const std::string gguf = converted("qwen2-mini");
    ModelRun gpu(gguf, c.b, OOMB_TYPE_BF16);
    ModelRun cpu(gguf);
    const int64_t n_gpu = check_gradients(gpu, "qwen2-mini", "short", 40, 64, k_bf16, OOMB_TYPE_BF16);
    const int64_t n_cpu = check_gradients(cpu, "qwen2-mini", "short", 40, 64);
    ASSERT_EQ(n_gpu, n_cpu);
    for (oomb_tensor * p : cpu.params) {
        const std::vector<float> gc = cpu.grad(p->name), gg = gpu.grad(p->name);
        const std::vector<double> ref(gc.begin(), gc.end());
        const double e = rel_err(gg, ref);
        EXPECT_LT(e, 3e-2) << p->name << ": CUDA vs CPU relative error " << e;
    }
}

// Host offload on the GPU (oomb-offload.h): pinned host pages streamed through device slots on the
// copy stream. Against HF at the bf16 tolerance, and against the resident run on the same GPU: the
// same kernels and K/V values, only the blocks' summation order differs (measured and printed;
// bounded at 1e-2 of each gradient's norm, the bf16 GEMM inputs amplifying f32 rounding).
TEST(CudaOffload, GradientsMatchHFAndResident) {
    Cuda c;
    REQUIRE_GPU(c);
    const std::string gguf = converted("qwen2-micro");
    ModelRun res(gguf, c.b, OOMB_TYPE_BF16), off(gguf, c.b, OOMB_TYPE_BF16);
    check_gradients(res, "qwen2-micro", "long", 1000, 64, k_bf16, OOMB_TYPE_BF16);
    check_gradients(off, "qwen2-micro", "long", 1000, 64, k_bf16, OOMB_TYPE_BF16, false, OOMB_TYPE_F32, OOMB_TYPE_COUNT, 5, 4);
    double worst = 0;
    for (oomb_tensor * p : res.params) {
        const std::vector<float> gr = res.grad(p->name), go = off.grad(p->name);
        const double e = rel_err(go, std::vector<double>(gr.begin(), gr.end()));
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-2) << p->name << ": offloaded vs resident relative error " << e;
    }
    printf("offloaded vs resident (GPU, chunk 1000, page 64, 5 resident pages, blocks of 4): worst gradient relative error %.3e\n", worst);
    // odd sizes on the generic kernels: chunk 13, page 5, nothing resident, blocks of 1 page
    ModelRun mini(converted("qwen2-mini"), c.b, OOMB_TYPE_BF16);
    check_gradients(mini, "qwen2-mini", "short", 13, 5, k_bf16, OOMB_TYPE_BF16, false, OOMB_TYPE_F32, OOMB_TYPE_COUNT, 0, 1);
}

} // namespace
