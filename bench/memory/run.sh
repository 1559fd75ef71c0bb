#!/usr/bin/env bash
# Peak resident memory of one OOMB training step (forward + backward) against context length:
# one process per length (so each peak RSS belongs to its length), then a least-squares fit of
# peak RSS against tokens, compared with the KV + KV-gradient bytes per token.
#
#   bench/memory/run.sh                 # lengths 4K 8K 16K 32K 64K
#   LENGTHS="4096 8192" bench/memory/run.sh
#   BIN=build-bench/bin THREADS=2 bench/memory/run.sh
#   EXTRA="--resident-pages 0" OUT=bench/offload/cpu-memory.jsonl bench/memory/run.sh   # host offload (stand-in device pools)
#
# Model: qwen2-micro's widths (vocab 4096, hidden 128, ffn 352, head dim 64) with one layer, one
# query head and one KV head, random weights: the CPU attention is O(S^2), so few layers and heads keep 64K
# within a couple of minutes. Chunk 1024, page 64. Results (JSON lines) go to $OUT (default
# bench/memory/results.jsonl); the summary table is printed.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
THREADS=${THREADS:-2}
LENGTHS=${LENGTHS:-"4096 8192 16384 32768 65536"}
CHUNK=${CHUNK:-1024}
PAGE=${PAGE:-64}
MODEL_ARGS=${MODEL_ARGS:-"--n-layer 1 --n-head 1 --n-head-kv 1 --head-dim 64 --n-embd 128 --n-ff 352 --n-vocab 4096"}
OUT=${OUT:-bench/memory/results.jsonl}
[ -x "$BIN/oomb-bench-memory" ] || { echo "no $BIN/oomb-bench-memory: build first (cmake --build build)" >&2; exit 1; }
: > "$OUT"
for n in $LENGTHS; do
    echo "ctx $n ..." >&2
    # shellcheck disable=SC2086
    "$BIN/oomb-bench-memory" --ctx "$n" --chunk "$CHUNK" --page "$PAGE" --threads "$THREADS" $MODEL_ARGS ${EXTRA:-} >> "$OUT"
done
python3 bench/memory/fit.py "$OUT"
