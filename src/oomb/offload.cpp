// Host offload of the KV cache (oomb-offload.h): a chunk graph computed in parts around its
// paged-attention nodes, each attention node computed block by block over the KV cache's tiers,
// with the host tier's pages streamed through device slots on the copy queue.
//
// Slot layout of a layer's device pools (paged-impl.h): [0, R) resident pages, then n_cur slots
// for the chunk's own pages past R, then two sets of B slots for history blocks. The page table of
// a chunk maps every logical page it reads to its slot: pages of history block b to set b % 2, so
// one table serves every layer and every block of the chunk.
//
// Order of one attention node (kernels and merges in order on the compute queue; copies to the
// device on the copy queue, copies to the host on the second copy queue, PCIe's other direction;
// events order them):
//   the first two history blocks start streaming into sets 0 and 1 (each set once its last use
//   finished), then
//   forward:  the node itself, patched to RANGE [c0, c1) (the chunk's pages, with its store) ->
//             copy the chunk's K/V pages past R out to the host (after the node);
//             resident history RANGE [0, min(R, c0)), accumulated into the node's out / LSE;
//             block b (after its copy in): RANGE, accumulated; then block b + 2 streams into the set.
//   backward: the node itself patched to RANGE [c0, c1) (dq, and dk/dv of the chunk read back) ->
//             copy the chunk's gradient pages past R out; resident history, its dq accumulated;
//             block b: RANGE backward, dq accumulated -> copy its dK/dV out; then block b + 2
//             streams in (K/V/dK/dV) once that copy out finished.
// A block is one kernel call that accumulates into the node's own memory
// (oomb_paged_attn_args.accumulate: the forward merges its partial result through the LSE inside the
// kernel's epilogue, the backward adds its dq with the same atomics): no merge pass, no dq sum.
// So block b + 1's copy in and block b - 1's copy out run beside block b's kernel.
// Sparse nodes (a LISTS schedule, oomb-sparse.h) move only the selected pages: once the node's lists
// are known (stage 1: the selection node's output, downloaded after the part that computes it;
// stage 2: the uploaded lists, read before the chunk), U = the history pages some query tile
// listed; the host-tier pages of U stream in blocks of B pages of U (not of consecutive pages),
// each computed as LISTS_RANGE over its window [U[bB], U[(b+1)B]) (the last one up to c0): the
// windows partition the history, so the blocks attend exactly the listed pages, merged through the
// LSE like RANGE blocks. The resident history runs as LISTS_RANGE [0, R) (its listed pages only),
// the chunk's own pages as LISTS_RANGE [c0, c1) (the same generic kernels as the resident LISTS
// node). The node's blocks read their own page table (per node: U's pages -> the set slots, the
// unlisted host pages unmapped), uploaded on the compute queue; the kernels never read an unlisted
// page (pa_sched_page_used). Backward: dK/dV copied in and out for U's pages only; dq as above.
// The chunk's pages past R of a layer (the K/V that hold data, and their gradients in a backward
// graph) are copied in just before that layer's first attention node, which alone waits for them. Gradient pages never written since zero_grad are read from a
// zero page instead of the host (the host tier is never cleared). The whole chunk finishes
// (every queue synchronized) before compute returns, so chunks never overlap.
// Early copies (OOMB_OFFLOAD_EARLY_COPIES=1; default 0 until measured on the GPU: the predicted gain
// unprofiled is <= 0.5 % of a step, bench/NOTES.md): a node's first two blocks are queued before
// the graph part that precedes it, where its page list is known before the chunk (dense, stage 2);
// the same events and the same order on every queue, only the host's moment of queueing moves.
// Was the host already early before the switch? Mostly: nothing it queues waits on the GPU, so it
// runs ahead and node i's copies sat in the copy queue long before the GPU reached part i, except
// after the host's waits on the GPU (see first_copies): a part with a data-dependent error check
// (the embedding, the loss before the first backward node), stage 1's list downloads, and every
// part under OOMB_CUDA_PROFILE=1, which synchronizes each graph_compute (the 64K profile ran so).

#include "oomb-offload.h"
#include "oomb-impl.h"
#include "paged-attn-sched.h"
#include "paged-impl.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::atomic<uint64_t> g_bytes_in{0}, g_bytes_out{0}, g_copies{0}, g_blocks{0}, g_copy_us{0}, g_wait_us{0};
// test hook OOMB_DEBUG_OFFLOAD_FAIL_COPY=N: armed by the first stream created while it is set (a
// new value arms it again): the N-th copy after that, over every stream, fails once
std::atomic<uint64_t> g_fail_at{0};
std::mutex g_fail_mutex;
std::string g_fail_armed;
// test hook OOMB_DEBUG_OFFLOAD_TRACE=1 (read when a stream is created): the stream logs the order in
// which it queues a chunk's work (oomb_kv_stream_debug_trace); off: one branch per logged step
std::mutex g_trace_mutex;
std::string g_trace, g_trace_read;

bool env_flag(const char * name, bool dflt) {
    const char * e = std::getenv(name);
    if (!e || !*e) return dflt;
    if (!std::strcmp(e, "0")) return false;
    if (!std::strcmp(e, "1")) return true;
    oomb_error("%s=%s: must be 0 or 1", name, e);
}

