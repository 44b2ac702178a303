/* Tests for the batch runner (src/jobs/runner.h) on the SQLite store: lines executed by a pool of threads with
 * a bounded number in flight, preemption, an exec that answers from inside itself, SIGKILL at random moments
 * with a restart each time (every custom_id exactly once at the end), and a data dir that runs out of space
 * (a tmpfs of a few MB mounted in a private mount namespace). Children report through their exit status only:
 * cmocka's asserts must not run in a forked child. */
#include "testutil.h"
#include "testjobs.h"

#include "jobs/runner.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void test_runner_threads(void **state)
{
    struct jobs_store *s = tj_open(test_tmp_path("runner"), NULL, NULL, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 300, "24h", id);
    struct tj_fake *f = tj_fake_start(3, 500);
    f->preempt_every = 10;
    f->fail_every = 7;
    struct runner *r = tj_runner(s, f, 8);
    runner_wake(r);
    assert_string_equal(tj_wait_final(s, id, 20000, false), "completed");
    struct runner_stats st;
    runner_stats_get(r, &st);
    runner_destroy(r);
    int max_running = atomic_load(&f->max_running);
    tj_fake_stop(f);
    int n_out, n_err;
    tj_check_exactly_once(s, id, 300, &n_out, &n_err);
    assert_int_equal(n_err, 43); /* idx % 7 == 1 for idx < 300 */
    assert_int_equal(st.completed, 257);
    assert_int_equal(st.failed, 43);
    assert_int_equal(st.preempted, 30); /* idx % 10 == 3, once each */
    assert_int_equal(st.reclaimed, 0);
    assert_int_equal(st.inflight, 0);
    assert_true(max_running <= 8);
    assert_true(max_running >= 2); /* it did run lines side by side */
    struct jobs_stats js;
    struct jobs_err err;
    assert_int_equal(jobs_store_stats(s, &js, &err), 0);
    assert_int_equal(js.batches[JOBS_COMPLETED], 1);
    assert_int_equal(js.queue_lines, 0);
    jobs_store_close(s);
}

/* exec answers before it returns; two batches run oldest first. */
static void test_runner_inline(void **state)
{
    struct jobs_store *s = tj_open(test_tmp_path("inline"), NULL, NULL, 0);
    char a[JOBS_ID_MAX], b[JOBS_ID_MAX];
    tj_batch(s, 50, "24h", a);
    tj_batch(s, 20, "24h", b);
    struct tj_fake *f = tj_fake_start(0, 0);
    struct runner *r = tj_runner(s, f, 4);
    assert_string_equal(tj_wait_final(s, b, 10000, false), "completed");
    assert_string_equal(tj_wait_final(s, a, 10000, false), "completed");
    json_t *ja = tj_batch_get(s, a), *jb = tj_batch_get(s, b);
    assert_true(json_integer_value(json_object_get(ja, "completed_at")) <=
                json_integer_value(json_object_get(jb, "completed_at")));
    json_decref(ja);
    json_decref(jb);
    runner_destroy(r);
    tj_fake_stop(f);
    tj_check_exactly_once(s, a, 50, NULL, NULL);
    tj_check_exactly_once(s, b, 20, NULL, NULL);
    jobs_store_close(s);
}

/* ---- kill -9 at random moments ---- */

static int64_t t_done_lines(struct jobs_store *s, const char *id)
{
    json_t *b = tj_batch_get(s, id);
    json_t *c = json_object_get(b, "request_counts");
    int64_t n = json_integer_value(json_object_get(c, "completed")) + json_integer_value(json_object_get(c, "failed"));
    json_decref(b);
    return n;
}

