#!/usr/bin/env bash
# The device calls of one H200 lease (2026-12-04: issue 16 at head dim 64, bench/NOTES.md version 18:
# three consumer warpgroups in the warp-specialised forward, K / V in registers in the backward),
# one part per call. State in /tmp/keep between calls.
#   start   unpack .devcarry/gpu-bins.tar.xz; test-cuda-paged-attn, test-cuda-sparse; the 0.5B layer
#           (head dim 64, 14 / 2 heads) at 32K: forward alone with OOMB_PAGED_ATTN_FWDWG3 0 1 0 1, the
#           backward with OOMB_PAGED_ATTN_BWDKVR 0 1 0 1, one process each, same call
#   check   the defaults after these measurements (unpack, tests, both settings at chunk 4096 and one chunk,
#           the 0.5B one-chunk step with the defaults and with both off, HF)
#   ablate  the ablation builds of bench/attention/ablate.sh (.devcarry/abl.tar.xz), times only
#   dq      tests, then the layers' fwd / bwd with the new binaries against 1d677c6's (old.tar.xz)
#   ab V    tests, then the layers' fwd / bwd with OOMB_PAGED_ATTN_V 0 against 1 (BWDPAIR, BWDDESC: code
#           measured then removed, bench/NOTES.md v18)
#   e2e S   in the background: 0.5B one chunk of 32K (3 steps) with (FWDWG3, BWDKVR) = (0, 0), (1, 1),
#           (1, 0), (0, 1), then HF (.devcarry/hf_baseline.py); wait S seconds
#   wait S  wait up to S seconds more for the background runs
#   probe   both settings at one chunk of 32K (oomb-bench-attn --chunk 32768), and the 0.5B one-chunk
#           step's GPU time per op (OOMB_CUDA_PROFILE=1, PROF=2 with operand shapes)
#   attn P  bench_attn.py at head dim 64 (0.5B shape) beside SDPA flash and cuDNN, with FWDWG3 = BWDKVR = P
#   verify  unpack; test-cuda-paged-attn, test-cuda-ops, test-cuda-backend
#   fixtures  test-cuda-qwen2 against the HF fixtures (.devcarry/fixtures and extra-bins.tar.xz with
#           oomb-convert-hf, carried alone)
usage="usage: $0 start | probe | check | ablate | dq | ab V | e2e S | wait S | attn P | verify | fixtures"
case ${1:-} in start|probe|check|ablate|dq|ab|e2e|wait|attn|verify|fixtures) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, alive, tests
# unpack .devcarry/gpu-bins.tar.xz, then test-cuda-paged-attn and test-cuda-sparse
unpack_and_test() {
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || return 1
    cat $K/bins-commit.txt
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-paged-attn:400 test-cuda-sparse:120
}
# ab_layers NAME A B: oomb-bench-attn's fwd / bwd on the layer shapes (SHAPES, one per line: a label,
# then the bench's arguments) with the commands A and B, pattern A B A B, one process each
SHAPES=${SHAPES:-"7b-32k --seq 32768
7b-128k --seq 131072
05b-32k --seq 32768 --heads 14 --kv-heads 2 --dim 64
05b-32k1c --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64"}
ab_layers() {
    local name=$1 a=$2 b=$3 shape lab v cmd
    while read -r shape; do
        set -- $shape; lab=$1; shift
        for v in a b a b; do
            cmd=$a; [ $v = b ] && cmd=$b
            timeout 120 $cmd "$@" --reps 3 >> $R/$name-$lab-$v.log 2>&1
            echo "$lab $name $v rc=$? $(grep '"seq"' $R/$name-$lab-$v.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
        done
    done <<< "$SHAPES"
}
case $1 in
start)
    nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
    unpack_and_test || exit 1
    grep -E "fwd_wg3" $R/test-cuda-paged-attn.log | head -4
    S05="--seq 32768 --heads 14 --kv-heads 2 --dim 64"
    for p in 0 1 0 1; do
        OOMB_PAGED_ATTN_FWDWG3=$p timeout 120 $B/oomb-bench-attn $S05 --fwd-only --reps 3 >> $R/fwd-05b-32k-wg3$p.log 2>&1
        echo "05b-32k fwd FWDWG3=$p rc=$? $(grep '"seq"' $R/fwd-05b-32k-wg3$p.log | tail -1 | grep -oE '"fwd_tflops": [0-9.]+')"
    done
    for p in 0 1 0 1; do
        OOMB_PAGED_ATTN_BWDKVR=$p timeout 120 $B/oomb-bench-attn $S05 --reps 3 >> $R/bwd-05b-32k-kvr$p.log 2>&1
        echo "05b-32k BWDKVR=$p rc=$? $(grep '"seq"' $R/bwd-05b-32k-kvr$p.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
    done ;;
