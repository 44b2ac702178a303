/* Tests for request validation: accepted shapes give the right parameters, and a table of bad bodies gives
 * the documented error code, parameter name and message. */
#include "testutil.h"

#include "core/err.h"
#include "server/request_validate.h"

#include <stdio.h>
#include <string.h>

static struct gen_defaults defs(void)
{
    struct gen_defaults d;
    gen_defaults_init(&d);
    return d;
}

static void test_completions_ok(void **state)
{
    (void)state;
    struct gen_defaults d = defs();
    struct gen_request r;
    struct api_error e;
    const char *b = "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,"
                    "\"top_k\":-1,\"stop\":[\"\\n\",\"\"],\"seed\":-7,\"n\":2,\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"logprobs\":3,\"user\":\"x\",\"min_p\":null}";
    assert_int_equal(request_parse(API_COMPLETIONS, b, strlen(b), &d, &r, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "Once");
    assert_int_equal(r.max_tokens, 5);
    assert_true(r.sp.temperature == 0.0f);
    assert_true(r.sp.top_p == 0.5f);
    assert_int_equal(r.sp.top_k, 0);
    assert_true(r.sp.min_p == d.min_p); /* null = absent */
    assert_int_equal(r.n_stop, 1);      /* empty stop string dropped */
    assert_string_equal(r.stop[0], "\n");
    assert_true(r.seed_set);
    assert_int_equal((int64_t)r.sp.seed, -7);
    assert_int_equal(r.n, 2);
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_int_equal(r.logprobs, 3);
    assert_null(r.prediction);
    assert_int_equal(r.spec, -1);
    gen_request_deinit(&r);

    const char *bp = "{\"prompt\":\"x\",\"speculation\":\"ngram\",\"prediction\":{\"type\":\"content\","
                     "\"content\":[{\"type\":\"text\",\"text\":\"ab\"},{\"type\":\"text\",\"text\":\"c\"}]}}";
    assert_int_equal(request_parse(API_COMPLETIONS, bp, strlen(bp), &d, &r, &e), 0);
    assert_string_equal(r.prediction, "abc");
    assert_int_equal(r.spec, 1);
    gen_request_deinit(&r);

    const char *b2 = "{\"prompt\":[[1,2,3],\"hi\"]}";
    assert_int_equal(request_parse(API_COMPLETIONS, b2, strlen(b2), &d, &r, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[0].n_tokens, 3);
    assert_int_equal(r.prompts[0].tokens[2], 3);
    assert_string_equal(r.prompts[1].text, "hi");
    assert_int_equal(r.max_tokens, -1);
    assert_false(r.stream);
    assert_int_equal(r.logprobs, -1);
    gen_request_deinit(&r);
}

static void test_chat_ok(void **state)
{
    (void)state;
    struct gen_defaults d = defs();
    struct gen_request r;
    struct api_error e;
    const char *b = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                    "{\"role\":\"assistant\",\"content\":null}],\"max_completion_tokens\":9,\"max_tokens\":3,"
                    "\"logprobs\":true,\"top_logprobs\":2}";
    assert_int_equal(request_parse(API_CHAT, b, strlen(b), &d, &r, &e), 0);
    assert_int_equal(r.n_messages, 3);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[1].content, "ab");
    assert_string_equal(r.messages[2].content, "");
    assert_int_equal(r.max_tokens, 9);
    assert_int_equal(r.logprobs, 2);
    gen_request_deinit(&r);
}

static void test_generate_ok(void **state)
{
    (void)state;
    struct gen_defaults d = defs();
    struct gen_request r;
    struct api_error e;
    const char *b = "{\"prompt\":\"x\",\"max_new_tokens\":4,\"do_sample\":false,\"stop_sequences\":[\"a\",\"b\"]}";
    assert_int_equal(request_parse(API_GENERATE, b, strlen(b), &d, &r, &e), 0);
    assert_int_equal(r.max_tokens, 4);
    assert_true(r.sp.temperature == 0.0f);
    assert_int_equal(r.n_stop, 2);
    gen_request_deinit(&r);

    const char *q = "prompt=Once+upon%20a%20time&max_new_tokens=8&temperature=0.5&stop=%0A&do_sample=true";
    assert_int_equal(request_parse_query(q, strlen(q), &d, &r, &e), 0);
    assert_string_equal(r.prompts[0].text, "Once upon a time");
    assert_int_equal(r.max_tokens, 8);
    assert_true(r.sp.temperature == 0.5f);
    assert_true(r.stream);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    gen_request_deinit(&r);

    const char *q2 = "prompt=x&max_new_tokens=lots";
    assert_int_equal(request_parse_query(q2, strlen(q2), &d, &r, &e), ERR_INVALID_ARG);
    assert_string_equal(e.param, "max_new_tokens");
    const char *q3 = "prompt=%zz";
    assert_int_equal(request_parse_query(q3, strlen(q3), &d, &r, &e), ERR_INVALID_ARG);
    const char *q4 = "max_new_tokens=3";
    assert_int_equal(request_parse_query(q4, strlen(q4), &d, &r, &e), ERR_INVALID_ARG);
    assert_string_equal(e.param, "prompt");
    /* integers are digits: strtod would read 2e1 as 20 where strtoll stops at 2 (it meant 2 before) */
    static const char *const not_ints[] = {"2e1", "1e9", "1.0", "0x10", " 5", "5 ", "+", "-", "", "99999999999999999999",
                                           "3abc"};
    for (size_t i = 0; i < sizeof not_ints / sizeof not_ints[0]; i++) {
        char qq[128];
        snprintf(qq, sizeof qq, "prompt=x&max_new_tokens=%s", not_ints[i]);
        if (request_parse_query(qq, strlen(qq), &d, &r, &e) != ERR_INVALID_ARG)
            fail_msg("max_new_tokens=%s was accepted as %d", not_ints[i], r.max_tokens);
        assert_string_equal(e.param, "max_new_tokens");
        assert_non_null(strstr(e.message, "must be an integer"));
    }
    const char *q5 = "prompt=x&max_new_tokens=%2B7&seed=-3&top_k=40&temperature=1e-1&parse_special=true";
    assert_int_equal(request_parse_query(q5, strlen(q5), &d, &r, &e), 0);
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.sp.top_k, 40);
    assert_true(r.sp.temperature > 0.099f && r.sp.temperature < 0.101f); /* numbers may still be written so */
    assert_true(r.parse_special);
    gen_request_deinit(&r);
}

