#!/usr/bin/env bash
# Ablation builds of the paged-attention kernels (bench/NOTES.md version 18): cuda/paged-attn.cu
# compiled with -DOOMB_PA_ABLATION=k (the hooks in paged-attn-wgmma.cuh; results are wrong, only the
# times mean something) into a copy of build-gpu's liboomb.a, linked with oomb-bench-attn:
#   backward: 1 no exp2 in the softmax, 2 no softmax at all, 3 no dQ adds (into dq or the
#   accumulator, config.bwd_dqacc), 4 no dQ product and no adds, 5 no dK / dV products; forward: 6 no
#   exp2 in the softmax, 7 no softmax at all
# (6 and 7 make the bench stop at its non-finite-output check: built on request only)
# usage: bench/attention/ablate.sh [build-dir] [k...]  ->  <build-dir>/bin/oomb-bench-attn-abl<k>
# build-dir: a CUDA build configured as in bench/NOTES.md ("Build for the GPU machine"), default
# build-pattn, with liboomb built (bench/attention/build.sh builds it and oomb-bench-attn.o)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-pattn}; shift || true
ks=${*:-1 2 3 4 5}
if [ ! -f "$B/CMakeCache.txt" ]; then
    echo "ablate.sh: $B is not a configured build directory (see bench/NOTES.md, 'Build for the GPU machine')" >&2
    exit 2
fi
CUDA=${CUDA_HOME:-/usr/local/cuda}
L=/usr/lib/x86_64-linux-gnu
W=$B/ablate; mkdir -p $W
bench/attention/build.sh $B   # liboomb and oomb-bench-attn.o up to date
for k in $ks; do
    "$CUDA/bin/nvcc" -DOOMB_USE_CUDA=1 -I. -Iggml-oomb -Imodels -Isrc -Icuda -isystem=$CUDA/include -O3 -DNDEBUG \
        --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC --expt-relaxed-constexpr -std=c++17 \
        -DOOMB_PA_ABLATION=$k -x cu -c cuda/paged-attn.cu -o $W/paged-attn.cu.o
    cp $B/lib/liboomb.a $W/liboomb-abl$k.a
    (cd $W && ar r liboomb-abl$k.a paged-attn.cu.o)
    g++ -O2 -std=c++17 -I. -Isrc -Iggml-oomb -I$CUDA/include $B/oomb-bench-attn.o $W/liboomb-abl$k.a \
        -L"$CUDA/lib64" -lcudart -lcublas -lcublasLt \
        $L/libopenblas.a $L/libpcre2-8.a $L/libutf8proc.a -l:libgfortran.a -l:libquadmath.a -lpthread -lm \
        -o $B/bin/oomb-bench-attn-abl$k
    echo "built $B/bin/oomb-bench-attn-abl$k"
done
