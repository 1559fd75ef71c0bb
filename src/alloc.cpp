// Arena graph allocator (oomb-alloc.h).
//
// Algorithm (one pass over the graph in execution order, like ggml-alloc's gallocr):
//   - Memory owners are tensors without view_src; a view (view_src set, always the root owner) uses
//     its owner's memory at view_offs. The allocator places only owners that have no data yet, or
//     whose data it placed itself in an earlier plan (t->buffer == the arena: placed again, their
//     old values are not kept; use a context buffer for values that must outlive a plan); everything else
//     (parameters in a context buffer, context-owned host memory, another arena) is left alone.
//   - Consumers are counted per owner: every src slot of every node counts one reference to
//     mem_owner(src), and every view node counts one to its view_src (a view node reads/writes its
//     owner). So an owner stays alive while any node that reads it or any view of it (views are
//     always one level deep: view_src is the root) still has to run.
//   - Pinned owners are never freed: leafs, owners of INPUT / OUTPUT / PARAM / LOSS tensors (also
//     when the flag is on a view), and the owner of the last node. Leafs without data, INPUT
//     owners and owners of views that are not graph nodes are placed first.
//   - Walk the nodes: a node that needs memory is placed when it runs, either in place on src[0]
//     (op_can_inplace, src[0] an unpinned owner placed by this plan whose every remaining reference
//     is a src slot of this node holding src[0] itself, same type and nbytes, both contiguous: the
//     node takes src[0]'s block) or in a new block. Then each reference of the node is released;
//     an owner whose count drops to 0 returns its block to the free list, and a node nobody reads
//     is freed right after it runs.
//   - Blocks are 256-byte aligned; the free list is sorted by offset, best-fit, adjacent free
//     blocks merge, and an unbounded tail block sits at the end: the peak offset reached is the
//     planned size.
//   - The plan (owner -> offset, plus the views to point) is kept with the graph pointer, version,
//     node and leaf lists. alloc_graph on the same unchanged graph only re-applies the offsets; a
//     changed graph is planned again. The arena only grows; its oomb_buffer struct stays the same
//     (new memory is swapped in), so "t->buffer == arena" identifies tensors placed by this
//     allocator across plans.

#include "oomb-impl.h"
#include "oomb-alloc.h"
#include "oomb/paged-attn-sched.h"

#include <mutex>
#include <unordered_map>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr size_t k_align = 256;

size_t align_up(size_t n) { return (n + k_align - 1) / k_align * k_align; }

// Best-fit free list over an unbounded arena: sorted finite blocks plus a tail [tail, inf).
struct free_list {
    struct block { size_t off, size; };
    std::vector<block> blocks;
    size_t tail = 0;
    size_t peak = 0;

    size_t alloc(size_t size) {
        int best = -1;
        for (int i = 0; i < (int) blocks.size(); i++) {
            if (blocks[i].size >= size && (best < 0 || blocks[i].size < blocks[best].size)) best = i;
        }
        size_t off;
        if (best >= 0) {
            off = blocks[best].off;
            blocks[best].off += size;
            blocks[best].size -= size;
            if (blocks[best].size == 0) blocks.erase(blocks.begin() + best);
        } else {
            off = tail;
            tail += size;
        }
        peak = std::max(peak, off + size);
        return off;
    }

    void release(size_t off, size_t size) {
        if (size == 0) return;
        auto it = std::lower_bound(blocks.begin(), blocks.end(), off, [](const block & b, size_t o) { return b.off < o; });
        size_t idx = (size_t) (it - blocks.begin());
        // merge with the previous block
        if (idx > 0 && blocks[idx - 1].off + blocks[idx - 1].size == off) {
            idx--;
            blocks[idx].size += size;
        } else {
            blocks.insert(blocks.begin() + idx, block{off, size});
        }
        // merge with the next block
        if (idx + 1 < blocks.size() && blocks[idx].off + blocks[idx].size == blocks[idx + 1].off) {
            blocks[idx].size += blocks[idx + 1].size;
            blocks.erase(blocks.begin() + idx + 1);
        }
        // merge into the tail
        if (blocks[idx].off + blocks[idx].size == tail) {
            tail = blocks[idx].off;
            blocks.erase(blocks.begin() + idx);
        }
    }
};

