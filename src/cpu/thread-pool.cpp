// The library's one CPU thread pool (see thread-pool.h).

#include "thread-pool.h"

namespace oomb {
namespace cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

} // namespace

thread_pool::thread_pool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; i++) threads_.emplace_back([this, i] { worker(i); });
}

thread_pool::~thread_pool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_.store(true);
        gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto & t : threads_) t.join();
}

void thread_pool::run(task_fn fn, void * arg) {
    if (n_ == 1) { fn(arg, 0, 1); return; }
    fn_ = fn;
    arg_ = arg;
    pending_.store(n_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lk(mu_);
        gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(arg, 0, n_);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; spins++) {
        if (spins < k_spin) cpu_relax();
        else std::this_thread::yield();
    }
}

void thread_pool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = gen_.load(std::memory_order_acquire);
        for (int spins = 0; g == seen && spins < k_spin; spins++) {
            cpu_relax();
            g = gen_.load(std::memory_order_acquire);
        }
        if (g == seen) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
            g = gen_.load(std::memory_order_acquire);
        }
        if (stop_.load()) return;
        seen = g;
        fn_(arg_, ith, n_);
        pending_.fetch_sub(1, std::memory_order_release);
    }
}

} // namespace cpu
} // namespace oomb