void arm_fault() {
    const char * e = std::getenv("OOMB_DEBUG_OFFLOAD_FAIL_COPY");
    std::lock_guard<std::mutex> lock(g_fail_mutex);
    if (!e || !*e || g_fail_armed == e) return;
    g_fail_armed = e;
    g_fail_at = g_copies.load() + std::strtoull(e, nullptr, 10);
}

// One paged-attention node of the chunk graph and the graph that computes one of its blocks.
struct AttnNode {
    int index = 0;               // in the chunk graph
    bool back = false;           // paged_attn_back
    int layer = 0;
    bool store = false;          // forward: the node stores the chunk's K/V
    oomb_tensor * node = nullptr;
    oomb_tensor * blk = nullptr; // the block's node (RANGE patched per block), accumulating into the node's memory
    oomb_cgraph * block_graph = nullptr;  // blk alone
    oomb_cgraph * self = nullptr;         // the node alone (a view of the chunk graph)
    // sparse (LISTS) nodes: the lists, their host copy, the union U of the listed history pages
    bool sparse = false;
    bool lists_in_graph = false;          // computed by the chunk graph (stage 1's selection), else uploaded (stage 2)
    oomb_tensor * offsets = nullptr, * pages = nullptr;
    std::vector<int32_t> h_offsets, h_pages, U;  // U: the listed pages >= R, ascending
    int64_t n_resident_listed = 0;        // listed pages < R
    oomb_tensor * table = nullptr;        // the blocks' page table (in the stream's table buffer)
    std::vector<int32_t> h_table;         // its host copy (valid until the chunk finished: an async upload reads it)
    bool first_queued = false;            // this chunk: blocks 0 and 1 already queued (early, before the part)
};

void set_range(oomb_tensor * t, int32_t first, int32_t last, oomb_page_schedule_kind kind = OOMB_SCHEDULE_RANGE) {
    t->op_params[oomb::PA_PARAM_SCHED_KIND] = kind;
    t->op_params[oomb::PA_PARAM_SCHED_FIRST] = first;
    t->op_params[oomb::PA_PARAM_SCHED_LAST] = last;
}

} // namespace

struct oomb_kv_stream {
    oomb_kv_cache_t kv = nullptr;
    oomb_backend_t be = nullptr;
    oomb_cgraph * g = nullptr;
    oomb_context * ctx = nullptr;       // block nodes, graph parts
    oomb_buffer_t tables = nullptr;     // the sparse nodes' page tables
    std::vector<AttnNode> attn;
    std::vector<oomb_cgraph *> parts;   // parts[i]: the nodes before attn[i] (after attn[i-1]); parts[n]: the rest
    bool has_back = false, has_store = false;
    std::vector<oomb_event_t> ev_free;  // [layer * 2 + set]: the set's last use
    std::vector<bool> ev_free_set;
    oomb_event_t ev_in = nullptr, ev_done = nullptr;
    oomb_event_t ev_set_in[2] = {nullptr, nullptr};  // a block's copies into set s finished
    std::string err;
    bool early = false;                 // OOMB_OFFLOAD_EARLY_COPIES: a node's first copies before its part
    bool trace = false;                 // OOMB_DEBUG_OFFLOAD_TRACE
    std::string trace_buf;              // this compute's log (appended to g_trace when it finished)
    void log(const char * fmt, int64_t x, int64_t y = -1) {
        if (!trace) return;
        char buf[64];
        snprintf(buf, sizeof(buf), fmt, x, y);
        trace_buf += buf;
    }

