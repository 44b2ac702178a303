/* Tests for the model manager's pure parts (route/route_models.h): the config parser (the issue's example,
 * defaults, every error naming file:line, flags over the file, --models-dir) and the eviction choice (least
 * recently used idle models first, busy ones never, the budget and max_loaded, a model over the budget). */
#include "testutil.h"

#include "core/err.h"
#include "route/route_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- config ---------------------------------------------------------------------------------------- */

static const char issue_yaml[] =
    "models:\n"                                                                                        /* 1 */
    "  - {name: storyteller, path: models/stories260K.gguf, aliases: [tiny], max_batch_size: 8, kv_memory: 256MiB}\n"
    "  - {name: coder, path: hf://owner/repo:Q4_K_M, keep_alive: 600, preload: true}\n"                 /* 3 */
    "memory_budget: 12GiB        # loaded models' weights + KV; least recently used idle models unloaded first\n"
    "auth: {admin_keys: [sk-admin]}   # admin API open when no admin key is set (loopback only by default)\n";

static void test_config_issue_example(void **state)
{
    (void)state;
    struct route_models_config c;
    route_models_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(route_models_config_load_string(&c, issue_yaml, strlen(issue_yaml), "m.yaml", err), 0);
    assert_int_equal(route_models_config_check(&c, err), 0);
    assert_int_equal(c.n_models, 2);
    assert_string_equal(c.models[0].name, "storyteller");
    assert_string_equal(c.models[0].path, "models/stories260K.gguf"); /* text: no file to resolve against */
    assert_int_equal(c.models[0].n_aliases, 1);
    assert_string_equal(c.models[0].aliases[0], "tiny");
    assert_int_equal(c.models[0].max_batch_size, 8);
    assert_int_equal(c.models[0].kv_memory, 256 << 20);
    assert_false(c.models[0].keep_alive_set);
    assert_int_equal(c.models[0].line, 2);
    assert_string_equal(c.models[1].path, "hf://owner/repo:Q4_K_M");
    assert_true(c.models[1].keep_alive_set);
    assert_true(c.models[1].keep_alive == 600);
    assert_true(c.models[1].preload);
    assert_false(c.models[0].preload);
    assert_int_equal(c.memory_budget, (int64_t)12 << 30);
    assert_int_equal(c.n_admin_keys, 1);
    assert_string_equal(c.admin_keys[0], "sk-admin");
    /* defaults */
    assert_true(c.keep_alive == 300);
    assert_true(c.load_on_request);
    assert_int_equal(c.kv_memory, 256 << 20);
    assert_int_equal(c.port, 8080);
    route_models_config_deinit(&c);
}

static void expect_error(const char *yaml, const char *where, const char *what)
{
    struct route_models_config c;
    route_models_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    int rc = route_models_config_load_string(&c, yaml, strlen(yaml), "m.yaml", err);
    if (!rc)
        rc = route_models_config_check(&c, err);
    if (rc == 0 || !strstr(err, where) || !strstr(err, what))
        fail_msg("for\n%s\nexpected an error with '%s' and '%s', got %d '%s'", yaml, where, what, rc, err);
    route_models_config_deinit(&c);
}

static void test_config_errors_name_file_and_line(void **state)
{
    (void)state;
    expect_error("models:\n  - {name: a, path: x.gguf, kv_memry: 1GiB}\n", "m.yaml:2:", "unknown key 'kv_memry'");
    expect_error("models:\n  - {name: a}\n", "m.yaml:2:", "no path");
    expect_error("models:\n  - {name: a, path: x.gguf}\n  - {name: b, path: y.gguf, aliases: [a]}\n", ":3:",
                 "used twice");
    expect_error("models:\n  - {name: a, path: x.gguf, aliases: [b, b]}\n", ":2:", "used twice");
    expect_error("memory_budget: lots\nmodels:\n  - {name: a, path: x.gguf}\n", "m.yaml:1:", "memory_budget");
    expect_error("models:\n  - {name: a, path: x.gguf}\nkeep_alive: soon\n", "m.yaml:3:", "keep_alive");
    expect_error("models:\n  - {name: a, path: x.gguf}\nkeep_alive: -2\n", "m.yaml:3:", "keep_alive");
    expect_error("models:\n  - {name: a, path: x.gguf, max_batch_size: 0}\n", "m.yaml:2:", "max_batch_size");
    expect_error("models:\n  - {name: a, path: x.gguf, preload: maybe}\n", "m.yaml:2:", "models.preload");
    expect_error("models:\n  - {name: a, path: x.gguf, kv_memory: 1KiB}\n", "m.yaml:2:", "kv_memory");
    expect_error("models:\n  - {name: 'a b', path: x.gguf}\n", ":2:", "name 'a b'");
    expect_error("models:\n  - {name: a, path: x.gguf, args: [--port, 1]}\n", ":2:", "--port is set by the manager");
    expect_error("models: {name: a}\n", "m.yaml:1:", "must be a list");
    expect_error("models:\n  - just-a-path.gguf\n", "m.yaml:2:", "must be a mapping");
    expect_error("server: {port: 99999}\nmodels:\n  - {name: a, path: x.gguf}\n", "m.yaml:1:", "server.port");
    expect_error("server: {threads: 1, tls: on}\nmodels:\n  - {name: a, path: x.gguf}\n", "m.yaml:1:",
                 "unknown key 'tls'");
    expect_error("modles:\n  - {name: a, path: x.gguf}\n", "m.yaml:1:", "unknown key 'modles'");
    expect_error("models:\n  - {name: a, path: x.gguf}\nauth: {admin_keys: ['']}\n", "m.yaml:3:", "admin_keys");
    expect_error("models: [\n", "m.yaml:", "YAML");
    expect_error("memory_budget: 1GiB\n", "", "no models");
}

