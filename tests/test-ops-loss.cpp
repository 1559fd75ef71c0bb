// CPU backend loss ops against naive double-precision references (tests/ops-harness.h): cross_entropy_loss and
// its backward (ignored labels, label errors), and the LM head's linear_cross_entropy over vocabulary tiles
// (the tile choice, the unfused ops it replaces, strided operands, 1 vs 3 threads, label errors).
#include "ops-harness.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Cross-entropy
// ---------------------------------------------------------------------------------------------

TEST_F(Ops, CrossEntropyAndBack) {
    const int64_t V = 33, N = 7;
    const int32_t ignore = -100;
    oomb_tensor * x = rnd(OOMB_TYPE_F32, V, N, 1, 1, -5.0f, 5.0f);
    std::vector<int32_t> lab = {0, 32, ignore, 5, 5, ignore, 17};
    oomb_tensor * labels = ids(lab, N);
    oomb_tensor * loss = oomb_cross_entropy_loss(ctx, x, labels, ignore);
    compute(loss);
    const vec X = to_vector(x);
    double ref = 0;
    int count = 0;
    for (int64_t r = 0; r < N; r++) {
        if (lab[(size_t) r] == ignore) continue;
        double mx = -INFINITY, s = 0;
        for (int64_t i = 0; i < V; i++) mx = std::max(mx, X[r * V + i]);
        for (int64_t i = 0; i < V; i++) s += std::exp(X[r * V + i] - mx);
        ref += mx + std::log(s) - X[r * V + lab[(size_t) r]];
        count++;
    }
    EXPECT_NEAR(oomb_get_f32_1d(loss, 0), ref, 1e-5 * std::fabs(ref));
    EXPECT_EQ(oomb_get_f32_1d(loss, 1), (float) count);

    oomb_tensor * dl = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 2);
    oomb_set_f32_1d(dl, 0, 0.37f);
    oomb_set_f32_1d(dl, 1, 123.0f);
    oomb_tensor * dx = oomb_cross_entropy_loss_back(ctx, x, labels, dl, ignore);
    compute(dx);
    vec rd(X.size(), 0.0);
    for (int64_t r = 0; r < N; r++) {
        if (lab[(size_t) r] == ignore) continue;
        double mx = -INFINITY, s = 0;
        for (int64_t i = 0; i < V; i++) mx = std::max(mx, X[r * V + i]);
        for (int64_t i = 0; i < V; i++) s += std::exp(X[r * V + i] - mx);
        for (int64_t i = 0; i < V; i++) rd[r * V + i] = (double) 0.37f * (std::exp(X[r * V + i] - mx) / s - (i == lab[(size_t) r]));
    }
    EXPECT_REL(to_vector(dx), rd, 1e-6);

    // non-contiguous logits (a view with padded rows) with large values
    oomb_tensor * base = rnd(OOMB_TYPE_F32, V + 4, N, 1, 1, 50.0f, 90.0f);
    oomb_tensor * xv = oomb_view_2d(ctx, base, V, N, base->nb[1], 2 * 4);
    oomb_tensor * lv = oomb_cross_entropy_loss(ctx, xv, labels, ignore);
    compute(lv);
    const vec XV = to_vector(xv);
    double refv = 0;
    for (int64_t r = 0; r < N; r++) {
        if (lab[(size_t) r] == ignore) continue;
        double mx = -INFINITY, s = 0;
        for (int64_t i = 0; i < V; i++) mx = std::max(mx, XV[r * V + i]);
        for (int64_t i = 0; i < V; i++) s += std::exp(XV[r * V + i] - mx);
        refv += mx + std::log(s) - XV[r * V + lab[(size_t) r]];
    }
    EXPECT_NEAR(oomb_get_f32_1d(lv, 0), refv, 1e-5 * std::fabs(refv) + 1e-5);
}

