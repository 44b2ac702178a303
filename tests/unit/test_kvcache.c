/* Tests for the KV pool's block allocation (kvcache.c): sequences that grow in turns each keep consecutive
 * blocks while wholly free extents last, a full pool still hands out every block, and the free-block and
 * free-extent bookkeeping survives random reserve / share / truncate traffic (checked against the refcounts
 * after every step), and the reclaim callback is asked for an extent only when the pool is nearly full. */
#include "testutil.h"

#include "core/err.h"
#include "engine/kvcache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BS 4

static struct kv_pool *make_pool(int64_t n_blocks)
{
    struct kv_pool_params p = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = BS,
                               .n_blocks = n_blocks, .type = DTYPE_F32};
    char err[ERR_MSG_MAX];
    struct kv_pool *pool = kv_pool_create(&p, NULL, NULL, err);
    assert_non_null(pool);
    return pool;
}

/* Grows s by one block (as decode does every BS tokens) and marks its positions written. */
static int grow_block(struct kv_pool *pool, struct kv_seq *s)
{
    int rc = kv_seq_reserve(pool, s, s->n_pos + BS);
    if (rc == 0)
        s->n_pos += BS;
    return rc;
}

/* Places where s's next block does not follow the previous one in the pool. */
static int jumps(const struct kv_seq *s)
{
    int j = 0;
    for (int i = 1; i < s->n_blocks; i++)
        j += s->blocks[i] != s->blocks[i - 1] + 1;
    return j;
}

/* 4 sequences decoding together, one block each in turn, in a pool of 8 extents: each keeps to its own
 * extents, so its blocks jump only where an extent ends. (One free stack gave each every 4th block.) */
static void test_interleaved_growth_stays_consecutive(void **state)
{
    (void)state;
    const int64_t nb = 8 * KV_EXTENT_BLOCKS;
    struct kv_pool *pool = make_pool(nb);
    struct kv_seq s[4];
    for (int i = 0; i < 4; i++)
        kv_seq_init(&s[i]);
    for (int step = 0; step < 2 * KV_EXTENT_BLOCKS; step++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(grow_block(pool, &s[i]), 0);
    assert_int_equal(kv_pool_free_blocks(pool), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s[i].n_blocks, 2 * KV_EXTENT_BLOCKS);
        assert_int_equal(s[i].blocks[0] % KV_EXTENT_BLOCKS, 0); /* each run starts an extent */
        assert_true(jumps(&s[i]) <= 1);
    }
    /* the first sequence took the pool's first extent, its first block block 0 as before extents */
    assert_int_equal(s[0].blocks[0], 0);
    for (int i = 0; i < 4; i++)
        kv_seq_deinit(pool, &s[i]);
    assert_int_equal(kv_pool_free_blocks(pool), nb);
    kv_pool_destroy(pool);
}

/* More sequences than extents: the pool still hands out every block (runs shorten, nothing fails), refuses
 * the next, and takes every block back. A pool whose size is not a multiple of the extent has a short last
 * extent. */
static void test_full_pool_and_short_extent(void **state)
{
    (void)state;
    const int64_t nb = 2 * KV_EXTENT_BLOCKS + 3;
    struct kv_pool *pool = make_pool(nb);
    struct kv_seq s[5];
    for (int i = 0; i < 5; i++)
        kv_seq_init(&s[i]);
    int64_t got = 0;
    char *seen = calloc((size_t)nb, 1);
    assert_non_null(seen);
    for (int step = 0; got < nb; step++)
        for (int i = 0; i < 5 && got < nb; i++, got++)
            assert_int_equal(grow_block(pool, &s[i]), 0);
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < s[i].n_blocks; b++) {
            assert_true(s[i].blocks[b] >= 0 && s[i].blocks[b] < nb);
            assert_int_equal(seen[s[i].blocks[b]]++, 0); /* no block handed out twice */
        }
    assert_int_equal(kv_pool_free_blocks(pool), 0);
    assert_int_equal(grow_block(pool, &s[0]), ERR_NO_SPACE);
    for (int i = 0; i < 5; i++)
        kv_seq_deinit(pool, &s[i]);
    assert_int_equal(kv_pool_free_blocks(pool), nb);
    /* all free again: one sequence taking the whole pool jumps at most once per extent */
    struct kv_seq one;
    kv_seq_init(&one);
    assert_int_equal(kv_seq_reserve(pool, &one, (int)nb * BS), 0);
    assert_true(jumps(&one) <= 2);
    kv_seq_deinit(pool, &one);
    free(seen);
    kv_pool_destroy(pool);
}

/* Random traffic: sequences grow, share a prefix of another (copy on write of a cut last block), truncate and
 * end, in a pool that fills up. After every step each block's refcount must equal the table entries naming
 * it, and the free count the blocks no table names; once all have ended, every extent is wholly free again. */
