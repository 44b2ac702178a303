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
#include "engine/speculate.h"
#include "engine/tokenizer/tokenizer.h"

#include <math.h>
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

/* ---------------------------------------------------------------- the policy (speculate.c) */

static void test_draft_lookups(void **state)
{
    (void)state;
    int32_t out[16];
    /* n-gram: the longest suffix found earlier wins, at its latest occurrence */
    const int32_t h[] = {1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3};
    int n = spec_draft_ngram(h, 13, 2, 4, out, 16);
    assert_int_equal(n, 10); /* "1 2 3" occurred at 0..3: what followed it, up to the end of the history */
    assert_int_equal(out[0], 4);
    assert_int_equal(out[9], 3);
    n = spec_draft_ngram(h, 13, 2, 2, out, 16); /* "2 3": latest earlier occurrence at 6..8 -> 7 8 1 2 3 */
    assert_int_equal(n, 5);
    assert_int_equal(out[0], 7);
    assert_int_equal(spec_draft_ngram(h, 13, 2, 4, out, 2), 2);
    const int32_t none[] = {1, 2, 3, 4, 5};
    assert_int_equal(spec_draft_ngram(none, 5, 2, 4, out, 16), 0);
    assert_int_equal(spec_draft_ngram(none, 1, 2, 4, out, 16), 0);
    /* prediction: start, follow, realign after an edit */
    const int32_t pred[] = {10, 11, 12, 13, 14, 15, 16, 17};
    int cur = 0;
    const int32_t g1[] = {10};
    n = spec_draft_prediction(pred, 8, g1, 1, &cur, out, 3);
    assert_int_equal(n, 3);
    assert_int_equal(cur, 1);
    assert_int_equal(out[0], 11);
    cur += 2; /* two drafted tokens accepted (11 12), then the bonus token 13 */
    const int32_t g2[] = {10, 11, 12, 13};
    n = spec_draft_prediction(pred, 8, g2, 4, &cur, out, 16);
    assert_int_equal(cur, 4);
    assert_int_equal(n, 4);
    assert_int_equal(out[0], 14);
    /* the model wrote 99 instead of 14, then went on with 15: realigned after 15 */
    const int32_t g3[] = {10, 11, 12, 13, 99};
    assert_int_equal(spec_draft_prediction(pred, 8, g3, 5, &cur, out, 16), 0);
    const int32_t g4[] = {10, 11, 12, 13, 99, 15};
    n = spec_draft_prediction(pred, 8, g4, 6, &cur, out, 16);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 16);
    assert_int_equal(cur, 6);
    /* text the prediction does not have: a far single-token match does not realign, three tokens do */
    const int32_t pred2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 50, 51, 52, 53};
    cur = 3;
    const int32_t g6[] = {1, 2, 3, 60, 61, 62, 63, 64, 65, 12};
    assert_int_equal(spec_draft_prediction(pred2, 16, g6, 10, &cur, out, 16), 0);
    assert_int_equal(cur, 4); /* stepped over the token 12 replaced */
    const int32_t g7[] = {1, 2, 3, 60, 61, 62, 63, 64, 65, 12, 50, 51};
    n = spec_draft_prediction(pred2, 16, g7, 12, &cur, out, 16);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 52);
    assert_int_equal(cur, 14);
    /* a chunk replaced by as many tokens: the cursor steps along, and the drafts resume right after it */
    const int32_t pred3[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int32_t g8[] = {1, 2, 90, 91, 92, 6};
    cur = 2; /* after 1 2 */
    for (int i = 3; i <= 5; i++)
        assert_int_equal(spec_draft_prediction(pred3, 8, g8, i, &cur, out, 16), 0);
    assert_int_equal(cur, 5);
    n = spec_draft_prediction(pred3, 8, g8, 6, &cur, out, 16);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 7);
    /* the end of the prediction: nothing left to draft */
    const int32_t g5[] = {16, 17};
    assert_int_equal(spec_draft_prediction(pred, 8, g5, 2, &cur, out, 16), 0);
}

