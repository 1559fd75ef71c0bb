// GGUF reader/writer: round trips of every value and tensor type, every malformed-file error, and
// a seeded mutation fuzz loop over a valid file.
#include "gguf.h"
#include "safetensors.h"

#include "../src/fp16.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <csignal>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace oomb;

namespace {

std::string tmp_path(const std::string& name) {
    const char* d = getenv("TMPDIR");
    return std::string(d && *d ? d : "/tmp") + "/oomb-test-gguf-" + std::to_string(getpid()) + "-" + name;
}

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_all(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), (std::streamsize)bytes.size());
}

// Little-endian byte builder for hand-made files.
struct Bytes {
    std::string b;
    Bytes& raw(const void* p, size_t n) { b.append((const char*)p, n); return *this; }
    Bytes& u32(uint32_t v) { return raw(&v, 4); }
    Bytes& u64(uint64_t v) { return raw(&v, 8); }
    Bytes& str(const std::string& s) { u64(s.size()); b += s; return *this; }
    Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        b += "GGUF";
        u32(version);
        u64(n_tensors);
        return u64(n_kv);
    }
    Bytes& kv_u32(const std::string& k, uint32_t v) { str(k); u32(GGUF_TYPE_UINT32); return u32(v); }
    Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name);
        u32((uint32_t)ne.size());
        for (uint64_t v : ne) u64(v);
        u32(type);
        return u64(offset);
    }
    Bytes& pad(size_t align = 32) { while (b.size() % align) b += '\0'; return *this; }
    Bytes& zeros(size_t n) { b.append(n, '\0'); return *this; }
};

gguf_status parse(const std::string& bytes, std::string* err, bool allow_unsupported = false) {
    GGUFReader r;
    GGUFReadOptions opt;
    opt.allow_unsupported_types = allow_unsupported;
    return r.open_memory(bytes.data(), bytes.size(), err, opt);
}

#define EXPECT_GGUF_ERROR(bytes, status, substr)                                            \
    do {                                                                                    \
        std::string _e;                                                                     \
        EXPECT_EQ(parse(bytes, &_e), status) << _e;                                         \
        EXPECT_NE(_e.find(substr), std::string::npos) << "message was: " << _e;             \
    } while (0)

// Q8_0 / Q4_0 / Q4_1 blocks by the reference formulas (ggml-quants.c), for 32 values.
void quantize_q8_0(const float* x, uint8_t* blk) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127, id = d ? 1 / d : 0;
    const uint16_t dh = fp32_to_fp16(d);
    memcpy(blk, &dh, 2);
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)std::lround(x[j] * id);
}

struct Sample {
    std::vector<std::pair<std::string, GGUFValue>> kv;
    struct T { std::string name; uint32_t type; std::vector<int64_t> ne; std::string data; };
    std::vector<T> tensors;
};

// Every metadata value type (scalars, strings, arrays of each, nested arrays, empty ones) and a
// tensor of each supported type with deterministic data.
Sample make_sample() {
    Sample s;
    auto add = [&](const std::string& k, GGUFValue v) { s.kv.emplace_back(k, std::move(v)); };
    add("general.architecture", GGUFValue::string("qwen2"));
    add("test.u8", GGUFValue::u8(250));
    add("test.i8", GGUFValue::i8(-100));
    add("test.u16", GGUFValue::u16(65000));
    add("test.i16", GGUFValue::i16(-32000));
    add("test.u32", GGUFValue::u32(4000000000u));
    add("test.i32", GGUFValue::i32(-2000000000));
    add("test.f32", GGUFValue::f32(3.25f));
    add("test.bool_true", GGUFValue::boolean(true));
    add("test.bool_false", GGUFValue::boolean(false));
    add("test.string", GGUFValue::string("héllo, wörld \xF0\x9F\x99\x82"));
    add("test.string_nul", GGUFValue::string(std::string("a\0b", 3)));
    add("test.string_empty", GGUFValue::string(""));
    add("test.u64", GGUFValue::u64(18000000000000000000ull));
    add("test.i64", GGUFValue::i64(-9000000000000000000ll));
    add("test.f64", GGUFValue::f64(-1.0 / 3.0));
    add("test.arr_u8", GGUFValue::array(std::vector<uint8_t>{0, 1, 255}));
    add("test.arr_i8", GGUFValue::array(std::vector<int8_t>{-128, 0, 127}));
    add("test.arr_u16", GGUFValue::array(std::vector<uint16_t>{0, 65535}));
    add("test.arr_i16", GGUFValue::array(std::vector<int16_t>{-32768, 32767}));
    add("test.arr_u32", GGUFValue::array(std::vector<uint32_t>{1, 2, 4000000000u}));
    add("test.arr_i32", GGUFValue::array(std::vector<int32_t>{-1, 0, 1}));
    add("test.arr_f32", GGUFValue::array(std::vector<float>{0.5f, -2.0f, 1e30f}));
    add("test.arr_bool", GGUFValue::array(std::vector<bool>{true, false, true}));
    add("test.arr_u64", GGUFValue::array(std::vector<uint64_t>{0, 18446744073709551615ull}));
    add("test.arr_i64", GGUFValue::array(std::vector<int64_t>{-5, 5}));
    add("test.arr_f64", GGUFValue::array(std::vector<double>{1e-300, 2.5}));
    add("test.arr_str", GGUFValue::string_array({"a", "", "ĠĠ", "<|im_start|>"}));
    add("test.arr_empty", GGUFValue::array(std::vector<int32_t>{}));
    add("test.arr_nested", GGUFValue::array_of_arrays({GGUFValue::array(std::vector<int32_t>{1, 2}),
                                                        GGUFValue::string_array({"x", "yz"}),
                                                        GGUFValue::array_of_arrays({GGUFValue::array(std::vector<float>{7.0f})})}));

    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto floats = [&](size_t n) { std::vector<float> v(n); for (auto& x : v) x = nd(rng); return v; };
    {
        auto v = floats(6 * 5);
        s.tensors.push_back({"t.f32", GGUF_TENSOR_F32, {6, 5}, std::string((const char*)v.data(), v.size() * 4)});
    }
    {
        auto v = floats(7 * 3 * 2);
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); i++) h[i] = fp32_to_fp16(v[i]);
        s.tensors.push_back({"t.f16", GGUF_TENSOR_F16, {7, 3, 2}, std::string((const char*)h.data(), h.size() * 2)});
    }
    {
        auto v = floats(3 * 2 * 2 * 2);
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); i++) h[i] = fp32_to_bf16(v[i]);
        s.tensors.push_back({"t.bf16", GGUF_TENSOR_BF16, {3, 2, 2, 2}, std::string((const char*)h.data(), h.size() * 2)});
    }
    {
        auto v = floats(64 * 2);
        std::string q(4 * 34, '\0');
        for (int b = 0; b < 4; b++) quantize_q8_0(v.data() + 32 * b, (uint8_t*)&q[34 * b]);
        s.tensors.push_back({"t.q8_0", GGUF_TENSOR_Q8_0, {64, 2}, q});
    }
    {
        std::string q(2 * 18, '\0');
        for (auto& c : q) c = (char)(rng() & 0xff);
        for (int b = 0; b < 2; b++) { uint16_t d = fp32_to_fp16(0.125f * (b + 1)); memcpy(&q[18 * b], &d, 2); }
        s.tensors.push_back({"t.q4_0", GGUF_TENSOR_Q4_0, {64}, q});
    }
    {
        std::string q(2 * 20, '\0');
        for (auto& c : q) c = (char)(rng() & 0xff);
        for (int b = 0; b < 2; b++) {
            uint16_t d = fp32_to_fp16(0.25f), m = fp32_to_fp16(-1.5f + b);
            memcpy(&q[20 * b], &d, 2);
            memcpy(&q[20 * b + 2], &m, 2);
        }
        s.tensors.push_back({"t.q4_1", GGUF_TENSOR_Q4_1, {32, 2}, q});
    }
    s.tensors.push_back({"t.empty", GGUF_TENSOR_F32, {0, 4}, ""});
    return s;
}

gguf_status write_sample(const Sample& s, const std::string& path, std::string* err, uint32_t alignment = 0) {
    GGUFWriter w;
    if (alignment) EXPECT_EQ(w.set_alignment(alignment, err), GGUF_OK);
    for (auto& kv : s.kv) EXPECT_EQ(w.set(kv.first, kv.second, err), GGUF_OK) << *err;
    for (auto& t : s.tensors) EXPECT_EQ(w.add_tensor(t.name, t.type, t.ne, err), GGUF_OK) << *err;
    if (gguf_status st = w.open(path, err)) return st;
    for (auto& t : s.tensors)
        if (gguf_status st = w.write_tensor(t.name, t.data.data(), t.data.size(), err)) return st;
    return w.finish(err);
}

