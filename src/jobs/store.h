/*
 * store: the interface between the job front end (jobs.c: validation, ids, JSON rendering, the finalization
 * flow) and its two implementations, store_sqlite.c and store_redis.c. Private to src/jobs/.
 *
 * What an implementation must guarantee, whatever moment the process dies at:
 *   - file_write_* makes content durable but invisible; file_publish (or batch_end for output files) makes it
 *     visible atomically with its metadata. Content never published is removed by the implementation.
 *   - batch_insert makes the batch and all its lines visible at once, or nothing.
 *   - lines_commit stores each result once per (batch, idx): the first committed result wins, and the batch's
 *     completed/failed counts move in the same atomic step as the result, so counts equal committed results.
 *   - batch_transition and batch_end are compare-and-set on the status: exactly one caller wins.
 * Every function returns 0 or an ERR_* code with a sentence in err (ERR_MSG_MAX bytes); ERR_UNAVAILABLE when
 * the store cannot be reached now (a retry later may succeed), ERR_NO_SPACE when its disk or memory is full.
 * Calls are serialized by the caller (jobs.c holds the store's mutex around each).
 */
#ifndef WAFER_JOBS_STORE_H
#define WAFER_JOBS_STORE_H

#include "jobs/jobs.h"

#define JOBS_NAME_MAX 256
#define JOBS_STATUS_BIT(st) (1u << (st))

struct jobs_file_rec {
    char id[JOBS_ID_MAX];
    int64_t bytes;
    int64_t created_at; /* unix seconds */
    char filename[JOBS_NAME_MAX];
    char purpose[32]; /* "batch" (uploads) or "batch_output" (output and error files) */
};

struct jobs_batch_rec {
    char id[JOBS_ID_MAX];
    char endpoint[32];
    char input_file_id[JOBS_ID_MAX];
    char completion_window[16];
    enum jobs_status status;
    enum jobs_status final_status; /* while finalizing: the status it ends in */
    char output_file_id[JOBS_ID_MAX], error_file_id[JOBS_ID_MAX]; /* "": none */
    int64_t created_at, expires_at;
    int64_t at[JOBS_STATUS_COUNT]; /* at[st]: when it entered st (unix seconds), 0: never; at[VALIDATING] unused */
    int64_t total, completed, failed;
    char *metadata; /* owned JSON object text, NULL: none */
    char error_code[32];
    char error_message[ERR_MSG_MAX]; /* why it failed (status failed), else "" */
};

/* One parsed input line, for batch_insert. */
struct jobs_input_line {
    char *custom_id;
    char *body; /* compact JSON text */
};

struct jobs_backend;

/* Called by results_scan for each committed result in idx order. Non-zero stops the scan with that code. */
typedef int (*jobs_result_fn)(void *ctx, int64_t idx, const char *text, size_t len, bool is_error);

struct jobs_backend_ops {
    void (*close)(struct jobs_backend *b);

    /* files */
    int (*file_write_begin)(struct jobs_backend *b, const char *id, void **w, char *err);
    int (*file_write)(struct jobs_backend *b, void *w, const void *p, size_t n, char *err);
    /* keep: make the content durable (not yet visible); !keep: drop it. Frees w either way. */
    int (*file_write_end)(struct jobs_backend *b, void *w, bool keep, char *err);
    /* Removes content written with keep but never published (a lost race at batch_end). */
    void (*file_discard)(struct jobs_backend *b, const char *id);
    int (*file_publish)(struct jobs_backend *b, const struct jobs_file_rec *f, char *err);
    int (*file_get)(struct jobs_backend *b, const char *id, struct jobs_file_rec *f, char *err);
    /* Newest first, created before `after` (NULL: all), purpose filter NULL: all; out has room for max. */
    int (*file_list)(struct jobs_backend *b, const char *purpose, const char *after, int max,
                     struct jobs_file_rec *out, int *n, char *err);
    int (*file_read)(struct jobs_backend *b, const char *id, char **data, size_t *len, char *err);
    int (*file_delete)(struct jobs_backend *b, const char *id, char *err);

