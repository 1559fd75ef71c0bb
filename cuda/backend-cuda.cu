// CUDA backend: device buffers (cudaMalloc; planned by oomb_gallocr like any backend's), one stream,
// a cuBLAS handle with its workspace, a growing scratch, and graph execution (every node dispatched
// on the stream, in order). Kernel families live in one .cu/.cuh pair each (see common.cuh).

#include "common.cuh"
#include "op-checks.h"
#include "attn.cuh"
#include "cross-entropy.cuh"
#include "elementwise.cuh"
#include "get-rows.cuh"
#include "linear-ce.cuh"
#include "mul-mat.cuh"
#include "norm.cuh"
#include "optim.cuh"
#include "reduce.cuh"
#include "rope.cuh"
#include "softmax.cuh"
#include "paged-attn.cuh"
#include "sparse.cuh"

#include <algorithm>
#include <cctype>
#include <string>
#include <cerrno>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>
#include <cstdlib>
#include <cstring>

using oomb::shape_str;

// Paged attention kernels come from cuda/paged-attn.cu (written separately). Until that file exists
// the backend reports the op as unsupported. (Its presence is tested when this file is compiled:
// after adding paged-attn.cu, rebuild this file too, e.g. touch it.)
#if __has_include("paged-attn.cu")
#define OOMB_CUDA_HAVE_PAGED 1
#else
#define OOMB_CUDA_HAVE_PAGED 0
#endif

// ---------------------------------------------------------------------------------------------
// Errors, scratch
// ---------------------------------------------------------------------------------------------

void oomb_cuda_fail(const char * what, const char * file, int line, const char * msg) {
    oomb::fail(OOMB_STATUS_DEVICE_ERROR, "cuda: %s failed at %s:%d: %s", what, file, line, msg);
}

void oomb_cuda_after_launch(oomb_cuda_ctx & c, const char * kernel, const char * file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && c.sync_each) e = cudaStreamSynchronize(c.stream);
    if (e != cudaSuccess) oomb::fail(OOMB_STATUS_DEVICE_ERROR, "cuda: kernel %s failed at %s:%d: %s", kernel, file, line, cudaGetErrorString(e));
}

// Ops that write only their result's bytes (CPY and ADD_INPLACE: a view of the memory written);
// the others (optimizer steps: moments; paged attention: KV pools, gradient pages; custom ops) may
// write memory they do not return.
static bool op_writes_only_result(enum oomb_op op) {
    switch (op) {
        case OOMB_OP_CONT: case OOMB_OP_CPY: case OOMB_OP_CAST: case OOMB_OP_FILL: case OOMB_OP_ADD: case OOMB_OP_SUB:
        case OOMB_OP_MUL: case OOMB_OP_SCALE: case OOMB_OP_ADD_INPLACE: case OOMB_OP_REPEAT: case OOMB_OP_REPEAT_BACK:
        case OOMB_OP_SILU: case OOMB_OP_SILU_BACK: case OOMB_OP_SWIGLU: case OOMB_OP_SWIGLU_BACK: case OOMB_OP_SUM:
        case OOMB_OP_MEAN: case OOMB_OP_SUM_SQ: case OOMB_OP_GET_ROWS: case OOMB_OP_GET_ROWS_BACK: case OOMB_OP_MUL_MAT:
        case OOMB_OP_RMS_NORM: case OOMB_OP_RMS_NORM_BACK: case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK: case OOMB_OP_SOFT_MAX:
        case OOMB_OP_SOFT_MAX_BACK: case OOMB_OP_ATTN: case OOMB_OP_ATTN_BACK: case OOMB_OP_CROSS_ENTROPY:
        case OOMB_OP_CROSS_ENTROPY_BACK: case OOMB_OP_LINEAR_CROSS_ENTROPY: case OOMB_OP_LINEAR_CROSS_ENTROPY_BACK:
        case OOMB_OP_PAGED_ATTN_MERGE: case OOMB_OP_RMS_NORM_MUL: case OOMB_OP_RMS_NORM_MUL_BACK:
            return true;
        default:
            return false;
    }
}
static bool op_is_layout_only(enum oomb_op op) {
    return op == OOMB_OP_NONE || op == OOMB_OP_VIEW || op == OOMB_OP_RESHAPE || op == OOMB_OP_PERMUTE || op == OOMB_OP_TRANSPOSE;
}

void oomb_cuda_ctx::bf16_copies_after(const oomb_tensor * node) {
    if (op_is_layout_only(node->op)) return;
    if (!op_writes_only_result(node->op)) {
        bf16_copies_clear();  // optimizer steps (moments), paged attention (KV pools, gradient pages), custom ops
        return;
    }
    if (oomb_nelements(node) == 0) return;
    const size_t lo = (size_t) node->data;
    size_t last = 0;
    for (int i = 0; i < 4; i++) last += (size_t) (node->ne[i] - 1) * node->nb[i];
    const size_t hi = lo + last + oomb_type_size(node->type);
    for (auto & e : bf16_copies)
        if (e.valid && e.lo < hi && lo < e.hi) e.valid = false;
}

void * oomb_cuda_ctx::try_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= N_SLOTS) oomb_error("cuda: scratch slot %d out of range", slot);
    slot_req[slot] = std::max(slot_req[slot], bytes);
    // oomb_cuda_debug_set_scratch_limit (tests): a request above the limit takes the allocation path
    // below, where blocks above the limit fail as cudaMallocAsync would out of memory
    const bool over = debug_scratch_limit && bytes > debug_scratch_limit;
    if (bytes <= slot_cap[slot] && slot_ptr[slot] && !over) return slot_ptr[slot];
    // Stream-ordered (no host or device synchronization): the old block is freed after the
    // kernels already queued on the compute stream (the only users of scratch) have run, and the
    // new one is usable by work queued after this point.
    if (slot_ptr[slot]) {
        CUDA_CHECK(cudaFreeAsync(slot_ptr[slot], stream));
        slot_ptr[slot] = nullptr;
        slot_cap[slot] = 0;
    }
    auto alloc = [&](size_t n, void ** q) {
        if (debug_scratch_limit && n > debug_scratch_limit) return cudaErrorMemoryAllocation;
        return cudaMallocAsync(q, n, stream);
    };
    const size_t exact = (std::max<size_t>(bytes, 256) + 255) & ~(size_t) 255;
    size_t sz = scratch_block_bytes(bytes);
    void * p = nullptr;
    cudaError_t e = alloc(sz, &p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        sz = exact;  // without the headroom
        e = alloc(sz, &p);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
    }
    slot_ptr[slot] = p;
    slot_cap[slot] = sz;
    return p;
}

size_t oomb_cuda_ctx::scratch_block_bytes(size_t bytes) {
    const size_t exact = (std::max<size_t>(bytes, 256) + 255) & ~(size_t) 255;
    const size_t sz = exact + std::min<size_t>(exact / 4, (size_t) 64 << 20);
    return (sz + 255) & ~(size_t) 255;
}

void * oomb_cuda_ctx::scratch(int slot, size_t bytes) {
    void * p = try_scratch(slot, bytes);
    if (!p) oomb::fail(OOMB_STATUS_ALLOC_FAILED, "cuda: out of device memory allocating %zu bytes of scratch (slot %d)", bytes, slot);
    return p;
}

