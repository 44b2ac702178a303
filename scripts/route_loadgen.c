/*
 * route_loadgen: an open-loop HTTP/1.1 load generator for the wafer route benchmark (scripts/bench_route.py,
 * `make bench-route`). One thread, epoll, keep-alive connections, no libraries: it must reach a few thousand
 * requests/s on one core while the router and the backend share the same two cores.
 *
 * Open loop: request i is due at start + i / rate (a fixed rate), whether or not earlier ones were answered;
 * it goes out on an idle keep-alive connection (a new one is opened when none is idle, up to --conns; past
 * that it waits). Its latency counts from when it was due, not from when it left, so a stall of the client,
 * the router or the backend is counted in full (no coordinated omission). The first body byte of each
 * answer is timed too (a stream's first event).
 *
 * --idle N first opens N more connections that each send one GET /health and then stay open and silent
 * during the run; at the end each sends a second GET /health, and the JSON says how many answered.
 *
 * Output: one JSON line {"sent", "ok", "errors", "rate", "p50_ms", "p90_ms", "p99_ms", "max_ms",
 * "ttfb_p50_ms", "ttfb_p99_ms", "conns", "idle", "idle_ok"}.
 *
 * Build: cc -O2 -o route_loadgen scripts/route_loadgen.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

struct conn {
    int fd;
    bool idle_kind;   /* one of the --idle connections */
    bool busy;        /* a request is out */
    bool connected;
    const char *out;  /* what is left to send */
    size_t out_len;
    char *in;
    size_t in_len, in_cap;
    size_t head_len;  /* 0 until the header block is complete */
    long long clen;   /* -1: chunked */
    size_t chunk_pos; /* chunked: where the next chunk header starts */
    int status;
    int64_t due, first_byte;
    struct conn *next_free;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct sockaddr_in g_addr;
static int g_ep;
static char *g_req, *g_health;
static size_t g_req_len, g_health_len;
static struct conn *g_free;       /* idle keep-alive connections for the measured load */
static int g_conns, g_max_conns;
static int64_t *g_lat, *g_ttfb;
static int g_n_lat, g_n_ttfb, g_errors, g_inflight;
static int g_idle_waiting;        /* --idle connections whose GET /health is out */
static int g_idle_ok;

static void die(const char *m)
{
    perror(m);
    exit(2);
}

static void conn_arm(struct conn *c)
{
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | (c->out_len || !c->connected ? EPOLLOUT : 0),
                            .data.ptr = c};
    if (epoll_ctl(g_ep, EPOLL_CTL_MOD, c->fd, &e) < 0)
        die("epoll_ctl");
}

static struct conn *conn_open(bool idle_kind)
{
    struct conn *c = calloc(1, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&g_addr, sizeof g_addr) < 0 && errno != EINPROGRESS)
        die("connect");
    c->idle_kind = idle_kind;
    struct epoll_event e = {.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(g_ep, EPOLL_CTL_ADD, c->fd, &e) < 0)
        die("epoll_ctl");
    return c;
}

static void conn_send(struct conn *c, const char *req, size_t len, int64_t due)
{
    c->busy = true;
    c->out = req;
    c->out_len = len;
    c->in_len = c->head_len = c->chunk_pos = 0;
    c->first_byte = 0;
    c->due = due;
    if (c->connected) {
        ssize_t n = write(c->fd, c->out, c->out_len);
        if (n > 0) {
            c->out += n;
            c->out_len -= (size_t)n;
        }
    }
    conn_arm(c);
}

/* 1: the response is complete, 0: not yet, -1: malformed. */
static int resp_complete(struct conn *c)
{
    if (!c->head_len) {
        char *e = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (!e)
            return 0;
        c->head_len = (size_t)(e - c->in) + 4;
        c->in[c->head_len - 1] = 0;
        if (sscanf(c->in, "HTTP/1.%*d %d", &c->status) != 1)
            return -1;
        c->clen = 0;
        char *cl = strcasestr(c->in, "\ncontent-length:");
        if (cl)
            c->clen = atoll(cl + 16);
        else if (strcasestr(c->in, "\ntransfer-encoding: chunked"))
            c->clen = -1;
        c->in[c->head_len - 1] = '\n';
        c->chunk_pos = c->head_len;
    }
    if (!c->first_byte && c->in_len > c->head_len)
        c->first_byte = now_ns();
    if (c->clen >= 0)
        return c->in_len - c->head_len >= (size_t)c->clen;
    for (;;) { /* chunked: walk the chunk headers */
        char *p = c->in + c->chunk_pos;
        size_t left = c->in_len - c->chunk_pos;
        char *nl = memmem(p, left, "\r\n", 2);
        if (!nl)
            return 0;
        long long sz = strtoll(p, NULL, 16);
        size_t need = (size_t)(nl - p) + 2 + (size_t)sz + 2;
        if (left < need)
            return 0;
        c->chunk_pos += need;
        if (sz == 0)
            return 1;
    }
}

