// Fused linear + cross-entropy over vocabulary tiles (see linear-ce.cuh).

#include "linear-ce.cuh"
#include "elementwise.cuh"
#include "reduce.cuh"

#include <algorithm>
#include <climits>
#include <cstdint>

using oomb::shape_str;

namespace {

const float one_c = 1.0f, zero_c = 0.0f;

enum {
    SLOT_X = oomb_cuda_ctx::SLOT_K0,  // x as contiguous bf16 [E, N]
    SLOT_C = oomb_cuda_ctx::SLOT_K0 + 1,  // logits tile f32 [Vt, N]
    SLOT_W = oomb_cuda_ctx::SLOT_K0 + 2,  // w's tile rows as contiguous bf16 [E, Vt] (when converted)
    SLOT_G = oomb_cuda_ctx::SLOT_K0 + 3,  // dlogits tile bf16 [Vt, N] (backward)
    SLOT_S = oomb_cuda_ctx::SLOT_K0 + 4,  // per-row state
};

__device__ __forceinline__ int32_t lce_label(const oomb_tv & labels, int64_t r) {
    return *(const int32_t *) (labels.d + oomb_flat_off<uint64_t>(labels, (uint64_t) r));
}

// One warp per token r: merges the max and sum of exp of C[r*vt .. r*vt + vt) (the logits of classes
// v0 .. v0+vt) into the running (m[r], s[r]); picks the label's logit when picked != NULL. (A block
// per row, with block-wide reductions, was latency-bound: slower than the tile's product.) VEC: four
// at a time (vt % 4 == 0: every row 16-byte aligned).
template <bool VEC>
__global__ void k_lce_stats_warp(const float * C, int64_t vt, int64_t v0, int first, oomb_tv labels, int64_t r0, float * m, double * s,
                                 float * picked, int64_t N) {
    const int64_t r = blockIdx.x * (int64_t) (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= N) return;
    const int lane = threadIdx.x & 31;
    const float * x = C + r * vt;
    float mt = -INFINITY, st = 0.0f;
    auto add = [&](float v) {
        if (v > mt) {
            st = st * expf(mt - v) + 1.0f;
            mt = v;
        } else {
            st += expf(v - mt);
        }
    };
    if constexpr (VEC) {
        const float4 * x4 = (const float4 *) x;
        for (int64_t i = lane; i < vt / 4; i += 32) {
            const float4 v = x4[i];
            add(v.x); add(v.y); add(v.z); add(v.w);
        }
    } else {
        for (int64_t i = lane; i < vt; i += 32) add(x[i]);
    }
    const float M = oomb_warp_max(mt);
    const double S = oomb_warp_sum((double) (mt == -INFINITY ? 0.0f : st * expf(mt - M)));
    if (lane == 0) {
        if (first) {
            m[r] = M;
            s[r] = S;
        } else {
            const float mo = m[r];
            const float mn = fmaxf(mo, M);
            const double so = s[r];
            s[r] = (so == 0.0 ? 0.0 : so * exp((double) mo - (double) mn)) + (S == 0.0 ? 0.0 : S * exp((double) M - (double) mn));
            m[r] = mn;
        }
        if (picked) {
            const int32_t lab = lce_label(labels, r0 + r);
            if (lab >= v0 && lab < v0 + vt) picked[r] = x[lab - v0];
        }
    }
}

// Per row: lse = m + log(s) (to lse_out); with part != NULL, the row's loss and count (labels out of
// range are recorded, counted, with loss 0, as cross_entropy_loss does). Rows r0 .. r0+N of the labels
// (the other pointers start at row r0).
__global__ void k_lce_finish(int64_t N, int64_t V, const float * m, const double * s, const float * picked, oomb_tv labels,
                             int64_t r0, int32_t ignore, float * lse_out, double * part, double * cnt, oomb_cuda_err_rec * err,
                             int node) {
    for (int64_t r = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; r < N; r += (int64_t) gridDim.x * blockDim.x) {
        const double lse = (double) m[r] + log(s[r]);
        lse_out[r] = (float) lse;
        if (!part) continue;
        const int32_t lab = lce_label(labels, r0 + r);
        double p = 0.0, k = 0.0;
        if (lab != ignore) {
            k = 1.0;
            if (lab < 0 || lab >= V) oomb_cuda_record_err(err, OOMB_CUDA_ERR_LABEL, node, r0 + r, lab);
            else p = lse - (double) picked[r];
        }
        part[r] = p;
        cnt[r] = k;
    }
}

// One warp per token r: G[r*ldg + i] = bf16((exp(C[r*vt + i] - lse[r]) - [v0 + i == label]) * dloss[0]),
// 0 for ignored rows (and rows with a label out of range, which are recorded). Labels of rows r0 ..
// r0+N (lse and the tiles start at row r0). VEC: four at a time (vt % 4 == 0). IN_PLACE: G is C's
// memory (ldg = 2 vt: row r of G in the first half of row r of C); every lane loads its step's logits
// before any lane of the warp stores (__syncwarp), and a step's stores land only on bytes loaded at
// that step or earlier, so no logit is overwritten before it is read.
template <bool VEC, bool IN_PLACE>
__global__ void k_lce_dlogits(const float * C, __nv_bfloat16 * G, int64_t vt, int64_t ldg, int64_t v0, int64_t V, oomb_tv labels,
                              int64_t r0, int32_t ignore, const float * lse, const float * dloss, oomb_cuda_err_rec * err, int node,
                              int64_t N) {
    const int64_t r = blockIdx.x * (int64_t) (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= N) return;
    const int lane = threadIdx.x & 31;
    const float * x = C + r * vt;
    __nv_bfloat16 * g = G + r * ldg;
    const int32_t lab = lce_label(labels, r0 + r);
    const bool bad = lab != ignore && (lab < 0 || lab >= V);
    if (bad && v0 == 0 && lane == 0) oomb_cuda_record_err(err, OOMB_CUDA_ERR_LABEL, node, r0 + r, lab);
    const bool zero = lab == ignore || bad;
    const float gs = zero ? 0.0f : *dloss, l = zero ? 0.0f : lse[r];
    const int64_t li = zero ? -1 : (int64_t) lab - v0;
    auto val = [&](int64_t i, float v) {
        if (zero) return 0.0f;
        float e = expf(v - l) * gs;
        if (i == li) e -= gs;
        return e;
    };
    // the same trip count on every lane (the warp-wide barrier of IN_PLACE)
    if constexpr (VEC) {
        const float4 * x4 = (const float4 *) x;
        uint2 * g4 = (uint2 *) g;
        const int64_t n4 = vt / 4;
        for (int64_t b = 0; b < n4; b += 32) {
            const int64_t i = b + lane;
            const float4 v = zero || i >= n4 ? make_float4(0.f, 0.f, 0.f, 0.f) : x4[i];
            if constexpr (IN_PLACE) __syncwarp();
            if (i >= n4) continue;
            const __nv_bfloat162 lo = __floats2bfloat162_rn(val(4 * i, v.x), val(4 * i + 1, v.y));
            const __nv_bfloat162 hi = __floats2bfloat162_rn(val(4 * i + 2, v.z), val(4 * i + 3, v.w));
            uint2 o;
            o.x = *(const uint32_t *) &lo;
            o.y = *(const uint32_t *) &hi;
            g4[i] = o;
        }
    } else {
        for (int64_t b = 0; b < vt; b += 32) {
            const int64_t i = b + lane;
            const float v = zero || i >= vt ? 0.0f : x[i];
            if constexpr (IN_PLACE) __syncwarp();
            if (i < vt) g[i] = __float2bfloat16_rn(val(i, v));
        }
    }
}

void set_contiguous(oomb_tensor * t) {
    t->nb[0] = oomb_type_size(t->type);
    for (int i = 1; i < 4; i++) t->nb[i] = t->nb[i - 1] * (size_t) t->ne[i - 1];
}

struct lce_dims {
    int64_t E, V, N;
};

lce_dims check_operands(const char * op, const oomb_tensor * w, const oomb_tensor * x, const oomb_tensor * labels) {
    const int64_t E = w->ne[0], V = w->ne[1], N = oomb_nrows(x);
    if (w->type == OOMB_TYPE_I32 || x->type != OOMB_TYPE_F32 || x->ne[0] != E || w->ne[2] != 1 || w->ne[3] != 1 || E <= 0 || V <= 0) {
        oomb_error("%s: invalid operands w %s, x %s", op, shape_str(w).c_str(), shape_str(x).c_str());
    }
    if (labels->type != OOMB_TYPE_I32 || oomb_nelements(labels) != N) {
        oomb_error("%s: labels %s must be i32 with one entry per row of x %s", op, shape_str(labels).c_str(), shape_str(x).c_str());
    }
    if (E > INT_MAX || V > INT_MAX || N > INT_MAX) {
        oomb_error("%s: sizes exceed cuBLAS's int range: w %s, x %s", op, shape_str(w).c_str(), shape_str(x).c_str());
    }
    return {E, V, N};
}

// Scratch of one op, taken before anything is enqueued (a slot that grows synchronizes and frees its
// old block).
struct lce_scratch {
    __nv_bfloat16 * xb = nullptr;  // [E, N]
    float * C = nullptr;           // [vt, N]
    __nv_bfloat16 * wt = nullptr;  // [E, vt] when w's rows are converted
    __nv_bfloat16 * G = nullptr;   // [vt, N] (backward)
    double * s = nullptr;          // running sum of exp [N]
    double * part = nullptr;       // per-row loss [N]
    double * cnt = nullptr;        // per-row count [N]
    float * m = nullptr;           // running max [N]
    float * picked = nullptr;      // label logit [N]
    float * lse = nullptr;         // recomputed lse [N] (backward without an lse source)
};

bool w_in_place(const oomb_tensor * w) {
    const int64_t E = w->ne[0];
    return w->type == OOMB_TYPE_BF16 && (uintptr_t) w->data % 2 == 0 && (E <= 1 || w->nb[0] == 2) && w->nb[1] % 2 == 0 &&
           (w->ne[1] <= 1 || (int64_t) (w->nb[1] / 2) >= E);
}

// The fused pass's vocabulary-tile request: a tile set on either node (oomb_linear_cross_entropy_set_tile)
// or OOMB_LCE_TILE caps the logits block as it caps the tiled path's.
int64_t lce_fused_tile(const oomb_tensor * fwd, const oomb_tensor * back) {
    return oomb_linear_cross_entropy_tile_request(std::max<int64_t>(fwd->op_params[1], back->op_params[1]));
}

// The one sizing of the scratch slots (bytes per slot, SLOT_X .. SLOT_S), read by take_scratch, the fused
// pass and oomb_cuda_linear_ce_scratch (the memory plan), so that the plan counts what the passes take.
// Tiled path: rows = N and cols = vt (the vocabulary tile); fused pass: cols = V and rows = R (the block's
// rows), whose dlogits reuse the logits block in place (no SLOT_G, no SLOT_W: w is used in place).
struct lce_slot_sizes {
    size_t b[5] = {0, 0, 0, 0, 0};
};
lce_slot_sizes lce_slot_bytes(size_t E, size_t N, size_t cols, size_t rows, bool fused, bool w_conv, bool backward) {
    lce_slot_sizes z;
    z.b[SLOT_X - SLOT_X] = E * N * 2;                                          // x in bf16 [E, N]
    z.b[SLOT_C - SLOT_X] = cols * rows * sizeof(float);                         // logits [cols, rows] f32
    if (!fused && w_conv) z.b[SLOT_W - SLOT_X] = E * cols * 2;                  // w's tile rows in bf16 [E, vt]
    if (!fused && backward) z.b[SLOT_G - SLOT_X] = cols * rows * 2;             // dlogits bf16 [vt, N]
    z.b[SLOT_S - SLOT_X] = N * (3 * sizeof(double) + 3 * sizeof(float));        // row state (s, part, cnt; m, picked, lse)
    return z;
}

lce_scratch take_scratch(oomb_cuda_ctx & c, const oomb_tensor * w, const lce_dims & d, int64_t vt, bool backward) {
    lce_scratch S;
    const size_t N = (size_t) d.N;
    const lce_slot_sizes z = lce_slot_bytes((size_t) d.E, N, (size_t) vt, N, false, !w_in_place(w), backward);
    S.xb = (__nv_bfloat16 *) c.scratch(SLOT_X, z.b[SLOT_X - SLOT_X]);
    S.C = (float *) c.scratch(SLOT_C, z.b[SLOT_C - SLOT_X]);
    if (z.b[SLOT_W - SLOT_X]) S.wt = (__nv_bfloat16 *) c.scratch(SLOT_W, z.b[SLOT_W - SLOT_X]);
    if (z.b[SLOT_G - SLOT_X]) S.G = (__nv_bfloat16 *) c.scratch(SLOT_G, z.b[SLOT_G - SLOT_X]);
    char * st = (char *) c.scratch(SLOT_S, z.b[SLOT_S - SLOT_X]);
    S.s = (double *) st;
    S.part = S.s + N;
    S.cnt = S.part + N;
    S.m = (float *) (S.cnt + N);
    S.picked = S.m + N;
    S.lse = S.picked + N;
    return S;
}

// x as contiguous bf16 [E, N] (column n = token n): once per op.
void convert_x(oomb_cuda_ctx & c, const oomb_tensor * x, __nv_bfloat16 * xb) {
    oomb_tensor d = *x;
    d.type = OOMB_TYPE_BF16;
    d.view_src = nullptr;
    set_contiguous(&d);
    d.data = xb;
    oomb_cuda_copy_tensor(c, x, &d);
}

// Rows [v0, v0 + n) of w as a bf16 column-major E x n matrix with leading dimension ld (w's rows
// in place, or converted into S.wt).
const __nv_bfloat16 * w_rows(oomb_cuda_ctx & c, const oomb_tensor * w, const lce_scratch & S, int64_t v0, int64_t n, int64_t & ld) {
    const int64_t E = w->ne[0];
    if (w_in_place(w)) {
        ld = n <= 1 ? E : (int64_t) (w->nb[1] / 2);
        return (const __nv_bfloat16 *) ((const char *) w->data + v0 * w->nb[1]);
    }
    oomb_tensor src = *w;
    src.ne[1] = n;
    src.view_src = nullptr;
    src.data = (char *) w->data + v0 * w->nb[1];
    oomb_tensor d = src;
    d.type = OOMB_TYPE_BF16;
    set_contiguous(&d);
    d.data = S.wt;
    oomb_cuda_copy_tensor(c, &src, &d);
    ld = E;
    return S.wt;
}

// C [n, N] (ld n) = W_tile^T X: logits of classes v0 .. v0+n for every token.
void gemm_logits(oomb_cuda_ctx & c, const __nv_bfloat16 * W, int64_t ldw, const lce_scratch & S, const lce_dims & d, int64_t n) {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int) n, (int) d.N, (int) d.E, &alpha, W, CUDA_R_16BF, (int) ldw, S.xb,
                              CUDA_R_16BF, (int) d.E, &beta, S.C, CUDA_R_32F, (int) n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The forward's pass over the tiles: running (m, s) per row, and the label logits when picked.
void lse_pass(oomb_cuda_ctx & c, const oomb_tensor * w, const oomb_tensor * labels, const lce_scratch & S, const lce_dims & d,
              int64_t vt, float * picked) {
    const oomb_tv tl = oomb_make_tv(labels);
    for (int64_t v0 = 0; v0 < d.V; v0 += vt) {
        const int64_t n = std::min(vt, d.V - v0);
        int64_t ldw;
        const __nv_bfloat16 * W = w_rows(c, w, S, v0, n, ldw);
        gemm_logits(c, W, ldw, S, d, n);
        const unsigned gw = (unsigned) ((d.N + 7) / 8);
        if (n % 4 == 0) k_lce_stats_warp<true><<<gw, 256, 0, c.stream>>>(S.C, n, v0, v0 == 0 ? 1 : 0, tl, 0, S.m, S.s, picked, d.N);
        else k_lce_stats_warp<false><<<gw, 256, 0, c.stream>>>(S.C, n, v0, v0 == 0 ? 1 : 0, tl, 0, S.m, S.s, picked, d.N);
        OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy (tile stats)");
    }
}

} // namespace

