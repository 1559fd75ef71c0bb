// CPU kernels: copies with type conversion, element-wise ops, reductions and embedding rows
// (conventions: ops-common.h).

#include "ops-common.h"

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Copies with type conversion (any strides)
// ---------------------------------------------------------------------------------------------

template <oomb_type T> inline float ld(const char * p);
template <> inline float ld<OOMB_TYPE_F32>(const char * p) { float f; memcpy(&f, p, 4); return f; }
template <> inline float ld<OOMB_TYPE_F16>(const char * p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_fp32(h); }
template <> inline float ld<OOMB_TYPE_BF16>(const char * p) { uint16_t h; memcpy(&h, p, 2); return bf16_to_fp32(h); }
template <oomb_type T> inline void st(char * p, float v);
template <> inline void st<OOMB_TYPE_F32>(char * p, float v) { memcpy(p, &v, 4); }
template <> inline void st<OOMB_TYPE_F16>(char * p, float v) { const uint16_t h = fp32_to_fp16(v); memcpy(p, &h, 2); }
template <> inline void st<OOMB_TYPE_BF16>(char * p, float v) { const uint16_t h = fp32_to_bf16(v); memcpy(p, &h, 2); }

template <oomb_type S, oomb_type D>
static void cvt_loop(const char * s, int64_t ss, char * d, int64_t ds, int64_t n) {
    for (int64_t i = 0; i < n; i++) st<D>(d + i * ds, ld<S>(s + i * ss));
}

// Converts n elements (strides ss, ds in bytes). Types: equal, or both float types.
static void cvt_row(const char * s, int64_t ss, oomb_type st_, char * d, int64_t ds, oomb_type dt, int64_t n) {
    if (n <= 0) return;
    if (st_ == dt) {
        const int64_t ts = (int64_t) tsize(st_);
        if (ss == ts && ds == ts) { memmove(d, s, (size_t) (n * ts)); return; }
        if (ts == 4) for (int64_t i = 0; i < n; i++) memcpy(d + i * ds, s + i * ss, 4);
        else         for (int64_t i = 0; i < n; i++) memcpy(d + i * ds, s + i * ss, 2);
        return;
    }
#define OOMB_CVT(S, D) if (st_ == S && dt == D) { cvt_loop<S, D>(s, ss, d, ds, n); return; }
    OOMB_CVT(OOMB_TYPE_F32, OOMB_TYPE_F16)
    OOMB_CVT(OOMB_TYPE_F32, OOMB_TYPE_BF16)
    OOMB_CVT(OOMB_TYPE_F16, OOMB_TYPE_F32)
    OOMB_CVT(OOMB_TYPE_BF16, OOMB_TYPE_F32)
    OOMB_CVT(OOMB_TYPE_F16, OOMB_TYPE_BF16)
    OOMB_CVT(OOMB_TYPE_BF16, OOMB_TYPE_F16)
#undef OOMB_CVT
}

// Dequantizing copy (cast / cpy of a block-type src, row-major blocks, to a float dst of the same
// shape): each row block by block through a 256-float stack buffer (quants.h, bit-exact).
static void copy_dequant(exec_ctx & c, const oomb_tensor * src, const oomb_tensor * dst) {
    if (!oomb_are_same_shape(src, dst) || quant_block_dim(src) != 0 || dst->type == OOMB_TYPE_I32 || oomb_type_is_quantized(dst->type))
        oomb_error("%s: dequantizing %s into %s needs row-major blocks and a float result of the same shape", oomb_op_name(dst->op),
                   shape_str(src).c_str(), shape_str(dst).c_str());
    const uint32_t gt = oomb_type_to_ggml(src->type);
    const int64_t bs = oomb_blck_size(src->type), ne0 = src->ne[0];
    const size_t bb = oomb_type_size(src->type);
    parallel_for(c, oomb_nrows(src), ne0, [&](int64_t r0, int64_t r1, int) {
        float y[256];
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            row_index(src, r, i1, i2, i3);
            const char * s = row_ptr(src, i1, i2, i3);
            char * d = row_ptr(dst, i1, i2, i3);
            for (int64_t b = 0; b < ne0 / bs; b++) {
                dequantize_blocks(gt, s + (size_t) b * bb, y, 1);
                cvt_row((const char *) y, 4, OOMB_TYPE_F32, d + b * bs * (int64_t) dst->nb[0], (int64_t) dst->nb[0], dst->type, bs);
            }
        }
    });
}

