// Automatic differentiation: finite-difference checks of oomb_build_backward_expand for every
// differentiable op (broadcasts, non-contiguous views, bf16 weights, GQA attention, masks, ignored
// labels, paged attention), gradient accumulation across evaluations, zeroing, the documented errors,
// and the same gradients from a graph planned by the graph allocator.
//
// Each check: random inputs flagged PARAM (host context), loss = sum(out * R) with fixed random
// weights R, forward + backward computed by the CPU backend; the analytic gradient of every
// parameter is compared with a 4-point central difference of sum(out * R) (evaluated on the host in
// double from the re-computed forward output): ||g - fd|| / ||fd|| < 1e-2 (typically ~1e-5).
#include "test-common.h"

#include "oomb-alloc.h"
#include "oomb-paged.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr double kTol = 1e-2;

oomb_backend_t cpu() {
    static oomb_backend_t b = oomb_backend_cpu_init(2);
    return b;
}

double dot_host(const oomb_tensor * out, const std::vector<double> & r) {
    const std::vector<double> y = oombtest::to_vector(out);
    double s = 0.0;
    for (size_t i = 0; i < y.size(); i++) s += y[i] * r[i];
    return s;
}

double rel_err(const std::vector<double> & g, const std::vector<double> & fd) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < g.size(); i++) {
        num += (g[i] - fd[i]) * (g[i] - fd[i]);
        den += fd[i] * fd[i];
    }
    if (den < 1e-20) return std::sqrt(num) < 1e-6 ? 0.0 : INFINITY;
    return std::sqrt(num / den);
}

struct ParamResult {
    std::string name;
    std::vector<double> g, fd;
    double err;
};

struct Harness {
    oomb_context * ctx;
    std::mt19937 rng;
    std::vector<oomb_tensor *> params;
    bool grid = false;   // values on a 1/64 grid and step 1/64: exact in bf16 / f16
    double h = 1e-2;     // finite-difference step
    std::vector<oomb_tensor *> extra_zero; // other accumulators zeroed with the gradients (KV-gradient pages)

    explicit Harness(uint32_t seed = 1234) : rng(seed) { ctx = oomb_init({0, false}); }
    ~Harness() { oomb_free(ctx); }

    void fill(oomb_tensor * t, float lo = -1.0f, float hi = 1.0f) {
        oombtest::fill_uniform(t, rng, lo, hi);
        if (grid) {
            for (int64_t i = 0; i < oomb_nelements(t); i++) {
                float v = std::round(oomb_get_f32_1d(t, i) * 64.0f) / 64.0f;
                if (v == 0.0f) v = 1.0f / 64.0f;
                oomb_set_f32_1d(t, i, v);
            }
        }
    }
    oomb_tensor * tensor(const char * name, std::vector<int64_t> ne, oomb_type type = OOMB_TYPE_F32) {
        oomb_tensor * t = oomb_new_tensor(ctx, type, (int) ne.size(), ne.data());
        oomb_set_name(t, name);
        return t;
    }
    oomb_tensor * param(const char * name, std::vector<int64_t> ne, oomb_type type = OOMB_TYPE_F32, float lo = -1.0f, float hi = 1.0f) {
        oomb_tensor * t = tensor(name, ne, type);
        fill(t, lo, hi);
        oomb_set_param(t);
        oomb_new_grad(ctx, t);
        params.push_back(t);
        return t;
    }
    oomb_tensor * input(const char * name, std::vector<int64_t> ne, float lo = -1.0f, float hi = 1.0f) {
        oomb_tensor * t = tensor(name, ne);
        fill(t, lo, hi);
        return t;
    }
    oomb_tensor * ids(const char * name, const std::vector<int32_t> & v, int64_t ne0, int64_t ne1 = 1) {
        oomb_tensor * t = oomb_new_tensor_2d(ctx, OOMB_TYPE_I32, ne0, ne1);
        oomb_set_name(t, name);
        for (int64_t i = 0; i < ne0 * ne1; i++) oomb_set_i32_1d(t, i, v[(size_t) i]);
        return t;
    }

    void zero_grads() {
        for (oomb_tensor * p : params) oomb_tensor_memset(p->grad, 0);
        for (oomb_tensor * t : extra_zero) oomb_tensor_memset(t, 0);
    }

    // Builds loss = sum(out * R), forward + backward, and compares every parameter's gradient with
    // finite differences. Returns the per-parameter results (and EXPECTs err < tol).
    std::vector<ParamResult> check(oomb_tensor * out, double tol = kTol) {
        oomb_tensor * y = out->type == OOMB_TYPE_F32 ? out : oomb_cast(ctx, out, OOMB_TYPE_F32);
        oomb_tensor * R = tensor("R", {out->ne[0], out->ne[1], out->ne[2], out->ne[3]});
        oombtest::fill_uniform(R, rng, -1.0f, 1.0f);
        const std::vector<double> r = oombtest::to_vector(R);
        oomb_tensor * loss = oomb_set_name(oomb_sum(ctx, oomb_mul(ctx, y, R)), "loss");

        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, loss);
        oomb_build_backward_expand(ctx, g, loss, nullptr);
        oomb_cgraph * gy = oomb_new_graph(ctx);
        oomb_build_forward_expand(gy, y);

        zero_grads();
        oomb_backend_graph_compute(cpu(), g);
        const double l0 = dot_host(y, r);
        EXPECT_NEAR(oomb_get_f32_1d(loss, 0), l0, 1e-4 * (1.0 + std::fabs(l0))) << "loss value";

        std::vector<ParamResult> res;
        for (oomb_tensor * p : params) {
            ParamResult pr;
            pr.name = p->name;
            pr.g = oombtest::to_vector(p->grad);
            const int64_t n = oomb_nelements(p);
            pr.fd.resize((size_t) n);
            const double step = grid ? 1.0 / 64.0 : h;
            for (int64_t i = 0; i < n; i++) {
                const float v = oomb_get_f32_1d(p, i);
                auto f = [&](double d) {
                    oomb_set_f32_1d(p, i, (float) (v + d));
                    oomb_backend_graph_compute(cpu(), gy);
                    return dot_host(y, r);
                };
                const double f1 = f(step), fm1 = f(-step), f2 = f(2 * step), fm2 = f(-2 * step);
                oomb_set_f32_1d(p, i, v);
                pr.fd[(size_t) i] = (8.0 * (f1 - fm1) - (f2 - fm2)) / (12.0 * step);
            }
            pr.err = rel_err(pr.g, pr.fd);
            if (getenv("OOMB_GRAD_VERBOSE")) {
                double ng = 0;
                for (double v : pr.g) ng += v * v;
                fprintf(stderr, "  %-12s n=%-4lld |g|=%-10.4g rel.err=%.3g\n", p->name, (long long) n, std::sqrt(ng), pr.err);
            }
            EXPECT_LT(pr.err, tol) << "gradient of '" << p->name << "' (" << n << " elements) differs from finite differences";
            res.push_back(pr);
        }
        oomb_backend_graph_compute(cpu(), gy); // restore the forward values
        return res;
    }
};

// ---------------------------------------------------------------------------------------------
// element-wise and broadcasting
// ---------------------------------------------------------------------------------------------

TEST(Grad, Add) {
    { Harness H; H.check(oomb_add(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {5, 4, 3}))); }
    { Harness H; H.check(oomb_add(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {5, 1, 3}))); }
    { Harness H; H.check(oomb_add(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {1, 4, 1}))); }
    { Harness H; H.check(oomb_add(H.ctx, H.param("a", {4, 3, 2, 2}), H.param("b", {4, 3, 1, 2}))); }
    { // only b is a parameter; a is a constant input
        Harness H;
        H.check(oomb_add(H.ctx, H.input("a", {6, 3}), H.param("b", {6, 1})));
    }
    { // non-contiguous operands: transposed a, permuted b
        Harness H;
        oomb_tensor * a = oomb_transpose(H.ctx, H.param("a", {3, 5}));
        oomb_tensor * bb = H.param("bb", {10, 3});
        oomb_tensor * b = oomb_view_2d(H.ctx, bb, 5, 3, bb->nb[1], 2 * sizeof(float)); // rows of stride 10
        H.check(oomb_add(H.ctx, a, b));
    }
}

TEST(Grad, Sub) {
    { Harness H; H.check(oomb_sub(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {5, 4, 3}))); }
    { Harness H; H.check(oomb_sub(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {5, 1, 1}))); }
    { Harness H; H.check(oomb_sub(H.ctx, H.param("a", {6, 4}), H.param("b", {1, 4}))); }
}

TEST(Grad, Mul) {
    { Harness H; H.check(oomb_mul(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {5, 4, 3}))); }
    { Harness H; H.check(oomb_mul(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {5, 1, 3}))); }
    { Harness H; H.check(oomb_mul(H.ctx, H.param("a", {5, 4, 3}), H.param("b", {1, 4, 1}))); }
    { Harness H; H.check(oomb_mul(H.ctx, H.param("a", {4, 3, 2, 3}), H.param("b", {4, 1, 2, 1}))); }
    { // the same tensor on both sides: x * x (two contributions to one gradient)
        Harness H;
        oomb_tensor * x = H.param("x", {7, 3});
        H.check(oomb_mul(H.ctx, x, x));
    }
    { // non-contiguous a: a permuted 3-D tensor, broadcast b
        Harness H;
        oomb_tensor * a = oomb_permute(H.ctx, H.param("a", {3, 4, 2}), 2, 0, 1, 3); // [4, 2, 3]
        H.check(oomb_mul(H.ctx, a, H.param("b", {4, 1, 3})));
    }
}

TEST(Grad, Scale) {
    Harness H;
    H.check(oomb_scale(H.ctx, H.param("a", {6, 5}), -1.75f));
}

TEST(Grad, AddInplace) {
    { // into an intermediate result, b broadcast
        Harness H;
        oomb_tensor * x = H.param("x", {5, 4});
        oomb_tensor * a = oomb_mul(H.ctx, x, H.input("c", {5, 4}));
        H.check(oomb_add_inplace(H.ctx, a, H.param("b", {5, 1})));
    }
    { // same shapes, then used by a following op
        Harness H;
        oomb_tensor * x = H.param("x", {6, 3});
        oomb_tensor * a = oomb_silu(H.ctx, x);
        oomb_tensor * s = oomb_add_inplace(H.ctx, a, H.param("b", {6, 3}));
        H.check(oomb_mul(H.ctx, s, H.param("w", {6, 3})));
    }
}

TEST(Grad, Repeat) {
    { Harness H; H.check(oomb_repeat(H.ctx, H.param("a", {3, 1, 2}), H.tensor("shape", {6, 4, 2}))); }
    { Harness H; H.check(oomb_repeat(H.ctx, H.param("a", {1, 4}), H.tensor("shape", {5, 4, 3}))); }
    { Harness H; H.check(oomb_repeat(H.ctx, H.param("a", {2, 3, 1, 2}), H.tensor("shape", {4, 3, 2, 4}))); }
}

TEST(Grad, RepeatBack) {
    { Harness H; H.check(oomb_repeat_back(H.ctx, H.param("a", {6, 4, 2}), H.tensor("shape", {3, 2, 2}))); }
    { Harness H; H.check(oomb_repeat_back(H.ctx, H.param("a", {5, 4, 3}), H.tensor("shape", {1, 4, 1}))); }
    { Harness H; H.check(oomb_repeat_back(H.ctx, H.param("a", {4, 3, 2, 4}), H.tensor("shape", {2, 3, 1, 2}))); }
}

