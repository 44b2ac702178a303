/*
 * client: libwafer-client (include/wafer/client.h has the contract). It includes nothing of wafer but its
 * own public header and the retry policy (client/retry.h), so users link it with libcurl and jansson alone.
 *
 * Every call, single or batch, is a set of transfers driven on one curl multi handle by the calling thread:
 * the loop starts transfers up to the concurrency, lets curl move bytes (curl_multi_poll), reaps finished
 * attempts, and either finishes a transfer or parks it until its retry is due, so a batch's retries wait
 * without holding a thread or a connection. The first-byte timeout (curl has none) is checked in that loop.
 *
 * Connection pooling: a multi handle keeps its connections alive; the client keeps idle multi handles in a
 * pool and lends each to one call at a time, so connections are reused from call to call but never by two
 * threads at once (curl's shared connection cache is not safe across threads: curl_share_setopt(3)). The
 * share handle shares only the DNS cache and TLS sessions, under its locks.
 *
 * Streams: server-sent events are parsed as they arrive ("data:" lines, an event per blank line); each
 * event's text goes to the caller's callback at once. From the first byte of a 2xx stream on, a failure
 * is final (WAFER_E_STREAM): the caller may already have shown the text.
 */
#include "wafer/client.h"

#include "client/internal.h"
#include "client/retry.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define CLIENT_MAX_BODY ((size_t)64 << 20) /* a response body larger than this is refused */
#define CLIENT_MAX_FILE ((size_t)1 << 36)  /* ... except a file's content (wafer_files_content) */

struct client_buf {
    char *p; /* NUL-terminated when not NULL */
    size_t len, cap;
};

