/* Tests for the pure parts of `wafer bench serve`: the SSE framer (fed in every possible split), chunk
 * parsing for both endpoints, per-run statistics (TPOT, ITL pooling, goodput, cost, outcome counts), SLO
 * parsing, synthetic prompts, JSONL loading with precise errors, and keyword scoring. */
#include "testutil.h"

#include "bench/serve.h"
#include "bench/serve_prompts.h"
#include "bench/serve_sse.h"
#include "bench/serve_stats.h"
#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct events {
    char got[16][128];
    int n;
};

static int collect(void *ctx, const char *data, size_t len)
{
    struct events *e = ctx;
    assert_int_equal(strlen(data), len);
    if (e->n < 16)
        snprintf(e->got[e->n], sizeof e->got[0], "%s", data);
    e->n++;
    return 0;
}

static const char sse_stream[] = ": comment line\r\n"
                                 "event: message\r\n"
                                 "data: {\"a\":1}\r\n\r\n"
                                 "id: 7\n"
                                 "data:{\"b\":2}\n"
                                 "data: second line\n\n"
                                 "retry: 10\r\r"
                                 "data\n\n"
                                 "data: [DONE]\n\n";

static void check_events(const struct events *e)
{
    assert_int_equal(e->n, 4);
    assert_string_equal(e->got[0], "{\"a\":1}");
    assert_string_equal(e->got[1], "{\"b\":2}\nsecond line");
    assert_string_equal(e->got[2], "");
    assert_string_equal(e->got[3], "[DONE]");
}

static void test_sse_every_split(void **state)
{
    (void)state;
    size_t n = sizeof sse_stream - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        struct serve_sse s;
        struct events e = {0};
        serve_sse_init(&s);
        assert_int_equal(serve_sse_feed(&s, sse_stream, cut, collect, &e), 0);
        assert_int_equal(serve_sse_feed(&s, sse_stream + cut, n - cut, collect, &e), 0);
        assert_int_equal(serve_sse_finish(&s, collect, &e), 0);
        check_events(&e);
        serve_sse_deinit(&s);
    }
    /* one byte at a time */
    struct serve_sse s;
    struct events e = {0};
    serve_sse_init(&s);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(serve_sse_feed(&s, sse_stream + i, 1, collect, &e), 0);
    assert_int_equal(serve_sse_finish(&s, collect, &e), 0);
    check_events(&e);
    serve_sse_deinit(&s);
}

static void test_sse_finish_and_stop(void **state)
{
    (void)state;
    struct serve_sse s;
    struct events e = {0};
    serve_sse_init(&s);
    /* a stream that ends without the final blank line (or even the newline) still delivers its event */
    assert_int_equal(serve_sse_feed(&s, "data: x\n\ndata: [DONE]", 21, collect, &e), 0);
    assert_int_equal(e.n, 1);
    assert_int_equal(serve_sse_finish(&s, collect, &e), 0);
    assert_int_equal(e.n, 2);
    assert_string_equal(e.got[1], "[DONE]");
    serve_sse_deinit(&s);

    /* an event larger than the cap is refused, not buffered forever */
    serve_sse_init(&s);
    char *big = malloc(1 << 20);
    memset(big, 'x', 1 << 20);
    int rc = serve_sse_feed(&s, "data: ", 6, collect, &e);
    for (int i = 0; i < 9 && rc == 0; i++)
        rc = serve_sse_feed(&s, big, 1 << 20, collect, &e);
    assert_int_equal(rc, ERR_TOO_LARGE);
    free(big);
    serve_sse_deinit(&s);
}

