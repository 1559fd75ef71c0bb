#!/usr/bin/env bash
# Session 21 on the GPU machine (2026-12-06, fourth session): the figures the H200 still owes after session 20
# (the page-list kernels' LISTSBWD default 13: measured on the H100 only).
#   h200   7B --trainable linear sparse 64 pages at 128K: LISTSBWD default (per-shape profile, OOMB_CUDA_PROFILE=2),
#          then 0 (the old kernels, A/B), then the default again unprofiled (the issue-13 figure); the 0.5B one chunk
#          of 32K, HF + SDPA, the 0.5B again (the issue-16 ratio); (TESTS=1: then test-cuda-paged-attn)
#   tpa    test-cuda-paged-attn alone
#   epi    the sums and biases in the GEMM's epilogue (bench/NOTES.md): test-cuda-backend, test-cuda-ops, then the 0.5B
#          one chunk of 32K with and without them (OOMB_CUDA_FUSE_EPI=0), twice, interleaved, and once profiled
#          (OOMB_CUDA_PROFILE=2); on an H200 (HF=1) HF + SDPA after
#   e7b    on the H200: 7B sparse 64 at 128K: the default (profiled, 2), OOMB_CUDA_FUSE_EPI=0, OOMB_PAGED_ATTN_LISTSBWD=0
#   h200b  on the H200, in the least device time: 7B sparse 64 at 128K (default, then LISTSBWD=0), the 0.5B one chunk of
#          32K for 6 steps with and without the epilogue fusion (twice, interleaved), HF + SDPA, the 7B step profiled
#   ab05   (TESTS=1: test-cuda-ops, test-cuda-backend) the 0.5B one chunk of 32K, 6 steps: everything new, everything
#          off ($OFF), twice interleaved, then each part
#          off alone; (PROF=1: new and off profiled, OOMB_CUDA_PROFILE=2); (HF=1: HF + SDPA)
#   s7     on the H200: 7B sparse 64 at 128K: default, LISTSBWD=0, everything of ab05 off, the default profiled (2)
#   h100b  test-cuda-ops, test-cuda-backend; the 0.5B one chunk of 32K, 6 steps, without and with the timing of cuBLASLt's
#          candidates (OOMB_CUDA_LT_TUNE=1), twice; Qwen2.5-3B --trainable linear sparse 64 at 128K, new and $OFF
#   h200c  on the H200, lean: the 0.5B new, HF + SDPA, the 0.5B new again, 7B sparse 64 at 128K new, then $OFF
usage="usage: $0 h200 | tpa | epi | e7b | h200b | ab05 | s7 | h100b | h200c"
case ${1:-} in h200|tpa|epi|e7b|h200b|ab05|s7|h100b|h200c) ;; *) echo "$usage"; exit 2 ;; esac
OFF="OOMB_CUDA_FUSE_EPI=0 OOMB_OPT_NORM_GROUP=1 OOMB_CUDA_ADAMW_VEC=0 OOMB_CUDA_FUSE_NORM=0"
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05, s7b, s3b
nvidia-smi --query-gpu=name,clocks.sm,memory.used,power.draw,power.limit,driver_version --format=csv,noheader
[ -x $B/oomb-train ] || unpack || exit 1
r05n() {  # r05n LABEL STEPS [ENV...]: the 0.5B one-chunk run for STEPS steps (tok/s of steps 2.. in the log)
    local lab=$1 st=$2; shift 2
    rm -rf /tmp/r05
    env "$@" timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps $st --warmup 1 \
      --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $R/05b-32k-1chunk-$lab.log 2>&1
    echo "0.5b 32K one chunk $lab rc=$? tok/s: $(grep -oE '[0-9]+ tok/s' $R/05b-32k-1chunk-$lab.log | head -$st | tail -n +2 | awk '{print $1}' | tr '\n' ' ')"
}
case $1 in
h200)
    rand_ids
    log start
    s7b new-prof2 OOMB_CUDA_PROFILE=2
    s7b old OOMB_PAGED_ATTN_LISTSBWD=0
    s7b new
    r05 new
    PYTHONUNBUFFERED=1 timeout 170 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    r05 new2
    log end
    [ -n "${TESTS:-}" ] && tests test-cuda-paged-attn:200 ;;
tpa)
    tests test-cuda-paged-attn:300 ;;
epi)
    tests test-cuda-backend:120 test-cuda-ops:300
    rand_ids
    r05 epi
    r05 noepi OOMB_CUDA_FUSE_EPI=0
    r05 epi2
    r05 noepi2 OOMB_CUDA_FUSE_EPI=0
    r05 prof2 OOMB_CUDA_PROFILE=2
    grep -E "add |mul_mat " $R/05b-32k-1chunk-prof2.log | head -20
    [ -n "${HF:-}" ] && PYTHONUNBUFFERED=1 timeout 170 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    log end ;;
h100b)
    tests test-cuda-ops:300 test-cuda-backend:120
    rand_ids
    r05n new 6
    r05n tune 6 OOMB_CUDA_LT_TUNE=1
    r05n new2 6
    r05n tune2 6 OOMB_CUDA_LT_TUNE=1
    s3b new
    s3b off $OFF
    log end ;;
h200c)
    rand_ids
    r05n new 6
    PYTHONUNBUFFERED=1 timeout 170 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    r05n new2 6
    s7b new
    s7b off $OFF
    log end ;;
ab05)
    [ -n "${TESTS:-}" ] && tests test-cuda-ops:300 test-cuda-backend:120
    rand_ids
    r05n new 6
    r05n off 6 $OFF
    r05n new2 6
    r05n off2 6 $OFF
    r05n noepi 6 OOMB_CUDA_FUSE_EPI=0
    r05n noopt 6 OOMB_OPT_NORM_GROUP=1 OOMB_CUDA_ADAMW_VEC=0
    r05n nonorm 6 OOMB_CUDA_FUSE_NORM=0
    r05n notune 6 OOMB_CUDA_LT_TUNE=0
    r05n new3 6
    if [ -n "${PROF:-}" ]; then
        r05n prof-new 6 OOMB_CUDA_PROFILE=2
        r05n prof-off 6 OOMB_CUDA_PROFILE=2 $OFF
    fi
    [ -n "${HF:-}" ] && PYTHONUNBUFFERED=1 timeout 170 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    log end ;;
s7)
    rand_ids
    s7b new
    s7b oldlists OOMB_PAGED_ATTN_LISTSBWD=0
    s7b off $OFF
    s7b new-prof2 OOMB_CUDA_PROFILE=2
    log end ;;
h200b)
    rand_ids
    s7b new
    s7b oldlists OOMB_PAGED_ATTN_LISTSBWD=0
    r05n epi 6
    r05n noepi 6 OOMB_CUDA_FUSE_EPI=0
    r05n epi2 6
    r05n noepi2 6 OOMB_CUDA_FUSE_EPI=0
    PYTHONUNBUFFERED=1 timeout 170 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    s7b new-prof2 OOMB_CUDA_PROFILE=2
    r05n prof-epi 6 OOMB_CUDA_PROFILE=2
    r05n prof-noepi 6 OOMB_CUDA_PROFILE=2 OOMB_CUDA_FUSE_EPI=0
    log end ;;
e7b)
    rand_ids
    s7b new-prof2 OOMB_CUDA_PROFILE=2
    s7b noepi OOMB_CUDA_FUSE_EPI=0
    s7b oldlists OOMB_PAGED_ATTN_LISTSBWD=0
    s7b new
    log end ;;
esac
