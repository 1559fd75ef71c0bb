// CPU backend ops against naive double-precision references on random data: odd and broadcast
// shapes, non-contiguous sources (permute / transpose / offset views), f16 / bf16 sources,
// 1 vs 3 threads, in-place execution (result memory == src[0] memory), and compute-time errors.
// Backward kernels are also checked against central differences of the double reference forward. The
// harness: ops-harness.h; cross-entropy and the LM head's linear_cross_entropy: test-ops-loss.cpp.
#include "ops-harness.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Layout and copies
// ---------------------------------------------------------------------------------------------

TEST_F(Ops, ContOfPermutedAndReshaped) {
    oomb_tensor * a = rnd(OOMB_TYPE_F32, 3, 17, 5, 2);
    oomb_tensor * p = oomb_permute(ctx, a, 2, 0, 3, 1); // result ne = [17, 2, 3, 5]
    oomb_tensor * c = oomb_cont(ctx, p);
    compute(c);
    EXPECT_TRUE(oomb_is_contiguous(c));
    EXPECT_EQ(to_vector(c), to_vector(p));
    // cont_4d with a new shape keeps the logical order
    oomb_tensor * c2 = oomb_cont_4d(ctx, oomb_transpose(ctx, a), 17 * 3, 5, 2, 1);
    compute(c2);
    EXPECT_EQ(to_vector(c2), to_vector(oomb_transpose(ctx, a)));
    // same type f16, view with an offset
    oomb_tensor * h = rnd(OOMB_TYPE_F16, 7, 9);
    oomb_tensor * hv = oomb_view_2d(ctx, h, 4, 5, h->nb[1], 2 * h->nb[1] + 3 * 2);
    oomb_tensor * hc = oomb_cont(ctx, hv);
    compute(hc);
    EXPECT_EQ(hc->type, OOMB_TYPE_F16);
    EXPECT_EQ(to_vector(hc), to_vector(hv));
}

TEST_F(Ops, CpyConvertsTypesAnyStrides) {
    const oomb_type types[3] = {OOMB_TYPE_F32, OOMB_TYPE_F16, OOMB_TYPE_BF16};
    for (oomb_type st : types) {
        for (oomb_type dt : types) {
            oomb_tensor * a = rnd(st, 33, 3, 2);
            oomb_tensor * b = oomb_new_tensor_3d(ctx, dt, 3, 33, 2);
            oomb_tensor * bt = oomb_transpose(ctx, b); // [33, 3, 2] view, non-contiguous
            oomb_tensor * r = oomb_cpy(ctx, a, bt);
            compute(r);
            const vec av = to_vector(a), bv = to_vector(bt);
            for (size_t i = 0; i < av.size(); i++) {
                const float x = (float) av[i];
                float expect = x;
                if (dt == OOMB_TYPE_F16) expect = oomb_fp16_to_fp32(oomb_fp32_to_fp16(x));
                if (dt == OOMB_TYPE_BF16) expect = oomb_bf16_to_fp32(oomb_fp32_to_bf16(x));
                ASSERT_EQ((float) bv[i], expect) << oomb_type_name(st) << " -> " << oomb_type_name(dt) << " at " << i;
            }
        }
    }
    // different shapes, same count: logical order of both
    oomb_tensor * a = rnd(OOMB_TYPE_F32, 12, 5);
    oomb_tensor * b = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 6, 10);
    compute(oomb_cpy(ctx, oomb_transpose(ctx, a), b));
    EXPECT_EQ(to_vector(b), to_vector(oomb_transpose(ctx, a)));
    // i32 -> i32 into a permuted destination
    oomb_tensor * ia = oomb_new_tensor_2d(ctx, OOMB_TYPE_I32, 4, 3);
    for (int i = 0; i < 12; i++) oomb_set_i32_1d(ia, i, i * 7 - 20);
    oomb_tensor * ib = oomb_new_tensor_2d(ctx, OOMB_TYPE_I32, 3, 4);
    compute(oomb_cpy(ctx, ia, oomb_transpose(ctx, ib)));
    for (int i0 = 0; i0 < 4; i0++)
        for (int i1 = 0; i1 < 3; i1++) EXPECT_EQ(oomb_get_i32_1d(ib, i1 + 3 * i0), (i0 + 4 * i1) * 7 - 20);
}

TEST_F(Ops, CastAndFill) {
    oomb_tensor * a = rnd(OOMB_TYPE_F32, 17, 3, 2);
    oomb_tensor * h = oomb_cast(ctx, oomb_permute(ctx, a, 1, 0, 2, 3), OOMB_TYPE_F16);
    oomb_tensor * b = oomb_cast(ctx, h, OOMB_TYPE_BF16);
    oomb_tensor * f = oomb_cast(ctx, b, OOMB_TYPE_F32);
    compute(f);
    const vec av = to_vector(oomb_permute(ctx, a, 1, 0, 2, 3)), hv = to_vector(h), fv = to_vector(f);
    for (size_t i = 0; i < av.size(); i++) {
        ASSERT_EQ((float) hv[i], oomb_fp16_to_fp32(oomb_fp32_to_fp16((float) av[i])));
        ASSERT_EQ((float) fv[i], oomb_bf16_to_fp32(oomb_fp32_to_bf16((float) hv[i])));
    }
    oomb_tensor * fl = oomb_fill(ctx, 5, 3, 1, 2, -2.5f);
    compute(fl);
    for (double x : to_vector(fl)) ASSERT_EQ(x, -2.5);
}

// ---------------------------------------------------------------------------------------------
// Element-wise
// ---------------------------------------------------------------------------------------------

TEST_F(Ops, BinaryBroadcastAndStrides) {
    const int64_t shapes_b[][4] = {{17, 3, 5, 2}, {17, 1, 1, 1}, {1, 3, 1, 2}, {1, 1, 1, 1}, {17, 3, 1, 1}, {1, 1, 5, 1}};
    for (int op = 0; op < 3; op++) {
        for (auto & sb : shapes_b) {
            for (int strided = 0; strided < 2; strided++) {
                oomb_tensor * a;
                if (strided) a = oomb_permute(ctx, rnd(OOMB_TYPE_F32, 3, 17, 2, 5), 1, 0, 3, 2); // [17, 3, 5, 2] view
                else a = rnd(OOMB_TYPE_F32, 17, 3, 5, 2);
                oomb_tensor * b = rnd(OOMB_TYPE_F32, sb[0], sb[1], sb[2], sb[3]);
                if (strided && sb[0] > 1 && sb[1] > 1) {
                    b = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, sb[1], sb[0], sb[2], sb[3]));
                }
                oomb_tensor * r = op == 0 ? oomb_add(ctx, a, b) : op == 1 ? oomb_sub(ctx, a, b) : oomb_mul(ctx, a, b);
                compute(r);
                A4 A(a), B(b), R(r);
                A4 ref(17, 3, 5, 2);
                for (int64_t i3 = 0; i3 < 2; i3++)
                for (int64_t i2 = 0; i2 < 5; i2++)
                for (int64_t i1 = 0; i1 < 3; i1++)
                for (int64_t i0 = 0; i0 < 17; i0++) {
                    const double x = A(i0, i1, i2, i3), y = B(i0 % sb[0], i1 % sb[1], i2 % sb[2], i3 % sb[3]);
                    ref(i0, i1, i2, i3) = op == 0 ? x + y : op == 1 ? x - y : x * y;
                }
                EXPECT_REL(R.v, ref.v, 1e-6) << "op " << op << " b [" << sb[0] << "," << sb[1] << "," << sb[2] << "," << sb[3] << "] strided " << strided;
            }
        }
    }
}

TEST_F(Ops, UnaryOps) {
    oomb_tensor * x = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 33, 17, 2, 1, -6.0f, 6.0f)); // [17, 33, 2]
    oomb_tensor * y = rnd(OOMB_TYPE_F32, 17, 33, 2);
    oomb_tensor * sc = oomb_scale(ctx, x, -0.37f);
    oomb_tensor * si = oomb_silu(ctx, x);
    oomb_tensor * sb = oomb_silu_back(ctx, x, y);
    oomb_tensor * sw = oomb_swiglu(ctx, x, y);
    oomb_tensor * dy = rnd(OOMB_TYPE_F32, 17, 33, 2);
    oomb_tensor * swb = oomb_swiglu_back(ctx, x, y, dy);  // [dgate; dup], x transposed
    for (oomb_tensor * t : {sc, si, sb, sw, swb}) compute(t);
    const vec X = to_vector(x), Y = to_vector(y);
    vec rsc, rsi, rsb, rsw;
    for (size_t i = 0; i < X.size(); i++) {
        const double s = 1.0 / (1.0 + std::exp(-X[i]));
        rsc.push_back(X[i] * (double) -0.37f);
        rsi.push_back(X[i] * s);
        rsb.push_back(Y[i] * s * (1.0 + X[i] * (1.0 - s)));
        rsw.push_back(X[i] * s * Y[i]);
    }
    EXPECT_REL(to_vector(sc), rsc, 1e-6);
    EXPECT_REL(to_vector(si), rsi, 1e-6);
    EXPECT_REL(to_vector(sb), rsb, 1e-6);
    {
        const vec DY = to_vector(dy);
        vec rswb(2 * X.size());
        for (size_t i = 0; i < X.size(); i++) {
            const double s = 1.0 / (1.0 + std::exp(-X[i]));
            rswb[i] = DY[i] * Y[i] * s * (1.0 + X[i] * (1.0 - s));
            rswb[X.size() + i] = DY[i] * X[i] * s;
        }
        EXPECT_EQ(swb->ne[3], 2);
        EXPECT_REL(to_vector(swb), rswb, 1e-6);
        EXPECT_OOMB_ERROR(oomb_swiglu_back(ctx, x, y, rnd(OOMB_TYPE_F32, 17, 33)), "swiglu_back");
    }
    EXPECT_REL(to_vector(sw), rsw, 1e-6);
    // silu_back against a central difference of silu
    vec fd;
    for (size_t i = 0; i < X.size(); i++) {
        auto f = [](double v) { return v / (1.0 + std::exp(-v)); };
        fd.push_back(Y[i] * (f(X[i] + 1e-6) - f(X[i] - 1e-6)) / 2e-6);
    }
    EXPECT_REL(to_vector(sb), fd, 1e-6);
}

