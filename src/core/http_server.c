/*
 * http_server: the I/O thread. One epoll loop owns the listening socket, an eventfd (wake-ups from other
 * threads) and every client connection; nothing here blocks and nothing here is touched by another thread
 * except through http_server_wake()/http_server_stop() (an atomic flag plus an eventfd write, both
 * async-signal-safe).
 *
 * A connection is a small state machine:
 *
 *   READ_HEAD --headers complete--> READ_BODY --body complete--> HANDLER --respond/stream_end--> FLUSH
 *       ^                                                                                          |
 *       +--------------------- keep-alive: next (maybe already buffered) request -----------------+
 *                                                                        close: --> LINGER --> closed
 *
 * Why it is shaped this way:
 *   - Disconnects are seen in every phase. EPOLLRDHUP (and EPOLLIN while there is room to buffer) stays
 *     armed while the handler owns the request (HANDLER), unlike servers that stop reading while a request
 *     is pending. A read of 0 bytes, EPOLLRDHUP, EPOLLHUP or EPOLLERR in HANDLER means the client left:
 *     on_close tells the handler to cancel the work and the connection is freed. Bytes that arrive in that
 *     phase are a pipelined next request, kept in the read buffer (up to HTTP_PIPELINE_SLACK, then EPOLLIN
 *     is dropped but EPOLLRDHUP stays, so a hang-up is still noticed). A request that was complete before
 *     the FIN is still dispatched (a half-closing `printf ... | nc -N` gets an immediate answer), but a
 *     handler that would answer later gets on_close at once: a half-closed client counts as gone.
 *   - One request in flight per connection: the next pipelined request is parsed only after the previous
 *     response was handed over and written out. That keeps responses in order without a queue, and bounds
 *     what a pipelining client can make us buffer.
 *   - Zero-copy requests: header and body pointers point into the connection's read buffer, which is never
 *     reallocated while the handler owns the request (its size is reserved before on_request; the byte after
 *     the body is a NUL gap so the body is a C string and later pipelined bytes cannot overwrite it).
 *   - A handler's call never moves the connection on: http_respond/http_stream_* append to the
 *     connection's output buffer and put the connection on the "dirty" list; at the end of each loop turn the
 *     dirty connections are flushed (the response's end, keep-alive, the next pipelined request, errors).
 *     Handlers therefore never see re-entrant callbacks, and a connection is only freed at the end of a turn
 *     (the "graveyard"), so no event in the current batch can point at freed memory. The bytes themselves
 *     go out at once, though: a complete response or a stream write is sent before the call returns (as far
 *     as the socket takes it, within the turn's budget), so a response does not wait for the rest of the
 *     turn's events (a proxy answering many upstream replies in one turn: measured in docs/route.md).
 *   - Fairness (in the spirit of redis's ae/networking): each connection reads and writes at most
 *     HTTP_IO_BUDGET bytes per loop turn; what is left waits for the next turn (level-triggered EPOLLOUT
 *     stays armed while output is pending), so one fast stream cannot starve the others, and at most one new
 *     request per connection is started per turn.
 *   - Backpressure: http_conn_pending() tells a streaming handler how much is queued; once it reaches
 *     max_output_buffer the handler should stop producing, and on_writable fires when the buffer drained
 *     below half of that bound.
 *   - Timeouts need no timer per connection: each state has one deadline computed from a timestamp, and the
 *     loop scans the connections only when the earliest known deadline is due (s->next_timer), using the
 *     epoll_wait timeout to sleep until then. Header timeout counts from accept (or from the first byte of a
 *     keep-alive request), so a client trickling one byte at a time cannot hold a connection.
 *   - Errors the layer answers itself (400, 408, 413, 431, 501, 503) carry an OpenAI-style JSON body and
 *     close the connection: after them the request framing cannot be trusted. Closing is a "lingering"
 *     close (shutdown the write side, discard input for up to HTTP_LINGER_MS) so that a client still sending
 *     a body it was refused reads our answer instead of a connection reset.
 *   - SIGPIPE never fires: every socket write is send(..., MSG_NOSIGNAL).
 *   - Memory: a request body is counted against the shared body_budget from its header block until its
 *     response ends (503 with Retry-After when it does not fit, before a byte of it is buffered). A handler
 *     that reads the request on another thread holds the conn (http_conn_hold): a held conn that closes is
 *     unlinked and its fd closed at once, but its memory waits on s->held until released. A large answer
 *     built elsewhere is handed over whole (http_respond_take) and written from that buffer, not copied.
 *   - Host: HTTP/1.1 requests without exactly one Host header, and any request with two, are refused with
 *     400 (RFC 9112, section 3.2); the parser stays a pure syntax check, the policy is applied here.
 */
#include "core/http.h"

#include "core/budget.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HTTP_IO_BUDGET (64 * 1024)        /* bytes read or written per connection per loop turn */
#define HTTP_PIPELINE_SLACK (16 * 1024)   /* bytes of a next request buffered while one is in flight */
#define HTTP_LINGER_MS 1000               /* lingering close: discard input this long at most */
#define HTTP_MAX_EVENTS 256
#define HTTP_MAX_ACCEPTS_PER_TURN 64
#define HTTP_MAX_REJECTING 64             /* connections past max_connections being answered 503 */
#define HTTP_RBUF_INITIAL 4096
#define HTTP_RBUF_KEEP (64 * 1024)        /* read buffers above this are shrunk between requests */
#define HTTP_WBUF_KEEP (256 * 1024)       /* output buffers above this are freed once empty */
#define HTTP_ACCEPT_PAUSE_MS 100          /* out of file descriptors: retry accepting after this */
#define HTTP_NO_DEADLINE INT64_MAX

enum conn_state {
    CONN_READ_HEAD, /* waiting for, or reading, a request's header block */
    CONN_READ_BODY, /* reading Content-Length body bytes */
    CONN_HANDLER,   /* on_request called; the handler owns the request until the response ends */
    CONN_FLUSH,     /* response complete; writing it out */
    CONN_LINGER,    /* write side shut down; discarding input until EOF or the linger deadline */
    CONN_CLOSING,   /* on_close running: the handler may still read its data, but not respond */
};

