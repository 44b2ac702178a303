/*
 * upstream: the HTTP/1.1 client (see upstream.h for the contract).
 *
 * A connection is a small state machine:
 *
 *   CONNECTING --connected--> SENDING --request written--> HEAD --head parsed--> BODY --complete--> IDLE
 *        ^                                                                                        |
 *        +------------------------------ reused by the next request to the target ----------------+
 *
 * One timer per connection carries the deadline of its state: connect_ms from the start of CONNECTING,
 * head_ms from the start of the request until the head is parsed, idle_ms from the last body byte (stopped
 * while paused), and UP_IDLE_KEEP_MS for a pooled connection, so a pool never keeps sockets its backend has
 * long forgotten.
 *
 * The read buffer holds the head until it is parsed; body bytes are decoded straight out of it (chunk
 * framing stripped) and handed to on_body, so a stream passes through without being collected. Only an
 * unfinished chunk-size line is carried over between reads.
 *
 * Reentrancy: a callback may cancel its own connection. in_cb counts the callbacks running on a connection;
 * up_cancel inside one only marks it, and the event handler frees it once the callback returned.
 */
#include "route/upstream.h"

#include "core/err.h"
#include "core/log.h"

#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define UP_READ_CHUNK 16384
#define UP_IDLE_KEEP_MS 30000  /* a pooled connection unused this long is closed */
#define UP_DEFAULT_MAX_IDLE 64

enum uc_state { UC_CONNECTING, UC_SENDING, UC_HEAD, UC_BODY, UC_IDLE };
enum uc_body { UB_NONE, UB_LENGTH, UB_CHUNKED, UB_CLOSE };
enum uc_chunk { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER };

struct up_conn {
    struct ev_watch w;
    struct ev_timer timer;
    struct evloop *l;
    struct up_target *t;
    enum uc_state state;
    bool reused;       /* carried an earlier request */
    bool retried;      /* already re-sent once after a stale keep-alive failure */
    bool paused;
    bool cancelled;    /* up_cancel ran inside a callback: free once it returns */
    bool got_bytes;    /* a response byte arrived for this exchange */
    int in_cb;

    char *wbuf;        /* the request; kept whole until the response starts (a stale retry resends it) */
    size_t wlen, woff;
    char *rbuf;
    size_t rlen, rcap;

    struct up_response resp;
    enum uc_body body;
    int64_t remaining;     /* UB_LENGTH: bytes left; UB_CHUNKED: bytes left in the chunk */
    enum uc_chunk chunk;
    int64_t t_start;       /* ms: the request started */
    int64_t t_last;        /* ms: last progress while reading the body */
    struct up_timeouts to;
    struct up_callbacks cb;
    void *arg;
    struct up_conn *next_idle;
};

/* ---- response head parser ------------------------------------------------------------------------- */

static bool hdr_is(const char *name, size_t nlen, const char *want)
{
    return nlen == strlen(want) && strncasecmp(name, want, nlen) == 0;
}

static bool value_has_token(const char *v, size_t vlen, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i + tl <= vlen; i++)
        if (strncasecmp(v + i, tok, tl) == 0 && (i == 0 || v[i - 1] == ',' || v[i - 1] == ' ') &&
            (i + tl == vlen || v[i + tl] == ',' || v[i + tl] == ' ' || v[i + tl] == ';'))
            return true;
    return false;
}

