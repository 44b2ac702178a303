/* Tests for the JSON Schema side of the grammar engine: compile errors name the keyword and its JSON
 * pointer (fail closed); integer ranges and calendar dates checked exhaustively against independent
 * arithmetic; patterns in raw and JSON-encoded form; objects (optional, required-only, strict, extra keys
 * that can never spell a declared name); bounded whitespace; the validator on hand-written instances; and
 * for 12 schemas, seeded random walks over the real 32k llama vocabulary (uniform over the mask, then
 * preferring closing bytes) that must finish, parse and validate, with cached masks equal to exact ones. */
#include "testutil.h"

#include "core/err.h"
#include "engine/gguf/gguf.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_impl.h"
#include "engine/tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct grammar *schema_ok(const char *schema, unsigned flags)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    int rc = grammar_compile_schema(schema, strlen(schema), flags, &g, err);
    if (rc)
        print_message("schema %s: %s\n", schema, err);
    assert_int_equal(rc, 0);
    return g;
}

static bool matches(const struct grammar *g, const char *s)
{
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, err);
    assert_non_null(m);
    bool ok = grammar_matcher_accept_bytes(m, s, strlen(s)) == 0 && grammar_matcher_can_end(m);
    grammar_matcher_destroy(m);
    return ok;
}

static int validate(const char *schema, const char *inst)
{
    char err[ERR_MSG_MAX];
    return json_schema_validate(schema, strlen(schema), inst, strlen(inst), err);
}

/* ---- errors ---- */

