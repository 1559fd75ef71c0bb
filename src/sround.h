// Stochastic rounding f32 -> bf16 for optimizer state (AdamW moments kept in bf16) and for bf16
// KV-gradient pages (the paged-attention backward adds each chunk's dK/dV in f32 and rounds back).
// Internal header shared by the CPU backend (src/ops-cpu.cpp, src/cpu/paged-attn.cpp) and the CUDA
// backend (cuda/optim.cu, cuda/paged-attn*): both round the same way, so a bf16 step is
// reproducible on either.
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

// ---- bf16 KV-gradient pages -------------------------------------------------------------------
// Each paged_attn_back call adds its chunk's f32 contribution to an element once and rounds the
// sum back to bf16. The random bits of element (position p, KV head g, dim d) come from its index
// (p * Hkv + g) * D + d (wrapping at 2^32: only a repeat of random bits) and a salt mixing the
// pool's seed (oomb_paged_attn_set_grad_seed: per step, layer, dK or dV) with the chunk's first
// query position, so every chunk's write draws new bits and a run is reproducible.
OOMB_SR_HD uint32_t sr_kv_salt(uint32_t pool_seed, int32_t chunk_pos0) {
    return sr_hash(pool_seed ^ sr_hash((uint32_t) chunk_pos0 ^ 0x632be5abu)) * 0x85ebca6bu;
}
OOMB_SR_HD uint32_t sr_kv_index(int64_t p, int64_t g, int64_t d, int64_t Hkv, int64_t D) {
    return (uint32_t) (((uint64_t) p * (uint64_t) Hkv + (uint64_t) g) * (uint64_t) D + (uint64_t) d);
}
OOMB_SR_HD float sr_bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t) h << 16;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f; __builtin_memcpy(&f, &u, 4); return f;
#endif
}
// old (bf16 bits) + add (f32), summed in f32, stochastically rounded back to bf16 bits.
OOMB_SR_HD uint16_t sr_bf16_add(uint16_t old, float add, uint32_t i, uint32_t salt) {
    return sr_bf16_bits(f32_bits(sr_bf16_to_f32(old) + add), i, salt);
}

} // namespace oomb
