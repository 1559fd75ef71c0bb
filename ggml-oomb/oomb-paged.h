// ggml-oomb paged KV cache: the K/V cache and the KV-gradient cache of every layer in fixed-size
// pages drawn from a pool, with one page table (logical page -> physical page) shared by the
// layers (OOMB mechanism 2). Appending a chunk takes free pages; nothing is ever moved.
//
// Pools are tensors [head_dim, n_head_kv, page_size, n_pages] in the backend's memory: K and V in
// `type` (f32 on the CPU, bf16 on the GPU), gradient pages in `grad_type` (f32, or bf16 with
// stochastic rounding: 2/3 of the bytes with bf16 K/V). Graph ops read and write them
// through oomb_paged_attn / oomb_paged_attn_back with the page table as an input tensor.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oomb_kv_cache * oomb_kv_cache_t;

struct oomb_kv_cache_params {
    int     n_layer;
    int     n_head_kv;
    int     head_dim;
    int     page_size;   // tokens per page (OOMB reference: 128 on H100/H200, 64 on A100)
    int64_t max_tokens;  // capacity: the pool holds ceil(max_tokens / page_size) pages per layer
    enum oomb_type type; // K/V element type: f32, f16 or bf16
    bool    with_grad;   // also allocate the KV-gradient pages (training)
    // Gradient-page element type: OOMB_TYPE_F32 (0: the value of a zero-initialised struct) or
    // OOMB_TYPE_BF16 (the backward rounds each chunk's sums stochastically, oomb_paged_attn_back).
    enum oomb_type grad_type;
};

/// Host tier of a KV cache (OOMB mechanism 3, host offload; oomb-offload.h streams it). Logical
/// pages [0, resident_pages) live on the device (resident: no transfer); the pages after them live
/// in the backend's host buffer type (CUDA: pinned memory) and are streamed through device slots:
/// `chunk_pages` slots for the pages of the chunk being computed and two sets of `block_pages` slots
/// for the history, which attention reads block by block. Device pools then hold
/// resident_pages + chunk_pages + 2 * block_pages pages per layer, whatever the context length;
/// chunk_pages and block_pages are capped at the host tier's pages (what a chunk or a block can
/// ever map), so a block larger than the cache allocates no unused slots.
struct oomb_kv_tier_params {
    int64_t resident_pages; // >= 0; at least the cache's page count: no host tier (a plain cache)
    int     block_pages;    // >= 1: pages per streamed history block
    int     chunk_pages;    // >= 1: the most pages one chunk's positions span (ceil(chunk / page) + 1)
};

/// Allocates the pools and the page table in `backend`'s memory. Errors: bad sizes; returns NULL
/// (with a message on stderr) when the memory cannot be allocated.
oomb_kv_cache_t oomb_kv_cache_init(oomb_backend_t backend, struct oomb_kv_cache_params p);
/// oomb_kv_cache_init with a host tier (see oomb_kv_tier_params). The page table then maps logical
/// pages to device pool slots as the chunk being computed needs (oomb-offload.h sets it); pages of
/// the host tier are never addressed by a kernel directly. NULL (with a message on stderr) when
/// the device or the pinned host memory cannot be allocated. Errors: bad tier sizes.
oomb_kv_cache_t oomb_kv_cache_init_tiered(oomb_backend_t backend, struct oomb_kv_cache_params p, struct oomb_kv_tier_params tier);
void oomb_kv_cache_free(oomb_kv_cache_t c);
/// Logical pages resident on the device (all of them without a host tier).
int64_t oomb_kv_cache_resident_pages(oomb_kv_cache_t c);
/// Bytes of the host tier's pools (0 without one).
size_t oomb_kv_cache_host_nbytes(oomb_kv_cache_t c);

/// Forgets every position: all pages return to the free list (a new sequence).
void oomb_kv_cache_clear(oomb_kv_cache_t c);
/// Maps logical pages so that positions [0, n_tokens) have a physical page, taking pages from the
/// free list (already mapped pages stay where they are) and uploads the page table.
/// Errors: n_tokens beyond the capacity.
void oomb_kv_cache_reserve(oomb_kv_cache_t c, int64_t n_tokens);
/// Number of positions mapped so far.
int64_t oomb_kv_cache_n_tokens(oomb_kv_cache_t c);
/// Sets every gradient page to zero.
void oomb_kv_cache_zero_grad(oomb_kv_cache_t c);
/// Seeds the stochastic rounding of bf16 gradient pages for the next backward passes (call once
/// per step with e.g. the step number: a run is then reproducible and resumes draw the same bits):
/// every layer's dK and dV pages get a distinct seed derived from `seed`
/// (oomb_paged_attn_set_grad_seed). No effect with f32 gradient pages or without with_grad.
void oomb_kv_cache_set_grad_seed(oomb_kv_cache_t c, uint32_t seed);

struct oomb_tensor * oomb_kv_cache_k(oomb_kv_cache_t c, int layer);
struct oomb_tensor * oomb_kv_cache_v(oomb_kv_cache_t c, int layer);
struct oomb_tensor * oomb_kv_cache_dk(oomb_kv_cache_t c, int layer);  // NULL without with_grad
struct oomb_tensor * oomb_kv_cache_dv(oomb_kv_cache_t c, int layer);
/// i32 [n_pages]: logical page -> physical page (-1 while unmapped).
struct oomb_tensor * oomb_kv_cache_page_table(oomb_kv_cache_t c);
struct oomb_kv_cache_params oomb_kv_cache_get_params(oomb_kv_cache_t c);
/// Bytes of the device pools (K, V and gradients; with a host tier: the resident pages and the
/// streaming slots) and the page table.
size_t oomb_kv_cache_nbytes(oomb_kv_cache_t c);

#ifdef __cplusplus
}
#endif