static void test_plan(void **state)
{
    (void)state;
    double cost[80];
    struct spec_cand c[4];
    /* verifying is nearly free (memory-bound): a likely draft is verified whole */
    for (int t = 1; t < 80; t++)
        cost[t] = 100 + t;
    c[0] = (struct spec_cand){.alpha = 0.9f, .cap = 8};
    spec_plan(cost, 1, c, 1, 64, 1);
    assert_int_equal(c[0].k, 8);
    /* an unlikely one is not */
    c[0] = (struct spec_cand){.alpha = 0.01f, .cap = 8};
    spec_plan(cost, 1, c, 1, 64, 1);
    assert_int_equal(c[0].k, 0);
    /* every token costs as much as the first (compute-bound): never */
    for (int t = 1; t < 80; t++)
        cost[t] = 100.0 * t;
    c[0] = (struct spec_cand){.alpha = 0.9f, .cap = 8};
    spec_plan(cost, 1, c, 1, 64, 1);
    assert_int_equal(c[0].k, 0);
    /* flat up to 8 tokens, then compute-bound: a single stream speculates, a batch of 8 decodes does not */
    for (int t = 1; t < 80; t++)
        cost[t] = t <= 8 ? 100 : 100.0 * t / 8;
    c[0] = (struct spec_cand){.alpha = 0.8f, .cap = 16};
    spec_plan(cost, 1, c, 1, 64, 1);
    assert_int_equal(c[0].k, 7);
    for (int i = 0; i < 4; i++)
        c[i] = (struct spec_cand){.alpha = 0.8f, .cap = 16};
    spec_plan(cost, 8, c, 4, 64, 1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(c[i].k, 0);
    /* two sequences share the cheap room, the likelier one first; draft_min drops a short draft */
    c[0] = (struct spec_cand){.alpha = 0.95f, .cap = 16};
    c[1] = (struct spec_cand){.alpha = 0.5f, .cap = 16};
    spec_plan(cost, 2, c, 2, 64, 1);
    assert_true(c[0].k >= c[1].k && c[0].k + c[1].k == 6);
    spec_plan(cost, 2, c, 2, 64, 3);
    assert_true(c[1].k == 0 || c[1].k >= 3);
    /* a probe: a short draft at an optimistic rate when cheap, none when not */
    c[0] = (struct spec_cand){.alpha = 0.05f, .cap = 16, .probe = true};
    spec_plan(cost, 1, c, 1, 64, 2);
    assert_int_equal(c[0].k, 2);
    c[0] = (struct spec_cand){.alpha = 0.05f, .cap = 16, .probe = true};
    spec_plan(cost, 8, c, 1, 64, 2);
    assert_int_equal(c[0].k, 0);
}

static void test_cost_curve(void **state)
{
    (void)state;
    struct spec_cost sc;
    assert_int_equal(spec_cost_init(&sc, 64), 0);
    double out[41];
    assert_false(spec_cost_curve(&sc, 40, out));
    spec_cost_record(&sc, 1, 100);
    assert_true(spec_cost_curve(&sc, 40, out));
    assert_true(out[1] == 100 && out[2] == 200 && out[4] == 400 && isinf(out[5])); /* one size: proportional */
    spec_cost_record(&sc, 9, 180);
    spec_cost_record(&sc, 3, 50); /* noise below a smaller size's cost: made non-decreasing */
    assert_true(spec_cost_curve(&sc, 40, out));
    assert_true(out[1] == 100 && out[3] == 100 && out[9] == 180);
    assert_true(out[5] == 100 && out[7] > 100 && out[7] < 180); /* linear between 3 and 9, never below 1's */
    assert_true(out[12] > 180 && !isinf(out[20]) && isinf(out[21])); /* past 9: along the slope, up to 20 */
    spec_cost_record(&sc, 1, 120); /* an average, not the last measure */
    assert_true(spec_cost_curve(&sc, 40, out));
    assert_true(out[1] > 100 && out[1] < 120);
    double before = sc.ns[1];
    spec_cost_record(&sc, 1, 1000); /* an interrupted pass barely counts */
    assert_true(sc.ns[1] > before && sc.ns[1] < before * 1.5);
    before = sc.ns[1];
    spec_cost_record(&sc, 1, 50); /* a faster one counts more */
    assert_true(sc.ns[1] < (before + 50) / 2 + 1);
    spec_cost_record(&sc, 30, 1e9); /* a first measure: at most proportional to the largest smaller size */
    assert_true(sc.ns[30] <= sc.ns[9] * 30 / 9 + 1e-6);
    spec_cost_deinit(&sc);
}

/* ---------------------------------------------------------------- scheduler: the same output */

#define MODEL "models/stories260K/stories260K.gguf"
#define MAXT 256

static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;

static void on_notify(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&wake_mu);
    pthread_cond_broadcast(&wake_cv);
    pthread_mutex_unlock(&wake_mu);
}

