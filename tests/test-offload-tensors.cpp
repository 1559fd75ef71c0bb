// Host-offload tensors (oomb-offload.h, src/oomb/offload-tensors.cpp) on the CPU backend (the
// stand-in of the GPU path: the same schedule, copies and events, plain memory): a graph whose
// weights, biases and an accumulator written in place live on the host and pass through a working
// set of about two weights gives bit-identical results to the same graph with everything in
// backend memory; the accumulator's host copy holds the result; views of offloaded tensors
// follow them; the working set's peak stays within its size; a node whose offloaded tensors do not
// fit together is an error with a message. The same checks run on the GPU when there is one.
#include "test-common.h"

#include "oomb-offload.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace {

constexpr int kD = 64, kN = 33, kLayers = 6;

struct Net {
    oomb_context * ctx = nullptr;
    oomb_tensor * x = nullptr, * acc = nullptr, * out = nullptr, * side = nullptr;
    std::vector<oomb_tensor *> w, b;
    oomb_cgraph * g = nullptr;
};

// y = b5 + W5 (... (b0 + W0 x)); acc += y (in place); side = sum(W1[:, :32]^T-view product)
Net build(oomb_offload_t off) {
    Net n;
    n.ctx = oomb_init({0, true});
    n.x = oomb_new_tensor_2d(n.ctx, OOMB_TYPE_F32, kD, kN);
    n.acc = oomb_new_tensor_2d(n.ctx, OOMB_TYPE_F32, kD, kN);
    for (int k = 0; k < kLayers; k++) {
        n.w.push_back(oomb_new_tensor_2d(n.ctx, OOMB_TYPE_F32, kD, kD));
        n.b.push_back(oomb_new_tensor_2d(n.ctx, OOMB_TYPE_F32, kD, 1));
    }
    if (off) {
        for (int k = 0; k < kLayers; k++) {
            oomb_offload_add(off, n.w[(size_t) k]);
            oomb_offload_add(off, n.b[(size_t) k]);
        }
        oomb_offload_add(off, n.acc);
    }
    oomb_tensor * y = n.x;
    for (int k = 0; k < kLayers; k++) y = oomb_add(n.ctx, oomb_mul_mat(n.ctx, n.w[(size_t) k], y), n.b[(size_t) k]);
    n.out = oomb_add_inplace(n.ctx, n.acc, y);
    // a view of an offloaded weight: its first 32 rows (columns of the product)
    oomb_tensor * v = oomb_view_2d(n.ctx, n.w[1], kD, 32, n.w[1]->nb[1], 0);
    n.side = oomb_sum(n.ctx, oomb_mul_mat(n.ctx, v, y));
    n.g = oomb_new_graph(n.ctx);
    oomb_build_forward_expand(n.g, n.out);
    oomb_build_forward_expand(n.g, n.side);
    return n;
}

void fill(Net & n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.2f);
    auto put = [&](oomb_tensor * t) {
        std::vector<float> v((size_t) oomb_nelements(t));
        for (float & f : v) f = d(rng);
        oomb_tensor_set(t, v.data(), 0, v.size() * 4);
    };
    put(n.x);
    put(n.acc);
    for (int k = 0; k < kLayers; k++) {
        put(n.w[(size_t) k]);
        put(n.b[(size_t) k]);
    }
}

std::vector<float> get(const oomb_tensor * t) {
    std::vector<float> v((size_t) oomb_nelements(t));
    oomb_tensor_get(t, v.data(), 0, v.size() * 4);
    return v;
}

} // namespace