static int client_buf_add(struct client_buf *b, const char *d, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np)
            return -1;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static void client_buf_free(struct client_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

struct wafer_client {
    char *base;  /* "http://host:port", no trailing slash or /v1 */
    char *model; /* NULL: none */
    char *auth;  /* "Authorization: Bearer ..." or NULL */
    struct curl_slist *post_headers, *get_headers, *upload_headers;
    struct wafer_client_options opt; /* numbers and the hook; its strings are not used after create */
    CURLSH *share;
    pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
    pthread_mutex_t pool_mu;
    CURLM **idle; /* the pool of idle multi handles */
    int n_idle, cap_idle;
};

const char *wafer_status_name(int status)
{
    switch (status) {
    case WAFER_OK: return "ok";
    case WAFER_E_INVALID: return "invalid";
    case WAFER_E_NOMEM: return "nomem";
    case WAFER_E_CONNECT: return "connect";
    case WAFER_E_TIMEOUT: return "timeout";
    case WAFER_E_HTTP: return "http";
    case WAFER_E_PROTOCOL: return "protocol";
    case WAFER_E_STREAM: return "stream";
    case WAFER_E_CANCELLED: return "cancelled";
    case WAFER_E_BATCH: return "batch";
    case WAFER_E_NO_FILE: return "no_file";
    default: return "unknown";
    }
}

void wafer_client_options_default(struct wafer_client_options *o)
{
    memset(o, 0, sizeof *o);
    o->base_url = "http://127.0.0.1:8080";
    o->connect_timeout_ms = 10000;
    o->first_byte_timeout_ms = 0;
    o->timeout_ms = 600000;
    o->max_retries = 2;
    o->max_connections = 16;
}

void wafer_params_default(struct wafer_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = -1;
    p->top_p = -1;
}

void wafer_result_free(struct wafer_result *r)
{
    if (!r)
        return;
    free(r->text);
    memset(r, 0, sizeof *r);
    r->prompt_tokens = r->completion_tokens = -1;
}

void client_result_init(struct wafer_result *r)
{
    memset(r, 0, sizeof *r);
    r->prompt_tokens = r->completion_tokens = -1;
}

int client_fail(struct wafer_result *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    r->status = status;
    return status;
}

static int64_t client_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* [0, 1) for the retry jitter: xorshift64*, one state per thread. */
static double client_rand01(void)
{
    static _Thread_local uint64_t s;
    if (!s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&s ^ 0x9e3779b97f4a7c15ull;
    }
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return (double)((s * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* ---------------------------------------------------------------- the client */

static pthread_once_t client_curl_once = PTHREAD_ONCE_INIT;
static void client_curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static void client_share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
    (void)h;
    (void)access;
    struct wafer_client *c = ud;
    pthread_mutex_lock(&c->share_mu[data < CURL_LOCK_DATA_LAST ? data : 0]);
}

static void client_share_unlock(CURL *h, curl_lock_data data, void *ud)
{
    (void)h;
    struct wafer_client *c = ud;
    pthread_mutex_unlock(&c->share_mu[data < CURL_LOCK_DATA_LAST ? data : 0]);
}

struct wafer_client *wafer_client_create(const struct wafer_client_options *o, char *err)
{
    char scratch[WAFER_ERR_MAX];
    if (!err)
        err = scratch;
    err[0] = 0;
    struct wafer_client_options def;
    if (!o) {
        wafer_client_options_default(&def);
        o = &def;
    }
    const char *url = o->base_url;
    if (!url || (strncasecmp(url, "http://", 7) && strncasecmp(url, "https://", 8))) {
        snprintf(err, WAFER_ERR_MAX, "base_url must start with http:// or https:// (got '%s')", url ? url : "(null)");
        return NULL;
    }
    if (o->connect_timeout_ms < 0 || o->first_byte_timeout_ms < 0 || o->timeout_ms < 0 || o->max_retries < 0 ||
        o->max_retries > 100 || o->max_connections < 1) {
        snprintf(err, WAFER_ERR_MAX, "timeouts must be >= 0, max_retries in [0, 100], max_connections >= 1");
        return NULL;
    }
    pthread_once(&client_curl_once, client_curl_init);
    struct wafer_client *c = calloc(1, sizeof *c);
    if (!c)
        goto oom;
    c->opt = *o;
    c->opt.base_url = c->opt.api_key = c->opt.model = NULL;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&c->share_mu[i], NULL);
    pthread_mutex_init(&c->pool_mu, NULL);
    size_t n = strlen(url);
    while (n && url[n - 1] == '/')
        n--;
    if (n >= 3 && !strncmp(url + n - 3, "/v1", 3))
        n -= 3;
    if (!(c->base = strndup(url, n)))
        goto oom;
    if (o->model && !(c->model = strdup(o->model)))
        goto oom;
    if (o->api_key && *o->api_key) {
        if (asprintf(&c->auth, "Authorization: Bearer %s", o->api_key) < 0) {
            c->auth = NULL;
            goto oom;
        }
        if (!(c->post_headers = curl_slist_append(c->post_headers, c->auth)) ||
            !(c->get_headers = curl_slist_append(c->get_headers, c->auth)) ||
            !(c->upload_headers = curl_slist_append(c->upload_headers, c->auth)))
            goto oom;
    }
    struct curl_slist *h;
    if (!(h = curl_slist_append(c->upload_headers, "Expect:")) || !(c->upload_headers = h))
        goto oom;
    /* no "Expect: 100-continue" round trip before a long prompt */
    if (!(h = curl_slist_append(c->post_headers, "Content-Type: application/json")) || !(c->post_headers = h) ||
        !(h = curl_slist_append(c->post_headers, "Expect:")) || !(c->post_headers = h))
        goto oom;
    if (!(c->share = curl_share_init()))
        goto oom;
    curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, client_share_lock);
    curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, client_share_unlock);
    curl_share_setopt(c->share, CURLSHOPT_USERDATA, c);
    curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    return c;
oom:
    snprintf(err, WAFER_ERR_MAX, "out of memory");
    wafer_client_destroy(c);
    return NULL;
}

void wafer_client_destroy(struct wafer_client *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_idle; i++)
        curl_multi_cleanup(c->idle[i]);
    free(c->idle);
    if (c->share)
        curl_share_cleanup(c->share);
    curl_slist_free_all(c->post_headers);
    curl_slist_free_all(c->get_headers);
    curl_slist_free_all(c->upload_headers);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&c->share_mu[i]);
    pthread_mutex_destroy(&c->pool_mu);
    free(c->base);
    free(c->model);
    free(c->auth);
    free(c);
}

/* A multi handle for one call: an idle one from the pool (its connections still open), or a new one. */
static CURLM *client_pool_get(struct wafer_client *c)
{
    CURLM *m = NULL;
    pthread_mutex_lock(&c->pool_mu);
    if (c->n_idle)
        m = c->idle[--c->n_idle];
    pthread_mutex_unlock(&c->pool_mu);
    if (!m && (m = curl_multi_init()))
        curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)c->opt.max_connections);
    return m;
}

static void client_pool_put(struct wafer_client *c, CURLM *m)
{
    pthread_mutex_lock(&c->pool_mu);
    if (c->n_idle == c->cap_idle) {
        int cap = c->cap_idle ? c->cap_idle * 2 : 4;
        CURLM **ni = realloc(c->idle, sizeof *ni * (size_t)cap);
        if (ni) {
            c->idle = ni;
            c->cap_idle = cap;
        }
    }
    if (c->n_idle < c->cap_idle) {
        c->idle[c->n_idle++] = m;
        m = NULL;
    }
    pthread_mutex_unlock(&c->pool_mu);
    if (m)
        curl_multi_cleanup(m);
}

