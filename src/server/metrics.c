/*
 * metrics: fixed-bucket histograms (cumulative at render time, as Prometheus wants) and a small table of
 * request counts by (endpoint, status). Buckets fit fast serving, where vLLM's (300 ms to 60 s) see nothing:
 * TTFT, end-to-end and queue time from half a millisecond to ten minutes, inter-token latency from 100 us
 * to 10 s, about three buckets per decade and denser where SLOs sit (10 ms to 2 s, 1 to 100 ms for ITL), so
 * the percentiles the alert rules and the SLO controller read (histogram_quantile's linear interpolation
 * inside a bucket) are within a few percent where it matters.
 */
#include "server/metrics.h"

#include "core/alert.h"
#include "core/strbuf.h"
#include "engine/scheduler.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX_BUCKETS 32
#define METRICS_MAX_ROUTES 24
#define METRICS_MAX_STATUSES 16

struct metrics_histogram {
    const char *name;
    const char *help;
    const double *bounds; /* upper bounds, ascending; +Inf implied */
    int n_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last is +Inf */
    double sum;
    uint64_t count;
};

struct metrics_route {
    int status[METRICS_MAX_STATUSES];
    uint64_t count[METRICS_MAX_STATUSES];
    int n;
};

static const char *const metrics_routes[] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/generate", "/v1/batch_generate",
    "/v1/generate_stream", "/tokenize", "/detokenize", "/health", "/ready", "/metrics", "/v1/alerts", "/v1/stats",
    "/dashboard", "other",
};
#define METRICS_N_ROUTES ((int)(sizeof metrics_routes / sizeof metrics_routes[0]))

/* Statuses the HTTP layer answers by itself (wafer_http_errors_total); the last slot is "other". */
static const int metrics_http_statuses[] = {400, 408, 413, 431, 501, 503};
#define METRICS_N_HTTP ((int)(sizeof metrics_http_statuses / sizeof metrics_http_statuses[0]) + 1)

struct metrics {
    pthread_mutex_t mu;
    _Atomic int64_t http_errors[METRICS_N_HTTP];
    struct metrics_histogram hist[MH_COUNT_];
    struct metrics_route routes[METRICS_N_ROUTES];
    _Atomic int64_t counters[MC_COUNT_];
    _Atomic int64_t spec_pos[SCHED_SPEC_POS_MAX]; /* accepted drafted tokens by draft position */
};

static const double metrics_latency_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                                0.15,   0.25,  0.5,    0.75,  1,    1.5,   2,    2.5,   5,
                                                10,     20,    30,     60,    120,  300,   600};
static const double metrics_itl_bounds[] = {0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
                                            0.0075, 0.01,    0.015,  0.02,    0.03,  0.04,   0.05,  0.075, 0.1,
                                            0.15,   0.2,     0.3,    0.5,     1,     2.5,    10};

static const struct {
    const char *name;
    const char *help;
    const char *type;
} metrics_counter_info[MC_COUNT_] = {
    [MC_PROMPT_TOKENS] = {"wafer_prompt_tokens_total", "Prompt tokens of admitted requests.", "counter"},
    [MC_GENERATED_TOKENS] = {"wafer_generation_tokens_total", "Generated tokens.", "counter"},
    [MC_PREFIX_HITS] = {"wafer_prefix_cache_hits_total", "Admissions that reused cached KV blocks.", "counter"},
    [MC_PREFIX_HIT_TOKENS] = {"wafer_prefix_cache_hit_tokens_total",
                              "Prompt tokens served from the prefix cache instead of being recomputed.", "counter"},
    [MC_PREFIX_QUERIES] = {"wafer_prefix_cache_queries_total", "Admissions that looked up the prefix cache.",
                           "counter"},
    [MC_PREEMPTIONS] = {"wafer_preemptions_total", "Sequences preempted (recomputed later) for lack of KV blocks.",
                        "counter"},
    [MC_CANCELLED] = {"wafer_requests_cancelled_total", "Requests cancelled because the client went away.",
                      "counter"},
    [MC_TIMEOUTS] = {"wafer_requests_timed_out_total", "Requests cancelled by their deadline.", "counter"},
    [MC_REJECTED_QUEUE_FULL] = {"wafer_requests_rejected_total", "Requests refused with 429 (queue full).",
                                "counter"},
    [MC_ENGINE_STEPS] = {"wafer_engine_steps_total", "Forward passes run by the scheduler.", "counter"},
    [MC_SPEC_DRAFTS] = {"wafer_spec_decode_num_drafts_total",
                        "Speculative decoding: verifies (a sequence's pass with drafted tokens).", "counter"},
    [MC_SPEC_DRAFT_TOKENS] = {"wafer_spec_decode_num_draft_tokens_total",
                              "Speculative decoding: drafted tokens verified.", "counter"},
    [MC_SPEC_ACCEPTED_TOKENS] = {"wafer_spec_decode_num_accepted_tokens_total",
                                 "Speculative decoding: drafted tokens accepted.", "counter"},
};

