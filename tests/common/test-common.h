// Helpers shared by the tests: fixtures location, random data, error capture.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace oombtest {

/// Fixtures folder: $OOMB_FIXTURES, else $OOMB_FIXTURES_DEFAULT (set by CMake), else ../shared/fixtures.
std::string fixtures_dir();
/// fixtures_dir() + "/" + rel, after checking that it exists. When it does not, throws
/// std::runtime_error naming the path tried and the OOMB_FIXTURES variable (GoogleTest reports
/// the exception as the test's failure), instead of a bare "Value of: f.good()" later on.
std::string fixture_path(const std::string & rel);
/// Source tree root ($OOMB_SOURCE_DIR) and build bin folder ($OOMB_BIN_DIR).
std::string source_dir();
std::string bin_dir();

/// Thrown by the error handler that ErrorCapture installs.
struct OombError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// While alive, library errors throw OombError(message) instead of aborting.
struct ErrorCapture {
    ErrorCapture();
    ~ErrorCapture();
};

/// Fills a host f32/f16/bf16 tensor (any strides) with uniform values in [lo, hi).
void fill_uniform(oomb_tensor * t, std::mt19937 & rng, float lo = -1.0f, float hi = 1.0f);
/// Fills a host tensor of a block type (contiguous) with random blocks: random quant bits, and
/// every f16 scale / min field a finite value of magnitude in [0.01, 0.1) with a random sign.
void fill_random_blocks(oomb_tensor * t, std::mt19937 & rng);
/// Dequantized values of a host block-type tensor (contiguous), in logical order (f32 as double).
std::vector<double> dequantized(const oomb_tensor * t);
/// Reads any host float tensor (any strides) into a flat vector in logical order.
std::vector<double> to_vector(const oomb_tensor * t);

/// Environment variables for a test's scope: the named ones are saved when it is made and put back
/// (set to the saved value, or unset) when it goes, on every way out of the test; set / unset in
/// between change them (names not given to the constructor are saved on first use).
struct ScopedEnv {
    explicit ScopedEnv(std::initializer_list<const char *> names) {
        for (const char * n : names) save(n);
    }
    ~ScopedEnv() {
        for (const Saved & v : saved) {
            if (v.had) setenv(v.name.c_str(), v.value.c_str(), 1); else unsetenv(v.name.c_str());
        }
    }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv & operator=(const ScopedEnv &) = delete;
    void set(const char * name, const char * value) { save(name); setenv(name, value, 1); }
    void unset(const char * name) { save(name); unsetenv(name); }
  private:
    struct Saved {
        std::string name, value;
        bool had;
    };
    std::vector<Saved> saved;
    void save(const char * name) {
        for (const Saved & v : saved)
            if (v.name == name) return;
        const char * e = getenv(name);
        saved.push_back({name, e ? e : "", e != nullptr});
    }
};

/// While alive (inside EXPECT_OOMB_ERROR), a failed graph_compute is what the test expects.
struct ExpectingFailure {
    ExpectingFailure();
    ~ExpectingFailure();
};
/// oomb_backend_graph_compute for tests: the status is returned as usual, and a failure that no
/// EXPECT_OOMB_ERROR expects fails the running test with the backend's message, so a test can never
/// pass over a compute that went wrong because it did not look at the status.
enum oomb_status compute_checked(oomb_backend_t backend, struct oomb_cgraph * g, const char * file, int line);

} // namespace oombtest

/// EXPECT that `stmt` reports a library error whose message contains `substr`: through the error
/// handler (programming errors), or as a failed status of a graph_compute / asynchronous copy
/// inside stmt (compute-time faults; the message is oomb_last_compute_error's).
#define EXPECT_OOMB_ERROR(stmt, substr)                                                        \
    do {                                                                                       \
        oombtest::ErrorCapture _cap;                                                           \
        bool _thrown = false;                                                                  \
        uint64_t _n_fail0 = 0, _n_fail1 = 0;                                                   \
        oomb_last_compute_error(&_n_fail0);                                                    \
        oombtest::ExpectingFailure _exp;                                                       \
        try { stmt; } catch (const oombtest::OombError & e) {                                  \
            _thrown = true;                                                                    \
            EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                   \
                << "message was: " << e.what();                                                \
        }                                                                                      \
        const char * _fail_msg = oomb_last_compute_error(&_n_fail1);                           \
        if (!_thrown && _n_fail1 != _n_fail0) {                                                \
            _thrown = true;                                                                    \
            EXPECT_NE(std::string(_fail_msg).find(substr), std::string::npos)                  \
                << "status message was: " << _fail_msg;                                        \
        }                                                                                      \
        EXPECT_TRUE(_thrown) << "expected an oomb error containing '" << substr << "'";        \
    } while (0)

// Every test's graph_compute goes through oombtest::compute_checked (the parentheses in
// (oomb_backend_graph_compute)(...) call the library function itself).
#define oomb_backend_graph_compute(backend, g) oombtest::compute_checked((backend), (g), __FILE__, __LINE__)
