/*
 * scheduler: the engine thread. It owns the engine and runs continuous batching: requests join the running
 * batch as sequence slots and KV blocks allow and leave it the step they finish; each step evaluates every
 * running decode plus a budget of prompt tokens (chunked prefill, so a long prompt never stalls the decodes
 * of others), samples each sequence with its own sampler, detokenizes, applies stop strings and appends the
 * result to the request's outbox, then calls notify() so the I/O thread can ship it.
 *
 * Policies: first-come first-served admission from a bounded wait queue, by priority (a live request is
 * admitted before any waiting batch request, and when it cannot be admitted the most recently admitted
 * running batch request is preempted for it); prefix reuse across requests
 * through the prefix cache (prompt blocks already computed are shared, not recomputed); when KV blocks run
 * out, the most recently admitted request is preempted (its blocks freed, its tokens recomputed when it
 * comes back, ahead of every waiting request); n > 1 choices share the prompt's blocks (kv_seq_share).
 *
 * Speculative decoding (docs/speculative.md): a decoding sequence may feed, after its pending token, tokens
 * drafted from the request's prediction, by n-gram lookup or by a draft model, verified in the same forward pass; the output
 * is the same token for token as without speculation (greedy and seeded sampling alike), only faster when
 * drafts are accepted. Draft lengths follow each sequence's acceptance and the measured cost of the pass
 * (speculate.h), so speculation stays off under load and when drafts fail.
 *
 * Threads: scheduler_submit / scheduler_cancel / sched_req_* may be called from any thread; the engine thread
 * appends a request's output under the request's own lock, which only scheduler.c can take (readers go
 * through sched_req_status_get and sched_req_read). A request is reference-counted: the submitter holds one
 * reference, the scheduler another until the request is finished.
 */
#ifndef WAFER_ENGINE_SCHEDULER_H
#define WAFER_ENGINE_SCHEDULER_H

#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum sched_finish {
    SCHED_RUNNING = 0,
    SCHED_STOP,      /* end-of-generation token or a stop string */
    SCHED_LENGTH,    /* max_tokens or the context is full */
    SCHED_ERROR,     /* see sched_req.error / errmsg (cancelled, timeout, no space, internal) */
};

/* One generated token of one choice, as the I/O thread reads it. */
struct sched_token {
    int32_t id;
    uint32_t text_off, text_len; /* the text this token released (0 when held back: partial UTF-8 or a
                                    possible stop string; released later with another token) */
    float logprob;               /* chosen token's log-probability (when logprobs were asked) */
    int32_t top_off;             /* first of n_top entries in the choice's top[] (-1: none) */
};

/* Output of one choice. Appended by the engine thread under the request's lock; readers see it in
 * sched_req_read. */
struct sched_choice {
    char *text; /* all text so far (not NUL-terminated) */
    size_t text_len, text_cap;
    struct sched_token *toks;
    int n_toks, cap_toks;
    struct sampler_logprob *top; /* [n_toks * n_top] when logprobs were asked */
    int n_top_used, cap_top;
    struct sched_token *ptoks; /* prompt_logprobs, choice 0 only: [n_ptoks] entries for prompt tokens 1, 2, ...
                                  (id, logprob, top_off into top[]; text_off/text_len unused) */
    int n_ptoks, cap_ptoks;
    enum sched_finish finish;
};

struct sched_req_state; /* the scheduler's part of a request (scheduler.c) */
struct grammar_entry;   /* engine/grammar/grammar_cache.h */

#define SCHED_PRIORITY_LIVE 0
#define SCHED_PRIORITY_BATCH 1 /* batch jobs: free slots and KV only */

/* Where drafted tokens come from besides a request's prediction (which is always drafted from). */
enum sched_spec {
    SCHED_SPEC_OFF = 0, /* no n-gram lookup */
    SCHED_SPEC_NGRAM,   /* n-gram lookup over the prompt and the text generated so far */
    SCHED_SPEC_DRAFT,   /* the draft model (sched_params.draft_engine): its greedy continuation; nothing
                           drafted when the scheduler has none */
};

/* A generation request. The submitter fills the input, submits, and from then on reaches the request only
 * through functions: sched_req_status_get and sched_req_read to read its output, scheduler_cancel to stop it,
 * sched_req_ref/unref to keep it. Its output, progress, reference count and engine-thread state live in
 * st, a type only scheduler.c knows, so no other file can take its lock or read half-written output. */
