/*
 * scheduler: one loop on the engine thread:
 *
 *   1. move submitted requests from the inbox (mutex + condvar) to the wait queue;
 *   2. finish requests that were cancelled or passed their deadline (queued or running), freeing their slots
 *      and KV blocks before anything else is planned;
 *   3. admit from the head of the wait queue (first come, first served: never skipping the head) while
 *      slots and KV blocks allow, attaching cached prefix blocks;
 *   4. plan the step: one token for every decoding sequence, then prompt chunks up to prefill_chunk tokens
 *      in admission order; when the step's KV blocks do not fit, evict unreferenced prefix-cache blocks,
 *      then preempt the most recently admitted request and plan again;
 *   5. engine_forward, register newly filled blocks in the prefix cache, sample every sequence that
 *      reached the end of its tokens, detokenize, match stop strings, append to the outbox, notify.
 *
 * A sequence is "tokens (prompt + generated) and how many of them are in the KV cache": prefill, decode and
 * recomputation after preemption are the same code (feed tokens[n_kv..] and sample once n_kv reaches the
 * end), so a preempted sequence resumes exactly where it was. Sampling order per sequence never depends on
 * the batch: each sequence has its own sampler and RNG and the engine's logits are batch-invariant, so a
 * greedy request gives the same tokens alone or under load.
 *
 * n > 1: choice 0 (the leader) prefills the prompt but its last token; the other choices then share those
 * blocks (kv_seq_share) and all of them evaluate the last prompt token in the same step, each sampling
 * its own continuation.
 *
 * Speculation. In a step without prompt work, a decoding sequence may feed k drafted tokens after its
 * pending one (plan_drafts: from the request's prediction, else n-gram lookup or the draft model, whose
 * own KV is rolled back with the target's (draft_model_run); k from speculate.h's plan),
 * at the next positions, logits for each. Its rows are then sampled in order exactly as k + 1 decode steps
 * would sample them (the same sampler calls, the same RNG draws, penalties updated token by token), and a
 * drafted token is accepted while it equals what the sampler drew at its position: the row after it is
 * then the logits a one-token step would have given (the engine's rows depend only on the sequence's
 * tokens), so it is sampled too; the first mismatch ends the step, its token being the sampler's. Greedy
 * and seeded sampling therefore give the same tokens as without speculation. This is the standard
 * speculative sampling rule for a draft that is one token with certainty (accept with probability
 * p(draft), else draw from p without it), done with the target's own draw. The rejected positions' KV is
 * dropped by truncating the block table (engine_seq_truncate); n_kv only ever counts verified tokens, so
 * the prefix cache never registers a drafted one. Drafts never force an eviction or a preemption: a step
 * whose drafts do not fit in the free KV blocks is planned again without them.
 */
#include "engine/scheduler.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/speculate.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { RS_QUEUED = 0, RS_RUNNING, RS_DONE };
#define SCHED_MAX_SLOTS 256
#define SCHED_SPEC_ROWS_MAX 64 /* drafted tokens in one step, all sequences */
#define SCHED_PROBE_EVERY 16   /* steps a sequence with drafts but no speculation waits before a probe */
#define SCHED_NGRAM_MIN 2      /* n-gram lookup: shortest and longest suffix matched */
#define SCHED_NGRAM_MAX 4
#define SCHED_COST_REFRESH 64 /* steps after which the cost of a pass one token longer is timed again */
#define SCHED_PRIOR 0.5f       /* acceptance a sequence's first drafts are planned with: n-gram, draft model */
#define SCHED_PRIOR_PRED 0.8f  /* ... from a prediction: the client expects that text, and realignments need a
                                  match (speculate.h), so its drafts are usually right */

struct sched_seq {
    int slot; /* engine sequence, -1 when not holding one */
    int32_t *toks;
    int n_toks, cap_toks;
    int n_kv;  /* positions in the KV cache */
    int n_gen; /* generated tokens (not counting an end-of-generation token) */
    bool follower_waiting; /* n > 1: waiting for the leader's prompt blocks */
    bool done;
    struct sampler *smp;
    struct detok_stream ds;
    struct stop_matcher stop;
    struct prefix_cursor pcur;
    int64_t t_last; /* last token time (inter-token latency) */
    int step_take;   /* tokens fed this step */
    bool step_logits;
    struct grammar_matcher *gm; /* structured output: the grammar's state after this choice's tokens */
    bool stop_hit;              /* ended by a stop string (its held-back text is dropped) */
    /* speculation */
    int step_draft;      /* drafted tokens fed after the pending one this step (in the scheduler's draft[slot]) */
    int step_row;        /* rows of this step sampled so far */
    int step_accepted;   /* drafted tokens accepted so far this step */
    bool step_rejected;  /* a drafted token was rejected: the rows after it are not sampled */
    bool step_from_pred; /* this step's draft came from the prediction */
    bool step_from_model; /* ... from the draft model */
    int d_n;             /* draft model: positions of its KV (same slot) written; those below n_kv hold this
                            sequence's tokens, those at or past it drafts that may have been rejected */
    int d_feed;          /* draft model: tokens fed in the pass being built */
    int pred_cursor;     /* spec_draft_prediction's cursor into the request's prediction */
    struct spec_accept acc;
    int spec_idle;       /* steps with drafts at hand but none verified, since the last verify */
};

/* The scheduler's part of a request. */
struct sched_req_state {
    atomic_int refs;
    atomic_int cancel; /* 0, or the ERR_* reason (ERR_CANCELLED, ERR_TIMEOUT, ERR_UNAVAILABLE) */
    pthread_mutex_t mu;
    /* guarded by mu (written by the engine thread, read through sched_req_status_get / sched_req_read): */
    struct sched_choice *choices; /* [n_choices] */
    bool finished;                /* every choice is done; nothing more will be appended */
    int error;                    /* ERR_* when finished with SCHED_ERROR */
    char errmsg[256];
    int cached_tokens;            /* prompt tokens reused from the prefix cache at first admission */
    int64_t t_admitted, t_first_token, t_finished; /* ns, 0 until they happen */
    uint64_t version;             /* bumped at every append: the I/O thread skips unchanged requests */
    int draft_tokens, accepted_tokens, pred_draft_tokens, pred_accepted_tokens; /* sched_req_status */
    int preemptions; /* sched_req_status */

    /* engine thread only */
    struct sched_seq *seqs; /* [n_choices] */
    int state;              /* RS_QUEUED / RS_RUNNING / RS_DONE */
    uint64_t admit_order;
    int n_done;
    bool counted;           /* prompt tokens / queue time recorded */
};

/* A request and its state in one allocation (the request first, so freeing it frees both). */
struct sched_req_box {
    struct sched_req req;
    struct sched_req_state st;
};

struct scheduler {
    struct engine *e;
    const struct tokenizer *tok;
    struct sched_params p;
    struct sched_observer obs;
    void (*notify)(void *);
    void *notify_ctx;
    int n_vocab, n_ctx, max_seqs;

    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* inbox, stop flag */
    pthread_cond_t cv;
    struct sched_req **inbox, **inbox_spare;
    int n_inbox, cap_inbox, cap_spare;
    bool stop;
    atomic_bool draining;
    atomic_int n_queued; /* submitted and not yet admitted (inbox + wait queue) */
    atomic_int n_queued_batch; /* of those, batch requests (priority > live): not bounded by max_queue */
    atomic_int cancel_all;
    atomic_int max_running; /* admission limit on running sequences, 1..max_seqs (scheduler_set_max_running) */
    atomic_int prefill_budget; /* prompt tokens per step now, 1..p.prefill_chunk (scheduler_set_prefill_chunk) */

    /* engine thread */
    struct sched_req **waiting;
    int n_waiting, cap_waiting;
    struct sched_req **running; /* admission order */
    int n_running;
    int *free_slots;
    int n_free_slots;
    uint64_t admit_counter;
    bool dirty; /* something to ship since the last notify */
    struct prefix_cache *pc;
    struct batch batch;
    float *logits;          /* [max_rows][n_vocab]: one row per decode and per drafted token */
    int max_rows;           /* max_seqs + spec_rows */
    struct sched_req **slot_req; /* [max_seqs]: who holds each engine slot */
    int *slot_choice;
    struct sched_req **row_req; /* [max_rows]: the request of each logits row of a step (pinned) */
    int *row_choice;        /* [max_rows] */
    int *row_pos;           /* [max_rows] the row's position in its sequence */
    bool *row_first;        /* [max_rows]: the first row of its sequence in the step */
    /* speculation */
    int spec_rows;          /* most drafted tokens in one step */
    int32_t *draft;         /* [max_seqs][draft_max]: each slot's drafted tokens of this step */
    int step_drafts;        /* drafted tokens in the step planned */
    bool step_decode_only;  /* the step planned has no prompt chunk */
    struct spec_cost cost;  /* measured time of forward passes by size */
    double *cost_curve;     /* [max_seqs + spec_rows + 1] */
    struct spec_cand *cand; /* [max_seqs] */
    struct sched_seq **cand_seq; /* [max_seqs] */
    struct engine *de;      /* the draft model's engine (p.draft_engine), NULL: none */
    int de_ctx;             /* its positions per sequence */
    struct batch dbatch;    /* its passes */
    float *dlogits;         /* [max_seqs][n_vocab]: its logits rows */
    double draft_pass_ns;   /* measured time of one of its drafting passes (lower-edge EMA, 0: never) */
    bool draft_warned;      /* a failed pass of it was logged */
    uint64_t *cost_at;      /* [cost.n + 1]: the step when a pass of each size was last timed */
    struct sampler_logprob *top_buf;
    char *piece, *textbuf;
    int piece_cap, textbuf_cap;
    struct token_trie *trie; /* the vocabulary for grammar masks, built at the first constrained request */
    uint32_t *mask;          /* [(trie n_vocab + 31) / 32] */

    /* stats (any thread) */
    atomic_int st_running, st_waiting;
    atomic_llong st_kv_used, st_cache_blocks;
    atomic_ullong st_steps;
    int64_t kv_total;
};

/* ---------------------------------------------------------------- measures */

static void obs_count(struct scheduler *s, enum sched_counter c, int64_t v)
{
    if (s->obs.count)
        s->obs.count(s->obs.ctx, c, v);
}