void check_sample(const GGUFReader& r, const Sample& s) {
    size_t k = 0;
    for (auto& kv : r.metadata()) {
        if (kv.first == GGUF_KEY_ALIGNMENT) continue;
        ASSERT_LT(k, s.kv.size());
        EXPECT_EQ(kv.first, s.kv[k].first);
        EXPECT_TRUE(kv.second == s.kv[k].second) << kv.first << ": " << kv.second.to_string() << " vs "
                                                 << s.kv[k].second.to_string();
        k++;
    }
    EXPECT_EQ(k, s.kv.size());
    ASSERT_EQ(r.tensors().size(), s.tensors.size());
    for (size_t i = 0; i < s.tensors.size(); i++) {
        const GGUFTensorInfo& t = r.tensors()[i];
        EXPECT_EQ(t.name, s.tensors[i].name);
        EXPECT_EQ(t.type, s.tensors[i].type);
        EXPECT_EQ(t.n_dims, s.tensors[i].ne.size());
        for (size_t d = 0; d < s.tensors[i].ne.size(); d++) EXPECT_EQ(t.ne[d], s.tensors[i].ne[d]);
        EXPECT_EQ(t.offset % r.alignment(), 0u);
        ASSERT_EQ(t.nbytes, s.tensors[i].data.size()) << t.name;
        EXPECT_EQ(memcmp(r.tensor_data(t), s.tensors[i].data.data(), t.nbytes), 0) << t.name;
    }
}

} // namespace

TEST(GGUF, RoundTripEveryValueAndTensorType) {
    const Sample s = make_sample();
    const std::string path = tmp_path("roundtrip.gguf");
    std::string err;
    ASSERT_EQ(write_sample(s, path, &err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(path, &err), GGUF_OK) << err;
    EXPECT_EQ(r.version(), 3u);
    EXPECT_EQ(r.alignment(), 32u);
    EXPECT_EQ(r.data_offset() % 32, 0u);
    check_sample(r, s);
    // Re-writing what we read gives the same bytes.
    Sample s2;
    for (auto& kv : r.metadata()) s2.kv.push_back(kv);
    for (auto& t : r.tensors())
        s2.tensors.push_back({t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                              std::string((const char*)r.tensor_data(t), t.nbytes)});
    const std::string path2 = tmp_path("roundtrip2.gguf");
    ASSERT_EQ(write_sample(s2, path2, &err), GGUF_OK) << err;
    EXPECT_EQ(read_all(path), read_all(path2));
    unlink(path.c_str());
    unlink(path2.c_str());
}

TEST(GGUF, CustomAlignment) {
    const Sample s = make_sample();
    for (uint32_t a : {1u, 8u, 64u, 4096u}) {
        const std::string path = tmp_path("align.gguf");
        std::string err;
        ASSERT_EQ(write_sample(s, path, &err, a), GGUF_OK) << err;
        GGUFReader r;
        ASSERT_EQ(r.open(path, &err), GGUF_OK) << err;
        EXPECT_EQ(r.alignment(), a);
        EXPECT_EQ(r.data_offset() % a, 0u);
        uint32_t v = 0;
        EXPECT_EQ(r.get_u32(GGUF_KEY_ALIGNMENT, &v, &err), GGUF_OK);
        EXPECT_EQ(v, a);
        check_sample(r, s);
        unlink(path.c_str());
    }
}

TEST(GGUF, ValueAccessorsAndTypedGetters) {
    const Sample s = make_sample();
    const std::string path = tmp_path("getters.gguf");
    std::string err;
    ASSERT_EQ(write_sample(s, path, &err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(path, &err), GGUF_OK) << err;
    uint32_t u = 0;
    int64_t i = 0;
    float f = 0;
    bool b = false;
    std::string str;
    EXPECT_EQ(r.get_u32("test.u32", &u, &err), GGUF_OK);
    EXPECT_EQ(u, 4000000000u);
    EXPECT_EQ(r.get_u32("test.u8", &u, &err), GGUF_OK);
    EXPECT_EQ(u, 250u);
    EXPECT_EQ(r.get_u32("test.i8", &u, &err), GGUF_ERR_TYPE); // negative
    EXPECT_NE(err.find("test.i8"), std::string::npos);
    EXPECT_EQ(r.get_u32("test.u64", &u, &err), GGUF_ERR_TYPE); // does not fit
    EXPECT_EQ(r.get_i64("test.i64", &i, &err), GGUF_OK);
    EXPECT_EQ(i, -9000000000000000000ll);
    EXPECT_EQ(r.get_i64("test.u64", &i, &err), GGUF_ERR_TYPE);
    EXPECT_EQ(r.get_f32("test.f32", &f, &err), GGUF_OK);
    EXPECT_EQ(f, 3.25f);
    EXPECT_EQ(r.get_f32("test.string", &f, &err), GGUF_ERR_TYPE);
    EXPECT_EQ(r.get_bool("test.bool_true", &b, &err), GGUF_OK);
    EXPECT_TRUE(b);
    EXPECT_EQ(r.get_string("test.string", &str, &err), GGUF_OK);
    EXPECT_EQ(str, "héllo, wörld \xF0\x9F\x99\x82");
    EXPECT_EQ(r.get_string("no.such.key", &str, &err), GGUF_ERR_NOT_FOUND);
    EXPECT_NE(err.find("no.such.key"), std::string::npos);
    std::vector<std::string> sa;
    EXPECT_EQ(r.get_string_array("test.arr_str", &sa, &err), GGUF_OK);
    EXPECT_EQ(sa, (std::vector<std::string>{"a", "", "ĠĠ", "<|im_start|>"}));
    std::vector<int32_t> ia;
    EXPECT_EQ(r.get_i32_array("test.arr_i16", &ia, &err), GGUF_OK);
    EXPECT_EQ(ia, (std::vector<int32_t>{-32768, 32767}));
    EXPECT_EQ(r.get_i32_array("test.arr_u64", &ia, &err), GGUF_ERR_TYPE); // element too large
    EXPECT_EQ(r.get_i32_array("test.arr_f32", &ia, &err), GGUF_ERR_TYPE);
    const GGUFValue* nested = r.find("test.arr_nested");
    ASSERT_TRUE(nested);
    ASSERT_EQ(nested->array_type(), GGUF_TYPE_ARRAY);
    ASSERT_EQ(nested->arrays().size(), 3u);
    EXPECT_EQ(nested->arrays()[1].strings()[1], "yz");
    EXPECT_EQ(nested->to_string(), "[[1, 2], [\"x\", \"yz\"], [[7]]]");
    unlink(path.c_str());
}

TEST(GGUF, ReadTensorConvertsAndDequantizes) {
    const Sample s = make_sample();
    const std::string path = tmp_path("convert.gguf");
    std::string err;
    ASSERT_EQ(write_sample(s, path, &err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(path, &err), GGUF_OK) << err;
    for (auto& t : r.tensors()) {
        const size_t n = (size_t)t.nelements();
        std::vector<float> f(n);
        ASSERT_EQ(r.read_tensor(t, GGUF_TENSOR_F32, f.data(), n * 4, &err), GGUF_OK) << err;
        const uint8_t* raw = r.tensor_data(t);
        // Reference dequantization.
        std::vector<float> ref(n);
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            switch (t.type) {
            case GGUF_TENSOR_F32: memcpy(&ref[i], raw + 4 * i, 4); break;
            case GGUF_TENSOR_F16: memcpy(&h, raw + 2 * i, 2); ref[i] = fp16_to_fp32(h); break;
            case GGUF_TENSOR_BF16: memcpy(&h, raw + 2 * i, 2); ref[i] = bf16_to_fp32(h); break;
            case GGUF_TENSOR_Q8_0: {
                const uint8_t* b = raw + 34 * (i / 32);
                memcpy(&h, b, 2);
                ref[i] = fp16_to_fp32(h) * (float)(int8_t)b[2 + i % 32];
                break;
            }
            case GGUF_TENSOR_Q4_0: {
                const uint8_t* b = raw + 18 * (i / 32);
                memcpy(&h, b, 2);
                const int j = (int)(i % 32);
                const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
                ref[i] = fp16_to_fp32(h) * (float)(q - 8);
                break;
            }
            case GGUF_TENSOR_Q4_1: {
                const uint8_t* b = raw + 20 * (i / 32);
                uint16_t m;
                memcpy(&h, b, 2);
                memcpy(&m, b + 2, 2);
                const int j = (int)(i % 32);
                const int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
                ref[i] = fp16_to_fp32(h) * (float)q + fp16_to_fp32(m);
                break;
            }
            }
        }
        if (n) EXPECT_EQ(memcmp(f.data(), ref.data(), n * 4), 0) << t.name;
        // 16-bit outputs: rounding of the f32 values; same-type reads are exact copies.
        for (uint32_t ot : {GGUF_TENSOR_F16, GGUF_TENSOR_BF16}) {
            std::vector<uint16_t> h(n);
            ASSERT_EQ(r.read_tensor(t, ot, h.data(), n * 2, &err), GGUF_OK) << err;
            for (size_t i = 0; i < n; i++) {
                const uint16_t want = ot == GGUF_TENSOR_F16 ? fp32_to_fp16(ref[i]) : fp32_to_bf16(ref[i]);
                ASSERT_EQ(h[i], want) << t.name << " element " << i;
            }
            if (t.type == ot && n) EXPECT_EQ(memcmp(h.data(), raw, n * 2), 0);
        }
    }
    std::vector<float> v;
    ASSERT_EQ(r.read_tensor_f32("t.q4_1", &v, &err), GGUF_OK);
    std::vector<float> small(3);
    EXPECT_EQ(r.read_tensor("t.f32", GGUF_TENSOR_F32, small.data(), 12, &err), GGUF_ERR_ARG);
    EXPECT_NE(err.find("destination"), std::string::npos);
    EXPECT_EQ(r.read_tensor("t.f32", GGUF_TENSOR_Q8_0, small.data(), 12, &err), GGUF_ERR_ARG);
    EXPECT_EQ(r.read_tensor("nope", GGUF_TENSOR_F32, small.data(), 12, &err), GGUF_ERR_NOT_FOUND);
    unlink(path.c_str());
}

TEST(GGUF, KnownQuantizedValues) {
    // One Q8_0 block (d = 0.5, q = j - 16), one Q4_0 block (d = 2, nibbles j), one Q4_1 block
    // (d = 0.5, m = -1, nibbles 15 - j).
    std::string q8(34, '\0'), q40(18, '\0'), q41(20, '\0');
    uint16_t h = fp32_to_fp16(0.5f);
    memcpy(&q8[0], &h, 2);
    for (int j = 0; j < 32; j++) q8[2 + j] = (char)(int8_t)(j - 16);
    h = fp32_to_fp16(2.0f);
    memcpy(&q40[0], &h, 2);
    for (int j = 0; j < 16; j++) q40[2 + j] = (char)(j | ((15 - j) << 4));
    h = fp32_to_fp16(0.5f);
    uint16_t m = fp32_to_fp16(-1.0f);
    memcpy(&q41[0], &h, 2);
    memcpy(&q41[2], &m, 2);
    for (int j = 0; j < 16; j++) q41[4 + j] = (char)((15 - j) | (j << 4));
    std::vector<float> out(32);
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_Q8_0, q8.data(), GGUF_TENSOR_F32, out.data(), 32, nullptr), GGUF_OK);
    for (int j = 0; j < 32; j++) EXPECT_EQ(out[j], 0.5f * (j - 16));
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_Q4_0, q40.data(), GGUF_TENSOR_F32, out.data(), 32, nullptr), GGUF_OK);
    for (int j = 0; j < 16; j++) {
        EXPECT_EQ(out[j], 2.0f * (j - 8));
        EXPECT_EQ(out[j + 16], 2.0f * (15 - j - 8));
    }
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_Q4_1, q41.data(), GGUF_TENSOR_F32, out.data(), 32, nullptr), GGUF_OK);
    for (int j = 0; j < 16; j++) {
        EXPECT_EQ(out[j], 0.5f * (15 - j) - 1.0f);
        EXPECT_EQ(out[j + 16], 0.5f * j - 1.0f);
    }
    std::string err;
    EXPECT_EQ(gguf_convert(GGUF_TENSOR_Q8_0, q8.data(), GGUF_TENSOR_F32, out.data(), 31, &err), GGUF_ERR_ARG);
    EXPECT_EQ(gguf_convert(17, q8.data(), GGUF_TENSOR_F32, out.data(), 256, &err), GGUF_ERR_UNSUPPORTED);
    EXPECT_NE(err.find("IQ2_XS"), std::string::npos) << err;
}

