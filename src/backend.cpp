// Backend-independent part of the backend API: buffers, tensor placement and host <-> backend copies.

#include "oomb-impl.h"

#include <cinttypes>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

using oomb::shape_str;

// The C API's handles must not be NULL: a clear error naming the function, never a crash.
#define OOMB_API_NONNULL(p, fn) \
    do { \
        if (!(p)) oomb_error("%s: %s is NULL", fn, #p); \
    } while (0)

void oomb_backend_free(oomb_backend_t backend) {
    if (backend) backend->iface->free_backend(backend);
}
const char * oomb_backend_name(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "backend_name");
    return backend->iface->name(backend);
}
bool oomb_backend_is_host(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "backend_is_host");
    return backend->iface->is_host(backend);
}
bool oomb_backend_memory(oomb_backend_t backend, size_t * used, size_t * total) {
    size_t u = 0, t = 0;
    const bool ok = backend && backend->iface->memory && backend->iface->memory(backend, &u, &t);
    if (used) *used = ok ? u : 0;
    if (total) *total = ok ? t : 0;
    return ok;
}
bool oomb_backend_profile_reset(oomb_backend_t backend) {
    return backend && backend->iface->profile_reset && backend->iface->profile_reset(backend);
}
bool oomb_backend_set_linear_cross_entropy_block(oomb_backend_t backend, size_t bytes) {
    return backend && backend->iface->set_lce_block && backend->iface->set_lce_block(backend, bytes);
}
size_t oomb_backend_graph_scratch(oomb_backend_t backend, const struct oomb_cgraph * graph) {
    if (!backend || !graph || !backend->iface->graph_scratch) return 0;
    return backend->iface->graph_scratch(backend, graph);
}
const char * oomb_status_name(enum oomb_status status) {
    switch (status) {
        case OOMB_STATUS_OK: return "ok";
        case OOMB_STATUS_FAILED: return "failed";
        case OOMB_STATUS_ABORTED: return "aborted";
        case OOMB_STATUS_ALLOC_FAILED: return "alloc failed";
        case OOMB_STATUS_DEVICE_ERROR: return "device error";
    }
    return "unknown status";
}

namespace {

thread_local std::string t_last_fault;
thread_local uint64_t t_n_faults = 0;

// A tensor the node computes or reads has data the backend can use (programming errors: handler).
void check_data(oomb_backend_t b, const oomb_tensor * node, const oomb_tensor * t, int src_index) {
    if (oomb_nelements(t) == 0) return;
    char what[64];
    if (src_index < 0) snprintf(what, sizeof(what), "node");
    else snprintf(what, sizeof(what), "src[%d]", src_index);
    if (!t->data) {
        if (src_index < 0) {
            oomb_error("graph_compute: node %s (op %s) has no data (allocate the graph first)", shape_str(t).c_str(), oomb_op_name(t->op));
        }
        oomb_error("graph_compute: %s %s of node %s (op %s) has no data (allocate the graph first)", what, shape_str(t).c_str(),
                   shape_str(node).c_str(), oomb_op_name(node->op));
    }
    if (const char * why = b->iface->placement_error ? b->iface->placement_error(b, t) : nullptr) {
        oomb_error("graph_compute: %s %s of node %s (op %s) is %s", what, shape_str(t).c_str(), shape_str(node).c_str(),
                   oomb_op_name(node->op), why);
    }
}

// Every node that computes something: its result and the sources it reads have usable data.
void validate_graph(oomb_backend_t b, const oomb_cgraph * g) {
    for (const oomb_tensor * node : g->nodes) {
        if (oomb::op_is_view(node->op)) continue;
        check_data(b, node, node, -1);
        for (int i = 0; i < OOMB_MAX_SRC; i++) {
            const oomb_tensor * s = node->src[i];
            if (!s) continue;
            // repeat / repeat_back only take a shape from src[1]
            if (i == 1 && (node->op == OOMB_OP_REPEAT || node->op == OOMB_OP_REPEAT_BACK)) continue;
            check_data(b, node, s, i);
        }
    }
}

// "node 3 (mul_mat: 'y' [4, 2, 1, 1] f32 <- 'w' [...], 'x' [...])"
std::string node_str(const oomb_cgraph * g, int i) {
    if (i < 0 || (size_t) i >= g->nodes.size()) return "before the first node";
    const oomb_tensor * n = g->nodes[(size_t) i];
    std::string r = "node " + std::to_string(i) + " (" + oomb_op_name(n->op) + ": " + shape_str(n);
    const char * sep = " <- ";
    for (int k = 0; k < OOMB_MAX_SRC; k++) {
        if (!n->src[k]) continue;
        r += sep + shape_str(n->src[k]);
        sep = ", ";
    }
    return r + ")";
}

} // namespace

