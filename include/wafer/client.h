/*
 * wafer/client.h: the C client library of wafer (libwafer-client), for programs that call a `wafer serve`
 * server, or any OpenAI-compatible one, over HTTP.
 *
 *   struct wafer_client_options o;
 *   wafer_client_options_default(&o);
 *   o.base_url = "http://127.0.0.1:8080";
 *   char err[WAFER_ERR_MAX];
 *   struct wafer_client *c = wafer_client_create(&o, err);
 *   struct wafer_result r;
 *   if (wafer_generate(c, "Once upon a time", NULL, &r) == WAFER_OK)
 *       printf("%s\n", r.text);
 *   else
 *       fprintf(stderr, "%s\n", r.error);
 *   wafer_result_free(&r);
 *   wafer_client_destroy(c);
 *
 * Link with -lwafer-client -lcurl -ljansson -lpthread (pkg-config wafer-client).
 *
 * Requests: generate is POST /v1/completions, chat POST /v1/chat/completions, streaming with server-sent
 * events (stream: true, usage included). batch_generate sends one completion per prompt, several at once.
 *
 * Connections are kept alive and reused between calls (libcurl multi handles, each a connection pool, lent
 * to one call at a time; DNS and TLS sessions shared across them). Every function may be called from any
 * number of threads at once on one client.
 *
 * Timeouts: connect, first byte (until the response headers arrive: for a non-streaming request that is
 * the whole generation, for a stream the time to the first token), total (one attempt). A timed-out
 * attempt is retried like a connection error.
 *
 * Retries, as the OpenAI SDKs do them: up to max_retries (default 2) more attempts after a connection
 * error, a timeout, or HTTP 408, 409, 429 or 5xx (a response header "x-should-retry: true/false" overrides
 * the status). The wait before retry n (0-based) is the server's Retry-After-Ms or Retry-After (seconds or
 * an HTTP date) when it is in (0, 60] seconds, else min(0.5 * 2^n, 8) s * (1 - 0.25 * random). A stream is
 * never retried once its response has begun: the caller may already have shown its text.
 *
 * Batch jobs: OpenAI's Batch API (POST /v1/files, /v1/batches, GET /v1/files/{id}/content), against wafer
 * serve or any server that has it: wafer_jobs_submit uploads a JSONL file and creates a batch, wafer_jobs_get,
 * _wait, _results, _cancel and _list follow it. Every one of their requests is retried as above, the upload
 * too (it is sent again whole, from memory).
 */
#ifndef WAFER_CLIENT_H
#define WAFER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WAFER_API __attribute__((visibility("default")))
#else
#define WAFER_API
#endif

#define WAFER_ERR_MAX 256

/* Status of a call: WAFER_OK or one of the negative codes. */
enum wafer_status {
    WAFER_OK = 0,
    WAFER_E_INVALID = -1,   /* a bad argument (NULL, empty prompt list, bad option) */
    WAFER_E_NOMEM = -2,     /* out of memory */
    WAFER_E_CONNECT = -3,   /* no connection, or it broke before a whole response (after the retries) */
    WAFER_E_TIMEOUT = -4,   /* the connect, first-byte or total timeout passed (after the retries) */
    WAFER_E_HTTP = -5,      /* the server answered an error status (http_status; its message in error) */
    WAFER_E_PROTOCOL = -6,  /* the answer is not what the API defines (not JSON, no choices, ...) */
    WAFER_E_STREAM = -7,    /* a stream broke after it began (an error event, a cut, no [DONE]) */
    WAFER_E_CANCELLED = -8, /* the stream callback returned non-zero */
    WAFER_E_BATCH = -9,     /* batch_generate: some items failed (each result has its own status) */
    WAFER_E_NO_FILE = -10,  /* jobs_results: the batch has no such file (not ended yet, or no line is in it) */
};

/* Short stable name of a status ("ok", "timeout", "http", ...). Never NULL. */
WAFER_API const char *wafer_status_name(int status);

struct wafer_client_options {
    const char *base_url;       /* the server, e.g. "http://127.0.0.1:8080" (a trailing "/v1" is accepted) */
    const char *api_key;        /* sent as "Authorization: Bearer KEY"; NULL: none */
    const char *model;          /* the requests' "model" unless wafer_params.model says; NULL: left out */
    long connect_timeout_ms;    /* default 10000 */
    long first_byte_timeout_ms; /* until the response headers; default 0: no limit of its own */
    long timeout_ms;            /* one whole attempt; default 600000 (10 minutes); 0: none */
    int max_retries;            /* default 2 */
    int max_connections;        /* idle connections kept per pool; default 16 */
    /* Optional: told before each retry (attempt: the one about to be made, 2 for the first retry; delay_s:
     * the wait; why: "HTTP 503", "connection refused", ...). Called from the calling thread. */
    void (*on_retry)(void *ud, int attempt, double delay_s, const char *why);
    void *on_retry_ud;
};

/* Fills the defaults above (base_url "http://127.0.0.1:8080"). */
WAFER_API void wafer_client_options_default(struct wafer_client_options *o);

struct wafer_client; /* opaque */

