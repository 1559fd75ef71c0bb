// libFuzzer harness: SafetensorsFile::open on arbitrary bytes (held in a memfd, opened by its
// /proc path, as the reader maps files). An accepted file must read back: every tensor
// converted to f32 and to f64, and tensors must not overlap (checked here independently).
#include "safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

using namespace oomb;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static int fd = memfd_create("fuzz-safetensors", MFD_CLOEXEC);
    if (fd < 0) { perror("memfd_create"); abort(); }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) { perror("memfd write"); abort(); }
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    SafetensorsFile f;
    std::string err;
    if (f.open(path, &err) != GGUF_OK) {
        if (err.empty()) { fprintf(stderr, "rejected without a message\n"); abort(); }
        return 0;
    }
    std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
    for (const SafetensorsTensor& t : f.tensors()) {
        std::vector<float> v;
        std::vector<double> d;
        if (safetensors_read_f32(t, &v, &err) != GGUF_OK || safetensors_read_f64(t, &d, &err) != GGUF_OK) abort();
        if (t.nbytes) ranges.emplace_back(t.data, t.data + t.nbytes);
        if (f.find(t.name) != &t) { fprintf(stderr, "find('%s') is another tensor\n", t.name.c_str()); abort(); }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); i++)
        if (ranges[i].first < ranges[i - 1].second) { fprintf(stderr, "accepted overlapping tensors\n"); abort(); }
    return 0;
}
