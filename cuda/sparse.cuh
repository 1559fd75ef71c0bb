// Page-level sparse attention on the CUDA backend (OOMB_OP_PAGE_SUMMARY, OOMB_OP_PAGE_SELECT;
// oomb-sparse.h; CPU reference: src/oomb/sparse.cpp). The backend dispatches the nodes here.
#pragma once

#include "oomb.h"

struct oomb_cuda_ctx;
// Launchers: queue the kernels on c.stream (they read dst->src themselves; select uses scratch
// slot SLOT_PAGED).
void oomb_cuda_page_summary(oomb_cuda_ctx & c, oomb_tensor * dst);
void oomb_cuda_page_select(oomb_cuda_ctx & c, oomb_tensor * dst);
