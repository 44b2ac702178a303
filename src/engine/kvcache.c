/*
 * kvcache: the bookkeeping of a pool of KV blocks (reference counts, free blocks, free extents) plus
 * per-sequence block tables. The data lives in the backend's storage; a copy on write goes through the pool's
 * callback.
 *
 * Allocation keeps a sequence's blocks consecutive where it can, because attention reads a sequence's cached
 * rows block after block and the host storage places one head's consecutive blocks side by side
 * (kv_host.h): a run of consecutive blocks is one stream the hardware prefetcher follows, a jump restarts
 * it. With one free stack, sequences that decode together take its blocks in turns (the next one goes to
 * whichever sequence fills its last block first), so of 8 such sequences each gets every 8th block and no two
 * of its blocks touch; decode attention at a depth of 4,064 then took 8.0-8.3 ms a token against 4.6 for consecutive
 * blocks (1B Q4_0, AMD EPYC Zen 4, 2 threads; runs of 2, 4, 8 and 16 blocks: 7.8-8.1, 7.4-7.6, 5.9-6.0,
 * 4.9-5.0 ms; prefetching further ahead in software did not help, docs/performance.md stop 29). So the pool
 * is cut into extents of KV_EXTENT_BLOCKS blocks, and kv_block_alloc(after) takes, in this order:
 *   1. block after + 1, when free: the sequence continues its run;
 *   2. the first block of an extent that is wholly free: a new run with room to grow, which other
 *      sequences leave alone while wholly free extents last (they take from other wholly free extents);
 *   3. any free block (the pool is nearly full or fragmented: runs get shorter, nothing fails).
 * Before taking 3 when the pool is nearly full (fewer than an eighth of its blocks free), the pool asks its
 * reclaim callback (the prefix cache's, when there is one) to give back blocks so that an extent becomes
 * wholly free: a server's pool fills with cached blocks, and without this every new run would take the one
 * free block eviction had just made. The free blocks it leaves behind are mostly the unused ends of finished
 * sequences' last extents, which only rule 3 takes; below an eighth of the pool they are left alone, so a
 * pool that is merely fragmented (a small one, or one the cache holds a few blocks of in every extent) keeps
 * its cached blocks. Measured by a simulation of a server's traffic (8 sequences, prompts of 64-2,048 tokens,
 * answers of 64-1,536, every prompt new, pools of 1,200 to 4,096 blocks): sequences' runs 15.0-15.2 blocks
 * against 1.0 without reclaiming, the cache holding 90-93% of the pool against 99.6%; with an earlier form
 * of the cache's eviction, reclaiming below a sixteenth left runs of 2-13 blocks against 14-15.5 below an
 * eighth (docs/performance.md, stop 30).
 * Each is O(1): the free blocks and the wholly free extents are stacks with each member's index, so a member
 * is taken from the middle by swapping it with the top.
 *
 * A cache marks the blocks it holds a reference to (kv_block_set_cached), and the pool counts, as references
 * come and go, the marked blocks nobody else holds: what the cache could give back, which the scheduler asks
 * every step (a walk over the cache's entries took 82 us at 32,768 of them).
 */
#include "engine/kvcache.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/quant.h"

#include <stdlib.h>
#include <string.h>

/* The reclaim callback runs only while fewer than n_blocks / KV_RECLAIM_SHARE blocks are free (see the top). */
#define KV_RECLAIM_SHARE 8

struct kv_pool {
    struct kv_pool_params p;
    kv_block_copy_fn copy; /* the storage's block copy, or NULL */
    void *copy_ctx;
    kv_reclaim_fn reclaim; /* frees blocks held elsewhere (the prefix cache), or NULL */
    void *reclaim_ctx;
    int32_t *refcount;   /* [n_blocks] */
    uint8_t *cached;     /* [n_blocks]: 1 while a cache holds one of the references (kv_block_set_cached) */
    int64_t n_cached_idle; /* cached blocks whose only reference is the cache's: kept as refcounts change */
    int32_t *free_stack; /* [n_blocks]: the free blocks, [0, n_free) */
    int32_t *free_at;    /* [n_blocks]: a free block's index in free_stack */
    int64_t n_free;
    int32_t *ext_used;  /* [n_ext]: blocks in use in each extent (0: wholly free) */
    int32_t *ext_stack; /* [n_ext]: the wholly free extents, [0, n_ext_free) */
    int32_t *ext_at;    /* [n_ext]: a wholly free extent's index in ext_stack */
    int64_t n_ext, n_ext_free;
};