TEST(Grad, Silu) {
    { Harness H; H.check(oomb_silu(H.ctx, H.param("a", {7, 3, 2}, OOMB_TYPE_F32, -3.0f, 3.0f))); }
    { // transposed input
        Harness H;
        H.check(oomb_silu(H.ctx, oomb_transpose(H.ctx, H.param("a", {4, 6}, OOMB_TYPE_F32, -3.0f, 3.0f))));
    }
}

TEST(Grad, Swiglu) {
    { Harness H; H.check(oomb_swiglu(H.ctx, H.param("gate", {8, 3}, OOMB_TYPE_F32, -3, 3), H.param("up", {8, 3}))); }
    { // gate only
        Harness H;
        H.check(oomb_swiglu(H.ctx, H.param("gate", {5, 2, 2}, OOMB_TYPE_F32, -3, 3), H.input("up", {5, 2, 2})));
    }
}

// ---------------------------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------------------------

TEST(Grad, Reductions) {
    { Harness H; H.check(oomb_sum(H.ctx, H.param("a", {5, 4, 3}))); }
    { Harness H; H.check(oomb_mean(H.ctx, H.param("a", {5, 4, 3}))); }
    { Harness H; H.check(oomb_sum_sq(H.ctx, H.param("a", {5, 4, 3}))); }
    { // several tensors in one node (oomb_sum_sq_n): a parameter, a transposed one, one element, the first again
        Harness H;
        oomb_tensor * a = H.param("a", {5, 4, 3}), * b = H.param("b", {4, 6}), * c = H.param("c", {1});
        oomb_tensor * ts[4] = {a, oomb_transpose(H.ctx, b), c, a};
        H.check(oomb_sum_sq_n(H.ctx, ts, 4));
    }
    { // non-contiguous inputs
        Harness H;
        oomb_tensor * a = H.param("a", {4, 6});
        oomb_tensor * at = oomb_transpose(H.ctx, a);
        oomb_tensor * s = oomb_add(H.ctx, oomb_sum_sq(H.ctx, at), oomb_mean(H.ctx, at));
        H.check(oomb_add(H.ctx, s, oomb_sum(H.ctx, oomb_permute(H.ctx, H.param("b", {2, 3, 4}), 1, 2, 0, 3))));
    }
}

// ---------------------------------------------------------------------------------------------
// layout ops: views, reshape, permute, transpose, cont, cpy, cast
// ---------------------------------------------------------------------------------------------

TEST(Grad, ViewWithOffsetAndStrides) {
    { // 2-D block with an offset
        Harness H;
        oomb_tensor * x = H.param("x", {6, 5});
        oomb_tensor * v = oomb_view_2d(H.ctx, x, 3, 4, x->nb[1], 1 * x->nb[0] + 1 * x->nb[1]);
        H.check(oomb_mul(H.ctx, v, H.param("w", {3, 4})));
    }
    { // 1-D view with an offset, 3-D view with gaps between rows, overlapping views
        Harness H;
        oomb_tensor * x = H.param("x", {24});
        oomb_tensor * v1 = oomb_view_1d(H.ctx, x, 7, 5 * sizeof(float));
        oomb_tensor * v2 = oomb_view_3d(H.ctx, x, 2, 3, 2, 3 * sizeof(float), 10 * sizeof(float), 2 * sizeof(float));
        oomb_tensor * v3 = oomb_view_2d(H.ctx, x, 4, 2, 4 * sizeof(float), 8 * sizeof(float)); // overlaps v1
        oomb_tensor * s = oomb_add(H.ctx, oomb_sum_sq(H.ctx, v1), oomb_sum(H.ctx, oomb_mul(H.ctx, v2, v2)));
        H.check(oomb_add(H.ctx, s, oomb_sum(H.ctx, oomb_silu(H.ctx, v3))));
    }
    { // q, k, v split from one fused tensor by views (the usual fused-projection pattern)
        Harness H;
        oomb_tensor * qkv = oomb_mul_mat(H.ctx, H.param("w_qkv", {4, 9}), H.param("x", {4, 3})); // [9, 3]
        oomb_tensor * q = oomb_view_2d(H.ctx, qkv, 3, 3, qkv->nb[1], 0);
        oomb_tensor * k = oomb_view_2d(H.ctx, qkv, 3, 3, qkv->nb[1], 3 * sizeof(float));
        oomb_tensor * v = oomb_view_2d(H.ctx, qkv, 3, 3, qkv->nb[1], 6 * sizeof(float));
        H.check(oomb_add(H.ctx, oomb_mul(H.ctx, q, k), v));
    }
    { // a view of a transposed tensor (the view's source is itself a view with permuted strides)
        Harness H;
        oomb_tensor * x = H.param("x", {4, 3});
        oomb_tensor * xt = oomb_transpose(H.ctx, x); // [3, 4], nb0 = 16
        oomb_tensor * v = oomb_view_2d(H.ctx, xt, 2, 3, 4 * sizeof(float), sizeof(float)); // elements x(1 + i0, i1)
        oomb_tensor * s1 = oomb_sum(H.ctx, oomb_mul(H.ctx, v, H.input("c", {2, 3})));
        oomb_tensor * s2 = oomb_sum(H.ctx, oomb_mul(H.ctx, oomb_cont(H.ctx, xt), H.input("c2", {3, 4})));
        H.check(oomb_add(H.ctx, s1, s2));
    }
    { // a view of the whole tensor (reshaping it), next to a partial one
        Harness H;
        oomb_tensor * x = H.param("x", {4, 6});
        oomb_tensor * all = oomb_view_3d(H.ctx, x, 4, 3, 2, x->nb[1], 3 * x->nb[1], 0);
        oomb_tensor * part = oomb_view_1d(H.ctx, x, 5, 3 * sizeof(float));
        H.check(oomb_add(H.ctx, oomb_sum_sq(H.ctx, all), oomb_sum(H.ctx, oomb_silu(H.ctx, part))));
    }
    { // view of a view: a row block of a column block
        Harness H;
        oomb_tensor * x = H.param("x", {6, 6});
        oomb_tensor * v1 = oomb_view_2d(H.ctx, x, 6, 4, x->nb[1], 2 * x->nb[1]);
        oomb_tensor * v2 = oomb_view_2d(H.ctx, v1, 3, 2, v1->nb[1], 2 * sizeof(float) + v1->nb[1]);
        H.check(oomb_add(H.ctx, oomb_mul(H.ctx, v2, v2), oomb_view_2d(H.ctx, v1, 3, 2, v1->nb[1], 0)));
    }
}

TEST(Grad, ViewOfBf16Param) {
    Harness H;
    H.grid = true;
    oomb_tensor * x = H.param("x", {6, 5}, OOMB_TYPE_BF16);
    oomb_tensor * v = oomb_view_2d(H.ctx, x, 4, 3, x->nb[1], 2 * x->nb[0] + x->nb[1]);
    H.check(oomb_mul(H.ctx, oomb_cast(H.ctx, v, OOMB_TYPE_F32), H.input("c", {4, 3})));
}

TEST(Grad, Reshape) {
    { Harness H; H.check(oomb_mul(H.ctx, oomb_reshape_3d(H.ctx, H.param("x", {6, 4}), 3, 2, 4), H.param("w", {3, 2, 1}))); }
    { // reshape of an op result
        Harness H;
        oomb_tensor * s = oomb_silu(H.ctx, H.param("x", {4, 6}));
        H.check(oomb_reshape_2d(H.ctx, s, 8, 3));
    }
}

TEST(Grad, Permute) {
    { // as a (non-contiguous) input to mul
        Harness H;
        oomb_tensor * p = oomb_permute(H.ctx, H.param("x", {2, 3, 4, 5}), 2, 0, 3, 1); // [3, 5, 2, 4]
        H.check(oomb_mul(H.ctx, p, H.param("w", {3, 5, 1, 4})));
    }
    { // permute then cont (the attention head-split pattern)
        Harness H;
        oomb_tensor * p = oomb_permute(H.ctx, H.param("x", {3, 4, 5}), 0, 2, 1, 3); // [3, 5, 4]
        H.check(oomb_cont(H.ctx, p));
    }
    { // the permute's gradient flows into an op result
        Harness H;
        oomb_tensor * m = oomb_mul(H.ctx, H.param("a", {2, 3, 4}), H.param("b", {2, 3, 4}));
        H.check(oomb_silu(H.ctx, oomb_cont(H.ctx, oomb_permute(H.ctx, m, 1, 2, 0, 3))));
    }
}

TEST(Grad, TransposeAndCont) {
    { Harness H; H.check(oomb_cont(H.ctx, oomb_transpose(H.ctx, H.param("x", {5, 3})))); }
    { // cont_4d with a new shape from a transposed source
        Harness H;
        H.check(oomb_cont_4d(H.ctx, oomb_transpose(H.ctx, H.param("x", {4, 6})), 3, 2, 4, 1));
    }
    { // cont of a bf16 parameter (the gradient is f32)
        Harness H;
        H.grid = true;
        oomb_tensor * c = oomb_cont(H.ctx, oomb_transpose(H.ctx, H.param("x", {4, 3}, OOMB_TYPE_BF16)));
        H.check(oomb_cast(H.ctx, c, OOMB_TYPE_F32));
    }
}

TEST(Grad, CpyAndCast) {
    { // f32 -> f32 buffer of another shape
        Harness H;
        oomb_tensor * buf = H.tensor("buf", {6, 4});
        H.check(oomb_cpy(H.ctx, oomb_silu(H.ctx, H.param("x", {4, 6})), buf));
    }
    { // f32 -> bf16 buffer (on the 1/64 grid the copy is exact), back to f32
        Harness H;
        H.grid = true;
        oomb_tensor * buf = H.tensor("buf", {24}, OOMB_TYPE_BF16);
        H.check(oomb_cast(H.ctx, oomb_cpy(H.ctx, H.param("x", {4, 6}), buf), OOMB_TYPE_F32));
    }
    { // bf16 parameter copied into an f32 buffer (a transposed view of it)
        Harness H;
        H.grid = true;
        oomb_tensor * buf = H.tensor("buf", {5, 3});
        oomb_tensor * c = oomb_cpy(H.ctx, H.param("x", {3, 5}, OOMB_TYPE_BF16), oomb_transpose(H.ctx, buf));
        H.check(oomb_mul(H.ctx, c, H.input("w", {3, 5})));
    }
    { // casts both ways, f16 too
        Harness H;
        H.grid = true;
        oomb_tensor * x = H.param("x", {5, 4});
        oomb_tensor * h16 = oomb_cast(H.ctx, x, OOMB_TYPE_F16);
        oomb_tensor * w = H.param("w", {5, 4}, OOMB_TYPE_BF16);
        H.check(oomb_mul(H.ctx, oomb_cast(H.ctx, h16, OOMB_TYPE_F32), oomb_cast(H.ctx, w, OOMB_TYPE_F32)));
    }
}

