#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-03, night: issue 16's row-tile-overlapped wgmma
# backward, bench/NOTES.md version 17), one part per call, chained without pauses. State in
# /tmp/keep between calls.
#   start   unpack .devcarry/gpu-bins.tar.xz; test-cuda-paged-attn, test-cuda-sparse; the backward
#           per kernel (OOMB_PAGED_ATTN_BWDPIPE 0: one row tile at a time, 1: overlapped) on the 7B
#           layer at 32K and 128K and the 0.5B layer at 32K, one process each, same call
#   attn P  bench_attn.py (ours with BWDPIPE=P beside SDPA flash and cuDNN, 8K / 32K / 128K)
#   e2e S   in the background: 7B --trainable linear 128K one step, dense with BWDPIPE 1 and 0, sparse
#           64 pages with 1 and 0 (bf16 attention cache), then 0.5B one chunk of 32K (3 steps) with
#           1 and 0 beside HF (.devcarry/hf_baseline.py); wait S seconds
#   wait S  wait up to S seconds more for the background runs
#   verify  (a later lease, the final binaries) unpack; test-cuda-paged-attn, test-cuda-sparse,
#           test-cuda-ops, test-cuda-backend
#   fixtures  test-cuda-qwen2 against the HF fixtures (.devcarry/fixtures and
#           .devcarry/extra-bins.tar.xz with oomb-convert-hf, carried alone: the binaries stay from verify)
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests
case $1 in
start)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt; nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-paged-attn:400 test-cuda-sparse:120
    grep -E "bwd_pipe" $R/test-cuda-paged-attn.log | head -8
    for shape in "7b-32k --seq 32768" "7b-128k --seq 131072" "05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64"; do
        set -- $shape; lab=$1; shift
        for p in 0 1 0 1; do
            OOMB_PAGED_ATTN_BWDPIPE=$p timeout 120 $B/oomb-bench-attn "$@" --reps 3 >> $R/bwd-$lab-pipe$p.log 2>&1
            echo "$lab BWDPIPE=$p rc=$? $(grep '"seq"' $R/bwd-$lab-pipe$p.log | tail -1 | grep -oE '"(bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
        done
    done ;;
attn)
    OOMB_PAGED_ATTN_BWDPIPE=${2:-1} PYTHONUNBUFFERED=1 timeout 300 python3 bench/attention/bench_attn.py --bin $B/oomb-bench-attn --out $R 2>&1 | tee $R/attn-bench.log | grep -v "^running" ;;
e2e)
    python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    mkdir -p $K/e2e
    cat > $K/e2e.sh <<EOS
cd $PWD
for sp in dense sparse64; do
  for p in 1 0; do
    extra=""; [ \$sp = sparse64 ] && extra="--sparse-pages 64 --sparse-score mean --sparse-sink 0 --sparse-local 0"
    rm -rf /tmp/r7b
    OOMB_PAGED_ATTN_BWDPIPE=\$p OOMB_CUDA_PROFILE=1 timeout 300 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 --page 128 \
      --steps 1 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 \
      --offload off --attn-cache --attn-cache-type bf16 \$extra -o /tmp/r7b > $K/e2e/7b-128k-\$sp-pipe\$p.log 2>&1
    echo "7b 128K \$sp BWDPIPE=\$p rc=\$?"; grep -E "^step|error|paged_attn" $K/e2e/7b-128k-\$sp-pipe\$p.log | head -8
  done
done
for p in 1 0; do
  rm -rf /tmp/r05
  OOMB_PAGED_ATTN_BWDPIPE=\$p timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
    --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $K/e2e/05b-32k-1chunk-pipe\$p.log 2>&1
  echo "0.5b 32K one chunk BWDPIPE=\$p rc=\$?"; grep -E "^step|error" $K/e2e/05b-32k-1chunk-pipe\$p.log
done
PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $K/e2e/hf-05b-32k.json
EOS
    setsid nohup bash $K/e2e.sh > $K/e2e.out 2>&1 < /dev/null &
    echo $! > $K/e2e.pid; log "e2e started (pid $(cat $K/e2e.pid))"
    end=$((SECONDS + ${2:-500}))
    while alive $K/e2e.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/e2e.pid && log "e2e still running" || log "e2e done"; cat $K/e2e.out; cp $K/e2e/* $R/ ;;
wait)
    end=$((SECONDS + ${2:-500}))
    while alive $K/e2e.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/e2e.pid && log "e2e still running" || log "e2e done"; cat $K/e2e.out; cp $K/e2e.out $K/e2e/* $R/ ;;
verify)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-paged-attn:400 test-cuda-sparse:120 test-cuda-ops:120 test-cuda-backend:60 ;;
fixtures)
    rm -rf $K/fixtures && cp -r .devcarry/fixtures $K/fixtures
    [ -f .devcarry/extra-bins.tar.xz ] && tar -xJf .devcarry/extra-bins.tar.xz -C $B
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:300 ;;
*) echo "usage: $0 start | attn P | e2e S | wait S | verify | fixtures"; exit 2 ;;
esac
