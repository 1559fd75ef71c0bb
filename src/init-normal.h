// Deterministic, thread-count-independent normal(0, std) initialisation of named weights, shared by
// qwen2_init_random (models/qwen2.cpp) and oomb-gguf-init (and uniform, for lora_init_peft): the same seed and tensor name give the
// same values in both. A tensor is generated in chunks of kInitChunk values, chunk c from its own
// xoshiro256+ stream seeded by (seed, FNV-1a of the name, c), so chunks can run on any thread.
// Internal header.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

namespace oomb {

constexpr int64_t kInitChunk = 1 << 18;

inline uint64_t splitmix64(uint64_t & x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline uint64_t fnv1a(const std::string & s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

// xoshiro256+ (Blackman & Vigna) seeded through splitmix64.
struct InitRng {
    uint64_t s[4];
    explicit InitRng(uint64_t seed) { for (auto & v : s) v = splitmix64(seed); }
    uint64_t next() {
        const uint64_t r = s[0] + s[3], t = s[1] << 17;
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t;
        s[3] = (s[3] << 45) | (s[3] >> 19);
        return r;
    }
};

// Seed of chunk c of the tensor `name`.
inline uint64_t init_chunk_seed(uint64_t seed, const std::string & name, int64_t c) {
    return (seed * 0x9E3779B97F4A7C15ull ^ fnv1a(name)) + (uint64_t) c * 0xD1B54A32D192ED03ull;
}

// The largest |sample| / std that fill_normal can give: |u * sqrt(-2 ln s / s)| <= sqrt(-2 ln s),
// and s = u^2 + v^2 >= 2^-62 (u, v are multiples of 2^-31), so sqrt(2 * 62 * ln 2) = 9.2706, plus
// a margin for float rounding. oomb-gguf-init bounds --init-std with it.
constexpr float kInitNormalMaxZ = 9.28f;

// n normal(0, std) samples by Marsaglia's polar method (no trigonometry), in float.
inline void fill_normal(uint64_t seed, float std, float * out, int64_t n) {
    InitRng g(seed);
    int64_t i = 0;
    while (i < n) {
        const uint64_t r = g.next();
        const float u = (float) (int32_t) (uint32_t) r * (1.0f / 2147483648.0f);  // [-1, 1)
        const float v = (float) (int32_t) (uint32_t) (r >> 32) * (1.0f / 2147483648.0f);
        const float s = u * u + v * v;
        if (s >= 1.0f || s == 0.0f) continue;
        const float r1 = std::sqrt(-2.0f * std::log(s) / s), f = r1 * std;
        if (std::isfinite(f)) {
            out[i++] = u * f;
            if (i < n) out[i++] = v * f;
        } else {  // a huge std (r1 reaches 2e10 at the smallest s, 2^-62): scale after u, v (|u r1| <= kInitNormalMaxZ)
            out[i++] = (u * r1) * std;
            if (i < n) out[i++] = (v * r1) * std;
        }
    }
}

// n uniform samples in [-bound, bound) (24-bit resolution), from the same streams (LoRA's A).
inline void fill_uniform(uint64_t seed, float bound, float * out, int64_t n) {
    InitRng g(seed);
    for (int64_t i = 0; i < n; i++) {
        const float u = (float) (g.next() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        out[i] = (2.0f * u - 1.0f) * bound;
    }
}

} // namespace oomb
