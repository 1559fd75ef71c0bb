// GPU dequantization of the block types (see dequant.cuh). Written-bandwidth bound: a 7B base
// dequantizes ~13 GB of bf16 per chunk of tokens, so the stores must be coalesced.
// Design: a thread block of 256 threads owns a tile of consecutive blocks of one row (8 K-quant
// blocks or 64 blocks of 32); it stages the tile's bytes into shared memory with coalesced 32-bit
// loads (a byte at each unaligned end), then thread t computes group t % (block elements / 8) of
// block t / (block elements / 8): 8 consecutive outputs, stored as one 16-byte bf16 store (two for
// f32), consecutive threads on consecutive groups. Header fields come from shared memory
// (broadcast reads); no local-memory arrays (the 8 values stay in registers). The arithmetic is
// quants-blocks.h's run functions, as on the CPU, so the values are the CPU's bit for bit.
// A tile never spans rows, except that contiguous rows (row_bytes == blocks per row * block bytes,
// the usual case) are treated as one long row, so only the very last tile is partial.

#include "dequant.cuh"

#include <cstring>

namespace {

#define OOMB_QHD static __device__ __forceinline__
#define OOMB_QMUL(a, b) __fmul_rn((a), (b))
#define OOMB_QADD(a, b) __fadd_rn((a), (b))
#define OOMB_QSUB(a, b) __fsub_rn((a), (b))
#define OOMB_QF16(h) __half2float(__ushort_as_half(h))
#define OOMB_QUNROLL _Pragma("unroll")
#include "formats/quants-blocks.h"
#undef OOMB_QUNROLL
#undef OOMB_QF16
#undef OOMB_QHD
#undef OOMB_QMUL
#undef OOMB_QADD
#undef OOMB_QSUB

constexpr int k_threads = 256;
// the largest tile: 64 Q8_0 blocks (34 B) = 2176 B; 8 Q6_K blocks = 1680 B; plus 3 B of alignment
constexpr int k_tile_bytes = 2176 + 4;

// 8 consecutive outputs at d: one 16-byte store (bf16) or two (f32) when d is 16-byte aligned (__stwb:
// st.global.wb.v4, the default caching; a plain uint4 assignment was split into 32-bit stores)
// (VEC), else element stores.
// two f32 -> one bf16x2 word (each rounded to nearest even, as __float2bfloat16_rn), a at the low half
__device__ __forceinline__ uint32_t bf16x2_bits(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}
template <bool VEC> __device__ __forceinline__ void store8(__nv_bfloat16 * d, const float * y) {
    if constexpr (VEC) {
        __stwb((uint4 *) d, make_uint4(bf16x2_bits(y[0], y[1]), bf16x2_bits(y[2], y[3]), bf16x2_bits(y[4], y[5]), bf16x2_bits(y[6], y[7])));
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) d[i] = __float2bfloat16_rn(y[i]);
    }
}
template <bool VEC> __device__ __forceinline__ void store8(float * d, const float * y) {
    if constexpr (VEC) {
        __stwb((float4 *) d, make_float4(y[0], y[1], y[2], y[3]));
        __stwb((float4 *) d + 1, make_float4(y[4], y[5], y[6], y[7]));
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) d[i] = y[i];
    }
}

// Grid: one thread block per tile (VEC: dst 16-byte aligned), tiles_per_row tiles in each of the rows (row r's blocks at
// src + r * row_bytes, its K outputs at dst + r * K). GT: the ggml type id, a constant.
template <uint32_t GT, typename T, bool VEC>
__global__ void __launch_bounds__(k_threads) dequant_kernel(const uint8_t * __restrict__ src, size_t row_bytes, int block_bytes,
                                                          int64_t nblk, int64_t tiles_per_row, int64_t K, T * __restrict__ dst) {
    constexpr int BS = qb_block_elems(GT), GPB = BS / 8, BPT = k_threads / GPB;
    static_assert(k_threads % GPB == 0, "a tile holds whole blocks");
    __shared__ __align__(16) uint8_t tile[k_tile_bytes];

    const int64_t r = blockIdx.x / tiles_per_row, b0 = (blockIdx.x % tiles_per_row) * (int64_t) BPT;
    const int nb = nblk - b0 < BPT ? (int) (nblk - b0) : BPT;  // blocks in this tile
    const int nbytes = nb * block_bytes;
    const uint8_t * s = src + (size_t) r * row_bytes + (size_t) b0 * block_bytes;

    // stage bytes [0, nbytes) of s at tile[o + k], o = s % 4: the words of s's 4-byte-aligned
    // interior land on aligned words of the tile; the head (before it) and tail bytes one by one
    const int t = threadIdx.x;
    const int o = (int) ((uintptr_t) s & 3);
    const int head = min((4 - o) & 3, nbytes);
    const int nw = (nbytes - head) / 4;
    const int tail0 = head + 4 * nw;
    const uint32_t * sw = (const uint32_t *) (s + head);
    uint32_t * tw = (uint32_t *) (tile + o + head);  // o + head is 0 or 4
    for (int w = t; w < nw; w += k_threads) tw[w] = __ldg(sw + w);
    if (t < head + (nbytes - tail0)) {
        const int k = t < head ? t : tail0 + (t - head);
        tile[o + k] = __ldg(s + k);
    }
    __syncthreads();

    const int lb = t / GPB, g = t % GPB;
    if (lb >= nb) return;
    float y[8];
    qb_dequant_group(GT, tile + o + lb * block_bytes, g, y);
    store8<VEC>(dst + r * K + (b0 + lb) * BS + 8 * g, y);
}

