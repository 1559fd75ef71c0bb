// Core of ggml-oomb: types, errors, contexts, tensors, views, op constructors and graphs.
// The backward pass is in backward.cpp, the allocator in alloc.cpp, backends in backend*.cpp.

#include "oomb-impl.h"
#include "oomb/paged-attn-sched.h"
#include "oomb/paged-attn-merge.h"
#include "fp16.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

// Per type: bytes per block, elements per block, ggml / GGUF type id (block sizes: quants.h).
static const size_t k_type_size[OOMB_TYPE_COUNT] = {4, 2, 2, 4, 34, 18, 20, 22, 24, 84, 110, 144, 176, 210};
static const int64_t k_blck_size[OOMB_TYPE_COUNT] = {1, 1, 1, 1, 32, 32, 32, 32, 32, 256, 256, 256, 256, 256};
static const uint32_t k_ggml_type[OOMB_TYPE_COUNT] = {0, 1, 30, 26, 8, 2, 3, 6, 7, 10, 11, 12, 13, 14};
static const char * k_type_name[OOMB_TYPE_COUNT] = {"f32", "f16", "bf16", "i32", "q8_0", "q4_0", "q4_1",
                                                    "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"};

size_t oomb_type_size(enum oomb_type type) {
    if ((unsigned) type >= OOMB_TYPE_COUNT) oomb_error("type_size: unknown tensor type %d", (int) type);
    return k_type_size[type];
}
int64_t oomb_blck_size(enum oomb_type type) {
    if ((unsigned) type >= OOMB_TYPE_COUNT) oomb_error("blck_size: unknown tensor type %d", (int) type);
    return k_blck_size[type];
}
size_t oomb_row_size(enum oomb_type type, int64_t ne0) {
    const int64_t bs = oomb_blck_size(type);
    if (ne0 < 0 || ne0 % bs != 0)
        oomb_error("row_size: %" PRId64 " elements of %s are not a whole number of blocks of %" PRId64, ne0, k_type_name[type], bs);
    return (size_t) (ne0 / bs) * k_type_size[type];
}
bool oomb_type_is_quantized(enum oomb_type type) { return (unsigned) type < OOMB_TYPE_COUNT && k_blck_size[type] > 1; }
uint32_t oomb_type_to_ggml(enum oomb_type type) {
    if ((unsigned) type >= OOMB_TYPE_COUNT) oomb_error("type_to_ggml: unknown tensor type %d", (int) type);
    return k_ggml_type[type];
}
bool oomb_type_from_ggml(uint32_t t, enum oomb_type * type) {
    for (int i = 0; i < OOMB_TYPE_COUNT; i++)
        if (k_ggml_type[i] == t) { if (type) *type = (enum oomb_type) i; return true; }
    return false;
}
const char * oomb_type_name(enum oomb_type type) {
    return (unsigned) type < OOMB_TYPE_COUNT ? k_type_name[type] : "unknown";
}

uint16_t oomb_fp32_to_bf16(float x) { return oomb::fp32_to_bf16(x); }
float    oomb_bf16_to_fp32(uint16_t x) { return oomb::bf16_to_fp32(x); }
uint16_t oomb_fp32_to_fp16(float x) { return oomb::fp32_to_fp16(x); }
float    oomb_fp16_to_fp32(uint16_t x) { return oomb::fp16_to_fp32(x); }

static const char * k_op_name[] = {
    "none", "view", "reshape", "permute", "transpose", "cont", "cpy", "cast",
    "fill", "add", "sub", "mul", "scale", "add_inplace", "repeat", "repeat_back", "silu", "silu_back", "swiglu",
    "sum", "mean", "sum_sq",
    "get_rows", "get_rows_back", "mul_mat", "rms_norm", "rms_norm_back", "rope", "rope_back",
    "soft_max", "soft_max_back", "attn", "attn_back", "cross_entropy_loss", "cross_entropy_loss_back",
    "linear_cross_entropy", "linear_cross_entropy_back",
    "adamw_step", "sgd_step", "paged_attn", "paged_attn_back", "custom",
    "swiglu_back", "paged_attn_merge", "page_summary", "page_select", "rms_norm_mul", "rms_norm_mul_back",
};
static_assert(sizeof(k_op_name) / sizeof(k_op_name[0]) == OOMB_OP_COUNT, "k_op_name lists every op of enum oomb_op, in order");

const char * oomb_op_name(enum oomb_op op) {
    return (unsigned) op < OOMB_OP_COUNT ? k_op_name[op] : "unknown";
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

static oomb_error_handler_t g_error_handler = nullptr;
static void *               g_error_user    = nullptr;

void oomb_set_error_handler(oomb_error_handler_t handler, void * user_data) {
    g_error_handler = handler;
    g_error_user    = user_data;
}

void oomb_error(const char * fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    // inside oomb_backend_graph_compute (a fault_scope on this thread): a compute-time fault,
    // returned to the caller as a status (backend.cpp) instead of going through the handler
    if (oomb::faults_captured()) throw oomb::compute_fault{OOMB_STATUS_FAILED, msg};
    if (g_error_handler) {
        g_error_handler(msg, g_error_user);
    }
    fprintf(stderr, "oomb error: %s\n", msg);
    fflush(stderr);
    abort();
}

namespace oomb {

static thread_local int t_fault_scopes = 0;
fault_scope::fault_scope() { t_fault_scopes++; }
fault_scope::~fault_scope() { t_fault_scopes--; }
bool faults_captured() { return t_fault_scopes > 0; }

void fail(enum oomb_status status, const char * fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (faults_captured()) throw compute_fault{status, msg};
    oomb_error("%s", msg);
}

std::string shape_str(const oomb_tensor * t) {
    if (!t) return "(null)";
    char buf[160];
    snprintf(buf, sizeof(buf), "'%s' [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] %s", t->name, t->ne[0], t->ne[1],
             t->ne[2], t->ne[3], oomb_type_name(t->type));
    return buf;
}

bool tensor_is_host(const oomb_tensor * t) {
    const oomb_tensor * o = t->view_src ? t->view_src : t;
    if (!o->buffer) return true;
    return o->buffer->buft->is_host;
}

bool op_can_inplace(enum oomb_op op) {
    switch (op) {
        case OOMB_OP_ADD: case OOMB_OP_SUB: case OOMB_OP_MUL: case OOMB_OP_SCALE:
        case OOMB_OP_SILU: case OOMB_OP_SILU_BACK: case OOMB_OP_SWIGLU:
        case OOMB_OP_RMS_NORM: case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK:
        case OOMB_OP_SOFT_MAX: case OOMB_OP_CROSS_ENTROPY_BACK:
            return true;
        default:
            return false;
    }
}

} // namespace oomb

using oomb::shape_str;

#define OOMB_CHECK(cond, op, ...)                                                   \
    do {                                                                            \
        if (!(cond)) {                                                              \
            char _m[1024];                                                          \
            snprintf(_m, sizeof(_m), __VA_ARGS__);                                  \
            oomb_error("%s: %s", op, _m);                                           \
        }                                                                           \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Contexts and tensors
// ---------------------------------------------------------------------------------------------

struct oomb_context * oomb_init(struct oomb_init_params params) {
    auto * ctx = new oomb_context();
    ctx->max_tensors = params.max_tensors;
    ctx->no_alloc    = params.no_alloc;
    return ctx;
}

void oomb_free(struct oomb_context * ctx) {
    if (!ctx) return;
    for (void * p : ctx->host_allocs) free(p);
    delete ctx;
}

int64_t oomb_ctx_n_tensors(const struct oomb_context * ctx) { return (int64_t) ctx->tensors.size(); }
struct oomb_tensor * oomb_ctx_tensor(struct oomb_context * ctx, int64_t i) {
    return (i >= 0 && i < (int64_t) ctx->tensors.size()) ? &ctx->tensors[i] : nullptr;
}
struct oomb_tensor * oomb_get_tensor(struct oomb_context * ctx, const char * name) {
    for (auto & t : ctx->tensors) if (strcmp(t.name, name) == 0) return &t;
    return nullptr;
}
bool oomb_ctx_no_alloc(const struct oomb_context * ctx) { return ctx->no_alloc; }

static oomb_tensor * new_tensor_impl(oomb_context * ctx, enum oomb_type type, int n_dims, const int64_t * ne,
                                     oomb_tensor * view_src, size_t view_offs, const char * op) {
    OOMB_CHECK(ctx, op, "context is NULL");
    OOMB_CHECK(ne, op, "ne is NULL");
    OOMB_CHECK((unsigned) type < OOMB_TYPE_COUNT, op, "unknown tensor type %d", (int) type);
    OOMB_CHECK(n_dims >= 1 && n_dims <= OOMB_MAX_DIMS, op, "n_dims = %d, must be 1..4", n_dims);
    OOMB_CHECK(ctx->max_tensors == 0 || ctx->tensors.size() < ctx->max_tensors, op,
               "context is full (%zu tensors); raise max_tensors", ctx->max_tensors);
    int64_t shape[4] = {1, 1, 1, 1};
    for (int i = 0; i < n_dims; i++) {
        OOMB_CHECK(ne[i] >= 0, op, "negative size ne[%d] = %" PRId64, i, ne[i]);
        shape[i] = ne[i];
    }
    // rows of a block type are whole blocks; overflow check on the total byte size
    const size_t ts = k_type_size[type];
    const int64_t bs = k_blck_size[type];
    OOMB_CHECK(shape[0] % bs == 0, op, "ne0 = %" PRId64 " of a %s tensor is not a multiple of its block size %" PRId64, shape[0],
               k_type_name[type], bs);
    __int128 total = ts;
    for (int i = 0; i < 4; i++) {
        total *= i == 0 ? shape[0] / bs : shape[i];
        OOMB_CHECK(total <= (__int128) std::numeric_limits<int64_t>::max(), op,
                   "tensor size overflows: [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] %s", shape[0], shape[1],
                   shape[2], shape[3], k_type_name[type]);
    }
    ctx->tensors.emplace_back();
    oomb_tensor * t = &ctx->tensors.back();
    memset(t, 0, sizeof(*t));
    t->type = type;
    for (int i = 0; i < 4; i++) t->ne[i] = shape[i];
    oomb::set_contiguous_nb(t);
    t->op = OOMB_OP_NONE;
    if (view_src) {
        if (view_src->view_src) { view_offs += view_src->view_offs; view_src = view_src->view_src; }
        t->view_src  = view_src;
        t->view_offs = view_offs;
        if (view_src->data) { t->data = (char *) view_src->data + view_offs; t->buffer = view_src->buffer; }
    } else if (!ctx->no_alloc) {
        size_t bytes = (size_t) total;
        size_t sz = (bytes + 63) & ~(size_t) 63;
        if (sz == 0) sz = 64;
        void * p = aligned_alloc(64, sz);
        OOMB_CHECK(p, op, "out of host memory allocating %zu bytes", sz);
        memset(p, 0, sz);
        ctx->host_allocs.push_back(p);
        t->data = p;
    }
    return t;
}

struct oomb_tensor * oomb_new_tensor(struct oomb_context * ctx, enum oomb_type type, int n_dims, const int64_t * ne) {
    return new_tensor_impl(ctx, type, n_dims, ne, nullptr, 0, "new_tensor");
}
struct oomb_tensor * oomb_new_tensor_1d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0) {
    return oomb_new_tensor(ctx, type, 1, &ne0);
}
struct oomb_tensor * oomb_new_tensor_2d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0, int64_t ne1) {
    const int64_t ne[2] = {ne0, ne1};
    return oomb_new_tensor(ctx, type, 2, ne);
}
struct oomb_tensor * oomb_new_tensor_3d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0, int64_t ne1, int64_t ne2) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    return oomb_new_tensor(ctx, type, 3, ne);
}
struct oomb_tensor * oomb_new_tensor_4d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return oomb_new_tensor(ctx, type, 4, ne);
}
struct oomb_tensor * oomb_dup_tensor(struct oomb_context * ctx, const struct oomb_tensor * a) {
    return oomb_new_tensor(ctx, a->type, 4, a->ne);
}

