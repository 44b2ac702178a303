/*
 * route_observe: what `wafer route` knows about itself beyond /metrics: once a second (a timer on the I/O
 * thread, which owns every counter it reads, so no lock) it takes a sample of the router's own measures into
 * an alert engine (core/alert.h), evaluates the `alerts:` rules every alerts.interval_s and hands the alerts
 * to the notifier (core/notify.h: the same receivers, grouping, outbox and retries as `wafer serve`; it
 * posts from its own thread, so a dead receiver never slows proxying), and keeps ten seconds of each
 * backend's attempts for the dashboard's traffic shares.
 *
 * What the router measures (the names of core/alert.h, so rules and the dashboard read like the server's):
 *   requests_per_second    client answers of the proxied endpoints
 *   error_rate             5xx answers (the router's own 502/503/504 and backends' 5xx passed on) / answers
 *   e2e_pNN_ms             client request start to the end of its answer (wafer_route_request_duration_seconds)
 *   ttft_pNN_ms            client request start to the first byte handed over (time to first byte: for a
 *                          stream, the first token's chunk)
 *   running                requests being proxied now
 * Tokens, inter-token gaps, queues and KV use are the backends' (route_config.c refuses rules on them).
 * The rules are read at start: a SIGHUP reload keeps them (the routing table is what reloads).
 */
#include "route/route_observe.h"

#include "core/alert.h"
#include "core/alert_store.h"
#include "core/err.h"
#include "core/log.h"
#include "core/notify.h"
#include "route/route_internal.h"

#include <curl/curl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RO_TICK_MS 1000

