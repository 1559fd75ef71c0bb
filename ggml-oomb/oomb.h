// ggml-oomb: a small ggml-style tensor library with training support.
//
// Public C API of the core: tensors (up to 4-D; f32, f16, bf16, i32), contexts that hold tensor
// metadata, lazy ops that build a computation graph, automatic differentiation, the arena graph
// allocator (oomb-alloc.h) and backends (oomb-backend.h).
//
// Conventions (as in ggml):
//   - ne[i] is the number of elements in dimension i, dimension 0 is the innermost (contiguous) one;
//     nb[i] is the stride of dimension i in bytes. A tensor [K, M] in this API has ne0 = K, ne1 = M:
//     M rows of K elements each (a PyTorch tensor of shape (M, K)).
//   - Ops are lazy: oomb_add(ctx, a, b) records a node and returns its (not yet computed) result.
//     oomb_build_forward_expand() collects the nodes into a graph; a backend computes the graph.
//   - Misuse (mismatched shapes or types, out-of-range views, a full context) is reported through
//     the error handler: by default it prints "oomb error: <op>: <message>" to stderr and calls
//     abort(). oomb_set_error_handler() replaces it (the handler must not return: abort, exit or
//     throw a C++ exception). The message always names the op and the shapes involved.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "oomb-schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OOMB_MAX_DIMS      4
#define OOMB_MAX_SRC       13 // paged_attn_back uses src[0..12] (oomb_paged_attn_args_of)
#define OOMB_MAX_OP_PARAMS 16
#define OOMB_MAX_NAME      64
#define OOMB_DEFAULT_GRAPH_SIZE 16384

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

enum oomb_type {
    OOMB_TYPE_F32  = 0,
    OOMB_TYPE_F16  = 1,
    OOMB_TYPE_BF16 = 2,
    OOMB_TYPE_I32  = 3,
    // ggml's block types (frozen quantized weights, as stored in GGUF files; dequantized by
    // src/formats/quants.h). A block of oomb_blck_size(type) consecutive elements of a row takes
    // oomb_type_size(type) bytes. Allowed only as graph leaves without gradient, as a of mul_mat
    // (contiguous, or the transposed view the autodiff makes for db), in whole-row views /
    // reshapes / one transpose, and as the source of oomb_cast / oomb_cpy to f32 or bf16.
    OOMB_TYPE_Q8_0 = 4,
    OOMB_TYPE_Q4_0 = 5,
    OOMB_TYPE_Q4_1 = 6,
    OOMB_TYPE_Q5_0 = 7,
    OOMB_TYPE_Q5_1 = 8,
    OOMB_TYPE_Q2_K = 9,
    OOMB_TYPE_Q3_K = 10,
    OOMB_TYPE_Q4_K = 11,
    OOMB_TYPE_Q5_K = 12,
    OOMB_TYPE_Q6_K = 13,
    OOMB_TYPE_COUNT,
};

/// Bytes of one block of `type`: the element size for plain types (f32 4, f16 / bf16 2, i32 4),
/// e.g. 34 for q8_0, 144 for q4_k. Error: an unknown type.
size_t oomb_type_size(enum oomb_type type);
/// Elements per block of `type`: 1 for plain types, 32 (q8_0, q4_0, q4_1, q5_0, q5_1) or 256
/// (q2_k .. q6_k). Error: an unknown type.
int64_t oomb_blck_size(enum oomb_type type);
/// Bytes of a row of ne0 elements of `type` (ne0 / blck_size blocks). Error: ne0 negative or not
/// a multiple of the block size.
size_t oomb_row_size(enum oomb_type type, int64_t ne0);
/// true for the block types (q8_0 .. q6_k).
bool oomb_type_is_quantized(enum oomb_type type);
/// The ggml / GGUF type id of `type` (gguf_tensor_type: F32 0, F16 1, BF16 30, I32 26, Q8_0 8,
/// Q4_K 12, ...).
uint32_t oomb_type_to_ggml(enum oomb_type type);
/// The oomb type of ggml / GGUF type id t; false when there is none (IQ*, TQ*, Q8_K, ...).
bool oomb_type_from_ggml(uint32_t t, enum oomb_type * type);
/// Name of `type` ("f32", "f16", "bf16", "i32", "q8_0", ..., "q6_k").
const char * oomb_type_name(enum oomb_type type);

/// Scalar conversions (round to nearest even; NaN and infinities preserved).
uint16_t oomb_fp32_to_bf16(float x);
float    oomb_bf16_to_fp32(uint16_t x);
uint16_t oomb_fp32_to_fp16(float x);
float    oomb_fp16_to_fp32(uint16_t x);

enum oomb_op {
    OOMB_OP_NONE = 0,   // leaf: data comes from outside the graph (parameter, input, constant)

    // layout (no compute for the first four: the result is a view of src[0])
    OOMB_OP_VIEW,
    OOMB_OP_RESHAPE,
    OOMB_OP_PERMUTE,
    OOMB_OP_TRANSPOSE,
    OOMB_OP_CONT,       // contiguous copy, same type
    OOMB_OP_CPY,        // copy src[0] into src[1] (converting type); the result is a view of src[1]
    OOMB_OP_CAST,       // new contiguous tensor of another type

    // element-wise and broadcasting
    OOMB_OP_FILL,       // constant
    OOMB_OP_ADD,
    OOMB_OP_SUB,
    OOMB_OP_MUL,
    OOMB_OP_SCALE,
    OOMB_OP_ADD_INPLACE, // src[0] += src[1] (broadcast); result is a view of src[0]
    OOMB_OP_REPEAT,      // broadcast src[0] to the shape of src[1]
    OOMB_OP_REPEAT_BACK, // sum src[0] down to the shape of src[1]
    OOMB_OP_SILU,
    OOMB_OP_SILU_BACK,
    OOMB_OP_SWIGLU,

    // reductions
    OOMB_OP_SUM,
    OOMB_OP_MEAN,
    OOMB_OP_SUM_SQ,

    // neural-network ops
    OOMB_OP_GET_ROWS,
    OOMB_OP_GET_ROWS_BACK,
    OOMB_OP_MUL_MAT,
    OOMB_OP_RMS_NORM,
    OOMB_OP_RMS_NORM_BACK,
    OOMB_OP_ROPE,
    OOMB_OP_ROPE_BACK,
    OOMB_OP_SOFT_MAX,
    OOMB_OP_SOFT_MAX_BACK,
    OOMB_OP_ATTN,
    OOMB_OP_ATTN_BACK,
    OOMB_OP_CROSS_ENTROPY,
    OOMB_OP_CROSS_ENTROPY_BACK,
    OOMB_OP_LINEAR_CROSS_ENTROPY,      // LM head + cross-entropy over vocabulary tiles
    OOMB_OP_LINEAR_CROSS_ENTROPY_BACK,

