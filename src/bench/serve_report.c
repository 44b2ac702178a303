/*
 * serve_report: the text table and the JSON result. Numbers print with fixed decimals so columns line up in
 * a terminal; the JSON carries full precision and null wherever a value does not exist (no completed
 * request, no SLO, no price), so a consumer never has to guess what 0 means.
 */
#include "bench/serve_report.h"

#include "core/err.h"
#include "core/json_writer.h"

#include <errno.h>
#include <math.h>
#include <string.h>

void serve_report_run_name(const struct serve_run *r, char *out, size_t cap)
{
    int n;
    if (r->concurrency > 0)
        n = snprintf(out, cap, "concurrency %d", r->concurrency);
    else if (isinf(r->request_rate))
        n = snprintf(out, cap, "rate inf");
    else
        n = snprintf(out, cap, "rate %g req/s", r->request_rate);
    if (r->input_len > 0 && n >= 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, ", input %d", r->input_len);
}

/* "12.34" or "-" for a value that does not exist. */
static const char *fmt_num(char *buf, size_t cap, double v, int decimals)
{
    if (!isfinite(v))
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.*f", decimals, v);
    return buf;
}

static void report_metric_row(FILE *f, const char *name, const struct serve_metric *m)
{
    char a[32], b[32], c[32], d[32], e[32], g[32];
    fprintf(f, "  %-10s %10s %10s %10s %10s %10s %10s %8zu\n", name, fmt_num(a, sizeof a, m->s.mean, 2),
            fmt_num(b, sizeof b, m->s.p50, 2), fmt_num(c, sizeof c, m->s.p90, 2), fmt_num(d, sizeof d, m->s.p95, 2),
            fmt_num(e, sizeof e, m->s.p99, 2), fmt_num(g, sizeof g, m->s.max, 2), m->s.n);
}

