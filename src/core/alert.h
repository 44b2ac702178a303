/*
 * alert: alert rules evaluated in-process over windows of the measures an LLM server exposes, with the
 * states Prometheus gives an alert (inactive, pending, firing, and resolved kept for a while so the
 * notifier can say so). It lives in core, below every layer that serves, and knows nothing of where the
 * measures come from: `wafer serve` feeds it from its /metrics counters and histograms, `wafer route` can
 * feed it from what it measures at the proxy, `wafer alerts check` from a scraped /metrics text.
 *
 * Measures. A source fills a struct alert_sample: cumulative counters (requests, errors, tokens, ...),
 * cumulative histograms (per-bucket counts, as /metrics has them) and gauges, stamped with the monotonic
 * clock. The engine keeps time-bucketed snapshots (one a second for 15 minutes; one every 30 s up to the
 * longest window a rule asks for, at most 24 h) and computes a measure over a window from the difference
 * between the newest sample and the one taken window_s earlier: rates from counter deltas, percentiles
 * with histogram_quantile's linear interpolation inside the bucket, gauges as read at the newest sample.
 * A counter that went down (the source restarted) counts from zero, as Prometheus's rate() does. A measure
 * with no samples in its window (no requests, so no TTFT) is NaN and never fires.
 *
 * Measure names (the rule's `measure`, the dashboard's data-metric names):
 *   ttft_pNN_ms, itl_pNN_ms, e2e_pNN_ms, queue_pNN_ms   NN-th percentile (p50, p90, p95, p99, p999 = 99.9)
 *   ttft_mean_ms, itl_mean_ms, e2e_mean_ms, queue_mean_ms
 *   error_rate                 failed / answered generation requests (0..1)
 *   output_tokens_per_second, prompt_tokens_per_second, requests_per_second, preemptions_per_second
 *   kv_usage (0..1), queue_depth (also: waiting), running, batch_limit, prefill_chunk,
 *   prefix_cache_usage (0..1)
 *   watts, tokens_per_joule    from the energy counter (absent: NaN)
 *   cost_per_million_tokens    from the cost counter (dollars per 1M generated tokens)
 *   burn_rate                  SLO burn rate: the bad fraction over the window divided by the error budget
 *                              (1 - objective), the smaller of the long (window_s) and the short
 *                              (short_window_s) window, so `burn_rate > 14.4` fires only when both burn
 *                              (Google SRE's multiwindow alert). Bad = failed requests, or with `latency:
 *                              ttft|itl|e2e|queue` and `latency_ms`, observations slower than that.
 *
 * Rule states (per rule; a rule is one alert, its labels are fixed):
 *   inactive -> pending      the condition holds (value op threshold)
 *   pending  -> firing       it held for for_s (for_s 0: at once)
 *   pending  -> inactive     it stopped holding first
 *   firing   -> resolved     it stopped holding; kept RESOLVED for resolved_retention_s, then inactive
 *   resolved -> pending      it holds again (a new alert: new activeAt)
 * Transitions are written to the store (alert_store.h) when one is given, and states are restored from it
 * at create: a restart neither forgets a firing alert nor announces again one already resolved. For the
 * first window after a restart a restored pending or firing alert whose measure has no samples yet keeps
 * its state (no data is not proof of recovery); after that, no samples means not firing.
 *
 * Threads: every alert_engine_* function takes the engine's mutex, so the evaluating thread and readers
 * (an HTTP handler listing alerts) may call them concurrently. alert_config_* are single-threaded.
 */
#ifndef WAFER_CORE_ALERT_H
#define WAFER_CORE_ALERT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define ALERT_MAX_BUCKETS 32 /* finite bounds per histogram */
#define ALERT_MAX_LABELS 16
#define ALERT_MAX_LIST 16

/* ---------------------------------------------------------------- samples */

enum alert_hist { ALERT_H_TTFT, ALERT_H_ITL, ALERT_H_E2E, ALERT_H_QUEUE, ALERT_H_COUNT_ };