/* Reports the time from t0 to t1 (ns). */
static void obs_time(struct scheduler *s, enum sched_timing t, int64_t t0, int64_t t1)
{
    if (s->obs.observe)
        s->obs.observe(s->obs.ctx, t, (double)(t1 - t0) / 1e9);
}

/* ---------------------------------------------------------------- requests */

struct sched_req *sched_req_create(const int32_t *prompt, int n_prompt, int n_choices)
{
    if (n_prompt < 1 || n_choices < 1)
        return NULL;
    struct sched_req_box *box = calloc(1, sizeof *box);
    if (!box)
        return NULL;
    struct sched_req *r = &box->req;
    r->st = &box->st;
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    r->st->choices = calloc((size_t)n_choices, sizeof *r->st->choices);
    if (!r->prompt || !r->st->choices) {
        free(r->prompt);
        free(r->st->choices);
        free(r); /* the box */
        return NULL;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    r->n_choices = n_choices;
    r->max_tokens = 16;
    r->n_logprobs = -1;
    r->spec = -1;
    sampler_params_default(&r->sp);
    atomic_init(&r->st->refs, 1);
    atomic_init(&r->st->cancel, 0);
    pthread_mutex_init(&r->st->mu, NULL);
    return r;
}

int sched_req_set_stop(struct sched_req *r, char *const *stop, int n_stop)
{
    if (n_stop <= 0)
        return 0;
    r->stop = calloc((size_t)n_stop, sizeof *r->stop);
    if (!r->stop)
        return ERR_NOMEM;
    for (int i = 0; i < n_stop; i++) {
        if (!(r->stop[i] = strdup(stop[i])))
            return ERR_NOMEM;
        r->n_stop = i + 1;
    }
    return 0;
}

int sched_req_set_prediction(struct sched_req *r, const int32_t *toks, int n)
{
    if (n <= 0)
        return 0;
    int32_t *p = malloc((size_t)n * sizeof *p);
    if (!p)
        return ERR_NOMEM;
    memcpy(p, toks, (size_t)n * sizeof *p);
    free(r->prediction);
    r->prediction = p;
    r->n_prediction = n;
    return 0;
}

int sched_req_set_logit_bias(struct sched_req *r, const struct sampler_bias *b, int n)
{
    if (n <= 0)
        return 0;
    struct sampler_bias *p = malloc((size_t)n * sizeof *p);
    if (!p)
        return ERR_NOMEM;
    memcpy(p, b, (size_t)n * sizeof *p);
    free(r->logit_bias);
    r->logit_bias = p;
    r->n_logit_bias = n;
    return 0;
}

void sched_req_ref(struct sched_req *r) { atomic_fetch_add(&r->st->refs, 1); }

static void sched_seq_free(struct sched_seq *q)
{
    free(q->toks);
    sampler_destroy(q->smp);
    stop_matcher_deinit(&q->stop);
    grammar_matcher_destroy(q->gm);
}

void sched_req_unref(struct sched_req *r)
{
    if (!r || atomic_fetch_sub(&r->st->refs, 1) != 1)
        return;
    if (r->st->seqs) {
        for (int i = 0; i < r->n_choices; i++)
            sched_seq_free(&r->st->seqs[i]);
        free(r->st->seqs);
    }
    for (int i = 0; i < r->n_choices; i++) {
        free(r->st->choices[i].text);
        free(r->st->choices[i].toks);
        free(r->st->choices[i].top);
        free(r->st->choices[i].ptoks);
    }
    free(r->st->choices);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->prompt);
    grammar_entry_unref(r->constraint);
    free(r->prediction);
    free(r->logit_bias);
    pthread_mutex_destroy(&r->st->mu);
    free(r); /* and its state: r heads their sched_req_box */
}

/* ---------------------------------------------------------------- outbox (reader side) */

void sched_req_status_get(struct sched_req *r, struct sched_req_status *out)
{
    pthread_mutex_lock(&r->st->mu);
    out->finished = r->st->finished;
    out->error = r->st->error;
    snprintf(out->errmsg, sizeof out->errmsg, "%s", r->st->errmsg);
    out->cached_tokens = r->st->cached_tokens;
    out->n_generated = 0;
    for (int c = 0; c < r->n_choices; c++)
        out->n_generated += r->st->choices[c].n_toks;
    out->draft_tokens = r->st->draft_tokens;
    out->accepted_tokens = r->st->accepted_tokens;
    out->prediction_draft_tokens = r->st->pred_draft_tokens;
    out->prediction_accepted_tokens = r->st->pred_accepted_tokens;
    out->preemptions = r->st->preemptions;
    out->t_admitted = r->st->t_admitted;
    out->t_first_token = r->st->t_first_token;
    out->t_finished = r->st->t_finished;
    out->version = r->st->version;
    pthread_mutex_unlock(&r->st->mu);
}

bool sched_req_read(struct sched_req *r, bool (*fn)(void *ctx, int c, const struct sched_choice *ch), void *ctx)
{
    bool ok = true;
    pthread_mutex_lock(&r->st->mu);
    for (int c = 0; c < r->n_choices && ok; c++)
        ok = fn(ctx, c, &r->st->choices[c]);
    pthread_mutex_unlock(&r->st->mu);
    return ok;
}

/* ---------------------------------------------------------------- outbox (engine side) */

/* Appends n_top alternatives to ch->top (grown by doubling; caller holds the request's lock) and sets *off to
 * where they start, -1 when n_top is 0. 0 or ERR_NOMEM. */
static int choice_top_append(struct sched_choice *ch, const struct sampler_logprob *top, int n_top, int32_t *off)
{
    *off = -1;
    if (!top || n_top <= 0)
        return 0;
    if (ch->n_top_used + n_top > ch->cap_top) {
        int cap = ch->cap_top ? ch->cap_top * 2 : 64 * n_top;
        while (cap < ch->n_top_used + n_top)
            cap *= 2;
        struct sampler_logprob *nt = realloc(ch->top, (size_t)cap * sizeof *nt);
        if (!nt)
            return ERR_NOMEM;
        ch->top = nt;
        ch->cap_top = cap;
    }
    *off = ch->n_top_used;
    memcpy(ch->top + ch->n_top_used, top, (size_t)n_top * sizeof *top);
    ch->n_top_used += n_top;
    return 0;
}

static int choice_append(struct sched_req *r, int c, int32_t id, const char *text, size_t len, float lp,
                         const struct sampler_logprob *top, int n_top)
{
    struct sched_choice *ch = &r->st->choices[c];
    pthread_mutex_lock(&r->st->mu);
    int rc = 0;
    if (ch->text_len + len + 1 > ch->text_cap) {
        size_t cap = ch->text_cap ? ch->text_cap : 256;
        while (cap < ch->text_len + len + 1)
            cap *= 2;
        char *nt = realloc(ch->text, cap);
        if (!nt) {
            rc = ERR_NOMEM;
            goto out;
        }
        ch->text = nt;
        ch->text_cap = cap;
    }
    if (ch->n_toks == ch->cap_toks) {
        int cap = ch->cap_toks ? ch->cap_toks * 2 : 64;
        struct sched_token *nt = realloc(ch->toks, (size_t)cap * sizeof *nt);
        if (!nt) {
            rc = ERR_NOMEM;
            goto out;
        }
        ch->toks = nt;
        ch->cap_toks = cap;
    }
    int32_t top_off;
    if ((rc = choice_top_append(ch, top, n_top, &top_off)))
        goto out;
    if (len)
        memcpy(ch->text + ch->text_len, text, len);
    ch->toks[ch->n_toks++] = (struct sched_token){.id = id, .text_off = (uint32_t)ch->text_len,
                                                  .text_len = (uint32_t)len, .logprob = lp, .top_off = top_off};
    ch->text_len += len;
    r->st->version++;
out:
    pthread_mutex_unlock(&r->st->mu);
    return rc;
}

/* Text released at the end (held-back bytes), attached to the last token or as a token-less record. */
static void choice_append_tail(struct sched_req *r, int c, const char *text, size_t len)
{
    if (!len)
        return;
    struct sched_choice *ch = &r->st->choices[c];
    pthread_mutex_lock(&r->st->mu);
    bool ok = true;
    if (ch->text_len + len + 1 > ch->text_cap) {
        size_t cap = ch->text_cap ? ch->text_cap : 256;
        while (cap < ch->text_len + len + 1)
            cap *= 2;
        char *nt = realloc(ch->text, cap);
        ok = nt != NULL;
        if (ok) {
            ch->text = nt;
            ch->text_cap = cap;
        }
    }
    if (ok) {
        memcpy(ch->text + ch->text_len, text, len);
        if (ch->n_toks > 0 && ch->toks[ch->n_toks - 1].text_off + ch->toks[ch->n_toks - 1].text_len == ch->text_len)
            ch->toks[ch->n_toks - 1].text_len += (uint32_t)len;
        ch->text_len += len;
        r->st->version++;
    }
    pthread_mutex_unlock(&r->st->mu);
}

/* ---------------------------------------------------------------- engine-side helpers */

/* n_queued moves with every request entering or leaving the wait queue; n_queued_batch with the batch
 * ones, so that max_queue bounds live requests only (batch lines are bounded by their runner's in-flight
 * limit and must wait for capacity, never be refused for it, nor take a live request's place). */
static void queued_add(struct scheduler *s, const struct sched_req *r, int d)
{
    atomic_fetch_add(&s->n_queued, d);
    if (r->priority > SCHED_PRIORITY_LIVE)
        atomic_fetch_add(&s->n_queued_batch, d);
}

static void sched_stats_update(struct scheduler *s)
{
    atomic_store(&s->st_running, s->n_running);
    atomic_store(&s->st_waiting, atomic_load(&s->n_queued));
    int64_t cache = s->pc ? prefix_cache_blocks(s->pc) : 0;
    int64_t evictable = s->pc ? prefix_cache_evictable(s->pc) : 0;
    int64_t used = s->kv_total - kv_pool_free_blocks(engine_kv(s->e)) - evictable;
    atomic_store(&s->st_kv_used, used);
    atomic_store(&s->st_cache_blocks, cache);
}

