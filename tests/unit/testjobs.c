/*
 * testjobs: helpers for the job store tests (see testjobs.h).
 */
#include "testutil.h"
#include "testjobs.h"

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
