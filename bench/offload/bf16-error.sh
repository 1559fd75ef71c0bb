#!/usr/bin/env bash
# Gradient error of bf16 KV-gradient pages at 7B width on the GPU (issue 12): Qwen2.5-7B's layer
# shape (hidden 3584, 28/4 heads, head dim 128, ffn 18944) with 4 layers and a 32,768-row vocabulary
# (random bf16 weights from oomb-gguf-init; the KV-gradient pages do not depend on the vocabulary),
# one forward/backward over CTX random tokens (chunk 2048, page 128: CTX/2048 chunks add into each
# page), --dump-grads of every weight with --kv-grad-type f32 twice (the noise floor: the CUDA
# backward adds dq with float atomics) and bf16, then bf16_error.py compare against the first f32.
#   EXTRA_RUNS="bf16:offload" adds a bf16 run with --offload on (a 0.5 GiB budget: most pages stream)
#   MODEL_ARGS (oomb-gguf-init options, a smaller shape) and DEVICE=cpu: a check of this script here
#   BINS=/tmp/bins bench/offload/bf16-error.sh [CTX]        (results in $OUT/summary.txt)
set -o pipefail
BINS=${BINS:-/tmp/bins-after}; CTX=${1:-65536}
R=${OUT:-out}; mkdir -p "$R"; W=/tmp/bf16err; rm -rf $W; mkdir -p $W
exec > >(tee -a "$R/summary.txt") 2>&1
H=$(dirname "$0")
$BINS/oomb-gguf-init ${MODEL_ARGS:---preset qwen2.5-7b --layers 4 --vocab-size 32768} -o $W/m.gguf || exit 1
python3 $H/bf16_error.py tokens $W/ids.safetensors $CTX 32768 7 || exit 1
for run in f32:a f32:b bf16:a ${EXTRA_RUNS:-}; do
    g=${run%%:*}; tag=${run#*:}; offload_args=""
    [ "$tag" = offload ] && offload_args="--offload on --gpu-kv-budget 0.5"
    /usr/bin/time -f "%e s, max RSS %M KB" timeout ${LIMIT:-300} $BINS/oomb-train -m $W/m.gguf --tokens $W/ids.safetensors --chunk 2048 --page 128 \
        --device ${DEVICE:-cuda} --kv-grad-type $g $offload_args --dump-grads $W/g-$g-$tag.safetensors > $W/$g-$tag.log 2>&1
    echo "== kv-grad-type $g ($tag $offload_args) rc=$?"; grep -E "KV cache|^loss|error|max RSS" $W/$g-$tag.log | sed 's/^ *//'
done
files=""; for run in f32:b bf16:a ${EXTRA_RUNS:-}; do files="$files $W/g-${run%%:*}-${run#*:}.safetensors"; done
python3 $H/bf16_error.py compare $W/g-f32-a.safetensors $files
cp $W/*.log "$R/" 2>/dev/null
