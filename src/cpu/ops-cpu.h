// CPU backend internals: the execution state handed to the kernels and their entry point.
// backend-cpu.cpp owns the pool (cpu/thread-pool.h) and the backend vtable; cpu/ops-cpu.cpp
// dispatches to one compute_forward_<op> kernel per op (cpu/ops-*.cpp). Kernels run on the calling
// (main) thread, validate their inputs there (errors go through oomb_error, never from a pool
// thread), and split rows over exec_ctx::pool with parallel_for.
#pragma once

#include "oomb-impl.h"
#include "thread-pool.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oomb {
namespace cpu {

// A 64-byte aligned scratch block that grows on demand (contents are not kept when it grows).
struct scratch_buf {
    void * p   = nullptr;
    size_t cap = 0;
    scratch_buf() = default;
    scratch_buf(const scratch_buf &) = delete;
    scratch_buf & operator=(const scratch_buf &) = delete;
    scratch_buf(scratch_buf && o) noexcept : p(o.p), cap(o.cap) { o.p = nullptr; o.cap = 0; }
    ~scratch_buf();
    void * get(size_t bytes);
};

// Execution state of one CPU backend.
struct exec_ctx {
    thread_pool * pool = nullptr;  // the backend's pool: kernels that split work use it (never their own threads)
    int n_threads = 1;             // pool->size()
    int64_t min_parallel_work = 32 * 1024; // ops with less work (elements touched) stay on one thread
    enum { N_SLOTS = 24 };
    scratch_buf slots[N_SLOTS];         // main-thread scratch (prepared sources, conversions)
    std::vector<scratch_buf> tscratch;  // one per thread, sized on the main thread before dispatch

    void * slot(int i, size_t bytes) {
        if (i < 0 || i >= N_SLOTS) oomb_error("cpu: scratch slot %d out of range (%d slots)", i, (int) N_SLOTS);
        return slots[i].get(bytes);
    }
    // Makes every thread's scratch at least `bytes` (call on the main thread, before parallel work).
    void reserve_thread_scratch(size_t bytes);
    void * thread_scratch(int ith) { return tscratch[(size_t) ith].p; }
};

// Sets OpenBLAS's thread count (process-wide; only calls OpenBLAS when it changes).
void set_blas_threads(int n);

// Computes one graph node (dispatch on node->op). Views (view/reshape/permute/transpose) are no-ops.
void compute_forward(exec_ctx & c, oomb_tensor * node);

} // namespace cpu
} // namespace oomb