struct http_conn {
    struct http_server *s;
    int fd;
    enum conn_state state;
    bool closed;        /* fd closed; freed at the end of the loop turn */
    bool rejected;      /* past max_connections: answered 503, not counted in n_conns */
    bool close_after;   /* close once the current response is written */
    bool peer_eof;      /* the peer shut down its side */
    bool idle_wait;     /* READ_HEAD between keep-alive requests, no byte of the next one yet */
    bool streaming;     /* http_stream_begin was called */
    bool chunked;       /* the stream uses chunked encoding (HTTP/1.1); else it ends with a close */
    bool head_only;     /* HEAD request: send headers, drop body bytes */
    bool wait_writable; /* pending reached max_output_buffer: on_writable is due below half of it */
    bool in_dirty;
    uint32_t events;    /* currently registered epoll events */

    char *rbuf;         /* request bytes; [0, req_end) is the current request while it is in flight */
    size_t rlen, rcap;
    size_t scanned;     /* READ_HEAD: bytes the parser has already seen (it runs again only on a new LF) */
    size_t head_len;    /* header block length of the current request */
    size_t body_len;    /* Content-Length of the current request */
    size_t req_end;     /* HANDLER/FLUSH: request bytes + 1 (the NUL gap after the body) */

    char *wbuf;         /* output not yet written: [woff, wlen) */
    size_t woff, wlen, wcap;
    char *obody;        /* a taken response body (http_respond_take), sent after wbuf: [ooff, olen) */
    size_t ooff, olen;
    int64_t body_taken; /* bytes of s->p.body_budget this request holds */
    int holds;          /* http_conn_hold count: a closed conn is freed only once it drops to 0 */

    int64_t t_phase;      /* when the current timed phase started (accept, first byte, body, linger) */
    int64_t t_last_write; /* last write progress (or when output became pending) */
    unsigned served;      /* responses completed on this connection */

    struct http_request req;
    void *data;
    char peer[64];

    struct http_conn *prev, *next;             /* s->conns */
    struct http_conn *dirty_prev, *dirty_next; /* s->dirty_head */
    struct http_conn *grave_next;              /* s->graveyard, then s->held while holds > 0 */
};

struct http_server {
    struct http_server_params p;
    char host[256];
    int listen_fd, epoll_fd, event_fd;
    int port;
    struct http_conn *conns;
    atomic_int n_conns;
    int n_rejecting;
    struct http_conn *dirty_head, *dirty_tail;
    struct http_conn *graveyard;
    struct http_conn *held; /* closed but still held (http_conn_hold): freed once released */
    atomic_int stop_requested;
    atomic_int stop_drain_ms;
    atomic_int wake_pending;
    bool stopping;
    int64_t drain_deadline;
    int64_t next_timer;    /* no connection deadline falls before this */
    int64_t accept_resume; /* accepting paused (EMFILE) until then; 0 when not paused */
    char listen_tag, event_tag; /* addresses used as epoll tags (compared first: they may be odd); a struct
                                 * http_watch's tag is its address with bit 0 set */
    struct epoll_event evs[HTTP_MAX_EVENTS]; /* the batch being handled: evs[ev_i] now, up to ev_n */
    int ev_i, ev_n;
    time_t date_t;              /* second for which date[] was formatted */
    char date[40];              /* IMF-fixdate for the Date header */
};

static int64_t http_now_ms(void) { return clock_now_ns() / 1000000; }

static size_t conn_pending(const struct http_conn *c) { return c->wlen - c->woff + c->olen - c->ooff; }

/* The Date header value (RFC 9110 IMF-fixdate), formatted once per second, without the locale. */
static const char *server_date(struct http_server *s)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = time(NULL);
    if (t != s->date_t || !s->date[0]) {
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(s->date, sizeof s->date, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7],
                 tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        s->date_t = t;
    }
    return s->date;
}

/* ---- lists ---------------------------------------------------------------------------------------- */

static void conn_mark_dirty(struct http_conn *c)
{
    struct http_server *s = c->s;
    if (c->in_dirty || c->closed)
        return;
    c->in_dirty = true;
    c->dirty_next = NULL;
    c->dirty_prev = s->dirty_tail;
    if (s->dirty_tail)
        s->dirty_tail->dirty_next = c;
    else
        s->dirty_head = c;
    s->dirty_tail = c;
}

static void conn_unmark_dirty(struct http_conn *c)
{
    struct http_server *s = c->s;
    if (!c->in_dirty)
        return;
    if (c->dirty_prev)
        c->dirty_prev->dirty_next = c->dirty_next;
    else
        s->dirty_head = c->dirty_next;
    if (c->dirty_next)
        c->dirty_next->dirty_prev = c->dirty_prev;
    else
        s->dirty_tail = c->dirty_prev;
    c->dirty_prev = c->dirty_next = NULL;
    c->in_dirty = false;
}

/* ---- timers --------------------------------------------------------------------------------------- */

static int64_t conn_deadline(const struct http_conn *c)
{
    const struct http_server_params *p = &c->s->p;
    switch (c->state) {
    case CONN_READ_HEAD:
        return c->t_phase + (c->idle_wait ? p->idle_timeout_ms : p->header_timeout_ms);
    case CONN_READ_BODY:
        return c->t_phase + p->body_timeout_ms;
    case CONN_HANDLER:
        /* The handler may take as long as it likes; only a reader that stopped reading is timed. */
        return conn_pending(c) ? c->t_last_write + p->idle_timeout_ms : HTTP_NO_DEADLINE;
    case CONN_FLUSH:
        return c->t_last_write + p->idle_timeout_ms;
    case CONN_LINGER:
        return c->t_phase + HTTP_LINGER_MS;
    case CONN_CLOSING:
        break;
    }
    return HTTP_NO_DEADLINE;
}

/* Called whenever a connection's deadline may have moved earlier than the server's next scan. */
static void conn_arm_timer(struct http_conn *c)
{
    int64_t d = conn_deadline(c);
    if (d < c->s->next_timer)
        c->s->next_timer = d;
}

/* ---- buffers -------------------------------------------------------------------------------------- */

static int http_buf_reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : HTTP_RBUF_INITIAL;
    while (n < need)
        n = n > SIZE_MAX / 2 ? need : n * 2;
    char *b = realloc(*buf, n);
    if (!b)
        return ERR_NOMEM;
    *buf = b;
    *cap = n;
    return 0;
}

