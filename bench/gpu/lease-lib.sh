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
# unpack: the binaries of .devcarry/gpu-bins.tar.xz into B (and OOMB_BIN_DIR); r05 LABEL [ENV...]: the 0.5B one
# chunk of 32K, 3 steps; r7b LABEL [ENV...]: 7B --trainable linear dense 128K, one step, profiled (logs in R);
# s7b: the same 7B sparse 64 pages; s3b: Qwen2.5-3B sparse 64 pages (an 80 GB card); fixtures_qwen2: test-cuda-qwen2 on the HF fixtures.
# A driver that defines its own after sourcing this one uses its own.
unpack() {
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || return 1
    cat $K/bins-commit.txt
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
}
r05() {  # r05 LABEL [ENV...]: the 0.5B one-chunk run, 3 steps
    local lab=$1; shift
    rm -rf /tmp/r05
    env "$@" timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
      --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $R/05b-32k-1chunk-$lab.log 2>&1
    echo "0.5b 32K one chunk $lab rc=$?"; grep -E "^step|error|^  add |^  mul_mat " $R/05b-32k-1chunk-$lab.log
}
r7b() {  # r7b LABEL [ENV...]
    local lab=$1; shift
    rm -rf /tmp/r7b
    env "$@" OOMB_CUDA_PROFILE=1 timeout 280 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 --page 128 --steps 1 \
        --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 \
        --offload off --attn-cache --attn-cache-type bf16 -o /tmp/r7b > $R/7b-128k-dense-$lab.log 2>&1
    echo "7b 128K dense $lab rc=$?"; grep -E "^step|error|linear_cross|paged_attn |mul_mat |^  add |add_inplace|GPU time" $R/7b-128k-dense-$lab.log | head -9
}
# fixtures_qwen2: test-cuda-qwen2 against the HF fixtures, from build-carry/ (tests-bins.tar.xz, fq.tar.xz, bins-commit.txt;
# a call that carries build-carry alone: the two archives and the checkout pass 64 MiB together with .devcarry)
fixtures_qwen2() {
    tar -xJf build-carry/tests-bins.tar.xz -C $B && rm -rf $K/fixtures && mkdir -p $K/fixtures \
        && tar -xJf build-carry/fq.tar.xz -C $K/fixtures --strip-components=1 || return 1
    cat build-carry/bins-commit.txt
    export OOMB_FIXTURES=$K/fixtures OOMB_SOURCE_DIR=$PWD OOMB_BIN_DIR=$B
    tests test-cuda-qwen2:400
}
s7b() {  # s7b LABEL [ENV...]: 7B --trainable linear sparse 64 pages at 128K with the bf16 attention cache, one step (the issue-13 figure)
    local lab=$1; shift
    rm -rf /tmp/s7b
    env "$@" timeout 280 $B/oomb-train --preset qwen2.5-7b --device cuda --ctx 131072 --chunk 2048 --page 128 --steps 1 \
        --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 \
        --offload off --attn-cache --attn-cache-type bf16 --sparse-pages 64 --sparse-score mean --sparse-sink 0 --sparse-local 0 \
        -o /tmp/s7b > $R/7b-128k-sparse64-$lab.log 2>&1
    echo "7b 128K sparse64 $lab rc=$?"; grep -E "^step|error|page_select|paged_attn|mul_mat |GPU time" $R/7b-128k-sparse64-$lab.log | head -8
}
s3b() {  # s3b LABEL [ENV...]: Qwen2.5-3B --trainable linear sparse 64 pages at 128K, no attention cache (fits an 80 GB card), one step
    local lab=$1; shift
    rm -rf /tmp/s3b
    env "$@" timeout 150 $B/oomb-train --preset qwen2.5-3b --device cuda --ctx 131072 --chunk 2048 --page 128 --steps 1 \
        --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable linear --opt-state bf16 \
        --offload off --sparse-pages 64 --sparse-score mean -o /tmp/s3b > $R/3b-128k-sparse64-$lab.log 2>&1
    echo "3b 128K sparse64 $lab rc=$?"; grep -E "^step|error|device total|paged_attn|mul_mat " $R/3b-128k-sparse64-$lab.log | head -8
}

