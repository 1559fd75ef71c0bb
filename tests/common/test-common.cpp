#include "test-common.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sys/stat.h>

namespace oombtest {

static std::string env_or(const char * name, const char * fallback) {
    const char * v = getenv(name);
    return (v && *v) ? std::string(v) : std::string(fallback);
}

std::string fixtures_dir() {
    const char * v = getenv("OOMB_FIXTURES");
    if (v && *v) return v;
    return env_or("OOMB_FIXTURES_DEFAULT", OOMB_TEST_FIXTURES_DEFAULT);
}
std::string fixture_path(const std::string & rel) {
    const std::string dir = fixtures_dir();
    const std::string path = rel.empty() ? dir : dir + "/" + rel;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        const char * env = getenv("OOMB_FIXTURES");
        const std::string from = (env && *env) ? "from OOMB_FIXTURES=" + std::string(env)
                                                : "OOMB_FIXTURES is not set; default " + dir;
        throw std::runtime_error("missing test fixture " + path + " (" + strerror(errno) + "; fixtures folder " + from +
                                 "): set OOMB_FIXTURES to the folder holding the fixtures (../shared/fixtures)");
    }
    return path;
}
std::string source_dir() { return env_or("OOMB_SOURCE_DIR", OOMB_TEST_SOURCE_DIR); }
std::string bin_dir() { return env_or("OOMB_BIN_DIR", OOMB_TEST_BIN_DIR); }

static void throwing_handler(const char * msg, void *) { throw OombError(msg); }

ErrorCapture::ErrorCapture() { oomb_set_error_handler(throwing_handler, nullptr); }
ErrorCapture::~ErrorCapture() { oomb_set_error_handler(nullptr, nullptr); }

static thread_local int g_expecting_failure = 0;
ExpectingFailure::ExpectingFailure() { g_expecting_failure++; }
ExpectingFailure::~ExpectingFailure() { g_expecting_failure--; }

enum oomb_status compute_checked(oomb_backend_t backend, struct oomb_cgraph * g, const char * file, int line) {
    const enum oomb_status st = (oomb_backend_graph_compute)(backend, g);
    if (st != OOMB_STATUS_OK && g_expecting_failure == 0) {
        ADD_FAILURE_AT(file, line) << "graph_compute failed (" << oomb_status_name(st) << "): " << oomb_backend_last_error(backend);
    }
    return st;
}

void fill_uniform(oomb_tensor * t, std::mt19937 & rng, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
    for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
    for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) oomb_set_f32_nd(t, i0, i1, i2, i3, dist(rng));
}

std::vector<double> to_vector(const oomb_tensor * t) {
    std::vector<double> out;
    out.reserve((size_t) oomb_nelements(t));
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
    for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
    for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) out.push_back(oomb_get_f32_nd(t, i0, i1, i2, i3));
    return out;
}

// Byte offsets of the f16 scale / min fields of each block type (ggml-common.h).
static std::vector<size_t> scale_fields(oomb_type t) {
    switch (t) {
        case OOMB_TYPE_Q8_0: case OOMB_TYPE_Q4_0: case OOMB_TYPE_Q5_0: return {0};
        case OOMB_TYPE_Q4_1: case OOMB_TYPE_Q5_1: case OOMB_TYPE_Q4_K: case OOMB_TYPE_Q5_K: return {0, 2};
        case OOMB_TYPE_Q2_K: return {80, 82};
        case OOMB_TYPE_Q3_K: return {108};
        case OOMB_TYPE_Q6_K: return {208};
        default: return {};
    }
}

void fill_random_blocks(oomb_tensor * t, std::mt19937 & rng) {
    if (!oomb_type_is_quantized(t->type) || !oomb_is_contiguous(t)) throw std::runtime_error("fill_random_blocks: not a contiguous block-type tensor");
    const size_t bb = oomb_type_size(t->type), n_blocks = oomb_nbytes(t) / bb;
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> mag(0.01f, 0.1f);
    std::vector<uint8_t> h(oomb_nbytes(t));
    for (auto & v : h) v = (uint8_t) byte(rng);
    for (size_t b = 0; b < n_blocks; b++) {
        for (size_t off : scale_fields(t->type)) {
            const float s = mag(rng) * (byte(rng) & 1 ? 1.0f : -1.0f);
            const uint16_t f = oomb_fp32_to_fp16(s);
            memcpy(&h[b * bb + off], &f, 2);
        }
    }
    oomb_tensor_set(t, h.data(), 0, h.size());
}

std::vector<double> dequantized(const oomb_tensor * t) {
    oomb_context * c = oomb_init({0, false});
    oomb_tensor * q = oomb_new_tensor(c, t->type, 4, t->ne);
    std::vector<uint8_t> h(oomb_nbytes(t));
    oomb_tensor_get(t, h.data(), 0, h.size());
    memcpy(q->data, h.data(), h.size());
    oomb_tensor * f = oomb_cast(c, q, OOMB_TYPE_F32);
    oomb_cgraph * g = oomb_new_graph(c);
    oomb_build_forward_expand(g, f);
    oomb_backend_t be = oomb_backend_cpu_init(1);
    (oomb_backend_graph_compute)(be, g);
    std::vector<double> r = to_vector(f);
    oomb_backend_free(be);
    oomb_free(c);
    return r;
}

} // namespace oombtest
