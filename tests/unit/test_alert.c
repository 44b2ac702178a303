/* Tests for the alert engine: measure names, histogram quantiles, windows over snapshots, the rule states
 * (pending, for, firing, resolved, retention), burn rate over two windows, config errors with file:line,
 * and states surviving a reopen of the store. Time is given, never read: every test is deterministic. */
#include "testutil.h"

#include "core/alert.h"
#include "core/alert_store.h"
#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SEC 1000000000LL

static const double bounds[] = {0.001, 0.01, 0.1, 1, 10};

static void sample_at(struct alert_sample *s, double t_s)
{
    alert_sample_init(s, (int64_t)(t_s * 1e9));
    for (int h = 0; h < ALERT_H_COUNT_; h++) {
        s->hist[h].bounds = bounds;
        s->hist[h].n_bounds = 5;
    }
}

/* Adds k observations of v seconds to histogram h of s. */
static void observe(struct alert_sample *s, int h, double v, int k)
{
    int b = 0;
    while (b < s->hist[h].n_bounds && v > s->hist[h].bounds[b])
        b++;
    s->hist[h].counts[b] += (uint64_t)k;
    s->hist[h].count += (uint64_t)k;
    s->hist[h].sum += v * k;
}

static void test_measure_names(void **state)
{
    (void)state;
    struct alert_measure m;
    assert_int_equal(alert_measure_parse("ttft_p95_ms", &m), 0);
    assert_int_equal(m.kind, AM_QUANTILE);
    assert_int_equal(m.hist, ALERT_H_TTFT);
    assert_true(fabs(m.q - 0.95) < 1e-12);
    assert_int_equal(alert_measure_parse("itl_p999_ms", &m), 0);
    assert_true(fabs(m.q - 0.999) < 1e-12);
    assert_int_equal(m.hist, ALERT_H_ITL);
    assert_int_equal(alert_measure_parse("queue_mean_ms", &m), 0);
    assert_int_equal(m.kind, AM_MEAN);
    assert_int_equal(alert_measure_parse("waiting", &m), 0);
    assert_int_equal(m.kind, AM_QUEUE_DEPTH);
    assert_int_equal(alert_measure_parse("burn_rate", &m), 0);
    assert_int_equal(alert_measure_parse("prefill_chunk", &m), 0);
    assert_int_equal(m.kind, AM_PREFILL_CHUNK);
    struct alert_sample g;
    alert_sample_init(&g, 0);
    assert_true(isnan(alert_measure_value(&m, NULL, &g, NULL, NULL))); /* no scheduler: NaN */
    g.gauge[ALERT_G_PREFILL_CHUNK] = 64;
    assert_true(alert_measure_value(&m, NULL, &g, NULL, NULL) == 64);
    assert_non_null(strstr(alert_measure_names(), "prefill_chunk"));
    assert_int_equal(alert_measure_parse("ttft_p95", &m), ERR_INVALID_ARG);
    assert_int_equal(alert_measure_parse("ttft_p5_ms", &m), ERR_INVALID_ARG);
    assert_int_equal(alert_measure_parse("latency", &m), ERR_INVALID_ARG);
    assert_int_equal(alert_measure_parse("e2e_p00_ms", &m), ERR_INVALID_ARG);
}

