/*
 * route_proxy: the life of one proxied request (/v1/completions, /v1/chat/completions).
 *
 *   admit (auth, route by model, limits, cache) -> pick a pool (split) -> pick a backend (least loaded)
 *     -> attempt --fails before the first byte to the client--> backoff --> next attempt (other backend,
 *        then the fallback pools) --budget spent--> the last error is the answer
 *     -> streaming: events are relayed one whole event at a time
 *          --backend dies after the first byte--> resume on another backend (token ids) or an error event
 *     -> done: [DONE] / the body; cache store; limits settled; one log line
 *
 * "The first byte" is the first byte sent to the client. A streaming answer is begun only when the first
 * whole event is ready to go, so a backend that fails after its response head but before its first event
 * is still retried invisibly. After that, retrying is no longer possible (the client has part of one
 * answer) and the stream is resumed instead: wafer backends are asked for the token ids of what they send
 * (return_token_ids), so the router knows the prompt's tokens and the tokens whose text the client already
 * has; the continuation is a /v1/completions request with prompt = those tokens, the remaining max_tokens
 * and the same seed and sampling, on another backend, and its text is relayed in the client's format under
 * the original id. For a greedy request the client's text equals an unbroken run. With n > 1 the router
 * keeps each choice's tokens and continues the unfinished choices one after another (each its own
 * continuation with its own remaining budget; a client tells choices apart by index, not by order).
 * Logprobs continue too: the continuation asks for them in the client's shape (wafer's
 * "logprobs_format": "chat" for a chat stream) and completions' text_offset is shifted by the text the
 * choice already had. When resuming is not possible (a backend that gives no token ids, a constrained
 * answer (grammar, response_format, tools) whose constraint cannot restart mid-answer, more than
 * RT_MAX_RESUME_CHOICES choices, no backend left) the stream ends with an OpenAI-shaped error event and
 * [DONE], never a silent cut.
 *
 * Backpressure: while the client's output queue is above RT_BACKPRESSURE bytes the upstream connection is
 * paused (not read), so a slow client slows its backend instead of filling the router's memory.
 */
#include "core/err.h"
#include "core/log.h"
#include "route/route_internal.h"
#include "route/route_policy.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define RT_BACKPRESSURE (256 * 1024)
#define RT_MAX_RESPONSE (64 << 20)   /* a buffered (non-streamed) upstream answer */
#define RT_MAX_EVENT (4 << 20)       /* one SSE event */
#define RT_MAX_ORDER 17
#define RT_MAX_RETRY_AFTER_MS 30000 /* the longest Retry-After a request waits out in the router */
#define RT_MAX_RESUME_CHOICES 16    /* n beyond this: a broken stream is not resumed */
#define RT_MAX_SPARE_REQS 64        /* finished requests' structs kept for reuse */

enum rt_mode { RM_NONE, RM_BUFFER, RM_SSE };
enum rt_cache_state { RC_NONE, RC_MISS, RC_HIT, RC_BYPASS };

/* One choice of a stream that may be resumed: what the client has of it. */
struct rt_choice {
    int32_t *ids; /* [n] token ids sent to the client */
    int n, cap;
    size_t text_bytes; /* bytes of text sent (completions' text_offset of the next token) */
    bool done;         /* its finish_reason was sent */
};

struct rt_req {
    struct router *r;
    struct http_conn *conn; /* NULL once answered or gone */
    struct rt_table *t;
    enum rt_endpoint ep;
    const char *path;
    int64_t t0_ns;
    const char *body; /* the client's, valid until its response ends */
    size_t body_len;
    json_t *json;
    char model[256];
    bool stream, include_usage, client_ids, cacheable;
    int n_choices;
    int64_t max_tokens; /* -1: not given */
    char fwd[1024];     /* header lines passed upstream */
    const struct rt_route *route;
    int order[RT_MAX_ORDER];
    int n_order, pos;

    /* attempts */
    struct rt_backend *tried[RT_MAX_TRIED];
    int tried_status[RT_MAX_TRIED]; /* HTTP status, or -kind-1 for a failure without one */
    int n_tried;
    int attempts, retries, fallbacks;
    struct rt_backend *be;
    struct up_conn *up;
    bool probe;         /* this attempt is the half-open probe of be */
    struct rt_backend *ra_backend; /* the backend that answered Retry-After, and until when (ms) */
    int64_t ra_until;
    int64_t att_t0_ns;
    struct ev_timer timer;

    /* the current attempt's response */
    struct up_response resp;
    enum rt_mode mode;
    bool retryable;
    char *buf;
    size_t len, cap;

    /* client side */
    bool began;  /* the stream to the client started (its first byte is out) */
    bool paused;
    int status;
    int64_t ttfb_ns;

    /* stream bookkeeping */
    bool inject_ids; /* return_token_ids was added for this request */
    bool ids_ok;     /* every content chunk so far carried its token ids */
    bool resuming;   /* the current attempt continues a broken stream */
    int resumes;
    char sid[160];
    int64_t created;
    char smodel[256];
    json_t *prompt_ids;
    struct rt_choice *ch; /* [n_choices] when a broken stream may be resumed, else NULL */
    int n_gen;            /* token ids received, all choices */
    int cur;              /* the choice the current resumed attempt continues */
    int chained;          /* continuations started for further choices after one finished (not breaks) */
    size_t text_base;     /* the current continuation's choice's text_bytes when it began */
    bool usage_sent;
    char *text;
    size_t text_len, text_cap;
    int n_pieces;    /* chunks with text relayed (a token each for wafer) */
    char finish[32];
    bool done_seen;
    int64_t usage_prompt, usage_completion;

    /* limits and cache */
    int key_idx;       /* in r->limits as of limits_gen; -1: no key */
    uint64_t limits_gen;
    char *key;         /* the key, to find it again after a reload renumbered the keys */
    int64_t reserved;
    char *cache_key;
    size_t cache_key_len;
    enum rt_cache_state cache;
    struct route_rcache_get *rget;     /* a Redis lookup in flight */
    const struct http_request *req;    /* the client's, valid until its response ends */
    int model_pool;                    /* models mode: the model (pool) holding it, -1 none */

    /* what to answer when every attempt failed */
    int last_status;
    char *last_body;
    size_t last_len;
    char last_ct[128];
    int64_t last_retry_after;
    char last_msg[256];
    enum rt_err_kind last_kind;

    struct rt_req *prev, *next;
};

static void attempt_next(struct rt_req *q);
static void stream_broken(struct rt_req *q, const char *why);

/* An error answer to a proxied request, counted in wafer_route_requests_total. */
static void proxy_error(struct router *r, struct http_conn *c, int status, const char *type, const char *code,
                        const char *param, const char *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
static void proxy_error(struct router *r, struct http_conn *c, int status, const char *type, const char *code,
                        const char *param, const char *extra_headers, const char *fmt, ...)
{
    rt_count_status(r, status);
    va_list ap;
    va_start(ap, fmt);
    rt_respond_errorv(r, c, status, type, code, param, extra_headers, fmt, ap);
    va_end(ap);
}


/* Estimated queue on b: ours now, plus what others had there at its last report. */
static int64_t backend_load(const struct rt_backend *b)
{
    int64_t others = 0;
    if (b->reported_load >= 0) {
        others = b->reported_load - b->inflight_at_report;
        if (others < 0)
            others = 0;
    }
    return b->inflight + others;
}

void rt_backend_success(struct router *r, struct rt_backend *b)
{
    (void)r;
    b->consecutive_failures = 0;
    if (b->half_open) {
        b->half_open = false;
        b->ejected_until = 0;
        log_info("route: backend %s answered its probe: back in rotation", b->label);
    }
    if (b->ejections && ++b->successes_after >= 10) {
        b->ejections = 0; /* healthy for a while: the next ejection starts from the base cooldown */
        b->successes_after = 0;
    }
}

void rt_backend_failure(struct router *r, struct rt_backend *b, enum rt_err_kind kind)
{
    const struct route_config *c = &r->table->conf->c;
    b->m_errors[kind]++;
    if (kind == RT_ERR_429)
        return; /* busy, not broken: ejecting an overloaded backend would only push its load elsewhere */
    b->successes_after = 0;
    b->consecutive_failures++;
    int64_t now = evloop_now_ms();
    bool eject = b->half_open || (c->eject_after > 0 && b->consecutive_failures >= c->eject_after &&
                                  !(b->ejected_until && now < b->ejected_until));
    if (!eject)
        return;
    b->ejections++;
    b->m_ejections++;
    int64_t cd = route_cooldown_ms(b->ejections, c->cooldown_s, c->cooldown_max_s);
    b->ejected_until = now + cd;
    b->half_open = true; /* once the cooldown is over, one request decides */
    b->probe_inflight = false;
    log_warn("route: backend %s ejected for %.1f s after %d consecutive failure(s) (ejection %d)", b->label,
             (double)cd / 1000.0, b->consecutive_failures, b->ejections);
}

enum pick_mode {
    PICK_ANY,
    PICK_UNTRIED,    /* skips backends this request already used */
    PICK_NOT_FAILED, /* skips backends that failed this request (a continuation's best bet after untried) */
};

/* The least-loaded available backend of pool p, as mode allows. Ties are broken at random so equal backends
 * share the traffic. A resume needs a wafer pool (token-id prompts, token ids back). */
static struct rt_backend *pick_in_pool(struct rt_req *q, int p, enum pick_mode mode, int64_t now)
{
    const struct rt_pool *pl = &q->t->pools[p];
    if (q->resuming && !pl->wafer)
        return NULL;
    struct rt_backend *best = NULL;
    int64_t best_load = 0;
    int ties = 0;
    for (int i = 0; i < pl->n; i++) {
        struct rt_backend *b = pl->b[i];
        if (!rt_backend_available(b, now))
            continue;
        bool tried = false, failed = false;
        for (int k = 0; k < q->n_tried; k++)
            if (q->tried[k] == b) {
                tried = true;
                failed |= q->tried_status[k] < 0 || q->tried_status[k] == 429 || q->tried_status[k] >= 500;
            }
        if ((mode == PICK_UNTRIED && tried) || (mode == PICK_NOT_FAILED && failed))
            continue;
        int64_t load = backend_load(b);
        if (!best || load < best_load) {
            best = b;
            best_load = load;
            ties = 1;
        } else if (load == best_load && rt_rand(q->r) % (uint64_t)++ties == 0) {
            best = b;
        }
    }
    return best;
}

/* The earliest time any backend of the remaining pools becomes available (0: none will by itself). */
static int64_t earliest_available(struct rt_req *q, int64_t now)
{
    int64_t best = 0;
    for (int k = q->pos; k < q->n_order; k++) {
        const struct rt_pool *pl = &q->t->pools[q->order[k]];
        for (int i = 0; i < pl->n; i++) {
            const struct rt_backend *b = pl->b[i];
            if (!b->up)
                continue;
            int64_t at = now;
            if (b->ejected_until > at)
                at = b->ejected_until;
            if (!best || at < best)
                best = at;
        }
    }
    return best;
}

/* ---- small helpers --------------------------------------------------------------------------------- */

static int buf_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *len + n + 1)
            nc *= 2;
        char *b = realloc(*buf, nc);
        if (!b)
            return ERR_NOMEM;
        *buf = b;
        *cap = nc;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static const char *kind_name(enum rt_err_kind k)
{
    static const char *const names[RT_ERR_COUNT_] = {"connect", "timeout", "status_5xx", "status_429", "broken",
                                                     "garbage"};
    return names[k];
}

