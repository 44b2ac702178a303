/*
 * Decode prefetch rules and the tune file (cpu_features.h, cpu_tune.h): the rule names round-trip; each type's
 * candidates start with the built-in rule and are distinct; a tuned rule is what the kernels are told and
 * clearing it gives the built-in one back; every rule gives the decode gemv of every type the same bits as
 * vec_dot (a rule may change how fast, never what); the tune file is written and read back, applied only on
 * the CPU and instruction set it names, all or nothing (an unknown rule sets none of the file's rules), with a
 * precise message for a missing, foreign or malformed file; its default path follows WAFER_TUNE_FILE,
 * XDG_CACHE_HOME and HOME. Kernel parts are skipped without AVX2 (and said so).
 */
#include "testutil.h"

#include "core/err.h"
#include "core/sysinfo.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/cpu_tune.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/dtype.h"
#include "engine/gguf/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void clear_tuned(void)
{
    for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++)
        cpu_decode_prefetch_set(cpu_decode_prefetch_types[i], -1);
}

/* cmocka setup and teardown: whatever a failed test before left tuned, cleared */
static int cleared(void **state)
{
    (void)state;
    clear_tuned();
    return 0;
}

static void test_names(void **state)
{
    (void)state;
    for (int r = 0; r < CPU_PREFETCH_COUNT; r++)
        assert_int_equal(cpu_prefetch_parse(cpu_prefetch_name(r)), r);
    assert_int_equal(cpu_prefetch_parse("fast"), -1);
    assert_int_equal(cpu_prefetch_parse(NULL), -1);
    assert_string_equal(cpu_prefetch_name(CPU_PREFETCH_COUNT), "?");
    assert_string_equal(cpu_prefetch_name(-1), "?");
}

static void test_candidates_and_set(void **state)
{
    (void)state;
    assert_false(cpu_decode_prefetch_env()); /* the tests run without the overrides */
    enum cpu_prefetch c[CPU_PREFETCH_COUNT];
    assert_int_equal(cpu_decode_prefetch_candidates(DTYPE_Q4_1, c), 0);
    assert_int_equal(cpu_decode_prefetch(DTYPE_Q4_1), CPU_PREFETCH_EVERY);
    if (!kernel_cpu_has_avx2()) {
        assert_int_equal(cpu_decode_prefetch_candidates(DTYPE_Q4_0, c), 0);
        print_message("no AVX2: no rules to choose among (skipped the rest)\n");
        return;
    }
    for (int i = 0; i < CPU_PREFETCH_N_TYPES; i++) {
        enum dtype t = cpu_decode_prefetch_types[i];
        int k = cpu_decode_prefetch_candidates(t, c);
        assert_true(k >= 2 && k <= CPU_PREFETCH_COUNT);
        /* F16: streams prefetched into L1, with NTA or not at all, rows; the quantized types: every, sparse, and with
         * AVX-512 NTA, and the K-quants spread over their kernel (AVX-512: into L1), two groups side by side
         * (AVX-512: Q4_0 / Q8_0 / Q4_K; AVX2: Q4_0 / Q8_0) */
        assert_int_equal(k, t == DTYPE_F16 ? 4 : !gemv_cpu_has_avx512() ? 3 : t == DTYPE_Q4_K ? 5 : 4);
        assert_int_equal(c[0], cpu_decode_prefetch_builtin(t));
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++)
                assert_int_not_equal(c[a], c[b]);
        assert_int_equal(cpu_decode_prefetch_tuned(t), -1);
        assert_int_equal(cpu_decode_prefetch(t), cpu_decode_prefetch_builtin(t));
        for (int a = 0; a < k; a++) {
            cpu_decode_prefetch_set(t, c[a]);
            assert_int_equal(cpu_decode_prefetch_tuned(t), c[a]);
            assert_int_equal(cpu_decode_prefetch(t), c[a]);
        }
        cpu_decode_prefetch_set(t, -1);
        assert_int_equal(cpu_decode_prefetch_tuned(t), -1);
        assert_int_equal(cpu_decode_prefetch(t), cpu_decode_prefetch_builtin(t));
    }
}

