/* Tests for the Prometheus rendering: counters by endpoint/status, gauges, cumulative histogram buckets. */
#include "testutil.h"

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
    struct metrics_gauges g = {.running = 2, .waiting = 5, .kv_blocks_used = 10, .kv_blocks_total = 64,
                               .prefix_cache_blocks = 1, .connections = 3, .ready = 1};
    size_t len;
    char *t = metrics_render(m, &g, &len);
    assert_non_null(t);
    assert_int_equal(strlen(t), len);
    assert_line(t, "wafer_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2");
    assert_line(t, "wafer_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1");
    assert_line(t, "wafer_requests_total{endpoint=\"other\",status=\"404\"} 1");
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_render)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