struct test_obs {
    _Atomic int64_t count[SCHED_CTR_COUNT_];
};

static void test_obs_count(void *ctx, enum sched_counter c, int64_t v)
{
    struct test_obs *o = ctx;
    atomic_fetch_add(&o->count[c], v);
}

struct fixture {
    struct engine *e;
    struct engine *de; /* the draft model's, or NULL */
    struct scheduler *s;
    struct test_obs obs;
};

/* A scheduler of max_batch slots on m; draft_max 0 turns speculation off (the reference); dm: a draft
 * model, on its own engine (NULL: none). */
static void fixture_up(struct fixture *f, const struct model *m, int max_batch, int draft_max, bool adaptive,
                       enum sched_spec spec, int64_t kv_blocks, const struct model *dm)
{
    char err[ERR_MSG_MAX];
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = 1;
    ep.max_seqs = max_batch;
    ep.max_batch_tokens = 32 + max_batch;
    ep.block_size = 8;
    ep.kv_blocks = kv_blocks;
    f->e = engine_create(m, &ep, err);
    assert_non_null(f->e);
    f->de = NULL;
    if (dm) {
        ep.kv_blocks = 0;
        f->de = engine_create(dm, &ep, err);
        assert_non_null(f->de);
    }
    memset(&f->obs, 0, sizeof f->obs);
    struct sched_observer obs = {.ctx = &f->obs, .count = test_obs_count};
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = max_batch;
    sp.prefill_chunk = 32;
    sp.draft_max = draft_max;
    sp.draft_adaptive = adaptive;
    sp.spec = spec;
    sp.draft_engine = f->de;
    f->s = scheduler_create(f->e, m->tok, &sp, &obs, on_notify, NULL, err);
    if (!f->s)
        fail_msg("%s", err);
    assert_int_equal(scheduler_start(f->s), 0);
}

/* Stops the scheduler and checks every KV block went back to the pool. */
static void fixture_down(struct fixture *f)
{
    struct sched_stats st;
    scheduler_stats(f->s, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    scheduler_destroy(f->s); /* drops the prefix cache's blocks too */
    struct kv_pool *pool = engine_kv(f->e);
    assert_int_equal(kv_pool_free_blocks(pool), kv_pool_params(pool)->n_blocks);
    engine_destroy(f->e);
    if (f->de) { /* the draft model's KV rolled back and freed with its sequences too */
        pool = engine_kv(f->de);
        assert_int_equal(kv_pool_free_blocks(pool), kv_pool_params(pool)->n_blocks);
        engine_destroy(f->de);
    }
}

struct out {
    int32_t ids[MAXT];
    float lp[MAXT];
    struct sampler_logprob top[MAXT * 3];
    int n;
    char text[4096];
    size_t text_len;
    enum sched_finish finish;
};

struct req_out {
    struct out ch[2];
    struct sched_req_status st;
};

static bool copy_choices(void *ctx, int c, const struct sched_choice *ch)
{
    struct req_out *o = ctx;
    if (c > 1)
        return true;
    struct out *d = &o->ch[c];
    d->n = ch->n_toks < MAXT ? ch->n_toks : MAXT;
    for (int i = 0; i < d->n; i++) {
        d->ids[i] = ch->toks[i].id;
        d->lp[i] = ch->toks[i].logprob;
        if (ch->toks[i].top_off >= 0)
            memcpy(&d->top[i * 3], &ch->top[ch->toks[i].top_off], 3 * sizeof *d->top);
    }
    d->text_len = ch->text_len < sizeof d->text ? ch->text_len : sizeof d->text;
    memcpy(d->text, ch->text, d->text_len);
    d->finish = ch->finish;
    return true;
}

struct job {
    const char *prompt;
    int max_tokens;
    int n_choices;
    const int32_t *pred; /* NULL: none */
    int n_pred;
    const char *stop;
    bool sample;   /* seeded sampling with penalties and logprobs, else greedy */
    int spec;      /* the request's n-gram choice (-1: the scheduler's) */
    uint64_t temp_seed; /* plain sampling at temperature 0.6 with this seed (OpenAI's defaults otherwise) */
};

static struct sched_req *job_submit(const struct model *m, struct scheduler *s, const struct job *j)
{
    int32_t toks[128];
    int nt = tokenizer_encode(m->tok, j->prompt, strlen(j->prompt), true, false, toks, 128);
    assert_true(nt > 0 && nt <= 128);
    struct sched_req *r = sched_req_create(toks, nt, j->n_choices ? j->n_choices : 1);
    assert_non_null(r);
    r->max_tokens = j->max_tokens;
    r->sp.temperature = 0;
    r->spec = j->spec;
    if (j->temp_seed) {
        r->sp.temperature = 0.6f;
        r->sp.seed = j->temp_seed;
    }
    if (j->sample) {
        r->sp.temperature = 0.9f;
        r->sp.top_k = 40;
        r->sp.top_p = 0.95f;
        r->sp.repeat_penalty = 1.1f;
        r->sp.frequency_penalty = 0.2f;
        r->sp.seed = 1234;
        r->n_logprobs = 3;
    }
    if (j->stop) {
        char *stops[1] = {(char *)j->stop};
        assert_int_equal(sched_req_set_stop(r, stops, 1), 0);
    }
    if (j->pred)
        assert_int_equal(sched_req_set_prediction(r, j->pred, j->n_pred), 0);
    r->t_arrival = clock_now_ns();
    assert_int_equal(scheduler_submit(s, r), 0);
    return r;
}

static void job_collect(struct sched_req *r, struct req_out *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < 30000; i++) {
        sched_req_status_get(r, &o->st);
        if (o->st.finished)
            break;
        usleep(1000);
    }
    assert_true(o->st.finished);
    assert_int_equal(o->st.error, 0);
    sched_req_read(r, copy_choices, o);
    sched_req_unref(r);
}