static int seq_push_token(struct sched_seq *q, int32_t t)
{
    if (q->n_toks == q->cap_toks) {
        int cap = q->cap_toks * 2;
        int32_t *nt = realloc(q->toks, (size_t)cap * sizeof *nt);
        if (!nt)
            return ERR_NOMEM;
        q->toks = nt;
        q->cap_toks = cap;
    }
    q->toks[q->n_toks++] = t;
    return 0;
}

/* Gives the sequence's slot back (its KV blocks go to the prefix cache or the pool). */
static void seq_release_slot(struct scheduler *s, struct sched_seq *q)
{
    if (q->slot < 0)
        return;
    if (s->pc) {
        prefix_cache_insert(s->pc, q->toks, q->n_kv, engine_seq(s->e, q->slot), &q->pcur);
        prefix_cache_release(s->pc, engine_seq(s->e, q->slot));
    }
    engine_seq_truncate(s->e, q->slot, 0);
    if (s->de)
        engine_seq_truncate(s->de, q->slot, 0);
    q->d_n = 0;
    s->slot_req[q->slot] = NULL;
    s->free_slots[s->n_free_slots++] = q->slot;
    q->slot = -1;
    q->n_kv = 0;
    q->pcur = (struct prefix_cursor){0};
}

static void running_remove(struct scheduler *s, struct sched_req *r)
{
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == r) {
            memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
            s->n_running--;
            return;
        }
}

static void waiting_remove(struct scheduler *s, struct sched_req *r)
{
    for (int i = 0; i < s->n_waiting; i++)
        if (s->waiting[i] == r) {
            memmove(&s->waiting[i], &s->waiting[i + 1], (size_t)(s->n_waiting - i - 1) * sizeof *s->waiting);
            s->n_waiting--;
            return;
        }
}

/* Ends the whole request (every choice not yet done gets finish; error != 0 marks it failed), frees its
 * slots and drops the scheduler's reference. */
static void req_finish(struct scheduler *s, struct sched_req *r, int error, const char *msg)
{
    int64_t now = clock_now_ns();
    s->dirty = true;
    for (int i = 0; r->st->seqs && i < r->n_choices; i++)
        seq_release_slot(s, &r->st->seqs[i]);
    if (r->st->state == RS_RUNNING)
        running_remove(s, r);
    else if (r->st->state == RS_QUEUED) {
        waiting_remove(s, r);
        queued_add(s, r, -1);
    }
    r->st->state = RS_DONE;
    pthread_mutex_lock(&r->st->mu);
    for (int i = 0; i < r->n_choices; i++)
        if (r->st->choices[i].finish == SCHED_RUNNING)
            r->st->choices[i].finish = error ? SCHED_ERROR : SCHED_LENGTH;
    if (error) {
        r->st->error = error;
        snprintf(r->st->errmsg, sizeof r->st->errmsg, "%s", msg ? msg : err_name(error));
    }
    r->st->finished = true;
    r->st->t_finished = now;
    r->st->version++;
    pthread_mutex_unlock(&r->st->mu);
    if (!error)
        obs_time(s, SCHED_TIM_E2E, r->t_arrival, now);
    else if (error == ERR_CANCELLED)
        obs_count(s, SCHED_CTR_CANCELLED, 1);
    else if (error == ERR_TIMEOUT)
        obs_count(s, SCHED_CTR_TIMEOUTS, 1);
    sched_req_unref(r);
}

/* Checks a constrained choice that ended with SCHED_STOP: its whole text against the schema, or (GBNF) that
 * the grammar accepts it as a complete sentence. The check repeats what the masks enforced, so a stop string
 * that cut the answer short, or a bug anywhere on the path, can never return invalid output as valid.
 * 0, or an error code with the reason in err. Engine thread (the only writer of the choice's text). */
static int constraint_check(struct sched_req *r, int c, char *err)
{
    const struct sched_choice *ch = &r->st->choices[c];
    size_t slen;
    const char *schema = grammar_entry_schema(r->constraint, &slen);
    if (schema)
        return json_schema_validate(schema, slen, ch->text ? ch->text : "", ch->text_len, err);
    struct grammar_matcher *m = grammar_matcher_create(grammar_entry_grammar(r->constraint), NULL, err);
    if (!m)
        return ERR_NOMEM;
    int rc = grammar_matcher_accept_bytes(m, ch->text ? ch->text : "", ch->text_len);
    if (!rc && !grammar_matcher_can_end(m))
        rc = ERR_INVALID_ARG;
    if (rc)
        err_set(err, rc, "the text is not a complete sentence of the grammar");
    grammar_matcher_destroy(m);
    return rc;
}

/* One choice finished (stop or length): flush held-back text; the request ends when all choices have. */
static void seq_finish(struct scheduler *s, struct sched_req *r, int c, enum sched_finish why)
{
    struct sched_seq *q = &r->st->seqs[c];
    if (q->done)
        return;
    q->done = true;
    char tail[16];
    int n = tokenizer_stream_flush(&q->ds, tail, sizeof tail);
    bool stopped = false;
    size_t m = 0, cap = q->stop.max_len + q->stop.held_len + sizeof tail + 8;
    char *out = malloc(cap);
    /* a constrained answer that ended by its grammar keeps its held-back bytes: they are part of it */
    if (out && (why != SCHED_STOP || (q->gm && !q->stop_hit))) {
        if (n > 0)
            m = stop_matcher_feed(&q->stop, tail, (size_t)n, out, cap, &stopped);
        if (!stopped)
            m += stop_matcher_flush(&q->stop, out + m, cap - m);
        choice_append_tail(r, c, out, m);
    }
    free(out);
    /* checked before the choice says "stop", so no reader ever sees an invalid answer finish normally */
    char verr[ERR_MSG_MAX];
    if (why == SCHED_STOP && r->constraint && constraint_check(r, c, verr)) {
        char msg[256];
        snprintf(msg, sizeof msg, "structured output: choice %d failed validation: %.180s", c, verr);
        log_error("scheduler: request %llu: %s", (unsigned long long)r->id, msg);
        req_finish(s, r, ERR_INTERNAL, msg);
        return;
    }
    pthread_mutex_lock(&r->st->mu);
    r->st->choices[c].finish = why;
    r->st->version++;
    pthread_mutex_unlock(&r->st->mu);
    seq_release_slot(s, q);
    if (++r->st->n_done == r->n_choices)
        req_finish(s, r, 0, NULL);
}