// A default-on switch (common.cuh).
bool oomb_cuda_env_flag_off(const char * name) {
    const char * e = getenv(name);
    if (!e || !*e) return false;
    std::string v(e);
    for (char & ch : v) ch = (char) tolower((unsigned char) ch);
    if (v == "0" || v == "false" || v == "off" || v == "no") return true;
    if (v == "1" || v == "true" || v == "on" || v == "yes") return false;
    oomb_error("%s=%s: expected 0 or 1 (or false / true, off / on, no / yes)", name, e);
    return false;
}

namespace {

oomb_cuda_ctx * ctx_of(oomb_backend_t b) { return (oomb_cuda_ctx *) b->ctx; }

void set_device(const oomb_cuda_ctx * c) { CUDA_CHECK(cudaSetDevice(c->device)); }

// ---------------------------------------------------------------------------------------------
// Backend interface
// ---------------------------------------------------------------------------------------------

const char * cuda_name(oomb_backend_t) { return "CUDA"; }
bool cuda_is_host(oomb_backend_t) { return false; }

void * cuda_alloc(oomb_backend_t b, size_t size) {
    set_device(ctx_of(b));
    void * p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size > 0 ? size : 1);
    if (e != cudaSuccess) {
        cudaGetLastError(); // not sticky; clear it
        fprintf(stderr, "oomb: cudaMalloc of %zu bytes failed: %s\n", size, cudaGetErrorString(e));
        return nullptr;
    }
    return p;
}
void cuda_free_mem(oomb_backend_t b, void * base) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->copy_stream));
    CUDA_CHECK(cudaStreamSynchronize(c->copy_out_stream));
    CUDA_CHECK(cudaFree(base));
}

// Pinned host memory (the host buffer type): counted by oomb_pinned_host_bytes (backend.cpp).
void * cuda_alloc_host(oomb_backend_t b, size_t size) {
    set_device(ctx_of(b));
    void * p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, size > 0 ? size : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "oomb: cudaHostAlloc of %zu bytes failed: %s\n", size, cudaGetErrorString(e));
        return nullptr;
    }
    return p;
}
void cuda_free_host(oomb_backend_t b, void * base) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    // queued copies may still read or write it
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->copy_stream));
    CUDA_CHECK(cudaStreamSynchronize(c->copy_out_stream));
    CUDA_CHECK(cudaFreeHost(base));
}

cudaStream_t queue_stream(oomb_cuda_ctx * c, enum oomb_queue q) {
    return q == OOMB_QUEUE_COPY ? c->copy_stream : q == OOMB_QUEUE_COPY_OUT ? c->copy_out_stream : c->stream;
}

// dst and src: host memory (pinned or pageable) or device memory; UVA finds the direction.
void cuda_copy_async(oomb_backend_t b, enum oomb_queue q, void * dst, const void * src, size_t size) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    if (c->fail_next_copy != cudaSuccess) {
        const cudaError_t e = c->fail_next_copy;
        c->fail_next_copy = cudaSuccess;
        oomb_cuda_fail("cudaMemcpyAsync (injected by oomb_cuda_debug_fail_next_copy)", __FILE__, __LINE__, cudaGetErrorString(e));
    }
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault, queue_stream(c, q)));
}
void cuda_queue_synchronize(oomb_backend_t b, enum oomb_queue q) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaStreamSynchronize(queue_stream(c, q)));
}
void * cuda_event_new(oomb_backend_t b) {
    set_device(ctx_of(b));
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (void *) e;
}
void * cuda_event_new_timed(oomb_backend_t b) {
    set_device(ctx_of(b));
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    return (void *) e;
}
float cuda_event_elapsed_ms(oomb_backend_t b, void * start, void * end) {
    set_device(ctx_of(b));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t) start, (cudaEvent_t) end));
    return ms;
}
void cuda_event_free(oomb_backend_t b, void * ev) {
    set_device(ctx_of(b));
    cudaEventDestroy((cudaEvent_t) ev);
}
void cuda_event_record(oomb_backend_t b, void * ev, enum oomb_queue q) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaEventRecord((cudaEvent_t) ev, queue_stream(c, q)));
}
void cuda_event_wait(oomb_backend_t b, void * ev, enum oomb_queue q) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaStreamWaitEvent(queue_stream(c, q), (cudaEvent_t) ev, 0));
}
void cuda_event_synchronize(oomb_backend_t, void * ev) { CUDA_CHECK(cudaEventSynchronize((cudaEvent_t) ev)); }
bool cuda_event_query(oomb_backend_t, void * ev) {
    const cudaError_t e = cudaEventQuery((cudaEvent_t) ev);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) cudaGetLastError();
    return true;   // complete (or failed: event_synchronize reports the error)
}
void cuda_set(oomb_backend_t b, void * dst, const void * src, size_t size) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}
void cuda_get(oomb_backend_t b, void * dst, const void * src, size_t size) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}
void cuda_memset(oomb_backend_t b, void * dst, uint8_t value, size_t size) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaMemsetAsync(dst, value, size, c->stream));
}
bool cuda_memory(oomb_backend_t b, size_t * used, size_t * total) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    *used = tot - fr;
    *total = tot;
    return true;
}

void cuda_synchronize(oomb_backend_t b) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

const char * cuda_placement_error(oomb_backend_t b, const oomb_tensor * t) {
    const oomb_tensor * o = t->view_src ? t->view_src : t;
    if (o->buffer && o->buffer->backend == b && o->buffer->buft == &b->buft_device) return nullptr;
    return "not in this CUDA backend's memory (host tensors must be uploaded to a CUDA buffer)";
}


// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------