TEST_F(Ops, AddInplaceWritesFirstSource) {
    oomb_tensor * a = rnd(OOMB_TYPE_F32, 17, 3, 4);
    oomb_tensor * b = rnd(OOMB_TYPE_F32, 17, 1, 4);
    const A4 A0(a), B(b);
    oomb_tensor * r = oomb_add_inplace(ctx, a, b);
    compute(r);
    EXPECT_EQ(r->data, a->data);
    A4 A(a);
    for (int64_t i2 = 0; i2 < 4; i2++)
    for (int64_t i1 = 0; i1 < 3; i1++)
    for (int64_t i0 = 0; i0 < 17; i0++) {
        ASSERT_FLOAT_EQ((float) A(i0, i1, i2), (float) (A0.v[(size_t) ((i2 * 3 + i1) * 17 + i0)] + B.v[(size_t) (i2 * 17 + i0)]));
    }
    // into a strided view of a (column 2 of each matrix)
    oomb_tensor * m = rnd(OOMB_TYPE_F32, 5, 7);
    const A4 M0(m);
    oomb_tensor * col = oomb_view_2d(ctx, m, 1, 7, m->nb[1], 2 * 4);
    oomb_tensor * one = oomb_fill(ctx, 1, 1, 1, 1, 1.5f);
    compute(oomb_add_inplace(ctx, col, one));
    A4 M(m);
    for (int64_t i1 = 0; i1 < 7; i1++)
        for (int64_t i0 = 0; i0 < 5; i0++) ASSERT_FLOAT_EQ((float) M(i0, i1), (float) (M0.v[(size_t) (i1 * 5 + i0)] + (i0 == 2 ? 1.5 : 0.0)));
}

TEST_F(Ops, RepeatAndRepeatBack) {
    oomb_tensor * a = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 3, 5, 1, 2)); // [5, 3, 1, 2] view
    oomb_tensor * shape = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, 10, 6, 4, 2);
    oomb_tensor * r = oomb_repeat(ctx, a, shape);
    compute(r);
    A4 A(a), R(r), ref(10, 6, 4, 2);
    for (int64_t i3 = 0; i3 < 2; i3++)
    for (int64_t i2 = 0; i2 < 4; i2++)
    for (int64_t i1 = 0; i1 < 6; i1++)
    for (int64_t i0 = 0; i0 < 10; i0++) ref(i0, i1, i2, i3) = A(i0 % 5, i1 % 3, 0, i3);
    EXPECT_EQ(R.v, ref.v);

    oomb_tensor * big = oomb_permute(ctx, rnd(OOMB_TYPE_F32, 6, 10, 4, 2), 1, 0, 2, 3); // [10, 6, 4, 2] view
    oomb_tensor * small = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, 5, 3, 1, 2);
    oomb_tensor * rb = oomb_repeat_back(ctx, big, small);
    compute(rb);
    A4 BG(big), RB(rb), ref2(5, 3, 1, 2);
    for (int64_t i3 = 0; i3 < 2; i3++)
    for (int64_t i2 = 0; i2 < 4; i2++)
    for (int64_t i1 = 0; i1 < 6; i1++)
    for (int64_t i0 = 0; i0 < 10; i0++) ref2(i0 % 5, i1 % 3, 0, i3) += BG(i0, i1, i2, i3);
    EXPECT_REL(RB.v, ref2.v, 1e-6);
}

TEST_F(Ops, Reductions) {
    for (int strided = 0; strided < 2; strided++) {
        oomb_tensor * a = strided ? oomb_permute(ctx, rnd(OOMB_TYPE_F32, 33, 17, 3, 2), 2, 0, 1, 3) : rnd(OOMB_TYPE_F32, 1001, 3, 2);
        oomb_tensor * s = oomb_sum(ctx, a), * m = oomb_mean(ctx, a), * q = oomb_sum_sq(ctx, a);
        for (oomb_tensor * t : {s, m, q}) compute(t);
        double rs = 0, rq = 0;
        const vec A = to_vector(a);
        for (double x : A) { rs += x; rq += x * x; }
        EXPECT_NEAR(oomb_get_f32_1d(s, 0), rs, 1e-5 * std::max(1.0, std::fabs(rs)));
        EXPECT_NEAR(oomb_get_f32_1d(m, 0), rs / (double) A.size(), 1e-6);
        EXPECT_NEAR(oomb_get_f32_1d(q, 0), rq, 1e-5 * rq);
    }
}

// oomb_sum_sq_n: the sum of squares of up to OOMB_MAX_SRC tensors (contiguous, permuted, one element) in
// one node, against double sums; one tensor equals oomb_sum_sq; bad arguments are errors that name them.
TEST_F(Ops, SumSqOfSeveralTensors) {
    std::vector<oomb_tensor *> ts;
    for (int k = 0; k < OOMB_MAX_SRC; k++) {
        if (k % 3 == 1) ts.push_back(oomb_permute(ctx, rnd(OOMB_TYPE_F32, 7 + k, 5, 3), 2, 0, 1, 3));
        else if (k == 5) ts.push_back(rnd(OOMB_TYPE_F32, 1));
        else ts.push_back(rnd(OOMB_TYPE_F32, 101 * k + 3, 2));
    }
    for (int n : {1, 2, 7, OOMB_MAX_SRC}) {
        oomb_tensor * q = oomb_sum_sq_n(ctx, ts.data(), n);
        compute(q);
        double want = 0;
        for (int k = 0; k < n; k++)
            for (double x : to_vector(ts[k])) want += x * x;
        EXPECT_NEAR(oomb_get_f32_1d(q, 0), want, 1e-6 * want) << n << " tensors";
        if (n == 1) {
            oomb_tensor * q1 = oomb_sum_sq(ctx, ts[0]);
            compute(q1);
            EXPECT_EQ(oomb_get_f32_1d(q1, 0), oomb_get_f32_1d(q, 0));
        }
    }
    oomb_tensor * bad[2] = {ts[0], oomb_new_tensor_1d(ctx, OOMB_TYPE_BF16, 4)};
    EXPECT_OOMB_ERROR(oomb_sum_sq_n(ctx, bad, 2), "sum_sq_n: a[1] must be f32");
    EXPECT_OOMB_ERROR(oomb_sum_sq_n(ctx, ts.data(), 0), "takes 1 to");
    std::vector<oomb_tensor *> many(OOMB_MAX_SRC + 1, ts[0]);
    EXPECT_OOMB_ERROR(oomb_sum_sq_n(ctx, many.data(), OOMB_MAX_SRC + 1), "takes 1 to");
    bad[1] = nullptr;
    EXPECT_OOMB_ERROR(oomb_sum_sq_n(ctx, bad, 2), "a[1] is NULL");
}

// ---------------------------------------------------------------------------------------------
// Embeddings
// ---------------------------------------------------------------------------------------------

TEST_F(Ops, GetRowsAllTypes) {
    for (oomb_type type : {OOMB_TYPE_F32, OOMB_TYPE_F16, OOMB_TYPE_BF16}) {
        oomb_tensor * a = rnd(type, 33, 17);
        std::vector<int32_t> v = {0, 16, 3, 3, 9, 1};
        oomb_tensor * id = ids(v, 3, 2);
        oomb_tensor * r = oomb_get_rows(ctx, a, id);
        compute(r);
        ASSERT_EQ(r->ne[0], 33); ASSERT_EQ(r->ne[1], 3); ASSERT_EQ(r->ne[2], 2);
        A4 A(a), R(r);
        for (int64_t j = 0; j < 2; j++)
        for (int64_t i = 0; i < 3; i++)
        for (int64_t k = 0; k < 33; k++) ASSERT_EQ(R(k, i, j), A(k, v[(size_t) (i + 3 * j)])) << oomb_type_name(type);
    }
    // a transposed (non-contiguous) table
    oomb_tensor * a = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 5, 8)); // [8, 5]
    oomb_tensor * r = oomb_get_rows(ctx, a, ids({4, 0}, 2));
    compute(r);
    A4 A(a), R(r);
    for (int64_t k = 0; k < 8; k++) { EXPECT_EQ(R(k, 0), A(k, 4)); EXPECT_EQ(R(k, 1), A(k, 0)); }
}

TEST_F(Ops, GetRowsBackScatterAddsDuplicates) {
    const int64_t E = 130, R = 11;
    std::vector<int32_t> v;
    std::uniform_int_distribution<int> d(0, R - 1);
    for (int i = 0; i < 40; i++) v.push_back(i % 4 == 0 ? 5 : d(rng)); // many duplicates of 5
    oomb_tensor * id = ids(v, 20, 2);
    oomb_tensor * dy = rnd(OOMB_TYPE_F32, E, 20, 2);
    oomb_tensor * r = oomb_get_rows_back(ctx, dy, id, R);
    compute(r);
    A4 DY(dy), ref(E, R, 1, 1);
    for (int64_t j = 0; j < 2; j++)
    for (int64_t i = 0; i < 20; i++)
    for (int64_t k = 0; k < E; k++) ref(k, v[(size_t) (i + 20 * j)]) += DY(k, i, j);
    EXPECT_REL(to_vector(r), ref.v, 1e-6);
    oomb_tensor * r1 = oomb_get_rows_back(ctx, dy, id, R);
    compute(r1, g_cpu1);
    EXPECT_EQ(to_vector(r1), to_vector(r));
}

TEST_F(Ops, GetRowsErrors) {
    oomb_tensor * a = rnd(OOMB_TYPE_F32, 4, 6);
    oomb_tensor * r = oomb_get_rows(ctx, a, ids({1, 6}, 2));
    EXPECT_OOMB_ERROR(compute(r), "id 6");
    EXPECT_OOMB_ERROR(compute(oomb_get_rows(ctx, a, ids({-1}, 1))), "6 rows");
    oomb_tensor * dy = rnd(OOMB_TYPE_F32, 4, 2);
    EXPECT_OOMB_ERROR(compute(oomb_get_rows_back(ctx, dy, ids({0, 9}, 2), 3)), "id 9");
}

// ---------------------------------------------------------------------------------------------
// Matrix product
// ---------------------------------------------------------------------------------------------

vec mul_mat_ref(const oomb_tensor * a, const oomb_tensor * b) {
    A4 A(a), B(b);
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1], B2 = b->ne[2], B3 = b->ne[3];
    const int64_t r2 = B2 / a->ne[2], r3 = B3 / a->ne[3];
    A4 R(M, N, B2, B3);
    for (int64_t i3 = 0; i3 < B3; i3++)
    for (int64_t i2 = 0; i2 < B2; i2++)
    for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += A(k, m, i2 / r2, i3 / r3) * B(k, n, i2, i3);
        R(m, n, i2, i3) = s;
    }
    return R.v;
}

TEST_F(Ops, MulMatShapesAndBroadcast) {
    const int64_t sizes[][7] = {
        // K, M, N, A2, A3, B2, B3
        {1, 1, 1, 1, 1, 1, 1}, {3, 17, 33, 1, 1, 1, 1}, {33, 1, 17, 1, 1, 1, 1}, {17, 33, 1, 1, 1, 1, 1},
        {300, 257, 129, 1, 1, 1, 1}, {64, 17, 3, 1, 1, 5, 2}, {17, 5, 7, 2, 1, 6, 1}, {9, 4, 3, 2, 3, 4, 3},
    };
    for (auto & s : sizes) {
        oomb_tensor * a = rnd(OOMB_TYPE_F32, s[0], s[1], s[3], s[4]);
        oomb_tensor * b = rnd(OOMB_TYPE_F32, s[0], s[2], s[5], s[6]);
        oomb_tensor * r = oomb_mul_mat(ctx, a, b);
        compute(r);
        EXPECT_REL(to_vector(r), mul_mat_ref(a, b), 1e-5) << "K " << s[0] << " M " << s[1] << " N " << s[2];
    }
}

