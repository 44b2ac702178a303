/* Tests for the Prometheus rendering: counters by endpoint/status, gauges, cumulative histogram buckets; and
 * the scheduler's observer landing each engine measure in its own Prometheus metric. */
#include "testutil.h"

#include "core/alert.h"
#include "engine/scheduler.h"
#include "server/metrics.h"

#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void assert_line(const char *text, const char *line)
{
    char want[512];
    snprintf(want, sizeof want, "\n%s\n", line);
    if (!strstr(text, want))
        print_error("missing line '%s' in:\n%s\n", line, text);
    assert_non_null(strstr(text, want));
}

static void test_render(void **state)
{
    (void)state;
    struct metrics *m = metrics_create();
    assert_non_null(m);
    metrics_request(m, "/v1/completions", 200);
    metrics_request(m, "/v1/completions", 200);
    metrics_request(m, "/v1/completions", 400);
    metrics_request(m, "/nope", 404);
    metrics_add(m, MC_GENERATED_TOKENS, 7);
    metrics_add(m, MC_GENERATED_TOKENS, 3);
    metrics_observe(m, MH_TTFT, 0.003);  /* le 0.005 */
    metrics_observe(m, MH_TTFT, 0.2);    /* le 0.25 */
    metrics_observe(m, MH_TTFT, 1000);   /* only +Inf */
    metrics_observe(m, MH_TTFT, 0.0004); /* first bucket (le 0.0005): sub-millisecond is resolved */
    metrics_http_error(m, 400);
    metrics_http_error(m, 400);
    metrics_http_error(m, 431);
    metrics_http_error(m, 418);          /* not one the layer answers: "other" */
    struct metrics_gauges g;
    metrics_gauges_init(&g);
    g.running = 2;
    g.waiting = 5;
    g.kv_blocks_used = 10;
    g.kv_blocks_total = 64;
    g.prefix_cache_blocks = 1;
    g.connections = 3;
    g.ready = 1;
    size_t len;
    char *t = metrics_render(m, &g, &len);
    assert_non_null(t);
    assert_int_equal(strlen(t), len);
    assert_line(t, "wafer_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2");
    assert_line(t, "wafer_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1");
    assert_line(t, "wafer_requests_total{endpoint=\"other\",status=\"404\"} 1");
    assert_line(t, "# TYPE wafer_http_errors_total counter");
    assert_line(t, "wafer_http_errors_total{status=\"400\"} 2");
    assert_line(t, "wafer_http_errors_total{status=\"431\"} 1");
    assert_line(t, "wafer_http_errors_total{status=\"408\"} 0");
    assert_line(t, "wafer_http_errors_total{status=\"other\"} 1");
    assert_line(t, "wafer_requests_running 2");
    assert_line(t, "wafer_requests_waiting 5");
    assert_line(t, "wafer_kv_blocks_used 10");
    assert_line(t, "wafer_kv_blocks_total 64");
    assert_line(t, "wafer_generation_tokens_total 10");
    assert_line(t, "# TYPE wafer_time_to_first_token_seconds histogram");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.0005\"} 1");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.0025\"} 1");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.005\"} 2");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.1\"} 2");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.25\"} 3");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"600\"} 3");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4");
    assert_line(t, "wafer_time_to_first_token_seconds_count 4");
    assert_line(t, "wafer_inter_token_latency_seconds_bucket{le=\"0.0001\"} 0");
    assert_line(t, "wafer_inter_token_latency_seconds_bucket{le=\"10\"} 0");
    assert_line(t, "wafer_inter_token_latency_seconds_count 0");
    /* Every sample line has a name starting with wafer_. */
    for (char *l = t; *l; l = strchr(l, '\n') + 1) {
        if (*l != '#')
            assert_int_equal(strncmp(l, "wafer_", 6), 0);
        if (!strchr(l, '\n'))
            break;
    }
    /* nothing observed: the cost, energy, batch limit and alert metrics are absent, not zero */
    assert_null(strstr(t, "wafer_cost"));
    assert_null(strstr(t, "wafer_energy"));
    assert_null(strstr(t, "joule"));
    assert_null(strstr(t, "wafer_batch_limit"));
    assert_null(strstr(t, "wafer_prefill_chunk"));
    assert_null(strstr(t, "wafer_alert"));
    free(t);
    /* observed: present, the estimate under names that say so */
    g.batch_limit = 7;
    g.prefill_chunk = 64;
    g.cost_per_hour = 1.2;
    g.cost_total = 0.5;
    g.cost_per_mtok = 3.25;
    g.energy_est_joules = 1000;
    g.tokens_per_joule_est = 0.5;
    g.alerts_firing = 1;
    g.alerts_pending = 2;
    g.notif_sent = 3;
    g.notif_pending = 0;
    t = metrics_render(m, &g, &len);
    assert_line(t, "wafer_batch_limit 7");
    assert_line(t, "wafer_prefill_chunk 64");
    assert_line(t, "wafer_cost_per_hour_dollars 1.2");
    assert_line(t, "wafer_cost_dollars_total 0.5");
    assert_line(t, "wafer_cost_per_million_tokens_dollars 3.25");
    assert_line(t, "wafer_energy_estimated_joules_total 1000");
    assert_line(t, "wafer_tokens_per_joule_estimated 0.5");
    assert_null(strstr(t, "wafer_energy_joules_total")); /* never the measured name for an estimate */
    assert_line(t, "wafer_alerts{state=\"firing\"} 1");
    assert_line(t, "wafer_alerts{state=\"pending\"} 2");
    assert_line(t, "wafer_alert_notifications_total{result=\"sent\"} 3");
    assert_line(t, "wafer_alert_notifications_pending 0");
    free(t);
    metrics_destroy(m);
}