/* Runs jobs[0..n) all at once on s and collects them. */
static void run_jobs(const struct model *m, struct scheduler *s, const struct job *jobs, int n, struct req_out *outs)
{
    struct sched_req *rs[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++)
        rs[i] = job_submit(m, s, &jobs[i]);
    for (int i = 0; i < n; i++)
        job_collect(rs[i], &outs[i]);
}

static void assert_same_output(const struct req_out *want, const struct req_out *got, int n_choices, int job)
{
    for (int c = 0; c < n_choices; c++) {
        const struct out *a = &want->ch[c], *b = &got->ch[c];
        if (a->n != b->n || memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids))
            fail_msg("job %d choice %d: %d tokens with speculation, %d without, or different ones", job, c, b->n, a->n);
        if (memcmp(a->lp, b->lp, (size_t)a->n * sizeof *a->lp) || memcmp(a->top, b->top, sizeof a->top))
            fail_msg("job %d choice %d: logprobs differ with speculation", job, c);
        if (a->text_len != b->text_len || memcmp(a->text, b->text, a->text_len) || a->finish != b->finish)
            fail_msg("job %d choice %d: text or finish reason differ with speculation", job, c);
    }
}

static const char *prompts[] = {"Once upon a time", "Lily went to the park and", "Tom had a red ball",
                                "One day, a big dog"};

/* Predictions derived from a reference output: exact, one token in seven changed and three dropped,
 * right for 12 tokens then garbage, all wrong, and exact then an end-of-text token and garbage. */
enum { P_EXACT, P_PARTLY, P_THEN_WRONG, P_WRONG, P_PAST_END, P_COUNT };

static int make_prediction(const struct model *m, const struct out *ref, int kind, int32_t *out)
{
    int nv = m->hp.n_vocab, n = 0;
    for (int i = 0; i < ref->n; i++) {
        int32_t t = ref->ids[i];
        switch (kind) {
        case P_PARTLY:
            if (i >= 20 && i < 23)
                continue;
            if (i % 7 == 3)
                t = (t + 1) % nv;
            break;
        case P_THEN_WRONG:
            if (i >= 12)
                t = (int32_t)((i * 37 + 11) % nv);
            break;
        case P_WRONG: t = (int32_t)((i * 37 + 11) % nv); break;
        default: break;
        }
        out[n++] = t;
    }
    if (kind == P_PAST_END) {
        out[n++] = tokenizer_eos(m->tok);
        for (int i = 0; i < 10; i++)
            out[n++] = (int32_t)(5 + i);
    }
    return n;
}