/* Retry-After: delta-seconds or an IMF-fixdate. -1 when neither. */
static int64_t parse_retry_after(const char *v, size_t vlen, int64_t now_unix)
{
    char buf[64];
    if (vlen == 0 || vlen >= sizeof buf)
        return -1;
    memcpy(buf, v, vlen);
    buf[vlen] = 0;
    if (isdigit((unsigned char)buf[0])) {
        char *end;
        errno = 0;
        double s = strtod(buf, &end);
        if (errno || *end || s < 0 || s > 1e7)
            return -1;
        return (int64_t)(s * 1000.0);
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *e = strptime(buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!e || *e)
        return -1;
    int64_t at = (int64_t)timegm(&tm);
    return at > now_unix ? (at - now_unix) * 1000 : 0;
}

int up_parse_head(const char *buf, size_t len, struct up_response *r, int64_t now_unix)
{
    /* Find the end of the header block first: nothing is parsed until it is complete. */
    size_t end = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] == '\n' && buf[i + 1] == '\n') {
            end = i + 2;
            break;
        }
        if (buf[i] == '\n' && buf[i + 1] == '\r' && i + 2 < len && buf[i + 2] == '\n') {
            end = i + 3;
            break;
        }
    }
    if (!end)
        return len > UP_MAX_HEAD ? ERR_TOO_LARGE : 0;
    if (end > UP_MAX_HEAD)
        return ERR_TOO_LARGE;
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    r->retry_after_ms = -1;
    /* Status line: HTTP/1.x SSS [reason] */
    if (end < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)buf[7]) || buf[8] != ' ')
        return ERR_FORMAT;
    r->minor_version = buf[7] - '0';
    if (!isdigit((unsigned char)buf[9]) || !isdigit((unsigned char)buf[10]) || !isdigit((unsigned char)buf[11]))
        return ERR_FORMAT;
    r->status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    if (r->status < 100 || (end > 12 && buf[12] != ' ' && buf[12] != '\r' && buf[12] != '\n'))
        return ERR_FORMAT;
    r->keep_alive = r->minor_version >= 1;
    size_t p = 12;
    while (p < end && buf[p] != '\n')
        p++;
    p++;
    bool te_seen = false;
    while (p < end) {
        size_t ls = p;
        while (p < end && buf[p] != '\n')
            p++;
        size_t le = p; /* at '\n' */
        p++;
        if (le > ls && buf[le - 1] == '\r')
            le--;
        if (le == ls)
            break; /* the empty line */
        if (buf[ls] == ' ' || buf[ls] == '\t')
            return ERR_FORMAT; /* obsolete line folding */
        const char *colon = memchr(buf + ls, ':', le - ls);
        if (!colon || colon == buf + ls)
            return ERR_FORMAT;
        const char *name = buf + ls;
        size_t nlen = (size_t)(colon - name);
        for (size_t i = 0; i < nlen; i++)
            if (name[i] <= ' ' || name[i] >= 127)
                return ERR_FORMAT;
        const char *v = colon + 1;
        const char *ve = buf + le;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t vlen = (size_t)(ve - v);
        if (hdr_is(name, nlen, "content-length")) {
            int64_t n = 0;
            if (!vlen)
                return ERR_FORMAT;
            for (size_t i = 0; i < vlen; i++) {
                if (!isdigit((unsigned char)v[i]) || n > (INT64_MAX - 9) / 10)
                    return ERR_FORMAT;
                n = n * 10 + (v[i] - '0');
            }
            if (r->content_length >= 0 && r->content_length != n)
                return ERR_FORMAT; /* conflicting lengths: the framing cannot be trusted */
            r->content_length = n;
        } else if (hdr_is(name, nlen, "transfer-encoding")) {
            te_seen = true;
            r->chunked = vlen >= 7 && strncasecmp(ve - 7, "chunked", 7) == 0;
        } else if (hdr_is(name, nlen, "connection")) {
            if (value_has_token(v, vlen, "close"))
                r->keep_alive = false;
            else if (value_has_token(v, vlen, "keep-alive"))
                r->keep_alive = true;
        } else if (hdr_is(name, nlen, "retry-after")) {
            r->retry_after_ms = parse_retry_after(v, vlen, now_unix);
        } else if (hdr_is(name, nlen, "content-type")) {
            size_t n = vlen < sizeof r->content_type - 1 ? vlen : sizeof r->content_type - 1;
            memcpy(r->content_type, v, n);
            r->content_type[n] = 0;
        }
    }
    if (te_seen && !r->chunked)
        r->keep_alive = false; /* another coding: the body runs until the close */
    if (te_seen)
        r->content_length = -1; /* Transfer-Encoding overrides Content-Length (RFC 9112 6.3) */
    return (int)end;
}

/* ---- connections ---------------------------------------------------------------------------------- */

static void uc_on_event(struct ev_watch *w, uint32_t events);
static void uc_on_timer(struct ev_timer *t);

static void uc_free(struct up_conn *c)
{
    evloop_timer_cancel(c->l, &c->timer);
    evloop_del(c->l, &c->w);
    if (c->w.fd >= 0)
        close(c->w.fd);
    c->t->n_open--;
    free(c->wbuf);
    free(c->rbuf);
    free(c);
}

static void uc_unlink_idle(struct up_conn *c)
{
    struct up_conn **pp = &c->t->idle;
    while (*pp && *pp != c)
        pp = &(*pp)->next_idle;
    if (*pp) {
        *pp = c->next_idle;
        c->t->n_idle--;
    }
    c->next_idle = NULL;
}