/* ---------------------------------------------------------------- transfers */

enum xfer_kind { XK_COMPLETION, XK_CHAT, XK_RAW }; /* XK_RAW: any request, the body as it is in out->text */
enum xfer_state { XS_PENDING, XS_RUNNING, XS_WAITING, XS_DONE };

struct xfer {
    struct wafer_client *cl;
    enum xfer_kind kind;
    bool stream;
    char *url;
    char *body; /* request JSON (POST); NULL for GET */
    const char *method; /* XK_RAW: "GET" or "POST" (NULL: POST with a body, else GET) */
    const struct client_upload *upload; /* XK_RAW: a multipart POST of this file instead of a body */
    curl_mime *mime;                    /* the upload's form, made anew for each attempt */
    size_t max_body;                    /* the largest response body taken (0: CLIENT_MAX_BODY) */
    wafer_stream_fn fn;
    void *ud;
    struct wafer_result *out;
    enum xfer_state state;
    int64_t due_ns; /* XS_WAITING: when the retry starts */
    int retries_done;
    /* the attempt in flight */
    CURL *easy;
    char curl_err[CURL_ERROR_SIZE];
    int64_t t_start_ns;
    bool first_byte;   /* a status line arrived */
    bool began;        /* a 2xx stream's body began: never retried from here */
    bool fb_timed_out; /* the first-byte timeout passed */
    bool too_large, oom;
    long status;
    char retry_after[64], retry_after_ms[32], should_retry[8];
    struct client_buf resp; /* non-stream body, or an error body */
    struct client_buf line; /* stream: the line being received */
    struct client_buf data; /* stream: the current event's data */
    struct client_buf text; /* the generated text so far */
    bool done_event, cancelled;
    char stream_error[200];
};

