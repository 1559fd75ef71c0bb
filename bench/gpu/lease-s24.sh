#!/usr/bin/env bash
# Session 24 on the GPU machine (2026-12-07, second session): what sessions 21-23 could not measure (the H200 refused),
# plus a sweep of the head-dim-64 attention settings at the 0.5B one-chunk shape (the kernels' choices were last swept
# before the dQ accumulator of version 19 changed the backward).
# The runs go in the background (setsid: longer than one 10-minute command); every call tars the results so far into
# $OUT/s24.tgz (a call brings back at most 8 files).
#   start h200   the tests (with test-cuda-paged-attn: the backward's split rule changed); the issue-16 ratio (0.5B one chunk
#                of 32K, 6 steps, new; HF + SDPA; old = OLD below; new again); 7B --trainable linear sparse 64 at 128K
#                (issue 13); 7B dense 128K new and old (the cuBLASLt rule changes its epilogue products)
#   start h200q  h200 without the tests and the old 7B dense step (little device time left)
#   start h200r  the ratio (new, HF, old) and the 7B sparse step only
#   start h100   the tests, the 0.5B new / old twice, Qwen2.5-3B sparse 64 at 128K new / old, a profiled 0.5B run
#   start first  what the session's first H100 call ran (binaries of c5a2e6e): the tests, a sweep of the head-dim-64
#                attention settings at one chunk of 32K (sweep64), the 0.5B, profiled, and with OOMB_CUDA_LT_TUNE=2
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
#   fixtures     test-cuda-qwen2 against the HF fixtures (carry build-carry alone; after the background run is done)
usage="usage: $0 start h200|h200q|h200r|h100|first | wait [S] | fixtures"
case ${1:-} in start|wait|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
OUT0=${OUT:-out}
export OUT=/tmp/keep/res   # R of lease-lib.sh: kept on the machine between calls, tarred into $OUT0 each call
source "$(dirname "$0")/lease-lib.sh"
lease_head s24 "$@"
cat > $K/run.sh <<EOF
cd $PWD
export OUT=$R
# the A/B's old settings: the backward unsplit at one chunk (as before 2026-12-07's rule), the heuristic's first algorithm
OLD="OOMB_PAGED_ATTN_SPLIT=1 OOMB_CUDA_LT_RULE=0"
source bench/gpu/lease-lib.sh
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
# sweep64: oomb-bench-attn on the 0.5B layer (14 / 2 heads, head dim 64) at one chunk of 32K, one process per setting
sweep64() {
    S="--seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64 --reps 3"
    for set in "base=" "kvr0=OOMB_PAGED_ATTN_BWDKVR=0" "pipe0=OOMB_PAGED_ATTN_BWDPIPE=0" "pipe0occ=OOMB_PAGED_ATTN_BWDPIPE=0 OOMB_PAGED_ATTN_OCC64=2" \
               "split2=OOMB_PAGED_ATTN_SPLIT=2" "split3=OOMB_PAGED_ATTN_SPLIT=3" "wg3=OOMB_PAGED_ATTN_FWDWG3=1" "ws2=OOMB_PAGED_ATTN_FWDWS=2" \
               "ws3=OOMB_PAGED_ATTN_FWDWS=3" "ws0=OOMB_PAGED_ATTN_FWDWS=0" "base2="; do
        lab=\${set%%=*}; e=\${set#*=}
        env \$e timeout 120 $B/oomb-bench-attn \$S > $R/sweep64-\$lab.log 2>&1
        echo "sweep64 \$lab rc=\$? \$(grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' $R/sweep64-\$lab.log | tr '\n' ' ')"
    done
}
rand_ids
log start
case $2 in
h200)
    tests test-cuda-ops:300 test-cuda-backend:150 test-cuda-paged-attn:300
    r05n new 6; hf; r05n old 6 \$OLD; r05n new2 6
    s7b new
    r7b new
    r7b old \$OLD ;;
h200r)  # less still: test-cuda-backend (its new cases), the ratio and the 7B sparse step
    tests test-cuda-backend:150
    r05n new 6; hf; r05n old 6 \$OLD
    s7b new ;;
h200q)  # little device time left: the same without the tests (run on an H100 with these binaries) and the old 7B
    r05n new 6; hf; r05n old 6 \$OLD; r05n new2 6
    s7b new
    r7b new ;;
h100)
    tests test-cuda-ops:300 test-cuda-backend:150 test-cuda-paged-attn:300
    r05n new 6; r05n old 6 \$OLD; r05n new2 6; r05n old2 6 \$OLD
    s3b new; s3b old \$OLD
    r05n prof 4 OOMB_CUDA_PROFILE=2 ;;
first)  # the first H100 call of this session (binaries of c5a2e6e)
    tests test-cuda-ops:300 test-cuda-backend:150; [ -x $B/test-cuda-linear-ce ] && tests test-cuda-linear-ce:200
    sweep64
    r05n new 6
    r05n prof 4 OOMB_CUDA_PROFILE=2
    r05n tune2 4 OOMB_CUDA_PROFILE=2 OOMB_CUDA_LT_TUNE=2 ;;
esac
log end
EOF
bg_start $K/run.sh
bg_wait ${3:-480}
