#!/usr/bin/env bash
# Session 28 on the GPU machine (2026-12-07, sixth session): branch meta's backward (the row tiles' metadata a step
# ahead, the page-list search a bitmap word at a time; bench/NOTES.md "Session 27"), and what is owed to an H200.
#   start ab     (carry .devcarry: oomb-bench-attn of branch pp (meta's kernels, the ping-pong backward behind
#                OOMB_PAGED_ATTN_BWDPP=1), oomb-bench-attn-old of main's kernels, test-cuda-paged-attn, test-cuda-sparse)
#                the sparse-64 A/B, the dense A/B/x (x: the ping-pong backward, abat ABAT_ENV; the call of 22:04 named
#                its logs "pp"), the two tests, then the 0.5B layer and 128K; sparse 128 / 256 / 512 (new only)
#   start h2     (carry build-carry: oomb-train and oomb-bench-attn, hf_baseline.py; H200 with needs_h200 for the 7B
#                steps) the 0.5B one chunk of 32K beside HF + SDPA; 7B --trainable linear sparse 64 and dense at 128K;
#                the attention table beside SDPA flash and cuDNN
#   start h2e    h2 without the attention table (build-carry: oomb-train alone is enough)
#   start e05    the 0.5B one chunk of 32K beside HF + SDPA alone (build-carry; any card)
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
usage="usage: $0 start ab|h2|h2e|e05 | wait [S]"
case ${1:-} in start|wait) ;; *) echo "$usage"; exit 2 ;; esac
OUT0=${OUT:-out}
export OUT=/tmp/keep/res
source "$(dirname "$0")/lease-lib.sh"
if [ "${1:-}" = start ] && [ "${2:-}" = h2 -o "${2:-}" = h2e -o "${2:-}" = e05 ]; then
    tar -xJf build-carry/gpu-bins.tar.xz -C $B && cat build-carry/bins-commit.txt || exit 1
fi
lease_head s28 "$@"
cat > $K/run.sh <<EOF2
cd $PWD
export OUT=$R
source bench/gpu/lease-lib.sh
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD HF_PY=$PWD/build-carry/hf_baseline.py
rand_ids
log start
case $2 in
ab)
    abat 7bsp64 --seq 131072 --chunk 2048 --sparse 64
    export ABAT_ENV=OOMB_PAGED_ATTN_BWDPP=1  # (the third variant, x: the ping-pong backward)
    abat 7b32k --seq 32768 --chunk 4096
    # (the ping-pong kernel's cases are in Bf16PoolsKernelChoice: left out if its bench run hung)
    [ -f \$K/x-hung ] && export GTEST_FILTER=-CudaPagedAttn.Bf16PoolsKernelChoice
    tests test-cuda-paged-attn:300 test-cuda-sparse:200
    unset GTEST_FILTER
    abat 05b32k --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    abat 7b128k --seq 131072 --chunk 2048
    unset ABAT_ENV
    for sp in 128 256 512; do  # the page-list backward against the pages per query tile (per-block overhead: ~14 row tiles a block at 64)
        f=\$R/attn-sp\$sp.log; timeout 150 \$B/oomb-bench-attn --seq 131072 --chunk 2048 --sparse \$sp --reps 3 > \$f 2>&1
        echo "attn sparse \$sp rc=\$? \$(grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' \$f | tr '\n' ' ')"
    done ;;
e05)  # the 0.5B one chunk of 32K beside HF + SDPA alone (any card)
    r05n new 6; hf ;;
h2e)  # the end-to-end figures only, in order of need (a short budget)
    r05n new 6; hf
    s7b new
    r7b new ;;
h2)
    r05n new 6; hf
    s7b new
    r7b new
    attn ;;
esac
log end
EOF2
bg_start $K/run.sh
bg_wait ${3:-480}