    // optimizers (update src[0] in place; result is a view of src[0])
    OOMB_OP_ADAMW_STEP,
    OOMB_OP_SGD_STEP,

    // paged KV cache (oomb-paged.h)
    OOMB_OP_PAGED_ATTN,
    OOMB_OP_PAGED_ATTN_BACK,

    OOMB_OP_CUSTOM,

    // added later (appended: the values above stay stable for programs built against older headers)
    OOMB_OP_SWIGLU_BACK, // gate, up, dy -> [dgate; dup] packed
    OOMB_OP_PAGED_ATTN_MERGE, // acc (in place) <- log-sum-exp merge of acc and part; result is a view of acc
    OOMB_OP_PAGE_SUMMARY,     // sparse attention: page summaries written in place (oomb-sparse.h); a view of the pool
    OOMB_OP_PAGE_SELECT,      // sparse attention: top-K history pages per query tile, a LISTS schedule (oomb-sparse.h)
    OOMB_OP_RMS_NORM_MUL,      // x, w -> rms_norm(x) * w (the weighted RMSNorm in one pass; f32 or bf16 result)
    OOMB_OP_RMS_NORM_MUL_BACK, // x, w, dy -> dx, or [dx; dw] packed (oomb_rms_norm_mul_back)

    OOMB_OP_COUNT,
};

/// Name of `op` ("add", "mul_mat", ...).
const char * oomb_op_name(enum oomb_op op);

enum oomb_tensor_flag {
    OOMB_TENSOR_FLAG_PARAM  = 1 << 0, // trainable parameter: the backward pass computes its gradient
    OOMB_TENSOR_FLAG_INPUT  = 1 << 1, // set by the caller before compute; the allocator never reuses it
    OOMB_TENSOR_FLAG_OUTPUT = 1 << 2, // read by the caller after compute; the allocator never reuses it
    OOMB_TENSOR_FLAG_LOSS   = 1 << 3, // the value the backward pass differentiates
};

struct oomb_context;
struct oomb_cgraph;
struct oomb_buffer;

/// A tensor: metadata, the op that produces it, and a pointer to its data (host or device
/// memory, depending on the buffer it lives in). Created only through a context.
struct oomb_tensor {
    enum oomb_type type;
    int64_t ne[OOMB_MAX_DIMS];   // number of elements per dimension
    size_t  nb[OOMB_MAX_DIMS];   // stride in bytes per dimension

    enum oomb_op op;
    int32_t op_params[OOMB_MAX_OP_PARAMS]; // op settings (floats stored bitwise)
    int32_t flags;               // enum oomb_tensor_flag

    struct oomb_tensor * src[OOMB_MAX_SRC];

    struct oomb_tensor * view_src;  // for views: the tensor whose memory this one aliases
    size_t               view_offs; // byte offset into view_src's data

    struct oomb_tensor * grad;   // for parameters: the persistent gradient accumulator (or NULL)

    void * data;                 // NULL until allocated
    struct oomb_buffer * buffer; // the buffer holding data (NULL for context-owned host memory)

    char name[OOMB_MAX_NAME];
    void * extra;                // backend / extension data
};

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

typedef void (*oomb_error_handler_t)(const char * msg, void * user_data);

/// Replaces the error handler (NULL restores the default: print to stderr, abort()).
/// The handler receives the full message and must not return.
void oomb_set_error_handler(oomb_error_handler_t handler, void * user_data);

