// The harness of the CUDA-vs-CPU op tests (test-cuda-ops.cpp, test-cuda-linear-ce.cpp): every case builds the
// same graph twice, once on the CPU backend (host inputs) and once on the CUDA backend (inputs in a CUDA buffer
// made by oomb_backend_alloc_ctx_tensors and uploaded with oomb_tensor_set; the graph placed by oomb_gallocr).
// The GPU graph's outputs are poisoned (0xFF bytes: NaN) before compute, so an element that is not written fails.
// Relative error ||gpu - cpu|| / ||cpu||: f32 ops < 1e-4 (k_f32); matrix products (bf16 operands, f32
// accumulation) < 3e-2 (k_bf16); NaN never passes. OOMB_TEST_CUDA_HARNESS_ON_CPU=1 runs the "GPU" half on a
// second CPU backend (a check of the harness itself). Without a CUDA build or a GPU, REQUIRE_CUDA skips
// (GTEST_SKIP: a visible SKIPPED line). Each test file is its own binary: the anonymous namespace below is
// per binary.
#pragma once
#include "test-common.h"
#include "oomb-alloc.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#ifdef OOMB_USE_CUDA
// test hooks (cuda/backend-cuda.cu): add_inplace nodes fused into their products so far, and
// linear_cross_entropy forward / backward pairs run as one pass
int64_t oomb_cuda_debug_fused_count(oomb_backend_t backend);
int64_t oomb_cuda_debug_fused_lce_count(oomb_backend_t backend);
// scratch requests above a limit fail as if out of memory; the last fused pass's rows per block
void oomb_cuda_debug_set_scratch_limit(oomb_backend_t backend, size_t bytes);
int64_t oomb_cuda_debug_last_lce_rows(oomb_backend_t backend);
// the linear_cross_entropy slots' blocks asked for since the last reset (as oomb_backend_graph_scratch counts them)
size_t oomb_cuda_debug_lce_scratch(oomb_backend_t backend, bool reset);
#endif

namespace {

using vec = std::vector<double>;

oomb_backend_t g_cpu = nullptr;
oomb_backend_t g_cuda = nullptr;
bool g_cuda_tried = false;

// OOMB_TEST_CUDA_HARNESS_ON_CPU=1 runs the "GPU" half of every case on a second CPU backend: a check
// of the harness itself (uploads, poisoning, read-back, tolerances) on machines without a GPU.
bool harness_on_cpu() {
    const char * e = getenv("OOMB_TEST_CUDA_HARNESS_ON_CPU");
    return e && atoi(e) != 0;
}

oomb_backend_t cuda_backend() {
    if (!g_cuda_tried) {
        g_cuda_tried = true;
        if (harness_on_cpu()) g_cuda = oomb_backend_cpu_init(2);
        else if (oomb_cuda_available()) g_cuda = oomb_backend_cuda_init(0);
    }
    return g_cuda;
}

#define REQUIRE_CUDA()                                                   \
    do {                                                                 \
        if (!cuda_backend()) GTEST_SKIP() << "no CUDA GPU";              \
    } while (0)

// Relative error; infinity when any output is NaN / inf or the sizes differ.
double rel_err(const vec & out, const vec & ref) {
    if (out.size() != ref.size()) return INFINITY;
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); i++) {
        if (!std::isfinite(out[i])) return INFINITY;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    if (den == 0) return std::sqrt(num);
    return std::sqrt(num / den);
}

// Logical-order values of any tensor whose bytes (from its memory owner's start) are in `host`.
vec values_from_bytes(const oomb_tensor * t, const std::vector<uint8_t> & host, size_t offset) {
    oomb_tensor tmp = *t;
    tmp.view_src = nullptr;
    tmp.buffer = nullptr;
    tmp.data = (void *) (host.data() + offset);
    if (t->type == OOMB_TYPE_I32) {
        vec out;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
        for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
            int32_t v;
            memcpy(&v, (const char *) tmp.data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], 4);
            out.push_back(v);
        }
        return out;
    }
    return oombtest::to_vector(&tmp);
}

// Downloads a device tensor (any view) and returns its values in logical order.
vec device_values(const oomb_tensor * t) {
    const oomb_tensor * owner = t->view_src ? t->view_src : t;
    std::vector<uint8_t> host(oomb_nbytes(owner));
    oomb_tensor_get(owner, host.data(), 0, host.size());
    return values_from_bytes(t, host, (size_t) ((const char *) t->data - (const char *) owner->data));
}