static int conn_out(struct http_conn *c, const void *data, size_t len)
{
    if (len == 0)
        return 0;
    if (conn_pending(c) == 0) {
        c->woff = c->wlen = 0;
        c->t_last_write = http_now_ms(); /* the write-stall clock starts when output becomes pending */
    } else if (c->woff == c->wlen) {
        c->woff = c->wlen = 0;
    } else if (c->woff > 0 && c->wlen + len > c->wcap) {
        memmove(c->wbuf, c->wbuf + c->woff, c->wlen - c->woff);
        c->wlen -= c->woff;
        c->woff = 0;
    }
    if (http_buf_reserve(&c->wbuf, &c->wcap, c->wlen + len) < 0)
        return ERR_NOMEM;
    memcpy(c->wbuf + c->wlen, data, len);
    c->wlen += len;
    if (conn_pending(c) >= c->s->p.max_output_buffer)
        c->wait_writable = true;
    conn_mark_dirty(c);
    conn_arm_timer(c);
    return 0;
}

static void conn_send_early(struct http_conn *c);
static int conn_outf(struct http_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int conn_outf(struct http_conn *c, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return ERR_INTERNAL;
    if ((size_t)n < sizeof small)
        return conn_out(c, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = conn_out(c, big, (size_t)n);
    free(big);
    return rc;
}

/* ---- epoll registration --------------------------------------------------------------------------- */

/* How many bytes may be read into rbuf now (growing it where the state allows). */
static size_t conn_read_room(struct http_conn *c, bool grow)
{
    const struct http_server_params *p = &c->s->p;
    switch (c->state) {
    case CONN_READ_HEAD: {
        /* One byte past the limit is enough to know the header block is too large. */
        size_t limit = p->max_header_bytes + 1;
        if (c->rlen >= limit)
            return 0;
        if (c->rcap - c->rlen < 1024 && grow)
            if (http_buf_reserve(&c->rbuf, &c->rcap, c->rlen + 1024 < limit ? c->rlen + 1024 : limit) < 0)
                return 0;
        return c->rcap > c->rlen ? c->rcap - c->rlen : 0;
    }
    case CONN_READ_BODY:
        /* Reserved at the end of the header block: body, the NUL gap, and pipelining slack. */
        return c->rcap - 1 > c->rlen ? c->rcap - 1 - c->rlen : 0;
    case CONN_HANDLER:
    case CONN_FLUSH: {
        /* The buffer must not move while the handler holds pointers into it. */
        size_t lim = c->req_end + HTTP_PIPELINE_SLACK;
        if (lim > c->rcap)
            lim = c->rcap;
        return lim > c->rlen ? lim - c->rlen : 0;
    }
    case CONN_LINGER:
        return 1;
    case CONN_CLOSING:
        break;
    }
    return 0;
}

static void conn_update_events(struct http_conn *c)
{
    if (c->closed)
        return;
    uint32_t ev = 0;
    if (!c->peer_eof) {
        ev |= EPOLLRDHUP;
        if (conn_read_room(c, false) > 0 || c->state == CONN_READ_HEAD)
            ev |= EPOLLIN;
    }
    if (conn_pending(c) > 0)
        ev |= EPOLLOUT;
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->s->epoll_fd, EPOLL_CTL_MOD, c->fd, &e) < 0)
        log_warn("http: epoll_ctl(MOD) for %s failed: %s", c->peer, strerror(errno));
    else
        c->events = ev;
}

/* ---- closing -------------------------------------------------------------------------------------- */

static void conn_close(struct http_conn *c)
{
    struct http_server *s = c->s;
    if (c->closed)
        return;
    c->closed = true;
    conn_unmark_dirty(c);
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->rejected)
        s->n_rejecting--;
    else
        atomic_fetch_sub(&s->n_conns, 1);
    c->grave_next = s->graveyard;
    s->graveyard = c;
}

/* Closes a connection because of the peer or an error: a handler that owns a request is told first. */
static void conn_abort(struct http_conn *c, const char *why)
{
    struct http_server *s = c->s;
    if (c->closed)
        return;
    if (c->state == CONN_HANDLER) {
        log_debug("http: %s: %s while its request was in flight", c->peer, why);
        c->state = CONN_CLOSING;
        if (s->p.on_close)
            s->p.on_close(s->p.ctx, c);
    }
    conn_close(c);
}

/* The request's body is no longer needed (response done, or the conn is freed): its budget goes back. */
static void conn_give_body(struct http_conn *c)
{
    if (c->body_taken && c->s->p.body_budget)
        budget_give(c->s->p.body_budget, c->body_taken);
    c->body_taken = 0;
}

static void conn_free(struct http_conn *c)
{
    conn_give_body(c);
    free(c->rbuf);
    free(c->wbuf);
    free(c->obody);
    free(c);
}

/* Frees the connections closed this turn, except those still held (they wait on s->held), and the held ones
 * released since. */
static void server_free_graveyard(struct http_server *s)
{
    for (struct http_conn **pp = &s->held; *pp;) {
        struct http_conn *c = *pp;
        if (c->holds > 0) {
            pp = &c->grave_next;
            continue;
        }
        *pp = c->grave_next;
        conn_free(c);
    }
    while (s->graveyard) {
        struct http_conn *c = s->graveyard;
        s->graveyard = c->grave_next;
        if (c->holds > 0) {
            c->grave_next = s->held;
            s->held = c;
            continue;
        }
        conn_free(c);
    }
}

/* After the last byte of a response that closes the connection: half-close and drain input for a while,
 * so that the peer reads our answer rather than a reset caused by its unread body. */
static void conn_start_linger(struct http_conn *c)
{
    if (c->peer_eof) {
        conn_close(c);
        return;
    }
    shutdown(c->fd, SHUT_WR);
    c->state = CONN_LINGER;
    c->t_phase = http_now_ms();
    c->rlen = 0;
    conn_arm_timer(c);
    conn_update_events(c);
}

/* ---- responses ------------------------------------------------------------------------------------ */

/* Escapes text for a JSON string (bytes outside printable ASCII become '?'; our messages are ASCII). */
static void http_json_escape(const char *in, char *out, size_t out_size)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 7 < out_size; p++) {
        if (*p == '"' || *p == '\\') {
            out[o++] = '\\';
            out[o++] = (char)*p;
        } else if (*p < 0x20 || *p >= 0x7f) {
            out[o++] = '?';
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = 0;
}

/* An error answered by the layer itself (before or instead of the handler): JSON body, then close. */
static void conn_error(struct http_conn *c, int status, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_error(struct http_conn *c, int status, int code, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX], esc[ERR_MSG_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    http_json_escape(msg, esc, sizeof esc);
    log_debug("http: %s: %d %s", c->peer, status, msg);
    if (c->s->p.on_error)
        c->s->p.on_error(c->s->p.ctx, c->peer, status, msg);
    char body[ERR_MSG_MAX + 256];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}", esc,
                     err_openai_type(code), err_name(code));
    if (n < 0 || (size_t)n >= sizeof body)
        n = 0;
    c->close_after = true;
    c->state = CONN_FLUSH;
    if (conn_outf(c,
                  "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                  "%sConnection: close\r\n\r\n",
                  status, http_status_text(status), server_date(c->s), n,
                  status == 503 ? "Retry-After: 1\r\n" : "") < 0 ||
        conn_out(c, body, (size_t)n) < 0) {
        conn_close(c);
        return;
    }
    conn_update_events(c);
}

