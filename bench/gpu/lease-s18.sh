#!/usr/bin/env bash
# Session 18 on the GPU machine (2026-12-06): the in-place sums fused into their products
# (backend-cuda.cu, fuse_accumulations: add(C, M) placed in C's bytes; OOMB_CUDA_FUSE_ADD=0 turns it
# off) and the fused linear cross-entropy's smaller row blocks when its scratch does not fit (try_scratch).
#   tests    test-cuda-backend (FusedSumIntoProducts), test-cuda-ops (the LCE 'oom' case)
#   a05      0.5B one chunk of 32K: new, old (OOMB_CUDA_FUSE_ADD=0), new again, both off (FUSE_ADD=0
#            FUSE_LCE=0), a profile of new; HF + SDPA (HF=0: not; it needs the H200's memory)
#   e2e7b    7B --trainable linear dense 128K, one step each: new, FUSE_ADD=0, both off (needs the H200)
usage="usage: $0 tests | a05 | e2e7b"
case ${1:-} in tests|a05|e2e7b) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05, r7b
nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
[ -x $B/oomb-train ] || unpack || exit 1
case $1 in
tests)
    tests test-cuda-backend:120 test-cuda-ops:200 ;;
a05)
    rand_ids
    r05 new
    r05 old OOMB_CUDA_FUSE_ADD=0
    r05 new2
    r05 bothoff OOMB_CUDA_FUSE_ADD=0 OOMB_CUDA_FUSE_LCE=0
    r05 prof OOMB_CUDA_PROFILE=1
    [ "${HF:-1}" = 0 ] || PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json ;;
e2e7b)
    rand_ids
    r7b new
    r7b addoff OOMB_CUDA_FUSE_ADD=0
    r7b bothoff OOMB_CUDA_FUSE_ADD=0 OOMB_CUDA_FUSE_LCE=0 ;;
esac
