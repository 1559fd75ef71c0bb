// Page summaries and top-K page selection on the CUDA backend (oomb-sparse.h). The rule's pieces
// (tile rows, always-kept pages, ranking, Quest bound) are the shared ones of
// src/oomb/sparse-impl.h; the loops follow the CPU reference (src/oomb/sparse.cpp):
//   * page_summary: one block per (completed page, KV head), a thread per dimension summing the
//     page's slots in order: bit-identical to the CPU.
//   * page_select: the partial scores of each (query tile, KV head, token slice of the tile: 16 slices,
//     so that a chunk of 16 tiles keeps every SM busy), then k_page_topk. Mean: the logits q_g .
//     mean_{g,p} of all tokens and pages are one f32 cuBLAS GEMM per pass (group-summed queries x
//     summaries), then k_page_scores_mean takes each token row's softmax (block reductions: a tree,
//     so sums may differ from the CPU's in the last bits, as the GEMM's products and sums do) and sums
//     the slice's softmax terms per page. Before (one thread per page recomputing the logits three
//     times from scattered summary reads) page_select took 2.20 s of a 7B sparse step at 128K, now
//     0.49 s (H200), and the 7B 1M sparse step went from 445 s to 327 s (bench/sparse/RESULTS.md).
//     Quest (not a product: sum_d max(q_d min_d, q_d max_d)): k_page_scores_quest, a thread per
//     page over 8 tokens at a time. k_page_topk: one block per tile sums the partials (a
//     fixed order, so the result is deterministic), then the top-K is K rounds of a block arg-max
//     under ps_ranks_before. Partials, scores and marks live in global scratch ([tiles][KV heads][16]
//     [pages] + [tiles][2][pages] floats), so the history length is not bounded by shared memory.
// Positions must be consecutive (pos[t] = pos[0] + t), not checked here (as for paged_attn).

#include "common.cuh"
#include "sparse.cuh"
#include "oomb-sparse.h"
#include "../src/oomb/sparse-impl.h"

#include <algorithm>
#include <cstdlib>

namespace {

const int k_threads = 256;

__global__ void k_page_summary(float * sum, const char * kp, int ktype, size_t esz, const int32_t * pt, const int32_t * pos,
                               int64_t D, int64_t Hkv, int64_t P, int64_t S, int64_t T) {
    const int64_t lp0 = pos[0] / P, lp1 = ((int64_t) pos[T - 1] + 1) / P, lp = lp0 + blockIdx.x, g = blockIdx.y;
    if (lp >= lp1) return;
    const int64_t base = (int64_t) pt[lp] * P * Hkv * D + g * D;
    float * out = sum + (lp * Hkv + g) * S * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        if (S == 1) {
            float acc = 0.0f;
            for (int64_t i = 0; i < P; i++) acc += oomb_load_f(kp + (size_t) (base + i * Hkv * D + d) * esz, ktype);
            out[d] = acc / (float) P;
        } else {
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t i = 0; i < P; i++) {
                const float k = oomb_load_f(kp + (size_t) (base + i * Hkv * D + d) * esz, ktype);
                mn = oomb::ps_min_nan(mn, k);  // a NaN key makes the summary NaN, as on the CPU (sparse-impl.h)
                mx = oomb::ps_max_nan(mx, k);
            }
            out[d] = mn;
            out[D + d] = mx;
        }
    }
}

// The better of two (score, page) candidates; page < 0: none.
__device__ __forceinline__ void pick(float & s, int & p, float s2, int p2) {
    if (p2 < 0) return;
    if (p < 0 || oomb::ps_ranks_before(s2, p2, s, p)) {
        s = s2;
        p = p2;
    }
}

// page_select, part 1: the partial scores of one (query tile j, KV head g, token slice ts), summed
// over the slice's tokens into partial[((j * Hkv + g) * TS + ts) * n_logical + p], TS slices per tile so
// that a chunk of 16 tiles keeps every SM busy.
constexpr int k_sel_slices = 16;  // TS: token slices per query tile (blocks per tile and KV head)
constexpr int k_sel_tb = 8;       // TB: tokens per pass

