#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-05: issue 16 after the review's fixes, bench/NOTES.md
# version 20), one part per call. State in /tmp/keep between calls.
#   a       unpack .devcarry/gpu-bins.tar.xz; test-cuda-paged-attn, test-cuda-sparse; the layers' fwd / bwd
#           with the defaults (oomb-bench-attn); the 0.5B one-chunk 32K step's forward with FWDWG3 2 (the
#           new default rule) and 1 (three warpgroups forced: the old choice there); then 0.5B one chunk of
#           32K, 3 steps, and HF + SDPA (.devcarry/hf_baseline.py) in the same call. TEST2: the second test
#           binary (default test-cuda-sparse); SHORT=1: only the 0.5B layers' bench
#   verify  test-cuda-ops, test-cuda-backend (from .devcarry/verify-bins.tar.xz)
#   fixtures  test-cuda-qwen2 against the HF fixtures (FIXDIR, default .devcarry/fq; extra-bins.tar.xz)
#   e2e7b   7B --trainable linear dense 128K, one step, profiled
usage="usage: $0 a | verify | fixtures | e2e7b"
case ${1:-} in a|verify|fixtures|e2e7b) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids
unpack() {
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || return 1
    cat $K/bins-commit.txt
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
}
bench() {  # bench LABEL ARGS...: one oomb-bench-attn process, its TFLOP/s
    local lab=$1; shift
    timeout 120 $B/oomb-bench-attn "$@" --reps 3 >> $R/bench-$lab.log 2>&1
    echo "$lab rc=$? $(grep '"seq"' $R/bench-$lab.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
}
case $1 in
a)
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    unpack || exit 1
    tests test-cuda-paged-attn:420 ${TEST2:-test-cuda-sparse}:120
    bench 05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
    bench 05b-32k1c --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
    if [ -z "${SHORT:-}" ]; then
        bench 7b-128k-c2048 --seq 131072 --chunk 2048
        OOMB_PAGED_ATTN_FWDWG3=1 bench 05b-32k1c-wg3 --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
        bench smol-32k1c --seq 32768 --chunk 32768 --heads 9 --kv-heads 3 --dim 64
        bench 7b-32k --seq 32768
        bench 7b-128k --seq 131072
    fi
    rand_ids
    rm -rf /tmp/r05
    timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
      --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $R/05b-32k-1chunk.log 2>&1
    echo "0.5b 32K one chunk rc=$?"; grep -E "^step|error" $R/05b-32k-1chunk.log
    PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json ;;
verify)
    [ -x $B/oomb-train ] || unpack || exit 1
    tar -xJf .devcarry/verify-bins.tar.xz -C $B || exit 1   # test-cuda-ops, test-cuda-backend (carried apart)
    tests test-cuda-ops:120 test-cuda-backend:60 ;;
fixtures)
    [ -x $B/oomb-train ] || unpack || exit 1
    rm -rf $K/fixtures && cp -r ${FIXDIR:-.devcarry/fq} $K/fixtures
    tar -xJf .devcarry/extra-bins.tar.xz -C $B || exit 1   # oomb-convert-hf (the test converts the HF models)
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:300 ;;
e2e7b)
    [ -x $B/oomb-train ] || unpack || exit 1
    rand_ids
    rm -rf /tmp/r7b
    OOMB_CUDA_PROFILE=1 timeout 300 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 --page 128 --steps 1 \
        --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 \
        --offload off --attn-cache --attn-cache-type bf16 -o /tmp/r7b > $R/7b-128k-dense.log 2>&1
    echo "7b 128K dense rc=$?"; grep -E "^step|error|paged_attn|mul_mat " $R/7b-128k-dense.log | head -6 ;;
esac
