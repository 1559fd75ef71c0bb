// Optimizers and training: AdamW / SGD against hand-computed steps, gradient clipping, and a small
// two-layer MLP whose loss falls when trained with AdamW through the graph allocator.
#include "test-common.h"

#include "oomb-alloc.h"
#include "oomb-opt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

struct Fixture {
    oomb_backend_t cpu = oomb_backend_cpu_init(2);
    oomb_context * ctx = oomb_init({0, false});
    ~Fixture() {
        oomb_free(ctx);
        oomb_backend_free(cpu);
    }
    oomb_tensor * param(int64_t n, const std::vector<float> & w, const std::vector<float> & g) {
        oomb_tensor * t = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n);
        oomb_set_param(t);
        oomb_new_grad(ctx, t);
        for (int64_t i = 0; i < n; i++) {
            oomb_set_f32_1d(t, i, w[i]);
            oomb_set_f32_1d(t->grad, i, g[i]);
        }
        return t;
    }
};

// AdamW (decoupled weight decay, bias correction), computed by hand in double for two steps.
TEST(Optim, AdamWMatchesHandComputedSteps) {
    Fixture f;
    const std::vector<float> w0 = {0.5f, -1.25f, 2.0f, 0.0f}, g0 = {0.1f, -0.3f, 0.05f, 1.0f}, g1 = {-0.2f, 0.4f, 0.0f, 0.5f};
    oomb_tensor * w = f.param(4, w0, g0);
    oomb_opt_params p = oomb_opt_default_params(OOMB_OPT_ADAMW);
    p.lr = 0.01f; p.beta1 = 0.9f; p.beta2 = 0.98f; p.eps = 1e-8f; p.weight_decay = 0.1f;
    oomb_optimizer_t opt = oomb_opt_init(f.cpu, &w, 1, nullptr, p);
    std::vector<double> W(w0.begin(), w0.end()), M(4, 0.0), V(4, 0.0);
    const std::vector<float> * grads[2] = {&g0, &g1};
    const double scale = 0.5;  // grad_scale (e.g. 1 / number of targets)
    for (int step = 1; step <= 2; step++) {
        for (int i = 0; i < 4; i++) oomb_set_f32_1d(w->grad, i, (*grads[step - 1])[i]);
        oomb_opt_step(opt, -1.0f, (float) scale, 0.0f);
        for (int i = 0; i < 4; i++) {
            const double g = (*grads[step - 1])[i] * scale;
            M[i] = 0.9 * M[i] + 0.1 * g;
            V[i] = 0.98 * V[i] + 0.02 * g * g;
            const double mh = M[i] / (1 - std::pow(0.9, step)), vh = V[i] / (1 - std::pow(0.98, step));
            W[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * W[i]);
        }
        for (int i = 0; i < 4; i++) EXPECT_NEAR(oomb_get_f32_1d(w, i), W[i], 1e-6) << "step " << step << " element " << i;
    }
    EXPECT_EQ(oomb_opt_n_steps(opt), 2);
    ASSERT_EQ(oomb_opt_n_state(opt), 2);
    EXPECT_NEAR(oomb_get_f32_1d(oomb_opt_state(opt, 0), 3), M[3], 1e-7);
    EXPECT_NEAR(oomb_get_f32_1d(oomb_opt_state(opt, 1), 3), V[3], 1e-7);
    oomb_opt_free(opt);
}

