// Host-offload tensors (oomb-offload.h): any graph's tensors kept in host memory (pinned for CUDA)
// and brought into a bounded device working set for the nodes that use them.
//
// Design. The host copy is the tensor's home: between computes t->data points to it, so the
// synchronous set/get and the CPU work on it directly. oomb_offload_graph_compute walks the graph
// in order; the runs of nodes that touch no offloaded tensor are computed as graph parts
// (oomb_graph_view); before a node that touches one (as its result, a source, or a view of it),
// each such tensor gets a slot of the working set and is copied in on the copy queue (the compute
// queue waits for it through an event), and its data pointer (and those of the graph's views of
// it) points to the slot for the node. A tensor the node writes (its result, or an in-place op on
// it) is dirty and copied back out on the second copy queue once it leaves the working set. After
// each node the engine prefetches: the tensors of the next nodes that fit in free slots start
// copying in at once. Eviction picks the resident tensor whose next use is farthest (the graph's
// order is known: Belady's rule); a slot's memory is reused only after its last reader and its
// copy out finished (events). The kernels are the same as with the tensors on the device, so the
// results are bit-identical.

#include "oomb-offload.h"
#include "oomb-impl.h"

#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr size_t kAlign = 256;

struct Region { size_t off, size; };

} // namespace

struct oomb_offload {
    struct Entry {
        oomb_tensor * t = nullptr;
        oomb_buffer_t host = nullptr;
        bool resident = false, dirty = false;
        size_t off = 0;                  // slot offset in the working set while resident
        oomb_event_t last_use = nullptr; // compute queue, after the last node that used it
    };
    oomb_backend_t be = nullptr;
    oomb_buffer_t dev = nullptr;         // the working set
    size_t capacity = 0;
    std::vector<Entry> entries;
    std::map<const oomb_tensor *, size_t> index;
    std::vector<Region> free_list;       // sorted by offset
    struct Fence { Region r; oomb_event_t ev; };
    std::vector<Fence> fences;           // freed regions whose last use / copy out may still run
    std::vector<oomb_event_t> pool;
    size_t pool_used = 0;
    oomb_offload_stats stats{};
    size_t used = 0;
    std::string err;
    oomb_context * ctx = nullptr;        // graph parts of the current compute

    oomb_event_t event() {
        if (pool_used == pool.size()) {
            oomb_event_t e = oomb_event_new(be);
            if (!e) oomb_error("offload: cannot create an event on %s", oomb_backend_name(be));
            pool.push_back(e);
        }
        return pool[pool_used++];
    }
    oomb_status fail(oomb_status st, const std::string & m) {
        err = m;
        return st;
    }
    oomb_status device_fail(const char * what) { return fail(OOMB_STATUS_DEVICE_ERROR, std::string("offload: ") + what + ": " + oomb_backend_last_error(be)); }

    // first fit in the free list; SIZE_MAX when nothing fits
    size_t take(size_t size) {
        size = (size + kAlign - 1) / kAlign * kAlign;
        for (size_t i = 0; i < free_list.size(); i++) {
            if (free_list[i].size < size) continue;
            const size_t off = free_list[i].off;
            free_list[i].off += size;
            free_list[i].size -= size;
            if (free_list[i].size == 0) free_list.erase(free_list.begin() + (long) i);
            used += size;
            stats.peak_bytes = std::max(stats.peak_bytes, used);
            return off;
        }
        return SIZE_MAX;
    }
    void give(size_t off, size_t size) {
        size = (size + kAlign - 1) / kAlign * kAlign;
        used -= size;
        auto it = std::lower_bound(free_list.begin(), free_list.end(), off, [](const Region & r, size_t o) { return r.off < o; });
        it = free_list.insert(it, {off, size});
        // coalesce with the neighbours
        size_t i = (size_t) (it - free_list.begin());
        if (i + 1 < free_list.size() && free_list[i].off + free_list[i].size == free_list[i + 1].off) {
            free_list[i].size += free_list[i + 1].size;
            free_list.erase(free_list.begin() + (long) i + 1);
        }
        if (i > 0 && free_list[i - 1].off + free_list[i - 1].size == free_list[i].off) {
            free_list[i - 1].size += free_list[i].size;
            free_list.erase(free_list.begin() + (long) i);
        }
    }
    void place(Entry & e, void * data, oomb_buffer_t buf, const std::vector<oomb_tensor *> & views) {
        e.t->data = data;
        e.t->buffer = buf;
        for (oomb_tensor * v : views) {
            v->data = (char *) data + v->view_offs;
            v->buffer = buf;
        }
    }
    oomb_status compute(oomb_cgraph * g);
};

