/* Tests for the scheduler on the real stories260K model: greedy output equals a plain engine loop, equal
 * alone and in a batch, n > 1 choices, stop strings, cancellation and deadlines (queued and running), queue
 * bound, prefix reuse, and preemption when the KV pool is too small for everyone (outputs unchanged). What
 * the scheduler measures is read through a test observer (the engine knows no server metrics). */
#include "testutil.h"

#include "core/clock.h"
#include "core/err.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "models/stories260K/stories260K.gguf"
/* 512 context; one thread decodes its 512 tokens in 0.26 s on a Zen 5 (1,900 tokens/s), 2.3x the Q8_0 file's time */
#define MODEL_SLOW "models/llama-19M/llama-19M-F16.gguf"

static pthread_mutex_t notify_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t notify_cv = PTHREAD_COND_INITIALIZER;
static int notify_count;

static void on_notify(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&notify_mu);
    notify_count++;
    pthread_cond_broadcast(&notify_cv);
    pthread_mutex_unlock(&notify_mu);
}

/* The request as a reader sees it (the test reads requests as the server does: through functions). */
static struct sched_req_status req_status(struct sched_req *r)
{
    struct sched_req_status st;
    sched_req_status_get(r, &st);
    return st;
}

static bool req_finished(struct sched_req *r) { return req_status(r).finished; }

/* A copy of one choice's output. */
struct choice_copy {
    int want; /* the choice to copy */
    int32_t ids[512];
    int n_toks;
    char text[2048];
    size_t text_len;
    enum sched_finish finish;
};

static bool copy_choice(void *ctx, int c, const struct sched_choice *ch)
{
    struct choice_copy *cc = ctx;
    if (c != cc->want)
        return true;
    cc->n_toks = ch->n_toks < 512 ? ch->n_toks : 512;
    for (int i = 0; i < cc->n_toks; i++)
        cc->ids[i] = ch->toks[i].id;
    cc->text_len = ch->text_len < sizeof cc->text ? ch->text_len : sizeof cc->text;
    if (cc->text_len)
        memcpy(cc->text, ch->text, cc->text_len);
    cc->finish = ch->finish;
    return false;
}

static void req_choice(struct sched_req *r, int c, struct choice_copy *out)
{
    memset(out, 0, sizeof *out);
    out->want = c;
    sched_req_read(r, copy_choice, out);
}

static void wait_finished(struct sched_req *r)
{
    for (int i = 0; i < 30000 && !req_finished(r); i++)
        usleep(1000);
    assert_true(req_finished(r));
}

/* Sums of what the scheduler reported through its observer. */
struct test_obs {
    _Atomic int64_t count[SCHED_CTR_COUNT_];
    _Atomic int64_t n_timed[SCHED_TIM_COUNT_];
    _Atomic int negative; /* durations below zero (must stay 0) */
};

static void test_obs_count(void *ctx, enum sched_counter c, int64_t v)
{
    struct test_obs *o = ctx;
    atomic_fetch_add(&o->count[c], v);
}

static void test_obs_observe(void *ctx, enum sched_timing t, double seconds)
{
    struct test_obs *o = ctx;
    atomic_fetch_add(&o->n_timed[t], 1);
    if (!(seconds >= 0))
        atomic_fetch_add(&o->negative, 1);
}

struct fixture {
    struct model *m;
    struct engine *e;
    struct scheduler *s;
    struct test_obs obs;
};

static int64_t obs_count(struct fixture *f, enum sched_counter c) { return atomic_load(&f->obs.count[c]); }
static int64_t obs_timed(struct fixture *f, enum sched_timing t) { return atomic_load(&f->obs.n_timed[t]); }

