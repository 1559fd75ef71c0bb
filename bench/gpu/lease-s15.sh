#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-04, third session: issue 16, the splits over keys,
# bench/NOTES.md version 20), one part per call. State in /tmp/keep between calls.
#   start   unpack .devcarry/gpu-bins.tar.xz; test-cuda-paged-attn, test-cuda-sparse; the layers' fwd / bwd
#           (oomb-bench-attn, SHAPES) new (the defaults) and old (OLD: FWDSPLIT=1 SPLITDYN=0), pattern new old
#           new old, one process each
#   final   test-cuda-paged-attn; 7B layer 128K chunk 2048 new vs OLD twice, the other layers once
#   sweep   the backward's blocks per key tile forced to SPLITS (default auto 2 4 6 8 auto) on SWEEP_SHAPES
#   e2e S   in the background: 7B --trainable linear dense 128K (one step, profiled) E2E_7B (default "new
#           old": NEW's settings, default none, then OLD's), 0.5B one chunk of 32K (3 steps, then 2 profiled)
#           with NEW's, then HF (.devcarry/hf_baseline.py); wait S s
#   wait S  wait up to S seconds more for the background runs
#   sparse  7B --trainable linear sparse 64 pages 128K, one step, profiled (the issue-13 figure)
#   verify  test-cuda-ops, test-cuda-backend (from .devcarry/verify-bins.tar.xz)
#   power   SM clock and power draw sampled each 0.5 s (nvidia-smi) during the 7B layer's bench at chunk 2048
#           and during one profiled 7B dense 128K step: quartiles of each
#   fwd05   the 0.5B one-chunk step profiled (3 steps) and the bench's one-chunk forward, FWDWG3 in VALS05
#   fixtures  test-cuda-qwen2 against the HF fixtures (FIXDIR, default .devcarry/fq, and extra-bins.tar.xz
#           with oomb-convert-hf; with "unpack", the binaries from .devcarry/gpu-bins.tar.xz first)
usage="usage: $0 start | final | sweep | e2e S | wait S | sparse | verify | power | fwd05 | fixtures [unpack]"
case ${1:-} in start|final|sweep|e2e|wait|sparse|verify|power|fwd05|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests, rand_ids, bg_start, bg_wait
OLD=${OLD:-"OOMB_PAGED_ATTN_FWDSPLIT=1 OOMB_PAGED_ATTN_SPLITDYN=0"}
NEW=${NEW:-}   # the e2e's "new" settings (the defaults unless set)
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
SHAPES=${SHAPES:-"7b-128k-c2048 --seq 131072 --chunk 2048
05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
7b-32k --seq 32768
7b-128k --seq 131072"}
case $1 in
start)
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    unpack || exit 1
    tests test-cuda-paged-attn:420 test-cuda-sparse:120
    while read -r shape; do
        set -- $shape; lab=$1; shift
        for v in ${VALS:-new old new old}; do
            envs=""; [ $v = old ] && envs=$OLD
            env $envs timeout 120 $B/oomb-bench-attn "$@" --reps 3 >> $R/split-$lab-$v.log 2>&1
            echo "$lab $v rc=$? $(grep '"seq"' $R/split-$lab-$v.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
        done
    done <<< "$SHAPES" ;;
final)
    # the final binaries: test-cuda-paged-attn; the 7B layer at chunk 2048 new vs OLD (twice each), the other
    # layers once with the defaults
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    unpack || exit 1
    tests test-cuda-paged-attn:420
    for v in new old new old; do
        envs=""; [ $v = old ] && envs=$OLD
        env $envs timeout 120 $B/oomb-bench-attn --seq 131072 --chunk 2048 --reps 3 >> $R/final-7b-128k-c2048-$v.log 2>&1
        echo "7b-128k-c2048 $v rc=$? $(grep '"seq"' $R/final-7b-128k-c2048-$v.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
    done
    while read -r shape; do
        set -- $shape; lab=$1; shift
        timeout 120 $B/oomb-bench-attn "$@" --reps 3 >> $R/final-$lab.log 2>&1
        echo "$lab rc=$? $(grep '"seq"' $R/final-$lab.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
    done <<< "05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
05b-32k1c --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64
7b-32k --seq 32768
7b-128k --seq 131072" ;;
sweep)
    [ -x $B/oomb-bench-attn ] || unpack || exit 1
    # the backward's blocks per key tile forced (OOMB_PAGED_ATTN_SPLIT, every chunk) against the automatic
    # rule without the device's lowering (SPLITDYN=0), forward split on in all
    while read -r shape; do
        set -- $shape; lab=$1; shift
        for sp in ${SPLITS:-auto 2 4 6 8 auto}; do
            envs="OOMB_PAGED_ATTN_SPLITDYN=0"; [ $sp != auto ] && envs="OOMB_PAGED_ATTN_SPLIT=$sp"
            env $envs timeout 120 $B/oomb-bench-attn "$@" --reps 3 >> $R/sweep-$lab-$sp.log 2>&1
            echo "$lab split $sp rc=$? $(grep '"seq"' $R/sweep-$lab-$sp.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
        done
    done <<< "${SWEEP_SHAPES:-"7b-128k-c2048 --seq 131072 --chunk 2048
