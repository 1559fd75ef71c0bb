// Rotary position embedding (NEOX layout) on the CUDA backend: rope and rope_back (the rotation by
// the opposite angle). Angles pos * theta^(-2i/n_dims) (divided by the node's frequency factors, src[2],
// where it has them) and their sine / cosine are computed in double.
#pragma once

#include "common.cuh"

void oomb_cuda_rope(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * a, const oomb_tensor * pos, const oomb_tensor * ff);
