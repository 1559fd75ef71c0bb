// Host dequantization of ggml's block types: the functions of quants-blocks.h compiled once, with
// -ffp-contract=off (CMakeLists.txt) so no product and sum is fused into one rounding.
#include "quants.h"

#include "../fp16.h"

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

} // namespace oomb
