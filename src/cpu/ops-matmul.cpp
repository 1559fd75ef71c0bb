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

const oomb_tensor * f32_standin(exec_ctx & c, const oomb_tensor * t, int slot, oomb_tensor & tmp) {
    if (t->type == OOMB_TYPE_F32) return t;
    tmp = *t;
    tmp.type = OOMB_TYPE_F32;
    tmp.view_src = nullptr;
    set_contiguous_strides(&tmp);
    tmp.data = (void *) tensor_to_f32(c, t, slot);
    return &tmp;
}

// ---------------------------------------------------------------------------------------------
// Matrix product with a block-type (quantized) a: tiles of a's rows dequantized, never all of a
// ---------------------------------------------------------------------------------------------

// Rows of f32 per tile of a block-type a: about 256 KiB of f32 (at least 16 rows; 85 rows of 768,
// 256 of 256), so a large weight is never held in f32 (a small one may fit in one tile).
static int64_t quant_tile_rows(int64_t K) { return std::max<int64_t>(16, ((int64_t) 1 << 16) / std::max<int64_t>(K, 1)); }

// Dequantizes stored rows [r0, r0 + nr) (each K elements, rows `rs` bytes apart from base) into
// the contiguous f32 dst [nr x K], rows split over the threads (quants.h: bit-exact).
static void quant_rows_to_f32(exec_ctx & c, const char * base, size_t rs, oomb_type type, int64_t K, int64_t r0, int64_t nr,
                              float * dst) {
    const uint32_t gt = oomb_type_to_ggml(type);
    const int64_t nblk = K / oomb_blck_size(type);
    parallel_for(c, nr, K, [&](int64_t i0, int64_t i1, int) {
        for (int64_t r = i0; r < i1; r++) dequantize_blocks(gt, base + (size_t) (r0 + r) * rs, dst + r * K, nblk);
    });
}

// b as sgemm reads it here: NN = N*B2*B3 rows of K f32, ld apart (in place when its rows are
// unit-stride and evenly spaced, else a contiguous f32 copy in slot N_PREP_SLOTS_END + 1).
static const float * b_rows_f32(exec_ctx & c, const oomb_tensor * b, int64_t & ld) {
    const int64_t K = b->ne[0], N = b->ne[1], B2 = b->ne[2], B3 = b->ne[3], NN = N * B2 * B3;
    const int64_t rs = N > 1 ? (int64_t) b->nb[1] : B2 > 1 ? (int64_t) b->nb[2] : (int64_t) b->nb[3];
    const bool flat = b->type == OOMB_TYPE_F32 && (K <= 1 || b->nb[0] == 4) && rs % 4 == 0 && (N == 1 || (int64_t) b->nb[1] == rs) &&
                      (B2 == 1 || (int64_t) b->nb[2] == N * rs) && (B3 == 1 || (int64_t) b->nb[3] == B2 * N * rs) &&
                      (NN <= 1 || rs / 4 >= K);
    if (flat) { ld = NN <= 1 ? std::max<int64_t>(K, 1) : rs / 4; return (const float *) b->data; }
    ld = std::max<int64_t>(K, 1);
    return tensor_to_f32(c, b, N_PREP_SLOTS_END + 1);
}

// mul_mat with a block-type a (operands: check_mul_mat, op-checks.cpp; a is 2-D).
//   row-major a [K, M]: C[NN x M] = B[NN x K] * A^T, per tile of a's rows: C[:, m0:m0+mc] = B * tile^T.
//   transposed view (the autodiff's db = mul_mat(transpose(a), dy)): a->ne = [R, Kr] over R stored
//   rows of Kr elements, b [R, NN]: C[NN x Kr] = sum over tiles of stored rows of B[:, r0:r0+rc] * tile,
//   accumulated by sgemm (beta 1 after the first tile).
static void mul_mat_quant(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    const int64_t NN = b->ne[1] * b->ne[2] * b->ne[3];
    const bool tr = quant_block_dim(a) == 1;
    const int64_t R = tr ? a->ne[0] : a->ne[1];   // stored rows
    const int64_t Kr = tr ? a->ne[1] : a->ne[0];  // elements per stored row
    const size_t rs = tr ? a->nb[0] : a->nb[1];   // bytes between stored rows
    if (Kr > INT_MAX || R > INT_MAX || NN > INT_MAX)
        oomb_error("mul_mat: sizes exceed sgemm's int range: a %s, b %s", shape_str(a).c_str(), shape_str(b).c_str());
    int64_t ldb = 0;
    const float * bp = b_rows_f32(c, b, ldb);
    set_blas_threads(c.n_threads);
    const int64_t mt = std::min(R, quant_tile_rows(Kr));
    float * tile = (float *) c.slot(N_PREP_SLOTS_END, (size_t) (mt * Kr) * 4);
    float * cp = (float *) dst->data;
    for (int64_t r0 = 0; r0 < R; r0 += mt) {
        const int64_t rc = std::min(mt, R - r0);
        quant_rows_to_f32(c, (const char *) a->data, rs, a->type, Kr, r0, rc, tile);
        if (!tr) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int) NN, (int) rc, (int) Kr, 1.0f, bp, (int) ldb, tile, (int) Kr,
                        0.0f, cp + r0, (int) R);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int) NN, (int) Kr, (int) rc, 1.0f, bp + r0, (int) ldb, tile,
                        (int) Kr, r0 == 0 ? 0.0f : 1.0f, cp, (int) Kr);
        }
    }
}

// mul_mat: res[n][m] = sum_k a[m][k] * b[n][k], i.e. C[N x M] = B[N x K] * A[M x K]^T per batch,
// a broadcast over b's batch dims. Operands are read in place when sgemm can (unit stride in dim 0
// or dim 1); otherwise (f16 / bf16 a, other strides) they are converted to f32 first, a in blocks
// of rows so the scratch stays small for large weights.
void compute_forward_mul_mat(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b) {
    if (dst->type != OOMB_TYPE_F32) {
        // oomb_mul_mat_ext: the f32 product into scratch (slot N_PREP_SLOTS_END + 2: a and b use the
        // two before it), then rounded into dst
        oomb_tensor tmp = *dst;
        tmp.type = OOMB_TYPE_F32;
        tmp.view_src = nullptr;
        set_contiguous_strides(&tmp);
        tmp.data = c.slot(N_PREP_SLOTS_END + 2, (size_t) oomb_nelements(&tmp) * sizeof(float));
        compute_forward_mul_mat(c, &tmp, a, b);
        copy_tensor(c, &tmp, dst);
        return;
    }
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t A2 = a->ne[2], A3 = a->ne[3], B2 = b->ne[2], B3 = b->ne[3];  // operands: check_op_operands (op-checks.cpp)
    if (oomb_nelements(dst) == 0) return;
    if (K == 0) { memset(dst->data, 0, oomb_nbytes(dst)); return; }
    if (oomb_type_is_quantized(a->type)) { mul_mat_quant(c, dst, a, b); return; }
    // f16 / bf16 b (oomb_mul_ext, oomb_swiglu_ext results): a contiguous f32 copy (slot N_PREP_SLOTS_END + 1,
    // b's; a contiguous f32 b is never copied again below)
    oomb_tensor b32;
    b = f32_standin(c, b, N_PREP_SLOTS_END + 1, b32);
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