struct oomb_tensor * oomb_set_name(struct oomb_tensor * t, const char * name) {
    snprintf(t->name, sizeof(t->name), "%s", name ? name : "");
    return t;
}
struct oomb_tensor * oomb_format_name(struct oomb_tensor * t, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    return t;
}
const char * oomb_get_name(const struct oomb_tensor * t) { return t->name; }

void oomb_set_param(struct oomb_tensor * t) {
    OOMB_CHECK(t->op == OOMB_OP_NONE, "set_param", "%s is the result of op %s; only leaf tensors can be parameters",
               shape_str(t).c_str(), oomb_op_name(t->op));
    OOMB_CHECK(t->type != OOMB_TYPE_I32, "set_param", "%s: an i32 tensor cannot be trainable", shape_str(t).c_str());
    OOMB_CHECK(!oomb_type_is_quantized(t->type), "set_param",
               "%s: a %s tensor cannot be trainable (block-quantized weights are frozen; cast it to f32 or bf16 to train it)",
               shape_str(t).c_str(), k_type_name[t->type]);
    t->flags |= OOMB_TENSOR_FLAG_PARAM;
}
void oomb_set_input(struct oomb_tensor * t) { t->flags |= OOMB_TENSOR_FLAG_INPUT; }
void oomb_set_output(struct oomb_tensor * t) { t->flags |= OOMB_TENSOR_FLAG_OUTPUT; }
void oomb_set_loss(struct oomb_tensor * t) {
    OOMB_CHECK(t->type == OOMB_TYPE_F32, "set_loss", "%s: the loss must be f32", shape_str(t).c_str());
    t->flags |= OOMB_TENSOR_FLAG_LOSS;
}

int64_t oomb_nelements(const struct oomb_tensor * t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
int64_t oomb_nrows(const struct oomb_tensor * t) { return t->ne[1] * t->ne[2] * t->ne[3]; }
// Bytes spanned by t's elements, in 128 bits (strides of views can be anything a caller passes).
// Block types: the blocks run along dim 0 (dim 1 for the transposed view, oomb::quant_block_dim),
// whole blocks of k_type_size bytes each.
static __int128 nbytes_wide(const oomb_tensor * t) {
    if (oomb_nelements(t) == 0) return 0;
    const int64_t bs = k_blck_size[t->type];
    const int d = bs > 1 ? oomb::quant_block_dim(t) : -1;
    __int128 n = bs > 1 ? (__int128) (t->ne[d] / bs) * (__int128) k_type_size[t->type] : (__int128) k_type_size[t->type];
    for (int i = 0; i < 4; i++) if (i != d) n += (__int128) (t->ne[i] - 1) * (__int128) t->nb[i];
    return n;
}
size_t oomb_nbytes(const struct oomb_tensor * t) {
    const __int128 n = nbytes_wide(t);
    return n > (__int128) SIZE_MAX ? SIZE_MAX : (size_t) n;
}
int oomb_n_dims(const struct oomb_tensor * t) {
    for (int i = 3; i >= 1; i--) if (t->ne[i] > 1) return i + 1;
    return 1;
}
bool oomb_is_contiguous(const struct oomb_tensor * t) {
    if (oomb_type_is_quantized(t->type) && oomb::quant_block_dim(t) != 0) return false;
    size_t expect = k_type_size[t->type];
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect) return false;
        expect *= (size_t) (i == 0 ? t->ne[0] / k_blck_size[t->type] : t->ne[i]);
    }
    return true;
}
bool oomb_are_same_shape(const struct oomb_tensor * a, const struct oomb_tensor * b) {
    for (int i = 0; i < 4; i++) if (a->ne[i] != b->ne[i]) return false;
    return true;
}
bool oomb_can_repeat(const struct oomb_tensor * b, const struct oomb_tensor * a) {
    for (int i = 0; i < 4; i++) {
        if (b->ne[i] == 0) { if (a->ne[i] != 0) return false; continue; }
        if (a->ne[i] % b->ne[i] != 0) return false;
    }
    return true;
}
const char * oomb_shape_str(const struct oomb_tensor * t, char * buf, size_t size) {
    snprintf(buf, size, "%s", shape_str(t).c_str());
    return buf;
}

static void check_host_data(const oomb_tensor * t, const char * fn) {
    OOMB_CHECK(t->data, fn, "%s has no data", shape_str(t).c_str());
    OOMB_CHECK(oomb::tensor_is_host(t), fn, "%s is in device memory; use oomb_tensor_get/set", shape_str(t).c_str());
}

static float load_f32(const void * p, enum oomb_type type) {
    switch (type) {
        case OOMB_TYPE_F32: return *(const float *) p;
        case OOMB_TYPE_F16: return oomb::fp16_to_fp32(*(const uint16_t *) p);
        case OOMB_TYPE_BF16: return oomb::bf16_to_fp32(*(const uint16_t *) p);
        case OOMB_TYPE_I32: return (float) *(const int32_t *) p;
        default: oomb_error("get_f32: elements of type %s are not addressable one by one (dequantize with oomb_cast)", oomb_type_name(type));
    }
}
static void store_f32(void * p, enum oomb_type type, float v) {
    switch (type) {
        case OOMB_TYPE_F32: *(float *) p = v; break;
        case OOMB_TYPE_F16: *(uint16_t *) p = oomb::fp32_to_fp16(v); break;
        case OOMB_TYPE_BF16: *(uint16_t *) p = oomb::fp32_to_bf16(v); break;
        case OOMB_TYPE_I32: *(int32_t *) p = (int32_t) v; break;
        default: oomb_error("set_f32: elements of type %s are not addressable one by one", oomb_type_name(type));
    }
}

static void unravel(const oomb_tensor * t, int64_t i, int64_t idx[4]) {
    idx[0] = i % t->ne[0]; i /= t->ne[0];
    idx[1] = i % t->ne[1]; i /= t->ne[1];
    idx[2] = i % t->ne[2]; i /= t->ne[2];
    idx[3] = i;
}

float oomb_get_f32_1d(const struct oomb_tensor * t, int64_t i) {
    check_host_data(t, "get_f32_1d");
    OOMB_CHECK(i >= 0 && i < oomb_nelements(t), "get_f32_1d", "index %" PRId64 " out of range for %s", i, shape_str(t).c_str());
    int64_t idx[4];
    unravel(t, i, idx);
    return load_f32(oomb::elem_ptr(t, idx[0], idx[1], idx[2], idx[3]), t->type);
}
void oomb_set_f32_1d(struct oomb_tensor * t, int64_t i, float v) {
    check_host_data(t, "set_f32_1d");
    OOMB_CHECK(i >= 0 && i < oomb_nelements(t), "set_f32_1d", "index %" PRId64 " out of range for %s", i, shape_str(t).c_str());
    int64_t idx[4];
    unravel(t, i, idx);
    store_f32(oomb::elem_ptr(t, idx[0], idx[1], idx[2], idx[3]), t->type, v);
}
static void check_nd(const oomb_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, const char * fn) {
    OOMB_CHECK(i0 >= 0 && i0 < t->ne[0] && i1 >= 0 && i1 < t->ne[1] && i2 >= 0 && i2 < t->ne[2] && i3 >= 0 && i3 < t->ne[3],
               fn, "index (%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ") out of range for %s", i0, i1, i2, i3,
               shape_str(t).c_str());
}
float oomb_get_f32_nd(const struct oomb_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    check_host_data(t, "get_f32_nd");
    check_nd(t, i0, i1, i2, i3, "get_f32_nd");
    return load_f32(oomb::elem_ptr(t, i0, i1, i2, i3), t->type);
}
void oomb_set_f32_nd(struct oomb_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v) {
    check_host_data(t, "set_f32_nd");
    check_nd(t, i0, i1, i2, i3, "set_f32_nd");
    store_f32(oomb::elem_ptr(t, i0, i1, i2, i3), t->type, v);
}
int32_t oomb_get_i32_1d(const struct oomb_tensor * t, int64_t i) {
    check_host_data(t, "get_i32_1d");
    OOMB_CHECK(t->type == OOMB_TYPE_I32, "get_i32_1d", "%s is not i32", shape_str(t).c_str());
    OOMB_CHECK(i >= 0 && i < oomb_nelements(t), "get_i32_1d", "index %" PRId64 " out of range for %s", i, shape_str(t).c_str());
    int64_t idx[4];
    unravel(t, i, idx);
    return *(const int32_t *) oomb::elem_ptr(t, idx[0], idx[1], idx[2], idx[3]);
}
void oomb_set_i32_1d(struct oomb_tensor * t, int64_t i, int32_t v) {
    check_host_data(t, "set_i32_1d");
    OOMB_CHECK(t->type == OOMB_TYPE_I32, "set_i32_1d", "%s is not i32", shape_str(t).c_str());
    OOMB_CHECK(i >= 0 && i < oomb_nelements(t), "set_i32_1d", "index %" PRId64 " out of range for %s", i, shape_str(t).c_str());
    int64_t idx[4];
    unravel(t, i, idx);
    *(int32_t *) oomb::elem_ptr(t, idx[0], idx[1], idx[2], idx[3]) = v;
}

float oomb_get_op_param_f32(const struct oomb_tensor * t, int i) { return oomb::get_op_f32(t, i); }
int32_t oomb_get_op_param_i32(const struct oomb_tensor * t, int i) { return t->op_params[i]; }

// ---------------------------------------------------------------------------------------------
// Op construction helpers
// ---------------------------------------------------------------------------------------------

static oomb_tensor * new_op(oomb_context * ctx, enum oomb_op op, enum oomb_type type, const int64_t ne[4],
                            oomb_tensor * a, oomb_tensor * b = nullptr, oomb_tensor * c = nullptr,
                            oomb_tensor * d = nullptr, oomb_tensor * e = nullptr) {
    oomb_tensor * t = new_tensor_impl(ctx, type, 4, ne, nullptr, 0, oomb_op_name(op));
    t->op = op;
    t->src[0] = a; t->src[1] = b; t->src[2] = c; t->src[3] = d; t->src[4] = e;
    return t;
}

static void require_f32(const oomb_tensor * t, const char * op, const char * what) {
    OOMB_CHECK(t, op, "%s is NULL", what);
    OOMB_CHECK(t->type == OOMB_TYPE_F32, op, "%s must be f32, got %s", what, shape_str(t).c_str());
}
static void require_float(const oomb_tensor * t, const char * op, const char * what) {
    OOMB_CHECK(t, op, "%s is NULL", what);
    OOMB_CHECK(t->type != OOMB_TYPE_I32 && !oomb_type_is_quantized(t->type), op,
               "%s must be f32, f16 or bf16, got %s%s", what, shape_str(t).c_str(),
               oomb_type_is_quantized(t->type) ? " (block types are allowed only as mul_mat's a and in cast / cpy to a float type)" : "");
}
static void require_same_shape(const oomb_tensor * a, const oomb_tensor * b, const char * op) {
    OOMB_CHECK(oomb_are_same_shape(a, b), op, "shapes differ: %s vs %s", shape_str(a).c_str(), shape_str(b).c_str());
}

// ---------------------------------------------------------------------------------------------
// Views and layout
// ---------------------------------------------------------------------------------------------