static int conn_check_owned(struct http_conn *c, bool want_streaming, const char *fn)
{
    if (!c || c->closed || c->state != CONN_HANDLER || c->streaming != want_streaming) {
        log_error("http: %s called on a connection whose response is %s", fn,
                  !c || c->closed || c->state != CONN_HANDLER ? "not in flight"
                  : want_streaming                            ? "not streaming"
                                                              : "already streaming");
        return ERR_INVALID_ARG;
    }
    return 0;
}

/* Status line, Content-Type, Connection and the handler's extra headers (without the final CRLF). */
static int conn_out_head(struct http_conn *c, int status, const char *content_type, const char *headers)
{
    if (c->s->stopping)
        c->close_after = true;
    int rc = conn_outf(c, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status, http_status_text(status), server_date(c->s));
    if (rc == 0 && content_type && *content_type)
        rc = conn_outf(c, "Content-Type: %s\r\n", content_type);
    if (rc == 0)
        rc = conn_outf(c, "Connection: %s\r\n", c->close_after ? "close" : "keep-alive");
    if (rc == 0 && headers && *headers) {
        size_t n = strlen(headers);
        rc = conn_out(c, headers, n);
        if (rc == 0 && (n < 2 || headers[n - 2] != '\r' || headers[n - 1] != '\n'))
            rc = conn_out(c, "\r\n", 2); /* a missing final CRLF would swallow the next header line */
    }
    return rc;
}

int http_respond(struct http_conn *c, int status, const char *content_type, const char *headers,
                 const char *body, size_t body_len)
{
    int rc = conn_check_owned(c, false, "http_respond");
    if (rc < 0)
        return rc;
    if (!body)
        body_len = 0;
    bool no_body = status == 204 || status == 304 || (status >= 100 && status < 200);
    rc = conn_out_head(c, status, content_type, headers);
    if (rc == 0 && !no_body)
        rc = conn_outf(c, "Content-Length: %zu\r\n", body_len);
    if (rc == 0)
        rc = conn_out(c, "\r\n", 2);
    if (rc == 0 && !no_body && !c->head_only)
        rc = conn_out(c, body, body_len);
    /* Whatever happened, the connection is the server's again; a failed response closes it. */
    if (rc < 0)
        c->close_after = true, c->woff = c->wlen = 0;
    c->state = CONN_FLUSH;
    conn_mark_dirty(c);
    conn_send_early(c);
    return rc;
}

int http_respond_take(struct http_conn *c, int status, const char *content_type, const char *headers, char *body,
                      size_t body_len)
{
    int rc = conn_check_owned(c, false, "http_respond_take");
    if (rc < 0) {
        free(body);
        return rc;
    }
    if (!body)
        body_len = 0;
    rc = conn_out_head(c, status, content_type, headers);
    if (rc == 0)
        rc = conn_outf(c, "Content-Length: %zu\r\n\r\n", body_len);
    if (rc == 0 && body_len && !c->head_only) {
        c->obody = body; /* sent after the head, by conn_flush, and freed there */
        c->ooff = 0;
        c->olen = body_len;
        body = NULL;
    }
    free(body);
    if (rc < 0)
        c->close_after = true, c->woff = c->wlen = 0;
    c->state = CONN_FLUSH;
    conn_mark_dirty(c);
    conn_send_early(c);
    return rc;
}

int http_stream_begin(struct http_conn *c, int status, const char *content_type, const char *headers)
{
    int rc = conn_check_owned(c, false, "http_stream_begin");
    if (rc < 0)
        return rc;
    c->streaming = true;
    /* HTTP/1.0 has no chunked encoding: the body ends when the connection closes. */
    c->chunked = c->req.minor_version >= 1;
    if (!c->chunked)
        c->close_after = true;
    rc = conn_out_head(c, status, content_type, headers);
    if (rc == 0 && content_type && strncmp(content_type, "text/event-stream", 17) == 0)
        rc = conn_out(c, "Cache-Control: no-cache\r\n", 25);
    if (rc == 0 && c->chunked)
        rc = conn_out(c, "Transfer-Encoding: chunked\r\n", 28);
    if (rc == 0)
        rc = conn_out(c, "\r\n", 2);
    return rc;
}

int http_stream_write(struct http_conn *c, const char *data, size_t len)
{
    int rc = conn_check_owned(c, true, "http_stream_write");
    if (rc < 0 || len == 0 || c->head_only)
        return rc;
    if (!c->chunked) {
        rc = conn_out(c, data, len);
    } else {
        rc = conn_outf(c, "%zx\r\n", len);
        if (rc == 0)
            rc = conn_out(c, data, len);
        if (rc == 0)
            rc = conn_out(c, "\r\n", 2);
    }
    if (rc == 0)
        conn_send_early(c);
    return rc;
}

int http_stream_end(struct http_conn *c)
{
    int rc = conn_check_owned(c, true, "http_stream_end");
    if (rc < 0)
        return rc;
    if (c->chunked && !c->head_only)
        rc = conn_out(c, "0\r\n\r\n", 5);
    if (rc < 0)
        c->close_after = true;
    c->state = CONN_FLUSH;
    conn_mark_dirty(c);
    conn_send_early(c);
    return rc;
}

int http_stream_abort(struct http_conn *c)
{
    int rc = conn_check_owned(c, true, "http_stream_abort");
    if (rc < 0)
        return rc;
    /* No terminating chunk: the client sees a truncated body, not a complete one. */
    c->close_after = true;
    c->state = CONN_FLUSH;
    conn_mark_dirty(c);
    return 0;
}

size_t http_conn_pending(const struct http_conn *c) { return conn_pending(c); }

void http_conn_hold(struct http_conn *c) { c->holds++; }

