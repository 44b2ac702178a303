/*
 * json_schema_validate: checks a JSON value against a schema of the supported subset with JSON Schema's own
 * semantics (additional properties allowed unless forbidden, keywords constrain only their own types,
 * oneOf means exactly one, 1 and 1.0 are equal, an integral real is an integer, string lengths count code
 * points), so every constrained answer can be checked against the schema the client sent before it is
 * returned. Patterns and formats are matched by compiling them to a grammar (regex.c in raw mode, the fmt-*
 * rules of json_schema_subset.c) and running a byte matcher over the decoded string; each distinct one is
 * compiled once per validation.
 */
#include "engine/grammar/grammar_impl.h"
#include "engine/grammar/json_schema_impl.h"

#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V_PTR_MAX 512

struct v_gram {
    const json_t *key; /* the pattern string node, or NULL for formats */
    char name[16];     /* the format */
    struct grammar *g;
};

struct vctx {
    json_t *doc;
    char *err;
    int depth;
    char ptr[V_PTR_MAX];
    size_t ptr_len;
    struct v_gram *grams;
    size_t n_grams, cap_grams;
};

static const char *v_at(const struct vctx *v) { return v->ptr_len ? v->ptr : "/ (the root)"; }

static int v_fail(struct vctx *v, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int v_fail(struct vctx *v, int code, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(v->err, code, "value at %s: %s", v_at(v), msg);
}

static size_t v_push(struct vctx *v, const char *seg)
{
    size_t saved = v->ptr_len;
    if (v->ptr_len + 2 < V_PTR_MAX)
        v->ptr[v->ptr_len++] = '/';
    for (const char *p = seg; *p && v->ptr_len + 3 < V_PTR_MAX; p++) {
        if (*p == '~')
            v->ptr[v->ptr_len++] = '~', v->ptr[v->ptr_len++] = '0';
        else if (*p == '/')
            v->ptr[v->ptr_len++] = '~', v->ptr[v->ptr_len++] = '1';
        else
            v->ptr[v->ptr_len++] = *p;
    }
    v->ptr[v->ptr_len] = 0;
    return saved;
}

static void v_pop(struct vctx *v, size_t saved)
{
    v->ptr_len = saved;
    v->ptr[saved] = 0;
}

/* ---- values ---- */

static bool v_is_integer(const json_t *x)
{
    if (json_is_integer(x))
        return true;
    if (!json_is_real(x))
        return false;
    double d = json_real_value(x);
    return isfinite(d) && d == floor(d);
}

/* Compares two numbers by value: <0, 0, >0. */
static int v_num_cmp(const json_t *a, const json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b)) {
        json_int_t x = json_integer_value(a), y = json_integer_value(b);
        return x < y ? -1 : x > y;
    }
    long double x = json_is_integer(a) ? (long double)json_integer_value(a) : (long double)json_real_value(a);
    long double y = json_is_integer(b) ? (long double)json_integer_value(b) : (long double)json_real_value(b);
    return x < y ? -1 : x > y;
}

static bool v_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return v_num_cmp(a, b) == 0;
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!v_equal(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)a, k, x)
        {
            json_t *y = json_object_get(b, k);
            if (!y || !v_equal(x, y))
                return false;
        }
        return true;
    }
    default:
        return true; /* true, false, null: same type */
    }
}

