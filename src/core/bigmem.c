/*
 * bigmem: see bigmem.h. Alignment by over-mapping: map bytes + 2 MiB, then unmap the slack before the first
 * 2 MiB boundary and after the end, so what remains is exactly [p, p + bytes) and munmap(p, bytes) frees it.
 */
#include "core/bigmem.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define BIGMEM_HUGE ((size_t)2 << 20)

void *bigmem_alloc(size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - BIGMEM_HUGE) {
        errno = EINVAL;
        return NULL;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (bytes + page - 1) / page * page;
    size_t map = len + BIGMEM_HUGE;
    uint8_t *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + BIGMEM_HUGE - 1) & ~(uintptr_t)(BIGMEM_HUGE - 1));
    if (p > m)
        munmap(m, (size_t)(p - m));
    if (m + map > p + len)
        munmap(p + len, (size_t)(m + map - (p + len)));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* best effort: see the header */
#endif
    return p;
}

void bigmem_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}
