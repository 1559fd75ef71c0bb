// f32 -> Q5_0 / Q4_K / Q5_K / Q6_K block quantizers (see quantize.h for the scheme).
#include "quantize.h"

#include "../fp16.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace oomb {

namespace {

// Round half to even, as ggml's nearest_int (values here are small: |v| < 2^22).
inline int nearest_int(float v) { return (int)std::nearbyint(v); }

void put_f16(uint8_t* p, float v) { const uint16_t h = fp32_to_fp16(v); memcpy(p, &h, 2); }
float get_f16(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_fp32(h); }

// Affine fit of n values: x[i] ~ scale * L[i] - min_out, L in [0, nmax], min_out >= 0, minimising
// sum w[i] * (x[i] - (scale*L[i] - min_out))^2 over the candidate inverse scales
// (nmax + rmin + rdelta*k) / (max - min), k = 0..nstep, each refined by least squares.
float fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* min_out,
                 float rmin, float rdelta, int nstep) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) { lo = std::min(lo, x[i]); hi = std::max(hi, x[i]); }
    if (lo > 0) lo = 0; // the offset only ever lowers values (min_out >= 0)
    if (hi == lo) {
        std::fill(L, L + n, 0);
        *min_out = -lo;
        return 0.0f;
    }
    auto levels = [&](float iscale, float offset, uint8_t* out) {
        for (int i = 0; i < n; i++) out[i] = (uint8_t)std::clamp(nearest_int(iscale * (x[i] - offset)), 0, nmax);
    };
    auto error_of = [&](const uint8_t* l, float scale, float offset) {
        float e = 0;
        for (int i = 0; i < n; i++) { const float d = scale * l[i] + offset - x[i]; e += w[i] * d * d; }
        return e;
    };
    float iscale = nmax / (hi - lo), scale = 1 / iscale, best_min = lo;
    levels(iscale, lo, L);
    float best = error_of(L, scale, lo);
    float sw = 0, sx = 0;
    for (int i = 0; i < n; i++) { sw += w[i]; sx += w[i] * x[i]; }
    uint8_t cand[256];
    for (int k = 0; k <= nstep; k++) {
        const float is = (rmin + rdelta * k + nmax) / (hi - lo);
        levels(is, lo, cand);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) { sl += w[i] * cand[i]; sl2 += w[i] * cand[i] * cand[i]; sxl += w[i] * cand[i] * x[i]; }
        const float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float s = (sw * sxl - sx * sl) / det, off = (sl2 * sx - sl * sxl) / det;
        if (off > 0) { off = 0; s = sxl / sl2; } // the offset must not be positive
        const float e = error_of(cand, s, off);
        if (e < best) { best = e; scale = s; best_min = off; std::copy(cand, cand + n, L); }
    }
    *min_out = -best_min;
    return scale;
}

// Symmetric fit of n values: x[i] ~ scale * l, l in [-nmax, nmax-1], x^2-weighted least squares over
// the inverse scales -(nmax + 0.1 k) / xmax, k = -9..9 (xmax: the value of largest magnitude).
float fit_symmetric(int n, int nmax, const float* x, int8_t* l_out) {
    float amax = 0, xmax = 0;
    for (int i = 0; i < n; i++) if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); xmax = x[i]; }
    if (amax < 1e-15f) { std::fill(l_out, l_out + n, 0); return 0.0f; }
    float best_scale = 0, best = 0;
    bool have = false;
    int8_t cand[64];
    for (int k = 0; k < 19; k++) {
        const int step = k == 0 ? 0 : (k <= 9 ? k - 10 : k - 9); // 0 first, then -9..-1, 1..9
        const float iscale = -(nmax + 0.1f * step) / xmax;
        float sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            cand[i] = (int8_t)l;
            const float w = x[i] * x[i];
            sxl += w * x[i] * l;
            sl2 += w * l * l;
        }
        if (!(sl2 > 0)) continue;
        // the fitted scale sxl/sl2 leaves the error sum(w x^2) - sxl^2/sl2: maximise sxl^2/sl2
        if (!have || sxl * sxl > best * sl2) {
            have = true;
            best_scale = sxl / sl2;
            best = best_scale * sxl;
            std::copy(cand, cand + n, l_out);
        }
    }
    return best_scale;
}