static void uc_arm(struct up_conn *c)
{
    int64_t at;
    switch (c->state) {
    case UC_CONNECTING:
        at = c->t_start + c->to.connect_ms;
        break;
    case UC_SENDING:
    case UC_HEAD:
        at = c->t_start + c->to.head_ms;
        break;
    case UC_BODY:
        if (c->paused) {
            evloop_timer_cancel(c->l, &c->timer);
            return;
        }
        at = c->t_last + c->to.idle_ms;
        break;
    case UC_IDLE:
    default:
        at = c->t_last + UP_IDLE_KEEP_MS;
        break;
    }
    evloop_timer_set(c->l, &c->timer, at);
}

static int uc_socket(struct up_conn *c, char *err)
{
    int fd = socket(c->t->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_set(err, ERR_IO, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, (const struct sockaddr *)&c->t->addr, c->t->addr_len);
    if (rc < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return err_set(err, ERR_IO, "connect to %s: %s", c->t->name, strerror(e));
    }
    c->w.fd = fd;
    c->w.fn = uc_on_event;
    c->w.added = false;
    if (evloop_add(c->l, &c->w, EPOLLOUT | EPOLLIN | EPOLLRDHUP) < 0) {
        close(fd);
        c->w.fd = -1;
        return err_set(err, ERR_IO, "epoll_ctl: %s", strerror(errno));
    }
    c->state = UC_CONNECTING;
    return 0;
}

/* The exchange ended in failure: no callback follows; the connection is closed. */
static void uc_fail(struct up_conn *c, enum up_fail kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void uc_fail(struct up_conn *c, enum up_fail kind, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    bool head_seen = c->state == UC_BODY;
    evloop_timer_cancel(c->l, &c->timer);
    evloop_del(c->l, &c->w);
    c->in_cb++;
    c->cb.on_fail(c->arg, kind, head_seen, msg);
    c->in_cb--;
    uc_free(c);
}

/* A pooled connection failed before any response byte: the backend closed it as we wrote. Send again on a
 * fresh connection (once); returns true when that is under way. */
static bool uc_retry_stale(struct up_conn *c)
{
    if (!c->reused || c->retried || c->got_bytes)
        return false;
    evloop_del(c->l, &c->w);
    close(c->w.fd);
    c->w.fd = -1;
    c->retried = true;
    c->reused = false;
    c->woff = 0;
    c->rlen = 0;
    char err[ERR_MSG_MAX];
    if (uc_socket(c, err) < 0)
        return false;
    uc_arm(c);
    return true;
}

static void uc_update_events(struct up_conn *c)
{
    uint32_t ev = 0;
    if (c->state == UC_CONNECTING || (c->state == UC_SENDING && c->woff < c->wlen))
        ev |= EPOLLOUT;
    if (!c->paused)
        ev |= EPOLLIN | EPOLLRDHUP; /* paused: a half-close would fire on every turn; it is seen on resume */
    evloop_mod(c->l, &c->w, ev);
}

/* The response is complete: pool the connection or close it, then tell the owner. */
static void uc_complete(struct up_conn *c)
{
    bool keep = c->resp.keep_alive && c->body != UB_CLOSE && c->rlen == 0;
    struct up_callbacks cb = c->cb;
    void *arg = c->arg;
    struct up_target *t = c->t;
    int max_idle = t->max_idle > 0 ? t->max_idle : UP_DEFAULT_MAX_IDLE;
    if (keep && t->n_idle < max_idle) {
        c->state = UC_IDLE;
        c->paused = false;
        c->reused = c->retried = c->got_bytes = false;
        free(c->wbuf);
        c->wbuf = NULL;
        c->wlen = c->woff = 0;
        c->t_last = evloop_now_ms();
        c->next_idle = t->idle;
        t->idle = c;
        t->n_idle++;
        evloop_mod(c->l, &c->w, EPOLLIN | EPOLLRDHUP);
        uc_arm(c);
    } else {
        uc_free(c);
    }
    cb.on_done(arg); /* c may already be reused or gone: not touched after this */
}

/* Calls on_body; returns false when the owner cancelled the exchange in it (c is then freed). */
static bool uc_emit(struct up_conn *c, const char *p, size_t n)
{
    if (!n)
        return true;
    c->in_cb++;
    c->cb.on_body(c->arg, p, n);
    c->in_cb--;
    if (c->cancelled) {
        uc_free(c);
        return false;
    }
    return true;
}

/* Decodes body bytes rbuf[0..rlen). Returns -1 when c is gone (completed, failed or cancelled), else 0
 * (the undecoded remainder, at most a partial chunk-size line, stays at the start of rbuf). */
static int uc_body(struct up_conn *c)
{
    char *p = c->rbuf;
    size_t n = c->rlen;
    switch (c->body) {
    case UB_NONE:
        break;
    case UB_CLOSE:
        c->rlen = 0;
        return uc_emit(c, p, n) ? 0 : -1;
    case UB_LENGTH: {
        size_t take = (int64_t)n < c->remaining ? n : (size_t)c->remaining;
        c->remaining -= (int64_t)take;
        if (!uc_emit(c, p, take))
            return -1;
        /* bytes past the body are kept: they make the connection unfit for the pool */
        memmove(c->rbuf, c->rbuf + take, n - take);
        c->rlen = n - take;
        break;
    }
    case UB_CHUNKED: {
        size_t i = 0;
        while (i < n) {
            if (c->chunk == CH_DATA) {
                size_t take = (int64_t)(n - i) < c->remaining ? n - i : (size_t)c->remaining;
                if (!uc_emit(c, p + i, take))
                    return -1;
                i += take;
                c->remaining -= (int64_t)take;
                if (c->remaining == 0)
                    c->chunk = CH_DATA_END;
                continue;
            }
            /* CH_SIZE, CH_DATA_END and CH_TRAILER consume whole lines */
            char *nl = memchr(p + i, '\n', n - i);
            if (!nl) {
                if (n - i > 1024) {
                    uc_fail(c, UP_FAIL_GARBAGE, "%s: chunk framing line too long", c->t->name);
                    return -1;
                }
                break;
            }
            size_t ll = (size_t)(nl - (p + i));
            const char *line = p + i;
            size_t lend = ll && line[ll - 1] == '\r' ? ll - 1 : ll;
            i += ll + 1;
            if (c->chunk == CH_DATA_END) {
                if (lend != 0) {
                    uc_fail(c, UP_FAIL_GARBAGE, "%s: chunk data not followed by CRLF", c->t->name);
                    return -1;
                }
                c->chunk = CH_SIZE;
            } else if (c->chunk == CH_SIZE) {
                int64_t sz = 0;
                size_t k = 0;
                for (; k < lend && isxdigit((unsigned char)line[k]); k++) {
                    if (sz > (INT64_MAX >> 4)) {
                        uc_fail(c, UP_FAIL_GARBAGE, "%s: chunk size overflow", c->t->name);
                        return -1;
                    }
                    sz = sz * 16 + (isdigit((unsigned char)line[k]) ? line[k] - '0' : (tolower(line[k]) - 'a' + 10));
                }
                if (k == 0 || (k < lend && line[k] != ';' && line[k] != ' ' && line[k] != '\t')) {
                    uc_fail(c, UP_FAIL_GARBAGE, "%s: bad chunk size line", c->t->name);
                    return -1;
                }
                if (sz == 0) {
                    c->chunk = CH_TRAILER;
                } else {
                    c->chunk = CH_DATA;
                    c->remaining = sz;
                }
            } else { /* CH_TRAILER: lines until the empty one */
                if (lend == 0) {
                    memmove(c->rbuf, p + i, n - i);
                    c->rlen = n - i;
                    uc_complete(c);
                    return -1;
                }
            }
        }
        memmove(c->rbuf, p + i, n - i);
        c->rlen = n - i;
        return 0;
    }
    }
    if (c->body == UB_NONE || (c->body == UB_LENGTH && c->remaining == 0)) {
        uc_complete(c);
        return -1;
    }
    return 0;
}

/* Head parsed: decide the body framing, tell the owner, then decode what already arrived. */
static int uc_head(struct up_conn *c, int hlen)
{
    struct up_response *r = &c->resp;
    size_t rest = c->rlen - (size_t)hlen;
    if (r->status >= 100 && r->status < 200) {
        /* Interim response (100 Continue): skip it and wait for the real one. */
        memmove(c->rbuf, c->rbuf + hlen, rest);
        c->rlen = rest;
        return 0;
    }
    if (r->status == 204 || r->status == 304)
        c->body = UB_NONE;
    else if (r->chunked)
        c->body = UB_CHUNKED, c->chunk = CH_SIZE;
    else if (r->content_length >= 0)
        c->body = r->content_length ? UB_LENGTH : UB_NONE, c->remaining = r->content_length;
    else
        c->body = UB_CLOSE, r->keep_alive = false;
    c->state = UC_BODY;
    c->t_last = evloop_now_ms();
    memmove(c->rbuf, c->rbuf + hlen, rest);
    c->rlen = rest;
    free(c->wbuf); /* the request cannot be resent any more */
    c->wbuf = NULL;
    c->wlen = c->woff = 0;
    c->in_cb++;
    c->cb.on_head(c->arg, r);
    c->in_cb--;
    if (c->cancelled) {
        uc_free(c);
        return -1;
    }
    uc_arm(c);
    return uc_body(c);
}

static int uc_reserve(struct up_conn *c, size_t need)
{
    if (c->rcap >= need)
        return 0;
    size_t n = c->rcap ? c->rcap : UP_READ_CHUNK;
    while (n < need)
        n *= 2;
    char *b = realloc(c->rbuf, n);
    if (!b)
        return ERR_NOMEM;
    c->rbuf = b;
    c->rcap = n;
    return 0;
}

/* Reads what is there and processes it. Returns -1 when c is gone. */
static int uc_read(struct up_conn *c)
{
    for (int turns = 0; turns < 8 && !c->paused; turns++) {
        if (uc_reserve(c, c->rlen + UP_READ_CHUNK) < 0) {
            uc_fail(c, UP_FAIL_BROKEN, "%s: out of memory reading the response", c->t->name);
            return -1;
        }
        ssize_t n = recv(c->w.fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            if (errno == EINTR)
                continue;
            int e = errno;
            if (uc_retry_stale(c))
                return 0;
            uc_fail(c, UP_FAIL_BROKEN, "%s: %s %s", c->t->name, strerror(e),
                    c->state == UC_BODY ? "while reading the body" : "before the response");
            return -1;
        }
        if (n == 0) {
            if (c->state == UC_BODY && c->body == UB_CLOSE) {
                c->resp.keep_alive = false;
                if (c->rlen && !uc_emit(c, c->rbuf, c->rlen))
                    return -1;
                c->rlen = 0;
                uc_complete(c);
                return -1;
            }
            if (uc_retry_stale(c))
                return 0;
            uc_fail(c, UP_FAIL_BROKEN, "%s closed the connection %s", c->t->name,
                    c->state == UC_BODY ? "before the response was complete" : "without a response");
            return -1;
        }
        c->got_bytes = true;
        c->rlen += (size_t)n;
        c->t_last = evloop_now_ms();
        if (c->state == UC_SENDING) {
            /* An early answer (an error before the body was read): take it as the response. */
            c->state = UC_HEAD;
        }
        if (c->state == UC_HEAD) {
            int h = up_parse_head(c->rbuf, c->rlen, &c->resp, (int64_t)time(NULL));
            if (h < 0) {
                uc_fail(c, UP_FAIL_GARBAGE, "%s answered something that is not an HTTP/1.x response", c->t->name);
                return -1;
            }
            if (h == 0)
                continue;
            if (uc_head(c, h) < 0)
                return -1;
            if (c->state == UC_HEAD)
                continue; /* was an interim response */
        } else if (c->state == UC_BODY) {
            if (uc_body(c) < 0)
                return -1;
            uc_arm(c);
        }
    }
    return 0;
}

static void uc_write(struct up_conn *c)
{
    while (c->woff < c->wlen) {
        ssize_t n = send(c->w.fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR)
                continue;
            int e = errno;
            if (uc_retry_stale(c))
                return;
            uc_fail(c, UP_FAIL_BROKEN, "%s: %s while sending the request", c->t->name, strerror(e));
            return;
        }
        c->woff += (size_t)n;
    }
    c->state = UC_HEAD;
    uc_update_events(c);
}

static void uc_on_event(struct ev_watch *w, uint32_t events)
{
    struct up_conn *c = (struct up_conn *)((char *)w - offsetof(struct up_conn, w));
    if (c->state == UC_IDLE) {
        /* An idle pooled connection has nothing to say: any event means the backend closed it. */
        uc_unlink_idle(c);
        uc_free(c);
        return;
    }
    if (c->state == UC_CONNECTING) {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
            soerr = errno;
        if (soerr) {
            uc_fail(c, UP_FAIL_CONNECT, "connect to %s: %s", c->t->name, strerror(soerr));
            return;
        }
        if (!(events & (EPOLLOUT | EPOLLIN | EPOLLHUP | EPOLLERR)))
            return;
        c->state = UC_SENDING;
        uc_arm(c);
    }
    if (c->state == UC_SENDING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        uc_write(c);
        return; /* c may be gone; reading waits for EPOLLIN */
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        if (c->paused && (events & (EPOLLHUP | EPOLLERR))) {
            /* Hang-ups are reported even with no event asked for: read on despite the pause rather than
             * spin on a level-triggered event (the owner gets the last bytes a little early). */
            c->paused = false;
            uc_read(c);
            return;
        }
        if (!c->paused)
            uc_read(c);
    }
}

static void uc_on_timer(struct ev_timer *t)
{
    struct up_conn *c = (struct up_conn *)((char *)t - offsetof(struct up_conn, timer));
    switch (c->state) {
    case UC_IDLE:
        uc_unlink_idle(c);
        uc_free(c);
        return;
    case UC_CONNECTING:
        uc_fail(c, UP_FAIL_TIMEOUT, "connect to %s timed out after %d ms", c->t->name, c->to.connect_ms);
        return;
    case UC_SENDING:
    case UC_HEAD:
        uc_fail(c, UP_FAIL_TIMEOUT, "%s sent no response head within %d ms", c->t->name, c->to.head_ms);
        return;
    case UC_BODY:
        uc_fail(c, UP_FAIL_TIMEOUT, "%s sent nothing for %d ms in the middle of the response", c->t->name,
                c->to.idle_ms);
        return;
    }
}

/* ---- API ------------------------------------------------------------------------------------------- */

struct up_conn *up_request(struct evloop *l, struct up_target *t, const char *req, size_t len,
                           const struct up_timeouts *to, const struct up_callbacks *cb, void *arg, char *err)
{
    char *copy = malloc(len ? len : 1);
    if (!copy) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(copy, req, len);
    struct up_conn *c = t->idle;
    if (c) {
        t->idle = c->next_idle;
        t->n_idle--;
        c->next_idle = NULL;
        c->reused = true;
        c->state = UC_SENDING;
    } else {
        c = calloc(1, sizeof *c);
        if (!c) {
            free(copy);
            err_set(err, ERR_NOMEM, "out of memory");
            return NULL;
        }
        c->l = l;
        c->t = t;
        c->w.fd = -1;
        ev_timer_init(&c->timer, uc_on_timer);
        t->n_open++;
        if (uc_socket(c, err) < 0) {
            free(copy);
            t->n_open--;
            free(c);
            return NULL;
        }
    }
    c->wbuf = copy;
    c->wlen = len;
    c->woff = 0;
    c->rlen = 0;
    c->to = *to;
    c->cb = *cb;
    c->arg = arg;
    c->paused = c->cancelled = c->got_bytes = c->retried = false;
    c->in_cb = 0;
    c->t_start = c->t_last = evloop_now_ms();
    if (c->state == UC_SENDING) {
        /* A pooled connection is connected: write now rather than a loop turn later. The whole request
         * usually goes at once, and the epoll mask then stays as it was while pooled (no epoll_ctl). A
         * failure is left to the event path (EPOLLOUT/EPOLLERR), which reports it or retries a stale
         * connection from the loop, never inside this call. */
        ssize_t n = send(c->w.fd, c->wbuf, c->wlen, MSG_NOSIGNAL);
        if (n > 0)
            c->woff = (size_t)n;
        if (c->woff == c->wlen)
            c->state = UC_HEAD;
    }
    uc_update_events(c);
    uc_arm(c);
    return c;
}

void up_cancel(struct up_conn *c)
{
    if (!c)
        return;
    if (c->in_cb) {
        c->cancelled = true;
        return;
    }
    uc_free(c);
}

void up_pause(struct up_conn *c, bool paused)
{
    if (c->paused == paused)
        return;
    c->paused = paused;
    if (!paused)
        c->t_last = evloop_now_ms();
    uc_update_events(c);
    uc_arm(c);
    /* Bytes read before the pause may already hold whole events: the owner handles them as it resumes
     * (they were handed over before pausing), so nothing is pending here. */
}

bool up_conn_reused(const struct up_conn *c) { return c->reused; }

void up_target_close_idle(struct evloop *l, struct up_target *t)
{
    (void)l;
    while (t->idle) {
        struct up_conn *c = t->idle;
        t->idle = c->next_idle;
        t->n_idle--;
        uc_free(c);
    }
}
