// Paged flash attention benchmark (CUDA): a whole causal sequence of S tokens processed chunk by
// chunk against the paged history, as OOMB's chunk-recurrent training runs it: forward over the
// chunks in order (each chunk stores its K/V into the pages, store = 1), backward over the chunks in
// reverse order (dq, dK/dV accumulated into the f32 gradient pages). Prints one JSON line per
// sequence length. FLOPs as FlashAttention counts them: causal forward 2*S^2*H*D, forward+backward
// 3.5 times that. Each chunk's forward keeps its out and row log-sum-exp (the op's packed node) and
// its backward reads them; --recompute-lse makes the backward recompute them instead (fwd = NULL,
// the op before version 4 in bench/NOTES.md).
// --sparse K: OOMB's page-list schedule (oomb-schedule.h, LISTS), as --sparse-pages K trains: each query
// tile (one page of queries) of a chunk whose history holds more than K pages attends K history pages
// drawn at random (seeded; what the mean-score selection gives on random weights spreads about as
// evenly) plus its chunk causally; FLOPs then count the pairs each query attends, exactly.
//
// usage: oomb-bench-attn [--seq 8192,32768,131072] [--chunk 4096] [--page 128] [--heads 28]
//                        [--kv-heads 4] [--dim 128] [--reps 3] [--no-shuffle] [--fwd-only]
//                        [--recompute-lse] [--sparse K]
// Kernel variants for tuning: the OOMB_PAGED_ATTN_* overrides of oomb_paged_attn_config (cuda/paged-attn.cuh),
// read once per process by oomb_paged_attn_config_from_env.

#include "oomb.h"
#include "cuda/common.cuh"
#include "cuda/paged-attn.cuh"
#include "bench/cuda-bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>


static std::vector<int64_t> parse_list(const char * s) {
    std::vector<int64_t> v;
    std::string str(s);
    size_t b = 0;
    while (b < str.size()) {
        size_t e = str.find(',', b);
        if (e == std::string::npos) e = str.size();
        v.push_back(std::stoll(str.substr(b, e - b)));
        b = e + 1;
    }
    return v;
}

// fills n floats with a repeated block of uniform random values in [lo, hi)
static void fill_random(float * dev, size_t n, float lo, float hi, uint32_t seed) {
    const size_t blk = std::min<size_t>(n, (size_t) 1 << 22);
    std::vector<float> h(blk);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    for (auto & x : h) x = u(rng);
    CK(cudaMemcpy(dev, h.data(), blk * sizeof(float), cudaMemcpyHostToDevice));
    for (size_t off = blk; off < n; off += blk) CK(cudaMemcpy(dev + off, dev, std::min(blk, n - off) * sizeof(float), cudaMemcpyDeviceToDevice));
}

