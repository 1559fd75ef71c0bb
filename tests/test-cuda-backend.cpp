// Backend interface v2 on CUDA: pinned host buffers, asynchronous copies on the copy stream ordered
// with events against kernels on the compute stream (compared with the CPU backend on random data),
// device <-> device copies, and faults of a copy as a status. Without a CUDA build or a GPU every
// test is skipped with a visible SKIPPED line.

#include <gtest/gtest.h>

#include "test-common.h"
#include "oomb-alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef OOMB_USE_CUDA
// test hook (cuda/backend-cuda.cu): the next asynchronous copy fails as if CUDA returned cuda_error
void oomb_cuda_debug_fail_next_copy(oomb_backend_t backend, int cuda_error);
// test hook (cuda/backend-cuda.cu): add_inplace nodes fused into their products so far
int64_t oomb_cuda_debug_fused_count(oomb_backend_t backend);
// of them, add nodes the allocator placed in their first operand's bytes
int64_t oomb_cuda_debug_fused_add_count(oomb_backend_t backend);
// products that wrote their add's result through cuBLASLt's epilogue (fuse_epilogues)
int64_t oomb_cuda_debug_fused_epi_count(oomb_backend_t backend);
#endif

namespace {

struct CudaBackend : ::testing::Test {
    void SetUp() override {
        if (!oomb_cuda_available()) {
            printf("SKIPPED: no CUDA GPU (or a build without CUDA)\n");
            GTEST_SKIP() << "no CUDA GPU";
        }
        cu = oomb_backend_cuda_init(0);
        ASSERT_NE(cu, nullptr);
        cpu = oomb_backend_cpu_init(2);
    }
    void TearDown() override {
        oomb_backend_free(cu);
        oomb_backend_free(cpu);
    }
    oomb_backend_t cu = nullptr, cpu = nullptr;
};

std::vector<float> random_floats(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    std::vector<float> v(n);
    for (auto & x : v) x = d(rng);
    return v;
}

// y = silu(x) * x + scale(x, 0.5): three kernels, each reading x
oomb_tensor * build(oomb_context * ctx, oomb_tensor * x) {
    oomb_tensor * y = oomb_add(ctx, oomb_mul(ctx, oomb_silu(ctx, x), x), oomb_scale(ctx, x, 0.5f));
    oomb_set_name(y, "y");
    return y;
}

} // namespace

TEST_F(CudaBackend, PinnedHostBuffer) {
    oomb_buffer_type_t host = oomb_backend_host_buffer_type(cu), dev = oomb_backend_buffer_type(cu);
    EXPECT_STREQ(oomb_buffer_type_name(host), "CUDA_Host");
    EXPECT_STREQ(oomb_buffer_type_name(dev), "CUDA0");
    EXPECT_TRUE(oomb_buffer_type_is_host(host));
    EXPECT_FALSE(oomb_buffer_type_is_host(dev));
    EXPECT_EQ(oomb_buffer_type_alignment(host), 256u);
    const size_t p0 = oomb_pinned_host_bytes();
    const size_t size = 3 * 1000 * 1000 + 17;
    oomb_buffer_t hb = oomb_buffer_type_alloc(host, size);
    ASSERT_NE(hb, nullptr);
    EXPECT_TRUE(oomb_buffer_is_host(hb));
    EXPECT_EQ(oomb_pinned_host_bytes(), p0 + size);
    oomb_buffer_t db = oomb_buffer_type_alloc(dev, size);
    ASSERT_NE(db, nullptr);
    EXPECT_FALSE(oomb_buffer_is_host(db));
    EXPECT_EQ(oomb_pinned_host_bytes(), p0 + size) << "device memory is not pinned host memory";
    // a tensor in pinned memory is a host tensor
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * t = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 1001);
    oomb_tensor_alloc(hb, t, 256);
    oomb_set_f32_1d(t, 1000, 2.25f);
    EXPECT_EQ(oomb_get_f32_1d(t, 1000), 2.25f);
    float v = 0.0f;
    oomb_tensor_get(t, &v, 1000 * sizeof(float), sizeof(float));
    EXPECT_EQ(v, 2.25f);
    oomb_free(ctx);
    oomb_buffer_free(db);
    oomb_buffer_free(hb);
    EXPECT_EQ(oomb_pinned_host_bytes(), p0);
}