static void test_random_traffic_bookkeeping(void **state)
{
    (void)state;
    const int64_t nb = 5 * KV_EXTENT_BLOCKS + 7;
    enum { NS = 9 };
    struct kv_pool *pool = make_pool(nb);
    struct kv_seq s[NS];
    for (int i = 0; i < NS; i++)
        kv_seq_init(&s[i]);
    int *refs = malloc((size_t)nb * sizeof *refs);
    assert_non_null(refs);
    unsigned r = 7;
    for (int step = 0; step < 20000; step++) {
        r = r * 1103515245u + 12345u;
        int i = (int)((r >> 8) % NS), op = (int)((r >> 16) % 10);
        struct kv_seq *q = &s[i];
        if (op < 6) {
            int rc = kv_seq_reserve(pool, q, q->n_pos + 1 + (int)((r >> 20) % (3 * BS)));
            assert_true(rc == 0 || rc == ERR_NO_SPACE);
            if (rc == 0)
                q->n_pos = q->n_blocks * BS - (int)((r >> 24) % BS);
        } else if (op < 8) {
            kv_seq_truncate(pool, q, q->n_pos / 2);
        } else if (op < 9) {
            kv_seq_truncate(pool, q, 0);
        } else {
            struct kv_seq *src = &s[(i + 1) % NS];
            assert_int_equal(kv_seq_share(pool, q, src, src->n_pos - (src->n_pos > 1 ? 1 : 0)), 0);
        }
        memset(refs, 0, (size_t)nb * sizeof *refs);
        int64_t named = 0;
        for (int k = 0; k < NS; k++)
            for (int b = 0; b < s[k].n_blocks; b++)
                refs[s[k].blocks[b]]++;
        for (int64_t b = 0; b < nb; b++) {
            assert_int_equal(kv_block_refcount(pool, (int32_t)b), refs[b]);
            named += refs[b] > 0;
        }
        assert_int_equal(kv_pool_free_blocks(pool), nb - named);
    }
    for (int i = 0; i < NS; i++)
        kv_seq_deinit(pool, &s[i]);
    assert_int_equal(kv_pool_free_blocks(pool), nb);
    /* every extent wholly free again: 4 sequences growing in turns by an extent's worth each start at an
     * extent and jump at most once (where the pool's short last extent ends) */
    for (int step = 0; step < KV_EXTENT_BLOCKS; step++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(grow_block(pool, &s[i]), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s[i].blocks[0] % KV_EXTENT_BLOCKS, 0);
        assert_true(jumps(&s[i]) <= 1);
        kv_seq_deinit(pool, &s[i]);
    }
    free(refs);
    kv_pool_destroy(pool);
}

/* A stand-in for the prefix cache: holds one reference on blocks, gives back those of its first extent that
 * it still holds when the pool calls. */
struct holder {
    struct kv_pool *pool;
    bool held[8 * KV_EXTENT_BLOCKS];
    int calls;
};

static int64_t holder_reclaim(void *ctx)
{
    struct holder *h = ctx;
    h->calls++;
    for (int e = 0; e < 8; e++) {
        int64_t n = 0;
        for (int b = e * KV_EXTENT_BLOCKS; b < (e + 1) * KV_EXTENT_BLOCKS; b++)
            if (h->held[b]) {
                h->held[b] = false;
                kv_block_unref(h->pool, b);
                n++;
            }
        if (n)
            return n;
    }
    return 0;
}

/* The pool calls its reclaim callback when a new run must start, no extent is wholly free and fewer than an
 * eighth of its blocks are free, and starts the run at the extent that freed; with more free blocks, or a
 * run that can continue, it does not call. */
static void test_reclaim_when_nearly_full(void **state)
{
    (void)state;
    const int64_t nb = 8 * KV_EXTENT_BLOCKS;
    struct kv_pool *pool = make_pool(nb);
    struct holder h = {.pool = pool};
    kv_pool_set_reclaim(pool, holder_reclaim, &h);
    /* every block held, then every second one of the extents 1-7 given back: 56 free blocks (more than an
     * eighth), none of them starting a wholly free extent */
    for (int64_t b = 0; b < nb; b++) {
        assert_int_equal(kv_block_alloc(pool, (int32_t)b - 1), b);
        h.held[b] = true;
    }
    for (int64_t b = KV_EXTENT_BLOCKS; b < nb; b += 2) {
        h.held[b] = false;
        kv_block_unref(pool, (int32_t)b);
    }
    assert_int_equal(kv_pool_free_extents(pool), 0);
    int32_t b = kv_block_alloc(pool, -1);
    assert_true(b >= KV_EXTENT_BLOCKS && b % 2 == 0);
    assert_int_equal(h.calls, 0); /* fragmented, not nearly full: the held blocks stay */
    kv_block_unref(pool, b);
    /* leave fewer than an eighth free: the next new run makes the holder give back extent 0 and starts there */
    for (int64_t k = 0; kv_pool_free_blocks(pool) >= nb / 8; k++)
        assert_true(kv_block_alloc(pool, -1) >= 0);
    assert_int_equal(kv_block_alloc(pool, -1), 0);
    assert_int_equal(h.calls, 1);
    assert_int_equal(kv_pool_free_extents(pool), 0);
    /* a run that continues takes the next block without a call */
    assert_int_equal(kv_block_alloc(pool, 0), 1);
    assert_int_equal(h.calls, 1);
    kv_pool_set_reclaim(pool, NULL, NULL);
    kv_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interleaved_growth_stays_consecutive),
        cmocka_unit_test(test_full_pool_and_short_extent),
        cmocka_unit_test(test_random_traffic_bookkeeping),
        cmocka_unit_test(test_reclaim_when_nearly_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
