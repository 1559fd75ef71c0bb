// Block-type (quantized) tensors in the core: sizes and strides, the CPU backend's mul_mat with a
// quantized a (forward, and the db direction mul_mat(transpose(a), dy) the autodiff builds) against
// mul_mat of the dequantized f32 matrix, dequantizing casts bit-exact against the GGUF reader, and
// the graph-validation errors for every use the core does not allow.
//
// Tolerance of the products: both sides compute the same f32 dot products over K terms from the same
// f32 operands (the quantized side dequantizes bit-exactly), in different blockings, so each element
// may differ by the rounding of two f32 sums: |out - ref| <= 2 * K * eps_f32 * sum_k |a_k b_k|.
#include "gguf.h"
#include "oomb.h"
#include "oomb-backend.h"
#include "test-common.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace oombtest;

namespace {

const oomb_type kTypes[] = {OOMB_TYPE_Q8_0, OOMB_TYPE_Q4_0, OOMB_TYPE_Q4_1, OOMB_TYPE_Q5_0, OOMB_TYPE_Q5_1,
                            OOMB_TYPE_Q2_K, OOMB_TYPE_Q3_K, OOMB_TYPE_Q4_K, OOMB_TYPE_Q5_K, OOMB_TYPE_Q6_K};

oomb_backend_t cpu() {
    static oomb_backend_t be = [] {
        setenv("OOMB_CPU_MIN_PARALLEL_WORK", "1", 1);  // the threaded paths run even on small sizes
        oomb_backend_t b = oomb_backend_cpu_init(3);
        unsetenv("OOMB_CPU_MIN_PARALLEL_WORK");
        return b;
    }();
    return be;
}

struct Ctx {
    oomb_context * ctx = oomb_init({0, false});
    std::mt19937 rng{4321};
    ~Ctx() { oomb_free(ctx); }
    oomb_tensor * quant(oomb_type t, int64_t K, int64_t M) {
        oomb_tensor * a = oomb_new_tensor_2d(ctx, t, K, M);
        oomb_set_name(a, "w");
        fill_random_blocks(a, rng);
        return a;
    }
    oomb_tensor * f32(int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
        oomb_tensor * t = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, ne0, ne1, ne2);
        fill_uniform(t, rng, -1.0f, 1.0f);
        return t;
    }
    void compute(oomb_tensor * t) {
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, t);
        oomb_backend_graph_compute(cpu(), g);
    }
};

// |out - ref| within 2 K eps sum|terms| per element; terms[i] = sum_k |a_k b_k| of element i.
void expect_close(const std::vector<double> & out, const std::vector<double> & ref, const std::vector<double> & terms, int64_t K) {
    ASSERT_EQ(out.size(), ref.size());
    const double eps = std::ldexp(1.0, -23);
    int64_t bad = 0;
    for (size_t i = 0; i < out.size(); i++) {
        const double tol = 2.0 * (double) K * eps * terms[i];
        if (!(std::fabs(out[i] - ref[i]) <= tol)) {
            if (bad++ < 5) ADD_FAILURE() << "element " << i << ": " << out[i] << " vs " << ref[i] << " (tolerance " << tol << ")";
        }
    }
    EXPECT_EQ(bad, 0);
}

int64_t k_of(oomb_type t, int i) {  // K = 256, 768 for the K-quants, 32*k for the others
    if (oomb_blck_size(t) == 256) return i == 0 ? 256 : 768;
    return i == 0 ? 32 * 3 : 32 * 25;
}

} // namespace