TEST_F(CudaBackend, AsyncCopiesOrderedWithEvents) {
    const int64_t n0 = 4099, n1 = 37;   // not multiples of anything
    const size_t n = (size_t) (n0 * n1);
    const auto xs = random_floats(n, 11);

    // CPU reference
    oomb_context * cctx = oomb_init({0, false});
    oomb_tensor * xc = oomb_new_tensor_2d(cctx, OOMB_TYPE_F32, n0, n1);
    memcpy(xc->data, xs.data(), n * sizeof(float));
    oomb_tensor * yc = build(cctx, xc);
    oomb_cgraph * gc = oomb_new_graph(cctx);
    oomb_build_forward_expand(gc, yc);
    ASSERT_EQ(oomb_backend_graph_compute(cpu, gc), OOMB_STATUS_OK);
    std::vector<float> ref(n);
    oomb_tensor_get(yc, ref.data(), 0, n * sizeof(float));

    // device tensors (x, the graph's results, z) and pinned host tensors (x_h, y_h)
    oomb_context * dctx = oomb_init({0, true});
    oomb_tensor * x = oomb_new_tensor_2d(dctx, OOMB_TYPE_F32, n0, n1);
    oomb_set_name(x, "x");
    oomb_tensor * y = build(dctx, x);
    oomb_tensor * z = oomb_new_tensor_2d(dctx, OOMB_TYPE_F32, n0, n1);
    oomb_set_name(z, "z");
    oomb_cgraph * g = oomb_new_graph(dctx);
    oomb_build_forward_expand(g, y);
    oomb_buffer_t dbuf = oomb_backend_alloc_ctx_tensors(dctx, cu);
    ASSERT_NE(dbuf, nullptr);
    oomb_context * hctx = oomb_init({0, true});
    oomb_tensor * xh = oomb_new_tensor_2d(hctx, OOMB_TYPE_F32, n0, n1);
    oomb_tensor * yh = oomb_new_tensor_2d(hctx, OOMB_TYPE_F32, n0, n1);
    oomb_set_name(xh, "x_h");
    oomb_set_name(yh, "y_h");
    oomb_buffer_t hbuf = oomb_buffer_type_alloc(oomb_backend_host_buffer_type(cu), 2 * oomb_nbytes(xh));
    ASSERT_NE(hbuf, nullptr);
    oomb_tensor_alloc(hbuf, xh, 0);
    oomb_tensor_alloc(hbuf, yh, oomb_nbytes(xh));

    oomb_event_t ev_in = oomb_event_new(cu), ev_done = oomb_event_new(cu);
    ASSERT_NE(ev_in, nullptr);
    ASSERT_NE(ev_done, nullptr);
    for (int rep = 0; rep < 3; rep++) {
        SCOPED_TRACE(rep);
        // poison: NaN everywhere, so a kernel that ran before the upload (or a download before the
        // kernels) shows
        oomb_tensor_memset(x, 0xff);
        oomb_tensor_memset(y, 0xff);
        oomb_tensor_memset(z, 0xff);
        ASSERT_EQ(oomb_backend_queue_synchronize(cu, OOMB_QUEUE_COMPUTE), OOMB_STATUS_OK);
        memcpy(xh->data, xs.data(), n * sizeof(float));
        memset(yh->data, 0xff, n * sizeof(float));

        // copy in on the copy stream; the compute stream waits for it; copy out waits for the kernels
        ASSERT_EQ(oomb_tensor_copy_async(cu, OOMB_QUEUE_COPY, xh, x), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_event_record(ev_in, OOMB_QUEUE_COPY), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_event_wait(cu, OOMB_QUEUE_COMPUTE, ev_in), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_backend_graph_compute(cu, g), OOMB_STATUS_OK) << oomb_backend_last_error(cu);
        ASSERT_EQ(oomb_event_record(ev_done, OOMB_QUEUE_COMPUTE), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_event_wait(cu, OOMB_QUEUE_COPY, ev_done), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_tensor_copy_async(cu, OOMB_QUEUE_COPY, y, yh), OOMB_STATUS_OK);   // device -> pinned
        ASSERT_EQ(oomb_tensor_copy_async(cu, OOMB_QUEUE_COPY, y, z), OOMB_STATUS_OK);    // device -> device
        std::vector<float> zs(n, 0.0f);
        ASSERT_EQ(oomb_tensor_get_async(cu, OOMB_QUEUE_COPY, z, zs.data(), 0, n * sizeof(float)), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_event_record(ev_done, OOMB_QUEUE_COPY), OOMB_STATUS_OK);
        ASSERT_EQ(oomb_event_synchronize(ev_done), OOMB_STATUS_OK);
        EXPECT_TRUE(oomb_event_query(ev_done));

        const float * yv = (const float *) yh->data;
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            const float tol = 1e-5f * (1.0f + std::fabs(ref[i]));
            if (!(std::fabs(yv[i] - ref[i]) <= tol) || !(std::fabs(zs[i] - ref[i]) <= tol)) {
                if (bad++ < 5) ADD_FAILURE() << "i " << i << ": y_h " << yv[i] << ", z " << zs[i] << ", CPU " << ref[i];
            }
        }
        EXPECT_EQ(bad, 0);
    }

    // set_async from pinned memory at an offset, then a synchronous read on the compute stream after
    // the compute stream waited for the copy
    const size_t off = 7 * n0 * sizeof(float), len = 3 * n0 * sizeof(float) + 12;
    ASSERT_EQ(oomb_tensor_set_async(cu, OOMB_QUEUE_COPY, z, (const char *) xh->data + off, off, len), OOMB_STATUS_OK);
    ASSERT_EQ(oomb_event_record(ev_in, OOMB_QUEUE_COPY), OOMB_STATUS_OK);
    ASSERT_EQ(oomb_event_wait(cu, OOMB_QUEUE_COMPUTE, ev_in), OOMB_STATUS_OK);
    std::vector<char> back(len);
    oomb_tensor_get(z, back.data(), off, len);
    EXPECT_EQ(0, memcmp(back.data(), (const char *) xh->data + off, len));

    oomb_event_free(ev_in);
    oomb_event_free(ev_done);
    oomb_buffer_free(hbuf);
    oomb_buffer_free(dbuf);
    oomb_free(hctx);
    oomb_free(dctx);
    oomb_free(cctx);
}

TEST_F(CudaBackend, CopyErrorsAndFaults) {
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 1001);
    oomb_set_name(a, "a");
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(ctx, cu);
    ASSERT_NE(buf, nullptr);
    const auto src = random_floats(1001, 5);

    // misuse: the handler, naming the tensors
    EXPECT_OOMB_ERROR(oomb_tensor_set_async(cu, OOMB_QUEUE_COPY, a, src.data(), 8, 1001 * sizeof(float)), "out of 'a'");
    oomb_backend_t cu2 = oomb_backend_cuda_init(0);
    ASSERT_NE(cu2, nullptr);
    EXPECT_OOMB_ERROR(oomb_tensor_set_async(cu2, OOMB_QUEUE_COPY, a, src.data(), 0, 4), "'a' [1001, 1, 1, 1] f32 is in a buffer of another backend");
    oomb_backend_free(cu2);

#ifdef OOMB_USE_CUDA
    // a fault of the copy itself: a status, not an abort (the handler would throw here)
    {
        oombtest::ErrorCapture cap;
        oomb_cuda_debug_fail_next_copy(cu, 1 /* cudaErrorInvalidValue */);
        oomb_status st = OOMB_STATUS_OK;
        EXPECT_NO_THROW(st = oomb_tensor_set_async(cu, OOMB_QUEUE_COPY, a, src.data(), 0, 1001 * sizeof(float)));
        EXPECT_EQ(st, OOMB_STATUS_DEVICE_ERROR);
        const std::string msg = oomb_backend_last_error(cu);
        EXPECT_NE(msg.find("tensor_set_async: cuda: cudaMemcpyAsync (injected"), std::string::npos) << msg;
    }
#endif
    // the backend still works
    ASSERT_EQ(oomb_tensor_set_async(cu, OOMB_QUEUE_COPY, a, src.data(), 0, 1001 * sizeof(float)), OOMB_STATUS_OK);
    EXPECT_STREQ(oomb_backend_last_error(cu), "");
    ASSERT_EQ(oomb_backend_queue_synchronize(cu, OOMB_QUEUE_COPY), OOMB_STATUS_OK);
    std::vector<float> out(1001);
    oomb_tensor_get(a, out.data(), 0, 1001 * sizeof(float));
    EXPECT_EQ(out, src);
    oomb_buffer_free(buf);
    oomb_free(ctx);
}

