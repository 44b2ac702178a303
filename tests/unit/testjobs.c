/*
 * testjobs: helpers for the job store tests (see testjobs.h).
 */
#include "testutil.h"
#include "testjobs.h"

#include <signal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *tj_jsonl(int n, const char *url)
{
    size_t cap = (size_t)n * 128 + 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len,
                                "{\"custom_id\":\"c%d\",\"method\":\"POST\",\"url\":\"%s\",\"body\":{\"model\":\"m\","
                                "\"prompt\":\"p%d\"}}\n",
                                i, url, i);
    return buf;
}

struct jobs_store *tj_open(const char *dir, const char *url, const char *consumer, int lease_ms)
{
    struct jobs_config cfg = {.data_dir = dir, .queue = url, .consumer = consumer, .lease_ms = lease_ms};
    struct jobs_err err;
    struct jobs_store *s = jobs_store_open(&cfg, &err);
    if (!s)
        fail_msg("jobs_store_open: %s", err.message);
    return s;
}

void tj_batch(struct jobs_store *s, int n, const char *window, char *id)
{
    char *data = tj_jsonl(n, "/v1/completions");
    json_t *f = NULL, *b = NULL;
    struct jobs_err err;
    int rc = jobs_file_create(s, "in.jsonl", "batch", data, strlen(data), &f, &err);
    free(data);
    if (rc)
        fail_msg("jobs_file_create: %s", err.message);
    json_t *req = json_pack("{sOssss}", "input_file_id", json_object_get(f, "id"), "endpoint", "/v1/completions",
                            "completion_window", window);
    rc = jobs_batch_create(s, req, &b, &err);
    json_decref(req);
    json_decref(f);
    if (rc)
        fail_msg("jobs_batch_create: %s", err.message);
    snprintf(id, JOBS_ID_MAX, "%s", json_string_value(json_object_get(b, "id")));
    json_decref(b);
}

json_t *tj_batch_get(struct jobs_store *s, const char *id)
{
    json_t *b = NULL;
    struct jobs_err err;
    if (jobs_batch_get(s, id, &b, &err))
        fail_msg("jobs_batch_get %s: %s", id, err.message);
    return b;
}

const char *tj_status(struct jobs_store *s, const char *id)
{
    static char buf[32];
    json_t *b = tj_batch_get(s, id);
    snprintf(buf, sizeof buf, "%s", json_string_value(json_object_get(b, "status")));
    json_decref(b);
    return buf;
}

char *tj_fake_response(const char *body)
{
    json_t *b = json_loads(body, 0, NULL);
    assert_non_null(b);
    json_t *r = json_pack("{sO}", "echo", json_object_get(b, "prompt"));
    char *text = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    json_decref(b);
    return text;
}

static char *tj_file(struct jobs_store *s, const char *file_id, size_t *len)
{
    char *data = NULL;
    struct jobs_err err;
    if (jobs_file_content(s, file_id, &data, len, &err))
        fail_msg("jobs_file_content %s: %s", file_id, err.message);
    return data;
}

void tj_check_exactly_once(struct jobs_store *s, const char *id, int n, int *n_out, int *n_err)
{
    json_t *b = tj_batch_get(s, id);
    int *seen = calloc((size_t)n, sizeof *seen);
    int counts[2] = {0, 0};
    const char *keys[2] = {"output_file_id", "error_file_id"};
    for (int k = 0; k < 2; k++) {
        json_t *fid = json_object_get(b, keys[k]);
        if (!json_is_string(fid))
            continue;
        size_t len;
        char *data = tj_file(s, json_string_value(fid), &len);
        for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *j = json_loads(line, 0, NULL);
            if (!j)
                fail_msg("%s line is not JSON: %s", keys[k], line);
            const char *cid = json_string_value(json_object_get(j, "custom_id"));
            assert_non_null(cid);
            int i = atoi(cid + 1);
            assert_true(i >= 0 && i < n);
            seen[i]++;
            if (k == 0) {
                char want[32];
                snprintf(want, sizeof want, "p%d", i);
                json_t *resp = json_object_get(j, "response");
                assert_int_equal(json_integer_value(json_object_get(resp, "status_code")), 200);
                const char *echo = json_string_value(json_object_get(json_object_get(resp, "body"), "echo"));
                assert_non_null(echo);
                assert_string_equal(echo, want);
                assert_true(json_is_null(json_object_get(j, "error")));
            }
            counts[k]++;
            json_decref(j);
        }
        free(data);
    }
    for (int i = 0; i < n; i++)
        if (seen[i] != 1)
            fail_msg("custom_id c%d appears %d times in the output and error files of %s", i, seen[i], id);
    json_t *rc = json_object_get(b, "request_counts");
    assert_int_equal(json_integer_value(json_object_get(rc, "total")), n);
    assert_int_equal(json_integer_value(json_object_get(rc, "completed")) +
                         json_integer_value(json_object_get(rc, "failed")),
                     n);
    free(seen);
    json_decref(b);
    if (n_out)
        *n_out = counts[0];
    if (n_err)
        *n_err = counts[1];
}

const char *tj_wait_final(struct jobs_store *s, const char *id, int timeout_ms, bool tick)
{
    for (int waited = 0;; waited += 20) {
        if (tick) {
            struct jobs_err err;
            jobs_store_tick(s, NULL, &err);
        }
        const char *st = tj_status(s, id);
        if (!strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "expired") || !strcmp(st, "cancelled") ||
            waited >= timeout_ms)
            return st;
        usleep(20000);
    }
}

