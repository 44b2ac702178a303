/*
 * jobs: durable batch jobs behind OpenAI's Batch API (/v1/files, /v1/batches). The HTTP handlers call the
 * functions below and send what they return: every object is rendered as the jansson value OpenAI's API
 * returns (file object, batch object with every field, list objects), every failure as an ERR_* code (its
 * HTTP status comes from core/err.h) with a struct jobs_err carrying the sentence, OpenAI's "code" and the
 * offending "param".
 *
 * One interface, two stores (store.h): SQLite in WAL mode plus the uploaded files under a data dir (the
 * default: one process per data dir), or Redis (`redis://[:password@]HOST:PORT[/DB]`) shared by any number of
 * processes, lines handed out through a stream's consumer group with renewed leases. In both, a line's result
 * is committed before it counts as done and output files are assembled at finalization from committed results,
 * so a process killed at any moment loses no finished line and puts no custom_id twice in the output
 * (docs/jobs.md says what each mode guarantees).
 *
 * The line API (jobs_lines_*, jobs_store_tick) is for runner.c, which executes the lines; the file and batch
 * API is for the handlers. Threads: every function may be called from any thread (the store serializes its
 * connection with a mutex); a batch's lines are only ever claimed by one runner per store handle.
 */
#ifndef WAFER_JOBS_JOBS_H
#define WAFER_JOBS_JOBS_H

#include "core/err.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JOBS_ID_MAX 48                           /* ids such as "batch_<24 hex>" and their NUL */
#define JOBS_DEFAULT_MAX_FILE_BYTES (200u << 20) /* OpenAI's limit: 200 MB per input file */
#define JOBS_DEFAULT_MAX_LINES 50000             /* OpenAI's limit: 50,000 requests per batch */
#define JOBS_DEFAULT_LEASE_MS 30000

/* A batch's status, OpenAI's names (jobs_status_name). Each status but validating has a "<name>_at" field. */
enum jobs_status {
    JOBS_VALIDATING = 0,
    JOBS_FAILED,
    JOBS_IN_PROGRESS,
    JOBS_FINALIZING,
    JOBS_COMPLETED,
    JOBS_EXPIRED,
    JOBS_CANCELLING,
    JOBS_CANCELLED,
    JOBS_STATUS_COUNT
};

struct jobs_config {
    const char *data_dir;    /* NULL or "": $XDG_DATA_HOME/wafer, else $HOME/.local/share/wafer (SQLite mode) */
    const char *queue;       /* NULL or "": SQLite under data_dir; "redis://[:password@]HOST:PORT[/DB]": Redis */
    uint64_t max_file_bytes; /* 0: JOBS_DEFAULT_MAX_FILE_BYTES; larger uploads are refused with 413 */
    int max_lines;           /* 0: JOBS_DEFAULT_MAX_LINES; more lines in a file are refused with 400 */
    int lease_ms;            /* Redis: a claimed line not renewed for this long goes to another worker
                                (0: JOBS_DEFAULT_LEASE_MS); renewed every lease_ms / 3 */
    const char *consumer;    /* Redis: this worker's consumer name (NULL: "<host>:<pid>:<random>") */
};

/* A failure as the handlers report it: {"error": {"message", "type": err_openai_type(code), "param", "code"}}. */
struct jobs_err {
    char message[ERR_MSG_MAX];
    const char *code;  /* OpenAI "code" (a static string such as "duplicate_custom_id"), NULL: err_name() */
    const char *param; /* the request parameter at fault ("endpoint", "file", ...) or NULL */
};

struct jobs_store; /* opaque */

/* Opens (creating when absent) the store cfg describes. SQLite: creates the data dir, takes its lock (a second
 * process on the same dir is refused with a message naming it), resumes what a previous process left:
 * claimed-but-unfinished lines go back to pending, half-written files are removed. Redis: connects (an
 * unreachable server is an error that says so). NULL with err filled on failure. */
