/*
 * prefix_cache: reuse of computed KV blocks across requests that share a token prefix (a system prompt, a
 * chat history, the n choices of one prompt).
 *
 * A full block (block_size positions) is named by a hash chain: hash(block i) = H(hash(block i-1), its
 * tokens), so a name stands for the whole prefix up to the block's end and equal names mean equal KV
 * contents (the KV of a position depends only on the tokens up to it). Entries keep the tokens and the
 * parent hash to rule out collisions. The cache holds one reference on each cached block (kv_block_ref);
 * a block whose only reference is the cache's is "evictable" and goes back to the pool, least recently
 * used first, when the scheduler needs room. Only full blocks are cached: they are never written again.
 * Engine thread only.
 */
#ifndef WAFER_ENGINE_PREFIX_CACHE_H
#define WAFER_ENGINE_PREFIX_CACHE_H

#include "engine/kvcache.h"

#include <stdint.h>

struct prefix_cache;

/* Where a sequence's registration got to (embed one per sequence, zero-initialised; reset to zero when the
 * sequence is truncated). */
struct prefix_cursor {
    int n_blocks;  /* leading full blocks already registered or found */
    uint64_t hash; /* chain hash after those blocks */
};

/* A cache over pool's blocks (block_size from the pool). NULL on OOM. Caller frees with
 * prefix_cache_destroy, which drops every reference the cache holds. */
struct prefix_cache *prefix_cache_create(struct kv_pool *pool);
void prefix_cache_destroy(struct prefix_cache *pc);

/* Makes dst (emptied first) share the longest cached prefix of tokens[0..n_tokens), at most max_pos
 * positions, and returns the positions attached (0 when nothing matched; a multiple of the block size
 * unless max_pos cut the last block, which is then copied on its first write). Sets *cur to continue
 * registration after the attached full blocks. Marks the entries used. ERR_NOMEM on failure. */
int prefix_cache_attach(struct prefix_cache *pc, const int32_t *tokens, int n_tokens, int max_pos,
                        struct kv_seq *dst, struct prefix_cursor *cur);

/* Registers the full blocks of seq that hold tokens[0..n_pos) (n_pos <= seq->n_pos) past *cur, taking a
 * reference on each newly cached block. Blocks whose name is already cached are skipped. */
void prefix_cache_insert(struct prefix_cache *pc, const int32_t *tokens, int n_pos, const struct kv_seq *seq,
                         struct prefix_cursor *cur);

/* Marks seq's cached blocks used, its last block least recently (call when the sequence is done, after the
 * last prefix_cache_insert): eviction then shortens its cached chain from the end. */
void prefix_cache_release(struct prefix_cache *pc, const struct kv_seq *seq);
/* Returns up to n evictable blocks to the pool, least recently used first; returns how many were freed. */
int64_t prefix_cache_evict(struct prefix_cache *pc, int64_t n);
/* Blocks held by the cache, and those of them only the cache holds (reclaimable; O(1): the pool counts them,
 * so a pool has at most one cache). */
int64_t prefix_cache_blocks(const struct prefix_cache *pc);
int64_t prefix_cache_evictable(const struct prefix_cache *pc);
/* Drops every entry (references released). */
void prefix_cache_clear(struct prefix_cache *pc);

#endif
