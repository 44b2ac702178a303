/*
 * route_limits: token buckets per key (see route_limits.h). Buckets are stored as a level and the time it
 * was computed; every use first refills for the elapsed time.
 */
#include "route/route_limits.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIMITS_KEY_CMP_MAX 256 /* keys are compared over this many bytes, whatever their length */

struct rl_key {
    char *key;
    size_t len;
    int64_t rpm, tpm, concurrent;
    double req_level, tok_level; /* bucket contents */
    int64_t t_ms;                /* when the levels were last refilled */
    bool started;                /* t_ms is set (a new key starts full) */
    int64_t inflight;
};

struct route_limits {
    struct rl_key *keys;
    int n;
};

struct route_limits *route_limits_create(const struct route_key_conf *keys, int n, struct route_limits *prev)
{
    struct route_limits *l = calloc(1, sizeof *l);
    if (!l || !(l->keys = calloc((size_t)(n ? n : 1), sizeof *l->keys))) {
        free(l);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        struct rl_key *k = &l->keys[i];
        k->key = strdup(keys[i].key);
        if (!k->key) {
            l->n = i;
            route_limits_destroy(l);
            return NULL;
        }
        k->len = strlen(k->key);
        k->rpm = keys[i].rpm;
        k->tpm = keys[i].tpm;
        k->concurrent = keys[i].concurrent;
        k->req_level = (double)k->rpm;
        k->tok_level = (double)k->tpm;
        for (int j = 0; prev && j < prev->n; j++)
            if (!strcmp(prev->keys[j].key, k->key)) {
                const struct rl_key *o = &prev->keys[j];
                k->req_level = o->req_level < (double)k->rpm ? o->req_level : (double)k->rpm;
                k->tok_level = o->tok_level < (double)k->tpm ? o->tok_level : (double)k->tpm;
                k->t_ms = o->t_ms;
                k->started = o->started;
                k->inflight = o->inflight;
            }
    }
    l->n = n;
    route_limits_destroy(prev);
    return l;
}

void route_limits_destroy(struct route_limits *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->n; i++)
        free(l->keys[i].key);
    free(l->keys);
    free(l);
}

int route_limits_count(const struct route_limits *l) { return l ? l->n : 0; }

int route_limits_find(const struct route_limits *l, const char *key, size_t key_len)
{
    int found = -1;
    for (int i = 0; i < l->n; i++) {
        const struct rl_key *k = &l->keys[i];
        unsigned diff = (unsigned)(k->len != key_len);
        for (size_t b = 0; b < LIMITS_KEY_CMP_MAX; b++) {
            unsigned char x = b < k->len ? (unsigned char)k->key[b] : 0;
            unsigned char y = b < key_len ? (unsigned char)key[b] : 0;
            diff |= (unsigned)(x ^ y);
        }
        if (k->len > LIMITS_KEY_CMP_MAX || key_len > LIMITS_KEY_CMP_MAX)
            diff |= (unsigned)(k->len != key_len || memcmp(k->key, key, k->len) != 0);
        /* branch-free select: found = i when diff == 0 */
        int match = (int)(((diff | (0u - diff)) >> (sizeof(unsigned) * 8 - 1)) ^ 1u);
        found = match ? i : found;
    }
    return found;
}

static void refill(struct rl_key *k, int64_t now_ms)
{
    if (!k->started) {
        k->t_ms = now_ms;
        k->started = true;
        return;
    }
    double dt = (double)(now_ms - k->t_ms);
    if (dt <= 0)
        return;
    if (k->rpm) {
        k->req_level += dt * (double)k->rpm / 60000.0;
        if (k->req_level > (double)k->rpm)
            k->req_level = (double)k->rpm;
    }
    if (k->tpm) {
        k->tok_level += dt * (double)k->tpm / 60000.0;
        if (k->tok_level > (double)k->tpm)
            k->tok_level = (double)k->tpm;
    }
    k->t_ms = now_ms;
}

/* ms until the bucket holds `want` (rate limit/60000 per ms). */
static int64_t ms_until(double level, double want, int64_t limit)
{
    if (level >= want || limit <= 0)
        return 0;
    return (int64_t)ceil((want - level) * 60000.0 / (double)limit);
}