/* Header lines every answer carries: cache state, the backend, the key's rate limits. */
static void common_headers(struct rt_req *q, char *out, size_t cap, const struct route_limit_info *li)
{
    size_t n = 0;
    out[0] = 0;
    if (q->cache != RC_NONE)
        n += (size_t)snprintf(out + n, cap - n, "x-wafer-cache: %s\r\n",
                              q->cache == RC_HIT ? "hit" : q->cache == RC_MISS ? "miss" : "bypass");
    if (q->be && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "x-wafer-backend: %s\r\n", q->be->label);
    if (li && n < cap)
        route_limits_headers(li, out, cap, &n);
}

/* The request's key in the current limits (a reload may have renumbered or removed it), or -1. */
static int key_index(struct rt_req *q)
{
    struct router *r = q->r;
    if (q->key_idx < 0 || !r->limits)
        return -1;
    if (q->limits_gen != r->limits_gen) {
        q->key_idx = route_limits_find(r->limits, q->key, strlen(q->key));
        q->limits_gen = r->limits_gen;
    }
    return q->key_idx;
}

/* The key's levels now (limit 0 everywhere when the request has no key). */
static void limit_info_now(struct rt_req *q, struct route_limit_info *li)
{
    memset(li, 0, sizeof *li);
    if (key_index(q) >= 0)
        route_limits_peek(q->r->limits, q->key_idx, evloop_now_ms(), li);
}

/* ---- finishing ------------------------------------------------------------------------------------- */

static void req_unlink(struct rt_req *q)
{
    struct router *r = q->r;
    if (q->prev)
        q->prev->next = q->next;
    else
        r->reqs = q->next;
    if (q->next)
        q->next->prev = q->prev;
    r->n_reqs--;
}

/* Ends the request: its log line, counters, limits; frees it. The client was answered (or is gone). */
static void req_finish(struct rt_req *q)
{
    struct router *r = q->r;
    evloop_timer_cancel(r->loop, &q->timer);
    route_rcache_get_cancel(q->rget);
    if (q->up) {
        up_cancel(q->up);
        q->up = NULL;
        if (q->be)
            q->be->inflight--;
    }
    if (q->probe && q->be)
        q->be->probe_inflight = false;
    if (q->model_pool >= 0) {
        int mp = q->model_pool;
        q->model_pool = -1;
        rt_models_release(r, q, mp);
    }
    double ms = (double)(clock_now_ns() - q->t0_ns) / 1e6;
    rt_hist_observe(&r->duration, ms / 1000.0);
    if (key_index(q) >= 0) {
        int64_t used = -1; /* unknown: the reservation stands */
        if (q->usage_prompt >= 0 && q->usage_completion >= 0)
            used = q->usage_prompt + q->usage_completion;
        else if (q->n_gen > 0 || q->n_pieces > 0) /* the prompt estimate plus what was generated */
            used = q->reserved - (q->max_tokens >= 0 ? q->max_tokens : 256) + (q->n_gen ? q->n_gen : q->n_pieces);
        route_limits_settle(r->limits, q->key_idx, q->reserved, used, evloop_now_ms());
    }
    char tried[768] = "";
    size_t tl = 0;
    for (int i = 0; i < q->n_tried && tl < sizeof tried - 64; i++) {
        int s = q->tried_status[i];
        if (s > 0)
            tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s(%d)", i ? "," : "", q->tried[i]->label, s);
        else
            tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s(%s)", i ? "," : "", q->tried[i]->label,
                                   s < 0 ? kind_name((enum rt_err_kind)(-s - 1)) : "?");
    }
    if (r->table->conf->c.log_requests || log_level_get() >= LOG_DEBUG)
        log_write(r->table->conf->c.log_requests ? LOG_INFO : LOG_DEBUG,
                  "route: POST %s model=%s status=%d%s backends=%s retries=%d fallbacks=%d resumes=%d cache=%s "
                  "%.1f ms",
                  q->path, q->model, q->status, q->stream ? " stream" : "", tl ? tried : "-", q->retries,
                  q->fallbacks, q->resumes,
                  q->cache == RC_HIT ? "hit" : q->cache == RC_MISS ? "miss" : q->cache == RC_BYPASS ? "bypass" : "-",
                  ms);
    if (q->conn)
        http_conn_set_data(q->conn, NULL);
    req_unlink(q);
    rt_table_unref(q->t);
    json_decref(q->json);
    json_decref(q->prompt_ids);
    free(q->buf);
    for (int i = 0; q->ch && i < q->n_choices; i++)
        free(q->ch[i].ids);
    free(q->ch);
    free(q->text);
    free(q->cache_key);
    free(q->last_body);
    free(q->key);
    if (r->n_spare_reqs < RT_MAX_SPARE_REQS) {
        q->next = r->spare_reqs;
        r->spare_reqs = q;
        r->n_spare_reqs++;
    } else {
        free(q);
    }
}

static void answer_count(struct rt_req *q, int status)
{
    q->status = status;
    rt_count_status(q->r, status);
    if (!q->ttfb_ns) {
        q->ttfb_ns = clock_now_ns() - q->t0_ns;
        rt_hist_observe(&q->r->ttfb, (double)q->ttfb_ns / 1e9);
    }
}

/* Every attempt failed: the last backend answer when there was one, else 502/504/503 of our own. */
static void answer_failure(struct rt_req *q)
{
    struct router *r = q->r;
    char hdr[1024];
    struct route_limit_info li;
    limit_info_now(q, &li);
    common_headers(q, hdr, sizeof hdr, &li);
    if (q->last_status) {
        size_t n = strlen(hdr);
        if (q->last_retry_after >= 0)
            snprintf(hdr + n, sizeof hdr - n, "Retry-After: %lld\r\n", (long long)((q->last_retry_after + 999) / 1000));
        answer_count(q, q->last_status);
        http_respond(q->conn, q->last_status, q->last_ct[0] ? q->last_ct : "application/json", hdr,
                     q->last_body ? q->last_body : "", q->last_len);
    } else if (q->n_tried == 0) {
        /* nothing could even be tried: every backend of the route's pools is down */
        r->m_no_backend++;
        int64_t now = evloop_now_ms(), at = earliest_available(q, now);
        int64_t ra = at > now ? (at - now + 999) / 1000 : (int64_t)ceil(r->table->conf->c.health_interval_s);
        if (ra < 1)
            ra = 1;
        char names[256] = "";
        for (int k = 0; k < q->n_order; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                     q->t->pools[q->order[k]].name);
        size_t n = strlen(hdr);
        snprintf(hdr + n, sizeof hdr - n, "Retry-After: %lld\r\n", (long long)ra);
        q->status = 503;
        proxy_error(r, q->conn, 503, "server_error", "no_backend_available", NULL, hdr,
                         "all backends for model '%s' are down or ejected (pool%s %s); retry in %lld s", q->model,
                         q->n_order > 1 ? "s" : "", names, (long long)ra);
        q->ttfb_ns = clock_now_ns() - q->t0_ns;
    } else {
        int st = q->last_kind == RT_ERR_TIMEOUT ? 504 : 502;
        q->status = st;
        proxy_error(r, q->conn, st, "server_error", q->last_kind == RT_ERR_TIMEOUT ? "upstream_timeout"
                                                                                       : "upstream_error",
                         NULL, hdr, "no backend could answer after %d attempt(s); last: %s", q->attempts, q->last_msg);
        q->ttfb_ns = clock_now_ns() - q->t0_ns;
    }
    q->conn = NULL;
    req_finish(q);
}

