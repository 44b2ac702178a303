/*
 * api: what the endpoint handlers (api_*.c), the request lifecycle (api_call.c) and the wiring (server.c)
 * share. Everything here runs on the I/O thread except where a comment says otherwise.
 *
 * Who calls whom (no circle: scripts/check_layers.py checks it): server.c routes each request to a handler;
 * the handlers build on api_prepare.c (from a request to scheduler requests) and api_call.c (answers, calls);
 * api_call.c calls back into a handler only through the pump the handler gave its call.
 *
 * One HTTP request that generates is an api_call: it owns one scheduler request per prompt (several for a
 * multi-prompt completion or a batch_generate), lives in the server's list of active calls, and is pumped
 * from on_wake: new tokens become SSE chunks, or, once every request finished, one JSON response. A call
 * whose client went away is cancelled and freed at once; the engine keeps its own reference to each
 * scheduler request until it has dropped it.
 */
#ifndef WAFER_SERVER_API_H
#define WAFER_SERVER_API_H

#include "core/http.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/scheduler.h"
#include "server/chat_template.h"
#include "server/config.h"
#include "core/http.h"
#include "server/metrics.h"
#include "server/observe.h"
#include "server/request_validate.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* A stream stops producing while this much output is queued for its client (backpressure). */
#define API_BACKPRESSURE_BYTES (512 * 1024)

enum api_route {
    ROUTE_HEALTH,
    ROUTE_READY,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_MODEL_ONE, /* GET /v1/models/{id} */
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_GENERATE,
    ROUTE_BATCH,
    ROUTE_GENERATE_STREAM,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_FILES,   /* /v1/files[/{id}[/content]] */
    ROUTE_BATCHES, /* /v1/batches[/{id}[/cancel]] */
    ROUTE_ALERTS,    /* GET /v1/alerts (and /alerts) */
    ROUTE_STATS,     /* GET /v1/stats: the dashboard's data */
    ROUTE_DASHBOARD, /* GET /dashboard */
    ROUTE_COUNT_
};

enum server_state { SERVER_LOADING = 0, SERVER_READY, SERVER_DRAINING };

struct api_call;
struct api_jobs;

struct server {
    struct server_config *cfg;
    struct metrics *metrics;
    struct observe *obs; /* alerts, the dashboard's measures, the batch controller, cost and energy */
    struct http_server *http;
    struct model *model;         /* NULL while loading */
    struct engine *engine;
    struct scheduler *sched;
    struct grammar_cache *grammars; /* compiled response formats and grammars, shared by requests */
    atomic_int state;            /* enum server_state */
    atomic_int n_inflight;       /* calls not yet answered (drain waits for 0) */
    enum chat_family chat;       /* CHAT_NONE: chat requests are refused with chat_err */
    char chat_err[512];
    char *bos_text, *eos_text;
    int n_ctx;
    struct gen_defaults defaults;
    struct api_call *calls; /* active calls (I/O thread) */
    uint64_t next_id;
    int64_t created; /* unix time the model was loaded, for /v1/models */
    struct api_jobs *jobs; /* the Batch API (api_jobs.c); NULL: not started */
    /* Where the answer of a batch line goes instead of a connection (api_jobs.c sets it): status, the JSON
     * body the live endpoint would send, and the request id (NULL when none was made). I/O thread. */
    void (*line_answer)(struct server *srv, uint64_t ticket, int status, const char *body, const char *request_id);
};

