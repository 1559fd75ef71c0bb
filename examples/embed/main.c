/* Embedding ggml-oomb in an application (plain C, linked against the shared library).
 *
 * Trains a two-layer MLP y = W2 * silu(W1 * x + b1) + b2 to fit y = sin(3 x0) * cos(2 x1)
 * on random points with AdamW, and prints the loss as it falls.
 *
 *   build/bin/oomb-embed-example [steps] [threads]
 */
#include "oomb.h"
#include "oomb-alloc.h"
#include "oomb-backend.h"
#include "oomb-opt.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

enum { N_IN = 2, N_HIDDEN = 64, N_OUT = 1, BATCH = 256 };

static float frand(unsigned * s) {
    *s = *s * 1664525u + 1013904223u;
    return (float) ((*s >> 8) & 0xffffff) / (float) 0x1000000 * 2.0f - 1.0f;
}

/* argument `s` as an integer in [1, max], or 0 when it is not one (atoi would read "1e3" as 1 and
 * "5abc" as 5) */
static int parse_count(const char * s, long max) {
    char * end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 1 || v > max) return 0;
    return (int) v;
}

int main(int argc, char ** argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: %s [steps > 0] [threads > 0]\ntrains a small MLP (y = sin(3a) cos(2b)) with AdamW on the CPU backend of liboomb\n", argv[0]);
        return 0;
    }
    if (argc > 3) {
        fprintf(stderr, "oomb-embed-example: error: unexpected argument '%s'\nusage: %s [steps > 0] [threads > 0]\n", argv[3], argv[0]);
        return 1;
    }
    const int steps   = argc > 1 ? parse_count(argv[1], INT_MAX) : 600;
    /* the CPU backend takes at most OOMB_CPU_MAX_THREADS threads (more would be its fatal error) */
    const int threads = argc > 2 ? parse_count(argv[2], OOMB_CPU_MAX_THREADS) : 2;
    if (steps == 0 || threads == 0) {
        fprintf(stderr, "oomb-embed-example: error: %s '%s' is not a whole number from 1 to %ld\nusage: %s [steps > 0] [threads > 0]\n",
                steps == 0 ? "steps" : "threads", steps == 0 ? argv[1] : argv[2], steps == 0 ? (long) INT_MAX : (long) OOMB_CPU_MAX_THREADS,
                argv[0]);
        return 1;
    }
    oomb_backend_t cpu = oomb_backend_cpu_init(threads);

    /* parameters and inputs: host memory owned by the context */
    struct oomb_init_params pp = {0, false};
    struct oomb_context * ctx_w = oomb_init(pp);
    struct oomb_tensor * w1 = oomb_set_name(oomb_new_tensor_2d(ctx_w, OOMB_TYPE_F32, N_IN, N_HIDDEN), "w1");
    struct oomb_tensor * b1 = oomb_set_name(oomb_new_tensor_1d(ctx_w, OOMB_TYPE_F32, N_HIDDEN), "b1");
    struct oomb_tensor * w2 = oomb_set_name(oomb_new_tensor_2d(ctx_w, OOMB_TYPE_F32, N_HIDDEN, N_OUT), "w2");
    struct oomb_tensor * b2 = oomb_set_name(oomb_new_tensor_1d(ctx_w, OOMB_TYPE_F32, N_OUT), "b2");
    struct oomb_tensor * x  = oomb_set_name(oomb_new_tensor_2d(ctx_w, OOMB_TYPE_F32, N_IN, BATCH), "x");
    struct oomb_tensor * y  = oomb_set_name(oomb_new_tensor_2d(ctx_w, OOMB_TYPE_F32, N_OUT, BATCH), "y");
    struct oomb_tensor * params[4] = {w1, b1, w2, b2};
    unsigned seed = 42;
    for (int i = 0; i < 4; i++) {
        oomb_set_param(params[i]);
        oomb_new_grad(ctx_w, params[i]);
        const float s = i % 2 == 0 ? 1.0f / sqrtf((float) params[i]->ne[0]) : 0.0f;
        for (int64_t j = 0; j < oomb_nelements(params[i]); j++) oomb_set_f32_1d(params[i], j, s * frand(&seed));
    }
    oomb_set_input(x);
    oomb_set_input(y);

    /* the graph: intermediates get memory from the arena allocator */
    struct oomb_init_params cp = {0, true};
    struct oomb_context * ctx = oomb_init(cp);
    struct oomb_tensor * h    = oomb_silu(ctx, oomb_add(ctx, oomb_mul_mat(ctx, w1, x), b1));
    struct oomb_tensor * out  = oomb_add(ctx, oomb_mul_mat(ctx, w2, h), b2);
    struct oomb_tensor * diff = oomb_sub(ctx, out, y);
    struct oomb_tensor * loss = oomb_set_name(oomb_mean(ctx, oomb_mul(ctx, diff, diff)), "loss");
    oomb_set_loss(loss);
    oomb_set_output(loss);
    struct oomb_cgraph * g = oomb_new_graph(ctx);
    oomb_build_forward_expand(g, loss);
    oomb_build_backward_expand(ctx, g, loss, NULL);
    oomb_gallocr_t galloc = oomb_gallocr_new(cpu);
    if (!oomb_gallocr_alloc_graph(galloc, g)) {
        fprintf(stderr, "could not allocate the graph\n");
        return 1;
    }
    printf("graph: %d nodes, arena %.1f KiB planned (%.1f KiB without reuse)\n", oomb_graph_n_nodes(g),
           oomb_gallocr_planned_size(galloc) / 1024.0, oomb_gallocr_planned_sum(galloc) / 1024.0);

    struct oomb_opt_params op = oomb_opt_default_params(OOMB_OPT_ADAMW);
    op.lr = 1e-2f;
    oomb_optimizer_t opt = oomb_opt_init(cpu, params, 4, NULL, op);

    float first = 0.0f, last = 0.0f;
    for (int step = 1; step <= steps; step++) {
        for (int i = 0; i < BATCH; i++) {
            const float a = frand(&seed), b = frand(&seed);
            oomb_set_f32_nd(x, 0, i, 0, 0, a);
            oomb_set_f32_nd(x, 1, i, 0, 0, b);
            oomb_set_f32_nd(y, 0, i, 0, 0, sinf(3.0f * a) * cosf(2.0f * b));
        }
        oomb_opt_zero_grads(opt);
        oomb_gallocr_alloc_graph(galloc, g); /* same graph: the stored plan is reused */
        if (oomb_backend_graph_compute(cpu, g) != OOMB_STATUS_OK) {
            fprintf(stderr, "oomb-embed-example: %s\n", oomb_backend_last_error(cpu));
            return 1;
        }
        last = oomb_get_f32_1d(loss, 0);
        if (step == 1) first = last;
        oomb_opt_step(opt, -1.0f, 1.0f, 1.0f);
        if (step == 1 || step % 100 == 0) printf("step %4d  loss %.5f\n", step, last);
    }
    printf("loss %.5f -> %.5f (%s), %d plan(s) for %d steps\n", first, last, last < first ? "falling" : "NOT falling",
           oomb_gallocr_n_plans(galloc), steps);

    oomb_opt_free(opt);
    oomb_gallocr_free(galloc);
    oomb_free(ctx);
    oomb_free(ctx_w);
    oomb_backend_free(cpu);
    return last < first ? 0 : 1;
}
