// Automatic differentiation: oomb_build_backward_expand appends the backward pass of a loss to a graph.
//
// Reverse-mode AD over the graph's nodes in reverse execution order. Gradients are f32 tensors in the
// logical shape of the tensor they belong to (also for f16/bf16 tensors), with one exception: the
// gradients of a bf16 swiglu's gate and up (oomb_swiglu_ext) are bf16 views of oomb_swiglu_back_ext's
// result, handed as they are only to the backward of a mul_mat producing them (which reads them as
// bf16 operands) and converted to f32 anywhere else or when summed (as_f32, get_grad). Only tensors that depend on
// a PARAM leaf through a differentiable input get gradients; the rest of the graph (ids, labels,
// positions, constants) costs nothing. For every parameter reached, an in-place accumulation
// param->grad += d(loss)/d(param) is appended, so gradients accumulate across evaluations.
//
// linear_cross_entropy: its node is { sum, count, lse[N] } and the caller's loss a view of the first
// two elements; the backward op reads the lse tail (no recompute) and gets one packed [dx ; dw]
// result holding only the gradients needed (a frozen LM head gets no dw product or buffer). The
// lse tail itself carries no gradient.
//
// paged_attn (chunk-recurrent training over a paged KV cache): its backward accumulates dK/dV into the
// gradient pages found in k_pages->grad / v_pages->grad and reads dk_cur / dv_cur back from them.
// The op's node is packed (out [D, H, T], then the per-row log-sum-exp; oomb.h) and callers get a
// view of its out part. The gradient of that view (contiguous, offset 0, all of out: the usual case)
// is kept aside as the node's dout [D, H, T], without the zero tensor of the generic view path;
// other views inside the out part go through the generic scatter. The backward op gets the packed
// node, so it reads the saved out and LSE instead of recomputing them. Gradients cannot flow into
// the saved LSE (nor into the packed node other than through views of out): an error.
//
// Gradients of views (VIEW with any offset / strides) are scattered into a zero tensor: an
// add_inplace into a view of a FILL(0) tensor. Those add_inplace nodes are appended to the graph at
// once, so they run before every later consumer of the zero tensor (which are appended afterwards).

#include "oomb-impl.h"

#include <cinttypes>
#include <cstdio>
#include <initializer_list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

using oomb::shape_str;

namespace {

// How mul_mat broadcasts a over the batch dims of b: true when b's batch i2 uses a's batch
// i2 / (B2/A2) (ggml convention; groups of consecutive b batches share one a batch), false when it
// uses i2 % A2 (tiling, as oomb_repeat does).
constexpr bool k_mul_mat_bcast_div = true;

const char * tname(const oomb_tensor * t) { return t->name[0] ? t->name : oomb_op_name(t->op); }

// Source slots through which gradients flow (mask of bits over src[]); -1: not differentiable.
int diff_srcs(const oomb_tensor * t) {
    switch (t->op) {
        case OOMB_OP_NONE: return 0;
        case OOMB_OP_FILL: return 0;
        case OOMB_OP_VIEW: case OOMB_OP_RESHAPE: case OOMB_OP_PERMUTE: case OOMB_OP_TRANSPOSE:
        case OOMB_OP_CONT: case OOMB_OP_CPY: case OOMB_OP_CAST:
        case OOMB_OP_SCALE: case OOMB_OP_REPEAT: case OOMB_OP_REPEAT_BACK: case OOMB_OP_SILU:
        case OOMB_OP_SUM_SQ: {  // every source (oomb_sum_sq_n)
            int m = 0;
            for (int i = 0; i < OOMB_MAX_SRC; i++)
                if (t->src[i]) m |= 1 << i;
            return m;
        }
        case OOMB_OP_SUM: case OOMB_OP_MEAN:
        case OOMB_OP_GET_ROWS: case OOMB_OP_RMS_NORM: case OOMB_OP_ROPE: case OOMB_OP_SOFT_MAX:
        case OOMB_OP_CROSS_ENTROPY:
            return 1;
        case OOMB_OP_ADD: case OOMB_OP_SUB: case OOMB_OP_MUL: case OOMB_OP_ADD_INPLACE:
        case OOMB_OP_SWIGLU: case OOMB_OP_MUL_MAT: case OOMB_OP_RMS_NORM_MUL:
        case OOMB_OP_LINEAR_CROSS_ENTROPY: // w, x (labels get none)
            return 3;
        case OOMB_OP_ATTN:
        case OOMB_OP_PAGED_ATTN: // q, k_cur, v_cur (the pools, page table and positions get none)
            return 7;
        case OOMB_OP_PAGE_SUMMARY: case OOMB_OP_PAGE_SELECT: // sparse selection: integer / summary data, no gradients
            return 0;
        default:
            return -1; // *_BACK ops, optimizer steps, paged_attn_merge (refused with its own message), custom ops
    }
}

struct Acc {
    oomb_tensor * g = nullptr;   // sum of the dense contributions (logical shape)
    oomb_tensor * z = nullptr;   // scatter buffer for view contributions (owned exclusively)
    bool z_root = false;         // z spans the memory of t's view_src (t is a view) instead of t's shape
    oomb_tensor * pa_out = nullptr; // paged_attn nodes: sum of the gradients of the out view [D, H, T]
};

// paged_attn's packed node: bytes of its out part (D*H*T f32; the LSE of each row follows).
size_t paged_out_bytes(const oomb_tensor * t) {
    const oomb_tensor * q = oomb_paged_attn_args_of(t).q;
    return sizeof(float) * (size_t) (q->ne[0] * q->ne[1] * q->ne[2]);
}

// The view v of paged_attn's packed node lies inside the out part.
bool paged_view_in_out(const oomb_tensor * v) {
    if (oomb_nelements(v) == 0) return true;
    size_t last = v->view_offs;
    for (int i = 0; i < 4; i++) last += (size_t) (v->ne[i] - 1) * v->nb[i];
    return last + sizeof(float) <= paged_out_bytes(v->view_src);
}

// The view v of a linear_cross_entropy node lies inside its { sum, count } head (the per-row LSE
// tail carries no gradient).
bool lce_view_in_head(const oomb_tensor * v) {
    if (oomb_nelements(v) == 0) return true;
    size_t last = v->view_offs;
    for (int i = 0; i < 4; i++) last += (size_t) (v->ne[i] - 1) * v->nb[i];
    return last + sizeof(float) <= 2 * sizeof(float);
}

// The view v is all of paged_attn's out, contiguous, at offset 0 (what oomb_paged_attn returns).
bool paged_view_is_out(const oomb_tensor * v) {
    return v->view_offs == 0 && oomb_is_contiguous(v) && sizeof(float) * (size_t) oomb_nelements(v) == paged_out_bytes(v->view_src);
}

struct Builder {
    oomb_context * ctx;
    oomb_cgraph * g;
    std::unordered_set<const oomb_tensor *> needs;
    std::unordered_map<oomb_tensor *, Acc> acc;

