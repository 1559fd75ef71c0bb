// Page summaries and top-K page selection on the CUDA backend (oomb-sparse.h). The rule's pieces
// (tile rows, always-kept pages, ranking, Quest bound) are the shared ones of
// src/oomb/sparse-impl.h; the loops follow the CPU reference (src/oomb/sparse.cpp):
//   * page_summary: one block per (completed page, KV head), a thread per dimension summing the
//     page's slots in order: bit-identical to the CPU.
//   * page_select: one block per query tile; each thread owns the pages p = tid (mod blockDim);
//     per (token, KV head) the block forms the group-summed query in shared memory, each thread
//     scores its pages (dot products in the CPU's order), the softmax's max and sum are block
//     reductions (a tree: the sum may differ from the CPU's in the last bits), and the top-K is K
//     rounds of a block arg-max under ps_ranks_before. Logits and scores live in global scratch,
//     so the history length is not bounded by shared memory.
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
                mn = fminf(mn, k);
                mx = fmaxf(mx, k);
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

__global__ void k_page_select(const float * q, const float * sm, const int32_t * pos, int32_t * out, float * scratch, int64_t D,
                              int64_t H, int64_t T, int64_t S, int64_t Hkv, int64_t n_logical, int64_t P, int64_t K, int64_t sink,
                              int64_t local, int score_kind, int64_t nqt) {
    extern __shared__ float qs[];  // [D]
    __shared__ float red[32];
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
    float * logit = scratch + j * 2 * n_logical, * score = logit + n_logical;
    for (int64_t p = tid; p < c0; p += nt) score[p] = 0.0f;
    int64_t t0, t1;
    oomb::ps_tile_rows(pos[0], T, P, j, &t0, &t1);
    const int64_t G = H / Hkv;
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t g = 0; g < Hkv; g++) {
            __syncthreads();  // qs of the previous (t, g) fully read
            for (int64_t d = tid; d < D; d += nt) {
                float a = 0.0f;
                for (int64_t h = g * G; h < (g + 1) * G; h++) a += q[(t * H + h) * D + d];
                qs[d] = a;
            }
            __syncthreads();
            if (score_kind == OOMB_SPARSE_SCORE_QUEST) {
                for (int64_t p = tid; p < c0; p += nt) {
                    const float * mn = sm + (p * Hkv + g) * S * D, * mx = mn + D;
                    float b = 0.0f;
                    for (int64_t d = 0; d < D; d++) b += oomb::ps_quest_term(qs[d], mn[d], mx[d]);
                    score[p] += b;
                }
                continue;
            }
            float m = -INFINITY;
            for (int64_t p = tid; p < c0; p += nt) {
                const float * mu = sm + (p * Hkv + g) * S * D;
                float l = 0.0f;
                for (int64_t d = 0; d < D; d++) l = __fadd_rn(l, __fmul_rn(qs[d], mu[d]));  // no FMA: the CPU's roundings
                logit[p] = l;
                m = fmaxf(m, l);
            }
            m = oomb_block_max(m, red);
            float s = 0.0f;
            for (int64_t p = tid; p < c0; p += nt) s += expf(logit[p] - m);
            s = oomb_block_sum(s, red);
            for (int64_t p = tid; p < c0; p += nt) score[p] += expf(logit[p] - m) / s;
        }
    }
    // marks (reusing the logits): the always-kept pages, then K - sink - local rounds of arg-max
    float * mark = logit;
    for (int64_t p = tid; p < c0; p += nt) mark[p] = oomb::ps_always_kept(p, c0, sink, local) ? 1.0f : 0.0f;
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
    if ((size_t) D * sizeof(float) > 48 * 1024) oomb_error("page_select: head dim %lld is too large", (long long) D);
    float * scratch = (float *) c.scratch(oomb_cuda_ctx::SLOT_PAGED, (size_t) nqt * 2 * (size_t) n_logical * sizeof(float));
    k_page_select<<<(unsigned) nqt, k_threads, (size_t) D * sizeof(float), c.stream>>>(
        (const float *) q->data, (const float *) sm->data, (const int32_t *) dst->src[oomb::PSEL_SRC_POS]->data, (int32_t *) dst->data,
        scratch, D, H, T, S, Hkv, n_logical, dst->op_params[oomb::PS_PARAM_PAGE], dst->op_params[oomb::PS_PARAM_K],
        dst->op_params[oomb::PS_PARAM_SINK], dst->op_params[oomb::PS_PARAM_LOCAL], dst->op_params[oomb::PS_PARAM_SCORE], nqt);
    OOMB_CUDA_LAUNCHED(c, "page_select");
}