struct sched_req {
    /* ---- input: set by the submitter before scheduler_submit, then read-only ---- */
    uint64_t id;
    int32_t *prompt; /* [n_prompt], owned (freed with the request) */
    int n_prompt;
    int n_choices;  /* >= 1 */
    int max_tokens; /* >= 1 */
    struct sampler_params sp;
    char **stop; /* [n_stop], owned */
    int n_stop;
    int n_logprobs; /* -1: none; else alternatives per token (0: only the chosen token's) */
    bool prompt_logprobs; /* also score the prompt (OpenAI's echo with logprobs): choice 0's ptoks get each
                             prompt token's logprob after the first, with n_logprobs alternatives, under the
                             model's raw distribution; its prompt never comes from the prefix cache */
    bool ignore_eos;
    /* Structured output: when set (a reference the request owns, released with it), every choice samples
     * only tokens the grammar allows (the others' logits become -inf), ends with SCHED_STOP once the grammar
     * is complete, and an answer that ends with SCHED_STOP is validated against the entry's schema; a
     * refused token or a failed validation finishes the request with ERR_INTERNAL, never unconstrained or
     * invalid output. ignore_eos does not apply. */
    struct grammar_entry *constraint;
    struct sampler_bias *logit_bias; /* [n_logit_bias], owned (sched_req_set_logit_bias): added to the logits
                                        of every choice before the grammar's mask and the sampler (ids are
                                        inside the vocabulary) */
    int n_logit_bias;
    int32_t *prediction; /* [n_prediction], owned (sched_req_set_prediction): the output the client expects
                            (OpenAI's predicted outputs), used as drafts; NULL: none */
    int n_prediction;
    int spec;            /* drafts besides the prediction: -1 as the scheduler's params say (default), else
                            enum sched_spec */
    int64_t t_arrival; /* ns, clock_now_ns() */
    int64_t deadline;  /* ns, clock_now_ns(); 0: none */
    void *user;        /* the submitter's pointer, untouched by the scheduler */
    int priority;      /* SCHED_PRIORITY_LIVE (0) or SCHED_PRIORITY_BATCH: admitted after every waiting
                          request of a lower number, and preempted to admit one */

    /* ---- the scheduler's, private ---- */
    struct sched_req_state *st;
};

/* A new request with refcount 1 (the caller's). prompt is copied. NULL on OOM. The caller fills the input
 * fields (stop strings are copied with sched_req_set_stop), then submits. */
struct sched_req *sched_req_create(const int32_t *prompt, int n_prompt, int n_choices);
int sched_req_set_stop(struct sched_req *r, char *const *stop, int n_stop);
/* Copies the prediction's tokens (n > 0) into r. 0 or ERR_NOMEM. */
int sched_req_set_prediction(struct sched_req *r, const int32_t *toks, int n);
/* Copies n logit_bias entries into r. 0 or ERR_NOMEM. */
int sched_req_set_logit_bias(struct sched_req *r, const struct sampler_bias *b, int n);
void sched_req_ref(struct sched_req *r);
/* Drops a reference; the last one frees the request. */
void sched_req_unref(struct sched_req *r);

/* What a reader sees of a request's progress, copied under the request's lock (any thread). */
struct sched_req_status {
    bool finished;      /* every choice is done; nothing more will be appended */
    int error;          /* ERR_* when finished with SCHED_ERROR, else 0 */
    char errmsg[256];
    int cached_tokens;  /* prompt tokens reused from the prefix cache at first admission */
    int n_generated;    /* tokens generated over all choices */
    int draft_tokens;   /* drafted tokens verified, all choices and sources (speculative decoding) */
    int accepted_tokens;           /* ... of them accepted */
    int prediction_draft_tokens;   /* drafted tokens taken from the prediction */
    int prediction_accepted_tokens; /* ... of them accepted */
    int preemptions;    /* times its slots were taken (for a more urgent request or for KV) and it waited again */
    int64_t t_admitted, t_first_token, t_finished; /* ns, 0 until they happen */
    uint64_t version;   /* changes at every append: readers skip unchanged requests */
};

/* Fills out from r. Any thread. */
void sched_req_status_get(struct sched_req *r, struct sched_req_status *out);

