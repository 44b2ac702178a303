/*
 * route_health: active checks. Every health.interval_s each backend in use gets, on one (pooled)
 * connection and one after the other:
 *   GET <health.path>   200 marks it up, anything else (or no answer within timeout_ms) down;
 *   GET /metrics        wafer backends only: wafer_requests_running + wafer_requests_waiting, the load the
 *                       least-loaded choice weighs (cheap: counters the server keeps anyway);
 *   GET /v1/models      the models it serves, for the router's /v1/models (the union).
 * Checks never spend tokens. They decide "up"; the circuit breaker (passive ejection with a growing
 * cooldown and a half-open probe, route_proxy.c) is driven by real requests and is not cut short by a
 * passing check.
 */
#include "core/err.h"
#include "core/log.h"
#include "route/route_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEALTH_MAX_BODY (1 << 20)

enum { STEP_READY, STEP_METRICS, STEP_MODELS };

static void health_tick(struct ev_timer *t);
static void probe_start(struct rt_backend *b, int step);

static void on_probe_head(void *arg, const struct up_response *resp)
{
    struct rt_backend *b = arg;
    b->probe_status = resp->status;
    b->probe_len = 0;
}

static void on_probe_body(void *arg, const char *data, size_t len)
{
    struct rt_backend *b = arg;
    if (b->probe_len + len + 1 > HEALTH_MAX_BODY)
        return; /* the rest is not needed to judge */
    if (b->probe_len + len + 1 > b->probe_cap) {
        size_t nc = b->probe_cap ? b->probe_cap : 4096;
        while (nc < b->probe_len + len + 1)
            nc *= 2;
        char *n = realloc(b->probe_body, nc);
        if (!n)
            return;
        b->probe_body = n;
        b->probe_cap = nc;
    }
    memcpy(b->probe_body + b->probe_len, data, len);
    b->probe_len += len;
    b->probe_body[b->probe_len] = 0;
}

static void schedule_next(struct rt_backend *b)
{
    struct router *r = b->r;
    double iv = r->table->conf->c.health_interval_s;
    if (iv > 0 && b->in_use)
        evloop_timer_set(r->loop, &b->health_timer, evloop_now_ms() + (int64_t)(iv * 1000.0));
}

static void set_up(struct rt_backend *b, bool up, const char *why)
{
    if (b->up != up || !b->checked)
        log_write(up ? (b->checked ? LOG_INFO : LOG_DEBUG) : LOG_WARN, "route: backend %s is %s%s%s", b->label,
                  up ? "up" : "down", why ? ": " : "", why ? why : "");
    b->up = up;
    b->checked = true;
}

/* "name value" of a Prometheus text sample without labels; -1 when absent. */
static int64_t metric_value(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, name, nl) && p[nl] == ' ')
            return strtoll(p + nl + 1, NULL, 10);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}

static void on_probe_done(void *arg)
{
    struct rt_backend *b = arg;
    b->probe = NULL;
    if (b->probe_len < b->probe_cap)
        b->probe_body[b->probe_len] = 0;
    const char *body = b->probe_body && b->probe_len ? b->probe_body : "";
    switch (b->probe_step) {
    case STEP_READY: {
        char why[64];
        snprintf(why, sizeof why, "%s answered %d", b->r->table->conf->c.health_path, b->probe_status);
        set_up(b, b->probe_status == 200, b->probe_status == 200 ? NULL : why);
        if (!b->up)
            break;
        probe_start(b, b->wafer ? STEP_METRICS : STEP_MODELS);
        return;
    }
    case STEP_METRICS:
        if (b->probe_status == 200) {
            int64_t running = metric_value(body, "wafer_requests_running");
            int64_t waiting = metric_value(body, "wafer_requests_waiting");
            if (running >= 0) {
                b->reported_load = running + (waiting > 0 ? waiting : 0);
                b->inflight_at_report = b->inflight;
            }
        }
        probe_start(b, STEP_MODELS);
        return;
    case STEP_MODELS:
        if (b->probe_status == 200) {
            json_t *o = json_loads(body, 0, NULL);
            json_t *data = o ? json_object_get(o, "data") : NULL;
            if (json_is_array(data)) {
                json_decref(b->models);
                b->models = json_incref(data);
            }
            json_decref(o);
        }
        break;
    }
    schedule_next(b);
}

static void on_probe_fail(void *arg, enum up_fail kind, bool head_seen, const char *msg)
{
    struct rt_backend *b = arg;
    (void)kind, (void)head_seen;
    b->probe = NULL;
    if (b->probe_step == STEP_READY)
        set_up(b, false, msg);
    schedule_next(b);
}

static const struct up_callbacks probe_cb = {on_probe_head, on_probe_body, on_probe_done, on_probe_fail};

static void probe_start(struct rt_backend *b, int step)
{
    struct router *r = b->r;
    const struct route_config *c = &r->table->conf->c;
    const char *path = step == STEP_READY ? c->health_path : step == STEP_METRICS ? "/metrics" : "/v1/models";
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s%s HTTP/1.1\r\nHost: %s\r\nAccept: */*\r\n\r\n", b->prefix, path,
                     b->host_header);
    struct up_timeouts to = {c->health_timeout_ms, c->health_timeout_ms, c->health_timeout_ms};
    char err[ERR_MSG_MAX];
    b->probe_step = step;
    b->probe_status = 0;
    b->probe_len = 0;
    b->probe = up_request(r->loop, &b->target, req, (size_t)n, &to, &probe_cb, b, err);
    if (!b->probe) {
        if (step == STEP_READY)
            set_up(b, false, err);
        schedule_next(b);
    }
}

static void health_tick(struct ev_timer *t)
{
    struct rt_backend *b = (struct rt_backend *)((char *)t - offsetof(struct rt_backend, health_timer));
    if (!b->in_use || b->probe)
        return;
    probe_start(b, STEP_READY);
}

void rt_health_stop(struct router *r, struct rt_backend *b)
{
    evloop_timer_cancel(r->loop, &b->health_timer);
    if (b->probe) {
        up_cancel(b->probe);
        b->probe = NULL;
    }
}

void rt_health_sync(struct router *r)
{
    for (struct rt_backend *b = r->backends; b; b = b->next) {
        b->health_timer.fn = health_tick;
        if (!b->in_use) {
            rt_health_stop(r, b);
            continue;
        }
        /* a backend new to the table is checked at once; one that stays keeps its schedule */
        if (!ev_timer_armed(&b->health_timer) && !b->probe)
            evloop_timer_set(r->loop, &b->health_timer, evloop_now_ms());
    }
}
