// CUDA backend against the CPU backend: every op on random data (never zeros) of several shapes,
// odd sizes, broadcasts and non-contiguous views. Each case builds the same graph twice: once on the
// CPU backend (host inputs) and once on the CUDA backend (inputs in a CUDA buffer made by
// oomb_backend_alloc_ctx_tensors and uploaded with oomb_tensor_set; the graph placed by oomb_gallocr).
// The GPU graph's outputs are poisoned (0xFF bytes: NaN) before compute, so an element that is not
// written fails. Relative error ||gpu - cpu|| / ||cpu||: f32 ops < 1e-4; matrix products (bf16
// operands, f32 accumulation) < 3e-2; NaN never passes. Also a transformer block forward + backward
// on both backends (gradients < 3e-2) and compute-time errors. The harness: cuda-ops-harness.h; the LM
// head's tests: test-cuda-linear-ce.cpp.
//
// Without a CUDA build or without a GPU every test is skipped (GTEST_SKIP: a visible SKIPPED line).
#include "cuda-ops-harness.h"

// ---------------------------------------------------------------------------------------------
// Layout, copies and conversions
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, ContPermutedReshapedAndOffsetViews) {
    REQUIRE_CUDA();
    const oomb_type types[3] = {OOMB_TYPE_F32, OOMB_TYPE_F16, OOMB_TYPE_BF16};
    for (oomb_type t : types) {
        expect_case("cont(permute)", [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = B.input(t, 3, 17, 5, 2);
            return {oomb_cont(B.ctx, oomb_permute(B.ctx, a, 2, 0, 3, 1))};
        }, 1e-7);
        expect_case("cont_4d(transpose)", [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = B.input(t, 3, 17, 5, 2);
            return {oomb_cont_4d(B.ctx, oomb_transpose(B.ctx, a), 17 * 3, 5, 2, 1)};
        }, 1e-7);
        expect_case("cont(offset view)", [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * h = B.input(t, 7, 9);
            return {oomb_cont(B.ctx, oomb_view_2d(B.ctx, h, 4, 5, h->nb[1], 2 * h->nb[1] + 3 * oomb_type_size(t)))};
        }, 1e-7);
    }
}

TEST_F(CudaOps, CpyAndCastConvertTypesAnyStrides) {
    REQUIRE_CUDA();
    const oomb_type types[3] = {OOMB_TYPE_F32, OOMB_TYPE_F16, OOMB_TYPE_BF16};
    for (oomb_type st : types) {
        for (oomb_type dt : types) {
            std::string name = std::string("cpy ") + oomb_type_name(st) + " -> transposed " + oomb_type_name(dt);
            expect_case(name.c_str(), [st, dt](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = B.input(st, 33, 3, 2);
                oomb_tensor * b = B.dest(dt, 3, 33, 2);
                return {oomb_cpy(B.ctx, a, oomb_transpose(B.ctx, b))};
            }, 1e-7);
            name = std::string("cpy permuted ") + oomb_type_name(st) + " -> contiguous " + oomb_type_name(dt) + " of another shape";
            expect_case(name.c_str(), [st, dt](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = B.input(st, 5, 7, 3, 2);
                oomb_tensor * b = B.dest(dt, 21, 10);
                return {oomb_cpy(B.ctx, oomb_permute(B.ctx, a, 1, 0, 2, 3), b)};
            }, 1e-7);
            if (st != dt || st == OOMB_TYPE_F32) {
                name = std::string("cast ") + oomb_type_name(st) + " -> " + oomb_type_name(dt) + " (transposed source)";
                expect_case(name.c_str(), [st, dt](Builder & B) -> std::vector<oomb_tensor *> {
                    oomb_tensor * a = B.input(st, 19, 6, 3);
                    return {oomb_cast(B.ctx, oomb_transpose(B.ctx, a), dt)};
                }, 1e-7);
            }
        }
    }
    expect_case("cpy i32", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.ids(B.rand_ids(35, 1000), 7, 5);
        oomb_tensor * b = B.dest(OOMB_TYPE_I32, 5, 7);
        return {oomb_cpy(B.ctx, oomb_transpose(B.ctx, a), b)};
    }, 1e-7);
    // values that round differently in f16 / bf16 (large, tiny, halfway cases)
    expect_case("cast f32 -> bf16 / f16, wide range", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.input(OOMB_TYPE_F32, 1001, 3, 1, 1, -70000.0f, 70000.0f);
        oomb_tensor * s = B.input(OOMB_TYPE_F32, 1001, 3, 1, 1, -1e-5f, 1e-5f);
        return {oomb_cast(B.ctx, a, OOMB_TYPE_BF16), oomb_cast(B.ctx, s, OOMB_TYPE_F16), oomb_cast(B.ctx, s, OOMB_TYPE_BF16)};
    }, 1e-7);
}

// ---------------------------------------------------------------------------------------------
// Element-wise and broadcasting
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, BinaryBroadcastAndViews) {
    REQUIRE_CUDA();
    const int64_t bshapes[][4] = {{33, 7, 3, 2}, {33, 1, 1, 1}, {1, 7, 1, 1}, {33, 7, 1, 2}, {1, 1, 1, 1}, {11, 7, 3, 1}, {1, 1, 3, 2}};
    const oomb_op ops[3] = {OOMB_OP_ADD, OOMB_OP_SUB, OOMB_OP_MUL};
    for (oomb_op op : ops) {
        for (const auto & bs : bshapes) {
            for (int view = 0; view < 2; view++) {
                char name[160];
                snprintf(name, sizeof(name), "%s b [%lld,%lld,%lld,%lld]%s", oomb_op_name(op), (long long) bs[0], (long long) bs[1],
                         (long long) bs[2], (long long) bs[3], view ? " (permuted a, transposed b)" : "");
                expect_case(name, [&bs, op, view](Builder & B) -> std::vector<oomb_tensor *> {
                    oomb_tensor * a;
                    oomb_tensor * b;
                    if (view) {
                        a = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 7, 33, 3, 2), 1, 0, 2, 3);
                        b = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, bs[1], bs[0], bs[2], bs[3]));
                    } else {
                        a = B.input(OOMB_TYPE_F32, 33, 7, 3, 2);
                        b = B.input(OOMB_TYPE_F32, bs[0], bs[1], bs[2], bs[3]);
                    }
                    oomb_tensor * r = op == OOMB_OP_ADD ? oomb_add(B.ctx, a, b) : op == OOMB_OP_SUB ? oomb_sub(B.ctx, a, b) : oomb_mul(B.ctx, a, b);
                    return {r};
                }, k_f32);
            }
        }
    }
    // four elements at a time: same shapes, a row of the full width, a row dividing it; and an
    // operand at an odd offset (not 16-byte aligned: the one-at-a-time kernel)
    expect_case("add / sub / mul [64, 12, 3] with [64, 12, 3], [64], [16]", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.input(OOMB_TYPE_F32, 64, 12, 3);
        oomb_tensor * r = oomb_add(B.ctx, a, B.input(OOMB_TYPE_F32, 64, 12, 3));
        r = oomb_sub(B.ctx, r, B.input(OOMB_TYPE_F32, 64));
        return {oomb_mul(B.ctx, r, B.input(OOMB_TYPE_F32, 16))};
    }, k_f32);
    expect_case("add [64, 12] + view at element offset 1", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.input(OOMB_TYPE_F32, 64, 12);
        oomb_tensor * b = oomb_view_2d(B.ctx, B.input(OOMB_TYPE_F32, 64 * 12 + 1), 64, 12, 64 * sizeof(float), sizeof(float));
        return {oomb_add(B.ctx, a, b), oomb_mul(B.ctx, a, b)};
    }, k_f32);
    // a large row broadcast (the residual / norm-weight pattern) and in-place chains
    expect_case("mul [896, 301] * [896] then add, scale (in place)", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * x = B.input(OOMB_TYPE_F32, 896, 301);
        oomb_tensor * w = B.input(OOMB_TYPE_F32, 896);
        oomb_tensor * y = oomb_scale(B.ctx, oomb_add(B.ctx, oomb_mul(B.ctx, oomb_scale(B.ctx, x, 1.5f), w), x), -0.7f);
        return {y};
    }, k_f32);
}

TEST_F(CudaOps, AddInplace) {
    REQUIRE_CUDA();
    expect_case("add_inplace a [31, 9, 2] += b [31, 1, 2]", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.input(OOMB_TYPE_F32, 31, 9, 2);
        oomb_tensor * b = B.input(OOMB_TYPE_F32, 31, 1, 2);
        return {oomb_add_inplace(B.ctx, a, b)};
    }, k_f32);
    expect_case("add_inplace into a transposed view", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.input(OOMB_TYPE_F32, 9, 31);
        oomb_tensor * b = B.input(OOMB_TYPE_F32, 31, 9);
        return {oomb_add_inplace(B.ctx, oomb_transpose(B.ctx, a), b)};
    }, k_f32);
}