/* Calls fn(ctx, c, ch) for each choice c in order while the engine thread cannot append to r, so fn sees
 * each choice whole and consistent. fn must not keep pointers into ch past its return and must not call back
 * into the scheduler. Stops at the first fn that returns false (e.g. the reader's socket is full) and returns
 * false then; true when every call returned true. Any thread; this and sched_req_status_get are the only ways
 * a reader may look at the output of a submitted request. */
bool sched_req_read(struct sched_req *r, bool (*fn)(void *ctx, int c, const struct sched_choice *ch), void *ctx);

struct sched_params {
    int max_batch_size; /* running sequences = engine slots (engine max_seqs must be at least this) */
    int max_queue;      /* live requests waiting for admission before submit says ERR_QUEUE_FULL (batch
                           requests are not counted and never refused: their submitter bounds them) */
    int prefill_chunk;  /* prompt tokens per step */
    bool prefix_cache;  /* reuse KV blocks across requests (default true) */
    enum sched_spec spec; /* drafts for requests that do not choose (default off) */
    int draft_max;      /* most drafted tokens a sequence verifies per step, 0..SCHED_DRAFT_MAX (default 16;
                           0: no speculation, predictions ignored) */
    int draft_min;      /* drafts shorter than this are not verified (default 1) */
    bool draft_adaptive; /* default true: draft lengths follow acceptance and the measured cost of a pass
                            (speculate.h); false: every draft is verified at its full length up to draft_max
                            (tests; measuring the ceiling) */
    /* The draft model (SCHED_SPEC_DRAFT), NULL: none. Not owned: it must outlive the scheduler and be used
     * by nobody else (the engine thread runs it). Created with max_seqs >= max_batch_size (a sequence's
     * draft KV lives in the slot of the same number) and max_batch_tokens >= max_batch_size; its model
     * must have the target's vocabulary (scheduler_create refuses another, naming both). */
    struct engine *draft_engine;
};

#define SCHED_DRAFT_MAX 64
#define SCHED_SPEC_POS_MAX 16 /* draft positions counted one by one (SCHED_CTR_SPEC_ACCEPTED_POS) */

void sched_params_default(struct sched_params *p);

/* What the scheduler counts, as it happens. The scheduler only measures; what becomes of a measure (a
 * Prometheus counter, an alert, a dashboard) is the observer's business. New measures are appended here;
 * an observer ignores those it does not know. */
enum sched_counter {
    SCHED_CTR_PROMPT_TOKENS,       /* prompt tokens of a request, once, at its first admission */
    SCHED_CTR_GENERATED_TOKENS,    /* generated tokens (an end-of-generation token is not counted) */
    SCHED_CTR_PREFIX_QUERIES,      /* first admissions that looked the prefix cache up */
    SCHED_CTR_PREFIX_HITS,         /* ... and reused cached KV blocks */
    SCHED_CTR_PREFIX_HIT_TOKENS,   /* prompt tokens taken from the cache instead of being recomputed */
    SCHED_CTR_PREEMPTIONS,         /* requests preempted (recomputed later) for lack of KV blocks */
    SCHED_CTR_CANCELLED,           /* requests finished with ERR_CANCELLED (the submitter went away) */
    SCHED_CTR_TIMEOUTS,            /* requests finished with ERR_TIMEOUT (deadline passed) */
    SCHED_CTR_REJECTED_QUEUE_FULL, /* submissions refused with ERR_QUEUE_FULL */
    SCHED_CTR_ENGINE_STEPS,        /* forward passes */
    SCHED_CTR_SPEC_DRAFTS,         /* verifies: a sequence's pass with drafted tokens */
    SCHED_CTR_SPEC_DRAFT_TOKENS,   /* drafted tokens verified */
    SCHED_CTR_SPEC_ACCEPTED_TOKENS, /* ... accepted */
    SCHED_CTR_SPEC_ACCEPTED_POS,   /* accepted tokens at draft position i (0-based, i < SCHED_SPEC_POS_MAX) are
                                      counted in SCHED_CTR_SPEC_ACCEPTED_POS + i */
    SCHED_CTR_COUNT_ = SCHED_CTR_SPEC_ACCEPTED_POS + SCHED_SPEC_POS_MAX
};

