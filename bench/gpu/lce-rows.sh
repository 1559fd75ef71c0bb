#!/usr/bin/env bash
# The LM head's row blocks (cuda/linear-ce.cu, oomb_cuda_linear_ce_fused_rows) at the 0.5B one chunk of 32K: the default
# (1.25 GiB of [V, rows] f32 logits: 15 blocks of 2,185 rows) against OOMB_LCE_ROWS=4096 (8 blocks) and 8192 (4 blocks),
# twice each in alternation, profiled (OOMB_CUDA_PROFILE=1: the op's GPU time over steps 2-5) and the tok/s of steps 2-5.
# On the GPU machine: bash bench/gpu/lce-rows.sh (binaries in build-carry/gpu-bins.tar.xz, bench/gpu/pack.sh's format).
set -u
OUT0=${OUT:-out}
export OUT=$OUT0
source "$(dirname "$0")/lease-lib.sh"
[ -x $B/oomb-train ] || { tar -xJf build-carry/gpu-bins.tar.xz -C $B && cat build-carry/bins-commit.txt; } || exit 1
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
rand_ids
for rows in 0 4096 8192 0 4096 8192; do
    lab=rows$rows-$SECONDS
    r05n $lab 5 OOMB_CUDA_PROFILE=1 OOMB_LCE_ROWS=$rows
    grep -E "linear_cross_entropy_back|GPU time per op" $R/05b-32k-1chunk-$lab.log | head -2
done