void serve_report_print_run(FILE *f, const struct serve_report *rep, int i)
{
    const struct serve_run *r = &rep->runs[i];
    const struct serve_run_summary *s = &r->s;
    char name[96], a[32], b[32], c[32];
    serve_report_run_name(r, name, sizeof name);
    fprintf(f, "\n== run %d/%d: %s", i + 1, rep->n_planned > rep->n_runs ? rep->n_planned : rep->n_runs, name);
    if (r->output_len > 0)
        fprintf(f, ", output %d", r->output_len);
    fprintf(f, " ==\n");
    fprintf(f, "  requests    %d sent, %d completed, %d failed", s->sent, s->completed, s->failed);
    if (s->failed) {
        const char *sep = " (";
        for (int k = 1; k < SERVE_OUTCOME_COUNT; k++) {
            if (!s->by_outcome[k])
                continue;
            fprintf(f, "%s%s %d", sep, serve_outcome_name(k), s->by_outcome[k]);
            sep = ", ";
        }
        fprintf(f, ")");
    }
    fprintf(f, "\n");
    for (int j = 0; j < s->n_http_status; j++)
        fprintf(f, "              HTTP %d: %d\n", s->http_status[j], s->http_status_count[j]);
    fprintf(f, "  duration    %.2f s\n", s->duration_s);
    fprintf(f, "  throughput  %s req/s, %s output tok/s, %s total tok/s\n",
            fmt_num(a, sizeof a, s->request_throughput, 2), fmt_num(b, sizeof b, s->output_throughput, 1),
            fmt_num(c, sizeof c, s->total_token_throughput, 1));
    fprintf(f, "  tokens      input %lld (mean %s, %d of %d from usage), output %lld (mean %s, %d of %d from usage)\n",
            s->total_input_tokens, fmt_num(a, sizeof a, s->completed ? (double)s->total_input_tokens / s->completed : NAN, 1),
            s->input_from_usage, s->completed, s->total_output_tokens,
            fmt_num(b, sizeof b, s->completed ? (double)s->total_output_tokens / s->completed : NAN, 1),
            s->output_from_usage, s->completed);
    if (s->cached_from_usage > 0)
        fprintf(f, "  cached      %lld of %lld input tokens (%s%%) from the server's prefix cache "
                   "(%d of %d from usage)\n",
                s->cached_tokens, s->cached_of_input,
                fmt_num(a, sizeof a, 100.0 * serve_hit_rate(s->cached_tokens, s->cached_of_input), 1),
                s->cached_from_usage, s->completed);
    if (s->n_turns > 1) {
        fprintf(f, "  %-10s %6s %6s %11s %9s %10s %10s %10s\n", "turn", "sent", "ok", "mean input", "cached",
                "TTFT mean", "TTFT p50", "TTFT p95");
        for (int t = 0; t < s->n_turns; t++) {
            const struct serve_turn_summary *u = &s->turns[t];
            char d[32], e[32], g[32];
            double hit = 100.0 * serve_hit_rate(u->cached_tokens, u->cached_of_input);
            if (isfinite(hit))
                snprintf(b, sizeof b, "%.1f%%", hit);
            else
                snprintf(b, sizeof b, "-");
            fprintf(f, "  %-10d %6d %6d %11s %9s %10s %10s %10s\n", t + 1, u->sent, u->completed,
                    fmt_num(a, sizeof a, u->completed ? (double)u->input_tokens / u->completed : NAN, 1), b,
                    fmt_num(d, sizeof d, u->ttft.mean, 2), fmt_num(e, sizeof e, u->ttft.p50, 2),
                    fmt_num(g, sizeof g, u->ttft.p95, 2));
        }
    }
    if (s->has_goodput) {
        const struct serve_slo *o = &rep->opt->slo;
        fprintf(f, "  goodput     %s req/s, %s output tok/s (%d of %d completed met", fmt_num(a, sizeof a, s->request_goodput, 2),
                fmt_num(b, sizeof b, s->output_goodput, 1), s->good, s->completed);
        if (!isnan(o->ttft_ms))
            fprintf(f, " ttft<=%gms", o->ttft_ms);
        if (!isnan(o->tpot_ms))
            fprintf(f, " tpot<=%gms", o->tpot_ms);
        if (!isnan(o->itl_ms))
            fprintf(f, " itl<=%gms", o->itl_ms);
        if (!isnan(o->itl_p95_ms))
            fprintf(f, " itl_p95<=%gms", o->itl_p95_ms);
        if (!isnan(o->e2e_ms))
            fprintf(f, " e2e<=%gms", o->e2e_ms);
        fprintf(f, ")\n");
    }
    if (s->has_cost)
        fprintf(f, "  cost        $%s per request, $%s per 1M output tokens (at $%.2f/hour)\n",
                fmt_num(a, sizeof a, s->usd_per_request, 6), fmt_num(b, sizeof b, s->usd_per_million_output_tokens, 4),
                s->usd_per_hour);
    fprintf(f, "  %-10s %10s %10s %10s %10s %10s %10s %8s\n", "latency ms", "mean", "median", "p90", "p95", "p99", "max",
            "n");
    report_metric_row(f, "TTFT", &s->ttft);
    report_metric_row(f, "TPOT", &s->tpot);
    report_metric_row(f, "ITL", &s->itl);
    report_metric_row(f, "E2E", &s->e2e);
    for (int k = 1; k < SERVE_OUTCOME_COUNT; k++)
        if (s->error_sample[k])
            fprintf(f, "  error       %s (first of %d): %s\n", serve_outcome_name(k), s->by_outcome[k],
                    s->error_sample[k]);
}

