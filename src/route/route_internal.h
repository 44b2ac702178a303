/*
 * route_internal: what the files of the router share (route.c wiring and endpoints, route_proxy.c the life
 * of a proxied request, route_health.c active checks, route_metrics.c the /metrics text). Everything here
 * runs on the I/O thread, except the plan hand-over (route.c), which goes through one atomic pointer.
 *
 * Objects:
 *   rt_backend  one address of a backend: its connection pool, health, circuit breaker, load and counters.
 *               Backends live in the router's registry for the router's lifetime, keyed by pool kind,
 *               URL and address, so a reload keeps the state of backends that stay; those that left are
 *               only marked unused (no checks, not chosen).
 *   rt_table    the routing table built from one config: pools (lists of backends) and routes (model ->
 *               split, fallback, sticky). Refcounted: a request holds the table it started with, so a reload
 *               swaps tables under requests in flight without disturbing them.
 *   rt_req      one proxied client request (route_proxy.c).
 */
#ifndef WAFER_ROUTE_ROUTE_INTERNAL_H
#define WAFER_ROUTE_ROUTE_INTERNAL_H

#include "route/evloop.h"
#include "route/route.h"
#include "route/route_cache.h"
#include "route/route_config.h"
#include "route/route_limits.h"
#include "route/route_rcache.h"
#include "route/upstream.h"
#include "core/clock.h"
#include "core/http.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define RT_MAX_ADDRS 16        /* addresses kept per backend host name */
#define RT_MAX_TRIED 16        /* attempts remembered per request (log line) */
#define RT_HIST_BUCKETS 18
#define RT_SHARE_RING 11       /* seconds of per-backend attempt counts kept for the dashboard's shares, + 1 */

/* Kinds of backend failure, as counted in wafer_route_backend_errors_total{kind}. */
enum rt_err_kind { RT_ERR_CONNECT, RT_ERR_TIMEOUT, RT_ERR_5XX, RT_ERR_429, RT_ERR_BROKEN, RT_ERR_GARBAGE, RT_ERR_COUNT_ };

/* Kinds of client answers refused by the router itself (wafer_route_limited_total{kind}). */
enum rt_limit_kind { RT_LIM_AUTH, RT_LIM_RPM, RT_LIM_TPM, RT_LIM_CONCURRENT, RT_LIM_COUNT_ };

struct rt_hist {
    uint64_t counts[RT_HIST_BUCKETS + 1];
    double sum;
    uint64_t count;
};
extern const double rt_hist_bounds[RT_HIST_BUCKETS];
void rt_hist_observe(struct rt_hist *h, double seconds);

struct router;

struct rt_backend {
    struct router *r;
    struct up_target target; /* address and keep-alive pool */
    char url[300];           /* as configured */
    char label[300];         /* metrics/log name: host:port, plus /address when the host is a name */
    char host_header[300];
    char prefix[256];        /* path prefix from the URL */
    bool wafer;              /* kind wafer: /metrics load, token ids for resume */
    bool in_use;             /* part of the current table */

    /* health (active checks) */
    bool up;                 /* last check passed (true until one fails) */
    bool checked;
    /* circuit breaker (passive) */
    int consecutive_failures;
    int ejections;           /* ejections in a row: the cooldown doubles with each */
    int64_t ejected_until;   /* ms; the circuit is open before it */
    bool half_open;          /* after the cooldown: one probe request decides */
    bool probe_inflight;
    int successes_after;     /* successes since the circuit closed (resets ejections at 10) */

    /* load */
    int inflight;            /* requests of this router on it now */
    int64_t reported_load;   /* running + waiting from its /metrics; -1 unknown */
    int inflight_at_report;  /* our own share of that report */

    /* active check machinery (route_health.c) */
    struct ev_timer health_timer;
    struct up_conn *probe;
    int probe_step;
    int probe_status;
    char *probe_body;
    size_t probe_len, probe_cap;
    json_t *models;          /* the "data" array of its /v1/models, or NULL */

