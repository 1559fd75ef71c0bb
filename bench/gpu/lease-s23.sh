#!/usr/bin/env bash
# Session 23 on the GPU machine (2026-12-07): the figures of sessions 20-22 that no GPU has run yet
# (the H200 was refused through sessions 21-22).
# The runs go in the background (setsid: longer than one 10-minute command); every call tars the results so far into
# $OUT/s23.tgz (a call brings back at most 8 files).
#   start h200   on the H200: test-cuda-ops, test-cuda-backend; the 0.5B one chunk of 32K (6 steps), HF + SDPA, the 0.5B
#                again (the issue-16 ratio), one profiled (steps 2-4); 7B --trainable linear sparse 64 at 128K (issue 13), 7B dense 128K (issue 16's
#                40 s); FULL=1 then test-cuda-paged-attn
#   start h100   on an H100: test-cuda-ops, test-cuda-backend (paged attention unchanged since s22's pass); the 0.5B one chunk of 32K twice and profiled;
#                (then profiled with OOMB_CUDA_LT_TUNE=1: do the epilogue GEMMs' algorithms explain their per-call times?)
#                Qwen2.5-3B sparse 64 at 128K (the memory plan with the LM-head scratch against the GPU's use)
#   start ratio  the H200 mode's first part alone (the tests, the 0.5B, HF + SDPA, the 0.5B)
#   start quick  any card, little device time left: the tests, the profiled 0.5B, the 3B plan check
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
#   fixtures     test-cuda-qwen2 against the HF fixtures (carry build-carry alone; after the background run is done)
usage="usage: $0 start h200|h100|ratio|quick | wait [S] | fixtures"
case ${1:-} in start|wait|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
export OFF="OOMB_CUDA_FUSE_EPI=0 OOMB_OPT_NORM_GROUP=1 OOMB_CUDA_ADAMW_VEC=0 OOMB_CUDA_FUSE_NORM=0"
OUT0=${OUT:-out}
export OUT=/tmp/keep/res   # R of lease-lib.sh: kept on the machine between calls, tarred into $OUT0 each call
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05n, hf, s7b, s3b, lease_head, bg_start, bg_wait
lease_head s23 "$@"
cat > $K/run.sh <<EOF
cd $PWD
export OUT=$R OFF="$OFF"
source bench/gpu/lease-lib.sh
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
rand_ids
log start
case $2 in
h200)
    tests test-cuda-ops:300 test-cuda-backend:150
    r05n new 6; hf; r05n new2 6
    r05n prof 4 OOMB_CUDA_PROFILE=2
    s7b new
    r7b new
    [ -n "\${FULL:-}" ] && tests test-cuda-paged-attn:300 ;;
ratio)
    tests test-cuda-ops:300 test-cuda-backend:150
    r05n new 6; hf; r05n new2 6 ;;
quick)
    tests test-cuda-ops:300 test-cuda-backend:150
    r05n prof 4 OOMB_CUDA_PROFILE=2
    s3b new ;;
h100)
    tests test-cuda-ops:300 test-cuda-backend:150
    r05n new 6; r05n new2 6
    r05n prof 4 OOMB_CUDA_PROFILE=2
    s3b new
    r05n proftune 4 OOMB_CUDA_PROFILE=2 OOMB_CUDA_LT_TUNE=1 ;;
esac
log end
EOF
bg_start $K/run.sh
bg_wait ${3:-480}
