// CPU kernels for attention over a paged KV cache.
//
// Work is tiled as in FlashAttention: a tile is a few query tokens times the query heads of one KV
// head (the GQA group, so each K/V block is read once for all of them), against blocks of up to KB
// keys of one page read through the page table (converted to f32, K and V transposed for the score
// products). The tile kernels (paged-attn-tiles.inc) are compiled for AVX-512, AVX2+FMA and the
// baseline and picked at run time.
// Forward: online softmax (Milakov & Gimelshein 2018) per tile over the key blocks: O(tile) scratch
// per worker, whatever the history length. The op's node is flat: out [D, H, T] then one log-sum-exp
// per row (natural log, m + log l), kept for the backward (oomb.h).
// Backward (FlashAttention-2, recomputing the softmax): pass 1 gets each row's log-sum-exp and
// delta = dout . out: from the forward's node when the op has it (src[8]: the LSE is read, delta
// comes from the saved out), else by running the forward again per query tile; pass 2 sweeps the
// key blocks: each block's dK/dV is accumulated by one work item over every query tile (the
// gradient pages are written without races), and the dq contributions go to one of a fixed number
// of partial dq buffers, summed in a fixed order. Results depend neither on the thread count nor on
// scheduling.
// Gradient pages in f32 or bf16: a bf16 page element gets the block's f32 sum added in f32 and is
// rounded back stochastically (sround.h, bits from the element and a per-call salt), once per call,
// so the error stays one rounding per chunk and the expectation exact.
// Page schedules (oomb-schedule.h): a key block lies in one logical page, so a schedule is a
// per-row yes/no for the whole block; a row that does not attend the block gets position -1 for
// it (every key masked, the same path as the causal mask), and a block no row of a tile attends is
// skipped. The dense schedule takes none of this (bit for bit today's kernels).

#include "paged-attn.h"
#include "thread-pool.h"
#include "oomb-impl.h"
#include "oomb/paged-attn-sched.h"
#include "oomb/paged-attn-merge.h"
#include "fp16.h"
#include "sround.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-trapping-math")
#endif

// after the pragma, so exp_f gets the same optimisation attributes and inlines into the kernels
#include "vec-math.h"

namespace oomb {

namespace {

// Runs fn(i) for i in [0, n) on the first n_threads threads of the backend's pool (the library's one
// pool, cpu/thread-pool.h), taking items in order from a shared counter (each item is computed
// whole by one worker, so the result does not depend on who takes it). fn gets the worker index
// too (< n_threads), for per-worker scratch.
struct ItemsTask {
    int64_t n;
    int n_threads;
    const std::function<void(int64_t, int)> * fn;
    std::atomic<int64_t> next{0};
};
void items_worker(void * arg, int ith, int) {
    ItemsTask & t = *(ItemsTask *) arg;
    if (ith >= t.n_threads) return;
    for (int64_t i; (i = t.next.fetch_add(1, std::memory_order_relaxed)) < t.n;) (*t.fn)(i, ith);
}
void parallel_items(int64_t n, int n_threads, cpu::thread_pool * pool, const std::function<void(int64_t, int)> & fn) {
    n_threads = (int) std::max<int64_t>(1, std::min<int64_t>({(int64_t) n_threads, n, pool ? (int64_t) pool->size() : 1}));
    if (n_threads == 1) {
        for (int64_t i = 0; i < n; i++) fn(i, 0);
        return;
    }
    ItemsTask t{n, n_threads, &fn};
    pool->run(items_worker, &t);
}

inline float load(const void * p, oomb_type type) {
    switch (type) {
        case OOMB_TYPE_F32: return *(const float *) p;
        case OOMB_TYPE_F16: return fp16_to_fp32(*(const uint16_t *) p);
        default: return bf16_to_fp32(*(const uint16_t *) p);
    }
}
inline void store(void * p, oomb_type type, float v) {
    switch (type) {
        case OOMB_TYPE_F32: *(float *) p = v; break;
        case OOMB_TYPE_F16: *(uint16_t *) p = fp32_to_fp16(v); break;
        default: *(uint16_t *) p = fp32_to_bf16(v); break;
    }
}

// Geometry shared by the kernels.
struct PagedGeom {
    int64_t D, H, Hkv, T, P, n_pages, n_logical, group;
    const int32_t * page_table;
    const int32_t * pos;
    size_t nb_head, nb_slot, nb_page; // strides of the pools (bytes)
    pa_sched sched{};                 // page schedule (set by the kernels: dense by default)
    int c0 = 0;                       // first logical page of the current region, pos[0] / P

