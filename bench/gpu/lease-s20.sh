#!/usr/bin/env bash
# Session 20 on the GPU machine (2026-12-06, third session): the page-list backward's block order
# (bwd_block, config.lists_bwd_order) against the old order, and the figures the H200 still owes.
#   pa       test-cuda-paged-attn (the page-list kernels against the CPU, every option), then the attention alone
#            (oomb-bench-attn, 7B layer shapes, chunk 2048, page 128): sparse 64 at 32K and 128K with each
#            OOMB_PAGED_ATTN_LISTSBWD of 0 1 2 4 8 12 14 15 (bits: order, unsplit history, query-tile masks, no
#            page mask for rows of one query tile), twice; dense 128K
#   pa2      the attention alone, sparse 64 at 32K and 128K: LISTSBWD in VARS (default 0 8 9 13 0 8 9 13)
#   tpa      test-cuda-paged-attn alone
#   h100     test-cuda-paged-attn, then Qwen2.5-3B --trainable linear sparse 64 pages at 128K (fits an 80 GB card
#            without --attn-cache), one step each with LISTSBWD 13, 0, 13 (end to end A/B on the H100)
#   h200     on the H200: (BENCH=1: the attention alone at 128K with LISTSBWD 0, NEW (default 13)); 7B sparse 64 pages 128K
#            with LISTSBWD=NEW (profiled), then 0 (the issue-13 figure, A/B); (TESTS=1: then test-cuda-paged-attn);
#            0.5B one chunk of 32K and HF + SDPA (the issue-16 ratio)
#   h200min  the H200's figures in the least device time: 7B sparse 64 at 128K (default LISTSBWD), the 0.5B one
#            chunk of 32K and HF + SDPA, then the 7B step with LISTSBWD=0
#   fixtures test-cuda-qwen2 against the HF fixtures (carry build-carry alone)
usage="usage: $0 pa | pa2 | tpa | h100 | h200 | h200min | fixtures"
case ${1:-} in pa|pa2|tpa|h100|h200|h200min|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05, s7b, s3b, fixtures_qwen2
nvidia-smi --query-gpu=name,clocks.sm,memory.used,power.draw,driver_version --format=csv,noheader
if [ "$1" = fixtures ]; then fixtures_qwen2; exit; fi
[ -x $B/oomb-train ] || unpack || exit 1
bat() {  # bat LABEL ENV... -- ARGS...: oomb-bench-attn, 7B layer shapes
    local lab=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    env "${envs[@]}" timeout 200 $B/oomb-bench-attn --chunk 2048 --page 128 --heads 28 --kv-heads 4 --dim 128 "$@" 2>&1 \
        | tee -a $R/bench-attn.jsonl | sed "s/^/$lab /"
}
case $1 in
pa)
    tests test-cuda-paged-attn:300
    for rep in 1 2; do
        for v in 0 1 2 4 8 12 14 15; do bat v$v.$rep OOMB_PAGED_ATTN_LISTSBWD=$v -- --seq 32768,131072 --sparse 64 --reps 2; done
    done
    bat dense X=1 -- --seq 131072 --reps 2 ;;
h100)
    tests test-cuda-paged-attn:200
    rand_ids
    s3b v13 OOMB_PAGED_ATTN_LISTSBWD=13 OOMB_CUDA_PROFILE=1
    s3b v0 OOMB_PAGED_ATTN_LISTSBWD=0 OOMB_CUDA_PROFILE=1
    s3b v13b OOMB_PAGED_ATTN_LISTSBWD=13
    s3b v0b OOMB_PAGED_ATTN_LISTSBWD=0 ;;
tpa)
    tests test-cuda-paged-attn:300 ;;
h200min)
    rand_ids
    s7b new
    r05 new
    PYTHONUNBUFFERED=1 timeout 150 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    s7b old OOMB_PAGED_ATTN_LISTSBWD=0 ;;
pa2)
    for v in ${VARS:-0 8 9 13 0 8 9 13}; do bat v$v OOMB_PAGED_ATTN_LISTSBWD=$v -- --seq 32768,131072 --sparse 64 --reps 3; done ;;
h200)
    rand_ids
    NEW=${NEW:-13}   # the LISTSBWD to compare against 0
    [ -n "${BENCH:-}" ] && for v in 0 $NEW; do bat v$v OOMB_PAGED_ATTN_LISTSBWD=$v -- --seq 131072 --sparse 64 --reps 2; done
    s7b new OOMB_PAGED_ATTN_LISTSBWD=$NEW OOMB_CUDA_PROFILE=1
    s7b old OOMB_PAGED_ATTN_LISTSBWD=0
    r05 new
    PYTHONUNBUFFERED=1 timeout 150 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    r05 new2
    [ -n "${TESTS:-}" ] && tests test-cuda-paged-attn:200 ;;
esac
