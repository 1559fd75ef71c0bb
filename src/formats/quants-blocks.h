// Block layouts of ggml's quantized types, written once for the CPU (src/formats/quants.cpp) and
// the CUDA kernels (cuda/dequant.cu). The unit is a run of consecutive elements of one block that
// share their scale and bit positions (qb_dequant_<type>_run: 16 or 32 elements, any part of one):
// the CPU's per-block functions (qb_dequant_<type>) loop over whole runs (long enough to
// vectorize), a GPU thread computes a group of 8 (qb_dequant_group: one 16-byte bf16 store, so
// consecutive threads write consecutive groups). Both call the same run functions: one truth per
// layout, and every element gets the same operations whichever way it is computed.
// Restated from ggml-common.h / ggml-quants.c. Every value is computed with the same float32
// operations, in the same order, as gguf-py's gguf.quants.dequantize (e.g. Q4_K: (d*sc)*q -
// (dmin*m)), so the results are bit-exact against it. No a*b+c may be fused into one rounding:
// the host includes this file only from translation units built with -ffp-contract=off, the device
// through OOMB_QMUL / OOMB_QADD / OOMB_QSUB = __fmul_rn / __fadd_rn / __fsub_rn (never contracted).
// f16 fields are little-endian IEEE halves (exact in f32, so any correct conversion agrees).
//
// Before including: define OOMB_QHD (function qualifiers, e.g. `static inline` or
// `__device__ __forceinline__`), OOMB_QMUL(a, b), OOMB_QADD(a, b), OOMB_QSUB(a, b) and OOMB_QF16(bits)
// (IEEE half bits -> float: exact, e.g. fp16.h's fp16_to_fp32 or __half2float), and OOMB_QUNROLL
// (a pragma placed before the element loops: the device's _Pragma("unroll") turns a group of 8
// into registers; the host's _Pragma("GCC unroll 1") keeps the loops whole for GCC's vectorizer).
// Pointers: b -> one block of the type's bytes, y -> the block's elements (f32). Run functions:
// hd = qb_head_<type>(b), elements e0 .. e0+n-1 of the block into y[0..n), with e0 and n multiples
// of 8 inside one run of the type (the "Runs of" in each type's comment).

