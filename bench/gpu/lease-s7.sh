#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-02, third session), one part per call, chained without
# pauses (the machine goes back after 30 s idle). State lives in /tmp/keep between calls.
#   start        unpack .devcarry/gpu-bins.tar.xz; start 0.5B at 1M dense, --offload on (nothing
#                resident: every page streams), chunk 4096, in the background (setsid); then the CUDA
#                tests that need no fixtures beside it (its step time is not a clean figure for the
#                first minutes: the tests share the GPU); NO_1M=1: the tests only
#   fixtures     copy .devcarry/fixtures; test-cuda-qwen2 (training against HF, offload incl.); then the
#                bf16 gradient-page error at 7B width (bench/offload/bf16-error.sh), beside the 1M step
#   wait S       wait up to S seconds for the 1M step; its summary
#   pair128      (after the 1M step) 7B at 128K resident vs --offload on with early copies off and on
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests
case $1 in
start)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt; nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader; free -g | head -2
    python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    if [ -z "${NO_1M:-}" ]; then mkdir -p $K/1m
    CHUNK7B=4096 LIMIT=${LIMIT_1M:-1500} OUT=$K/1m BINS=$B setsid nohup bash bench/offload/run-h200.sh long 1048576 qwen2.5-0.5b \
        > $K/1m.out 2>&1 < /dev/null &
    echo $! > $K/1m.pid; log "0.5B 1M step started (pid $(cat $K/1m.pid))"; fi
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-offload-tensors:90 test-cuda-sparse:90 test-cuda-paged-attn:240 test-cuda-ops:120 test-cuda-backend:60
    [ -f $K/1m.out ] && tail -5 $K/1m.out; true ;;
fixtures)
    rm -rf $K/fixtures && cp -r .devcarry/fixtures $K/fixtures && du -sh $K/fixtures
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:240
    OUT="$R/bf16err" BINS=$B LIMIT=200 EXTRA_RUNS="bf16:offload" timeout 330 bash bench/offload/bf16-error.sh 65536
    log "bf16-error rc=$?"; [ -f $K/1m.out ] && tail -3 $K/1m.out; true ;;
wait)
    end=$((SECONDS + ${2:-550}))
    while alive $K/1m.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/1m.pid && log "1M step still running" || log "1M step not running"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader; free -g | head -2
    grep -E "step 1/1|^step" /tmp/offload-bench/qwen2.5-0.5b-1048576-offload.log 2>/dev/null | tail -3
    cp -r $K/1m "$R/" 2>/dev/null; cat $K/1m.out ;;
pair128)
    while alive $K/1m.pid; do sleep 5; done
    P=$R/pair128; mkdir -p $P
    OUT=$P BINS=$B LIMIT=200 bash bench/offload/run-h200.sh pair 131072
    mv /tmp/offload-bench/7b-131072-offload.log /tmp/offload-bench/7b-131072-offload-early0.log
    OOMB_OFFLOAD_EARLY_COPIES=1 OUT=$P BINS=$B LIMIT=200 bash bench/offload/run-h200.sh long 131072 ;;
*) echo "usage: $0 start | fixtures | wait S | pair128"; exit 2 ;;
esac