static void client_copy_header(char *dst, size_t cap, const char *v, size_t n)
{
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    while (n && *v == ' ')
        v++, n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t xfer_on_header(char *b, size_t size, size_t nitems, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nitems;
    if (n >= 5 && !memcmp(b, "HTTP/", 5)) {
        const char *sp = memchr(b, ' ', n);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->first_byte = true;
        x->retry_after[0] = x->retry_after_ms[0] = x->should_retry[0] = 0;
        return n;
    }
    const char *colon = memchr(b, ':', n);
    if (!colon)
        return n;
    size_t k = (size_t)(colon - b);
    if (k == 11 && !strncasecmp(b, "retry-after", k))
        client_copy_header(x->retry_after, sizeof x->retry_after, colon + 1, n - k - 1);
    else if (k == 14 && !strncasecmp(b, "retry-after-ms", k))
        client_copy_header(x->retry_after_ms, sizeof x->retry_after_ms, colon + 1, n - k - 1);
    else if (k == 14 && !strncasecmp(b, "x-should-retry", k))
        client_copy_header(x->should_retry, sizeof x->should_retry, colon + 1, n - k - 1);
    return n;
}

/* Text, finish reason and usage of one choice object (a response's or a stream event's). */
static void xfer_take_choice(struct xfer *x, json_t *j, const char **text)
{
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    if (ch) {
        json_t *t = x->kind == XK_CHAT
                        ? json_object_get(json_object_get(ch, x->stream ? "delta" : "message"), "content")
                        : json_object_get(ch, "text");
        *text = json_string_value(t);
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        if (fr)
            snprintf(x->out->finish_reason, sizeof x->out->finish_reason, "%s", fr);
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        json_t *p = json_object_get(u, "prompt_tokens"), *c = json_object_get(u, "completion_tokens");
        if (json_is_integer(p))
            x->out->prompt_tokens = (int)json_integer_value(p);
        if (json_is_integer(c))
            x->out->completion_tokens = (int)json_integer_value(c);
    }
}

/* The message of an error body: {"error": {"message": ...}}, {"error": "..."}, {"message": ...}, or the text. */
static void client_error_message(const char *body, size_t len, char *out, size_t cap)
{
    out[0] = 0;
    json_t *j = json_loadb(body ? body : "", len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!m)
        m = json_string_value(e);
    if (!m)
        m = json_string_value(json_object_get(j, "message"));
    if (m) {
        snprintf(out, cap, "%s", m);
    } else if (body && len) {
        snprintf(out, cap, "%.*s", (int)(len > 200 ? 200 : len), body);
        for (char *p = out; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    json_decref(j);
}

/* One whole server-sent event (its data lines joined). */
static void xfer_sse_event(struct xfer *x)
{
    if (!x->data.len)
        return;
    if (!strcmp(x->data.p, "[DONE]")) {
        x->done_event = true;
    } else {
        json_t *j = json_loadb(x->data.p, x->data.len, 0, NULL);
        if (!j) {
            snprintf(x->stream_error, sizeof x->stream_error, "an event is not JSON: %.80s", x->data.p);
        } else if (json_object_get(j, "error")) {
            char msg[160];
            client_error_message(x->data.p, x->data.len, msg, sizeof msg);
            snprintf(x->stream_error, sizeof x->stream_error, "the server reported an error: %s", msg);
        } else {
            const char *t = NULL;
            xfer_take_choice(x, j, &t);
            size_t n = t ? strlen(t) : 0;
            if (n) {
                if (client_buf_add(&x->text, t, n))
                    x->oom = true;
                else if (x->fn && x->fn(x->ud, t, n))
                    x->cancelled = true;
            }
        }
        json_decref(j);
    }
    x->data.len = 0;
    x->data.p[0] = 0;
}

static void xfer_sse_line(struct xfer *x, const char *l, size_t n)
{
    if (n && l[n - 1] == '\r')
        n--;
    if (n == 0) {
        xfer_sse_event(x);
        return;
    }
    if (n >= 5 && !memcmp(l, "data:", 5)) {
        l += 5, n -= 5;
        if (n && *l == ' ')
            l++, n--;
        if ((x->data.len && client_buf_add(&x->data, "\n", 1)) || client_buf_add(&x->data, l, n))
            x->oom = true;
    } /* comments (":...") and the event, id and retry fields carry nothing here */
}

static size_t xfer_on_body(char *d, size_t size, size_t nmemb, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nmemb;
    if (x->stream && x->status >= 200 && x->status < 300) {
        x->began = true;
        for (size_t i = 0; i < n && !x->cancelled && !x->oom; i++) {
            if (d[i] != '\n') {
                if (client_buf_add(&x->line, d + i, 1))
                    x->oom = true;
                continue;
            }
            xfer_sse_line(x, x->line.p ? x->line.p : "", x->line.len);
            x->line.len = 0;
        }
        return x->cancelled || x->oom ? 0 : n; /* 0 aborts the transfer */
    }
    if (x->resp.len + n > (x->max_body ? x->max_body : CLIENT_MAX_BODY)) {
        x->too_large = true;
        return 0;
    }
    if (client_buf_add(&x->resp, d, n)) {
        x->oom = true;
        return 0;
    }
    return n;
}

/* The upload's bytes, read by curl from the caller's memory (so a retry sends them again, not a copy). */
struct xfer_upload_pos {
    const struct client_upload *up;
    size_t pos;
};

static size_t xfer_upload_read(char *buf, size_t size, size_t nitems, void *arg)
{
    struct xfer_upload_pos *u = arg;
    size_t n = size * nitems, left = u->up->len - u->pos;
    if (n > left)
        n = left;
    memcpy(buf, u->up->data + u->pos, n);
    u->pos += n;
    return n;
}

static int xfer_upload_seek(void *arg, curl_off_t offset, int origin)
{
    struct xfer_upload_pos *u = arg;
    if (origin != SEEK_SET || offset < 0 || (size_t)offset > u->up->len)
        return CURL_SEEKFUNC_CANTSEEK;
    u->pos = (size_t)offset;
    return CURL_SEEKFUNC_OK;
}

/* The multipart form of an upload (purpose, file) for the attempt starting on x->easy. */
static int xfer_mime(struct xfer *x)
{
    const struct client_upload *up = x->upload;
    struct xfer_upload_pos *u = malloc(sizeof *u);
    if (!u || !(x->mime = curl_mime_init(x->easy))) {
        free(u);
        return -1;
    }
    u->up = up;
    u->pos = 0;
    curl_mimepart *part = curl_mime_addpart(x->mime);
    if (!part || curl_mime_name(part, "purpose") || curl_mime_data(part, up->purpose, CURL_ZERO_TERMINATED)) {
        free(u);
        return -1;
    }
    part = curl_mime_addpart(x->mime);
    if (!part || curl_mime_name(part, "file") || curl_mime_filename(part, up->filename) ||
        curl_mime_type(part, "application/jsonl") ||
        curl_mime_data_cb(part, (curl_off_t)up->len, xfer_upload_read, xfer_upload_seek, free, u)) {
        free(u);
        return -1;
    }
    return 0;
}

static int xfer_start(struct xfer *x, CURLM *m)
{
    struct wafer_client *cl = x->cl;
    x->status = 0;
    x->first_byte = x->began = x->fb_timed_out = x->too_large = x->oom = x->done_event = false;
    x->curl_err[0] = x->stream_error[0] = 0;
    x->resp.len = x->line.len = x->data.len = x->text.len = 0;
    if (x->data.p)
        x->data.p[0] = 0;
    x->out->finish_reason[0] = 0;
    CURL *e = x->easy = curl_easy_init();
    if (!e)
        return -1;
    curl_easy_setopt(e, CURLOPT_URL, x->url);
    curl_easy_setopt(e, CURLOPT_SHARE, cl->share);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, xfer_on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, xfer_on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->curl_err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "wafer-client/1");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, cl->opt.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, cl->opt.timeout_ms);
    if (x->upload) {
        if (xfer_mime(x))
            goto fail;
        curl_easy_setopt(e, CURLOPT_MIMEPOST, x->mime);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, cl->upload_headers);
    } else if (x->body) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(x->body));
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, cl->post_headers);
    } else if (x->method && !strcmp(x->method, "POST")) { /* a POST without a body (cancel) */
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, cl->get_headers);
    } else {
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, cl->get_headers);
    }
    if (curl_multi_add_handle(m, e) != CURLM_OK)
        goto fail;
    x->out->attempts++;
    x->t_start_ns = client_now_ns();
    x->state = XS_RUNNING;
    return 0;
