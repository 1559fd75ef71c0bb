// libFuzzer harness: GGUFReader::open_memory on arbitrary bytes. An accepted file must then be
// fully readable: every metadata value printed, every tensor converted to f32 (supported types)
// or refused with GGUF_ERR_UNSUPPORTED. The first byte picks allow_unsupported_types.
#include "gguf.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace oomb;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    GGUFReadOptions opt;
    opt.allow_unsupported_types = size > 0 && (data[0] & 1);
    GGUFReader r;
    std::string err;
    if (r.open_memory(data, size, &err, opt) != GGUF_OK) {
        if (err.empty()) { fprintf(stderr, "rejected without a message\n"); abort(); }
        return 0;
    }
    for (auto& kv : r.metadata()) (void)kv.second.to_string();
    for (auto& t : r.tensors()) {
        std::vector<float> v((size_t)t.nelements());
        const gguf_status s = r.read_tensor(t, GGUF_TENSOR_F32, v.data(), v.size() * sizeof(float), &err);
        if (s != GGUF_OK && s != GGUF_ERR_UNSUPPORTED) { fprintf(stderr, "read_tensor: %s\n", err.c_str()); abort(); }
    }
    return 0;
}