    // Copy time (the copy queue busy) and exposed time (the compute queue waiting for copies):
    // pairs of timed events, read after the chunk finished. A synchronous backend times its
    // copies on the host clock, all of it exposed.
    struct Span { oomb_event_t a = nullptr; std::chrono::steady_clock::time_point t; };
    std::vector<oomb_event_t> tpool;
    size_t tused = 0;
    std::vector<std::pair<oomb_event_t, oomb_event_t>> copy_spans, wait_spans;
    bool host_clock = false;
    double host_ms = 0;
    oomb_event_t timed() {
        if (tused == tpool.size()) {
            oomb_event_t e = oomb_event_new_timed(be);
            if (!e) return nullptr;
            tpool.push_back(e);
        }
        return tpool[tused++];
    }
    Span span_begin(oomb_queue q) {
        Span s;
        if (host_clock) s.t = std::chrono::steady_clock::now();
        else if ((s.a = timed()) && oomb_event_record(s.a, q)) s.a = nullptr;
        return s;
    }
    void span_end(const Span & s, oomb_queue q, bool copy) {
        if (host_clock) {
            if (copy) host_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.t).count();
            return;
        }
        oomb_event_t b = s.a ? timed() : nullptr;
        if (b && !oomb_event_record(b, q)) (copy ? copy_spans : wait_spans).push_back({s.a, b});
    }
    // after the chunk's queues are synchronized
    void collect_times() {
        double copy_ms = host_ms, wait_ms = host_ms;
        for (int w = 0; w < 2; w++) {
            for (auto & p : w ? wait_spans : copy_spans) {
                float ms = 0;
                if (!oomb_event_elapsed_ms(p.first, p.second, &ms)) (w ? wait_ms : copy_ms) += ms;
            }
        }
        g_copy_us += (uint64_t) (copy_ms * 1000.0);
        g_wait_us += (uint64_t) (wait_ms * 1000.0);
        copy_spans.clear();
        wait_spans.clear();
        tused = 0;
        host_ms = 0;
    }

    ~oomb_kv_stream() {
        for (oomb_event_t e : tpool) oomb_event_free(e);
        for (oomb_event_t e : ev_free) oomb_event_free(e);
        oomb_event_free(ev_in);
        oomb_event_free(ev_done);
        for (oomb_event_t e : ev_set_in) oomb_event_free(e);
        oomb_buffer_free(tables);
        oomb_free(ctx);
    }

    oomb_status fail(oomb_status st, const std::string & what) {
        err = what;
        return st;
    }
    oomb_status run(oomb_cgraph * part) {
        if (part->nodes.empty()) return OOMB_STATUS_OK;
        const oomb_status st = oomb_backend_graph_compute(be, part);
        return st == OOMB_STATUS_OK ? st : fail(st, oomb_backend_last_error(be));
    }
    oomb_status copy_check(oomb_status st) {
        if (st != OOMB_STATUS_OK) return fail(st, std::string("offload: ") + oomb_backend_last_error(be));
        const uint64_t n = ++g_copies;
        uint64_t at = g_fail_at.load();
        if (at && n == at && g_fail_at.compare_exchange_strong(at, 0))
            return fail(OOMB_STATUS_DEVICE_ERROR, "offload: copy " + g_fail_armed + " failed (injected by OOMB_DEBUG_OFFLOAD_FAIL_COPY)");
        return OOMB_STATUS_OK;
    }
    // host pages [lp0, lp1) (logical, >= R) <-> device slots from slot0 of pool t
    oomb_status copy_in(oomb_tensor * t, char * host, size_t pb, int64_t slot0, int64_t lp0, int64_t lp1) {
        if (lp1 <= lp0) return OOMB_STATUS_OK;
        const size_t n = (size_t) (lp1 - lp0) * pb;
        g_bytes_in += n;
        return copy_check(oomb_tensor_set_async(be, OOMB_QUEUE_COPY, t, host + (size_t) (lp0 - kv->R) * pb, (size_t) slot0 * pb, n));
    }
    oomb_status copy_out(oomb_tensor * t, char * host, size_t pb, int64_t slot0, int64_t lp0, int64_t lp1) {
        if (lp1 <= lp0) return OOMB_STATUS_OK;
        const size_t n = (size_t) (lp1 - lp0) * pb;
        g_bytes_out += n;
        return copy_check(oomb_tensor_get_async(be, OOMB_QUEUE_COPY_OUT, t, host + (size_t) (lp0 - kv->R) * pb, (size_t) slot0 * pb, n));
    }
    // gradient pages: runs of fresh pages (zero since zero_grad) come from the zero pages
    oomb_status grad_in(int l, int64_t slot0, int64_t lp0, int64_t lp1) {
        for (int64_t a = lp0; a < lp1;) {
            const bool fresh = kv->fresh(l, a) != 0;
            int64_t b = a + 1;
            while (b < lp1 && (kv->fresh(l, b) != 0) == fresh) b++;
            const size_t pb = kv->page_grad_bytes, n = (size_t) (b - a) * pb, off = (size_t) (slot0 + a - lp0) * pb;
            for (int w = 0; w < 2; w++) {
                oomb_tensor * t = w ? kv->dv[(size_t) l] : kv->dk[(size_t) l];
                const char * src = fresh ? kv->zeros : (w ? kv->dvh[(size_t) l] : kv->dkh[(size_t) l]) + (size_t) (a - kv->R) * pb;
                g_bytes_in += n;
                if (oomb_status st = copy_check(oomb_tensor_set_async(be, OOMB_QUEUE_COPY, t, src, off, n))) return st;
            }
            a = b;
        }
        return OOMB_STATUS_OK;
    }
    oomb_status grad_out(int l, int64_t slot0, int64_t lp0, int64_t lp1) {
        for (int64_t p = lp0; p < lp1; p++) kv->fresh(l, p) = 0;
        if (oomb_status st = copy_out(kv->dk[(size_t) l], kv->dkh[(size_t) l], kv->page_grad_bytes, slot0, lp0, lp1)) return st;
        return copy_out(kv->dv[(size_t) l], kv->dvh[(size_t) l], kv->page_grad_bytes, slot0, lp0, lp1);
    }
    oomb_status kv_in(int l, int64_t slot0, int64_t lp0, int64_t lp1) {
        if (oomb_status st = copy_in(kv->k[(size_t) l], kv->kh[(size_t) l], kv->page_kv_bytes, slot0, lp0, lp1)) return st;
        return copy_in(kv->v[(size_t) l], kv->vh[(size_t) l], kv->page_kv_bytes, slot0, lp0, lp1);
    }
    oomb_status kv_out(int l, int64_t slot0, int64_t lp0, int64_t lp1) {
        if (oomb_status st = copy_out(kv->k[(size_t) l], kv->kh[(size_t) l], kv->page_kv_bytes, slot0, lp0, lp1)) return st;
        return copy_out(kv->v[(size_t) l], kv->vh[(size_t) l], kv->page_kv_bytes, slot0, lp0, lp1);
    }
    // queue `to` waits for everything queued so far on `from` (the compute queue's wait is timed)
    oomb_status order(oomb_event_t e, oomb_queue from, oomb_queue to) {
        oomb_status st = oomb_event_record(e, from);
        const Span s = to == OOMB_QUEUE_COMPUTE && !host_clock ? span_begin(to) : Span{};
        if (st == OOMB_STATUS_OK) st = oomb_event_wait(be, to, e);
        if (s.a) span_end(s, to, false);
        return st == OOMB_STATUS_OK ? st : fail(st, std::string("offload: event: ") + oomb_backend_last_error(be));
    }
    // one block of history pages [first, last), accumulated into the node's memory (placed there
    // per run: the chunk graph is re-placed before every compute)
    oomb_status run_block(AttnNode & a, int32_t first, int32_t last) {
        set_range(a.blk, first, last, a.sparse ? OOMB_SCHEDULE_LISTS_RANGE : OOMB_SCHEDULE_RANGE);
        a.blk->data = a.node->data;
        a.blk->buffer = a.node->buffer;
        return run(a.block_graph);
    }
    // the copies of logical pages pages[i0, i1) (ascending, >= R) to / from the slots slot0 + (i - i0),
    // one copy per run of consecutive pages
    template <typename F> oomb_status page_runs(const std::vector<int32_t> & pages, size_t i0, size_t i1, int64_t slot0, F copy) {
        for (size_t i = i0; i < i1;) {
            size_t j = i + 1;
            while (j < i1 && pages[j] == pages[j - 1] + 1) j++;
            if (oomb_status st = copy(slot0 + (int64_t) (i - i0), (int64_t) pages[i], (int64_t) pages[j - 1] + 1)) return st;
            i = j;
        }
        return OOMB_STATUS_OK;
    }
    oomb_status sparse_lists(AttnNode & a, int64_t c0);
    int64_t n_blocks(const AttnNode & a, int64_t c0) const;
    void window(const AttnNode & a, int64_t c0, int64_t b, int64_t & lo, int64_t & hi) const;
    oomb_status block_copies(AttnNode & a, int64_t c0, int64_t b, int set, bool grad, bool out);
    oomb_status copy_block_in(AttnNode & a, int64_t c0, int64_t b);
    oomb_status first_copies(AttnNode & a, int64_t c0);
    oomb_status attention(AttnNode & a, int64_t c0, int64_t c1);
    oomb_status compute(int64_t p0, int64_t T);
};