static void fixture_up_model(struct fixture *f, const char *model, int max_batch, int max_queue, int64_t kv_blocks,
                             int chunk)
{
    const char *path = TEST_SHARED_OR_SKIP(model);
    char err[ERR_MSG_MAX];
    f->m = model_load(path, err);
    assert_non_null(f->m);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = 1;
    ep.max_seqs = max_batch;
    ep.max_batch_tokens = chunk + max_batch;
    ep.kv_blocks = kv_blocks;
    f->e = engine_create(f->m, &ep, err);
    assert_non_null(f->e);
    memset(&f->obs, 0, sizeof f->obs);
    struct sched_observer obs = {.ctx = &f->obs, .count = test_obs_count, .observe = test_obs_observe};
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = max_batch;
    sp.max_queue = max_queue;
    sp.prefill_chunk = chunk;
    f->s = scheduler_create(f->e, f->m->tok, &sp, &obs, on_notify, NULL, err);
    if (!f->s)
        print_error("%s\n", err);
    assert_non_null(f->s);
    assert_int_equal(scheduler_start(f->s), 0);
}

static void fixture_up(struct fixture *f, int max_batch, int max_queue, int64_t kv_blocks, int chunk)
{
    fixture_up_model(f, MODEL, max_batch, max_queue, kv_blocks, chunk);
}

static void fixture_down(struct fixture *f)
{
    scheduler_destroy(f->s);
    engine_destroy(f->e);
    assert_int_equal(atomic_load(&f->obs.negative), 0);
    model_destroy(f->m);
}

static int tokenize(const struct model *m, const char *text, int32_t *out, int cap)
{
    int n = tokenizer_encode(m->tok, text, strlen(text), true, false, out, cap);
    assert_true(n > 0 && n <= cap);
    return n;
}

static struct sched_req *make_req(const struct model *m, const char *prompt, int max_tokens, int n)
{
    int32_t toks[128];
    int nt = tokenize(m, prompt, toks, 128);
    struct sched_req *r = sched_req_create(toks, nt, n);
    assert_non_null(r);
    r->max_tokens = max_tokens;
    r->sp.temperature = 0;
    r->t_arrival = clock_now_ns();
    return r;
}

/* Generated token ids of choice c (copy). */
static int req_tokens(struct sched_req *r, int c, int32_t *out, int cap)
{
    struct choice_copy cc;
    req_choice(r, c, &cc);
    int n = cc.n_toks < cap ? cc.n_toks : cap;
    memcpy(out, cc.ids, (size_t)n * sizeof *out);
    return n;
}

