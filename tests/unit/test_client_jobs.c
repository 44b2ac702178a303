/* Tests for the client library's batch jobs without a server (src/client/jobs.c): the batch object and list
 * parsers (nulls, counts, errors, ids too long, not JSON), the id check that keeps ids out of other URL
 * paths, the default endpoint from a JSONL's first line, and the calls' argument errors, which must come
 * back before anything is sent (attempts 0). The calls against a server are tested end to end
 * (tests/e2e/test_client_jobs.py). */
#include "testutil.h"

#include "client/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char BATCH[] =
    "{\"id\":\"batch_1\",\"object\":\"batch\",\"endpoint\":\"/v1/completions\",\"errors\":null,"
    "\"input_file_id\":\"file-in\",\"completion_window\":\"24h\",\"status\":\"completed\","
    "\"output_file_id\":\"file-out\",\"error_file_id\":null,\"created_at\":1700000000,\"completed_at\":1700000060,"
    "\"request_counts\":{\"total\":5,\"completed\":4,\"failed\":1},\"metadata\":null}";

static void test_parse_batch(void **state)
{
    (void)state;
    struct wafer_job j;
    char err[200];
    assert_int_equal(client_job_parse(BATCH, strlen(BATCH), &j, err, sizeof err), 0);
    assert_string_equal(j.id, "batch_1");
    assert_string_equal(j.status, "completed");
    assert_true(j.final);
    assert_string_equal(j.endpoint, "/v1/completions");
    assert_string_equal(j.completion_window, "24h");
    assert_string_equal(j.input_file_id, "file-in");
    assert_string_equal(j.output_file_id, "file-out");
    assert_string_equal(j.error_file_id, ""); /* null */
    assert_int_equal(j.total, 5);
    assert_int_equal(j.completed, 4);
    assert_int_equal(j.failed, 1);
    assert_int_equal(j.created_at, 1700000000);
    assert_int_equal(j.completed_at, 1700000060);
    assert_string_equal(j.errors, "");

    static const char *const not_final[] = {"validating", "in_progress", "finalizing", "cancelling"};
    static const char *const final[] = {"completed", "failed", "expired", "cancelled"};
    for (int i = 0; i < 4; i++) {
        char buf[128];
        snprintf(buf, sizeof buf, "{\"id\":\"b\",\"status\":\"%s\"}", not_final[i]);
        assert_int_equal(client_job_parse(buf, strlen(buf), &j, err, sizeof err), 0);
        assert_false(j.final);
        assert_int_equal(j.total, 0); /* no request_counts: 0 */
        snprintf(buf, sizeof buf, "{\"id\":\"b\",\"status\":\"%s\"}", final[i]);
        assert_int_equal(client_job_parse(buf, strlen(buf), &j, err, sizeof err), 0);
        assert_true(j.final);
    }
}

static void test_parse_batch_errors(void **state)
{
    (void)state;
    struct wafer_job j;
    char err[200];
    const char *failed = "{\"id\":\"b\",\"status\":\"failed\",\"errors\":{\"object\":\"list\",\"data\":["
                         "{\"code\":\"disk_full\",\"message\":\"free space\",\"param\":null,\"line\":null},"
                         "{\"code\":\"x\",\"message\":null}]}}";
    assert_int_equal(client_job_parse(failed, strlen(failed), &j, err, sizeof err), 0);
    assert_string_equal(j.errors, "disk_full: free space\nx: -");

    const char *bad[] = {"", "not json", "[1]", "{\"status\":\"completed\"}", "{\"id\":\"b\"}",
                         "{\"id\":7,\"status\":\"completed\"}", "{\"id\":\"b\",\"status\":\"a-status-far-too-long\"}"};
    const char *why[] = {"not JSON", "not JSON", "not a JSON object", "no \"id\"", "no \"id\"", "no \"id\"",
                         "\"status\" is longer than 15 bytes"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&j, 0x55, sizeof j);
        err[0] = 0;
        assert_int_equal(client_job_parse(bad[i], strlen(bad[i]), &j, err, sizeof err), -1);
        assert_non_null(strstr(err, why[i]));
    }
    char longid[300];
    snprintf(longid, sizeof longid, "{\"id\":\"%0200d\",\"status\":\"completed\"}", 0);
    assert_int_equal(client_job_parse(longid, strlen(longid), &j, err, sizeof err), -1);
    assert_non_null(strstr(err, "\"id\" is longer than 127 bytes"));
    /* NULL text (no body) is not JSON, not a crash */
    assert_int_equal(client_job_parse(NULL, 0, &j, err, sizeof err), -1);
}