// The slice [tb, te) of tile j's rows that block z of k_sel_slices handles.
__device__ __forceinline__ void sel_slice(const int32_t * pos, int64_t T, int64_t P, int64_t j, int64_t ts, int64_t * tb, int64_t * te) {
    int64_t t0, t1;
    oomb::ps_tile_rows(pos[0], T, P, j, &t0, &t1);
    const int64_t per = (t1 - t0 + k_sel_slices - 1) / k_sel_slices;
    *tb = t0 + ts * per;
    *te = *tb + per < t1 ? *tb + per : t1;
    if (*tb > *te) *tb = *te;
}

// Quest: each thread owns the pages p = tid (mod blockDim) and handles TB tokens at a time, reading
// every summary once per TB tokens; the group-summed queries sit in shared memory.
// The preamble both score kernels share: the block's query tile j, KV head g and slice ts. Returns
// false when there is nothing to score (no such tile, or a dense tile: part 2 lists every page);
// else zeroes the block's partial row (each thread owns the pages p = tid + k nt from here on) and
// gives the row (*part) and the slice's token range [tb, te) (sel_slice).
__device__ bool sel_block_begin(const int32_t * pos, float * partial, int64_t T, int64_t Hkv, int64_t n_logical, int64_t P, int64_t K,
                                int64_t j, int64_t g, int64_t ts, float ** part, int64_t * tb, int64_t * te) {
    const int64_t c0 = pos[0] / P, n_act = (int64_t) pos[T - 1] / P - c0 + 1;
    if (j >= n_act || c0 <= K) return false;
    *part = partial + ((j * Hkv + g) * k_sel_slices + ts) * n_logical;
    for (int64_t p = threadIdx.x; p < c0; p += blockDim.x) (*part)[p] = 0.0f;
    sel_slice(pos, T, P, j, ts, tb, te);
    return true;
}

__global__ void k_page_scores_quest(const float * q, const float * sm, const int32_t * pos, float * partial, int64_t D, int64_t H,
                                    int64_t T, int64_t S, int64_t Hkv, int64_t n_logical, int64_t P, int64_t K) {
    extern __shared__ float qs[];  // [TB][D]
    const int64_t j = blockIdx.x, g = blockIdx.y, ts = blockIdx.z;
    float * part;
    int64_t tb, te;
    if (!sel_block_begin(pos, partial, T, Hkv, n_logical, P, K, j, g, ts, &part, &tb, &te)) return;
    const int64_t c0 = pos[0] / P;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int64_t G = H / Hkv;
    for (int64_t tt = tb; tt < te; tt += k_sel_tb) {
        const int nb = (int) (te - tt < k_sel_tb ? te - tt : k_sel_tb);
        __syncthreads();  // qs of the previous pass fully read
        for (int64_t i = tid; i < (int64_t) nb * D; i += nt) {
            const int64_t t = tt + i / D, d = i % D;
            float a = 0.0f;
            for (int64_t h = g * G; h < (g + 1) * G; h++) a += q[(t * H + h) * D + d];
            qs[i] = a;
        }
        __syncthreads();
        for (int64_t p = tid; p < c0; p += nt) {
            const float * mn = sm + (p * Hkv + g) * S * D, * mx = mn + D;
            float b = 0.0f;
            for (int i = 0; i < nb; i++) {
                float bi = 0.0f;
                for (int64_t d = 0; d < D; d++) bi += oomb::ps_quest_term(qs[i * D + d], mn[d], mx[d]);
                b += bi;
            }
            part[p] += b;
        }
    }
}

// Mean, step 1: qg[g][t][d] = the sum of the queries of GQA group g (heads in order, as the CPU).
__global__ void k_group_queries(const float * q, float * qg, int64_t D, int64_t H, int64_t T, int64_t Hkv) {
    const int64_t n = Hkv * T * D, G = H / Hkv;
    for (int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t) gridDim.x * blockDim.x) {
        const int64_t d = i % D, t = (i / D) % T, g = i / (D * T);
        float a = 0.0f;
        for (int64_t h = g * G; h < (g + 1) * G; h++) a += q[(t * H + h) * D + d];
        qg[i] = a;
    }
}