static void test_schema_errors(void **state)
{
    static const struct {
        const char *schema;
        int code;
        const char *msg;
    } cases[] = {
        {"{\"type\":\"object\",\"allOf\":[]}", ERR_UNSUPPORTED, "unsupported keyword 'allOf' at /allOf"},
        {"{\"properties\":{\"a/b\":{\"not\":{}}}}", ERR_UNSUPPORTED, "unsupported keyword 'not' at /properties/a~1b/not"},
        {"{\"type\":\"array\",\"items\":{\"uniqueItems\":true}}", ERR_UNSUPPORTED, "'uniqueItems' at /items/uniqueItems"},
        {"{\"$defs\":{\"x\":{\"type\":\"integer\",\"multipleOf\":2}},\"$ref\":\"#/$defs/x\"}", ERR_UNSUPPORTED,
         "'multipleOf' at /$defs/x/multipleOf"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", ERR_UNSUPPORTED, "lookahead"},
        {"{\"type\":\"string\",\"pattern\":\"(?<!a)b\"}", ERR_UNSUPPORTED, "lookbehind"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", ERR_UNSUPPORTED, "back-references"},
        {"{\"type\":\"string\",\"pattern\":\"a\\\\bb\"}", ERR_UNSUPPORTED, "word boundaries"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", ERR_UNSUPPORTED, "'^' is only supported"},
        {"{\"type\":\"string\",\"pattern\":\"(a\"}", ERR_INVALID_ARG, "missing ')'"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", ERR_UNSUPPORTED, "format 'hostname' is not supported"},
        {"{\"type\":\"string\",\"format\":\"date\",\"maxLength\":3}", ERR_UNSUPPORTED, "'format' combined with"},
        {"{\"$ref\":\"http://example.com/s.json\"}", ERR_UNSUPPORTED, "only references inside the schema"},
        {"{\"$ref\":\"#/$defs/missing\"}", ERR_INVALID_ARG, "does not point at anything"},
        {"{\"$ref\":\"#/$defs/a\",\"type\":\"string\",\"$defs\":{\"a\":{}}}", ERR_UNSUPPORTED, "'$ref' combined with 'type'"},
        {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", ERR_INVALID_ARG, "minLength is greater than maxLength"},
        {"{\"type\":\"string\",\"minLength\":-1}", ERR_INVALID_ARG, "minLength must be"},
        {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":5}", ERR_INVALID_ARG, "no integer"},
        {"{\"type\":\"integer\",\"minimum\":1e20}", ERR_INVALID_ARG, "no integer"},
        {"{\"type\":\"number\",\"minimum\":0}", ERR_UNSUPPORTED, "type number"},
        {"{\"type\":\"array\",\"maxItems\":100000}", ERR_UNSUPPORTED, "maxItems"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", ERR_INVALID_ARG, "minItems is greater"},
        {"{\"type\":\"bogus\"}", ERR_INVALID_ARG, "unknown type 'bogus'"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", ERR_INVALID_ARG, "no enum value satisfies"},
        {"{\"type\":\"object\",\"anyOf\":[{}]}", ERR_UNSUPPORTED, "'anyOf' combined with 'type'"},
        {"{\"properties\":{\"a\\\"b\":{}},\"additionalProperties\":true}", ERR_UNSUPPORTED, "property name with a quote"},
        {"false", ERR_INVALID_ARG, "the schema false can never be satisfied"},
        {"{\"properties\":{\"x\":false},\"required\":[\"x\"]}", ERR_INVALID_ARG, "false can never be satisfied at /properties/x"},
        {"{\"$ref\":\"#\"}", ERR_INVALID_ARG, "matches no string"},
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", ERR_INVALID_ARG, "left-recursive"},
        {"not json", ERR_FORMAT, "not valid JSON"},
        {"{\"a\":1,\"a\":2}", ERR_FORMAT, "not valid JSON"},
        {"{\"enum\":[]}", ERR_INVALID_ARG, "enum must be a non-empty array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_MSG_MAX] = "";
        struct grammar *g = (struct grammar *)1;
        int rc = grammar_compile_schema(cases[i].schema, strlen(cases[i].schema), 0, &g, err);
        if (rc != cases[i].code || !strstr(err, cases[i].msg))
            print_message("case %zu %s: got %d '%s', want %d '%s'\n", i, cases[i].schema, rc, err, cases[i].code,
                          cases[i].msg);
        assert_int_equal(rc, cases[i].code);
        assert_non_null(strstr(err, cases[i].msg));
        assert_null(g);
    }
}

/* ---- integers ---- */

static void test_integer_ranges_exhaustive(void **state)
{
    static const long long ranges[][2] = {{-37, 1234}, {0, 0}, {5, 5}, {-1000, -999}, {99, 101}, {-9, 9},
                                          {10, 99}, {1, 100000}, {-100000, -1}, {123, 4567}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        long long lo = ranges[r][0], hi = ranges[r][1];
        char schema[128], s[32];
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        struct grammar *g = schema_ok(schema, GRAMMAR_SCHEMA_COMPACT);
        long long from = lo - 1500, to = hi + 1500;
        for (long long x = from; x <= to; x++) {
            /* outside the dense window around the bounds, a sparse sample */
            if (x > lo + 1500 && x < hi - 1500 && x % 97)
                continue;
            snprintf(s, sizeof s, "%lld", x);
            bool want = x >= lo && x <= hi;
            if (matches(g, s) != want)
                print_message("range [%lld, %lld]: %s should %s\n", lo, hi, s, want ? "match" : "not match");
            assert_int_equal(matches(g, s), want);
        }
        /* no leading zeros, no -0, no fraction */
        snprintf(s, sizeof s, "0%lld", lo < 0 ? 1 : lo);
        assert_false(matches(g, s));
        assert_false(matches(g, "-0"));
        snprintf(s, sizeof s, "%lld.0", lo);
        assert_false(matches(g, s));
        grammar_destroy(g);
    }
    /* exclusive bounds, draft-04 booleans, real bounds rounded inwards */
    struct grammar *g = schema_ok("{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":7.5}", GRAMMAR_SCHEMA_COMPACT);
    assert_false(matches(g, "-3"));
    assert_true(matches(g, "-2") && matches(g, "7"));
    assert_false(matches(g, "8"));
    grammar_destroy(g);
    g = schema_ok("{\"type\":\"integer\",\"minimum\":2,\"exclusiveMinimum\":true,\"maximum\":4.5}", GRAMMAR_SCHEMA_COMPACT);
    assert_false(matches(g, "2"));
    assert_true(matches(g, "3") && matches(g, "4"));
    assert_false(matches(g, "5"));
    grammar_destroy(g);
    /* unbounded: at most 16 digits */
    g = schema_ok("{\"type\":\"integer\"}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "-9999999999999999") && matches(g, "0"));
    assert_false(matches(g, "10000000000000000"));
    grammar_destroy(g);
}

/* ---- formats ---- */

static int days_in_month(int y, int m)
{
    static const int d[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : d[m - 1];
}

static void test_date_exhaustive(void **state)
{
    const char *schema = "{\"type\":\"string\",\"format\":\"date\"}";
    struct grammar *g = schema_ok(schema, GRAMMAR_SCHEMA_COMPACT);
    static const int years[] = {0, 4, 100, 1900, 1999, 2000, 2023, 2024, 2100, 2400, 9996, 9999};
    for (size_t yi = 0; yi < sizeof years / sizeof years[0]; yi++) {
        for (int m = 0; m <= 13; m++) {
            for (int d = 0; d <= 32; d++) {
                char s[32];
                snprintf(s, sizeof s, "\"%04d-%02d-%02d\"", years[yi], m, d);
                bool want = m >= 1 && m <= 12 && d >= 1 && d <= days_in_month(years[yi], m);
                if (matches(g, s) != want)
                    print_message("%s should %s\n", s, want ? "match" : "not match");
                assert_int_equal(matches(g, s), want);
                assert_int_equal(validate(schema, s), want ? 0 : ERR_INVALID_ARG);
            }
        }
    }
    grammar_destroy(g);
    static const struct {
        const char *format, *value;
        bool ok;
    } cases[] = {
        {"time", "\"23:59:60Z\"", true},          {"time", "\"00:00:00.123+05:30\"", true},
        {"time", "\"23:59:60+00:00\"", true},     {"time", "\"23:58:60Z\"", false},
        {"time", "\"22:59:60Z\"", false},         {"time", "\"23:59:61Z\"", false},
        {"time", "\"15:59:60-08:00\"", false},
        {"time", "\"24:00:00Z\"", false},         {"time", "\"12:00:00\"", false},
        {"time", "\"12:60:00Z\"", false},         {"date-time", "\"2024-02-29T12:00:00Z\"", true},
        {"date-time", "\"2023-02-29T12:00:00Z\"", false}, {"date-time", "\"2024-01-01t00:00:00z\"", true},
        {"uuid", "\"123e4567-e89b-12d3-a456-426614174000\"", true}, {"uuid", "\"123e4567e89b12d3a456426614174000\"", false},
        {"uuid", "\"123e4567-e89b-12d3-a456-42661417400g\"", false}, {"email", "\"a.b+c@example.co.uk\"", true},
        {"email", "\"a@b\"", false},              {"email", "\"a..b@example.com\"", false},
        {"email", "\"@example.com\"", false},     {"email", "\"x@-a.com\"", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema2[96];
        snprintf(schema2, sizeof schema2, "{\"type\":\"string\",\"format\":\"%s\"}", cases[i].format);
        int rc = validate(schema2, cases[i].value);
        if ((rc == 0) != cases[i].ok)
            print_message("%s %s: %d\n", cases[i].format, cases[i].value, rc);
        assert_int_equal(rc, cases[i].ok ? 0 : ERR_INVALID_ARG);
        /* the generator's grammar agrees, except that it writes only the upper-case T and Z and no leap
         * seconds */
        struct grammar *fg = schema_ok(schema2, GRAMMAR_SCHEMA_COMPACT);
        bool lower = strchr(cases[i].value, 't') && !strcmp(cases[i].format, "date-time");
        bool leap = strstr(cases[i].value, ":60") != NULL;
        assert_int_equal(matches(fg, cases[i].value), cases[i].ok && !lower && !leap);
        grammar_destroy(fg);
    }
}

/* ---- patterns ---- */

static void test_patterns(void **state)
{
    static const struct {
        const char *pattern; /* as a JSON string body */
        const char *value;   /* a JSON string */
        bool ok;
    } cases[] = {
        {"^[A-Z]{2}-\\\\d{3}$", "\"AB-123\"", true},  {"^[A-Z]{2}-\\\\d{3}$", "\"AB-1234\"", false},
        {"^[A-Z]{2}-\\\\d{3}$", "\"xAB-123\"", false}, {"[0-9]+", "\"abc123def\"", true},
        {"[0-9]+", "\"abcdef\"", false},             {"^(cat|dog)s?$", "\"dogs\"", true},
        {"^(cat|dog)s?$", "\"cow\"", false},          {"^a|b$", "\"axx\"", true},
        {"^a|b$", "\"xxb\"", true},                  {"^a|b$", "\"xbx\"", false},
        {"^[^a-c]*$", "\"xyz\"", true},               {"^[^a-c]*$", "\"xaz\"", false},
        {"^\\\\w+@\\\\w+\\\\.com$", "\"me@host.com\"", true}, {"^.$", "\"\\u00e9\"", true},
        {"^.$", "\"\\n\"", false},                    {"^a\\\"b\\\\\\\\c$", "\"a\\\"b\\\\c\"", true},
        {"^\\\\s*$", "\"\\t \"", true},               {"^(?:ab){2,3}$", "\"ababab\"", true},
        {"^(?:ab){2,3}$", "\"ab\"", false},           {"^x+?y*?$", "\"xxy\"", true},
        {"^[\\\\u0041-\\\\u0043]+$", "\"ABC\"", true}, {"^[\\\\u0041-\\\\u0043]+$", "\"ABD\"", false},
        {"^\\\\{\\\\}$", "\"{}\"", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", cases[i].pattern);
        int rc = validate(schema, cases[i].value);
        if ((rc == 0) != cases[i].ok)
            print_message("pattern %s value %s: %d\n", cases[i].pattern, cases[i].value, rc);
        assert_int_equal(rc, cases[i].ok ? 0 : ERR_INVALID_ARG);
        /* the generator matches the canonical JSON encoding the same way */
        struct grammar *g = schema_ok(schema, GRAMMAR_SCHEMA_COMPACT);
        json_t *v = json_loads(cases[i].value, JSON_DECODE_ANY, NULL);
        char *canon = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (matches(g, canon) != cases[i].ok)
            print_message("generator: pattern %s value %s\n", cases[i].pattern, canon);
        assert_int_equal(matches(g, canon), cases[i].ok);
        free(canon);
        json_decref(v);
        grammar_destroy(g);
    }
}

/* ---- objects, arrays, whitespace ---- */

static void test_objects(void **state)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                    "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\",\"d\"]}";
    struct grammar *g = schema_ok(s, GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "{\"b\":\"x\",\"d\":null}"));
    assert_true(matches(g, "{\"a\":1,\"b\":\"x\",\"c\":true,\"d\":[1]}"));
    assert_true(matches(g, "{\"a\":1,\"b\":\"\",\"d\":{}}"));
    assert_false(matches(g, "{\"a\":1,\"d\":null}"));          /* b is required */
    assert_false(matches(g, "{\"b\":\"x\"}"));                 /* d is required, in required's order after */
    assert_false(matches(g, "{\"b\":\"x\",\"d\":1,\"e\":1}"));  /* no other keys: properties are given */
    assert_false(matches(g, "{\"b\":\"x\",\"a\":1,\"d\":1}"));  /* declared order */
    assert_false(matches(g, "{,\"b\":\"x\",\"d\":1}"));
    grammar_destroy(g);
    /* STRICT: every property required */
    g = schema_ok("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}}}",
                  GRAMMAR_SCHEMA_STRICT | GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "{\"a\":1,\"b\":\"x\"}"));
    assert_false(matches(g, "{\"a\":1}"));
    assert_false(matches(g, "{}"));
    grammar_destroy(g);
    /* extra keys with a schema: never a declared name */
    g = schema_ok("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":{\"type\":\"null\"}},"
                  "\"additionalProperties\":{\"type\":\"string\"}}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "{\"a\":1,\"b\":\"x\"}"));
    assert_true(matches(g, "{\"abc\":\"x\",\"\":\"y\",\"x\\\"\":\"z\"}"));
    assert_true(matches(g, "{\"ab\":null,\"abc\\u0062\":\"x\"}"));
    assert_false(matches(g, "{\"a\\u0062c\":\"x\"}")); /* escapes only once the key has left every name */
    assert_false(matches(g, "{\"a\":\"x\"}"));
    assert_false(matches(g, "{\"a\":1,\"a\":\"x\"}"));
    assert_false(matches(g, "{\"ab\":\"x\"}"));
    assert_false(matches(g, "{\"\\u0061\":\"x\"}")); /* an escape cannot spell a declared name */
    assert_false(matches(g, "{\"b\":1}"));
    grammar_destroy(g);
    /* an optional property whose schema is false can only be left out */
    g = schema_ok("{\"type\":\"object\",\"properties\":{\"a\":false,\"b\":{\"type\":\"null\"}}}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "{\"b\":null}") && matches(g, "{}"));
    assert_false(matches(g, "{\"a\":null}"));
    grammar_destroy(g);
    /* no properties: any object */
    g = schema_ok("{\"type\":\"object\"}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "{\"x\":[1,{\"y\":null}],\"z\":\"w\"}"));
    assert_false(matches(g, "[]"));
    grammar_destroy(g);
    /* json_object mode */
    char err[ERR_MSG_MAX];
    assert_int_equal(grammar_compile_json_object(0, &g, err), 0);
    assert_true(matches(g, "{}"));
    assert_true(matches(g, " {\"a\": [1, 2.5e-3, true]}\n"));
    assert_false(matches(g, "\"x\""));
    assert_false(matches(g, "[{}]"));
    grammar_destroy(g);
}

static void test_arrays(void **state)
{
    struct grammar *g = schema_ok("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
                                  "\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":4}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "[\"a\"]"));
    assert_true(matches(g, "[\"a\",1]"));
    assert_true(matches(g, "[\"a\",1,true,false]"));
    assert_false(matches(g, "[]"));
    assert_false(matches(g, "[\"a\",1,true,false,true]"));
    assert_false(matches(g, "[1]"));
    assert_false(matches(g, "[\"a\",1,2]"));
    grammar_destroy(g);
    g = schema_ok("{\"type\":\"array\",\"items\":[{\"type\":\"null\"}],\"additionalItems\":false}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "[]") && matches(g, "[null]"));
    assert_false(matches(g, "[null,null]"));
    grammar_destroy(g);
    g = schema_ok("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", GRAMMAR_SCHEMA_COMPACT);
    assert_false(matches(g, "[1]"));
    assert_true(matches(g, "[1,2]") && matches(g, "[1,2,3]"));
    assert_false(matches(g, "[1,2,3,4]"));
    grammar_destroy(g);
    g = schema_ok("{\"type\":\"array\",\"maxItems\":0}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "[]"));
    assert_false(matches(g, "[1]"));
    grammar_destroy(g);
}

static void test_strings_and_whitespace(void **state)
{
    struct grammar *g = schema_ok("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "\"ab\"") && matches(g, "\"a\\n\"") && matches(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""));
    assert_false(matches(g, "\"a\"") || matches(g, "\"abcd\"") || matches(g, "\"a\nb\""));
    assert_false(matches(g, "\"\\ud800x\"")); /* no lone surrogates */
    grammar_destroy(g);
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}";
    g = schema_ok(s, 0);
    assert_true(matches(g, "{\"a\": [1, 2]}"));
    assert_true(matches(g, "{\n  \"a\": [\n    1,\n    2\n  ]\n}"));
    assert_true(matches(g, " {\"a\":[]} "));
    char spaces[128] = "{";
    memset(spaces + 1, ' ', 40);
    strcpy(spaces + 41, "\"a\":[]}");
    assert_false(matches(g, spaces)); /* whitespace is bounded */
    assert_false(matches(g, "{  \"a\":[]}"));
    grammar_destroy(g);
    g = schema_ok(s, GRAMMAR_SCHEMA_COMPACT);
    assert_false(matches(g, "{\"a\": [1]}"));
    assert_true(matches(g, "{\"a\":[1]}"));
    grammar_destroy(g);
    /* the GBNF text is available for debugging */
    char *gbnf, err[ERR_MSG_MAX];
    assert_int_equal(grammar_schema_to_gbnf(s, strlen(s), 0, &gbnf, err), 0);
    assert_non_null(strstr(gbnf, "root ::= ws s0 ws"));
    free(gbnf);
}

static void test_enum_const_anyof(void **state)
{
    const char *s = "{\"enum\":[\"red\",1.5,{\"a\":[1,null]},\"caf\xc3\xa9\",\"q\\\"\",false]}";
    struct grammar *g = schema_ok(s, GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "\"red\"") && matches(g, "1.5") && matches(g, "{\"a\":[1,null]}") &&
                matches(g, "\"caf\xc3\xa9\"") && matches(g, "\"q\\\"\"") && matches(g, "false"));
    assert_false(matches(g, "\"blue\"") || matches(g, "true") || matches(g, "1"));
    grammar_destroy(g);
    /* enum values the rest of the schema refuses are left out */
    g = schema_ok("{\"type\":\"string\",\"maxLength\":3,\"enum\":[\"ab\",\"abcd\",3]}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "\"ab\""));
    assert_false(matches(g, "\"abcd\"") || matches(g, "3"));
    grammar_destroy(g);
    g = schema_ok("{\"const\":{\"k\":\"v\"}}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "{\"k\":\"v\"}"));
    assert_false(matches(g, "{}"));
    grammar_destroy(g);
    g = schema_ok("{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}],\"title\":\"t\"}",
                  GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "null") && matches(g, "7"));
    assert_false(matches(g, "10") || matches(g, "\"x\""));
    grammar_destroy(g);
    g = schema_ok("{\"type\":[\"string\",\"null\"],\"maxLength\":1}", GRAMMAR_SCHEMA_COMPACT);
    assert_true(matches(g, "null") && matches(g, "\"a\""));
    assert_false(matches(g, "\"ab\""));
    grammar_destroy(g);
}

/* OpenAI strict mode allows 5000 properties: inlining every property's whitespace and number would pass
 * the automaton cap, so the compiler falls back to calling shared rules; the language is the same. */
static void test_large_schema(void **state)
{
    enum { N = 5000 };
    size_t cap = (size_t)N * 48 + 128;
    char *s = malloc(cap), *inst = malloc(cap);
    size_t n = (size_t)snprintf(s, cap, "{\"type\":\"object\",\"properties\":{");
    size_t k = (size_t)snprintf(inst, cap, "{");
    for (int i = 0; i < N; i++) {
        n += (size_t)snprintf(s + n, cap - n, "%s\"p%d\":{\"type\":\"%s\"}", i ? "," : "", i, i % 2 ? "string" : "integer");
        k += (size_t)snprintf(inst + k, cap - k, "%s\"p%d\": %s", i ? ", " : "", i, i % 2 ? "\"x\"" : "-12");
    }
    snprintf(s + n, cap - n, "}}");
    snprintf(inst + k, cap - k, "}");
    struct grammar *g = schema_ok(s, GRAMMAR_SCHEMA_STRICT);
    assert_true(grammar_n_states(g) < (1u << 18));
    assert_true(matches(g, inst));
    assert_int_equal(validate(s, inst), 0);
    char *cut = strstr(inst, ", \"p4999\"");
    strcpy(cut, "}");
    assert_false(matches(g, inst)); /* strict: every property required */
    grammar_destroy(g);
    free(s);
    free(inst);
}

/* ---- the validator ---- */

static void test_validator(void **state)
{
    static const struct {
        const char *schema, *value;
        int rc;
    } cases[] = {
        {"{\"type\":\"integer\"}", "1.0", 0},
        {"{\"type\":\"integer\"}", "1.5", ERR_INVALID_ARG},
        {"{\"type\":\"number\",\"maximum\":3}", "3", 0},
        {"{\"type\":\"number\",\"exclusiveMaximum\":3}", "3", ERR_INVALID_ARG},
        {"{\"type\":\"number\",\"minimum\":-1.5}", "-1.6", ERR_INVALID_ARG},
        {"{\"enum\":[1]}", "1.0", 0},
        {"{\"const\":[1,{\"a\":2}]}", "[1.0,{\"a\":2}]", 0},
        {"{\"const\":{\"a\":1}}", "{\"a\":1,\"b\":2}", ERR_INVALID_ARG},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}", "{\"b\":1}", 0},
        {"{\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":false}", "{\"b\":1}", ERR_INVALID_ARG},
        {"{\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":{\"type\":\"integer\"}}", "{\"a\":\"x\",\"b\":1}", 0},
        {"{\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":{\"type\":\"integer\"}}", "{\"b\":\"x\"}", ERR_INVALID_ARG},
        {"{\"required\":[\"a\"]}", "{}", ERR_INVALID_ARG},
        {"{\"required\":[\"a\"]}", "5", 0},
        {"{\"type\":\"string\",\"maxLength\":2}", "\"\xc3\xa9\xc3\xa9\"", 0},
        {"{\"type\":\"string\",\"minLength\":3}", "\"\xc3\xa9\xc3\xa9\"", ERR_INVALID_ARG},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1", ERR_INVALID_ARG},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1.5", 0},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", "null", ERR_INVALID_ARG},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"items\":false}", "[\"a\",1]", ERR_INVALID_ARG},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[1]", ERR_INVALID_ARG},
        {"{\"$defs\":{\"n\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},\"$ref\":\"#/$defs/n\"}", "[[],[[[]]]]", 0},
        {"{\"$defs\":{\"n\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},\"$ref\":\"#/$defs/n\"}", "[[1]]", ERR_INVALID_ARG},
        {"{\"$ref\":\"#\"}", "1", ERR_UNSUPPORTED},
        {"{\"type\":\"object\",\"not\":{}}", "{}", ERR_UNSUPPORTED},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", "\"1.2.3.4\"", ERR_UNSUPPORTED},
        {"{}", "{\"a\":1,\"a\":2}", ERR_INVALID_ARG},
        {"{}", "[1,", ERR_FORMAT},
        {"{", "1", ERR_FORMAT},
        {"true", "\"anything\"", 0},
        {"false", "1", ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ERR_MSG_MAX] = "";
        int rc = json_schema_validate(cases[i].schema, strlen(cases[i].schema), cases[i].value, strlen(cases[i].value), err);
        if (rc != cases[i].rc)
            print_message("case %zu %s / %s: got %d (%s), want %d\n", i, cases[i].schema, cases[i].value, rc, err, cases[i].rc);
        assert_int_equal(rc, cases[i].rc);
        if (rc)
            assert_true(err[0] != 0);
    }
    /* violations name the place */
    char err[ERR_MSG_MAX];
    const char *s = "{\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"maximum\":5}}}}";
    assert_int_equal(json_schema_validate(s, strlen(s), "{\"a\":[1,9]}", 11, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "value at /a/1"));
    assert_non_null(strstr(err, "maximum"));
}

/* ---- generation over the real vocabulary ---- */

static const char *const gen_schemas[] = {
    /* 0 flat record with formats and ranges */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":3}},\"required\":[\"name\",\"age\"]}",
    /* 1 nested objects and a pattern */
    "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":20},\"zip\":{\"type\":"
    "\"string\",\"pattern\":\"^[0-9]{5}(-[0-9]{4})?$\"}},\"required\":[\"city\",\"zip\"]}},\"required\":[\"id\",\"address\"]}},"
    "\"required\":[\"user\"]}",
    /* 2 array of enums */
    "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\",42,null,{\"x\":true}]},\"minItems\":1,\"maxItems\":6}",
    /* 3 anyOf */
    "{\"anyOf\":[{\"type\":\"string\",\"minLength\":1,\"maxLength\":8},{\"type\":\"null\"},{\"type\":\"integer\",\"minimum\":-5,"
    "\"maximum\":5},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}]}",
    /* 4 recursive $ref */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},"
    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},\"required\":[\"value\"],"
    "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
    /* 5 formats */
    "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\",\"format\":"
    "\"time\"},\"dt\":{\"type\":\"string\",\"format\":\"date-time\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\"}},"
    "\"required\":[\"d\",\"t\",\"dt\",\"id\"]}",
    /* 6 numeric ranges */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":-10},\"b\":{\"type\":"
    "\"integer\",\"exclusiveMinimum\":99,\"exclusiveMaximum\":1000},\"c\":{\"type\":\"number\"},\"d\":{\"type\":\"integer\","
    "\"minimum\":123456}},\"required\":[\"a\",\"b\",\"c\",\"d\"]}",
    /* 7 tuple */
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"maxLength\":10},{\"type\":\"integer\"},{\"type\":\"boolean\"}],"
    "\"items\":false,\"minItems\":2}",
    /* 8 additional properties with a schema */
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\","
    "\"maxLength\":6},\"required\":[\"id\"]}",
    /* 9 oneOf with discriminators */
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{\"type\":\"number\"}},"
    "\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":"
    "\"rect\"},\"w\":{\"type\":\"integer\"},\"h\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"w\",\"h\"],"
    "\"additionalProperties\":false}]}",
    /* 10 type array and const */
    "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":[\"string\",\"integer\",\"null\"],\"maxLength\":4},\"k\":{\"const\":"
    "\"fixed\"}},\"required\":[\"v\",\"k\"]}",
    /* 11 any JSON value */
    "{}",
};

static bool bit(const uint32_t *b, int id) { return b[id / 32] >> (id % 32) & 1; }

/* A seeded generation: uniform over the mask for 48 tokens, then EOS when allowed, else a single-byte
 * closing token, else uniform. Returns the text (caller frees) or NULL when it did not finish. */
static char *generate(const struct grammar *g, const struct token_trie *t, uint64_t seed, int *n_tokens)
{
    char err[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, t, err);
    int nv = token_trie_n_vocab(t);
    size_t nw = ((size_t)nv + 31) / 32;
    uint32_t *b = malloc(nw * 4), *b2 = malloc(nw * 4);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed), *closers = malloc((size_t)nv * sizeof *closers);
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    int steps = 0;
    bool done = false;
    while (steps < 3000) {
        assert_int_equal(grammar_matcher_mask(m, b), 0);
        if (steps % 16 == 0) {
            assert_int_equal(grammar_matcher_mask_exact(m, b2), 0);
            assert_memory_equal(b, b2, nw * 4);
        }
        int n = 0, nc = 0;
        int32_t eos = -1;
        for (int i = 0; i < nv; i++) {
            if (!bit(b, i))
                continue;
            allowed[n++] = i;
            uint32_t l;
            const char *p = token_trie_piece(t, i, &l);
            if (token_trie_is_eog(t, i))
                eos = i;
            else if (l == 1 && strchr("\"]}0123456789eflnrstu", p[0]))
                closers[nc++] = i;
        }
        assert_true(n > 0);
        int32_t tok;
        if (steps < 48)
            tok = allowed[test_rand_u64(&seed) % (uint64_t)n];
        else if (eos >= 0)
            tok = eos;
        else if (nc)
            tok = closers[test_rand_u64(&seed) % (uint64_t)nc];
        else
            tok = allowed[test_rand_u64(&seed) % (uint64_t)n];
        assert_int_equal(grammar_matcher_accept(m, tok), 0);
        steps++;
        if (token_trie_is_eog(t, tok)) {
            done = true;
            break;
        }
        uint32_t l;
        const char *p = token_trie_piece(t, tok, &l);
        if (len + l + 1 > cap) {
            cap = 2 * (len + l + 1);
            out = realloc(out, cap);
        }
        memcpy(out + len, p, l);
        len += l;
    }
    out[len] = 0;
    *n_tokens = steps;
    free(b);
    free(b2);
    free(allowed);
    free(closers);
    grammar_matcher_destroy(m);
    if (!done) {
        free(out);
        return NULL;
    }
    return out;
}

static void test_generation_real_vocab(void **state)
{
    const char *path = test_shared_path("tokenizer/ggml-vocab-llama-spm.gguf");
    if (!path) {
        print_message("[  SKIPPED ] shared file tokenizer/ggml-vocab-llama-spm.gguf not found (set WAFER_SHARED)\n");
        skip();
    }
    char err[ERR_MSG_MAX];
    struct gguf *gg = gguf_open(path, err);
    struct tokenizer *tok = tokenizer_create(gg, err);
    struct token_trie *t = token_trie_create(tok, err);
    assert_non_null(t);
    tokenizer_destroy(tok);
    gguf_close(gg);
    for (size_t i = 0; i < sizeof gen_schemas / sizeof gen_schemas[0]; i++) {
        for (unsigned flags = 0; flags <= GRAMMAR_SCHEMA_COMPACT; flags += GRAMMAR_SCHEMA_COMPACT) {
            struct grammar *g = schema_ok(gen_schemas[i], flags);
            for (uint64_t seed = 1; seed <= 4; seed++) {
                int n;
                char *out = generate(g, t, seed * 1000003 + i * 31 + flags, &n);
                if (!out)
                    print_message("schema %zu seed %llu did not finish in 3000 tokens\n", i, (unsigned long long)seed);
                assert_non_null(out);
                json_error_t je;
                json_t *v = json_loads(out, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                if (!v)
                    print_message("schema %zu: not JSON (%s): %s\n", i, je.text, out);
                assert_non_null(v);
                json_decref(v);
                int rc = json_schema_validate(gen_schemas[i], strlen(gen_schemas[i]), out, strlen(out), err);
                if (rc)
                    print_message("schema %zu: %s\n  output: %s\n", i, err, out);
                assert_int_equal(rc, 0);
                free(out);
            }
            grammar_destroy(g);
        }
    }
    token_trie_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_integer_ranges_exhaustive),
        cmocka_unit_test(test_date_exhaustive),
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_strings_and_whitespace),
        cmocka_unit_test(test_enum_const_anyof),
        cmocka_unit_test(test_large_schema),
        cmocka_unit_test(test_validator),
        cmocka_unit_test(test_generation_real_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
