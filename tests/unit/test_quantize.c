/* Tests for `wafer quantize`: the per-tensor type plan against llama.cpp's own quantized files, and real
 * conversions of a small writer-made model to every target (types, metadata, values close to the input). */
#include "testutil.h"

#include "cli/cli.h"
#include "engine/gguf/quantize.h"
#include "core/err.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Our plan for the F16 llama-19M must give exactly the types llama-quantize chose in the shared files. */
static void test_plan_matches_llama_cpp(void **state)
{
    (void)state;
    static const struct {
        const char *file, *target;
    } cases[] = {
        {"models/llama-19M/llama-19M-Q4_K_M.gguf", "q4_k_m"},
        {"models/llama-19M/llama-19M-Q4_0.gguf", "q4_0"},
        {"models/llama-19M/llama-19M-Q6_K.gguf", "Q6_K"},
        {"models/llama-19M/llama-19M-Q8_0.gguf", "q8_0"},
    };
    const char *src = TEST_SHARED_OR_SKIP("models/llama-19M/llama-19M-F16.gguf");
    char err[ERR_MSG_MAX];
    struct gguf *g = gguf_open(src, err);
    assert_non_null(g);
    int64_t n = gguf_tensor_count(g);
    enum dtype *types = calloc((size_t)n, sizeof *types);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *path = TEST_SHARED_OR_SKIP(cases[c].file);
        struct gguf *ref = gguf_open(path, err);
        assert_non_null(ref);
        struct quantize_target t;
        assert_int_equal(quantize_target_parse(cases[c].target, &t), 0);
        uint32_t ft;
        assert_int_equal(gguf_get_u32(ref, "general.file_type", &ft), 0);
        assert_int_equal(ft, t.file_type);
        quantize_plan(g, &t, false, types, NULL);
        int n_q6 = 0;
        for (int64_t i = 0; i < n; i++) {
            const struct gguf_tensor *x = gguf_tensor_at(g, i), *y = gguf_tensor_find(ref, x->name);
            assert_non_null(y);
            if (types[i] != y->type)
                fail_msg("%s: %s planned %s, llama.cpp chose %s", cases[c].target, x->name, dtype_name(types[i]),
                         dtype_name(y->type));
            n_q6 += types[i] == DTYPE_Q6_K;
        }
        if (!strcmp(cases[c].target, "q4_k_m"))
            assert_int_equal(n_q6, 5); /* output + attn_v/ffn_down of layers 2 and 3 */
        gguf_close(ref);
    }
    free(types);
    gguf_close(g);
}

/* ---- a small model made with the writer ---- */

#define SM_LAYERS 8
#define SM_DIM 256

struct sm_tensor {
    char name[48];
    enum dtype type;
    uint32_t n_dims;
    int64_t ne[2];
    float *values; /* [ne[1]][ne[0]] what the stored data decodes to */
};

static struct sm_tensor sm_tensors[5 + 3 * SM_LAYERS];
static int sm_count;