/* ---- cache ----------------------------------------------------------------------------------------- */

/* The cached form of an answer is the non-streamed response body. */
static char *build_full_body(struct rt_req *q, size_t *len)
{
    json_t *o = json_object();
    bool chat = q->ep == RT_EP_CHAT;
    json_object_set_new(o, "id", json_string(q->sid[0] ? q->sid : "cmpl-route"));
    json_object_set_new(o, "object", json_string(chat ? "chat.completion" : "text_completion"));
    json_object_set_new(o, "created", json_integer(q->created));
    json_object_set_new(o, "model", json_string(q->smodel[0] ? q->smodel : q->model));
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    json_t *txt = json_stringn_nocheck(q->text ? q->text : "", q->text_len);
    if (chat) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_object_set_new(m, "content", txt);
        json_object_set_new(ch, "message", m);
    } else {
        json_object_set_new(ch, "text", txt);
    }
    json_object_set_new(ch, "logprobs", json_null());
    json_object_set_new(ch, "finish_reason", json_string(q->finish[0] ? q->finish : "stop"));
    json_t *arr = json_array();
    json_array_append_new(arr, ch);
    json_object_set_new(o, "choices", arr);
    int64_t pt = q->usage_prompt >= 0 ? q->usage_prompt : q->prompt_ids ? (int64_t)json_array_size(q->prompt_ids) : 0;
    int64_t ct = q->usage_completion >= 0 ? q->usage_completion : q->n_gen;
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(pt));
    json_object_set_new(u, "completion_tokens", json_integer(ct));
    json_object_set_new(u, "total_tokens", json_integer(pt + ct));
    json_object_set_new(o, "usage", u);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s)
        *len = strlen(s);
    return s;
}

static void cache_store(struct rt_req *q, const char *body, size_t len)
{
    if (q->cache != RC_MISS || !q->cache_key)
        return;
    if (q->r->rcache)
        route_rcache_put(q->r->rcache, q->cache_key, q->cache_key_len, body, len);
    else if (q->r->cache)
        route_cache_put(q->r->cache, q->cache_key, q->cache_key_len, body, len, evloop_now_ms());
}

static void sse_write(struct rt_req *q, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        return;
    http_stream_write(q->conn, "data: ", 6);
    http_stream_write(q->conn, s, strlen(s));
    http_stream_write(q->conn, "\n\n", 2);
    free(s);
}

/* A chunk in the client's format for choice index with text (may be NULL), finish (may be NULL) and
 * logprobs (may be NULL; the reference is taken), under the answer's id. */
static json_t *make_chunk(struct rt_req *q, int index, const char *text, size_t len, bool role, const char *finish,
                          json_t *logprobs)
{
    bool chat = q->ep == RT_EP_CHAT;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(q->sid[0] ? q->sid : "cmpl-route"));
    json_object_set_new(o, "object", json_string(chat ? "chat.completion.chunk" : "text_completion"));
    json_object_set_new(o, "created", json_integer(q->created));
    json_object_set_new(o, "model", json_string(q->smodel[0] ? q->smodel : q->model));
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(index));
    if (chat) {
        json_t *d = json_object();
        if (role)
            json_object_set_new(d, "role", json_string("assistant"));
        if (text || role)
            json_object_set_new(d, "content", json_stringn_nocheck(text ? text : "", text ? len : 0));
        json_object_set_new(ch, "delta", d);
    } else {
        json_object_set_new(ch, "text", json_stringn_nocheck(text ? text : "", text ? len : 0));
    }
    json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, ch);
    json_object_set_new(o, "choices", arr);
    if (q->include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

static json_t *make_usage_chunk(struct rt_req *q, int64_t pt, int64_t ct)
{
    json_t *o = make_chunk(q, 0, NULL, 0, false, NULL, NULL);
    json_object_set_new(o, "choices", json_array());
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(pt));
    json_object_set_new(u, "completion_tokens", json_integer(ct));
    json_object_set_new(u, "total_tokens", json_integer(pt + ct));
    json_object_set_new(o, "usage", u);
    return o;
}

static void stream_begin(struct rt_req *q)
{
    char hdr[1024];
    struct route_limit_info li;
    limit_info_now(q, &li);
    common_headers(q, hdr, sizeof hdr, &li);
    answer_count(q, 200);
    http_stream_begin(q->conn, 200, "text/event-stream", hdr);
    q->began = true;
}

/* Answers from a cached body: as it is, or as a stream of chunks. */
static void answer_from_cache(struct rt_req *q, const char *val, size_t len)
{
    char hdr[1024];
    struct route_limit_info li;
    limit_info_now(q, &li);
    common_headers(q, hdr, sizeof hdr, &li);
    if (!q->stream) {
        answer_count(q, 200);
        http_respond(q->conn, 200, "application/json", hdr, val, len);
        q->conn = NULL;
        req_finish(q);
        return;
    }
    json_t *o = json_loadb(val, len, 0, NULL);
    json_t *ch = o ? json_array_get(json_object_get(o, "choices"), 0) : NULL;
    const char *id = o ? json_string_value(json_object_get(o, "id")) : NULL;
    const char *model = o ? json_string_value(json_object_get(o, "model")) : NULL;
    snprintf(q->sid, sizeof q->sid, "%s", id ? id : "cmpl-route");
    snprintf(q->smodel, sizeof q->smodel, "%s", model ? model : q->model);
    q->created = o ? json_integer_value(json_object_get(o, "created")) : 0;
    json_t *t = ch ? (q->ep == RT_EP_CHAT ? json_object_get(json_object_get(ch, "message"), "content")
                                          : json_object_get(ch, "text"))
                   : NULL;
    const char *fin = ch ? json_string_value(json_object_get(ch, "finish_reason")) : NULL;
    stream_begin(q);
    if (q->ep == RT_EP_CHAT)
        sse_write(q, make_chunk(q, 0, NULL, 0, true, NULL, NULL));
    if (json_is_string(t) && json_string_length(t))
        sse_write(q, make_chunk(q, 0, json_string_value(t), json_string_length(t), false, NULL, NULL));
    sse_write(q, make_chunk(q, 0, NULL, 0, false, fin ? fin : "stop", NULL));
    json_t *u = o ? json_object_get(o, "usage") : NULL;
    if (q->include_usage && json_is_object(u))
        sse_write(q, make_usage_chunk(q, json_integer_value(json_object_get(u, "prompt_tokens")),
                                      json_integer_value(json_object_get(u, "completion_tokens"))));
    json_decref(o);
    http_stream_write(q->conn, "data: [DONE]\n\n", 14);
    http_stream_end(q->conn);
    q->conn = NULL;
    req_finish(q);
}

/* ---- upstream requests ----------------------------------------------------------------------------- */

static void on_up_head(void *arg, const struct up_response *resp);
static void on_up_body(void *arg, const char *data, size_t len);
static void on_up_done(void *arg);
static void on_up_fail(void *arg, enum up_fail kind, bool head_seen, const char *msg);

static const struct up_callbacks up_cb = {on_up_head, on_up_body, on_up_done, on_up_fail};

/* The body of a resumed request for choice q->cur: the original parameters, prompt = prompt tokens + the
 * choice's tokens, its remaining budget; logprobs asked in the client's shape. */
