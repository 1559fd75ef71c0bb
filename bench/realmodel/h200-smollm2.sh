#!/usr/bin/env bash
# SmolLM2-135M-Instruct on the H200 (issue 15's checks), one device call:
#   1. CUDA logits of the real GGUF on 320 tokens of real text (one chunk; chunks of 128 over pages
#      of 48) -> $OUT/cuda-320.safetensors, $OUT/cuda-128.safetensors, compared here afterwards by
#      tests/py/test_smollm2_parity.py (OOMB_SMOLLM2_CUDA_DUMPS=DIR: HF float64 vs CUDA, bf16 tolerance 3e-2).
#   2. Fine-tuning at 32K and 128K tokens with RoPE scaled (--rope-theta 1e6; SmolLM2 was trained
#      with 1e5 at 8K) on the shipped documentation text: tokens/s and GPU memory, and HF
#      transformers (bf16, SDPA, gradient checkpointing, AdamW) on the same shapes in the same call.
# Expects: the GGUF at $GGUF (default /tmp/keep/smol.gguf, assembled from parts by the caller),
# the token file at $IDS, GPU binaries in $BINS (bench/gpu/pack.sh, unpacked).
set -o pipefail
GGUF=${GGUF:-/tmp/keep/smol.gguf} IDS=${IDS:-/tmp/keep/ids.safetensors} BINS=${BINS:-/tmp/bins-after}
R=${OUT:-out}; mkdir -p "$R"
exec > >(tee "$R/summary.txt") 2>&1
nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv
[ -f "$GGUF" ] || { echo "no GGUF at $GGUF"; exit 1; }
for c in "320 128" "128 48"; do
    set -- $c
    timeout 120 $BINS/oomb-train -m "$GGUF" --tokens "$IDS" --dump-logits "$R/cuda-$1.safetensors" --device cuda \
        --chunk $1 --page $2 > "$R/logits-$1.log" 2>&1
    echo "cuda logits chunk $1 page $2 rc=$?"; tail -2 "$R/logits-$1.log"
done
# files over ~30 MB do not come back from the GPU machine: split a dump into parts of 128 positions
python3 - "$R" <<'PY'
import os, sys
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
for n in sorted(os.listdir(d)):
    p = os.path.join(d, n)
    if not (n.startswith("cuda-") and n.endswith(".safetensors")) or os.path.getsize(p) < 30e6:
        continue
    with safe_open(p, "np") as f:
        meta = f.metadata()
    L, p0 = load_file(p)["logits"], int(meta["first_position"])
    for i in range(0, L.shape[0], 128):
        save_file({"logits": L[i:i + 128].copy()}, p[:-12] + f".part{i // 128}.safetensors", {**meta, "first_position": str(p0 + i)})
    os.remove(p)
    print("split", n, "into", (L.shape[0] + 127) // 128, "parts")
PY
for ctx in 32768 131072; do
    rm -rf /tmp/smol-$ctx
    timeout 240 $BINS/oomb-train -m "$GGUF" --data data/python-docs.txt.gz --device cuda --ctx $ctx --chunk ${CHUNK:-16384} \
        --page 128 --rope-theta 1e6 --steps 3 --warmup 1 --lr 1e-5 --eval-every 0 --save-every -1 -o /tmp/smol-$ctx \
        > "$R/train-$ctx.log" 2>&1
    echo "ours $ctx rc=$?"; grep -E "^step|plan|error|memory" "$R/train-$ctx.log" | tail -5
    cp /tmp/smol-$ctx/train.jsonl "$R/train-$ctx.jsonl" 2>/dev/null
    [ $ctx = 32768 ] && { timeout 240 $BINS/oomb-train -m "$GGUF" --data data/python-docs.txt.gz --device cuda --ctx $ctx --chunk $ctx \
        --page 128 --rope-theta 1e6 --steps 3 --warmup 1 --lr 1e-5 --eval-every 0 --save-every -1 -o /tmp/smol-$ctx-1c \
        > "$R/train-$ctx-onechunk.log" 2>&1; echo "ours $ctx one chunk rc=$?"; grep -E "^step|error" "$R/train-$ctx-onechunk.log" | tail -3; }
    timeout 200 python3 bench/realmodel/hf_smollm2.py $ctx 3 1e6 | tee "$R/hf-$ctx.json"
done
# only a few files come back: the logs travel as one archive
(cd "$R" && tar -czf logs.tgz *.log *.jsonl 2>/dev/null && rm -f *.log *.jsonl)