void http_conn_release(struct http_conn *c)
{
    ASSERT(c->holds > 0);
    c->holds--; /* a closed conn waiting on s->held is freed at the end of the turn */
}
void http_conn_set_data(struct http_conn *c, void *data) { c->data = data; }
void *http_conn_data(const struct http_conn *c) { return c->data; }
const char *http_conn_peer(const struct http_conn *c) { return c->peer; }

/* ---- requests ------------------------------------------------------------------------------------- */

static bool http_value_ieq(const struct http_header *h, const char *s)
{
    return h && h->value_len == strlen(s) && strncasecmp(h->value, s, h->value_len) == 0;
}

/* The request [0, head_len + body_len) is complete: fix it in place and hand it to the handler. */
static void conn_dispatch(struct http_conn *c)
{
    struct http_server *s = c->s;
    size_t total = c->head_len + c->body_len, extra = c->rlen - total;
    /* Reserve now, before any pointer into rbuf exists: the NUL gap and room for a pipelined request. */
    if (http_buf_reserve(&c->rbuf, &c->rcap, c->rlen + 1 + HTTP_PIPELINE_SLACK) < 0) {
        conn_error(c, 503, ERR_NOMEM, "out of memory");
        return;
    }
    memmove(c->rbuf + total + 1, c->rbuf + total, extra);
    c->rbuf[total] = 0;
    c->rlen++;
    c->req_end = total + 1;
    int64_t cl;
    int rc = http_parse_request(c->rbuf, c->head_len, &c->req, &cl, NULL);
    ASSERT(rc == (int)c->head_len);
    c->req.body = c->rbuf + c->head_len;
    c->req.body_len = c->body_len;
    c->head_only = c->req.method_len == 4 && memcmp(c->req.method, "HEAD", 4) == 0;
    c->close_after = !c->req.keep_alive || s->stopping;
    c->streaming = c->chunked = c->wait_writable = false;
    c->data = NULL;
    c->state = CONN_HANDLER;
    s->p.on_request(s->p.ctx, c, &c->req);
}

/* Parses what has been read in READ_HEAD/READ_BODY; starts at most one request. */
static void conn_process_input(struct http_conn *c)
{
    const struct http_server_params *p = &c->s->p;
    if (c->state == CONN_READ_HEAD) {
        if (c->rlen == 0)
            return;
        /* The parser is stateless: run it again only when a line was completed since the last run. */
        bool new_line = memchr(c->rbuf + c->scanned, '\n', c->rlen - c->scanned) != NULL;
        bool first = c->scanned == 0; /* garbage (a TLS hello, say) fails at once, without a line end */
        c->scanned = c->rlen;
        int64_t cl = -1;
        char err[ERR_MSG_MAX];
        int r = 0;
        if (new_line || first)
            r = http_parse_request(c->rbuf, c->rlen, &c->req, &cl, err);
        if (r == ERR_TOO_LARGE) {
            conn_error(c, 431, ERR_TOO_LARGE, "%s", err);
            return;
        }
        if (r < 0) {
            conn_error(c, 400, ERR_FORMAT, "malformed request: %s", err);
            return;
        }
        if ((r == 0 && c->rlen > p->max_header_bytes) || (size_t)r > p->max_header_bytes) {
            conn_error(c, 431, ERR_TOO_LARGE, "request header block exceeds %zu bytes", p->max_header_bytes);
            return;
        }
        if (r == 0)
            return;
        int n_host = 0;
        for (int i = 0; i < c->req.n_headers; i++)
            n_host += c->req.headers[i].name_len == 4 && !strncasecmp(c->req.headers[i].name, "host", 4);
        if (n_host > 1 || (n_host == 0 && c->req.minor_version >= 1)) {
            conn_error(c, 400, ERR_FORMAT, "%s (RFC 9112, section 3.2)",
                       n_host ? "more than one Host header" : "an HTTP/1.1 request needs a Host header");
            return;
        }
        if (cl == HTTP_BODY_TRANSFER_ENCODED) {
            conn_error(c, 501, ERR_UNSUPPORTED,
                       "request bodies with Transfer-Encoding are not supported; send Content-Length");
            return;
        }
        size_t body_max = p->body_limit ? p->body_limit(p->ctx, &c->req) : 0;
        if (!body_max)
            body_max = p->max_body_bytes;
        if (cl > 0 && (uint64_t)cl > body_max) {
            conn_error(c, 413, ERR_TOO_LARGE, "request body of %lld bytes exceeds the limit of %zu bytes",
                       (long long)cl, body_max);
            return;
        }
        if (cl > 0 && p->body_budget) {
            if (!budget_take(p->body_budget, cl)) {
                conn_error(c, 503, ERR_UNAVAILABLE,
                           "the server holds too many request bodies right now (%lld bytes in flight, limit %lld); "
                           "retry later",
                           (long long)budget_used(p->body_budget), (long long)p->body_budget->limit);
                return;
            }
            c->body_taken = cl;
        }
        c->head_len = (size_t)r;
        c->body_len = cl > 0 ? (size_t)cl : 0;
        bool expect = c->body_len > 0 && c->req.minor_version >= 1 &&
                      http_value_ieq(http_request_header(&c->req, "expect"), "100-continue");
        c->state = CONN_READ_BODY;
        c->t_phase = http_now_ms();
        if (http_buf_reserve(&c->rbuf, &c->rcap, c->head_len + c->body_len + 1 + HTTP_PIPELINE_SLACK) < 0) {
            conn_error(c, 503, ERR_NOMEM, "out of memory for a %zu-byte body", c->body_len);
            return;
        }
        if (expect && c->rlen < c->head_len + c->body_len &&
            conn_out(c, "HTTP/1.1 100 Continue\r\n\r\n", 25) < 0) {
            conn_close(c);
            return;
        }
        conn_arm_timer(c);
    }
    if (c->state == CONN_READ_BODY && c->rlen >= c->head_len + c->body_len)
        conn_dispatch(c);
}

/* The response was written out completely. */
static void conn_response_done(struct http_conn *c)
{
    struct http_server *s = c->s;
    c->served++;
    conn_give_body(c);
    if (c->close_after || c->peer_eof || s->stopping) {
        conn_start_linger(c);
        return;
    }
    memmove(c->rbuf, c->rbuf + c->req_end, c->rlen - c->req_end);
    c->rlen -= c->req_end;
    c->req_end = c->head_len = c->body_len = c->scanned = 0;
    c->data = NULL;
    c->state = CONN_READ_HEAD;
    c->t_phase = http_now_ms();
    c->idle_wait = c->rlen == 0;
    if (c->rcap > HTTP_RBUF_KEEP && c->rlen < HTTP_RBUF_INITIAL) {
        char *b = realloc(c->rbuf, HTTP_RBUF_INITIAL);
        if (b)
            c->rbuf = b, c->rcap = HTTP_RBUF_INITIAL;
    }
    conn_arm_timer(c);
    conn_process_input(c);
}

