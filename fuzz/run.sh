#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/CMakeLists.txt) in build-fuzz/ with clang and runs each
# for N seconds on its seed corpus (fuzz/corpus/<name>/, read only; new inputs go to
# build-fuzz/corpus/<name>/). Fails when a harness crashes; the input is kept in build-fuzz/artifacts/.
#   fuzz/run.sh [seconds]     default 20 seconds per harness
#   fuzz/run.sh --available   exit status 0 when clang with libFuzzer is there, else prints why
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG=${CLANG:-clang}
CLANGXX=${CLANGXX:-clang++}
BUILD=${FUZZ_BUILD:-build-fuzz}

available() {
    command -v "$CLANGXX" >/dev/null 2>&1 || { echo "no $CLANGXX"; return 1; }
    local d
    d=$(mktemp -d)
    printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' > "$d/t.cpp"
    if ! "$CLANGXX" -fsanitize=fuzzer,address,undefined "$d/t.cpp" -o "$d/t" >/dev/null 2>&1; then
        rm -rf "$d"
        echo "$CLANGXX cannot link -fsanitize=fuzzer (libFuzzer runtime missing)"
        return 1
    fi
    rm -rf "$d"
}

if [ "${1:-}" = "--available" ]; then
    available
    exit $?
fi
secs=${1:-20}
available >/dev/null || { echo "fuzz: $(available)"; exit 1; }

cmake -S fuzz -B "$BUILD" -DOOMB_FUZZ=ON -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" >/dev/null
mkdir -p "$BUILD/artifacts"
status=0
for name in gguf safetensors tokenizer; do
    mkdir -p "$BUILD/corpus/$name"
    echo "fuzz: $name for ${secs}s"
    if ! "$BUILD/bin/fuzz-$name" -max_total_time="$secs" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
            -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$name-" \
            "$BUILD/corpus/$name" "fuzz/corpus/$name" > "$BUILD/fuzz-$name.log" 2>&1; then
        echo "fuzz: $name FAILED (log: $BUILD/fuzz-$name.log, inputs: $BUILD/artifacts/$name-*)"
        tail -40 "$BUILD/fuzz-$name.log"
        status=1
    else
        grep -E "stat::number_of_executed_units|stat::new_units_added" "$BUILD/fuzz-$name.log" | tr '\n' ' '
        echo
    fi
done
[ $status = 0 ] && echo "fuzz: ok"
exit $status