TEST_F(CudaBackend, ComputeFaultIsAStatus) {
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 5, 3);
    oomb_tensor * ids = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, 4);
    oomb_set_name(ids, "ids");
    oomb_tensor * r = oomb_get_rows(ctx, a, ids);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, r);
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(ctx, cu);
    ASSERT_NE(buf, nullptr);
    const auto av = random_floats(15, 9);
    oomb_tensor_set(a, av.data(), 0, sizeof(float) * 15);
    const int32_t bad_ids[4] = {0, 2, 7, 1};
    oomb_tensor_set(ids, bad_ids, 0, sizeof(bad_ids));
    {
        oombtest::ErrorCapture cap;
        oomb_status st = OOMB_STATUS_OK;
        EXPECT_NO_THROW(st = (oomb_backend_graph_compute)(cu, g));
        EXPECT_EQ(st, OOMB_STATUS_FAILED);
    }
    const std::string msg = oomb_backend_last_error(cu);
    EXPECT_NE(msg.find("node 0 (get_rows"), std::string::npos) << msg;
    EXPECT_NE(msg.find("id 7 at position 2"), std::string::npos) << msg;
    const int32_t ok_ids[4] = {0, 2, 2, 1};
    oomb_tensor_set(ids, ok_ids, 0, sizeof(ok_ids));
    ASSERT_EQ(oomb_backend_graph_compute(cu, g), OOMB_STATUS_OK) << oomb_backend_last_error(cu);
    std::vector<float> out(20);
    oomb_tensor_get(r, out.data(), 0, sizeof(float) * 20);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 5; i++) EXPECT_EQ(out[(size_t) (k * 5 + i)], av[(size_t) (ok_ids[k] * 5 + i)]);
    oomb_buffer_free(buf);
    oomb_free(ctx);
}

// oomb_backend_profile_reset: false without OOMB_CUDA_PROFILE; with it, the profile printed when the backend is
// freed covers only the graphs computed after the last reset (the graph below: 3 computes, a reset, 1 compute, so
// each of its ops shows 1 call) and says so.
TEST_F(CudaBackend, ProfileReset) {
    const char * old = getenv("OOMB_CUDA_PROFILE");
    if (!old || atoi(old) == 0) EXPECT_FALSE(oomb_backend_profile_reset(cu));  // the fixture's backend does not profile
    const std::string saved = old ? old : "";
    {  // a value that is not a number: said on stderr, read as 0 (no profile), the backend still made
        oombtest::ScopedEnv env({"OOMB_CUDA_PROFILE"});  // put back on every way out
        env.set("OOMB_CUDA_PROFILE", "1x");
        ::testing::internal::CaptureStderr();
        oomb_backend_t nb = oomb_backend_cuda_init(0);
        const std::string said = ::testing::internal::GetCapturedStderr();
        ASSERT_NE(nb, nullptr);
        EXPECT_NE(said.find("OOMB_CUDA_PROFILE=1x is not a number"), std::string::npos) << said;
        EXPECT_FALSE(oomb_backend_profile_reset(nb));
        oomb_backend_free(nb);
    }
    setenv("OOMB_CUDA_PROFILE", "1", 1);
    oomb_backend_t pb = oomb_backend_cuda_init(0);
    if (old) setenv("OOMB_CUDA_PROFILE", saved.c_str(), 1);
    else unsetenv("OOMB_CUDA_PROFILE");
    ASSERT_NE(pb, nullptr);
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * x = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 1000);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, build(ctx, x));
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(ctx, pb);
    ASSERT_NE(buf, nullptr);
    const auto xv = random_floats(1000, 3);
    oomb_tensor_set(x, xv.data(), 0, sizeof(float) * xv.size());
    for (int i = 0; i < 3; i++) ASSERT_EQ(oomb_backend_graph_compute(pb, g), OOMB_STATUS_OK) << oomb_backend_last_error(pb);
    EXPECT_TRUE(oomb_backend_profile_reset(pb));
    ASSERT_EQ(oomb_backend_graph_compute(pb, g), OOMB_STATUS_OK) << oomb_backend_last_error(pb);
    oomb_buffer_free(buf);
    oomb_free(ctx);
    ::testing::internal::CaptureStderr();
    oomb_backend_free(pb);
    const std::string prof = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(prof.find("since the last oomb_backend_profile_reset"), std::string::npos) << prof;
    for (const char * op : {"silu", "mul", "scale", "add"}) {
        // "  <op padded to 24> <ms> ms <pct>% <calls> calls"
        const std::string key = "  " + std::string(op) + std::string(24 - strlen(op), ' ');
        const size_t at = prof.find(key);
        ASSERT_NE(at, std::string::npos) << op << " missing in\n" << prof;
        const std::string line = prof.substr(at, prof.find('\n', at) - at);
        EXPECT_NE(line.find(" 1 calls"), std::string::npos) << line;
    }
}