OOMB_QHD float qb_f16(const uint8_t * p) { return OOMB_QF16((uint16_t) (p[0] | (p[1] << 8))); }
OOMB_QHD uint32_t qb_u32(const uint8_t * p) {
    return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

// A block's f16 scale fields as f32, decoded once per block (the CPU's block loop) or per thread
// (the GPU): d, and m (Q4_1, Q5_1) or dmin (Q2_K, Q4_K, Q5_K), 0 for the types without one.
struct qb_head { float d, m; };
OOMB_QHD qb_head qb_head_at(const uint8_t * b, int d_off, int m_off) {
    qb_head h;
    h.d = qb_f16(b + d_off);
    h.m = m_off < 0 ? 0.0f : qb_f16(b + m_off);
    return h;
}

// Q8_0 (34 B / 32): d f16, q int8[32]. x = q*d. Runs of 32.
OOMB_QHD qb_head qb_head_q8_0(const uint8_t * b) { return qb_head_at(b, 0, -1); }
OOMB_QHD void qb_dequant_q8_0_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const float d = hd.d;
    const uint8_t * q = b + 2 + e0;
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) y[i] = OOMB_QMUL((float) (int8_t) q[i], d);
}
// Q4_0 (18 B / 32): d f16, qs[16]; element j is the low nibble of qs[j], j+16 the high one. x = (q-8)*d.
// Runs of 16.
OOMB_QHD qb_head qb_head_q4_0(const uint8_t * b) { return qb_head_at(b, 0, -1); }
OOMB_QHD void qb_dequant_q4_0_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const float d = hd.d;
    const uint8_t * q = b + 2 + e0 % 16;
    const int sh = 4 * (e0 / 16);
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) y[i] = OOMB_QMUL((float) ((int) ((q[i] >> sh) & 0x0f) - 8), d);
}
// Q4_1 (20 B / 32): d f16, m f16, qs[16] as Q4_0. x = q*d + m. Runs of 16.
OOMB_QHD qb_head qb_head_q4_1(const uint8_t * b) { return qb_head_at(b, 0, 2); }
OOMB_QHD void qb_dequant_q4_1_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const float d = hd.d, m = hd.m;
    const uint8_t * q = b + 4 + e0 % 16;
    const int sh = 4 * (e0 / 16);
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) y[i] = OOMB_QADD(OOMB_QMUL((float) ((q[i] >> sh) & 0x0f), d), m);
}
// The 5-bit quants of Q5_0/Q5_1: nibbles as Q4_0, bit 4 of element j is bit j of qh (u32 LE, h).
OOMB_QHD int qb_q5_at(uint32_t h, const uint8_t * qs, int j) {
    const int lo = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
    return lo | (int) (((h >> j) & 1u) << 4);
}
// Q5_0 (22 B / 32): d f16, qh u32, qs[16]. x = (q-16)*d. Runs of 32.
OOMB_QHD qb_head qb_head_q5_0(const uint8_t * b) { return qb_head_at(b, 0, -1); }
OOMB_QHD void qb_dequant_q5_0_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const float d = hd.d;
    const uint32_t h = qb_u32(b + 2);
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) y[i] = OOMB_QMUL(d, (float) (qb_q5_at(h, b + 6, e0 + i) - 16));
}
// Q5_1 (24 B / 32): d f16, m f16, qh u32, qs[16]. x = d*q + m. Runs of 32.
OOMB_QHD qb_head qb_head_q5_1(const uint8_t * b) { return qb_head_at(b, 0, 2); }
OOMB_QHD void qb_dequant_q5_1_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const float d = hd.d, m = hd.m;
    const uint32_t h = qb_u32(b + 4);
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) y[i] = OOMB_QADD(OOMB_QMUL(d, (float) qb_q5_at(h, b + 8, e0 + i)), m);
}
// Q2_K (84 B / 256): scales[16] (low nibble: scale, high: min, per 16 elements), qs[64], d f16,
// dmin f16. Element e = 128h + 32s + l has bits (qs[32h+l] >> 2s) & 3. x = (d*sc)*q - (dmin*mn).
// Runs of 16.
OOMB_QHD qb_head qb_head_q2_k(const uint8_t * b) { return qb_head_at(b, 80, 82); }
OOMB_QHD void qb_dequant_q2_k_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const int h = e0 / 128, s = (e0 % 128) / 32, l = e0 % 32;
    const uint8_t sc = b[e0 / 16];
    const uint8_t * q = b + 16 + 32 * h + l;
    const float dl = OOMB_QMUL(hd.d, (float) (sc & 0x0f)), ml = OOMB_QMUL(hd.m, (float) (sc >> 4));
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) y[i] = OOMB_QSUB(OOMB_QMUL(dl, (float) ((q[i] >> (2 * s)) & 3)), ml);
}
// Q3_K (110 B / 256): hmask[32], qs[64], scales[12] (16 6-bit scales: low nibbles in bytes 0..7,
// first the low then the high nibble of each, 2 high bits in bytes 8..11), d f16. Element
// e = 128h + 32s + l: low bits (qs[32h+l] >> 2s) & 3, minus 4 when bit e/32 of hmask[e%32] is
// clear. x = (d*(sc-32))*q. Runs of 16.
OOMB_QHD qb_head qb_head_q3_k(const uint8_t * b) { return qb_head_at(b, 108, -1); }
OOMB_QHD void qb_dequant_q3_k_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const int h = e0 / 128, s = (e0 % 128) / 32, l = e0 % 32, is = e0 / 16, hb = e0 / 32;
    const uint8_t * hm = b + l;
    const uint8_t * q = b + 32 + 32 * h + l;
    const uint8_t * sb = b + 96;
    const int lo = (sb[is % 8] >> (4 * (is / 8))) & 0x0f;
    const int hi = (sb[8 + is % 4] >> (2 * (is / 4))) & 0x03;
    const float dl = OOMB_QMUL(hd.d, (float) ((lo | (hi << 4)) - 32));
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) {
        const int ql = (q[i] >> (2 * s)) & 3;
        const int high = (hm[i] >> hb) & 1;
        y[i] = OOMB_QMUL(dl, (float) (ql - (high ? 0 : 4)));
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
// Q5_K, bit 4 = (qh[l] >> e/32) & 1. x = (d*sc)*q - (dmin*mn). Runs of 32.
OOMB_QHD qb_head qb_head_q45_k(const uint8_t * b) { return qb_head_at(b, 0, 2); }
OOMB_QHD void qb_dequant_q45_k_run(const uint8_t * b, qb_head hd, int e0, int n, float * y, bool five) {
    const int j = e0 / 32, c = j / 2, k = j % 2, l = e0 % 32;
    int sc, mn;
    qb_scale_min_k4(b + 4, j, &sc, &mn);
    const float dj = OOMB_QMUL(hd.d, (float) sc), mj = OOMB_QMUL(hd.m, (float) mn);
    const uint8_t * qh = b + 16 + l;
    const uint8_t * q = b + (five ? 48 : 16) + 32 * c + l;
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) {
        int x = (q[i] >> (4 * k)) & 0x0f;
        if (five) x |= ((qh[i] >> j) & 1) << 4;
        y[i] = OOMB_QSUB(OOMB_QMUL(dj, (float) x), mj);
    }
}
OOMB_QHD qb_head qb_head_q4_k(const uint8_t * b) { return qb_head_q45_k(b); }
OOMB_QHD qb_head qb_head_q5_k(const uint8_t * b) { return qb_head_q45_k(b); }
OOMB_QHD void qb_dequant_q4_k_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) { qb_dequant_q45_k_run(b, hd, e0, n, y, false); }
OOMB_QHD void qb_dequant_q5_k_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) { qb_dequant_q45_k_run(b, hd, e0, n, y, true); }
// Q6_K (210 B / 256): ql[128], qh[64], scales int8[16] (per 16 elements), d f16. Element
// e = 128h + r: low bits (ql[64h + r%64] >> 4(r/64)) & 15, high bits (qh[32h + r%32] >> 2(r/32)) & 3.
// x = (d*sc)*(q-32). Runs of 16.
OOMB_QHD qb_head qb_head_q6_k(const uint8_t * b) { return qb_head_at(b, 208, -1); }
OOMB_QHD void qb_dequant_q6_k_run(const uint8_t * b, qb_head hd, int e0, int n, float * y) {
    const int h = e0 / 128, r = e0 % 128;
    const uint8_t * ql = b + 64 * h + r % 64;
    const uint8_t * qh = b + 128 + 32 * h + r % 32;
    const int sl = 4 * (r / 64), sh = 2 * (r / 32);
    const float ds = OOMB_QMUL(hd.d, (float) (int8_t) b[192 + e0 / 16]);
    OOMB_QUNROLL
    for (int i = 0; i < n; i++) {
        const int lo = (ql[i] >> sl) & 0x0f;
        const int hi = (qh[i] >> sh) & 0x03;
        y[i] = OOMB_QMUL(ds, (float) ((lo | (hi << 4)) - 32));
    }
}

