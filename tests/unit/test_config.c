/* Tests for the serve configuration: YAML layout, flag overrides, and errors that name file:line and key. */
#include "testutil.h"

#include "core/alert.h"
#include "core/err.h"
#include "core/flags.h"
#include "server/config.h"

#include <stdio.h>
#include <string.h>

static const char full_yaml[] = "# example\n"
                                "model:\n"
                                "  name: stories\n"
                                "  path: models/s.gguf\n"
                                "  aliases: [gpt-3.5-turbo, tiny]\n"
                                "  chat_template: chatml\n"
                                "  mmap: true\n"
                                "server:\n"
                                "  host: 0.0.0.0\n"
                                "  port: 9090\n"
                                "  max_batch_size: 8\n"
                                "  max_queue: 5\n"
                                "  request_timeout: 500ms\n"
                                "  kv_memory: 64MiB\n"
                                "generation:\n"
                                "  max_new_tokens: 77\n"
                                "  temperature: 0.5\n"
                                "  top_p: 0.9\n"
                                "auth:\n"
                                "  api_keys:\n"
                                "    - sk-one\n"
                                "cors:\n"
                                "  origins: '*'\n";

static void test_yaml_full(void **state)
{
    (void)state;
    struct server_config c;
    server_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(server_config_load_string(&c, full_yaml, strlen(full_yaml), "w.yaml", err), 0);
    assert_string_equal(c.model_name, "stories");
    assert_string_equal(c.model_path, "models/s.gguf");
    assert_int_equal(c.n_aliases, 2);
    assert_string_equal(c.aliases[1], "tiny");
    assert_string_equal(c.chat_template, "chatml");
    assert_true(c.use_mmap);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9090);
    assert_int_equal(c.max_batch_size, 8);
    assert_int_equal(c.max_queue, 5);
    assert_true(c.request_timeout > 0.499 && c.request_timeout < 0.501);
    assert_int_equal(c.kv_memory, 64 << 20);
    assert_int_equal(c.max_new_tokens, 77);
    assert_true(c.temperature == 0.5f);
    assert_int_equal(c.n_api_keys, 1);
    assert_string_equal(c.api_keys[0], "sk-one");
    assert_int_equal(c.n_cors_origins, 1);
    assert_string_equal(c.cors_origins[0], "*");
    assert_string_equal(c.model_path_origin, "w.yaml:4: model.path");
    server_config_deinit(&c);
}

static void expect_yaml_error(const char *yaml, int code, const char *needle)
{
    struct server_config c;
    server_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    int rc = server_config_load_string(&c, yaml, strlen(yaml), "bad.yaml", err);
    if (rc != code || !strstr(err, needle))
        print_error("yaml %s -> rc %d, err '%s' (wanted %d, '%s')\n", yaml, rc, err, code, needle);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err, needle));
    server_config_deinit(&c);
}

static void test_yaml_errors(void **state)
{
    (void)state;
    expect_yaml_error("server:\n  port: 99999\n", ERR_INVALID_ARG, "bad.yaml:2: server.port: '99999'");
    expect_yaml_error("server:\n  port: eighty\n", ERR_INVALID_ARG, "bad.yaml:2: server.port");
    expect_yaml_error("server:\n  host: a\n  sever_port: 1\n", ERR_INVALID_ARG,
                      "bad.yaml:3: unknown key 'sever_port' in section 'server'");
    expect_yaml_error("model:\n  path: a\nmodle:\n  x: 1\n", ERR_INVALID_ARG, "bad.yaml:3: unknown section 'modle'");
    expect_yaml_error("generation:\n  temperature: -1\n", ERR_INVALID_ARG, "bad.yaml:2: generation.temperature");
    expect_yaml_error("server:\n  port: [1, 2]\n", ERR_INVALID_ARG, "server.port: must be a single value");
    expect_yaml_error("server: 3\n", ERR_INVALID_ARG, "bad.yaml:1: server: must be a mapping");
    expect_yaml_error("server:\n  port: 1\n   host: [\n", ERR_FORMAT, "bad.yaml:");
    expect_yaml_error("server:\n  kv_memory: lots\n", ERR_INVALID_ARG, "server.kv_memory: 'lots' is not a size");
    expect_yaml_error("- a\n- b\n", ERR_INVALID_ARG, "top level must be a mapping");
}

