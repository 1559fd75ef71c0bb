// Internal to the CPU kernels (src/cpu/ops-*.cpp): their shared conventions, helpers and the
// declarations of the compute_forward_<op> kernels that ops-cpu.cpp dispatches to.
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
//
// Include this header first in a kernel file: it sets the optimisation level for what follows.
#pragma once

#include "ops-cpu.h"
#include "op-checks.h"
#include "fp16.h"
#include "formats/quants.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

// The build uses -O2; the kernels' inner loops only vectorize well at -O3 (GCC's -O2 cost model
// rejects most of them), and loops with float selects (exp_f, max_f) only without trapping math
// (which changes no result: it only drops the promise to keep floating-point exception flags).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-trapping-math")
#endif

// after the pragma, so exp_f gets the same optimisation attributes and inlines into the kernels
#include "vec-math.h"

namespace oomb {
namespace cpu {

using oomb::shape_str;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

constexpr int N_PREP_SLOTS_END = OOMB_MAX_SRC; // slots [0, OOMB_MAX_SRC) hold prepared sources; kernels use the next ones
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
    parallel_for(*c.pool, n, std::max<int64_t>(1, n / ((int64_t) nth * 4)), f);
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

inline void set_contiguous_strides(oomb_tensor * t) { set_contiguous_nb(t); }

// ---------------------------------------------------------------------------------------------
// Shared by several kernel files
// ---------------------------------------------------------------------------------------------

// Copies src into dst element by element in logical order (same element count; shapes may
// differ), converting the type. Any strides on both sides. (ops-elementwise.cpp)
void copy_tensor(exec_ctx & c, const oomb_tensor * src, const oomb_tensor * dst);
// Contiguous f32 copy of rows [r0, r0 + nr) of the 2-D slice (i2, i3) of t into scratch slot `slot`. (ops-matmul.cpp)
const float * rows_to_f32(exec_ctx & c, const oomb_tensor * t, int64_t i2, int64_t i3, int64_t r0, int64_t nr, int slot);
// Contiguous f32 copy of all of t into scratch slot `slot`. (ops-matmul.cpp)
const float * tensor_to_f32(exec_ctx & c, const oomb_tensor * t, int slot);
// t itself when f32, else tmp set up as a contiguous f32 stand-in for t (its copy in slot `slot`),
// returned. (ops-matmul.cpp)
const oomb_tensor * f32_standin(exec_ctx & c, const oomb_tensor * t, int slot, oomb_tensor & tmp);

// ---------------------------------------------------------------------------------------------
// Kernels (dst = the node; sources as prepared by prepare_sources)
// ---------------------------------------------------------------------------------------------
// ops-elementwise.cpp
void compute_forward_fill(exec_ctx & c, oomb_tensor * dst);
void compute_forward_add(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);
void compute_forward_sub(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);
void compute_forward_mul(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);
void compute_forward_add_inplace(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);
void compute_forward_scale(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void compute_forward_silu(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void compute_forward_silu_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy);
void compute_forward_swiglu(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * gate, const oomb_tensor * up);
void compute_forward_swiglu_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * g, const oomb_tensor * u, const oomb_tensor * dy);
void compute_forward_repeat(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void compute_forward_repeat_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
// sum / mean of s[0]; sum_sq of s[0] and of every further source (oomb_sum_sq_n), in that order
void compute_forward_sum(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * const * s);
void compute_forward_get_rows(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * ids);
void compute_forward_get_rows_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * dy, const oomb_tensor * ids);
// ops-matmul.cpp
void compute_forward_mul_mat(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b);
// ops-norm-rope.cpp
void compute_forward_rms_norm(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void compute_forward_rms_norm_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * dy);
void compute_forward_rms_norm_mul(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * w);
void compute_forward_rms_norm_mul_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * x, const oomb_tensor * w, const oomb_tensor * dy);
void compute_forward_rope(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * pos, const oomb_tensor * ff);
void compute_forward_soft_max(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a);
void compute_forward_soft_max_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * y, const oomb_tensor * dy);
// ops-attn.cpp
void compute_forward_attn(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v);
void compute_forward_attn_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * q, const oomb_tensor * k,
                               const oomb_tensor * v, const oomb_tensor * dout);
void compute_forward_paged_attn_merge(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * acc, const oomb_tensor * part);
// ops-loss.cpp
void compute_forward_cross_entropy(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels);
void compute_forward_cross_entropy_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels,
                                        const oomb_tensor * dloss);
void compute_forward_linear_cross_entropy(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                                          const oomb_tensor * labels);
void compute_forward_linear_cross_entropy_back(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                                               const oomb_tensor * labels, const oomb_tensor * dloss, const oomb_tensor * lse_t);
// ops-optim.cpp
void compute_forward_adamw_step(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad,
                                const oomb_tensor * m, const oomb_tensor * v, const oomb_tensor * hp);
void compute_forward_sgd_step(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * hp);

} // namespace cpu
} // namespace oomb
