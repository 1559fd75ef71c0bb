#!/usr/bin/env bash
# Checks that the library runs on any x86-64 CPU: no AVX / AVX2 / AVX-512 instruction (a VEX or EVEX
# encoded one: v* mnemonics, ymm / zmm / opmask registers) outside the kernels chosen at run time by
# what the CPU has (src/cpu/paged-attn.cpp: the isa_avx2 and isa_avx512 variants). Catches -march=native
# (or -mavx2, ...) in the build flags, and a template or inline function instantiated inside a
# `#pragma GCC target` region, then called from baseline code.
#   scripts/check-isa.sh [BUILD]     the build folder (default build/): checks BUILD/lib/liboomb.so
set -euo pipefail
lib="${1:-build}/lib/liboomb.so"
if [ "$(uname -m)" != x86_64 ]; then echo "check-isa: not x86-64, nothing to check"; exit 0; fi
[ -f "$lib" ] || { echo "check-isa: $lib not found (build first)" >&2; exit 1; }
report=$(objdump -d --no-show-raw-insn -C "$lib" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<")); next }
    /%[yz]mm[0-9]|%k[0-7]([^0-9]|$)|\tv[a-z0-9]+ .*%xmm[0-9]/ {
        n_all[fn]++
        if (fn ~ /isa_avx2::|isa_avx512::/) next
        if (!(fn in bad)) { bad[fn] = $0; order[++nb] = fn }
    }
    END {
        for (f in n_all) if (f ~ /isa_avx2::|isa_avx512::/) nd++
        printf "dispatched %d\n", nd
        for (i = 1; i <= nb; i++) printf "bad %s: %s\n", order[i], bad[order[i]]
    }')
nd=$(sed -n 's/^dispatched //p' <<< "$report")
if grep -q '^bad ' <<< "$report"; then
    echo "check-isa: $lib has AVX instructions outside the run-time dispatched kernels (illegal on a CPU without them):" >&2
    grep '^bad ' <<< "$report" | sed 's/^bad /  /' | head -20 >&2
    exit 1
fi
if [ "${nd:-0}" -eq 0 ]; then
    echo "check-isa: no dispatched AVX2 / AVX-512 kernels found in $lib (were they renamed? update this check)" >&2
    exit 1
fi
echo "check-isa: ok: AVX instructions only in the $nd run-time dispatched kernels (isa_avx2 / isa_avx512) of $lib"