static void sm_add(const char *name, enum dtype type, uint32_t n_dims, int64_t ne0, int64_t ne1)
{
    assert_true(sm_count < (int)(sizeof sm_tensors / sizeof sm_tensors[0]));
    struct sm_tensor *t = &sm_tensors[sm_count++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
}

/* Writes the model: F32/F16 weights of random values, 8 layers so the q4_k_m layer rule has something to
 * choose, and two matrices whose rows do not divide into K-quant blocks (96: q8_0 fits) or any block (40). */
static const char *sm_write(void)
{
    static char path[4096];
    if (path[0])
        return path;
    sm_count = 0;
    sm_add("token_embd.weight", DTYPE_F32, 2, SM_DIM, 16);
    sm_add("output_norm.weight", DTYPE_F32, 1, SM_DIM, 1);
    sm_add("output.weight", DTYPE_F16, 2, SM_DIM, 16);
    sm_add("blk.0.odd96.weight", DTYPE_F32, 2, 96, 4);
    for (int l = 0; l < SM_LAYERS; l++) {
        char name[48];
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        sm_add(name, DTYPE_F16, 2, SM_DIM, 8);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        sm_add(name, DTYPE_F32, 2, SM_DIM, 4);
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        sm_add(name, DTYPE_F32, 1, SM_DIM, 1);
    }
    sm_tensors[sm_count - 1].ne[0] = 40; /* last norm: 1-D, stays as is whatever its length */
    sm_add("blk.7.odd40.weight", DTYPE_F32, 2, 40, 3);
    char err[ERR_MSG_MAX];
    struct gguf_writer *w = gguf_writer_create();
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(gguf_writer_set_u32(w, "llama.block_count", SM_LAYERS), 0);
    assert_int_equal(gguf_writer_set_u32(w, "general.file_type", 0), 0);
    struct gguf_str toks[3] = {{5, "<unk>"}, {3, "<s>"}, {4, "</s>"}};
    assert_int_equal(gguf_writer_set_str_arr(w, "tokenizer.ggml.tokens", toks, 3), 0);
    for (int i = 0; i < sm_count; i++)
        assert_int_equal(gguf_writer_add_tensor(w, sm_tensors[i].name, sm_tensors[i].type, sm_tensors[i].n_dims,
                                                sm_tensors[i].ne), i);
    snprintf(path, sizeof path, "%s", test_tmp_path("small_src.gguf"));
    assert_int_equal(gguf_writer_begin(w, path, err), 0);
    uint64_t rng = 7;
    for (int i = 0; i < sm_count; i++) {
        struct sm_tensor *t = &sm_tensors[i];
        size_t n = (size_t)(t->ne[0] * t->ne[1]);
        t->values = malloc(n * sizeof(float));
        void *data = malloc(n * 4);
        for (size_t j = 0; j < n; j++) {
            float v = test_rand_f32(&rng);
            if (t->type == DTYPE_F16) {
                uint16_t h = f32_to_fp16(v);
                memcpy((uint8_t *)data + 2 * j, &h, 2);
                v = fp16_to_f32(h);
            } else {
                memcpy((uint8_t *)data + 4 * j, &v, 4);
            }
            t->values[j] = v;
        }
        assert_int_equal(gguf_writer_write_tensor(w, i, data, dtype_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1], err), 0);
        free(data);
    }
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    return path;
}

static int sm_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < sm_count; i++) {
        free(sm_tensors[i].values);
        sm_tensors[i].values = NULL;
    }
    return 0;
}

/* Expected type of each small-model tensor, written out by hand from llama-quantize's rules. */
static enum dtype sm_expected(const char *target, bool pure, const struct sm_tensor *t)
{
    struct quantize_target q;
    assert_int_equal(quantize_target_parse(target, &q), 0);
    if (t->n_dims == 1)
        return t->type;
    bool blocky = dtype_block_elems(q.base) > 1;
    if (t->ne[0] == 40)
        return blocky ? DTYPE_F16 : q.base;
    if (t->ne[0] == 96)
        return q.base == DTYPE_Q4_K || q.base == DTYPE_Q6_K ? DTYPE_Q8_0 : q.base;
    if (!pure && blocky && !strcmp(t->name, "output.weight"))
        return q.base == DTYPE_Q8_0 ? DTYPE_Q8_0 : DTYPE_Q6_K;
    int layer = -1;
    sscanf(t->name, "blk.%d.", &layer);
    bool favoured = layer == 0 || layer == 3 || layer == 6 || layer == 7; /* use_more_bits(i, 8) */
    if (!pure && q.k_m && favoured && (strstr(t->name, "attn_v") || strstr(t->name, "ffn_down")))
        return DTYPE_Q6_K;
    return q.base;
}

/* Relative RMS error allowed for values in [-1, 1) stored in type t. */
static double sm_tolerance(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return 0;
    case DTYPE_F16: return 1e-3;
    case DTYPE_BF16: return 5e-3;
    case DTYPE_Q8_0: return 1e-2;
    case DTYPE_Q6_K: return 3e-2;
    case DTYPE_Q4_K: return 0.1;
    case DTYPE_Q4_0: return 0.12;
    default: return -1;
    }
}

