/*
 * server: wiring and the request plumbing every endpoint shares.
 *
 * Threads: the main thread loads the model and then only waits for signals (blocked everywhere, taken with
 * sigtimedwait, so no code runs in a signal handler); the I/O thread runs the epoll loop and every handler;
 * the engine thread runs the scheduler. The I/O thread never blocks on the engine: it submits requests and
 * is woken (http_server_wake) when they have output.
 *
 * Routing is a fixed table (method, path) -> handler; a known path with the wrong method is 405 with Allow,
 * an unknown path 404, both in the OpenAI error shape. Auth (Bearer keys, compared in constant time) covers
 * every route but /health, /ready and /metrics; CORS preflights are answered here.
 */
#include "server/server.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
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
};

const char *api_route_name(enum api_route r) { return r < ROUTE_COUNT_ ? route_names[r] : "other"; }

/* CORS header lines of the request being handled (I/O thread only). */
static char cur_cors[384];

const char *api_cors_headers(void) { return cur_cors; }

static double ms_since(int64_t t0) { return (double)(sched_now_ns() - t0) / 1e6; }

/* ---------------------------------------------------------------- responses */

static bool log_requests = true; /* server.log_requests: off moves the per-request lines to debug */

static void api_log_line(const char *id, enum api_route route, int status, int prompt, int gen, double ttft_ms,
                         double total_ms, const char *finish, const char *peer)
{
    bool quiet = !log_requests || route == ROUTE_HEALTH || route == ROUTE_READY || route == ROUTE_METRICS;
    log_write(quiet ? LOG_DEBUG : LOG_INFO,
              "request %s %s status=%d prompt_tokens=%d generated_tokens=%d ttft_ms=%.1f total_ms=%.1f finish=%s "
              "peer=%s",
              id && *id ? id : "-", api_route_name(route), status, prompt, gen, ttft_ms, total_ms,
              finish ? finish : "-", peer ? peer : "-");
}

void api_respond_json(struct server *srv, struct http_conn *c, enum api_route route, int status, json_t *j)
{
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        http_respond(c, 500, "application/json", cur_cors,
                     "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                     88);
        status = 500;
    } else {
        http_respond(c, status, "application/json", cur_cors, body, strlen(body));
        free(body);
    }
    metrics_request(srv->metrics, api_route_name(route), status);
}