/* parse_special: off unless the server's default or the request says so; /tokenize takes messages instead of
 * text (then the template decides, and text-only options are refused). */
static void test_parse_special_and_tokenize(void **state)
{
    (void)state;
    struct gen_defaults d = defs();
    struct gen_request r;
    struct api_error e;
    const char *c = "{\"prompt\":\"<s>x\"}";
    assert_int_equal(request_parse(API_COMPLETIONS, c, strlen(c), &d, &r, &e), 0);
    assert_false(r.parse_special);
    gen_request_deinit(&r);
    d.parse_special = true;
    assert_int_equal(request_parse(API_COMPLETIONS, c, strlen(c), &d, &r, &e), 0);
    assert_true(r.parse_special);
    gen_request_deinit(&r);
    const char *c2 = "{\"prompt\":\"<s>x\",\"parse_special\":false}";
    assert_int_equal(request_parse(API_GENERATE, c2, strlen(c2), &d, &r, &e), 0);
    assert_false(r.parse_special);
    gen_request_deinit(&r);
    d.parse_special = false;
    const char *t1 = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":false,"
                     "\"with_pieces\":true}";
    assert_int_equal(request_parse(API_TOKENIZE, t1, strlen(t1), &d, &r, &e), 0);
    assert_int_equal(r.n_messages, 1);
    assert_int_equal(r.n_prompts, 0);
    assert_false(r.add_generation_prompt);
    assert_true(r.with_pieces);
    gen_request_deinit(&r);
    const char *t2 = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"parse_special\":true}";
    assert_int_equal(request_parse(API_TOKENIZE, t2, strlen(t2), &d, &r, &e), ERR_INVALID_ARG);
    assert_string_equal(e.param, "parse_special");
    const char *t3 = "{\"content\":\"<s>\",\"parse_special\":true}";
    assert_int_equal(request_parse(API_TOKENIZE, t3, strlen(t3), &d, &r, &e), 0);
    assert_true(r.parse_special);
    assert_true(r.add_generation_prompt);
    gen_request_deinit(&r);
}