TEST(QuantTypes, SizesAndStrides) {
    EXPECT_EQ(oomb_blck_size(OOMB_TYPE_F32), 1);
    EXPECT_EQ(oomb_type_size(OOMB_TYPE_BF16), 2u);
    EXPECT_EQ(oomb_blck_size(OOMB_TYPE_Q8_0), 32);
    EXPECT_EQ(oomb_type_size(OOMB_TYPE_Q8_0), 34u);
    EXPECT_EQ(oomb_blck_size(OOMB_TYPE_Q4_K), 256);
    EXPECT_EQ(oomb_type_size(OOMB_TYPE_Q4_K), 144u);
    EXPECT_EQ(oomb_row_size(OOMB_TYPE_Q6_K, 768), 3u * 210u);
    EXPECT_EQ(oomb_row_size(OOMB_TYPE_F32, 5), 20u);
    EXPECT_TRUE(oomb_type_is_quantized(OOMB_TYPE_Q2_K));
    EXPECT_FALSE(oomb_type_is_quantized(OOMB_TYPE_BF16));
    EXPECT_STREQ(oomb_type_name(OOMB_TYPE_Q5_K), "q5_k");
    for (oomb_type t : kTypes) {
        // the core's sizes are the GGUF reader's (one table of block sizes: quants.h)
        EXPECT_EQ(oomb_blck_size(t), oomb::gguf_tensor_type_block_size(oomb_type_to_ggml(t))) << oomb_type_name(t);
        EXPECT_EQ(oomb_type_size(t), oomb::gguf_tensor_type_block_bytes(oomb_type_to_ggml(t))) << oomb_type_name(t);
        oomb_type back;
        ASSERT_TRUE(oomb_type_from_ggml(oomb_type_to_ggml(t), &back));
        EXPECT_EQ(back, t);
    }
    EXPECT_FALSE(oomb_type_from_ggml(16, nullptr));  // IQ2_XXS
    Ctx c;
    oomb_tensor * a = oomb_new_tensor_3d(c.ctx, OOMB_TYPE_Q4_K, 512, 3, 2);
    EXPECT_EQ(a->nb[0], 144u);
    EXPECT_EQ(a->nb[1], 288u);
    EXPECT_EQ(a->nb[2], 3u * 288u);
    EXPECT_EQ(oomb_nbytes(a), 6u * 288u);
    EXPECT_TRUE(oomb_is_contiguous(a));
    oomb_tensor * v = oomb_view_2d(c.ctx, a, 512, 2, a->nb[1], a->nb[1]);  // rows 1..2
    EXPECT_EQ(oomb_nbytes(v), 2u * 288u);
    oomb_tensor * r = oomb_reshape_2d(c.ctx, a, 512, 6);
    EXPECT_EQ(oomb_nbytes(r), 6u * 288u);
    oomb_tensor * w = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_Q8_0, 64, 5);
    oomb_tensor * wt = oomb_transpose(c.ctx, w);
    EXPECT_EQ(wt->ne[0], 5);
    EXPECT_EQ(wt->ne[1], 64);
    EXPECT_EQ(oomb_nbytes(wt), oomb_nbytes(w));
    EXPECT_FALSE(oomb_is_contiguous(wt));
}

