/*
 * alert: measures over windows of snapshots, and the rules' state machine (alert.h has the semantics).
 *
 * Snapshots live in two rings of struct alert_sample (about 1.2 KB each): a fine one, one a second for
 * 15 minutes (the dashboard's and most rules' windows), and, only when a rule looks further back, a coarse
 * one, every 30 s up to its longest window (at most 24 h: 2,900 samples). A window start is the newest
 * snapshot at or before now - window_s, or the oldest one kept when none is that old (a server up for less
 * than the window judges what it has seen).
 */
#include "core/alert.h"

#include "core/alert_store.h"
#include "core/err.h"
#include "core/log.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ALERT_FINE_SPACING_S 1.0
#define ALERT_FINE_SPAN_S 900.0
#define ALERT_COARSE_SPACING_S 30.0

/* ---------------------------------------------------------------- samples and histograms */

void alert_sample_init(struct alert_sample *s, int64_t t_ns)
{
    memset(s, 0, sizeof *s);
    s->t_ns = t_ns;
    s->counter[ALERT_C_ENERGY_J] = NAN;
    s->counter[ALERT_C_COST] = NAN;
    s->gauge[ALERT_G_BATCH_LIMIT] = NAN;
    s->gauge[ALERT_G_PREFILL_CHUNK] = NAN;
}

/* Per-bucket counts of now - then (a reset source, count below then's, counts from zero). */
static uint64_t hist_delta(const struct alert_hist_sample *now, const struct alert_hist_sample *then,
                           uint64_t out[ALERT_MAX_BUCKETS + 1])
{
    bool reset = then && (then->count > now->count || then->n_bounds != now->n_bounds);
    uint64_t total = 0;
    for (int i = 0; i <= now->n_bounds && i <= ALERT_MAX_BUCKETS; i++) {
        uint64_t a = now->counts[i], b = then && !reset ? then->counts[i] : 0;
        out[i] = a >= b ? a - b : 0;
        total += out[i];
    }
    return total;
}

double alert_hist_quantile(const struct alert_hist_sample *now, const struct alert_hist_sample *then, double q)
{
    uint64_t d[ALERT_MAX_BUCKETS + 1];
    uint64_t total = hist_delta(now, then, d);
    if (!total || !(q >= 0 && q <= 1) || now->n_bounds < 1)
        return NAN;
    double rank = q * (double)total;
    uint64_t cum = 0;
    for (int i = 0; i <= now->n_bounds; i++) {
        uint64_t prev = cum;
        cum += d[i];
        if ((double)cum >= rank && d[i] > 0) {
            if (i == now->n_bounds) /* +Inf: the highest finite bound, as histogram_quantile says */
                return now->bounds[now->n_bounds - 1];
            double lo = i == 0 ? 0 : now->bounds[i - 1], hi = now->bounds[i];
            return lo + (hi - lo) * ((rank - (double)prev) / (double)d[i]);
        }
    }
    return now->bounds[now->n_bounds - 1];
}

double alert_hist_fraction_above(const struct alert_hist_sample *now, const struct alert_hist_sample *then,
                                 double x)
{
    uint64_t d[ALERT_MAX_BUCKETS + 1];
    uint64_t total = hist_delta(now, then, d);
    if (!total)
        return NAN;
    double above = 0;
    for (int i = 0; i <= now->n_bounds; i++) {
        double lo = i == 0 ? 0 : now->bounds[i - 1];
        double hi = i == now->n_bounds ? INFINITY : now->bounds[i];
        if (lo >= x)
            above += (double)d[i];
        else if (hi > x) /* x inside this bucket: the part above it, linearly (none of +Inf is below x) */
            above += isinf(hi) ? (double)d[i] : (double)d[i] * (hi - x) / (hi - lo);
    }
    return above / (double)total;
}

/* ---------------------------------------------------------------- measures */