TEST(Grad, FillHasNoGradient) {
    Harness H;
    oomb_tensor * x = H.param("x", {4, 3});
    H.check(oomb_add(H.ctx, oomb_mul(H.ctx, x, oomb_fill(H.ctx, 4, 3, 1, 1, 2.5f)), oomb_fill(H.ctx, 4, 1, 1, 1, -1.0f)));
}

// ---------------------------------------------------------------------------------------------
// neural-network ops
// ---------------------------------------------------------------------------------------------

TEST(Grad, GetRows) {
    { Harness H; H.check(oomb_get_rows(H.ctx, H.param("table", {5, 8}), H.ids("ids", {3, 0, 7, 3, 3, 1}, 6))); }
    { // 2-D ids
        Harness H;
        H.check(oomb_get_rows(H.ctx, H.param("table", {4, 6}), H.ids("ids", {5, 1, 1, 0, 2, 5, 4, 4, 3, 0, 2, 2}, 4, 3)));
    }
    { // bf16 table: the gradient is f32
        Harness H;
        H.grid = true;
        oomb_tensor * r = oomb_get_rows(H.ctx, H.param("table", {6, 5}, OOMB_TYPE_BF16), H.ids("ids", {4, 4, 0, 2}, 4));
        H.check(oomb_mul(H.ctx, r, H.param("w", {6, 4})));
    }
}

// A frozen block-type (quantized) a: the gradient of b (through the autodiff's
// mul_mat(transpose(a), dy), computed by tiles of dequantized rows) against finite differences.
TEST(Grad, MulMatQuantizedA) {
    for (oomb_type t : {OOMB_TYPE_Q8_0, OOMB_TYPE_Q4_1, OOMB_TYPE_Q4_K, OOMB_TYPE_Q6_K}) {
        SCOPED_TRACE(oomb_type_name(t));
        Harness H;
        const int64_t K = oomb_blck_size(t) == 256 ? 256 : 64;
        oomb_tensor * a = H.tensor("wq", {K, 5}, t);
        oombtest::fill_random_blocks(a, H.rng);
        H.check(oomb_mul_mat(H.ctx, a, H.param("b", {K, 3})));
    }
}

TEST(Grad, MulMat) {
    { Harness H; H.check(oomb_mul_mat(H.ctx, H.param("a", {6, 5}), H.param("b", {6, 7}))); }
    { Harness H; H.check(oomb_mul_mat(H.ctx, H.param("a", {4, 3, 2, 3}), H.param("b", {4, 5, 2, 3}))); }
    { // a broadcast over b's batch dims
        Harness H;
        H.check(oomb_mul_mat(H.ctx, H.param("a", {4, 3, 2, 1}), H.param("b", {4, 2, 4, 3})));
    }
    { Harness H; H.check(oomb_mul_mat(H.ctx, H.param("a", {3, 2, 1, 2}), H.param("b", {3, 4, 3, 4}))); }
    { // transposed a
        Harness H;
        H.check(oomb_mul_mat(H.ctx, oomb_transpose(H.ctx, H.param("at", {5, 6})), H.param("b", {6, 4})));
    }
    { // transposed b
        Harness H;
        H.check(oomb_mul_mat(H.ctx, H.param("a", {6, 5}), oomb_transpose(H.ctx, H.param("bt", {4, 6}))));
    }
    { // both transposed, batched
        Harness H;
        oomb_tensor * a = oomb_transpose(H.ctx, H.param("at", {3, 4, 2}));
        oomb_tensor * b = oomb_transpose(H.ctx, H.param("bt", {5, 4, 2}));
        H.check(oomb_mul_mat(H.ctx, a, b));
    }
    { // b a permuted view (the attention K^T Q pattern)
        Harness H;
        oomb_tensor * b = oomb_permute(H.ctx, H.param("x", {4, 3, 5}), 0, 2, 1, 3); // [4, 5, 3]
        H.check(oomb_mul_mat(H.ctx, H.param("a", {4, 6, 3}), b));
    }
    { // bf16 weight
        Harness H;
        H.grid = true;
        H.check(oomb_mul_mat(H.ctx, H.param("w", {6, 4}, OOMB_TYPE_BF16), H.param("x", {6, 3})));
    }
    { // a product of two op results
        Harness H;
        oomb_tensor * a = oomb_silu(H.ctx, H.param("a", {5, 4}));
        oomb_tensor * b = oomb_mul(H.ctx, H.param("b", {5, 3}), H.param("c", {5, 1}));
        H.check(oomb_mul_mat(H.ctx, a, b));
    }
}

TEST(Grad, RmsNorm) {
    { Harness H; H.check(oomb_rms_norm(H.ctx, H.param("x", {8, 5, 2}), 1e-6f)); }
    { // with a weight, like a model's norm layer; eps matters for small rows
        Harness H;
        oomb_tensor * n = oomb_rms_norm(H.ctx, H.param("x", {6, 4}, OOMB_TYPE_F32, -0.2f, 0.2f), 1e-2f);
        H.check(oomb_mul(H.ctx, n, H.param("w", {6, 1})));
    }
    { // non-contiguous input (a view with an offset)
        Harness H;
        oomb_tensor * x = H.param("x", {9, 4});
        H.check(oomb_rms_norm(H.ctx, oomb_view_2d(H.ctx, x, 7, 3, x->nb[1], 2 * sizeof(float) + x->nb[1]), 1e-5f));
    }
}

// rms_norm_mul (the weighted norm in one node; its backward one rms_norm_mul_back node): x and w
// trainable (dx and dw packed), w frozen (dx alone), x frozen (dw), odd row lengths, a view as x.
TEST(Grad, RmsNormMul) {
    { Harness H; H.check(oomb_rms_norm_mul(H.ctx, H.param("x", {8, 5, 2}), H.param("w", {8}), 1e-6f)); }
    { // small rows where eps matters, w given as [ne0, 1]
        Harness H;
        H.check(oomb_rms_norm_mul(H.ctx, H.param("x", {6, 4}, OOMB_TYPE_F32, -0.2f, 0.2f), H.param("w", {6, 1}), 1e-2f));
    }
    { Harness H; H.check(oomb_rms_norm_mul(H.ctx, H.param("x", {7, 3}), H.input("w", {7}), 1e-5f)); }   // w frozen
    { Harness H; H.check(oomb_rms_norm_mul(H.ctx, H.input("x", {5, 9}), H.param("w", {5}), 1e-5f)); }   // x frozen
    { // non-contiguous x (a view with an offset), and x read again after the norm
        Harness H;
        oomb_tensor * x = H.param("x", {9, 4});
        oomb_tensor * v = oomb_view_2d(H.ctx, x, 7, 3, x->nb[1], 2 * sizeof(float) + x->nb[1]);
        H.check(oomb_add(H.ctx, oomb_rms_norm_mul(H.ctx, v, H.param("w", {7}), 1e-5f), oomb_scale(H.ctx, v, 0.5f)));
    }
    { // one row
        Harness H;
        H.check(oomb_rms_norm_mul(H.ctx, H.param("x", {11}), H.param("w", {11}), 1e-6f));
    }
}

TEST(Grad, Rope) {
    { // full rotation
        Harness H;
        H.check(oomb_rope(H.ctx, H.param("x", {8, 3, 5, 2}), H.ids("pos", {3, 0, 7, 2, 11}, 5), 8, 10000.0f));
    }
    { // n_dims < head_dim: the last dimensions pass through
        Harness H;
        H.check(oomb_rope(H.ctx, H.param("x", {8, 2, 4}), H.ids("pos", {5, 1, 2, 9}, 4), 4, 100.0f));
    }
    { // on a permuted (non-contiguous) input
        Harness H;
        oomb_tensor * x = oomb_permute(H.ctx, H.param("x", {6, 4, 2}), 0, 2, 1, 3); // [6, 2, 4]
        H.check(oomb_rope(H.ctx, x, H.ids("pos", {4, 0, 2, 1}, 4), 4, 10000.0f));
    }
    { // on a projection reshaped to heads
        Harness H;
        oomb_tensor * x = oomb_mul_mat(H.ctx, H.param("w", {3, 12}), H.param("h", {3, 4})); // [12, 4]
        oomb_tensor * xh = oomb_reshape_3d(H.ctx, x, 6, 2, 4);
        H.check(oomb_rope(H.ctx, xh, H.ids("pos", {0, 1, 2, 3}, 4), 6, 10000.0f));
    }
}

// rope_ext with random frequency factors (an input: the factors get no gradient), full and partial
// rotation, odd token counts.
TEST(Grad, RopeFreqFactors) {
    { // full rotation
        Harness H;
        oomb_tensor * ff = H.input("ff", {4}, 1.0f, 32.0f);
        H.check(oomb_rope_ext(H.ctx, H.param("x", {8, 3, 5, 2}), H.ids("pos", {3, 0, 7, 2, 11}, 5), 8, 10000.0f, ff));
    }
    { // n_dims < head_dim: the last dimensions pass through
        Harness H;
        oomb_tensor * ff = H.input("ff", {3}, 0.5f, 8.0f);
        H.check(oomb_rope_ext(H.ctx, H.param("x", {10, 2, 3}), H.ids("pos", {5, 1, 9}, 3), 6, 100.0f, ff));
    }
    { // on a projection reshaped to heads, factors shared by q and k as in a model
        Harness H;
        oomb_tensor * ff = H.input("ff", {3}, 1.0f, 8.0f);
        oomb_tensor * pos = H.ids("pos", {0, 4, 2}, 3);
        oomb_tensor * x = oomb_mul_mat(H.ctx, H.param("w", {3, 12}), H.param("h", {3, 3})); // [12, 3]
        oomb_tensor * q = oomb_rope_ext(H.ctx, oomb_reshape_3d(H.ctx, x, 6, 2, 3), pos, 6, 10000.0f, ff);
        oomb_tensor * k = oomb_rope_ext(H.ctx, oomb_reshape_3d(H.ctx, x, 6, 2, 3), pos, 6, 10000.0f, ff);
        H.check(oomb_mul(H.ctx, q, k));
    }
}

TEST(Grad, SoftMax) {
    { Harness H; H.check(oomb_soft_max(H.ctx, H.param("x", {7, 5, 2}, OOMB_TYPE_F32, -2, 2), 0.7f, -1)); }
    { // causal mask, more keys than queries
        Harness H;
        H.check(oomb_soft_max(H.ctx, H.param("x", {7, 5, 2}, OOMB_TYPE_F32, -2, 2), 1.3f, 2));
    }
    { // causal square
        Harness H;
        H.check(oomb_soft_max(H.ctx, H.param("x", {5, 5}, OOMB_TYPE_F32, -2, 2), 1.0f, 0));
    }
    { // permuted input
        Harness H;
        oomb_tensor * x = oomb_permute(H.ctx, H.param("x", {4, 6, 2}, OOMB_TYPE_F32, -2, 2), 1, 0, 2, 3); // [6, 4, 2]
        H.check(oomb_soft_max(H.ctx, x, 0.5f, 2));
    }
}

