/*
 * http: wafer's HTTP/1.1 server: one I/O thread running an epoll loop, a zero-copy request parser, and
 * connections that are watched in every phase (a client that goes away is noticed at once, even while its
 * request is being processed, and the handler's on_close hook cancels the work). It lives in core, below every
 * layer that speaks HTTP, and knows nothing of models or routes.
 *
 * Features: keep-alive, Content-Length request bodies (413 past max_body; 503 with Retry-After when the
 * bodies in flight over all connections would pass a shared budget), `Expect: 100-continue`, chunked
 * responses and server-sent events, header and body read timeouts, a connection limit, write backpressure
 * (a slow reader's output is buffered up to a bound while other connections keep being served), answers
 * handed over without a copy (http_respond_take). HTTP/1.1 requests without exactly one Host header get
 * 400 (RFC 9112, section 3.2). Requests with Transfer-Encoding: chunked bodies get 501 (not supported), with
 * a JSON error. Every error the layer answers itself is reported to on_error (for metrics and logs).
 *
 * Threading: every function here runs on the I/O thread, except http_server_wake() and
 * http_server_stop() (any thread). Work done elsewhere (the engine thread) hands results back by queueing
 * them and calling http_server_wake(); the loop then calls on_wake on the I/O thread.
 */
#ifndef WAFER_CORE_HTTP_H
#define WAFER_CORE_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct budget;

#define HTTP_MAX_HEADERS 64

struct http_header {
    const char *name; /* points into the connection's read buffer; valid until the response ends */
    size_t name_len;
    const char *value;
    size_t value_len;
};

struct http_request {
    const char *method;
    size_t method_len;
    const char *path; /* without the query string */
    size_t path_len;
    const char *query; /* after '?', or NULL */
    size_t query_len;
    int minor_version; /* HTTP/1.x */
    struct http_header headers[HTTP_MAX_HEADERS];
    int n_headers;
    const char *body; /* complete body (Content-Length bytes), NUL-terminated for convenience */
    size_t body_len;
    bool keep_alive;
};

/* *content_length from http_parse_request when the request has a Transfer-Encoding header: the body is not
 * delimited by Content-Length and the server answers 501 (bodies with transfer codings are not supported). */
#define HTTP_BODY_TRANSFER_ENCODED (-2)

/* Parser (pure function, fuzzed): parses the request line and headers from buf[0..len).
 * Returns the header block length (> 0) when complete, 0 when more bytes are needed, or a negative ERR_*
 * code (ERR_FORMAT malformed, ERR_TOO_LARGE too many headers) with a message in err (may be NULL).
 * *content_length gets the declared body length (-1 when absent, HTTP_BODY_TRANSFER_ENCODED when a
 * Transfer-Encoding header is present); header pointers point into buf. Sets keep_alive from the version
 * (1.1: on, 1.0: off) and the Connection header; body is left NULL (the server fills it in). */
int http_parse_request(const char *buf, size_t len, struct http_request *req, int64_t *content_length,
                       char *err);

/* Case-insensitive header lookup; NULL when absent. */
const struct http_header *http_request_header(const struct http_request *req, const char *name);

struct http_conn;   /* opaque: one client connection */
struct http_server; /* opaque */

struct http_server_params {
    const char *host;             /* default "127.0.0.1" */
    int port;                     /* 0 picks a free port (see http_server_port) */
    int max_connections;          /* default 1024; past it new connections get 503 and are closed */
    size_t max_header_bytes;      /* default 16 KiB -> 431 */
    size_t max_body_bytes;        /* default 8 MiB -> 413 */
    int header_timeout_ms;        /* time to receive the full header block (default 10000) -> 408 */
    int body_timeout_ms;          /* time to receive the body (default 30000) -> 408 */
    int idle_timeout_ms;          /* keep-alive idle (default 60000) */
    size_t max_output_buffer;     /* per connection bytes queued before the handler is told to wait
                                   * (default 1 MiB); on_writable fires once below half of it */
    struct budget *body_budget;   /* request bodies in flight over all connections, counted from the header
                                   * block until the response ends: a body that does not fit gets 503 with
                                   * Retry-After before it is read. NULL: no shared bound. Must outlive the
                                   * server. */
    /* Called on the I/O thread for each complete request. The handler answers now (http_respond) or later
     * (keeps the conn, answers from on_wake); it may stream (http_stream_*). req and everything it points
     * to stay valid until the response ends; req->body is never NULL (empty string when there is none). */
    void (*on_request)(void *ctx, struct http_conn *c, const struct http_request *req);
    /* Called when a connection with an unfinished response is closed by the peer or an error (the handler
     * cancels the work tied to it). The conn must not be used after this returns. Also called for requests
     * still unanswered when the drain of http_server_stop ends, and when the client stops reading a response
     * for idle_timeout_ms. A client that half-closes (shutdown(SHUT_WR)) after its request counts as gone. */
    void (*on_close)(void *ctx, struct http_conn *c);
    /* Called on the I/O thread after http_server_wake() from any thread. */
    void (*on_wake)(void *ctx);
    /* Called on the I/O thread when a streaming connection's output buffer drained below half its bound. */
    void (*on_writable)(void *ctx, struct http_conn *c);
    /* Optional: the body limit of one request, decided from its header block (e.g. a larger one for an
     * upload route); 0 means max_body_bytes. Called on the I/O thread before the body is read. */
    size_t (*body_limit)(void *ctx, const struct http_request *req);
    /* Called on the I/O thread for every error the layer answers itself (400 malformed or no Host, 408,
     * 413, 431, 501, 503), with the peer ("ip:port") and the message sent; may be NULL. */
    void (*on_error)(void *ctx, const char *peer, int status, const char *message);
    void *ctx;
};

