/*
 * bench_spec: speculative decoding end to end through the scheduler (see bench_spec.h). One scheduler serves
 * every request of the run, so its measured pass costs carry over from request to request as in a server.
 */
#include "bench/bench_spec.h"

#include "core/err.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_SPEC_PROMPT "Here is the text to repeat:"
#define BENCH_SPEC_CHUNK 8 /* "half": tokens per chunk, every other one replaced */

static const char *const bench_spec_sources[] = {"exact", "half", "wrong", "ngram", "draft"};

bool bench_spec_known(const char *name)
{
    for (size_t i = 0; i < sizeof bench_spec_sources / sizeof *bench_spec_sources; i++)
        if (name && !strcmp(name, bench_spec_sources[i]))
            return true;
    return false;
}

struct bench_spec_wake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void bench_spec_notify(void *ctx)
{
    struct bench_spec_wake *w = ctx;
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

struct bench_spec_answer {
    int32_t *toks; /* [cap] */
    int n, cap;
};

static bool bench_spec_copy(void *ctx, int c, const struct sched_choice *ch)
{
    struct bench_spec_answer *a = ctx;
    a->n = 0;
    for (int i = 0; c == 0 && i < ch->n_toks && a->n < a->cap; i++)
        a->toks[a->n++] = ch->toks[i].id;
    return true;
}

/* One greedy request of n_gen tokens (prediction pred[0..n_pred) when n_pred > 0, drafts from spec); its
 * tokens into a, its status into st. 0 or -1 with err. */
static int bench_spec_request(struct scheduler *s, struct bench_spec_wake *w, const int32_t *prompt, int n_prompt,
                              int n_gen, const int32_t *pred, int n_pred, enum sched_spec spec,
                              struct bench_spec_answer *a, struct sched_req_status *st, char *err)
{
    struct sched_req *r = sched_req_create(prompt, n_prompt, 1);
    if (!r || (n_pred > 0 && sched_req_set_prediction(r, pred, n_pred))) {
        sched_req_unref(r);
        return err_set(err, ERR_NOMEM, "out of memory"), -1;
    }
    r->max_tokens = n_gen;
    r->sp.temperature = 0;
    r->ignore_eos = true;
    r->spec = (int)spec;
    if (scheduler_submit(s, r)) {
        sched_req_unref(r);
        return err_set(err, ERR_INTERNAL, "the scheduler refused the request"), -1;
    }
    pthread_mutex_lock(&w->mu);
    for (;;) {
        sched_req_status_get(r, st);
        if (st->finished)
            break;
        pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    sched_req_read(r, bench_spec_copy, a);
    sched_req_unref(r);
    if (st->error)
        return err_set(err, st->error, "request failed: %s", st->errmsg), -1;
    return 0;
}

static double bench_spec_tps(const struct sched_req_status *st, int n)
{
    double s = (double)(st->t_finished - st->t_first_token) / 1e9;
    return n > 1 && s > 0 ? (n - 1) / s : 0;
}

static int bench_spec_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_spec_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_spec_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int bench_spec_run(struct engine *e, struct engine *de, const char *src, int n_gen, int rounds, bool draft_fixed,
                   struct bench_spec_result *out, char *err)
{
    const struct model *m = engine_model(e);
    int nv = m->hp.n_vocab, rc = -1;
    memset(out, 0, sizeof *out);
    if (!strcmp(src, "draft") && !de)
        return err_set(err, ERR_INVALID_ARG, "--spec draft needs --draft-model FILE"), -1;
    struct bench_spec_wake w;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    struct scheduler *s = NULL;
    int32_t *prompt = NULL, *ref = NULL, *pred = NULL;
    double *ratio = malloc((size_t)rounds * 3 * sizeof *ratio), *tp = ratio + rounds, *ts = ratio + 2 * rounds;
    struct bench_spec_answer a = {.toks = malloc((size_t)n_gen * sizeof(int32_t)), .cap = n_gen};
    ref = malloc((size_t)n_gen * sizeof *ref);
    pred = malloc((size_t)n_gen * sizeof *pred);
    int n_prompt = tokenizer_encode_alloc(m->tok, BENCH_SPEC_PROMPT, strlen(BENCH_SPEC_PROMPT), true, false, &prompt);
    if (!ratio || !a.toks || !ref || !pred || n_prompt <= 0) {
        err_set(err, ERR_NOMEM, "out of memory");
        goto out;
    }
    const struct engine_params *ep = engine_params_get(e);
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = 1;
    sp.max_queue = 4;
    sp.prefill_chunk = ep->max_batch_tokens - 1;
    sp.prefix_cache = false;
    sp.draft_adaptive = !draft_fixed;
    sp.draft_engine = !strcmp(src, "draft") ? de : NULL;
    if (!(s = scheduler_create(e, m->tok, &sp, NULL, bench_spec_notify, &w, err)))
        goto out;
    if (scheduler_start(s)) {
        err_set(err, ERR_INTERNAL, "cannot start the engine thread");
        goto out;
    }
    struct sched_req_status st;
    if (bench_spec_request(s, &w, prompt, n_prompt, n_gen, NULL, 0, SCHED_SPEC_OFF, &a, &st, err))
        goto out;
    int n_ref = a.n;
    memcpy(ref, a.toks, (size_t)n_ref * sizeof *ref);
    /* the prediction and the request's other drafts */
    int n_pred = 0;
    enum sched_spec spec = SCHED_SPEC_OFF;
    if (!strcmp(src, "exact") || !strcmp(src, "half") || !strcmp(src, "wrong")) {
        n_pred = n_ref;
        for (int i = 0; i < n_ref; i++)
            pred[i] = !strcmp(src, "wrong")                                     ? ref[n_ref - 1 - i]
                      : !strcmp(src, "half") && (i / BENCH_SPEC_CHUNK) % 2 == 1 ? (ref[i] * 7 + 3) % nv
                                                                                : ref[i];
    } else {
        spec = !strcmp(src, "ngram") ? SCHED_SPEC_NGRAM : SCHED_SPEC_DRAFT;
    }
    for (int r = 0; r < rounds; r++) {
        double tps[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            bool sp_on = (k + r) % 2 == 1; /* alternate which goes first */
            if (bench_spec_request(s, &w, prompt, n_prompt, n_gen, sp_on ? pred : NULL, sp_on ? n_pred : 0,
                                   sp_on ? spec : SCHED_SPEC_OFF, &a, &st, err))
                goto out;
            if (a.n != n_ref || memcmp(a.toks, ref, (size_t)n_ref * sizeof *ref)) {
                err_set(err, ERR_INTERNAL, "round %d: the answer %s speculation differs from the greedy answer "
                        "(a bug: speculation must not change the output)", r + 1, sp_on ? "with" : "without");
                goto out;
            }
            tps[sp_on] = bench_spec_tps(&st, a.n);
            if (sp_on) {
                out->drafted += st.draft_tokens;
                out->accepted += st.accepted_tokens;
            }
        }
        tp[r] = tps[0];
        ts[r] = tps[1];
        ratio[r] = tps[0] > 0 ? tps[1] / tps[0] : 0;
        fprintf(stderr, "spec %-6s round %d: plain %7.2f tok/s, speculative %7.2f tok/s, %.2fx\n", src, r + 1,
                tps[0], tps[1], ratio[r]);
    }
    out->rounds = rounds;
    out->ratio = bench_spec_median(ratio, rounds);
    out->plain_tps = bench_spec_median(tp, rounds);
    out->spec_tps = bench_spec_median(ts, rounds);
    rc = 0;
out:
    scheduler_destroy(s);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    free(prompt);
    free(ref);
    free(pred);
    free(a.toks);
    free(ratio);
    return rc;
}
