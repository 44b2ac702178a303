/* Tests for the job store (src/jobs/jobs.h): what clients send is checked line by line (validation tables), the
 * objects have OpenAI's shape, and a batch's lines go from pending to committed to the output file, through
 * expiry, cancellation and a restart. Every store test runs twice: on SQLite in a temp data dir, and on a real
 * redis-server (skipped, saying so, only when redis-server is not installed). */
#include "testutil.h"
#include "testjobs.h"
#include "testredis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct test_redis redis;
static const char SQLITE[] = "sqlite", REDIS[] = "redis";

static struct jobs_store *t_open(void **state, int lease_ms)
{
    if (*state == REDIS) {
        TEST_REDIS_OR_SKIP(&redis);
        return tj_open(NULL, redis.url, NULL, lease_ms);
    }
    static int k;
    char name[32];
    snprintf(name, sizeof name, "store%d", k++);
    return tj_open(test_tmp_path(name), NULL, NULL, 0);
}

static int t_upload(struct jobs_store *s, const char *data, size_t len, const char *purpose, json_t **out,
                    struct jobs_err *err)
{
    return jobs_file_create(s, "x.jsonl", purpose, data, len, out, err);
}

/* ---- validation of uploads ---- */

struct upload_case {
    const char *name;
    const char *data;
    int rc;
    const char *code;    /* OpenAI code */
    const char *message; /* a substring of the message */
};

#define OK_LINE(id) "{\"custom_id\":\"" id "\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}"

static const struct upload_case upload_cases[] = {
    {"empty", "", ERR_INVALID_ARG, "empty_file", "no requests"},
    {"blank lines only", "\n  \n\t\r\n", ERR_INVALID_ARG, "empty_file", "no requests"},
    {"not json", OK_LINE("a") "\n{\"custom_id\": \n", ERR_FORMAT, "invalid_json_line", "Line 2 is not valid JSON"},
    {"blank lines counted", OK_LINE("a") "\n\n\nnope\n", ERR_FORMAT, "invalid_json_line", "Line 4 is not valid JSON"},
    {"not an object", OK_LINE("a") "\n" OK_LINE("b") "\n[1,2]\n", ERR_FORMAT, "invalid_json_line",
     "Line 3 is not a JSON object"},
    {"no custom_id", "{\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", ERR_FORMAT, "invalid_custom_id",
     "Line 1: 'custom_id'"},
    {"empty custom_id", "{\"custom_id\":\"\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", ERR_FORMAT,
     "invalid_custom_id", "Line 1: 'custom_id'"},
    {"numeric custom_id", "{\"custom_id\":7,\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}", ERR_FORMAT,
     "invalid_custom_id", "Line 1"},
    {"GET", OK_LINE("a") "\n{\"custom_id\":\"b\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{}}",
     ERR_FORMAT, "invalid_method", "Line 2: 'method' must be \"POST\""},
    {"no url", "{\"custom_id\":\"b\",\"method\":\"POST\",\"body\":{}}", ERR_FORMAT, "invalid_url", "Line 1: 'url'"},
    {"body array", "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":[]}", ERR_FORMAT,
     "invalid_body", "Line 1: 'body'"},
    {"duplicate", OK_LINE("a") "\n" OK_LINE("b") "\n" OK_LINE("c") "\n" OK_LINE("b") "\n" OK_LINE("a") "\n",
     ERR_INVALID_ARG, "duplicate_custom_id", "Line 4: custom_id 'b' is already used on line 2"},
    {"too many", OK_LINE("a") "\n" OK_LINE("b") "\n" OK_LINE("c") "\n" OK_LINE("d") "\n" OK_LINE("e") "\n\n"
     OK_LINE("f") "\n", ERR_INVALID_ARG, "too_many_lines", "more than 5 requests (line 7"},
    {"ok with CRLF and no final newline", OK_LINE("a") "\r\n" OK_LINE("b"), 0, NULL, NULL},
};