oomb_kv_stream_t oomb_kv_stream_new(oomb_kv_cache_t kv, oomb_backend_t backend, struct oomb_cgraph * g) {
    if (!kv || !backend || !g) oomb_error("kv_stream_new: kv, backend and g must not be NULL");
    if (!kv->tiered) oomb_error("kv_stream_new: the KV cache has no host tier (oomb_kv_cache_init_tiered with resident_pages < its pages)");
    auto * s = new oomb_kv_stream();
    s->kv = kv;
    s->be = backend;
    s->g = g;
    s->ctx = oomb_init({0, true});
    arm_fault();
    s->host_clock = oomb_backend_is_host(backend);
    s->early = env_flag("OOMB_OFFLOAD_EARLY_COPIES", false);
    s->trace = env_flag("OOMB_DEBUG_OFFLOAD_TRACE", false);
    auto layer_of = [&](const oomb_tensor * pool) {
        for (int l = 0; l < kv->p.n_layer; l++)
            if (kv->k[(size_t) l] == pool) return l;
        return -1;
    };
    for (size_t i = 0; i < g->nodes.size(); i++) {
        oomb_tensor * n = g->nodes[i];
        if (n->op != OOMB_OP_PAGED_ATTN && n->op != OOMB_OP_PAGED_ATTN_BACK) continue;
        oomb_paged_attn_args args = oomb_paged_attn_args_of(n);
        const int l = layer_of(args.k_pages);
        if (l < 0) continue;  // attention over another cache: computed as it is
        if (args.schedule.kind != OOMB_SCHEDULE_DENSE && args.schedule.kind != OOMB_SCHEDULE_LISTS)
            oomb_error("kv_stream_new: node %s: only dense and page-list (sparse) paged attention stream over a host tier "
                       "(schedule kind %d)", n->name, (int) args.schedule.kind);
        if (n->op == OOMB_OP_PAGED_ATTN_BACK && !args.fwd)
            oomb_error("kv_stream_new: node %s: a streamed backward needs the forward's saved statistics (fwd): its page blocks "
                       "cannot recompute the whole rows' log-sum-exp and delta (oomb_paged_attn_back with fwd, as autodiff builds it)",
                       n->name);
        if (n->op == OOMB_OP_PAGED_ATTN && args.out_cache)
            oomb_error("kv_stream_new: node %s keeps an attention-result cache, which a host tier does not support "
                       "(oomb-train: drop --attn-cache, or keep the whole KV cache on the device)", n->name);
        AttnNode a;
        a.index = (int) i;
        a.back = n->op == OOMB_OP_PAGED_ATTN_BACK;
        a.layer = l;
        a.node = n;
        a.store = !a.back && args.store;
        a.block_graph = oomb_new_graph_custom(s->ctx, 8);
        a.sparse = args.schedule.kind == OOMB_SCHEDULE_LISTS;
        if (a.sparse) {
            a.offsets = args.schedule.offsets;
            a.pages = args.schedule.pages;
            auto root = [](oomb_tensor * t) { return t->view_src ? t->view_src : t; };
            for (size_t j = 0; j < i && !a.lists_in_graph; j++) a.lists_in_graph = root(g->nodes[j]) == root(a.offsets);
            a.table = oomb_new_tensor_1d(s->ctx, OOMB_TYPE_I32, oomb_nelements(args.page_table));
            oomb_format_name(a.table, "%s.block_pages", n->name);
        }
        // a block accumulates into the node's own memory (run_block places it there): the forward
        // merges its partial result into the node's out / LSE, the backward adds its dq to the
        // node's (oomb_paged_attn_args.accumulate), so a block is one kernel call, no merge pass
        args.accumulate = 1;
        if (!a.back) {
            args.store = 0;
            if (!a.sparse) args.schedule = oomb_schedule_range(0, 0);  // sparse: the lists, run as LISTS_RANGE
            else args.page_table = a.table;
            a.blk = oomb_paged_attn_ext(s->ctx, &args)->view_src;
        } else {
            a.blk = oomb_paged_attn_back_ext(s->ctx, &args);  // built as the node (the fwd check), run as RANGE / LISTS_RANGE
            // sparse: the block reads its own page table (the fwd check wants the node's, whose
            // statistics it uses: the same keys, mapped to the block's slots)
            if (a.sparse) a.blk->src[oomb::PAB_SRC_PAGE_TABLE] = a.table;
        }
        a.block_graph->nodes = {a.blk};
        oomb_graph_set_continuation(a.block_graph, true);
        a.self = oomb_graph_view(s->ctx, g, (int) i, (int) i + 1);
        s->has_back |= a.back;
        s->has_store |= a.store;
        s->attn.push_back(a);
    }
    int prev = 0;
    for (const AttnNode & a : s->attn) {
        s->parts.push_back(oomb_graph_view(s->ctx, g, prev, a.index));
        prev = a.index + 1;
    }
    s->parts.push_back(oomb_graph_view(s->ctx, g, prev, (int) g->nodes.size()));
    size_t table_bytes = 0;
    for (const AttnNode & a : s->attn)
        if (a.table) table_bytes += (oomb_nbytes(a.table) + 255) / 256 * 256;
    if (table_bytes) {
        if (!(s->tables = oomb_backend_alloc_buffer(backend, table_bytes))) {
            fprintf(stderr, "oomb: kv_stream_new: cannot allocate %.1f KiB of page tables on %s\n", table_bytes / 1024.0,
                    oomb_backend_name(backend));
            delete s;
            return nullptr;
        }
        size_t off = 0;
        for (AttnNode & a : s->attn) {
            if (!a.table) continue;
            oomb_tensor_alloc(s->tables, a.table, off);
            off += (oomb_nbytes(a.table) + 255) / 256 * 256;
        }
    }
    for (int i = 0; i < 2 * kv->p.n_layer; i++) s->ev_free.push_back(oomb_event_new(backend));
    s->ev_free_set.assign(s->ev_free.size(), false);
    s->ev_in = oomb_event_new(backend);
    s->ev_done = oomb_event_new(backend);
    for (oomb_event_t & e : s->ev_set_in)
        if (!(e = oomb_event_new(backend))) oomb_error("kv_stream_new: cannot create events on %s", oomb_backend_name(backend));
    for (oomb_event_t e : s->ev_free)
        if (!e) oomb_error("kv_stream_new: cannot create events on %s", oomb_backend_name(backend));
    if (!s->ev_in || !s->ev_done) oomb_error("kv_stream_new: cannot create events on %s", oomb_backend_name(backend));
    return s;
}

