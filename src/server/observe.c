/*
 * observe: the sampling thread, alert evaluation, the batch controller's loop, and the JSON of /v1/alerts
 * and /v1/stats (observe.h). The alert engine (core/alert.h) holds the windows; this file only feeds it and
 * reads measures back, so the dashboard, the rules and the controller all see the same numbers.
 *
 * Reloaded rules (SIGHUP, observe_reload_alerts) are applied by the sampling thread between two samples:
 * the engine keeps its windows and the states of unchanged alerts (alert_engine_set_config). Views point
 * into the rules they were taken from, so readers on other threads (the I/O thread's /v1/alerts, /v1/stats,
 * /metrics) hold o->swap for reading while they use rules or views, and the sampling thread holds it for
 * writing only while it swaps two pointers; the old rules are freed after that. The receivers, data_dir and
 * external_url stay those of the start (the notifier and the store were made from them).
 */
#include "server/observe.h"

#include "core/alert.h"
#include "core/alert_store.h"
#include "core/clock.h"
#include "core/energy.h"
#include "core/err.h"
#include "core/log.h"
#include "core/notify.h"
#include "engine/scheduler.h"
#include "server/config.h"
#include "server/metrics.h"
#include "server/slo_control.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define OBSERVE_TICK_S 1.0
#define OBSERVE_COST_WINDOW_S 60.0