/// Reports an error through the handler; never returns. printf-style.
void oomb_error(const char * fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

// ---------------------------------------------------------------------------------------------
// Contexts and tensors
// ---------------------------------------------------------------------------------------------

struct oomb_init_params {
    size_t max_tensors; // 0: unlimited (metadata grows as needed)
    bool   no_alloc;    // true: tensors get no data (a graph allocator or a backend buffer provides it)
};

/// Creates a context. Without no_alloc, each new tensor gets zero-initialised, 64-byte aligned
/// host memory owned by the context.
struct oomb_context * oomb_init(struct oomb_init_params params);
void oomb_free(struct oomb_context * ctx);
/// Number of tensors created in ctx.
int64_t oomb_ctx_n_tensors(const struct oomb_context * ctx);
/// i-th tensor created in ctx (creation order); NULL past the end.
struct oomb_tensor * oomb_ctx_tensor(struct oomb_context * ctx, int64_t i);
/// Tensor of ctx with this name (first one), or NULL.
struct oomb_tensor * oomb_get_tensor(struct oomb_context * ctx, const char * name);
bool oomb_ctx_no_alloc(const struct oomb_context * ctx);

/// New tensor of `type` with n_dims dimensions (1..4) of sizes ne[0..n_dims-1] (the rest are 1).
/// Errors: n_dims out of range, a negative size, a total byte size overflowing int64.
struct oomb_tensor * oomb_new_tensor(struct oomb_context * ctx, enum oomb_type type, int n_dims, const int64_t * ne);
struct oomb_tensor * oomb_new_tensor_1d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0);
struct oomb_tensor * oomb_new_tensor_2d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0, int64_t ne1);
struct oomb_tensor * oomb_new_tensor_3d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0, int64_t ne1, int64_t ne2);
struct oomb_tensor * oomb_new_tensor_4d(struct oomb_context * ctx, enum oomb_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
/// New tensor with the type and shape of a (contiguous strides).
struct oomb_tensor * oomb_dup_tensor(struct oomb_context * ctx, const struct oomb_tensor * a);

struct oomb_tensor * oomb_set_name(struct oomb_tensor * t, const char * name);
struct oomb_tensor * oomb_format_name(struct oomb_tensor * t, const char * fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char * oomb_get_name(const struct oomb_tensor * t);

/// Marks t as a trainable parameter / graph input / graph output / loss.
/// set_param errors: t is not a leaf, t is i32, t is of a block type (quantized weights are frozen).
void oomb_set_param(struct oomb_tensor * t);
void oomb_set_input(struct oomb_tensor * t);
void oomb_set_output(struct oomb_tensor * t);
void oomb_set_loss(struct oomb_tensor * t);

int64_t oomb_nelements(const struct oomb_tensor * t);
int64_t oomb_nrows(const struct oomb_tensor * t);    // ne1*ne2*ne3
size_t  oomb_nbytes(const struct oomb_tensor * t);   // bytes spanned by the tensor's elements (whole blocks for block types)
int     oomb_n_dims(const struct oomb_tensor * t);   // index of the last dimension > 1, plus one (at least 1)
bool    oomb_is_contiguous(const struct oomb_tensor * t);
bool    oomb_are_same_shape(const struct oomb_tensor * a, const struct oomb_tensor * b);
/// true when b can be broadcast to a (each a->ne[i] is a multiple of b->ne[i]).
bool    oomb_can_repeat(const struct oomb_tensor * b, const struct oomb_tensor * a);
/// "[4096, 128, 1, 1] f32" style description, into buf (returns buf).
const char * oomb_shape_str(const struct oomb_tensor * t, char * buf, size_t size);

/// Host access for tensors whose data is in host memory (context memory or a CPU buffer).
/// Index i is the flat index of a contiguous tensor; *_nd take 4 indices and follow nb strides.
float   oomb_get_f32_1d(const struct oomb_tensor * t, int64_t i);
void    oomb_set_f32_1d(struct oomb_tensor * t, int64_t i, float v);
float   oomb_get_f32_nd(const struct oomb_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
void    oomb_set_f32_nd(struct oomb_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v);
int32_t oomb_get_i32_1d(const struct oomb_tensor * t, int64_t i);
void    oomb_set_i32_1d(struct oomb_tensor * t, int64_t i, int32_t v);

// op_params helpers
float   oomb_get_op_param_f32(const struct oomb_tensor * t, int i);
int32_t oomb_get_op_param_i32(const struct oomb_tensor * t, int i);

// ---------------------------------------------------------------------------------------------
// Views and layout. The result aliases a's memory; errors when the view exceeds a.
// ---------------------------------------------------------------------------------------------

/// View of a with the given sizes, strides nb1..nb3 (bytes) and byte offset.
struct oomb_tensor * oomb_view_1d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, size_t offset);
struct oomb_tensor * oomb_view_2d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset);
struct oomb_tensor * oomb_view_3d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2, size_t offset);
struct oomb_tensor * oomb_view_4d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset);
/// Same elements, new shape. a must be contiguous; the element count must match.
struct oomb_tensor * oomb_reshape_1d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0);
struct oomb_tensor * oomb_reshape_2d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1);
struct oomb_tensor * oomb_reshape_3d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2);
struct oomb_tensor * oomb_reshape_4d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
/// ggml semantics: dimension i of a becomes dimension axis_i of the result.
struct oomb_tensor * oomb_permute(struct oomb_context * ctx, struct oomb_tensor * a, int axis0, int axis1, int axis2, int axis3);
/// Swaps dimensions 0 and 1.
struct oomb_tensor * oomb_transpose(struct oomb_context * ctx, struct oomb_tensor * a);
/// Contiguous copy of a (same type), optionally with a new shape of the same element count.
struct oomb_tensor * oomb_cont(struct oomb_context * ctx, struct oomb_tensor * a);
struct oomb_tensor * oomb_cont_4d(struct oomb_context * ctx, struct oomb_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);

// ---------------------------------------------------------------------------------------------
// Ops. Unless stated otherwise: float inputs are f32 and the result is a new contiguous f32 tensor.
// ---------------------------------------------------------------------------------------------