TEST(QuantTypes, ShapeAndUseErrors) {
    Ctx c;
    EXPECT_OOMB_ERROR(oomb_new_tensor_2d(c.ctx, OOMB_TYPE_Q4_K, 100, 2), "not a multiple of its block size 256");
    EXPECT_OOMB_ERROR(oomb_row_size(OOMB_TYPE_Q8_0, 33), "not a whole number of blocks");
    oomb_tensor * a = c.quant(OOMB_TYPE_Q8_0, 64, 4);
    oomb_tensor * x = c.f32(64, 3);
    EXPECT_OOMB_ERROR(oomb_set_param(a), "cannot be trainable");
    EXPECT_OOMB_ERROR(oomb_view_2d(c.ctx, a, 32, 4, a->nb[1], 0), "must take whole rows");
    EXPECT_OOMB_ERROR(oomb_view_1d(c.ctx, a, 64, 34), "must take whole rows");
    EXPECT_OOMB_ERROR(oomb_permute(c.ctx, a, 1, 0, 2, 3), "cannot be permuted");
    EXPECT_OOMB_ERROR(oomb_transpose(c.ctx, oomb_transpose(c.ctx, a)), "cannot be transposed again");
    EXPECT_OOMB_ERROR(oomb_cont(c.ctx, a), "dequantize it with oomb_cast");
    EXPECT_OOMB_ERROR(oomb_cast(c.ctx, c.f32(64, 4), OOMB_TYPE_Q8_0), "block types can only be dequantized");
    EXPECT_OOMB_ERROR(oomb_cast(c.ctx, oomb_transpose(c.ctx, a), OOMB_TYPE_F32), "from row-major blocks");
    EXPECT_OOMB_ERROR(oomb_add(c.ctx, a, a), "add: a must be f32");
    EXPECT_OOMB_ERROR(oomb_get_rows(c.ctx, a, oomb_new_tensor_1d(c.ctx, OOMB_TYPE_I32, 2)), "get_rows: a must be f32, f16 or bf16, got");
    EXPECT_OOMB_ERROR(oomb_mul_mat(c.ctx, x, a), "mul_mat: b must be f32, f16 or bf16, got");
    EXPECT_OOMB_ERROR(oomb_mul_mat(c.ctx, oomb_reshape_3d(c.ctx, a, 64, 2, 2), c.f32(64, 3, 2)), "2-D matrix of row-major blocks");
    EXPECT_OOMB_ERROR(oomb_get_f32_1d(a, 0), "not addressable");
    // a graph that bypasses the constructors' checks: the backend's validation names the op and the type
    oomb_tensor * gr = oomb_get_rows(c.ctx, c.f32(64, 4), oomb_new_tensor_1d(c.ctx, OOMB_TYPE_I32, 2));
    gr->src[0] = a;
    EXPECT_OOMB_ERROR(c.compute(gr), "get_rows: src[0] 'w' [64, 4, 1, 1] q8_0 is of block type q8_0");
}

// cast to f32 / bf16 dequantizes bit-exactly as the GGUF reader (gguf_convert, checked against
// gguf-py in test-gguf-quants), through a whole-row view too.
TEST(QuantTypes, CastDequantizesAsTheReader) {
    for (oomb_type t : kTypes) {
        SCOPED_TRACE(oomb_type_name(t));
        Ctx c;
        const int64_t K = k_of(t, 1), M = 5;
        oomb_tensor * a = c.quant(t, K, M);
        oomb_tensor * f = oomb_cast(c.ctx, a, OOMB_TYPE_F32);
        oomb_tensor * h = oomb_cast(c.ctx, oomb_view_2d(c.ctx, a, K, 2, a->nb[1], 2 * a->nb[1]), OOMB_TYPE_BF16);
        oomb_cgraph * g = oomb_new_graph(c.ctx);
        oomb_build_forward_expand(g, f);
        oomb_build_forward_expand(g, h);
        oomb_backend_graph_compute(cpu(), g);
        std::vector<float> ref((size_t) (K * M));
        std::string err;
        ASSERT_EQ(oomb::gguf_convert(oomb_type_to_ggml(t), a->data, oomb::GGUF_TENSOR_F32, ref.data(), K * M, &err), oomb::GGUF_OK) << err;
        EXPECT_EQ(memcmp(ref.data(), f->data, ref.size() * 4), 0);
        const uint16_t * hb = (const uint16_t *) h->data;
        for (int64_t i = 0; i < 2 * K; i++) ASSERT_EQ(hb[i], oomb_fp32_to_bf16(ref[(size_t) (2 * K + i)])) << i;
        bool any_nonzero = false;
        for (float v : ref) { ASSERT_TRUE(std::isfinite(v)); any_nonzero |= v != 0.0f; }
        EXPECT_TRUE(any_nonzero);
    }
}