void serve_report_print_sweep(FILE *f, const struct serve_report *rep)
{
    char v[12][32];
    bool rate = rep->n_runs > 0 && rep->runs[0].concurrency == 0;
    fprintf(f, "\n== summary: %s ==\n", rep->label ? rep->label : "");
    fprintf(f, "%8s %7s %6s %5s %8s %10s %9s %9s %9s %9s %8s %9s %9s\n", rate ? "rate" : "conc", "input", "ok", "fail",
            "req/s", "out tok/s", "ttft p50", "ttft p99", "tpot p50", "tpot p99", "itl p50", "e2e p50", "e2e p99");
    for (int i = 0; i < rep->n_runs; i++) {
        const struct serve_run *r = &rep->runs[i];
        const struct serve_run_summary *s = &r->s;
        char load[16], in[16];
        if (r->concurrency > 0)
            snprintf(load, sizeof load, "%d", r->concurrency);
        else
            snprintf(load, sizeof load, isinf(r->request_rate) ? "inf" : "%g", r->request_rate);
        snprintf(in, sizeof in, r->input_len > 0 ? "%d" : "data", r->input_len);
        fprintf(f, "%8s %7s %6d %5d %8s %10s %9s %9s %9s %9s %8s %9s %9s\n", load, in, s->completed, s->failed,
                fmt_num(v[0], 32, s->request_throughput, 2), fmt_num(v[1], 32, s->output_throughput, 1),
                fmt_num(v[2], 32, s->ttft.s.p50, 1), fmt_num(v[3], 32, s->ttft.s.p99, 1),
                fmt_num(v[4], 32, s->tpot.s.p50, 2), fmt_num(v[5], 32, s->tpot.s.p99, 2),
                fmt_num(v[6], 32, s->itl.s.p50, 2), fmt_num(v[7], 32, s->e2e.s.p50, 1),
                fmt_num(v[8], 32, s->e2e.s.p99, 1));
    }
    fprintf(f, "(latencies in ms; percentiles interpolate linearly like numpy's default)\n");
}

void serve_report_print_quality(FILE *f, const struct serve_quality *q)
{
    fprintf(f, "\n== quality: %s, %d cases ==\n", q->path, q->cases.n);
    fprintf(f, "  %4s %6s %7s  %s\n", "case", "score", "found", "prompt / missing keywords");
    for (int i = 0; i < q->cases.n; i++) {
        const struct serve_prompt *p = &q->cases.items[i];
        const struct serve_quality_case *c = &q->results[i];
        int hits = 0;
        for (int k = 0; k < p->n_keywords; k++)
            hits += c->found[k];
        char prompt[61];
        size_t k = 0;
        for (const char *s = p->text; *s && k < sizeof prompt - 1; s++)
            prompt[k++] = (*s == '\n' || *s == '\t') ? ' ' : *s;
        prompt[k] = '\0';
        fprintf(f, "  %4d %6.2f %3d/%-3d  %s%s\n", i + 1, c->score, hits, p->n_keywords, prompt,
                strlen(p->text) > 60 ? "..." : "");
        if (c->outcome != SERVE_OK)
            fprintf(f, "  %19s  failed: %s\n", "", c->error ? c->error : serve_outcome_name(c->outcome));
        else if (hits < p->n_keywords) {
            fprintf(f, "  %19s  missing:", "");
            for (int j = 0; j < p->n_keywords; j++)
                if (!c->found[j])
                    fprintf(f, " \"%s\"", p->keywords[j]);
            fprintf(f, "\n");
        }
    }
    fprintf(f, "  overall score %.3f (mean of the case scores)\n", q->score);
}

static void json_metric(struct json_writer *w, const char *key, const struct serve_metric *m)
{
    json_writer_key(w, key);
    json_writer_object_begin(w);
    json_writer_key_int(w, "n", (long long)m->s.n);
    json_writer_key_double(w, "mean", m->s.mean);
    json_writer_key_double(w, "median", m->s.p50);
    json_writer_key_double(w, "std", m->s.std);
    json_writer_key_double(w, "min", m->s.min);
    json_writer_key_double(w, "max", m->s.max);
    json_writer_key_double(w, "p50", m->s.p50);
    json_writer_key_double(w, "p90", m->s.p90);
    json_writer_key_double(w, "p95", m->s.p95);
    json_writer_key_double(w, "p99", m->s.p99);
    json_writer_object_end(w);
}

static void json_slo(struct json_writer *w, const struct serve_slo *o)
{
    json_writer_object_begin(w);
    json_writer_key_double(w, "ttft_ms", o->ttft_ms);
    json_writer_key_double(w, "tpot_ms", o->tpot_ms);
    json_writer_key_double(w, "itl_ms", o->itl_ms);
    json_writer_key_double(w, "itl_p95_ms", o->itl_p95_ms);
    json_writer_key_double(w, "e2e_ms", o->e2e_ms);
    json_writer_object_end(w);
}

