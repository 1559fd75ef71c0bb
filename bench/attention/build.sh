#!/usr/bin/env bash
# Builds the attention benchmark driver against a CUDA build of the library (default build-pattn,
# configured as in bench/NOTES.md): bench/cuda-bench-build.sh (--nvcc: the driver includes cuda/common.cuh).
exec "$(dirname "$0")/../cuda-bench-build.sh" --nvcc bench/attention/oomb-bench-attn.cpp "${1:-build-pattn}"
