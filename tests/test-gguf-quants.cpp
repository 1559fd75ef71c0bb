// GGUF block types against gguf-py: every quantized type ggml-oomb reads is dequantized bit for
// bit as gguf.quants.dequantize does, on random blocks (tests/fixtures/quants, written by
// make-quant-fixtures.py with gguf-py), for row lengths 768 and 1280 (multiples of 256 but of no
// larger power of two); unsupported types and truncated blocks are clear errors.
#include "gguf.h"
#include "safetensors.h"
#include "test-common.h"

#include "../src/fp16.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

using namespace oomb;

namespace {

std::string quants_dir() { return oombtest::source_dir() + "/tests/fixtures/quants/"; }

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct QuantCase {
    const char* name;
    uint32_t type;
};
const QuantCase kCases[] = {
    {"q4_0", GGUF_TENSOR_Q4_0}, {"q4_1", GGUF_TENSOR_Q4_1}, {"q5_0", GGUF_TENSOR_Q5_0},
    {"q5_1", GGUF_TENSOR_Q5_1}, {"q8_0", GGUF_TENSOR_Q8_0}, {"q2_k", GGUF_TENSOR_Q2_K},
    {"q3_k", GGUF_TENSOR_Q3_K}, {"q4_k", GGUF_TENSOR_Q4_K}, {"q5_k", GGUF_TENSOR_Q5_K},
    {"q6_k", GGUF_TENSOR_Q6_K},
};

uint16_t bf16_of(float x) { return fp32_to_bf16(x); }

} // namespace

class GGUFQuants : public ::testing::TestWithParam<QuantCase> {};

TEST_P(GGUFQuants, DequantizesBitExactlyAsGgufPy) {
    const QuantCase qc = GetParam();
    std::string err;
    SafetensorsFile ref;
    ASSERT_EQ(ref.open(quants_dir() + "reference.safetensors", &err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(quants_dir() + qc.name + ".gguf", &err), GGUF_OK) << err;
    ASSERT_EQ(r.tensors().size(), 2u);
    for (const char* tn : {"w768", "w1280"}) {
        SCOPED_TRACE(std::string(qc.name) + "." + tn);
        const GGUFTensorInfo* t = r.find_tensor(tn);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->type, qc.type);
        std::string upper = qc.name;
        for (char& c : upper) c = (char)toupper((unsigned char)c);
        EXPECT_EQ(std::string(gguf_tensor_type_name(t->type)), upper);
        EXPECT_EQ(t->ne[0] % 256, 0);
        EXPECT_NE(t->ne[0] % 512, 0);
        const SafetensorsTensor* rt = ref.find(std::string(qc.name) + "." + tn);
        ASSERT_NE(rt, nullptr);
        ASSERT_EQ(rt->dtype, SafetensorsDtype::F32);
        ASSERT_EQ(rt->shape, t->shape());
        std::vector<float> want((size_t)rt->numel());
        memcpy(want.data(), rt->data, rt->nbytes);

        std::vector<float> got;
        ASSERT_EQ(r.read_tensor_f32(tn, &got, &err), GGUF_OK) << err;
        ASSERT_EQ(got.size(), want.size());
        size_t n_diff = 0, first = 0;
        for (size_t i = 0; i < got.size(); i++)
            if (memcmp(&got[i], &want[i], 4) != 0 && n_diff++ == 0) first = i;
        EXPECT_EQ(n_diff, 0u) << "first at element " << first << ": " << got[first] << " vs gguf-py " << want[first];
        // not a degenerate fixture: random blocks give many distinct values of both signs
        size_t n_neg = 0, n_pos = 0;
        for (float v : want) { n_neg += v < 0; n_pos += v > 0; }
        EXPECT_GT(n_neg, want.size() / 8);
        EXPECT_GT(n_pos, want.size() / 8);

        // the 16-bit output goes through f32 in chunks: each value is the rounded reference
        std::vector<uint16_t> b16(want.size());
        ASSERT_EQ(r.read_tensor(*t, GGUF_TENSOR_BF16, b16.data(), b16.size() * 2, &err), GGUF_OK) << err;
        for (size_t i = 0; i < want.size(); i++) ASSERT_EQ(b16[i], bf16_of(want[i])) << "element " << i;
    }
}

