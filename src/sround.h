// Stochastic rounding f32 -> bf16 for optimizer state (AdamW moments kept in bf16).
// Internal header shared by the CPU backend (src/ops-cpu.cpp) and the CUDA backend (cuda/optim.cu):
// both round the same way, so a bf16-state step is reproducible on either.
//
// Why stochastic: an EMA such as v = b2*v + (1-b2)*g^2 with b2 = 0.999 changes v by 0.1 % per
// step, below half a bf16 ulp (0.39 %): round-to-nearest would freeze it. Rounding up with
// probability equal to the discarded fraction keeps the expectation exact (Gupta et al. 2015,
// "Deep Learning with Limited Numerical Precision"; Zamirai et al. 2020 for bf16 training).
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define OOMB_SR_HD __host__ __device__ __forceinline__
#else
#define OOMB_SR_HD static inline
#endif

namespace oomb {

// 32-bit integer hash (lowbias32, Chris Wellons' hash-prospector): the random bits of element i.
OOMB_SR_HD uint32_t sr_hash(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352dU;
    x ^= x >> 15; x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

OOMB_SR_HD uint32_t f32_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u; __builtin_memcpy(&u, &x, 4); return u;
#endif
}

// Per-step salt from the step number t (AdamW's hp[8], an exact integer in f32 up to 2^24): every
// step draws new random bits. (The bias corrections 1 - beta^t are no seed: they reach 1.0f after
// a few hundred steps and then stop changing.)
OOMB_SR_HD uint32_t sr_salt(float step) { return sr_hash(f32_bits(step) ^ 0x9E3779B9u) * 0x85ebca6bu; }

// bits of f32 x -> bf16 bits, rounded up in magnitude with probability (discarded low 16 bits) / 2^16,
// using the 16 random bits of sr_hash(i * 0x9E3779B9 ^ salt). NaN stays NaN; inf stays inf; a value
// that would round past the largest finite bf16 becomes inf only when it is already beyond it.
OOMB_SR_HD uint16_t sr_bf16_bits(uint32_t u, uint32_t i, uint32_t salt) {
    if ((u & 0x7fffffffu) >= 0x7f800000u) return (uint16_t) ((u >> 16) | ((u & 0x7fffffffu) > 0x7f800000u ? 0x40u : 0u));
    const uint32_t r = sr_hash(i * 0x9E3779B9u ^ salt) & 0xffffu;
    const uint32_t up = u + r;  // carries into the kept bits with probability (u & 0xffff) / 2^16
    if ((up & 0x7f800000u) == 0x7f800000u) return (uint16_t) (u >> 16);  // never round a finite value to inf
    return (uint16_t) (up >> 16);
}

} // namespace oomb