void compute_node(oomb_cuda_ctx & c, oomb_tensor * node) {
    const enum oomb_op op = node->op;
    switch (op) {
        case OOMB_OP_NONE: case OOMB_OP_VIEW: case OOMB_OP_RESHAPE: case OOMB_OP_PERMUTE: case OOMB_OP_TRANSPOSE:
            return;
        case OOMB_OP_PAGED_ATTN:
        case OOMB_OP_PAGED_ATTN_BACK:
#if OOMB_CUDA_HAVE_PAGED
            if (op == OOMB_OP_PAGED_ATTN) oomb_cuda_paged_attn(c, node);
            else oomb_cuda_paged_attn_back(c, node);
            OOMB_CUDA_LAUNCHED(c, oomb_op_name(op));
            return;
#else
            oomb_error("graph_compute: node %s: op %s is not supported by the CUDA backend (this build has no cuda/paged-attn.cu)",
                       shape_str(node).c_str(), oomb_op_name(op));
#endif
        case OOMB_OP_PAGE_SUMMARY:  // sparse attention (cuda/sparse.cu): the kernels read node->src themselves
            oomb_cuda_page_summary(c, node);
            return;
        case OOMB_OP_PAGE_SELECT:
            oomb_cuda_page_select(c, node);
            return;
        case OOMB_OP_CUSTOM: case OOMB_OP_COUNT:
            oomb_error("graph_compute: node %s: op %s is not supported by the CUDA backend", shape_str(node).c_str(), oomb_op_name(op));
        default:
            break;
    }
    // result layout, sources prepared as on the CPU (src/op-checks.h), checked
    oomb_tensor srcs[OOMB_MAX_SRC];
    const oomb_tensor * s[OOMB_MAX_SRC] = {nullptr};
    oomb::prepare_sources(node, srcs, s, [&](const oomb_tensor * t, int slot, oomb_tensor * r) {
        r->data = c.scratch(slot, oomb_nbytes(r));
        oomb_cuda_copy_tensor(c, t, r);
    });
    const char * opn = oomb_op_name(op);

    switch (op) {
        case OOMB_OP_CONT: case OOMB_OP_CPY: case OOMB_OP_CAST:  // src[0] -> dst in logical order (converting for cpy / cast)
                                    oomb_cuda_copy_tensor(c, s[0], node); break;
        case OOMB_OP_FILL:          oomb_cuda_fill(c, node); break;
        case OOMB_OP_ADD: case OOMB_OP_SUB: case OOMB_OP_MUL: case OOMB_OP_ADD_INPLACE:
        case OOMB_OP_SILU_BACK: case OOMB_OP_SWIGLU:
                                    oomb_cuda_binary(c, node, s[0], s[1]); break;
        case OOMB_OP_SCALE: case OOMB_OP_SILU:
                                    oomb_cuda_unary(c, node, s[0]); break;
        case OOMB_OP_SWIGLU_BACK:   oomb_cuda_swiglu_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_REPEAT:        oomb_cuda_repeat(c, node, s[0]); break;
        case OOMB_OP_REPEAT_BACK:   oomb_cuda_repeat_back(c, node, s[0]); break;
        case OOMB_OP_SUM: case OOMB_OP_MEAN: case OOMB_OP_SUM_SQ:
                                    oomb_cuda_sum(c, node, s); break;
        case OOMB_OP_GET_ROWS:      oomb_cuda_get_rows(c, node, s[0], s[1]); break;
        case OOMB_OP_GET_ROWS_BACK: oomb_cuda_get_rows_back(c, node, s[0], s[1]); break;
        case OOMB_OP_MUL_MAT:
        {
            const size_t i = (size_t) c.cur_node;
            const oomb_cuda_ctx::epilogue * epi = c.fuse_epi.empty() || !c.fuse_epi[i].add ? nullptr : &c.fuse_epi[i];
            // a product whose epilogue cuBLASLt could not run wrote its own bytes: its ADD runs after all
            if (!oomb_cuda_mul_mat(c, node, s[0], s[1], c.fuse_acc.empty() ? nullptr : c.fuse_acc[i], epi) && epi) c.fuse_skip[epi->at] = 0;
            break;
        }
        case OOMB_OP_RMS_NORM:      oomb_cuda_rms_norm(c, node, s[0]); break;
        case OOMB_OP_RMS_NORM_BACK: oomb_cuda_rms_norm_back(c, node, s[0], s[1]); break;
        case OOMB_OP_RMS_NORM_MUL:  oomb_cuda_rms_norm_mul(c, node, s[0], s[1]); break;
        case OOMB_OP_RMS_NORM_MUL_BACK:  // dx added into a gradient sum (fuse_accumulations)
            oomb_cuda_rms_norm_mul_back(c, node, s[0], s[1], s[2], c.fuse_acc.empty() ? nullptr : c.fuse_acc[(size_t) c.cur_node]); break;
        case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK:
                                    oomb_cuda_rope(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_SOFT_MAX:      oomb_cuda_soft_max(c, node, s[0]); break;
        case OOMB_OP_SOFT_MAX_BACK: oomb_cuda_soft_max_back(c, node, s[0], s[1]); break;
        case OOMB_OP_ATTN:          oomb_cuda_attn(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_ATTN_BACK:     oomb_cuda_attn_back(c, node, s[0], s[1], s[2], s[3]); break;
        case OOMB_OP_CROSS_ENTROPY: oomb_cuda_cross_entropy(c, node, s[0], s[1]); break;
        case OOMB_OP_CROSS_ENTROPY_BACK:
                                    oomb_cuda_cross_entropy_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_LINEAR_CROSS_ENTROPY:
                                    oomb_cuda_linear_ce(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_LINEAR_CROSS_ENTROPY_BACK:
        {
            float * acc_dw = c.fuse_acc.empty() ? nullptr : c.fuse_acc[(size_t) c.cur_node];  // dw added into a gradient
            if (!c.fuse_lce.empty() && c.fuse_lce[(size_t) c.cur_node])
                oomb_cuda_linear_ce_fused(c, c.fuse_lce[(size_t) c.cur_node], node, s[0], s[1], s[2], s[3], acc_dw);  // and its forward
            else
                oomb_cuda_linear_ce_back(c, node, s[0], s[1], s[2], s[3], s[4], acc_dw);
            break;
        }
        case OOMB_OP_ADAMW_STEP:    oomb_cuda_adamw_step(c, node, s[0], s[1], s[2], s[3], s[4]); break;
        case OOMB_OP_SGD_STEP:      oomb_cuda_sgd_step(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_PAGED_ATTN_MERGE:
                                    oomb_cuda_paged_attn_merge(c, node, s[0], s[1]); break;
        default:
            oomb_error("graph_compute: node %s: op %s is not supported by the CUDA backend", shape_str(node).c_str(), opn);
    }
}

// Reports (and clears) a data-dependent error recorded by a kernel of graph g.
void check_recorded_error(oomb_backend_t b, oomb_cuda_ctx & c, oomb_cgraph * g) {
    oomb_cuda_err_rec rec;
    CUDA_CHECK(cudaMemcpyAsync(&rec, c.d_err, sizeof(rec), cudaMemcpyDeviceToHost, c.stream));
    CUDA_CHECK(cudaStreamSynchronize(c.stream));
    c.check_err = false;
    if (!rec.flag) return;
    CUDA_CHECK(cudaMemsetAsync(c.d_err, 0, sizeof(rec), c.stream));
    CUDA_CHECK(cudaStreamSynchronize(c.stream));
    const oomb_tensor * node = rec.node >= 0 && (size_t) rec.node < g->nodes.size() ? g->nodes[(size_t) rec.node] : nullptr;
    if (node) b->cur_node = rec.node;  // the status message names the node that recorded the error
    if (!node) oomb_error("cuda: a kernel reported an out-of-range id or label (node %d)", rec.node);
    const char * opn = oomb_op_name(node->op);
    if (rec.kind == OOMB_CUDA_ERR_ID) {
        const oomb_tensor * table = node->op == OOMB_OP_GET_ROWS ? node->src[0] : node;
        const int64_t n_rows = table->ne[1];
        oomb_error("%s: id %lld at position %lld of ids %s is out of range: %s has %lld rows", opn, rec.value, rec.pos,
                   shape_str(node->src[1]).c_str(), shape_str(table).c_str(), (long long) n_rows);
    }
    if (rec.kind == OOMB_CUDA_ERR_LABEL &&
        (node->op == OOMB_OP_LINEAR_CROSS_ENTROPY || node->op == OOMB_OP_LINEAR_CROSS_ENTROPY_BACK)) {
        const oomb_tensor * w = node->src[0];
        oomb_error("%s: label %lld at row %lld is out of range [0, %lld) (ignore_index %d), w %s", opn, rec.value, rec.pos,
                   (long long) w->ne[1], node->op_params[0], shape_str(w).c_str());
    }
    if (rec.kind == OOMB_CUDA_ERR_LABEL) {
        const char * name = node->op == OOMB_OP_CROSS_ENTROPY ? "cross_entropy_loss" : "cross_entropy_loss_back";
        oomb_error("%s: label %lld at row %lld is out of range [0, %lld) (ignore_index %d), logits %s", name, rec.value, rec.pos,
                   (long long) node->src[0]->ne[0], node->op_params[0], shape_str(node->src[0]).c_str());
    }
    oomb_error("cuda: node %s (op %s) reported error kind %d", shape_str(node).c_str(), opn, rec.kind);
}

// OOMB_CUDA_PROFILE=2: a node's op, result and operand shapes and types (digits of names dropped,
// so the layers of a model share one row).
std::string profile_key(const oomb_tensor * n) {
    auto one = [](const oomb_tensor * t) {
        char buf[128];
        std::string name;
        for (const char * p = t->name; *p; p++)
            if (*p < '0' || *p > '9') name += *p;
        snprintf(buf, sizeof(buf), "%s[%lld,%lld,%lld,%lld]%s%s", name.c_str(), (long long) t->ne[0], (long long) t->ne[1],
                 (long long) t->ne[2], (long long) t->ne[3], oomb_type_name(t->type), oomb_is_contiguous(t) ? "" : "T");
        return std::string(buf);
    };
    std::string k = std::string(oomb_op_name(n->op)) + " " + one(n) + " <-";
    for (int i = 0; i < OOMB_MAX_SRC; i++)
        if (n->src[i]) k += " " + one(n->src[i]);
    return k;
}

bool env_flag_off(const char * name) { return oomb_cuda_env_flag_off(name); }

// The fusion passes' view of a graph, built once per graph_compute: each node's position and how many nodes
// read it (as a source or a view source).
struct graph_uses {
    std::unordered_map<const oomb_tensor *, int> readers;
    std::unordered_map<const oomb_tensor *, size_t> index;
    void build(const oomb_cgraph * g) {
        for (size_t i = 0; i < g->nodes.size(); i++) {
            const oomb_tensor * t = g->nodes[i];
            index[t] = i;
            for (int k = 0; k < OOMB_MAX_SRC; k++)
                if (t->src[k]) readers[t->src[k]]++;
            if (t->view_src) readers[t->view_src]++;
        }
    }
};

// Whether a node of g other than M reads P except through views of P disjoint from M (M: a view of one part
// of P's packed result, which a fused kernel leaves unwritten).
bool read_besides_view(const oomb_cgraph * g, const oomb_tensor * P, const oomb_tensor * M) {
    for (const oomb_tensor * t : g->nodes) {
        if (t == M) continue;
        bool reads = t->view_src == P;
        for (int q = 0; q < OOMB_MAX_SRC; q++) reads = reads || t->src[q] == P;
        if (reads && (t->op != OOMB_OP_VIEW || t->view_src != P || oomb::tensors_overlap(t, M))) return true;
    }
    return false;
}

// Fused accumulation: c += mul_mat(a, b) as one GEMM with beta = 1 into c. The autodiff appends
// every parameter's accumulation param->grad += gradient (src/backward.cpp) as an add_inplace whose
// gradient is, for a weight read once, the dW product itself; unfused, that product's f32 result is
// written and read back once more (7B, 128K: 12,672 add_inplace nodes, 1.28 s of a 23 s step).
// A MUL_MAT node M is fused into a later ADD_INPLACE node A = add_inplace(C, M) when: the graph is
// whole (not an oomb_graph_view part, whose later parts might read M); A is M's only reader in it (a
// source or view source of no other node); M lives in a graph allocator's arena (its value is not
// kept past its last reader anyway) and no flag pins it (input, output, param, loss); M and C are contiguous f32
// of one shape (no broadcast); C's bytes are not M's operands'; and no node between M and A (at
// most 256 apart; views, which compute nothing, aside) reads or writes C's bytes or base, or may
// write memory it does not return (optimizer steps, paged attention, custom ops). M then adds into
// C where it stands, and A does nothing. Fills c.fuse_acc / c.fuse_skip for g.
// The same for the dw part of a LINEAR_CROSS_ENTROPY_BACK node P (the LM head's gradient, an [E, V]
// f32 block: 2.2 GB per chunk at 7B): A = add_inplace(C, M) with M the view of P's dw part, when M is
// read only by A and P's other readers are views of its dx part; P's dw products then add into C
// (not with OOMB_CUDA_FUSE_LCE=0, as fuse_linear_ce).
// The same for the dx of an RMS_NORM_MUL_BACK node P (the norms' input gradients, summed into the residual
// stream's gradient by the autodiff: add(earlier sum, dx)): M is P itself (dx alone) or the view of its dx
// part (packed with dw, P's other readers views of the dw part); P's kernel then adds dx into C and writes
// only dw, if packed (OOMB_CUDA_FUSE_NORM=0: not these).
// The same for A = add(C, M) (not add_inplace) that the allocator placed in C's bytes (src/alloc.cpp:
// an ADD runs in place on src[0] when nothing reads src[0] after it): the autodiff's gradient sums
// (dX of the Q, K and V products, of gate and up; add_grad in src/backward.cpp) and residual adds whose
// input dies there. A is C's bytes, so M adds into them and A does nothing (OOMB_CUDA_FUSE_ADD=0: not
// these). add(M, C) (the product first) is not fused: its bytes would be M's, which do not hold C.
// A graph stopped between M and A (the abort callback, a compute fault) leaves C with M added,
// where the unfused graph would leave C unchanged; nothing resumes a stopped graph today.
// On by default; OOMB_CUDA_FUSE=0 turns it off (the unfused graph, for comparison). Measured on the
// H200 (bench/NOTES.md version 16): 7B sparse 128K, add_inplace 1.28 -> 0.11 s, step -0.74 s, same
// loss and gradient norm.
void fuse_accumulations(oomb_cuda_ctx & c, const oomb_cgraph * g, graph_uses & u) {
    c.fuse_acc.clear();
    c.fuse_at.clear();
    c.fuse_skip.clear();
    const bool lce_on = !env_flag_off("OOMB_CUDA_FUSE_LCE");
    if (g->is_view || env_flag_off("OOMB_CUDA_FUSE")) return;
    const size_t n = g->nodes.size();
    auto base = [](const oomb_tensor * t) { return t->view_src ? t->view_src : t; };
    auto & readers = u.readers;
    auto & index = u.index;
    const bool add_on = !env_flag_off("OOMB_CUDA_FUSE_ADD");
    const bool norm_on = !env_flag_off("OOMB_CUDA_FUSE_NORM");
    for (size_t j = 0; j < n; j++) {
        const oomb_tensor * A = g->nodes[j];
        const oomb_tensor * C = A->src[0], * M = A->src[1];
        // an ADD the allocator placed in its first operand's bytes (C dead after it) is an add_inplace
        const bool add_in_place = A->op == OOMB_OP_ADD && add_on && C && M && !A->view_src && A->data && A->data == C->data &&
                                  A->type == OOMB_TYPE_F32 && oomb_is_contiguous(A) && oomb_are_same_shape(A, C);
        if (A->op != OOMB_OP_ADD_INPLACE && !add_in_place) continue;
        const int32_t pinned = OOMB_TENSOR_FLAG_INPUT | OOMB_TENSOR_FLAG_OUTPUT | OOMB_TENSOR_FLAG_PARAM | OOMB_TENSOR_FLAG_LOSS;
        if (!C || !M || (M->flags & pinned) || readers[M] != 1) continue;
        // the producing node P: M itself (a MUL_MAT), or a linear_cross_entropy_back whose dw part M is
        // (a view at dw's offset; P's other readers only views of its dx part): its dw products then
        // add into C (beta = 1) and P's own dw bytes stay unwritten
        const oomb_tensor * P = M;
        if (M->op == OOMB_OP_VIEW && M->view_src && M->view_src->op == OOMB_OP_LINEAR_CROSS_ENTROPY_BACK) {
            if (!lce_on || add_in_place) continue;
            P = M->view_src;
            const int grads = P->op_params[2];
            const oomb_tensor * x = P->src[1], * w = P->src[0];
            const size_t off = (grads & OOMB_LCE_GRAD_X) ? sizeof(float) * (size_t) (w->ne[0] * oomb_nrows(x)) : 0;
            if (!(grads & OOMB_LCE_GRAD_W) || M->view_offs != off || oomb_nelements(M) != w->ne[0] * w->ne[1]) continue;
            if (read_besides_view(g, P, M)) continue;
        } else if (M->op == OOMB_OP_VIEW && M->view_src && M->view_src->op == OOMB_OP_RMS_NORM_MUL_BACK) {
            // the dx part (at offset 0, x's element count) of an rms_norm_mul_back packed with dw; P's other readers
            // only views of its dw part
            if (!norm_on) continue;
            P = M->view_src;
            if (!P->op_params[1] || M->view_offs != 0 || !P->src[0] || oomb_nelements(M) != oomb_nelements(P->src[0])) continue;
            if (read_besides_view(g, P, M)) continue;
        } else if (M->op == OOMB_OP_RMS_NORM_MUL_BACK && !M->view_src) {
            if (!norm_on || M->op_params[1]) continue;  // dx alone: M itself
        } else if (M->op != OOMB_OP_MUL_MAT || M->view_src) {
            continue;
        }
        if ((P->flags & pinned) || !P->buffer || !P->buffer->arena) continue;
        auto it = index.find(P);
        if (it == index.end() || it->second >= j || j - it->second > 256) continue;
        const size_t i = it->second;
        if (C->type != OOMB_TYPE_F32 || M->type != OOMB_TYPE_F32 || !oomb_is_contiguous(C) || !oomb_is_contiguous(M) || !oomb_are_same_shape(C, M))
            continue;
        // by memory, not by tensor (two tensors can share bytes outside the allocator's plan)
        const oomb_tensor * cb = base(C);
        bool operand = false;
        for (int q = 0; q < OOMB_MAX_SRC; q++) operand = operand || (P->src[q] && oomb::tensors_overlap(P->src[q], C));
        if (operand) continue;
        bool touched = false;
        for (size_t k = i + 1; k < j && !touched; k++) {
            const oomb_tensor * t = g->nodes[k];
            if (op_is_layout_only(t->op)) continue;  // a view (e.g. of C) computes nothing; its readers are checked
            // an op that may write memory it does not name, or any node on C's bytes or base
            touched = !op_writes_only_result(t->op) || base(t) == cb || oomb::tensors_overlap(t, C);
            for (int q = 0; q < OOMB_MAX_SRC && !touched; q++) touched = t->src[q] && (base(t->src[q]) == cb || oomb::tensors_overlap(t->src[q], C));
        }
        if (touched) continue;
        if (c.fuse_acc.empty()) {
            c.fuse_acc.assign(n, nullptr);
            c.fuse_at.assign(n, nullptr);
            c.fuse_skip.assign(n, 0);
        }
        c.fuse_acc[i] = (float *) C->data;
        c.fuse_at[i] = A;
        c.fuse_skip[j] = 1;
        c.n_fused++;
        if (add_in_place) c.n_fused_add++;
    }
}

// Sums and biases in the GEMM's epilogue (cuBLASLt, cuda/mul-mat.cu): an ADD node A = add(X, M) or
// add(M, X), with M a MUL_MAT product and X of M's shape, or A = add(M, b) with b an f32 vector of M's rows
// (broadcast over the columns: the q / k / v biases), runs as M's GEMM writing A's bytes: D = product + X
// (cuBLASLt's C apart from D) or + b (its bias epilogue). This takes the sums version 16's beta = 1 cannot:
// A not placed in X's bytes because X stays live (the residual adds, whose input the norms' backward
// reads) and the bias adds (a vector, not a matrix of M's shape). Conditions: the graph is whole; A is
// contiguous f32, not a view, and not already fused; M is a contiguous f32 arena product (its bytes are
// never written now, so nothing else may read them), read only by A, unpinned, of A's shape, a single GEMM
// (a 2-D); A's bytes overlap neither M's operands nor X (A in X's bytes is the in-place case above); and
// only views lie between M and A. That last condition is what makes the early write safe: A's bytes may
// hold a tensor until A's own turn (the allocator reuses memory by position), and with no computing node
// between, the only tensors alive there until A are A's operands, M's operands and whatever M's own bytes
// are. Per node of M: c.fuse_epi; A goes in c.fuse_skip (cleared again by the product if cuBLASLt has no
// algorithm for its shape: then M runs unfused and A runs). OOMB_CUDA_FUSE_EPI=0 (or OOMB_CUDA_FUSE=0)
// turns it off. bench/NOTES.md "Sums and biases in the GEMM's epilogue".
void fuse_epilogues(oomb_cuda_ctx & c, const oomb_cgraph * g, graph_uses & u) {
    c.fuse_epi.clear();
    if (g->is_view || env_flag_off("OOMB_CUDA_FUSE") || env_flag_off("OOMB_CUDA_FUSE_EPI")) return;
    const size_t n = g->nodes.size();
    auto & readers = u.readers;
    auto & index = u.index;
    const int32_t pinned = OOMB_TENSOR_FLAG_INPUT | OOMB_TENSOR_FLAG_OUTPUT | OOMB_TENSOR_FLAG_PARAM | OOMB_TENSOR_FLAG_LOSS;
    for (size_t j = 0; j < n; j++) {
        const oomb_tensor * A = g->nodes[j];
        if (A->op != OOMB_OP_ADD || A->view_src || !A->data || A->type != OOMB_TYPE_F32 || !oomb_is_contiguous(A)) continue;
        if (!c.fuse_skip.empty() && c.fuse_skip[j]) continue;
        for (int w = 1; w >= 0; w--) {
            const oomb_tensor * M = A->src[w], * X = A->src[1 - w];
            if (!M || !X || M->op != OOMB_OP_MUL_MAT || M->view_src || (M->flags & pinned) || readers[M] != 1) continue;
            if (!M->buffer || !M->buffer->arena || !M->data || M->type != OOMB_TYPE_F32 || !oomb_is_contiguous(M) ||
                !oomb_are_same_shape(M, A))
                continue;
            const oomb_tensor * a = M->src[0];
            if (!a || a->ne[2] != 1 || a->ne[3] != 1) continue;  // a batched product is several GEMMs
            if (X->type != OOMB_TYPE_F32 || !X->data || !oomb_is_contiguous(X)) continue;
            const bool full = oomb_are_same_shape(X, M);
            const bool bias = !full && w == 0 && X->ne[0] == M->ne[0] && oomb_nelements(X) == X->ne[0];
            if (!full && !bias) continue;
            auto it = index.find(M);
            if (it == index.end() || it->second >= j) continue;
            const size_t i = it->second;
            if (!c.fuse_acc.empty() && c.fuse_acc[i]) continue;
            bool between = false;
            for (size_t k = i + 1; k < j && !between; k++) between = !op_is_layout_only(g->nodes[k]->op);
            if (between || oomb::tensors_overlap(A, X)) continue;
            bool operand = false;
            for (int q = 0; q < OOMB_MAX_SRC; q++) operand = operand || (M->src[q] && oomb::tensors_overlap(M->src[q], A));
            if (operand) continue;
            if (c.fuse_epi.empty()) c.fuse_epi.assign(n, oomb_cuda_ctx::epilogue{});
            if (c.fuse_skip.empty()) c.fuse_skip.assign(n, 0);
            oomb_cuda_ctx::epilogue & e = c.fuse_epi[i];
            e.add = A;
            e.at = j;
            e.c = full ? (const float *) X->data : nullptr;
            e.bias = bias ? (const float *) X->data : nullptr;
            c.fuse_skip[j] = 1;
            break;
        }
    }
}

// Fused linear cross-entropy: a LINEAR_CROSS_ENTROPY node F and the LINEAR_CROSS_ENTROPY_BACK node B
// that reads F's log-sum-exp tail run as one pass at B (oomb_cuda_linear_ce_fused): the logits are
// computed once for the loss and the gradients, not once in F and again in B's tiles (7B at chunk
// 2048: 4 products of the [V, 2048] logits' size -> 3). F's result is then written at B instead of
// at F, so F is fused only when nothing can tell: the graph is whole (not an oomb_graph_view part);
// B reads w, x and labels of F (the same tensors) with F's ignore_index, and its lse operand is F's
// tail; w is bf16 with unit-stride rows (the fused pass reads it in place); and no node between F and
// B (views aside) reads or writes F's bytes (a loss scaled or read before B keeps the ops apart),
// writes w's, x's or labels' bytes, or may write memory it does not return. dloss may come from any
// node before B. Label errors are then reported against B (linear_cross_entropy_back), and a graph
// stopped between F and B (abort callback, fault) leaves F's result unwritten. The fused pass picks
// its own row blocks (1.25 GiB of logits at most; a vocabulary tile set on F or B caps them at the
// tiled path's [tile, N], oomb_cuda_linear_ce_fused_rows).
// On by default since 2026-12-05 (bench/NOTES.md "The LM head": its GPU tests at 4e5a986 agreed with
// the separate ops on an H100, the 0.5B step +2.7 %); OOMB_CUDA_FUSE_LCE=0 (or OOMB_CUDA_FUSE=0) runs
// the two ops apart. Not fused either when another operand of B (dloss) is F's bytes. Fills
// c.fuse_lce / c.fuse_skip.
void fuse_linear_ce(oomb_cuda_ctx & c, const oomb_cgraph * g) {
    c.fuse_lce.clear();
    if (g->is_view || env_flag_off("OOMB_CUDA_FUSE") || env_flag_off("OOMB_CUDA_FUSE_LCE")) return;
    const size_t n = g->nodes.size();
    std::unordered_map<const oomb_tensor *, size_t> index;
    for (size_t i = 0; i < n; i++)
        if (g->nodes[i]->op == OOMB_OP_LINEAR_CROSS_ENTROPY) index[g->nodes[i]] = i;
    if (index.empty()) return;
    auto base = [](const oomb_tensor * t) { return t->view_src ? t->view_src : t; };
    for (size_t j = 0; j < n; j++) {
        oomb_tensor * B = g->nodes[j];
        const oomb_tensor * lse = B->op == OOMB_OP_LINEAR_CROSS_ENTROPY_BACK ? B->src[4] : nullptr;
        if (!lse || lse->op != OOMB_OP_VIEW || !lse->view_src) continue;
        oomb_tensor * F = lse->view_src;
        auto it = index.find(F);
        if (it == index.end() || it->second >= j) continue;
        const size_t i = it->second;
        const oomb_tensor * w = F->src[0], * x = F->src[1], * labels = F->src[2];
        const int64_t N = oomb_nrows(x);
        if (B->src[0] != w || B->src[1] != x || B->src[2] != labels || B->op_params[0] != F->op_params[0]) continue;
        if (lse->view_offs != 2 * sizeof(float) || oomb_nelements(lse) != N || !oomb_is_contiguous(lse)) continue;
        if (!oomb_cuda_linear_ce_fusable(w) || !oomb_is_contiguous(F) || !F->data || !B->data) continue;
        // B's other operands (dloss above all) must not be F's bytes: the pass reads them before it writes F
        bool aliased = false;
        for (int q = 0; q < OOMB_MAX_SRC; q++)
            if (q != 4 && B->src[q]) aliased = aliased || base(B->src[q]) == F || oomb::tensors_overlap(B->src[q], F);
        if (aliased) continue;
        bool touched = false;
        for (size_t k = i + 1; k < j && !touched; k++) {
            const oomb_tensor * t = g->nodes[k];
            if (op_is_layout_only(t->op)) continue;
            touched = !op_writes_only_result(t->op) || base(t) == F || oomb::tensors_overlap(t, F);
            for (const oomb_tensor * u : {w, x, labels}) touched = touched || oomb::tensors_overlap(t, u);
            for (int q = 0; q < OOMB_MAX_SRC && !touched; q++) touched = t->src[q] && (base(t->src[q]) == F || oomb::tensors_overlap(t->src[q], F));
        }
        if (touched) continue;
        if (c.fuse_skip.empty()) c.fuse_skip.assign(n, 0);
        if (c.fuse_lce.empty()) c.fuse_lce.assign(n, nullptr);
        c.fuse_lce[j] = F;
        c.fuse_skip[i] = 1;
        index.erase(it);  // one backward per forward
    }
}

void cuda_graph_compute(oomb_backend_t b, oomb_cgraph * g) {
    oomb_cuda_ctx * c = ctx_of(b);
    set_device(c);
    // the host may have written any tensor since the last graph (not between the parts of one)
    if (!g->continuation) c->bf16_copies_clear();
    if (c->check_err) {
        // a previous graph failed before its recorded errors were read: drop them (stream-ordered)
        CUDA_CHECK(cudaMemsetAsync(c->d_err, 0, sizeof(oomb_cuda_err_rec), c->stream));
        c->check_err = false;
    }
    {
        // the fusion passes' maps, only where they can fuse (not for the parts of a split graph)
        const bool fuse = !g->is_view && !env_flag_off("OOMB_CUDA_FUSE");
        graph_uses u;
        if (fuse) u.build(g);
        fuse_accumulations(*c, g, u);
        fuse_epilogues(*c, g, u);
    }
    fuse_linear_ce(*c, g);
    if (c->profile) {
        while (c->prof_events.size() < 2 * g->nodes.size()) {
            cudaEvent_t e;
            CUDA_CHECK(cudaEventCreate(&e));
            c->prof_events.push_back(e);
        }
    }
    for (size_t i = 0; i < g->nodes.size(); i++) {
        oomb_tensor * node = g->nodes[i];
        if (node->op == OOMB_OP_NONE || node->op == OOMB_OP_VIEW || node->op == OOMB_OP_RESHAPE || node->op == OOMB_OP_PERMUTE ||
            node->op == OOMB_OP_TRANSPOSE) {
            continue;
        }
        oomb::backend_begin_node(b, (int) i);
        if (c->profile) CUDA_CHECK(cudaEventRecord(c->prof_events[2 * i], c->stream));
        c->cur_node = (int) i;
        if (c->fuse_skip.empty() || !c->fuse_skip[i]) compute_node(*c, node);  // (a fused add_inplace: its product added already)
        c->bf16_copies_after(node);
        if (!c->fuse_at.empty() && c->fuse_at[i]) c->bf16_copies_after(c->fuse_at[i]);  // a fused product wrote C's bytes here
        if (!c->fuse_epi.empty() && c->fuse_epi[i].add) c->bf16_copies_after(c->fuse_epi[i].add);  // and A's (epilogue)
        if (!c->fuse_lce.empty() && c->fuse_lce[i]) c->bf16_copies_after(c->fuse_lce[i]);  // and a fused forward's
        if (c->profile) CUDA_CHECK(cudaEventRecord(c->prof_events[2 * i + 1], c->stream));
    }
    if (c->profile) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        for (size_t i = 0; i < g->nodes.size(); i++) {
            const oomb_op op = g->nodes[i]->op;
            if (op == OOMB_OP_NONE || op == OOMB_OP_VIEW || op == OOMB_OP_RESHAPE || op == OOMB_OP_PERMUTE || op == OOMB_OP_TRANSPOSE) continue;
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, c->prof_events[2 * i], c->prof_events[2 * i + 1]));
            c->prof_ms[op] += ms;
            c->prof_count[op]++;
            if (c->profile_level >= 2) {
                auto & d = c->prof_detail[profile_key(g->nodes[i])];
                d.first += ms;
                d.second++;
            }
        }
    }
    if (c->check_err) check_recorded_error(b, *c, g);
}

void cuda_free_backend(oomb_backend_t b) {
    oomb_cuda_ctx * c = ctx_of(b);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cudaStreamSynchronize(c->copy_stream);
    cudaStreamSynchronize(c->copy_out_stream);
    if (c->profile) {
        double total = 0;
        for (int op = 0; op < OOMB_OP_COUNT; op++) total += c->prof_ms[op];
        fprintf(stderr, "oomb CUDA profile (GPU time per op, %.1f ms in all%s):\n", total,
                c->prof_resets ? ", since the last oomb_backend_profile_reset" : "");
        for (int pass = 0; pass < OOMB_OP_COUNT; pass++) {
            int best = -1;
            for (int op = 0; op < OOMB_OP_COUNT; op++)
                if (c->prof_count[op] > 0 && (best < 0 || c->prof_ms[op] > c->prof_ms[best])) best = op;
            if (best < 0) break;
            fprintf(stderr, "  %-24s %10.1f ms %6.1f%% %8lld calls\n", oomb_op_name((oomb_op) best), c->prof_ms[best],
                    100.0 * c->prof_ms[best] / (total > 0 ? total : 1), (long long) c->prof_count[best]);
            c->prof_count[best] = 0;
        }
        if (!c->prof_detail.empty()) {
            std::vector<std::pair<double, std::string>> rows;
            for (const auto & kv : c->prof_detail) {
                char buf[64];
                snprintf(buf, sizeof(buf), "%9.1f ms %7lld calls  ", kv.second.first, (long long) kv.second.second);
                rows.push_back({kv.second.first, buf + kv.first});
            }
            std::sort(rows.begin(), rows.end(), [](const auto & x, const auto & y) { return x.first > y.first; });
            fprintf(stderr, "oomb CUDA profile by op and operands (dst <- srcs; T: not contiguous):\n");
            for (size_t i = 0; i < rows.size() && i < 40; i++) fprintf(stderr, "  %s\n", rows[i].second.c_str());
        }
        for (cudaEvent_t e : c->prof_events) cudaEventDestroy(e);
    }
    for (int i = 0; i < oomb_cuda_ctx::N_SLOTS; i++) {
        if (c->slot_ptr[i]) cudaFreeAsync(c->slot_ptr[i], c->stream);
    }
    cudaStreamSynchronize(c->stream);
    c->lt_plans.clear();
    if (c->cublaslt) cublasLtDestroy(c->cublaslt);
    if (c->cublas) cublasDestroy(c->cublas);
    if (c->cublas_ws) cudaFree(c->cublas_ws);
    if (c->d_err) cudaFree(c->d_err);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    if (c->copy_out_stream) cudaStreamDestroy(c->copy_out_stream);
    delete c;
    delete b;
}

// oomb_backend_graph_scratch: the linear_cross_entropy kernels' slots (the largest request of each over
// g's nodes, as scratch blocks). A backward whose lse is a view of a forward of g may run fused or apart
// (fuse_linear_ce decides at compute, from more than the shapes: a node between them touching the forward,
// dloss of the forward's bytes, a graph computed in oomb_graph_view parts as a streamed KV cache does), so
// it counts both ways, slot by slot: an upper bound (at production sizes the tiled dlogits slot adds at
// most 128 MiB to the fused pass's block; a streamed graph, never fused, is over-counted by up to the
// fused block less the tiles: ~0.9 GiB at V = 152K and chunk 2048 with the default 1.25 GiB cap, more with a raised one).
size_t cuda_graph_scratch(oomb_backend_t b, const oomb_cgraph * g) {
    const oomb_cuda_ctx & c = *ctx_of(b);
    size_t slot[5] = {0, 0, 0, 0, 0};
    const bool fuse = !g->is_view && !env_flag_off("OOMB_CUDA_FUSE") && !env_flag_off("OOMB_CUDA_FUSE_LCE");
    std::unordered_set<const oomb_tensor *> nodes(g->nodes.begin(), g->nodes.end());
    auto count = [&](const oomb_tensor * t, const oomb_tensor * F) {
        size_t b[5];
        oomb_cuda_linear_ce_scratch(c, t, F, b);
        for (int i = 0; i < 5; i++) slot[i] = std::max(slot[i], b[i]);
    };
    for (const oomb_tensor * t : g->nodes) {
        if (t->op != OOMB_OP_LINEAR_CROSS_ENTROPY_BACK) continue;
        const oomb_tensor * lse = t->src[4];
        const oomb_tensor * F = lse && lse->op == OOMB_OP_VIEW ? lse->view_src : nullptr;
        const bool fused = fuse && F && F->op == OOMB_OP_LINEAR_CROSS_ENTROPY && nodes.count(F) && oomb_cuda_linear_ce_fusable(t->src[0]);
        count(t, nullptr);  // apart (the forward's tiles: below)
        if (fused) count(t, F);
    }
    for (const oomb_tensor * t : g->nodes)
        if (t->op == OOMB_OP_LINEAR_CROSS_ENTROPY) count(t, nullptr);
    size_t sum = 0;
    for (size_t b : slot)
        if (b) sum += oomb_cuda_ctx::scratch_block_bytes(b);
    return sum;
}

// oomb_backend_profile_reset: the per-op times so far dropped (graph_compute has read its events before it
// returned, so none is pending)
bool cuda_profile_reset(oomb_backend_t b) {
    oomb_cuda_ctx * c = ctx_of(b);
    if (!c->profile) return false;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int op = 0; op < OOMB_OP_COUNT; op++) {
        c->prof_ms[op] = 0.0;
        c->prof_count[op] = 0;
    }
    c->prof_detail.clear();
    c->prof_resets++;
    return true;
}