static void test_upload_validation(void **state)
{
    struct jobs_config cfg = {.data_dir = test_tmp_path("validation"), .max_lines = 5, .max_file_bytes = 1000};
    struct jobs_err err;
    struct jobs_store *s = jobs_store_open(&cfg, &err);
    assert_non_null(s);
    for (size_t i = 0; i < sizeof upload_cases / sizeof upload_cases[0]; i++) {
        const struct upload_case *c = &upload_cases[i];
        json_t *f = NULL;
        int rc = t_upload(s, c->data, strlen(c->data), "batch", &f, &err);
        if (rc != c->rc)
            fail_msg("%s: rc %d (%s), expected %d", c->name, rc, err.message, c->rc);
        if (c->rc) {
            assert_null(f);
            if (!err.code || strcmp(err.code, c->code) || !strstr(err.message, c->message))
                fail_msg("%s: got code %s message '%s'; expected %s '%s'", c->name, err.code, err.message, c->code,
                         c->message);
            assert_int_equal(err_http_status(rc), 400);
        } else {
            assert_non_null(f);
            json_decref(f);
        }
    }
    /* size and purpose */
    char big[1001];
    memset(big, ' ', sizeof big);
    json_t *f = NULL;
    int rc = t_upload(s, big, sizeof big, "batch", &f, &err);
    assert_int_equal(rc, ERR_TOO_LARGE);
    assert_int_equal(err_http_status(rc), 413);
    assert_non_null(strstr(err.message, "limit is 1000 bytes"));
    rc = t_upload(s, OK_LINE("a"), strlen(OK_LINE("a")), "fine-tune", &f, &err);
    assert_int_equal(rc, ERR_INVALID_ARG);
    assert_string_equal(err.param, "purpose");
    jobs_store_close(s);
}

/* ---- files ---- */

static void test_files(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    struct jobs_err err;
    char ids[3][JOBS_ID_MAX];
    const char *data = OK_LINE("a") "\n";
    for (int i = 0; i < 3; i++) {
        json_t *f = NULL;
        assert_int_equal(jobs_file_create(s, i == 1 ? NULL : "in.jsonl", "batch", data, strlen(data), &f, &err), 0);
        const char *keys[] = {"id", "object", "bytes", "created_at", "filename", "purpose"};
        for (size_t k = 0; k < 6; k++)
            assert_non_null(json_object_get(f, keys[k]));
        assert_string_equal(json_string_value(json_object_get(f, "object")), "file");
        assert_string_equal(json_string_value(json_object_get(f, "purpose")), "batch");
        assert_int_equal(json_integer_value(json_object_get(f, "bytes")), strlen(data));
        assert_string_equal(json_string_value(json_object_get(f, "filename")), i == 1 ? "upload.jsonl" : "in.jsonl");
        assert_int_equal(strncmp(json_string_value(json_object_get(f, "id")), "file-", 5), 0);
        snprintf(ids[i], sizeof ids[i], "%s", json_string_value(json_object_get(f, "id")));
        json_decref(f);
    }
    /* newest first, paging with after */
    json_t *l = NULL;
    assert_int_equal(jobs_file_list(s, NULL, 2, NULL, &l, &err), 0);
    json_t *d = json_object_get(l, "data");
    assert_int_equal(json_array_size(d), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(d, 0), "id")), ids[2]);
    assert_string_equal(json_string_value(json_object_get(json_array_get(d, 1), "id")), ids[1]);
    assert_true(json_is_true(json_object_get(l, "has_more")));
    assert_string_equal(json_string_value(json_object_get(l, "last_id")), ids[1]);
    json_decref(l);
    assert_int_equal(jobs_file_list(s, "batch", 10, ids[1], &l, &err), 0);
    d = json_object_get(l, "data");
    assert_int_equal(json_array_size(d), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(d, 0), "id")), ids[0]);
    assert_true(json_is_false(json_object_get(l, "has_more")));
    json_decref(l);
    assert_int_equal(jobs_file_list(s, "batch_output", 10, NULL, &l, &err), 0);
    assert_int_equal(json_array_size(json_object_get(l, "data")), 0);
    json_decref(l);
    assert_int_equal(jobs_file_list(s, NULL, 10, "file-nope", &l, &err), ERR_NOT_FOUND);
    assert_int_equal(jobs_file_list(s, NULL, -1, NULL, &l, &err), ERR_INVALID_ARG);
    /* content, delete */
    char *c = NULL;
    size_t len = 0;
    assert_int_equal(jobs_file_content(s, ids[0], &c, &len, &err), 0);
    assert_int_equal(len, strlen(data));
    assert_memory_equal(c, data, len);
    free(c);
    json_t *del = NULL;
    assert_int_equal(jobs_file_delete(s, ids[0], &del, &err), 0);
    assert_true(json_is_true(json_object_get(del, "deleted")));
    assert_string_equal(json_string_value(json_object_get(del, "id")), ids[0]);
    json_decref(del);
    json_t *f = NULL;
    assert_int_equal(jobs_file_get(s, ids[0], &f, &err), ERR_NOT_FOUND);
    assert_int_equal(err_http_status(ERR_NOT_FOUND), 404);
    assert_int_equal(jobs_file_content(s, ids[0], &c, &len, &err), ERR_NOT_FOUND);
    assert_int_equal(jobs_file_delete(s, ids[0], &del, &err), ERR_NOT_FOUND);
    jobs_store_close(s);
}

