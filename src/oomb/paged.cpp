// Paged KV cache: pools of fixed-size pages and the page table (see oomb-paged.h), optionally
// with a host tier: the pages past the resident ones in host memory, streamed by offload.cpp.

#include "oomb-paged.h"
#include "oomb-impl.h"
#include "paged-impl.h"
#include "sround.h"

#include <algorithm>
#include <cstring>

#include <cinttypes>
#include <cstdio>
#include <vector>

static oomb_kv_cache_t kv_cache_create(oomb_backend_t backend, const oomb_kv_cache_params & p, const oomb_kv_tier_params * tier) {
    if (p.n_layer <= 0 || p.n_head_kv <= 0 || p.head_dim <= 0 || p.page_size <= 0 || p.max_tokens <= 0) {
        oomb_error("kv_cache_init: bad sizes (n_layer %d, n_head_kv %d, head_dim %d, page_size %d, max_tokens %" PRId64 ")",
                   p.n_layer, p.n_head_kv, p.head_dim, p.page_size, p.max_tokens);
    }
    if (p.type != OOMB_TYPE_F32 && p.type != OOMB_TYPE_F16 && p.type != OOMB_TYPE_BF16) {
        oomb_error("kv_cache_init: K/V type must be f32, f16 or bf16, got %s", oomb_type_name(p.type));
    }
    if (p.grad_type != OOMB_TYPE_F32 && p.grad_type != OOMB_TYPE_BF16) {
        oomb_error("kv_cache_init: gradient-page type must be f32 or bf16, got %s", oomb_type_name(p.grad_type));
    }
    if (tier && (tier->resident_pages < 0 || tier->block_pages < 1 || tier->chunk_pages < 1)) {
        oomb_error("kv_cache_init_tiered: bad tier sizes (resident_pages %" PRId64 ", block_pages %d, chunk_pages %d)",
                   tier->resident_pages, tier->block_pages, tier->chunk_pages);
    }
    auto * c = new oomb_kv_cache();
    c->p = p;
    c->backend = backend;
    c->n_pages = (p.max_tokens + p.page_size - 1) / p.page_size;
    c->tiered = tier && tier->resident_pages < c->n_pages;
    int64_t n_dev = c->n_pages;
    if (c->tiered) {
        // slots are capped at the host pages: a block or a chunk never maps more of them, and
        // larger sizes would only allocate device pages no kernel can use
        c->R = tier->resident_pages;
        c->n_cur = std::min<int64_t>(tier->chunk_pages, c->n_pages - c->R);
        c->B = std::min<int64_t>(tier->block_pages, c->n_pages - c->R);
        n_dev = c->R + c->n_cur + 2 * c->B;
    } else {
        c->R = c->n_pages;
    }
    c->ctx = oomb_init({0, true});
    for (int l = 0; l < p.n_layer; l++) {
        auto mk = [&](oomb_type type, const char * what) {
            oomb_tensor * t = oomb_new_tensor_4d(c->ctx, type, p.head_dim, p.n_head_kv, p.page_size, n_dev);
            return oomb_format_name(t, "kv.%d.%s", l, what);
        };
        c->k.push_back(mk(p.type, "k_pages"));
        c->v.push_back(mk(p.type, "v_pages"));
        if (p.with_grad) {
            // the gradient pages are the pools' gradients: the backward of paged_attn accumulates into them
            c->dk.push_back(mk(p.grad_type, "dk_pages"));
            c->dv.push_back(mk(p.grad_type, "dv_pages"));
            c->k.back()->grad = c->dk.back();
            c->v.back()->grad = c->dv.back();
        }
    }
    c->page_table = oomb_set_name(oomb_new_tensor_1d(c->ctx, OOMB_TYPE_I32, c->n_pages), "kv.page_table");
    oomb_set_input(c->page_table);
    size_t total = 0;
    for (int64_t i = 0; i < oomb_ctx_n_tensors(c->ctx); i++) total += oomb_nbytes(oomb_ctx_tensor(c->ctx, i));
    c->buf = oomb_backend_alloc_buffer(backend, total + 256 * (size_t) oomb_ctx_n_tensors(c->ctx));
    if (!c->buf) {
        fprintf(stderr, "oomb: kv_cache_init: cannot allocate %.2f GiB for the KV cache on %s\n", total / 1073741824.0,
                oomb_backend_name(backend));
        oomb_free(c->ctx);
        delete c;
        return nullptr;
    }
    size_t off = 0;
    for (int64_t i = 0; i < oomb_ctx_n_tensors(c->ctx); i++) {
        oomb_tensor * t = oomb_ctx_tensor(c->ctx, i);
        oomb_tensor_alloc(c->buf, t, off);
        off += (oomb_nbytes(t) + 255) / 256 * 256;
        // Zero pools once: a slot never written (past a sequence's last position in its page, or a
        // position a test's schedule reads early) then holds 0, never heap garbage that could be NaN
        // (masked keys are weighted by 0, and 0 * NaN is NaN). Costs one memset at start-up.
        if (t != c->page_table) oomb_tensor_memset(t, 0);
    }
    if (c->tiered) {
        const size_t elems = (size_t) p.head_dim * (size_t) p.n_head_kv * (size_t) p.page_size;
        c->page_kv_bytes = elems * oomb_type_size(p.type);
        c->page_grad_bytes = elems * oomb_type_size(p.grad_type);
        const size_t nh = (size_t) c->n_host();
        const size_t layer_bytes = 2 * nh * c->page_kv_bytes + (p.with_grad ? 2 * nh * c->page_grad_bytes : 0);
        const size_t zero_bytes = p.with_grad ? (size_t) std::max(c->B, c->n_cur) * c->page_grad_bytes : 0;
        c->host_buf = oomb_buffer_type_alloc(oomb_backend_host_buffer_type(backend), layer_bytes * (size_t) p.n_layer + zero_bytes);
        if (!c->host_buf) {
            fprintf(stderr, "oomb: kv_cache_init_tiered: cannot allocate %.2f GiB of %s memory for the KV cache's host tier "
                    "(%" PRId64 " pages of %" PRId64 ")\n", (double) (layer_bytes * (size_t) p.n_layer + zero_bytes) / 1073741824.0,
                    oomb_buffer_type_name(oomb_backend_host_buffer_type(backend)), c->n_host(), c->n_pages);
            oomb_kv_cache_free(c);
            return nullptr;
        }
        char * base = (char *) oomb_buffer_base(c->host_buf);
        for (int l = 0; l < p.n_layer; l++) {
            char * L = base + (size_t) l * layer_bytes;
            c->kh.push_back(L);
            c->vh.push_back(L + nh * c->page_kv_bytes);
            if (p.with_grad) {
                c->dkh.push_back(L + 2 * nh * c->page_kv_bytes);
                c->dvh.push_back(L + 2 * nh * c->page_kv_bytes + nh * c->page_grad_bytes);
            }
        }
        // K/V pages of the host tier are always written (stage 1) before they are read; zeroed
        // anyway so that a slot past a sequence's end in its last page holds 0 (as above)
        std::memset(base, 0, layer_bytes * (size_t) p.n_layer);
        if (zero_bytes) {
            c->zeros = base + layer_bytes * (size_t) p.n_layer;
            std::memset(c->zeros, 0, zero_bytes);
        }
        c->grad_fresh.assign(nh * (size_t) p.n_layer, 1);
    }
    oomb_kv_cache_clear(c);
    return c;
}

