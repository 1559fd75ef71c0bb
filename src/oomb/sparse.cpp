// Page-level top-K sparse attention (oomb-sparse.h): the op constructors and the CPU reference
// kernels of page_summary and page_select. The CUDA kernels (cuda/sparse.cu) follow the same
// loops (the same summation order for the summaries, so those are bit-identical; the selection's
// softmax sums over pages in a tree there, so scores may differ in the last bits). NaN keys: the
// mean summary is NaN through its sum; the quest min / max propagate NaN (ps_min_nan / ps_max_nan),
// so the page's score is NaN and the shared ranking (ps_ranks_before: a NaN score ranks below every
// number, ties by page) selects it last, on the CPU and in the CUDA top-K alike.

#include "oomb-sparse.h"
#include "oomb.h"
#include "oomb-impl.h"
#include "sparse-impl.h"
#include "../cpu/thread-pool.h"
#include "../fp16.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <vector>

using oomb::shape_str;

struct oomb_sparse_params oomb_sparse_default_params(void) {
    oomb_sparse_params p;
    p.pages = 64;
    p.score = OOMB_SPARSE_SCORE_MEAN;
    p.sink = 0;
    p.local = 0;
    return p;
}

void oomb_sparse_check_params(const struct oomb_sparse_params * p, const char * what) {
    if (!p) oomb_error("%s: sparse parameters are NULL", what);
    if (p->pages < 1) oomb_error("%s: sparse page budget K = %d must be >= 1", what, p->pages);
    if (p->score != OOMB_SPARSE_SCORE_MEAN && p->score != OOMB_SPARSE_SCORE_QUEST)
        oomb_error("%s: unknown sparse score %d (mean = 0, quest = 1)", what, (int) p->score);
    if (p->sink < 0 || p->local < 0) oomb_error("%s: sparse sink %d / local %d pages must be >= 0", what, p->sink, p->local);
    if ((int64_t) p->sink + p->local > p->pages)
        oomb_error("%s: sparse sink %d + local %d pages exceed the budget K = %d (they count inside it)", what, p->sink, p->local,
                   p->pages);
}

int oomb_sparse_summary_slots(enum oomb_sparse_score score) { return score == OOMB_SPARSE_SCORE_QUEST ? 2 : 1; }

double oomb_sparse_summary_bytes_per_token(enum oomb_sparse_score score, int64_t n_head_kv, int64_t head_dim, int64_t page) {
    return (double) oomb_sparse_summary_slots(score) * (double) n_head_kv * (double) head_dim * 4.0 / (double) page;
}

int64_t oomb_page_select_max_qtiles(int64_t T, int32_t page) { return (T + 2 * (int64_t) page - 2) / page; }

static void need(bool cond, const char * op, const char * fmt, const std::string & a, const std::string & b = "") {
    if (!cond) oomb_error("%s: %s %s %s", op, fmt, a.c_str(), b.c_str());
}

struct oomb_tensor * oomb_page_summary(struct oomb_context * ctx, struct oomb_tensor * k_pages, struct oomb_tensor * page_table,
                                       struct oomb_tensor * pos, struct oomb_tensor * summary, struct oomb_tensor * after) {
    const char * op = "page_summary";
    if (!ctx || !k_pages || !page_table || !pos || !summary) oomb_error("%s: ctx, k_pages, page_table, pos and summary are required", op);
    need(k_pages->type == OOMB_TYPE_F32 || k_pages->type == OOMB_TYPE_F16 || k_pages->type == OOMB_TYPE_BF16, op,
         "k_pages must be f32, f16 or bf16:", shape_str(k_pages));
    need(oomb_is_contiguous(k_pages), op, "k_pages must be contiguous:", shape_str(k_pages));
    need(page_table->type == OOMB_TYPE_I32 && oomb_is_contiguous(page_table) && page_table->ne[1] == 1, op,
         "page_table must be a contiguous i32 vector:", shape_str(page_table));
    need(pos->type == OOMB_TYPE_I32 && oomb_is_contiguous(pos) && pos->ne[1] == 1 && pos->ne[0] >= 1, op,
         "pos must be a contiguous non-empty i32 vector:", shape_str(pos));
    need(summary->type == OOMB_TYPE_F32 && oomb_is_contiguous(summary), op, "summary must be contiguous f32:", shape_str(summary));
    need(summary->ne[0] == k_pages->ne[0] && (summary->ne[1] == 1 || summary->ne[1] == 2) && summary->ne[2] == k_pages->ne[1] &&
             summary->ne[3] == page_table->ne[0],
         op, "summary must be [D, 1 or 2, Hkv, n_logical] of the pool and page table:", shape_str(summary),
         shape_str(k_pages) + " / " + shape_str(page_table));
    oomb_tensor * t = oomb::view_op_node(ctx, summary, OOMB_OP_PAGE_SUMMARY);
    t->src[oomb::PSUM_SRC_SUMMARY] = summary;
    t->src[oomb::PSUM_SRC_K_PAGES] = k_pages;
    t->src[oomb::PSUM_SRC_PAGE_TABLE] = page_table;
    t->src[oomb::PSUM_SRC_POS] = pos;
    t->src[oomb::PSUM_SRC_AFTER] = after;
    t->op_params[oomb::PS_PARAM_PAGE] = (int32_t) k_pages->ne[2];
    return t;
}

