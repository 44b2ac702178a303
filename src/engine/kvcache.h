/*
 * kvcache: the paged KV cache. One pool of fixed-size blocks (block_size positions each, every layer's K and
 * V) is allocated once from a memory budget; each sequence owns a block table (struct kv_seq). Blocks are
 * reference-counted so sequences sharing a prompt prefix share blocks; a block that is shared and must be
 * written is copied first (copy on write). Only the engine thread touches a pool.
 *
 * Storage of one block for one layer, K and V alike: [n_kv_heads][block_size] rows of head_dim elements of
 * the pool's type (F16 by default, F32, or Q8_0 blocks of 32), so one head's keys for a block are contiguous.
 */
#ifndef WAFER_ENGINE_KVCACHE_H
#define WAFER_ENGINE_KVCACHE_H

#include "engine/dtype.h"

#include <stddef.h>
#include <stdint.h>

struct kv_pool_params {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;   /* positions per block */
    int64_t n_blocks; /* blocks in the pool */
    enum dtype type;  /* DTYPE_F16, DTYPE_F32 or DTYPE_Q8_0 (head_dim a multiple of 32) */
};

struct kv_pool;

/* Allocates the whole pool up front. NULL and a message on failure. Caller frees with kv_pool_destroy. */
struct kv_pool *kv_pool_create(const struct kv_pool_params *p, char *err);
void kv_pool_destroy(struct kv_pool *pool);
const struct kv_pool_params *kv_pool_params(const struct kv_pool *pool);
int64_t kv_pool_free_blocks(const struct kv_pool *pool);
/* Bytes of one cached row (one position, one KV head, K or V). */
size_t kv_pool_row_bytes(const struct kv_pool_params *p);
/* Bytes of one block across all layers, K and V. */
size_t kv_pool_block_bytes(const struct kv_pool_params *p);

/* Storage of block b in layer l: [n_kv_heads][block_size] rows of kv_pool_row_bytes. */
void *kv_block_k(struct kv_pool *pool, int layer, int32_t b);
void *kv_block_v(struct kv_pool *pool, int layer, int32_t b);

/* A free block with refcount 1, or ERR_NO_SPACE. */
int32_t kv_block_alloc(struct kv_pool *pool);
void kv_block_ref(struct kv_pool *pool, int32_t b);
/* Drops a reference; the block returns to the free list at zero. */
void kv_block_unref(struct kv_pool *pool, int32_t b);
int kv_block_refcount(const struct kv_pool *pool, int32_t b);

/* A sequence's block table: position p lives in blocks[p / block_size] at slot p % block_size. */
struct kv_seq {
    int32_t *blocks; /* [cap_blocks], owned */
    int n_blocks;
    int cap_blocks;
    int n_pos; /* positions stored */
};

void kv_seq_init(struct kv_seq *s);
/* Releases every block reference and the table. */
void kv_seq_deinit(struct kv_pool *pool, struct kv_seq *s);
/* Makes room for positions [s->n_pos, n_pos): allocates blocks and copies a shared partially-filled last
 * block (copy on write). All or nothing: returns 0, ERR_NO_SPACE (no block changed) or ERR_NOMEM. Does not
 * change s->n_pos (the forward pass sets it once the positions are written). */
int kv_seq_reserve(struct kv_pool *pool, struct kv_seq *s, int n_pos);
/* Number of new blocks kv_seq_reserve(s, n_pos) would take (including a copy on write). */
int kv_seq_blocks_needed(const struct kv_pool *pool, const struct kv_seq *s, int n_pos);
/* Keeps the first n_pos positions and releases blocks past them. */
void kv_seq_truncate(struct kv_pool *pool, struct kv_seq *s, int n_pos);
/* Makes dst (emptied first) share src's first n_pos positions by reference: whole blocks shared, including a
 * partially used last one (copied on the first write). 0 or ERR_NOMEM. */
int kv_seq_share(struct kv_pool *pool, struct kv_seq *dst, const struct kv_seq *src, int n_pos);

#endif
