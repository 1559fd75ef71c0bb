#!/usr/bin/env bash
# Session 26 on the GPU machine (2026-12-07, fourth session).
#   start h200   test-cuda-linear-ce (the backend's logits-block cap); the 0.5B one chunk of 32K, 6 steps: new (the memory plan
#                raises the LM head's block to up to 5 GiB where there is room) and old (OOMB_LCE_ROWS=2185: the 1.25 GiB default's
#                15 blocks), alternating, with HF + SDPA between; then Nsight Compute on the attention kernels (ncu-attn.sh)
#   start h100   the same without HF (it does not fit the 80 GB card)
#   start sm     the forward / backward softmax change (FFMA into exp2, no mask work in unmasked tiles): test-cuda-paged-attn; the
#                attention bench old / new alternating (oomb-bench-attn-old: the kernels before) on the 7B layer (32K chunk 4096, 128K
#                chunk 2048, sparse 64 at 128K chunk 2048) and the 0.5B layer (one chunk of 32K); the 0.5B step old / new (oomb-train-old)
#   start sm2    test-cuda-paged-attn-numerics and test-cuda-sparse (a second call: the carry's 64 MiB)
#   start h2s    on the H200 (needs_h200: the 7B steps), binaries of the softmax change: test-cuda-paged-attn; the 0.5B one chunk of 32K beside HF + SDPA; 7B --trainable linear dense 128K and sparse 64 at
#                128K; the attention table beside SDPA flash and cuDNN (bench_attn.py: 7B at 8K / 32K / 128K, 0.5B at 32K); the o
#                rescale skip against oomb-bench-attn-e9 (the kernels of e9ca806)
#   start h1s    h2s's H100 part (tests, the rescale skip's A/B, the attention table, the 0.5B step); h2q its H200 part;
#                h2r the tests, the ratio, the 7B steps and the skip's A/B at 7B 32K; h1t the tests and the skip's A/B;
#                h2m the ratio and the 7B sparse step only
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
usage="usage: $0 start h200|h100|sm|sm2|h2s|h1s|h2q|h2r|h1t|h2m | wait [S]"
case ${1:-} in start|wait) ;; *) echo "$usage"; exit 2 ;; esac
OUT0=${OUT:-out}
export OUT=/tmp/keep/res
source "$(dirname "$0")/lease-lib.sh"
lease_head s26 "$@"
cat > $K/run.sh <<EOF2
cd $PWD
export OUT=$R
OLD="OOMB_LCE_ROWS=2185"
source bench/gpu/lease-lib.sh
source bench/gpu/ncu-attn.sh
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
rand_ids
log start
case $2 in
h1s)  # the H100 part of h2s (the H200 refused): the tests, the rescale skip's A/B, the attention table, the 0.5B step
    tests test-cuda-paged-attn:300
    OLDBENCH=oomb-bench-attn-e9 abat 7b32k-skip --seq 32768 --chunk 4096
    OLDBENCH=oomb-bench-attn-e9 abat 05b32k-skip --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    attn
    r05n new 6
    log end; exit ;;
h1t)  # the H100 with little device time: the tests and the rescale skip's A/B
    tests test-cuda-paged-attn:300
    OLDBENCH=oomb-bench-attn-e9 abat 7b32k-skip --seq 32768 --chunk 4096
    OLDBENCH=oomb-bench-attn-e9 abat 05b32k-skip --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    log end; exit ;;
h2r)  # on the H200 with little device time: the tests, the ratio, the 7B steps, the rescale skip's A/B
    tests test-cuda-paged-attn:300
    r05n new 6; hf
    r7b new
    s7b new
    OLDBENCH=oomb-bench-attn-e9 abat 7b32k-skip --seq 32768 --chunk 4096
    log end; exit ;;
h2m)  # the H200 with very little device time: the ratio against HF and the 7B sparse step
    r05n new 6; hf
    s7b new
    log end; exit ;;
h2q)  # the H200 part: the ratio against HF and the 7B steps
    r05n new 6; hf
    s7b new
    r7b new
    log end; exit ;;
h2s)
    r05n new 6; hf
    r7b new
    s7b new
    attn
    # the rescale skip alone: against the binaries of e9ca806 (the softmax change without it)
    OLDBENCH=oomb-bench-attn-e9 abat 7b32k-skip --seq 32768 --chunk 4096
    OLDBENCH=oomb-bench-attn-e9 abat 05b32k-skip --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    tests test-cuda-paged-attn:300
    r05n new2 6
    log end; exit ;;
sm)
    tests test-cuda-paged-attn:300
    abat 7b32k --seq 32768 --chunk 4096
    abat 7b128k --seq 131072 --chunk 2048
    abat 05b32k --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    abat 7bsp64 --seq 131072 --chunk 2048 --sparse 64
    TRAIN_BIN=\$B/oomb-train-old r05n old 6; r05n new 6; TRAIN_BIN=\$B/oomb-train-old r05n old2 6; r05n new2 6
    log end; exit ;;
sm2)
    tar -xJf .devcarry/gpu-bins.tar.xz -C \$B && cat .devcarry/bins-commit.txt
    tests test-cuda-paged-attn-numerics:300 test-cuda-sparse:300
    log end; exit ;;
esac
tests test-cuda-linear-ce:200
case $2 in
h200) r05n new 6; grep -E "memory plan" \$R/05b-32k-1chunk-new.log; hf; r05n old 6 \$OLD; r05n new2 6; r05n old2 6 \$OLD ;;
h100) r05n new 6; grep -E "memory plan" \$R/05b-32k-1chunk-new.log; r05n old 6 \$OLD; r05n new2 6; r05n old2 6 \$OLD ;;
esac
log ncu
ncu_attn 32768
log end
EOF2
bg_start $K/run.sh
bg_wait ${3:-480}
