/*
 * kv_host: host-memory KV block storage (see kv_host.h), one anonymous mapping for K and V of every layer.
 */
#include "engine/kv_host.h"

#include "core/err.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

int kv_host_init(struct kv_host *h, const struct kv_pool_params *p, char *err)
{
    memset(h, 0, sizeof *h);
    h->p = *p;
    h->row_bytes = kv_pool_row_bytes(p);
    h->head_block_bytes = (size_t)p->block_size * h->row_bytes;
    h->head_bytes = h->head_block_bytes * (size_t)p->n_blocks;
    h->layer_bytes = h->head_bytes * (size_t)p->n_kv_heads;
    size_t bytes = 2 * h->layer_bytes * (size_t)p->n_layers;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* Anonymous mapping: pages are zero and only touched pages cost memory. It sits between two PROT_NONE
     * guard pages, so an overrun faults instead of scribbling on a neighbour, and the kernel cannot merge it
     * with an adjacent anonymous mapping: /proc/PID/smaps then shows the cache as one mapping of exactly
     * `bytes`, named [anon:wafer-kv] where the kernel supports names, which is how the soak test tells the
     * KV cache's resident pages (bounded by the pool) from the rest of the process's memory. */
    uint8_t *m = mmap(NULL, bytes + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED || mprotect(m + page, bytes, PROT_READ | PROT_WRITE) != 0) {
        if (m != MAP_FAILED)
            munmap(m, bytes + 2 * page);
        return err_set(err, ERR_NOMEM, "cannot allocate %.1f MiB for the KV cache (%lld blocks); lower the KV budget",
                       bytes / 1048576.0, (long long)p->n_blocks);
    }
#ifdef PR_SET_VMA_ANON_NAME
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)(m + page), bytes, (unsigned long)"wafer-kv"); /* best effort */
#endif
    h->map_bytes = bytes;
    h->guard_bytes = page;
    h->k = m + page;
    h->v = h->k + h->layer_bytes * (size_t)p->n_layers;
    return 0;
}

void kv_host_deinit(struct kv_host *h)
{
    if (h->k)
        munmap(h->k - h->guard_bytes, h->map_bytes + 2 * h->guard_bytes);
    memset(h, 0, sizeof *h);
}

void kv_host_copy(struct kv_host *h, int32_t dst, int32_t src)
{
    for (int l = 0; l < h->p.n_layers; l++)
        for (int kvh = 0; kvh < h->p.n_kv_heads; kvh++) {
            memcpy(kv_host_row(h, kv_host_k(h, l, dst), kvh, 0), kv_host_row(h, kv_host_k(h, l, src), kvh, 0),
                   h->head_block_bytes);
            memcpy(kv_host_row(h, kv_host_v(h, l, dst), kvh, 0), kv_host_row(h, kv_host_v(h, l, src), kvh, 0),
                   h->head_block_bytes);
        }
}