static void json_rate(struct json_writer *w, double rate)
{
    if (isinf(rate))
        json_writer_string(w, "inf");
    else
        json_writer_double(w, rate);
}

/* One request of a --detailed run, in send order. */
static void json_request(struct json_writer *w, const struct serve_request_result *q)
{
    json_writer_object_begin(w);
    json_writer_key_string(w, "outcome", serve_outcome_name(q->outcome));
    json_writer_key_int(w, "http_status", q->http_status);
    json_writer_key_string(w, "error", q->error);
    json_writer_key_double(w, "start_s", q->start_s);
    json_writer_key_double(w, "ttft_ms", q->ttft_ms);
    double tpot = q->output_tokens > 1 && !isnan(q->ttft_ms) ? (q->e2e_ms - q->ttft_ms) / (q->output_tokens - 1) : NAN;
    json_writer_key_double(w, "tpot_ms", q->outcome == SERVE_OK ? tpot : NAN);
    json_writer_key_double(w, "e2e_ms", q->e2e_ms);
    json_writer_key(w, "itl_ms");
    json_writer_array_begin(w);
    for (int i = 0; i < q->n_itl; i++)
        json_writer_double(w, q->itl_ms[i]);
    json_writer_array_end(w);
    json_writer_key_int(w, "chunks", q->n_chunks);
    json_writer_key(w, "input_tokens");
    if (q->input_tokens >= 0)
        json_writer_int(w, q->input_tokens);
    else
        json_writer_null(w);
    json_writer_key_int(w, "output_tokens", q->output_tokens);
    json_writer_key_bool(w, "tokens_from_usage", q->output_from_usage);
    json_writer_key(w, "cached_tokens");
    if (q->cached_tokens >= 0)
        json_writer_int(w, q->cached_tokens);
    else
        json_writer_null(w);
    json_writer_key_int(w, "turn", q->turn + 1);
    json_writer_object_end(w);
}

