/* Tests for the streaming JSON writer: structure and separators, string escaping (including invalid UTF-8),
 * number formatting, and that every output parses back with jansson to the values written. */
#include "testutil.h"

#include "core/err.h"
#include "core/json_writer.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *write_sample(int indent)
{
    struct json_writer w;
    json_writer_init_buffer(&w, indent);
    json_writer_object_begin(&w);
    json_writer_key_string(&w, "name", "wafer");
    json_writer_key_int(&w, "n", -42);
    json_writer_key(&w, "list");
    json_writer_array_begin(&w);
    json_writer_int(&w, 1);
    json_writer_double(&w, 2.5);
    json_writer_null(&w);
    json_writer_bool(&w, true);
    json_writer_object_begin(&w);
    json_writer_object_end(&w);
    json_writer_array_begin(&w);
    json_writer_array_end(&w);
    json_writer_array_end(&w);
    json_writer_key(&w, "nested");
    json_writer_object_begin(&w);
    json_writer_key_double(&w, "x", NAN);
    json_writer_key_bool(&w, "f", false);
    json_writer_key_null(&w, "z");
    json_writer_object_end(&w);
    json_writer_object_end(&w);
    assert_int_equal(json_writer_finish(&w), 0);
    char *out = json_writer_take(&w, NULL);
    json_writer_deinit(&w);
    return out;
}

static void test_compact_structure(void **state)
{
    (void)state;
    char *s = write_sample(0);
    assert_string_equal(s, "{\"name\":\"wafer\",\"n\":-42,\"list\":[1,2.5,null,true,{},[]],"
                           "\"nested\":{\"x\":null,\"f\":false,\"z\":null}}");
    free(s);
}

static void test_indented_parses_back(void **state)
{
    (void)state;
    char *s = write_sample(2);
    assert_non_null(strchr(s, '\n'));
    json_error_t e;
    json_t *o = json_loads(s, 0, &e);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "name")), "wafer");
    assert_int_equal(json_integer_value(json_object_get(o, "n")), -42);
    assert_int_equal(json_array_size(json_object_get(o, "list")), 6);
    assert_true(json_is_null(json_object_get(json_object_get(o, "nested"), "x")));
    json_decref(o);
    free(s);
}

static char *write_string(const char *s, size_t n)
{
    struct json_writer w;
    json_writer_init_buffer(&w, 0);
    json_writer_string_n(&w, s, n);
    assert_int_equal(json_writer_finish(&w), 0);
    return json_writer_take(&w, NULL);
}

static void test_escaping(void **state)
{
    (void)state;
    static const char raw[] = "a\"b\\c\n\t\r\b\f\x01\x1f/";
    char *s = write_string(raw, sizeof raw - 1);
    assert_string_equal(s, "\"a\\\"b\\\\c\\n\\t\\r\\b\\f\\u0001\\u001f/\"");
    free(s);
    /* valid multi-byte UTF-8 passes through unchanged */
    const char *utf8 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
    s = write_string(utf8, strlen(utf8));
    assert_int_equal(strlen(s), strlen(utf8) + 2);
    assert_memory_equal(s + 1, utf8, strlen(utf8));
    free(s);
    /* a NUL inside the string is escaped, not a terminator */
    s = write_string("a\0b", 3);
    assert_string_equal(s, "\"a\\u0000b\"");
    free(s);
}

static void test_invalid_utf8_replaced(void **state)
{
    (void)state;
    /* lone continuation, truncated sequence, overlong '/', UTF-16 surrogate, past U+10FFFF, 0xff */
    const char bad[] = "x\x80y\xe2\x82z\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xff";
    char *s = write_string(bad, sizeof bad - 1);
    json_t *o = json_loads(s, JSON_DECODE_ANY, NULL);
    assert_non_null(o); /* output is always valid JSON */
    assert_non_null(strstr(s, "x\\ufffdy\\ufffd"));
    assert_null(strchr(s, '\x80'));
    assert_null(strchr(s, '\xff'));
    json_decref(o);
    free(s);
}

static void test_doubles_round_trip(void **state)
{
    (void)state;
    const double vals[] = {0.1, 1.0 / 3.0, 1e300, -2.5e-300, 123456789.125, 0, 5e-324, 1.7976931348623157e308};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        struct json_writer w;
        json_writer_init_buffer(&w, 0);
        json_writer_double(&w, vals[i]);
        char *s = json_writer_take(&w, NULL);
        assert_true(strtod(s, NULL) == vals[i]);
        json_t *o = json_loads(s, JSON_DECODE_ANY, NULL);
        assert_non_null(o);
        json_decref(o);
        free(s);
    }
    struct json_writer w;
    json_writer_init_buffer(&w, 0);
    json_writer_array_begin(&w);
    json_writer_double(&w, INFINITY);
    json_writer_double(&w, -INFINITY);
    json_writer_double(&w, NAN);
    json_writer_double(&w, 0.1);
    json_writer_array_end(&w);
    char *s = json_writer_take(&w, NULL);
    assert_string_equal(s, "[null,null,null,0.1]");
    free(s);
}

static void test_unfinished_and_file(void **state)
{
    (void)state;
    struct json_writer w;
    json_writer_init_buffer(&w, 0);
    assert_int_equal(json_writer_finish(&w), ERR_FORMAT); /* nothing written */
    json_writer_array_begin(&w);
    assert_int_equal(json_writer_finish(&w), ERR_FORMAT); /* still open */
    json_writer_deinit(&w);

    const char *path = test_tmp_path("jw.json");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    json_writer_init_file(&w, f, 0);
    json_writer_object_begin(&w);
    json_writer_key_string(&w, "k", "v");
    json_writer_object_end(&w);
    assert_int_equal(json_writer_finish(&w), 0);
    assert_null(json_writer_take(&w, NULL)); /* file mode has no buffer */
    fclose(f);
    size_t len;
    char *text = test_read_file(path, &len);
    assert_string_equal(text, "{\"k\":\"v\"}");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_structure), cmocka_unit_test(test_indented_parses_back),
        cmocka_unit_test(test_escaping),          cmocka_unit_test(test_invalid_utf8_replaced),
        cmocka_unit_test(test_doubles_round_trip), cmocka_unit_test(test_unfinished_and_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