# lease_head TAG MODE [ARG]: what a background driver (lease-s22.sh and later) does first: the results so far tarred
# into $OUT0/TAG.tgz at exit (a call brings back at most 8 files), the card's state, the `fixtures` and `wait [S]`
# modes (which end the driver), the binaries unpacked. Set OUT0 (the call's $OUT) before sourcing this file.
lease_head() {
    LEASE_TAG=$1; shift
    lease_pack() { tar -czf "$OUT0/$LEASE_TAG.tgz" -C "$(dirname $R)" "$(basename $R)" $( [ -f $K/bg.out ] && echo ../keep/bg.out ) 2>/dev/null; }
    trap lease_pack EXIT
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,power.draw,power.limit,driver_version --format=csv,noheader
    case $1 in
    fixtures) fixtures_qwen2; exit ;;
    wait) bg_wait ${2:-540}; exit ;;
    esac
    [ -x $B/oomb-train ] || unpack || exit 1
}
r05n() {  # r05n LABEL STEPS [ENV...]: the 0.5B one-chunk run of 32K for STEPS steps (prints the tok/s of steps 2..);
           # TRAIN_BIN: another oomb-train (an A/B against older binaries)
    local lab=$1 st=$2; shift 2
    rm -rf /tmp/r05
    env "$@" timeout 200 ${TRAIN_BIN:-$B/oomb-train} --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps $st --warmup 1 \
      --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $R/05b-32k-1chunk-$lab.log 2>&1
    echo "0.5b 32K one chunk $lab rc=$? tok/s: $(grep -oE '[0-9]+ tok/s' $R/05b-32k-1chunk-$lab.log | head -$st | tail -n +2 | awk '{print $1}' | tr '\n' ' ')"
}
# hf: HF + SDPA on the same 0.5B one-chunk 32K run (HF_PY, default .devcarry/hf_baseline.py), its JSON line in R
hf() { PYTHONUNBUFFERED=1 timeout 170 python3 ${HF_PY:-.devcarry/hf_baseline.py} qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json; }
# attn: bench_attn.py, ours beside SDPA flash and cuDNN: the 7B layer at 8K / 32K / 128K, then the 0.5B layer at 32K (tables in R)
attn() {
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/attention/bench_attn.py --bin $B/oomb-bench-attn --out $R/attn7b 2>&1 | grep -v "^running" | tail -12
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/attention/bench_attn.py --bin $B/oomb-bench-attn --seqs 32768 --heads 14 --kv-heads 2 --dim 64 \
        --out $R/attn05b 2>&1 | grep -v "^running" | tail -6
}
# abat LABEL ARGS...: oomb-bench-attn old (OLDBENCH in B, default oomb-bench-attn-old) then new, twice, one process per run.
# ABAT_ENV="VAR=value ...": a third variant, x (the new binary with those settings), after each new; limited to 60 s (a
# hang shows at once), and once it timed out ($K/x-hung) its later runs are skipped.
abat() {
    local lab=$1 v bin f e rc vs="old new old new"; shift
    [ -n "${ABAT_ENV:-}" ] && vs="old new x old new x"
    for v in $vs; do
        bin=$B/oomb-bench-attn; [ $v = old ] && bin=$B/${OLDBENCH:-oomb-bench-attn-old}
        e=""; [ $v = x ] && e="$ABAT_ENV"
        if [ $v = x ] && [ -f $K/x-hung ]; then echo "attn $lab x skipped (hung before)"; continue; fi
        f=$R/attn-$lab-$v-$SECONDS.log
        env $e timeout $([ $v = x ] && echo 60 || echo 150) $bin "$@" --reps 3 > $f 2>&1
        rc=$?; [ $v = x ] && [ $rc = 124 ] && touch $K/x-hung
        echo "attn $lab $v rc=$rc $(grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' $f | tr '\n' ' ')"
    done
}