fail:
    curl_easy_cleanup(e);
    curl_mime_free(x->mime);
    x->mime = NULL;
    x->easy = NULL;
    return -1;
}

/* Puts what arrived into the result (the text, also of a broken stream) and marks the transfer done. */
static void xfer_finish(struct xfer *x, int status, const char *why)
{
    struct wafer_result *o = x->out;
    o->status = status;
    snprintf(o->error, sizeof o->error, "%s", status ? why : "");
    free(o->text);
    o->text = NULL;
    o->text_len = 0;
    struct client_buf *src = x->kind == XK_RAW ? &x->resp : &x->text;
    if (src->len || (status == WAFER_OK && x->kind != XK_RAW) || (x->kind == XK_RAW && x->first_byte)) {
        o->text = src->p ? src->p : strdup("");
        o->text_len = src->len;
        if (src->p)
            memset(src, 0, sizeof *src);
        if (!o->text) {
            o->status = WAFER_E_NOMEM;
            snprintf(o->error, sizeof o->error, "out of memory");
        }
    }
    x->state = XS_DONE;
}

/* The end of an attempt (res: curl's result; ignored when the first-byte timeout cut it). Decides: done,
 * or a retry (XS_WAITING until due_ns). */
static void xfer_end(struct xfer *x, CURLM *m, CURLcode res)
{
    curl_multi_remove_handle(m, x->easy);
    curl_easy_cleanup(x->easy);
    x->easy = NULL;
    curl_mime_free(x->mime);
    x->mime = NULL;
    struct wafer_client *cl = x->cl;
    x->out->http_status = (int)x->status;
    int st = WAFER_OK;
    bool retry = false;
    char why[512] = "";
    if (x->stream && x->line.len && !x->cancelled && !x->oom) { /* a last line without its newline */
        xfer_sse_line(x, x->line.p, x->line.len);
        x->line.len = 0;
    }
    if (x->stream && x->data.len && !x->cancelled && !x->oom)
        xfer_sse_event(x);
    if (x->cancelled) {
        st = WAFER_E_CANCELLED;
        snprintf(why, sizeof why, "the stream was stopped by the callback");
    } else if (x->oom) {
        st = WAFER_E_NOMEM;
        snprintf(why, sizeof why, "out of memory");
    } else if (x->too_large) {
        st = WAFER_E_PROTOCOL;
        snprintf(why, sizeof why, "the response is larger than %zu bytes", x->max_body ? x->max_body : CLIENT_MAX_BODY);
    } else if (x->fb_timed_out) {
        st = WAFER_E_TIMEOUT;
        retry = true;
        snprintf(why, sizeof why, "no response within the first-byte timeout (%ld ms)", cl->opt.first_byte_timeout_ms);
    } else if (res != CURLE_OK) {
        const char *msg = x->curl_err[0] ? x->curl_err : curl_easy_strerror(res);
        if (x->began) {
            st = WAFER_E_STREAM;
            snprintf(why, sizeof why, "the stream broke after it began: %s", msg);
        } else {
            st = res == CURLE_OPERATION_TIMEDOUT ? WAFER_E_TIMEOUT : WAFER_E_CONNECT;
            retry = true;
            snprintf(why, sizeof why, "%s", msg);
        }
    } else if (x->status < 200 || x->status >= 300) {
        char msg[200];
        client_error_message(x->resp.p, x->resp.len, msg, sizeof msg);
        st = WAFER_E_HTTP;
        retry = client_retry_status((int)x->status, x->should_retry);
        snprintf(why, sizeof why, "HTTP %ld%s%s", x->status, msg[0] ? ": " : "", msg);
    } else if (x->stream) {
        if (x->stream_error[0]) {
            st = WAFER_E_STREAM;
            snprintf(why, sizeof why, "%s", x->stream_error);
        } else if (!x->done_event) {
            st = WAFER_E_STREAM;
            snprintf(why, sizeof why, "the stream ended before data: [DONE]");
        }
    } else if (x->kind != XK_RAW) {
        json_error_t je;
        json_t *j = json_loadb(x->resp.p ? x->resp.p : "", x->resp.len, 0, &je);
        const char *t = NULL;
        if (j)
            xfer_take_choice(x, j, &t);
        if (!j) {
            st = WAFER_E_PROTOCOL;
            snprintf(why, sizeof why, "the response is not JSON: %s", je.text);
        } else if (!t) {
            st = WAFER_E_PROTOCOL;
            snprintf(why, sizeof why, "the response has no choices[0].%s", x->kind == XK_CHAT ? "message.content" : "text");
        } else if (client_buf_add(&x->text, t, strlen(t))) {
            st = WAFER_E_NOMEM;
            snprintf(why, sizeof why, "out of memory");
        }
        json_decref(j);
    }
    if (retry && x->retries_done < cl->opt.max_retries) {
        double after = client_retry_after(x->retry_after_ms, x->retry_after, time(NULL));
        double delay = client_retry_delay(x->retries_done, after, client_rand01());
        x->retries_done++;
        if (cl->opt.on_retry)
            cl->opt.on_retry(cl->opt.on_retry_ud, x->out->attempts + 1, delay, why);
        x->state = XS_WAITING;
        x->due_ns = client_now_ns() + (int64_t)(delay * 1e9);
        return;
    }
    if (retry && x->retries_done) {
        char more[600];
        snprintf(more, sizeof more, "%s (after %d attempts)", why, x->out->attempts);
        xfer_finish(x, st, more);
        return;
    }
    xfer_finish(x, st, why);
}