static void sm_check(const char *target, bool pure)
{
    const char *in = sm_write();
    char out[64], err[ERR_MSG_MAX];
    snprintf(out, sizeof out, "small_%s%s.gguf", target, pure ? "_pure" : "");
    const char *path = test_tmp_path(out);
    struct quantize_target q;
    assert_int_equal(quantize_target_parse(target, &q), 0);
    if (quantize_file(in, path, &q, pure, NULL, err) != 0)
        fail_msg("%s: %s", target, err);
    struct gguf *g = gguf_open(path, err);
    if (!g)
        fail_msg("%s", err);
    uint32_t ft, qv;
    assert_int_equal(gguf_get_u32(g, "general.file_type", &ft), 0);
    assert_int_equal(ft, q.file_type);
    bool quantized = dtype_block_elems(q.base) > 1;
    assert_int_equal(gguf_get_u32(g, "general.quantization_version", &qv), quantized ? 0 : ERR_NOT_FOUND);
    assert_int_equal(gguf_kv_count(g), 4 + quantized);
    struct gguf_str s;
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    const struct gguf_kv *kv;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &kv), 0);
    assert_int_equal(kv->arr_len, 3);
    assert_true(gguf_str_eq(kv->strs[2], "</s>"));
    assert_int_equal(gguf_tensor_count(g), sm_count);
    float *row = malloc(SM_DIM * sizeof *row);
    for (int i = 0; i < sm_count; i++) {
        const struct sm_tensor *t = &sm_tensors[i];
        const struct gguf_tensor *x = gguf_tensor_at(g, i);
        assert_string_equal(x->name, t->name);
        assert_int_equal(x->ne[0], t->ne[0]);
        assert_int_equal(x->ne[1], t->ne[1]);
        enum dtype want = sm_expected(target, pure, t);
        if (x->type != want)
            fail_msg("%s%s: %s is %s, expected %s", target, pure ? " --pure" : "", t->name, dtype_name(x->type),
                     dtype_name(want));
        double se = 0, ss = 0;
        size_t rb = dtype_row_bytes(x->type, x->ne[0]);
        for (int64_t r = 0; r < x->ne[1]; r++) {
            assert_int_equal(quant_row_to_f32(x->type, (const uint8_t *)x->data + (size_t)r * rb, row, x->ne[0]), 0);
            for (int64_t j = 0; j < x->ne[0]; j++) {
                double d = row[j] - t->values[r * x->ne[0] + j];
                se += d * d;
                ss += (double)t->values[r * x->ne[0] + j] * t->values[r * x->ne[0] + j];
            }
        }
        /* a tensor kept in its own type must come back bit-exact */
        double tol = x->type == t->type ? 0 : sm_tolerance(x->type);
        if (sqrt(se / ss) > tol)
            fail_msg("%s: %s as %s: relative RMS error %g > %g", target, t->name, dtype_name(x->type), sqrt(se / ss), tol);
    }
    free(row);
    gguf_close(g);
}

static void test_quantize_f32(void **state) { (void)state; sm_check("f32", false); }
static void test_quantize_f16(void **state) { (void)state; sm_check("f16", false); }
static void test_quantize_bf16(void **state) { (void)state; sm_check("bf16", false); }
static void test_quantize_q8_0(void **state) { (void)state; sm_check("q8_0", false); }
static void test_quantize_q4_0(void **state) { (void)state; sm_check("q4_0", false); }
static void test_quantize_q4_0_pure(void **state) { (void)state; sm_check("q4_0", true); }
static void test_quantize_q6_k(void **state) { (void)state; sm_check("q6_k", false); }
static void test_quantize_q4_k_m(void **state) { (void)state; sm_check("q4_k_m", false); }
static void test_quantize_q4_k_m_pure(void **state) { (void)state; sm_check("q4_k_m", true); }