// The fused accumulation (cuda/backend-cuda.cu, fuse_accumulations; on by default, OOMB_CUDA_FUSE=0
// turns it off): C += mul_mat(a, b) as one GEMM with beta = 1 when the product is an arena tensor that only
// the add_inplace reads. C against C0 + reps x a b computed on the host in double (bf16 operands on
// the GPU: 1e-2 of the largest value), odd sizes, and the number of fused nodes. Cases: fused; the
// same graph computed twice (C0 + 2 a b, two fusions); not fused, and still right: a product with a
// second reader, a product flagged as an output (its own value read back too), a part of a graph
// (oomb_graph_view), a node writing C between the product and the add (C scaled by 2 first), C
// sharing a's bytes (square shapes, C a view of a), and turned off (OOMB_CUDA_FUSE=0).
TEST_F(CudaBackend, FusedAccumulationIntoProducts) {
#ifdef OOMB_USE_CUDA
    const int K = 45, M = 45, N = 29;  // K == M: a [K, M] and C [M, N] can share memory (the alias case)
    struct FuseEnv {  // the default (unset) or OOMB_CUDA_FUSE=0 for a case, unset on every way out
        explicit FuseEnv(bool on) { if (on) unsetenv("OOMB_CUDA_FUSE"); else setenv("OOMB_CUDA_FUSE", "0", 1); }
        ~FuseEnv() { unsetenv("OOMB_CUDA_FUSE"); }
    };
    const auto av = random_floats((size_t) K * M, 11), bv = random_floats((size_t) K * N, 12), cv = random_floats((size_t) M * N, 13);
    enum Mode { FUSED, TWICE, SECOND_READER, OUTPUT, GRAPH_PART, C_WRITTEN_BETWEEN, C_ALIASES_A, TURNED_OFF, N_MODES };
    const char * names[] = {"fused", "computed twice", "second reader", "output", "graph part", "C written between", "C aliases a",
                            "turned off"};
    for (int mode = 0; mode < N_MODES; mode++) {
        SCOPED_TRACE(names[mode]);
        FuseEnv env(mode != TURNED_OFF);
        oomb_context * pc = oomb_init({0, true});
        // C_ALIASES_A: a [K, M] and C [M, N] views of one [K * M] block (a's first M * N values are C's)
        oomb_tensor * blk = oomb_new_tensor_1d(pc, OOMB_TYPE_F32, (int64_t) K * M + M * N);
        oomb_tensor * a = oomb_view_2d(pc, blk, K, M, (size_t) K * 4, 0);
        oomb_tensor * b = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, N);
        oomb_tensor * C = mode == C_ALIASES_A ? oomb_view_2d(pc, blk, M, N, (size_t) M * 4, 0)
                                              : oomb_view_2d(pc, blk, M, N, (size_t) M * 4, (size_t) K * M * 4);
        oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(pc, cu);
        ASSERT_NE(buf, nullptr);
        oomb_tensor_set(b, bv.data(), 0, bv.size() * 4);
        oomb_tensor_set(a, av.data(), 0, av.size() * 4);
        std::vector<float> a_now = av, c0 = cv;
        if (mode == C_ALIASES_A) std::copy(av.begin(), av.begin() + (size_t) M * N, c0.begin());  // C is a's first values
        else oomb_tensor_set(C, cv.data(), 0, cv.size() * 4);
        oomb_context * gc = oomb_init({0, true});
        oomb_tensor * prod = oomb_mul_mat(gc, a, b);
        oomb_cgraph * g = oomb_new_graph(gc);
        oomb_tensor * other = nullptr;
        if (mode == SECOND_READER) {
            other = oomb_scale(gc, prod, 2.0f);
            oomb_set_output(other);
            oomb_build_forward_expand(g, other);
        }
        if (mode == OUTPUT) oomb_set_output(prod);
        oomb_build_forward_expand(g, prod);
        oomb_tensor * target = C;
        if (mode == C_WRITTEN_BETWEEN) {
            // C *= 2 in place (a view of C written by scale), after the product, before the add
            oomb_tensor * c2 = oomb_cpy(gc, oomb_scale(gc, C, 2.0f), C);
            oomb_build_forward_expand(g, c2);
            target = c2;
        }
        oomb_tensor * upd = oomb_add_inplace(gc, target, prod);
        oomb_build_forward_expand(g, upd);
        oomb_build_forward_expand(g, oomb_scale(gc, b, 1.0f));  // the last node is pinned: not the product
        oomb_gallocr_t ga = oomb_gallocr_new(cu);
        const bool placed = oomb_gallocr_alloc_graph(ga, g);
        const int reps = mode == TWICE ? 2 : 1;
        const int64_t before = oomb_cuda_debug_fused_count(cu);
        oomb_cgraph * run = mode == GRAPH_PART ? oomb_graph_view(gc, g, 0, oomb_graph_n_nodes(g)) : g;
        bool ok = placed;
        for (int r = 0; r < reps && ok; r++) {
            const oomb_status st = oomb_backend_graph_compute(cu, run);
            EXPECT_EQ(st, OOMB_STATUS_OK) << oomb_backend_last_error(cu);
            ok = st == OOMB_STATUS_OK;
        }
        EXPECT_TRUE(placed);
        if (ok) {
            EXPECT_EQ(oomb_cuda_debug_fused_count(cu) - before, mode == FUSED ? 1 : mode == TWICE ? 2 : 0);
            std::vector<double> want((size_t) M * N);
            double mx = 0;
            for (int nn = 0; nn < N; nn++)
                for (int m = 0; m < M; m++) {
                    double p = 0;
                    for (int k = 0; k < K; k++) p += (double) a_now[(size_t) m * K + k] * bv[(size_t) nn * K + k];
                    const size_t i = (size_t) nn * M + m;
                    want[i] = (mode == C_WRITTEN_BETWEEN ? 2.0 : 1.0) * c0[i] + reps * p;
                    mx = std::max(mx, std::fabs(want[i]));
                }
            std::vector<float> got((size_t) M * N);
            oomb_tensor_get(C, got.data(), 0, got.size() * 4);
            double err = 0;
            for (size_t i = 0; i < got.size(); i++) err = std::max(err, std::fabs(got[i] - want[i]));
            EXPECT_LT(err, 1e-2 * mx) << "C: largest error " << err << " of " << mx;
            if (mode == SECOND_READER || mode == OUTPUT) {
                std::vector<float> pv((size_t) M * N);
                oomb_tensor_get(mode == SECOND_READER ? other : prod, pv.data(), 0, pv.size() * 4);
                double perr = 0;
                for (size_t i = 0; i < pv.size(); i++)
                    perr = std::max(perr, std::fabs(pv[i] - (mode == SECOND_READER ? 2.0 : 1.0) * (want[i] - c0[i])));
                EXPECT_LT(perr, 2e-2 * mx) << "the product";
            }
        }
        oomb_gallocr_free(ga);
        oomb_free(gc);
        oomb_buffer_free(buf);
        oomb_free(pc);
    }
#endif
}