/* Builds the engine-side state of a request when it is first seen. */
static int req_prepare(struct scheduler *s, struct sched_req *r)
{
    r->st->seqs = calloc((size_t)r->n_choices, sizeof *r->st->seqs);
    if (!r->st->seqs)
        return ERR_NOMEM;
    for (int i = 0; i < r->n_choices; i++)
        r->st->seqs[i].slot = -1;
    if (r->constraint && !s->trie) {
        char err[ERR_MSG_MAX];
        s->trie = token_trie_create(s->tok, err);
        s->mask = s->trie ? malloc(((size_t)token_trie_n_vocab(s->trie) + 31) / 32 * sizeof *s->mask) : NULL;
        if (!s->mask) {
            token_trie_destroy(s->trie);
            s->trie = NULL;
            return ERR_NOMEM;
        }
    }
    for (int i = 0; i < r->n_choices; i++) {
        struct sched_seq *q = &r->st->seqs[i];
        q->cap_toks = r->n_prompt + (r->max_tokens < 4096 ? r->max_tokens : 4096) + 1;
        q->toks = malloc((size_t)q->cap_toks * sizeof *q->toks);
        struct sampler_params sp = r->sp;
        sp.seed = r->sp.seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL; /* distinct choices, reproducible */
        q->smp = sampler_create(&sp, s->n_vocab);
        if (!q->toks || !q->smp || stop_matcher_init(&q->stop, (const char *const *)r->stop, r->n_stop))
            return ERR_NOMEM;
        memcpy(q->toks, r->prompt, (size_t)r->n_prompt * sizeof *q->toks);
        q->n_toks = r->n_prompt;
        for (int k = 0; k < r->n_prompt; k++)
            sampler_accept(q->smp, r->prompt[k]);
        q->follower_waiting = i > 0;
        char err[ERR_MSG_MAX];
        if (r->constraint && !(q->gm = grammar_matcher_create(grammar_entry_grammar(r->constraint), s->trie, err)))
            return ERR_NOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------- admission */

static int64_t kv_available(struct scheduler *s)
{
    return kv_pool_free_blocks(engine_kv(s->e)) + (s->pc ? prefix_cache_evictable(s->pc) : 0);
}

static int blocks_for(struct scheduler *s, int n_pos)
{
    int bs = engine_params_get(s->e)->block_size;
    return (n_pos + bs - 1) / bs;
}

/* Tries to admit the head of the wait queue. Returns true when admitted. */
static bool try_admit(struct scheduler *s, struct sched_req *r)
{
    int active = 0;
    for (int i = 0; i < r->n_choices; i++)
        active += !r->st->seqs[i].done;
    if (s->n_free_slots < active)
        return false;
    /* the admission limit (a latency controller's) holds back admissions, never an empty batch, so a
     * request with more choices than the limit still runs */
    int used = s->max_seqs - s->n_free_slots;
    if (used > 0 && used + active > atomic_load(&s->max_running))
        return false;
    /* attach cached prefixes, then check the blocks the prompts still need (+1 per sequence for its
     * first decode) fit in what is free or reclaimable */
    int k = 0;
    int64_t need = 0;
    int cached_leader = 0;
    for (int i = 0; i < r->n_choices; i++) {
        struct sched_seq *q = &r->st->seqs[i];
        if (q->done)
            continue;
        q->slot = s->free_slots[s->n_free_slots - 1 - k];
        k++;
        q->n_kv = 0;
        q->d_n = 0; /* a free slot's draft KV is empty (seq_release_slot) */
        q->pcur = (struct prefix_cursor){0};
        if (q->follower_waiting) {
            need += 1; /* its own copy of the leader's last prompt block */
            continue;
        }
        if (s->pc && !r->prompt_logprobs) {
            int got = prefix_cache_attach(s->pc, q->toks, q->n_toks, q->n_toks - 1, engine_seq(s->e, q->slot), &q->pcur);
            if (got > 0)
                q->n_kv = got;
            if (i == 0)
                cached_leader = got > 0 ? got : 0;
        }
        need += kv_seq_blocks_needed(engine_kv(s->e), engine_seq(s->e, q->slot), q->n_toks + 1);
    }
    /* keep a block of headroom per running sequence, so an admission does not force a preemption at the
     * very next decode step */
    int64_t headroom = 0;
    for (int i = 0; i < s->n_running; i++)
        for (int c = 0; c < s->running[i]->n_choices; c++)
            headroom += !s->running[i]->st->seqs[c].done;
    if (need + headroom > kv_available(s)) {
        for (int i = 0; i < r->n_choices; i++) {
            struct sched_seq *q = &r->st->seqs[i];
            if (q->slot >= 0) {
                engine_seq_truncate(s->e, q->slot, 0);
                q->slot = -1;
                q->n_kv = 0;
                q->pcur = (struct prefix_cursor){0};
            }
        }
        return false;
    }
    s->n_free_slots -= k;
    for (int i = 0; i < r->n_choices; i++)
        if (r->st->seqs[i].slot >= 0) {
            s->slot_req[r->st->seqs[i].slot] = r;
            s->slot_choice[r->st->seqs[i].slot] = i;
        }
    r->st->state = RS_RUNNING;
    r->st->admit_order = ++s->admit_counter;
    s->running[s->n_running++] = r;
    int64_t now = clock_now_ns();
    if (!r->st->counted) {
        r->st->counted = true;
        pthread_mutex_lock(&r->st->mu);
        r->st->t_admitted = now;
        r->st->cached_tokens = cached_leader;
        pthread_mutex_unlock(&r->st->mu);
        obs_time(s, SCHED_TIM_QUEUE, r->t_arrival, now);
        obs_count(s, SCHED_CTR_PROMPT_TOKENS, r->n_prompt);
        if (s->pc) {
            obs_count(s, SCHED_CTR_PREFIX_QUERIES, 1);
            if (cached_leader > 0) {
                obs_count(s, SCHED_CTR_PREFIX_HITS, 1);
                obs_count(s, SCHED_CTR_PREFIX_HIT_TOKENS, cached_leader);
            }
        }
    }
    return true;
}

/* Where r goes in the wait queue: behind every request of its priority or a more urgent one (ahead: in
 * front of those of its own priority, for a preempted request). */
static int waiting_pos(const struct scheduler *s, const struct sched_req *r, bool ahead)
{
    int i = 0;
    while (i < s->n_waiting &&
           (ahead ? s->waiting[i]->priority < r->priority : s->waiting[i]->priority <= r->priority))
        i++;
    return i;
}

/* Frees the slots of running request idx and puts it back in the wait queue ahead of the requests of its
 * priority that arrived after it. false when the wait queue cannot grow (out of memory). */
static bool preempt_at(struct scheduler *s, int idx)
{
    if (s->n_waiting == s->cap_waiting) {
        struct sched_req **nw = realloc(s->waiting, (size_t)s->cap_waiting * 2 * sizeof *nw);
        if (!nw)
            return false;
        s->waiting = nw;
        s->cap_waiting *= 2;
    }
    struct sched_req *v = s->running[idx];
    for (int i = 0; i < v->n_choices; i++)
        seq_release_slot(s, &v->st->seqs[i]);
    memmove(&s->running[idx], &s->running[idx + 1], (size_t)(s->n_running - idx - 1) * sizeof *s->running);
    s->n_running--;
    v->st->state = RS_QUEUED;
    int at = waiting_pos(s, v, true);
    memmove(&s->waiting[at + 1], &s->waiting[at], (size_t)(s->n_waiting - at) * sizeof *s->waiting);
    s->waiting[at] = v;
    s->n_waiting++;
    queued_add(s, v, 1);
    pthread_mutex_lock(&v->st->mu);
    v->st->preemptions++;
    pthread_mutex_unlock(&v->st->mu);
    obs_count(s, SCHED_CTR_PREEMPTIONS, 1);
    log_debug("scheduler: preempted request %llu (priority %d)", (unsigned long long)v->id, v->priority);
    return true;
}

/* The most recently admitted running request less urgent than r, or -1. */
static int preemptible_for(const struct scheduler *s, const struct sched_req *r)
{
    int best = -1;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->priority > r->priority &&
            (best < 0 || s->running[i]->st->admit_order > s->running[best]->st->admit_order))
            best = i;
    return best;
}

static void admit(struct scheduler *s)
{
    while (s->n_waiting > 0) {
        struct sched_req *r = s->waiting[0];
        int active = 0;
        for (int i = 0; i < r->n_choices; i++)
            active += !r->st->seqs[i].done;
        /* A request that can never fit is refused instead of blocking the queue forever. */
        int64_t need_alone = 0;
        for (int i = 0; i < r->n_choices; i++)
            if (!r->st->seqs[i].done)
                need_alone += blocks_for(s, r->st->seqs[i].n_toks + 1);
        if (active > s->max_seqs) {
            char msg[128];
            snprintf(msg, sizeof msg, "n = %d choices exceed the server's max batch size %d", active, s->max_seqs);
            req_finish(s, r, ERR_INVALID_ARG, msg);
            continue;
        }
        if (s->n_running == 0 && need_alone > s->kv_total) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "the KV cache (%lld blocks) cannot hold this request (%lld blocks); raise --kv-memory or "
                     "lower the prompt length, max_tokens or n", (long long)s->kv_total, (long long)need_alone);
            req_finish(s, r, ERR_NO_SPACE, msg);
            continue;
        }
        if (!try_admit(s, r)) {
            /* a more urgent request takes the slot and KV of a less urgent one */
            int v = preemptible_for(s, r);
            if (v < 0 || !preempt_at(s, v))
                return;
            continue; /* r is still first: the preempted one went behind it */
        }
        memmove(&s->waiting[0], &s->waiting[1], (size_t)(s->n_waiting - 1) * sizeof *s->waiting);
        s->n_waiting--;
        queued_add(s, r, -1);
    }
}

/* Frees the slots of the most recently admitted running request of the least urgent priority (a batch
 * request before any live one) and puts it back in the wait queue, ahead of everything of its priority
 * that arrived after it. When the wait queue cannot grow, that request is finished with ERR_NOMEM instead. */
static bool preempt_last(struct scheduler *s)
{
    int v = s->n_running - 1;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->priority > s->running[v]->priority ||
            (s->running[i]->priority == s->running[v]->priority &&
             s->running[i]->st->admit_order > s->running[v]->st->admit_order))
            v = i;
    if (preempt_at(s, v))
        return true;
    req_finish(s, s->running[v], ERR_NOMEM, "out of memory preempting the request");
    return false;
}

/* ---------------------------------------------------------------- one step */

/* Followers join once their leader holds the prompt but its last token. */
static int join_followers(struct scheduler *s, struct sched_req *r)
{
    struct sched_seq *lead = &r->st->seqs[0];
    if (lead->slot < 0 || lead->n_kv < r->n_prompt - 1)
        return 0;
    for (int i = 1; i < r->n_choices; i++) {
        struct sched_seq *q = &r->st->seqs[i];
        if (!q->follower_waiting || q->slot < 0)
            continue;
        int rc = kv_seq_share(engine_kv(s->e), engine_seq(s->e, q->slot), engine_seq(s->e, lead->slot),
                              r->n_prompt - 1);
        if (rc)
            return rc;
        q->n_kv = r->n_prompt - 1;
        q->follower_waiting = false;
    }
    return 0;
}

