#!/usr/bin/env bash
# One device call on the H200 that compares two sets of binaries (before / after a change that must
# not move speed or memory), interleaved so that machine drift hits both alike, with HF + SDPA in the
# same call as the outside anchor, and the CUDA tests of the "after" set:
#   bench/gpu/compare.sh [tests] [e2e] [7b]            (default: all three)
# Expects .devcarry/gpu-bins-before.tar.xz and .devcarry/gpu-bins.tar.xz (bench/gpu/pack.sh; the
# "before" one packed from a worktree of the older commit), .devcarry/fixtures, .devcarry/hf_baseline.py.
#   CTX05=32768 (0.5B, all parameters, one chunk as long as the sequence), STEPS05=3 (the last counts)
#   CTX7B=131072 CHUNK7B=2048 (7B --trainable linear --opt-state bf16, bf16 attention cache, 1 step)
# Prints a table last: tok/s, s/step and GPU peak for both sets and the ratio after/before.
set -o pipefail
FINAL=${OUT:-out}; mkdir -p "$FINAL"
OUT=/tmp/oomb-compare; rm -rf $OUT; mkdir -p $OUT
trap 'sleep 1; tar -czf "$FINAL/results.tgz" -C $OUT . ; cp $OUT/summary.txt "$FINAL/" 2>/dev/null' EXIT
exec > >(tee $OUT/summary.txt) 2>&1
D=$PWD/.devcarry
MODES=${*:-tests e2e 7b}
for s in before after; do
    mkdir -p /tmp/bins-$s
    f=$D/gpu-bins.tar.xz; [ $s = before ] && f=$D/gpu-bins-before.tar.xz
    [ $s = before ] && [ "$MODES" = tests ] && [ ! -f "$f" ] && continue   # the tests need only the new set
    tar -xJf "$f" -C /tmp/bins-$s || { echo "missing $f"; exit 1; }
done
cat $D/bins-commit.txt $D/bins-before-commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv
want() { [[ " $MODES " == *" $1 "* ]]; }
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<22, dtype=np.uint32).tofile('/tmp/rand.bin')"
export OOMB_FIXTURES=$D/fixtures OOMB_SOURCE_DIR=$PWD

if want tests; then
    B=/tmp/bins-after; export OOMB_BIN_DIR=$B
    for t in $(cd $B && ls test-cuda-*); do
        timeout 300 $B/$t > "$OUT/$t.log" 2>&1
        echo "$t rc=$?"; grep -E "FAILED|PASSED|SKIPPED" "$OUT/$t.log" | head -12
    done
fi

# last_step LOG: "tok/s s/step GPU-bytes" of the last progress line of train.jsonl
last_step() { python3 - "$1" <<'EOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if 'tok_per_s' in r]
r = rows[-1] if rows else {}
print(r.get("tok_per_s", "nan"), r.get("step_s", "nan"), r.get("device_mem_bytes", "nan"))
EOF
}
declare -A RES
run05() { # set ctx
    local s=$1 ctx=$2; rm -rf /tmp/r05-$s
    timeout 300 /tmp/bins-$s/oomb-train --preset qwen2.5-0.5b --device cuda --ctx $ctx --chunk $ctx --page 128 \
        --steps ${STEPS05:-3} --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin \
        --trainable all -o /tmp/r05-$s > "$OUT/0.5b-$ctx-$s.log" 2>&1
    echo "0.5b $ctx $s rc=$?"; grep -E "^step|error" "$OUT/0.5b-$ctx-$s.log" | tail -3
    cp /tmp/r05-$s/train.jsonl "$OUT/0.5b-$ctx-$s.jsonl" 2>/dev/null && RES[0.5b-$s]=$(last_step /tmp/r05-$s/train.jsonl)
}
run7b() {
    local s=$1 ctx=$2 chunk=$3; rm -rf /tmp/r7b-$s
    timeout 420 /tmp/bins-$s/oomb-train --preset qwen2.5-7b --device cuda --ctx $ctx --chunk $chunk --page 128 \
        --steps 1 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin \
        --trainable linear --opt-state bf16 --attn-cache --attn-cache-type bf16 -o /tmp/r7b-$s > "$OUT/7b-$ctx-$s.log" 2>&1
    echo "7b $ctx $s rc=$?"; grep -E "^step|error|plan" "$OUT/7b-$ctx-$s.log" | tail -4
    cp /tmp/r7b-$s/train.jsonl "$OUT/7b-$ctx-$s.jsonl" 2>/dev/null && RES[7b-$s]=$(last_step /tmp/r7b-$s/train.jsonl)
}
if want e2e; then
    C=${CTX05:-32768}
    run05 before $C; run05 after $C
    PYTHONUNBUFFERED=1 timeout 240 python3 $D/hf_baseline.py qwen2.5-0.5b full $C 3 2>/dev/null | tail -1 | tee "$OUT/hf-0.5b-$C.json"
fi
if want 7b; then
    run7b before ${CTX7B:-131072} ${CHUNK7B:-2048}; run7b after ${CTX7B:-131072} ${CHUNK7B:-2048}
fi
echo; echo "run     set     tok/s   s/step   GPU bytes"
for k in 0.5b-before 0.5b-after 7b-before 7b-after; do [ -n "${RES[$k]:-}" ] && echo "$k ${RES[$k]}"; done
python3 - "${RES[0.5b-before]:-}" "${RES[0.5b-after]:-}" "${RES[7b-before]:-}" "${RES[7b-after]:-}" <<'EOF'
import sys
def ratio(a, b):
    try: return "%.3f" % (float(b.split()[0]) / float(a.split()[0]))
    except Exception: return "n/a"
print("after/before tok/s: 0.5B", ratio(sys.argv[1], sys.argv[2]), " 7B", ratio(sys.argv[3], sys.argv[4]))
EOF
