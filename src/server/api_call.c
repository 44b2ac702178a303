/*
 * api_call: the life of every request the server answers, in one place.
 *
 *   - answering: JSON bodies, OpenAI-shaped errors, server-sent events, and the CORS lines of the request
 *     being handled; every answer is counted in the metrics and gets one log line;
 *   - calls (requests that parse a body: generation, /tokenize, /detokenize): begun by the router, which
 *     holds the connection and hands the handler's prepare function to the work pool; admitted when the
 *     work comes back (the decided answer is sent, or the prepared scheduler requests are submitted and the
 *     handler's start hook runs); pumped from on_wake and on_writable (the pump streams what is new, or, once
 *     every request finished, has the answer built on a worker with api_call_defer); cancelled when the
 *     client goes away (at once, or when a worker that has the call is done with it); finished exactly once,
 *     with the one log line of the request (prompt and generated tokens, time to first token, finish reason,
 *     the peer, kept even after the client left);
 *   - batch lines (api_jobs.c, api_call_begin_line): the same calls without a connection; their answer,
 *     whatever decided it, goes to srv->line_answer in api_call_deliver (status 0 when the call ended
 *     unanswered, so the line runs again), and they are not counted in the request metrics.
 *
 * Answers decided on a worker are kept in the call and sent by the I/O thread from that buffer
 * (http_respond_take): the I/O thread never builds or copies an answer whose size depends on the request.
 * The memory an answer may take was reserved by the handler (api_reserve_answer) and is given back at the
 * finish.
 *
 * The handlers (api_*.c) build on this file and the router (server.c) calls them; nothing here calls a
 * handler by name: a call carries its handler's prepare, pump and start, so the files form no circle. A call
 * reaches its scheduler requests only through sched_req_status_get and sched_req_read. Everything runs on
 * the I/O thread except the work functions (a worker owns the call while busy is set).
 */
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "server/api.h"

#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Work that touched this many bytes (body parsed, answer built) returns its free memory to the system. */
#define API_TRIM_BYTES (1 << 20)
/* Bytes of engine output per generated token and logprob entry, to tell a large output without reading it. */
#define API_TRIM_TOKEN_BYTES 16

static const char *const route_names[ROUTE_COUNT_] = {
    [ROUTE_HEALTH] = "/health",
    [ROUTE_READY] = "/ready",
    [ROUTE_METRICS] = "/metrics",
    [ROUTE_MODELS] = "/v1/models",
    [ROUTE_MODEL_ONE] = "/v1/models",
    [ROUTE_COMPLETIONS] = "/v1/completions",
    [ROUTE_CHAT] = "/v1/chat/completions",
    [ROUTE_GENERATE] = "/v1/generate",
    [ROUTE_BATCH] = "/v1/batch_generate",
    [ROUTE_GENERATE_STREAM] = "/v1/generate_stream",
    [ROUTE_TOKENIZE] = "/tokenize",
    [ROUTE_DETOKENIZE] = "/detokenize",
    [ROUTE_FILES] = "/v1/files",
    [ROUTE_BATCHES] = "/v1/batches",
    [ROUTE_ALERTS] = "/v1/alerts",
    [ROUTE_STATS] = "/v1/stats",
    [ROUTE_DASHBOARD] = "/dashboard",
    [ROUTE_DRAIN] = "/admin/drain",
};

const char *api_route_name(enum api_route r) { return r < ROUTE_COUNT_ ? route_names[r] : "other"; }

/* CORS header lines of the request being handled (I/O thread only). */
static char cur_cors[384];

const char *api_cors_headers(void) { return cur_cors; }

void api_cors_begin(struct server *srv, const struct http_request *req)
{
    cur_cors[0] = 0;
    const struct server_config *cfg = srv->cfg;
    if (!cfg->n_cors_origins)
        return;
    const struct http_header *h = http_request_header(req, "origin");
    if (!h || h->value_len > 200)
        return;
    bool any = false, match = false;
    for (int i = 0; i < cfg->n_cors_origins; i++) {
        any |= !strcmp(cfg->cors_origins[i], "*");
        match |= strlen(cfg->cors_origins[i]) == h->value_len && !strncmp(cfg->cors_origins[i], h->value, h->value_len);
    }
    if (any)
        snprintf(cur_cors, sizeof cur_cors, "Access-Control-Allow-Origin: *\r\n");
    else if (match)
        snprintf(cur_cors, sizeof cur_cors, "Access-Control-Allow-Origin: %.*s\r\nVary: Origin\r\n",
                 (int)h->value_len, h->value);
}