struct owner_info {
    int    remaining = 0;  // references of nodes not yet run
    bool   ours      = false;
    bool   pinned    = false;
    bool   placed    = false;
    bool   moved     = false;  // its block was taken over by an in-place node
    size_t off = 0, size = 0;
};

} // namespace

// Live allocators and the generation of their current plan: a graph remembers the (allocator,
// generation) that placed it, so computing it after that allocator planned another graph (whose
// tensors now share the arena) or was freed is reported instead of corrupting memory.
static std::mutex g_live_mutex;
static std::unordered_map<uint64_t, uint64_t> g_live;  // allocator id -> current plan generation
static uint64_t g_next_id = 0, g_next_gen = 0;

bool oomb::graph_alloc_is_current(const oomb_cgraph * g) {
    if (g->alloc_id == 0) return true;
    std::lock_guard<std::mutex> lock(g_live_mutex);
    auto it = g_live.find(g->alloc_id);
    return it != g_live.end() && it->second == g->alloc_gen;
}

struct oomb_gallocr {
    uint64_t id = 0;
    uint64_t gen = 0;                   // generation of the current plan
    oomb_backend_t backend = nullptr;
    oomb_buffer *  buffer  = nullptr;   // the arena; the struct is kept across growth

    // the stored plan
    bool has_plan = false;
    const oomb_cgraph * plan_graph = nullptr;
    uint64_t plan_version = 0;
    std::vector<oomb_tensor *> plan_nodes, plan_leafs;
    std::vector<int32_t> plan_flags;                       // flags of nodes then leafs when planned
    std::vector<std::pair<oomb_tensor *, size_t>> placed;  // owner, offset
    std::vector<oomb_tensor *> views;                      // views of placed owners
    size_t planned_size = 0;
    size_t planned_sum  = 0;
    int    n_plans      = 0;
};

oomb_gallocr_t oomb_gallocr_new(oomb_backend_t backend) {
    auto * ga = new oomb_gallocr();
    ga->backend = backend;
    std::lock_guard<std::mutex> lock(g_live_mutex);
    ga->id = ++g_next_id;
    g_live[ga->id] = 0;
    return ga;
}

void oomb_gallocr_free(oomb_gallocr_t ga) {
    if (!ga) return;
    {
        std::lock_guard<std::mutex> lock(g_live_mutex);
        g_live.erase(ga->id);
    }
    oomb_buffer_free(ga->buffer);
    delete ga;
}

size_t oomb_gallocr_planned_size(oomb_gallocr_t ga) { return ga->planned_size; }
size_t oomb_gallocr_planned_sum(oomb_gallocr_t ga) { return ga->planned_sum; }
int    oomb_gallocr_n_plans(oomb_gallocr_t ga) { return ga->n_plans; }
size_t oomb_gallocr_buffer_size(oomb_gallocr_t ga) { return ga->buffer ? ga->buffer->size : 0; }

// The flags (INPUT, OUTPUT, ...) decide what is kept alive: setting one after planning must re-plan.
static std::vector<int32_t> graph_flags(const oomb_cgraph * g) {
    std::vector<int32_t> f;
    f.reserve(g->nodes.size() + g->leafs.size());
    for (const oomb_tensor * t : g->nodes) f.push_back(t->flags);
    for (const oomb_tensor * t : g->leafs) f.push_back(t->flags);
    return f;
}

static bool plan_is_current(const oomb_gallocr * ga, const oomb_cgraph * g) {
    return ga->has_plan && ga->plan_graph == g && ga->plan_version == g->version && ga->plan_nodes == g->nodes &&
           ga->plan_leafs == g->leafs && ga->plan_flags == graph_flags(g);
}

