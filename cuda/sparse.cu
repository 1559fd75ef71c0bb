// Page summaries and top-K page selection on the CUDA backend (oomb-sparse.h). The rule's pieces
// (tile rows, always-kept pages, ranking, Quest bound) are the shared ones of
// src/oomb/sparse-impl.h; the loops follow the CPU reference (src/oomb/sparse.cpp):
//   * page_summary: one block per (completed page, KV head), a thread per dimension summing the
//     page's slots in order: bit-identical to the CPU.
//   * page_select: two kernels. k_page_scores: one block per (query tile, KV head, token slice of
//     the tile: 16 slices), so that a chunk of 16 tiles keeps every SM busy (one block per tile was
//     43 % of a 7B sparse step at 64K on the H200: 16 blocks for 132 SMs, 512 serial (token, head)
//     rounds each); per 8 tokens a thread reads each of its pages' summaries once, the group-summed
//     queries sit in shared memory, the softmax's max and sum are block reductions (a tree: the sum
//     may differ from the CPU's in the last bits) and the logits are recomputed per pass (CPU order,
//     no FMA) instead of stored; each block writes its slice's partial scores. k_page_topk: one block
//     per tile sums the partials (a fixed order, so the result is deterministic), then the top-K is K
//     rounds of a block arg-max under ps_ranks_before. Partials, scores and marks live in global
//     scratch ([tiles][KV heads][16][pages] + [tiles][2][pages] floats), so the history length is not
//     bounded by shared memory.
// Positions must be consecutive (pos[t] = pos[0] + t), not checked here (as for paged_attn).

#include "common.cuh"
#include "sparse.cuh"
#include "oomb-sparse.h"
#include "../src/oomb/sparse-impl.h"

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

// page_select, part 1: the scores of one (query tile j, KV head g, token slice ts), summed over the
// slice's tokens into partial[((j * Hkv + g) * TS + ts) * n_logical + p]. Each thread owns the pages
// p = tid (mod blockDim) and handles TB tokens at a time, reading every summary once per TB tokens;
// mean: three passes over the thread's pages (logits -> per-token block max, -> block sum, -> the
// softmax terms), recomputing the logits (in the CPU's order, no FMA) instead of storing them.
constexpr int k_sel_slices = 16;  // TS: token slices per query tile (blocks per tile and KV head)
constexpr int k_sel_tb = 8;       // TB: tokens per pass

__global__ void k_page_scores(const float * q, const float * sm, const int32_t * pos, float * partial, int64_t D, int64_t H,
                              int64_t T, int64_t S, int64_t Hkv, int64_t n_logical, int64_t P, int64_t K, int score_kind) {
    extern __shared__ float qs[];  // [TB][D]
    __shared__ float red[32];
    __shared__ float stat_m[k_sel_tb], stat_s[k_sel_tb];
    const int64_t j = blockIdx.x, g = blockIdx.y, ts = blockIdx.z;
    const int64_t c0 = pos[0] / P, n_act = (int64_t) pos[T - 1] / P - c0 + 1;
    if (j >= n_act || c0 <= K) return;  // no tile, or a dense tile: part 2 lists every page
    const int tid = threadIdx.x, nt = blockDim.x;
    float * part = partial + ((j * Hkv + g) * k_sel_slices + ts) * n_logical;
    for (int64_t p = tid; p < c0; p += nt) part[p] = 0.0f;  // owned by this thread from here on
    int64_t t0, t1;
    oomb::ps_tile_rows(pos[0], T, P, j, &t0, &t1);
    const int64_t per = (t1 - t0 + k_sel_slices - 1) / k_sel_slices, tb = t0 + ts * per, te = tb + per < t1 ? tb + per : t1;
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
        if (score_kind == OOMB_SPARSE_SCORE_QUEST) {
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
            continue;
        }
        // the logits of this thread's page p for the pass's tokens (the CPU's order of products and sums)
        auto logits = [&](int64_t p, float * l) {
            const float * mu = sm + (p * Hkv + g) * S * D;
            for (int i = 0; i < k_sel_tb; i++) l[i] = 0.0f;
            for (int64_t d = 0; d < D; d++) {
                const float m = mu[d];
#pragma unroll
                for (int i = 0; i < k_sel_tb; i++)
                    if (i < nb) l[i] = __fadd_rn(l[i], __fmul_rn(qs[i * D + d], m));
            }
        };
        float l[k_sel_tb], acc[k_sel_tb];
        for (int i = 0; i < k_sel_tb; i++) acc[i] = -INFINITY;
        for (int64_t p = tid; p < c0; p += nt) {
            logits(p, l);
            for (int i = 0; i < k_sel_tb; i++) acc[i] = fmaxf(acc[i], l[i]);
        }
        for (int i = 0; i < nb; i++) {
            const float m = oomb_block_max(acc[i], red);
            if (tid == 0) stat_m[i] = m;
        }
        __syncthreads();
        for (int i = 0; i < k_sel_tb; i++) acc[i] = 0.0f;
        for (int64_t p = tid; p < c0; p += nt) {
            logits(p, l);
            for (int i = 0; i < nb; i++) acc[i] += expf(l[i] - stat_m[i]);
        }
        for (int i = 0; i < nb; i++) {
            const float sum = oomb_block_sum(acc[i], red);
            if (tid == 0) stat_s[i] = sum;
        }
        __syncthreads();
        for (int64_t p = tid; p < c0; p += nt) {
            logits(p, l);
            float add = 0.0f;
            for (int i = 0; i < nb; i++) add += expf(l[i] - stat_m[i]) / stat_s[i];
            part[p] += add;
        }
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
    k_page_scores<<<dim3((unsigned) nqt, (unsigned) Hkv, k_sel_slices), k_threads, (size_t) D * k_sel_tb * sizeof(float), c.stream>>>(
        (const float *) q->data, (const float *) sm->data, pos, scratch, D, H, T, S, Hkv, n_logical, P, K,
        (int) dst->op_params[oomb::PS_PARAM_SCORE]);
    OOMB_CUDA_LAUNCHED(c, "page_select (scores)");
    k_page_topk<<<(unsigned) nqt, k_threads, 0, c.stream>>>(pos, scratch, (int32_t *) dst->data, scratch + n_part, T, Hkv, n_logical, P, K,
                                                          dst->op_params[oomb::PS_PARAM_SINK], dst->op_params[oomb::PS_PARAM_LOCAL], nqt);
    OOMB_CUDA_LAUNCHED(c, "page_select");
}