// Mean, step 3 (step 2 is the logits GEMM, oomb_cuda_page_select): block (j0 + x, g0 + y, slice z)
// reads its tokens' logits rows (logits[(g - g0) * rows + t - r0][p], p < c0: one coalesced row per
// token) three times: the row max, the sum of exp, then the softmax terms summed over the tokens per page.
__global__ void k_page_scores_mean(const int32_t * pos, const float * logits, float * partial, int64_t T, int64_t Hkv,
                                   int64_t n_logical, int64_t P, int64_t K, int64_t j0, int64_t g0, int64_t r0, int64_t rows) {
    __shared__ float red[32];
    __shared__ float stat_m[k_sel_tb], stat_s[k_sel_tb];
    const int64_t j = j0 + blockIdx.x, g = g0 + blockIdx.y, ts = blockIdx.z;
    float * part;
    int64_t tb, te;
    if (!sel_block_begin(pos, partial, T, Hkv, n_logical, P, K, j, g, ts, &part, &tb, &te)) return;
    const int64_t c0 = pos[0] / P;
    const int tid = threadIdx.x, nt = blockDim.x;
    const float * L = logits + (int64_t) blockIdx.y * rows * n_logical;  // row of token t: L + (t - r0) * n_logical
    for (int64_t tt = tb; tt < te; tt += k_sel_tb) {
        const int nb = (int) (te - tt < k_sel_tb ? te - tt : k_sel_tb);
        float acc[k_sel_tb];
        for (int i = 0; i < k_sel_tb; i++) acc[i] = -INFINITY;
        for (int64_t p = tid; p < c0; p += nt)
            for (int i = 0; i < nb; i++) acc[i] = fmaxf(acc[i], L[(tt + i - r0) * n_logical + p]);
        for (int i = 0; i < nb; i++) {
            const float m = oomb_block_max(acc[i], red);
            if (tid == 0) stat_m[i] = m;
        }
        __syncthreads();
        for (int i = 0; i < k_sel_tb; i++) acc[i] = 0.0f;
        for (int64_t p = tid; p < c0; p += nt)
            for (int i = 0; i < nb; i++) acc[i] += expf(L[(tt + i - r0) * n_logical + p] - stat_m[i]);
        for (int i = 0; i < nb; i++) {
            const float sum = oomb_block_sum(acc[i], red);
            if (tid == 0) stat_s[i] = sum;
        }
        __syncthreads();
        for (int64_t p = tid; p < c0; p += nt) {
            float add = 0.0f;
            for (int i = 0; i < nb; i++) add += expf(L[(tt + i - r0) * n_logical + p] - stat_m[i]) / stat_s[i];
            part[p] += add;
        }
        __syncthreads();  // stat_m / stat_s of this pass fully read
    }
}

// page_select, part 2: one block per query tile writes its offsets entry and its list: every
// history page while it has <= K; else the partial scores summed (KV heads, then slices, in order),
// the always-kept pages marked, and K - sink - local rounds of a block arg-max under ps_ranks_before.
__global__ void k_page_topk(const int32_t * pos, const float * partial, int32_t * out, float * scratch, int64_t T, int64_t Hkv,
                            int64_t n_logical, int64_t P, int64_t K, int64_t sink, int64_t local, int64_t nqt) {
    __shared__ float best_s[32];
    __shared__ int best_p[32];
    const int64_t j = blockIdx.x, c0 = pos[0] / P, n_act = (int64_t) pos[T - 1] / P - c0 + 1, len = oomb::ps_list_len(c0, K);
    const int tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) {
        if (j == 0) out[0] = 0;
        out[j + 1] = (int32_t) ((j + 1 < n_act ? j + 1 : n_act) * len);
    }
    if (j >= n_act) return;
    int32_t * list = out + nqt + 1 + j * len;
    if (c0 <= K) {
        for (int64_t p = tid; p < c0; p += nt) list[p] = (int32_t) p;
        return;
    }
    float * score = scratch + j * 2 * n_logical, * mark = score + n_logical;
    for (int64_t p = tid; p < c0; p += nt) {
        float sc = 0.0f;
        for (int64_t i = 0; i < Hkv * k_sel_slices; i++) sc += partial[(j * Hkv * k_sel_slices + i) * n_logical + p];
        score[p] = sc;
        mark[p] = oomb::ps_always_kept(p, c0, sink, local) ? 1.0f : 0.0f;
    }
    const int64_t n_free = K - sink - local;
    const int lane = tid & 31, w = tid >> 5, nw = nt >> 5;
    for (int64_t r = 0; r < n_free; r++) {
        __syncthreads();  // marks of the previous round visible
        float bs = 0.0f;
        int bp = -1;
        for (int64_t p = tid; p < c0; p += nt)
            if (mark[p] == 0.0f) pick(bs, bp, score[p], (int) p);
        for (int o = 16; o > 0; o >>= 1) {
            const float s2 = __shfl_down_sync(0xffffffffu, bs, o);
            const int p2 = __shfl_down_sync(0xffffffffu, bp, o);
            pick(bs, bp, s2, p2);
        }
        if (lane == 0) {
            best_s[w] = bs;
            best_p[w] = bp;
        }
        __syncthreads();
        if (tid == 0) {
            float s = best_s[0];
            int p = best_p[0];
            for (int i = 1; i < nw; i++) pick(s, p, best_s[i], best_p[i]);
            if (p >= 0) mark[p] = 1.0f;
        }
    }
    __syncthreads();
    if (tid == 0) {
        int64_t n = 0;
        for (int64_t p = 0; p < c0; p++)
            if (mark[p] != 0.0f) list[n++] = (int32_t) p;
    }
}

} // namespace