// The per-block functions: the head decoded once, then the runs in order.
#define OOMB_QB_BLOCK_FN(name, n, run)                                                         \
    OOMB_QHD void qb_dequant_##name(const uint8_t * b, float * y) {                            \
        const qb_head hd = qb_head_##name(b);                                                  \
        for (int e0 = 0; e0 < (n); e0 += (run)) qb_dequant_##name##_run(b, hd, e0, (run), y + e0); \
    }
OOMB_QB_BLOCK_FN(q8_0, 32, 32)
OOMB_QB_BLOCK_FN(q4_0, 32, 16)
OOMB_QB_BLOCK_FN(q4_1, 32, 16)
OOMB_QB_BLOCK_FN(q5_0, 32, 32)
OOMB_QB_BLOCK_FN(q5_1, 32, 32)
OOMB_QB_BLOCK_FN(q2_k, 256, 16)
OOMB_QB_BLOCK_FN(q3_k, 256, 16)
OOMB_QB_BLOCK_FN(q4_k, 256, 32)
OOMB_QB_BLOCK_FN(q5_k, 256, 32)
OOMB_QB_BLOCK_FN(q6_k, 256, 16)
#undef OOMB_QB_BLOCK_FN

// Elements per block of ggml type id `type` (see qb_dequant_group): 256 for the K-quants, else 32.
OOMB_QHD constexpr int qb_block_elems(uint32_t type) { return type >= 10 ? 256 : 32; }

// Group g (elements 8g .. 8g+7) of one block of ggml type id `type` (the GGUF tensor type numbers:
// Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10 .. Q6_K = 14); y -> 8 floats. false:
// not one of these. With a constant `type` (the CUDA kernels' template argument) the switch folds away.
OOMB_QHD bool qb_dequant_group(uint32_t type, const uint8_t * b, int g, float * y) {
    switch (type) {
        case 2: qb_dequant_q4_0_run(b, qb_head_q4_0(b), 8 * g, 8, y); return true;
        case 3: qb_dequant_q4_1_run(b, qb_head_q4_1(b), 8 * g, 8, y); return true;
        case 6: qb_dequant_q5_0_run(b, qb_head_q5_0(b), 8 * g, 8, y); return true;
        case 7: qb_dequant_q5_1_run(b, qb_head_q5_1(b), 8 * g, 8, y); return true;
        case 8: qb_dequant_q8_0_run(b, qb_head_q8_0(b), 8 * g, 8, y); return true;
        case 10: qb_dequant_q2_k_run(b, qb_head_q2_k(b), 8 * g, 8, y); return true;
        case 11: qb_dequant_q3_k_run(b, qb_head_q3_k(b), 8 * g, 8, y); return true;
        case 12: qb_dequant_q4_k_run(b, qb_head_q4_k(b), 8 * g, 8, y); return true;
        case 13: qb_dequant_q5_k_run(b, qb_head_q5_k(b), 8 * g, 8, y); return true;
        case 14: qb_dequant_q6_k_run(b, qb_head_q6_k(b), 8 * g, 8, y); return true;
        default: return false;
    }
}
