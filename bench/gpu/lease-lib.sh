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
# rand_ids: /tmp/rand.bin, 2^23 random Qwen token ids (uint32) for --data-bin, made once per machine
rand_ids() {
    [ -f /tmp/rand.bin ] || python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
}
# bg_start SCRIPT: runs SCRIPT detached (setsid: it survives the device call), output $K/bg.out, pid $K/bg.pid
bg_start() {
    setsid nohup bash "$1" > $K/bg.out 2>&1 < /dev/null &
    echo $! > $K/bg.pid; log "started $1 (pid $(cat $K/bg.pid))"
}
# bg_wait S: waits up to S seconds for bg_start's run, then prints its output so far
bg_wait() {
    local end=$((SECONDS + ${1:-500}))
    while alive $K/bg.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/bg.pid && log "still running" || log "done"; cat $K/bg.out
}
