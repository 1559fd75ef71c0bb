#!/usr/bin/env bash
# Session 22 on the GPU machine (2026-12-06, fifth session): the figures of sessions 20-21 that no GPU has run yet.
# The runs go in the background (setsid: longer than one 10-minute command); every call tars the results so far into
# $OUT/s22.tgz (a call brings back at most 8 files).
#   start h200   on the H200: test-cuda-ops, test-cuda-backend; the 0.5B one chunk of 32K (6 steps), HF + SDPA, the 0.5B again (the issue-16 ratio);
#                7B --trainable linear sparse 64 at 128K (the issue-13 figure); (FULL=1: then the 0.5B with the norm's
#                two passes (OOMB_CUDA_NORM_ONEPASS=0), the 7B step with everything of session 21 off ($OFF), and
#                test-cuda-paged-attn)
#   start h100   on an H100: test-cuda-ops, test-cuda-backend; the 0.5B one chunk of 32K: new, with the timing of
#                cuBLASLt's candidates (OOMB_CUDA_LT_TUNE=1), with the norm's two passes (OOMB_CUDA_NORM_ONEPASS=0),
#                twice; Qwen2.5-3B sparse 64 at 128K new and $OFF
#   start ratio  the H200 mode's first part alone (the tests, the 0.5B, HF + SDPA, the 0.5B: the issue-16 ratio), for
#                a lease with little device time left
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
#   fixtures     test-cuda-qwen2 against the HF fixtures (carry build-carry alone; after the background run is done)
usage="usage: $0 start h200|h100|ratio | wait [S] | fixtures"
case ${1:-} in start|wait|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
export OFF="OOMB_CUDA_FUSE_EPI=0 OOMB_OPT_NORM_GROUP=1 OOMB_CUDA_ADAMW_VEC=0 OOMB_CUDA_FUSE_NORM=0"
OUT0=${OUT:-out}
export OUT=/tmp/keep/res   # R of lease-lib.sh: kept on the machine between calls, tarred into $OUT0 each call
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05n, hf, s7b, s3b, lease_head, bg_start, bg_wait
lease_head s22 "$@"
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
    s7b new
    if [ -n "\${FULL:-}" ]; then
        r05n twopass 6 OOMB_CUDA_NORM_ONEPASS=0
        s7b off \$OFF
        tests test-cuda-paged-attn:300
    fi ;;
ratio)
    tests test-cuda-ops:300 test-cuda-backend:150
    r05n new 6; hf; r05n new2 6 ;;
h100)
    tests test-cuda-ops:300 test-cuda-backend:150
    r05n new 6; r05n tune 6 OOMB_CUDA_LT_TUNE=1; r05n twopass 6 OOMB_CUDA_NORM_ONEPASS=0
    r05n new2 6; r05n tune2 6 OOMB_CUDA_LT_TUNE=1; r05n twopass2 6 OOMB_CUDA_NORM_ONEPASS=0
    s3b new
    s3b off \$OFF ;;
esac
log end
EOF
bg_start $K/run.sh
bg_wait ${3:-480}