static void conn_read(struct conn *c)
{
    for (;;) {
        if (c->in_cap - c->in_len < 16384) {
            c->in_cap = c->in_cap ? c->in_cap * 2 : 32768;
            c->in = realloc(c->in, c->in_cap);
        }
        ssize_t n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len - 1);
        if (n > 0) {
            c->in_len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EAGAIN)
            break;
        /* closed or reset */
        if (c->busy) {
            g_errors++;
            if (c->idle_kind)
                g_idle_waiting--;
            else
                g_inflight--;
        }
        epoll_ctl(g_ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        c->busy = false;
        if (!c->idle_kind)
            g_conns--;
        return; /* leaked on purpose: the run is short */
    }
    if (!c->busy)
        return;
    int rc = resp_complete(c);
    if (rc == 0)
        return;
    int64_t t = now_ns();
    c->busy = false;
    bool ok = rc > 0 && c->status == 200;
    if (c->idle_kind) {
        g_idle_waiting--;
        g_idle_ok += ok;
        return;
    }
    g_inflight--;
    if (ok) {
        g_lat[g_n_lat++] = t - c->due;
        if (c->first_byte)
            g_ttfb[g_n_ttfb++] = c->first_byte - c->due;
    } else {
        g_errors++;
    }
    c->next_free = g_free;
    g_free = c;
}

static void conn_event(struct conn *c, uint32_t ev)
{
    if (c->fd < 0)
        return;
    if (!c->connected && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err) {
            fprintf(stderr, "route_loadgen: connect: %s\n", strerror(err));
            exit(2);
        }
        c->connected = true;
    }
    if (c->connected && c->out_len && (ev & EPOLLOUT)) {
        ssize_t n = write(c->fd, c->out, c->out_len);
        if (n > 0) {
            c->out += n;
            c->out_len -= (size_t)n;
        }
    }
    if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        conn_read(c);
    if (c->fd >= 0 && c->connected && !c->out_len) {
        struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        epoll_ctl(g_ep, EPOLL_CTL_MOD, c->fd, &e);
    }
}