// Copies src into dst element by element in logical order (same element count; shapes may
// differ), converting the type. Any strides on both sides. A block-type src is dequantized
// (copy_dequant: same shape only).
void copy_tensor(exec_ctx & c, const oomb_tensor * src, const oomb_tensor * dst) {
    const int64_t n = oomb_nelements(src);
    if (n == 0) return;
    if (oomb_type_is_quantized(src->type)) { copy_dequant(c, src, dst); return; }
    const int64_t ne0 = src->ne[0];
    const int64_t nrows = oomb_nrows(src);
    if (oomb_are_same_shape(src, dst)) {
        parallel_for(c, nrows, ne0, [&](int64_t r0, int64_t r1, int) {
            for (int64_t r = r0; r < r1; r++) {
                int64_t i1, i2, i3;
                row_index(src, r, i1, i2, i3);
                cvt_row(row_ptr(src, i1, i2, i3), (int64_t) src->nb[0], src->type, row_ptr(dst, i1, i2, i3),
                        (int64_t) dst->nb[0], dst->type, ne0);
            }
        });
        return;
    }
    // Different shapes: walk dst coordinates alongside each source row, in segments.
    parallel_for(c, nrows, ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const char * s = row_ptr(src, r);
            int64_t f = r * ne0;
            int64_t d[4];
            d[0] = f % dst->ne[0]; f /= dst->ne[0];
            d[1] = f % dst->ne[1]; f /= dst->ne[1];
            d[2] = f % dst->ne[2]; f /= dst->ne[2];
            d[3] = f;
            int64_t done = 0;
            while (done < ne0) {
                const int64_t len = std::min(ne0 - done, dst->ne[0] - d[0]);
                cvt_row(s + done * (int64_t) src->nb[0], (int64_t) src->nb[0], src->type,
                        (char *) elem_ptr(dst, d[0], d[1], d[2], d[3]), (int64_t) dst->nb[0], dst->type, len);
                done += len;
                d[0] += len;
                if (d[0] == dst->ne[0]) {
                    d[0] = 0;
                    for (int k = 1; k < 4; k++) {
                        if (++d[k] < dst->ne[k] || k == 3) break;
                        d[k] = 0;
                    }
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Layout and copies
// ---------------------------------------------------------------------------------------------

// cont (contiguous copy, same type), cpy (into a view of src[1]) and cast (another type) are
// copy_tensor(src[0], dst), called by the dispatcher (ops-cpu.cpp).

// fill: every element = op_params[0].
void compute_forward_fill(exec_ctx & c, oomb_tensor * dst) {
    const float v = get_op_f32(dst, 0);
    const int64_t ne0 = dst->ne[0];
    parallel_for(c, oomb_nrows(dst), ne0, [&, v](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            char * d = row_ptr(dst, r);
            for (int64_t i = 0; i < ne0; i++) *(float *) (d + i * (int64_t) dst->nb[0]) = v;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Element-wise
// ---------------------------------------------------------------------------------------------

// dst = op(a, b) with b broadcast to a (b indexed with i % b->ne[i]); any strides on a, b and dst.
template <class OP>
static void binary_rows(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b, OP op) {
    const int64_t ne0 = dst->ne[0];
    const int64_t bne0 = b->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(dst), ne0, [&](int64_t r0, int64_t r1, int) {
        const OP op_ = op; // a local copy: float state behind a reference would be reloaded after every store
        const int64_t sd = (int64_t) dst->nb[0], sa = (int64_t) a->nb[0], sb = (int64_t) b->nb[0];
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            row_index(dst, r, i1, i2, i3);
            char * d = row_ptr(dst, i1, i2, i3);
            const char * x = row_ptr(a, i1, i2, i3);
            const char * y = row_ptr(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
            if (sd == 4 && sa == 4 && (sb == 4 || bne0 == 1)) {
                float * df = (float *) d;
                const float * xf = (const float *) x;
                const float * yf = (const float *) y;
                if (bne0 == ne0) {
                    for (int64_t i = 0; i < ne0; i++) df[i] = op_(xf[i], yf[i]);
                } else if (bne0 == 1) {
                    const float yv = yf[0];
                    for (int64_t i = 0; i < ne0; i++) df[i] = op_(xf[i], yv);
                } else {
                    for (int64_t k = 0; k < ne0; k += bne0) {
                        for (int64_t i = 0; i < bne0; i++) df[k + i] = op_(xf[k + i], yf[i]);
                    }
                }
            } else {
                for (int64_t i = 0; i < ne0; i++) {
                    *(float *) (d + i * sd) = op_(*(const float *) (x + i * sa), *(const float *) (y + (i % bne0) * sb));
                }
            }
        }
    });
}

// dst = op_(a) element-wise; any strides.
template <class OP>
static void unary_rows(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, OP op) {
    const int64_t ne0 = dst->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(dst), ne0, [&](int64_t r0, int64_t r1, int) {
        const OP op_ = op;
        const int64_t sd = (int64_t) dst->nb[0], sa = (int64_t) a->nb[0];
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            row_index(dst, r, i1, i2, i3);
            char * d = row_ptr(dst, i1, i2, i3);
            const char * x = row_ptr(a, i1, i2, i3);
            if (sd == 4 && sa == 4) {
                float * df = (float *) d;
                const float * xf = (const float *) x;
                for (int64_t i = 0; i < ne0; i++) df[i] = op_(xf[i]);
            } else {
                for (int64_t i = 0; i < ne0; i++) *(float *) (d + i * sd) = op_(*(const float *) (x + i * sa));
            }
        }
    });
}

void compute_forward_add(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    binary_rows(c, dst, a, b, [](float x, float y) { return x + y; });
}
void compute_forward_sub(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    binary_rows(c, dst, a, b, [](float x, float y) { return x - y; });
}
// A bf16 result (oomb_mul_ext, oomb_swiglu_ext): f(tmp) on a contiguous f32 stand-in in scratch,
// then rounded into dst. f32: f(dst).
template <class F>
static void via_f32_result(exec_ctx & c, oomb_tensor * dst, F f) {
    if (dst->type == OOMB_TYPE_F32) { f(dst); return; }
    oomb_tensor tmp = *dst;
    tmp.type = OOMB_TYPE_F32;
    tmp.view_src = nullptr;
    set_contiguous_strides(&tmp);
    tmp.data = c.slot(N_PREP_SLOTS_END, (size_t) oomb_nelements(&tmp) * 4);
    f(&tmp);
    copy_tensor(c, &tmp, dst);
}

void compute_forward_mul(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    via_f32_result(c, dst, [&](oomb_tensor * d) { binary_rows(c, d, a, b, [](float x, float y) { return x * y; }); });
}
// add_inplace: dst (a view of src[0]) += src[1] broadcast.
void compute_forward_add_inplace(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    compute_forward_add(c, dst, a, b);
}

void compute_forward_scale(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    const float s = get_op_f32(dst, 0);
    unary_rows(c, dst, a, [s](float x) { return x * s; });
}

inline float silu_f(float x) { return x / (1.0f + exp_f(-x)); }

void compute_forward_silu(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    unary_rows(c, dst, a, [](float x) { return silu_f(x); });
}
// silu_back: dx = dy * s * (1 + x * (1 - s)), s = sigmoid(x); x = src[0], dy = src[1].
void compute_forward_silu_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    binary_rows(c, dst, x, dy, [](float xv, float g) {
        const float s = 1.0f / (1.0f + exp_f(-xv));
        return g * s * (1.0f + xv * (1.0f - s));
    });
}
// swiglu: silu(gate) * up.
void compute_forward_swiglu(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * gate, const oomb_tensor * up) {
    oomb_tensor g32, u32;  // bf16 gate and up (oomb_mul_mat_ext results): f32 stand-ins
    gate = f32_standin(c, gate, N_PREP_SLOTS_END + 1, g32);
    up = f32_standin(c, up, N_PREP_SLOTS_END + 2, u32);
    via_f32_result(c, dst, [&](oomb_tensor * d) { binary_rows(c, d, gate, up, [](float g, float u) { return silu_f(g) * u; }); });
}
// swiglu_back: [dgate; dup] (dst [ne0, ne1, ne2, 2 ne3], contiguous) from gate, up, dy (any strides).
void compute_forward_swiglu_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u, const oomb_tensor * dy) {
    if (!oomb_is_contiguous(dst) || dst->ne[0] != g->ne[0] || dst->ne[1] != g->ne[1] || dst->ne[2] != g->ne[2] || dst->ne[3] != 2 * g->ne[3])
        oomb_error("swiglu_back: result %s must be contiguous [%s with ne3 doubled]", shape_str(dst).c_str(), shape_str(g).c_str());
    if (g->type != OOMB_TYPE_F32) {  // bf16 gate and up: f32 stand-ins first
        oomb_tensor g32, u32;
        g = f32_standin(c, g, N_PREP_SLOTS_END + 1, g32);
        u = f32_standin(c, u, N_PREP_SLOTS_END + 2, u32);
        compute_forward_swiglu_back(c, dst, g, u, dy);
        return;
    }
    if (dst->type != OOMB_TYPE_F32) {  // oomb_swiglu_back_ext: f32 into scratch, then rounded
        via_f32_result(c, dst, [&](oomb_tensor * d) { compute_forward_swiglu_back(c, d, g, u, dy); });
        return;
    }
    const int64_t ne0 = g->ne[0];
    if (ne0 == 0) return;
    const int64_t half = oomb_nelements(g);
    parallel_for(c, oomb_nrows(g), ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            row_index(g, r, i1, i2, i3);
            const char * gp = row_ptr(g, i1, i2, i3), * up = row_ptr(u, i1, i2, i3), * yp = row_ptr(dy, i1, i2, i3);
            float * dg = (float *) dst->data + r * ne0;
            float * du = dg + half;
            for (int64_t i = 0; i < ne0; i++) {
                const float gv = *(const float *) (gp + i * g->nb[0]), uv = *(const float *) (up + i * u->nb[0]);
                const float yv = *(const float *) (yp + i * dy->nb[0]);
                const float s = 1.0f / (1.0f + exp_f(-gv));
                dg[i] = yv * uv * s * (1.0f + gv * (1.0f - s));
                du[i] = yv * gv * s;
            }
        }
    });
}