static const struct {
    const char *name;
    enum alert_measure_kind kind;
} alert_plain_measures[] = {
    {"error_rate", AM_ERROR_RATE},
    {"output_tokens_per_second", AM_OUTPUT_TPS},
    {"prompt_tokens_per_second", AM_PROMPT_TPS},
    {"requests_per_second", AM_REQUESTS_PS},
    {"preemptions_per_second", AM_PREEMPTIONS_PS},
    {"kv_usage", AM_KV_USAGE},
    {"prefix_cache_usage", AM_PREFIX_USAGE},
    {"queue_depth", AM_QUEUE_DEPTH},
    {"waiting", AM_QUEUE_DEPTH},
    {"running", AM_RUNNING},
    {"batch_limit", AM_BATCH_LIMIT},
    {"prefill_chunk", AM_PREFILL_CHUNK},
    {"watts", AM_WATTS},
    {"tokens_per_joule", AM_TOKENS_PER_JOULE},
    {"cost_per_million_tokens", AM_COST_PER_MTOK},
    {"burn_rate", AM_BURN_RATE},
};

static const char *const alert_hist_names[ALERT_H_COUNT_] = {"ttft", "itl", "e2e", "queue"};

const char *alert_measure_names(void)
{
    return "ttft_p50_ms, ttft_p95_ms, ttft_p99_ms (any pNN), ttft_mean_ms, the same for itl, e2e and queue, "
           "error_rate, output_tokens_per_second, prompt_tokens_per_second, requests_per_second, "
           "preemptions_per_second, kv_usage, prefix_cache_usage, queue_depth (waiting), running, batch_limit, prefill_chunk, "
           "watts, tokens_per_joule, cost_per_million_tokens, burn_rate";
}

int alert_measure_parse(const char *name, struct alert_measure *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < sizeof alert_plain_measures / sizeof alert_plain_measures[0]; i++)
        if (!strcmp(name, alert_plain_measures[i].name)) {
            out->kind = alert_plain_measures[i].kind;
            return 0;
        }
    /* <hist>_p<digits>_ms or <hist>_mean_ms; p999 is 99.9, p50 is 50 */
    for (int h = 0; h < ALERT_H_COUNT_; h++) {
        size_t hl = strlen(alert_hist_names[h]);
        if (strncmp(name, alert_hist_names[h], hl) || name[hl] != '_')
            continue;
        const char *rest = name + hl + 1;
        out->hist = (enum alert_hist)h;
        if (!strcmp(rest, "mean_ms")) {
            out->kind = AM_MEAN;
            return 0;
        }
        if (rest[0] != 'p')
            return ERR_INVALID_ARG;
        const char *d = rest + 1;
        size_t nd = strspn(d, "0123456789");
        if (nd < 2 || nd > 4 || strcmp(d + nd, "_ms"))
            return ERR_INVALID_ARG;
        double v = 0;
        for (size_t k = 0; k < nd; k++)
            v = v * 10 + (d[k] - '0');
        double q = v / pow(10, (double)nd); /* p95 -> 0.95, p999 -> 0.999 */
        if (!(q > 0 && q < 1))
            return ERR_INVALID_ARG;
        out->kind = AM_QUANTILE;
        out->q = q;
        return 0;
    }
    return ERR_INVALID_ARG;
}

/* now - then of a counter, from zero when the counter went down (the source restarted). */
static double counter_delta(const struct alert_sample *now, const struct alert_sample *then, enum alert_counter c)
{
    double a = now->counter[c], b = then->counter[c];
    if (isnan(a) || isnan(b))
        return NAN;
    return a >= b ? a - b : a;
}

static double ratio(double num, double den) { return den > 0 && !isnan(num) ? num / den : NAN; }

/* Bad fraction of the SLI over then..now. */
static double burn_bad_fraction(const struct alert_burn *b, const struct alert_sample *now,
                                const struct alert_sample *then)
{
    if (b->latency_hist >= 0)
        return alert_hist_fraction_above(&now->hist[b->latency_hist], &then->hist[b->latency_hist], b->latency_s);
    return ratio(counter_delta(now, then, ALERT_C_ERRORS), counter_delta(now, then, ALERT_C_REQUESTS));
}