static char *resume_body(struct rt_req *q, size_t *len)
{
    const struct rt_choice *c = &q->ch[q->cur];
    json_t *o = json_deep_copy(q->json);
    if (!o)
        return NULL;
    int lp_top = -1; /* logprobs: -1 none, else the top alternatives asked */
    json_t *lp = json_object_get(o, "logprobs");
    if (q->ep == RT_EP_CHAT && json_is_true(lp)) {
        json_t *top = json_object_get(o, "top_logprobs");
        lp_top = json_is_integer(top) ? (int)json_integer_value(top) : 0;
    } else if (q->ep != RT_EP_CHAT && json_is_integer(lp)) {
        lp_top = (int)json_integer_value(lp);
    }
    static const char *const drop[] = {"messages", "prompt", "n", "echo", "logprobs", "top_logprobs", "best_of",
                                       "suffix", "max_completion_tokens", "stream_options", "return_token_ids",
                                       "response_format", "tools", "tool_choice", "functions", "function_call",
                                       "parallel_tool_calls"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        json_object_del(o, drop[i]);
    json_t *p = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(q->prompt_ids, i, v)
        json_array_append(p, v);
    for (int k = 0; k < c->n; k++)
        json_array_append_new(p, json_integer(c->ids[k]));
    json_object_set_new(o, "prompt", p);
    if (q->max_tokens >= 0)
        json_object_set_new(o, "max_tokens", json_integer(q->max_tokens - c->n));
    if (lp_top >= 0) {
        json_object_set_new(o, "logprobs", json_integer(lp_top));
        if (q->ep == RT_EP_CHAT)
            json_object_set_new(o, "logprobs_format", json_string("chat"));
    }
    json_object_set_new(o, "stream", json_true());
    json_object_set_new(o, "return_token_ids", json_true());
    if (q->include_usage) {
        json_t *so = json_object();
        json_object_set_new(so, "include_usage", json_true());
        json_object_set_new(o, "stream_options", so);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s)
        *len = strlen(s);
    return s;
}

/* The body for a first attempt: the client's, with "return_token_ids": true added for wafer pools when a
 * stream may need resuming (inserted after the opening brace: the rest stays byte for byte). */
static char *attempt_body(struct rt_req *q, bool wafer, size_t *len, bool *injected)
{
    *injected = false;
    if (q->ch && wafer && q->t->conf->c.resume && !q->client_ids) {
        const char *p = q->body, *end = q->body + q->body_len;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
            p++;
        if (p < end && *p == '{') {
            static const char ins[] = "\"return_token_ids\":true,";
            size_t pre = (size_t)(p + 1 - q->body);
            char *s = malloc(q->body_len + sizeof ins);
            if (!s)
                return NULL;
            memcpy(s, q->body, pre);
            memcpy(s + pre, ins, sizeof ins - 1);
            memcpy(s + pre + sizeof ins - 1, q->body + pre, q->body_len - pre);
            *len = q->body_len + sizeof ins - 1;
            s[*len] = 0;
            *injected = true;
            return s;
        }
    }
    char *s = malloc(q->body_len + 1);
    if (s) {
        memcpy(s, q->body, q->body_len);
        s[q->body_len] = 0;
        *len = q->body_len;
    }
    return s;
}

static void record_try(struct rt_req *q, struct rt_backend *b)
{
    if (q->n_tried < RT_MAX_TRIED) {
        q->tried[q->n_tried] = b;
        q->tried_status[q->n_tried] = 0;
        q->n_tried++;
    } else {
        q->tried[RT_MAX_TRIED - 1] = b;
        q->tried_status[RT_MAX_TRIED - 1] = 0;
    }
}

static void set_try_status(struct rt_req *q, int s)
{
    if (q->n_tried)
        q->tried_status[q->n_tried - 1] = s;
}

/* Sends the current attempt to b. */
static void attempt_send(struct rt_req *q, struct rt_backend *b)
{
    struct router *r = q->r;
    const struct route_config *c = &q->t->conf->c;
    size_t blen = 0;
    bool injected = false;
    char *body = q->resuming ? resume_body(q, &blen) : attempt_body(q, b->wafer, &blen, &injected);
    const char *path = q->resuming ? "/v1/completions" : q->path;
    char head[2048];
    int hl = body ? snprintf(head, sizeof head,
                             "POST %s%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                             "Content-Length: %zu\r\nAccept: %s\r\n%s\r\n",
                             b->prefix, path, b->host_header, blen, q->stream ? "text/event-stream" : "application/json",
                             q->fwd)
                  : -1;
    char *req = hl > 0 && (size_t)hl < sizeof head ? malloc((size_t)hl + blen) : NULL;
    q->attempts++;
    q->be = b;
    q->probe = false;
    q->mode = RM_NONE;
    q->retryable = false;
    q->len = 0;
    q->att_t0_ns = clock_now_ns();
    record_try(q, b);
    b->m_requests++;
    if (!q->resuming)
        q->inject_ids = injected;
    if (!req) {
        free(body);
        log_error("route: out of memory building an upstream request");
        q->last_kind = RT_ERR_CONNECT;
        snprintf(q->last_msg, sizeof q->last_msg, "out of memory");
        set_try_status(q, -(int)RT_ERR_CONNECT - 1);
        if (q->began)
            stream_broken(q, "out of memory");
        else
            attempt_next(q);
        return;
    }
    memcpy(req, head, (size_t)hl);
    memcpy(req + hl, body, blen);
    free(body);
    struct up_timeouts to = {c->connect_timeout_ms, c->header_timeout_ms, c->idle_timeout_ms};
    char err[ERR_MSG_MAX];
    if (b->half_open && !b->probe_inflight) {
        b->probe_inflight = true;
        q->probe = true;
    }
    b->inflight++;
    q->up = up_request(r->loop, &b->target, req, (size_t)hl + blen, &to, &up_cb, q, err);
    free(req);
    if (!q->up) /* no socket at all: a connect failure like any other */
        on_up_fail(q, UP_FAIL_CONNECT, false, err);
}

/* Picks the next backend for the request (or schedules the wait for one), or answers the failure. */
static void attempt_next(struct rt_req *q)
{
    struct router *r = q->r;
    const struct route_config *c = &q->t->conf->c;
    if (!q->conn) {
        req_finish(q);
        return;
    }
    int64_t now = evloop_now_ms();
    int budget = 1 + c->retry_max;
    if (q->attempts >= budget + q->resumes + q->chained) {
        if (q->began)
            stream_broken(q, NULL);
        else
            answer_failure(q);
        return;
    }
    struct rt_backend *b = NULL;
    int pos = q->pos;
    for (int k = q->pos; k < q->n_order && !b; k++)
        if ((b = pick_in_pool(q, q->order[k], PICK_UNTRIED, now)))
            pos = k;
    for (int k = q->pos; k < q->n_order && !b; k++)
        if ((b = pick_in_pool(q, q->order[k], PICK_ANY, now)))
            pos = k;
    if (!b) {
        /* Nothing available now. Wait when something becomes available soon (a cooldown ends) and the
         * request has already been tried; a request that finds everything down is answered 503 at once. */
        int64_t at = earliest_available(q, now);
        if (q->n_tried > 0 && at > now && at - now <= c->retry_cap_ms * 4 + 1000) {
            evloop_timer_set(r->loop, &q->timer, at);
            return;
        }
        if (q->began)
            stream_broken(q, "no backend left to continue on");
        else
            answer_failure(q);
        return;
    }
    if (b == q->ra_backend && now < q->ra_until) {
        /* Only the backend that asked this request to come back later is left: honour its Retry-After,
         * up to RT_MAX_RETRY_AFTER_MS; past that its answer goes to the client with the header. */
        if (q->ra_until - now > RT_MAX_RETRY_AFTER_MS) {
            answer_failure(q);
            return;
        }
        evloop_timer_set(r->loop, &q->timer, q->ra_until);
        q->ra_backend = NULL;
        return;
    }
    if (pos != q->pos) { /* the pools before it have nothing left: fall back */
        q->fallbacks++;
        r->m_fallbacks++;
    }
    q->pos = pos;
    if (q->attempts > 0 && !q->resuming) {
        q->retries++;
        r->m_retries++;
    }
    attempt_send(q, b);
}

static void on_timer(struct ev_timer *t)
{
    struct rt_req *q = (struct rt_req *)((char *)t - offsetof(struct rt_req, timer));
    attempt_next(q);
}

/* An attempt failed before the client saw a byte: count it, wait the backoff, try again. */
static void attempt_failed(struct rt_req *q, enum rt_err_kind kind, const char *msg, int64_t retry_after_ms)
{
    struct router *r = q->r;
    struct rt_backend *b = q->be;
    const struct route_config *c = &q->t->conf->c;
    q->last_kind = kind;
    snprintf(q->last_msg, sizeof q->last_msg, "%.250s", msg);
    if (b) {
        rt_backend_failure(r, b, kind);
        if (q->probe)
            b->probe_inflight = false;
        if (retry_after_ms > 0) { /* for this request only: other requests are not held back */
            q->ra_backend = b;
            q->ra_until = evloop_now_ms() + retry_after_ms;
        }
    }
    q->probe = false;
    if (!q->conn) {
        req_finish(q);
        return;
    }
    int64_t delay = route_backoff_ms(q->retries, c->retry_base_ms, c->retry_cap_ms, &r->rng);
    evloop_timer_set(r->loop, &q->timer, evloop_now_ms() + delay);
}

/* ---- streaming ------------------------------------------------------------------------------------- */

static bool can_resume(struct rt_req *q)
{
    const struct route_config *c = &q->t->conf->c;
    return c->resume && q->ch && q->inject_ids && q->ids_ok && q->prompt_ids &&
           q->resumes < (c->retry_max > 0 ? c->retry_max : 1) && q->conn;
}

/* The first choice not finished, or -1 (also when choices are not tracked). */
static int open_choice(const struct rt_req *q)
{
    for (int i = 0; q->ch && i < q->n_choices; i++)
        if (!q->ch[i].done)
            return i;
    return -1;
}

/* Whether the current upstream stream delivered a whole answer: [DONE], or the finish_reason of the choice
 * it continues, or of every choice. */
static bool stream_whole(const struct rt_req *q)
{
    if (q->done_seen)
        return true;
    if (q->resuming)
        return q->ch[q->cur].done;
    if (q->ch)
        return open_choice(q) < 0;
    return q->finish[0] != 0;
}

/* Ends a stream whose choices are all finished: the usage chunk the client asked for when the backend's
 * did not reach it (counted by the router from the token ids), then [DONE]. */
static void stream_end(struct rt_req *q)
{
    if (q->ch && q->ids_ok && q->prompt_ids && (q->resumes || q->usage_prompt < 0)) {
        q->usage_prompt = (int64_t)json_array_size(q->prompt_ids);
        q->usage_completion = q->n_gen;
        if (q->include_usage && !q->usage_sent)
            sse_write(q, make_usage_chunk(q, q->usage_prompt, q->usage_completion));
    }
    http_stream_write(q->conn, "data: [DONE]\n\n", 14);
    http_stream_end(q->conn);
    q->conn = NULL;
}

/* Sends the continuation of choice q->cur to a backend, untried ones first; false when none is left. */
static bool resume_send(struct rt_req *q)
{
    q->resuming = true;
    q->text_base = q->ch[q->cur].text_bytes;
    q->done_seen = false;
    q->finish[0] = 0;
    q->len = 0;
    int64_t now = evloop_now_ms();
    struct rt_backend *b = NULL;
    static const enum pick_mode modes[] = {PICK_UNTRIED, PICK_NOT_FAILED, PICK_ANY};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0] && !b; m++)
        for (int k = q->pos; k < q->n_order && !b; k++)
            b = pick_in_pool(q, q->order[k], modes[m], now);
    if (!b)
        return false;
    attempt_send(q, b);
    return true;
}

