#!/usr/bin/env bash
# One device call: paged attention tests, kernel-variant sweep at 32K, then the benchmark beside
# PyTorch SDPA. Logs under $OUT. Usage (on the GPU machine, repo root): bench/attention/run-device.sh [sweep]
set -o pipefail
B=${B:-build-pattn/bin}
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$OUT/smi.txt" 2>&1
timeout 120 "$B/test-cuda-paged-attn" > "$OUT/test.log" 2>&1
echo "test rc=$?"
grep -E "^\[ case|Failure|Expected|actual|OK \]|FAILED|PASSED|SKIPPED" "$OUT/test.log" | head -60
if [ "${1:-}" = sweep ]; then
    for v in 0 1 2; do echo "fwd variant $v"; OOMB_PAGED_ATTN_FWD=$v timeout 60 "$B/oomb-bench-attn" --seq 32768 --fwd-only --reps 3; done 2>&1 | tee "$OUT/sweep.log"
    for v in 0 1 2; do echo "bwd variant $v"; OOMB_PAGED_ATTN_BWD=$v timeout 60 "$B/oomb-bench-attn" --seq 32768 --reps 3; done 2>&1 | tee -a "$OUT/sweep.log"
fi
PYTHONUNBUFFERED=1 timeout 200 python3 bench/attention/bench_attn.py --bin "$B/oomb-bench-attn" --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^running"