static oomb_tensor * view_impl(oomb_context * ctx, oomb_tensor * a, int n_dims, const int64_t * ne, const size_t * nb,
                               size_t offset, enum oomb_op op) {
    const char * opn = oomb_op_name(op);
    OOMB_CHECK(a, opn, "source is NULL");
    // the view must lie inside a's memory
    oomb_tensor tmp;
    memset(&tmp, 0, sizeof(tmp));
    tmp.type = a->type;
    for (int i = 0; i < 4; i++) tmp.ne[i] = i < n_dims ? ne[i] : 1;
    oomb::set_contiguous_nb(&tmp);
    for (int i = 1; i < 4; i++) if (nb && i < n_dims) tmp.nb[i] = nb[i];
    if (nb && n_dims >= 1 && nb[0]) tmp.nb[0] = nb[0];
    if (oomb_type_is_quantized(a->type) && op != OOMB_OP_PERMUTE) {
        // block types: whole rows of row-major blocks only (the kernels read whole blocks)
        const size_t rs = oomb_row_size(a->type, a->ne[0]);
        OOMB_CHECK(oomb::quant_block_dim(a) == 0, opn, "%s: views of a transposed %s tensor are not supported", shape_str(a).c_str(),
                   k_type_name[a->type]);
        bool whole = tmp.ne[0] == a->ne[0] && offset % rs == 0 && tmp.nb[0] == k_type_size[a->type];
        for (int i = 1; i < 4; i++) whole = whole && (tmp.ne[i] <= 1 || tmp.nb[i] % rs == 0);
        OOMB_CHECK(whole, opn,
                   "a view [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] at offset %zu of %s must take whole rows (ne0 = %" PRId64
                   ", offset and strides multiples of the row size %zu bytes)",
                   tmp.ne[0], tmp.ne[1], tmp.ne[2], tmp.ne[3], offset, shape_str(a).c_str(), a->ne[0], rs);
    }
    // the memory of a spans [0, nbytes(a)) relative to a->data; computed in 128 bits so that huge
    // offsets or strides cannot wrap around
    const __int128 need = (__int128) offset + nbytes_wide(&tmp);
    OOMB_CHECK(need <= nbytes_wide(a) || oomb_nelements(&tmp) == 0, opn,
               "view [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] (strides %zu, %zu, %zu) at offset %zu needs %.0f bytes, source %s has %zu",
               tmp.ne[0], tmp.ne[1], tmp.ne[2], tmp.ne[3], tmp.nb[1], tmp.nb[2], tmp.nb[3], offset, (double) need,
               shape_str(a).c_str(), oomb_nbytes(a));
    oomb_tensor * t = new_tensor_impl(ctx, a->type, 4, tmp.ne, a, offset, opn);
    for (int i = 0; i < 4; i++) t->nb[i] = tmp.nb[i];
    t->op = op;
    t->src[0] = a;
    if (a->name[0]) oomb_format_name(t, "%.50s (%s)", a->name, opn);
    return t;
}

namespace oomb {
oomb_tensor * new_op_node(oomb_context * ctx, enum oomb_op op, enum oomb_type type, const int64_t ne[4]) {
    return new_op(ctx, op, type, ne, nullptr);
}
oomb_tensor * view_op_node(oomb_context * ctx, oomb_tensor * a, enum oomb_op op) {
    return view_impl(ctx, a, 4, a->ne, a->nb, 0, op);
}
} // namespace oomb

struct oomb_tensor * oomb_view_1d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, size_t offset) {
    const int64_t ne[1] = {ne0};
    return view_impl(ctx, a, 1, ne, nullptr, offset, OOMB_OP_VIEW);
}
struct oomb_tensor * oomb_view_2d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset) {
    const int64_t ne[2] = {ne0, ne1};
    const size_t nb[2] = {0, nb1};
    return view_impl(ctx, a, 2, ne, nb, offset, OOMB_OP_VIEW);
}
struct oomb_tensor * oomb_view_3d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2, size_t offset) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    const size_t nb[3] = {0, nb1, nb2};
    return view_impl(ctx, a, 3, ne, nb, offset, OOMB_OP_VIEW);
}
struct oomb_tensor * oomb_view_4d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    const size_t nb[4] = {0, nb1, nb2, nb3};
    return view_impl(ctx, a, 4, ne, nb, offset, OOMB_OP_VIEW);
}

static oomb_tensor * reshape_impl(oomb_context * ctx, oomb_tensor * a, int n_dims, const int64_t * ne) {
    OOMB_CHECK(a, "reshape", "source is NULL");
    OOMB_CHECK(oomb_is_contiguous(a), "reshape", "source %s is not contiguous (use oomb_cont first)", shape_str(a).c_str());
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++) n *= ne[i];
    OOMB_CHECK(n == oomb_nelements(a), "reshape", "cannot reshape %s (%" PRId64 " elements) to %" PRId64 " elements",
               shape_str(a).c_str(), oomb_nelements(a), n);
    return view_impl(ctx, a, n_dims, ne, nullptr, 0, OOMB_OP_RESHAPE);
}
struct oomb_tensor * oomb_reshape_1d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0) {
    const int64_t ne[1] = {ne0};
    return reshape_impl(ctx, a, 1, ne);
}
struct oomb_tensor * oomb_reshape_2d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1) {
    const int64_t ne[2] = {ne0, ne1};
    return reshape_impl(ctx, a, 2, ne);
}
struct oomb_tensor * oomb_reshape_3d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    return reshape_impl(ctx, a, 3, ne);
}
struct oomb_tensor * oomb_reshape_4d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return reshape_impl(ctx, a, 4, ne);
}

static oomb_tensor * permute_impl(oomb_context * ctx, oomb_tensor * a, int axis0, int axis1, int axis2, int axis3, enum oomb_op op);

struct oomb_tensor * oomb_permute(struct oomb_context * ctx, struct oomb_tensor * a, int axis0, int axis1, int axis2, int axis3) {
    OOMB_CHECK(a, "permute", "source is NULL");
    OOMB_CHECK(!oomb_type_is_quantized(a->type), "permute", "%s: a %s tensor cannot be permuted (oomb_transpose of a row-major one is allowed)",
               shape_str(a).c_str(), k_type_name[a->type]);
    return permute_impl(ctx, a, axis0, axis1, axis2, axis3, OOMB_OP_PERMUTE);
}

static oomb_tensor * permute_impl(oomb_context * ctx, oomb_tensor * a, int axis0, int axis1, int axis2, int axis3, enum oomb_op op) {
    const int ax[4] = {axis0, axis1, axis2, axis3};
    bool seen[4] = {false, false, false, false};
    for (int i = 0; i < 4; i++) {
        OOMB_CHECK(ax[i] >= 0 && ax[i] < 4 && !seen[ax[i]], "permute", "axes (%d, %d, %d, %d) are not a permutation of 0..3",
                   axis0, axis1, axis2, axis3);
        seen[ax[i]] = true;
    }
    oomb_tensor * t = view_impl(ctx, a, 4, a->ne, a->nb, 0, OOMB_OP_PERMUTE);
    for (int i = 0; i < 4; i++) {
        t->ne[ax[i]] = a->ne[i];
        t->nb[ax[i]] = a->nb[i];
    }
    for (int i = 0; i < 4; i++) t->op_params[i] = ax[i];
    t->op = op;
    return t;
}

struct oomb_tensor * oomb_transpose(struct oomb_context * ctx, struct oomb_tensor * a) {
    OOMB_CHECK(a, "transpose", "source is NULL");
    OOMB_CHECK(!oomb_type_is_quantized(a->type) || oomb::quant_block_dim(a) == 0, "transpose",
               "%s: a transposed %s tensor cannot be transposed again (use the row-major tensor)", shape_str(a).c_str(),
               k_type_name[a->type]);
    return permute_impl(ctx, a, 1, 0, 2, 3, OOMB_OP_TRANSPOSE);
}

struct oomb_tensor * oomb_cont(struct oomb_context * ctx, struct oomb_tensor * a) {
    OOMB_CHECK(a, "cont", "source is NULL");
    return oomb_cont_4d(ctx, a, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
}
struct oomb_tensor * oomb_cont_4d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    OOMB_CHECK(a, "cont", "source is NULL");
    OOMB_CHECK(ne0 * ne1 * ne2 * ne3 == oomb_nelements(a), "cont",
               "cannot make %s contiguous as [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]: element counts differ",
               shape_str(a).c_str(), ne0, ne1, ne2, ne3);
    OOMB_CHECK(!oomb_type_is_quantized(a->type), "cont",
               "%s: a %s tensor cannot be copied as blocks; dequantize it with oomb_cast (or oomb_cpy) to f32 or bf16",
               shape_str(a).c_str(), k_type_name[a->type]);
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return new_op(ctx, OOMB_OP_CONT, a->type, ne, a);
}

// ---------------------------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------------------------

struct oomb_tensor * oomb_cpy(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) {
    OOMB_CHECK(a && b, "cpy", "source or destination is NULL");
    OOMB_CHECK(oomb_nelements(a) == oomb_nelements(b), "cpy", "element counts differ: %s vs %s", shape_str(a).c_str(),
               shape_str(b).c_str());
    OOMB_CHECK((a->type == OOMB_TYPE_I32) == (b->type == OOMB_TYPE_I32), "cpy",
               "cannot convert between i32 and float: %s -> %s", shape_str(a).c_str(), shape_str(b).c_str());
    OOMB_CHECK(!oomb_type_is_quantized(b->type) && (!oomb_type_is_quantized(a->type) || oomb::quant_block_dim(a) == 0), "cpy",
               "cannot copy %s -> %s: block types can only be dequantized from row-major blocks (quantizing is not an op)",
               shape_str(a).c_str(), shape_str(b).c_str());
    oomb_tensor * t = view_impl(ctx, b, 4, b->ne, b->nb, 0, OOMB_OP_CPY);
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

struct oomb_tensor * oomb_cast(struct oomb_context * ctx, struct oomb_tensor * a, enum oomb_type type) {
    OOMB_CHECK(a, "cast", "source is NULL");
    OOMB_CHECK((unsigned) type < OOMB_TYPE_COUNT, "cast", "unknown type %d", (int) type);
    OOMB_CHECK((a->type == OOMB_TYPE_I32) == (type == OOMB_TYPE_I32), "cast", "cannot convert %s to %s",
               shape_str(a).c_str(), oomb_type_name(type));
    OOMB_CHECK(!oomb_type_is_quantized(type) && (!oomb_type_is_quantized(a->type) || oomb::quant_block_dim(a) == 0), "cast",
               "cannot convert %s to %s: block types can only be dequantized (to f32, f16 or bf16) from row-major blocks",
               shape_str(a).c_str(), oomb_type_name(type));
    return new_op(ctx, OOMB_OP_CAST, type, a->ne, a);
}

struct oomb_tensor * oomb_fill(struct oomb_context * ctx, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, float value) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    oomb_tensor * t = new_op(ctx, OOMB_OP_FILL, OOMB_TYPE_F32, ne, nullptr);
    oomb::set_op_f32(t, 0, value);
    return t;
}

static oomb_tensor * binary_op(oomb_context * ctx, enum oomb_op op, oomb_tensor * a, oomb_tensor * b,
                               enum oomb_type type = OOMB_TYPE_F32, const char * name = nullptr) {
    const char * opn = name ? name : oomb_op_name(op);
    require_f32(a, opn, "a");
    require_f32(b, opn, "b");
    OOMB_CHECK(oomb_can_repeat(b, a), opn, "b %s cannot be broadcast to a %s", shape_str(b).c_str(), shape_str(a).c_str());
    return new_op(ctx, op, type, a->ne, a, b);
}
struct oomb_tensor * oomb_add(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) { return binary_op(ctx, OOMB_OP_ADD, a, b); }
struct oomb_tensor * oomb_sub(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) { return binary_op(ctx, OOMB_OP_SUB, a, b); }
struct oomb_tensor * oomb_mul(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) { return binary_op(ctx, OOMB_OP_MUL, a, b); }
static void require_result_type(enum oomb_type type, const char * op) {
    OOMB_CHECK(type == OOMB_TYPE_F32 || type == OOMB_TYPE_BF16, op, "result type %s must be f32 or bf16", oomb_type_name(type));
}
struct oomb_tensor * oomb_mul_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, enum oomb_type type) {
    require_result_type(type, "mul_ext");
    return binary_op(ctx, OOMB_OP_MUL, a, b, type, "mul_ext");
}

struct oomb_tensor * oomb_scale(struct oomb_context * ctx, struct oomb_tensor * a, float s) {
    require_f32(a, "scale", "a");
    oomb_tensor * t = new_op(ctx, OOMB_OP_SCALE, OOMB_TYPE_F32, a->ne, a);
    oomb::set_op_f32(t, 0, s);
    return t;
}