/* The stream to the client broke after its first byte: resume, or end it with an error event. */
static void stream_broken(struct rt_req *q, const char *why)
{
    struct router *r = q->r;
    if (!q->conn) {
        req_finish(q);
        return;
    }
    if (why)
        snprintf(q->last_msg, sizeof q->last_msg, "%.250s", why);
    if (q->ch && q->inject_ids && q->ids_ok) {
        /* a choice whose budget was spent exactly as it broke is complete */
        for (int i = 0; q->max_tokens >= 0 && i < q->n_choices; i++)
            if (!q->ch[i].done && q->ch[i].n >= q->max_tokens) {
                sse_write(q, make_chunk(q, i, NULL, 0, false, "length", NULL));
                q->ch[i].done = true;
            }
        if (open_choice(q) < 0) {
            stream_end(q);
            req_finish(q);
            return;
        }
    }
    if (can_resume(q)) {
        q->resumes++;
        q->cur = open_choice(q);
        log_info("route: stream of model '%s' broke after %d token(s) (%s): resuming on another backend "
                 "(choice %d of %d)", q->model, q->n_gen, q->last_msg, q->cur, q->n_choices);
        if (q->t->conf->c.log_requests)
            log_debug("route: resume prompt: %d prompt + %d generated token ids", (int)json_array_size(q->prompt_ids),
                      q->ch[q->cur].n);
        if (resume_send(q))
            return;
        snprintf(q->last_msg, sizeof q->last_msg, "no backend left to resume on");
    }
    if (q->resumes)
        r->m_resumes_failed++;
    r->m_stream_errors++;
    json_t *e = json_object();
    char msg[512];
    snprintf(msg, sizeof msg, "the backend stream broke after %d token(s) and could not be resumed: %s",
             q->n_gen > q->n_pieces ? q->n_gen : q->n_pieces, q->last_msg[0] ? q->last_msg : "unknown error");
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "type", json_string("server_error"));
    json_object_set_new(e, "param", json_null());
    json_object_set_new(e, "code", json_string("stream_interrupted"));
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    sse_write(q, o);
    http_stream_write(q->conn, "data: [DONE]\n\n", 14);
    http_stream_end(q->conn);
    q->status = 200;
    q->conn = NULL;
    req_finish(q);
}

/* The upstream stream ended whole: the next unfinished choice continues, or the answer ends. */
static void stream_finished(struct rt_req *q)
{
    if (q->resuming) {
        q->ch[q->cur].done = true;
        int next = open_choice(q);
        if (next >= 0) {
            q->cur = next;
            q->chained++;
            if (!resume_send(q))
                stream_broken(q, "no backend left to continue on");
            return;
        }
    }
    if (q->resumes)
        q->r->m_resumes_ok++;
    stream_end(q);
    if (q->cache == RC_MISS && q->cacheable && strcmp(q->finish, "error")) {
        size_t blen = 0;
        char *body = build_full_body(q, &blen);
        if (body)
            cache_store(q, body, blen);
        free(body);
    }
    req_finish(q);
}

/* Ends the current upstream exchange early (its connection is closed, never pooled). */
static void attempt_abort(struct rt_req *q)
{
    if (!q->up)
        return;
    up_cancel(q->up);
    q->up = NULL;
    q->be->inflight--;
}

static void append_ids(struct rt_req *q, struct rt_choice *c, json_t *ids)
{
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
        if (!json_is_integer(v))
            continue;
        if (c->n == c->cap) {
            int nc = c->cap ? c->cap * 2 : 256;
            int32_t *n = realloc(c->ids, (size_t)nc * sizeof *n);
            if (!n) {
                q->ids_ok = false;
                return;
            }
            c->ids = n;
            c->cap = nc;
        }
        c->ids[c->n++] = (int32_t)json_integer_value(v);
        q->n_gen++;
    }
}

