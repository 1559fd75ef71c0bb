// --offload / --gpu-kv-budget and the memory plan (see train-offload.h).

#include "train-offload.h"

#include "model.h"
#include "train-common.h"

#include <algorithm>
#include <memory>
#include <cmath>
#include <utility>
#include <vector>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sys/resource.h>
#include <unistd.h>

namespace oomb {
namespace train {

void add_offload_options(CLI::App & app, OffloadOptions & o, bool training) {
    app.add_option("--offload", o.mode,
                   std::string(training ? "host offload of the KV cache (K/V pages and their gradients in pinned host memory, streamed "
                                        : "host offload of the KV cache (K/V pages in pinned host memory, streamed ") +
                       "in page blocks): auto (only what does not fit the device; the most pages that fit stay resident), on (forced: "
                   "everything past --gpu-kv-budget, all of it without one, even where the slots hold more than the whole cache; "
                   "nothing when the budget holds the whole cache), off")
        ->capture_default_str();
    app.add_option("--gpu-kv-budget", o.gpu_kv_budget,
                   std::string("GiB of device memory for KV pages (resident pages and streaming slots; fractions allowed, e.g. 0.001); "
                               "default: on a GPU what is left after the model") +
                       (training ? ", its gradients and optimizer state" : "") +
                       " and the chunk arena, less a margin; "
                       "on the CPU no limit. Below the streams' minimum (the chunk's pages + 2 blocks) the device holds that minimum")
        ->check(CLI::Validator(
            [](std::string & s) -> std::string {  // a plain decimal number: no hex, inf or nan
                const bool ok = !s.empty() && s.find_first_not_of("0123456789.eE+-") == std::string::npos;
                return ok ? std::string() : "must be a decimal number of GiB (e.g. 0.5 or 40), got '" + s + "'";
            },
            "GiB"));
    app.add_option("--offload-block", o.block_pages, "pages per streamed history block (0: 32,768 tokens' worth; at most the cache's pages)")->capture_default_str();
}

void check_offload_options(const char * prog, const CLI::App & app, const OffloadOptions & o) {
    if (o.mode != "auto" && o.mode != "on" && o.mode != "off") fail(prog, "--offload must be auto, on or off, got '" + o.mode + "'");
    if (app.count("--gpu-kv-budget") && !(o.gpu_kv_budget >= 0 && o.gpu_kv_budget <= 1e6)) {
        char v[32];
        snprintf(v, sizeof v, "%g", o.gpu_kv_budget);
        fail(prog, std::string("--gpu-kv-budget must be a number of GiB from 0 to 1e6, got ") + v);
    }
    if (app.count("--gpu-kv-budget") && o.mode == "off") fail(prog, "--gpu-kv-budget sets the device share of an offloaded KV cache: it needs --offload auto or on");
    if (app.count("--offload-block") && o.mode == "off") fail(prog, "--offload-block sets the streamed blocks: it needs --offload auto or on");
    if (o.block_pages < 0) fail(prog, "--offload-block must be >= 0 (0: automatic), got " + std::to_string(o.block_pages));
}

// MemAvailable of /proc/meminfo (bytes), else the physical memory; 0 when unknown.
size_t host_available() {
    std::ifstream f("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    while (f >> key >> kb) {
        if (key == "MemAvailable:") return kb * 1024;
        f.ignore(256, '\n');
    }
    const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t) pages * (size_t) psz : 0;
}

size_t address_space_left() {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
    std::ifstream f("/proc/self/status");
    size_t vm_kb = 0;
    for (std::string line; std::getline(f, line);)
        if (line.rfind("VmSize:", 0) == 0) { vm_kb = (size_t) std::strtoull(line.c_str() + 7, nullptr, 10); break; }
    const size_t vm = vm_kb * 1024;
    return (size_t) rl.rlim_cur > vm ? (size_t) rl.rlim_cur - vm : 0;
}

size_t lm_head_block_cap(double total, double need, double margin, double def, double * room_out) {
    const double room = total - need - margin - (double) (1ull << 30), step = (double) (256ull << 20);
    if (room_out) *room_out = room;
    if (!(room > 0) || !(def > 0)) return 0;
    const double cap = std::floor(std::min(4.0 * def, def + room) / step) * step;
    return cap > def ? (size_t) cap : 0;
}

void plan_memory(const char * prog, const OffloadOptions & oo, oomb_backend_t be, const Qwen2Model & m, ChunkParams * tp, bool optimizer) {
    const auto & c = m.cfg;
    const int64_t P = tp->page, n_pages = (tp->max_tokens + P - 1) / P;
    const bool chunked = tp->max_tokens > tp->chunk;
    // bytes of one logical page over all layers: K and V (+ their gradients, f32 or bf16, when training)
    const double page_elems = (double) c.head_dim * (double) c.n_head_kv * (double) P * (double) c.n_layer;
    const double grad_es = (double) oomb_type_size(tp->kv_grad_type);
    const double page_bytes = page_elems * (2.0 * (double) oomb_type_size(tp->kv_type) + (tp->with_grad ? 2.0 * grad_es : 0.0));
    // a block never holds more than the cache's pages: a larger --offload-block is capped (the
    // slots it would add could never be used). Default 32,768 tokens: each block is one kernel call
    // plus its launch-side work, and at 7B / 128K blocks of 16,384 tokens cost 3.8 % against resident,
    // of 32,768 2.9 % (bench/offload/RESULTS.md), for 2 x 16,384 tokens more of slots (5.25 GiB at 7B)
    const int block = (int) std::min<int64_t>(oo.block_pages > 0 ? oo.block_pages : std::max<int64_t>(1, 32768 / P), n_pages);
    // the tier the driver gives R resident pages and blocks of B (slots capped by the streamed
    // pages), and the device pages it holds
    auto tier_of = [&](int64_t R, int B) {
        ChunkParams q = *tp;
        q.resident_pages = R;
        q.stream_block_pages = B;
        return chunk_kv_tier(q);
    };
    auto dev_pages = [](const oomb_kv_tier_params & t) { return t.resident_pages + t.chunk_pages + 2 * (int64_t) t.block_pages; };

    size_t used0 = 0, total = 0;
    const bool has_dev = oomb_backend_memory(be, &used0, &total);
    // the chunk arena: plan the graphs of one chunk once (stage 2's and stage 1's when chunked)
    size_t arena = 0, scratch = 0;  // scratch: the backend's beside the arena (the LM head's logits block on CUDA)
    ChunkParams probe = *tp;
    probe.max_tokens = std::min(tp->chunk, tp->max_tokens) + (chunked ? 1 : 0);
    probe.cache_attn = false;
    probe.resident_pages = -1;
    auto probe_driver = std::make_unique<ChunkDriver>(model_chunk_builder(m), probe);  // (freed once the plan has its figures)
    const int64_t T_chunk = std::min(tp->chunk, tp->max_tokens);
    auto backend_scratch = [&]() -> size_t {
        ChunkDriver & d = *probe_driver;
        if (!tp->with_grad) return d.backend_scratch_bytes(T_chunk, ChunkKind::Loss);
        if (chunked) return std::max(d.backend_scratch_bytes(T_chunk, ChunkKind::Backward), d.backend_scratch_bytes(T_chunk, ChunkKind::Fill));
        return d.backend_scratch_bytes(T_chunk, ChunkKind::BackwardStore);
    };
    if (!tp->with_grad) arena = probe_driver->planned_bytes(T_chunk, ChunkKind::Loss);
    else if (chunked) arena = probe_driver->planned_bytes(T_chunk, ChunkKind::Backward) + probe_driver->planned_bytes(T_chunk, ChunkKind::Fill);
    else arena = probe_driver->planned_bytes(T_chunk, ChunkKind::BackwardStore);
    oomb_backend_set_linear_cross_entropy_block(be, 0);  // the default block for the plan of the KV cache
    scratch = backend_scratch();
    const double attn_cache = tp->cache_attn && tp->with_grad && chunked
                                  ? (double) oomb_paged_attn_cache_row(c.head_dim, c.n_head, tp->cache_attn_type) *
                                        (double) oomb_type_size(tp->cache_attn_type) * (double) tp->max_tokens * (double) c.n_layer
                                  : 0.0;
    // sparse attention: the page summaries (every page, on the device) and, with a host tier, each
    // streamed sparse node's own page table (4 bytes per page; stage 1 and stage 2 nodes of up to
    // two chunk lengths: at most 6 per layer). Its streams move only the selected pages, through the
    // same slots as dense streaming: the slots' device bytes do not change.
    const double summaries = tp->sparse.pages > 0 ? oomb_sparse_summary_bytes_per_token(tp->sparse.score, c.n_head_kv, c.head_dim, P) *
                                                        (double) (n_pages * P) * (double) c.n_layer
                                                  : 0.0;
    const double sparse_tables = tp->sparse.pages > 0 ? 4.0 * (double) n_pages * 6.0 * (double) c.n_layer : 0.0;
    const double margin = has_dev ? 1.0 * (1 << 30) + 0.03 * (double) total : 0.0;
    const double free_kv =
        has_dev ? (double) total - (double) used0 - (double) arena - (double) scratch - attn_cache - summaries - sparse_tables - margin : 1e300;
    const double all_kv = page_bytes * (double) n_pages;
    const bool budget_given = oo.gpu_kv_budget >= 0;
    const double budget = budget_given ? std::max(0.0, oo.gpu_kv_budget * (double) (1ull << 30)) : free_kv;  // -0 prints as 0
    const int64_t budget_pages = (int64_t) std::min(budget / page_bytes, 1e15);
    // pages that fit stay resident: with a budget that holds the whole cache nothing streams, for
    // --offload on as for auto (on streams everything past the budget: all of it without one)
    bool streams = (oo.mode == "on" && !budget_given) || (oo.mode != "off" && all_kv > budget);
    if (streams && !chunked) {  // one chunk: its own pages are the whole cache, no history to stream
        printf("note: a sequence of %" PRId64 " tokens is a single chunk (no longer than --chunk): there is no history to stream, the KV "
               "cache (%" PRId64 " pages, %s) stays on the device\n", tp->max_tokens, n_pages, fmt_bytes(all_kv).c_str());
        streams = false;
    }
    if (oo.mode == "on" && budget_given && !streams && all_kv <= budget)
        printf("note: --offload on: the whole KV cache (%" PRId64 " pages, %s) fits --gpu-kv-budget %s: it stays resident, nothing "
               "streams\n", n_pages, fmt_bytes(all_kv).c_str(), fmt_bytes(budget).c_str());
    if (streams && oo.block_pages > block)
        printf("note: --offload-block %d is more than the KV cache's %" PRId64 " pages: blocks of at most %d pages\n", oo.block_pages,
               n_pages, block);
    int64_t R = n_pages;  // resident pages
    int B = block;
    if (streams) {
        // as many resident pages as fit the budget beside the slots (pages that fit stay resident):
        // for each block size (halved from --offload-block) the most resident pages that fit; the
        // largest blocks that keep within 10 % of the best count win (small blocks mean many small
        // kernel calls: slower on a GPU). --offload on without a budget: none resident.
        const bool none = oo.mode == "on" && !budget_given;
        std::vector<std::pair<int, int64_t>> fits;  // (block, resident), largest block first
        for (int b = block; b >= 1; b = b > 1 ? b / 2 : 0) {
            int64_t rb = -1;
            for (int64_t r = none ? 0 : std::min(n_pages - 1, budget_pages); r >= 0 && rb < 0; r--)
                if (none || dev_pages(tier_of(r, b)) <= budget_pages) rb = r;
            fits.push_back({b, rb});
            if (none) break;
        }
        int64_t best = -1;
        for (auto & f : fits) best = std::max(best, f.second);
        R = -1;
        for (auto & f : fits)
            if (best >= 0 && f.second >= 0 && (double) f.second >= 0.9 * (double) best) { R = f.second; B = f.first; break; }
        if (R < 0) {  // not even the slots fit: smaller blocks (down to one page), nothing resident
            R = 0;
            B = (int) std::max<int64_t>(1, (budget_pages - tier_of(0, 1).chunk_pages) / 2);
            if (dev_pages(tier_of(0, B)) > budget_pages)
                printf("warning: the KV budget (%s, %" PRId64 " pages) is below what streaming needs on the device: %" PRId64 " slots (%d "
                       "pages of the chunk + 2 blocks of %d), %s: the device holds them, more than the budget (a smaller --chunk lowers "
                       "it)\n", fmt_bytes(budget).c_str(), budget_pages, dev_pages(tier_of(0, B)), tier_of(0, B).chunk_pages,
                       tier_of(0, B).block_pages, fmt_bytes(page_bytes * (double) dev_pages(tier_of(0, B))).c_str());
        }
        if (oo.block_pages > 0 && B < std::min<int64_t>(oo.block_pages, block))  // the user's block size, made smaller by the budget
            printf("note: --offload-block %d: blocks of %d pages instead, the largest that keep the most resident pages within the "
                   "KV budget (%s)\n", oo.block_pages, B, fmt_bytes(budget).c_str());
        if (dev_pages(tier_of(R, B)) >= n_pages) {  // the slots would hold as much as the whole cache
            if (oo.mode == "auto") {
                printf("note: streaming would keep %" PRId64 " pages on the device, the whole KV cache has %" PRId64 ": it stays resident\n",
                       dev_pages(tier_of(R, B)), n_pages);
                R = n_pages;
            } else {  // forced on (tests, benchmarks): stream anyway, say what it costs
                printf("note: --offload on keeps %" PRId64 " pages on the device, more than the %" PRId64 " of the whole KV cache "
                       "(--offload auto would keep it resident)\n", dev_pages(tier_of(R, B)), n_pages);
            }
        }
    }
    const bool tiered = R < n_pages;
    if (tiered && attn_cache > 0)
        fail(prog, "--attn-cache keeps " + fmt_bytes(attn_cache) + " of attention results on the device, which a streamed KV cache "
                   "does not support: drop --attn-cache (or --offload off if the KV cache fits)");
    tp->resident_pages = tiered ? R : -1;
    tp->stream_block_pages = B;
    const oomb_kv_tier_params used = chunk_kv_tier(*tp);  // what the driver allocates (slots capped by the streamed pages)
    const int64_t used_slots = used.chunk_pages + 2 * (int64_t) used.block_pages;
    const double dev_kv = tiered ? page_bytes * (double) (R + used_slots) : all_kv;
    // the host tier, and the zero gradient pages fresh gradients are read from (offload.cpp)
    const double host_kv = tiered ? page_bytes * (double) (n_pages - R) +
                                        (tp->with_grad ? (double) std::max(used.block_pages, used.chunk_pages) * page_elems / (double) c.n_layer * grad_es : 0.0)
                                  : 0.0;
    const double sparse_dev = summaries + (tiered ? sparse_tables : 0.0);
    // The LM head's logits block (the fused forward + backward pass; CUDA): 1.25 GiB by default, counted
    // above before the KV cache's budget. Where the device has room left after all of it, margin kept,
    // up to 4x that: fewer row blocks, each of whose dW products reads and writes the whole f32 [E, V]
    // gradient (0.5B, one chunk of 32K, H100: 15 blocks -> 4, the LM head's backward 68.3 -> 58.8 ms per
    // step, +0.6 % tok/s; bench/NOTES.md "Sessions 25, 26"). Not taken from the KV cache: a streamed
    // cache (whose graphs never fuse the pass), a run with --gpu-kv-budget (the user's share of the
    // device) and a run at the edge keep the default; 1 GiB beyond the margin stays free for the
    // kernels' uncounted workspaces (paged attention's, ~1 GiB at 7B and 32K).
    if (has_dev && tp->with_grad && !tiered && !budget_given) {
        const double need0 = (double) used0 + (double) arena + (double) scratch + attn_cache + dev_kv + sparse_dev;
        double room = 0;
        const size_t cap = lm_head_block_cap((double) total, need0, margin, 1.25 * (double) (1ull << 30), &room);
        if (cap > 0 && oomb_backend_set_linear_cross_entropy_block(be, cap)) {
            const size_t s2 = backend_scratch();
            if ((double) s2 > (double) scratch + room) oomb_backend_set_linear_cross_entropy_block(be, 0);  // (rounding up of the slots)
            else scratch = s2;
        }
    }
    probe_driver.reset();
    const std::string dev = oomb_backend_name(be);
    printf("memory plan (%s%s): %s %s | chunk arena %s (chunk %" PRId64 ")%s%s\n", dev.c_str(),
           has_dev ? (", " + fmt_bytes((double) total)).c_str() : "", !tp->with_grad ? "weights" : optimizer ? "weights, gradients and optimizer state" : "weights and gradients",
           fmt_bytes(has_dev ? (double) used0 : (double) rss_bytes()).c_str(),
           fmt_bytes((double) arena).c_str(), std::min(tp->chunk, tp->max_tokens),
           scratch > 0 ? (" + LM-head scratch " + fmt_bytes((double) scratch)).c_str() : "",
           attn_cache > 0 ? (" | attention cache " + fmt_bytes(attn_cache)).c_str() : "");
    printf("             KV cache %" PRId64 " pages of %" PRId64 " tokens, %s per page over %" PRId64 " layers (K/V %s%s): ", n_pages, P,
           fmt_bytes(page_bytes).c_str(), c.n_layer, oomb_type_name(tp->kv_type), tp->with_grad ? (std::string(" + ") + oomb_type_name(tp->kv_grad_type) + " gradients").c_str() : "");
    if (!tiered) printf("all on the device, %s (offload %s)\n", fmt_bytes(all_kv).c_str(), oo.mode.c_str());
    else
        printf("%" PRId64 " resident + %" PRId64 " slots on the device (%s), %" PRId64 " streamed from %s host memory (%s; offload %s, blocks of %d pages)\n",
               R, used_slots, fmt_bytes(dev_kv).c_str(), n_pages - R, has_dev ? "pinned" : "plain", fmt_bytes(host_kv).c_str(),
               oo.mode.c_str(), used.block_pages);
    if (tp->sparse.pages > 0)
        printf("             sparse attention (top %d pages, %s): page summaries %s%s on the device%s\n", tp->sparse.pages,
               tp->sparse.score == OOMB_SPARSE_SCORE_QUEST ? "quest" : "mean", fmt_bytes(summaries).c_str(),
               tiered ? (" + page tables of the streamed nodes " + fmt_bytes(sparse_tables)).c_str() : "",
               tiered ? "; only the selected history pages stream" : "");
    if (has_dev) {
        const double need = (double) used0 + (double) arena + (double) scratch + attn_cache + dev_kv + sparse_dev;
        printf("             device total %s of %s%s\n", fmt_bytes(need).c_str(), fmt_bytes((double) total).c_str(),
               budget_given ? (" (KV budget " + fmt_bytes(budget) + ")").c_str() : "");
        if (need + 0.5 * margin > (double) total) {
            const std::string hint = oo.mode == "off" ? "--offload auto (stream the KV pages that do not fit), "
                                     : budget_given   ? "a smaller --gpu-kv-budget, "
                                                      : "";
            fail(prog, "the run needs " + fmt_bytes(need) + " of device memory, " + dev + " has " + fmt_bytes((double) total) + " (" +
                           fmt_bytes((double) used0) + " in use before the KV cache and the arena): try " + hint +
                           "a smaller --chunk (the arena: " + fmt_bytes((double) arena) + "), a shorter --ctx, or --opt-state bf16");
        }
    }
    if (!has_dev) {
        // The CPU: the arena, the KV cache and the sparse tables are host memory allocated after this plan (the weights,
        // gradients and optimizer state already are); OpenBLAS reserves a buffer (~128 MiB of address space) for each
        // thread that runs a product, at its first. A run that cannot fit stops here with its figures, not in an allocation
        // minutes in, nor, under an address-space limit (ulimit -v), in OpenBLAS's allocation loop, which retries forever.
        // One buffer is counted (a floor: a run refused here cannot run; larger products may take more threads' buffers).
        const double need = (double) arena + (double) scratch + attn_cache + dev_kv + host_kv + summaries + sparse_tables;
        const size_t avail = host_available(), as_left = address_space_left();
        const double blas = 128.0 * (double) (1 << 20);
        if (avail > 0 && need > (double) avail)
            fail(prog, "the run needs " + fmt_bytes(need) + " more host memory (chunk arena " + fmt_bytes((double) arena) + ", KV cache " +
                           fmt_bytes(dev_kv + host_kv) + "), the machine has " + fmt_bytes((double) avail) +
                           " available: try a smaller --chunk, a shorter --ctx, or --opt-state bf16");
        if (as_left != SIZE_MAX && need + blas > (double) as_left)
            fail(prog, "the run needs " + fmt_bytes(need + blas) + " more address space (chunk arena " + fmt_bytes((double) arena) +
                           ", KV cache " + fmt_bytes(dev_kv + host_kv) + ", OpenBLAS's buffers ~" + fmt_bytes(blas) +
                           "), the address-space limit (ulimit -v) leaves " + fmt_bytes((double) as_left) +
                           ": raise the limit, or try a smaller --chunk or a shorter --ctx");
    }
    if (host_kv > 0 && has_dev) {
        const size_t avail = host_available();
        if (avail > 0 && host_kv > 0.9 * (double) avail)
            fail(prog, "the streamed KV pages need " + fmt_bytes(host_kv) + " of " + (has_dev ? "pinned " : "") + "host memory, " +
                           "the machine has " + fmt_bytes((double) avail) + " available: raise --gpu-kv-budget, or shorten --ctx");
    }
    fflush(stdout);
}

} // namespace train
} // namespace oomb