// The model writers' check (oomb-export, oomb-train's checkpoints): NaN / inf anywhere, and for F16 / BF16 a
// finite value their rounding turns into an infinity, named by element; what the type holds passes.
TEST(GGUF, CheckFiniteAsNamesWhatTheTypeCannotHold) {
    std::string err;
    const float ok[4] = {1.0f, -65504.0f, 65519.0f, 1e30f};
    EXPECT_TRUE(gguf_check_finite_as(ok, 3, 0, GGUF_TENSOR_F16, &err)) << err;  // 65519 rounds to 65504
    EXPECT_TRUE(gguf_check_finite_as(ok, 4, 0, GGUF_TENSOR_BF16, &err)) << err;
    EXPECT_TRUE(gguf_check_finite_as(ok, 4, 0, GGUF_TENSOR_F32, &err)) << err;
    const float big[3] = {1.0f, 2.0f, 70000.0f};
    EXPECT_FALSE(gguf_check_finite_as(big, 3, 100, GGUF_TENSOR_F16, &err));
    EXPECT_NE(err.find("element 102 is 70000, beyond F16's range"), std::string::npos) << err;
    EXPECT_NE(err.find("--out-type bf16 or f32"), std::string::npos) << err;
    EXPECT_TRUE(gguf_check_finite_as(big, 3, 0, GGUF_TENSOR_BF16, &err)) << err;
    const float huge[1] = {3.4e38f};  // finite in f32, rounds to inf in bf16
    EXPECT_FALSE(gguf_check_finite_as(huge, 1, 0, GGUF_TENSOR_BF16, &err));
    EXPECT_NE(err.find("beyond BF16's range"), std::string::npos) << err;
    for (uint32_t t : {GGUF_TENSOR_F32, GGUF_TENSOR_F16, GGUF_TENSOR_BF16, GGUF_TENSOR_Q8_0}) {
        const float bad[3] = {0.0f, NAN, -INFINITY};
        EXPECT_FALSE(gguf_check_finite_as(bad, 3, 0, t, &err));
        EXPECT_NE(err.find("element 1 is NaN"), std::string::npos) << err;
        EXPECT_FALSE(gguf_check_finite_as(bad + 2, 1, 7, t, &err));
        EXPECT_NE(err.find("element 7 is -inf"), std::string::npos) << err;
    }
}

TEST(GGUF, StreamingWritesInArbitraryPieces) {
    const Sample s = make_sample();
    std::string all;
    for (auto& t : s.tensors) all += t.data;
    const std::string path = tmp_path("pieces.gguf");
    std::string err;
    GGUFWriter w;
    for (auto& kv : s.kv) w.set(kv.first, kv.second);
    for (auto& t : s.tensors) ASSERT_EQ(w.add_tensor(t.name, t.type, t.ne, &err), GGUF_OK);
    ASSERT_EQ(w.open(path, &err), GGUF_OK) << err;
    std::mt19937 rng(3);
    for (size_t i = 0; i < all.size();) {
        const size_t k = std::min<size_t>(all.size() - i, 1 + rng() % 40);
        ASSERT_EQ(w.write_data(all.data() + i, k, &err), GGUF_OK) << err;
        i += k;
    }
    EXPECT_EQ(w.write_data("x", 1, &err), GGUF_ERR_ARG); // more than declared
    ASSERT_EQ(w.finish(&err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(path, &err), GGUF_OK) << err;
    check_sample(r, s);
    unlink(path.c_str());
}

namespace {

std::string file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Byte `i` of a pattern that is not periodic at any chunk size used here.
uint8_t pattern_byte(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13 ^ i); }

gguf_status fill_pattern(void* dst, uint64_t off, size_t n, std::string*) {
    for (size_t k = 0; k < n; k++) ((uint8_t*)dst)[k] = pattern_byte(off + k);
    return GGUF_OK;
}

// A fill whose copy fails after the first chunk (e.g. a device error mid-save).
gguf_status fill_fails_after_first(void*, uint64_t off, size_t, std::string* e) {
    if (off > 0) { *e = "device copy failed"; return GGUF_ERR_IO; }
    return GGUF_OK;
}

} // namespace

TEST(GGUF, StreamChunksAreBoundedOrderedAndWholeGranules) {
    const uint64_t n = 2 * (uint64_t)kStagingBytes + 100;
    for (size_t granule : {(size_t)1, (size_t)12, kStagingBytes + 24}) {
        std::vector<std::pair<uint64_t, size_t>> got;
        uint64_t sunk = 0;
        std::string err;
        ASSERT_EQ(stream_chunks(n, granule,
                                [&](void* dst, uint64_t off, size_t k, std::string* e) {
                                    got.emplace_back(off, k);
                                    return fill_pattern(dst, off, k, e);
                                },
                                [&](const void* p, size_t k, std::string*) {
                                    EXPECT_EQ(((const uint8_t*)p)[k - 1], pattern_byte(sunk + k - 1));
                                    sunk += k;
                                    return GGUF_OK;
                                },
                                &err),
                  GGUF_OK) << err;
        ASSERT_FALSE(got.empty());
        uint64_t off = 0;
        for (size_t i = 0; i < got.size(); i++) {
            EXPECT_EQ(got[i].first, off);
            EXPECT_LE(got[i].second, std::max(granule, kStagingBytes)) << "granule " << granule;
            if (i + 1 < got.size()) EXPECT_EQ(got[i].second % granule, 0u) << "granule " << granule;
            off += got[i].second;
        }
        EXPECT_EQ(off, n);
        EXPECT_EQ(sunk, n);
    }
    std::string err;
    auto sink = [](const void*, size_t, std::string*) { return GGUF_OK; };
    EXPECT_EQ(stream_chunks(10, 0, fill_pattern, sink, &err), GGUF_ERR_ARG);
    err.clear();
    EXPECT_EQ(stream_chunks(2 * (uint64_t)kStagingBytes, 4, fill_fails_after_first, sink, &err), GGUF_ERR_IO);
    EXPECT_EQ(err, "device copy failed");
}

