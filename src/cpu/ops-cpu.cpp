// CPU backend: the op dispatcher (compute_forward), scratch memory and OpenBLAS's thread count.
// The kernels, one compute_forward_<op> per op of enum oomb_op (except CUSTOM), are in the
// ops-*.cpp files of this folder by op family (conventions: ops-common.h); the paged-attention
// kernels are in paged-attn.cpp.

#include "ops-common.h"
#include "cpu/paged-attn.h"
#include "oomb/sparse-impl.h"

#include <cblas.h>

extern "C" void openblas_set_num_threads(int num_threads);

namespace oomb {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Scratch memory
// ---------------------------------------------------------------------------------------------

scratch_buf::~scratch_buf() { free(p); }

void * scratch_buf::get(size_t bytes) {
    if (bytes <= cap && p) return p;
    free(p);
    size_t sz = (std::max<size_t>(bytes, 64) + 63) & ~(size_t) 63;
    sz += sz / 4; // some headroom for slowly growing requests
    sz = (sz + 63) & ~(size_t) 63;
    p = aligned_alloc(64, sz);
    if (!p) {
        cap = 0;
        oomb_error("cpu backend: out of memory allocating %zu bytes of scratch", sz);
    }
    cap = sz;
    return p;
}

void exec_ctx::reserve_thread_scratch(size_t bytes) {
    if (tscratch.size() < (size_t) n_threads) tscratch.resize((size_t) n_threads);
    for (auto & s : tscratch) s.get(bytes);
}
static int g_blas_threads = -1;

void set_blas_threads(int n) {
    if (g_blas_threads != n) {
        openblas_set_num_threads(n);
        g_blas_threads = n;
    }
}

void compute_forward(exec_ctx & c, oomb_tensor * node) {
    const enum oomb_op op = node->op;
    switch (op) {
        case OOMB_OP_NONE: case OOMB_OP_VIEW: case OOMB_OP_RESHAPE: case OOMB_OP_PERMUTE: case OOMB_OP_TRANSPOSE:
            return;
        case OOMB_OP_CUSTOM: case OOMB_OP_COUNT:
            oomb_error("graph_compute: node %s: op %s is not supported by the CPU backend", shape_str(node).c_str(), oomb_op_name(op));
        case OOMB_OP_PAGED_ATTN: // kernels in paged-attn.cpp (they read node->src themselves; the forward may write the pools)
            oomb::cpu_paged_attn(node, c.pool);
            return;
        case OOMB_OP_PAGED_ATTN_BACK:
            oomb::cpu_paged_attn_back(node, c.pool);
            return;
        case OOMB_OP_PAGE_SUMMARY: // sparse attention (src/oomb/sparse.cpp): read node->src themselves
            oomb::cpu_page_summary(node, c.pool);
            return;
        case OOMB_OP_PAGE_SELECT:
            oomb::cpu_page_select(node, c.pool);
            return;
        default:
            break;
    }
    // result layout, sources prepared (in-place safety, unit-stride rows where needed), checked
    oomb_tensor srcs[OOMB_MAX_SRC];
    const oomb_tensor * s[OOMB_MAX_SRC] = {nullptr};
    oomb::prepare_sources(node, srcs, s, [&](const oomb_tensor * t, int slot, oomb_tensor * r) {
        r->data = c.slot(slot, oomb_nbytes(r));
        copy_tensor(c, t, r);
    });
    const char * opn = oomb_op_name(op);

    switch (op) {
        case OOMB_OP_CONT: case OOMB_OP_CPY: case OOMB_OP_CAST:  // src[0] -> dst in logical order (converting for cpy / cast)
                                    copy_tensor(c, s[0], node); break;
        case OOMB_OP_FILL:          compute_forward_fill(c, node); break;
        case OOMB_OP_ADD:           compute_forward_add(c, node, s[0], s[1]); break;
        case OOMB_OP_SUB:           compute_forward_sub(c, node, s[0], s[1]); break;
        case OOMB_OP_MUL:           compute_forward_mul(c, node, s[0], s[1]); break;
        case OOMB_OP_SCALE:         compute_forward_scale(c, node, s[0]); break;
        case OOMB_OP_ADD_INPLACE:   compute_forward_add_inplace(c, node, s[0], s[1]); break;
        case OOMB_OP_REPEAT:        compute_forward_repeat(c, node, s[0]); break;
        case OOMB_OP_REPEAT_BACK:   compute_forward_repeat_back(c, node, s[0]); break;
        case OOMB_OP_SILU:          compute_forward_silu(c, node, s[0]); break;
        case OOMB_OP_SILU_BACK:     compute_forward_silu_back(c, node, s[0], s[1]); break;
        case OOMB_OP_SWIGLU:        compute_forward_swiglu(c, node, s[0], s[1]); break;
        case OOMB_OP_SWIGLU_BACK:   compute_forward_swiglu_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_SUM: case OOMB_OP_MEAN: case OOMB_OP_SUM_SQ:
                                    compute_forward_sum(c, node, s); break;
        case OOMB_OP_GET_ROWS:      compute_forward_get_rows(c, node, s[0], s[1]); break;
        case OOMB_OP_GET_ROWS_BACK: compute_forward_get_rows_back(c, node, s[0], s[1]); break;
        case OOMB_OP_MUL_MAT:       compute_forward_mul_mat(c, node, s[0], s[1]); break;
        case OOMB_OP_RMS_NORM:      compute_forward_rms_norm(c, node, s[0]); break;
        case OOMB_OP_RMS_NORM_BACK: compute_forward_rms_norm_back(c, node, s[0], s[1]); break;
        case OOMB_OP_RMS_NORM_MUL:  compute_forward_rms_norm_mul(c, node, s[0], s[1]); break;
        case OOMB_OP_RMS_NORM_MUL_BACK: compute_forward_rms_norm_mul_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_ROPE: case OOMB_OP_ROPE_BACK:
                                    compute_forward_rope(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_SOFT_MAX:      compute_forward_soft_max(c, node, s[0]); break;
        case OOMB_OP_SOFT_MAX_BACK: compute_forward_soft_max_back(c, node, s[0], s[1]); break;
        case OOMB_OP_ATTN:          compute_forward_attn(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_ATTN_BACK:     compute_forward_attn_back(c, node, s[0], s[1], s[2], s[3]); break;
        case OOMB_OP_CROSS_ENTROPY: compute_forward_cross_entropy(c, node, s[0], s[1]); break;
        case OOMB_OP_CROSS_ENTROPY_BACK:
                                    compute_forward_cross_entropy_back(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_LINEAR_CROSS_ENTROPY:
                                    compute_forward_linear_cross_entropy(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_LINEAR_CROSS_ENTROPY_BACK:
                                    compute_forward_linear_cross_entropy_back(c, node, s[0], s[1], s[2], s[3], s[4]); break;
        case OOMB_OP_ADAMW_STEP:    compute_forward_adamw_step(c, node, s[0], s[1], s[2], s[3], s[4]); break;
        case OOMB_OP_SGD_STEP:      compute_forward_sgd_step(c, node, s[0], s[1], s[2]); break;
        case OOMB_OP_PAGED_ATTN_MERGE:
                                    compute_forward_paged_attn_merge(c, node, s[0], s[1]); break;
        default:
            oomb_error("graph_compute: node %s: op %s is not supported by the CPU backend", shape_str(node).c_str(), opn);
    }
}

} // namespace cpu
} // namespace oomb
