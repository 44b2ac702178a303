/*
 * serve_client: sends a set of prompts to an OpenAI-compatible streaming endpoint from one thread with
 * libcurl's multi interface, either keeping a fixed number of requests in flight (closed loop) or starting
 * them at Poisson arrival times (open loop), and times every streamed chunk as it is parsed.
 */
#ifndef WAFER_BENCH_SERVE_CLIENT_H
#define WAFER_BENCH_SERVE_CLIENT_H

#include "bench/serve.h"

#include <stdbool.h>
#include <stdint.h>

struct serve_client_config {
    const char *url;        /* the full endpoint URL (.../v1/completions or .../v1/chat/completions) */
    const char *api_key;    /* NULL: no Authorization header */
    const char *model;      /* NULL: no "model" field */
    int endpoint;           /* enum serve_endpoint: shapes the request body */
    double timeout_s;       /* per request, connect to end of stream */
    int concurrency;        /* > 0: closed loop with this many in flight */
    double request_rate;    /* concurrency == 0: Poisson arrivals at this rate (INFINITY: all at once) */
    uint64_t seed;          /* for the arrival times */
    int turns;              /* > 1: prompts are conversations of this many user messages (closed loop only) */
    bool capture_text;      /* keep each answer's text in the result */
    bool ignore_eos;        /* send "ignore_eos": true (vLLM, llama-server) so outputs reach max_tokens */
    double temperature;     /* NAN: not sent */
    /* called about every 100 ms and once at the end; may be NULL */
    void (*progress)(void *ctx, int done, int failed, int total, double elapsed_s);
    void *progress_ctx;
};

/* Sends prompts[0..n) and fills results[0..n) (caller clears each with serve_request_result_clear). With
 * turns > 1, prompts[c * turns + t] is turn t's new user message of conversation c (n a multiple of turns).
 * *duration_s is the time from the first send to the last completion. Every request ends with an outcome;
 * failures of requests are results, not errors. Returns 0, or ERR_INVALID_ARG / ERR_NOMEM / ERR_INTERNAL
 * with a message when the run itself could not be done. Needs curl_global_init() done. */
int serve_client_run(const struct serve_client_config *cfg, const struct serve_prompt *prompts, int n,
                     struct serve_request_result *results, double *duration_s, char *err);

/* One plain request (GET when body is NULL, else POST of JSON) for side calls such as GET /v1/models.
 * Fills *status and *response (caller frees; at most 4 MiB kept). Returns 0, or ERR_IO with the transport
 * error in err. */
int serve_client_simple(const char *url, const char *api_key, const char *body, double timeout_s, long *status,
                        char **response, char *err);

#endif
