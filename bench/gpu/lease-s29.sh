#!/usr/bin/env bash
# Session 29 on the GPU machine (2026-12-08): what is owed to an H200 since session 27 (bench/NOTES.md "Session 27"
# has the predictions): binaries of main's kernels (build-carry/gpu-bins.tar.xz, bench/gpu/pack.sh's format).
#   start h2e    (carry build-carry; H200, needs_h200) the 0.5B one chunk of 32K beside HF + SDPA; 7B --trainable
#                linear sparse 64 and dense at 128K
#   start h2     h2e, then the attention table beside SDPA flash and cuDNN (build-carry with oomb-bench-attn)
#   start e05    the 0.5B one chunk of 32K beside HF + SDPA alone (any card)
#   start mc     (carry .devcarry: branch mc's oomb-bench-attn, test-cuda-paged-attn, oomb-train; any card) the CTA-pair
#                forward (OOMB_PAGED_ATTN_FWDMC=1): its test first (a hang shows in 150 s), then the 7B layer at 128K chunk
#                2048 and 32K chunk 4096, FWDMC 0 / 1 interleaved; then the whole test-cuda-paged-attn
#   start h2m    (carry .devcarry; H200) e05, mc, then 7B dense 128K with FWDMC 0 and 1, and sparse 64
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
usage="usage: $0 start h2|h2e|e05|mc|h2m | wait [S]"
case ${1:-} in start|wait) ;; *) echo "$usage"; exit 2 ;; esac
OUT0=${OUT:-out}
export OUT=/tmp/keep/res
source "$(dirname "$0")/lease-lib.sh"
if [ "${1:-}" = start ]; then
    case ${2:-} in
    mc|h2m) tar -xJf .devcarry/gpu-bins.tar.xz -C $B && cat .devcarry/bins-commit.txt || exit 1 ;;
    *) tar -xJf build-carry/gpu-bins.tar.xz -C $B && cat build-carry/bins-commit.txt || exit 1 ;;
    esac
fi
lease_head s29 "$@"
cat > $K/run.sh <<EOF2
cd $PWD
export OUT=$R
source bench/gpu/lease-lib.sh
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD HF_PY=$PWD/build-carry/hf_baseline.py
[ -f \$HF_PY ] || HF_PY=$PWD/.devcarry/hf_baseline.py
rand_ids
# mcab LABEL ARGS...: oomb-bench-attn with FWDMC 0 then 1, twice (1 limited to 60 s: a hang skips its later runs)
mcab() {
    local lab=\$1 v f rc; shift
    for v in 0 1 0 1; do
        if [ \$v = 1 ] && [ -f \$K/mc-hung ]; then echo "attn \$lab mc1 skipped (hung before)"; continue; fi
        f=\$R/attn-\$lab-mc\$v-\$SECONDS.log
        OOMB_PAGED_ATTN_FWDMC=\$v timeout \$([ \$v = 1 ] && echo 60 || echo 150) \$B/oomb-bench-attn "\$@" --reps 3 > \$f 2>&1
        rc=\$?; [ \$v = 1 ] && [ \$rc = 124 ] && touch \$K/mc-hung
        echo "attn \$lab mc\$v rc=\$rc \$(grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' \$f | tr '\n' ' ')"
    done
}
mc_all() {
    GTEST_FILTER='*CtaPairs*:*ConfigFromEnv*' tests test-cuda-paged-attn:150
    [ -f \$R/test-cuda-paged-attn.log ] && cp \$R/test-cuda-paged-attn.log \$R/test-cuda-paged-attn-pairs.log
    mcab 7b128k --seq 131072 --chunk 2048
    mcab 7b32k --seq 32768 --chunk 4096
    tests test-cuda-paged-attn:400
}
log start
case $2 in
mc) mc_all ;;
h2m)
    r05n new 6; hf
    mc_all
    r7b mc0 OOMB_PAGED_ATTN_FWDMC=0
    r7b mc1 OOMB_PAGED_ATTN_FWDMC=1
    s7b new ;;
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