/* Handles one whole SSE event from the backend. Returns false when the attempt was ended (garbage). */
static bool handle_event(struct rt_req *q, char *ev, size_t len)
{
    /* collect the data lines */
    char *data = NULL;
    size_t dlen = 0, dcap = 0;
    bool any_data = false;
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && ev[e] != '\n')
            e++;
        size_t le = e > i && ev[e - 1] == '\r' ? e - 1 : e;
        if (le - i >= 5 && !memcmp(ev + i, "data:", 5)) {
            size_t s = i + 5;
            if (s < le && ev[s] == ' ')
                s++;
            if (any_data)
                buf_append(&data, &dlen, &dcap, "\n", 1);
            buf_append(&data, &dlen, &dcap, ev + s, le - s);
            any_data = true;
        }
        i = e + 1;
    }
    if (!any_data) {
        free(data);
        if (!q->resuming && q->began) { /* comments and keep-alives pass through */
            http_stream_write(q->conn, ev, len);
            http_stream_write(q->conn, "\n\n", 2);
        }
        return true;
    }
    if (!data) {
        data = strdup("");
        dlen = 0;
    }
    if (dlen == 6 && !memcmp(data, "[DONE]", 6)) {
        q->done_seen = true;
        free(data);
        return true;
    }
    json_error_t je;
    json_t *o = json_loadb(data, dlen, 0, &je);
    free(data);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        struct rt_backend *b = q->be;
        attempt_abort(q);
        set_try_status(q, -(int)RT_ERR_GARBAGE - 1);
        char msg[640];
        snprintf(msg, sizeof msg, "%s sent an event that is not JSON", b->label);
        if (q->began) {
            rt_backend_failure(q->r, b, RT_ERR_GARBAGE);
            if (q->probe)
                b->probe_inflight = false;
            stream_broken(q, msg);
        } else {
            attempt_failed(q, RT_ERR_GARBAGE, msg, -1);
        }
        return false;
    }
    json_t *err = json_object_get(o, "error");
    if (json_is_object(err)) {
        const char *code = json_string_value(json_object_get(err, "code"));
        bool transient = code && (!strcmp(code, "unavailable") || !strcmp(code, "cancelled"));
        if (transient || !q->began) {
            /* the backend gave up (draining, ...): like a broken connection */
            const char *m = json_string_value(json_object_get(err, "message"));
            char msg[640];
            snprintf(msg, sizeof msg, "%s sent an error event: %s", q->be->label, m ? m : code ? code : "?");
            json_decref(o);
            struct rt_backend *b = q->be;
            attempt_abort(q);
            set_try_status(q, -(int)RT_ERR_BROKEN - 1);
            if (q->began) {
                rt_backend_failure(q->r, b, RT_ERR_BROKEN);
                if (q->probe)
                    b->probe_inflight = false;
                stream_broken(q, msg);
            } else {
                attempt_failed(q, RT_ERR_BROKEN, msg, -1);
            }
            return false;
        }
        /* a deliberate error (context length, ...): the client's to see; the stream ends after it */
        sse_write(q, o);
        q->done_seen = true;
        q->finish[0] = 0;
        snprintf(q->finish, sizeof q->finish, "error");
        return true;
    }
    if (!q->began)
        stream_begin(q);
    if (!q->resuming && !q->sid[0]) {
        const char *id = json_string_value(json_object_get(o, "id"));
        const char *model = json_string_value(json_object_get(o, "model"));
        snprintf(q->sid, sizeof q->sid, "%s", id ? id : "");
        snprintf(q->smodel, sizeof q->smodel, "%s", model ? model : "");
        q->created = json_integer_value(json_object_get(o, "created"));
    }
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u) && !q->resuming) { /* a continuation's usage is the router's to count (stream_end) */
        q->usage_prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
        q->usage_completion = json_integer_value(json_object_get(u, "completion_tokens"));
        q->usage_sent = true; /* relayed below */
    }
    json_t *choices = json_object_get(o, "choices");
    for (size_t k = 0; k < json_array_size(choices); k++) {
        json_t *ch = json_array_get(choices, k);
        if (!json_is_object(ch))
            continue;
        json_t *ji = json_object_get(ch, "index");
        int idx = q->resuming ? q->cur : json_is_integer(ji) ? (int)json_integer_value(ji) : (int)k;
        struct rt_choice *c = q->ch && idx >= 0 && idx < q->n_choices ? &q->ch[idx] : NULL;
        json_t *t = q->ep == RT_EP_CHAT && !q->resuming ? json_object_get(json_object_get(ch, "delta"), "content")
                                                       : json_object_get(ch, "text");
        const char *piece = NULL;
        size_t plen = 0;
        if (json_is_string(t)) {
            piece = json_string_value(t);
            plen = json_string_length(t);
        }
        const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
        json_t *pids = json_object_get(ch, "prompt_token_ids");
        if (!json_is_array(pids))
            pids = json_object_get(o, "prompt_token_ids");
        if (!q->resuming && json_is_array(pids) && !q->prompt_ids)
            q->prompt_ids = json_incref(pids);
        json_t *ids = json_object_get(ch, "token_ids");
        if (json_is_array(ids)) {
            if (c)
                append_ids(q, c, ids);
        } else if (plen) {
            q->ids_ok = false;
        }
        if (q->n_choices == 1 && plen && buf_append(&q->text, &q->text_len, &q->text_cap, piece, plen) < 0)
            q->cacheable = false;
        q->n_pieces += plen > 0;
        json_t *lp = json_object_get(ch, "logprobs");
        if (q->resuming && c && (plen || fin || json_is_object(lp))) {
            /* relayed in the client's format; completions' offsets continue from the text it already has. A
             * token whose bytes are held back (an incomplete UTF-8 sequence) comes with logprobs and no text:
             * relayed too, with empty text, as an unbroken stream sends it */
            json_t *lpc = json_is_object(lp) ? json_deep_copy(lp) : NULL;
            size_t j;
            json_t *v;
            json_array_foreach(json_object_get(lpc, "text_offset"), j, v)
                json_integer_set(v, json_integer_value(v) + (json_int_t)q->text_base);
            sse_write(q, make_chunk(q, idx, plen || lpc ? piece : NULL, plen, false, fin, lpc));
        }
        if (c)
            c->text_bytes += plen;
        if (fin) {
            snprintf(q->finish, sizeof q->finish, "%s", fin);
            if (c)
                c->done = true;
        }
    }
    if (q->resuming) {
        json_decref(o);
    } else if (q->inject_ids) {
        /* strip what the router asked for and the client did not */
        for (size_t i = 0; i < json_array_size(choices); i++) {
            json_object_del(json_array_get(choices, i), "token_ids");
            json_object_del(json_array_get(choices, i), "prompt_token_ids");
        }
        json_object_del(o, "prompt_token_ids");
        sse_write(q, o);
    } else {
        json_decref(o);
        http_stream_write(q->conn, ev, len); /* byte for byte */
        http_stream_write(q->conn, "\n\n", 2);
    }
    return true;
}

/* Splits q->buf into whole events ("\n\n" or "\r\n\r\n" separated) and handles them. */
static bool drain_events(struct rt_req *q)
{
    size_t start = 0;
    for (size_t i = 0; i + 1 < q->len;) {
        size_t sep = 0;
        if (q->buf[i] == '\n' && q->buf[i + 1] == '\n')
            sep = 2;
        else if (i + 3 < q->len && !memcmp(q->buf + i, "\r\n\r\n", 4))
            sep = 4;
        if (!sep) {
            i++;
            continue;
        }
        if (!handle_event(q, q->buf + start, i - start))
            return false;
        if (!q->conn)
            return false;
        i += sep;
        start = i;
    }
    memmove(q->buf, q->buf + start, q->len - start);
    q->len -= start;
    if (q->len > RT_MAX_EVENT) {
        struct rt_backend *b = q->be;
        attempt_abort(q);
        set_try_status(q, -(int)RT_ERR_GARBAGE - 1);
        if (q->began) {
            rt_backend_failure(q->r, b, RT_ERR_GARBAGE);
            stream_broken(q, "an event larger than 4 MiB");
        } else {
            attempt_failed(q, RT_ERR_GARBAGE, "an event larger than 4 MiB", -1);
        }
        return false;
    }
    return true;
}

/* ---- upstream callbacks ---------------------------------------------------------------------------- */

static void on_up_head(void *arg, const struct up_response *resp)
{
    struct rt_req *q = arg;
    struct rt_backend *b = q->be;
    q->resp = *resp;
    rt_hist_observe(&b->ttfb, (double)(clock_now_ns() - q->att_t0_ns) / 1e9);
    int cls = resp->status / 100;
    if (cls >= 1 && cls <= 5)
        b->m_responses[cls]++;
    set_try_status(q, resp->status);
    q->retryable = resp->status == 429 || resp->status >= 500;
    if (!q->retryable && cls == 2 && q->stream && !strncasecmp(resp->content_type, "text/event-stream", 17)) {
        q->mode = RM_SSE;
        if (!q->resuming)
            q->ids_ok = true;
    } else {
        q->mode = RM_BUFFER;
        if (q->began && !q->retryable) {
            /* a resumed attempt that did not stream: treat as broken (handled at done) */
            q->retryable = true;
        }
    }
}

static void on_up_body(void *arg, const char *data, size_t len)
{
    struct rt_req *q = arg;
    if (q->mode == RM_SSE) {
        if (buf_append(&q->buf, &q->len, &q->cap, data, len) < 0)
            return;
        if (!drain_events(q))
            return;
        if (q->conn && q->up && http_conn_pending(q->conn) >= RT_BACKPRESSURE && !q->paused) {
            q->paused = true;
            up_pause(q->up, true);
        }
        return;
    }
    if (q->len + len > RT_MAX_RESPONSE) {
        attempt_abort(q);
        set_try_status(q, -(int)RT_ERR_GARBAGE - 1);
        attempt_failed(q, RT_ERR_GARBAGE, "response larger than 64 MiB", -1);
        return;
    }
    buf_append(&q->buf, &q->len, &q->cap, data, len);
}

static void on_up_done(void *arg)
{
    struct rt_req *q = arg;
    struct router *r = q->r;
    struct rt_backend *b = q->be;
    q->up = NULL;
    b->inflight--;
    if (q->probe)
        b->probe_inflight = false;
    if (q->mode == RM_SSE) {
        if (q->len && q->conn) {
            /* a last event without its blank line */
            if (!buf_append(&q->buf, &q->len, &q->cap, "\n\n", 2) && !drain_events(q))
                return;
        }
        if (!q->conn) {
            req_finish(q);
            return;
        }
        if (!stream_whole(q)) {
            set_try_status(q, -(int)RT_ERR_BROKEN - 1);
            rt_backend_failure(r, b, RT_ERR_BROKEN);
            char msg[640];
            snprintf(msg, sizeof msg, "%s ended the stream without finishing it", b->label);
            if (q->began)
                stream_broken(q, msg);
            else
                attempt_failed(q, RT_ERR_BROKEN, msg, -1);
            return;
        }
        rt_backend_success(r, b);
        if (!q->began)
            stream_begin(q);
        stream_finished(q);
        return;
    }
    if (!q->conn) {
        req_finish(q);
        return;
    }
    if (q->retryable) {
        enum rt_err_kind kind = q->resp.status == 429 ? RT_ERR_429 : RT_ERR_5XX;
        free(q->last_body);
        q->last_body = q->buf;
        q->last_len = q->len;
        q->buf = NULL;
        q->len = q->cap = 0;
        q->last_status = q->resp.status;
        q->last_retry_after = q->resp.retry_after_ms;
        snprintf(q->last_ct, sizeof q->last_ct, "%s", q->resp.content_type);
        char msg[640];
        snprintf(msg, sizeof msg, "%s answered %d", b->label, q->resp.status);
        if (q->began) {
            rt_backend_failure(r, b, kind);
            stream_broken(q, msg);
        } else {
            attempt_failed(q, kind, msg, q->resp.retry_after_ms);
        }
        return;
    }
    rt_backend_success(r, b);
    /* the answer (2xx, or a 4xx that is the client's to see) */
    int st = q->resp.status;
    if (st == 200) {
        json_t *o = json_loadb(q->buf ? q->buf : "", q->len, 0, NULL);
        json_t *u = o ? json_object_get(o, "usage") : NULL;
        if (json_is_object(u)) {
            q->usage_prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
            q->usage_completion = json_integer_value(json_object_get(u, "completion_tokens"));
        }
        json_decref(o);
        if (q->cache == RC_MISS && q->cacheable && o)
            cache_store(q, q->buf, q->len);
    }
    char hdr[1024];
    struct route_limit_info li;
    limit_info_now(q, &li);
    common_headers(q, hdr, sizeof hdr, &li);
    if (q->resp.retry_after_ms >= 0) {
        size_t n = strlen(hdr);
        snprintf(hdr + n, sizeof hdr - n, "Retry-After: %lld\r\n", (long long)((q->resp.retry_after_ms + 999) / 1000));
    }
    answer_count(q, st);
    http_respond(q->conn, st, q->resp.content_type[0] ? q->resp.content_type : "application/json", hdr,
                 q->buf ? q->buf : "", q->len);
    q->conn = NULL;
    req_finish(q);
}