static void crash_test(const char *dir, int n_lines, int kills)
{
    struct jobs_store *s = tj_open(dir, NULL, NULL, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, n_lines, "24h", id);
    jobs_store_close(s); /* the data dir takes one process at a time */
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    int64_t before = 0, progressed = 0;
    for (int k = 0; k < kills; k++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            tj_child_run(dir, NULL, NULL, 0, 4000, false, NULL);
        /* 50-250 ms: a child needs tens of ms (more under ASan) to open the store and commit its first line;
         * at 4 fake threads of 4 ms per line even six 250 ms lives do not finish the 2000 lines */
        usleep((useconds_t)(50000 + test_rand_u64(&seed) % 200000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        assert_true(WIFSIGNALED(st)); /* it was still running, not failed */
        s = tj_open(dir, NULL, NULL, 0);
        int64_t done = t_done_lines(s, id);
        assert_true(done >= before); /* committed results never go away */
        progressed += done > before;
        before = done;
        jobs_store_close(s);
    }
    print_message("      %d kills; %lld of %d lines were done before the last restart\n", kills, (long long)before,
                  n_lines);
    assert_true(before < n_lines); /* the kills did land mid-batch */
    assert_true(progressed >= 2);  /* and several runs made progress */
    /* the last run, to the end */
    s = tj_open(dir, NULL, NULL, 0);
    struct tj_fake *f = tj_fake_start(4, 200);
    struct runner *r = tj_runner(s, f, 8);
    assert_string_equal(tj_wait_final(s, id, 20000, false), "completed");
    struct runner_stats st;
    runner_stats_get(r, &st);
    runner_destroy(r);
    tj_fake_stop(f);
    tj_check_exactly_once(s, id, n_lines, NULL, NULL);
    jobs_store_close(s);
}

static void test_crash_sqlite(void **state) { crash_test(test_tmp_path("crash"), 2000, 6); }

/* ---- disk full ---- */

/* Helpers for children: no cmocka asserts (a failure would longjmp into the test runner inside the child). */
static json_t *child_batch_get(struct jobs_store *s, const char *id)
{
    json_t *b = NULL;
    struct jobs_err err;
    if (jobs_batch_get(s, id, &b, &err)) {
        fprintf(stderr, "child: jobs_batch_get %s: %s\n", id, err.message);
        _exit(3);
    }
    return b;
}

static bool child_status_is(struct jobs_store *s, const char *id, const char *status)
{
    json_t *b = child_batch_get(s, id);
    bool is = !strcmp(json_string_value(json_object_get(b, "status")), status);
    json_decref(b);
    return is;
}

static void child_batch(struct jobs_store *s, int n, char *id)
{
    char *in = tj_jsonl(n, "/v1/completions");
    json_t *f = NULL, *b = NULL;
    struct jobs_err err;
    CHILD_CHECK(jobs_file_create(s, "in.jsonl", "batch", in, strlen(in), &f, &err) == 0);
    json_t *req = json_pack("{sOssss}", "input_file_id", json_object_get(f, "id"), "endpoint", "/v1/completions",
                            "completion_window", "24h");
    CHILD_CHECK(jobs_batch_create(s, req, &b, &err) == 0);
    snprintf(id, JOBS_ID_MAX, "%s", json_string_value(json_object_get(b, "id")));
    json_decref(req);
    json_decref(b);
    json_decref(f);
    free(in);
}

static bool child_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* A private mount namespace (as root; else through a user namespace where we are root) with a tmpfs on mnt. */
static int child_mount_tmpfs(const char *mnt, const char *size)
{
    if (unshare(CLONE_NEWNS)) {
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS))
            return -1;
        char map[64];
        child_write("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "0 %d 1", (int)uid);
        if (!child_write("/proc/self/uid_map", map))
            return -1;
        snprintf(map, sizeof map, "0 %d 1", (int)gid);
        if (!child_write("/proc/self/gid_map", map))
            return -1;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
        return -1;
    char opts[64];
    snprintf(opts, sizeof opts, "size=%s,mode=0700", size);
    return mount("tmpfs", mnt, "tmpfs", 0, opts);
}

/* A 3 MB tmpfs as the data dir; a batch whose results do not fit. Exit 0: it failed cleanly and nothing else was
 * harmed; 77: no tmpfs could be mounted. */
static void disk_full_child(const char *mnt)
{
    test_child_init();
    if (child_mount_tmpfs(mnt, "3m")) {
        fprintf(stderr, "child: cannot mount a tmpfs on %s: %s\n", mnt, strerror(errno));
        _exit(77);
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/data", mnt);
    struct jobs_config cfg = {.data_dir = dir};
    struct jobs_err err;
    struct jobs_store *s = jobs_store_open(&cfg, &err);
    CHILD_CHECK(s);
    /* a small batch that finishes first: its output must survive */
    char small[JOBS_ID_MAX];
    child_batch(s, 5, small);
    struct tj_fake *f = tj_fake_start(2, 0);
    struct runner_config rc = {
        .max_inflight = 4, .exec = tj_fake_exec, .ctx = f, .poll_ms = 10, .tick_ms = 20, .handle = &f->r};
    char e[ERR_MSG_MAX];
    CHILD_CHECK(runner_create(s, &rc, e));
    int waited = 0;
    while (waited < 5000 && !child_status_is(s, small, "completed"))
        usleep(10000), waited += 10;
    CHILD_CHECK(child_status_is(s, small, "completed"));
    json_t *b = child_batch_get(s, small);
    char small_out[JOBS_ID_MAX];
    snprintf(small_out, sizeof small_out, "%s", json_string_value(json_object_get(b, "output_file_id")));
    json_decref(b);
    char *small_data = NULL;
    size_t small_len = 0;
    CHILD_CHECK(jobs_file_content(s, small_out, &small_data, &small_len, &err) == 0);

    /* the big one: 200 lines of 40 KB results into 3 MB */
    f->pad = 40000;
    char big[JOBS_ID_MAX];
    child_batch(s, 200, big);
    runner_wake(f->r);
    waited = 0;
    while (waited < 15000 && !child_status_is(s, big, "failed") && !child_status_is(s, big, "completed"))
        usleep(10000), waited += 10;
    runner_destroy(f->r);
    tj_fake_stop(f);
    b = child_batch_get(s, big);
    const char *status = json_string_value(json_object_get(b, "status"));
    fprintf(stderr, "child: the big batch is %s after %d ms\n", status, waited);
    CHILD_CHECK(!strcmp(status, "failed"));
    CHILD_CHECK(json_is_integer(json_object_get(b, "failed_at")));
    json_t *e0 = json_array_get(json_object_get(json_object_get(b, "errors"), "data"), 0);
    CHILD_CHECK(e0 && !strcmp(json_string_value(json_object_get(e0, "code")), "disk_full"));
    const char *msg = json_string_value(json_object_get(e0, "message"));
    fprintf(stderr, "child: errors.data[0].message: %s\n", msg);
    CHILD_CHECK(strstr(msg, "full") || strstr(msg, "space"));
    json_decref(b);
    jobs_store_close(s);

    /* nothing corrupted: the database checks out, and with the disk still full the store opens, the failed
     * batch reads as failed and the earlier output reads back the same */
    char db[4300];
    snprintf(db, sizeof db, "%s/jobs.db", dir);
    sqlite3 *q;
    CHILD_CHECK(sqlite3_open(db, &q) == SQLITE_OK);
    sqlite3_stmt *st;
    CHILD_CHECK(sqlite3_prepare_v2(q, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK);
    CHILD_CHECK(sqlite3_step(st) == SQLITE_ROW);
    CHILD_CHECK(!strcmp((const char *)sqlite3_column_text(st, 0), "ok"));
    sqlite3_finalize(st);
    sqlite3_close(q);
    s = jobs_store_open(&cfg, &err);
    if (!s)
        fprintf(stderr, "child: reopen: %s\n", err.message);
    CHILD_CHECK(s);
    CHILD_CHECK(child_status_is(s, big, "failed"));
    char *again = NULL;
    size_t again_len = 0;
    CHILD_CHECK(jobs_file_content(s, small_out, &again, &again_len, &err) == 0);
    CHILD_CHECK(again_len == small_len && !memcmp(again, small_data, small_len));
    free(again);
    free(small_data);
    /* free space (the tmpfs grows), as the error message says; then new work runs */
    jobs_store_close(s);
    CHILD_CHECK(mount(NULL, mnt, NULL, MS_REMOUNT, "size=16m") == 0);
    s = jobs_store_open(&cfg, &err);
    CHILD_CHECK(s);
    char next[JOBS_ID_MAX];
    child_batch(s, 5, next);
    f = tj_fake_start(1, 0);
    rc.ctx = f;
    rc.handle = &f->r;
    CHILD_CHECK(runner_create(s, &rc, e));
    waited = 0;
    while (waited < 5000 && !child_status_is(s, next, "completed"))
        usleep(10000), waited += 10;
    CHILD_CHECK(child_status_is(s, next, "completed"));
    runner_destroy(f->r);
    tj_fake_stop(f);
    jobs_store_close(s);
    _exit(0);
}

static void test_disk_full(void **state)
{
    const char *mnt = test_tmp_path("tmpfs");
    assert_int_equal(mkdir(mnt, 0700), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        disk_full_child(mnt);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        fail_msg("the child was killed by signal %d", WTERMSIG(st));
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) {
        print_message("[  SKIPPED ] cannot mount a tmpfs here (needs root or unprivileged user namespaces)\n");
        skip();
    }
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runner_threads),
        cmocka_unit_test(test_runner_inline),
        cmocka_unit_test(test_crash_sqlite),
        cmocka_unit_test(test_disk_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