static void make_plan(oomb_gallocr * ga, oomb_cgraph * g) {
    std::unordered_map<oomb_tensor *, owner_info> info;
    info.reserve(2 * (g->nodes.size() + g->leafs.size()));

    auto is_ours = [&](const oomb_tensor * t) {
        return t->view_src == nullptr && (t->data == nullptr || (ga->buffer && t->buffer == ga->buffer));
    };
    auto get = [&](oomb_tensor * owner) -> owner_info & {
        auto it = info.find(owner);
        if (it != info.end()) return it->second;
        owner_info & oi = info[owner];
        oi.ours = is_ours(owner);
        // a paged-attention node that accumulates into an earlier result (oomb_paged_attn_args) is
        // placed on that result's memory by its caller; fresh arena memory holds nothing to add to
        if (oi.ours && (owner->op == OOMB_OP_PAGED_ATTN || owner->op == OOMB_OP_PAGED_ATTN_BACK) &&
            owner->op_params[oomb::PA_PARAM_ACCUM])
            oomb_error("gallocr_alloc_graph: node %s (op %s) has accumulate = 1: it adds to a result already in its memory, so "
                       "its caller must place it there (the allocator gives only fresh memory)",
                       owner->name[0] ? owner->name : "(unnamed)", oomb_op_name(owner->op));
        return oi;
    };

    // references of each node (with multiplicity), as owners
    auto for_each_ref = [](oomb_tensor * n, auto && fn) {
        for (int j = 0; j < OOMB_MAX_SRC; j++) {
            if (n->src[j]) fn(oomb::mem_owner(n->src[j]));
        }
        if (n->view_src) fn(n->view_src);
    };

    const int32_t pin_flags = OOMB_TENSOR_FLAG_INPUT | OOMB_TENSOR_FLAG_OUTPUT | OOMB_TENSOR_FLAG_PARAM | OOMB_TENSOR_FLAG_LOSS;
    for (oomb_tensor * l : g->leafs) get(oomb::mem_owner(l)).pinned = true;
    for (oomb_tensor * n : g->nodes) {
        owner_info & oi = get(oomb::mem_owner(n));
        if (n->flags & pin_flags) oi.pinned = true;
        for_each_ref(n, [&](oomb_tensor * o) { get(o).remaining++; });
    }
    if (!g->nodes.empty()) get(oomb::mem_owner(g->nodes.back())).pinned = true;

    free_list fl;
    ga->placed.clear();
    ga->views.clear();
    ga->planned_sum = 0;

    auto place = [&](oomb_tensor * t, owner_info & oi) {
        oi.size = align_up(std::max<size_t>(oomb_nbytes(t), 1));
        oi.off = fl.alloc(oi.size);
        oi.placed = true;
        ga->placed.emplace_back(t, oi.off);
        ga->planned_sum += oi.size;
    };

    // 1. leafs, INPUT owners and owners of views that are not graph nodes: placed first, never freed
    for (oomb_tensor * l : g->leafs) {
        oomb_tensor * o = oomb::mem_owner(l);
        owner_info & oi = get(o);
        if (oi.ours && !oi.placed) place(o, oi);
    }
    std::unordered_set<const oomb_tensor *> is_node;
    is_node.reserve(g->nodes.size() * 2);
    for (oomb_tensor * n : g->nodes) is_node.insert(n);
    for (oomb_tensor * n : g->nodes) {
        oomb_tensor * o = oomb::mem_owner(n);
        owner_info & oi = get(o);
        const bool input = (n->flags & OOMB_TENSOR_FLAG_INPUT) || (o->flags & OOMB_TENSOR_FLAG_INPUT);
        const bool orphan = n->view_src && !is_node.count(o);
        if ((input || orphan) && oi.ours && !oi.placed) {
            oi.pinned = true;
            place(o, oi);
        }
    }

    // 2. the nodes in execution order
    auto release = [&](oomb_tensor * o) {
        owner_info & oi = info[o];
        oi.remaining--;
        if (oi.remaining == 0 && oi.ours && oi.placed && !oi.pinned && !oi.moved) fl.release(oi.off, oi.size);
    };
    for (oomb_tensor * n : g->nodes) {
        if (!n->view_src) {
            owner_info & ni = info[n];
            if (ni.ours && !ni.placed) {
                bool inplace = false;
                oomb_tensor * s0 = n->src[0];
                if (oomb::op_can_inplace(n->op) && s0 && !s0->view_src) {
                    owner_info & si = info[s0];
                    if (si.ours && si.placed && !si.pinned && !si.moved && s0->type == n->type &&
                        oomb_nbytes(s0) == oomb_nbytes(n) && oomb_is_contiguous(s0) && oomb_is_contiguous(n)) {
                        // every remaining reference to s0's memory must be a src slot of n holding s0 itself
                        int refs = 0;
                        bool only_s0 = true;
                        for (int j = 0; j < OOMB_MAX_SRC; j++) {
                            if (n->src[j] && oomb::mem_owner(n->src[j]) == s0) {
                                refs++;
                                if (n->src[j] != s0) only_s0 = false;
                            }
                        }
                        if (only_s0 && refs == si.remaining) {
                            ni.off = si.off;
                            ni.size = si.size;
                            ni.placed = true;
                            si.moved = true;
                            ga->placed.emplace_back(n, ni.off);
                            ga->planned_sum += ni.size;
                            inplace = true;
                        }
                    }
                }
                if (!inplace) place(n, ni);
            }
        }
        for_each_ref(n, release);
        if (!n->view_src) {
            owner_info & ni = info[n];
            if (ni.remaining == 0 && ni.ours && ni.placed && !ni.pinned && !ni.moved) fl.release(ni.off, ni.size);
        }
    }

    // views to point at their owner's memory
    auto add_view = [&](oomb_tensor * t) {
        if (!t->view_src) return;
        auto it = info.find(t->view_src);
        // views of our tensors, and views made before their (external) owner got memory
        if ((it != info.end() && it->second.ours) || !t->data) ga->views.push_back(t);
    };
    for (oomb_tensor * l : g->leafs) add_view(l);
    for (oomb_tensor * n : g->nodes) add_view(n);

    ga->planned_size = fl.peak;
    {
        std::lock_guard<std::mutex> lock(g_live_mutex);
        ga->gen = ++g_next_gen;
        g_live[ga->id] = ga->gen;
    }
    ga->has_plan = true;
    ga->plan_graph = g;
    ga->plan_version = g->version;
    ga->plan_nodes = g->nodes;
    ga->plan_leafs = g->leafs;
    ga->plan_flags = graph_flags(g);
    ga->n_plans++;
}

