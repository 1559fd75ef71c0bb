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

} // namespace oombtest