/* Greedy and seeded requests with every kind of prediction, and n-gram drafts, all at once in one batch,
 * against the same requests without speculation. */
static void spec_equal_check(bool adaptive, bool sample)
{
    const char *path = TEST_SHARED_OR_SKIP(MODEL);
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    int np = (int)(sizeof prompts / sizeof prompts[0]);
    struct job base[8];
    for (int i = 0; i < np; i++)
        base[i] = (struct job){.prompt = prompts[i], .max_tokens = 80, .sample = sample, .spec = -1,
                               .n_choices = i == 1 ? 2 : 1};
    static struct req_out ref[8], got[64];
    struct fixture f;
    fixture_up(&f, m, 8, 0, true, SCHED_SPEC_OFF, 0, NULL);
    run_jobs(m, f.s, base, np, ref);
    assert_int_equal(atomic_load(&f.obs.count[SCHED_CTR_SPEC_DRAFTS]), 0);
    fixture_down(&f);

    static int32_t preds[8][P_COUNT][MAXT + 16];
    struct job jobs[64];
    int nj = 0;
    for (int i = 0; i < np; i++)
        for (int k = 0; k < P_COUNT; k++) {
            jobs[nj] = base[i];
            jobs[nj].pred = preds[i][k];
            jobs[nj].n_pred = make_prediction(m, &ref[i].ch[0], k, preds[i][k]);
            nj++;
        }
    for (int i = 0; i < np; i++) { /* n-gram drafts, no prediction */
        jobs[nj] = base[i];
        jobs[nj++].spec = SCHED_SPEC_NGRAM;
    }
    for (int i = 0; i < np; i++) { /* the draft model's drafts: the same model on its own engine */
        jobs[nj] = base[i];
        jobs[nj++].spec = SCHED_SPEC_DRAFT;
    }
    fixture_up(&f, m, 8, 6, adaptive, SCHED_SPEC_OFF, 0, m);
    run_jobs(m, f.s, jobs, nj, got);
    int64_t drafted = 0, accepted = 0;
    for (int j = 0; j < nj; j++) {
        int i = j < np * P_COUNT ? j / P_COUNT : (j - np * P_COUNT) % np;
        bool by_model = j >= np * P_COUNT + np;
        assert_same_output(&ref[i], &got[j], jobs[j].n_choices, j);
        const struct sched_req_status *st = &got[j].st;
        drafted += st->draft_tokens;
        accepted += st->accepted_tokens;
        assert_true(st->accepted_tokens <= st->draft_tokens);
        assert_true(st->prediction_accepted_tokens <= st->prediction_draft_tokens);
        assert_true(st->prediction_draft_tokens <= st->draft_tokens);
        if (jobs[j].pred)
            assert_int_equal(st->prediction_draft_tokens, st->draft_tokens); /* no n-gram for these */
        else
            assert_int_equal(st->prediction_draft_tokens, 0);
        if (!adaptive && jobs[j].pred && j % P_COUNT == P_EXACT && jobs[j].n_choices == 1) {
            /* an exact prediction: every verified draft accepted whole */
            assert_true(st->draft_tokens > 0);
            assert_int_equal(st->accepted_tokens, st->draft_tokens);
            assert_true(st->accepted_tokens >= ref[i].ch[0].n / 2);
        }
        if (!adaptive && jobs[j].pred && j % P_COUNT == P_THEN_WRONG && !sample)
            assert_true(st->accepted_tokens < st->draft_tokens); /* drafts rejected (and rolled back) */
        if (!adaptive && by_model) {
            /* the target drafting for itself: greedy, every drafted token is the target's own */
            assert_true(st->draft_tokens >= ref[i].ch[0].n / 2);
            if (!sample)
                assert_int_equal(st->accepted_tokens, st->draft_tokens);
        }
    }
    /* what the observer was told adds up to what the requests report */
    assert_int_equal(atomic_load(&f.obs.count[SCHED_CTR_SPEC_DRAFT_TOKENS]), drafted);
    assert_int_equal(atomic_load(&f.obs.count[SCHED_CTR_SPEC_ACCEPTED_TOKENS]), accepted);
    int64_t per_pos = 0;
    for (int i = 0; i < SCHED_SPEC_POS_MAX; i++)
        per_pos += atomic_load(&f.obs.count[SCHED_CTR_SPEC_ACCEPTED_POS + i]);
    assert_int_equal(per_pos, accepted); /* draft_max 6 < SCHED_SPEC_POS_MAX: every position counted */
    if (!adaptive) {
        assert_true(drafted > 0 && accepted > 0);
        assert_true(atomic_load(&f.obs.count[SCHED_CTR_SPEC_ACCEPTED_POS + 5]) > 0);
        assert_true(atomic_load(&f.obs.count[SCHED_CTR_SPEC_DRAFTS]) > 0);
    }
    print_message("%s, %s: %lld drafted tokens, %lld accepted\n", adaptive ? "adaptive" : "fixed drafts",
                  sample ? "seeded sampling" : "greedy", (long long)drafted, (long long)accepted);
    fixture_down(&f);
    model_destroy(m);
}