TEST_F(Ops, MulMatHalfTypesAndNonContiguous) {
    const int64_t K = 67, M = 33, N = 19;
    for (oomb_type type : {OOMB_TYPE_F16, OOMB_TYPE_BF16}) {
        for (int64_t B2 : {1, 3}) {
            oomb_tensor * a = rnd(type, K, M, B2 > 1 ? 1 : 1);
            oomb_tensor * b = rnd(OOMB_TYPE_F32, K, N, B2);
            oomb_tensor * r = oomb_mul_mat(ctx, a, b);
            compute(r);
            EXPECT_REL(to_vector(r), mul_mat_ref(a, b), 1e-5) << oomb_type_name(type);
        }
    }
    // a long K: the f16 weight is converted in blocks of rows (16 MiB of f32 each), batched and broadcast
    {
        oomb_tensor * a = rnd(OOMB_TYPE_BF16, 65536, 70, 2);
        oomb_tensor * b = rnd(OOMB_TYPE_F32, 65536, 2, 4);
        oomb_tensor * r = oomb_mul_mat(ctx, a, b);
        compute(r);
        EXPECT_REL(to_vector(r), mul_mat_ref(a, b), 1e-5);
    }
    // a transposed view (unit stride in dim 1), b transposed view
    {
        oomb_tensor * a = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, M, K)); // [K, M], nb1 == 4
        oomb_tensor * b = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, N, K)); // [K, N], nb1 == 4
        oomb_tensor * r = oomb_mul_mat(ctx, a, b);
        compute(r);
        EXPECT_REL(to_vector(r), mul_mat_ref(a, b), 1e-5);
    }
    // views with offsets and padded rows; batched with permuted b
    {
        oomb_tensor * base = rnd(OOMB_TYPE_F32, K + 5, M + 3);
        oomb_tensor * a = oomb_view_2d(ctx, base, K, M, base->nb[1], 2 * base->nb[1] + 3 * 4);
        oomb_tensor * bb = rnd(OOMB_TYPE_F32, K, 4, N);
        oomb_tensor * b = oomb_permute(ctx, bb, 0, 2, 1, 3); // [K, N, 4]: batches interleaved
        oomb_tensor * r = oomb_mul_mat(ctx, a, b);
        compute(r);
        EXPECT_REL(to_vector(r), mul_mat_ref(a, b), 1e-5);
    }
    // f16 transposed view of a, batched a
    {
        oomb_tensor * a = oomb_transpose(ctx, rnd(OOMB_TYPE_F16, M, K, 2)); // [K, M, 2]
        oomb_tensor * b = oomb_permute(ctx, rnd(OOMB_TYPE_F32, N, K, 4), 1, 0, 2, 3); // [K, N, 4], nb0 != 4
        oomb_tensor * r = oomb_mul_mat(ctx, a, b);
        compute(r);
        EXPECT_REL(to_vector(r), mul_mat_ref(a, b), 1e-5);
    }
}

// ---------------------------------------------------------------------------------------------
// Normalization, rope, softmax
// ---------------------------------------------------------------------------------------------

vec rms_norm_ref(const vec & x, int64_t n, double eps) {
    vec y(x.size());
    for (size_t r = 0; r < x.size() / (size_t) n; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += x[r * n + i] * x[r * n + i];
        const double s = 1.0 / std::sqrt(ss / (double) n + eps);
        for (int64_t i = 0; i < n; i++) y[r * n + i] = x[r * n + i] * s;
    }
    return y;
}

// dx = J^T dy of f at x by central differences, f applied row by row (rows of length n).
vec row_vjp(const std::function<vec(const vec &)> & f, const vec & x, const vec & dy, int64_t n, double h = 1e-6) {
    vec dx(x.size());
    for (size_t r = 0; r < x.size() / (size_t) n; r++) {
        vec row(x.begin() + (long) (r * n), x.begin() + (long) ((r + 1) * n));
        for (int64_t i = 0; i < n; i++) {
            vec xp = row, xm = row;
            xp[(size_t) i] += h;
            xm[(size_t) i] -= h;
            const vec fp = f(xp), fm = f(xm);
            double s = 0;
            for (int64_t j = 0; j < n; j++) s += dy[r * n + j] * (fp[(size_t) j] - fm[(size_t) j]) / (2 * h);
            dx[r * n + i] = s;
        }
    }
    return dx;
}

TEST_F(Ops, RmsNormAndBack) {
    for (int64_t n : {1, 3, 17, 896}) {
        const float eps = 1e-6f;
        oomb_tensor * x = rnd(OOMB_TYPE_F32, n, 5, 3);
        oomb_tensor * dy = rnd(OOMB_TYPE_F32, n, 5, 3);
        oomb_tensor * y = oomb_rms_norm(ctx, x, eps);
        oomb_tensor * dx = oomb_rms_norm_back(ctx, x, dy, eps);
        compute(y);
        compute(dx);
        const vec X = to_vector(x), DY = to_vector(dy);
        EXPECT_REL(to_vector(y), rms_norm_ref(X, n, eps), 1e-6) << n;
        if (n <= 17) {
            const vec fd = row_vjp([&](const vec & r) { return rms_norm_ref(r, n, eps); }, X, DY, n);
            EXPECT_REL(to_vector(dx), fd, 1e-5) << n;
        }
        // formula reference
        vec ref(X.size());
        for (size_t r = 0; r < X.size() / (size_t) n; r++) {
            double ss = 0, xg = 0;
            for (int64_t i = 0; i < n; i++) { ss += X[r * n + i] * X[r * n + i]; xg += X[r * n + i] * DY[r * n + i]; }
            const double s = 1.0 / std::sqrt(ss / n + eps);
            for (int64_t i = 0; i < n; i++) ref[r * n + i] = s * DY[r * n + i] - s * s * s / n * X[r * n + i] * xg;
        }
        EXPECT_REL(to_vector(dx), ref, 1e-5) << n;
    }
    // non-contiguous source: permuted (nb0 != 4) and a view with padded rows
    oomb_tensor * base = rnd(OOMB_TYPE_F32, 7, 33, 2);
    oomb_tensor * xp = oomb_permute(ctx, base, 1, 0, 2, 3); // [33, 7, 2]
    oomb_tensor * y = oomb_rms_norm(ctx, xp, 1e-5f);
    compute(y);
    EXPECT_REL(to_vector(y), rms_norm_ref(to_vector(xp), 33, 1e-5f), 1e-6);
    oomb_tensor * xv = oomb_view_3d(ctx, base, 5, 33, 2, base->nb[1], base->nb[2], 4);
    oomb_tensor * yv = oomb_rms_norm(ctx, xv, 1e-5f);
    compute(yv);
    EXPECT_REL(to_vector(yv), rms_norm_ref(to_vector(xv), 5, 1e-5f), 1e-6);
}

// rms_norm_mul(_back) against the unfused ops it replaces (rms_norm, mul / mul_ext, rms_norm_back,
// repeat_back): the same roundings, so y and dx are bit-equal; dw (double sums in another order)
// within 1e-6, and against a double reference; the same on 1 and 3 threads.
TEST_F(Ops, RmsNormMulMatchesUnfused) {
    for (int64_t n : {1, 3, 17, 896}) {
        for (int64_t rows : {1, 7, 300}) {
            const float eps = 1e-6f;
            oomb_tensor * x = rnd(OOMB_TYPE_F32, n, rows, 1, 1, -2.0f, 2.0f);
            oomb_tensor * w = rnd(OOMB_TYPE_F32, n, 1, 1, 1, 0.5f, 1.5f);
            oomb_tensor * dy = rnd(OOMB_TYPE_F32, n, rows);
            oomb_tensor * y = oomb_rms_norm_mul(ctx, x, w, eps);
            oomb_tensor * yb = oomb_rms_norm_mul_ext(ctx, x, w, eps, OOMB_TYPE_BF16);
            oomb_tensor * dx = oomb_rms_norm_mul_back(ctx, x, w, dy, eps, false);
            oomb_tensor * pk = oomb_rms_norm_mul_back(ctx, x, w, dy, eps, true);
            oomb_tensor * nrm = oomb_rms_norm(ctx, x, eps);
            oomb_tensor * y0 = oomb_mul(ctx, nrm, w);
            oomb_tensor * yb0 = oomb_mul_ext(ctx, nrm, w, OOMB_TYPE_BF16);
            oomb_tensor * dx0 = oomb_rms_norm_back(ctx, x, oomb_mul(ctx, dy, w), eps);
            oomb_tensor * dw0 = oomb_repeat_back(ctx, oomb_mul(ctx, dy, nrm), w);
            for (oomb_tensor * t : {y, yb, dx, pk, y0, yb0, dx0, dw0}) compute(t);
            ASSERT_EQ(pk->ne[0], n);
            ASSERT_EQ(pk->ne[1], rows + 1);
            const vec P = to_vector(pk);
            const vec pdx(P.begin(), P.begin() + (long) (n * rows)), pdw(P.begin() + (long) (n * rows), P.end());
            EXPECT_EQ(to_vector(y), to_vector(y0)) << n << " x " << rows;
            EXPECT_EQ(to_vector(yb), to_vector(yb0)) << n << " x " << rows;
            EXPECT_EQ(to_vector(dx), to_vector(dx0)) << n << " x " << rows;
            EXPECT_EQ(pdx, to_vector(dx0)) << n << " x " << rows;
            EXPECT_REL(pdw, to_vector(dw0), 1e-6) << n << " x " << rows;
            // dw in double: sum_r dy * x * s_r
            const vec X = to_vector(x), DY = to_vector(dy);
            vec ref((size_t) n, 0.0);
            for (int64_t r = 0; r < rows; r++) {
                double ss = 0;
                for (int64_t i = 0; i < n; i++) ss += X[r * n + i] * X[r * n + i];
                const double sc = 1.0 / std::sqrt(ss / n + eps);
                for (int64_t i = 0; i < n; i++) ref[i] += DY[r * n + i] * X[r * n + i] * sc;
            }
            EXPECT_REL(pdw, ref, 1e-5) << n << " x " << rows;
            // one thread: the same bytes
            oomb_tensor * pk1 = oomb_rms_norm_mul_back(ctx, x, w, dy, eps, true);
            compute(pk1, g_cpu1);
            EXPECT_EQ(to_vector(pk1), P) << n << " x " << rows;
        }
    }
    // a permuted x (rows not unit-stride: prepared into a contiguous copy)
    oomb_tensor * base = rnd(OOMB_TYPE_F32, 7, 33);
    oomb_tensor * xp = oomb_transpose(ctx, base);  // [33, 7]
    oomb_tensor * w = rnd(OOMB_TYPE_F32, 33);
    oomb_tensor * y = oomb_rms_norm_mul(ctx, xp, w, 1e-5f);
    oomb_tensor * y0 = oomb_mul(ctx, oomb_rms_norm(ctx, xp, 1e-5f), w);
    compute(y);
    compute(y0);
    EXPECT_EQ(to_vector(y), to_vector(y0));
}

