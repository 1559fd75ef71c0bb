// CPU kernels: cross-entropy over logits and the fused linear + cross-entropy over vocabulary tiles
// (conventions: ops-common.h).

#include "ops-common.h"

#include <cblas.h>

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Cross-entropy
// ---------------------------------------------------------------------------------------------

// Reads and validates nrows labels (classes [0, V)) into slot; returns the count of counted rows.
// Errors name `what` (the logits, or the weight of a fused head) with the tensor `ref`.
static const int32_t * read_labels_v(exec_ctx & c, const char * op, int64_t nrows, int64_t V, const oomb_tensor * labels, int32_t ignore,
                              int64_t & count, const char * what, const oomb_tensor * ref) {
    if (labels->type != OOMB_TYPE_I32 || oomb_nelements(labels) != nrows) {
        oomb_error("%s: labels %s must be i32 with one entry per row (%" PRId64 ")", op, shape_str(labels).c_str(), nrows);
    }
    int32_t * lab = (int32_t *) c.slot(N_PREP_SLOTS_END + 1, (size_t) std::max<int64_t>(nrows, 1) * sizeof(int32_t));
    count = 0;
    for (int64_t r = 0; r < nrows; r++) {
        const int32_t l = flat_i32(labels, r);
        if (l != ignore) {
            if (l < 0 || l >= V) {
                oomb_error("%s: label %d at row %" PRId64 " is out of range [0, %" PRId64 ") (ignore_index %d), %s %s", op, l, r, V,
                           ignore, what, shape_str(ref).c_str());
            }
            count++;
        }
        lab[r] = l;
    }
    return lab;
}

// Reads and validates the labels (one per row of logits) into slot; returns the count of counted rows.
static const int32_t * read_labels(exec_ctx & c, const char * op, const oomb_tensor * logits, const oomb_tensor * labels,
                            int32_t ignore, int64_t & count) {
    if (labels->type != OOMB_TYPE_I32 || oomb_nelements(labels) != oomb_nrows(logits)) {
        oomb_error("%s: labels %s must be i32 with one entry per row of logits %s", op, shape_str(labels).c_str(), shape_str(logits).c_str());
    }
    return read_labels_v(c, op, oomb_nrows(logits), logits->ne[0], labels, ignore, count, "logits", logits);
}

// cross_entropy_loss: dst = { sum over counted rows of logsumexp(x) - x[label], count }.
void compute_forward_cross_entropy(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels) {
    const int32_t ignore = dst->op_params[0];
    int64_t count = 0;
    const int32_t * lab = read_labels(c, "cross_entropy_loss", logits, labels, ignore, count);
    if (oomb_nelements(dst) != 2) oomb_error("cross_entropy_loss: result %s must have 2 elements", shape_str(dst).c_str());
    const int64_t nrows = oomb_nrows(logits), V = logits->ne[0];
    double * part = (double *) c.slot(N_PREP_SLOTS_END, (size_t) std::max<int64_t>(nrows, 1) * sizeof(double));
    c.reserve_thread_scratch((size_t) V * sizeof(float));
    parallel_for(c, nrows, 2 * V, [&](int64_t r0, int64_t r1, int ith) {
        for (int64_t r = r0; r < r1; r++) {
            if (lab[r] == ignore) { part[r] = 0.0; continue; }
            const float * x = (const float *) row_ptr(logits, r);
            float * e = (float *) c.thread_scratch(ith);
            const float mx = max_f(x, V);
            for (int64_t i = 0; i < V; i++) e[i] = exp_f(x[i] - mx);
            part[r] = (double) mx + std::log(sum_d(e, V)) - (double) x[lab[r]];
        }
    });
    double total = 0.0;
    for (int64_t r = 0; r < nrows; r++) total += part[r];
    *(float *) flat_ptr(dst, 0) = (float) total;
    *(float *) flat_ptr(dst, 1) = (float) count;
}