double alert_measure_value(const struct alert_measure *m, const struct alert_burn *burn, const struct alert_sample *now,
                           const struct alert_sample *then, const struct alert_sample *short_then)
{
    /* gauges: as read now, whatever the window */
    switch (m->kind) {
    case AM_KV_USAGE: return now->gauge[ALERT_G_KV_USAGE];
    case AM_PREFIX_USAGE: return now->gauge[ALERT_G_PREFIX_USAGE];
    case AM_QUEUE_DEPTH: return now->gauge[ALERT_G_WAITING];
    case AM_RUNNING: return now->gauge[ALERT_G_RUNNING];
    case AM_BATCH_LIMIT: return now->gauge[ALERT_G_BATCH_LIMIT];
    case AM_PREFILL_CHUNK: return now->gauge[ALERT_G_PREFILL_CHUNK];
    default: break;
    }
    if (!then || then->t_ns >= now->t_ns)
        return NAN;
    double dt = (double)(now->t_ns - then->t_ns) / 1e9;
    switch (m->kind) {
    case AM_QUANTILE: return alert_hist_quantile(&now->hist[m->hist], &then->hist[m->hist], m->q) * 1e3;
    case AM_MEAN: {
        const struct alert_hist_sample *a = &now->hist[m->hist], *b = &then->hist[m->hist];
        bool reset = b->count > a->count;
        uint64_t n = reset ? a->count : a->count - b->count;
        double s = reset ? a->sum : a->sum - b->sum;
        return n ? s / (double)n * 1e3 : NAN;
    }
    case AM_ERROR_RATE:
        return ratio(counter_delta(now, then, ALERT_C_ERRORS), counter_delta(now, then, ALERT_C_REQUESTS));
    case AM_OUTPUT_TPS: return counter_delta(now, then, ALERT_C_OUTPUT_TOKENS) / dt;
    case AM_PROMPT_TPS: return counter_delta(now, then, ALERT_C_PROMPT_TOKENS) / dt;
    case AM_REQUESTS_PS: return counter_delta(now, then, ALERT_C_REQUESTS) / dt;
    case AM_PREEMPTIONS_PS: return counter_delta(now, then, ALERT_C_PREEMPTIONS) / dt;
    case AM_WATTS: return counter_delta(now, then, ALERT_C_ENERGY_J) / dt;
    case AM_TOKENS_PER_JOULE:
        return ratio(counter_delta(now, then, ALERT_C_OUTPUT_TOKENS), counter_delta(now, then, ALERT_C_ENERGY_J));
    case AM_COST_PER_MTOK:
        return ratio(counter_delta(now, then, ALERT_C_COST), counter_delta(now, then, ALERT_C_OUTPUT_TOKENS)) * 1e6;
    case AM_BURN_RATE: {
        if (!burn || !(burn->objective > 0 && burn->objective < 1))
            return NAN;
        if (!short_then || short_then->t_ns >= now->t_ns)
            return NAN;
        double budget = 1 - burn->objective;
        double l = burn_bad_fraction(burn, now, then) / budget;
        double s = burn_bad_fraction(burn, now, short_then) / budget;
        return isnan(l) || isnan(s) ? NAN : l < s ? l : s;
    }
    default: return NAN;
    }
}

double alert_config_max_window(const struct alert_config *c)
{
    double m = 0;
    for (int i = 0; i < c->n_rules; i++) {
        double w = c->rules[i].window_s > 0 ? c->rules[i].window_s : c->interval_s;
        m = w > m ? w : m;
        m = c->rules[i].burn.short_window_s > m ? c->rules[i].burn.short_window_s : m;
    }
    return m;
}

/* ---------------------------------------------------------------- rings of snapshots */

struct alert_ring {
    struct alert_sample *s; /* [cap] */
    int cap, n, head;       /* head: where the next one goes */
    double spacing_s;
};

static int ring_init(struct alert_ring *r, int cap, double spacing_s)
{
    r->s = calloc((size_t)cap, sizeof *r->s);
    r->cap = cap;
    r->n = r->head = 0;
    r->spacing_s = spacing_s;
    return r->s ? 0 : ERR_NOMEM;
}

static const struct alert_sample *ring_get(const struct alert_ring *r, int i) /* 0: oldest */
{
    return &r->s[(r->head - r->n + i + r->cap) % r->cap];
}

static void ring_push(struct alert_ring *r, const struct alert_sample *s)
{
    if (!r->s)
        return;
    if (r->n) {
        const struct alert_sample *last = ring_get(r, r->n - 1);
        /* 5% slack: a sampler woken every second must not skip every other one for a late tick */
        if ((double)(s->t_ns - last->t_ns) < r->spacing_s * 0.95e9)
            return;
    }
    r->s[r->head] = *s;
    r->head = (r->head + 1) % r->cap;
    if (r->n < r->cap)
        r->n++;
}

