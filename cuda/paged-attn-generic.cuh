// Paged attention on CUDA, the generic family: exact f32 kernels for any pool type (f32, f16,
// bf16), head dims up to 256 and any strides; one warp per query row (forward, dq) or per key
// (dK/dV). Slow but general: the dispatcher (paged-attn.cu) also routes here whatever the fast
// kernels do not support. Included by paged-attn.cu only.
// Page schedules (oomb-schedule.h): every kernel here takes one (GenArgs::sched; kind 0 = dense
// adds one untaken branch per page). The row kernels skip the pages a row's query tile does not
// attend (pa_sched_attends, the forward lists); the key kernel asks the inverse lists
// (pa_sched_attends_inv) whether the query tile of a row chose the key's page, and returns before
// reading a page no tile listed (pa_sched_page_used: the offload maps only the listed pages). Under
// a window (RANGE, LISTS_RANGE) the row loops and the key grid cover the window's pages only.
#pragma once

#include "paged-attn-common.cuh"
#include "oomb/paged-attn-sched.h"

#include <climits>

namespace {

// ---------------------------------------------------------------------------------------------
// Generic kernels (any pool type, D <= 256): exact f32, one warp per query row / per key
// ---------------------------------------------------------------------------------------------

constexpr int GMAX = 8; // D <= 32 * GMAX

struct GenArgs {
    const float * q; int64_t q_s1, q_s2;        // floats
    const char * kp; const char * vp; int64_t p_s0, p_s1, p_s2, p_s3;  // bytes
    const int32_t * pt; int n_logical, n_pages, P;
    const int32_t * pos;
    int D, T, H, G;
    float scale;
    float * out;                                 // [T][H][D]
    const float * dout; int64_t do_s1, do_s2;    // floats
    float * lse; float * delta;                  // [T*H] natural-log units (forward: the op's saved LSE)
    float * dkp; float * dvp; int64_t gr_s1, gr_s2, gr_s3; // elements (f32, or bf16 with gsr.bf16)
    GradSR gsr;                                  // bf16 gradient pages
    const int * maxpos;
    int Hkv;
    oomb::pa_sched sched;                        // device pointers to the lists
    int key0;                                    // dK/dV kernel: the first key position of its items (a window's start)
    int acc;                                     // accumulate (oomb_paged_attn_args): merge into out / lse, add into dq
};

template <typename KT>
__device__ __forceinline__ float gload(const char * base, int64_t off, int64_t s0, int d) {
    return to_f32<KT>(*(const KT *) (base + off + d * s0));
}

// Under a schedule other than DENSE, at the first position p of a page that query tile qt does not
// attend: true, and p moves to the page's last position (the row loops then skip the whole page).
__device__ __forceinline__ bool sched_skips_page(const GenArgs & a, int c0, int qt, int & p) {
    if (!a.sched.kind || p % a.P != 0 || oomb::pa_sched_attends(a.sched, c0, qt, p / a.P)) return false;
    p += a.P - 1;
    return true;
}

// The positions a row's key loop visits, [key_begin, key_end(pos)]: a RANGE / LISTS_RANGE window's
// pages only (the offload's blocks of a long history: each block's rows do not walk the pages
// before or after its window), else 0 .. pos.
__device__ __forceinline__ int sched_key_begin(const GenArgs & a) {
    return a.sched.kind == 1 || a.sched.kind == 3 ? (int) min((int64_t) a.sched.first * a.P, (int64_t) INT_MAX) : 0;
}
__device__ __forceinline__ int sched_key_end(const GenArgs & a, int pos) {
    return a.sched.kind == 1 || a.sched.kind == 3 ? (int) min((int64_t) pos, (int64_t) a.sched.last * a.P - 1) : pos;
}

// MODE_OUT: out and lse (the op's packed node); MODE_LSE: lse and delta (with dout)
template <typename KT, int MODE>
__global__ void pa_fwd_generic(const GenArgs a) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= (int64_t) a.T * a.H) return;
    const int t = (int) (r / a.H), h = (int) (r % a.H), g = h / a.G;
    float qv[GMAX], acc[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < a.D ? a.q[t * a.q_s2 + h * a.q_s1 + d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int pt_ = a.pos[t];
    const int c0 = a.pos[0] / a.P, qt = oomb::pa_qtile(pt_, c0, a.P);
    for (int p = sched_key_begin(a), pe = sched_key_end(a, pt_); p <= pe; p++) {
        if (sched_skips_page(a, c0, qt, p)) continue;
        const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
        if (pg < 0) continue;
        const int64_t off = (int64_t) pg * a.p_s3 + (int64_t) (p % a.P) * a.p_s2 + (int64_t) g * a.p_s1;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) s += qv[i] * gload<KT>(a.kp, off, a.p_s0, d);
        }
        s = warp_sum(s) * a.scale;
        if (s > m) {
            const float c = expf(m - s);
            l *= c;
#pragma unroll
            for (int i = 0; i < GMAX; i++) acc[i] *= c;
            m = s;
        }
        const float w = expf(s - m);
        l += w;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) acc[i] += w * gload<KT>(a.vp, off, a.p_s0, d);
        }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (MODE == MODE_OUT) {
        // as MODE_LSE below; a row without keys: -inf. accumulate: merged with the row's earlier
        // result (every lane reads its LSE before lane 0 overwrites it)
        const float L = m + logf(l);
        const oomb::pa_merge_w w = a.acc ? oomb::pa_merge_weights(a.lse[r], L) : oomb::pa_merge_w{0.0f, 1.0f, L};
        __syncwarp();
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) a.out[r * a.D + d] = a.acc ? oomb::pa_merge_out(w, a.out[r * a.D + d], acc[i] * inv) : acc[i] * inv;
        }
        if (lane == 0) a.lse[r] = w.L;
    } else {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) dot += a.dout[t * a.do_s2 + h * a.do_s1 + d] * acc[i] * inv;
        }
        dot = warp_sum(dot);
        if (lane == 0) {
            a.lse[r] = m + logf(l);
            a.delta[r] = dot;
        }
    }
}