TEST(Grad, Attn) {
    struct Cfg { int64_t D, H, Hkv, T, S, B; };
    for (Cfg c : {Cfg{4, 4, 2, 3, 5, 2}, Cfg{4, 4, 2, 4, 4, 1}, Cfg{3, 2, 2, 2, 3, 1}, Cfg{4, 4, 1, 1, 3, 1}}) {
        SCOPED_TRACE("D=" + std::to_string(c.D) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
                     " T=" + std::to_string(c.T) + " S=" + std::to_string(c.S) + " B=" + std::to_string(c.B));
        Harness H;
        oomb_tensor * q = H.param("q", {c.D, c.H, c.T, c.B}, OOMB_TYPE_F32, -1.5f, 1.5f);
        oomb_tensor * k = H.param("k", {c.D, c.Hkv, c.S, c.B}, OOMB_TYPE_F32, -1.5f, 1.5f);
        oomb_tensor * v = H.param("v", {c.D, c.Hkv, c.S, c.B});
        H.check(oomb_attn(H.ctx, q, k, v, 1.0f / std::sqrt((float) c.D)));
    }
    { // q from a projection, k / v from views of one fused tensor
        Harness H;
        oomb_tensor * q = oomb_reshape_3d(H.ctx, oomb_mul_mat(H.ctx, H.param("wq", {3, 8}), H.param("x", {3, 3})), 4, 2, 3);
        oomb_tensor * kv = H.param("kv", {4, 2, 3});
        oomb_tensor * k = oomb_view_3d(H.ctx, kv, 4, 1, 3, kv->nb[1], kv->nb[2], 0);
        oomb_tensor * v = oomb_view_3d(H.ctx, kv, 4, 1, 3, kv->nb[1], kv->nb[2], kv->nb[1]);
        H.check(oomb_attn(H.ctx, q, k, v, 0.5f));
    }
}

// Attention over a paged KV cache: the chunk's K/V are stored at pos (after a history of earlier
// positions already in the pages), dq / dk_cur / dv_cur come back through the gradient pages.
TEST(Grad, PagedAttn) {
    for (oomb_type kv_type : {OOMB_TYPE_F32, OOMB_TYPE_BF16}) {
        SCOPED_TRACE(oomb_type_name(kv_type));
        Harness H;
        H.grid = kv_type != OOMB_TYPE_F32; // K/V stored in bf16 exactly
        const int64_t D = 4, NH = 4, NKV = 2, T = 3;
        oomb_kv_cache_params kp{};
        kp.n_layer = 1; kp.n_head_kv = (int) NKV; kp.head_dim = (int) D; kp.page_size = 2; kp.max_tokens = 8;
        kp.type = kv_type; kp.with_grad = true;
        oomb_kv_cache_t kv = oomb_kv_cache_init(cpu(), kp);
        ASSERT_NE(kv, nullptr);
        oomb_kv_cache_reserve(kv, 6);
        oomb_tensor * k_pages = oomb_kv_cache_k(kv, 0), * v_pages = oomb_kv_cache_v(kv, 0);
        H.fill(k_pages); // the history (positions 0..2) and whatever else
        H.fill(v_pages);
        k_pages->grad = oomb_kv_cache_dk(kv, 0);
        v_pages->grad = oomb_kv_cache_dv(kv, 0);
        H.extra_zero = {k_pages->grad, v_pages->grad};
        oomb_tensor * q = H.param("q", {D, NH, T}, OOMB_TYPE_F32, -1.5f, 1.5f);
        oomb_tensor * kc = H.param("k_cur", {D, NKV, T}, OOMB_TYPE_F32, -1.5f, 1.5f);
        oomb_tensor * vc = H.param("v_cur", {D, NKV, T});
        oomb_tensor * pos = H.ids("pos", {3, 4, 5}, T);
        H.check(oomb_paged_attn(H.ctx, q, kc, vc, k_pages, v_pages, oomb_kv_cache_page_table(kv), pos, 0.5f, 1));

        // without gradient pages on the pools: the documented error
        k_pages->grad = nullptr;
        oomb_tensor * out = oomb_paged_attn(H.ctx, q, kc, vc, k_pages, v_pages, oomb_kv_cache_page_table(kv), pos, 0.5f, 1);
        oomb_tensor * loss = oomb_sum(H.ctx, out);
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, loss);
        EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, nullptr), "gradient pages");
        oomb_kv_cache_free(kv);
    }
}

// paged_attn returns a view of its packed node (out, then the LSE of each row). The gradient of the
// whole out view is the backward's dout directly; other views of the packed node (inside out) go
// through the generic scatter; both at once add up. A gradient into the saved LSE is an error.
TEST(Grad, PagedAttnViews) {
    const int64_t D = 4, NH = 4, NKV = 2, T = 3;
    for (int variant = 0; variant < 3; variant++) {
        SCOPED_TRACE("variant " + std::to_string(variant));
        Harness H;
        oomb_kv_cache_params kp{};
        kp.n_layer = 1; kp.n_head_kv = (int) NKV; kp.head_dim = (int) D; kp.page_size = 2; kp.max_tokens = 8;
        kp.type = OOMB_TYPE_F32; kp.with_grad = true;
        oomb_kv_cache_t kv = oomb_kv_cache_init(cpu(), kp);
        ASSERT_NE(kv, nullptr);
        oomb_kv_cache_reserve(kv, 6);
        oomb_tensor * k_pages = oomb_kv_cache_k(kv, 0), * v_pages = oomb_kv_cache_v(kv, 0);
        H.fill(k_pages);
        H.fill(v_pages);
        k_pages->grad = oomb_kv_cache_dk(kv, 0);
        v_pages->grad = oomb_kv_cache_dv(kv, 0);
        H.extra_zero = {k_pages->grad, v_pages->grad};
        oomb_tensor * q = H.param("q", {D, NH, T}, OOMB_TYPE_F32, -1.5f, 1.5f);
        oomb_tensor * kc = H.param("k_cur", {D, NKV, T}, OOMB_TYPE_F32, -1.5f, 1.5f);
        oomb_tensor * vc = H.param("v_cur", {D, NKV, T});
        oomb_tensor * pos = H.ids("pos", {3, 4, 5}, T);
        oomb_tensor * out = oomb_paged_attn(H.ctx, q, kc, vc, k_pages, v_pages, oomb_kv_cache_page_table(kv), pos, 0.5f, 1);
        oomb_tensor * packed = out->view_src;
        const size_t nb1 = sizeof(float) * D, nb2 = nb1 * NH;
        if (variant == 0) {
            // tokens 1.. of the packed node's out part: generic scatter only
            H.check(oomb_view_3d(H.ctx, packed, D, NH, T - 1, nb1, nb2, nb2));
        } else if (variant == 1) {
            // out * (token 0 of out, read through the packed node): the out view and a scatter
            oomb_tensor * first = oomb_view_3d(H.ctx, packed, D, NH, 1, nb1, nb2, 0);
            H.check(oomb_mul(H.ctx, out, oomb_repeat(H.ctx, first, out)));
        } else {
            // the saved LSE [H, T] after out: not differentiable
            oomb_tensor * lse = oomb_view_2d(H.ctx, packed, NH, T, sizeof(float) * NH, sizeof(float) * D * NH * T);
            oomb_tensor * loss = oomb_sum(H.ctx, oomb_add(H.ctx, lse, oomb_reshape_2d(H.ctx, oomb_cont(H.ctx, oomb_view_3d(H.ctx, out, 1, NH, T, nb1, nb2, 0)), NH, T)));
            oomb_cgraph * g = oomb_new_graph(H.ctx);
            oomb_build_forward_expand(g, loss);
            const int n0 = oomb_graph_n_nodes(g);
            EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, nullptr), "saved log-sum-exp");
            EXPECT_EQ(oomb_graph_n_nodes(g), n0) << "the error comes before the graph changes";
        }
        oomb_kv_cache_free(kv);
    }
}

// Chunk-recurrent use of paged_attn: the sequence in two chunks, each chunk's K/V stored by a forward
// pass, then the chunks' backward graphs (recomputing with store = 0) run in reverse order; the
// gradient pages carry the later chunk's dK/dV into the earlier one. The accumulated parameter
// gradients equal those of dense attention over the whole sequence.
TEST(Grad, PagedAttnChunkedMatchesDense) {
    Harness H;
    const int64_t D = 4, NH = 4, NKV = 2, S = 6, C = 3;
    const float scale = 0.5f;
    oomb_tensor * q = H.param("q", {D, NH, S}, OOMB_TYPE_F32, -1.5f, 1.5f);
    oomb_tensor * k = H.param("k", {D, NKV, S}, OOMB_TYPE_F32, -1.5f, 1.5f);
    oomb_tensor * v = H.param("v", {D, NKV, S});
    oomb_tensor * R = H.input("R", {D, NH, S});

    // dense reference
    oomb_tensor * loss = oomb_sum(H.ctx, oomb_mul(H.ctx, oomb_attn(H.ctx, q, k, v, scale), R));
    oomb_cgraph * g = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(H.ctx, g, loss, nullptr);
    H.zero_grads();
    oomb_backend_graph_compute(cpu(), g);
    std::vector<std::vector<double>> ref;
    for (oomb_tensor * p : H.params) ref.push_back(oombtest::to_vector(p->grad));

    oomb_kv_cache_params kp{};
    kp.n_layer = 1; kp.n_head_kv = (int) NKV; kp.head_dim = (int) D; kp.page_size = 2; kp.max_tokens = S;
    kp.type = OOMB_TYPE_F32; kp.with_grad = true;
    oomb_kv_cache_t kv = oomb_kv_cache_init(cpu(), kp);
    ASSERT_NE(kv, nullptr);
    oomb_kv_cache_reserve(kv, S);
    oomb_tensor * k_pages = oomb_kv_cache_k(kv, 0), * v_pages = oomb_kv_cache_v(kv, 0);
    k_pages->grad = oomb_kv_cache_dk(kv, 0);
    v_pages->grad = oomb_kv_cache_dv(kv, 0);
    oomb_tensor * pt = oomb_kv_cache_page_table(kv);

    std::vector<oomb_cgraph *> fwd, bwd;
    for (int64_t c = 0; c < S / C; c++) {
        auto chunk = [&](oomb_tensor * t) {
            return oomb_view_3d(H.ctx, t, t->ne[0], t->ne[1], C, t->nb[1], t->nb[2], (size_t) (c * C) * t->nb[2]);
        };
        std::vector<int32_t> pv;
        for (int64_t i = 0; i < C; i++) pv.push_back((int32_t) (c * C + i));
        oomb_tensor * pos = H.ids("pos", pv, C);
        oomb_tensor * o1 = oomb_paged_attn(H.ctx, chunk(q), chunk(k), chunk(v), k_pages, v_pages, pt, pos, scale, 1);
        fwd.push_back(oomb_new_graph(H.ctx));
        oomb_build_forward_expand(fwd.back(), o1);
        oomb_tensor * o2 = oomb_paged_attn(H.ctx, chunk(q), chunk(k), chunk(v), k_pages, v_pages, pt, pos, scale, 0);
        oomb_tensor * l2 = oomb_sum(H.ctx, oomb_mul(H.ctx, o2, chunk(R)));
        bwd.push_back(oomb_new_graph(H.ctx));
        oomb_build_forward_expand(bwd.back(), l2);
        oomb_build_backward_expand(H.ctx, bwd.back(), l2, nullptr);
    }
    H.zero_grads();
    oomb_kv_cache_zero_grad(kv);
    for (oomb_cgraph * f : fwd) oomb_backend_graph_compute(cpu(), f);
    for (auto it = bwd.rbegin(); it != bwd.rend(); ++it) oomb_backend_graph_compute(cpu(), *it);
    for (size_t i = 0; i < H.params.size(); i++) {
        EXPECT_LT(rel_err(oombtest::to_vector(H.params[i]->grad), ref[i]), 1e-5) << H.params[i]->name;
    }
    oomb_kv_cache_free(kv);
}