struct oomb_tensor * oomb_add_inplace(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) {
    require_f32(a, "add_inplace", "a");
    require_f32(b, "add_inplace", "b");
    OOMB_CHECK(oomb_can_repeat(b, a), "add_inplace", "b %s cannot be broadcast to a %s", shape_str(b).c_str(), shape_str(a).c_str());
    oomb_tensor * t = view_impl(ctx, a, 4, a->ne, a->nb, 0, OOMB_OP_ADD_INPLACE);
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

struct oomb_tensor * oomb_repeat(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) {
    require_f32(a, "repeat", "a");
    OOMB_CHECK(b, "repeat", "b is NULL");
    OOMB_CHECK(oomb_can_repeat(a, b), "repeat", "a %s cannot be repeated to the shape of b %s", shape_str(a).c_str(), shape_str(b).c_str());
    return new_op(ctx, OOMB_OP_REPEAT, OOMB_TYPE_F32, b->ne, a, b);
}

struct oomb_tensor * oomb_repeat_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) {
    require_f32(a, "repeat_back", "a");
    OOMB_CHECK(b, "repeat_back", "b is NULL");
    OOMB_CHECK(oomb_can_repeat(b, a), "repeat_back", "a %s cannot be summed down to the shape of b %s", shape_str(a).c_str(), shape_str(b).c_str());
    return new_op(ctx, OOMB_OP_REPEAT_BACK, OOMB_TYPE_F32, b->ne, a, b);
}

struct oomb_tensor * oomb_silu(struct oomb_context * ctx, struct oomb_tensor * a) {
    require_f32(a, "silu", "a");
    return new_op(ctx, OOMB_OP_SILU, OOMB_TYPE_F32, a->ne, a);
}
struct oomb_tensor * oomb_silu_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) {
    require_f32(a, "silu_back", "x");
    require_f32(b, "silu_back", "dy");
    require_same_shape(a, b, "silu_back");
    return new_op(ctx, OOMB_OP_SILU_BACK, OOMB_TYPE_F32, a->ne, a, b);
}
// swiglu / swiglu_back with the result type; `opn` names the function called in errors
// gate and up: both f32 or both bf16
static void require_gate_up(const oomb_tensor * gate, const oomb_tensor * up, const char * opn) {
    OOMB_CHECK(gate && up, opn, "gate or up is NULL");
    OOMB_CHECK((gate->type == OOMB_TYPE_F32 || gate->type == OOMB_TYPE_BF16) && up->type == gate->type, opn,
               "gate %s and up %s must be both f32 or both bf16", shape_str(gate).c_str(), shape_str(up).c_str());
}
static oomb_tensor * swiglu_impl(oomb_context * ctx, oomb_tensor * gate, oomb_tensor * up, enum oomb_type type, const char * opn) {
    require_result_type(type, opn);
    require_gate_up(gate, up, opn);
    require_same_shape(gate, up, opn);
    return new_op(ctx, OOMB_OP_SWIGLU, type, gate->ne, gate, up);
}
static oomb_tensor * swiglu_back_impl(oomb_context * ctx, oomb_tensor * gate, oomb_tensor * up, oomb_tensor * dy, enum oomb_type type,
                                      const char * opn) {
    require_result_type(type, opn);
    require_gate_up(gate, up, opn);
    require_f32(dy, opn, "dy");
    require_same_shape(gate, up, opn);
    require_same_shape(gate, dy, opn);
    const int64_t ne[4] = {gate->ne[0], gate->ne[1], gate->ne[2], 2 * gate->ne[3]};
    oomb_tensor * t = new_op(ctx, OOMB_OP_SWIGLU_BACK, type, ne, gate, up);
    t->src[2] = dy;
    return t;
}
struct oomb_tensor * oomb_swiglu(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up) {
    return swiglu_impl(ctx, gate, up, OOMB_TYPE_F32, "swiglu");
}
struct oomb_tensor * oomb_swiglu_ext(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up, enum oomb_type type) {
    return swiglu_impl(ctx, gate, up, type, "swiglu_ext");
}
struct oomb_tensor * oomb_swiglu_back(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up,
                                      struct oomb_tensor * dy) {
    return swiglu_back_impl(ctx, gate, up, dy, OOMB_TYPE_F32, "swiglu_back");
}
struct oomb_tensor * oomb_swiglu_back_ext(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up,
                                          struct oomb_tensor * dy, enum oomb_type type) {
    return swiglu_back_impl(ctx, gate, up, dy, type, "swiglu_back_ext");
}

static const int64_t k_scalar_ne[4] = {1, 1, 1, 1};
struct oomb_tensor * oomb_sum(struct oomb_context * ctx, struct oomb_tensor * a) {
    require_f32(a, "sum", "a");
    return new_op(ctx, OOMB_OP_SUM, OOMB_TYPE_F32, k_scalar_ne, a);
}
struct oomb_tensor * oomb_mean(struct oomb_context * ctx, struct oomb_tensor * a) {
    require_f32(a, "mean", "a");
    return new_op(ctx, OOMB_OP_MEAN, OOMB_TYPE_F32, k_scalar_ne, a);
}
struct oomb_tensor * oomb_sum_sq(struct oomb_context * ctx, struct oomb_tensor * a) {
    require_f32(a, "sum_sq", "a");
    return new_op(ctx, OOMB_OP_SUM_SQ, OOMB_TYPE_F32, k_scalar_ne, a);
}
struct oomb_tensor * oomb_sum_sq_n(struct oomb_context * ctx, struct oomb_tensor ** a, int n) {
    OOMB_CHECK(a && n >= 1 && n <= OOMB_MAX_SRC, "sum_sq_n", "takes 1 to %d tensors, got %d", OOMB_MAX_SRC, a ? n : 0);
    for (int k = 0; k < n; k++) {
        char what[16];
        snprintf(what, sizeof what, "a[%d]", k);
        require_f32(a[k], "sum_sq_n", what);
    }
    oomb_tensor * t = new_op(ctx, OOMB_OP_SUM_SQ, OOMB_TYPE_F32, k_scalar_ne, a[0]);
    for (int k = 1; k < n; k++) t->src[k] = a[k];
    return t;
}

struct oomb_tensor * oomb_get_rows(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * ids) {
    require_float(a, "get_rows", "a");
    OOMB_CHECK(ids && ids->type == OOMB_TYPE_I32, "get_rows", "ids must be i32, got %s", shape_str(ids).c_str());
    OOMB_CHECK(a->ne[2] == 1 && a->ne[3] == 1, "get_rows", "a must be 2-D [n_embd, n_rows], got %s", shape_str(a).c_str());
    OOMB_CHECK(ids->ne[2] == 1 && ids->ne[3] == 1, "get_rows", "ids must be 1-D or 2-D, got %s", shape_str(ids).c_str());
    const int64_t ne[4] = {a->ne[0], ids->ne[0], ids->ne[1], 1};
    return new_op(ctx, OOMB_OP_GET_ROWS, OOMB_TYPE_F32, ne, a, ids);
}
struct oomb_tensor * oomb_get_rows_back(struct oomb_context * ctx, struct oomb_tensor * dy, struct oomb_tensor * ids, int64_t n_rows) {
    require_f32(dy, "get_rows_back", "dy");
    OOMB_CHECK(ids && ids->type == OOMB_TYPE_I32, "get_rows_back", "ids must be i32, got %s", shape_str(ids).c_str());
    OOMB_CHECK(dy->ne[1] == ids->ne[0] && dy->ne[2] == ids->ne[1] && dy->ne[3] == 1 && ids->ne[2] == 1 && ids->ne[3] == 1,
               "get_rows_back", "dy %s does not match ids %s", shape_str(dy).c_str(), shape_str(ids).c_str());
    OOMB_CHECK(n_rows > 0, "get_rows_back", "n_rows = %" PRId64 " must be positive", n_rows);
    const int64_t ne[4] = {dy->ne[0], n_rows, 1, 1};
    return new_op(ctx, OOMB_OP_GET_ROWS_BACK, OOMB_TYPE_F32, ne, dy, ids);
}

static oomb_tensor * mul_mat_impl(oomb_context * ctx, oomb_tensor * a, oomb_tensor * b, enum oomb_type type, const char * opn) {
    OOMB_CHECK(a, opn, "a is NULL");
    if (!oomb_type_is_quantized(a->type)) require_float(a, opn, "a");
    require_float(b, opn, "b");
    OOMB_CHECK(!oomb_type_is_quantized(a->type) || (a->ne[2] == 1 && a->ne[3] == 1 && oomb::quant_mat_layout_ok(a)), opn,
               "a %s of a block type must be a 2-D matrix of row-major blocks (contiguous) or its oomb_transpose", shape_str(a).c_str());
    OOMB_CHECK(a->ne[0] == b->ne[0], opn, "inner dimensions differ (ne0): a %s, b %s", shape_str(a).c_str(), shape_str(b).c_str());
    OOMB_CHECK(a->ne[2] > 0 && a->ne[3] > 0 && b->ne[2] % a->ne[2] == 0 && b->ne[3] % a->ne[3] == 0, opn,
               "batch dims of a %s cannot be broadcast to b %s", shape_str(a).c_str(), shape_str(b).c_str());
    OOMB_CHECK(oomb_type_is_quantized(a->type) || a->nb[0] == oomb_type_size(a->type) || a->nb[1] == oomb_type_size(a->type), opn,
               "a %s must have unit stride in dim 0 or dim 1", shape_str(a).c_str());
    const int64_t ne[4] = {a->ne[1], b->ne[1], b->ne[2], b->ne[3]};
    return new_op(ctx, OOMB_OP_MUL_MAT, type, ne, a, b);
}
struct oomb_tensor * oomb_mul_mat(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b) {
    return mul_mat_impl(ctx, a, b, OOMB_TYPE_F32, "mul_mat");
}
struct oomb_tensor * oomb_mul_mat_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, enum oomb_type type) {
    require_result_type(type, "mul_mat_ext");
    return mul_mat_impl(ctx, a, b, type, "mul_mat_ext");
}

struct oomb_tensor * oomb_rms_norm(struct oomb_context * ctx, struct oomb_tensor * a, float eps) {
    require_f32(a, "rms_norm", "a");
    OOMB_CHECK(eps >= 0.0f, "rms_norm", "eps = %g must be >= 0", eps);
    oomb_tensor * t = new_op(ctx, OOMB_OP_RMS_NORM, OOMB_TYPE_F32, a->ne, a);
    oomb::set_op_f32(t, 0, eps);
    return t;
}
struct oomb_tensor * oomb_rms_norm_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, float eps) {
    require_f32(a, "rms_norm_back", "x");
    require_f32(b, "rms_norm_back", "dy");
    require_same_shape(a, b, "rms_norm_back");
    oomb_tensor * t = new_op(ctx, OOMB_OP_RMS_NORM_BACK, OOMB_TYPE_F32, a->ne, a, b);
    oomb::set_op_f32(t, 0, eps);
    return t;
}
// x f32, w f32 of ne0 = x->ne[0] elements along dim 0 with unit stride, eps >= 0
static void check_rms_norm_mul_operands(const oomb_tensor * x, const oomb_tensor * w, float eps, const char * op) {
    require_f32(x, op, "x");
    require_f32(w, op, "w");
    OOMB_CHECK(w->ne[0] == x->ne[0] && oomb_nelements(w) == w->ne[0], op, "w %s must hold x's %" PRId64 " columns along dim 0, x %s",
               shape_str(w).c_str(), x->ne[0], shape_str(x).c_str());
    OOMB_CHECK(w->ne[0] <= 1 || w->nb[0] == sizeof(float), op, "w %s must have unit stride", shape_str(w).c_str());
    OOMB_CHECK(eps >= 0.0f, op, "eps = %g must be >= 0", eps);
}
struct oomb_tensor * oomb_rms_norm_mul_ext(struct oomb_context * ctx, struct oomb_tensor * x, struct oomb_tensor * w, float eps,
                                           enum oomb_type type) {
    check_rms_norm_mul_operands(x, w, eps, "rms_norm_mul");
    require_result_type(type, "rms_norm_mul");
    oomb_tensor * t = new_op(ctx, OOMB_OP_RMS_NORM_MUL, type, x->ne, x, w);
    oomb::set_op_f32(t, 0, eps);
    return t;
}
struct oomb_tensor * oomb_rms_norm_mul(struct oomb_context * ctx, struct oomb_tensor * x, struct oomb_tensor * w, float eps) {
    return oomb_rms_norm_mul_ext(ctx, x, w, eps, OOMB_TYPE_F32);
}
struct oomb_tensor * oomb_rms_norm_mul_back(struct oomb_context * ctx, struct oomb_tensor * x, struct oomb_tensor * w, struct oomb_tensor * dy,
                                            float eps, bool with_dw) {
    check_rms_norm_mul_operands(x, w, eps, "rms_norm_mul_back");
    require_f32(dy, "rms_norm_mul_back", "dy");
    require_same_shape(x, dy, "rms_norm_mul_back");
    const int64_t packed[4] = {x->ne[0], oomb_nrows(x) + 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_RMS_NORM_MUL_BACK, OOMB_TYPE_F32, with_dw ? packed : x->ne, x, w, dy);
    oomb::set_op_f32(t, 0, eps);
    t->op_params[1] = with_dw ? 1 : 0;
    return t;
}

