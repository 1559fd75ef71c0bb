// Optimizer steps on the CUDA backend (in place on the parameter; f32 or bf16 parameters, f32
// gradients and moments; hyper-parameters read from the device tensor hp).
#pragma once

#include "common.cuh"

void oomb_cuda_adamw_step(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * m,
                          const oomb_tensor * v, const oomb_tensor * hp);
void oomb_cuda_sgd_step(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * p, const oomb_tensor * grad, const oomb_tensor * hp);
