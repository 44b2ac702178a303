/*
 * metrics: the server's counters, gauges and histograms, rendered in the Prometheus text exposition format
 * (version 0.0.4) at GET /metrics. Every name starts with wafer_. Updated from the I/O thread and the engine
 * thread: counters are atomics, histograms and the per-endpoint table take one short mutex.
 *
 * Gauges that belong to other parts (running and waiting requests, KV blocks, connections) are not stored
 * here: the caller passes a snapshot to metrics_render. What the engine measures (tokens, prefix cache,
 * latencies) arrives through the scheduler's observer interface, which metrics_sched_observer implements: the
 * engine never names a server metric.
 */
#ifndef WAFER_SERVER_METRICS_H
#define WAFER_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum metrics_hist {
    MH_TTFT,        /* wafer_time_to_first_token_seconds: arrival -> first generated token */
    MH_ITL,         /* wafer_inter_token_latency_seconds: between consecutive tokens of one sequence */
    MH_E2E,         /* wafer_request_duration_seconds: arrival -> last token */
    MH_QUEUE,       /* wafer_queue_time_seconds: arrival -> admitted to the running batch */
    MH_COUNT_
};

enum metrics_counter {
    MC_PROMPT_TOKENS,       /* wafer_prompt_tokens_total */
    MC_GENERATED_TOKENS,    /* wafer_generation_tokens_total */
    MC_PREFIX_HITS,         /* wafer_prefix_cache_hits_total: admissions that reused cached blocks */
    MC_PREFIX_HIT_TOKENS,   /* wafer_prefix_cache_hit_tokens_total: prompt tokens not recomputed */
    MC_PREFIX_QUERIES,      /* wafer_prefix_cache_queries_total: admissions that looked the cache up */
    MC_PREEMPTIONS,         /* wafer_preemptions_total */
    MC_CANCELLED,           /* wafer_requests_cancelled_total: client went away */
    MC_TIMEOUTS,            /* wafer_requests_timed_out_total: deadline passed */
    MC_REJECTED_QUEUE_FULL, /* wafer_requests_rejected_total (429) */
    MC_ENGINE_STEPS,        /* wafer_engine_steps_total */
    MC_SPEC_DRAFTS,         /* wafer_spec_decode_num_drafts_total: verifies of drafted tokens */
    MC_SPEC_DRAFT_TOKENS,   /* wafer_spec_decode_num_draft_tokens_total */
    MC_SPEC_ACCEPTED_TOKENS, /* wafer_spec_decode_num_accepted_tokens_total */
    MC_COUNT_
};

struct metrics;

/* Snapshot of the gauges owned elsewhere. */
struct metrics_gauges {
    int64_t running;       /* requests in the running batch */
    int64_t waiting;       /* requests in the wait queue */
    int64_t kv_blocks_used;
    int64_t kv_blocks_total;
    int64_t prefix_cache_blocks; /* blocks held by the prefix cache */
    int64_t connections;
    int ready; /* 1 ready, 0 loading or draining */
    /* what observe.c adds (observe_fill_gauges); NaN or negative: the metric is absent */
    double batch_limit;            /* wafer_batch_limit: running sequences the scheduler admits now */
    double prefill_chunk;          /* wafer_prefill_chunk: prompt tokens a step carries now */
    double cost_per_hour;          /* wafer_cost_per_hour_dollars */
    double cost_total;             /* wafer_cost_dollars_total: machine cost accrued since start */
    double cost_per_mtok;          /* wafer_cost_per_million_tokens_dollars, over the last minute */
    double energy_joules;          /* wafer_energy_joules_total (RAPL, measured) */
    double tokens_per_joule;       /* wafer_tokens_per_joule, over the last minute (measured) */
    double energy_est_joules;      /* wafer_energy_estimated_joules_total (configured watts, not measured) */
    double tokens_per_joule_est;   /* wafer_tokens_per_joule_estimated */
    int alerts_firing, alerts_pending; /* wafer_alerts{state} (-1: no alerting) */
    long long notif_sent, notif_failed, notif_dropped; /* wafer_alert_notifications_total{result} */
    int notif_pending;             /* wafer_alert_notifications_pending */
};

/* A metrics_gauges with the observe.c part absent (NaN, -1). */
void metrics_gauges_init(struct metrics_gauges *g);

/* Answers of the generation endpoints (completions, chat, generate, batch_generate, generate_stream) by kind. */
struct metrics_answers {
    uint64_t total;
    uint64_t ok;            /* 2xx */
    uint64_t client_errors; /* 4xx but 408, 429, 499: the request was wrong */
    uint64_t rejected;      /* 429: queue full */
    uint64_t timed_out;     /* 408: request_timeout passed */
    uint64_t cancelled;     /* 499: the client went away */
    uint64_t server_errors; /* 5xx */
};
void metrics_answers_get(struct metrics *m, struct metrics_answers *out);

struct metrics;
struct sched_observer;

/* NULL on OOM. Caller frees with metrics_destroy. */
struct metrics *metrics_create(void);
void metrics_destroy(struct metrics *m);

/* Counts one finished HTTP request. endpoint is a route ("/v1/completions"); unknown ones count as "other". */
void metrics_request(struct metrics *m, const char *endpoint, int status);
void metrics_add(struct metrics *m, enum metrics_counter c, int64_t v);
int64_t metrics_get(const struct metrics *m, enum metrics_counter c);
void metrics_observe(struct metrics *m, enum metrics_hist h, double seconds);
/* Counts one error the HTTP layer answered itself (wafer_http_errors_total{status}: 400, 408, 413, 431, 501,
 * 503; any other status counts as "other"). */
void metrics_http_error(struct metrics *m, int status);

/* Fills obs so that the scheduler's measures land in m's counters and histograms (its enums map onto
 * MC_* and MH_*, and the accepted drafted tokens by position onto
 * wafer_spec_decode_num_accepted_tokens_per_pos_total{position}; measures without a metric are dropped).
 * m must outlive the scheduler given obs. */
void metrics_sched_observer(struct metrics *m, struct sched_observer *obs);

struct alert_sample;
/* Fills the counters and histograms of an alert sample (core/alert.h) from m, as /metrics shows them:
 * requests = answers of the generation endpoints, errors = those that failed on the server's side (5xx,
 * 429 queue full, 408 deadline passed), tokens, preemptions, and the four latency histograms. The gauges,
 * energy and cost are the caller's. The histograms' bounds point into m's static tables. */
void metrics_sample(struct metrics *m, struct alert_sample *s);

/* Renders everything into a malloc'd NUL-terminated string (caller frees); NULL on OOM. */
char *metrics_render(struct metrics *m, const struct metrics_gauges *g, size_t *len);

#endif