static void test_greedy_equal_fixed(void **state)
{
    (void)state;
    spec_equal_check(false, false);
}

static void test_greedy_equal_adaptive(void **state)
{
    (void)state;
    spec_equal_check(true, false);
}

static void test_seeded_equal(void **state)
{
    (void)state;
    spec_equal_check(false, true);
}

/* Stop strings and max_tokens reached inside an accepted draft, the prefix cache hit by the same prompt
 * again, and n-gram drafts as the scheduler's default. */
static void test_stop_max_tokens_prefix(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP(MODEL);
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    static struct req_out ref[32], got[32];
    struct job full = {.prompt = prompts[0], .max_tokens = 60, .spec = -1};
    struct fixture f;
    fixture_up(&f, m, 4, 0, true, SCHED_SPEC_OFF, 0, NULL);
    run_jobs(m, f.s, &full, 1, ref);
    /* a stop string from the middle of the text, and max_tokens 1..12 */
    static char stop[16];
    const struct out *o = &ref[0].ch[0];
    assert_true(o->text_len > 40);
    memcpy(stop, o->text + 30, 5);
    struct job jobs[32];
    int nj = 0;
    jobs[nj] = full;
    jobs[nj++].stop = stop;
    for (int mt = 1; mt <= 12; mt++) {
        jobs[nj] = full;
        jobs[nj++].max_tokens = mt;
    }
    run_jobs(m, f.s, jobs, nj, ref + 1);
    assert_int_equal(ref[1].ch[0].finish, SCHED_STOP);
    fixture_down(&f);

    /* with the exact prediction, run twice (the second finds the prompt in the prefix cache), and n-gram
     * drafts as the default */
    fixture_up(&f, m, 4, 8, false, SCHED_SPEC_NGRAM, 0, m);
    for (int rep = 0; rep < 2; rep++) {
        for (int j = 0; j < nj; j++) {
            jobs[j].pred = o->ids;
            jobs[j].n_pred = o->n;
        }
        run_jobs(m, f.s, jobs, nj, got);
        for (int j = 0; j < nj; j++)
            assert_same_output(&ref[1 + j], &got[j], 1, j);
        for (int j = 1; j < nj; j++)
            assert_true(got[j].st.n_generated == jobs[j].max_tokens);
        /* without a prediction: n-gram drafts, then the draft model's */
        for (int j = 0; j < nj; j++)
            jobs[j].pred = NULL;
        run_jobs(m, f.s, jobs, nj, got);
        for (int j = 0; j < nj; j++)
            assert_same_output(&ref[1 + j], &got[j], 1, j);
        for (int j = 0; j < nj; j++)
            jobs[j].spec = SCHED_SPEC_DRAFT;
        run_jobs(m, f.s, jobs, nj, got);
        for (int j = 0; j < nj; j++) {
            assert_same_output(&ref[1 + j], &got[j], 1, j);
            if (j > 0) /* (job 0's stop string ends it inside a draft) */
                assert_int_equal(got[j].st.accepted_tokens, got[j].st.draft_tokens);
        }
        for (int j = 0; j < nj; j++)
            jobs[j].spec = -1;
    }
    assert_true(atomic_load(&f.obs.count[SCHED_CTR_SPEC_ACCEPTED_TOKENS]) > 0);
    fixture_down(&f);
    model_destroy(m);
}

/* A KV pool too small for everyone's drafts: drafts give way (no preemption is caused by them), outputs
 * unchanged, no block lost. */
