/*
 * kvcache: the bookkeeping of a pool of KV blocks (reference counts and a free stack) plus per-sequence
 * block tables. The data lives in the backend's storage; a copy on write goes through the pool's callback.
 */
#include "engine/kvcache.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/quant.h"

#include <stdlib.h>
#include <string.h>

struct kv_pool {
    struct kv_pool_params p;
    kv_block_copy_fn copy; /* the storage's block copy, or NULL */
    void *copy_ctx;
    int32_t *refcount;   /* [n_blocks] */
    int32_t *free_stack; /* [n_blocks] */
    int64_t n_free;
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
    pool->refcount = calloc((size_t)p->n_blocks, sizeof *pool->refcount);
    pool->free_stack = malloc((size_t)p->n_blocks * sizeof *pool->free_stack);
    if (!pool->refcount || !pool->free_stack) {
        kv_pool_destroy(pool);
        goto oom;
    }
    /* lowest ids on top so allocation order is predictable in tests */
    for (int64_t i = 0; i < p->n_blocks; i++)
        pool->free_stack[i] = (int32_t)(p->n_blocks - 1 - i);
    pool->n_free = p->n_blocks;
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
    free(pool->free_stack);
    free(pool);
}

const struct kv_pool_params *kv_pool_params(const struct kv_pool *pool) { return &pool->p; }

int64_t kv_pool_free_blocks(const struct kv_pool *pool) { return pool->n_free; }

int32_t kv_block_alloc(struct kv_pool *pool)
{
    if (pool->n_free == 0)
        return ERR_NO_SPACE;
    int32_t b = pool->free_stack[--pool->n_free];
    ASSERT(pool->refcount[b] == 0);
    pool->refcount[b] = 1;
    return b;
}

void kv_block_ref(struct kv_pool *pool, int32_t b)
{
    ASSERT(b >= 0 && b < pool->p.n_blocks && pool->refcount[b] > 0);
    pool->refcount[b]++;
}

void kv_block_unref(struct kv_pool *pool, int32_t b)
{
    ASSERT(b >= 0 && b < pool->p.n_blocks && pool->refcount[b] > 0);
    if (--pool->refcount[b] == 0)
        pool->free_stack[pool->n_free++] = b;
}

int kv_block_refcount(const struct kv_pool *pool, int32_t b) { return pool->refcount[b]; }

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
        int32_t nb = kv_block_alloc(pool);
        if (pool->copy)
            pool->copy(pool->copy_ctx, nb, s->blocks[idx]);
        kv_block_unref(pool, s->blocks[idx]);
        s->blocks[idx] = nb;
    }
    while (s->n_blocks < want_blocks)
        s->blocks[s->n_blocks++] = kv_block_alloc(pool);
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