static int argmax_row(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Drops the draft model's KV past the sequence's verified tokens (drafts, maybe rejected). */
static void draft_kv_sync(struct scheduler *s, struct sched_seq *q)
{
    if (s->de && q->slot >= 0 && q->d_n > q->n_kv) {
        q->d_n = q->n_kv;
        engine_seq_truncate(s->de, q->slot, q->d_n);
    }
}

/* Records that a drafting pass of the draft model took ns: a moving average that follows the lower edge of
 * the measures, as spec_cost_record's (other work on the machine only adds time). */
static void draft_pass_record(struct scheduler *s, double ns)
{
    double e = s->draft_pass_ns, w = ns < e ? 0.5 : 0.1;
    s->draft_pass_ns = e > 0 ? e * (1 - w) + ns * w : ns;
}

/* Runs the draft model for the step's candidates whose draft comes from it (step_from_model, k > 0): its
 * KV first catches up with each sequence's tokens, the pending one included (several passes when that is
 * more than a pass holds: a new sequence's prompt), then one pass per further drafted token, one token
 * per sequence; each drafted token is the draft model's most likely next one (so the draft is one token
 * with certainty, as lookups are: speculation stays exact, sampling included). A failed pass (the draft's
 * KV pool full) leaves these candidates without a draft this step. */
static void draft_model_run(struct scheduler *s, int n_cand)
{
    struct batch *b = &s->dbatch;
    int dmax = s->p.draft_max, kmax = 0;
    int rows[SCHED_MAX_SLOTS]; /* candidate of each logits row of a pass */
    char err[ERR_MSG_MAX];
    for (int i = 0; i < n_cand; i++)
        if (s->cand_seq[i]->step_from_model && s->cand[i].k > 0) {
            draft_kv_sync(s, s->cand_seq[i]);
            if (s->cand[i].k > kmax)
                kmax = s->cand[i].k;
        }
    if (!kmax)
        return;
    for (;;) { /* catch up, then the first drafted token */
        batch_clear(b);
        int n_rows = 0;
        for (int i = 0; i < n_cand; i++) {
            struct sched_seq *q = s->cand_seq[i];
            q->d_feed = 0;
            if (!q->step_from_model || !s->cand[i].k)
                continue;
            while (q->d_n + q->d_feed < q->n_toks && b->n < b->cap) {
                int pos = q->d_n + q->d_feed++;
                batch_add(b, q->toks[pos], pos, q->slot, pos == q->n_toks - 1);
                if (pos == q->n_toks - 1)
                    rows[n_rows++] = i;
            }
        }
        if (!b->n)
            break;
        int64_t t0 = clock_now_ns();
        if (engine_forward(s->de, b, s->dlogits, err))
            goto fail;
        if (b->n <= 2 * n_rows) /* at most two tokens a sequence: as long as a drafting pass */
            draft_pass_record(s, (double)(clock_now_ns() - t0));
        for (int i = 0; i < n_cand; i++)
            s->cand_seq[i]->d_n += s->cand_seq[i]->d_feed;
        for (int r = 0; r < n_rows; r++)
            s->draft[(size_t)s->cand_seq[rows[r]]->slot * (size_t)dmax] =
                argmax_row(s->dlogits + (size_t)r * (size_t)s->n_vocab, s->n_vocab);
    }
    for (int j = 1; j < kmax; j++) {
        batch_clear(b);
        int n_rows = 0;
        for (int i = 0; i < n_cand; i++) {
            struct sched_seq *q = s->cand_seq[i];
            if (!q->step_from_model || s->cand[i].k <= j)
                continue;
            int32_t *d = s->draft + (size_t)q->slot * (size_t)dmax;
            batch_add(b, d[j - 1], q->n_toks + j - 1, q->slot, true);
            rows[n_rows++] = i;
        }
        int64_t t0 = clock_now_ns();
        if (engine_forward(s->de, b, s->dlogits, err))
            goto fail;
        draft_pass_record(s, (double)(clock_now_ns() - t0));
        for (int r = 0; r < n_rows; r++) {
            struct sched_seq *q = s->cand_seq[rows[r]];
            q->d_n++;
            s->draft[(size_t)q->slot * (size_t)dmax + (size_t)j] =
                argmax_row(s->dlogits + (size_t)r * (size_t)s->n_vocab, s->n_vocab);
        }
    }
    return;
fail:
    if (!s->draft_warned) /* once: a KV pool too small would fail every step */
        log_warn("speculation: a pass of the draft model failed (%s); no drafts from it in such steps", err);
    s->draft_warned = true;
    for (int i = 0; i < n_cand; i++)
        if (s->cand_seq[i]->step_from_model)
            s->cand[i].k = 0;
}

/* Drafts for the n_dec decoding sequences of a step without prompt work: each one's draft (its prediction,
 * else n-gram lookup or the draft model, as the request says) goes to s->draft[slot], and spec_plan sets
 * how many of those tokens each verifies (step_draft); the draft model then drafts just those. */
static void plan_drafts(struct scheduler *s, int n_dec)
{
    int dmax = s->p.draft_max;
    if (s->p.draft_adaptive && !spec_cost_curve(&s->cost, n_dec + s->spec_rows, s->cost_curve))
        return; /* nothing measured yet: the first pass is plain */
    int n_cand = 0;
    for (int i = 0; i < s->n_running; i++) {
        struct sched_req *r = s->running[i];
        int src = r->spec < 0 ? (int)s->p.spec : r->spec;
        bool ngram = src == SCHED_SPEC_NGRAM, model = src == SCHED_SPEC_DRAFT && s->de;
        if ((!ngram && !model && !r->n_prediction) || r->constraint)
            continue; /* structured output is not speculated: a draft row's mask needs the grammar's state
                         after the drafts before it */
        for (int c = 0; c < r->n_choices; c++) {
            struct sched_seq *q = &r->st->seqs[c];
            if (q->done || q->slot < 0 || q->follower_waiting || q->n_toks - q->n_kv != 1)
                continue;
            /* room: the tokens max_tokens and the context still allow after the pending one's successor */
            int room = dmax;
            if (room > r->max_tokens - q->n_gen - 1)
                room = r->max_tokens - q->n_gen - 1;
            if (room > s->n_ctx - 1 - q->n_kv)
                room = s->n_ctx - 1 - q->n_kv;
            if (room <= 0)
                continue;
            int32_t *d = s->draft + (size_t)q->slot * (size_t)dmax;
            int n = 0;
            if (r->n_prediction)
                n = spec_draft_prediction(r->prediction, r->n_prediction, q->toks + r->n_prompt,
                                          q->n_toks - r->n_prompt, &q->pred_cursor, d, room);
            q->step_from_pred = n > 0;
            q->step_from_model = false;
            if (!n && ngram)
                n = spec_draft_ngram(q->toks, q->n_toks, SCHED_NGRAM_MIN, SCHED_NGRAM_MAX, d, room);
            if (!n && model) { /* drafted after the plan, as many as it takes; fed at n_toks.. n_toks + n - 2 */
                n = room < s->de_ctx - q->n_toks + 1 ? room : s->de_ctx - q->n_toks + 1;
                q->step_from_model = n > 0;
            }
            if (n <= 0)
                continue;
            s->cand[n_cand] = (struct spec_cand){.alpha = spec_accept_rate(&q->acc, q->step_from_pred ? SCHED_PRIOR_PRED
                                                                                               : SCHED_PRIOR),
                                                 .cap = n,
                                                 .probe = q->spec_idle >= SCHED_PROBE_EVERY,
                                                 .tok_ns = q->step_from_model ? s->draft_pass_ns : 0};
            s->cand_seq[n_cand++] = q;
        }
    }
    if (!n_cand)
        return;
    uint64_t now = atomic_load(&s->st_steps);
    if (s->p.draft_adaptive && (!(s->cost.ns[n_dec + 1] > 0) || now - s->cost_at[n_dec + 1] > SCHED_COST_REFRESH)) {
        /* a pass of one token more than n_dec decodes was never timed, or not for a while: the likeliest
         * candidate verifies a draft of draft_min (at least 1) tokens, so the plan has a measured cost to go
         * by. The refresh keeps one unlucky measure (a pass another process slowed) from turning
         * speculation off for good: the plan would never pick that size again to measure it anew. */
        int best = 0, k = s->p.draft_min > 1 ? s->p.draft_min : 1;
        for (int i = 1; i < n_cand; i++)
            if (s->cand[i].alpha > s->cand[best].alpha)
                best = i;
        for (int i = 0; i < n_cand; i++)
            s->cand[i].k = i == best && s->cand[i].cap >= k && k <= s->spec_rows ? k : 0;
    } else if (s->p.draft_adaptive) {
        spec_plan(s->cost_curve, n_dec, s->cand, n_cand, s->spec_rows, s->p.draft_min);
    } else { /* every draft whole, in admission order while the step's room lasts */
        int left = s->spec_rows;
        for (int i = 0; i < n_cand; i++) {
            int k = s->cand[i].cap < left ? s->cand[i].cap : left;
            s->cand[i].k = k >= s->p.draft_min ? k : 0;
            left -= s->cand[i].k;
        }
    }
    if (s->de)
        draft_model_run(s, n_cand);
    for (int i = 0; i < n_cand; i++) {
        struct sched_seq *q = s->cand_seq[i];
        q->step_draft = s->cand[i].k;
        q->spec_idle = q->step_draft ? 0 : q->spec_idle + 1;
    }
    if (log_level_get() >= LOG_DEBUG && s->p.draft_adaptive && s->cost.ns[n_dec + 1] > 0)
        log_debug("speculation: %d decodes, first candidate: acceptance %.2f, %d drafted at hand, %d verified; "
                  "pass cost of %d, %d, %d tokens: 1, %.2f, %.2f", n_dec, s->cand[0].alpha, s->cand[0].cap,
                  s->cand[0].k, n_dec, n_dec + 1, n_dec + 4, s->cost_curve[n_dec + 1] / s->cost_curve[n_dec],
                  s->cost_curve[n_dec + 4] / s->cost_curve[n_dec]);
}

/* Plans the step into s->batch, with drafts when allow_spec. Returns the KV blocks it needs. */
static int64_t plan_step(struct scheduler *s, bool allow_spec)
{
    batch_clear(&s->batch);
    int64_t need = 0;
    struct kv_pool *pool = engine_kv(s->e);
    int n_dec = 0;
    bool prompt_work = false;
    for (int i = 0; i < s->n_running; i++) {
        struct sched_req *r = s->running[i];
        for (int c = 0; c < r->n_choices; c++) {
            struct sched_seq *q = &r->st->seqs[c];
            q->step_take = 0;
            q->step_logits = false;
            q->step_draft = 0;
            if (q->done || q->slot < 0 || q->follower_waiting)
                continue;
            n_dec += q->n_toks - q->n_kv == 1;
            prompt_work |= q->n_toks - q->n_kv > 1;
        }
    }
    /* speculation only in steps of decodes alone: a prompt chunk makes the pass compute-bound already */
    s->step_drafts = 0;
    s->step_decode_only = !prompt_work;
    if (allow_spec && s->p.draft_max > 0 && n_dec > 0 && !prompt_work)
        plan_drafts(s, n_dec);
    /* decodes first: every sequence with exactly one token to feed, then its drafted tokens */
    for (int i = 0; i < s->n_running; i++) {
        struct sched_req *r = s->running[i];
        for (int c = 0; c < r->n_choices; c++) {
            struct sched_seq *q = &r->st->seqs[c];
            if (q->done || q->slot < 0 || q->follower_waiting || q->n_toks - q->n_kv != 1)
                continue;
            batch_add(&s->batch, q->toks[q->n_kv], q->n_kv, q->slot, true);
            for (int j = 0; j < q->step_draft; j++)
                batch_add(&s->batch, s->draft[(size_t)q->slot * (size_t)s->p.draft_max + (size_t)j], q->n_kv + 1 + j,
                          q->slot, true);
            q->step_take = 1 + q->step_draft;
            q->step_logits = true;
            s->step_drafts += q->step_draft;
            need += kv_seq_blocks_needed(pool, engine_seq(s->e, q->slot), q->n_kv + q->step_take);
        }
    }
    /* then prompt chunks in admission order */
    int budget = atomic_load(&s->prefill_budget);
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct sched_req *r = s->running[i];
        bool has_waiting_followers = false;
        for (int c = 1; c < r->n_choices; c++)
            has_waiting_followers |= r->st->seqs[c].follower_waiting && !r->st->seqs[c].done;
        for (int c = 0; c < r->n_choices && budget > 0; c++) {
            struct sched_seq *q = &r->st->seqs[c];
            int remaining = q->n_toks - q->n_kv;
            if (q->done || q->slot < 0 || q->follower_waiting || remaining <= 1)
                continue;
            int limit = remaining;
            if (c == 0 && has_waiting_followers)
                limit = r->n_prompt - 1 - q->n_kv; /* stop before the last prompt token */
            if (limit <= 0)
                continue;
            int take = limit < budget ? limit : budget;
            bool score = r->prompt_logprobs && c == 0;
            if (score) { /* a logits row per prompt position still to score: as many as the rows left */
                int rows = 0;
                for (int b = 0; b < s->batch.n; b++)
                    rows += s->batch.tok[b].logits;
                if (take > s->max_rows - rows)
                    take = s->max_rows - rows;
                if (take <= 0)
                    continue;
            }
            for (int k = 0; k < take; k++) {
                int pos = q->n_kv + k;
                bool scored = score && pos < r->n_prompt - 1 && pos >= r->st->choices[0].n_ptoks;
                batch_add(&s->batch, q->toks[pos], pos, q->slot, pos == q->n_toks - 1 || scored);
            }
            q->step_take = take;
            q->step_logits = q->n_kv + take == q->n_toks;
            budget -= take;
            need += kv_seq_blocks_needed(pool, engine_seq(s->e, q->slot), q->n_kv + take);
        }
    }
    return need;
}