template <uint32_t GT, typename T>
void launch(oomb_cuda_ctx & c, const void * src, size_t row_bytes, size_t block_bytes, int64_t rows, int64_t K, T * dst) {
    constexpr int BS = qb_block_elems(GT), BPT = k_threads / (BS / 8);
    static_assert(BS == 32 || BS == 256, "block size");
    if ((size_t) BPT * block_bytes + 3 > (size_t) k_tile_bytes) oomb_error("dequantize: internal: tile of %d blocks of %zu B exceeds the staging buffer", BPT, block_bytes);
    int64_t nblk = K / BS;
    if (rows == 0 || nblk == 0) return;
    if (row_bytes == (size_t) nblk * block_bytes) {  // contiguous rows: one long row
        nblk *= rows;
        K *= rows;
        rows = 1;
    }
    const int64_t tiles_per_row = (nblk + BPT - 1) / BPT, grid = rows * tiles_per_row;
    if (grid > INT32_MAX) oomb_error("dequantize: %lld tiles exceed the launch range", (long long) grid);
    // 16-byte stores need a 16-byte aligned dst (K and the block offsets are multiples of 8 elements)
    const uint8_t * s = (const uint8_t *) src;
    if ((uintptr_t) dst % 16 == 0) dequant_kernel<GT, T, true><<<(unsigned) grid, k_threads, 0, c.stream>>>(s, row_bytes, (int) block_bytes, nblk, tiles_per_row, K, dst);
    else dequant_kernel<GT, T, false><<<(unsigned) grid, k_threads, 0, c.stream>>>(s, row_bytes, (int) block_bytes, nblk, tiles_per_row, K, dst);
    OOMB_CUDA_LAUNCHED(c, "dequantize");
}

template <typename T>
void launch_type(oomb_cuda_ctx & c, uint32_t gt, const void * src, size_t row_bytes, size_t bb, int64_t rows, int64_t K, T * dst) {
    switch (gt) {
        case 2: launch<2>(c, src, row_bytes, bb, rows, K, dst); break;
        case 3: launch<3>(c, src, row_bytes, bb, rows, K, dst); break;
        case 6: launch<6>(c, src, row_bytes, bb, rows, K, dst); break;
        case 7: launch<7>(c, src, row_bytes, bb, rows, K, dst); break;
        case 8: launch<8>(c, src, row_bytes, bb, rows, K, dst); break;
        case 10: launch<10>(c, src, row_bytes, bb, rows, K, dst); break;
        case 11: launch<11>(c, src, row_bytes, bb, rows, K, dst); break;
        case 12: launch<12>(c, src, row_bytes, bb, rows, K, dst); break;
        case 13: launch<13>(c, src, row_bytes, bb, rows, K, dst); break;
        case 14: launch<14>(c, src, row_bytes, bb, rows, K, dst); break;
        default: oomb_error("dequantize: ggml type %u is not a supported block type", gt);
    }
}

} // namespace

void oomb_cuda_dequantize_rows(oomb_cuda_ctx & c, enum oomb_type type, const void * src, size_t row_bytes, int64_t rows, int64_t K,
                               void * dst, enum oomb_type dst_type) {
    const uint32_t gt = oomb_type_to_ggml(type);
    const size_t bb = oomb_type_size(type);
    if (dst_type == OOMB_TYPE_BF16) launch_type(c, gt, src, row_bytes, bb, rows, K, (__nv_bfloat16 *) dst);
    else launch_type(c, gt, src, row_bytes, bb, rows, K, (float *) dst);
}
