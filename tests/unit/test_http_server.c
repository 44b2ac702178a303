/* Tests for the HTTP server: a real server on an ephemeral loopback port, run in a thread, with a test handler
 * (echo, a held request that is answered only when the test says so, a timer-driven SSE stream, and a bulk
 * stream that honours backpressure), driven by plain blocking sockets from the test thread.
 *
 * The handler state lives on the server's I/O thread; the test thread only reads atomics and asks for
 * actions through atomics plus http_server_wake(). A timer thread wakes the server every 5 ms, like an
 * engine that produces tokens. */
#include "testutil.h"

#include "core/budget.h"
#include "core/err.h"
#include "core/http.h"

#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define OUT_BOUND (64 * 1024) /* max_output_buffer of the test server */
#define MAX_SLOTS 64

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the test handler (I/O thread) ----------------------------------------------------------------- */

struct stream {
    struct http_conn *c;
    long left;  /* chunks (timer stream) or bytes (bulk stream) still to send */
    int chunk;  /* bytes per chunk */
    bool bulk;  /* write as fast as backpressure allows, instead of one chunk per wake */
    int seq;
};

struct tctx {
    struct http_server *server;
    /* I/O thread only */
    struct http_conn *held[MAX_SLOTS];
    struct stream streams[MAX_SLOTS];
    char chunk_buf[16384];
    /* shared */
    atomic_int n_requests, n_close, n_writable, n_streams_done, release, violations;
    atomic_int live;               /* requests held or streaming right now (each must end by response or on_close) */
    atomic_int blocked;            /* a bulk stream stopped producing because pending reached the bound */
    atomic_llong t_close;          /* ms of the last on_close */
    atomic_llong max_pending;      /* highest http_conn_pending seen right after a bulk write */
    atomic_int n_errors, last_error; /* on_error calls and the last status */
    /* /keep: a held request whose conn is also held (http_conn_hold) past its close */
    struct http_conn *kept;
    const struct http_request *kept_req;
    atomic_int check_kept, kept_ok;
};

static struct stream *stream_find(struct tctx *t, struct http_conn *c)
{
    for (int i = 0; i < MAX_SLOTS; i++)
        if (t->streams[i].c == c)
            return &t->streams[i];
    return NULL;
}

static void bulk_pump(struct tctx *t, struct stream *st)
{
    while (st->left > 0) {
        if (http_conn_pending(st->c) >= OUT_BOUND) {
            atomic_store(&t->blocked, 1);
            return; /* wait for on_writable */
        }
        size_t n = st->left < st->chunk ? (size_t)st->left : (size_t)st->chunk;
        if (http_stream_write(st->c, t->chunk_buf, n) != 0)
            atomic_fetch_add(&t->violations, 1);
        st->left -= (long)n;
        long long p = (long long)http_conn_pending(st->c);
        if (p > atomic_load(&t->max_pending))
            atomic_store(&t->max_pending, p);
    }
    http_stream_end(st->c);
    st->c = NULL;
    atomic_fetch_add(&t->live, -1);
    atomic_fetch_add(&t->n_streams_done, 1);
}

static long query_long(const struct http_request *req, const char *key, long dflt)
{
    if (!req->query)
        return dflt;
    char q[256];
    snprintf(q, sizeof q, "%.*s", (int)req->query_len, req->query);
    char *p = strstr(q, key);
    return p ? strtol(p + strlen(key), NULL, 10) : dflt;
}

static void on_request(void *ctx, struct http_conn *c, const struct http_request *req)
{
    struct tctx *t = ctx;
    atomic_fetch_add(&t->n_requests, 1);
    /* One request in flight per connection: this conn must not be held or streaming already. */
    for (int i = 0; i < MAX_SLOTS; i++)
        if (t->held[i] == c || t->streams[i].c == c)
            atomic_fetch_add(&t->violations, 1);
    if (req->body[req->body_len] != 0)
        atomic_fetch_add(&t->violations, 1); /* body must be NUL-terminated */

    if (req->path_len == 5 && memcmp(req->path, "/echo", 5) == 0) {
        char out[4096];
        int n = snprintf(out, sizeof out, "%.*s %.*s%s%.*s body=%.*s", (int)req->method_len, req->method,
                         (int)req->path_len, req->path, req->query ? "?" : "", (int)req->query_len,
                         req->query ? req->query : "", (int)req->body_len, req->body);
        http_respond(c, 200, "text/plain", "X-Test: 1", out, (size_t)n);
    } else if (req->path_len == 5 && memcmp(req->path, "/hold", 5) == 0) {
        for (int i = 0; i < MAX_SLOTS; i++)
            if (!t->held[i]) {
                t->held[i] = c;
                atomic_fetch_add(&t->live, 1);
                http_conn_set_data(c, t);
                return;
            }
        http_respond(c, 503, "text/plain", NULL, "full", 4);
    } else if ((req->path_len == 7 && memcmp(req->path, "/stream", 7) == 0) ||
               (req->path_len == 4 && memcmp(req->path, "/big", 4) == 0)) {
        struct stream *st = stream_find(t, NULL);
        if (!st) {
            http_respond(c, 503, "text/plain", NULL, "full", 4);
            return;
        }
        st->bulk = req->path[1] == 'b';
        st->c = c;
        atomic_fetch_add(&t->live, 1);
        st->seq = 0;
        st->chunk = st->bulk ? (int)sizeof t->chunk_buf : (int)query_long(req, "size=", 16);
        st->left = st->bulk ? query_long(req, "bytes=", 1 << 20) : query_long(req, "n=", 3);
        http_stream_begin(c, 200, st->bulk ? "application/octet-stream" : "text/event-stream", NULL);
        if (st->bulk)
            bulk_pump(t, st);
    } else if (req->path_len == 5 && memcmp(req->path, "/take", 5) == 0) {
        /* an answer built elsewhere, handed over whole: bytes of a known pattern */
        long n = query_long(req, "bytes=", 1000);
        char *body = malloc((size_t)n);
        for (long i = 0; i < n; i++)
            body[i] = (char)('a' + i % 26);
        if (http_respond_take(c, 200, "application/octet-stream", NULL, body, (size_t)n) != 0)
            atomic_fetch_add(&t->violations, 1);
    } else if (req->path_len == 5 && memcmp(req->path, "/keep", 5) == 0) {
        /* like /hold, and the conn itself is held so that the request outlives a close */
        for (int i = 0; i < MAX_SLOTS; i++)
            if (!t->held[i]) {
                t->held[i] = c;
                atomic_fetch_add(&t->live, 1);
                http_conn_set_data(c, t);
                http_conn_hold(c);
                t->kept = c;
                t->kept_req = req;
                return;
            }
        http_respond(c, 503, "text/plain", NULL, "full", 4);
    } else if (req->path_len == 5 && memcmp(req->path, "/late", 5) == 0) {
        /* answers, then keeps the I/O thread busy (a proxy handling the rest of a turn's events) */
        long mode = query_long(req, "stream=", 0);
        if (mode) {
            http_stream_begin(c, 200, "text/event-stream", NULL);
            http_stream_write(c, "data: first\n\n", 14);
        } else {
            http_respond(c, 200, "text/plain", NULL, "early", 5);
        }
        sleep_ms((int)query_long(req, "ms=", 400));
        if (mode)
            http_stream_end(c);
    } else if (req->path_len == 6 && memcmp(req->path, "/abort", 6) == 0) {
        http_stream_begin(c, 200, "text/event-stream", NULL);
        http_stream_write(c, "data: partial\n\n", 15);
        if (http_stream_abort(c) != 0)
            atomic_fetch_add(&t->violations, 1);
    } else if (req->path_len == 7 && memcmp(req->path, "/misuse", 7) == 0) {
        /* Response functions in the wrong order are refused, not crashes. */
        if (http_stream_write(c, "x", 1) != ERR_INVALID_ARG || http_stream_end(c) != ERR_INVALID_ARG)
            atomic_fetch_add(&t->violations, 1);
        http_respond(c, 200, "text/plain", NULL, "ok", 2);
        if (http_respond(c, 200, "text/plain", NULL, "again", 5) != ERR_INVALID_ARG ||
            http_stream_begin(c, 200, "text/plain", NULL) != ERR_INVALID_ARG)
            atomic_fetch_add(&t->violations, 1);
    } else {
        http_respond(c, 404, "text/plain", NULL, "no such path", 12);
    }
}

