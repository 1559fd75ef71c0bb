// CPU kernels: rms_norm, rope (NEOX layout) and softmax, forward and backward, one row at a time
// (conventions: ops-common.h).

#include "ops-common.h"

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

// rms_norm: y = x / sqrt(mean(x^2) + eps), per row (sum of squares in double); rms_norm_mul
// (src[1] = w): y = f32(x * s) * w, stored as dst's type (f32 or bf16), the roundings of
// oomb_mul_ext(oomb_rms_norm(x), w).
static float rms_scale(const float * x, int64_t ne0, double eps) {
    return (float) (1.0 / std::sqrt(dot_d(x, x, ne0) / (double) ne0 + eps));
}
void compute_forward_rms_norm(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    const double eps = get_op_f32(dst, 0);
    const int64_t ne0 = a->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(a), ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const float * x = (const float *) row_ptr(a, r);
            float * y = (float *) row_ptr(dst, r);
            const float s = rms_scale(x, ne0, eps);
            for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * s;
        }
    });
}
void compute_forward_rms_norm_mul(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * w) {
    const double eps = get_op_f32(dst, 0);
    const int64_t ne0 = a->ne[0];
    if (ne0 == 0) return;
    const float * wv = (const float *) w->data;  // unit stride (check_op_operands)
    const bool bf = dst->type == OOMB_TYPE_BF16;
    parallel_for(c, oomb_nrows(a), ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const float * x = (const float *) row_ptr(a, r);
            const float s = rms_scale(x, ne0, eps);
            if (bf) {
                uint16_t * y = (uint16_t *) row_ptr(dst, r);
                for (int64_t i = 0; i < ne0; i++) {
                    const float n = x[i] * s;
                    y[i] = fp32_to_bf16(n * wv[i]);
                }
            } else {
                float * y = (float *) row_ptr(dst, r);
                for (int64_t i = 0; i < ne0; i++) {
                    const float n = x[i] * s;
                    y[i] = n * wv[i];
                }
            }
        }
    });
}

// rms_norm_back: dx = s*dy - s^3/n * x * sum(x*dy), s = 1/sqrt(mean(x^2) + eps). Returns s rounded
// to f32: the forward's scale (rms_scale, the same sums).
static float rms_norm_back_row(const float * xr, const float * g, float * d, int64_t ne0, double eps) {
    const double ss = dot_d(xr, xr, ne0);
    const double xg = dot_d(xr, g, ne0);
    const double s = 1.0 / std::sqrt(ss / (double) ne0 + eps);
    const float c1 = (float) s;
    const float c2 = (float) (s * s * s / (double) ne0 * xg);
    for (int64_t i = 0; i < ne0; i++) d[i] = c1 * g[i] - c2 * xr[i];
    return c1;
}
void compute_forward_rms_norm_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    const double eps = get_op_f32(dst, 0);
    const int64_t ne0 = x->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(x), 2 * ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++)
            rms_norm_back_row((const float *) row_ptr(x, r), (const float *) row_ptr(dy, r), (float *) row_ptr(dst, r), ne0, eps);
    });
}

