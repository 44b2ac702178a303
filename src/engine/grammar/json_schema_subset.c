/*
 * json_schema_subset: the one definition of the JSON Schema subset wafer supports, used by both the
 * compiler and the validator: which keywords exist and what kind they are, local $ref resolution, integer
 * bounds, and the string formats as GBNF.
 *
 * Formats (RFC 3339 for date and time, exact calendar days including leap years, leap seconds see below; uuid in any version and
 * case; email a simplified RFC 5321 subset: dot-separated atoms of letters, digits and !#$%&'*+/=?^_`{|}~-
 * up to 64 characters each, an @, and a domain of 2 to 9 labels of letters, digits and inner hyphens).
 */
#include "engine/grammar/grammar_impl.h"
#include "engine/grammar/json_schema_impl.h"

#include "core/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const json_schema_formats[] = {"date", "time", "date-time", "uuid", "email", NULL};

const char json_schema_format_rules[] =
    "fmt-date ::= [0-9]{4} \"-\" ( (\"0\" [13578] | \"1\" [02]) \"-\" fmt-d31 | (\"0\" [469] | \"11\") \"-\" fmt-d30 "
    "| \"02-\" fmt-d28 ) | fmt-leap \"-02-29\"\n"
    "fmt-d31 ::= \"0\" [1-9] | [12] [0-9] | \"3\" [01]\n"
    "fmt-d30 ::= \"0\" [1-9] | [12] [0-9] | \"30\"\n"
    "fmt-d28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
    "fmt-leap ::= [0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [048] | [2468] [048] | [13579] [26]) \"00\"\n"
    "fmt-hms ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9]\n"
    "fmt-frac ::= \".\" [0-9]{1,9}\n"
    "fmt-offset ::= [-+] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9]\n"
    "fmt-uuid ::= fmt-hex{8} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{4} \"-\" fmt-hex{12}\n"
    "fmt-hex ::= [0-9a-fA-F]\n"
    "fmt-email ::= fmt-atom (\".\" fmt-atom){0,8} \"@\" fmt-label (\".\" fmt-label){1,8}\n"
    "fmt-atom ::= [a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\-]{1,64}\n"
    "fmt-label ::= [a-zA-Z0-9] ([a-zA-Z0-9\\-]{0,61} [a-zA-Z0-9])?\n";

/* RFC 3339 as the JSON Schema test suite reads it: t/z in either case, a leap second only at 23:59:60 UTC
 * (zero offset; other offsets would need clock arithmetic, so they are refused: stricter, never looser). */
const char json_schema_format_time_valid[] =
    "fmt-time ::= fmt-hms fmt-frac? ([zZ] | fmt-offset) | \"23:59:60\" fmt-frac? ([zZ] | [-+] \"00:00\")\n"
    "fmt-date-time ::= fmt-date [tT] fmt-time\n";

/* What the generator writes: upper-case T and Z, no leap seconds (valid for every validator). */
const char json_schema_format_time_generated[] =
    "fmt-time ::= fmt-hms fmt-frac? (\"Z\" | fmt-offset)\n"
    "fmt-date-time ::= fmt-date \"T\" fmt-time\n";

bool json_schema_format_known(const char *name)
{
    for (int i = 0; json_schema_formats[i]; i++)
        if (!strcmp(json_schema_formats[i], name))
            return true;
    return false;
}

static const struct {
    const char *name;
    enum json_schema_kw kind;
} json_schema_keywords[] = {
    {"title", KW_ANNOTATION}, {"description", KW_ANNOTATION}, {"$schema", KW_ANNOTATION},
    {"$id", KW_ANNOTATION}, {"$comment", KW_ANNOTATION}, {"default", KW_ANNOTATION},
    {"examples", KW_ANNOTATION}, {"deprecated", KW_ANNOTATION}, {"readOnly", KW_ANNOTATION},
    {"writeOnly", KW_ANNOTATION}, {"$defs", KW_DEFS}, {"definitions", KW_DEFS},
    {"type", KW_CORE}, {"enum", KW_CORE}, {"const", KW_CORE}, {"anyOf", KW_CORE}, {"oneOf", KW_CORE},
    {"$ref", KW_CORE}, {"properties", KW_OBJECT}, {"required", KW_OBJECT},
    {"additionalProperties", KW_OBJECT}, {"items", KW_ARRAY}, {"prefixItems", KW_ARRAY},
    {"additionalItems", KW_ARRAY}, {"minItems", KW_ARRAY}, {"maxItems", KW_ARRAY},
    {"minLength", KW_STRING}, {"maxLength", KW_STRING}, {"pattern", KW_STRING}, {"format", KW_STRING},
    {"minimum", KW_NUMBER}, {"maximum", KW_NUMBER}, {"exclusiveMinimum", KW_NUMBER},
    {"exclusiveMaximum", KW_NUMBER},
};

