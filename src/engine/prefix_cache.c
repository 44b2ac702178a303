/*
 * prefix_cache: an open-addressing table (linear probing, backward-shift deletion) from chain hash to entry,
 * entries in a fixed array sized to the pool (a block is cached at most once, so the pool's block count
 * bounds the entries), and an intrusive LRU list. Lookups walk the chain block by block from the start of
 * the prompt and stop at the first miss, so an entry whose parent was evicted is simply never reached again
 * and ages out of the LRU list.
 *
 * Eviction is least recently used first, and a chain's blocks are marked used last block first (when a
 * sequence is released, and when a lookup reaches them), so eviction takes a chain from its end: what stays
 * cached is still a prefix that lookups reach (taking the first block, as marking in chain order did, leaves
 * the rest cached but unreachable), and a finished sequence's blocks, which the pool placed side by side
 * (kvcache.c), go back together. That matters once the cache has filled the pool: every block a sequence
 * takes is then one the cache gave back, and the pool calls pc_reclaim when a sequence starts a new run and
 * no extent is wholly free, which evicts until one is. Evicting one block at a time, exactly what a step
 * needed, in chain order, handed out blocks of many old sequences in turns: in a simulated server's traffic
 * sequences got runs of 1.0 block (against 15 now), and decode attention at depth 4,064 is 1.8-2.2x slower
 * on scattered blocks (docs/performance.md, stops 29-30).
 */
#include "engine/prefix_cache.h"

#include "core/err.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define PC_ROOT 0x6a09e667f3bcc909ULL /* chain hash before the first block */

struct pc_entry {
    uint64_t hash, parent;
    int32_t block;
    int32_t prev, next; /* LRU list: head is the most recently used */
    bool live;
};

struct prefix_cache {
    struct kv_pool *pool;
    int bs;
    int64_t cap;          /* entries = pool blocks */
    struct pc_entry *ent; /* [cap] */
    int32_t *tok;         /* [cap][bs] tokens of each entry's block */
    int32_t *free_ent;    /* [cap] stack of unused entry slots */
    int64_t n_free_ent;
    int32_t *table;       /* [mask + 1] entry index or -1 */
    int32_t *ent_of;      /* [cap] the entry caching each block, or -1 */
    uint64_t mask;
    int32_t head, tail;
    int64_t n;
};

static uint64_t pc_hash(uint64_t parent, const int32_t *t, int n)
{
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)t[i];
        h *= 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
    }
    h ^= h >> 29;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 32;
    return h;
}

static int64_t pc_reclaim(void *ctx);

struct prefix_cache *prefix_cache_create(struct kv_pool *pool)
{
    struct prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc)
        return NULL;
    const struct kv_pool_params *pp = kv_pool_params(pool);
    pc->pool = pool;
    pc->bs = pp->block_size;
    pc->cap = pp->n_blocks;
    uint64_t tsize = 16;
    while (tsize < (uint64_t)pc->cap * 2)
        tsize <<= 1;
    pc->mask = tsize - 1;
    pc->ent = calloc((size_t)pc->cap, sizeof *pc->ent);
    pc->tok = malloc((size_t)pc->cap * (size_t)pc->bs * sizeof *pc->tok);
    pc->free_ent = malloc((size_t)pc->cap * sizeof *pc->free_ent);
    pc->table = malloc(tsize * sizeof *pc->table);
    pc->ent_of = malloc((size_t)pc->cap * sizeof *pc->ent_of);
    if (!pc->ent || !pc->tok || !pc->free_ent || !pc->table || !pc->ent_of) {
        prefix_cache_destroy(pc);
        return NULL;
    }
    for (uint64_t i = 0; i < tsize; i++)
        pc->table[i] = -1;
    for (int64_t i = 0; i < pc->cap; i++) {
        pc->free_ent[i] = (int32_t)(pc->cap - 1 - i);
        pc->ent_of[i] = -1;
    }
    pc->n_free_ent = pc->cap;
    pc->head = pc->tail = -1;
    kv_pool_set_reclaim(pool, pc_reclaim, pc);
    return pc;
}

void prefix_cache_destroy(struct prefix_cache *pc)
{
    if (!pc)
        return;
    kv_pool_set_reclaim(pc->pool, NULL, NULL);
    if (pc->ent && pc->table)
        prefix_cache_clear(pc);
    free(pc->ent);
    free(pc->tok);
    free(pc->free_ent);
    free(pc->table);
    free(pc->ent_of);
    free(pc);
}

