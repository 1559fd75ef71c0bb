// Helpers shared by the tests: fixtures location, random data, error capture.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"

#include <cstdint>
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
/// Reads any host float tensor (any strides) into a flat vector in logical order.
std::vector<double> to_vector(const oomb_tensor * t);

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