void oomb_cuda_linear_ce(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                         const oomb_tensor * labels) {
    const char * op = "linear_cross_entropy";
    const lce_dims d = check_operands(op, w, x, labels);
    if (oomb_nelements(dst) != 2 + d.N || !oomb_is_contiguous(dst)) {
        oomb_error("%s: result %s must be contiguous with 2 + %lld elements", op, shape_str(dst).c_str(), (long long) d.N);
    }
    float * out = (float *) dst->data;
    if (d.N == 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, 2 * sizeof(float), c.stream));
        return;
    }
    const int64_t vt = oomb_linear_cross_entropy_tile(d.V, d.N, dst->op_params[1]);
    const lce_scratch S = take_scratch(c, w, d, vt, false);
    CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream));
    convert_x(c, x, S.xb);
    lse_pass(c, w, labels, S, d, vt, S.picked);
    k_lce_finish<<<oomb_cuda_grid(d.N, 256), 256, 0, c.stream>>>(d.N, d.V, S.m, S.s, S.picked, oomb_make_tv(labels), 0, dst->op_params[0],
                                                                 out + 2, S.part, S.cnt, c.d_err, c.cur_node);
    OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy (finish)");
    c.check_err = true;
    oomb_cuda_sum_partials(c, S.part, d.N, 1.0, out);
    oomb_cuda_sum_partials(c, S.cnt, d.N, 1.0, out + 1);
}