namespace oomb {

void backend_begin_node(oomb_backend_t b, int i) {
    b->cur_node = i;
    if (b->abort_cb && b->abort_cb(b->abort_data)) fail(OOMB_STATUS_ABORTED, "the abort callback asked to stop");
}

} // namespace oomb

enum oomb_status oomb_backend_graph_compute(oomb_backend_t backend, struct oomb_cgraph * g) {
    if (!backend || !g) oomb_error("graph_compute: backend or graph is NULL");
    if (!oomb::graph_alloc_is_current(g)) {
        oomb_error("graph_compute: the graph's tensors were placed by a graph allocator that has since planned another "
                   "graph or been freed; call oomb_gallocr_alloc_graph on this graph again before computing it");
    }
    validate_graph(backend, g);
    backend->last_error.clear();
    backend->cur_node = -1;
    try {
        oomb::fault_scope scope;
        backend->iface->graph_compute(backend, g);
    } catch (const oomb::compute_fault & f) {
        backend->last_error = "graph_compute: " + node_str(g, backend->cur_node) + ": " + f.msg;
        t_last_fault = backend->last_error;
        t_n_faults++;
        return f.status;
    }
    return OOMB_STATUS_OK;
}
const char * oomb_backend_last_error(oomb_backend_t backend) { return backend ? backend->last_error.c_str() : ""; }
const char * oomb_last_compute_error(uint64_t * n_failures) {
    if (n_failures) *n_failures = t_n_faults;
    return t_last_fault.c_str();
}
void oomb_backend_set_abort_callback(oomb_backend_t backend, oomb_abort_callback_t cb, void * data) {
    backend->abort_cb = cb;
    backend->abort_data = data;
}
void oomb_backend_synchronize(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "backend_synchronize");
    if (backend->iface->synchronize) backend->iface->synchronize(backend);
}

// ---------------------------------------------------------------------------------------------
// Buffer types
// ---------------------------------------------------------------------------------------------

namespace {

std::atomic<size_t> g_pinned_bytes{0};

void * host_alloc(size_t size, size_t align) {
    if (size > SIZE_MAX - align) return nullptr;  // the rounding below would wrap to a tiny block
    const size_t sz = (std::max<size_t>(size, 1) + align - 1) / align * align;
    return aligned_alloc(align, sz);
}
bool is_pinned(const oomb_buffer_type * buft) { return buft->is_host && !buft->device; }

} // namespace

void oomb::backend_init_buffer_types(oomb_backend_t b, const char * device_name, const char * host_name, bool backend_is_host) {
    b->buft_device.backend = b;
    b->buft_device.name = device_name;
    b->buft_device.is_host = backend_is_host;
    b->buft_device.device = true;
    b->buft_host.backend = b;
    b->buft_host.name = host_name;
    b->buft_host.is_host = true;
    b->buft_host.device = backend_is_host;   // a host backend's "host" memory is its own memory
}

// A backend made without oomb::backend_init_buffer_types (e.g. a test's own vtable) gets default ones.
static void ensure_buffer_types(oomb_backend_t b) {
    if (!b->buft_device.backend) {
        oomb::backend_init_buffer_types(b, b->iface->name(b), "Host", b->iface->is_host(b));
    }
}
oomb_buffer_type_t oomb_backend_buffer_type(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "backend_buffer_type");
    ensure_buffer_types(backend);
    return &backend->buft_device;
}
oomb_buffer_type_t oomb_backend_host_buffer_type(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "backend_host_buffer_type");
    ensure_buffer_types(backend);
    return &backend->buft_host;
}
const char * oomb_buffer_type_name(oomb_buffer_type_t buft) {
    OOMB_API_NONNULL(buft, "buffer_type_name");
    return buft->name;
}
size_t oomb_buffer_type_alignment(oomb_buffer_type_t buft) {
    OOMB_API_NONNULL(buft, "buffer_type_alignment");
    return buft->alignment;
}
bool oomb_buffer_type_is_host(oomb_buffer_type_t buft) {
    OOMB_API_NONNULL(buft, "buffer_type_is_host");
    return buft->is_host;
}
size_t oomb_pinned_host_bytes(void) { return g_pinned_bytes.load(); }

