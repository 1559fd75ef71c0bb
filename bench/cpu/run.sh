#!/usr/bin/env bash
# Training-step throughput on the CPU: ggml-oomb (oomb-bench-train) against PyTorch (bench_torch.py:
# HF transformers' Qwen2ForCausalLM, SDPA attention) on qwen2-micro (the fixture's weights, f32), one
# sequence of 4096 tokens (batch 1), forward + backward with every parameter trainable, 2 threads
# each. The implementations alternate (ours, PyTorch, ours, ...) REPS times, each process timing
# one step after one warm-up step; the medians give the ratio, all from the same run.
#
#   bench/cpu/run.sh                        # BIN=build/bin CTX=4096 THREADS=2 REPS=3
#
# PyTorch runs with OMP_WAIT_POLICY=PASSIVE (TORCH_OMP_WAIT_POLICY= to change): with its default
# (spinning OpenMP workers) a step takes 3-6 s instead of ~0.9 s whenever other processes share
# the 2 cores, which is the normal state of this machine. EAGER=1 adds HF with eager attention.
#
# PyTorch comes from PyPI into a virtual environment ($VENV, default ~/.cache/oomb-bench-venv):
# the torch wheel without its CUDA dependencies (--no-deps; ~540 MB) plus the few CUDA libraries
# that its libraries link against and this machine's /usr/local/cuda lacks (cufile, cuSPARSELt,
# NVSHMEM, NCCL: ~520 MB together); the CPU-only wheels are not on PyPI. Where torch then still
# does not import, TORCH_FULL=1 installs torch with all its dependencies (several GB).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
CTX=${CTX:-4096}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
VENV=${VENV:-$HOME/.cache/oomb-bench-venv}
FIXTURE=${FIXTURE:-../shared/fixtures/qwen2-micro}
OUT=${OUT:-bench/cpu/results.jsonl}
TORCH_VERSION=2.15.0
TORCH_POLICY=${TORCH_OMP_WAIT_POLICY-PASSIVE}

[ -x "$BIN/oomb-bench-train" ] && [ -x "$BIN/oomb-convert-hf" ] || { echo "build first: $BIN/oomb-bench-train, $BIN/oomb-convert-hf" >&2; exit 1; }
[ -f "$FIXTURE/config.json" ] || { echo "no fixture at $FIXTURE (set FIXTURE=)" >&2; exit 1; }

# ---- PyTorch ------------------------------------------------------------------------------------
PY="$VENV/bin/python"
if ! "$PY" -c "import torch, transformers, safetensors" 2>/dev/null; then
    echo "installing PyTorch $TORCH_VERSION (CPU use) into $VENV ..." >&2
    [ -x "$PY" ] || python3 -m venv "$VENV"
    "$PY" -m pip install -q --no-deps "torch==$TORCH_VERSION"
    "$PY" -m pip install -q filelock "typing-extensions>=4.13" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy safetensors transformers
    "$PY" -m pip install -q --no-deps nvidia-cufile==1.17.1.22 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7
    if ! "$PY" -c "import torch" 2>/dev/null; then
        if [ "${TORCH_FULL:-0}" = 1 ]; then
            "$PY" -m pip install -q "torch==$TORCH_VERSION"
        else
            "$PY" -c "import torch" || true
            echo "torch does not import without its full CUDA dependency set; TORCH_FULL=1 installs it (several GB)" >&2
            exit 77
        fi
    fi
fi

# ---- the model as GGUF for ours ---------------------------------------------------------------
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$BIN/oomb-convert-hf" "$FIXTURE" -o "$TMP/model.gguf" > "$TMP/convert.log" 2>&1 || { cat "$TMP/convert.log" >&2; exit 1; }

: > "$OUT"
run() {  # label, command...
    local label=$1; shift
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    local line; line=$("$@" 2> "$TMP/err.log") || { cat "$TMP/err.log" >&2; exit 1; }
    echo "$line" | python3 -c "import json,sys; j=json.loads(sys.stdin.read()); j['label']='$label'; j['loadavg_before']=$load; print(json.dumps(j))" >> "$OUT"
    echo "  $label: $(echo "$line" | python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print('%.3f s/step, %.0f tokens/s, loss %.6f' % (j['median_s'], j['tokens_per_s'], j['loss']))") (load $load)" >&2
}
for r in $(seq 1 "$REPS"); do
    echo "round $r/$REPS" >&2
    run "ggml-oomb chunk $CTX" "$BIN/oomb-bench-train" -m "$TMP/model.gguf" --ctx "$CTX" --chunk "$CTX" --page 64 --threads "$THREADS" --reps 1 --warmup 1
    run "pytorch hf sdpa" env OMP_WAIT_POLICY="$TORCH_POLICY" "$PY" bench/cpu/bench_torch.py --fixture "$FIXTURE" --ctx "$CTX" --threads "$THREADS" --reps 1 --warmup 1 --impl hf --attn sdpa
    run "ggml-oomb chunk 1024" "$BIN/oomb-bench-train" -m "$TMP/model.gguf" --ctx "$CTX" --chunk 1024 --page 64 --threads "$THREADS" --reps 1 --warmup 1
    if [ "${EAGER:-0}" = 1 ]; then
        run "pytorch hf eager" env OMP_WAIT_POLICY="$TORCH_POLICY" "$PY" bench/cpu/bench_torch.py --fixture "$FIXTURE" --ctx "$CTX" --threads "$THREADS" --reps 1 --warmup 1 --impl hf --attn eager
    fi
done
python3 bench/cpu/summary.py "$OUT"