// The backward's result [dX (E*N) | dW (E*V)] (the parts op_params[2] asks for) and its dloss [2]
// f32, checked for the unfused and the fused backward alike; errors name op.
struct lce_back_result {
    bool want_dx, want_dw;
    int64_t n_dx, n_dw;
};
static lce_back_result check_back_result(const char * op, const oomb_tensor * back, const oomb_tensor * dloss, const lce_dims & d) {
    const int grads = back->op_params[2];
    lce_back_result r;
    r.want_dx = (grads & OOMB_LCE_GRAD_X) != 0;
    r.want_dw = (grads & OOMB_LCE_GRAD_W) != 0;
    r.n_dx = r.want_dx ? d.E * d.N : 0;
    r.n_dw = r.want_dw ? d.E * d.V : 0;
    if (!(r.want_dx || r.want_dw) || oomb_nelements(back) != r.n_dx + r.n_dw || !oomb_is_contiguous(back)) {
        oomb_error("%s: result %s must be contiguous with %lld elements (grads %d)", op, shape_str(back).c_str(), (long long) (r.n_dx + r.n_dw),
                   grads);
    }
    if (dloss->type != OOMB_TYPE_F32 || oomb_nelements(dloss) < 1) oomb_error("%s: dloss %s must be f32 [2]", op, shape_str(dloss).c_str());
    return r;
}