TEST_F(Ops, CrossEntropyLabelErrors) {
    oomb_tensor * x = rnd(OOMB_TYPE_F32, 5, 3);
    EXPECT_OOMB_ERROR(compute(oomb_cross_entropy_loss(ctx, x, ids({0, 5, 1}, 3), -100)), "label 5");
    EXPECT_OOMB_ERROR(compute(oomb_cross_entropy_loss(ctx, x, ids({0, -3, 1}, 3), -100)), "label -3");
    oomb_tensor * dl = oomb_fill(ctx, 2, 1, 1, 1, 1.0f);
    EXPECT_OOMB_ERROR(compute(oomb_cross_entropy_loss_back(ctx, x, ids({7, 0, 1}, 3), dl, -100)), "label 7");
    // the ignore index itself is fine even when out of range
    oomb_tensor * ok = oomb_cross_entropy_loss(ctx, x, ids({-100, 4, 1}, 3), -100);
    compute(ok);
    EXPECT_EQ(oomb_get_f32_1d(ok, 1), 2.0f);
}

// ---------------------------------------------------------------------------------------------
// Fused linear + cross-entropy (vocabulary tiles)
// ---------------------------------------------------------------------------------------------

// Double-precision reference of linear_cross_entropy and its gradients: logits[n][v] = w_v . x_n.
struct LceRef {
    double sum = 0;
    int count = 0;
    vec lse, dx, dw; // lse [N], dx [N][E], dw [V][E]
};
LceRef lce_ref(const vec & W, const vec & X, int64_t E, int64_t V, int64_t N, const std::vector<int32_t> & lab, int32_t ignore,
               double g0) {
    LceRef R;
    R.lse.assign((size_t) N, 0.0);
    R.dx.assign((size_t) (N * E), 0.0);
    R.dw.assign((size_t) (V * E), 0.0);
    vec lg((size_t) V);
    for (int64_t n = 0; n < N; n++) {
        double mx = -INFINITY;
        for (int64_t v = 0; v < V; v++) {
            double d = 0;
            for (int64_t k = 0; k < E; k++) d += W[(size_t) (v * E + k)] * X[(size_t) (n * E + k)];
            lg[(size_t) v] = d;
            mx = std::max(mx, d);
        }
        double s = 0;
        for (int64_t v = 0; v < V; v++) s += std::exp(lg[(size_t) v] - mx);
        const double lse = mx + std::log(s);
        R.lse[(size_t) n] = lse;
        const int32_t l = lab[(size_t) n];
        if (l == ignore) continue;
        R.sum += lse - lg[(size_t) l];
        R.count++;
        for (int64_t v = 0; v < V; v++) {
            const double g = (std::exp(lg[(size_t) v] - lse) - (v == l ? 1.0 : 0.0)) * g0;
            for (int64_t k = 0; k < E; k++) {
                R.dx[(size_t) (n * E + k)] += g * W[(size_t) (v * E + k)];
                R.dw[(size_t) (v * E + k)] += g * X[(size_t) (n * E + k)];
            }
        }
    }
    return R;
}

vec slice(const vec & v, size_t off, size_t n) { return vec(v.begin() + (long) off, v.begin() + (long) (off + n)); }

