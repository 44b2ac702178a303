/*
 * kvcache: the paged KV cache's bookkeeping. A pool of n_blocks fixed-size blocks (block_size positions
 * each, every layer's K and V); each sequence owns a block table (struct kv_seq). Blocks are
 * reference-counted so sequences sharing a prompt prefix share blocks; a block that is shared and must be
 * written is copied first (copy on write). Only the engine thread touches a pool.
 *
 * The pool holds no KV data: the backend stores the blocks (in host or device memory, see backend.h), and
 * the pool asks it, through the copy callback given at creation, to copy a block for a copy on write.
 *
 * What every backend stores for one block, one layer and one KV head, K and V alike: block_size rows of
 * head_dim elements of the pool's type (F16 by default, F32, or Q8_0 blocks of 32), contiguous, so one head's
 * keys for a block are one run. How those runs are placed is the backend's (the host backends put one head's
 * blocks side by side: kv_host.h).
 */
#ifndef WAFER_ENGINE_KVCACHE_H
#define WAFER_ENGINE_KVCACHE_H

#include "engine/dtype.h"

#include <stdbool.h>
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

/* Copies block src's data (every layer, K and V) over block dst's, in the storage the callback's ctx owns. */
typedef void (*kv_block_copy_fn)(void *ctx, int32_t dst, int32_t src);

/* The bookkeeping of a pool of p->n_blocks blocks (checks the type and geometry). copy(copy_ctx, dst, src)
 * is called for every copy on write; NULL for a pool without storage (tests of the bookkeeping). NULL and a
 * message on failure. Caller frees with kv_pool_destroy. */
struct kv_pool *kv_pool_create(const struct kv_pool_params *p, kv_block_copy_fn copy, void *copy_ctx, char *err);
void kv_pool_destroy(struct kv_pool *pool);
const struct kv_pool_params *kv_pool_params(const struct kv_pool *pool);
int64_t kv_pool_free_blocks(const struct kv_pool *pool);
/* Bytes of one cached row (one position, one KV head, K or V). */
size_t kv_pool_row_bytes(const struct kv_pool_params *p);
/* Bytes of one block across all layers, K and V. */
size_t kv_pool_block_bytes(const struct kv_pool_params *p);

/* Blocks per extent of the pool's allocation (kvcache.c): 256 positions at the engine's block size of 16. */
#define KV_EXTENT_BLOCKS 16

/* A free block with refcount 1, or ERR_NO_SPACE. after: the block the new one will follow in a sequence
 * (-1 for none): block after + 1 when it is free, else the start of a wholly free extent (calling the
 * reclaim callback first when none is), else any. */
int32_t kv_block_alloc(struct kv_pool *pool, int32_t after);
/* Gives blocks referenced elsewhere back to the pool (kv_block_unref) so that an extent becomes wholly free
 * where it can; returns how many it freed. It must not allocate. */
typedef int64_t (*kv_reclaim_fn)(void *ctx);
/* Installs (fn non-NULL) or removes the pool's reclaim callback; the pool calls it from kv_block_alloc. */
void kv_pool_set_reclaim(struct kv_pool *pool, kv_reclaim_fn fn, void *ctx);
/* Extents (KV_EXTENT_BLOCKS blocks) none of whose blocks is in use. */
int64_t kv_pool_free_extents(const struct kv_pool *pool);
void kv_block_ref(struct kv_pool *pool, int32_t b);
/* Drops a reference; the block returns to the pool's free blocks at zero. */
void kv_block_unref(struct kv_pool *pool, int32_t b);
int kv_block_refcount(const struct kv_pool *pool, int32_t b);
/* Marks that one of b's references (b in use) is a cache's, or no longer is: set it after taking that
 * reference and clear it before dropping it. The pool then counts, as refcounts change, the marked blocks
 * whose only reference is the cache's (what the cache could give back), in O(1). */
void kv_block_set_cached(struct kv_pool *pool, int32_t b, bool cached);
/* Marked blocks with refcount 1. */
int64_t kv_pool_cached_idle(const struct kv_pool *pool);

/* A sequence's block table: position p lives in blocks[p / block_size] at slot p % block_size. */
struct kv_seq {
    int32_t *blocks; /* [cap_blocks], owned */
    int n_blocks;
    int cap_blocks;
    int n_pos; /* positions stored */
};

void kv_seq_init(struct kv_seq *s);
/* kv_seq_init with room for cap_blocks blocks, so that reserving and sharing up to cap_blocks * block_size
 * positions never allocates. 0 or ERR_NOMEM. */
int kv_seq_init_cap(struct kv_seq *s, int cap_blocks);
/* Releases every block reference and the table. */
void kv_seq_deinit(struct kv_pool *pool, struct kv_seq *s);
/* Makes room for positions [s->n_pos, n_pos): allocates blocks and copies a shared partially-filled last
 * block (copy on write, through the pool's copy callback). Grows the table only past its capacity. All or
 * nothing: returns 0, ERR_NO_SPACE (no block changed) or ERR_NOMEM. Does not change s->n_pos (the forward
 * pass sets it once the positions are written). */
int kv_seq_reserve(struct kv_pool *pool, struct kv_seq *s, int n_pos);
/* Number of new blocks kv_seq_reserve(s, n_pos) would take (including a copy on write). */
int kv_seq_blocks_needed(const struct kv_pool *pool, const struct kv_seq *s, int n_pos);
/* Keeps the first n_pos positions and releases blocks past them. */
void kv_seq_truncate(struct kv_pool *pool, struct kv_seq *s, int n_pos);
/* Makes dst (emptied first) share src's first n_pos positions by reference: whole blocks shared, including a
 * partially used last one (copied on the first write). 0 or ERR_NOMEM. */
int kv_seq_share(struct kv_pool *pool, struct kv_seq *dst, const struct kv_seq *src, int n_pos);

#endif