05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
7b-32k --seq 32768"}" ;;
e2e)
    [ -x $B/oomb-train ] || unpack || exit 1
    rand_ids
    mkdir -p $K/e2e
    cat > $K/e2e.sh <<EOS
cd $PWD
for v in ${E2E_7B:-new old}; do
  envs="$NEW"; [ \$v = old ] && envs="$OLD"
  env \$envs OOMB_CUDA_PROFILE=1 bash -c train_7b_128k > $K/e2e/7b-128k-dense-\$v.log 2>&1
  echo "7b 128K dense \$v rc=\$?"; grep -E "^step|error|paged_attn" $K/e2e/7b-128k-dense-\$v.log | head -6
done
rm -rf /tmp/r05
env $NEW timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
  --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $K/e2e/05b-32k-1chunk.log 2>&1
echo "0.5b 32K one chunk rc=\$?"; grep -E "^step|error" $K/e2e/05b-32k-1chunk.log
rm -rf /tmp/r05p
env $NEW OOMB_CUDA_PROFILE=1 timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 2 --warmup 1 \
  --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05p > $K/e2e/05b-32k-1chunk-profile.log 2>&1
echo "0.5b 32K one chunk, profiled rc=\$?"; sed -n '/CUDA profile/,+12p' $K/e2e/05b-32k-1chunk-profile.log
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
verify)
    [ -x $B/oomb-train ] || unpack || exit 1
    tar -xJf .devcarry/verify-bins.tar.xz -C $B || exit 1   # test-cuda-ops, test-cuda-backend (carried apart)
    tests test-cuda-ops:120 test-cuda-backend:60 ;;
power)
    [ -x $B/oomb-bench-attn ] || unpack || exit 1
    rand_ids
    sample() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 500 > $R/power-$1.csv & echo $!; }
    summary() { sort -t, -k1 -n $R/power-$1.csv | awk -F, -v lab=$1 '{c[NR]=$1; p[NR]=$2; t[NR]=$3} END {n=NR; print lab": samples "n", SM MHz q1/median/q3 "c[int(n/4)+1]"/"c[int(n/2)+1]"/"c[int(3*n/4)+1]}'
                sort -t, -k2 -n $R/power-$1.csv | awk -F, -v lab=$1 '{p[NR]=$2} END {n=NR; print lab": power W q1/median/q3 "p[int(n/4)+1]"/"p[int(n/2)+1]"/"p[int(3*n/4)+1]}'; }
    pid=$(sample bench); timeout 120 $B/oomb-bench-attn --seq 131072 --chunk 2048 --reps 5 > $R/power-bench.log 2>&1; kill $pid
    grep '"seq"' $R/power-bench.log | grep -oE '"(fwd|bwd)_tflops": [0-9.]+' | tr '\n' ' '; echo; summary bench
    pid=$(sample e2e); OOMB_CUDA_PROFILE=1 train_7b_128k > $R/power-e2e.log 2>&1; kill $pid
    grep -E "^step|paged_attn" $R/power-e2e.log | head -3; summary e2e ;;
fwd05)
    # the 0.5B one-chunk step's forward (296 TFLOP/s in its profile) against the bench's one-chunk call (381):
    # the step profiled with FWDWG3 in VALS05 (default 2 0), then the bench's forward alone
    [ -x $B/oomb-train ] || unpack || exit 1
    rand_ids
    for v in ${VALS05:-2 0}; do
        rm -rf /tmp/r05p
        OOMB_PAGED_ATTN_FWDWG3=$v OOMB_CUDA_PROFILE=1 timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 \
          --page 128 --steps 3 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05p \
          > $R/fwd05-step-wg3-$v.log 2>&1
        echo "0.5B step FWDWG3=$v rc=$? $(grep '^step 3' $R/fwd05-step-wg3-$v.log | grep -oE '[0-9]+ tok/s')"; grep -E "^  paged_attn " $R/fwd05-step-wg3-$v.log
        OOMB_PAGED_ATTN_FWDWG3=$v timeout 120 $B/oomb-bench-attn --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64 --reps 3 --fwd-only > $R/fwd05-bench-wg3-$v.log 2>&1
        echo "bench FWDWG3=$v $(grep '"seq"' $R/fwd05-bench-wg3-$v.log | grep -oE '"fwd_(ms|tflops)": [0-9.]+' | tr '\n' ' ')"
    done ;;
fixtures)
    [ "${2:-}" = unpack ] && { unpack || exit 1; }
    rm -rf $K/fixtures && cp -r ${FIXDIR:-.devcarry/fq} $K/fixtures
    tar -xJf .devcarry/extra-bins.tar.xz -C $B || exit 1   # oomb-convert-hf (the test converts the HF models)
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:300 ;;
esac