    bool need(const oomb_tensor * t) const { return t && needs.count(t); }

    oomb_tensor * named(oomb_tensor * x, const oomb_tensor * of) {
        oomb_format_name(x, "grad of %.52s", tname(of));
        return x;
    }

    oomb_tensor * contig(oomb_tensor * x) { return oomb_is_contiguous(x) ? x : oomb_cont(ctx, x); }

    // x as f32 (a bf16 gradient converted; f32 as it is)
    oomb_tensor * as_f32(oomb_tensor * x) {
        if (x->type == OOMB_TYPE_F32) return x;
        oomb_tensor * r = oomb_cast(ctx, x, OOMB_TYPE_F32);
        oomb_format_name(r, "%.50s (f32)", x->name);
        return r;
    }

    // x (same element count as ref) in ref's shape.
    oomb_tensor * as_shape(oomb_tensor * x, const oomb_tensor * ref) {
        if (oomb_are_same_shape(x, ref)) return x;
        return oomb_reshape_4d(ctx, contig(x), ref->ne[0], ref->ne[1], ref->ne[2], ref->ne[3]);
    }

    // A view of the f32 tensor base with arbitrary element strides (bytes) and offset (bytes).
    oomb_tensor * strided_view(oomb_tensor * base, const int64_t ne[4], const size_t nb[4], size_t offs) {
        if (nb[0] == sizeof(float)) {
            return oomb_view_4d(ctx, base, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], offs);
        }
        // strides with nb[0] != 4 (permuted layouts): check the bounds here, then set the strides
        size_t last = offs;
        for (int i = 0; i < 4; i++) last += (size_t) (ne[i] - 1) * nb[i];
        if (last + sizeof(float) > oomb_nbytes(base)) {
            oomb_error("build_backward_expand: internal error: strided view out of range of %s", shape_str(base).c_str());
        }
        oomb_tensor * v = oomb_view_1d(ctx, base, 1, offs);
        for (int i = 0; i < 4; i++) { v->ne[i] = ne[i]; v->nb[i] = nb[i]; }
        return v;
    }

