// ggml-oomb backends: where tensor data lives (buffers) and who computes graphs.
//
// A backend owns a kind of memory (host for the CPU backend, device memory for CUDA) and computes
// graphs whose tensors live in that memory. Tensors get memory from a buffer: either one buffer per
// context (oomb_backend_alloc_ctx_tensors, for parameters, gradients and optimizer state) or the
// arena planned by the graph allocator (oomb-alloc.h) for the intermediate tensors of a graph.
// Tensors of a context created without no_alloc hold context-owned host memory, which the CPU
// backend computes on directly.
//
// Errors. Two kinds, reported two ways:
//   - Programming errors (a NULL backend or graph, a graph whose tensors have no data or lie in
//     memory the backend cannot use, a stale graph allocation, out-of-range or non-contiguous
//     tensor copies, a tensor in the wrong buffer): found before any work is queued and reported
//     through the error handler (oomb.h: by default print and abort()).
//   - Compute-time faults, found while a graph is being computed: data-dependent errors (ids or
//     labels out of range, page tables pointing outside the cache), CUDA errors (a kernel or copy
//     that failed, out of device memory for scratch), an op the backend does not implement, and a
//     stop asked for by the abort callback. oomb_backend_graph_compute returns them as a status
//     (never through the handler) and oomb_backend_last_error() says which node failed and why:
//     "node <i> (<op>: <result> <- <sources>): <message>".
//
// Memory and queues (v2, after ggml-backend.h).
//   - Buffer types: every backend has two. oomb_backend_buffer_type() is its own memory (CUDA:
//     device memory, cudaMalloc; CPU: aligned host memory); oomb_backend_host_buffer_type() is
//     host memory the backend copies to and from fastest (CUDA: pinned, cudaHostAlloc, counted
//     by oomb_pinned_host_bytes(); CPU: aligned host memory). A tensor placed in a host buffer
//     is a host tensor (the CPU backend and oomb_get/set_f32_* can use it directly).
//   - Queues: a backend has a compute queue (graph_compute, the synchronous oomb_tensor_set/get)
//     and two copy queues (CUDA: two more streams, so uploads and downloads overlap kernels and each other). The
//     asynchronous copies take the queue; work on one queue runs in order, work on different
//     queues is unordered unless an event orders it: record an event on one queue after the
//     copy, make the other queue wait for it. A host buffer passed to an asynchronous copy must
//     stay untouched until the copy completed (event_synchronize or queue_synchronize); pinned
//     memory makes CUDA copies truly asynchronous (pageable memory works, but the host waits).
//   - The CPU backend implements all of it synchronously: copies finish before they return and
//     events are complete at once.
#pragma once

#include "oomb.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oomb_backend * oomb_backend_t;
typedef struct oomb_buffer  * oomb_buffer_t;
typedef struct oomb_buffer_type * oomb_buffer_type_t;
typedef struct oomb_event   * oomb_event_t;

/// The queues of a backend (see the top of this file).
enum oomb_queue {
    OOMB_QUEUE_COMPUTE  = 0,
    OOMB_QUEUE_COPY     = 1,
    // a second copy queue: PCIe is full duplex, so copies to the host on this queue run beside copies
    // from the host on OOMB_QUEUE_COPY (CUDA: a third stream; any direction is allowed on either)
    OOMB_QUEUE_COPY_OUT = 2,
};

/// Result of the backend calls that can fault at run time (graph_compute, asynchronous copies).
enum oomb_status {
    OOMB_STATUS_OK           = 0,
    OOMB_STATUS_FAILED       = 1, // a data-dependent error or an op the backend does not implement
    OOMB_STATUS_ABORTED      = 2, // the abort callback asked to stop (the nodes before it ran)
    OOMB_STATUS_ALLOC_FAILED = 3, // out of memory for scratch
    OOMB_STATUS_DEVICE_ERROR = 4, // the device reported an error (CUDA: a failed kernel or copy)
};
/// "ok", "failed", "aborted", "alloc failed", "device error".
const char * oomb_status_name(enum oomb_status status);

/// Polled before every node of oomb_backend_graph_compute; returning true stops the computation
/// (status OOMB_STATUS_ABORTED).
typedef bool (*oomb_abort_callback_t)(void * data);