static oomb_tensor * rope_impl(oomb_context * ctx, oomb_tensor * a, oomb_tensor * pos, int n_dims, float theta, oomb_tensor * ff,
                               enum oomb_op op) {
    const char * opn = oomb_op_name(op);
    require_f32(a, opn, "a");
    OOMB_CHECK(pos && pos->type == OOMB_TYPE_I32, opn, "pos must be i32, got %s", shape_str(pos).c_str());
    OOMB_CHECK(oomb_nelements(pos) == a->ne[2], opn, "pos %s must have one entry per token (a->ne[2] = %" PRId64 "), a %s",
               shape_str(pos).c_str(), a->ne[2], shape_str(a).c_str());
    OOMB_CHECK(n_dims > 0 && n_dims % 2 == 0 && n_dims <= a->ne[0], opn, "n_dims = %d must be even and in (0, head_dim = %" PRId64 "]",
               n_dims, a->ne[0]);
    OOMB_CHECK(theta > 0.0f, opn, "theta = %g must be positive", theta);
    if (ff) {
        OOMB_CHECK(ff->type == OOMB_TYPE_F32 && oomb_is_contiguous(ff) && oomb_nelements(ff) == n_dims / 2, opn,
                   "freq_factors %s must be f32, contiguous, with n_dims/2 = %d elements", shape_str(ff).c_str(), n_dims / 2);
    }
    oomb_tensor * t = new_op(ctx, op, OOMB_TYPE_F32, a->ne, a, pos, ff);
    t->op_params[0] = n_dims;
    oomb::set_op_f32(t, 1, theta);
    return t;
}
struct oomb_tensor * oomb_rope(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta) {
    return rope_impl(ctx, a, pos, n_dims, theta, nullptr, OOMB_OP_ROPE);
}
struct oomb_tensor * oomb_rope_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta) {
    return rope_impl(ctx, a, pos, n_dims, theta, nullptr, OOMB_OP_ROPE_BACK);
}
struct oomb_tensor * oomb_rope_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta,
                                   struct oomb_tensor * freq_factors) {
    return rope_impl(ctx, a, pos, n_dims, theta, freq_factors, OOMB_OP_ROPE);
}
struct oomb_tensor * oomb_rope_back_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta,
                                        struct oomb_tensor * freq_factors) {
    return rope_impl(ctx, a, pos, n_dims, theta, freq_factors, OOMB_OP_ROPE_BACK);
}

struct oomb_tensor * oomb_soft_max(struct oomb_context * ctx, struct oomb_tensor * a, float scale, int causal) {
    require_f32(a, "soft_max", "a");
    oomb_tensor * t = new_op(ctx, OOMB_OP_SOFT_MAX, OOMB_TYPE_F32, a->ne, a);
    oomb::set_op_f32(t, 0, scale);
    t->op_params[1] = causal;
    return t;
}
struct oomb_tensor * oomb_soft_max_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, float scale) {
    require_f32(a, "soft_max_back", "y");
    require_f32(b, "soft_max_back", "dy");
    require_same_shape(a, b, "soft_max_back");
    oomb_tensor * t = new_op(ctx, OOMB_OP_SOFT_MAX_BACK, OOMB_TYPE_F32, a->ne, a, b);
    oomb::set_op_f32(t, 0, scale);
    return t;
}

static void check_attn(const oomb_tensor * q, const oomb_tensor * k, const oomb_tensor * v, const char * op) {
    require_f32(q, op, "q");
    require_f32(k, op, "k");
    require_f32(v, op, "v");
    OOMB_CHECK(q->ne[0] == k->ne[0] && q->ne[0] == v->ne[0], op, "head dims differ: q %s, k %s, v %s", shape_str(q).c_str(),
               shape_str(k).c_str(), shape_str(v).c_str());
    OOMB_CHECK(oomb_are_same_shape(k, v), op, "k %s and v %s differ", shape_str(k).c_str(), shape_str(v).c_str());
    OOMB_CHECK(k->ne[1] > 0 && q->ne[1] % k->ne[1] == 0, op, "query heads (%" PRId64 ") must be a multiple of kv heads (%" PRId64 ")",
               q->ne[1], k->ne[1]);
    OOMB_CHECK(q->ne[3] == k->ne[3], op, "batch sizes differ: q %s, k %s", shape_str(q).c_str(), shape_str(k).c_str());
    OOMB_CHECK(k->ne[2] >= q->ne[2], op, "fewer keys (%" PRId64 ") than queries (%" PRId64 ")", k->ne[2], q->ne[2]);
}
struct oomb_tensor * oomb_attn(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k, struct oomb_tensor * v, float scale) {
    check_attn(q, k, v, "attn");
    oomb_tensor * t = new_op(ctx, OOMB_OP_ATTN, OOMB_TYPE_F32, q->ne, q, k, v);
    oomb::set_op_f32(t, 0, scale);
    return t;
}
struct oomb_tensor * oomb_attn_back(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k, struct oomb_tensor * v,
                                    struct oomb_tensor * dout, float scale) {
    check_attn(q, k, v, "attn_back");
    require_f32(dout, "attn_back", "dout");
    require_same_shape(q, dout, "attn_back");
    const int64_t ne[4] = {oomb_nelements(q) + oomb_nelements(k) + oomb_nelements(v), 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_ATTN_BACK, OOMB_TYPE_F32, ne, q, k, v, dout);
    oomb::set_op_f32(t, 0, scale);
    return t;
}

struct oomb_tensor * oomb_cross_entropy_loss(struct oomb_context * ctx, struct oomb_tensor * logits, struct oomb_tensor * labels, int32_t ignore_index) {
    require_f32(logits, "cross_entropy_loss", "logits");
    OOMB_CHECK(labels && labels->type == OOMB_TYPE_I32, "cross_entropy_loss", "labels must be i32, got %s", shape_str(labels).c_str());
    OOMB_CHECK(oomb_nelements(labels) == oomb_nrows(logits), "cross_entropy_loss", "labels %s must have one entry per row of logits %s",
               shape_str(labels).c_str(), shape_str(logits).c_str());
    const int64_t ne[4] = {2, 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_CROSS_ENTROPY, OOMB_TYPE_F32, ne, logits, labels);
    t->op_params[0] = ignore_index;
    return t;
}
struct oomb_tensor * oomb_cross_entropy_loss_back(struct oomb_context * ctx, struct oomb_tensor * logits, struct oomb_tensor * labels,
                                                  struct oomb_tensor * dloss, int32_t ignore_index) {
    require_f32(logits, "cross_entropy_loss_back", "logits");
    OOMB_CHECK(labels && labels->type == OOMB_TYPE_I32, "cross_entropy_loss_back", "labels must be i32, got %s", shape_str(labels).c_str());
    OOMB_CHECK(oomb_nelements(labels) == oomb_nrows(logits), "cross_entropy_loss_back", "labels %s must have one entry per row of logits %s",
               shape_str(labels).c_str(), shape_str(logits).c_str());
    require_f32(dloss, "cross_entropy_loss_back", "dloss");
    OOMB_CHECK(oomb_nelements(dloss) == 2, "cross_entropy_loss_back", "dloss must have 2 elements, got %s", shape_str(dloss).c_str());
    oomb_tensor * t = new_op(ctx, OOMB_OP_CROSS_ENTROPY_BACK, OOMB_TYPE_F32, logits->ne, logits, labels, dloss);
    t->op_params[0] = ignore_index;
    return t;
}

static void check_linear_ce(const oomb_tensor * w, const oomb_tensor * x, const oomb_tensor * labels, const char * op) {
    require_float(w, op, "w");
    require_f32(x, op, "x");
    OOMB_CHECK(w->ne[2] == 1 && w->ne[3] == 1, op, "w must be 2-D [E, V], got %s", shape_str(w).c_str());
    OOMB_CHECK(w->ne[0] > 0 && w->ne[1] > 0, op, "w %s must have E > 0 and V > 0", shape_str(w).c_str());
    OOMB_CHECK(x->ne[0] == w->ne[0], op, "inner dimensions differ (ne0): w %s, x %s", shape_str(w).c_str(), shape_str(x).c_str());
    OOMB_CHECK(labels && labels->type == OOMB_TYPE_I32, op, "labels must be i32, got %s", shape_str(labels).c_str());
    OOMB_CHECK(oomb_nelements(labels) == oomb_nrows(x), op, "labels %s must have one entry per row of x %s",
               shape_str(labels).c_str(), shape_str(x).c_str());
}

struct oomb_tensor * oomb_linear_cross_entropy(struct oomb_context * ctx, struct oomb_tensor * w, struct oomb_tensor * x,
                                               struct oomb_tensor * labels, int32_t ignore_index) {
    check_linear_ce(w, x, labels, "linear_cross_entropy");
    // the node holds { sum, count, lse_0 .. lse_{N-1} }; callers see its first 2 elements
    const int64_t ne[4] = {2 + oomb_nrows(x), 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_LINEAR_CROSS_ENTROPY, OOMB_TYPE_F32, ne, w, x, labels);
    t->op_params[0] = ignore_index;
    t->op_params[1] = 0; // vocabulary tile (0: automatic)
    oomb_set_name(t, "linear_cross_entropy (sum, count, lse)");
    oomb_tensor * r = oomb_view_1d(ctx, t, 2, 0);
    oomb_set_name(r, "linear_cross_entropy");
    return r;
}

void oomb_linear_cross_entropy_set_tile(struct oomb_tensor * t, int64_t rows) {
    OOMB_CHECK(t, "linear_cross_entropy_set_tile", "tensor is NULL");
    if (t->op == OOMB_OP_VIEW && t->view_src && t->view_src->op == OOMB_OP_LINEAR_CROSS_ENTROPY) t = t->view_src;
    OOMB_CHECK(t->op == OOMB_OP_LINEAR_CROSS_ENTROPY || t->op == OOMB_OP_LINEAR_CROSS_ENTROPY_BACK, "linear_cross_entropy_set_tile",
               "%s is not a linear_cross_entropy result (op %s)", shape_str(t).c_str(), oomb_op_name(t->op));
    OOMB_CHECK(rows >= 0 && rows <= INT32_MAX, "linear_cross_entropy_set_tile", "rows = %" PRId64 " out of range", rows);
    t->op_params[1] = (int32_t) rows;
}

int64_t oomb_linear_cross_entropy_tile_request(int64_t rows) {
    if (rows > 0) return rows;
    const char * e = getenv("OOMB_LCE_TILE");
    if (!e || !*e) return 0;
    char * end = nullptr;
    errno = 0;
    const long long t = strtoll(e, &end, 10);
    OOMB_CHECK(errno == 0 && end != e && *end == '\0' && t >= 0 && t <= INT32_MAX, "linear_cross_entropy",
               "OOMB_LCE_TILE = '%s' is not a tile (an integer of rows in [0, 2^31); 0 or unset: automatic)", e);
    return t;
}

int64_t oomb_linear_cross_entropy_tile(int64_t V, int64_t N, int64_t rows) {
    if (V <= 0) return 0;
    int64_t t = oomb_linear_cross_entropy_tile_request(rows);
    if (t <= 0) {
        // [Vt, N] f32 logits tile of at most 256 MiB; a multiple of 128 rows in [128, 16384]
        const int64_t budget = ((int64_t) 256 << 20) / (int64_t) sizeof(float);
        t = budget / std::max<int64_t>(N, 1) / 128 * 128;
        t = std::min<int64_t>(std::max<int64_t>(t, 128), 16384);
    }
    return std::min(t, V);
}