oomb_buffer_t oomb_buffer_type_alloc(oomb_buffer_type_t buft, size_t size) {
    OOMB_API_NONNULL(buft, "buffer_type_alloc");
    oomb_backend_t backend = buft->backend;
    void * base = nullptr;
    if (size > 0) {
        if (buft == &backend->buft_device) base = backend->iface->alloc(backend, size);
        else if (backend->iface->alloc_host) base = backend->iface->alloc_host(backend, size);
        else base = host_alloc(size, buft->alignment);
        if (!base) return nullptr;
    }
    auto * buf = new oomb_buffer();
    buf->backend = backend;
    buf->base = base;
    buf->size = size;
    buf->buft = buft;
    if (is_pinned(buft)) g_pinned_bytes += size;
    return buf;
}
oomb_buffer_t oomb_backend_alloc_buffer(oomb_backend_t backend, size_t size) {
    OOMB_API_NONNULL(backend, "backend_alloc_buffer");
    return oomb_buffer_type_alloc(oomb_backend_buffer_type(backend), size);
}
void oomb_buffer_free(oomb_buffer_t buffer) {
    if (!buffer) return;
    oomb_backend_t b = buffer->backend;
    if (buffer->base) {
        if (buffer->buft == &b->buft_device) b->iface->free_mem(b, buffer->base);
        else if (b->iface->free_host) b->iface->free_host(b, buffer->base);
        else free(buffer->base);
    }
    if (is_pinned(buffer->buft)) g_pinned_bytes -= buffer->size;
    delete buffer;
}
void * oomb_buffer_base(oomb_buffer_t buffer) {
    OOMB_API_NONNULL(buffer, "buffer_base");
    return buffer->base;
}
size_t oomb_buffer_size(oomb_buffer_t buffer) {
    OOMB_API_NONNULL(buffer, "buffer_size");
    return buffer->size;
}
oomb_backend_t oomb_buffer_backend(oomb_buffer_t buffer) {
    OOMB_API_NONNULL(buffer, "buffer_backend");
    return buffer->backend;
}
oomb_buffer_type_t oomb_buffer_get_type(oomb_buffer_t buffer) {
    OOMB_API_NONNULL(buffer, "buffer_get_type");
    return buffer->buft;
}
bool oomb_buffer_is_host(oomb_buffer_t buffer) {
    OOMB_API_NONNULL(buffer, "buffer_is_host");
    return buffer->buft->is_host;
}

void oomb_tensor_alloc(oomb_buffer_t buffer, struct oomb_tensor * t, size_t offset) {
    OOMB_API_NONNULL(buffer, "tensor_alloc");
    OOMB_API_NONNULL(t, "tensor_alloc");
    const size_t n = oomb_nbytes(t);
    if (offset + n > buffer->size || offset > buffer->size) {
        oomb_error("tensor_alloc: %s needs %zu bytes at offset %zu, buffer has %zu", shape_str(t).c_str(), n, offset, buffer->size);
    }
    t->data = (char *) buffer->base + offset;
    t->buffer = buffer;
}

oomb_buffer_t oomb_backend_alloc_ctx_tensors(struct oomb_context * ctx, oomb_backend_t backend) {
    size_t total = 0;
    oomb_buffer_t buf = oomb_backend_try_alloc_ctx_tensors(ctx, backend, &total);
    if (!buf && total > 0) oomb_error("alloc_ctx_tensors: %s could not allocate %zu bytes", oomb_backend_name(backend), total);
    return buf;
}

oomb_buffer_t oomb_backend_try_alloc_ctx_tensors(struct oomb_context * ctx, oomb_backend_t backend, size_t * failed_bytes) {
    const size_t align = 256;
    size_t total = 0;
    for (auto & t : ctx->tensors) {
        if (t.data || t.view_src) continue;
        total += (oomb_nbytes(&t) + align - 1) / align * align;
    }
    if (failed_bytes) *failed_bytes = total;
    if (total == 0) return nullptr;
    oomb_buffer_t buf = oomb_backend_alloc_buffer(backend, total);
    if (!buf) return nullptr;
    if (failed_bytes) *failed_bytes = 0;
    backend->iface->memset_mem(backend, buf->base, 0, total);
    size_t off = 0;
    for (auto & t : ctx->tensors) {
        if (t.data || t.view_src) continue;
        oomb_tensor_alloc(buf, &t, off);
        off += (oomb_nbytes(&t) + align - 1) / align * align;
    }
    for (auto & t : ctx->tensors) {
        if (!t.data && t.view_src && t.view_src->data) {
            t.data = (char *) t.view_src->data + t.view_offs;
            t.buffer = t.view_src->buffer;
        }
    }
    return buf;
}