TEST_F(CudaOps, UnaryAndGatedOps) {
    REQUIRE_CUDA();
    for (int view = 0; view < 2; view++) {
        auto src = [view](Builder & B, float lo = -4.0f, float hi = 4.0f) {
            return view ? oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 13, 37, 3, 1, lo, hi)) : B.input(OOMB_TYPE_F32, 37, 13, 3, 1, lo, hi);
        };
        expect_case(view ? "scale (transposed)" : "scale", [&](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_scale(B.ctx, src(B), 0.37f)};
        }, k_f32);
        expect_case(view ? "silu (transposed)" : "silu", [&](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_silu(B.ctx, src(B, -12.0f, 12.0f))};
        }, k_f32);
        expect_case(view ? "silu_back (transposed)" : "silu_back", [&](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_silu_back(B.ctx, src(B, -12.0f, 12.0f), src(B))};
        }, k_f32);
        expect_case(view ? "swiglu (transposed)" : "swiglu", [&](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_swiglu(B.ctx, src(B, -12.0f, 12.0f), src(B))};
        }, k_f32);
        expect_case(view ? "swiglu_back (transposed)" : "swiglu_back", [&](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_swiglu_back(B.ctx, src(B, -12.0f, 12.0f), src(B), src(B))};
        }, k_f32);
    }
    // bf16 results (oomb_mul_ext, oomb_swiglu_ext): four at a time, one at a time (odd sizes, views)
    for (int view = 0; view < 2; view++) {
        expect_case(view ? "mul_ext / swiglu_ext bf16 results (views, odd sizes)" : "mul_ext / swiglu_ext bf16 results",
                    [view](Builder & B) -> std::vector<oomb_tensor *> {
            const int64_t n0 = view ? 37 : 896, n1 = view ? 5 : 33;
            oomb_tensor * x = view ? oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, n1, n0, 1, 1, -6, 6)) : B.input(OOMB_TYPE_F32, n0, n1, 1, 1, -6, 6);
            oomb_tensor * y = B.input(OOMB_TYPE_F32, n0, n1);
            return {oomb_mul_ext(B.ctx, x, B.input(OOMB_TYPE_F32, n0), OOMB_TYPE_BF16), oomb_swiglu_ext(B.ctx, x, y, OOMB_TYPE_BF16),
                    oomb_mul_ext(B.ctx, x, y, OOMB_TYPE_BF16)};
        }, 1e-3);
    }
    expect_case("swiglu_back_ext bf16 [4864, 67, 1, 2] and transposed [37, 5]", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * g = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 5, 37, 1, 1, -6, 6));
        return {oomb_swiglu_back_ext(B.ctx, B.input(OOMB_TYPE_F32, 4864, 67, 1, 2, -6, 6), B.input(OOMB_TYPE_F32, 4864, 67, 1, 2),
                                     B.input(OOMB_TYPE_F32, 4864, 67, 1, 2), OOMB_TYPE_BF16),
                oomb_swiglu_back_ext(B.ctx, g, B.input(OOMB_TYPE_F32, 37, 5), B.input(OOMB_TYPE_F32, 37, 5), OOMB_TYPE_BF16)};
    }, 1e-3);
    // bf16 gate and up (oomb_mul_mat_ext results): four at a time (contiguous) and one at a time (odd
    // sizes, transposed views), f32 and bf16 results, forward and backward
    for (int view = 0; view < 2; view++) {
        expect_case(view ? "swiglu(_back) bf16 gate, up (views, odd sizes)" : "swiglu(_back) bf16 gate, up",
                    [view](Builder & B) -> std::vector<oomb_tensor *> {
            const int64_t n0 = view ? 37 : 4864, n1 = view ? 5 : 33;
            auto in = [&](float lo, float hi) {
                return view ? oomb_transpose(B.ctx, B.input(OOMB_TYPE_BF16, n1, n0, 1, 1, lo, hi)) : B.input(OOMB_TYPE_BF16, n0, n1, 1, 1, lo, hi);
            };
            oomb_tensor * g = in(-6, 6);
            oomb_tensor * u = in(-1, 1);
            oomb_tensor * dy = B.input(OOMB_TYPE_F32, n0, n1);
            return {oomb_swiglu(B.ctx, g, u), oomb_swiglu_ext(B.ctx, g, u, OOMB_TYPE_BF16), oomb_swiglu_back(B.ctx, g, u, dy),
                    oomb_swiglu_back_ext(B.ctx, g, u, dy, OOMB_TYPE_BF16)};
        }, 1e-3);
    }
    expect_case("swiglu large [4864, 67]", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_swiglu(B.ctx, B.input(OOMB_TYPE_F32, 4864, 67, 1, 1, -6, 6), B.input(OOMB_TYPE_F32, 4864, 67))};
    }, k_f32);
    expect_case("swiglu_back large [4864, 67, 1, 2]", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_swiglu_back(B.ctx, B.input(OOMB_TYPE_F32, 4864, 67, 1, 2, -6, 6), B.input(OOMB_TYPE_F32, 4864, 67, 1, 2),
                                 B.input(OOMB_TYPE_F32, 4864, 67, 1, 2))};
    }, k_f32);
}

TEST_F(CudaOps, FillRepeatRepeatBack) {
    REQUIRE_CUDA();
    expect_case("fill", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_fill(B.ctx, 17, 3, 2, 5, -2.25f)};
    }, 1e-7);
    const int64_t small[][4] = {{5, 1, 3, 1}, {1, 4, 1, 2}, {5, 4, 3, 2}, {1, 1, 1, 1}};
    for (const auto & s : small) {
        for (int view = 0; view < 2; view++) {
            char name[128];
            snprintf(name, sizeof(name), "repeat [%lld,%lld,%lld,%lld] -> [15, 8, 3, 4]%s", (long long) s[0], (long long) s[1],
                     (long long) s[2], (long long) s[3], view ? " (transposed source)" : "");
            expect_case(name, [&s, view](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = view ? oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2], s[3]))
                                       : B.input(OOMB_TYPE_F32, s[0], s[1], s[2], s[3]);
                oomb_tensor * shape = B.input(OOMB_TYPE_F32, 15, 8, 3, 4);
                return {oomb_repeat(B.ctx, a, shape)};
            }, 1e-7);
            snprintf(name, sizeof(name), "repeat_back [15, 8, 3, 4] -> [%lld,%lld,%lld,%lld]%s", (long long) s[0], (long long) s[1],
                     (long long) s[2], (long long) s[3], view ? " (permuted source)" : "");
            expect_case(name, [&s, view](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = view ? oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 8, 15, 4, 3), 1, 0, 3, 2)
                                       : B.input(OOMB_TYPE_F32, 15, 8, 3, 4);
                oomb_tensor * shape = B.input(OOMB_TYPE_F32, s[0], s[1], s[2], s[3]);
                return {oomb_repeat_back(B.ctx, a, shape)};
            }, k_f32);
        }
    }
    expect_case("repeat_back bias gradient [896, 1000] -> [896]", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_repeat_back(B.ctx, B.input(OOMB_TYPE_F32, 896, 1000), B.input(OOMB_TYPE_F32, 896))};
    }, k_f32);
    // column sums over rows in three dims: packed (flat row offsets) and permuted (index arithmetic)
    expect_case("repeat_back [96, 40, 7, 2] -> [96]", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_repeat_back(B.ctx, B.input(OOMB_TYPE_F32, 96, 40, 7, 2), B.input(OOMB_TYPE_F32, 96))};
    }, k_f32);
    expect_case("repeat_back [96, 7, 40] (dims 1, 2 permuted) -> [96]", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 96, 40, 7), 0, 2, 1, 3);
        return {oomb_repeat_back(B.ctx, a, B.input(OOMB_TYPE_F32, 96))};
    }, k_f32);
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, SumMeanSumSq) {
    REQUIRE_CUDA();
    const int64_t shapes[][4] = {{1, 1, 1, 1}, {37, 1, 1, 1}, {1000, 37, 1, 1}, {129, 33, 7, 3}, {300007, 3, 1, 1}};
    for (const auto & s : shapes) {
        for (int view = 0; view < 2; view++) {
            char name[128];
            snprintf(name, sizeof(name), "sum / mean / sum_sq [%lld,%lld,%lld,%lld]%s", (long long) s[0], (long long) s[1], (long long) s[2],
                     (long long) s[3], view ? " (transposed)" : "");
            expect_case(name, [&s, view](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = view ? oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2], s[3], 0.0f, 1.0f))
                                       : B.input(OOMB_TYPE_F32, s[0], s[1], s[2], s[3], 0.0f, 1.0f);
                return {oomb_sum(B.ctx, a), oomb_mean(B.ctx, a), oomb_sum_sq(B.ctx, a)};
            }, k_f32);
        }
    }
    // several tensors in one node (oomb_sum_sq_n): every source contiguous (one launch over the list), or one
    // transposed (a launch per source), sizes past the grid cap (300007 x 3) and of one element
    for (int view = 0; view < 2; view++) {
        expect_case(view ? "sum_sq_n, one source transposed" : "sum_sq_n, contiguous sources", [view](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * ts[OOMB_MAX_SRC];
            const int64_t ne0[OOMB_MAX_SRC] = {1, 37, 1000, 300007, 129, 5, 4099, 1, 64, 65, 33, 7, 2};
            for (int k = 0; k < OOMB_MAX_SRC; k++) ts[k] = B.input(OOMB_TYPE_F32, ne0[k], k % 4 + 1, 1, 1, 0.0f, 1.0f);
            if (view) ts[4] = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 33, 129, 1, 1, 0.0f, 1.0f));
            return {oomb_sum_sq_n(B.ctx, ts, OOMB_MAX_SRC), oomb_sum_sq_n(B.ctx, ts + 3, 2)};
        }, k_f32);
    }
}