struct oomb_tensor * oomb_linear_cross_entropy_back(struct oomb_context * ctx, struct oomb_tensor * w, struct oomb_tensor * x,
                                                    struct oomb_tensor * labels, struct oomb_tensor * dloss,
                                                    struct oomb_tensor * lse, int32_t ignore_index, int grads) {
    const char * op = "linear_cross_entropy_back";
    check_linear_ce(w, x, labels, op);
    require_f32(dloss, op, "dloss");
    OOMB_CHECK(oomb_nelements(dloss) == 2, op, "dloss must have 2 elements, got %s", shape_str(dloss).c_str());
    const int64_t N = oomb_nrows(x), E = w->ne[0], V = w->ne[1];
    if (lse) {
        require_f32(lse, op, "lse");
        OOMB_CHECK(oomb_nelements(lse) == N && oomb_is_contiguous(lse), op, "lse %s must be contiguous with one entry per row of x %s",
                   shape_str(lse).c_str(), shape_str(x).c_str());
    }
    OOMB_CHECK(grads > 0 && (grads & ~(OOMB_LCE_GRAD_X | OOMB_LCE_GRAD_W)) == 0, op,
               "grads = %d must be OOMB_LCE_GRAD_X, OOMB_LCE_GRAD_W or both", grads);
    const int64_t ne[4] = {((grads & OOMB_LCE_GRAD_X) ? E * N : 0) + ((grads & OOMB_LCE_GRAD_W) ? E * V : 0), 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_LINEAR_CROSS_ENTROPY_BACK, OOMB_TYPE_F32, ne, w, x, labels, dloss, lse);
    t->op_params[0] = ignore_index;
    t->op_params[1] = 0;
    t->op_params[2] = grads;
    return t;
}

struct oomb_tensor * oomb_adamw_step(struct oomb_context * ctx, struct oomb_tensor * param, struct oomb_tensor * grad,
                                     struct oomb_tensor * m, struct oomb_tensor * v, struct oomb_tensor * hp) {
    OOMB_CHECK(param && (param->type == OOMB_TYPE_F32 || param->type == OOMB_TYPE_BF16), "adamw_step",
               "param must be f32 or bf16, got %s", shape_str(param).c_str());
    require_f32(grad, "adamw_step", "grad");
    OOMB_CHECK(m && v && (m->type == OOMB_TYPE_F32 || m->type == OOMB_TYPE_BF16) && v->type == m->type, "adamw_step",
               "m and v must both be f32 or both bf16, got m %s, v %s", shape_str(m).c_str(), shape_str(v).c_str());
    require_f32(hp, "adamw_step", "hp");
    require_same_shape(param, grad, "adamw_step");
    require_same_shape(param, m, "adamw_step");
    require_same_shape(param, v, "adamw_step");
    OOMB_CHECK(oomb_nelements(hp) == 8 || oomb_nelements(hp) == 9, "adamw_step", "hp must have 8 or 9 elements, got %s",
               shape_str(hp).c_str());
    OOMB_CHECK(m->type != OOMB_TYPE_BF16 || oomb_nelements(hp) == 9, "adamw_step",
               "bf16 moments need a 9th hyper-parameter, hp[8] = the step number (the stochastic-rounding seed); hp %s has %" PRId64
               " elements", shape_str(hp).c_str(), oomb_nelements(hp));
    OOMB_CHECK(oomb_is_contiguous(param) && oomb_is_contiguous(grad) && oomb_is_contiguous(m) && oomb_is_contiguous(v),
               "adamw_step", "param, grad, m and v must be contiguous");
    oomb_tensor * t = view_impl(ctx, param, 4, param->ne, param->nb, 0, OOMB_OP_ADAMW_STEP);
    t->src[0] = param; t->src[1] = grad; t->src[2] = m; t->src[3] = v; t->src[4] = hp;
    return t;
}

struct oomb_tensor * oomb_sgd_step(struct oomb_context * ctx, struct oomb_tensor * param, struct oomb_tensor * grad, struct oomb_tensor * hp) {
    OOMB_CHECK(param && (param->type == OOMB_TYPE_F32 || param->type == OOMB_TYPE_BF16), "sgd_step",
               "param must be f32 or bf16, got %s", shape_str(param).c_str());
    require_f32(grad, "sgd_step", "grad");
    require_f32(hp, "sgd_step", "hp");
    require_same_shape(param, grad, "sgd_step");
    OOMB_CHECK(oomb_nelements(hp) == 3, "sgd_step", "hp must have 3 elements, got %s", shape_str(hp).c_str());
    OOMB_CHECK(oomb_is_contiguous(param) && oomb_is_contiguous(grad), "sgd_step", "param and grad must be contiguous");
    oomb_tensor * t = view_impl(ctx, param, 4, param->ne, param->nb, 0, OOMB_OP_SGD_STEP);
    t->src[0] = param; t->src[1] = grad; t->src[2] = hp;
    return t;
}

static void check_paged(const oomb_tensor * q, const oomb_tensor * k_pages, const oomb_tensor * v_pages,
                        const oomb_tensor * page_table, const oomb_tensor * pos, const char * op) {
    require_f32(q, op, "q");
    require_float(k_pages, op, "k_pages");
    require_float(v_pages, op, "v_pages");
    OOMB_CHECK(oomb_are_same_shape(k_pages, v_pages) && k_pages->type == v_pages->type, op, "k_pages %s and v_pages %s differ",
               shape_str(k_pages).c_str(), shape_str(v_pages).c_str());
    OOMB_CHECK(oomb_is_contiguous(k_pages) && oomb_is_contiguous(v_pages), op, "page pools must be contiguous");
    OOMB_CHECK(q->ne[0] == k_pages->ne[0], op, "head dims differ: q %s, k_pages %s", shape_str(q).c_str(), shape_str(k_pages).c_str());
    OOMB_CHECK(k_pages->ne[1] > 0 && q->ne[1] % k_pages->ne[1] == 0, op,
               "query heads (%" PRId64 ") must be a multiple of kv heads (%" PRId64 ")", q->ne[1], k_pages->ne[1]);
    OOMB_CHECK(q->ne[3] == 1, op, "q %s: one sequence at a time (ne3 must be 1)", shape_str(q).c_str());
    OOMB_CHECK(page_table && page_table->type == OOMB_TYPE_I32 && oomb_is_contiguous(page_table), op,
               "page_table must be a contiguous i32 tensor, got %s", shape_str(page_table).c_str());
    OOMB_CHECK(pos && pos->type == OOMB_TYPE_I32 && oomb_nelements(pos) == q->ne[2] && oomb_is_contiguous(pos), op,
               "pos %s must be contiguous i32 with one entry per query (T = %" PRId64 ")", shape_str(pos).c_str(), q->ne[2]);
}

// A schedule's operands (oomb-schedule.h); `backward`: LISTS also need the inverse lists.
static void check_schedule(const oomb_page_schedule & s, bool backward, const char * op) {
    auto i32 = [&](const oomb_tensor * t, const char * what) {
        OOMB_CHECK(t && t->type == OOMB_TYPE_I32 && oomb_is_contiguous(t) && oomb_nelements(t) >= 1, op,
                   "schedule %s must be a contiguous i32 tensor of at least one element, got %s", what,
                   t ? shape_str(t).c_str() : "NULL");
    };
    switch (s.kind) {
        case OOMB_SCHEDULE_DENSE:
            OOMB_CHECK(!s.offsets && !s.pages && !s.inv_offsets && !s.inv_qtiles, op, "a dense schedule takes no list tensors");
            break;
        case OOMB_SCHEDULE_RANGE:
            OOMB_CHECK(s.first >= 0 && s.last >= s.first, op, "page range [%d, %d) must have 0 <= first <= last", s.first, s.last);
            OOMB_CHECK(!s.offsets && !s.pages && !s.inv_offsets && !s.inv_qtiles, op, "a page-range schedule takes no list tensors");
            break;
        case OOMB_SCHEDULE_LISTS_RANGE:
            OOMB_CHECK(s.first >= 0 && s.last >= s.first, op, "page-lists window [%d, %d) must have 0 <= first <= last", s.first,
                       s.last);
            [[fallthrough]];  // the lists' operands
        case OOMB_SCHEDULE_LISTS:
            i32(s.offsets, "offsets");
            i32(s.pages, "pages");
            OOMB_CHECK(oomb_nelements(s.offsets) >= 2, op, "schedule offsets %s must have n_qtiles + 1 >= 2 entries",
                       shape_str(s.offsets).c_str());
            if (backward || s.inv_offsets || s.inv_qtiles) {
                i32(s.inv_offsets, "inv_offsets (the backward needs the inverse lists: oomb_schedule_invert)");
                i32(s.inv_qtiles, "inv_qtiles (the backward needs the inverse lists: oomb_schedule_invert)");
                OOMB_CHECK(oomb_nelements(s.inv_qtiles) == oomb_nelements(s.pages), op,
                           "inverse lists %s must hold as many entries as the lists %s", shape_str(s.inv_qtiles).c_str(),
                           shape_str(s.pages).c_str());
            }
            break;
        default:
            OOMB_CHECK(false, op, "unknown schedule kind %d", (int) s.kind);
    }
}

static void set_schedule(oomb_tensor * t, const oomb_page_schedule & s, int src_offsets, int src_pages) {
    t->op_params[oomb::PA_PARAM_SCHED_KIND] = (int32_t) s.kind;
    t->op_params[oomb::PA_PARAM_SCHED_FIRST] = s.first;
    t->op_params[oomb::PA_PARAM_SCHED_LAST] = s.last;
    if (oomb_schedule_has_lists(s.kind)) {
        t->src[src_offsets] = s.offsets;
        t->src[src_pages] = s.pages;
    }
}