// The fused in-place sum (cuda/backend-cuda.cu, fuse_accumulations; OOMB_CUDA_FUSE_ADD=0 turns it off):
// s = add(C, M) with M a product read only by s, and s placed by the allocator in C's bytes (C dead
// after s), runs as M's GEMM with beta = 1 into C. The sums against the host in double (bf16 operands:
// 1e-2 of the largest value), odd sizes, and the number of fused adds. Cases: a chain of three products
// (two fusions, as the autodiff sums dX of Q, K, V); C read by a node between M and s (not fused: it
// must see C alone); C read after s (no in-place placement, not fused); C a tensor of its own buffer
// (a graph input: not placed in place); M read twice; turned off.
TEST_F(CudaBackend, FusedSumIntoProducts) {
#ifdef OOMB_USE_CUDA
    const int K = 37, M = 45, N = 29;
    const auto a1v = random_floats((size_t) K * M, 21), a2v = random_floats((size_t) K * M, 22), a3v = random_floats((size_t) K * M, 23);
    const auto bv = random_floats((size_t) K * N, 24), xv = random_floats((size_t) M * N, 25);
    enum Mode { CHAIN, C_READ_BETWEEN, C_READ_AFTER, C_INPUT, M_READ_TWICE, TURNED_OFF, N_MODES };
    const char * names[] = {"chain of three", "C read between", "C read after", "C a graph input", "M read twice", "turned off"};
    auto prod = [&](const std::vector<float> & a, int m, int nn) {
        double p = 0;
        for (int k = 0; k < K; k++) p += (double) a[(size_t) m * K + k] * bv[(size_t) nn * K + k];
        return p;
    };
    struct AddEnv {  // OOMB_CUDA_FUSE_ADD=0 for a case, unset on every way out
        explicit AddEnv(bool on) { if (on) unsetenv("OOMB_CUDA_FUSE_ADD"); else setenv("OOMB_CUDA_FUSE_ADD", "0", 1); }
        ~AddEnv() { unsetenv("OOMB_CUDA_FUSE_ADD"); }
    };
    for (int mode = 0; mode < N_MODES; mode++) {
        SCOPED_TRACE(names[mode]);
        AddEnv env(mode != TURNED_OFF);
        oomb_context * pc = oomb_init({0, true});
        oomb_tensor * a1 = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, M), * a2 = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, M);
        oomb_tensor * a3 = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, M), * b = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, N);
        oomb_tensor * x = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, M, N);
        oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(pc, cu);
        ASSERT_NE(buf, nullptr);
        oomb_tensor_set(a1, a1v.data(), 0, a1v.size() * 4);
        oomb_tensor_set(a2, a2v.data(), 0, a2v.size() * 4);
        oomb_tensor_set(a3, a3v.data(), 0, a3v.size() * 4);
        oomb_tensor_set(b, bv.data(), 0, bv.size() * 4);
        oomb_tensor_set(x, xv.data(), 0, xv.size() * 4);
        oomb_context * gc = oomb_init({0, true});
        oomb_cgraph * g = oomb_new_graph(gc);
        oomb_tensor * p1 = mode == C_INPUT ? x : oomb_mul_mat(gc, a1, b);
        oomb_tensor * p2 = oomb_mul_mat(gc, a2, b);
        oomb_build_forward_expand(g, p1);
        oomb_build_forward_expand(g, p2);
        oomb_tensor * side = nullptr;  // a second reader: of C between (scale), of C after, or of M
        if (mode == C_READ_BETWEEN) side = oomb_scale(gc, p1, 2.0f);
        if (mode == M_READ_TWICE) side = oomb_scale(gc, p2, 2.0f);
        if (side) {
            oomb_set_output(side);
            oomb_build_forward_expand(g, side);
        }
        oomb_tensor * sum = oomb_add(gc, p1, p2);
        if (mode == CHAIN) sum = oomb_add(gc, sum, oomb_mul_mat(gc, a3, b));
        oomb_tensor * out = oomb_scale(gc, sum, 1.0f);
        oomb_set_output(out);
        oomb_build_forward_expand(g, out);
        if (mode == C_READ_AFTER) {
            side = oomb_scale(gc, p1, 2.0f);
            oomb_set_output(side);
            oomb_build_forward_expand(g, side);
        }
        oomb_gallocr_t ga = oomb_gallocr_new(cu);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
        const int64_t before = oomb_cuda_debug_fused_add_count(cu);
        const oomb_status st = oomb_backend_graph_compute(cu, g);
        ASSERT_EQ(st, OOMB_STATUS_OK) << oomb_backend_last_error(cu);
        EXPECT_EQ(oomb_cuda_debug_fused_add_count(cu) - before, mode == CHAIN ? 2 : 0);
        std::vector<double> want((size_t) M * N), want_side((size_t) M * N);
        double mx = 0;
        for (int nn = 0; nn < N; nn++)
            for (int m = 0; m < M; m++) {
                const size_t i = (size_t) nn * M + m;
                const double c = mode == C_INPUT ? (double) xv[i] : prod(a1v, m, nn), p = prod(a2v, m, nn);
                want[i] = c + p + (mode == CHAIN ? prod(a3v, m, nn) : 0.0);
                want_side[i] = 2.0 * (mode == M_READ_TWICE ? p : c);
                mx = std::max(mx, std::fabs(want[i]));
            }
        std::vector<float> got((size_t) M * N);
        oomb_tensor_get(out, got.data(), 0, got.size() * 4);
        double err = 0;
        for (size_t i = 0; i < got.size(); i++) err = std::max(err, std::fabs(got[i] - want[i]));
        EXPECT_LT(err, 1e-2 * mx) << "the sum: largest error " << err << " of " << mx;
        if (side) {
            oomb_tensor_get(side, got.data(), 0, got.size() * 4);
            double serr = 0;
            for (size_t i = 0; i < got.size(); i++) serr = std::max(serr, std::fabs(got[i] - want_side[i]));
            EXPECT_LT(serr, 2e-2 * mx) << "the second reader";
        }
        if (mode == C_INPUT) {  // the input itself is unchanged
            oomb_tensor_get(x, got.data(), 0, got.size() * 4);
            for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], xv[i]);
        }
        oomb_gallocr_free(ga);
        oomb_free(gc);
        oomb_buffer_free(buf);
        oomb_free(pc);
    }
#endif
}

// out = scale(bias_form ? mul_mat(a, b) + bias : x + mul_mat(a, b), 1) on backend be, a [K, M], b [K, N], x [M, N],
// bias [M] set from the given values (the shapes of the epilogue cases below): built, allocated and freed in one place.
struct EpiGraph {
    oomb_context * pc = nullptr, * gc = nullptr;
    oomb_buffer_t buf = nullptr;
    oomb_gallocr_t ga = nullptr;
    oomb_cgraph * g = nullptr;
    oomb_tensor * out = nullptr;
    // false (with a gtest failure) where the buffers or the graph's allocation fail
    bool build(oomb_backend_t be, int K, int M, int N, const std::vector<float> & av, const std::vector<float> & bv,
               const std::vector<float> & xv, const std::vector<float> & biasv, bool bias_form) {
        pc = oomb_init({0, true});
        oomb_tensor * a = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, M), * b = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, N);
        oomb_tensor * x = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, M, N), * bias = oomb_new_tensor_1d(pc, OOMB_TYPE_F32, M);
        buf = oomb_backend_alloc_ctx_tensors(pc, be);
        EXPECT_NE(buf, nullptr);
        if (!buf) return false;
        oomb_tensor_set(a, av.data(), 0, av.size() * 4);
        oomb_tensor_set(b, bv.data(), 0, bv.size() * 4);
        oomb_tensor_set(x, xv.data(), 0, xv.size() * 4);
        oomb_tensor_set(bias, biasv.data(), 0, biasv.size() * 4);
        gc = oomb_init({0, true});
        g = oomb_new_graph(gc);
        oomb_tensor * prod = oomb_mul_mat(gc, a, b);
        out = oomb_scale(gc, bias_form ? oomb_add(gc, prod, bias) : oomb_add(gc, x, prod), 1.0f);
        oomb_set_output(out);
        oomb_build_forward_expand(g, out);
        ga = oomb_gallocr_new(be);
        const bool ok = oomb_gallocr_alloc_graph(ga, g);
        EXPECT_TRUE(ok);
        return ok;
    }
    std::vector<float> result() const {
        std::vector<float> v((size_t) oomb_nelements(out));
        oomb_tensor_get(out, v.data(), 0, v.size() * 4);
        return v;
    }
    ~EpiGraph() {
        if (ga) oomb_gallocr_free(ga);
        if (gc) oomb_free(gc);
        if (buf) oomb_buffer_free(buf);
        if (pc) oomb_free(pc);
    }
};