// gguf_convert over more than one 4096-element chunk (the 16-bit path) and from a block offset.
TEST_P(GGUFQuants, ConvertsAcrossChunks) {
    const QuantCase qc = GetParam();
    std::string err;
    GGUFReader r;
    ASSERT_EQ(r.open(quants_dir() + qc.name + ".gguf", &err), GGUF_OK) << err;
    const GGUFTensorInfo* a = r.find_tensor("w768");
    const GGUFTensorInfo* b = r.find_tensor("w1280");
    ASSERT_TRUE(a && b);
    std::string bytes((const char*)r.tensor_data(*a), a->nbytes);
    bytes.append((const char*)r.tensor_data(*b), b->nbytes);
    const int64_t n = a->nelements() + b->nelements(); // 4864 > 4096
    std::vector<float> fa, fb;
    ASSERT_EQ(r.read_tensor_f32("w768", &fa, &err), GGUF_OK) << err;
    ASSERT_EQ(r.read_tensor_f32("w1280", &fb, &err), GGUF_OK) << err;
    fa.insert(fa.end(), fb.begin(), fb.end());
    std::vector<uint16_t> out((size_t)n);
    ASSERT_EQ(gguf_convert(qc.type, bytes.data(), GGUF_TENSOR_BF16, out.data(), n, &err), GGUF_OK) << err;
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(out[(size_t)i], bf16_of(fa[(size_t)i])) << "element " << i;
    std::vector<float> f32((size_t)n);
    ASSERT_EQ(gguf_convert(qc.type, bytes.data(), GGUF_TENSOR_F32, f32.data(), n, &err), GGUF_OK) << err;
    EXPECT_EQ(memcmp(f32.data(), fa.data(), (size_t)n * 4), 0);
}

// A file cut inside the last block of its last tensor is refused at open, naming the tensor.
TEST_P(GGUFQuants, TruncatedBlockIsAnError) {
    const QuantCase qc = GetParam();
    const std::string full = read_all(quants_dir() + qc.name + ".gguf");
    ASSERT_FALSE(full.empty());
    std::string err;
    GGUFReader r;
    ASSERT_EQ(r.open_memory(full.data(), full.size(), &err), GGUF_OK) << err;
    const GGUFTensorInfo* last = &r.tensors()[0];
    for (const auto& t : r.tensors()) if (t.offset > last->offset) last = &t;
    const size_t end = (size_t)(r.data_offset() + last->offset + last->nbytes);
    ASSERT_LE(end, full.size());
    const std::string cut = full.substr(0, end - gguf_tensor_type_block_bytes(qc.type) / 2);
    GGUFReader r2;
    EXPECT_EQ(r2.open_memory(cut.data(), cut.size(), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("'" + last->name + "'"), std::string::npos) << err;
    EXPECT_NE(err.find("runs past the end"), std::string::npos) << err;
    // a row length that is not a whole number of blocks is also refused by gguf_convert
    std::vector<float> out(512);
    const int64_t blk = gguf_tensor_type_block_size(qc.type);
    EXPECT_EQ(gguf_convert(qc.type, full.data(), GGUF_TENSOR_F32, out.data(), blk + blk / 2, &err), GGUF_ERR_ARG);
    EXPECT_NE(err.find("not a multiple of its block size"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(Types, GGUFQuants, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<QuantCase>& i) { return std::string(i.param.name); });

// Types ggml-oomb does not read (an IQ and a TQ type) are named in the error, at open and at read.
TEST(GGUFQuantsUnsupported, IqAndTqTypesAreNamed) {
    for (auto [file, type_name] : {std::pair<const char*, const char*>{"iq2_xxs", "IQ2_XXS"}, {"tq1_0", "TQ1_0"}}) {
        SCOPED_TRACE(file);
        std::string err;
        GGUFReader r;
        EXPECT_EQ(r.open(quants_dir() + file + ".gguf", &err), GGUF_ERR_UNSUPPORTED);
        EXPECT_NE(err.find(type_name), std::string::npos) << err;
        EXPECT_NE(err.find("tensor 'w'"), std::string::npos) << err;
        EXPECT_NE(err.find("Q4_K"), std::string::npos) << "the message lists what is supported: " << err;
        GGUFReader r2;
        ASSERT_EQ(r2.open(quants_dir() + file + ".gguf", &err, GGUFReadOptions{true}), GGUF_OK) << err;
        std::vector<float> v;
        EXPECT_EQ(r2.read_tensor_f32("w", &v, &err), GGUF_ERR_UNSUPPORTED);
        EXPECT_NE(err.find(type_name), std::string::npos) << err;
    }
}