static void test_chunk_parse(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct serve_chunk c;
    const char *cmpl = "{\"choices\":[{\"index\":0,\"text\":\" hello\"}]}";
    assert_int_equal(serve_chunk_parse(cmpl, strlen(cmpl), &c, err), 0);
    assert_string_equal(c.text, " hello");
    assert_int_equal(c.text_len, 6);
    assert_int_equal(c.prompt_tokens, -1);
    free(c.text);

    /* a token that is the byte 0 (llama-server sends it as \u0000 from models that emit it): a token */
    const char *nul = "{\"choices\":[{\"index\":0,\"text\":\"\\u0000\"}]}";
    assert_int_equal(serve_chunk_parse(nul, strlen(nul), &c, err), 0);
    assert_non_null(c.text);
    assert_int_equal(c.text_len, 1);
    assert_int_equal(c.text[0], 0);
    free(c.text);

    const char *chat = "{\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}";
    assert_int_equal(serve_chunk_parse(chat, strlen(chat), &c, err), 0);
    assert_string_equal(c.text, "hi");
    free(c.text);

    const char *role = "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}";
    assert_int_equal(serve_chunk_parse(role, strlen(role), &c, err), 0);
    assert_null(c.text); /* an empty first chunk is not a token */

    const char *usage = "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34}}";
    assert_int_equal(serve_chunk_parse(usage, strlen(usage), &c, err), 0);
    assert_null(c.text);
    assert_int_equal(c.prompt_tokens, 12);
    assert_int_equal(c.completion_tokens, 34);
    assert_int_equal(c.cached_tokens, -1); /* not reported */

    const char *cached = "{\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":3,"
                         "\"prompt_tokens_details\":{\"cached_tokens\":32}}}";
    assert_int_equal(serve_chunk_parse(cached, strlen(cached), &c, err), 0);
    assert_int_equal(c.prompt_tokens, 40);
    assert_int_equal(c.cached_tokens, 32);
    const char *odd = "{\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":\"x\"}}}";
    assert_int_equal(serve_chunk_parse(odd, strlen(odd), &c, err), 0);
    assert_int_equal(c.cached_tokens, -1); /* not a count: unknown, not zero */

    assert_int_equal(serve_chunk_parse(" [DONE] ", 8, &c, err), 0);
    assert_true(c.done);

    const char *e1 = "{\"error\":{\"message\":\"overloaded\"}}";
    assert_int_equal(serve_chunk_parse(e1, strlen(e1), &c, err), 0);
    assert_true(c.is_error);
    assert_string_equal(c.message, "overloaded");

    assert_int_equal(serve_chunk_parse("{\"choices\": [", 13, &c, err), ERR_FORMAT);
    assert_non_null(strstr(err, "bad JSON"));
    assert_int_equal(serve_chunk_parse("[1,2]", 5, &c, err), ERR_FORMAT);
    assert_int_equal(serve_chunk_parse("", 0, &c, err), ERR_FORMAT);
}

static void test_slo_parse(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct serve_slo s;
    assert_int_equal(serve_slo_parse("ttft=500ms,tpot=50ms,e2e=10s", &s, err), 0);
    assert_float_equal(s.ttft_ms, 500, 0);
    assert_float_equal(s.tpot_ms, 50, 0);
    assert_float_equal(s.e2e_ms, 10000, 0);
    assert_true(isnan(s.itl_ms));
    assert_int_equal(serve_slo_parse("itl=250us,e2el=2.5", &s, err), 0);
    assert_float_equal(s.itl_ms, 0.25, 1e-12);
    assert_float_equal(s.e2e_ms, 2.5, 0);
    assert_int_equal(serve_slo_parse("ttfx=5ms", &s, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "unknown metric"));
    assert_int_equal(serve_slo_parse("ttft=5min", &s, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "unknown unit"));
    assert_int_equal(serve_slo_parse("ttft", &s, err), ERR_INVALID_ARG);
    assert_int_equal(serve_slo_parse("ttft=-1", &s, err), ERR_INVALID_ARG);
    assert_int_equal(serve_slo_parse("", &s, err), ERR_INVALID_ARG);
    /* itl_p95, and the short form ITL_P95_MS[,TTFT_MS] of wafer serve's slo: section */
    assert_int_equal(serve_slo_parse("itl_p95=20ms,itl=1s", &s, err), 0);
    assert_float_equal(s.itl_p95_ms, 20, 0);
    assert_float_equal(s.itl_ms, 1000, 0);
    assert_int_equal(serve_slo_parse("50,2000", &s, err), 0);
    assert_float_equal(s.itl_p95_ms, 50, 0);
    assert_float_equal(s.ttft_ms, 2000, 0);
    assert_true(isnan(s.itl_ms) && isnan(s.e2e_ms));
    assert_int_equal(serve_slo_parse("7.5", &s, err), 0);
    assert_float_equal(s.itl_p95_ms, 7.5, 0);
    assert_true(isnan(s.ttft_ms));
    assert_int_equal(serve_slo_parse("50,", &s, err), ERR_INVALID_ARG);
    assert_int_equal(serve_slo_parse("50,x", &s, err), ERR_INVALID_ARG);
    assert_int_equal(serve_slo_parse("0", &s, err), ERR_INVALID_ARG);
}

