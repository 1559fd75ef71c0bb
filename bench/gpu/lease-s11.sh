#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-03, evening: issue 16's warp-specialised forward),
# one part per call, chained without pauses. State in /tmp/keep between calls.
#   start   unpack .devcarry/gpu-bins.tar.xz; test-cuda-paged-attn, test-cuda-sparse; (SWEEP=1) the
#           forward alone per kernel (OOMB_PAGED_ATTN_FWDWS 0: two-warpgroup wgmma, 1 and 2:
#           warp-specialised, K/V stages) at 32K and 128K (7B layer) and 32K (0.5B layer)
#           (an earlier version of this part compared the backward's dQ by bulk reductions: removed)
#   attn    bench_attn.py: ours (defaults) beside SDPA flash and cuDNN, 8K / 32K / 128K; the 0.5B
#           layer fwd+bwd at 32K, FWDWS 1 vs 0
#   e2e S   in the background: 7B --trainable linear 128K one step, dense and sparse 64 pages, with
#           FWDWS=1 and =0 (bf16 attention cache), then 0.5B one chunk of 32K (--chunk 32768, 3 steps) with
#           FWDWS=1 and =0 beside HF
#           (.devcarry/hf_baseline.py); wait S
#   wait S  wait up to S seconds more for the background runs
#   fuse    (its own lease; run 2026-12-03 night at acd86d9: bench/attention/h200/s12-fuse) unpack; test-cuda-backend, test-cuda-ops; 7B sparse 128K one
#           step with the fused weight-gradient accumulation (OOMB_CUDA_FUSE=1) and without
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests
fwd_sweep() {  # label, bench args
    local lab=$1; shift
    for ws in ${WS_VARIANTS:-0 1 2}; do
        OOMB_PAGED_ATTN_FWDWS=$ws timeout 120 $B/oomb-bench-attn "$@" --fwd-only --reps 5 > $R/fwd-$lab-ws$ws.log 2>&1
        echo "$lab FWDWS=$ws rc=$? $(grep '"seq"' $R/fwd-$lab-ws$ws.log | tr '\n' ' ')"
    done
}
case $1 in
start)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt; nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-paged-attn:400 test-cuda-sparse:120
    grep -E "nan_tail|fwd_ws" $R/test-cuda-paged-attn.log | head -20
    if [ -n "${SWEEP:-}" ]; then
        fwd_sweep 7b-32k --seq 32768
        fwd_sweep 7b-128k --seq 131072
        fwd_sweep 05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
    fi
    ;;
attn)
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/attention/bench_attn.py --bin $B/oomb-bench-attn --out $R 2>&1 | tee $R/attn-bench.log | grep -v "^running"
    for ws in 1 0; do
        OOMB_PAGED_ATTN_FWDWS=$ws timeout 120 $B/oomb-bench-attn --seq 32768 --heads 14 --kv-heads 2 --dim 64 --reps 3 > $R/05b-ws$ws.log 2>&1
        echo "0.5B layer 32K fwd+bwd FWDWS=$ws rc=$? $(grep '"seq"' $R/05b-ws$ws.log)"
    done ;;
e2e)
    python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    mkdir -p $K/e2e
    cat > $K/e2e.sh <<EOS
cd $PWD
for ws in 1 0; do
  for sp in dense sparse64; do
    extra=""; [ \$sp = sparse64 ] && extra="--sparse-pages 64 --sparse-score mean --sparse-sink 0 --sparse-local 0"
    rm -rf /tmp/r7b
    OOMB_PAGED_ATTN_FWDWS=\$ws OOMB_CUDA_PROFILE=1 timeout 300 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 --page 128 \
      --steps 1 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 \
      --offload off --attn-cache --attn-cache-type bf16 \$extra -o /tmp/r7b > $K/e2e/7b-128k-\$sp-ws\$ws.log 2>&1
    echo "7b 128K \$sp FWDWS=\$ws rc=\$?"; grep -E "^step|error|paged_attn" $K/e2e/7b-128k-\$sp-ws\$ws.log | head -8
  done
done
for ws in 1 0; do
  rm -rf /tmp/r05
  OOMB_PAGED_ATTN_FWDWS=\$ws timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
    --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $K/e2e/05b-32k-1chunk-ws\$ws.log 2>&1
  echo "0.5b 32K one chunk FWDWS=\$ws rc=\$?"; grep -E "^step|error" $K/e2e/05b-32k-1chunk-ws\$ws.log
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
fuse)
    # the fused weight-gradient accumulation (opt-in: OOMB_CUDA_FUSE=1): its tests, then 7B sparse
    # 128K with it and without, one step each, profiled (not run yet: written after the device time
    # of 2026-12-03 was spent)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt
    tests test-cuda-backend:60 test-cuda-ops:90
    python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    for nf in 0 1; do
        rm -rf /tmp/r7b
        env $([ $nf = 0 ] && echo OOMB_CUDA_FUSE=1) OOMB_CUDA_PROFILE=1 timeout 150 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 \
          --page 128 --steps 1 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear \
          --opt-state bf16 --offload off --attn-cache --attn-cache-type bf16 --sparse-pages 64 --sparse-score mean --sparse-sink 0 \
          --sparse-local 0 -o /tmp/r7b > $R/7b-128k-sparse64-nofuse$nf.log 2>&1
        echo "7b 128K sparse64 NO_FUSE=$nf rc=$?"; grep -E "^step|error|add_inplace|mul_mat " $R/7b-128k-sparse64-nofuse$nf.log | head -5
    done ;;
*) echo "usage: $0 start | attn | e2e S | wait S | fuse"; exit 2 ;;
esac