check)
    # the defaults after the measurements (fwd_wg3 2, bwd_kvr 1): tests; chunk 4096 and one chunk at
    # 32K with the defaults and with both off; the 0.5B one-chunk step with the defaults, beside HF
    unpack_and_test || exit 1
    for c in 4096 32768; do
        for p in def off def off; do
            env=""; [ $p = off ] && env="OOMB_PAGED_ATTN_FWDWG3=0 OOMB_PAGED_ATTN_BWDKVR=0"
            env $env timeout 120 $B/oomb-bench-attn --seq 32768 --chunk $c --heads 14 --kv-heads 2 --dim 64 --reps 3 >> $R/c$c-$p.log 2>&1
            echo "05b-32k chunk $c $p rc=$? $(grep '"seq"' $R/c$c-$p.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
        done
    done
    [ -f /tmp/rand.bin ] || python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    for p in def off; do
        env=""; [ $p = off ] && env="OOMB_PAGED_ATTN_FWDWG3=0 OOMB_PAGED_ATTN_BWDKVR=0"
        rm -rf /tmp/r05
        env $env timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
            --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $R/05b-32k-1chunk-$p.log 2>&1
        echo "0.5b 32K one chunk $p rc=$?"; grep -E "^step|error" $R/05b-32k-1chunk-$p.log
    done
    PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json ;;
ablate)
    # bench/attention/ablate.sh's builds (.devcarry/abl.tar.xz): what each piece of the kernels costs
    # (wrong results, times only): 0.5B layer one chunk 32K and 7B layer 32K, chunk 4096
    mkdir -p $K/abl && tar -xJf .devcarry/abl.tar.xz -C $K/abl || exit 1
    for shape in "05b --seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64" "7b --seq 32768"; do
        set -- $shape; lab=$1; shift
        for k in 0 1 2 3 4 5 6 7 0; do
            bin=$K/abl/oomb-bench-attn-abl$k; [ $k = 0 ] && bin=$K/abl/oomb-bench-attn
            timeout 120 $bin "$@" --reps 3 >> $R/abl-$lab-$k.log 2>&1
            echo "$lab abl$k rc=$? $(grep '"seq"' $R/abl-$lab-$k.log | tail -1 | grep -oE '"(fwd|bwd)_(tflops|ms)": [0-9.]+' | tr '\n' ' ')"
        done
    done ;;
dq)
    # the dQ atomics of the new binaries (3d6d3e0: 16-byte vectors in fragment order; then whole rows
    # staged in shared memory) vs 8-byte ones in fragment order (.devcarry/old.tar.xz: oomb-bench-attn-v2,
    # the build of 1d677c6)
    unpack_and_test && tar -xJf .devcarry/old.tar.xz -C $B || exit 1
    ab_layers dq "$B/oomb-bench-attn-v2" "$B/oomb-bench-attn" ;;
ab)
    # an OOMB_PAGED_ATTN_* variable 0 against 1 ($2, e.g. BWDPAIR: blocks in pairs adding dQ together,
    # binaries of 03ea9fc; BWDDESC: row tiles walked from the last, 3e083c5 with SHAPES ending in
    # "7b-128k1c --seq 131072 --chunk 131072"; both removed after their measurement, bench/NOTES.md v18)
    unpack_and_test || exit 1
    ab_layers "${2,,}" "env OOMB_PAGED_ATTN_$2=0 $B/oomb-bench-attn" "env OOMB_PAGED_ATTN_$2=1 $B/oomb-bench-attn" ;;
e2e)
    python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    mkdir -p $K/e2e
    cat > $K/e2e.sh <<EOS
