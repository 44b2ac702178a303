/*
 * api_call: the life of every request the server answers, in one place.
 *
 *   - answering: JSON bodies, OpenAI-shaped errors, server-sent events, and the CORS lines of the request
 *     being handled; every answer is counted in the metrics and gets one log line;
 *   - calls (requests that generate): created by a handler with the scheduler requests it prepared and its
 *     own pump; submitted; pumped from on_wake and on_writable (the pump streams what is new or answers once
 *     every request finished); cancelled when the client goes away; finished exactly once, with the one log
 *     line of the request (prompt and generated tokens, time to first token, finish reason, peer).
 *
 * The handlers (api_*.c) build on this file and the router (server.c) calls them; nothing here calls a
 * handler by name: a call carries its handler's pump, so the files form no circle. A call reaches its
 * scheduler requests only through sched_req_status_get and sched_req_read. Everything runs on the I/O thread.
 */
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "server/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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

/* Hands a batch line's answer j (stolen) to srv->line_answer. */
static void line_answer_json(struct server *srv, uint64_t ticket, int status, json_t *j, const char *request_id)
{
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    srv->line_answer(srv, ticket, body ? status : 500,
                     body ? body : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}",
                     request_id);
    free(body);
}

void api_answer_error(struct server *srv, struct http_conn *c, const uint64_t *ticket, enum api_route route,
                      const struct api_error *e)
{
    if (!ticket) {
        api_respond_api_error(srv, c, route, e);
        return;
    }
    line_answer_json(srv, *ticket, api_error_status(e), api_error_json(e->code, e->param, e->oa_code, e->message),
                     NULL);
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

struct api_call *api_call_create(struct server *srv, struct http_conn *c, enum api_route route, enum api_kind kind,
                                 int n_reqs, void (*pump)(struct api_call *call))
{
    struct api_call *call = calloc(1, sizeof *call);
    if (!call)
        return NULL;
    call->reqs = calloc((size_t)n_reqs, sizeof *call->reqs);
    call->echo_text = calloc((size_t)n_reqs, sizeof *call->echo_text);
    if (!call->reqs || !call->echo_text) {
        free(call->reqs);
        free(call->echo_text);
        free(call);
        return NULL;
    }
    call->srv = srv;
    call->conn = c;
    call->route = route;
    call->kind = kind;
    call->pump = pump;
    call->n_reqs = n_reqs;
    call->n = 1;
    call->logprobs = -1;
    call->t_start = clock_now_ns();
    call->created = (int64_t)time(NULL);
    snprintf(call->cors, sizeof call->cors, "%s", cur_cors);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = (uint64_t)call->t_start;
    const char *prefix = route == ROUTE_CHAT ? "chatcmpl-" : route == ROUTE_COMPLETIONS ? "cmpl-" : "gen-";
    snprintf(call->id, sizeof call->id, "%s%016llx%06llx", prefix, (unsigned long long)rnd,
             (unsigned long long)(++srv->next_id & 0xffffff));
    call->next = srv->calls;
    if (srv->calls)
        srv->calls->prev = call;
    srv->calls = call;
    atomic_fetch_add(&srv->n_inflight, 1);
    if (c)
        http_conn_set_data(c, call);
    return call;
}

/* Allocates the per-choice progress arrays once n is known. */
static bool api_call_alloc_progress(struct api_call *call)
{
    size_t k = (size_t)call->n_reqs * (size_t)call->n;
    call->sent = calloc(k ? k : 1, sizeof *call->sent);
    call->sent_text = calloc(k ? k : 1, sizeof *call->sent_text);
    call->fin_sent = calloc(k ? k : 1, sizeof *call->fin_sent);
    call->seen = calloc((size_t)call->n_reqs, sizeof *call->seen);
    call->ids_sent = malloc((k ? k : 1) * sizeof *call->ids_sent);
    for (size_t i = 0; call->ids_sent && i < k; i++)
        call->ids_sent[i] = -1;
    return call->sent && call->sent_text && call->fin_sent && call->seen && call->ids_sent;
}

/* The first finish reason among a request's choices (NULL while all run). */
static bool first_finish(void *ctx, int c, const struct sched_choice *ch)
{
    const char **finish = ctx;
    *finish = api_finish_name(ch->finish);
    return *finish == NULL;
}

void api_call_finish(struct api_call *call)
{
    struct server *srv = call->srv;
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
                     ms_since(call->t_start), finish,
                     call->batch ? "batch" : call->conn ? http_conn_peer(call->conn) : NULL);
    if (!call->answered && !call->batch)
        metrics_request(srv->metrics, api_route_name(call->route), call->status ? call->status : 499);
    for (int i = 0; i < call->n_reqs; i++) {
        if (call->reqs[i]) {
            if (srv->sched)
                scheduler_cancel(srv->sched, call->reqs[i], ERR_CANCELLED); /* no-op when it finished */
            sched_req_unref(call->reqs[i]);
        }
        free(call->echo_text[i]);
    }
    if (call->conn)
        http_conn_set_data(call->conn, NULL);
    free(call->reqs);
    free(call->echo_text);
    free(call->item_errs);
    free(call->sent);
    free(call->sent_text);
    free(call->fin_sent);
    free(call->seen);
    free(call->ids_sent);
    free(call);
    atomic_fetch_sub(&srv->n_inflight, 1);
}