oomb_offload_t oomb_offload_new(oomb_backend_t backend, size_t working_set_bytes) {
    if (!backend) oomb_error("offload_new: backend is NULL");
    if (working_set_bytes == 0) oomb_error("offload_new: the working set must not be empty");
    auto * o = new oomb_offload();
    o->be = backend;
    o->capacity = working_set_bytes / kAlign * kAlign;
    o->dev = oomb_backend_alloc_buffer(backend, o->capacity);
    if (!o->dev) {
        fprintf(stderr, "oomb: offload_new: cannot allocate a working set of %.1f MiB on %s\n", working_set_bytes / 1048576.0,
                oomb_backend_name(backend));
        delete o;
        return nullptr;
    }
    o->free_list.push_back({0, o->capacity});
    return o;
}

void oomb_offload_free(oomb_offload_t o) {
    if (!o) return;
    oomb_backend_synchronize(o->be);
    oomb_backend_queue_synchronize(o->be, OOMB_QUEUE_COPY);
    oomb_backend_queue_synchronize(o->be, OOMB_QUEUE_COPY_OUT);
    for (auto & e : o->entries) {
        e.t->data = nullptr;
        e.t->buffer = nullptr;
        oomb_buffer_free(e.host);
    }
    for (oomb_event_t e : o->pool) oomb_event_free(e);
    oomb_buffer_free(o->dev);
    oomb_free(o->ctx);
    delete o;
}

void oomb_offload_add(oomb_offload_t o, struct oomb_tensor * t) {
    if (!o || !t) oomb_error("offload_add: offload and tensor must not be NULL");
    if (o->index.count(t)) oomb_error("offload_add: %s was added already", oomb::shape_str(t).c_str());
    if (t->data || t->view_src) oomb_error("offload_add: %s already has memory or is a view (give a tensor without data)", oomb::shape_str(t).c_str());
    const size_t n = oomb_nbytes(t);
    if ((n + kAlign - 1) / kAlign * kAlign > o->capacity)
        oomb_error("offload_add: %s (%zu bytes) is larger than the working set (%zu bytes)", oomb::shape_str(t).c_str(), n, o->capacity);
    oomb_offload::Entry e;
    e.t = t;
    e.host = oomb_buffer_type_alloc(oomb_backend_host_buffer_type(o->be), n);
    if (!e.host) oomb_error("offload_add: cannot allocate %zu bytes of host memory for %s", n, oomb::shape_str(t).c_str());
    oomb_tensor_alloc(e.host, t, 0);
    o->index[t] = o->entries.size();
    o->entries.push_back(e);
}

struct oomb_offload_stats oomb_offload_get_stats(oomb_offload_t o) { return o ? o->stats : oomb_offload_stats{}; }
const char * oomb_offload_last_error(oomb_offload_t o) { return o ? o->err.c_str() : ""; }