/* A file descriptor of the handler's own (a proxy's upstream socket, a timerfd) in the server's epoll set, so
 * that its events come out of the same epoll_wait as the clients' (no nested loop: one wake-up and one
 * system call less per event). Embedded in its owner; fn runs on the I/O thread with the ready events. */
struct http_watch {
    void (*fn)(struct http_watch *w, uint32_t events);
};

/* Fills the defaults above (port 8080). In a params struct given to http_server_create, a zero numeric
 * field also means its default. */
void http_server_params_default(struct http_server_params *p);

/* Binds and listens. NULL and a message on failure (port in use, bad host). Caller frees with
 * http_server_destroy. */
struct http_server *http_server_create(const struct http_server_params *p, char *err);
void http_server_destroy(struct http_server *s);
int http_server_port(const struct http_server *s);

/* Runs the loop until http_server_stop(). Returns 0, or a negative error. */
int http_server_run(struct http_server *s);
/* Stops accepting; the loop returns once no response is in flight or after drain_ms (any thread). */
void http_server_stop(struct http_server *s, int drain_ms);
/* Wakes the loop to call on_wake (any thread; async-signal-safe). */
void http_server_wake(struct http_server *s);
/* epoll_ctl(op: EPOLL_CTL_ADD, _MOD or _DEL) of fd for events, w as its tag. I/O thread only (or before
 * http_server_run). After _DEL, w gets no more calls, none from the batch being handled either, so its owner
 * may free it at once (also when _DEL fails because fd was closed already). 0 or ERR_IO (errno set). */
int http_server_watch_ctl(struct http_server *s, int op, int fd, uint32_t events, struct http_watch *w);
/* Open connections, for metrics. */
int http_server_connections(const struct http_server *s);

/* Per-connection user data (the handler's request object). Reset to NULL before each on_request. */
void http_conn_set_data(struct http_conn *c, void *data);
void *http_conn_data(const struct http_conn *c);
/* Peer address "ip:port" for logs. */
const char *http_conn_peer(const struct http_conn *c);
/* Keeps c's memory, and so the request it is handling (headers, body), valid after the connection closes,
 * until the matching http_conn_release: for a handler that reads the request on another thread. on_close
 * still comes when the client leaves (the conn must then not be answered), but the request stays readable.
 * Holds nest. I/O thread only; a conn still held when the server is destroyed is freed with it. */
void http_conn_hold(struct http_conn *c);
void http_conn_release(struct http_conn *c);

/* A complete response. headers is "Name: value\r\n" lines (or NULL); Content-Length and Connection are
 * added. After this the conn belongs to the server again. Returns 0 or a negative error. */
int http_respond(struct http_conn *c, int status, const char *content_type, const char *headers,
                 const char *body, size_t body_len);
/* http_respond for a body built elsewhere: takes body (malloc'd; the server frees it once written or when
 * the connection closes, and on failure), and sends it without copying it. */
int http_respond_take(struct http_conn *c, int status, const char *content_type, const char *headers, char *body,
                      size_t body_len);
/* Streaming: chunked transfer encoding (SSE when content_type is "text/event-stream": adds
 * "Cache-Control: no-cache"). To an HTTP/1.0 client the body is sent raw and ends with a close. Writes are
 * always queued (never refused for size): the handler keeps http_conn_pending() under max_output_buffer and
 * resumes from on_writable. After http_stream_end the conn belongs to the server again.
 * Calling a response function on a conn whose response already ended returns ERR_INVALID_ARG. */
int http_stream_begin(struct http_conn *c, int status, const char *content_type, const char *headers);
int http_stream_write(struct http_conn *c, const char *data, size_t len);
int http_stream_end(struct http_conn *c);
/* Ends a stream that failed midway: what is queued is still sent, then the connection is closed without the
 * terminating chunk, so the client sees a truncated response rather than a complete one. After this the
 * conn belongs to the server again (like http_stream_end). */
int http_stream_abort(struct http_conn *c);
/* Bytes queued for this conn and not yet written (backpressure: stop producing above max_output_buffer). */
size_t http_conn_pending(const struct http_conn *c);

/* Reason phrase of a status ("Not Found"). */
const char *http_status_text(int status);

#endif
