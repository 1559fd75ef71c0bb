// Matrix product through cuBLAS (see mul-mat.cuh).

#include "mul-mat.cuh"
#include "elementwise.cuh"
#include "dequant.cuh"

#include <climits>
#include <cstdint>
#include <cstdio>

using oomb::shape_str;

namespace {

void set_contiguous(oomb_tensor * t) { oomb::set_contiguous_nb(t); }

// Byte range [lo, hi) that t's elements span.
void byte_range(const oomb_tensor * t, size_t & lo, size_t & hi) {
    lo = (size_t) t->data;
    hi = lo;
    if (oomb_nelements(t) == 0) return;
    size_t last = 0;
    for (int i = 0; i < 4; i++) last += (size_t) (t->ne[i] - 1) * t->nb[i];
    hi = lo + (oomb_type_is_quantized(t->type) ? oomb_nbytes(t) : last + oomb_type_size(t->type));
}

// A contiguous bf16 copy of src (any layout): a kept copy of the same source layout when one is
// valid (oomb_cuda_ctx::bf16_copies), else a new one in the least recently used slot other than
// `keep` (the other operand's copy). cacheable: src is graph memory (not a scratch copy).
const __nv_bfloat16 * bf16_copy_of(oomb_cuda_ctx & c, const oomb_tensor * src, bool cacheable, const void * keep) {
    oomb_tensor d = *src;
    d.type = OOMB_TYPE_BF16;
    d.view_src = nullptr;
    set_contiguous(&d);
    const size_t bytes = oomb_nbytes(&d);
    auto same = [&](const oomb_cuda_ctx::bf16_copy & e) {
        if (!e.valid || e.src != (const char *) src->data || e.type != (int) src->type) return false;
        for (int i = 0; i < 4; i++)
            if (e.ne[i] != src->ne[i] || e.nb[i] != src->nb[i]) return false;
        return true;
    };
    int pick = -1;
    for (int i = 0; i < oomb_cuda_ctx::N_BF16_COPIES && cacheable; i++) {
        if (same(c.bf16_copies[i])) {
            c.bf16_copies[i].used = ++c.bf16_clock;
            return (const __nv_bfloat16 *) c.slot_ptr[oomb_cuda_ctx::SLOT_BF16 + i];
        }
    }
    // the least recently used slot big enough, else the least recently used one (it grows)
    for (int pass = 0; pass < 2 && pick < 0; pass++) {
        for (int i = 0; i < oomb_cuda_ctx::N_BF16_COPIES; i++) {
            const int slot = oomb_cuda_ctx::SLOT_BF16 + i;
            if (keep && c.slot_ptr[slot] == keep) continue;
            if (pass == 0 && (!c.slot_ptr[slot] || c.slot_cap[slot] < bytes)) continue;
            const oomb_cuda_ctx::bf16_copy & e = c.bf16_copies[i];
            if (pick < 0 || !e.valid || (c.bf16_copies[pick].valid && e.used < c.bf16_copies[pick].used)) pick = i;
        }
    }
    if (pick < 0) oomb_error("mul_mat: internal: no free bf16 copy slot");
    oomb_cuda_ctx::bf16_copy & e = c.bf16_copies[pick];
    e.valid = false;
    d.data = c.scratch(oomb_cuda_ctx::SLOT_BF16 + pick, bytes);
    if (oomb_type_is_quantized(src->type)) {
        // row-major blocks (2-D: check_mul_mat) dequantized into the slot: only this matrix is held in bf16
        oomb_cuda_dequantize_rows(c, src->type, src->data, src->nb[1], src->ne[1], src->ne[0], d.data, OOMB_TYPE_BF16);
    } else {
        oomb_cuda_copy_tensor(c, src, &d);
    }
    if (cacheable) {
        e.valid = true;
        e.src = (const char *) src->data;
        e.type = (int) src->type;
        for (int i = 0; i < 4; i++) { e.ne[i] = src->ne[i]; e.nb[i] = src->nb[i]; }
        byte_range(src, e.lo, e.hi);
    }
    e.used = ++c.bf16_clock;
    return (const __nv_bfloat16 *) d.data;
}

// A matrix operand [ne0, ne1] (no batches) whose dim 1 is the unit-stride one and whose dim-0 rows
// are packed (nb[0] == ne1 * size: a transposed view of contiguous memory, as the autodiff makes
// for weight gradients): converted to bf16 in its memory order (a flat, coalesced copy) instead of
// a transposing copy; the caller flips the cuBLAS op. NULL when t is not such a view.
const __nv_bfloat16 * to_bf16_transposed(oomb_cuda_ctx & c, const oomb_tensor * t, bool cacheable, const void * keep) {
    const size_t es = oomb_type_size(t->type);
    if (oomb_type_is_quantized(t->type)) {
        // the transposed view of row-major blocks (the autodiff's db): the stored rows dequantized
        if (oomb::quant_block_dim(t) != 1 || t->ne[2] != 1 || t->ne[3] != 1) return nullptr;
        oomb_tensor s = *t;  // the stored matrix: [ne1, ne0], row-major blocks
        s.view_src = nullptr;
        s.op = OOMB_OP_NONE;
        s.ne[0] = t->ne[1]; s.ne[1] = t->ne[0];
        s.nb[0] = t->nb[1]; s.nb[1] = t->nb[0];
        return bf16_copy_of(c, &s, cacheable, keep);
    }
    if (t->type == OOMB_TYPE_I32 || t->ne[2] != 1 || t->ne[3] != 1 || t->ne[0] <= 1 || t->ne[1] <= 1) return nullptr;
    if (t->nb[1] != es || t->nb[0] != es * (size_t) t->ne[1]) return nullptr;
    oomb_tensor s = *t;  // the same memory seen as [ne1, ne0], contiguous
    s.view_src = nullptr;
    s.ne[0] = t->ne[1]; s.ne[1] = t->ne[0];
    s.nb[0] = t->nb[1]; s.nb[1] = t->nb[0];
    return bf16_copy_of(c, &s, cacheable, keep);
}

bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

// The largest power of two (at most 256) that divides the address: cuBLASLt picks its kernels by the
// operands' alignment, so a plan is made for the alignments it will see.
uint32_t align_of(const void * p) {
    const uintptr_t v = (uintptr_t) p;
    uint32_t a = 1;
    while (a < 256 && v % (2 * a) == 0) a *= 2;
    return a;
}

} // namespace