/* ---- batches ---- */

static const char *t_upload_id(struct jobs_store *s, const char *data)
{
    static char id[JOBS_ID_MAX];
    json_t *f = NULL;
    struct jobs_err err;
    if (jobs_file_create(s, "in.jsonl", "batch", data, strlen(data), &f, &err))
        fail_msg("upload: %s", err.message);
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(f, "id")));
    json_decref(f);
    return id;
}

struct create_case {
    const char *name;
    const char *request; /* JSON; %s is the input file id */
    int rc;
    const char *param;
    const char *message;
};

static const struct create_case create_cases[] = {
    {"endpoint embeddings", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/embeddings\",\"completion_window\":\"24h\"}",
     ERR_INVALID_ARG, "endpoint", "supported values are '/v1/completions' and '/v1/chat/completions'"},
    {"no endpoint", "{\"input_file_id\":\"%s\",\"completion_window\":\"24h\"}", ERR_INVALID_ARG, "endpoint",
     "Missing required parameter: 'endpoint'"},
    {"no file", "{\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\"}", ERR_INVALID_ARG, "input_file_id",
     "'input_file_id'"},
    {"unknown file", "{\"input_file_id\":\"file-nope%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\"}",
     ERR_NOT_FOUND, "input_file_id", "No file with id 'file-nope"},
    {"url differs", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}",
     ERR_INVALID_ARG, "input_file_id", "Line 1: url '/v1/completions' differs from the batch's endpoint"},
    {"window", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"1w\"}",
     ERR_INVALID_ARG, "completion_window", "'completion_window': '1w'"},
    {"window too long", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"169h\"}",
     ERR_INVALID_ARG, "completion_window", "169h"},
    {"metadata value", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\","
                       "\"metadata\":{\"k\":1}}",
     ERR_INVALID_ARG, "metadata", "value of 'k'"},
    {"metadata 17", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\","
                    "\"metadata\":{\"a\":\"\",\"b\":\"\",\"c\":\"\",\"d\":\"\",\"e\":\"\",\"f\":\"\",\"g\":\"\",\"h\":\"\","
                    "\"i\":\"\",\"j\":\"\",\"k\":\"\",\"l\":\"\",\"m\":\"\",\"n\":\"\",\"o\":\"\",\"p\":\"\",\"q\":\"\"}}",
     ERR_INVALID_ARG, "metadata", "17 pairs"},
    {"ok", "{\"input_file_id\":\"%s\",\"endpoint\":\"/v1/completions\",\"completion_window\":\"24h\","
           "\"metadata\":{\"job\":\"nightly\"}}",
     0, NULL, NULL},
};

static void test_batch_create_validation(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    char fid[JOBS_ID_MAX];
    snprintf(fid, sizeof fid, "%s", t_upload_id(s, OK_LINE("a") "\n" OK_LINE("b") "\n"));
    for (size_t i = 0; i < sizeof create_cases / sizeof create_cases[0]; i++) {
        const struct create_case *c = &create_cases[i];
        char body[2048];
        snprintf(body, sizeof body, c->request, fid);
        json_t *req = json_loads(body, 0, NULL), *b = NULL;
        assert_non_null(req);
        struct jobs_err err;
        int rc = jobs_batch_create(s, req, &b, &err);
        json_decref(req);
        if (rc != c->rc)
            fail_msg("%s: rc %d (%s), expected %d", c->name, rc, err.message, c->rc);
        if (rc) {
            if (!err.param || strcmp(err.param, c->param) || !strstr(err.message, c->message))
                fail_msg("%s: param %s message '%s'; expected %s '%s'", c->name, err.param, err.message, c->param,
                         c->message);
        } else {
            json_decref(b);
        }
    }
    json_t *b = NULL;
    struct jobs_err err;
    assert_int_equal(jobs_batch_get(s, "batch_nope", &b, &err), ERR_NOT_FOUND);
    jobs_store_close(s);
}