// ---------------------------------------------------------------------------------------------
// Embeddings
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, GetRowsAndBack) {
    REQUIRE_CUDA();
    const oomb_type types[3] = {OOMB_TYPE_F32, OOMB_TYPE_F16, OOMB_TYPE_BF16};
    for (oomb_type t : types) {
        std::string name = std::string("get_rows ") + oomb_type_name(t) + " [67, 101], ids [13] and [5, 3]";
        expect_case(name.c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = B.input(t, 67, 101);
            oomb_tensor * i1 = B.ids(B.rand_ids(13, 101), 13);
            oomb_tensor * i2 = B.ids({0, 100, 7, 7, 7, 3, 99, 1, 0, 50, 2, 2, 64, 8, 100}, 5, 3);
            return {oomb_get_rows(B.ctx, a, i1), oomb_get_rows(B.ctx, a, i2)};
        }, 1e-7);
    }
    expect_case("get_rows wide rows [1000, 40], 300 ids", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = B.input(OOMB_TYPE_BF16, 1000, 40);
        return {oomb_get_rows(B.ctx, a, B.ids(B.rand_ids(300, 40), 300))};
    }, 1e-7);
    expect_case("get_rows_back duplicates [67] x [13] -> 23 rows", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * dy = B.input(OOMB_TYPE_F32, 67, 13);
        oomb_tensor * ids = B.ids({1, 4, 4, 22, 0, 4, 9, 9, 1, 0, 22, 5, 4}, 13);
        return {oomb_get_rows_back(B.ctx, dy, ids, 23)};
    }, k_f32);
    expect_case("get_rows_back 2-D ids, transposed dy", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * dy = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 5, 33, 4), 1, 0, 2, 3); // [33, 5, 4]
        oomb_tensor * ids = B.ids(B.rand_ids(20, 7), 5, 4);
        return {oomb_get_rows_back(B.ctx, dy, ids, 7)};
    }, k_f32);
    expect_case("get_rows_back many duplicates [896] x 2000 -> 50 rows", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * dy = B.input(OOMB_TYPE_F32, 896, 2000);
        return {oomb_get_rows_back(B.ctx, dy, B.ids(B.rand_ids(2000, 50), 2000), 50)};
    }, k_f32);
}

// ---------------------------------------------------------------------------------------------
// Matrix products (bf16 operands, f32 accumulation)
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, MulMat) {
    REQUIRE_CUDA();
    // bf16 results (oomb_mul_mat_ext): one product, a transposed b, a batched broadcast
    expect_case("mul_mat_ext bf16 results", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * bt = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 31, 67));
        return {oomb_mul_mat_ext(B.ctx, B.input(OOMB_TYPE_BF16, 512, 384), B.input(OOMB_TYPE_BF16, 512, 200), OOMB_TYPE_BF16),
                oomb_mul_mat_ext(B.ctx, B.input(OOMB_TYPE_F32, 67, 45), bt, OOMB_TYPE_BF16),
                oomb_mul_mat_ext(B.ctx, B.input(OOMB_TYPE_BF16, 40, 24, 2, 3), B.input(OOMB_TYPE_F32, 40, 19, 4, 3), OOMB_TYPE_BF16)};
    }, k_bf16);
    const oomb_type types[3] = {OOMB_TYPE_F32, OOMB_TYPE_F16, OOMB_TYPE_BF16};
    for (oomb_type t : types) {
        const std::string tn = oomb_type_name(t);
        expect_case(("mul_mat a " + tn + " [67, 45] x b [67, 29]").c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_mul_mat(B.ctx, B.input(t, 67, 45), B.input(OOMB_TYPE_F32, 67, 29))};
        }, k_bf16);
        expect_case(("mul_mat a " + tn + " [512, 384] x b [512, 200]").c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_mul_mat(B.ctx, B.input(t, 512, 384), B.input(OOMB_TYPE_F32, 512, 200))};
        }, k_bf16);
        expect_case(("mul_mat transposed a " + tn + " x b").c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = oomb_transpose(B.ctx, B.input(t, 45, 67)); // [67, 45], unit stride in dim 1
            return {oomb_mul_mat(B.ctx, a, B.input(OOMB_TYPE_F32, 67, 31))};
        }, k_bf16);
        expect_case(("mul_mat a " + tn + " x transposed b").c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * b = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 31, 67)); // [67, 31]
            return {oomb_mul_mat(B.ctx, B.input(t, 67, 45), b)};
        }, k_bf16);
        expect_case(("mul_mat row-offset view a " + tn).c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * w = B.input(t, 80, 50);
            oomb_tensor * a = oomb_view_2d(B.ctx, w, 64, 40, w->nb[1], 8 * w->nb[1] + 4 * oomb_type_size(t)); // ld 80 > K 64
            return {oomb_mul_mat(B.ctx, a, B.input(OOMB_TYPE_F32, 64, 17))};
        }, k_bf16);
        expect_case(("mul_mat batched broadcast a " + tn + " [40, 24, 2, 3] x b [40, 19, 4, 3]").c_str(),
                    [t](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_mul_mat(B.ctx, B.input(t, 40, 24, 2, 3), B.input(OOMB_TYPE_F32, 40, 19, 4, 3))};
        }, k_bf16);
        expect_case(("mul_mat batched broadcast a " + tn + " [40, 24, 3, 1] x b [40, 19, 3, 2]").c_str(),
                    [t](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_mul_mat(B.ctx, B.input(t, 40, 24, 3, 1), B.input(OOMB_TYPE_F32, 40, 19, 3, 2))};
        }, k_bf16);
        expect_case(("mul_mat single a " + tn + " over batched b [40, 19, 3, 2]").c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            return {oomb_mul_mat(B.ctx, B.input(t, 40, 24), B.input(OOMB_TYPE_F32, 40, 19, 3, 2))};
        }, k_bf16);
    }
    // bf16 b operands read in place (oomb_mul_ext / oomb_swiglu_ext results): contiguous (also
    // batched), transposed (the dW pattern), rows with ld > K; and a permuted batched one (copied)
    expect_case("mul_mat bf16 b: contiguous, batched, transposed, strided, permuted", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * b16 = oomb_cast(B.ctx, B.input(OOMB_TYPE_F32, 40, 67, 2, 3), OOMB_TYPE_BF16);  // [40, 67, 2, 3]
        oomb_tensor * w = B.input(OOMB_TYPE_BF16, 40, 24);
        oomb_tensor * flat = oomb_view_2d(B.ctx, b16, 40, 67, b16->nb[1], 0);
        oomb_tensor * r1 = oomb_mul_mat(B.ctx, w, flat);
        oomb_tensor * r2 = oomb_mul_mat(B.ctx, B.input(OOMB_TYPE_BF16, 40, 24, 2, 1), b16);
        oomb_tensor * r3 = oomb_mul_mat(B.ctx, oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 19, 67)), oomb_transpose(B.ctx, flat));  // [19, 40]
        oomb_tensor * r4 = oomb_mul_mat(B.ctx, B.input(OOMB_TYPE_BF16, 33, 24), oomb_view_2d(B.ctx, b16, 33, 67, b16->nb[1], 3 * 2));
        oomb_tensor * r5 = oomb_mul_mat(B.ctx, w, oomb_permute(B.ctx, b16, 0, 2, 1, 3));
        return {r1, r2, r3, r4, r5};
    }, k_bf16);
    // the backend keeps bf16 copies of f32 operands while their bytes are unchanged: reused by the
    // second product (plain and transposed view of the same memory), dropped once x is written in place
    expect_case("mul_mat kept bf16 copy: reused, then x written in place", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * x = B.input(OOMB_TYPE_F32, 64, 33);
        oomb_tensor * w1 = B.input(OOMB_TYPE_BF16, 64, 20);
        oomb_tensor * w2 = B.input(OOMB_TYPE_BF16, 64, 20);
        oomb_tensor * y1 = oomb_mul_mat(B.ctx, w1, x);
        oomb_tensor * y2 = oomb_mul_mat(B.ctx, w2, x);
        oomb_tensor * y3 = oomb_mul_mat(B.ctx, oomb_transpose(B.ctx, x), B.input(OOMB_TYPE_F32, 33, 9));  // [64, 9]
        oomb_tensor * x2 = oomb_add_inplace(B.ctx, x, B.input(OOMB_TYPE_F32, 64, 33));
        oomb_tensor * y4 = oomb_mul_mat(B.ctx, w1, x2);
        return {y1, y2, y3, y4};
    }, k_bf16);
    // weight-gradient products (autodiff: dW = x^T dy): both operands transposed views of f32
    // activations, converted to bf16 in memory order with the cuBLAS ops flipped; and a transposed
    // view with padded rows (ld > ne1: the transposing copy)
    expect_case("mul_mat transposed f32 a x transposed f32 b", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 45, 267));  // [267, 45]
        oomb_tensor * b = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 31, 267));  // [267, 31]
        return {oomb_mul_mat(B.ctx, a, b)};
    }, k_bf16);
    expect_case("mul_mat transposed padded-row views", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * wa = B.input(OOMB_TYPE_F32, 50, 67);
        oomb_tensor * a = oomb_transpose(B.ctx, oomb_view_2d(B.ctx, wa, 45, 67, wa->nb[1], 0));  // [67, 45], ld 50
        oomb_tensor * wb = B.input(OOMB_TYPE_F32, 40, 67);
        oomb_tensor * b = oomb_transpose(B.ctx, oomb_view_2d(B.ctx, wb, 31, 67, wb->nb[1], 4 * 4));  // [67, 31], ld 40
        return {oomb_mul_mat(B.ctx, a, b)};
    }, k_bf16);
    // (from a review) flipped-op paths with view offsets, broadcast b, minimal sizes, and the
    // autodiff's actual dW pattern on the packed swiglu gradient (the dup half sits at an offset)
    expect_case("mul_mat transposed x transposed offset view", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * p = B.input(OOMB_TYPE_F32, 31, 267, 1, 2);
        oomb_tensor * b = oomb_transpose(B.ctx, oomb_view_2d(B.ctx, p, 31, 267, p->nb[1], p->nb[3]));  // [267, 31] at offset
        oomb_tensor * wa = B.input(OOMB_TYPE_F32, 45, 270);
        oomb_tensor * a = oomb_transpose(B.ctx, oomb_view_2d(B.ctx, wa, 45, 267, wa->nb[1], 3 * wa->nb[1]));  // [267, 45] at offset
        return {oomb_mul_mat(B.ctx, a, b)};
    }, k_bf16);
    expect_case("mul_mat transposed f32 a x broadcast batched b", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 45, 67));  // [67, 45]
        return {oomb_mul_mat(B.ctx, a, B.input(OOMB_TYPE_F32, 67, 19, 3, 2))};
    }, k_bf16);
    expect_case("mul_mat transposed 2x2 x transposed 2x2", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_mul_mat(B.ctx, oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 2, 2)), oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 2, 2)))};
    }, k_bf16);
    expect_case("mul_mat bf16 a x transposed b (dx pattern)", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * a = oomb_transpose(B.ctx, B.input(OOMB_TYPE_BF16, 45, 67));  // [67, 45] in place, op N
        oomb_tensor * b = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 31, 67));   // [67, 31] op T
        return {oomb_mul_mat(B.ctx, a, b)};
    }, k_bf16);
    expect_case("swiglu_back -> dW of both halves", [](Builder & B) -> std::vector<oomb_tensor *> {
        const int64_t F = 48, T = 133, E = 40;
        oomb_tensor * p = oomb_swiglu_back(B.ctx, B.input(OOMB_TYPE_F32, F, T, 1, 1, -4, 4), B.input(OOMB_TYPE_F32, F, T), B.input(OOMB_TYPE_F32, F, T));
        oomb_tensor * dg = oomb_view_4d(B.ctx, p, F, T, 1, 1, p->nb[1], p->nb[2], p->nb[3], 0);
        oomb_tensor * du = oomb_view_4d(B.ctx, p, F, T, 1, 1, p->nb[1], p->nb[2], p->nb[3], p->nb[3]);
        oomb_tensor * xt = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, E, T));
        return {oomb_mul_mat(B.ctx, xt, oomb_transpose(B.ctx, dg)), oomb_mul_mat(B.ctx, xt, oomb_transpose(B.ctx, du))};
    }, k_bf16);
    expect_case("swiglu_back 4-D ne3 = 3, permuted operands", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * g = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 3, 37, 2, 3, -6, 6), 1, 0, 2, 3);
        oomb_tensor * u = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 2, 3, 37, 3), 2, 1, 0, 3);
        return {oomb_swiglu_back(B.ctx, g, u, B.input(OOMB_TYPE_F32, 37, 3, 2, 3))};
    }, k_f32);
    // attention-style products: q . k^T and p . v with permuted operands
    expect_case("mul_mat permuted k x permuted q (scores)", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * q = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 32, 4, 21), 0, 2, 1, 3); // [32, 21, 4]
        oomb_tensor * k = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 32, 2, 27), 0, 2, 1, 3); // [32, 27, 2]
        return {oomb_mul_mat(B.ctx, k, q)};                                                     // [27, 21, 4]
    }, k_bf16);
    expect_case("mul_mat transposed permuted v x p", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * v = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, 32, 2, 27), 1, 2, 0, 3);  // [27, 32, 2] (unit stride in dim 1)
        oomb_tensor * p = B.input(OOMB_TYPE_F32, 27, 21, 4);
        return {oomb_mul_mat(B.ctx, v, p)};                                                      // [32, 21, 4]
    }, k_bf16);
    expect_case("mul_mat K = 1 and N = 1", [](Builder & B) -> std::vector<oomb_tensor *> {
        return {oomb_mul_mat(B.ctx, B.input(OOMB_TYPE_BF16, 1, 33), B.input(OOMB_TYPE_F32, 1, 7)),
                oomb_mul_mat(B.ctx, B.input(OOMB_TYPE_F32, 300, 77), B.input(OOMB_TYPE_F32, 300, 1))};
    }, k_bf16);
}

