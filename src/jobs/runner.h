/*
 * runner: executes the lines of a job store. One thread per runner claims lines (oldest batch first), hands
 * each to a caller-supplied exec function, collects the results, commits them in groups (a line counts as done
 * only once its result is committed), renews the leases of the lines still running (Redis), and calls the
 * store's housekeeping (finalization, expiry, cancellation) about once a second.
 *
 * exec is asynchronous: it starts the line (the server turns the body into a request for the live endpoint)
 * and returns; whoever finishes it calls runner_line_done, from any thread, also from inside exec. At most
 * max_inflight lines are started and not yet done. Threads: the only things shared with other threads are the
 * completion queue (a mutex and a condition variable) and atomic counters.
 *
 * When the store cannot be reached (Redis down), the runner stops claiming, keeps the results it has and
 * commits them once the store is back; nothing is lost and nothing counts as done before it is committed.
 */
#ifndef WAFER_JOBS_RUNNER_H
#define WAFER_JOBS_RUNNER_H

#include "jobs/jobs.h"

#include <stdint.h>

/* A line handed to exec. Valid until runner_line_done is called for it. */
struct runner_line {
    const char *batch_id;
    const char *endpoint;  /* "/v1/completions" or "/v1/chat/completions" */
    const char *custom_id;
    const char *body;      /* JSON object text: the request body */
    int64_t idx;           /* position in the batch's input file, 0-based */
    uint64_t ticket;       /* pass to runner_line_done */
};

enum runner_outcome {
    RUNNER_RESPONSE = 0, /* the endpoint answered: status_code and body (any status; non-2xx is an error line) */
    RUNNER_NO_RESPONSE,  /* no answer (the line could not be run): error_code and error_message */
    RUNNER_PREEMPTED,    /* the line gave its slot to a live request: it runs again later, nothing is recorded */
};

struct runner_result {
    enum runner_outcome outcome;
    int status_code;           /* RUNNER_RESPONSE: the HTTP status the live endpoint gave */
    const char *body;          /* RUNNER_RESPONSE: the response body, JSON text */
    const char *request_id;    /* RUNNER_RESPONSE: the request's id, NULL: one is made up */
    const char *error_code;    /* RUNNER_NO_RESPONSE: OpenAI-style code, e.g. "model_not_found" */
    const char *error_message; /* RUNNER_NO_RESPONSE: a sentence */
    int retry_after_ms;        /* RUNNER_PREEMPTED: start it again no sooner than this (the server was busy) */
};

/* Starts a line. Must lead to exactly one runner_line_done(ticket) (a RUNNER_PREEMPTED one starts it again). */
typedef void (*runner_exec_fn)(void *ctx, const struct runner_line *line);
/* Optional: asks that a started line stop soon (shutdown, or its lease went to another worker); it must still
 * end with runner_line_done (any outcome; the result may be dropped). */
typedef void (*runner_cancel_fn)(void *ctx, uint64_t ticket);

struct runner_config {
    int max_inflight;        /* lines started and not yet done, >= 1 */
    runner_exec_fn exec;     /* required */
    runner_cancel_fn cancel; /* may be NULL */
    void *ctx;               /* passed to exec and cancel */
    int poll_ms;             /* when idle, how often to look for new lines (0: 200) */
    int tick_ms;             /* how often to run jobs_store_tick (0: 1000) */
    struct runner **handle;  /* optional: set to the runner before its thread starts. exec runs on that thread
                              * as soon as lines are claimed, before runner_create returns, so whoever answers a
                              * line must read the runner from here, not from runner_create's return value */
};

/* wafer_batch_lines_total{outcome}: lines this runner ran, by outcome. */
struct runner_stats {
    uint64_t completed; /* committed with a 2xx response */
    uint64_t failed;    /* committed as an error line */
    uint64_t preempted; /* gave their slot to a live request (each time) */
    uint64_t reclaimed; /* claimed after another worker (or a dead process) lost them */
    int inflight;       /* started, not yet done */
};

struct runner;

/* Starts the runner's thread on store (which must outlive the runner). NULL with err filled on failure. */
struct runner *runner_create(struct jobs_store *store, const struct runner_config *cfg, char *err);

/* Stops claiming, asks running lines to stop (cancel), waits until each has called runner_line_done, commits
 * what came back, gives the rest back to the store and joins the thread. NULL is a no-op. */
void runner_destroy(struct runner *r);

/* Reports the end of a line started by exec. Any thread; copies what it needs from res. */
void runner_line_done(struct runner *r, uint64_t ticket, const struct runner_result *res);

/* Looks for new lines now (call after creating a batch) instead of at the next poll. Any thread. */
void runner_wake(struct runner *r);

/* Counters so far. Any thread. */
void runner_stats_get(struct runner *r, struct runner_stats *out);

#endif