    void add_grad(oomb_tensor * t, oomb_tensor * c) {
        if (!need(t)) return;
        if (t->op == OOMB_OP_PAGED_ATTN) { // the dry run reports this first
            oomb_error("build_backward_expand: internal error: dense gradient for paged_attn's packed node %s", shape_str(t).c_str());
        }
        if ((c->type != OOMB_TYPE_F32 && c->type != OOMB_TYPE_BF16) || !oomb_are_same_shape(c, t)) {
            oomb_error("build_backward_expand: internal error: gradient %s does not match %s (op %s)", shape_str(c).c_str(),
                       shape_str(t).c_str(), oomb_op_name(t->op));
        }
        if (!c->name[0]) named(c, t);
        Acc & a = acc[t];
        if (a.g && (a.g->type != OOMB_TYPE_F32 || c->type != OOMB_TYPE_F32)) {
            // bf16 gradients (swiglu_back_ext's, for matrix products) are summed in f32
            a.g = named(oomb_add(ctx, as_f32(a.g), as_f32(c)), t);
        } else if (!a.g) {
            a.g = c;
        } else if (a.g->view_src && !c->view_src) {
            // the sum in place on the operand that owns its memory (the allocator runs an add in
            // place on src[0] only when src[0] is not a view): e.g. a packed backward's view
            // (linear_cross_entropy's dw) plus get_rows_back's table gradient for a tied embedding
            a.g = named(oomb_add(ctx, c, a.g), t);
        } else {
            a.g = named(oomb_add(ctx, a.g, c), t);
        }
    }

    // Adds dy (the gradient of the view v) into the gradient of v->src[0] at v's place in memory.
    void add_grad_view(oomb_tensor * v, oomb_tensor * dy) {
        oomb_tensor * src = v->src[0];
        if (!need(src)) return;
        if (src->op == OOMB_OP_PAGED_ATTN && paged_view_is_out(v)) {
            // the out view: its gradient is the backward's dout, kept in out's shape
            const oomb_tensor * q = oomb_paged_attn_args_of(src).q;
            oomb_tensor * d = contig(dy);
            if (d->ne[0] != q->ne[0] || d->ne[1] != q->ne[1] || d->ne[2] != q->ne[2] || d->ne[3] != 1) {
                d = oomb_reshape_4d(ctx, contig(d), q->ne[0], q->ne[1], q->ne[2], 1);
            }
            Acc & a = acc[src];
            if (a.pa_out) {
                a.pa_out = oomb_format_name(oomb_add(ctx, a.pa_out, d), "grad of %.44s (out)", tname(src));
            } else {
                a.pa_out = d;
            }
            return;
        }
        oomb_tensor * root = src->view_src ? src->view_src : src;
        // a contiguous view of all of a contiguous source at its start: element i is element i
        if (oomb_nelements(v) == oomb_nelements(src) && oomb_is_contiguous(v) && oomb_is_contiguous(src) &&
            v->view_offs == (src->view_src ? src->view_offs : 0)) {
            add_grad(src, as_shape(dy, src));
            return;
        }
        if (v->view_src != root) {
            oomb_error("build_backward_expand: internal error: view %s does not alias the memory of %s", shape_str(v).c_str(),
                       shape_str(src).c_str());
        }
        const size_t es = oomb_type_size(root->type);
        auto scaled = [&](size_t bytes) -> size_t {
            if (bytes % es != 0) {
                oomb_error("build_backward_expand: view %s: offset or stride %zu is not a multiple of the element size %zu",
                           shape_str(v).c_str(), bytes, es);
            }
            return bytes / es * sizeof(float);
        };
        Acc & a = acc[src];
        if (!a.z) {
            if (src->view_src) {
                a.z = oomb_fill(ctx, oomb_nelements(root), 1, 1, 1, 0.0f);
                a.z_root = true;
            } else {
                a.z = oomb_fill(ctx, src->ne[0], src->ne[1], src->ne[2], src->ne[3], 0.0f);
                a.z_root = false;
            }
            oomb_format_name(a.z, "grad of %.52s", tname(src));
        }
        size_t nb[4];
        for (int i = 0; i < 4; i++) nb[i] = scaled(v->nb[i]);
        oomb_tensor * dst = strided_view(a.z, v->ne, nb, scaled(v->view_offs));
        oomb_tensor * upd = oomb_add_inplace(ctx, dst, dy);
        oomb_format_name(upd, "grad of %.40s (scatter)", tname(src));
        // run it now: every consumer of a.z is appended to the graph later
        oomb_build_forward_expand(g, upd);
    }

