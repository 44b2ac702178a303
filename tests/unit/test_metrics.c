/* Tests for the Prometheus rendering: counters by endpoint/status, gauges, cumulative histogram buckets; and
 * the scheduler's observer landing each engine measure in its own Prometheus metric. */
#include "testutil.h"

#include "engine/scheduler.h"
#include "server/metrics.h"

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
    metrics_observe(m, MH_TTFT, 0.003);  /* first bucket (le 0.005) */
    metrics_observe(m, MH_TTFT, 0.2);    /* le 0.25 */
    metrics_observe(m, MH_TTFT, 1000);   /* only +Inf */
    metrics_http_error(m, 400);
    metrics_http_error(m, 400);
    metrics_http_error(m, 431);
    metrics_http_error(m, 418);          /* not one the layer answers: "other" */
    struct metrics_gauges g = {.running = 2, .waiting = 5, .kv_blocks_used = 10, .kv_blocks_total = 64,
                               .prefix_cache_blocks = 1, .connections = 3, .ready = 1};
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
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.005\"} 1");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.1\"} 1");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"0.25\"} 2");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"320\"} 2");
    assert_line(t, "wafer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3");
    assert_line(t, "wafer_time_to_first_token_seconds_count 3");
    assert_line(t, "wafer_inter_token_latency_seconds_count 0");
    /* Every sample line has a name starting with wafer_. */
    for (char *l = t; *l; l = strchr(l, '\n') + 1) {
        if (*l != '#')
            assert_int_equal(strncmp(l, "wafer_", 6), 0);
        if (!strchr(l, '\n'))
            break;
    }
    free(t);
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
    };
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
        assert_non_null(names[c]); /* a new counter needs its line here and in metrics.c */
        char line[128];
        snprintf(line, sizeof line, "%s %d", names[c], 100 + c);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_render), cmocka_unit_test(test_sched_observer)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
