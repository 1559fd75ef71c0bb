// CPU kernels: the reference causal GQA attention, forward and backward (conventions: ops-common.h),
// and the log-sum-exp merge of two partial paged-attention results (the reference of
// cuda/paged-attn-merge.cu). The paged-attention kernels are in paged-attn.cpp.

#include "ops-common.h"
#include "oomb/paged-attn-merge.h"

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Attention (reference, GQA, causal)
// ---------------------------------------------------------------------------------------------

inline const float * row4(const oomb_tensor * t, int64_t i1, int64_t i2, int64_t i3) {
    return (const float *) row_ptr(t, i1, i2, i3);
}

// attn: out[:, h, t, b] = sum_j softmax_j(scale * q.k_j) v_j over keys j <= t + (S - T) of kv head h / G.
void compute_forward_attn(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v) {
    const attn_dims d = attn_dims_of(q, k);  // operands: check_op_operands (op-checks.cpp)
    const float scale = get_op_f32(dst, 0);
    if (oomb_nelements(dst) == 0) return;
    const int64_t D = d.D, S = d.S, T = d.T, H = d.H;
    c.reserve_thread_scratch((size_t) S * sizeof(double) + (size_t) D * sizeof(double));
    parallel_for(c, H * T * d.B, S * D * 2, [&](int64_t r0, int64_t r1, int ith) {
        double * sc = (double *) c.thread_scratch(ith);
        double * acc = sc + S;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t h = r % H, t = (r / H) % T, b = r / (H * T);
            const int64_t g = h / d.G;
            const int64_t nk = t + (S - T) + 1;
            const float * qr = row4(q, h, t, b);
            double mx = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                sc[j] = scale * dot_d(qr, row4(k, g, j, b), D);
                mx = std::max(mx, sc[j]);
            }
            double l = 0.0;
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
            for (int64_t j = 0; j < nk; j++) {
                const double p = std::exp(sc[j] - mx);
                l += p;
                const float * vr = row4(v, g, j, b);
                for (int64_t i = 0; i < D; i++) acc[i] += p * vr[i];
            }
            float * o = (float *) row_ptr(dst, h, t, b);
            const double inv = 1.0 / l;
            for (int64_t i = 0; i < D; i++) o[i] = (float) (acc[i] * inv);
        }
    });
}

