// The instruction-set paths a run takes are the ones its environment asks for. CI (.ci/run) runs the
// CPU suite a second time with lower ones forced, as on a machine with AVX2 but no AVX-512; these
// tests make that run fail if the variables did not take effect (and say what ran, in the log):
//  - OOMB_PAGED_ISA (src/cpu/paged-attn.cpp: base | avx2 | avx512, read at every call; a variant the CPU
//    lacks falls back to the best one it has): the paged-attention forward of this run equals, bit for
//    bit, the variant the variable names, and the variants this CPU runs give different bits on the
//    test's data (so the equality tells which one ran). Without the variable: the best variant.
//  - OPENBLAS_CORETYPE: OpenBLAS's selected core (openblas_get_corename) is the one named.
#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-paged.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <strings.h>
#include <vector>

extern "C" char * openblas_get_corename(void);

namespace {

// The variant src/cpu/paged-attn.cpp runs for OOMB_PAGED_ISA = `asked` on this CPU.
std::string paged_variant_for(const std::string & asked) {
    if (asked == "base") return "base";
#if defined(__x86_64__)
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx512 && asked != "avx2") return "avx512";
    if (avx2) return "avx2";
#endif
    return "base";
}

// The paged-attention forward (out and the LSE) on fixed random data: head dim 40 (not a multiple of
// any vector width), GQA 2, a history of 37 positions over pages of 16, a chunk of 9.
std::vector<float> paged_forward() {
    const int64_t D = 40, H = 4, Hkv = 2, P = 16, hist = 37, T = 9;
    oomb_backend_t be = oomb_backend_cpu_init(2);
    oomb_kv_cache_params kp{};
    kp.n_layer = 1; kp.n_head_kv = (int) Hkv; kp.head_dim = (int) D; kp.page_size = (int) P;
    kp.max_tokens = hist + T; kp.type = OOMB_TYPE_F32; kp.with_grad = false;
    oomb_kv_cache_t kv = oomb_kv_cache_init(be, kp);
    EXPECT_NE(kv, nullptr);
    oomb_kv_cache_reserve(kv, hist + T);
    oomb_tensor * kpool = oomb_kv_cache_k(kv, 0), * vpool = oomb_kv_cache_v(kv, 0);
    std::mt19937 rng(77);
    std::uniform_real_distribution<float> U(-2.0f, 2.0f);
    for (oomb_tensor * pool : {kpool, vpool})
        for (int64_t i = 0; i < oomb_nelements(pool); i++) ((float *) pool->data)[i] = U(rng);
    oomb_context * ctx = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
    oomb_tensor * kc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * vc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
    oomb_tensor * pos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
    for (oomb_tensor * t : {q, kc, vc})
        for (int64_t i = 0; i < oomb_nelements(t); i++) ((float *) t->data)[i] = U(rng);
    for (int64_t t = 0; t < T; t++) ((int32_t *) pos->data)[t] = (int32_t) (hist + t);
    oomb_tensor * out = oomb_paged_attn(ctx, q, kc, vc, kpool, vpool, oomb_kv_cache_page_table(kv), pos, 0.3f, 0);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, out);
    oomb_backend_graph_compute(be, g);
    const oomb_tensor * packed = out->view_src;  // out [D, H, T], then the LSE per row
    std::vector<float> r((const float *) packed->data, (const float *) packed->data + oomb_nelements(packed));
    oomb_free(ctx);
    oomb_kv_cache_free(kv);
    oomb_backend_free(be);
    return r;
}

TEST(Isa, PagedAttnVariantFollowsEnvironment) {
    const char * e = getenv("OOMB_PAGED_ISA");
    const std::string asked = e ? e : "";
    const std::string expect = paged_variant_for(asked);
    const std::vector<float> this_run = paged_forward();  // the environment as given
    std::map<std::string, std::vector<float>> by_variant;
    for (const char * v : {"base", "avx2", "avx512"}) {
        const std::string ran = paged_variant_for(v);
        if (by_variant.count(ran)) continue;
        setenv("OOMB_PAGED_ISA", v, 1);
        by_variant[ran] = paged_forward();
    }
    if (e) setenv("OOMB_PAGED_ISA", e, 1);
    else unsetenv("OOMB_PAGED_ISA");
    for (auto & [a, ra] : by_variant)
        for (auto & [b, rb] : by_variant)
            if (a < b) EXPECT_NE(ra, rb) << "variants " << a << " and " << b << " agree bit for bit on this data: the test cannot tell them apart";
    EXPECT_EQ(this_run, by_variant[expect]) << "OOMB_PAGED_ISA=" << asked << ": expected the " << expect << " kernels";
    for (auto & [v, r] : by_variant)
        if (r == this_run) printf("paged attention: the %s kernels ran (OOMB_PAGED_ISA=%s)\n", v.c_str(), e ? e : "<unset>");
}

// An OOMB_PAGED_ISA value that names no variant is named on stderr (once) and runs the best variant.
TEST(Isa, UnknownPagedIsaIsNamed) {
    const char * e = getenv("OOMB_PAGED_ISA");
    const std::string saved = e ? e : "";
    unsetenv("OOMB_PAGED_ISA");
    const std::vector<float> best = paged_forward();
    setenv("OOMB_PAGED_ISA", "avx-512", 1);
    testing::internal::CaptureStderr();
    const std::vector<float> r = paged_forward();
    const std::vector<float> r2 = paged_forward();  // (the same value again: no second line)
    const std::string err = testing::internal::GetCapturedStderr();
    if (e) setenv("OOMB_PAGED_ISA", saved.c_str(), 1);
    else unsetenv("OOMB_PAGED_ISA");
    EXPECT_NE(err.find("OOMB_PAGED_ISA='avx-512' is not base, avx2 or avx512"), std::string::npos) << err;
    EXPECT_EQ(err.find("OOMB_PAGED_ISA", err.find("OOMB_PAGED_ISA") + 1), std::string::npos) << "named once: " << err;
    EXPECT_EQ(r, best);
    EXPECT_EQ(r2, best);
}

TEST(Isa, OpenBlasCoreFollowsEnvironment) {
    const char * core = openblas_get_corename();
    ASSERT_NE(core, nullptr);
    printf("OpenBLAS core: %s\n", core);
    const char * e = getenv("OPENBLAS_CORETYPE");
    if (!e || !*e) GTEST_SKIP() << "OPENBLAS_CORETYPE not set: OpenBLAS chose " << core;
    EXPECT_EQ(strcasecmp(core, e), 0) << "OPENBLAS_CORETYPE=" << e << " but OpenBLAS runs " << core;
}

} // namespace