static void test_flags_override(void **state)
{
    (void)state;
    const char *path = test_tmp_path("w.yaml");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(full_yaml, f);
    fclose(f);
    const char *keyfile = test_tmp_path("keys.txt");
    f = fopen(keyfile, "w");
    assert_non_null(f);
    fputs("# keys\nsk-file-a\n\n  sk-file-b  \n", f);
    fclose(f);

    struct server_config c;
    server_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    char *argv[] = {"serve", "--port", "1234", "--config", (char *)path, "--model-alias", "x", "--model-alias=y",
                    "--api-key-file", (char *)keyfile, "--max-batch-size", "3", "--mmap", "false"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    int rc = server_config_from_args(&c, argc, argv, err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(c.port, 1234);         /* flag beats file even before --config */
    assert_int_equal(c.max_batch_size, 3);
    assert_false(c.use_mmap);               /* --mmap false beats the file's model.mmap: true */
    assert_int_equal(c.max_queue, 5);       /* from file */
    assert_int_equal(c.n_aliases, 2);       /* flags replaced the file's list */
    assert_string_equal(c.aliases[0], "x");
    assert_string_equal(c.aliases[1], "y");
    assert_int_equal(c.n_api_keys, 3);      /* file's key + two from the key file */
    assert_string_equal(c.api_keys[2], "sk-file-b");
    /* relative model path resolved against the config's directory */
    char want[1024];
    snprintf(want, sizeof want, "%.*s/models/s.gguf", (int)(strrchr(path, '/') - path), path);
    assert_string_equal(c.model_path, want);
    server_config_deinit(&c);

    server_config_init(&c);
    char *argv2[] = {"serve", "--port", "-3", "--model", "m.gguf"};
    assert_int_equal(server_config_from_args(&c, 5, argv2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--port: '-3'"));
    server_config_deinit(&c);

    server_config_init(&c);
    char *argv3[] = {"serve", "--bogus", "1"};
    assert_int_equal(server_config_from_args(&c, 3, argv3, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "unknown option '--bogus'"));
    server_config_deinit(&c);

    server_config_init(&c);
    char *argv4[] = {"serve", "--port", "8081"};
    assert_int_equal(server_config_from_args(&c, 3, argv4, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "no model"));
    server_config_deinit(&c);

    server_config_init(&c);
    char *argv5[] = {"serve", "--config", "/nonexistent/w.yaml"};
    assert_int_equal(server_config_from_args(&c, 3, argv5, err), ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/w.yaml"));
    server_config_deinit(&c);
}

/* The observability sections: alerts (its own grammar, errors with file:line), slo, cost, energy, and
 * max_batch_size: auto, which needs a latency target. */
static void test_observability(void **state)
{
    (void)state;
    static const char y[] = "model:\n  path: m.gguf\n"
                            "server:\n  max_batch_size: auto\n"
                            "slo: {itl_p95_ms: 50, window_s: 5s, max_batch_size: 24}\n"
                            "cost: {per_hour: 1.20}\n"
                            "energy: {rapl: false, watts: 250}\n"
                            "alerts:\n"
                            "  interval_s: 2\n"
                            "  data_dir: state\n"
                            "  rules:\n"
                            "    - {name: HighTTFT, measure: ttft_p95_ms, window_s: 60, op: '>', threshold: 1000}\n"
                            "  receivers:\n"
                            "    - {name: ops, kind: webhook, url: 'http://alerts.internal:9000/hook'}\n";
    const char *path = test_tmp_path("obs.yaml");
    FILE *f = fopen(path, "w");
    fputs(y, f);
    fclose(f);
    struct server_config c;
    server_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    char *argv[] = {"serve", "--config", (char *)path};
    int rc = server_config_from_args(&c, 3, argv, err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_true(c.batch_auto);
    assert_int_equal(c.max_batch_size, 24); /* auto: the controller's largest batch are the slots */
    assert_true(c.slo_itl_p95_ms == 50);
    assert_true(c.slo_window_s == 5);
    assert_true(c.cost_per_hour == 1.2);
    assert_false(c.energy_rapl);
    assert_true(c.energy_watts == 250);
    assert_non_null(c.alerts);
    assert_int_equal(c.alerts->n_rules, 1);
    assert_true(c.alerts->interval_s == 2);
    assert_non_null(strstr(c.alerts->data_dir, "/state")); /* relative to the file */
    assert_int_equal(c.alerts->n_receivers, 1);
    server_config_deinit(&c);

    /* auto without a target */
    server_config_init(&c);
    char *argv2[] = {"serve", "--model", "m.gguf", "--max-batch-size", "auto"};
    assert_int_equal(server_config_from_args(&c, 5, argv2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "auto needs a latency target"));
    server_config_deinit(&c);
    /* a flag sets the target */
    server_config_init(&c);
    char *argv3[] = {"serve", "--model", "m.gguf", "--max-batch-size", "auto", "--slo-itl-p95-ms", "20"};
    assert_int_equal(server_config_from_args(&c, 7, argv3, err), 0);
    assert_int_equal(c.max_batch_size, 32);
    server_config_deinit(&c);

    expect_yaml_error("alerts:\n  rules:\n    - name: X\n      measure: ttft_p95\n      threshold: 1\n", ERR_INVALID_ARG,
                      "bad.yaml:4: alerts.rules[0].measure: unknown measure 'ttft_p95'");
    expect_yaml_error("slo:\n  itl_p95: 3\n", ERR_INVALID_ARG, "bad.yaml:2: unknown key 'itl_p95' in section 'slo'");
    expect_yaml_error("cost:\n  per_hour: -1\n", ERR_INVALID_ARG, "bad.yaml:2: cost.per_hour: '-1' is not a number");
    expect_yaml_error("server:\n  max_batch_size: lots\n", ERR_INVALID_ARG, "server.max_batch_size: 'lots'");
}

/* The reliability settings: defaults, bounds, and keys no client could send refused at start. */
static void test_reliability_settings(void **state)
{
    (void)state;
    struct server_config c;
    char err[ERR_MSG_MAX] = "";
    server_config_init(&c);
    char *ok[] = {"serve", "--model", "m.gguf", "--workers", "3", "--max-response", "8MiB", "--max-inflight", "64MiB",
                  "--parse-special", "true", "--log-level", "debug", "--api-key", "sk-1"};
    assert_int_equal(server_config_from_args(&c, (int)(sizeof ok / sizeof ok[0]), ok, err), 0);
    assert_int_equal(c.workers, 3);
    assert_int_equal(c.max_response, 8 << 20);
    assert_int_equal(c.max_inflight, 64 << 20);
    assert_true(c.parse_special);
    assert_string_equal(c.log_level, "debug");
    assert_int_equal(c.argc, (int)(sizeof ok / sizeof ok[0])); /* kept for SIGHUP */
    assert_true(c.argv == ok);
    server_config_deinit(&c);

    server_config_init(&c);
    assert_int_equal(c.workers, 2);
    assert_int_equal(c.max_response, 0); /* sized for the context when the model is loaded */
    assert_int_equal(c.max_inflight, (int64_t)256 << 20);
    assert_false(c.parse_special);
    server_config_deinit(&c);

    static const struct {
        const char *flag, *value, *want;
    } bad[] = {
        {"--api-key", "   ", "key 1 of 1 is empty or only whitespace"},
        {"--api-key", "\t", "key 1 of 1 is empty or only whitespace"},
        {"--api-key", " sk-x", "leading or trailing whitespace"},
        {"--api-key", "sk-x\n", "control character"},
        {"--log-level", "loud", "not one of error, warn, info, debug"},
        {"--max-response", "1000", "at least 64KiB"},
        {"--max-inflight", "1MiB", "must be at least server.max_body"},
        {"--workers", "0", "--workers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        server_config_init(&c);
        char *argv[] = {"serve", "--model", "m.gguf", (char *)bad[i].flag, (char *)bad[i].value};
        assert_int_equal(server_config_from_args(&c, 5, argv, err), ERR_INVALID_ARG);
        if (!strstr(err, bad[i].want))
            fail_msg("%s '%s': %s", bad[i].flag, bad[i].value, err);
        if (!strcmp(bad[i].flag, "--api-key"))
            assert_null(strstr(err, "sk-x")); /* a key is a secret: never in a message */
        server_config_deinit(&c);
    }
}

static void test_bytes(void **state)
{
    (void)state;
    int64_t b;
    assert_int_equal(flags_bytes_parse("512MiB", &b), 0);
    assert_int_equal(b, 512LL << 20);
    assert_int_equal(flags_bytes_parse("2G", &b), 0);
    assert_int_equal(b, 2LL << 30);
    assert_int_equal(flags_bytes_parse("1.5KB", &b), 0);
    assert_int_equal(b, 1500);
    assert_int_equal(flags_bytes_parse("12", &b), 0);
    assert_int_equal(b, 12);
    assert_int_equal(flags_bytes_parse("-1", &b), ERR_INVALID_ARG);
    assert_int_equal(flags_bytes_parse("3 parsecs", &b), ERR_INVALID_ARG);
    assert_int_equal(flags_bytes_parse("", &b), ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yaml_full),
        cmocka_unit_test(test_yaml_errors),
        cmocka_unit_test(test_flags_override),
        cmocka_unit_test(test_reliability_settings),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_observability),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
