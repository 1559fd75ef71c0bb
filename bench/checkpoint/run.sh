#!/usr/bin/env bash
# Checkpoint-save memory benchmark (issue 19), not a timed test: peak resident memory (VmHWM, from
# /usr/bin/time -v) of oomb-train on the CPU with Qwen2.5-0.5B shapes, ctx 512, one step, once
# with --save-every -1 (no checkpoint) and once with the final save (model.gguf + state.safetensors).
# The difference is what the save adds; the goal is at most one staging buffer (<= 256 MB).
#
#   bench/checkpoint/run.sh [OOMB_TRAIN] [LABEL]     (default: build/bin/oomb-train, "this build")
# CHECKSUM=1: also prints (stderr) hashes of the saved files, to compare two builds' output.
# Prints one Markdown table row: label | peak RSS no save | peak RSS with save | added | ratio | save s
set -euo pipefail
TRAIN=${1:-build/bin/oomb-train}
VOCAB=${VOCAB:-$(cd "$(dirname "$0")/../.." && pwd)/models/qwen2.5-vocab.gguf}
LABEL=${2:-this build}
THREADS=${THREADS:-2}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oomb-bench-ckpt.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Random token ids below Qwen2.5's vocabulary (fixed seed): 4 sequences of ctx 512 + 1.
python3 -c "import random,struct,sys; r=random.Random(19); sys.stdout.buffer.write(struct.pack('<4096I', *[r.randrange(151000) for _ in range(4096)]))" > "$WORK/ids.bin"
run() {  # $1: output folder, rest: extra options; prints peak RSS in KiB and wall seconds
    local out=$1; shift
    /usr/bin/time -v "$TRAIN" --preset qwen2.5-0.5b --data-bin "$WORK/ids.bin" --ctx 512 --steps 1 --threads "$THREADS" --vocab "$VOCAB" \
        --eval-every 0 --eval-seqs 0 --out "$out" "$@" > "$out.log" 2> "$out.time" || { cat "$out.log" "$out.time" >&2; exit 1; }
    awk -F': ' '/Maximum resident set size/ {k=$2} /Elapsed \(wall clock\)/ {w=$2} END {print k, w}' "$out.time"
}
read -r nosave_kb nosave_wall < <(run "$WORK/nosave" --save-every -1)
read -r save_kb save_wall < <(run "$WORK/save" --save-every 0)
ls -l "$WORK/save/model.gguf" "$WORK/save/state.safetensors" >&2
if [ -n "${CHECKSUM:-}" ]; then  # to compare builds: model.gguf, and state.safetensors less elapsed_s and config
    sha256sum "$WORK/save/model.gguf" >&2
    python3 - "$WORK/save/state.safetensors" >&2 <<'PY'
import hashlib, json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
for k in ('elapsed_s', 'config'): h['__metadata__'].pop(k)  # timing; the config names the run's temporary paths
d = hashlib.sha256(json.dumps(h, sort_keys=True).encode())
for b in iter(lambda: f.read(1 << 24), b''): d.update(b)
print(d.hexdigest(), 'state.safetensors (header less elapsed_s and config, and data)')
PY
fi
awk -v l="$LABEL" -v a="$nosave_kb" -v b="$save_kb" -v wa="$nosave_wall" -v wb="$save_wall" 'BEGIN {
    printf "| %s | %.2f GB | %.2f GB | %+.0f MB | %.3f | %s / %s |\n", l, a*1024/1e9, b*1024/1e9, (b-a)*1024/1e6, b/a, wa, wb }'