static void test_quantile(void **state)
{
    (void)state;
    struct alert_sample a, b;
    sample_at(&a, 0);
    sample_at(&b, 10);
    assert_true(isnan(alert_hist_quantile(&b.hist[0], &a.hist[0], 0.5))); /* no observation */
    observe(&b, 0, 0.05, 100); /* all in (0.01, 0.1] */
    /* rank 50 of 100 in that bucket: halfway between its bounds */
    assert_true(fabs(alert_hist_quantile(&b.hist[0], &a.hist[0], 0.5) - 0.055) < 1e-12);
    assert_true(fabs(alert_hist_quantile(&b.hist[0], &a.hist[0], 0.95) - (0.01 + 0.09 * 0.95)) < 1e-12);
    observe(&b, 0, 100, 100); /* +Inf bucket: histogram_quantile answers the highest finite bound */
    assert_true(fabs(alert_hist_quantile(&b.hist[0], &a.hist[0], 0.99) - 10) < 1e-12);
    /* the window subtracts what was there before */
    observe(&a, 0, 0.05, 100);
    assert_true(fabs(alert_hist_quantile(&b.hist[0], &a.hist[0], 0.5) - 10) < 1e-12);
    /* fraction above: all 100 of the window are above 1 s; half of a (0.01, 0.1] bucket is above 0.055 */
    assert_true(fabs(alert_hist_fraction_above(&b.hist[0], &a.hist[0], 1.0) - 1.0) < 1e-12);
    struct alert_sample c;
    sample_at(&c, 0);
    observe(&c, 0, 0.05, 10);
    assert_true(fabs(alert_hist_fraction_above(&c.hist[0], NULL, 0.055) - 0.5) < 1e-12);
    /* a reset source (fewer observations now than then) counts from zero */
    assert_true(fabs(alert_hist_quantile(&c.hist[0], &b.hist[0], 0.5) - 0.055) < 1e-12);
}

static void test_rates(void **state)
{
    (void)state;
    struct alert_sample a, b;
    sample_at(&a, 100);
    sample_at(&b, 110);
    a.counter[ALERT_C_OUTPUT_TOKENS] = 1000;
    b.counter[ALERT_C_OUTPUT_TOKENS] = 6000;
    a.counter[ALERT_C_REQUESTS] = 10;
    b.counter[ALERT_C_REQUESTS] = 110;
    b.counter[ALERT_C_ERRORS] = 2;
    a.counter[ALERT_C_ENERGY_J] = 0;
    b.counter[ALERT_C_ENERGY_J] = 2500;
    a.counter[ALERT_C_COST] = 1.0;
    b.counter[ALERT_C_COST] = 1.01;
    b.gauge[ALERT_G_KV_USAGE] = 0.5;
    struct alert_measure m;
    alert_measure_parse("output_tokens_per_second", &m);
    assert_true(fabs(alert_measure_value(&m, NULL, &b, &a, NULL) - 500) < 1e-9);
    alert_measure_parse("error_rate", &m);
    assert_true(fabs(alert_measure_value(&m, NULL, &b, &a, NULL) - 0.02) < 1e-12);
    alert_measure_parse("tokens_per_joule", &m);
    assert_true(fabs(alert_measure_value(&m, NULL, &b, &a, NULL) - 2) < 1e-12);
    alert_measure_parse("watts", &m);
    assert_true(fabs(alert_measure_value(&m, NULL, &b, &a, NULL) - 250) < 1e-9);
    alert_measure_parse("cost_per_million_tokens", &m);
    assert_true(fabs(alert_measure_value(&m, NULL, &b, &a, NULL) - 2.0) < 1e-6); /* $0.01 for 5000 tokens */
    alert_measure_parse("kv_usage", &m);
    assert_true(alert_measure_value(&m, NULL, &b, NULL, NULL) == 0.5); /* gauges need no window */
    /* no window, or an empty one: NaN */
    alert_measure_parse("requests_per_second", &m);
    assert_true(isnan(alert_measure_value(&m, NULL, &b, NULL, NULL)));
    assert_true(isnan(alert_measure_value(&m, NULL, &b, &b, NULL)));
    /* energy unknown (NaN counters): NaN, never a figure */
    a.counter[ALERT_C_ENERGY_J] = NAN;
    alert_measure_parse("tokens_per_joule", &m);
    assert_true(isnan(alert_measure_value(&m, NULL, &b, &a, NULL)));
    /* error rate with no requests in the window: NaN (not firing), not 0/0 */
    struct alert_sample later = a;
    later.t_ns += 10 * SEC;
    alert_measure_parse("error_rate", &m);
    assert_true(isnan(alert_measure_value(&m, NULL, &later, &a, NULL)));
}

/* ---- rules ---- */

