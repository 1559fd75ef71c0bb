#!/usr/bin/env bash
# Session 27 on the GPU machine (2026-12-07, fifth session): the backward's row tiles by bulk copies and the
# wgmma descriptors by one add (bench/NOTES.md "Session 27"). Binaries: .devcarry/gpu-bins.tar.xz (oomb-bench-attn,
# oomb-bench-attn-old: the kernels before, test-cuda-paged-attn, oomb-train); build-carry/gpu-bins.tar.xz (the other
# GPU tests, oomb-train-old), carried in a second call where the first's carry would pass 64 MiB.
#   start ab     test-cuda-paged-attn; the attention bench old / new alternating on the 7B layer (32K chunk 4096, 128K
#                chunk 2048, sparse 64 at 128K chunk 2048) and the 0.5B layer (one chunk of 32K)
#   start t2     (build-carry) test-cuda-paged-attn-numerics, test-cuda-sparse; the 0.5B step old / new
#   start h2     (H200, needs_h200: the 7B steps) the 0.5B one chunk of 32K beside HF + SDPA; 7B --trainable linear sparse
#                64 and dense at 128K; the attention table beside SDPA flash and cuDNN
#   start src    Nsight Compute's source counters on the backward (ncu_src: the 7B layer at 32K, and sparse 64 at 128K chunk 2048)
#   start h2s    h2, then src
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
usage="usage: $0 start ab|t2|h2|src|h2s | wait [S]"
case ${1:-} in start|wait) ;; *) echo "$usage"; exit 2 ;; esac
OUT0=${OUT:-out}
export OUT=/tmp/keep/res
source "$(dirname "$0")/lease-lib.sh"
lease_head s27 "$@"
cat > $K/run.sh <<EOF2
cd $PWD
export OUT=$R
source bench/gpu/lease-lib.sh
source bench/gpu/ncu-attn.sh
src() { ncu_src bwd7b32k pa_bwd_pipe_kernel; ncu_src bwdsp64 pa_bwd_pipe_kernel --seq 131072 --chunk 2048 --sparse 64; }
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
rand_ids
log start
case $2 in
ab)
    tests test-cuda-paged-attn:300
    abat 7b32k --seq 32768 --chunk 4096
    abat 7b128k --seq 131072 --chunk 2048
    abat 05b32k --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    abat 7bsp64 --seq 131072 --chunk 2048 --sparse 64 ;;
t2)
    tar -xJf build-carry/gpu-bins.tar.xz -C \$B && cat build-carry/bins-commit.txt
    tests test-cuda-paged-attn-numerics:300 test-cuda-sparse:300
    TRAIN_BIN=\$B/oomb-train-old r05n old 6; r05n new 6; TRAIN_BIN=\$B/oomb-train-old r05n old2 6; r05n new2 6 ;;
h2|h2s)
    r05n new 6; hf
    s7b new
    r7b new
    attn
    [ $2 = h2s ] && src ;;
src) src ;;
esac
log end
EOF2
bg_start $K/run.sh
bg_wait ${3:-480}
