#!/usr/bin/env bash
# Runs the test suite of a build (its already-built binaries, through CTest) once more as on an x86-64
# machine with AVX2 but no AVX-512, on a machine that has more:
#   OOMB_PAGED_ISA=avx2          our paged-attention kernels (src/cpu/paged-attn.cpp: base | avx2 | avx512)
#   OPENBLAS_CORETYPE=Haswell    OpenBLAS's AVX2 kernels (the Debian build picks its core at run time)
#   GLIBC_TUNABLES=...hwcaps     glibc's string / math functions and ld.so's library search without
#                                AVX-512 (glibc 2.36 accepts these names; others are ignored)
# test-isa checks that the first two took effect (its log says which kernels ran); ld.so's report
# is checked for the third. Results that depend on the machine's instruction set then fail here.
#   scripts/test-lower-isa.sh [BUILD] [CTEST ARGS...]    (default build/)
set -euo pipefail
build="${1:-build}"
shift || true
if [ "$(uname -m)" != x86_64 ]; then echo "test-lower-isa: not x86-64, nothing to do"; exit 0; fi
if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
    echo "test-lower-isa: this CPU has no AVX2 / FMA: the normal run was already the lower one"; exit 0
fi
export OOMB_PAGED_ISA=avx2
export OPENBLAS_CORETYPE=Haswell
export GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512BW,-AVX512CD,-AVX512DQ,-AVX512ER,-AVX512PF,-AVX512VL
echo "test-lower-isa: CPU has: $(grep -o 'avx512[a-z0-9_]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "test-lower-isa: OOMB_PAGED_ISA=$OOMB_PAGED_ISA OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE GLIBC_TUNABLES=$GLIBC_TUNABLES"
ldso=/lib64/ld-linux-x86-64.so.2
if "$ldso" --help 2>/dev/null | grep -q 'x86-64-v4 (supported'; then
    echo "test-lower-isa: glibc still reports x86-64-v4 (AVX-512) as supported under GLIBC_TUNABLES" >&2; exit 1
fi
"$ldso" --help 2>/dev/null | grep -A3 'Subdirectories of glibc-hwcaps' | sed 's/^/  ld.so: /' || true
isa_log=$("$build/bin/test-isa" 2>&1) || { echo "$isa_log" >&2; echo "test-lower-isa: test-isa failed: the forced ISA did not take effect" >&2; exit 1; }
grep -E 'kernels ran|OpenBLAS core' <<< "$isa_log" | sed 's/^/  test-isa: /'
if grep -q 'SKIPPED \]' <<< "$isa_log"; then
    echo "$isa_log" >&2; echo "test-lower-isa: test-isa skipped a check" >&2; exit 1
fi
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
