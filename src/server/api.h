/*
 * api: what the endpoint handlers (api_*.c), the request lifecycle (api_call.c) and the wiring (server.c)
 * share. Everything here runs on the I/O thread except where a comment says otherwise.
 *
 * Who calls whom (no circle: scripts/check_layers.py checks it): server.c routes each request to a handler;
 * the handlers build on api_prepare.c (from a request to scheduler requests) and api_call.c (answers, calls);
 * api_call.c calls back into a handler only through the pump the handler gave its call.
 *
 * Every request that parses a body is an api_call (the generation endpoints, /tokenize, /detokenize). Its
 * life, in api_call.c:
 *   1. begin (I/O thread): the router creates the call, holds the connection (its body stays readable even
 *      if the client leaves) and hands the handler to the work pool;
 *   2. prepare (a worker thread): the handler parses, validates, templates and tokenizes, and either decides
 *      the answer (an error, or /tokenize's whole result) or leaves scheduler requests in the call;
 *   3. admit (I/O thread): the answer is sent, or the requests are submitted and the handler's start hook
 *      sends the stream headers;
 *   4. pump (I/O thread, from on_wake): new tokens become SSE chunks; once every request finished, a
 *      non-streaming answer is built on a worker again (api_call_defer) and sent from its buffer.
 * So the I/O thread only ever does bounded work: routing, submitting, streaming what is new (bounded by the
 * backpressure limit per wake), copying nothing larger than a chunk. A call whose client went away is
 * cancelled and freed at once, or, while a worker has it, as soon as the worker is done; the engine keeps its
 * own reference to each scheduler request until it has dropped it. A batch line (api_jobs.c) is a call
 * without a connection, begun with api_call_begin_line: the same preparation on a worker, its answer handed
 * to srv->line_answer instead of a client.
 */
#ifndef WAFER_SERVER_API_H
#define WAFER_SERVER_API_H

#include "core/budget.h"
#include "core/http.h"
#include "core/workpool.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/scheduler.h"
#include "server/chat_template.h"
#include "server/config.h"
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
    ROUTE_DRAIN,     /* POST /admin/drain */
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
    struct workpool *pool;       /* preparation and large answers, off the I/O thread */
    struct budget inflight;      /* bytes of request bodies and buffered answers held now (server.max_inflight) */
    int64_t max_response;        /* bytes one buffered answer may reach (server.max_response, resolved) */
    struct model *model;         /* NULL while loading */
    struct engine *engine;
    struct model *draft_model;   /* speculative decoding's (server.draft_model), NULL: none */
    struct engine *draft_engine;
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
    _Atomic uint64_t next_id; /* call and scheduler request ids (I/O and worker threads) */
    int64_t created; /* unix time the model was loaded, for /v1/models */
    struct api_jobs *jobs; /* the Batch API (api_jobs.c); NULL: not started */
    /* Where the answer of a batch line goes instead of a connection (api_jobs.c sets it): status, the JSON
     * body the live endpoint would send, and the request id (NULL when none was made). I/O thread. */
    void (*line_answer)(struct server *srv, uint64_t ticket, int status, const char *body, const char *request_id);
    atomic_uint_fast64_t line_preemptions; /* scheduler preemptions of batch lines' requests (I/O thread writes) */
    _Atomic(struct server_config *) reload; /* SIGHUP: a configuration read again, applied by the I/O thread */
    atomic_bool trim_queued;     /* a malloc_trim job waits in the pool (api_call.c) */
};