TEST(GGUF, ChunkedTensorWritesMatchWholeWrites) {
    // One tensor over the staging size (several chunks), one small, one empty.
    const int64_t big = (int64_t)(kStagingBytes / 4) + 1001;
    std::string data((size_t)big * 4, '\0');
    fill_pattern(&data[0], 0, data.size(), nullptr);
    const std::string a = tmp_path("whole.gguf"), b = tmp_path("chunked.gguf");
    std::string err;
    for (int chunked = 0; chunked < 2; chunked++) {
        GGUFWriter w;
        w.set_string("general.name", "chunks");
        ASSERT_EQ(w.add_tensor("big", GGUF_TENSOR_F32, {big}, &err), GGUF_OK) << err;
        ASSERT_EQ(w.add_tensor("empty", GGUF_TENSOR_F32, {0}, &err), GGUF_OK) << err;
        ASSERT_EQ(w.add_tensor("small", GGUF_TENSOR_F32, {3, 5}, &err), GGUF_OK) << err;
        ASSERT_EQ(w.open(chunked ? b : a, &err), GGUF_OK) << err;
        if (chunked) {
            EXPECT_EQ(w.write_tensor_chunks("small", 4, fill_pattern, &err), GGUF_ERR_ARG); // out of order
            ASSERT_EQ(w.write_tensor_chunks("big", 4, fill_pattern, &err), GGUF_OK) << err;
            ASSERT_EQ(w.write_tensor_chunks("small", 4, fill_pattern, &err), GGUF_OK) << err;
        } else {
            ASSERT_EQ(w.write_tensor("big", data.data(), data.size(), &err), GGUF_OK) << err;
            ASSERT_EQ(w.write_tensor("small", data.data(), 60, &err), GGUF_OK) << err;
        }
        ASSERT_EQ(w.finish(&err), GGUF_OK) << err;
    }
    EXPECT_TRUE(file_bytes(a) == file_bytes(b)) << "chunked and whole writes differ";
    // A failing fill: an error, and no file replaces the previous one.
    {
        GGUFWriter w;
        ASSERT_EQ(w.add_tensor("big", GGUF_TENSOR_F32, {big}, &err), GGUF_OK) << err;
        ASSERT_EQ(w.open(b, &err), GGUF_OK) << err;
        EXPECT_EQ(w.write_tensor_chunks("big", 4, fill_fails_after_first, &err), GGUF_ERR_IO);
        EXPECT_EQ(err, "device copy failed");
    }
    EXPECT_TRUE(file_bytes(a) == file_bytes(b)) << "an interrupted chunked write replaced the file";
    // safetensors: add_stream writes what add writes.
    const std::string c = tmp_path("whole.safetensors"), d = tmp_path("chunked.safetensors");
    for (int chunked = 0; chunked < 2; chunked++) {
        SafetensorsWriter w;
        w.set_metadata("k", "v");
        if (chunked) {
            ASSERT_EQ(w.add_stream("big", SafetensorsDtype::F32, {big}, fill_pattern, &err), GGUF_OK) << err;
            ASSERT_EQ(w.add_stream("small", SafetensorsDtype::BF16, {5, 3}, fill_pattern, &err), GGUF_OK) << err;
            EXPECT_EQ(w.add_stream("nofill", SafetensorsDtype::F32, {1}, nullptr, &err), GGUF_ERR_ARG);
        } else {
            ASSERT_EQ(w.add("big", SafetensorsDtype::F32, {big}, data.data(), &err), GGUF_OK) << err;
            ASSERT_EQ(w.add("small", SafetensorsDtype::BF16, {5, 3}, data.data(), &err), GGUF_OK) << err;
        }
        ASSERT_EQ(w.write(chunked ? d : c, &err), GGUF_OK) << err;
    }
    EXPECT_TRUE(file_bytes(c) == file_bytes(d)) << "streamed and whole safetensors differ";
    {
        SafetensorsWriter w;
        ASSERT_EQ(w.add_stream("big", SafetensorsDtype::F32, {big}, fill_fails_after_first, &err), GGUF_OK);
        EXPECT_EQ(w.write(d, &err), GGUF_ERR_IO);
        EXPECT_NE(err.find("tensor 'big': device copy failed"), std::string::npos) << err;
    }
    EXPECT_TRUE(file_bytes(c) == file_bytes(d)) << "a failed streamed write replaced the file";
    for (const std::string& p : {a, b, c, d}) unlink(p.c_str());
}

TEST(GGUF, WriterErrorsAndAtomicity) {
    const std::string path = tmp_path("atomic.gguf");
    write_all(path, "previous contents");
    std::string err;
    {
        GGUFWriter w;
        ASSERT_EQ(w.add_tensor("a", GGUF_TENSOR_F32, {4}, &err), GGUF_OK);
        ASSERT_EQ(w.add_tensor("b", GGUF_TENSOR_F32, {2, 2}, &err), GGUF_OK);
        EXPECT_EQ(w.add_tensor("a", GGUF_TENSOR_F32, {4}, &err), GGUF_ERR_ARG);
        EXPECT_NE(err.find("duplicate"), std::string::npos);
        EXPECT_EQ(w.add_tensor("c", GGUF_TENSOR_Q8_0, {31}, &err), GGUF_ERR_ARG);
        EXPECT_EQ(w.add_tensor("c", 4, {32}, &err), GGUF_ERR_ARG);
        EXPECT_EQ(w.add_tensor("c", GGUF_TENSOR_F32, {1, 1, 1, 1, 1}, &err), GGUF_ERR_ARG);
        EXPECT_EQ(w.add_tensor("c", GGUF_TENSOR_F32, {INT64_MAX, 4}, &err), GGUF_ERR_ARG);
        EXPECT_EQ(w.add_tensor("c", GGUF_TENSOR_F32, {-1}, &err), GGUF_ERR_ARG);
        EXPECT_EQ(w.set_alignment(48, &err), GGUF_ERR_ARG);
        EXPECT_EQ(w.set(GGUF_KEY_ALIGNMENT, GGUFValue::u64(64), &err), GGUF_ERR_ARG);
        ASSERT_EQ(w.open(path, &err), GGUF_OK) << err;
        float x[4] = {1, 2, 3, 4};
        EXPECT_EQ(w.write_tensor("b", x, 16, &err), GGUF_ERR_ARG); // out of order
        EXPECT_NE(err.find("out of order"), std::string::npos);
        EXPECT_EQ(w.write_tensor("a", x, 12, &err), GGUF_ERR_ARG); // wrong size
        ASSERT_EQ(w.write_tensor("a", x, 16, &err), GGUF_OK);
        EXPECT_EQ(w.finish(&err), GGUF_ERR_ARG); // "b" missing
        EXPECT_NE(err.find("'b'"), std::string::npos) << err;
    }
    EXPECT_EQ(read_all(path), "previous contents"); // untouched
    {
        GGUFWriter w; // abandoned without finish(): destructor removes the temporary file
        ASSERT_EQ(w.add_tensor("a", GGUF_TENSOR_F32, {4}, &err), GGUF_OK);
        ASSERT_EQ(w.open(path, &err), GGUF_OK);
    }
    EXPECT_EQ(read_all(path), "previous contents");
    // No temporary files left behind.
    const std::string dir = path.substr(0, path.rfind('/')), base = path.substr(path.rfind('/') + 1);
    DIR* d = opendir(dir.c_str());
    ASSERT_TRUE(d);
    while (dirent* e = readdir(d)) EXPECT_EQ(std::string(e->d_name).find(base + ".tmp."), std::string::npos) << e->d_name;
    closedir(d);
    GGUFWriter w;
    EXPECT_EQ(w.open("/nonexistent-dir/x.gguf", &err), GGUF_ERR_IO);
    // the output and its missing folder are named, not the writer's temporary file
    EXPECT_NE(err.find("cannot create /nonexistent-dir/x.gguf: its folder /nonexistent-dir does not exist"), std::string::npos) << err;
    EXPECT_EQ(err.find(".tmp."), std::string::npos) << err;
    unlink(path.c_str());
}