// repeat: dst[i] = a[i % a->ne] (dst has the shape of src[1]).
void compute_forward_repeat(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    for (int i = 0; i < 4; i++) {
        if (a->ne[i] == 0 ? dst->ne[i] != 0 : dst->ne[i] % a->ne[i] != 0) {
            oomb_error("repeat: %s cannot be repeated to %s", shape_str(a).c_str(), shape_str(dst).c_str());
        }
    }
    const int64_t ne0 = dst->ne[0], ane0 = a->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(dst), ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            row_index(dst, r, i1, i2, i3);
            float * d = (float *) row_ptr(dst, i1, i2, i3);
            const char * x = row_ptr(a, i1 % a->ne[1], i2 % a->ne[2], i3 % a->ne[3]);
            const int64_t sa = (int64_t) a->nb[0];
            for (int64_t k = 0; k < ne0; k += ane0) {
                for (int64_t i = 0; i < ane0; i++) d[k + i] = *(const float *) (x + i * sa);
            }
        }
    });
}

// repeat_back: sum a down to dst's shape (the adjoint of repeat). Accumulates in double.
void compute_forward_repeat_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    for (int i = 0; i < 4; i++) {
        if (dst->ne[i] == 0 ? a->ne[i] != 0 : a->ne[i] % dst->ne[i] != 0) {
            oomb_error("repeat_back: %s cannot be summed down to %s", shape_str(a).c_str(), shape_str(dst).c_str());
        }
    }
    const int64_t ne0 = dst->ne[0];
    if (ne0 == 0 || oomb_nelements(dst) == 0) return;
    const int64_t k1 = a->ne[1] / dst->ne[1], k2 = a->ne[2] / dst->ne[2], k3 = a->ne[3] / dst->ne[3];
    c.reserve_thread_scratch((size_t) ne0 * sizeof(double));
    parallel_for(c, oomb_nrows(dst), a->ne[0] * k1 * k2 * k3, [&](int64_t r0, int64_t r1, int ith) {
        double * acc = (double *) c.thread_scratch(ith);
        const int64_t sa = (int64_t) a->nb[0];
        for (int64_t r = r0; r < r1; r++) {
            int64_t j1, j2, j3;
            row_index(dst, r, j1, j2, j3);
            for (int64_t i = 0; i < ne0; i++) acc[i] = 0.0;
            for (int64_t m3 = 0; m3 < k3; m3++)
            for (int64_t m2 = 0; m2 < k2; m2++)
            for (int64_t m1 = 0; m1 < k1; m1++) {
                const char * x = row_ptr(a, j1 + m1 * dst->ne[1], j2 + m2 * dst->ne[2], j3 + m3 * dst->ne[3]);
                for (int64_t k = 0; k < a->ne[0]; k += ne0) {
                    for (int64_t i = 0; i < ne0; i++) acc[i] += *(const float *) (x + (k + i) * sa);
                }
            }
            float * d = (float *) row_ptr(dst, j1, j2, j3);
            for (int64_t i = 0; i < ne0; i++) d[i] = (float) acc[i];
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

// sum / mean / sum_sq over all elements (any strides), in double, deterministic for any thread count.
// sum_sq of several sources (oomb_sum_sq_n): the per-source sums in double, added in source order.
static double sum_all(exec_ctx & c, const oomb_tensor * a, bool sq);
void compute_forward_sum(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * const * s) {
    const bool sq = dst->op == OOMB_OP_SUM_SQ;
    double total = 0.0;
    for (int k = 0; k < OOMB_MAX_SRC && (k == 0 || sq); k++) {
        if (!s[k]) continue;
        if (s[k]->type != OOMB_TYPE_F32) oomb_error("%s: source %d %s must be f32", oomb_op_name(dst->op), k, shape_str(s[k]).c_str());
        total += sum_all(c, s[k], sq);
    }
    if (dst->op == OOMB_OP_MEAN) total /= (double) oomb_nelements(s[0]);
    *(float *) dst->data = (float) total;
}
static double sum_all(exec_ctx & c, const oomb_tensor * a, bool sq) {
    const int64_t nrows = oomb_nrows(a), ne0 = a->ne[0];
    double * part = (double *) c.slot(N_PREP_SLOTS_END, (size_t) std::max<int64_t>(nrows, 1) * sizeof(double));
    parallel_for(c, nrows, ne0, [&](int64_t r0, int64_t r1, int) {
        const int64_t sa = (int64_t) a->nb[0];
        for (int64_t r = r0; r < r1; r++) {
            const char * x = row_ptr(a, r);
            double s;
            if (sa == 4) {
                s = sq ? dot_d((const float *) x, (const float *) x, ne0) : sum_d((const float *) x, ne0);
            } else {
                s = 0.0;
                for (int64_t i = 0; i < ne0; i++) {
                    const double v = *(const float *) (x + i * sa);
                    s += sq ? v * v : v;
                }
            }
            part[r] = s;
        }
    });
    double total = 0.0;
    for (int64_t r = 0; r < nrows; r++) total += part[r];
    return total;
}

// ---------------------------------------------------------------------------------------------
// Embeddings
// ---------------------------------------------------------------------------------------------

static void check_ids(const char * op, const oomb_tensor * ids, int64_t n_rows, const oomb_tensor * table) {
    if (ids->type != OOMB_TYPE_I32) oomb_error("%s: ids %s must be i32", op, shape_str(ids).c_str());
    const int64_t n = oomb_nelements(ids);
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = flat_i32(ids, i);
        if (id < 0 || id >= n_rows) {
            oomb_error("%s: id %d at position %" PRId64 " of ids %s is out of range: %s has %" PRId64 " rows", op, id, i,
                       shape_str(ids).c_str(), shape_str(table).c_str(), n_rows);
        }
    }
}

// get_rows: dst[:, i, j] = a[:, ids[i, j]] converted to f32.
void compute_forward_get_rows(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * ids) {
    if (a->type == OOMB_TYPE_I32) oomb_error("get_rows: a %s must be a float type", shape_str(a).c_str());
    if (dst->ne[0] != a->ne[0] || dst->ne[1] != ids->ne[0] || dst->ne[2] != ids->ne[1] || oomb_nelements(dst) != a->ne[0] * oomb_nelements(ids)) {
        oomb_error("get_rows: result %s does not match a %s and ids %s", shape_str(dst).c_str(), shape_str(a).c_str(), shape_str(ids).c_str());
    }
    check_ids("get_rows", ids, a->ne[1], a);
    const int64_t ne0 = a->ne[0];
    parallel_for(c, oomb_nelements(ids), ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const int64_t i = r % ids->ne[0], j = r / ids->ne[0];
            const int32_t id = *(const int32_t *) elem_ptr(ids, i, j, 0, 0);
            cvt_row((const char *) a->data + id * (int64_t) a->nb[1], (int64_t) a->nb[0], a->type,
                    (char *) elem_ptr(dst, 0, i, j, 0), (int64_t) dst->nb[0], OOMB_TYPE_F32, ne0);
        }
    });
}

