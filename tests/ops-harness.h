// The harness of the CPU op tests against double-precision references (test-ops.cpp, test-ops-loss.cpp): the
// Ops fixture (a context per test, a 3-thread backend that splits even tiny ops, a 1-thread one, random
// tensors, positions and ids), rel_err and 4-D logical indexing (A4). Each test file is its own binary: the
// anonymous namespace below is per binary.
#pragma once
#include "test-common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace {

using oombtest::fill_uniform;
using oombtest::to_vector;
using vec = std::vector<double>;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

oomb_backend_t g_cpu  = nullptr; // 3 threads
oomb_backend_t g_cpu1 = nullptr; // 1 thread

class Ops : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        // split even tiny ops over the 3 threads, so every kernel's threaded path runs
        setenv("OOMB_CPU_MIN_PARALLEL_WORK", "1", 1);
        if (!g_cpu) g_cpu = oomb_backend_cpu_init(3);
        unsetenv("OOMB_CPU_MIN_PARALLEL_WORK");
        if (!g_cpu1) g_cpu1 = oomb_backend_cpu_init(1);
    }
    void SetUp() override { ctx = oomb_init({0, false}); }
    void TearDown() override { oomb_free(ctx); }

    oomb_tensor * rnd(oomb_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1, float lo = -1.0f, float hi = 1.0f) {
        oomb_tensor * t = oomb_new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3);
        fill_uniform(t, rng, lo, hi);
        return t;
    }
    // T token positions: 0, then uniform in [0, pmax]
    std::vector<int32_t> rand_pos(int64_t T, int pmax) {
        std::vector<int32_t> p;
        std::uniform_int_distribution<int> d(0, pmax);
        for (int64_t t = 0; t < T; t++) p.push_back(t == 0 ? 0 : d(rng));
        return p;
    }
    oomb_tensor * ids(const std::vector<int32_t> & v, int64_t ne0, int64_t ne1 = 1) {
        oomb_tensor * t = oomb_new_tensor_2d(ctx, OOMB_TYPE_I32, ne0, ne1);
        for (size_t i = 0; i < v.size(); i++) oomb_set_i32_1d(t, (int64_t) i, v[i]);
        return t;
    }
    void compute(oomb_tensor * t, oomb_backend_t be = nullptr) {
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, t);
        oomb_backend_graph_compute(be ? be : g_cpu, g);
    }

    oomb_context * ctx = nullptr;
    std::mt19937 rng{1234};
};

double rel_err(const vec & out, const vec & ref) {
    EXPECT_EQ(out.size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size() && i < ref.size(); i++) {
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    if (den == 0) return std::sqrt(num);
    return std::sqrt(num / den);
}

// Logical-order values of t with 4-D indexing.
struct A4 {
    vec v;
    int64_t ne[4];
    explicit A4(const oomb_tensor * t) : v(to_vector(t)) { for (int i = 0; i < 4; i++) ne[i] = t->ne[i]; }
    A4(int64_t n0, int64_t n1, int64_t n2, int64_t n3) : v((size_t) (n0 * n1 * n2 * n3), 0.0), ne{n0, n1, n2, n3} {}
    double & operator()(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
        return v[(size_t) (((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0)];
    }
};

#define EXPECT_REL(out, ref, tol) EXPECT_LT(rel_err(out, ref), tol)
} // namespace