static void pc_lru_unlink(struct prefix_cache *pc, int32_t i)
{
    struct pc_entry *e = &pc->ent[i];
    if (e->prev >= 0)
        pc->ent[e->prev].next = e->next;
    else
        pc->head = e->next;
    if (e->next >= 0)
        pc->ent[e->next].prev = e->prev;
    else
        pc->tail = e->prev;
    e->prev = e->next = -1;
}

/* Makes i the most recently used entry (pc_lru_unlink first when it is listed). */
static void pc_lru_push_front(struct prefix_cache *pc, int32_t i)
{
    struct pc_entry *e = &pc->ent[i];
    e->prev = -1;
    e->next = pc->head;
    if (pc->head >= 0)
        pc->ent[pc->head].prev = i;
    pc->head = i;
    if (pc->tail < 0)
        pc->tail = i;
}

/* Entry for (parent, tokens) or -1. */
static int32_t pc_find(const struct prefix_cache *pc, uint64_t h, uint64_t parent, const int32_t *t)
{
    for (uint64_t s = h & pc->mask;; s = (s + 1) & pc->mask) {
        int32_t i = pc->table[s];
        if (i < 0)
            return -1;
        const struct pc_entry *e = &pc->ent[i];
        if (e->hash == h && e->parent == parent &&
            !memcmp(&pc->tok[(size_t)i * (size_t)pc->bs], t, (size_t)pc->bs * sizeof *t))
            return i;
    }
}

static bool pc_hash_present(const struct prefix_cache *pc, uint64_t h)
{
    for (uint64_t s = h & pc->mask;; s = (s + 1) & pc->mask) {
        int32_t i = pc->table[s];
        if (i < 0)
            return false;
        if (pc->ent[i].hash == h)
            return true;
    }
}

static void pc_table_remove(struct prefix_cache *pc, int32_t idx)
{
    uint64_t s = pc->ent[idx].hash & pc->mask;
    while (pc->table[s] != idx)
        s = (s + 1) & pc->mask;
    /* backward-shift deletion keeps every probe chain unbroken without tombstones */
    uint64_t hole = s;
    for (uint64_t j = (s + 1) & pc->mask; pc->table[j] >= 0; j = (j + 1) & pc->mask) {
        uint64_t home = pc->ent[pc->table[j]].hash & pc->mask;
        /* move j into the hole when its home is not cyclically in (hole, j] */
        bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            pc->table[hole] = pc->table[j];
            hole = j;
        }
    }
    pc->table[hole] = -1;
}

static void pc_drop(struct prefix_cache *pc, int32_t i)
{
    pc_table_remove(pc, i);
    pc_lru_unlink(pc, i);
    pc->ent_of[pc->ent[i].block] = -1;
    kv_block_set_cached(pc->pool, pc->ent[i].block, false);
    kv_block_unref(pc->pool, pc->ent[i].block);
    pc->ent[i].live = false;
    pc->free_ent[pc->n_free_ent++] = i;
    pc->n--;
}

/* Marks the cached ones of blocks[0..n) used, blocks[0] most recently: eviction then takes a chain from its
 * end, so what stays cached is still a prefix that lookups reach. */
static void pc_touch_blocks(struct prefix_cache *pc, const int32_t *blocks, int n)
{
    for (int k = n - 1; k >= 0; k--) {
        int32_t i = pc->ent_of[blocks[k]];
        if (i < 0)
            continue;
        pc_lru_unlink(pc, i);
        pc_lru_push_front(pc, i);
    }
}

void prefix_cache_release(struct prefix_cache *pc, const struct kv_seq *seq)
{
    pc_touch_blocks(pc, seq->blocks, seq->n_blocks);
}