/* Runs the transfers to the end, up to concurrency at once, on one multi handle from the pool. */
static void client_run(struct wafer_client *cl, struct xfer *xs, int n, int concurrency)
{
    CURLM *m = client_pool_get(cl);
    if (!m) {
        for (int i = 0; i < n; i++)
            if (xs[i].state != XS_DONE)
                xfer_finish(&xs[i], WAFER_E_NOMEM, "out of memory");
        return;
    }
    int done = 0, running = 0, next = 0;
    for (int i = 0; i < n; i++)
        done += xs[i].state == XS_DONE;
    int64_t fbt = (int64_t)cl->opt.first_byte_timeout_ms * 1000000;
    while (done < n) {
        int64_t now = client_now_ns();
        for (int i = 0; i < n && running < concurrency; i++) /* due retries first, then new transfers */
            if (xs[i].state == XS_WAITING && xs[i].due_ns <= now) {
                if (xfer_start(&xs[i], m)) {
                    xfer_finish(&xs[i], WAFER_E_NOMEM, "out of memory");
                    done++;
                } else {
                    running++;
                }
            }
        for (; next < n && running < concurrency; next++) {
            if (xs[next].state != XS_PENDING)
                continue;
            if (xfer_start(&xs[next], m)) {
                xfer_finish(&xs[next], WAFER_E_NOMEM, "out of memory");
                done++;
            } else {
                running++;
            }
        }
        int still;
        curl_multi_perform(m, &still);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct xfer *x;
            CURLcode res = msg->data.result;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            xfer_end(x, m, res);
            running--;
            done += x->state == XS_DONE;
        }
        now = client_now_ns();
        int64_t wait_ns = 200 * 1000000LL;
        for (int i = 0; i < n; i++) {
            struct xfer *x = &xs[i];
            if (x->state == XS_RUNNING && fbt > 0 && !x->first_byte) {
                if (now - x->t_start_ns >= fbt) {
                    x->fb_timed_out = true;
                    xfer_end(x, m, CURLE_OK);
                    running--;
                    done += x->state == XS_DONE;
                } else if (x->t_start_ns + fbt - now < wait_ns) {
                    wait_ns = x->t_start_ns + fbt - now;
                }
            }
            if (x->state == XS_WAITING && x->due_ns - now < wait_ns)
                wait_ns = x->due_ns - now;
        }
        if (done >= n)
            break;
        if (wait_ns > 0)
            curl_multi_poll(m, NULL, 0, (int)((wait_ns + 999999) / 1000000), NULL);
    }
    client_pool_put(cl, m);
}

/* ---------------------------------------------------------------- requests */

