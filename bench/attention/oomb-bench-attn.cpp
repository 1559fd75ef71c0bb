// Paged flash attention benchmark (CUDA): a whole causal sequence of S tokens processed chunk by
// chunk against the paged history, as OOMB's chunk-recurrent training runs it: forward over the
// chunks in order (each chunk stores its K/V into the pages, store = 1), backward over the chunks in
// reverse order (dq, dK/dV accumulated into the f32 gradient pages). Prints one JSON line per
// sequence length. FLOPs as FlashAttention counts them: causal forward 2*S^2*H*D, forward+backward
// 3.5 times that. Each chunk's forward keeps its out and row log-sum-exp (the op's packed node) and
// its backward reads them; --recompute-lse makes the backward recompute them instead (fwd = NULL,
// the op before version 4 in bench/NOTES.md).
//
// usage: oomb-bench-attn [--seq 8192,32768,131072] [--chunk 4096] [--page 128] [--heads 28]
//                        [--kv-heads 4] [--dim 128] [--reps 3] [--no-shuffle] [--fwd-only]
//                        [--recompute-lse]
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
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() { if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); } return argv[++i]; };
        if (a == "--help" || a == "-h") {
            printf("usage: oomb-bench-attn [--seq 8192,32768,131072] [--chunk 4096] [--page 128] [--heads 28] [--kv-heads 4]\n"
                   "                       [--dim 128] [--reps 3] [--no-shuffle] [--fwd-only] [--recompute-lse]\n"
                   "Paged attention over a causal sequence, chunk by chunk (forward, then backward in reverse), on the\n"
                   "first CUDA device; one JSON line per sequence length (ms and TFLOP/s, FlashAttention's FLOP count).\n"
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
        else { fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
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
            // the op's node is the packed one (the view oomb_paged_attn returns is its out part)
            oomb_tensor * f = oomb_paged_attn(ctx, tq, tkc, tvc, t_kp, t_vp, t_pt, tpos, scale, 1)->view_src;
            f->data = out + c * n_packed;
            oomb_tensor * b = oomb_paged_attn_back(ctx, tq, t_kp, t_vp, t_dkp, t_dvp, t_pt, tpos, tdo, recompute_lse ? nullptr : f, scale);
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
        const double flop_fwd = 2.0 * (double) S * S * H * D;
        printf("{\"seq\": %lld, \"chunk\": %lld, \"page\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"dim\": %lld, "
               "\"lse\": \"%s\", \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwdbwd_ms\": %.3f, \"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f, \"fwdbwd_tflops\": %.1f}\n",
               (long long) S, (long long) chunk, (long long) page, (long long) H, (long long) Hkv, (long long) D, recompute_lse ? "recompute" : "saved", fwd_ms, bwd_ms,
               fwd_ms + bwd_ms, flop_fwd / fwd_ms * 1e-9, fwd_only ? 0.0 : 2.5 * flop_fwd / bwd_ms * 1e-9,
               fwd_only ? 0.0 : 3.5 * flop_fwd / (fwd_ms + bwd_ms) * 1e-9);
        fflush(stdout);
        oomb_free(ctx);
        for (void * p : {(void *) q, (void *) dout, (void *) kc, (void *) vc, (void *) out, (void *) back, (void *) kp, (void *) vp,
                         (void *) dkp, (void *) dvp, (void *) pt, (void *) pos})
            CK(cudaFree(p));
    }
    CK(cudaStreamDestroy(stream));
    return 0;
}