struct observe {
    const struct server_config *cfg;
    struct metrics *metrics;
    struct alert_config no_alerts; /* used when the config has no alerts: section */
    const struct alert_config *acfg; /* the start's: receivers, data_dir, external_url */
    const struct alert_config *rules; /* the rules evaluated: acfg's, or the last reloaded (rules_owned) */
    struct alert_config *rules_owned;
    struct alert_config *pending; /* reloaded, not applied yet (under mu) */
    pthread_rwlock_t swap;        /* readers of rules and views on other threads; the swap writes */
    struct alert_store *store;
    struct alert_engine *engine;
    struct notify *notify; /* NULL without receivers */
    bool curl_inited;
    struct energy_meter *energy; /* NULL: RAPL unreadable or off */
    _Atomic(struct scheduler *) sched;
    int64_t t_start_ns;
    bool slo_on;
    struct slo_control slo; /* the sampling thread's */

    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* stop, last */
    pthread_cond_t cv;
    bool stop;
    struct alert_sample last; /* the newest sample */
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct observe *observe_create(const struct server_config *cfg, struct metrics *m, const char *external_url, char *err)
{
    struct observe *o = calloc(1, sizeof *o);
    if (!o) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    o->cfg = cfg;
    o->metrics = m;
    alert_config_init(&o->no_alerts);
    o->acfg = cfg->alerts ? cfg->alerts : &o->no_alerts;
    o->rules = o->acfg;
    o->t_start_ns = clock_now_ns();
    pthread_mutex_init(&o->mu, NULL);
    pthread_rwlock_init(&o->swap, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&o->cv, &ca);
    pthread_condattr_destroy(&ca);
    alert_sample_init(&o->last, o->t_start_ns);

    if (!o->acfg->data_dir && o->acfg->n_receivers)
        log_warn("alerts: no alerts.data_dir: alert states and pending notifications live in memory and a restart "
                 "loses them");
    o->store = alert_store_open_dir(o->acfg->data_dir, err);
    if (!o->store)
        goto fail;
    o->engine = alert_engine_create(o->acfg, o->store, o->t_start_ns, wall_now());
    if (!o->engine) {
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
    }
    if (cfg->energy_rapl) {
        char why[128] = "";
        o->energy = energy_meter_create(NULL, why);
        if (o->energy)
            log_info("energy: measuring %d CPU package(s) through RAPL", energy_meter_zones(o->energy));
        else
            log_info("energy: RAPL is not readable (%s): wafer_energy_joules_total and tokens per joule are absent%s",
                     why, cfg->energy_watts > 0 ? "; an ESTIMATE from energy.watts is exported instead" : "");
    }
    o->slo_on = cfg->slo_itl_p95_ms > 0 || cfg->slo_ttft_p95_ms > 0;
    if (o->slo_on) {
        struct slo_params sp = {.itl_p95_ms = cfg->slo_itl_p95_ms, .ttft_p95_ms = cfg->slo_ttft_p95_ms,
                                .window_s = cfg->slo_window_s, .min_batch = cfg->slo_min_batch ? cfg->slo_min_batch : 1,
                                .max_batch = cfg->slo_max_batch && cfg->slo_max_batch < cfg->max_batch_size
                                                 ? cfg->slo_max_batch
                                                 : cfg->max_batch_size,
                                .max_chunk = cfg->prefill_chunk};
        slo_control_init(&o->slo, &sp, sp.max_batch, 0);
    }
    return o;
fail:
    observe_destroy(o);
    return NULL;
}

void observe_destroy(struct observe *o)
{
    if (!o)
        return;
    if (o->started) {
        pthread_mutex_lock(&o->mu);
        o->stop = true;
        pthread_cond_signal(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
    }
    notify_destroy(o->notify);
    if (o->curl_inited)
        curl_global_cleanup();
    alert_engine_destroy(o->engine);
    alert_store_close(o->store);
    energy_meter_destroy(o->energy);
    for (int i = 0; i < 2; i++) {
        struct alert_config *c = i ? o->pending : o->rules_owned;
        if (c) {
            alert_config_deinit(c);
            free(c);
        }
    }
    pthread_rwlock_destroy(&o->swap);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
}

void observe_set_scheduler(struct observe *o, struct scheduler *s) { atomic_store(&o->sched, s); }

/* ---------------------------------------------------------------- the sampling thread */

static void take_sample(struct observe *o, struct alert_sample *s)
{
    alert_sample_init(s, clock_now_ns());
    metrics_sample(o->metrics, s);
    struct scheduler *sched = atomic_load(&o->sched);
    if (sched) {
        struct sched_stats st;
        scheduler_stats(sched, &st);
        s->gauge[ALERT_G_RUNNING] = st.running;
        s->gauge[ALERT_G_WAITING] = st.waiting;
        s->gauge[ALERT_G_KV_USAGE] = st.kv_blocks_total ? (double)st.kv_blocks_used / (double)st.kv_blocks_total : 0;
        s->gauge[ALERT_G_PREFIX_USAGE] =
            st.kv_blocks_total ? (double)st.prefix_cache_blocks / (double)st.kv_blocks_total : 0;
        s->gauge[ALERT_G_BATCH_LIMIT] = st.max_running;
        s->gauge[ALERT_G_PREFILL_CHUNK] = st.prefill_chunk;
    }
    if (o->energy)
        s->counter[ALERT_C_ENERGY_J] = energy_meter_read(o->energy);
    if (o->cfg->cost_per_hour > 0)
        s->counter[ALERT_C_COST] = o->cfg->cost_per_hour / 3600.0 * (double)(s->t_ns - o->t_start_ns) / 1e9;
}

static double measure(struct observe *o, const char *name, const struct alert_sample *now, double window_s)
{
    struct alert_measure m;
    if (alert_measure_parse(name, &m))
        return NAN;
    return alert_engine_measure(o->engine, &m, NULL, now, window_s);
}

static void slo_tick(struct observe *o, const struct alert_sample *s)
{
    struct scheduler *sched = atomic_load(&o->sched);
    if (!o->slo_on || !sched)
        return;
    double w = o->slo.p.window_s;
    struct slo_input in = {.itl_p95_ms = measure(o, "itl_p95_ms", s, w),
                           .ttft_p95_ms = measure(o, "ttft_p95_ms", s, w),
                           .output_tps = measure(o, "output_tokens_per_second", s, w),
                           .itl_p50_ms = measure(o, "itl_p50_ms", s, w),
                           .running = (int)s->gauge[ALERT_G_RUNNING],
                           .waiting = (int)s->gauge[ALERT_G_WAITING]};
    int before = o->slo.limit, chunk_before = o->slo.chunk;
    int now_limit = slo_control_step(&o->slo, &in, (double)(s->t_ns - o->t_start_ns) / 1e9);
    if (o->slo.chunk > 0 && o->slo.chunk != scheduler_prefill_chunk(sched)) {
        scheduler_set_prefill_chunk(sched, o->slo.chunk);
        if (o->slo.chunk != chunk_before)
            log_info("slo: prefill chunk %d -> %d (%s; ITL p95 %.2f ms, p50 %.2f ms, TTFT p95 %.1f ms, %d running, "
                     "%d waiting)",
                     chunk_before, o->slo.chunk, o->slo.reason, in.itl_p95_ms, in.itl_p50_ms, in.ttft_p95_ms,
                     in.running, in.waiting);
    }
    if (now_limit != scheduler_max_running(sched)) {
        scheduler_set_max_running(sched, now_limit);
        if (now_limit != before)
            log_info("slo: batch limit %d -> %d (%s; ITL p95 %.2f ms, TTFT p95 %.1f ms, %.0f tokens/s, %d running, "
                     "%d waiting)",
                     before, now_limit, o->slo.reason, in.itl_p95_ms, in.ttft_p95_ms, in.output_tps, in.running,
                     in.waiting);
    }
}

/* Rules differ in what they evaluate or say (not only in their place in the list). */
static bool rule_same(const struct alert_rule *a, const struct alert_rule *b)
{
    bool same = !strcmp(a->measure_name, b->measure_name) && a->op == b->op && a->threshold == b->threshold &&
                a->window_s == b->window_s && a->for_s == b->for_s && !strcmp(a->severity ? a->severity : "",
                b->severity ? b->severity : "") && a->labels.n == b->labels.n &&
                a->annotations.n == b->annotations.n && a->n_receivers == b->n_receivers &&
                !memcmp(&a->burn, &b->burn, sizeof a->burn);
    for (int i = 0; same && i < a->labels.n; i++)
        same = !strcmp(a->labels.key[i], b->labels.key[i]) && !strcmp(a->labels.value[i], b->labels.value[i]);
    for (int i = 0; same && i < a->annotations.n; i++)
        same = !strcmp(a->annotations.key[i], b->annotations.key[i]) &&
               !strcmp(a->annotations.value[i], b->annotations.value[i]);
    for (int i = 0; same && i < a->n_receivers; i++)
        same = !strcmp(a->receivers[i], b->receivers[i]);
    return same;
}

static const struct alert_rule *rule_named(const struct alert_config *c, const char *name)
{
    for (int i = 0; i < c->n_rules; i++)
        if (!strcmp(c->rules[i].name, name))
            return &c->rules[i];
    return NULL;
}

/* Appends "name" to a list being written into buf ("a, b"). */
static void list_add(char *buf, size_t cap, const char *name)
{
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name);
}

/* The sampling thread: starts evaluating nc's rules (observe_reload_alerts) and says what changed. */
static void apply_reload(struct observe *o, struct alert_config *nc)
{
    const struct alert_config *old = o->rules;
    char added[512] = "", removed[512] = "", changed[512] = "";
    for (int i = 0; i < nc->n_rules; i++) {
        const struct alert_rule *was = rule_named(old, nc->rules[i].name);
        if (!was)
            list_add(added, sizeof added, nc->rules[i].name);
        else if (!rule_same(was, &nc->rules[i]))
            list_add(changed, sizeof changed, nc->rules[i].name);
    }
    for (int i = 0; i < old->n_rules; i++)
        if (!rule_named(nc, old->rules[i].name))
            list_add(removed, sizeof removed, old->rules[i].name);
    bool same = !added[0] && !removed[0] && !changed[0] && nc->interval_s == old->interval_s &&
                nc->resolved_retention_s == old->resolved_retention_s;
    if (same) { /* nothing to change: the rules (and their states) stay as they are */
        if (old->n_rules)
            log_info("SIGHUP: alert rules unchanged (%d rule(s))", old->n_rules);
        alert_config_deinit(nc);
        free(nc);
        return;
    }
    pthread_rwlock_wrlock(&o->swap);
    int rc = alert_engine_set_config(o->engine, nc);
    struct alert_config *drop = nc;
    if (!rc) {
        drop = o->rules_owned;
        o->rules = o->rules_owned = nc;
    }
    pthread_rwlock_unlock(&o->swap);
    if (rc) {
        log_warn("SIGHUP: out of memory; the alert rules were not reloaded, the old ones stay");
    } else {
        bool elsewhere = (nc->n_receivers != o->acfg->n_receivers) ||
                         strcmp(nc->data_dir ? nc->data_dir : "", o->acfg->data_dir ? o->acfg->data_dir : "") ||
                         strcmp(nc->external_url ? nc->external_url : "",
                                o->acfg->external_url ? o->acfg->external_url : "");
        for (int i = 0; !elsewhere && i < nc->n_receivers; i++)
            elsewhere = strcmp(nc->receivers[i].name, o->acfg->receivers[i].name) ||
                        strcmp(nc->receivers[i].url, o->acfg->receivers[i].url);
        log_info("SIGHUP: alert rules reloaded: %d rule(s) (was %d) every %.3g s; added: %s; removed: %s; changed: "
                 "%s%s",
                 nc->n_rules, old->n_rules, nc->interval_s, added[0] ? added : "none", removed[0] ? removed : "none",
                 changed[0] ? changed : "none",
                 elsewhere ? "; alerts.receivers, data_dir and external_url changed too: they take effect at the "
                             "next start"
                           : "");
    }
    if (drop) {
        alert_config_deinit(drop);
        free(drop);
    }
}

void observe_reload_alerts(struct observe *o, struct alert_config *nc)
{
    if (!nc) { /* the configuration has no alerts: section (any more): no rules */
        if (!(nc = malloc(sizeof *nc))) {
            log_warn("SIGHUP: out of memory; the alert rules were not reloaded");
            return;
        }
        alert_config_init(nc);
    }
    pthread_mutex_lock(&o->mu);
    struct alert_config *old = o->pending;
    o->pending = nc;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (old) { /* one not applied yet: the newer one replaces it */
        alert_config_deinit(old);
        free(old);
    }
}

static void *observe_thread(void *arg)
{
    struct observe *o = arg;
    double next_eval = 0;
    for (;;) {
        pthread_mutex_lock(&o->mu);
        struct alert_config *nc = o->pending;
        o->pending = NULL;
        pthread_mutex_unlock(&o->mu);
        if (nc) {
            apply_reload(o, nc);
            next_eval = 0;
        }
        struct alert_sample s;
        take_sample(o, &s);
        alert_engine_record(o->engine, &s);
        pthread_mutex_lock(&o->mu);
        o->last = s;
        pthread_mutex_unlock(&o->mu);
        double t = (double)(s.t_ns - o->t_start_ns) / 1e9;
        if (t >= next_eval && o->rules->n_rules) {
            next_eval = t + o->rules->interval_s;
            double now = wall_now();
            alert_engine_eval(o->engine, &s, now);
            if (o->notify) {
                int n;
                struct alert_view *v = alert_engine_views(o->engine, false, &n);
                notify_plan(o->notify, v, n, now);
                alert_views_free(v, n);
            }
        }
        slo_tick(o, &s);
        /* sleep a tick, or until the next evaluation when that comes sooner */
        double dt = OBSERVE_TICK_S;
        if (o->rules->n_rules && next_eval - t < dt)
            dt = next_eval - t > 0.01 ? next_eval - t : 0.01;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)(dt * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_mutex_lock(&o->mu);
        if (!o->stop && !o->pending)
            pthread_cond_timedwait(&o->cv, &o->mu, &ts);
        bool stop = o->stop;
        pthread_mutex_unlock(&o->mu);
        if (stop)
            break;
    }
    return NULL;
}

int observe_start(struct observe *o)
{
    if (o->notify && notify_start(o->notify))
        return ERR_INTERNAL;
    if (pthread_create(&o->thread, NULL, observe_thread, o))
        return ERR_INTERNAL;
    o->started = true;
    if (o->acfg->n_rules)
        log_info("alerts: %d rule(s) every %.3g s, %d receiver(s)%s%s", o->acfg->n_rules, o->acfg->interval_s,
                 o->acfg->n_receivers, o->acfg->data_dir ? ", state in " : "",
                 o->acfg->data_dir ? o->acfg->data_dir : "");
    return 0;
}

/* ---------------------------------------------------------------- readers (I/O thread) */

/* The newest sample with the metrics' counters and histograms (and the cost) brought up to now, so a window
 * that ends now sees the request that just finished; the gauges and the energy stay as last sampled (the
 * meter has one reader: the sampling thread). */
static void fresh_sample(struct observe *o, struct alert_sample *s)
{
    pthread_mutex_lock(&o->mu);
    *s = o->last;
    pthread_mutex_unlock(&o->mu);
    int64_t now = clock_now_ns();
    if (now > s->t_ns) {
        s->t_ns = now;
        metrics_sample(o->metrics, s);
        if (o->cfg->cost_per_hour > 0)
            s->counter[ALERT_C_COST] = o->cfg->cost_per_hour / 3600.0 * (double)(now - o->t_start_ns) / 1e9;
    }
}

double observe_request_cost(struct observe *o, int n_generated)
{
    if (!o || !(o->cfg->cost_per_hour > 0))
        return NAN;
    struct alert_sample s;
    fresh_sample(o, &s);
    return measure(o, "cost_per_million_tokens", &s, OBSERVE_COST_WINDOW_S) * n_generated / 1e6;
}

static double estimated_joules(struct observe *o, int64_t t_ns)
{
    if (o->energy || !(o->cfg->energy_watts > 0))
        return NAN;
    return o->cfg->energy_watts * (double)(t_ns - o->t_start_ns) / 1e9;
}

void observe_fill_gauges(struct observe *o, struct metrics_gauges *g)
{
    if (!o)
        return;
    struct alert_sample s;
    fresh_sample(o, &s);
    struct scheduler *sched = atomic_load(&o->sched);
    g->batch_limit = sched ? scheduler_max_running(sched) : NAN;
    g->prefill_chunk = sched ? scheduler_prefill_chunk(sched) : NAN;
    if (o->cfg->cost_per_hour > 0) {
        g->cost_per_hour = o->cfg->cost_per_hour;
        g->cost_total = s.counter[ALERT_C_COST];
        g->cost_per_mtok = measure(o, "cost_per_million_tokens", &s, OBSERVE_COST_WINDOW_S);
    }
    if (o->energy) {
        g->energy_joules = s.counter[ALERT_C_ENERGY_J];
        g->tokens_per_joule = measure(o, "tokens_per_joule", &s, OBSERVE_COST_WINDOW_S);
    } else if (o->cfg->energy_watts > 0) {
        g->energy_est_joules = estimated_joules(o, s.t_ns);
        g->tokens_per_joule_est = measure(o, "output_tokens_per_second", &s, OBSERVE_COST_WINDOW_S) / o->cfg->energy_watts;
    }
    pthread_rwlock_rdlock(&o->swap);
    if (o->rules->n_rules) {
        int n;
        struct alert_view *v = alert_engine_views(o->engine, false, &n);
        g->alerts_firing = g->alerts_pending = 0;
        for (int i = 0; i < n; i++) {
            g->alerts_firing += v[i].state == ALERT_FIRING;
            g->alerts_pending += v[i].state == ALERT_PENDING;
        }
        alert_views_free(v, n);
    }
    pthread_rwlock_unlock(&o->swap);
    if (o->notify) {
        struct notify_stats ns;
        notify_stats_get(o->notify, &ns);
        g->notif_sent = ns.sent;
        g->notif_failed = ns.failed_posts;
        g->notif_dropped = ns.dropped;
        g->notif_pending = ns.pending;
    }
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *time_or_null(double t)
{
    if (!(t > 0))
        return json_null();
    char buf[32];
    alert_time_format(t, buf);
    return json_string(buf);
}

static const char *op_name(enum alert_op op)
{
    static const char *const names[] = {">", ">=", "<", "<=", "==", "!="};
    return names[op];
}

static char *dump(json_t *o, size_t *len)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s && len)
        *len = strlen(s);
    return s;
}