// An add of a product and a tensor that stays live, or of a product and a bias vector, runs as the
// product's GEMM writing the add's bytes (cuBLASLt: C apart from D, or the bias epilogue; backend-cuda.cu,
// fuse_epilogues). Sums against the host in double (bf16 operands: 1e-2 of the largest value), rows that do
// and do not divide the GEMM tiles (48, 45), and the number of products run so. Cases: X read after the add
// (the residual: A in new bytes); the product first (A in the product's bytes); a bias vector; a graph
// input as X (unchanged after); a computing node between the product and the add (not fused); the product
// read twice (not fused); a batched product (not fused); OOMB_CUDA_FUSE_EPI=0 (not fused).
TEST_F(CudaBackend, FusedEpilogues) {
#ifdef OOMB_USE_CUDA
    enum Mode { RESIDUAL, PRODUCT_FIRST, BIAS, BIAS_MISALIGNED, X_INPUT, NODE_BETWEEN, M_READ_TWICE, BATCHED, TURNED_OFF, N_MODES };
    const char * names[] = {"residual (X read after)", "product first", "bias vector", "bias 4 bytes into a tensor (not fused)",
                            "X a graph input", "a node between", "M read twice", "batched", "turned off"};
    struct EpiEnv {  // OOMB_CUDA_FUSE_EPI=0 for a case, unset on every way out
        explicit EpiEnv(bool on) { if (on) unsetenv("OOMB_CUDA_FUSE_EPI"); else setenv("OOMB_CUDA_FUSE_EPI", "0", 1); }
        ~EpiEnv() { unsetenv("OOMB_CUDA_FUSE_EPI"); }
    };
    for (const int M : {48, 45}) {
        const int K = 37, N = 29, NB = 2;  // NB: batches of the batched case
        const auto av = random_floats((size_t) K * M * NB, 31), bv = random_floats((size_t) K * N * NB, 32);
        const auto a0v = random_floats((size_t) K * M, 33), xv = random_floats((size_t) M * N * NB, 34), biasv = random_floats((size_t) M, 35);
        for (int mode = 0; mode < N_MODES; mode++) {
            SCOPED_TRACE(std::string(names[mode]) + ", rows " + std::to_string(M));
            EpiEnv env(mode != TURNED_OFF);
            const int nb = mode == BATCHED ? NB : 1;
            oomb_context * pc = oomb_init({0, true});
            oomb_tensor * a = oomb_new_tensor_3d(pc, OOMB_TYPE_F32, K, M, nb), * b = oomb_new_tensor_3d(pc, OOMB_TYPE_F32, K, N, nb);
            oomb_tensor * a0 = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, K, M), * x = oomb_new_tensor_3d(pc, OOMB_TYPE_F32, M, N, nb);
            oomb_tensor * biasbuf = oomb_new_tensor_1d(pc, OOMB_TYPE_F32, M + 1);
            oomb_tensor * bias = oomb_view_1d(pc, biasbuf, M, mode == BIAS_MISALIGNED ? 4 : 0);
            oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(pc, cu);
            ASSERT_NE(buf, nullptr);
            oomb_tensor_set(a, av.data(), 0, (size_t) K * M * nb * 4);
            oomb_tensor_set(b, bv.data(), 0, (size_t) K * N * nb * 4);
            oomb_tensor_set(a0, a0v.data(), 0, a0v.size() * 4);
            oomb_tensor_set(x, xv.data(), 0, (size_t) M * N * nb * 4);
            oomb_tensor_set(bias, biasv.data(), 0, biasv.size() * 4);
            oomb_context * gc = oomb_init({0, true});
            oomb_cgraph * g = oomb_new_graph(gc);
            // X: a product of its own (read again after the add: it stays live), or the input x
            oomb_tensor * X = mode == X_INPUT || mode == BATCHED ? x : oomb_scale(gc, oomb_mul_mat(gc, a0, b), 1.0f);
            if (mode == BATCHED) X = x;
            oomb_build_forward_expand(g, X);
            oomb_tensor * p = oomb_mul_mat(gc, a, b);
            oomb_build_forward_expand(g, p);
            oomb_tensor * side = nullptr;
            if (mode == NODE_BETWEEN) side = oomb_scale(gc, a0, 2.0f);  // computed between p and the add
            if (mode == M_READ_TWICE) side = oomb_scale(gc, p, 2.0f);
            if (side) {
                oomb_set_output(side);
                oomb_build_forward_expand(g, side);
            }
            const bool bias_mode = mode == BIAS || mode == BIAS_MISALIGNED;
            oomb_tensor * sum = bias_mode ? oomb_add(gc, p, bias) : mode == PRODUCT_FIRST ? oomb_add(gc, p, X) : oomb_add(gc, X, p);
            oomb_tensor * out = oomb_scale(gc, sum, 1.0f);
            oomb_set_output(out);
            oomb_build_forward_expand(g, out);
            oomb_tensor * after = nullptr;  // X read after the add
            if (X != x) {
                after = oomb_scale(gc, X, 3.0f);
                oomb_set_output(after);
                oomb_build_forward_expand(g, after);
            }
            oomb_gallocr_t ga = oomb_gallocr_new(cu);
            ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
            const int64_t before = oomb_cuda_debug_fused_epi_count(cu);
            const oomb_status st = oomb_backend_graph_compute(cu, g);
            ASSERT_EQ(st, OOMB_STATUS_OK) << oomb_backend_last_error(cu);
            const int64_t fused = oomb_cuda_debug_fused_epi_count(cu) - before;
            const bool want_fused = mode == RESIDUAL || mode == PRODUCT_FIRST || mode == BIAS || mode == X_INPUT;
            if (M % 8 == 0) EXPECT_EQ(fused, want_fused ? 1 : 0);
            else EXPECT_LE(fused, want_fused ? 1 : 0);  // an odd row count may have no cuBLASLt algorithm: then unfused
            std::vector<double> want((size_t) M * N * nb), want_x((size_t) M * N * nb);
            double mx = 0;
            for (int q = 0; q < nb; q++)
                for (int nn = 0; nn < N; nn++)
                    for (int m = 0; m < M; m++) {
                        double pr = 0, x0 = 0;
                        for (int k = 0; k < K; k++) {
                            pr += (double) av[((size_t) q * M + m) * K + k] * bv[((size_t) q * N + nn) * K + k];
                            x0 += (double) a0v[(size_t) m * K + k] * bv[(size_t) nn * K + k];
                        }
                        const size_t i = ((size_t) q * N + nn) * M + m;
                        const double xx = X == x ? (double) xv[i] : x0;
                        want_x[i] = xx;
                        want[i] = pr + (bias_mode ? (double) biasv[m] : xx);
                        mx = std::max(mx, std::fabs(want[i]));
                    }
            std::vector<float> got((size_t) M * N * nb);
            oomb_tensor_get(out, got.data(), 0, got.size() * 4);
            double err = 0;
            for (size_t i = 0; i < got.size(); i++) err = std::max(err, std::fabs(got[i] - want[i]));
            EXPECT_LT(err, 1e-2 * mx) << "the sum: largest error " << err << " of " << mx;
            if (after) {  // X intact after the add
                oomb_tensor_get(after, got.data(), 0, got.size() * 4);
                double xerr = 0;
                for (size_t i = 0; i < got.size(); i++) xerr = std::max(xerr, std::fabs(got[i] - 3.0 * want_x[i]));
                EXPECT_LT(xerr, 3e-2 * mx) << "X read after the add";
            }
            if (X == x) {  // the input itself is unchanged
                oomb_tensor_get(x, got.data(), 0, got.size() * 4);
                for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], xv[i]);
            }
            if (mode == M_READ_TWICE) {
                oomb_tensor_get(side, got.data(), 0, got.size() * 4);
                double serr = 0;
                for (size_t i = 0; i < got.size(); i++) serr = std::max(serr, std::fabs(got[i] - 2.0 * (want[i] - want_x[i])));
                EXPECT_LT(serr, 2e-2 * mx) << "the second reader of the product";
            }
            oomb_gallocr_free(ga);
            oomb_free(gc);
            oomb_buffer_free(buf);
            oomb_free(pc);
        }
    }
    // The plan's algorithm from the heuristic's list (cuda/mul-mat.cu: a 128 x 128 tile where the list has one,
    // OOMB_CUDA_LT_RULE=0 the list's first): the 0.5B output projection's shape with the residual and the bias,
    // each choice against the unfused product, on the GPU; a value that is not a switch is an error naming it.
    {
        oombtest::ScopedEnv rule_env({"OOMB_CUDA_LT_RULE"});
        const int K = 896, M = 896, N = 2051;
        const auto av = random_floats((size_t) K * M, 41), bv = random_floats((size_t) K * N, 42), xv = random_floats((size_t) M * N, 43);
        const auto biasv = random_floats((size_t) M, 44);
        for (const bool bias_form : {false, true}) {
            std::vector<float> res[3];  // the list's first, the rule's choice, unfused
            int64_t fused[3] = {0, 0, 0};
            for (int run = 0; run < 3; run++) {
                SCOPED_TRACE(std::string(bias_form ? "bias" : "residual") + ", run " + std::to_string(run));
                EpiEnv env(run < 2);
                if (run == 0) rule_env.set("OOMB_CUDA_LT_RULE", "0");
                else rule_env.unset("OOMB_CUDA_LT_RULE");
                EpiGraph eg;
                ASSERT_TRUE(eg.build(cu, K, M, N, av, bv, xv, biasv, bias_form));
                const int64_t before = oomb_cuda_debug_fused_epi_count(cu);
                ASSERT_EQ(oomb_backend_graph_compute(cu, eg.g), OOMB_STATUS_OK) << oomb_backend_last_error(cu);
                fused[run] = oomb_cuda_debug_fused_epi_count(cu) - before;
                res[run] = eg.result();
                if (run == 1 && !bias_form) {  // the variable is read for each product: a bad value fails the compute
                    rule_env.set("OOMB_CUDA_LT_RULE", "maybe");
                    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, eg.g), "OOMB_CUDA_LT_RULE=maybe: expected 0 or 1");
                }
            }
            EXPECT_EQ(fused[0], 1);
            EXPECT_EQ(fused[1], 1);
            EXPECT_EQ(fused[2], 0);
            for (int run = 0; run < 2; run++) {
                double mx = 0, err = 0;
                for (size_t i = 0; i < res[2].size(); i++) {
                    mx = std::max(mx, (double) std::fabs(res[2][i]));
                    err = std::max(err, (double) std::fabs(res[run][i] - res[2][i]));
                }
                EXPECT_LT(err, 1e-4 * mx) << (bias_form ? "bias" : "residual") << ", run " << run << ": largest difference " << err << " of " << mx;
            }
        }
    }
    // A product large enough (>= 2^32 multiply-adds) for the first call to time cuBLASLt's candidates (with
    // OOMB_CUDA_LT_TUNE=1): the residual and the bias forms against the same graph unfused (OOMB_CUDA_FUSE_EPI=0),
    // on the GPU both times.
    struct TuneEnv {
        TuneEnv() { setenv("OOMB_CUDA_LT_TUNE", "1", 1); }
        ~TuneEnv() { unsetenv("OOMB_CUDA_LT_TUNE"); }
    } tune_env;
    {
        const int K = 2048, M = 1024, N = 2048;
        const auto av = random_floats((size_t) K * M, 51), bv = random_floats((size_t) K * N, 52), xv = random_floats((size_t) M * N, 53);
        const auto biasv = random_floats((size_t) M, 54);
        for (const bool bias_form : {false, true}) {
            SCOPED_TRACE(bias_form ? "large, bias" : "large, residual");
            std::vector<float> res[2];
            int64_t fused[2] = {0, 0};
            for (int on = 1; on >= 0; on--) {
                EpiEnv env(on == 1);
                EpiGraph eg;
                ASSERT_TRUE(eg.build(cu, K, M, N, av, bv, xv, biasv, bias_form));
                for (int rep = 0; rep < 2; rep++) {  // the second run uses the kept plan
                    const int64_t before = oomb_cuda_debug_fused_epi_count(cu);
                    ASSERT_EQ(oomb_backend_graph_compute(cu, eg.g), OOMB_STATUS_OK) << oomb_backend_last_error(cu);
                    fused[on] += oomb_cuda_debug_fused_epi_count(cu) - before;
                }
                res[on] = eg.result();
            }
            EXPECT_EQ(fused[1], 2);
            EXPECT_EQ(fused[0], 0);
            double mx = 0, err = 0;
            for (size_t i = 0; i < res[0].size(); i++) {
                mx = std::max(mx, (double) std::fabs(res[0][i]));
                err = std::max(err, (double) std::fabs(res[1][i] - res[0][i]));
            }
            EXPECT_LT(err, 1e-4 * mx) << "fused against unfused: largest difference " << err << " of " << mx;
        }
    }