size_t kv_pool_row_bytes(const struct kv_pool_params *p) { return dtype_row_bytes(p->type, p->head_dim); }

size_t kv_pool_block_bytes(const struct kv_pool_params *p)
{
    return 2 * (size_t)p->n_layers * (size_t)p->n_kv_heads * (size_t)p->block_size * kv_pool_row_bytes(p);
}

struct kv_pool *kv_pool_create(const struct kv_pool_params *p, kv_block_copy_fn copy, void *copy_ctx, char *err)
{
    if (p->type != DTYPE_F16 && p->type != DTYPE_F32 && p->type != DTYPE_Q8_0) {
        err_set(err, ERR_UNSUPPORTED, "KV cache type %s is not supported (use f16, f32 or q8_0)", dtype_name(p->type));
        return NULL;
    }
    if (p->type == DTYPE_Q8_0 && p->head_dim % QK8_0 != 0) {
        err_set(err, ERR_UNSUPPORTED, "a q8_0 KV cache needs a head dimension divisible by %d (this model's is %d); "
                "use f16", QK8_0, p->head_dim);
        return NULL;
    }
    if (p->n_blocks <= 0 || p->block_size <= 0 || p->n_layers <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0) {
        err_set(err, ERR_INVALID_ARG, "KV cache needs at least one block (got %lld blocks of %d positions)",
                (long long)p->n_blocks, p->block_size);
        return NULL;
    }
    struct kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        goto oom;
    pool->p = *p;
    pool->copy = copy;
    pool->copy_ctx = copy_ctx;
    pool->n_ext = (p->n_blocks + KV_EXTENT_BLOCKS - 1) / KV_EXTENT_BLOCKS;
    pool->refcount = calloc((size_t)p->n_blocks, sizeof *pool->refcount);
    pool->cached = calloc((size_t)p->n_blocks, sizeof *pool->cached);
    pool->free_stack = malloc((size_t)p->n_blocks * sizeof *pool->free_stack);
    pool->free_at = malloc((size_t)p->n_blocks * sizeof *pool->free_at);
    pool->ext_used = calloc((size_t)pool->n_ext, sizeof *pool->ext_used);
    pool->ext_stack = malloc((size_t)pool->n_ext * sizeof *pool->ext_stack);
    pool->ext_at = malloc((size_t)pool->n_ext * sizeof *pool->ext_at);
    if (!pool->refcount || !pool->cached || !pool->free_stack || !pool->free_at || !pool->ext_used ||
        !pool->ext_stack || !pool->ext_at) {
        kv_pool_destroy(pool);
        goto oom;
    }
    /* lowest ids on top so allocation order is predictable in tests */
    for (int64_t i = 0; i < p->n_blocks; i++) {
        pool->free_stack[i] = (int32_t)(p->n_blocks - 1 - i);
        pool->free_at[p->n_blocks - 1 - i] = (int32_t)i;
    }
    pool->n_free = p->n_blocks;
    /* every extent wholly free, lowest on top (a short last one is wholly free while none of its blocks is used) */
    for (int64_t e = 0; e < pool->n_ext; e++) {
        pool->ext_stack[e] = (int32_t)(pool->n_ext - 1 - e);
        pool->ext_at[pool->n_ext - 1 - e] = (int32_t)e;
    }
    pool->n_ext_free = pool->n_ext;
    return pool;
oom:
    err_set(err, ERR_NOMEM, "out of memory creating the KV cache");
    return NULL;
}

void kv_pool_destroy(struct kv_pool *pool)
{
    if (!pool)
        return;
    free(pool->refcount);
    free(pool->cached);
    free(pool->free_stack);
    free(pool->free_at);
    free(pool->ext_used);
    free(pool->ext_stack);
    free(pool->ext_at);
    free(pool);
}

