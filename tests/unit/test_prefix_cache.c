/* Tests for the prefix cache over a real KV pool: chain naming, attach with and without a cut last block
 * (copy on write), LRU eviction of blocks only the cache holds, chains evicted from their end, that a full
 * cache still leaves sequences runs of consecutive blocks, that the evictable count (kept by the pool) matches a
 * brute-force count, and that every reference is returned. */
#include "testutil.h"

#include "core/err.h"
#include "engine/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#define BS 4
#define NB 16

static struct kv_pool *make_pool(void)
{
    struct kv_pool_params p = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = BS, .n_blocks = NB,
                               .type = DTYPE_F32};
    char err[ERR_MSG_MAX];
    struct kv_pool *pool = kv_pool_create(&p, NULL, NULL, err);
    assert_non_null(pool);
    return pool;
}

/* Stands in for a forward pass: reserve, then mark the positions written. */
static void fill(struct kv_pool *pool, struct kv_seq *s, int n_pos)
{
    assert_int_equal(kv_seq_reserve(pool, s, n_pos), 0);
    s->n_pos = n_pos;
}

static void test_attach_and_share(void **state)
{
    (void)state;
    struct kv_pool *pool = make_pool();
    struct prefix_cache *pc = prefix_cache_create(pool);
    assert_non_null(pc);
    int32_t a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    struct kv_seq sa, sb, sc;
    kv_seq_init(&sa);
    kv_seq_init(&sb);
    kv_seq_init(&sc);
    struct prefix_cursor ca = {0}, cb = {0}, cc = {0};

    fill(pool, &sa, 10); /* 3 blocks, 2 full */
    prefix_cache_insert(pc, a, 10, &sa, &ca);
    assert_int_equal(ca.n_blocks, 2);
    assert_int_equal(prefix_cache_blocks(pc), 2);
    assert_int_equal(kv_block_refcount(pool, sa.blocks[0]), 2);
    assert_int_equal(kv_block_refcount(pool, sa.blocks[2]), 1); /* partial block not cached */
    assert_int_equal(prefix_cache_evictable(pc), 0);
    /* inserting again adds nothing */
    struct prefix_cursor again = {0};
    prefix_cache_insert(pc, a, 10, &sa, &again);
    assert_int_equal(prefix_cache_blocks(pc), 2);

    /* same first 8 tokens, different tail: 8 positions shared */
    int32_t b[12] = {1, 2, 3, 4, 5, 6, 7, 8, 99, 98, 97, 96};
    assert_int_equal(prefix_cache_attach(pc, b, 12, 11, &sb, &cb), 8);
    assert_int_equal(sb.n_pos, 8);
    assert_int_equal(sb.blocks[0], sa.blocks[0]);
    assert_int_equal(sb.blocks[1], sa.blocks[1]);
    assert_int_equal(cb.n_blocks, 2);
    assert_int_equal(kv_block_refcount(pool, sa.blocks[1]), 3);
    fill(pool, &sb, 12);
    prefix_cache_insert(pc, b, 12, &sb, &cb);
    assert_int_equal(prefix_cache_blocks(pc), 3);

    /* whole prompt cached (8 tokens): at most 7 attached so the last token is computed for its logits;
     * the cut block is copied on the first write */
    int32_t c[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(prefix_cache_attach(pc, c, 8, 7, &sc, &cc), 7);
    assert_int_equal(cc.n_blocks, 1);
    assert_int_equal(sc.blocks[1], sa.blocks[1]);
    assert_int_equal(kv_seq_blocks_needed(pool, &sc, 8), 1);
    fill(pool, &sc, 8);
    assert_int_not_equal(sc.blocks[1], sa.blocks[1]);
    assert_int_equal(sc.blocks[0], sa.blocks[0]);

    /* chain: same second block after a different first block does not match */
    int32_t d[8] = {0, 2, 3, 4, 5, 6, 7, 8};
    struct kv_seq sd;
    kv_seq_init(&sd);
    struct prefix_cursor cd;
    assert_int_equal(prefix_cache_attach(pc, d, 8, 8, &sd, &cd), 0);
    assert_int_equal(sd.n_pos, 0);

    kv_seq_deinit(pool, &sa);
    kv_seq_deinit(pool, &sb);
    kv_seq_deinit(pool, &sc);
    kv_seq_deinit(pool, &sd);
    assert_int_equal(prefix_cache_evictable(pc), 3);
    assert_int_equal(kv_pool_free_blocks(pool), NB - 3);
    prefix_cache_destroy(pc);
    assert_int_equal(kv_pool_free_blocks(pool), NB);
    kv_pool_destroy(pool);
}

static void test_lru_eviction(void **state)
{
    (void)state;
    struct kv_pool *pool = make_pool();
    struct prefix_cache *pc = prefix_cache_create(pool);
    int32_t p1[4] = {1, 1, 1, 1}, p2[4] = {2, 2, 2, 2}, p3[4] = {3, 3, 3, 3};
    int32_t *ps[3] = {p1, p2, p3};
    for (int i = 0; i < 3; i++) {
        struct kv_seq s;
        kv_seq_init(&s);
        struct prefix_cursor cur = {0};
        fill(pool, &s, 4);
        prefix_cache_insert(pc, ps[i], 4, &s, &cur);
        kv_seq_deinit(pool, &s);
    }
    assert_int_equal(prefix_cache_blocks(pc), 3);
    assert_int_equal(prefix_cache_evictable(pc), 3);
    /* touch p1 so p2 becomes the least recently used; hold p3 so it cannot be evicted */
    struct kv_seq t1, t3;
    kv_seq_init(&t1);
    kv_seq_init(&t3);
    struct prefix_cursor c;
    assert_int_equal(prefix_cache_attach(pc, p1, 4, 4, &t1, &c), 4);
    kv_seq_deinit(pool, &t1);
    assert_int_equal(prefix_cache_attach(pc, p3, 4, 4, &t3, &c), 4);
    assert_int_equal(prefix_cache_evictable(pc), 2);
    assert_int_equal(prefix_cache_evict(pc, 1), 1);
    struct kv_seq probe;
    kv_seq_init(&probe);
    assert_int_equal(prefix_cache_attach(pc, p2, 4, 4, &probe, &c), 0); /* p2 went first */
    assert_int_equal(prefix_cache_attach(pc, p1, 4, 4, &probe, &c), 4);
    kv_seq_deinit(pool, &probe);
    /* asking for more than is evictable frees only what nobody else holds */
    assert_int_equal(prefix_cache_evict(pc, 10), 1);
    assert_int_equal(prefix_cache_blocks(pc), 1);
    kv_seq_deinit(pool, &t3);
    prefix_cache_clear(pc);
    assert_int_equal(prefix_cache_blocks(pc), 0);
    assert_int_equal(kv_pool_free_blocks(pool), NB);
    prefix_cache_destroy(pc);
    kv_pool_destroy(pool);
}

/* What prefix_cache_evictable counts, by brute force: blocks with one reference that no sequence of seqs
 * holds (so the reference is the cache's). */
static int64_t idle_cached(struct kv_pool *pool, int64_t nb, const struct kv_seq *seqs, int n_seqs)
{
    bool *held = calloc((size_t)nb, sizeof *held);
    assert_non_null(held);
    for (int i = 0; i < n_seqs; i++)
        for (int k = 0; k < seqs[i].n_blocks; k++)
            held[seqs[i].blocks[k]] = true;
    int64_t n = 0;
    for (int64_t b = 0; b < nb; b++)
        n += kv_block_refcount(pool, (int32_t)b) == 1 && !held[b];
    free(held);
    return n;
}

/* Many entries with deletions in between keep the probe chains intact (backward-shift deletion). */
static void test_table_churn(void **state)
{
    (void)state;
    struct kv_pool *pool = make_pool();
    struct prefix_cache *pc = prefix_cache_create(pool);
    uint64_t rng = 7;
    for (int round = 0; round < 200; round++) {
        int32_t t[BS];
        for (int i = 0; i < BS; i++)
            t[i] = (int32_t)(test_rand_u64(&rng) % 5);
        struct kv_seq s;
        kv_seq_init(&s);
        struct prefix_cursor cur;
        int got = prefix_cache_attach(pc, t, BS, BS, &s, &cur);
        assert_true(got == 0 || got == BS);
        if (!got) {
            if (kv_pool_free_blocks(pool) == 0)
                assert_int_equal(prefix_cache_evict(pc, 1), 1);
            fill(pool, &s, BS);
            prefix_cache_insert(pc, t, BS, &s, &cur);
        }
        kv_seq_deinit(pool, &s);
        /* after insertion the same tokens must be found */
        struct kv_seq s2;
        kv_seq_init(&s2);
        assert_int_equal(prefix_cache_attach(pc, t, BS, BS, &s2, &cur), BS);
        assert_int_equal(prefix_cache_evictable(pc), idle_cached(pool, NB, &s2, 1)); /* s2 shares a block */
        kv_seq_deinit(pool, &s2);
        assert_int_equal(prefix_cache_evictable(pc), prefix_cache_blocks(pc));
        assert_int_equal(prefix_cache_blocks(pc) + kv_pool_free_blocks(pool), NB);
    }
    prefix_cache_destroy(pc);
    assert_int_equal(kv_pool_free_blocks(pool), NB);
    kv_pool_destroy(pool);
}

/* A server's traffic once the cache has filled the pool: 4 sequences decode together, one block each in turn,
 * with prompts nobody repeats, the scheduler's eviction of what a step needs before each reserve and its
 * release of each finished sequence. The sequences still get runs of consecutive blocks (mean 15.1 here;
 * 1.0 without the pool's reclaim callback), and the cache keeps most of the pool (942 of 1,024 blocks). */
static void test_full_cache_keeps_runs(void **state)
{
    (void)state;
    const int64_t nb = 64 * KV_EXTENT_BLOCKS;
    struct kv_pool_params p = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_size = BS, .n_blocks = nb,
                               .type = DTYPE_F32};
    char err[ERR_MSG_MAX];
    struct kv_pool *pool = kv_pool_create(&p, NULL, NULL, err);
    assert_non_null(pool);
    struct prefix_cache *pc = prefix_cache_create(pool);
    assert_non_null(pc);
    enum { SEQS = 4, MINB = 64, MAXB = 160 };
    struct kv_seq s[SEQS];
    struct prefix_cursor cur[SEQS];
    int32_t tok[SEQS][MAXB * BS];
    int len[SEQS];
    uint64_t rng = 11;
    int32_t next_tok = 1;
    int done = 0;
    double blocks = 0, runs = 0;
    for (int i = 0; i < SEQS; i++) {
        kv_seq_init(&s[i]);
        memset(&cur[i], 0, sizeof cur[i]);
        len[i] = MINB + (int)(test_rand_u64(&rng) % (MAXB - MINB + 1));
        for (int k = 0; k < MAXB * BS; k++)
            tok[i][k] = next_tok++;
    }
    while (done < 60) {
        for (int i = 0; i < SEQS; i++) {
            int64_t free_b = kv_pool_free_blocks(pool);
            if (free_b < 1)
                assert_int_equal(prefix_cache_evict(pc, 1 - free_b), 1);
            fill(pool, &s[i], s[i].n_pos + BS);
            prefix_cache_insert(pc, tok[i], s[i].n_pos, &s[i], &cur[i]);
            assert_int_equal(prefix_cache_evictable(pc), idle_cached(pool, nb, s, SEQS));
            if (s[i].n_blocks < len[i])
                continue;
            if (done++ >= 20) { /* the cache filled the pool long before */
                int j = 0;
                for (int k = 1; k < s[i].n_blocks; k++)
                    j += s[i].blocks[k] != s[i].blocks[k - 1] + 1;
                blocks += s[i].n_blocks;
                runs += j + 1;
            }
            prefix_cache_release(pc, &s[i]);
            kv_seq_truncate(pool, &s[i], 0);
            assert_int_equal(prefix_cache_evictable(pc), idle_cached(pool, nb, s, SEQS));
            memset(&cur[i], 0, sizeof cur[i]);
            len[i] = MINB + (int)(test_rand_u64(&rng) % (MAXB - MINB + 1));
            for (int k = 0; k < MAXB * BS; k++)
                tok[i][k] = next_tok++;
        }
    }
    print_message("mean run %.1f blocks, cache %lld of %lld blocks\n", blocks / runs,
                  (long long)prefix_cache_blocks(pc), (long long)nb);
    assert_true(blocks / runs >= 8);
    assert_true(prefix_cache_blocks(pc) >= nb * 3 / 4);
    for (int i = 0; i < SEQS; i++)
        kv_seq_deinit(pool, &s[i]);
    prefix_cache_destroy(pc);
    assert_int_equal(kv_pool_free_blocks(pool), nb);
    kv_pool_destroy(pool);
}