static const char rules_yaml[] = "alerts:\n"
                                 "  interval_s: 1\n"
                                 "  resolved_retention_s: 60\n"
                                 "  rules:\n"
                                 "    - name: SlowTTFT\n"
                                 "      measure: ttft_p95_ms\n"
                                 "      window_s: 10\n"
                                 "      op: '>'\n"
                                 "      threshold: 500\n"
                                 "      for: 5s\n"
                                 "      severity: page\n"
                                 "      labels: {team: inference}\n"
                                 "      annotations: {summary: 'TTFT p95 is {{ $value }} ms (over {{$threshold}})'}\n"
                                 "    - name: Errors\n"
                                 "      measure: error_rate\n"
                                 "      window_s: 10\n"
                                 "      threshold: 0.01\n";

static enum alert_state state_of(struct alert_engine *e, const char *name, double *value)
{
    int n;
    struct alert_view *v = alert_engine_views(e, true, &n);
    enum alert_state st = ALERT_INACTIVE;
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].rule->name, name)) {
            st = v[i].state;
            if (value)
                *value = v[i].value;
        }
    alert_views_free(v, n);
    return st;
}

/* One sample a second; from t_slow on, each second brings 10 TTFT observations of 2 s (else 0.05 s). */
static void feed(struct alert_engine *e, struct alert_sample *cur, double t, bool slow, double now_unix)
{
    cur->t_ns = (int64_t)(t * 1e9);
    observe(cur, ALERT_H_TTFT, slow ? 2.0 : 0.05, 10);
    cur->counter[ALERT_C_REQUESTS] += 10;
    alert_engine_eval(e, cur, now_unix);
}

static void test_rule_states(void **state)
{
    (void)state;
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, rules_yaml, strlen(rules_yaml), "r.yaml", err), 0);
    assert_int_equal(cfg.n_rules, 2);
    assert_true(cfg.rules[0].for_s == 5);
    struct alert_engine *e = alert_engine_create(&cfg, NULL, 0, 1000);
    assert_non_null(e);
    struct alert_sample cur;
    sample_at(&cur, 0);
    double t = 0;
    /* 20 s of fast requests: inactive */
    for (; t < 20; t += 1)
        feed(e, &cur, t, false, 1000 + t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_INACTIVE);
    /* slow from t = 20: the 10 s window's p95 crosses 500 ms at once (more than 5% slow), pending... */
    feed(e, &cur, t, true, 1000 + t);
    double v;
    assert_int_equal(state_of(e, "SlowTTFT", &v), ALERT_PENDING);
    assert_true(v > 500);
    t += 1;
    /* ... for 5 s, then firing */
    for (; t < 25; t += 1)
        feed(e, &cur, t, true, 1000 + t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_PENDING);
    feed(e, &cur, t, true, 1000 + t);
    t += 1;
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_FIRING);
    /* the annotation carries the value */
    int n;
    struct alert_view *views = alert_engine_views(e, false, &n);
    assert_int_equal(n, 1);
    const char *summary = json_string_value(json_object_get(views[0].annotations, "summary"));
    assert_non_null(strstr(summary, "TTFT p95 is "));
    assert_non_null(strstr(summary, "(over 500)"));
    assert_string_equal(json_string_value(json_object_get(views[0].labels, "alertname")), "SlowTTFT");
    assert_string_equal(json_string_value(json_object_get(views[0].labels, "severity")), "page");
    assert_string_equal(json_string_value(json_object_get(views[0].labels, "team")), "inference");
    assert_true(views[0].fired_at == 1025);
    alert_views_free(views, n);
    /* fast again: once the slow seconds leave the 10 s window, resolved */
    for (; t < 40; t += 1)
        feed(e, &cur, t, false, 1000 + t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_RESOLVED);
    /* ... kept for resolved_retention_s (60), then inactive */
    for (; t < 80; t += 1)
        feed(e, &cur, t, false, 1000 + t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_RESOLVED);
    for (; t < 110; t += 1)
        feed(e, &cur, t, false, 1000 + t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_INACTIVE);
    /* no requests at all: no samples in the window, never firing (error rate is not 0/0) */
    assert_int_equal(state_of(e, "Errors", &v), ALERT_INACTIVE);
    alert_engine_destroy(e);
    alert_config_deinit(&cfg);
}