struct oomb_tensor * oomb_page_select(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * summary,
                                      struct oomb_tensor * pos, int32_t page, int64_t n_qtiles,
                                      const struct oomb_sparse_params * params) {
    const char * op = "page_select";
    if (!ctx || !q || !summary || !pos) oomb_error("%s: ctx, q, summary and pos are required", op);
    oomb_sparse_check_params(params, op);
    need(q->type == OOMB_TYPE_F32 && oomb_is_contiguous(q) && q->ne[3] == 1, op, "q must be contiguous f32 [D, H, T]:", shape_str(q));
    need(summary->type == OOMB_TYPE_F32 && oomb_is_contiguous(summary), op, "summary must be contiguous f32:", shape_str(summary));
    need(summary->ne[0] == q->ne[0] && summary->ne[2] >= 1 && q->ne[1] % summary->ne[2] == 0, op,
         "summary [D, S, Hkv, n_pages] must match q's head dim, and H must be a multiple of Hkv:", shape_str(summary), shape_str(q));
    need(summary->ne[1] == oomb_sparse_summary_slots(params->score), op,
         params->score == OOMB_SPARSE_SCORE_QUEST ? "the quest score needs S = 2 (min, max) in summary" : "the mean score needs S = 1 in summary",
         shape_str(summary));
    need(pos->type == OOMB_TYPE_I32 && oomb_is_contiguous(pos) && pos->ne[0] == q->ne[2] && pos->ne[1] == 1, op,
         "pos must be a contiguous i32 [T] of q's T:", shape_str(pos), shape_str(q));
    if (page < 1) oomb_error("%s: page = %d must be >= 1", op, page);
    if (n_qtiles < 1 || n_qtiles > INT32_MAX / std::max(1, params->pages) - 2)
        oomb_error("%s: n_qtiles = %" PRId64 " must be in [1, %d)", op, n_qtiles, INT32_MAX / std::max(1, params->pages) - 2);
    const int64_t ne[4] = {n_qtiles + 1 + n_qtiles * params->pages, 1, 1, 1};
    oomb_tensor * t = oomb::new_op_node(ctx, OOMB_OP_PAGE_SELECT, OOMB_TYPE_I32, ne);
    t->src[oomb::PSEL_SRC_Q] = q;
    t->src[oomb::PSEL_SRC_SUMMARY] = summary;
    t->src[oomb::PSEL_SRC_POS] = pos;
    t->op_params[oomb::PS_PARAM_PAGE] = page;
    t->op_params[oomb::PS_PARAM_K] = params->pages;
    t->op_params[oomb::PS_PARAM_SCORE] = (int32_t) params->score;
    t->op_params[oomb::PS_PARAM_SINK] = params->sink;
    t->op_params[oomb::PS_PARAM_LOCAL] = params->local;
    t->op_params[oomb::PS_PARAM_NQT] = (int32_t) n_qtiles;
    return t;
}

static void require_select(const oomb_tensor * sel, const char * fn) {
    if (!sel || sel->op != OOMB_OP_PAGE_SELECT) oomb_error("%s: %s is not a page_select result", fn, sel ? shape_str(sel).c_str() : "NULL");
}

struct oomb_tensor * oomb_page_select_offsets(struct oomb_context * ctx, struct oomb_tensor * sel) {
    require_select(sel, "page_select_offsets");
    return oomb_view_1d(ctx, sel, sel->op_params[oomb::PS_PARAM_NQT] + 1, 0);
}