static void test_stats_compute(void **state)
{
    (void)state;
    struct serve_request_result r[4];
    memset(r, 0, sizeof r);
    double gaps0[] = {10, 20, 30}, gaps1[] = {40};
    /* two completed: 4 tokens over 100 ms after a 40 ms TTFT; 2 tokens */
    r[0].outcome = SERVE_OK, r[0].ttft_ms = 40, r[0].e2e_ms = 100, r[0].output_tokens = 4, r[0].input_tokens = 10;
    r[0].itl_ms = gaps0, r[0].n_itl = 3, r[0].output_from_usage = true, r[0].input_from_usage = true;
    r[1].outcome = SERVE_OK, r[1].ttft_ms = 600, r[1].e2e_ms = 640, r[1].output_tokens = 2, r[1].input_tokens = 20;
    r[1].itl_ms = gaps1, r[1].n_itl = 1;
    r[2].outcome = SERVE_FAIL_HTTP, r[2].http_status = 503, r[2].error = "HTTP 503: busy", r[2].ttft_ms = NAN;
    r[3].outcome = SERVE_FAIL_STREAM, r[3].error = "cut", r[3].ttft_ms = 5, r[3].output_tokens = 99;
    struct serve_slo slo = {.ttft_ms = 500, .tpot_ms = NAN, .itl_ms = NAN, .e2e_ms = NAN};
    struct serve_run_summary s;
    char err[ERR_MSG_MAX];
    assert_int_equal(serve_stats_compute(r, 4, 2.0, &slo, 3.6, &s, err), 0);
    assert_int_equal(s.sent, 4);
    assert_int_equal(s.completed, 2);
    assert_int_equal(s.failed, 2);
    assert_int_equal(s.by_outcome[SERVE_FAIL_HTTP], 1);
    assert_int_equal(s.by_outcome[SERVE_FAIL_STREAM], 1);
    assert_int_equal(s.n_http_status, 1);
    assert_int_equal(s.http_status[0], 503);
    assert_string_equal(s.error_sample[SERVE_FAIL_HTTP], "HTTP 503: busy");
    assert_int_equal(s.total_output_tokens, 6); /* failed requests do not count */
    assert_int_equal(s.total_input_tokens, 30);
    assert_int_equal(s.output_from_usage, 1);
    assert_float_equal(s.request_throughput, 1.0, 1e-12);
    assert_float_equal(s.output_throughput, 3.0, 1e-12);
    assert_float_equal(s.total_token_throughput, 18.0, 1e-12);
    /* TPOT: (100 - 40) / 3 = 20 and (640 - 600) / 1 = 40 */
    assert_int_equal(s.tpot.s.n, 2);
    assert_float_equal(s.tpot.s.mean, 30, 1e-9);
    assert_int_equal(s.itl.s.n, 4);
    assert_float_equal(s.itl.s.p50, 25, 1e-9);
    assert_float_equal(s.ttft.s.p50, 320, 1e-9);
    assert_float_equal(s.e2e.s.max, 640, 0);
    assert_true(s.has_goodput);
    assert_int_equal(s.good, 1); /* the 600 ms TTFT misses ttft=500ms */
    assert_float_equal(s.request_goodput, 0.5, 1e-12);
    assert_true(s.has_cost);
    assert_float_equal(s.usd_per_request, 0.001, 1e-12);            /* $3.6/h = $0.001/s at 1 req/s */
    assert_float_equal(s.usd_per_million_output_tokens, 1000.0 / 3.0, 1e-9);
    assert_float_equal(s.output_goodput, 2.0, 1e-12); /* the good one's 4 tokens over 2 s */
    serve_run_summary_deinit(&s);

    /* itl_p95 judges each request's own gaps: r[0]'s p95 of {10, 20, 30} is 29, r[1]'s is 40 */
    struct serve_slo slo2 = {.ttft_ms = NAN, .tpot_ms = NAN, .itl_ms = NAN, .e2e_ms = NAN, .itl_p95_ms = 35};
    assert_int_equal(serve_stats_compute(r, 4, 2.0, &slo2, NAN, &s, err), 0);
    assert_int_equal(s.good, 1);
    assert_float_equal(s.output_goodput, 2.0, 1e-12);
    assert_float_equal(s.itl.s.p50, 25, 1e-9); /* the pooled gaps are intact */
    serve_run_summary_deinit(&s);
    slo2.itl_p95_ms = 28;
    assert_int_equal(serve_stats_compute(r, 4, 2.0, &slo2, NAN, &s, err), 0);
    assert_int_equal(s.good, 0);
    assert_float_equal(s.output_goodput, 0, 0);
    serve_run_summary_deinit(&s);

    /* nothing completed: every latency is missing, not zero */
    assert_int_equal(serve_stats_compute(r + 2, 2, 1.0, NULL, NAN, &s, err), 0);
    assert_int_equal(s.completed, 0);
    assert_true(isnan(s.ttft.s.p50));
    assert_false(s.has_goodput);
    assert_false(s.has_cost);
    serve_run_summary_deinit(&s);
}