static double ms_since(int64_t t0) { return (double)(clock_now_ns() - t0) / 1e6; }

/* ---------------------------------------------------------------- answers */

/* The one log line of a request (server.log_requests off, and the probes, log it at debug level). */
static void api_log_line(const struct server *srv, const char *id, enum api_route route, int status, int prompt,
                         int gen, double ttft_ms, double total_ms, const char *finish, const char *peer)
{
    bool quiet = !srv->cfg->log_requests || route == ROUTE_HEALTH || route == ROUTE_READY || route == ROUTE_METRICS ||
                 route == ROUTE_ALERTS || route == ROUTE_STATS || route == ROUTE_DASHBOARD;
    /* cost.per_hour set: the request's share of the machine (its tokens at the last minute's cost per token) */
    char cost[48] = "";
    double usd = gen > 0 ? observe_request_cost(srv->obs, gen) : NAN;
    if (isfinite(usd))
        snprintf(cost, sizeof cost, " cost_usd=%.8f", usd);
    log_write(quiet ? LOG_DEBUG : LOG_INFO,
              "request %s %s status=%d prompt_tokens=%d generated_tokens=%d ttft_ms=%.1f total_ms=%.1f finish=%s "
              "peer=%s%s",
              id && *id ? id : "-", api_route_name(route), status, prompt, gen, ttft_ms, total_ms,
              finish ? finish : "-", peer ? peer : "-", cost);
}

