// Internal structures shared by the core, the allocator and the backends.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"

#include <cstring>
#include <deque>
#include <string>
#include <unordered_set>
#include <vector>

struct oomb_context {
    std::deque<oomb_tensor> tensors;   // stable addresses
    std::vector<void *>     host_allocs; // context-owned tensor data (when !no_alloc)
    std::deque<oomb_cgraph> graphs;
    size_t max_tensors = 0;
    bool   no_alloc    = false;
};

struct oomb_cgraph {
    size_t size = OOMB_DEFAULT_GRAPH_SIZE;
    std::vector<oomb_tensor *> nodes;  // computed, in execution order
    std::vector<oomb_tensor *> leafs;  // op == NONE
    std::unordered_set<const oomb_tensor *> visited;
    uint64_t version = 0;              // bumped on every change (the allocator keys its plan on it)
    uint64_t alloc_id = 0;             // the graph allocator that placed its tensors (0: none)
    uint64_t alloc_gen = 0;            // ... and the plan generation it placed them with
    // A part of a graph computed after the parts before it (oomb_graph_view with i0 > 0, or a graph
    // the engine runs between two parts): backends keep what they cached about tensors the earlier
    // parts did not write (the CUDA backend's bf16 copies of weights) instead of starting afresh.
    bool continuation = false;
    // A part of another graph (oomb_graph_view): a node after the part may read what this part
    // computes, so a backend must not drop a result here (the CUDA backend's fused accumulation).
    bool is_view = false;
};

// Backend interface (one implementation per backend).
struct oomb_backend_i {
    const char * (*name)(oomb_backend_t b);
    bool   (*is_host)(oomb_backend_t b);
    void * (*alloc)(oomb_backend_t b, size_t size);           // returns base or NULL
    void   (*free_mem)(oomb_backend_t b, void * base);
    void   (*set)(oomb_backend_t b, void * dst, const void * src, size_t size);   // host -> backend memory
    void   (*get)(oomb_backend_t b, void * dst, const void * src, size_t size);   // backend memory -> host
    void   (*memset_mem)(oomb_backend_t b, void * dst, uint8_t value, size_t size);
    void   (*graph_compute)(oomb_backend_t b, oomb_cgraph * g);
    void   (*synchronize)(oomb_backend_t b);
    void   (*free_backend)(oomb_backend_t b);
    bool   (*memory)(oomb_backend_t b, size_t * used, size_t * total);  // NULL: not known
    // NULL when the backend's kernels can read and write t's memory, else why not (graph
    // validation puts it in the error: "... is <reason>").
    const char * (*placement_error)(oomb_backend_t b, const oomb_tensor * t);

    // --- v2 (NULL members: host memory / synchronous fallbacks in backend.cpp) ---
    void * (*alloc_host)(oomb_backend_t b, size_t size);     // pinned host memory (CUDA: cudaHostAlloc)
    void   (*free_host)(oomb_backend_t b, void * base);
    // asynchronous copies on queue q; pointers may be host (pinned or not) or this backend's device memory
    void   (*copy_async)(oomb_backend_t b, enum oomb_queue q, void * dst, const void * src, size_t size);
    void   (*queue_synchronize)(oomb_backend_t b, enum oomb_queue q);
    void * (*event_new)(oomb_backend_t b);                    // the backend's event object
    void   (*event_free)(oomb_backend_t b, void * ev);
    void   (*event_record)(oomb_backend_t b, void * ev, enum oomb_queue q);
    void   (*event_wait)(oomb_backend_t b, void * ev, enum oomb_queue q);   // queue q of b waits for ev (of b's kind)
    void   (*event_synchronize)(oomb_backend_t b, void * ev);
    bool   (*event_query)(oomb_backend_t b, void * ev);
    void * (*event_new_timed)(oomb_backend_t b);              // an event that records a time
    float  (*event_elapsed_ms)(oomb_backend_t b, void * start, void * end);
    // --- v3 (NULL: 0) ---
    size_t (*graph_scratch)(oomb_backend_t b, const oomb_cgraph * g);  // oomb_backend_graph_scratch
    // --- v4 (NULL: nothing to do) ---
    bool   (*profile_reset)(oomb_backend_t b);  // oomb_backend_profile_reset
    // --- v5 (NULL: no such block) ---
    bool   (*set_lce_block)(oomb_backend_t b, size_t bytes);  // oomb_backend_set_linear_cross_entropy_block
};

struct oomb_buffer_type {
    oomb_backend_t backend = nullptr;
    const char * name = "";
    bool is_host = false;       // host memory (for a non-host backend: pinned)
    bool device = true;         // the backend's own (device) memory
    size_t alignment = 256;
};

struct oomb_event {
    oomb_backend_t backend;
    void * ev;                  // NULL: completes at once (synchronous backends)
    bool timed = false;         // oomb_event_new_timed
};

