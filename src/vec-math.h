// Small vectorizable math shared by the CPU kernels (ops-cpu.cpp, cpu/paged-attn.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace oomb {

// exp(x) in f32 without branches, so loops over it vectorize (Cephes expf: range reduction by
// ln 2 in two parts, degree-6 polynomial; max relative error ~2e-7). exp(-inf) = 0, exp(+inf) = inf.
inline float exp_f(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365478515625f;
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; // round to nearest
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    const int32_t e = ((int32_t) n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    float res = y * scale;
    res = x < lo ? 0.0f : res;
    res = x > 88.72283935546875f ? INFINITY : res;
    return res;
}

} // namespace oomb