/* The alert engine's sample reads the same counters and histograms /metrics shows; errors are the
 * generation endpoints' 5xx, 429 and 408, not the client's mistakes. */
static void test_sample(void **state)
{
    (void)state;
    struct metrics *m = metrics_create();
    metrics_request(m, "/v1/completions", 200);
    metrics_request(m, "/v1/chat/completions", 200);
    metrics_request(m, "/v1/completions", 400);
    metrics_request(m, "/v1/completions", 429);
    metrics_request(m, "/v1/generate", 503);
    metrics_request(m, "/v1/generate", 408);
    metrics_request(m, "/v1/completions", 499);
    metrics_request(m, "/metrics", 200); /* not a generation */
    metrics_add(m, MC_GENERATED_TOKENS, 42);
    metrics_observe(m, MH_ITL, 0.002);
    struct alert_sample s;
    alert_sample_init(&s, 0);
    metrics_sample(m, &s);
    assert_true(s.counter[ALERT_C_REQUESTS] == 7);
    assert_true(s.counter[ALERT_C_ERRORS] == 3);
    assert_true(s.counter[ALERT_C_OUTPUT_TOKENS] == 42);
    assert_int_equal(s.hist[ALERT_H_ITL].count, 1);
    assert_true(s.hist[ALERT_H_ITL].n_bounds > 20);
    assert_true(s.hist[ALERT_H_ITL].bounds[0] == 0.0001);
    double p50 = alert_hist_quantile(&s.hist[ALERT_H_ITL], NULL, 0.5);
    assert_true(p50 > 0.0015 && p50 <= 0.002); /* in the (1.5 ms, 2 ms] bucket */
    struct metrics_answers a;
    metrics_answers_get(m, &a);
    assert_int_equal(a.ok, 2);
    assert_int_equal(a.client_errors, 1);
    assert_int_equal(a.rejected, 1);
    assert_int_equal(a.server_errors, 1);
    assert_int_equal(a.timed_out, 1);
    assert_int_equal(a.cancelled, 1);
    metrics_destroy(m);
}

/* A rendered /metrics read back by the alert engine's parser (wafer alerts check) gives the sample the
 * server takes of itself: the same counters, histograms and gauges. */
static void test_prometheus_round_trip(void **state)
{
    (void)state;
    struct metrics *m = metrics_create();
    metrics_request(m, "/v1/completions", 200);
    metrics_request(m, "/v1/chat/completions", 503);
    metrics_request(m, "/tokenize", 500); /* not a generation endpoint */
    metrics_add(m, MC_GENERATED_TOKENS, 1234);
    metrics_add(m, MC_PROMPT_TOKENS, 56);
    metrics_add(m, MC_PREEMPTIONS, 3);
    for (int i = 0; i < 50; i++) {
        metrics_observe(m, MH_TTFT, 0.001 * i);
        metrics_observe(m, MH_ITL, 0.0001 * i);
        metrics_observe(m, MH_E2E, 0.1 * i);
    }
    metrics_observe(m, MH_QUEUE, 1000); /* +Inf */
    struct metrics_gauges g;
    metrics_gauges_init(&g);
    g.running = 3;
    g.waiting = 4;
    g.kv_blocks_used = 16;
    g.kv_blocks_total = 64;
    g.prefix_cache_blocks = 8;
    g.batch_limit = 12;
    size_t len;
    char *t = metrics_render(m, &g, &len);
    struct alert_sample want, got;
    alert_sample_init(&want, 0);
    alert_sample_init(&got, 0);
    metrics_sample(m, &want);
    struct alert_prom_bounds b;
    assert_int_equal(alert_sample_from_prometheus(t, len, &got, &b), 0);
    for (int c = 0; c < ALERT_C_ENERGY_J; c++)
        assert_true(got.counter[c] == want.counter[c]);
    assert_true(got.counter[ALERT_C_REQUESTS] == 2 && got.counter[ALERT_C_ERRORS] == 1);
    for (int h = 0; h < ALERT_H_COUNT_; h++) {
        assert_int_equal(got.hist[h].n_bounds, want.hist[h].n_bounds);
        assert_int_equal(got.hist[h].count, want.hist[h].count);
        assert_true(fabs(got.hist[h].sum - want.hist[h].sum) < 1e-6);
        for (int i = 0; i < want.hist[h].n_bounds; i++)
            assert_true(got.hist[h].bounds[i] == want.hist[h].bounds[i]);
        for (int i = 0; i <= want.hist[h].n_bounds; i++)
            assert_int_equal(got.hist[h].counts[i], want.hist[h].counts[i]);
    }
    assert_true(got.gauge[ALERT_G_RUNNING] == 3 && got.gauge[ALERT_G_WAITING] == 4);
    assert_true(got.gauge[ALERT_G_KV_USAGE] == 0.25 && got.gauge[ALERT_G_PREFIX_USAGE] == 0.125);
    assert_true(got.gauge[ALERT_G_BATCH_LIMIT] == 12);
    assert_true(isnan(got.counter[ALERT_C_ENERGY_J])); /* absent stays unknown */
    free(t);
    assert_int_equal(alert_sample_from_prometheus("# nothing\nfoo 1\n", 16, &got, &b), ERR_FORMAT);
    metrics_destroy(m);
}

