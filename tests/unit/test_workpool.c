/*
 * workpool and budget tests: jobs run on the workers (not on the submitting thread), their done callbacks run
 * on the thread that calls workpool_complete, each job exactly once, with the worker's writes visible there;
 * notify comes after each job; destroy runs what is still queued and completes it; a done callback may free
 * its job. The budget never passes its limit, even with threads racing to take it, and comes back to zero.
 */
#include "testutil.h"

#include "core/budget.h"
#include "core/err.h"
#include "core/workpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WP_JOBS 200

struct wp_job {
    struct workpool_job job; /* first: the callbacks cast back */
    int index;
    pthread_t ran_on;
    long long result; /* written by the worker, read by done */
    bool done;
};

static pthread_t wp_main;
static atomic_int wp_notified, wp_done_count, wp_freed;

static void wp_notify(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&wp_notified, 1);
}

static void wp_run(struct workpool_job *j)
{
    struct wp_job *w = (struct wp_job *)j;
    w->ran_on = pthread_self();
    long long sum = 0;
    for (int i = 0; i <= w->index * 1000; i++)
        sum += i;
    w->result = sum;
    if (w->index % 50 == 0) {
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void wp_done(struct workpool_job *j)
{
    struct wp_job *w = (struct wp_job *)j;
    long long n = (long long)w->index * 1000;
    assert_true(pthread_equal(pthread_self(), wp_main));  /* done runs where complete is called */
    assert_false(pthread_equal(w->ran_on, wp_main));      /* run ran on a worker */
    assert_true(w->result == n * (n + 1) / 2);            /* the worker's result is visible */
    assert_false(w->done);                                 /* once */
    w->done = true;
    atomic_fetch_add(&wp_done_count, 1);
}

static void test_jobs_run_and_complete(void **state)
{
    (void)state;
    wp_main = pthread_self();
    atomic_store(&wp_notified, 0);
    atomic_store(&wp_done_count, 0);
    char err[ERR_MSG_MAX];
    struct workpool *p = workpool_create(3, wp_notify, NULL, err);
    assert_non_null(p);
    struct wp_job *jobs = calloc(WP_JOBS, sizeof *jobs);
    for (int i = 0; i < WP_JOBS; i++) {
        jobs[i].index = i;
        jobs[i].job.run = wp_run;
        jobs[i].job.done = wp_done;
        workpool_submit(p, &jobs[i].job);
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int completed = 0;
    while (completed < WP_JOBS) {
        completed += workpool_complete(p);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 20)
            fail_msg("only %d of %d jobs completed in 20 s", completed, WP_JOBS);
    }
    assert_int_equal(atomic_load(&wp_done_count), WP_JOBS);
    /* a worker notifies after putting its job on the done list: the last notify may come just after the
     * main thread completed that job */
    for (int k = 0; k < 5000 && atomic_load(&wp_notified) < WP_JOBS; k++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&wp_notified), WP_JOBS);
    assert_int_equal(workpool_pending(p), 0);
    assert_int_equal(workpool_complete(p), 0);
    for (int i = 0; i < WP_JOBS; i++)
        assert_true(jobs[i].done);
    workpool_destroy(p);
    free(jobs);
}

static void wp_done_free(struct workpool_job *j)
{
    atomic_fetch_add(&wp_freed, 1);
    free(j); /* the job is unlinked before its done callback runs */
}

static void wp_run_slow(struct workpool_job *j)
{
    (void)j;
    struct timespec ts = {0, 5 * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_destroy_runs_what_is_queued(void **state)
{
    (void)state;
    atomic_store(&wp_freed, 0);
    char err[ERR_MSG_MAX];
    struct workpool *p = workpool_create(1, NULL, NULL, err);
    assert_non_null(p);
    for (int i = 0; i < 20; i++) {
        struct workpool_job *j = calloc(1, sizeof *j);
        j->run = wp_run_slow;
        j->done = wp_done_free;
        workpool_submit(p, j);
    }
    assert_true(workpool_pending(p) > 0);
    workpool_destroy(p); /* runs all 20, then their done callbacks here */
    assert_int_equal(atomic_load(&wp_freed), 20);
}

static void test_create_errors(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    assert_null(workpool_create(0, NULL, NULL, err));
    assert_non_null(strstr(err, "threads"));
    assert_null(workpool_create(65, NULL, NULL, err));
    workpool_destroy(NULL);
}

static void test_budget_limit(void **state)
{
    (void)state;
    struct budget b;
    budget_init(&b, 1000);
    assert_true(budget_take(&b, 600));
    assert_false(budget_take(&b, 401)); /* would pass the limit: nothing changes */
    assert_int_equal(budget_used(&b), 600);
    assert_true(budget_take(&b, 400));  /* exactly the limit */
    assert_false(budget_take(&b, 1));
    assert_true(budget_take(&b, 0));
    budget_give(&b, 1000);
    assert_int_equal(budget_used(&b), 0);
    assert_false(budget_take(&b, 1001)); /* larger than the whole budget */
    struct budget none;
    budget_init(&none, 0); /* no limit: counted anyway */
    assert_true(budget_take(&none, (int64_t)1 << 40));
    assert_int_equal(budget_used(&none), (int64_t)1 << 40);
}

#define BUDGET_THREADS 4
#define BUDGET_ROUNDS 20000

struct budget_race {
    struct budget *b;
    atomic_int *over;
};

static void *budget_racer(void *arg)
{
    struct budget_race *r = arg;
    for (int i = 0; i < BUDGET_ROUNDS; i++) {
        int64_t n = 1 + (i * 7919) % 300;
        if (budget_take(r->b, n)) {
            if (budget_used(r->b) > r->b->limit)
                atomic_fetch_add(r->over, 1);
            budget_give(r->b, n);
        }
    }
    return NULL;
}

static void test_budget_threads(void **state)
{
    (void)state;
    struct budget b;
    budget_init(&b, 500);
    atomic_int over = 0;
    struct budget_race r = {&b, &over};
    pthread_t th[BUDGET_THREADS];
    for (int i = 0; i < BUDGET_THREADS; i++)
        pthread_create(&th[i], NULL, budget_racer, &r);
    for (int i = 0; i < BUDGET_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&over), 0);
    assert_int_equal(budget_used(&b), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_run_and_complete),
        cmocka_unit_test(test_destroy_runs_what_is_queued),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_budget_limit),
        cmocka_unit_test(test_budget_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
