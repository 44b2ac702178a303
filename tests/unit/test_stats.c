/* Tests for core/stats: percentiles against values numpy.percentile (default "linear") gives for the same
 * samples, computed by hand from its definition, and the summary fields. */
#include "testutil.h"

#include "core/stats.h"

#include <math.h>

static void test_percentile_linear(void **state)
{
    (void)state;
    const double v[] = {1, 2, 3, 4};
    assert_float_equal(stats_percentile_sorted(v, 4, 50), 2.5, 1e-12);
    assert_float_equal(stats_percentile_sorted(v, 4, 90), 3.7, 1e-12);   /* rank 2.7 */
    assert_float_equal(stats_percentile_sorted(v, 4, 99), 3.97, 1e-12);  /* rank 2.97 */
    assert_float_equal(stats_percentile_sorted(v, 4, 0), 1, 0);
    assert_float_equal(stats_percentile_sorted(v, 4, 100), 4, 0);
    assert_float_equal(stats_percentile_sorted(v, 4, 150), 4, 0);        /* clamped */
    const double w[] = {15, 20, 35, 40, 50};
    assert_float_equal(stats_percentile_sorted(w, 5, 40), 29, 1e-12);    /* numpy: 29.0 */
    assert_float_equal(stats_percentile_sorted(w, 5, 95), 48, 1e-12);    /* rank 3.8 */
    const double one[] = {7};
    assert_float_equal(stats_percentile_sorted(one, 1, 99), 7, 0);
    assert_true(isnan(stats_percentile_sorted(one, 0, 50)));
}

static void test_summarize(void **state)
{
    (void)state;
    /* 50, 100, ..., 500 shuffled: the e2e test's TTFT set */
    double v[] = {300, 50, 450, 100, 500, 250, 150, 400, 200, 350};
    struct stats_summary s;
    stats_summarize(v, 10, &s);
    assert_int_equal(s.n, 10);
    assert_float_equal(v[0], 50, 0); /* sorted in place */
    assert_float_equal(v[9], 500, 0);
    assert_float_equal(s.mean, 275, 1e-9);
    assert_float_equal(s.p50, 275, 1e-9);
    assert_float_equal(s.p90, 455, 1e-9);
    assert_float_equal(s.p95, 477.5, 1e-9);
    assert_float_equal(s.p99, 495.5, 1e-9);
    assert_float_equal(s.min, 50, 0);
    assert_float_equal(s.max, 500, 0);
    assert_float_equal(s.std, sqrt(20625.0), 1e-9); /* population std of an arithmetic series */
    stats_summarize(v, 0, &s);
    assert_int_equal(s.n, 0);
    assert_true(isnan(s.mean) && isnan(s.p99) && isnan(s.std));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_percentile_linear), cmocka_unit_test(test_summarize)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