// oomb_backend_set_linear_cross_entropy_block: the fused pass's logits block cap (0: the default)
bool cuda_set_lce_block(oomb_backend_t b, size_t bytes) {
    oomb_cuda_ctx * c = ctx_of(b);
    c->lce_block_bytes = bytes;
    c->lce_bytes_fit = 0;  // a new cap: try its size again
    return true;
}

const oomb_backend_i k_cuda_iface = {
    /* name          */ cuda_name,
    /* is_host       */ cuda_is_host,
    /* alloc         */ cuda_alloc,
    /* free_mem      */ cuda_free_mem,
    /* set           */ cuda_set,
    /* get           */ cuda_get,
    /* memset_mem    */ cuda_memset,
    /* graph_compute */ cuda_graph_compute,
    /* synchronize   */ cuda_synchronize,
    /* free_backend  */ cuda_free_backend,
    /* memory        */ cuda_memory,
    /* placement_error */ cuda_placement_error,
    /* alloc_host    */ cuda_alloc_host,
    /* free_host     */ cuda_free_host,
    /* copy_async    */ cuda_copy_async,
    /* queue_synchronize */ cuda_queue_synchronize,
    /* event_new     */ cuda_event_new,
    /* event_free    */ cuda_event_free,
    /* event_record  */ cuda_event_record,
    /* event_wait    */ cuda_event_wait,
    /* event_synchronize */ cuda_event_synchronize,
    /* event_query   */ cuda_event_query,
    /* event_new_timed */ cuda_event_new_timed,
    /* event_elapsed_ms */ cuda_event_elapsed_ms,
    /* graph_scratch */ cuda_graph_scratch,
    /* profile_reset */ cuda_profile_reset,
    /* set_lce_block */ cuda_set_lce_block,
};

} // namespace

