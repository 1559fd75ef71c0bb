// Scalar conversions between f32 and the 16-bit float types (IEEE half, bfloat16).
// Internal header shared by the core, the CPU backend and the GGUF reader.
#pragma once
#include <cstdint>
#include <cstring>

namespace oomb {

// f32 -> bf16 with round-to-nearest-even; NaN stays NaN (quiet).
static inline uint16_t fp32_to_bf16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf16_to_fp32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; std::memcpy(&f, &u, 4); return f;
}

// IEEE 754 binary16 <-> binary32, round-to-nearest-even, handles subnormals, inf, NaN.
static inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) u = sign;
        else { // subnormal
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    float f; std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t fp32_to_fp16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           // NaN
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          // overflow -> inf (rounds up from 65520)
    if (absu < 0x38800000u) {                                             // subnormal or zero in half
        if (absu < 0x33000000u) return (uint16_t)sign;                    // < 2^-25 -> 0 (rounds to 0)
        const uint32_t e = absu >> 23;
        const uint32_t m = (absu & 0x7fffffu) | 0x800000u;
        // value = m * 2^(e-150); half subnormal unit = 2^-24 => q = m * 2^(e-126)
        const uint32_t s = 126 - e;                                       // right shift amount (>=1)
        uint32_t q = m >> s;
        const uint32_t rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - (112u << 23);     // rebias and round
    return (uint16_t)(sign | (r >> 13));
}

} // namespace oomb