static void on_wake(void *ctx)
{
    struct tctx *t = ctx;
    if (t->kept && atomic_exchange(&t->check_kept, 0)) {
        /* the conn closed a while ago: its request must still read back as sent (ASan would see a free) */
        static const char body[] = "the body a worker still reads";
        const struct http_request *r = t->kept_req;
        if (r->body_len == sizeof body - 1 && memcmp(r->body, body, r->body_len) == 0 && r->path_len == 5 &&
            memcmp(r->path, "/keep", 5) == 0)
            atomic_fetch_add(&t->kept_ok, 1);
        http_conn_release(t->kept);
        t->kept = NULL;
    }
    if (atomic_exchange(&t->release, 0)) {
        for (int i = 0; i < MAX_SLOTS; i++)
            if (t->held[i]) {
                if (http_conn_data(t->held[i]) != t)
                    atomic_fetch_add(&t->violations, 1);
                http_respond(t->held[i], 200, "text/plain", NULL, "released", 8);
                t->held[i] = NULL;
                atomic_fetch_add(&t->live, -1);
            }
    }
    for (int i = 0; i < MAX_SLOTS; i++) {
        struct stream *st = &t->streams[i];
        if (!st->c || st->bulk)
            continue;
        char ev[1024];
        int n = snprintf(ev, sizeof ev, "data: %d ", st->seq++);
        while (n < st->chunk - 2 && n < (int)sizeof ev - 3)
            ev[n++] = 'x';
        ev[n++] = '\n';
        ev[n++] = '\n';
        http_stream_write(st->c, ev, (size_t)n);
        if (--st->left <= 0) {
            http_stream_end(st->c);
            st->c = NULL;
            atomic_fetch_add(&t->live, -1);
            atomic_fetch_add(&t->n_streams_done, 1);
        }
    }
}

static void on_writable(void *ctx, struct http_conn *c)
{
    struct tctx *t = ctx;
    atomic_fetch_add(&t->n_writable, 1);
    struct stream *st = stream_find(t, c);
    if (st && st->bulk)
        bulk_pump(t, st);
}

static void on_error(void *ctx, const char *peer, int status, const char *message)
{
    struct tctx *t = ctx;
    if (!peer || !*peer || !message || !*message)
        atomic_fetch_add(&t->violations, 1);
    atomic_store(&t->last_error, status);
    atomic_fetch_add(&t->n_errors, 1);
}

static void on_close(void *ctx, struct http_conn *c)
{
    struct tctx *t = ctx;
    atomic_store(&t->t_close, now_ms());
    atomic_fetch_add(&t->n_close, 1);
    int found = 0;
    for (int i = 0; i < MAX_SLOTS; i++) {
        if (t->held[i] == c)
            t->held[i] = NULL, found++;
        if (t->streams[i].c == c)
            t->streams[i].c = NULL, found++;
    }
    /* on_close is only for requests whose response has not ended: the handler must know this conn. */
    if (found != 1)
        atomic_fetch_add(&t->violations, 1);
    atomic_fetch_add(&t->live, -1);
}

/* ---- the server under test ------------------------------------------------------------------------- */

struct srv {
    struct http_server *s;
    struct tctx t;
    pthread_t io, timer;
    atomic_int timer_run;
    int run_rc;
    atomic_int run_done;
    int port;
};

static void *srv_io_main(void *arg)
{
    struct srv *v = arg;
    v->run_rc = http_server_run(v->s);
    atomic_store(&v->run_done, 1);
    return NULL;
}

static void *srv_timer_main(void *arg)
{
    struct srv *v = arg;
    while (atomic_load(&v->timer_run)) {
        http_server_wake(v->s);
        sleep_ms(5);
    }
    return NULL;
}

static void srv_params(struct http_server_params *p)
{
    http_server_params_default(p);
    p->port = 0;
    p->max_connections = 64;
    p->max_header_bytes = 4096;
    p->max_body_bytes = 1 << 20;
    p->header_timeout_ms = 1000;
    p->body_timeout_ms = 1000;
    p->idle_timeout_ms = 5000;
    p->max_output_buffer = OUT_BOUND;
    p->on_request = on_request;
    p->on_close = on_close;
    p->on_wake = on_wake;
    p->on_writable = on_writable;
    p->on_error = on_error;
    p->ctx = NULL; /* set by srv_start_with */
}

static struct srv *srv_start_with(const struct http_server_params *p_in)
{
    struct srv *v = calloc(1, sizeof *v);
    struct http_server_params p = *p_in;
    p.ctx = &v->t;
    char err[ERR_MSG_MAX];
    v->s = http_server_create(&p, err);
    if (!v->s)
        fail_msg("http_server_create: %s", err);
    v->t.server = v->s;
    v->port = http_server_port(v->s);
    assert_true(v->port > 0);
    atomic_store(&v->timer_run, 1);
    pthread_create(&v->io, NULL, srv_io_main, v);
    pthread_create(&v->timer, NULL, srv_timer_main, v);
    return v;
}

static struct srv *srv_start(void)
{
    struct http_server_params p;
    srv_params(&p);
    return srv_start_with(&p);
}

