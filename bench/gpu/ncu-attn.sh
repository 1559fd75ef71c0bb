#!/usr/bin/env bash
# Nsight Compute on the attention kernels (issue 16): our warp-specialised forward (pa_fwd_ws_kernel) and pipelined
# backward (pa_bwd_pipe_kernel) on the 7B layer (28 / 4 heads, head dim 128, 32K, chunk 4096: one launch of the last
# chunk's), and cuDNN's SDPA forward and backward kernels on the same shape (bench/attention/sdpa_once.py), so that the
# same counters (tensor pipe, shared memory, L2, issue stalls) can be read side by side. Clocks left alone
# (--clock-control none, the device's METHOD.md). Text reports in $R/ncu-*.txt (details page) and *.csv (raw metrics).
# Source it after lease-lib.sh (B, R) or run it with the binaries in $B: ncu_attn [SEQ]
ncu_attn() {
    local S=${1:-32768} n=$(( ${1:-32768} / 4096 ))
    local NCU="ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
--section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats"
    command -v ncu > /dev/null || { echo "no ncu on this machine"; return 1; }
    for k in pa_fwd_ws_kernel pa_bwd_pipe_kernel; do
        # the warm-up runs the chunks' forwards in order, then their backwards in reverse: the last chunk's (most
        # history) is the forward's launch n - 1 and the backward's first
        local skip
        [ $k = pa_fwd_ws_kernel ] && skip=$((n - 1)) || skip=0
        timeout 240 $NCU -k regex:$k --launch-skip $skip --launch-count 1 -o $R/ncu-$k -f \
            $B/oomb-bench-attn --seq $S --chunk 4096 --reps 1 > $R/ncu-$k.run.txt 2>&1
        echo "ncu $k rc=$?"
        ncu -i $R/ncu-$k.ncu-rep --page details > $R/ncu-$k.txt 2>&1
        ncu -i $R/ncu-$k.ncu-rep --page raw --csv > $R/ncu-$k.csv 2>&1
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Shared Memory" $R/ncu-$k.txt | head -12
    done
    timeout 120 python3 bench/attention/sdpa_once.py --seq $S --names > $R/sdpa-kernels.txt 2>&1
    cat $R/sdpa-kernels.txt | head -12
    timeout 300 $NCU -k regex:'fprop|bprop|fmha|sdpa|flash' --launch-skip 0 --launch-count 6 -o $R/ncu-cudnn -f \
        python3 bench/attention/sdpa_once.py --seq $S > $R/ncu-cudnn.run.txt 2>&1
    echo "ncu cudnn rc=$?"
    ncu -i $R/ncu-cudnn.ncu-rep --page details > $R/ncu-cudnn.txt 2>&1
    ncu -i $R/ncu-cudnn.ncu-rep --page raw --csv > $R/ncu-cudnn.csv 2>&1
    grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Registers Per" $R/ncu-cudnn.txt | head -30
}
# ncu_src TAG KERNEL [BENCH ARGS...]: one launch of KERNEL (a regex; the first: in the bench's warm-up the backwards run from
# the last chunk, so the backward's first launch has the most history) of oomb-bench-attn with ARGS (default the 7B layer at
# 32K, chunk 4096) under the source counters (warp-state samples per SASS instruction): $R/ncu-src-TAG.csv (the source page,
# SASS) and .txt (WarpStateStats, SchedulerStats); bench/attention/sass_stalls.py summarises the csv.
ncu_src() {
    local tag=$1 k=$2; shift 2
    [ $# -gt 0 ] || set -- --seq 32768 --chunk 4096
    command -v ncu > /dev/null || { echo "no ncu on this machine"; return 1; }
    timeout 240 ncu --clock-control none --section WarpStateStats --section SourceCounters --section SchedulerStats --import-source no \
        -k regex:$k --launch-skip 0 --launch-count 1 -o $R/ncu-src-$tag -f \
        $B/oomb-bench-attn "$@" --reps 1 > $R/ncu-src-$tag.run.txt 2>&1
    echo "ncu src $tag rc=$?"
    ncu -i $R/ncu-src-$tag.ncu-rep --page details > $R/ncu-src-$tag.txt 2>&1
    ncu -i $R/ncu-src-$tag.ncu-rep --page source --csv --print-source sass > $R/ncu-src-$tag.csv 2>&1
    grep -E "Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps" $R/ncu-src-$tag.txt | head -20
    python3 bench/attention/sass_stalls.py $R/ncu-src-$tag.csv 45 > $R/stalls-$tag.txt 2>&1; tail -48 $R/stalls-$tag.txt
}