void oomb_kv_stream_free(oomb_kv_stream_t s) { delete s; }

// A sparse node's lists (downloaded: a few KB), their union U past the resident pages and the
// blocks' page table (uploaded on the compute queue, read by the node's blocks only).
oomb_status oomb_kv_stream::sparse_lists(AttnNode & a, int64_t c0) {
    const int64_t R = kv->R, B = kv->B, nq = oomb_nelements(a.offsets) - 1;
    // read through the view's source (stage 1's lists are views of the selection node)
    auto get = [](const oomb_tensor * t, void * dst, size_t n) {
        oomb_tensor_get(t->view_src ? t->view_src : t, dst, t->view_src ? t->view_offs : 0, n);
    };
    a.h_offsets.resize((size_t) nq + 1);
    get(a.offsets, a.h_offsets.data(), a.h_offsets.size() * sizeof(int32_t));
    const int64_t nnz = a.h_offsets.back();
    if (nnz < 0 || nnz > oomb_nelements(a.pages))
        oomb_error("kv_stream_compute: node %s: page lists: offsets[%" PRId64 "] = %" PRId64 " entries, the pages tensor holds %" PRId64,
                   a.node->name, nq, nnz, oomb_nelements(a.pages));
    a.h_pages.resize((size_t) nnz);
    if (nnz) get(a.pages, a.h_pages.data(), (size_t) nnz * sizeof(int32_t));
    oomb_schedule_check_lists(a.h_offsets.data(), nq, a.h_pages.data(), nnz, c0, "kv_stream_compute (sparse lists)");
    std::vector<int32_t> all(a.h_pages);
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    a.n_resident_listed = std::lower_bound(all.begin(), all.end(), (int32_t) R) - all.begin();
    a.U.assign(all.begin() + a.n_resident_listed, all.end());
    a.h_table = kv->table;  // resident pages and the chunk's own as every node sees them
    for (int64_t lp = R; lp < c0; lp++) a.h_table[(size_t) lp] = -1;
    for (size_t i = 0; i < a.U.size(); i++)
        a.h_table[(size_t) a.U[i]] = (int32_t) (kv->set_slot0((int) ((int64_t) i / B % 2)) + (int64_t) i % B);
    oomb_status st = oomb_tensor_set_async(be, OOMB_QUEUE_COMPUTE, a.table, a.h_table.data(), 0, a.h_table.size() * sizeof(int32_t));
    return st ? fail(st, std::string("offload: page table: ") + oomb_backend_last_error(be)) : OOMB_STATUS_OK;
}

