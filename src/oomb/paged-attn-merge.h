// The one definition of the log-sum-exp merge of two partial paged-attention results
// (oomb_paged_attn_merge, oomb.h), shared by the op constructor (oomb.cpp), the CPU kernel
// (cpu/paged-attn.cpp) and the CUDA kernel (cuda/paged-attn-merge.cu): host and device, in f32.
// Per row: m = max(La, Lp), ea = exp(La - m), ep = exp(Lp - m), s = ea + ep; L = m + log s,
// out = (ea / s) * out_a + (ep / s) * out_p. A side with L = -inf gets weight 0 and contributes
// nothing (not 0 * its out, so an -inf side's out is never read into the result); both -inf:
// out 0, L -inf. Source: FlashAttention-2's / flash-decoding's split-K combine (Dao 2023).
#pragma once

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PAM_HD __host__ __device__ __forceinline__
#else
#define PAM_HD inline
#endif

namespace oomb {

// op_params of OOMB_OP_PAGED_ATTN_MERGE: head dim D, query heads H, rows T (the packed layout of
// oomb_paged_attn: out element (t*H + h)*D + d, then the LSE of row t*H + h at D*H*T + t*H + h).
enum { PAM_PARAM_D = 0, PAM_PARAM_H, PAM_PARAM_T };

struct pa_merge_w {
    float wa, wp; // weights of out_a and out_p (0: that side is not read)
    float L;      // merged log-sum-exp
};

PAM_HD pa_merge_w pa_merge_weights(float La, float Lp) {
    const float ninf = -INFINITY;
    if (La == ninf && Lp == ninf) return {0.0f, 0.0f, ninf};
    if (Lp == ninf) return {1.0f, 0.0f, La};
    if (La == ninf) return {0.0f, 1.0f, Lp};
    const float m = La > Lp ? La : Lp;
    const float ea = expf(La - m), ep = expf(Lp - m), s = ea + ep;
    return {ea / s, ep / s, m + logf(s)};
}

PAM_HD float pa_merge_out(const pa_merge_w & w, float a, float p) {
    return (w.wa != 0.0f ? w.wa * a : 0.0f) + (w.wp != 0.0f ? w.wp * p : 0.0f);
}

} // namespace oomb