struct oomb_tensor * oomb_page_select_pages(struct oomb_context * ctx, struct oomb_tensor * sel) {
    require_select(sel, "page_select_pages");
    const int64_t nqt = sel->op_params[oomb::PS_PARAM_NQT];
    return oomb_view_1d(ctx, sel, nqt * sel->op_params[oomb::PS_PARAM_K], (size_t) (nqt + 1) * sizeof(int32_t));
}

// ---------------------------------------------------------------------------------------------
// CPU reference kernels
// ---------------------------------------------------------------------------------------------

namespace oomb {

static float load_key(const oomb_tensor * kp, int64_t i) {
    switch (kp->type) {
        case OOMB_TYPE_F16: return fp16_to_fp32(((const uint16_t *) kp->data)[i]);
        case OOMB_TYPE_BF16: return bf16_to_fp32(((const uint16_t *) kp->data)[i]);
        default: return ((const float *) kp->data)[i];
    }
}

static void check_consecutive(const int32_t * pos, int64_t T, const char * op) {
    if (pos[0] < 0) oomb_error("%s: pos[0] = %d is negative", op, pos[0]);
    for (int64_t t = 1; t < T; t++)
        if ((int64_t) pos[t] != (int64_t) pos[0] + t)
            oomb_error("%s: positions must be consecutive: pos[%" PRId64 "] = %d after pos[0] = %d", op, t, pos[t], pos[0]);
}

void cpu_page_summary(oomb_tensor * dst, cpu::thread_pool * pool) {
    const char * op = "page_summary";
    const oomb_tensor * kp = dst->src[PSUM_SRC_K_PAGES];
    const int32_t * pt = (const int32_t *) dst->src[PSUM_SRC_PAGE_TABLE]->data;
    const oomb_tensor * post = dst->src[PSUM_SRC_POS];
    const int32_t * pos = (const int32_t *) post->data;
    float * sum = (float *) dst->data;
    const int64_t D = kp->ne[0], Hkv = kp->ne[1], P = kp->ne[2], n_phys = kp->ne[3], S = dst->ne[1];
    const int64_t n_logical = dst->ne[3], T = post->ne[0];
    check_consecutive(pos, T, op);
    const int64_t lp0 = pos[0] / P, lp1 = ((int64_t) pos[T - 1] + 1) / P;  // complete pages [lp0, lp1)
    if (lp1 > n_logical) oomb_error("%s: positions up to %d need %" PRId64 " logical pages, the summary has %" PRId64, op, pos[T - 1], lp1, n_logical);
    for (int64_t lp = lp0; lp < lp1; lp++)
        if (pt[lp] < 0 || pt[lp] >= n_phys)
            oomb_error("%s: page_table[%" PRId64 "] = %d is outside the pool's %" PRId64 " pages", op, lp, pt[lp], n_phys);
    auto work = [&](int64_t b, int64_t e, int) {
        for (int64_t w = b; w < e; w++) {
            const int64_t lp = lp0 + w / Hkv, g = w % Hkv;
            const int64_t base = (int64_t) pt[lp] * P * Hkv * D + g * D;  // slot 0 of the page, head g
            float * out = sum + (lp * Hkv + g) * S * D;
            for (int64_t d = 0; d < D; d++) {
                if (S == 1) {
                    float acc = 0.0f;
                    for (int64_t i = 0; i < P; i++) acc += load_key(kp, base + i * Hkv * D + d);
                    out[d] = acc / (float) P;
                } else {
                    float mn = INFINITY, mx = -INFINITY;
                    for (int64_t i = 0; i < P; i++) {
                        const float k = load_key(kp, base + i * Hkv * D + d);
                        mn = ps_min_nan(mn, k);  // a NaN key: the page's summary is NaN (sparse-impl.h)
                        mx = ps_max_nan(mx, k);
                    }
                    out[d] = mn;
                    out[D + d] = mx;
                }
            }
        }
    };
    const int64_t n = (lp1 - lp0) * Hkv;
    if (pool) cpu::parallel_for(*pool, n, 1, work);
    else work(0, n, 0);
}

// Scores of every history page for query tile rows [t0, t1) (oomb-sparse.h); score[c0].
static void tile_scores(const float * q, const float * sm, int64_t D, int64_t H, int64_t Hkv, int64_t S, int64_t c0, int64_t t0,
                        int64_t t1, int score_kind, std::vector<float> & qs, std::vector<float> & logit, float * score) {
    const int64_t G = H / Hkv;
    std::fill(score, score + c0, 0.0f);
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t g = 0; g < Hkv; g++) {
            for (int64_t d = 0; d < D; d++) {
                float a = 0.0f;
                for (int64_t h = g * G; h < (g + 1) * G; h++) a += q[(t * H + h) * D + d];
                qs[d] = a;
            }
            if (score_kind == OOMB_SPARSE_SCORE_QUEST) {
                for (int64_t p = 0; p < c0; p++) {
                    const float * mn = sm + (p * Hkv + g) * S * D, * mx = mn + D;
                    float b = 0.0f;
                    for (int64_t d = 0; d < D; d++) b += ps_quest_term(qs[d], mn[d], mx[d]);
                    score[p] += b;
                }
                continue;
            }
            float m = -INFINITY;
            for (int64_t p = 0; p < c0; p++) {
                const float * mu = sm + (p * Hkv + g) * S * D;
                float l = 0.0f;
                for (int64_t d = 0; d < D; d++) l += qs[d] * mu[d];
                logit[p] = l;
                m = std::max(m, l);
            }
            float s = 0.0f;
            for (int64_t p = 0; p < c0; p++) s += expf(logit[p] - m);
            for (int64_t p = 0; p < c0; p++) score[p] += expf(logit[p] - m) / s;
        }
    }
}