static void test_batch_object(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 3, "24h", id);
    json_t *b = tj_batch_get(s, id);
    /* every field of OpenAI's batch object, in its order */
    const char *keys[] = {"id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status",
                          "output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at",
                          "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at",
                          "request_counts", "metadata"};
    assert_int_equal(json_object_size(b), sizeof keys / sizeof keys[0]);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (!json_object_get(b, keys[k]))
            fail_msg("batch object has no '%s'", keys[k]);
    const char *k;
    json_t *v;
    size_t i = 0;
    json_object_foreach(b, k, v) assert_string_equal(k, keys[i++]);
    assert_string_equal(json_string_value(json_object_get(b, "object")), "batch");
    assert_string_equal(json_string_value(json_object_get(b, "status")), "in_progress");
    assert_string_equal(json_string_value(json_object_get(b, "endpoint")), "/v1/completions");
    assert_int_equal(json_integer_value(json_object_get(b, "expires_at")) -
                         json_integer_value(json_object_get(b, "created_at")),
                     24 * 3600);
    assert_true(json_is_integer(json_object_get(b, "in_progress_at")));
    assert_true(json_is_null(json_object_get(b, "output_file_id")));
    assert_true(json_is_null(json_object_get(b, "completed_at")));
    assert_true(json_is_null(json_object_get(b, "errors")));
    assert_true(json_is_null(json_object_get(b, "metadata")));
    json_t *rc = json_object_get(b, "request_counts");
    assert_int_equal(json_integer_value(json_object_get(rc, "total")), 3);
    assert_int_equal(json_integer_value(json_object_get(rc, "completed")), 0);
    json_decref(b);
    /* list: newest first, after, has_more */
    char id2[JOBS_ID_MAX];
    tj_batch(s, 1, "24h", id2);
    json_t *l = NULL;
    struct jobs_err err;
    assert_int_equal(jobs_batch_list(s, 1, NULL, &l, &err), 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(l, "data"), 0), "id")), id2);
    assert_true(json_is_true(json_object_get(l, "has_more")));
    json_decref(l);
    assert_int_equal(jobs_batch_list(s, 0, id2, &l, &err), 0);
    assert_int_equal(json_array_size(json_object_get(l, "data")), 1);
    assert_string_equal(json_string_value(json_object_get(l, "first_id")), id);
    assert_true(json_is_false(json_object_get(l, "has_more")));
    json_decref(l);
    assert_int_equal(jobs_batch_list(s, 101, NULL, &l, &err), ERR_INVALID_ARG);
    assert_string_equal(err.param, "limit");
    jobs_store_close(s);
}

/* Claims everything and answers: line i gets a 200 echo, except every 4th which gets a 400 error body. */
static int t_run_all(struct jobs_store *s, int max, int fail_every)
{
    struct jobs_line lines[64];
    int n = 0, total = 0;
    struct jobs_err err;
    do {
        assert_int_equal(jobs_lines_claim(s, lines, max, &n, &err), 0);
        struct jobs_result res[64];
        for (int i = 0; i < n; i++) {
            char *body = tj_fake_response(lines[i].body);
            int status = fail_every && lines[i].idx % fail_every == 0 ? 400 : 200;
            const char *ebody = "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\"}}";
            res[i].line = &lines[i];
            res[i].text = jobs_result_text(&lines[i], status, NULL, status == 200 ? body : ebody, NULL, NULL,
                                           &res[i].is_error);
            assert_non_null(res[i].text);
            assert_int_equal(res[i].is_error, status != 200);
            free(body);
        }
        assert_int_equal(jobs_lines_commit(s, res, n, &err), 0);
        for (int i = 0; i < n; i++) {
            free(res[i].text);
            jobs_line_deinit(&lines[i]);
        }
        total += n;
    } while (n > 0);
    return total;
}