// cross_entropy_loss_back: (softmax(x) - onehot(label)) * dloss[0]; ignored rows are zero.
void compute_forward_cross_entropy_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels,
                                        const oomb_tensor * dloss) {
    check_same_shape("cross_entropy_loss_back", dst, logits);
    const int32_t ignore = dst->op_params[0];
    int64_t count = 0;
    const int32_t * lab = read_labels(c, "cross_entropy_loss_back", logits, labels, ignore, count);
    if (dloss->type != OOMB_TYPE_F32 || oomb_nelements(dloss) < 1) {
        oomb_error("cross_entropy_loss_back: dloss %s must be f32 [2]", shape_str(dloss).c_str());
    }
    const float gscale = flat_f32(dloss, 0);
    const int64_t V = logits->ne[0];
    if (V == 0) return;
    parallel_for(c, oomb_nrows(logits), 3 * V, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const float * x = (const float *) row_ptr(logits, r);
            float * y = (float *) row_ptr(dst, r);
            if (lab[r] == ignore) {
                for (int64_t i = 0; i < V; i++) y[i] = 0.0f;
                continue;
            }
            const float mx = max_f(x, V);
            for (int64_t i = 0; i < V; i++) y[i] = exp_f(x[i] - mx);
            const float f = (float) (gscale / sum_d(y, V));
            for (int64_t i = 0; i < V; i++) y[i] *= f;
            y[lab[r]] -= gscale;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Fused linear + cross-entropy over vocabulary tiles (oomb_linear_cross_entropy)
// ---------------------------------------------------------------------------------------------
//
// The logits of Vt classes at a time: C[N x Vt] = X[N x E] * W[v0 .. v0+Vt)^T (one sgemm; row n
// holds token n's Vt logits), then per row an online log-sum-exp (running max m and sum of exp s in
// double, rescaled when the max grows) and the label's logit when it falls in the tile. The
// backward recomputes each tile's logits, turns them into dlogits in place and runs
// dX += G W_tile and dW_tile = G^T X. Scratch: the tile (Vt x N f32), W's tile rows as f32 when W is
// not f32 with unit-stride rows, x as contiguous f32 when it is not, and O(N) per-row state.

enum {
    LCE_SLOT_W = N_PREP_SLOTS_END,         // w's tile rows converted to f32
    LCE_SLOT_LABELS = N_PREP_SLOTS_END + 1, // read_labels_v
    LCE_SLOT_X = N_PREP_SLOTS_END + 2,     // x as a contiguous f32 copy
    LCE_SLOT_C = N_PREP_SLOTS_END + 3,     // the logits tile
    LCE_SLOT_STATS = N_PREP_SLOTS_END + 4, // per-row state
};

struct lce_dims {
    int64_t E, V, N;
};

static lce_dims lce_check(const char * op, const oomb_tensor * w, const oomb_tensor * x) {
    const int64_t E = w->ne[0], V = w->ne[1], N = oomb_nrows(x);
    if (w->type == OOMB_TYPE_I32 || x->type != OOMB_TYPE_F32 || x->ne[0] != E || w->ne[2] != 1 || w->ne[3] != 1 || E <= 0 || V <= 0) {
        oomb_error("%s: invalid operands w %s, x %s", op, shape_str(w).c_str(), shape_str(x).c_str());
    }
    if (E > INT_MAX || V > INT_MAX || N > INT_MAX) {
        oomb_error("%s: sizes exceed sgemm's int range: w %s, x %s", op, shape_str(w).c_str(), shape_str(x).c_str());
    }
    return {E, V, N};
}

// x as a row-major [N x E] f32 matrix (in place when contiguous).
static const float * lce_x(exec_ctx & c, const oomb_tensor * x) {
    if (oomb_is_contiguous(x)) return (const float *) x->data;
    return tensor_to_f32(c, x, LCE_SLOT_X);
}

// Rows [v0, v0 + n) of w as a row-major f32 matrix with leading dimension ld: in place when w is
// f32 with unit-stride rows, else converted.
static const float * lce_w_rows(exec_ctx & c, const oomb_tensor * w, int64_t v0, int64_t n, int64_t & ld) {
    const int64_t E = w->ne[0];
    if (w->type == OOMB_TYPE_F32 && (E <= 1 || w->nb[0] == 4) && w->nb[1] % 4 == 0) {
        ld = n <= 1 ? E : (int64_t) (w->nb[1] / 4);
        if (ld >= E) return (const float *) ((const char *) w->data + v0 * w->nb[1]);
    }
    ld = E;
    return rows_to_f32(c, w, 0, 0, v0, n, LCE_SLOT_W);
}

// C[N x n] (row stride n) = X W[v0 .. v0+n)^T. Returns W's tile (and its ld) for the backward.
static const float * lce_logits(exec_ctx & c, const oomb_tensor * w, const float * X, const lce_dims & d, int64_t v0, int64_t n, float * C,
                         int64_t & ldw) {
    const float * W = lce_w_rows(c, w, v0, n, ldw);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int) d.N, (int) n, (int) d.E, 1.0f, X, (int) d.E, W, (int) ldw, 0.0f, C,
                (int) n);
    return W;
}

