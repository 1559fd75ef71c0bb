// Core API: tensor creation, strides, views, graph building, and the documented errors on misuse.
#include "test-common.h"

#include <gtest/gtest.h>

namespace {

struct Ctx {
    oomb_context * ctx;
    explicit Ctx(bool no_alloc = false) { ctx = oomb_init({0, no_alloc}); }
    ~Ctx() { oomb_free(ctx); }
};

TEST(Core, StridesAndSizes) {
    Ctx c;
    oomb_tensor * t = oomb_new_tensor_3d(c.ctx, OOMB_TYPE_F32, 5, 3, 2);
    EXPECT_EQ(t->ne[0], 5); EXPECT_EQ(t->ne[3], 1);
    EXPECT_EQ(t->nb[0], 4u); EXPECT_EQ(t->nb[1], 20u); EXPECT_EQ(t->nb[2], 60u); EXPECT_EQ(t->nb[3], 120u);
    EXPECT_EQ(oomb_nelements(t), 30);
    EXPECT_EQ(oomb_nrows(t), 6);
    EXPECT_EQ(oomb_nbytes(t), 120u);
    EXPECT_EQ(oomb_n_dims(t), 3);
    EXPECT_TRUE(oomb_is_contiguous(t));
    oomb_tensor * h = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_BF16, 7, 2);
    EXPECT_EQ(oomb_nbytes(h), 28u);
    EXPECT_EQ(oomb_type_size(OOMB_TYPE_F16), 2u);
    EXPECT_STREQ(oomb_type_name(OOMB_TYPE_BF16), "bf16");
    EXPECT_STREQ(oomb_op_name(OOMB_OP_MUL_MAT), "mul_mat");
}

TEST(Core, HostMemoryIsZeroedAndTyped) {
    Ctx c;
    oomb_tensor * b = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_BF16, 4);
    EXPECT_EQ(oomb_get_f32_1d(b, 3), 0.0f);
    oomb_set_f32_1d(b, 1, 1.0f / 3.0f);
    EXPECT_NEAR(oomb_get_f32_1d(b, 1), 1.0f / 3.0f, 2e-3);
    oomb_tensor * h = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F16, 2);
    oomb_set_f32_1d(h, 0, 65504.0f);
    EXPECT_EQ(oomb_get_f32_1d(h, 0), 65504.0f);
    oomb_tensor * i = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_I32, 2);
    oomb_set_i32_1d(i, 1, -7);
    EXPECT_EQ(oomb_get_i32_1d(i, 1), -7);
}

TEST(Core, Fp16Bf16Conversions) {
    EXPECT_EQ(oomb_fp32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(oomb_bf16_to_fp32(0xc000), -2.0f);
    EXPECT_EQ(oomb_fp32_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(oomb_fp16_to_fp32(0x7bff), 65504.0f);
    // exhaustive f16 round trip
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = oomb_fp16_to_fp32((uint16_t) h);
        if (f != f) continue;
        ASSERT_EQ(oomb_fp32_to_fp16(f), h);
    }
    // bf16 rounds to nearest even
    EXPECT_EQ(oomb_fp32_to_bf16(oomb_bf16_to_fp32(0x3f80) + 0.00390625f / 2), 0x3f80);
}

TEST(Core, ViewsShareMemoryAndFollowStrides) {
    Ctx c;
    oomb_tensor * a = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 4, 3);
    for (int i = 0; i < 12; i++) oomb_set_f32_1d(a, i, (float) i);
    oomb_tensor * tr = oomb_transpose(c.ctx, a);
    EXPECT_EQ(tr->ne[0], 3); EXPECT_EQ(tr->ne[1], 4);
    EXPECT_FALSE(oomb_is_contiguous(tr));
    EXPECT_EQ(oomb_get_f32_nd(tr, 2, 1, 0, 0), 9.0f);   // a[row 2][col 1]
    oomb_tensor * v = oomb_view_2d(c.ctx, a, 2, 2, a->nb[1], 1 * sizeof(float));
    EXPECT_EQ(oomb_get_f32_nd(v, 0, 1, 0, 0), 5.0f);
    oomb_set_f32_nd(v, 1, 1, 0, 0, 100.0f);
    EXPECT_EQ(oomb_get_f32_1d(a, 6), 100.0f);
    oomb_tensor * r = oomb_reshape_3d(c.ctx, a, 2, 2, 3);
    EXPECT_EQ(oomb_get_f32_nd(r, 1, 1, 1, 0), 7.0f);
    oomb_tensor * p = oomb_permute(c.ctx, r, 2, 0, 1, 3);   // dim0 -> 2, dim1 -> 0, dim2 -> 1
    EXPECT_EQ(p->ne[0], 2); EXPECT_EQ(p->ne[1], 3); EXPECT_EQ(p->ne[2], 2);
    EXPECT_EQ(oomb_get_f32_nd(p, 1, 2, 0, 0), oomb_get_f32_nd(r, 0, 1, 2, 0));
    // views of views resolve to the owner
    oomb_tensor * vv = oomb_view_1d(c.ctx, v, 1, 0);
    EXPECT_EQ(vv->view_src, a);
    EXPECT_EQ(vv->view_offs, sizeof(float));
}

