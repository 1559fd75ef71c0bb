#!/usr/bin/env bash
# Builds the llama.cpp tools that tests/py/test_llamacpp_interop.py checks our files against
# (llama-perplexity, llama-quantize, llama-export-lora), from the llama.cpp source vendored inside
# the PyPI sdist of llama-cpp-python (the one pinned version below, its sha256 checked), CPU only
# (no CUDA, no BLAS), cached under BUILD_DIR/llama.cpp:
#
#   scripts/build-llama-cpp.sh [BUILD_DIR]     (default build/)
#
# Result: BUILD_DIR/llama.cpp/bin/{llama-perplexity,llama-quantize,llama-export-lora} and
# BUILD_DIR/llama.cpp/VERSION. A second run with the binaries present is a no-op. The build is made
# in BUILD_DIR/llama.cpp.tmp and moved into place only when every tool is built, so a failed
# download or build leaves no half-built cache (exit 2: download / checksum, 3: extract,
# 4: configure / build). Measured on the shared 2-core development machine: see README (Testing).
# Design: the pin is ours (not "latest"), so an upstream change of scoring or file format shows
# up as a deliberate version bump, not as a red CI run on an unchanged tree.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TOOLS=(llama-perplexity llama-quantize llama-export-lora)

build_dir=${1:-build}
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
dest=$build_dir/llama.cpp
stamp="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sha256 $LLAMA_CPP_PYTHON_SHA256 GGML_NATIVE=OFF"  # the build's settings: a change rebuilds

have_all() {
    [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$stamp" ] || return 1
    local t
    for t in "${TOOLS[@]}"; do [ -x "$dest/bin/$t" ] || return 1; done
}
if have_all; then
    echo "build-llama-cpp: cached in $dest ($stamp)"
    exit 0
fi

start=$(date +%s)
tmp=$build_dir/llama.cpp.tmp
rm -rf "$tmp"
mkdir -p "$tmp/dl"
trap 'rm -rf "$tmp"' EXIT

sdist=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
if [ -n "${OOMB_LLAMACPP_SDIST:-}" ]; then   # a local copy of the same sdist (offline machines)
    cp "$OOMB_LLAMACPP_SDIST" "$tmp/dl/$sdist"
else
    echo "build-llama-cpp: downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist) from PyPI"
    if ! python3 -m pip download -q --no-binary :all: --no-deps \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$tmp/dl" >"$tmp/pip.log" 2>&1; then
        tail -5 "$tmp/pip.log" >&2
        echo "build-llama-cpp: error: pip download of llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed (no network?); nothing cached" >&2
        exit 2
    fi
fi
if [ ! -f "$tmp/dl/$sdist" ]; then
    echo "build-llama-cpp: error: the download did not give $sdist (got: $(ls "$tmp/dl"))" >&2
    exit 2
fi
got=$(sha256sum "$tmp/dl/$sdist" | cut -d' ' -f1)
if [ "$got" != "$LLAMA_CPP_PYTHON_SHA256" ]; then
    echo "build-llama-cpp: error: $sdist has sha256 $got, expected $LLAMA_CPP_PYTHON_SHA256; nothing cached" >&2
    exit 2
fi

echo "build-llama-cpp: extracting vendor/llama.cpp"
if ! tar -xzf "$tmp/dl/$sdist" -C "$tmp" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"; then
    echo "build-llama-cpp: error: could not extract vendor/llama.cpp from $sdist" >&2
    exit 3
fi
src=$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp

jobs=$(nproc)
echo "build-llama-cpp: configuring (CPU only) and building ${TOOLS[*]} with -j$jobs"
# Static libraries: the binaries do not depend on the (deleted) build tree. GGML_NATIVE=OFF: ggml's
# fixed x86-64 set (SSE4.2, AVX, AVX2, BMI2, FMA, F16C; no AVX-512, no AMX) instead of the build
# machine's own: a CI machine whose CPU advertised more (a fresh CI run, 2026-12-02) had
# llama-perplexity die right after loading the Q8_0 and Q4_K_M files (the f32/f16 ones ran), i.e.
# in the quantized kernels only that CPU's extensions select; the fixed set computes the same NLL.
if ! cmake -S "$src" -B "$tmp/b" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
        -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
        >"$tmp/configure.log" 2>&1; then
    tail -20 "$tmp/configure.log" >&2
    echo "build-llama-cpp: error: CMake configure of llama.cpp failed (log above); nothing cached" >&2
    exit 4
fi
if ! cmake --build "$tmp/b" -j "$jobs" --target "${TOOLS[@]}" >"$tmp/build.log" 2>&1; then
    grep -m20 -E "error|Error" "$tmp/build.log" >&2 || tail -20 "$tmp/build.log" >&2
    echo "build-llama-cpp: error: building ${TOOLS[*]} failed (log above); nothing cached" >&2
    exit 4
fi

mkdir -p "$tmp/out/bin"
for t in "${TOOLS[@]}"; do
    if [ ! -x "$tmp/b/bin/$t" ]; then
        echo "build-llama-cpp: error: $t was not built; nothing cached" >&2
        exit 4
    fi
    cp "$tmp/b/bin/$t" "$tmp/out/bin/"
done
echo "$stamp" >"$tmp/out/VERSION"
rm -rf "$dest"
mv "$tmp/out" "$dest"
echo "build-llama-cpp: built ${TOOLS[*]} into $dest/bin in $(( $(date +%s) - start )) s"
