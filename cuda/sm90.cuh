// Hopper (sm_90a) synchronisation and copy primitives for warp-specialised kernels, hand-written
// PTX (ISA 8.0+): shared-memory mbarriers with transaction counts, TMA tensor loads (cp.async.bulk.
// tensor) that complete on an mbarrier, named barriers, and the register reallocation between
// warpgroups (setmaxnreg). The wgmma instructions themselves are in wgmma.cuh (generated).
// Everything here compiles to nothing (or a trap) outside an sm_90a build: callers guard on
// OOMB_WGMMA, which wgmma.cuh defines.
#pragma once
#include <cstdint>

#include "wgmma.cuh"

namespace oomb_sm90 {

#ifdef OOMB_WGMMA
// mbarrier at shared address bar: arrival count `count`, phase 0 in progress.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes mbarrier initialisations visible to the async proxy (TMA) and other threads; then a barrier.
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also expects `bytes` more transaction bytes in the current phase (the producer).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One plain arrival (a consumer thread releasing a stage).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
// Waits until the phase of parity `parity` has completed (a fresh barrier: parity 1 returns at once,
// parity 0 after the first phase completes).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
// TMA: the box at coordinates (c0, c1, c2, c3) of the 4-d tensor map `tmap` (a __grid_constant__
// kernel parameter) into shared memory at dst, completing `box bytes` transactions on bar.
// Coordinates outside the tensor fill zeros (and still count their bytes).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void * tmap, uint32_t bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
        "l"((uint64_t) tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
// Bulk copy (non-tensor TMA): `bytes` (a multiple of 16) from global src to shared dst (both 16-byte
// aligned), completing its bytes on bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void * src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"((uint64_t) src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void prefetch_tmap(const void * tmap) { asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t) tmap) : "memory"); }
// Named barriers 1..15 (0 is __syncthreads): bar_sync waits until n threads (a multiple of 32) have
// arrived, counting itself; bar_arrive counts without waiting.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
// Register reallocation between the warpgroups of a CTA (every warp of the warpgroup executes it).
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
#endif // OOMB_WGMMA

} // namespace oomb_sm90