static void test_synthetic_prompts(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct serve_prompt_set a, b, c;
    assert_int_equal(serve_prompts_synthetic(&a, 3, 50, 60, 16, 7, err), 0);
    assert_int_equal(serve_prompts_synthetic(&b, 3, 50, 60, 16, 7, err), 0);
    assert_int_equal(serve_prompts_synthetic(&c, 3, 50, 60, 16, 8, err), 0);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(a.items[i].text, b.items[i].text); /* same seed, same prompts */
        int words = 1;
        for (const char *p = a.items[i].text; *p; p++)
            words += *p == ' ';
        assert_int_equal(words, 50);
        assert_int_equal(a.items[i].max_tokens, 16);
        assert_int_equal(a.items[i].approx_tokens, 60);
    }
    assert_string_not_equal(a.items[0].text, a.items[1].text);
    assert_string_not_equal(a.items[0].text, c.items[0].text);
    struct serve_prompt_set t;
    assert_int_equal(serve_prompts_take(&t, &a, 0, 5, err), 0);
    assert_int_equal(t.n, 5);
    assert_string_equal(t.items[4].text, a.items[1].text); /* cycles */
    serve_prompts_free(&t);
    serve_prompts_free(&a);
    serve_prompts_free(&b);
    serve_prompts_free(&c);
    assert_int_equal(serve_prompts_synthetic(&a, 1, 0, 0, 1, 0, err), ERR_INVALID_ARG);
}

static const char *write_tmp(const char *name, const char *text)
{
    const char *path = test_tmp_path(name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_jsonl_loading(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct serve_prompt_set s;
    const char *ok = write_tmp("ok.jsonl", "{\"prompt\": \"a b\", \"max_tokens\": 5}\n\n  \n{\"prompt\": \"c\"}\n");
    assert_int_equal(serve_prompts_load_dataset(&s, ok, 33, err), 0);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.items[0].max_tokens, 5);
    assert_int_equal(s.items[1].max_tokens, 33);
    assert_int_equal(s.items[1].approx_tokens, -1);
    serve_prompts_free(&s);

    const char *bad = write_tmp("bad.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": 3}\n");
    assert_int_equal(serve_prompts_load_dataset(&s, bad, 1, err), ERR_FORMAT);
    assert_non_null(strstr(err, "bad.jsonl:2:"));
    assert_non_null(strstr(err, "\"prompt\""));
    const char *notjson = write_tmp("nj.jsonl", "{\"prompt\": \"a\"}\n\n{oops\n");
    assert_int_equal(serve_prompts_load_dataset(&s, notjson, 1, err), ERR_FORMAT);
    assert_non_null(strstr(err, "nj.jsonl:3:"));
    const char *mt = write_tmp("mt.jsonl", "{\"prompt\": \"a\", \"max_tokens\": 0}\n");
    assert_int_equal(serve_prompts_load_dataset(&s, mt, 1, err), ERR_FORMAT);
    assert_non_null(strstr(err, "max_tokens"));
    const char *empty = write_tmp("empty.jsonl", "\n\n");
    assert_int_equal(serve_prompts_load_dataset(&s, empty, 1, err), ERR_FORMAT);
    assert_non_null(strstr(err, "no prompts"));
    assert_int_equal(serve_prompts_load_dataset(&s, test_tmp_path("missing.jsonl"), 1, err), ERR_IO);

    const char *q = write_tmp("q.jsonl", "{\"prompt\": \"capital?\", \"expected_keywords\": [\"Paris\", \"France\"]}\n");
    assert_int_equal(serve_prompts_load_quality(&s, q, 8, err), 0);
    assert_int_equal(s.items[0].n_keywords, 2);
    bool found[2];
    assert_float_equal(serve_quality_score("the capital is PARIS.", &s.items[0], found), 0.5, 1e-12);
    assert_true(found[0]);
    assert_false(found[1]);
    assert_float_equal(serve_quality_score("paris, france", &s.items[0], found), 1.0, 1e-12);
    assert_float_equal(serve_quality_score(NULL, &s.items[0], found), 0.0, 0);
    serve_prompts_free(&s);
    const char *qbad = write_tmp("qbad.jsonl", "{\"prompt\": \"x\", \"expected_keywords\": []}\n");
    assert_int_equal(serve_prompts_load_quality(&s, qbad, 8, err), ERR_FORMAT);
    assert_non_null(strstr(err, "expected_keywords"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_every_split), cmocka_unit_test(test_sse_finish_and_stop),
        cmocka_unit_test(test_chunk_parse),     cmocka_unit_test(test_slo_parse),
        cmocka_unit_test(test_stats_compute),   cmocka_unit_test(test_synthetic_prompts),
        cmocka_unit_test(test_jsonl_loading),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