void oomb_cuda_linear_ce_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * w, const oomb_tensor * x,
                              const oomb_tensor * labels, const oomb_tensor * dloss, const oomb_tensor * lse, float * acc_dw) {
    const char * op = "linear_cross_entropy_back";
    const lce_dims d = check_operands(op, w, x, labels);
    const lce_back_result r = check_back_result(op, dst, dloss, d);
    const bool want_dx = r.want_dx, want_dw = r.want_dw;
    const int64_t n_dx = r.n_dx;
    if (lse && (lse->type != OOMB_TYPE_F32 || oomb_nelements(lse) != d.N || !oomb_is_contiguous(lse))) {
        oomb_error("%s: lse %s must be contiguous f32 with one entry per row of x %s", op, shape_str(lse).c_str(), shape_str(x).c_str());
    }
    if (d.N == 0) {
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, oomb_nbytes(dst), c.stream));  // (acc_dw += 0)
        return;
    }
    float * dX = want_dx ? (float *) dst->data : nullptr;
    float * dW = want_dw ? (acc_dw ? acc_dw : (float *) dst->data + n_dx) : nullptr;
    const float * beta_dw = acc_dw ? &one_c : &zero_c;
    const int32_t ignore = dst->op_params[0];
    const int64_t vt = oomb_linear_cross_entropy_tile(d.V, d.N, dst->op_params[1]);
    const lce_scratch S = take_scratch(c, w, d, vt, true);
    const oomb_tv tl = oomb_make_tv(labels);
    CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream));
    convert_x(c, x, S.xb);
    const float * L = lse ? (const float *) lse->data : S.lse;
    if (!lse) {
        lse_pass(c, w, labels, S, d, vt, nullptr);
        k_lce_finish<<<oomb_cuda_grid(d.N, 256), 256, 0, c.stream>>>(d.N, d.V, S.m, S.s, nullptr, tl, 0, ignore, S.lse, nullptr, nullptr,
                                                                     c.d_err, c.cur_node);
        OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy_back (lse)");
    }
    const float one = 1.0f, zero = 0.0f;
    const unsigned gw = (unsigned) ((d.N + 7) / 8);
    for (int64_t v0 = 0; v0 < d.V; v0 += vt) {
        const int64_t n = std::min(vt, d.V - v0);
        int64_t ldw;
        const __nv_bfloat16 * W = w_rows(c, w, S, v0, n, ldw);
        gemm_logits(c, W, ldw, S, d, n);
        if (n % 4 == 0)
            k_lce_dlogits<true, false><<<gw, 256, 0, c.stream>>>(S.C, S.G, n, n, v0, d.V, tl, 0, ignore, L, (const float *) dloss->data, c.d_err,
                                                          c.cur_node, d.N);
        else
            k_lce_dlogits<false, false><<<gw, 256, 0, c.stream>>>(S.C, S.G, n, n, v0, d.V, tl, 0, ignore, L, (const float *) dloss->data, c.d_err,
                                                           c.cur_node, d.N);
        OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy_back (dlogits)");
        if (dX) {
            // dX [E, N] (+)= W_tile [E, n] G [n, N]
            CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int) d.E, (int) d.N, (int) n, &one, W, CUDA_R_16BF, (int) ldw,
                                      S.G, CUDA_R_16BF, (int) n, v0 == 0 ? &zero : &one, dX, CUDA_R_32F, (int) d.E, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        }
        if (dW) {
            // dW_tile [E, n] = X [E, N] G^T [N, n]
            CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_N, CUBLAS_OP_T, (int) d.E, (int) n, (int) d.N, &one, S.xb, CUDA_R_16BF, (int) d.E,
                                      S.G, CUDA_R_16BF, (int) n, beta_dw, dW + v0 * d.E, CUDA_R_32F, (int) d.E, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        }
    }
    c.check_err = true;
}