// attn_back: dq, dk, dv packed contiguously in dst. Pass 1 (rows (h, t, b)): P = softmax, dP = dout.v_j,
// delta = sum P dP, dS = P (dP - delta), dq = scale * sum dS k_j; keeps logsumexp and delta per row.
// Pass 2 (key rows (g, j, b)): dk_j = scale * sum dS q, dv_j = sum P dout over the group's heads and
// the queries that see key j, recomputing P and dS. Each output row has one writer: no races.
void compute_forward_attn_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k,
                               const oomb_tensor * v, const oomb_tensor * dout) {
    const attn_dims d = attn_dims_of(q, k);  // operands: check_op_operands (op-checks.cpp)
    const int64_t nq = oomb_nelements(q), nk = oomb_nelements(k);
    if (oomb_nelements(dst) != nq + 2 * nk || !oomb_is_contiguous(dst)) {
        oomb_error("attn_back: result %s must be contiguous with %" PRId64 " elements", shape_str(dst).c_str(), nq + 2 * nk);
    }
    const float scale = get_op_f32(dst, 0);
    const int64_t D = d.D, S = d.S, T = d.T, H = d.H, Hkv = d.Hkv, B = d.B, G = d.G;
    float * dq = (float *) dst->data;
    float * dk = dq + nq;
    float * dv = dk + nk;
    if (nq == 0) {
        memset(dk, 0, (size_t) (2 * nk) * sizeof(float));
        return;
    }
    const int64_t n_rows = H * T * B;
    double * lse = (double *) c.slot(N_PREP_SLOTS_END, (size_t) n_rows * 2 * sizeof(double));
    double * delta = lse + n_rows;

    // pass 1: per query row
    c.reserve_thread_scratch((size_t) (2 * S + D) * sizeof(double));
    parallel_for(c, n_rows, S * D * 3, [&](int64_t r0, int64_t r1, int ith) {
        double * p = (double *) c.thread_scratch(ith);
        double * dp = p + S;
        double * acc = dp + S;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t h = r % H, t = (r / H) % T, b = r / (H * T);
            const int64_t g = h / G;
            const int64_t n = t + (S - T) + 1;
            const float * qr = row4(q, h, t, b);
            const float * gr = row4(dout, h, t, b);
            double mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                p[j] = scale * dot_d(qr, row4(k, g, j, b), D);
                mx = std::max(mx, p[j]);
            }
            double l = 0.0;
            for (int64_t j = 0; j < n; j++) { p[j] = std::exp(p[j] - mx); l += p[j]; }
            const double inv = 1.0 / l;
            double dl = 0.0;
            for (int64_t j = 0; j < n; j++) {
                p[j] *= inv;
                dp[j] = dot_d(gr, row4(v, g, j, b), D);
                dl += p[j] * dp[j];
            }
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
            for (int64_t j = 0; j < n; j++) {
                const double ds = p[j] * (dp[j] - dl);
                const float * kr = row4(k, g, j, b);
                for (int64_t i = 0; i < D; i++) acc[i] += ds * kr[i];
            }
            float * o = dq + r * D;
            for (int64_t i = 0; i < D; i++) o[i] = (float) (scale * acc[i]);
            lse[r] = mx + std::log(l);
            delta[r] = dl;
        }
    });

    // pass 2: per key row
    c.reserve_thread_scratch((size_t) (2 * D) * sizeof(double));
    parallel_for(c, Hkv * S * B, G * T * D * 4, [&](int64_t r0, int64_t r1, int ith) {
        double * ak = (double *) c.thread_scratch(ith);
        double * av = ak + D;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t g = r % Hkv, j = (r / Hkv) % S, b = r / (Hkv * S);
            const float * kr = row4(k, g, j, b);
            const float * vr = row4(v, g, j, b);
            for (int64_t i = 0; i < D; i++) { ak[i] = 0.0; av[i] = 0.0; }
            const int64_t t0 = std::max<int64_t>(0, j - (S - T));
            for (int64_t hh = 0; hh < G; hh++) {
                const int64_t h = g * G + hh;
                for (int64_t t = t0; t < T; t++) {
                    const int64_t row = h + H * (t + T * b);
                    const float * qr = row4(q, h, t, b);
                    const float * gr = row4(dout, h, t, b);
                    const double pj = std::exp(scale * dot_d(qr, kr, D) - lse[row]);
                    const double ds = pj * (dot_d(gr, vr, D) - delta[row]);
                    for (int64_t i = 0; i < D; i++) { ak[i] += ds * qr[i]; av[i] += pj * gr[i]; }
                }
            }
            float * okr = dk + ((b * S + j) * Hkv + g) * D;
            float * ovr = dv + ((b * S + j) * Hkv + g) * D;
            for (int64_t i = 0; i < D; i++) { okr[i] = (float) (scale * ak[i]); ovr[i] = (float) av[i]; }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Merge of partial paged-attention results (split-K combine)
// ---------------------------------------------------------------------------------------------

// paged_attn_merge: per row r = t*H + h of the packed layout, acc's out and LSE become the merge of
// acc's and part's (weights: pa_merge_weights, src/oomb/paged-attn-merge.h). One row per item: its
// LSEs are read before its LSE is written, by the same call.
void compute_forward_paged_attn_merge(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * acc, const oomb_tensor * part) {
    // operands: check_op_operands (op-checks.cpp): contiguous f32 of D*H*T + H*T, dst a view of acc
    const int64_t D = dst->op_params[PAM_PARAM_D], R = (int64_t) dst->op_params[PAM_PARAM_H] * dst->op_params[PAM_PARAM_T];
    float * a = (float *) acc->data;
    const float * p = (const float *) part->data;
    float * la = a + D * R;
    const float * lp = p + D * R;
    parallel_for(c, R, 3 * D, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const pa_merge_w w = pa_merge_weights(la[r], lp[r]);
            float * ar = a + r * D;
            const float * pr = p + r * D;
            for (int64_t d = 0; d < D; d++) ar[d] = pa_merge_out(w, ar[d], pr[d]);
            la[r] = w.L;
        }
    });
}

} // namespace cpu
} // namespace oomb