struct jobs_store *jobs_store_open(const struct jobs_config *cfg, struct jobs_err *err);

/* Closes the store; NULL is a no-op. No runner may still use it. */
void jobs_store_close(struct jobs_store *s);

/* Where the jobs live, for the startup log line: "SQLite in /home/u/.local/share/wafer" or
 * "Redis at 127.0.0.1:6379 db 0". Owned by the store. */
const char *jobs_store_where(const struct jobs_store *s);

/* How often a runner must renew the leases of the lines it runs, in ms; 0: never (SQLite: no leases). */
int jobs_store_renew_ms(const struct jobs_store *s);

/* The default data dir in buf (PATH_MAX bytes): $XDG_DATA_HOME/wafer or $HOME/.local/share/wafer. */
void jobs_default_data_dir(char *buf, size_t size);

/* OpenAI's name of a status ("in_progress", ...). */
const char *jobs_status_name(enum jobs_status st);

/* ---- files: POST/GET /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id} ---- */

/* Stores an uploaded file (the bytes of the multipart "file" part; filename as sent, NULL: "upload.jsonl").
 * purpose must be "batch"; the content must be a Batch API input file: one JSON object per line with
 * custom_id (unique string), method "POST", url and body (an object), at most max_lines lines and
 * max_file_bytes bytes (else ERR_TOO_LARGE: 413). A malformed line is refused naming its line number.
 * *out: the file object (caller decrefs). */
int jobs_file_create(struct jobs_store *s, const char *filename, const char *purpose, const void *data, size_t len,
                     json_t **out, struct jobs_err *err);

/* *out: the file object of id (ERR_NOT_FOUND when there is none). Caller decrefs. */
int jobs_file_get(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err);

/* *out: {"object":"list","data":[file objects, newest first],"first_id","last_id","has_more"}, at most
 * limit (1..10000; 0: 10000) files created before the file `after` (NULL: from the newest), only those with
 * purpose `purpose` when not NULL. Caller decrefs. */
int jobs_file_list(struct jobs_store *s, const char *purpose, int limit, const char *after, json_t **out,
                   struct jobs_err *err);

/* The bytes of file id in *data (malloc'd, caller frees; NUL-terminated for convenience) and *len. */
int jobs_file_content(struct jobs_store *s, const char *id, char **data, size_t *len, struct jobs_err *err);

/* Deletes file id; *out: {"id","object":"file","deleted":true}. Caller decrefs. */
int jobs_file_delete(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err);

/* ---- batches: POST/GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel ---- */

/* Creates a batch from the request body {input_file_id, endpoint, completion_window, metadata}: endpoint
 * "/v1/completions" or "/v1/chat/completions", every line's url equal to it; completion_window "24h" (or any
 * "<N>s|m|h" from 1s to 168h); metadata null or up to 16 string pairs (keys <= 64 chars, values <= 512).
 * The batch starts in_progress with its lines pending. *out: the batch object. Caller decrefs. */
int jobs_batch_create(struct jobs_store *s, const json_t *request, json_t **out, struct jobs_err *err);

/* *out: the batch object of id (ERR_NOT_FOUND when there is none). Caller decrefs. */
int jobs_batch_get(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err);

/* *out: {"object":"list","data":[batch objects, newest first],"first_id","last_id","has_more"}: at most
 * limit (1..100; 0: 20, OpenAI's default) batches created before batch `after` (NULL: from the newest). */
int jobs_batch_list(struct jobs_store *s, int limit, const char *after, json_t **out, struct jobs_err *err);

/* Cancels batch id: validating or in_progress becomes cancelling (lines in flight finish, no new line starts;
 * once none is in flight it is finalized as cancelled, the lines that never ran listed in the error file as
 * "batch_cancelled"). Cancelling or cancelled: returned as it is. Any other status: ERR_INVALID_ARG.
 * *out: the batch object. Caller decrefs. */