bool oomb_cuda_linear_ce_fusable(const oomb_tensor * w) { return w_in_place(w); }

void oomb_cuda_linear_ce_scratch(const oomb_cuda_ctx & c, const oomb_tensor * node, const oomb_tensor * fused_fwd, size_t bytes[5]) {
    const oomb_tensor * w = node->src[0], * x = node->src[1];
    const size_t E = (size_t) w->ne[0], V = (size_t) w->ne[1], N = (size_t) oomb_nrows(x);
    for (int i = 0; i < 5; i++) bytes[i] = 0;
    if (N == 0) return;
    static_assert(SLOT_C == SLOT_X + 1 && SLOT_W == SLOT_X + 2 && SLOT_G == SLOT_X + 3 && SLOT_S == SLOT_X + 4, "bytes[] follows the slots");
    lce_slot_sizes z;
    if (fused_fwd) {  // as oomb_cuda_linear_ce_fused (before any fallback to smaller blocks)
        const int64_t R = oomb_cuda_linear_ce_fused_rows((int64_t) V, (int64_t) N, lce_fused_tile(fused_fwd, node), c.lce_block_bytes);
        z = lce_slot_bytes(E, N, V, (size_t) R, true, false, true);
    } else {  // as take_scratch
        const size_t vt = (size_t) oomb_linear_cross_entropy_tile((int64_t) V, (int64_t) N, node->op_params[1]);
        z = lce_slot_bytes(E, N, vt, N, false, !w_in_place(w), node->op == OOMB_OP_LINEAR_CROSS_ENTROPY_BACK);
    }
    for (int i = 0; i < 5; i++) bytes[i] = z.b[i];
}