bool oomb_cuda_available(void) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return n > 0;
}

oomb_backend_t oomb_backend_cuda_init(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        fprintf(stderr, "oomb: no CUDA GPU available (%s); CUDA backend not created\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        cudaGetLastError();
        return nullptr;
    }
    if (device < 0 || device >= n) {
        fprintf(stderr, "oomb: CUDA device %d does not exist (%d visible)\n", device, n);
        return nullptr;
    }
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        fprintf(stderr, "oomb: cudaSetDevice(%d) failed: %s\n", device, cudaGetErrorString(e));
        cudaGetLastError();
        return nullptr;
    }
    auto * c = new oomb_cuda_ctx();
    c->device = device;
    // OOMB_CUDA_SYNC, OOMB_CUDA_PROFILE: numbers (0 off); anything else is said on stderr and read as 0 (a typo
    // does not pass silently, nor does it take the backend away: the run goes on without the option)
    auto env_number = [](const char * name) -> long {
        const char * s = getenv(name);
        if (!s || !*s) return 0;
        char * end = nullptr;
        errno = 0;
        const long v = strtol(s, &end, 10);
        if (errno != 0 || *end != '\0') {
            fprintf(stderr, "oomb: cuda: %s=%s is not a number (0: off); taken as 0\n", name, s);
            return 0;
        }
        return v;
    };
    c->sync_each = env_number("OOMB_CUDA_SYNC") != 0;
    c->profile_level = (int) env_number("OOMB_CUDA_PROFILE");
    c->profile = c->profile_level != 0;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_out_stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&c->cublas));
    CUBLAS_CHECK(cublasSetStream(c->cublas, c->stream));
    c->cublas_ws_size = (size_t) 32 << 20;
    CUDA_CHECK(cudaMalloc(&c->cublas_ws, c->cublas_ws_size));
    CUBLAS_CHECK(cublasSetWorkspace(c->cublas, c->cublas_ws, c->cublas_ws_size));
    CUBLAS_CHECK(cublasLtCreate(&c->cublaslt));
    CUDA_CHECK(cudaMalloc((void **) &c->d_err, sizeof(oomb_cuda_err_rec)));
    CUDA_CHECK(cudaMemsetAsync(c->d_err, 0, sizeof(oomb_cuda_err_rec), c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    auto * b = new oomb_backend();
    b->iface = &k_cuda_iface;
    b->ctx = c;
    c->buft_name = "CUDA" + std::to_string(device);
    oomb::backend_init_buffer_types(b, c->buft_name.c_str(), "CUDA_Host", false);
    return b;
}

// Test hook: the next asynchronous copy of this CUDA backend fails as if cudaMemcpyAsync had
// returned `cuda_error` (the same error path as a real fault: a status, not an abort).
void oomb_cuda_debug_fail_next_copy(oomb_backend_t backend, int cuda_error) {
    if (!backend || backend->iface != &k_cuda_iface) oomb_error("cuda_debug_fail_next_copy: not a CUDA backend");
    ctx_of(backend)->fail_next_copy = (cudaError_t) cuda_error;
}

// Test hook: scratch requests above `bytes` fail as if the device were out of memory (0: no limit), so
// that the callers' fallbacks (the fused linear cross-entropy's smaller row blocks) can be tested.
// Also forgets the size a fused pass fell back to (lce_bytes_fit), so the next pass starts afresh.
void oomb_cuda_debug_set_scratch_limit(oomb_backend_t backend, size_t bytes) {
    oomb_cuda_ctx & c = oomb_cuda_ctx_of(backend);
    c.debug_scratch_limit = bytes;
    c.lce_bytes_fit = 0;
}

// Test hook: the scratch blocks the linear_cross_entropy kernels' slots (SLOT_K0..SLOT_K0 + 4; others share the first
// two with small requests) asked for since the last reset, as oomb_backend_graph_scratch counts them; reset: forget them.
size_t oomb_cuda_debug_lce_scratch(oomb_backend_t backend, bool reset) {
    oomb_cuda_ctx & c = oomb_cuda_ctx_of(backend);
    size_t sum = 0;
    for (int s = oomb_cuda_ctx::SLOT_K0; s < oomb_cuda_ctx::SLOT_K0 + 5; s++) {
        if (c.slot_req[s]) sum += oomb_cuda_ctx::scratch_block_bytes(c.slot_req[s]);
        if (reset) c.slot_req[s] = 0;
    }
    return sum;
}

// Test hook: the rows per block of the last fused linear cross-entropy pass (0: none ran).
int64_t oomb_cuda_debug_last_lce_rows(oomb_backend_t backend) { return oomb_cuda_ctx_of(backend).last_lce_rows; }

// Test hook: how many add_inplace nodes (and in-place adds) this backend has fused into their products
// (fuse_accumulations); oomb_cuda_debug_fused_add_count: of them, the in-place adds.
int64_t oomb_cuda_debug_fused_count(oomb_backend_t backend) { return oomb_cuda_ctx_of(backend).n_fused; }
int64_t oomb_cuda_debug_fused_add_count(oomb_backend_t backend) { return oomb_cuda_ctx_of(backend).n_fused_add; }
// oomb_cuda_debug_fused_epi_count: products that wrote their ADD's result through the epilogue (fuse_epilogues).
int64_t oomb_cuda_debug_fused_epi_count(oomb_backend_t backend) { return oomb_cuda_ctx_of(backend).n_fused_epi; }

// Test hook: how many linear_cross_entropy forward / backward pairs this backend has run as one pass
// (fuse_linear_ce).
int64_t oomb_cuda_debug_fused_lce_count(oomb_backend_t backend) { return oomb_cuda_ctx_of(backend).n_fused_lce; }

oomb_cuda_ctx & oomb_cuda_ctx_of(oomb_backend_t backend) {
    if (!backend || strcmp(oomb_backend_name(backend), "CUDA") != 0)
        oomb_error("oomb_cuda_ctx_of: %s is not a CUDA backend", backend ? oomb_backend_name(backend) : "NULL");
    return *(oomb_cuda_ctx *) backend->ctx;
}