vec host_values(const oomb_tensor * t) {
    if (t->type == OOMB_TYPE_I32) {
        std::vector<uint8_t> dummy;
        vec out;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
        for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
            int32_t v;
            memcpy(&v, (const char *) t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], 4);
            out.push_back(v);
        }
        return out;
    }
    return oombtest::to_vector(t);
}

// Builds one copy of a case's graph. Inputs go to `in` (host memory for the CPU copy; a CUDA buffer
// for the GPU copy), ops to `ctx` (no_alloc; placed by the graph allocator).
struct Builder {
    bool gpu = false;
    oomb_context * in = nullptr;
    oomb_context * ctx = nullptr;
    std::mt19937 rng;
    std::vector<oomb_tensor *> inputs;
    std::vector<bool> poison;            // GPU copy: overwrite with 0xFF after upload (written by the graph)
    oomb_tensor * loss = nullptr;        // set by the case: build the backward pass of this

    explicit Builder(bool gpu_, uint32_t seed) : gpu(gpu_), rng(seed) {
        in = oomb_init({0, gpu});
        ctx = oomb_init({0, true});
    }
    ~Builder() {
        oomb_free(ctx);
        oomb_free(in);
    }

    oomb_tensor * input(oomb_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1, float lo = -1.0f, float hi = 1.0f,
                        bool poison_it = false) {
        oomb_tensor * t = oomb_new_tensor_4d(in, type, ne0, ne1, ne2, ne3);
        if (!gpu) oombtest::fill_uniform(t, rng, lo, hi);
        inputs.push_back(t);
        poison.push_back(poison_it);
        return t;
    }
    // A block-type (quantized) [K, M] weight: random blocks with finite moderate scales (fill_random_blocks).
    oomb_tensor * qinput(oomb_type type, int64_t K, int64_t M) {
        oomb_tensor * t = oomb_new_tensor_2d(in, type, K, M);
        if (!gpu) oombtest::fill_random_blocks(t, rng);
        inputs.push_back(t);
        poison.push_back(false);
        return t;
    }
    // A tensor the graph writes (cpy destination): random initial data, poisoned on the GPU.
    oomb_tensor * dest(oomb_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1) {
        return input(type, ne0, ne1, ne2, ne3, -1.0f, 1.0f, true);
    }
    oomb_tensor * ids(const std::vector<int32_t> & v, int64_t ne0, int64_t ne1 = 1) {
        oomb_tensor * t = oomb_new_tensor_2d(in, OOMB_TYPE_I32, ne0, ne1);
        if (!gpu) for (size_t i = 0; i < v.size(); i++) oomb_set_i32_1d(t, (int64_t) i, v[i]);
        inputs.push_back(t);
        poison.push_back(false);
        return t;
    }
    // f32 [n] holding exactly these values
    oomb_tensor * consts(const std::vector<float> & v) {
        oomb_tensor * t = oomb_new_tensor_1d(in, OOMB_TYPE_F32, (int64_t) v.size());
        if (!gpu) for (size_t i = 0; i < v.size(); i++) oomb_set_f32_1d(t, (int64_t) i, v[i]);
        inputs.push_back(t);
        poison.push_back(false);
        return t;
    }
    oomb_tensor * param(oomb_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1, float lo = -1.0f, float hi = 1.0f) {
        oomb_tensor * t = input(type, ne0, ne1, ne2, ne3, lo, hi);
        oomb_set_param(t);
        oomb_new_grad(in, t);
        return t;
    }
    // random ids in [0, n)
    std::vector<int32_t> rand_ids(int64_t count, int32_t n) {
        std::uniform_int_distribution<int32_t> d(0, n - 1);
        std::vector<int32_t> v((size_t) count);
        for (auto & x : v) x = d(rng);
        return v;
    }
};

using build_fn = std::function<std::vector<oomb_tensor *>(Builder &)>;

// One backend's run of a case.
struct Run {
    Builder B;
    oomb_buffer_t buf = nullptr;
    oomb_gallocr_t ga = nullptr;
    std::vector<oomb_tensor *> outs;
    Run(bool gpu, uint32_t seed) : B(gpu, seed) {}
    ~Run() {
        if (ga) oomb_gallocr_free(ga);
        if (buf) oomb_buffer_free(buf);
    }
};