/* Sets the logits of every token the choice's grammar does not allow next to -inf. ERR_INTERNAL
 * when nothing is allowed (a matcher that is not done always allows something: a bug, never free output). */
static int constraint_mask(struct scheduler *s, struct sched_seq *q, float *logits)
{
    if (grammar_matcher_mask(q->gm, s->mask))
        return ERR_NOMEM;
    int n = token_trie_n_vocab(s->trie);
    bool any = false;
    for (int w = 0; w < (n + 31) / 32; w++) {
        uint32_t bits = s->mask[w];
        any |= bits != 0;
        if (bits == 0xffffffffu)
            continue;
        int end = w * 32 + 32 < n ? w * 32 + 32 : n;
        for (int i = w * 32; i < end; i++)
            if (!(bits >> (i - w * 32) & 1))
                logits[i] = -INFINITY;
    }
    for (int i = n; i < s->n_vocab; i++) /* model rows past the tokenizer's vocabulary */
        logits[i] = -INFINITY;
    return any ? 0 : ERR_INTERNAL;
}

/* Scores prompt token pos + 1 of request r (prompt_logprobs) from the logits at pos, into choice 0's ptoks.
 * A position scored before (the request was preempted and its prompt is recomputed) is skipped. */
static int prompt_score(struct scheduler *s, struct sched_req *r, int pos, const float *logits)
{
    struct sched_choice *ch = &r->st->choices[0];
    struct sched_seq *q = &r->st->seqs[0];
    if (pos != ch->n_ptoks)
        return 0;
    int n_top = r->n_logprobs > 0 ? r->n_logprobs : 0;
    int32_t tok = r->prompt[pos + 1];
    float lp = sampler_score(q->smp, logits, tok, n_top ? s->top_buf : NULL, n_top);
    int rc = 0;
    pthread_mutex_lock(&r->st->mu);
    if (ch->n_ptoks == ch->cap_ptoks) {
        int cap = ch->cap_ptoks ? ch->cap_ptoks * 2 : 64;
        struct sched_token *nt = realloc(ch->ptoks, (size_t)cap * sizeof *nt);
        if (!nt) {
            rc = ERR_NOMEM;
            goto out;
        }
        ch->ptoks = nt;
        ch->cap_ptoks = cap;
    }
    int32_t top_off;
    if ((rc = choice_top_append(ch, s->top_buf, n_top, &top_off)))
        goto out;
    ch->ptoks[ch->n_ptoks++] = (struct sched_token){.id = tok, .logprob = lp, .top_off = top_off};
    r->st->version++;
out:
    pthread_mutex_unlock(&r->st->mu);
    return rc;
}

/* Samples choice c's next token from logits (*out gets it) and appends it: end of generation, stop strings
 * and limits finish the choice. */
static int sample_seq(struct scheduler *s, struct sched_req *r, int c, float *logits, int32_t *out)
{
    struct sched_seq *q = &r->st->seqs[c];
    int n_top = r->n_logprobs > 0 ? r->n_logprobs : 0;
    float lp = 0;
    for (int i = 0; i < r->n_logit_bias; i++) /* before the mask: a bias never lifts a token it forbids */
        if (r->logit_bias[i].token < s->n_vocab)
            logits[r->logit_bias[i].token] += r->logit_bias[i].bias;
    if (q->gm) {
        int rc = constraint_mask(s, q, logits);
        if (rc)
            return rc;
    }
    int32_t t = sampler_sample(q->smp, logits, r->n_logprobs >= 0 ? &lp : NULL, n_top ? s->top_buf : NULL, n_top);
    *out = t;
    int64_t now = clock_now_ns();
    bool first_of_req;
    pthread_mutex_lock(&r->st->mu);
    first_of_req = r->st->t_first_token == 0;
    if (first_of_req)
        r->st->t_first_token = now;
    pthread_mutex_unlock(&r->st->mu);
    if (first_of_req)
        obs_time(s, SCHED_TIM_TTFT, r->t_arrival, now);
    else if (q->t_last)
        obs_time(s, SCHED_TIM_ITL, q->t_last, now);
    q->t_last = now;
    if (q->gm && grammar_matcher_accept(q->gm, t))
        return ERR_INTERNAL;
    if ((!r->ignore_eos || q->gm) && tokenizer_is_eog(s->tok, t)) {
        seq_finish(s, r, c, SCHED_STOP);
        return 0;
    }
    sampler_accept(q->smp, t);
    int rc = seq_push_token(q, t);
    if (rc)
        return rc;
    q->n_gen++;
    obs_count(s, SCHED_CTR_GENERATED_TOKENS, 1);
    int n = tokenizer_stream_push(s->tok, &q->ds, t, false, s->piece, s->piece_cap);
    if (n > s->piece_cap) {
        char *np = realloc(s->piece, (size_t)n);
        if (!np)
            return ERR_NOMEM;
        s->piece = np;
        s->piece_cap = n;
        n = tokenizer_stream_push(s->tok, &q->ds, t, false, s->piece, s->piece_cap);
    }
    if (n < 0)
        n = 0;
    size_t need = (size_t)n + q->stop.max_len + 8;
    if (need > (size_t)s->textbuf_cap) {
        char *nb = realloc(s->textbuf, need);
        if (!nb)
            return ERR_NOMEM;
        s->textbuf = nb;
        s->textbuf_cap = (int)need;
    }
    bool stopped = false;
    size_t m = stop_matcher_feed(&q->stop, s->piece, (size_t)n, s->textbuf, (size_t)s->textbuf_cap, &stopped);
    rc = choice_append(r, c, t, s->textbuf, m, lp, n_top ? s->top_buf : NULL, n_top);
    s->dirty = true;
    if (rc)
        return rc;
    q->stop_hit = stopped;
    if (stopped || (q->gm && grammar_matcher_is_done(q->gm)))
        seq_finish(s, r, c, SCHED_STOP);
    else if (q->n_gen >= r->max_tokens || q->n_toks >= s->n_ctx) /* prompt + completion <= context */
        seq_finish(s, r, c, SCHED_LENGTH);
    return 0;
}

/* Counts a verify's drafted tokens (drafted > 0, once per verify) or one more accepted one, in the request
 * and for the observer. Called before the sampling that could finish the request, so whoever sees it
 * finished sees its counts whole. */
static void spec_count(struct scheduler *s, struct sched_req *r, const struct sched_seq *q, int drafted, int accepted)
{
    if (drafted) {
        obs_count(s, SCHED_CTR_SPEC_DRAFTS, 1);
        obs_count(s, SCHED_CTR_SPEC_DRAFT_TOKENS, drafted);
    }
    if (accepted) {
        obs_count(s, SCHED_CTR_SPEC_ACCEPTED_TOKENS, accepted);
        if (q->step_accepted <= SCHED_SPEC_POS_MAX)
            obs_count(s, (enum sched_counter)(SCHED_CTR_SPEC_ACCEPTED_POS + q->step_accepted - 1), 1);
    }
    pthread_mutex_lock(&r->st->mu);
    r->st->draft_tokens += drafted;
    r->st->accepted_tokens += accepted;
    if (q->step_from_pred) {
        r->st->pred_draft_tokens += drafted;
        r->st->pred_accepted_tokens += accepted;
    }
    pthread_mutex_unlock(&r->st->mu);
}

/* After a sequence's verify: drops the KV of its rejected drafted tokens, updates its acceptance estimate
 * and its prediction cursor. */
static void spec_finish_verify(struct scheduler *s, struct sched_seq *q)
{
    int a = q->step_accepted;
    if (q->slot >= 0)
        engine_seq_truncate(s->e, q->slot, q->n_kv);
    draft_kv_sync(s, q);
    spec_accept_update(&q->acc, a, q->step_rejected);
    if (q->step_from_pred)
        q->pred_cursor += a;
    q->step_draft = 0;
}