// rms_norm_mul_back: dx = rms_norm_back(x, g) with g = f32(dy * w); with dw (op_params[1]) the result
// is packed [ne0, nrows + 1], dx in rows 0 .. nrows - 1 and dw[i] = sum_r f32(dy[r][i] * f32(x[r][i] *
// s_r)) in the last row (double sums over blocks of k_dw_block rows, added in block order: the same
// result for any thread count).
void compute_forward_rms_norm_mul_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * w, const oomb_tensor * dy) {
    constexpr int64_t k_dw_block = 64;
    const double eps = get_op_f32(dst, 0);
    const int64_t ne0 = x->ne[0], nr = oomb_nrows(x);
    if (ne0 == 0) return;
    const bool with_dw = dst->op_params[1] != 0;
    const float * wv = (const float *) w->data;
    c.reserve_thread_scratch((size_t) ne0 * sizeof(float));
    if (!with_dw) {  // dx alone: rows split as rms_norm_back splits them
        parallel_for(c, nr, 3 * ne0, [&](int64_t r0, int64_t r1, int ith) {
            float * g = (float *) c.thread_scratch(ith);
            for (int64_t r = r0; r < r1; r++) {
                const float * dyr = (const float *) row_ptr(dy, r);
                for (int64_t i = 0; i < ne0; i++) g[i] = dyr[i] * wv[i];
                rms_norm_back_row((const float *) row_ptr(x, r), g, (float *) row_ptr(dst, r), ne0, eps);
            }
        });
        return;
    }
    const int64_t nblk = (nr + k_dw_block - 1) / k_dw_block;
    double * part = nblk > 0 ? (double *) c.slot(N_PREP_SLOTS_END, (size_t) nblk * (size_t) ne0 * sizeof(double)) : nullptr;
    parallel_for(c, nblk, k_dw_block * 3 * ne0, [&](int64_t b0, int64_t b1, int ith) {
        float * g = (float *) c.thread_scratch(ith);
        for (int64_t b = b0; b < b1; b++) {
            double * acc = part + b * ne0;
            std::fill(acc, acc + ne0, 0.0);
            for (int64_t r = b * k_dw_block; r < std::min(nr, (b + 1) * k_dw_block); r++) {
                const float * xr = (const float *) row_ptr(x, r);
                const float * dyr = (const float *) row_ptr(dy, r);
                for (int64_t i = 0; i < ne0; i++) g[i] = dyr[i] * wv[i];
                const float s = rms_norm_back_row(xr, g, (float *) dst->data + r * ne0, ne0, eps);
                for (int64_t i = 0; i < ne0; i++) {
                    const float n = xr[i] * s;
                    acc[i] += (double) (dyr[i] * n);
                }
            }
        }
    });
    float * dw = (float *) dst->data + nr * ne0;
    for (int64_t i = 0; i < ne0; i++) {
        double t = 0.0;
        for (int64_t b = 0; b < nblk; b++) t += part[b * ne0 + i];
        dw[i] = (float) t;
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding (NEOX layout)
// ---------------------------------------------------------------------------------------------

// rope / rope_back: per token t (dim 2) and head (dim 1), for i < n_dims/2 with angle
// pos[t] * theta^(-2i/n_dims) (computed in double), divided by ff[i] where the node has frequency
// factors (src[2]; without them nothing is divided): y[i] = x0 cos - x1 sin, y[i + n_dims/2] =
// x0 sin + x1 cos, with x0 = x[i], x1 = x[i + n_dims/2]; rope_back rotates by -angle. Operands are
// checked by check_rope (op-checks.cpp); the factors' values here (positive, finite).
void compute_forward_rope(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * pos, const oomb_tensor * ff) {
    const char * opn = oomb_op_name(dst->op);
    const int n_dims = dst->op_params[0];
    const double theta = get_op_f32(dst, 1);
    const int64_t ne0 = a->ne[0];
    const int64_t half = n_dims / 2;
    std::vector<double> ffd;
    if (ff) {
        ffd.resize((size_t) half);
        for (int64_t i = 0; i < half; i++) {
            ffd[(size_t) i] = (double) flat_f32(ff, i);
            if (!(ffd[(size_t) i] > 0.0 && std::isfinite(ffd[(size_t) i])))
                oomb_error("%s: freq_factors[%" PRId64 "] = %g must be positive and finite", opn, i, ffd[(size_t) i]);
        }
    }
    const double * fd = ff ? ffd.data() : nullptr;
    const float sign = dst->op == OOMB_OP_ROPE_BACK ? -1.0f : 1.0f;
    c.reserve_thread_scratch((size_t) half * 2 * sizeof(float));
    const int64_t ne1 = a->ne[1], ne2 = a->ne[2];
    parallel_for(c, oomb_nrows(a), ne0 + 8, [&](int64_t r0, int64_t r1, int ith) {
        float * cs = (float *) c.thread_scratch(ith);
        float * sn = cs + half;
        int64_t cached = -1;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i2 = (r / ne1) % ne2;
            if (i2 != cached) {
                const double p = (double) flat_i32(pos, i2);
                for (int64_t i = 0; i < half; i++) {
                    double ang = p * std::pow(theta, -2.0 * (double) i / (double) n_dims);
                    if (fd) ang /= fd[i];
                    cs[i] = (float) std::cos(ang);
                    sn[i] = sign * (float) std::sin(ang);
                }
                cached = i2;
            }
            const float * x = (const float *) row_ptr(a, r);
            float * y = (float *) row_ptr(dst, r);
            for (int64_t i = 0; i < half; i++) {
                const float x0 = x[i], x1 = x[i + half];
                y[i]        = x0 * cs[i] - x1 * sn[i];
                y[i + half] = x0 * sn[i] + x1 * cs[i];
            }
            if (y != x) for (int64_t i = n_dims; i < ne0; i++) y[i] = x[i];
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Softmax
// ---------------------------------------------------------------------------------------------

// soft_max over dim 0 of a*scale; causal >= 0 masks i0 > i1 + causal. A row with nothing left
// (or only -inf) becomes zeros.
void compute_forward_soft_max(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    const float scale = get_op_f32(dst, 0);
    const int64_t causal = dst->op_params[1];
    const int64_t ne0 = a->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(a), 2 * ne0, [&](int64_t r0, int64_t r1, int) {
        const float sc = scale; // locals: captured floats would be reloaded after every float store
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i1 = r % a->ne[1];
            const float * x = (const float *) row_ptr(a, r);
            float * y = (float *) row_ptr(dst, r);
            const int64_t nv = causal >= 0 ? std::min(ne0, std::max<int64_t>(i1 + causal + 1, 0)) : ne0;
            float mx;
            if (sc > 0.0f) mx = max_f(x, nv) * sc;
            else { mx = -INFINITY; for (int64_t i = 0; i < nv; i++) mx = std::max(mx, x[i] * sc); }
            if (nv == 0 || mx == -INFINITY) {
                for (int64_t i = 0; i < ne0; i++) y[i] = 0.0f;
                continue;
            }
            for (int64_t i = 0; i < nv; i++) y[i] = exp_f(x[i] * sc - mx);
            const float inv = (float) (1.0 / sum_d(y, nv));
            for (int64_t i = 0; i < nv; i++) y[i] *= inv;
            for (int64_t i = nv; i < ne0; i++) y[i] = 0.0f;
        }
    });
}

// soft_max_back: dx = scale * y * (dy - dot(y, dy)).
void compute_forward_soft_max_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * y, const oomb_tensor * dy) {
    const float scale = get_op_f32(dst, 0);
    const int64_t ne0 = y->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(y), 2 * ne0, [&](int64_t r0, int64_t r1, int) {
        const float sc = scale;
        for (int64_t r = r0; r < r1; r++) {
            const float * yr = (const float *) row_ptr(y, r);
            const float * g = (const float *) row_ptr(dy, r);
            float * d = (float *) row_ptr(dst, r);
            const float dot = (float) dot_d(yr, g, ne0);
            for (int64_t i = 0; i < ne0; i++) d[i] = sc * yr[i] * (g[i] - dot);
        }
    });
}

} // namespace cpu
} // namespace oomb