// Packs the 8 6-bit scales and mins of Q4_K/Q5_K into 12 bytes (the inverse of get_scale_min_k4).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
    for (int j = 0; j < 4; j++) { s[j] = ls[j]; s[j + 4] = lm[j]; }
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (uint8_t)((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
        s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
        s[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
}

// One Q4_K (five = false, 144 B) or Q5_K (five = true, 176 B) block of 256 values.
bool quant_q45_k(const float* x, uint8_t* b, bool five) {
    const int nmax = five ? 31 : 15;
    uint8_t L[256];
    float scales[8], mins[8], w[32];
    for (int j = 0; j < 8; j++) {
        const float* xs = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
        const float av = std::sqrt(s2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av + std::fabs(xs[l]);
        scales[j] = five ? fit_affine(32, nmax, xs, w, L + 32 * j, &mins[j], -0.5f, 0.1f, 15)
                         : fit_affine(32, nmax, xs, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
    }
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) { max_scale = std::max(max_scale, scales[j]); max_min = std::max(max_min, mins[j]); }
    const float inv_scale = max_scale > 0 ? 63 / max_scale : 0, inv_min = max_min > 0 ? 63 / max_min : 0;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)std::min(63, nearest_int(inv_scale * scales[j]));
        lm[j] = (uint8_t)std::min(63, nearest_int(inv_min * mins[j]));
    }
    memset(b, 0, five ? 176 : 144);
    put_f16(b, max_scale / 63);
    put_f16(b + 2, max_min / 63);
    const float d = get_f16(b), dmin = get_f16(b + 2);
    if (!std::isfinite(d) || !std::isfinite(dmin)) return false;
    pack_scale_min_k4(ls, lm, b + 4);
    for (int j = 0; j < 8; j++) {
        const float dd = d * ls[j], dm = dmin * lm[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = dd == 0 ? 0 : (uint8_t)std::clamp(nearest_int((x[32 * j + l] + dm) / dd), 0, nmax);
    }
    uint8_t* qh = b + 16;
    uint8_t* qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            if (five) qh[l] |= (uint8_t)(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
        }
    return true;
}

// One Q6_K block (210 B) of 256 values.
bool quant_q6_k(const float* x, uint8_t* b) {
    int8_t l16[256];
    float scales[16], max_scale = 0, max_abs = 0;
    for (int s = 0; s < 16; s++) {
        scales[s] = fit_symmetric(16, 32, x + 16 * s, l16 + 16 * s);
        if (std::fabs(scales[s]) > max_abs) { max_abs = std::fabs(scales[s]); max_scale = scales[s]; }
    }
    memset(b, 0, 210);
    if (max_abs < 1e-15f) return true; // an all-zero block
    const float iscale = -128.0f / max_scale;
    int8_t* sc = (int8_t*)(b + 192);
    for (int s = 0; s < 16; s++) sc[s] = (int8_t)std::min(127, nearest_int(iscale * scales[s]));
    put_f16(b + 208, 1 / iscale);
    const float d = get_f16(b + 208);
    if (!std::isfinite(d)) return false;
    uint8_t L[256];
    for (int s = 0; s < 16; s++) {
        const float ds = d * sc[s];
        for (int i = 0; i < 16; i++)
            L[16 * s + i] = ds == 0 ? 32 : (uint8_t)(std::clamp(nearest_int(x[16 * s + i] / ds), -32, 31) + 32);
    }
    uint8_t* ql = b;
    uint8_t* qh = b + 128;
    for (int h = 0; h < 2; h++) {
        const uint8_t* q = L + 128 * h;
        for (int r = 0; r < 64; r++) ql[64 * h + r] = (uint8_t)((q[r] & 0x0f) | ((q[r + 64] & 0x0f) << 4));
        for (int r = 0; r < 32; r++)
            qh[32 * h + r] = (uint8_t)((q[r] >> 4) | ((q[r + 32] >> 4) << 2) | ((q[r + 64] >> 4) << 4) | ((q[r + 96] >> 4) << 6));
    }
    return true;
}

// One Q5_0 block (22 B) of 32 values: ggml's quantize_row_q5_0_ref.
bool quant_q5_0(const float* x, uint8_t* b) {
    float amax = 0, xmax = 0;
    for (int j = 0; j < 32; j++) if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); xmax = x[j]; }
    const float d = xmax / -16, id = d != 0 ? 1 / d : 0;
    put_f16(b, d);
    if (!std::isfinite(get_f16(b))) return false;
    uint32_t qh = 0;
    uint8_t* qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const int q0 = std::min(31, (int)(int8_t)(x[j] * id + 16.5f));
        const int q1 = std::min(31, (int)(int8_t)(x[j + 16] * id + 16.5f));
        qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)((q0 >> 4) & 1) << j;
        qh |= (uint32_t)((q1 >> 4) & 1) << (j + 16);
    }
    memcpy(b + 2, &qh, 4);
    return true;
}