// bf16 products (oomb_mul_mat_ext) and a SwiGLU over bf16 gate / up: the f32 product rounded once;
// the SwiGLU (and its backward) of the values widened to f32, exactly.
TEST_F(Ops, Bf16ProductsAndGates) {
    oomb_tensor * a = rnd(OOMB_TYPE_F32, 67, 45), * b = rnd(OOMB_TYPE_F32, 67, 29, 2);
    oomb_tensor * p = oomb_mul_mat_ext(ctx, a, b, OOMB_TYPE_BF16);
    oomb_tensor * p32 = oomb_cast(ctx, oomb_mul_mat(ctx, a, b), OOMB_TYPE_BF16);
    compute(p);
    compute(p32);
    EXPECT_EQ(p->type, OOMB_TYPE_BF16);
    EXPECT_EQ(to_vector(p), to_vector(p32));
    oomb_tensor * g = rnd(OOMB_TYPE_BF16, 37, 5, 3, 1, -6.0f, 6.0f), * u = rnd(OOMB_TYPE_BF16, 37, 5, 3), * dy = rnd(OOMB_TYPE_F32, 37, 5, 3);
    oomb_tensor * gf = oomb_cast(ctx, g, OOMB_TYPE_F32), * uf = oomb_cast(ctx, u, OOMB_TYPE_F32);
    for (oomb_type rt : {OOMB_TYPE_F32, OOMB_TYPE_BF16}) {
        oomb_tensor * y = oomb_swiglu_ext(ctx, g, u, rt), * y0 = oomb_swiglu_ext(ctx, gf, uf, rt);
        oomb_tensor * d = oomb_swiglu_back_ext(ctx, g, u, dy, rt), * d0 = oomb_swiglu_back_ext(ctx, gf, uf, dy, rt);
        for (oomb_tensor * t : {y, y0, d, d0}) compute(t);
        EXPECT_EQ(to_vector(y), to_vector(y0)) << oomb_type_name(rt);
        EXPECT_EQ(to_vector(d), to_vector(d0)) << oomb_type_name(rt);
    }
    // permuted bf16 gate / up (strided reads)
    oomb_tensor * gp = oomb_permute(ctx, rnd(OOMB_TYPE_BF16, 5, 37), 1, 0, 2, 3), * up = oomb_permute(ctx, rnd(OOMB_TYPE_BF16, 5, 37), 1, 0, 2, 3);
    oomb_tensor * yp = oomb_swiglu(ctx, gp, up), * yp0 = oomb_swiglu(ctx, oomb_cast(ctx, gp, OOMB_TYPE_F32), oomb_cast(ctx, up, OOMB_TYPE_F32));
    compute(yp);
    compute(yp0);
    EXPECT_EQ(to_vector(yp), to_vector(yp0));
    EXPECT_OOMB_ERROR(oomb_swiglu(ctx, g, uf), "both f32 or both bf16");
    EXPECT_OOMB_ERROR(oomb_swiglu_back(ctx, g, u, oomb_cast(ctx, dy, OOMB_TYPE_BF16)), "dy must be f32");
    EXPECT_OOMB_ERROR(oomb_swiglu(ctx, rnd(OOMB_TYPE_F16, 4), rnd(OOMB_TYPE_F16, 4)), "both f32 or both bf16");
    EXPECT_OOMB_ERROR(oomb_mul_mat_ext(ctx, a, b, OOMB_TYPE_F16), "result type");
}

TEST_F(Ops, RmsNormMulErrors) {
    oomb_tensor * x = rnd(OOMB_TYPE_F32, 8, 3);
    oomb_tensor * dy = rnd(OOMB_TYPE_F32, 8, 3);
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, rnd(OOMB_TYPE_F32, 7), 1e-6f), "rms_norm_mul: w");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, rnd(OOMB_TYPE_F32, 8, 2), 1e-6f), "rms_norm_mul: w");
    oomb_tensor * w2 = rnd(OOMB_TYPE_F32, 2, 8);
    oomb_tensor * strided = oomb_transpose(ctx, oomb_view_2d(ctx, w2, 1, 8, w2->nb[1], 0));  // [8, 1], 8 bytes apart
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, strided, 1e-6f), "unit stride");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, rnd(OOMB_TYPE_BF16, 8, 3), rnd(OOMB_TYPE_F32, 8), 1e-6f), "rms_norm_mul: x must be f32");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, rnd(OOMB_TYPE_F16, 8), 1e-6f), "rms_norm_mul: w must be f32");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, rnd(OOMB_TYPE_F32, 8), -1.0f), "eps");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul_ext(ctx, x, rnd(OOMB_TYPE_F32, 8), 1e-6f, OOMB_TYPE_F16), "result type");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul_back(ctx, x, rnd(OOMB_TYPE_F32, 8), rnd(OOMB_TYPE_F32, 8, 4), 1e-6f, true), "shapes differ");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul_back(ctx, x, rnd(OOMB_TYPE_F32, 8), rnd(OOMB_TYPE_BF16, 8, 3), 1e-6f, false), "dy must be f32");
    (void) dy;
}

// NEOX rope in double on [D, H, T, B] logical values; ff (if not empty): the frequency factors, the
// angle of pair i divided by ff[i] (llama.cpp's ggml_rope_ext).
vec rope_ref(const oomb_tensor * a, const std::vector<int32_t> & pos, int n_dims, double theta, bool back,
             const std::vector<double> & ff = {}) {
    A4 A(a), R = A;
    const int64_t half = n_dims / 2;
    for (int64_t b = 0; b < A.ne[3]; b++)
    for (int64_t t = 0; t < A.ne[2]; t++)
    for (int64_t h = 0; h < A.ne[1]; h++)
    for (int64_t i = 0; i < half; i++) {
        const double ang = pos[(size_t) t] * std::pow(theta, -2.0 * (double) i / n_dims) / (ff.empty() ? 1.0 : ff[(size_t) i]);
        const double c = std::cos(ang), s = back ? -std::sin(ang) : std::sin(ang);
        const double x0 = A(i, h, t, b), x1 = A(i + half, h, t, b);
        R(i, h, t, b) = x0 * c - x1 * s;
        R(i + half, h, t, b) = x0 * s + x1 * c;
    }
    return R.v;
}

TEST_F(Ops, RopeAndBack) {
    const int64_t cases[][5] = {{64, 3, 7, 2, 64}, {16, 2, 5, 1, 8}, {2, 1, 3, 1, 2}, {128, 2, 4, 1, 128}};
    for (auto & cs : cases) {
        const int64_t D = cs[0], H = cs[1], T = cs[2], B = cs[3];
        const int n_dims = (int) cs[4];
        const float theta = 1000000.0f;
        const std::vector<int32_t> p = rand_pos(T, 32767);
        oomb_tensor * pos = ids(p, T);
        oomb_tensor * a = rnd(OOMB_TYPE_F32, D, H, T, B);
        oomb_tensor * y = oomb_rope(ctx, a, pos, n_dims, theta);
        oomb_tensor * yb = oomb_rope_back(ctx, a, pos, n_dims, theta);
        compute(y);
        compute(yb);
        EXPECT_REL(to_vector(y), rope_ref(a, p, n_dims, theta, false), 1e-6) << D;
        EXPECT_REL(to_vector(yb), rope_ref(a, p, n_dims, theta, true), 1e-6) << D;
        // rope_back is the inverse of rope
        oomb_tensor * rt = oomb_rope_back(ctx, y, pos, n_dims, theta);
        compute(rt);
        EXPECT_REL(to_vector(rt), to_vector(a), 1e-6);
    }
    // non-contiguous source: q as a permuted view of [D, T, H]
    oomb_tensor * base = rnd(OOMB_TYPE_F32, 16, 5, 3);
    oomb_tensor * a = oomb_permute(ctx, base, 0, 2, 1, 3); // [16, 3, 5]
    std::vector<int32_t> p = {3, 4, 5, 6, 7};
    oomb_tensor * y = oomb_rope(ctx, a, ids(p, 5), 16, 10000.0f);
    compute(y);
    EXPECT_REL(to_vector(y), rope_ref(a, p, 16, 10000.0, false), 1e-6);
}