TEST(Core, GraphOrderAndLeafs) {
    Ctx c(true);
    oomb_tensor * x = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F32, 8);
    oomb_tensor * y = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F32, 8);
    oomb_tensor * s = oomb_add(c.ctx, x, y);
    oomb_tensor * m = oomb_mul(c.ctx, s, s);
    oomb_tensor * out = oomb_sum(c.ctx, oomb_add(c.ctx, m, s));
    oomb_cgraph * g = oomb_new_graph(c.ctx);
    oomb_build_forward_expand(g, out);
    EXPECT_EQ(oomb_graph_n_leafs(g), 2);
    ASSERT_EQ(oomb_graph_n_nodes(g), 4);
    EXPECT_EQ(oomb_graph_node(g, 0), s);
    EXPECT_EQ(oomb_graph_node(g, -1), out);
    oomb_build_forward_expand(g, out);  // idempotent
    EXPECT_EQ(oomb_graph_n_nodes(g), 4);
}

// ---- misuse: the documented error, naming the op and the shapes ----

TEST(CoreErrors, MismatchedShapes) {
    Ctx c(true);
    oomb_tensor * a = oomb_set_name(oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 4, 3), "a");
    oomb_tensor * b = oomb_set_name(oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 3, 3), "b");
    EXPECT_OOMB_ERROR(oomb_add(c.ctx, a, b), "add: b 'b' [3, 3, 1, 1] f32 cannot be broadcast to a 'a' [4, 3, 1, 1] f32");
    EXPECT_OOMB_ERROR(oomb_mul_mat(c.ctx, a, b), "mul_mat: inner dimensions differ");
    EXPECT_OOMB_ERROR(oomb_swiglu(c.ctx, a, b), "swiglu: shapes differ");
    oomb_tensor * q = oomb_new_tensor_4d(c.ctx, OOMB_TYPE_F32, 8, 3, 4, 1);
    oomb_tensor * k = oomb_new_tensor_4d(c.ctx, OOMB_TYPE_F32, 8, 2, 4, 1);
    EXPECT_OOMB_ERROR(oomb_attn(c.ctx, q, k, k, 1.0f), "attn: query heads (3) must be a multiple of kv heads (2)");
}

TEST(CoreErrors, WrongTypes) {
    Ctx c(true);
    oomb_tensor * a = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 4, 3);
    oomb_tensor * i = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_I32, 3);
    oomb_tensor * f = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F32, 3);
    oomb_tensor * h = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_BF16, 4, 3);
    EXPECT_OOMB_ERROR(oomb_get_rows(c.ctx, a, f), "get_rows: ids must be i32");
    EXPECT_OOMB_ERROR(oomb_add(c.ctx, h, h), "add: a must be f32");
    EXPECT_OOMB_ERROR(oomb_cross_entropy_loss(c.ctx, a, f, -1), "cross_entropy_loss: labels must be i32");
    EXPECT_OOMB_ERROR(oomb_cast(c.ctx, i, OOMB_TYPE_F32), "cast: cannot convert");
    EXPECT_OOMB_ERROR(oomb_set_param(i), "set_param");
    EXPECT_OOMB_ERROR(oomb_rope(c.ctx, a, f, 4, 1e4f), "rope: pos must be i32");
}