/* Sends what is queued, up to budget bytes (the socket may take less). Returns -1 on a send error (errno
 * says which), else 0. Moves nothing on: no state change, no callback. */
static int conn_send_some(struct http_conn *c, size_t budget)
{
    while (conn_pending(c) > 0 && budget > 0) {
        /* the buffered output (head) first, then a taken body: one sendmsg for both */
        struct iovec iov[2];
        int n_iov = 0;
        size_t want = 0;
        if (c->woff < c->wlen) {
            size_t k = c->wlen - c->woff < budget ? c->wlen - c->woff : budget;
            iov[n_iov++] = (struct iovec){c->wbuf + c->woff, k};
            want += k;
        }
        if (c->obody && c->ooff < c->olen && want < budget) {
            size_t k = c->olen - c->ooff < budget - want ? c->olen - c->ooff : budget - want;
            iov[n_iov++] = (struct iovec){c->obody + c->ooff, k};
            want += k;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (w > 0) {
            size_t left = (size_t)w, h = c->wlen - c->woff < left ? c->wlen - c->woff : left;
            c->woff += h;
            c->ooff += left - h;
            budget -= (size_t)w;
            c->t_last_write = http_now_ms();
            if ((size_t)w < want)
                break;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w == 0)
            errno = EPIPE;
        return -1;
    }
    return 0;
}

/* From inside a handler call: puts the queued bytes on the wire now instead of at the end of the turn. An
 * error is left for conn_flush (the connection is on the dirty list), which sees it again and aborts. */
static void conn_send_early(struct http_conn *c)
{
    if (!c->closed && c->in_dirty && conn_pending(c) > 0)
        (void)conn_send_some(c, HTTP_IO_BUDGET);
}

/* Writes up to HTTP_IO_BUDGET bytes, then moves the connection on. Returns -1 when it was closed. */
static int conn_flush(struct http_conn *c)
{
    struct http_server *s = c->s;
    if (conn_send_some(c, HTTP_IO_BUDGET) < 0) {
        conn_abort(c, strerror(errno));
        return -1;
    }
    if (c->obody && c->ooff == c->olen) {
        free(c->obody);
        c->obody = NULL;
        c->ooff = c->olen = 0;
    }
    if (conn_pending(c) == 0) {
        c->woff = c->wlen = 0;
        if (c->wcap > HTTP_WBUF_KEEP) {
            free(c->wbuf);
            c->wbuf = NULL;
            c->wcap = 0;
        }
    }
    if (c->state == CONN_HANDLER && c->wait_writable && conn_pending(c) < s->p.max_output_buffer / 2) {
        c->wait_writable = false;
        if (s->p.on_writable)
            s->p.on_writable(s->p.ctx, c);
    } else if (c->state == CONN_FLUSH && conn_pending(c) == 0) {
        conn_response_done(c);
    }
    if (c->closed)
        return -1;
    conn_update_events(c);
    return 0;
}

/* Reads what the socket has (within the budget and the buffer's room). Returns 1 on EOF, -1 on error. */
static int conn_read(struct http_conn *c)
{
    size_t budget = HTTP_IO_BUDGET;
    while (budget > 0) {
        char scratch[4096];
        char *dst;
        size_t room;
        if (c->state == CONN_LINGER) {
            dst = scratch;
            room = sizeof scratch;
        } else {
            room = conn_read_room(c, true);
            if (room == 0)
                return 0;
            dst = c->rbuf + c->rlen;
        }
        if (room > budget)
            room = budget;
        ssize_t n = recv(c->fd, dst, room, 0);
        if (n > 0) {
            budget -= (size_t)n;
            if (c->state != CONN_LINGER) {
                if (c->state == CONN_READ_HEAD && c->idle_wait) {
                    /* First byte of a keep-alive request: the header timeout starts now. */
                    c->idle_wait = false;
                    c->t_phase = http_now_ms();
                    conn_arm_timer(c);
                }
                c->rlen += (size_t)n;
            }
            if ((size_t)n < room)
                return 0;
            continue;
        }
        if (n == 0) {
            c->peer_eof = true;
            return 1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
    return 0;
}

static void conn_on_event(struct http_conn *c, uint32_t ev)
{
    if (c->closed)
        return;
    if (ev & (EPOLLERR | EPOLLHUP)) {
        conn_abort(c, "connection error or hang-up");
        return;
    }
    if ((ev & EPOLLOUT) && conn_flush(c) < 0)
        return;
    if (!(ev & (EPOLLIN | EPOLLRDHUP)))
        return;
    int r = 0;
    if (c->events & EPOLLIN) {
        r = conn_read(c);
        if (r < 0) {
            conn_abort(c, strerror(errno));
            return;
        }
    } else if (ev & EPOLLRDHUP) {
        /* Not reading (buffer full): the peer's FIN is still a departure. */
        c->peer_eof = true;
        r = 1;
    }
    if (r == 1) {
        /* A request completed just before the FIN is still dispatched: a handler that answers at once gets
         * its answer delivered to the half-closed peer; one that would answer later is told at once. */
        if (c->state == CONN_READ_HEAD || c->state == CONN_READ_BODY)
            conn_process_input(c);
        if (c->closed)
            return;
        switch (c->state) {
        case CONN_HANDLER:
            conn_abort(c, "the client closed the connection");
            return;
        case CONN_FLUSH:
            /* The response is complete: deliver what the half-closed peer may still read, then close. */
            c->close_after = true;
            conn_update_events(c);
            return;
        default:
            conn_close(c);
            return;
        }
    }
    if (c->state == CONN_READ_HEAD || c->state == CONN_READ_BODY)
        conn_process_input(c);
    conn_update_events(c);
}

static void conn_on_timeout(struct http_conn *c)
{
    switch (c->state) {
    case CONN_READ_HEAD:
        if (c->idle_wait || c->rlen == 0) {
            conn_close(c); /* nothing was asked: close quietly */
            return;
        }
        conn_error(c, 408, ERR_TIMEOUT, "request headers not received within %d ms", c->s->p.header_timeout_ms);
        return;
    case CONN_READ_BODY:
        conn_error(c, 408, ERR_TIMEOUT, "request body not received within %d ms", c->s->p.body_timeout_ms);
        return;
    case CONN_HANDLER:
        conn_abort(c, "the client stopped reading");
        return;
    default:
        conn_close(c);
        return;
    }
}

static void server_check_timers(struct http_server *s)
{
    int64_t now = http_now_ms();
    if (now < s->next_timer)
        return;
    int64_t next = HTTP_NO_DEADLINE;
    for (struct http_conn *c = s->conns, *nx; c; c = nx) {
        nx = c->next;
        if (conn_deadline(c) <= now)
            conn_on_timeout(c);
        if (!c->closed) {
            int64_t d = conn_deadline(c);
            if (d < next)
                next = d;
        }
    }
    s->next_timer = next;
}

/* ---- accepting ------------------------------------------------------------------------------------ */

static void http_format_peer(const struct sockaddr_storage *ss, char *out, size_t out_size)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(out, out_size, "%s:%d", ip, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(out, out_size, "[%s]:%d", ip, port);
    } else {
        snprintf(out, out_size, "unknown");
    }
}

static void server_pause_accept(struct http_server *s, int64_t now)
{
    if (s->accept_resume || s->listen_fd < 0)
        return;
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, s->listen_fd, NULL);
    s->accept_resume = now + HTTP_ACCEPT_PAUSE_MS;
}

static void server_resume_accept(struct http_server *s, int64_t now)
{
    if (!s->accept_resume || now < s->accept_resume || s->listen_fd < 0)
        return;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &s->listen_tag};
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->listen_fd, &e) == 0)
        s->accept_resume = 0;
    else
        s->accept_resume = now + HTTP_ACCEPT_PAUSE_MS;
}