struct api_call {
    struct server *srv;
    struct http_conn *conn; /* NULL once the client went away */
    enum api_route route;
    enum api_kind kind;
    void (*pump)(struct api_call *call); /* the handler's: streams what is new, or answers once all finished */
    char id[48];
    int64_t t_start; /* ns, monotonic */
    int64_t created; /* unix seconds */
    bool stream, include_usage, echo;
    int logprobs; /* -1 none */
    int n;        /* choices per prompt */
    int n_reqs;
    struct sched_req **reqs;     /* [n_reqs]; NULL for a batch item that failed before submission */
    struct api_error *item_errs; /* [n_reqs] (batch_generate) */
    char **echo_text;            /* [n_reqs] prompt text for echo, or NULL */
    int *sent;                   /* [n_reqs * n] tokens already streamed per choice */
    size_t *sent_text;           /* [n_reqs * n] bytes of text already streamed per choice */
    uint64_t *seen;              /* [n_reqs] request version at the last pump */
    bool *fin_sent;              /* [n_reqs * n] final chunk sent */
    bool return_token_ids;       /* stream chunks carry token_ids (and the first prompt_token_ids) */
    int *ids_sent;               /* [n_reqs * n] tokens whose ids were streamed; -1: prompt ids not yet */
    bool began;                  /* stream headers sent */
    char cors[384];  /* CORS header lines for the deferred response */
    bool answered; /* a response was sent (and counted) */
    bool logged;   /* its log line was written */
    int status;
    bool batch;      /* a batch line's: answered through srv->line_answer, never streamed */
    uint64_t ticket; /* the batch line's runner ticket */
    struct api_call *prev, *next;
};

/* ---- api_call.c: answers ---- */
const char *api_route_name(enum api_route r);
/* Sets the CORS header lines of the request about to be handled (from server.cors_origins and its Origin). */
void api_cors_begin(struct server *srv, const struct http_request *req);
/* The CORS header lines for this request (empty string when none), valid until the next request. */
const char *api_cors_headers(void);
/* Sends an OpenAI-style error {"error":{"message","type","param","code"}} and counts/logs it. code is the
 * ERR_* code (status and type come from the err table unless status is given, > 0); oa_code overrides the
 * "code" string. extra_headers may be NULL. */