/* A condition that holds for less than for_s: pending, then back to inactive without ever firing. */
static void test_pending_drops(void **state)
{
    (void)state;
    static const char y[] = "alerts:\n  rules:\n    - {name: SlowTTFT, measure: ttft_p95_ms, window_s: 2, "
                            "threshold: 500, for: 5s}\n";
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, y, strlen(y), "p.yaml", err), 0);
    struct alert_engine *e = alert_engine_create(&cfg, NULL, 0, 0);
    struct alert_sample cur;
    sample_at(&cur, 0);
    double t = 0;
    for (; t < 12; t += 1)
        feed(e, &cur, t, false, t);
    for (; t < 14; t += 1) /* 2 slow seconds: pending, not for 5 s */
        feed(e, &cur, t, true, t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_PENDING);
    for (; t < 30; t += 1)
        feed(e, &cur, t, false, t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_INACTIVE); /* never fired */
    alert_engine_destroy(e);
    alert_config_deinit(&cfg);
}

/* A reload (alert_engine_set_config): a firing alert whose rule keeps its name and labels keeps its state and
 * activeAt and goes on being evaluated from the windows recorded before; a new rule starts inactive and is
 * evaluated from the same windows at once; a removed rule's alert is gone; a rule looking back further than
 * any before (2 h: the coarse ring) works. */
static void test_set_config(void **state)
{
    (void)state;
    static const char a[] = "alerts:\n  rules:\n    - {name: SlowTTFT, measure: ttft_p95_ms, window_s: 5, "
                            "threshold: 500}\n";
    static const char b[] = "alerts:\n  rules:\n    - {name: Busy, measure: requests_per_second, window_s: 5, "
                            "op: '>', threshold: 1}\n    - {name: SlowTTFT, measure: ttft_p95_ms, window_s: 5, "
                            "threshold: 400}\n    - {name: Long, measure: requests_per_second, window_s: 7200, "
                            "op: '>', threshold: 1000}\n";
    static const char c[] = "alerts:\n  rules:\n    - {name: Busy, measure: requests_per_second, window_s: 5, "
                            "op: '>', threshold: 1}\n";
    struct alert_config ca, cb, cc;
    alert_config_init(&ca);
    alert_config_init(&cb);
    alert_config_init(&cc);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&ca, a, strlen(a), "a.yaml", err), 0);
    assert_int_equal(alert_config_load_string(&cb, b, strlen(b), "b.yaml", err), 0);
    assert_int_equal(alert_config_load_string(&cc, c, strlen(c), "c.yaml", err), 0);
    struct alert_engine *e = alert_engine_create(&ca, NULL, 0, 0);
    assert_non_null(e);
    struct alert_sample cur;
    sample_at(&cur, 0);
    double t = 0;
    for (; t < 10; t += 1)
        feed(e, &cur, t, true, t);
    int n;
    struct alert_view *v = alert_engine_views(e, true, &n);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].state, ALERT_FIRING);
    double active_at = v[0].active_at;
    alert_views_free(v, n);

    assert_int_equal(alert_engine_set_config(e, &cb), 0);
    alert_config_deinit(&ca); /* no view of it is left: the engine no longer reads it */
    assert_int_equal(state_of(e, "Busy", NULL), ALERT_INACTIVE);
    feed(e, &cur, t, true, t);
    t += 1;
    v = alert_engine_views(e, true, &n);
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++) {
        if (!strcmp(v[i].rule->name, "SlowTTFT")) {
            assert_int_equal(v[i].state, ALERT_FIRING);
            assert_true(v[i].active_at == active_at); /* the same alert, not a new one */
            assert_true(v[i].rule->threshold == 400);
        } else if (!strcmp(v[i].rule->name, "Busy")) {
            assert_int_equal(v[i].state, ALERT_FIRING); /* 10 requests a second, from the windows kept */
        } else {
            assert_string_equal(v[i].rule->name, "Long");
            assert_int_equal(v[i].state, ALERT_INACTIVE);
        }
    }
    alert_views_free(v, n);

    assert_int_equal(alert_engine_set_config(e, &cc), 0);
    alert_config_deinit(&cb);
    feed(e, &cur, t, false, t);
    v = alert_engine_views(e, true, &n);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].rule->name, "Busy");
    assert_int_equal(v[0].state, ALERT_FIRING);
    alert_views_free(v, n);
    alert_engine_destroy(e);
    alert_config_deinit(&cc);
}