/* Newest sample at or before t, else the oldest; NULL when empty. */
static const struct alert_sample *ring_at(const struct alert_ring *r, int64_t t)
{
    if (!r->n)
        return NULL;
    int lo = 0, hi = r->n - 1, best = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (ring_get(r, mid)->t_ns <= t) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ring_get(r, best >= 0 ? best : 0);
}

/* ---------------------------------------------------------------- the engine */

struct alert_rule_state {
    enum alert_state state;
    double value;
    double active_at, fired_at, resolved_at;
    bool restored; /* pending or firing as read back from the store, not yet confirmed by data */
    uint64_t fingerprint;
};

struct alert_engine {
    pthread_mutex_t mu;
    const struct alert_config *cfg;
    struct alert_store *store;
    struct alert_ring fine, coarse; /* coarse.s NULL when no rule looks past the fine ring */
    struct alert_rule_state *st;    /* [cfg->n_rules] */
    int64_t t_start;
    double max_window_s;
};

const char *alert_state_name(enum alert_state s)
{
    switch (s) {
    case ALERT_PENDING: return "pending";
    case ALERT_FIRING: return "firing";
    case ALERT_RESOLVED: return "resolved";
    default: return "inactive";
    }
}

/* Labels of a rule's alert as a JSON object: alertname, severity, then the rule's own labels. */
static json_t *rule_labels(const struct alert_rule *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "alertname", json_string(r->name));
    if (r->severity)
        json_object_set_new(o, "severity", json_string(r->severity));
    for (int i = 0; i < r->labels.n; i++)
        json_object_set_new(o, r->labels.key[i], json_string(r->labels.value[i]));
    return o;
}

/* Alertmanager's fingerprint: FNV-1a 64 over the label names and values sorted by name, each followed by
 * the separator byte 255. */
static uint64_t labels_fingerprint(json_t *labels)
{
    const char *keys[ALERT_MAX_LABELS + 2];
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(labels, k, v)
    {
        if (n < sizeof keys / sizeof keys[0])
            keys[n++] = k;
    }
    for (size_t i = 1; i < n; i++) /* insertion sort: a handful of labels */
        for (size_t j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
            const char *t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
        }
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        const char *parts[2] = {keys[i], json_string_value(json_object_get(labels, keys[i]))};
        for (int p = 0; p < 2; p++) {
            for (const unsigned char *c = (const unsigned char *)(parts[p] ? parts[p] : ""); *c; c++) {
                h ^= *c;
                h *= 1099511628211ULL;
            }
            h ^= 255;
            h *= 1099511628211ULL;
        }
    }
    return h;
}

/* The labels' fingerprint of every rule of cfg into st (values NaN, states inactive). 0 or ERR_NOMEM. */
static int rule_states_init(const struct alert_config *cfg, struct alert_rule_state *st)
{
    for (int i = 0; i < cfg->n_rules; i++) {
        st[i].value = NAN;
        json_t *l = rule_labels(&cfg->rules[i]);
        if (!l)
            return ERR_NOMEM;
        st[i].fingerprint = labels_fingerprint(l);
        json_decref(l);
    }
    return 0;
}

struct restore_ctx {
    struct alert_engine *e;
    double now_unix;
};

static void restore_one(void *ctx, const char *rule, int state, double active_at, double fired_at, double resolved_at,
                        double value)
{
    struct restore_ctx *rc = ctx;
    struct alert_engine *e = rc->e;
    for (int i = 0; i < e->cfg->n_rules; i++) {
        if (strcmp(e->cfg->rules[i].name, rule))
            continue;
        struct alert_rule_state *s = &e->st[i];
        if (state < ALERT_INACTIVE || state > ALERT_RESOLVED)
            return;
        s->state = (enum alert_state)state;
        s->active_at = active_at;
        s->fired_at = fired_at;
        s->resolved_at = resolved_at;
        s->value = value;
        s->restored = state == ALERT_PENDING || state == ALERT_FIRING;
        if (s->state == ALERT_RESOLVED && rc->now_unix - resolved_at > e->cfg->resolved_retention_s)
            s->state = ALERT_INACTIVE;
        if (s->state != ALERT_INACTIVE)
            log_info("alerts: %s restored as %s", rule, alert_state_name(s->state));
        return;
    }
}

