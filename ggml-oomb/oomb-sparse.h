// Page-level top-K sparse attention (OOMB mechanism 4, arXiv 2602.02108): page summaries and the
// selection of the history pages each query tile attends, as graph ops whose output is a LISTS
// page schedule (oomb-schedule.h) for oomb_paged_attn_ext.
//
// Design: the selection is data, not control flow. A chunk's graph computes it from the chunk's
// queries and the summary pool (op page_select), feeds it to the paged attention as its schedule,
// and exposes it as an output; the chunk driver (oomb-chunk.h) copies it to host memory in stage 1
// and uploads exactly the same lists (with their inverse) for the chunk's stage-2 backward, so
// both stages attend the same keys and the gradients are exact through the selected set.
//
// Summary pool of one layer: f32 [D, S, Hkv, n_pages], indexed by LOGICAL page (not physical);
// S = 1 (mean of the page's keys after RoPE, as stored in the pool: rounded to the pool's type)
// or S = 2 (Quest: per-dimension min (s = 0) and max (s = 1)). Element (d, s, g, lp) at
// ((lp * Hkv + g) * S + s) * D + d. Bytes per token and layer: S * Hkv * D * 4 / P (Qwen2.5-7B,
// Hkv 4, D 128, P 128: 16 B mean, 32 B Quest; 448 / 896 B per token over its 28 layers).
//
// Selection rule of query tile j (the queries t with pos[t] / P - c0 == j, c0 = pos[0] / P; the
// history is the logical pages 0 .. c0-1, every one complete):
//   * c0 <= K: every history page (dense through the lists).
//   * otherwise the always-kept pages, the first min(sink, c0) and the last min(local, c0) history
//     pages, COUNT INSIDE the budget K (sink + local <= K), and the remaining slots go to the other
//     pages of highest score (ties: the lower page first; a NaN score ranks lowest), listed
//     ascending; each tile lists exactly K pages.
//   * q_g = sum of the queries of GQA group g (query heads g*H/Hkv .. (g+1)*H/Hkv - 1), per token.
//   * mean:  score(p) = sum over the tile's tokens t and KV heads g of softmax_p(q_g . mean_{g,p})
//            (softmax over ALL history pages 0 .. c0-1, always-kept ones included; no 1/sqrt(D)).
//   * quest: score(p) = sum over t and g of sum_d max(q_gd * min_{g,p,d}, q_gd * max_{g,p,d})
//            (the upper bound of q_g . k over the page's keys; no softmax).
// The current region (pages >= c0) is attended causally by paged_attn itself.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct oomb_context;
struct oomb_tensor;

enum oomb_sparse_score {
    OOMB_SPARSE_SCORE_MEAN = 0,   // the reference's: mean key per page, softmax over pages
    OOMB_SPARSE_SCORE_QUEST = 1,  // Quest: per-dim min/max, upper bound of q.k
};

struct oomb_sparse_params {
    int32_t pages;                 // K: history pages per query tile (>= 1); 0: sparse attention off
    enum oomb_sparse_score score;
    int32_t sink;                  // first history pages always kept (inside K)
    int32_t local;                 // latest history pages always kept (inside K)
};

/// Defaults: K = 64, mean, no sink, no local pages (the reference's settings).
struct oomb_sparse_params oomb_sparse_default_params(void);
/// Checks p (pages >= 1, sink >= 0, local >= 0, sink + local <= pages, a known score). Errors
/// (oomb_error) name `what` (e.g. "oomb-train") and the bad field.
void oomb_sparse_check_params(const struct oomb_sparse_params * p, const char * what);
/// Summary rows per (page, KV head): 1 (mean) or 2 (quest).
int oomb_sparse_summary_slots(enum oomb_sparse_score score);
/// Bytes of summaries per token and layer: slots * n_head_kv * head_dim * 4 / page.
double oomb_sparse_summary_bytes_per_token(enum oomb_sparse_score score, int64_t n_head_kv, int64_t head_dim, int64_t page);

/// Writes the summaries of the logical pages a chunk completes into summary (in place): for pages
/// lp with pos[0] / P <= lp and (lp + 1) * P <= pos[T-1] + 1, the mean (S = 1) or the min and max
/// (S = 2) over the page's P keys of each KV head, read from the pool through the page table
/// (the slots of lp before pos[0], written by an earlier chunk, included).
/// k_pages: the layer's K pool [D, Hkv, P, n_phys] (f32, f16 or bf16); page_table: i32 [n_logical];
/// pos: i32 [T] (consecutive positions, pos[t] = pos[0] + t); summary: f32 [D, S, Hkv, n_logical],
/// contiguous; after: the node that stores the chunk's keys (its paged_attn; a dependency only,
/// may be NULL when the keys are already in the pool). Result: a view of summary (op page_summary).
/// Errors: shapes, types, S not 1 or 2. Not differentiable (no gradients flow to summaries).
struct oomb_tensor * oomb_page_summary(struct oomb_context * ctx, struct oomb_tensor * k_pages, struct oomb_tensor * page_table,
                                       struct oomb_tensor * pos, struct oomb_tensor * summary, struct oomb_tensor * after);

/// The history pages of each query tile of a chunk (the rule above) as a LISTS schedule:
/// result i32 [n_qtiles + 1 + n_qtiles * K]: offsets [n_qtiles + 1], then the pages (the first
/// offsets[n_qtiles] entries used; the rest unspecified). Views: oomb_page_select_offsets / _pages.
/// q: f32 [D, H, T] (after RoPE), contiguous; summary: f32 [D, S, Hkv, n_logical] (S = 1 for mean,
/// 2 for quest); pos: i32 [T], consecutive (checked on the CPU); page: P; n_qtiles: at least the
/// chunk's query tiles (pos[T-1] / P - pos[0] / P + 1; extra tiles get empty lists).
/// Errors: shapes, types, params (oomb_sparse_check_params), S not matching the score, H not a
/// multiple of Hkv; on the CPU also a history longer than the pool. Not differentiable.
struct oomb_tensor * oomb_page_select(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * summary,
                                      struct oomb_tensor * pos, int32_t page, int64_t n_qtiles,
                                      const struct oomb_sparse_params * params);
/// Views of a page_select result: offsets i32 [n_qtiles + 1] and pages i32 [n_qtiles * K].
struct oomb_tensor * oomb_page_select_offsets(struct oomb_context * ctx, struct oomb_tensor * sel);
struct oomb_tensor * oomb_page_select_pages(struct oomb_context * ctx, struct oomb_tensor * sel);
/// Query tiles a chunk of T consecutive positions can span at most: (T + 2P - 2) / P.
int64_t oomb_page_select_max_qtiles(int64_t T, int32_t page);

#ifdef __cplusplus
}
#endif
