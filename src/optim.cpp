// Optimizers (AdamW, SGD) with global-norm gradient clipping, built on the graph API:
// one graph for the squared gradient norm, one for the update; hyper-parameters in input tensors.

#include "oomb-impl.h"
#include "oomb-alloc.h"
#include "oomb-opt.h"

#include <cmath>
#include <cstdlib>
#include <vector>

struct oomb_optimizer {
    oomb_backend_t backend = nullptr;
    oomb_opt_params p{};
    std::vector<oomb_tensor *> params;
    std::vector<oomb_tensor *> state;    // m0, v0, m1, v1, ... (AdamW)
    oomb_context * ctx = nullptr;        // state, hyper-parameters, graphs
    oomb_buffer_t  buf = nullptr;        // memory of state + hyper-parameter tensors
    oomb_tensor * hp_decay = nullptr;    // hyper-parameters for params with weight decay
    oomb_tensor * hp_nodecay = nullptr;  // ... and without
    oomb_tensor * norm_sq = nullptr;     // output of the norm graph
    oomb_cgraph * g_norm = nullptr;
    oomb_cgraph * g_step = nullptr;
    oomb_gallocr_t galloc_norm = nullptr;
    oomb_gallocr_t galloc_step = nullptr;
    int64_t n_steps = 0;
};

struct oomb_opt_params oomb_opt_default_params(enum oomb_opt_type type) {
    oomb_opt_params p;
    p.type = type;
    p.lr = 1e-3f;
    p.beta1 = 0.9f;
    p.beta2 = 0.999f;
    p.eps = 1e-8f;
    p.weight_decay = type == OOMB_OPT_ADAMW ? 0.01f : 0.0f;
    p.state_type = OOMB_TYPE_F32;
    return p;
}

oomb_optimizer_t oomb_opt_init(oomb_backend_t backend, struct oomb_tensor ** params, int n_params, const bool * decay,
                               struct oomb_opt_params p) {
    if (!backend) oomb_error("opt_init: backend is NULL");
    if (!params || n_params <= 0) oomb_error("opt_init: no parameters (params %p, n_params %d)", (void *) params, n_params);
    if (p.type != OOMB_OPT_ADAMW && p.type != OOMB_OPT_SGD) oomb_error("opt_init: unknown optimizer type %d", (int) p.type);
    if (p.type == OOMB_OPT_ADAMW && p.state_type != OOMB_TYPE_F32 && p.state_type != OOMB_TYPE_BF16)
        oomb_error("opt_init: AdamW state type must be f32 or bf16, got %s", oomb_type_name(p.state_type));
    auto * opt = new oomb_optimizer();
    opt->backend = backend;
    opt->p = p;
    opt->ctx = oomb_init({0, true});
    const int n_hp = p.type == OOMB_OPT_ADAMW ? 9 : 3;  // AdamW: hp[8] = step (stochastic-rounding seed)
    opt->hp_decay = oomb_set_name(oomb_new_tensor_1d(opt->ctx, OOMB_TYPE_F32, n_hp), "opt.hp_decay");
    opt->hp_nodecay = oomb_set_name(oomb_new_tensor_1d(opt->ctx, OOMB_TYPE_F32, n_hp), "opt.hp_nodecay");
    oomb_set_input(opt->hp_decay);
    oomb_set_input(opt->hp_nodecay);
    for (int i = 0; i < n_params; i++) {
        oomb_tensor * w = params[i];
        if (!w) oomb_error("opt_init: parameter %d is NULL", i);
        if (!w->grad) oomb_error("opt_init: parameter '%s' has no gradient tensor (oomb_new_grad)", w->name);
        if (!w->data || !w->grad->data) oomb_error("opt_init: parameter '%s' or its gradient has no data", w->name);
        if (w->type != OOMB_TYPE_F32 && w->type != OOMB_TYPE_BF16)
            oomb_error("opt_init: parameter '%s' has type %s; only f32 and bf16 are supported", w->name, oomb_type_name(w->type));
        if (!oomb_is_contiguous(w)) oomb_error("opt_init: parameter '%s' is not contiguous", w->name);
        opt->params.push_back(w);
        if (p.type == OOMB_OPT_ADAMW) {
            oomb_tensor * m = oomb_new_tensor(opt->ctx, p.state_type, 4, w->ne);
            oomb_tensor * v = oomb_new_tensor(opt->ctx, p.state_type, 4, w->ne);
            oomb_format_name(m, "%.52s.adam_m", w->name);
            oomb_format_name(v, "%.52s.adam_v", w->name);
            opt->state.push_back(m);
            opt->state.push_back(v);
        }
    }
    opt->buf = oomb_backend_alloc_ctx_tensors(opt->ctx, backend); // zero-filled

    // norm graph: sum over params of sum(grad^2), OOMB_MAX_SRC gradients per node (a few launches, not
    // three per parameter: hundreds of LoRA adapters)
    // (OOMB_OPT_NORM_GROUP=k: k per node, 1 the old graph, for comparisons)
    opt->g_norm = oomb_new_graph(opt->ctx);
    oomb_tensor * acc = nullptr;
    int group = OOMB_MAX_SRC;
    if (const char * e = getenv("OOMB_OPT_NORM_GROUP")) {
        group = atoi(e);
        if (group < 1 || group > OOMB_MAX_SRC) oomb_error("OOMB_OPT_NORM_GROUP=%s: must be 1 to %d", e, OOMB_MAX_SRC);
    }
    for (size_t i = 0; i < opt->params.size(); i += (size_t) group) {
        oomb_tensor * grads[OOMB_MAX_SRC];
        int n = 0;
        for (size_t j = i; j < opt->params.size() && n < group; j++) grads[n++] = opt->params[j]->grad;
        oomb_tensor * s = oomb_sum_sq_n(opt->ctx, grads, n);
        acc = acc ? oomb_add(opt->ctx, acc, s) : s;
    }
    opt->norm_sq = acc;
    oomb_set_output(acc);
    oomb_build_forward_expand(opt->g_norm, acc);

    // step graph
    opt->g_step = oomb_new_graph(opt->ctx);
    for (size_t i = 0; i < opt->params.size(); i++) {
        oomb_tensor * w = opt->params[i];
        oomb_tensor * hp = (decay && !decay[i]) ? opt->hp_nodecay : opt->hp_decay;
        oomb_tensor * r = p.type == OOMB_OPT_ADAMW
                              ? oomb_adamw_step(opt->ctx, w, w->grad, opt->state[2 * i], opt->state[2 * i + 1], hp)
                              : oomb_sgd_step(opt->ctx, w, w->grad, hp);
        oomb_build_forward_expand(opt->g_step, r);
    }
    opt->galloc_norm = oomb_gallocr_new(backend);
    opt->galloc_step = oomb_gallocr_new(backend);
    if (!oomb_gallocr_alloc_graph(opt->galloc_norm, opt->g_norm) || !oomb_gallocr_alloc_graph(opt->galloc_step, opt->g_step)) {
        oomb_error("opt_init: could not allocate the optimizer graphs");
    }
    return opt;
}