oomb_kv_cache_t oomb_kv_cache_init(oomb_backend_t backend, struct oomb_kv_cache_params p) { return kv_cache_create(backend, p, nullptr); }

oomb_kv_cache_t oomb_kv_cache_init_tiered(oomb_backend_t backend, struct oomb_kv_cache_params p, struct oomb_kv_tier_params tier) {
    return kv_cache_create(backend, p, &tier);
}

void oomb_kv_cache_free(oomb_kv_cache_t c) {
    if (!c) return;
    oomb_buffer_free(c->host_buf);
    oomb_buffer_free(c->buf);
    oomb_free(c->ctx);
    delete c;
}

void oomb_kv_cache_clear(oomb_kv_cache_t c) {
    c->table.assign((size_t) c->n_pages, -1);
    if (c->tiered) {  // the offload engine maps pages to slots chunk by chunk
        c->n_tokens = 0;
        oomb_tensor_set(c->page_table, c->table.data(), 0, c->table.size() * sizeof(int32_t));
        return;
    }
    c->free_pages.clear();
    for (int64_t i = c->n_pages - 1; i >= 0; i--) c->free_pages.push_back((int32_t) i);
    c->n_tokens = 0;
    oomb_tensor_set(c->page_table, c->table.data(), 0, c->table.size() * sizeof(int32_t));
}

