// ggml-oomb graph allocator: plans a whole graph's memory in one arena.
//
// The plan walks the graph in execution order, gives each tensor without data an offset in the
// arena when it is produced and returns its memory when its last consumer (and the last view of it)
// has run, so later tensors reuse it (best-fit free list). Element-wise and row-wise ops run in
// place on their first source when that source dies at this node and has the same size. Tensors
// flagged INPUT or OUTPUT, and leafs (parameters, constants), are never reused. The plan is kept:
// computing the same graph again (the training loop re-runs one chunk's graph thousands of times)
// reuses it without planning again; a changed graph is planned again and the arena grows as needed.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oomb_gallocr * oomb_gallocr_t;

oomb_gallocr_t oomb_gallocr_new(oomb_backend_t backend);
void oomb_gallocr_free(oomb_gallocr_t galloc);

/// Plans g (unless the stored plan is for this same graph) without allocating. Returns false only
/// when the backend cannot allocate the arena.
bool oomb_gallocr_reserve(oomb_gallocr_t galloc, struct oomb_cgraph * g);
/// Plans g if needed, (re)allocates the arena if it is too small, and sets the data of every
/// graph tensor that has none. Returns false when the arena cannot be allocated.
bool oomb_gallocr_alloc_graph(oomb_gallocr_t galloc, struct oomb_cgraph * g);

/// Peak arena bytes of the last plan (what the arena needs).
size_t oomb_gallocr_planned_size(oomb_gallocr_t galloc);
/// Sum of the sizes of the tensors the last plan placed (what they would take without reuse).
size_t oomb_gallocr_planned_sum(oomb_gallocr_t galloc);
/// How many times a plan was made (re-running an unchanged graph does not plan again).
int    oomb_gallocr_n_plans(oomb_gallocr_t galloc);
/// Bytes currently allocated for the arena.
size_t oomb_gallocr_buffer_size(oomb_gallocr_t galloc);

#ifdef __cplusplus
}
#endif