// A write stopped by SIGINT / SIGTERM in a program that called install_temp_file_cleanup()
// removes its temporary file and keeps the previous output. To stop the write at a known point,
// the child makes its temporary path a FIFO before writing: the writer's fopen() then waits for
// the parent to open it, and its writes block once the pipe is full, so the signal always comes
// in the middle of the write (as a Ctrl-C during a long write of a big model).
void check_signal_during_write(int sig, const std::function<bool(const std::string&, std::string*)>& write) {
    const std::string path = tmp_path("sig-" + std::to_string(sig) + ".out");
    write_all(path, "previous contents");
    fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        // Signals ignored by the parent stay ignored (a background job of a script ignores
        // SIGINT), and install_temp_file_cleanup() rightly leaves ignored signals alone.
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        install_temp_file_cleanup();
        install_temp_file_cleanup(); // idempotent
        if (mkfifo((path + ".tmp." + std::to_string(getpid())).c_str(), 0600) != 0) _exit(3);
        std::string err;
        const bool ok = write(path, &err);
        _exit(ok ? 0 : 4); // not reached: the parent stops reading and kills us
    }
    const std::string tmp = path + ".tmp." + std::to_string(pid);
    int fd = -1;
    std::string got;
    for (int i = 0; i < 2000 && got.size() < 4096; i++) { // up to ~20 s
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) FAIL() << "writer exited early, status " << st;
        if (fd < 0) fd = open(tmp.c_str(), O_RDONLY | O_NONBLOCK);
        if (fd >= 0) {
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, 10) > 0) {
                char buf[4096];
                const ssize_t k = read(fd, buf, sizeof buf);
                if (k > 0) got.append(buf, (size_t)k);
            }
        } else {
            usleep(10000);
        }
    }
    ASSERT_GE(got.size(), 4096u) << "the child never started writing";
    ASSERT_EQ(access(tmp.c_str(), F_OK), 0) << tmp << " should exist while the write is blocked";
    kill(pid, sig);
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    if (fd >= 0) close(fd);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "status " << st << ": should die of signal " << sig;
    EXPECT_NE(access(tmp.c_str(), F_OK), 0) << tmp << " left behind after signal " << sig;
    EXPECT_EQ(read_all(path), "previous contents");
    unlink(tmp.c_str());
    unlink(path.c_str());
}

// The output's path as users give it (review s29): a symbolic link is followed (the file it names is replaced, the link
// stays; was: the link replaced by a regular file), a FIFO or device is refused up front (was: replaced by the rename),
// a directory is named before anything is written, and write errors name the output, not its temporary file.
TEST(GGUF, WriterOutputsThroughLinksAndSpecialFiles) {
    std::string err;
    auto write_one = [&](const std::string & path) {
        GGUFWriter w;
        w.set_u32("k", 7);
        if (w.open(path, &err) != GGUF_OK) return false;
        return w.finish(&err) == GGUF_OK;
    };
    const std::string target = tmp_path("link-target.gguf"), link = tmp_path("link.gguf");
    write_all(target, "old");
    unlink(link.c_str());
    ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
    ASSERT_TRUE(write_one(link)) << err;
    struct stat ls;
    ASSERT_EQ(lstat(link.c_str(), &ls), 0);
    EXPECT_TRUE(S_ISLNK(ls.st_mode)) << "the link stays a link";
    GGUFReader r;
    ASSERT_EQ(r.open(target, &err), GGUF_OK) << "the link's target holds the new file: " << err;
    // a dangling link: its target is created
    const std::string dangling = tmp_path("dangling.gguf"), made = tmp_path("dangling-target.gguf");
    unlink(dangling.c_str());
    unlink(made.c_str());
    ASSERT_EQ(symlink(made.c_str(), dangling.c_str()), 0);
    ASSERT_TRUE(write_one(dangling)) << err;
    EXPECT_EQ(access(made.c_str(), F_OK), 0);
    // a FIFO: refused, left as it is
    const std::string fifo = tmp_path("out.fifo");
    unlink(fifo.c_str());
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    EXPECT_FALSE(write_one(fifo));
    EXPECT_NE(err.find("is not a regular file"), std::string::npos) << err;
    struct stat fs;
    ASSERT_EQ(lstat(fifo.c_str(), &fs), 0);
    EXPECT_TRUE(S_ISFIFO(fs.st_mode));
    EXPECT_FALSE(write_one("/dev/null"));
    EXPECT_NE(err.find("/dev/null is not a regular file"), std::string::npos) << err;
    // a directory: named at open
    EXPECT_FALSE(write_one(target.substr(0, target.rfind('/'))));
    EXPECT_NE(err.find("is a directory"), std::string::npos) << err;
    // safetensors: the same rules
    SafetensorsWriter sw;
    const float v[2] = {1, 2};
    ASSERT_EQ(sw.add("t", SafetensorsDtype::F32, {2}, v, &err), GGUF_OK) << err;
    EXPECT_EQ(sw.write(fifo, &err), GGUF_ERR_IO);
    EXPECT_NE(err.find("is not a regular file"), std::string::npos) << err;
    ASSERT_EQ(sw.write(link, &err), GGUF_OK) << err;
    ASSERT_EQ(lstat(link.c_str(), &ls), 0);
    EXPECT_TRUE(S_ISLNK(ls.st_mode));
    unlink(fifo.c_str());
    unlink(link.c_str());
    unlink(target.c_str());
    unlink(dangling.c_str());
    unlink(made.c_str());
}

TEST(GGUF, SignalDuringWriteRemovesTemporaryFile) {
    for (int sig : {SIGINT, SIGTERM}) {
        SCOPED_TRACE("signal " + std::to_string(sig));
        check_signal_during_write(sig, [](const std::string& path, std::string* err) {
            GGUFWriter w;
            std::vector<float> v(1 << 22, 0.5f); // 16 MB, far more than a pipe holds
            if (w.add_tensor("big", GGUF_TENSOR_F32, {(int64_t)v.size()}, err) || w.open(path, err)) return false;
            if (w.write_tensor("big", v.data(), v.size() * 4, err)) return false;
            return w.finish(err) == GGUF_OK;
        });
        check_signal_during_write(sig, [](const std::string& path, std::string* err) {
            SafetensorsWriter w;
            std::vector<float> v(1 << 22, 0.5f);
            if (w.add_f32("big", {(int64_t)v.size()}, v.data(), err)) return false;
            return w.write(path, err) == GGUF_OK;
        });
    }
}

TEST(GGUF, TempFileRegistry) {
    // The handler removes exactly the registered files; unregistered ones stay.
    const std::string a = tmp_path("reg-a"), b = tmp_path("reg-b");
    write_all(a, "a");
    write_all(b, "b");
    const int ia = temp_file_register(a), ib = temp_file_register(b);
    ASSERT_GE(ia, 0);
    ASSERT_GE(ib, 0);
    EXPECT_NE(ia, ib);
    temp_file_unregister(ib);
    fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        install_temp_file_cleanup();
        raise(SIGTERM);
        _exit(0);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << st;
    EXPECT_NE(access(a.c_str(), F_OK), 0) << "registered file not removed";
    EXPECT_EQ(read_all(b), "b") << "unregistered file removed";
    temp_file_unregister(ia);
    // A relative path is registered as absolute (the handler must find it after a chdir).
    const int ir = temp_file_register("relative-name");
    EXPECT_GE(ir, 0);
    temp_file_unregister(ir);
    EXPECT_EQ(temp_file_register(""), -1);
    EXPECT_EQ(temp_file_register(std::string(5000, 'x')), -1);
    unlink(a.c_str());
    unlink(b.c_str());
}

TEST(GGUF, OpenErrorsFromFiles) {
    GGUFReader r;
    std::string err;
    EXPECT_EQ(r.open("/nonexistent/file.gguf", &err), GGUF_ERR_IO);
    EXPECT_NE(err.find("/nonexistent/file.gguf"), std::string::npos);
    EXPECT_EQ(r.open("/tmp", &err), GGUF_ERR_IO);
    EXPECT_NE(err.find("/tmp: is a directory"), std::string::npos) << err;
    const std::string path = tmp_path("empty.gguf");
    write_all(path, "");
    EXPECT_EQ(r.open(path, &err), GGUF_ERR_FORMAT);
    write_all(path, "GGU");
    EXPECT_EQ(r.open(path, &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("truncated"), std::string::npos);
    unlink(path.c_str());
}

TEST(GGUF, HeaderErrors) {
    EXPECT_GGUF_ERROR(std::string("GGML\x03\0\0\0", 8) + std::string(16, '\0'), GGUF_ERR_FORMAT, "bad magic");
    for (uint32_t v : {0u, 4u, 99u}) EXPECT_GGUF_ERROR(Bytes().header(0, 0, v).b, GGUF_ERR_FORMAT, "bad GGUF version");
    EXPECT_GGUF_ERROR(Bytes().header(0, 0, 1).b, GGUF_ERR_UNSUPPORTED, "version 1");
    EXPECT_GGUF_ERROR(Bytes().header(0, 0, 0x03000000).b, GGUF_ERR_UNSUPPORTED, "big-endian");
    EXPECT_GGUF_ERROR(Bytes().header(0, 0).b.substr(0, 20), GGUF_ERR_FORMAT, "truncated");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1ull << 40).b, GGUF_ERR_FORMAT, "absurd metadata count");
    EXPECT_GGUF_ERROR(Bytes().header(~0ull, 0).b, GGUF_ERR_FORMAT, "absurd tensor count");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1ull << 40).b + std::string(4096, '\0'), GGUF_ERR_FORMAT, "absurd metadata count");
    EXPECT_GGUF_ERROR(Bytes().header(1ull << 33, 2).kv_u32("a", 1).kv_u32("b", 2).b + std::string(4096, '\0'),
                      GGUF_ERR_FORMAT, "absurd tensor count");
    {   // A file cut short in its header (plausible counts, bytes missing) says it is truncated.
        Bytes b;
        b.header(3, 12).kv_u32("general.alignment", 32).kv_u32("qwen2.block_count", 24).str("general.na");
        b.b.resize(100, 'x');
        std::string e;
        EXPECT_EQ(parse(b.b, &e), GGUF_ERR_FORMAT);
        EXPECT_NE(e.find("file is truncated"), std::string::npos) << e;
        EXPECT_NE(e.find("12 metadata entries"), std::string::npos) << e;
        EXPECT_EQ(e.find("absurd"), std::string::npos) << e;
    }
    std::string err;
    EXPECT_EQ(parse(Bytes().header(0, 0).b, &err), GGUF_OK) << err; // minimal valid file
    EXPECT_EQ(parse(Bytes().header(0, 0, 2).b, &err), GGUF_OK) << err; // v2 has the same layout
}

