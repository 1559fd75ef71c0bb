#!/usr/bin/env bash
# LoRA benchmarks of issue 14 on the H200, one device call (bench/lora/README.md):
#   bench/lora/run-h200.sh [all]      HF + PEFT, ours bf16 base, ours q4_k_m base at 32K; then the q4_k_m base alone on
#                                     the GPU (--offload off) at 256K and 512K; the summary table last
#   bench/lora/run-h200.sh 32k        only the three 32K runs and the summary
#   bench/lora/run-h200.sh long CTX.. only the q4_k_m long-context runs (default 262144 524288) and the summary
# 7B = --preset qwen2.5-7b, random weights made in memory (no 7B file on the GPU machine); LoRA r16, alpha 32, all seven
# projections (q,k,v,o,gate,up,down), as hf_baseline.py's PEFT config. --base-type bf16: the random bf16 preset;
# --base-type q4_k_m: the projections made directly as random Q4_K / Q6_K blocks (llama.cpp's Q4_K_M mix).
# Chunk: CHUNK (default 8192) for every run, page 128. Why 8K and not one 32K chunk: at 8192 rows the 7B GEMMs already
# run at full tensor-core rate, so one chunk would only save stage 1's KV fill (about one forward of the layers) while
# the chunk arena (the activations of one chunk) grows 4x, against the memory half of the comparison; the long runs
# need a bounded arena anyway, and one chunk size keeps the 32K and the long runs comparable. ONECHUNK=1 adds a
# q4_k_m run with one chunk of 32K to measure that trade.
# Steps: STEPS (default 3) at 32K, the last step counts (the first pays the CUDA/cuBLAS warm-up); 1 step for the long
# runs (their memory is the result). LIMIT (default 560 s) caps every run; the device call's own limit is 600 s, so
# a full run may need `32k` and `long` as separate calls.
# Expects: GPU binaries in $BINS (default /tmp/bins-after, bench/gpu/pack.sh, unpacked), HF's script at $HF
# (default .devcarry/hf_baseline.py, a copy of ../shared/bench/hf_baseline.py). EXTRA: more oomb-train options for
# every run of ours. Output: $OUT/summary.txt (everything printed), $OUT/results.jsonl, $OUT/logs.tgz.
set -o pipefail
BINS=${BINS:-/tmp/bins-after} HF=${HF:-.devcarry/hf_baseline.py}
CHUNK=${CHUNK:-8192} STEPS=${STEPS:-3} LIMIT=${LIMIT:-560}
R=${OUT:-out}; mkdir -p "$R"; W=/tmp/lora-bench; mkdir -p $W
exec > >(tee -a "$R/summary.txt") 2>&1
trap '(cd $W && tar -czf "$R/logs.tgz" *.log *.jsonl 2>/dev/null)' EXIT
[ -f /tmp/rand.bin ] || python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
free -g | head -2
RES="$R/results.jsonl"

# hf CTX: HF transformers + PEFT LoRA r16 (bf16, SDPA, gradient checkpointing), its one JSON line into results.jsonl
hf() {
    echo "== hf-peft-$1"
    local line
    line=$(timeout $LIMIT python3 "$HF" qwen2.5-7b lora $1 ${HF_STEPS:-2} 2> $W/hf-$1.log | tail -1)
    echo "rc=$? $line"
    [ -n "$line" ] && python3 -c "import json,sys; j=json.loads(sys.argv[1]); j['name']='hf-peft-$1'; j['ctx']=$1; print(json.dumps(j))" "$line" >> "$RES"
}

# ours NAME BASE_TYPE CTX STEPS ARGS...: oomb-train 7B LoRA; prints the model line, the memory plan and the step lines
ours() {
    local name=$1 bt=$2 ctx=$3 steps=$4; shift 4
    rm -rf /tmp/r-$name
    /usr/bin/time -v timeout $LIMIT $BINS/oomb-train --preset qwen2.5-7b --device cuda --trainable lora --lora-rank 16 --lora-alpha 32 \
        --lora-targets q,k,v,o,gate,up,down --base-type $bt --ctx $ctx --chunk $CHUNK --page 128 --steps $steps --warmup 1 --lr 1e-5 \
        --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin ${EXTRA:-} -o /tmp/r-$name "$@" > $W/$name.log 2>&1
    local rc=$?
    cp /tmp/r-$name/train.jsonl $W/$name.jsonl 2>/dev/null
    echo "== $name (--base-type $bt, ctx $ctx, chunk $CHUNK, $*) rc=$rc"
    grep -E "^init:|^model:|memory plan|KV cache|weights .* memory|^step|error|Maximum resident" $W/$name.log | sed 's/^ *//' | cut -c1-400
    # the last step counts: its tok/s and the device memory in use after it (= the step's peak)
    python3 - "$W/$name.jsonl" "$name" $bt $ctx $rc >> "$RES" <<'PY'
import json, sys
path, name, bt, ctx, rc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
steps = []
try:
    steps = [json.loads(l) for l in open(path) if '"loss"' in l]
except OSError:
    pass
res = dict(name=name, base_type=bt, ctx=ctx, rc=rc, status="ok" if rc == 0 and steps else "failed")
if steps:
    s = steps[-1]
    res.update(steps=len(steps), step_s=s["step_s"], tok_per_s=s["tok_per_s"], loss=s["loss"],
               peak_gib=s.get("device_mem_bytes", 0) / 2**30)
print(json.dumps(res))
PY
}