oomb_cgraph * build_graph(Run & r, const build_fn & build) {
    r.outs = build(r.B);
    oomb_cgraph * g = oomb_new_graph(r.B.ctx);
    for (oomb_tensor * o : r.outs) {
        if (o->op != OOMB_OP_NONE) oomb_set_output(o);
        oomb_build_forward_expand(g, o);
    }
    if (r.B.loss) {
        oomb_set_loss(r.B.loss);
        oomb_build_forward_expand(g, r.B.loss);
        oomb_build_backward_expand(r.B.ctx, g, r.B.loss, nullptr);
    }
    return g;
}

// Runs the case on both backends and returns the per-output relative errors (GPU vs CPU).
std::vector<double> run_case(const build_fn & build, uint32_t seed = 42) {
    Run cpu(false, seed), gpu(true, seed);

    // CPU
    oomb_cgraph * gc = build_graph(cpu, build);
    // the inputs' initial bytes (in-place ops such as add_inplace / adamw_step change them)
    std::vector<std::vector<uint8_t>> init;
    for (oomb_tensor * t : cpu.B.inputs) {
        const uint8_t * p = (const uint8_t *) t->data;
        init.emplace_back(p, p + oomb_nbytes(t));
    }
    cpu.ga = oomb_gallocr_new(g_cpu);
    EXPECT_TRUE(oomb_gallocr_alloc_graph(cpu.ga, gc));
    oomb_backend_graph_compute(g_cpu, gc);
    std::vector<vec> ref;
    for (oomb_tensor * o : cpu.outs) ref.push_back(host_values(o));

    // GPU
    oomb_backend_t cu = cuda_backend();
    oomb_cgraph * gg = build_graph(gpu, build);
    EXPECT_EQ(gpu.B.inputs.size(), cpu.B.inputs.size());
    gpu.buf = oomb_backend_alloc_ctx_tensors(gpu.B.in, cu);
    for (size_t i = 0; i < gpu.B.inputs.size() && i < cpu.B.inputs.size(); i++) {
        oomb_tensor * t = gpu.B.inputs[i];
        oomb_tensor_set(t, init[i].data(), 0, oomb_nbytes(t));
        if (gpu.B.poison[i]) oomb_tensor_memset(t, 0xFF);
    }
    // views of the inputs were made before the inputs had memory: point them now (as
    // alloc_ctx_tensors does for views inside its own context)
    for (int64_t i = 0; i < oomb_ctx_n_tensors(gpu.B.ctx); i++) {
        oomb_tensor * t = oomb_ctx_tensor(gpu.B.ctx, i);
        if (!t->data && t->view_src && t->view_src->data) {
            t->data = (char *) t->view_src->data + t->view_offs;
            t->buffer = t->view_src->buffer;
        }
    }
    gpu.ga = oomb_gallocr_new(cu);
    EXPECT_TRUE(oomb_gallocr_alloc_graph(gpu.ga, gg));
    for (int i = 0; i < oomb_graph_n_nodes(gg); i++) {
        oomb_tensor * n = oomb_graph_node(gg, i);
        if (!n->view_src && n->data && oomb_is_contiguous(n)) oomb_tensor_memset(n, 0xFF);
    }
    oomb_backend_graph_compute(cu, gg);
    oomb_backend_synchronize(cu);

    std::vector<double> errs;
    for (size_t i = 0; i < gpu.outs.size() && i < ref.size(); i++) {
        errs.push_back(rel_err(device_values(gpu.outs[i]), ref[i]));
    }
    return errs;
}

// Runs a case and expects every output's error under tol.
void expect_case(const char * what, const build_fn & build, double tol, uint32_t seed = 42) {
    const std::vector<double> errs = run_case(build, seed);
    ASSERT_FALSE(errs.empty()) << what;
    for (size_t i = 0; i < errs.size(); i++) {
        EXPECT_LT(errs[i], tol) << what << ": output " << i;
        printf("  %-58s out %zu: rel err %.3e\n", what, i, errs[i]);
    }
}

const double k_f32 = 1e-4;
const double k_bf16 = 3e-2;

class CudaOps : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (!g_cpu) g_cpu = oomb_backend_cpu_init(0);
    }
};
} // namespace