/* Every rule, on every kernel set this CPU runs (the best set, AVX2 alone, AVX2 with AVX-VNNI): the decode gemv
 * (R16 gemv16 where the type has one, else the rows gemv) of nr rows x n gives exactly vec_dot's bits for every
 * row. Every rule, not only the candidates of the instruction set in use, so that the AVX2 kernels' TWIN and
 * SPREAD paths run on CPUs with AVX-512 too (a rule a kernel does not know reads as EVERY). 5 groups of 16 rows
 * (TWIN pairs two and leaves one alone), and for Q4_0 / Q8_0 also rows of an odd number of blocks (the
 * gemv16's lone last block). Each rule with the AVX-512 K-quants' spread prefetch into L1 and into L2
 * (WAFER_SPREAD_HINT, cpu_kquant_spread_l2: their own instances of the kernels). */
static void test_rules_same_bits(void **state)
{
    (void)state;
    if (!kernel_cpu_has_avx2()) {
        print_message("no AVX2: skipped\n");
        return;
    }
    const struct gemv_ops *(*const sets[])(enum dtype) = {gemv_ops_best, gemv_ops_avx2, gemv_ops_avx2_vnni};
    uint64_t seed = 0x5eed7u;
    const int nr = 80;
    int runs = 0;
    for (int i = 0; i < 2 * CPU_PREFETCH_N_TYPES; i++) {
        enum dtype t = cpu_decode_prefetch_types[i / 2];
        const bool odd = i % 2;
        if (odd && t != DTYPE_Q4_0 && t != DTYPE_Q8_0)
            continue;
        const struct kernel_ops *ko = kernel_ops_get(t);
        assert_non_null(gemv_ops_best(t));
        assert_non_null(ko);
        /* long enough rows that every prefetch distance (up to 32 KiB ahead) falls inside the matrix */
        int64_t n = t == DTYPE_F16 ? 2048 : odd ? 4096 + 32 : 4096;
        size_t rb = dtype_row_bytes(t, n), xb = dtype_row_bytes(ko->vec_type, n);
        float *f = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * nr);
        float *ref = malloc(sizeof(float) * nr);
        uint8_t *w = malloc(rb * nr), *x = malloc(xb);
        assert_non_null(f);
        assert_non_null(y);
        assert_non_null(ref);
        assert_non_null(w);
        assert_non_null(x);
        for (int r = 0; r < nr; r++) {
            for (int64_t k = 0; k < n; k++)
                f[k] = test_rand_f32(&seed) * (1 + (float)(r % 3));
            assert_int_equal(quant_row_from_f32(t, f, w + (size_t)r * rb, n), 0);
        }
        for (int64_t k = 0; k < n; k++)
            f[k] = test_rand_f32(&seed);
        ko->from_f32(f, x, n);
        for (int r = 0; r < nr; r++)
            ko->vec_dot(n, &ref[r], w + (size_t)r * rb, x);
        uint8_t *w16 = quant_r16_supported(t) ? test_r16_of(t, w, rb, nr, n) : NULL;
        for (size_t s = 0; s < sizeof(sets) / sizeof(sets[0]); s++) {
            const struct gemv_ops *g = sets[s](t);
            if (!g)
                continue;
            uint8_t *aux = aligned_alloc(64, (g->aux_bytes(n) + 64) & ~(size_t)63);
            assert_non_null(aux);
            bool r16 = g->gemv16 && w16;
            for (int a = 0; a < 2 * CPU_PREFETCH_COUNT; a++, runs++) {
                cpu_decode_prefetch_set(t, a / 2);
                setenv("WAFER_SPREAD_HINT", a % 2 ? "l2" : "l1", 1);
                assert_int_equal(cpu_kquant_spread_l2(), a % 2);
                memset(y, 0xff, sizeof(float) * nr);
                g->prep(n, x, aux);
                if (r16)
                    g->gemv16(n, nr, y, w16, x, aux);
                else
                    g->gemv(n, nr, y, w, rb, x, aux);
                for (int r = 0; r < nr; r++)
                    if (memcmp(&y[r], &ref[r], sizeof(float)))
                        fail_msg("%s n %d set %d rule %s (spread into L%d) row %d: %.9g, vec_dot %.9g", dtype_name(t),
                                 (int)n, (int)s, cpu_prefetch_name(a / 2), 1 + a % 2, r, (double)y[r], (double)ref[r]);
            }
            free(aux);
        }
        cpu_decode_prefetch_set(t, -1);
        unsetenv("WAFER_SPREAD_HINT");
        assert_int_equal(cpu_kquant_spread_l2(), !cpu_is_amd()); /* the built-in choice */
        free(f);
        free(y);
        free(ref);
        free(w);
        free(w16);
        free(x);
    }
    print_message("%d (type, kernel set, rule) runs\n", runs);
    assert_true(runs >= 14 * CPU_PREFETCH_COUNT); /* at least the best set for each type and row length */
}