static void test_parse_list(void **state)
{
    (void)state;
    struct wafer_job *v;
    int n;
    bool more;
    char err[200];
    char list[2048];
    snprintf(list, sizeof list, "{\"object\":\"list\",\"data\":[%s,{\"id\":\"batch_0\",\"status\":\"in_progress\"}],"
             "\"has_more\":true}", BATCH);
    assert_int_equal(client_job_parse_list(list, strlen(list), &v, &n, &more, err, sizeof err), 0);
    assert_int_equal(n, 2);
    assert_true(more);
    assert_string_equal(v[0].id, "batch_1");
    assert_string_equal(v[1].id, "batch_0");
    assert_false(v[1].final);
    free(v);
    const char *empty = "{\"object\":\"list\",\"data\":[],\"has_more\":false}";
    assert_int_equal(client_job_parse_list(empty, strlen(empty), &v, &n, &more, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_null(v);
    assert_false(more);
    const char *bad = "{\"data\":[{\"id\":\"a\",\"status\":\"completed\"},{\"id\":\"b\"}]}";
    assert_int_equal(client_job_parse_list(bad, strlen(bad), &v, &n, &more, err, sizeof err), -1);
    assert_non_null(strstr(err, "batch 1 of the list"));
    assert_null(v);
    assert_int_equal(n, 0);
    assert_int_equal(client_job_parse_list("{}", 2, &v, &n, &more, err, sizeof err), -1);
    assert_non_null(strstr(err, "no \"data\" array"));
}

static void test_id_ok(void **state)
{
    (void)state;
    assert_true(client_job_id_ok("batch_abc-123"));
    assert_true(client_job_id_ok("file-x.y~z"));
    assert_true(client_job_id_ok("..."));
    const char *bad[] = {"", ".", "..", "a/b", "../x", "a?b", "a b", "a%2f", "a#", "caf\xc3\xa9", "a\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(client_job_id_ok(bad[i]));
    assert_false(client_job_id_ok(NULL));
    char id[WAFER_ID_MAX + 1];
    memset(id, 'a', sizeof id);
    id[WAFER_ID_MAX - 1] = 0;
    assert_true(client_job_id_ok(id)); /* 127 bytes */
    id[WAFER_ID_MAX - 1] = 'a';
    id[WAFER_ID_MAX] = 0;
    assert_false(client_job_id_ok(id)); /* 128 */
}

static void test_first_url(void **state)
{
    (void)state;
    const char *t = "\n  \r\n{\"custom_id\":\"a\",\"url\":\"/v1/completions\"}\n{\"url\":\"/v1/chat/completions\"}\n";
    char *u = client_jsonl_first_url(t, strlen(t));
    assert_non_null(u);
    assert_string_equal(u, "/v1/completions");
    free(u);
    const char *no_nl = "{\"url\":\"/v1/chat/completions\"}";
    u = client_jsonl_first_url(no_nl, strlen(no_nl));
    assert_string_equal(u, "/v1/chat/completions");
    free(u);
    /* the first line decides, even when it is bad: the server says which line */
    const char *bad[] = {"", "\n\n", "not json\n{\"url\":\"/v1/completions\"}", "{\"url\":3}", "{\"custom_id\":\"a\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_null(client_jsonl_first_url(bad[i], strlen(bad[i])));
    /* len bounds the text: a line cut short is not JSON */
    assert_null(client_jsonl_first_url(no_nl, 10));
}

static struct wafer_client *test_client(void)
{
    struct wafer_client_options o;
    wafer_client_options_default(&o);
    o.base_url = "http://127.0.0.1:1"; /* nothing listens: whatever is sent fails as a connection error */
    o.max_retries = 0;
    char err[WAFER_ERR_MAX];
    struct wafer_client *c = wafer_client_create(&o, err);
    assert_non_null(c);
    return c;
}

static void test_bad_arguments_send_nothing(void **state)
{
    (void)state;
    struct wafer_client *c = test_client();
    struct wafer_result r;
    struct wafer_job j;
    memset(&j, 0x55, sizeof j);
    assert_int_equal(wafer_jobs_get(c, "../files/x", &j, &r), WAFER_E_INVALID);
    assert_int_equal(r.attempts, 0);
    assert_non_null(strstr(r.error, "'../files/x' is not an id"));
    assert_string_equal(j.id, ""); /* cleared */
    wafer_result_free(&r);
    assert_int_equal(wafer_jobs_cancel(c, NULL, NULL, &r), WAFER_E_INVALID);
    wafer_result_free(&r);
    assert_int_equal(wafer_jobs_results(c, "a b", false, NULL, &r), WAFER_E_INVALID);
    wafer_result_free(&r);
    assert_int_equal(wafer_files_content(c, "", &r), WAFER_E_INVALID);
    wafer_result_free(&r);
    assert_int_equal(wafer_jobs_wait(c, "x/y", 0.1, 1, NULL, NULL, NULL, &r), WAFER_E_INVALID);
    assert_int_equal(r.attempts, 0);
    wafer_result_free(&r);

    struct wafer_job *v = (struct wafer_job *)&r;
    int n = 7;
    assert_int_equal(wafer_jobs_list(c, 101, NULL, &v, &n, NULL, &r), WAFER_E_INVALID);
    assert_null(v);
    assert_int_equal(n, 0);
    wafer_result_free(&r);
    assert_int_equal(wafer_jobs_list(c, 10, "a/b", &v, &n, NULL, &r), WAFER_E_INVALID);
    wafer_result_free(&r);

    struct wafer_job_request req = {0};
    struct wafer_file f;
    assert_int_equal(wafer_jobs_submit(c, &req, &j, &f, &r), WAFER_E_INVALID); /* neither path nor data */
    wafer_result_free(&r);
    req.path = "/nonexistent/dir/reqs.jsonl";
    assert_int_equal(wafer_jobs_submit(c, &req, &j, &f, &r), WAFER_E_INVALID);
    assert_non_null(strstr(r.error, "cannot open '/nonexistent/dir/reqs.jsonl'"));
    assert_int_equal(r.attempts, 0);
    assert_string_equal(f.id, "");
    wafer_result_free(&r);
    req.path = NULL;
    req.data = "{}\n";
    req.len = 3;
    req.n_metadata = 1; /* without metadata */
    assert_int_equal(wafer_jobs_submit(c, &req, &j, &f, &r), WAFER_E_INVALID);
    wafer_result_free(&r);
    assert_string_equal(wafer_status_name(WAFER_E_NO_FILE), "no_file");
    wafer_client_destroy(c);
}

static void test_unreachable_names_the_url(void **state)
{
    (void)state;
    struct wafer_client *c = test_client();
    struct wafer_result r;
    struct wafer_job j;
    assert_int_equal(wafer_jobs_get(c, "batch_1", &j, &r), WAFER_E_CONNECT);
    assert_int_equal(r.attempts, 1);
    assert_non_null(strstr(r.error, "cannot reach http://127.0.0.1:1/v1/batches/batch_1: "));
    wafer_result_free(&r);
    struct wafer_job_request req = {.data = "{\"url\":\"/v1/completions\"}\n", .len = 26};
    struct wafer_file f;
    assert_int_equal(wafer_jobs_submit(c, &req, &j, &f, &r), WAFER_E_CONNECT);
    assert_non_null(strstr(r.error, "cannot reach http://127.0.0.1:1/v1/files: "));
    assert_string_equal(f.id, "");
    wafer_result_free(&r);
    wafer_client_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_batch),
        cmocka_unit_test(test_parse_batch_errors),
        cmocka_unit_test(test_parse_list),
        cmocka_unit_test(test_id_ok),
        cmocka_unit_test(test_first_url),
        cmocka_unit_test(test_bad_arguments_send_nothing),
        cmocka_unit_test(test_unreachable_names_the_url),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