// rope_ext with frequency factors: against the float64 reference on partial rotations (n_dims <
// head_dim), odd token counts and factors from 1 to 32 (Llama 3's range); NULL factors and factors
// of exactly 1 give oomb_rope's result bit for bit; bad factors are refused.
TEST_F(Ops, RopeFreqFactors) {
    struct C { int64_t D, H, T, B; int n_dims; };
    const C cases[] = {{64, 3, 7, 2, 48}, {24, 2, 5, 1, 16}, {6, 1, 3, 1, 2}, {128, 2, 9, 1, 128}, {10, 3, 1, 1, 6}};
    for (const C & cs : cases) {
        const int64_t D = cs.D, T = cs.T;
        const int n_dims = cs.n_dims;
        const float theta = 500000.0f;
        const std::vector<int32_t> p = rand_pos(T, 131071);
        oomb_tensor * pos = ids(p, T);
        oomb_tensor * a = rnd(OOMB_TYPE_F32, D, cs.H, T, cs.B);
        oomb_tensor * ff = rnd(OOMB_TYPE_F32, n_dims / 2, 1, 1, 1, 1.0f, 32.0f);
        const vec ffv = to_vector(ff);
        oomb_tensor * y = oomb_rope_ext(ctx, a, pos, n_dims, theta, ff);
        oomb_tensor * yb = oomb_rope_back_ext(ctx, a, pos, n_dims, theta, ff);
        compute(y);
        compute(yb);
        EXPECT_REL(to_vector(y), rope_ref(a, p, n_dims, theta, false, ffv), 1e-6) << D << " " << n_dims;
        EXPECT_REL(to_vector(yb), rope_ref(a, p, n_dims, theta, true, ffv), 1e-6) << D << " " << n_dims;
        // the factors change the result (where a rotated pair has a nonzero position)
        EXPECT_GT(rel_err(to_vector(y), rope_ref(a, p, n_dims, theta, false)), T > 1 ? 1e-3 : -1.0);
        // rope_back_ext inverts rope_ext (in place on a copy of y, as the allocator may run it)
        oomb_tensor * rt = oomb_rope_back_ext(ctx, y, pos, n_dims, theta, ff);
        compute(rt);
        EXPECT_REL(to_vector(rt), to_vector(a), 1e-6);
        // NULL factors and factors of 1: oomb_rope bit for bit, forward and back
        oomb_tensor * ones = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, n_dims / 2);
        for (int i = 0; i < n_dims / 2; i++) oomb_set_f32_1d(ones, i, 1.0f);
        for (bool back : {false, true}) {
            oomb_tensor * r0 = back ? oomb_rope_back(ctx, a, pos, n_dims, theta) : oomb_rope(ctx, a, pos, n_dims, theta);
            oomb_tensor * r1 = back ? oomb_rope_back_ext(ctx, a, pos, n_dims, theta, nullptr) : oomb_rope_ext(ctx, a, pos, n_dims, theta, nullptr);
            oomb_tensor * r2 = back ? oomb_rope_back_ext(ctx, a, pos, n_dims, theta, ones) : oomb_rope_ext(ctx, a, pos, n_dims, theta, ones);
            compute(r0);
            compute(r1);
            compute(r2, g_cpu1);
            EXPECT_EQ(oomb_nbytes(r0), oomb_nbytes(r1));
            EXPECT_EQ(0, memcmp(r0->data, r1->data, oomb_nbytes(r0))) << "NULL factors differ from rope, D " << D;
            EXPECT_EQ(0, memcmp(r0->data, r2->data, oomb_nbytes(r0))) << "factors of 1 differ from rope, D " << D;
        }
    }
    // non-contiguous source with factors
    oomb_tensor * base = rnd(OOMB_TYPE_F32, 16, 5, 3);
    oomb_tensor * a = oomb_permute(ctx, base, 0, 2, 1, 3); // [16, 3, 5]
    oomb_tensor * ff = rnd(OOMB_TYPE_F32, 6, 1, 1, 1, 0.5f, 8.0f);
    std::vector<int32_t> p = {3, 40, 5, 6000, 7};
    oomb_tensor * y = oomb_rope_ext(ctx, a, ids(p, 5), 12, 10000.0f, ff);
    compute(y);
    EXPECT_REL(to_vector(y), rope_ref(a, p, 12, 10000.0, false, to_vector(ff)), 1e-6);
    // errors: wrong size, type, layout (at graph build); a factor that is not positive (at compute)
    oomb_tensor * pos = ids(p, 5);
    EXPECT_OOMB_ERROR(oomb_rope_ext(ctx, a, pos, 12, 1e4f, rnd(OOMB_TYPE_F32, 7)), "rope: freq_factors");
    EXPECT_OOMB_ERROR(oomb_rope_back_ext(ctx, a, pos, 12, 1e4f, rnd(OOMB_TYPE_F16, 6)), "rope_back: freq_factors");
    EXPECT_OOMB_ERROR(oomb_rope_ext(ctx, a, pos, 12, 1e4f, oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 2, 3))), "must be f32, contiguous");
    oomb_tensor * bad = rnd(OOMB_TYPE_F32, 6, 1, 1, 1, 1.0f, 2.0f);
    oomb_set_f32_1d(bad, 4, 0.0f);
    EXPECT_OOMB_ERROR(compute(oomb_rope_ext(ctx, a, pos, 12, 1e4f, bad)), "freq_factors[4] = 0 must be positive");
}

vec softmax_row(const vec & x, double scale, int64_t n_valid) {
    vec y(x.size(), 0.0);
    if (n_valid <= 0) return y;
    double mx = -INFINITY;
    for (int64_t i = 0; i < n_valid; i++) mx = std::max(mx, x[(size_t) i] * scale);
    double s = 0;
    for (int64_t i = 0; i < n_valid; i++) s += std::exp(x[(size_t) i] * scale - mx);
    for (int64_t i = 0; i < n_valid; i++) y[(size_t) i] = std::exp(x[(size_t) i] * scale - mx) / s;
    return y;
}

TEST_F(Ops, SoftMaxMaskedAndBack) {
    for (int causal : {-1, 0, 2}) {
        for (int64_t n : {1, 3, 33}) {
            const float scale = 0.7f;
            oomb_tensor * x = rnd(OOMB_TYPE_F32, n, 6, 2, 1, -4.0f, 4.0f);
            oomb_tensor * y = oomb_soft_max(ctx, x, scale, causal);
            compute(y);
            const vec X = to_vector(x);
            vec ref;
            for (int64_t r = 0; r < 12; r++) {
                const int64_t i1 = r % 6;
                const int64_t nv = causal < 0 ? n : std::min<int64_t>(n, i1 + causal + 1);
                const vec row(X.begin() + r * n, X.begin() + (r + 1) * n);
                const vec yr = softmax_row(row, scale, nv);
                ref.insert(ref.end(), yr.begin(), yr.end());
            }
            const vec Y = to_vector(y);
            EXPECT_REL(Y, ref, 1e-6) << "causal " << causal << " n " << n;
            for (double v : Y) ASSERT_FALSE(std::isnan(v));
        }
    }
    // a row of -inf gives zeros, not NaN
    oomb_tensor * x = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 4, 2);
    for (int i = 0; i < 8; i++) oomb_set_f32_1d(x, i, i < 4 ? -INFINITY : (float) i);
    oomb_tensor * y = oomb_soft_max(ctx, x, 1.0f, -1);
    compute(y);
    for (int i = 0; i < 4; i++) EXPECT_EQ(oomb_get_f32_1d(y, i), 0.0f);
    // backward vs central differences of the reference softmax
    const int64_t n = 17;
    const double scale = 0.5;
    oomb_tensor * xs = rnd(OOMB_TYPE_F32, n, 4, 3, 1, -3.0f, 3.0f);
    oomb_tensor * ys = oomb_soft_max(ctx, xs, (float) scale, -1);
    compute(ys);
    oomb_tensor * dy = rnd(OOMB_TYPE_F32, n, 4, 3);
    oomb_tensor * dx = oomb_soft_max_back(ctx, ys, dy, (float) scale);
    compute(dx);
    const vec fd = row_vjp([&](const vec & r) { return softmax_row(r, scale, n); }, to_vector(xs), to_vector(dy), n);
    EXPECT_REL(to_vector(dx), fd, 1e-5);
    // the formula on non-contiguous y and dy
    oomb_tensor * yt = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 5, 9));
    oomb_tensor * gt = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 5, 9));
    oomb_tensor * dxt = oomb_soft_max_back(ctx, yt, gt, 1.3f);
    compute(dxt);
    const vec Yt = to_vector(yt), Gt = to_vector(gt);
    vec ref(Yt.size());
    for (int64_t r = 0; r < 5; r++) {
        double dot = 0;
        for (int64_t i = 0; i < 9; i++) dot += Yt[r * 9 + i] * Gt[r * 9 + i];
        for (int64_t i = 0; i < 9; i++) ref[r * 9 + i] = (double) 1.3f * Yt[r * 9 + i] * (Gt[r * 9 + i] - dot);
    }
    EXPECT_REL(to_vector(dxt), ref, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

struct AttnShape { int64_t D, H, Hkv, T, S, B; };

// Reference GQA causal attention on flat logical q [D,H,T,B], k, v [D,Hkv,S,B].
vec attn_ref(const vec & q, const vec & k, const vec & v, const AttnShape & s, double scale) {
    vec out(q.size(), 0.0);
    const int64_t G = s.H / s.Hkv;
    auto Q = [&](int64_t d, int64_t h, int64_t t, int64_t b) { return q[(size_t) (((b * s.T + t) * s.H + h) * s.D + d)]; };
    auto K = [&](int64_t d, int64_t g, int64_t j, int64_t b) { return k[(size_t) (((b * s.S + j) * s.Hkv + g) * s.D + d)]; };
    auto V = [&](int64_t d, int64_t g, int64_t j, int64_t b) { return v[(size_t) (((b * s.S + j) * s.Hkv + g) * s.D + d)]; };
    for (int64_t b = 0; b < s.B; b++)
    for (int64_t t = 0; t < s.T; t++)
    for (int64_t h = 0; h < s.H; h++) {
        const int64_t g = h / G, n = t + (s.S - s.T) + 1;
        vec sc((size_t) n);
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            double d = 0;
            for (int64_t i = 0; i < s.D; i++) d += Q(i, h, t, b) * K(i, g, j, b);
            sc[(size_t) j] = d * scale;
            mx = std::max(mx, sc[(size_t) j]);
        }
        double l = 0;
        for (auto & x : sc) { x = std::exp(x - mx); l += x; }
        for (int64_t i = 0; i < s.D; i++) {
            double o = 0;
            for (int64_t j = 0; j < n; j++) o += sc[(size_t) j] * V(i, g, j, b);
            out[(size_t) (((b * s.T + t) * s.H + h) * s.D + i)] = o / l;
        }
    }
    return out;
}

TEST_F(Ops, AttnForwardAndBack) {
    const AttnShape shapes[] = {{16, 4, 2, 5, 7, 2}, {8, 3, 3, 4, 4, 1}, {5, 2, 1, 1, 3, 1}};
    for (const AttnShape & s : shapes) {
        const float scale = 1.0f / std::sqrt((float) s.D);
        // q as a permuted view of [D, T, H, B] (non-contiguous source)
        oomb_tensor * qb = rnd(OOMB_TYPE_F32, s.D, s.T, s.H, s.B);
        oomb_tensor * q = oomb_permute(ctx, qb, 0, 2, 1, 3);
        oomb_tensor * k = rnd(OOMB_TYPE_F32, s.D, s.Hkv, s.S, s.B);
        oomb_tensor * v = rnd(OOMB_TYPE_F32, s.D, s.Hkv, s.S, s.B);
        oomb_tensor * dout = rnd(OOMB_TYPE_F32, s.D, s.H, s.T, s.B);
        oomb_tensor * o = oomb_attn(ctx, q, k, v, scale);
        oomb_tensor * gb = oomb_attn_back(ctx, q, k, v, dout, scale);
        compute(o);
        compute(gb);
        const vec Q = to_vector(q), K = to_vector(k), V = to_vector(v), DO = to_vector(dout);
        EXPECT_REL(to_vector(o), attn_ref(Q, K, V, s, scale), 1e-6) << s.D;
        // backward: central differences of L = sum(dout * attn(q, k, v))
        auto L = [&](const vec & q_, const vec & k_, const vec & v_) {
            const vec out = attn_ref(q_, k_, v_, s, scale);
            double acc = 0;
            for (size_t i = 0; i < out.size(); i++) acc += out[i] * DO[i];
            return acc;
        };
        vec ref;
        const double h = 1e-6;
        for (int which = 0; which < 3; which++) {
            const vec & base = which == 0 ? Q : which == 1 ? K : V;
            for (size_t i = 0; i < base.size(); i++) {
                vec p = base, m = base;
                p[i] += h;
                m[i] -= h;
                const double lp = which == 0 ? L(p, K, V) : which == 1 ? L(Q, p, V) : L(Q, K, p);
                const double lm = which == 0 ? L(m, K, V) : which == 1 ? L(Q, m, V) : L(Q, K, m);
                ref.push_back((lp - lm) / (2 * h));
            }
        }
        EXPECT_REL(to_vector(gb), ref, 1e-5) << s.D;
        // one thread gives the same bits
        oomb_tensor * gb1 = oomb_attn_back(ctx, q, k, v, dout, scale);
        compute(gb1, g_cpu1);
        EXPECT_EQ(to_vector(gb1), to_vector(gb));
    }
}

