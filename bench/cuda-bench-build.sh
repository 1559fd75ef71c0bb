#!/usr/bin/env bash
# Builds one standalone CUDA benchmark driver (bench/<dir>/oomb-bench-*.cpp: it includes the CUDA
# backend's internal headers, so the library's CMake does not glob it) against a CUDA build of the
# library, default build-pattn, configured as in bench/NOTES.md (static OpenBLAS/PCRE2/utf8proc so
# that the binary runs on the GPU machine, which lacks those packages).
# usage: bench/cuda-bench-build.sh [--nvcc] <source.cpp> [build-dir]  ->  <build-dir>/bin/<source name>
# --nvcc: compile the driver with nvcc (for drivers that include cuda/common.cuh, which holds device
# code), then link with g++ as the others.
set -euo pipefail
NVCC=0
if [ "${1:-}" = --nvcc ]; then NVCC=1; shift; fi
SRC=$1
B=${2:-build-pattn}
cd "$(dirname "$0")/.."
cmake --build "$B" -j2 --target oomb
L=/usr/lib/x86_64-linux-gnu
CUDA=${CUDA_HOME:-/usr/local/cuda}
NAME=$(basename "$SRC" .cpp)
INC="-I. -Isrc -Iggml-oomb -I$CUDA/include"
OBJ=$SRC
if [ $NVCC = 1 ]; then
    OBJ="$B/$NAME.o"
    "$CUDA/bin/nvcc" -O2 -std=c++17 -x cu -arch=sm_90a --expt-relaxed-constexpr $INC -c "$SRC" -o "$OBJ"
fi
g++ -O2 -std=c++17 $INC "$OBJ" "$B/lib/liboomb.a" \
    -L"$CUDA/lib64" -lcudart -lcublas -lcublasLt \
    $L/libopenblas.a $L/libpcre2-8.a $L/libutf8proc.a -l:libgfortran.a -l:libquadmath.a -lpthread -lm \
    -o "$B/bin/$NAME"
echo "built $B/bin/$NAME"
