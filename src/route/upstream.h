/*
 * upstream: a non-blocking HTTP/1.1 client for the router's backends, on the router's event loop.
 *
 * One struct up_conn carries one request at a time (no pipelining). The caller hands a complete request
 * (head and body) and gets callbacks: on_head once the status line and headers are in, on_body for each run
 * of decoded body bytes (Content-Length, chunked or read-until-close bodies; the chunked framing is
 * removed), then exactly one of on_done (the response is complete) or on_fail (connect error, timeout, the
 * connection closed or reset before the response was complete, or bytes that are not HTTP). A response that
 * completes on a keep-alive connection returns the connection to its target's idle list, the pool that
 * later requests to the same backend reuse.
 *
 * A pooled connection the backend closed while it sat idle is noticed when it turns readable (and dropped);
 * one it closes just as a request is written to it fails before any response byte: the request is then
 * sent once more on a fresh connection, silently, since the backend cannot have seen it.
 *
 * Callbacks may call up_cancel on their own connection and start other requests; nothing of the
 * connection is touched after a callback that ended its exchange.
 *
 * Threading: I/O thread only.
 */
#ifndef WAFER_ROUTE_UPSTREAM_H
#define WAFER_ROUTE_UPSTREAM_H

#include "route/evloop.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define UP_MAX_HEAD 65536 /* response header block limit */

struct up_conn;

/* One backend address and its idle keep-alive connections. Embedded in the router's backend record. */
struct up_target {
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char name[128];        /* "host:port" for messages */
    struct up_conn *idle;  /* most recently used first */
    int n_idle;
    int max_idle;          /* idle connections kept (default 64 when 0) */
    int n_open;            /* connections open to it, busy or idle */
};

struct up_response {
    int status;
    int minor_version;
    int64_t content_length; /* -1 when absent */
    bool chunked;
    bool keep_alive;        /* the connection may carry another request after this one */
    int64_t retry_after_ms; /* Retry-After in ms, -1 when absent or unreadable */
    char content_type[128]; /* "" when absent */
};

enum up_fail {
    UP_FAIL_CONNECT = 1, /* could not connect (refused, unreachable) */
    UP_FAIL_TIMEOUT,     /* connect, response head or body idle timeout */
    UP_FAIL_BROKEN,      /* closed or reset before the response was complete */
    UP_FAIL_GARBAGE,     /* the bytes are not an HTTP/1.x response */
};

struct up_callbacks {
    void (*on_head)(void *arg, const struct up_response *r);
    void (*on_body)(void *arg, const char *data, size_t len);
    void (*on_done)(void *arg);
    /* head_seen: on_head was called before the failure. */
    void (*on_fail)(void *arg, enum up_fail kind, bool head_seen, const char *msg);
};

struct up_timeouts {
    int connect_ms; /* to establish the TCP connection */
    int head_ms;    /* from the start of the request to the complete response head */
    int idle_ms;    /* the longest silence while reading the body */
};

/* Parses a response head in buf[0..len). Returns the head length (> 0), 0 when more bytes are needed, or
 * ERR_FORMAT (not HTTP, or a bad header) / ERR_TOO_LARGE (over UP_MAX_HEAD). now is the wall clock for an
 * HTTP-date Retry-After. Pure (tested and fuzzable). */
int up_parse_head(const char *buf, size_t len, struct up_response *r, int64_t now_unix);

/* Sends req[0..len) (a complete HTTP/1.1 request, copied) to t on a pooled or new connection. Returns the
 * connection, whose callbacks start on later loop turns, or NULL with a message in err (ERR_MSG_MAX) when no
 * socket could be opened (the caller treats that as a connect failure). */
struct up_conn *up_request(struct evloop *l, struct up_target *t, const char *req, size_t len,
                           const struct up_timeouts *to, const struct up_callbacks *cb, void *arg, char *err);

/* Ends the exchange now: the connection is closed (never pooled) and no callback follows. */
void up_cancel(struct up_conn *c);

/* Backpressure: a paused connection reads nothing (and its idle timeout stops) until resumed. */
void up_pause(struct up_conn *c, bool paused);

/* Whether the exchange ran on a connection that carried an earlier request. */
bool up_conn_reused(const struct up_conn *c);

/* Closes the target's idle connections (reload, shutdown). Busy ones finish on their own. */
void up_target_close_idle(struct evloop *l, struct up_target *t);

#endif
