/*
 * kv_host: the storage of the KV blocks in host memory, for the backends that compute on the host (cpu,
 * scalar). The pool's bookkeeping (kvcache.h) says which block holds which positions; this holds the bytes.
 * Each layer's K (and V) is head-major: [n_kv_heads][n_blocks][block_size] rows of head_dim elements of the
 * pool's type, so one head's keys for a block are contiguous (kvcache.h's contract), and so are one head's
 * keys over consecutive blocks, which is what a sequence's blocks are once the pool has handed them out in
 * order. Decode reads one head's run of every block of the sequence: block-major ([n_blocks][n_kv_heads]
 * [block_size], before stop 28) cut that run every block_size rows (2 KiB for F16 heads of 64) with the other
 * heads' rows between, and the hardware prefetcher restarted at every block; head-major, attention at a
 * depth of 3,072 took 4.2 ms of a 1B Q4_0 token instead of 6.8 (docs/performance.md, stop 28).
 * Layer-major (all of layer 0, then layer 1, ...) keeps each layer's working set together.
 */
#ifndef WAFER_ENGINE_KV_HOST_H
#define WAFER_ENGINE_KV_HOST_H

#include "engine/kvcache.h"

#include <stddef.h>
#include <stdint.h>

struct kv_host {
    struct kv_pool_params p;
    size_t row_bytes;         /* one position, one KV head */
    size_t head_block_bytes;  /* one block, one KV head, one layer, K or V: block_size rows */
    size_t head_bytes;        /* every block of one KV head and layer: [n_blocks][block_size] rows */
    size_t layer_bytes;       /* K (or V) of one layer: [n_kv_heads][n_blocks][block_size] rows */
    uint8_t *k;               /* [n_layers][n_kv_heads][n_blocks][block_size] rows */
    uint8_t *v;               /* same */
    size_t map_bytes;         /* K and V together */
    size_t guard_bytes;       /* one PROT_NONE page mapped before k and after the end of v */
};

/* Maps zeroed storage for p->n_blocks blocks (only pages touched cost memory). 0, or ERR_NOMEM with a
 * message. Release with kv_host_deinit (also safe on a zeroed struct). */
int kv_host_init(struct kv_host *h, const struct kv_pool_params *p, char *err);
void kv_host_deinit(struct kv_host *h);
/* Copies block src (every layer, K and V) over block dst. */
void kv_host_copy(struct kv_host *h, int32_t dst, int32_t src);

/* K (or V) storage of block b in layer l, for kv_host_row: head 0's block_size rows of row_bytes (head h's are
 * head_bytes further). */
static inline void *kv_host_k(const struct kv_host *h, int layer, int32_t b)
{
    return h->k + (size_t)layer * h->layer_bytes + (size_t)b * h->head_block_bytes;
}

static inline void *kv_host_v(const struct kv_host *h, int layer, int32_t b)
{
    return h->v + (size_t)layer * h->layer_bytes + (size_t)b * h->head_block_bytes;
}

/* The row of KV head kvh at slot `slot` of a block's K or V storage blk. */
static inline void *kv_host_row(const struct kv_host *h, void *blk, int kvh, int slot)
{
    return (uint8_t *)blk + (size_t)kvh * h->head_bytes + (size_t)slot * h->row_bytes;
}

#endif