static const char burn_yaml[] = "alerts:\n"
                                "  rules:\n"
                                "    - name: FastBurn\n"
                                "      measure: burn_rate\n"
                                "      objective: 0.99\n"
                                "      window_s: 3600\n"
                                "      short_window_s: 300\n"
                                "      threshold: 14.4\n";

/* Burn rate: both windows must burn. 1 h at 20% errors then 10 min clean: the long window still burns
 * (~16x), the short does not: not firing. Errors again: both burn: firing. */
static void test_burn_rate(void **state)
{
    (void)state;
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, burn_yaml, strlen(burn_yaml), "b.yaml", err), 0);
    assert_true(cfg.rules[0].burn.objective == 0.99);
    assert_true(alert_config_max_window(&cfg) == 3600);
    struct alert_engine *e = alert_engine_create(&cfg, NULL, 0, 0);
    assert_non_null(e);
    struct alert_sample cur;
    sample_at(&cur, 0);
    double v;
    int t = 0;
    for (; t <= 3600; t += 10) { /* 10 requests every 10 s, 2 of them failed */
        cur.t_ns = t * SEC;
        cur.counter[ALERT_C_REQUESTS] += 10;
        cur.counter[ALERT_C_ERRORS] += 2;
        alert_engine_eval(e, &cur, t);
    }
    assert_int_equal(state_of(e, "FastBurn", &v), ALERT_FIRING);
    assert_true(fabs(v - 20) < 0.5); /* 20% bad over a 1% budget */
    for (; t <= 3600 + 600; t += 10) {
        cur.t_ns = t * SEC;
        cur.counter[ALERT_C_REQUESTS] += 10;
        alert_engine_eval(e, &cur, t);
    }
    assert_int_equal(state_of(e, "FastBurn", &v), ALERT_RESOLVED);
    assert_true(v < 1); /* the short window is clean: min(long, short) */
    struct alert_measure m;
    alert_measure_parse("error_rate", &m);
    double long_rate = alert_engine_measure(e, &m, NULL, &cur, 3600);
    assert_true(long_rate > 0.144); /* the long window alone would still fire */
    for (int k = 0; k < 40; k++, t += 10) {
        cur.t_ns = (int64_t)t * SEC;
        cur.counter[ALERT_C_REQUESTS] += 10;
        cur.counter[ALERT_C_ERRORS] += 2;
        alert_engine_eval(e, &cur, t);
    }
    assert_int_equal(state_of(e, "FastBurn", NULL), ALERT_FIRING);
    alert_engine_destroy(e);
    alert_config_deinit(&cfg);
}

/* A latency SLI: bad = TTFT over 100 ms. */
static void test_burn_latency(void **state)
{
    (void)state;
    static const char y[] = "alerts:\n  rules:\n    - {name: SlowBurn, measure: burn_rate, objective: 0.9, "
                            "latency: ttft, latency_ms: 100, window_s: 60, short_window_s: 10, threshold: 2}\n";
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, y, strlen(y), "l.yaml", err), 0);
    struct alert_engine *e = alert_engine_create(&cfg, NULL, 0, 0);
    struct alert_sample cur;
    sample_at(&cur, 0);
    for (int t = 0; t <= 60; t++) {
        cur.t_ns = t * SEC;
        observe(&cur, ALERT_H_TTFT, 0.05, 7);
        observe(&cur, ALERT_H_TTFT, 5, 3); /* 30% over 100 ms, budget 10%: 3x */
        alert_engine_eval(e, &cur, t);
    }
    double v;
    assert_int_equal(state_of(e, "SlowBurn", &v), ALERT_FIRING);
    assert_true(fabs(v - 3) < 1e-9);
    alert_engine_destroy(e);
    alert_config_deinit(&cfg);
}

