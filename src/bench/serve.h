/*
 * serve: `wafer bench serve`, a load tester for any OpenAI-compatible HTTP server. This header holds the
 * types the serve_* modules share: the options from the command line, one prompt, and what one request
 * measured. The flow is serve_run.c (sweeps, orchestration) -> serve_client.c (libcurl multi, SSE) ->
 * serve_stats.c (per-run numbers) -> serve_report.c / serve_html.c (table, JSON, HTML).
 *
 * Timing follows vLLM's benchmark definitions: TTFT is send -> first streamed token, ITL every gap between
 * streamed content chunks, TPOT (E2E - TTFT) / (output tokens - 1), E2E send -> end of stream.
 */
#ifndef WAFER_BENCH_SERVE_H
#define WAFER_BENCH_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#define SERVE_LIST_MAX 64 /* entries in a comma list (--concurrency 1,4,8) */

enum serve_endpoint { SERVE_ENDPOINT_COMPLETIONS = 0, SERVE_ENDPOINT_CHAT = 1 };

/* Every request ends in exactly one of these. */
enum serve_outcome {
    SERVE_OK = 0,
    SERVE_FAIL_CONNECT,  /* could not connect (refused, unreachable, DNS) */
    SERVE_FAIL_HTTP,     /* a response with a status other than 200 */
    SERVE_FAIL_TIMEOUT,  /* --timeout passed before the stream ended */
    SERVE_FAIL_STREAM,   /* malformed SSE/JSON, an error event, cut mid-way or no data: [DONE] */
    SERVE_FAIL_OTHER,    /* any other transport failure (send error, empty reply, ...) */
    SERVE_OUTCOME_COUNT
};

/* "completed", "connect", "http", "timeout", "stream", "other". */
const char *serve_outcome_name(int outcome);

/* Service-level objectives for goodput; a field is NAN when not set. */
struct serve_slo {
    double ttft_ms, tpot_ms, itl_ms, e2e_ms;
    double itl_p95_ms; /* the request's own 95th percentile of its ITL gaps (what `slo.itl_p95_ms` bounds) */
};

/* One prompt to send. Quality cases also carry their expected keywords. */
struct serve_prompt {
    char *text;         /* owned */
    int max_tokens;
    int approx_tokens;  /* synthetic prompts: the target token length; -1 when unknown (datasets) */
    char **keywords;    /* owned, quality cases only */
    int n_keywords;
};

struct serve_prompt_set {
    struct serve_prompt *items;
    int n;
};

/* What one request measured. Times in milliseconds; NAN where not measured. */
struct serve_request_result {
    int outcome;            /* enum serve_outcome */
    int http_status;        /* last status seen, 0 when none */
    char *error;            /* owned one-line reason when it failed, else NULL */
    double start_s;         /* send time, seconds after the run started */
    double ttft_ms;         /* NAN when no content token arrived */
    double e2e_ms;
    double *itl_ms;         /* owned: gaps between consecutive content chunks */
    int n_itl;
    int n_chunks;           /* streamed chunks that carried content */
    int output_tokens;      /* usage.completion_tokens when given, else n_chunks */
    int input_tokens;       /* usage.prompt_tokens when given, else the prompt's approx_tokens (or -1) */
    bool output_from_usage, input_from_usage;
    int cached_tokens;      /* usage.prompt_tokens_details.cached_tokens, -1 when the server did not say */
    int turn;               /* 0-based turn of its conversation (0 unless --turns > 1) */
    char *text;             /* owned generated text, when the run captures it */
};

void serve_request_result_clear(struct serve_request_result *r);

/* Everything `wafer bench serve` takes from the command line. */
struct serve_options {
    const char *url;          /* base URL (http://host:port), .../v1, or a full .../completions URL */
    const char *api_key;      /* NULL: no Authorization header */
    const char *model;        /* NULL: first id from GET /v1/models, else the field is left out */
    const char *label;        /* name of this setup in reports; default: the model */
    int endpoint;             /* enum serve_endpoint */
    int concurrency[SERVE_LIST_MAX], n_concurrency;
    double request_rate[SERVE_LIST_MAX]; /* requests/s, INFINITY = all at once */
    int n_request_rate;
    int input_len[SERVE_LIST_MAX], n_input_len;
    int output_len;
    int num_prompts;          /* per run (conversations with turns > 1); -1: default (100, or the whole dataset) */
    int turns;                /* > 1: each conversation sends this many requests, each with the history so far */
    const char *dataset;      /* JSONL {"prompt", "max_tokens"} */
    const char *quality;      /* JSONL {"prompt", "expected_keywords"} */
    const char *json_path, *html_path;
    uint64_t seed;
    double timeout_s;
    struct serve_slo slo;
    bool has_slo;
    double cost_per_hour;     /* USD, NAN when not given */
    bool ignore_eos;
    double temperature;       /* NAN: not sent */
    bool calibrate;           /* try POST /tokenize to size synthetic prompts */
    bool reuse_prompts;       /* every load point sends the same prompts (prefix-cache studies); default: new ones */
    bool detailed;            /* --json also lists every request's measurements */
    bool progress;            /* draw a progress bar (stderr is a terminal) */
};

/* Runs the benchmark the options describe, prints the table, writes --json/--html. Returns the process
 * exit status: 0 done, 1 when no request completed or a report could not be written, 2 for bad input
 * (unreadable dataset, ...). */
int serve_bench_main(const struct serve_options *o);

#endif