/// Copies a's values into b (same element count; any float types, or i32 to i32), converting the
/// type. The result is a view of b; computing it writes b.
struct oomb_tensor * oomb_cpy(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// New contiguous tensor holding a converted to `type` (f32 <-> f16/bf16; a block-type a of
/// row-major blocks is dequantized to f32 / f16 / bf16, bit-exact as gguf-py). Errors: a block-type
/// `type` (no quantizing op), a transposed block-type a, i32 <-> float.
struct oomb_tensor * oomb_cast(struct oomb_context * ctx, struct oomb_tensor * a, enum oomb_type type);
/// Constant tensor of the given f32 shape, every element `value`.
struct oomb_tensor * oomb_fill(struct oomb_context * ctx, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, float value);

/// a + b, a - b, a * b (element-wise), b broadcast to a (oomb_can_repeat(b, a)). Result: a's shape.
struct oomb_tensor * oomb_add(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
struct oomb_tensor * oomb_sub(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
struct oomb_tensor * oomb_mul(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// a * b (as oomb_mul) with the result stored as `type`: f32, or bf16 (round to nearest even) for a
/// result that only feeds oomb_mul_mat as its b operand, whose CUDA kernel reads bf16 operands in
/// place (an f32 b is rounded to bf16 there anyway, so on the GPU the products are unchanged and a
/// conversion pass and half the bytes are saved). Gradients flowing through the result stay f32.
/// Errors: type not f32 / bf16, plus those of oomb_mul.
struct oomb_tensor * oomb_mul_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, enum oomb_type type);
/// a * s.
struct oomb_tensor * oomb_scale(struct oomb_context * ctx, struct oomb_tensor * a, float s);
/// a += b in place (b broadcast to a); the result is a view of a. a may be f32 only.
struct oomb_tensor * oomb_add_inplace(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// a repeated (tiled) to the shape of b; b's ne must be multiples of a's.
struct oomb_tensor * oomb_repeat(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// a summed down to the shape of b (the adjoint of repeat); a's ne must be multiples of b's.
struct oomb_tensor * oomb_repeat_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// silu(x) = x * sigmoid(x).
struct oomb_tensor * oomb_silu(struct oomb_context * ctx, struct oomb_tensor * a);
/// dx = dy * silu'(x), for x = a, dy = b (same shape).
struct oomb_tensor * oomb_silu_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// swiglu(gate, up) = silu(gate) * up (same shapes), as in the Qwen2 / LLaMA MLP. gate and up both
/// f32 or both bf16 (e.g. the bf16 results of oomb_mul_mat_ext, widened to f32 by the kernels).
struct oomb_tensor * oomb_swiglu(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up);
/// oomb_swiglu with the result stored as `type` (f32 or bf16; see oomb_mul_ext for when bf16 pays).
struct oomb_tensor * oomb_swiglu_ext(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up, enum oomb_type type);
/// Backward of oomb_swiglu in one pass: gate and up (both f32 or both bf16) and dy (f32) of one shape
/// [ne0, ne1, ne2, ne3] (any strides). Returns one contiguous f32 tensor [ne0, ne1, ne2, 2 * ne3]: dgate (the first ne3
/// slabs) then dup, with s = sigmoid(gate): dgate = dy * up * s * (1 + gate * (1 - s)),
/// dup = dy * gate * s. The autodiff uses it for swiglu (views of the two halves).
struct oomb_tensor * oomb_swiglu_back(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up,
                                      struct oomb_tensor * dy);
/// oomb_swiglu_back with the packed result stored as `type` (f32 or bf16). The autodiff uses bf16
/// for a swiglu whose result is bf16 (oomb_swiglu_ext: it feeds matrix products, and so then do
/// the gradients of its gate and up, the outputs of matrix products): they are read by the products
/// of the backward only (summed in f32 where a tensor gets several).
struct oomb_tensor * oomb_swiglu_back_ext(struct oomb_context * ctx, struct oomb_tensor * gate, struct oomb_tensor * up,
                                          struct oomb_tensor * dy, enum oomb_type type);

/// Sum / mean / sum of squares of all elements: result f32 [1].
struct oomb_tensor * oomb_sum(struct oomb_context * ctx, struct oomb_tensor * a);
struct oomb_tensor * oomb_mean(struct oomb_context * ctx, struct oomb_tensor * a);
struct oomb_tensor * oomb_sum_sq(struct oomb_context * ctx, struct oomb_tensor * a);
/// Sum of squares of all elements of n tensors together: result f32 [1] = sum over k of sum(a[k]^2),
/// accumulated in double (per tensor in order, as n oomb_sum_sq added in that order would be, up to the
/// f32 roundings of the partial sums). a[0..n): f32, any shapes and strides; 1 <= n <= OOMB_MAX_SRC.
/// One node (an OOMB_OP_SUM_SQ with n sources) instead of n and n - 1 adds: the optimizers' gradient
/// norm over hundreds of parameters (a LoRA fine-tune's adapters) in a few kernel launches.
/// Errors: n out of range, a NULL or non-f32 tensor. Gradient: 2 a[k] dy for each k.
struct oomb_tensor * oomb_sum_sq_n(struct oomb_context * ctx, struct oomb_tensor ** a, int n);

/// Embedding lookup. a: [n_embd, n_rows] (f32, f16 or bf16); ids: i32 [n] or [n, m].
/// Result f32 [n_embd, n] or [n_embd, n, m]: row ids[i] of a. Ids out of range are an error at compute.
struct oomb_tensor * oomb_get_rows(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * ids);
/// Adjoint of get_rows: scatter-add the rows of dy [n_embd, n(, m)] into a zero f32 [n_embd, n_rows].
struct oomb_tensor * oomb_get_rows_back(struct oomb_context * ctx, struct oomb_tensor * dy, struct oomb_tensor * ids, int64_t n_rows);

/// Matrix product with ggml semantics: a [K, M, A2, A3] (f32, f16 or bf16), b [K, N, B2, B3] (f32,
/// or f16 / bf16: the CPU backend converts such a b to f32, the CUDA backend reads a bf16 b in place),
/// B2 % A2 == 0 and B3 % A3 == 0 (a is broadcast over the batch dims).
/// Result f32 [M, N, B2, B3] with res[n][m] = sum_k a[m][k] * b[n][k], i.e. in PyTorch terms
/// res = b @ a^T: with a = W (a Linear weight [out, in] = ne [in, out]) and b = x [in, tokens],
/// mul_mat(W, x) = x W^T of shape [out, tokens]. Either operand may be a transposed view.
/// a may also be of a block type (q8_0 .. q6_k: a frozen quantized weight): 2-D, row-major blocks
/// (rows may be a whole-row view) or oomb_transpose of such (the autodiff's db = mul_mat(a^T, dy));
/// the backends dequantize it per product (CPU: tiles of rows to f32, then sgemm; CUDA: into the bf16
/// copy slots, then cuBLAS), never keeping all of it in a float type. Errors: a block-type b, a
/// block-type a with batch dims or another layout.
struct oomb_tensor * oomb_mul_mat(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b);
/// oomb_mul_mat with the result stored as `type` (f32 or bf16): the f32 sums rounded to bf16 once (CUDA:
/// cuBLAS's bf16 output; CPU: the f32 product, then rounded). For products whose result only feeds
/// ops that read bf16 (oomb_swiglu_ext's gate and up): half the bytes written and read, one more
/// rounding (as a bf16-autocast framework stores a Linear's output). The autodiff treats it as
/// oomb_mul_mat (its incoming gradient f32, or bf16 where a bf16 swiglu_back_ext made it). Errors
/// (named mul_mat_ext): as oomb_mul_mat, and a type other than f32 / bf16.
struct oomb_tensor * oomb_mul_mat_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, enum oomb_type type);

/// RMSNorm over dimension 0: y = x / sqrt(mean(x^2) + eps) (no weight; multiply by it with oomb_mul).
/// Source: Zhang & Sennrich 2019; as in HF Qwen2RMSNorm (computed in f32).
struct oomb_tensor * oomb_rms_norm(struct oomb_context * ctx, struct oomb_tensor * a, float eps);
/// dx for y = rms_norm(x, eps), given x = a and dy = b.
struct oomb_tensor * oomb_rms_norm_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, float eps);
/// Weighted RMSNorm in one pass: y = (x * s) * w per row, s = 1 / sqrt(mean(x^2) + eps) (sum of
/// squares in double), x f32 [ne0, ...], w f32 with ne0 elements (shape [ne0] or [ne0, 1, 1, 1], unit
/// stride), the result stored as `type` (f32 or bf16). Rounds as oomb_mul_ext(oomb_rms_norm(x, eps), w,
/// type) does (x * s to f32, then times w): the same numbers, without the f32 normed tensor in memory
/// (the backward recomputes s from x). Source: Zhang & Sennrich 2019; HF Qwen2RMSNorm / LlamaRMSNorm.
/// Errors: x or w not f32, w of another length or stride, type not f32 / bf16, eps < 0.
struct oomb_tensor * oomb_rms_norm_mul_ext(struct oomb_context * ctx, struct oomb_tensor * x, struct oomb_tensor * w, float eps,
                                           enum oomb_type type);
/// oomb_rms_norm_mul_ext with an f32 result.
struct oomb_tensor * oomb_rms_norm_mul(struct oomb_context * ctx, struct oomb_tensor * x, struct oomb_tensor * w, float eps);
/// Backward of oomb_rms_norm_mul in one node, x, w as there and dy f32 of x's shape. With_dw false:
/// dx, f32 of x's shape: dx = rms_norm_back(x, dy * w) (dy * w rounded to f32 first, as the unfused
/// mul then rms_norm_back). With_dw true: dx and dw packed, f32 [ne0, nrows(x) + 1]: rows 0 ..
/// nrows - 1 hold dx (x's row order), row nrows holds dw[i] = sum over rows of dy[r][i] * (x[r][i] *
/// s_r) (each product rounded to f32 as oomb_mul would, summed in double). The autodiff uses this
/// node for oomb_rms_norm_mul. Errors: as oomb_rms_norm_mul, and dy of another shape.
struct oomb_tensor * oomb_rms_norm_mul_back(struct oomb_context * ctx, struct oomb_tensor * x, struct oomb_tensor * w, struct oomb_tensor * dy,
                                            float eps, bool with_dw);

/// Rotary position embedding, NEOX layout (rotate_half: dimension i pairs with i + n_dims/2),
/// as HF Qwen2 applies it. a: [head_dim, n_head, n_tokens, B] f32; pos: i32 [n_tokens] (positions);
/// the first n_dims (even, <= head_dim) dimensions are rotated, angle = pos * theta^(-2i/n_dims).
/// Source: Su et al. 2021 (RoFormer); HF apply_rotary_pos_emb.
/// Same as oomb_rope_ext(ctx, a, pos, n_dims, theta, NULL).
struct oomb_tensor * oomb_rope(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta);
/// Adjoint of rope (rotation by the opposite angle); same as oomb_rope_back_ext(..., NULL).
struct oomb_tensor * oomb_rope_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta);
/// rope with per-frequency factors (Llama 3.x: the GGUF tensor rope_freqs.weight): the angle of pair i
/// (0 <= i < n_dims/2) is pos * theta^(-2i/n_dims) / freq_factors[i], as llama.cpp's ggml_rope_ext
/// divides by its freq_factors. freq_factors: f32 [n_dims/2], contiguous, positive and finite (the
/// CPU backend checks the values; the CUDA backend does not read them back), or NULL: no factors,
/// exactly oomb_rope (no factor is applied at all, results bit-identical). The factors are a source
/// of the node (src[2]) but get no gradient. For HF's rope_type "llama3" the factors come from
/// rope_scaling (models/rope-scaling.h). Errors: a, pos, n_dims, theta as oomb_rope; freq_factors
/// not f32, not contiguous or not n_dims/2 elements.
struct oomb_tensor * oomb_rope_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta,
                                   struct oomb_tensor * freq_factors);
/// Adjoint of oomb_rope_ext (rotation by the opposite angle, the same factors).
struct oomb_tensor * oomb_rope_back_ext(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * pos, int n_dims, float theta,
                                        struct oomb_tensor * freq_factors);

/// Softmax over dimension 0 of a*scale. causal >= 0: element (i0, i1) is masked (-inf) when
/// i0 > i1 + causal (row i1 is query i1; causal = number of keys before the first query).
/// causal < 0: no mask.
struct oomb_tensor * oomb_soft_max(struct oomb_context * ctx, struct oomb_tensor * a, float scale, int causal);
/// dx for y = soft_max(x, scale, ...), given y = a and dy = b: dx = scale * y * (dy - sum(y*dy)).
struct oomb_tensor * oomb_soft_max_back(struct oomb_context * ctx, struct oomb_tensor * a, struct oomb_tensor * b, float scale);

/// Reference causal attention with grouped-query heads (not tiled; memory O(T*S) per head).
/// q: [D, H, T, B], k and v: [D, Hkv, S, B] f32, H % Hkv == 0 (query head h uses kv head h / (H/Hkv)).
/// Query t sits at key position t + (S - T) and attends keys 0 .. t + (S - T) (causal), each score
/// scaled by `scale` (usually 1/sqrt(D)). Result: [D, H, T, B].
struct oomb_tensor * oomb_attn(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k, struct oomb_tensor * v, float scale);
/// Backward of oomb_attn given dout [D, H, T, B]: one f32 tensor of nelements(q)+nelements(k)+nelements(v)
/// elements holding dq, dk, dv one after the other (each contiguous, in the shape of q, k, v).
struct oomb_tensor * oomb_attn_back(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k, struct oomb_tensor * v, struct oomb_tensor * dout, float scale);

/// Cross-entropy fused with log-softmax. logits: [V, N] f32; labels: i32 [N] (a label equal to
/// ignore_index contributes nothing; other labels must be in [0, V), else an error at compute).
/// Result: f32 [2] = { sum over counted rows of -log softmax(logits)[label], number of counted rows },
/// so a loss split over several evaluations is normalised by the total count.
struct oomb_tensor * oomb_cross_entropy_loss(struct oomb_context * ctx, struct oomb_tensor * logits, struct oomb_tensor * labels, int32_t ignore_index);
/// d(logits) given dloss: f32 [2] (only dloss[0], the gradient of the sum, is used):
/// (softmax(logits) - onehot(label)) * dloss[0] for counted rows, 0 for ignored rows.
struct oomb_tensor * oomb_cross_entropy_loss_back(struct oomb_context * ctx, struct oomb_tensor * logits, struct oomb_tensor * labels, struct oomb_tensor * dloss, int32_t ignore_index);

/// Fused linear + cross-entropy over vocabulary tiles: the loss of the logits w^T x without storing
/// them. w: [E, V] (f32, f16 or bf16; the LM head in llama.cpp layout, ne = {in, out}: row v is the
/// weight vector of class v; any strides); x: [E, N] f32 (or [E, N, B2, B3]: every ne1..ne3 row is
/// one token; any strides); labels: i32 with one entry per row of x (a label equal to ignore_index
/// contributes nothing; other labels must be in [0, V), else an error at compute naming the label
/// and its row, as for oomb_cross_entropy_loss). Errors when built: w not 2-D, E or V zero,
/// x->ne[0] != E, x not f32, labels not i32 or not one per row of x.
/// Result: f32 [2] = { sum over counted rows of -log softmax(w^T x)[label], number of counted rows },
/// the value of oomb_cross_entropy_loss(oomb_mul_mat(w, x), labels, ignore_index).
/// The [V, N] logits are never stored: the kernels compute them Vt rows of w at a time (a [Vt, N] f32
/// scratch; Vt = oomb_linear_cross_entropy_tile(V, N, 0): the largest multiple of 128 with
/// Vt * N * 4 <= 256 MiB, within [128, 16384] and at most V) and keep a running max / sum of exp per
/// row (online log-sum-exp). The result is a view of the first 2 elements of the op's node, an f32
/// [2 + N] tensor (result->view_src) whose tail holds each row's log-sum-exp (ignored rows included),
/// which the backward pass reads instead of recomputing it (the tail itself carries no gradient).
/// Source: Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models" (Apple, CCE);
/// Liger-Kernel's fused linear cross-entropy; Milakov & Gimelshein 2018 (online softmax).
struct oomb_tensor * oomb_linear_cross_entropy(struct oomb_context * ctx, struct oomb_tensor * w, struct oomb_tensor * x,
                                               struct oomb_tensor * labels, int32_t ignore_index);
/// Sets the vocabulary tile (rows of w per step, > 0) of a linear_cross_entropy result (or of its
/// node, or of a linear_cross_entropy_back node); 0 restores the automatic choice. Its backward
/// pass inherits it. For tests and tuning; results do not depend on it beyond rounding.
void oomb_linear_cross_entropy_set_tile(struct oomb_tensor * t, int64_t rows);
/// The tile the kernels use for V classes and N rows: oomb_linear_cross_entropy_tile_request(rows)
/// when > 0 (capped at V), else the automatic choice above.
int64_t oomb_linear_cross_entropy_tile(int64_t V, int64_t N, int64_t rows);
/// The vocabulary tile asked for (0: none, the kernels choose): `rows` when > 0 (a tile set on the
/// op), else the environment variable OOMB_LCE_TILE when set. The one reading of OOMB_LCE_TILE (the
/// tiled kernels and the CUDA backend's fused pass both ask here). Errors: OOMB_LCE_TILE set to
/// anything but an integer in [0, 2^31) (0 or empty: unset).
int64_t oomb_linear_cross_entropy_tile_request(int64_t rows);

/// Which gradients oomb_linear_cross_entropy_back computes (bit mask, not 0).
enum oomb_lce_grad {
    OOMB_LCE_GRAD_X = 1,  // dx = w dlogits: [E, N(, B2, B3)] in x's shape
    OOMB_LCE_GRAD_W = 2,  // dw = x dlogits^T: [E, V] in w's shape
};
/// Backward of oomb_linear_cross_entropy given dloss: f32 [2] (only dloss[0], the gradient of the
/// sum, is used): with dlogits = (softmax(w^T x) - onehot(label)) * dloss[0] for counted rows and 0
/// for ignored rows, one contiguous f32 tensor holding dx (E*N elements) when grads has
/// OOMB_LCE_GRAD_X, followed by dw (E*V elements) when grads has OOMB_LCE_GRAD_W; a gradient not
/// asked for costs neither its product nor its memory (a frozen LM head: no dw, no [E, V] buffer).
/// lse: f32 [N] contiguous, each row's log-sum-exp (the tail of the forward's node), or NULL: then
/// the kernels recompute it with one more pass over the tiles. Per tile: the logits again, dlogits,
/// dx += w_tile dlogits_tile, dw_tile = x dlogits_tile^T. Label errors as in the forward.
struct oomb_tensor * oomb_linear_cross_entropy_back(struct oomb_context * ctx, struct oomb_tensor * w, struct oomb_tensor * x,
                                                    struct oomb_tensor * labels, struct oomb_tensor * dloss,
                                                    struct oomb_tensor * lse, int32_t ignore_index, int grads);

/// AdamW step (Loshchilov & Hutter 2019, decoupled weight decay, bias-corrected moments), in place:
/// g = grad * hp[5]; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
/// param -= lr * ( (m / hp[6]) / (sqrt(v / hp[7]) + eps) + wd * param )
/// hp: f32 [8] or [9] = { lr, beta1, beta2, eps, weight_decay, grad_scale, 1-beta1^t, 1-beta2^t[, t] }:
/// hp[8] = the step number t (exact in f32 up to 2^24), the seed of the stochastic rounding of
/// bf16 moments (required with them).
/// param f32 (or bf16: updated through f32); grad f32, m and v both f32 or both bf16 (stored with
/// stochastic rounding, identical on every backend), of param's shape.
/// Result: view of param.
struct oomb_tensor * oomb_adamw_step(struct oomb_context * ctx, struct oomb_tensor * param, struct oomb_tensor * grad,
                                     struct oomb_tensor * m, struct oomb_tensor * v, struct oomb_tensor * hp);
/// SGD step in place: param -= lr * (grad * grad_scale + wd * param). hp: f32 [3] = { lr, weight_decay, grad_scale }.
struct oomb_tensor * oomb_sgd_step(struct oomb_context * ctx, struct oomb_tensor * param, struct oomb_tensor * grad, struct oomb_tensor * hp);

/// Causal attention of a chunk of queries over a paged KV cache (OOMB mechanism 2), tiled with an
/// online softmax so its memory does not grow with the history.
/// q: [D, H, T] f32 (after RoPE); k_cur, v_cur: [D, Hkv, T] f32, the chunk's own keys/values;
/// k_pages, v_pages: the layer's page pools [D, Hkv, page_size, n_pages] (f32, f16 or bf16);
/// page_table: i32 [n_logical_pages] (logical page -> physical page); pos: i32 [T], the position
/// of each query/key of the chunk. Query t attends every position 0..pos[t]: position p lives in
/// slot p % page_size of physical page page_table[p / page_size].
/// store != 0: first writes k_cur/v_cur into the pages at pos (stage 1); store == 0: the chunk's
/// K/V are read from the pages (stage 2 recompute), k_cur/v_cur are sources only for gradients.
/// Result: out [D, H, T], a contiguous view (offset 0) of the op's node, which is one flat f32
/// tensor of D*H*T + H*T elements: out (element (t*H + h)*D + d), then the softmax statistics
/// the backward needs, one natural-log log-sum-exp per query row at D*H*T + t*H + h:
/// LSE = log sum_{p <= pos[t]} exp(scale * q_{t,h} . k_p) (FlashAttention-2 saves L = m + log l
/// for its backward). A row attending no key (impossible with valid positions) gets out = 0 and
/// LSE = -inf (log of an empty sum); the backward visits no key for such a row.
/// The packed node is the result's view_src; only the out part is differentiable.
/// Source: OOMB (arXiv 2602.02108), FlashAttention's online softmax, FlashAttention-2 (Dao 2023).
struct oomb_tensor * oomb_paged_attn(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k_cur,
                                     struct oomb_tensor * v_cur, struct oomb_tensor * k_pages, struct oomb_tensor * v_pages,
                                     struct oomb_tensor * page_table, struct oomb_tensor * pos, float scale, int store);
/// oomb_paged_attn with a cache of its results, so OOMB's stage 2 need not recompute the attention
/// forward of stage 1 (a memory-for-compute trade: (D*H + H) f32 per position and layer, or about
/// half that in bf16).
/// out_cache: contiguous, f32 or bf16, at least up to the largest position. f32: (D*H + H) floats
/// per position; the chunk's block starts at float pos[0] * (D*H + H) and holds the packed result
/// (out [D, H, T], then the LSE [H, T]). bf16: (D*H + 2H) 16-bit elements per position; the block
/// starts at element pos[0] * (D*H + 2H) and holds out [D, H, T] rounded to bf16 (nearest even),
/// then the LSE [H, T] as f32 kept bit for bit (two elements each). The chunk's positions must be
/// consecutive (pos[t] = pos[0] + t: not checked on the GPU). load = 0: compute as oomb_paged_attn
/// (with store), then write the block; load = 1 (store 0): copy the block written by an earlier
/// load-0 call over the same K/V instead of computing (f32: bit-identical to recomputing with the
/// same kernels; bf16: out rounded to bf16 (on the GPU the output projection's bf16 GEMM rounds it
/// the same way; the backward's delta = dout . out then uses the rounded out), the LSE exact). A block never saved loads as
/// whatever the cache holds (zeros when fresh): the caller orders saves before loads, in separate
/// graphs or through a dependency (a save and a load of one cache in the same graph are not ordered
/// by the graph). store and load are 0 or 1. Gradients as oomb_paged_attn.
/// Elements per position of an oomb_paged_attn_cached result cache of head dim D, H query heads and
/// the given type: D*H + H (f32), D*H + 2H (bf16: out in bf16, the LSE as f32 bits). Other types:
/// an error.
int64_t oomb_paged_attn_cache_row(int64_t D, int64_t H, enum oomb_type type);
struct oomb_tensor * oomb_paged_attn_cached(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k_cur,
                                            struct oomb_tensor * v_cur, struct oomb_tensor * k_pages, struct oomb_tensor * v_pages,
                                            struct oomb_tensor * page_table, struct oomb_tensor * pos, float scale, int store,
                                            struct oomb_tensor * out_cache, int load);
/// Backward of oomb_paged_attn: accumulates dK/dV of every attended position into the gradient
/// pages dk_pages/dv_pages (in place; shaped like the K/V pools; both f32, or both bf16) and returns
/// one f32 tensor holding dq [D, H, T], then dk_cur and dv_cur [D, Hkv, T] read back (as f32) from
/// the gradient pages at pos (complete once every later chunk has run its backward).
/// bf16 gradient pages: each call reads an element, adds its f32 contribution and writes the sum
/// back with stochastic rounding (random bits from (position, KV head, dim), the pages' seed,
/// oomb_paged_attn_set_grad_seed, and pos[0]: reproducible, the same on the CPU and CUDA backends
/// where the f32 sums agree; unbiased: the expected page value is the f32 sum). Error per element
/// after n chunks' additions: at most n bf16 ulps of the running sums (2^-8 relative each), in
/// expectation 0.
/// fwd: the result of oomb_paged_attn for the same q, pools, page table and positions (the view it
/// returns or its packed node): the backward reads the saved out and LSE from it instead of
/// recomputing them with an extra forward pass (delta = dout . out per row). NULL: recomputed.
struct oomb_tensor * oomb_paged_attn_back(struct oomb_context * ctx, struct oomb_tensor * q, struct oomb_tensor * k_pages,
                                          struct oomb_tensor * v_pages, struct oomb_tensor * dk_pages,
                                          struct oomb_tensor * dv_pages, struct oomb_tensor * page_table,
                                          struct oomb_tensor * pos, struct oomb_tensor * dout, struct oomb_tensor * fwd,
                                          float scale);

/// Seed of the stochastic rounding of bf16 gradient pages grad_pages (a dk_pages / dv_pages
/// tensor): kept on the tensor and read by oomb_paged_attn_back's kernels when the graph is
/// computed, so a graph built once draws new random bits each step after a new seed. Default 0.
/// Give dK and dV pages and every layer distinct seeds (oomb_kv_cache_set_grad_seed does). Unused
/// for f32 pages. Error: grad_pages NULL.
void oomb_paged_attn_set_grad_seed(struct oomb_tensor * grad_pages, uint32_t seed);
/// The seed set by oomb_paged_attn_set_grad_seed (0 if never set).
uint32_t oomb_paged_attn_grad_seed(const struct oomb_tensor * grad_pages);

/// Every operand of the paged-attention ops, by name (the general constructors below take it;
/// oomb_paged_attn_args_of reads it back from a node, so no code indexes the nodes' sources).
/// Forward: q, k_cur, v_cur, k_pages, v_pages, page_table, pos, schedule, scale, store, and
/// optionally out_cache + load (oomb_paged_attn_cached). Backward: q, k_pages, v_pages, page_table,
/// pos, schedule, scale, dout, fwd (or NULL), dk_pages, dv_pages. Unused fields: zero / NULL.
/// Shapes and meaning: oomb_paged_attn, oomb_paged_attn_cached, oomb_paged_attn_back above;
/// schedule: oomb-schedule.h (zero-initialised = OOMB_SCHEDULE_DENSE).
struct oomb_paged_attn_args {
    struct oomb_tensor * q;
    struct oomb_tensor * k_cur, * v_cur;        // forward only
    struct oomb_tensor * k_pages, * v_pages;
    struct oomb_tensor * page_table, * pos;
    struct oomb_page_schedule schedule;
    float scale;
    int store;                                  // forward only
    struct oomb_tensor * out_cache;             // forward only; NULL: no result cache
    int load;                                   // with out_cache
    struct oomb_tensor * dout, * fwd;           // backward only (fwd may be NULL)
    struct oomb_tensor * dk_pages, * dv_pages;  // backward only
    int accumulate;                             // 0 or 1: see below
};
// accumulate = 1 (no store, no result cache): the node adds its result to the one its memory
// already holds instead of overwriting it. Forward: that memory holds the packed result (out, LSE)
// of the same queries over a key set disjoint from this node's (e.g. an earlier RANGE block); the
// node merges its own partial result into it per row as oomb_paged_attn_merge does (the same
// weights, src/oomb/paged-attn-merge.h), so a sequence of blocks needs no separate merge pass.
// Backward: its dq is added to the dq the memory holds; dk_cur / dv_cur there are left as they are
// (an earlier call of the same queries wrote them). The caller places such a node on that memory
// itself (the host-offload engine does so for its page blocks, src/oomb/offload.cpp): the graph
// allocator refuses to give it memory, since fresh memory holds no result to add to.
/// oomb_paged_attn (out_cache NULL) or oomb_paged_attn_cached with a page schedule. Result: the out
/// view [D, H, T] as oomb_paged_attn. Errors as those functions, and: RANGE with first < 0 or
/// last < first; LISTS without offsets / pages, or with non-i32 / non-contiguous ones; a result
/// cache with a schedule other than DENSE or LISTS (the cache holds whole rows' results, not a
/// window's: RANGE / LISTS_RANGE blocks are refused). With LISTS, a load (load = 1) returns what the
/// save computed over its lists: the caller gives both the same lists (OOMB's stage 2 reuses stage
/// 1's selection). Kernels: the CPU backend
/// runs every schedule; the CUDA backend runs every schedule on its fast (mma.sync / wgmma: bf16
/// pools, head dim 64 / 128; LISTS: page size a multiple of 64) and generic kernels.
struct oomb_tensor * oomb_paged_attn_ext(struct oomb_context * ctx, const struct oomb_paged_attn_args * args);
/// oomb_paged_attn_back with a page schedule: the gradients of oomb_paged_attn_ext's function
/// (keys outside the schedule get none). LISTS also need inv_offsets / inv_qtiles. fwd, if given,
/// must have been built with the same schedule (kind, range, list tensors), or, for a window, with
/// the schedule it is a window of (RANGE: DENSE; LISTS_RANGE: LISTS with the same lists): then the
/// backward gives the window's keys their gradients under the whole rows' statistics, one block of a
/// backward split over disjoint windows (FlashAttention-2's backward is separable over keys given
/// the LSE and delta): the blocks' dq sum (accumulate) and their dK/dV equal the enclosing backward's.
/// accumulate = 1 needs fwd (recomputed statistics would be the block's own).
struct oomb_tensor * oomb_paged_attn_back_ext(struct oomb_context * ctx, const struct oomb_paged_attn_args * args);
/// The operands of a paged_attn node (the packed node, or the view oomb_paged_attn returns) or a
/// paged_attn_back node. Error: another op.
struct oomb_paged_attn_args oomb_paged_attn_args_of(const struct oomb_tensor * node);
/// Merges two partial paged-attention results of the same queries over disjoint key sets (e.g.
/// oomb_paged_attn_ext with RANGE schedules over disjoint page blocks), in place into acc:
/// L = log(exp(La) + exp(Lp)), out = exp(La - L) * out_a + exp(Lp - L) * out_p, per row (t, h).
/// acc, part: f32, contiguous, D*H*T + H*T elements each, in the packed layout of oomb_paged_attn
/// (the packed node, i.e. the view_src of its result, or any tensor of that layout). A row with
/// La = Lp = -inf stays out 0, L -inf; one -inf side takes the other side exactly.
/// Result: a view of acc (op paged_attn_merge). Not differentiable (an error if a backward is built
/// through it). Errors: sizes, types, non-contiguous operands, acc == part.
/// Source: FlashAttention-2's / flash-decoding's split-K combine (Dao 2023).
struct oomb_tensor * oomb_paged_attn_merge(struct oomb_context * ctx, struct oomb_tensor * acc, struct oomb_tensor * part,
                                           int64_t D, int64_t H, int64_t T);

// ---------------------------------------------------------------------------------------------
// Graphs and automatic differentiation
// ---------------------------------------------------------------------------------------------

/// New empty graph with room for `size` nodes (OOMB_DEFAULT_GRAPH_SIZE by default).
struct oomb_cgraph * oomb_new_graph(struct oomb_context * ctx);
struct oomb_cgraph * oomb_new_graph_custom(struct oomb_context * ctx, size_t size);
/// Appends t and every node it depends on (not yet in the graph) in dependency order.
void oomb_build_forward_expand(struct oomb_cgraph * g, struct oomb_tensor * t);
/// Appends to g the backward pass of `loss` (a node of g): for every tensor flagged PARAM on which
/// loss depends, the nodes computing d(loss)/d(param) and an in-place accumulation into
/// param->grad (created earlier by oomb_new_grad or set by the caller; params without one get an
/// error). `seed` holds d(final objective)/d(loss) (loss's shape); NULL means ones.
/// Accumulation across evaluations (chunked training) follows: zero the gradients with
/// oomb_tensor_memset(param->grad, 0) (or oomb_opt_zero_grads) before the first evaluation.
void oomb_build_backward_expand(struct oomb_context * ctx, struct oomb_cgraph * g, struct oomb_tensor * loss, struct oomb_tensor * seed);
/// Creates (in ctx) the gradient accumulator of param: an f32 tensor of param's shape, named
/// "<name>.grad", stored in param->grad. Returns it.
struct oomb_tensor * oomb_new_grad(struct oomb_context * ctx, struct oomb_tensor * param);

/// The nodes [i0, i1) of g as a graph of their own (allocated in ctx), for computing g in parts
/// with work in between (the host-offload engine does, after ggml_graph_view): the view shares g's
/// tensors and allocation (compute it only while g's allocation is current), and a view with
/// i0 > 0 is a continuation (backends keep caches about tensors the earlier parts did not write).
/// The caller guarantees that nothing between the parts writes a tensor an earlier part read
/// through such a cache (weights). Errors: 0 <= i0 <= i1 <= n_nodes(g) not holding.
struct oomb_cgraph * oomb_graph_view(struct oomb_context * ctx, struct oomb_cgraph * g, int i0, int i1);
/// Marks g as a continuation of the graph computed before it (see oomb_graph_view).
void oomb_graph_set_continuation(struct oomb_cgraph * g, bool on);
int oomb_graph_n_nodes(const struct oomb_cgraph * g);
struct oomb_tensor * oomb_graph_node(struct oomb_cgraph * g, int i);  // i < 0 counts from the end
int oomb_graph_n_leafs(const struct oomb_cgraph * g);
struct oomb_tensor * oomb_graph_leaf(struct oomb_cgraph * g, int i);
/// Drops all nodes and leafs.
void oomb_graph_clear(struct oomb_cgraph * g);
/// Prints the graph (one node a line) to stderr.
void oomb_graph_print(const struct oomb_cgraph * g);

#ifdef __cplusplus
}
#endif