// ---------------------------------------------------------------------------------------------
// Optimizers
// ---------------------------------------------------------------------------------------------

TEST_F(Ops, AdamWAndSgdSteps) {
    for (oomb_type ptype : {OOMB_TYPE_F32, OOMB_TYPE_BF16}) {
        const int64_t n0 = 33, n1 = 17;
        oomb_tensor * p = rnd(ptype, n0, n1);
        oomb_tensor * g = rnd(OOMB_TYPE_F32, n0, n1);
        oomb_tensor * m = rnd(OOMB_TYPE_F32, n0, n1, 1, 1, -0.1f, 0.1f);
        oomb_tensor * v = rnd(OOMB_TYPE_F32, n0, n1, 1, 1, 0.0f, 0.01f);
        const float h[8] = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 1.0f - 0.9f * 0.9f * 0.9f, 1.0f - 0.95f * 0.95f * 0.95f};
        oomb_tensor * hp = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 8);
        for (int i = 0; i < 8; i++) oomb_set_f32_1d(hp, i, h[i]);
        const vec P = to_vector(p), G = to_vector(g), M = to_vector(m), Vv = to_vector(v);
        oomb_tensor * st = oomb_adamw_step(ctx, p, g, m, v, hp);
        compute(st);
        const vec P1 = to_vector(p), M1 = to_vector(m), V1 = to_vector(v);
        for (size_t i = 0; i < P.size(); i++) {
            const double gg = G[i] * h[5];
            const double mi = h[1] * M[i] + (1 - (double) h[1]) * gg;
            const double vi = h[2] * Vv[i] + (1 - (double) h[2]) * gg * gg;
            const double w = P[i] - h[0] * ((mi / h[6]) / (std::sqrt(vi / h[7]) + h[3]) + h[4] * P[i]);
            ASSERT_NEAR(M1[i], mi, 1e-6);
            ASSERT_NEAR(V1[i], vi, 1e-7);
            const double tol = ptype == OOMB_TYPE_BF16 ? std::fabs(w) * (1.0 / 128) : 1e-6;
            ASSERT_NEAR(P1[i], w, tol) << i;
        }
        // sgd
        const float hs[3] = {0.05f, 0.01f, 2.0f};
        oomb_tensor * hps = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 3);
        for (int i = 0; i < 3; i++) oomb_set_f32_1d(hps, i, hs[i]);
        compute(oomb_sgd_step(ctx, p, g, hps));
        const vec P2 = to_vector(p);
        for (size_t i = 0; i < P.size(); i++) {
            const double w = P1[i] - hs[0] * (G[i] * hs[2] + hs[1] * P1[i]);
            const double tol = ptype == OOMB_TYPE_BF16 ? std::fabs(w) * (1.0 / 128) : 1e-6;
            ASSERT_NEAR(P2[i], w, tol);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// In-place execution, threads, errors
// ---------------------------------------------------------------------------------------------

// Builds op(src...) twice: once normally, once with the result's memory set to src[0]'s memory.
// Both must agree bit for bit.
TEST_F(Ops, InPlaceMatchesOutOfPlace) {
    const int64_t V = 37, R = 6;
    oomb_tensor * pos = ids({0, 7, 300, 12345, 2, 9}, R);
    std::vector<int32_t> lab = {1, 36, -100, 0, 5, 2};
    oomb_tensor * labels = ids(lab, R);
    oomb_tensor * dl = oomb_fill(ctx, 2, 1, 1, 1, 0.25f);
    using builder = std::function<oomb_tensor *(oomb_tensor *)>;
    std::vector<std::pair<const char *, builder>> ops;
    oomb_tensor * other = rnd(OOMB_TYPE_F32, V, 1, R);
    oomb_tensor * bcast = rnd(OOMB_TYPE_F32, V, 1, 1);
    ops.push_back({"add", [&](oomb_tensor * a) { return oomb_add(ctx, a, bcast); }});
    ops.push_back({"sub", [&](oomb_tensor * a) { return oomb_sub(ctx, a, other); }});
    ops.push_back({"mul", [&](oomb_tensor * a) { return oomb_mul(ctx, a, bcast); }});
    ops.push_back({"scale", [&](oomb_tensor * a) { return oomb_scale(ctx, a, 3.0f); }});
    ops.push_back({"silu", [&](oomb_tensor * a) { return oomb_silu(ctx, a); }});
    ops.push_back({"silu_back", [&](oomb_tensor * a) { return oomb_silu_back(ctx, a, other); }});
    ops.push_back({"swiglu", [&](oomb_tensor * a) { return oomb_swiglu(ctx, a, other); }});
    ops.push_back({"rms_norm", [&](oomb_tensor * a) { return oomb_rms_norm(ctx, a, 1e-6f); }});
    ops.push_back({"rope", [&](oomb_tensor * a) { return oomb_rope(ctx, a, pos, 36, 10000.0f); }});
    ops.push_back({"rope_back", [&](oomb_tensor * a) { return oomb_rope_back(ctx, a, pos, 20, 10000.0f); }});
    ops.push_back({"soft_max", [&](oomb_tensor * a) { return oomb_soft_max(ctx, a, 0.5f, 1); }});
    ops.push_back({"cross_entropy_back", [&](oomb_tensor * a) {
        return oomb_cross_entropy_loss_back(ctx, oomb_reshape_2d(ctx, a, V, R), labels, dl, -100); }});
    for (auto & [name, build] : ops) {
        oomb_tensor * a = rnd(OOMB_TYPE_F32, V, 1, R); // [37, 1, 6]: rope sees 6 tokens of one head
        oomb_tensor * a2 = oomb_dup_tensor(ctx, a);
        memcpy(a2->data, a->data, oomb_nbytes(a));
        oomb_tensor * ref = build(a);
        compute(ref);
        oomb_tensor * t = build(a2);
        // construct the in-place graph by hand: the result shares src[0]'s memory
        oomb_tensor * s0 = t->src[0];
        ASSERT_EQ(oomb_nbytes(t), oomb_nbytes(s0)) << name;
        t->data = s0->data;
        compute(t);
        EXPECT_EQ(to_vector(t), to_vector(ref)) << name;
    }
    // src[0] overlapping the result with another layout (a transposed view) is still correct
    oomb_tensor * sq = rnd(OOMB_TYPE_F32, 9, 9);
    oomb_tensor * st = oomb_transpose(ctx, sq);
    const vec expect = [&] { vec e = to_vector(st); for (auto & x : e) x *= 2.0; return e; }();
    oomb_tensor * sc = oomb_scale(ctx, st, 2.0f);
    sc->data = sq->data;
    compute(sc);
    EXPECT_EQ(to_vector(sc), expect);
}

// Worst |a_i - b_i| / scale_i: a difference measured against the magnitudes that make up each
// value (for a sum, the sum of |terms|), not against the value (a near-zero sum has no relative error).
double scaled_err(const vec & a, const vec & b, const vec & scale) {
    EXPECT_EQ(a.size(), b.size());
    EXPECT_EQ(a.size(), scale.size());
    double worst = 0;
    for (size_t i = 0; i < a.size() && i < b.size() && i < scale.size(); i++) {
        const double d = std::fabs(a[i] - b[i]);
        if (d == 0) continue;
        if (!(scale[i] > 0)) return INFINITY;
        worst = std::max(worst, d / scale[i]);
    }
    return worst;
}

// The sum of |terms| of each element of mul_mat(a, b), a [K, M], b [K, N] (2-D, logical order).
vec abs_product(const vec & a, const vec & b, int64_t K, int64_t M, int64_t N) {
    vec r((size_t) (M * N), 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += std::fabs(a[(size_t) (m * K + k)]) * std::fabs(b[(size_t) (n * K + k)]);
            r[(size_t) (n * M + m)] = acc;
        }
    return r;
}

// Thread count. Our own kernels split work so that their results do not depend on the thread count:
// given the same inputs, 1 and 3 threads agree bit for bit. OpenBLAS's sgemm makes no such promise
// (the last bits of a product change with the thread count on some cores, e.g. Haswell's kernels):
// the products and what is computed from them are compared with tolerances scaled by the magnitudes
// involved: a product's element against its sum of |terms|, a tensor against its RMS, the near-zero
// repeat_back of cross-entropy gradients against the sum of |terms| it adds up.
TEST_F(Ops, OneAndThreeThreadsAgree) {
    // sizes large enough for the kernels to split work over threads
    oomb_tensor * x = rnd(OOMB_TYPE_F32, 256, 64, 4);
    oomb_tensor * w = rnd(OOMB_TYPE_F32, 256, 96);
    oomb_tensor * wb = rnd(OOMB_TYPE_BF16, 96, 128);
    oomb_tensor * pos = ids({0, 1, 2, 3}, 4);
    std::vector<int32_t> lab(64 * 4);
    for (size_t i = 0; i < lab.size(); i++) lab[i] = (int32_t) ((i * 37) % 128);
    oomb_tensor * labels = ids(lab, 64 * 4);
    // the chain after each product: h [96, 64, 4] -> s, r, sm; lg [128, 64, 4] -> ce, dce, rb, tot
    auto after_h = [&](oomb_tensor * h) {
        oomb_tensor * s = oomb_swiglu(ctx, h, oomb_silu(ctx, h));
        oomb_tensor * r = oomb_rope(ctx, oomb_reshape_4d(ctx, s, 32, 3 * 64, 4, 1), pos, 32, 10000.0f);
        oomb_tensor * sm = oomb_soft_max(ctx, oomb_reshape_3d(ctx, r, 96, 64, 4), 0.3f, 0);
        return std::vector<oomb_tensor *>{s, r, sm};
    };
    auto after_lg = [&](oomb_tensor * lg) {
        oomb_tensor * ce = oomb_cross_entropy_loss(ctx, lg, labels, -1);
        oomb_tensor * dce = oomb_cross_entropy_loss_back(ctx, lg, labels, oomb_fill(ctx, 2, 1, 1, 1, 1.0f), -1);
        oomb_tensor * rb = oomb_repeat_back(ctx, oomb_transpose(ctx, dce), oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 64, 1));
        oomb_tensor * tot = oomb_add(ctx, oomb_sum_sq(ctx, rb), oomb_sum(ctx, ce));
        return std::vector<oomb_tensor *>{ce, dce, rb, tot};
    };
    auto run_both = [&](const std::vector<oomb_tensor *> & outs, std::vector<vec> & v3, std::vector<vec> & v1) {
        oomb_cgraph * g = oomb_new_graph(ctx);
        for (auto * t : outs) oomb_build_forward_expand(g, t);
        oomb_backend_graph_compute(g_cpu, g);
        for (auto * t : outs) v3.push_back(to_vector(t));
        oomb_backend_graph_compute(g_cpu1, g);
        for (auto * t : outs) v1.push_back(to_vector(t));
    };

    {   // 1. our kernels on inputs that no product made: bit for bit
        std::vector<oomb_tensor *> outs = {oomb_rms_norm(ctx, x, 1e-6f)};
        for (auto * t : after_h(rnd(OOMB_TYPE_F32, 96, 64, 4, 1, -3.0f, 3.0f))) outs.push_back(t);
        for (auto * t : after_lg(rnd(OOMB_TYPE_F32, 128, 64, 4, 1, -4.0f, 4.0f))) outs.push_back(t);
        std::vector<vec> v3, v1;
        run_both(outs, v3, v1);
        for (size_t i = 0; i < outs.size(); i++) EXPECT_EQ(v1[i], v3[i]) << oomb_op_name(outs[i]->op) << " (no product upstream)";
    }

    {   // 2. the products on the same inputs: each element within K * FLT_EPSILON of its sum of
        // |terms| (two f32 accumulations of K terms, each within K/2 ulp of the exact sum); a
        // missing or wrong term is ~1/K of that sum
        oomb_tensor * n = oomb_rms_norm(ctx, x, 1e-6f);
        oomb_tensor * b = rnd(OOMB_TYPE_F32, 96, 64, 4, 1, 0.0f, 1.0f);
        const std::vector<oomb_tensor *> outs = {n, oomb_mul_mat(ctx, w, n), oomb_mul_mat(ctx, wb, b)};
        std::vector<vec> v3, v1;
        run_both(outs, v3, v1);
        ASSERT_EQ(v1[0], v3[0]) << "rms_norm: the same input to the product";
        EXPECT_LT(scaled_err(v1[1], v3[1], abs_product(to_vector(w), v3[0], 256, 96, 64 * 4)), 256 * FLT_EPSILON) << "mul_mat f32";
        EXPECT_LT(scaled_err(v1[2], v3[2], abs_product(to_vector(wb), to_vector(b), 96, 128, 64 * 4)), 96 * FLT_EPSILON) << "mul_mat bf16 a";
    }

    // 3. the whole chain, products included: the products' last bits reach everything after them.
    // A tensor within 1e-5 of its RMS (||a - b|| / ||b||; the products differ by ~2e-7 of their RMS,
    // the softmax of 0.3 * values in the hundreds amplifies that: 1.6e-6 seen with OpenBLAS's Haswell
    // kernels, against 0 with its AVX-512 ones); rb[j] = sum over (v, k) of
    // dce[v, j, k] is near zero (softmax - one-hot sums to 0 over v): within 1e-6 of the sum of
    // |terms| it adds up; the loss (a sum of positive terms) within 1e-6 relative.
    oomb_tensor * n = oomb_rms_norm(ctx, x, 1e-6f);
    oomb_tensor * h = oomb_mul_mat(ctx, w, n);                                   // [96, 64, 4]
    const std::vector<oomb_tensor *> hs = after_h(h);
    oomb_tensor * lg = oomb_mul_mat(ctx, wb, hs[2]);                             // [128, 64, 4]
    const std::vector<oomb_tensor *> ls = after_lg(lg);
    std::vector<oomb_tensor *> outs = {h, hs[0], hs[1], hs[2], lg, ls[0], ls[1], ls[2], ls[3]};
    std::vector<vec> v3, v1;
    run_both(outs, v3, v1);
    for (size_t i : {0, 1, 2, 3, 4, 5, 6}) EXPECT_REL(v1[i], v3[i], 1e-5) << oomb_op_name(outs[i]->op) << " (downstream of mul_mat)";
    {
        const vec & dce = v3[6];
        vec mag(64, 0.0);
        for (int64_t k = 0; k < 4; k++)
            for (int64_t j = 0; j < 64; j++)
                for (int64_t v = 0; v < 128; v++) mag[(size_t) j] += std::fabs(dce[(size_t) ((k * 64 + j) * 128 + v)]);
        EXPECT_LT(scaled_err(v1[7], v3[7], mag), 1e-6) << "repeat_back (downstream of mul_mat)";
    }
    EXPECT_REL(v1[8], v3[8], 1e-6) << "the loss";
    // set_n_threads rebuilds the pool and keeps results (the sum is of positive terms: relative)
    oomb_backend_t be = oomb_backend_cpu_init(2);
    oomb_backend_cpu_set_n_threads(be, 4);
    compute(ls[3], be);
    EXPECT_REL(to_vector(ls[3]), v3.back(), 1e-6);
    oomb_backend_free(be);
}