static void test_lines_to_output(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 10, "24h", id);
    struct jobs_stats st;
    struct jobs_err err;
    assert_int_equal(jobs_store_stats(s, &st, &err), 0);
    assert_int_equal(st.batches[JOBS_IN_PROGRESS], 1);
    assert_int_equal(st.queue_lines, 10);
    assert_int_equal(t_run_all(s, 3, 4), 10);
    /* all committed, not finalized yet: the tick does it */
    assert_string_equal(tj_status(s, id), "in_progress");
    assert_int_equal(jobs_store_stats(s, &st, &err), 0);
    assert_int_equal(st.queue_lines, 0);
    int changed = 0;
    assert_int_equal(jobs_store_tick(s, &changed, &err), 0);
    assert_int_equal(changed, 1);
    json_t *b = tj_batch_get(s, id);
    assert_string_equal(json_string_value(json_object_get(b, "status")), "completed");
    assert_true(json_is_integer(json_object_get(b, "finalizing_at")));
    assert_true(json_is_integer(json_object_get(b, "completed_at")));
    json_t *rc = json_object_get(b, "request_counts");
    assert_int_equal(json_integer_value(json_object_get(rc, "completed")), 7);
    assert_int_equal(json_integer_value(json_object_get(rc, "failed")), 3); /* idx 0, 4, 8 */
    /* the output file is a batch_output file, lines in input order */
    json_t *f = NULL;
    assert_int_equal(jobs_file_get(s, json_string_value(json_object_get(b, "output_file_id")), &f, &err), 0);
    assert_string_equal(json_string_value(json_object_get(f, "purpose")), "batch_output");
    json_decref(f);
    char *out = NULL;
    size_t len;
    assert_int_equal(jobs_file_content(s, json_string_value(json_object_get(b, "output_file_id")), &out, &len, &err), 0);
    assert_int_equal(strncmp(out, "{\"id\":\"batch_req_", 17), 0);
    assert_non_null(strstr(out, "\"custom_id\":\"c1\",\"response\":{\"status_code\":200,\"request_id\":\"req_"));
    assert_true(strstr(out, "\"c1\"") < strstr(out, "\"c2\"") && strstr(out, "\"c2\"") < strstr(out, "\"c9\""));
    free(out);
    assert_int_equal(jobs_file_content(s, json_string_value(json_object_get(b, "error_file_id")), &out, &len, &err), 0);
    assert_non_null(strstr(out, "\"custom_id\":\"c4\",\"response\":{\"status_code\":400"));
    free(out);
    json_decref(b);
    int n_out, n_err;
    tj_check_exactly_once(s, id, 10, &n_out, &n_err);
    assert_int_equal(n_out, 7);
    assert_int_equal(n_err, 3);
    assert_int_equal(jobs_store_stats(s, &st, &err), 0);
    assert_int_equal(st.batches[JOBS_COMPLETED], 1);
    assert_int_equal(st.batches[JOBS_IN_PROGRESS], 0);
    /* a finished batch cannot be cancelled */
    assert_int_equal(jobs_batch_cancel(s, id, &b, &err), ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "is completed"));
    assert_int_equal(jobs_batch_cancel(s, "batch_nope", &b, &err), ERR_NOT_FOUND);
    jobs_store_close(s);
}

/* A line committed twice (computed twice) counts once and keeps its first result. */
static void test_commit_idempotent(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 2, "24h", id);
    struct jobs_line lines[2];
    int n;
    struct jobs_err err;
    assert_int_equal(jobs_lines_claim(s, lines, 2, &n, &err), 0);
    assert_int_equal(n, 2);
    struct jobs_result r = {.line = &lines[0]};
    r.text = jobs_result_text(&lines[0], 200, "req_first", "{\"echo\":\"p0\"}", NULL, NULL, &r.is_error);
    assert_int_equal(jobs_lines_commit(s, &r, 1, &err), 0);
    free(r.text);
    r.text = jobs_result_text(&lines[0], 200, "req_second", "{\"echo\":\"p0\"}", NULL, NULL, &r.is_error);
    assert_int_equal(jobs_lines_commit(s, &r, 1, &err), 0);
    free(r.text);
    json_t *b = tj_batch_get(s, id);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "request_counts"), "completed")), 1);
    json_decref(b);
    r.line = &lines[1];
    r.text = jobs_result_text(&lines[1], 0, NULL, NULL, "model_not_found", "The model 'x' does not exist.", &r.is_error);
    assert_true(r.is_error);
    assert_non_null(strstr(r.text, "\"response\":null,\"error\":{\"code\":\"model_not_found\""));
    assert_int_equal(jobs_lines_commit(s, &r, 1, &err), 0);
    free(r.text);
    assert_string_equal(tj_wait_final(s, id, 2000, true), "completed");
    int n_out, n_err;
    tj_check_exactly_once(s, id, 2, &n_out, &n_err);
    assert_int_equal(n_out, 1);
    assert_int_equal(n_err, 1);
    char *out;
    size_t len;
    b = tj_batch_get(s, id);
    assert_int_equal(jobs_file_content(s, json_string_value(json_object_get(b, "output_file_id")), &out, &len, &err), 0);
    assert_non_null(strstr(out, "req_first"));
    assert_null(strstr(out, "req_second"));
    free(out);
    json_decref(b);
    for (int i = 0; i < 2; i++)
        jobs_line_deinit(&lines[i]);
    jobs_store_close(s);
}