static void tj_fake_answer(struct tj_fake *f, const struct tj_job *j)
{
    if (f->preempt_every && j->idx % f->preempt_every == 3 && j->idx < 4096 &&
        atomic_fetch_add(&f->preempted_once[j->idx], 1) == 0) {
        struct runner_result res = {.outcome = RUNNER_PREEMPTED};
        runner_line_done(f->r, j->ticket, &res);
        return;
    }
    if (f->fail_every && j->idx % f->fail_every == 1) {
        struct runner_result res = {.outcome = RUNNER_NO_RESPONSE, .error_code = "model_not_found",
                                    .error_message = "The model 'm' does not exist."};
        runner_line_done(f->r, j->ticket, &res);
        return;
    }
    json_t *b = json_loads(j->body, 0, NULL);
    json_t *out = json_pack("{sO}", "echo", json_object_get(b, "prompt"));
    if (f->pad) {
        char *p = malloc(f->pad + 1);
        memset(p, 'x', f->pad);
        p[f->pad] = 0;
        json_object_set_new(out, "pad", json_string(p));
        free(p);
    }
    char *text = json_dumps(out, JSON_COMPACT);
    struct runner_result res = {.outcome = RUNNER_RESPONSE, .status_code = 200, .body = text};
    runner_line_done(f->r, j->ticket, &res);
    free(text);
    json_decref(out);
    json_decref(b);
}

static void *tj_fake_thread(void *arg)
{
    struct tj_fake *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->q_n && !f->stop)
            pthread_cond_wait(&f->cv, &f->mu);
        if (!f->q_n && f->stop)
            break;
        struct tj_job j = f->q[0];
        memmove(f->q, f->q + 1, (size_t)--f->q_n * sizeof *f->q);
        pthread_mutex_unlock(&f->mu);
        if (f->delay_us)
            usleep((useconds_t)(f->delay_us / 2 + rand() % (f->delay_us + 1)));
        atomic_fetch_sub(&f->running, 1);
        tj_fake_answer(f, &j);
        free(j.body);
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

void tj_fake_exec(void *ctx, const struct runner_line *line)
{
    struct tj_fake *f = ctx;
    int now = atomic_fetch_add(&f->running, 1) + 1;
    int m = atomic_load(&f->max_running);
    while (now > m && !atomic_compare_exchange_weak(&f->max_running, &m, now))
        ;
    struct tj_job j = {.ticket = line->ticket, .body = strdup(line->body), .idx = line->idx};
    if (!f->n_threads) { /* answer from inside exec */
        atomic_fetch_sub(&f->running, 1);
        tj_fake_answer(f, &j);
        free(j.body);
        return;
    }
    pthread_mutex_lock(&f->mu);
    if (f->q_n == f->q_cap) {
        f->q_cap = f->q_cap ? f->q_cap * 2 : 64;
        f->q = realloc(f->q, (size_t)f->q_cap * sizeof *f->q);
    }
    f->q[f->q_n++] = j;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

struct tj_fake *tj_fake_start(int threads, int delay_us)
{
    struct tj_fake *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->delay_us = delay_us;
    f->n_threads = threads;
    for (int i = 0; i < threads; i++)
        pthread_create(&f->threads[i], NULL, tj_fake_thread, f);
    return f;
}

void tj_fake_stop(struct tj_fake *f)
{
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < f->n_threads; i++)
        pthread_join(f->threads[i], NULL);
    free(f->q);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

struct runner *tj_runner(struct jobs_store *s, struct tj_fake *f, int max_inflight)
{
    struct runner_config cfg = {.max_inflight = max_inflight, .exec = tj_fake_exec, .ctx = f, .poll_ms = 20,
                                .tick_ms = 50, .handle = &f->r};
    char err[ERR_MSG_MAX];
    if (!runner_create(s, &cfg, err))
        fail_msg("runner_create: %s", err);
    return f->r;
}


void tj_child_run(const char *dir, const char *url, const char *consumer, int lease_ms, int delay_us, bool until_final,
                  const char *stats_path)
{
    test_child_init();
    struct jobs_config cfg = {.data_dir = dir, .queue = url, .consumer = consumer, .lease_ms = lease_ms};
    struct jobs_err err;
    struct jobs_store *s = jobs_store_open(&cfg, &err);
    if (!s) {
        fprintf(stderr, "child: %s\n", err.message);
        _exit(3);
    }
    struct tj_fake *f = tj_fake_start(4, delay_us);
    struct runner_config rc = {
        .max_inflight = 8, .exec = tj_fake_exec, .ctx = f, .poll_ms = 10, .tick_ms = 20, .handle = &f->r};
    char e[ERR_MSG_MAX];
    CHILD_CHECK(runner_create(s, &rc, e));
    for (;;) {
        usleep(20000);
        if (!until_final)
            continue;
        struct jobs_stats st;
        if (jobs_store_stats(s, &st, &err))
            continue;
        if (st.batches[JOBS_VALIDATING] + st.batches[JOBS_IN_PROGRESS] + st.batches[JOBS_FINALIZING] +
                st.batches[JOBS_CANCELLING] ==
            0)
            break;
    }
    struct runner_stats rs;
    runner_stats_get(f->r, &rs);
    runner_destroy(f->r);
    tj_fake_stop(f);
    jobs_store_close(s);
    if (stats_path) {
        FILE *out = fopen(stats_path, "w");
        CHILD_CHECK(out);
        fprintf(out, "%llu %llu %llu %llu\n", (unsigned long long)rs.completed, (unsigned long long)rs.failed,
                (unsigned long long)rs.preempted, (unsigned long long)rs.reclaimed);
        fclose(out);
    }
    _exit(0);
}