TEST(GGUF, MetadataErrors) {
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).u64(1ull << 50).b + std::string(20, 'k'), GGUF_ERR_FORMAT, "key runs past");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str("k").u32(13).u32(0).b, GGUF_ERR_FORMAT, "unknown value type 13");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str("k").u32(GGUF_TYPE_STRING).u64(1000).b + "abc", GGUF_ERR_FORMAT,
                      "string runs past");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str("k").u32(GGUF_TYPE_UINT64).u32(1).b, GGUF_ERR_FORMAT, "truncated");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str("k").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_UINT32).u64(1ull << 60).b + std::string(64, '\0'),
                      GGUF_ERR_FORMAT, "cannot fit");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str("k").u32(GGUF_TYPE_ARRAY).u32(77).u64(1).b + std::string(64, '\0'),
                      GGUF_ERR_FORMAT, "array of unknown value type 77");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str("k").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_STRING).u64(2).str("a").u64(99).b,
                      GGUF_ERR_FORMAT, "array string 1");
    {   // arrays nested 20 deep
        Bytes b;
        b.header(0, 1).str("deep").u32(GGUF_TYPE_ARRAY);
        for (int i = 0; i < 20; i++) b.u32(GGUF_TYPE_ARRAY).u64(1);
        b.u32(GGUF_TYPE_UINT8).u64(0);
        EXPECT_GGUF_ERROR(b.b, GGUF_ERR_FORMAT, "nested deeper");
    }
    EXPECT_GGUF_ERROR(Bytes().header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).b, GGUF_ERR_FORMAT, "duplicate metadata key 'a.b'");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).str(GGUF_KEY_ALIGNMENT).u32(GGUF_TYPE_UINT64).u64(32).b, GGUF_ERR_FORMAT,
                      "general.alignment must be uint32");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).kv_u32(GGUF_KEY_ALIGNMENT, 48).b, GGUF_ERR_FORMAT, "not a power of two");
    EXPECT_GGUF_ERROR(Bytes().header(0, 1).kv_u32(GGUF_KEY_ALIGNMENT, 0).b, GGUF_ERR_FORMAT, "not a power of two");
}

TEST(GGUF, TensorInfoErrors) {
    auto one = [](const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t off, size_t data) {
        return Bytes().header(1, 0).tensor(name, ne, type, off).pad().zeros(data).b;
    };
    std::string err;
    EXPECT_EQ(parse(one("w", {8, 4}, GGUF_TENSOR_F32, 0, 128), &err), GGUF_OK) << err;
    EXPECT_GGUF_ERROR(one("w", {1, 1, 1, 1, 1}, GGUF_TENSOR_F32, 0, 4), GGUF_ERR_FORMAT, "5 dimensions");
    EXPECT_GGUF_ERROR(one("scalar", {}, GGUF_TENSOR_F32, 0, 4), GGUF_ERR_FORMAT, "tensor 'scalar': 0 dimensions (must be 1..4)");
    EXPECT_GGUF_ERROR(one("w", {~0ull}, GGUF_TENSOR_F32, 0, 4), GGUF_ERR_FORMAT, "too large");
    EXPECT_GGUF_ERROR(one("w", {1ull << 32, 1ull << 32}, GGUF_TENSOR_F32, 0, 4), GGUF_ERR_FORMAT, "overflows");
    EXPECT_GGUF_ERROR(one("w", {1ull << 62, 2}, GGUF_TENSOR_F32, 0, 4), GGUF_ERR_FORMAT, "overflows");
    EXPECT_GGUF_ERROR(one("w", {1ull << 61}, GGUF_TENSOR_F32, 0, 4), GGUF_ERR_FORMAT, "runs past the end");
    EXPECT_GGUF_ERROR(one("w", {33}, GGUF_TENSOR_Q8_0, 0, 64), GGUF_ERR_FORMAT, "not a multiple of the Q8_0 block size");
    EXPECT_GGUF_ERROR(one("w", {32}, 4, 0, 64), GGUF_ERR_FORMAT, "unknown ggml type 4");
    EXPECT_GGUF_ERROR(one("w", {32}, 1000, 0, 64), GGUF_ERR_FORMAT, "unknown ggml type 1000");
    EXPECT_EQ(parse(one("w", {256}, 12, 0, 144), &err), GGUF_OK) << err; // Q4_K is read
    EXPECT_GGUF_ERROR(one("w", {256}, 34, 0, 144), GGUF_ERR_UNSUPPORTED, "TQ1_0");
    EXPECT_GGUF_ERROR(one("w", {256}, 17, 0, 144), GGUF_ERR_UNSUPPORTED, "IQ2_XS");
    EXPECT_EQ(parse(one("w", {256}, 17, 0, 144), &err, true), GGUF_OK) << err; // listable for the dump tool
    {
        const std::string f = one("w", {256}, 17, 0, 144);
        GGUFReader r;
        ASSERT_EQ(r.open_memory(f.data(), f.size(), &err, GGUFReadOptions{true}), GGUF_OK);
        std::vector<float> v;
        EXPECT_EQ(r.read_tensor_f32("w", &v, &err), GGUF_ERR_UNSUPPORTED);
        EXPECT_NE(err.find("IQ2_XS"), std::string::npos) << err;
    }
    EXPECT_GGUF_ERROR(one("w", {8}, GGUF_TENSOR_F32, 4, 64), GGUF_ERR_FORMAT, "not a multiple of the alignment");
    EXPECT_GGUF_ERROR(one("w", {8}, GGUF_TENSOR_F32, 64, 64), GGUF_ERR_FORMAT, "runs past the end");
    EXPECT_GGUF_ERROR(one("w", {8}, GGUF_TENSOR_F32, 0, 31), GGUF_ERR_FORMAT, "runs past the end");
    EXPECT_GGUF_ERROR(one("w", {8}, GGUF_TENSOR_F32, ~0ull - 31, 64), GGUF_ERR_FORMAT, "runs past the end");
    EXPECT_GGUF_ERROR(Bytes().header(1, 0).u64(1ull << 40).b + std::string(64, 'x'), GGUF_ERR_FORMAT, "name runs past");
    EXPECT_GGUF_ERROR(Bytes().header(1, 0).str("w").u32(2).u64(3).b + std::string(10, '\0'), GGUF_ERR_FORMAT, "truncated");
    EXPECT_GGUF_ERROR(Bytes().header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64).b,
                      GGUF_ERR_FORMAT, "duplicate tensor name 'w'");
    EXPECT_GGUF_ERROR(Bytes().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(96).b,
                      GGUF_ERR_FORMAT, "overlap");
    // Tensors in any order and with gaps are fine as long as they do not overlap.
    EXPECT_EQ(parse(Bytes().header(2, 0).tensor("a", {8}, 0, 64).tensor("b", {8}, 0, 0).pad().zeros(96).b, &err), GGUF_OK) << err;
    // A zero-size tensor may sit anywhere in range.
    EXPECT_EQ(parse(Bytes().header(2, 0).tensor("a", {0}, 0, 0).tensor("b", {8}, 0, 0).pad().zeros(32).b, &err), GGUF_OK) << err;
}