    /* batches */
    int (*batch_insert)(struct jobs_backend *b, const struct jobs_batch_rec *rec, const struct jobs_input_line *lines,
                        int64_t n, char *err);
    int (*batch_get)(struct jobs_backend *b, const char *id, struct jobs_batch_rec *out, char *err);
    /* Newest first, created before `after` (NULL: all); out has room for max. */
    int (*batch_list)(struct jobs_backend *b, const char *after, int max, struct jobs_batch_rec *out, int *n,
                      char *err);
    /* The batches not yet in a final status (validating, in_progress, cancelling, finalizing), oldest first,
     * malloc'd into *out (caller frees with jobs_batch_rec_free_array). */
    int (*batch_active)(struct jobs_backend *b, struct jobs_batch_rec **out, int *n, char *err);
    /* If the status is in from_mask: sets status to `to` and at[to] = now; final_status when to is finalizing;
     * error_code/message when to is failed. *applied: whether it did. *old (may be NULL): the status seen. */
    int (*batch_transition)(struct jobs_backend *b, const char *id, unsigned from_mask, enum jobs_status to,
                            enum jobs_status final_status, int64_t now, const char *error_code,
                            const char *error_message, bool *applied, enum jobs_status *old, char *err);
    /* finalizing -> to (completed, expired, cancelled), publishing the output and error files (NULL: none) in
     * the same atomic step. *applied false: someone else ended it (the caller discards its files). */
    int (*batch_end)(struct jobs_backend *b, const char *id, enum jobs_status to, const struct jobs_file_rec *out,
                     const struct jobs_file_rec *errf, int64_t now, bool *applied, char *err);
    /* Lines of batch id held by a live worker now. */
    int (*batch_inflight)(struct jobs_backend *b, const char *id, int64_t *n, char *err);
    /* Whether this process may finalize batch id now (Redis: a lock with a lease; SQLite: always). */
    int (*finalize_lock)(struct jobs_backend *b, const char *id, bool *owner, char *err);

    /* lines */
    /* Claims up to max pending lines, oldest batch first. On ERR_NO_SPACE (max >= 1), out[0].batch_id names the
     * batch whose lines did not fit, or is left as the caller set it (jobs.c: "") when it cannot say; *n is 0. */
    int (*lines_claim)(struct jobs_backend *b, struct jobs_line *out, int max, int *n, char *err);
    int (*lines_commit)(struct jobs_backend *b, const struct jobs_result *res, int n, char *err);
    int (*lines_renew)(struct jobs_backend *b, const struct jobs_line *lines, int n, bool *lost, char *err);
    int (*lines_release)(struct jobs_backend *b, const struct jobs_line *lines, int n, char *err);
    /* Commits an error line {code, message} for every line of the batch without a result (idempotent). */
    int (*results_fill)(struct jobs_backend *b, const struct jobs_batch_rec *rec, const char *code,
                        const char *message, char *err);
    int (*results_scan)(struct jobs_backend *b, const struct jobs_batch_rec *rec, jobs_result_fn fn, void *ctx,
                        char *err);

    int (*stats)(struct jobs_backend *b, struct jobs_stats *out, char *err);
};

struct jobs_backend {
    const struct jobs_backend_ops *ops;
};

/* The implementations. NULL with err filled on failure. */
struct jobs_backend *jobs_sqlite_open(const char *data_dir, char *err);
struct jobs_backend *jobs_redis_open(const char *url, const char *consumer, int lease_ms, char *err);

/* Shared helpers (store_common.c), below both the stores and jobs.c. */
void jobs_batch_rec_deinit(struct jobs_batch_rec *r);
void jobs_batch_rec_free_array(struct jobs_batch_rec *r, int n);
/* Status from its OpenAI name; -1 when unknown. */
int jobs_status_parse(const char *name);
/* The error line of a line that never got a response (jobs_result_text with no response). malloc'd. */
char *jobs_result_error_text(const char *batch_id, int64_t idx, const char *custom_id, const char *code,
                             const char *message);
/* The id of a line's result, deterministic per (batch, line) so a line computed twice gets the same id. */
void jobs_request_line_id(char *buf, size_t size, const char *batch_id, int64_t idx);
/* Fills buf with prefix + n random lowercase hex/alnum characters. */
void jobs_id_make(char *buf, size_t size, const char *prefix);
int64_t jobs_now(void); /* unix seconds */

#endif