struct rt_observe {
    struct router *r;
    struct rt_conf *conf; /* holds the config the engine reads (alert_engine_create: cfg outlives it) */
    struct alert_config none;
    const struct alert_config *acfg;
    struct alert_store *store;
    struct alert_engine *engine;
    struct notify *notify;
    bool curl_inited;
    struct ev_timer tick;
    int64_t t_start_ns;
    double next_eval; /* seconds since start */
    int ring_pos;     /* backends' share rings: the slot of the newest tick */
    int ticks;
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void ro_hist(struct alert_hist_sample *h, const struct rt_hist *src)
{
    h->bounds = rt_hist_bounds;
    h->n_bounds = RT_HIST_BUCKETS;
    memcpy(h->counts, src->counts, sizeof src->counts);
    h->sum = src->sum;
    h->count = src->count;
}

static void ro_sample(struct router *r, struct alert_sample *s)
{
    alert_sample_init(s, clock_now_ns());
    uint64_t total = 0;
    for (int k = 1; k <= 5; k++)
        total += r->m_status[k];
    s->counter[ALERT_C_REQUESTS] = (double)total;
    s->counter[ALERT_C_ERRORS] = (double)r->m_status[5];
    s->counter[ALERT_C_OUTPUT_TOKENS] = s->counter[ALERT_C_PROMPT_TOKENS] = s->counter[ALERT_C_PREEMPTIONS] = NAN;
    ro_hist(&s->hist[ALERT_H_E2E], &r->duration);
    ro_hist(&s->hist[ALERT_H_TTFT], &r->ttfb);
    s->gauge[ALERT_G_RUNNING] = r->n_reqs;
    s->gauge[ALERT_G_WAITING] = s->gauge[ALERT_G_KV_USAGE] = s->gauge[ALERT_G_PREFIX_USAGE] = NAN;
}

static uint64_t ro_backend_failures(const struct rt_backend *b)
{
    uint64_t n = 0;
    for (int k = 0; k < RT_ERR_COUNT_; k++)
        n += b->m_errors[k];
    return n;
}

static void ro_tick(struct ev_timer *t)
{
    struct rt_observe *o = (struct rt_observe *)((char *)t - offsetof(struct rt_observe, tick));
    struct router *r = o->r;
    o->ring_pos = (o->ring_pos + 1) % RT_SHARE_RING;
    o->ticks++;
    for (struct rt_backend *b = r->backends; b; b = b->next) {
        b->share_requests[o->ring_pos] = b->m_requests;
        b->share_failures[o->ring_pos] = ro_backend_failures(b);
    }
    struct alert_sample s;
    ro_sample(r, &s);
    alert_engine_record(o->engine, &s);
    double now = (double)(s.t_ns - o->t_start_ns) / 1e9;
    if (o->acfg->n_rules && now >= o->next_eval) {
        o->next_eval = now + o->acfg->interval_s;
        double wall = wall_now();
        alert_engine_eval(o->engine, &s, wall);
        if (o->notify) {
            int n;
            struct alert_view *v = alert_engine_views(o->engine, false, &n);
            notify_plan(o->notify, v, n, wall);
            alert_views_free(v, n);
        }
    }
    int64_t next = RO_TICK_MS;
    if (o->acfg->n_rules && (o->next_eval - now) * 1000 < next)
        next = (int64_t)((o->next_eval - now) * 1000) > 10 ? (int64_t)((o->next_eval - now) * 1000) : 10;
    evloop_timer_set(r->loop, &o->tick, evloop_now_ms() + next);
}

struct rt_observe *rt_observe_create(struct router *r, struct rt_conf *conf, const char *external_url, char *err)
{
    struct rt_observe *o = calloc(1, sizeof *o);
    if (!o) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    o->r = r;
    ev_timer_init(&o->tick, ro_tick); /* before any goto fail: destroy cancels it */
    o->conf = rt_conf_ref(conf);
    alert_config_init(&o->none);
    o->acfg = conf->c.alerts ? conf->c.alerts : &o->none;
    o->t_start_ns = clock_now_ns();
    if (!o->acfg->data_dir && o->acfg->n_receivers)
        log_warn("route: alerts: no alerts.data_dir: alert states and pending notifications live in memory and a "
                 "restart loses them");
    if (!(o->store = alert_store_open_dir(o->acfg->data_dir, err)))
        goto fail;
    if (!(o->engine = alert_engine_create(o->acfg, o->store, o->t_start_ns, wall_now()))) {
        err_set(err, ERR_NOMEM, "out of memory creating the alert engine");
        goto fail;
    }
    if (o->acfg->n_receivers) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            err_set(err, ERR_INTERNAL, "cannot initialize libcurl for alert notifications");
            goto fail;
        }
        o->curl_inited = true;
        if (!(o->notify = notify_create(o->acfg, o->store, external_url))) {
            err_set(err, ERR_NOMEM, "out of memory creating the notifier");
            goto fail;
        }
        if (notify_start(o->notify)) {
            err_set(err, ERR_INTERNAL, "cannot start the notifier thread");
            goto fail;
        }
    }
    evloop_timer_set(r->loop, &o->tick, evloop_now_ms() + RO_TICK_MS);
    if (o->acfg->n_rules)
        log_info("route: alerts: %d rule(s) every %.3g s, %d receiver(s)%s%s", o->acfg->n_rules, o->acfg->interval_s,
                 o->acfg->n_receivers, o->acfg->data_dir ? ", state in " : "",
                 o->acfg->data_dir ? o->acfg->data_dir : "");
    return o;
fail:
    rt_observe_destroy(o);
    return NULL;
}

void rt_observe_destroy(struct rt_observe *o)
{
    if (!o)
        return;
    if (o->r && o->r->loop)
        evloop_timer_cancel(o->r->loop, &o->tick);
    notify_destroy(o->notify);
    if (o->curl_inited)
        curl_global_cleanup();
    alert_engine_destroy(o->engine);
    alert_store_close(o->store);
    rt_conf_unref(o->conf);
    free(o);
}

