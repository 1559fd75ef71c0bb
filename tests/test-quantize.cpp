// The f32 -> Q5_0 / Q4_K / Q5_K / Q6_K quantizers through gguf_convert (src/formats/quantize.h):
// bad input is a clear error (a count that is not whole blocks, NaN / inf named with its index, a
// scale that overflows f16, a type without a quantizer), and on random data of N(0,1) the blocks
// decode (with the reader's bit-exact dequantizers) to values within each type's error bound,
// also when their own dequantization is quantized once more. The bit-exact check against gguf-py's
// dequantization is tests/py/test_quantize_gguf_py.py.
#include "gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace oomb;

namespace {

struct QCase {
    uint32_t type;
    double max_rel_rms; // bound on rms(dequant - x) / rms(x) on N(0,1) rows: measured 0.072, 0.036, 0.018, 0.042, + ~20 %
};
const QCase kTypes[] = {
    {GGUF_TENSOR_Q4_K, 0.085}, {GGUF_TENSOR_Q5_K, 0.043}, {GGUF_TENSOR_Q6_K, 0.021}, {GGUF_TENSOR_Q5_0, 0.050},
};

std::vector<float> normal(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    return x;
}

size_t bytes_for(uint32_t type, int64_t n) {
    return (size_t)(n / gguf_tensor_type_block_size(type)) * gguf_tensor_type_block_bytes(type);
}

double rel_rms(const std::vector<float>& x, const std::vector<float>& y) {
    double e = 0, s = 0;
    for (size_t i = 0; i < x.size(); i++) { e += (x[i] - y[i]) * (double)(x[i] - y[i]); s += (double)x[i] * x[i]; }
    return std::sqrt(e / s);
}

// x quantized to `type` and dequantized back (gtest failure + empty result on an error).
std::vector<float> round_trip(uint32_t type, const std::vector<float>& x) {
    const int64_t n = (int64_t)x.size();
    std::vector<uint8_t> q(bytes_for(type, n));
    std::vector<float> y((size_t)n);
    std::string err;
    EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), type, q.data(), n, &err), GGUF_OK) << err;
    if (!err.empty()) return {};
    EXPECT_EQ(gguf_convert(type, q.data(), GGUF_TENSOR_F32, y.data(), n, &err), GGUF_OK) << err;
    return err.empty() ? y : std::vector<float>{};
}

} // namespace

TEST(Quantize, ErrorWithinBoundOnRandomRows) {
    const int64_t n = 4864 * 3;
    const std::vector<float> x = normal((size_t)n, 11);
    for (const QCase& c : kTypes) {
        const std::vector<float> y = round_trip(c.type, x);
        ASSERT_EQ(y.size(), x.size());
        const double r = rel_rms(x, y);
        printf("  %s: rms error / rms = %.4f (bound %.3f)\n", gguf_tensor_type_name(c.type), r, c.max_rel_rms);
        EXPECT_LT(r, c.max_rel_rms) << gguf_tensor_type_name(c.type);
        EXPECT_GT(r, 0.0) << "a lossy type cannot reproduce random data exactly";
        // quantizing the dequantized values once more stays within the bound
        const std::vector<float> y2 = round_trip(c.type, y);
        ASSERT_EQ(y2.size(), x.size());
        EXPECT_LT(rel_rms(x, y2), c.max_rel_rms) << gguf_tensor_type_name(c.type);
    }
}

TEST(Quantize, SpecialBlocks) {
    // an all-zero block, a constant negative block, a constant positive block, a block with one
    // large outlier: every one decodes finitely and close to the input.
    const int64_t n = 256 * 4;
    std::vector<float> x((size_t)n, 0.0f);
    for (int i = 256; i < 512; i++) x[(size_t)i] = -0.75f;
    for (int i = 512; i < 768; i++) x[(size_t)i] = 0.5f;
    const std::vector<float> r = normal(256, 3);
    for (int i = 0; i < 256; i++) x[(size_t)(768 + i)] = r[(size_t)i] * 0.01f;
    x[800] = 40.0f;
    for (const QCase& c : kTypes) {
        const std::vector<float> y = round_trip(c.type, x);
        ASSERT_EQ(y.size(), x.size());
        const char* name = gguf_tensor_type_name(c.type);
        for (int i = 0; i < 256; i++) ASSERT_EQ(y[(size_t)i], 0.0f) << name << " zero block, element " << i;
        for (int i = 256; i < 768; i++) ASSERT_NEAR(y[(size_t)i], x[(size_t)i], 0.02) << name << " constant block, element " << i;
        EXPECT_NEAR(y[800], 40.0f, 0.6f) << name << " outlier";
        for (float v : y) ASSERT_TRUE(std::isfinite(v)) << name;
    }
}

