/*
 * threadpool tests: every thread runs every job, barriers order the phases of a job (each phase reads what
 * every thread wrote in the previous one), and both hold when a thread is late by more than the spin budget
 * (so the futex sleep path is taken), over many jobs and barriers; split covers [0, n) exactly.
 */
#include "testutil.h"

#include "engine/cpu/threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TP_SLOTS 8
#define TP_PHASES 50

struct tp_test_job {
    struct threadpool *tp;
    int vals[TP_SLOTS];
    atomic_int errors;
    atomic_int runs;
    int sleep_every; /* thread 1 sleeps 1 ms before every sleep_every-th barrier (0: never) */
};

static void tp_test_sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void tp_test_fn(void *ctx, int ith, int nth)
{
    struct tp_test_job *j = ctx;
    atomic_fetch_add(&j->runs, 1);
    for (int ph = 0; ph < TP_PHASES; ph++) {
        j->vals[ith] = ph * 100 + ith;
        if (j->sleep_every && ith == 1 && ph % j->sleep_every == 0)
            tp_test_sleep_ms(1);
        threadpool_barrier(j->tp);
        for (int t = 0; t < nth; t++)
            if (j->vals[t] != ph * 100 + t)
                atomic_fetch_add(&j->errors, 1);
        threadpool_barrier(j->tp);
    }
}

static void tp_test_run(int n_threads, int jobs, int sleep_every)
{
    struct tp_test_job j = {0};
    j.tp = threadpool_create(n_threads);
    assert_non_null(j.tp);
    assert_int_equal(threadpool_size(j.tp), n_threads);
    j.sleep_every = sleep_every;
    for (int i = 0; i < jobs; i++) {
        threadpool_run(j.tp, tp_test_fn, &j);
        if (i % 7 == 3)
            tp_test_sleep_ms(1); /* workers fall asleep between some jobs */
    }
    assert_int_equal(atomic_load(&j.errors), 0);
    assert_int_equal(atomic_load(&j.runs), jobs * n_threads);
    threadpool_destroy(j.tp);
}

static void test_barrier_spinning(void **state)
{
    (void)state;
    tp_test_run(2, 200, 0);
    tp_test_run(4, 50, 0);
    tp_test_run(1, 10, 0);
}

static void test_barrier_sleeping(void **state)
{
    (void)state;
    tp_test_run(2, 10, 5);
    tp_test_run(3, 5, 7);
}

static void test_split(void **state)
{
    (void)state;
    for (int64_t n = 0; n < 40; n++)
        for (int nth = 1; nth <= 7; nth++) {
            int64_t next = 0;
            for (int ith = 0; ith < nth; ith++) {
                int64_t r0, r1;
                threadpool_split(n, ith, nth, &r0, &r1);
                assert_int_equal(r0, next);
                assert_true(r1 - r0 == n / nth || r1 - r0 == n / nth + 1);
                next = r1;
            }
            assert_int_equal(next, n);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_barrier_spinning),
        cmocka_unit_test(test_barrier_sleeping),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