// ---------------------------------------------------------------------------------------------
// Normalization, rotary embedding, softmax
// ---------------------------------------------------------------------------------------------

// Block types: the GPU's dequantization (cuda/dequant.cu) is bit-exact against the CPU's (f32
// dequantization, then oomb_fp32_to_bf16 for bf16): rel_err 0 exactly (tolerance 1e-30); mul_mat
// with a quantized a (dequantized into the bf16 copy slots, then cuBLAS) vs the CPU backend, forward
// and the db direction mul_mat(transpose(a), dy), at the bf16 products' tolerance. Sizes divide no tile.
TEST_F(CudaOps, QuantizedDequantAndMulMat) {
    REQUIRE_CUDA();
    const oomb_type types[] = {OOMB_TYPE_Q8_0, OOMB_TYPE_Q4_0, OOMB_TYPE_Q4_1, OOMB_TYPE_Q5_0, OOMB_TYPE_Q5_1,
                               OOMB_TYPE_Q2_K, OOMB_TYPE_Q3_K, OOMB_TYPE_Q4_K, OOMB_TYPE_Q5_K, OOMB_TYPE_Q6_K};
    for (oomb_type t : types) {
        const std::string tn = oomb_type_name(t);
        const int64_t K = oomb_blck_size(t) == 256 ? 768 : 32 * 25;
        expect_case(("dequantize " + tn + " to f32 and bf16, bit-exact").c_str(), [t, K](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = B.qinput(t, K, 37);
            return {oomb_cast(B.ctx, a, OOMB_TYPE_F32), oomb_cast(B.ctx, a, OOMB_TYPE_BF16)};
        }, 1e-30);
        // the kernel's tiles (256 threads: 8 blocks of 256 or 64 of 32): K = 256*3 / 32*7 with 37 rows
        // (111 / 259 blocks, no whole number of tiles); and every other row (a strided view, so rows
        // are not merged) of 11 / 69 blocks (two tiles per row, the second partial), starting at
        // row 1: its address is 2 mod 4 for q8_0, q4_0, q5_0, q3_k and q6_k (the staging's byte ends)
        const int64_t bs = oomb_blck_size(t);
        expect_case(("dequantize " + tn + " K = " + std::to_string(bs == 256 ? 768 : 224) + ", 37 rows").c_str(), [t, bs](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = B.qinput(t, bs == 256 ? 256 * 3 : 32 * 7, 37);
            return {oomb_cast(B.ctx, a, OOMB_TYPE_F32), oomb_cast(B.ctx, a, OOMB_TYPE_BF16)};
        }, 1e-30);
        expect_case(("dequantize " + tn + " every other row from row 1").c_str(), [t, bs](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * a = B.qinput(t, bs * (bs == 256 ? 11 : 69), 26);
            oomb_tensor * v = oomb_view_2d(B.ctx, a, a->ne[0], 13, 2 * a->nb[1], a->nb[1]);
            return {oomb_cast(B.ctx, v, OOMB_TYPE_F32), oomb_cast(B.ctx, v, OOMB_TYPE_BF16)};
        }, 1e-30);
        for (int64_t N : {1, 5, 129}) {
            expect_case(("mul_mat quantized a " + tn + " [" + std::to_string(K) + ", 300] x b, N = " + std::to_string(N)).c_str(),
                        [t, K, N](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = B.qinput(t, K, 300);
                return {oomb_mul_mat(B.ctx, a, B.input(OOMB_TYPE_F32, K, N)),
                        oomb_mul_mat(B.ctx, oomb_transpose(B.ctx, a), B.input(OOMB_TYPE_F32, 300, N))};
            }, k_bf16);
        }
    }
}

TEST_F(CudaOps, RmsNormAndBack) {
    REQUIRE_CUDA();
    // one warp per row (ne0 % 4 == 0, up to 4096: 896, 3000, 4096) and one block per row (37, 1, 4100,
    // 898: rows not 16-byte aligned, transposed views)
    const int64_t shapes[][3] = {{896, 13, 1}, {37, 5, 3}, {1, 9, 1}, {3000, 4, 2}, {4096, 3, 1}, {4100, 3, 1}, {898, 5, 1}};
    for (const auto & s : shapes) {
        for (int view = 0; view < 2; view++) {
            char name[128];
            snprintf(name, sizeof(name), "rms_norm / rms_norm_back [%lld, %lld, %lld]%s", (long long) s[0], (long long) s[1], (long long) s[2],
                     view ? " (transposed inputs)" : "");
            expect_case(name, [&s, view](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * x;
                oomb_tensor * dy;
                if (view == 2) {  // rows keep unit stride: no prepared copy, k_rms_norm_dw_partial<false>
                    x = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, s[0], s[2], s[1], 1, -2, 2), 0, 2, 1, 3);
                    dy = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, s[0], s[2], s[1]), 0, 2, 1, 3);
                } else if (view) {
                    x = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2], 1, -2, 2));
                    dy = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2]));
                } else {
                    x = B.input(OOMB_TYPE_F32, s[0], s[1], s[2], 1, -2, 2);
                    dy = B.input(OOMB_TYPE_F32, s[0], s[1], s[2]);
                }
                return {oomb_rms_norm(B.ctx, x, 1e-6f), oomb_rms_norm_back(B.ctx, x, dy, 1e-6f)};
            }, k_f32);
        }
    }
}

// rms_norm_mul (f32 and bf16 results) and rms_norm_mul_back (dx alone; dx and dw packed): the warp-
// per-row kernels (ne0 % 4 == 0, up to 4096) and the block-per-row ones (37, 1, 4100, 898), dw's
// column sums over one partial (few rows) and many (3,000 rows: 23 partials), transposed inputs.
// Rows of up to 1,024 floats with dw take the one-pass kernel (k_rms_norm_back_dw: 896, 64, 100, 1024,
// 132 (33 float4 per row: a second, almost empty column group per lane), 512 over 2,100 / 257 rows).
TEST_F(CudaOps, RmsNormMulAndBack) {
    REQUIRE_CUDA();
    const int64_t shapes[][3] = {{896, 13, 1}, {37, 5, 3}, {1, 9, 1}, {3000, 4, 2}, {4096, 3, 1}, {4100, 3, 1}, {898, 5, 1},
                                 {64, 3000, 1}, {100, 1001, 1}, {1024, 2100, 1}, {132, 700, 1}, {512, 257, 1}};
    for (const auto & s : shapes) {
        for (int view = 0; view < 3; view++) {
            char name[128];
            snprintf(name, sizeof(name), "rms_norm_mul(_back) [%lld, %lld, %lld]%s", (long long) s[0], (long long) s[1], (long long) s[2],
                     view == 1 ? " (transposed inputs)" : view == 2 ? " (permuted dims 1, 2: unit rows, not flat)" : "");
            expect_case(name, [&s, view](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * x;
                oomb_tensor * dy;
                if (view) {
                    x = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2], 1, -2, 2));
                    dy = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2]));
                } else {
                    x = B.input(OOMB_TYPE_F32, s[0], s[1], s[2], 1, -2, 2);
                    dy = B.input(OOMB_TYPE_F32, s[0], s[1], s[2]);
                }
                oomb_tensor * w = B.input(OOMB_TYPE_F32, s[0], 1, 1, 1, 0.5f, 1.5f);
                return {oomb_rms_norm_mul(B.ctx, x, w, 1e-6f), oomb_rms_norm_mul_ext(B.ctx, x, w, 1e-6f, OOMB_TYPE_BF16),
                        oomb_rms_norm_mul_back(B.ctx, x, w, dy, 1e-6f, false), oomb_rms_norm_mul_back(B.ctx, x, w, dy, 1e-6f, true)};
            }, k_f32);
        }
    }
}

