// CPU kernels: the in-place AdamW and SGD steps (conventions: ops-common.h).

#include "ops-common.h"
#include "sround.h"

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Optimizers
// ---------------------------------------------------------------------------------------------

// adamw_step (in place): g = grad*gs; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// param -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * param).
void compute_forward_adamw_step(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad,
                                const oomb_tensor * m, const oomb_tensor * v, const oomb_tensor * hp) {
    // operands: check_op_operands (op-checks.cpp)
    const bool sbf = m->type == OOMB_TYPE_BF16;  // bf16 moments (stochastic rounding, sround.h; hp[8] is the step)
    float h[8];
    for (int i = 0; i < 8; i++) h[i] = flat_f32(hp, i);
    const float lr = h[0], b1 = h[1], b2 = h[2], eps = h[3], wd = h[4], gs = h[5], bc1 = h[6], bc2 = h[7];
    const bool bf = p->type == OOMB_TYPE_BF16;
    float * gp = (float *) grad->data;
    float * mp = (float *) m->data;
    float * vp = (float *) v->data;
    uint16_t * mh = (uint16_t *) m->data;
    uint16_t * vh = (uint16_t *) v->data;
    const uint32_t salt = sbf ? sr_salt(flat_f32(hp, 8)) : 0u;
    const int64_t n = oomb_nelements(p);
    const int64_t block = 4096;
    const float * ps = (const float *) p->data;
    const uint16_t * ph = (const uint16_t *) p->data;
    float * pd = (float *) dst->data;
    uint16_t * pdh = (uint16_t *) dst->data;
    parallel_for(c, (n + block - 1) / block, block, [&](int64_t blk0, int64_t blk1, int) {
        // locals: captured floats would be reloaded after every float store
        const float lr_ = lr, b1_ = b1, b2_ = b2, eps_ = eps, wd_ = wd, gs_ = gs, bc1_ = bc1, bc2_ = bc2;
        const int64_t i0 = blk0 * block, i1 = std::min(n, blk1 * block);
        auto upd = [&](int64_t i, float w) {
            const float g = gp[i] * gs_;
            float mi, vi;
            if (sbf) {
                mi = b1_ * bf16_to_fp32(mh[i]) + (1.0f - b1_) * g;
                vi = b2_ * bf16_to_fp32(vh[i]) + (1.0f - b2_) * g * g;
                mh[i] = sr_bf16_bits(f32_bits(mi), (uint32_t) i, salt);
                vh[i] = sr_bf16_bits(f32_bits(vi), (uint32_t) i, salt ^ 0x5bd1e995u);
            } else {
                mi = b1_ * mp[i] + (1.0f - b1_) * g;
                vi = b2_ * vp[i] + (1.0f - b2_) * g * g;
                mp[i] = mi;
                vp[i] = vi;
            }
            return w - lr_ * ((mi / bc1_) / (std::sqrt(vi / bc2_) + eps_) + wd_ * w);
        };
        if (bf) for (int64_t i = i0; i < i1; i++) pdh[i] = fp32_to_bf16(upd(i, bf16_to_fp32(ph[i])));
        else    for (int64_t i = i0; i < i1; i++) pd[i] = upd(i, ps[i]);
    });
}

// sgd_step (in place): param -= lr * (grad * gs + wd * param).
void compute_forward_sgd_step(exec_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * hp) {
    // operands: check_op_operands (op-checks.cpp)
    const float lr = flat_f32(hp, 0), wd = flat_f32(hp, 1), gs = flat_f32(hp, 2);
    const bool bf = p->type == OOMB_TYPE_BF16;
    const float * gp = (const float *) grad->data;
    const int64_t n = oomb_nelements(p);
    const int64_t block = 4096;
    const float * ps = (const float *) p->data;
    const uint16_t * ph = (const uint16_t *) p->data;
    float * pd = (float *) dst->data;
    uint16_t * pdh = (uint16_t *) dst->data;
    parallel_for(c, (n + block - 1) / block, block, [&](int64_t blk0, int64_t blk1, int) {
        const float lr_ = lr, wd_ = wd, gs_ = gs;
        const int64_t i0 = blk0 * block, i1 = std::min(n, blk1 * block);
        if (bf) for (int64_t i = i0; i < i1; i++) { const float w = bf16_to_fp32(ph[i]); pdh[i] = fp32_to_bf16(w - lr_ * (gp[i] * gs_ + wd_ * w)); }
        else    for (int64_t i = i0; i < i1; i++) { const float w = ps[i]; pd[i] = w - lr_ * (gp[i] * gs_ + wd_ * w); }
    });
}

} // namespace cpu
} // namespace oomb
