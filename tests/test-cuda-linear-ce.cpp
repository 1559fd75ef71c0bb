// CUDA backend against the CPU backend for the LM head (tests/cuda-ops-harness.h): linear_cross_entropy and
// its backward over vocabulary tiles, the fused forward + backward pass (cuda/linear-ce.cu) against the tiled
// path on the GPU, through autodiff, its scratch sizing and fallbacks, and label errors. Random data of odd
// sizes (vocabularies that divide no tile). Every test skips with a visible reason where no GPU is present.
#include "cuda-ops-harness.h"

// ---------------------------------------------------------------------------------------------
// Fused linear + cross-entropy over vocabulary tiles
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, LinearCrossEntropyAndBack) {
    REQUIRE_CUDA();
    struct Case {
        int64_t E, V, N, tile;
        oomb_type wt;
    };
    const Case cases[] = {
        {64, 1000, 37, 256, OOMB_TYPE_BF16},  // 4 tiles, the last one 232 rows
        {48, 3000, 5, 512, OOMB_TYPE_F32},    // f32 head converted per tile; 6 tiles
        {40, 130, 1, 128, OOMB_TYPE_BF16},    // N = 1; the last tile has 2 rows
        {96, 777, 64, 0, OOMB_TYPE_F16},      // automatic tile: one tile holds every class
        {64, 2200, 300, 256, OOMB_TYPE_BF16}, // 9 tiles, the last one 152 rows
    };
    // a bf16 head's forward and backward in one graph run as one pass by default (fuse_linear_ce);
    // OOMB_CUDA_FUSE_LCE=0 keeps them apart, in their vocabulary tiles: both against the CPU
    oombtest::ScopedEnv env({"OOMB_CUDA_FUSE", "OOMB_CUDA_FUSE_LCE"});
    env.unset("OOMB_CUDA_FUSE");
    for (const char * lce : {"", "0"}) {
        if (*lce) env.set("OOMB_CUDA_FUSE_LCE", lce); else env.unset("OOMB_CUDA_FUSE_LCE");
#ifdef OOMB_USE_CUDA
        const int64_t lce0 = harness_on_cpu() ? 0 : oomb_cuda_debug_fused_lce_count(cuda_backend());
#endif
        for (const Case & cs : cases) {
            char name[200];
            snprintf(name, sizeof(name), "linear_cross_entropy / back w %s [%lld, %lld] x [%lld, %lld] tile %lld%s", oomb_type_name(cs.wt),
                     (long long) cs.E, (long long) cs.V, (long long) cs.E, (long long) cs.N, (long long) cs.tile,
                     *lce ? " (OOMB_CUDA_FUSE_LCE=0)" : "");
            expect_case(name, [&cs](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * w = B.input(cs.wt, cs.E, cs.V, 1, 1, -1.0f, 1.0f);
                oomb_tensor * x = B.input(OOMB_TYPE_F32, cs.E, cs.N, 1, 1, -1.0f, 1.0f);
                std::vector<int32_t> lab = B.rand_ids(cs.N, (int32_t) cs.V);
                lab[0] = (int32_t) cs.V - 1;
                if (cs.N > 1) lab[1] = -100;
                oomb_tensor * labels = B.ids(lab, cs.N);
                oomb_tensor * dloss = B.input(OOMB_TYPE_F32, 2, 1, 1, 1, 0.2f, 0.9f);
                oomb_tensor * l = oomb_linear_cross_entropy(B.ctx, w, x, labels, -100);
                oomb_linear_cross_entropy_set_tile(l, cs.tile);
                oomb_tensor * lse = oomb_view_1d(B.ctx, l->view_src, cs.N, 2 * sizeof(float));
                oomb_tensor * both = oomb_linear_cross_entropy_back(B.ctx, w, x, labels, dloss, lse, -100, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
                oomb_tensor * only_x = oomb_linear_cross_entropy_back(B.ctx, w, x, labels, dloss, nullptr, -100, OOMB_LCE_GRAD_X);
                oomb_tensor * only_w = oomb_linear_cross_entropy_back(B.ctx, w, x, labels, dloss, nullptr, -100, OOMB_LCE_GRAD_W);
                for (oomb_tensor * t : {both, only_x, only_w}) oomb_linear_cross_entropy_set_tile(t, cs.tile);
                // outputs: { sum, count }, the lse tail, [dx ; dw] (lse from the forward), dx and dw alone (lse recomputed)
                return {l, lse, both, only_x, only_w};
            }, k_bf16);
        }
#ifdef OOMB_USE_CUDA
        if (!harness_on_cpu()) {  // the three bf16 heads fuse by default, none with =0
            EXPECT_EQ(oomb_cuda_debug_fused_lce_count(cuda_backend()) - lce0, *lce ? 0 : 3) << "OOMB_CUDA_FUSE_LCE='" << lce << "'";
        }
#endif
    }
    env.unset("OOMB_CUDA_FUSE_LCE");  // the default again for the autodiff case below
    // through autodiff: a strided 3-D x (a view with padded rows), loss and both gradients
    expect_case("linear_cross_entropy autodiff: loss, dw, dx (strided 3-D x)", [](Builder & B) -> std::vector<oomb_tensor *> {
        const int64_t E = 72, V = 1500, T = 11;
        oomb_tensor * w = B.param(OOMB_TYPE_F32, E, V, 1, 1, -0.5f, 0.5f);
        oomb_tensor * xb = B.param(OOMB_TYPE_F32, E + 8, T, 2, 1, -1.0f, 1.0f);
        oomb_tensor * x = oomb_view_3d(B.ctx, xb, E, T, 2, xb->nb[1], xb->nb[2], 4 * sizeof(float));
        std::vector<int32_t> lab = B.rand_ids(2 * T, (int32_t) V);
        lab[3] = -1;
        oomb_tensor * labels = B.ids(lab, T, 2);
        oomb_tensor * l = oomb_linear_cross_entropy(B.ctx, w, oomb_silu(B.ctx, x), labels, -1);
        oomb_linear_cross_entropy_set_tile(l, 320);
        B.loss = l;
        return {l, w->grad, xb->grad};
    }, k_bf16);
}

// Operands of the linear cross-entropy GPU tests, in one CUDA buffer: w [E, V] bf16 and x [E, N] f32
// uniform in [-1, 1) from seed, labels [N] spread over the classes with row 5 ignored (-100) and row 6
// the last class, dloss [2] = {0.7, 3}, and acc [E, V] f32 (unset: a gradient a test may add dw into).
const float dlv0 = 0.7f;  // LceOperands' dloss[0]
struct LceOperands {
    oomb_context * in = nullptr;
    oomb_tensor * w = nullptr, * x = nullptr, * labels = nullptr, * dl = nullptr, * acc = nullptr;
    oomb_buffer_t buf = nullptr;
    LceOperands(oomb_backend_t cu, int64_t E, int64_t V, int64_t N, unsigned seed) {
        in = oomb_init({0, true});
        w = oomb_new_tensor_2d(in, OOMB_TYPE_BF16, E, V);
        x = oomb_new_tensor_2d(in, OOMB_TYPE_F32, E, N);
        labels = oomb_new_tensor_1d(in, OOMB_TYPE_I32, N);
        dl = oomb_new_tensor_1d(in, OOMB_TYPE_F32, 2);
        acc = oomb_new_tensor_2d(in, OOMB_TYPE_F32, E, V);
        buf = oomb_backend_alloc_ctx_tensors(in, cu);
        std::mt19937 rng(seed);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<uint16_t> wv((size_t) (E * V));
        for (auto & v : wv) v = oomb_fp32_to_bf16(u(rng));
        std::vector<float> xv((size_t) (E * N));
        for (auto & v : xv) v = u(rng);
        std::vector<int32_t> lv((size_t) N);
        for (int64_t i = 0; i < N; i++) lv[(size_t) i] = (int32_t) ((i * 613 + 11) % V);
        if (N > 5) lv[5] = -100;
        if (N > 6) lv[6] = (int32_t) V - 1;
        const float dlv[2] = {dlv0, 3.0f};
        oomb_tensor_set(w, wv.data(), 0, wv.size() * 2);
        oomb_tensor_set(x, xv.data(), 0, xv.size() * 4);
        oomb_tensor_set(labels, lv.data(), 0, lv.size() * 4);
        oomb_tensor_set(dl, dlv, 0, sizeof(dlv));
    }
    ~LceOperands() {
        oomb_buffer_free(buf);
        oomb_free(in);
    }
    LceOperands(const LceOperands &) = delete;
    LceOperands & operator=(const LceOperands &) = delete;
};

// On the GPU itself, the fused op against mul_mat + cross_entropy_loss(_back) + mul_mat (the same
// bf16 products): the loss and the log-sum-exp to f32 accuracy, the gradients closely (both round
// dlogits to bf16 for their products). Tighter than the GPU-vs-CPU gate above, so a tile that is
// dropped or counted twice cannot hide in bf16 noise.
TEST_F(CudaOps, LinearCrossEntropyMatchesUnfusedOnGpu) {
    REQUIRE_CUDA();
    oomb_backend_t cu = cuda_backend();
    oombtest::ScopedEnv env({"OOMB_CUDA_FUSE", "OOMB_CUDA_FUSE_LCE"});
    env.unset("OOMB_CUDA_FUSE");
    env.set("OOMB_CUDA_FUSE_LCE", "0");  // the two ops apart, in their vocabulary tiles (the fused pass has its own test)
    const int64_t E = 64, V = 2000, N = 33;
    LceOperands op(cu, E, V, N, 7);
    oomb_tensor * w = op.w, * x = op.x, * labels = op.labels, * dl = op.dl;
    oomb_context * ctx = oomb_init({0, true});

    oomb_tensor * l = oomb_linear_cross_entropy(ctx, w, x, labels, -100);
    oomb_linear_cross_entropy_set_tile(l, 384);  // 6 tiles, the last one 80 rows
    oomb_tensor * lse = oomb_view_1d(ctx, l->view_src, N, 2 * sizeof(float));
    oomb_tensor * back = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, lse, -100, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
    oomb_linear_cross_entropy_set_tile(back, 384);
    oomb_tensor * logits = oomb_mul_mat(ctx, w, x);                                        // [V, N]
    oomb_tensor * lu = oomb_cross_entropy_loss(ctx, logits, labels, -100);
    oomb_tensor * dlog = oomb_cross_entropy_loss_back(ctx, logits, labels, dl, -100);      // [V, N]
    oomb_tensor * dxu = oomb_mul_mat(ctx, oomb_transpose(ctx, w), dlog);                   // [E, N]
    oomb_tensor * dwu = oomb_mul_mat(ctx, oomb_transpose(ctx, x), oomb_transpose(ctx, dlog)); // [E, V]
    oomb_cgraph * g = oomb_new_graph(ctx);
    for (oomb_tensor * t : {l, back, logits, lu, dxu, dwu}) {
        oomb_set_output(t);
        oomb_build_forward_expand(g, t);
    }
    oomb_gallocr_t ga = oomb_gallocr_new(cu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
#ifdef OOMB_USE_CUDA
    const int64_t lce0 = harness_on_cpu() ? 0 : oomb_cuda_debug_fused_lce_count(cu);
#endif
    oomb_backend_graph_compute(cu, g);
    oomb_backend_synchronize(cu);
    const vec packed = device_values(l->view_src), lossu = device_values(lu), b = device_values(back);
    const vec dx = device_values(dxu), dw = device_values(dwu);
    // log-sum-exp of the unfused logits, on the host
    const vec lg = device_values(logits);
    vec lse_ref((size_t) N);
    for (int64_t n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0;
        for (int64_t v = 0; v < V; v++) mx = std::max(mx, lg[(size_t) (n * V + v)]);
        for (int64_t v = 0; v < V; v++) s += std::exp(lg[(size_t) (n * V + v)] - mx);
        lse_ref[(size_t) n] = mx + std::log(s);
    }
    const double e_loss = rel_err(vec(packed.begin(), packed.begin() + 2), lossu);
    const double e_lse = rel_err(vec(packed.begin() + 2, packed.end()), lse_ref);
    const double e_dx = rel_err(vec(b.begin(), b.begin() + E * N), dx);
    const double e_dw = rel_err(vec(b.begin() + E * N, b.end()), dw);
    printf("  fused vs unfused on the GPU: loss %.3e, lse %.3e, dx %.3e, dw %.3e\n", e_loss, e_lse, e_dx, e_dw);
    EXPECT_LT(e_loss, k_f32);
    EXPECT_EQ(packed[1], (double) (N - 1));
    EXPECT_LT(e_lse, k_f32);
    EXPECT_LT(e_dx, 1e-2);
    EXPECT_LT(e_dw, 1e-2);
#ifdef OOMB_USE_CUDA
    if (!harness_on_cpu()) {
        EXPECT_EQ(oomb_cuda_debug_fused_lce_count(cu), lce0) << "OOMB_CUDA_FUSE_LCE=0 keeps the ops apart";
    }
#endif
    oomb_gallocr_free(ga);
    oomb_free(ctx);
}

// The forward and backward of linear_cross_entropy in one graph run as one pass on the CUDA backend
// (backend-cuda.cu, fuse_linear_ce; cuda/linear-ce.cu, oomb_cuda_linear_ce_fused): loss, lse, dx and dw
// against the unfused products (mul_mat + cross_entropy_loss(_back) + mul_mat, computed in their own
// graph), with one row block and with blocks of 7 rows that do not divide N (dw summed over 5
// blocks), for V a multiple of 4 (vector path) and not; the same graph with OOMB_CUDA_FUSE=0 or
// OOMB_CUDA_FUSE_LCE=0 runs the separate ops and must agree too. A graph that reads the loss
// between the two (a scale) must not fuse, and still be right. On a real GPU the fused count is
// checked.
TEST_F(CudaOps, LinearCrossEntropyForwardAndBackwardFused) {
    REQUIRE_CUDA();
    oomb_backend_t cu = cuda_backend();
    oombtest::ScopedEnv env({"OOMB_CUDA_FUSE", "OOMB_LCE_ROWS", "OOMB_CUDA_FUSE_LCE"});
    const int64_t E = 64, N = 33;
    for (const int64_t V : {2000, 1999}) {
        LceOperands op(cu, E, V, N, 11 + (unsigned) V);
        oomb_tensor * w = op.w, * x = op.x, * labels = op.labels, * dl = op.dl, * acc = op.acc;
        oomb_context * ctx = oomb_init({0, true});
        std::mt19937 rng(5 + (unsigned) V);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);

        // the unfused reference, in its own graph
        oomb_tensor * logits = oomb_mul_mat(ctx, w, x);                                        // [V, N]
        oomb_tensor * lu = oomb_cross_entropy_loss(ctx, logits, labels, -100);
        oomb_tensor * dlog = oomb_cross_entropy_loss_back(ctx, logits, labels, dl, -100);      // [V, N]
        oomb_tensor * dxu = oomb_mul_mat(ctx, oomb_transpose(ctx, w), dlog);                   // [E, N]
        oomb_tensor * dwu = oomb_mul_mat(ctx, oomb_transpose(ctx, x), oomb_transpose(ctx, dlog)); // [E, V]
        oomb_cgraph * gr = oomb_new_graph(ctx);
        for (oomb_tensor * t : {logits, lu, dxu, dwu}) {
            oomb_set_output(t);
            oomb_build_forward_expand(gr, t);
        }
        oomb_gallocr_t gar = oomb_gallocr_new(cu);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(gar, gr));
        oomb_backend_graph_compute(cu, gr);
        oomb_backend_synchronize(cu);
        const vec lossu = device_values(lu), dx = device_values(dxu), dw = device_values(dwu), lg = device_values(logits);
        vec lse_ref((size_t) N);
        for (int64_t n = 0; n < N; n++) {
            double mx = -INFINITY, s = 0;
            for (int64_t v = 0; v < V; v++) mx = std::max(mx, lg[(size_t) (n * V + v)]);
            for (int64_t v = 0; v < V; v++) s += std::exp(lg[(size_t) (n * V + v)] - mx);
            lse_ref[(size_t) n] = mx + std::log(s);
        }

        // the pair: F, then B reading F's lse tail (what the autodiff builds). mode 0: B an output;
        // 1: a scale of the loss between them (must keep them apart); 2: B's dw added into a non-zero
        // gradient (acc += dw: fuse_accumulations adds it from the GEMM) and its dx copied out
        std::vector<float> acc0((size_t) (E * V));
        for (auto & v : acc0) v = u(rng);
        // 3: a loss read and dw into the gradient (the separate backward adds dw from its GEMM);
        // 4: dloss is F's own {sum, count} (a view of F: must keep them apart, dlogits scaled by the sum)
        for (const int mode : {0, 1, 2, 3, 4}) {
            const bool read_loss = mode == 1 || mode == 3, with_acc = mode == 2 || mode == 3;
            oomb_tensor * l = oomb_linear_cross_entropy(ctx, w, x, labels, -100);
            oomb_tensor * scaled = read_loss ? oomb_scale(ctx, l, 2.0f) : nullptr;
            oomb_tensor * lse = oomb_view_1d(ctx, l->view_src, N, 2 * sizeof(float));
            oomb_tensor * dlm = mode == 4 ? oomb_view_1d(ctx, l->view_src, 2, 0) : dl;
            oomb_tensor * back = oomb_linear_cross_entropy_back(ctx, w, x, labels, dlm, lse, -100, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
            oomb_cgraph * g = oomb_new_graph(ctx);
            oomb_set_output(l->view_src);
            oomb_build_forward_expand(g, l->view_src);
            if (scaled) {
                oomb_set_output(scaled);
                oomb_build_forward_expand(g, scaled);
            }
            oomb_tensor * dx_out = nullptr, * acc_node = nullptr;
            if (with_acc) {
                dx_out = oomb_cont(ctx, oomb_view_2d(ctx, back, E, N, E * sizeof(float), 0));
                acc_node = oomb_add_inplace(ctx, acc, oomb_view_2d(ctx, back, E, V, E * sizeof(float), (size_t) (E * N) * sizeof(float)));
                oomb_set_output(dx_out);
                oomb_build_forward_expand(g, dx_out);
                oomb_build_forward_expand(g, acc_node);
            } else {
                oomb_set_output(back);
                oomb_build_forward_expand(g, back);
            }
            oomb_gallocr_t ga = oomb_gallocr_new(cu);
            ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
            // rows: one block of N (the default), blocks of 7, "oom": the device has no room for the
            // logits of more than 10 rows (a scratch limit), so the pass halves its blocks 33 -> 17 -> 9, and
            // "cap": the backend's block cap set to 12 rows' logits (oomb_backend_set_linear_cross_entropy_block,
            // what a memory plan raises): 3 blocks of 11, in the scratch estimate as in the pass
            for (const char * rows : {"", "7", "oom", "cap"}) {
                const bool oom = strcmp(rows, "oom") == 0, cap = strcmp(rows, "cap") == 0;
                // the default (fused), OOMB_CUDA_FUSE=0 (no fusion at all), OOMB_CUDA_FUSE_LCE=0 (not this one)
                for (const int setting : {0, 1, 2}) {
                    if (setting == 1) env.set("OOMB_CUDA_FUSE", "0"); else env.unset("OOMB_CUDA_FUSE");
                    if (setting == 2) env.set("OOMB_CUDA_FUSE_LCE", "0"); else env.unset("OOMB_CUDA_FUSE_LCE");
                    if (*rows && !oom && !cap) env.set("OOMB_LCE_ROWS", rows); else env.unset("OOMB_LCE_ROWS");
#ifdef OOMB_USE_CUDA
                    const bool real = !harness_on_cpu();
                    if ((oom || cap) && !real) continue;  // no CUDA scratch to limit
                    if (cap) {
                        ASSERT_TRUE(oomb_backend_set_linear_cross_entropy_block(cu, (size_t) (V * 12) * sizeof(float)));
                    }
                    const int64_t before = real ? oomb_cuda_debug_fused_lce_count(cu) : 0;
                    const int64_t before_acc = real ? oomb_cuda_debug_fused_count(cu) : 0;
                    // only where the pass is fused: the separate ops' vocabulary tiles would not fit either
                    const bool fused = setting == 0 && (mode == 0 || mode == 2);
                    if (real && oom && fused) oomb_cuda_debug_set_scratch_limit(cu, (size_t) (V * 10) * sizeof(float));
#else
                    if (oom || cap) continue;  // no CUDA scratch to limit
#endif
                    // poison the results: a pass that skips a block or the forward shows
                    std::vector<float> junk((size_t) oomb_nelements(back), NAN);
                    oomb_tensor_set(back, junk.data(), 0, junk.size() * 4);
                    if (with_acc) oomb_tensor_set(dx_out, junk.data(), 0, (size_t) (E * N) * 4);
                    oomb_tensor_set(l->view_src, junk.data(), 0, (size_t) (N + 2) * 4);
                    if (with_acc) oomb_tensor_set(acc, acc0.data(), 0, acc0.size() * 4);
#ifdef OOMB_USE_CUDA
                    // the memory plan's estimate of the kernels' scratch (oomb_backend_graph_scratch), made before
                    const size_t scratch_est = real ? oomb_backend_graph_scratch(cu, g) : 0;
                    if (real) oomb_cuda_debug_lce_scratch(cu, true);
#endif
                    oomb_backend_graph_compute(cu, g);
                    oomb_backend_synchronize(cu);
#ifdef OOMB_USE_CUDA
                    if (real) {
                        // with fusion off (settings 1, 2) exact; with it on an upper bound whether the pair runs fused
                        // (modes 0, 2) or apart (a loss read or dloss of F between them: modes 1, 3, 4), and with the
                        // scratch limit (oom) the pass asks for its planned block first, then smaller ones
                        const size_t scratch_used = oomb_cuda_debug_lce_scratch(cu, true);
                        if (setting != 0) EXPECT_EQ(scratch_est, scratch_used) << "mode " << mode << " setting " << setting;
                        else EXPECT_GE(scratch_est, scratch_used) << "mode " << mode << " setting " << setting;
                        EXPECT_GT(scratch_used, 0u);
                        oomb_cuda_debug_set_scratch_limit(cu, 0);
                        EXPECT_TRUE(oomb_backend_set_linear_cross_entropy_block(cu, 0));  // the default again
                        EXPECT_EQ(oomb_cuda_debug_fused_lce_count(cu) - before, fused ? 1 : 0)
                            << "V " << V << " rows '" << rows << "' setting " << setting << " mode " << mode;
                        if (fused) EXPECT_EQ(oomb_cuda_debug_last_lce_rows(cu), oom ? 9 : cap ? 11 : *rows ? 7 : N) << "rows per block, '" << rows << "'";
                        EXPECT_EQ(oomb_cuda_debug_fused_count(cu) - before_acc, setting == 0 && with_acc ? 1 : 0) << "dw into the gradient";
                    }
#endif
                    const vec packed = device_values(l->view_src);
                    vec bdx, bdw;
                    if (with_acc) {
                        bdx = device_values(dx_out);
                        const vec a = device_values(acc);
                        for (size_t i = 0; i < a.size(); i++) bdw.push_back(a[i] - (double) acc0[i]);
                    } else {
                        const vec b = device_values(back);
                        bdx.assign(b.begin(), b.begin() + E * N);
                        bdw.assign(b.begin() + E * N, b.end());
                    }
                    const double e_loss = rel_err(vec(packed.begin(), packed.begin() + 2), lossu);
                    const double e_lse = rel_err(vec(packed.begin() + 2, packed.end()), lse_ref);
                    // mode 4: dloss[0] is the loss sum instead of 0.7
                    const double f = mode == 4 ? packed[0] / (double) dlv0 : 1.0;
                    vec dxf = dx, dwf = dw;
                    for (double & v : dxf) v *= f;
                    for (double & v : dwf) v *= f;
                    const double e_dx = rel_err(bdx, dxf);
                    const double e_dw = rel_err(bdw, dwf);
                    printf("  V %lld rows '%s' setting %d mode %d: loss %.3e, lse %.3e, dx %.3e, dw %.3e\n", (long long) V, rows,
                           setting, mode, e_loss, e_lse, e_dx, e_dw);
                    EXPECT_LT(e_loss, k_f32);
                    EXPECT_EQ(packed[1], (double) (N - 1));
                    EXPECT_LT(e_lse, k_f32);
                    EXPECT_LT(e_dx, 1e-2);
                    EXPECT_LT(e_dw, 1e-2);
                    if (read_loss) {
                        EXPECT_NEAR(device_values(scaled)[0], 2.0 * packed[0], 1e-3 * std::fabs(packed[0]));
                    }
                }
            }
            oomb_gallocr_free(ga);
        }
        oomb_gallocr_free(gar);
        oomb_free(ctx);
    }
}

// Through the autodiff with a bf16 LM head: the forward and backward fuse into one pass
// (fuse_linear_ce) and the head's dw adds into its gradient from the GEMM (fuse_accumulations' LCE
// case), with row blocks that do not divide the rows; loss and gradients against the CPU backend.
TEST_F(CudaOps, LinearCrossEntropyFusedThroughAutodiff) {
    REQUIRE_CUDA();
    oombtest::ScopedEnv env({"OOMB_CUDA_FUSE", "OOMB_LCE_ROWS", "OOMB_CUDA_FUSE_LCE"});
    env.unset("OOMB_CUDA_FUSE");
    env.unset("OOMB_CUDA_FUSE_LCE");  // the default: fused (backend-cuda.cu, fuse_linear_ce)
    for (const char * r : {"", "5"}) {
        if (*r) env.set("OOMB_LCE_ROWS", r); else env.unset("OOMB_LCE_ROWS");
        // a trained head, then a frozen one (LoRA, --trainable without the head: the backward asks for dx only)
        for (const bool frozen : {false, true}) {
#ifdef OOMB_USE_CUDA
            const bool real = !harness_on_cpu();
            const int64_t lce0 = real ? oomb_cuda_debug_fused_lce_count(cuda_backend()) : 0;
            const int64_t acc0 = real ? oomb_cuda_debug_fused_count(cuda_backend()) : 0;
#endif
            const std::string what = std::string("linear_cross_entropy autodiff, bf16 head, rows '") + r + "'" +
                                     (frozen ? ", frozen head (dx only)" : "");
            expect_case(what.c_str(), [frozen](Builder & B) -> std::vector<oomb_tensor *> {
                const int64_t E = 40, V = 1203, T = 23;
                oomb_tensor * w = frozen ? B.input(OOMB_TYPE_BF16, E, V, 1, 1, -0.5f, 0.5f) : B.param(OOMB_TYPE_BF16, E, V, 1, 1, -0.5f, 0.5f);
                oomb_tensor * x = B.param(OOMB_TYPE_F32, E, T, 1, 1, -1.0f, 1.0f);
                std::vector<int32_t> lab = B.rand_ids(T, (int32_t) V);
                lab[frozen ? 4 : 2] = -1;
                oomb_tensor * labels = B.ids(lab, T);
                B.loss = oomb_linear_cross_entropy(B.ctx, w, oomb_silu(B.ctx, x), labels, -1);
                if (frozen) return {B.loss, x->grad};
                return {B.loss, w->grad, x->grad};
            }, k_bf16);
#ifdef OOMB_USE_CUDA
            if (real) {
                EXPECT_GE(oomb_cuda_debug_fused_lce_count(cuda_backend()) - lce0, 1) << what << ": forward and backward in one pass";
                if (!frozen) {
                    EXPECT_GE(oomb_cuda_debug_fused_count(cuda_backend()) - acc0, 1) << "the head's dw added into its gradient";
                }
            }
#endif
        }
    }
}

TEST_F(CudaOps, LinearCrossEntropyLabelErrors) {
    REQUIRE_CUDA();
    if (harness_on_cpu()) GTEST_SKIP() << "CUDA error messages (harness run on the CPU)";
    oomb_backend_t cu = cuda_backend();
    oomb_context * in = oomb_init({0, true});
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * w = oomb_new_tensor_2d(in, OOMB_TYPE_BF16, 8, 6);
    oomb_tensor * x = oomb_new_tensor_2d(in, OOMB_TYPE_F32, 8, 3);
    oomb_tensor * labels = oomb_new_tensor_1d(in, OOMB_TYPE_I32, 3);
    oomb_tensor * dl = oomb_new_tensor_1d(in, OOMB_TYPE_F32, 2);
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(in, cu);
    std::vector<uint16_t> wv(48, oomb_fp32_to_bf16(0.25f));
    std::vector<float> xv(24, 0.5f), dv = {1.0f, 0.0f};
    oomb_tensor_set(w, wv.data(), 0, wv.size() * 2);
    oomb_tensor_set(x, xv.data(), 0, xv.size() * 4);
    oomb_tensor_set(dl, dv.data(), 0, dv.size() * 4);
    const int32_t bad[3] = {2, -1, 6};
    oomb_tensor_set(labels, bad, 0, sizeof(bad));
    oomb_tensor * l = oomb_linear_cross_entropy(ctx, w, x, labels, -1);
    oomb_tensor * b = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, nullptr, -1, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
    // three tiles of 2 classes (errors recorded by the first tile's kernel)
    oomb_linear_cross_entropy_set_tile(l, 2);
    oomb_linear_cross_entropy_set_tile(b, 2);
    for (oomb_tensor * t : {l, b}) {
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, t);
        oomb_gallocr_t ga = oomb_gallocr_new(cu);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
        EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, g), "label 6 at row 2 is out of range [0, 6)");
        // the error state is cleared: with valid labels the graph computes; all logits are equal,
        // so each counted row's loss is log(6)
        const int32_t good[3] = {2, -1, 5};
        oomb_tensor_set(labels, good, 0, sizeof(good));
        oomb_backend_graph_compute(cu, g);
        if (t == l) {
            float out[2];
            oomb_tensor_get(l, out, 0, sizeof(out));
            EXPECT_NEAR(out[0], 2.0 * std::log(6.0), 1e-5);
            EXPECT_EQ(out[1], 2.0f);
        }
        oomb_tensor_set(labels, bad, 0, sizeof(bad));
        oomb_gallocr_free(ga);
    }
    // the forward and a backward reading its lse in one graph: the fused pass (fuse_linear_ce)
    // reports the same error, then computes with valid labels
    {
        oombtest::ScopedEnv env({"OOMB_CUDA_FUSE", "OOMB_CUDA_FUSE_LCE"});
        env.unset("OOMB_CUDA_FUSE");
        env.unset("OOMB_CUDA_FUSE_LCE");  // the default: fused (backend-cuda.cu, fuse_linear_ce)
        // a new forward node: the one above was placed by an allocator freed since
        oomb_tensor * l2 = oomb_linear_cross_entropy(ctx, w, x, labels, -1);
        oomb_tensor * lse = oomb_view_1d(ctx, l2->view_src, 3, 2 * sizeof(float));
        oomb_tensor * bb = oomb_linear_cross_entropy_back(ctx, w, x, labels, dl, lse, -1, OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W);
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_set_output(l2->view_src);
        oomb_build_forward_expand(g, l2->view_src);
        oomb_build_forward_expand(g, bb);
        oomb_gallocr_t ga = oomb_gallocr_new(cu);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
#ifdef OOMB_USE_CUDA
        const int64_t before = oomb_cuda_debug_fused_lce_count(cu);
#endif
        EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, g), "label 6 at row 2 is out of range [0, 6)");
#ifdef OOMB_USE_CUDA
        EXPECT_EQ(oomb_cuda_debug_fused_lce_count(cu) - before, 1);
#endif
        const int32_t good[3] = {2, -1, 5};
        oomb_tensor_set(labels, good, 0, sizeof(good));
        oomb_backend_graph_compute(cu, g);
        // l2 is a view the graph does not hold (it was built from l2->view_src): read the bytes
        // it names from the allocated node
        float out[2];
        oomb_tensor_get(l2->view_src, out, l2->view_offs, sizeof(out));
        EXPECT_NEAR(out[0], 2.0 * std::log(6.0), 1e-5);
        EXPECT_EQ(out[1], 2.0f);
        oomb_gallocr_free(ga);
    }
    oomb_buffer_free(buf);
    oomb_free(ctx);
    oomb_free(in);
}
