/* Tests for src/pull: SHA-256 against Python hashlib's digests (block-boundary lengths, streamed in odd
 * pieces, and over a file), the spec grammar, quantization matching, the file picker, and the models
 * directory (find, list, remove) on a temporary folder. The network side is tested end to end
 * (tests/e2e/test_pull.py, against a stand-in of the hub). */
#include "testutil.h"

#include "core/err.h"
#include "pull/hub.h"
#include "pull/pull.h"
#include "pull/sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* bytes (i * 7 + 1) & 255, i < n (what the Python one-liner hashed) */
static unsigned char *pull_pattern(size_t n)
{
    unsigned char *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)((i * 7 + 1) & 255);
    return b;
}

static void test_sha256_vectors(void **state)
{
    (void)state;
    static const struct {
        size_t n;
        const char *hex;
    } v[] = {
        {0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {55, "16fa57a0a3423a715d594516339f36189d6b5f93754a9714fef202616a9fabfe"},
        {56, "c37b44e5f1b18554b36966f4f8e08bfbf3164c4b6c10374d12d89850892073c5"},
        {63, "bbba992d2c85af960fb2987a1fd05e0aa82a3db3c740dd8982a9e273b75e36a3"},
        {64, "66bd4633ed6f71c4ecfa4763bf7ba1c8ec7612de9aa6c0578a7b675207c71e0b"},
        {65, "9f7dc47107b750a1f3d35db5d9547f24ef40da5b731b9540d4f43710a154f6c9"},
        {119, "a3ed307b730fa77c07531300c6e4a282330011d4d4caf6bb7b63ae05950f4b66"},
        {120, "8e3b15d9fea7472655aa069620b7f8c2e55ee1499f763200a7515fe826e99d20"},
        {1000000, "3e09ea0325eac97fc9e340fb7d60852b80c357fc45fb55557cd34a1ab2742492"},
    };
    char hex[65];
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, "abc", 3);
    sha256_final_hex(&s, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        unsigned char *b = pull_pattern(v[i].n);
        sha256_init(&s);
        sha256_update(&s, b, v[i].n);
        sha256_final_hex(&s, hex);
        assert_string_equal(hex, v[i].hex);
        /* the same bytes in pieces of 1, 2, ..., 70 bytes */
        sha256_init(&s);
        for (size_t off = 0, k = 1; off < v[i].n; off += k, k = k % 70 + 1)
            sha256_update(&s, b + off, off + k <= v[i].n ? k : v[i].n - off);
        sha256_final_hex(&s, hex);
        assert_string_equal(hex, v[i].hex);
        free(b);
    }
    /* over a file */
    const char *path = test_tmp_path("sha.bin");
    unsigned char *b = pull_pattern(1000000);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, 1000000, f), 1000000);
    fclose(f);
    free(b);
    char err[ERR_MSG_MAX];
    assert_int_equal(sha256_file(path, hex, NULL, NULL, err), 0);
    assert_string_equal(hex, v[8].hex);
    assert_int_equal(sha256_file(test_tmp_path("missing.bin"), hex, NULL, NULL, err), ERR_IO);
}

static void test_spec_parse(void **state)
{
    (void)state;
    struct hub_spec s;
    char err[ERR_MSG_MAX];
    assert_int_equal(hub_spec_parse("TheBloke/Llama-2-7B-GGUF:Q4_K_M", &s, err), 0);
    assert_string_equal(s.repo, "TheBloke/Llama-2-7B-GGUF");
    assert_string_equal(s.quant, "Q4_K_M");
    assert_string_equal(s.file, "");
    assert_string_equal(s.revision, "main");
    assert_int_equal(hub_spec_parse("hf://owner/repo.name/sub/dir/model-q8_0.GGUF", &s, err), 0);
    assert_string_equal(s.repo, "owner/repo.name");
    assert_string_equal(s.file, "sub/dir/model-q8_0.GGUF");
    assert_string_equal(s.quant, "");
    assert_int_equal(hub_spec_parse("owner/repo@v1.0:q6_k", &s, err), 0);
    assert_string_equal(s.revision, "v1.0");
    assert_string_equal(s.quant, "q6_k");
    assert_int_equal(hub_spec_parse("owner/repo", &s, err), 0);
    assert_string_equal(s.quant, "");
    static const char *const bad[] = {
        "",  "repo", "owner/", "/repo", "owner//x.gguf", "owner/repo:", "owner/repo/../x.gguf",
        "owner/repo/a/./b.gguf", "owner/repo/readme.md", "own er/repo", "owner/repo:Q4 K", "owner/repo@",
        "owner/repo@a/b:Q4", "owner/repo/x.gguf:Q4", "../repo:Q4", "owner/..:Q4", "hf://owner/repo extra",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (hub_spec_parse(bad[i], &s, err) != ERR_INVALID_ARG)
            fail_msg("'%s' was accepted", bad[i]);
        assert_true(strlen(err) > 10);
    }
}

