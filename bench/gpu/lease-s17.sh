#!/usr/bin/env bash
# Session 17 on the GPU machine: the linear cross-entropy's forward and backward in one pass
# (cuda/linear-ce.cu, oomb_cuda_linear_ce_fused; backend-cuda.cu, fuse_linear_ce) and its dw added
# into the LM head's gradient: opt-in, "new" runs set OOMB_CUDA_FUSE_LCE=1, "old" ones =0 (the separate ops).
#   a        test-cuda-ops, test-cuda-backend; 0.5B one chunk of 32K new / old, HF + SDPA (same call; HF=0: not)
#   fixtures test-cuda-qwen2 against the HF fixtures with the fusion on (carried: .devcarry/fq, extra-bins)
#   e2e7b    7B --trainable linear dense 128K, one step each, new / old, profiled
#   tests2   test-cuda-ops (rebuilt), test-cuda-qwen2 (+ oomb-convert-hf) against the HF fixtures with the fusion on,
#            from .devcarry/tests-bins.tar.xz and .devcarry/fq.tar.xz (fits the 64 MiB carry alone)
#   prof05   0.5B one chunk of 32K with the fusion (default) and without, OOMB_CUDA_PROFILE=2 (per-shape rows)
usage="usage: $0 a | fixtures | e2e7b | tests2 | prof05"
case ${1:-} in a|fixtures|e2e7b|tests2|prof05) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05, r7b
case $1 in
a)
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    unpack || exit 1
    tests test-cuda-ops:150 test-cuda-backend:60
    rand_ids
    r05 new OOMB_CUDA_FUSE_LCE=1
    r05 old OOMB_CUDA_FUSE_LCE=0
    [ "${HF:-1}" = 0 ] || PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    r05 new2 OOMB_CUDA_FUSE_LCE=1 ;;
fixtures)
    [ -x $B/oomb-train ] || unpack || exit 1
    rm -rf $K/fixtures && cp -r ${FIXDIR:-.devcarry/fq} $K/fixtures
    tar -xJf .devcarry/extra-bins.tar.xz -C $B || exit 1   # test-cuda-qwen2, oomb-convert-hf
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    OOMB_CUDA_FUSE_LCE=1 tests test-cuda-qwen2:300 ;;
e2e7b)
    [ -x $B/oomb-train ] || unpack || exit 1
    rand_ids
    r7b new OOMB_CUDA_FUSE_LCE=1
    r7b old OOMB_CUDA_FUSE_LCE=0 ;;
prof05)
    unpack || exit 1
    rand_ids
    r05 prof-new OOMB_CUDA_PROFILE=2
    r05 prof-old OOMB_CUDA_PROFILE=2 OOMB_CUDA_FUSE_LCE=0
    r05 new
    r05 old OOMB_CUDA_FUSE_LCE=0
    r05 new2 ;;
tests2)
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    tar -xJf .devcarry/tests-bins.tar.xz -C $B && rm -rf $K/fixtures && mkdir -p $K/fixtures \
        && tar -xJf .devcarry/fq.tar.xz -C $K/fixtures --strip-components=1 || exit 1
    export OOMB_FIXTURES=$K/fixtures OOMB_SOURCE_DIR=$PWD OOMB_BIN_DIR=$B   # oomb-convert-hf from the tarball
    tests test-cuda-ops:150
    OOMB_CUDA_FUSE_LCE=1 tests test-cuda-qwen2:300 ;;
esac