/* Durations the scheduler measures, in seconds, from the request's t_arrival. */
enum sched_timing {
    SCHED_TIM_TTFT,  /* arrival -> first generated token of the request */
    SCHED_TIM_ITL,   /* between consecutive tokens of one sequence */
    SCHED_TIM_E2E,   /* arrival -> end of a request that finished without error */
    SCHED_TIM_QUEUE, /* arrival -> first admission into the running batch */
    SCHED_TIM_COUNT_
};

/* Receives the scheduler's measures. Either function may be NULL. They are called on the engine thread,
 * except SCHED_CTR_REJECTED_QUEUE_FULL, counted on the thread that called scheduler_submit: they must be
 * thread-safe, quick, and must not call back into the scheduler. Several consumers share one observer by
 * fanning out in its functions. */
struct sched_observer {
    void *ctx;
    void (*count)(void *ctx, enum sched_counter c, int64_t v);
    void (*observe)(void *ctx, enum sched_timing t, double seconds);
};

/* Snapshot for /metrics and /ready (any thread). */
struct sched_stats {
    int running;  /* requests with slots */
    int waiting;  /* requests queued or waiting for admission */
    int64_t kv_blocks_used;  /* referenced by sequences */
    int64_t kv_blocks_total;
    int64_t prefix_cache_blocks;
    uint64_t steps;
    int max_running; /* the admission limit now (scheduler_set_max_running) */
    int prefill_chunk; /* prompt tokens a step carries now (scheduler_set_prefill_chunk) */
};

struct scheduler;

/* Binds an engine (created with max_seqs >= max_batch_size and max_batch_tokens >= prefill_chunk +
 * max_batch_size; drafted tokens take the room of prompt chunks) and the model's tokenizer. obs (copied; NULL: nobody listens) receives what the scheduler
 * measures; its ctx must outlive the scheduler. notify(ctx) is called from the engine thread whenever
 * requests have new output or finished. NULL and a message on failure (ERR_INVALID_ARG naming both
 * vocabularies when p->draft_engine's model does not share the target's). */
struct scheduler *scheduler_create(struct engine *e, const struct tokenizer *tok, const struct sched_params *p,
                                   const struct sched_observer *obs, void (*notify)(void *ctx), void *notify_ctx,
                                   char *err);
/* Stops the engine thread (requests still in flight are finished with ERR_UNAVAILABLE) and frees. */
void scheduler_destroy(struct scheduler *s);

/* Starts the engine thread. 0 or ERR_NOMEM/ERR_INTERNAL. */
int scheduler_start(struct scheduler *s);

/* Queues r (takes a reference). ERR_QUEUE_FULL when r is live and max_queue live requests wait (a batch
 * request always queues: it waits for capacity below live traffic), ERR_UNAVAILABLE once
 * draining; on error no reference is taken. Any thread. */
int scheduler_submit(struct scheduler *s, struct sched_req *r);
/* Marks r cancelled with reason (ERR_CANCELLED, ERR_TIMEOUT, ...): the engine drops it at its next step,
 * frees its KV blocks and finishes it with that error. Any thread; idempotent. */
void scheduler_cancel(struct scheduler *s, struct sched_req *r, int reason);
/* Refuses new submissions from now on (draining). */
void scheduler_drain(struct scheduler *s);
/* Cancels every request in flight with reason. */
void scheduler_cancel_all(struct scheduler *s, int reason);

void scheduler_stats(const struct scheduler *s, struct sched_stats *out);

/* Limits the sequences running together to n (clamped to 1..max_batch_size; returns the value set), for a
 * controller that trades batch size for latency. Takes effect at the next admission: running sequences are
 * never preempted for it, and a request is always admitted into an empty batch. Any thread (an atomic). */
int scheduler_set_max_running(struct scheduler *s, int n);
int scheduler_max_running(const struct scheduler *s);
/* Limits the prompt tokens one step carries to n (clamped to 1..sched_params.prefill_chunk, the size the
 * batch was allocated for; returns the value set): smaller chunks make the steps that prefill shorter, so
 * the running sequences' inter-token latency has a shorter tail, at the cost of slower prefill. Takes
 * effect at the next step. Any thread (an atomic). */
int scheduler_set_prefill_chunk(struct scheduler *s, int n);
int scheduler_prefill_chunk(const struct scheduler *s);

#endif
