// Reductions of the CUDA backend: sum / mean / sum_sq over all elements (any strides), in double,
// deterministic (a fixed two-level reduction: fixed per-block partials, then one block).
#pragma once

#include "common.cuh"

// sum / mean of s[0]; sum_sq of s[0] and every further source (oomb_sum_sq_n): the sources' per-block
// partials side by side (one launch when every source is contiguous), then one block sums them in order.
void oomb_cuda_sum(oomb_cuda_ctx & c, oomb_tensor * dst, const oomb_tensor * const * s);

// Sums n doubles of `part` (device) in a fixed order into *out (device): total * mul, stored as float.
// Used by reductions that produce per-block or per-row partials.
void oomb_cuda_sum_partials(oomb_cuda_ctx & c, const double * part, int64_t n, double mul, float * out);