    oomb_tensor * get_grad(oomb_tensor * t) {
        auto it = acc.find(t);
        if (it == acc.end()) return nullptr;
        Acc & a = it->second;
        if (t->op == OOMB_OP_PAGED_ATTN) {
            // dout [D, H, T]: the out view's gradient plus the out part of the scatter buffer (views
            // of the packed node lie inside out: checked by the dry run)
            oomb_tensor * d = a.pa_out;
            if (a.z) {
                const oomb_tensor * q = oomb_paged_attn_args_of(t).q;
                oomb_tensor * zo = oomb_view_3d(ctx, a.z, q->ne[0], q->ne[1], q->ne[2], sizeof(float) * q->ne[0],
                                                sizeof(float) * q->ne[0] * q->ne[1], 0);
                d = d ? named(oomb_add(ctx, d, zo), t) : zo;
            }
            return d;
        }
        oomb_tensor * zg = nullptr;
        if (a.z) {
            if (!a.z_root) {
                zg = a.z;
            } else {
                const size_t es = oomb_type_size(t->type);
                size_t nb[4];
                for (int i = 0; i < 4; i++) nb[i] = t->nb[i] / es * sizeof(float);
                zg = named(oomb_cont(ctx, strided_view(a.z, t->ne, nb, t->view_offs / es * sizeof(float))), t);
            }
        }
        if (a.g && zg) return named(oomb_add(ctx, as_f32(a.g), zg), t);
        // a bf16 gradient goes as it is only to a matrix product (its backward reads it as a bf16 operand)
        if (a.g && a.g->type != OOMB_TYPE_F32 && t->op != OOMB_OP_MUL_MAT) return as_f32(a.g);
        return a.g ? a.g : zg;
    }

    // Hands out the gradients of an attention backward op (packed = dq, dk, dv back to back, each
    // contiguous in its source's shape) to the sources q, k, v of node t.
    void add_packed_grads(const oomb_tensor * t, oomb_tensor * packed, std::initializer_list<oomb_tensor *> qkv) {
        oomb_format_name(packed, "grad of %.44s (q, k, v)", tname(t));
        size_t off = 0;
        for (oomb_tensor * s : qkv) {
            if (need(s)) {
                const size_t nb1 = sizeof(float) * s->ne[0], nb2 = nb1 * s->ne[1], nb3 = nb2 * s->ne[2];
                oomb_tensor * ds = oomb_view_4d(ctx, packed, s->ne[0], s->ne[1], s->ne[2], s->ne[3], nb1, nb2, nb3, off);
                add_grad(s, named(ds, s));
            }
            off += sizeof(float) * (size_t) oomb_nelements(s);
        }
    }

    // Sums a mul_mat gradient [K, M, B2, B3] down to a's batch dims [.., A2, A3].
    oomb_tensor * reduce_batches(oomb_tensor * d, const oomb_tensor * a) {
        if (d->ne[2] == a->ne[2] && d->ne[3] == a->ne[3]) return d;
        if (!k_mul_mat_bcast_div) return oomb_repeat_back(ctx, d, const_cast<oomb_tensor *>(a));
        const int64_t K = d->ne[0], M = d->ne[1], A2 = a->ne[2], A3 = a->ne[3];
        const int64_t B2 = d->ne[2], B3 = d->ne[3];
        if (B3 != A3) {
            const int64_t r3 = B3 / A3;
            oomb_tensor * x = oomb_reshape_3d(ctx, contig(d), K * M * B2, r3, A3);
            oomb_tensor * shp = oomb_view_3d(ctx, x, K * M * B2, 1, A3, x->nb[1], x->nb[1], 0);
            d = oomb_reshape_4d(ctx, oomb_repeat_back(ctx, x, shp), K, M, B2, A3);
        }
        if (B2 != A2) {
            const int64_t r2 = B2 / A2;
            oomb_tensor * x = oomb_reshape_4d(ctx, contig(d), K * M, r2, A2, A3);
            oomb_tensor * shp = oomb_view_4d(ctx, x, K * M, 1, A2, A3, x->nb[1], x->nb[1], x->nb[1] * A2, 0);
            d = oomb_reshape_4d(ctx, oomb_repeat_back(ctx, x, shp), K, M, A2, A3);
        }
        return d;
    }