json_t *api_json_text(const char *s, size_t len)
{
    /* jansson refuses invalid UTF-8; token pieces can be partial sequences, so repair them first */
    json_t *j = json_stringn(s, len);
    if (j)
        return j;
    char *fixed = malloc(len * 3 + 1);
    if (!fixed)
        return json_string("");
    size_t w = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned char b = u[i];
        int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + (size_t)n <= len;
        for (int k = 1; ok && k < n; k++)
            ok = (u[i + (size_t)k] & 0xC0) == 0x80;
        if (ok && n > 1) {
            json_t *probe = json_stringn((const char *)u + i, (size_t)n); /* overlong, surrogates */
            ok = probe != NULL;
            json_decref(probe);
        }
        if (ok && b != 0) {
            memcpy(fixed + w, u + i, (size_t)n);
            w += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(fixed + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    j = json_stringn(fixed, w);
    free(fixed);
    return j ? j : json_string("");
}

const char *api_finish_name(enum sched_finish f)
{
    switch (f) {
    case SCHED_STOP: return "stop";
    case SCHED_LENGTH: return "length";
    case SCHED_ERROR: return "error";
    default: return NULL;
    }
}

json_t *api_error_json(int code, const char *param, const char *oa_code, const char *message)
{
    json_t *e = json_object();
    json_object_set_new(e, "message", api_json_text(message, strlen(message)));
    json_object_set_new(e, "type", json_string(err_openai_type(code)));
    json_object_set_new(e, "param", param && *param ? json_string(param) : json_null());
    json_object_set_new(e, "code", json_string(oa_code && *oa_code ? oa_code : err_name(code)));
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

void api_respond_json(struct server *srv, struct http_conn *c, enum api_route route, int status, json_t *j)
{
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        http_respond(c, 500, "application/json", cur_cors, oom, sizeof oom - 1);
        status = 500;
    } else {
        http_respond(c, status, "application/json", cur_cors, body, strlen(body));
        free(body);
    }
    metrics_request(srv->metrics, api_route_name(route), status);
}

static void api_respond_error_v(struct server *srv, struct http_conn *c, enum api_route route, int status, int code,
                                const char *param, const char *oa_code, const char *extra_headers,
                                const char *message)
{
    if (status <= 0)
        status = err_http_status(code);
    json_t *j = api_error_json(code, param, oa_code, message);
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char headers[1024];
    snprintf(headers, sizeof headers, "%s%s", cur_cors, extra_headers ? extra_headers : "");
    if (body) {
        http_respond(c, status, "application/json", headers, body, strlen(body));
        free(body);
    } else {
        static const char empty[] = "{}";
        http_respond(c, 500, "application/json", headers, empty, sizeof empty - 1);
    }
    metrics_request(srv->metrics, api_route_name(route), status);
    api_log_line(srv, NULL, route, status, 0, 0, 0, 0, NULL, http_conn_peer(c));
    log_debug("error %d on %s: %s", status, api_route_name(route), message);
}

void api_respond_error(struct server *srv, struct http_conn *c, enum api_route route, int status, int code,
                       const char *param, const char *oa_code, const char *extra_headers, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_respond_error_v(srv, c, route, status, code, param, oa_code, extra_headers, msg);
}

int api_error_status(const struct api_error *e) { return e->code == ERR_NOT_FOUND ? 404 : err_http_status(e->code); }

void api_respond_api_error(struct server *srv, struct http_conn *c, enum api_route route, const struct api_error *e)
{
    api_respond_error_v(srv, c, route, api_error_status(e), e->code, e->param, e->oa_code, NULL, e->message);
}

int api_sse_send(struct http_conn *c, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        return ERR_NOMEM;
    /* one write per event: one chunk on the wire, never an event split across chunks */
    static const char head[] = "data: ", tail[] = "\n\n";
    size_t n = strlen(s), nh = sizeof head - 1, nt = sizeof tail - 1;
    char *ev = malloc(nh + n + nt);
    if (!ev) {
        free(s);
        return ERR_NOMEM;
    }
    memcpy(ev, head, nh);
    memcpy(ev + nh, s, n);
    memcpy(ev + nh + n, tail, nt);
    int rc = http_stream_write(c, ev, nh + n + nt);
    free(ev);
    free(s);
    return rc;
}

/* ---------------------------------------------------------------- calls */

static struct api_call *api_call_create(struct server *srv, struct http_conn *c, enum api_route route)
{
    struct api_call *call = calloc(1, sizeof *call);
    if (!call)
        return NULL;
    call->srv = srv;
    call->conn = c;
    call->route = route;
    call->kind = route == ROUTE_CHAT ? API_CHAT : route == ROUTE_COMPLETIONS ? API_COMPLETIONS : API_GENERATE;
    call->n = 1;
    call->logprobs = -1;
    call->t_start = clock_now_ns();
    call->created = (int64_t)time(NULL);
    snprintf(call->cors, sizeof call->cors, "%s", cur_cors);
    snprintf(call->peer, sizeof call->peer, "%s", c ? http_conn_peer(c) : "-");
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = (uint64_t)call->t_start;
    const char *prefix = route == ROUTE_CHAT ? "chatcmpl-" : route == ROUTE_COMPLETIONS ? "cmpl-" : "gen-";
    snprintf(call->id, sizeof call->id, "%s%016llx%06llx", prefix, (unsigned long long)rnd,
             (unsigned long long)((atomic_fetch_add(&srv->next_id, 1) + 1) & 0xffffff));
    call->next = srv->calls;
    if (srv->calls)
        srv->calls->prev = call;
    srv->calls = call;
    atomic_fetch_add(&srv->n_inflight, 1);
    if (c)
        http_conn_set_data(c, call);
    return call;
}

bool api_call_set_reqs(struct api_call *call, int n)
{
    call->reqs = calloc((size_t)(n > 0 ? n : 1), sizeof *call->reqs);
    call->echo_text = calloc((size_t)(n > 0 ? n : 1), sizeof *call->echo_text);
    if (!call->reqs || !call->echo_text) {
        free(call->reqs);
        free(call->echo_text);
        call->reqs = NULL;
        call->echo_text = NULL;
        return false;
    }
    call->n_reqs = n;
    return true;
}

/* Allocates the per-choice progress arrays once n is known. */
static bool api_call_alloc_progress(struct api_call *call)
{
    size_t k = (size_t)call->n_reqs * (size_t)call->n;
    call->sent = calloc(k ? k : 1, sizeof *call->sent);
    call->sent_text = calloc(k ? k : 1, sizeof *call->sent_text);
    call->fin_sent = calloc(k ? k : 1, sizeof *call->fin_sent);
    call->tool_text = calloc(k ? k : 1, sizeof *call->tool_text);
    call->seen = calloc((size_t)(call->n_reqs ? call->n_reqs : 1), sizeof *call->seen);
    call->ids_sent = malloc((k ? k : 1) * sizeof *call->ids_sent);
    for (size_t i = 0; call->ids_sent && i < k; i++)
        call->ids_sent[i] = -1;
    return call->sent && call->sent_text && call->fin_sent && call->tool_text && call->seen && call->ids_sent;
}

/* The first finish reason among a request's choices (NULL while all run). */
static bool first_finish(void *ctx, int c, const struct sched_choice *ch)
{
    const char **finish = ctx;
    *finish = api_finish_name(ch->finish);
    return *finish == NULL;
}

/* A trim of the heaps, on a worker (malloc_trim walks every arena: not for the I/O thread). */
struct api_trim {
    struct workpool_job job; /* first: the callbacks cast back */
    struct server *srv;
};

static void api_trim_run(struct workpool_job *j)
{
    struct api_trim *t = (struct api_trim *)j;
    atomic_store(&t->srv->trim_queued, false); /* frees after this point get a trim of their own */
    malloc_trim(0);
}

static void api_trim_done(struct workpool_job *j) { free(j); }

/* After a call whose output was large: the engine's per-token records and logprobs were many small blocks in
 * its thread's heap, freed just now; give them back to the system. At most one trim waits at a time. */
static void api_call_trim_later(struct server *srv)
{
    if (atomic_exchange(&srv->trim_queued, true))
        return;
    struct api_trim *t = calloc(1, sizeof *t);
    if (!t) {
        atomic_store(&srv->trim_queued, false);
        return;
    }
    t->srv = srv;
    t->job.run = api_trim_run;
    t->job.done = api_trim_done;
    workpool_submit(srv->pool, &t->job);
}

void api_call_finish(struct api_call *call)
{
    struct server *srv = call->srv;
    if (call->busy)
        return; /* a worker still has it: the end of that work finishes it (the conn is gone by then) */
    if (call->prev)
        call->prev->next = call->next;
    else
        srv->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    /* one log line per request */
    int prompt = 0, gen = 0;
    double ttft = 0;
    const char *finish = NULL;
    for (int i = 0; i < call->n_reqs; i++) {
        struct sched_req *r = call->reqs[i];
        if (!r)
            continue;
        struct sched_req_status st;
        sched_req_status_get(r, &st);
        prompt += r->n_prompt;
        gen += st.n_generated;
        if (call->batch)
            atomic_fetch_add(&srv->line_preemptions, (uint64_t)st.preemptions);
        if (!finish)
            sched_req_read(r, first_finish, &finish);
        if (st.t_first_token && (ttft == 0 || (double)(st.t_first_token - r->t_arrival) / 1e6 < ttft))
            ttft = (double)(st.t_first_token - r->t_arrival) / 1e6;
        if (st.error)
            finish = err_name(st.error);
    }
    if (!call->conn && !call->answered)
        finish = "cancelled";
    if (call->batch && !call->answered) /* stopped before it could answer (shutdown): the line runs again */
        srv->line_answer(srv, call->ticket, 0, NULL, NULL);
    if (!call->logged)
        api_log_line(srv, call->id, call->route, call->status ? call->status : 499, prompt, gen, ttft,
                     ms_since(call->t_start), finish, call->peer);
    if (!call->answered && !call->batch)
        metrics_request(srv->metrics, api_route_name(call->route), call->status ? call->status : 499);
    for (int i = 0; i < call->n_reqs; i++) {
        if (call->reqs[i]) {
            if (srv->sched && call->submitted)
                scheduler_cancel(srv->sched, call->reqs[i], ERR_CANCELLED); /* no-op when it finished */
            sched_req_unref(call->reqs[i]);
        }
        free(call->echo_text[i]);
    }
    if (call->held)
        http_conn_release(call->held);
    if (call->conn)
        http_conn_set_data(call->conn, NULL);
    budget_give(&srv->inflight, call->reserved);
    free(call->line);
    free(call->ans_body);
    free(call->reqs);
    free(call->echo_text);
    free(call->item_errs);
    for (int i = 0; i < call->n_tools; i++) {
        free((char *)call->tools[i].name);
        free((char *)call->tools[i].json);
        free(call->tool_params[i]);
    }
    free(call->tools);
    free(call->tool_params);
    free(call->sent);
    free(call->sent_text);
    free(call->fin_sent);
    free(call->tool_text);
    free(call->seen);
    free(call->ids_sent);
    bool large = call->reserved >= API_TRIM_BYTES ||
                 (int64_t)gen * (call->logprobs + 2) * API_TRIM_TOKEN_BYTES >= API_TRIM_BYTES;
    free(call);
    if (large && srv->pool)
        api_call_trim_later(srv);
    atomic_fetch_sub(&srv->n_inflight, 1);
}

/* Sends the call's answer and finishes it (I/O thread). */
static void api_call_deliver(struct api_call *call)
{
    struct server *srv = call->srv;
    int status = call->ans_status;
    char headers[sizeof call->cors + 64];
    snprintf(headers, sizeof headers, "%s%s", call->cors,
             status == 503 || status == 429 ? "Retry-After: 1\r\n" : "");
    if (call->batch) { /* the line's result: the body the endpoint would send, with its id once it ran */
        srv->line_answer(srv, call->ticket, status, call->ans_body, call->submitted ? call->id : NULL);
        free(call->ans_body);
    } else if (call->conn) {
        http_respond_take(call->conn, status, "application/json", headers, call->ans_body, call->ans_len);
    } else {
        free(call->ans_body);
    }
    call->ans_body = NULL;
    call->has_answer = false;
    call->status = status;
    call->answered = true;
    if (!call->batch)
        metrics_request(srv->metrics, api_route_name(call->route), status);
    api_call_finish(call);
}

void api_call_respond_body(struct api_call *call, int status, char *body, size_t len)
{
    static const char oom[] =
        "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    if (!body) {
        status = 500;
        body = strdup(oom);
        len = body ? sizeof oom - 1 : 0;
    }
    free(call->ans_body);
    call->ans_body = body;
    call->ans_len = len;
    call->ans_status = status;
    call->has_answer = true;
    if (!call->busy)
        api_call_deliver(call); /* on the I/O thread: now; a worker's answer goes when its work is done */
}

static void api_call_respond_json_status(struct api_call *call, int status, json_t *o)
{
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    api_call_respond_body(call, status, body, body ? strlen(body) : 0);
}

void api_call_respond_json(struct api_call *call, json_t *o) { api_call_respond_json_status(call, 200, o); }

void api_call_respond_error(struct api_call *call, int code, const char *message)
{
    api_call_respond_json_status(call, err_http_status(code), api_error_json(code, NULL, NULL, message));
}

void api_call_fail(struct api_call *call, const struct api_error *e)
{
    api_call_respond_json_status(call, api_error_status(e), api_error_json(e->code, e->param, e->oa_code, e->message));
}

bool api_call_submit(struct api_call *call)
{
    struct server *srv = call->srv;
    if (!api_call_alloc_progress(call)) {
        api_call_respond_error(call, ERR_NOMEM, "out of memory");
        return false;
    }
    call->submitted = true;
    for (int i = 0; i < call->n_reqs; i++) {
        if (!call->reqs[i])
            continue;
        int rc = scheduler_submit(srv->sched, call->reqs[i]);
        if (rc) {
            /* requests never submitted must not be cancelled through the scheduler: drop them here; the ones
             * already queued are cancelled by api_call_finish */
            for (int k = i; k < call->n_reqs; k++) {
                sched_req_unref(call->reqs[k]);
                call->reqs[k] = NULL;
            }
            char msg[256];
            if (rc == ERR_QUEUE_FULL) {
                snprintf(msg, sizeof msg,
                         "the server is busy: %d requests are already waiting (max_queue); retry later",
                         srv->cfg->max_queue);
                api_call_respond_json_status(call, 429, api_error_json(ERR_QUEUE_FULL, NULL, "queue_full", msg));
            } else {
                snprintf(msg, sizeof msg, "the server is not accepting requests (%s)", err_name(rc));
                api_call_respond_json_status(call, 503, api_error_json(rc, NULL, NULL, msg));
            }
            return false;
        }
    }
    return true;
}

void api_call_stream_begin(struct api_call *call)
{
    http_stream_begin(call->conn, 200, "text/event-stream", call->cors);
    call->began = true;
}

void api_call_stream_end(struct api_call *call, int status)
{
    static const char done[] = "data: [DONE]\n\n";
    http_stream_write(call->conn, done, sizeof done - 1);
    http_stream_end(call->conn);
    call->status = status;
    call->answered = true;
    metrics_request(call->srv->metrics, api_route_name(call->route), status);
    api_call_finish(call);
}

void api_call_pump(struct api_call *call)
{
    if ((!call->conn && !call->batch) || call->busy)
        return;
    if (call->began && http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
        return; /* on_writable resumes */
    memcpy(cur_cors, call->cors, sizeof cur_cors); /* deferred responses carry the request's CORS lines */
    call->pump(call);
}

/* ---------------------------------------------------------------- work off the I/O thread */

static void api_call_job_run(struct workpool_job *j)
{
    struct api_call *call = (struct api_call *)((char *)j - offsetof(struct api_call, job));
    call->work(call);
    /* A large body parsed (a JSON tree of many small objects) or a large answer built leaves free memory in
     * this thread's heap; hand it back to the system now, here rather than on the I/O thread. */
    size_t touched = (call->req ? call->req->body_len : 0) + call->line_len + call->ans_len;
    if (touched >= API_TRIM_BYTES)
        malloc_trim(0);
}

/* The work is done (I/O thread): answer, or admit what the preparation left, or finish a call whose client
 * left meanwhile. */
static void api_call_job_done(struct workpool_job *j)
{
    struct api_call *call = (struct api_call *)((char *)j - offsetof(struct api_call, job));
    struct server *srv = call->srv;
    call->busy = false;
    if (call->held) {
        http_conn_release(call->held);
        call->held = NULL;
        call->req = NULL;
    }
    free(call->line); /* a batch line's body: read by the preparation, not needed after */
    call->line = NULL;
    if ((!call->conn && !call->batch) || !srv->sched) {
        api_call_finish(call); /* the client left (or the server is stopping): nothing to send */
        return;
    }
    if (call->has_answer) {
        api_call_deliver(call);
        return;
    }
    if (call->submitted) { /* a deferred answer that decided nothing: a bug, but the client gets an answer */
        api_call_respond_error(call, ERR_INTERNAL, "the answer could not be built");
        return;
    }
    if (!call->pump) {
        api_call_respond_error(call, ERR_INTERNAL, "the request was not prepared");
        return;
    }
    if (!api_call_submit(call))
        return;
    if (call->start)
        call->start(call);
    api_call_pump(call); /* every item of a batch may have failed already */
}

void api_call_defer(struct api_call *call, void (*work)(struct api_call *call))
{
    call->busy = true;
    call->work = work;
    call->job.run = api_call_job_run;
    call->job.done = api_call_job_done;
    workpool_submit(call->srv->pool, &call->job);
}

void api_call_begin(struct server *srv, struct http_conn *c, const struct http_request *req, enum api_route route,
                    void (*prepare)(struct api_call *call))
{
    struct api_call *call = api_call_create(srv, c, route);
    if (!call) {
        api_respond_error(srv, c, route, 503, ERR_NOMEM, NULL, NULL, "Retry-After: 1\r\n", "out of memory");
        return;
    }
    http_conn_hold(c);
    call->held = c;
    call->req = req;
    api_call_defer(call, prepare);
}

void api_call_begin_line(struct server *srv, uint64_t ticket, char *body, size_t body_len, enum api_route route,
                         void (*prepare)(struct api_call *call))
{
    struct api_call *call = api_call_create(srv, NULL, route);
    if (!call) {
        free(body);
        srv->line_answer(srv, ticket, 0, NULL, NULL); /* out of memory: the line runs again later */
        return;
    }
    call->batch = true;
    call->ticket = ticket;
    call->line = body;
    call->line_len = body_len;
    call->cors[0] = 0; /* nothing is sent to a client */
    snprintf(call->peer, sizeof call->peer, "batch");
    api_call_defer(call, prepare);
}