struct api_call {
    struct server *srv;
    struct http_conn *conn; /* NULL once the client went away */
    enum api_route route;
    enum api_kind kind;
    void (*pump)(struct api_call *call);  /* the handler's: streams what is new, or answers once all finished */
    void (*start)(struct api_call *call); /* the handler's, or NULL: after submission (stream headers) */
    char peer[64];                        /* the client's address, for the log line even after it left */
    char id[48];
    int64_t t_start; /* ns, monotonic */
    int64_t created; /* unix seconds */
    bool stream, include_usage, echo;
    int logprobs; /* -1 none */
    bool chat_logprobs; /* logprobs entries in chat's shape (chat, or completions' logprobs_format "chat") */
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
    /* chat tools (tool_choice not none): the answers are read back as tool calls (tool_call.h); the
     * arrays are the request's, moved here (owned) */
    bool tools_active;
    bool tool_auto;  /* tool_choice auto: an answer may be text */
    bool *tool_text; /* [n_reqs * n] the choice's answer is known to be text: streamed as it comes */
    int tool_fmt;    /* enum chat_tool_format */
    struct chat_tool *tools;
    char **tool_params;
    int n_tools;
    char cors[384];  /* CORS header lines for the deferred response */
    bool answered; /* a response was sent (and counted) */
    bool logged;   /* its log line was written */
    bool submitted; /* its requests went to the scheduler */
    int status;
    int64_t reserved; /* bytes of srv->inflight held for its answer, given back at the finish */
    bool batch;       /* a batch line's: no connection, answered through srv->line_answer, never streamed */
    uint64_t ticket;  /* the batch line's runner ticket */
    char *line;       /* the batch line's body (owned, NUL-terminated), read by prepare instead of req->body */
    size_t line_len;

    /* work on a worker thread (api_call_defer): while busy the worker owns the fields below and the ones it
     * fills; the I/O thread's pumps skip the call, and a finish waits until the work is done */
    bool busy;
    struct workpool_job job;
    void (*work)(struct api_call *call);
    struct http_conn *held;         /* the conn held while a worker reads its request (NULL otherwise) */
    const struct http_request *req; /* that request: valid while held */