// The backend that copies t's bytes; NULL for host memory (memcpy).
static oomb_backend_t tensor_backend(const oomb_tensor * t) {
    const oomb_tensor * o = t->view_src ? t->view_src : t;
    return o->buffer && !o->buffer->buft->is_host ? o->buffer->backend : nullptr;
}

static void check_range(const oomb_tensor * t, size_t offset, size_t size, const char * fn) {
    if (!t->data) oomb_error("%s: %s has no data", fn, shape_str(t).c_str());
    const oomb_tensor * o = t->view_src ? t->view_src : t;
    if (o->buffer) {
        // a tensor placed in an arena that has since been reallocated points outside its buffer
        const char * base = (const char *) o->buffer->base, * d = (const char *) t->data;
        if (!base || d < base || (size_t) (d - base) + oomb_nbytes(t) > o->buffer->size) {
            oomb_error("%s: %s points outside its buffer (its graph allocator moved on: call oomb_gallocr_alloc_graph "
                       "for its graph again)", fn, shape_str(t).c_str());
        }
    }
    const size_t n = oomb_nbytes(t);
    if (offset > n || size > n - offset) {
        oomb_error("%s: range [%zu, %zu) out of %s (%zu bytes)", fn, offset, offset + size, shape_str(t).c_str(), n);
    }
    if (size > 0 && !oomb_is_contiguous(t)) {
        oomb_error("%s: %s is not contiguous", fn, shape_str(t).c_str());
    }
}

