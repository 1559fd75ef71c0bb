#!/usr/bin/env bash
# One device call on the H200: CUDA tests and/or end-to-end training throughput beside the HF
# baseline (../shared/bench/hf_baseline.py, carried in .devcarry/) in the same run, and/or
# Qwen2.5-7B (--trainable linear, bf16 AdamW state, random weights made in memory) step times.
#   bench/gpu/run-h200.sh tests|e2e|7b|attn|wgmma|sweep64|all [ctx ...]      (MODES="tests 7b" runs several)
# Expects .devcarry/gpu-bins.tar.xz (test-cuda-*, oomb-train, oomb-convert-hf, oomb-bench-attn built here with
# static OpenBLAS/PCRE2/utf8proc, see bench/NOTES.md), .devcarry/fixtures and .devcarry/hf_baseline.py.
set -o pipefail
MODE=${1:-all}; shift || true
CTXS=${*:-16384 32768}
# everything is written to a work folder and packed into $OUT/results.tgz at the end (the device
# tool returns at most 8 files)
FINAL=${OUT:-out}; mkdir -p "$FINAL"
OUT=/tmp/oomb-results; rm -rf $OUT; mkdir -p $OUT
trap 'sleep 1; tar -czf "$FINAL/results.tgz" -C $OUT . ; cp $OUT/summary.txt "$FINAL/" 2>/dev/null' EXIT
exec > >(tee $OUT/summary.txt) 2>&1
D=$PWD/.devcarry
B=/tmp/oomb-bins; mkdir -p $B && tar -xJf $D/gpu-bins.tar.xz -C $B || exit 1
export OOMB_FIXTURES=$D/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv | tee "$OUT/smi.txt"
cat $D/bins-commit.txt 2>/dev/null | tee "$OUT/commit.txt"  # written by bench/gpu/pack.sh

MODES=${MODES:-$MODE}
want() { [ "$MODE" = all ] || [[ " $MODES " == *" $1 "* ]]; }
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<22, dtype=np.uint32).tofile('/tmp/rand.bin')"

if want tests; then
    for t in test-cuda-ops test-cuda-paged-attn test-cuda-paged-attn-numerics test-cuda-qwen2; do
        timeout 240 $B/$t > "$OUT/$t.log" 2>&1
        echo "$t rc=$?"
        grep -E "FAILED|PASSED|SKIPPED|relative error" "$OUT/$t.log" | head -12
    done
fi

if want e2e; then
    # entries: ctx, ctx:chunk or ctx:chunk:cache (default chunk 4096, the reference's; "cache" adds
    # --attn-cache, "bf16" --attn-cache --attn-cache-type bf16); HF once per ctx (NO_HF=1: skip)
    declare -A hf_done
    for spec in $CTXS; do
        IFS=: read -r ctx chunk cache <<< "$spec"; chunk=${chunk:-4096}
        extra=""; chunk_tag=$chunk
        [ "$cache" = cache ] && extra="--attn-cache" && chunk_tag="$chunk-cache"
        [ "$cache" = bf16 ] && extra="--attn-cache --attn-cache-type bf16" && chunk_tag="$chunk-cache-bf16"
        case "$cache" in ""|cache|bf16) ;; *) echo "unknown cache token '$cache' in '$spec' (cache or bf16)"; continue ;; esac
        rm -rf /tmp/run$ctx
        steps=${STEPS:-2}; [ $ctx -gt 32768 ] && steps=1
        OOMB_CUDA_PROFILE=${PROF:-1} timeout ${TRAIN_TIMEOUT:-240} $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx $ctx --chunk $chunk --page 128 --steps $steps \
            --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin \
            --trainable all $extra -o /tmp/run$ctx > "$OUT/oomb-0.5b-$ctx-c$chunk_tag.log" 2>&1
        echo "oomb 0.5b ctx $ctx chunk $chunk $extra rc=$?"; grep -E "^step|error" "$OUT/oomb-0.5b-$ctx-c$chunk_tag.log"; grep -A${PROFLINES:-4} "CUDA profile" "$OUT/oomb-0.5b-$ctx-c$chunk_tag.log"
        cp /tmp/run$ctx/train.jsonl "$OUT/oomb-0.5b-$ctx-c$chunk_tag.jsonl" 2>/dev/null
        # HF runs out of memory from 64K on (baselines/hf-peft-h200.jsonl)
        if [ $ctx -le 32768 ] && [ -z "${NO_HF:-}" ] && [ -z "${hf_done[$ctx]:-}" ]; then
            PYTHONUNBUFFERED=1 timeout 200 python3 $D/hf_baseline.py qwen2.5-0.5b full $ctx 2 2>/dev/null | tail -1 | tee "$OUT/hf-0.5b-$ctx.json"
            hf_done[$ctx]=1
        fi
    done