void oomb_cuda_page_summary(oomb_cuda_ctx & c, oomb_tensor * dst) {
    const oomb_tensor * kp = dst->src[oomb::PSUM_SRC_K_PAGES], * pos = dst->src[oomb::PSUM_SRC_POS];
    const int64_t D = kp->ne[0], Hkv = kp->ne[1], P = kp->ne[2], S = dst->ne[1], T = pos->ne[0];
    const int64_t max_pages = (T + P - 1) / P + 1;  // pages a chunk of T positions can complete
    if (max_pages > INT32_MAX || Hkv > 65535) oomb_error("page_summary: %lld pages x %lld KV heads are too many for one launch", (long long) max_pages, (long long) Hkv);
    const int threads = (int) (D >= k_threads ? k_threads : (D + 31) / 32 * 32);
    k_page_summary<<<dim3((unsigned) max_pages, (unsigned) Hkv), threads, 0, c.stream>>>(
        (float *) dst->data, (const char *) kp->data, (int) kp->type, oomb_type_size(kp->type),
        (const int32_t *) dst->src[oomb::PSUM_SRC_PAGE_TABLE]->data, (const int32_t *) pos->data, D, Hkv, P, S, T);
    OOMB_CUDA_LAUNCHED(c, "page_summary");
}

// Bytes the mean score's logits may take at once (scratch slot SLOT_SELECT): 256 MiB, or
// OOMB_PAGE_SELECT_SCRATCH bytes (tests set it small to run the split passes).
static size_t select_logits_budget() {
    const char * e = getenv("OOMB_PAGE_SELECT_SCRATCH");
    const long long v = e && *e ? atoll(e) : 0;
    return v > 0 ? (size_t) v : (size_t) 256 << 20;
}