#endif
}

// The norms' input gradient added into the residual stream's gradient sum inside rms_norm_mul_back
// (backend-cuda.cu fuse_accumulations: A = add(C, dx) placed in C's bytes, dx the node itself or the dx view
// of its packed [dx; dw]). The same graph on the CPU backend is the reference (the sums in one f32 add
// either way: 1e-5 relative); rows of float4s (64: the warp kernel) and odd rows (37: the block kernel); dw
// read after; OOMB_CUDA_FUSE_NORM=0 (not fused); C read after the add (not in place: not fused).
TEST_F(CudaBackend, FusedNormGradientSum) {
#ifdef OOMB_USE_CUDA
    struct NormEnv {
        explicit NormEnv(bool on) { if (on) unsetenv("OOMB_CUDA_FUSE_NORM"); else setenv("OOMB_CUDA_FUSE_NORM", "0", 1); }
        ~NormEnv() { unsetenv("OOMB_CUDA_FUSE_NORM"); }
    };
    enum Mode { FUSED, C_READ_AFTER, TURNED_OFF, N_MODES };
    const char * names[] = {"fused", "C read after", "turned off"};
    for (const int ne0 : {64, 37})
    for (const bool with_dw : {true, false})
    for (int mode = 0; mode < N_MODES; mode++) {
        SCOPED_TRACE(std::string(names[mode]) + ", row " + std::to_string(ne0) + (with_dw ? ", with dw" : ", dx alone"));
        NormEnv env(mode != TURNED_OFF);
        const int nr = 29;
        const auto xv = random_floats((size_t) ne0 * nr, 41), dyv = random_floats((size_t) ne0 * nr, 42);
        const auto wv = random_floats((size_t) ne0, 43), cv = random_floats((size_t) ne0 * nr, 44);
        std::vector<float> got[2], got_dw[2], got_c[2];
        int64_t fused = -1;
        for (int be = 0; be < 2; be++) {  // 0: CUDA, 1: CPU
            oomb_backend_t bk = be == 0 ? cu : cpu;
            oomb_context * pc = oomb_init({0, true});
            oomb_tensor * x = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, ne0, nr), * dy = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, ne0, nr);
            oomb_tensor * w = oomb_new_tensor_1d(pc, OOMB_TYPE_F32, ne0), * c0 = oomb_new_tensor_2d(pc, OOMB_TYPE_F32, ne0, nr);
            oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(pc, bk);
            ASSERT_NE(buf, nullptr);
            oomb_tensor_set(x, xv.data(), 0, xv.size() * 4);
            oomb_tensor_set(dy, dyv.data(), 0, dyv.size() * 4);
            oomb_tensor_set(w, wv.data(), 0, wv.size() * 4);
            oomb_tensor_set(c0, cv.data(), 0, cv.size() * 4);
            oomb_context * gc = oomb_init({0, true});
            oomb_cgraph * g = oomb_new_graph(gc);
            oomb_tensor * C = oomb_scale(gc, c0, 1.5f);  // an arena tensor the sum can be placed over
            oomb_build_forward_expand(g, C);
            oomb_tensor * P = oomb_rms_norm_mul_back(gc, x, w, dy, 1e-6f, with_dw);
            oomb_build_forward_expand(g, P);
            oomb_tensor * dx = with_dw ? oomb_view_2d(gc, P, ne0, nr, (size_t) ne0 * 4, 0) : P;
            oomb_tensor * dw = with_dw ? oomb_view_1d(gc, P, ne0, (size_t) ne0 * nr * 4) : nullptr;
            oomb_tensor * sum = oomb_add(gc, C, dx);
            oomb_tensor * out = oomb_scale(gc, sum, 1.0f);
            oomb_set_output(out);
            oomb_build_forward_expand(g, out);
            oomb_tensor * dw_out = nullptr, * c_out = nullptr;
            if (dw) {
                dw_out = oomb_scale(gc, dw, 1.0f);
                oomb_set_output(dw_out);
                oomb_build_forward_expand(g, dw_out);
            }
            if (mode == C_READ_AFTER) {
                c_out = oomb_scale(gc, C, 1.0f);
                oomb_set_output(c_out);
                oomb_build_forward_expand(g, c_out);
            }
            oomb_gallocr_t ga = oomb_gallocr_new(bk);
            ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
            const int64_t before = be == 0 ? oomb_cuda_debug_fused_count(cu) : 0;
            ASSERT_EQ(oomb_backend_graph_compute(bk, g), OOMB_STATUS_OK) << oomb_backend_last_error(bk);
            if (be == 0) fused = oomb_cuda_debug_fused_count(cu) - before;
            got[be].resize((size_t) ne0 * nr);
            oomb_tensor_get(out, got[be].data(), 0, got[be].size() * 4);
            if (dw_out) {
                got_dw[be].resize(ne0);
                oomb_tensor_get(dw_out, got_dw[be].data(), 0, got_dw[be].size() * 4);
            }
            if (c_out) {
                got_c[be].resize((size_t) ne0 * nr);
                oomb_tensor_get(c_out, got_c[be].data(), 0, got_c[be].size() * 4);
            }
            oomb_gallocr_free(ga);
            oomb_free(gc);
            oomb_buffer_free(buf);
            oomb_free(pc);
        }
        EXPECT_EQ(fused, mode == FUSED ? 1 : 0);
        auto close = [](const std::vector<float> & a, const std::vector<float> & b, const char * what) {
            ASSERT_EQ(a.size(), b.size());
            double mx = 0, err = 0;
            for (size_t i = 0; i < a.size(); i++) {
                mx = std::max(mx, (double) std::fabs(b[i]));
                err = std::max(err, (double) std::fabs(a[i] - b[i]));
            }
            EXPECT_LE(err, 1e-5 * std::max(mx, 1.0)) << what << ": largest difference " << err << " of " << mx;
        };
        close(got[0], got[1], "the sum");
        if (with_dw) close(got_dw[0], got_dw[1], "dw");
        if (mode == C_READ_AFTER) close(got_c[0], got_c[1], "C after the add");
    }
#endif
}