/* Runs one step; returns true when work was done. */
static bool step(struct scheduler *s)
{
    struct kv_pool *pool = engine_kv(s->e);
    for (int i = 0; i < s->n_running; i++)
        if (join_followers(s, s->running[i]))
            req_finish(s, s->running[i--], ERR_NOMEM, "out of memory sharing the prompt");
    int64_t need;
    bool allow_spec = true;
    for (;;) {
        need = plan_step(s, allow_spec);
        int64_t free_b = kv_pool_free_blocks(pool);
        if (need <= free_b)
            break;
        if (s->step_drafts > 0) { /* drafts never cost an eviction or a preemption */
            allow_spec = false;
            continue;
        }
        if (s->pc && prefix_cache_evict(s->pc, need - free_b) >= need - free_b)
            continue;
        if (s->n_running > 1) {
            preempt_last(s);
            continue;
        }
        if (s->n_running == 1) {
            req_finish(s, s->running[0], ERR_NO_SPACE,
                       "the KV cache is too small for this request; raise --kv-memory or lower max_tokens");
            continue;
        }
        break;
    }
    if (s->batch.n == 0)
        return false;
    char err[ERR_MSG_MAX];
    int64_t t0 = clock_now_ns();
    int rc = engine_forward(s->e, &s->batch, s->logits, err);
    if (!rc && s->step_decode_only) { /* the cost curve is of passes whose every token has logits */
        spec_cost_record(&s->cost, s->batch.n, (double)(clock_now_ns() - t0));
        if (s->batch.n <= s->cost.n)
            s->cost_at[s->batch.n] = atomic_load(&s->st_steps);
    }
    atomic_fetch_add(&s->st_steps, 1);
    obs_count(s, SCHED_CTR_ENGINE_STEPS, 1);
    if (rc) {
        /* Should not happen (the plan respects every engine rule): fail the requests of this step. */
        log_error("scheduler: engine_forward failed: %s", err);
        for (int i = 0; i < s->n_running; i++) {
            struct sched_req *r = s->running[i];
            bool in_step = false;
            for (int c = 0; c < r->n_choices; c++)
                in_step |= r->st->seqs[c].step_take > 0;
            if (in_step)
                req_finish(s, r, ERR_INTERNAL, err), i--;
        }
        return true;
    }
    /* Account the step (drafted tokens count once verified), then sample in batch order (rows follow the
     * batch's logits tokens). The list of rows is taken before sampling, since finishing a request
     * reshuffles s->running. */
    int n_rows = 0;
    for (int i = 0; i < s->n_running; i++) {
        struct sched_req *r = s->running[i];
        for (int c = 0; c < r->n_choices; c++) {
            struct sched_seq *q = &r->st->seqs[c];
            if (!q->step_take)
                continue;
            q->n_kv += q->step_take - q->step_draft;
            q->step_row = 0;
            q->step_accepted = 0;
            q->step_rejected = false;
            if (s->pc)
                prefix_cache_insert(s->pc, q->toks, q->n_kv, engine_seq(s->e, q->slot), &q->pcur);
        }
    }
    /* logits rows follow the batch's logits tokens; each row's request is pinned, since finishing one
     * choice may end its request and drop the scheduler's reference while later rows still name it */
    for (int b = 0; b < s->batch.n; b++) {
        if (!s->batch.tok[b].logits)
            continue;
        int slot = s->batch.tok[b].seq;
        s->row_req[n_rows] = s->slot_req[slot];
        s->row_choice[n_rows] = s->slot_choice[slot];
        s->row_first[n_rows] = b == 0 || s->batch.tok[b - 1].seq != slot;
        s->row_pos[n_rows] = s->batch.tok[b].pos;
        sched_req_ref(s->row_req[n_rows]);
        n_rows++;
    }
    for (int k = 0; k < n_rows; k++) {
        struct sched_req *r = s->row_req[k];
        struct sched_seq *q = &r->st->seqs[s->row_choice[k]];
        if (r->st->state != RS_RUNNING || q->done || q->step_rejected)
            continue;
        if (r->prompt_logprobs && s->row_choice[k] == 0 && s->row_pos[k] < r->n_prompt - 1) {
            if (prompt_score(s, r, s->row_pos[k], s->logits + (size_t)k * (size_t)s->n_vocab))
                req_finish(s, r, ERR_NOMEM, "out of memory scoring the prompt");
            continue;
        }
        int j = q->step_row++; /* this row's index among the sequence's rows (drafts are sampled in order) */
        if (q->step_draft && j == 0)
            spec_count(s, r, q, q->step_draft, 0);
        int32_t t;
        int err2 = sample_seq(s, r, s->row_choice[k], s->logits + (size_t)k * (size_t)s->n_vocab, &t);
        if (err2) {
            if (err2 == ERR_INTERNAL && r->st->state != RS_DONE) /* only the grammar's checks say this */
                req_finish(s, r, ERR_INTERNAL, "structured output: the grammar and the sampled token disagree");
            else if (r->st->state != RS_DONE)
                req_finish(s, r, err2, "out of memory while sampling");
            continue;
        }
        if (q->step_draft && !q->done) {
            if (j < q->step_draft && t == s->draft[(size_t)q->slot * (size_t)s->p.draft_max + (size_t)j]) {
                q->n_kv++; /* the drafted token at this position is the one sampled: its KV stands */
                q->step_accepted++;
                spec_count(s, r, q, 0, 1);
            } else if (j < q->step_draft) {
                q->step_rejected = true;
            }
        }
    }
    for (int k = 0; k < n_rows; k++) {
        struct sched_req *r = s->row_req[k];
        struct sched_seq *q = &r->st->seqs[s->row_choice[k]];
        if (s->row_first[k] && q->step_draft)
            spec_finish_verify(s, q);
    }
    for (int k = 0; k < n_rows; k++)
        sched_req_unref(s->row_req[k]);
    return true;
}

/* Applies cancellations and deadlines to every queued and running request. */
static bool sweep_cancelled(struct scheduler *s)
{
    int64_t now = clock_now_ns();
    bool any = false;
    int all = atomic_load(&s->cancel_all);
    for (int pass = 0; pass < 2; pass++) {
        struct sched_req **list = pass ? s->running : s->waiting;
        int *n = pass ? &s->n_running : &s->n_waiting;
        for (int i = 0; i < *n; i++) {
            struct sched_req *r = list[i];
            int why = atomic_load(&r->st->cancel);
            if (!why && r->deadline && now >= r->deadline)
                why = ERR_TIMEOUT;
            if (!why && all)
                why = all;
            if (!why)
                continue;
            char msg[160];
            if (why == ERR_TIMEOUT)
                snprintf(msg, sizeof msg, "the request did not finish within its deadline (%.1f s, %s)",
                         (double)(r->deadline - r->t_arrival) / 1e9, pass ? "while running" : "while queued");
            else if (why == ERR_CANCELLED)
                snprintf(msg, sizeof msg, "the client went away; the request was cancelled");
            else
                snprintf(msg, sizeof msg, "the server is shutting down");
            req_finish(s, r, why, msg);
            i--;
            any = true;
        }
    }
    return any;
}

static void *engine_thread(void *arg)
{
    struct scheduler *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && s->n_inbox == 0 && s->n_running == 0 && s->n_waiting == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        bool stop = s->stop;
        /* take the inbox (swap buffers, so the lock is held for no work) */
        struct sched_req **in = s->inbox;
        int n_in = s->n_inbox;
        s->inbox = s->inbox_spare;
        s->inbox_spare = in;
        int cap_in = s->cap_inbox;
        s->cap_inbox = s->cap_spare;
        s->cap_spare = cap_in;
        s->n_inbox = 0;
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_in; i++) {
            struct sched_req *r = in[i];
            if (s->n_waiting == s->cap_waiting) {
                struct sched_req **nw = realloc(s->waiting, (size_t)s->cap_waiting * 2 * sizeof *nw);
                if (!nw) {
                    req_finish(s, r, ERR_NOMEM, "out of memory queueing the request");
                    continue;
                }
                s->waiting = nw;
                s->cap_waiting *= 2;
            }
            int at = waiting_pos(s, r, false);
            memmove(&s->waiting[at + 1], &s->waiting[at], (size_t)(s->n_waiting - at) * sizeof *s->waiting);
            s->waiting[at] = r;
            s->n_waiting++;
        }

        /* engine-side setup of new requests */
        for (int i = 0; i < s->n_waiting; i++) {
            struct sched_req *r = s->waiting[i];
            if (!r->st->seqs && req_prepare(s, r)) {
                req_finish(s, r, ERR_NOMEM, "out of memory preparing the request");
                i--;
            }
        }
        if (stop) {
            while (s->n_running)
                req_finish(s, s->running[0], ERR_UNAVAILABLE, "the server is shutting down");
            while (s->n_waiting)
                req_finish(s, s->waiting[0], ERR_UNAVAILABLE, "the server is shutting down");
            sched_stats_update(s);
            if (s->notify)
                s->notify(s->notify_ctx);
            break;
        }
        sweep_cancelled(s);
        admit(s);
        step(s);
        sched_stats_update(s);
        if (s->dirty && s->notify)
            s->notify(s->notify_ctx);
        s->dirty = false;
    }
    return NULL;
}

/* ---------------------------------------------------------------- public */

void sched_params_default(struct sched_params *p)
{
    p->max_batch_size = 16;
    p->max_queue = 64;
    p->prefill_chunk = 256;
    p->prefix_cache = true;
    p->spec = SCHED_SPEC_OFF;
    p->draft_max = 16;
    p->draft_min = 1;
    p->draft_adaptive = true;
    p->draft_engine = NULL;
}

/* 0 when the draft model d can draft for the target t: the same tokens with the same ids and the same
 * logits width. Else ERR_INVALID_ARG naming both vocabularies and the first difference. */
static int draft_vocab_check(const struct model *t, const struct model *d, char *err)
{
    const struct tokenizer *tt = t->tok, *dt = d->tok;
    int nt = tokenizer_n_vocab(tt), nd = tokenizer_n_vocab(dt);
    char diff[160] = "";
    if (strcmp(tokenizer_model_name(tt), tokenizer_model_name(dt)) || nt != nd)
        snprintf(diff, sizeof diff, "another tokenizer");
    else if (t->hp.n_vocab != d->hp.n_vocab)
        snprintf(diff, sizeof diff, "%d logits per token, the target %d", d->hp.n_vocab, t->hp.n_vocab);
    else if (tokenizer_bos(tt) != tokenizer_bos(dt) || tokenizer_eos(tt) != tokenizer_eos(dt))
        snprintf(diff, sizeof diff, "other BOS/EOS ids");
    for (int i = 0; !diff[0] && i < nt; i++) {
        const char *a = tokenizer_token_text(tt, i), *b = tokenizer_token_text(dt, i);
        if (strcmp(a ? a : "", b ? b : ""))
            snprintf(diff, sizeof diff, "token %d is '%.40s', the target's '%.40s'", i, b ? b : "", a ? a : "");
    }
    if (!diff[0])
        return 0;
    err_set(err, ERR_INVALID_ARG,
            "the draft model %s has another vocabulary (%s, %d tokens) than the model %s (%s, %d tokens): %s; a "
            "draft model must use the target's tokenizer",
            d->name ? d->name : "?", tokenizer_model_name(dt), nd, t->name ? t->name : "?", tokenizer_model_name(tt),
            nt, diff);
    return ERR_INVALID_ARG;
}