cd $PWD
for wk in "0 0" "1 1" "1 0" "0 1"; do
  set -- \$wk
  rm -rf /tmp/r05
  OOMB_PAGED_ATTN_FWDWG3=\$1 OOMB_PAGED_ATTN_BWDKVR=\$2 timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 --page 128 --steps 3 --warmup 1 \
    --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $K/e2e/05b-32k-1chunk-wg3\$1-kvr\$2.log 2>&1
  echo "0.5b 32K one chunk FWDWG3=\$1 BWDKVR=\$2 rc=\$?"; grep -E "^step|error" $K/e2e/05b-32k-1chunk-wg3\$1-kvr\$2.log
done
PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $K/e2e/hf-05b-32k.json
EOS
    setsid nohup bash $K/e2e.sh > $K/e2e.out 2>&1 < /dev/null &
    echo $! > $K/e2e.pid; log "e2e started (pid $(cat $K/e2e.pid))"
    end=$((SECONDS + ${2:-500}))
    while alive $K/e2e.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/e2e.pid && log "e2e still running" || log "e2e done"; cat $K/e2e.out; cp $K/e2e/* $R/ ;;
wait)
    end=$((SECONDS + ${2:-500}))
    while alive $K/e2e.pid && [ $SECONDS -lt $end ]; do sleep 5; done
    alive $K/e2e.pid && log "e2e still running" || log "e2e done"; cat $K/e2e.out; cp $K/e2e.out $K/e2e/* $R/ ;;
probe)
    # forward / backward alone at one chunk of 32K (T G = 229K rows: 1,195 blocks of 192 rows per KV
    # head), and where the 0.5B one-chunk step's GPU time goes (OOMB_CUDA_PROFILE=1)
    S05="--seq 32768 --chunk 32768 --heads 14 --kv-heads 2 --dim 64"
    for p in 0 1 0 1; do
        OOMB_PAGED_ATTN_FWDWG3=$p OOMB_PAGED_ATTN_BWDKVR=$p timeout 120 $B/oomb-bench-attn $S05 --reps 3 >> $R/fb-05b-32k1c-$p.log 2>&1
        echo "05b-32k one chunk FWDWG3=BWDKVR=$p rc=$? $(grep '"seq"' $R/fb-05b-32k1c-$p.log | tail -1 | grep -oE '"(fwd|bwd|fwdbwd)_tflops": [0-9.]+' | tr '\n' ' ')"
    done
    [ -f /tmp/rand.bin ] || python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 151643, size=1<<23, dtype=np.uint32).tofile('/tmp/rand.bin')"
    rm -rf /tmp/r05
    OOMB_PAGED_ATTN_FWDWG3=1 OOMB_PAGED_ATTN_BWDKVR=1 OOMB_CUDA_PROFILE=${PROF:-1} timeout 200 $B/oomb-train --preset qwen2.5-0.5b --device cuda --ctx 32768 --chunk 32768 \
        --page 128 --steps 3 --warmup 1 --eval-every 0 --eval-split 1 --save-every -1 --data-bin /tmp/rand.bin --trainable all -o /tmp/r05 > $R/05b-32k-prof.log 2>&1
    grep -E "^step|^  [a-z_]+ +[0-9]" $R/05b-32k-prof.log | head -40 ;;
attn)
    OOMB_PAGED_ATTN_FWDWG3=${2:-1} OOMB_PAGED_ATTN_BWDKVR=${2:-1} PYTHONUNBUFFERED=1 timeout 300 python3 bench/attention/bench_attn.py --bin $B/oomb-bench-attn --out $R \
        --heads 14 --kv-heads 2 --dim 64 --seqs 8192,32768 2>&1 | tee $R/attn-bench.log | grep -v "^running" ;;
verify)
    cp .devcarry/gpu-bins.tar.xz .devcarry/bins-commit.txt $K/ && tar -xJf $K/gpu-bins.tar.xz -C $B || exit 1
    cat $K/bins-commit.txt
    export OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-paged-attn:400 test-cuda-ops:120 test-cuda-backend:60 ;;
fixtures)
    # test-cuda-qwen2 against the HF fixtures (.devcarry/fixtures, carried alone: the binaries stay from verify)
    rm -rf $K/fixtures && cp -r .devcarry/fixtures $K/fixtures
    tar -xJf .devcarry/extra-bins.tar.xz -C $B || exit 1   # oomb-convert-hf (the test converts the HF models)
    export OOMB_FIXTURES=$K/fixtures OOMB_BIN_DIR=$B OOMB_SOURCE_DIR=$PWD
    tests test-cuda-qwen2:300 ;;
*) echo "$usage"; exit 2 ;;
esac
