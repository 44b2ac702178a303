/*
 * bigmem: anonymous memory for buffers of hundreds of MiB that are streamed from start to end (a model's
 * weights, the bandwidth probe's buffer), backed by 2 MiB transparent huge pages where the kernel allows it.
 *
 * Why: decode reads every weight once per token, and with 4 KiB pages that is a TLB miss every 4 KiB (a 1B
 * F16 model: 540,000 page walks per token). On the Zen 5 test machine (THP "madvise" mode, the Debian
 * default) 1B F16 decode went from 15.6-18.7 to 20.3-22.0 tokens/s with huge pages alone, and loading got
 * faster (fewer page faults; docs/performance.md, stop 9). The mapping is aligned to 2 MiB so every whole 2 MiB of it can be a huge page whatever the
 * kernel's placement; madvise failing (THP disabled, old kernel) leaves ordinary pages, which only costs speed.
 */
#ifndef WAFER_CORE_BIGMEM_H
#define WAFER_CORE_BIGMEM_H

#include <stddef.h>

/* Maps `bytes` (> 0) of zeroed, readable and writable anonymous memory starting on a 2 MiB boundary and asks
 * for huge pages. Returns NULL with errno set when the mapping fails. The caller frees it with
 * bigmem_free(p, bytes), passing the same size; munmap(p, bytes) is equivalent. */
void *bigmem_alloc(size_t bytes);

/* Unmaps what bigmem_alloc(bytes) returned; NULL is ignored. */
void bigmem_free(void *p, size_t bytes);

#endif