const struct kv_pool_params *kv_pool_params(const struct kv_pool *pool) { return &pool->p; }

int64_t kv_pool_free_blocks(const struct kv_pool *pool) { return pool->n_free; }

/* Removes member i (at index at[i]) from the stack of n members: the top moves into its place. */
static void kv_stack_remove(int32_t *stack, int32_t *at, int64_t *n, int32_t i)
{
    int32_t top = stack[--*n];
    stack[at[i]] = top;
    at[top] = at[i];
}

static void kv_stack_push(int32_t *stack, int32_t *at, int64_t *n, int32_t i)
{
    at[i] = (int32_t)*n;
    stack[(*n)++] = i;
}

/* Takes free block b: refcount 1, out of the free stack, its extent no longer wholly free. */
static int32_t kv_block_take(struct kv_pool *pool, int32_t b)
{
    ASSERT(pool->refcount[b] == 0);
    int32_t e = b / KV_EXTENT_BLOCKS;
    kv_stack_remove(pool->free_stack, pool->free_at, &pool->n_free, b);
    if (pool->ext_used[e]++ == 0)
        kv_stack_remove(pool->ext_stack, pool->ext_at, &pool->n_ext_free, e);
    pool->refcount[b] = 1;
    return b;
}

int32_t kv_block_alloc(struct kv_pool *pool, int32_t after)
{
    if (after >= 0 && after + 1 < pool->p.n_blocks && pool->refcount[after + 1] == 0)
        return kv_block_take(pool, after + 1);
    if (pool->n_ext_free == 0 && pool->reclaim && pool->n_free < pool->p.n_blocks / KV_RECLAIM_SHARE)
        pool->reclaim(pool->reclaim_ctx);
    if (pool->n_ext_free > 0)
        return kv_block_take(pool, pool->ext_stack[pool->n_ext_free - 1] * KV_EXTENT_BLOCKS);
    if (pool->n_free == 0)
        return ERR_NO_SPACE;
    return kv_block_take(pool, pool->free_stack[pool->n_free - 1]);
}

void kv_pool_set_reclaim(struct kv_pool *pool, kv_reclaim_fn fn, void *ctx)
{
    pool->reclaim = fn;
    pool->reclaim_ctx = ctx;
}

int64_t kv_pool_free_extents(const struct kv_pool *pool) { return pool->n_ext_free; }

void kv_block_ref(struct kv_pool *pool, int32_t b)
{
    ASSERT(b >= 0 && b < pool->p.n_blocks && pool->refcount[b] > 0);
    if (pool->cached[b] && pool->refcount[b] == 1)
        pool->n_cached_idle--; /* a sequence shares the cached block again */
    pool->refcount[b]++;
}

void kv_block_unref(struct kv_pool *pool, int32_t b)
{
    ASSERT(b >= 0 && b < pool->p.n_blocks && pool->refcount[b] > 0);
    ASSERT(!pool->cached[b] || pool->refcount[b] > 1); /* the cache unmarks before its own reference goes */
    if (--pool->refcount[b] > 0) {
        if (pool->cached[b] && pool->refcount[b] == 1)
            pool->n_cached_idle++; /* only the cache's reference is left */
        return;
    }
    int32_t e = b / KV_EXTENT_BLOCKS;
    kv_stack_push(pool->free_stack, pool->free_at, &pool->n_free, b);
    if (--pool->ext_used[e] == 0)
        kv_stack_push(pool->ext_stack, pool->ext_at, &pool->n_ext_free, e);
}

int kv_block_refcount(const struct kv_pool *pool, int32_t b) { return pool->refcount[b]; }

void kv_block_set_cached(struct kv_pool *pool, int32_t b, bool cached)
{
    ASSERT(b >= 0 && b < pool->p.n_blocks && pool->refcount[b] > 0);
    if (pool->cached[b] == cached)
        return;
    pool->cached[b] = cached;
    if (pool->refcount[b] == 1)
        pool->n_cached_idle += cached ? 1 : -1;
}

