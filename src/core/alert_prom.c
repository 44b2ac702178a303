/*
 * alert_prom: a wafer /metrics text back into an alert sample, so rules can be evaluated against any server
 * from outside (`wafer alerts check`), and a router can judge its backends from their /metrics. Only the
 * families the measures need are read; the parser takes one sample line at a time ("name{labels} value"),
 * skips comments and anything unknown, and never trusts the text's sizes (at most ALERT_MAX_BUCKETS bounds).
 */
#include "core/alert.h"

#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const prom_hist_names[ALERT_H_COUNT_] = {
    [ALERT_H_TTFT] = "wafer_time_to_first_token_seconds",
    [ALERT_H_ITL] = "wafer_inter_token_latency_seconds",
    [ALERT_H_E2E] = "wafer_request_duration_seconds",
    [ALERT_H_QUEUE] = "wafer_queue_time_seconds",
};

static const char *const prom_generation_endpoints[] = {"/v1/completions", "/v1/chat/completions", "/v1/generate",
                                                        "/v1/batch_generate", "/v1/generate_stream"};

/* The value of label `name` in a label block "{a=\"x\",b=\"y\"}" (copied into out), or false. */
static bool prom_label(const char *labels, size_t n, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl + 2 < n; i++) {
        if ((i == 0 || labels[i - 1] == '{' || labels[i - 1] == ',') && !strncmp(labels + i, name, nl) &&
            labels[i + nl] == '=' && labels[i + nl + 1] == '"') {
            const char *v = labels + i + nl + 2, *end = memchr(v, '"', n - (size_t)(v - labels));
            if (!end || (size_t)(end - v) >= cap)
                return false;
            memcpy(out, v, (size_t)(end - v));
            out[end - v] = 0;
            return true;
        }
    }
    return false;
}

int alert_sample_from_prometheus(const char *text, size_t len, struct alert_sample *s, struct alert_prom_bounds *bounds)
{
    double cum[ALERT_H_COUNT_][ALERT_MAX_BUCKETS + 1];
    int nb[ALERT_H_COUNT_] = {0};
    bool inf_seen[ALERT_H_COUNT_] = {false};
    double kv_used = NAN, kv_total = NAN, prefix = NAN;
    int hists = 0;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *line = p;
        p += n + 1;
        if (!n || line[0] == '#')
            continue;
        size_t name_len = strcspn(line, "{ ");
        if (name_len >= n)
            continue;
        const char *labels = line[name_len] == '{' ? line + name_len : NULL;
        const char *close = labels ? memchr(labels, '}', n - name_len) : NULL;
        if (labels && !close)
            continue;
        size_t labels_len = labels ? (size_t)(close - labels + 1) : 0;
        const char *val = labels ? close + 1 : line + name_len;
        char num[64];
        size_t vl = (size_t)(line + n - val);
        if (vl >= sizeof num)
            continue;
        memcpy(num, val, vl);
        num[vl] = 0;
        char *e;
        double v = strtod(num, &e);
        if (e == num)
            continue;
        char name[128];
        if (name_len >= sizeof name)
            continue;
        memcpy(name, line, name_len);
        name[name_len] = 0;

        if (!strcmp(name, "wafer_requests_total") && labels) {
            char ep[64], st[16];
            if (!prom_label(labels, labels_len, "endpoint", ep, sizeof ep) ||
                !prom_label(labels, labels_len, "status", st, sizeof st))
                continue;
            bool gen = false;
            for (size_t i = 0; i < sizeof prom_generation_endpoints / sizeof *prom_generation_endpoints; i++)
                gen |= !strcmp(ep, prom_generation_endpoints[i]);
            if (!gen)
                continue;
            int code = atoi(st);
            s->counter[ALERT_C_REQUESTS] += v;
            if (code >= 500 || code == 429 || code == 408)
                s->counter[ALERT_C_ERRORS] += v;
            continue;
        }
        static const struct {
            const char *name;
            int counter; /* enum alert_counter, or -1 - gauge index */
        } plain[] = {
            {"wafer_generation_tokens_total", ALERT_C_OUTPUT_TOKENS},
            {"wafer_prompt_tokens_total", ALERT_C_PROMPT_TOKENS},
            {"wafer_preemptions_total", ALERT_C_PREEMPTIONS},
            {"wafer_energy_joules_total", ALERT_C_ENERGY_J},
            {"wafer_cost_dollars_total", ALERT_C_COST},
            {"wafer_requests_running", -1 - ALERT_G_RUNNING},
            {"wafer_requests_waiting", -1 - ALERT_G_WAITING},
            {"wafer_batch_limit", -1 - ALERT_G_BATCH_LIMIT},
            {"wafer_prefill_chunk", -1 - ALERT_G_PREFILL_CHUNK},
        };
        bool done = false;
        for (size_t i = 0; i < sizeof plain / sizeof plain[0] && !done; i++)
            if (!strcmp(name, plain[i].name)) {
                if (plain[i].counter >= 0)
                    s->counter[plain[i].counter] = v;
                else
                    s->gauge[-1 - plain[i].counter] = v;
                done = true;
            }
        if (done)
            continue;
        if (!strcmp(name, "wafer_kv_blocks_used"))
            kv_used = v;
        else if (!strcmp(name, "wafer_kv_blocks_total"))
            kv_total = v;
        else if (!strcmp(name, "wafer_prefix_cache_blocks"))
            prefix = v;
        for (int h = 0; h < ALERT_H_COUNT_; h++) {
            size_t hl = strlen(prom_hist_names[h]);
            if (strncmp(name, prom_hist_names[h], hl))
                continue;
            const char *suffix = name + hl;
            struct alert_hist_sample *hs = &s->hist[h];
            if (!strcmp(suffix, "_bucket") && labels) {
                char le[32];
                if (!prom_label(labels, labels_len, "le", le, sizeof le))
                    break;
                if (!strcmp(le, "+Inf")) {
                    cum[h][nb[h]] = v;
                    inf_seen[h] = true;
                } else if (nb[h] < ALERT_MAX_BUCKETS) {
                    bounds->b[h][nb[h]] = strtod(le, NULL);
                    cum[h][nb[h]] = v;
                    nb[h]++;
                }
            } else if (!strcmp(suffix, "_sum")) {
                hs->sum = v;
            } else if (!strcmp(suffix, "_count")) {
                hs->count = (uint64_t)v;
            }
            break;
        }
    }
    for (int h = 0; h < ALERT_H_COUNT_; h++) {
        struct alert_hist_sample *hs = &s->hist[h];
        if (!inf_seen[h] || !nb[h])
            continue;
        hists++;
        hs->bounds = bounds->b[h];
        hs->n_bounds = nb[h];
        double prev = 0;
        for (int i = 0; i <= nb[h]; i++) { /* cumulative -> per bucket */
            double c = cum[h][i] - prev;
            hs->counts[i] = c > 0 ? (uint64_t)c : 0;
            prev = cum[h][i];
        }
    }
    if (kv_total > 0) {
        s->gauge[ALERT_G_KV_USAGE] = kv_used / kv_total;
        s->gauge[ALERT_G_PREFIX_USAGE] = isnan(prefix) ? 0 : prefix / kv_total;
    }
    return hists ? 0 : ERR_FORMAT;
}