// delta = dout . out per row from the forward's saved out [T][H][D] (one warp per row), with the
// same f32 sum as the MODE_LSE forward.
__global__ void pa_delta_generic(const GenArgs a, const float * out_s) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= (int64_t) a.T * a.H) return;
    const int t = (int) (r / a.H), h = (int) (r % a.H);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        if (d < a.D) dot += a.dout[t * a.do_s2 + h * a.do_s1 + d] * out_s[r * a.D + d];
    }
    dot = warp_sum(dot);
    if (lane == 0) a.delta[r] = dot;
}

template <typename KT>
__global__ void pa_dq_generic(const GenArgs a) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= (int64_t) a.T * a.H) return;
    const int t = (int) (r / a.H), h = (int) (r % a.H), g = h / a.G;
    float qv[GMAX], dov[GMAX], acc[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < a.D ? a.q[t * a.q_s2 + h * a.q_s1 + d] : 0.0f;
        dov[i] = d < a.D ? a.dout[t * a.do_s2 + h * a.do_s1 + d] : 0.0f;
        acc[i] = 0.0f;
    }
    const float lse = a.lse[r], delta = a.delta[r];
    const int c0 = a.pos[0] / a.P, qt = oomb::pa_qtile(a.pos[t], c0, a.P);
    for (int p = sched_key_begin(a), pe = sched_key_end(a, a.pos[t]); p <= pe; p++) {
        if (sched_skips_page(a, c0, qt, p)) continue;
        const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
        if (pg < 0) continue;
        const int64_t off = (int64_t) pg * a.p_s3 + (int64_t) (p % a.P) * a.p_s2 + (int64_t) g * a.p_s1;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) { s += qv[i] * gload<KT>(a.kp, off, a.p_s0, d); dp += dov[i] * gload<KT>(a.vp, off, a.p_s0, d); }
        }
        s = warp_sum(s);
        dp = warp_sum(dp);
        const float pr = expf(s * a.scale - lse);
        const float ds = pr * (dp - delta) * a.scale;
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) acc[i] += ds * gload<KT>(a.kp, off, a.p_s0, d);
        }
    }
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        if (d < a.D) a.out[r * a.D + d] = a.acc ? a.out[r * a.D + d] + acc[i] : acc[i];
    }
}