// Every row's log-sum-exp over all V classes, in double, into lse[N]; with picked != NULL also the
// label's logit of each row whose label is in [0, V).
static void lce_lse_pass(exec_ctx & c, const oomb_tensor * w, const float * X, const lce_dims & d, int64_t vt, const int32_t * lab,
                  double * lse, float * picked) {
    const int64_t N = d.N;
    float * C = (float *) c.slot(LCE_SLOT_C, (size_t) N * (size_t) vt * sizeof(float));
    float * m = (float *) c.slot(LCE_SLOT_STATS, (size_t) N * sizeof(float));
    double * s = lse; // the running sum of exp, turned into the log-sum-exp at the end
    c.reserve_thread_scratch((size_t) vt * sizeof(float));
    for (int64_t v0 = 0; v0 < d.V; v0 += vt) {
        const int64_t n = std::min(vt, d.V - v0);
        int64_t ldw;
        lce_logits(c, w, X, d, v0, n, C, ldw);
        parallel_for(c, N, 2 * n, [&](int64_t r0, int64_t r1, int ith) {
            float * e = (float *) c.thread_scratch(ith);
            for (int64_t r = r0; r < r1; r++) {
                const float * x = C + r * n;
                const float mt = max_f(x, n);
                float mr = v0 == 0 ? -INFINITY : m[r];
                double sr = v0 == 0 ? 0.0 : s[r];
                if (mt > mr) {
                    sr = sr == 0.0 ? 0.0 : sr * std::exp((double) mr - (double) mt);
                    mr = mt;
                }
                for (int64_t i = 0; i < n; i++) e[i] = exp_f(x[i] - mr);
                sr += sum_d(e, n);
                m[r] = mr;
                s[r] = sr;
                if (picked) {
                    const int64_t l = lab[r];
                    if (l >= v0 && l < v0 + n) picked[r] = x[l - v0];
                }
            }
        });
    }
    for (int64_t r = 0; r < N; r++) lse[r] = (double) m[r] + std::log(s[r]);
}

// linear_cross_entropy: dst = { sum over counted rows of lse - logit[label], count, lse[0..N) }.
void compute_forward_linear_cross_entropy(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                                          const oomb_tensor * labels) {
    const char * op = "linear_cross_entropy";
    const lce_dims d = lce_check(op, w, x);
    if (oomb_nelements(dst) != 2 + d.N || !oomb_is_contiguous(dst)) {
        oomb_error("%s: result %s must be contiguous with 2 + %" PRId64 " elements", op, shape_str(dst).c_str(), d.N);
    }
    const int32_t ignore = dst->op_params[0];
    int64_t count = 0;
    const int32_t * lab = read_labels_v(c, op, d.N, d.V, labels, ignore, count, "w", w);
    float * out = (float *) dst->data;
    if (d.N == 0) {
        out[0] = out[1] = 0.0f;
        return;
    }
    set_blas_threads(c.n_threads);
    const int64_t vt = oomb_linear_cross_entropy_tile(d.V, d.N, dst->op_params[1]);
    const float * X = lce_x(c, x);
    // per-row state after the running max (LCE_SLOT_STATS): lse (double), the label's logit
    char * st = (char *) c.slot(LCE_SLOT_STATS + 1, (size_t) d.N * (sizeof(double) + sizeof(float)));
    double * lse = (double *) st;
    float * picked = (float *) (st + (size_t) d.N * sizeof(double));
    lce_lse_pass(c, w, X, d, vt, lab, lse, picked);
    double total = 0.0;
    for (int64_t r = 0; r < d.N; r++) {
        if (lab[r] != ignore) total += lse[r] - (double) picked[r];
        out[2 + r] = (float) lse[r];
    }
    out[0] = (float) total;
    out[1] = (float) count;
}