TEST_F(Ops, GraphWithoutDataIsAnError) {
    oomb_context * c2 = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_1d(c2, OOMB_TYPE_F32, 4);
    oomb_set_name(a, "x");
    oomb_tensor * b = oomb_scale(c2, a, 2.0f);
    oomb_cgraph * g = oomb_new_graph(c2);
    oomb_build_forward_expand(g, b);
    EXPECT_OOMB_ERROR(oomb_backend_graph_compute(g_cpu, g), "has no data");
    oomb_free(c2);
}

TEST_F(Ops, BackendBasics) {
    EXPECT_TRUE(oomb_backend_is_host(g_cpu));
    oomb_buffer_t buf = oomb_backend_alloc_buffer(g_cpu, 1000);
    ASSERT_NE(buf, nullptr);
    EXPECT_EQ((uintptr_t) oomb_buffer_base(buf) % 256, 0u);
    oomb_context * c2 = oomb_init({0, true});
    oomb_tensor * a = oomb_new_tensor_1d(c2, OOMB_TYPE_F32, 10);
    oomb_tensor_alloc(buf, a, 256);
    std::vector<float> in(10), out(10);
    for (int i = 0; i < 10; i++) in[(size_t) i] = (float) i * 0.5f;
    oomb_tensor_set_f32(a, in.data(), 10);
    oomb_tensor * b = oomb_scale(c2, a, 2.0f);
    oomb_tensor_alloc(buf, b, 512);
    oomb_cgraph * g = oomb_new_graph(c2);
    oomb_build_forward_expand(g, b);
    oomb_backend_graph_compute(g_cpu, g);
    oomb_backend_synchronize(g_cpu);
    oomb_tensor_get_f32(b, out.data(), 10);
    for (int i = 0; i < 10; i++) EXPECT_EQ(out[(size_t) i], (float) i);
    oomb_free(c2);
    oomb_buffer_free(buf);
}

} // namespace

// ---- bf16 results (oomb_mul_ext, oomb_swiglu_ext) and bf16 b operands of mul_mat ---------------
TEST_F(Ops, Bf16ResultsAndBf16MulMatOperand) {
    oomb_tensor * x = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 33, 17, 2, 1, -6.0f, 6.0f)); // [17, 33, 2]
    oomb_tensor * y = rnd(OOMB_TYPE_F32, 17, 33, 2);
    oomb_tensor * w = rnd(OOMB_TYPE_F32, 17);
    for (oomb_backend_t be : {g_cpu, g_cpu1}) {
        oomb_tensor * m32 = oomb_mul(ctx, x, w);
        oomb_tensor * m16 = oomb_mul_ext(ctx, x, w, OOMB_TYPE_BF16);
        oomb_tensor * s32 = oomb_swiglu(ctx, x, y);
        oomb_tensor * s16 = oomb_swiglu_ext(ctx, x, y, OOMB_TYPE_BF16);
        oomb_tensor * sf = oomb_swiglu_ext(ctx, x, y, OOMB_TYPE_F32);
        ASSERT_EQ(m16->type, OOMB_TYPE_BF16);
        ASSERT_EQ(s16->type, OOMB_TYPE_BF16);
        ASSERT_EQ(m16->nb[0], 2u);
        for (oomb_tensor * t : {m32, m16, s32, s16, sf}) compute(t, be);
        // the bf16 results are the f32 ones rounded to nearest even
        const vec M32 = to_vector(m32), M16 = to_vector(m16), S32 = to_vector(s32), S16 = to_vector(s16);
        for (size_t i = 0; i < M32.size(); i++) {
            ASSERT_EQ((float) M16[i], oomb_bf16_to_fp32(oomb_fp32_to_bf16((float) M32[i]))) << i;
            ASSERT_EQ((float) S16[i], oomb_bf16_to_fp32(oomb_fp32_to_bf16((float) S32[i]))) << i;
        }
        EXPECT_EQ(to_vector(sf), S32);
        // swiglu_back_ext: the f32 [dgate; dup] rounded
        oomb_tensor * dy = rnd(OOMB_TYPE_F32, 17, 33, 2);
        oomb_tensor * gb32 = oomb_swiglu_back(ctx, x, y, dy);
        oomb_tensor * gb16 = oomb_swiglu_back_ext(ctx, x, y, dy, OOMB_TYPE_BF16);
        compute(gb32, be); compute(gb16, be);
        const vec G32 = to_vector(gb32), G16 = to_vector(gb16);
        ASSERT_EQ(G32.size(), G16.size());
        for (size_t i = 0; i < G32.size(); i++) ASSERT_EQ((float) G16[i], oomb_bf16_to_fp32(oomb_fp32_to_bf16((float) G32[i]))) << i;
        // mul_mat with a bf16 b (contiguous, transposed view, strided rows): the product of the
        // rounded values
        oomb_tensor * a = rnd(OOMB_TYPE_F32, 17, 9);
        oomb_tensor * b16 = oomb_cont(ctx, s16);                                   // [17, 33, 2] bf16
        oomb_tensor * b32 = oomb_cast(ctx, b16, OOMB_TYPE_F32);
        oomb_tensor * p16 = oomb_mul_mat(ctx, a, b16);
        oomb_tensor * p32 = oomb_mul_mat(ctx, a, b32);
        oomb_tensor * aT = oomb_transpose(ctx, rnd(OOMB_TYPE_F32, 5, 33));     // [33, 5]
        oomb_tensor * t16 = oomb_mul_mat(ctx, aT, oomb_transpose(ctx, oomb_view_2d(ctx, b16, 17, 33, b16->nb[1], 0)));  // dW pattern
        oomb_tensor * t32 = oomb_mul_mat(ctx, aT, oomb_transpose(ctx, oomb_view_2d(ctx, b32, 17, 33, b32->nb[1], 0)));
        oomb_tensor * a15 = oomb_view_2d(ctx, a, 15, 9, a->nb[1], 0);
        oomb_tensor * v16 = oomb_mul_mat(ctx, a15, oomb_view_2d(ctx, b16, 15, 33, b16->nb[1], 2 * sizeof(uint16_t)));  // ld 17 > K 15
        oomb_tensor * v32 = oomb_mul_mat(ctx, a15, oomb_view_2d(ctx, b32, 15, 33, b32->nb[1], 2 * sizeof(float)));
        for (oomb_tensor * t : {p16, p32, t16, t32, v16, v32}) compute(t, be);
        EXPECT_REL(to_vector(p16), to_vector(p32), 1e-6);
        EXPECT_REL(to_vector(t16), to_vector(t32), 1e-6);
        EXPECT_REL(to_vector(v16), to_vector(v32), 1e-6);
    }
    EXPECT_OOMB_ERROR(oomb_mul_ext(ctx, x, w, OOMB_TYPE_F16), "mul_ext");
    // input errors name the function called (from a review)
    EXPECT_OOMB_ERROR(oomb_mul_ext(ctx, oomb_new_tensor_2d(ctx, OOMB_TYPE_I32, 17, 33), w, OOMB_TYPE_BF16), "mul_ext: a must be f32");
    EXPECT_OOMB_ERROR(oomb_swiglu_ext(ctx, oomb_cast(ctx, y, OOMB_TYPE_BF16), y, OOMB_TYPE_BF16), "swiglu_ext: gate");  // mixed types
    EXPECT_OOMB_ERROR(oomb_swiglu_back_ext(ctx, x, y, oomb_cast(ctx, y, OOMB_TYPE_BF16), OOMB_TYPE_BF16), "swiglu_back_ext: dy must be f32");
    EXPECT_OOMB_ERROR(oomb_swiglu_back_ext(ctx, x, y, y, OOMB_TYPE_I32), "swiglu_back_ext");
    EXPECT_OOMB_ERROR(oomb_swiglu_ext(ctx, x, y, OOMB_TYPE_I32), "swiglu_ext");
    EXPECT_OOMB_ERROR(oomb_mul_mat(ctx, rnd(OOMB_TYPE_F32, 4, 3), oomb_new_tensor_2d(ctx, OOMB_TYPE_I32, 4, 2)), "mul_mat");
}

