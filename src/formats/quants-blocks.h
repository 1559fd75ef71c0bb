// Block layouts of ggml's quantized types: one dequantize function per type, one block per call,
// written once for the CPU (src/formats/quants.cpp) and the CUDA kernels (cuda/dequant.cu).
// Restated from ggml-common.h / ggml-quants.c. Every value is computed with the same float32
// operations, in the same order, as gguf-py's gguf.quants.dequantize (e.g. Q4_K: (d*sc)*q -
// (dmin*m)), so the results are bit-exact against it. No a*b+c may be fused into one rounding:
// the host includes this file only from translation units built with -ffp-contract=off, the device
// through OOMB_QMUL / OOMB_QADD / OOMB_QSUB = __fmul_rn / __fadd_rn / __fsub_rn (never contracted).
// f16 fields are little-endian IEEE halves (exact in f32, so any correct conversion agrees).
//
// Before including: define OOMB_QHD (function qualifiers, e.g. `static inline` or
// `__device__ __forceinline__`), OOMB_QMUL(a, b), OOMB_QADD(a, b), OOMB_QSUB(a, b) and OOMB_QF16(bits)
// (IEEE half bits -> float: exact, e.g. fp16.h's fp16_to_fp32 or __half2float).
// Pointers: b -> one block of the type's bytes, y -> the block's elements (f32).