void set_err(std::string* err, const std::string& m) { if (err) *err = m; }

} // namespace

bool quantize_type_supported(uint32_t type) {
    return type == GGUF_TENSOR_Q5_0 || type == GGUF_TENSOR_Q4_K || type == GGUF_TENSOR_Q5_K || type == GGUF_TENSOR_Q6_K;
}

bool quantize_check_finite(const float* x, int64_t n, int64_t index_base, uint32_t type, std::string* err) {
    for (int64_t i = 0; i < n; i++) {
        if (std::isfinite(x[i])) continue;
        char buf[160];
        snprintf(buf, sizeof buf, "element %" PRId64 " is %s: cannot quantize a non-finite value to %s", index_base + i,
                 std::isnan(x[i]) ? "NaN" : (x[i] > 0 ? "inf" : "-inf"), gguf_tensor_type_name(type));
        set_err(err, buf);
        return false;
    }
    return true;
}

gguf_status quantize_blocks(uint32_t type, const float* x, void* dst, int64_t n, int64_t index_base, std::string* err) {
    if (!quantize_type_supported(type)) {
        const char* name = gguf_tensor_type_name(type);
        set_err(err, std::string("quantize_blocks: cannot quantize to ") + (name ? name : "an unknown type") +
                         ": the quantized types are Q5_0, Q4_K, Q5_K and Q6_K");
        return GGUF_ERR_ARG;
    }
    const int64_t blk = gguf_tensor_type_block_size(type);
    const size_t bytes = gguf_tensor_type_block_bytes(type);
    if (n < 0 || n % blk != 0) {
        char buf[160];
        snprintf(buf, sizeof buf, "cannot quantize %" PRId64 " elements to %s: not a multiple of its block size %" PRId64,
                 n, gguf_tensor_type_name(type), blk);
        set_err(err, buf);
        return GGUF_ERR_ARG;
    }
    uint8_t* out = (uint8_t*)dst;
    for (int64_t i = 0; i < n / blk; i++) {
        const float* xb = x + i * blk;
        uint8_t* b = out + (size_t)i * bytes;
        bool ok = false;
        switch (type) {
        case GGUF_TENSOR_Q5_0: ok = quant_q5_0(xb, b); break;
        case GGUF_TENSOR_Q4_K: ok = quant_q45_k(xb, b, false); break;
        case GGUF_TENSOR_Q5_K: ok = quant_q45_k(xb, b, true); break;
        default: ok = quant_q6_k(xb, b); break;
        }
        if (!ok) {
            char buf[200];
            snprintf(buf, sizeof buf, "cannot quantize elements %" PRId64 "..%" PRId64 " to %s: their scale overflows f16 "
                     "(values too large for this type)", index_base + i * blk, index_base + (i + 1) * blk - 1,
                     gguf_tensor_type_name(type));
            set_err(err, buf);
            return GGUF_ERR_ARG;
        }
    }
    return GGUF_OK;
}

} // namespace oomb