/* A client for one server. The options' strings are copied. Returns NULL with a message in err
 * (WAFER_ERR_MAX bytes, may be NULL) when an option is invalid. Free with wafer_client_destroy. */
WAFER_API struct wafer_client *wafer_client_create(const struct wafer_client_options *o, char *err);
/* Closes the pooled connections. No call may be running on the client. NULL is a no-op. */
WAFER_API void wafer_client_destroy(struct wafer_client *c);

/* Sampling and limits of one request. Fields left at their defaults are not sent (the server's apply). */
struct wafer_params {
    const char *model;          /* NULL: the client's */
    int max_tokens;             /* 0: the server's default */
    double temperature;         /* < 0: the server's default; 0 = greedy */
    double top_p;               /* < 0: the server's default */
    long long seed;             /* used when seed_set */
    bool seed_set;
    const char *const *stop;    /* n_stop stop strings (the text ends before one) */
    int n_stop;
    const char *extra_json;     /* NULL, or a JSON object whose fields are added to the request body
                                 * (e.g. "{\"top_k\": 40, \"ignore_eos\": true}") */
};
WAFER_API void wafer_params_default(struct wafer_params *p);

/* The outcome of one request. Owned by the caller; release its text with wafer_result_free. */
struct wafer_result {
    int status;                /* WAFER_OK or a WAFER_E_* code (also the function's return value) */
    int http_status;           /* the last attempt's HTTP status; 0 when none arrived */
    char *text;                /* the generated text (NUL-terminated), or for a stream what arrived before it
                                * broke; NULL when nothing did */
    size_t text_len;
    char finish_reason[16];    /* "stop", "length", or "" */
    int prompt_tokens;         /* from the response's usage; -1 when absent */
    int completion_tokens;
    int attempts;              /* requests sent: 1 + retries */
    char error[WAFER_ERR_MAX]; /* what went wrong ("" when ok) */
};
/* Frees r->text and clears r. r itself may live anywhere. */
WAFER_API void wafer_result_free(struct wafer_result *r);

/* Called with each piece of streamed text, as it arrives (a token or a few, whole UTF-8 characters as the
 * server sends them). Return 0 to go on, non-zero to stop the stream (status WAFER_E_CANCELLED). */
typedef int (*wafer_stream_fn)(void *ud, const char *text, size_t len);

/* One completion of prompt (params may be NULL: the defaults). Blocks until done. Returns out->status. */
WAFER_API int wafer_generate(struct wafer_client *c, const char *prompt, const struct wafer_params *params,
                             struct wafer_result *out);
/* The same, streamed: fn gets the text as it is generated; out gets all of it at the end. */
WAFER_API int wafer_generate_stream(struct wafer_client *c, const char *prompt, const struct wafer_params *params,
                                    wafer_stream_fn fn, void *ud, struct wafer_result *out);

struct wafer_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
};
/* A chat completion of n messages (the server applies the model's chat template). Returns out->status. */
WAFER_API int wafer_chat(struct wafer_client *c, const struct wafer_message *msgs, int n,
                         const struct wafer_params *params, struct wafer_result *out);
WAFER_API int wafer_chat_stream(struct wafer_client *c, const struct wafer_message *msgs, int n,
                                const struct wafer_params *params, wafer_stream_fn fn, void *ud,
                                struct wafer_result *out);

/* Completions of n prompts, up to concurrency at once (<= 0: 8), each retried on its own. results[i] (n of
 * them, filled by this call) is prompts[i]'s, whatever order they finish in. Returns WAFER_OK when every
 * item succeeded, WAFER_E_BATCH when some failed (see each results[i].status), or WAFER_E_INVALID. */
WAFER_API int wafer_batch_generate(struct wafer_client *c, const char *const *prompts, int n,
                                   const struct wafer_params *params, int concurrency,
                                   struct wafer_result *results);

/* GET of any path (e.g. "/ready", "/v1/models"), retried as above: the body in out->text. WAFER_OK for a
 * 2xx answer, WAFER_E_HTTP (with the body in out->text too) otherwise. A connection error or timeout names
 * the URL in out->error ("cannot reach URL: ..."), as the batch-job calls do. */
WAFER_API int wafer_get(struct wafer_client *c, const char *path, struct wafer_result *out);

/* ---------------------------------------------------------------- batch jobs */

#define WAFER_ID_MAX 128 /* ids longer than 127 bytes are refused (WAFER_E_PROTOCOL / WAFER_E_INVALID) */

/* A batch, as the server's batch object says (docs/jobs.md). Strings are "" where the server sent null. */
struct wafer_job {
    char id[WAFER_ID_MAX];
    char status[16];               /* validating, in_progress, finalizing, completed, failed, expired,
                                    * cancelling, cancelled */
    bool final;                    /* status is completed, failed, expired or cancelled: it changes no more */
    char endpoint[64];             /* "/v1/chat/completions" or "/v1/completions" */
    char completion_window[16];
    char input_file_id[WAFER_ID_MAX];
    char output_file_id[WAFER_ID_MAX]; /* "" until the batch ends, and when no line succeeded */
    char error_file_id[WAFER_ID_MAX];  /* "" until the batch ends, and when no line failed */
    long long total, completed, failed; /* request_counts */
    long long created_at, completed_at; /* unix seconds; 0 when null */
    char errors[WAFER_ERR_MAX];    /* the batch's own errors (why it failed), one "code: message" a line */
};

