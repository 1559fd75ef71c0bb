// CUDA backend internals shared by the kernel files: error checking, the backend context (stream,
// cuBLAS handle, growing scratch), tensor views passed to kernels by value, type conversions and
// block reductions.
//
// Conventions of the kernel families (one .cu/.cuh pair each):
//   - Launchers run on the host, validate their operands like the CPU kernels do (ops-cpu.cpp),
//     report problems through oomb_error and enqueue kernels on ctx.stream. Every launch is followed
//     by OOMB_CUDA_LAUNCHED (the last error; with OOMB_CUDA_SYNC=1 also a stream synchronize, so a
//     fault is reported at the kernel that caused it).
//   - The dispatcher (backend-cuda.cu) prepares sources as the CPU backend does: a source that overlaps
//     the result with another layout, or a row-op source whose rows are not unit-stride, is copied
//     to a contiguous scratch first. In-place execution (dst->data == src[0]->data, same layout) is
//     always safe: each element (or each row, for row kernels) is read by the thread (block) that
//     writes it, before it writes it.
//   - Data-dependent errors (ids or labels out of range) cannot be seen on the host without a
//     synchronization: kernels record the first one in ctx.d_err and the dispatcher reports it
//     through oomb_error at the end of graph_compute.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>

#include "oomb-impl.h"

#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Error checking
// ---------------------------------------------------------------------------------------------

[[noreturn]] void oomb_cuda_fail(const char * what, const char * file, int line, const char * msg);

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        const cudaError_t err_ = (call);                                                          \
        if (err_ != cudaSuccess) oomb_cuda_fail(#call, __FILE__, __LINE__, cudaGetErrorString(err_)); \
    } while (0)