TEST(CoreErrors, OutOfRangeViews) {
    Ctx c;
    oomb_tensor * a = oomb_new_tensor_2d(c.ctx, OOMB_TYPE_F32, 4, 3);
    EXPECT_OOMB_ERROR(oomb_view_1d(c.ctx, a, 13, 0), "view");
    EXPECT_OOMB_ERROR(oomb_view_2d(c.ctx, a, 4, 3, a->nb[1], 4), "needs 52 bytes, source");
    EXPECT_OOMB_ERROR(oomb_reshape_2d(c.ctx, a, 5, 3), "reshape: cannot reshape");
    EXPECT_OOMB_ERROR(oomb_reshape_1d(c.ctx, oomb_transpose(c.ctx, a), 12), "not contiguous");
    EXPECT_OOMB_ERROR(oomb_permute(c.ctx, a, 0, 0, 1, 2), "not a permutation");
    EXPECT_OOMB_ERROR(oomb_get_f32_nd(a, 4, 0, 0, 0), "out of range");
    EXPECT_OOMB_ERROR(oomb_set_f32_1d(a, -1, 0.0f), "out of range");
    // offsets and strides so large that a 64-bit sum would wrap around
    EXPECT_OOMB_ERROR(oomb_view_1d(c.ctx, a, 1, SIZE_MAX - 2), "view");
    EXPECT_OOMB_ERROR(oomb_view_1d(c.ctx, a, 1, SIZE_MAX - 63), "view");
    EXPECT_OOMB_ERROR(oomb_view_2d(c.ctx, a, 2, 3, SIZE_MAX / 2 + 1, 0), "view");
    EXPECT_OOMB_ERROR(oomb_view_3d(c.ctx, a, 1, 1, 2, 4, SIZE_MAX / 3, 0), "view");
    EXPECT_OOMB_ERROR(oomb_view_4d(c.ctx, a, 1, 1, 1, 3, 4, 4, SIZE_MAX / 2, 0), "view");
}

TEST(CoreErrors, NullArguments) {
    Ctx c(true);
    EXPECT_OOMB_ERROR(oomb_new_tensor_1d(nullptr, OOMB_TYPE_F32, 4), "context is NULL");
    EXPECT_OOMB_ERROR(oomb_new_tensor(c.ctx, OOMB_TYPE_F32, 2, nullptr), "ne is NULL");
    oomb_tensor * a = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F32, 4);
    EXPECT_OOMB_ERROR(oomb_add(c.ctx, a, nullptr), "add: b is NULL");
    EXPECT_OOMB_ERROR(oomb_build_forward_expand(oomb_new_graph(c.ctx), nullptr), "tensor is NULL");
    EXPECT_OOMB_ERROR(oomb_backend_cpu_init(100000), "at most 1024");
}

TEST(CoreErrors, BadTensors) {
    Ctx c(true);
    const int64_t neg[2] = {3, -1};
    EXPECT_OOMB_ERROR(oomb_new_tensor(c.ctx, OOMB_TYPE_F32, 2, neg), "negative size");
    const int64_t huge[4] = {INT64_C(1) << 40, INT64_C(1) << 30, 1, 1};
    EXPECT_OOMB_ERROR(oomb_new_tensor(c.ctx, OOMB_TYPE_F32, 4, huge), "overflows");
    EXPECT_OOMB_ERROR(oomb_new_tensor(c.ctx, OOMB_TYPE_F32, 5, huge), "n_dims");
    EXPECT_OOMB_ERROR(oomb_new_tensor_1d(c.ctx, (oomb_type) OOMB_TYPE_COUNT, 3), "unknown tensor type");
    oomb_context * small = oomb_init({2, true});
    oomb_new_tensor_1d(small, OOMB_TYPE_F32, 1);
    oomb_new_tensor_1d(small, OOMB_TYPE_F32, 1);
    EXPECT_OOMB_ERROR(oomb_new_tensor_1d(small, OOMB_TYPE_F32, 1), "context is full");
    oomb_free(small);
}

TEST(CoreErrors, GraphFull) {
    Ctx c(true);
    oomb_tensor * x = oomb_new_tensor_1d(c.ctx, OOMB_TYPE_F32, 2);
    oomb_tensor * y = x;
    for (int i = 0; i < 5; i++) y = oomb_scale(c.ctx, y, 2.0f);
    oomb_cgraph * g = oomb_new_graph_custom(c.ctx, 3);
    EXPECT_OOMB_ERROR(oomb_build_forward_expand(g, y), "graph is full");
}

TEST(CoreErrors, DefaultHandlerAborts) {
    // Without a handler the library prints the message and aborts.
    EXPECT_DEATH({
        oomb_context * ctx = oomb_init({0, true});
        oomb_tensor * a = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 3);
        oomb_tensor * b = oomb_new_tensor_1d(ctx, OOMB_TYPE_F32, 2);
        oomb_add(ctx, a, b);
    }, "oomb error: add: b '' \\[2, 1, 1, 1\\] f32 cannot be broadcast");
}

} // namespace