// AdamW with bf16 moments: each stored moment is the f32 update rounded down or up to a
// neighbouring bf16 value (stochastic rounding), and over many steps the moments track the f32
// ones without bias: a second moment decaying by 0.1 % per step (below half a bf16 ulp) must not
// freeze, which round-to-nearest would do.
void bf16_state_tracks_f32(int64_t start_step) {
    SCOPED_TRACE("optimizer steps counted from " + std::to_string(start_step));
    Fixture f;
    const int64_t n = 4096;
    std::vector<float> w0((size_t) n), g0((size_t) n);
    for (int64_t i = 0; i < n; i++) { w0[i] = 0.01f * (float) (i % 97) - 0.5f; g0[i] = 0.3f + 0.001f * (float) (i % 13); }
    oomb_tensor * a = f.param(n, w0, g0);
    oomb_tensor * b = f.param(n, w0, g0);
    oomb_opt_params p = oomb_opt_default_params(OOMB_OPT_ADAMW);
    p.lr = 1e-4f; p.beta2 = 0.999f; p.weight_decay = 0.0f;
    oomb_optimizer_t of = oomb_opt_init(f.cpu, &a, 1, nullptr, p);
    p.state_type = OOMB_TYPE_BF16;
    oomb_optimizer_t ob = oomb_opt_init(f.cpu, &b, 1, nullptr, p);
    oomb_opt_set_n_steps(of, start_step);
    oomb_opt_set_n_steps(ob, start_step);
    ASSERT_EQ(oomb_opt_n_state(ob), 2);
    ASSERT_EQ(oomb_opt_state(ob, 0)->type, OOMB_TYPE_BF16);
    ASSERT_EQ(oomb_opt_state(ob, 1)->type, OOMB_TYPE_BF16);
    // step 1 with the gradient (v = 1e-3 g^2), then 300 steps with a gradient a hundred times
    // smaller (v -> 1e-4 g^2): v decays by < 0.1 % per step
    for (int step = 0; step < 301; step++) {
        if (step == 1)
            for (int64_t i = 0; i < n; i++) { oomb_set_f32_1d(a->grad, i, g0[i] * 0.01f); oomb_set_f32_1d(b->grad, i, g0[i] * 0.01f); }
        oomb_opt_step(of, -1.0f, 1.0f, 0.0f);
        oomb_opt_step(ob, -1.0f, 1.0f, 0.0f);
        if (step == 0) {
            // one step: every bf16 moment is one of the two bf16 neighbours of the f32 moment
            for (int64_t i = 0; i < n; i += 7) {
                const float mf = oomb_get_f32_1d(oomb_opt_state(of, 0), i), mb = oomb_get_f32_1d(oomb_opt_state(ob, 0), i);
                EXPECT_LE(std::fabs(mb - mf), std::fabs(mf) / 128.0f) << i;
            }
        }
    }
    double vf = 0.0, vb = 0.0, v1 = 0.0;
    for (int64_t i = 0; i < n; i++) {
        vf += oomb_get_f32_1d(oomb_opt_state(of, 1), i);
        vb += oomb_get_f32_1d(oomb_opt_state(ob, 1), i);
        v1 += 0.001 * (double) g0[i] * g0[i];  // v after step 1
    }
    ASSERT_LT(vf, 0.85 * v1);  // the f32 moment did decay (~23 % over 300 steps)
    EXPECT_NEAR(vb / vf, 1.0, 0.01) << "bf16 second moment mean " << vb << " vs f32 " << vf;
    double dw = 0.0, nw = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double) oomb_get_f32_1d(a, i) - w0[i], e = (double) oomb_get_f32_1d(b, i) - oomb_get_f32_1d(a, i);
        nw += d * d;
        dw += e * e;
    }
    // per-element rounding noise gives ~1 %; frozen moments (round-to-nearest) give > 10 %
    EXPECT_LT(std::sqrt(dw / nw), 0.03) << "parameter updates with bf16 moments vs f32 moments";
    oomb_opt_free(of);
    oomb_opt_free(ob);
    p.state_type = OOMB_TYPE_I32;
    EXPECT_OOMB_ERROR(oomb_opt_init(f.cpu, &a, 1, nullptr, p), "state type");
}

TEST(Optim, AdamWBf16StateIsUnbiased) {
    bf16_state_tracks_f32(0);
    // late in training the bias corrections 1 - beta^t are exactly 1.0f: the rounding must still
    // draw new random bits every step (the step number seeds it), or moments freeze
    bf16_state_tracks_f32(20000);
}

TEST(Optim, NoDecayMaskAndBf16Param) {
    Fixture f;
    oomb_tensor * a = f.param(2, {1.0f, 1.0f}, {0.0f, 0.0f});
    oomb_tensor * b = oomb_new_tensor_1d(f.ctx, OOMB_TYPE_BF16, 2);
    oomb_set_param(b);
    oomb_new_grad(f.ctx, b);
    oomb_set_f32_1d(b, 0, 1.0f);
    oomb_set_f32_1d(b, 1, -2.0f);
    oomb_set_f32_1d(b->grad, 0, 1.0f);
    oomb_set_f32_1d(b->grad, 1, 1.0f);
    oomb_tensor * ps[2] = {a, b};
    const bool decay[2] = {false, true};
    oomb_opt_params p = oomb_opt_default_params(OOMB_OPT_ADAMW);
    p.lr = 0.125f; p.weight_decay = 0.5f;
    oomb_optimizer_t opt = oomb_opt_init(f.cpu, ps, 2, decay, p);
    oomb_opt_step(opt, -1.0f, 1.0f, 0.0f);
    EXPECT_EQ(oomb_get_f32_1d(a, 0), 1.0f);  // zero gradient and no decay: unchanged
    // first AdamW step moves by lr * sign(g) (up to eps), plus decay lr * wd * w
    EXPECT_NEAR(oomb_get_f32_1d(b, 0), 1.0f - 0.125f - 0.125f * 0.5f * 1.0f, 4e-3);
    EXPECT_NEAR(oomb_get_f32_1d(b, 1), -2.0f - 0.125f + 0.125f * 0.5f * 2.0f, 8e-3);
    oomb_opt_free(opt);
}