// History blocks: dense, B consecutive pages from R; sparse, B pages of U each, over a window
// [first page, the next block's first page) (the last one up to c0).
int64_t oomb_kv_stream::n_blocks(const AttnNode & a, int64_t c0) const {
    const int64_t R = kv->R, B = kv->B;
    return a.sparse ? ((int64_t) a.U.size() + B - 1) / B : c0 > R ? (c0 - R + B - 1) / B : 0;
}
void oomb_kv_stream::window(const AttnNode & a, int64_t c0, int64_t b, int64_t & lo, int64_t & hi) const {
    const int64_t R = kv->R, B = kv->B;
    if (!a.sparse) {
        lo = R + b * B;
        hi = std::min(lo + B, c0);
    } else {
        lo = a.U[(size_t) (b * B)];
        hi = b + 1 < n_blocks(a, c0) ? a.U[(size_t) ((b + 1) * B)] : c0;
    }
}
// a block's pages (dense: its window) into / out of set s: one copy per run of consecutive pages
oomb_status oomb_kv_stream::block_copies(AttnNode & a, int64_t c0, int64_t b, int set, bool grad, bool out) {
    const int l = a.layer;
    const int64_t slot0 = kv->set_slot0(set), B = kv->B;
    auto one = [&](int64_t s0, int64_t lo, int64_t hi) -> oomb_status {
        if (out) return grad_out(l, s0, lo, hi);
        if (oomb_status r = grad ? OOMB_STATUS_OK : kv_in(l, s0, lo, hi)) return r;
        return grad ? grad_in(l, s0, lo, hi) : OOMB_STATUS_OK;
    };
    if (!a.sparse) {
        int64_t lo, hi;
        window(a, c0, b, lo, hi);
        return one(slot0, lo, hi);
    }
    return page_runs(a.U, (size_t) (b * B), (size_t) std::min<int64_t>((b + 1) * B, (int64_t) a.U.size()), slot0, one);
}
// block b's copies into set b % 2 (copy queue), once the set's last use finished
oomb_status oomb_kv_stream::copy_block_in(AttnNode & a, int64_t c0, int64_t b) {
    const int set = (int) (b % 2);
    const size_t e = (size_t) (2 * a.layer + set);
    auto evfail = [&] { return fail(OOMB_STATUS_DEVICE_ERROR, std::string("offload: event: ") + oomb_backend_last_error(be)); };
    if (ev_free_set[e] && oomb_event_wait(be, OOMB_QUEUE_COPY, ev_free[e])) return evfail();
    log("i%" PRId64 ".%" PRId64 " ", (int64_t) (&a - attn.data()), b);
    const Span sp = span_begin(OOMB_QUEUE_COPY);
    oomb_status r = block_copies(a, c0, b, set, false, false);
    if (!r && a.back) r = block_copies(a, c0, b, set, true, false);
    if (r) return r;
    span_end(sp, OOMB_QUEUE_COPY, true);
    return oomb_event_record(ev_set_in[set], OOMB_QUEUE_COPY) ? evfail() : OOMB_STATUS_OK;
}
// The first two blocks, streamed while the chunk's own part and the resident history compute (and,
// queued early, while the graph part before the node computes).
//
// Early copies (OOMB_OFFLOAD_EARLY_COPIES=1, off by default): compute() queues them before it launches
// the part before the node, for every node whose page list is known before the chunk (dense nodes,
// stage 2's uploaded lists; not stage 1's sparse nodes, whose selection that part computes). The
// events are the same and so is the order of everything on each queue: the copy queue holds node
// i - 1's copies, then node i's; the compute queue part i, then node i's kernels, each block after
// its wait on ev_set_in. Only the host's moment of queueing moves, so an order the GPU may run them
// in with early copies it could already run them in whenever the host ran ahead (the parts read no
// set slot, record or wait on no stream event). Whether the host runs ahead today (before this
// switch), read from the code: mostly yes, it queues without waiting on the GPU (kernels, copies
// from pinned memory, event records and waits are asynchronous), so node i's first copies were
// already queued while the GPU still worked on earlier parts, except where the host waits on the
// GPU: the page-table upload at a chunk's start (the queues are empty then anyway), the end of a
// part with a data-dependent error check (cuda/: get_rows, cross_entropy and linear_cross_entropy
// set check_err; graph_compute then synchronizes: the embedding part, and the loss part before a
// backward graph's first backward node), stage 1's list downloads, and every graph_compute under
// OOMB_CUDA_PROFILE (it synchronizes after each graph: the 64K profile of bench/offload/RESULTS.md
// ran so, every node's first copies queued only after the GPU finished the part before it).
oomb_status oomb_kv_stream::first_copies(AttnNode & a, int64_t c0) {
    for (int64_t b = 0; b < std::min<int64_t>(2, n_blocks(a, c0)); b++)
        if (oomb_status st = copy_block_in(a, c0, b)) return st;
    a.first_queued = true;
    return OOMB_STATUS_OK;
}