void oomb_tensor_set(struct oomb_tensor * t, const void * data, size_t offset, size_t size) {
    OOMB_API_NONNULL(t, "tensor_set");
    check_range(t, offset, size, "tensor_set");
    if (size == 0) return;
    if (!data) oomb_error("tensor_set: data is NULL for %s", shape_str(t).c_str());
    oomb_backend_t b = tensor_backend(t);
    if (!b) memcpy((char *) t->data + offset, data, size);
    else b->iface->set(b, (char *) t->data + offset, data, size);
}
void oomb_tensor_get(const struct oomb_tensor * t, void * data, size_t offset, size_t size) {
    OOMB_API_NONNULL(t, "tensor_get");
    check_range(t, offset, size, "tensor_get");
    if (size == 0) return;
    if (!data) oomb_error("tensor_get: data is NULL for %s", shape_str(t).c_str());
    oomb_backend_t b = tensor_backend(t);
    if (!b) memcpy(data, (const char *) t->data + offset, size);
    else b->iface->get(b, data, (const char *) t->data + offset, size);
}
void oomb_tensor_memset(struct oomb_tensor * t, uint8_t value) {
    const size_t n = oomb_nbytes(t);
    check_range(t, 0, n, "tensor_memset");
    if (n == 0) return;
    oomb_backend_t b = tensor_backend(t);
    if (!b) memset(t->data, value, n);
    else b->iface->memset_mem(b, t->data, value, n);
}
void oomb_tensor_set_f32(struct oomb_tensor * t, const float * data, int64_t n) {
    if (t->type != OOMB_TYPE_F32 || n != oomb_nelements(t)) {
        oomb_error("tensor_set_f32: %s is not an f32 tensor of %" PRId64 " elements", shape_str(t).c_str(), n);
    }
    oomb_tensor_set(t, data, 0, (size_t) n * sizeof(float));
}
void oomb_tensor_get_f32(const struct oomb_tensor * t, float * data, int64_t n) {
    if (t->type != OOMB_TYPE_F32 || n != oomb_nelements(t)) {
        oomb_error("tensor_get_f32: %s is not an f32 tensor of %" PRId64 " elements", shape_str(t).c_str(), n);
    }
    oomb_tensor_get(t, data, 0, (size_t) n * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies and events
// ---------------------------------------------------------------------------------------------

namespace {

// Runs f (which queues work on backend b) with compute-time faults captured: a fault becomes the
// status, with "<what>: <message>" as the backend's (and the thread's) last error.
template <typename F> oomb_status captured(oomb_backend_t b, const char * what, F && f) {
    b->last_error.clear();
    try {
        oomb::fault_scope scope;
        f();
    } catch (const oomb::compute_fault & e) {
        b->last_error = std::string(what) + ": " + e.msg;
        t_last_fault = b->last_error;
        t_n_faults++;
        return e.status;
    }
    return OOMB_STATUS_OK;
}

void check_queue(enum oomb_queue q, const char * fn) {
    if (q != OOMB_QUEUE_COMPUTE && q != OOMB_QUEUE_COPY && q != OOMB_QUEUE_COPY_OUT) oomb_error("%s: unknown queue %d", fn, (int) q);
}

// t's memory is host memory or a buffer of b (either type).
void check_buffer(oomb_backend_t b, const oomb_tensor * t, const char * fn) {
    const oomb_tensor * o = t->view_src ? t->view_src : t;
    if (oomb::tensor_is_host(t) || o->buffer->backend == b) return;
    oomb_error("%s: %s is in a buffer of another backend (%s %s), not of this %s backend", fn, shape_str(t).c_str(),
               oomb_backend_name(o->buffer->backend), o->buffer->buft->name, oomb_backend_name(b));
}

void copy_bytes(oomb_backend_t b, enum oomb_queue q, void * dst, const void * src, size_t size) {
    if (b->iface->copy_async) b->iface->copy_async(b, q, dst, src, size);
    else memcpy(dst, src, size);
}

} // namespace

namespace {

// The host <-> tensor copies of set_async / get_async: checks, then bytes [offset, offset + size)
// of t copied from (to_tensor) or to `host` on queue q.
oomb_status host_copy_async(oomb_backend_t backend, enum oomb_queue q, const oomb_tensor * t, void * host, size_t offset, size_t size,
                            bool to_tensor, const char * fn) {
    OOMB_API_NONNULL(backend, fn);
    OOMB_API_NONNULL(t, fn);
    check_queue(q, fn);
    check_range(t, offset, size, fn);
    check_buffer(backend, t, fn);
    if (size == 0) return OOMB_STATUS_OK;
    if (!host) oomb_error("%s: data is NULL for %s", fn, shape_str(t).c_str());
    char * dev = (char *) t->data + offset;
    return captured(backend, fn, [&] { to_tensor ? copy_bytes(backend, q, dev, host, size) : copy_bytes(backend, q, host, dev, size); });
}

} // namespace

enum oomb_status oomb_tensor_set_async(oomb_backend_t backend, enum oomb_queue q, struct oomb_tensor * t, const void * data,
                                       size_t offset, size_t size) {
    return host_copy_async(backend, q, t, const_cast<void *>(data), offset, size, true, "tensor_set_async");
}
enum oomb_status oomb_tensor_get_async(oomb_backend_t backend, enum oomb_queue q, const struct oomb_tensor * t, void * data,
                                       size_t offset, size_t size) {
    return host_copy_async(backend, q, t, data, offset, size, false, "tensor_get_async");
}
enum oomb_status oomb_tensor_copy_async(oomb_backend_t backend, enum oomb_queue q, const struct oomb_tensor * src,
                                        struct oomb_tensor * dst) {
    OOMB_API_NONNULL(backend, "tensor_copy_async");
    OOMB_API_NONNULL(src, "tensor_copy_async");
    OOMB_API_NONNULL(dst, "tensor_copy_async");
    check_queue(q, "tensor_copy_async");
    const size_t n = oomb_nbytes(src);
    if (oomb_nbytes(dst) != n) {
        oomb_error("tensor_copy_async: %s has %zu bytes, %s has %zu", shape_str(src).c_str(), n, shape_str(dst).c_str(), oomb_nbytes(dst));
    }
    check_range(src, 0, n, "tensor_copy_async");
    check_range(dst, 0, n, "tensor_copy_async");
    check_buffer(backend, src, "tensor_copy_async");
    check_buffer(backend, dst, "tensor_copy_async");
    if (n == 0 || src->data == dst->data) return OOMB_STATUS_OK;
    if ((const char *) src->data < (const char *) dst->data + n && (const char *) dst->data < (const char *) src->data + n) {
        oomb_error("tensor_copy_async: %s and %s overlap (a copy needs disjoint bytes)", shape_str(src).c_str(), shape_str(dst).c_str());
    }
    return captured(backend, "tensor_copy_async", [&] { copy_bytes(backend, q, dst->data, src->data, n); });
}
enum oomb_status oomb_backend_queue_synchronize(oomb_backend_t backend, enum oomb_queue q) {
    OOMB_API_NONNULL(backend, "backend_queue_synchronize");
    check_queue(q, "backend_queue_synchronize");
    if (!backend->iface->queue_synchronize) return OOMB_STATUS_OK;
    return captured(backend, "backend_queue_synchronize", [&] { backend->iface->queue_synchronize(backend, q); });
}

oomb_event_t oomb_event_new(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "event_new");
    void * ev = nullptr;
    if (backend->iface->event_new) {
        if (captured(backend, "event_new", [&] { ev = backend->iface->event_new(backend); }) != OOMB_STATUS_OK) return nullptr;
    }
    return new oomb_event{backend, ev};
}
oomb_event_t oomb_event_new_timed(oomb_backend_t backend) {
    OOMB_API_NONNULL(backend, "event_new_timed");
    void * ev = nullptr;
    if (backend->iface->event_new_timed) {
        if (captured(backend, "event_new_timed", [&] { ev = backend->iface->event_new_timed(backend); }) != OOMB_STATUS_OK) return nullptr;
    }
    return new oomb_event{backend, ev, true};
}
enum oomb_status oomb_event_elapsed_ms(oomb_event_t start, oomb_event_t end, float * ms) {
    OOMB_API_NONNULL(start, "event_elapsed_ms");
    OOMB_API_NONNULL(end, "event_elapsed_ms");
    OOMB_API_NONNULL(ms, "event_elapsed_ms");
    if (!start->timed || !end->timed) oomb_error("event_elapsed_ms: both events must come from oomb_event_new_timed");
    if (start->backend != end->backend) oomb_error("event_elapsed_ms: the events belong to different backends");
    *ms = 0.0f;
    if (!start->ev || !end->ev) return OOMB_STATUS_OK;  // synchronous backend: no queue time
    return captured(start->backend, "event_elapsed_ms", [&] { *ms = start->backend->iface->event_elapsed_ms(start->backend, start->ev, end->ev); });
}
void oomb_event_free(oomb_event_t event) {
    if (!event) return;
    if (event->ev) event->backend->iface->event_free(event->backend, event->ev);
    delete event;
}
enum oomb_status oomb_event_record(oomb_event_t event, enum oomb_queue q) {
    OOMB_API_NONNULL(event, "event_record");
    check_queue(q, "event_record");
    if (!event->ev) return OOMB_STATUS_OK;
    return captured(event->backend, "event_record", [&] { event->backend->iface->event_record(event->backend, event->ev, q); });
}
enum oomb_status oomb_event_wait(oomb_backend_t backend, enum oomb_queue q, oomb_event_t event) {
    OOMB_API_NONNULL(backend, "event_wait");
    OOMB_API_NONNULL(event, "event_wait");
    check_queue(q, "event_wait");
    if (!event->ev) return OOMB_STATUS_OK;   // complete at once
    if (backend->iface != event->backend->iface) {
        // the queue cannot wait on the device: wait on the host
        return oomb_event_synchronize(event);
    }
    return captured(backend, "event_wait", [&] { backend->iface->event_wait(backend, event->ev, q); });
}
enum oomb_status oomb_event_synchronize(oomb_event_t event) {
    OOMB_API_NONNULL(event, "event_synchronize");
    if (!event->ev) return OOMB_STATUS_OK;
    return captured(event->backend, "event_synchronize", [&] { event->backend->iface->event_synchronize(event->backend, event->ev); });
}
bool oomb_event_query(oomb_event_t event) {
    OOMB_API_NONNULL(event, "event_query");
    return !event->ev || event->backend->iface->event_query(event->backend, event->ev);
}

#ifndef OOMB_USE_CUDA
oomb_backend_t oomb_backend_cuda_init(int device) {
    fprintf(stderr, "oomb: this build has no CUDA backend (built without nvcc); device %d unavailable\n", device);
    return nullptr;
}
bool oomb_cuda_available(void) { return false; }
#endif