static void expect_error(const char *yaml, const char *needle)
{
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    int rc = alert_config_load_string(&cfg, yaml, strlen(yaml), "bad.yaml", err);
    if (rc == 0 || !strstr(err, needle))
        print_error("yaml:\n%s-> rc %d, err '%s' (wanted '%s')\n", yaml, rc, err, needle);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err, needle));
    alert_config_deinit(&cfg);
}

static void test_config_errors(void **state)
{
    (void)state;
    expect_error("alerts:\n  rules:\n    - name: X\n      measure: ttft_p95\n      threshold: 1\n",
                 "bad.yaml:4: alerts.rules[0].measure: unknown measure 'ttft_p95' (known: ttft_p50_ms");
    expect_error("alerts:\n  rules:\n    - name: X\n      measure: kv_usage\n", "rule X needs a threshold");
    expect_error("alerts:\n  rules:\n    - name: X\n      measure: kv_usage\n      threshold: 1\n      op: '=>'\n",
                 "bad.yaml:6: alerts.rules[0].op: '=>' is not one of");
    expect_error("alerts:\n  rules:\n    - name: X\n      measure: kv_usage\n      threshold: 1\n      fro: 3\n",
                 "bad.yaml:6: alerts.rules[0].fro: unknown key");
    expect_error("alerts:\n  rules:\n    - {name: X, measure: kv_usage, threshold: 1, receivers: [nobody]}\n",
                 "no receiver is named 'nobody'");
    expect_error("alerts:\n  receivers:\n    - {name: a, kind: email, url: 'http://x'}\n", "unknown kind 'email'");
    expect_error("alerts:\n  receivers:\n    - {name: a, kind: webhook, url: 'ftp://x'}\n", "needs a url");
    expect_error("alerts:\n  receivers:\n    - {name: a, kind: webhook}\n", "needs a url");
    expect_error("alerts:\n  rules:\n    - {name: X, measure: kv_usage, threshold: 1}\n    - {name: X, measure: "
                 "running, threshold: 1}\n",
                 "'X' is already the name of rule 0");
    expect_error("alerts:\n  rules:\n    - {name: X, measure: kv_usage, threshold: 1, window_s: 2d}\n",
                 "alerts.rules[0].window_s: '2d' is not a duration");
    expect_error("alerts:\n  rules:\n    - {name: X, measure: kv_usage, threshold: 1, labels: {alertname: y}}\n",
                 "'alertname' and 'severity' are set from the rule");
    expect_error("alerts:\n  intervall: 3\n", "bad.yaml:2: alerts.intervall: unknown key");
    expect_error("alerts:\n  rules:\n    - {name: X, measure: burn_rate, threshold: 1, window_s: 60, "
                 "short_window_s: 600}\n",
                 "short_window_s (600) is longer than window_s (60)");
}

static void test_config_receivers(void **state)
{
    (void)state;
    static const char y[] = "alerts:\n"
                            "  receivers:\n"
                            "    - {name: ops, kind: webhook, url: 'http://h:9/hook'}\n"
                            "    - {name: am, kind: alertmanager, url: 'http://am:9093/'}\n"
                            "    - {name: chat, kind: slack, url: 'https://hooks.slack.com/x', send_resolved: false,\n"
                            "       group_by: [alertname, team], repeat_interval: 1h, max_attempts: 3}\n";
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, y, strlen(y), "r.yaml", err), 0);
    assert_int_equal(cfg.n_receivers, 3);
    assert_true(cfg.receivers[0].repeat_interval_s == 4 * 3600);
    assert_true(cfg.receivers[1].repeat_interval_s == 60); /* Alertmanager wants resends */
    assert_true(cfg.receivers[2].repeat_interval_s == 3600);
    assert_false(cfg.receivers[2].send_resolved);
    assert_int_equal(cfg.receivers[2].n_group_by, 2);
    assert_int_equal(cfg.receivers[2].max_attempts, 3);
    assert_string_equal(cfg.receivers[0].group_by[0], "alertname");
    alert_config_deinit(&cfg);
}