/// The most CPU threads a backend takes (a typo such as 100000 would exhaust the process's threads):
/// more is an oomb_error. Programs check their thread options against it, so that they report the
/// option instead.
#define OOMB_CPU_MAX_THREADS 1024
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
/// Bytes of device scratch the backend will hold to compute `graph`, beyond the graph's own tensors:
/// the kernels' temporaries, which a backend keeps between graphs (CUDA: per-slot buffers that only
/// grow), so a memory plan adds them to the arenas. Counts the large ones only (CUDA: the
/// linear_cross_entropy passes' logits blocks, the LM head's [V, rows] f32 of up to 1.25 GiB (or the cap
/// oomb_backend_set_linear_cross_entropy_block set), and their
/// row state; a forward / backward pair counted both fused and apart, an upper bound); other kernels'
/// scratch (tens of MiB to ~1 GiB: paged attention's workspace at 7B and 32K) is not counted. 0 for a backend without device
/// memory (CPU) or a NULL graph. Shapes only: the graph need not be allocated.
size_t oomb_backend_graph_scratch(oomb_backend_t backend, const struct oomb_cgraph * graph);
/// Caps the device scratch of the LM head's fused forward + backward pass (CUDA: the [V, rows] f32
/// logits of one block of rows; default 1.25 GiB): bytes > 0 sets the cap, 0 restores the default.
/// Fewer, larger row blocks are faster (each block's dW product reads and writes the whole f32 [E, V]
/// gradient; the 0.5B at one chunk of 32K on an H100: 15 blocks 68.3 ms, 4 blocks of 8,192 rows 58.8 ms
/// per step, bench/NOTES.md), so a memory plan that has the room left after everything else raises it
/// (oomb-train: examples/train-offload.cpp, up to 5 GiB); oomb_backend_graph_scratch counts with the cap
/// set. A block that does not fit at run time still falls back to smaller ones. Takes effect from the
/// next graph_compute; results differ only in rounding (dW sums its blocks in f32). Returns false
/// (nothing set) for a backend without such a block (CPU) or NULL.
bool oomb_backend_set_linear_cross_entropy_block(oomb_backend_t backend, size_t bytes);
/// Forgets the per-op GPU times gathered so far by a profiling backend (CUDA under OOMB_CUDA_PROFILE), so
/// that the profile printed when the backend is freed covers only what runs after this call (oomb-train
/// calls it after its first step: the first use of a kernel loads its module, cuBLAS picks and plans its
/// algorithms, and those one-time costs, tens of ms per kernel, would be charged to the ops that ran
/// first). When it profiles, waits for the work queued on the compute queue first. Returns true when a profile was reset, false when the
/// backend does not profile (CPU; CUDA without OOMB_CUDA_PROFILE) or backend is NULL.
bool oomb_backend_profile_reset(oomb_backend_t backend);
/// Computes every node of g in order. All tensors must have data in this backend's memory.
/// Programming errors (a tensor without data or in another backend's memory, a stale allocation)
/// go through the error handler before anything runs. Compute-time faults (ids or labels out of
/// range, CUDA errors, an unsupported op, the abort callback) return a status other than
/// OOMB_STATUS_OK; oomb_backend_last_error() then names the node (index, op, shapes) and the fault.
/// The results of the nodes after a failed one are undefined.
enum oomb_status oomb_backend_graph_compute(oomb_backend_t backend, struct oomb_cgraph * g);
/// The message of the backend's last failed call ("" after a call that succeeded). Valid until
/// the next call on the backend.
const char * oomb_backend_last_error(oomb_backend_t backend);
/// The message of the last failed graph_compute or asynchronous copy on the calling thread (any
/// backend; "" if none), and in *n_failures (may be NULL) how many have failed on this thread so far:
/// for wrappers that see a failure without the backend at hand (tests: EXPECT_OOMB_ERROR).
const char * oomb_last_compute_error(uint64_t * n_failures);
/// Sets (or with NULL clears) the callback polled before every node of graph_compute.
void oomb_backend_set_abort_callback(oomb_backend_t backend, oomb_abort_callback_t cb, void * data);
/// Waits for queued work (no-op on the CPU).
void oomb_backend_synchronize(oomb_backend_t backend);

/// A block of backend memory, 256-byte aligned. size 0 is allowed (base may then be NULL).
/// The same as oomb_buffer_type_alloc(oomb_backend_buffer_type(backend), size).
oomb_buffer_t oomb_backend_alloc_buffer(oomb_backend_t backend, size_t size);
/// Frees a buffer (NULL: nothing); once per buffer (a second free is undefined, as with free()).
void   oomb_buffer_free(oomb_buffer_t buffer);
void * oomb_buffer_base(oomb_buffer_t buffer);
size_t oomb_buffer_size(oomb_buffer_t buffer);
oomb_backend_t oomb_buffer_backend(oomb_buffer_t buffer);
oomb_buffer_type_t oomb_buffer_get_type(oomb_buffer_t buffer);
/// true when the buffer is host memory (CPU buffers, pinned host buffers).
bool oomb_buffer_is_host(oomb_buffer_t buffer);

