// CPU kernels: one compute_forward_<op> per op of enum oomb_op (except CUSTOM).
//
// Conventions:
//   - Every kernel is called on the main thread. It validates what it needs (ids, labels, strides)
//     there, reporting problems through oomb_error, and then splits its rows over the thread pool
//     with parallel_for. Nothing inside a parallel region reports errors or allocates.
//   - Sources are "prepared" first (oomb::prepare_sources, op-checks.h): a source that overlaps the destination with a
//     different layout, or a row-op source whose rows are not unit-stride, is copied to a contiguous
//     scratch. So in-place execution (dst->data == src0->data, same layout) is always correct, and
//     row kernels can assume nb0 == sizeof(float) while honoring nb1..nb3.
//   - Results are independent of the thread count: reductions use fixed per-row partials summed in
//     order on the main thread.
//   - Matrix products go through OpenBLAS cblas_sgemm, called from the main thread only.

#include "ops-cpu.h"
#include "op-checks.h"
#include "cpu/paged-attn.h"
#include "fp16.h"
#include "sround.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

extern "C" void openblas_set_num_threads(int num_threads);

// The build uses -O2; the kernels' inner loops only vectorize well at -O3 (GCC's -O2 cost model
// rejects most of them), and loops with float selects (exp_f, max_f) only without trapping math
// (which changes no result: it only drops the promise to keep floating-point exception flags).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-trapping-math")
#endif

// after the pragma, so exp_f gets the same optimisation attributes and inlines into the kernels
#include "vec-math.h"

using oomb::shape_str;

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Scratch memory
// ---------------------------------------------------------------------------------------------

scratch_buf::~scratch_buf() { free(p); }

void * scratch_buf::get(size_t bytes) {
    if (bytes <= cap && p) return p;
    free(p);
    size_t sz = (std::max<size_t>(bytes, 64) + 63) & ~(size_t) 63;
    sz += sz / 4; // some headroom for slowly growing requests
    sz = (sz + 63) & ~(size_t) 63;
    p = aligned_alloc(64, sz);
    if (!p) {
        cap = 0;
        oomb_error("cpu backend: out of memory allocating %zu bytes of scratch", sz);
    }
    cap = sz;
    return p;
}

void exec_ctx::reserve_thread_scratch(size_t bytes) {
    if (tscratch.size() < (size_t) n_threads) tscratch.resize((size_t) n_threads);
    for (auto & s : tscratch) s.get(bytes);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const int N_PREP_SLOTS_END = OOMB_MAX_SRC; // slots [0, OOMB_MAX_SRC) hold prepared sources; kernels use the next ones
static_assert(OOMB_MAX_SRC + 7 <= exec_ctx::N_SLOTS, "kernels use scratch slots up to N_PREP_SLOTS_END + 6 (linear_cross_entropy)");

// Calls f(begin, end, ith) over [0, n) split into chunks that the threads take in turn (a few
// chunks per thread, so rows of uneven cost, as in causal attention, balance out). Each item is
// computed by exactly one call, so results do not depend on the thread count.
// cost: rough work per item (elements touched), to keep tiny ops on the main thread.
template <class F>
void parallel_for(exec_ctx & c, int64_t n, int64_t cost, F && f) {
    if (n <= 0) return;
    const int nth = c.n_threads;
    if (nth <= 1 || n == 1 || n * std::max<int64_t>(cost, 1) < c.min_parallel_work) {
        f((int64_t) 0, n, 0);
        return;
    }
    struct arg_t {
        F * f;
        int64_t n;
        int64_t chunk;
        std::atomic<int64_t> next;
    } arg;
    arg.f = &f;
    arg.n = n;
    arg.chunk = std::max<int64_t>(1, n / ((int64_t) nth * 4));
    arg.next.store(0, std::memory_order_relaxed);
    c.pool->run(
        [](void * p, int ith, int) {
            auto * a = (arg_t *) p;
            for (;;) {
                const int64_t b = a->next.fetch_add(a->chunk, std::memory_order_relaxed);
                if (b >= a->n) break;
                (*a->f)(b, std::min(a->n, b + a->chunk), ith);
            }
        },
        &arg);
}

inline size_t tsize(oomb_type t) { return oomb_type_size(t); }

inline float load_f32(const void * p, oomb_type t) {
    switch (t) {
        case OOMB_TYPE_F32: return *(const float *) p;
        case OOMB_TYPE_F16: return fp16_to_fp32(*(const uint16_t *) p);
        case OOMB_TYPE_BF16: return bf16_to_fp32(*(const uint16_t *) p);
        default: return (float) *(const int32_t *) p;
    }
}

// Row (i1, i2, i3) of t from a flat row index r.
inline void row_index(const oomb_tensor * t, int64_t r, int64_t & i1, int64_t & i2, int64_t & i3) {
    i1 = r % t->ne[1];
    r /= t->ne[1];
    i2 = r % t->ne[2];
    i3 = r / t->ne[2];
}
inline char * row_ptr(const oomb_tensor * t, int64_t i1, int64_t i2, int64_t i3) {
    return (char *) t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
inline char * row_ptr(const oomb_tensor * t, int64_t r) {
    int64_t i1, i2, i3;
    row_index(t, r, i1, i2, i3);
    return row_ptr(t, i1, i2, i3);
}
// Element at flat (logical-order) index i of t.
inline char * flat_ptr(const oomb_tensor * t, int64_t i) {
    const int64_t i0 = i % t->ne[0]; i /= t->ne[0];
    const int64_t i1 = i % t->ne[1]; i /= t->ne[1];
    const int64_t i2 = i % t->ne[2]; i /= t->ne[2];
    return (char *) elem_ptr(t, i0, i1, i2, i);
}
inline float flat_f32(const oomb_tensor * t, int64_t i) { return load_f32(flat_ptr(t, i), t->type); }
inline int32_t flat_i32(const oomb_tensor * t, int64_t i) { return *(const int32_t *) flat_ptr(t, i); }

// Sums with 4 independent double accumulators (precise, and faster than one serial chain).
inline double sum_d(const float * x, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) { s0 += x[i]; s1 += x[i + 1]; s2 += x[i + 2]; s3 += x[i + 3]; }
    for (; i < n; i++) s0 += x[i];
    return (s0 + s1) + (s2 + s3);
}
inline double dot_d(const float * x, const float * y, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double) x[i] * y[i];
        s1 += (double) x[i + 1] * y[i + 1];
        s2 += (double) x[i + 2] * y[i + 2];
        s3 += (double) x[i + 3] * y[i + 3];
    }
    for (; i < n; i++) s0 += (double) x[i] * y[i];
    return (s0 + s1) + (s2 + s3);
}