/* Plain greedy loop on a private engine: the reference. */
static int reference_greedy(const struct model *m, const char *prompt, int max_tokens, int32_t *out)
{
    char err[ERR_MSG_MAX];
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = 1;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    int32_t toks[128];
    int nt = tokenize(m, prompt, toks, 128);
    struct batch b;
    assert_int_equal(batch_init(&b, 256), 0);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    for (int i = 0; i < nt; i++)
        batch_add(&b, toks[i], i, 0, i == nt - 1);
    assert_int_equal(engine_forward(e, &b, logits, err), 0);
    int n = 0;
    while (n < max_tokens) {
        int best = 0;
        for (int v = 1; v < m->hp.n_vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        if (tokenizer_is_eog(m->tok, best))
            break;
        out[n++] = best;
        if (n == max_tokens || nt + n >= engine_params_get(e)->n_ctx)
            break;
        batch_clear(&b);
        batch_add(&b, best, nt + n - 1, 0, true);
        assert_int_equal(engine_forward(e, &b, logits, err), 0);
    }
    free(logits);
    batch_deinit(&b);
    engine_destroy(e);
    return n;
}

static const char *prompts[] = {"Once upon a time", "The cat sat", "Lily went to the park and", "One day, a big dog",
                                "Tom had a red ball", "There was a little bird", "Sue liked to", "The sun was"};

static void test_matches_reference_and_batch(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f, 8, 64, 0, 16); /* small chunks: prompts span several steps */
    int32_t ref[8][64], got[64];
    int nref[8];
    for (int i = 0; i < 8; i++)
        nref[i] = reference_greedy(f.m, prompts[i], 40, ref[i]);
    /* alone */
    struct sched_req *r = make_req(f.m, prompts[0], 40, 1);
    assert_int_equal(scheduler_submit(f.s, r), 0);
    wait_finished(r);
    assert_int_equal(req_status(r).error, 0);
    int n = req_tokens(r, 0, got, 64);
    assert_int_equal(n, nref[0]);
    assert_memory_equal(got, ref[0], (size_t)n * sizeof *got);
    struct choice_copy cc;
    req_choice(r, 0, &cc);
    assert_true(cc.finish == SCHED_STOP || cc.finish == SCHED_LENGTH);
    assert_true(cc.text_len > 0);
    sched_req_unref(r);
    /* eight at once */
    struct sched_req *rs[8];
    for (int i = 0; i < 8; i++) {
        rs[i] = make_req(f.m, prompts[i], 40, 1);
        assert_int_equal(scheduler_submit(f.s, rs[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        wait_finished(rs[i]);
        assert_int_equal(req_status(rs[i]).error, 0);
        n = req_tokens(rs[i], 0, got, 64);
        if (n != nref[i] || memcmp(got, ref[i], (size_t)n * sizeof *got))
            print_error("request %d differs from its reference in a batch\n", i);
        assert_int_equal(n, nref[i]);
        assert_memory_equal(got, ref[i], (size_t)n * sizeof *got);
        sched_req_unref(rs[i]);
    }
    struct sched_stats st;
    scheduler_stats(f.s, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    /* every request was measured once at admission, first token and end; tokens add up */
    assert_int_equal(obs_count(&f, SCHED_CTR_PREFIX_QUERIES), 9);
    assert_int_equal(obs_timed(&f, SCHED_TIM_QUEUE), 9);
    assert_int_equal(obs_timed(&f, SCHED_TIM_TTFT), 9);
    assert_int_equal(obs_timed(&f, SCHED_TIM_E2E), 9);
    int64_t gen = nref[0];
    for (int i = 0; i < 8; i++)
        gen += nref[i];
    assert_int_equal(obs_count(&f, SCHED_CTR_GENERATED_TOKENS), gen);
    assert_int_equal(obs_timed(&f, SCHED_TIM_ITL), gen - 9);
    assert_true(obs_count(&f, SCHED_CTR_ENGINE_STEPS) > 0);
    fixture_down(&f);
}

static void test_n_choices_and_stop(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f, 4, 64, 0, 32);
    int32_t ref[64], got[64];
    int nref = reference_greedy(f.m, prompts[2], 30, ref);
    struct sched_req *r = make_req(f.m, prompts[2], 30, 3);
    assert_int_equal(scheduler_submit(f.s, r), 0);
    wait_finished(r);
    assert_int_equal(req_status(r).error, 0);
    for (int c = 0; c < 3; c++) {
        int n = req_tokens(r, c, got, 64);
        assert_int_equal(n, nref);
        assert_memory_equal(got, ref, (size_t)n * sizeof *got);
    }
    /* stop string: the text ends before it and the finish reason is stop */
    char full[1024];
    struct choice_copy cc;
    req_choice(r, 0, &cc);
    size_t fl = cc.text_len < sizeof full - 1 ? cc.text_len : sizeof full - 1;
    memcpy(full, cc.text, fl);
    full[fl] = 0;
    sched_req_unref(r);
    assert_true(fl > 12);
    char stop[8];
    memcpy(stop, full + 8, 4); /* a piece from the middle of the greedy text */
    stop[4] = 0;
    char *first = strstr(full, stop);
    struct sched_req *r2 = make_req(f.m, prompts[2], 30, 1);
    char *stops[] = {stop};
    assert_int_equal(sched_req_set_stop(r2, stops, 1), 0);
    assert_int_equal(scheduler_submit(f.s, r2), 0);
    wait_finished(r2);
    req_choice(r2, 0, &cc);
    assert_int_equal(cc.finish, SCHED_STOP);
    assert_int_equal(cc.text_len, (size_t)(first - full));
    assert_memory_equal(cc.text, full, (size_t)(first - full));
    sched_req_unref(r2);
    /* sampled choices with a seed: reproducible */
    struct sched_req *a = make_req(f.m, prompts[0], 20, 2), *b = make_req(f.m, prompts[0], 20, 2);
    a->sp.temperature = b->sp.temperature = 1.0f;
    a->sp.seed = b->sp.seed = 42;
    assert_int_equal(scheduler_submit(f.s, a), 0);
    assert_int_equal(scheduler_submit(f.s, b), 0);
    wait_finished(a);
    wait_finished(b);
    for (int c = 0; c < 2; c++) {
        int32_t ta[64], tb[64];
        int na = req_tokens(a, c, ta, 64), nb = req_tokens(b, c, tb, 64);
        assert_int_equal(na, nb);
        assert_memory_equal(ta, tb, (size_t)na * sizeof *ta);
    }
    sched_req_unref(a);
    sched_req_unref(b);
    fixture_down(&f);
}

static void test_cancel_deadline_queue(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up_model(&f, MODEL_SLOW, 1, 2, 0, 16);
    /* a long running request (up to the 512-token context) holds the only slot */
    struct sched_req *run = make_req(f.m, prompts[0], 100000, 1);
    run->ignore_eos = true;
    assert_int_equal(scheduler_submit(f.s, run), 0);
    for (int i = 0; i < 5000; i++) {
        struct sched_stats st;
        scheduler_stats(f.s, &st);
        if (st.running == 1)
            break;
        usleep(1000);
    }
    /* queued with a short deadline: times out while queued. 25 ms: far inside what is left of the running
     * request (about 0.25 s here, so a CPU 5x faster still has it running), far beyond the microseconds the
     * next two submits take (they need it still queued). */
    struct sched_req *q = make_req(f.m, prompts[1], 10, 1);
    q->deadline = clock_now_ns() + 25 * 1000000LL;
    assert_int_equal(scheduler_submit(f.s, q), 0);
    struct sched_req *q2 = make_req(f.m, prompts[2], 10, 1);
    assert_int_equal(scheduler_submit(f.s, q2), 0);
    /* queue bound: 2 waiting */
    struct sched_req *q3 = make_req(f.m, prompts[3], 10, 1);
    assert_int_equal(scheduler_submit(f.s, q3), ERR_QUEUE_FULL);
    sched_req_unref(q3);
    wait_finished(q);
    assert_int_equal(req_status(q).error, ERR_TIMEOUT);
    assert_non_null(strstr(req_status(q).errmsg, "while queued"));
    assert_int_equal(req_status(q).n_generated, 0);
    /* cancel the running one (as a client going away): q2 then runs to completion */
    scheduler_cancel(f.s, run, ERR_CANCELLED);
    wait_finished(run);
    assert_int_equal(req_status(run).error, ERR_CANCELLED);
    assert_true(req_status(run).n_generated > 0);
    wait_finished(q2);
    assert_int_equal(req_status(q2).error, 0);
    struct sched_stats st;
    scheduler_stats(f.s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(obs_count(&f, SCHED_CTR_CANCELLED), 1);
    assert_int_equal(obs_count(&f, SCHED_CTR_TIMEOUTS), 1);
    assert_int_equal(obs_count(&f, SCHED_CTR_REJECTED_QUEUE_FULL), 1);
    sched_req_unref(run);
    sched_req_unref(q);
    sched_req_unref(q2);
    fixture_down(&f);
}

static void test_preemption(void **state)
{
    (void)state;
    struct fixture f;
    /* 12 blocks of 16 positions: two sequences of ~100 positions cannot both finish without preemption */
    fixture_up(&f, 4, 64, 12, 32);
    int32_t ref[4][128], got[128];
    int nref[4];
    for (int i = 0; i < 4; i++)
        nref[i] = reference_greedy(f.m, prompts[i], 90, ref[i]);
    struct sched_req *rs[4];
    for (int i = 0; i < 4; i++) {
        rs[i] = make_req(f.m, prompts[i], 90, 1);
        rs[i]->ignore_eos = false;
        assert_int_equal(scheduler_submit(f.s, rs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        wait_finished(rs[i]);
        assert_int_equal(req_status(rs[i]).error, 0);
        int n = req_tokens(rs[i], 0, got, 128);
        assert_int_equal(n, nref[i]);
        assert_memory_equal(got, ref[i], (size_t)n * sizeof *got);
        sched_req_unref(rs[i]);
    }
    print_message("preemptions: %lld\n", (long long)obs_count(&f, SCHED_CTR_PREEMPTIONS));
    assert_true(obs_count(&f, SCHED_CTR_PREEMPTIONS) > 0);
    struct sched_stats st;
    scheduler_stats(f.s, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    fixture_down(&f);
}

/* Priority: with every slot held by batch requests (SCHED_PRIORITY_BATCH), a live request preempts one of
 * them and finishes first; the preempted batch request resumes and its greedy output is unchanged. */
/* One try of test_priority_preempts_batch: returns false, having checked nothing about preemption, when no
 * preemption happened because a batch request ended before the live one was admitted (its slot was free then:
 * 100 tokens of the tiny model take milliseconds, and a stalled test thread or a fast CPU lets one end, even in
 * the very step the live request arrives in), so the caller can try again. The outputs are checked either way. */
static bool preempt_try(struct fixture *f, int32_t ref[2][128], const int nref[2])
{
    int32_t got[128];
    struct sched_req *b[2];
    for (int i = 0; i < 2; i++) {
        b[i] = make_req(f->m, prompts[i], 100, 1);
        b[i]->priority = SCHED_PRIORITY_BATCH;
        assert_int_equal(scheduler_submit(f->s, b[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        while (!req_status(b[i]).t_first_token)
            usleep(1000);
    struct sched_req *live = make_req(f->m, prompts[2], 4, 1);
    int64_t preempted = obs_count(f, SCHED_CTR_PREEMPTIONS);
    assert_int_equal(scheduler_submit(f->s, live), 0);
    wait_finished(live);
    assert_int_equal(req_status(live).error, 0);
    for (int i = 0; i < 2; i++) {
        wait_finished(b[i]);
        assert_int_equal(req_status(b[i]).error, 0);
        int n = req_tokens(b[i], 0, got, 128);
        assert_int_equal(n, nref[i]);
        assert_memory_equal(got, ref[i], (size_t)n * sizeof *got);
    }
    bool judged = obs_count(f, SCHED_CTR_PREEMPTIONS) > preempted;
    if (judged) {
        /* the live request did not wait for a batch request to finish: it was admitted (taking a batch
         * request's slot) before either ended. (Its own end may come after the other batch request's, which
         * keeps its slot and may be a few tokens from done on this tiny model.) */
        for (int i = 0; i < 2; i++)
            assert_true(req_status(live).t_admitted < req_status(b[i]).t_finished);
    }
    for (int i = 0; i < 2; i++)
        sched_req_unref(b[i]);
    sched_req_unref(live);
    return judged;
}

static void test_priority_preempts_batch(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f, 2, 64, 64, 32);
    int32_t ref[2][128];
    int nref[2];
    for (int i = 0; i < 2; i++)
        nref[i] = reference_greedy(f.m, prompts[i], 100, ref[i]);
    int tries = 0;
    while (!preempt_try(&f, ref, nref))
        if (++tries == 5)
            fail_msg("5 tries: no preemption; a batch request ended before the live one was admitted every time");
    fixture_down(&f);
}

static void test_prefix_reuse(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up(&f, 2, 8, 0, 64);
    const char *p = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park";
    struct sched_req *a = make_req(f.m, p, 8, 1);
    assert_int_equal(scheduler_submit(f.s, a), 0);
    wait_finished(a);
    assert_int_equal(req_status(a).cached_tokens, 0);
    struct sched_req *b = make_req(f.m, p, 8, 1);
    assert_int_equal(scheduler_submit(f.s, b), 0);
    wait_finished(b);
    assert_true(req_status(b).cached_tokens >= 16);
    assert_true(req_status(b).cached_tokens < b->n_prompt);
    int32_t ta[16], tb[16];
    int na = req_tokens(a, 0, ta, 16), nb = req_tokens(b, 0, tb, 16);
    assert_int_equal(na, nb);
    assert_memory_equal(ta, tb, (size_t)na * sizeof *ta);
    assert_int_equal(obs_count(&f, SCHED_CTR_PREFIX_HITS), 1);
    assert_int_equal(obs_count(&f, SCHED_CTR_PREFIX_HIT_TOKENS), req_status(b).cached_tokens);
    sched_req_unref(a);
    sched_req_unref(b);
    fixture_down(&f);
}

/* A long prompt is prefilled in chunks while another sequence keeps decoding: the decoding request gains
 * about one token per chunk of the newcomer's prompt (no stall while it prefills). */
static void test_chunked_prefill_does_not_stall(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up_model(&f, MODEL_SLOW, 2, 8, 0, 8);
    struct sched_req *a = make_req(f.m, "Hello", 400, 1);
    a->ignore_eos = true;
    assert_int_equal(scheduler_submit(f.s, a), 0);
    for (int i = 0; i < 5000; i++) {
        if (req_status(a).n_generated >= 2)
            break;
        usleep(1000);
    }
    char prompt[2048] = "";
    for (int i = 0; i < 20; i++)
        strcat(prompt, "the quick brown fox jumps over the lazy dog ");
    int32_t toks[512];
    int nt = tokenizer_encode(f.m->tok, prompt, strlen(prompt), true, false, toks, 512);
    assert_true(nt > 100 && nt < 400);
    struct sched_req *b = sched_req_create(toks, nt, 1);
    b->max_tokens = 1;
    b->sp.temperature = 0;
    b->t_arrival = clock_now_ns();
    int a_before = req_status(a).n_generated;
    assert_int_equal(scheduler_submit(f.s, b), 0);
    wait_finished(b);
    int a_during = req_status(a).n_generated - a_before;
    print_message("prompt of %d tokens in chunks of 8: the decoding request made %d tokens meanwhile\n", nt, a_during);
    assert_true(a_during >= nt / 8 - 2);
    scheduler_cancel(f.s, a, ERR_CANCELLED);
    wait_finished(a);
    sched_req_unref(a);
    sched_req_unref(b);
    fixture_down(&f);
}

/* The admission limit (scheduler_set_max_running): with 1, requests run one after another; raised, they
 * run together again; a request with more choices than the limit still runs in an empty batch. */
static void test_max_running_limit(void **state)
{
    (void)state;
    struct fixture f;
    fixture_up_model(&f, MODEL_SLOW, 4, 16, 0, 64); /* requests long enough to overlap however fast the CPU */
    assert_int_equal(scheduler_max_running(f.s), 4);
    assert_int_equal(scheduler_set_max_running(f.s, 100), 4); /* clamped to the slots */
    assert_int_equal(scheduler_set_max_running(f.s, 0), 1);
    struct sched_req *r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = make_req(f.m, prompts[i], 24, 1);
        r[i]->ignore_eos = true;
        assert_int_equal(scheduler_submit(f.s, r[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        wait_finished(r[i]);
    for (int i = 1; i < 3; i++) /* each admitted only once the one before finished */
        assert_true(req_status(r[i]).t_admitted >= req_status(r[i - 1]).t_finished);
    struct sched_stats st;
    scheduler_stats(f.s, &st);
    assert_int_equal(st.max_running, 1);
    /* two choices, limit 1: admitted into the empty batch anyway */
    struct sched_req *two = make_req(f.m, prompts[0], 4, 2);
    assert_int_equal(scheduler_submit(f.s, two), 0);
    wait_finished(two);
    assert_int_equal(req_status(two).error, 0);
    /* limit 4 again: the three run together (each admitted before any finished) */
    scheduler_set_max_running(f.s, 4);
    struct sched_req *q[3];
    for (int i = 0; i < 3; i++) {
        q[i] = make_req(f.m, prompts[i], 200, 1); /* 0.1 s each here, against microseconds between submits */
        q[i]->ignore_eos = true;
        assert_int_equal(scheduler_submit(f.s, q[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        wait_finished(q[i]);
    int64_t first_done = req_status(q[0]).t_finished;
    for (int i = 0; i < 3; i++)
        first_done = req_status(q[i]).t_finished < first_done ? req_status(q[i]).t_finished : first_done;
    for (int i = 0; i < 3; i++)
        assert_true(req_status(q[i]).t_admitted < first_done);
    for (int i = 0; i < 3; i++) {
        sched_req_unref(r[i]);
        sched_req_unref(q[i]);
    }
    sched_req_unref(two);
    fixture_down(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference_and_batch), cmocka_unit_test(test_n_choices_and_stop),
        cmocka_unit_test(test_cancel_deadline_queue),       cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_priority_preempts_batch),
        cmocka_unit_test(test_prefix_reuse),                cmocka_unit_test(test_chunked_prefill_does_not_stall),
        cmocka_unit_test(test_max_running_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
