#!/usr/bin/env bash
# Shared by the lease drivers (bench/gpu/lease-s*.sh; source it): state in /tmp/keep between calls
# of one lease (K, the unpacked binaries B), outputs under $OUT (R); log, alive PIDFILE, and
# tests BIN:SECONDS... (each test binary under a time limit, its summary lines and the OK count).
set -o pipefail
K=/tmp/keep; B=$K/bins; mkdir -p $K $B
R=${OUT:-out}; mkdir -p "$R"
log() { echo "[$(date +%T)] $*"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
tests() {
    for tl in "$@"; do
        t=${tl%:*}; timeout ${tl#*:} $B/$t > "$R/$t.log" 2>&1; log "$t rc=$?"
        grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|SKIPPED" "$R/$t.log" | head -30
        grep -c "^\[       OK \]" "$R/$t.log"
    done
}