    PagedGeom(const oomb_tensor * q, const oomb_tensor * pages, const oomb_tensor * pt, const oomb_tensor * ps) {
        D = q->ne[0]; H = q->ne[1]; T = q->ne[2];
        Hkv = pages->ne[1]; P = pages->ne[2]; n_pages = pages->ne[3];
        group = H / Hkv;
        n_logical = oomb_nelements(pt);
        page_table = (const int32_t *) pt->data;
        pos = (const int32_t *) ps->data;
        nb_head = pages->nb[1]; nb_slot = pages->nb[2]; nb_page = pages->nb[3];
    }
    // Byte offset of (position p, kv head g) in a pool; validated.
    size_t offset(int64_t p, int64_t g, const char * op) const {
        const int64_t lp = p / P;
        if (p < 0 || lp >= n_logical) oomb_error("%s: position %" PRId64 " is outside the page table (%" PRId64 " pages of %" PRId64 ")", op, p, n_logical, P);
        const int32_t pp = page_table[lp];
        if (pp < 0 || pp >= n_pages) oomb_error("%s: logical page %" PRId64 " maps to page %d, pool has %" PRId64 " pages (not reserved?)", op, lp, pp, n_pages);
        return (size_t) pp * nb_page + (size_t) (p % P) * nb_slot + (size_t) g * nb_head;
    }
};

inline const float * qrow(const oomb_tensor * q, int64_t t, int64_t h) {
    return (const float *) ((const char *) q->data + t * q->nb[2] + h * q->nb[1]);
}

void check_pos(const PagedGeom & G, const char * op) {
    for (int64_t t = 0; t < G.T; t++)
        if (G.pos[t] < 0) oomb_error("%s: negative position %d at token %" PRId64, op, G.pos[t], t);
}
// Every page the op can read (up to its furthest position; under a schedule only the pages it
// attends: a window's, the listed history pages) must be mapped. After set_schedule.
void check_mapped(const PagedGeom & G, const char * op) {
    int64_t max_pos = -1;
    for (int64_t t = 0; t < G.T; t++) max_pos = std::max<int64_t>(max_pos, G.pos[t]);
    const pa_sched & S = G.sched;
    std::vector<uint8_t> listed;
    if (oomb_schedule_has_lists((oomb_page_schedule_kind) S.kind)) {
        listed.assign((size_t) std::max(G.c0, 0), 0);
        for (int32_t i = 0; i < S.offsets[S.n_qtiles]; i++) listed[(size_t) S.pages[i]] = 1;  // checked: in [0, c0)
    }
    for (int64_t lp = 0; max_pos >= 0 && lp <= max_pos / G.P; lp++) {
        if (!pa_sched_in_window(S, (int) lp) || (!listed.empty() && lp < G.c0 && !listed[(size_t) lp])) continue;
        G.offset(lp * G.P, 0, op);
    }
}

// ---- tile kernels, compiled per instruction set -------------------------------------------------

constexpr int KB = 64;  // keys per block (at most; a block never crosses a page)
static_assert(KB % 8 == 0, "KB must be a multiple of 8");


struct TileKernels {
    void (*scores)(int R, int D, const float * const * rows, const float * Kt, float * S);
    void (*accum_rows)(int R, int D, const float * P, int n, const float * Vr, float * O);
    void (*accum_cols)(int n, int R, int D, const float * Pt, const float * const * rows, float * acc);
    void (*online_softmax)(int R, int D, float scale, float * S, const int32_t * rpos, int64_t p0, int n, float * m, float * l,
                           float * O);
    void (*bwd_probs)(int R, float scale, float * S, float * dP, const float * lse, const float * delta, const int32_t * rpos,
                      int64_t p0, int n);
    void (*transpose)(int R, const float * P, float * Pt);
};

namespace isa_base {
constexpr int VW = 4;
#include "paged-attn-tiles.inc"
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OOMB_PAGED_X86 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace isa_avx2 {
constexpr int VW = 8;
#include "paged-attn-tiles.inc"
}
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")
namespace isa_avx512 {
constexpr int VW = 16;
#include "paged-attn-tiles.inc"
}
#pragma GCC pop_options
#endif

// The best variant this CPU runs; OOMB_PAGED_ISA=base|avx2|avx512 asks for a lower one (tests of
// every path; read at every call, so a test can switch). A variant the CPU lacks is never used. Any
// other value is named on stderr (once per value) and ignored: the best variant runs.
const TileKernels & kernels() {
    const char * force = getenv("OOMB_PAGED_ISA");
    const std::string f = force ? force : "";
    if (!f.empty() && f != "base" && f != "avx2" && f != "avx512") {
        static std::mutex mu;
        static std::string warned;
        std::lock_guard<std::mutex> lock(mu);
        if (warned != f) {
            warned = f;
            fprintf(stderr, "oomb: OOMB_PAGED_ISA='%s' is not base, avx2 or avx512: ignored (the best variant this CPU runs)\n", f.c_str());
        }
    }
    if (f == "base") return isa_base::kernels;
#ifdef OOMB_PAGED_X86
    static const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    static const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (has_avx512 && f != "avx2") return isa_avx512::kernels;
    if (has_avx2) return isa_avx2::kernels;
#endif
    return isa_base::kernels;
}

// ---- work decomposition ---------------------------------------------------------------------------

// A block of keys: positions [p0, p0 + n), within one page, n <= KB.
struct KeyBlock { int64_t p0; int n; };

std::vector<KeyBlock> key_blocks(int64_t n_keys, int64_t P) {
    std::vector<KeyBlock> b;
    for (int64_t p = 0; p < n_keys;) {
        const int64_t page_end = (p / P + 1) * P;
        const int64_t e = std::min({p + (int64_t) KB, page_end, n_keys});
        b.push_back({p, (int) (e - p)});
        p = e;
    }
    return b;
}

// The query rows of one tile: tokens [t0, t0 + nt) x the query heads of KV head g, in (token, head)
// order. Row r of the op is t * H + h.
struct QueryTile {
    int64_t t0, nt, g, max_pos;
};

std::vector<QueryTile> query_tiles(const PagedGeom & G, int64_t bq) {
    std::vector<QueryTile> v;
    for (int64_t g = 0; g < G.Hkv; g++)
        for (int64_t t0 = 0; t0 < G.T; t0 += bq) {
            const int64_t nt = std::min(bq, G.T - t0);
            int64_t mp = 0;
            for (int64_t t = t0; t < t0 + nt; t++) mp = std::max<int64_t>(mp, G.pos[t]);
            v.push_back({t0, nt, g, mp});
        }
    // heaviest first (more keys), so the last items to be taken are short
    std::stable_sort(v.begin(), v.end(), [](const QueryTile & a, const QueryTile & b) { return a.max_pos > b.max_pos; });
    return v;
}

// Per-worker scratch.
struct Scratch {
    std::vector<float> Kt, Vt, Kr, Vr, S, S2, Pt, O, m, l, lse, delta, acc1, acc2;
    std::vector<const float *> qr, dr;
    std::vector<float *> outr;
    std::vector<int32_t> rpos, rpos_m, rqt;  // positions; masked for a block (schedules); query tiles
    std::vector<int64_t> rid;
    void init(int64_t R, int64_t D) {
        Kt.assign(D * KB, 0.0f); Vt.assign(D * KB, 0.0f); Kr.assign(KB * D, 0.0f); Vr.assign(KB * D, 0.0f);
        S.assign(R * KB, 0.0f); S2.assign(R * KB, 0.0f); Pt.assign(KB * R, 0.0f);
        O.assign(R * D, 0.0f); m.assign(R, 0.0f); l.assign(R, 0.0f); lse.assign(R, 0.0f); delta.assign(R, 0.0f);
        acc1.assign(KB * D, 0.0f); acc2.assign(KB * D, 0.0f);
        qr.assign(R, nullptr); dr.assign(R, nullptr); outr.assign(R, nullptr); rpos.assign(R, 0); rpos_m.assign(R, 0); rqt.assign(R, 0); rid.assign(R, 0);
    }
};

// The work of one op: its query tiles (heaviest first, ~64 rows each), the key blocks up to the
// furthest position a tile sees, and scratch for n workers sized for the largest tile.
struct TilePlan {
    std::vector<QueryTile> tiles;
    std::vector<KeyBlock> blocks;
    int64_t Rmax;  // rows of the largest tile
    explicit TilePlan(const PagedGeom & G) {
        const int64_t bq = std::max<int64_t>(1, 64 / G.group);  // tokens per tile
        tiles = query_tiles(G, bq);
        blocks = key_blocks(tiles.empty() ? 0 : tiles.front().max_pos + 1, G.P);
        Rmax = bq * G.group;
    }
    std::vector<Scratch> scratch(int n, int64_t D) const {
        std::vector<Scratch> s(n);
        for (auto & w : s) w.init(Rmax, D);
        return s;
    }
};

// Loads key block b of KV head g from a pool as f32: transposed into T (D x KB) and/or row-major
// into Rm (KB x D); columns / rows past n are zero.
void load_block(const PagedGeom & G, const oomb_tensor * pool, int64_t g, const KeyBlock & b, float * T, float * Rm,
                const char * op) {
    const int64_t D = G.D;
    if (T && b.n < KB)
        for (int64_t d = 0; d < D; d++) std::fill(T + d * KB + b.n, T + (d + 1) * KB, 0.0f);
    if (Rm && b.n < KB) std::fill(Rm + (size_t) b.n * D, Rm + (size_t) KB * D, 0.0f);
    float tmp[1024];
    std::vector<float> big;
    float * row = tmp;
    if (D > 1024) { big.resize(D); row = big.data(); }
    for (int j = 0; j < b.n; j++) {
        const char * src = (const char *) pool->data + G.offset(b.p0 + j, g, op);
        const float * r;
        if (pool->type == OOMB_TYPE_F32 && pool->nb[0] == sizeof(float)) r = (const float *) src;
        else {
            for (int64_t d = 0; d < D; d++) row[d] = load(src + d * pool->nb[0], pool->type);
            r = row;
        }
        if (T) for (int64_t d = 0; d < D; d++) T[d * KB + j] = r[d];
        if (Rm) std::copy(r, r + D, Rm + (size_t) j * D);
    }
}

// Fills the row tables of a tile (q rows, dout rows, out rows, positions, op row ids); returns R.
// out: the forward's out [T][H][D] (contiguous, the start of the op's packed node) or NULL.
int tile_rows(const PagedGeom & G, const QueryTile & qt, const oomb_tensor * q, const oomb_tensor * dout, float * out, Scratch & s) {
    int R = 0;
    for (int64_t t = qt.t0; t < qt.t0 + qt.nt; t++)
        for (int64_t h = qt.g * G.group; h < (qt.g + 1) * G.group; h++, R++) {
            s.qr[R] = qrow(q, t, h);
            s.dr[R] = dout ? (const float *) elem_ptr(dout, 0, h, t, 0) : nullptr;
            s.outr[R] = out ? out + (t * G.H + h) * G.D : nullptr;
            s.rpos[R] = G.pos[t];
            s.rqt[R] = pa_qtile(G.pos[t], G.c0, (int) G.P);
            s.rid[R] = t * G.H + h;
        }
    return R;
}

// The row positions a tile uses for key block b: s.rpos itself under the dense schedule, else
// s.rpos_m with -1 for the rows whose query tile does not attend b's page; NULL when no row does.
const int32_t * block_rpos(const PagedGeom & G, const KeyBlock & b, int R, Scratch & s) {
    if (G.sched.kind == OOMB_SCHEDULE_DENSE) return s.rpos.data();
    const int lp = (int) (b.p0 / G.P);
    bool any = false;
    for (int i = 0; i < R; i++) {
        const bool a = pa_sched_attends(G.sched, G.c0, s.rqt[i], lp) && s.rpos[i] >= b.p0;
        s.rpos_m[i] = a ? s.rpos[i] : -1;
        any |= a;
    }
    return any ? s.rpos_m.data() : nullptr;
}

// Checks an op's schedule against its positions (host lists: order, range, every query's tile
// listed; the backward's inverse lists equal to the inversion of the lists) and sets G.sched.
void set_schedule(PagedGeom & G, const oomb_paged_attn_args & a, bool backward, const char * op) {
    G.sched = pa_sched_of(a.schedule);
    G.c0 = G.T > 0 ? (int) (G.pos[0] / G.P) : 0;
    if (!oomb_schedule_has_lists((oomb_page_schedule_kind) G.sched.kind)) return;
    const pa_sched & S = G.sched;
    const int64_t nnz = S.offsets[S.n_qtiles];
    if (nnz < 0 || nnz > oomb_nelements(a.schedule.pages))
        oomb_error("%s: page lists: offsets[%d] = %" PRId64 " entries, the pages tensor %s holds %" PRId64, op, S.n_qtiles, nnz,
                   shape_str(a.schedule.pages).c_str(), oomb_nelements(a.schedule.pages));
    oomb_schedule_check_lists(S.offsets, S.n_qtiles, S.pages, nnz, G.c0, op);
    for (int64_t t = 0; t < G.T; t++) {
        const int qt = pa_qtile(G.pos[t], G.c0, (int) G.P);
        if (qt < 0 || qt >= S.n_qtiles)
            oomb_error("%s: page lists: query %" PRId64 " at position %d is in query tile %d, the lists have %d (tile = pos / P - "
                       "pos[0] / P)", op, t, G.pos[t], qt, S.n_qtiles);
    }
    if (!backward) return;
    if (S.n_hist < 0 || nnz > oomb_nelements(a.schedule.inv_qtiles))
        oomb_error("%s: inverse lists %s / %s too small for %" PRId64 " entries", op, shape_str(a.schedule.inv_offsets).c_str(),
                   shape_str(a.schedule.inv_qtiles).c_str(), nnz);
    std::vector<int32_t> io(S.n_hist + 1), iq(std::max<int64_t>(nnz, 1));
    oomb_schedule_invert(S.offsets, S.n_qtiles, S.pages, S.n_hist, io.data(), iq.data());
    if (!std::equal(io.begin(), io.end(), S.inv_offsets) || !std::equal(iq.begin(), iq.begin() + nnz, S.inv_qtiles))
        oomb_error("%s: the inverse lists are not the inversion of the page lists (oomb_schedule_invert)", op);
}

// Forward of one tile over every key block it sees: O (R x D, normalised), m, l in s.
void forward_tile(const TileKernels & K, const PagedGeom & G, const std::vector<KeyBlock> & blocks, const oomb_tensor * kp,
                  const oomb_tensor * vp, float scale, const QueryTile & qt, int R, Scratch & s, const char * op) {
    const int D = (int) G.D;
    std::fill(s.O.begin(), s.O.begin() + (size_t) R * D, 0.0f);
    std::fill(s.m.begin(), s.m.begin() + R, -INFINITY);
    std::fill(s.l.begin(), s.l.begin() + R, 0.0f);
    for (const KeyBlock & b : blocks) {
        if (b.p0 > qt.max_pos) break;
        const int32_t * rp = block_rpos(G, b, R, s);
        if (!rp) continue;
        load_block(G, kp, qt.g, b, s.Kt.data(), nullptr, op);
        load_block(G, vp, qt.g, b, nullptr, s.Vr.data(), op);
        K.scores(R, D, s.qr.data(), s.Kt.data(), s.S.data());
        K.online_softmax(R, D, scale, s.S.data(), rp, b.p0, b.n, s.m.data(), s.l.data(), s.O.data());
        K.accum_rows(R, D, s.S.data(), b.n, s.Vr.data(), s.O.data());
    }
    for (int i = 0; i < R; i++) {
        const float inv = s.l[i] > 0.0f || s.l[i] != s.l[i] ? 1.0f / s.l[i] : 0.0f;  // l = 0: nothing seen; NaN stays NaN
        float * o = s.O.data() + (size_t) i * D;
        for (int d = 0; d < D; d++) o[d] *= inv;
    }
}

} // namespace


// Copies a chunk's packed attention result (n_out f32 outputs, then n_lse f32 LSEs) into
// (to_cache) or out of a oomb_paged_attn_cached cache block starting at element `off`: f32 caches
// hold it as is; bf16 caches hold the outputs rounded to bf16, then the LSEs bit for bit (two
// 16-bit elements each).
static void cache_block_copy(const oomb_tensor * cache, int64_t off, float * packed, int64_t n_out, int64_t n_lse, bool to_cache) {
    if (cache->type == OOMB_TYPE_F32) {
        float * c = (float *) cache->data + off;
        if (to_cache) std::memcpy(c, packed, (size_t) (n_out + n_lse) * sizeof(float));
        else std::memcpy(packed, c, (size_t) (n_out + n_lse) * sizeof(float));
        return;
    }
    uint16_t * c = (uint16_t *) cache->data + off;
    if (to_cache) {
        for (int64_t i = 0; i < n_out; i++) c[i] = oomb_fp32_to_bf16(packed[i]);
        std::memcpy(c + n_out, packed + n_out, (size_t) n_lse * sizeof(float));
    } else {
        for (int64_t i = 0; i < n_out; i++) packed[i] = oomb_bf16_to_fp32(c[i]);
        std::memcpy(packed + n_out, c + n_out, (size_t) n_lse * sizeof(float));
    }
}

void cpu_paged_attn(oomb_tensor * dst, cpu::thread_pool * pool) {
    const int n_threads = pool ? pool->size() : 1;
    const oomb_paged_attn_args A = oomb_paged_attn_args_of(dst);
    PagedGeom G(A.q, A.k_pages, A.page_table, A.pos);
    if (A.q->nb[0] != sizeof(float)) oomb_error("paged_attn: q must have unit stride in dim 0");
    check_pos(G, "paged_attn");
    set_schedule(G, A, false, "paged_attn");
    check_mapped(G, "paged_attn");
    // oomb_paged_attn_cached: the chunk's block of the result cache (mode 1: save after computing,
    // mode 2: load instead of computing)
    const oomb_tensor * cache = A.out_cache;
    const int cache_mode = cache ? (A.load ? 2 : 1) : 0;
    int64_t cache_off = -1;  // the chunk's block, in cache elements
    if (cache_mode && G.T > 0) {
        for (int64_t t = 1; t < G.T; t++)
            if (G.pos[t] != G.pos[0] + t)
                oomb_error("paged_attn_cached: positions must be consecutive (pos[%" PRId64 "] = %d after pos[0] = %d)", t, G.pos[t], G.pos[0]);
        const int64_t row = oomb_paged_attn_cache_row(G.D, G.H, cache->type);
        if (G.pos[0] < 0 || (G.pos[0] + G.T) * row > oomb_nelements(cache))
            oomb_error("paged_attn_cached: positions %d..%" PRId64 " lie outside the cache %s", G.pos[0], G.pos[0] + G.T - 1,
                       shape_str(cache).c_str());
        cache_off = G.pos[0] * row;
        if (cache_mode == 2) {
            cache_block_copy(cache, cache_off, (float *) dst->data, G.D * G.H * G.T, G.H * G.T, false);
            return;
        }
    }

    if (A.store) {
        for (int64_t t = 0; t < G.T; t++)
            for (int64_t g = 0; g < G.Hkv; g++) {
                const size_t off = G.offset(G.pos[t], g, "paged_attn");
                for (int64_t d = 0; d < G.D; d++) {
                    store((char *) A.k_pages->data + off + d * A.k_pages->nb[0], A.k_pages->type, *(const float *) elem_ptr(A.k_cur, d, g, t, 0));
                    store((char *) A.v_pages->data + off + d * A.v_pages->nb[0], A.v_pages->type, *(const float *) elem_ptr(A.v_cur, d, g, t, 0));
                }
            }
    }
    if (G.T == 0) return;

    const TileKernels & K = kernels();
    const TilePlan plan(G);
    const std::vector<QueryTile> & tiles = plan.tiles;
    const std::vector<KeyBlock> & blocks = plan.blocks;
    const int nw = (int) std::max<int64_t>(1, std::min<int64_t>(n_threads, (int64_t) tiles.size()));
    std::vector<Scratch> scratch = plan.scratch(nw, G.D);
    const int D = (int) G.D;
    // dst is the packed node: out [T][H][D], then the log-sum-exp of row t*H + h
    float * out = (float *) dst->data;
    float * lse = out + G.D * G.H * G.T;
    parallel_items((int64_t) tiles.size(), nw, pool, [&](int64_t it, int w) {
        Scratch & s = scratch[w];
        const QueryTile & qt = tiles[it];
        const int R = tile_rows(G, qt, A.q, nullptr, out, s);
        forward_tile(K, G, blocks, A.k_pages, A.v_pages, A.scale, qt, R, s, "paged_attn");
        for (int i = 0; i < R; i++) {
            const float * o = s.O.data() + (size_t) i * D;
            // l > 0 whenever the row attends a key (always, with valid positions); else -inf
            const float L = s.m[i] + std::log(s.l[i]);
            if (A.accumulate) {  // merged into the earlier result the node's memory holds (oomb.h)
                const pa_merge_w w = pa_merge_weights(lse[s.rid[i]], L);
                for (int d = 0; d < D; d++) s.outr[i][d] = pa_merge_out(w, s.outr[i][d], o[d]);
                lse[s.rid[i]] = w.L;
                continue;
            }
            std::copy(o, o + D, s.outr[i]);
            lse[s.rid[i]] = L;
        }
    });
    if (cache_off >= 0) cache_block_copy(cache, cache_off, (float *) dst->data, G.D * G.H * G.T, G.H * G.T, true);
}

void cpu_paged_attn_back(oomb_tensor * dst, cpu::thread_pool * pool) {
    const int n_threads = pool ? pool->size() : 1;
    const oomb_paged_attn_args A = oomb_paged_attn_args_of(dst);
    PagedGeom G(A.q, A.k_pages, A.page_table, A.pos);
    if (A.q->nb[0] != sizeof(float) || A.dout->nb[0] != sizeof(float)) oomb_error("paged_attn_back: q and dout must have unit stride in dim 0");
    check_pos(G, "paged_attn_back");
    set_schedule(G, A, true, "paged_attn_back");
    check_mapped(G, "paged_attn_back");
    const int64_t H = G.H, T = G.T;
    const int D = (int) G.D;
    float * dq = (float *) dst->data;  // [D, H, T] contiguous
    float * dkc = dq + G.D * H * T;
    float * dvc = dkc + G.D * G.Hkv * T;
    if (T == 0) return;

    const TileKernels & K = kernels();
    const TilePlan plan(G);
    const std::vector<QueryTile> & tiles = plan.tiles;
    const std::vector<KeyBlock> & blocks = plan.blocks;
    const int64_t Rmax = plan.Rmax;
    const int nw = std::max(1, n_threads);
    std::vector<Scratch> scratch = plan.scratch(nw, G.D);
    const char * op = "paged_attn_back";

    // pass 1: log-sum-exp and delta = dout . out per row
    std::vector<float> lse(T * H), delta(T * H);
    if (A.fwd) {
        // saved by the forward: LSE as is, delta from the saved out (the same sum, in the same order,
        // as the recomputation below, so both paths give the same values)
        const float * fo = (const float *) A.fwd->data;
        const float * fl = fo + G.D * H * T;
        parallel_items(T, nw, pool, [&](int64_t t, int) {
            for (int64_t h = 0; h < H; h++) {
                const int64_t r = t * H + h;
                const float * o = fo + r * D;
                const float * dv = (const float *) elem_ptr(A.dout, 0, h, t, 0);
                float dl = 0.0f;
                for (int d = 0; d < D; d++) dl += dv[d] * o[d];
                lse[r] = fl[r];
                delta[r] = dl;
            }
        });
    } else {
        // recomputed: the forward again, per query tile
        parallel_items((int64_t) tiles.size(), nw, pool, [&](int64_t it, int w) {
            Scratch & s = scratch[w];
            const QueryTile & qt = tiles[it];
            const int R = tile_rows(G, qt, A.q, A.dout, nullptr, s);
            forward_tile(K, G, blocks, A.k_pages, A.v_pages, A.scale, qt, R, s, op);
            for (int i = 0; i < R; i++) {
                const float * o = s.O.data() + (size_t) i * D;
                const float * dv = s.dr[i];
                float dl = 0.0f;
                for (int d = 0; d < D; d++) dl += dv[d] * o[d];
                lse[s.rid[i]] = s.m[i] + std::log(s.l[i]);
                delta[s.rid[i]] = dl;
            }
        });
    }

    // pass 2: dK, dV per (key block, KV head), over every query tile that sees the block, and the
    // blocks' dq contributions. A work item is one of NPART interleaved sets of key blocks (of one
    // KV head) taken in order; it owns the dK/dV of its blocks (so the gradient pages are written
    // without races) and adds the dq contributions into its own dq buffer; the NPART buffers are
    // summed in a fixed order at the end. NPART does not depend on the thread count, so neither do
    // the results. (Offsets are computed in the K/V pools; the gradient pages have the same shape,
    // contiguous, so an element's byte offset there is its K/V offset / element size * grad size.)
    // bf16 gradient pages: the block's f32 sum is added to the page value in f32 and rounded back
    // stochastically (sround.h: one rounding per element and call, bits from (p, g, d) and the salt).
    constexpr int NPART = 4;
    const size_t kv_es = oomb_type_size(A.k_pages->type);
    const bool grad_bf16 = A.dk_pages->type == OOMB_TYPE_BF16;
    const size_t gr_es = oomb_type_size(A.dk_pages->type);
    const uint32_t salt_k = grad_bf16 ? sr_kv_salt(oomb_paged_attn_grad_seed(A.dk_pages), G.pos[0]) : 0;
    const uint32_t salt_v = grad_bf16 ? sr_kv_salt(oomb_paged_attn_grad_seed(A.dv_pages), G.pos[0]) : 0;
    const int64_t n_tiles = (int64_t) tiles.size();
    std::vector<std::vector<int64_t>> tiles_of(G.Hkv);
    for (int64_t k = 0; k < n_tiles; k++) tiles_of[tiles[k].g].push_back(k);
    const int64_t nb = (int64_t) blocks.size();
    const size_t tile_stride = (size_t) Rmax * D;
    std::vector<float> dq_part((size_t) NPART * n_tiles * tile_stride, 0.0f);
    parallel_items(NPART * G.Hkv, nw, pool, [&](int64_t it, int w) {
        Scratch & s = scratch[w];
        const int part = (int) (it % NPART);
        const int64_t g = it / NPART;
        float * dqp = dq_part.data() + (size_t) part * n_tiles * tile_stride;
        for (int64_t bi = part; bi < nb; bi += NPART) {
            const KeyBlock & b = blocks[bi];
            if (!pa_sched_page_used(G.sched, G.c0, (int) (b.p0 / G.P))) continue;  // no row sees it: not read (may be unmapped)
            load_block(G, A.k_pages, g, b, s.Kt.data(), s.Kr.data(), op);
            load_block(G, A.v_pages, g, b, s.Vt.data(), nullptr, op);
            std::fill(s.acc1.begin(), s.acc1.end(), 0.0f);  // dK
            std::fill(s.acc2.begin(), s.acc2.end(), 0.0f);  // dV
            bool any = false;
            for (int64_t k : tiles_of[g]) {
                const QueryTile & qt = tiles[k];
                if (qt.max_pos < b.p0) continue;
                const int R = tile_rows(G, qt, A.q, A.dout, nullptr, s);
                const int32_t * rp = block_rpos(G, b, R, s);
                if (!rp) continue;
                for (int i = 0; i < R; i++) { s.lse[i] = lse[s.rid[i]]; s.delta[i] = delta[s.rid[i]]; }
                K.scores(R, D, s.qr.data(), s.Kt.data(), s.S.data());
                K.scores(R, D, s.dr.data(), s.Vt.data(), s.S2.data());
                K.bwd_probs(R, A.scale, s.S.data(), s.S2.data(), s.lse.data(), s.delta.data(), rp, b.p0, b.n);
                K.accum_rows(R, D, s.S2.data(), b.n, s.Kr.data(), dqp + (size_t) k * tile_stride);
                K.transpose(R, s.S.data(), s.Pt.data());
                K.accum_cols(b.n, R, D, s.Pt.data(), s.dr.data(), s.acc2.data());
                K.transpose(R, s.S2.data(), s.Pt.data());
                K.accum_cols(b.n, R, D, s.Pt.data(), s.qr.data(), s.acc1.data());
                any = true;
            }
            if (!any) continue;
            if (grad_bf16) {
                for (int j = 0; j < b.n; j++) {
                    const size_t goff = G.offset(b.p0 + j, g, op) / kv_es * gr_es;
                    uint16_t * dkr = (uint16_t *) ((char *) A.dk_pages->data + goff);
                    uint16_t * dvr = (uint16_t *) ((char *) A.dv_pages->data + goff);
                    const float * ak = s.acc1.data() + (size_t) j * D;
                    const float * av = s.acc2.data() + (size_t) j * D;
                    for (int d = 0; d < D; d++) {
                        const uint32_t i = sr_kv_index(b.p0 + j, g, d, G.Hkv, D);
                        dkr[d] = sr_bf16_add(dkr[d], ak[d] * A.scale, i, salt_k);
                        dvr[d] = sr_bf16_add(dvr[d], av[d], i, salt_v);
                    }
                }
                continue;
            }
            for (int j = 0; j < b.n; j++) {
                const size_t goff = G.offset(b.p0 + j, g, op) / kv_es * sizeof(float);
                float * dkr = (float *) ((char *) A.dk_pages->data + goff);
                float * dvr = (float *) ((char *) A.dv_pages->data + goff);
                const float * ak = s.acc1.data() + (size_t) j * D;
                const float * av = s.acc2.data() + (size_t) j * D;
                for (int d = 0; d < D; d++) { dkr[d] += ak[d] * A.scale; dvr[d] += av[d]; }
            }
        }
    });
    // dq = scale * (sum of the parts, in order)
    parallel_items(n_tiles, nw, pool, [&](int64_t k, int w) {
        Scratch & s = scratch[w];
        const int R = tile_rows(G, tiles[k], A.q, nullptr, nullptr, s);
        for (int i = 0; i < R; i++) {
            float * dqv = dq + s.rid[i] * D;
            for (int d = 0; d < D; d++) {
                float a = 0.0f;
                for (int part = 0; part < NPART; part++) a += dq_part[((size_t) part * n_tiles + k) * tile_stride + (size_t) i * D + d];
                const float v = a * A.scale;
                dqv[d] = A.accumulate ? dqv[d] + v : v;  // accumulate: added to the dq the node's memory holds
            }
        }
    });
    if (A.accumulate) return;  // dk_cur / dv_cur: written by the earlier call (oomb.h)

    // dk_cur, dv_cur: the completed gradients of the chunk's own positions
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < G.Hkv; g++) {
            const size_t off = G.offset(G.pos[t], g, op);
            const size_t goff = off / kv_es * gr_es;
            const char * dkr = (const char *) A.dk_pages->data + goff;
            const char * dvr = (const char *) A.dv_pages->data + goff;
            float * dko = dkc + (t * G.Hkv + g) * D, * dvo = dvc + (t * G.Hkv + g) * D;
            if (!grad_bf16) {
                std::copy((const float *) dkr, (const float *) dkr + D, dko);
                std::copy((const float *) dvr, (const float *) dvr + D, dvo);
                continue;
            }
            for (int d = 0; d < D; d++) {
                dko[d] = sr_bf16_to_f32(((const uint16_t *) dkr)[d]);
                dvo[d] = sr_bf16_to_f32(((const uint16_t *) dvr)[d]);
            }
        }
}

} // namespace oomb