// Maximum of x[0..n) (-inf when n == 0), with independent lanes so it vectorizes.
inline float max_f(const float * x, int64_t n) {
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = -INFINITY;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) m[k] = m[k] > x[i + k] ? m[k] : x[i + k];
    }
    for (; i < n; i++) m[0] = m[0] > x[i] ? m[0] : x[i];
    float r = m[0];
    for (int k = 1; k < 8; k++) r = r > m[k] ? r : m[k];
    return r;
}

inline void set_contiguous_strides(oomb_tensor * t) {
    t->nb[0] = tsize(t->type);
    for (int i = 1; i < 4; i++) t->nb[i] = t->nb[i - 1] * (size_t) t->ne[i - 1];
}

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
void cvt_loop(const char * s, int64_t ss, char * d, int64_t ds, int64_t n) {
    for (int64_t i = 0; i < n; i++) st<D>(d + i * ds, ld<S>(s + i * ss));
}

// Converts n elements (strides ss, ds in bytes). Types: equal, or both float types.
void cvt_row(const char * s, int64_t ss, oomb_type st_, char * d, int64_t ds, oomb_type dt, int64_t n) {
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

// Copies src into dst element by element in logical order (same element count; shapes may
// differ), converting the type. Any strides on both sides.
void copy_tensor(exec_ctx & c, const oomb_tensor * src, const oomb_tensor * dst) {
    const int64_t n = oomb_nelements(src);
    if (n == 0) return;
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

// cont: contiguous copy of src[0] in logical order (same type; dst may have another shape).
void compute_forward_cont(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    oomb::check_copy_operands("cont", a, dst, true);
    copy_tensor(c, a, dst);
}

// cpy: src[0] -> dst (a view of src[1]), converting the type; element order = logical order.
void compute_forward_cpy(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    oomb::check_copy_operands("cpy", a, dst, false);
    copy_tensor(c, a, dst);
}

// cast: new contiguous tensor of another type.
void compute_forward_cast(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    oomb::check_copy_operands("cast", a, dst, false);
    copy_tensor(c, a, dst);
}

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
void binary_rows(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b, OP op) {
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
void unary_rows(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, OP op) {
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

void check_broadcast(const char * op, const oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    bool ok = oomb_are_same_shape(dst, a);
    for (int i = 0; i < 4 && ok; i++) ok = b->ne[i] > 0 ? a->ne[i] % b->ne[i] == 0 : a->ne[i] == 0;
    if (!ok) oomb_error("%s: b %s cannot be broadcast to a %s (result %s)", op, shape_str(b).c_str(), shape_str(a).c_str(), shape_str(dst).c_str());
}
void check_same_shape(const char * op, const oomb_tensor * a, const oomb_tensor * b) {
    if (!oomb_are_same_shape(a, b)) oomb_error("%s: shapes differ: %s vs %s", op, shape_str(a).c_str(), shape_str(b).c_str());
}
void compute_forward_add(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    check_broadcast(oomb_op_name(dst->op), dst, a, b);
    binary_rows(c, dst, a, b, [](float x, float y) { return x + y; });
}
void compute_forward_sub(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    check_broadcast("sub", dst, a, b);
    binary_rows(c, dst, a, b, [](float x, float y) { return x - y; });
}
// A bf16 result (oomb_mul_ext, oomb_swiglu_ext): f(tmp) on a contiguous f32 stand-in in scratch,
// then rounded into dst. f32: f(dst).
template <class F>
void via_f32_result(exec_ctx & c, oomb_tensor * dst, F f) {
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
    check_broadcast("mul", dst, a, b);
    via_f32_result(c, dst, [&](oomb_tensor * d) { binary_rows(c, d, a, b, [](float x, float y) { return x * y; }); });
}
// add_inplace: dst (a view of src[0]) += src[1] broadcast.
void compute_forward_add_inplace(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    compute_forward_add(c, dst, a, b);
}

void compute_forward_scale(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    check_same_shape("scale", dst, a);
    const float s = get_op_f32(dst, 0);
    unary_rows(c, dst, a, [s](float x) { return x * s; });
}

inline float silu_f(float x) { return x / (1.0f + exp_f(-x)); }

void compute_forward_silu(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    check_same_shape("silu", dst, a);
    unary_rows(c, dst, a, [](float x) { return silu_f(x); });
}
// silu_back: dx = dy * s * (1 + x * (1 - s)), s = sigmoid(x); x = src[0], dy = src[1].
void compute_forward_silu_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    check_same_shape("silu_back", dst, x);
    check_same_shape("silu_back", dst, dy);
    binary_rows(c, dst, x, dy, [](float xv, float g) {
        const float s = 1.0f / (1.0f + exp_f(-xv));
        return g * s * (1.0f + xv * (1.0f - s));
    });
}
// swiglu: silu(gate) * up.
void compute_forward_swiglu(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * gate, const oomb_tensor * up) {
    check_same_shape("swiglu", dst, gate);
    check_same_shape("swiglu", dst, up);
    via_f32_result(c, dst, [&](oomb_tensor * d) { binary_rows(c, d, gate, up, [](float g, float u) { return silu_f(g) * u; }); });
}
// swiglu_back: [dgate; dup] (dst [ne0, ne1, ne2, 2 ne3], contiguous) from gate, up, dy (any strides).
void compute_forward_swiglu_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u, const oomb_tensor * dy) {
    check_same_shape("swiglu_back", g, u);
    check_same_shape("swiglu_back", g, dy);
    if (!oomb_is_contiguous(dst) || dst->ne[0] != g->ne[0] || dst->ne[1] != g->ne[1] || dst->ne[2] != g->ne[2] || dst->ne[3] != 2 * g->ne[3])
        oomb_error("swiglu_back: result %s must be contiguous [%s with ne3 doubled]", shape_str(dst).c_str(), shape_str(g).c_str());
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
void compute_forward_sum(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    const int64_t nrows = oomb_nrows(a), ne0 = a->ne[0];
    const bool sq = dst->op == OOMB_OP_SUM_SQ;
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
    if (dst->op == OOMB_OP_MEAN) total /= (double) oomb_nelements(a);
    *(float *) dst->data = (float) total;
}

// ---------------------------------------------------------------------------------------------
// Embeddings
// ---------------------------------------------------------------------------------------------

void check_ids(const char * op, const oomb_tensor * ids, int64_t n_rows, const oomb_tensor * table) {
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

// ---------------------------------------------------------------------------------------------
// Matrix product (OpenBLAS)
// ---------------------------------------------------------------------------------------------

// How a matrix operand is passed to sgemm: as stored rows (ld >= cols), transposed storage, or a copy.
enum mat_mode { MAT_ROWS, MAT_COLS, MAT_COPY };

// t is [K, R, ...] (K elements per row, R rows). Decides how sgemm can read one 2-D slice.
mat_mode classify(const oomb_tensor * t, int64_t K, int64_t R, int64_t & ld) {
    if (t->type != OOMB_TYPE_F32) return MAT_COPY;
    const size_t e = 4;
    if ((K <= 1 || t->nb[0] == e) && t->nb[1] % e == 0) {
        ld = R <= 1 ? std::max<int64_t>(K, 1) : (int64_t) (t->nb[1] / e);
        if (ld >= std::max<int64_t>(K, 1)) return MAT_ROWS;
    }
    if ((R <= 1 || t->nb[1] == e) && t->nb[0] % e == 0) {
        ld = K <= 1 ? std::max<int64_t>(R, 1) : (int64_t) (t->nb[0] / e);
        if (ld >= std::max<int64_t>(R, 1)) return MAT_COLS;
    }
    return MAT_COPY;
}

// Contiguous f32 copy of rows [r0, r0 + nr) of the 2-D slice (i2, i3) of t into scratch slot `slot`.
const float * rows_to_f32(exec_ctx & c, const oomb_tensor * t, int64_t i2, int64_t i3, int64_t r0, int64_t nr, int slot) {
    oomb_tensor src = *t;
    src.ne[1] = nr;
    src.ne[2] = src.ne[3] = 1;
    src.data = (char *) t->data + i2 * t->nb[2] + i3 * t->nb[3] + r0 * t->nb[1];
    oomb_tensor d = src;
    d.type = OOMB_TYPE_F32;
    set_contiguous_strides(&d);
    d.data = c.slot(slot, (size_t) oomb_nelements(&d) * 4);
    copy_tensor(c, &src, &d);
    return (const float *) d.data;
}
// Contiguous f32 copy of all of t into scratch slot `slot`.
const float * tensor_to_f32(exec_ctx & c, const oomb_tensor * t, int slot) {
    oomb_tensor d = *t;
    d.type = OOMB_TYPE_F32;
    set_contiguous_strides(&d);
    d.data = c.slot(slot, (size_t) oomb_nelements(&d) * 4);
    copy_tensor(c, t, &d);
    return (const float *) d.data;
}

// mul_mat: res[n][m] = sum_k a[m][k] * b[n][k], i.e. C[N x M] = B[N x K] * A[M x K]^T per batch,
// a broadcast over b's batch dims. Operands are read in place when sgemm can (unit stride in dim 0
// or dim 1); otherwise (f16 / bf16 a, other strides) they are converted to f32 first, a in blocks
// of rows so the scratch stays small for large weights.
void compute_forward_mul_mat(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t A2 = a->ne[2], A3 = a->ne[3], B2 = b->ne[2], B3 = b->ne[3];
    if (a->type == OOMB_TYPE_I32 || b->type == OOMB_TYPE_I32 || b->ne[0] != K || A2 <= 0 || A3 <= 0 || B2 % A2 != 0 ||
        B3 % A3 != 0 || dst->ne[0] != M || dst->ne[1] != N || dst->ne[2] != B2 || dst->ne[3] != B3) {
        oomb_error("mul_mat: invalid operands a %s, b %s, result %s", shape_str(a).c_str(), shape_str(b).c_str(), shape_str(dst).c_str());
    }
    if (!oomb_is_contiguous(dst)) oomb_error("mul_mat: result %s must be contiguous", shape_str(dst).c_str());
    if (oomb_nelements(dst) == 0) return;
    if (K == 0) { memset(dst->data, 0, oomb_nbytes(dst)); return; }
    oomb_tensor b32;
    if (b->type != OOMB_TYPE_F32) {
        // f16 / bf16 b (oomb_mul_ext, oomb_swiglu_ext results): a contiguous f32 copy (slot N_PREP_SLOTS_END + 1,
        // b's; a contiguous f32 b is never copied again below)
        b32 = *b;
        b32.type = OOMB_TYPE_F32;
        b32.view_src = nullptr;
        set_contiguous_strides(&b32);
        b32.data = (void *) tensor_to_f32(c, b, N_PREP_SLOTS_END + 1);
        b = &b32;
    }
    if (K > INT_MAX || M > INT_MAX || N * B2 * B3 > INT_MAX) {
        oomb_error("mul_mat: sizes exceed sgemm's int range: a %s, b %s", shape_str(a).c_str(), shape_str(b).c_str());
    }
    set_blas_threads(c.n_threads);
    const int64_t r2 = B2 / A2, r3 = B3 / A3;

    int64_t lda = 0, ldb = 0;
    const mat_mode am = classify(a, K, M, lda);
    const mat_mode bm = classify(b, K, N, ldb);

    // rows of a converted per block (about 16 MiB of f32)
    const int64_t mb = std::max<int64_t>(16, ((int64_t) 4 << 20) / K);
    int64_t cached_a2 = -1, cached_a3 = -1;
    const float * cached = nullptr;

    // C[NN x M] (row stride M) = op(B) * A(a2, a3)^T
    auto gemm = [&](const float * bp, int64_t ldbb, CBLAS_TRANSPOSE tb, int64_t NN, int64_t a2, int64_t a3, float * cp) {
        if (am != MAT_COPY) {
            const float * ap = (const float *) ((const char *) a->data + a2 * a->nb[2] + a3 * a->nb[3]);
            cblas_sgemm(CblasRowMajor, tb, am == MAT_COLS ? CblasNoTrans : CblasTrans, (int) NN, (int) M, (int) K, 1.0f, bp,
                        (int) ldbb, ap, (int) lda, 0.0f, cp, (int) M);
            return;
        }
        for (int64_t m0 = 0; m0 < M; m0 += mb) {
            const int64_t mc = std::min(mb, M - m0);
            const float * ap;
            if (mc == M && cached && cached_a2 == a2 && cached_a3 == a3) {
                ap = cached;
            } else {
                ap = rows_to_f32(c, a, a2, a3, m0, mc, N_PREP_SLOTS_END);
                if (mc == M) { cached = ap; cached_a2 = a2; cached_a3 = a3; }
            }
            cblas_sgemm(CblasRowMajor, tb, CblasTrans, (int) NN, (int) mc, (int) K, 1.0f, bp, (int) ldbb, ap, (int) K, 0.0f,
                        cp + m0, (int) M);
        }
    };

    if (A2 == 1 && A3 == 1) {
        // One product over all of b's rows when they are evenly spaced (or after copying b).
        const int64_t NN = N * B2 * B3;
        const int64_t rs = N > 1 ? (int64_t) b->nb[1] : B2 > 1 ? (int64_t) b->nb[2] : (int64_t) b->nb[3];
        bool flat = (K <= 1 || b->nb[0] == 4) && rs % 4 == 0 && (N == 1 || (int64_t) b->nb[1] == rs) &&
                    (B2 == 1 || (int64_t) b->nb[2] == N * rs) && (B3 == 1 || (int64_t) b->nb[3] == B2 * N * rs);
        int64_t ldbb = NN <= 1 ? K : rs / 4;
        if (ldbb < K) flat = false;
        if (flat || bm == MAT_COPY) {
            const float * bp = (const float *) b->data;
            if (!flat) { bp = tensor_to_f32(c, b, N_PREP_SLOTS_END + 1); ldbb = K; }
            gemm(bp, ldbb, CblasNoTrans, NN, 0, 0, (float *) dst->data);
            return;
        }
    }

    for (int64_t i3 = 0; i3 < B3; i3++) {
        for (int64_t i2 = 0; i2 < B2; i2++) {
            const float * bp;
            int64_t ldbb = ldb;
            CBLAS_TRANSPOSE tb = bm == MAT_COLS ? CblasTrans : CblasNoTrans;
            if (bm == MAT_COPY) {
                bp = rows_to_f32(c, b, i2, i3, 0, N, N_PREP_SLOTS_END + 1);
                ldbb = K;
                tb = CblasNoTrans;
            } else {
                bp = (const float *) ((const char *) b->data + i2 * b->nb[2] + i3 * b->nb[3]);
            }
            float * cp = (float *) ((char *) dst->data + i2 * dst->nb[2] + i3 * dst->nb[3]);
            gemm(bp, ldbb, tb, N, i2 / r2, i3 / r3, cp);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

// rms_norm: y = x / sqrt(mean(x^2) + eps), per row (sum of squares in double).
void compute_forward_rms_norm(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a) {
    check_same_shape("rms_norm", dst, a);
    const double eps = get_op_f32(dst, 0);
    const int64_t ne0 = a->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(a), ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const float * x = (const float *) row_ptr(a, r);
            float * y = (float *) row_ptr(dst, r);
            const double ss = dot_d(x, x, ne0);
            const float s = (float) (1.0 / std::sqrt(ss / (double) ne0 + eps));
            for (int64_t i = 0; i < ne0; i++) y[i] = x[i] * s;
        }
    });
}

// rms_norm_back: dx = s*dy - s^3/n * x * sum(x*dy), s = 1/sqrt(mean(x^2) + eps).
void compute_forward_rms_norm_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy) {
    check_same_shape("rms_norm_back", dst, x);
    check_same_shape("rms_norm_back", dst, dy);
    const double eps = get_op_f32(dst, 0);
    const int64_t ne0 = x->ne[0];
    if (ne0 == 0) return;
    parallel_for(c, oomb_nrows(x), 2 * ne0, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const float * xr = (const float *) row_ptr(x, r);
            const float * g = (const float *) row_ptr(dy, r);
            float * d = (float *) row_ptr(dst, r);
            const double ss = dot_d(xr, xr, ne0);
            const double xg = dot_d(xr, g, ne0);
            const double s = 1.0 / std::sqrt(ss / (double) ne0 + eps);
            const float c1 = (float) s;
            const float c2 = (float) (s * s * s / (double) ne0 * xg);
            for (int64_t i = 0; i < ne0; i++) d[i] = c1 * g[i] - c2 * xr[i];
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding (NEOX layout)
// ---------------------------------------------------------------------------------------------

// rope / rope_back: per token t (dim 2) and head (dim 1), for i < n_dims/2 with angle
// pos[t] * theta^(-2i/n_dims) (computed in double): y[i] = x0 cos - x1 sin, y[i + n_dims/2] =
// x0 sin + x1 cos, with x0 = x[i], x1 = x[i + n_dims/2]; rope_back rotates by -angle.
void compute_forward_rope(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * pos) {
    const char * opn = oomb_op_name(dst->op);
    check_same_shape(opn, dst, a);
    const int n_dims = dst->op_params[0];
    const double theta = get_op_f32(dst, 1);
    const int64_t ne0 = a->ne[0];
    if (pos->type != OOMB_TYPE_I32 || oomb_nelements(pos) != a->ne[2]) {
        oomb_error("%s: pos %s must be i32 with one entry per token of %s", opn, shape_str(pos).c_str(), shape_str(a).c_str());
    }
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > ne0) oomb_error("%s: n_dims = %d invalid for %s", opn, n_dims, shape_str(a).c_str());
    const int64_t half = n_dims / 2;
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
                    const double ang = p * std::pow(theta, -2.0 * (double) i / (double) n_dims);
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
    check_same_shape("soft_max", dst, a);
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
    check_same_shape("soft_max_back", dst, y);
    check_same_shape("soft_max_back", dst, dy);
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

// ---------------------------------------------------------------------------------------------
// Attention (reference, GQA, causal)
// ---------------------------------------------------------------------------------------------

struct attn_dims {
    int64_t D, H, T, B, Hkv, S, G; // G = H / Hkv
};

attn_dims check_attn(const char * op, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v) {
    attn_dims d{q->ne[0], q->ne[1], q->ne[2], q->ne[3], k->ne[1], k->ne[2], 0};
    if (q->type != OOMB_TYPE_F32 || k->type != OOMB_TYPE_F32 || v->type != OOMB_TYPE_F32 || k->ne[0] != d.D ||
        !oomb_are_same_shape(k, v) || d.Hkv <= 0 || d.H % d.Hkv != 0 || k->ne[3] != d.B || d.S < d.T) {
        oomb_error("%s: invalid q %s, k %s, v %s", op, shape_str(q).c_str(), shape_str(k).c_str(), shape_str(v).c_str());
    }
    d.G = d.H / d.Hkv;
    return d;
}

inline const float * row4(const oomb_tensor * t, int64_t i1, int64_t i2, int64_t i3) {
    return (const float *) row_ptr(t, i1, i2, i3);
}

// attn: out[:, h, t, b] = sum_j softmax_j(scale * q.k_j) v_j over keys j <= t + (S - T) of kv head h / G.
void compute_forward_attn(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v) {
    const attn_dims d = check_attn("attn", q, k, v);
    check_same_shape("attn", dst, q);
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
    const attn_dims d = check_attn("attn_back", q, k, v);
    check_same_shape("attn_back", q, dout);
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
// Cross-entropy
// ---------------------------------------------------------------------------------------------

// Reads and validates nrows labels (classes [0, V)) into slot; returns the count of counted rows.
// Errors name `what` (the logits, or the weight of a fused head) with the tensor `ref`.
const int32_t * read_labels_v(exec_ctx & c, const char * op, int64_t nrows, int64_t V, const oomb_tensor * labels, int32_t ignore,
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
const int32_t * read_labels(exec_ctx & c, const char * op, const oomb_tensor * logits, const oomb_tensor * labels,
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

lce_dims lce_check(const char * op, const oomb_tensor * w, const oomb_tensor * x) {
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
const float * lce_x(exec_ctx & c, const oomb_tensor * x) {
    if (oomb_is_contiguous(x)) return (const float *) x->data;
    return tensor_to_f32(c, x, LCE_SLOT_X);
}

// Rows [v0, v0 + n) of w as a row-major f32 matrix with leading dimension ld: in place when w is
// f32 with unit-stride rows, else converted.
const float * lce_w_rows(exec_ctx & c, const oomb_tensor * w, int64_t v0, int64_t n, int64_t & ld) {
    const int64_t E = w->ne[0];
    if (w->type == OOMB_TYPE_F32 && (E <= 1 || w->nb[0] == 4) && w->nb[1] % 4 == 0) {
        ld = n <= 1 ? E : (int64_t) (w->nb[1] / 4);
        if (ld >= E) return (const float *) ((const char *) w->data + v0 * w->nb[1]);
    }
    ld = E;
    return rows_to_f32(c, w, 0, 0, v0, n, LCE_SLOT_W);
}

// C[N x n] (row stride n) = X W[v0 .. v0+n)^T. Returns W's tile (and its ld) for the backward.
const float * lce_logits(exec_ctx & c, const oomb_tensor * w, const float * X, const lce_dims & d, int64_t v0, int64_t n, float * C,
                         int64_t & ldw) {
    const float * W = lce_w_rows(c, w, v0, n, ldw);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int) d.N, (int) n, (int) d.E, 1.0f, X, (int) d.E, W, (int) ldw, 0.0f, C,
                (int) n);
    return W;
}

// Every row's log-sum-exp over all V classes, in double, into lse[N]; with picked != NULL also the
// label's logit of each row whose label is in [0, V).
void lce_lse_pass(exec_ctx & c, const oomb_tensor * w, const float * X, const lce_dims & d, int64_t vt, const int32_t * lab,
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

// ---------------------------------------------------------------------------------------------
// Optimizers
// ---------------------------------------------------------------------------------------------

void check_opt(const char * op, const oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * const * others, int n_others,
               const oomb_tensor * hp, int64_t n_hp) {
    bool ok = (p->type == OOMB_TYPE_F32 || p->type == OOMB_TYPE_BF16) && oomb_is_contiguous(p) && dst->data == p->data &&
              dst->type == p->type && oomb_are_same_shape(dst, p) && hp->type == OOMB_TYPE_F32 && oomb_nelements(hp) == n_hp;
    for (int i = 0; i < n_others && ok; i++) {
        ok = others[i]->type == OOMB_TYPE_F32 && oomb_is_contiguous(others[i]) && oomb_are_same_shape(others[i], p);
    }
    if (!ok) oomb_error("%s: invalid operands: param %s (result %s), hp %s", op, shape_str(p).c_str(), shape_str(dst).c_str(), shape_str(hp).c_str());
}

// adamw_step (in place): g = grad*gs; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// param -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * param).
void compute_forward_adamw_step(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad,
                                const oomb_tensor * m, const oomb_tensor * v, const oomb_tensor * hp) {
    const oomb_tensor * others[1] = {grad};
    const int64_t n_hp = oomb_nelements(hp);
    if (n_hp != 8 && n_hp != 9) oomb_error("adamw_step: hp %s must have 8 or 9 elements", shape_str(hp).c_str());
    check_opt("adamw_step", dst, p, others, 1, hp, n_hp);
    const bool sbf = m->type == OOMB_TYPE_BF16;  // bf16 moments (stochastic rounding, sround.h)
    if (sbf && n_hp != 9) oomb_error("adamw_step: bf16 moments need hp[8] (the step number, the stochastic-rounding seed)");
    if (!((m->type == OOMB_TYPE_F32 || sbf) && v->type == m->type && oomb_is_contiguous(m) && oomb_is_contiguous(v) &&
          oomb_are_same_shape(m, p) && oomb_are_same_shape(v, p)))
        oomb_error("adamw_step: m %s and v %s must be contiguous, both f32 or both bf16, shaped like param %s", shape_str(m).c_str(),
                   shape_str(v).c_str(), shape_str(p).c_str());
    float h[8];
    for (int i = 0; i < 8; i++) h[i] = flat_f32(hp, i);
    const float lr = h[0], b1 = h[1], b2 = h[2], eps = h[3], wd = h[4], gs = h[5], bc1 = h[6], bc2 = h[7];
    const bool bf = p->type == OOMB_TYPE_BF16;
    float * gp = (float *) grad->data;
    float * mp = (float *) m->data;
    float * vp = (float *) v->data;
    uint16_t * mh = (uint16_t *) m->data;
    uint16_t * vh = (uint16_t *) v->data;
    const uint32_t salt = sbf ? sr_salt(flat_f32(hp, 8)) : 0u;
    const int64_t n = oomb_nelements(p);
    const int64_t block = 4096;
    const float * ps = (const float *) p->data;
    const uint16_t * ph = (const uint16_t *) p->data;
    float * pd = (float *) dst->data;
    uint16_t * pdh = (uint16_t *) dst->data;
    parallel_for(c, (n + block - 1) / block, block, [&](int64_t blk0, int64_t blk1, int) {
        // locals: captured floats would be reloaded after every float store
        const float lr_ = lr, b1_ = b1, b2_ = b2, eps_ = eps, wd_ = wd, gs_ = gs, bc1_ = bc1, bc2_ = bc2;
        const int64_t i0 = blk0 * block, i1 = std::min(n, blk1 * block);
        auto upd = [&](int64_t i, float w) {
            const float g = gp[i] * gs_;
            float mi, vi;
            if (sbf) {
                mi = b1_ * bf16_to_fp32(mh[i]) + (1.0f - b1_) * g;
                vi = b2_ * bf16_to_fp32(vh[i]) + (1.0f - b2_) * g * g;
                mh[i] = sr_bf16_bits(f32_bits(mi), (uint32_t) i, salt);
                vh[i] = sr_bf16_bits(f32_bits(vi), (uint32_t) i, salt ^ 0x5bd1e995u);
            } else {
                mi = b1_ * mp[i] + (1.0f - b1_) * g;
                vi = b2_ * vp[i] + (1.0f - b2_) * g * g;
                mp[i] = mi;
                vp[i] = vi;
            }
            return w - lr_ * ((mi / bc1_) / (std::sqrt(vi / bc2_) + eps_) + wd_ * w);
        };
        if (bf) for (int64_t i = i0; i < i1; i++) pdh[i] = fp32_to_bf16(upd(i, bf16_to_fp32(ph[i])));
        else    for (int64_t i = i0; i < i1; i++) pd[i] = upd(i, ps[i]);
    });
}

// sgd_step (in place): param -= lr * (grad * gs + wd * param).
void compute_forward_sgd_step(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * hp) {
    const oomb_tensor * others[1] = {grad};
    check_opt("sgd_step", dst, p, others, 1, hp, 3);
    const float lr = flat_f32(hp, 0), wd = flat_f32(hp, 1), gs = flat_f32(hp, 2);
    const bool bf = p->type == OOMB_TYPE_BF16;
    const float * gp = (const float *) grad->data;
    const int64_t n = oomb_nelements(p);
    const int64_t block = 4096;
    const float * ps = (const float *) p->data;
    const uint16_t * ph = (const uint16_t *) p->data;
    float * pd = (float *) dst->data;
    uint16_t * pdh = (uint16_t *) dst->data;
    parallel_for(c, (n + block - 1) / block, block, [&](int64_t blk0, int64_t blk1, int) {
        const float lr_ = lr, wd_ = wd, gs_ = gs;
        const int64_t i0 = blk0 * block, i1 = std::min(n, blk1 * block);
        if (bf) for (int64_t i = i0; i < i1; i++) { const float w = bf16_to_fp32(ph[i]); pdh[i] = fp32_to_bf16(w - lr_ * (gp[i] * gs_ + wd_ * w)); }
        else    for (int64_t i = i0; i < i1; i++) { const float w = ps[i]; pd[i] = w - lr_ * (gp[i] * gs_ + wd_ * w); }
    });
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------



} // namespace

static int g_blas_threads = -1;

void set_blas_threads(int n) {
    if (g_blas_threads != n) {
        openblas_set_num_threads(n);
        g_blas_threads = n;
    }
}

void compute_forward(exec_ctx & c, oomb_tensor * node) {
    const enum oomb_op op = node->op;
    switch (op) {
        case OOMB_OP_NONE: case OOMB_OP_VIEW: case OOMB_OP_RESHAPE: case OOMB_OP_PERMUTE: case OOMB_OP_TRANSPOSE:
            return;
        case OOMB_OP_CUSTOM: case OOMB_OP_COUNT:
            oomb_error("graph_compute: node %s: op %s is not supported by the CPU backend", shape_str(node).c_str(), oomb_op_name(op));
        case OOMB_OP_PAGED_ATTN: // kernels in cpu/paged-attn.cpp (they read node->src themselves; the forward may write the pools)
            oomb::cpu_paged_attn(node, c.n_threads);
            return;
        case OOMB_OP_PAGED_ATTN_BACK:
            oomb::cpu_paged_attn_back(node, c.n_threads);
            return;
        default:
            break;
    }
    // result layout, sources prepared (in-place safety, unit-stride rows where needed), checked
    oomb_tensor srcs[OOMB_MAX_SRC];
    const oomb_tensor * s[OOMB_MAX_SRC] = {nullptr};
    oomb::prepare_sources(node, srcs, s, [&](const oomb_tensor * t, int slot, oomb_tensor * r) {
        r->data = c.slot(slot, oomb_nbytes(r));
        copy_tensor(c, t, r);
    });
    const char * opn = oomb_op_name(op);

    switch (op) {
        case OOMB_OP_CONT:          compute_forward_cont(c, node, s[0]); break;
        case OOMB_OP_CPY:           compute_forward_cpy(c, node, s[0]); break;
        case OOMB_OP_CAST:          compute_forward_cast(c, node, s[0]); break;
        case OOMB_OP_FILL:          compute_forward_fill(c, node); break;
        case OOMB_OP_ADD:           compute_forward_add(c, node, s[0], s[1]); break;
        case OOMB_OP_SUB:           compute_forward_sub(c, node, s[0], s[1]); break;
        case OOMB_OP_MUL:           compute_forward_mul(c, node, s[0], s[1]); break;
        case OOMB_OP_SCALE:         compute_forward_scale(c, node, s[0]); break;
        case OOMB_OP_ADD_INPLACE:   compute_forward_add_inplace(c, node, s[0], s[1]); break;
        case OOMB_OP_REPEAT:        compute_forward_repeat(c, node, s[0]); break;
        case OOMB_OP_REPEAT_BACK:   compute_forward_repeat_back(c, node, s[0]); break;
        case OOMB_OP_SILU:          compute_forward_silu(c, node, s[0]); break;
        case OOMB_OP_SILU_BACK:     compute_forward_silu_back(c, node, s[0], s[1]); break;
        case OOMB_OP_SWIGLU:        compute_forward_swiglu(c, node, s[0], s[1]); break;
        case OOMB_OP_SWIGLU_BACK:   compute_forward_swiglu_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_SUM: case OOMB_OP_MEAN: case OOMB_OP_SUM_SQ:
                                    compute_forward_sum(c, node, s[0]); break;
        case OOMB_OP_GET_ROWS:      compute_forward_get_rows(c, node, s[0], s[1]); break;
        case OOMB_OP_GET_ROWS_BACK: compute_forward_get_rows_back(c, node, s[0], s[1]); break;
        case OOMB_OP_MUL_MAT:       compute_forward_mul_mat(c, node, s[0], s[1]); break;
        case OOMB_OP_RMS_NORM:      compute_forward_rms_norm(c, node, s[0]); break;
        case OOMB_OP_RMS_NORM_BACK: compute_forward_rms_norm_back(c, node, s[0], s[1]); break;
        case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK:
                                    compute_forward_rope(c, node, s[0], s[1]); break;
        case OOMB_OP_SOFT_MAX:      compute_forward_soft_max(c, node, s[0]); break;
        case OOMB_OP_SOFT_MAX_BACK: compute_forward_soft_max_back(c, node, s[0], s[1]); break;
        case OOMB_OP_ATTN:          compute_forward_attn(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_ATTN_BACK:     compute_forward_attn_back(c, node, s[0], s[1], s[2], s[3]); break;
        case OOMB_OP_CROSS_ENTROPY: compute_forward_cross_entropy(c, node, s[0], s[1]); break;
        case OOMB_OP_CROSS_ENTROPY_BACK:
                                    compute_forward_cross_entropy_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_LINEAR_CROSS_ENTROPY:
                                    compute_forward_linear_cross_entropy(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_LINEAR_CROSS_ENTROPY_BACK:
                                    compute_forward_linear_cross_entropy_back(c, node, s[0], s[1], s[2], s[3], s[4]); break;
        case OOMB_OP_ADAMW_STEP:    compute_forward_adamw_step(c, node, s[0], s[1], s[2], s[3], s[4]); break;
        case OOMB_OP_SGD_STEP:      compute_forward_sgd_step(c, node, s[0], s[1], s[2]); break;
        default:
            oomb_error("graph_compute: node %s: op %s is not supported by the CPU backend", shape_str(node).c_str(), opn);
    }
}

} // namespace cpu
} // namespace oomb