void api_call_fail(struct api_call *call, const struct api_error *e)
{
    api_answer_error(call->srv, call->conn, call->batch ? &call->ticket : NULL, call->route, e);
    call->answered = true;
    call->logged = true;
    api_call_finish(call);
}

bool api_call_submit(struct api_call *call)
{
    struct server *srv = call->srv;
    if (!api_call_alloc_progress(call)) {
        if (call->batch)
            line_answer_json(srv, call->ticket, 503, api_error_json(ERR_NOMEM, NULL, NULL, "out of memory"), NULL);
        else
            api_respond_error(srv, call->conn, call->route, 503, ERR_NOMEM, NULL, NULL, NULL, "out of memory");
        call->answered = true;
        call->logged = true;
        api_call_finish(call);
        return false;
    }
    for (int i = 0; i < call->n_reqs; i++) {
        if (!call->reqs[i])
            continue;
        int rc = scheduler_submit(srv->sched, call->reqs[i]);
        if (rc) {
            /* the ones already queued are cancelled by api_call_finish */
            if (call->batch)
                line_answer_json(srv, call->ticket, rc == ERR_QUEUE_FULL ? 429 : 503,
                                 api_error_json(rc, NULL, NULL, "the server cannot take the request now"), NULL);
            else if (rc == ERR_QUEUE_FULL)
                api_respond_error(srv, call->conn, call->route, 429, ERR_QUEUE_FULL, NULL, "queue_full",
                                  "Retry-After: 1\r\n",
                                  "the server is busy: %d requests are already waiting (max_queue); retry later",
                                  srv->cfg->max_queue);
            else
                api_respond_error(srv, call->conn, call->route, 503, rc, NULL, NULL, NULL,
                                  "the server is not accepting requests (%s)", err_name(rc));
            call->answered = true;
            call->logged = true;
            call->status = rc == ERR_QUEUE_FULL ? 429 : 503;
            /* requests never submitted must not be cancelled through the scheduler: drop them here */
            for (int k = i; k < call->n_reqs; k++) {
                sched_req_unref(call->reqs[k]);
                call->reqs[k] = NULL;
            }
            api_call_finish(call);
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

void api_call_respond_json(struct api_call *call, json_t *o)
{
    call->status = 200;
    call->answered = true;
    if (call->batch)
        line_answer_json(call->srv, call->ticket, 200, o, call->id);
    else
        api_respond_json(call->srv, call->conn, call->route, 200, o);
    api_call_finish(call);
}

void api_call_respond_error(struct api_call *call, int code, const char *message)
{
    int status = err_http_status(code);
    call->status = status;
    call->answered = true;
    if (call->batch)
        line_answer_json(call->srv, call->ticket, status, api_error_json(code, NULL, NULL, message), call->id);
    else
        api_respond_json(call->srv, call->conn, call->route, status, api_error_json(code, NULL, NULL, message));
    api_call_finish(call);
}

void api_call_pump(struct api_call *call)
{
    if (!call->conn && !call->batch)
        return;
    if (call->began && http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
        return; /* on_writable resumes */
    memcpy(cur_cors, call->cors, sizeof cur_cors); /* deferred responses carry the request's CORS lines */
    call->pump(call);
}