static void srv_stop(struct srv *v)
{
    http_server_stop(v->s, 500);
    pthread_join(v->io, NULL);
    atomic_store(&v->timer_run, 0);
    pthread_join(v->timer, NULL);
    assert_int_equal(v->run_rc, 0);
    assert_int_equal(atomic_load(&v->t.violations), 0);
    http_server_destroy(v->s);
    free(v);
}

static int setup(void **state)
{
    *state = srv_start();
    return 0;
}

static int teardown(void **state)
{
    srv_stop(*state);
    return 0;
}

/* Polls an atomic counter until it reaches want or ms pass; returns the last value. */
static int wait_for(atomic_int *a, int want, int ms)
{
    int64_t end = now_ms() + ms;
    while (atomic_load(a) < want && now_ms() < end)
        sleep_ms(1);
    return atomic_load(a);
}

/* ---- a small blocking client ----------------------------------------------------------------------- */

struct cli {
    int fd;
    char buf[65536];
    size_t len;
};

static struct cli *cli_open(int port, int rcvbuf)
{
    struct cli *k = calloc(1, sizeof *k);
    k->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(k->fd >= 0);
    if (rcvbuf > 0)
        setsockopt(k->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(k->fd, (struct sockaddr *)&a, sizeof a) < 0)
        fail_msg("connect: %s", strerror(errno));
    int one = 1;
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return k;
}

static void cli_close(struct cli *k)
{
    if (k->fd >= 0)
        close(k->fd);
    free(k);
}

static void cli_send(struct cli *k, const char *data, size_t n)
{
    while (n > 0) {
        ssize_t w = send(k->fd, data, n, MSG_NOSIGNAL);
        if (w <= 0)
            fail_msg("send: %s", strerror(errno));
        data += w;
        n -= (size_t)w;
    }
}

static void cli_sends(struct cli *k, const char *s) { cli_send(k, s, strlen(s)); }

/* Reads more bytes into the buffer: >0 bytes, 0 on EOF (or reset), -1 on timeout. */
static int cli_fill(struct cli *k, int timeout_ms)
{
    if (k->len == sizeof k->buf)
        fail_msg("client buffer full");
    struct pollfd pfd = {.fd = k->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0)
        return -1;
    ssize_t n = recv(k->fd, k->buf + k->len, sizeof k->buf - k->len, 0);
    if (n < 0)
        return errno == ECONNRESET ? 0 : -1;
    k->len += (size_t)n;
    return (int)n;
}

static void cli_consume(struct cli *k, size_t n)
{
    memmove(k->buf, k->buf + n, k->len - n);
    k->len -= n;
}

/* Reads exactly n bytes (the caller copies them out of k->buf first). */
static void cli_need(struct cli *k, size_t n, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    while (k->len < n) {
        int left = (int)(end - now_ms());
        if (left <= 0 || cli_fill(k, left) <= 0)
            fail_msg("wanted %zu bytes, got %zu before timeout/EOF", n, k->len);
    }
}

/* True when the server closed the connection (EOF) within ms, with no further bytes. */
static bool cli_eof(struct cli *k, int ms)
{
    return k->len == 0 && cli_fill(k, ms) == 0;
}

struct resp {
    int status;
    char head[8192];
    char *body;
    size_t body_len;
};

static const char *resp_header(const struct resp *r, const char *name)
{
    static char val[1024];
    char pat[128];
    snprintf(pat, sizeof pat, "\r\n%s:", name);
    const char *p = strcasestr(r->head, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    size_t n = strcspn(p, "\r");
    snprintf(val, sizeof val, "%.*s", (int)n, p);
    return val;
}

/* Reads one response (Content-Length or chunked body, or until EOF); caller frees r->body. */
static void cli_response(struct cli *k, struct resp *r, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    char *hend;
    while (!(hend = memmem(k->buf, k->len, "\r\n\r\n", 4))) {
        int left = (int)(end - now_ms());
        if (left <= 0 || cli_fill(k, left) <= 0)
            fail_msg("no complete response head (have %zu bytes: %.*s)", k->len, (int)k->len, k->buf);
    }
    size_t hl = (size_t)(hend - k->buf) + 4;
    assert_true(hl < sizeof r->head);
    memcpy(r->head, k->buf, hl);
    r->head[hl] = 0;
    cli_consume(k, hl);
    assert_int_equal(sscanf(r->head, "HTTP/1.1 %d", &r->status), 1);
    r->body = NULL;
    r->body_len = 0;
    const char *te = resp_header(r, "Transfer-Encoding");
    if (te && strcmp(te, "chunked") == 0) {
        for (;;) {
            char *le;
            while (!(le = memmem(k->buf, k->len, "\r\n", 2)))
                if (cli_fill(k, (int)(end - now_ms())) <= 0)
                    fail_msg("chunk size line missing");
            size_t n = strtoul(k->buf, NULL, 16);
            size_t ll = (size_t)(le - k->buf) + 2;
            cli_need(k, ll + n + 2, (int)(end - now_ms()));
            assert_memory_equal(k->buf + ll + n, "\r\n", 2);
            r->body = realloc(r->body, r->body_len + n + 1);
            memcpy(r->body + r->body_len, k->buf + ll, n);
            r->body_len += n;
            r->body[r->body_len] = 0;
            cli_consume(k, ll + n + 2);
            if (n == 0)
                break;
        }
        return;
    }
    const char *cl = resp_header(r, "Content-Length");
    assert_non_null(cl);
    size_t n = strtoul(cl, NULL, 10);
    cli_need(k, n, (int)(end - now_ms()));
    r->body = malloc(n + 1);
    memcpy(r->body, k->buf, n);
    r->body[n] = 0;
    r->body_len = n;
    cli_consume(k, n);
}

static void get_ok(struct cli *k, const char *req, const char *want_body)
{
    struct resp r;
    cli_sends(k, req);
    cli_response(k, &r, 2000);
    assert_int_equal(r.status, 200);
    if (want_body)
        assert_string_equal(r.body, want_body);
    free(r.body);
}

/* Checks an error response from the layer: status, OpenAI-style JSON, then the connection closes. */
static void expect_json_error(struct cli *k, int status, const char *type, const char *code)
{
    struct resp r;
    cli_response(k, &r, 3000);
    assert_int_equal(r.status, status);
    assert_string_equal(resp_header(&r, "Content-Type"), "application/json");
    assert_string_equal(resp_header(&r, "Connection"), "close");
    json_error_t je;
    json_t *j = json_loadb(r.body, r.body_len, 0, &je);
    if (!j)
        fail_msg("error body is not JSON: %s (%s)", r.body, je.text);
    json_t *e = json_object_get(j, "error");
    assert_non_null(e);
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 10);
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    assert_string_equal(json_string_value(json_object_get(e, "code")), code);
    assert_true(json_is_null(json_object_get(e, "param")));
    json_decref(j);
    free(r.body);
    assert_true(cli_eof(k, 2000));
}