/* The JSON body of a completion (prompt) or chat (msgs) request. NULL with a message in out on error. */
static char *client_body(const struct wafer_client *cl, const struct wafer_params *p, const char *prompt,
                         const struct wafer_message *msgs, int n_msgs, bool stream, struct wafer_result *out)
{
    json_t *j = json_object(), *extra = NULL;
    char *s = NULL;
    if (!j)
        goto oom;
    const char *model = p && p->model ? p->model : cl->model;
    if (model && json_object_set_new(j, "model", json_string(model)))
        goto oom;
    if (prompt) {
        if (json_object_set_new(j, "prompt", json_string(prompt)))
            goto bad_utf8;
    } else {
        json_t *arr = json_array();
        if (!arr || json_object_set_new(j, "messages", arr))
            goto oom;
        for (int i = 0; i < n_msgs; i++) {
            if (!msgs[i].role || !msgs[i].content) {
                client_fail(out, WAFER_E_INVALID, "message %d has no role or no content", i);
                goto fail;
            }
            json_t *mj = json_pack("{s:s, s:s}", "role", msgs[i].role, "content", msgs[i].content);
            if (!mj || json_array_append_new(arr, mj))
                goto bad_utf8;
        }
    }
    if (p) {
        if (p->max_tokens > 0 && json_object_set_new(j, "max_tokens", json_integer(p->max_tokens)))
            goto oom;
        if (p->temperature >= 0 && json_object_set_new(j, "temperature", json_real(p->temperature)))
            goto oom;
        if (p->top_p >= 0 && json_object_set_new(j, "top_p", json_real(p->top_p)))
            goto oom;
        if (p->seed_set && json_object_set_new(j, "seed", json_integer(p->seed)))
            goto oom;
        if (p->n_stop > 0) {
            json_t *arr = json_array();
            if (!arr || json_object_set_new(j, "stop", arr))
                goto oom;
            for (int i = 0; i < p->n_stop; i++)
                if (!p->stop[i] || json_array_append_new(arr, json_string(p->stop[i])))
                    goto bad_utf8;
        }
        if (p->extra_json) {
            json_error_t je;
            extra = json_loads(p->extra_json, 0, &je);
            if (!json_is_object(extra)) {
                client_fail(out, WAFER_E_INVALID, "extra_json is not a JSON object: %s", extra ? "" : je.text);
                goto fail;
            }
            if (json_object_update(j, extra))
                goto oom;
        }
    }
    if (stream && (json_object_set_new(j, "stream", json_true()) ||
                   json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1))))
        goto oom;
    if (!(s = json_dumps(j, JSON_COMPACT)))
        goto oom;
    json_decref(extra);
    json_decref(j);
    return s;
bad_utf8:
    client_fail(out, WAFER_E_INVALID, "the prompt, a message or a stop string is NULL or not valid UTF-8");
    goto fail;
oom:
    client_fail(out, WAFER_E_NOMEM, "out of memory");
fail:
    json_decref(extra);
    json_decref(j);
    return NULL;
}

static int client_url(const struct wafer_client *cl, const char *path, char **url, struct wafer_result *out)
{
    if (asprintf(url, "%s%s%s", cl->base, path[0] == '/' ? "" : "/", path) < 0) {
        *url = NULL;
        return client_fail(out, WAFER_E_NOMEM, "out of memory");
    }
    return 0;
}

static void xfer_free(struct xfer *x)
{
    free(x->url);
    free(x->body);
    curl_mime_free(x->mime);
    client_buf_free(&x->resp);
    client_buf_free(&x->line);
    client_buf_free(&x->data);
    client_buf_free(&x->text);
}

/* One completion or chat request (kind XK_COMPLETION or XK_CHAT), to the end (retries included). */
static int client_call(struct wafer_client *cl, enum xfer_kind kind, const char *prompt,
                       const struct wafer_message *msgs, int n_msgs, const struct wafer_params *p, bool stream,
                       wafer_stream_fn fn, void *ud, struct wafer_result *out)
{
    if (!out)
        return WAFER_E_INVALID;
    client_result_init(out);
    if (!cl)
        return client_fail(out, WAFER_E_INVALID, "no client");
    if (kind == XK_COMPLETION && !prompt)
        return client_fail(out, WAFER_E_INVALID, "no prompt");
    if (kind == XK_CHAT && (!msgs || n_msgs < 1))
        return client_fail(out, WAFER_E_INVALID, "a chat needs at least one message");
    struct xfer x;
    memset(&x, 0, sizeof x);
    x.cl = cl;
    x.kind = kind;
    x.stream = stream;
    x.fn = fn;
    x.ud = ud;
    x.out = out;
    if (client_url(cl, kind == XK_CHAT ? "/v1/chat/completions" : "/v1/completions", &x.url, out))
        return out->status;
    if (!(x.body = client_body(cl, p, kind == XK_COMPLETION ? prompt : NULL, msgs, n_msgs, stream, out))) {
        xfer_free(&x);
        return out->status;
    }
    client_run(cl, &x, 1, 1);
    xfer_free(&x);
    return out->status;
}

