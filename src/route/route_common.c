/*
 * route_common: what every part of the router shares and that depends on none of them: latency histogram
 * buckets, the router's random numbers, reference counts of configs and tables, status counting, OpenAI-shaped
 * error answers, and whether a backend may be picked. route.c (wiring), route_proxy.c and route_metrics.c
 * all sit above it, so no two of them call each other in a circle.
 */
#include "core/err.h"
#include "core/log.h"
#include "route/route_internal.h"
#include "route/route_policy.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double rt_hist_bounds[RT_HIST_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                0.25,   0.5,   1,      2.5,   5,    10,    30,    120, 300, 600};

void rt_hist_observe(struct rt_hist *h, double seconds)
{
    if (!(seconds >= 0))
        seconds = 0;
    int b = 0;
    while (b < RT_HIST_BUCKETS && seconds > rt_hist_bounds[b])
        b++;
    h->counts[b]++;
    h->sum += seconds;
    h->count++;
}

uint64_t rt_rand(struct router *r) { return route_rand(&r->rng); }

/* ---- configs, plans, tables ------------------------------------------------------------------------ */

struct rt_conf *rt_conf_ref(struct rt_conf *k)
{
    atomic_fetch_add(&k->refs, 1);
    return k;
}

void rt_conf_unref(struct rt_conf *k)
{
    if (k && atomic_fetch_sub(&k->refs, 1) == 1) {
        route_config_deinit(&k->c);
        free(k);
    }
}

static void route_free(struct rt_route *rt)
{
    free(rt->model);
    free(rt->pool);
    free(rt->weight);
    free(rt->names);
    free(rt->swrr);
    free(rt->fallback);
    free(rt->sticky_header);
}

void rt_table_unref(struct rt_table *t)
{
    if (!t || --t->refs > 0)
        return;
    for (int i = 0; i < t->n_pools; i++)
        free(t->pools[i].b);
    free(t->pools);
    for (int i = 0; i < t->n_routes; i++)
        route_free(&t->routes[i]);
    free(t->routes);
    rt_conf_unref(t->conf);
    free(t);
}

/* ---- responses ------------------------------------------------------------------------------------- */

void rt_count_status(struct router *r, int status)
{
    int k = status / 100;
    if (k >= 1 && k <= 5)
        r->m_status[k]++;
}

void rt_respond_errorv(struct router *r, struct http_conn *c, int status, const char *type, const char *code,
                       const char *param, const char *extra_headers, const char *fmt, va_list ap)
{
    (void)r;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!body) {
        http_respond(c, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    http_respond(c, status, "application/json", extra_headers, body, strlen(body));
    free(body);
}

void rt_respond_error(struct router *r, struct http_conn *c, int status, const char *type, const char *code,
                      const char *param, const char *extra_headers, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_respond_errorv(r, c, status, type, code, param, extra_headers, fmt, ap);
    va_end(ap);
}

/* ---- backends: availability, load, passive health ------------------------------------------------- */

bool rt_backend_available(const struct rt_backend *b, int64_t now)
{
    if (!b->up)
        return false;
    if (b->ejected_until && now < b->ejected_until)
        return false;
    if (b->half_open && b->probe_inflight)
        return false;
    return true;
}