enum json_schema_kw json_schema_keyword(const char *k)
{
    for (size_t i = 0; i < sizeof json_schema_keywords / sizeof json_schema_keywords[0]; i++)
        if (!strcmp(json_schema_keywords[i].name, k))
            return json_schema_keywords[i].kind;
    return KW_UNKNOWN;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

int json_schema_ref(json_t *doc, const char *ref, const char *at, json_t **out, char *err)
{
    if (ref[0] != '#')
        return err_set(err, ERR_UNSUPPORTED, "$ref '%s' at %s: only references inside the schema (\"#...\") are "
                       "supported", ref, at);
    const char *p = ref + 1;
    json_t *cur = doc;
    if (*p && *p != '/')
        return err_set(err, ERR_UNSUPPORTED, "$ref '%s' at %s: anchors are not supported, use a JSON pointer like "
                       "#/$defs/name", ref, at);
    char seg[1024];
    while (*p == '/') {
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~') {
                if (*p == '0')
                    c = '~';
                else if (*p == '1')
                    c = '/';
                else
                    return err_set(err, ERR_INVALID_ARG, "$ref '%s' at %s: bad ~ escape", ref, at);
                p++;
            } else if (c == '%' && hexval(p[0]) >= 0 && hexval(p[1]) >= 0) {
                c = (char)(hexval(p[0]) * 16 + hexval(p[1]));
                p += 2;
            }
            if (n + 1 >= sizeof seg)
                return err_set(err, ERR_INVALID_ARG, "$ref '%s' at %s: segment too long", ref, at);
            seg[n++] = c;
        }
        seg[n] = 0;
        json_t *next = NULL;
        if (json_is_object(cur)) {
            next = json_object_getn(cur, seg, n);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long idx = strtoul(seg, &end, 10);
            if (n && *end == 0 && (seg[0] != '0' || n == 1))
                next = json_array_get(cur, idx);
        }
        if (!next)
            return err_set(err, ERR_INVALID_ARG, "$ref '%s' at %s does not point at anything in the schema", ref, at);
        cur = next;
    }
    *out = cur;
    return 0;
}

bool json_schema_uint(const json_t *v, uint64_t limit, uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || (uint64_t)x > limit)
            return false;
        *out = (uint64_t)x;
        return true;
    }
    if (json_is_real(v)) {
        double x = json_real_value(v);
        if (!(x >= 0) || x > (double)limit || x != floor(x))
            return false;
        *out = (uint64_t)x;
        return true;
    }
    return false;
}

/* Clamps to one past the generated range on either side, so a bound outside it empties the range instead
 * of widening it. */
static int64_t bound_clamp(double x)
{
    if (x <= (double)-JSON_SCHEMA_INT_MAX)
        return -JSON_SCHEMA_INT_MAX - 1;
    if (x >= (double)JSON_SCHEMA_INT_MAX)
        return JSON_SCHEMA_INT_MAX + 1;
    return (int64_t)x;
}

/* A numeric keyword as a double; ints beyond 2^53 are clamped anyway. */
static int bound_get(const json_t *s, const char *k, double *x, bool *has, char *err, const char *at)
{
    json_t *v = json_object_get(s, k);
    *has = false;
    if (!v || json_is_boolean(v))
        return 0;
    if (!json_is_number(v))
        return err_set(err, ERR_INVALID_ARG, "'%s' at %s must be a number", k, at);
    *x = json_number_value(v);
    *has = true;
    return 0;
}

int json_schema_int_bounds(const json_t *s, int64_t *lo, int64_t *hi, bool *bounded, char *err, const char *at)
{
    double mn, mx, emn, emx;
    bool hmn, hmx, hemn, hemx;
    int rc;
    if ((rc = bound_get(s, "minimum", &mn, &hmn, err, at)) || (rc = bound_get(s, "maximum", &mx, &hmx, err, at)) ||
        (rc = bound_get(s, "exclusiveMinimum", &emn, &hemn, err, at)) ||
        (rc = bound_get(s, "exclusiveMaximum", &emx, &hemx, err, at)))
        return rc;
    /* draft-04: exclusiveMinimum: true makes minimum exclusive */
    if (json_is_true(json_object_get(s, "exclusiveMinimum")) && hmn)
        hemn = true, emn = mn, hmn = false;
    if (json_is_true(json_object_get(s, "exclusiveMaximum")) && hmx)
        hemx = true, emx = mx, hmx = false;
    *lo = -JSON_SCHEMA_INT_MAX;
    *hi = JSON_SCHEMA_INT_MAX;
    *bounded = hmn || hmx || hemn || hemx;
    if (hmn) {
        int64_t v = bound_clamp(ceil(mn));
        if (v > *lo)
            *lo = v;
    }
    if (hemn) {
        int64_t v = bound_clamp(floor(emn) + 1);
        if (v > *lo)
            *lo = v;
    }
    if (hmx) {
        int64_t v = bound_clamp(floor(mx));
        if (v < *hi)
            *hi = v;
    }
    if (hemx) {
        int64_t v = bound_clamp(ceil(emx) - 1);
        if (v < *hi)
            *hi = v;
    }
    return 0;
}
