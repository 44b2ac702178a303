/*
 * serve_stats: per-run numbers. Only completed requests feed latencies and token totals (a failed request's
 * timings measure the failure, not the server's speed); throughputs divide by the whole run's duration, as
 * vLLM does, so failures still cost time. TPOT needs at least two output tokens; ITL pools every gap of
 * every completed request. The prefix-cache hit rate counts only requests whose usage reported cached_tokens
 * (OpenAI's prompt_tokens_details), over those requests' own input tokens; a run of conversations also gets
 * the numbers per turn, where a cache shows (later turns resend the history).
 */
#include "bench/serve_stats.h"

#include "core/err.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_slo_parse(const char *text, struct serve_slo *out, char *err)
{
    out->ttft_ms = out->tpot_ms = out->itl_ms = out->e2e_ms = out->itl_p95_ms = NAN;
    if (isdigit((unsigned char)text[0]) || text[0] == '.') {
        /* the short form: ITL_P95_MS[,TTFT_MS] */
        char *end;
        double itl = strtod(text, &end), ttft = NAN;
        if (*end == ',') {
            const char *t = end + 1;
            ttft = strtod(t, &end);
            if (end == t)
                ttft = -1;
        }
        if (*end || !(itl > 0) || !isfinite(itl) || (!isnan(ttft) && !(ttft > 0 && isfinite(ttft))))
            return err_set(err, ERR_INVALID_ARG,
                           "--slo: bad '%s': give ITL_P95_MS[,TTFT_MS] (e.g. 50,2000) or key=value pairs "
                           "(e.g. itl_p95=50ms,ttft=2s)", text);
        out->itl_p95_ms = itl;
        out->ttft_ms = ttft;
        return 0;
    }
    const char *p = text;
    int n = 0;
    while (*p) {
        const char *eq = strchr(p, '=');
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        if (!eq || eq > end)
            return err_set(err, ERR_INVALID_ARG, "--slo: expected key=value in '%.*s' (e.g. ttft=500ms,tpot=50ms,e2e=10s)",
                           (int)(end - p), p);
        size_t kl = (size_t)(eq - p);
        double *slot = NULL;
        if (kl == 4 && !strncmp(p, "ttft", 4))
            slot = &out->ttft_ms;
        else if (kl == 4 && !strncmp(p, "tpot", 4))
            slot = &out->tpot_ms;
        else if (kl == 3 && !strncmp(p, "itl", 3))
            slot = &out->itl_ms;
        else if (kl == 7 && !strncmp(p, "itl_p95", 7))
            slot = &out->itl_p95_ms;
        else if ((kl == 3 && !strncmp(p, "e2e", 3)) || (kl == 4 && !strncmp(p, "e2el", 4)))
            slot = &out->e2e_ms;
        else
            return err_set(err, ERR_INVALID_ARG, "--slo: unknown metric '%.*s' (use ttft, tpot, itl, itl_p95 or e2e)", (int)kl, p);
        char *num_end;
        double v = strtod(eq + 1, &num_end);
        char unit[8] = "";
        size_t ul = (size_t)(end - num_end);
        if (num_end == eq + 1 || ul >= sizeof unit)
            return err_set(err, ERR_INVALID_ARG, "--slo: bad value '%.*s' for %.*s (e.g. 500ms or 2s)",
                           (int)(end - eq - 1), eq + 1, (int)kl, p);
        memcpy(unit, num_end, ul);
        double scale;
        if (!strcmp(unit, "") || !strcmp(unit, "ms"))
            scale = 1;
        else if (!strcmp(unit, "s"))
            scale = 1000;
        else if (!strcmp(unit, "us"))
            scale = 0.001;
        else
            return err_set(err, ERR_INVALID_ARG, "--slo: unknown unit '%s' for %.*s (use us, ms or s)", unit, (int)kl, p);
        if (!(v > 0) || !isfinite(v))
            return err_set(err, ERR_INVALID_ARG, "--slo: %.*s must be above 0", (int)kl, p);
        *slot = v * scale;
        n++;
        p = *end ? end + 1 : end;
    }
    if (n == 0)
        return err_set(err, ERR_INVALID_ARG, "--slo: no objective given (e.g. ttft=500ms,tpot=50ms,e2e=10s)");
    return 0;
}