OOMB_QHD float qb_f16(const uint8_t * p) { return OOMB_QF16((uint16_t) (p[0] | (p[1] << 8))); }
OOMB_QHD uint32_t qb_u32(const uint8_t * p) {
    return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

// Q8_0 (34 B / 32): d f16, q int8[32]. x = q*d.
OOMB_QHD void qb_dequant_q8_0(const uint8_t * b, float * y) {
    const float d = qb_f16(b);
    for (int j = 0; j < 32; j++) y[j] = OOMB_QMUL((float) (int8_t) b[2 + j], d);
}
// Q4_0 (18 B / 32): d f16, qs[16]; element j is the low nibble of qs[j], j+16 the high one. x = (q-8)*d.
OOMB_QHD void qb_dequant_q4_0(const uint8_t * b, float * y) {
    const float d = qb_f16(b);
    for (int j = 0; j < 16; j++) {
        y[j] = OOMB_QMUL((float) ((int) (b[2 + j] & 0x0f) - 8), d);
        y[j + 16] = OOMB_QMUL((float) ((int) (b[2 + j] >> 4) - 8), d);
    }
}
// Q4_1 (20 B / 32): d f16, m f16, qs[16] as Q4_0. x = q*d + m.
OOMB_QHD void qb_dequant_q4_1(const uint8_t * b, float * y) {
    const float d = qb_f16(b), m = qb_f16(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = OOMB_QADD(OOMB_QMUL((float) (b[4 + j] & 0x0f), d), m);
        y[j + 16] = OOMB_QADD(OOMB_QMUL((float) (b[4 + j] >> 4), d), m);
    }
}
// The 5-bit quants of Q5_0/Q5_1: nibbles as Q4_0, bit 4 of element j is bit j of qh (u32 LE).
OOMB_QHD int qb_q5_at(const uint8_t * qh, const uint8_t * qs, int j) {
    const uint32_t h = qb_u32(qh);
    const int lo = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
    return lo | (int) (((h >> j) & 1u) << 4);
}
// Q5_0 (22 B / 32): d f16, qh u32, qs[16]. x = (q-16)*d.
OOMB_QHD void qb_dequant_q5_0(const uint8_t * b, float * y) {
    const float d = qb_f16(b);
    for (int j = 0; j < 32; j++) y[j] = OOMB_QMUL(d, (float) (qb_q5_at(b + 2, b + 6, j) - 16));
}
// Q5_1 (24 B / 32): d f16, m f16, qh u32, qs[16]. x = d*q + m.
OOMB_QHD void qb_dequant_q5_1(const uint8_t * b, float * y) {
    const float d = qb_f16(b), m = qb_f16(b + 2);
    for (int j = 0; j < 32; j++) y[j] = OOMB_QADD(OOMB_QMUL(d, (float) qb_q5_at(b + 4, b + 8, j)), m);
}
// Q2_K (84 B / 256): scales[16] (low nibble: scale, high: min, per 16 elements), qs[64], d f16,
// dmin f16. Element e = 128h + 32s + l has bits (qs[32h+l] >> 2s) & 3. x = (d*sc)*q - (dmin*mn).
OOMB_QHD void qb_dequant_q2_k(const uint8_t * b, float * y) {
    const uint8_t * sc = b;
    const uint8_t * qs = b + 16;
    const float d = qb_f16(b + 80), dmin = qb_f16(b + 82);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        const float dl = OOMB_QMUL(d, (float) (sc[e / 16] & 0x0f)), ml = OOMB_QMUL(dmin, (float) (sc[e / 16] >> 4));
        y[e] = OOMB_QSUB(OOMB_QMUL(dl, (float) ((qs[32 * h + l] >> (2 * s)) & 3)), ml);
    }
}
// Q3_K (110 B / 256): hmask[32], qs[64], scales[12] (16 6-bit scales: low nibbles in bytes 0..7,
// first the low then the high nibble of each, 2 high bits in bytes 8..11), d f16. Element
// e = 128h + 32s + l: low bits (qs[32h+l] >> 2s) & 3, minus 4 when bit e/32 of hmask[e%32] is
// clear. x = (d*(sc-32))*q.
OOMB_QHD void qb_dequant_q3_k(const uint8_t * b, float * y) {
    const uint8_t * hm = b;
    const uint8_t * qs = b + 32;
    const uint8_t * sb = b + 96;
    const float d = qb_f16(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        const int lo = (sb[i % 8] >> (4 * (i / 8))) & 0x0f;
        const int hi = (sb[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        dl[i] = OOMB_QMUL(d, (float) ((lo | (hi << 4)) - 32));
    }
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        const int ql = (qs[32 * h + l] >> (2 * s)) & 3;
        const int high = (hm[l] >> (e / 32)) & 1;
        y[e] = OOMB_QMUL(dl[e / 16], (float) (ql - (high ? 0 : 4)));
    }
}
// The 8 6-bit scales and mins of Q4_K/Q5_K, packed in 12 bytes (ggml's get_scale_min_k4).
OOMB_QHD void qb_scale_min_k4(const uint8_t * s, int j, int * sc, int * mn) {
    if (j < 4) {
        *sc = s[j] & 0x3f;
        *mn = s[j + 4] & 0x3f;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}
// Q4_K (144 B / 256) and Q5_K (176 B / 256): d f16, dmin f16, scales[12], [Q5_K: qh[32]], qs[128].
// Element e = 64c + 32k + l (sub-block e/32 = 2c+k) has low bits (qs[32c+l] >> 4k) & 15 and, for
// Q5_K, bit 4 = (qh[l] >> e/32) & 1. x = (d*sc)*q - (dmin*mn).
OOMB_QHD void qb_dequant_q45_k(const uint8_t * b, float * y, bool five) {
    const float d = qb_f16(b), dmin = qb_f16(b + 2);
    const uint8_t * qh = b + 16;
    const uint8_t * qs = b + (five ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        qb_scale_min_k4(b + 4, j, &sc, &mn);
        const float dj = OOMB_QMUL(d, (float) sc), mj = OOMB_QMUL(dmin, (float) mn);
        const int c = j / 2, k = j % 2;
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * c + l] >> (4 * k)) & 0x0f;
            if (five) q |= ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = OOMB_QSUB(OOMB_QMUL(dj, (float) q), mj);
        }
    }
}
OOMB_QHD void qb_dequant_q4_k(const uint8_t * b, float * y) { qb_dequant_q45_k(b, y, false); }
OOMB_QHD void qb_dequant_q5_k(const uint8_t * b, float * y) { qb_dequant_q45_k(b, y, true); }
// Q6_K (210 B / 256): ql[128], qh[64], scales int8[16] (per 16 elements), d f16. Element
// e = 128h + r: low bits (ql[64h + r%64] >> 4(r/64)) & 15, high bits (qh[32h + r%32] >> 2(r/32)) & 3.
// x = (d*sc)*(q-32).
OOMB_QHD void qb_dequant_q6_k(const uint8_t * b, float * y) {
    const uint8_t * ql = b;
    const uint8_t * qh = b + 128;
    const int8_t * sc = (const int8_t *) (b + 192);
    const float d = qb_f16(b + 208);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, r = e % 128;
        const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
        const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
        y[e] = OOMB_QMUL(OOMB_QMUL(d, (float) sc[e / 16]), (float) ((lo | (hi << 4)) - 32));
    }
}

// Calls the block function of ggml type id `type` (the GGUF tensor type numbers: Q4_0 = 2, Q4_1 = 3,
// Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10 .. Q6_K = 14). false: not one of these.
OOMB_QHD bool qb_dequant_block(uint32_t type, const uint8_t * b, float * y) {
    switch (type) {
        case 2: qb_dequant_q4_0(b, y); return true;
        case 3: qb_dequant_q4_1(b, y); return true;
        case 6: qb_dequant_q5_0(b, y); return true;
        case 7: qb_dequant_q5_1(b, y); return true;
        case 8: qb_dequant_q8_0(b, y); return true;
        case 10: qb_dequant_q2_k(b, y); return true;
        case 11: qb_dequant_q3_k(b, y); return true;
        case 12: qb_dequant_q4_k(b, y); return true;
        case 13: qb_dequant_q5_k(b, y); return true;
        case 14: qb_dequant_q6_k(b, y); return true;
        default: return false;
    }
}