char *rt_observe_alerts_json(struct rt_observe *o, size_t *len)
{
    return notify_alerts_json(o->engine, o->acfg, o->notify, len);
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *rt_observe_stats(struct rt_observe *o, double window_s)
{
    static const char *const names[] = {"requests_per_second", "error_rate", "e2e_p50_ms", "e2e_p95_ms",
                                        "e2e_p99_ms", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "running"};
    struct router *r = o->r;
    struct alert_sample s;
    ro_sample(r, &s);
    json_t *m = json_object();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct alert_measure am;
        alert_measure_parse(names[i], &am);
        json_object_set_new(m, names[i], num_or_null(alert_engine_measure(o->engine, &am, NULL, &s, window_s)));
    }
    /* backends: health now, and their share of the attempts over the last ticks (up to RT_SHARE_RING - 1) */
    int span = o->ticks < RT_SHARE_RING - 1 ? o->ticks : RT_SHARE_RING - 1;
    int old = (o->ring_pos - span + RT_SHARE_RING) % RT_SHARE_RING;
    uint64_t sum = 0;
    for (struct rt_backend *b = r->backends; b; b = b->next)
        if (b->in_use)
            sum += b->m_requests - (span ? b->share_requests[old] : 0);
    int64_t now = evloop_now_ms();
    json_t *bs = json_array();
    for (struct rt_backend *b = r->backends; b; b = b->next) {
        if (!b->in_use)
            continue;
        uint64_t dreq = b->m_requests - (span ? b->share_requests[old] : 0);
        uint64_t dfail = ro_backend_failures(b) - (span ? b->share_failures[old] : 0);
        const char *pool = "";
        for (int i = 0; i < r->table->n_pools; i++)
            for (int k = 0; k < r->table->pools[i].n; k++)
                if (r->table->pools[i].b[k] == b)
                    pool = r->table->pools[i].name;
        json_t *x = json_object();
        json_object_set_new(x, "backend", json_string(b->label));
        json_object_set_new(x, "url", json_string(b->url));
        json_object_set_new(x, "pool", json_string(pool));
        bool avail = rt_backend_available(b, now);
        json_object_set_new(x, "up", json_boolean(avail));
        json_object_set_new(x, "state", json_string(avail ? (b->half_open ? "probing" : "up")
                                                          : now < b->ejected_until ? "ejected" : "down"));
        json_object_set_new(x, "in_flight", json_integer(b->inflight));
        json_object_set_new(x, "load", b->reported_load >= 0 ? json_integer(b->reported_load) : json_null());
        json_object_set_new(x, "share", sum ? json_real((double)dreq / (double)sum) : json_null());
        json_object_set_new(x, "requests_per_second", span ? json_real((double)dreq / span) : json_null());
        json_object_set_new(x, "error_rate", dreq ? json_real((double)dfail / (double)dreq) : json_null());
        json_object_set_new(x, "requests", json_integer((json_int_t)b->m_requests));
        json_object_set_new(x, "ejections", json_integer((json_int_t)b->m_ejections));
        json_array_append_new(bs, x);
    }
    int n;
    struct alert_view *v = alert_engine_views(o->engine, false, &n);
    json_t *alerts = json_array();
    for (int i = 0; i < n; i++) {
        if (v[i].state != ALERT_FIRING && v[i].state != ALERT_PENDING)
            continue;
        json_t *x = json_object();
        json_object_set_new(x, "name", json_string(v[i].rule->name));
        json_object_set_new(x, "state", json_string(alert_state_name(v[i].state)));
        json_object_set_new(x, "measure", json_string(v[i].rule->measure_name));
        json_object_set_new(x, "threshold", json_real(v[i].rule->threshold));
        json_object_set_new(x, "value", num_or_null(v[i].value));
        json_t *sm = json_object_get(v[i].annotations, "summary");
        json_object_set_new(x, "summary", sm ? json_incref(sm) : json_null());
        json_array_append_new(alerts, x);
    }
    alert_views_free(v, n);
    json_t *ans = json_object();
    static const char *const cls[6] = {"", "1xx", "2xx", "3xx", "4xx", "5xx"};
    for (int k = 2; k <= 5; k++)
        json_object_set_new(ans, cls[k], json_integer((json_int_t)r->m_status[k]));
    json_t *root = json_object();
    json_object_set_new(root, "time", json_real(wall_now()));
    json_object_set_new(root, "uptime_s", json_real((double)(s.t_ns - o->t_start_ns) / 1e9));
    json_object_set_new(root, "window_s", json_real(window_s));
    json_object_set_new(root, "share_window_s", json_integer(span));
    json_object_set_new(root, "measures", m);
    json_object_set_new(root, "backends", bs);
    json_object_set_new(root, "answers", ans);
    json_object_set_new(root, "alerts", alerts);
    json_object_set_new(root, "rules", json_integer(o->acfg->n_rules));
    return root;
}