// rms_norm_mul_back with dw: the one-pass kernel (k_rms_norm_back_dw, rows of up to 1,024 floats) gives the two
// passes' bits exactly (OOMB_CUDA_NORM_ONEPASS=0), dx and dw, written and added into an accumulation (as
// fuse_accumulations runs it), on rows that do not fill a lane's last column group and row counts not a multiple
// of the 8 warps.
TEST_F(CudaOps, RmsNormMulBackOnePassBitIdentical) {
    REQUIRE_CUDA();
    oomb_backend_t cu = cuda_backend();
    oombtest::ScopedEnv env({"OOMB_CUDA_NORM_ONEPASS"});
    const int64_t shapes[][2] = {{896, 301}, {132, 700}, {1024, 2100}, {64, 3000}, {576, 5}};
    for (const auto & s : shapes) {
        const int64_t ne0 = s[0], nr = s[1];
        oomb_context * ctx = oomb_init({0, true});
        oomb_tensor * x = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, ne0, nr), * dy = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, ne0, nr);
        oomb_tensor * w = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, ne0), * c0 = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, ne0, nr);
        oomb_tensor * back = oomb_rms_norm_mul_back(ctx, x, w, dy, 1e-6f, true);  // [dx; dw] packed
        oomb_tensor * dx = oomb_view_2d(ctx, back, ne0, nr, (size_t) ne0 * sizeof(float), 0);
        oomb_tensor * sum = oomb_add(ctx, c0, dx);  // the residual-gradient sum (fused into the kernel on the GPU)
        oomb_tensor * dw = oomb_cont(ctx, oomb_view_1d(ctx, back, ne0, (size_t) (ne0 * nr) * sizeof(float)));
        oomb_set_output(sum);
        oomb_set_output(dw);
        oomb_tensor * back2 = oomb_rms_norm_mul_back(ctx, x, w, dy, 1e-6f, true);  // written, not added
        oomb_set_output(back2);
        oomb_cgraph * g = oomb_new_graph(ctx);
        oomb_build_forward_expand(g, sum);
        oomb_build_forward_expand(g, dw);
        oomb_build_forward_expand(g, back2);
        oomb_gallocr_t ga = oomb_gallocr_new(cu);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
        std::mt19937 rng(7 + (unsigned) ne0);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        auto fill = [&](oomb_tensor * t, float lo, float hi) {
            std::vector<float> v((size_t) oomb_nelements(t));
            for (auto & e : v) e = lo + (hi - lo) * (0.5f * (u(rng) + 1.0f));
            oomb_tensor_set(t, v.data(), 0, v.size() * 4);
        };
        fill(x, -2.0f, 2.0f);
        fill(dy, -1.0f, 1.0f);
        fill(w, 0.5f, 1.5f);
        fill(c0, -1.0f, 1.0f);
        std::vector<std::vector<uint8_t>> got[2];
        for (int two = 0; two < 2; two++) {
            if (two) env.set("OOMB_CUDA_NORM_ONEPASS", "0"); else env.unset("OOMB_CUDA_NORM_ONEPASS");
            oomb_backend_graph_compute(cu, g);
            oomb_backend_synchronize(cu);
            for (const oomb_tensor * t : {sum, dw, back2}) {
                std::vector<uint8_t> b(oomb_nbytes(t));
                oomb_tensor_get(t, b.data(), 0, b.size());
                got[two].push_back(std::move(b));
            }
        }
        const char * names[] = {"dx added into the sum", "dw (with the sum)", "[dx; dw] written"};
        for (int k = 0; k < 3; k++) EXPECT_TRUE(got[0][k] == got[1][k]) << names[k] << ", rows of " << ne0 << " x " << nr;
        oomb_gallocr_free(ga);
        oomb_free(ctx);
    }
}

// rope / rope_back, or with freq factors in [1, 32] (Llama 3's range) rope_ext / rope_back_ext, and
// the round trip, on each case as given and on a permuted input.
struct RopeCase { int64_t D, H, T, B; int n_dims; float theta; int32_t pmax; };
static void expect_rope_cases(const std::vector<RopeCase> & cases, bool with_ff) {
    for (const RopeCase & cs : cases) {
        for (int view = 0; view < 2; view++) {
            char name[176];
            snprintf(name, sizeof(name), "%s D %lld H %lld T %lld n_dims %d theta %g pos < %d%s",
                     with_ff ? "rope_ext / rope_back_ext" : "rope / rope_back", (long long) cs.D, (long long) cs.H, (long long) cs.T,
                     cs.n_dims, cs.theta, cs.pmax, view ? " (permuted input)" : "");
            expect_case(name, [&cs, view, with_ff](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * a = view ? oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, cs.D, cs.T, cs.H, cs.B), 0, 2, 1, 3)
                                       : B.input(OOMB_TYPE_F32, cs.D, cs.H, cs.T, cs.B);
                oomb_tensor * ff = with_ff ? B.input(OOMB_TYPE_F32, cs.n_dims / 2, 1, 1, 1, 1.0f, 32.0f) : nullptr;
                oomb_tensor * pos = B.ids(B.rand_ids(cs.T, cs.pmax), cs.T);
                auto rope = [&](oomb_tensor * x) { return oomb_rope_ext(B.ctx, x, pos, cs.n_dims, cs.theta, ff); };
                auto back = [&](oomb_tensor * x) { return oomb_rope_back_ext(B.ctx, x, pos, cs.n_dims, cs.theta, ff); };
                if (!with_ff) return {oomb_rope(B.ctx, a, pos, cs.n_dims, cs.theta), oomb_rope_back(B.ctx, a, pos, cs.n_dims, cs.theta),
                                      oomb_rope_back(B.ctx, oomb_rope(B.ctx, a, pos, cs.n_dims, cs.theta), pos, cs.n_dims, cs.theta)};
                return {rope(a), back(a), back(rope(a))};
            }, k_f32);
        }
    }
}

TEST_F(CudaOps, RopeAndBack) {
    REQUIRE_CUDA();
    // whole rows (n_dims == D: the angle table and k_rope_apply) with 4 / 2 / 1 pairs per thread (D 64, 128; 12; 6),
    // partial rotation (the per-token kernel)
    expect_rope_cases({{64, 4, 9, 2, 64, 1000000.0f, 200000}, {128, 3, 17, 1, 128, 10000.0f, 40}, {16, 2, 5, 1, 8, 10000.0f, 131072},
                       {34, 1, 3, 1, 30, 500.0f, 7}, {64, 14, 33, 1, 64, 1000000.0f, 32768}, {6, 300, 4, 1, 4, 10000.0f, 100},
                       {12, 5, 7, 2, 12, 10000.0f, 1000}, {6, 3, 11, 1, 6, 10000.0f, 90}},
                      false);
}

// With frequency factors: partial rotation, odd token counts, a permuted input, n_dims > 8192 (the
// one-block-per-row kernel k_rope), and the gradient through autodiff (rope_back_ext, same factors).
TEST_F(CudaOps, RopeFreqFactors) {
    REQUIRE_CUDA();
    expect_rope_cases({{64, 4, 9, 2, 48, 500000.0f, 131072}, {128, 3, 17, 1, 128, 500000.0f, 65536}, {34, 1, 3, 1, 30, 500.0f, 7},
                       {12, 5, 7, 2, 12, 500000.0f, 70000}, {6, 3, 11, 1, 6, 10000.0f, 90},
                       {6, 300, 5, 1, 4, 10000.0f, 100}, {8200, 1, 3, 1, 8196, 10000.0f, 5000}},
                      true);
    expect_case("rope_ext autodiff: loss, dx (factors shared by two ropes)", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * x = B.param(OOMB_TYPE_F32, 64, 3, 7, 1);
        oomb_tensor * w = B.input(OOMB_TYPE_F32, 64, 3, 7, 1);
        oomb_tensor * ff = B.input(OOMB_TYPE_F32, 24, 1, 1, 1, 1.0f, 8.0f);
        oomb_tensor * pos = B.ids(B.rand_ids(7, 9000), 7);
        oomb_tensor * q = oomb_rope_ext(B.ctx, x, pos, 48, 500000.0f, ff);
        oomb_tensor * k = oomb_rope_ext(B.ctx, oomb_mul(B.ctx, x, w), pos, 48, 500000.0f, ff);
        B.loss = oomb_sum(B.ctx, oomb_mul(B.ctx, q, k));
        return {B.loss, x->grad};
    }, k_f32);
}