namespace {
// Peak resident set size (VmHWM) of this process in bytes, after resetting it to the current RSS
// when `reset` (Linux: "5" > /proc/self/clear_refs). -1 when not available.
int64_t peak_rss(bool reset) {
    if (reset) {
        FILE* f = fopen("/proc/self/clear_refs", "w");
        if (!f) return -1;
        const bool ok = fputs("5", f) >= 0;
        if (fclose(f) != 0 || !ok) return -1;
    }
    FILE* f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %" SCNd64 " kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

// Opens `path` and checks that it fails with `substr`, and that its peak RSS grew by less than
// `max_growth` bytes meanwhile (when the kernel lets us measure it).
void expect_rejected_cheaply(const std::string& path, const std::string& substr, int64_t max_growth) {
    const int64_t before = peak_rss(true);
    GGUFReader r;
    std::string err;
    EXPECT_EQ(r.open(path, &err), GGUF_ERR_FORMAT) << err;
    EXPECT_NE(err.find(substr), std::string::npos) << "message was: " << err;
    const int64_t after = peak_rss(false);
    if (before >= 0 && after >= 0) {
        EXPECT_LT(after - before, max_growth) << "peak RSS grew by " << (after - before) << " bytes";
    } else {
        printf("peak RSS not measurable here: only the error is checked\n");
    }
}
} // namespace

// A file of millions of empty arrays (12 bytes each on disk, ~130 in memory) or of empty keys
// (24 bytes each, ~200 in memory with their index) is refused before its metadata is allocated.
TEST(GGUF, MetadataMemoryIsBoundedByTheFileSize) {
    const size_t n = 1u << 20;
    {   // one key holding an array of n empty arrays
        Bytes b;
        b.header(0, 1).str("k").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_ARRAY).u64(n);
        for (size_t i = 0; i < n; i++) b.u32(GGUF_TYPE_UINT8).u64(0);
        const std::string path = tmp_path("empty-arrays.gguf");
        write_all(path, b.b);
        // The file is mapped and read (12 MiB of RSS); the old reader allocated ~130 MiB more.
        expect_rejected_cheaply(path, "metadata would take more than", 3 * (int64_t)b.b.size());
        unlink(path.c_str());
    }
    {   // n keys, each an empty array
        Bytes b;
        b.header(0, n);
        for (size_t i = 0; i < n; i++) b.str("").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_UINT8).u64(0);
        const std::string path = tmp_path("empty-keys.gguf");
        write_all(path, b.b);
        expect_rejected_cheaply(path, "limit: 4x the file size", 3 * (int64_t)b.b.size());
        unlink(path.c_str());
    }
    {   // The same in memory, nested: arrays of arrays of empty arrays.
        Bytes b;
        b.header(0, 1).str("k").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_ARRAY).u64(1024);
        for (int i = 0; i < 1024; i++) {
            b.u32(GGUF_TYPE_ARRAY).u64(256);
            for (int j = 0; j < 256; j++) b.u32(GGUF_TYPE_UINT8).u64(0);
        }
        EXPECT_GGUF_ERROR(b.b, GGUF_ERR_FORMAT, "metadata would take more than");
    }
    // Legitimate shapes stay well inside the bound: a million empty strings (the densest string
    // array, 8 bytes each on disk and 32 in memory), a vocabulary of short tokens, many keys.
    std::string err;
    {
        Bytes b;
        b.header(0, 1).str("tokenizer.ggml.tokens").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_STRING).u64(n);
        for (size_t i = 0; i < n; i++) b.str("");
        GGUFReader r;
        ASSERT_EQ(r.open_memory(b.b.data(), b.b.size(), &err), GGUF_OK) << err;
        EXPECT_EQ(r.find("tokenizer.ggml.tokens")->array_size(), n);
    }
    {
        Bytes b;
        b.header(0, 1).str("tokenizer.ggml.tokens").u32(GGUF_TYPE_ARRAY).u32(GGUF_TYPE_STRING).u64(n / 8);
        for (size_t i = 0; i < n / 8; i++) b.str(std::string(1 + i % 6, 'a' + (char)(i % 26)));
        EXPECT_EQ(parse(b.b, &err), GGUF_OK) << err;
    }
    {
        Bytes b;
        b.header(0, 4000);
        for (int i = 0; i < 4000; i++) b.kv_u32("general.some_rather_long_key_name." + std::to_string(i), (uint32_t)i);
        EXPECT_EQ(parse(b.b, &err), GGUF_OK) << err;
    }
}

TEST(GGUF, EveryTruncationIsAnError) {
    const Sample s = make_sample();
    const std::string path = tmp_path("trunc.gguf");
    std::string err;
    ASSERT_EQ(write_sample(s, path, &err), GGUF_OK) << err;
    const std::string bytes = read_all(path);
    GGUFReader r;
    ASSERT_EQ(r.open_memory(bytes.data(), bytes.size(), &err), GGUF_OK);
    uint64_t end = 0;
    for (auto& t : r.tensors()) end = std::max(end, r.data_offset() + t.offset + t.nbytes);
    for (size_t n = 0; n < end; n++) {
        GGUFReader q;
        ASSERT_NE(q.open_memory(bytes.data(), n, &err), GGUF_OK) << "prefix of " << n << " bytes accepted";
        ASSERT_FALSE(err.empty());
        // Wherever the cut falls (header, metadata, tensor infos, data), the message says so.
        EXPECT_NE(err.find("truncated"), std::string::npos) << "prefix of " << n << " bytes: " << err;
        EXPECT_EQ(err.find("absurd"), std::string::npos) << "prefix of " << n << " bytes: " << err;
    }
    {   // The same from a file on disk, cut inside its metadata.
        const std::string cut = tmp_path("cut.gguf");
        write_all(cut, bytes.substr(0, 100));
        GGUFReader q;
        EXPECT_EQ(q.open(cut, &err), GGUF_ERR_FORMAT);
        EXPECT_NE(err.find("truncated"), std::string::npos) << err;
        EXPECT_NE(err.find(cut), std::string::npos) << err;
        unlink(cut.c_str());
    }
    unlink(path.c_str());
}