// One cuBLASLt problem (shape, operations, leading dimensions, epilogue, alignments): its descriptors and
// the heuristic's first algorithm; ok false when cuBLASLt offers none (the product then runs unfused).
struct oomb_cuda_ctx::lt_plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
    ~lt_plan() {
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

namespace {

// D [M, NN] f32 = op(A) op(B) + C (epi->c, beta = 1) or + bias (epi->bias, the bias epilogue), bf16 operands
// with f32 accumulation as cublasGemmEx's; D is epi->add's bytes. False (nothing queued) when cuBLASLt has
// no algorithm or refuses the call.
bool lt_gemm(oomb_cuda_ctx & c, cublasOperation_t opa, cublasOperation_t opb, int64_t M, int64_t NN, int64_t K, const __nv_bfloat16 * A,
             int64_t lda, const __nv_bfloat16 * B, int64_t ldb, const oomb_cuda_ctx::epilogue & epi) {
    float * D = (float *) epi.add->data;
    const bool bias = epi.bias != nullptr;
    const void * C = bias ? (const void *) D : (const void *) epi.c;
    const uint32_t aA = align_of(A), aB = align_of(B), aC = align_of(C), aD = align_of(D), aE = bias ? align_of(epi.bias) : 0;
    // cuBLASLt's preferences take no bias alignment and some of its bias kernels assume 16 bytes (a misaligned
    // access would end the CUDA context, not fail the call): a bias sliced out of a larger tensor runs unfused
    if (bias && aE < 16) return false;
    const bool rule = !oomb_cuda_env_flag_off("OOMB_CUDA_LT_RULE");  // (below; part of the plan's key)
    char key[256];
    snprintf(key, sizeof key, "%d %d %lld %lld %lld %lld %lld %d %u %u %u %u %u %d", (int) opa, (int) opb, (long long) M, (long long) NN,
             (long long) K, (long long) lda, (long long) ldb, bias ? 1 : 0, aA, aB, aC, aD, aE, rule ? 1 : 0);
    if (c.lt_plans.size() >= 4096 && !c.lt_plans.count(key)) c.lt_plans.clear();  // (many sequence lengths: a bound)
    std::shared_ptr<oomb_cuda_ctx::lt_plan> & slot = c.lt_plans[key];
    if (!slot) {
        auto p = std::make_shared<oomb_cuda_ctx::lt_plan>();
        slot = p;
        bool good = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
        const int32_t ta = (int32_t) opa, tb = (int32_t) opb;
        good = good && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS;
        good = good && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS;
        if (bias) {
            const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
            const int32_t bt = (int32_t) CUDA_R_32F;
            good = good && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep) == CUBLAS_STATUS_SUCCESS;
            good = good && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt) == CUBLAS_STATUS_SUCCESS;
            good = good && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias, sizeof epi.bias) ==
                               CUBLAS_STATUS_SUCCESS;
        }
        // column-major: op(A) is M x K, op(B) K x NN, C and D M x NN
        good = good && cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, opa == CUBLAS_OP_N ? M : K, opa == CUBLAS_OP_N ? K : M, lda) ==
                           CUBLAS_STATUS_SUCCESS;
        good = good && cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, opb == CUBLAS_OP_N ? K : NN, opb == CUBLAS_OP_N ? NN : K, ldb) ==
                           CUBLAS_STATUS_SUCCESS;
        good = good && cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, M, NN, M) == CUBLAS_STATUS_SUCCESS;
        cublasLtMatmulPreference_t pref = nullptr;
        good = good && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
        const uint64_t ws = c.cublas_ws_size;
        good = good && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS;
        const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> al[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, aA}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, aB},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, aC}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, aD}};
        for (const auto & x : al) good = good && cublasLtMatmulPreferenceSetAttribute(pref, x.first, &x.second, sizeof x.second) == CUBLAS_STATUS_SUCCESS;
        constexpr int k_cand = 8;
        cublasLtMatmulHeuristicResult_t res[k_cand] = {};
        int found = 0;
        good = good && cublasLtMatmulAlgoGetHeuristic(c.cublaslt, p->op, p->la, p->lb, p->lc, p->lc, pref, k_cand, res, &found) ==
                           CUBLAS_STATUS_SUCCESS;
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        p->ok = good && found > 0 && res[0].state == CUBLAS_STATUS_SUCCESS;
        if (p->ok) p->algo = res[0].algo;
        // The heuristic's first candidate was a 128 x 256 tile for every epilogue product of the 0.5B step and the
        // slowest or nearly so among its eight (H100, OOMB_CUDA_LT_TUNE=2; bench/NOTES.md "Session 24"): the output
        // projection with the residual 0.209 ms against 0.116 for 128 x 128, the q bias 0.111 / 0.089, the down
        // projection with the residual 0.495 / 0.420. So a 128 x 128 candidate, where the list has one, is taken
        // instead: a choice made from the list alone, the same in every process (OOMB_CUDA_LT_RULE=0: the first).
        if (p->ok && rule) {
            for (int r = 1; r < found; r++) {
                int32_t tile = -1;
                if (res[r].state == CUBLAS_STATUS_SUCCESS && res[r].workspaceSize <= c.cublas_ws_size &&
                    cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, nullptr) ==
                        CUBLAS_STATUS_SUCCESS &&
                    tile == CUBLASLT_MATMUL_TILE_128x128) {
                    p->algo = res[r].algo;
                    break;
                }
            }
        }
        // The heuristic's first choice was measured slower than cublasGemmEx's for some shapes (bench/NOTES.md): with
        // OOMB_CUDA_LT_TUNE=1, on large products, time each candidate once on these operands (D = product + C or
        // + bias: each run writes the same D, so the trials are harmless) and keep the fastest. Off by default: the
        // winner can differ between processes, and so then would the products' last bits (a resumed run would
        // not repeat an uninterrupted one exactly); +0.43 % on the 0.5B step before the 128 x 128 rule above.
        // OOMB_CUDA_LT_TUNE=2 also prints each candidate's configuration and time to stderr (the data for a choice
        // that does not depend on timing).
        const int tune = getenv("OOMB_CUDA_LT_TUNE") != nullptr ? atoi(getenv("OOMB_CUDA_LT_TUNE")) : 0;  // (per new plan)
        if (p->ok && tune != 0 && found > 1 && (double) M * (double) NN * (double) K >= 4294967296.0) {
            const float alpha = 1.0f, beta = bias ? 0.0f : 1.0f;
            cudaEvent_t e0 = nullptr, e1 = nullptr;
            CUDA_CHECK(cudaEventCreate(&e0));
            CUDA_CHECK(cudaEventCreate(&e1));
            float best = 0.0f;
            for (int r = 0; r < found; r++) {
                if (res[r].state != CUBLAS_STATUS_SUCCESS || res[r].workspaceSize > c.cublas_ws_size) continue;
                auto run = [&] {
                    return cublasLtMatmul(c.cublaslt, p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, D, p->lc, &res[r].algo,
                                          c.cublas_ws, c.cublas_ws_size, c.stream) == CUBLAS_STATUS_SUCCESS;
                };
                if (!run()) continue;  // (a first run loads the kernel)
                CUDA_CHECK(cudaEventRecord(e0, c.stream));
                const bool ran = run();
                CUDA_CHECK(cudaEventRecord(e1, c.stream));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0.0f;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (tune >= 2) {
                    int32_t cfg[9] = {};  // CUBLASLT_ALGO_CONFIG_ID .. CLUSTER_SHAPE_ID (4-byte values; the last two 2-byte)
                    for (int a = 0; a < 9; a++) {
                        size_t got = 0;
                        uint16_t v16 = 0;
                        const bool two = a >= (int) CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID;
                        if (cublasLtMatmulAlgoConfigGetAttribute(&res[r].algo, (cublasLtMatmulAlgoConfigAttributes_t) a,
                                                                 two ? (void *) &v16 : (void *) &cfg[a], two ? sizeof v16 : sizeof cfg[a],
                                                                 &got) != CUBLAS_STATUS_SUCCESS)
                            cfg[a] = -1;
                        else if (two)
                            cfg[a] = v16;
                    }
                    fprintf(stderr, "lt-tune [%s] cand %d: %.4f ms%s | algo %d tile %d splitk %d reduction %d swizzle %d custom %d stages %d inner %d "
                            "cluster %d | ws %zu waves %.2f\n", key, r, ms, ran ? "" : " (failed)", cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[5],
                            cfg[6], cfg[7], cfg[8], res[r].workspaceSize, res[r].wavesCount);
                }
                if (ran && (best == 0.0f || ms < best)) {
                    best = ms;
                    p->algo = res[r].algo;
                }
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
    }
    oomb_cuda_ctx::lt_plan & p = *slot;
    if (!p.ok) return false;
    if (bias && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias, sizeof epi.bias) != CUBLAS_STATUS_SUCCESS)
        return false;
    const float alpha = 1.0f, beta = bias ? 0.0f : 1.0f;
    return cublasLtMatmul(c.cublaslt, p.op, &alpha, A, p.la, B, p.lb, &beta, C, p.lc, D, p.lc, &p.algo, c.cublas_ws, c.cublas_ws_size,
                          c.stream) == CUBLAS_STATUS_SUCCESS;
}

} // namespace