TEST(Quantize, CountNotWholeBlocksIsAnError) {
    const std::vector<float> x = normal(512, 1);
    std::vector<uint8_t> q(4096);
    for (uint32_t t : {GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q5_K, GGUF_TENSOR_Q6_K}) {
        std::string err;
        EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), t, q.data(), 384, &err), GGUF_ERR_ARG);
        EXPECT_NE(err.find("not a multiple of its block size 256"), std::string::npos) << err;
        EXPECT_NE(err.find(gguf_tensor_type_name(t)), std::string::npos) << err;
    }
    std::string err;
    EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), GGUF_TENSOR_Q5_0, q.data(), 48, &err), GGUF_ERR_ARG);
    EXPECT_NE(err.find("not a multiple of its block size 32"), std::string::npos) << err;
}

TEST(Quantize, NonFiniteValueIsNamed) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (uint32_t t : {GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q5_K, GGUF_TENSOR_Q6_K, GGUF_TENSOR_Q5_0, GGUF_TENSOR_Q8_0}) {
        const char* name = gguf_tensor_type_name(t);
        // beyond the first conversion chunk (4096 elements), so that the index is the global one
        std::vector<float> x = normal(8192, 2);
        std::vector<uint8_t> q(bytes_for(t, 8192));
        x[5000] = nan;
        std::string err;
        EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), t, q.data(), 8192, &err), GGUF_ERR_ARG) << name;
        EXPECT_NE(err.find("element 5000 is NaN"), std::string::npos) << err;
        EXPECT_NE(err.find(name), std::string::npos) << err;
        x[5000] = 0.0f;
        x[17] = -inf;
        err.clear();
        EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), t, q.data(), 8192, &err), GGUF_ERR_ARG) << name;
        EXPECT_NE(err.find("element 17 is -inf"), std::string::npos) << err;
    }
}

TEST(Quantize, ScaleOverflowIsAnError) {
    std::vector<float> x = normal(256, 4);
    x[3] = 1.0e9f; // every type's block scale d is beyond f16's 65504
    std::vector<uint8_t> q(512);
    for (uint32_t t : {GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q5_K, GGUF_TENSOR_Q6_K}) {
        std::string err;
        EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), t, q.data(), 256, &err), GGUF_ERR_ARG);
        EXPECT_NE(err.find("overflows f16"), std::string::npos) << err;
        EXPECT_NE(err.find("elements 0..255"), std::string::npos) << err;
    }
    for (uint32_t t : {GGUF_TENSOR_Q5_0, GGUF_TENSOR_Q8_0}) {
        std::string err;
        EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), t, q.data(), 256, &err), GGUF_ERR_ARG);
        EXPECT_NE(err.find("overflows f16"), std::string::npos) << err;
        EXPECT_NE(err.find("elements 0..31"), std::string::npos) << err;
    }
    // just below the limit is fine: 6e6 for Q8_0 (d = 6e6 / 127 < 65504)
    x[3] = 6.0e6f;
    std::string err;
    EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), GGUF_TENSOR_Q8_0, q.data(), 256, &err), GGUF_OK) << err;
}

TEST(Quantize, FromOtherTypes) {
    // bf16 and Q8_0 sources are dequantized first: the result equals quantizing their f32 values
    const int64_t n = 768;
    const std::vector<float> x = normal((size_t)n, 9);
    std::vector<uint8_t> q8(bytes_for(GGUF_TENSOR_Q8_0, n));
    std::vector<float> x8((size_t)n);
    std::string err;
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), GGUF_TENSOR_Q8_0, q8.data(), n, &err), GGUF_OK) << err;
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_Q8_0, q8.data(), GGUF_TENSOR_F32, x8.data(), n, &err), GGUF_OK) << err;
    for (uint32_t t : {GGUF_TENSOR_Q4_K, GGUF_TENSOR_Q6_K}) {
        std::vector<uint8_t> a(bytes_for(t, n)), b(bytes_for(t, n));
        ASSERT_EQ(gguf_convert(GGUF_TENSOR_Q8_0, q8.data(), t, a.data(), n, &err), GGUF_OK) << err;
        ASSERT_EQ(gguf_convert(GGUF_TENSOR_F32, x8.data(), t, b.data(), n, &err), GGUF_OK) << err;
        EXPECT_EQ(a, b) << gguf_tensor_type_name(t);
    }
}
