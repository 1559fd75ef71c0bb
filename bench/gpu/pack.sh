#!/usr/bin/env bash
# Packs the GPU binaries built here (build-gpu, configured as in bench/NOTES.md) into
# .devcarry/gpu-bins.tar.xz with the commit they were built from (.devcarry/bins-commit.txt), for
# bench/gpu/run-h200.sh on the GPU machine (the device copy's git metadata may be older).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu}/bin
mkdir -p .devcarry
# BINS: a smaller set when the carry would pass 64 MiB with the checkout (the defaults ~51 MB)
bins=${BINS:-"oomb-convert-hf oomb-gguf-init oomb-train oomb-eval oomb-tokenize test-cuda-backend test-cuda-ops test-cuda-linear-ce test-cuda-paged-attn test-cuda-paged-attn-numerics test-cuda-qwen2 test-cuda-sparse test-offload-tensors"}
for x in oomb-bench-attn oomb-bench-dequant; do [ -x "$B/$x" ] && bins="$bins $x"; done
(cd "$B" && tar -cJf ../../.devcarry/gpu-bins.tar.xz $bins)
{ git log -1 --format='binaries of commit %H %s'; git status --short --untracked-files=no | sed 's/^/  uncommitted: /'; } > .devcarry/bins-commit.txt
cat .devcarry/bins-commit.txt