// Seeded mutation fuzzing: thousands of corrupted variants of a valid file must each either
// parse (and then read completely) or fail with a message — never crash or hang.
TEST(GGUF, MutationFuzz) {
    const Sample s = make_sample();
    const std::string path = tmp_path("fuzz.gguf");
    std::string err;
    ASSERT_EQ(write_sample(s, path, &err), GGUF_OK) << err;
    const std::string base = read_all(path);
    unlink(path.c_str());
    std::mt19937_64 rng(12345);
    const uint64_t interesting[] = {0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 32, 33, 255, 256, 0x7fff, 0xffff, 0x7fffffff, 0x80000000,
                                    0xffffffff, 1ull << 32, 1ull << 62, 0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull};
    const auto t0 = std::chrono::steady_clock::now();
    int accepted = 0, rejected = 0;
    const int kMutants = 20000;
    for (int it = 0; it < kMutants; it++) {
        std::string m = base;
        const int n_mut = 1 + (int)(rng() % 4);
        for (int k = 0; k < n_mut && !m.empty(); k++) {
            const size_t pos = rng() % m.size();
            switch (rng() % 7) {
            case 0: m[pos] = (char)(rng() & 0xff); break;                   // random byte
            case 1: m[pos] ^= (char)(1 << (rng() % 8)); break;              // bit flip
            case 2: {                                                       // interesting 32/64-bit value
                const uint64_t v = interesting[rng() % (sizeof interesting / sizeof interesting[0])];
                const size_t w = (rng() & 1) ? 8 : 4;
                if (pos + w <= m.size()) memcpy(&m[pos], &v, w);
                break;
            }
            case 3: m.resize(pos); break;                                   // truncate
            case 4: m.insert(pos, std::string(1 + rng() % 16, (char)(rng() & 0xff))); break; // insert
            case 5: m.erase(pos, 1 + rng() % 16); break;                    // delete
            case 6: {                                                       // duplicate a chunk
                const size_t len = std::min<size_t>(m.size() - pos, 1 + rng() % 64);
                m.insert(rng() % m.size(), m.substr(pos, len));
                break;
            }
            }
        }
        GGUFReader r;
        if (r.open_memory(m.data(), m.size(), &err, GGUFReadOptions{(rng() & 1) != 0}) == GGUF_OK) {
            accepted++;
            for (auto& kv : r.metadata()) (void)kv.second.to_string();
            for (auto& t : r.tensors()) {
                std::vector<float> v((size_t)t.nelements());
                const gguf_status st = r.read_tensor(t, GGUF_TENSOR_F32, v.data(), v.size() * 4, &err);
                EXPECT_TRUE(st == GGUF_OK || st == GGUF_ERR_UNSUPPORTED) << err;
            }
        } else {
            rejected++;
            ASSERT_FALSE(err.empty());
        }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("fuzz: %d mutants, %d accepted, %d rejected, %.2f s\n", kMutants, accepted, rejected, secs);
    EXPECT_GT(rejected, kMutants / 2);
    EXPECT_LT(secs, 30.0);
}

// ---------------------------------------------------------------------------------------------
// Safetensors headers found bad by fuzzing (the other malformed cases are in test-convert.cpp).

namespace {
gguf_status open_safetensors(const std::string& header, const std::string& data, std::string* err) {
    const std::string path = tmp_path("st.safetensors");
    const uint64_t n = header.size();
    write_all(path, std::string((const char*)&n, 8) + header + data);
    SafetensorsFile f;
    const gguf_status s = f.open(path, err);
    unlink(path.c_str());
    return s;
}
} // namespace

TEST(Safetensors, ZeroSizeTensorDoesNotHideAnOverlap) {
    std::string err;
    // a = [0, 8), b = [4, 4) (empty), c = [4, 12): c aliases the second half of a. Sorted by
    // offsets, b sits between a and c, which an adjacent-pairs check skipped.
    EXPECT_EQ(open_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                               R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
                               R"( "c": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                               std::string(12, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("tensors 'a' and 'c' overlap"), std::string::npos) << err;
    // A long tensor overlapping one that is not its sorted neighbour: a = [0, 16), b = [4, 8), c = [8, 12).
    EXPECT_EQ(open_safetensors(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                               R"( "c": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},)"
                               R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                               std::string(16, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("overlap"), std::string::npos) << err;
    // Zero-size tensors anywhere inside the data (also at its end, also inside another tensor)
    // alias nothing and are fine.
    EXPECT_EQ(open_safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                               R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
                               R"( "d": {"dtype": "F32", "shape": [3, 0], "data_offsets": [12, 12]},)"
                               R"( "c": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                               std::string(12, 'x'), &err), GGUF_OK) << err;
    // ... but not past it, and not with begin != end.
    EXPECT_EQ(open_safetensors(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [13, 13]}})",
                               std::string(12, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("outside"), std::string::npos) << err;
    EXPECT_EQ(open_safetensors(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 4]}})",
                               std::string(12, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("needs 0"), std::string::npos) << err;
}

TEST(Safetensors, DuplicateKeysAreAnError) {
    std::string err;
    const std::string t = R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
    const std::string u = R"({"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})";
    EXPECT_EQ(open_safetensors(R"({"w": )" + t + R"(, "w": )" + u + "}", std::string(8, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("key 'w' twice"), std::string::npos) << err;
    // The same key spelt with an escape is the same key.
    EXPECT_EQ(open_safetensors(R"({"w": )" + t + R"(, "\u0077": )" + u + "}", std::string(8, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("key 'w' twice"), std::string::npos) << err;
    // Inside a tensor entry and inside __metadata__.
    EXPECT_EQ(open_safetensors(R"({"w": {"dtype": "F32", "shape": [1], "dtype": "F16", "data_offsets": [0, 4]}})",
                               std::string(4, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("key 'dtype' twice"), std::string::npos) << err;
    EXPECT_EQ(open_safetensors(R"({"__metadata__": {"format": "pt", "format": "np"}, "w": )" + t + "}",
                               std::string(4, 'x'), &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("key 'format' twice"), std::string::npos) << err;
    // The same key in two different objects is not a duplicate.
    EXPECT_EQ(open_safetensors(R"({"__metadata__": {"dtype": "x"}, "w": )" + t + R"(, "v": )" + u + "}",
                               std::string(8, 'x'), &err), GGUF_OK) << err;
    // A sharded checkpoint's index with a tensor listed twice.
    const std::string index = tmp_path("st.index.json");
    write_all(index, R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})");
    SafetensorsModel m;
    EXPECT_EQ(m.open(index, &err), GGUF_ERR_FORMAT);
    EXPECT_NE(err.find("key 'w' twice"), std::string::npos) << err;
    unlink(index.c_str());
}

// Writes the sample (every value type, every readable tensor type) to $OOMB_GGUF_SAMPLE_OUT for the
// Python interoperability test (tests/py/test_gguf_interop.py); skipped otherwise.
TEST(GGUFInterop, WriteSample) {
    const char* out = getenv("OOMB_GGUF_SAMPLE_OUT");
    if (!out || !*out) GTEST_SKIP() << "OOMB_GGUF_SAMPLE_OUT not set";
    std::string err;
    ASSERT_EQ(write_sample(make_sample(), out, &err, 64), GGUF_OK) << err;
}

// gguf_convert into Q8_0: the reference formula's blocks (random values, a zero block, a block
// whose maximum is negative), from f32 and from bf16; a count that is not whole blocks is an error.
TEST(GGUF, ConvertQuantizesQ8_0) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.7f);
    std::vector<float> x(32 * 5);
    for (auto& v : x) v = nd(rng);
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
    x[100] = -9.0f;
    std::vector<uint8_t> want(5 * 34), got(5 * 34, 0xAA);
    for (int b = 0; b < 5; b++) quantize_q8_0(x.data() + 32 * b, want.data() + 34 * b);
    std::string err;
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), GGUF_TENSOR_Q8_0, got.data(), 160, &err), GGUF_OK) << err;
    EXPECT_EQ(got, want);
    // from bf16: the bf16 values' blocks
    std::vector<uint16_t> h(x.size());
    std::vector<float> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) { h[i] = fp32_to_bf16(x[i]); xb[i] = bf16_to_fp32(h[i]); }
    for (int b = 0; b < 5; b++) quantize_q8_0(xb.data() + 32 * b, want.data() + 34 * b);
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_BF16, h.data(), GGUF_TENSOR_Q8_0, got.data(), 160, &err), GGUF_OK) << err;
    EXPECT_EQ(got, want);
    // round trip: dequantized values re-quantize to the same blocks
    std::vector<float> back(x.size());
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_Q8_0, want.data(), GGUF_TENSOR_F32, back.data(), 160, &err), GGUF_OK) << err;
    ASSERT_EQ(gguf_convert(GGUF_TENSOR_F32, back.data(), GGUF_TENSOR_Q8_0, got.data(), 160, &err), GGUF_OK) << err;
    EXPECT_EQ(got, want);
    err.clear();
    EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), GGUF_TENSOR_Q8_0, got.data(), 40, &err), GGUF_ERR_ARG);
    EXPECT_NE(err.find("not a multiple of its block size 32"), std::string::npos) << err;
    EXPECT_EQ(gguf_convert(GGUF_TENSOR_F32, x.data(), GGUF_TENSOR_Q2_K, got.data(), 256, &err), GGUF_ERR_ARG);
    EXPECT_NE(err.find("F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q5_K or Q6_K"), std::string::npos) << err;
}

// A loader gives a tensor's mapped pages back once it copied them (GGUFReader / SafetensorsFile::
// release): the file's bytes leave the resident set (a 7B resume held its 28 GB state file there),
// and the range reads the same bytes again afterwards. 64 MiB tensors, so the drop is far above noise.
namespace {
int64_t rss_kib() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
    return -1;
}
uint64_t touch_sum(const uint8_t* p, size_t n) {  // reads every page
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 512) s += p[i] * (i / 512 + 1);
    return s;
}
} // namespace

TEST(MappedRelease, GgufAndSafetensorsPagesLeaveTheResidentSet) {
    if (rss_kib() < 0) GTEST_SKIP() << "SKIPPED: no /proc/self/status VmRSS on this system";
    const size_t n = (size_t) 64 << 20;
    std::vector<uint8_t> v(n);
    std::mt19937 rng(19);
    for (auto& x : v) x = (uint8_t) rng();
    std::string err;
    const std::string gp = tmp_path("release.gguf"), sp = tmp_path("release.safetensors");
    {
        GGUFWriter w;
        ASSERT_EQ(w.add_tensor("big", GGUF_TENSOR_F32, {(int64_t) n / 4}, &err), GGUF_OK) << err;
        ASSERT_EQ(w.open(gp, &err), GGUF_OK) << err;
        ASSERT_EQ(w.write_tensor("big", v.data(), n, &err), GGUF_OK) << err;
        ASSERT_EQ(w.finish(&err), GGUF_OK) << err;
        SafetensorsWriter s;
        ASSERT_EQ(s.add_copy("big", SafetensorsDtype::F32, {(int64_t) n / 4}, v.data()), GGUF_OK);
        ASSERT_EQ(s.write(sp, &err), GGUF_OK) << err;
    }
    const uint64_t want = touch_sum(v.data(), n);
    std::vector<uint8_t>().swap(v);
    GGUFReader r;
    ASSERT_EQ(r.open(gp, &err), GGUF_OK) << err;
    const GGUFTensorInfo& t = *r.find_tensor("big");
    EXPECT_EQ(touch_sum(r.tensor_data(t), t.nbytes), want);
    const int64_t g_mapped = rss_kib();
    r.release(r.tensor_data(t), t.nbytes);
    const int64_t g_released = rss_kib();
    EXPECT_GT(g_mapped - g_released, 48 << 10) << "GGUF: RSS " << g_mapped << " KiB mapped, " << g_released << " KiB after release";
    EXPECT_EQ(touch_sum(r.tensor_data(t), t.nbytes), want);  // read again from the file
    r.release(nullptr, 0);                                   // no-ops: nothing, or outside the mapping
    r.release(&err, sizeof(err));
    SafetensorsFile f;
    ASSERT_EQ(f.open(sp, &err), GGUF_OK) << err;
    const SafetensorsTensor* st = f.find("big");
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(touch_sum(st->data, st->nbytes), want);
    const int64_t s_mapped = rss_kib();
    f.release(st->data, st->nbytes);
    const int64_t s_released = rss_kib();
    EXPECT_GT(s_mapped - s_released, 48 << 10) << "safetensors: RSS " << s_mapped << " KiB mapped, " << s_released << " KiB after release";
    EXPECT_EQ(touch_sum(st->data, st->nbytes), want);
    remove(gp.c_str());
    remove(sp.c_str());
}