static void server_accept(struct http_server *s)
{
    for (int k = 0; k < HTTP_MAX_ACCEPTS_PER_TURN && s->listen_fd >= 0; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            log_warn("http: accept failed: %s (pausing accepts for %d ms)", strerror(errno),
                     HTTP_ACCEPT_PAUSE_MS);
            server_pause_accept(s, http_now_ms());
            return;
        }
        bool reject = atomic_load(&s->n_conns) >= s->p.max_connections;
        if (reject && s->n_rejecting >= HTTP_MAX_REJECTING) {
            close(fd);
            continue;
        }
        struct http_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->s = s;
        c->fd = fd;
        c->rejected = reject;
        c->state = CONN_READ_HEAD;
        c->t_phase = c->t_last_write = http_now_ms();
        http_format_peer(&ss, c->peer, sizeof c->peer);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->events = EPOLLIN | EPOLLRDHUP;
        struct epoll_event e = {.events = c->events, .data.ptr = c};
        if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &e) < 0) {
            log_warn("http: epoll_ctl(ADD) failed: %s", strerror(errno));
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        if (reject) {
            s->n_rejecting++; /* conn_error reports it (on_error: counted and logged) */
            conn_error(c, 503, ERR_UNAVAILABLE, "too many open connections (limit %d); retry later",
                       s->p.max_connections);
        } else {
            atomic_fetch_add(&s->n_conns, 1);
            conn_arm_timer(c);
        }
    }
}

/* ---- the loop ------------------------------------------------------------------------------------- */

/* Flushes the connections that got output this turn; connections marked dirty while doing so (a next
 * pipelined request answered at once) wait for the next turn. */
static void server_process_dirty(struct http_server *s)
{
    int n = 0;
    for (struct http_conn *c = s->dirty_head; c; c = c->dirty_next)
        n++;
    while (n-- > 0 && s->dirty_head) {
        struct http_conn *c = s->dirty_head;
        conn_unmark_dirty(c);
        conn_flush(c);
    }
}

static bool server_busy(const struct http_server *s)
{
    for (const struct http_conn *c = s->conns; c; c = c->next)
        if (c->state == CONN_HANDLER || c->state == CONN_FLUSH)
            return true;
    return false;
}

static void server_begin_stop(struct http_server *s, int64_t now)
{
    int drain = atomic_load(&s->stop_drain_ms);
    s->stopping = true;
    s->drain_deadline = now + (drain > 0 ? drain : 0);
    if (s->listen_fd >= 0) {
        epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, s->listen_fd, NULL);
        close(s->listen_fd);
        s->listen_fd = -1;
    }
    for (struct http_conn *c = s->conns, *nx; c; c = nx) {
        nx = c->next;
        if (c->state == CONN_HANDLER || c->state == CONN_FLUSH)
            c->close_after = true;
        else
            conn_close(c);
    }
    log_info("http: stopping, %d connection(s) draining for up to %d ms", atomic_load(&s->n_conns), drain);
}

static int server_wait_ms(const struct http_server *s, int64_t now)
{
    if (s->dirty_head)
        return 0;
    int64_t until = s->next_timer;
    if (s->stopping && s->drain_deadline < until)
        until = s->drain_deadline;
    if (s->accept_resume && s->accept_resume < until)
        until = s->accept_resume;
    if (until == HTTP_NO_DEADLINE)
        return -1;
    if (until <= now)
        return 0;
    return until - now > INT_MAX ? INT_MAX : (int)(until - now);
}

int http_server_watch_ctl(struct http_server *s, int op, int fd, uint32_t events, struct http_watch *w)
{
    uint64_t tag = (uint64_t)(uintptr_t)w | 1;
    struct epoll_event e = {.events = events, .data.u64 = tag};
    int rc = epoll_ctl(s->epoll_fd, op, fd, &e) < 0 ? ERR_IO : 0;
    if (op == EPOLL_CTL_DEL) /* its owner may free w now: forget it in the rest of this batch */
        for (int i = s->ev_i + 1; i < s->ev_n; i++)
            if (s->evs[i].data.u64 == tag)
                s->evs[i].data.u64 = 0;
    return rc;
}