int prefix_cache_attach(struct prefix_cache *pc, const int32_t *tokens, int n_tokens, int max_pos,
                        struct kv_seq *dst, struct prefix_cursor *cur)
{
    cur->n_blocks = 0;
    cur->hash = PC_ROOT;
    int max_blocks = n_tokens / pc->bs;
    int32_t *blocks = max_blocks ? malloc((size_t)max_blocks * sizeof *blocks) : NULL;
    uint64_t *hashes = max_blocks ? malloc((size_t)max_blocks * sizeof *hashes) : NULL;
    if (max_blocks && (!blocks || !hashes)) {
        free(blocks);
        free(hashes);
        return ERR_NOMEM;
    }
    uint64_t h = PC_ROOT;
    int k = 0;
    for (; k < max_blocks; k++) {
        const int32_t *t = tokens + (size_t)k * (size_t)pc->bs;
        uint64_t nh = pc_hash(h, t, pc->bs);
        int32_t i = pc_find(pc, nh, h, t);
        if (i < 0)
            break;
        blocks[k] = pc->ent[i].block;
        hashes[k] = nh;
        h = nh;
    }
    if (k > 0)
        pc_touch_blocks(pc, blocks, k);
    int pos = k * pc->bs;
    if (pos > max_pos)
        pos = max_pos;
    if (pos < 0)
        pos = 0;
    int rc = 0;
    if (pos > 0) {
        struct kv_seq tmp = {.blocks = blocks, .n_blocks = k, .cap_blocks = k, .n_pos = k * pc->bs};
        rc = kv_seq_share(pc->pool, dst, &tmp, pos);
        if (!rc) {
            cur->n_blocks = pos / pc->bs;
            cur->hash = cur->n_blocks ? hashes[cur->n_blocks - 1] : PC_ROOT;
        }
    } else {
        kv_seq_truncate(pc->pool, dst, 0);
    }
    free(blocks);
    free(hashes);
    return rc ? rc : pos;
}

void prefix_cache_insert(struct prefix_cache *pc, const int32_t *tokens, int n_pos, const struct kv_seq *seq,
                         struct prefix_cursor *cur)
{
    if (cur->n_blocks == 0)
        cur->hash = PC_ROOT;
    if (n_pos > seq->n_pos)
        n_pos = seq->n_pos;
    int full = n_pos / pc->bs;
    while (cur->n_blocks < full) {
        int k = cur->n_blocks;
        const int32_t *t = tokens + (size_t)k * (size_t)pc->bs;
        uint64_t nh = pc_hash(cur->hash, t, pc->bs);
        int32_t found = pc_find(pc, nh, cur->hash, t);
        if (found >= 0) {
            pc_lru_unlink(pc, found);
            pc_lru_push_front(pc, found);
        } else if (!pc_hash_present(pc, nh) && pc->n_free_ent > 0) {
            /* (a colliding hash with other tokens is left alone: never two entries with one name) */
            int32_t i = pc->free_ent[--pc->n_free_ent];
            struct pc_entry *e = &pc->ent[i];
            e->hash = nh;
            e->parent = cur->hash;
            e->block = seq->blocks[k];
            e->live = true;
            pc->ent_of[e->block] = i;
            memcpy(&pc->tok[(size_t)i * (size_t)pc->bs], t, (size_t)pc->bs * sizeof *t);
            kv_block_ref(pc->pool, e->block);
            kv_block_set_cached(pc->pool, e->block, true);
            uint64_t s = nh & pc->mask;
            while (pc->table[s] >= 0)
                s = (s + 1) & pc->mask;
            pc->table[s] = i;
            pc_lru_push_front(pc, i);
            pc->n++;
        }
        cur->hash = nh;
        cur->n_blocks++;
    }
}

/* Drops evictable entries from the LRU tail until n blocks are freed or, with extent set, the pool has more
 * wholly free extents than at the start; returns the blocks freed. */
static int64_t pc_evict(struct prefix_cache *pc, int64_t n, bool extent)
{
    int64_t freed = 0, ext0 = kv_pool_free_extents(pc->pool);
    int32_t i = pc->tail;
    while (i >= 0 && freed < n && !(extent && kv_pool_free_extents(pc->pool) > ext0)) {
        int32_t prev = pc->ent[i].prev;
        if (kv_block_refcount(pc->pool, pc->ent[i].block) == 1) {
            pc_drop(pc, i);
            freed++;
        }
        i = prev;
    }
    return freed;
}

int64_t prefix_cache_evict(struct prefix_cache *pc, int64_t n) { return pc_evict(pc, n, false); }

/* The pool's reclaim callback (kvcache.h): a new run is starting and no extent is wholly free. Two extents'
 * worth of blocks at most, so that a pool whose extents all hold blocks in use does not empty the cache. */
static int64_t pc_reclaim(void *ctx) { return pc_evict(ctx, 2 * KV_EXTENT_BLOCKS, true); }

int64_t prefix_cache_blocks(const struct prefix_cache *pc) { return pc->n; }

/* The pool counts them as references come and go (kv_block_set_cached): the scheduler asks every step, and a
 * walk of the entries took 20 us at 8,192 of them, 82 us at 32,768. */
int64_t prefix_cache_evictable(const struct prefix_cache *pc) { return kv_pool_cached_idle(pc->pool); }

void prefix_cache_clear(struct prefix_cache *pc)
{
    while (pc->tail >= 0)
        pc_drop(pc, pc->tail);
}