TEST(Grad, CrossEntropy) {
    { // one ignored label
        Harness H;
        H.check(oomb_cross_entropy_loss(H.ctx, H.param("logits", {6, 5}, OOMB_TYPE_F32, -2, 2), H.ids("labels", {2, -100, 5, 0, 2}, 5), -100));
    }
    { // 3-D logits, ignore index inside the vocabulary range
        Harness H;
        H.check(oomb_cross_entropy_loss(H.ctx, H.param("logits", {5, 4, 2}, OOMB_TYPE_F32, -2, 2),
                                        H.ids("labels", {1, 4, 3, 3, 0, 1, 2, 4}, 8), 3));
    }
    { // logits from a tied-embedding head (get_rows + mul_mat share the table)
        Harness H;
        oomb_tensor * emb = H.param("emb", {4, 7});
        oomb_tensor * h = oomb_get_rows(H.ctx, emb, H.ids("tok", {1, 6, 3}, 3));
        oomb_tensor * logits = oomb_mul_mat(H.ctx, emb, oomb_rms_norm(H.ctx, h, 1e-5f));
        H.check(oomb_cross_entropy_loss(H.ctx, logits, H.ids("labels", {6, 3, 0}, 3), -1));
    }
}

// Fused LM head + loss over vocabulary tiles: dx and dw through autodiff (the backward reads the
// forward's log-sum-exp tail), with tiles forcing several steps (the last one short), bf16 heads,
// ignored labels, 3-D x, a tied embedding, and a frozen head / frozen input.
oomb_tensor * lce(Harness & H, oomb_tensor * w, oomb_tensor * x, oomb_tensor * labels, int32_t ignore, int64_t tile) {
    oomb_tensor * l = oomb_linear_cross_entropy(H.ctx, w, x, labels, ignore);
    oomb_linear_cross_entropy_set_tile(l, tile);
    return l;
}

// The linear_cross_entropy_back nodes appended to g.
std::vector<oomb_tensor *> lce_back_nodes(oomb_cgraph * g) {
    std::vector<oomb_tensor *> r;
    for (int i = 0; i < oomb_graph_n_nodes(g); i++) {
        if (oomb_graph_node(g, i)->op == OOMB_OP_LINEAR_CROSS_ENTROPY_BACK) r.push_back(oomb_graph_node(g, i));
    }
    return r;
}

TEST(Grad, LinearCrossEntropy) {
    { // several tiles (4 + 4 + 4 + 1 classes), one ignored label
        Harness H;
        H.check(lce(H, H.param("w", {5, 13}), H.param("x", {5, 4}, OOMB_TYPE_F32, -2, 2), H.ids("labels", {12, -100, 0, 7}, 4), -100, 4));
    }
    { // one tile holds every class; N = 1
        Harness H;
        H.check(lce(H, H.param("w", {6, 9}), H.param("x", {6, 1}), H.ids("labels", {3}, 1), -100, 0));
    }
    { // bf16 head (values on the bf16 grid), 3-D x, ignore index inside [0, V)
        Harness H;
        H.grid = true;
        oomb_tensor * w = H.param("w", {4, 11}, OOMB_TYPE_BF16);
        oomb_tensor * x = H.param("x", {4, 3, 2});
        H.check(lce(H, w, x, H.ids("labels", {1, 2, 10, 2, 0, 5}, 6), 2, 3));
    }
    { // tied embedding: the table is both the input (get_rows) and the head
        Harness H;
        oomb_tensor * emb = H.param("emb", {4, 7});
        oomb_tensor * h = oomb_rms_norm(H.ctx, oomb_get_rows(H.ctx, emb, H.ids("tok", {1, 6, 3}, 3)), 1e-5f);
        H.check(lce(H, emb, h, H.ids("labels", {6, 3, 0}, 3), -1, 2));
    }
}

TEST(Grad, LinearCrossEntropyComputesOnlyTheNeededGradients) {
    { // frozen head: dx only, no [E, V] buffer
        Harness H;
        oomb_tensor * w = H.input("w", {5, 13});
        oomb_tensor * x = H.param("x", {5, 4}, OOMB_TYPE_F32, -2, 2);
        oomb_tensor * l = lce(H, w, x, H.ids("labels", {12, -100, 0, 7}, 4), -100, 4);
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, l);
        oomb_build_backward_expand(H.ctx, g, l, nullptr);
        const std::vector<oomb_tensor *> b = lce_back_nodes(g);
        ASSERT_EQ(b.size(), 1u);
        EXPECT_EQ(b[0]->op_params[2], OOMB_LCE_GRAD_X);
        EXPECT_EQ(oomb_nelements(b[0]), 5 * 4);
        EXPECT_EQ(b[0]->op_params[1], 4) << "the backward inherits the forward's tile";
        ASSERT_NE(b[0]->src[4], nullptr) << "the backward reads the forward's log-sum-exp";
        EXPECT_EQ(b[0]->src[4]->view_src, l->view_src);
        Harness H2;
        H2.check(lce(H2, H2.input("w", {5, 13}), H2.param("x", {5, 4}, OOMB_TYPE_F32, -2, 2), H2.ids("labels", {12, -100, 0, 7}, 4), -100, 4));
    }
    { // frozen input: dw only
        Harness H;
        oomb_tensor * w = H.param("w", {5, 13}, OOMB_TYPE_BF16);
        oomb_tensor * x = H.input("x", {5, 4}, -2, 2);
        oomb_tensor * l = lce(H, w, x, H.ids("labels", {12, -100, 0, 7}, 4), -100, 5);
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, l);
        oomb_build_backward_expand(H.ctx, g, l, nullptr);
        const std::vector<oomb_tensor *> b = lce_back_nodes(g);
        ASSERT_EQ(b.size(), 1u);
        EXPECT_EQ(b[0]->op_params[2], OOMB_LCE_GRAD_W);
        EXPECT_EQ(oomb_nelements(b[0]), 5 * 13);
        Harness H2;
        H2.grid = true;
        H2.check(lce(H2, H2.param("w", {5, 13}, OOMB_TYPE_BF16), H2.input("x", {5, 4}, -2, 2), H2.ids("labels", {12, -100, 0, 7}, 4), -100, 5));
    }
}

// The fused loss equals mul_mat + cross_entropy_loss, gradients included, through a graph planned by
// the graph allocator (the packed node's tail must outlive the forward until the backward reads it).
TEST(Grad, LinearCrossEntropyMatchesUnfusedWithGraphAllocator) {
    const int64_t E = 6, V = 23, N = 5;
    std::vector<std::vector<double>> grads[2];
    double loss[2][2];
    for (int fused = 0; fused < 2; fused++) {
        Harness H(99);
        oomb_tensor * w = H.param("w", {E, V}, OOMB_TYPE_F32, -1, 1);
        oomb_tensor * emb = H.param("emb", {E, 9}, OOMB_TYPE_F32, -1, 1);
        oomb_context * gctx = oomb_init({0, true});
        oomb_tensor * tok = H.ids("tok", {1, 8, 3, 3, 0}, N);
        oomb_tensor * lab = H.ids("lab", {22, 0, -100, 7, 11}, N);
        oomb_tensor * x = oomb_silu(gctx, oomb_get_rows(gctx, emb, tok));
        oomb_tensor * l = fused ? oomb_linear_cross_entropy(gctx, w, x, lab, -100)
                                : oomb_cross_entropy_loss(gctx, oomb_mul_mat(gctx, w, x), lab, -100);
        if (fused) oomb_linear_cross_entropy_set_tile(l, 7);
        oomb_set_loss(l);
        oomb_set_output(l);
        oomb_cgraph * g = oomb_new_graph(gctx);
        oomb_build_forward_expand(g, l);
        oomb_build_backward_expand(gctx, g, l, nullptr);
        oomb_gallocr_t ga = oomb_gallocr_new(cpu());
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
        H.zero_grads();
        oomb_backend_graph_compute(cpu(), g);
        float lv[2];
        oomb_tensor_get(l, lv, 0, sizeof(lv));
        loss[fused][0] = lv[0];
        loss[fused][1] = lv[1];
        for (oomb_tensor * p : H.params) grads[fused].push_back(oombtest::to_vector(p->grad));
        oomb_gallocr_free(ga);
        oomb_free(gctx);
    }
    EXPECT_NEAR(loss[1][0], loss[0][0], 1e-5 * std::fabs(loss[0][0]));
    EXPECT_EQ(loss[1][1], 4.0);
    EXPECT_EQ(loss[0][1], 4.0);
    for (size_t i = 0; i < grads[0].size(); i++) EXPECT_LT(rel_err(grads[1][i], grads[0][i]), 1e-5) << "param " << i;
}

// ---------------------------------------------------------------------------------------------
// a whole block: embedding, norm, attention with RoPE and GQA, SwiGLU MLP, residuals, loss
// ---------------------------------------------------------------------------------------------