    /* counters */
    uint64_t m_requests;                /* attempts sent */
    uint64_t m_responses[6];            /* by status class 1xx..5xx; [0] unused */
    uint64_t m_errors[RT_ERR_COUNT_];
    uint64_t m_ejections;
    struct rt_hist ttfb;                /* request start to the response head */
    uint64_t share_requests[RT_SHARE_RING]; /* m_requests and failures at each of the last seconds */
    uint64_t share_failures[RT_SHARE_RING]; /* (route_observe.c) */

    struct rt_backend *next; /* registry */
};

struct rt_pool {
    char *name;
    struct rt_backend **b; /* [n] */
    int n;
    bool wafer;
};

struct rt_route {
    char *model;
    int *pool;             /* [n_split] pool indexes */
    double *weight;        /* [n_split] */
    const char **names;    /* [n_split] pool names (sticky hash seeds) */
    int64_t *swrr;         /* [n_split] smooth weighted round robin state */
    int n_split;
    int *fallback;         /* [n_fallback] pool indexes */
    int n_fallback;
    enum route_sticky sticky;
    char *sticky_header;
};

/* A config with a reference count: the main thread's plan and the I/O thread's tables share it. */
struct rt_conf {
    atomic_int refs;
    struct route_config c;
};
struct rt_conf *rt_conf_ref(struct rt_conf *k);
void rt_conf_unref(struct rt_conf *k);

/* Addresses a backend URL resolved to (done on the main thread: getaddrinfo blocks). */
struct rt_resolved {
    char host[256];
    int port;
    char prefix[256];
    int n;
    struct sockaddr_storage addr[RT_MAX_ADDRS];
    socklen_t addr_len[RT_MAX_ADDRS];
};

/* What the main thread hands to the I/O thread: a config and the resolution of every pool URL. */
struct rt_plan {
    struct rt_conf *conf;
    struct rt_resolved **urls; /* [n_pools][pools[i].n_urls] */
    bool from_reload;          /* a new file (splits from the file) rather than a DNS refresh */
};
void rt_plan_free(struct rt_plan *p);

struct rt_table {
    int refs;
    struct rt_conf *conf;
    struct rt_pool *pools;
    int n_pools;
    struct rt_route *routes;
    int n_routes;
};
void rt_table_unref(struct rt_table *t);

struct rt_req;
struct rt_observe;
struct rt_models;
struct strbuf;
struct route_models_config;

struct router {
    struct http_server *http;
    struct evloop *loop;
    struct rt_table *table;        /* current */
    _Atomic(struct rt_plan *) pending; /* posted by the main thread */
    struct rt_backend *backends;   /* registry */
    struct route_cache *cache;     /* NULL: off (or shared in Redis) */
    struct route_rcache *rcache;   /* the shared cache (cache.url), or NULL */
    struct route_limits *limits;   /* NULL: no keys */
    uint64_t limits_gen;           /* bumped when limits is replaced (a reload renumbers the keys) */
    struct rt_req *reqs;           /* in flight */
    int n_reqs;
    struct rt_req *spare_reqs;     /* finished, kept for reuse (a few KiB each: one malloc fewer per request) */
    int n_spare_reqs;
    uint64_t rng;
    uint64_t next_id;
    bool stopping;

    /* counters (wafer_route_*) */
    uint64_t m_status[6];          /* client answers by status class */
    uint64_t m_requests;
    uint64_t m_retries, m_fallbacks, m_resumes_ok, m_resumes_failed, m_stream_errors;
    uint64_t m_cache_hits, m_cache_misses, m_cache_bypass;
    uint64_t m_cache_unavailable;  /* the shared cache could not be asked: bypassed */
    uint64_t m_limited[RT_LIM_COUNT_];
    uint64_t m_no_backend;         /* 503: nothing available */
    uint64_t m_reloads, m_reload_errors;
    struct rt_hist duration;       /* client request start to the last byte handed over */
    struct rt_hist ttfb;           /* client request start to the first byte handed over */
    struct rt_observe *observe;    /* alert rules, notifications, the dashboard's data (route_observe.c) */
    struct rt_models *models;      /* the model manager of `wafer serve` in models mode; NULL otherwise */
};

