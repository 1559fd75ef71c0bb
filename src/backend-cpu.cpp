// CPU backend: host memory buffers, a persistent thread pool (cpu/thread-pool.h) and graph execution.
// The op kernels are in cpu/ (cpu/ops-cpu.cpp dispatches); matrix products go through OpenBLAS.

#include "cpu/ops-cpu.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

using oomb::shape_str;

namespace {

struct cpu_backend_ctx {
    int n_threads = 1;
    std::unique_ptr<oomb::cpu::thread_pool> pool;
    oomb::cpu::exec_ctx exec;
};

int resolve_threads(int n) {
    if (n > OOMB_CPU_MAX_THREADS) {
        oomb_error("backend_cpu: %d threads requested; at most %d are supported", n, OOMB_CPU_MAX_THREADS);
    }
    if (n > 0) return n;
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? (int) hw : 1;
}

void set_threads(cpu_backend_ctx * c, int n) {
    n = resolve_threads(n);
    if (c->pool && c->n_threads == n) return;
    c->pool.reset();
    c->pool.reset(new oomb::cpu::thread_pool(n));
    c->n_threads = n;
    c->exec.pool = c->pool.get();
    c->exec.n_threads = n;
    c->exec.reserve_thread_scratch(256);
    oomb::cpu::set_blas_threads(n);
}

cpu_backend_ctx * ctx_of(oomb_backend_t b) { return (cpu_backend_ctx *) b->ctx; }

const char * cpu_name(oomb_backend_t) { return "CPU"; }
bool cpu_is_host(oomb_backend_t) { return true; }

void * cpu_alloc(oomb_backend_t, size_t size) {
    const size_t align = 256;
    if (size > SIZE_MAX - align) return nullptr;  // the rounding below would wrap to a tiny block
    const size_t sz = (std::max<size_t>(size, 1) + align - 1) / align * align;
    return aligned_alloc(align, sz);
}
void cpu_free_mem(oomb_backend_t, void * base) { free(base); }
void cpu_set(oomb_backend_t, void * dst, const void * src, size_t size) { memcpy(dst, src, size); }
void cpu_get(oomb_backend_t, void * dst, const void * src, size_t size) { memcpy(dst, src, size); }
void cpu_memset(oomb_backend_t, void * dst, uint8_t value, size_t size) { memset(dst, value, size); }
void cpu_synchronize(oomb_backend_t) {}

const char * cpu_placement_error(oomb_backend_t, const oomb_tensor * t) {
    return oomb::tensor_is_host(t) ? nullptr : "in device memory; the CPU backend needs host memory";
}

void cpu_graph_compute(oomb_backend_t b, oomb_cgraph * g) {
    cpu_backend_ctx * c = ctx_of(b);
    for (size_t i = 0; i < g->nodes.size(); i++) {
        oomb::backend_begin_node(b, (int) i);
        oomb::cpu::compute_forward(c->exec, g->nodes[i]);
    }
}

void cpu_free_backend(oomb_backend_t b) {
    delete ctx_of(b);
    delete b;
}

const oomb_backend_i k_cpu_iface = {
    /* name          */ cpu_name,
    /* is_host       */ cpu_is_host,
    /* alloc         */ cpu_alloc,
    /* free_mem      */ cpu_free_mem,
    /* set           */ cpu_set,
    /* get           */ cpu_get,
    /* memset_mem    */ cpu_memset,
    /* graph_compute */ cpu_graph_compute,
    /* synchronize   */ cpu_synchronize,
    /* free_backend  */ cpu_free_backend,
    /* memory        */ nullptr,
    /* placement_error */ cpu_placement_error,
};

} // namespace

oomb_backend_t oomb_backend_cpu_init(int n_threads) {
    auto * c = new cpu_backend_ctx();
    // OOMB_CPU_MIN_PARALLEL_WORK: ops touching fewer elements run on one thread (tests set 1 to
    // exercise the threaded paths on small data).
    if (const char * e = getenv("OOMB_CPU_MIN_PARALLEL_WORK")) {
        const long long v = atoll(e);
        if (v > 0) c->exec.min_parallel_work = v;
    }
    set_threads(c, n_threads);
    auto * b = new oomb_backend();
    b->iface = &k_cpu_iface;
    b->ctx = c;
    oomb::backend_init_buffer_types(b, "CPU", "CPU_Host", true);
    return b;
}

void oomb_backend_cpu_set_n_threads(oomb_backend_t backend, int n_threads) {
    if (!backend || backend->iface != &k_cpu_iface) oomb_error("backend_cpu_set_n_threads: not a CPU backend");
    set_threads(ctx_of(backend), n_threads);
}