#define CUBLAS_CHECK(call)                                                                        \
    do {                                                                                          \
        const cublasStatus_t st_ = (call);                                                        \
        if (st_ != CUBLAS_STATUS_SUCCESS) oomb_cuda_fail(#call, __FILE__, __LINE__, cublasGetStatusString(st_)); \
    } while (0)

// Data-dependent errors recorded by kernels (first one wins).
enum oomb_cuda_err_kind {
    OOMB_CUDA_ERR_NONE = 0,
    OOMB_CUDA_ERR_ID = 1,    // get_rows / get_rows_back: id out of range (pos = index in ids, value = id)
    OOMB_CUDA_ERR_LABEL = 2, // (linear_)cross_entropy(_back): label out of range (pos = row, value = label)
};
struct oomb_cuda_err_rec {
    int flag;   // 0: none; set with atomicCAS by the first reporter
    int kind;
    int node;   // index of the node in the graph
    int pad;
    long long pos;
    long long value;
};

// One CUDA backend: device, stream, cuBLAS, scratch.
struct oomb_cuda_ctx {
    int device = 0;
    cudaStream_t stream = nullptr;       // OOMB_QUEUE_COMPUTE: kernels, cuBLAS, synchronous set/get
    cudaStream_t copy_stream = nullptr;  // OOMB_QUEUE_COPY: asynchronous copies beside the kernels
    cudaStream_t copy_out_stream = nullptr;  // OOMB_QUEUE_COPY_OUT: a second copy queue (the other PCIe direction)
    std::string buft_name;               // "CUDA<device>"
    cudaError_t fail_next_copy = cudaSuccess;  // oomb_cuda_debug_fail_next_copy (tests)
    cublasHandle_t cublas = nullptr;
    void * cublas_ws = nullptr;
    size_t cublas_ws_size = 0;
    bool sync_each = false;   // OOMB_CUDA_SYNC=1: synchronize after every kernel

    // Persistent scratch blocks that grow on demand (contents are not kept when one grows).
    // Slots [0, OOMB_MAX_SRC) hold prepared sources; kernels use the ones after.
    // SLOT_PAGED: paged attention's workspace (paged-attn.cu).
    // SLOT_SELECT: page_select's group-summed queries and logits (sparse.cu).
    enum { N_SLOTS = 24, SLOT_K0 = OOMB_MAX_SRC, N_BF16_COPIES = 4, SLOT_BF16 = N_SLOTS - N_BF16_COPIES, SLOT_PAGED = SLOT_K0 + 5,
           SLOT_SELECT = SLOT_PAGED + 1 };
    static_assert(SLOT_SELECT < SLOT_BF16, "kernels use scratch slots up to SLOT_K0 + 4 (linear_cross_entropy), then SLOT_PAGED, SLOT_SELECT");
    void * slot_ptr[N_SLOTS] = {nullptr};
    size_t slot_cap[N_SLOTS] = {0};
    size_t slot_req[N_SLOTS] = {0};  // the largest request per slot since the last oomb_cuda_debug_lce_scratch(reset) (tests)

    oomb_cuda_err_rec * d_err = nullptr; // device memory
    bool check_err = false;              // a kernel that records errors ran since the last check
    int cur_node = 0;

    // OOMB_CUDA_PROFILE=1: per-op GPU time (CUDA events around each node), printed when the
    // backend is freed; OOMB_CUDA_PROFILE=2 also per op and operand shapes (the 40 costliest).
    bool profile = false;
    int profile_level = 0;
    std::map<std::string, std::pair<double, int64_t>> prof_detail;
    int prof_resets = 0;  // oomb_backend_profile_reset calls (the printed profile says it covers what ran after the last)
    std::vector<cudaEvent_t> prof_events;
    double prof_ms[OOMB_OP_COUNT] = {0};
    int64_t prof_count[OOMB_OP_COUNT] = {0};

    // Scratch block of slot `slot`, at least `bytes`, for work queued on `stream`. Grows
    // stream-ordered (cudaFreeAsync / cudaMallocAsync on the stream, no synchronization); out of
    // memory is a compute-time fault (OOMB_STATUS_ALLOC_FAILED).
    void * scratch(int slot, size_t bytes);
    // The same, but nullptr when the device has no block of that size (after trying without the
    // headroom): for callers that can work in smaller pieces. Any earlier block of the slot is gone.
    void * try_scratch(int slot, size_t bytes);
    // The block a slot allocates for a request of `bytes`: 256-byte granules plus headroom for slowly
    // growing requests (a quarter, at most 64 MiB: a 1.2 GiB logits block keeps 64 MiB, not 300).
    static size_t scratch_block_bytes(size_t bytes);
    size_t debug_scratch_limit = 0;  // oomb_cuda_debug_set_scratch_limit (tests): larger blocks fail to allocate

    // bf16 copies of f32 GEMM operands (mul-mat.cu) in scratch slots SLOT_BF16..: a copy is reused
    // while its source is unchanged (the same activation feeds the Q, K and V products; a gradient
    // the dX and dW products). Dropped when a node writes over the source's bytes, when a node that
    // may write into its operands runs, and at the start of every graph.
    struct bf16_copy {
        bool valid = false;
        const char * src = nullptr;   // source layout (type f32 or f16)
        int type = 0;
        int64_t ne[4] = {0};
        size_t nb[4] = {0};
        size_t lo = 0, hi = 0;        // source byte range [lo, hi)
        uint64_t used = 0;
    };
    // Fused accumulations of the graph being computed (backend-cuda.cu, fuse_accumulations): per
    // node index, the memory a MUL_MAT adds its product into (nullptr: none), and the ADD_INPLACE
    // nodes that are thereby done; n_fused counts them over the backend's life (tests).
    std::vector<float *> fuse_acc;
    std::vector<const oomb_tensor *> fuse_at;  // the add_inplace a fused MUL_MAT stands in for (its bytes: C's)
    std::vector<char> fuse_skip;
    int64_t n_fused = 0;
    int64_t n_fused_add = 0;  // of them, ADD nodes run in place on their first operand
    // Sums and biases in the epilogue (fuse_accumulations, cuBLASLt): per node index of a MUL_MAT M, the
    // ADD node A it computes too: M's GEMM writes A's bytes, D = product + X (epi_c) or + a bias vector
    // of M's rows (epi_bias); A is in fuse_skip. n_fused_epi counts the products run so (tests); a
    // product whose shape cuBLASLt has no algorithm for runs unfused and clears A's fuse_skip.
    struct epilogue {
        const oomb_tensor * add = nullptr;  // A
        size_t at = 0;                      // A's node index
        const float * c = nullptr;          // X (D = product + X), or
        const float * bias = nullptr;       // the bias vector (D = product + bias broadcast over columns)
    };
    std::vector<epilogue> fuse_epi;
    int64_t n_fused_epi = 0;
    cublasLtHandle_t cublaslt = nullptr;
    struct lt_plan;  // mul-mat.cu: the descriptors and algorithm of one shape and epilogue
    std::unordered_map<std::string, std::shared_ptr<lt_plan>> lt_plans;
    // Fused linear cross-entropy (fuse_linear_ce): per node index of a linear_cross_entropy_back, the
    // forward node it computes too (whose own index is in fuse_skip); n_fused_lce counts the passes
    // run, last_lce_rows is the last one's rows per block (tests).
    std::vector<oomb_tensor *> fuse_lce;
    int64_t n_fused_lce = 0;
    int64_t last_lce_rows = 0;
    size_t lce_bytes_fit = 0;     // logits block of the last pass whose first choice did not fit (0: none)
    size_t lce_block_bytes = 0;   // the fused pass's logits block cap (oomb_backend_set_linear_cross_entropy_block; 0: 1.25 GiB)
    bool lce_rows_noted = false;  // the note that the logits block was made smaller, printed once

    bf16_copy bf16_copies[N_BF16_COPIES];
    uint64_t bf16_clock = 0;
    void bf16_copies_clear() { for (auto & e : bf16_copies) e.valid = false; }
    // after `node` ran: drops the copies whose source it may have written
    void bf16_copies_after(const oomb_tensor * node);
};

// A default-on switch (OOMB_CUDA_FUSE, OOMB_CUDA_FUSE_LCE, OOMB_CUDA_LT_RULE): true (off) for 0, false, off or
// no (any case); false (on) when unset, empty, 1, true, on or yes; any other value is an error naming the variable.
bool oomb_cuda_env_flag_off(const char * name);

// After every kernel launch: checks the launch (and, with sync_each, the execution).
void oomb_cuda_after_launch(oomb_cuda_ctx & c, const char * kernel, const char * file, int line);
#define OOMB_CUDA_LAUNCHED(c, name) oomb_cuda_after_launch((c), (name), __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Tensor views for kernels
// ---------------------------------------------------------------------------------------------

struct oomb_tv {
    char * d;
    int64_t ne[4];
    int64_t nb[4];
};

static inline oomb_tv oomb_make_tv(const oomb_tensor * t) {
    oomb_tv v;
    v.d = (char *) t->data;
    for (int i = 0; i < 4; i++) { v.ne[i] = t->ne[i]; v.nb[i] = (int64_t) t->nb[i]; }
    return v;
}

// Grid size for a grid-stride loop over n items with `threads` per block.
static inline unsigned oomb_cuda_grid(int64_t n, int threads, int64_t max_blocks = 65536 * 8) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > max_blocks) b = max_blocks;
    return (unsigned) b;
}

