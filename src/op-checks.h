// Operand checks and source preparation shared by the CPU (src/cpu/ops-cpu.cpp) and CUDA
// (cuda/backend-cuda.cu) dispatchers: one truth for which sources a kernel gets as they are and
// which it gets as a contiguous scratch copy, and for each op's operand checks (check_op_operands,
// op-checks.cpp), so the kernels of both backends start from operands already checked. The
// backends differ only in where the copy lives and how it is made (the CopyFn).
#pragma once

#include "oomb-impl.h"

namespace oomb {

// a and b have the same shape, else "<op>: shapes differ: <a> vs <b>".
void check_same_shape(const char * op, const oomb_tensor * a, const oomb_tensor * b);
// dst has a's shape and b broadcasts to a (every a->ne[i] a multiple of b->ne[i]).
void check_broadcast(const char * op, const oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);

// Dimensions of the reference attention: q [D, H, T, B], k and v [D, Hkv, S, B], G = H / Hkv.
struct attn_dims {
    int64_t D, H, T, B, Hkv, S, G;
};
// The dimensions of q, k (no checks: check_attn has made them valid).
static inline attn_dims attn_dims_of(const oomb_tensor * q, const oomb_tensor * k) {
    attn_dims d{q->ne[0], q->ne[1], q->ne[2], q->ne[3], k->ne[1], k->ne[2], 0};
    d.G = d.Hkv > 0 ? d.H / d.Hkv : 0;
    return d;
}
// q, k, v f32; k, v of one shape [D, Hkv, S, B] with H % Hkv == 0 and S >= T, else
// "<op>: invalid q ..., k ..., v ...".
attn_dims check_attn(const char * op, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v);

// The operand checks of node's op that do not depend on the data (shapes, types, layouts),
// on the prepared sources s[]: copies, element-wise ops, rms_norm, rope, soft_max, mul_mat, attn and
// the optimizer steps. Errors name the op and the tensors. Called by prepare_sources.
void check_op_operands(const oomb_tensor * node, const oomb_tensor * const * s);

// Source t of node dst needs a contiguous copy before the kernel reads it: its rows are not
// unit-stride and the kernel needs unit rows, or it overlaps dst with another layout (in-place
// execution with the same layout is always safe, see common.cuh / ops-cpu.cpp).
static inline bool src_needs_copy(const oomb_tensor * t, const oomb_tensor * dst, bool need_unit_rows) {
    if (oomb_type_is_quantized(t->type)) return false;  // read as blocks by the kernels that take them (check_op_operands)
    if (need_unit_rows && t->ne[0] > 1 && t->nb[0] != oomb_type_size(t->type)) return true;
    return dst && t != dst && tensors_overlap(t, dst) && !tensors_same_layout(t, dst);
}

// t's shape and type with contiguous strides, no view source and no data yet.
static inline oomb_tensor contiguous_like(const oomb_tensor * t) {
    oomb_tensor r = *t;
    set_contiguous_nb(&r);
    r.view_src = nullptr;
    r.data = nullptr;
    return r;
}

// Checks node's result layout, prepares its sources into s[] (s[i] = node->src[i] for sources the
// op does not prepare, else &srcs[i]: the source itself or, where src_needs_copy, a contiguous
// copy made by copy(t, slot = i, &srcs[i]), which sets srcs[i].data and copies t's elements into
// it) and checks the sources every kernel of the op takes. Errors name the op and the tensors.
template <typename CopyFn>
void prepare_sources(const oomb_tensor * node, oomb_tensor * srcs, const oomb_tensor ** s, CopyFn && copy) {
    const enum oomb_op op = node->op;
    check_op_result(node);
    for (int i = 0; i < OOMB_MAX_SRC; i++) {
        const oomb_tensor * t = node->src[i];
        s[i] = t;
        if (!t || !op_prepares_src(op, i, t)) continue;
        if (src_needs_copy(t, node, op_needs_unit_rows(op, i))) {
            srcs[i] = contiguous_like(t);
            copy(t, i, &srcs[i]);
        } else {
            srcs[i] = *t;
        }
        s[i] = &srcs[i];
    }
    check_op_sources(node, s);  // presence and f32-ness per op (oomb-impl.h)
    check_op_operands(node, s); // shapes, types, layouts per op (op-checks.cpp)
}

} // namespace oomb
