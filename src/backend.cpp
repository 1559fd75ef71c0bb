// Backend-independent part of the backend API: buffers, tensor placement and host <-> backend copies.

#include "oomb-impl.h"

#include <cinttypes>
#include <cstdio>
#include <string>

using oomb::shape_str;

void oomb_backend_free(oomb_backend_t backend) {
    if (backend) backend->iface->free_backend(backend);
}
const char * oomb_backend_name(oomb_backend_t backend) { return backend->iface->name(backend); }
bool oomb_backend_is_host(oomb_backend_t backend) { return backend->iface->is_host(backend); }
bool oomb_backend_memory(oomb_backend_t backend, size_t * used, size_t * total) {
    size_t u = 0, t = 0;
    const bool ok = backend && backend->iface->memory && backend->iface->memory(backend, &u, &t);
    if (used) *used = ok ? u : 0;
    if (total) *total = ok ? t : 0;
    return ok;
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

bool is_view_op(enum oomb_op op) {
    return op == OOMB_OP_NONE || op == OOMB_OP_VIEW || op == OOMB_OP_RESHAPE || op == OOMB_OP_PERMUTE || op == OOMB_OP_TRANSPOSE;
}

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
        if (is_view_op(node->op)) continue;
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
    if (backend->iface->synchronize) backend->iface->synchronize(backend);
}

oomb_buffer_t oomb_backend_alloc_buffer(oomb_backend_t backend, size_t size) {
    void * base = nullptr;
    if (size > 0) {
        base = backend->iface->alloc(backend, size);
        if (!base) return nullptr;
    }
    auto * buf = new oomb_buffer();
    buf->backend = backend;
    buf->base = base;
    buf->size = size;
    return buf;
}
void oomb_buffer_free(oomb_buffer_t buffer) {
    if (!buffer) return;
    if (buffer->base) buffer->backend->iface->free_mem(buffer->backend, buffer->base);
    delete buffer;
}
void * oomb_buffer_base(oomb_buffer_t buffer) { return buffer->base; }
size_t oomb_buffer_size(oomb_buffer_t buffer) { return buffer->size; }
oomb_backend_t oomb_buffer_backend(oomb_buffer_t buffer) { return buffer->backend; }

void oomb_tensor_alloc(oomb_buffer_t buffer, struct oomb_tensor * t, size_t offset) {
    const size_t n = oomb_nbytes(t);
    if (offset + n > buffer->size || offset > buffer->size) {
        oomb_error("tensor_alloc: %s needs %zu bytes at offset %zu, buffer has %zu", shape_str(t).c_str(), n, offset, buffer->size);
    }
    t->data = (char *) buffer->base + offset;
    t->buffer = buffer;
}

oomb_buffer_t oomb_backend_alloc_ctx_tensors(struct oomb_context * ctx, oomb_backend_t backend) {
    const size_t align = 256;
    size_t total = 0;
    for (auto & t : ctx->tensors) {
        if (t.data || t.view_src) continue;
        total += (oomb_nbytes(&t) + align - 1) / align * align;
    }
    if (total == 0) return nullptr;
    oomb_buffer_t buf = oomb_backend_alloc_buffer(backend, total);
    if (!buf) oomb_error("alloc_ctx_tensors: %s could not allocate %zu bytes", oomb_backend_name(backend), total);
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

static oomb_backend_t tensor_backend(const oomb_tensor * t) {
    const oomb_tensor * o = t->view_src ? t->view_src : t;
    return o->buffer ? o->buffer->backend : nullptr;
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
    check_range(t, offset, size, "tensor_set");
    if (size == 0) return;
    oomb_backend_t b = tensor_backend(t);
    if (!b) memcpy((char *) t->data + offset, data, size);
    else b->iface->set(b, (char *) t->data + offset, data, size);
}
void oomb_tensor_get(const struct oomb_tensor * t, void * data, size_t offset, size_t size) {
    check_range(t, offset, size, "tensor_get");
    if (size == 0) return;
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

#ifndef OOMB_USE_CUDA
oomb_backend_t oomb_backend_cuda_init(int device) {
    fprintf(stderr, "oomb: this build has no CUDA backend (built without nvcc); device %d unavailable\n", device);
    return nullptr;
}
bool oomb_cuda_available(void) { return false; }
#endif
