/* Tests for the client library's retry policy (src/client/retry.h): which answers are retried, how
 * Retry-After-Ms and Retry-After (seconds, HTTP date) are read, and the backoff with its jitter bounds,
 * value for value as openai-python computes them (_calculate_retry_timeout). The loop that applies them is
 * tested end to end against a faulty server (tests/e2e/test_client.py). */
#include "testutil.h"

#include "client/retry.h"

#include <time.h>

static void test_retry_status(void **state)
{
    (void)state;
    static const int yes[] = {408, 409, 429, 500, 502, 503, 504, 599};
    static const int no[] = {200, 400, 401, 403, 404, 405, 413, 422, 499};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        assert_true(client_retry_status(yes[i], NULL));
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_false(client_retry_status(no[i], ""));
    /* the server's x-should-retry header wins */
    assert_false(client_retry_status(503, "false"));
    assert_true(client_retry_status(400, "true"));
    assert_true(client_retry_status(429, "maybe"));
}

static void test_retry_after(void **state)
{
    (void)state;
    time_t now = 1700000000; /* Tue, 14 Nov 2023 22:13:20 GMT */
    assert_float_equal(client_retry_after("1500", "9", now), 1.5, 1e-12); /* -ms first */
    assert_float_equal(client_retry_after(NULL, "2", now), 2, 0);
    assert_float_equal(client_retry_after("", "0.25", now), 0.25, 1e-12);
    assert_float_equal(client_retry_after(NULL, "Tue, 14 Nov 2023 22:13:30 GMT", now), 10, 1e-9);
    assert_float_equal(client_retry_after(NULL, NULL, now), -1, 0);
    assert_float_equal(client_retry_after("abc", "soon", now), -1, 0);
    assert_float_equal(client_retry_after(NULL, "3s", now), -1, 0);
}

static void test_retry_delay(void **state)
{
    (void)state;
    /* no Retry-After: 0.5 * 2^n capped at 8, times (1 - 0.25 * rand) */
    static const double base[] = {0.5, 1, 2, 4, 8, 8, 8};
    for (int n = 0; n < 7; n++) {
        assert_float_equal(client_retry_delay(n, -1, 0), base[n], 1e-12);
        assert_float_equal(client_retry_delay(n, -1, 0.999999), base[n] * 0.75, 1e-5);
        assert_float_equal(client_retry_delay(n, -1, 0.5), base[n] * 0.875, 1e-12);
    }
    assert_float_equal(client_retry_delay(100000, -1, 0), 8, 0);
    /* a Retry-After in (0, 60] is used as is, without jitter; others fall back to the backoff */
    assert_float_equal(client_retry_delay(0, 1, 0.9), 1, 0);
    assert_float_equal(client_retry_delay(3, 60, 0.9), 60, 0);
    assert_float_equal(client_retry_delay(0, 0, 0), 0.5, 0);
    assert_float_equal(client_retry_delay(0, 61, 0), 0.5, 0);
    assert_float_equal(client_retry_delay(1, -5, 0), 1, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_status),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_retry_delay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
