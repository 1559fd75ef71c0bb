// ggml-oomb backends: where tensor data lives (buffers) and who computes graphs.
//
// A backend owns a kind of memory (host for the CPU backend, device memory for CUDA) and computes
// graphs whose tensors live in that memory. Tensors get memory from a buffer: either one buffer per
// context (oomb_backend_alloc_ctx_tensors, for parameters, gradients and optimizer state) or the
// arena planned by the graph allocator (oomb-alloc.h) for the intermediate tensors of a graph.
// Tensors of a context created without no_alloc hold context-owned host memory, which the CPU
// backend computes on directly.
#pragma once

#include "oomb.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oomb_backend * oomb_backend_t;
typedef struct oomb_buffer  * oomb_buffer_t;

/// CPU backend. n_threads <= 0 uses every hardware thread. Matrix products go through OpenBLAS.
oomb_backend_t oomb_backend_cpu_init(int n_threads);
void oomb_backend_cpu_set_n_threads(oomb_backend_t backend, int n_threads);
/// CUDA backend on `device`; NULL (with a message on stderr) when the library was built without
/// CUDA or no usable GPU is present.
oomb_backend_t oomb_backend_cuda_init(int device);
/// true when the library was built with CUDA and at least one GPU is visible.
bool oomb_cuda_available(void);

void oomb_backend_free(oomb_backend_t backend);
const char * oomb_backend_name(oomb_backend_t backend);
bool oomb_backend_is_host(oomb_backend_t backend);   // its buffers are host memory
/// Memory of the backend's device in bytes: *used = in use by every process (CUDA: cudaMemGetInfo's
/// total - free, i.e. our buffers, scratch and cuBLAS workspaces, which are never freed during a
/// step, so after a step it is the step's peak), *total = capacity. false (and zeros) when the
/// backend has no separate device memory (CPU).
bool oomb_backend_memory(oomb_backend_t backend, size_t * used, size_t * total);
/// Computes every node of g in order. All tensors must have data in this backend's memory.
/// Errors (a tensor without data, ids out of range, ...) go through the error handler.
void oomb_backend_graph_compute(oomb_backend_t backend, struct oomb_cgraph * g);
/// Waits for queued work (no-op on the CPU).
void oomb_backend_synchronize(oomb_backend_t backend);

/// A block of backend memory, 256-byte aligned. size 0 is allowed (base may then be NULL).
oomb_buffer_t oomb_backend_alloc_buffer(oomb_backend_t backend, size_t size);
void   oomb_buffer_free(oomb_buffer_t buffer);
void * oomb_buffer_base(oomb_buffer_t buffer);
size_t oomb_buffer_size(oomb_buffer_t buffer);
oomb_backend_t oomb_buffer_backend(oomb_buffer_t buffer);

/// Places t at byte `offset` of buffer (sets t->data and t->buffer). Errors if it does not fit.
void oomb_tensor_alloc(oomb_buffer_t buffer, struct oomb_tensor * t, size_t offset);
/// Gives every tensor of ctx that has no data memory in one new buffer of `backend` (views get the
/// memory of their view_src), zero-filled. Returns the buffer (the caller frees it after the context's
/// tensors are no longer used), or NULL when no tensor needed memory. The backend's failing to
/// allocate the memory is an oomb_error (naming the backend and the bytes).
oomb_buffer_t oomb_backend_alloc_ctx_tensors(struct oomb_context * ctx, oomb_backend_t backend);
/// The same, but a failed allocation returns NULL (and *failed_bytes, when not NULL, holds the
/// bytes asked for; 0 when no tensor needed memory), for callers that report errors themselves.
oomb_buffer_t oomb_backend_try_alloc_ctx_tensors(struct oomb_context * ctx, oomb_backend_t backend, size_t * failed_bytes);

/// Copies `size` bytes between host memory and t's data starting at byte `offset` of t (t must be
/// contiguous over that range). Works for host and device tensors. Errors when out of range.
void oomb_tensor_set(struct oomb_tensor * t, const void * data, size_t offset, size_t size);
void oomb_tensor_get(const struct oomb_tensor * t, void * data, size_t offset, size_t size);
/// Sets every byte of t's data to `value` (t contiguous).
void oomb_tensor_memset(struct oomb_tensor * t, uint8_t value);
/// Convenience for f32 tensors: copy n floats in / out (n == nelements(t)).
void oomb_tensor_set_f32(struct oomb_tensor * t, const float * data, int64_t n);
void oomb_tensor_get_f32(const struct oomb_tensor * t, float * data, int64_t n);

#ifdef __cplusplus
}
#endif
