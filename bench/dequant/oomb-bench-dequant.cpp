// Dequantize benchmark (CUDA, issue 14): oomb_cuda_dequantize_rows on a [K, M] weight of a block
// type into bf16 (and f32), GB/s of output written, beside the bf16 cuBLAS GEMM that the
// dequantized operand feeds (C[M, N] = W[M, K] . X[K, N], N tokens), so that the two times compare
// directly. The weight is real quantized data (oomb::quantize_blocks of random rows, repeated), and
// a sample of rows is checked bit for bit against the CPU's dequantization before timing.
//
// usage: oomb-bench-dequant [--k 3584] [--m 18944] [--n 2048] [--types q4_k,q6_k] [--reps 20]
// Prints one JSON line per type. Built by bench/dequant/build.sh (not part of the CMake build).

#include "oomb.h"
#include "cuda/dequant.cuh"
#include "formats/quants.h"
#include "formats/quantize.h"
#include "bench/cuda-bench.h"

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// warm-up run, then the median of `reps`
template <typename F> static double time_ms(cudaStream_t s, int reps, F f) {
    f();
    return cuda_time_ms(s, reps, f);
}

int main(int argc, char ** argv) {
    int64_t K = 3584, M = 18944, N = 2048;
    int reps = 20;
    std::vector<std::string> types = {"q4_k", "q6_k"};
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() { if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); } return argv[++i]; };
        if (a == "--k") K = atoll(next());
        else if (a == "--m") M = atoll(next());
        else if (a == "--n") N = atoll(next());
        else if (a == "--reps") reps = atoi(next());
        else if (a == "--types") {
            types.clear();
            std::string s = next();
            for (size_t b = 0, e; b <= s.size(); b = e + 1) { e = s.find(',', b); if (e == std::string::npos) e = s.size(); types.push_back(s.substr(b, e - b)); }
        } else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
    }
    oomb_cuda_ctx c;
    CK(cudaStreamCreate(&c.stream));
    cublasHandle_t cublas;
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    cublasSetStream(cublas, c.stream);

    // bf16 GEMM of the same weight: C[M, N] = W[M, K] . X[K, N] (column-major: W^T stored as [K, M])
    void *w16, *x16, *c16;
    CK(cudaMalloc(&w16, (size_t) M * K * 2));
    CK(cudaMalloc(&x16, (size_t) K * N * 2));
    CK(cudaMalloc(&c16, (size_t) M * N * 2));
    CK(cudaMemset(w16, 0x3c, (size_t) M * K * 2));
    CK(cudaMemset(x16, 0x3c, (size_t) K * N * 2));
    const float one = 1.0f, zero = 0.0f;
    const double gemm_ms = time_ms(c.stream, reps, [&]() {
        cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int) M, (int) N, (int) K, &one, w16, CUDA_R_16BF, (int) K, x16, CUDA_R_16BF, (int) K,
                     &zero, c16, CUDA_R_16BF, (int) M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    CK(cudaGetLastError());

    for (const std::string & tn : types) {
        oomb_type t = OOMB_TYPE_COUNT;
        for (int i = 0; i < OOMB_TYPE_COUNT; i++) if (oomb_type_is_quantized((oomb_type) i) && tn == oomb_type_name((oomb_type) i)) t = (oomb_type) i;
        if (t == OOMB_TYPE_COUNT) { fprintf(stderr, "unknown block type %s\n", tn.c_str()); return 2; }
        const uint32_t gt = oomb_type_to_ggml(t);
        const int64_t bs = oomb_blck_size(t);
        if (K % bs) { fprintf(stderr, "K = %lld is not a multiple of %s's block size %lld\n", (long long) K, tn.c_str(), (long long) bs); return 2; }
        const size_t row_bytes = (size_t) (K / bs) * oomb_type_size(t);
        // 64 random rows, quantized, repeated over the M rows
        const int64_t R = std::min<int64_t>(64, M);
        std::vector<float> xf((size_t) R * K);
        std::mt19937 rng(7);
        std::normal_distribution<float> nd(0.0f, 0.02f);
        for (float & v : xf) v = nd(rng);
        std::vector<uint8_t> q((size_t) R * row_bytes);
        std::string err;
        if (!oomb::quantize_type_supported(gt) || oomb::quantize_blocks(gt, xf.data(), q.data(), R * K, 0, &err) != oomb::GGUF_OK) {
            fprintf(stderr, "cannot quantize to %s here (oomb::quantize_blocks: Q5_0, Q4_K, Q5_K, Q6_K) %s\n", tn.c_str(), err.c_str());
            return 2;
        }
        uint8_t * dq;
        void * out;
        CK(cudaMalloc(&dq, (size_t) M * row_bytes));
        CK(cudaMalloc(&out, (size_t) M * K * 4));
        for (int64_t r = 0; r < M; r += R) CK(cudaMemcpy(dq + (size_t) r * row_bytes, q.data(), (size_t) std::min(R, M - r) * row_bytes, cudaMemcpyHostToDevice));
        // check rows [0, R) against the CPU, f32 and bf16 (oomb_fp32_to_bf16), bit for bit
        std::vector<float> ref((size_t) R * K), got((size_t) R * K);
        oomb::dequantize_blocks(gt, q.data(), ref.data(), R * K / bs);
        oomb_cuda_dequantize_rows(c, t, dq, row_bytes, M, K, out, OOMB_TYPE_F32);
        CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (size_t i = 0; i < ref.size(); i++) bad += memcmp(&ref[i], &got[i], 4) != 0;
        std::vector<uint16_t> got16((size_t) R * K);
        oomb_cuda_dequantize_rows(c, t, dq, row_bytes, M, K, out, OOMB_TYPE_BF16);
        CK(cudaMemcpy(got16.data(), out, got16.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < ref.size(); i++) bad += oomb_fp32_to_bf16(ref[i]) != got16[i];
        const double bf_ms = time_ms(c.stream, reps, [&]() { oomb_cuda_dequantize_rows(c, t, dq, row_bytes, M, K, out, OOMB_TYPE_BF16); });
        const double f32_ms = time_ms(c.stream, reps, [&]() { oomb_cuda_dequantize_rows(c, t, dq, row_bytes, M, K, out, OOMB_TYPE_F32); });
        CK(cudaGetLastError());
        const double nel = (double) M * K, in_b = (double) M * row_bytes;
        printf("{\"type\": \"%s\", \"K\": %lld, \"M\": %lld, \"mismatches\": %lld, \"bf16_ms\": %.4f, \"bf16_out_GBps\": %.1f, \"bf16_in+out_GBps\": %.1f, "
               "\"f32_ms\": %.4f, \"f32_out_GBps\": %.1f, \"gemm_bf16_N\": %lld, \"gemm_bf16_ms\": %.4f, \"gemm_TFLOPs\": %.1f, \"dequant_over_gemm\": %.3f}\n",
               tn.c_str(), (long long) K, (long long) M, (long long) bad, bf_ms, nel * 2 / bf_ms / 1e6, (nel * 2 + in_b) / bf_ms / 1e6, f32_ms,
               nel * 4 / f32_ms / 1e6, (long long) N, gemm_ms, 2.0 * M * N * K / gemm_ms / 1e9, bf_ms / gemm_ms);
        fflush(stdout);
        CK(cudaFree(dq));
        CK(cudaFree(out));
    }
    CK(cudaFree(w16));
    CK(cudaFree(x16));
    CK(cudaFree(c16));
    cublasDestroy(cublas);
    return 0;
}