// Grows the arena to at least the planned size. false when the backend cannot allocate it.
static bool ensure_buffer(oomb_gallocr * ga) {
    const size_t need = ga->planned_size;
    if (ga->buffer && ga->buffer->size >= need) return true;
    if (!ga->buffer && need == 0) return true;
    oomb_buffer_t nb = oomb_backend_alloc_buffer(ga->backend, need);
    if (!nb) return false;
    if (!ga->buffer) {
        ga->buffer = nb;
        nb->arena = true;
        return true;
    }
    // keep the struct (tensors placed earlier point at it), swap in the new memory
    if (ga->buffer->base) ga->backend->iface->free_mem(ga->backend, ga->buffer->base);
    ga->buffer->base = nb->base;
    ga->buffer->size = nb->size;
    nb->base = nullptr;
    oomb_buffer_free(nb);
    return true;
}

bool oomb_gallocr_reserve(oomb_gallocr_t ga, struct oomb_cgraph * g) {
    if (!plan_is_current(ga, g)) make_plan(ga, g);
    return ensure_buffer(ga);
}

bool oomb_gallocr_alloc_graph(oomb_gallocr_t ga, struct oomb_cgraph * g) {
    if (!oomb_gallocr_reserve(ga, g)) return false;
    for (auto & p : ga->placed) oomb_tensor_alloc(ga->buffer, p.first, p.second);
    for (oomb_tensor * v : ga->views) {
        if (!v->view_src->data) continue;  // an external owner without memory: graph_compute reports it
        v->data = (char *) v->view_src->data + v->view_offs;
        v->buffer = v->view_src->buffer;
    }
    g->alloc_id = ga->id;
    g->alloc_gen = ga->gen;
    return true;
}
