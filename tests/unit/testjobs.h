/*
 * testjobs: helpers for the job store tests: input files, a batch in one call, and the check every batch test
 * ends with: each custom_id exactly once across the output and error files, each result the one its line asked
 * for.
 */
#ifndef WAFER_TESTS_TESTJOBS_H
#define WAFER_TESTS_TESTJOBS_H

#include "jobs/jobs.h"

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

#endif