oomb_status oomb_kv_stream::attention(AttnNode & a, int64_t c0, int64_t c1) {
    const int64_t R = kv->R, cs = std::max(c0, R);
    const int l = a.layer;
    oomb_status st = OOMB_STATUS_OK;
    if (a.sparse && a.lists_in_graph && (st = sparse_lists(a, c0))) return st;  // stage 1: the selection just computed
    const int64_t nb = n_blocks(a, c0);
    auto evfail = [&] { return fail(OOMB_STATUS_DEVICE_ERROR, std::string("offload: event: ") + oomb_backend_last_error(be)); };
    if (!a.first_queued && (st = first_copies(a, c0))) return st;
    a.first_queued = false;
    log("n%" PRId64 ":%" PRId64 " ", (int64_t) (&a - attn.data()), !a.sparse ? 0 : a.lists_in_graph ? 2 : 1);
    // the chunk's own pages (the node itself, its store included; sparse: on the lists' kernels)
    int32_t saved[3];
    for (int k = 0; k < 3; k++) saved[k] = a.node->op_params[oomb::PA_PARAM_SCHED_KIND + k];
    set_range(a.node, (int32_t) c0, (int32_t) c1, a.sparse ? OOMB_SCHEDULE_LISTS_RANGE : OOMB_SCHEDULE_RANGE);
    st = run(a.self);
    for (int k = 0; k < 3; k++) a.node->op_params[oomb::PA_PARAM_SCHED_KIND + k] = saved[k];
    if (st) return st;
    if (cs < c1 && (a.store || a.back)) {  // written back on the second copy queue (the other PCIe direction)
        if ((st = order(ev_done, OOMB_QUEUE_COMPUTE, OOMB_QUEUE_COPY_OUT))) return st;
        const Span sp = span_begin(OOMB_QUEUE_COPY_OUT);
        if ((st = a.back ? grad_out(l, kv->cur_slot0(), cs, c1) : kv_out(l, kv->cur_slot0(), cs, c1))) return st;
        span_end(sp, OOMB_QUEUE_COPY_OUT, true);
    }
    // resident history (sparse: only when some tile listed a resident page)
    if (std::min(R, c0) > 0 && (!a.sparse || a.n_resident_listed > 0) && (st = run_block(a, 0, (int32_t) std::min(R, c0)))) return st;
    // streamed history: block b computes while block b + 1 streams in and block b - 1 streams out
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo, hi;
        window(a, c0, b, lo, hi);
        const int set = (int) (b % 2);
        const size_t e = (size_t) (2 * l + set);
        {
            const Span sw = host_clock ? Span{} : span_begin(OOMB_QUEUE_COMPUTE);
            if (oomb_event_wait(be, OOMB_QUEUE_COMPUTE, ev_set_in[set])) return evfail();
            if (sw.a) span_end(sw, OOMB_QUEUE_COMPUTE, false);
        }
        if ((st = run_block(a, (int32_t) lo, (int32_t) hi))) return st;
        g_blocks++;
        if (a.back) {  // the block's gradient pages go back out once its kernel finished
            if ((st = order(ev_done, OOMB_QUEUE_COMPUTE, OOMB_QUEUE_COPY_OUT))) return st;
            const Span so = span_begin(OOMB_QUEUE_COPY_OUT);
            if ((st = block_copies(a, c0, b, set, true, true))) return st;
            span_end(so, OOMB_QUEUE_COPY_OUT, true);
        }
        // the set is free once its last reader (the block) and, in a backward, its copy out finished
        if (oomb_event_record(ev_free[e], a.back ? OOMB_QUEUE_COPY_OUT : OOMB_QUEUE_COMPUTE)) return evfail();
        ev_free_set[e] = true;
        if (b + 2 < nb && (st = copy_block_in(a, c0, b + 2))) return st;
    }
    return OOMB_STATUS_OK;
}

