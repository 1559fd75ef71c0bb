// libFuzzer harness: Tokenizer::encode of arbitrary bytes with the shipped Qwen2.5 vocabulary
// (models/qwen2.5-vocab.gguf, or $OOMB_FUZZ_VOCAB). Every id must be in range and decode; text
// that NFC leaves unchanged (here: pure ASCII) must round-trip exactly. The first byte picks
// parse_special.
#include "tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace oomb;

namespace {
const Tokenizer& vocab() {
    static Tokenizer t;
    static bool loaded = [] {
        const char* env = getenv("OOMB_FUZZ_VOCAB");
        std::string err;
        if (t.load_file(env && *env ? env : OOMB_FUZZ_VOCAB, &err) != GGUF_OK) {
            fprintf(stderr, "fuzz-tokenizer: %s\n", err.c_str());
            abort();
        }
        return true;
    }();
    (void)loaded;
    return t;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const Tokenizer& t = vocab();
    const bool special = size > 0 && (data[0] & 1);
    const std::string_view text((const char*)data, size);
    std::vector<int32_t> ids;
    std::string err, back;
    if (t.encode(text, &ids, &err, special) != GGUF_OK) { fprintf(stderr, "encode: %s\n", err.c_str()); abort(); }
    if (t.decode(ids.data(), ids.size(), &back, &err) != GGUF_OK) { fprintf(stderr, "decode: %s\n", err.c_str()); abort(); }
    bool ascii = true;
    for (size_t i = 0; i < size; i++) ascii = ascii && data[i] < 0x80;
    if (ascii && back != text) { fprintf(stderr, "ASCII text did not round-trip\n"); abort(); }
    return 0;
}