enum alert_counter {
    ALERT_C_REQUESTS,      /* generation requests answered, any status */
    ALERT_C_ERRORS,        /* of which failed on the server's side (5xx, 429) */
    ALERT_C_OUTPUT_TOKENS, /* generated tokens */
    ALERT_C_PROMPT_TOKENS,
    ALERT_C_PREEMPTIONS,
    ALERT_C_ENERGY_J,      /* joules consumed (NaN: not measured) */
    ALERT_C_COST,          /* dollars accrued by the machine (NaN: no price configured) */
    ALERT_C_COUNT_
};

enum alert_gauge {
    ALERT_G_RUNNING,      /* requests in the running batch */
    ALERT_G_WAITING,      /* requests waiting for admission */
    ALERT_G_KV_USAGE,     /* KV blocks in use / pool size, 0..1 */
    ALERT_G_PREFIX_USAGE, /* KV blocks held by the prefix cache / pool size, 0..1 */
    ALERT_G_BATCH_LIMIT,  /* running sequences the scheduler admits now (NaN: none) */
    ALERT_G_PREFILL_CHUNK, /* prompt tokens a step carries now (NaN: none) */
    ALERT_G_COUNT_
};

/* One histogram as /metrics has it: per-bucket (not cumulative) counts; counts[n_bounds] is +Inf. */
struct alert_hist_sample {
    const double *bounds; /* [n_bounds] ascending upper bounds in seconds, owned by the source */
    int n_bounds;
    uint64_t counts[ALERT_MAX_BUCKETS + 1];
    double sum; /* seconds */
    uint64_t count;
};

struct alert_sample {
    int64_t t_ns; /* clock_now_ns() when taken */
    double counter[ALERT_C_COUNT_];
    double gauge[ALERT_G_COUNT_];
    struct alert_hist_sample hist[ALERT_H_COUNT_];
};

/* Fills s with zeros and every counter/gauge that may be unknown (energy, cost, batch limit) with NaN. */
void alert_sample_init(struct alert_sample *s, int64_t t_ns);

/* The q-quantile (0..1) of the observations between then and now (then may be NULL: since zero), in
 * seconds, by Prometheus's histogram_quantile: linear inside the bucket, the highest finite bound when it
 * falls in +Inf. NaN when there is no observation. */
double alert_hist_quantile(const struct alert_hist_sample *now, const struct alert_hist_sample *then, double q);
/* Fraction (0..1) of those observations above x seconds, linear inside the bucket holding x. NaN when none. */
double alert_hist_fraction_above(const struct alert_hist_sample *now, const struct alert_hist_sample *then,
                                 double x);

/* Histogram bounds read from a Prometheus text (alert_sample_from_prometheus), owned by the caller. */
struct alert_prom_bounds {
    double b[ALERT_H_COUNT_][ALERT_MAX_BUCKETS];
};

/* Reads the wafer_* metrics of a /metrics text (format 0.0.4, as metrics.c writes it) into s: requests and
 * errors from wafer_requests_total of the generation endpoints, tokens, preemptions, the four latency
 * histograms (cumulative buckets made per-bucket; their bounds go into bounds), the gauges (KV use from
 * blocks used / total), energy and cost when present. Lines it does not know are skipped. 0, or
 * ERR_FORMAT when the text holds no wafer_ histogram (not a wafer /metrics). */
int alert_sample_from_prometheus(const char *text, size_t len, struct alert_sample *s, struct alert_prom_bounds *bounds);

/* ---------------------------------------------------------------- measures */

enum alert_measure_kind {
    AM_QUANTILE, AM_MEAN, AM_ERROR_RATE, AM_OUTPUT_TPS, AM_PROMPT_TPS, AM_REQUESTS_PS, AM_PREEMPTIONS_PS,
    AM_KV_USAGE, AM_PREFIX_USAGE, AM_QUEUE_DEPTH, AM_RUNNING, AM_BATCH_LIMIT, AM_PREFILL_CHUNK, AM_WATTS, AM_TOKENS_PER_JOULE,
    AM_COST_PER_MTOK, AM_BURN_RATE,
};