static void on_up_fail(void *arg, enum up_fail kind, bool head_seen, const char *msg)
{
    struct rt_req *q = arg;
    struct rt_backend *b = q->be;
    (void)head_seen;
    q->up = NULL;
    b->inflight--;
    enum rt_err_kind k = kind == UP_FAIL_CONNECT ? RT_ERR_CONNECT
                         : kind == UP_FAIL_TIMEOUT ? RT_ERR_TIMEOUT
                         : kind == UP_FAIL_GARBAGE ? RT_ERR_GARBAGE
                                                   : RT_ERR_BROKEN;
    set_try_status(q, -(int)k - 1);
    log_debug("route: attempt on %s failed: %s", b->label, msg);
    if (q->began && q->mode == RM_SSE && stream_whole(q) && q->conn) {
        /* the answer was complete ([DONE] or its finish_reasons); only the connection's end went wrong */
        stream_finished(q);
        return;
    }
    if (q->began) {
        q->last_kind = k;
        rt_backend_failure(q->r, b, k);
        if (q->probe)
            b->probe_inflight = false;
        q->probe = false;
        /* events already received whole were relayed; a partial one is dropped with the connection */
        q->len = 0;
        stream_broken(q, msg);
        return;
    }
    attempt_failed(q, k, msg, -1);
}

/* ---- admission ------------------------------------------------------------------------------------- */

/* A field given a value (null counts as absent). */
static json_t *field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Whether a continuation could keep what constrains the answer: a grammar, a response format or tools start
 * again from their beginning in a new request, so a constrained answer is not resumed. */
static bool body_resumable(json_t *o)
{
    json_t *rf = field(o, "response_format");
    const char *rft = json_string_value(json_object_get(rf, "type"));
    if (rf && !(rft && !strcmp(rft, "text")))
        return false;
    if (field(o, "grammar") || field(o, "json_schema"))
        return false;
    json_t *tools = field(o, "tools"), *tc = field(o, "tool_choice");
    return !(json_is_array(tools) && json_array_size(tools) && !(json_is_string(tc) && !strcmp(json_string_value(tc), "none")));
}

static const struct rt_route *find_route(const struct rt_table *t, const char *model)
{
    const struct rt_route *star = NULL;
    for (int i = 0; i < t->n_routes; i++) {
        if (!strcmp(t->routes[i].model, model))
            return &t->routes[i];
        if (!strcmp(t->routes[i].model, "*"))
            star = &t->routes[i];
    }
    return star;
}

/* The client's API key (Bearer token or x-api-key), or NULL. */
static const char *request_key(const struct http_request *req, size_t *len)
{
    const struct http_header *h = http_request_header(req, "authorization");
    if (h) {
        if (h->value_len > 7 && !strncasecmp(h->value, "Bearer ", 7)) {
            *len = h->value_len - 7;
            return h->value + 7;
        }
        *len = h->value_len;
        return h->value;
    }
    h = http_request_header(req, "x-api-key");
    if (h) {
        *len = h->value_len;
        return h->value;
    }
    return NULL;
}

/* The pool for this request: the sticky hash of its key, or the smooth weighted round robin. */
static int choose_pool(struct router *r, const struct rt_route *rt, const struct http_request *req)
{
    const char *key = NULL;
    size_t klen = 0;
    if (rt->sticky == ROUTE_STICKY_HEADER) {
        const struct http_header *h = http_request_header(req, rt->sticky_header);
        if (h && h->value_len)
            key = h->value, klen = h->value_len;
    } else if (rt->sticky == ROUTE_STICKY_API_KEY) {
        key = request_key(req, &klen);
    }
    int k = key ? route_pick_sticky(key, klen, rt->names, rt->weight, rt->n_split)
                : route_pick_swrr(((struct rt_route *)rt)->swrr, rt->weight, rt->n_split);
    (void)r;
    return k >= 0 ? rt->pool[k] : rt->pool[0];
}

/* The cache key: model, endpoint and the body with keys sorted, without what does not change the answer's
 * content (stream, stream_options, user). */
static char *cache_key_build(struct rt_req *q, size_t *len)
{
    json_t *o = json_deep_copy(q->json);
    if (!o)
        return NULL;
    json_object_del(o, "stream");
    json_object_del(o, "stream_options");
    json_object_del(o, "user");
    char *canon = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!canon)
        return NULL;
    size_t n = strlen(q->model) + strlen(q->path) + strlen(canon) + 3;
    char *k = malloc(n);
    if (k)
        *len = (size_t)snprintf(k, n, "%s\n%s\n%s", q->model, q->path, canon);
    free(canon);
    return k;
}

static bool header_has(const struct http_request *req, const char *name, const char *tok)
{
    const struct http_header *h = http_request_header(req, name);
    if (!h)
        return false;
    size_t tl = strlen(tok);
    for (size_t i = 0; i + tl <= h->value_len; i++)
        if (!strncasecmp(h->value + i, tok, tl))
            return true;
    return false;
}

/* Answers q from a cached value (it is copied first: the cache may move it). false on OOM (then a miss). */
static bool answer_hit(struct rt_req *q, const char *val, size_t vlen)
{
    char *copy = malloc(vlen + 1);
    if (!copy)
        return false;
    memcpy(copy, val, vlen);
    copy[vlen] = 0;
    q->cache = RC_HIT;
    q->r->m_cache_hits++;
    q->usage_prompt = q->usage_completion = 0; /* nothing was generated */
    answer_from_cache(q, copy, vlen);
    free(copy);
    return true;
}

/* Picks the pools (the split's choice, then the fallbacks) and makes the first attempt. */
static void proxy_route(struct rt_req *q, const struct http_request *req)
{
    const struct rt_route *rt = q->route;
    int first = choose_pool(q->r, rt, req);
    q->order[q->n_order++] = first;
    for (int k = 0; k < rt->n_fallback && q->n_order < RT_MAX_ORDER; k++) {
        bool dup = false;
        for (int m = 0; m < q->n_order; m++)
            dup |= q->order[m] == rt->fallback[k];
        if (!dup)
            q->order[q->n_order++] = rt->fallback[k];
    }
    if (q->r->models) {
        q->model_pool = first;
        if (rt_models_hold(q->r, q, first))
            return; /* goes on with rt_proxy_go, or was refused */
    }
    attempt_next(q);
}

void rt_proxy_go(struct rt_req *q)
{
    attempt_next(q);
}

void rt_proxy_refuse(struct rt_req *q, int status, const char *code, int retry_after_s, const char *msg)
{
    struct router *r = q->r;
    if (!q->conn) {
        req_finish(q);
        return;
    }
    char hdr[64] = "";
    if (retry_after_s > 0)
        snprintf(hdr, sizeof hdr, "Retry-After: %d\r\n", retry_after_s);
    q->status = status;
    proxy_error(r, q->conn, status, "server_error", code, status == 507 ? "model" : NULL, hdr[0] ? hdr : NULL,
                "%s", msg);
    q->ttfb_ns = clock_now_ns() - q->t0_ns;
    q->conn = NULL;
    req_finish(q);
}

/* The outcome of a shared-cache (Redis) lookup. Unavailable: the cache is bypassed for this request (and
 * its answer not stored), the request goes on to a backend. */
static void on_rcache(void *arg, enum route_rcache_result res, const char *val, size_t len)
{
    struct rt_req *q = arg;
    struct router *r = q->r;
    q->rget = NULL;
    if (res == ROUTE_RCACHE_HIT && answer_hit(q, val, len))
        return;
    if (res == ROUTE_RCACHE_UNAVAILABLE) {
        q->cache = RC_BYPASS;
        r->m_cache_unavailable++;
    } else {
        q->cache = RC_MISS;
        r->m_cache_misses++;
    }
    proxy_route(q, q->req);
}

