#!/usr/bin/env bash
# Session 19 on the GPU machine (2026-12-06, second session): measure where the 0.5B one-chunk step and
# the 7B sparse step go now, before choosing the next change.
#   prof     0.5B one chunk of 32K with OOMB_CUDA_PROFILE=2 (per op and operand shapes), then 3 steps
#            unprofiled; 7B --trainable linear sparse 64 pages 128K, one step profiled and one not
#            (the issue-13 figure; needs the H200's memory)
#   a05      0.5B one chunk of 32K: new, OLD (env, e.g. OLD="OOMB_CUDA_FUSE_NORM=0"), new again; HF + SDPA (HF=0: not)
#   e2e7b    7B --trainable linear dense 128K, one step each: new, OLD (needs the H200)
#   tests    test-cuda-backend, test-cuda-ops
#   ab       the weighted RMSNorm in one node (rms_norm_mul): test-cuda-ops; 0.5B one chunk of 32K with the new
#            oomb-train and the old one (.devcarry/old/oomb-train.xz, the commit before), interleaved, a per-shape
#            profile of each, HF + SDPA (HF=0: not); 7B sparse 64 pages 128K with the new binary (needs the H200;
#            S7B=0: not)
#   fixtures test-cuda-qwen2 against the HF fixtures (carry build-carry alone: tests-bins.tar.xz, fq.tar.xz)
#   h200     on the H200: 0.5B one chunk of 32K new, old, new again and HF + SDPA (the ratio), 7B sparse 64 pages
#            128K with the new binary, one step, not profiled
usage="usage: $0 prof | a05 | e2e7b | tests | ab | fixtures | h200"
case ${1:-} in prof|a05|e2e7b|tests|ab|fixtures|h200) ;; *) echo "$usage"; exit 2 ;; esac
source "$(dirname "$0")/lease-lib.sh"   # K, B, R, log, tests, rand_ids, unpack, r05, r7b, s7b, fixtures_qwen2
nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader
if [ "$1" = fixtures ]; then fixtures_qwen2; exit; fi
[ -x $B/oomb-train ] || unpack || exit 1
OLD=${OLD:-}
# HF + SDPA and the 7B runs need the H200's memory: on by default only on a card of more than 100 GB
big=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${big:-0}" -gt 100000 ] && big=1 || big=0
HF=${HF:-$big}; S7B=${S7B:-$big}
case $1 in
prof)
    rand_ids
    r05 prof2 OOMB_CUDA_PROFILE=2
    r05 new
    s7b prof OOMB_CUDA_PROFILE=1
    s7b noprof ;;
a05)
    rand_ids
    r05 new
    [ -n "$OLD" ] && r05 old $OLD
    r05 new2
    [ "${HF:-1}" = 0 ] || PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json ;;
e2e7b)
    rand_ids
    r7b new
    [ -n "$OLD" ] && r7b old $OLD ;;
tests)
    tests test-cuda-backend:120 test-cuda-ops:200 ;;
h200)
    mkdir -p $K/old && xz -dc .devcarry/old/oomb-train.xz > $K/old/oomb-train && chmod +x $K/old/oomb-train || exit 1
    cp $B/oomb-train $K/new-oomb-train
    use() { cp $1 $B/oomb-train; }
    rand_ids
    # most needed first (the call may run out of device time): new, HF, old, new again, the 7B sparse step
    use $K/new-oomb-train; r05 new
    PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    use $K/old/oomb-train; r05 old
    use $K/new-oomb-train; r05 new2
    s7b noprof ;;
ab)
    tests test-cuda-ops:200
    mkdir -p $K/old && xz -dc .devcarry/old/oomb-train.xz > $K/old/oomb-train && chmod +x $K/old/oomb-train || exit 1
    cat .devcarry/old/commit.txt
    cp $B/oomb-train $K/new-oomb-train
    use() { cp $1 $B/oomb-train; }   # r05 runs $B/oomb-train
    rand_ids
    use $K/new-oomb-train; r05 new
    use $K/old/oomb-train; r05 old
    use $K/new-oomb-train; r05 new2
    use $K/old/oomb-train; r05 old2
    use $K/new-oomb-train; r05 prof-new OOMB_CUDA_PROFILE=2
    use $K/old/oomb-train; r05 prof-old OOMB_CUDA_PROFILE=2
    use $K/new-oomb-train
    [ "${HF:-1}" = 0 ] || PYTHONUNBUFFERED=1 timeout 200 python3 .devcarry/hf_baseline.py qwen2.5-0.5b full 32768 3 2>/dev/null | tail -1 | tee $R/hf-05b-32k.json
    [ "${S7B:-1}" = 0 ] || s7b new OOMB_CUDA_PROFILE=1
    # more than the 8 files a call brings back: one archive
    (cd $R && tar -czf /tmp/ab-logs.tgz *.log *.json 2>/dev/null; rm -f *.log *.json; mv /tmp/ab-logs.tgz .) ;;
esac