fi

if want 7b; then
    # Qwen2.5-7B shapes, linear weights + LM head trained (as the OOMB reference), AdamW with bf16
    # moments; chunk 2048 keeps one chunk's f32 activations (all 28 layers) near 20 GB
    for spec in ${CTX7B:-32768 65536 131072}; do   # ctx, ctx:chunk or ctx:chunk:cache|bf16
        IFS=: read -r ctx chunk cache <<< "$spec"; chunk=${chunk:-${CHUNK7B:-2048}}
        case "$cache" in ""|cache|bf16) ;; *) echo "unknown cache token '$cache' in '$spec' (cache or bf16)"; continue ;; esac
        extra=""; [ "$cache" = cache ] && extra="--attn-cache"; [ "$cache" = bf16 ] && extra="--attn-cache --attn-cache-type bf16"
        cache=${cache:+-$cache}
        rm -rf /tmp/r7b$ctx
        steps=2; [ $ctx -gt 32768 ] && steps=1
        OOMB_CUDA_PROFILE=1 timeout ${TRAIN_TIMEOUT_7B:-400} $B/oomb-train --preset qwen2.5-7b --device cuda --ctx $ctx --chunk $chunk --page 128 \
            --steps $steps --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin \
            --trainable linear --opt-state bf16 $extra -o /tmp/r7b$ctx > "$OUT/oomb-7b-$ctx-c$chunk$cache.log" 2>&1
        echo "oomb 7b ctx $ctx chunk $chunk $extra rc=$?"; grep -E "^train|^step|error|GPU time|paged_attn|mul_mat" "$OUT/oomb-7b-$ctx-c$chunk$cache.log" | head -20
        cp /tmp/r7b$ctx/train.jsonl "$OUT/oomb-7b-$ctx-c$chunk$cache.jsonl" 2>/dev/null
    done
fi

if want attn; then
    # attention kernel beside PyTorch SDPA (flash, cuDNN) in the same run, then two ablations at 32K:
    # the LSE recomputed (as before the saved statistics) and the backward without the row split
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/attention/bench_attn.py --bin $B/oomb-bench-attn --out $OUT 2>&1 | tee "$OUT/attn-bench.log" | grep -v "^running"
    echo "ablation at 32K: --recompute-lse"; timeout 60 $B/oomb-bench-attn --seq 32768 --reps 3 --recompute-lse 2>&1 | tail -3
    echo "ablation at 32K: OOMB_PAGED_ATTN_SPLIT=1"; OOMB_PAGED_ATTN_SPLIT=1 timeout 60 $B/oomb-bench-attn --seq 32768 --reps 3 2>&1 | tail -3
fi

if want wgmma; then
    # attention on wgmma (OOMB_PAGED_ATTN_WGMMA: 3 both, 2 backward only, 0 the mma.sync kernels), same run;
    # WG_ARGS: shape options for oomb-bench-attn (e.g. "--heads 14 --kv-heads 2 --dim 64", the 0.5B layer)
    for s in ${WG_SEQS:-8192 32768 131072}; do
        for w in ${WG_VARIANTS:-3 2 0}; do
            echo "seq $s OOMB_PAGED_ATTN_WGMMA=$w ${WG_ARGS:-} ${WG_ENV:-}"; env ${WG_ENV:-} OOMB_PAGED_ATTN_WGMMA=$w timeout 120 $B/oomb-bench-attn --seq $s --reps 3 ${WG_ARGS:-} > /tmp/wg.log 2>&1
            echo "rc=$?"; grep '"seq"' /tmp/wg.log || tail -3 /tmp/wg.log
        done
    done
fi

if want sweep64; then
    # head dim 64 (Qwen2.5-0.5B layer: 14 query heads, 2 KV heads) kernel variants at 32K, and the
    # paged-attention tests under the non-default variants
    A="--seq 32768 --heads 14 --kv-heads 2 --dim 64 --reps 3"
    for f in 0 1 2; do echo "fwd64 variant $f"; OOMB_PAGED_ATTN_FWD64=$f timeout 60 $B/oomb-bench-attn $A --fwd-only 2>&1 | grep '"seq"'; done
    for b in 0 1 2; do echo "bwd64 variant $b"; OOMB_PAGED_ATTN_BWD64=$b timeout 60 $B/oomb-bench-attn $A 2>&1 | grep '"seq"'; done
    for v in 1 2; do
        OOMB_PAGED_ATTN_FWD64=$v OOMB_PAGED_ATTN_BWD64=$v timeout 120 $B/test-cuda-paged-attn > "$OUT/test-pa-variant$v.log" 2>&1
        echo "test-cuda-paged-attn with FWD64=BWD64=$v rc=$?"; grep -E "FAILED|PASSED" "$OUT/test-pa-variant$v.log" | head -5
    done
fi