/* ---- route.c ---- */
/* route_run, and with mc (not NULL) models mode: the manager of route_models.h on r's first pools. */
int rt_run(struct route_config *cfg, struct route_models_config *mc);
/* A uniform random number (I/O thread). */
uint64_t rt_rand(struct router *r);
/* Answers an OpenAI-shaped error {"error":{"message","type","param","code"}}; extra header lines may be
 * NULL. */
void rt_respond_error(struct router *r, struct http_conn *c, int status, const char *type, const char *code,
                      const char *param, const char *extra_headers, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
void rt_respond_errorv(struct router *r, struct http_conn *c, int status, const char *type, const char *code,
                       const char *param, const char *extra_headers, const char *fmt, va_list ap);
/* Counts a proxied request's answer in wafer_route_requests_total. */
void rt_count_status(struct router *r, int status);

/* ---- route_models.c ---- */
/* A free loopback port (bound and released; a child binds it a moment later). -1 on failure. */
int rt_models_free_port(void);

/* ---- route_proxy.c ---- */
enum rt_endpoint { RT_EP_COMPLETIONS, RT_EP_CHAT };
void rt_proxy_start(struct router *r, struct http_conn *c, const struct http_request *req, enum rt_endpoint ep);
void rt_proxy_on_close(struct router *r, struct rt_req *q);
void rt_proxy_on_writable(struct router *r, struct rt_req *q);
/* At shutdown: ends every request in flight (their clients are not answered) and frees the spare structs. */
void rt_proxy_cancel_all(struct router *r);
/* Whether b may be given a request now (active health check, circuit breaker). */
bool rt_backend_available(const struct rt_backend *b, int64_t now);
/* Passive health: the outcome of one request on b. */
void rt_backend_success(struct router *r, struct rt_backend *b);
void rt_backend_failure(struct router *r, struct rt_backend *b, enum rt_err_kind kind);

/* Models mode: q may go upstream now (its model is loaded), or is refused with an OpenAI-shaped error (the
 * request ends). Called by the model manager for requests it held. */
void rt_proxy_go(struct rt_req *q);
void rt_proxy_refuse(struct rt_req *q, int status, const char *code, int retry_after_s, const char *msg);

/* ---- route_models.c (models mode) ---- */
/* The manager for the first c->n_models pools of r's table (pool i is model i); takes c's contents. It
 * hands held requests on through hooks (route_proxy.c's, given by route.c: the proxy calls the manager, so
 * the manager must not call the proxy by name). NULL with a message in err. Its tick starts on r's loop. */
struct rt_models_hooks {
    void (*go)(struct rt_req *q);     /* rt_proxy_go */
    void (*refuse)(struct rt_req *q, int status, const char *code, int retry_after_s, const char *msg);
};
struct rt_models *rt_models_create(struct router *r, struct route_models_config *c,
                                   const struct rt_models_hooks *hooks, char *err);
/* Stops every child (SIGTERM, SIGKILL after a grace). I/O thread, once
 * the HTTP server has stopped (the children die with the thread that forked them). */
void rt_models_shutdown(struct router *r);
void rt_models_destroy(struct rt_models *mm);
/* A request for pool: true when the manager took it (it waits for the load, or was refused), false when
 * it may go upstream now. Either way it counts as the model's until rt_models_release. */
bool rt_models_hold(struct router *r, struct rt_req *q, int pool);
void rt_models_release(struct router *r, struct rt_req *q, int pool);
/* The endpoints of models mode (/v1/models, /ready, /admin/...): true when req was answered. */
bool rt_models_request(struct router *r, struct http_conn *c, const struct http_request *req);
/* The configured names and aliases, comma separated, for a 404. */
void rt_models_not_found(struct router *r, char *out, size_t cap);
/* Appends the wafer_models_* metrics. */
void rt_models_metrics(struct router *r, struct strbuf *b);

/* ---- route_health.c ---- */
/* Starts (or keeps) the periodic checks of every backend in use; stops those of unused ones. */
void rt_health_sync(struct router *r);
void rt_health_stop(struct router *r, struct rt_backend *b);

/* ---- route_metrics.c ---- */
/* The Prometheus text of every wafer_route_* metric; caller frees. NULL on OOM. */
char *rt_metrics_render(struct router *r, size_t *len);

#endif