int64_t oomb_cuda_linear_ce_fused_rows(int64_t V, int64_t N, int64_t tile, size_t block_bytes) {
    if (V <= 0 || N <= 0) return 0;
    int64_t r = 0;
    if (const char * e = getenv("OOMB_LCE_ROWS")) r = atoll(e);
    if (r <= 0) {
        // [V, rows] f32 of at most block_bytes (0: 1.25 GiB), or of the tiled path's [tile, N] when a tile was set
        int64_t cap = (int64_t) ((block_bytes ? block_bytes : k_lce_block_default) / sizeof(float));
        if (tile > 0) cap = std::min(cap, std::min(tile, V) * N);
        r = std::max<int64_t>(1, cap / V);
    }
    r = std::min(r, N);
    const int64_t blocks = (N + r - 1) / r;
    return (N + blocks - 1) / blocks;  // the same rows in every block (the last one at most as many)
}

void oomb_cuda_linear_ce_fused(oomb_cuda_ctx & c, oomb_tensor * fwd, oomb_tensor * back, const oomb_tensor * w, const oomb_tensor * x,
                               const oomb_tensor * labels, const oomb_tensor * dloss, float * acc_dw) {
    const char * op = "linear_cross_entropy_back (fused with its forward)";
    const lce_dims d = check_operands(op, w, x, labels);
    const lce_back_result r = check_back_result(op, back, dloss, d);
    const bool want_dx = r.want_dx, want_dw = r.want_dw;
    const int64_t n_dx = r.n_dx;
    if (oomb_nelements(fwd) != 2 + d.N || !oomb_is_contiguous(fwd) || fwd->type != OOMB_TYPE_F32)
        oomb_error("%s: forward result %s must be contiguous f32 with 2 + %lld elements", op, shape_str(fwd).c_str(), (long long) d.N);
    if (!w_in_place(w)) oomb_error("%s: internal: w %s is not bf16 with unit-stride rows", op, shape_str(w).c_str());
    float * out = (float *) fwd->data;
    c.n_fused_lce++;
    if (d.N == 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, 2 * sizeof(float), c.stream));
        CUDA_CHECK(cudaMemsetAsync(back->data, 0, oomb_nbytes(back), c.stream));
        return;
    }
    float * dX = want_dx ? (float *) back->data : nullptr;
    float * dW = want_dw ? (acc_dw ? acc_dw : (float *) back->data + n_dx) : nullptr;
    const int32_t ignore = back->op_params[0];
    const int64_t tile = lce_fused_tile(fwd, back);
    // scratch: x in bf16, the [V, R] f32 logits of a row block (its dlogits in place), the row state
    const size_t N = (size_t) d.N, E = (size_t) d.E;
    const int64_t R0 = oomb_cuda_linear_ce_fused_rows(d.V, d.N, tile, c.lce_block_bytes);
    const lce_slot_sizes z = lce_slot_bytes(E, N, (size_t) d.V, (size_t) R0, true, false, true);
    __nv_bfloat16 * xb = (__nv_bfloat16 *) c.scratch(SLOT_X, z.b[SLOT_X - SLOT_X]);
    char * st = (char *) c.scratch(SLOT_S, z.b[SLOT_S - SLOT_X]);
    // the logits block (z's SLOT_C at R0): where the device has no room for R rows (up to c.lce_block_bytes), twice
    // the blocks of half the rows, down to one row, rather than a failed step (the same result: dw sums the blocks)
    int64_t R = R0;
    auto block_bytes = [&](int64_t rows) { return lce_slot_bytes(E, N, (size_t) d.V, (size_t) rows, true, false, true).b[SLOT_C - SLOT_X]; };
    float * C = nullptr;
    // after a block did not fit: start from the size that did (not two failed allocations per step)
    while (c.lce_bytes_fit > 0 && block_bytes(R) > c.lce_bytes_fit && R > 1) {
        const int64_t blocks = 2 * ((d.N + R - 1) / R);
        R = (d.N + blocks - 1) / blocks;
    }
    for (;;) {
        C = (float *) c.try_scratch(SLOT_C, block_bytes(R));
        if (C || R == 1) break;
        const int64_t blocks = 2 * ((d.N + R - 1) / R);
        R = (d.N + blocks - 1) / blocks;
    }
    if (!C)
        oomb::fail(OOMB_STATUS_ALLOC_FAILED, "%s: out of device memory for the logits of one row (%zu bytes of scratch)", op,
                   (size_t) d.V * sizeof(float));
    if (R != R0 && !c.lce_rows_noted) {
        c.lce_rows_noted = true;
        fprintf(stderr, "oomb: cuda: linear_cross_entropy: no room for the logits of %lld rows (%.2f GiB); blocks of %lld rows instead\n",
                (long long) R0, (double) d.V * (double) R0 * 4.0 / (double) (1ull << 30), (long long) R);
    }
    c.last_lce_rows = R;
    if (R != R0) c.lce_bytes_fit = block_bytes(R);
    double * s = (double *) st, * part = s + N, * cnt = part + N;
    float * m = (float *) (cnt + N), * picked = m + N;
    float * lse = out + 2;
    const oomb_tv tl = oomb_make_tv(labels);
    const int64_t ldw = d.V <= 1 ? d.E : (int64_t) (w->nb[1] / 2);
    const __nv_bfloat16 * W = (const __nv_bfloat16 *) w->data;
    __nv_bfloat16 * G = (__nv_bfloat16 *) C;  // ld 2V
    const int64_t ldg = 2 * d.V;
    if (ldg > INT_MAX) oomb_error("%s: 2 x V = %lld exceeds cuBLAS's int range", op, (long long) ldg);
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream));
    convert_x(c, x, xb);
    const bool vec = d.V % 4 == 0;
    for (int64_t r0 = 0; r0 < d.N; r0 += R) {
        const int64_t n = std::min(R, d.N - r0);
        const __nv_bfloat16 * xr = xb + r0 * d.E;
        // C [V, n] = W^T X_rows: every class's logit for the block's rows
        CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int) d.V, (int) n, (int) d.E, &one, W, CUDA_R_16BF, (int) ldw, xr,
                                  CUDA_R_16BF, (int) d.E, &zero, C, CUDA_R_32F, (int) d.V, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        const unsigned gw = (unsigned) ((n + 7) / 8);
        if (vec) k_lce_stats_warp<true><<<gw, 256, 0, c.stream>>>(C, d.V, 0, 1, tl, r0, m + r0, s + r0, picked + r0, n);
        else k_lce_stats_warp<false><<<gw, 256, 0, c.stream>>>(C, d.V, 0, 1, tl, r0, m + r0, s + r0, picked + r0, n);
        OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy fused (stats)");
        k_lce_finish<<<oomb_cuda_grid(n, 256), 256, 0, c.stream>>>(n, d.V, m + r0, s + r0, picked + r0, tl, r0, ignore, lse + r0, part + r0,
                                                                   cnt + r0, c.d_err, c.cur_node);
        OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy fused (finish)");
        const float * dl = (const float *) dloss->data;
        if (vec)
            k_lce_dlogits<true, true><<<gw, 256, 0, c.stream>>>(C, G, d.V, ldg, 0, d.V, tl, r0, ignore, lse + r0, dl, c.d_err, c.cur_node, n);
        else
            k_lce_dlogits<false, true><<<gw, 256, 0, c.stream>>>(C, G, d.V, ldg, 0, d.V, tl, r0, ignore, lse + r0, dl, c.d_err, c.cur_node, n);
        OOMB_CUDA_LAUNCHED(c, "linear_cross_entropy fused (dlogits)");
        if (dX) {
            // dX [E, n] = W [E, V] G [V, n]
            CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int) d.E, (int) n, (int) d.V, &one, W, CUDA_R_16BF, (int) ldw, G,
                                      CUDA_R_16BF, (int) ldg, &zero, dX + r0 * d.E, CUDA_R_32F, (int) d.E, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        }
        if (dW) {
            // dW [E, V] (+)= X_rows [E, n] G^T [n, V]
            CUBLAS_CHECK(cublasGemmEx(c.cublas, CUBLAS_OP_N, CUBLAS_OP_T, (int) d.E, (int) d.V, (int) n, &one, xr, CUDA_R_16BF, (int) d.E, G,
                                      CUDA_R_16BF, (int) ldg, r0 == 0 && !acc_dw ? &zero : &one, dW, CUDA_R_32F, (int) d.E, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        }
    }
    c.check_err = true;
    oomb_cuda_sum_partials(c, part, d.N, 1.0, out);
    oomb_cuda_sum_partials(c, cnt, d.N, 1.0, out + 1);
}