// Builds a tiny transformer block over ctx; params are created through H.
static oomb_tensor * build_block(Harness & H, oomb_context * gctx) {
    const int64_t E = 8, V = 11, T = 5, D = 4, NH = 2, NKV = 1, F = 6;
    oomb_tensor * emb = H.param("emb", {E, V}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * wn = H.param("norm", {E}, OOMB_TYPE_F32, 0.5f, 1.5f);
    oomb_tensor * wq = H.param("wq", {E, D * NH}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * wkv = H.param("wkv", {E, 2 * D * NKV}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * wo = H.param("wo", {D * NH, E}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * wg = H.param("wg", {E, F}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * wu = H.param("wu", {E, F}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * wd = H.param("wd", {F, E}, OOMB_TYPE_F32, -0.5f, 0.5f);
    oomb_tensor * tok = H.ids("tok", {1, 4, 4, 9, 0}, T);
    oomb_tensor * pos = H.ids("pos", {0, 1, 2, 3, 4}, T);
    oomb_tensor * lab = H.ids("lab", {4, 4, 9, -1, 2}, T);
    oomb_context * c = gctx;
    oomb_tensor * x = oomb_get_rows(c, emb, tok);                                         // [E, T]
    oomb_tensor * hn = oomb_mul(c, oomb_rms_norm(c, x, 1e-5f), wn);
    oomb_tensor * q = oomb_reshape_3d(c, oomb_mul_mat(c, wq, hn), D, NH, T);
    oomb_tensor * kv = oomb_mul_mat(c, wkv, hn);                                          // [2*D*NKV, T]
    oomb_tensor * k = oomb_view_3d(c, kv, D, NKV, T, D * sizeof(float), kv->nb[1], 0);
    oomb_tensor * v = oomb_cont(c, oomb_view_3d(c, kv, D, NKV, T, D * sizeof(float), kv->nb[1], D * NKV * sizeof(float)));
    q = oomb_rope(c, q, pos, D, 10000.0f);
    k = oomb_rope(c, oomb_cont(c, k), pos, D, 10000.0f);
    oomb_tensor * a = oomb_reshape_2d(c, oomb_attn(c, q, k, v, 0.5f), D * NH, T);
    x = oomb_add(c, x, oomb_mul_mat(c, wo, a));
    oomb_tensor * h2 = oomb_rms_norm(c, x, 1e-5f);
    oomb_tensor * m = oomb_swiglu(c, oomb_mul_mat(c, wg, h2), oomb_mul_mat(c, wu, h2));
    x = oomb_add(c, x, oomb_mul_mat(c, wd, m));
    oomb_tensor * logits = oomb_mul_mat(c, emb, x);                                       // tied head [V, T]
    return oomb_cross_entropy_loss(c, logits, lab, -1);
}

TEST(Grad, TransformerBlock) {
    Harness H(77);
    H.check(build_block(H, H.ctx));
}

// Builds the loss twice from params of one seed: in the host context (computed directly) and in a
// no_alloc context whose forward + backward graph the graph allocator plans; the planned graph's
// gradients, over two runs, match the host-context ones (in-place reuse and lifetimes respect the
// backward's scatter nodes and packed gradients).
template <typename Build> void expect_allocator_matches_host(uint32_t seed, Build build) {
    Harness H(seed);
    oomb_tensor * loss_ref = build(H, H.ctx);
    oomb_cgraph * g_ref = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g_ref, loss_ref);
    oomb_build_backward_expand(H.ctx, g_ref, loss_ref, nullptr);
    H.zero_grads();
    oomb_backend_graph_compute(cpu(), g_ref);
    std::vector<std::vector<double>> ref;
    for (oomb_tensor * p : H.params) ref.push_back(oombtest::to_vector(p->grad));

    Harness H2(seed);  // second copy of the graph over the same parameters
    oomb_context * gctx = oomb_init({0, true});
    oomb_tensor * loss = build(H2, gctx);
    oomb_set_loss(loss);
    oomb_set_output(loss);
    oomb_cgraph * g = oomb_new_graph(gctx);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(gctx, g, loss, nullptr);
    oomb_gallocr_t ga = oomb_gallocr_new(cpu());
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    for (int rep = 0; rep < 2; rep++) {
        H2.zero_grads();
        oomb_backend_graph_compute(cpu(), g);
        for (size_t i = 0; i < H2.params.size(); i++) {
            const std::vector<double> gi = oombtest::to_vector(H2.params[i]->grad);
            EXPECT_LT(rel_err(gi, ref[i]), 1e-5) << H2.params[i]->name << " rep " << rep;
        }
    }
    oomb_gallocr_free(ga);
    oomb_free(gctx);
}

// The same block with its graph in a no_alloc context planned by the graph allocator.
TEST(Grad, TransformerBlockWithGraphAllocator) { expect_allocator_matches_host(77, build_block); }

// ---------------------------------------------------------------------------------------------
// seeds, accumulation, zeroing, errors, negative control
// ---------------------------------------------------------------------------------------------

TEST(Grad, ExplicitSeed) {
    // d/dx of sum(y * S) through a seed S on the multi-element "loss" y equals the gradient of the
    // scalar loss sum(y * S).
    Harness H;
    oomb_tensor * x = H.param("x", {5, 3});
    oomb_tensor * w = H.param("w", {5, 1});
    oomb_tensor * y = oomb_silu(H.ctx, oomb_mul(H.ctx, x, w));
    oomb_tensor * S = H.input("seed", {5, 3});
    oomb_cgraph * g = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g, y);
    oomb_build_backward_expand(H.ctx, g, y, S);
    H.zero_grads();
    oomb_backend_graph_compute(cpu(), g);
    const std::vector<double> gx = oombtest::to_vector(x->grad), gw = oombtest::to_vector(w->grad);

    oomb_tensor * loss = oomb_sum(H.ctx, oomb_mul(H.ctx, y, S));
    oomb_cgraph * g2 = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g2, loss);
    oomb_build_backward_expand(H.ctx, g2, loss, nullptr);
    H.zero_grads();
    oomb_backend_graph_compute(cpu(), g2);
    EXPECT_LT(rel_err(gx, oombtest::to_vector(x->grad)), 1e-6);
    EXPECT_LT(rel_err(gw, oombtest::to_vector(w->grad)), 1e-6);

    // a scalar seed of 0.5 on a scalar loss halves the gradient
    oomb_tensor * half = H.input("half", {1});
    oomb_set_f32_1d(half, 0, 0.5f);
    oomb_cgraph * g3 = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g3, loss);
    oomb_build_backward_expand(H.ctx, g3, loss, half);
    H.zero_grads();
    oomb_backend_graph_compute(cpu(), g3);
    const std::vector<double> gx3 = oombtest::to_vector(x->grad);
    for (size_t i = 0; i < gx.size(); i++) EXPECT_NEAR(gx3[i], 0.5 * gx[i], 1e-6);
}

TEST(Grad, AccumulatesAcrossEvaluationsAndZeroingResets) {
    Harness H;
    oomb_tensor * a = H.param("a", {6, 4});
    oomb_tensor * b = H.param("b", {6, 3}, OOMB_TYPE_BF16);
    oomb_tensor * loss = oomb_sum_sq(H.ctx, oomb_mul_mat(H.ctx, oomb_transpose(H.ctx, oomb_cont(H.ctx, oomb_transpose(H.ctx, a))),
                                                         oomb_cast(H.ctx, b, OOMB_TYPE_F32)));
    oomb_cgraph * g = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(H.ctx, g, loss, nullptr);
    H.zero_grads();
    oomb_backend_graph_compute(cpu(), g);
    const std::vector<double> ga1 = oombtest::to_vector(a->grad), gb1 = oombtest::to_vector(b->grad);
    double na = 0;
    for (double v : ga1) na += v * v;
    ASSERT_GT(na, 1e-6);
    oomb_backend_graph_compute(cpu(), g);
    const std::vector<double> ga2 = oombtest::to_vector(a->grad), gb2 = oombtest::to_vector(b->grad);
    for (size_t i = 0; i < ga1.size(); i++) EXPECT_NEAR(ga2[i], 2 * ga1[i], 1e-5 * (1 + std::fabs(ga1[i])));
    for (size_t i = 0; i < gb1.size(); i++) EXPECT_NEAR(gb2[i], 2 * gb1[i], 1e-5 * (1 + std::fabs(gb1[i])));
    H.zero_grads();
    for (double v : oombtest::to_vector(a->grad)) ASSERT_EQ(v, 0.0);
    oomb_backend_graph_compute(cpu(), g);
    const std::vector<double> ga3 = oombtest::to_vector(a->grad);
    for (size_t i = 0; i < ga1.size(); i++) EXPECT_EQ(ga3[i], ga1[i]);
}

TEST(Grad, OnlyNeededBranchesAreDifferentiated) {
    // The backward adds nothing for a branch that does not depend on a parameter.
    Harness H;
    oomb_tensor * x = H.param("x", {4, 3});
    oomb_tensor * c = H.input("c", {4, 3});
    oomb_tensor * cc = oomb_silu(H.ctx, oomb_mul(H.ctx, c, c));    // constant branch
    oomb_tensor * loss = oomb_sum(H.ctx, oomb_mul(H.ctx, x, cc));
    oomb_cgraph * g = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g, loss);
    const int n_fwd = oomb_graph_n_nodes(g);
    oomb_build_backward_expand(H.ctx, g, loss, nullptr);
    for (int i = n_fwd; i < oomb_graph_n_nodes(g); i++) {
        const oomb_tensor * t = oomb_graph_node(g, i);
        EXPECT_NE(t->op, OOMB_OP_SILU_BACK) << "backward of the constant branch was built";
    }
    // seed fill, repeat of the seed, mul by cc, accumulation
    EXPECT_LE(oomb_graph_n_nodes(g) - n_fwd, 5);
    EXPECT_EQ(oomb_graph_node(g, -1)->op, OOMB_OP_ADD_INPLACE);
    EXPECT_EQ(oomb_graph_node(g, -1)->src[0], x->grad);

    // a loss without parameters: nothing is appended
    oomb_tensor * l2 = oomb_sum(H.ctx, cc);
    oomb_cgraph * g2 = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g2, l2);
    const int n2 = oomb_graph_n_nodes(g2);
    oomb_build_backward_expand(H.ctx, g2, l2, nullptr);
    EXPECT_EQ(oomb_graph_n_nodes(g2), n2);
}

TEST(Grad, GradientTensorsAreNamed) {
    Harness H;
    oomb_tensor * x = H.param("x", {4, 3});
    oomb_tensor * h = oomb_set_name(oomb_silu(H.ctx, x), "h");
    oomb_tensor * loss = oomb_set_name(oomb_sum(H.ctx, h), "loss");
    oomb_cgraph * g = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(H.ctx, g, loss, nullptr);
    bool found = false;
    for (int i = 0; i < oomb_graph_n_nodes(g); i++) {
        if (std::string(oomb_graph_node(g, i)->name) == "grad of x") found = true;
    }
    EXPECT_TRUE(found);
    EXPECT_NE(oomb_get_tensor(H.ctx, "grad of h"), nullptr);
}

TEST(Grad, Errors) {
    {
        Harness H;
        oomb_tensor * x = H.tensor("weight_without_grad", {4, 3});
        oomb_set_param(x);
        oomb_tensor * loss = oomb_sum(H.ctx, x);
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, loss);
        EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, nullptr),
                          "build_backward_expand: parameter 'weight_without_grad' has no gradient tensor; call oomb_new_grad");
    }
    { // a gradient path through a non-differentiable op
        Harness H;
        oomb_tensor * x = H.param("x", {4, 3});
        oomb_tensor * loss = oomb_sum(H.ctx, oomb_silu_back(H.ctx, x, H.input("dy", {4, 3})));
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, loss);
        const int n = oomb_graph_n_nodes(g);
        EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, nullptr), "silu_back");
        EXPECT_EQ(oomb_graph_n_nodes(g), n) << "the graph changed before the error";
    }
    { // through an optimizer step
        Harness H;
        oomb_tensor * x = H.param("x", {4});
        oomb_tensor * hp = H.input("hp", {3});
        oomb_tensor * loss = oomb_sum(H.ctx, oomb_sgd_step(H.ctx, x, x->grad, hp));
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, loss);
        EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, nullptr), "sgd_step");
    }
    { // the loss is not in the graph
        Harness H;
        oomb_tensor * x = H.param("x", {4});
        oomb_tensor * loss = oomb_sum(H.ctx, x);
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, nullptr), "not a node of the graph");
    }
    { // a seed of the wrong shape
        Harness H;
        oomb_tensor * x = H.param("x", {4});
        oomb_tensor * loss = oomb_sum(H.ctx, x);
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, loss);
        EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, loss, H.input("s", {2})), "seed");
    }
}