/* A released sequence's chain, and a prefix looked up, are marked used last block first, so eviction takes a
 * chain from its end and what stays cached is still a prefix lookups reach (evicting the first block would
 * leave the rest cached but unreachable). */
static void test_eviction_shortens_chains_from_the_end(void **state)
{
    (void)state;
    struct kv_pool *pool = make_pool();
    struct prefix_cache *pc = prefix_cache_create(pool);
    int32_t a[16];
    for (int i = 0; i < 16; i++)
        a[i] = 1 + i;
    struct kv_seq s, t;
    struct prefix_cursor c = {0};
    kv_seq_init(&s);
    fill(pool, &s, 16); /* 4 blocks */
    prefix_cache_insert(pc, a, 16, &s, &c);
    prefix_cache_release(pc, &s);
    kv_seq_deinit(pool, &s);
    assert_int_equal(prefix_cache_evict(pc, 1), 1); /* the release left the last block least recently used */
    kv_seq_init(&t);
    assert_int_equal(prefix_cache_attach(pc, a, 16, 16, &t, &c), 12);
    kv_seq_deinit(pool, &t);
    assert_int_equal(prefix_cache_evict(pc, 1), 1); /* so did the lookup */
    assert_int_equal(prefix_cache_attach(pc, a, 16, 16, &t, &c), 8);
    kv_seq_deinit(pool, &t);
    prefix_cache_destroy(pc);
    assert_int_equal(kv_pool_free_blocks(pool), NB);
    kv_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attach_and_share),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_table_churn),
        cmocka_unit_test(test_eviction_shortens_chains_from_the_end),
        cmocka_unit_test(test_full_cache_keeps_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
