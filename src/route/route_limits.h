/*
 * route_limits: per-API-key limits: requests per minute, tokens per minute and concurrent requests.
 *
 * rpm and tpm are token buckets that refill continuously (limit/60 per second, holding at most limit), the
 * model behind OpenAI's x-ratelimit-* headers: "remaining" is what the bucket holds, "reset" the time until
 * it is full again. A request reserves prompt tokens (estimated) + max_tokens at admission and settles on
 * completion: the difference to what it really used goes back into the bucket (or is taken from it).
 * A request larger than the whole tpm limit is admitted only into a full bucket, and leaves it in debt.
 *
 * Keys are looked up in constant time over all keys (no early exit on a mismatching byte or key), so the
 * time taken says nothing about how close a guess was. State survives a config reload for keys that stay.
 *
 * Threading: one thread (the router's I/O thread).
 */
#ifndef WAFER_ROUTE_ROUTE_LIMITS_H
#define WAFER_ROUTE_ROUTE_LIMITS_H

#include "route/route_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct route_limits;

enum route_limit_kind { ROUTE_LIMIT_OK, ROUTE_LIMIT_RPM, ROUTE_LIMIT_TPM, ROUTE_LIMIT_CONCURRENT };

/* What a response tells the client about its key (OpenAI's x-ratelimit-* headers). */
struct route_limit_info {
    enum route_limit_kind denied; /* ROUTE_LIMIT_OK when admitted */
    int64_t retry_after_ms;       /* when denied */
    int64_t limit_requests, remaining_requests, reset_requests_ms; /* limit 0: no rpm limit */
    int64_t limit_tokens, remaining_tokens, reset_tokens_ms;       /* limit 0: no tpm limit */
};

/* Keys from the config (copied). prev, when given, hands over the state of keys present in both and is
 * destroyed. NULL on OOM. Caller frees with route_limits_destroy. */
struct route_limits *route_limits_create(const struct route_key_conf *keys, int n, struct route_limits *prev);
void route_limits_destroy(struct route_limits *l);
int route_limits_count(const struct route_limits *l);

/* Index of key, or -1 when it is not one of the configured keys. Constant time in the number of keys and
 * in their lengths (up to 256 bytes). */
int route_limits_find(const struct route_limits *l, const char *key, size_t key_len);

/* Admits one request of key idx that reserves tokens; fills info either way. true when admitted (then
 * route_limits_settle must follow exactly once). */
bool route_limits_admit(struct route_limits *l, int idx, int64_t tokens, int64_t now_ms, struct route_limit_info *info);

/* The key's current levels (after refilling), for the headers of an admitted request's answer. */
void route_limits_peek(struct route_limits *l, int idx, int64_t now_ms, struct route_limit_info *info);

/* The request admitted with `reserved` tokens ended having used `used` (ignored when < 0: keep the
 * reservation). Frees its concurrency slot. */
void route_limits_settle(struct route_limits *l, int idx, int64_t reserved, int64_t used, int64_t now_ms);

/* Appends the x-ratelimit-* header lines ("Name: value\r\n") for info to buf[0..cap) at *len. */
void route_limits_headers(const struct route_limit_info *info, char *buf, size_t cap, size_t *len);

/* "20ms", "1.5s", "6m0s": OpenAI's duration format for the reset headers, into out. */
void route_limits_duration(int64_t ms, char *out, size_t cap);

#endif