void serve_run_summary_deinit(struct serve_run_summary *s)
{
    for (int k = 0; k < SERVE_OUTCOME_COUNT; k++)
        free(s->error_sample[k]);
    free(s->ttft.values);
    free(s->tpot.values);
    free(s->itl.values);
    free(s->e2e.values);
    free(s->turns);
    memset(s, 0, sizeof *s);
}

double serve_hit_rate(long long cached, long long of_input)
{
    return of_input > 0 ? (double)cached / (double)of_input : NAN;
}

static double stats_tpot(const struct serve_request_result *r)
{
    if (r->output_tokens < 2 || isnan(r->ttft_ms))
        return NAN;
    return (r->e2e_ms - r->ttft_ms) / (double)(r->output_tokens - 1);
}

void serve_stats_set_cost(struct serve_run_summary *s, double cost_per_hour)
{
    s->has_cost = isfinite(cost_per_hour) && cost_per_hour >= 0;
    if (!s->has_cost)
        return;
    double per_s = cost_per_hour / 3600.0;
    s->usd_per_hour = cost_per_hour;
    s->usd_per_request = s->request_throughput > 0 ? per_s / s->request_throughput : NAN;
    s->usd_per_million_output_tokens = s->output_throughput > 0 ? per_s / s->output_throughput * 1e6 : NAN;
    s->usd_per_million_total_tokens = s->total_token_throughput > 0 ? per_s / s->total_token_throughput * 1e6 : NAN;
}

/* Fills turns[0..n_turns) from the results' turn fields. Returns 0 or ERR_NOMEM. */
static int stats_turns(const struct serve_request_result *results, int n, struct serve_turn_summary *turns,
                       int n_turns)
{
    double *ttft = malloc((size_t)(n > 0 ? n : 1) * sizeof *ttft);
    if (!ttft)
        return ERR_NOMEM;
    for (int t = 0; t < n_turns; t++) {
        struct serve_turn_summary *s = &turns[t];
        size_t k = 0;
        for (int i = 0; i < n; i++) {
            const struct serve_request_result *r = &results[i];
            if (r->turn != t)
                continue;
            s->sent++;
            if (r->outcome != SERVE_OK)
                continue;
            s->completed++;
            s->input_tokens += r->input_tokens > 0 ? r->input_tokens : 0;
            if (r->cached_tokens >= 0) {
                s->cached_tokens += r->cached_tokens;
                s->cached_of_input += r->input_tokens > 0 ? r->input_tokens : 0;
                s->cached_from_usage++;
            }
            if (!isnan(r->ttft_ms))
                ttft[k++] = r->ttft_ms;
        }
        stats_summarize(ttft, k, &s->ttft);
    }
    free(ttft);
    return 0;
}

