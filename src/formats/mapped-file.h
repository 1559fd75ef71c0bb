// Read-only file mappings of the format readers (GGUFReader, SafetensorsFile): the one place that
// gives a mapped range back. A loader copies a tensor out of the mapping (to the device, or into a
// converted host buffer) and then releases the range, so that loading a multi-GB model or optimizer
// state keeps only the bytes in flight resident, not the whole file (issue 19: a 7B resume mapped
// 28 GB of state.safetensors into the resident set). The pages stay in the page cache; a later read
// of the range maps them again from the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <sys/mman.h>
#include <unistd.h>

namespace oomb {

// madvise(MADV_DONTNEED) on the whole pages of [p, p + n) that lie inside the mapping [map, map + map_size).
// No-op without a mapping (open_memory) or for a range outside it.
inline void mapped_release(void * map, size_t map_size, const void * p, size_t n) {
    if (!map || !p || n == 0) return;
    const uintptr_t lo = (uintptr_t) map, hi = lo + map_size, a = (uintptr_t) p, b = a + n;
    if (a < lo || b > hi) return;
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
    const uintptr_t first = (a + page - 1) / page * page, last = b == hi ? hi : b / page * page;  // the file's last page is whole
    if (last > first) madvise((void *) first, (size_t) (last - first), MADV_DONTNEED);
}

} // namespace oomb