void cpu_page_select(oomb_tensor * dst, cpu::thread_pool * pool) {
    const char * op = "page_select";
    const oomb_tensor * qt = dst->src[PSEL_SRC_Q], * st = dst->src[PSEL_SRC_SUMMARY], * post = dst->src[PSEL_SRC_POS];
    const float * q = (const float *) qt->data, * sm = (const float *) st->data;
    const int32_t * pos = (const int32_t *) post->data;
    int32_t * out = (int32_t *) dst->data;
    const int64_t D = qt->ne[0], H = qt->ne[1], T = qt->ne[2], S = st->ne[1], Hkv = st->ne[2], n_logical = st->ne[3];
    const int64_t P = dst->op_params[PS_PARAM_PAGE], K = dst->op_params[PS_PARAM_K], nqt = dst->op_params[PS_PARAM_NQT];
    const int64_t sink = dst->op_params[PS_PARAM_SINK], local = dst->op_params[PS_PARAM_LOCAL];
    const int score_kind = dst->op_params[PS_PARAM_SCORE];
    check_consecutive(pos, T, op);
    const int64_t c0 = pos[0] / P, n_act = (int64_t) pos[T - 1] / P - c0 + 1, len = ps_list_len(c0, K);
    if (n_act > nqt) oomb_error("%s: the chunk spans %" PRId64 " query tiles, the op was built for %" PRId64, op, n_act, nqt);
    if (c0 > n_logical) oomb_error("%s: %" PRId64 " history pages, the summary pool holds %" PRId64, op, c0, n_logical);
    int32_t * offsets = out, * pages = out + nqt + 1;
    for (int64_t j = 0; j <= nqt; j++) offsets[j] = (int32_t) (std::min(j, n_act) * len);
    auto work = [&](int64_t b, int64_t e, int) {
        std::vector<float> qs((size_t) D), logit((size_t) c0), score((size_t) c0);
        std::vector<int32_t> order;
        std::vector<char> keep((size_t) c0);
        for (int64_t j = b; j < e; j++) {
            int32_t * list = pages + j * len;
            if (c0 <= K) {
                for (int64_t p = 0; p < c0; p++) list[p] = (int32_t) p;
                continue;
            }
            int64_t t0, t1;
            ps_tile_rows(pos[0], T, P, j, &t0, &t1);
            tile_scores(q, sm, D, H, Hkv, S, c0, t0, t1, score_kind, qs, logit, score.data());
            order.clear();
            int64_t kept = 0;
            for (int64_t p = 0; p < c0; p++) {
                keep[p] = ps_always_kept(p, c0, sink, local);
                if (keep[p]) kept++;
                else order.push_back((int32_t) p);
            }
            const int64_t n_free = K - kept;
            std::partial_sort(order.begin(), order.begin() + n_free, order.end(),
                              [&](int32_t a, int32_t c) { return ps_ranks_before(score[a], a, score[c], c); });
            for (int64_t i = 0; i < n_free; i++) keep[order[i]] = 1;
            int64_t n = 0;
            for (int64_t p = 0; p < c0; p++)
                if (keep[p]) list[n++] = (int32_t) p;
        }
    };
    if (pool) cpu::parallel_for(*pool, n_act, 1, work);
    else work(0, n_act, 0);
}

} // namespace oomb
