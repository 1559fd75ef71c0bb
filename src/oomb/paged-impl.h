// The KV cache's internals, shared by the cache (paged.cpp) and the offload engine (offload.cpp),
// which streams the host tier's pages through the device slots.
#pragma once

#include "oomb-paged.h"

#include <cstdint>
#include <vector>

struct oomb_kv_cache {
    oomb_kv_cache_params p{};
    oomb_backend_t backend = nullptr;
    oomb_context * ctx = nullptr;
    oomb_buffer_t  buf = nullptr;
    std::vector<oomb_tensor *> k, v, dk, dv;  // device pools [D, Hkv, P, n_dev] per layer
    oomb_tensor * page_table = nullptr;
    std::vector<int32_t> table;      // host copy
    std::vector<int32_t> free_pages; // stack of free physical pages (no host tier)
    int64_t n_pages = 0;             // logical pages (capacity)
    int64_t n_tokens = 0;

    // Host tier (tiered == false: none; every page on the device, physical pages from free_pages).
    // Device slots of a pool: [0, R) the resident logical pages (slot = logical page), then
    // n_cur slots for the chunk's pages at or past R, then two sets of B slots for history blocks.
    // Host page h = logical page R + h, of every layer: kh[l] + h * page_kv_bytes (K, V) and
    // dkh[l] + h * page_grad_bytes (gradients).
    bool tiered = false;
    int64_t R = 0, n_cur = 0, B = 0;
    size_t page_kv_bytes = 0, page_grad_bytes = 0;
    oomb_buffer_t host_buf = nullptr;
    std::vector<char *> kh, vh, dkh, dvh;
    char * zeros = nullptr;             // max(B, n_cur) zero gradient pages (pinned): fresh gradients
    std::vector<uint8_t> grad_fresh;    // [layer * n_host + h]: host page h's gradients of the layer are zero (not written since zero_grad)
    uint8_t & fresh(int layer, int64_t lp) { return grad_fresh[(size_t) layer * (size_t) n_host() + (size_t) (lp - R)]; }

    int64_t n_host() const { return n_pages - R; }
    int64_t cur_slot0() const { return R; }
    int64_t set_slot0(int s) const { return R + n_cur + (int64_t) s * B; }
};