TEST(Grad, NegativeControl) {
    // The criterion rejects wrong gradients: a 10% scale error, a sign error in one row, and the
    // gradient of a wrongly-oriented mul_mat rule (dA^T for a square A) all fail it.
    Harness H;
    oomb_tensor * a = H.param("a", {5, 5});
    std::vector<ParamResult> r = H.check(oomb_mul_mat(H.ctx, a, H.input("b", {5, 4})));
    ASSERT_EQ(r.size(), 1u);
    const std::vector<double> & g = r[0].g, & fd = r[0].fd;
    std::vector<double> scaled = g, flipped = g, transposed = g;
    for (double & v : scaled) v *= 1.1;
    for (int i = 0; i < 5; i++) flipped[(size_t) i] = -flipped[(size_t) i];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) transposed[(size_t) (i * 5 + j)] = g[(size_t) (j * 5 + i)];
    EXPECT_LT(rel_err(g, fd), kTol);
    EXPECT_GT(rel_err(scaled, fd), kTol);
    EXPECT_GT(rel_err(flipped, fd), kTol);
    EXPECT_GT(rel_err(transposed, fd), kTol);
}

} // namespace

// The per-row log-sum-exp tail of linear_cross_entropy's node carries no gradient: a loss built on
// it (e.g. a z-loss, sum of lse^2) is refused when the backward is built, instead of its gradient
// being silently dropped (found by a review: relative errors 0.33-1.0 against finite differences).
TEST(Grad, LinearCrossEntropyLseTailIsNotDifferentiable) {
    Harness H;
    oomb_tensor * w = H.param("w", {5, 13}, OOMB_TYPE_F32);
    oomb_tensor * x = H.param("x", {5, 4}, OOMB_TYPE_F32, -2, 2);
    oomb_tensor * l = lce(H, w, x, H.ids("labels", {12, -100, 0, 7}, 4), -100, 4);
    ASSERT_NE(l->view_src, nullptr);
    oomb_tensor * tail = oomb_view_1d(H.ctx, l->view_src, 4, 2 * sizeof(float));
    oomb_tensor * zloss = oomb_add(H.ctx, oomb_view_1d(H.ctx, l, 1, 0), oomb_sum_sq(H.ctx, tail));
    oomb_cgraph * g = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g, zloss);
    const int n_before = oomb_graph_n_nodes(g);
    EXPECT_OOMB_ERROR(oomb_build_backward_expand(H.ctx, g, zloss, nullptr), "log-sum-exp carries no gradient");
    EXPECT_EQ(oomb_graph_n_nodes(g), n_before) << "the graph is left unchanged";
    // the { sum, count } head itself stays differentiable (a view of the sum element)
    oomb_tensor * head = oomb_view_1d(H.ctx, l, 1, 0);
    oomb_cgraph * g2 = oomb_new_graph(H.ctx);
    oomb_build_forward_expand(g2, head);
    oomb_build_backward_expand(H.ctx, g2, head, nullptr);
    EXPECT_GT(oomb_graph_n_nodes(g2), 3);
}

// ---- the fused swiglu backward (923d910; cases from a review) ----------------------------------------------
TEST(Grad, SwigluShapesViewsAndPartialNeeds) {
    { // 4-D, ne3 > 1 (the packed result is [.., 2*ne3]: the up half starts at slab ne3)
        Harness H;
        H.check(oomb_swiglu(H.ctx, H.param("gate", {4, 3, 2, 3}, OOMB_TYPE_F32, -3, 3), H.param("up", {4, 3, 2, 3})));
    }
    { // 1-D
        Harness H;
        H.check(oomb_swiglu(H.ctx, H.param("gate", {9}, OOMB_TYPE_F32, -3, 3), H.param("up", {9})));
    }
    { // up only
        Harness H;
        H.check(oomb_swiglu(H.ctx, H.input("gate", {5, 2, 1, 2}, -3, 3), H.param("up", {5, 2, 1, 2})));
    }
    { // gate only, 4-D
        Harness H;
        H.check(oomb_swiglu(H.ctx, H.param("gate", {5, 2, 1, 2}, OOMB_TYPE_F32, -3, 3), H.input("up", {5, 2, 1, 2})));
    }
    { // transposed gate and permuted up (4-D)
        Harness H;
        oomb_tensor * g = oomb_permute(H.ctx, H.param("gate", {3, 4, 2, 2}, OOMB_TYPE_F32, -3, 3), 1, 0, 2, 3); // [4, 3, 2, 2]
        oomb_tensor * u = oomb_permute(H.ctx, H.param("up", {2, 3, 4, 2}), 2, 1, 0, 3);                        // [4, 3, 2, 2]
        H.check(oomb_swiglu(H.ctx, g, u));
    }
    { // the same tensor on both sides (two packed-view contributions to one gradient)
        Harness H;
        oomb_tensor * x = H.param("x", {6, 3, 1, 2}, OOMB_TYPE_F32, -3, 3);
        H.check(oomb_swiglu(H.ctx, x, x));
    }
    { // gate and up as views of one fused projection (gradients scattered back through the views)
        Harness H;
        oomb_tensor * gu = oomb_mul_mat(H.ctx, H.param("w_gu", {4, 10}), H.param("x", {4, 3, 2})); // [10, 3, 2]
        oomb_tensor * g = oomb_view_3d(H.ctx, gu, 5, 3, 2, gu->nb[1], gu->nb[2], 0);
        oomb_tensor * u = oomb_view_3d(H.ctx, gu, 5, 3, 2, gu->nb[1], gu->nb[2], 5 * sizeof(float));
        H.check(oomb_swiglu(H.ctx, g, u));
    }
    { // inside a larger graph: gate/up from mul_mats, gate also used elsewhere, output permuted
        Harness H;
        oomb_tensor * x = H.param("x", {4, 3, 1, 2});
        oomb_tensor * g = oomb_mul_mat(H.ctx, H.param("wg", {4, 6}), x); // [6, 3, 1, 2]
        oomb_tensor * u = oomb_mul_mat(H.ctx, H.param("wu", {4, 6}), x);
        oomb_tensor * s = oomb_swiglu(H.ctx, g, u);
        oomb_tensor * y = oomb_add(H.ctx, oomb_cont(H.ctx, oomb_permute(H.ctx, s, 1, 0, 2, 3)),
                                   oomb_cont(H.ctx, oomb_permute(H.ctx, oomb_silu(H.ctx, g), 1, 0, 2, 3)));
        H.check(oomb_mul_mat(H.ctx, H.param("wd", {3, 2}), y));
    }
}

// Builds the f32 graph (build(F32)) and the bf16 one (build(BF16)) with their backward on two harnesses
// of one seed, expects `n_bf16` nodes of op `op` with a bf16 result in the bf16 graph (none in the
// f32 one), computes both and expects every parameter's gradient within 2e-2 of the f32 graph's and
// not equal to it (the bf16 graph rounds: a comparison that cannot fail otherwise).
template <typename Build>
void expect_bf16_grads_near_f32(uint32_t seed, Build build, enum oomb_op op, int n_bf16, const char * what) {
    Harness A(seed), B(seed);
    oomb_tensor * la = build(OOMB_TYPE_F32)(A, A.ctx);
    oomb_tensor * lb = build(OOMB_TYPE_BF16)(B, B.ctx);
    for (auto [H, l] : {std::make_pair(&A, la), std::make_pair(&B, lb)}) {
        oomb_cgraph * g = oomb_new_graph(H->ctx);
        oomb_build_forward_expand(g, l);
        oomb_build_backward_expand(H->ctx, g, l, nullptr);
        int n = 0;
        for (int i = 0; i < oomb_graph_n_nodes(g); i++) {
            const oomb_tensor * t = oomb_graph_node(g, i);
            if (t->op == op) n += t->type == OOMB_TYPE_BF16;
        }
        EXPECT_EQ(n, H == &B ? n_bf16 : 0) << what << ": bf16 " << oomb_op_name(op) << " nodes";
        H->zero_grads();
        oomb_backend_graph_compute(cpu(), g);
    }
    for (size_t i = 0; i < A.params.size(); i++) {
        const double e = rel_err(oombtest::to_vector(B.params[i]->grad), oombtest::to_vector(A.params[i]->grad));
        EXPECT_LT(e, 2e-2) << what << ": " << A.params[i]->name;
        EXPECT_GT(e, 0.0) << what << ": " << A.params[i]->name << ": the bf16 graph should round";
    }
}

// bf16 results that feed mul_mat (oomb_mul_ext, oomb_swiglu_ext, as the Qwen2 graph uses them on the
// GPU): the gradients are those of the f32 graph up to the rounding of the stored activations, and
// the graph allocator plans the mixed-size tensors as the host context computes them
TEST(Grad, Bf16GemmInputs) {
    auto build = [](oomb_type act) {
        return [act](Harness & H, oomb_context * c) {
            oomb_tensor * x = H.param("x", {16, 5, 3});
            oomb_tensor * wn = H.param("wn", {16});
            oomb_tensor * wg = H.param("wg", {16, 12});
            oomb_tensor * wu = H.param("wu", {16, 12});
            oomb_tensor * wd = H.param("wd", {12, 16});
            oomb_tensor * h = oomb_mul_ext(c, oomb_rms_norm(c, x, 1e-5f), wn, act);
            oomb_tensor * m = oomb_swiglu_ext(c, oomb_mul_mat(c, wg, h), oomb_mul_mat(c, wu, h), act);
            oomb_tensor * y = oomb_add(c, oomb_mul_mat(c, wd, m), x);
            return oomb_sum_sq(c, y);
        };
    };
    expect_allocator_matches_host(11, build(OOMB_TYPE_BF16));
    // the bf16 graph's swiglu backward stores its [dgate; dup] in bf16 (read by the products only)
    expect_bf16_grads_near_f32(12, build, OOMB_OP_SWIGLU_BACK, 1, "bf16 GEMM inputs");
}

// The Qwen2 graph's GPU form since rms_norm_mul and mul_mat_ext: the weighted norm in one node and the
// gate / up products stored in bf16 (read only by the SwiGLU): gradients within bf16 rounding of the
// f32 graph, the mixed-size tensors planned as the host computes them, and a frozen gate (the one-side
// SwiGLU backward reads the bf16 gate / up as f32).
TEST(Grad, Bf16GemmOutputs) {
    auto build = [](oomb_type act, bool frozen_gate) {
        return [act, frozen_gate](Harness & H, oomb_context * c) {
            oomb_tensor * x = H.param("x", {16, 5, 3});
            oomb_tensor * wn = H.param("wn", {16});
            oomb_tensor * wg = frozen_gate ? H.input("wg", {16, 12}) : H.param("wg", {16, 12});
            oomb_tensor * wu = H.param("wu", {16, 12});
            oomb_tensor * wd = H.param("wd", {12, 16});
            oomb_tensor * h = oomb_rms_norm_mul_ext(c, x, wn, 1e-5f, act);
            // frozen gate: computed from inputs only, so the SwiGLU takes its one-side backward
            oomb_tensor * gin = frozen_gate ? H.input("xg", {16, 5, 3}) : h;
            oomb_tensor * m = oomb_swiglu_ext(c, oomb_mul_mat_ext(c, wg, gin, act), oomb_mul_mat_ext(c, wu, h, act), act);
            oomb_tensor * y = oomb_add(c, oomb_mul_mat(c, wd, m), x);
            return oomb_sum_sq(c, y);
        };
    };
    expect_allocator_matches_host(13, build(OOMB_TYPE_BF16, false));
    for (bool frozen_gate : {false, true})
        expect_bf16_grads_near_f32(14, [&](oomb_type act) { return build(act, frozen_gate); }, OOMB_OP_MUL_MAT, 2,
                                   frozen_gate ? "frozen gate" : "gate and up trained");
}