TEST_F(Ops, LinearCrossEntropyTileChoice) {
    unsetenv("OOMB_LCE_TILE");
    EXPECT_EQ(oomb_linear_cross_entropy_tile(151936, 4096, 0), 16384);   // 16384 x 4096 f32 = 256 MiB
    EXPECT_EQ(oomb_linear_cross_entropy_tile(151936, 32768, 0), 2048);
    EXPECT_EQ(oomb_linear_cross_entropy_tile(151936, 3000, 0), 16384);   // capped at 16384 rows
    EXPECT_EQ(oomb_linear_cross_entropy_tile(151936, 5000, 0), 13312);   // 67108864 / 5000 = 13421 -> 13312
    EXPECT_EQ(oomb_linear_cross_entropy_tile(151936, 1 << 22, 0), 128);  // at least 128 rows
    EXPECT_EQ(oomb_linear_cross_entropy_tile(100, 4096, 0), 100);        // at most V
    EXPECT_EQ(oomb_linear_cross_entropy_tile(1000, 7, 33), 33);
    EXPECT_EQ(oomb_linear_cross_entropy_tile(20, 7, 33), 20);
    setenv("OOMB_LCE_TILE", "77", 1);
    EXPECT_EQ(oomb_linear_cross_entropy_tile(1000, 7, 0), 77);
    EXPECT_EQ(oomb_linear_cross_entropy_tile(1000, 7, 5), 5); // the op's own setting wins
    EXPECT_EQ(oomb_linear_cross_entropy_tile_request(0), 77);
    EXPECT_EQ(oomb_linear_cross_entropy_tile_request(9), 9);
    for (const char * bad : {"abc", "12x", "-5", "99999999999"}) {
        setenv("OOMB_LCE_TILE", bad, 1);
        EXPECT_OOMB_ERROR(oomb_linear_cross_entropy_tile(1000, 7, 0), "OOMB_LCE_TILE");
    }
    setenv("OOMB_LCE_TILE", "0", 1);  // 0: the automatic choice
    EXPECT_EQ(oomb_linear_cross_entropy_tile(151936, 4096, 0), 16384);
    EXPECT_EQ(oomb_linear_cross_entropy_tile_request(0), 0);
    unsetenv("OOMB_LCE_TILE");
    // the result looks like cross_entropy_loss's: f32 [2], a view of the packed node
    oomb_tensor * w = rnd(OOMB_TYPE_F32, 4, 9);
    oomb_tensor * x = rnd(OOMB_TYPE_F32, 4, 3);
    oomb_tensor * l = oomb_linear_cross_entropy(ctx, w, x, ids({1, 2, 3}, 3), -100);
    EXPECT_EQ(oomb_nelements(l), 2);
    EXPECT_EQ(l->type, OOMB_TYPE_F32);
    ASSERT_NE(l->view_src, nullptr);
    EXPECT_EQ(l->view_src->op, OOMB_OP_LINEAR_CROSS_ENTROPY);
    EXPECT_EQ(oomb_nelements(l->view_src), 2 + 3);
    oomb_linear_cross_entropy_set_tile(l, 4);
    EXPECT_EQ(l->view_src->op_params[1], 4);
    EXPECT_OOMB_ERROR(oomb_linear_cross_entropy_set_tile(x, 4), "not a linear_cross_entropy result");
}

