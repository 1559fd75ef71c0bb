#!/usr/bin/env bash
# Session 26 on the GPU machine (2026-12-07, fourth session).
#   start h200   test-cuda-linear-ce (the backend's logits-block cap); the 0.5B one chunk of 32K, 6 steps: new (the memory plan
#                raises the LM head's block to up to 5 GiB where there is room) and old (OOMB_LCE_ROWS=2185: the 1.25 GiB default's
#                15 blocks), alternating, with HF + SDPA between; then Nsight Compute on the attention kernels (ncu-attn.sh)
#   start h100   the same without HF (it does not fit the 80 GB card)
#   wait [S]     waits up to S seconds (default 540) for the background run, prints its output
usage="usage: $0 start h200|h100 | wait [S]"
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
