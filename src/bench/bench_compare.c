/*
 * bench_compare: pairs the runs of two results by their load point (concurrency or request rate, and prompt
 * length) so a sweep compares like with like even when the sweeps differ; runs without a partner are
 * listed, not guessed. Better means higher for throughput and goodput, lower for latency and cost; within
 * 1% is a tie.
 */
#include "bench/bench_compare.h"

#include "bench/serve_report.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static double cmp_num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static double cmp_num2(json_t *o, const char *k1, const char *k2)
{
    return cmp_num(json_object_get(o, k1), k2);
}

static json_t *cmp_load(const char *path)
{
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr);
    if (!o) {
        fprintf(stderr, "wafer bench compare: %s: %s (line %d)\n", path, jerr.text, jerr.line);
        return NULL;
    }
    json_t *schema = json_object_get(o, "schema");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), SERVE_JSON_SCHEMA) != 0 ||
        !json_is_array(json_object_get(o, "runs"))) {
        fprintf(stderr, "wafer bench compare: %s is not a `wafer bench serve --json` result (no \"schema\": \"%s\")\n",
                path, SERVE_JSON_SCHEMA);
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The load point of a run as text, e.g. "concurrency 4, input 128". */
static void cmp_run_key(json_t *run, char *out, size_t cap)
{
    json_t *c = json_object_get(run, "concurrency"), *r = json_object_get(run, "request_rate");
    json_t *in = json_object_get(run, "input_len");
    int n;
    if (json_is_integer(c))
        n = snprintf(out, cap, "concurrency %lld", (long long)json_integer_value(c));
    else if (json_is_string(r))
        n = snprintf(out, cap, "rate %s", json_string_value(r));
    else if (json_is_number(r))
        n = snprintf(out, cap, "rate %g req/s", json_number_value(r));
    else
        n = snprintf(out, cap, "load ?");
    if (json_is_integer(in) && n >= 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, ", input %lld", (long long)json_integer_value(in));
}

/* Cost per request and per 1M output tokens: recomputed at a given price, else the file's. */
static void cmp_cost(json_t *run, double price, double *per_req, double *per_mtok)
{
    if (isfinite(price)) {
        double rt = cmp_num(run, "request_throughput"), ot = cmp_num(run, "output_throughput");
        *per_req = rt > 0 ? price / 3600.0 / rt : NAN;
        *per_mtok = ot > 0 ? price / 3600.0 / ot * 1e6 : NAN;
    } else {
        *per_req = cmp_num2(run, "cost", "usd_per_request");
        *per_mtok = cmp_num2(run, "cost", "usd_per_million_output_tokens");
    }
}

static void cmp_row(const char *name, double a, double b, int decimals, bool higher_better)
{
    char sa[32], sb[32], ratio[16] = "-", better[8] = "";
    if (isfinite(a))
        snprintf(sa, sizeof sa, "%.*f", decimals, a);
    else
        snprintf(sa, sizeof sa, "-");
    if (isfinite(b))
        snprintf(sb, sizeof sb, "%.*f", decimals, b);
    else
        snprintf(sb, sizeof sb, "-");
    if (isfinite(a) && isfinite(b) && a != 0) {
        double q = b / a;
        snprintf(ratio, sizeof ratio, "%.3fx", q);
        if (fabs(q - 1) <= 0.01)
            snprintf(better, sizeof better, "=");
        else
            snprintf(better, sizeof better, "%s", (q > 1) == higher_better ? "B" : "A");
    } else if (isfinite(a) && isfinite(b)) {
        snprintf(better, sizeof better, b == 0 ? "=" : higher_better ? "B" : "A");
    }
    printf("  %-30s %14s %14s %9s  %s\n", name, sa, sb, ratio, better);
}

static void cmp_pair(json_t *ra, json_t *rb, double price_a, double price_b)
{
    char key[128];
    cmp_run_key(ra, key, sizeof key);
    printf("\n== %s ==\n", key);
    printf("  %-30s %14s %14s %9s  %s\n", "metric", "A", "B", "B/A", "better");
    cmp_row("completed", cmp_num(ra, "completed"), cmp_num(rb, "completed"), 0, true);
    cmp_row("failed", cmp_num(ra, "failed"), cmp_num(rb, "failed"), 0, false);
    cmp_row("request throughput (req/s)", cmp_num(ra, "request_throughput"), cmp_num(rb, "request_throughput"), 3, true);
    cmp_row("output throughput (tok/s)", cmp_num(ra, "output_throughput"), cmp_num(rb, "output_throughput"), 1, true);
    cmp_row("total throughput (tok/s)", cmp_num(ra, "total_token_throughput"), cmp_num(rb, "total_token_throughput"),
            1, true);
    static const char *const metrics[] = {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"};
    static const char *const names[] = {"TTFT", "TPOT", "ITL", "E2E"};
    static const char *const stats[] = {"mean", "p50", "p95", "p99"};
    for (int m = 0; m < 4; m++) {
        for (int s = 0; s < 4; s++) {
            char row[48];
            snprintf(row, sizeof row, "%s %s (ms)", names[m], stats[s]);
            cmp_row(row, cmp_num2(ra, metrics[m], stats[s]), cmp_num2(rb, metrics[m], stats[s]), 2, false);
        }
    }
    double ga = cmp_num2(ra, "goodput", "request_goodput"), gb = cmp_num2(rb, "goodput", "request_goodput");
    if (isfinite(ga) || isfinite(gb))
        cmp_row("goodput (req/s)", ga, gb, 3, true);
    double ca_req, ca_tok, cb_req, cb_tok;
    cmp_cost(ra, price_a, &ca_req, &ca_tok);
    cmp_cost(rb, price_b, &cb_req, &cb_tok);
    if (isfinite(ca_req) || isfinite(cb_req)) {
        cmp_row("cost per request ($)", ca_req, cb_req, 6, false);
        cmp_row("cost per 1M output tokens ($)", ca_tok, cb_tok, 4, false);
    }
}

static bool cmp_same_load(json_t *a, json_t *b)
{
    return json_equal(json_object_get(a, "concurrency"), json_object_get(b, "concurrency")) &&
           json_equal(json_object_get(a, "request_rate"), json_object_get(b, "request_rate")) &&
           json_equal(json_object_get(a, "input_len"), json_object_get(b, "input_len"));
}

static void cmp_describe(const char *tag, const char *path, json_t *o, double price)
{
    json_t *label = json_object_get(o, "label"), *model = json_object_get(o, "model"), *url = json_object_get(o, "url");
    printf("  %s: %s", tag, json_is_string(label) ? json_string_value(label) : "(no label)");
    if (json_is_string(model))
        printf(" (model %s)", json_string_value(model));
    printf(" at %s, %s", json_is_string(url) ? json_string_value(url) : "?", path);
    double file_price = cmp_num2(o, "config", "cost_per_hour");
    if (isfinite(price))
        printf(", priced at $%.2f/hour", price);
    else if (isfinite(file_price))
        printf(", priced at $%.2f/hour (from the file)", file_price);
    printf("\n");
}

int bench_compare_main(const struct bench_compare_options *o)
{
    json_t *a = cmp_load(o->a_path);
    json_t *b = a ? cmp_load(o->b_path) : NULL;
    if (!a || !b) {
        json_decref(a);
        return 2;
    }
    json_t *runs_a = json_object_get(a, "runs"), *runs_b = json_object_get(b, "runs");
    printf("wafer bench compare (ratio = B/A)\n");
    cmp_describe("A", o->a_path, a, o->cost_a);
    cmp_describe("B", o->b_path, b, o->cost_b);
    int paired = 0;
    size_t ia;
    json_t *ra;
    json_array_foreach(runs_a, ia, ra) {
        size_t ib;
        json_t *rb, *match = NULL;
        json_array_foreach(runs_b, ib, rb) {
            if (cmp_same_load(ra, rb)) {
                match = rb;
                break;
            }
        }
        if (match) {
            cmp_pair(ra, match, o->cost_a, o->cost_b);
            paired++;
        }
    }
    /* load points only one side measured */
    for (int side = 0; side < 2; side++) {
        json_t *mine = side ? runs_b : runs_a, *other = side ? runs_a : runs_b, *r, *q;
        size_t i, j;
        json_array_foreach(mine, i, r) {
            bool found = false;
            json_array_foreach(other, j, q) found |= cmp_same_load(r, q);
            if (!found) {
                char key[128];
                cmp_run_key(r, key, sizeof key);
                printf("\nonly in %s: %s (not compared)\n", side ? "B" : "A", key);
            }
        }
    }
    json_decref(a);
    json_decref(b);
    if (!paired) {
        fprintf(stderr, "wafer bench compare: the two results share no load point (same concurrency or request rate "
                        "and input length); run both with the same --concurrency/--request-rate and --input-len\n");
        return 1;
    }
    return 0;
}