static void json_run(struct json_writer *w, const struct serve_report *rep, const struct serve_run *r)
{
    const struct serve_run_summary *s = &r->s;
    json_writer_object_begin(w);
    json_writer_key(w, "concurrency");
    if (r->concurrency > 0)
        json_writer_int(w, r->concurrency);
    else
        json_writer_null(w);
    json_writer_key(w, "request_rate");
    if (r->concurrency > 0)
        json_writer_null(w);
    else
        json_rate(w, r->request_rate);
    json_writer_key(w, "input_len");
    if (r->input_len > 0)
        json_writer_int(w, r->input_len);
    else
        json_writer_null(w);
    json_writer_key(w, "output_len");
    if (r->output_len > 0)
        json_writer_int(w, r->output_len);
    else
        json_writer_null(w);
    json_writer_key_int(w, "sent", s->sent);
    json_writer_key_int(w, "completed", s->completed);
    json_writer_key_int(w, "failed", s->failed);
    json_writer_key(w, "errors");
    json_writer_object_begin(w);
    for (int k = 1; k < SERVE_OUTCOME_COUNT; k++)
        json_writer_key_int(w, serve_outcome_name(k), s->by_outcome[k]);
    json_writer_object_end(w);
    json_writer_key(w, "http_status");
    json_writer_object_begin(w);
    for (int j = 0; j < s->n_http_status; j++) {
        char code[16];
        snprintf(code, sizeof code, "%d", s->http_status[j]);
        json_writer_key_int(w, code, s->http_status_count[j]);
    }
    json_writer_object_end(w);
    json_writer_key(w, "error_samples");
    json_writer_object_begin(w);
    for (int k = 1; k < SERVE_OUTCOME_COUNT; k++)
        if (s->error_sample[k])
            json_writer_key_string(w, serve_outcome_name(k), s->error_sample[k]);
    json_writer_object_end(w);
    json_writer_key_double(w, "duration_s", s->duration_s);
    json_writer_key_double(w, "request_throughput", s->request_throughput);
    json_writer_key_double(w, "output_throughput", s->output_throughput);
    json_writer_key_double(w, "total_token_throughput", s->total_token_throughput);
    json_writer_key_int(w, "total_input_tokens", s->total_input_tokens);
    json_writer_key_int(w, "total_output_tokens", s->total_output_tokens);
    json_writer_key_double(w, "mean_input_tokens", s->completed ? (double)s->total_input_tokens / s->completed : NAN);
    json_writer_key_double(w, "mean_output_tokens", s->completed ? (double)s->total_output_tokens / s->completed : NAN);
    json_writer_key_int(w, "input_tokens_from_usage", s->input_from_usage);
    json_writer_key_int(w, "output_tokens_from_usage", s->output_from_usage);
    json_writer_key_int(w, "cached_tokens", s->cached_tokens);
    json_writer_key_int(w, "cached_tokens_from_usage", s->cached_from_usage);
    json_writer_key_double(w, "prefix_cache_hit_rate", serve_hit_rate(s->cached_tokens, s->cached_of_input));
    json_writer_key(w, "turns");
    if (s->n_turns > 1) {
        json_writer_array_begin(w);
        for (int t = 0; t < s->n_turns; t++) {
            const struct serve_turn_summary *u = &s->turns[t];
            json_writer_object_begin(w);
            json_writer_key_int(w, "turn", t + 1);
            json_writer_key_int(w, "sent", u->sent);
            json_writer_key_int(w, "completed", u->completed);
            json_writer_key_double(w, "mean_input_tokens", u->completed ? (double)u->input_tokens / u->completed : NAN);
            json_writer_key_int(w, "cached_tokens", u->cached_tokens);
            json_writer_key_double(w, "prefix_cache_hit_rate",
                                   serve_hit_rate(u->cached_tokens, u->cached_of_input));
            json_writer_key_double(w, "ttft_mean_ms", u->ttft.mean);
            json_writer_key_double(w, "ttft_p50_ms", u->ttft.p50);
            json_writer_key_double(w, "ttft_p95_ms", u->ttft.p95);
            json_writer_object_end(w);
        }
        json_writer_array_end(w);
    } else {
        json_writer_null(w);
    }
    json_metric(w, "ttft_ms", &s->ttft);
    json_metric(w, "tpot_ms", &s->tpot);
    json_metric(w, "itl_ms", &s->itl);
    json_metric(w, "e2e_ms", &s->e2e);
    json_writer_key(w, "goodput");
    if (s->has_goodput) {
        json_writer_object_begin(w);
        json_writer_key_int(w, "good", s->good);
        json_writer_key_double(w, "request_goodput", s->request_goodput);
        json_writer_key_double(w, "output_goodput", s->output_goodput);
        json_writer_key(w, "slo");
        json_slo(w, &rep->opt->slo);
        json_writer_object_end(w);
    } else {
        json_writer_null(w);
    }
    if (r->requests) {
        json_writer_key(w, "requests");
        json_writer_array_begin(w);
        for (int i = 0; i < r->n_requests; i++)
            json_request(w, &r->requests[i]);
        json_writer_array_end(w);
    }
    json_writer_key(w, "cost");
    if (s->has_cost) {
        json_writer_object_begin(w);
        json_writer_key_double(w, "usd_per_hour", s->usd_per_hour);
        json_writer_key_double(w, "usd_per_request", s->usd_per_request);
        json_writer_key_double(w, "usd_per_million_output_tokens", s->usd_per_million_output_tokens);
        json_writer_key_double(w, "usd_per_million_total_tokens", s->usd_per_million_total_tokens);
        json_writer_object_end(w);
    } else {
        json_writer_null(w);
    }
    json_writer_object_end(w);
}