int main(int argc, char ** argv) {
    std::vector<int64_t> seqs = {8192, 32768, 131072};
    int64_t chunk = 4096, page = 128, H = 28, Hkv = 4, D = 128;
    int reps = 3;
    bool shuffle = true;
    bool fwd_only = false;
    bool recompute_lse = false;
    int64_t sparse_k = 0;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() { if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); } return argv[++i]; };
        if (a == "--help" || a == "-h") {
            printf("usage: oomb-bench-attn [--seq 8192,32768,131072] [--chunk 4096] [--page 128] [--heads 28] [--kv-heads 4]\n"
                   "                       [--dim 128] [--reps 3] [--no-shuffle] [--fwd-only] [--recompute-lse] [--sparse K]\n"
                   "Paged attention over a causal sequence, chunk by chunk (forward, then backward in reverse), on the\n"
                   "first CUDA device; one JSON line per sequence length (ms and TFLOP/s, FlashAttention's FLOP count).\n"
                   "--sparse K: page lists, K random history pages per query tile once a chunk's history passes K\n"
                   "pages (FLOPs: the pairs attended, counted exactly).\n"
                   "Kernel variants: the OOMB_PAGED_ATTN_* variables (cuda/paged-attn.cuh).\n");
            return 0;
        }
        if (a == "--seq") seqs = parse_list(next());
        else if (a == "--chunk") chunk = atoll(next());
        else if (a == "--page") page = atoll(next());
        else if (a == "--heads") H = atoll(next());
        else if (a == "--kv-heads") Hkv = atoll(next());
        else if (a == "--dim") D = atoll(next());
        else if (a == "--reps") reps = atoi(next());
        else if (a == "--no-shuffle") shuffle = false;
        else if (a == "--fwd-only") fwd_only = true;
        else if (a == "--recompute-lse") recompute_lse = true;
        else if (a == "--sparse") sparse_k = atoll(next());
        else { fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
    }
    if (sparse_k < 0 || (sparse_k > 0 && (chunk <= 0 || page <= 0 || chunk % page != 0))) {
        fprintf(stderr, "--sparse must be >= 0, and with --sparse --chunk a positive multiple of --page\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    oomb_cuda_ctx cctx;  // the kernels' context: the stream, scratch slots grown on demand
    cctx.stream = stream;
    const float scale = 1.0f / std::sqrt((float) D);

    for (int64_t S : seqs) {
        const int64_t n_pages = (S + page - 1) / page;
        const int64_t n_chunks = (S + chunk - 1) / chunk;
        float *q, *kc, *vc, *dout, *out, *back, *dkp, *dvp;
        uint16_t *kp, *vp;
        int32_t *pt, *pos;
        const size_t nq = (size_t) S * H * D, nkv = (size_t) S * Hkv * D, npool = (size_t) n_pages * page * Hkv * D;
        CK(cudaMalloc(&q, nq * 4));
        CK(cudaMalloc(&dout, nq * 4));
        CK(cudaMalloc(&kc, nkv * 4));
        CK(cudaMalloc(&vc, nkv * 4));
        // one packed forward result per chunk: out [D, H, chunk], then the LSE of each row
        const size_t n_packed = (size_t) chunk * H * (D + 1);
        CK(cudaMalloc(&out, n_chunks * n_packed * 4));
        CK(cudaMalloc(&back, (size_t) chunk * (H + 2 * Hkv) * D * 4));
        CK(cudaMalloc(&kp, npool * 2));
        CK(cudaMalloc(&vp, npool * 2));
        CK(cudaMalloc(&dkp, npool * 4));
        CK(cudaMalloc(&dvp, npool * 4));
        CK(cudaMalloc(&pt, n_pages * 4));
        CK(cudaMalloc(&pos, S * 4));
        fill_random(q, nq, -2.0f, 2.0f, 1);
        fill_random(dout, nq, -1.0f, 1.0f, 2);
        fill_random(kc, nkv, -1.0f, 1.0f, 3);
        fill_random(vc, nkv, -1.0f, 1.0f, 4);
        CK(cudaMemset(kp, 0, npool * 2));
        CK(cudaMemset(vp, 0, npool * 2));
        CK(cudaMemset(dkp, 0, npool * 4));
        CK(cudaMemset(dvp, 0, npool * 4));
        {
            std::vector<int32_t> h(n_pages);
            std::iota(h.begin(), h.end(), 0);
            if (shuffle) std::shuffle(h.begin(), h.end(), std::mt19937(5));
            CK(cudaMemcpy(pt, h.data(), n_pages * 4, cudaMemcpyHostToDevice));
            std::vector<int32_t> p(S);
            std::iota(p.begin(), p.end(), 0);
            CK(cudaMemcpy(pos, p.data(), S * 4, cudaMemcpyHostToDevice));
        }

        oomb_context * ctx = oomb_init({0, true});
        oomb_tensor * t_kp = oomb_new_tensor_4d(ctx, OOMB_TYPE_BF16, D, Hkv, page, n_pages);
        oomb_tensor * t_vp = oomb_new_tensor_4d(ctx, OOMB_TYPE_BF16, D, Hkv, page, n_pages);
        oomb_tensor * t_dkp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, D, Hkv, page, n_pages);
        oomb_tensor * t_dvp = oomb_new_tensor_4d(ctx, OOMB_TYPE_F32, D, Hkv, page, n_pages);
        oomb_tensor * t_pt = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, n_pages);
        t_kp->data = kp; t_vp->data = vp; t_dkp->data = dkp; t_dvp->data = dvp; t_pt->data = pt;
        std::vector<oomb_tensor *> fwd, bwd;
        std::vector<void *> list_bufs;  // device memory of the page lists (--sparse)
        double pairs = 0.0;             // (query, key) pairs attended per head
        bool any_sparse = false;        // some chunk ran page lists (else the FLOPs are the dense count)
        std::mt19937 lrng(7);
        for (int64_t c = 0; c < n_chunks; c++) {
            const int64_t t0 = c * chunk, T = std::min(chunk, S - t0);
            oomb_tensor * tq = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
            oomb_tensor * tdo = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, H, T);
            oomb_tensor * tkc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
            oomb_tensor * tvc = oomb_new_tensor_3d(ctx, OOMB_TYPE_F32, D, Hkv, T);
            oomb_tensor * tpos = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, T);
            tq->data = q + t0 * H * D; tdo->data = dout + t0 * H * D;
            tkc->data = kc + t0 * Hkv * D; tvc->data = vc + t0 * Hkv * D;
            tpos->data = pos + t0;
            const int64_t c0 = t0 / page;  // history pages
            oomb_paged_attn_args pa{};
            pa.q = tq; pa.k_cur = tkc; pa.v_cur = tvc; pa.k_pages = t_kp; pa.v_pages = t_vp; pa.page_table = t_pt; pa.pos = tpos;
            pa.schedule = oomb_schedule_dense();
            pa.scale = scale; pa.store = 1;
            pairs += (double) T * t0 + (double) T * (T + 1) / 2;
            if (sparse_k > 0 && c0 > sparse_k) {
                const int64_t nqt = (T + page - 1) / page;
                std::vector<int32_t> off(nqt + 1), pg, ioff(c0 + 1), iqt;
                std::vector<int32_t> all(c0);
                std::iota(all.begin(), all.end(), 0);
                for (int64_t j = 0; j < nqt; j++) {
                    off[j] = (int32_t) pg.size();
                    for (int64_t i = 0; i < sparse_k; i++) std::swap(all[i], all[i + lrng() % (c0 - i)]);  // K distinct pages
                    std::vector<int32_t> pick(all.begin(), all.begin() + sparse_k);
                    std::sort(pick.begin(), pick.end());
                    pg.insert(pg.end(), pick.begin(), pick.end());
                }
                off[nqt] = (int32_t) pg.size();
                iqt.resize(pg.size());
                oomb_schedule_invert(off.data(), nqt, pg.data(), c0, ioff.data(), iqt.data());
                oomb_tensor * lt[4];
                const std::vector<int32_t> * hv[4] = {&off, &pg, &ioff, &iqt};
                for (int i = 0; i < 4; i++) {
                    void * d = nullptr;
                    CK(cudaMalloc(&d, hv[i]->size() * 4));
                    CK(cudaMemcpy(d, hv[i]->data(), hv[i]->size() * 4, cudaMemcpyHostToDevice));
                    list_bufs.push_back(d);
                    lt[i] = oomb_new_tensor_1d(ctx, OOMB_TYPE_I32, (int64_t) hv[i]->size());
                    lt[i]->data = d;
                }
                pa.schedule = oomb_schedule_lists(lt[0], lt[1], lt[2], lt[3]);
                any_sparse = true;
                pairs -= (double) T * (t0 - sparse_k * page);
            }
            // the op's node is the packed one (the view oomb_paged_attn_ext returns is its out part)
            oomb_tensor * f = oomb_paged_attn_ext(ctx, &pa)->view_src;
            f->data = out + c * n_packed;
            oomb_paged_attn_args pb = pa;
            pb.k_cur = pb.v_cur = nullptr; pb.store = 0;
            pb.dout = tdo; pb.fwd = recompute_lse ? nullptr : f; pb.dk_pages = t_dkp; pb.dv_pages = t_dvp;
            oomb_tensor * b = oomb_paged_attn_back_ext(ctx, &pb);
            b->data = back;
            fwd.push_back(f);
            bwd.push_back(b);
        }
        auto run_fwd = [&]() { for (oomb_tensor * f : fwd) oomb_cuda_paged_attn(cctx, f); };
        auto run_bwd = [&]() { for (auto it = bwd.rbegin(); it != bwd.rend(); ++it) oomb_cuda_paged_attn_back(cctx, *it); };
        run_fwd();
        if (!fwd_only) run_bwd();
        CK(cudaStreamSynchronize(stream));

        auto time = [&](auto fn) { return cuda_time_ms(stream, reps, fn); };
        const double fwd_ms = time(run_fwd);
        const double bwd_ms = fwd_only ? 0.0 : time(run_bwd);
        CK(cudaGetLastError());
        // sanity: the last chunk's output (and its LSE) must be finite
        {
            const int64_t T_last = S - (n_chunks - 1) * chunk;
            std::vector<float> h((size_t) T_last * H * (D + 1));
            CK(cudaMemcpy(h.data(), out + (n_chunks - 1) * n_packed, h.size() * 4, cudaMemcpyDeviceToHost));
            for (float x : h) if (!std::isfinite(x)) { fprintf(stderr, "non-finite output at S=%lld\n", (long long) S); exit(1); }
        }
        // dense: FlashAttention's causal count; sparse: the pairs attended
        const double flop_fwd = any_sparse ? 4.0 * pairs * H * D : 2.0 * (double) S * S * H * D;
        printf("{\"seq\": %lld, \"chunk\": %lld, \"page\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"dim\": %lld, "
               "\"sparse\": %lld, \"keys_per_query\": %.0f, \"lse\": \"%s\", \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwdbwd_ms\": %.3f, \"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f, \"fwdbwd_tflops\": %.1f}\n",
               (long long) S, (long long) chunk, (long long) page, (long long) H, (long long) Hkv, (long long) D, (long long) sparse_k,
               pairs / (double) S, recompute_lse ? "recompute" : "saved", fwd_ms, bwd_ms,
               fwd_ms + bwd_ms, flop_fwd / fwd_ms * 1e-9, fwd_only ? 0.0 : 2.5 * flop_fwd / bwd_ms * 1e-9,
               fwd_only ? 0.0 : 3.5 * flop_fwd / (fwd_ms + bwd_ms) * 1e-9);
        fflush(stdout);
        oomb_free(ctx);
        for (void * p : list_bufs) CK(cudaFree(p));
        for (void * p : {(void *) q, (void *) dout, (void *) kc, (void *) vc, (void *) out, (void *) back, (void *) kp, (void *) vp,
                         (void *) dkp, (void *) dvp, (void *) pt, (void *) pos})
            CK(cudaFree(p));
    }
    CK(cudaStreamDestroy(stream));
    return 0;
}