struct metrics *metrics_create(void)
{
    struct metrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    static const struct {
        const char *name, *help;
        const double *b;
        int n;
    } defs[MH_COUNT_] = {
        [MH_TTFT] = {"wafer_time_to_first_token_seconds", "Time from arrival to the first generated token.",
                     metrics_latency_bounds, (int)(sizeof metrics_latency_bounds / sizeof(double))},
        [MH_ITL] = {"wafer_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
                    metrics_itl_bounds, (int)(sizeof metrics_itl_bounds / sizeof(double))},
        [MH_E2E] = {"wafer_request_duration_seconds", "Time from arrival to the end of generation.",
                    metrics_latency_bounds, (int)(sizeof metrics_latency_bounds / sizeof(double))},
        [MH_QUEUE] = {"wafer_queue_time_seconds", "Time from arrival to admission into the running batch.",
                      metrics_latency_bounds, (int)(sizeof metrics_latency_bounds / sizeof(double))},
    };
    for (int i = 0; i < MH_COUNT_; i++) {
        m->hist[i].name = defs[i].name;
        m->hist[i].help = defs[i].help;
        m->hist[i].bounds = defs[i].b;
        m->hist[i].n_bounds = defs[i].n;
    }
    return m;
}

void metrics_destroy(struct metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void metrics_request(struct metrics *m, const char *endpoint, int status)
{
    int r = METRICS_N_ROUTES - 1;
    for (int i = 0; i < METRICS_N_ROUTES - 1; i++)
        if (endpoint && !strcmp(endpoint, metrics_routes[i]))
            r = i;
    pthread_mutex_lock(&m->mu);
    struct metrics_route *rt = &m->routes[r];
    int k = 0;
    while (k < rt->n && rt->status[k] != status)
        k++;
    if (k == rt->n) {
        if (rt->n < METRICS_MAX_STATUSES) {
            rt->status[k] = status;
            rt->count[k] = 0;
            rt->n++;
        } else {
            k = -1; /* more distinct statuses than slots: drop (never happens with our status set) */
        }
    }
    if (k >= 0)
        rt->count[k]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_add(struct metrics *m, enum metrics_counter c, int64_t v) { atomic_fetch_add(&m->counters[c], v); }

int64_t metrics_get(const struct metrics *m, enum metrics_counter c)
{
    return atomic_load(&((struct metrics *)m)->counters[c]);
}

void metrics_observe(struct metrics *m, enum metrics_hist h, double seconds)
{
    if (!(seconds >= 0)) /* NaN or negative (clock oddities): clamp */
        seconds = 0;
    struct metrics_histogram *hg = &m->hist[h];
    int b = 0;
    while (b < hg->n_bounds && seconds > hg->bounds[b])
        b++;
    pthread_mutex_lock(&m->mu);
    hg->counts[b]++;
    hg->sum += seconds;
    hg->count++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_answers_get(struct metrics *m, struct metrics_answers *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&m->mu);
    for (int r = 0; r < METRICS_N_ROUTES; r++) {
        if (strcmp(metrics_routes[r], "/v1/completions") && strcmp(metrics_routes[r], "/v1/chat/completions") &&
            strcmp(metrics_routes[r], "/v1/generate") && strcmp(metrics_routes[r], "/v1/batch_generate") &&
            strcmp(metrics_routes[r], "/v1/generate_stream"))
            continue;
        for (int k = 0; k < m->routes[r].n; k++) {
            int st = m->routes[r].status[k];
            uint64_t n = m->routes[r].count[k];
            out->total += n;
            if (st >= 200 && st < 300)
                out->ok += n;
            else if (st == 429)
                out->rejected += n;
            else if (st == 408)
                out->timed_out += n;
            else if (st == 499)
                out->cancelled += n;
            else if (st >= 500)
                out->server_errors += n;
            else
                out->client_errors += n;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void metrics_sample(struct metrics *m, struct alert_sample *s)
{
    struct metrics_answers a;
    metrics_answers_get(m, &a);
    s->counter[ALERT_C_REQUESTS] = (double)a.total;
    s->counter[ALERT_C_ERRORS] = (double)(a.server_errors + a.rejected + a.timed_out);
    s->counter[ALERT_C_OUTPUT_TOKENS] = (double)metrics_get(m, MC_GENERATED_TOKENS);
    s->counter[ALERT_C_PROMPT_TOKENS] = (double)metrics_get(m, MC_PROMPT_TOKENS);
    s->counter[ALERT_C_PREEMPTIONS] = (double)metrics_get(m, MC_PREEMPTIONS);
    static const int map[ALERT_H_COUNT_] = {[ALERT_H_TTFT] = MH_TTFT, [ALERT_H_ITL] = MH_ITL, [ALERT_H_E2E] = MH_E2E,
                                            [ALERT_H_QUEUE] = MH_QUEUE};
    pthread_mutex_lock(&m->mu);
    for (int h = 0; h < ALERT_H_COUNT_; h++) {
        const struct metrics_histogram *src = &m->hist[map[h]];
        struct alert_hist_sample *d = &s->hist[h];
        d->bounds = src->bounds;
        d->n_bounds = src->n_bounds;
        memcpy(d->counts, src->counts, (size_t)(src->n_bounds + 1) * sizeof *d->counts);
        d->sum = src->sum;
        d->count = src->count;
    }
    pthread_mutex_unlock(&m->mu);
}

void metrics_gauges_init(struct metrics_gauges *g)
{
    memset(g, 0, sizeof *g);
    g->batch_limit = g->prefill_chunk = g->cost_per_hour = g->cost_total = g->cost_per_mtok = NAN;
    g->energy_joules = g->tokens_per_joule = g->energy_est_joules = g->tokens_per_joule_est = NAN;
    g->alerts_firing = g->alerts_pending = -1;
    g->notif_pending = -1;
}

void metrics_http_error(struct metrics *m, int status)
{
    int k = METRICS_N_HTTP - 1;
    for (int i = 0; i < METRICS_N_HTTP - 1; i++)
        if (metrics_http_statuses[i] == status)
            k = i;
    atomic_fetch_add(&m->http_errors[k], 1);
}

/* ---------------------------------------------------------------- the scheduler's observer */

static int metrics_counter_of(enum sched_counter c)
{
    switch (c) {
    case SCHED_CTR_PROMPT_TOKENS: return MC_PROMPT_TOKENS;
    case SCHED_CTR_GENERATED_TOKENS: return MC_GENERATED_TOKENS;
    case SCHED_CTR_PREFIX_QUERIES: return MC_PREFIX_QUERIES;
    case SCHED_CTR_PREFIX_HITS: return MC_PREFIX_HITS;
    case SCHED_CTR_PREFIX_HIT_TOKENS: return MC_PREFIX_HIT_TOKENS;
    case SCHED_CTR_PREEMPTIONS: return MC_PREEMPTIONS;
    case SCHED_CTR_CANCELLED: return MC_CANCELLED;
    case SCHED_CTR_TIMEOUTS: return MC_TIMEOUTS;
    case SCHED_CTR_REJECTED_QUEUE_FULL: return MC_REJECTED_QUEUE_FULL;
    case SCHED_CTR_ENGINE_STEPS: return MC_ENGINE_STEPS;
    case SCHED_CTR_SPEC_DRAFTS: return MC_SPEC_DRAFTS;
    case SCHED_CTR_SPEC_DRAFT_TOKENS: return MC_SPEC_DRAFT_TOKENS;
    case SCHED_CTR_SPEC_ACCEPTED_TOKENS: return MC_SPEC_ACCEPTED_TOKENS;
    default: return -1;
    }
}

static int metrics_hist_of(enum sched_timing t)
{
    switch (t) {
    case SCHED_TIM_TTFT: return MH_TTFT;
    case SCHED_TIM_ITL: return MH_ITL;
    case SCHED_TIM_E2E: return MH_E2E;
    case SCHED_TIM_QUEUE: return MH_QUEUE;
    default: return -1;
    }
}

static void metrics_on_count(void *ctx, enum sched_counter c, int64_t v)
{
    struct metrics *m = ctx;
    int mc = metrics_counter_of(c);
    if (mc >= 0)
        metrics_add(m, (enum metrics_counter)mc, v);
    else if (c >= SCHED_CTR_SPEC_ACCEPTED_POS && c < SCHED_CTR_SPEC_ACCEPTED_POS + SCHED_SPEC_POS_MAX)
        atomic_fetch_add(&m->spec_pos[c - SCHED_CTR_SPEC_ACCEPTED_POS], v);
}

static void metrics_on_observe(void *ctx, enum sched_timing t, double seconds)
{
    int mh = metrics_hist_of(t);
    if (mh >= 0)
        metrics_observe(ctx, (enum metrics_hist)mh, seconds);
}

void metrics_sched_observer(struct metrics *m, struct sched_observer *obs)
{
    *obs = (struct sched_observer){.ctx = m, .count = metrics_on_count, .observe = metrics_on_observe};
}

/* ---------------------------------------------------------------- rendering */

static void mb_gauge(struct strbuf *b, const char *name, const char *help, int64_t v)
{
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %lld\n", name, help, name, name, (long long)v);
}

/* A floating-point metric, absent when v is NaN. */
static void mb_float(struct strbuf *b, const char *name, const char *type, const char *help, double v)
{
    if (!isnan(v))
        strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.9g\n", name, help, name, type, name, v);
}

char *metrics_render(struct metrics *m, const struct metrics_gauges *g, size_t *len)
{
    struct strbuf b;
    strbuf_init(&b, 8192);
    if (!b.p)
        return NULL;
    b.p[0] = 0;

    strbuf_printf(&b, "# HELP wafer_requests_total HTTP requests answered, by endpoint and status.\n"
                  "# TYPE wafer_requests_total counter\n");
    pthread_mutex_lock(&m->mu);
    for (int r = 0; r < METRICS_N_ROUTES; r++)
        for (int k = 0; k < m->routes[r].n; k++)
            strbuf_printf(&b, "wafer_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", metrics_routes[r],
                      m->routes[r].status[k], (unsigned long long)m->routes[r].count[k]);
    pthread_mutex_unlock(&m->mu);

    strbuf_printf(&b, "# HELP wafer_http_errors_total Errors the HTTP layer answered itself (malformed requests, "
                  "timeouts, size limits, connection limits), by status.\n# TYPE wafer_http_errors_total counter\n");
    for (int k = 0; k < METRICS_N_HTTP; k++) {
        char st[16];
        if (k < METRICS_N_HTTP - 1)
            snprintf(st, sizeof st, "%d", metrics_http_statuses[k]);
        else
            snprintf(st, sizeof st, "other");
        strbuf_printf(&b, "wafer_http_errors_total{status=\"%s\"} %lld\n", st,
                  (long long)atomic_load(&m->http_errors[k]));
    }

    mb_gauge(&b, "wafer_requests_running", "Requests in the running batch.", g->running);
    mb_gauge(&b, "wafer_requests_waiting", "Requests waiting for a slot.", g->waiting);
    mb_gauge(&b, "wafer_kv_blocks_used", "KV cache blocks in use (sequences and prefix cache).", g->kv_blocks_used);
    mb_gauge(&b, "wafer_kv_blocks_total", "KV cache blocks in the pool.", g->kv_blocks_total);
    mb_gauge(&b, "wafer_prefix_cache_blocks", "KV blocks held by the prefix cache.", g->prefix_cache_blocks);
    mb_gauge(&b, "wafer_http_connections", "Open HTTP connections.", g->connections);
    mb_gauge(&b, "wafer_ready", "1 when the server accepts generation requests.", g->ready);
    mb_float(&b, "wafer_batch_limit", "gauge", "Running sequences the scheduler admits now (the SLO controller's choice).",
             g->batch_limit);
    mb_float(&b, "wafer_prefill_chunk", "gauge",
             "Prompt tokens one engine step carries now (server.prefill_chunk, or the SLO controller's choice).",
             g->prefill_chunk);
    mb_float(&b, "wafer_cost_per_hour_dollars", "gauge", "Configured price of the machine (cost.per_hour).",
             g->cost_per_hour);
    mb_float(&b, "wafer_cost_dollars_total", "counter", "Machine cost accrued since start (cost.per_hour).",
             g->cost_total);
    mb_float(&b, "wafer_cost_per_million_tokens_dollars", "gauge",
             "Machine cost per million generated tokens over the last minute.", g->cost_per_mtok);
    mb_float(&b, "wafer_energy_joules_total", "counter", "Energy of the CPU packages since start, measured by RAPL.",
             g->energy_joules);
    mb_float(&b, "wafer_tokens_per_joule", "gauge", "Generated tokens per joule over the last minute (RAPL).",
             g->tokens_per_joule);
    mb_float(&b, "wafer_energy_estimated_joules_total", "counter",
             "ESTIMATED energy since start: energy.watts times uptime, not a measurement (RAPL unreadable).",
             g->energy_est_joules);
    mb_float(&b, "wafer_tokens_per_joule_estimated", "gauge",
             "Generated tokens per ESTIMATED joule over the last minute (energy.watts, not measured).",
             g->tokens_per_joule_est);
    if (g->alerts_firing >= 0)
        strbuf_printf(&b, "# HELP wafer_alerts Alerts by state.\n# TYPE wafer_alerts gauge\n"
                      "wafer_alerts{state=\"firing\"} %d\nwafer_alerts{state=\"pending\"} %d\n",
                  g->alerts_firing, g->alerts_pending);
    if (g->notif_pending >= 0) {
        strbuf_printf(&b, "# HELP wafer_alert_notifications_total Alert notification posts by result.\n"
                      "# TYPE wafer_alert_notifications_total counter\n"
                      "wafer_alert_notifications_total{result=\"sent\"} %lld\n"
                      "wafer_alert_notifications_total{result=\"failed\"} %lld\n"
                      "wafer_alert_notifications_total{result=\"dropped\"} %lld\n",
                  g->notif_sent, g->notif_failed, g->notif_dropped);
        mb_gauge(&b, "wafer_alert_notifications_pending", "Notifications in the outbox, not yet delivered.",
                 g->notif_pending);
    }

    for (int c = 0; c < MC_COUNT_; c++)
        strbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %lld\n", metrics_counter_info[c].name,
                  metrics_counter_info[c].help, metrics_counter_info[c].name, metrics_counter_info[c].type,
                  metrics_counter_info[c].name, (long long)metrics_get(m, (enum metrics_counter)c));
    strbuf_printf(&b, "# HELP wafer_spec_decode_num_accepted_tokens_per_pos_total Speculative decoding: drafted tokens "
                  "accepted, by position in the draft (0: the first).\n"
                  "# TYPE wafer_spec_decode_num_accepted_tokens_per_pos_total counter\n");
    for (int i = 0; i < SCHED_SPEC_POS_MAX; i++)
        strbuf_printf(&b, "wafer_spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"} %lld\n", i,
                  (long long)atomic_load(&m->spec_pos[i]));

    pthread_mutex_lock(&m->mu);
    for (int h = 0; h < MH_COUNT_; h++) {
        struct metrics_histogram *hg = &m->hist[h];
        strbuf_printf(&b, "# HELP %s %s\n# TYPE %s histogram\n", hg->name, hg->help, hg->name);
        uint64_t cum = 0;
        for (int i = 0; i < hg->n_bounds; i++) {
            cum += hg->counts[i];
            strbuf_printf(&b, "%s_bucket{le=\"%g\"} %llu\n", hg->name, hg->bounds[i], (unsigned long long)cum);
        }
        cum += hg->counts[hg->n_bounds];
        strbuf_printf(&b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", hg->name,
                  (unsigned long long)cum, hg->name, hg->sum, hg->name, (unsigned long long)hg->count);
    }
    pthread_mutex_unlock(&m->mu);

    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.p;
}
