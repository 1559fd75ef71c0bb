#!/usr/bin/env bash
# Builds the dequantize benchmark driver against a CUDA build of the library (default build-pattn,
# configured as in bench/NOTES.md): bench/cuda-bench-build.sh. Run: <build-dir>/bin/oomb-bench-dequant
exec "$(dirname "$0")/../cuda-bench-build.sh" --nvcc bench/dequant/oomb-bench-dequant.cpp "${1:-build-pattn}"