static void pump(int timeout_ms)
{
    struct epoll_event evs[256];
    int n = epoll_wait(g_ep, evs, 256, timeout_ms);
    for (int i = 0; i < n; i++)
        if (evs[i].data.ptr)
            conn_event(evs[i].data.ptr, evs[i].events);
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(int64_t *v, int n, double p)
{
    if (!n)
        return -1;
    int i = (int)(p * (n - 1) + 0.5);
    return (double)v[i] / 1e6;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n)
        die(path);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *path = "/v1/completions", *body_file = NULL;
    int port = 0, idle = 0;
    double rate = 1000, seconds = 5;
    g_max_conns = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: route_loadgen --port P [--host 127.0.0.1] [--path /v1/completions] --body FILE\n"
                   "         [--rate 1000] [--seconds 5] [--conns 256] [--idle N]\n"
                   "Open-loop POSTs at a fixed rate over keep-alive connections; prints one JSON line.\n");
            return 0;
        }
        if (!v) {
            fprintf(stderr, "route_loadgen: %s needs a value (--help)\n", a);
            return 2;
        }
        if (!strcmp(a, "--host"))
            host = v;
        else if (!strcmp(a, "--port"))
            port = atoi(v);
        else if (!strcmp(a, "--path"))
            path = v;
        else if (!strcmp(a, "--body"))
            body_file = v;
        else if (!strcmp(a, "--rate"))
            rate = atof(v);
        else if (!strcmp(a, "--seconds"))
            seconds = atof(v);
        else if (!strcmp(a, "--conns"))
            g_max_conns = atoi(v);
        else if (!strcmp(a, "--idle"))
            idle = atoi(v);
        else {
            fprintf(stderr, "route_loadgen: unknown option %s (--help)\n", a);
            return 2;
        }
        i++;
    }
    if (!port || !body_file || rate <= 0 || seconds <= 0) {
        fprintf(stderr, "route_loadgen: need --port and --body, a rate and seconds above 0 (--help)\n");
        return 2;
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    g_addr.sin_family = AF_INET;
    g_addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &g_addr.sin_addr) != 1) {
        fprintf(stderr, "route_loadgen: --host must be an IPv4 address\n");
        return 2;
    }
    size_t blen;
    char *body = read_file(body_file, &blen);
    g_req = malloc(blen + 512);
    g_req_len = (size_t)sprintf(g_req, "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                                       "Content-Length: %zu\r\n\r\n", path, host, port, blen);
    memcpy(g_req + g_req_len, body, blen);
    g_req_len += blen;
    g_health = malloc(256);
    g_health_len = (size_t)sprintf(g_health, "GET /health HTTP/1.1\r\nHost: %s:%d\r\n\r\n", host, port);
    g_ep = epoll_create1(EPOLL_CLOEXEC);

    /* the idle connections, opened in batches (the listen backlog is finite) */
    struct conn **idles = calloc((size_t)idle + 1, sizeof *idles);
    for (int i = 0; i < idle;) {
        int batch = 0;
        for (; i < idle && batch < 500; i++, batch++) {
            idles[i] = conn_open(true);
            g_idle_waiting++;
            conn_send(idles[i], g_health, g_health_len, now_ns());
        }
        int64_t deadline = now_ns() + 30000000000LL;
        while (g_idle_waiting > 0 && now_ns() < deadline)
            pump(100);
        if (g_idle_waiting > 0) {
            fprintf(stderr, "route_loadgen: %d idle connection(s) got no answer\n", g_idle_waiting);
            return 1;
        }
    }
    int idle_first_ok = g_idle_ok;
    g_idle_ok = 0;

    int total = (int)(rate * seconds);
    g_lat = calloc((size_t)total + 1, sizeof *g_lat);
    g_ttfb = calloc((size_t)total + 1, sizeof *g_ttfb);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event te = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, tfd, &te);
    int64_t start = now_ns() + 20000000; /* 20 ms from now */
    double step = 1e9 / rate;
    int sent = 0;
    int64_t end_deadline = start + (int64_t)(seconds * 1e9) + 10000000000LL;
    while ((sent < total || g_inflight > 0) && now_ns() < end_deadline) {
        int64_t t = now_ns();
        while (sent < total && start + (int64_t)(sent * step) <= t) {
            struct conn *c = g_free;
            if (c) {
                g_free = c->next_free;
            } else if (g_conns < g_max_conns) {
                c = conn_open(false);
                g_conns++;
            } else {
                break; /* every connection is busy: it goes out as soon as one is free, latency still counts */
            }
            conn_send(c, g_req, g_req_len, start + (int64_t)(sent * step));
            g_inflight++;
            sent++;
        }
        if (sent < total && (g_free || g_conns < g_max_conns)) {
            int64_t next = start + (int64_t)(sent * step);
            struct itimerspec its = {0};
            its.it_value.tv_sec = next / 1000000000;
            its.it_value.tv_nsec = next % 1000000000;
            timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        }
        pump(sent < total ? 50 : 100);
        uint64_t x;
        while (read(tfd, &x, sizeof x) > 0) {
        }
    }
    double elapsed = (double)(now_ns() - start) / 1e9;

    /* every idle connection answers a second request */
    for (int i = 0; i < idle; i++)
        if (idles[i]->fd >= 0) {
            g_idle_waiting++;
            conn_send(idles[i], g_health, g_health_len, now_ns());
        }
    int64_t deadline = now_ns() + 30000000000LL;
    while (g_idle_waiting > 0 && now_ns() < deadline)
        pump(100);

    qsort(g_lat, (size_t)g_n_lat, sizeof *g_lat, cmp64);
    qsort(g_ttfb, (size_t)g_n_ttfb, sizeof *g_ttfb, cmp64);
    printf("{\"sent\": %d, \"ok\": %d, \"errors\": %d, \"rate\": %.1f, \"p50_ms\": %.3f, \"p90_ms\": %.3f, "
           "\"p99_ms\": %.3f, \"max_ms\": %.3f, \"ttfb_p50_ms\": %.3f, \"ttfb_p99_ms\": %.3f, \"conns\": %d, "
           "\"idle\": %d, \"idle_first_ok\": %d, \"idle_ok\": %d}\n",
           sent, g_n_lat, g_errors + (sent - g_n_lat - g_errors > 0 ? sent - g_n_lat - g_errors : 0),
           g_n_lat / (elapsed > 0 ? elapsed : 1), pct(g_lat, g_n_lat, 0.5), pct(g_lat, g_n_lat, 0.9),
           pct(g_lat, g_n_lat, 0.99), g_n_lat ? (double)g_lat[g_n_lat - 1] / 1e6 : -1, pct(g_ttfb, g_n_ttfb, 0.5),
           pct(g_ttfb, g_n_ttfb, 0.99), g_conns, idle, idle_first_ok, g_idle_ok);
    return g_errors || g_n_lat != total ? 1 : 0;
}