static void test_small_kv(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP(MODEL);
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    static struct req_out ref[4], got[4];
    struct job jobs[4];
    for (int i = 0; i < 4; i++)
        jobs[i] = (struct job){.prompt = prompts[i], .max_tokens = 50, .spec = SCHED_SPEC_NGRAM};
    struct fixture f;
    fixture_up(&f, m, 4, 0, true, SCHED_SPEC_OFF, 0, NULL);
    run_jobs(m, f.s, jobs, 4, ref);
    fixture_down(&f);
    static int32_t preds[4][MAXT];
    for (int i = 0; i < 4; i++) {
        memcpy(preds[i], ref[i].ch[0].ids, (size_t)ref[i].ch[0].n * sizeof **preds);
        jobs[i].pred = preds[i];
        jobs[i].n_pred = ref[i].ch[0].n;
    }
    fixture_up(&f, m, 4, 16, false, SCHED_SPEC_OFF, 30, NULL); /* 30 blocks of 8: about 60 positions each */
    run_jobs(m, f.s, jobs, 4, got);
    for (int i = 0; i < 4; i++)
        assert_same_output(&ref[i], &got[i], 1, i);
    fixture_down(&f);
    model_destroy(m);
}

/* A draft model whose vocabulary is not the target's is refused at creation, both vocabularies named. */
static void test_draft_vocab_refused(void **state)
{
    (void)state;
    const char *tp = TEST_SHARED_OR_SKIP("models/llama-19M/llama-19M-Q4_0.gguf");
    const char *dp = TEST_SHARED_OR_SKIP(MODEL);
    char err[ERR_MSG_MAX];
    struct model *t = model_load(tp, err), *d = model_load(dp, err);
    assert_non_null(t);
    assert_non_null(d);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = 1;
    ep.n_ctx = 64;
    struct engine *te = engine_create(t, &ep, err), *de = engine_create(d, &ep, err);
    assert_non_null(te);
    assert_non_null(de);
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = 1;
    sp.prefill_chunk = 16;
    sp.draft_engine = de;
    err[0] = 0;
    assert_null(scheduler_create(te, t->tok, &sp, NULL, on_notify, NULL, err));
    print_message("refused: %s\n", err);
    assert_non_null(strstr(err, "vocabulary"));
    assert_non_null(strstr(err, "512 tokens"));
    assert_non_null(strstr(err, "32000 tokens"));
    /* the same model drafting for itself is accepted */
    sp.draft_engine = te;
    struct scheduler *s = scheduler_create(te, t->tok, &sp, NULL, on_notify, NULL, err);
    assert_non_null(s);
    scheduler_destroy(s);
    engine_destroy(te);
    engine_destroy(de);
    model_destroy(t);
    model_destroy(d);
}

/* Chi-square critical value for df degrees of freedom at p = 0.001 (Wilson-Hilferty). */
static double chi2_crit(int df)
{
    double a = 2.0 / (9.0 * df), z = 3.09;
    return df * pow(1 - a + z * sqrt(a), 3);
}

/* Two-sample chi-square homogeneity statistic of the token counts a and b (each n in all) over n_vocab
 * bins; bins where both are rare are pooled into one. Returns the statistic, *df its degrees of freedom. */
static double chi2_two_sample(const int *a, const int *b, int n_vocab, int *df)
{
    double x = 0;
    int bins = 0, ra = 0, rb = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < (pass ? 1 : n_vocab); i++) {
            int ca = pass ? ra : a[i], cb = pass ? rb : b[i];
            if (!pass && ca + cb < 30) { /* pooled */
                ra += ca, rb += cb;
                continue;
            }
            if (ca + cb == 0)
                continue;
            double e = (ca + cb) / 2.0; /* equal sample sizes */
            x += (ca - e) * (ca - e) / e + (cb - e) * (cb - e) / e;
            bins++;
        }
    *df = bins - 1;
    return x;
}

/* With sampling, speculation keeps the model's distribution: the first three tokens of many seeded requests
 * drawn with drafts (the draft model's, a prediction's) are distributed as without speculation. The seeds
 * differ between the runs (so this tests the distribution, not the seeded identity tested above): a rule
 * that accepted drafts too readily would pull the tokens towards the drafts (the greedy ones) and fail. */