static void test_config_flags_over_the_file_and_models_dir(void **state)
{
    (void)state;
    char dir[] = "/tmp/wafer-test-models-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[512];
    static const char *const files[] = {"b.gguf", "a.gguf", "notes.txt", ".hidden.gguf"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/m.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "keep_alive: 5m\nmodels:\n  - {name: a, path: sub/own.gguf}\n");
    fclose(f);
    char *argv[] = {"serve", "--config", path, "--models-dir", dir, "--keep-alive", "-1", "--memory-budget=2GiB",
                    "--admin-key", "k1", "--admin-key", "k2", NULL};
    struct route_models_config c;
    route_models_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(route_models_config_from_args(&c, 12, argv, err), 0);
    assert_int_equal(c.n_models, 2); /* a from the file (kept), b from the folder; no .txt, no hidden file */
    assert_string_equal(c.models[0].name, "a");
    char want[600];
    snprintf(want, sizeof want, "%s/sub/own.gguf", dir); /* relative to the config file */
    assert_string_equal(c.models[0].path, want);
    assert_string_equal(c.models[1].name, "b");
    assert_true(c.keep_alive == -1);
    assert_int_equal(c.memory_budget, (int64_t)2 << 30);
    assert_int_equal(c.n_admin_keys, 2);
    assert_true(route_models_file_has_models(path));
    route_models_config_deinit(&c);

    char *bad[] = {"serve", "--models-dir", dir, "--model", "x.gguf", NULL};
    route_models_config_init(&c);
    assert_int_equal(route_models_config_from_args(&c, 5, bad, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--model"));
    route_models_config_deinit(&c);

    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/m.yaml", dir);
    assert_false(route_models_file_has_models("/nonexistent.yaml"));
    unlink(path);
    rmdir(dir);
}

/* ---- eviction -------------------------------------------------------------------------------------- */

static void test_plan_least_recently_used_idle_first(void **state)
{
    (void)state;
    /* three resident models of 10, a fourth of 10 wanted, budget 30: one must go, the oldest idle one */
    struct route_models_slot s[4] = {
        {.bytes = 10, .last_used = 300, .resident = true},
        {.bytes = 10, .last_used = 100, .resident = true, .busy = true}, /* the oldest, but busy */
        {.bytes = 10, .last_used = 200, .resident = true},
        {.bytes = 10, .last_used = 0},
    };
    int ev[4], n = -1;
    assert_int_equal(route_models_plan_evict(s, 4, 3, 30, 0, ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0], 2);
    /* a bigger one needs two gone: 2, then 0 */
    s[3].bytes = 20;
    assert_int_equal(route_models_plan_evict(s, 4, 3, 30, 0, ev, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0], 2);
    assert_int_equal(ev[1], 0);
    /* only the busy one could make room: nothing is chosen */
    s[3].bytes = 30;
    assert_int_equal(route_models_plan_evict(s, 4, 3, 30, 0, ev, &n), ERR_UNAVAILABLE);
    assert_int_equal(n, 0);
    /* over the whole budget */
    s[3].bytes = 31;
    assert_int_equal(route_models_plan_evict(s, 4, 3, 30, 0, ev, &n), ERR_TOO_LARGE);
    /* no budget: nothing to evict */
    assert_int_equal(route_models_plan_evict(s, 4, 3, 0, 0, ev, &n), 0);
    assert_int_equal(n, 0);
}

static void test_plan_max_loaded_and_non_residents(void **state)
{
    (void)state;
    struct route_models_slot s[4] = {
        {.bytes = 1, .last_used = 50, .resident = true},
        {.bytes = 1, .last_used = 10, .resident = false}, /* unloaded: neither counted nor chosen */
        {.bytes = 1, .last_used = 40, .resident = true},
        {.bytes = 1},
    };
    int ev[4], n = -1;
    assert_int_equal(route_models_plan_evict(s, 4, 3, 0, 3, ev, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(route_models_plan_evict(s, 4, 3, 0, 2, ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ev[0], 2);
    assert_int_equal(route_models_plan_evict(s, 4, 3, 0, 1, ev, &n), 0);
    assert_int_equal(n, 2);
    /* both budget and count: the count needs one out, the bytes two */
    s[3].bytes = 2;
    assert_int_equal(route_models_plan_evict(s, 4, 3, 3, 2, ev, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(route_models_plan_evict(s, 4, 3, 2, 3, ev, &n), 0);
    assert_int_equal(n, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_issue_example),
        cmocka_unit_test(test_config_errors_name_file_and_line),
        cmocka_unit_test(test_config_flags_over_the_file_and_models_dir),
        cmocka_unit_test(test_plan_least_recently_used_idle_first),
        cmocka_unit_test(test_plan_max_loaded_and_non_residents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