struct scheduler *scheduler_create(struct engine *e, const struct tokenizer *tok, const struct sched_params *p,
                                   const struct sched_observer *obs, void (*notify)(void *ctx), void *notify_ctx,
                                   char *err)
{
    const struct engine_params *ep = engine_params_get(e);
    if (p->max_batch_size < 1 || p->max_batch_size > ep->max_seqs || p->max_batch_size > SCHED_MAX_SLOTS) {
        err_set(err, ERR_INVALID_ARG, "max_batch_size %d must be in [1, min(%d, engine slots %d)]", p->max_batch_size, SCHED_MAX_SLOTS,
                ep->max_seqs);
        return NULL;
    }
    if (p->prefill_chunk < 1 || p->prefill_chunk + p->max_batch_size > ep->max_batch_tokens) {
        err_set(err, ERR_INVALID_ARG, "prefill_chunk %d + max_batch_size %d exceeds the engine's batch of %d tokens",
                p->prefill_chunk, p->max_batch_size, ep->max_batch_tokens);
        return NULL;
    }
    if (p->draft_max < 0 || p->draft_max > SCHED_DRAFT_MAX || p->draft_min < 0 || p->draft_min > SCHED_DRAFT_MAX) {
        err_set(err, ERR_INVALID_ARG, "draft_max %d and draft_min %d must be in [0, %d]", p->draft_max, p->draft_min,
                SCHED_DRAFT_MAX);
        return NULL;
    }
    if (p->draft_engine) {
        const struct engine_params *dp = engine_params_get(p->draft_engine);
        if (dp->max_seqs < p->max_batch_size || dp->max_batch_tokens < p->max_batch_size) {
            err_set(err, ERR_INVALID_ARG, "the draft model's engine has %d slots and passes of %d tokens; at least %d "
                    "(max_batch_size) of each are needed", dp->max_seqs, dp->max_batch_tokens, p->max_batch_size);
            return NULL;
        }
        if (draft_vocab_check(engine_model(e), engine_model(p->draft_engine), err))
            return NULL;
    }
    struct scheduler *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->e = e;
    s->tok = tok;
    s->p = *p;
    if (obs)
        s->obs = *obs;
    s->notify = notify;
    s->notify_ctx = notify_ctx;
    s->n_vocab = engine_model(e)->hp.n_vocab;
    s->n_ctx = ep->n_ctx;
    s->max_seqs = p->max_batch_size;
    atomic_init(&s->max_running, s->max_seqs);
    atomic_init(&s->prefill_budget, p->prefill_chunk);
    s->kv_total = kv_pool_params(engine_kv(e))->n_blocks;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->cap_inbox = 64;
    s->cap_waiting = 64;
    s->cap_spare = 64;
    s->inbox = malloc((size_t)s->cap_inbox * sizeof *s->inbox);
    s->inbox_spare = malloc((size_t)s->cap_spare * sizeof *s->inbox_spare);
    s->waiting = malloc((size_t)s->cap_waiting * sizeof *s->waiting);
    s->running = malloc((size_t)s->max_seqs * sizeof *s->running);
    s->free_slots = malloc((size_t)s->max_seqs * sizeof *s->free_slots);
    s->slot_req = calloc((size_t)s->max_seqs, sizeof *s->slot_req);
    s->slot_choice = calloc((size_t)s->max_seqs, sizeof *s->slot_choice);
    /* drafted tokens take the room of prompt chunks in the batch (speculation runs in steps without them) */
    s->spec_rows = p->max_batch_size * p->draft_max;
    if (s->spec_rows > p->prefill_chunk)
        s->spec_rows = p->prefill_chunk;
    if (s->spec_rows > SCHED_SPEC_ROWS_MAX)
        s->spec_rows = SCHED_SPEC_ROWS_MAX;
    s->max_rows = s->max_seqs + s->spec_rows;
    s->logits = malloc((size_t)s->max_rows * (size_t)s->n_vocab * sizeof *s->logits);
    s->row_req = malloc((size_t)s->max_rows * sizeof *s->row_req);
    s->row_choice = malloc((size_t)s->max_rows * sizeof *s->row_choice);
    s->row_pos = malloc((size_t)s->max_rows * sizeof *s->row_pos);
    s->row_first = malloc((size_t)s->max_rows * sizeof *s->row_first);
    s->cost_curve = malloc(((size_t)s->max_rows + 1) * sizeof *s->cost_curve);
    s->cand = malloc((size_t)s->max_seqs * sizeof *s->cand);
    s->cand_seq = malloc((size_t)s->max_seqs * sizeof *s->cand_seq);
    if (p->draft_max > 0 && !(s->draft = malloc((size_t)s->max_seqs * (size_t)p->draft_max * sizeof *s->draft)))
        goto oom;
    if (!s->row_req || !s->row_choice || !s->row_pos || !s->row_first || !s->cost_curve || !s->cand || !s->cand_seq ||
        spec_cost_init(&s->cost, ep->max_batch_tokens) ||
        !(s->cost_at = calloc((size_t)ep->max_batch_tokens + 1, sizeof *s->cost_at)))
        goto oom;
    s->top_buf = malloc(64 * sizeof *s->top_buf);
    s->piece_cap = 256;
    s->piece = malloc((size_t)s->piece_cap);
    s->textbuf_cap = 1024;
    s->textbuf = malloc((size_t)s->textbuf_cap);
    if (!s->inbox || !s->inbox_spare || !s->waiting || !s->running || !s->free_slots || !s->slot_req || !s->slot_choice || !s->logits || !s->top_buf || !s->piece ||
        !s->textbuf || batch_init(&s->batch, p->prefill_chunk + p->max_batch_size))
        goto oom;
    if (p->prefix_cache && !(s->pc = prefix_cache_create(engine_kv(e))))
        goto oom;
    if (p->draft_engine && p->draft_max > 0) {
        s->de = p->draft_engine;
        s->de_ctx = engine_params_get(s->de)->n_ctx;
        if (batch_init(&s->dbatch, engine_params_get(s->de)->max_batch_tokens) ||
            !(s->dlogits = malloc((size_t)s->max_seqs * (size_t)s->n_vocab * sizeof *s->dlogits)))
            goto oom;
    }
    for (int i = 0; i < s->max_seqs; i++)
        s->free_slots[i] = s->max_seqs - 1 - i; /* slot 0 handed out first */
    s->n_free_slots = s->max_seqs;
    sched_stats_update(s);
    return s;
oom:
    err_set(err, ERR_NOMEM, "out of memory creating the scheduler");
    scheduler_destroy(s);
    return NULL;
}

int scheduler_start(struct scheduler *s)
{
    if (pthread_create(&s->thread, NULL, engine_thread, s))
        return ERR_INTERNAL;
    s->started = true;
    return 0;
}

void scheduler_destroy(struct scheduler *s)
{
    if (!s)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; i < s->n_inbox; i++) /* submitted after the thread ended */
        sched_req_unref(s->inbox[i]);
    prefix_cache_destroy(s->pc);
    token_trie_destroy(s->trie);
    free(s->mask);
    batch_deinit(&s->batch);
    batch_deinit(&s->dbatch);
    free(s->dlogits);
    free(s->inbox);
    free(s->inbox_spare);
    free(s->waiting);
    free(s->running);
    free(s->free_slots);
    free(s->logits);
    free(s->top_buf);
    free(s->piece);
    free(s->textbuf);
    free(s->slot_req);
    free(s->slot_choice);
    free(s->row_req);
    free(s->row_choice);
    free(s->row_pos);
    free(s->row_first);
    free(s->draft);
    free(s->cost_curve);
    free(s->cand);
    free(s->cand_seq);
    spec_cost_deinit(&s->cost);
    free(s->cost_at);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int scheduler_submit(struct scheduler *s, struct sched_req *r)
{
    if (atomic_load(&s->draining))
        return ERR_UNAVAILABLE;
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return ERR_UNAVAILABLE;
    }
    if (r->priority <= SCHED_PRIORITY_LIVE &&
        atomic_load(&s->n_queued) - atomic_load(&s->n_queued_batch) >= s->p.max_queue) {
        pthread_mutex_unlock(&s->mu);
        obs_count(s, SCHED_CTR_REJECTED_QUEUE_FULL, 1);
        return ERR_QUEUE_FULL;
    }
    if (s->n_inbox == s->cap_inbox) {
        struct sched_req **ni = realloc(s->inbox, (size_t)s->cap_inbox * 2 * sizeof *ni);
        if (!ni) {
            pthread_mutex_unlock(&s->mu);
            return ERR_NOMEM;
        }
        s->inbox = ni;
        s->cap_inbox *= 2;
    }
    sched_req_ref(r);
    r->st->state = RS_QUEUED;
    s->inbox[s->n_inbox++] = r;
    queued_add(s, r, 1);
    atomic_store(&s->st_waiting, atomic_load(&s->n_queued));
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void scheduler_cancel(struct scheduler *s, struct sched_req *r, int reason)
{
    int zero = 0;
    atomic_compare_exchange_strong(&r->st->cancel, &zero, reason);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void scheduler_drain(struct scheduler *s) { atomic_store(&s->draining, true); }

void scheduler_cancel_all(struct scheduler *s, int reason)
{
    atomic_store(&s->cancel_all, reason);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void scheduler_stats(const struct scheduler *s, struct sched_stats *out)
{
    struct scheduler *m = (struct scheduler *)s;
    out->running = atomic_load(&m->st_running);
    out->waiting = atomic_load(&m->st_waiting);
    out->kv_blocks_used = atomic_load(&m->st_kv_used);
    out->kv_blocks_total = s->kv_total;
    out->prefix_cache_blocks = atomic_load(&m->st_cache_blocks);
    out->steps = atomic_load(&m->st_steps);
    out->max_running = atomic_load(&m->max_running);
    out->prefill_chunk = atomic_load(&m->prefill_budget);
}

int scheduler_set_max_running(struct scheduler *s, int n)
{
    n = n < 1 ? 1 : n > s->max_seqs ? s->max_seqs : n;
    atomic_store(&s->max_running, n);
    return n;
}

int scheduler_max_running(const struct scheduler *s) { return atomic_load(&((struct scheduler *)s)->max_running); }

int scheduler_set_prefill_chunk(struct scheduler *s, int n)
{
    n = n < 1 ? 1 : n > s->p.prefill_chunk ? s->p.prefill_chunk : n;
    atomic_store(&s->prefill_budget, n);
    return n;
}

int scheduler_prefill_chunk(const struct scheduler *s)
{
    return atomic_load(&((struct scheduler *)s)->prefill_budget);
}