char *observe_alerts_json(struct observe *o, size_t *len)
{
    /* views point into the rules: hold them against a reload; interval_s is the reloaded rules' */
    pthread_rwlock_rdlock(&o->swap);
    char *out = notify_alerts_json(o->engine, o->rules, o->notify, len);
    pthread_rwlock_unlock(&o->swap);
    return out;
}

/* The charted measures at one-second steps over the last n seconds, oldest first. */
static json_t *stats_history(struct observe *o, double window_s, int n, const struct alert_sample *now)
{
    static const char *const charted[] = {
        "output_tokens_per_second", "requests_per_second", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms",
        "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "running", "waiting",
        "batch_limit", "prefill_chunk", "kv_usage", "prefix_cache_usage", "error_rate",
    };
    json_t *h = json_object(), *t = json_array();
    json_object_set_new(h, "t", t);
    for (int k = n - 1; k >= 1; k--)
        json_array_append_new(t, json_integer(-k));
    for (size_t i = 0; i < sizeof charted / sizeof charted[0]; i++) {
        struct alert_measure m;
        alert_measure_parse(charted[i], &m);
        json_t *a = json_array();
        for (int k = n - 1; k >= 1; k--)
            json_array_append_new(a, num_or_null(alert_engine_measure_at(o->engine, &m, now->t_ns - (int64_t)k * 1000000000LL,
                                                                        window_s)));
        json_object_set_new(h, charted[i], a);
    }
    return h;
}