static void test_file_round_trip(void **state)
{
    (void)state;
    char path[400], msg[ERR_MSG_MAX], d[256];
    if (!kernel_cpu_has_avx2()) {
        print_message("no AVX2: skipped\n");
        return;
    }
    /* a folder that does not exist yet: cpu_tune_write makes it */
    snprintf(path, sizeof path, "%s", test_tmp_path("round_trip/a/b/tune.json"));
    int rules[DTYPE_COUNT];
    for (int t = 0; t < DTYPE_COUNT; t++)
        rules[t] = -1;
    enum cpu_prefetch c[CPU_PREFETCH_COUNT];
    /* a rule other than the built-in one where there is one, so applying it shows */
    cpu_decode_prefetch_candidates(DTYPE_Q4_K, c);
    rules[DTYPE_Q4_K] = c[1];
    cpu_decode_prefetch_candidates(DTYPE_F16, c);
    rules[DTYPE_F16] = c[1];
    assert_int_equal(cpu_tune_write(path, rules, 2, "{\"q4_k\":{\"every\":1.5}}", msg), 0);
    assert_int_not_equal(access(path, R_OK), -1);
    assert_int_equal(cpu_tune_apply_file(path, msg), 1);
    assert_int_equal(cpu_decode_prefetch(DTYPE_Q4_K), rules[DTYPE_Q4_K]);
    assert_int_equal(cpu_decode_prefetch(DTYPE_F16), rules[DTYPE_F16]);
    assert_int_equal(cpu_decode_prefetch_tuned(DTYPE_Q4_0), -1); /* not in the file: built-in */
    assert_non_null(strstr(cpu_tune_source(), path));
    cpu_tune_describe(d, sizeof d);
    assert_non_null(strstr(d, "q4_k "));
    assert_non_null(strstr(d, cpu_prefetch_name(rules[DTYPE_Q4_K])));
    clear_tuned();
    /* figures that are not JSON are refused before anything is written */
    assert_int_equal(cpu_tune_write(path, rules, 2, "{not json", msg), ERR_INVALID_ARG);
}

