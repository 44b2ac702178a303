/*
 * retry: the client library's retry policy, as pure functions (unit-tested): which answers are retried,
 * what the server's Retry-After headers say, and how long to wait. The rules are the OpenAI SDKs'
 * (openai-python _base_client.py: _should_retry, _parse_retry_after_header, _calculate_retry_timeout).
 */
#ifndef WAFER_CLIENT_RETRY_H
#define WAFER_CLIENT_RETRY_H

#include <stdbool.h>
#include <time.h>

#define CLIENT_RETRY_INITIAL_S 0.5
#define CLIENT_RETRY_MAX_S 8.0

/* Whether an HTTP answer is retried: "x-should-retry: true/false" decides when present (may be NULL or
 * ""), else 408, 409, 429 and 5xx are. */
bool client_retry_status(int http_status, const char *x_should_retry);

/* Seconds the server asked to wait: Retry-After-Ms (milliseconds), else Retry-After as seconds or as an
 * HTTP date (relative to now). Either may be NULL or "". -1 when neither gives a number. */
double client_retry_after(const char *retry_after_ms, const char *retry_after, time_t now);

/* Wait before retry number retries_done (0 for the first retry): retry_after_s when it is in (0, 60], else
 * min(0.5 * 2^retries_done, 8) * (1 - 0.25 * rand01), with rand01 in [0, 1). */
double client_retry_delay(int retries_done, double retry_after_s, double rand01);

#endif
