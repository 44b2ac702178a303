/*
 * serve_report: what `wafer bench serve` shows: a plain-text block per run and a sweep table on stdout, the
 * JSON result (schema in docs/bench.md), and the self-contained HTML page (serve_html.c).
 */
#ifndef WAFER_BENCH_SERVE_REPORT_H
#define WAFER_BENCH_SERVE_REPORT_H

#include "bench/serve.h"
#include "bench/serve_stats.h"

#include <stdio.h>

#define SERVE_JSON_SCHEMA "wafer.bench.serve/1"

/* One point of a sweep. */
struct serve_run {
    int concurrency;       /* > 0 in closed-loop mode, else 0 */
    double request_rate;   /* > 0 (or INFINITY) in open-loop mode, else 0 */
    int input_len;         /* target prompt tokens; 0 for a dataset */
    int output_len;        /* max_tokens asked; 0 for a dataset (per row) */
    struct serve_run_summary s;
    struct serve_request_result *requests; /* owned, kept only with --detailed (else NULL) */
    int n_requests;
};

struct serve_quality_case {
    int outcome;           /* enum serve_outcome */
    char *error;           /* owned, NULL when completed */
    char *answer;          /* owned generated text (may be NULL) */
    double score;          /* fraction of keywords found */
    bool *found;           /* owned, one per keyword */
};

struct serve_quality {
    const char *path;
    struct serve_prompt_set cases;       /* owned */
    struct serve_quality_case *results;  /* owned, cases.n of them */
    double score;                        /* mean of the case scores */
};

struct serve_report {
    const struct serve_options *opt;
    const char *endpoint_url;   /* the URL requests went to */
    const char *model;          /* the model sent (or NULL) */
    const char *label;          /* the name of this setup */
    char started_at[32];        /* ISO 8601 UTC */
    double tokens_per_word;     /* synthetic prompt sizing (1.0 unless calibrated) */
    bool calibrated;
    struct serve_run *runs;
    int n_runs;                 /* runs done so far */
    int n_planned;              /* runs in the whole sweep */
    struct serve_quality *quality; /* NULL when --quality was not given */
};

/* The block for runs[i]: counts, duration, throughput, goodput, cost, the latency table. */
void serve_report_print_run(FILE *f, const struct serve_report *rep, int i);

/* One row per run (printed when there are several). */
void serve_report_print_sweep(FILE *f, const struct serve_report *rep);

/* The per-case and overall quality scores. */
void serve_report_print_quality(FILE *f, const struct serve_quality *q);

/* Writes the JSON result to path. Returns 0 or ERR_IO with a message. */
int serve_report_write_json(const struct serve_report *rep, const char *path, char *err);

/* Writes the HTML page to path (serve_html.c). Returns 0 or ERR_IO with a message. */
int serve_report_write_html(const struct serve_report *rep, const char *path, char *err);

/* "concurrency 4" / "rate 2.5 req/s" / "rate inf", plus ", input 128" when input_len > 0. */
void serve_report_run_name(const struct serve_run *r, char *out, size_t cap);

#endif