static void test_quant_matches(void **state)
{
    (void)state;
    assert_true(hub_quant_matches("llama-2-7b.Q4_K_M.gguf", "q4_k_m"));
    assert_true(hub_quant_matches("Llama-3-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"));
    assert_true(hub_quant_matches("sub/dir/model-f16.gguf", "F16"));
    assert_true(hub_quant_matches("Q8_0/model-Q8_0.gguf", "q8_0"));
    assert_false(hub_quant_matches("llama-2-7b.Q4_K_M.gguf", "Q4_K"));  /* a prefix of a longer quant */
    assert_false(hub_quant_matches("model-BF16.gguf", "F16"));          /* inside a longer token */
    assert_false(hub_quant_matches("model-Q4_K_S.gguf", "Q4_K_M"));
    assert_false(hub_quant_matches("Q8_0/model.gguf", "Q8_0"));         /* only the file name counts */
    assert_false(hub_quant_matches("model.gguf", "gguf"));              /* nor the extension */
}

static void test_pick_file(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct hub_spec s;
    const char *const repo[] = {"README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-f16.gguf",
                                "m-F16-00001-of-00002.gguf", "m-F16-00002-of-00002.gguf", "m-Q4_K_S.gguf"};
    int n = sizeof repo / sizeof repo[0];
    assert_int_equal(hub_spec_parse("o/r:q8_0", &s, err), 0);
    assert_int_equal(hub_pick_file(&s, repo, n, err), 2);
    assert_int_equal(hub_spec_parse("o/r", &s, err), 0); /* several: the Q4_K_M one, as llama.cpp */
    assert_int_equal(hub_pick_file(&s, repo, n, err), 1);
    assert_int_equal(hub_spec_parse("o/r:Q5_K_M", &s, err), 0);
    assert_int_equal(hub_pick_file(&s, repo, n, err), ERR_NOT_FOUND);
    assert_non_null(strstr(err, "m-Q8_0.gguf"));      /* lists what there is */
    assert_null(strstr(err, "mmproj"));               /* but not projectors */
    assert_int_equal(hub_spec_parse("o/r:F16", &s, err), 0);
    assert_int_equal(hub_pick_file(&s, repo, n, err), ERR_UNSUPPORTED); /* only in parts */
    assert_non_null(strstr(err, "split"));
    const char *const twins[] = {"a-Q4_K_M.gguf", "b-q4_k_m.gguf", "c-Q8_0.gguf"};
    assert_int_equal(hub_spec_parse("o/r:Q4_K_M", &s, err), 0);
    assert_int_equal(hub_pick_file(&s, twins, 3, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "a-Q4_K_M.gguf"));
    assert_non_null(strstr(err, "b-q4_k_m.gguf"));
    const char *const one[] = {"README.md", "only.gguf"};
    assert_int_equal(hub_spec_parse("o/r", &s, err), 0);
    assert_int_equal(hub_pick_file(&s, one, 2, err), 1);
    const char *const none[] = {"README.md"};
    assert_int_equal(hub_pick_file(&s, none, 1, err), ERR_NOT_FOUND);
    const char *const no_default[] = {"x-Q8_0.gguf", "x-Q6_K.gguf"};
    assert_int_equal(hub_pick_file(&s, no_default, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, ":QUANT"));
}

static void pull_touch(const char *dir, const char *rel, const char *content)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path)
        fail_msg("path too long: %s/%s", dir, rel);
    test_write_file(path, content);
}