static void test_batch(void **state)
{
    (void)state;
    struct gen_defaults d = defs();
    struct gen_request *items;
    struct api_error *errs, e;
    int n;
    const char *b = "{\"requests\":[{\"prompt\":\"a\"},{\"prompt\":5},{\"prompt\":\"c\",\"max_new_tokens\":2}],"
                    "\"common_params\":{\"max_new_tokens\":7,\"do_sample\":false}}";
    assert_int_equal(request_parse_batch(b, strlen(b), &d, &items, &errs, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(errs[0].code, 0);
    assert_int_equal(items[0].max_tokens, 7);
    assert_true(items[0].sp.temperature == 0.0f);
    assert_int_equal(errs[1].code, ERR_INVALID_ARG);
    assert_string_equal(errs[1].param, "requests[1].prompt");
    assert_int_equal(errs[2].code, 0);
    assert_int_equal(items[2].max_tokens, 2);
    gen_request_batch_free(items, errs, n);

    const char *b2 = "{\"requests\":[]}";
    assert_int_equal(request_parse_batch(b2, strlen(b2), &d, &items, &errs, &n, &e), ERR_INVALID_ARG);
    assert_string_equal(e.param, "requests");
    assert_null(items);
}

struct bad_case {
    enum api_kind kind;
    const char *body;
    int code;
    const char *param;
    const char *needle;
};

static void test_bad_table(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {API_COMPLETIONS, "{\"prompt\": \"x\"", ERR_FORMAT, "", "malformed JSON"},
        {API_COMPLETIONS, "", ERR_FORMAT, "", "empty"},
        {API_COMPLETIONS, "[1,2]", ERR_INVALID_ARG, "", "must be a JSON object"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"prompt\":\"y\"}", ERR_FORMAT, "", "duplicate"},
        {API_COMPLETIONS, "{}", ERR_INVALID_ARG, "prompt", "'prompt' is required"},
        {API_COMPLETIONS, "{\"prompt\":3}", ERR_INVALID_ARG, "prompt", "got an integer"},
        {API_COMPLETIONS, "{\"prompt\":[]}", ERR_INVALID_ARG, "prompt", "empty array"},
        {API_COMPLETIONS, "{\"prompt\":[1,-2]}", ERR_INVALID_ARG, "prompt", "non-negative token id"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":-1}", ERR_INVALID_ARG, "max_tokens", "between 1 and"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", ERR_INVALID_ARG, "max_tokens", "between 1 and"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1e12}", ERR_INVALID_ARG, "max_tokens", "between 1 and"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":99999999999999999999999}", ERR_FORMAT, "", "JSON"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":\"5\"}", ERR_INVALID_ARG, "max_tokens", "an integer, got a string"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":2.5}", ERR_INVALID_ARG, "max_tokens", "an integer"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", ERR_INVALID_ARG, "temperature", "must be a number, got a string"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":3}", ERR_INVALID_ARG, "temperature", "<= 2"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}", ERR_INVALID_ARG, "top_p", "> 0"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":0}", ERR_INVALID_ARG, "n", "between 1 and 16"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":\"yes\"}", ERR_INVALID_ARG, "stream", "boolean"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[1]}", ERR_INVALID_ARG, "stop", "'stop[0]' must be a string"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", ERR_INVALID_ARG, "stream_options", "only allowed"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":21}", ERR_INVALID_ARG, "logprobs", "between 0 and 20"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"1\":101}}", ERR_INVALID_ARG, "logit_bias", "from -100 to 100"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"a1\":5}}", ERR_INVALID_ARG, "logit_bias", "token ids"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":[5]}", ERR_INVALID_ARG, "logit_bias", "an object"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"tools\":[]}", ERR_INVALID_ARG, "tools", "chat completions"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"model\":7}", ERR_INVALID_ARG, "model", "must be a string"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"frequency_penalty\":-3}", ERR_INVALID_ARG, "frequency_penalty", ">= -2"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"prediction\":{\"type\":\"text\",\"content\":\"a\"}}", ERR_INVALID_ARG, "prediction.type", "must be \"content\""},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"prediction\":[\"a\"]}", ERR_INVALID_ARG, "prediction", "must be an object"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\"}}", ERR_INVALID_ARG, "prediction.content", "string or an array"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":\"image_url\"}]}}", ERR_INVALID_ARG, "prediction.content", "not supported"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"n\":2,\"prediction\":{\"type\":\"content\",\"content\":\"a\"}}", ERR_INVALID_ARG, "prediction", "n > 1"},
        {API_COMPLETIONS, "{\"prompt\":\"x\",\"speculation\":true}", ERR_INVALID_ARG, "speculation", "\"ngram\""},
        {API_CHAT, "{\"messages\":[]}", ERR_INVALID_ARG, "messages", "at least one"},
        {API_CHAT, "{\"messages\":\"hi\"}", ERR_INVALID_ARG, "messages", "must be an array"},
        {API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", ERR_INVALID_ARG, "messages[0].role", "must be one of"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", ERR_INVALID_ARG, "messages[0].content", "must be a string"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", ERR_INVALID_ARG, "messages[0].content", "not supported"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", ERR_INVALID_ARG, "top_logprobs", "requires"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", ERR_INVALID_ARG, "tools[0]", "\"function\""},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", ERR_INVALID_ARG, "tool_choice", "only allowed"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}}", ERR_INVALID_ARG, "tool_choice.function.name", "not one of the tools"},
        {API_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", ERR_INVALID_ARG, "messages[0].tool_call_id", "required"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{\"name\":\"a\"}]}", ERR_UNSUPPORTED, "functions", "not supported"},
        {API_GENERATE, "{\"prompt\":[\"a\"]}", ERR_INVALID_ARG, "prompt", "must be a string"},
        {API_GENERATE, "{\"prompt\":\"a\",\"do_sample\":1}", ERR_INVALID_ARG, "do_sample", "boolean"},
        {API_DETOKENIZE, "{\"tokens\":\"1 2\"}", ERR_INVALID_ARG, "tokens", "array of token ids"},
        {API_DETOKENIZE, "{}", ERR_INVALID_ARG, "tokens", "required"},
        {API_TOKENIZE, "{\"content\":5}", ERR_INVALID_ARG, "content", "must be a string"},
    };
    struct gen_defaults d = defs();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct bad_case *c = &cases[i];
        struct gen_request r;
        struct api_error e;
        int rc = request_parse(c->kind, c->body, strlen(c->body), &d, &r, &e);
        bool ok = rc == c->code && e.code == c->code && !strcmp(e.param, c->param) && strstr(e.message, c->needle);
        if (!ok)
            print_error("case %zu %s: rc %d param '%s' message '%s'\n", i, c->body, rc, e.param, e.message);
        assert_true(ok);
        gen_request_deinit(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions_ok), cmocka_unit_test(test_chat_ok), cmocka_unit_test(test_generate_ok),
        cmocka_unit_test(test_parse_special_and_tokenize),
        cmocka_unit_test(test_batch),          cmocka_unit_test(test_bad_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
