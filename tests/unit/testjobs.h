/*
 * testjobs: helpers for the job store tests: input files, a batch in one call, and the check every batch test
 * ends with: each custom_id exactly once across the output and error files, each result the one its line asked
 * for.
 */
#ifndef WAFER_TESTS_TESTJOBS_H
#define WAFER_TESTS_TESTJOBS_H

#include "jobs/jobs.h"
#include "jobs/runner.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include <stdbool.h>

/* JSONL with n requests, custom_ids "c0".."c<n-1>", url `url`, body {"model":"m","prompt":"p<i>"}. Caller frees. */
char *tj_jsonl(int n, const char *url);

/* Opens a store at a SQLite data dir (url NULL) or on Redis (url), lease_ms for Redis; asserts success. */
struct jobs_store *tj_open(const char *dir, const char *url, const char *consumer, int lease_ms);

/* Uploads n requests for /v1/completions and creates a batch with completion window `window`; the batch id
 * goes to id (JOBS_ID_MAX bytes). */
void tj_batch(struct jobs_store *s, int n, const char *window, char *id);

/* The batch object (caller decrefs); asserts it exists. */
json_t *tj_batch_get(struct jobs_store *s, const char *id);

/* The batch's status name in a static buffer. */
const char *tj_status(struct jobs_store *s, const char *id);

/* The response body the fake endpoint gives for a line body: {"echo": <prompt>}. Caller frees. */
char *tj_fake_response(const char *body);

/* Reads the output and error files of a finished batch and asserts that each of c0..c<n-1> appears exactly once
 * across them, that each output line's response echoes its own prompt, and returns the counts. */
void tj_check_exactly_once(struct jobs_store *s, const char *id, int n, int *n_out, int *n_err);

/* Polls (jobs_store_tick each 20 ms) until the batch reaches a final status or timeout_ms passes; returns the
 * status name. */
const char *tj_wait_final(struct jobs_store *s, const char *id, int timeout_ms, bool tick);

/* A fake endpoint for the runner: `threads` threads (0: answer inside exec) answer each line after about delay_us
 * with {"echo": <prompt>} (plus `pad` bytes of padding), or, by the line's index, preempt it once
 * (idx % preempt_every == 3) or give no response (idx % fail_every == 1). */
struct tj_job {
    uint64_t ticket;
    char *body;
    int64_t idx;
};

struct tj_fake {
    struct runner *r;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tj_job *q;
    int q_n, q_cap;
    bool stop;
    pthread_t threads[4];
    int n_threads;
    int delay_us;
    int preempt_every, fail_every;
    size_t pad;
    atomic_int running, max_running; /* lines started and not yet answered; the most at once */
    atomic_int preempted_once[4096];
};

struct tj_fake *tj_fake_start(int threads, int delay_us);
/* Stops the threads; call after runner_destroy (every line has been answered by then). Frees f. */
void tj_fake_stop(struct tj_fake *f);
void tj_fake_exec(void *ctx, const struct runner_line *line);
/* runner_create with the fake as exec (fast poll and tick); sets f->r; asserts success. */
struct runner *tj_runner(struct jobs_store *s, struct tj_fake *f, int max_inflight);

/* For forked children, where cmocka's asserts must not run: prints and exits 3. */
#define CHILD_CHECK(c)                                                                                     \
    do {                                                                                                   \
        if (!(c)) {                                                                                        \
            fprintf(stderr, "child: %s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                   \
            _exit(3);                                                                                      \
        }                                                                                                  \
    } while (0)

/* A child's life: opens the store (SQLite dir, or Redis url with consumer name and lease), runs lines with the
 * fake (4 threads, delay_us) until killed, or, with until_final set, until every batch is final; then writes
 * its runner_stats to stats_path (when not NULL) and exits 0. */
void tj_child_run(const char *dir, const char *url, const char *consumer, int lease_ms, int delay_us, bool until_final,
                  const char *stats_path);

#endif
