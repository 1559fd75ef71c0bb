// Operand checks shared by the CPU (src/cpu/) and CUDA (cuda/) kernels: one copy per op of the
// shape / type / layout rules that do not depend on the data (see op-checks.h). Data-dependent
// checks (ids, labels) and limits of one backend (int ranges of a launch, sgemm) stay with its kernels.

#include "op-checks.h"
#include "oomb/paged-attn-merge.h"

#include <cinttypes>

namespace oomb {

void check_same_shape(const char * op, const oomb_tensor * a, const oomb_tensor * b) {
    if (!oomb_are_same_shape(a, b)) oomb_error("%s: shapes differ: %s vs %s", op, shape_str(a).c_str(), shape_str(b).c_str());
}

void check_broadcast(const char * op, const oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    bool ok = oomb_are_same_shape(dst, a);
    for (int i = 0; i < 4 && ok; i++) ok = b->ne[i] > 0 ? a->ne[i] % b->ne[i] == 0 : a->ne[i] == 0;
    if (!ok) oomb_error("%s: b %s cannot be broadcast to a %s (result %s)", op, shape_str(b).c_str(), shape_str(a).c_str(), shape_str(dst).c_str());
}

attn_dims check_attn(const char * op, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v) {
    const attn_dims d = attn_dims_of(q, k);
    if (q->type != OOMB_TYPE_F32 || k->type != OOMB_TYPE_F32 || v->type != OOMB_TYPE_F32 || k->ne[0] != d.D ||
        !oomb_are_same_shape(k, v) || d.Hkv <= 0 || d.H % d.Hkv != 0 || k->ne[3] != d.B || d.S < d.T) {
        oomb_error("%s: invalid q %s, k %s, v %s", op, shape_str(q).c_str(), shape_str(k).c_str(), shape_str(v).c_str());
    }
    return d;
}

namespace {

// mul_mat: a [K, M, A2, A3], b [K, N, B2, B3] (float types), B2 % A2 == B3 % A3 == 0, result
// [M, N, B2, B3] contiguous.
void check_mul_mat(const oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t A2 = a->ne[2], A3 = a->ne[3], B2 = b->ne[2], B3 = b->ne[3];
    if (oomb_type_is_quantized(b->type) ||
        (oomb_type_is_quantized(a->type) && (A2 != 1 || A3 != 1 || !quant_mat_layout_ok(a)))) {
        oomb_error("mul_mat: invalid operands a %s, b %s: a block-type a must be a 2-D matrix of row-major blocks or their "
                   "transposed view, b a float type", shape_str(a).c_str(), shape_str(b).c_str());
    }
    if (a->type == OOMB_TYPE_I32 || b->type == OOMB_TYPE_I32 || b->ne[0] != K || A2 <= 0 || A3 <= 0 || B2 % A2 != 0 ||
        B3 % A3 != 0 || dst->ne[0] != M || dst->ne[1] != N || dst->ne[2] != B2 || dst->ne[3] != B3) {
        oomb_error("mul_mat: invalid operands a %s, b %s, result %s", shape_str(a).c_str(), shape_str(b).c_str(), shape_str(dst).c_str());
    }
    if (!oomb_is_contiguous(dst)) oomb_error("mul_mat: result %s must be contiguous", shape_str(dst).c_str());
}

// The optimizer steps update param p in place (dst is p): p f32 or bf16 and contiguous, the others
// (grad) f32, contiguous and shaped like p, hp f32 with n_hp elements.
void check_opt(const char * op, const oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * const * others, int n_others,
               const oomb_tensor * hp, int64_t n_hp) {
    bool ok = (p->type == OOMB_TYPE_F32 || p->type == OOMB_TYPE_BF16) && oomb_is_contiguous(p) && dst->data == p->data &&
              dst->type == p->type && oomb_are_same_shape(dst, p) && hp->type == OOMB_TYPE_F32 && oomb_nelements(hp) == n_hp;
    for (int i = 0; i < n_others && ok; i++) {
        ok = others[i]->type == OOMB_TYPE_F32 && oomb_is_contiguous(others[i]) && oomb_are_same_shape(others[i], p);
    }
    if (!ok) oomb_error("%s: invalid operands: param %s (result %s), hp %s", op, shape_str(p).c_str(), shape_str(dst).c_str(), shape_str(hp).c_str());
}

// adamw_step: param, grad, m, v, hp (8 values, or 9 with bf16 moments: hp[8] is the step number,
// the stochastic-rounding seed); m and v both f32 or both bf16, contiguous, shaped like param.
void check_adamw(const oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * m,
                 const oomb_tensor * v, const oomb_tensor * hp) {
    const oomb_tensor * others[1] = {grad};
    const int64_t n_hp = oomb_nelements(hp);
    if (n_hp != 8 && n_hp != 9) oomb_error("adamw_step: hp %s must have 8 or 9 elements", shape_str(hp).c_str());
    check_opt("adamw_step", dst, p, others, 1, hp, n_hp);
    const bool sbf = m->type == OOMB_TYPE_BF16;
    if (sbf && n_hp != 9) oomb_error("adamw_step: bf16 moments need hp[8] (the step number, the stochastic-rounding seed)");
    if (!((m->type == OOMB_TYPE_F32 || sbf) && v->type == m->type && oomb_is_contiguous(m) && oomb_is_contiguous(v) &&
          oomb_are_same_shape(m, p) && oomb_are_same_shape(v, p)))
        oomb_error("adamw_step: m %s and v %s must be contiguous, both f32 or both bf16, shaped like param %s", shape_str(m).c_str(),
                   shape_str(v).c_str(), shape_str(p).c_str());
}

// rope / rope_back: the result shaped like a; pos i32 with one entry per token (a->ne[2]); n_dims
// even in (0, head_dim]; freq_factors (src[2], optional) f32, contiguous, n_dims/2 elements.
void check_rope(const oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * pos, const oomb_tensor * ff) {
    const char * opn = oomb_op_name(dst->op);
    check_same_shape(opn, dst, a);
    const int n_dims = dst->op_params[0];
    if (pos->type != OOMB_TYPE_I32 || oomb_nelements(pos) != a->ne[2]) {
        oomb_error("%s: pos %s must be i32 with one entry per token of %s", opn, shape_str(pos).c_str(), shape_str(a).c_str());
    }
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > a->ne[0]) oomb_error("%s: n_dims = %d invalid for %s", opn, n_dims, shape_str(a).c_str());
    if (ff && (ff->type != OOMB_TYPE_F32 || !oomb_is_contiguous(ff) || oomb_nelements(ff) != n_dims / 2)) {
        oomb_error("%s: freq_factors %s must be f32, contiguous, with n_dims/2 = %d elements", opn, shape_str(ff).c_str(), n_dims / 2);
    }
}

} // namespace