static void test_sampling_distribution(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP(MODEL);
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    int nv = m->hp.n_vocab;
    enum { N = 768, POS = 4, BATCH = 64 };
    static struct req_out out[BATCH];
    int *counts = calloc((size_t)3 * POS * nv, sizeof *counts); /* [run][pos][token] */
    assert_non_null(counts);
    struct job greedy = {.prompt = "Lily went to the park and", .max_tokens = 8, .spec = -1};
    struct fixture f;
    fixture_up(&f, m, 8, 0, true, SCHED_SPEC_OFF, 0, NULL);
    run_jobs(m, f.s, &greedy, 1, out);
    fixture_down(&f);
    static int32_t pred[MAXT];
    int n_pred = out[0].ch[0].n;
    memcpy(pred, out[0].ch[0].ids, (size_t)n_pred * sizeof *pred);
    int64_t drafted = 0, accepted = 0;
    int greedy_len[3][POS + 1] = {{0}}; /* requests whose first i tokens, no more, are the greedy answer's */
    for (int run = 0; run < 3; run++) { /* plain, the draft model's drafts, the greedy answer as prediction */
        /* two slots: few steps with another request's prompt in them (those do not speculate) */
        fixture_up(&f, m, 2, run ? 4 : 0, false, SCHED_SPEC_OFF, 0, run == 1 ? m : NULL);
        for (int at = 0; at < N; at += BATCH) {
            struct job jobs[BATCH];
            for (int i = 0; i < BATCH; i++)
                jobs[i] = (struct job){.prompt = greedy.prompt, .max_tokens = POS, .spec = run == 1 ? SCHED_SPEC_DRAFT : -1,
                                       .pred = run == 2 ? pred : NULL, .n_pred = run == 2 ? n_pred : 0,
                                       .temp_seed = (uint64_t)(run * N + at + i + 1)};
            run_jobs(m, f.s, jobs, BATCH, out);
            for (int i = 0; i < BATCH; i++) {
                assert_int_equal(out[i].ch[0].n, POS);
                int g = 0;
                while (g < POS && g < n_pred && out[i].ch[0].ids[g] == pred[g])
                    g++;
                greedy_len[run][g]++;
                for (int p = 0; p < POS; p++)
                    counts[((size_t)run * POS + p) * nv + out[i].ch[0].ids[p]]++;
                drafted += out[i].st.draft_tokens;
                accepted += out[i].st.accepted_tokens;
            }
        }
        fixture_down(&f);
    }
    print_message("%lld drafted, %lld accepted\n", (long long)drafted, (long long)accepted);
    assert_true(drafted > N && accepted > N / 2); /* drafts were verified, many accepted */
    for (int run = 1; run < 3; run++) {
        /* the most telling statistic: a rule biased towards drafts makes greedy-looking answers likelier */
        int df;
        double x = chi2_two_sample(greedy_len[0], greedy_len[run], POS + 1, &df);
        print_message("%s, tokens equal to the greedy answer's (0..%d): plain %d %d %d %d %d, speculation %d %d %d %d "
                      "%d: chi2 %.1f, df %d, critical %.1f\n", run == 1 ? "draft model" : "prediction", POS,
                      greedy_len[0][0], greedy_len[0][1], greedy_len[0][2], greedy_len[0][3], greedy_len[0][4],
                      greedy_len[run][0], greedy_len[run][1], greedy_len[run][2], greedy_len[run][3],
                      greedy_len[run][4], x, df, chi2_crit(df));
        assert_true(x < chi2_crit(df));
    }
    for (int run = 1; run < 3; run++)
        for (int p = 0; p < POS; p++) {
            int df;
            double x = chi2_two_sample(counts + (size_t)p * nv, counts + ((size_t)run * POS + p) * nv, nv, &df);
            print_message("%s, token %d: chi2 %.1f, df %d, critical (p = 0.001) %.1f\n",
                          run == 1 ? "draft model" : "prediction", p + 1, x, df, chi2_crit(df));
            assert_true(df >= 3);
            assert_true(x < chi2_crit(df));
        }
    free(counts);
    model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_rows_equal_decode), cmocka_unit_test(test_draft_lookups),
        cmocka_unit_test(test_plan),                     cmocka_unit_test(test_cost_curve),
        cmocka_unit_test(test_greedy_equal_fixed),       cmocka_unit_test(test_greedy_equal_adaptive),
        cmocka_unit_test(test_seeded_equal),             cmocka_unit_test(test_stop_max_tokens_prefix),
        cmocka_unit_test(test_small_kv),                 cmocka_unit_test(test_draft_vocab_refused),
        cmocka_unit_test(test_sampling_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