void rt_proxy_start(struct router *r, struct http_conn *c, const struct http_request *req, enum rt_endpoint ep)
{
    const char *path = ep == RT_EP_CHAT ? "/v1/chat/completions" : "/v1/completions";
    r->m_requests++;
    /* the body: a JSON object */
    json_error_t je;
    json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        if (req->body_len)
            proxy_error(r, c, 400, "invalid_request_error", "invalid_json", NULL, NULL,
                             "the request body is not a JSON object (line %d, column %d: %s)", je.line, je.column,
                             je.text);
        else
            proxy_error(r, c, 400, "invalid_request_error", "invalid_json", NULL, NULL,
                             "the request body is empty; send a JSON object");
        return;
    }
    /* the key */
    int key_idx = -1;
    if (r->limits) {
        size_t klen = 0;
        const char *key = request_key(req, &klen);
        key_idx = key ? route_limits_find(r->limits, key, klen) : -1;
        if (key_idx < 0) {
            json_decref(o);
            r->m_limited[RT_LIM_AUTH]++;
            proxy_error(r, c, 401, "invalid_request_error", "invalid_api_key", NULL, NULL,
                             key ? "Incorrect API key provided." :
                                   "You didn't provide an API key (Authorization: Bearer <key>).");
            return;
        }
    }
    /* the route */
    json_t *jm = json_object_get(o, "model");
    const char *model = json_is_string(jm) ? json_string_value(jm) : "";
    const struct rt_route *rt = find_route(r->table, model);
    if (!rt && r->models) {
        char names[1024];
        rt_models_not_found(r, names, sizeof names);
        proxy_error(r, c, 404, "invalid_request_error", "model_not_found", "model", NULL,
                    "The model '%.200s' does not exist; this server has: %s", model, names);
        json_decref(o);
        return;
    }
    if (!rt) {
        proxy_error(r, c, 404, "invalid_request_error", "model_not_found", "model", NULL,
                         "The model '%.200s' does not exist or you do not have access to it.", model);
        json_decref(o);
        return;
    }
    /* what the router needs to know of the request */
    bool stream = json_is_true(json_object_get(o, "stream"));
    json_t *so = json_object_get(o, "stream_options");
    bool include_usage = json_is_object(so) && json_is_true(json_object_get(so, "include_usage"));
    json_t *jn = json_object_get(o, "n");
    int n = json_is_integer(jn) ? (int)json_integer_value(jn) : 1;
    json_t *jmt = json_object_get(o, "max_tokens");
    if (!json_is_integer(jmt))
        jmt = json_object_get(o, "max_completion_tokens");
    int64_t max_tokens = json_is_integer(jmt) ? json_integer_value(jmt) : -1;
    json_t *temp = json_object_get(o, "temperature");
    json_t *seed = json_object_get(o, "seed");
    bool deterministic = (json_is_number(temp) && json_number_value(temp) == 0) || json_is_integer(seed);
    json_t *lp = json_object_get(o, "logprobs");
    bool cacheable = deterministic && n == 1 && (!lp || json_is_null(lp) || json_is_false(lp)) &&
                     !json_is_true(json_object_get(o, "echo"));
    /* limits */
    int64_t reserve = 0;
    if (key_idx >= 0) {
        json_t *p = json_object_get(o, ep == RT_EP_CHAT ? "messages" : "prompt");
        char *ps = p ? json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        reserve = (ps ? (int64_t)strlen(ps) / 4 : 0) + (max_tokens >= 0 ? max_tokens : 256);
        free(ps);
        struct route_limit_info li;
        if (!route_limits_admit(r->limits, key_idx, reserve, evloop_now_ms(), &li)) {
            char hdr[1024];
            size_t hl = (size_t)snprintf(hdr, sizeof hdr, "Retry-After: %lld\r\n",
                                         (long long)((li.retry_after_ms + 999) / 1000 > 0 ? (li.retry_after_ms + 999) / 1000 : 1));
            route_limits_headers(&li, hdr, sizeof hdr, &hl);
            static const char *const what[] = {"", "requests per minute", "tokens per minute", "concurrent requests"};
            enum rt_limit_kind lk = li.denied == ROUTE_LIMIT_RPM ? RT_LIM_RPM
                                    : li.denied == ROUTE_LIMIT_TPM ? RT_LIM_TPM
                                                                   : RT_LIM_CONCURRENT;
            r->m_limited[lk]++;
            json_decref(o);
            proxy_error(r, c, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL, hdr,
                             "Rate limit reached for this key on %s; retry in %.1f s.", what[li.denied],
                             (double)li.retry_after_ms / 1000.0);
            return;
        }
    }
    struct rt_req *q = r->spare_reqs;
    if (q) {
        r->spare_reqs = q->next;
        r->n_spare_reqs--;
        memset(q, 0, sizeof *q);
    } else {
        q = calloc(1, sizeof *q);
    }
    if (!q) {
        json_decref(o);
        if (key_idx >= 0)
            route_limits_settle(r->limits, key_idx, reserve, 0, evloop_now_ms());
        proxy_error(r, c, 503, "server_error", "out_of_memory", NULL, NULL, "out of memory");
        return;
    }
    q->r = r;
    q->model_pool = -1;
    q->conn = c;
    q->t = r->table;
    q->t->refs++;
    q->ep = ep;
    q->path = path;
    q->t0_ns = clock_now_ns();
    q->body = req->body;
    q->body_len = req->body_len;
    q->json = o;
    snprintf(q->model, sizeof q->model, "%s", model);
    q->stream = stream;
    q->include_usage = include_usage;
    q->client_ids = json_is_true(json_object_get(o, "return_token_ids"));
    q->cacheable = cacheable;
    q->n_choices = n;
    q->max_tokens = max_tokens;
    /* a stream that may be resumed keeps what each of its choices sent (no memory: it is not resumed) */
    if (stream && r->table->conf->c.resume && n >= 1 && n <= RT_MAX_RESUME_CHOICES && body_resumable(o))
        q->ch = calloc((size_t)n, sizeof *q->ch);
    q->route = rt;
    q->key_idx = key_idx;
    q->limits_gen = r->limits_gen;
    if (key_idx >= 0) {
        size_t klen = 0;
        const char *key = request_key(req, &klen);
        q->key = strndup(key, klen);
        if (!q->key)
            q->key_idx = -1; /* out of memory: the reservation stays, nothing worse */
    }
    q->reserved = reserve;
    q->usage_prompt = q->usage_completion = -1;
    q->last_retry_after = -1;
    q->created = (int64_t)time(NULL);
    ev_timer_init(&q->timer, on_timer);
    /* headers passed upstream: the client's credentials when the router does not check keys itself */
    if (!r->limits) {
        const struct http_header *h = http_request_header(req, "authorization");
        if (h && h->value_len < 900)
            snprintf(q->fwd, sizeof q->fwd, "Authorization: %.*s\r\n", (int)h->value_len, h->value);
    }
    q->next = r->reqs;
    if (r->reqs)
        r->reqs->prev = q;
    r->reqs = q;
    r->n_reqs++;
    http_conn_set_data(c, q);

    /* the cache */
    if ((r->cache || r->rcache) && cacheable) {
        if (header_has(req, "x-wafer-cache", "bypass") || header_has(req, "cache-control", "no-cache") ||
            header_has(req, "cache-control", "no-store")) {
            q->cache = RC_BYPASS;
            r->m_cache_bypass++;
        } else {
            q->cache_key = cache_key_build(q, &q->cache_key_len);
            if (q->cache_key && r->rcache) {
                q->req = req;
                q->rget = route_rcache_get(r->rcache, q->cache_key, q->cache_key_len, on_rcache, q);
                if (q->rget)
                    return; /* goes on in on_rcache */
                on_rcache(q, ROUTE_RCACHE_UNAVAILABLE, NULL, 0);
                return;
            }
            size_t vlen = 0;
            const char *val = q->cache_key ? route_cache_get(r->cache, q->cache_key, q->cache_key_len,
                                                             evloop_now_ms(), &vlen) : NULL;
            if (val && answer_hit(q, val, vlen))
                return;
            q->cache = RC_MISS;
            r->m_cache_misses++;
        }
    }
    proxy_route(q, req);
}

/* ---- client events --------------------------------------------------------------------------------- */

void rt_proxy_on_close(struct router *r, struct rt_req *q)
{
    (void)r;
    /* The client left: close the upstream request so the backend frees its slot. */
    q->conn = NULL;
    if (q->status == 0)
        q->status = 499;
    req_finish(q);
}

void rt_proxy_on_writable(struct router *r, struct rt_req *q)
{
    (void)r;
    if (q->paused && q->up) {
        q->paused = false;
        up_pause(q->up, false);
    }
}

void rt_proxy_cancel_all(struct router *r)
{
    while (r->reqs) {
        struct rt_req *q = r->reqs;
        if (q->conn) {
            http_conn_set_data(q->conn, NULL);
            q->conn = NULL;
        }
        req_finish(q);
    }
    while (r->spare_reqs) {
        struct rt_req *q = r->spare_reqs;
        r->spare_reqs = q->next;
        free(q);
    }
    r->n_spare_reqs = 0;
}
