// The file-format library (oomb_formats: GGUF, safetensors, tokenizer) on its own: this test links
// only oomb_formats, not liboomb, so it fails to build if a format source starts to need the
// tensor core. It exercises each reader and writer once.
#include "gguf.h"
#include "safetensors.h"
#include "tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

using namespace oomb;

namespace {
std::string tmp(const std::string& name) {
    const char* d = getenv("TMPDIR");
    return std::string(d && *d ? d : "/tmp") + "/oomb-test-formats-" + std::to_string(getpid()) + "-" + name;
}
} // namespace

TEST(FormatsStandalone, GGUFRoundTrip) {
    const std::string path = tmp("a.gguf");
    std::string err;
    GGUFWriter w;
    w.set_string("general.architecture", "test");
    ASSERT_EQ(w.add_tensor("w", GGUF_TENSOR_F32, {3, 2}, &err), GGUF_OK) << err;
    ASSERT_EQ(w.open(path, &err), GGUF_OK) << err;
    const float v[6] = {1, -2, 3.5f, 0.25f, 5, -6};
    ASSERT_EQ(w.write_tensor("w", v, sizeof v, &err), GGUF_OK) << err;
    ASSERT_EQ(w.finish(&err), GGUF_OK) << err;
    GGUFReader r;
    ASSERT_EQ(r.open(path, &err), GGUF_OK) << err;
    std::vector<float> back;
    ASSERT_EQ(r.read_tensor_f32("w", &back, &err), GGUF_OK) << err;
    EXPECT_EQ(back, std::vector<float>(v, v + 6));
    unlink(path.c_str());
}

TEST(FormatsStandalone, SafetensorsRoundTrip) {
    const std::string path = tmp("a.safetensors");
    std::string err;
    SafetensorsWriter w;
    const float v[4] = {1, 2, 3, 4};
    ASSERT_EQ(w.add("x", SafetensorsDtype::F32, {2, 2}, v, &err), GGUF_OK) << err;
    ASSERT_EQ(w.write(path, &err), GGUF_OK) << err;
    SafetensorsFile f;
    ASSERT_EQ(f.open(path, &err), GGUF_OK) << err;
    std::vector<float> back;
    ASSERT_EQ(safetensors_read_f32(*f.find("x"), &back, &err), GGUF_OK) << err;
    EXPECT_EQ(back, std::vector<float>(v, v + 4));
    unlink(path.c_str());
}

TEST(FormatsStandalone, TokenizerOfTheShippedVocab) {
    Tokenizer t;
    std::string err;
    ASSERT_EQ(t.load_file(std::string(OOMB_TEST_SOURCE_DIR) + "/models/qwen2.5-vocab.gguf", &err), GGUF_OK) << err;
    EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
    EXPECT_EQ(t.decode(t.encode("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87")), "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87");
}
