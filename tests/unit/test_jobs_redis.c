/* Tests of the Redis job store under failure, against a real redis-server (appendonly yes) on a free loopback
 * port: workers killed with SIGKILL at random moments and replaced, a worker that stops renewing its leases
 * (SIGSTOP) while another takes its lines over and then comes back, and redis-server itself killed and restarted
 * mid-batch. Each ends with every custom_id exactly once in the output. Skipped, saying so, only when
 * redis-server is not installed. */
#include "testutil.h"
#include "testjobs.h"
#include "testredis.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct test_redis redis;

static int64_t t_done_lines(struct jobs_store *s, const char *id)
{
    json_t *b = tj_batch_get(s, id);
    json_t *c = json_object_get(b, "request_counts");
    int64_t n = json_integer_value(json_object_get(c, "completed")) + json_integer_value(json_object_get(c, "failed"));
    json_decref(b);
    return n;
}

/* Waits for a child that exits by itself; kills it and fails after timeout_ms. */
static void t_wait_child(pid_t pid, int timeout_ms)
{
    for (int waited = 0;; waited += 20) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                fail_msg("worker %d ended with status %#x", (int)pid, st);
            return;
        }
        if (waited >= timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("worker %d did not finish within %d ms", (int)pid, timeout_ms);
        }
        usleep(20000);
    }
}

/* completed failed preempted reclaimed, as tj_child_run wrote them */
static void t_read_stats(const char *path, unsigned long long v[4])
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3]), 4);
    fclose(f);
}

/* Workers killed at random moments, each replaced by a new one (a new consumer name): the lines a dead one held
 * go to the next after the lease. */
static void test_redis_crash(void **state)
{
    TEST_REDIS_OR_SKIP(&redis);
    const int n = 4000, kills = 6, lease = 300; /* more lines than 6 short-lived workers can finish (4 x 250 lines/s) */
    struct jobs_store *s = tj_open(NULL, redis.url, "observer", lease);
    char id[JOBS_ID_MAX];
    tj_batch(s, n, "24h", id);
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    int64_t before = 0;
    int progressed = 0;
    for (int k = 0; k < kills; k++) {
        char consumer[32];
        snprintf(consumer, sizeof consumer, "worker%d", k);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            tj_child_run(NULL, redis.url, consumer, lease, 4000, false, NULL);
        /* 200-450 ms: long enough for a slow machine to connect, claim and commit (about 40 ms here), short
         * enough that six lives at the fake's 1,000 lines/s (4 slots x 4 ms) cannot finish the 4,000 lines */
        usleep((useconds_t)(200000 + test_rand_u64(&seed) % 250000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        assert_true(WIFSIGNALED(st));
        int64_t done = t_done_lines(s, id);
        assert_true(done >= before);
        progressed += done > before;
        before = done;
    }
    print_message("      %d kills; %lld of %d lines were done before the last worker\n", kills, (long long)before, n);
    assert_true(before < n);
    assert_true(progressed >= 2);
    const char *stats = test_tmp_path("crash-stats");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        tj_child_run(NULL, redis.url, "last", lease, 200, true, stats);
    t_wait_child(pid, 25000);
    unsigned long long v[4];
    t_read_stats(stats, v);
    assert_true(v[3] > 0); /* it took over lines a killed worker held */
    assert_string_equal(tj_status(s, id), "completed");
    tj_check_exactly_once(s, id, n, NULL, NULL);
    jobs_store_close(s);
}

/* Two workers; one stops (SIGSTOP: it renews nothing) with lines in flight, the other takes them over after the
 * lease; the stopped one comes back, finishes the lines it had and commits them: dropped, the output has each
 * line once. */
static void test_redis_reclaim(void **state)
{
    TEST_REDIS_OR_SKIP(&redis);
    const int n = 1200, lease = 500;
    struct jobs_store *s = tj_open(NULL, redis.url, "observer", lease);
    char id[JOBS_ID_MAX];
    tj_batch(s, n, "24h", id);
    const char *stats_a = test_tmp_path("stats-a"), *stats_b = test_tmp_path("stats-b");
    pid_t a = fork();
    assert_true(a >= 0);
    if (a == 0)
        tj_child_run(NULL, redis.url, "A", lease, 8000, true, stats_a);
    pid_t b = fork();
    assert_true(b >= 0);
    if (b == 0)
        tj_child_run(NULL, redis.url, "B", lease, 8000, true, stats_b);
    while (t_done_lines(s, id) < 100)
        usleep(10000);
    kill(a, SIGSTOP);
    int64_t at_stop = t_done_lines(s, id);
    usleep(3 * lease * 1000);
    kill(a, SIGCONT);
    t_wait_child(b, 25000);
    t_wait_child(a, 25000);
    unsigned long long va[4], vb[4];
    t_read_stats(stats_a, va);
    t_read_stats(stats_b, vb);
    print_message("      A stopped at %lld of %d lines done; A ran %llu, B ran %llu and took over %llu\n",
                  (long long)at_stop, n, va[0] + va[1], vb[0] + vb[1], vb[3]);
    assert_true(at_stop < n);
    assert_true(vb[3] > 0);                   /* B reclaimed A's lines */
    assert_true(va[0] + va[1] + vb[0] + vb[1] >= (unsigned long long)n); /* some were computed twice */
    assert_string_equal(tj_status(s, id), "completed");
    tj_check_exactly_once(s, id, n, NULL, NULL);
    jobs_store_close(s);
}

/* redis-server killed mid-batch and started again on the same port and dir: the worker pauses, keeps its
 * results, and finishes once Redis is back. */
static void test_redis_server_restart(void **state)
{
    TEST_REDIS_OR_SKIP(&redis);
    const int n = 800;
    struct jobs_store *s = tj_open(NULL, redis.url, "survivor", 1000);
    char id[JOBS_ID_MAX];
    tj_batch(s, n, "24h", id);
    struct tj_fake *f = tj_fake_start(4, 2000);
    struct runner *r = tj_runner(s, f, 8);
    while (t_done_lines(s, id) < 100)
        usleep(5000);
    test_redis_stop(&redis, SIGKILL);
    usleep(1500000); /* longer than the lease: our own lines look abandoned when it returns */
    struct jobs_err err;
    json_t *b = NULL;
    assert_int_equal(jobs_batch_get(s, id, &b, &err), ERR_UNAVAILABLE);
    assert_non_null(strstr(err.message, "unreachable"));
    assert_int_equal(err_http_status(ERR_UNAVAILABLE), 503);
    assert_int_equal(test_redis_restart(&redis), 0);
    int64_t after = t_done_lines(s, id);
    print_message("      %lld of %d lines done when Redis came back\n", (long long)after, n);
    assert_true(after < n);
    assert_string_equal(tj_wait_final(s, id, 25000, false), "completed");
    runner_destroy(r);
    tj_fake_stop(f);
    tj_check_exactly_once(s, id, n, NULL, NULL);
    jobs_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis_crash),
        cmocka_unit_test(test_redis_reclaim),
        cmocka_unit_test(test_redis_server_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