TEST_F(CudaOps, SoftMaxAndBack) {
    REQUIRE_CUDA();
    const int64_t shapes[][3] = {{29, 13, 2}, {1000, 7, 1}, {1, 5, 1}, {4100, 3, 1}};
    const int causals[] = {-1, 0, 3};
    for (const auto & s : shapes) {
        for (int causal : causals) {
            for (int view = 0; view < 2; view++) {
                char name[128];
                snprintf(name, sizeof(name), "soft_max / soft_max_back [%lld, %lld, %lld] causal %d%s", (long long) s[0], (long long) s[1],
                         (long long) s[2], causal, view ? " (transposed)" : "");
                expect_case(name, [&s, causal, view](Builder & B) -> std::vector<oomb_tensor *> {
                    oomb_tensor * x = view ? oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, s[1], s[0], s[2], 1, -6, 6))
                                           : B.input(OOMB_TYPE_F32, s[0], s[1], s[2], 1, -6, 6);
                    oomb_tensor * dy = B.input(OOMB_TYPE_F32, s[0], s[1], s[2]);
                    oomb_tensor * y = oomb_soft_max(B.ctx, x, 0.37f, causal);
                    return {y, oomb_soft_max_back(B.ctx, y, dy, 0.37f)};
                }, k_f32);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reference attention
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, AttnAndBack) {
    REQUIRE_CUDA();
    struct C { int64_t D, H, Hkv, T, S, B; };
    const C cases[] = {{16, 4, 2, 7, 11, 2}, {64, 4, 1, 40, 40, 1}, {128, 2, 2, 5, 300, 1}, {24, 6, 3, 130, 133, 1}};
    for (const C & cs : cases) {
        char name[160];
        snprintf(name, sizeof(name), "attn / attn_back D %lld H %lld Hkv %lld T %lld S %lld B %lld", (long long) cs.D, (long long) cs.H,
                 (long long) cs.Hkv, (long long) cs.T, (long long) cs.S, (long long) cs.B);
        expect_case(name, [&cs](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * q = B.input(OOMB_TYPE_F32, cs.D, cs.H, cs.T, cs.B, -2, 2);
            oomb_tensor * k = oomb_permute(B.ctx, B.input(OOMB_TYPE_F32, cs.D, cs.S, cs.Hkv, cs.B, -2, 2), 0, 2, 1, 3); // non-contiguous
            oomb_tensor * v = B.input(OOMB_TYPE_F32, cs.D, cs.Hkv, cs.S, cs.B);
            oomb_tensor * dout = B.input(OOMB_TYPE_F32, cs.D, cs.H, cs.T, cs.B);
            const float scale = 1.0f / std::sqrt((float) cs.D);
            return {oomb_attn(B.ctx, q, k, v, scale), oomb_attn_back(B.ctx, q, k, v, dout, scale)};
        }, k_f32);
    }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, CrossEntropyAndBack) {
    REQUIRE_CUDA();
    const int64_t shapes[][2] = {{151, 13}, {1000, 7}, {32000, 5}, {2, 3}};
    for (const auto & s : shapes) {
        char name[128];
        snprintf(name, sizeof(name), "cross_entropy_loss / back [%lld, %lld]", (long long) s[0], (long long) s[1]);
        expect_case(name, [&s](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * logits = B.input(OOMB_TYPE_F32, s[0], s[1], 1, 1, -8, 8);
            std::vector<int32_t> lab = B.rand_ids(s[1], (int32_t) s[0]);
            lab[1] = -100; // ignored
            oomb_tensor * labels = B.ids(lab, s[1]);
            oomb_tensor * dloss = B.input(OOMB_TYPE_F32, 2, 1, 1, 1, 0.2f, 0.9f);
            return {oomb_cross_entropy_loss(B.ctx, logits, labels, -100),
                    oomb_cross_entropy_loss_back(B.ctx, logits, labels, dloss, -100)};
        }, k_f32);
    }
    expect_case("cross_entropy_loss_back in place after scale (transposed logits)", [](Builder & B) -> std::vector<oomb_tensor *> {
        oomb_tensor * lt = oomb_transpose(B.ctx, B.input(OOMB_TYPE_F32, 9, 77, 1, 1, -3, 3));
        oomb_tensor * logits = oomb_scale(B.ctx, lt, 2.0f);
        oomb_tensor * labels = B.ids(B.rand_ids(9, 77), 9);
        oomb_tensor * dloss = B.input(OOMB_TYPE_F32, 2, 1, 1, 1, 0.2f, 0.9f);
        return {oomb_cross_entropy_loss_back(B.ctx, logits, labels, dloss, -1)};
    }, k_f32);
}


// ---------------------------------------------------------------------------------------------
// Optimizers
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, AdamwAndSgd) {
    REQUIRE_CUDA();
    const oomb_type types[2] = {OOMB_TYPE_F32, OOMB_TYPE_BF16};
    for (oomb_type t : types) {
        const double tol = t == OOMB_TYPE_F32 ? k_f32 : 1e-3;
        // [333, 7] (scalar), [1100, 1000] (four at a time), and more element quads than the kernel's threads
        // (4096 blocks x 256: grid-stride)
        const int64_t shapes[3][2] = {{333, 7}, {1100, 1000}, {4100, 1100}};
        std::string name;
        for (const auto & sh : shapes) {
            name = std::string("adamw_step param ") + oomb_type_name(t) + " [" + std::to_string(sh[0]) + ", " + std::to_string(sh[1]) + "]";
            expect_case(name.c_str(), [t, &sh](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * p = B.input(t, sh[0], sh[1]);
                oomb_tensor * g = B.input(OOMB_TYPE_F32, sh[0], sh[1]);
                oomb_tensor * m = B.input(OOMB_TYPE_F32, sh[0], sh[1], 1, 1, -0.1f, 0.1f);
                oomb_tensor * v = B.input(OOMB_TYPE_F32, sh[0], sh[1], 1, 1, 0.001f, 0.01f);
                // lr, beta1, beta2, eps, weight_decay, grad_scale, 1-beta1^t, 1-beta2^t (t = 3)
                oomb_tensor * hp = B.consts({1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, 1.0f - 0.729f, 1.0f - 0.997002999f});
                return {oomb_adamw_step(B.ctx, p, g, m, v, hp), m, v};
            }, tol);
        }
        // bf16 moments (stochastic rounding with the same hash on both backends: equal up to an
        // ulp where the f32 arithmetic differs in the last bit); [333, 7]: the scalar kernel (n % 4 = 3);
        // [64, 33] and [4100, 1100] four at a time, the last past one element-quad per thread (grid-stride)
        const int64_t bshapes[3][2] = {{333, 7}, {64, 33}, {4100, 1100}};
        for (const auto & sh : bshapes) {
            name = std::string("adamw_step bf16 state, param ") + oomb_type_name(t) + " [" + std::to_string(sh[0]) + ", " +
                   std::to_string(sh[1]) + "]";
            expect_case(name.c_str(), [t, &sh](Builder & B) -> std::vector<oomb_tensor *> {
                oomb_tensor * p = B.input(t, sh[0], sh[1]);
                oomb_tensor * g = B.input(OOMB_TYPE_F32, sh[0], sh[1]);
                oomb_tensor * m = B.input(OOMB_TYPE_BF16, sh[0], sh[1], 1, 1, -0.1f, 0.1f);
                oomb_tensor * v = B.input(OOMB_TYPE_BF16, sh[0], sh[1], 1, 1, 0.001f, 0.01f);
                // hp[8]: the step number, the seed of the stochastic rounding
                oomb_tensor * hp = B.consts({1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, 1.0f - 0.729f, 1.0f - 0.997002999f, 3.0f});
                return {oomb_adamw_step(B.ctx, p, g, m, v, hp), m, v};
            }, 4e-3);
        }
        name = std::string("sgd_step param ") + oomb_type_name(t) + " [1001, 3]";
        expect_case(name.c_str(), [t](Builder & B) -> std::vector<oomb_tensor *> {
            oomb_tensor * p = B.input(t, 1001, 3);
            oomb_tensor * g = B.input(OOMB_TYPE_F32, 1001, 3);
            oomb_tensor * hp = B.consts({0.05f, 0.01f, 0.7f}); // lr, weight_decay, grad_scale
            return {oomb_sgd_step(B.ctx, p, g, hp)};
        }, tol);
    }
}

// The merge of two partial paged-attention results (in place into acc, through the backends'
// dispatchers): random outs and finite LSEs (the -inf rows: test-cuda-paged-attn-numerics.cpp), sizes that
// divide neither the CUDA kernel's row runs nor a warp.
TEST_F(CudaOps, PagedAttnMerge) {
    REQUIRE_CUDA();
    const int64_t dims[2][3] = {{24, 3, 37}, {64, 5, 130}};
    for (const auto & d : dims) {
        const std::string name = "paged_attn_merge D" + std::to_string(d[0]) + " H" + std::to_string(d[1]) + " T" + std::to_string(d[2]);
        expect_case(name.c_str(), [&d](Builder & B) -> std::vector<oomb_tensor *> {
            const int64_t n = d[0] * d[1] * d[2] + d[1] * d[2];
            oomb_tensor * acc = B.input(OOMB_TYPE_F32, n, 1, 1, 1, -3.0f, 3.0f);
            oomb_tensor * part = B.input(OOMB_TYPE_F32, n, 1, 1, 1, -3.0f, 3.0f);
            return {oomb_paged_attn_merge(B.ctx, acc, part, d[0], d[1], d[2])};
        }, 1e-6);
    }
}

