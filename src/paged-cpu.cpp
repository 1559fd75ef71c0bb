// CPU reference kernels for attention over a paged KV cache.
//
// Forward: for each (query t, head h), an online softmax (Milakov & Gimelshein 2018; as in
// FlashAttention) over positions 0..pos[t], reading K/V through the page table one page at a
// time: O(D) scratch per worker, whatever the history length.
// Backward (FlashAttention-2 style, recomputing the softmax): pass 1 recomputes each row's
// log-sum-exp and delta = dout . out; pass 2 computes dq per (t, h); pass 3 gives each worker a
// range of key positions and accumulates dK/dV for them over every query and head of the group,
// so the gradient pages are written without races.

#include "paged-cpu.h"
#include "oomb-impl.h"
#include "fp16.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

namespace oomb {

namespace {

void parallel_for(int64_t n, int n_threads, const std::function<void(int64_t, int64_t)> & fn) {
    n_threads = (int) std::max<int64_t>(1, std::min<int64_t>(n_threads, n));
    if (n_threads == 1) { fn(0, n); return; }
    std::vector<std::thread> th;
    const int64_t per = (n + n_threads - 1) / n_threads;
    for (int i = 0; i < n_threads; i++) {
        const int64_t b = i * per, e = std::min(n, b + per);
        if (b >= e) break;
        th.emplace_back(fn, b, e);
    }
    for (auto & x : th) x.join();
}

inline float load(const void * p, oomb_type type) {
    switch (type) {
        case OOMB_TYPE_F32: return *(const float *) p;
        case OOMB_TYPE_F16: return fp16_to_fp32(*(const uint16_t *) p);
        default: return bf16_to_fp32(*(const uint16_t *) p);
    }
}
inline void store(void * p, oomb_type type, float v) {
    switch (type) {
        case OOMB_TYPE_F32: *(float *) p = v; break;
        case OOMB_TYPE_F16: *(uint16_t *) p = fp32_to_fp16(v); break;
        default: *(uint16_t *) p = fp32_to_bf16(v); break;
    }
}

// Geometry shared by the kernels.
struct PagedGeom {
    int64_t D, H, Hkv, T, P, n_pages, n_logical, group;
    const int32_t * page_table;
    const int32_t * pos;
    size_t nb_head, nb_slot, nb_page; // strides of the pools (bytes)

