// Backend-independent part of the backend API: buffers, tensor placement and host <-> backend copies.

#include "oomb-impl.h"

#include <cinttypes>
#include <cstdio>

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
void oomb_backend_graph_compute(oomb_backend_t backend, struct oomb_cgraph * g) {
    if (!backend || !g) oomb_error("graph_compute: backend or graph is NULL");
    if (!oomb::graph_alloc_is_current(g)) {
        oomb_error("graph_compute: the graph's tensors were placed by a graph allocator that has since planned another "
                   "graph or been freed; call oomb_gallocr_alloc_graph on this graph again before computing it");
    }
    backend->iface->graph_compute(backend, g);
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
