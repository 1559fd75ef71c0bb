#!/usr/bin/env bash
# Sparse-attention fidelity on a real model (issue 13, bench/sparse/RESULTS.md), SmolLM2-135M-Instruct
# (GGUF at $GGUF), in ONE device call; parts run separately or together:
#   bench/sparse/fidelity.sh ids           token ids of the shipped documentation (below)           ~10 s
#   bench/sparse/fidelity.sh grads CTX...  dense --dump-grads, then every sparse setting against it,
#                                           summarised on the device (fidelity.py compare)          16K ~1.5 min, 64K ~3 min
#   bench/sparse/fidelity.sh finetune      FT_STEPS steps at FT_CTX, dense vs sparse FT_K, held-out
#                                           loss every FT_EVAL steps                                 ~1.5 min
#   bench/sparse/fidelity.sh all           ids, grads 16384 65536, finetune                          ~6-7 min
# Estimates for the H200 from bench/realmodel/RESULTS.md (SmolLM2-135M trains at 30-40K tok/s at
# 16K-32K, ~14K at 128K; sparse is faster): each run also loads the model (~3 s) and writes or
# reads 540 MB of f32 gradients (~2 s). A run at 64K: ~5 s dense, less sparse.
#
# The text: every *.md of the repository (README.md first, then bench/**, then the rest) and the
# public headers ggml-oomb/*.h (the API's doc comments), concatenated in that order, tokenized with
# the GGUF's tokenizer, repeated only if shorter than the longest context (the script prints how
# many tokens the text has before any repetition, and how many distinct ids).
# Grid per context: dense; K = all pages (must equal dense exactly: a check); K in BUDGETS x score
# in SCORES x sink in SINKS (sink pages inside K). Page PAGE (128), chunk CHUNK (4096): the
# reference's setting; the current chunk is always attended densely, so the chunk size decides how
# much of the context goes through selection: at 4096 (32 pages) every chunk after the first sees
# a history of 32, 64, ... pages, and at 16K K=256 covers every history (equals dense), K=64 makes
# only the last chunk sparse; at 64K (histories up to 480 pages) all three budgets select.
# SmolLM2 was trained at 8K with RoPE theta 1e5: ROPE (default 1e6) is how the project runs it at
# 16K+ (bench/realmodel/RESULTS.md); the same theta for dense and sparse, so the comparison is fair.
# Fine-tune: all weights (FT_TRAINABLE), data FT_DATA (default data/python-docs.txt.gz, 2.39M
# tokens: enough for FT_STEPS x FT_CTX training tokens without repeating, and a held-out 5 %); the
# sparse run's held-out loss uses the sparse rule (oomb-train evaluates with its own driver), so a
# dense evaluation of both final models on the same held-out sequences follows (FT_DENSE_EVAL=1, default).
#
# Environment: BINS (oomb-train, oomb-eval, oomb-tokenize; default /tmp/bins-after), GGUF (default
# /tmp/keep/smol.gguf), DEVICE (cuda; cpu for the small trial), THREADS, PAGE, CHUNK, BUDGETS
# ("16 64 256"), SCORES ("mean quest"), SINKS ("0 1"), ROPE, FT_CTX (16384), FT_CHUNK (CHUNK),
# FT_STEPS (30), FT_EVAL (5), FT_EVAL_SEQS (2), FT_K (64), FT_LR (2e-5), LIMIT (seconds per run, 300),
# WORK (big files, default /tmp/fidelity). Small outputs in $OUT (default out): summary.txt,
# fidelity-CTX.jsonl + .md, curves.md, ft-*.jsonl, logs.tgz. No file over a few hundred KB.
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd); SRC=$(cd "$HERE/../.." && pwd)
BINS=${BINS:-/tmp/bins-after} GGUF=${GGUF:-/tmp/keep/smol.gguf} DEVICE=${DEVICE:-cuda}
PAGE=${PAGE:-128} CHUNK=${CHUNK:-4096} BUDGETS=${BUDGETS:-16 64 256} SCORES=${SCORES:-mean quest} SINKS=${SINKS:-0 1}
ROPE=${ROPE:-1e6} LIMIT=${LIMIT:-300} WORK=${WORK:-/tmp/fidelity}
FT_CTX=${FT_CTX:-16384} FT_CHUNK=${FT_CHUNK:-$CHUNK} FT_STEPS=${FT_STEPS:-30} FT_EVAL=${FT_EVAL:-5} FT_EVAL_SEQS=${FT_EVAL_SEQS:-2}
FT_K=${FT_K:-64} FT_LR=${FT_LR:-2e-5} FT_DATA=${FT_DATA:-$SRC/data/python-docs.txt.gz} FT_TRAINABLE=${FT_TRAINABLE:-all}
FT_DENSE_EVAL=${FT_DENSE_EVAL:-1}
RES=${OUT:-out}; mkdir -p "$RES" "$WORK/logs"; RES=$(cd "$RES" && pwd)
THR=(); [ -n "${THREADS:-}" ] && THR=(--threads "$THREADS")
exec > >(tee -a "$RES/summary.txt") 2>&1
trap '(cd "$WORK/logs" && tar -czf "$RES/logs.tgz" *.log 2>/dev/null)' EXIT
FID="python3 $HERE/fidelity.py"
IDS=$WORK/ids.safetensors
for b in oomb-train oomb-eval; do [ -x "$BINS/$b" ] || { echo "no $BINS/$b (set BINS)"; exit 1; }; done
[ -f "$GGUF" ] || { echo "no GGUF at $GGUF (set GGUF)"; exit 1; }
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
echo "fidelity.sh $* (device $DEVICE, page $PAGE, chunk $CHUNK, rope theta $ROPE; $(cd "$SRC" && git log -1 --format=%h 2>/dev/null))"

