// CPU backend internals: the thread pool interface and the op kernels' entry point.
// backend-cpu.cpp owns the pool and the backend vtable; ops-cpu.cpp holds one compute_forward_<op>
// kernel per op. Kernels run on the calling (main) thread, validate their inputs there (errors go
// through oomb_error, never from a pool thread), and split rows over the pool with parallel_for.
#pragma once

#include "oomb-impl.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oomb {
namespace cpu {

typedef void (*task_fn)(void * arg, int ith, int nth);

// Persistent pool of n threads (the caller counts as thread 0). run() calls fn(arg, ith, n) on every
// thread, the caller included, and returns when all are done. Not reentrant; tasks must not throw.
class thread_pool {
public:
    virtual ~thread_pool() = default;
    virtual int  size() const = 0;
    virtual void run(task_fn fn, void * arg) = 0;
};

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
    thread_pool * pool = nullptr;
    int n_threads = 1;
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