// ---------------------------------------------------------------------------------------------
// Forward + backward of a small transformer block on both backends
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, TransformerBlockGradients) {
    REQUIRE_CUDA();
    expect_case("transformer block: loss and gradients", [](Builder & B) -> std::vector<oomb_tensor *> {
        const int64_t E = 64, V = 97, T = 24, D = 16, NH = 4, NKV = 2, F = 96;
        oomb_context * c = B.ctx;
        oomb_tensor * emb = B.param(OOMB_TYPE_F32, E, V, 1, 1, -0.5f, 0.5f);
        oomb_tensor * wn = B.param(OOMB_TYPE_F32, E, 1, 1, 1, 0.5f, 1.5f);
        oomb_tensor * wq = B.param(OOMB_TYPE_F32, E, D * NH, 1, 1, -0.3f, 0.3f);
        oomb_tensor * bq = B.param(OOMB_TYPE_F32, D * NH, 1, 1, 1, -0.1f, 0.1f);
        oomb_tensor * wkv = B.param(OOMB_TYPE_F32, E, 2 * D * NKV, 1, 1, -0.3f, 0.3f);
        oomb_tensor * wo = B.param(OOMB_TYPE_F32, D * NH, E, 1, 1, -0.3f, 0.3f);
        oomb_tensor * wg = B.param(OOMB_TYPE_F32, E, F, 1, 1, -0.3f, 0.3f);
        oomb_tensor * wu = B.param(OOMB_TYPE_F32, E, F, 1, 1, -0.3f, 0.3f);
        oomb_tensor * wd = B.param(OOMB_TYPE_F32, F, E, 1, 1, -0.3f, 0.3f);
        oomb_tensor * tok = B.ids(B.rand_ids(T, (int32_t) V), T);
        std::vector<int32_t> pv((size_t) T);
        for (int64_t i = 0; i < T; i++) pv[(size_t) i] = (int32_t) (100 + i);
        oomb_tensor * pos = B.ids(pv, T);
        std::vector<int32_t> lv = B.rand_ids(T, (int32_t) V);
        lv[3] = -1;
        oomb_tensor * lab = B.ids(lv, T);
        oomb_tensor * x = oomb_get_rows(c, emb, tok);                                     // [E, T]
        oomb_tensor * hn = oomb_mul(c, oomb_rms_norm(c, x, 1e-5f), wn);
        oomb_tensor * q = oomb_reshape_3d(c, oomb_add(c, oomb_mul_mat(c, wq, hn), bq), D, NH, T);
        oomb_tensor * kv = oomb_mul_mat(c, wkv, hn);                                      // [2*D*NKV, T]
        oomb_tensor * k = oomb_view_3d(c, kv, D, NKV, T, D * sizeof(float), kv->nb[1], 0);
        oomb_tensor * v = oomb_cont(c, oomb_view_3d(c, kv, D, NKV, T, D * sizeof(float), kv->nb[1], D * NKV * sizeof(float)));
        q = oomb_rope(c, q, pos, D, 10000.0f);
        k = oomb_rope(c, oomb_cont(c, k), pos, D, 10000.0f);
        oomb_tensor * a = oomb_reshape_2d(c, oomb_attn(c, q, k, v, 1.0f / std::sqrt((float) D)), D * NH, T);
        x = oomb_add(c, x, oomb_mul_mat(c, wo, a));
        oomb_tensor * h2 = oomb_rms_norm(c, x, 1e-5f);
        oomb_tensor * m = oomb_swiglu(c, oomb_mul_mat(c, wg, h2), oomb_mul_mat(c, wu, h2));
        x = oomb_add(c, x, oomb_mul_mat(c, wd, m));
        oomb_tensor * logits = oomb_mul_mat(c, emb, x);                                   // tied head [V, T]
        oomb_tensor * loss = oomb_cross_entropy_loss(c, logits, lab, -1);
        B.loss = loss;
        return {loss, emb->grad, wn->grad, wq->grad, bq->grad, wkv->grad, wo->grad, wg->grad, wu->grad, wd->grad};
    }, k_bf16);
}

// The same block's attention through soft_max + mul_mat (the unfused path) on both backends.
TEST_F(CudaOps, SoftmaxAttentionGradients) {
    REQUIRE_CUDA();
    expect_case("softmax attention: loss and gradients", [](Builder & B) -> std::vector<oomb_tensor *> {
        const int64_t D = 16, H = 2, T = 19;
        oomb_context * c = B.ctx;
        oomb_tensor * q = B.param(OOMB_TYPE_F32, D, T, H);
        oomb_tensor * k = B.param(OOMB_TYPE_F32, D, T, H);
        oomb_tensor * vt = B.param(OOMB_TYPE_F32, T, D, H);                  // v transposed: [T, D, H]
        oomb_tensor * s = oomb_mul_mat(c, k, q);                             // [T(keys), T(queries), H]
        oomb_tensor * p = oomb_soft_max(c, s, 0.25f, 0);
        oomb_tensor * o = oomb_mul_mat(c, vt, p);                            // [D, T, H]
        oomb_tensor * loss = oomb_sum_sq(c, oomb_silu(c, o));
        B.loss = loss;
        return {loss, q->grad, k->grad, vt->grad};
    }, k_bf16);
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

TEST_F(CudaOps, ComputeTimeErrors) {
    REQUIRE_CUDA();
    if (harness_on_cpu()) GTEST_SKIP() << "CUDA error messages (harness run on the CPU)";
    oomb_backend_t cu = cuda_backend();
    oomb_context * in = oomb_init({0, true});
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_2d(in, OOMB_TYPE_F32, 8, 5);
    oomb_tensor * ids = oomb_new_tensor_1d(in, OOMB_TYPE_I32, 3);
    oomb_tensor * logits = oomb_new_tensor_2d(in, OOMB_TYPE_F32, 6, 3);
    oomb_tensor * labels = oomb_new_tensor_1d(in, OOMB_TYPE_I32, 3);
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(in, cu);
    std::vector<float> av(40, 0.5f), lv(18, 0.25f);
    oomb_tensor_set(a, av.data(), 0, av.size() * 4);
    oomb_tensor_set(logits, lv.data(), 0, lv.size() * 4);
    const int32_t bad_ids[3] = {0, 5, 1};
    oomb_tensor_set(ids, bad_ids, 0, sizeof(bad_ids));
    const int32_t bad_labels[3] = {2, -1, 6};
    oomb_tensor_set(labels, bad_labels, 0, sizeof(bad_labels));

    oomb_tensor * r = oomb_get_rows(ctx, a, ids);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, r);
    oomb_gallocr_t ga = oomb_gallocr_new(cu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, g), "out of range");

    oomb_tensor * l = oomb_cross_entropy_loss(ctx, logits, labels, -1);
    oomb_cgraph * g2 = oomb_new_graph(ctx);
    oomb_build_forward_expand(g2, l);
    oomb_gallocr_t ga2 = oomb_gallocr_new(cu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga2, g2));
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, g2), "label 6 at row 2 is out of range");

    // the error state is cleared: a valid graph computes afterwards
    const int32_t good_ids[3] = {4, 0, 2};
    oomb_tensor_set(ids, good_ids, 0, sizeof(good_ids));
    oomb_backend_graph_compute(cu, g);
    std::vector<float> out(24);
    oomb_tensor_get(r, out.data(), 0, out.size() * 4);
    for (float v : out) EXPECT_EQ(v, 0.5f);

    // host tensors cannot be computed on by the CUDA backend
    oomb_context * host = oomb_init({0, false});
    oomb_tensor * h = oomb_new_tensor_1d(host, OOMB_TYPE_F32, 4);
    oomb_tensor * hs = oomb_scale(host, h, 2.0f);
    oomb_cgraph * g3 = oomb_new_graph(host);
    oomb_build_forward_expand(g3, hs);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, g3), "not in this CUDA backend's memory");

    oomb_free(host);
    oomb_gallocr_free(ga2);
    oomb_gallocr_free(ga);
    oomb_buffer_free(buf);
    oomb_free(ctx);
    oomb_free(in);
}