void oomb_cuda_page_select(oomb_cuda_ctx & c, oomb_tensor * dst) {
    const oomb_tensor * q = dst->src[oomb::PSEL_SRC_Q], * sm = dst->src[oomb::PSEL_SRC_SUMMARY];
    const int64_t D = q->ne[0], H = q->ne[1], T = q->ne[2], S = sm->ne[1], Hkv = sm->ne[2], n_logical = sm->ne[3];
    const int64_t nqt = dst->op_params[oomb::PS_PARAM_NQT];
    if (Hkv > 65535) oomb_error("page_select: %lld KV heads are too many for one launch", (long long) Hkv);
    if ((size_t) D * k_sel_tb * sizeof(float) > 48 * 1024) oomb_error("page_select: head dim %lld is too large", (long long) D);
    // scratch: the partial scores [nqt][Hkv][TS][n_logical], then per tile the summed scores and marks [nqt][2][n_logical]
    const size_t n_part = (size_t) nqt * (size_t) Hkv * k_sel_slices * (size_t) n_logical;
    float * scratch = (float *) c.scratch(oomb_cuda_ctx::SLOT_PAGED, (n_part + (size_t) nqt * 2 * (size_t) n_logical) * sizeof(float));
    const int32_t * pos = (const int32_t *) dst->src[oomb::PSEL_SRC_POS]->data;
    const int64_t P = dst->op_params[oomb::PS_PARAM_PAGE], K = dst->op_params[oomb::PS_PARAM_K];
    if (dst->op_params[oomb::PS_PARAM_SCORE] == OOMB_SPARSE_SCORE_QUEST) {
        k_page_scores_quest<<<dim3((unsigned) nqt, (unsigned) Hkv, k_sel_slices), k_threads, (size_t) D * k_sel_tb * sizeof(float), c.stream>>>(
            (const float *) q->data, (const float *) sm->data, pos, scratch, D, H, T, S, Hkv, n_logical, P, K);
        OOMB_CUDA_LAUNCHED(c, "page_select (quest scores)");
    } else if (T > 0 && n_logical > 0) {
        // mean: the logits q_g . mean_{g,p} of every token and every logical page as an f32 GEMM (the
        // tensor cores are not used: CUBLAS_COMPUTE_32F), then the softmax over each row's c0 history
        // pages. The host does not know c0 (pos is on the device): the GEMM covers all n_logical pages,
        // the pages >= c0 are never read. Passes over KV heads and tile ranges keep the logits within
        // select_logits_budget(): tiles [j0, j1) have their rows inside [max(0, (j0 - 1) P + 1), min(T, j1 P)).
        const size_t row_bytes = (size_t) n_logical * sizeof(float), budget = select_logits_budget();
        const bool one = (size_t) Hkv * (size_t) T * row_bytes <= budget;
        const int64_t n_g = one ? Hkv : 1;
        const int64_t tiles = one ? nqt : std::max<int64_t>(1, (int64_t) (budget / (row_bytes * (size_t) P)) - 1);
        const int64_t max_rows = one ? T : std::min<int64_t>(T, (tiles + 1) * P);
        float * qg = (float *) c.scratch(oomb_cuda_ctx::SLOT_SELECT, ((size_t) Hkv * T * D + (size_t) n_g * max_rows * n_logical) * sizeof(float));
        float * logits = qg + (size_t) Hkv * T * D;
        const int64_t n = Hkv * T * D;
        k_group_queries<<<(unsigned) std::min<int64_t>((n + k_threads - 1) / k_threads, 4096), k_threads, 0, c.stream>>>(
            (const float *) q->data, qg, D, H, T, Hkv);
        OOMB_CUDA_LAUNCHED(c, "page_select (group queries)");
        CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream));
        const float one_f = 1.0f, zero_f = 0.0f;
        for (int64_t g0 = 0; g0 < Hkv; g0 += n_g)
            for (int64_t j0 = 0; j0 < nqt; j0 += tiles) {
                const int64_t j1 = std::min(nqt, j0 + tiles);
                const int64_t r0 = one ? 0 : std::max<int64_t>(0, (j0 - 1) * P + 1), r1 = one ? T : std::min<int64_t>(T, j1 * P);
                if (r1 <= r0) continue;  // tiles past the chunk's last row: none active
                // column-major: C (n_logical x rows, ld n_logical) = A^T B, A = the summaries of KV head g
                // (D x n_logical, ld Hkv S D), B = qg of g's rows r0.. (D x rows, ld D); batched over the pass's heads
                CUBLAS_CHECK(cublasGemmStridedBatchedEx(c.cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int) n_logical, (int) (r1 - r0), (int) D, &one_f,
                                                        (const float *) sm->data + g0 * S * D, CUDA_R_32F, (int) (Hkv * S * D), S * D,
                                                        qg + (g0 * T + r0) * D, CUDA_R_32F, (int) D, T * D, &zero_f, logits, CUDA_R_32F,
                                                        (int) n_logical, (r1 - r0) * n_logical, (int) n_g, CUBLAS_COMPUTE_32F,
                                                        CUBLAS_GEMM_DEFAULT));
                k_page_scores_mean<<<dim3((unsigned) (j1 - j0), (unsigned) n_g, k_sel_slices), k_threads, 0, c.stream>>>(
                    pos, logits, scratch, T, Hkv, n_logical, P, K, j0, g0, r0, r1 - r0);
                OOMB_CUDA_LAUNCHED(c, "page_select (mean scores)");
            }
    }
    k_page_topk<<<(unsigned) nqt, k_threads, 0, c.stream>>>(pos, scratch, (int32_t *) dst->data, scratch + n_part, T, Hkv, n_logical, P, K,
                                                          dst->op_params[oomb::PS_PARAM_SINK], dst->op_params[oomb::PS_PARAM_LOCAL], nqt);
    OOMB_CUDA_LAUNCHED(c, "page_select");
}