TEST_F(Ops, LinearCrossEntropyMatchesUnfused) {
    struct Case {
        int64_t E, V, N, tile;
        oomb_type wt;
        int32_t ignore;
    };
    const Case cases[] = {
        {16, 37, 1, 0, OOMB_TYPE_F32, -100},      // N = 1, V smaller than one tile
        {33, 1000, 7, 128, OOMB_TYPE_F32, -100},  // 8 tiles, the last one 104 rows
        {33, 1000, 7, 128, OOMB_TYPE_BF16, -100},
        {8, 257, 13, 64, OOMB_TYPE_BF16, 3},      // last tile of 1 row; ignore index inside [0, V)
        {20, 50, 5, 50, OOMB_TYPE_F16, -1},       // V a multiple of the tile
        {5, 11, 6, 1, OOMB_TYPE_F32, -100},       // one class per tile
    };
    for (const Case & cs : cases) {
        SCOPED_TRACE("E " + std::to_string(cs.E) + " V " + std::to_string(cs.V) + " N " + std::to_string(cs.N) + " tile " +
                     std::to_string(cs.tile) + " " + oomb_type_name(cs.wt));
        oomb_tensor * w = rnd(cs.wt, cs.E, cs.V, 1, 1, -1.0f, 1.0f);
        oomb_tensor * x = rnd(OOMB_TYPE_F32, cs.E, cs.N, 1, 1, -2.0f, 2.0f);
        std::uniform_int_distribution<int32_t> dist(0, (int32_t) cs.V - 1);
        std::vector<int32_t> lab((size_t) cs.N);
        for (auto & l : lab) l = dist(rng);
        lab[0] = (int32_t) cs.V - 1;               // the last class
        if (cs.N > 2) lab[1] = cs.ignore;          // an ignored row
        if (cs.N > 3) lab[2] = 0;                  // the first class
        if (cs.N > 4 && cs.ignore >= 0) lab[3] = cs.ignore;
        oomb_tensor * labels = ids(lab, cs.N);

        oomb_tensor * fused = oomb_linear_cross_entropy(ctx, w, x, labels, cs.ignore);
        oomb_linear_cross_entropy_set_tile(fused, cs.tile);
        oomb_tensor * unfused = oomb_cross_entropy_loss(ctx, oomb_mul_mat(ctx, w, x), labels, cs.ignore);
        compute(fused);
        compute(unfused);
        const double g0 = 0.37;
        const LceRef R = lce_ref(to_vector(w), to_vector(x), cs.E, cs.V, cs.N, lab, cs.ignore, g0);
        const double sum = oomb_get_f32_1d(fused, 0);
        EXPECT_NEAR(sum, R.sum, 1e-5 * std::fabs(R.sum) + 1e-6);
        EXPECT_NEAR(sum, oomb_get_f32_1d(unfused, 0), 1e-5 * std::fabs(R.sum) + 1e-6);
        EXPECT_EQ(oomb_get_f32_1d(fused, 1), (float) R.count);
        EXPECT_EQ(oomb_get_f32_1d(fused, 1), oomb_get_f32_1d(unfused, 1));
        EXPECT_REL(slice(to_vector(fused->view_src), 2, (size_t) cs.N), R.lse, 1e-6);

        oomb_tensor * dl = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 2);
        oomb_set_f32_1d(dl, 0, (float) g0);
        oomb_set_f32_1d(dl, 1, 123.0f);
        oomb_tensor * lse = oomb_view_1d(ctx, fused->view_src, cs.N, 2 * sizeof(float));
        const int64_t nx = cs.E * cs.N, nw = cs.E * cs.V;
        for (oomb_tensor * lse_src : {lse, (oomb_tensor *) nullptr}) { // from the forward, recomputed
            SCOPED_TRACE(lse_src ? "lse from the forward" : "lse recomputed");
            oomb_tensor * both = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, lse_src, cs.ignore, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
            oomb_tensor * only_x = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, lse_src, cs.ignore, OOMB_LCE_GRAD_X);
            oomb_tensor * only_w = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, lse_src, cs.ignore, OOMB_LCE_GRAD_W);
            for (oomb_tensor * t : {both, only_x, only_w}) oomb_linear_cross_entropy_set_tile(t, cs.tile);
            ASSERT_EQ(oomb_nelements(both), nx + nw);
            ASSERT_EQ(oomb_nelements(only_x), nx);
            ASSERT_EQ(oomb_nelements(only_w), nw);
            compute(both);
            compute(only_x);
            compute(only_w);
            const vec b = to_vector(both);
            EXPECT_REL(slice(b, 0, (size_t) nx), R.dx, 1e-5);
            EXPECT_REL(slice(b, (size_t) nx, (size_t) nw), R.dw, 1e-5);
            EXPECT_EQ(to_vector(only_x), slice(b, 0, (size_t) nx));
            EXPECT_EQ(to_vector(only_w), slice(b, (size_t) nx, (size_t) nw));
        }
        // the unfused gradient of the logits, through mul_mat's products, agrees too
        oomb_tensor * dlog = oomb_cross_entropy_loss_back(ctx, oomb_mul_mat(ctx, w, x), labels, dl, cs.ignore); // [V, N]
        oomb_tensor * dx_u = oomb_mul_mat(ctx, oomb_transpose(ctx, oomb_cont(ctx, oomb_cast(ctx, w, OOMB_TYPE_F32))), dlog); // [E, N]
        compute(dx_u);
        EXPECT_REL(to_vector(dx_u), R.dx, 1e-5);
    }
}