static size_t v_codepoints(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/* ---- patterns and formats ---- */

static int v_grammar(struct vctx *v, const json_t *pattern, const char *format, struct grammar **g)
{
    for (size_t i = 0; i < v->n_grams; i++) {
        if (pattern ? v->grams[i].key == pattern : (!v->grams[i].key && !strcmp(v->grams[i].name, format))) {
            *g = v->grams[i].g;
            return 0;
        }
    }
    struct gtext t = {0};
    char e[ERR_MSG_MAX];
    int rc;
    if (pattern) {
        gtext_puts(&t, "root ::= ");
        rc = regex_to_gbnf(json_string_value(pattern), json_string_length(pattern), false, &t, e);
        if (rc) {
            gtext_free(&t);
            return err_set(v->err, rc, "schema pattern '%s': %s", json_string_value(pattern), e);
        }
        gtext_puts(&t, "\n");
    } else {
        gtext_printf(&t, "root ::= fmt-%s\n", format);
        gtext_puts(&t, json_schema_format_rules);
        gtext_puts(&t, json_schema_format_time_valid);
    }
    if (t.oom) {
        gtext_free(&t);
        return err_set(v->err, ERR_NOMEM, "out of memory");
    }
    rc = grammar_compile_gbnf(t.p, t.n, g, e);
    gtext_free(&t);
    if (rc)
        return err_set(v->err, rc, "schema %s cannot be compiled: %s", pattern ? "pattern" : "format", e);
    if (v->n_grams + 1 > v->cap_grams) {
        size_t cap = v->cap_grams ? 2 * v->cap_grams : 8;
        struct v_gram *p = realloc(v->grams, cap * sizeof *p);
        if (!p) {
            grammar_destroy(*g);
            return err_set(v->err, ERR_NOMEM, "out of memory");
        }
        v->grams = p;
        v->cap_grams = cap;
    }
    struct v_gram *x = &v->grams[v->n_grams++];
    x->key = pattern;
    snprintf(x->name, sizeof x->name, "%s", format ? format : "");
    x->g = *g;
    return 0;
}

/* 1 when s matches, 0 when not, negative on error. */
static int v_match(struct vctx *v, const json_t *pattern, const char *format, const char *s, size_t n)
{
    struct grammar *g;
    int rc = v_grammar(v, pattern, format, &g);
    if (rc)
        return rc;
    char e[ERR_MSG_MAX];
    struct grammar_matcher *m = grammar_matcher_create(g, NULL, e);
    if (!m)
        return err_set(v->err, ERR_NOMEM, "out of memory");
    rc = grammar_matcher_accept_bytes(m, s, n);
    bool ok = rc == 0 && grammar_matcher_can_end(m);
    grammar_matcher_destroy(m);
    if (rc && rc != ERR_INVALID_ARG)
        return err_set(v->err, rc, "out of memory");
    return ok;
}

/* ---- the check ---- */

static int v_check(struct vctx *v, json_t *s, json_t *x, bool skip_enum);

static const char *v_type_name(const json_t *x)
{
    switch (json_typeof(x)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

static bool v_type_is(const json_t *x, const char *t)
{
    if (!strcmp(t, "null")) return json_is_null(x);
    if (!strcmp(t, "boolean")) return json_is_boolean(x);
    if (!strcmp(t, "object")) return json_is_object(x);
    if (!strcmp(t, "array")) return json_is_array(x);
    if (!strcmp(t, "string")) return json_is_string(x);
    if (!strcmp(t, "number")) return json_is_number(x);
    if (!strcmp(t, "integer")) return v_is_integer(x);
    return false;
}

static int v_type(struct vctx *v, json_t *t, json_t *x)
{
    if (json_is_string(t)) {
        if (!v_type_is(x, json_string_value(t)))
            return v_fail(v, ERR_INVALID_ARG, "expected type %s, got %s", json_string_value(t), v_type_name(x));
        return 0;
    }
    if (!json_is_array(t))
        return err_set(v->err, ERR_UNSUPPORTED, "schema: type must be a string or an array");
    for (size_t i = 0; i < json_array_size(t); i++)
        if (json_is_string(json_array_get(t, i)) && v_type_is(x, json_string_value(json_array_get(t, i))))
            return 0;
    return v_fail(v, ERR_INVALID_ARG, "type %s is not one of the allowed types", v_type_name(x));
}

static int v_object(struct vctx *v, json_t *s, json_t *x)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    int rc;
    for (size_t i = 0; json_is_array(req) && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (json_is_string(r) && !json_object_get(x, json_string_value(r)))
            return v_fail(v, ERR_INVALID_ARG, "required property '%s' is missing", json_string_value(r));
    }
    const char *k;
    json_t *val;
    json_object_foreach(x, k, val)
    {
        json_t *ps = json_is_object(props) ? json_object_get(props, k) : NULL;
        json_t *sub = ps ? ps : addl;
        if (!sub)
            continue;
        size_t saved = v_push(v, k);
        if (!ps && json_is_false(addl))
            rc = v_fail(v, ERR_INVALID_ARG, "additional property '%s' is not allowed", k);
        else
            rc = v_check(v, sub, val, false);
        v_pop(v, saved);
        if (rc)
            return rc;
    }
    return 0;
}

static int v_array(struct vctx *v, json_t *s, json_t *x)
{
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    json_t *mini = json_object_get(s, "minItems"), *maxi = json_object_get(s, "maxItems");
    size_t n = json_array_size(x);
    uint64_t b;
    if (mini && json_schema_uint(mini, UINT64_MAX >> 1, &b) && n < b)
        return v_fail(v, ERR_INVALID_ARG, "%zu items, fewer than minItems %llu", n, (unsigned long long)b);
    if (maxi && json_schema_uint(maxi, UINT64_MAX >> 1, &b) && n > b)
        return v_fail(v, ERR_INVALID_ARG, "%zu items, more than maxItems %llu", n, (unsigned long long)b);
    json_t *rest = items;
    if (json_is_array(items))
        prefix = items, rest = addi;
    size_t np = json_is_array(prefix) ? json_array_size(prefix) : 0;
    for (size_t i = 0; i < n; i++) {
        json_t *sub = i < np ? json_array_get(prefix, i) : rest;
        if (!sub)
            continue;
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        size_t saved = v_push(v, idx);
        int rc = json_is_false(sub) ? v_fail(v, ERR_INVALID_ARG, "no item allowed at this position")
                                    : v_check(v, sub, json_array_get(x, i), false);
        v_pop(v, saved);
        if (rc)
            return rc;
    }
    return 0;
}

static int v_string(struct vctx *v, json_t *s, json_t *x)
{
    const char *str = json_string_value(x);
    size_t bytes = json_string_length(x), n = v_codepoints(str, bytes);
    json_t *minl = json_object_get(s, "minLength"), *maxl = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    uint64_t b;
    if (minl && json_schema_uint(minl, UINT64_MAX >> 1, &b) && n < b)
        return v_fail(v, ERR_INVALID_ARG, "string of %zu characters, shorter than minLength %llu", n, (unsigned long long)b);
    if (maxl && json_schema_uint(maxl, UINT64_MAX >> 1, &b) && n > b)
        return v_fail(v, ERR_INVALID_ARG, "string of %zu characters, longer than maxLength %llu", n, (unsigned long long)b);
    if (json_is_string(pat)) {
        int m = v_match(v, pat, NULL, str, bytes);
        if (m < 0)
            return m;
        if (!m)
            return v_fail(v, ERR_INVALID_ARG, "string does not match pattern '%s'", json_string_value(pat));
    }
    if (json_is_string(fmt)) {
        if (!json_schema_format_known(json_string_value(fmt)))
            return err_set(v->err, ERR_UNSUPPORTED, "schema: format '%s' is not supported", json_string_value(fmt));
        int m = v_match(v, NULL, json_string_value(fmt), str, bytes);
        if (m < 0)
            return m;
        if (!m)
            return v_fail(v, ERR_INVALID_ARG, "string is not a valid %s", json_string_value(fmt));
    }
    return 0;
}

static int v_number(struct vctx *v, json_t *s, json_t *x)
{
    static const struct {
        const char *kw;
        int bad_sign; /* violated when cmp(x, bound) has this sign (or 0 for exclusive) */
        bool exclusive;
    } checks[] = {{"minimum", -1, false}, {"maximum", 1, false}, {"exclusiveMinimum", -1, true},
                  {"exclusiveMaximum", 1, true}};
    for (size_t i = 0; i < 4; i++) {
        json_t *bnd = json_object_get(s, checks[i].kw);
        bool exclusive = checks[i].exclusive;
        if (json_is_boolean(bnd)) { /* draft-04 */
            if (!json_is_true(bnd))
                continue;
            bnd = json_object_get(s, i == 2 ? "minimum" : "maximum");
            exclusive = true;
        }
        if (!bnd)
            continue;
        if (!json_is_number(bnd))
            return err_set(v->err, ERR_UNSUPPORTED, "schema: %s must be a number", checks[i].kw);
        int c = v_num_cmp(x, bnd);
        if (c == checks[i].bad_sign || (exclusive && c == 0)) {
            char *xs = json_dumps(x, JSON_ENCODE_ANY), *bs = json_dumps(bnd, JSON_ENCODE_ANY);
            int rc = v_fail(v, ERR_INVALID_ARG, "%s violates %s %s", xs ? xs : "number", checks[i].kw, bs ? bs : "");
            free(xs);
            free(bs);
            return rc;
        }
    }
    return 0;
}

static int v_check(struct vctx *v, json_t *s, json_t *x, bool skip_enum)
{
    if (json_is_true(s))
        return 0;
    if (json_is_false(s))
        return v_fail(v, ERR_INVALID_ARG, "the schema false accepts nothing");
    if (!json_is_object(s))
        return err_set(v->err, ERR_UNSUPPORTED, "schema: a schema must be an object or a boolean");
    if (v->depth >= JSON_SCHEMA_MAX_DEPTH)
        return err_set(v->err, ERR_UNSUPPORTED, "schema: more than %d nested schemas for one value (a $ref cycle?)",
                       JSON_SCHEMA_MAX_DEPTH);
    int rc = 0;
    const char *k;
    json_t *val;
    json_object_foreach(s, k, val)
    {
        if (json_schema_keyword(k) == KW_UNKNOWN)
            return err_set(v->err, ERR_UNSUPPORTED, "schema: unsupported keyword '%s'", k);
    }
    v->depth++;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        json_t *target;
        char e[ERR_MSG_MAX];
        if (!json_is_string(ref)) {
            rc = err_set(v->err, ERR_UNSUPPORTED, "schema: $ref must be a string");
            goto done;
        }
        if ((rc = json_schema_ref(v->doc, json_string_value(ref), "a schema", &target, e))) {
            err_set(v->err, rc, "schema: %s", e);
            goto done;
        }
        if ((rc = v_check(v, target, x, false)))
            goto done;
    }
    json_t *t = json_object_get(s, "type");
    if (t && (rc = v_type(v, t, x)))
        goto done;
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (!skip_enum && en) {
        if (!json_is_array(en)) {
            rc = err_set(v->err, ERR_UNSUPPORTED, "schema: enum must be an array");
            goto done;
        }
        size_t i = 0;
        while (i < json_array_size(en) && !v_equal(json_array_get(en, i), x))
            i++;
        if (i == json_array_size(en)) {
            rc = v_fail(v, ERR_INVALID_ARG, "value is not one of the enum values");
            goto done;
        }
    }
    if (!skip_enum && cn && !v_equal(cn, x)) {
        rc = v_fail(v, ERR_INVALID_ARG, "value is not the const value");
        goto done;
    }
    static const char *const combos[2] = {"anyOf", "oneOf"};
    for (int ci = 0; ci < 2; ci++) {
        json_t *arr = json_object_get(s, combos[ci]);
        if (!arr)
            continue;
        if (!json_is_array(arr)) {
            rc = err_set(v->err, ERR_UNSUPPORTED, "schema: %s must be an array", combos[ci]);
            goto done;
        }
        size_t passed = 0;
        char first_err[ERR_MSG_MAX] = "";
        for (size_t i = 0; i < json_array_size(arr); i++) {
            char *saved_err = v->err;
            char e[ERR_MSG_MAX];
            v->err = e;
            int r = v_check(v, json_array_get(arr, i), x, false);
            v->err = saved_err;
            if (r == 0)
                passed++;
            else if (r != ERR_INVALID_ARG) {
                rc = err_set(v->err, r, "%s", e);
                goto done;
            } else if (!first_err[0])
                snprintf(first_err, sizeof first_err, "%s", e);
        }
        if (!passed) {
            rc = v_fail(v, ERR_INVALID_ARG, "matches none of the %s schemas (first: %s)", combos[ci], first_err);
            goto done;
        }
        if (ci == 1 && passed > 1) {
            rc = v_fail(v, ERR_INVALID_ARG, "matches %zu of the oneOf schemas, not exactly one", passed);
            goto done;
        }
    }
    if (json_is_object(x))
        rc = v_object(v, s, x);
    else if (json_is_array(x))
        rc = v_array(v, s, x);
    else if (json_is_string(x))
        rc = v_string(v, s, x);
    else if (json_is_number(x))
        rc = v_number(v, s, x);
done:
    v->depth--;
    return rc;
}

static void v_free(struct vctx *v)
{
    for (size_t i = 0; i < v->n_grams; i++)
        grammar_destroy(v->grams[i].g);
    free(v->grams);
}

int json_schema_check(json_t *doc, json_t *schema, json_t *inst, bool skip_enum, char *err)
{
    struct vctx v = {.doc = doc, .err = err};
    int rc = v_check(&v, schema, inst, skip_enum);
    v_free(&v);
    return rc;
}

int json_schema_validate(const char *schema, size_t schema_len, const char *instance, size_t instance_len, char *err)
{
    json_error_t je;
    json_t *s = json_loadb(schema, schema_len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!s)
        return err_set(err, ERR_FORMAT, "schema is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL;
    json_t *x = json_loadb(instance, instance_len, flags, &je);
    if (!x && json_error_code(&je) == json_error_numeric_overflow) /* an integer past 64 bits: compare as reals */
        x = json_loadb(instance, instance_len, flags | JSON_DECODE_INT_AS_REAL, &je);
    if (!x) {
        int code = json_error_code(&je) == json_error_duplicate_key ? ERR_INVALID_ARG : ERR_FORMAT;
        json_decref(s);
        return err_set(err, code, "%s: %s (line %d, column %d)",
                       code == ERR_INVALID_ARG ? "duplicate key in the value" : "value is not valid JSON", je.text,
                       je.line, je.column);
    }
    int rc = json_schema_check(s, s, x, false, err);
    json_decref(s);
    json_decref(x);
    return rc;
}