/* An uploaded file (the file object of POST /v1/files). */
struct wafer_file {
    char id[WAFER_ID_MAX];
    long long bytes;
    char filename[256];
    char purpose[32];
};

/* What wafer_jobs_submit sends. Zero it ({0}) for the defaults, then set path or data. */
struct wafer_job_request {
    const char *path;              /* the JSONL file to upload, one request a line; or NULL and: */
    const char *data;              /* the JSONL bytes themselves (len of them) */
    size_t len;
    const char *filename;          /* the upload's file name; NULL: path's last part, else "batch.jsonl" */
    const char *endpoint;          /* NULL: the "url" of the first request line, else "/v1/chat/completions" */
    const char *completion_window; /* NULL: "24h" */
    const char *const *metadata;   /* n_metadata pairs: metadata[2i] a key, metadata[2i + 1] its value */
    int n_metadata;
};

/* Uploads the requests (POST /v1/files, multipart/form-data, purpose "batch") and creates a batch of them
 * (POST /v1/batches). job (may be NULL) gets the new batch; file (may be NULL) the uploaded file, set as soon
 * as the upload succeeded, so also when the creation then failed. out->text is the last answer's body (the
 * batch object; an error body for WAFER_E_HTTP). Returns out->status: WAFER_E_INVALID for a request that
 * cannot be sent (no path nor data, a file that cannot be read: out->error says which), else as any call. */
WAFER_API int wafer_jobs_submit(struct wafer_client *c, const struct wafer_job_request *req, struct wafer_job *job,
                                struct wafer_file *file, struct wafer_result *out);

/* The batch id (GET /v1/batches/{id}) into job (may be NULL); out->text is its JSON. An unknown id is
 * WAFER_E_HTTP with http_status 404 and the server's message in out->error; an id that is not a plain
 * token (letters, digits, "-", "_", ".", "~") is WAFER_E_INVALID and sends nothing. */
WAFER_API int wafer_jobs_get(struct wafer_client *c, const char *id, struct wafer_job *job, struct wafer_result *out);

/* Called by wafer_jobs_wait after each look at the batch (the last one too). Return 0 to go on waiting,
 * non-zero to stop (wafer_jobs_wait then returns WAFER_E_CANCELLED). */
typedef int (*wafer_job_progress_fn)(void *ud, const struct wafer_job *job);

/* Looks at batch id every interval_s seconds (<= 0: 1) until it is final (job->final), and returns WAFER_OK
 * then, whatever the final status (completed or not: see job->status). WAFER_E_TIMEOUT when timeout_s (> 0;
 * <= 0: no limit) passed first, WAFER_E_CANCELLED when fn (may be NULL) asked to stop, or the error of a look
 * (each retried as any request). job (may be NULL) and out->text: the batch as last seen. */
WAFER_API int wafer_jobs_wait(struct wafer_client *c, const char *id, double interval_s, double timeout_s,
                              wafer_job_progress_fn fn, void *ud, struct wafer_job *job, struct wafer_result *out);

/* The output file of batch id (errors false: the lines that got a 2xx answer) or its error file (errors true:
 * the rest), as JSONL bytes in out->text (out->text_len of them; free with wafer_result_free). Looks the
 * batch up first: job (may be NULL) gets it. WAFER_E_NO_FILE when the batch has no such file: not final yet
 * (job->final false), or no line of that kind. */
WAFER_API int wafer_jobs_results(struct wafer_client *c, const char *id, bool errors, struct wafer_job *job,
                                 struct wafer_result *out);

/* The bytes of any file (GET /v1/files/{id}/content) in out->text, out->text_len of them. */
WAFER_API int wafer_files_content(struct wafer_client *c, const char *file_id, struct wafer_result *out);

/* Cancels batch id (POST /v1/batches/{id}/cancel): no new line starts, lines in flight finish. job (may be
 * NULL) gets the batch as the answer says (cancelling, or already final). */
WAFER_API int wafer_jobs_cancel(struct wafer_client *c, const char *id, struct wafer_job *job,
                                struct wafer_result *out);

/* The latest batches, newest first (GET /v1/batches?limit=&after=): limit 1..100 (<= 0: the server's default,
 * 20), after (may be NULL) a batch id to list from. *jobs gets a new array of *n batches (NULL when none),
 * which the caller frees with wafer_jobs_free; has_more (may be NULL) whether more are older. out->text is
 * the list object. On an error *jobs is NULL and *n 0. */
WAFER_API int wafer_jobs_list(struct wafer_client *c, int limit, const char *after, struct wafer_job **jobs, int *n,
                              bool *has_more, struct wafer_result *out);
/* Frees what wafer_jobs_list returned. NULL is a no-op. */
WAFER_API void wafer_jobs_free(struct wafer_job *jobs);

#ifdef __cplusplus
}
#endif

#endif
