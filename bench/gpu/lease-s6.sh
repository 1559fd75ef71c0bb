#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-02), one part per call, chained without pauses (the
# machine goes back after 30 s idle). State lives in /tmp/keep on the device between calls.
#   fixtures     (first call) copy .devcarry/fixtures to /tmp/keep/fixtures
#   tests        unpack .devcarry/gpu-bins.tar.xz; CUDA tests (paged attention incl. LISTS_RANGE on
#                the fast kernels and NaN propagation, sparse selection, offload tensors, Qwen2
#                training against the fixtures incl. offload); then start the 7B 1M sparse + offload
#                step in the background (setsid), with OOMB_PAGED_ATTN_LISTS_RANGE_FAST=1, when
#                ListsRangeFastKernels passed (else not at all: the generic kernels need 22-33 min)
#   part N       copy .devsmol/smol.part-0N (the last part: assemble, check the sha256)
#   wait1m S     wait up to S seconds for the 1M step; copy its summary and logs to $OUT
#   q4fid        the 512K Q4_K_M LoRA step (sparse 64, no offload) in the background, the 64K
#                fidelity grid in the foreground beside it (the two share the GPU: this part's
#                timings are not clean speed figures)
#   finish S     wait up to S s for the 512K step; the fine-tune curve
set -o pipefail
K=/tmp/keep; B=/tmp/bins-after; mkdir -p $K $B
R=${OUT:-out}; mkdir -p "$R"
log() { echo "[$(date +%T)] $*"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
case $1 in
fixtures)
    rm -rf $K/fixtures && cp -r .devcarry/fixtures $K/fixtures && du -sh $K/fixtures ;;
tests)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt; nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader; free -g | head -2
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    for tl in test-cuda-paged-attn:180 test-cuda-sparse:60 test-offload-tensors:60 test-cuda-qwen2:150; do
        t=${tl%:*}; timeout ${tl#*:} $B/$t > "$R/$t.log" 2>&1; log "$t rc=$?"
        grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK \]|Failure" "$R/$t.log" | head -40
    done
    fast=0; grep -q "^\[       OK \] CudaPagedAttn.ListsRangeFastKernels" "$R/test-cuda-paged-attn.log" && fast=1
    log "LISTS_RANGE fast kernels passed: $fast"
    if [ $fast = 1 ]; then
        python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
        mkdir -p $K/1m
        OOMB_PAGED_ATTN_LISTS_RANGE_FAST=1 OUT=$K/1m LIMIT=${LIMIT_1M:-1100} BINS=$B setsid nohup bash bench/sparse/run-h200.sh 1m-offload \
            > $K/1m.out 2>&1 < /dev/null &
        echo $! > $K/1m.pid; log "1M step started (pid $(cat $K/1m.pid))"
    fi ;;
part)
    cp .devsmol/smol.part-0$2 $K/ && ls -la $K/smol.part-0$2
    if [ "$2" = 2 ]; then
        cat $K/smol.part-00 $K/smol.part-01 $K/smol.part-02 > $K/smol.gguf && cp .devsmol/smol.sha256 $K/
        echo "$(cut -d' ' -f1 $K/smol.sha256)  $K/smol.gguf" | sha256sum -c - && rm -f $K/smol.part-0*
    fi ;;
wait1m)
    end=$((SECONDS + ${2:-550}))
    while alive $K/1m.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/1m.pid && log "1M step still running" || log "1M step not running"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader; free -g | head -2
    tail -c 3000 /tmp/sparse-bench/7b-1m-sparse64-offload.log 2>/dev/null
    cp -r $K/1m "$R/" 2>/dev/null; cp $K/1m.out "$R/" 2>/dev/null; tail -40 $K/1m.out 2>/dev/null ;;
q4fid)
    if alive $K/1m.pid; then log "1M step still running: stopping it"; kill -- -"$(cat $K/1m.pid)"; sleep 5; fi
    mkdir -p $K/q4
    EXTRA="--sparse-pages 64" CHUNK=2048 LIMIT=${LIMIT_Q4:-900} OUT=$K/q4 BINS=$B setsid nohup bash bench/lora/run-h200.sh long 524288 \
        > $K/q4.out 2>&1 < /dev/null &
    echo $! > $K/q4.pid; log "512K Q4_K_M step started"
    sleep 20
    OUT="$R/fid" GGUF=$K/smol.gguf BINS=$B LIMIT=150 bash bench/sparse/fidelity.sh ids
    OUT="$R/fid" GGUF=$K/smol.gguf BINS=$B LIMIT=150 timeout ${FID_LIMIT:-480} bash bench/sparse/fidelity.sh grads 65536
    log "fidelity grads rc=$?"; tail -5 $K/q4.out ;;
finish)
    end=$((SECONDS + ${2:-240}))
    while alive $K/q4.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/q4.pid && log "512K step still running" || log "512K step not running"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    cp -r $K/q4 "$R/" 2>/dev/null; tail -30 $K/q4.out
    OUT="$R/fid" GGUF=$K/smol.gguf BINS=$B timeout ${FT_LIMIT:-200} bash bench/sparse/fidelity.sh finetune
    log "finetune rc=$?" ;;
l2a)  # the second lease: tests of the CUDA changes made after the first, then profiles (sparse 128K; offload pair 64K)
    rm -rf $B && mkdir -p $B && tar -xJf .devcarry/gpu-bins.tar.xz -C $B && cat .devcarry/bins-commit.txt || exit 1
    for tl in test-cuda-paged-attn:150 test-cuda-sparse:60; do
        t=${tl%:*}; timeout ${tl#*:} $B/$t > "$R/$t.log" 2>&1; log "$t rc=$?"
        grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK \]|Failure|\[ nan \]" "$R/$t.log" | head -60
    done
    OOMB_CUDA_PROFILE=1 OUT="$R/sp128" BINS=$B LIMIT=200 bash bench/sparse/run-h200.sh sweep 64
    tar -xzOf "$R/sp128/logs.tgz" 7b-128k-sparse64.log | grep -A16 "CUDA profile (GPU" | head -18
    OOMB_CUDA_PROFILE=1 OUT="$R/pair64" BINS=$B LIMIT=200 bash bench/offload/run-h200.sh pair 65536
    for n in resident offload; do tar -xzOf "$R/pair64/logs.tgz" 7b-65536-$n.log | grep -A14 "CUDA profile (GPU" | head -16; done ;;
l2b)  # 256K dense vs sparse 64, both --offload auto (the default: dense streams what does not fit)
    OFFLOAD=auto OUT="$R/s256" BINS=$B LIMIT=420 bash bench/sparse/run-h200.sh 256k ;;
*) echo "usage: $0 fixtures | tests | part N | wait1m S | q4fid | finish S | l2a | l2b"; exit 2 ;;
esac