int wafer_generate(struct wafer_client *c, const char *prompt, const struct wafer_params *params,
                   struct wafer_result *out)
{
    return client_call(c, XK_COMPLETION, prompt, NULL, 0, params, false, NULL, NULL, out);
}

int wafer_generate_stream(struct wafer_client *c, const char *prompt, const struct wafer_params *params,
                          wafer_stream_fn fn, void *ud, struct wafer_result *out)
{
    return client_call(c, XK_COMPLETION, prompt, NULL, 0, params, true, fn, ud, out);
}

int wafer_chat(struct wafer_client *c, const struct wafer_message *msgs, int n, const struct wafer_params *params,
               struct wafer_result *out)
{
    return client_call(c, XK_CHAT, NULL, msgs, n, params, false, NULL, NULL, out);
}

int wafer_chat_stream(struct wafer_client *c, const struct wafer_message *msgs, int n,
                      const struct wafer_params *params, wafer_stream_fn fn, void *ud, struct wafer_result *out)
{
    return client_call(c, XK_CHAT, NULL, msgs, n, params, true, fn, ud, out);
}

int client_request(struct wafer_client *cl, const char *method, const char *path, const char *json_body,
                   const struct client_upload *upload, size_t max_body, struct wafer_result *out)
{
    if (!out)
        return WAFER_E_INVALID;
    client_result_init(out);
    if (!cl || !path || !method)
        return client_fail(out, WAFER_E_INVALID, "no client, method or path");
    struct xfer x;
    memset(&x, 0, sizeof x);
    x.cl = cl;
    x.kind = XK_RAW;
    x.method = method;
    x.upload = upload;
    x.max_body = max_body;
    x.out = out;
    if (client_url(cl, path, &x.url, out))
        return out->status;
    if (json_body && !(x.body = strdup(json_body))) {
        xfer_free(&x);
        return client_fail(out, WAFER_E_NOMEM, "out of memory");
    }
    client_run(cl, &x, 1, 1);
    if (out->status == WAFER_E_CONNECT || out->status == WAFER_E_TIMEOUT) {
        char why[WAFER_ERR_MAX];
        memcpy(why, out->error, sizeof why);
        int k = snprintf(out->error, sizeof out->error, "cannot reach %.120s: ", x.url);
        if (k > 0 && (size_t)k < sizeof out->error)
            snprintf(out->error + k, sizeof out->error - (size_t)k, "%.*s", (int)(sizeof out->error - 1 - (size_t)k),
                     why);
    }
    xfer_free(&x);
    return out->status;
}

int wafer_get(struct wafer_client *c, const char *path, struct wafer_result *out)
{
    return client_request(c, "GET", path, NULL, NULL, 0, out);
}

int wafer_batch_generate(struct wafer_client *c, const char *const *prompts, int n, const struct wafer_params *params,
                         int concurrency, struct wafer_result *results)
{
    if (!c || !prompts || n < 0 || (n > 0 && !results))
        return WAFER_E_INVALID;
    if (concurrency <= 0)
        concurrency = 8;
    struct xfer *xs = calloc((size_t)(n ? n : 1), sizeof *xs);
    if (!xs) {
        for (int i = 0; i < n; i++) {
            client_result_init(&results[i]);
            client_fail(&results[i], WAFER_E_NOMEM, "out of memory");
        }
        return WAFER_E_BATCH;
    }
    for (int i = 0; i < n; i++) {
        struct xfer *x = &xs[i];
        client_result_init(&results[i]);
        x->cl = c;
        x->kind = XK_COMPLETION;
        x->out = &results[i];
        if (!prompts[i]) {
            xfer_finish(x, WAFER_E_INVALID, "no prompt");
            continue;
        }
        if (client_url(c, "/v1/completions", &x->url, x->out) ||
            !(x->body = client_body(c, params, prompts[i], NULL, 0, false, x->out))) {
            char why[WAFER_ERR_MAX]; /* xfer_finish writes out->error: not from itself */
            memcpy(why, x->out->error, sizeof why);
            xfer_finish(x, x->out->status, why);
        }
    }
    client_run(c, xs, n, concurrency);
    int rc = WAFER_OK;
    for (int i = 0; i < n; i++) {
        if (results[i].status != WAFER_OK)
            rc = WAFER_E_BATCH;
        xfer_free(&xs[i]);
    }
    free(xs);
    return rc;
}