TEST(Optim, SgdAndGlobalNormClipping) {
    Fixture f;
    oomb_tensor * a = f.param(2, {1.0f, 2.0f}, {3.0f, 0.0f});
    oomb_tensor * b = f.param(1, {-1.0f}, {4.0f});
    oomb_tensor * ps[2] = {a, b};
    oomb_opt_params p = oomb_opt_default_params(OOMB_OPT_SGD);
    p.lr = 0.1f;
    oomb_optimizer_t opt = oomb_opt_init(f.cpu, ps, 2, nullptr, p);
    EXPECT_NEAR(oomb_opt_grad_norm(opt), 5.0f, 1e-6);
    const float norm = oomb_opt_step(opt, -1.0f, 1.0f, 1.0f);  // clip the global norm 5 to 1
    EXPECT_NEAR(norm, 5.0f, 1e-6);
    EXPECT_NEAR(oomb_get_f32_1d(a, 0), 1.0f - 0.1f * 3.0f / 5.0f, 1e-6);
    EXPECT_NEAR(oomb_get_f32_1d(a, 1), 2.0f, 1e-7);
    EXPECT_NEAR(oomb_get_f32_1d(b, 0), -1.0f - 0.1f * 4.0f / 5.0f, 1e-6);
    oomb_opt_zero_grads(opt);
    EXPECT_EQ(oomb_opt_grad_norm(opt), 0.0f);
    // non-finite gradients: reported, nothing updated
    oomb_set_f32_1d(a->grad, 0, NAN);
    EXPECT_FALSE(std::isfinite(oomb_opt_step(opt, -1.0f, 1.0f, 1.0f)));
    EXPECT_NEAR(oomb_get_f32_1d(b, 0), -1.0f - 0.1f * 4.0f / 5.0f, 1e-6);
    oomb_opt_free(opt);
}

TEST(OptimErrors, ParamWithoutGradient) {
    Fixture f;
    oomb_tensor * a = oomb_new_tensor_1d(f.ctx, OOMB_TYPE_F32, 2);
    oomb_set_name(a, "w");
    EXPECT_OOMB_ERROR(oomb_opt_init(f.cpu, &a, 1, nullptr, oomb_opt_default_params(OOMB_OPT_ADAMW)),
                      "parameter 'w' has no gradient tensor");
}

// A two-layer MLP (tanh-like silu hidden layer) regressing a fixed function trains with AdamW:
// the loss falls by a large factor, with one allocator plan for all steps.
TEST(Training, TwoLayerMlpLossFalls) {
    oomb_backend_t cpu = oomb_backend_cpu_init(2);
    oomb_context * cw = oomb_init({0, false});
    const int IN = 3, HID = 32, N = 128;
    oomb_tensor * w1 = oomb_set_name(oomb_new_tensor_2d(cw, OOMB_TYPE_F32, IN, HID), "w1");
    oomb_tensor * b1 = oomb_set_name(oomb_new_tensor_1d(cw, OOMB_TYPE_F32, HID), "b1");
    oomb_tensor * w2 = oomb_set_name(oomb_new_tensor_2d(cw, OOMB_TYPE_F32, HID, 1), "w2");
    oomb_tensor * x = oomb_new_tensor_2d(cw, OOMB_TYPE_F32, IN, N);
    oomb_tensor * y = oomb_new_tensor_2d(cw, OOMB_TYPE_F32, 1, N);
    std::mt19937 rng(7);
    oombtest::fill_uniform(w1, rng, -0.5f, 0.5f);
    oombtest::fill_uniform(w2, rng, -0.2f, 0.2f);
    oombtest::fill_uniform(x, rng, -1.0f, 1.0f);
    for (int i = 0; i < N; i++) {
        const float a = oomb_get_f32_nd(x, 0, i, 0, 0), b = oomb_get_f32_nd(x, 1, i, 0, 0), c = oomb_get_f32_nd(x, 2, i, 0, 0);
        oomb_set_f32_nd(y, 0, i, 0, 0, std::sin(2 * a) + b * c);
    }
    oomb_tensor * ps[3] = {w1, b1, w2};
    for (oomb_tensor * p : ps) { oomb_set_param(p); oomb_new_grad(cw, p); }
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * h = oomb_silu(ctx, oomb_add(ctx, oomb_mul_mat(ctx, w1, x), b1));
    oomb_tensor * d = oomb_sub(ctx, oomb_mul_mat(ctx, w2, h), y);
    oomb_tensor * loss = oomb_mean(ctx, oomb_mul(ctx, d, d));
    oomb_set_loss(loss);
    oomb_set_output(loss);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(ctx, g, loss, nullptr);
    oomb_gallocr_t ga = oomb_gallocr_new(cpu);
    oomb_opt_params p = oomb_opt_default_params(OOMB_OPT_ADAMW);
    p.lr = 0.02f;
    oomb_optimizer_t opt = oomb_opt_init(cpu, ps, 3, nullptr, p);
    float first = 0, last = 0;
    for (int step = 0; step < 300; step++) {
        oomb_opt_zero_grads(opt);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
        oomb_backend_graph_compute(cpu, g);
        last = oomb_get_f32_1d(loss, 0);
        if (step == 0) first = last;
        oomb_opt_step(opt, -1.0f, 1.0f, 1.0f);
    }
    EXPECT_LT(last, first * 0.1f) << "loss " << first << " -> " << last;
    EXPECT_EQ(oomb_gallocr_n_plans(ga), 1);
    EXPECT_LT(oomb_gallocr_planned_size(ga), oomb_gallocr_planned_sum(ga));
    oomb_opt_free(opt);
    oomb_gallocr_free(ga);
    oomb_free(ctx);
    oomb_free(cw);
    oomb_backend_free(cpu);
}

} // namespace