    // Appends the gradient contributions of node t (whose gradient is dy) to its sources.
    void backward(oomb_tensor * t, oomb_tensor * dy) {
        oomb_tensor * a = t->src[0];
        oomb_tensor * b = t->src[1];
        switch (t->op) {
            case OOMB_OP_VIEW:
                add_grad_view(t, dy);
                break;
            case OOMB_OP_RESHAPE:
            case OOMB_OP_CONT:
            case OOMB_OP_CPY:   // src[1] is overwritten: no gradient
            case OOMB_OP_CAST:  // gradients are f32 whatever the types
                if (need(a)) add_grad(a, as_shape(dy, a));
                break;
            case OOMB_OP_PERMUTE:
            case OOMB_OP_TRANSPOSE: {
                if (!need(a)) break;
                int inv[4];
                for (int i = 0; i < 4; i++) inv[t->op_params[i]] = i;
                add_grad(a, oomb_cont(ctx, oomb_permute(ctx, dy, inv[0], inv[1], inv[2], inv[3])));
                break;
            }
            case OOMB_OP_ADD:
            case OOMB_OP_ADD_INPLACE:
            case OOMB_OP_SUB: {
                if (need(a)) add_grad(a, dy);
                if (need(b)) {
                    oomb_tensor * db = oomb_are_same_shape(a, b) ? dy : oomb_repeat_back(ctx, dy, b);
                    if (t->op == OOMB_OP_SUB) db = oomb_scale(ctx, db, -1.0f);
                    add_grad(b, db);
                }
                break;
            }
            case OOMB_OP_MUL:
                if (need(a)) add_grad(a, oomb_mul(ctx, dy, b));
                if (need(b)) {
                    oomb_tensor * p = oomb_mul(ctx, dy, a);
                    add_grad(b, oomb_are_same_shape(a, b) ? p : oomb_repeat_back(ctx, p, b));
                }
                break;
            case OOMB_OP_SCALE:
                if (need(a)) add_grad(a, oomb_scale(ctx, dy, oomb::get_op_f32(t, 0)));
                break;
            case OOMB_OP_REPEAT:
                if (need(a)) add_grad(a, oomb_repeat_back(ctx, dy, a));
                break;
            case OOMB_OP_REPEAT_BACK:
                if (need(a)) add_grad(a, oomb_repeat(ctx, dy, a));
                break;
            case OOMB_OP_SILU:
                if (need(a)) add_grad(a, oomb_silu_back(ctx, a, dy));
                break;
            case OOMB_OP_SWIGLU: {
                // y = silu(gate) * up. Only one side needed (a frozen gate or up): its gradient alone
                if (!(need(a) && need(b))) {  // (bf16 gate / up, oomb_mul_mat_ext results: read as f32)
                    if (need(b)) add_grad(b, oomb_mul(ctx, dy, oomb_silu(ctx, as_f32(a))));
                    if (need(a)) add_grad(a, oomb_silu_back(ctx, as_f32(a), oomb_mul(ctx, dy, as_f32(b))));
                    break;
                }
                // both gradients in one pass (oomb_swiglu_back: [dgate; dup]); stored in bf16 when the
                // result is (oomb_swiglu_ext: it feeds matrix products, as gate and up come from them)
                const oomb_type gt = t->type == OOMB_TYPE_BF16 ? OOMB_TYPE_BF16 : OOMB_TYPE_F32;
                oomb_tensor * packed = oomb_swiglu_back_ext(ctx, a, b, dy, gt);
                oomb_format_name(packed, "grad of %.44s (gate, up)", tname(t));
                const size_t es = oomb_type_size(gt);
                const size_t nb1 = es * a->ne[0], nb2 = nb1 * a->ne[1], nb3 = nb2 * a->ne[2];
                add_grad(a, named(oomb_view_4d(ctx, packed, a->ne[0], a->ne[1], a->ne[2], a->ne[3], nb1, nb2, nb3, 0), a));
                add_grad(b, named(oomb_view_4d(ctx, packed, b->ne[0], b->ne[1], b->ne[2], b->ne[3], nb1, nb2, nb3,
                                               es * (size_t) oomb_nelements(a)), b));
                break;
            }
            case OOMB_OP_SUM:
                if (need(a)) add_grad(a, oomb_repeat(ctx, dy, a));
                break;
            case OOMB_OP_MEAN:
                if (need(a)) add_grad(a, oomb_repeat(ctx, oomb_scale(ctx, dy, 1.0f / (float) oomb_nelements(a)), a));
                break;
            case OOMB_OP_SUM_SQ: {  // d/da_k sum_k sum(a_k^2) = 2 a_k dy, for each source (oomb_sum_sq_n)
                oomb_tensor * dy2 = nullptr;
                for (int i = 0; i < OOMB_MAX_SRC; i++) {
                    oomb_tensor * s = t->src[i];
                    if (!s || !need(s)) continue;
                    if (!dy2) dy2 = oomb_scale(ctx, dy, 2.0f);
                    add_grad(s, oomb_mul(ctx, s, dy2));
                }
                break;
            }
            case OOMB_OP_GET_ROWS:
                if (need(a)) add_grad(a, oomb_get_rows_back(ctx, dy, b, a->ne[1]));
                break;
            case OOMB_OP_MUL_MAT: {
                // res[n][m] = sum_k a[m][k] b[n][k]  =>  da[m][k] = sum_n dy[n][m] b[n][k],  db[n][k] = sum_m dy[n][m] a[m][k]
                if (need(a)) {
                    oomb_tensor * bt = oomb_transpose(ctx, b);
                    const size_t es = oomb_type_size(b->type);
                    if (bt->nb[0] != es && bt->nb[1] != es) bt = oomb_transpose(ctx, oomb_cont(ctx, b));
                    oomb_tensor * da = oomb_mul_mat(ctx, bt, oomb_transpose(ctx, dy)); // [K, M, B2, B3]
                    add_grad(a, reduce_batches(da, a));
                }
                if (need(b)) {
                    add_grad(b, oomb_mul_mat(ctx, oomb_transpose(ctx, a), dy)); // [K, N, B2, B3]
                }
                break;
            }
            case OOMB_OP_RMS_NORM:
                if (need(a)) add_grad(a, oomb_rms_norm_back(ctx, a, dy, oomb::get_op_f32(t, 0)));
                break;
            case OOMB_OP_RMS_NORM_MUL: {
                // one node: dx alone when w is frozen, else dx and dw packed ([dx rows; dw]). (A frozen x
                // with a trainable w still computes dx: no model here has that.)
                if (!need(a) && !need(b)) break;
                oomb_tensor * r = oomb_rms_norm_mul_back(ctx, a, b, dy, oomb::get_op_f32(t, 0), need(b));
                if (!need(b)) {
                    add_grad(a, r);
                    break;
                }
                oomb_format_name(r, "grad of %.44s (x, w)", tname(t));
                const size_t es = sizeof(float);
                auto view = [&](const oomb_tensor * s, size_t offs) {
                    const size_t nb1 = es * s->ne[0], nb2 = nb1 * s->ne[1], nb3 = nb2 * s->ne[2];
                    return oomb_view_4d(ctx, r, s->ne[0], s->ne[1], s->ne[2], s->ne[3], nb1, nb2, nb3, offs);
                };
                if (need(a)) add_grad(a, named(view(a, 0), a));
                add_grad(b, named(view(b, es * (size_t) oomb_nelements(a)), b));
                break;
            }
            case OOMB_OP_ROPE:
                if (need(a)) add_grad(a, oomb_rope_back_ext(ctx, dy, b, t->op_params[0], oomb::get_op_f32(t, 1), t->src[2]));  // factors: no grad
                break;
            case OOMB_OP_SOFT_MAX:
                if (need(a)) add_grad(a, oomb_soft_max_back(ctx, t, dy, oomb::get_op_f32(t, 0)));
                break;
            case OOMB_OP_ATTN: {
                oomb_tensor * q = t->src[0], * k = t->src[1], * v = t->src[2];
                add_packed_grads(t, oomb_attn_back(ctx, q, k, v, dy, oomb::get_op_f32(t, 0)), {q, k, v});
                break;
            }
            case OOMB_OP_PAGED_ATTN: {
                // dK/dV of every attended position accumulate into the gradient pages (k_pages->grad,
                // v_pages->grad); dk_cur / dv_cur are read back from them at pos. dy is the gradient of
                // the out part [D, H, T] (get_grad); t itself holds the saved out and LSE.
                // the same schedule (a page-list forward carries its inverse lists: checked in the dry run)
                oomb_paged_attn_args a = oomb_paged_attn_args_of(t);
                if (a.accumulate) oomb_error("backward: paged_attn node %s accumulates into an earlier result (accumulate = 1): not differentiable", tname(t));
                a.dk_pages = a.k_pages->grad; a.dv_pages = a.v_pages->grad;
                a.dout = dy; a.fwd = t;
                oomb_tensor * packed = oomb_paged_attn_back_ext(ctx, &a);
                add_packed_grads(t, packed, {a.q, a.k_cur, a.v_cur});
                break;
            }
            case OOMB_OP_CROSS_ENTROPY:
                if (need(a)) add_grad(a, oomb_cross_entropy_loss_back(ctx, a, b, dy, t->op_params[0]));
                break;
            case OOMB_OP_LINEAR_CROSS_ENTROPY: {
                // t = { sum, count, lse[N] }: only d(sum) (dy[0]) matters; the backward reads the
                // forward's per-row log-sum-exp from t's tail and computes only the gradients needed
                oomb_tensor * w = a, * x = b;
                const int grads = (need(x) ? OOMB_LCE_GRAD_X : 0) | (need(w) ? OOMB_LCE_GRAD_W : 0);
                if (!grads) break;
                const int64_t N = oomb_nrows(x), E = x->ne[0], V = w->ne[1];
                oomb_tensor * dl = oomb_view_1d(ctx, contig(dy), 2, 0);
                oomb_tensor * lse = oomb_view_1d(ctx, t, N, 2 * sizeof(float));
                oomb_tensor * packed = oomb_linear_cross_entropy_back(ctx, w, x, t->src[2], dl, lse, t->op_params[0], grads);
                packed->op_params[1] = t->op_params[1]; // the forward's vocabulary tile
                oomb_format_name(packed, "grad of %.44s (x, w)", tname(t));
                size_t off = 0;
                if (grads & OOMB_LCE_GRAD_X) {
                    const size_t nb1 = sizeof(float) * E, nb2 = nb1 * x->ne[1], nb3 = nb2 * x->ne[2];
                    add_grad(x, named(oomb_view_4d(ctx, packed, E, x->ne[1], x->ne[2], x->ne[3], nb1, nb2, nb3, 0), x));
                    off += sizeof(float) * (size_t) (E * N);
                }
                if (grads & OOMB_LCE_GRAD_W) {
                    add_grad(w, named(oomb_view_2d(ctx, packed, E, V, sizeof(float) * E, off), w));
                }
                break;
            }
            case OOMB_OP_NONE:
            case OOMB_OP_FILL:
                break;
            default:
                oomb_error("build_backward_expand: op %s (%s) is not differentiable, but a parameter gradient flows through it",
                           oomb_op_name(t->op), shape_str(t).c_str());
        }
    }
};

} // namespace