    /* the answer decided by the work (or by a pump), sent by the I/O thread from this buffer */
    bool has_answer;
    int ans_status;
    char *ans_body; /* malloc'd JSON */
    size_t ans_len;
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
/* Starts the life of a request that parses its body (I/O thread): creates its call, linked into srv->calls,
 * holds c and runs prepare(call) on a worker, with call->req the request. prepare fills the call (kind,
 * pump, start, reqs via api_call_set_reqs) or decides its answer (api_call_respond_*, api_call_fail); the
 * I/O thread then sends that answer, or submits the requests, calls start and pumps. Answers 503 itself
 * when out of memory. */
void api_call_begin(struct server *srv, struct http_conn *c, const struct http_request *req, enum api_route route,
                    void (*prepare)(struct api_call *call));
/* The same for a batch line (I/O thread): a call with no connection, batch and ticket set, that takes body
 * (malloc'd, NUL-terminated, body_len bytes; freed with the call, or here on failure) for prepare to read as
 * call->line. Its answer, whatever it is, goes to srv->line_answer (status 0 when it stopped before
 * answering); batch lines are not counted in the request metrics. */
void api_call_begin_line(struct server *srv, uint64_t ticket, char *body, size_t body_len, enum api_route route,
                         void (*prepare)(struct api_call *call));
/* Runs work(call) on a worker (I/O thread): for a pump whose answer is large to build. work must end with an
 * answer (api_call_respond_*); it is sent when the work is done. */
void api_call_defer(struct api_call *call, void (*work)(struct api_call *call));
/* Allocates the call's n request slots (reqs, echo_text); false on OOM. Once, while preparing. */
bool api_call_set_reqs(struct api_call *call, int n);
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
/* The answers of a call. On the I/O thread each one is sent at once and finishes the call; on a worker it is
 * kept and sent, finishing the call, when the work is done. Either way the call must not be used after. */
/* 200 with o (stolen), serialized here. */
void api_call_respond_json(struct api_call *call, json_t *o);
/* status with a JSON body already serialized (taken: malloc'd, freed by the server). */
void api_call_respond_body(struct api_call *call, int status, char *body, size_t len);
/* An error: status from code. */
void api_call_respond_error(struct api_call *call, int code, const char *message);
/* The error e (param and OpenAI code kept; 404 for ERR_NOT_FOUND). */
void api_call_fail(struct api_call *call, const struct api_error *e);
/* Ends the call: unlinks, cancels and drops its scheduler requests, logs its one line, frees. */
void api_call_finish(struct api_call *call);

/* ---- api_prepare.c (worker threads: these read only what is fixed while the server runs) ---- */
struct tok_span;
/* Tokenizes len bytes of text on a worker (tokenizer_encode_spans with plain/n_plain when spans, else
 * tokenizer_encode_alloc with parse_special), holding the tokenizer's transient memory (about 48 bytes per
 * byte of text) in the in-flight budget meanwhile. The number of ids with *out (the caller frees), or a
 * negative error with e filled for param: 413 input_too_large when that memory alone passes
 * server.max_inflight, 503 server_busy when the budget is full now, the tokenizer's own errors. */
int api_encode(struct server *srv, const char *text, size_t len, bool add_special, bool parse_special,
               const struct tok_span *plain, size_t n_plain, bool spans, int32_t **out, const char *param,
               struct api_error *e);
/* Tokenizes a prompt: text with BOS as the model says, special-token text parsed only when parse_special
 * (else it is plain text), or token ids checked against the vocabulary. Returns a malloc'd array and its
 * length, or NULL with e filled. */
int32_t *api_tokenize_prompt(struct server *srv, const struct gen_prompt *p, bool parse_special, const char *param,
                             int *n_out, struct api_error *e);
/* Renders messages with the server's chat template and tokenizes the result (BOS as the model says): the
 * template's markup becomes special tokens, the message contents never do (special-token text a user writes
 * stays text); tools[0..n_tools) are listed to the model in the family's tool format (n_tools 0: none). A
 * malloc'd array and its length, or NULL with e filled (param "messages"). */
int32_t *api_tokenize_chat(struct server *srv, const struct chat_message *msgs, int n_msgs,
                           const struct chat_tool *tools, int n_tools, bool add_generation_prompt, int *n_out,
                           struct api_error *e);
/* Checks an answer of `bytes` against server.max_response (400 naming what makes it that large: what, e.g.
 * "64 prompts x 16 choices x 120 max_tokens x 21 logprob entries") and reserves it in the server's in-flight
 * budget (503, retry later, when full). true when reserved (given back when the call finishes). */
bool api_reserve_answer(struct api_call *call, int64_t bytes, const char *what, struct api_error *e);
/* api_reserve_answer for the non-streaming answer of the call's prepared requests (stream, n, logprobs and
 * reqs set): its size is estimated from choices x max_tokens x the bytes of a token with its logprobs, on the
 * high side. Streaming calls hold no answer: always true. */
bool api_reserve_generation(struct api_call *call, struct api_error *e);
/* Decides max_tokens (request, default, context room) and refuses prompts that do not fit the context with
 * context_length_exceeded naming both counts. 0 or the error. */
int api_check_context(struct server *srv, int n_prompt, int max_tokens_req, int *max_tokens, struct api_error *e);
/* Builds a scheduler request from validated parameters. NULL with e filled. */
struct sched_req *api_make_sched_req(struct server *srv, const struct gen_request *g, const int32_t *toks,
                                     int n_toks, int max_tokens, struct api_error *e);
/* Whether model names a served model (NULL or empty: yes); fills e with 404 model_not_found otherwise. */
bool api_model_ok(struct server *srv, const char *model, struct api_error *e);

/* ---- the handlers, called by the router in server.c ----
 * Those taking a call are prepare functions for api_call_begin: they run on a worker with call->req. */
/* api_openai.c */
void api_completions(struct api_call *call); /* completions and chat, by call->route */
void api_models(struct server *srv, struct http_conn *c, const char *one, size_t one_len);

/* api_simple.c */
void api_generate(struct api_call *call);
void api_generate_stream(struct api_call *call);
void api_batch_generate(struct api_call *call);

/* api_misc.c */
void api_tokenize(struct api_call *call);
void api_detokenize(struct api_call *call);
void api_health(struct server *srv, struct http_conn *c);
void api_ready(struct server *srv, struct http_conn *c);
/* POST /admin/drain: with auth.admin_keys a Bearer admin key, else a loopback peer; then the drain of
 * SIGTERM (202 {"status":"draining"}): new work gets 503, requests in flight finish, the process exits. */
void api_drain(struct server *srv, struct http_conn *c, const struct http_request *req);
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
/* The dashboard's view of the batch jobs: {batches: {<status>: count, ...} (every process sharing the store),
 * in_progress: [{id, status, total, completed, failed, created_at}] (the unfinished ones among the 50
 * newest), queue_lines}; NULL when the Batch API is off or the store cannot be read. Caller owns it. */
json_t *api_jobs_progress(struct server *srv);
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