// get_rows_back: zero dst [n_embd, n_rows], then dst[:, ids[i, j]] += dy[:, i, j]. Threads split the
// embedding columns, so duplicate ids never race and the summation order is fixed.
void compute_forward_get_rows_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * dy, const oomb_tensor * ids) {
    const int64_t ne0 = dst->ne[0];
    if (dy->ne[0] != ne0 || dy->ne[1] != ids->ne[0] || dy->ne[2] != ids->ne[1] || dy->ne[3] != 1) {
        oomb_error("get_rows_back: dy %s does not match ids %s and result %s", shape_str(dy).c_str(), shape_str(ids).c_str(), shape_str(dst).c_str());
    }
    check_ids("get_rows_back", ids, dst->ne[1], dst);
    const int64_t n_ids = oomb_nelements(ids);
    const int64_t block = 64;
    const int64_t n_blocks = (ne0 + block - 1) / block;
    parallel_for(c, n_blocks, block * (n_ids + dst->ne[1]), [&](int64_t b0, int64_t b1, int) {
        const int64_t c0 = b0 * block, c1 = std::min(ne0, b1 * block);
        for (int64_t r = 0; r < dst->ne[1]; r++) {
            for (int64_t k = c0; k < c1; k++) *(float *) elem_ptr(dst, k, r, 0, 0) = 0.0f;
        }
        const int64_t sy = (int64_t) dy->nb[0];
        for (int64_t q = 0; q < n_ids; q++) {
            const int64_t i = q % ids->ne[0], j = q / ids->ne[0];
            const int32_t id = *(const int32_t *) elem_ptr(ids, i, j, 0, 0);
            float * d = (float *) elem_ptr(dst, 0, id, 0, 0);
            const char * y = (const char *) elem_ptr(dy, 0, i, j, 0);
            if (sy == 4) {
                const float * yf = (const float *) y;
                for (int64_t k = c0; k < c1; k++) d[k] += yf[k];
            } else {
                for (int64_t k = c0; k < c1; k++) d[k] += *(const float *) (y + k * sy);
            }
        }
    });
}

} // namespace cpu
} // namespace oomb