# ids N: $IDS with N token ids of the documentation (input_ids int32 [N])
make_ids() {
    local n=$1 txt=$WORK/docs.txt
    [ -x "$BINS/oomb-tokenize" ] || { echo "no $BINS/oomb-tokenize (bench/gpu/pack.sh packs it)"; exit 1; }
    (cd "$SRC" && { ls README.md; find bench -name '*.md' | sort; find . -name '*.md' -not -path './bench/*' -not -path './build*' \
        -not -path './.git/*' -not -name README.md -printf '%P\n' | sort; ls ggml-oomb/*.h; } | while read -r f; do
        printf '\n\n# %s\n\n' "$f"; cat "$f"; done) > "$txt"
    "$BINS/oomb-tokenize" -m "$GGUF" -f "$txt" > "$WORK/docs.ids" || { echo "oomb-tokenize failed"; exit 1; }
    python3 - "$WORK/docs.ids" "$IDS" "$n" "$txt" <<'PY'
import sys, numpy as np
from safetensors.numpy import save_file
ids = np.array(open(sys.argv[1]).read().split(), dtype=np.int32)
n = int(sys.argv[3])
reps = -(-n // len(ids))
print(f"text: {sum(1 for _ in open(sys.argv[4], 'rb'))} lines, {len(ids)} tokens before any repetition, {len(np.unique(ids))} distinct ids; "
      f"{n} tokens used" + (f" (the text repeated {reps}x: {len(ids)} unique positions)" if reps > 1 else " (no repetition)"))
save_file({"input_ids": np.tile(ids, reps)[:n].copy()}, sys.argv[2])
PY
}

# run TAG CTX [options...]: one --dump-grads run on the first CTX ids, to $WORK/TAG.safetensors
run() {
    local tag=$1 ctx=$2; shift 2
    python3 -c "import sys; from safetensors.numpy import load_file, save_file; i = load_file('$IDS')['input_ids']
if i.size < $ctx: sys.exit('the ids have only %d tokens, need $ctx: run the ids part with a longer context' % i.size)
save_file({'input_ids': i[:$ctx].copy()}, '$WORK/ids-$ctx.safetensors')" || exit 1
    local t0=$SECONDS
    timeout "$LIMIT" "$BINS/oomb-train" -m "$GGUF" --tokens "$WORK/ids-$ctx.safetensors" --device "$DEVICE" "${THR[@]}" --chunk "$CHUNK" \
        --page "$PAGE" --rope-theta "$ROPE" --dump-grads "$WORK/$tag.safetensors" "$@" > "$WORK/logs/$tag.log" 2>&1
    local rc=$?
    echo "== $tag ($*) rc=$rc $((SECONDS - t0)) s: $(grep -E '^loss|sparse attention|error' "$WORK/logs/$tag.log" | cut -c1-200 | tr '\n' ' ')"
    return $rc
}

grads() {
    local ctx=$1 pages=$(( ($1 + PAGE - 1) / PAGE )) jl=$RES/fidelity-$1.jsonl
    rm -f "$jl"
    run dense-$ctx "$ctx" || return 1
    cmp_rm() {  # cmp_rm TAG: compare with dense, keep the summary, drop the dump
        $FID compare "$WORK/dense-$ctx.safetensors" "$WORK/$1.safetensors" --tag "$1" --jsonl "$jl" && rm -f "$WORK/$1.safetensors"
    }
    run "all$pages-$ctx" "$ctx" --sparse-pages "$pages" && cmp_rm "all$pages-$ctx"
    for k in $BUDGETS; do for s in $SCORES; do for sink in $SINKS; do
        local tag=k$k-$s-sink$sink-$ctx
        run "$tag" "$ctx" --sparse-pages "$k" --sparse-score "$s" --sparse-sink "$sink" && cmp_rm "$tag"
    done; done; done
    rm -f "$WORK/dense-$ctx.safetensors"
    echo "### context $ctx: page $PAGE, chunk $CHUNK, $pages pages ($(( (ctx - 1) / CHUNK )) chunks with a history)"
    $FID table "$jl" --out "$RES/fidelity-$ctx.md"
}

# ft TAG [options...]: the fine-tune, held-out loss every FT_EVAL steps, then optionally a dense oomb-eval
ft() {
    local tag=$1; shift
    rm -rf "$WORK/$tag"
    local t0=$SECONDS
    timeout "$LIMIT" "$BINS/oomb-train" -m "$GGUF" --data "$FT_DATA" --device "$DEVICE" "${THR[@]}" --ctx "$FT_CTX" --chunk "$FT_CHUNK" \
        --page "$PAGE" --rope-theta "$ROPE" --trainable "$FT_TRAINABLE" --steps "$FT_STEPS" --warmup 3 --lr "$FT_LR" \
        --eval-every "$FT_EVAL" --eval-seqs "$FT_EVAL_SEQS" --save-every "$([ "$FT_DENSE_EVAL" = 1 ] && echo 0 || echo -1)" \
        $([ "$FT_TRAINABLE" != lora ] && echo --out-type f32) \
        -o "$WORK/$tag" "$@" > "$WORK/logs/$tag.log" 2>&1
    local rc=$?
    cp "$WORK/$tag/train.jsonl" "$RES/$tag.jsonl" 2>/dev/null
    echo "== $tag ($*) rc=$rc $((SECONDS - t0)) s: $(grep -E '^step|error' "$WORK/logs/$tag.log" | tail -2 | cut -c1-200 | tr '\n' ' ')"
    [ $rc = 0 ] || return $rc
    if [ "$FT_DENSE_EVAL" = 1 ]; then
        # dense held-out loss of the final model: oomb-train evaluates -m at step 0 before training, on
        # the same held-out sequences (same data, --ctx, --eval-split, --eval-seqs); its one step is discarded
        local m=(-m "$WORK/$tag/model.gguf"); [ "$FT_TRAINABLE" = lora ] && m=(-m "$GGUF" --lora "$WORK/$tag/adapter.gguf")
        rm -rf "$WORK/$tag-eval"
        timeout "$LIMIT" "$BINS/oomb-train" "${m[@]}" --data "$FT_DATA" --device "$DEVICE" "${THR[@]}" --ctx "$FT_CTX" --chunk "$FT_CHUNK" \
            --page "$PAGE" --rope-theta "$ROPE" --steps 1 --warmup 0 --lr 1e-12 --eval-every 1 --eval-seqs "$FT_EVAL_SEQS" --save-every -1 \
            -o "$WORK/$tag-eval" > "$WORK/logs/$tag-eval.log" 2>&1
        local erc=$?
        python3 -c "import json, sys; e = [j for j in map(json.loads, open(sys.argv[1])) if j.get('step') == 0 and 'eval_loss' in j]
print(json.dumps({'run': sys.argv[2], 'dense_eval_loss': e[0]['eval_loss'], 'eval_targets': e[0]['eval_targets']}))" \
            "$WORK/$tag-eval/train.jsonl" "$tag" > "$RES/$tag-dense-eval.json" 2>/dev/null
        echo "   dense held-out loss of $tag's final model: rc=$erc $(cat "$RES/$tag-dense-eval.json" 2>/dev/null)"
        rm -rf "$WORK/$tag/model.gguf" "$WORK/$tag/state.safetensors" "$WORK/$tag-eval"
    fi
}

finetune() {
    ft ft-dense && ft "ft-sparse$FT_K" --sparse-pages "$FT_K"
    $FID curves "dense=$RES/ft-dense.jsonl" "sparse $FT_K=$RES/ft-sparse$FT_K.jsonl" --out "$RES/curves.md"
    cat "$RES"/ft-*-dense-eval.json 2>/dev/null
}

case ${1:-all} in
    ids) make_ids "${2:-65536}" ;;
    grads) shift; [ -f "$IDS" ] || make_ids 65536; for c in ${*:-16384 65536}; do grads "$c"; done ;;
    finetune) finetune ;;
    all) make_ids 65536 && { grads 16384; grads 65536; finetune; } ;;
    *) echo "usage: $0 ids [N] | grads [CTX...] | finetune | all"; exit 2 ;;
esac