struct oomb_backend {
    const oomb_backend_i * iface;
    void * ctx;
    // graph_compute status (backend.cpp): the node being computed, the last failure's message,
    // the abort callback polled before every node
    int cur_node = -1;
    std::string last_error;
    oomb_abort_callback_t abort_cb = nullptr;
    void * abort_data = nullptr;
    oomb_buffer_type buft_device, buft_host;   // set by oomb::backend_init_buffer_types
};

struct oomb_buffer {
    oomb_backend_t backend;
    void * base;
    size_t size;
    oomb_buffer_type * buft;
    bool arena = false;  // a graph allocator's arena (src/alloc.cpp): an unpinned tensor placed there holds its
                         // value only until its last reader in the graph has run
};

namespace oomb {

// Compute-time faults (see oomb-backend.h, "Errors"): while a fault_scope is alive on a thread
// (oomb_backend_graph_compute holds one around the backend's graph_compute), oomb_error and
// oomb::fail throw a compute_fault, which graph_compute turns into its status and last error.
// Outside a scope both report through the error handler.
struct compute_fault {
    enum oomb_status status;
    std::string msg;
};
struct fault_scope {
    fault_scope();
    ~fault_scope();
    fault_scope(const fault_scope &) = delete;
    fault_scope & operator=(const fault_scope &) = delete;
};
bool faults_captured();
[[noreturn]] void fail(enum oomb_status status, const char * fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
// Called by a backend's graph_compute before node i: records the node (for the failure message)
// and polls the abort callback (a fault with OOMB_STATUS_ABORTED when it asks to stop).
void backend_begin_node(oomb_backend_t b, int i);
// Called by a backend's init: its two buffer types, "<name>" (device memory; host memory when
// the backend is a host one) and "<name>_Host" (pinned host memory).
void backend_init_buffer_types(oomb_backend_t b, const char * device_name, const char * host_name, bool backend_is_host);

// Shape string "[a, b, c, d] type" for error messages.
std::string shape_str(const oomb_tensor * t);

// Block types (oomb_type_is_quantized): the dimension along which t's blocks run: 0 for row-major
// blocks, 1 for the transposed view (an oomb_transpose node of row-major blocks: ne [M, K],
// nb[0] = the row bytes, nb[1] = the block bytes), the one layout besides row-major the core makes
// (the autodiff's db = mul_mat(transpose(a), dy)). Metadata alone cannot tell the two apart when
// a row is one block, hence the op.
static inline int quant_block_dim(const oomb_tensor * t) { return t->op == OOMB_OP_TRANSPOSE ? 1 : 0; }
// Contiguous strides for t's type and shape: nb[0] = bytes per block (the element size of plain
// types), nb[1] = the row bytes (ne0 / block size blocks), nb[i] = nb[i-1] * ne[i-1] beyond.
static inline void set_contiguous_nb(oomb_tensor * t) {
    t->nb[0] = oomb_type_size(t->type);
    t->nb[1] = t->nb[0] * (size_t) (t->ne[0] / oomb_blck_size(t->type));
    for (int i = 2; i < 4; i++) t->nb[i] = t->nb[i - 1] * (size_t) t->ne[i - 1];
}
// A block-type 2-D a of mul_mat as its kernels read it: row-major blocks (nb[0] = block bytes,
// rows nb[1] >= the row bytes apart) or their transposed view (quant_block_dim 1).
static inline bool quant_mat_layout_ok(const oomb_tensor * t) {
    const size_t ts = oomb_type_size(t->type);
    const int d = quant_block_dim(t);
    const int64_t K = t->ne[d], R = t->ne[1 - d];
    if (K % oomb_blck_size(t->type) != 0) return false;
    const size_t rs = ts * (size_t) (K / oomb_blck_size(t->type));
    return t->nb[d] == ts && (R <= 1 || t->nb[1 - d] >= rs);
}

// Data pointer of element (i0, i1, i2, i3).
static inline void * elem_ptr(const oomb_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (char *) t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static inline float get_op_f32(const oomb_tensor * t, int i) { float f; std::memcpy(&f, &t->op_params[i], 4); return f; }
static inline void  set_op_f32(oomb_tensor * t, int i, float f) { std::memcpy(&t->op_params[i], &f, 4); }

// false when g's tensors were placed by a graph allocator that has since planned another graph
// or been freed (the tensors' memory then belongs to something else).
bool graph_alloc_is_current(const oomb_cgraph * g);

// true when t's data lives in host memory (context memory or a host backend's buffer).
bool tensor_is_host(const oomb_tensor * t);

// Op nodes for op constructors outside oomb.cpp (src/oomb/sparse.cpp): a new node of op with its
// own memory, and a node of op that is a view of all of a (an op writing a in place).
oomb_tensor * new_op_node(oomb_context * ctx, enum oomb_op op, enum oomb_type type, const int64_t ne[4]);
oomb_tensor * view_op_node(oomb_context * ctx, oomb_tensor * a, enum oomb_op op);

// The tensor whose memory t uses (follows view_src).
static inline oomb_tensor * mem_owner(oomb_tensor * t) { return t->view_src ? t->view_src : t; }

// Ops whose kernels may write their result over src[0] (same size and type, each output element
// depending only on reads of its own row done before that row is written).
bool op_can_inplace(enum oomb_op op);
// Whether op reads src[i] (cpy's src[1] and repeat's / repeat_back's src[1] only give a
// destination or a shape).
// Nodes that compute nothing (leafs and views of their source's memory).
static inline bool op_is_view(enum oomb_op op) {
    return op == OOMB_OP_NONE || op == OOMB_OP_VIEW || op == OOMB_OP_RESHAPE || op == OOMB_OP_PERMUTE || op == OOMB_OP_TRANSPOSE;
}
static inline bool op_reads_src(enum oomb_op op, int i) {
    return !(i == 1 && (op == OOMB_OP_CPY || op == OOMB_OP_REPEAT || op == OOMB_OP_REPEAT_BACK));
}
// Whether a backend's graph_compute prepares src[i] of op (a contiguous / in-place-safe copy where
// needed) before calling the kernel: not for sources the op does not read, i32 sources, the
// optimizer steps (they update their sources in place by design) and paged attention (its kernels
// read node->src themselves; the forward writes the pools; the merge of partial results updates
// src[0] in place and takes only contiguous operands). Shared by the CPU and CUDA backends.
static inline bool op_prepares_src(enum oomb_op op, int i, const oomb_tensor * src) {
    if (!op_reads_src(op, i) || src->type == OOMB_TYPE_I32) return false;
    switch (op) {
        case OOMB_OP_ADAMW_STEP: case OOMB_OP_SGD_STEP: case OOMB_OP_PAGED_ATTN: case OOMB_OP_PAGED_ATTN_BACK:
        case OOMB_OP_PAGED_ATTN_MERGE:
            return false;
        default:
            return true;
    }
}
// The sources every backend kernel of op takes: src[0..n_required) must be present and
// src[0..n_f32) f32 (the rest may be f16/bf16/i32 as the op allows). Both backends check them
// before dispatching (check_op_sources), so the kernels' calls carry no per-op checks.
struct op_src_req { int n_required; int n_f32; };
static inline op_src_req op_sources_required(enum oomb_op op) {
    switch (op) {
        case OOMB_OP_CONT: case OOMB_OP_CPY: case OOMB_OP_CAST:                         return {1, 0};
        case OOMB_OP_FILL:                                                              return {0, 0};
        case OOMB_OP_ADD: case OOMB_OP_SUB: case OOMB_OP_MUL: case OOMB_OP_ADD_INPLACE:
        case OOMB_OP_SILU_BACK: case OOMB_OP_RMS_NORM_BACK:
        case OOMB_OP_SOFT_MAX_BACK: case OOMB_OP_PAGED_ATTN_MERGE: case OOMB_OP_RMS_NORM_MUL: return {2, 2};
        case OOMB_OP_SWIGLU:                                                            return {2, 0};  // f32 or bf16 (the kernels)
        case OOMB_OP_SCALE: case OOMB_OP_SILU: case OOMB_OP_REPEAT: case OOMB_OP_REPEAT_BACK:
        case OOMB_OP_SUM: case OOMB_OP_MEAN: case OOMB_OP_SUM_SQ: case OOMB_OP_RMS_NORM:
        case OOMB_OP_SOFT_MAX:                                                          return {1, 1};
        case OOMB_OP_GET_ROWS: case OOMB_OP_MUL_MAT:                                    return {2, 0};
        case OOMB_OP_GET_ROWS_BACK: case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK:
        case OOMB_OP_CROSS_ENTROPY:                                                     return {2, 1};
        case OOMB_OP_ATTN: case OOMB_OP_LINEAR_CROSS_ENTROPY:                           return {3, 0};
        case OOMB_OP_ATTN_BACK:                                                         return {4, 4};
        case OOMB_OP_RMS_NORM_MUL_BACK:                                                 return {3, 3};
        case OOMB_OP_SWIGLU_BACK:                                                       return {3, 0};  // gate, up f32 or bf16; dy f32
        case OOMB_OP_CROSS_ENTROPY_BACK:                                                return {3, 1};
        case OOMB_OP_LINEAR_CROSS_ENTROPY_BACK:                                         return {4, 0};
        case OOMB_OP_ADAMW_STEP:                                                        return {5, 0};
        case OOMB_OP_SGD_STEP:                                                          return {3, 0};
        default:                                                                        return {0, 0};
    }
}
static inline void check_op_sources(const oomb_tensor * node, const oomb_tensor * const * s) {
    const op_src_req r = op_sources_required(node->op);
    for (int i = 0; i < r.n_required; i++)
        if (!s[i]) oomb_error("%s: node %s is missing src[%d]", oomb_op_name(node->op), shape_str(node).c_str(), i);
    for (int i = 0; i < r.n_f32; i++)
        if (s[i]->type != OOMB_TYPE_F32) oomb_error("%s: %s must be f32", oomb_op_name(node->op), shape_str(s[i]).c_str());
}
// Operands of the copy ops (cont, cpy, cast), checked alike by both backends: the same element
// count; cont keeps the type, cpy / cast convert between float types (f32, f16, bf16) or copy i32.
static inline void check_copy_operands(const char * op, const oomb_tensor * src, const oomb_tensor * dst, bool same_type) {
    if (same_type) {
        if (src->type != dst->type) oomb_error("%s: type of %s differs from result %s", op, shape_str(src).c_str(), shape_str(dst).c_str());
    } else {
        const bool si = src->type == OOMB_TYPE_I32, di = dst->type == OOMB_TYPE_I32;
        if (si != di || (unsigned) src->type >= OOMB_TYPE_COUNT || (unsigned) dst->type >= OOMB_TYPE_COUNT)
            oomb_error("%s: cannot convert %s to %s", op, shape_str(src).c_str(), shape_str(dst).c_str());
    }
    if (oomb_nelements(src) != oomb_nelements(dst))
        oomb_error("%s: element counts differ: %s vs %s", op, shape_str(src).c_str(), shape_str(dst).c_str());
}
// The result layout every backend kernel assumes: f32 (except copies, casts and the optimizer
// steps, which write the parameter's type, and i32 results), unit-stride rows (except copies,
// in-place adds and fills, which take any strides). Errors name the op and the result.
static inline void check_op_result(const oomb_tensor * node) {
    const enum oomb_op op = node->op;
    if (node->type != OOMB_TYPE_I32 && op != OOMB_OP_CPY && op != OOMB_OP_CAST && op != OOMB_OP_CONT &&
        op != OOMB_OP_ADAMW_STEP && op != OOMB_OP_SGD_STEP && node->type != OOMB_TYPE_F32 &&
        !((op == OOMB_OP_MUL || op == OOMB_OP_SWIGLU || op == OOMB_OP_SWIGLU_BACK || op == OOMB_OP_RMS_NORM_MUL || op == OOMB_OP_MUL_MAT) &&
          node->type == OOMB_TYPE_BF16)) {  // *_ext
        oomb_error("%s: result %s must be f32", oomb_op_name(op), shape_str(node).c_str());
    }
    if (op != OOMB_OP_CPY && op != OOMB_OP_ADD_INPLACE && op != OOMB_OP_FILL && node->ne[0] > 1 &&
        node->nb[0] != oomb_type_size(node->type)) {
        oomb_error("%s: result %s must have unit stride in dim 0", oomb_op_name(op), shape_str(node).c_str());
    }
}
// Whether the backends' kernels of op need unit-stride rows (nb0 == element size) in src[i].
static inline bool op_needs_unit_rows(enum oomb_op op, int i) {
    switch (op) {
        case OOMB_OP_RMS_NORM: case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK: case OOMB_OP_SOFT_MAX:
        case OOMB_OP_CROSS_ENTROPY: case OOMB_OP_CROSS_ENTROPY_BACK:
            return i == 0;
        case OOMB_OP_RMS_NORM_BACK: case OOMB_OP_SOFT_MAX_BACK: case OOMB_OP_RMS_NORM_MUL:
            return i <= 1;
        case OOMB_OP_RMS_NORM_MUL_BACK:
            return i <= 2;
        case OOMB_OP_ATTN:
            return i <= 2;
        case OOMB_OP_ATTN_BACK:
            return i <= 3;
        default:
            return false;
    }
}
// a and b view the same memory with the same shape and strides (type sizes equal).
static inline bool tensors_same_layout(const oomb_tensor * a, const oomb_tensor * b) {
    if (a->data != b->data || oomb_type_size(a->type) != oomb_type_size(b->type)) return false;
    for (int i = 0; i < 4; i++) {
        if (a->ne[i] != b->ne[i]) return false;
        if (a->ne[i] > 1 && a->nb[i] != b->nb[i]) return false;
    }
    return true;
}
// The byte ranges spanned by a and b intersect.
static inline bool tensors_overlap(const oomb_tensor * a, const oomb_tensor * b) {
    const size_t na = oomb_nbytes(a), nb = oomb_nbytes(b);
    if (na == 0 || nb == 0) return false;
    const char * a0 = (const char *) a->data, * b0 = (const char *) b->data;
    return a0 < b0 + nb && b0 < a0 + na;
}

} // namespace oomb
