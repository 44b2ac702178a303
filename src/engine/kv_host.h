/*
 * kv_host: the storage of the KV blocks in host memory, for the backends that compute on the host (cpu,
 * scalar). The pool's bookkeeping (kvcache.h) says which block holds which positions; this holds the bytes,
 * in the layout kvcache.h fixes: one block for one layer, K and V alike, is [n_kv_heads][block_size] rows
 * of head_dim elements of the pool's type, so one head's keys for a block are contiguous for attention.
 * Layer-major (all blocks of layer 0, then layer 1, ...) keeps each layer's working set together.
 */
#ifndef WAFER_ENGINE_KV_HOST_H
#define WAFER_ENGINE_KV_HOST_H

#include "engine/kvcache.h"

#include <stddef.h>
#include <stdint.h>

struct kv_host {
    struct kv_pool_params p;
    size_t row_bytes;         /* one position, one KV head */
    size_t block_layer_bytes; /* one block, one layer, K or V: [n_kv_heads][block_size] rows */
    size_t layer_bytes;       /* K (or V) of all blocks of one layer */
    uint8_t *k;               /* [n_layers][n_blocks][n_kv_heads][block_size] rows */
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

/* K (or V) storage of block b in layer l: [n_kv_heads][block_size] rows of row_bytes. */
static inline void *kv_host_k(const struct kv_host *h, int layer, int32_t b)
{
    return h->k + (size_t)layer * h->layer_bytes + (size_t)b * h->block_layer_bytes;
}

static inline void *kv_host_v(const struct kv_host *h, int layer, int32_t b)
{
    return h->v + (size_t)layer * h->layer_bytes + (size_t)b * h->block_layer_bytes;
}

/* The row of KV head kvh at slot `slot` of a block's K or V storage blk. */
static inline void *kv_host_row(const struct kv_host *h, void *blk, int kvh, int slot)
{
    return (uint8_t *)blk + ((size_t)kvh * (size_t)h->p.block_size + (size_t)slot) * h->row_bytes;
}

#endif