/* ---- tests ----------------------------------------------------------------------------------------- */

static void test_keep_alive_two_requests(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    struct resp r;
    cli_sends(k, "GET /echo?a=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_response(k, &r, 2000);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "GET /echo?a=1 body=");
    assert_string_equal(resp_header(&r, "Connection"), "keep-alive");
    assert_string_equal(resp_header(&r, "X-Test"), "1");
    assert_string_equal(resp_header(&r, "Content-Type"), "text/plain");
    const char *date = resp_header(&r, "Date");
    assert_non_null(date);
    assert_int_equal(strlen(date), 29); /* "Sun, 06 Nov 1994 08:49:37 GMT" */
    assert_string_equal(date + 25, " GMT");
    free(r.body);
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world");
    cli_response(k, &r, 2000);
    assert_string_equal(r.body, "POST /echo body=hello world");
    free(r.body);
    assert_int_equal(http_server_connections(v->s), 1); /* the same connection both times */
    assert_int_equal(atomic_load(&v->t.n_requests), 2);
    cli_close(k);
}

static void test_http10_closes(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    struct resp r;
    cli_sends(k, "GET /echo HTTP/1.0\r\n\r\n");
    cli_response(k, &r, 2000);
    assert_int_equal(r.status, 200);
    assert_string_equal(resp_header(&r, "Connection"), "close");
    free(r.body);
    assert_true(cli_eof(k, 2000));
    cli_close(k);
    /* A client that half-closes right after its request (printf ... | nc -N) still gets an answer. */
    k = cli_open(v->port, 0);
    cli_sends(k, "GET /echo?nc HTTP/1.0\r\n\r\n");
    shutdown(k->fd, SHUT_WR);
    cli_response(k, &r, 2000);
    assert_string_equal(r.body, "GET /echo?nc body=");
    free(r.body);
    assert_true(cli_eof(k, 2000));
    cli_close(k);
    /* ... unless the handler would answer later: then the request is cancelled through on_close. */
    k = cli_open(v->port, 0);
    cli_sends(k, "GET /hold HTTP/1.0\r\n\r\n");
    shutdown(k->fd, SHUT_WR);
    assert_true(cli_eof(k, 2000));
    assert_int_equal(wait_for(&v->t.n_close, 1, 1000), 1);
    assert_int_equal(atomic_load(&v->t.live), 0);
    cli_close(k);
}

static void test_pipelined_in_order(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    /* Three requests in one write; the first is held by the handler. */
    cli_sends(k, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"
                 "POST /echo?n=3 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    assert_int_equal(wait_for(&v->t.n_requests, 1, 2000), 1);
    sleep_ms(100);
    /* The next request is not parsed while one is in flight, and the extra bytes are not a disconnect. */
    assert_int_equal(atomic_load(&v->t.n_requests), 1);
    assert_int_equal(atomic_load(&v->t.n_close), 0);
    /* More pipelined bytes arriving while the request is held are kept too. */
    cli_sends(k, "GET /echo?n=4 HTTP/1.1\r\nHost: x\r\n\r\n");
    sleep_ms(20);
    assert_int_equal(atomic_load(&v->t.n_close), 0);
    atomic_store(&v->t.release, 1);
    http_server_wake(v->s);
    struct resp r;
    const char *want[] = {"released", "GET /echo?n=2 body=", "POST /echo?n=3 body=abc", "GET /echo?n=4 body="};
    for (int i = 0; i < 4; i++) {
        cli_response(k, &r, 2000);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, want[i]);
        free(r.body);
    }
    assert_int_equal(atomic_load(&v->t.n_requests), 4);
    cli_close(k);
}

static void test_expect_100_continue(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    const char *cont = "HTTP/1.1 100 Continue\r\n\r\n";
    cli_need(k, strlen(cont), 2000);
    assert_memory_equal(k->buf, cont, strlen(cont));
    cli_consume(k, strlen(cont));
    assert_int_equal(atomic_load(&v->t.n_requests), 0); /* not dispatched before the body */
    cli_sends(k, "hello");
    struct resp r;
    cli_response(k, &r, 2000);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST /echo body=hello");
    free(r.body);
    cli_close(k);
}

static void test_body_too_large_413(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    /* Answered from the headers alone: the body is never sent. */
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n");
    expect_json_error(k, 413, "invalid_request_error", "too_large");
    cli_close(k);
    /* With Expect: 100-continue the answer is 413 directly, without a 100 first. */
    k = cli_open(v->port, 0);
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\nExpect: 100-continue\r\n\r\n");
    cli_need(k, 12, 2000);
    assert_memory_equal(k->buf, "HTTP/1.1 413", 12);
    expect_json_error(k, 413, "invalid_request_error", "too_large");
    cli_close(k);
    /* A client that sends a (part of a) refused body still reads the answer, not a reset. */
    k = cli_open(v->port, 0);
    char *junk = malloc(200000);
    memset(junk, 'j', 200000);
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n");
    cli_send(k, junk, 200000);
    free(junk);
    expect_json_error(k, 413, "invalid_request_error", "too_large");
    cli_close(k);
    assert_int_equal(atomic_load(&v->t.n_requests), 0);
}

/* RFC 9112, section 3.2: an HTTP/1.1 request without a Host header, and any request with two, get 400 from
 * the layer (reported to on_error); an HTTP/1.0 request may leave Host out. */
static void test_host_header_400(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "GET /echo HTTP/1.1\r\nUser-Agent: t\r\n\r\n");
    expect_json_error(k, 400, "invalid_request_error", "format");
    cli_close(k);
    assert_int_equal(atomic_load(&v->t.last_error), 400);
    k = cli_open(v->port, 0);
    cli_sends(k, "GET /echo HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n");
    expect_json_error(k, 400, "invalid_request_error", "format");
    cli_close(k);
    k = cli_open(v->port, 0);
    cli_sends(k, "GET /echo HTTP/1.0\r\nHost: a\r\nHOST: a\r\n\r\n");
    expect_json_error(k, 400, "invalid_request_error", "format");
    cli_close(k);
    assert_int_equal(atomic_load(&v->t.n_requests), 0);
    assert_int_equal(atomic_load(&v->t.n_errors), 3);
    k = cli_open(v->port, 0);
    get_ok(k, "GET /echo HTTP/1.1\r\nhOsT: a\r\n\r\n", "GET /echo body=");
    cli_close(k);
}

