/*
 * membw tests: the AVX2 read loop returns the scalar loop's checksum (so both read every byte), and the probe
 * gives a sane figure for a small buffer (once, or again and again on a kept buffer) and refuses bad arguments;
 * the cores' round trip is a sane time with two CPUs and a clear refusal with one.
 */
#include "testutil.h"

#include "bench/membw.h"
#include "core/err.h"
#include "engine/cpu/kernels.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

static void test_read_avx2_matches_scalar(void **state)
{
    (void)state;
    size_t n = 1 << 16;
    uint64_t *buf = aligned_alloc(64, n);
    assert_non_null(buf);
    uint64_t rng = 7;
    for (size_t i = 0; i < n / 8; i++)
        buf[i] = test_rand_u64(&rng);
    uint64_t ref = membw_read_scalar(buf, n);
    assert_int_not_equal(ref, 0);
    /* flipping one bit anywhere changes the checksum: every word is read */
    buf[n / 8 - 1] ^= 1u << 5;
    assert_int_not_equal(membw_read_scalar(buf, n), ref);
    buf[n / 8 - 1] ^= 1u << 5;
    if (!kernel_cpu_has_avx2()) {
        free(buf);
        skip();
    }
    for (size_t len = 128; len <= n; len *= 2)
        assert_int_equal(membw_read_avx2(buf, len), membw_read_scalar(buf, len));
    assert_int_equal(membw_read(buf, n), ref);
    /* side-by-side runs read every byte once too, whatever the remainder after whole KiB runs */
    for (int streams = 1; streams <= 5; streams++)
        for (size_t len = 128; len <= n; len = len * 3 + 128)
            assert_int_equal(membw_read_streams(buf, len / 128 * 128, streams), membw_read_scalar(buf, len / 128 * 128));
    free(buf);
}

static void test_measure_small(void **state)
{
    (void)state;
    struct membw_result r;
    char err[ERR_MSG_MAX];
    assert_int_equal(membw_measure(4 << 20, 3, 2, &r, err), 0);
    assert_int_equal(r.passes, 3);
    assert_int_equal(r.threads, 2);
    assert_int_equal(r.bytes, 4 << 20);
    assert_true(r.worst_gbs > 0 && r.worst_gbs <= r.median_gbs && r.median_gbs <= r.best_gbs);
    assert_int_equal(membw_measure(4096, 1001, 1, &r, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "1001 passes"));
}

/* A kept probe measures again on the same buffer, as often as asked, and frees everything (ASan: no leak). */
static void test_probe_again(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct membw_probe *p = membw_probe_create(4 << 20, 2, err);
    assert_non_null(p);
    for (int passes = 1; passes <= 3; passes += 2) {
        struct membw_result r = {0};
        assert_int_equal(membw_probe_run(p, passes, &r, err), 0);
        assert_int_equal(r.passes, passes);
        assert_int_equal(r.threads, 2);
        assert_int_equal(r.bytes, 4 << 20);
        assert_true(r.worst_gbs > 0 && r.worst_gbs <= r.median_gbs && r.median_gbs <= r.best_gbs);
    }
    struct membw_result r;
    assert_int_equal(membw_probe_run(p, 1001, &r, err), ERR_INVALID_ARG);
    membw_probe_destroy(p);
    membw_probe_destroy(NULL);
}

static void test_round_trip(void **state)
{
    (void)state;
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    char err[ERR_MSG_MAX];
    double ns = 0;
    if (CPU_COUNT(&all) >= 2) {
        assert_int_equal(membw_round_trip_ns(2000, &ns, err), 0);
        assert_true(ns > 1 && ns < 1e6); /* a line between two cores: tens of ns to a few us on a busy host */
    }
    /* this thread on one CPU: nothing to measure between, a message that says why */
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    ns = -1;
    int rc = membw_round_trip_ns(2000, &ns, err);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_int_equal(rc, ERR_INVALID_ARG);
    assert_true(ns == -1);
    assert_non_null(strstr(err, "two CPUs"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_avx2_matches_scalar),
        cmocka_unit_test(test_measure_small),
        cmocka_unit_test(test_probe_again),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
