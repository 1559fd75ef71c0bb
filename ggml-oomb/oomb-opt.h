// ggml-oomb optimizers: AdamW and SGD over a set of parameters, with gradient clipping by global norm.
//
// An optimizer keeps its state (AdamW moments, f32) in a buffer of the backend that holds the
// parameters, and two small graphs it builds once: the squared gradient norm and the update step.
// Hyper-parameters live in an input tensor, so changing the learning rate never rebuilds a graph.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oomb_optimizer * oomb_optimizer_t;

enum oomb_opt_type { OOMB_OPT_ADAMW = 0, OOMB_OPT_SGD = 1 };

struct oomb_opt_params {
    enum oomb_opt_type type;
    float lr;            // learning rate (oomb_opt_step can override it per step)
    float beta1, beta2;  // AdamW moment decay rates (default 0.9, 0.999)
    float eps;           // AdamW epsilon (default 1e-8)
    float weight_decay;  // decoupled weight decay (AdamW, Loshchilov & Hutter 2019); L2 for SGD
    enum oomb_type state_type; // AdamW moments: OOMB_TYPE_F32 (default) or OOMB_TYPE_BF16 (half the
                               // memory, e.g. 28 GiB instead of 57 for Qwen2.5-7B; stochastic rounding)
};

/// Defaults: AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, f32 state.
struct oomb_opt_params oomb_opt_default_params(enum oomb_opt_type type);

/// Creates an optimizer for params[0..n_params) (each flagged PARAM, with ->grad set, data in
/// `backend`'s memory). decay[i] false exempts parameter i from weight decay (NULL: all decay).
/// Errors: a parameter without gradient, non-contiguous or of an unsupported type; a state type other
/// than f32 / bf16.
oomb_optimizer_t oomb_opt_init(oomb_backend_t backend, struct oomb_tensor ** params, int n_params,
                               const bool * decay, struct oomb_opt_params p);
void oomb_opt_free(oomb_optimizer_t opt);

/// Global L2 norm of all gradients: sqrt(sum over params of sum(grad^2)).
float oomb_opt_grad_norm(oomb_optimizer_t opt);
/// One update with learning rate lr (< 0: the init value). Gradients are first multiplied by
/// grad_scale (e.g. 1/number of accumulated targets), then, when max_grad_norm > 0 and the scaled
/// global norm exceeds it, scaled down to that norm. Returns the scaled norm before clipping, or
/// NaN/inf without updating anything when the gradients are not finite (the caller decides).
float oomb_opt_step(oomb_optimizer_t opt, float lr, float grad_scale, float max_grad_norm);
/// Sets every gradient to zero.
void oomb_opt_zero_grads(oomb_optimizer_t opt);
/// Number of steps taken (drives AdamW's bias correction); settable for resuming.
int64_t oomb_opt_n_steps(oomb_optimizer_t opt);
void oomb_opt_set_n_steps(oomb_optimizer_t opt, int64_t n);

/// State tensors (AdamW: m and v of each parameter, of type p.state_type, named "<param>.adam_m" /
/// ".adam_v"; SGD: none),
/// for checkpoints: read and write them with oomb_tensor_get / oomb_tensor_set.
int oomb_opt_n_state(oomb_optimizer_t opt);
struct oomb_tensor * oomb_opt_state(oomb_optimizer_t opt, int i);

#ifdef __cplusplus
}
#endif