struct oomb_tensor * oomb_paged_attn_ext(struct oomb_context * ctx, const struct oomb_paged_attn_args * a) {
    OOMB_CHECK(a, "paged_attn", "args must not be NULL");
    oomb_tensor * out_cache = a->out_cache;
    const int load = a->load, store = a->store;
    if (out_cache) {
        OOMB_CHECK((out_cache->type == OOMB_TYPE_F32 || out_cache->type == OOMB_TYPE_BF16) && oomb_is_contiguous(out_cache),
                   "paged_attn_cached", "out_cache must be a contiguous f32 or bf16 tensor, got %s", shape_str(out_cache).c_str());
        OOMB_CHECK((load == 0 || load == 1) && (store == 0 || store == 1), "paged_attn_cached",
                   "store (%d) and load (%d) must be 0 or 1", store, load);
        OOMB_CHECK(!(load && store), "paged_attn_cached", "load = 1 reads a result computed earlier over stored K/V: store must be 0");
        OOMB_CHECK(a->schedule.kind == OOMB_SCHEDULE_DENSE || a->schedule.kind == OOMB_SCHEDULE_LISTS, "paged_attn_cached",
                   "the result cache holds whole rows' results (a dense or a page-list schedule), not a window's: schedule kind %d",
                   (int) a->schedule.kind);
    } else {
        OOMB_CHECK(load == 0, "paged_attn", "load = %d without a result cache", load);
    }
    OOMB_CHECK(a->accumulate == 0 || a->accumulate == 1, "paged_attn", "accumulate (%d) must be 0 or 1", a->accumulate);
    OOMB_CHECK(!a->accumulate || (!store && !out_cache), "paged_attn",
               "accumulate = 1 merges into an earlier result: no store (%d) and no result cache", store);
    oomb_tensor * q = a->q, * k_cur = a->k_cur, * v_cur = a->v_cur, * k_pages = a->k_pages, * v_pages = a->v_pages;
    check_paged(q, k_pages, v_pages, a->page_table, a->pos, "paged_attn");
    require_f32(k_cur, "paged_attn", "k_cur");
    require_f32(v_cur, "paged_attn", "v_cur");
    OOMB_CHECK(k_cur->ne[0] == k_pages->ne[0] && k_cur->ne[1] == k_pages->ne[1] && k_cur->ne[2] == q->ne[2] && k_cur->ne[3] == 1,
               "paged_attn", "k_cur %s must be [D, Hkv, T] = [%" PRId64 ", %" PRId64 ", %" PRId64 "]", shape_str(k_cur).c_str(),
               k_pages->ne[0], k_pages->ne[1], q->ne[2]);
    require_same_shape(k_cur, v_cur, "paged_attn");
    check_schedule(a->schedule, false, "paged_attn");
    // one node holding out [D, H, T] and the per-row log-sum-exp [H, T] back to back (oomb.h); the
    // caller gets a contiguous view of the out part
    const int64_t D = q->ne[0], H = q->ne[1], T = q->ne[2];
    const int64_t ne[4] = {D * H * T + H * T, 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_PAGED_ATTN, OOMB_TYPE_F32, ne, q, k_cur, v_cur, k_pages, v_pages);
    t->src[oomb::PA_SRC_PAGE_TABLE] = a->page_table;
    t->src[oomb::PA_SRC_POS] = a->pos;
    oomb::set_op_f32(t, oomb::PA_PARAM_SCALE, a->scale);
    t->op_params[oomb::PA_PARAM_STORE] = store;
    t->op_params[oomb::PA_PARAM_ACCUM] = a->accumulate;
    set_schedule(t, a->schedule, oomb::PA_SRC_SCHED_OFFSETS, oomb::PA_SRC_SCHED_PAGES);
    if (oomb_schedule_has_lists(a->schedule.kind)) {  // optional here, kept for the autodiff's backward
        t->src[oomb::PA_SRC_INV_OFFSETS] = a->schedule.inv_offsets;
        t->src[oomb::PA_SRC_INV_QTILES] = a->schedule.inv_qtiles;
    }
    if (out_cache) {
        const int64_t row = oomb_paged_attn_cache_row(D, H, out_cache->type);  // elements per query position
        OOMB_CHECK(oomb_nelements(out_cache) >= row * T, "paged_attn_cached",
                   "out_cache %s holds fewer than T = %" PRId64 " positions of %" PRId64 " elements", shape_str(out_cache).c_str(), T,
                   row);
        t->src[oomb::PA_SRC_OUT_CACHE] = out_cache;
        t->op_params[oomb::PA_PARAM_CACHE] = load ? 2 : 1;  // 1: compute, then save into the cache; 2: load from the cache
    }
    return oomb_view_3d(ctx, t, D, H, T, sizeof(float) * (size_t) D, sizeof(float) * (size_t) (D * H), 0);
}

struct oomb_tensor * oomb_paged_attn(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k_cur,
                                     struct oomb_tensor * v_cur, struct oomb_tensor * k_pages, struct oomb_tensor * v_pages,
                                     struct oomb_tensor * page_table, struct oomb_tensor * pos, float scale, int store) {
    oomb_paged_attn_args a{};
    a.q = q; a.k_cur = k_cur; a.v_cur = v_cur; a.k_pages = k_pages; a.v_pages = v_pages;
    a.page_table = page_table; a.pos = pos;
    a.schedule = oomb_schedule_dense();
    a.scale = scale; a.store = store;
    return oomb_paged_attn_ext(ctx, &a);
}

int64_t oomb_paged_attn_cache_row(int64_t D, int64_t H, enum oomb_type type) {
    OOMB_CHECK(type == OOMB_TYPE_F32 || type == OOMB_TYPE_BF16, "paged_attn_cache_row", "cache type must be f32 or bf16, got %s",
               oomb_type_name(type));
    return type == OOMB_TYPE_F32 ? D * H + H : D * H + 2 * H;
}

struct oomb_tensor * oomb_paged_attn_cached(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k_cur,
                                            struct oomb_tensor * v_cur, struct oomb_tensor * k_pages, struct oomb_tensor * v_pages,
                                            struct oomb_tensor * page_table, struct oomb_tensor * pos, float scale, int store,
                                            struct oomb_tensor * out_cache, int load) {
    OOMB_CHECK(out_cache, "paged_attn_cached", "out_cache must be a contiguous f32 or bf16 tensor, got NULL");
    oomb_paged_attn_args a{};
    a.q = q; a.k_cur = k_cur; a.v_cur = v_cur; a.k_pages = k_pages; a.v_pages = v_pages;
    a.page_table = page_table; a.pos = pos;
    a.schedule = oomb_schedule_dense();
    a.scale = scale; a.store = store;
    a.out_cache = out_cache; a.load = load;
    return oomb_paged_attn_ext(ctx, &a);
}

static bool same_schedule(const oomb_page_schedule & x, const oomb_page_schedule & y) {
    if (x.kind != y.kind) return false;
    if (x.kind == OOMB_SCHEDULE_RANGE) return x.first == y.first && x.last == y.last;
    if (x.kind == OOMB_SCHEDULE_LISTS) return x.offsets == y.offsets && x.pages == y.pages;
    if (x.kind == OOMB_SCHEDULE_LISTS_RANGE)
        return x.offsets == y.offsets && x.pages == y.pages && x.first == y.first && x.last == y.last;
    return true;
}

// Does a forward computed under schedule f hold the statistics a backward under schedule b needs?
// The same schedule; or b a window of f (RANGE of DENSE, LISTS_RANGE of LISTS with the same lists):
// the window's keys' gradients given the whole row's statistics, one block of a split backward.
static bool schedule_encloses(const oomb_page_schedule & f, const oomb_page_schedule & b) {
    if (b.kind == OOMB_SCHEDULE_RANGE && f.kind == OOMB_SCHEDULE_DENSE) return true;
    if (b.kind == OOMB_SCHEDULE_LISTS_RANGE && f.kind == OOMB_SCHEDULE_LISTS) return f.offsets == b.offsets && f.pages == b.pages;
    return same_schedule(f, b);
}

struct oomb_tensor * oomb_paged_attn_back_ext(struct oomb_context * ctx, const struct oomb_paged_attn_args * a) {
    OOMB_CHECK(a, "paged_attn_back", "args must not be NULL");
    oomb_tensor * q = a->q, * k_pages = a->k_pages, * v_pages = a->v_pages, * dk_pages = a->dk_pages, * dv_pages = a->dv_pages;
    oomb_tensor * page_table = a->page_table, * pos = a->pos, * dout = a->dout, * fwd = a->fwd;
    const float scale = a->scale;
    check_paged(q, k_pages, v_pages, page_table, pos, "paged_attn_back");
    OOMB_CHECK(dk_pages && dv_pages && (dk_pages->type == OOMB_TYPE_F32 || dk_pages->type == OOMB_TYPE_BF16) &&
                   dv_pages->type == dk_pages->type && oomb_is_contiguous(dk_pages) && oomb_is_contiguous(dv_pages),
               "paged_attn_back", "gradient pages must be contiguous and both f32 or both bf16, got dk_pages %s (%s), dv_pages %s (%s)",
               dk_pages ? shape_str(dk_pages).c_str() : "NULL", dk_pages ? oomb_type_name(dk_pages->type) : "-",
               dv_pages ? shape_str(dv_pages).c_str() : "NULL", dv_pages ? oomb_type_name(dv_pages->type) : "-");
    OOMB_CHECK(oomb_are_same_shape(dk_pages, k_pages) && oomb_are_same_shape(dv_pages, k_pages), "paged_attn_back",
               "gradient pages %s / %s must be shaped like the pools %s", shape_str(dk_pages).c_str(), shape_str(dv_pages).c_str(),
               shape_str(k_pages).c_str());
    require_f32(dout, "paged_attn_back", "dout");
    require_same_shape(q, dout, "paged_attn_back");
    OOMB_CHECK(a->accumulate == 0 || a->accumulate == 1, "paged_attn_back", "accumulate (%d) must be 0 or 1", a->accumulate);
    check_schedule(a->schedule, true, "paged_attn_back");
    if (fwd) {
        // the view oomb_paged_attn returns (or any view / reshape of it), or its packed node
        if (fwd->view_src && fwd->view_src->op == OOMB_OP_PAGED_ATTN) fwd = fwd->view_src;
        const int64_t D = q->ne[0], H = q->ne[1], T = q->ne[2];
        OOMB_CHECK(fwd->op == OOMB_OP_PAGED_ATTN && !fwd->view_src, "paged_attn_back",
                   "fwd %s (op %s) must be the result of oomb_paged_attn (its view or its packed node)", shape_str(fwd).c_str(),
                   oomb_op_name(fwd->op));
        const oomb_paged_attn_args f = oomb_paged_attn_args_of(fwd);
        OOMB_CHECK(fwd->type == OOMB_TYPE_F32 && oomb_is_contiguous(fwd) && oomb_nelements(fwd) == D * H * T + H * T && f.q &&
                       oomb_are_same_shape(f.q, q) && f.k_pages && oomb_are_same_shape(f.k_pages, k_pages) &&
                       f.k_pages->type == k_pages->type,
                   "paged_attn_back",
                   "fwd %s is the paged_attn of q %s over pools %s, not of q %s over pools %s (D*H*T + H*T = %" PRId64
                   " elements expected)",
                   shape_str(fwd).c_str(), f.q ? shape_str(f.q).c_str() : "none", f.k_pages ? shape_str(f.k_pages).c_str() : "none",
                   shape_str(q).c_str(), shape_str(k_pages).c_str(), D * H * T + H * T);
        // its statistics belong to exactly these inputs: the same q, pools, page table, positions, scale
        OOMB_CHECK(f.q == q && f.k_pages == k_pages && f.v_pages == v_pages && f.page_table == page_table && f.pos == pos &&
                       f.scale == scale,
                   "paged_attn_back",
                   "fwd %s was computed from other inputs (q, pools, page table, positions or scale %g vs %g differ): its saved "
                   "log-sum-exp does not belong to this backward (pass NULL to recompute)",
                   shape_str(fwd).c_str(), (double) f.scale, (double) scale);
        OOMB_CHECK(schedule_encloses(f.schedule, a->schedule), "paged_attn_back",
                   "fwd %s was computed with another page schedule (kind %d vs %d, or other range / lists; a page range needs a "
                   "dense fwd or the same range, page lists with a window the same lists): its saved statistics do not belong "
                   "to this backward",
                   shape_str(fwd).c_str(), (int) f.schedule.kind, (int) a->schedule.kind);
    }
    OOMB_CHECK(!a->accumulate || fwd, "paged_attn_back",
               "accumulate = 1 needs fwd, the saved statistics of the whole rows: recomputed, they would cover only this block's "
               "keys (a wrong gradient)");
    const int64_t n_kv = k_pages->ne[0] * k_pages->ne[1] * q->ne[2];
    const int64_t ne[4] = {oomb_nelements(q) + 2 * n_kv, 1, 1, 1};
    oomb_tensor * t = new_op(ctx, OOMB_OP_PAGED_ATTN_BACK, OOMB_TYPE_F32, ne, q, k_pages, v_pages, dk_pages, dv_pages);
    t->src[oomb::PAB_SRC_PAGE_TABLE] = page_table;
    t->src[oomb::PAB_SRC_POS] = pos;
    t->src[oomb::PAB_SRC_DOUT] = dout;
    t->src[oomb::PAB_SRC_FWD] = fwd;  // NULL: the backward recomputes the statistics
    oomb::set_op_f32(t, oomb::PA_PARAM_SCALE, scale);
    t->op_params[oomb::PA_PARAM_ACCUM] = a->accumulate;
    set_schedule(t, a->schedule, oomb::PAB_SRC_SCHED_OFFSETS, oomb::PAB_SRC_SCHED_PAGES);
    if (oomb_schedule_has_lists(a->schedule.kind)) {
        t->src[oomb::PAB_SRC_INV_OFFSETS] = a->schedule.inv_offsets;
        t->src[oomb::PAB_SRC_INV_QTILES] = a->schedule.inv_qtiles;
    }
    return t;
}

