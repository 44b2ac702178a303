/*
 * serve_stats: turns one run's per-request results into the numbers a report shows: counts by outcome,
 * throughput, latency summaries (mean, median, p50/p90/p95/p99, numpy's linear percentiles), goodput against
 * service-level objectives, and cost at a given hourly price.
 */
#ifndef WAFER_BENCH_SERVE_STATS_H
#define WAFER_BENCH_SERVE_STATS_H

#include "bench/serve.h"
#include "core/stats.h"

#define SERVE_STATUS_MAX 16 /* distinct HTTP statuses counted separately */

struct serve_metric {
    struct stats_summary s;  /* n, mean, std, min, max, p50 (= median), p90, p95, p99; NAN when n == 0 */
    double *values;          /* owned, sorted ascending, s.n of them */
};

/* One turn of a run's conversations (--turns > 1). */
struct serve_turn_summary {
    int sent, completed;
    long long input_tokens;            /* over completed requests */
    long long cached_tokens;           /* over completed requests that reported cached_tokens */
    long long cached_of_input;         /* those requests' input tokens: the hit rate's denominator */
    int cached_from_usage;             /* completed requests that reported cached_tokens */
    struct stats_summary ttft;         /* milliseconds, completed requests */
};

struct serve_run_summary {
    int sent, completed, failed;
    int by_outcome[SERVE_OUTCOME_COUNT];
    int http_status[SERVE_STATUS_MAX], http_status_count[SERVE_STATUS_MAX], n_http_status;
    char *error_sample[SERVE_OUTCOME_COUNT]; /* owned: the first message of each failure kind, or NULL */
    double duration_s;
    long long total_input_tokens, total_output_tokens; /* over completed requests */
    int input_from_usage, output_from_usage;           /* completed requests whose usage gave the count */
    long long cached_tokens;  /* prompt tokens a prefix cache served, over completed requests that said */
    long long cached_of_input; /* those requests' input tokens: cached_tokens / cached_of_input is the hit rate */
    int cached_from_usage;    /* completed requests whose usage gave prompt_tokens_details.cached_tokens */
    struct serve_turn_summary *turns; /* owned, one per turn when the run sent conversations, else NULL */
    int n_turns;
    double request_throughput, output_throughput, total_token_throughput; /* per second over duration_s */
    struct serve_metric ttft, tpot, itl, e2e;          /* milliseconds */
    bool has_goodput;
    int good;                 /* completed requests meeting every SLO set */
    double request_goodput;   /* good / duration_s */
    double output_goodput;    /* output tokens of the good requests / duration_s */
    bool has_cost;
    double usd_per_hour, usd_per_request, usd_per_million_output_tokens, usd_per_million_total_tokens;
};

/* Parses "ttft=500ms,tpot=50ms,e2e=10s" (keys ttft, tpot, itl (every gap), itl_p95 (the request's p95
 * gap), e2e or e2el; units us, ms (default), s), or the short form "ITL_P95_MS[,TTFT_MS]" ("50,2000": the
 * targets of `wafer serve`'s slo.itl_p95_ms and slo.ttft_p95_ms, applied per request).
 * Returns 0 or ERR_INVALID_ARG with a message. */
int serve_slo_parse(const char *text, struct serve_slo *out, char *err);

/* Computes the summary of results[0..n). slo may be NULL (no goodput); cost_per_hour NAN = no cost. Returns
 * 0 or ERR_NOMEM. Free with serve_run_summary_deinit. */
int serve_stats_compute(const struct serve_request_result *results, int n, double duration_s,
                        const struct serve_slo *slo, double cost_per_hour, struct serve_run_summary *out, char *err);

/* Fills the cost fields from the throughputs (used at compute time and by `bench compare` overrides). */
void serve_stats_set_cost(struct serve_run_summary *s, double cost_per_hour);

void serve_run_summary_deinit(struct serve_run_summary *s);

/* The prefix cache's hit rate, cached / of_input in [0, 1], or NAN when no input was counted. */
double serve_hit_rate(long long cached, long long of_input);

#endif