char *observe_stats_json(struct observe *o, double window_s, int history, json_t *jobs, size_t *len)
{
    static const char *const windowed[] = {
        "output_tokens_per_second", "prompt_tokens_per_second", "requests_per_second", "ttft_p50_ms", "ttft_p95_ms",
        "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms",
        "queue_p50_ms", "queue_p95_ms", "queue_p99_ms", "error_rate", "preemptions_per_second", "running",
        "waiting", "kv_usage", "prefix_cache_usage", "batch_limit", "prefill_chunk", "watts", "tokens_per_joule",
    };
    struct alert_sample s, last;
    pthread_mutex_lock(&o->mu);
    last = o->last;
    pthread_mutex_unlock(&o->mu);
    fresh_sample(o, &s);
    json_t *m = json_object();
    for (size_t i = 0; i < sizeof windowed / sizeof windowed[0]; i++) {
        /* energy is read by the sampling thread only: measure it up to the last sample, not to now */
        bool energy = !strcmp(windowed[i], "watts") || !strcmp(windowed[i], "tokens_per_joule");
        json_object_set_new(m, windowed[i], num_or_null(measure(o, windowed[i], energy ? &last : &s, window_s)));
    }
    /* cost over at least a minute (a 10 s window after idle says little about a price per token) */
    double cw = window_s > OBSERVE_COST_WINDOW_S ? window_s : OBSERVE_COST_WINDOW_S;
    json_object_set_new(m, "cost_per_million_tokens", num_or_null(measure(o, "cost_per_million_tokens", &s, cw)));
    if (!o->energy && o->cfg->energy_watts > 0)
        json_object_set_new(m, "tokens_per_joule_estimated",
                            num_or_null(measure(o, "output_tokens_per_second", &s, cw) / o->cfg->energy_watts));

    struct metrics_answers a;
    metrics_answers_get(o->metrics, &a);
    json_t *ans = json_object();
    json_object_set_new(ans, "total", json_integer((json_int_t)a.total));
    json_object_set_new(ans, "ok", json_integer((json_int_t)a.ok));
    json_object_set_new(ans, "client_error", json_integer((json_int_t)a.client_errors));
    json_object_set_new(ans, "rejected", json_integer((json_int_t)a.rejected));
    json_object_set_new(ans, "timed_out", json_integer((json_int_t)a.timed_out));
    json_object_set_new(ans, "cancelled", json_integer((json_int_t)a.cancelled));
    json_object_set_new(ans, "server_error", json_integer((json_int_t)a.server_errors));

    json_t *tot = json_object();
    json_object_set_new(tot, "output_tokens", json_integer((json_int_t)s.counter[ALERT_C_OUTPUT_TOKENS]));
    json_object_set_new(tot, "prompt_tokens", json_integer((json_int_t)s.counter[ALERT_C_PROMPT_TOKENS]));
    json_object_set_new(tot, "preemptions", json_integer((json_int_t)s.counter[ALERT_C_PREEMPTIONS]));
    json_object_set_new(tot, "cost_dollars", num_or_null(s.counter[ALERT_C_COST]));
    json_object_set_new(tot, "energy_joules", num_or_null(s.counter[ALERT_C_ENERGY_J]));
    json_object_set_new(tot, "energy_joules_estimated", num_or_null(estimated_joules(o, s.t_ns)));

    int n;
    pthread_rwlock_rdlock(&o->swap);
    struct alert_view *v = alert_engine_views(o->engine, false, &n);
    json_t *alerts = json_array();
    for (int i = 0; i < n; i++) {
        if (v[i].state != ALERT_FIRING && v[i].state != ALERT_PENDING)
            continue;
        json_t *x = json_object();
        json_object_set_new(x, "name", json_string(v[i].rule->name));
        json_object_set_new(x, "state", json_string(alert_state_name(v[i].state)));
        json_object_set_new(x, "severity", v[i].rule->severity ? json_string(v[i].rule->severity) : json_null());
        json_object_set_new(x, "measure", json_string(v[i].rule->measure_name));
        json_object_set_new(x, "op", json_string(op_name(v[i].rule->op)));
        json_object_set_new(x, "threshold", json_real(v[i].rule->threshold));
        json_object_set_new(x, "value", num_or_null(v[i].value));
        json_object_set_new(x, "activeAt", time_or_null(v[i].active_at));
        json_t *sum = json_object_get(v[i].annotations, "summary");
        json_object_set_new(x, "summary", sum ? json_incref(sum) : json_null());
        json_array_append_new(alerts, x);
    }
    alert_views_free(v, n);
    int n_rules = o->rules->n_rules;
    pthread_rwlock_unlock(&o->swap);

    json_t *root = json_object();
    json_object_set_new(root, "time", json_real(wall_now()));
    json_object_set_new(root, "uptime_s", json_real((double)(s.t_ns - o->t_start_ns) / 1e9));
    json_object_set_new(root, "window_s", json_real(window_s));
    json_object_set_new(root, "model", json_string(o->cfg->model_name ? o->cfg->model_name : ""));
    json_object_set_new(root, "max_batch_size", json_integer(o->cfg->max_batch_size));
    json_object_set_new(root, "measures", m);
    json_object_set_new(root, "answers", ans);
    json_object_set_new(root, "totals", tot);
    json_object_set_new(root, "alerts", alerts);
    json_object_set_new(root, "rules", json_integer(n_rules));
    json_object_set_new(root, "energy_source",
                        json_string(o->energy ? "rapl" : o->cfg->energy_watts > 0 ? "estimated" : "none"));
    json_t *slo = json_object();
    json_object_set_new(slo, "itl_p95_ms", o->cfg->slo_itl_p95_ms > 0 ? json_real(o->cfg->slo_itl_p95_ms) : json_null());
    json_object_set_new(slo, "ttft_p95_ms",
                        o->cfg->slo_ttft_p95_ms > 0 ? json_real(o->cfg->slo_ttft_p95_ms) : json_null());
    json_object_set_new(slo, "auto", json_boolean(o->cfg->batch_auto));
    json_object_set_new(root, "slo", slo);
    json_object_set_new(root, "jobs", jobs ? jobs : json_null());
    if (history > 1)
        json_object_set_new(root, "history", stats_history(o, window_s, history, &s));
    return dump(root, len);
}