int serve_stats_compute(const struct serve_request_result *results, int n, double duration_s,
                        const struct serve_slo *slo, double cost_per_hour, struct serve_run_summary *out, char *err)
{
    memset(out, 0, sizeof *out);
    size_t n_itl = 0;
    for (int i = 0; i < n; i++)
        if (results[i].outcome == SERVE_OK)
            n_itl += (size_t)results[i].n_itl;
    size_t nn = n > 0 ? (size_t)n : 1;
    out->ttft.values = malloc(nn * sizeof(double));
    out->tpot.values = malloc(nn * sizeof(double));
    out->e2e.values = malloc(nn * sizeof(double));
    out->itl.values = malloc((n_itl ? n_itl : 1) * sizeof(double));
    if (!out->ttft.values || !out->tpot.values || !out->e2e.values || !out->itl.values) {
        serve_run_summary_deinit(out);
        return err_set(err, ERR_NOMEM, "out of memory computing statistics");
    }
    int n_turns = 1;
    for (int i = 0; i < n; i++)
        if (results[i].turn + 1 > n_turns)
            n_turns = results[i].turn + 1;
    if (n_turns > 1) {
        out->turns = calloc((size_t)n_turns, sizeof *out->turns);
        if (!out->turns || stats_turns(results, n, out->turns, n_turns)) {
            serve_run_summary_deinit(out);
            return err_set(err, ERR_NOMEM, "out of memory computing statistics");
        }
        out->n_turns = n_turns;
    }
    size_t k_ttft = 0, k_tpot = 0, k_e2e = 0, k_itl = 0;
    long long good_tokens = 0;
    out->sent = n;
    out->duration_s = duration_s;
    out->has_goodput = slo != NULL;
    for (int i = 0; i < n; i++) {
        const struct serve_request_result *r = &results[i];
        int o = r->outcome >= 0 && r->outcome < SERVE_OUTCOME_COUNT ? r->outcome : SERVE_FAIL_OTHER;
        out->by_outcome[o]++;
        if (o != SERVE_OK) {
            out->failed++;
            if (!out->error_sample[o] && r->error)
                out->error_sample[o] = strdup(r->error);
            if (o == SERVE_FAIL_HTTP) {
                int j = 0;
                while (j < out->n_http_status && out->http_status[j] != r->http_status)
                    j++;
                if (j == out->n_http_status && j < SERVE_STATUS_MAX) {
                    out->http_status[j] = r->http_status;
                    out->n_http_status++;
                }
                if (j < SERVE_STATUS_MAX)
                    out->http_status_count[j]++;
            }
            continue;
        }
        out->completed++;
        out->total_output_tokens += r->output_tokens > 0 ? r->output_tokens : 0;
        out->total_input_tokens += r->input_tokens > 0 ? r->input_tokens : 0;
        out->output_from_usage += r->output_from_usage;
        out->input_from_usage += r->input_from_usage;
        if (r->cached_tokens >= 0) {
            out->cached_tokens += r->cached_tokens;
            out->cached_of_input += r->input_tokens > 0 ? r->input_tokens : 0;
            out->cached_from_usage++;
        }
        if (!isnan(r->ttft_ms))
            out->ttft.values[k_ttft++] = r->ttft_ms;
        double tpot = stats_tpot(r);
        if (!isnan(tpot))
            out->tpot.values[k_tpot++] = tpot;
        out->e2e.values[k_e2e++] = r->e2e_ms;
        for (int g = 0; g < r->n_itl; g++)
            out->itl.values[k_itl++] = r->itl_ms[g];
        if (slo) {
            /* an objective on a metric the request does not have (TPOT of a 1-token answer) is met */
            bool good = true;
            if (!isnan(slo->ttft_ms) && !(r->ttft_ms <= slo->ttft_ms))
                good = false;
            if (!isnan(slo->tpot_ms) && !isnan(tpot) && tpot > slo->tpot_ms)
                good = false;
            if (!isnan(slo->e2e_ms) && r->e2e_ms > slo->e2e_ms)
                good = false;
            for (int g = 0; good && !isnan(slo->itl_ms) && g < r->n_itl; g++)
                if (r->itl_ms[g] > slo->itl_ms)
                    good = false;
            if (good && slo->itl_p95_ms > 0 && r->n_itl > 0) {
                /* its own gaps, sorted in the tail of the pooled array (copied: the pool is sorted later) */
                double *gaps = out->itl.values + k_itl - (size_t)r->n_itl;
                double *tmp = malloc((size_t)r->n_itl * sizeof *tmp);
                if (!tmp) {
                    serve_run_summary_deinit(out);
                    return err_set(err, ERR_NOMEM, "out of memory computing statistics");
                }
                memcpy(tmp, gaps, (size_t)r->n_itl * sizeof *tmp);
                stats_sort(tmp, (size_t)r->n_itl);
                if (stats_percentile_sorted(tmp, (size_t)r->n_itl, 95) > slo->itl_p95_ms)
                    good = false;
                free(tmp);
            }
            out->good += good;
            if (good)
                good_tokens += r->output_tokens > 0 ? r->output_tokens : 0;
        }
    }
    stats_summarize(out->ttft.values, k_ttft, &out->ttft.s);
    stats_summarize(out->tpot.values, k_tpot, &out->tpot.s);
    stats_summarize(out->e2e.values, k_e2e, &out->e2e.s);
    stats_summarize(out->itl.values, k_itl, &out->itl.s);
    if (duration_s > 0) {
        out->request_throughput = out->completed / duration_s;
        out->output_throughput = (double)out->total_output_tokens / duration_s;
        out->total_token_throughput = (double)(out->total_input_tokens + out->total_output_tokens) / duration_s;
        out->request_goodput = out->good / duration_s;
        out->output_goodput = (double)good_tokens / duration_s;
    }
    serve_stats_set_cost(out, cost_per_hour);
    return 0;
}
