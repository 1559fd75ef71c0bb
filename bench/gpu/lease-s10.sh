#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-03, third of the day), one part per call, chained
# without pauses (the machine goes back after 30 s idle). State in /tmp/keep between calls.
#   start     unpack .devcarry/gpu-bins.tar.xz; the CUDA tests that need no fixtures
#   fixtures  copy .devcarry/fixtures; test-cuda-qwen2 (incl. CudaSparse.AttnCacheMatchesRecomputing);
#             then, in the background (setsid), the sparse benchmarks one after another:
#             7B 128K sparse 64 profiled (the cuBLAS selection), 7B 128K sparse 64 + --attn-cache bf16,
#             7B 1M sparse 64 + host offload (bench/sparse/run-h200.sh 1m-offload)
#   wait S    wait up to S seconds for the benchmarks; their summary
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests
case $1 in
start)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt; nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader; free -g | head -2
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-sparse:120 test-cuda-paged-attn:300 test-offload-tensors:90 test-cuda-backend:60 ;;
fixtures)
    rm -rf $K/fixtures && cp -r .devcarry/fixtures $K/fixtures
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:300
    grep -E "sparse K 8|offloaded vs resident" $R/test-cuda-qwen2.log
    python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    mkdir -p $K/bench
    cat > $K/bench.sh <<EOS
cd $PWD
OOMB_CUDA_PROFILE=1 OUT=$K/bench/128k-profile BINS=$B bash bench/sparse/run-h200.sh sweep 64
EXTRA="--attn-cache --attn-cache-type bf16" OUT=$K/bench/128k-cache BINS=$B bash bench/sparse/run-h200.sh sweep 64
OUT=$K/bench/1m-offload BINS=$B LIMIT=900 bash bench/sparse/run-h200.sh 1m-offload
EOS
    setsid nohup bash $K/bench.sh > $K/bench.out 2>&1 < /dev/null &
    echo $! > $K/bench.pid; log "benchmarks started (pid $(cat $K/bench.pid))" ;;
wait)
    end=$((SECONDS + ${2:-550}))
    while alive $K/bench.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/bench.pid && log "benchmarks still running" || log "benchmarks done"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader; free -g | head -2
    tail -2 /tmp/sparse-bench/*.log 2>/dev/null | cut -c1-300
    cp -r $K/bench "$R/" 2>/dev/null; cat $K/bench.out | cut -c1-400 | tail -40 ;;
*) echo "usage: $0 start | fixtures | wait S"; exit 2 ;;
esac