static void test_expiry(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 5, "1s", id);
    struct jobs_line lines[2];
    int n;
    struct jobs_err err;
    assert_int_equal(jobs_lines_claim(s, lines, 2, &n, &err), 0);
    assert_int_equal(n, 2);
    char *body = tj_fake_response(lines[0].body);
    struct jobs_result r = {.line = &lines[0]};
    r.text = jobs_result_text(&lines[0], 200, NULL, body, NULL, NULL, &r.is_error);
    free(body);
    assert_int_equal(jobs_lines_commit(s, &r, 1, &err), 0);
    free(r.text);
    json_t *b = tj_batch_get(s, id);
    int64_t expires = json_integer_value(json_object_get(b, "expires_at"));
    json_decref(b);
    while (time(NULL) < expires)
        usleep(50000);
    int changed;
    assert_int_equal(jobs_store_tick(s, &changed, &err), 0);
    assert_int_equal(changed, 1);
    b = tj_batch_get(s, id);
    assert_string_equal(json_string_value(json_object_get(b, "status")), "expired");
    assert_true(json_is_integer(json_object_get(b, "expired_at")));
    json_decref(b);
    /* the line still running when the window closed reports late: it is dropped, its expired line stays */
    body = tj_fake_response(lines[1].body);
    r.line = &lines[1];
    r.text = jobs_result_text(&lines[1], 200, NULL, body, NULL, NULL, &r.is_error);
    free(body);
    assert_int_equal(jobs_lines_commit(s, &r, 1, &err), 0);
    free(r.text);
    int n_out, n_err;
    tj_check_exactly_once(s, id, 5, &n_out, &n_err);
    assert_int_equal(n_out, 1);
    assert_int_equal(n_err, 4);
    b = tj_batch_get(s, id);
    char *out;
    size_t len;
    assert_int_equal(jobs_file_content(s, json_string_value(json_object_get(b, "error_file_id")), &out, &len, &err), 0);
    assert_non_null(strstr(out, "\"custom_id\":\"c1\",\"response\":null,\"error\":{\"code\":\"batch_expired\""));
    free(out);
    json_decref(b);
    for (int i = 0; i < 2; i++)
        jobs_line_deinit(&lines[i]);
    jobs_store_close(s);
}