struct alert_engine *alert_engine_create(const struct alert_config *cfg, struct alert_store *store, int64_t now_ns,
                                         double now_unix)
{
    struct alert_engine *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    pthread_mutex_init(&e->mu, NULL);
    e->cfg = cfg;
    e->store = store;
    e->t_start = now_ns;
    e->max_window_s = alert_config_max_window(cfg);
    e->st = calloc((size_t)(cfg->n_rules ? cfg->n_rules : 1), sizeof *e->st);
    if (!e->st || ring_init(&e->fine, (int)(ALERT_FINE_SPAN_S / ALERT_FINE_SPACING_S) + 8, ALERT_FINE_SPACING_S))
        goto fail;
    if (e->max_window_s > ALERT_FINE_SPAN_S &&
        ring_init(&e->coarse, (int)(e->max_window_s / ALERT_COARSE_SPACING_S) + 4, ALERT_COARSE_SPACING_S))
        goto fail;
    if (rule_states_init(cfg, e->st))
        goto fail;
    if (store) {
        struct restore_ctx rc = {e, now_unix};
        alert_store_load_states(store, restore_one, &rc);
    }
    return e;
fail:
    alert_engine_destroy(e);
    return NULL;
}

void alert_engine_destroy(struct alert_engine *e)
{
    if (!e)
        return;
    free(e->fine.s);
    free(e->coarse.s);
    free(e->st);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int alert_engine_set_config(struct alert_engine *e, const struct alert_config *cfg)
{
    struct alert_rule_state *st = calloc((size_t)(cfg->n_rules ? cfg->n_rules : 1), sizeof *st);
    if (!st || rule_states_init(cfg, st)) {
        free(st);
        return ERR_NOMEM;
    }
    double max_window = alert_config_max_window(cfg);
    struct alert_ring coarse = {0};
    int need = (int)(max_window / ALERT_COARSE_SPACING_S) + 4;
    pthread_mutex_lock(&e->mu);
    /* a rule looking further back than any before: a larger coarse ring, holding what the old one had */
    if (max_window > ALERT_FINE_SPAN_S && (!e->coarse.s || e->coarse.cap < need)) {
        if (ring_init(&coarse, need, ALERT_COARSE_SPACING_S)) {
            pthread_mutex_unlock(&e->mu);
            free(st);
            return ERR_NOMEM;
        }
        for (int i = 0; i < e->coarse.n; i++)
            ring_push(&coarse, ring_get(&e->coarse, i));
        free(e->coarse.s);
        e->coarse = coarse;
    }
    for (int i = 0; i < cfg->n_rules; i++) /* the same alert (name and labels): its state goes on */
        for (int k = 0; k < e->cfg->n_rules; k++)
            if (e->st[k].fingerprint == st[i].fingerprint && !strcmp(e->cfg->rules[k].name, cfg->rules[i].name)) {
                st[i] = e->st[k];
                break;
            }
    free(e->st);
    e->st = st;
    e->cfg = cfg;
    if (max_window > e->max_window_s)
        e->max_window_s = max_window;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void alert_engine_record(struct alert_engine *e, const struct alert_sample *s)
{
    pthread_mutex_lock(&e->mu);
    ring_push(&e->fine, s);
    ring_push(&e->coarse, s);
    pthread_mutex_unlock(&e->mu);
}

/* The snapshot window_s before now: from the fine ring when it reaches that far back, else the coarse. */
static const struct alert_sample *window_start(struct alert_engine *e, const struct alert_sample *now, double window_s)
{
    int64_t t = now->t_ns - (int64_t)(window_s * 1e9);
    const struct alert_sample *f = ring_at(&e->fine, t);
    if (e->coarse.s && f && f->t_ns > t) {
        const struct alert_sample *c = ring_at(&e->coarse, t);
        if (c && c->t_ns < f->t_ns)
            return c;
    }
    return f;
}

static double measure_locked(struct alert_engine *e, const struct alert_measure *m, const struct alert_burn *burn,
                             const struct alert_sample *now, double window_s)
{
    const struct alert_sample *then = window_start(e, now, window_s), *short_then = NULL;
    if (m->kind == AM_BURN_RATE && burn) {
        double sw = burn->short_window_s > 0 ? burn->short_window_s : window_s / 12;
        short_then = window_start(e, now, sw);
    }
    return alert_measure_value(m, burn, now, then, short_then);
}

double alert_engine_measure(struct alert_engine *e, const struct alert_measure *m, const struct alert_burn *burn,
                            const struct alert_sample *now, double window_s)
{
    pthread_mutex_lock(&e->mu);
    double v = measure_locked(e, m, burn, now, window_s);
    pthread_mutex_unlock(&e->mu);
    return v;
}

double alert_engine_measure_at(struct alert_engine *e, const struct alert_measure *m, int64_t t_ns, double window_s)
{
    pthread_mutex_lock(&e->mu);
    const struct alert_sample *end = ring_at(&e->fine, t_ns);
    double v = NAN;
    if (end && end->t_ns <= t_ns) {
        struct alert_sample copy = *end; /* window_start may return a slot the ring reuses: copy first */
        v = measure_locked(e, m, NULL, &copy, window_s);
    }
    pthread_mutex_unlock(&e->mu);
    return v;
}

static bool alert_compare(enum alert_op op, double v, double t)
{
    if (isnan(v))
        return false;
    switch (op) {
    case ALERT_OP_GT: return v > t;
    case ALERT_OP_GE: return v >= t;
    case ALERT_OP_LT: return v < t;
    case ALERT_OP_LE: return v <= t;
    case ALERT_OP_EQ: return v == t;
    case ALERT_OP_NE: return v != t;
    }
    return false;
}

static void save_state(struct alert_engine *e, int i)
{
    if (!e->store)
        return;
    const struct alert_rule_state *s = &e->st[i];
    if (alert_store_save_state(e->store, e->cfg->rules[i].name, s->state, s->active_at, s->fired_at, s->resolved_at,
                               s->value))
        log_warn("alerts: cannot save the state of %s; it will not survive a restart", e->cfg->rules[i].name);
}

int alert_engine_eval(struct alert_engine *e, const struct alert_sample *now, double now_unix)
{
    pthread_mutex_lock(&e->mu);
    ring_push(&e->fine, now);
    ring_push(&e->coarse, now);
    double uptime = (double)(now->t_ns - e->t_start) / 1e9;
    int changed = 0;
    for (int i = 0; i < e->cfg->n_rules; i++) {
        const struct alert_rule *r = &e->cfg->rules[i];
        struct alert_rule_state *s = &e->st[i];
        double w = r->window_s > 0 ? r->window_s : e->cfg->interval_s;
        double v = measure_locked(e, &r->measure, &r->burn, now, w);
        enum alert_state before = s->state;
        if (isnan(v) && s->restored && uptime < w)
            continue; /* restored pending/firing, and no data yet since the restart: keep it */
        s->restored = false;
        s->value = v;
        bool cond = alert_compare(r->op, v, r->threshold);
        switch (s->state) {
        case ALERT_INACTIVE:
        case ALERT_RESOLVED:
            if (cond) {
                s->state = ALERT_PENDING;
                s->active_at = now_unix;
                s->fired_at = s->resolved_at = 0;
            } else if (s->state == ALERT_RESOLVED && now_unix - s->resolved_at >= e->cfg->resolved_retention_s) {
                s->state = ALERT_INACTIVE;
            }
            break;
        case ALERT_PENDING:
            if (!cond) {
                s->state = ALERT_INACTIVE;
                s->active_at = 0;
            }
            break;
        case ALERT_FIRING:
            if (!cond) {
                s->state = ALERT_RESOLVED;
                s->resolved_at = now_unix;
            }
            break;
        }
        if (s->state == ALERT_PENDING && now_unix - s->active_at >= r->for_s) {
            s->state = ALERT_FIRING;
            s->fired_at = now_unix;
        }
        if (s->state != before) {
            changed++;
            log_write(s->state == ALERT_FIRING ? LOG_WARN : LOG_INFO, "alert %s: %s -> %s (%s = %g, threshold %g)",
                      r->name, alert_state_name(before), alert_state_name(s->state), r->measure_name, v, r->threshold);
            save_state(e, i);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return changed;
}

/* Annotation text with {{ $value }} and {{ $threshold }} (spaces optional) replaced. Caller frees. */
static char *expand_annotation(const char *tmpl, double value, double threshold)
{
    size_t cap = strlen(tmpl) + 64, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = tmpl; *p;) {
        const char *open = strstr(p, "{{");
        const char *close = open ? strstr(open, "}}") : NULL;
        size_t lit = open && close ? (size_t)(open - p) : strlen(p);
        char num[64] = "";
        bool sub = false;
        if (open && close) {
            char name[32];
            const char *a = open + 2, *b = close;
            while (a < b && *a == ' ')
                a++;
            while (b > a && b[-1] == ' ')
                b--;
            size_t nl = (size_t)(b - a);
            if (nl < sizeof name) {
                memcpy(name, a, nl);
                name[nl] = 0;
                if (!strcmp(name, "$value") || !strcmp(name, ".Value")) {
                    snprintf(num, sizeof num, "%.4g", value);
                    sub = true;
                } else if (!strcmp(name, "$threshold")) {
                    snprintf(num, sizeof num, "%.4g", threshold);
                    sub = true;
                }
            }
            if (!sub)
                lit = (size_t)(close + 2 - p); /* unknown template: kept as written */
        }
        size_t need = len + lit + strlen(num) + 1;
        if (need > cap) {
            cap = need * 2;
            char *n = realloc(out, cap);
            if (!n) {
                free(out);
                return NULL;
            }
            out = n;
        }
        memcpy(out + len, p, lit);
        len += lit;
        if (sub) {
            memcpy(out + len, num, strlen(num));
            len += strlen(num);
            p = close + 2;
        } else {
            p += lit;
        }
    }
    out[len] = 0;
    return out;
}

struct alert_view *alert_engine_views(struct alert_engine *e, bool all, int *n)
{
    *n = 0;
    pthread_mutex_lock(&e->mu);
    int k = 0;
    for (int i = 0; i < e->cfg->n_rules; i++)
        k += all || e->st[i].state != ALERT_INACTIVE;
    struct alert_view *v = k ? calloc((size_t)k, sizeof *v) : NULL;
    if (!v) {
        pthread_mutex_unlock(&e->mu);
        return NULL;
    }
    int j = 0;
    for (int i = 0; i < e->cfg->n_rules; i++) {
        const struct alert_rule_state *s = &e->st[i];
        if (!all && s->state == ALERT_INACTIVE)
            continue;
        const struct alert_rule *r = &e->cfg->rules[i];
        struct alert_view *a = &v[j++];
        a->rule = r;
        a->state = s->state;
        a->value = s->value;
        a->active_at = s->active_at;
        a->fired_at = s->fired_at;
        a->resolved_at = s->resolved_at;
        a->fingerprint = s->fingerprint;
        a->labels = rule_labels(r);
        a->annotations = json_object();
        for (int q = 0; q < r->annotations.n; q++) {
            char *t = expand_annotation(r->annotations.value[q], s->value, r->threshold);
            json_object_set_new(a->annotations, r->annotations.key[q], json_string(t ? t : r->annotations.value[q]));
            free(t);
        }
    }
    pthread_mutex_unlock(&e->mu);
    *n = j;
    return v;
}

void alert_views_free(struct alert_view *v, int n)
{
    for (int i = 0; v && i < n; i++) {
        json_decref(v[i].labels);
        json_decref(v[i].annotations);
    }
    free(v);
}

void alert_time_format(double unix_s, char *buf)
{
    if (unix_s <= 0) {
        strcpy(buf, "0001-01-01T00:00:00Z");
        return;
    }
    time_t secs = (time_t)unix_s;
    unsigned ms = (unsigned)((unix_s - (double)secs) * 1000) % 1000u;
    struct tm tm;
    gmtime_r(&secs, &tm);
    size_t n = strftime(buf, 24, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, 32 - n, ".%03uZ", ms);
}

void alert_fingerprint_format(uint64_t fp, char *buf) { snprintf(buf, 17, "%016llx", (unsigned long long)fp); }