static void fill_info(const struct rl_key *k, struct route_limit_info *info)
{
    info->limit_requests = k->rpm;
    info->remaining_requests = k->rpm ? (int64_t)floor(k->req_level > 0 ? k->req_level : 0) : 0;
    info->reset_requests_ms = k->rpm ? ms_until(k->req_level, (double)k->rpm, k->rpm) : 0;
    info->limit_tokens = k->tpm;
    info->remaining_tokens = k->tpm ? (int64_t)floor(k->tok_level > 0 ? k->tok_level : 0) : 0;
    info->reset_tokens_ms = k->tpm ? ms_until(k->tok_level, (double)k->tpm, k->tpm) : 0;
}

bool route_limits_admit(struct route_limits *l, int idx, int64_t tokens, int64_t now_ms, struct route_limit_info *info)
{
    struct rl_key *k = &l->keys[idx];
    refill(k, now_ms);
    memset(info, 0, sizeof *info);
    double need = (double)(k->tpm && tokens > k->tpm ? k->tpm : tokens);
    if (k->concurrent && k->inflight >= k->concurrent) {
        info->denied = ROUTE_LIMIT_CONCURRENT;
        info->retry_after_ms = 1000;
    } else if (k->rpm && k->req_level < 1.0) {
        info->denied = ROUTE_LIMIT_RPM;
        info->retry_after_ms = ms_until(k->req_level, 1.0, k->rpm);
    } else if (k->tpm && k->tok_level < need) {
        info->denied = ROUTE_LIMIT_TPM;
        info->retry_after_ms = ms_until(k->tok_level, need, k->tpm);
    }
    if (info->denied == ROUTE_LIMIT_OK) {
        if (k->rpm)
            k->req_level -= 1.0;
        if (k->tpm)
            k->tok_level -= (double)tokens;
        k->inflight++;
    }
    fill_info(k, info);
    return info->denied == ROUTE_LIMIT_OK;
}

void route_limits_peek(struct route_limits *l, int idx, int64_t now_ms, struct route_limit_info *info)
{
    struct rl_key *k = &l->keys[idx];
    refill(k, now_ms);
    memset(info, 0, sizeof *info);
    fill_info(k, info);
}

void route_limits_settle(struct route_limits *l, int idx, int64_t reserved, int64_t used, int64_t now_ms)
{
    struct rl_key *k = &l->keys[idx];
    refill(k, now_ms);
    if (k->inflight > 0)
        k->inflight--;
    if (k->tpm && used >= 0) {
        k->tok_level += (double)(reserved - used);
        if (k->tok_level > (double)k->tpm)
            k->tok_level = (double)k->tpm;
    }
}

void route_limits_duration(int64_t ms, char *out, size_t cap)
{
    if (ms < 0)
        ms = 0;
    if (ms < 1000)
        snprintf(out, cap, "%lldms", (long long)ms);
    else if (ms < 60000)
        snprintf(out, cap, "%gs", (double)(ms / 10) / 100.0);
    else
        snprintf(out, cap, "%lldm%llds", (long long)(ms / 60000), (long long)((ms % 60000) / 1000));
}

void route_limits_headers(const struct route_limit_info *info, char *buf, size_t cap, size_t *len)
{
    char d[32];
    int n;
    if (info->limit_requests) {
        route_limits_duration(info->reset_requests_ms, d, sizeof d);
        n = snprintf(buf + *len, cap - *len,
                     "x-ratelimit-limit-requests: %lld\r\nx-ratelimit-remaining-requests: %lld\r\n"
                     "x-ratelimit-reset-requests: %s\r\n",
                     (long long)info->limit_requests, (long long)info->remaining_requests, d);
        if (n > 0 && (size_t)n < cap - *len)
            *len += (size_t)n;
    }
    if (info->limit_tokens) {
        route_limits_duration(info->reset_tokens_ms, d, sizeof d);
        n = snprintf(buf + *len, cap - *len,
                     "x-ratelimit-limit-tokens: %lld\r\nx-ratelimit-remaining-tokens: %lld\r\n"
                     "x-ratelimit-reset-tokens: %s\r\n",
                     (long long)info->limit_tokens, (long long)info->remaining_tokens, d);
        if (n > 0 && (size_t)n < cap - *len)
            *len += (size_t)n;
    }
}