// linear_cross_entropy_back: [dx ; dw] (each only when asked for by op_params[2]), from
// dlogits = (exp(logit - lse) - onehot(label)) * dloss[0] (ignored rows 0), tile by tile.
void compute_forward_linear_cross_entropy_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                                               const oomb_tensor * labels, const oomb_tensor * dloss, const oomb_tensor * lse_t) {
    const char * op = "linear_cross_entropy_back";
    const lce_dims d = lce_check(op, w, x);
    const int grads = dst->op_params[2];
    const bool want_dx = (grads & OOMB_LCE_GRAD_X) != 0, want_dw = (grads & OOMB_LCE_GRAD_W) != 0;
    const int64_t n_dx = want_dx ? d.E * d.N : 0, n_dw = want_dw ? d.E * d.V : 0;
    if (!(want_dx || want_dw) || oomb_nelements(dst) != n_dx + n_dw || !oomb_is_contiguous(dst)) {
        oomb_error("%s: result %s must be contiguous with %" PRId64 " elements (grads %d)", op, shape_str(dst).c_str(), n_dx + n_dw, grads);
    }
    if (dloss->type != OOMB_TYPE_F32 || oomb_nelements(dloss) < 1) oomb_error("%s: dloss %s must be f32 [2]", op, shape_str(dloss).c_str());
    if (lse_t && (lse_t->type != OOMB_TYPE_F32 || oomb_nelements(lse_t) != d.N)) {
        oomb_error("%s: lse %s must be f32 with one entry per row of x %s", op, shape_str(lse_t).c_str(), shape_str(x).c_str());
    }
    const int32_t ignore = dst->op_params[0];
    int64_t count = 0;
    const int32_t * lab = read_labels_v(c, op, d.N, d.V, labels, ignore, count, "w", w);
    float * dX = want_dx ? (float *) dst->data : nullptr;
    float * dW = want_dw ? (float *) dst->data + n_dx : nullptr;
    if (d.N == 0) {
        memset(dst->data, 0, oomb_nbytes(dst));
        return;
    }
    set_blas_threads(c.n_threads);
    const float gs = flat_f32(dloss, 0);
    const int64_t vt = oomb_linear_cross_entropy_tile(d.V, d.N, dst->op_params[1]);
    const float * X = lce_x(c, x);
    // each row's log-sum-exp: from the forward, or recomputed with one pass over the tiles
    float * L = (float *) c.slot(LCE_SLOT_STATS + 2, (size_t) d.N * sizeof(float));
    if (lse_t) {
        for (int64_t r = 0; r < d.N; r++) L[r] = flat_f32(lse_t, r);
    } else {
        double * lse = (double *) c.slot(LCE_SLOT_STATS + 1, (size_t) d.N * sizeof(double));
        lce_lse_pass(c, w, X, d, vt, lab, lse, nullptr);
        for (int64_t r = 0; r < d.N; r++) L[r] = (float) lse[r];
    }
    float * C = (float *) c.slot(LCE_SLOT_C, (size_t) d.N * (size_t) vt * sizeof(float));
    for (int64_t v0 = 0; v0 < d.V; v0 += vt) {
        const int64_t n = std::min(vt, d.V - v0);
        int64_t ldw;
        const float * W = lce_logits(c, w, X, d, v0, n, C, ldw);
        parallel_for(c, d.N, 2 * n, [&](int64_t r0, int64_t r1, int) {
            for (int64_t r = r0; r < r1; r++) {
                float * g = C + r * n;
                if (lab[r] == ignore) {
                    for (int64_t i = 0; i < n; i++) g[i] = 0.0f;
                    continue;
                }
                const float l = L[r], f = gs;
                for (int64_t i = 0; i < n; i++) g[i] = exp_f(g[i] - l) * f;
                const int64_t lb = lab[r];
                if (lb >= v0 && lb < v0 + n) g[lb - v0] -= f;
            }
        });
        // dX[N x E] (+)= G[N x n] W_tile[n x E]
        if (dX) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int) d.N, (int) d.E, (int) n, 1.0f, C, (int) n, W, (int) ldw,
                        v0 == 0 ? 0.0f : 1.0f, dX, (int) d.E);
        }
        // dW_tile[n x E] = G^T X
        if (dW) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int) n, (int) d.E, (int) d.N, 1.0f, C, (int) n, X, (int) d.E, 0.0f,
                        dW + v0 * d.E, (int) d.E);
        }
    }
}

} // namespace cpu
} // namespace oomb