/// The backend's own memory ("CPU", "CUDA0", ...) and its host staging memory ("CPU_Host",
/// "CUDA_Host": pinned). Owned by the backend (valid until it is freed).
oomb_buffer_type_t oomb_backend_buffer_type(oomb_backend_t backend);
oomb_buffer_type_t oomb_backend_host_buffer_type(oomb_backend_t backend);
const char * oomb_buffer_type_name(oomb_buffer_type_t buft);
size_t oomb_buffer_type_alignment(oomb_buffer_type_t buft);   // bytes (256)
bool oomb_buffer_type_is_host(oomb_buffer_type_t buft);
/// A buffer of `size` bytes of this type (size 0 allowed); NULL when the memory is not available.
oomb_buffer_t oomb_buffer_type_alloc(oomb_buffer_type_t buft, size_t size);
/// Bytes of pinned host memory (host buffer types of device backends) allocated and not yet freed
/// by this process: pinned memory cannot be swapped, compare it with the machine's RAM.
size_t oomb_pinned_host_bytes(void);

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
/// Asynchronous versions on queue q of `backend` (see the top of this file): t must be in a buffer
/// of `backend` (either type) and contiguous over [offset, offset + size); `data` is host memory
/// (pinned for a truly asynchronous CUDA copy) that must stay valid until the copy completed.
/// Misuse (range, contiguity, another backend's tensor) goes through the error handler naming the
/// tensor; a fault of the copy itself (a CUDA error) returns a status (oomb_backend_last_error).
enum oomb_status oomb_tensor_set_async(oomb_backend_t backend, enum oomb_queue q, struct oomb_tensor * t, const void * data,
                                       size_t offset, size_t size);
enum oomb_status oomb_tensor_get_async(oomb_backend_t backend, enum oomb_queue q, const struct oomb_tensor * t, void * data,
                                       size_t offset, size_t size);
/// Copies src's bytes into dst on queue q of `backend`: same byte size, both contiguous, each in a
/// buffer of `backend` (device or host) or a host tensor (host pinned <-> device, device <-> device).
/// The two byte ranges must not overlap (an error, unless src and dst are the same bytes: nothing to do).
enum oomb_status oomb_tensor_copy_async(oomb_backend_t backend, enum oomb_queue q, const struct oomb_tensor * src,
                                        struct oomb_tensor * dst);
/// Waits until everything queued on q has finished.
enum oomb_status oomb_backend_queue_synchronize(oomb_backend_t backend, enum oomb_queue q);

/// Events: a point in a queue's work. NULL when the backend cannot create one (CUDA error).
oomb_event_t oomb_event_new(oomb_backend_t backend);
/// An event that also records when it completed, for oomb_event_elapsed_ms (a little more costly
/// to record). NULL as oomb_event_new.
oomb_event_t oomb_event_new_timed(oomb_backend_t backend);
/// Milliseconds between the completions of two recorded, completed timed events of one backend
/// (start recorded before end), into *ms; 0 on a synchronous backend (its events complete at once).
/// Errors: NULL, events not made by oomb_event_new_timed, events of different backends (handler);
/// a device error (status).
enum oomb_status oomb_event_elapsed_ms(oomb_event_t start, oomb_event_t end, float * ms);
/// Frees an event (NULL: nothing). Each handle is freed once: a second free is undefined, as with
/// free(). Every function here reports a NULL handle through the error handler.
void oomb_event_free(oomb_event_t event);
/// Marks the current end of queue q of the event's backend.
enum oomb_status oomb_event_record(oomb_event_t event, enum oomb_queue q);
/// Work queued on q of `backend` after this call waits for the event (no host wait). The event's
/// backend must be of the same kind (a CPU event is complete: nothing to wait for).
enum oomb_status oomb_event_wait(oomb_backend_t backend, enum oomb_queue q, oomb_event_t event);
/// Host waits until the event completed.
enum oomb_status oomb_event_synchronize(oomb_event_t event);
/// true when the event completed (or was never recorded).
bool oomb_event_query(oomb_event_t event);

/// Convenience for f32 tensors: copy n floats in / out (n == nelements(t)).
void oomb_tensor_set_f32(struct oomb_tensor * t, const float * data, int64_t n);
void oomb_tensor_get_f32(const struct oomb_tensor * t, float * data, int64_t n);

#ifdef __cplusplus
}
#endif