summary() {
    echo "== summary (last step; ours: device memory in use after the step, HF: torch max_memory_allocated)"
    python3 - "$RES" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["name"]: r for r in rows}
hf, bf, q4 = by.get("hf-peft-32768"), by.get("ours-bf16-32768"), by.get("ours-q4_k_m-32768")
def ok(r): return r is not None and r.get("status") == "ok" and r.get("tok_per_s")
def ratio(a, b, k): return f"{a[k] / b[k]:.2f}x" if ok(a) and ok(b) and b.get(k) else "-"
print(f"| run | ctx | status | s/step | tok/s | peak GiB | tok/s vs HF | memory vs HF | vs bf16 base (tok/s, memory) |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    st = r.get("status", "?")
    t = f"{r['step_s']:.2f}" if r.get("step_s") else "-"
    tps = f"{r['tok_per_s']:.0f}" if r.get("tok_per_s") else "-"
    mem = f"{r['peak_gib']:.1f}" if r.get("peak_gib") else "-"
    same_ctx_hf = by.get(f"hf-peft-{r.get('ctx')}") if not r["name"].startswith("hf") else None
    same_ctx_bf = by.get(f"ours-bf16-{r.get('ctx')}") if r.get("base_type") == "q4_k_m" else None
    vs_hf = ratio(r, same_ctx_hf, "tok_per_s") if same_ctx_hf else "-"
    mem_hf = ratio(r, same_ctx_hf, "peak_gib") if same_ctx_hf else "-"
    vs_bf = f"{ratio(r, same_ctx_bf, 'tok_per_s')}, {ratio(r, same_ctx_bf, 'peak_gib')}" if same_ctx_bf else "-"
    print(f"| {r['name']} | {r.get('ctx', '-')} | {st} | {t} | {tps} | {mem} | {vs_hf} | {mem_hf} | {vs_bf} |")
if ok(q4) and ok(bf):
    print(f"q4_k_m base vs bf16 base at 32K: {100 * (1 - q4['tok_per_s'] / bf['tok_per_s']):+.1f} % slower (goal <= 15 %)")
for r in (bf, q4):
    if ok(r) and ok(hf):
        print(f"{r['name']}: {r['tok_per_s'] / hf['tok_per_s']:.2f}x HF tok/s at {r['peak_gib'] / hf['peak_gib']:.2f}x its memory "
              "(goal >= 1.5x at <= 0.5x)")
longest = [r["ctx"] for r in rows if r.get("base_type") == "q4_k_m" and r["name"].startswith("ours-q4_k_m-") and ok(r)]
print(f"longest q4_k_m context on the GPU alone: {max(longest) if longest else '-'} tokens (goal >= 524288)")
PY
}

case ${1:-all} in
    all|32k)
        hf 32768
        ours ours-bf16-32768 bf16 32768 $STEPS --offload off
        ours ours-q4_k_m-32768 q4_k_m 32768 $STEPS --offload off
        [ "${ONECHUNK:-0}" = 1 ] && CHUNK=32768 ours ours-q4_k_m-32768-onechunk q4_k_m 32768 $STEPS --offload off
        if [ "${1:-all}" = all ]; then
            for c in 262144 524288; do ours ours-q4_k_m-$c q4_k_m $c 1 --offload off; done
        fi
        ;;
    long)
        shift
        for c in ${*:-262144 524288}; do ours ours-q4_k_m-$c q4_k_m $c 1 --offload off; done
        ;;
    *) echo "usage: $0 [all | 32k | long CTX...]"; exit 2 ;;
esac
summary
