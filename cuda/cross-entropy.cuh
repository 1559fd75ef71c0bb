// Cross-entropy fused with log-softmax on the CUDA backend: one block per row (log-sum-exp), then a
// fixed-order sum of the per-row losses. Labels out of range are recorded (ctx.d_err) and reported
// at the end of graph_compute.
#pragma once

#include "common.cuh"

// dst = { sum over counted rows of logsumexp(x) - x[label], number of counted rows }.
void oomb_cuda_cross_entropy(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels);
// dst = (softmax(x) - onehot(label)) * dloss[0]; ignored rows are zero.
void oomb_cuda_cross_entropy_back(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * logits, const oomb_tensor * labels,
                                  const oomb_tensor * dloss);