static void test_file_refusals(void **state)
{
    (void)state;
    char path[400], msg[ERR_MSG_MAX], cpu[256], text[1024];
    if (!kernel_cpu_has_avx2()) {
        print_message("no AVX2: skipped\n");
        return;
    }
    sysinfo_cpu_name(cpu, sizeof cpu);
    snprintf(path, sizeof path, "%s", test_tmp_path("none.json"));
    assert_int_equal(cpu_tune_apply_file(path, msg), 0);
    assert_non_null(strstr(msg, "no tune file"));

    /* another CPU: not applied, said why */
    snprintf(path, sizeof path, "%s", test_tmp_path("other.json"));
    snprintf(text, sizeof text, "{\"version\":2,\"cpu\":\"Some Other CPU (family 6 model 143)\",\"isa\":\"%s\","
                                "\"decode_prefetch\":{\"q4_0\":\"sparse\"}}", cpu_tune_isa());
    test_write_file(path, text);
    assert_int_equal(cpu_tune_apply_file(path, msg), 0);
    assert_non_null(strstr(msg, "was measured on Some Other CPU"));
    assert_int_equal(cpu_decode_prefetch_tuned(DTYPE_Q4_0), -1);

    /* another instruction set */
    snprintf(text, sizeof text,
             "{\"version\":2,\"cpu\":\"%s\",\"isa\":\"%s\",\"decode_prefetch\":{\"q4_0\":\"sparse\"}}", cpu,
             gemv_cpu_has_avx512() ? "avx2" : "avx512");
    test_write_file(path, text);
    assert_int_equal(cpu_tune_apply_file(path, msg), 0);
    assert_non_null(strstr(msg, "kernels"));
    assert_int_equal(cpu_decode_prefetch_tuned(DTYPE_Q4_0), -1);

    /* all or nothing: a good q4_0 rule beside a rule that does not exist sets neither */
    snprintf(text, sizeof text, "{\"version\":2,\"cpu\":\"%s\",\"isa\":\"%s\",\"decode_prefetch\":{\"q4_0\":\"sparse\","
                                "\"q4_k\":\"fast\"}}", cpu, cpu_tune_isa());
    test_write_file(path, text);
    assert_int_equal(cpu_tune_apply_file(path, msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "\"fast\""));
    assert_non_null(strstr(msg, "it has: ")); /* the rules q4_k's kernels have, to write instead */
    assert_int_equal(cpu_decode_prefetch_tuned(DTYPE_Q4_0), -1);

    /* a rule the type's kernels lack (F16 has no sparse, the quantized types no rows or none), a type without a
     * rule, a rule that is not a string */
    static const char *const bad[] = {"{\"f16\":\"sparse\"}", "{\"q4_0\":\"rows\"}", "{\"q6_k\":\"none\"}",
                                      "{\"q4_1\":\"every\"}", "{\"q4_0\":3}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, "{\"version\":2,\"cpu\":\"%s\",\"isa\":\"%s\",\"decode_prefetch\":%s}", cpu,
                 cpu_tune_isa(), bad[i]);
        test_write_file(path, text);
        assert_int_equal(cpu_tune_apply_file(path, msg), ERR_FORMAT);
    }
    snprintf(text, sizeof text, "{\"version\":1,\"cpu\":\"%s\",\"isa\":\"%s\",\"decode_prefetch\":{}}", cpu,
             cpu_tune_isa());
    test_write_file(path, text);
    assert_int_equal(cpu_tune_apply_file(path, msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "version 2")); /* version 1's F16 "every" ran what is now "none" */
    test_write_file(path, "{\"version\":1,");
    assert_int_equal(cpu_tune_apply_file(path, msg), ERR_FORMAT);
    assert_non_null(strstr(msg, "not JSON"));
    assert_string_equal(cpu_tune_source(), "built-in rules"); /* none of these applied */
}

static void test_path(void **state)
{
    (void)state;
    char p[512];
    const char *home = getenv("HOME"), *xdg = getenv("XDG_CACHE_HOME"), *tf = getenv("WAFER_TUNE_FILE");
    char *save_home = home ? strdup(home) : NULL, *save_xdg = xdg ? strdup(xdg) : NULL;
    char *save_tf = tf ? strdup(tf) : NULL;
    setenv("WAFER_TUNE_FILE", "/x/y.json", 1);
    assert_true(cpu_tune_path(p, sizeof p));
    assert_string_equal(p, "/x/y.json");
    setenv("WAFER_TUNE_FILE", "", 1); /* set but empty: no tune file */
    assert_false(cpu_tune_path(p, sizeof p));
    unsetenv("WAFER_TUNE_FILE");
    setenv("XDG_CACHE_HOME", "/c", 1);
    setenv("HOME", "/h", 1);
    assert_true(cpu_tune_path(p, sizeof p));
    assert_string_equal(p, "/c/wafer/tune.json");
    unsetenv("XDG_CACHE_HOME");
    assert_true(cpu_tune_path(p, sizeof p));
    assert_string_equal(p, "/h/.cache/wafer/tune.json");
    unsetenv("HOME");
    assert_false(cpu_tune_path(p, sizeof p));
    char small[8];
    setenv("WAFER_TUNE_FILE", "/a/rather/long/path.json", 1);
    assert_false(cpu_tune_path(small, sizeof small)); /* too long: none rather than a cut path */
    assert_string_equal(small, "");
    if (save_home)
        setenv("HOME", save_home, 1);
    if (save_xdg)
        setenv("XDG_CACHE_HOME", save_xdg, 1);
    if (save_tf)
        setenv("WAFER_TUNE_FILE", save_tf, 1);
    else
        unsetenv("WAFER_TUNE_FILE");
    free(save_home);
    free(save_xdg);
    free(save_tf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_candidates_and_set),
        cmocka_unit_test(test_rules_same_bits),
        cmocka_unit_test_setup_teardown(test_file_refusals, cleared, cleared),
        cmocka_unit_test_setup_teardown(test_file_round_trip, cleared, cleared),
        cmocka_unit_test(test_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