int jobs_batch_cancel(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err);

/* ---- metrics ---- */

struct jobs_stats {
    int64_t batches[JOBS_STATUS_COUNT]; /* wafer_batches{status}: batches in each status, all processes */
    int64_t queue_lines;                /* wafer_batch_queue_lines: lines of running batches no worker holds */
};

int jobs_store_stats(struct jobs_store *s, struct jobs_stats *out, struct jobs_err *err);

/* ---- lines: the runner's side ---- */

/* One claimed line. The runner owns it until it commits or releases it. */
struct jobs_line {
    char batch_id[JOBS_ID_MAX];
    char endpoint[32];  /* the batch's endpoint, "/v1/completions" or "/v1/chat/completions" */
    int64_t idx;        /* 0-based position among the batch's lines (input order) */
    char *custom_id;    /* owned */
    char *body;         /* owned: the line's body, compact JSON object text */
    char entry[32];     /* the store's handle of the claim (Redis stream entry id) */
    bool reclaimed;     /* an earlier claim of this line was lost (process killed, lease expired) */
};

/* Frees a line's strings. */
void jobs_line_deinit(struct jobs_line *l);

/* Claims up to max pending lines of in_progress batches, oldest batch first, into out[0..*n). 0 with *n == 0
 * when nothing is pending. ERR_UNAVAILABLE: the store cannot be
 * reached now (Redis down): try again later. */
int jobs_lines_claim(struct jobs_store *s, struct jobs_line *out, int max, int *n, struct jobs_err *err);

/* The result of one line, as the line of the output file (is_error false) or of the error file. */
struct jobs_result {
    const struct jobs_line *line;
    char *text;    /* one JSON object, no newline (jobs_result_text builds it) */
    bool is_error; /* goes to the error file and counts as failed */
};

/* Builds the output/error line of a line: {"id","custom_id","response":{"status_code","request_id","body"},
 * "error":null} when a response came back (status_code > 0, body_json its JSON text; a status outside 2xx makes
 * it an error line, as OpenAI does), or {"id","custom_id","response":null,"error":{"code","message"}} when none
 * did. request_id NULL: one is made up. Returns malloc'd text (caller frees) or NULL when out of memory or when
 * body_json is not JSON (then error_code/message should be used instead). */
char *jobs_result_text(const struct jobs_line *line, int status_code, const char *request_id,
                       const char *body_json, const char *error_code, const char *error_message, bool *is_error);

/* Commits results durably, all or none, before they count as done. A line whose result is already committed
 * (computed twice, or finished by expiry/cancel) keeps its first result. ERR_NO_SPACE: the disk (or Redis's
 * memory) is full: the batches of these results have been failed with code "disk_full" and the results are
 * dropped. ERR_UNAVAILABLE: not committed, try again later; other codes: not committed. */
int jobs_lines_commit(struct jobs_store *s, const struct jobs_result *res, int n, struct jobs_err *err);

/* Renews the leases of lines still running (Redis; a no-op for SQLite). lost[i] (may be NULL) is set when line
 * i went to another worker: its result will still be accepted, and dropped if the other's came first. */
int jobs_lines_renew(struct jobs_store *s, const struct jobs_line *lines, int n, bool *lost, struct jobs_err *err);

/* Gives lines back unfinished (shutdown): they become pending for any worker at once. */
int jobs_lines_release(struct jobs_store *s, const struct jobs_line *lines, int n, struct jobs_err *err);

/* Housekeeping, called by the runner about once a second: finalizes the batches whose lines are all done
 * (output and error files assembled from committed results, status completed), whose completion window has
 * passed (unfinished lines become "batch_expired" error lines, status expired) and the cancelling ones with no
 * line in flight (status cancelled); resumes a finalization a dead process left. *changed (may be NULL):
 * how many batches were finalized. */
int jobs_store_tick(struct jobs_store *s, int *changed, struct jobs_err *err);

#endif