oomb_status oomb_kv_stream::compute(int64_t p0, int64_t T) {
    err.clear();
    const int64_t P = kv->p.page_size, R = kv->R, B = kv->B;
    const int64_t c0 = p0 / P, c1 = (p0 + T + P - 1) / P, cs = std::max(c0, R);
    if (T <= 0 || p0 < 0 || p0 + T > kv->n_tokens)
        oomb_error("kv_stream_compute: chunk [%" PRId64 ", %" PRId64 ") outside the %" PRId64 " reserved positions", p0, p0 + T, kv->n_tokens);
    if (c1 - cs > kv->n_cur)
        oomb_error("kv_stream_compute: the chunk spans %" PRId64 " pages past the resident ones, the cache has %" PRId64 " chunk slots",
                   c1 - cs, kv->n_cur);
    // one page table for every layer and block of this chunk
    std::vector<int32_t> & tab = kv->table;
    std::fill(tab.begin(), tab.end(), -1);
    for (int64_t lp = 0; lp < std::min(R, c1); lp++) tab[(size_t) lp] = (int32_t) lp;
    for (int64_t lp = cs; lp < c1; lp++) tab[(size_t) lp] = (int32_t) (kv->cur_slot0() + lp - cs);
    for (int64_t lp = R; lp < c0; lp++) {
        const int64_t b = (lp - R) / B;
        tab[(size_t) lp] = (int32_t) (kv->set_slot0((int) (b % 2)) + (lp - R) % B);
    }
    oomb_tensor_set(kv->page_table, tab.data(), 0, tab.size() * sizeof(int32_t));  // compute queue: after the last chunk's kernels
    if (c1 <= R) return run(g);  // all resident: one ordinary compute
    // the parts are computed under g's current allocation (g is re-placed before every run)
    auto follow = [&](oomb_cgraph * v) { v->version = g->version; v->alloc_id = g->alloc_id; v->alloc_gen = g->alloc_gen; };
    for (oomb_cgraph * v : parts) follow(v);
    for (AttnNode & a : attn) follow(a.self);

    oomb_status st = OOMB_STATUS_OK;
    log("c%" PRId64 " ", p0);
    // stage 2: the uploaded lists are known before the chunk (the copies of their pages start with
    // each node, as dense ones)
    for (size_t i = 0; i < attn.size() && !st; i++)
        if (attn[i].sparse && !attn[i].lists_in_graph) st = sparse_lists(attn[i], c0);
    for (AttnNode & a : attn) a.first_queued = false;
    // The chunk's own pages past R of a layer (the K/V that hold data: a store fills the rest; their
    // gradients in a backward graph) go in on the copy queue just before the layer's first attention
    // node's copies, and only that node waits for them: the compute queue runs the parts before it
    // meanwhile (they read no KV pool), instead of waiting for every layer's pages before the chunk.
    const int64_t kv_end = has_store ? std::min(c1, (p0 + P - 1) / P) : c1;
    std::vector<char> layer_in((size_t) kv->p.n_layer, 0);
    for (size_t i = 0; i < attn.size() && !st; i++) {
        AttnNode & a = attn[i];
        bool wait_in = false;
        if (!layer_in[(size_t) a.layer] && cs < c1) {
            const int l = a.layer;
            layer_in[(size_t) l] = 1;
            log("c%" PRId64 "/%" PRId64 " ", p0, l);
            const Span sp = span_begin(OOMB_QUEUE_COPY);
            st = kv_in(l, kv->cur_slot0(), cs, kv_end);
            if (!st && has_back) st = grad_in(l, kv->cur_slot0(), cs, c1);
            if (!st) span_end(sp, OOMB_QUEUE_COPY, true);
            if (!st && oomb_event_record(ev_in, OOMB_QUEUE_COPY))
                st = fail(OOMB_STATUS_DEVICE_ERROR, std::string("offload: event: ") + oomb_backend_last_error(be));
            wait_in = true;
        }
        if (!st && early && !(a.sparse && a.lists_in_graph)) st = first_copies(a, c0);  // the copy queue works beside part i
        log("p%" PRId64 " ", (int64_t) i);
        if (!st) st = run(parts[i]);
        if (!st && wait_in) {  // ev_in is recorded again only by a later node, after this wait was queued
            const Span sw = host_clock ? Span{} : span_begin(OOMB_QUEUE_COMPUTE);
            if (oomb_event_wait(be, OOMB_QUEUE_COMPUTE, ev_in))
                st = fail(OOMB_STATUS_DEVICE_ERROR, std::string("offload: event: ") + oomb_backend_last_error(be));
            if (sw.a) span_end(sw, OOMB_QUEUE_COMPUTE, false);
        }
        if (!st) st = attention(a, c0, c1);
    }
    log("p%" PRId64 " ", (int64_t) attn.size());
    if (!st) st = run(parts.back());
    // finish the chunk: its copies out and kernels (the next chunk reuses every slot)
    oomb_status s1 = oomb_backend_queue_synchronize(be, OOMB_QUEUE_COPY);
    if (!s1) s1 = oomb_backend_queue_synchronize(be, OOMB_QUEUE_COPY_OUT);
    oomb_backend_synchronize(be);
    if (!st && s1) st = fail(s1, std::string("offload: ") + oomb_backend_last_error(be));
    if (!st) collect_times();
    if (trace) {
        std::lock_guard<std::mutex> lock(g_trace_mutex);
        g_trace += trace_buf + "\n";
        trace_buf.clear();
    }
    return st;
}

enum oomb_status oomb_kv_stream_compute(oomb_kv_stream_t s, int64_t p0, int64_t T) {
    if (!s) oomb_error("kv_stream_compute: stream is NULL");
    return s->compute(p0, T);
}

const char * oomb_kv_stream_last_error(oomb_kv_stream_t s) { return s ? s->err.c_str() : ""; }

struct oomb_kv_stream_stats oomb_kv_stream_totals(void) {
    return {g_bytes_in.load(), g_bytes_out.load(), g_copies.load(), g_blocks.load(), g_copy_us.load() / 1e3, g_wait_us.load() / 1e3};
}

const char * oomb_kv_stream_debug_trace(void) {
    std::lock_guard<std::mutex> lock(g_trace_mutex);
    g_trace_read.swap(g_trace);
    g_trace.clear();
    return g_trace_read.c_str();
}
