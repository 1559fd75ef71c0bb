#!/usr/bin/env bash
# Session 29 on the GPU machine (2026-12-08): what is owed to an H200 since session 27 (bench/NOTES.md "Session 27"
# has the predictions): binaries of main's kernels (build-carry/gpu-bins.tar.xz, bench/gpu/pack.sh's format).
#   start h2e    (carry build-carry; H200, needs_h200) the 0.5B one chunk of 32K beside HF + SDPA; 7B --trainable
#                linear sparse 64 and dense at 128K
#   start h2     h2e, then the attention table beside SDPA flash and cuDNN (build-carry with oomb-bench-attn)
#   start e05    the 0.5B one chunk of 32K beside HF + SDPA alone (any card)
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
usage="usage: $0 start h2|h2e|e05 | wait [S]"
case ${1:-} in start|wait) ;; *) echo "$usage"; exit 2 ;; esac
OUT0=${OUT:-out}
export OUT=/tmp/keep/res
source "$(dirname "$0")/lease-lib.sh"
if [ "${1:-}" = start ]; then
    tar -xJf build-carry/gpu-bins.tar.xz -C $B && cat build-carry/bins-commit.txt || exit 1
fi
lease_head s29 "$@"
cat > $K/run.sh <<EOF2
cd $PWD
export OUT=$R
source bench/gpu/lease-lib.sh
export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD HF_PY=$PWD/build-carry/hf_baseline.py
rand_ids
log start
case $2 in
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
