/* Tests for the flag parsing of `wafer jobs` (src/cli/cmd_jobs.c): usage errors exit 2 with a message naming
 * the problem, --help exits 0, and nothing reaches the network before the flags are all good (the URL given
 * here has nothing listening, so a request would show up as exit 1). The runs against a Batch API are in
 * tests/e2e/test_jobs_cli.py. */
#include "testutil.h"

#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs `wafer jobs ARGS...` with stdout and stderr captured into out (malloc'd, caller frees). */
static int t_jobs(char **out, int argc, const char *const *args)
{
    const char *path = test_tmp_path("jobs-cli.out");
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    char *argv[32];
    argv[0] = "jobs";
    for (int i = 0; i < argc; i++)
        argv[i + 1] = (char *)args[i];
    argv[argc + 1] = NULL;
    int rc = cmd_jobs_main(argc + 1, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    fclose(f);
    size_t len;
    *out = test_read_file(path, &len);
    assert_non_null(*out);
    return rc;
}

struct cli_case {
    const char *args[8];
    int rc;
    const char *message;
};

static const struct cli_case cli_cases[] = {
    {{NULL}, 2, "usage: wafer jobs <command>"},
    {{"--help"}, 0, "usage: wafer jobs <command>"},
    {{"frobnicate"}, 2, "unknown command 'frobnicate'"},
    {{"submit", "--help"}, 0, "usage: wafer jobs submit FILE.jsonl"},
    {{"results", "-h"}, 0, "usage: wafer jobs results ID"},
    {{"submit"}, 2, "missing FILE.jsonl"},
    {{"submit", "a.jsonl", "b.jsonl"}, 2, "unexpected argument 'b.jsonl'"},
    {{"submit", "a.jsonl", "--endpoint", "/v1/embeddings"}, 2, "--endpoint: expected"},
    {{"submit", "a.jsonl", "--endpoint"}, 2, "missing the value of '--endpoint'"},
    {{"submit", "a.jsonl", "--metadata", "=x"}, 2, "--metadata: expected KEY=VALUE, got '=x'"},
    {{"submit", "a.jsonl", "--interval", "0"}, 2, "--interval: expected a number in [0.05, 3600], got '0'"},
    {{"submit", "a.jsonl", "--limit", "3"}, 2, "unknown option '--limit'"},
    {{"list", "--limit", "101"}, 2, "--limit: expected an integer in [1, 100], got '101'"},
    {{"list", "extra"}, 2, "unexpected argument 'extra'"},
    {{"status"}, 2, "missing the batch ID"},
    {{"status", "b", "--errors"}, 2, "unknown option '--errors'"},
    {{"results", "b", "-o"}, 2, "missing the value of '-o'"},
    {{"cancel", "b", "--url", "localhost:8080"}, 2, "--url: expected http://HOST:PORT, got 'localhost:8080'"},
    /* all flags good: it goes to the network, where nothing listens */
    {{"status", "b", "--url", "http://127.0.0.1:1/v1/"}, 1, "cannot reach http://127.0.0.1:1/v1/batches/b"},
    {{"submit", "/nonexistent/x.jsonl", "--url", "http://127.0.0.1:1"}, 1, "cannot open '/nonexistent/x.jsonl'"},
};

static void test_jobs_cli_flags(void **state)
{
    (void)state;
    unsetenv("WAFER_URL");
    for (size_t i = 0; i < sizeof cli_cases / sizeof cli_cases[0]; i++) {
        const struct cli_case *c = &cli_cases[i];
        int argc = 0;
        while (c->args[argc])
            argc++;
        char *out = NULL;
        int rc = t_jobs(&out, argc, c->args);
        if (rc != c->rc || !strstr(out, c->message))
            fail_msg("case %zu (%s ...): rc %d, output:\n%s\nexpected rc %d and '%s'", i, c->args[0] ? c->args[0] : "",
                     rc, out, c->rc, c->message);
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_cli_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