namespace {

void check_bit_identical(oomb_backend_t be) {
    Net ref = build(nullptr);
    oomb_buffer_t rb = oomb_backend_alloc_ctx_tensors(ref.ctx, be);
    fill(ref, 7);
    ASSERT_EQ(oomb_backend_graph_compute(be, ref.g), OOMB_STATUS_OK);
    const std::vector<float> acc_ref = get(ref.acc), side_ref = get(ref.side);

    const size_t wbytes = (size_t) kD * kD * 4;
    oomb_offload_t off = oomb_offload_new(be, 2 * wbytes + wbytes / 2);
    ASSERT_NE(off, nullptr);
    Net n = build(off);
    oomb_buffer_t nb = oomb_backend_alloc_ctx_tensors(n.ctx, be);  // the rest (x, the nodes)
    fill(n, 7);
    for (int rep = 0; rep < 2; rep++) {  // twice: the second run starts from the first's acc
        ASSERT_EQ(oomb_offload_graph_compute(off, n.g), OOMB_STATUS_OK) << oomb_offload_last_error(off);
        if (rep == 0) {
            EXPECT_EQ(get(n.acc), acc_ref);  // the host copy, written back
            EXPECT_EQ(get(n.side), side_ref);
        }
    }
    ASSERT_EQ(oomb_backend_graph_compute(be, ref.g), OOMB_STATUS_OK);
    EXPECT_EQ(get(n.acc), get(ref.acc));
    const oomb_offload_stats st = oomb_offload_get_stats(off);
    EXPECT_GE(st.bytes_in, 2 * kLayers * wbytes);
    EXPECT_EQ(st.bytes_out, 2 * (size_t) kD * kN * 4);  // only acc is written
    EXPECT_LE(st.peak_bytes, 2 * wbytes + wbytes / 2);
    EXPECT_GT(st.peak_bytes, wbytes);
    oomb_offload_free(off);
    oomb_buffer_free(nb);
    oomb_free(n.ctx);
    oomb_buffer_free(rb);
    oomb_free(ref.ctx);
}

} // namespace

TEST(OffloadTensors, BitIdenticalThroughASmallWorkingSet) {
    oomb_backend_t be = oomb_backend_cpu_init(2);
    check_bit_identical(be);
    oomb_backend_free(be);
}

// The same on the GPU: pinned host memory, copies on the two copy streams (skipped without a GPU).
TEST(OffloadTensors, BitIdenticalOnCuda) {
    if (!oomb_cuda_available()) GTEST_SKIP() << "no CUDA GPU";
    oomb_backend_t be = oomb_backend_cuda_init(0);
    ASSERT_NE(be, nullptr);
    check_bit_identical(be);
    oomb_backend_free(be);
}

TEST(OffloadTensors, Errors) {
    oomb_backend_t be = oomb_backend_cpu_init(1);
    const size_t wbytes = (size_t) kD * kD * 4;
    oomb_offload_t off = oomb_offload_new(be, wbytes + 512);
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, kD, kD);
    oomb_tensor * b = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, kD, kD);
    oomb_tensor * big = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, kD, 2 * kD);
    oomb_offload_add(off, a);
    oomb_offload_add(off, b);
    EXPECT_OOMB_ERROR(oomb_offload_add(off, a), "was added already");
    EXPECT_OOMB_ERROR(oomb_offload_add(off, big), "larger than the working set");
    oomb_tensor * v = oomb_view_1d(ctx, a, 8, 0);
    EXPECT_OOMB_ERROR(oomb_offload_add(off, v), "already has memory or is a view");
    // one node needs a and b at once: more than the working set
    oomb_tensor * p = oomb_mul_mat(ctx, a, b);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, p);
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(ctx, be);
    EXPECT_EQ(oomb_offload_graph_compute(off, g), OOMB_STATUS_ALLOC_FAILED);
    EXPECT_NE(std::string(oomb_offload_last_error(off)).find("needs more than the working set"), std::string::npos)
        << oomb_offload_last_error(off);
    EXPECT_EQ(a->data, oomb_buffer_base(a->buffer));  // back home on the host after the failure
    oomb_buffer_free(buf);
    oomb_offload_free(off);
    oomb_free(ctx);
    EXPECT_OOMB_ERROR(oomb_offload_new(be, 0), "must not be empty");
    oomb_backend_free(be);
}
