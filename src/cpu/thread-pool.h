// The library's one CPU thread pool, and parallel_for over it (internal; not part of the C API).
//
// Who uses it:
//   - the CPU backend (backend-cpu.cpp) owns one pool per backend, sized by oomb_backend_cpu_init /
//     oomb_backend_cpu_set_n_threads, and hands it to the kernels through oomb::cpu::exec_ctx
//     (cpu/ops-cpu.h): a kernel computing a node gets `exec_ctx & c` and splits its rows with
//     parallel_for(*c.pool, n, chunk, f) (or the cost-aware parallel_for(exec_ctx &, ...) of
//     cpu/ops-common.h, which keeps tiny ops on the main thread). A kernel that needs its own
//     threads (e.g. the paged-attention kernels, which still take a thread count) takes the
//     exec_ctx instead and uses c.pool: no kernel spawns std::threads of its own.
//   - library code outside a backend that wants all cores for a while (qwen2_init_random) makes a
//     thread_pool for the duration of the work and runs parallel_for on it.
// Determinism: parallel_for gives every item to exactly one call of f, so results that are a
// function of the item alone (per-row kernels, per-chunk random streams) do not depend on the
// thread count or on which thread ran an item; ith only picks per-thread scratch.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace oomb {
namespace cpu {

typedef void (*task_fn)(void * arg, int ith, int nth);

// Persistent pool of n threads (the caller counts as thread 0; n < 1 counts as 1). run() calls
// fn(arg, ith, n) on every thread, the caller included, and returns when all are done. Not
// reentrant (one run at a time, not from inside a task); tasks must not throw.
// Barrier-style: run() publishes a task by bumping a generation counter; workers spin briefly on it
// (ops follow each other closely), then sleep on a condition variable (so they do not compete with
// OpenBLAS threads during matrix products). The caller works as thread 0 and then waits for the
// others.
class thread_pool {
public:
    explicit thread_pool(int n);
    ~thread_pool();
    thread_pool(const thread_pool &) = delete;
    thread_pool & operator=(const thread_pool &) = delete;

    int size() const { return n_; }
    void run(task_fn fn, void * arg);

private:
    static constexpr int k_spin = 2000;
    void worker(int ith);

    const int n_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    task_fn fn_ = nullptr;
    void * arg_ = nullptr;
};

// Calls f(begin, end, ith) over [0, n) split into chunks of `chunk` items (>= 1) that the pool's
// threads take in turn from a shared counter (a few chunks per thread balance rows of uneven cost).
// Each item is computed by exactly one call; ith in [0, pool.size()) is the calling thread.
// Call from one thread at a time, never from inside f.
template <class F>
void parallel_for(thread_pool & pool, int64_t n, int64_t chunk, F && f) {
    if (n <= 0) return;
    using fn_t = typename std::remove_reference<F>::type;
    struct arg_t {
        fn_t * f;
        int64_t n;
        int64_t chunk;
        std::atomic<int64_t> next;
    } arg;
    arg.f = &f;
    arg.n = n;
    arg.chunk = std::max<int64_t>(1, chunk);
    arg.next.store(0, std::memory_order_relaxed);
    pool.run(
        [](void * p, int ith, int) {
            auto * a = (arg_t *) p;
            for (;;) {
                const int64_t b = a->next.fetch_add(a->chunk, std::memory_order_relaxed);
                if (b >= a->n) break;
                (*a->f)(b, std::min(a->n, b + a->chunk), ith);
            }
        },
        &arg);
}

} // namespace cpu
} // namespace oomb