void oomb_opt_free(oomb_optimizer_t opt) {
    if (!opt) return;
    oomb_gallocr_free(opt->galloc_norm);
    oomb_gallocr_free(opt->galloc_step);
    oomb_buffer_free(opt->buf);
    oomb_free(opt->ctx);
    delete opt;
}

float oomb_opt_grad_norm(oomb_optimizer_t opt) {
    oomb_gallocr_alloc_graph(opt->galloc_norm, opt->g_norm);
    if (oomb_backend_graph_compute(opt->backend, opt->g_norm) != OOMB_STATUS_OK) {
        oomb_error("opt: %s", oomb_backend_last_error(opt->backend));  // the optimizer API has no status
    }
    float s = 0.0f;
    oomb_tensor_get(opt->norm_sq, &s, 0, sizeof(float));
    return std::sqrt(s);
}

float oomb_opt_step(oomb_optimizer_t opt, float lr, float grad_scale, float max_grad_norm) {
    const float norm = oomb_opt_grad_norm(opt) * std::fabs(grad_scale);
    if (!std::isfinite(norm)) return norm;
    float scale = grad_scale;
    if (max_grad_norm > 0.0f && norm > max_grad_norm) scale *= max_grad_norm / norm;
    if (lr < 0.0f) lr = opt->p.lr;
    opt->n_steps++;
    const oomb_opt_params & p = opt->p;
    if (p.type == OOMB_OPT_ADAMW) {
        const double t = (double) opt->n_steps;
        float hp[9] = {lr, p.beta1, p.beta2, p.eps, p.weight_decay, scale,
                       (float) (1.0 - std::pow((double) p.beta1, t)), (float) (1.0 - std::pow((double) p.beta2, t)),
                       (float) (opt->n_steps & 0xffffff)};
        oomb_tensor_set(opt->hp_decay, hp, 0, sizeof(hp));
        hp[4] = 0.0f;
        oomb_tensor_set(opt->hp_nodecay, hp, 0, sizeof(hp));
    } else {
        float hp[3] = {lr, p.weight_decay, scale};
        oomb_tensor_set(opt->hp_decay, hp, 0, sizeof(hp));
        hp[1] = 0.0f;
        oomb_tensor_set(opt->hp_nodecay, hp, 0, sizeof(hp));
    }
    oomb_gallocr_alloc_graph(opt->galloc_step, opt->g_step);
    if (oomb_backend_graph_compute(opt->backend, opt->g_step) != OOMB_STATUS_OK) {
        oomb_error("opt: %s", oomb_backend_last_error(opt->backend));  // the optimizer API has no status
    }
    return norm;
}

void oomb_opt_zero_grads(oomb_optimizer_t opt) {
    for (oomb_tensor * w : opt->params) oomb_tensor_memset(w->grad, 0);
}
int64_t oomb_opt_n_steps(oomb_optimizer_t opt) { return opt->n_steps; }
void oomb_opt_set_n_steps(oomb_optimizer_t opt, int64_t n) { opt->n_steps = n; }
int oomb_opt_n_state(oomb_optimizer_t opt) { return (int) opt->state.size(); }
struct oomb_tensor * oomb_opt_state(oomb_optimizer_t opt, int i) {
    if (i < 0 || i >= (int) opt->state.size()) oomb_error("opt_state: index %d out of range (%zu)", i, opt->state.size());
    return opt->state[i];
}