void oomb_kv_cache_reserve(oomb_kv_cache_t c, int64_t n_tokens) {
    const int64_t cap = c->n_pages * c->p.page_size;
    if (n_tokens < 0 || n_tokens > cap) {
        oomb_error("kv_cache_reserve: %" PRId64 " tokens exceed the cache capacity of %" PRId64 " (%" PRId64 " pages of %d)", n_tokens,
                   cap, c->n_pages, c->p.page_size);
    }
    if (n_tokens <= c->n_tokens) return;
    if (c->tiered) {  // no page to take: resident pages are their own slots, the rest are host pages
        c->n_tokens = n_tokens;
        return;
    }
    const int64_t need = (n_tokens + c->p.page_size - 1) / c->p.page_size;
    bool changed = false;
    for (int64_t lp = 0; lp < need; lp++) {
        if (c->table[lp] >= 0) continue;
        c->table[lp] = c->free_pages.back();
        c->free_pages.pop_back();
        changed = true;
    }
    c->n_tokens = n_tokens;
    if (changed) oomb_tensor_set(c->page_table, c->table.data(), 0, c->table.size() * sizeof(int32_t));
}

int64_t oomb_kv_cache_n_tokens(oomb_kv_cache_t c) { return c->n_tokens; }

void oomb_kv_cache_zero_grad(oomb_kv_cache_t c) {
    for (oomb_tensor * t : c->dk) oomb_tensor_memset(t, 0);
    for (oomb_tensor * t : c->dv) oomb_tensor_memset(t, 0);
    // host gradient pages are not touched: marked fresh, they are read as zeros (offload.cpp)
    std::fill(c->grad_fresh.begin(), c->grad_fresh.end(), (uint8_t) 1);
}

void oomb_kv_cache_set_grad_seed(oomb_kv_cache_t c, uint32_t seed) {
    // distinct streams per (layer, dK / dV): sround.h's hash of the step seed and the pool's number
    for (size_t l = 0; l < c->dk.size(); l++) {
        oomb_paged_attn_set_grad_seed(c->dk[l], oomb::sr_hash(seed * 0x9E3779B9u ^ (uint32_t) (2 * l + 1)));
        oomb_paged_attn_set_grad_seed(c->dv[l], oomb::sr_hash(seed * 0x9E3779B9u ^ (uint32_t) (2 * l + 2)));
    }
}

static void check_layer(oomb_kv_cache_t c, int layer, const char * fn) {
    if (layer < 0 || layer >= c->p.n_layer) oomb_error("%s: layer %d out of range (%d layers)", fn, layer, c->p.n_layer);
}
struct oomb_tensor * oomb_kv_cache_k(oomb_kv_cache_t c, int layer) { check_layer(c, layer, "kv_cache_k"); return c->k[layer]; }
struct oomb_tensor * oomb_kv_cache_v(oomb_kv_cache_t c, int layer) { check_layer(c, layer, "kv_cache_v"); return c->v[layer]; }
struct oomb_tensor * oomb_kv_cache_dk(oomb_kv_cache_t c, int layer) {
    check_layer(c, layer, "kv_cache_dk");
    return c->p.with_grad ? c->dk[layer] : nullptr;
}
struct oomb_tensor * oomb_kv_cache_dv(oomb_kv_cache_t c, int layer) {
    check_layer(c, layer, "kv_cache_dv");
    return c->p.with_grad ? c->dv[layer] : nullptr;
}
struct oomb_tensor * oomb_kv_cache_page_table(oomb_kv_cache_t c) { return c->page_table; }
struct oomb_kv_cache_params oomb_kv_cache_get_params(oomb_kv_cache_t c) { return c->p; }
size_t oomb_kv_cache_nbytes(oomb_kv_cache_t c) { return oomb_buffer_size(c->buf); }
int64_t oomb_kv_cache_resident_pages(oomb_kv_cache_t c) { return c->R; }
size_t oomb_kv_cache_host_nbytes(oomb_kv_cache_t c) { return c->host_buf ? oomb_buffer_size(c->host_buf) : 0; }