// one warp per (key position, kv head)
template <typename KT>
__global__ void pa_dkdv_generic(const GenArgs a, int64_t n_items) {
    const int lane = threadIdx.x & 31;
    const int64_t it = (int64_t) blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (it >= n_items) return;
    const int p = a.key0 + (int) (it / a.Hkv), g = (int) (it % a.Hkv);
    if (p > *a.maxpos) return;
    const int c0 = a.pos[0] / a.P, lp = p / a.P;
    // outside a RANGE / LISTS_RANGE window, or a history page no tile listed: not read, not written
    if (!oomb::pa_sched_page_used(a.sched, c0, lp)) return;
    const int pg = page_of(a.pt, a.n_logical, a.n_pages, a.P, p);
    if (pg < 0) return;
    const int64_t off = (int64_t) pg * a.p_s3 + (int64_t) (p % a.P) * a.p_s2 + (int64_t) g * a.p_s1;
    float kv[GMAX], vv[GMAX], dk[GMAX], dv[GMAX];
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        kv[i] = d < a.D ? gload<KT>(a.kp, off, a.p_s0, d) : 0.0f;
        vv[i] = d < a.D ? gload<KT>(a.vp, off, a.p_s0, d) : 0.0f;
        dk[i] = dv[i] = 0.0f;
    }
    for (int t = 0; t < a.T; t++) {
        if (a.pos[t] < p) continue;
        if (a.sched.kind && !oomb::pa_sched_attends_inv(a.sched, c0, oomb::pa_qtile(a.pos[t], c0, a.P), lp)) continue;
        for (int h = g * a.G; h < (g + 1) * a.G; h++) {
            const int64_t r = (int64_t) t * a.H + h;
            const float * qr = a.q + t * a.q_s2 + h * a.q_s1;
            const float * dr = a.dout + t * a.do_s2 + h * a.do_s1;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < GMAX; i++) {
                const int d = lane + 32 * i;
                if (d < a.D) { s += qr[d] * kv[i]; dp += dr[d] * vv[i]; }
            }
            s = warp_sum(s);
            dp = warp_sum(dp);
            const float pr = expf(s * a.scale - a.lse[r]);
            const float ds = pr * (dp - a.delta[r]) * a.scale;
#pragma unroll
            for (int i = 0; i < GMAX; i++) {
                const int d = lane + 32 * i;
                if (d < a.D) { dv[i] += pr * dr[d]; dk[i] += ds * qr[d]; }
            }
        }
    }
    const int64_t goff = (int64_t) pg * a.gr_s3 + (int64_t) (p % a.P) * a.gr_s2 + (int64_t) g * a.gr_s1;
    if (a.gsr.bf16) {
        const uint32_t sk = oomb::sr_kv_salt(a.gsr.seed_k, a.pos[0]), sv = oomb::sr_kv_salt(a.gsr.seed_v, a.pos[0]);
#pragma unroll
        for (int i = 0; i < GMAX; i++) {
            const int d = lane + 32 * i;
            if (d < a.D) grad_add_bf16(a.gsr, a.dkp, a.dvp, goff + d, p, g, d, a.D, dk[i], dv[i], sk, sv);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < GMAX; i++) {
        const int d = lane + 32 * i;
        if (d < a.D) { a.dkp[goff + d] += dk[i]; a.dvp[goff + d] += dv[i]; }
    }
}

__global__ void pa_maxpos_kernel(const int32_t * pos, int T, int * maxpos) {
    __shared__ int smax;
    if (threadIdx.x == 0) smax = -1;
    __syncthreads();
    int mx = -1;
    for (int t = threadIdx.x; t < T; t += blockDim.x) mx = max(mx, pos[t]);
    atomicMax(&smax, mx);
    __syncthreads();
    if (threadIdx.x == 0) *maxpos = smax;
}
} // namespace