bool oomb_cuda_mul_mat(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * b, float * acc,
                       const oomb_cuda_ctx::epilogue * epi) {
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1];
    const int64_t A2 = a->ne[2], A3 = a->ne[3], B2 = b->ne[2], B3 = b->ne[3];  // operands: check_op_operands (op-checks.cpp)
    if (epi && (acc || dst->type != OOMB_TYPE_F32)) oomb_error("mul_mat: internal: an epilogue with an accumulation or a non-f32 result");
    // (with an epilogue: false, and its add runs, here A = X + 0)
    if (oomb_nelements(dst) == 0) return epi == nullptr;
    if (K == 0) {
        if (acc) return true;  // acc += 0
        CUDA_CHECK(cudaMemsetAsync(dst->data, 0, oomb_nbytes(dst), c.stream));
        return epi == nullptr;
    }
    const int64_t r2 = B2 / A2, r3 = B3 / A3;

    // b: bf16 [K, N, B2, B3] contiguous (op N, ldb K), or a transposed view converted in its memory
    // order (op T, ldb N)
    cublasOperation_t opb = CUBLAS_OP_N;
    int64_t ldb = K;
    // operands that are graph memory (not a prepared scratch copy) may reuse a kept bf16 copy
    const bool a_graph = dst->src[0] && a->data == dst->src[0]->data;
    const bool b_graph = dst->src[1] && b->data == dst->src[1]->data;
    const __nv_bfloat16 * B = nullptr;
    if (b->type == OOMB_TYPE_BF16 && (uintptr_t) b->data % 2 == 0) {
        // in place (oomb_mul_ext / oomb_swiglu_ext results, their transposed views in dW products)
        const size_t e = 2;
        if (oomb_is_contiguous(b)) {
            B = (const __nv_bfloat16 *) b->data;
        } else if (B2 == 1 && B3 == 1 && (K <= 1 || b->nb[0] == e) && b->nb[1] % e == 0 && (N <= 1 || (int64_t) (b->nb[1] / e) >= K)) {
            B = (const __nv_bfloat16 *) b->data;
            ldb = N <= 1 ? K : (int64_t) (b->nb[1] / e);
        } else if (B2 == 1 && B3 == 1 && (N <= 1 || b->nb[1] == e) && b->nb[0] % e == 0 && (K <= 1 || (int64_t) (b->nb[0] / e) >= N)) {
            B = (const __nv_bfloat16 *) b->data;
            opb = CUBLAS_OP_T;
            ldb = K <= 1 ? N : (int64_t) (b->nb[0] / e);
        }
    }
    if (!B) {
        B = to_bf16_transposed(c, b, b_graph, nullptr);
        if (B) { opb = CUBLAS_OP_T; ldb = N; }
        else B = bf16_copy_of(c, b, b_graph, nullptr);
    }

    // a: in place (bf16, unit stride in dim 0 or 1) or a contiguous bf16 copy
    const __nv_bfloat16 * A = nullptr;
    cublasOperation_t opa = CUBLAS_OP_T;
    int64_t lda = K, sA2 = K * M, sA3 = K * M * A2;
    if (a->type == OOMB_TYPE_BF16 && (uintptr_t) a->data % 2 == 0 && a->nb[2] % 2 == 0 && a->nb[3] % 2 == 0) {
        const int64_t e = 2;
        if ((K <= 1 || (int64_t) a->nb[0] == e) && a->nb[1] % e == 0) {
            const int64_t ld = M <= 1 ? K : (int64_t) a->nb[1] / e;
            if (ld >= K) { A = (const __nv_bfloat16 *) a->data; opa = CUBLAS_OP_T; lda = ld; }
        }
        if (!A && (M <= 1 || (int64_t) a->nb[1] == e) && a->nb[0] % e == 0) {
            const int64_t ld = K <= 1 ? M : (int64_t) a->nb[0] / e;
            if (ld >= M) { A = (const __nv_bfloat16 *) a->data; opa = CUBLAS_OP_N; lda = ld; }
        }
        if (A) {
            sA2 = (int64_t) a->nb[2] / e;
            sA3 = (int64_t) a->nb[3] / e;
        }
    }
    if (!A && (A = to_bf16_transposed(c, a, a_graph, B))) {
        opa = CUBLAS_OP_N;  // [K, M] with M the unit-stride dim: column-major M x K
        lda = M;
        sA2 = K * M;
        sA3 = K * M * A2;
    }
    if (!A) {
        A = bf16_copy_of(c, a, a_graph, B);
        opa = CUBLAS_OP_T;
        lda = K;
        sA2 = K * M;
        sA3 = K * M * A2;
    }

    // the result: f32, or bf16 (oomb_mul_mat_ext: cuBLAS rounds the f32 sums once); a fused accumulation
    // (acc) adds into f32 gradients only
    const bool cbf = dst->type == OOMB_TYPE_BF16;
    if (cbf && acc) oomb_error("mul_mat: internal: a bf16 result %s cannot add into an accumulation", shape_str(dst).c_str());
    const cudaDataType_t ctype = cbf ? CUDA_R_16BF : CUDA_R_32F;
    const size_t ces = cbf ? 2 : 4;
    void * C = acc ? (void *) acc : dst->data;
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream));
    if (A2 == 1 && A3 == 1) {
        const int64_t NN = N * B2 * B3;
        if (!fits_int(M) || !fits_int(NN) || !fits_int(K) || !fits_int(lda)) {
            oomb_error("mul_mat: sizes exceed cuBLAS's int range: a %s, b %s", shape_str(a).c_str(), shape_str(b).c_str());
        }
        if (!fits_int(ldb)) oomb_error("mul_mat: sizes exceed cuBLAS's int range: b %s", shape_str(b).c_str());
        if (epi && lt_gemm(c, opa, opb, M, NN, K, A, lda, B, ldb, *epi)) {
            c.n_fused_epi++;
            return true;
        }
        CUBLAS_CHECK(cublasGemmEx(c.cublas, opa, opb, (int) M, (int) NN, (int) K, &alpha, A, CUDA_R_16BF, (int) lda, B,
                                  CUDA_R_16BF, (int) ldb, &beta, C, ctype, (int) M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return epi == nullptr;
    }
    const int64_t NN = N * r2;
    if (!fits_int(M) || !fits_int(NN) || !fits_int(K) || !fits_int(lda) || !fits_int(A2)) {
        oomb_error("mul_mat: sizes exceed cuBLAS's int range: a %s, b %s", shape_str(a).c_str(), shape_str(b).c_str());
    }
    // a batched product never has a flipped b: to_bf16_transposed takes only unbatched b (B2 = B3 = 1),
    // which forces A2 = A3 = 1 (B2 % A2 == 0), i.e. the single GEMM above
    if (opb != CUBLAS_OP_N || ldb != K) oomb_error("mul_mat: internal: transposed or strided b in a batched product");
    for (int64_t i3 = 0; i3 < B3; i3++) {
        const int64_t a3 = i3 / r3;
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(c.cublas, opa, CUBLAS_OP_N, (int) M, (int) NN, (int) K, &alpha, A + a3 * sA3, CUDA_R_16BF,
                                                (int) lda, (long long) sA2, B + i3 * K * N * B2, CUDA_R_16BF, (int) K,
                                                (long long) (K * NN), &beta, (char *) C + (size_t) (i3 * M * N * B2) * ces, ctype, (int) M,
                                                (long long) (M * NN), (int) A2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return epi == nullptr;
}