struct alert_measure {
    enum alert_measure_kind kind;
    enum alert_hist hist; /* AM_QUANTILE, AM_MEAN */
    double q;             /* AM_QUANTILE: 0..1 */
};

/* Parses a measure name (list above). 0 or ERR_INVALID_ARG. */
int alert_measure_parse(const char *name, struct alert_measure *out);
/* The names alert_measure_parse knows, for messages ("ttft_p95_ms, ..."). */
const char *alert_measure_names(void);

/* Burn-rate parameters of a rule (ignored by other measures). */
struct alert_burn {
    double objective;      /* e.g. 0.99: 1% error budget */
    double short_window_s; /* 0: window_s / 12 */
    int latency_hist;      /* -1: bad = failed requests; else an alert_hist, bad = slower than latency_s */
    double latency_s;
};

/* Value of m over the window ending at now and starting at then (then NULL or as new as now: NaN for
 * windowed measures). short_then is the start of the short window (burn rate only). */
double alert_measure_value(const struct alert_measure *m, const struct alert_burn *burn, const struct alert_sample *now,
                           const struct alert_sample *then, const struct alert_sample *short_then);

/* ---------------------------------------------------------------- configuration */

enum alert_op { ALERT_OP_GT, ALERT_OP_GE, ALERT_OP_LT, ALERT_OP_LE, ALERT_OP_EQ, ALERT_OP_NE };

struct alert_labels {
    int n;
    char *key[ALERT_MAX_LABELS];
    char *value[ALERT_MAX_LABELS];
};

struct alert_rule {
    char *name;    /* the alertname label */
    char *measure_name;
    struct alert_measure measure;
    struct alert_burn burn;
    double window_s; /* 0: the evaluation interval */
    enum alert_op op;
    double threshold;
    double for_s;
    char *severity; /* NULL: no severity label */
    struct alert_labels labels;
    struct alert_labels annotations; /* values may hold {{ $value }}, {{ $threshold }} */
    char *receivers[ALERT_MAX_LIST]; /* none: every receiver */
    int n_receivers;
    int line; /* in the config file, for messages */
};

enum alert_receiver_kind { ALERT_RECV_WEBHOOK, ALERT_RECV_ALERTMANAGER, ALERT_RECV_SLACK };

struct alert_receiver {
    char *name;
    enum alert_receiver_kind kind;
    char *url;
    bool send_resolved;        /* default true */
    char *group_by[ALERT_MAX_LIST]; /* label names (default: alertname) */
    int n_group_by;
    double group_wait_s;       /* first notification of a new group waits this long (default 0) */
    double group_interval_s;   /* between notifications of one group that changed (default 30) */
    double repeat_interval_s;  /* re-send an unchanged firing group (default 4 h; alertmanager kind: 60 s) */
    double min_interval_s;     /* rate limit: between two posts to this receiver (default 1) */
    double timeout_s;          /* per post (default 5) */
    int max_attempts;          /* posts of one notification before it is dropped (default 10) */
    double max_backoff_s;      /* backoff doubles from 1 s up to this (default 300) */
};

struct alert_config {
    double interval_s;           /* evaluation period (default 5) */
    double resolved_retention_s; /* how long a resolved alert is remembered (default 900) */
    char *data_dir;              /* where alerts.sqlite keeps states and the outbox; NULL: memory only */
    char *external_url;          /* externalURL of notifications; NULL: the server's own URL */
    struct alert_rule *rules;
    int n_rules;
    struct alert_receiver *receivers;
    int n_receivers;
};

void alert_config_init(struct alert_config *c);
void alert_config_deinit(struct alert_config *c);

struct fy_node;
/* Reads the `alerts:` mapping (interval_s, resolved_retention_s, data_dir, external_url, rules, receivers;
 * docs/observability.md) into c, replacing what c had. file names the document in messages, which are
 * "file:line: alerts.rules[2].measure: ..."; base (the file's path, or NULL) resolves a relative data_dir.
 * 0 or ERR_INVALID_ARG / ERR_NOMEM with the message in err. */