static void json_quality(struct json_writer *w, const struct serve_quality *q)
{
    json_writer_object_begin(w);
    json_writer_key_string(w, "file", q->path);
    json_writer_key_double(w, "score", q->score);
    json_writer_key(w, "cases");
    json_writer_array_begin(w);
    for (int i = 0; i < q->cases.n; i++) {
        const struct serve_prompt *p = &q->cases.items[i];
        const struct serve_quality_case *c = &q->results[i];
        json_writer_object_begin(w);
        json_writer_key_string(w, "prompt", p->text);
        json_writer_key_double(w, "score", c->score);
        json_writer_key(w, "found");
        json_writer_array_begin(w);
        for (int k = 0; k < p->n_keywords; k++)
            if (c->found[k])
                json_writer_string(w, p->keywords[k]);
        json_writer_array_end(w);
        json_writer_key(w, "missing");
        json_writer_array_begin(w);
        for (int k = 0; k < p->n_keywords; k++)
            if (!c->found[k])
                json_writer_string(w, p->keywords[k]);
        json_writer_array_end(w);
        json_writer_key_string(w, "outcome", serve_outcome_name(c->outcome));
        json_writer_key_string(w, "error", c->error);
        json_writer_key_string(w, "answer", c->answer);
        json_writer_object_end(w);
    }
    json_writer_array_end(w);
    json_writer_object_end(w);
}

int serve_report_write_json(const struct serve_report *rep, const char *path, char *err)
{
    const struct serve_options *o = rep->opt;
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set(err, ERR_IO, "cannot write %s: %s", path, strerror(errno));
    struct json_writer w;
    json_writer_init_file(&w, f, 2);
    json_writer_object_begin(&w);
    json_writer_key_string(&w, "schema", SERVE_JSON_SCHEMA);
    json_writer_key_string(&w, "label", rep->label);
    json_writer_key_string(&w, "model", rep->model);
    json_writer_key_string(&w, "url", rep->endpoint_url);
    json_writer_key_string(&w, "endpoint", o->endpoint == SERVE_ENDPOINT_CHAT ? "chat" : "completions");
    json_writer_key_string(&w, "started_at", rep->started_at);
    json_writer_key(&w, "config");
    json_writer_object_begin(&w);
    json_writer_key_string(&w, "mode", o->n_request_rate ? "request_rate" : "concurrency");
    json_writer_key(&w, "concurrency");
    json_writer_array_begin(&w);
    for (int i = 0; i < o->n_concurrency; i++)
        json_writer_int(&w, o->concurrency[i]);
    json_writer_array_end(&w);
    json_writer_key(&w, "request_rate");
    json_writer_array_begin(&w);
    for (int i = 0; i < o->n_request_rate; i++)
        json_rate(&w, o->request_rate[i]);
    json_writer_array_end(&w);
    json_writer_key(&w, "input_len");
    json_writer_array_begin(&w);
    for (int i = 0; !o->dataset && i < o->n_input_len; i++)
        json_writer_int(&w, o->input_len[i]);
    json_writer_array_end(&w);
    json_writer_key_int(&w, "output_len", o->output_len);
    json_writer_key_int(&w, "num_prompts", rep->n_runs ? rep->runs[0].s.sent : 0);
    json_writer_key_int(&w, "turns", o->turns > 1 ? o->turns : 1);
    json_writer_key_string(&w, "dataset", o->dataset);
    json_writer_key_int(&w, "seed", (long long)o->seed);
    json_writer_key_bool(&w, "reuse_prompts", o->reuse_prompts);
    json_writer_key_double(&w, "timeout_s", o->timeout_s);
    json_writer_key_bool(&w, "ignore_eos", o->ignore_eos);
    json_writer_key_double(&w, "temperature", o->temperature);
    json_writer_key(&w, "slo");
    if (o->has_slo)
        json_slo(&w, &o->slo);
    else
        json_writer_null(&w);
    json_writer_key_double(&w, "cost_per_hour", o->cost_per_hour);
    json_writer_key_double(&w, "tokens_per_word", rep->tokens_per_word);
    json_writer_key_bool(&w, "calibrated", rep->calibrated);
    json_writer_object_end(&w);
    json_writer_key(&w, "runs");
    json_writer_array_begin(&w);
    for (int i = 0; i < rep->n_runs; i++)
        json_run(&w, rep, &rep->runs[i]);
    json_writer_array_end(&w);
    json_writer_key(&w, "quality");
    if (rep->quality)
        json_quality(&w, rep->quality);
    else
        json_writer_null(&w);
    json_writer_object_end(&w);
    fputc('\n', f);
    int rc = json_writer_finish(&w);
    if (fclose(f) != 0 && !rc)
        rc = ERR_IO;
    if (rc)
        return err_set(err, ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}
