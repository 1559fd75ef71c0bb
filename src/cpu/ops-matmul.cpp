// CPU kernels: the matrix product through OpenBLAS cblas_sgemm, called from the main thread only
// (conventions: ops-common.h).

#include "ops-common.h"

#include <cblas.h>

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Matrix product (OpenBLAS)
// ---------------------------------------------------------------------------------------------

// How a matrix operand is passed to sgemm: as stored rows (ld >= cols), transposed storage, or a copy.
enum mat_mode { MAT_ROWS, MAT_COLS, MAT_COPY };

// t is [K, R, ...] (K elements per row, R rows). Decides how sgemm can read one 2-D slice.
static mat_mode classify(const oomb_tensor * t, int64_t K, int64_t R, int64_t & ld) {
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
    const int64_t A2 = a->ne[2], A3 = a->ne[3], B2 = b->ne[2], B3 = b->ne[3];  // operands: check_op_operands (op-checks.cpp)
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

} // namespace cpu
} // namespace oomb