int alert_config_parse(struct alert_config *c, struct fy_node *alerts, const char *file, const char *base, char *err);
/* Same from YAML text holding a top-level `alerts:` key (other keys are ignored). */
int alert_config_load_string(struct alert_config *c, const char *yaml, size_t len, const char *file, char *err);

/* Longest window any rule looks back (both burn windows), seconds. */
double alert_config_max_window(const struct alert_config *c);

/* ---------------------------------------------------------------- the engine */

enum alert_state { ALERT_INACTIVE = 0, ALERT_PENDING, ALERT_FIRING, ALERT_RESOLVED };
const char *alert_state_name(enum alert_state s);

/* What a reader (the notifier, an HTTP handler) sees of one rule's alert, copied under the lock. */
struct alert_view {
    const struct alert_rule *rule; /* valid while the config given to alert_engine_create lives */
    enum alert_state state;
    double value;                             /* at the last evaluation (NaN: no samples) */
    double active_at, fired_at, resolved_at;  /* unix seconds, 0 when not (yet) */
    uint64_t fingerprint;                     /* of the labels, as Alertmanager computes one (FNV-1a 64) */
    json_t *labels;      /* {alertname, severity, ...rule labels} (owned by the view) */
    json_t *annotations; /* expanded with the last value (owned by the view) */
};

struct alert_store;
struct alert_engine;

/* cfg must outlive the engine; store may be NULL (states live in memory only). now_unix is the wall clock
 * (restored states are judged against it). NULL on OOM. */
struct alert_engine *alert_engine_create(const struct alert_config *cfg, struct alert_store *store, int64_t now_ns,
                                         double now_unix);
void alert_engine_destroy(struct alert_engine *e);
/* Evaluates cfg's rules from now on (a configuration reloaded): a rule whose alert has the same name and
 * labels as one before keeps its state, a new one starts inactive, one no longer there is forgotten; the
 * recorded windows stay (a rule looking further back than any before gets a longer coarse ring). cfg must
 * outlive the engine or the next call; the previous config may be freed once no view taken before this call
 * is in use (the caller's business: views point into it). 0, or ERR_NOMEM and nothing changed. */
int alert_engine_set_config(struct alert_engine *e, const struct alert_config *cfg);

/* Keeps s as a snapshot when one is due in a ring (once a second for the fine ring, every 30 s for the
 * coarse one); samples must come in time order. */
void alert_engine_record(struct alert_engine *e, const struct alert_sample *s);
/* Evaluates every rule against now (the newest sample; recorded first when due) at wall time now_unix;
 * returns how many rules changed state. */
int alert_engine_eval(struct alert_engine *e, const struct alert_sample *now, double now_unix);
/* m over the window_s ending at now, from the recorded snapshots (NaN with none old enough). */
double alert_engine_measure(struct alert_engine *e, const struct alert_measure *m, const struct alert_burn *burn,
                            const struct alert_sample *now, double window_s);

/* m over the window_s ending at the newest snapshot at or before t_ns (past values, for charts): NaN when
 * no snapshot is that old. */
double alert_engine_measure_at(struct alert_engine *e, const struct alert_measure *m, int64_t t_ns, double window_s);

/* Copies the alerts whose state is pending, firing or resolved (all: every rule) into a new array; n is
 * set. Caller frees with alert_views_free. NULL with *n = 0 when there is none or on OOM. */
struct alert_view *alert_engine_views(struct alert_engine *e, bool all, int *n);
void alert_views_free(struct alert_view *v, int n);

/* RFC 3339 UTC with milliseconds ("2024-05-01T12:00:00.123Z"); 0 gives Go's zero time
 * "0001-01-01T00:00:00Z", which Alertmanager's payloads use for "not ended". buf holds 32 bytes. */
void alert_time_format(double unix_s, char *buf);
/* The fingerprint as Alertmanager prints it: 16 hex digits. buf holds 17 bytes. */
void alert_fingerprint_format(uint64_t fp, char *buf);

#endif