oomb_status oomb_offload::compute(oomb_cgraph * g) {
    err.clear();
    const int n = (int) g->nodes.size();
    auto root = [](const oomb_tensor * t) { return t->view_src ? t->view_src : t; };
    // per node: the offloaded entries it touches and whether it writes them; per entry: the views
    // of it in the graph and the nodes that use it
    std::vector<std::vector<std::pair<size_t, bool>>> touch((size_t) n);
    std::vector<std::vector<oomb_tensor *>> views(entries.size());
    std::vector<std::vector<int>> uses(entries.size());
    for (int i = 0; i < n; i++) {
        oomb_tensor * node = g->nodes[(size_t) i];
        auto add = [&](oomb_tensor * t, bool write) {
            auto it = index.find(root(t));
            if (it == index.end()) return;
            if (t->view_src && std::find(views[it->second].begin(), views[it->second].end(), t) == views[it->second].end())
                views[it->second].push_back(t);
            for (auto & p : touch[(size_t) i])
                if (p.first == it->second) { p.second |= write; return; }
            touch[(size_t) i].push_back({it->second, write});
            uses[it->second].push_back(i);
        };
        add(node, !oomb::op_is_view(node->op));
        for (int k = 0; k < OOMB_MAX_SRC; k++)
            if (node->src[k]) add(node->src[k], false);
    }
    auto next_use = [&](size_t e, int after) {
        for (int u : uses[e])
            if (u > after) return u;
        return INT_MAX;
    };
    oomb_free(ctx);
    ctx = oomb_init({0, true});
    pool_used = 0;
    oomb_status st = OOMB_STATUS_OK;

    // frees e's slot: its copy out (when dirty) after its last use; the region's fence
    auto evict = [&](size_t ei) -> oomb_status {
        Entry & e = entries[ei];
        oomb_event_t fence = e.last_use;
        if (e.dirty) {
            if (e.last_use && oomb_event_wait(be, OOMB_QUEUE_COPY_OUT, e.last_use)) return device_fail("event");
            if (oomb_status s = oomb_tensor_get_async(be, OOMB_QUEUE_COPY_OUT, e.t, oomb_buffer_base(e.host), 0, oomb_nbytes(e.t)))
                return fail(s, std::string("offload: copy out: ") + oomb_backend_last_error(be));
            stats.bytes_out += oomb_nbytes(e.t);
            fence = event();
            if (oomb_event_record(fence, OOMB_QUEUE_COPY_OUT)) return device_fail("event");
        }
        if (fence) fences.push_back({{e.off, oomb_nbytes(e.t)}, fence});
        give(e.off, oomb_nbytes(e.t));
        place(e, oomb_buffer_base(e.host), e.host, views[ei]);
        e.resident = e.dirty = false;
        e.last_use = nullptr;
        return OOMB_STATUS_OK;
    };
    // a slot for e and its copy in, evicting (farthest next use first) entries not in `keep` if must_fit
    auto bring = [&](size_t ei, int at, const std::vector<size_t> & keep, bool must_fit) -> oomb_status {
        Entry & e = entries[ei];
        if (e.resident) return OOMB_STATUS_OK;
        size_t off = take(oomb_nbytes(e.t));
        while (off == SIZE_MAX && must_fit) {
            size_t victim = SIZE_MAX;
            int far = -1;
            for (size_t k = 0; k < entries.size(); k++) {
                if (!entries[k].resident || std::find(keep.begin(), keep.end(), k) != keep.end()) continue;
                const int nu = next_use(k, at);
                if (nu > far) { far = nu; victim = k; }
            }
            if (victim == SIZE_MAX)
                return fail(OOMB_STATUS_ALLOC_FAILED, "offload: node " + std::to_string(at) + " needs more than the working set of " +
                                                          std::to_string(capacity) + " bytes (its offloaded tensors do not fit together)");
            if (oomb_status s = evict(victim)) return s;
            off = take(oomb_nbytes(e.t));
        }
        if (off == SIZE_MAX) return OOMB_STATUS_OK;  // a prefetch that does not fit: later
        // the region's earlier users must be done before it is overwritten
        const Region r{off, oomb_nbytes(e.t)};
        for (size_t k = 0; k < fences.size();) {
            const Region & f = fences[k].r;
            if (f.off < r.off + r.size && r.off < f.off + f.size) {
                if (oomb_event_wait(be, OOMB_QUEUE_COPY, fences[k].ev)) return device_fail("event");
                if (f.off >= r.off && f.off + f.size <= r.off + r.size) { fences.erase(fences.begin() + (long) k); continue; }
            }
            k++;
        }
        e.off = off;
        e.resident = true;
        char * slot = (char *) oomb_buffer_base(dev) + off;
        // copy the host bytes into the slot: the tensor still points to the host here
        oomb_tensor tmp = *e.t;
        tmp.data = slot;
        tmp.buffer = dev;
        if (oomb_status s = oomb_tensor_set_async(be, OOMB_QUEUE_COPY, &tmp, oomb_buffer_base(e.host), 0, oomb_nbytes(e.t)))
            return fail(s, std::string("offload: copy in: ") + oomb_backend_last_error(be));
        stats.bytes_in += oomb_nbytes(e.t);
        place(e, slot, dev, views[ei]);
        return OOMB_STATUS_OK;
    };

    int seg = 0;
    for (int i = 0; i <= n && !st; i++) {
        if (i < n && touch[(size_t) i].empty()) continue;
        if (i > seg) {  // the run of nodes before i touches nothing offloaded
            oomb_cgraph * part = oomb_graph_view(ctx, g, seg, i);
            oomb_graph_set_continuation(part, false);  // slots change hands: no backend cache may outlive a part
            if ((st = oomb_backend_graph_compute(be, part))) { err = oomb_backend_last_error(be); break; }
        }
        seg = i + 1;
        if (i == n) break;
        std::vector<size_t> keep;
        for (auto & p : touch[(size_t) i]) keep.push_back(p.first);
        for (size_t ei : keep)
            if ((st = bring(ei, i, keep, true))) break;
        if (st) break;
        oomb_event_t in = event();
        if (oomb_event_record(in, OOMB_QUEUE_COPY) || oomb_event_wait(be, OOMB_QUEUE_COMPUTE, in)) { st = device_fail("event"); break; }
        oomb_cgraph * one = oomb_graph_view(ctx, g, i, i + 1);
        oomb_graph_set_continuation(one, false);
        if ((st = oomb_backend_graph_compute(be, one))) { err = oomb_backend_last_error(be); break; }
        oomb_event_t done = event();
        if (oomb_event_record(done, OOMB_QUEUE_COMPUTE)) { st = device_fail("event"); break; }
        for (auto & p : touch[(size_t) i]) {
            entries[p.first].last_use = done;
            entries[p.first].dirty |= p.second;
        }
        // leave the working set once nothing later uses it; prefetch the next nodes' tensors into free room
        for (size_t ei : keep)
            if (next_use(ei, i) == INT_MAX && (st = evict(ei))) break;
        for (int j = i + 1, looked = 0; j < n && looked < 8 && !st; j++) {
            if (touch[(size_t) j].empty()) continue;
            looked++;
            for (auto & p : touch[(size_t) j])
                if ((st = bring(p.first, i, {}, false))) break;
        }
    }
    // every tensor home again: dirty ones copied out, all pointers back on the host
    for (size_t ei = 0; ei < entries.size() && !st; ei++)
        if (entries[ei].resident) st = evict(ei);
    oomb_backend_synchronize(be);
    const oomb_status s1 = oomb_backend_queue_synchronize(be, OOMB_QUEUE_COPY);
    const oomb_status s2 = oomb_backend_queue_synchronize(be, OOMB_QUEUE_COPY_OUT);
    if (!st && (s1 || s2)) st = device_fail("queue");
    fences.clear();
    if (st) {  // a failure: put every tensor back on its host copy (its device bytes are lost)
        for (size_t ei = 0; ei < entries.size(); ei++) {
            Entry & e = entries[ei];
            if (!e.resident) continue;
            give(e.off, oomb_nbytes(e.t));
            place(e, oomb_buffer_base(e.host), e.host, views[ei]);
            e.resident = e.dirty = false;
        }
    }
    return st;
}

enum oomb_status oomb_offload_graph_compute(oomb_offload_t o, struct oomb_cgraph * g) {
    if (!o || !g) oomb_error("offload_graph_compute: offload and graph must not be NULL");
    return o->compute(g);
}