    PagedGeom(const oomb_tensor * q, const oomb_tensor * pages, const oomb_tensor * pt, const oomb_tensor * ps) {
        D = q->ne[0]; H = q->ne[1]; T = q->ne[2];
        Hkv = pages->ne[1]; P = pages->ne[2]; n_pages = pages->ne[3];
        group = H / Hkv;
        n_logical = oomb_nelements(pt);
        page_table = (const int32_t *) pt->data;
        pos = (const int32_t *) ps->data;
        nb_head = pages->nb[1]; nb_slot = pages->nb[2]; nb_page = pages->nb[3];
    }
    // Byte offset of (position p, kv head g) in a pool; validated.
    size_t offset(int64_t p, int64_t g, const char * op) const {
        const int64_t lp = p / P;
        if (p < 0 || lp >= n_logical) oomb_error("%s: position %" PRId64 " is outside the page table (%" PRId64 " pages of %" PRId64 ")", op, p, n_logical, P);
        const int32_t pp = page_table[lp];
        if (pp < 0 || pp >= n_pages) oomb_error("%s: logical page %" PRId64 " maps to page %d, pool has %" PRId64 " pages (not reserved?)", op, lp, pp, n_pages);
        return (size_t) pp * nb_page + (size_t) (p % P) * nb_slot + (size_t) g * nb_head;
    }
};

inline const float * qrow(const oomb_tensor * q, int64_t t, int64_t h) {
    return (const float *) ((const char *) q->data + t * q->nb[2] + h * q->nb[1]);
}

void check_pos(const PagedGeom & G, const char * op) {
    for (int64_t t = 0; t < G.T; t++) {
        if (G.pos[t] < 0) oomb_error("%s: negative position %d at token %" PRId64, op, G.pos[t], t);
        for (int64_t lp = 0; lp <= G.pos[t] / G.P; lp++) G.offset(lp * G.P, 0, op);
    }
}

} // namespace

void cpu_paged_attn(oomb_tensor * dst, int n_threads) {
    const oomb_tensor * q = dst->src[0];
    const oomb_tensor * k_cur = dst->src[1];
    const oomb_tensor * v_cur = dst->src[2];
    oomb_tensor * kp = dst->src[3];
    oomb_tensor * vp = dst->src[4];
    const float scale = get_op_f32(dst, 0);
    const int store_kv = dst->op_params[1];
    PagedGeom G(q, kp, dst->src[5], dst->src[6]);
    if (q->nb[0] != sizeof(float)) oomb_error("paged_attn: q must have unit stride in dim 0");
    check_pos(G, "paged_attn");

    if (store_kv) {
        for (int64_t t = 0; t < G.T; t++)
            for (int64_t g = 0; g < G.Hkv; g++) {
                const size_t off = G.offset(G.pos[t], g, "paged_attn");
                for (int64_t d = 0; d < G.D; d++) {
                    store((char *) kp->data + off + d * kp->nb[0], kp->type, *(const float *) elem_ptr(k_cur, d, g, t, 0));
                    store((char *) vp->data + off + d * vp->nb[0], vp->type, *(const float *) elem_ptr(v_cur, d, g, t, 0));
                }
            }
    }

    const int64_t D = G.D;
    parallel_for(G.T * G.H, n_threads, [&](int64_t b, int64_t e) {
        std::vector<float> acc(D), kbuf(D), vbuf(D);
        for (int64_t r = b; r < e; r++) {
            const int64_t t = r / G.H, h = r % G.H, g = h / G.group;
            const float * qv = qrow(q, t, h);
            float m = -INFINITY, l = 0.0f;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t p = 0; p <= G.pos[t]; p++) {
                const size_t off = G.offset(p, g, "paged_attn");
                const char * kr = (const char *) kp->data + off;
                const char * vr = (const char *) vp->data + off;
                float s = 0.0f;
                if (kp->type == OOMB_TYPE_F32) {
                    const float * kf = (const float *) kr;
                    for (int64_t d = 0; d < D; d++) s += qv[d] * kf[d];
                } else {
                    for (int64_t d = 0; d < D; d++) kbuf[d] = load(kr + d * kp->nb[0], kp->type);
                    for (int64_t d = 0; d < D; d++) s += qv[d] * kbuf[d];
                }
                s *= scale;
                const float * vf;
                if (vp->type == OOMB_TYPE_F32) vf = (const float *) vr;
                else { for (int64_t d = 0; d < D; d++) vbuf[d] = load(vr + d * vp->nb[0], vp->type); vf = vbuf.data(); }
                if (s > m) {
                    const float c = std::exp(m - s);
                    l *= c;
                    for (int64_t d = 0; d < D; d++) acc[d] *= c;
                    m = s;
                }
                const float w = std::exp(s - m);
                l += w;
                for (int64_t d = 0; d < D; d++) acc[d] += w * vf[d];
            }
            float * out = (float *) elem_ptr(dst, 0, h, t, 0);
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            for (int64_t d = 0; d < D; d++) out[d] = acc[d] * inv;
        }
    });
}

