// Helpers of the standalone CUDA benchmark drivers (bench/attention, bench/dequant): a CUDA call
// check that exits, the median, and a timer of work queued on one stream (CUDA events around each
// repetition, median of the repetitions in milliseconds). Header-only: the drivers are built by
// bench/cuda-bench-build.sh, outside the CMake build.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(call)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median over `reps` runs of fn() (which queues work on `stream`), in milliseconds.
template <typename F> static double cuda_time_ms(cudaStream_t stream, int reps, F fn) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> ms;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, stream));
        fn();
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float x = 0;
        CK(cudaEventElapsedTime(&x, e0, e1));
        ms.push_back(x);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(ms);
}
