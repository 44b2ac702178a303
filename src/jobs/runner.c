/*
 * runner: one thread that keeps up to max_inflight lines of a job store running. Each line sits in a slot
 * from its claim until its result is committed (or it is given back): a slot is "running" between exec and
 * runner_line_done, and "pending" while its result waits for the next group commit. Tickets carry the slot
 * index and the slot's generation, so a stale or doubled runner_line_done is caught (ASSERT) instead of
 * completing another line.
 *
 * runner_line_done builds the output line in the caller's thread (JSON work off the runner thread) from the
 * slot's line, which the runner thread does not touch while the line runs, and queues it; the queue's mutex
 * orders that read after the slot was filled (the slot was filled before exec handed the line over).
 *
 * Failures of the store: a commit that fails with ERR_UNAVAILABLE (Redis down) or another transient error
 * keeps its results and is retried with a growing delay (up to 2 s); claims stop meanwhile. ERR_NO_SPACE
 * drops the results: the store has failed their batches (jobs_lines_commit).
 */
#include "jobs/runner.h"

#include "core/clock.h"
#include "core/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNNER_BACKOFF_MAX_MS 2000
#define RUNNER_STOP_GRACE_MS 5000 /* at shutdown, how long to keep retrying a commit the store refuses */

struct runner_slot {
    struct jobs_line line;
    struct runner_line view;
    uint32_t gen;
    bool busy;       /* claimed and not yet committed or given back */
    bool running;    /* exec called, runner_line_done not yet processed */
    bool redispatch; /* preempted: start it again */
    int64_t not_before; /* redispatch: not before this (ms, runner_ms) */
};

struct runner_done {
    uint64_t ticket;
    int retry_after_ms;
    bool preempted;
    bool is_error;
    char *text; /* the output/error line; NULL when preempted */
};

struct runner_pend {
    int slot;
    char *text;
    bool is_error;
};

struct runner {
    struct jobs_store *store;
    struct runner_config cfg;
    int renew_ms;
    pthread_t thread;

    /* shared with other threads, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct runner_done *q;
    int q_n, q_cap;
    bool stop, wake;

    atomic_uint_fast64_t n_completed, n_failed, n_preempted, n_reclaimed;
    atomic_int n_inflight;

    /* runner thread only */
    struct runner_slot *slots;
    struct runner_pend *pend;
    int n_pend;
    struct runner_done *local;
    int local_cap;
};

static int64_t runner_ms(void) { return clock_now_ns() / 1000000; }

static uint64_t runner_ticket(const struct runner *r, int slot)
{
    return ((uint64_t)r->slots[slot].gen << 32) | (uint32_t)slot;
}