static void test_models_dir(void **state)
{
    (void)state;
    char dir[4096], err[ERR_MSG_MAX];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("models"));
    mkdir(dir, 0755);
    pull_touch(dir, "o/r/m-Q4_K_M.gguf", "GGUF-not-really");
    pull_touch(dir, "o/r/m-Q8_0.gguf", "GGUF");
    pull_touch(dir, "o/r@dev/m-Q8_0.gguf", "GGUF");
    pull_touch(dir, "o/other/sub/x.gguf", "GGUF");
    pull_touch(dir, "o/r/notes.txt", "not a model");
    pull_touch(dir, ".downloads/abc.part", "12345");
    struct hub_spec s;
    char *path;
    assert_int_equal(hub_spec_parse("o/r:q8_0", &s, err), 0);
    assert_int_equal(pull_find_local(dir, &s, &path, err), 0);
    assert_non_null(strstr(path, "/o/r/m-Q8_0.gguf"));
    free(path);
    assert_int_equal(hub_spec_parse("o/r@dev:q8_0", &s, err), 0);
    assert_int_equal(pull_find_local(dir, &s, &path, err), 0);
    assert_non_null(strstr(path, "/o/r@dev/m-Q8_0.gguf"));
    free(path);
    assert_int_equal(hub_spec_parse("o/r:q6_k", &s, err), 0);
    assert_int_equal(pull_find_local(dir, &s, &path, err), ERR_NOT_FOUND);
    assert_int_equal(hub_spec_parse("o/missing:q8_0", &s, err), 0);
    assert_int_equal(pull_find_local(dir, &s, &path, err), ERR_NOT_FOUND);
    assert_int_equal(hub_spec_parse("o/other/sub/x.gguf", &s, err), 0);
    assert_int_equal(pull_find_local(dir, &s, &path, err), 0);
    free(path);

    struct pull_entry *es;
    int n, n_part;
    int64_t part_bytes;
    assert_int_equal(pull_list(dir, &es, &n, &part_bytes, &n_part, err), 0);
    assert_int_equal(n, 4);
    assert_string_equal(es[0].name, "o/other/sub/x.gguf");
    assert_string_equal(es[1].name, "o/r/m-Q4_K_M.gguf");
    assert_string_equal(es[3].name, "o/r@dev/m-Q8_0.gguf");
    assert_int_equal(es[1].size, 15);
    assert_string_equal(es[1].quant, "?"); /* not a readable GGUF header */
    assert_int_equal(n_part, 1);
    assert_int_equal(part_bytes, 5);
    pull_entries_free(es, n);
    assert_int_equal(pull_list(test_tmp_path("no-models-here"), &es, &n, &part_bytes, &n_part, err), 0);
    assert_int_equal(n, 0); /* a missing directory is an empty list */
    assert_int_equal(n_part, 0);
    pull_entries_free(es, n);

    char *removed;
    assert_int_equal(pull_remove(dir, "o/other/sub/x.gguf", &removed, err), 0);
    free(removed);
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/o/other", dir);
    assert_int_not_equal(stat(p, &st), 0); /* its empty folders went with it */
    assert_int_equal(pull_remove(dir, "o/r:Q4_K_M", &removed, err), 0);
    assert_non_null(strstr(removed, "m-Q4_K_M.gguf"));
    free(removed);
    assert_int_equal(pull_remove(dir, "o/r:Q4_K_M", &removed, err), ERR_NOT_FOUND);
    assert_int_equal(pull_remove(dir, "../etc/passwd", &removed, err), ERR_NOT_FOUND);
    snprintf(p, sizeof p, "%s/o/r/notes.txt", dir);
    assert_int_equal(stat(p, &st), 0); /* rm never touches other files */
    int n_rm;
    int64_t bytes;
    assert_int_equal(pull_remove_partials(dir, &n_rm, &bytes, err), 0);
    assert_int_equal(n_rm, 1);
    assert_int_equal(bytes, 5);

    /* the default folder */
    setenv("WAFER_MODELS", "/srv/models/", 1);
    assert_int_equal(pull_models_dir(p, sizeof p, err), 0);
    assert_string_equal(p, "/srv/models");
    unsetenv("WAFER_MODELS");
    setenv("XDG_DATA_HOME", "/xdg", 1);
    assert_int_equal(pull_models_dir(p, sizeof p, err), 0);
    assert_string_equal(p, "/xdg/wafer/models");
    unsetenv("XDG_DATA_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(pull_models_dir(p, sizeof p, err), 0);
    assert_string_equal(p, "/home/u/.local/share/wafer/models");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors), cmocka_unit_test(test_spec_parse),
        cmocka_unit_test(test_quant_matches),  cmocka_unit_test(test_pick_file),
        cmocka_unit_test(test_models_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
