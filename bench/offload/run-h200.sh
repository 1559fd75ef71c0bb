#!/usr/bin/env bash
# Host-offload benchmarks on the H200 (issue 12), one device call per invocation:
#   bench/offload/run-h200.sh overhead   7B at 128K: resident vs --offload on (nothing resident), same call
#   bench/offload/run-h200.sh curve CTX...  7B --offload on, one step per context: GPU memory vs context
#   bench/offload/run-h200.sh long CTX [MODEL]  one step at a long context (MODEL: qwen2.5-7b or qwen2.5-0.5b);
#                                        OFFLOAD=auto|on|off (default on) picks --offload
#   bench/offload/run-h200.sh pair CTX   7B at CTX: resident vs --offload on, as overhead (with OOMB_CUDA_PROFILE=1: per-op GPU time)
# EXTRA: more oomb-train options for every run (e.g. EXTRA="--offload-block 256").
# 7B: --trainable linear --opt-state bf16, chunk 2048 (CHUNK7B), page 128, random weights made in memory, no
# --attn-cache (a streamed KV cache cannot keep it; the resident run goes without it too, the same work).
# Binaries: $BINS (default /tmp/bins-after, unpacked by bench/gpu/compare.sh or by hand from
# .devcarry/gpu-bins.tar.xz). Every run's summary line goes to $OUT/summary.txt, logs to $OUT/logs.tgz.
set -o pipefail
BINS=${BINS:-/tmp/bins-after}
R=${OUT:-out}; mkdir -p "$R"; W=/tmp/offload-bench; mkdir -p $W
exec > >(tee -a "$R/summary.txt") 2>&1
trap '(cd $W && tar -czf "$R/logs.tgz" *.log *.jsonl 2>/dev/null)' EXIT
[ -f /tmp/rand.bin ] || python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
free -g | head -2
# run NAME PRESET CTX ARGS...: one training step (after the memory plan), prints the plan and the step line
run() {
    local name=$1 preset=$2 ctx=$3; shift 3
    local extra="--trainable linear --opt-state bf16"; [ "$preset" = qwen2.5-0.5b ] && extra="--trainable all"
    rm -rf /tmp/r-$name
    /usr/bin/time -v timeout ${LIMIT:-560} $BINS/oomb-train --preset $preset --device cuda --ctx $ctx --chunk ${CHUNK7B:-2048} --page 128 \
        --steps 1 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin $extra ${EXTRA:-} -o /tmp/r-$name "$@" \
        > $W/$name.log 2>&1
    local rc=$?
    cp /tmp/r-$name/train.jsonl $W/$name.jsonl 2>/dev/null
    echo "== $name ($preset, ctx $ctx, $*) rc=$rc"
    grep -E "memory plan|KV cache|device total|^step|error|Maximum resident" $W/$name.log | sed 's/^ *//' | cut -c1-400
}
case ${1:-overhead} in
    overhead)
        run 7b-128k-resident qwen2.5-7b 131072 --offload off
        run 7b-128k-offload qwen2.5-7b 131072 --offload on
        ;;
    curve)
        shift
        for c in ${*:-32768 65536}; do run 7b-$c-offload qwen2.5-7b $c --offload on; done
        ;;
    pair)
        run 7b-$2-resident qwen2.5-7b $2 --offload off
        run 7b-$2-offload qwen2.5-7b $2 --offload on
        ;;
    long)
        run ${3:-qwen2.5-7b}-$2-offload-${OFFLOAD:-on} ${3:-qwen2.5-7b} $2 --offload ${OFFLOAD:-on}
        ;;
esac