int http_server_run(struct http_server *s)
{
    int rc = 0;
    for (;;) {
        int64_t now = http_now_ms();
        if (!s->stopping && atomic_load(&s->stop_requested))
            server_begin_stop(s, now);
        if (s->stopping && (!server_busy(s) || now >= s->drain_deadline))
            break;
        server_resume_accept(s, now);
        int n = epoll_wait(s->epoll_fd, s->evs, HTTP_MAX_EVENTS, server_wait_ms(s, now));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_error("http: epoll_wait failed: %s", strerror(errno));
            rc = ERR_IO;
            break;
        }
        s->ev_n = n;
        for (s->ev_i = 0; s->ev_i < n; s->ev_i++) {
            struct epoll_event *ev = &s->evs[s->ev_i];
            void *tag = ev->data.ptr;
            if (!tag) {
                /* a watch removed earlier in this batch */
            } else if (tag == &s->listen_tag) {
                server_accept(s);
            } else if (tag == &s->event_tag) {
                uint64_t v;
                while (read(s->event_fd, &v, sizeof v) == (ssize_t)sizeof v) {
                }
                if (atomic_exchange(&s->wake_pending, 0) && s->p.on_wake)
                    s->p.on_wake(s->p.ctx);
            } else if (ev->data.u64 & 1) { /* conns are malloc'd: bit 0 is clear */
                struct http_watch *w = (struct http_watch *)(uintptr_t)(ev->data.u64 & ~(uint64_t)1);
                w->fn(w, ev->events);
            } else {
                conn_on_event(tag, ev->events);
            }
        }
        s->ev_n = 0;
        server_process_dirty(s);
        server_check_timers(s);
        server_free_graveyard(s);
    }
    /* Whatever is left after the drain is cut off; handlers still holding a request are told. */
    while (s->conns)
        conn_abort(s->conns, "the server is stopping");
    server_free_graveyard(s);
    return rc;
}

/* Both may run in a signal handler: only lock-free atomics and write(2), and errno is preserved. */
void http_server_stop(struct http_server *s, int drain_ms)
{
    int saved = errno;
    atomic_store(&s->stop_drain_ms, drain_ms);
    atomic_store(&s->stop_requested, 1);
    uint64_t one = 1;
    ssize_t w = write(s->event_fd, &one, sizeof one);
    (void)w; /* EAGAIN means the counter is already non-zero: the loop wakes anyway */
    errno = saved;
}

void http_server_wake(struct http_server *s)
{
    int saved = errno;
    atomic_store(&s->wake_pending, 1);
    uint64_t one = 1;
    ssize_t w = write(s->event_fd, &one, sizeof one);
    (void)w;
    errno = saved;
}

int http_server_connections(const struct http_server *s) { return atomic_load(&s->n_conns); }
int http_server_port(const struct http_server *s) { return s->port; }

/* ---- lifetime ------------------------------------------------------------------------------------- */

void http_server_params_default(struct http_server_params *p)
{
    memset(p, 0, sizeof *p);
    p->host = "127.0.0.1";
    p->port = 8080;
    p->max_connections = 1024;
    p->max_header_bytes = 16 * 1024;
    p->max_body_bytes = 8 * 1024 * 1024;
    p->header_timeout_ms = 10000;
    p->body_timeout_ms = 30000;
    p->idle_timeout_ms = 60000;
    p->max_output_buffer = 1024 * 1024;
}

static int http_listen(struct http_server *s, char *err)
{
    char port[16];
    snprintf(port, sizeof port, "%d", s->p.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(s->host, port, &hints, &res);
    if (gai != 0)
        return err_set(err, ERR_INVALID_ARG, "cannot resolve listen host '%s': %s", s->host, gai_strerror(gai));
    int saved = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            s->listen_fd = fd;
            break;
        }
        saved = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (s->listen_fd < 0)
        return err_set(err, ERR_IO, "cannot listen on %s:%d: %s%s", s->host, s->p.port,
                       saved ? strerror(saved) : "no usable address",
                       saved == EADDRINUSE ? " (another process listens there, or a server that used the port "
                                             "did not set SO_REUSEADDR and its connections are still closing: "
                                             "choose another port or retry in a minute)"
                                           : "");
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(s->listen_fd, (struct sockaddr *)&ss, &sl) == 0)
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

struct http_server *http_server_create(const struct http_server_params *p, char *err)
{
    struct http_server_params d;
    http_server_params_default(&d);
    if (!p || !p->on_request) {
        err_set(err, ERR_INVALID_ARG, "http server: on_request handler is required");
        return NULL;
    }
    if (p->port < 0 || p->port > 65535) {
        err_set(err, ERR_INVALID_ARG, "http server: port %d is out of range 0..65535", p->port);
        return NULL;
    }
    if (p->max_connections < 0 || p->header_timeout_ms < 0 || p->body_timeout_ms < 0 || p->idle_timeout_ms < 0) {
        err_set(err, ERR_INVALID_ARG, "http server: max_connections and timeouts must not be negative");
        return NULL;
    }
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, ERR_NOMEM, "http server: out of memory");
        return NULL;
    }
    s->p = *p;
    /* Zero means "the default", so a caller can set only what it cares about. */
    if (!s->p.max_connections) s->p.max_connections = d.max_connections;
    if (!s->p.max_header_bytes) s->p.max_header_bytes = d.max_header_bytes;
    if (!s->p.max_body_bytes) s->p.max_body_bytes = d.max_body_bytes;
    if (!s->p.header_timeout_ms) s->p.header_timeout_ms = d.header_timeout_ms;
    if (!s->p.body_timeout_ms) s->p.body_timeout_ms = d.body_timeout_ms;
    if (!s->p.idle_timeout_ms) s->p.idle_timeout_ms = d.idle_timeout_ms;
    if (!s->p.max_output_buffer) s->p.max_output_buffer = d.max_output_buffer;
    snprintf(s->host, sizeof s->host, "%s", p->host && *p->host ? p->host : d.host);
    s->p.host = s->host;
    s->listen_fd = s->epoll_fd = s->event_fd = -1;
    s->next_timer = HTTP_NO_DEADLINE;
    if (http_listen(s, err) < 0)
        goto fail;
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->epoll_fd < 0 || s->event_fd < 0) {
        err_set(err, ERR_IO, "http server: epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = &s->listen_tag};
    struct epoll_event ee = {.events = EPOLLIN, .data.ptr = &s->event_tag};
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->listen_fd, &le) < 0 ||
        epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->event_fd, &ee) < 0) {
        err_set(err, ERR_IO, "http server: epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    return s;
fail:
    http_server_destroy(s);
    return NULL;
}

void http_server_destroy(struct http_server *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_abort(s->conns, "the server is being destroyed");
    for (struct http_conn *c = s->held; c; c = c->grave_next)
        c->holds = 0; /* whoever held them is gone by now */
    server_free_graveyard(s);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->epoll_fd >= 0)
        close(s->epoll_fd);
    if (s->event_fd >= 0)
        close(s->event_fd);
    free(s);
}