// Logical (flat) index -> 4-D index. I is uint32_t when every size fits (faster division).
template <typename I>
__device__ __forceinline__ void oomb_unravel(I i, const int64_t * ne, I & i0, I & i1, I & i2, I & i3) {
    const I n0 = (I) ne[0], n1 = (I) ne[1], n2 = (I) ne[2];
    i0 = i % n0; i /= n0;
    i1 = i % n1; i /= n1;
    i2 = i % n2;
    i3 = i / n2;
}
__device__ __forceinline__ int64_t oomb_off(const oomb_tv & t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}
template <typename I>
__device__ __forceinline__ int64_t oomb_flat_off(const oomb_tv & t, I i) {
    I i0, i1, i2, i3;
    oomb_unravel<I>(i, t.ne, i0, i1, i2, i3);
    return oomb_off(t, (int64_t) i0, (int64_t) i1, (int64_t) i2, (int64_t) i3);
}

// Row r (over dims 1..3) -> byte offset of its first element.
__device__ __forceinline__ int64_t oomb_row_off(const oomb_tv & t, int64_t r) {
    const int64_t i1 = r % t.ne[1];
    r /= t.ne[1];
    const int64_t i2 = r % t.ne[2];
    const int64_t i3 = r / t.ne[2];
    return i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

static inline bool oomb_fits_u32(const oomb_tensor * t) {
    return oomb_nelements(t) < (int64_t) 0xFFFFFFFFll;
}

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float oomb_to_f(float x) { return x; }
__device__ __forceinline__ float oomb_to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float oomb_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename D> __device__ __forceinline__ D oomb_from_f(float x);
template <> __device__ __forceinline__ float oomb_from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half oomb_from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 oomb_from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Loads one float element of a run-time type (f32, f16, bf16).
__device__ __forceinline__ float oomb_load_f(const char * p, int type) {
    switch (type) {
        case OOMB_TYPE_F16: return __half2float(*(const __half *) p);
        case OOMB_TYPE_BF16: return __bfloat162float(*(const __nv_bfloat16 *) p);
        default: return *(const float *) p;
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions (blockDim.x a multiple of 32, at most 1024; every thread gets the result; the
// summation order is fixed, so results are deterministic). sh: __shared__ scratch of 32 elements.
// ---------------------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ T oomb_warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float oomb_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T> __device__ __forceinline__ T oomb_block_sum(T v, T * sh) {
    v = oomb_warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads(); // sh may still be read by a previous reduction
    if (lane == 0) sh[w] = v;
    __syncthreads();
    const int nw = (int) (blockDim.x >> 5);
    v = lane < nw ? sh[lane] : (T) 0;
    return oomb_warp_sum(v);
}
__device__ __forceinline__ float oomb_block_max(float v, float * sh) {
    v = oomb_warp_max(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    const int nw = (int) (blockDim.x >> 5);
    v = lane < nw ? sh[lane] : -INFINITY;
    return oomb_warp_max(v);
}

// Records a data-dependent error (first one wins).
__device__ __forceinline__ void oomb_cuda_record_err(oomb_cuda_err_rec * e, int kind, int node, long long pos, long long value) {
    if (atomicCAS(&e->flag, 0, 1) == 0) {
        e->kind = kind;
        e->node = node;
        e->pos = pos;
        e->value = value;
    }
}