void oomb_build_backward_expand(struct oomb_context * ctx, struct oomb_cgraph * g, struct oomb_tensor * loss, struct oomb_tensor * seed) {
    if (!ctx || !g || !loss) oomb_error("build_backward_expand: ctx, graph and loss must not be NULL");
    if (!g->visited.count(loss)) {
        oomb_error("build_backward_expand: loss %s is not a node of the graph (call oomb_build_forward_expand first)",
                   shape_str(loss).c_str());
    }
    if (loss->type != OOMB_TYPE_F32) oomb_error("build_backward_expand: loss %s must be f32", shape_str(loss).c_str());
    if (seed && (seed->type != OOMB_TYPE_F32 || !oomb_are_same_shape(seed, loss))) {
        oomb_error("build_backward_expand: seed %s must be f32 of the loss's shape %s", shape_str(seed).c_str(),
                   shape_str(loss).c_str());
    }

    Builder B{ctx, g, {}, {}};

    // 1. tensors that depend on a parameter (through differentiable inputs)
    for (oomb_tensor * l : g->leafs) {
        if (l->flags & OOMB_TENSOR_FLAG_PARAM) B.needs.insert(l);
    }
    const std::vector<oomb_tensor *> nodes = g->nodes; // the forward part (the backward appends to g->nodes)
    for (oomb_tensor * t : nodes) {
        if (t->flags & OOMB_TENSOR_FLAG_PARAM) { B.needs.insert(t); continue; }
        const int m = diff_srcs(t);
        for (int i = 0; i < OOMB_MAX_SRC; i++) {
            if (t->src[i] && (m < 0 || (m >> i) & 1) && B.needs.count(t->src[i])) { B.needs.insert(t); break; }
        }
    }
    if (!B.needs.count(loss)) return; // the loss does not depend on any parameter

    // 2. dry run: which tensors receive a gradient; report every error before changing the graph
    std::unordered_set<const oomb_tensor *> reach{loss};
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
        oomb_tensor * t = *it;
        if (!reach.count(t) || !B.needs.count(t)) continue;
        const int m = diff_srcs(t);
        if (t->op == OOMB_OP_PAGED_ATTN_MERGE) {
            oomb_error("build_backward_expand: paged_attn_merge %s is not differentiable (it merges partial attention results "
                       "in place, for inference / streaming over page blocks), but the loss depends on a parameter through it; "
                       "train with one paged_attn over the whole history instead",
                       shape_str(t).c_str());
        }
        if (m < 0) {
            oomb_error("build_backward_expand: op %s (%s) is not differentiable, but the loss depends on a parameter through it",
                       oomb_op_name(t->op), shape_str(t).c_str());
        }
        if (t->op == OOMB_OP_PAGED_ATTN) {
            const oomb_paged_attn_args pa = oomb_paged_attn_args_of(t);
            if (oomb_schedule_has_lists(pa.schedule.kind) && (!pa.schedule.inv_offsets || !pa.schedule.inv_qtiles))
                oomb_error("build_backward_expand: paged_attn %s has a page-list schedule without its inverse lists "
                           "(inv_offsets / inv_qtiles, oomb_schedule_invert): its backward needs them",
                           shape_str(t).c_str());
            for (const oomb_tensor * pool : {pa.k_pages, pa.v_pages}) {
                const oomb_tensor * gp = pool->grad;
                if (!gp || (gp->type != OOMB_TYPE_F32 && gp->type != OOMB_TYPE_BF16) || !oomb_are_same_shape(gp, pool)) {
                    oomb_error("build_backward_expand: paged_attn %s: the pool %s needs its f32 or bf16 gradient pages in ->grad "
                               "(a KV cache created with with_grad), got %s",
                               shape_str(t).c_str(), shape_str(pool).c_str(), gp ? shape_str(gp).c_str() : "none");
                }
            }
        }
        for (int i = 0; i < OOMB_MAX_SRC; i++) {
            const oomb_tensor * s = t->src[i];
            if (!s || !((m >> i) & 1) || !B.needs.count(s)) continue;
            if (s->op == OOMB_OP_PAGED_ATTN && (t->op != OOMB_OP_VIEW || !paged_view_in_out(t))) {
                oomb_error("build_backward_expand: %s %s reads paged_attn's packed node %s: only views inside its out part "
                           "[D, H, T] are differentiable (not the saved log-sum-exp)",
                           oomb_op_name(t->op), shape_str(t).c_str(), shape_str(s).c_str());
            }
            if (s->op == OOMB_OP_LINEAR_CROSS_ENTROPY && (t->op != OOMB_OP_VIEW || !lce_view_in_head(t))) {
                oomb_error("build_backward_expand: %s %s reads linear_cross_entropy's node %s beyond its { sum, count } "
                           "result: the saved per-row log-sum-exp carries no gradient",
                           oomb_op_name(t->op), shape_str(t).c_str(), shape_str(s).c_str());
            }
            reach.insert(t->src[i]);
        }
    }
    std::vector<oomb_tensor *> params;
    for (oomb_tensor * l : g->leafs) {
        if (!(l->flags & OOMB_TENSOR_FLAG_PARAM) || !reach.count(l)) continue;
        if (!l->grad) {
            oomb_error("build_backward_expand: parameter '%s' has no gradient tensor; call oomb_new_grad", l->name);
        }
        if (l->grad->type != OOMB_TYPE_F32 || !oomb_are_same_shape(l->grad, l)) {
            oomb_error("build_backward_expand: gradient tensor %s of parameter %s must be f32 of the parameter's shape",
                       shape_str(l->grad).c_str(), shape_str(l).c_str());
        }
        params.push_back(l);
    }

    // 3. the backward pass
    if (!seed) {
        seed = oomb_fill(ctx, loss->ne[0], loss->ne[1], loss->ne[2], loss->ne[3], 1.0f);
        oomb_format_name(seed, "grad of %.52s (seed)", tname(loss));
    }
    B.acc[loss].g = seed;
    // A parameter's gradient is complete once every node reading it (through a differentiable
    // source) has had its backward built; its accumulation param->grad += gradient is appended to
    // the graph right then, which also appends the products it needs (e.g. a layer's dW = dy x^T).
    // Appending them all at the end instead ran every weight-gradient product after the whole
    // backward pass, keeping each layer's activations and output gradients alive until then
    // (+1.8 GiB of arena for a Qwen2.5-0.5B chunk of 4096 tokens).
    std::unordered_map<const oomb_tensor *, int> readers;  // param -> nodes still to process that read it
    std::unordered_set<const oomb_tensor *> is_param(params.begin(), params.end());
    auto param_srcs = [&](const oomb_tensor * t, auto && f) {
        const int m = diff_srcs(t);
        for (int i = 0; i < OOMB_MAX_SRC; i++) {
            const oomb_tensor * s = t->src[i];
            if (!s || !is_param.count(s) || !(m < 0 || ((m >> i) & 1))) continue;
            bool first = true;  // a node reading p twice counts once
            for (int k = 0; k < i; k++) if (t->src[k] == s && (m < 0 || ((m >> k) & 1))) first = false;
            if (first) f(s);
        }
    };
    for (oomb_tensor * t : nodes) param_srcs(t, [&](const oomb_tensor * p) { readers[p]++; });
    std::unordered_set<const oomb_tensor *> accumulated;
    auto accumulate = [&](oomb_tensor * p) {
        if (!accumulated.insert(p).second) return;
        oomb_tensor * gp = B.get_grad(p);
        if (!gp) return;
        oomb_tensor * upd = oomb_add_inplace(ctx, p->grad, gp);
        oomb_format_name(upd, "%.50s (accumulate)", p->grad->name);
        oomb_build_forward_expand(g, upd);
    };
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
        oomb_tensor * t = *it;
        if (B.needs.count(t)) {
            oomb_tensor * dy = B.get_grad(t);
            if (dy) {
                B.backward(t, dy);
                B.acc.erase(t);
            }
        }
        param_srcs(t, [&](const oomb_tensor * p) {
            if (--readers[p] == 0) accumulate(const_cast<oomb_tensor *>(p));
        });
    }

    // 4. any parameter not accumulated yet (none expected), in order
    for (oomb_tensor * p : params) accumulate(p);
}