TEST_F(Ops, LinearCrossEntropyStridedOperandsAndThreads) {
    // w a transposed view (unit stride in dim 1), x a view with padded rows and 3-D: [E, 4, 3]
    const int64_t E = 24, V = 301, N = 12;
    oomb_tensor * wt = rnd(OOMB_TYPE_F32, V, E);
    oomb_tensor * w = oomb_transpose(ctx, wt); // [E, V]
    oomb_tensor * xb = rnd(OOMB_TYPE_F32, E + 5, N, 1, 1, -2.0f, 2.0f);
    oomb_tensor * x = oomb_view_3d(ctx, xb, E, 4, 3, xb->nb[1], 4 * xb->nb[1], 3 * sizeof(float));
    std::vector<int32_t> lab((size_t) N);
    for (int64_t i = 0; i < N; i++) lab[(size_t) i] = (int32_t) ((i * 97 + 5) % V);
    lab[4] = -100;
    oomb_tensor * labels = ids(lab, 4, 3);
    oomb_tensor * fused = oomb_linear_cross_entropy(ctx, w, x, labels, -100);
    oomb_linear_cross_entropy_set_tile(fused, 40);
    oomb_tensor * dl = oomb_fill(ctx, 2, 1, 1, 1, 1.5f);
    oomb_tensor * back = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, nullptr, -100, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
    oomb_linear_cross_entropy_set_tile(back, 40);
    oomb_tensor * both = oomb_add(ctx, oomb_sum(ctx, back), oomb_sum(ctx, fused));
    compute(both, g_cpu);
    const vec f3 = to_vector(fused->view_src), b3 = to_vector(back);
    // reference in double from contiguous copies
    const LceRef R = lce_ref(to_vector(w), to_vector(x), E, V, N, lab, -100, 1.5);
    EXPECT_NEAR(f3[0], R.sum, 1e-5 * R.sum);
    EXPECT_EQ(f3[1], (double) R.count);
    EXPECT_REL(slice(b3, 0, (size_t) (E * N)), R.dx, 1e-5);
    EXPECT_REL(slice(b3, (size_t) (E * N), (size_t) (E * V)), R.dw, 1e-5);
    // one thread: the same values (rows are independent; sgemm may round differently)
    compute(both, g_cpu1);
    EXPECT_REL(to_vector(fused->view_src), f3, 1e-6);
    EXPECT_REL(to_vector(back), b3, 1e-6);
}

TEST_F(Ops, LinearCrossEntropyLabelErrors) {
    oomb_tensor * w = rnd(OOMB_TYPE_BF16, 4, 5);
    oomb_tensor * x = rnd(OOMB_TYPE_F32, 4, 3);
    EXPECT_OOMB_ERROR(compute(oomb_linear_cross_entropy(ctx, w, x, ids({0, 5, 1}, 3), -100)), "label 5 at row 1 is out of range [0, 5)");
    EXPECT_OOMB_ERROR(compute(oomb_linear_cross_entropy(ctx, w, x, ids({0, 1, -3}, 3), -100)), "label -3");
    oomb_tensor * dl = oomb_fill(ctx, 2, 1, 1, 1, 1.0f);
    EXPECT_OOMB_ERROR(compute(oomb_linear_cross_entropy_back(ctx, w, x, ids({7, 0, 1}, 3), dl, nullptr, -100, OOMB_LCE_GRAD_W)),
                      "label 7");
    // construction errors
    EXPECT_OOMB_ERROR(oomb_linear_cross_entropy(ctx, w, rnd(OOMB_TYPE_F32, 5, 3), ids({0, 1, 2}, 3), -100), "inner dimensions differ");
    EXPECT_OOMB_ERROR(oomb_linear_cross_entropy(ctx, w, x, ids({0, 1}, 2), -100), "one entry per row");
    EXPECT_OOMB_ERROR(oomb_linear_cross_entropy_back(ctx, w, x, ids({0, 1, 2}, 3), dl, nullptr, -100, 0), "grads = 0");
    // the ignore index itself is fine even when out of range
    oomb_tensor * ok = oomb_linear_cross_entropy(ctx, w, x, ids({-100, 4, 1}, 3), -100);
    compute(ok);
    EXPECT_EQ(oomb_get_f32_1d(ok, 1), 2.0f);
}

} // namespace