void runner_line_done(struct runner *r, uint64_t ticket, const struct runner_result *res)
{
    uint32_t si = (uint32_t)ticket;
    ASSERT(si < (uint32_t)r->cfg.max_inflight);
    struct runner_slot *s = &r->slots[si];
    ASSERT(s->gen == (uint32_t)(ticket >> 32));
    struct runner_done d = {.ticket = ticket, .preempted = res->outcome == RUNNER_PREEMPTED,
                            .retry_after_ms = res->outcome == RUNNER_PREEMPTED ? res->retry_after_ms : 0};
    if (!d.preempted) {
        if (res->outcome == RUNNER_RESPONSE)
            d.text = jobs_result_text(&s->line, res->status_code, res->request_id, res->body, NULL, NULL, &d.is_error);
        if (res->outcome == RUNNER_RESPONSE && !d.text)
            d.text = jobs_result_text(&s->line, 0, NULL, NULL, "invalid_response",
                                      "The endpoint's response body was not JSON.", &d.is_error);
        else if (res->outcome == RUNNER_NO_RESPONSE)
            d.text = jobs_result_text(&s->line, 0, NULL, NULL, res->error_code, res->error_message, &d.is_error);
        if (!d.text) /* out of memory: run it again rather than lose it */
            d.preempted = true;
    }
    pthread_mutex_lock(&r->mu);
    if (r->q_n == r->q_cap) {
        int cap = r->q_cap ? r->q_cap * 2 : 64;
        struct runner_done *nq = realloc(r->q, (size_t)cap * sizeof *nq);
        ASSERT(nq); /* a few bytes per line in flight; nowhere to report the line otherwise */
        r->q = nq;
        r->q_cap = cap;
    }
    r->q[r->q_n++] = d;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void runner_wake(struct runner *r)
{
    pthread_mutex_lock(&r->mu);
    r->wake = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void runner_stats_get(struct runner *r, struct runner_stats *out)
{
    out->completed = atomic_load(&r->n_completed);
    out->failed = atomic_load(&r->n_failed);
    out->preempted = atomic_load(&r->n_preempted);
    out->reclaimed = atomic_load(&r->n_reclaimed);
    out->inflight = atomic_load(&r->n_inflight);
}

static void runner_start(struct runner *r, int i)
{
    struct runner_slot *s = &r->slots[i];
    s->running = true;
    s->redispatch = false;
    s->view = (struct runner_line){.batch_id = s->line.batch_id,
                                   .endpoint = s->line.endpoint,
                                   .custom_id = s->line.custom_id,
                                   .body = s->line.body,
                                   .idx = s->line.idx,
                                   .ticket = runner_ticket(r, i)};
    atomic_fetch_add(&r->n_inflight, 1);
    r->cfg.exec(r->cfg.ctx, &s->view);
}

static void runner_slot_free(struct runner *r, int i)
{
    struct runner_slot *s = &r->slots[i];
    jobs_line_deinit(&s->line);
    s->busy = s->running = s->redispatch = false;
    s->gen++;
}

/* Commits the pending results. Returns 0 when they are settled (committed, or dropped for good). */
static int runner_commit(struct runner *r, struct jobs_err *err)
{
    if (!r->n_pend)
        return 0;
    struct jobs_result *res = malloc((size_t)r->n_pend * sizeof *res);
    if (!res)
        return err_set(err->message, ERR_NOMEM, "out of memory committing results");
    for (int i = 0; i < r->n_pend; i++)
        res[i] = (struct jobs_result){.line = &r->slots[r->pend[i].slot].line, .text = r->pend[i].text,
                                      .is_error = r->pend[i].is_error};
    int rc = jobs_lines_commit(r->store, res, r->n_pend, err);
    free(res);
    if (rc && rc != ERR_NO_SPACE)
        return rc;
    if (rc == ERR_NO_SPACE)
        log_error("jobs: %s", err->message);
    for (int i = 0; i < r->n_pend; i++) {
        if (!rc)
            atomic_fetch_add(r->pend[i].is_error ? &r->n_failed : &r->n_completed, 1);
        free(r->pend[i].text);
        runner_slot_free(r, r->pend[i].slot);
    }
    r->n_pend = 0;
    return 0;
}

static void runner_renew(struct runner *r)
{
    int n = 0;
    struct jobs_line *lines = malloc((size_t)r->cfg.max_inflight * sizeof *lines);
    bool *lost = calloc((size_t)r->cfg.max_inflight, sizeof *lost);
    int *which = malloc((size_t)r->cfg.max_inflight * sizeof *which);
    if (lines && lost && which) {
        for (int i = 0; i < r->cfg.max_inflight; i++)
            if (r->slots[i].busy) {
                lines[n] = r->slots[i].line; /* shallow: the store only reads it */
                which[n++] = i;
            }
        struct jobs_err err;
        if (n && jobs_lines_renew(r->store, lines, n, lost, &err) == 0) {
            for (int k = 0; k < n; k++)
                if (lost[k] && r->slots[which[k]].running && r->cfg.cancel) {
                    log_info("jobs: line %lld of batch %s went to another worker; stopping it here",
                             (long long)lines[k].idx, lines[k].batch_id);
                    r->cfg.cancel(r->cfg.ctx, runner_ticket(r, which[k]));
                }
        }
    }
    free(lines);
    free(lost);
    free(which);
}

/* Claims lines into the free slots and starts them. Returns how many were started, or a negative ERR_*. */
static int runner_claim(struct runner *r, struct jobs_err *err)
{
    int free_n = 0;
    for (int i = 0; i < r->cfg.max_inflight; i++)
        free_n += !r->slots[i].busy;
    if (!free_n)
        return 0;
    struct jobs_line *got = calloc((size_t)free_n, sizeof *got);
    if (!got)
        return ERR_NOMEM;
    int n = 0;
    int rc = jobs_lines_claim(r->store, got, free_n, &n, err);
    int started = 0;
    for (int k = 0; !rc && k < n; k++) {
        bool dup = false; /* our own line, handed back to us after its lease lapsed (store was unreachable) */
        for (int i = 0; i < r->cfg.max_inflight && !dup; i++)
            dup = r->slots[i].busy && r->slots[i].line.idx == got[k].idx &&
                  !strcmp(r->slots[i].line.batch_id, got[k].batch_id);
        if (dup) {
            jobs_line_deinit(&got[k]);
            continue;
        }
        int i = 0;
        while (r->slots[i].busy)
            i++;
        r->slots[i].line = got[k];
        r->slots[i].busy = true;
        if (got[k].reclaimed)
            atomic_fetch_add(&r->n_reclaimed, 1);
        runner_start(r, i);
        started++;
    }
    free(got);
    return rc ? rc : started;
}

/* Records whether the store answered; while it does not, work waits with a growing delay. */
struct runner_health {
    bool paused;
    int backoff_ms;
    int64_t retry_at;
};

static void runner_health_ok(struct runner_health *h)
{
    if (h->paused)
        log_info("jobs: the job store answers again; batch work resumed");
    h->paused = false;
    h->backoff_ms = 100;
}

static void runner_health_fail(struct runner_health *h, int64_t now, const char *what, const char *msg)
{
    if (!h->paused)
        log_warn("jobs: %s: %s; batch work paused until the store answers", what, msg);
    h->paused = true;
    h->retry_at = now + h->backoff_ms;
    h->backoff_ms = h->backoff_ms * 2 > RUNNER_BACKOFF_MAX_MS ? RUNNER_BACKOFF_MAX_MS : h->backoff_ms * 2;
}

static void *runner_main(void *arg)
{
    struct runner *r = arg;
    int64_t now = runner_ms();
    int64_t next_tick = now, next_poll = now, next_renew = now + r->renew_ms, stop_deadline = 0;
    struct runner_health h = {.backoff_ms = 100};
    bool stopping = false;
    for (;;) {
        /* wait for a completion, a wake-up, or the next deadline */
        int64_t deadline = next_tick;
        if (!stopping && next_poll < deadline)
            deadline = next_poll;
        if (h.paused && h.retry_at < deadline)
            deadline = h.retry_at;
        if (r->renew_ms && next_renew < deadline)
            deadline = next_renew;
        for (int i = 0; !stopping && i < r->cfg.max_inflight; i++)
            if (r->slots[i].redispatch && r->slots[i].not_before < deadline)
                deadline = r->slots[i].not_before;
        if (stopping && deadline > now + 50)
            deadline = now + 50;
        pthread_mutex_lock(&r->mu);
        while (!r->q_n && (!r->stop || stopping) && !r->wake && runner_ms() < deadline) {
            int64_t wait = deadline - runner_ms();
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += wait / 1000;
            ts.tv_nsec += (wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        }
        int n = r->q_n;
        if (n > r->local_cap) {
            struct runner_done *nl = realloc(r->local, (size_t)n * sizeof *nl);
            ASSERT(nl);
            r->local = nl;
            r->local_cap = n;
        }
        if (n)
            memcpy(r->local, r->q, (size_t)n * sizeof *r->q);
        r->q_n = 0;
        bool woke = r->wake;
        r->wake = false;
        bool stop_now = r->stop && !stopping;
        pthread_mutex_unlock(&r->mu);
        now = runner_ms();
        if (stop_now) { /* ask running lines to stop; they still end with runner_line_done */
            stopping = true;
            stop_deadline = now + RUNNER_STOP_GRACE_MS;
            for (int i = 0; r->cfg.cancel && i < r->cfg.max_inflight; i++)
                if (r->slots[i].running)
                    r->cfg.cancel(r->cfg.ctx, runner_ticket(r, i));
        }

        /* completions */
        for (int k = 0; k < n; k++) {
            struct runner_done *d = &r->local[k];
            int i = (int)(uint32_t)d->ticket;
            struct runner_slot *s = &r->slots[i];
            ASSERT(s->busy && s->running && s->gen == (uint32_t)(d->ticket >> 32));
            s->running = false;
            atomic_fetch_sub(&r->n_inflight, 1);
            if (d->preempted) {
                atomic_fetch_add(&r->n_preempted, 1);
                s->redispatch = true;
                s->not_before = now + (d->retry_after_ms > 0 ? d->retry_after_ms : 0);
                continue;
            }
            if (r->n_pend % 64 == 0) {
                struct runner_pend *np = realloc(r->pend, (size_t)(r->n_pend + 64) * sizeof *np);
                ASSERT(np);
                r->pend = np;
            }
            r->pend[r->n_pend++] = (struct runner_pend){.slot = i, .text = d->text, .is_error = d->is_error};
        }

        /* group commit: one transaction for everything that finished since the last one */
        if (r->n_pend && (!h.paused || now >= h.retry_at)) {
            struct jobs_err err;
            int rc = runner_commit(r, &err);
            if (rc) {
                runner_health_fail(&h, now, "cannot save results", err.message);
                if (stopping && now >= stop_deadline) {
                    log_warn("jobs: giving up on %d results at shutdown; their lines will run again", r->n_pend);
                    for (int k = 0; k < r->n_pend; k++) {
                        free(r->pend[k].text);
                        runner_slot_free(r, r->pend[k].slot);
                    }
                    r->n_pend = 0;
                }
            } else {
                runner_health_ok(&h);
            }
        }

        /* preempted lines start again (they keep their claim), those refused by a busy server after a pause */
        for (int i = 0; !stopping && i < r->cfg.max_inflight; i++)
            if (r->slots[i].redispatch && now >= r->slots[i].not_before)
                runner_start(r, i);

        if (r->renew_ms && now >= next_renew) {
            runner_renew(r);
            next_renew = now + r->renew_ms;
        }

        if (!stopping && !h.paused && now >= next_tick) {
            struct jobs_err err;
            int rc = jobs_store_tick(r->store, NULL, &err);
            if (rc == ERR_UNAVAILABLE)
                runner_health_fail(&h, now, "housekeeping", err.message);
            else if (rc)
                log_warn("jobs: housekeeping failed: %s", err.message);
            next_tick = now + r->cfg.tick_ms;
        }

        bool may_claim = h.paused ? now >= h.retry_at : (woke || n || now >= next_poll);
        if (!stopping && !r->n_pend && may_claim) {
            struct jobs_err err;
            int rc = runner_claim(r, &err);
            if (rc < 0) {
                runner_health_fail(&h, now, "cannot claim lines", err.message);
            } else {
                runner_health_ok(&h);
                if (rc == 0)
                    next_poll = now + r->cfg.poll_ms;
            }
        }

        if (stopping) {
            bool running = false;
            for (int i = 0; i < r->cfg.max_inflight; i++)
                running |= r->slots[i].running;
            if (!running && !r->n_pend)
                break;
        }
    }
    /* give back what was claimed and never finished (preempted lines) */
    struct jobs_line *back = malloc((size_t)r->cfg.max_inflight * sizeof *back);
    int nb = 0;
    for (int i = 0; back && i < r->cfg.max_inflight; i++)
        if (r->slots[i].busy)
            back[nb++] = r->slots[i].line;
    struct jobs_err err;
    if (nb && jobs_lines_release(r->store, back, nb, &err))
        log_warn("jobs: could not give back %d lines at shutdown (%s); they return when their lease ends", nb,
                 err.message);
    free(back);
    for (int i = 0; i < r->cfg.max_inflight; i++)
        if (r->slots[i].busy)
            runner_slot_free(r, i);
    return NULL;
}

struct runner *runner_create(struct jobs_store *store, const struct runner_config *cfg, char *err)
{
    if (!cfg->exec || cfg->max_inflight < 1) {
        err_set(err, ERR_INVALID_ARG, "runner: exec is required and max_inflight must be >= 1");
        return NULL;
    }
    struct runner *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(err, ERR_NOMEM, "out of memory starting the batch runner");
        return NULL;
    }
    r->store = store;
    r->cfg = *cfg;
    if (r->cfg.poll_ms <= 0)
        r->cfg.poll_ms = 200;
    if (r->cfg.tick_ms <= 0)
        r->cfg.tick_ms = 1000;
    r->renew_ms = jobs_store_renew_ms(store);
    r->slots = calloc((size_t)cfg->max_inflight, sizeof *r->slots);
    if (!r->slots) {
        free(r);
        err_set(err, ERR_NOMEM, "out of memory starting the batch runner");
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (cfg->handle)
        *cfg->handle = r;
    if (pthread_create(&r->thread, NULL, runner_main, r)) {
        if (cfg->handle)
            *cfg->handle = NULL;
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r->slots);
        free(r);
        err_set(err, ERR_INTERNAL, "cannot start the batch runner's thread");
        return NULL;
    }
    return r;
}

void runner_destroy(struct runner *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    for (int i = 0; i < r->q_n; i++)
        free(r->q[i].text);
    free(r->q);
    free(r->local);
    free(r->pend);
    free(r->slots);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