void check_op_operands(const oomb_tensor * node, const oomb_tensor * const * s) {
    const enum oomb_op op = node->op;
    const char * opn = oomb_op_name(op);
    // block types: only as mul_mat's a and as the source of a dequantizing cast / cpy; never a result
    if (oomb_type_is_quantized(node->type))
        oomb_error("%s: result %s: block types are never computed (only dequantized)", opn, shape_str(node).c_str());
    for (int i = 0; i < OOMB_MAX_SRC; i++) {
        if (!s[i] || !oomb_type_is_quantized(s[i]->type) || !op_reads_src(op, i)) continue;
        if (i == 0 && (op == OOMB_OP_MUL_MAT || op == OOMB_OP_CAST || op == OOMB_OP_CPY)) continue;
        oomb_error("%s: src[%d] %s is of block type %s, which this op does not take (block types: mul_mat's a, cast / cpy to a "
                   "float type)", opn, i, shape_str(s[i]).c_str(), oomb_type_name(s[i]->type));
    }
    switch (op) {
        case OOMB_OP_CONT: check_copy_operands("cont", s[0], node, true); break;
        case OOMB_OP_CPY:  check_copy_operands("cpy", s[0], node, false); break;
        case OOMB_OP_CAST: check_copy_operands("cast", s[0], node, false); break;
        case OOMB_OP_ADD: case OOMB_OP_ADD_INPLACE: case OOMB_OP_SUB: case OOMB_OP_MUL:
            check_broadcast(opn, node, s[0], s[1]);
            break;
        case OOMB_OP_SCALE: case OOMB_OP_SILU: case OOMB_OP_RMS_NORM: case OOMB_OP_SOFT_MAX:
            check_same_shape(opn, node, s[0]);
            break;
        case OOMB_OP_SILU_BACK: case OOMB_OP_RMS_NORM_BACK: case OOMB_OP_SOFT_MAX_BACK:
            check_same_shape(opn, node, s[0]);
            check_same_shape(opn, node, s[1]);
            break;
        case OOMB_OP_SWIGLU: case OOMB_OP_SWIGLU_BACK:  // gate, up both f32 or both bf16; swiglu_back: dy f32, the
                                                        // result [dgate; dup] (its layout: the kernels)
            if (!((s[0]->type == OOMB_TYPE_F32 || s[0]->type == OOMB_TYPE_BF16) && s[1]->type == s[0]->type))
                oomb_error("%s: gate %s and up %s must be both f32 or both bf16", opn, shape_str(s[0]).c_str(), shape_str(s[1]).c_str());
            check_same_shape(opn, s[0], s[1]);
            if (op == OOMB_OP_SWIGLU) {
                check_same_shape(opn, node, s[0]);
            } else {
                if (s[2]->type != OOMB_TYPE_F32) oomb_error("%s: dy %s must be f32", opn, shape_str(s[2]).c_str());
                check_same_shape(opn, s[0], s[2]);
            }
            break;
        case OOMB_OP_MUL_MAT: check_mul_mat(node, s[0], s[1]); break;
        case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK: check_rope(node, s[0], s[1], s[2]); break;
        case OOMB_OP_ATTN:
            check_attn(opn, s[0], s[1], s[2]);
            check_same_shape(opn, node, s[0]);
            break;
        case OOMB_OP_ATTN_BACK:  // q, k, v, dout (the result layout: the kernels)
            check_attn(opn, s[0], s[1], s[2]);
            check_same_shape(opn, s[0], s[3]);
            break;
        case OOMB_OP_ADAMW_STEP: check_adamw(node, s[0], s[1], s[2], s[3], s[4]); break;
        case OOMB_OP_PAGED_ATTN_MERGE: {  // acc (updated in place: the result is its view), part
            const int64_t D = node->op_params[PAM_PARAM_D], H = node->op_params[PAM_PARAM_H], T = node->op_params[PAM_PARAM_T];
            const int64_t n = D * H * T + H * T;
            if (D < 1 || H < 1 || T < 1 || oomb_nelements(s[0]) != n || oomb_nelements(s[1]) != n || !oomb_is_contiguous(s[0]) ||
                !oomb_is_contiguous(s[1]) || node->data != s[0]->data || !oomb_are_same_shape(node, s[0]) || tensors_overlap(s[0], s[1]))
                oomb_error("paged_attn_merge: invalid operands: acc %s (result %s), part %s for D = %" PRId64 ", H = %" PRId64
                           ", T = %" PRId64 " (contiguous f32 of D*H*T + H*T elements each, not overlapping)",
                           shape_str(s[0]).c_str(), shape_str(node).c_str(), shape_str(s[1]).c_str(), D, H, T);
            break;
        }
        case OOMB_OP_RMS_NORM_MUL: case OOMB_OP_RMS_NORM_MUL_BACK: {
            // x, w (ne0 values along dim 0, unit stride), dy shaped like x; the result x's shape, or
            // with dw (op_params[1]) [ne0, nrows + 1] contiguous
            const oomb_tensor * x = s[0], * w = s[1];
            if (w->ne[0] != x->ne[0] || oomb_nelements(w) != w->ne[0] || (w->ne[0] > 1 && w->nb[0] != sizeof(float)))
                oomb_error("%s: w %s must hold x's %lld columns along dim 0 with unit stride, x %s", opn, shape_str(w).c_str(),
                           (long long) x->ne[0], shape_str(x).c_str());
            if (op == OOMB_OP_RMS_NORM_MUL) {
                check_same_shape(opn, node, x);
                break;
            }
            check_same_shape(opn, s[2], x);
            if (node->op_params[1]) {
                if (node->ne[0] != x->ne[0] || node->ne[1] != oomb_nrows(x) + 1 || node->ne[2] != 1 || node->ne[3] != 1 ||
                    !oomb_is_contiguous(node))
                    oomb_error("%s: packed result %s must be contiguous [%lld, %lld] for x %s", opn, shape_str(node).c_str(),
                               (long long) x->ne[0], (long long) oomb_nrows(x) + 1, shape_str(x).c_str());
            } else {
                check_same_shape(opn, node, x);
            }
            break;
        }
        case OOMB_OP_SGD_STEP: {
            const oomb_tensor * others[1] = {s[1]};
            check_opt("sgd_step", node, s[0], others, 1, s[2], 3);
            break;
        }
        default:
            break;
    }
}

} // namespace oomb