// Forward: mul_mat(a, x) with a quantized vs mul_mat(dequantized a, x); db: mul_mat(transpose(a), dy)
// vs the same with the dequantized a. Sizes that divide no tile: M = 37, 300; N = 1, 5, 129 (the CPU
// tiles hold 65536 / K rows: M = 300 takes 2 tiles at K = 256, 4 at K = 768 and 800, the last partial).
TEST(QuantMatMul, MatchesDequantizedF32) {
    for (oomb_type t : kTypes) {
        for (int ki = 0; ki < 2; ki++) {
            for (int64_t M : {37, 300}) {
                for (int64_t N : {1, 5, 129}) {
                    const int64_t K = k_of(t, ki);
                    SCOPED_TRACE(std::string(oomb_type_name(t)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) +
                                 " N=" + std::to_string(N));
                    Ctx c;
                    oomb_tensor * a = c.quant(t, K, M);
                    oomb_tensor * af = oomb_cast(c.ctx, a, OOMB_TYPE_F32);
                    oomb_tensor * x = c.f32(K, N);
                    oomb_tensor * dy = c.f32(M, N);
                    oomb_tensor * y = oomb_mul_mat(c.ctx, a, x);
                    oomb_tensor * yr = oomb_mul_mat(c.ctx, af, x);
                    oomb_tensor * db = oomb_mul_mat(c.ctx, oomb_transpose(c.ctx, a), dy);
                    oomb_tensor * dbr = oomb_mul_mat(c.ctx, oomb_transpose(c.ctx, af), dy);
                    oomb_cgraph * g = oomb_new_graph(c.ctx);
                    for (oomb_tensor * r : {y, yr, db, dbr}) oomb_build_forward_expand(g, r);
                    oomb_backend_graph_compute(cpu(), g);
                    const std::vector<double> A = to_vector(af), X = to_vector(x), DY = to_vector(dy);
                    std::vector<double> ty((size_t) (M * N)), tb((size_t) (K * N));
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t m = 0; m < M; m++)
                            for (int64_t k = 0; k < K; k++) {
                                ty[(size_t) (n * M + m)] += std::fabs(A[(size_t) (m * K + k)] * X[(size_t) (n * K + k)]);
                                tb[(size_t) (n * K + k)] += std::fabs(A[(size_t) (m * K + k)] * DY[(size_t) (n * M + m)]);
                            }
                    expect_close(to_vector(y), to_vector(yr), ty, K);
                    expect_close(to_vector(db), to_vector(dbr), tb, M);
                    double s = 0;
                    for (double v : to_vector(y)) s += std::fabs(v);
                    EXPECT_GT(s, 0.0);
                }
            }
        }
    }
}

// A bf16 b (oomb_mul_ext results feed products as bf16) and a b with batch dims.
TEST(QuantMatMul, Bf16AndBatchedB) {
    Ctx c;
    const int64_t K = 512, M = 37;
    oomb_tensor * a = c.quant(OOMB_TYPE_Q4_K, K, M);
    oomb_tensor * af = oomb_cast(c.ctx, a, OOMB_TYPE_F32);
    oomb_tensor * x = c.f32(K, 3, 2);
    oomb_tensor * xb = oomb_cast(c.ctx, x, OOMB_TYPE_BF16);
    oomb_tensor * y = oomb_mul_mat(c.ctx, a, xb);
    oomb_tensor * yr = oomb_mul_mat(c.ctx, af, xb);
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, y);
    oomb_build_forward_expand(g, yr);
    oomb_backend_graph_compute(cpu(), g);
    const std::vector<double> o = to_vector(y), r = to_vector(yr);
    ASSERT_EQ(o.size(), (size_t) (M * 6));
    double num = 0, den = 0;
    for (size_t i = 0; i < o.size(); i++) { num += (o[i] - r[i]) * (o[i] - r[i]); den += r[i] * r[i]; }
    EXPECT_LT(std::sqrt(num / den), 1e-6);
}
