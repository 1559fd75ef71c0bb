#!/usr/bin/env bash
# Checkpoints at 7B on the H200 (issue 19), one device call, a benchmark (nothing asserts on the
# times): Qwen2.5-7B (--preset, random weights made in memory) --trainable linear --opt-state bf16,
# ctx CTX (default 8192), chunk 4096, page 128, two steps, three runs:
#   nosave  --steps 2 --save-every -1                  peak RSS without a save; steps 1 and 2 (the reference)
#   kill    --steps 2 --save-every 1                   step 1, save (model.gguf + state.safetensors), step 2,
#                                                      then killed with SIGKILL as soon as step 2 is logged
#                                                      (inside the second save): an interrupted 7B run
#   resume  --resume --steps 2 --save-every 1          the killed run's folder: removes the dead save's
#                                                      temporary files, resumes at step 1, runs step 2 (its
#                                                      loss / lr / tokens are compared with nosave's step 2),
#                                                      then killed again inside its save (the disk holds one
#                                                      7B checkpoint, ~41 GB, not two)
# Printed: peak RSS (VmHWM, /usr/bin/time -v) of nosave and kill, the save time (the checkpoint line),
# the checkpoint's size, the time from start to "resume: from step" (load + checks, the 7B init
# included) and the resumed step beside the reference step. CKPT_DIR: where the checkpoint goes (needs
# ~45 GB free; default /tmp/ckpt7b). BINS: the GPU binaries (default /tmp/bins-after).
set -uo pipefail
BINS=${BINS:-/tmp/bins-after} CTX=${CTX:-8192} D=${CKPT_DIR:-/tmp/ckpt7b}
R=${OUT:-out}; mkdir -p "$R"; L=/tmp/ckpt-bench; rm -rf "$L" "$D" /tmp/ckpt7b-nosave; mkdir -p "$L"
exec > >(tee -a "$R/summary.txt") 2>&1
trap '(cd $L && tar -czf "$R/logs.tgz" *.log *.jsonl *.time 2>/dev/null); rm -rf "$D" /tmp/ckpt7b-nosave' EXIT
IDS=/tmp/rand.bin
[ -f $IDS ] || python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('$IDS')"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; df -h "$(dirname "$D")" | tail -1; free -g | head -2
ARGS=(--preset "${PRESET:-qwen2.5-7b}" --device "${DEVICE:-cuda}" --trainable linear --opt-state bf16 --ctx "$CTX" --chunk "${CHUNK:-4096}" --page "${PAGE:-128}" --warmup 1
      --lr 1e-5 --eval-every 0 --eval-split 1 --data-bin $IDS --steps 2)

# run TAG KILL_AT_STEP2 ARGS...: oomb-train under /usr/bin/time; KILL_AT_STEP2=1: SIGKILL once "step 2/2" is logged
run() {
    local tag=$1 kill2=$2; shift 2
    local t0; t0=$(date +%s.%N)
    /usr/bin/time -v -o "$L/$tag.time" "$BINS/oomb-train" "${ARGS[@]}" "$@" > "$L/$tag.log" 2>&1 &
    local tpid=$! pid="" resumed="" killed=""
    while kill -0 $tpid 2>/dev/null; do
        [ -z "$pid" ] && pid=$(pgrep -P $tpid oomb-train | head -1)
        if [ -z "$resumed" ] && grep -q "^resume: from step" "$L/$tag.log"; then
            resumed=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')"); fi
        if [ "$kill2" = 1 ] && [ -z "$killed" ] && [ -n "$pid" ] && grep -q "^step 2/2" "$L/$tag.log"; then
            sleep 1; kill -9 "$pid"; killed=1; echo "   (SIGKILL to oomb-train $pid, 1 s after step 2 was logged: inside its save)"; fi
        sleep 0.5
    done
    wait $tpid; local rc=$?
    echo "== $tag rc=$rc wall $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s${resumed:+, resume line after $resumed s}"
    grep -E "^init|^model|memory plan|^step|^checkpoint|^resume|^note: removed|error" "$L/$tag.log" | cut -c1-300
    grep -E "Maximum resident|Elapsed" "$L/$tag.time" | sed 's/^\s*/   /'
}
run nosave 0 --save-every -1 -o /tmp/ckpt7b-nosave
cp /tmp/ckpt7b-nosave/train.jsonl "$L/nosave.jsonl" 2>/dev/null
run kill 1 --save-every 1 -o "$D"
ls -l "$D"; du -sh "$D"
cp "$D/train.jsonl" "$L/kill.jsonl" 2>/dev/null
run resume 1 --resume --save-every 1 -o "$D"
cp "$D/train.jsonl" "$L/resume.jsonl" 2>/dev/null
echo "== step 2: reference (nosave) vs resumed (train.jsonl)"
python3 - "$L/nosave.jsonl" "$L/resume.jsonl" <<'PY'
import json, sys
def step2(p):
    try: return [json.loads(l) for l in open(p) if '"loss"' in l and json.loads(l).get("step") == 2][-1]
    except (OSError, IndexError): return None
a, b = step2(sys.argv[1]), step2(sys.argv[2])
for k in ("loss", "lr", "tokens", "epoch", "grad_norm"):
    print(f"  {k:10s} reference {a.get(k) if a else '-'}   resumed {b.get(k) if b else '-'}")
if a and b:
    print(f"  loss rel. diff {abs(a['loss'] - b['loss']) / abs(a['loss']):.2e}; lr equal: {a['lr'] == b['lr']}; tokens equal: {a['tokens'] == b['tokens']}")
PY
