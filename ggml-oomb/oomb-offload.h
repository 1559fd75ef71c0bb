// ggml-oomb host offload (OOMB mechanism 3): a chunk graph computed over a KV cache with a host
// tier (oomb_kv_cache_init_tiered), so that the device holds a bounded working set whatever the
// context length.
//
// Design. The KV cache's pages past the resident ones live in pinned host memory. A chunk graph's
// paged-attention nodes are computed here block by block instead of in one kernel call: the
// chunk's own pages (RANGE [c0, c1), with the store) first, then the resident history (RANGE
// [0, R)), then the streamed history in blocks of B pages, each copied into one of two device slot
// sets on the backend's copy queue while the previous block computes. The forward merges the
// blocks' results through their log-sum-exp (the weights of oomb_paged_attn_merge, applied inside
// each block's kernel: oomb_paged_attn_args.accumulate); the backward is separable over blocks
// given the saved LSE and delta (FlashAttention-2): dQ accumulates across blocks (each block's
// kernel adds into the node's dq), and a block's dK/dV pages are copied in, accumulated into and
// copied back out. Events order every
// copy after its producer and every slot's reuse after its last reader. The rest of the graph runs
// unchanged, in parts between the attention nodes (oomb_graph_view). The kernels are the same as
// without offload; only the summation order of the blocks differs (results equal to rounding).
// Sparse attention (LISTS schedules) streams only the pages some query tile selected: the union of
// the lists, in blocks of B of those pages, each computed under LISTS_RANGE (oomb-schedule.h).
// A chunk whose pages are all resident runs as one ordinary graph_compute (bit-identical).
#pragma once

#include "oomb.h"
#include "oomb-backend.h"
#include "oomb-paged.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oomb_kv_stream * oomb_kv_stream_t;

/// Transfers of the streams of a process since its start (bytes, copies, history blocks).
struct oomb_kv_stream_stats {
    uint64_t bytes_in;   // host -> device (K/V and gradient pages)
    uint64_t bytes_out;  // device -> host
    uint64_t n_copies;
    uint64_t n_blocks;   // streamed history blocks computed
    double copy_ms;      // time the copy queue spent copying (a synchronous backend: host time of its copies)
    double wait_ms;      // time the compute queue waited for copies: the exposed part of copy_ms (synchronous: all of it)
};

/// Prepares chunk graph g (allocated, its paged-attention nodes reading kv's pools) for computing
/// over kv's host tier. Keeps pointers to g's nodes: free the stream before g. The blocks
/// accumulate into the nodes' own memory (no scratch). Nodes with a LISTS schedule
/// (sparse attention, oomb-sparse.h) stream only the history pages their lists name (see
/// src/oomb/offload.cpp), each with a page table of its own (4 bytes per logical page, device
/// memory). Errors (oomb_error): a paged-attention node with a result cache
/// (oomb_paged_attn_cached) or a schedule other than DENSE or LISTS, a backward node without the
/// forward's saved statistics (fwd NULL: its blocks would recompute them over their own keys only),
/// a cache without a host tier;
/// lists that are not valid for the chunk (at compute); NULL when the sparse nodes' page tables
/// cannot be allocated.
oomb_kv_stream_t oomb_kv_stream_new(oomb_kv_cache_t kv, oomb_backend_t backend, struct oomb_cgraph * g);
void oomb_kv_stream_free(oomb_kv_stream_t s);
/// Computes g for the chunk of T consecutive positions starting at p0 (g's pos input must hold
/// them; kv reserved up to p0 + T): sets kv's page table for this chunk, streams what the chunk
/// reads, writes back what it changed, and waits until all of it finished. A fault of a kernel or
/// a copy returns its status (oomb_backend_last_error names it); the host tier may then hold a
/// partial result. Test hook: OOMB_DEBUG_OFFLOAD_FAIL_COPY=N in the environment when a stream is
/// created (the first one with that value) makes the N-th copy after it, counted over every
/// stream of the process, fail once as a device error.
enum oomb_status oomb_kv_stream_compute(oomb_kv_stream_t s, int64_t p0, int64_t T);
/// The message of the stream's last failed compute ("" after one that succeeded).
const char * oomb_kv_stream_last_error(oomb_kv_stream_t s);
/// Totals of every stream of the process.
struct oomb_kv_stream_stats oomb_kv_stream_totals(void);
/// Test hook: the order in which the streams created while OOMB_DEBUG_OFFLOAD_TRACE=1 was set
/// queued their work, one line per finished compute, since the last call (which it clears; the
/// pointer is valid until the next call). Tokens, space-separated, k counting a graph's attention
/// nodes from 0: "c<p0>" the chunk starting at p0; "i<k>.<b>" history block b's copies in for node
/// k queued; "p<k>" the graph part before node k launched ("p<n>": the rest); "n<k>:<kind>" node k's
/// own kernels launched (kind 0 dense, 1 sparse with uploaded lists, 2 sparse with lists computed
/// by the graph). OOMB_OFFLOAD_EARLY_COPIES=0|1 (default 0 until measured on a GPU, read when a stream is created): 1
/// queues a node's blocks 0 and 1 before the part before it (kinds 0 and 1), 0 after it; the
/// results are the same (src/oomb/offload.cpp). Any other value of either variable is an error.
const char * oomb_kv_stream_debug_trace(void);

// ---------------------------------------------------------------------------------------------
// Host-offload tensors: any graph's tensors (weights, optimizer state, caches) stored in host
// memory (the backend's host buffer type: pinned for CUDA) and brought into a bounded device
// working set for the nodes that use them (see src/oomb/offload-tensors.cpp for the schedule).
// ---------------------------------------------------------------------------------------------

typedef struct oomb_offload * oomb_offload_t;

struct oomb_offload_stats {
    uint64_t bytes_in;   // host -> working set
    uint64_t bytes_out;  // working set -> host (tensors the graphs wrote)
    size_t peak_bytes;   // most of the working set in use at once
};

/// A set of host-offload tensors of `backend` with a device working set of working_set_bytes
/// (rounded down to 256). NULL (message on stderr) when the working set cannot be allocated.
/// Error: working_set_bytes 0.
oomb_offload_t oomb_offload_new(oomb_backend_t backend, size_t working_set_bytes);
/// Frees the working set and the tensors' host memory (their data becomes NULL).
void oomb_offload_free(oomb_offload_t o);
/// Makes t a host-offload tensor: allocates its host memory, where t->data points between
/// computes (oomb_tensor_set/get and host code use it as a host tensor). Errors: t already has data
/// or is a view, t was added before, t larger than the working set.
void oomb_offload_add(oomb_offload_t o, struct oomb_tensor * t);
/// Computes g (allocated as usual; its host-offload tensors are leafs or results with their host
/// memory) on the offload's backend: each node that touches a host-offload tensor (result, source,
/// or a view of one) runs with that tensor in the working set, copied in on the copy queue ahead of
/// use (prefetched while earlier nodes compute) and copied back after the tensor's last use when a
/// node wrote it. Bit-identical to computing with the tensors in device memory. Returns when all of
/// it finished, every tensor home on the host. Errors (status, oomb_offload_last_error): one node's
/// host-offload tensors not fitting the working set together (ALLOC_FAILED), a failed kernel or copy.
enum oomb_status oomb_offload_graph_compute(oomb_offload_t o, struct oomb_cgraph * g);
const char * oomb_offload_last_error(oomb_offload_t o);
struct oomb_offload_stats oomb_offload_get_stats(oomb_offload_t o);

#ifdef __cplusplus
}
#endif