static void test_cancel(void **state)
{
    struct jobs_store *s = t_open(state, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 6, "24h", id);
    struct jobs_line lines[2];
    int n;
    struct jobs_err err;
    assert_int_equal(jobs_lines_claim(s, lines, 2, &n, &err), 0);
    assert_int_equal(n, 2);
    json_t *b = NULL;
    assert_int_equal(jobs_batch_cancel(s, id, &b, &err), 0);
    assert_string_equal(json_string_value(json_object_get(b, "status")), "cancelling");
    assert_true(json_is_integer(json_object_get(b, "cancelling_at")));
    json_decref(b);
    assert_int_equal(jobs_batch_cancel(s, id, &b, &err), 0); /* again: returned as it is */
    json_decref(b);
    /* no new line starts; the tick waits for the two in flight */
    struct jobs_line more[2];
    assert_int_equal(jobs_lines_claim(s, more, 2, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(jobs_store_tick(s, NULL, &err), 0);
    assert_string_equal(tj_status(s, id), "cancelling");
    for (int i = 0; i < 2; i++) {
        char *body = tj_fake_response(lines[i].body);
        struct jobs_result r = {.line = &lines[i]};
        r.text = jobs_result_text(&lines[i], 200, NULL, body, NULL, NULL, &r.is_error);
        free(body);
        assert_int_equal(jobs_lines_commit(s, &r, 1, &err), 0);
        free(r.text);
        jobs_line_deinit(&lines[i]);
    }
    assert_string_equal(tj_wait_final(s, id, 2000, true), "cancelled");
    int n_out, n_err;
    tj_check_exactly_once(s, id, 6, &n_out, &n_err);
    assert_int_equal(n_out, 2);
    assert_int_equal(n_err, 4);
    b = tj_batch_get(s, id);
    assert_true(json_is_integer(json_object_get(b, "cancelled_at")));
    json_decref(b);
    jobs_store_close(s);
}

/* A worker that dies with lines claimed: they come back (marked reclaimed) to the next one. SQLite: at the next
 * open of the data dir; Redis: to another consumer once the lease has run out. */
static void test_resume_claimed(void **state)
{
    const char *dir = test_tmp_path("resume");
    struct jobs_store *s = *state == REDIS ? t_open(state, 300) : tj_open(dir, NULL, NULL, 0);
    char id[JOBS_ID_MAX];
    tj_batch(s, 4, "24h", id);
    struct jobs_line lines[3];
    int n;
    struct jobs_err err;
    assert_int_equal(jobs_lines_claim(s, lines, 3, &n, &err), 0);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        assert_false(lines[i].reclaimed);
        jobs_line_deinit(&lines[i]);
    }
    jobs_store_close(s); /* as if killed: nothing given back */
    if (*state == REDIS) {
        s = tj_open(NULL, redis.url, "second", 300);
        usleep(400000);
    } else {
        s = tj_open(dir, NULL, NULL, 0);
    }
    struct jobs_line again[4];
    assert_int_equal(jobs_lines_claim(s, again, 4, &n, &err), 0);
    assert_int_equal(n, 4);
    int reclaimed = 0;
    for (int i = 0; i < 4; i++) {
        reclaimed += again[i].reclaimed;
        jobs_line_deinit(&again[i]);
    }
    assert_int_equal(reclaimed, 3);
    jobs_store_close(s);
}

static void test_data_dir_locked(void **state)
{
    const char *dir = test_tmp_path("locked");
    struct jobs_store *a = tj_open(dir, NULL, NULL, 0);
    struct jobs_config cfg = {.data_dir = dir};
    struct jobs_err err;
    struct jobs_store *b = jobs_store_open(&cfg, &err);
    assert_null(b);
    assert_non_null(strstr(err.message, "is in use by another wafer process"));
    jobs_store_close(a);
    b = jobs_store_open(&cfg, &err); /* free again once the first closed */
    assert_non_null(b);
    assert_non_null(strstr(jobs_store_where(b), "SQLite in "));
    jobs_store_close(b);
}

static void test_open_errors(void **state)
{
    struct jobs_err err;
    struct jobs_config cfg = {.queue = "postgres://x"};
    assert_null(jobs_store_open(&cfg, &err));
    assert_non_null(strstr(err.message, "redis://"));
    /* nothing listens on port 1 */
    cfg.queue = "redis://127.0.0.1:1";
    assert_null(jobs_store_open(&cfg, &err));
    assert_non_null(strstr(err.message, "Redis at 127.0.0.1:1 is unreachable"));
    cfg.queue = "redis://127.0.0.1:notaport";
    assert_null(jobs_store_open(&cfg, &err));
    assert_non_null(strstr(err.message, "redis://[:password@]HOST:PORT[/DB]"));
    char dir[4096];
    setenv("XDG_DATA_HOME", "/srv/data", 1);
    jobs_default_data_dir(dir, sizeof dir);
    assert_string_equal(dir, "/srv/data/wafer");
    unsetenv("XDG_DATA_HOME");
    setenv("HOME", "/home/u", 1);
    jobs_default_data_dir(dir, sizeof dir);
    assert_string_equal(dir, "/home/u/.local/share/wafer");
}

#define BOTH(f) {#f "/sqlite", f, NULL, NULL, (void *)SQLITE}, {#f "/redis", f, NULL, NULL, (void *)REDIS}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload_validation),
        BOTH(test_files),
        BOTH(test_batch_create_validation),
        BOTH(test_batch_object),
        BOTH(test_lines_to_output),
        BOTH(test_commit_idempotent),
        BOTH(test_expiry),
        BOTH(test_cancel),
        BOTH(test_resume_claimed),
        cmocka_unit_test(test_data_dir_locked),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