// gate and up as views of one fused bf16 product (oomb_mul_mat_ext): the bf16 gradients scattered back
// through the views, within bf16 rounding of the f32 graph's (from a review).
TEST(Grad, Bf16FusedGateUpViews) {
    auto build = [](oomb_type act) {
        return [act](Harness & H, oomb_context * c) {
            oomb_tensor * x = H.param("x", {4, 3, 2});
            oomb_tensor * gu = oomb_mul_mat_ext(c, H.param("w_gu", {4, 12}), x, act);  // [12, 3, 2]
            const size_t es = oomb_type_size(act);
            oomb_tensor * g = oomb_view_3d(c, gu, 6, 3, 2, gu->nb[1], gu->nb[2], 0);
            oomb_tensor * u = oomb_view_3d(c, gu, 6, 3, 2, gu->nb[1], gu->nb[2], 6 * es);
            oomb_tensor * y = oomb_mul_mat(c, H.param("wd", {6, 5}), oomb_swiglu_ext(c, g, u, act));
            return oomb_sum_sq(c, y);
        };
    };
    expect_bf16_grads_near_f32(15, build, OOMB_OP_MUL_MAT, 1, "fused gate / up views");
}

// bf16 gradients of a bf16 swiglu (oomb_swiglu_back_ext) where they are not only read by one matrix
// product: gate also used elsewhere (summed in f32), gate and up views of one projection (scattered
// through the views), the same tensor on both sides, gate and up parameters, a permute between the
// swiglu and its product, the result as a product's a and as a batched b; against the f32 graph and
// the graph allocator
TEST(Grad, Bf16SwigluGradientsAccumulated) {
    auto cases = [](int which, oomb_type act) {
        return [which, act](Harness & H, oomb_context * c) -> oomb_tensor * {
            oomb_tensor * x = H.param("x", {8, 5, 2});
            if (which == 0) {
                oomb_tensor * g = oomb_mul_mat(c, H.param("wg", {8, 6}), x);
                oomb_tensor * u = oomb_mul_mat(c, H.param("wu", {8, 6}), x);
                oomb_tensor * m = oomb_swiglu_ext(c, g, u, act);
                oomb_tensor * y = oomb_add(c, oomb_mul_mat(c, H.param("wd", {6, 4}), m), oomb_mul_mat(c, H.param("we", {6, 4}), g));
                return oomb_sum_sq(c, y);
            }
            if (which == 1) {
                oomb_tensor * gu = oomb_mul_mat(c, H.param("w_gu", {8, 12}), x);  // [12, 5, 2]
                oomb_tensor * g = oomb_view_3d(c, gu, 6, 5, 2, gu->nb[1], gu->nb[2], 0);
                oomb_tensor * u = oomb_view_3d(c, gu, 6, 5, 2, gu->nb[1], gu->nb[2], 6 * sizeof(float));
                return oomb_sum_sq(c, oomb_mul_mat(c, H.param("wd", {6, 4}), oomb_swiglu_ext(c, g, u, act)));
            }
            if (which == 2) {
                oomb_tensor * g = oomb_mul_mat(c, H.param("wg", {8, 6}), x);
                return oomb_sum_sq(c, oomb_mul_mat(c, H.param("wd", {6, 4}), oomb_swiglu_ext(c, g, g, act)));
            }
            // (cases from a review) gate and up parameters themselves (no product below them)
            if (which == 3) {
                oomb_tensor * m = oomb_swiglu_ext(c, H.param("g", {6, 5, 2}, OOMB_TYPE_F32, -3, 3), H.param("u", {6, 5, 2}), act);
                return oomb_sum_sq(c, oomb_add(c, oomb_mul_mat(c, H.param("wd", {6, 4}), m), oomb_mul_mat(c, H.param("we", {8, 4}), x)));
            }
            // a permute / reshape between the swiglu and its product
            if (which == 4) {
                oomb_tensor * g = oomb_mul_mat(c, H.param("wg", {8, 6}), x);
                oomb_tensor * u = oomb_mul_mat(c, H.param("wu", {8, 6}), x);
                oomb_tensor * m = oomb_swiglu_ext(c, g, u, act);                       // [6, 5, 2]
                oomb_tensor * p = oomb_reshape_2d(c, oomb_cont(c, oomb_permute(c, m, 0, 2, 1, 3)), 6, 10);
                return oomb_sum_sq(c, oomb_mul_mat(c, H.param("wd", {6, 4}), p));
            }
            // the swiglu result as mul_mat's a operand, and as a batched b
            oomb_tensor * g = oomb_mul_mat(c, H.param("wg", {8, 6}), x);
            oomb_tensor * u = oomb_mul_mat(c, H.param("wu", {8, 6}), x);
            oomb_tensor * m = oomb_swiglu_ext(c, g, u, act);                           // [6, 5, 2]
            oomb_tensor * ya = oomb_mul_mat(c, m, H.param("b", {6, 3, 2}));            // [5, 3, 2]
            oomb_tensor * yb = oomb_mul_mat(c, H.param("wb", {6, 4, 2}), m);           // [4, 5, 2]
            return oomb_add(c, oomb_sum_sq(c, ya), oomb_sum_sq(c, yb));
        };
    };
    for (int which = 0; which < 6; which++) {
        expect_allocator_matches_host(21 + which, cases(which, OOMB_TYPE_BF16));
        Harness A(31), B(31);
        oomb_tensor * la = cases(which, OOMB_TYPE_F32)(A, A.ctx);
        oomb_tensor * lb = cases(which, OOMB_TYPE_BF16)(B, B.ctx);
        for (auto [H, l] : {std::make_pair(&A, la), std::make_pair(&B, lb)}) {
            oomb_cgraph * g = oomb_new_graph(H->ctx);
            oomb_build_forward_expand(g, l);
            oomb_build_backward_expand(H->ctx, g, l, nullptr);
            H->zero_grads();
            oomb_backend_graph_compute(cpu(), g);
        }
        for (size_t i = 0; i < A.params.size(); i++) {
            const double e = rel_err(oombtest::to_vector(B.params[i]->grad), oombtest::to_vector(A.params[i]->grad));
            EXPECT_LT(e, 2e-2) << "case " << which << " " << A.params[i]->name;
        }
    }
}

// swiglu's gradients from a graph planned by the graph allocator equal the host-context ones
TEST(Grad, SwigluWithGraphAllocator) {
    auto build = [](Harness & H, oomb_context * c) {
        oomb_tensor * x = H.param("x", {8, 5, 2, 3});
        oomb_tensor * wg = H.param("wg", {8, 7});
        oomb_tensor * wu = H.param("wu", {8, 7});
        oomb_tensor * wd = H.param("wd", {7, 8});
        oomb_tensor * g = oomb_mul_mat(c, wg, x);
        oomb_tensor * u = oomb_mul_mat(c, wu, x);
        oomb_tensor * m = oomb_swiglu(c, g, u);
        oomb_tensor * y = oomb_add(c, oomb_mul_mat(c, wd, m), x);
        oomb_tensor * m2 = oomb_swiglu(c, y, oomb_scale(c, y, 0.5f));
        return oomb_sum_sq(c, m2);
    };
    expect_allocator_matches_host(5, build);
}

TEST(Grad, OpNameTableMatchesEnum) {
    EXPECT_STREQ(oomb_op_name(OOMB_OP_SWIGLU), "swiglu");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_SWIGLU_BACK), "swiglu_back");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_SUM), "sum");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_MUL_MAT), "mul_mat");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_PAGED_ATTN_BACK), "paged_attn_back");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_CUSTOM), "custom");
    for (int op = 0; op < OOMB_OP_COUNT; op++) {
        ASSERT_NE(oomb_op_name((oomb_op) op), nullptr) << op;
        for (int o2 = 0; o2 < op; o2++) EXPECT_STRNE(oomb_op_name((oomb_op) op), oomb_op_name((oomb_op) o2));
    }
}

// review-s19: node shape / names of the fused backward; frozen x with a trainable w (the packed
// node, its dx part unused); w as [ne0, 1, 1, 1].
TEST(Grad, ReviewS19RmsNormMulNodes) {
    for (int mode = 0; mode < 3; mode++) {  // 0: x and w, 1: w frozen, 2: x frozen
        Harness H;
        oomb_tensor * x = mode == 2 ? H.input("x", {6, 4}) : H.param("x", {6, 4});
        oomb_tensor * w = mode == 1 ? H.input("w", {6}) : H.param("w", {6, 1, 1, 1});
        oomb_tensor * y = oomb_set_name(oomb_rms_norm_mul(H.ctx, x, w, 1e-6f), "y");
        oomb_tensor * loss = oomb_sum(H.ctx, oomb_mul(H.ctx, y, y));
        oomb_cgraph * g = oomb_new_graph(H.ctx);
        oomb_build_forward_expand(g, loss);
        oomb_build_backward_expand(H.ctx, g, loss, nullptr);
        int n_back = 0;
        for (int i = 0; i < oomb_graph_n_nodes(g); i++) {
            oomb_tensor * n = oomb_graph_node(g, i);
            if (n->op != OOMB_OP_RMS_NORM_MUL_BACK) continue;
            n_back++;
            printf("mode %d: %s [%lld, %lld] name '%s'\n", mode, oomb_op_name(n->op), (long long) n->ne[0], (long long) n->ne[1], n->name);
            EXPECT_EQ(n->ne[1], mode == 1 ? 4 : 5);
        }
        EXPECT_EQ(n_back, 1);
        if (mode != 2) EXPECT_NE(oomb_get_tensor(H.ctx, "grad of x"), nullptr);
        if (mode != 1) EXPECT_NE(oomb_get_tensor(H.ctx, "grad of w"), nullptr);
        (void) 0;
    }
}

// oomb_sum_sq_n with a source repeated, overlapping partial views, computed sources, 13 sources (from a review)
TEST(Grad, SumSqNRepeatedAndViews) {
    { Harness H; oomb_tensor * a = H.param("a", {5, 4}); oomb_tensor * ts[3] = {a, a, a}; H.check(oomb_sum_sq_n(H.ctx, ts, 3)); }
    {
        Harness H;
        oomb_tensor * a = H.param("a", {5, 4});
        oomb_tensor * v1 = oomb_view_2d(H.ctx, a, 5, 2, a->nb[1], a->nb[1]);      // rows 1..2
        oomb_tensor * v2 = oomb_view_1d(H.ctx, a, 7, 3 * sizeof(float));          // elements 3..9
        oomb_tensor * ts[4] = {v1, a, v2, oomb_transpose(H.ctx, a)};
        H.check(oomb_sum_sq_n(H.ctx, ts, 4));
    }
    {
        Harness H;
        oomb_tensor * a = H.param("a", {3, 4}), * c = H.param("c", {3, 4}), * d = H.param("d", {2});
        std::vector<oomb_tensor *> ts;
        for (int k = 0; k < OOMB_MAX_SRC; k++) {
            if (k % 3 == 0) ts.push_back(oomb_mul(H.ctx, a, c));
            else if (k % 3 == 1) ts.push_back(oomb_view_1d(H.ctx, c, 5, (size_t) (k % 4) * sizeof(float)));
            else ts.push_back(d);
        }
        H.check(oomb_sum_sq_n(H.ctx, ts.data(), (int) ts.size()));
    }
}