void api_respond_error(struct server *srv, struct http_conn *c, enum api_route route, int status, int code,
                       const char *param, const char *oa_code, const char *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
void api_respond_api_error(struct server *srv, struct http_conn *c, enum api_route route, const struct api_error *e);
/* The HTTP status of e (404 for ERR_NOT_FOUND, else from the err table). */
int api_error_status(const struct api_error *e);
/* Answers e to a connection, or, when ticket is not NULL, to the batch line *ticket (srv->line_answer). */
void api_answer_error(struct server *srv, struct http_conn *c, const uint64_t *ticket, enum api_route route,
                      const struct api_error *e);
/* Serializes j (stolen) and sends it with status; counts it. */
void api_respond_json(struct server *srv, struct http_conn *c, enum api_route route, int status, json_t *j);
/* The OpenAI error object {"error": {...}} (new reference): type from code, "code" is oa_code or code's name. */
json_t *api_error_json(int code, const char *param, const char *oa_code, const char *message);
/* Sends o (stolen) as one server-sent event "data: <json>\n\n". */
int api_sse_send(struct http_conn *c, json_t *o);
/* Valid UTF-8 copy of s[0..len) (invalid bytes become U+FFFD) as a JSON string. */
json_t *api_json_text(const char *s, size_t len);
/* Finish reason of a choice: "stop", "length", or NULL while running. */
const char *api_finish_name(enum sched_finish f);

/* ---- api_call.c: calls ---- */
/* Creates a call for a request that will be answered later, linked into srv->calls; pump is the handler's
 * (api_call_pump calls it). NULL on OOM. */
struct api_call *api_call_create(struct server *srv, struct http_conn *c, enum api_route route, enum api_kind kind,
                                 int n_reqs, void (*pump)(struct api_call *call));
/* Submits every prepared request (reqs[i] != NULL). On failure cancels those already submitted and answers
 * the error itself (429 with Retry-After, 503): returns false, the call is finished. */
bool api_call_submit(struct api_call *call);
/* Pushes what is new to the client (unless the client is gone or its output is backed up): runs the call's
 * pump, which finishes the call once everything was sent. */
void api_call_pump(struct api_call *call);
/* Sends the stream's headers (200, text/event-stream). */
void api_call_stream_begin(struct api_call *call);
/* Ends a stream with "data: [DONE]", counts it with status, and finishes the call. */
void api_call_stream_end(struct api_call *call, int status);
/* Answers 200 with o (stolen) and finishes the call. */
void api_call_respond_json(struct api_call *call, json_t *o);
/* Answers with an error (status from code) and finishes the call; its log line follows at the finish. */
void api_call_respond_error(struct api_call *call, int code, const char *message);
/* Answers e before anything was submitted (logged at once) and finishes the call. */
void api_call_fail(struct api_call *call, const struct api_error *e);
/* Ends the call: unlinks, cancels and drops its scheduler requests, logs its one line, frees. */
void api_call_finish(struct api_call *call);

/* ---- api_prepare.c ---- */
/* Tokenizes a prompt (text with BOS as the model says and special tokens parsed, or token ids checked
 * against the vocabulary). Returns a malloc'd array and its length, or NULL with e filled. */
int32_t *api_tokenize_prompt(struct server *srv, const struct gen_prompt *p, const char *param, int *n_out,
                             struct api_error *e);
/* Decides max_tokens (request, default, context room) and refuses prompts that do not fit the context with
 * context_length_exceeded naming both counts. 0 or the error. */
int api_check_context(struct server *srv, int n_prompt, int max_tokens_req, int *max_tokens, struct api_error *e);
/* Builds a scheduler request from validated parameters. NULL with e filled. */
struct sched_req *api_make_sched_req(struct server *srv, const struct gen_request *g, const int32_t *toks,
                                     int n_toks, int max_tokens, struct api_error *e);
/* Whether model names a served model (NULL or empty: yes); fills e with 404 model_not_found otherwise. */
bool api_model_ok(struct server *srv, const char *model, struct api_error *e);

/* ---- the handlers, called by the router in server.c ---- */
/* api_openai.c */
void api_completions(struct server *srv, struct http_conn *c, const struct http_request *req, bool chat);
/* The same from a body; ticket not NULL: a batch line (c NULL, never streamed, answered via line_answer). */
void api_completions_start(struct server *srv, struct http_conn *c, const uint64_t *ticket, const char *body,
                           size_t body_len, bool chat);
void api_models(struct server *srv, struct http_conn *c, const char *one, size_t one_len);

/* api_simple.c */
void api_generate(struct server *srv, struct http_conn *c, const struct http_request *req);
void api_generate_stream(struct server *srv, struct http_conn *c, const struct http_request *req);
void api_batch_generate(struct server *srv, struct http_conn *c, const struct http_request *req);

/* api_misc.c */
void api_tokenize(struct server *srv, struct http_conn *c, const struct http_request *req);
void api_detokenize(struct server *srv, struct http_conn *c, const struct http_request *req);
void api_health(struct server *srv, struct http_conn *c);
void api_ready(struct server *srv, struct http_conn *c);
void api_metrics(struct server *srv, struct http_conn *c);

/* api_jobs.c: the Batch API (/v1/files, /v1/batches) and the runner that executes batch lines */
/* Opens the store (config jobs.*) and starts the runner; logs where the jobs live. 0 or 1 (logged). */
int api_jobs_start(struct server *srv);
/* Stops the runner (its running lines are cancelled and given back) and closes the store. Main thread,
 * while the I/O thread still runs. NULL-safe. */
void api_jobs_stop(struct server *srv);
/* Stops (if not yet) and frees everything, the store included; once the I/O thread has ended. */
void api_jobs_close(struct server *srv);
/* Whether req's path is one of the Batch API's. */
bool api_jobs_path(const struct http_request *req);
/* Routes a Batch API request (auth already checked). */
void api_jobs_handle(struct server *srv, struct http_conn *c, const struct http_request *req);
/* On the I/O thread at each wake: starts the lines the runner handed over, cancels those it asked to stop. */
void api_jobs_pump(struct server *srv);
/* The body limit of a request: the upload limit for POST /v1/files, else 0 (the server's). */
size_t api_jobs_body_limit(struct server *srv, const struct http_request *req);
/* The jobs' metrics in Prometheus text (wafer_batches, wafer_batch_lines_total, wafer_batch_queue_lines),
 * malloc'd; NULL when jobs are off. */
char *api_jobs_metrics_text(struct server *srv);
/* api_observe.c */
void api_alerts(struct server *srv, struct http_conn *c);
void api_stats(struct server *srv, struct http_conn *c, const struct http_request *req);
void api_dashboard(struct server *srv, struct http_conn *c);

#endif