void cpu_paged_attn_back(oomb_tensor * dst, int n_threads) {
    const oomb_tensor * q  = dst->src[0];
    const oomb_tensor * kp = dst->src[1];
    const oomb_tensor * vp = dst->src[2];
    oomb_tensor * dkp = dst->src[3];
    oomb_tensor * dvp = dst->src[4];
    const oomb_tensor * dout = dst->src[7];
    const float scale = get_op_f32(dst, 0);
    PagedGeom G(q, kp, dst->src[5], dst->src[6]);
    if (q->nb[0] != sizeof(float) || dout->nb[0] != sizeof(float)) oomb_error("paged_attn_back: q and dout must have unit stride in dim 0");
    check_pos(G, "paged_attn_back");
    const int64_t D = G.D, H = G.H, T = G.T;

    auto key = [&](const oomb_tensor * pool, size_t off, float * buf) -> const float * {
        if (pool->type == OOMB_TYPE_F32) return (const float *) ((const char *) pool->data + off);
        for (int64_t d = 0; d < D; d++) buf[d] = load((const char *) pool->data + off + d * pool->nb[0], pool->type);
        return buf;
    };
    auto dorow = [&](int64_t t, int64_t h) { return (const float *) elem_ptr(dout, 0, h, t, 0); };

    // pass 1: log-sum-exp and delta = dout . out per (t, h)
    std::vector<float> lse(T * H), delta(T * H);
    parallel_for(T * H, n_threads, [&](int64_t b, int64_t e) {
        std::vector<float> acc(D), kb(D), vb(D);
        for (int64_t r = b; r < e; r++) {
            const int64_t t = r / H, h = r % H, g = h / G.group;
            const float * qv = qrow(q, t, h);
            float m = -INFINITY, l = 0.0f;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t p = 0; p <= G.pos[t]; p++) {
                const size_t off = G.offset(p, g, "paged_attn_back");
                const float * kf = key(kp, off, kb.data());
                const float * vf = key(vp, off, vb.data());
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += qv[d] * kf[d];
                s *= scale;
                if (s > m) { const float c = std::exp(m - s); l *= c; for (int64_t d = 0; d < D; d++) acc[d] *= c; m = s; }
                const float w = std::exp(s - m);
                l += w;
                for (int64_t d = 0; d < D; d++) acc[d] += w * vf[d];
            }
            lse[r] = m + std::log(l);
            const float * dov = dorow(t, h);
            float dl = 0.0f;
            for (int64_t d = 0; d < D; d++) dl += dov[d] * acc[d] / l;
            delta[r] = dl;
        }
    });

    float * dq = (float *) dst->data;  // [D, H, T] contiguous
    // pass 2: dq
    parallel_for(T * H, n_threads, [&](int64_t b, int64_t e) {
        std::vector<float> kb(D), vb(D);
        for (int64_t r = b; r < e; r++) {
            const int64_t t = r / H, h = r % H, g = h / G.group;
            const float * qv = qrow(q, t, h);
            const float * dov = dorow(t, h);
            float * dqv = dq + (t * H + h) * D;
            std::fill(dqv, dqv + D, 0.0f);
            for (int64_t p = 0; p <= G.pos[t]; p++) {
                const size_t off = G.offset(p, g, "paged_attn_back");
                const float * kf = key(kp, off, kb.data());
                const float * vf = key(vp, off, vb.data());
                float s = 0.0f, dp = 0.0f;
                for (int64_t d = 0; d < D; d++) { s += qv[d] * kf[d]; dp += dov[d] * vf[d]; }
                const float pr = std::exp(s * scale - lse[r]);
                const float ds = pr * (dp - delta[r]) * scale;
                for (int64_t d = 0; d < D; d++) dqv[d] += ds * kf[d];
            }
        }
    });

    // pass 3: dK, dV, each worker owning a range of (position, kv head) pairs
    // (offsets are computed in the K/V pools; the f32 gradient pages have the same shape, contiguous,
    // so an element's byte offset there is its K/V offset / element size * 4)
    const size_t kv_es = oomb_type_size(kp->type);
    int64_t max_pos = 0;
    for (int64_t t = 0; t < T; t++) max_pos = std::max<int64_t>(max_pos, G.pos[t]);
    const int64_t n_keys = max_pos + 1;
    parallel_for(n_keys * G.Hkv, n_threads, [&](int64_t b, int64_t e) {
        std::vector<float> kb(D), vb(D), dk(D), dv(D);
        for (int64_t r = b; r < e; r++) {
            const int64_t p = r / G.Hkv, g = r % G.Hkv;
            const size_t off = G.offset(p, g, "paged_attn_back");
            const float * kf = key(kp, off, kb.data());
            const float * vf = key(vp, off, vb.data());
            std::fill(dk.begin(), dk.end(), 0.0f);
            std::fill(dv.begin(), dv.end(), 0.0f);
            bool any = false;
            for (int64_t t = 0; t < T; t++) {
                if (G.pos[t] < p) continue;
                for (int64_t h = g * G.group; h < (g + 1) * G.group; h++) {
                    const int64_t row = t * H + h;
                    const float * qv = qrow(q, t, h);
                    const float * dov = dorow(t, h);
                    float s = 0.0f, dp = 0.0f;
                    for (int64_t d = 0; d < D; d++) { s += qv[d] * kf[d]; dp += dov[d] * vf[d]; }
                    const float pr = std::exp(s * scale - lse[row]);
                    const float ds = pr * (dp - delta[row]) * scale;
                    for (int64_t d = 0; d < D; d++) { dv[d] += pr * dov[d]; dk[d] += ds * qv[d]; }
                    any = true;
                }
            }
            if (!any) continue;
            const size_t goff = off / kv_es * sizeof(float); // same element in the f32 gradient pages
            float * dkr = (float *) ((char *) dkp->data + goff);
            float * dvr = (float *) ((char *) dvp->data + goff);
            for (int64_t d = 0; d < D; d++) { dkr[d] += dk[d]; dvr[d] += dv[d]; }
        }
    });

    // dk_cur, dv_cur: the completed gradients of the chunk's own positions
    float * dkc = dq + D * H * T;
    float * dvc = dkc + D * G.Hkv * T;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < G.Hkv; g++) {
            const size_t off = G.offset(G.pos[t], g, "paged_attn_back");
            const size_t goff = off / kv_es * sizeof(float);
            const float * dkr = (const float *) ((const char *) dkp->data + goff);
            const float * dvr = (const float *) ((const char *) dvp->data + goff);
            std::copy(dkr, dkr + D, dkc + (t * G.Hkv + g) * D);
            std::copy(dvr, dvr + D, dvc + (t * G.Hkv + g) * D);
        }
}

} // namespace oomb