// ---- oomb_swiglu_back: direct checks, non-contiguous 4-D operands (cases from a review) --------
TEST_F(Ops, SwigluBackNonContiguous4D) {
    // gate transposed, up permuted 4-D, dy an offset strided view; ne3 = 3
    oomb_tensor * gb = rnd(OOMB_TYPE_F32, 3, 7, 2, 3, -6.0f, 6.0f);
    oomb_tensor * g = oomb_permute(ctx, gb, 1, 0, 2, 3);                       // [7, 3, 2, 3]
    oomb_tensor * ub = rnd(OOMB_TYPE_F32, 2, 3, 7, 3);
    oomb_tensor * u = oomb_permute(ctx, ub, 2, 1, 0, 3);                       // [7, 3, 2, 3]
    oomb_tensor * yb = rnd(OOMB_TYPE_F32, 9, 3, 2, 4);
    oomb_tensor * dy = oomb_view_4d(ctx, yb, 7, 3, 2, 3, yb->nb[1], yb->nb[2], yb->nb[3], 2 * sizeof(float) + yb->nb[3]);
    for (oomb_backend_t be : {g_cpu, g_cpu1}) {
        oomb_tensor * r = oomb_swiglu_back(ctx, g, u, dy);
        ASSERT_EQ(r->ne[0], 7); ASSERT_EQ(r->ne[1], 3); ASSERT_EQ(r->ne[2], 2); ASSERT_EQ(r->ne[3], 6);
        compute(r, be);
        const vec G = to_vector(g), U = to_vector(u), Y = to_vector(dy), R = to_vector(r);
        vec ref(2 * G.size());
        for (size_t i = 0; i < G.size(); i++) {
            const double s = 1.0 / (1.0 + std::exp(-G[i]));
            ref[i] = Y[i] * U[i] * s * (1.0 + G[i] * (1.0 - s));
            ref[G.size() + i] = Y[i] * G[i] * s;
        }
        EXPECT_LT(rel_err(R, ref), 1e-6);
        // also against the unfused ops
        oomb_tensor * dg = oomb_silu_back(ctx, g, oomb_mul(ctx, dy, u));
        oomb_tensor * du = oomb_mul(ctx, dy, oomb_silu(ctx, g));
        compute(dg, be); compute(du, be);
        vec un = to_vector(dg);
        const vec dv = to_vector(du);
        un.insert(un.end(), dv.begin(), dv.end());
        EXPECT_LT(rel_err(R, un), 1e-6);
    }
    // extreme gate values: finite, matching the unfused silu_back
    oomb_tensor * ge = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 6);
    const float vals[6] = {-200.f, -88.f, -30.f, 30.f, 88.f, 200.f};
    for (int i = 0; i < 6; i++) oomb_set_f32_1d(ge, i, vals[i]);
    oomb_tensor * one = oomb_fill(ctx, 6, 1, 1, 1, 1.0f);
    oomb_tensor * r = oomb_swiglu_back(ctx, ge, one, one);
    oomb_tensor * sb = oomb_silu_back(ctx, ge, one);
    compute(r); compute(sb);
    for (int i = 0; i < 6; i++) {
        EXPECT_TRUE(std::isfinite(oomb_get_f32_1d(r, i))) << vals[i];
        EXPECT_TRUE(std::isfinite(oomb_get_f32_1d(r, 6 + i))) << vals[i];
        EXPECT_NEAR(oomb_get_f32_1d(r, i), oomb_get_f32_1d(sb, i), 1e-6) << vals[i];
    }
}

// review-s19: rms_norm_mul(_back) on views with unit-stride rows but padded / permuted dims 1..3
// (not prepared into copies), > 64 * 3 rows (several dw blocks per thread), 1 vs 3 threads;
// nrows == 0; more bad inputs.
TEST_F(Ops, ReviewS19RmsNormMulViewsEdges) {
    const float eps = 1e-6f;
    oomb_tensor * base = rnd(OOMB_TYPE_F32, 33, 71, 9, 1, -2.0f, 2.0f);          // [33, T=71, H=9]
    oomb_tensor * xs[2] = {oomb_permute(ctx, base, 0, 2, 1, 3),                   // [33, 9, 71], nb1 > nb2
                           oomb_view_2d(ctx, base, 31, 600, base->nb[1], 2 * sizeof(float))};  // padded rows, offset
    for (oomb_tensor * x : xs) {
        const int64_t n = x->ne[0];
        oomb_tensor * w = rnd(OOMB_TYPE_F32, n, 1, 1, 1, 0.5f, 1.5f);
        oomb_tensor * dyb = rnd(OOMB_TYPE_F32, n, x->ne[1], x->ne[2], x->ne[3]);
        oomb_tensor * pk = oomb_rms_norm_mul_back(ctx, x, w, dyb, eps, true);
        oomb_tensor * pk1 = oomb_rms_norm_mul_back(ctx, x, w, dyb, eps, true);
        oomb_tensor * dxo = oomb_rms_norm_mul_back(ctx, x, w, dyb, eps, false);
        oomb_tensor * y = oomb_rms_norm_mul(ctx, x, w, eps);
        oomb_tensor * nrm = oomb_rms_norm(ctx, x, eps);
        oomb_tensor * y0 = oomb_mul(ctx, nrm, w);
        oomb_tensor * dx0 = oomb_rms_norm_back(ctx, x, oomb_mul(ctx, dyb, w), eps);
        oomb_tensor * dw0 = oomb_repeat_back(ctx, oomb_mul(ctx, dyb, nrm), w);
        for (oomb_tensor * t : {pk, dxo, y, y0, dx0, dw0}) compute(t);
        compute(pk1, g_cpu1);
        const vec P = to_vector(pk);
        const int64_t nx = oomb_nelements(x);
        EXPECT_EQ(to_vector(pk1), P);
        EXPECT_EQ(to_vector(y), to_vector(y0));
        EXPECT_EQ(to_vector(dxo), to_vector(dx0));
        EXPECT_EQ(vec(P.begin(), P.begin() + nx), to_vector(dx0));
        EXPECT_REL(vec(P.begin() + nx, P.end()), to_vector(dw0), 1e-6);
    }
    { // no rows: dw must be written as zeros (result memory starts as garbage)
        oomb_tensor * x = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 8, 0);
        oomb_tensor * dy = oomb_new_tensor_2d(ctx, OOMB_TYPE_F32, 8, 0);
        oomb_tensor * w = rnd(OOMB_TYPE_F32, 8);
        oomb_tensor * pk = oomb_rms_norm_mul_back(ctx, x, w, dy, eps, true);
        ASSERT_EQ(pk->ne[1], 1);
        for (int i = 0; i < 8; i++) ((float *) pk->data)[i] = NAN;
        compute(pk);
        EXPECT_EQ(to_vector(pk), vec(8, 0.0));
    }
    oomb_tensor * x = rnd(OOMB_TYPE_F32, 8, 3);
    oomb_tensor * w = rnd(OOMB_TYPE_F32, 8);
    // dy with x's element count but another shape
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul_back(ctx, x, w, rnd(OOMB_TYPE_F32, 24), 1e-6f, false), "rms_norm_mul_back");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul_back(ctx, x, w, rnd(OOMB_TYPE_F32, 3, 8), 1e-6f, true), "rms_norm_mul_back");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, w, NAN), "eps");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, rnd(OOMB_TYPE_F32, 1, 8), 1e-6f), "rms_norm_mul: w");   // [1, 8]
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul(ctx, x, rnd(OOMB_TYPE_BF16, 8), 1e-6f), "w must be f32");
    EXPECT_OOMB_ERROR(oomb_rms_norm_mul_back(ctx, x, rnd(OOMB_TYPE_F32, 9), rnd(OOMB_TYPE_F32, 8, 3), 1e-6f, true), "rms_norm_mul_back: w");
    // ne0 == 1 with a w of stride 8 bytes: allowed (one element)
    oomb_tensor * x1 = rnd(OOMB_TYPE_F32, 1, 5);
    oomb_tensor * wb = rnd(OOMB_TYPE_F32, 2, 1);
    oomb_tensor * y1 = oomb_rms_norm_mul(ctx, x1, oomb_view_1d(ctx, wb, 1, sizeof(float)), 0.0f);
    compute(y1);
    const vec X1 = to_vector(x1), Y1 = to_vector(y1);
    const double wv = ((float *) wb->data)[1];
    for (int i = 0; i < 5; i++) EXPECT_NEAR(Y1[i], (X1[i] > 0 ? 1 : -1) * wv, 1e-6);
}
