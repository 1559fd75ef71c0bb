#!/usr/bin/env bash
# Builds the attention benchmark driver against a CUDA build of the library (default build-pattn,
# configured as in bench/NOTES.md: static OpenBLAS/PCRE2/utf8proc so the binaries run on the GPU
# machine, which lacks those packages). The library's CMake does not glob bench/attention.
set -euo pipefail
B=${1:-build-pattn}
cd "$(dirname "$0")/../.."
cmake --build "$B" -j2 --target oomb
L=/usr/lib/x86_64-linux-gnu
CUDA=${CUDA_HOME:-/usr/local/cuda}
g++ -O2 -std=c++17 -I. -Iggml-oomb -I"$CUDA/include" bench/attention/oomb-bench-attn.cpp "$B/lib/liboomb.a" \
    -L"$CUDA/lib64" -lcudart -lcublas -lcublasLt \
    $L/libopenblas.a $L/libpcre2-8.a $L/libutf8proc.a -l:libgfortran.a -l:libquadmath.a -lpthread -lm \
    -o "$B/bin/oomb-bench-attn"
echo "built $B/bin/oomb-bench-attn"