int64_t kv_pool_cached_idle(const struct kv_pool *pool) { return pool->n_cached_idle; }

void kv_seq_init(struct kv_seq *s) { memset(s, 0, sizeof *s); }

int kv_seq_init_cap(struct kv_seq *s, int cap_blocks)
{
    kv_seq_init(s);
    if (cap_blocks <= 0)
        return 0;
    if (!(s->blocks = malloc((size_t)cap_blocks * sizeof *s->blocks)))
        return ERR_NOMEM;
    s->cap_blocks = cap_blocks;
    return 0;
}

void kv_seq_deinit(struct kv_pool *pool, struct kv_seq *s)
{
    kv_seq_truncate(pool, s, 0);
    free(s->blocks);
    kv_seq_init(s);
}

static int kv_seq_blocks_for(const struct kv_pool *pool, int n_pos)
{
    return (n_pos + pool->p.block_size - 1) / pool->p.block_size;
}

/* true when the last block holds positions and will receive more, but is shared. */
static bool kv_seq_needs_cow(const struct kv_pool *pool, const struct kv_seq *s, int n_pos)
{
    if (n_pos <= s->n_pos || s->n_pos % pool->p.block_size == 0 || s->n_blocks == 0)
        return false;
    return pool->refcount[s->blocks[(s->n_pos - 1) / pool->p.block_size]] > 1;
}

int kv_seq_blocks_needed(const struct kv_pool *pool, const struct kv_seq *s, int n_pos)
{
    int need = kv_seq_blocks_for(pool, n_pos) - s->n_blocks;
    if (need < 0)
        need = 0;
    return need + (kv_seq_needs_cow(pool, s, n_pos) ? 1 : 0);
}

int kv_seq_reserve(struct kv_pool *pool, struct kv_seq *s, int n_pos)
{
    int want_blocks = kv_seq_blocks_for(pool, n_pos);
    if (kv_seq_blocks_needed(pool, s, n_pos) > pool->n_free)
        return ERR_NO_SPACE;
    if (want_blocks > s->cap_blocks) {
        int cap = s->cap_blocks ? s->cap_blocks : 4;
        while (cap < want_blocks)
            cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb)
            return ERR_NOMEM;
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    if (kv_seq_needs_cow(pool, s, n_pos)) {
        int idx = (s->n_pos - 1) / pool->p.block_size;
        int32_t nb = kv_block_alloc(pool, idx > 0 ? s->blocks[idx - 1] : -1);
        if (pool->copy)
            pool->copy(pool->copy_ctx, nb, s->blocks[idx]);
        kv_block_unref(pool, s->blocks[idx]);
        s->blocks[idx] = nb;
    }
    while (s->n_blocks < want_blocks) {
        s->blocks[s->n_blocks] = kv_block_alloc(pool, s->n_blocks > 0 ? s->blocks[s->n_blocks - 1] : -1);
        s->n_blocks++;
    }
    return 0;
}

void kv_seq_truncate(struct kv_pool *pool, struct kv_seq *s, int n_pos)
{
    if (n_pos < 0)
        n_pos = 0;
    if (n_pos > s->n_pos)
        n_pos = s->n_pos;
    int keep = kv_seq_blocks_for(pool, n_pos);
    while (s->n_blocks > keep)
        kv_block_unref(pool, s->blocks[--s->n_blocks]);
    s->n_pos = n_pos;
}

int kv_seq_share(struct kv_pool *pool, struct kv_seq *dst, const struct kv_seq *src, int n_pos)
{
    if (n_pos > src->n_pos)
        n_pos = src->n_pos;
    kv_seq_truncate(pool, dst, 0);
    int nb = kv_seq_blocks_for(pool, n_pos);
    if (nb > dst->cap_blocks) {
        int32_t *b = realloc(dst->blocks, (size_t)nb * sizeof *b);
        if (!b)
            return ERR_NOMEM;
        dst->blocks = b;
        dst->cap_blocks = nb;
    }
    for (int i = 0; i < nb; i++) {
        kv_block_ref(pool, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = nb;
    dst->n_pos = n_pos;
    return 0;
}