struct oomb_tensor * oomb_paged_attn_back(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k_pages,
                                          struct oomb_tensor * v_pages, struct oomb_tensor * dk_pages,
                                          struct oomb_tensor * dv_pages, struct oomb_tensor * page_table,
                                          struct oomb_tensor * pos, struct oomb_tensor * dout, struct oomb_tensor * fwd,
                                          float scale) {
    oomb_paged_attn_args a{};
    a.q = q; a.k_pages = k_pages; a.v_pages = v_pages; a.page_table = page_table; a.pos = pos;
    a.schedule = oomb_schedule_dense();
    a.scale = scale;
    a.dout = dout; a.fwd = fwd; a.dk_pages = dk_pages; a.dv_pages = dv_pages;
    return oomb_paged_attn_back_ext(ctx, &a);
}

// The seed lives in op_params[0] of the gradient-page tensor, a leaf (no op reads its op_params).
void oomb_paged_attn_set_grad_seed(struct oomb_tensor * grad_pages, uint32_t seed) {
    OOMB_CHECK(grad_pages, "paged_attn_set_grad_seed", "grad_pages must not be NULL");
    OOMB_CHECK(grad_pages->op == OOMB_OP_NONE, "paged_attn_set_grad_seed", "%s is the result of op %s, not a gradient-page tensor",
               shape_str(grad_pages).c_str(), oomb_op_name(grad_pages->op));
    std::memcpy(&grad_pages->op_params[0], &seed, sizeof(seed));
}

uint32_t oomb_paged_attn_grad_seed(const struct oomb_tensor * grad_pages) {
    OOMB_CHECK(grad_pages, "paged_attn_grad_seed", "grad_pages must not be NULL");
    uint32_t seed;
    std::memcpy(&seed, &grad_pages->op_params[0], sizeof(seed));
    return seed;
}

struct oomb_paged_attn_args oomb_paged_attn_args_of(const struct oomb_tensor * node) {
    OOMB_CHECK(node, "paged_attn_args_of", "node must not be NULL");
    if (node->op != OOMB_OP_PAGED_ATTN && node->view_src && node->view_src->op == OOMB_OP_PAGED_ATTN) node = node->view_src;
    OOMB_CHECK(node->op == OOMB_OP_PAGED_ATTN || node->op == OOMB_OP_PAGED_ATTN_BACK, "paged_attn_args_of",
               "%s (op %s) is not a paged_attn or paged_attn_back node", shape_str(node).c_str(), oomb_op_name(node->op));
    oomb_paged_attn_args a{};
    oomb_tensor * const * s = node->src;
    a.scale = oomb::get_op_f32(node, oomb::PA_PARAM_SCALE);
    a.schedule.kind = (oomb_page_schedule_kind) node->op_params[oomb::PA_PARAM_SCHED_KIND];
    a.schedule.first = node->op_params[oomb::PA_PARAM_SCHED_FIRST];
    a.schedule.last = node->op_params[oomb::PA_PARAM_SCHED_LAST];
    a.accumulate = node->op_params[oomb::PA_PARAM_ACCUM];
    if (node->op == OOMB_OP_PAGED_ATTN) {
        a.q = s[oomb::PA_SRC_Q]; a.k_cur = s[oomb::PA_SRC_K_CUR]; a.v_cur = s[oomb::PA_SRC_V_CUR];
        a.k_pages = s[oomb::PA_SRC_K_PAGES]; a.v_pages = s[oomb::PA_SRC_V_PAGES];
        a.page_table = s[oomb::PA_SRC_PAGE_TABLE]; a.pos = s[oomb::PA_SRC_POS];
        a.schedule.offsets = s[oomb::PA_SRC_SCHED_OFFSETS]; a.schedule.pages = s[oomb::PA_SRC_SCHED_PAGES];
        a.schedule.inv_offsets = s[oomb::PA_SRC_INV_OFFSETS]; a.schedule.inv_qtiles = s[oomb::PA_SRC_INV_QTILES];
        a.store = node->op_params[oomb::PA_PARAM_STORE];
        a.out_cache = s[oomb::PA_SRC_OUT_CACHE];
        a.load = node->op_params[oomb::PA_PARAM_CACHE] == 2;
    } else {
        a.q = s[oomb::PAB_SRC_Q]; a.k_pages = s[oomb::PAB_SRC_K_PAGES]; a.v_pages = s[oomb::PAB_SRC_V_PAGES];
        a.dk_pages = s[oomb::PAB_SRC_DK_PAGES]; a.dv_pages = s[oomb::PAB_SRC_DV_PAGES];
        a.page_table = s[oomb::PAB_SRC_PAGE_TABLE]; a.pos = s[oomb::PAB_SRC_POS];
        a.dout = s[oomb::PAB_SRC_DOUT]; a.fwd = s[oomb::PAB_SRC_FWD];
        a.schedule.offsets = s[oomb::PAB_SRC_SCHED_OFFSETS]; a.schedule.pages = s[oomb::PAB_SRC_SCHED_PAGES];
        a.schedule.inv_offsets = s[oomb::PAB_SRC_INV_OFFSETS]; a.schedule.inv_qtiles = s[oomb::PAB_SRC_INV_QTILES];
    }
    return a;
}

struct oomb_tensor * oomb_paged_attn_merge(struct oomb_context * ctx, struct oomb_tensor * acc, struct oomb_tensor * part,
                                           int64_t D, int64_t H, int64_t T) {
    const char * op = "paged_attn_merge";
    require_f32(acc, op, "acc");
    require_f32(part, op, "part");
    OOMB_CHECK(D >= 1 && H >= 1 && T >= 1 && D <= INT32_MAX && H <= INT32_MAX && T <= INT32_MAX, op,
               "D = %" PRId64 ", H = %" PRId64 ", T = %" PRId64 " must each be in [1, 2^31)", D, H, T);
    const int64_t n = D * H * T + H * T;
    OOMB_CHECK(oomb_nelements(acc) == n && oomb_nelements(part) == n, op,
               "acc %s and part %s must each hold D*H*T + H*T = %" PRId64 " elements (the packed paged_attn result of D = %" PRId64
               ", H = %" PRId64 ", T = %" PRId64 ": out, then the LSE per row)",
               shape_str(acc).c_str(), shape_str(part).c_str(), n, D, H, T);
    OOMB_CHECK(oomb_is_contiguous(acc) && oomb_is_contiguous(part), op, "acc %s and part %s must be contiguous",
               shape_str(acc).c_str(), shape_str(part).c_str());
    OOMB_CHECK(acc != part, op, "acc and part are the same tensor %s", shape_str(acc).c_str());
    // views of one owner must not overlap (acc is written in place while part is read)
    if (oomb::mem_owner(acc) == oomb::mem_owner(part)) {
        const size_t a0 = acc->view_src ? acc->view_offs : 0, p0 = part->view_src ? part->view_offs : 0, nb = oomb_nbytes(acc);
        OOMB_CHECK(a0 + nb <= p0 || p0 + nb <= a0, op, "acc %s and part %s overlap in the memory of %s", shape_str(acc).c_str(),
                   shape_str(part).c_str(), shape_str(oomb::mem_owner(acc)).c_str());
    }
    oomb_tensor * t = view_impl(ctx, acc, 4, acc->ne, acc->nb, 0, OOMB_OP_PAGED_ATTN_MERGE);
    t->src[0] = acc; t->src[1] = part;
    t->op_params[oomb::PAM_PARAM_D] = (int32_t) D;
    t->op_params[oomb::PAM_PARAM_H] = (int32_t) H;
    t->op_params[oomb::PAM_PARAM_T] = (int32_t) T;
    return t;
}

// ---------------------------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------------------------

struct oomb_cgraph * oomb_new_graph(struct oomb_context * ctx) { return oomb_new_graph_custom(ctx, OOMB_DEFAULT_GRAPH_SIZE); }
struct oomb_cgraph * oomb_new_graph_custom(struct oomb_context * ctx, size_t size) {
    ctx->graphs.emplace_back();
    oomb_cgraph * g = &ctx->graphs.back();
    g->size = size ? size : OOMB_DEFAULT_GRAPH_SIZE;
    return g;
}

struct oomb_cgraph * oomb_graph_view(struct oomb_context * ctx, struct oomb_cgraph * g, int i0, int i1) {
    OOMB_CHECK(ctx && g, "graph_view", "ctx and g must not be NULL");
    OOMB_CHECK(0 <= i0 && i0 <= i1 && (size_t) i1 <= g->nodes.size(), "graph_view", "nodes [%d, %d) of a graph of %zu nodes", i0, i1,
               g->nodes.size());
    ctx->graphs.emplace_back();
    oomb_cgraph * v = &ctx->graphs.back();
    v->size = (size_t) (i1 - i0);
    v->nodes.assign(g->nodes.begin() + i0, g->nodes.begin() + i1);
    v->version = g->version;
    v->alloc_id = g->alloc_id;
    v->alloc_gen = g->alloc_gen;
    v->continuation = i0 > 0 || g->continuation;
    v->is_view = true;
    return v;
}

void oomb_graph_set_continuation(struct oomb_cgraph * g, bool on) {
    OOMB_CHECK(g, "graph_set_continuation", "g must not be NULL");
    g->continuation = on;
}

static void visit(oomb_cgraph * g, oomb_tensor * t) {
    // iterative post-order DFS (graphs of long models are deep)
    struct frame { oomb_tensor * t; int next; };
    std::vector<frame> stack;
    if (g->visited.count(t)) return;
    g->visited.insert(t);
    stack.push_back({t, 0});
    while (!stack.empty()) {
        frame & f = stack.back();
        if (f.next < OOMB_MAX_SRC) {
            oomb_tensor * s = f.t->src[f.next++];
            if (s && !g->visited.count(s)) {
                g->visited.insert(s);
                stack.push_back({s, 0});
            }
            continue;
        }
        oomb_tensor * n = f.t;
        stack.pop_back();
        if (n->op == OOMB_OP_NONE) {
            g->leafs.push_back(n);
        } else {
            OOMB_CHECK(g->nodes.size() < g->size, "build_forward_expand", "graph is full (%zu nodes); use oomb_new_graph_custom",
                       g->size);
            g->nodes.push_back(n);
        }
    }
}

void oomb_build_forward_expand(struct oomb_cgraph * g, struct oomb_tensor * t) {
    OOMB_CHECK(t, "build_forward_expand", "tensor is NULL");
    const size_t n0 = g->nodes.size(), l0 = g->leafs.size();
    visit(g, t);
    if (g->nodes.size() != n0 || g->leafs.size() != l0) g->version++;
}

struct oomb_tensor * oomb_new_grad(struct oomb_context * ctx, struct oomb_tensor * param) {
    OOMB_CHECK(param, "new_grad", "param is NULL");
    oomb_tensor * g = oomb_new_tensor(ctx, OOMB_TYPE_F32, 4, param->ne);
    oomb_format_name(g, "%.56s.grad", param->name);
    param->grad = g;
    return g;
}

int oomb_graph_n_nodes(const struct oomb_cgraph * g) { return (int) g->nodes.size(); }
struct oomb_tensor * oomb_graph_node(struct oomb_cgraph * g, int i) {
    const int n = (int) g->nodes.size();
    if (i < 0) i += n;
    OOMB_CHECK(i >= 0 && i < n, "graph_node", "index %d out of range (%d nodes)", i, n);
    return g->nodes[i];
}
int oomb_graph_n_leafs(const struct oomb_cgraph * g) { return (int) g->leafs.size(); }
struct oomb_tensor * oomb_graph_leaf(struct oomb_cgraph * g, int i) {
    const int n = (int) g->leafs.size();
    if (i < 0) i += n;
    OOMB_CHECK(i >= 0 && i < n, "graph_leaf", "index %d out of range (%d leafs)", i, n);
    return g->leafs[i];
}
void oomb_graph_clear(struct oomb_cgraph * g) {
    g->nodes.clear();
    g->leafs.clear();
    g->visited.clear();
    g->version++;
}
void oomb_graph_print(const struct oomb_cgraph * g) {
    fprintf(stderr, "graph: %zu nodes, %zu leafs\n", g->nodes.size(), g->leafs.size());
    for (size_t i = 0; i < g->nodes.size(); i++) {
        const oomb_tensor * t = g->nodes[i];
        fprintf(stderr, "  %4zu %-24s %s\n", i, oomb_op_name(t->op), shape_str(t).c_str());
    }
}