/* A body built elsewhere is handed over whole and arrives intact, including past one write budget. */
static void test_respond_take(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    struct resp r;
    cli_sends(k, "GET /take?bytes=60000 HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_response(k, &r, 3000);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 60000);
    for (size_t i = 0; i < r.body_len; i++)
        if (r.body[i] != (char)('a' + i % 26))
            fail_msg("byte %zu is '%c'", i, r.body[i]);
    free(r.body);
    /* keep-alive goes on after it; a HEAD gets the length and no body (the body is freed, not leaked) */
    get_ok(k, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo body=");
    cli_sends(k, "HEAD /take?bytes=5000 HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_need(k, 12, 2000);
    char *hend;
    while (!(hend = memmem(k->buf, k->len, "\r\n\r\n", 4)))
        assert_true(cli_fill(k, 2000) > 0);
    assert_non_null(strstr(k->buf, "Content-Length: 5000"));
    cli_consume(k, (size_t)(hend - k->buf) + 4);
    get_ok(k, "GET /echo?after HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo?after body=");
    cli_close(k);
}

/* A response (and a stream's write) is on the wire when the handler's call returns, not at the end of the loop
 * turn: the handler below answers, then holds the I/O thread for 600 ms; the client has the answer long before
 * that. Keep-alive then goes on as usual. */
static void test_sends_before_the_turn_ends(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    struct resp r;
    int64_t t0 = now_ms();
    cli_sends(k, "GET /late?ms=600 HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_response(k, &r, 3000);
    int64_t took = now_ms() - t0;
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "early");
    free(r.body);
    if (took >= 400)
        fail_msg("the response arrived after %lld ms: it waited for the handler's turn to end", (long long)took);
    get_ok(k, "GET /echo?next HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo?next body=");
    /* a stream's first event likewise */
    t0 = now_ms();
    cli_sends(k, "GET /late?ms=600&stream=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    while (!memmem(k->buf, k->len, "data: first", 11))
        assert_true(cli_fill(k, 3000) > 0);
    took = now_ms() - t0;
    if (took >= 400)
        fail_msg("the first event arrived after %lld ms", (long long)took);
    while (!memmem(k->buf, k->len, "0\r\n\r\n", 5))
        assert_true(cli_fill(k, 3000) > 0);
    cli_close(k);
}

/* A held conn's request stays readable after the client left and on_close ran, until it is released. */
static void test_hold_after_close(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    static const char body[] = "the body a worker still reads";
    char req[256];
    snprintf(req, sizeof req, "POST /keep HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s", sizeof body - 1,
             body);
    cli_sends(k, req);
    assert_int_equal(wait_for(&v->t.live, 1, 2000), 1);
    cli_close(k);
    assert_int_equal(wait_for(&v->t.n_close, 1, 2000), 1);
    sleep_ms(30); /* several loop turns: a conn that was not held would be freed by now */
    atomic_store(&v->t.check_kept, 1);
    http_server_wake(v->s);
    assert_int_equal(wait_for(&v->t.kept_ok, 1, 2000), 1);
    /* released: the server goes on serving */
    k = cli_open(v->port, 0);
    get_ok(k, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo body=");
    cli_close(k);
}

/* Bodies in flight share one budget: a body that does not fit gets 503 with Retry-After before it is read,
 * and the budget comes back when the response that held it ends. */
static void test_body_budget_503(void **state)
{
    (void)state;
    static struct budget bodies;
    budget_init(&bodies, 1000);
    struct http_server_params p;
    srv_params(&p);
    p.body_budget = &bodies;
    struct srv *v = srv_start_with(&p);
    struct cli *a = cli_open(v->port, 0);
    cli_sends(a, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n"); /* body still to come */
    int64_t end = now_ms() + 2000;
    while (budget_used(&bodies) != 800 && now_ms() < end)
        sleep_ms(1);
    assert_int_equal(budget_used(&bodies), 800);
    struct cli *b = cli_open(v->port, 0);
    cli_sends(b, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n");
    struct resp r;
    cli_response(b, &r, 2000);
    assert_int_equal(r.status, 503);
    assert_string_equal(resp_header(&r, "Retry-After"), "1");
    free(r.body);
    cli_close(b);
    assert_int_equal(atomic_load(&v->t.last_error), 503);
    char *pad = malloc(800);
    memset(pad, 'p', 800);
    cli_send(a, pad, 800);
    free(pad);
    cli_response(a, &r, 2000);
    assert_int_equal(r.status, 200);
    free(r.body);
    end = now_ms() + 2000;
    while (budget_used(&bodies) != 0 && now_ms() < end)
        sleep_ms(1);
    assert_int_equal(budget_used(&bodies), 0);
    get_ok(a, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", "POST /echo body=abc");
    cli_close(a);
    srv_stop(v);
    assert_int_equal(budget_used(&bodies), 0);
}

static void test_headers_too_large_431(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    char big[6000];
    int n = snprintf(big, sizeof big, "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(big + n, 'a', 5000);
    strcpy(big + n + 5000, "\r\n\r\n");
    cli_sends(k, big);
    expect_json_error(k, 431, "invalid_request_error", "too_large");
    cli_close(k);
    /* Too many header fields, each small. */
    k = cli_open(v->port, 0);
    n = snprintf(big, sizeof big, "GET /echo HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 70; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "X-%d: %d\r\n", i, i);
    snprintf(big + n, sizeof big - (size_t)n, "\r\n");
    cli_sends(k, big);
    expect_json_error(k, 431, "invalid_request_error", "too_large");
    cli_close(k);
}

static void test_malformed_400(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "GET /echo HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n");
    expect_json_error(k, 400, "invalid_request_error", "format");
    cli_close(k);
    k = cli_open(v->port, 0);
    cli_sends(k, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"); /* a TLS hello: refused without a line end */
    expect_json_error(k, 400, "invalid_request_error", "format");
    cli_close(k);
    assert_int_equal(atomic_load(&v->t.n_requests), 0);
}

static void test_transfer_encoding_501(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    expect_json_error(k, 501, "invalid_request_error", "unsupported");
    cli_close(k);
}

static void test_slow_headers_408(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    int64_t t0 = now_ms();
    const char *line = "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    /* One byte every 200 ms: the header timeout (1 s) counts from the start, not from the last byte. */
    for (size_t i = 0; i < strlen(line); i++) {
        send(k->fd, line + i, 1, MSG_NOSIGNAL);
        struct pollfd pfd = {.fd = k->fd, .events = POLLIN};
        if (poll(&pfd, 1, 200) > 0)
            break;
    }
    int64_t waited = now_ms() - t0;
    expect_json_error(k, 408, "timeout_error", "timeout");
    if (waited < 900 || waited > 1600)
        fail_msg("408 after %lld ms, want about 1000", (long long)waited);
    cli_close(k);
    assert_int_equal(atomic_load(&v->t.n_requests), 0);
}

static void test_disconnect_held_request(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
    assert_int_equal(wait_for(&v->t.n_requests, 1, 2000), 1);
    sleep_ms(50);
    assert_int_equal(atomic_load(&v->t.n_close), 0);
    int64_t t0 = now_ms();
    cli_close(k);
    assert_int_equal(wait_for(&v->t.n_close, 1, 2000), 1);
    /* Event-driven, not found by a timer: the server's own timers are 1 s or more here, and 500 ms leaves room
     * for a vCPU that other tenants stall for a while. */
    long long dt = atomic_load(&v->t.t_close) - t0;
    if (dt > 500)
        fail_msg("on_close %lld ms after the client left, want < 500", dt);
    /* A client that shuts down only its sending side has left too. */
    k = cli_open(v->port, 0);
    cli_sends(k, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(wait_for(&v->t.n_requests, 2, 2000), 2);
    shutdown(k->fd, SHUT_WR);
    assert_int_equal(wait_for(&v->t.n_close, 2, 1000), 2);
    cli_close(k);
}

static void test_disconnect_during_stream(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "GET /stream?n=100000&size=64 HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_need(k, 200, 2000); /* head and a few events */
    assert_non_null(memmem(k->buf, k->len, "data: 0", 7));
    int64_t t0 = now_ms();
    cli_close(k);
    assert_int_equal(wait_for(&v->t.n_close, 1, 2000), 1);
    assert_true(atomic_load(&v->t.t_close) - t0 < 500); /* event-driven: see test_disconnect_held_request */
    assert_int_equal(atomic_load(&v->t.n_streams_done), 0);
}

static void test_sse_stream(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    struct resp r;
    cli_sends(k, "GET /stream?n=5&size=12 HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_response(k, &r, 3000);
    assert_int_equal(r.status, 200);
    assert_string_equal(resp_header(&r, "Content-Type"), "text/event-stream");
    assert_string_equal(resp_header(&r, "Cache-Control"), "no-cache");
    assert_string_equal(resp_header(&r, "Transfer-Encoding"), "chunked");
    assert_null(resp_header(&r, "Content-Length"));
    assert_string_equal(r.body, "data: 0 xx\n\ndata: 1 xx\n\ndata: 2 xx\n\ndata: 3 xx\n\ndata: 4 xx\n\n");
    free(r.body);
    get_ok(k, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo body="); /* keep-alive after the stream */
    cli_close(k);
}

static void test_max_connections_503(void **state)
{
    (void)state;
    struct http_server_params p;
    srv_params(&p);
    p.max_connections = 2;
    struct srv *v = srv_start_with(&p);
    struct cli *a = cli_open(v->port, 0), *b = cli_open(v->port, 0);
    get_ok(a, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    get_ok(b, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    assert_int_equal(http_server_connections(v->s), 2);
    struct cli *c = cli_open(v->port, 0);
    cli_sends(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_json_error(c, 503, "server_error", "unavailable");
    cli_close(c);
    cli_close(a);
    int64_t end = now_ms() + 2000;
    while (http_server_connections(v->s) > 1 && now_ms() < end)
        sleep_ms(1);
    c = cli_open(v->port, 0);
    get_ok(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo body=");
    cli_close(c);
    cli_close(b);
    srv_stop(v);
}

/* Counts the body bytes of a chunked response; the head must already have been consumed. */
static size_t cli_count_chunked(struct cli *k, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    size_t total = 0;
    for (;;) {
        char *le;
        while (!(le = memmem(k->buf, k->len, "\r\n", 2)))
            if (cli_fill(k, (int)(end - now_ms())) <= 0)
                fail_msg("chunk size line missing after %zu bytes", total);
        size_t n = strtoul(k->buf, NULL, 16);
        cli_consume(k, (size_t)(le - k->buf) + 2);
        size_t need = n + 2;
        while (need > 0) {
            if (k->len == 0 && cli_fill(k, (int)(end - now_ms())) <= 0)
                fail_msg("stream ended after %zu bytes", total);
            size_t take = k->len < need ? k->len : need;
            cli_consume(k, take);
            need -= take;
        }
        total += n;
        if (n == 0)
            return total;
    }
}

static void test_slow_reader_backpressure(void **state)
{
    struct srv *v = *state;
    const long total = 32L << 20;
    /* A tiny receive window and no reading: the kernel buffers fill, then the server's output buffer. */
    struct cli *slow = cli_open(v->port, 4096);
    char req[128];
    snprintf(req, sizeof req, "GET /big?bytes=%ld HTTP/1.1\r\nHost: x\r\n\r\n", total);
    cli_sends(slow, req);
    assert_int_equal(wait_for(&v->t.blocked, 1, 5000), 1);
    long long maxp = atomic_load(&v->t.max_pending);
    /* Pending reached the bound and the handler stopped there (one chunk of overshoot at most). */
    assert_true(maxp >= OUT_BOUND);
    assert_true(maxp <= OUT_BOUND + 16384 + 32);

    /* Another client is served while the first one is stalled. */
    int64_t t0 = now_ms();
    struct cli *fast = cli_open(v->port, 0);
    get_ok(fast, "GET /echo?other HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo?other body=");
    assert_true(now_ms() - t0 < 1000);
    cli_close(fast);
    assert_int_equal(atomic_load(&v->t.n_streams_done), 0);
    int writable_before = atomic_load(&v->t.n_writable);

    /* The reader drains: on_writable lets the handler finish the stream. */
    struct resp r;
    char *hend;
    while (!(hend = memmem(slow->buf, slow->len, "\r\n\r\n", 4)))
        assert_true(cli_fill(slow, 2000) > 0);
    size_t hl = (size_t)(hend - slow->buf) + 4;
    memcpy(r.head, slow->buf, hl);
    r.head[hl] = 0;
    cli_consume(slow, hl);
    assert_string_equal(resp_header(&r, "Transfer-Encoding"), "chunked");
    assert_int_equal(cli_count_chunked(slow, 8000), (size_t)total);
    assert_true(atomic_load(&v->t.n_writable) > writable_before);
    assert_int_equal(wait_for(&v->t.n_streams_done, 1, 1000), 1);
    assert_true(atomic_load(&v->t.max_pending) <= OUT_BOUND + 16384 + 32);
    assert_int_equal(atomic_load(&v->t.n_close), 0);
    cli_close(slow);
}

static void test_stop_drains_in_flight(void **state)
{
    (void)state;
    struct srv *v = srv_start();
    struct cli *k = cli_open(v->port, 0);
    struct cli *idle = cli_open(v->port, 0);
    get_ok(idle, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    cli_sends(k, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(wait_for(&v->t.n_requests, 2, 2000), 2);
    http_server_stop(v->s, 3000);
    sleep_ms(50);
    assert_int_equal(atomic_load(&v->run_done), 0); /* a request is in flight: still draining */
    assert_true(cli_eof(idle, 1000));              /* idle keep-alive connections are closed at once */
    cli_close(idle);
    /* No new connections once stopping. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)v->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_true(connect(fd, (struct sockaddr *)&a, sizeof a) < 0);
    close(fd);
    atomic_store(&v->t.release, 1);
    http_server_wake(v->s);
    struct resp r;
    cli_response(k, &r, 2000);
    assert_string_equal(r.body, "released");
    assert_string_equal(resp_header(&r, "Connection"), "close");
    free(r.body);
    int64_t end = now_ms() + 2000;
    while (!atomic_load(&v->run_done) && now_ms() < end)
        sleep_ms(1);
    assert_int_equal(atomic_load(&v->run_done), 1);
    assert_int_equal(atomic_load(&v->t.n_close), 0);
    cli_close(k);
    srv_stop(v);
}

static void test_stop_cuts_off_after_drain(void **state)
{
    (void)state;
    struct srv *v = srv_start();
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(wait_for(&v->t.n_requests, 1, 2000), 1);
    int64_t t0 = now_ms();
    http_server_stop(v->s, 200);
    pthread_join(v->io, NULL);
    int64_t dt = now_ms() - t0;
    assert_true(dt >= 150 && dt < 1000);
    assert_int_equal(v->run_rc, 0);
    assert_int_equal(atomic_load(&v->t.n_close), 1); /* the handler was told to drop the request */
    assert_true(cli_eof(k, 1000));
    cli_close(k);
    atomic_store(&v->timer_run, 0);
    pthread_join(v->timer, NULL);
    http_server_destroy(v->s);
    free(v);
}

static void test_head_and_misuse(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    char *hend;
    while (!(hend = memmem(k->buf, k->len, "\r\n\r\n", 4)))
        assert_true(cli_fill(k, 2000) > 0);
    struct resp r;
    size_t hl = (size_t)(hend - k->buf) + 4;
    memcpy(r.head, k->buf, hl);
    r.head[hl] = 0;
    cli_consume(k, hl);
    assert_string_equal(resp_header(&r, "Content-Length"), "16"); /* length of the GET body ... */
    assert_int_equal(cli_fill(k, 100), -1);                        /* ... which is not sent */
    get_ok(k, "GET /misuse HTTP/1.1\r\nHost: x\r\n\r\n", "ok");
    get_ok(k, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo body=");
    cli_close(k);
}

static void test_stream_abort(void **state)
{
    struct srv *v = *state;
    struct cli *k = cli_open(v->port, 0);
    cli_sends(k, "GET /abort HTTP/1.1\r\nHost: x\r\n\r\n");
    int64_t end = now_ms() + 2000;
    while (cli_fill(k, (int)(end - now_ms())) > 0) {
    }
    const char *chunk = "f\r\ndata: partial\n\n\r\n", *last = "\r\n0\r\n\r\n";
    assert_non_null(memmem(k->buf, k->len, chunk, strlen(chunk)));
    assert_null(memmem(k->buf, k->len, last, strlen(last))); /* no terminating chunk */
    assert_true(now_ms() < end);                                   /* closed by the server, not timed out */
    cli_close(k);
}

/* Body, idle and write-stall timeouts, with short limits. */
static void test_timeouts(void **state)
{
    (void)state;
    struct http_server_params p;
    srv_params(&p);
    p.body_timeout_ms = 400;
    p.idle_timeout_ms = 300;
    struct srv *v = srv_start_with(&p);

    struct cli *k = cli_open(v->port, 0);
    int64_t t0 = now_ms();
    cli_sends(k, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc");
    expect_json_error(k, 408, "timeout_error", "timeout");
    int64_t dt = now_ms() - t0;
    if (dt < 350 || dt > 1000)
        fail_msg("body timeout after %lld ms, want about 400", (long long)dt);
    cli_close(k);

    /* An idle keep-alive connection is closed quietly. */
    k = cli_open(v->port, 0);
    get_ok(k, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    t0 = now_ms();
    assert_true(cli_eof(k, 2000));
    dt = now_ms() - t0;
    if (dt < 250 || dt > 1000)
        fail_msg("idle close after %lld ms, want about 300", (long long)dt);
    cli_close(k);

    /* A reader that stops reading a stream for idle_timeout_ms is dropped, and the handler told. */
    k = cli_open(v->port, 4096);
    cli_sends(k, "GET /big?bytes=33554432 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(wait_for(&v->t.blocked, 1, 5000), 1);
    assert_int_equal(wait_for(&v->t.n_close, 1, 3000), 1);
    assert_int_equal(atomic_load(&v->t.n_streams_done), 0);
    cli_close(k);
    srv_stop(v);
}

/* Many clients at once, each doing random things, some of them rude. Afterwards every connection must be
 * gone, every abandoned held request must have been reported through on_close, and the server must still
 * answer. Under ASan this is the use-after-free hunt for the connection state machine. */
struct chaos_arg {
    struct srv *v;
    uint64_t seed;
    atomic_int *failures;
};

static void *chaos_client(void *p)
{
    struct chaos_arg *a = p;
    for (int it = 0; it < 25; it++) {
        int action = (int)(test_rand_u64(&a->seed) % 7);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->v->port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
            atomic_fetch_add(a->failures, 1);
            close(fd);
            continue;
        }
        char buf[8192];
        const char *req = NULL;
        switch (action) {
        case 0: req = "GET /echo?a HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"; break;
        case 1: req = "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"; break;
        case 2: req = "GET /stream?n=50&size=40 HTTP/1.1\r\nHost: x\r\n\r\n"; break;
        case 3: req = "GET /echo HTTP/1.1\r\nHost: x\r\nBroken\r\n\r\n"; break;
        case 4: req = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npartial"; break;
        case 5: req = "GET /stream?n=3&size=20 HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            break;
        default: req = "GET /ec"; break;
        }
        send(fd, req, strlen(req), MSG_NOSIGNAL);
        if (action == 0 || action == 3 || action == 5) {
            /* Read until the server closes or the responses are in. */
            size_t got = 0;
            for (;;) {
                ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
                if (n <= 0)
                    break;
                got += (size_t)n;
                buf[got] = 0;
                if (action == 0 && strstr(buf, "body=ok"))
                    break;
            }
            buf[got] = 0;
            if ((action == 0 && !strstr(buf, "body=ok")) || (action == 3 && !strstr(buf, " 400 ")) ||
                (action == 5 && !strstr(buf, "GET /echo body=")))
                atomic_fetch_add(a->failures, 1);
        } else if (action == 1) {
            /* Leave after a short pause: before or after the handler got it, both must be clean. */
            sleep_ms(5 + (int)(test_rand_u64(&a->seed) % 10));
        } else if (action == 2) {
            recv(fd, buf, 100 + test_rand_u64(&a->seed) % 400, 0); /* some of the stream, then leave */
        }
        if (test_rand_u64(&a->seed) & 1) {
            struct linger lg = {1, 0}; /* leave with a reset instead of a FIN */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(fd);
    }
    return NULL;
}

static void test_chaos_clients(void **state)
{
    struct srv *v = *state;
    enum { N = 12 };
    pthread_t th[N];
    struct chaos_arg args[N];
    atomic_int failures = 0;
    int close_before = atomic_load(&v->t.n_close);
    for (int i = 0; i < N; i++) {
        args[i] = (struct chaos_arg){v, 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1), &failures};
        pthread_create(&th[i], NULL, chaos_client, &args[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&failures), 0);
    /* Every request the handler still held when its client left was reported through on_close (nothing
     * releases held requests here), every connection was released, and on_close never came twice. */
    int64_t end = now_ms() + 3000;
    while (now_ms() < end && (http_server_connections(v->s) > 0 || atomic_load(&v->t.live) > 0))
        sleep_ms(5);
    assert_int_equal(http_server_connections(v->s), 0);
    assert_int_equal(atomic_load(&v->t.live), 0);
    assert_true(atomic_load(&v->t.n_close) > close_before); /* the rude clients did get noticed */
    assert_int_equal(atomic_load(&v->t.violations), 0);
    struct cli *k = cli_open(v->port, 0);
    get_ok(k, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo body=");
    cli_close(k);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* Out of file descriptors: accept fails with EMFILE while the connection waits in the backlog. The loop must
 * not spin on the ever-readable listening socket, and must pick the connection up once fds are back. */
static void test_accept_emfile(void **state)
{
    struct srv *v = *state;
    struct rlimit old, low;
    getrlimit(RLIMIT_NOFILE, &old);
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* the lowest free fd: everything below is in use */
    assert_true(fd >= 0);
    low = old;
    low.rlim_cur = (rlim_t)fd + 1; /* no fd can be created beyond this one */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)v->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    double cpu0 = cpu_seconds();
    sleep_ms(300);
    double cpu = cpu_seconds() - cpu0;
    setrlimit(RLIMIT_NOFILE, &old);
    assert_int_equal(rc, 0);
    if (cpu > 0.15)
        fail_msg("%.0f ms of CPU in 300 ms while accept fails: the loop spins", cpu * 1000);
    assert_int_equal(http_server_connections(v->s), 0);
    struct cli *k = calloc(1, sizeof *k);
    k->fd = fd;
    get_ok(k, "GET /echo?late HTTP/1.1\r\nHost: x\r\n\r\n", "GET /echo?late body=");
    cli_close(k);
}

/* Watchers of the handler's own fds (http_server_watch_ctl): two pipes turn readable together, so both come
 * out of one epoll_wait; whichever runs first removes both and poisons the other, which must then get no call
 * from that batch (a proxy frees an upstream connection's watcher as soon as it is removed). */
struct tw {
    struct http_watch hw;
    int fd;
    struct tw *other;
    struct http_server *s;
    atomic_int *calls;
    bool gone;
};

static void tw_fn(struct http_watch *hw, uint32_t events)
{
    struct tw *w = (struct tw *)hw;
    atomic_fetch_add(w->calls, 1);
    if (w->gone)
        atomic_fetch_add(w->calls, 100); /* called after its removal */
    http_server_watch_ctl(w->s, EPOLL_CTL_DEL, w->other->fd, 0, &w->other->hw);
    w->other->gone = true;
    http_server_watch_ctl(w->s, EPOLL_CTL_DEL, w->fd, 0, &w->hw);
    w->gone = true;
    http_server_stop(w->s, 0);
}

static void test_watch_removed_mid_batch(void **state)
{
    struct http_server_params p;
    srv_params(&p);
    char err[ERR_MSG_MAX];
    struct http_server *s = http_server_create(&p, err);
    assert_non_null(s);
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    atomic_int calls = 0;
    struct tw wa = {.hw.fn = tw_fn, .fd = a[0], .s = s, .calls = &calls};
    struct tw wb = {.hw.fn = tw_fn, .fd = b[0], .s = s, .calls = &calls};
    wa.other = &wb;
    wb.other = &wa;
    assert_int_equal(http_server_watch_ctl(s, EPOLL_CTL_ADD, a[0], EPOLLIN, &wa.hw), 0);
    assert_int_equal(http_server_watch_ctl(s, EPOLL_CTL_ADD, b[0], EPOLLIN, &wb.hw), 0);
    assert_int_equal(http_server_watch_ctl(s, EPOLL_CTL_ADD, a[0], EPOLLIN, &wa.hw), ERR_IO); /* twice */
    assert_int_equal(write(a[1], "x", 1), 1);
    assert_int_equal(write(b[1], "x", 1), 1);
    assert_int_equal(http_server_run(s), 0); /* both ready before the first epoll_wait */
    assert_int_equal(atomic_load(&calls), 1);
    http_server_destroy(s);
    for (int i = 0; i < 2; i++)
        close(a[i]), close(b[i]);
}

static void test_create_errors(void **state)
{
    struct srv *v = *state;
    struct http_server_params p;
    srv_params(&p);
    char err[ERR_MSG_MAX];
    p.port = v->port; /* in use */
    assert_null(http_server_create(&p, err));
    assert_non_null(strstr(err, "cannot listen"));
    assert_non_null(strstr(err, "choose another port"));
    p.port = 0;
    p.host = "no.such.host.invalid";
    assert_null(http_server_create(&p, err));
    assert_non_null(strstr(err, "no.such.host.invalid"));
    p.host = NULL;
    p.on_request = NULL;
    assert_null(http_server_create(&p, err));
    assert_non_null(strstr(err, "on_request"));
}

int main(void)
{
    /* SIGPIPE keeps its default action (terminate): a server write to a closed socket without MSG_NOSIGNAL
     * would kill this test. */
    signal(SIGPIPE, SIG_DFL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_keep_alive_two_requests, setup, teardown),
        cmocka_unit_test(test_watch_removed_mid_batch),
        cmocka_unit_test_setup_teardown(test_http10_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expect_100_continue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large_413, setup, teardown),
        cmocka_unit_test_setup_teardown(test_headers_too_large_431, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_400, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_header_400, setup, teardown),
        cmocka_unit_test_setup_teardown(test_respond_take, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sends_before_the_turn_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hold_after_close, setup, teardown),
        cmocka_unit_test(test_body_budget_503),
        cmocka_unit_test_setup_teardown(test_transfer_encoding_501, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_headers_408, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_held_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_during_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sse_stream, setup, teardown),
        cmocka_unit_test(test_max_connections_503),
        cmocka_unit_test_setup_teardown(test_slow_reader_backpressure, setup, teardown),
        cmocka_unit_test(test_stop_drains_in_flight),
        cmocka_unit_test(test_stop_cuts_off_after_drain),
        cmocka_unit_test_setup_teardown(test_head_and_misuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_abort, setup, teardown),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test_setup_teardown(test_chaos_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accept_emfile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
