#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-04, second session: issue 16, the backward's dQ added into
# a tile-contiguous f32 accumulator, bench/NOTES.md version 19), one part per call. State in /tmp/keep
# between calls. (The bulk-reduction variants and the ablation builds 8-10 measured with it are gone
# from the code; the binaries of those calls were built from the working tree of 69d5b55 and after.)
#   start   unpack .devcarry/gpu-bins.tar.xz; test-cuda-paged-attn, test-cuda-sparse; the layers' fwd / bwd
#           (oomb-bench-attn, SHAPES of lease-s13) with OOMB_PAGED_ATTN_BWDDQACC in VALS (0 1 0 1), one
#           process each
#   e2e S   in the background: 7B --trainable linear dense 128K (one step, profiled) and 0.5B --trainable all
#           one chunk of 32K (3 steps), each with BWDDQACC 1 then 0, then HF (.devcarry/hf_baseline.py); wait S s
#   wait S  wait up to S seconds more for the background runs
#   sparse  7B --trainable linear sparse 64 pages 128K, one step, profiled (the issue-13 figure, 22.3 s at acd86d9)
#   ablate  bench/attention/ablate.sh's builds in KS (default 0 3 0 3: 3 no dQ adds; 0 the normal bench, all
#           in .devcarry/abl.tar.xz), 7B layer 32K and 0.5B one chunk 32K, times only
#   verify  unpack; test-cuda-paged-attn, test-cuda-ops, test-cuda-backend
#   fixtures  test-cuda-qwen2 against the HF fixtures (.devcarry/fixtures and extra-bins.tar.xz with
#           oomb-convert-hf, carried alone; with "unpack", the binaries from .devcarry/gpu-bins.tar.xz first)
usage="usage: $0 start | e2e S | wait S | sparse | ablate | verify | fixtures [unpack]"
case ${1:-} in start|e2e|wait|sparse|ablate|verify|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests
unpack() {
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || return 1
    cat $K/bins-commit.txt
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
}
# train_7b_128k [ARGS...]: one step of Qwen2.5-7B --trainable linear --opt-state bf16 at 128K (chunk 2048, bf16
# attention cache, random ids from rand_ids), output on stdout
train_7b_128k() {
    rm -rf /tmp/r7b
    timeout 300 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 --page 128 --steps 1 --warmup 1 \
        --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 --offload off \
        --attn-cache --attn-cache-type bf16 -o /tmp/r7b "$@"
}
SHAPES=${SHAPES:-"7b-32k --seq 32768
7b-128k --seq 131072
05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
05b-32k1c --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64"}
case $1 in
start)
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    unpack || exit 1
    tests test-cuda-paged-attn:400 test-cuda-sparse:120
    while read -r shape; do
        set -- $shape; lab=$1; shift
        for v in ${VALS:-0 1 0 1}; do
            OOMB_PAGED_ATTN_BWDDQACC=$v timeout 120 $B/oomb-bench-attn "$@" --reps 3 >> $R/dqacc-$lab-$v.log 2>&1
            echo "$lab BWDDQACC=$v rc=$? $(grep '"seq"' $R/dqacc-$lab-$v.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
        done
    done <<< "$SHAPES" ;;
e2e)
    rand_ids
    mkdir -p $K/e2e
    cat > $K/e2e.sh <<EOS
cd $PWD
for v in 1 0; do
  OOMB_PAGED_ATTN_BWDDQACC=\$v OOMB_CUDA_PROFILE=1 train_7b_128k > $K/e2e/7b-128k-dense-dqacc\$v.log 2>&1
  echo "7b 128K dense BWDDQACC=\$v rc=\$?"; grep -E "^step|error|paged_attn" $K/e2e/7b-128k-dense-dqacc\$v.log | head -6
done
for v in 1 0; do
  rm -rf /tmp/r05
  OOMB_PAGED_ATTN_BWDDQACC=\$v timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
    --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $K/e2e/05b-32k-1chunk-dqacc\$v.log 2>&1
  echo "0.5b 32K one chunk BWDDQACC=\$v rc=\$?"; grep -E "^step|error" $K/e2e/05b-32k-1chunk-dqacc\$v.log
done
PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $K/e2e/hf-05b-32k.json
EOS
    export B; export -f train_7b_128k   # (for the detached script)
    bg_start $K/e2e.sh
    bg_wait ${2:-500}; cp $K/e2e/* $R/ ;;
wait)
    bg_wait ${2:-500}; cp $K/bg.out $K/e2e/* $R/ ;;
sparse)
    rand_ids
    OOMB_CUDA_PROFILE=1 train_7b_128k --sparse-pages 64 --sparse-score mean --sparse-sink 0 --sparse-local 0 > $R/7b-128k-sparse64.log 2>&1
    echo "7b 128K sparse64 rc=$?"; grep -E "^step|error|paged_attn|page_select|mul_mat " $R/7b-128k-sparse64.log | head -8 ;;
ablate)
    mkdir -p $K/abl && tar -xJf .devcarry/abl.tar.xz -C $K/abl || exit 1
    for shape in "7b --seq 32768" "05b --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64"; do
        set -- $shape; lab=$1; shift
        for k in ${KS:-0 3 0 3}; do
            bin=$K/abl/oomb-bench-attn-abl$k; [ $k = 0 ] && bin=$K/abl/oomb-bench-attn
            timeout 120 $bin "$@" --reps 3 >> $R/abl-$lab-$k.log 2>&1
            echo "$lab abl$k rc=$? $(grep '"seq"' $R/abl-$lab-$k.log | tail -1 | grep -oE '"(fwd|bwd)_(tflops|ms)": [0-9.]+' | tr '\n' ' ')"
        done
    done ;;
verify)
    unpack || exit 1
    tests test-cuda-paged-attn:400 test-cuda-ops:120 test-cuda-backend:60 ;;
fixtures)
    [ "${2:-}" = unpack ] && { unpack || exit 1; }
    rm -rf $K/fixtures && cp -r ${FIXDIR:-.devcarry/fixtures} $K/fixtures
    tar -xJf .devcarry/extra-bins.tar.xz -C $B || exit 1   # oomb-convert-hf (the test converts the HF models)
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:300 ;;
esac