static json_t *api_error_json(const char *message, const char *type, const char *param, const char *code)
{
    json_t *e = json_object();
    json_object_set_new(e, "message", api_json_text(message, strlen(message)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param && *param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code && *code ? json_string(code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

static void api_respond_error_v(struct server *srv, struct http_conn *c, enum api_route route, int status, int code,
                                const char *param, const char *oa_code, const char *extra_headers,
                                const char *message)
{
    if (status <= 0)
        status = err_http_status(code);
    json_t *j = api_error_json(message, err_openai_type(code), param, oa_code ? oa_code : err_name(code));
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char headers[1024];
    snprintf(headers, sizeof headers, "%s%s", cur_cors, extra_headers ? extra_headers : "");
    if (body) {
        http_respond(c, status, "application/json", headers, body, strlen(body));
        free(body);
    } else {
        http_respond(c, 500, "application/json", headers, "{}", 2);
    }
    metrics_request(srv->metrics, api_route_name(route), status);
    api_log_line(NULL, route, status, 0, 0, 0, 0, NULL, http_conn_peer(c));
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

int api_sse_send(struct http_conn *c, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        return ERR_NOMEM;
    /* one write per event: one chunk on the wire, never an event split across chunks */
    size_t n = strlen(s);
    char *ev = malloc(n + 9);
    if (!ev) {
        free(s);
        return ERR_NOMEM;
    }
    memcpy(ev, "data: ", 6);
    memcpy(ev + 6, s, n);
    memcpy(ev + 6 + n, "\n\n", 2);
    int rc = http_stream_write(c, ev, n + 8);
    free(ev);
    free(s);
    return rc;
}

void api_call_respond_error(struct api_call *call, int code, const char *message)
{
    int status = err_http_status(code);
    json_t *j = api_error_json(message, err_openai_type(code), NULL, err_name(code));
    call->status = status;
    call->answered = true;
    api_respond_json(call->srv, call->conn, call->route, status, j);
}

void api_respond_api_error(struct server *srv, struct http_conn *c, enum api_route route, const struct api_error *e)
{
    int status = err_http_status(e->code);
    if (e->code == ERR_NOT_FOUND)
        status = 404;
    api_respond_error_v(srv, c, route, status, e->code, e->param, e->oa_code, NULL, e->message);
}

/* ---------------------------------------------------------------- shared request helpers */

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

bool api_model_ok(struct server *srv, const char *model, struct api_error *e)
{
    const struct server_config *cfg = srv->cfg;
    if (!model || !*model || !strcmp(model, cfg->model_name))
        return true;
    for (int i = 0; i < cfg->n_aliases; i++)
        if (!strcmp(model, cfg->aliases[i]))
            return true;
    api_error_set(e, ERR_NOT_FOUND, "model", "model_not_found",
                  "The model '%.200s' does not exist; this server serves '%s'%s (see GET /v1/models)", model,
                  cfg->model_name, cfg->n_aliases ? " and its aliases" : "");
    return false;
}

int32_t *api_tokenize_prompt(struct server *srv, const struct gen_prompt *p, const char *param, int *n_out,
                             struct api_error *e)
{
    const struct tokenizer *tok = srv->model->tok;
    int n_vocab = tokenizer_n_vocab(tok);
    if (p->tokens) {
        for (int i = 0; i < p->n_tokens; i++)
            if (p->tokens[i] >= n_vocab) {
                api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' holds token id %d, outside the vocabulary [0, %d)",
                              param, p->tokens[i], n_vocab);
                return NULL;
            }
        int32_t *t = malloc((size_t)(p->n_tokens ? p->n_tokens : 1) * sizeof *t);
        if (!t) {
            api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
            return NULL;
        }
        memcpy(t, p->tokens, (size_t)p->n_tokens * sizeof *t);
        *n_out = p->n_tokens;
        return t;
    }
    size_t len = strlen(p->text);
    int cap = (int)(len < (1u << 28) ? len : (1u << 28)) + 8;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t) {
        api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
        return NULL;
    }
    int n = tokenizer_encode(tok, p->text, len, true, true, t, cap);
    if (n > cap) {
        int32_t *nt = realloc(t, (size_t)n * sizeof *t);
        if (!nt) {
            free(t);
            api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
            return NULL;
        }
        t = nt;
        n = tokenizer_encode(tok, p->text, len, true, true, t, n);
    }
    if (n < 0) {
        free(t);
        api_error_set(e, n, param, NULL, "cannot tokenize '%s': %s", param, err_name(n));
        return NULL;
    }
    *n_out = n;
    return t;
}

int api_check_context(struct server *srv, int n_prompt, int max_tokens_req, int *max_tokens, struct api_error *e)
{
    int n_ctx = srv->n_ctx;
    if (n_prompt < 1)
        return api_error_set(e, ERR_INVALID_ARG, "prompt", NULL,
                             "the prompt is empty after tokenization and the model adds no BOS token");
    if (max_tokens_req > 0) {
        if ((int64_t)n_prompt + max_tokens_req > n_ctx)
            return api_error_set(e, ERR_CONTEXT_LENGTH, "max_tokens", "context_length_exceeded",
                                 "This model's maximum context length is %d tokens. However, you requested %lld "
                                 "tokens (%d in the prompt, %d for the completion). Please reduce the prompt or "
                                 "max_tokens.",
                                 n_ctx, (long long)n_prompt + max_tokens_req, n_prompt, max_tokens_req);
        *max_tokens = max_tokens_req;
        return 0;
    }
    if (n_prompt >= n_ctx)
        return api_error_set(e, ERR_CONTEXT_LENGTH, "prompt", "context_length_exceeded",
                             "This model's maximum context length is %d tokens. However, your prompt has %d "
                             "tokens, which leaves no room for a completion (%d tokens too many). Please reduce "
                             "the prompt.",
                             n_ctx, n_prompt, n_prompt - n_ctx + 1);
    int room = n_ctx - n_prompt;
    *max_tokens = srv->defaults.max_new_tokens < room ? srv->defaults.max_new_tokens : room;
    return 0;
}

struct sched_req *api_make_sched_req(struct server *srv, const struct gen_request *g, const int32_t *toks,
                                     int n_toks, int max_tokens, struct api_error *e)
{
    if (g->n > srv->cfg->max_batch_size) {
        api_error_set(e, ERR_INVALID_ARG, "n", NULL, "'n' = %d is larger than the server's max batch size %d", g->n,
                      srv->cfg->max_batch_size);
        return NULL;
    }
    struct sched_req *r = sched_req_create(toks, n_toks, g->n);
    if (!r || sched_req_set_stop(r, g->stop, g->n_stop)) {
        sched_req_unref(r);
        api_error_set(e, ERR_NOMEM, "", NULL, "out of memory");
        return NULL;
    }
    r->id = ++srv->next_id;
    r->max_tokens = max_tokens;
    r->sp = g->sp;
    if (!g->seed_set) {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
            seed = (uint64_t)sched_now_ns() ^ (r->id << 32);
        r->sp.seed = seed;
    }
    r->n_logprobs = g->logprobs;
    r->ignore_eos = g->ignore_eos;
    r->t_arrival = sched_now_ns();
    /* the request's own timeout may shorten the server's, never lengthen it */
    double timeout = srv->cfg->request_timeout;
    if (g->timeout > 0 && (timeout <= 0 || g->timeout < timeout))
        timeout = g->timeout;
    if (timeout > 0)
        r->deadline = r->t_arrival + (int64_t)(timeout * 1e9);
    return r;
}

/* ---------------------------------------------------------------- calls */

struct api_call *api_call_create(struct server *srv, struct http_conn *c, enum api_route route, enum api_kind kind,
                                 int n_reqs)
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
    call->n_reqs = n_reqs;
    call->n = 1;
    call->logprobs = -1;
    call->t_start = sched_now_ns();
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
        pthread_mutex_lock(&r->mu);
        prompt += r->n_prompt;
        for (int c = 0; c < r->n_choices; c++) {
            gen += r->choices[c].n_toks;
            if (!finish)
                finish = api_finish_name(r->choices[c].finish);
        }
        if (r->t_first_token && (ttft == 0 || (double)(r->t_first_token - r->t_arrival) / 1e6 < ttft))
            ttft = (double)(r->t_first_token - r->t_arrival) / 1e6;
        if (r->error)
            finish = err_name(r->error);
        pthread_mutex_unlock(&r->mu);
    }
    if (!call->conn && !call->answered)
        finish = "cancelled";
    if (!call->logged)
        api_log_line(call->id, call->route, call->status ? call->status : 499, prompt, gen, ttft,
                     ms_since(call->t_start), finish, call->conn ? http_conn_peer(call->conn) : NULL);
    if (!call->answered)
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

bool api_call_submit(struct api_call *call)
{
    struct server *srv = call->srv;
    if (!api_call_alloc_progress(call)) {
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
            if (rc == ERR_QUEUE_FULL)
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

void api_call_pump(struct api_call *call)
{
    if (!call->conn)
        return;
    if (call->began && http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
        return; /* on_writable resumes */
    memcpy(cur_cors, call->cors, sizeof cur_cors); /* deferred responses carry the request's CORS lines */
    switch (call->route) {
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT: api_openai_pump(call); break;
    default: api_simple_pump(call); break;
    }
}

/* ---------------------------------------------------------------- http callbacks */

static bool ct_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    /* constant time in the key length: no early exit on the first differing byte */
    size_t n = alen > blen ? alen : blen;
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)((i < alen ? (unsigned char)a[i] : 0) ^ (i < blen ? (unsigned char)b[i] : 0));
    return diff == 0;
}

static bool auth_ok(struct server *srv, const struct http_request *req)
{
    const struct server_config *cfg = srv->cfg;
    if (!cfg->n_api_keys)
        return true;
    const struct http_header *h = http_request_header(req, "authorization");
    if (!h)
        h = http_request_header(req, "x-api-key");
    if (!h)
        return false;
    const char *v = h->value;
    size_t vl = h->value_len;
    if (vl >= 7 && !strncasecmp(v, "Bearer ", 7)) {
        v += 7;
        vl -= 7;
    }
    while (vl && *v == ' ') {
        v++;
        vl--;
    }
    bool ok = false;
    for (int i = 0; i < cfg->n_api_keys; i++)
        ok |= ct_equal(v, vl, cfg->api_keys[i], strlen(cfg->api_keys[i]));
    return ok;
}

static void set_cors(struct server *srv, const struct http_request *req)
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

static bool method_is(const struct http_request *req, const char *m)
{
    return req->method_len == strlen(m) && !memcmp(req->method, m, req->method_len);
}

static bool path_is(const struct http_request *req, const char *p)
{
    return req->path_len == strlen(p) && !memcmp(req->path, p, req->path_len);
}

struct route_row {
    const char *path;
    const char *method;
    enum api_route route;
};

static const struct route_row routes[] = {
    {"/health", "GET", ROUTE_HEALTH},
    {"/ready", "GET", ROUTE_READY},
    {"/metrics", "GET", ROUTE_METRICS},
    {"/v1/models", "GET", ROUTE_MODELS},
    {"/v1/completions", "POST", ROUTE_COMPLETIONS},
    {"/completions", "POST", ROUTE_COMPLETIONS},
    {"/v1/chat/completions", "POST", ROUTE_CHAT},
    {"/chat/completions", "POST", ROUTE_CHAT},
    {"/v1/generate", "POST", ROUTE_GENERATE},
    {"/v1/batch_generate", "POST", ROUTE_BATCH},
    {"/v1/generate_stream", "GET", ROUTE_GENERATE_STREAM},
    {"/tokenize", "POST", ROUTE_TOKENIZE},
    {"/detokenize", "POST", ROUTE_DETOKENIZE},
};

static const struct route_row model_one_row = {"/v1/models/", "GET", ROUTE_MODEL_ONE};

static void on_request(void *ctx, struct http_conn *c, const struct http_request *req)
{
    struct server *srv = ctx;
    set_cors(srv, req);
    const struct route_row *row = NULL;
    bool path_known = false;
    const char *one = NULL;
    size_t one_len = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (path_is(req, routes[i].path)) {
            path_known = true;
            if (method_is(req, routes[i].method) ||
                (method_is(req, "HEAD") && !strcmp(routes[i].method, "GET") &&
                 routes[i].route != ROUTE_GENERATE_STREAM)) /* HEAD never starts a generation */
                row = &routes[i];
        }
    if (!path_known && req->path_len > 11 && !memcmp(req->path, "/v1/models/", 11)) {
        path_known = true;
        one = req->path + 11;
        one_len = req->path_len - 11;
        if (method_is(req, "GET") || method_is(req, "HEAD"))
            row = &model_one_row;
    }
    if (method_is(req, "OPTIONS") && path_known) {
        char h[768];
        snprintf(h, sizeof h,
                 "%sAccess-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                 "Access-Control-Allow-Headers: Authorization, Content-Type, X-Api-Key\r\n"
                 "Access-Control-Max-Age: 600\r\n",
                 cur_cors);
        http_respond(c, 204, NULL, h, "", 0);
        metrics_request(srv->metrics, "other", 204);
        return;
    }
    if (!path_known) {
        api_respond_error(srv, c, ROUTE_COUNT_, 404, ERR_NOT_FOUND, NULL, "not_found", NULL,
                          "Unknown route %.*s %.*s (see docs/api.md)", (int)req->method_len, req->method,
                          (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
        return;
    }
    if (!row) {
        const char *allow = "GET, HEAD";
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
            if (path_is(req, routes[i].path) && !strcmp(routes[i].method, "POST"))
                allow = "POST";
        char h[64];
        snprintf(h, sizeof h, "Allow: %s\r\n", allow);
        api_respond_error(srv, c, ROUTE_COUNT_, 405, ERR_METHOD, NULL, "method_not_allowed", h,
                          "Method %.*s is not allowed on %.*s; use %s", (int)req->method_len, req->method,
                          (int)req->path_len, req->path, allow);
        return;
    }
    enum api_route route = row->route;
    if (route != ROUTE_HEALTH && route != ROUTE_READY && route != ROUTE_METRICS && !auth_ok(srv, req)) {
        api_respond_error(srv, c, route, 401, ERR_AUTH, NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                          "%s", http_request_header(req, "authorization") || http_request_header(req, "x-api-key")
                                    ? "Incorrect API key provided"
                                    : "Missing API key: send 'Authorization: Bearer <key>'");
        return;
    }
    if (method_is(req, "POST")) {
        const struct http_header *ct = http_request_header(req, "content-type");
        /* JSON bodies only; curl -d labels JSON as a form, which is accepted when it is a JSON object */
        bool form_json = ct && ct->value_len >= 33 &&
                         !strncasecmp(ct->value, "application/x-www-form-urlencoded", 33) && req->body_len &&
                         req->body[0] == '{';
        if (ct && !form_json && !(ct->value_len >= 16 && !strncasecmp(ct->value, "application/json", 16)) &&
            !(ct->value_len >= 10 && !strncasecmp(ct->value, "text/plain", 10))) {
            api_respond_error(srv, c, route, 415, ERR_MEDIA_TYPE, NULL, NULL, NULL,
                              "Unsupported Content-Type '%.*s': send the body as JSON with Content-Type: "
                              "application/json",
                              (int)(ct->value_len > 100 ? 100 : ct->value_len), ct->value);
            return;
        }
    }
    int state = atomic_load(&srv->state);
    bool needs_model = route != ROUTE_HEALTH && route != ROUTE_READY && route != ROUTE_METRICS &&
                       route != ROUTE_MODELS && route != ROUTE_MODEL_ONE;
    if (needs_model && state != SERVER_READY) {
        api_respond_error(srv, c, route, 503, ERR_UNAVAILABLE, NULL, NULL, "Retry-After: 5\r\n",
                          state == SERVER_LOADING ? "the model is still loading; retry shortly"
                                                  : "the server is shutting down");
        return;
    }
    switch (route) {
    case ROUTE_HEALTH: api_health(srv, c); break;
    case ROUTE_READY: api_ready(srv, c); break;
    case ROUTE_METRICS: api_metrics(srv, c); break;
    case ROUTE_MODELS: api_models(srv, c, NULL, 0); break;
    case ROUTE_MODEL_ONE: api_models(srv, c, one, one_len); break;
    case ROUTE_COMPLETIONS: api_completions(srv, c, req, false); break;
    case ROUTE_CHAT: api_completions(srv, c, req, true); break;
    case ROUTE_GENERATE: api_generate(srv, c, req); break;
    case ROUTE_BATCH: api_batch_generate(srv, c, req); break;
    case ROUTE_GENERATE_STREAM: api_generate_stream(srv, c, req); break;
    case ROUTE_TOKENIZE: api_tokenize(srv, c, req); break;
    case ROUTE_DETOKENIZE: api_detokenize(srv, c, req); break;
    default: break;
    }
}

static void on_close(void *ctx, struct http_conn *c)
{
    (void)ctx;
    struct api_call *call = http_conn_data(c);
    if (!call)
        return;
    call->conn = NULL;
    http_conn_set_data(c, NULL);
    api_call_finish(call); /* cancels its requests: the engine drops them at its next step */
}

static void on_wake(void *ctx)
{
    struct server *srv = ctx;
    for (struct api_call *call = srv->calls, *next; call; call = next) {
        next = call->next; /* pumping may finish (free) the call */
        api_call_pump(call);
    }
}

static void on_writable(void *ctx, struct http_conn *c)
{
    (void)ctx;
    struct api_call *call = http_conn_data(c);
    if (call)
        api_call_pump(call);
}

/* ---------------------------------------------------------------- lifetime */

struct io_thread_arg {
    struct http_server *http;
    int rc;
};

static void *io_thread(void *arg)
{
    struct io_thread_arg *a = arg;
    a->rc = http_server_run(a->http);
    return NULL;
}

static void notify_io(void *ctx)
{
    struct server *srv = ctx;
    http_server_wake(srv->http);
}

/* Loads the model and starts the engine; messages name the config origin of a bad model path. */
static int server_load(struct server *srv)
{
    struct server_config *cfg = srv->cfg;
    char err[ERR_MSG_MAX];
    const char *origin = cfg->model_path_origin ? cfg->model_path_origin : "--model";
    int64_t t0 = sched_now_ns();
    srv->model = model_load_ex(cfg->model_path, cfg->use_mmap, err);
    if (!srv->model) {
        log_error("%s: cannot load model '%s': %s", origin, cfg->model_path, err);
        return 1;
    }
    const struct model_hparams *hp = &srv->model->hp;
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = cfg->threads;
    ep.n_ctx = cfg->ctx_size ? cfg->ctx_size : (hp->ctx_train < 4096 ? hp->ctx_train : 4096);
    ep.max_seqs = cfg->max_batch_size;
    ep.max_batch_tokens = cfg->prefill_chunk + cfg->max_batch_size;
    ep.kv_bytes = (size_t)cfg->kv_memory;
    srv->engine = engine_create(srv->model, &ep, err);
    if (!srv->engine) {
        log_error("cannot create the engine: %s", err);
        return 1;
    }
    srv->n_ctx = engine_params_get(srv->engine)->n_ctx;
    const struct kv_pool_params *kp = kv_pool_params(engine_kv(srv->engine));
    int64_t per_seq = (srv->n_ctx + kp->block_size - 1) / kp->block_size;
    if (kp->n_blocks < per_seq)
        log_warn("the KV cache (%lld blocks of %d positions) holds less than one full context (%d positions); "
                 "long requests will be refused: raise --kv-memory",
                 (long long)kp->n_blocks, kp->block_size, srv->n_ctx);
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = cfg->max_batch_size;
    sp.max_queue = cfg->max_queue;
    sp.prefill_chunk = cfg->prefill_chunk;
    srv->sched = scheduler_create(srv->engine, srv->model->tok, &sp, srv->metrics, notify_io, srv, err);
    if (!srv->sched || scheduler_start(srv->sched)) {
        log_error("cannot start the scheduler: %s", srv->sched ? "thread creation failed" : err);
        return 1;
    }
    /* chat template: --chat-template beats the GGUF's */
    srv->chat = CHAT_NONE;
    if (cfg->chat_template) {
        if (chat_family_from_name(cfg->chat_template, &srv->chat)) {
            log_error("--chat-template: unknown template '%s' (known: %s)", cfg->chat_template, chat_family_list());
            return 1;
        }
    } else {
        srv->chat = chat_family_detect(srv->model->chat_template);
    }
    if (srv->chat == CHAT_NONE) {
        snprintf(srv->chat_err, sizeof srv->chat_err,
                 "this model has %s; start the server with --chat-template NAME (one of: %s), or use "
                 "/v1/completions",
                 srv->model->chat_template ? "a chat template wafer does not recognize"
                                           : "no chat template (tokenizer.chat_template is absent)",
                 chat_family_list());
        log_warn("chat: %s", srv->chat_err);
    }
    const struct tokenizer *tok = srv->model->tok;
    const char *bos = tokenizer_bos(tok) >= 0 ? tokenizer_token_text(tok, tokenizer_bos(tok)) : NULL;
    const char *eos = tokenizer_eos(tok) >= 0 ? tokenizer_token_text(tok, tokenizer_eos(tok)) : NULL;
    srv->bos_text = strdup(bos ? bos : "<s>");
    srv->eos_text = strdup(eos ? eos : "</s>");
    srv->created = (int64_t)time(NULL);
    log_info("model %s (%s, %d layers, dim %d, %s) %s in %.0f ms: context %d, %d slots, %lld KV blocks of %d, "
             "prefill chunk %d, %d compute threads, chat template %s",
             cfg->model_name, hp->arch, hp->n_layers, hp->dim, dtype_name(srv->model->main_type),
             srv->model->mapped ? "mapped" : "read into memory", (double)(sched_now_ns() - t0) / 1e6, srv->n_ctx, cfg->max_batch_size, (long long)kp->n_blocks,
             kp->block_size, cfg->prefill_chunk, engine_params_get(srv->engine)->n_threads,
             srv->chat == CHAT_NONE ? "none" : chat_family_name(srv->chat));
    return 0;
}

int server_run(struct server_config *cfg)
{
    struct server srv_s;
    memset(&srv_s, 0, sizeof srv_s);
    struct server *srv = &srv_s;
    srv->cfg = cfg;
    log_requests = cfg->log_requests;
    gen_defaults_init(&srv->defaults);
    srv->defaults.max_new_tokens = cfg->max_new_tokens;
    srv->defaults.temperature = cfg->temperature;
    srv->defaults.top_p = cfg->top_p;
    srv->defaults.top_k = cfg->top_k;
    srv->defaults.min_p = cfg->min_p;
    srv->defaults.repeat_penalty = cfg->repeat_penalty;
    atomic_init(&srv->state, SERVER_LOADING);
    int rc = 1;

    struct stat st;
    if (stat(cfg->model_path, &st) != 0 || !S_ISREG(st.st_mode)) {
        log_error("%s: cannot open model file '%s': %s", cfg->model_path_origin ? cfg->model_path_origin : "--model",
                  cfg->model_path, errno ? strerror(errno) : "not a regular file");
        return 1;
    }
    /* Signals are taken synchronously by the main thread: block them before any thread starts. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!cfg->model_name) {
        const char *base = strrchr(cfg->model_path, '/');
        base = base ? base + 1 : cfg->model_path;
        size_t n = strlen(base);
        if (n > 5 && !strcmp(base + n - 5, ".gguf"))
            n -= 5;
        cfg->model_name = strndup(base, n);
    }
    srv->metrics = metrics_create();
    if (!srv->metrics || !cfg->model_name) {
        log_error("out of memory");
        return 1;
    }
    struct http_server_params hp;
    http_server_params_default(&hp);
    hp.host = cfg->host;
    hp.port = cfg->port;
    hp.max_connections = cfg->max_connections;
    hp.max_body_bytes = (size_t)cfg->max_body;
    hp.header_timeout_ms = (int)(cfg->header_timeout * 1000);
    hp.body_timeout_ms = (int)(cfg->body_timeout * 1000);
    hp.on_request = on_request;
    hp.on_close = on_close;
    hp.on_wake = on_wake;
    hp.on_writable = on_writable;
    hp.ctx = srv;
    char err[ERR_MSG_MAX];
    srv->http = http_server_create(&hp, err);
    if (!srv->http) {
        log_error("cannot listen on %s:%d: %s", cfg->host, cfg->port, err);
        metrics_destroy(srv->metrics);
        return 1;
    }
    struct io_thread_arg io = {.http = srv->http, .rc = 0};
    pthread_t io_tid;
    if (pthread_create(&io_tid, NULL, io_thread, &io)) {
        log_error("cannot start the I/O thread");
        http_server_destroy(srv->http);
        metrics_destroy(srv->metrics);
        return 1;
    }
    log_info("listening on http://%s:%d (loading %s)", cfg->host, http_server_port(srv->http), cfg->model_path);

    bool load_failed = server_load(srv) != 0;
    if (!load_failed) {
        atomic_store(&srv->state, SERVER_READY);
        log_info("ready: http://%s:%d/v1 serves '%s'", cfg->host, http_server_port(srv->http), cfg->model_name);
    }

    /* Wait for a signal; then drain: refuse new work, let the requests in flight finish. */
    int64_t drain_deadline = 0;
    bool stop_sent = false;
    for (;;) {
        if (load_failed && !stop_sent) {
            http_server_stop(srv->http, 0);
            stop_sent = true;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000000L};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            if (atomic_load(&srv->state) != SERVER_DRAINING && !load_failed) {
                atomic_store(&srv->state, SERVER_DRAINING);
                if (srv->sched)
                    scheduler_drain(srv->sched);
                drain_deadline = sched_now_ns() + (int64_t)(cfg->drain_timeout * 1e9);
                log_info("%s: draining %d request(s) for up to %.0f s (signal again to stop now)",
                         sig == SIGTERM ? "SIGTERM" : "SIGINT", atomic_load(&srv->n_inflight), cfg->drain_timeout);
            } else {
                drain_deadline = sched_now_ns(); /* second signal: stop now */
            }
        }
        if (stop_sent) {
            if (pthread_tryjoin_np(io_tid, NULL) == 0)
                break;
            continue;
        }
        if (atomic_load(&srv->state) == SERVER_DRAINING &&
            (atomic_load(&srv->n_inflight) == 0 || sched_now_ns() >= drain_deadline)) {
            if (atomic_load(&srv->n_inflight) > 0) {
                log_warn("drain timeout: cancelling %d request(s) still in flight", atomic_load(&srv->n_inflight));
                scheduler_cancel_all(srv->sched, ERR_UNAVAILABLE);
            }
            /* give cancelled streams a moment to be told, then close everything */
            http_server_stop(srv->http, atomic_load(&srv->n_inflight) > 0 ? 1000 : 0);
            stop_sent = true;
        }
    }
    rc = load_failed || io.rc ? 1 : 0;
    scheduler_destroy(srv->sched); /* before the calls go: requests still queued end with "unavailable" */
    srv->sched = NULL;
    while (srv->calls) {
        srv->calls->conn = NULL;
        api_call_finish(srv->calls);
    }
    http_server_destroy(srv->http);
    engine_destroy(srv->engine);
    model_destroy(srv->model);
    metrics_destroy(srv->metrics);
    free(srv->bos_text);
    free(srv->eos_text);
    log_info("stopped%s", rc ? " (with errors)" : "");
    return rc;
}