static void test_sched_observer(void **state)
{
    (void)state;
    struct metrics *m = metrics_create();
    assert_non_null(m);
    struct sched_observer obs;
    metrics_sched_observer(m, &obs);
    /* a distinct value per counter, so a counter mapped onto the wrong metric shows */
    static const char *const names[SCHED_CTR_COUNT_] = {
        [SCHED_CTR_PROMPT_TOKENS] = "wafer_prompt_tokens_total",
        [SCHED_CTR_GENERATED_TOKENS] = "wafer_generation_tokens_total",
        [SCHED_CTR_PREFIX_QUERIES] = "wafer_prefix_cache_queries_total",
        [SCHED_CTR_PREFIX_HITS] = "wafer_prefix_cache_hits_total",
        [SCHED_CTR_PREFIX_HIT_TOKENS] = "wafer_prefix_cache_hit_tokens_total",
        [SCHED_CTR_PREEMPTIONS] = "wafer_preemptions_total",
        [SCHED_CTR_CANCELLED] = "wafer_requests_cancelled_total",
        [SCHED_CTR_TIMEOUTS] = "wafer_requests_timed_out_total",
        [SCHED_CTR_REJECTED_QUEUE_FULL] = "wafer_requests_rejected_total",
        [SCHED_CTR_ENGINE_STEPS] = "wafer_engine_steps_total",
        [SCHED_CTR_SPEC_DRAFTS] = "wafer_spec_decode_num_drafts_total",
        [SCHED_CTR_SPEC_DRAFT_TOKENS] = "wafer_spec_decode_num_draft_tokens_total",
        [SCHED_CTR_SPEC_ACCEPTED_TOKENS] = "wafer_spec_decode_num_accepted_tokens_total",
    };
    static char pos_names[SCHED_SPEC_POS_MAX][96];
    const char *all[SCHED_CTR_COUNT_];
    for (int c = 0; c < SCHED_CTR_COUNT_; c++)
        all[c] = names[c];
    for (int i = 0; i < SCHED_SPEC_POS_MAX; i++) {
        snprintf(pos_names[i], sizeof pos_names[i], "wafer_spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"}", i);
        all[SCHED_CTR_SPEC_ACCEPTED_POS + i] = pos_names[i];
    }
    for (int c = 0; c < SCHED_CTR_COUNT_; c++)
        obs.count(obs.ctx, (enum sched_counter)c, 100 + c);
    static const char *const hists[SCHED_TIM_COUNT_] = {
        [SCHED_TIM_TTFT] = "wafer_time_to_first_token_seconds",
        [SCHED_TIM_ITL] = "wafer_inter_token_latency_seconds",
        [SCHED_TIM_E2E] = "wafer_request_duration_seconds",
        [SCHED_TIM_QUEUE] = "wafer_queue_time_seconds",
    };
    for (int t = 0; t < SCHED_TIM_COUNT_; t++)
        for (int k = 0; k <= t; k++)
            obs.observe(obs.ctx, (enum sched_timing)t, 0.5);
    struct metrics_gauges g = {0};
    char *text = metrics_render(m, &g, NULL);
    assert_non_null(text);
    for (int c = 0; c < SCHED_CTR_COUNT_; c++) {
        assert_non_null(all[c]); /* a new counter needs its line here and in metrics.c */
        char line[160];
        snprintf(line, sizeof line, "%s %d", all[c], 100 + c);
        assert_line(text, line);
    }
    for (int t = 0; t < SCHED_TIM_COUNT_; t++) {
        assert_non_null(hists[t]);
        char line[128];
        snprintf(line, sizeof line, "%s_count %d", hists[t], t + 1);
        assert_line(text, line);
    }
    free(text);
    metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_render), cmocka_unit_test(test_sched_observer), cmocka_unit_test(test_sample),
        cmocka_unit_test(test_prometheus_round_trip)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
