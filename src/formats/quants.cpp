// Host dequantization of ggml's block types: the functions of quants-blocks.h compiled once, with
// -ffp-contract=off (CMakeLists.txt) so no product and sum is fused into one rounding.
#include "quants.h"

#include "../fp16.h"
#include "../init-normal.h"

#include <cmath>
#include <cstring>

namespace oomb {

namespace {
#define OOMB_QHD static inline
#define OOMB_QMUL(a, b) ((a) * (b))
#define OOMB_QADD(a, b) ((a) + (b))
#define OOMB_QSUB(a, b) ((a) - (b))
#define OOMB_QF16(h) fp16_to_fp32(h)
#define OOMB_QUNROLL _Pragma("GCC unroll 1")  // leave the run loops to the vectorizer (full unrolling defeats it)
#include "quants-blocks.h"
#undef OOMB_QF16
#undef OOMB_QUNROLL
#undef OOMB_QHD
#undef OOMB_QMUL
#undef OOMB_QADD
#undef OOMB_QSUB

struct block_info { uint32_t type; int64_t size; size_t bytes; };
// ggml's GGML_QUANT_SIZES for the supported block types
constexpr block_info k_blocks[] = {
    {2, 32, 18}, {3, 32, 20}, {6, 32, 22}, {7, 32, 24}, {8, 32, 34},
    {10, 256, 84}, {11, 256, 110}, {12, 256, 144}, {13, 256, 176}, {14, 256, 210},
};
const block_info * info(uint32_t t) {
    for (const block_info & b : k_blocks) if (b.type == t) return &b;
    return nullptr;
}
} // namespace

bool quant_type_supported(uint32_t t) { return info(t) != nullptr; }
int64_t quant_block_size(uint32_t t) { const block_info * b = info(t); return b ? b->size : 0; }
size_t quant_block_bytes(uint32_t t) { const block_info * b = info(t); return b ? b->bytes : 0; }

void dequantize_blocks(uint32_t t, const void * src, float * dst, int64_t n_blocks) {
    const block_info * bi = info(t);
    if (!bi) return;
    void (*fn)(const uint8_t *, float *) = nullptr;
    switch (t) {
        case 2: fn = qb_dequant_q4_0; break;
        case 3: fn = qb_dequant_q4_1; break;
        case 6: fn = qb_dequant_q5_0; break;
        case 7: fn = qb_dequant_q5_1; break;
        case 8: fn = qb_dequant_q8_0; break;
        case 10: fn = qb_dequant_q2_k; break;
        case 11: fn = qb_dequant_q3_k; break;
        case 12: fn = qb_dequant_q4_k; break;
        case 13: fn = qb_dequant_q5_k; break;
        default: fn = qb_dequant_q6_k; break;  // 14 (info() found the type)
    }
    const uint8_t * s = (const uint8_t *) src;
    for (int64_t i = 0; i < n_blocks; i++) fn(s + (size_t) i * bi->bytes, dst + i * bi->size);
}

// ---- random blocks -----------------------------------------------------------------------------
// Every quant bit is a uniform random bit (q uniform over its range); the f16 scales are fixed:
//   Q4_K: all 8 sub-block scales and mins 63 (the 12 scale bytes 0xff), d = 1.125 * 2^-14,
//         dmin = 7.5 d (exact in f16): x = 63 d (q - 7.5), q in 0..15; E[x] = 0,
//         RMS = 63 d sqrt(255/12) = 0.01994.
//   Q5_K: scales and mins 31 (63 would need a subnormal d), d = 1.125 * 2^-14, dmin = 15.5 d
//         (exact): x = 31 d (q - 15.5), q in 0..31; E[x] = 0, RMS = 31 d sqrt(1023/12) = 0.01965.
//   Q6_K: x = d sc (q - 32), q in 0..63 (E[q - 32] = -1/2), sc = +16 and -16 on alternate
//         16-element sub-blocks (the -1/2 cancels: E[x] = 0), d = 1.125 * 2^-14:
//         RMS = 16 d sqrt(4095/12 + 1/4) = 0.02030.
//   Q8_0: x = d q, q int8 in -128..127 (E[q] = -1/2), d = +-f16(0.02 / sqrt(5461.5)) alternating
//         per block (E[x] = 0), RMS = |d| sqrt(65535/12 + 1/4) = 0.02 (to f16 rounding).
//   Q5_0: x = d (q - 16), q in 0..31, d = +-f16(0.02 / sqrt(85.5)) alternating per block, as Q8_0.
namespace {
constexpr float k_rand_d = 1.125f / 16384.0f;  // 1.125 * 2^-14: f16 normal, 7.5x and 15.5x exact
float q8_0_rand_d() { return 0.02f / std::sqrt(65535.0f / 12.0f + 0.25f); }
float q5_0_rand_d() { return 0.02f / std::sqrt(1023.0f / 12.0f + 0.25f); }
void put_f16(uint8_t * p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    p[0] = (uint8_t) (h & 0xff);
    p[1] = (uint8_t) (h >> 8);
}
} // namespace

bool quant_random_supported(uint32_t t) { return t == 6 || t == 8 || t == 12 || t == 13 || t == 14; }

double quant_random_rms(uint32_t t) {
    const double d = fp16_to_fp32(fp32_to_fp16(k_rand_d));
    switch (t) {
        case 6: return fp16_to_fp32(fp32_to_fp16(q5_0_rand_d())) * std::sqrt(1023.0 / 12.0 + 0.25);
        case 8: return fp16_to_fp32(fp32_to_fp16(q8_0_rand_d())) * std::sqrt(65535.0 / 12.0 + 0.25);
        case 12: return 63.0 * d * std::sqrt(255.0 / 12.0);
        case 13: return 31.0 * d * std::sqrt(1023.0 / 12.0);
        case 14: return 16.0 * d * std::sqrt(4095.0 / 12.0 + 0.25);
        default: return 0.0;
    }
}

bool quant_random_blocks(uint32_t t, uint64_t seed, void * dst, int64_t n_blocks) {
    if (!quant_random_supported(t)) return false;
    const size_t bb = quant_block_bytes(t), n = (size_t) n_blocks * bb;
    uint8_t * p = (uint8_t *) dst;
    InitRng g(seed);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t r = g.next();
        std::memcpy(p + i, &r, 8);
    }
    if (i < n) {
        const uint64_t r = g.next();
        std::memcpy(p + i, &r, n - i);
    }
    for (int64_t k = 0; k < n_blocks; k++) {
        uint8_t * b = p + (size_t) k * bb;
        const float sign = (k & 1) ? -1.0f : 1.0f;
        switch (t) {
            case 6: put_f16(b, sign * q5_0_rand_d()); break;
            case 8: put_f16(b, sign * q8_0_rand_d()); break;
            case 12:
                put_f16(b, k_rand_d);
                put_f16(b + 2, 7.5f * k_rand_d);
                std::memset(b + 4, 0xff, 12);  // every 6-bit scale and min 63
                break;
            case 13:
                put_f16(b, k_rand_d);
                put_f16(b + 2, 15.5f * k_rand_d);
                // scales and mins 31 (qb_scale_min_k4): bytes 0..7 hold 31 in bits 0..5 and bit 4 of
                // sub-blocks 4..7's values in bits 6..7 (01); bytes 8..11 their low bits (0xf, 0xf)
                std::memset(b + 4, 0x5f, 8);
                std::memset(b + 12, 0xff, 4);
                break;
            default:  // 14, Q6_K
                for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t) (int8_t) ((s & 1) ? -16 : 16);
                put_f16(b + 208, k_rand_d);
                break;
        }
    }
    return true;
}

} // namespace oomb