/* States survive a reopen of the store; a resolved alert stays resolved (not re-announced), a firing one
 * keeps firing through the warm-up when no data has come yet. */
static void test_persist_states(void **state)
{
    (void)state;
    const char *path = test_tmp_path("alerts.sqlite");
    unlink(path);
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, rules_yaml, strlen(rules_yaml), "r.yaml", err), 0);
    struct alert_store *st = alert_store_open(path, err);
    assert_non_null(st);
    struct alert_engine *e = alert_engine_create(&cfg, st, 0, 1000);
    struct alert_sample cur;
    sample_at(&cur, 0);
    double t = 0;
    for (; t < 12; t += 1)
        feed(e, &cur, t, false, 1000 + t);
    for (; t < 20; t += 1)
        feed(e, &cur, t, true, 1000 + t);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_FIRING);
    alert_engine_destroy(e);
    alert_store_close(st);

    /* restart: firing restored; with no samples during the first window it keeps firing */
    st = alert_store_open(path, err);
    assert_non_null(st);
    e = alert_engine_create(&cfg, st, 0, 2000);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_FIRING);
    struct alert_sample fresh;
    sample_at(&fresh, 1);
    alert_engine_eval(e, &fresh, 2001);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_FIRING);
    /* past the window, still no samples: no data means not firing */
    fresh.t_ns = 11 * SEC;
    alert_engine_eval(e, &fresh, 2011);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_RESOLVED);
    alert_engine_destroy(e);
    alert_store_close(st);

    /* and resolved stays resolved across another restart */
    st = alert_store_open(path, err);
    e = alert_engine_create(&cfg, st, 0, 2020);
    assert_int_equal(state_of(e, "SlowTTFT", NULL), ALERT_RESOLVED);
    alert_engine_destroy(e);
    alert_store_close(st);
    alert_config_deinit(&cfg);
}

static void test_formats(void **state)
{
    (void)state;
    char buf[32];
    alert_time_format(0, buf);
    assert_string_equal(buf, "0001-01-01T00:00:00Z");
    alert_time_format(1714564800.25, buf);
    assert_string_equal(buf, "2024-05-01T12:00:00.250Z");
    char fp[17];
    alert_fingerprint_format(0xabcULL, fp);
    assert_string_equal(fp, "0000000000000abc");
}

/* The fingerprint is Alertmanager's: FNV-1a 64 over sorted name, 0xff, value, 0xff. The expected value is
 * Prometheus's model.LabelSet{"alertname": "X"}.Fingerprint(), computed here from its definition. */
static void test_fingerprint(void **state)
{
    (void)state;
    static const char y[] = "alerts:\n  rules:\n    - {name: X, measure: running, threshold: 0, op: '>='}\n";
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(alert_config_load_string(&cfg, y, strlen(y), "f.yaml", err), 0);
    struct alert_engine *e = alert_engine_create(&cfg, NULL, 0, 0);
    int n;
    struct alert_view *v = alert_engine_views(e, true, &n);
    assert_int_equal(n, 1);
    uint64_t h = 14695981039346656037ULL;
    const char bytes[] = "alertname\xffX\xff";
    for (size_t i = 0; i < sizeof bytes - 1; i++) {
        h ^= (unsigned char)bytes[i];
        h *= 1099511628211ULL;
    }
    assert_true(v[0].fingerprint == h);
    alert_views_free(v, n);
    alert_engine_destroy(e);
    alert_config_deinit(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measure_names),  cmocka_unit_test(test_quantile),
        cmocka_unit_test(test_rates),          cmocka_unit_test(test_rule_states),
        cmocka_unit_test(test_pending_drops),  cmocka_unit_test(test_burn_rate),
        cmocka_unit_test(test_burn_latency),   cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_receivers), cmocka_unit_test(test_persist_states),
        cmocka_unit_test(test_formats),        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_set_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