// Rough timings of single ops at training shapes (not a benchmark: host wall clock around 20
// computes of a one-op graph, after a warm-up). Run with --gtest_also_run_disabled_tests.
TEST_F(CudaOps, DISABLED_Timings) {
    REQUIRE_CUDA();
    oomb_backend_t cu = cuda_backend();
    struct P {
        const char * name;
        std::function<oomb_tensor *(oomb_context *, oomb_context *)> build; // (inputs, ops)
        double flop, bytes;
    };
    const double T = 4096;
    std::vector<P> cases = {
        {"mul_mat W bf16 [4096, 4096] x x f32 [4096, 4096]", [](oomb_context * in, oomb_context * c) {
             return oomb_mul_mat(c, oomb_new_tensor_2d(in, OOMB_TYPE_BF16, 4096, 4096), oomb_new_tensor_2d(in, OOMB_TYPE_F32, 4096, 4096)); },
         2.0 * 4096 * 4096 * T, 4096.0 * 4096 * 2 + 4096.0 * T * 4 * 2},
        {"mul_mat W f32 [896, 4864] x x f32 [896, 4096]", [](oomb_context * in, oomb_context * c) {
             return oomb_mul_mat(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4864), oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4096)); },
         2.0 * 896 * 4864 * T, 896.0 * 4864 * 4 + 896.0 * T * 4 + 4864.0 * T * 4},
        {"rms_norm [896, 4096]", [](oomb_context * in, oomb_context * c) {
             return oomb_rms_norm(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4096), 1e-6f); }, 0, 2.0 * 896 * T * 4},
        {"add [4864, 4096]", [](oomb_context * in, oomb_context * c) {
             return oomb_add(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 4864, 4096), oomb_new_tensor_2d(in, OOMB_TYPE_F32, 4864, 4096)); },
         0, 3.0 * 4864 * T * 4},
        {"mul [896, 4096] * [896]", [](oomb_context * in, oomb_context * c) {
             return oomb_mul(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4096), oomb_new_tensor_1d(in, OOMB_TYPE_F32, 896)); },
         0, 2.0 * 896 * T * 4},
        {"swiglu [4864, 4096]", [](oomb_context * in, oomb_context * c) {
             return oomb_swiglu(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 4864, 4096), oomb_new_tensor_2d(in, OOMB_TYPE_F32, 4864, 4096)); },
         0, 3.0 * 4864 * T * 4},
        {"rope [128, 28, 4096]", [](oomb_context * in, oomb_context * c) {
             return oomb_rope(c, oomb_new_tensor_3d(in, OOMB_TYPE_F32, 128, 28, 4096), oomb_new_tensor_1d(in, OOMB_TYPE_I32, 4096), 128, 1e6f); },
         0, 2.0 * 128 * 28 * T * 4},
        {"soft_max causal [2048, 2048, 4]", [](oomb_context * in, oomb_context * c) {
             return oomb_soft_max(c, oomb_new_tensor_3d(in, OOMB_TYPE_F32, 2048, 2048, 4), 0.1f, 0); }, 0, 2.0 * 2048 * 2048 * 4 * 4},
        {"cross_entropy_loss_back [151936, 256]", [](oomb_context * in, oomb_context * c) {
             return oomb_cross_entropy_loss_back(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 151936, 256), oomb_new_tensor_1d(in, OOMB_TYPE_I32, 256),
                                                 oomb_new_tensor_1d(in, OOMB_TYPE_F32, 2), -100); }, 0, 2.0 * 151936 * 256 * 4},
        {"get_rows bf16 [896, 151936], 4096 ids", [](oomb_context * in, oomb_context * c) {
             return oomb_get_rows(c, oomb_new_tensor_2d(in, OOMB_TYPE_BF16, 896, 151936), oomb_new_tensor_1d(in, OOMB_TYPE_I32, 4096)); },
         0, 896.0 * T * 6},
        {"cpy f32 -> bf16 transposed [4096, 4096]", [](oomb_context * in, oomb_context * c) {
             oomb_tensor * d = oomb_new_tensor_2d(in, OOMB_TYPE_BF16, 4096, 4096);
             return oomb_cpy(c, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 4096, 4096), oomb_transpose(c, d)); }, 0, 4096.0 * T * 6},
        {"adamw_step f32 [896, 4864]", [](oomb_context * in, oomb_context * c) {
             oomb_tensor * p = oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4864);
             return oomb_adamw_step(c, p, oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4864), oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4864),
                                    oomb_new_tensor_2d(in, OOMB_TYPE_F32, 896, 4864), oomb_new_tensor_1d(in, OOMB_TYPE_F32, 8)); },
         0, 896.0 * 4864 * 4 * 7},
    };
    std::mt19937 rng(3);
    for (const P & pc : cases) {
        oomb_context * in = oomb_init({0, true});
        oomb_context * c = oomb_init({0, true});
        oomb_tensor * out = pc.build(in, c);
        oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(in, cu);
        for (int64_t i = 0; i < oomb_ctx_n_tensors(in); i++) {
            // random data, never zeros: ids / labels small valid integers, hp a sane AdamW setting
            oomb_tensor * t = oomb_ctx_tensor(in, i);
            const int64_t n = oomb_nelements(t);
            std::vector<uint8_t> h(oomb_nbytes(t));
            std::uniform_real_distribution<float> d(0.01f, 1.0f);
            for (int64_t k = 0; k < n; k++) {
                if (t->type == OOMB_TYPE_I32) { int32_t v = (int32_t) (k % 97); memcpy(&h[(size_t) k * 4], &v, 4); }
                else if (t->type == OOMB_TYPE_F32) { float v = d(rng); memcpy(&h[(size_t) k * 4], &v, 4); }
                else { uint16_t v = oomb_fp32_to_bf16(d(rng)); memcpy(&h[(size_t) k * 2], &v, 2); }
            }
            if (n == 8 && t->type == OOMB_TYPE_F32) {
                const float hp[8] = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 0.1f, 0.001f};
                memcpy(h.data(), hp, sizeof(hp));
            }
            oomb_tensor_set(t, h.data(), 0, h.size());
        }
        for (int64_t i = 0; i < oomb_ctx_n_tensors(c); i++) {
            oomb_tensor * t = oomb_ctx_tensor(c, i);
            if (!t->data && t->view_src && t->view_src->data) {
                t->data = (char *) t->view_src->data + t->view_offs;
                t->buffer = t->view_src->buffer;
            }
        }
        oomb_cgraph * g = oomb_new_graph(c);
        oomb_build_forward_expand(g, out);
        oomb_gallocr_t ga = oomb_gallocr_new(cu);
        ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
        oomb_backend_graph_compute(cu, g);
        oomb_backend_synchronize(cu);
        const int reps = 20;
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; r++) oomb_backend_graph_compute(cu, g);
        oomb_backend_synchronize(cu);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
        printf("  timing %-48s %9.3f ms", pc.name, ms);
        if (pc.flop > 0) printf("  %7.1f TFLOP/s", pc.flop / (ms * 1e-3) / 1e12);
        printf("  %7.1f GB/s (counted bytes)\n", pc.bytes / (ms * 1e-3) / 1e9);
        oomb_gallocr_free(ga);
        oomb_buffer_free(buf);
        oomb_free(c);
        oomb_free(in);
    }
}

TEST(CudaBackend, InitAndBuffers) {
    if (!oomb_cuda_available()) {
        EXPECT_EQ(oomb_backend_cuda_init(0), nullptr);
        GTEST_SKIP() << "no CUDA GPU";
    }
    if (harness_on_cpu()) GTEST_SKIP() << "harness run on the CPU";
    oomb_backend_t cu = cuda_backend();
    ASSERT_NE(cu, nullptr);
    EXPECT_STREQ(oomb_backend_name(cu), "CUDA");
    EXPECT_FALSE(oomb_backend_is_host(cu));
    EXPECT_EQ(oomb_backend_cuda_init(1 << 20), nullptr); // no such device
    oomb_buffer_t b = oomb_backend_alloc_buffer(cu, 1000);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ((uintptr_t) oomb_buffer_base(b) % 256, 0u);
    oomb_buffer_free(b);
    // an impossible allocation returns NULL
    EXPECT_EQ(oomb_backend_alloc_buffer(cu, (size_t) 1 << 50), nullptr);
}

// The fusion switches (OOMB_CUDA_FUSE, OOMB_CUDA_FUSE_LCE; backend-cuda.cu, env_flag_off): 0 / false /
// off / no and 1 / true / on / yes in any case, anything else an error naming the variable.
TEST_F(CudaOps, FusionSwitchesParsed) {
    REQUIRE_CUDA();
    if (harness_on_cpu()) GTEST_SKIP() << "the switches are read by the CUDA backend (harness run on the CPU)";
    oombtest::ScopedEnv env({"OOMB_CUDA_FUSE", "OOMB_CUDA_FUSE_LCE"});
    oomb_backend_t cu = cuda_backend();
    oomb_context * in = oomb_init({0, true});
    oomb_context * ctx = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_1d(in, OOMB_TYPE_F32, 5);
    oomb_buffer_t buf = oomb_backend_alloc_ctx_tensors(in, cu);
    const float av[5] = {1, 2, 3, 4, 5};
    oomb_tensor_set(a, av, 0, sizeof(av));
    oomb_tensor * y = oomb_add(ctx, a, a);
    oomb_set_output(y);
    oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, y);
    oomb_gallocr_t ga = oomb_gallocr_new(cu);
    ASSERT_TRUE(oomb_gallocr_alloc_graph(ga, g));
    for (const char * var : {"OOMB_CUDA_FUSE", "OOMB_CUDA_FUSE_LCE"}) {
        for (const char * ok : {"0", "1", "false", "TRUE", "Off", "on", "no", "yes", ""}) {
            env.set(var, ok);
            EXPECT_EQ(oomb_backend_graph_compute(cu, g), OOMB_STATUS_OK) << var << "=" << ok;
        }
        env.set(var, "maybe");
        EXPECT_OOMB_ERROR(oomb_backend_graph_compute(cu, g), (std::string(var) + "=maybe: expected 0 or 1").c_str());
        env.unset(var);
    }
    float yv[5];
    oomb_backend_graph_compute(cu, g);
    oomb_tensor_get(y, yv, 0, sizeof(yv));
    EXPECT_EQ(yv[4], 10.0f);
    oomb_gallocr_free(ga);
    oomb_buffer_free(buf);
    oomb_free(ctx);
    oomb_free(in);
}

// The fused weight-gradient accumulation (cuda/backend-cuda.cu, fuse_accumulations; on by default,
// the variable unset here) on the products the autodiff builds: two linear layers, each weight's
// dW = dy x^T from transposed views (to_bf16_transposed, op N / T in cuBLAS) added into W's gradient
// by the GEMM itself, and dx the same way; loss and every gradient against the CPU backend. On a real
// GPU the fused count must grow (in the CPU-harness mode there is no CUDA backend to ask).
TEST_F(CudaOps, FusedWeightGradientAccumulation) {
    REQUIRE_CUDA();
    struct FuseEnv {
        FuseEnv() { unsetenv("OOMB_CUDA_FUSE"); }
        ~FuseEnv() { unsetenv("OOMB_CUDA_FUSE"); }
    } env;
#ifdef OOMB_USE_CUDA
    const bool real = !harness_on_cpu();
    const int64_t before = real ? oomb_cuda_debug_fused_count(cuda_backend()) : 0;
#endif
    expect_case("two linear layers: loss, dW1, dW2, dx (fused accumulation)", [](Builder & B) -> std::vector<oomb_tensor *> {
        const int64_t K = 72, M = 45, O = 29, N = 37;
        oomb_tensor * w1 = B.param(OOMB_TYPE_F32, K, M, 1, 1, -0.5f, 0.5f);
        oomb_tensor * w2 = B.param(OOMB_TYPE_F32, M, O, 1, 1, -0.5f, 0.5f);
        oomb_tensor * x = B.param(OOMB_TYPE_F32, K, N, 1, 1, -1.0f, 1.0f);
        oomb_tensor * h = oomb_silu(B.ctx, oomb_mul_mat(B.ctx, w1, x));  // [M, N]
        oomb_tensor * y = oomb_mul_mat(B.ctx, w2, h);                     // [O, N]
        B.loss = oomb_sum_sq(B.ctx, y);
        return {B.loss, w1->grad, w2->grad, x->grad};
    }, k_bf16);
#ifdef OOMB_USE_CUDA
    if (real) {
        EXPECT_GE(oomb_cuda_debug_fused_count(cuda_backend()) - before, 2) << "the two weights' accumulations fused";
    }
#endif
}