/* Requantizing a quantized file reads its blocks back: q8_0 -> q4_0 stays close to the original floats. */
static void test_requantize(void **state)
{
    (void)state;
    const char *in = sm_write();
    char err[ERR_MSG_MAX];
    struct quantize_target q8, q4;
    assert_int_equal(quantize_target_parse("q8_0", &q8), 0);
    assert_int_equal(quantize_target_parse("f16", &q4), 0);
    const char *mid = test_tmp_path("re_q8.gguf"), *out = test_tmp_path("re_f16.gguf");
    assert_int_equal(quantize_file(in, mid, &q8, true, NULL, err), 0);
    assert_int_equal(quantize_file(mid, out, &q4, false, NULL, err), 0);
    struct gguf *g = gguf_open(out, err);
    assert_non_null(g);
    const struct gguf_tensor *x = gguf_tensor_find(g, "token_embd.weight");
    assert_int_equal(x->type, DTYPE_F16);
    double se = 0, ss = 0;
    for (int64_t j = 0; j < x->ne[0] * x->ne[1]; j++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)x->data + 2 * j, 2);
        double d = fp16_to_f32(h) - sm_tensors[0].values[j];
        se += d * d;
        ss += (double)sm_tensors[0].values[j] * sm_tensors[0].values[j];
    }
    assert_true(sqrt(se / ss) < 1e-2);
    gguf_close(g);
}

static void test_quantize_errors(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct quantize_target q;
    assert_int_equal(quantize_target_parse("q4_k_m", &q), 0);
    assert_int_equal(quantize_target_parse("Q4_K_M", &q), 0);
    assert_int_equal(quantize_target_parse("q4_k", &q), ERR_INVALID_ARG);
    assert_int_equal(quantize_target_parse("q5_k_m", &q), ERR_INVALID_ARG);

    const char *missing_out = test_tmp_path("never.gguf");
    assert_int_not_equal(quantize_file("/nonexistent/in.gguf", missing_out, &q, false, NULL, err), 0);
    assert_non_null(strstr(err, "/nonexistent/in.gguf: cannot open"));
    struct stat st;
    assert_int_not_equal(stat(missing_out, &st), 0);

    const char *in = sm_write();
    assert_int_equal(quantize_file(in, in, &q, false, NULL, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "output is the input file"));
    assert_int_equal(quantize_file(in, "/nonexistent/dir/out.gguf", &q, false, NULL, err), ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/dir/out.gguf: cannot create"));

    /* a source type quantize cannot read (q5_k): refused before the output exists */
    const char *unsup = "tests/fuzz/corpus/gguf/valid_unsupported_type.gguf";
    const char *out = test_tmp_path("unsup_out.gguf");
    assert_int_equal(quantize_file(unsup, out, &q, false, NULL, err), ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "('blk.0.ffn_down.weight') has type q5_k, which quantize cannot read"));
    assert_int_not_equal(stat(out, &st), 0);
}

static void test_cli_args(void **state)
{
    (void)state;
    char *help[] = {"quantize", "--help", NULL};
    assert_int_equal(cmd_quantize_main(2, help), 0);
    char *few[] = {"quantize", "a.gguf", "b.gguf", NULL};
    assert_int_equal(cmd_quantize_main(3, few), 2);
    char *bad_type[] = {"quantize", "a.gguf", "b.gguf", "q3_k_s", NULL};
    assert_int_equal(cmd_quantize_main(4, bad_type), 2);
    char *bad_opt[] = {"quantize", "--fast", "a.gguf", "b.gguf", "q8_0", NULL};
    assert_int_equal(cmd_quantize_main(5, bad_opt), 2);
    char *missing[] = {"quantize", "/nonexistent/a.gguf", (char *)test_tmp_path("cli_out.gguf"), "q8_0", NULL};
    assert_int_equal(cmd_quantize_main(4, missing), 1);
    char *ok[] = {"quantize", (char *)sm_write(), (char *)test_tmp_path("cli_ok.gguf"), "q8_0", "--pure", NULL};
    assert_int_equal(cmd_quantize_main(5, ok), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_matches_llama_cpp),
        cmocka_unit_test(test_quantize_f32),
        cmocka_unit_test(test_quantize_f16),
        cmocka_unit_test(test_quantize_bf16),
        cmocka_unit_test(test_quantize_q8_0),
        cmocka_unit_test(test_quantize_q4_0),
        cmocka_unit_test(test_quantize_q4_0_pure),
        cmocka_unit_test(test_quantize_q6_k),
        cmocka_unit_test(test_quantize_q4_k_m),
        cmocka_unit_test(test_quantize_q4_k_m_pure),
        cmocka_unit_test(test_requantize),
        cmocka_unit_test(test_quantize_errors),
        cmocka_unit_test(test_cli_args),
    };
    return cmocka_run_group_tests(tests, NULL, sm_teardown);
}
