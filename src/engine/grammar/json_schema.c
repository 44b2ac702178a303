/*
 * json_schema: JSON Schema -> GBNF text -> grammar (grammar_compile_gbnf). Each subschema becomes a rule
 * s<N> (memoized by node, so $ref recursion becomes rule recursion); shared rules json-value, json-string,
 * json-number, ... and the fmt-* formats (json_schema_subset.c) come first. Keywords outside the subset,
 * and combinations the generator cannot express exactly, are errors naming the keyword and its JSON pointer
 * (fail closed). Generation choices, all of which produce only valid instances:
 *   - objects: properties in declared order, then names that are only in `required`; optional ones may be
 *     left out. When properties exist and additionalProperties is absent no other keys are generated; extra
 *     keys (additionalProperties true or a schema) can never spell a declared name. Without properties and
 *     additionalProperties, any object. STRICT: every property required, no other keys.
 *   - arrays: prefixItems (or draft-07 tuple items) first, then items, counts within minItems..maxItems
 *     (at most 10000 when bounded).
 *   - strings: JSON escapes allowed (no lone surrogates); minLength/maxLength count characters with an
 *     escape as one; pattern and format are exact, but not combined with each other or with lengths.
 *   - numbers: at most 16 integer digits, 16 fraction digits, 2 exponent digits; integers at most 16 digits;
 *     integer minimum/maximum/exclusive* as an exact decimal range grammar; minimum/maximum on non-integer
 *     numbers are refused.
 *   - enum/const: each value as compact JSON, keeping only the values the rest of the schema accepts.
 *   - anyOf/oneOf: alternatives (oneOf's "exactly one" is for the validator to enforce); not combined with
 *     other constraining keywords.
 *   - whitespace: none (COMPACT) or at most one run between tokens: a space, or a newline and up to 32 spaces
 *     or tabs, so a model cannot loop on whitespace.
 */
#include "engine/grammar/grammar_impl.h"
#include "engine/grammar/json_schema_impl.h"

#include "core/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SC_PTR_MAX 1024

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJECT = 4,
    T_ARRAY = 8,
    T_NUMBER = 16,
    T_STRING = 32,
    T_INTEGER = 64,
};

struct sc_memo {
    const json_t *node;
    uint32_t id;
};

struct sc {
    json_t *doc;
    unsigned flags;
    char *err;
    int rc;
    struct gtext defs;
    struct sc_memo *memo; /* open addressing by node pointer; node NULL = empty */
    size_t n_memo, cap_memo;
    char **rule_ptr; /* [n_rules] JSON pointer of rule s<i> (error messages) */
    size_t n_rules, cap_rules;
    char ptr[SC_PTR_MAX];
    size_t ptr_len;
    int depth;
};

static const char sc_common[] =
    "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"\n"
    "json-object ::= \"{\" ws ( json-string ws \":\" ws json-value ( ws \",\" ws json-string ws \":\" ws json-value )* ws )? \"}\"\n"
    "json-array ::= \"[\" ws ( json-value ( ws \",\" ws json-value )* ws )? \"]\"\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-C] json-hex{3} | [dD] [0-7] json-hex{2} | [eEfF] json-hex{3} ) )\n"
    "json-hex ::= [0-9a-fA-F]\n"
    "json-number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "json-int ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "json-key-char ::= [^\"\\\\\\x00-\\x1F]\n";

static int sc_fail(struct sc *c, int code, const char *fmt, const char *a)
{
    if (!c->rc) {
        char msg[ERR_MSG_MAX];
        snprintf(msg, sizeof msg, fmt, a ? a : "");
        c->rc = err_set(c->err, code, "json schema: %s at %s", msg, c->ptr_len ? c->ptr : "/ (the root)");
    }
    return c->rc;
}

static int sc_oom(struct sc *c)
{
    if (!c->rc)
        c->rc = err_set(c->err, ERR_NOMEM, "out of memory compiling the JSON schema");
    return c->rc;
}

static size_t sc_push(struct sc *c, const char *seg)
{
    size_t saved = c->ptr_len;
    if (c->ptr_len + 2 < SC_PTR_MAX)
        c->ptr[c->ptr_len++] = '/';
    for (const char *p = seg; *p && c->ptr_len + 3 < SC_PTR_MAX; p++) {
        if (*p == '~')
            c->ptr[c->ptr_len++] = '~', c->ptr[c->ptr_len++] = '0';
        else if (*p == '/')
            c->ptr[c->ptr_len++] = '~', c->ptr[c->ptr_len++] = '1';
        else
            c->ptr[c->ptr_len++] = *p;
    }
    c->ptr[c->ptr_len] = 0;
    return saved;
}

static size_t sc_push_index(struct sc *c, size_t i)
{
    char b[24];
    snprintf(b, sizeof b, "%zu", i);
    return sc_push(c, b);
}

static void sc_pop(struct sc *c, size_t saved)
{
    c->ptr_len = saved;
    c->ptr[saved] = 0;
}

static uint32_t sc_new_rule(struct sc *c)
{
    char **p = c->rule_ptr;
    if (c->n_rules + 1 > c->cap_rules) {
        size_t cap = c->cap_rules ? 2 * c->cap_rules : 32;
        p = realloc(c->rule_ptr, cap * sizeof *p);
        if (!p) {
            sc_oom(c);
            return GNONE;
        }
        c->rule_ptr = p;
        c->cap_rules = cap;
    }
    c->rule_ptr[c->n_rules] = strdup(c->ptr_len ? c->ptr : "/");
    if (!c->rule_ptr[c->n_rules]) {
        sc_oom(c);
        return GNONE;
    }
    return (uint32_t)c->n_rules++;
}

static void sc_define(struct sc *c, uint32_t id, const struct gtext *body)
{
    gtext_printf(&c->defs, "s%u ::= ", id);
    gtext_put(&c->defs, body->p ? body->p : "\"\"", body->p ? body->n : 2);
    gtext_puts(&c->defs, "\n");
    if (body->oom)
        c->defs.oom = true;
}

static int sc_schema(struct sc *c, json_t *node, uint32_t *id);

/* ---- strings ---- */

static int sc_string(struct sc *c, json_t *s, struct gtext *o)
{
    json_t *minl = json_object_get(s, "minLength"), *maxl = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    uint64_t lo = 0, hi = GAST_INF;
    if (minl && !json_schema_uint(minl, GRAMMAR_MAX_REPEAT, &lo))
        return sc_fail(c, json_schema_uint(minl, UINT64_MAX >> 1, &lo) ? ERR_UNSUPPORTED : ERR_INVALID_ARG,
                       "minLength must be a non-negative integer (at most 10000)%s", NULL);
    if (maxl && !json_schema_uint(maxl, GRAMMAR_MAX_REPEAT, &hi))
        return sc_fail(c, json_schema_uint(maxl, UINT64_MAX >> 1, &hi) ? ERR_UNSUPPORTED : ERR_INVALID_ARG,
                       "maxLength must be a non-negative integer (at most 10000)%s", NULL);
    if (pat && !json_is_string(pat))
        return sc_fail(c, ERR_INVALID_ARG, "pattern must be a string%s", NULL);
    if (fmt && !json_is_string(fmt))
        return sc_fail(c, ERR_INVALID_ARG, "format must be a string%s", NULL);
    if (pat && (fmt || minl || maxl))
        return sc_fail(c, ERR_UNSUPPORTED, "'pattern' combined with %s is not supported",
                       fmt ? "'format'" : "'minLength'/'maxLength'");
    if (fmt && (minl || maxl))
        return sc_fail(c, ERR_UNSUPPORTED, "'format' combined with 'minLength'/'maxLength' is not supported%s", NULL);
    gtext_puts(o, "\"\\\"\" ");
    if (fmt) {
        const char *f = json_string_value(fmt);
        if (!json_schema_format_known(f))
            return sc_fail(c, ERR_UNSUPPORTED, "format '%s' is not supported (supported: date, time, date-time, "
                           "uuid, email)", f);
        gtext_printf(o, "fmt-%s", f);
    } else if (pat) {
        char perr[ERR_MSG_MAX];
        int rc = regex_to_gbnf(json_string_value(pat), json_string_length(pat), true, o, perr);
        if (rc)
            return sc_fail(c, rc, "%s", perr);
    } else {
        if (hi != GAST_INF && lo > hi)
            return sc_fail(c, ERR_INVALID_ARG, "minLength is greater than maxLength: no string satisfies both%s", NULL);
        if (lo == 0 && hi == GAST_INF)
            gtext_puts(o, "json-char*");
        else if (hi == GAST_INF)
            gtext_printf(o, "json-char{%u,}", (unsigned)lo);
        else
            gtext_printf(o, "json-char{%u,%u}", (unsigned)lo, (unsigned)hi);
    }
    gtext_puts(o, " \"\\\"\"");
    return 0;
}

/* ---- integers: exact decimal ranges ---- */

/* Digit strings of length n (leading zeros allowed) from lo to hi (same length, lo <= hi). */
static void sc_digits(struct gtext *o, const char *lo, const char *hi, size_t n)
{
    if (!n) {
        gtext_puts(o, "\"\"");
        return;
    }
    if (!memcmp(lo, hi, n)) {
        gtext_gbnf_literal(o, lo, n);
        return;
    }
    if (lo[0] == hi[0]) {
        gtext_printf(o, "\"%c\" ", lo[0]);
        sc_digits(o, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo_zeros = true, hi_nines = true;
    for (size_t i = 1; i < n; i++) {
        lo_zeros &= lo[i] == '0';
        hi_nines &= hi[i] == '9';
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    char mid_lo = lo_zeros ? lo[0] : (char)(lo[0] + 1), mid_hi = hi_nines ? hi[0] : (char)(hi[0] - 1);
    gtext_puts(o, "(");
    bool any = false;
    if (!lo_zeros) {
        gtext_printf(o, "\"%c\" (", lo[0]);
        sc_digits(o, lo + 1, nines, n - 1);
        gtext_puts(o, ")");
        any = true;
    }
    if (mid_lo <= mid_hi) {
        if (any)
            gtext_puts(o, " | ");
        gtext_printf(o, "[%c-%c]", mid_lo, mid_hi);
        if (n > 1)
            gtext_printf(o, " [0-9]{%zu}", n - 1);
        any = true;
    }
    if (!hi_nines) {
        if (any)
            gtext_puts(o, " | ");
        gtext_printf(o, "\"%c\" (", hi[0]);
        sc_digits(o, zeros, hi + 1, n - 1);
        gtext_puts(o, ")");
    }
    gtext_puts(o, ")");
}

/* Non-negative integers a..b (a <= b) without leading zeros, as an alternation over digit counts. */
static void sc_range_nonneg(struct gtext *o, int64_t a, int64_t b)
{
    char la[24], lb[24];
    int na = snprintf(la, sizeof la, "%lld", (long long)a), nb = snprintf(lb, sizeof lb, "%lld", (long long)b);
    gtext_puts(o, "(");
    for (int len = na; len <= nb; len++) {
        char lo[24], hi[24];
        if (len == na)
            memcpy(lo, la, (size_t)len);
        else
            lo[0] = '1', memset(lo + 1, '0', (size_t)len - 1);
        if (len == nb)
            memcpy(hi, lb, (size_t)len);
        else
            memset(hi, '9', (size_t)len);
        if (len > na)
            gtext_puts(o, " | ");
        gtext_puts(o, "(");
        sc_digits(o, lo, hi, (size_t)len);
        gtext_puts(o, ")");
    }
    gtext_puts(o, ")");
}

static int sc_integer(struct sc *c, json_t *s, struct gtext *o)
{
    int64_t lo, hi;
    bool bounded;
    char e[ERR_MSG_MAX];
    int rc = json_schema_int_bounds(s, &lo, &hi, &bounded, e, c->ptr_len ? c->ptr : "/");
    if (rc) {
        if (!c->rc)
            c->rc = err_set(c->err, rc, "json schema: %s", e);
        return c->rc;
    }
    if (!bounded) {
        gtext_puts(o, "json-int");
        return 0;
    }
    if (lo > hi)
        return sc_fail(c, ERR_INVALID_ARG, "no integer of at most 16 digits satisfies minimum/maximum%s", NULL);
    gtext_puts(o, "(");
    bool any = false;
    if (lo < 0) {
        int64_t nlo = hi < 0 ? -hi : 1;
        gtext_puts(o, "\"-\" ");
        sc_range_nonneg(o, nlo, -lo);
        any = true;
    }
    if (hi >= 0) {
        if (any)
            gtext_puts(o, " | ");
        sc_range_nonneg(o, lo > 0 ? lo : 0, hi);
    }
    gtext_puts(o, ")");
    return 0;
}

/* ---- objects ---- */

struct sc_prop {
    const char *name;
    json_t *schema; /* NULL: any value */
    bool required;
};

/* A rule for JSON string bodies (between the quotes) that never decode to one of names[0..n) (sorted,
 * distinct): a trie over their code points; leaving it takes a raw character that continues no name, and
 * only raw characters are allowed inside it (an escape could spell a name another way). */
static uint32_t sc_key_trie(struct sc *c, const char **names, size_t n, size_t k)
{
    uint32_t id = sc_new_rule(c);
    if (id == GNONE)
        return GNONE;
    struct gtext o = {0};
    bool terminal = false;
    size_t i = 0;
    /* names with exactly k bytes are terminal (k always lies on a code point boundary here) */
    while (i < n && strlen(names[i]) == k)
        terminal = true, i++;
    gtext_puts(&o, "( [^\"\\\\\\x00-\\x1F");
    for (size_t j = i; j < n;) {
        /* next code point of names[j] at byte k */
        const unsigned char *p = (const unsigned char *)names[j] + k;
        size_t len = p[0] < 0x80 ? 1 : p[0] < 0xe0 ? 2 : p[0] < 0xf0 ? 3 : 4;
        uint32_t cp = len == 1 ? p[0] : len == 2 ? p[0] & 0x1f : len == 3 ? p[0] & 0x0f : p[0] & 0x07;
        for (size_t b = 1; b < len; b++)
            cp = (cp << 6) | (p[b] & 0x3f);
        gtext_gbnf_class_char(&o, cp);
        size_t e = j;
        while (e < n && !memcmp(names[e] + k, p, len))
            e++;
        j = e;
    }
    gtext_puts(&o, "] json-char*");
    for (size_t j = i; j < n;) {
        const unsigned char *p = (const unsigned char *)names[j] + k;
        size_t len = p[0] < 0x80 ? 1 : p[0] < 0xe0 ? 2 : p[0] < 0xf0 ? 3 : 4;
        size_t e = j;
        while (e < n && !memcmp(names[e] + k, p, len))
            e++;
        uint32_t sub = sc_key_trie(c, names + j, e - j, k + len);
        if (sub == GNONE) {
            gtext_free(&o);
            return GNONE;
        }
        gtext_puts(&o, " | ");
        gtext_gbnf_literal(&o, (const char *)p, len);
        gtext_printf(&o, " s%u", sub);
        j = e;
    }
    if (!terminal)
        gtext_puts(&o, " | \"\"");
    gtext_puts(&o, " )");
    sc_define(c, id, &o);
    gtext_free(&o);
    return id;
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static bool sc_key_plain(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p == '"' || *p == '\\' || *p < 0x20)
            return false;
    return true;
}

/* The GBNF of one "key": value pair. value_rule GNONE: any JSON value. */
static void sc_kv(struct gtext *o, const char *name, uint32_t value_rule)
{
    json_t *js = json_string(name);
    char *enc = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(js);
    if (!enc) {
        o->oom = true;
        return;
    }
    gtext_gbnf_literal(o, enc, strlen(enc));
    free(enc);
    if (value_rule == GNONE)
        gtext_puts(o, " ws \":\" ws json-value");
    else
        gtext_printf(o, " ws \":\" ws s%u", value_rule);
}

static int sc_object(struct sc *c, json_t *s, struct gtext *o)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    bool strict = c->flags & GRAMMAR_SCHEMA_STRICT;
    struct sc_prop *pv = NULL;
    uint32_t *vr = NULL, *post = NULL, *pre = NULL;
    const char **names = NULL;
    size_t n = 0;
    int rc = 0;
    if (props && !json_is_object(props))
        return sc_fail(c, ERR_INVALID_ARG, "properties must be an object%s", NULL);
    if (req && !json_is_array(req))
        return sc_fail(c, ERR_INVALID_ARG, "required must be an array of strings%s", NULL);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sc_fail(c, ERR_INVALID_ARG, "additionalProperties must be a boolean or a schema%s", NULL);
    size_t cap = (props ? json_object_size(props) : 0) + (req ? json_array_size(req) : 0);
    pv = calloc(cap ? cap : 1, sizeof *pv);
    if (!pv)
        return sc_oom(c);
    const char *key;
    json_t *val;
    json_object_foreach(props, key, val) pv[n++] = (struct sc_prop){key, val, strict};
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) {
            rc = sc_fail(c, ERR_INVALID_ARG, "required must be an array of strings%s", NULL);
            goto done;
        }
        size_t j = 0;
        while (j < n && strcmp(pv[j].name, json_string_value(r)))
            j++;
        if (j < n)
            pv[j].required = true;
        else
            pv[n++] = (struct sc_prop){json_string_value(r), NULL, true};
    }
    /* extra keys: GNONE none, else the value rule (json-value when UINT32_MAX - 1) */
    enum { EXTRA_NONE, EXTRA_ANY, EXTRA_SCHEMA } extra;
    uint32_t extra_rule = GNONE;
    if (strict || json_is_false(addl) || (!addl && props))
        extra = EXTRA_NONE;
    else if (!addl || json_is_true(addl))
        extra = EXTRA_ANY;
    else
        extra = EXTRA_SCHEMA;
    vr = malloc((n ? n : 1) * sizeof *vr);
    post = malloc((n + 1) * sizeof *post);
    pre = malloc((n + 1) * sizeof *pre);
    if (!vr || !post || !pre) {
        rc = sc_oom(c);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        vr[i] = GNONE;
        if (json_is_false(pv[i].schema) && !pv[i].required) { /* can never appear: leave it out */
            memmove(pv + i, pv + i + 1, (n - i - 1) * sizeof *pv);
            n--, i--;
            continue;
        }
        if (!pv[i].schema)
            continue;
        size_t saved = sc_push(c, "properties");
        sc_push(c, pv[i].name);
        rc = sc_schema(c, pv[i].schema, &vr[i]);
        sc_pop(c, saved);
        if (rc)
            goto done;
    }
    if (extra == EXTRA_SCHEMA) {
        size_t saved = sc_push(c, "additionalProperties");
        rc = sc_schema(c, addl, &extra_rule);
        sc_pop(c, saved);
        if (rc)
            goto done;
    }
    /* the key of an extra pair */
    struct gtext key_rule = {0};
    if (extra != EXTRA_NONE) {
        if (n) {
            names = malloc(n * sizeof *names);
            if (!names) {
                rc = sc_oom(c);
                goto done;
            }
            size_t m = 0;
            for (size_t i = 0; i < n; i++) {
                if (!sc_key_plain(pv[i].name)) {
                    rc = sc_fail(c, ERR_UNSUPPORTED, "a property name with a quote, backslash or control character "
                                 "('%s') together with additional properties is not supported", pv[i].name);
                    goto done;
                }
                names[m++] = pv[i].name;
            }
            qsort(names, m, sizeof *names, str_cmp);
            size_t u = 0;
            for (size_t i = 0; i < m; i++)
                if (!u || strcmp(names[u - 1], names[i]))
                    names[u++] = names[i];
            uint32_t kt = sc_key_trie(c, names, u, 0);
            if (kt == GNONE) {
                rc = c->rc ? c->rc : sc_oom(c);
                goto done;
            }
            gtext_printf(&key_rule, "\"\\\"\" s%u \"\\\"\"", kt);
        } else {
            gtext_puts(&key_rule, "json-string");
        }
    }
    /* post_i: something was emitted, items i.. remain; pre_i: nothing emitted yet */
    for (size_t i = 0; i <= n; i++)
        if ((post[i] = sc_new_rule(c)) == GNONE || (pre[i] = sc_new_rule(c)) == GNONE) {
            rc = c->rc;
            gtext_free(&key_rule);
            goto done;
        }
    for (size_t i = n + 1; i-- > 0;) {
        struct gtext a = {0}, b = {0};
        if (i == n) {
            if (extra == EXTRA_NONE) {
                gtext_puts(&a, "\"\"");
                gtext_puts(&b, "\"\"");
            } else {
                char v[32];
                if (extra == EXTRA_ANY)
                    snprintf(v, sizeof v, "json-value");
                else
                    snprintf(v, sizeof v, "s%u", extra_rule);
                gtext_printf(&a, "( ws \",\" ws %s ws \":\" ws %s )*", key_rule.p, v);
                gtext_printf(&b, "( %s ws \":\" ws %s ( ws \",\" ws %s ws \":\" ws %s )* )?", key_rule.p, v, key_rule.p, v);
            }
        } else {
            struct gtext kv = {0};
            sc_kv(&kv, pv[i].name, vr[i]);
            if (pv[i].required) {
                gtext_printf(&a, "ws \",\" ws %s s%u", kv.p ? kv.p : "", post[i + 1]);
                gtext_printf(&b, "%s s%u", kv.p ? kv.p : "", post[i + 1]);
            } else {
                gtext_printf(&a, "( ws \",\" ws %s )? s%u", kv.p ? kv.p : "", post[i + 1]);
                gtext_printf(&b, "%s s%u | s%u", kv.p ? kv.p : "", post[i + 1], pre[i + 1]);
            }
            if (kv.oom)
                a.oom = true;
            gtext_free(&kv);
        }
        sc_define(c, post[i], &a);
        sc_define(c, pre[i], &b);
        gtext_free(&a);
        gtext_free(&b);
    }
    gtext_free(&key_rule);
    gtext_printf(o, "\"{\" ws s%u ws \"}\"", pre[0]);
done:
    free(pv);
    free(vr);
    free(post);
    free(pre);
    free(names);
    return rc ? rc : c->rc;
}

/* ---- arrays ---- */

static int sc_array(struct sc *c, json_t *s, struct gtext *o)
{
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    json_t *mini = json_object_get(s, "minItems"), *maxi = json_object_get(s, "maxItems");
    uint64_t lo = 0, hi = GAST_INF;
    uint32_t *pr = NULL, item_rule = GNONE;
    int rc = 0;
    if (mini && !json_schema_uint(mini, GRAMMAR_MAX_REPEAT, &lo))
        return sc_fail(c, json_schema_uint(mini, UINT64_MAX >> 1, &lo) ? ERR_UNSUPPORTED : ERR_INVALID_ARG,
                       "minItems must be a non-negative integer (at most 10000)%s", NULL);
    if (maxi && !json_schema_uint(maxi, GRAMMAR_MAX_REPEAT, &hi))
        return sc_fail(c, json_schema_uint(maxi, UINT64_MAX >> 1, &hi) ? ERR_UNSUPPORTED : ERR_INVALID_ARG,
                       "maxItems must be a non-negative integer (at most 10000)%s", NULL);
    if (prefix && json_is_array(items))
        return sc_fail(c, ERR_INVALID_ARG, "prefixItems together with an array-valued items%s", NULL);
    const char *prefix_kw = "prefixItems";
    json_t *rest = items;
    if (json_is_array(items)) { /* draft-07 tuple */
        prefix = items, prefix_kw = "items";
        rest = addi;
    } else if (addi) {
        return sc_fail(c, ERR_UNSUPPORTED, "additionalItems without an array-valued items%s", NULL);
    }
    if (prefix && !json_is_array(prefix))
        return sc_fail(c, ERR_INVALID_ARG, "prefixItems must be an array of schemas%s", NULL);
    if (rest && !json_is_boolean(rest) && !json_is_object(rest))
        return sc_fail(c, ERR_INVALID_ARG, "items must be a schema%s", NULL);
    size_t np = prefix ? json_array_size(prefix) : 0;
    if (json_is_false(rest) && (hi == GAST_INF || hi > np))
        hi = np;
    if (hi != GAST_INF && lo > hi)
        return sc_fail(c, ERR_INVALID_ARG, "minItems is greater than maxItems (or the items allowed): no array "
                       "satisfies both%s", NULL);
    pr = malloc((np ? np : 1) * sizeof *pr);
    if (!pr)
        return sc_oom(c);
    for (size_t i = 0; i < np; i++) {
        size_t saved = sc_push(c, prefix_kw);
        sc_push_index(c, i);
        rc = sc_schema(c, json_array_get(prefix, i), &pr[i]);
        sc_pop(c, saved);
        if (rc)
            goto done;
    }
    if (rest && json_is_object(rest)) {
        size_t saved = sc_push(c, json_is_array(items) ? "additionalItems" : "items");
        rc = sc_schema(c, rest, &item_rule);
        sc_pop(c, saved);
        if (rc)
            goto done;
    }
    char item[32];
    if (item_rule != GNONE)
        snprintf(item, sizeof item, "s%u", item_rule);
    else
        snprintf(item, sizeof item, "json-value");
    if (hi == 0) {
        gtext_puts(o, "\"[\" ws \"]\"");
        goto done;
    }
    /* after_i: positions i.. each preceded by a comma; a rule per prefix position, then a repetition */
    uint32_t next = GNONE;
    {
        struct gtext t = {0};
        uint64_t start = np < hi ? np : hi; /* first position past the prefix */
        uint64_t need = lo > start ? lo - start : 0;
        if (hi == GAST_INF)
            gtext_printf(&t, "( ws \",\" ws %s ){%u,}", item, (unsigned)need);
        else if (hi > start)
            gtext_printf(&t, "( ws \",\" ws %s ){%u,%u}", item, (unsigned)need, (unsigned)(hi - start));
        else
            gtext_puts(&t, "\"\"");
        if (need > GRAMMAR_MAX_REPEAT || (hi != GAST_INF && hi - start > GRAMMAR_MAX_REPEAT)) {
            gtext_free(&t);
            rc = sc_fail(c, ERR_UNSUPPORTED, "array length bounds over 10000 are not supported%s", NULL);
            goto done;
        }
        next = sc_new_rule(c);
        if (next == GNONE) {
            gtext_free(&t);
            rc = c->rc;
            goto done;
        }
        sc_define(c, next, &t);
        gtext_free(&t);
        for (size_t i = (np < hi ? np : (size_t)hi); i-- > 1;) {
            struct gtext a = {0};
            if (i < lo)
                gtext_printf(&a, "ws \",\" ws s%u s%u", pr[i], next);
            else
                gtext_printf(&a, "( ws \",\" ws s%u s%u )?", pr[i], next);
            uint32_t r = sc_new_rule(c);
            if (r == GNONE) {
                gtext_free(&a);
                rc = c->rc;
                goto done;
            }
            sc_define(c, r, &a);
            gtext_free(&a);
            next = r;
        }
    }
    /* position 0 */
    char first[32];
    if (np)
        snprintf(first, sizeof first, "s%u", pr[0]);
    else
        snprintf(first, sizeof first, "%s", item);
    if (np == 0) {
        /* all positions use item: first element then the repetition (which counted positions from 0) */
        uint64_t need = lo > 1 ? lo - 1 : 0;
        struct gtext t = {0};
        if (hi == GAST_INF)
            gtext_printf(&t, "( ws \",\" ws %s ){%u,}", item, (unsigned)need);
        else
            gtext_printf(&t, "( ws \",\" ws %s ){%u,%u}", item, (unsigned)need, (unsigned)(hi - 1));
        uint32_t r = sc_new_rule(c);
        if (r == GNONE) {
            gtext_free(&t);
            rc = c->rc;
            goto done;
        }
        sc_define(c, r, &t);
        gtext_free(&t);
        next = r;
    }
    if (lo == 0)
        gtext_printf(o, "\"[\" ws ( %s s%u ws )? \"]\"", first, next);
    else
        gtext_printf(o, "\"[\" ws %s s%u ws \"]\"", first, next);
done:
    free(pr);
    return rc ? rc : c->rc;
}

/* ---- enum, anyOf, $ref ---- */

static int sc_enum(struct sc *c, json_t *s, struct gtext *o)
{
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && cn)
        return sc_fail(c, ERR_UNSUPPORTED, "'enum' together with 'const' is not supported%s", NULL);
    if (en && (!json_is_array(en) || !json_array_size(en)))
        return sc_fail(c, ERR_INVALID_ARG, "enum must be a non-empty array%s", NULL);
    size_t n = en ? json_array_size(en) : 1;
    if (n > 100000)
        return sc_fail(c, ERR_UNSUPPORTED, "enum with more than 100000 values is not supported%s", NULL);
    bool any = false;
    gtext_puts(o, "(");
    for (size_t i = 0; i < n; i++) {
        json_t *v = en ? json_array_get(en, i) : cn;
        char verr[ERR_MSG_MAX];
        int rc = json_schema_check(c->doc, s, v, true, verr);
        if (rc == ERR_INVALID_ARG)
            continue; /* the rest of the schema rejects this value */
        if (rc) {
            if (!c->rc)
                c->rc = err_set(c->err, rc, "json schema: %s", verr);
            return c->rc;
        }
        char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!t)
            return sc_oom(c);
        if (any)
            gtext_puts(o, " | ");
        gtext_gbnf_literal(o, t, strlen(t));
        free(t);
        any = true;
    }
    gtext_puts(o, ")");
    if (!any)
        return sc_fail(c, ERR_INVALID_ARG, "no %s value satisfies the rest of the schema", en ? "enum" : "const");
    return 0;
}

/* Fails on keywords other than the allowed kinds next to kw. */
static int sc_only(struct sc *c, json_t *s, const char *kw, const char *also)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        enum json_schema_kw kind = json_schema_keyword(k);
        if (kind == KW_ANNOTATION || kind == KW_DEFS || !strcmp(k, kw) || (also && !strcmp(k, also)))
            continue;
        char what[256];
        snprintf(what, sizeof what, "'%s' combined with '%s' is not supported", kw, k);
        return sc_fail(c, ERR_UNSUPPORTED, "%s", what);
    }
    return 0;
}

static int sc_anyof(struct sc *c, json_t *s, const char *kw, struct gtext *o)
{
    json_t *arr = json_object_get(s, kw);
    if (sc_only(c, s, kw, NULL))
        return c->rc;
    if (!json_is_array(arr) || !json_array_size(arr))
        return sc_fail(c, ERR_INVALID_ARG, "%s must be a non-empty array of schemas", kw);
    gtext_puts(o, "(");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        uint32_t id;
        size_t saved = sc_push(c, kw);
        sc_push_index(c, i);
        int rc = sc_schema(c, json_array_get(arr, i), &id);
        sc_pop(c, saved);
        if (rc)
            return rc;
        gtext_printf(o, i ? " | s%u" : "s%u", id);
    }
    gtext_puts(o, ")");
    return 0;
}

static int sc_ref(struct sc *c, json_t *s, struct gtext *o)
{
    json_t *r = json_object_get(s, "$ref");
    if (sc_only(c, s, "$ref", NULL))
        return c->rc;
    if (!json_is_string(r))
        return sc_fail(c, ERR_INVALID_ARG, "$ref must be a string%s", NULL);
    json_t *target;
    char e[ERR_MSG_MAX];
    int rc = json_schema_ref(c->doc, json_string_value(r), c->ptr_len ? c->ptr : "/", &target, e);
    if (rc) {
        if (!c->rc)
            c->rc = err_set(c->err, rc, "json schema: %s", e);
        return c->rc;
    }
    /* errors inside the target name the target's location */
    char saved[SC_PTR_MAX];
    size_t saved_len = c->ptr_len;
    memcpy(saved, c->ptr, saved_len + 1);
    const char *frag = json_string_value(r) + 1;
    snprintf(c->ptr, sizeof c->ptr, "%s", frag);
    c->ptr_len = strlen(c->ptr);
    uint32_t id;
    rc = sc_schema(c, target, &id);
    memcpy(c->ptr, saved, saved_len + 1);
    c->ptr_len = saved_len;
    if (rc)
        return rc;
    gtext_printf(o, "s%u", id);
    return 0;
}

/* ---- types ---- */

static unsigned sc_type_bit(const char *t)
{
    static const struct {
        const char *name;
        unsigned bit;
    } types[] = {{"null", T_NULL}, {"boolean", T_BOOL}, {"object", T_OBJECT}, {"array", T_ARRAY},
                 {"number", T_NUMBER}, {"string", T_STRING}, {"integer", T_INTEGER}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(types[i].name, t))
            return types[i].bit;
    return 0;
}

static int sc_types(struct sc *c, json_t *s, unsigned *types)
{
    json_t *t = json_object_get(s, "type");
    *types = 0;
    if (json_is_string(t)) {
        if (!(*types = sc_type_bit(json_string_value(t))))
            return sc_fail(c, ERR_INVALID_ARG, "unknown type '%s'", json_string_value(t));
    } else if (json_is_array(t)) {
        for (size_t i = 0; i < json_array_size(t); i++) {
            json_t *x = json_array_get(t, i);
            unsigned b = json_is_string(x) ? sc_type_bit(json_string_value(x)) : 0;
            if (!b)
                return sc_fail(c, ERR_INVALID_ARG, "type must be a type name or an array of them%s", NULL);
            *types |= b;
        }
        if (!*types)
            return sc_fail(c, ERR_INVALID_ARG, "type must not be an empty array%s", NULL);
    } else if (t) {
        return sc_fail(c, ERR_INVALID_ARG, "type must be a type name or an array of them%s", NULL);
    } else {
        /* no type: the types the keywords constrain (anything else would also be valid, but is not what the
         * schema's author asked for); no such keyword: any value */
        const char *k;
        json_t *v;
        json_object_foreach(s, k, v)
        {
            switch (json_schema_keyword(k)) {
            case KW_OBJECT: *types |= T_OBJECT; break;
            case KW_ARRAY: *types |= T_ARRAY; break;
            case KW_STRING: *types |= T_STRING; break;
            case KW_NUMBER: *types |= T_NUMBER; break;
            default: break;
            }
        }
    }
    if ((*types & T_NUMBER) && (*types & T_INTEGER))
        *types &= ~(unsigned)T_INTEGER; /* every integer is a number */
    return 0;
}

static int sc_body(struct sc *c, json_t *s, struct gtext *o)
{
    if (json_is_true(s)) {
        gtext_puts(o, "json-value");
        return 0;
    }
    if (json_is_false(s))
        return sc_fail(c, ERR_INVALID_ARG, "the schema false can never be satisfied%s", NULL);
    if (!json_is_object(s))
        return sc_fail(c, ERR_INVALID_ARG, "a schema must be an object or a boolean%s", NULL);
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (json_schema_keyword(k) == KW_UNKNOWN) {
            size_t saved = sc_push(c, k);
            sc_fail(c, ERR_UNSUPPORTED, "unsupported keyword '%s'", k);
            sc_pop(c, saved);
            return c->rc;
        }
    }
    if (json_object_get(s, "$ref"))
        return sc_ref(c, s, o);
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return sc_enum(c, s, o);
    if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))
        return sc_fail(c, ERR_UNSUPPORTED, "'anyOf' together with 'oneOf' is not supported%s", NULL);
    if (json_object_get(s, "anyOf"))
        return sc_anyof(c, s, "anyOf", o);
    if (json_object_get(s, "oneOf"))
        return sc_anyof(c, s, "oneOf", o);
    unsigned types;
    if (sc_types(c, s, &types))
        return c->rc;
    if (!types) {
        gtext_puts(o, "json-value");
        return 0;
    }
    if ((types & T_NUMBER) && (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                               json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum")))
        return sc_fail(c, ERR_UNSUPPORTED, "minimum/maximum on type number are not supported (only on "
                       "integer)%s", NULL);
    gtext_puts(o, "(");
    bool any = false;
    for (unsigned bit = 1; bit <= T_INTEGER; bit <<= 1) {
        if (!(types & bit))
            continue;
        if (any)
            gtext_puts(o, " | ");
        any = true;
        int rc = 0;
        switch (bit) {
        case T_NULL: gtext_puts(o, "\"null\""); break;
        case T_BOOL: gtext_puts(o, "\"true\" | \"false\""); break;
        case T_NUMBER: gtext_puts(o, "json-number"); break;
        case T_INTEGER: rc = sc_integer(c, s, o); break;
        case T_STRING: rc = sc_string(c, s, o); break;
        case T_OBJECT: rc = sc_object(c, s, o); break;
        case T_ARRAY: rc = sc_array(c, s, o); break;
        }
        if (rc)
            return rc;
    }
    gtext_puts(o, ")");
    return 0;
}

static size_t sc_memo_slot(const struct sc *c, const json_t *node)
{
    uint64_t h = (uint64_t)(uintptr_t)node * 0x9e3779b97f4a7c15ull;
    size_t k = (size_t)(h >> 32) & (c->cap_memo - 1);
    while (c->memo[k].node && c->memo[k].node != node)
        k = (k + 1) & (c->cap_memo - 1);
    return k;
}

static int sc_schema(struct sc *c, json_t *node, uint32_t *id)
{
    if (c->cap_memo) {
        size_t k = sc_memo_slot(c, node);
        if (c->memo[k].node) {
            *id = c->memo[k].id;
            return 0;
        }
    }
    if (c->depth >= JSON_SCHEMA_MAX_DEPTH)
        return sc_fail(c, ERR_INVALID_ARG, "schema nested more than 256 levels deep%s", NULL);
    uint32_t r = sc_new_rule(c);
    if (r == GNONE)
        return c->rc;
    if ((c->n_memo + 1) * 2 > c->cap_memo) {
        size_t cap = c->cap_memo ? 2 * c->cap_memo : 64;
        struct sc_memo *old = c->memo;
        size_t old_cap = c->cap_memo;
        c->memo = calloc(cap, sizeof *c->memo);
        if (!c->memo) {
            c->memo = old;
            return sc_oom(c);
        }
        c->cap_memo = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].node)
                c->memo[sc_memo_slot(c, old[i].node)] = old[i];
        free(old);
    }
    c->memo[sc_memo_slot(c, node)] = (struct sc_memo){node, r};
    c->n_memo++;
    struct gtext body = {0};
    c->depth++;
    int rc = sc_body(c, node, &body);
    c->depth--;
    if (!rc)
        sc_define(c, r, &body);
    gtext_free(&body);
    if (rc)
        return rc;
    *id = r;
    return c->rc;
}

/* ---- entry points ---- */

static void sc_free(struct sc *c)
{
    gtext_free(&c->defs);
    for (size_t i = 0; i < c->n_rules; i++)
        free(c->rule_ptr[i]);
    free(c->rule_ptr);
    free(c->memo);
    json_decref(c->doc);
}

static void sc_header(const struct sc *c, struct gtext *t, const char *root_body)
{
    if (c->flags & GRAMMAR_SCHEMA_COMPACT) {
        gtext_printf(t, "root ::= %s\n", root_body);
        gtext_puts(t, "ws ::= \"\"\n");
    } else {
        gtext_printf(t, "root ::= ws %s ws\n", root_body);
        gtext_puts(t, "ws ::= ( \" \" | \"\\n\" [ \\t]{0,32} )?\n");
    }
    gtext_puts(t, sc_common);
    gtext_puts(t, json_schema_format_rules);
    gtext_puts(t, json_schema_format_time_generated);
}

/* Builds the GBNF of schema into *out (caller frees). */
static int sc_compile_text(const char *json, size_t len, unsigned flags, struct sc *c, char **out, char *err)
{
    json_error_t je;
    memset(c, 0, sizeof *c);
    c->flags = flags;
    c->err = err;
    c->doc = json_loadb(json, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!c->doc)
        return err_set(err, ERR_FORMAT, "json schema is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                       je.column);
    uint32_t root;
    if (sc_schema(c, c->doc, &root))
        return c->rc;
    struct gtext t = {0};
    char rb[32];
    snprintf(rb, sizeof rb, "s%u", root);
    sc_header(c, &t, rb);
    gtext_put(&t, c->defs.p ? c->defs.p : "", c->defs.n);
    if (t.oom || c->defs.oom) {
        gtext_free(&t);
        return sc_oom(c);
    }
    *out = t.p;
    return 0;
}

int grammar_schema_to_gbnf(const char *json, size_t len, unsigned flags, char **gbnf, char *err)
{
    struct sc c;
    *gbnf = NULL;
    int rc = sc_compile_text(json, len, flags, &c, gbnf, err);
    sc_free(&c);
    return rc;
}

int grammar_compile_schema(const char *json, size_t len, unsigned flags, struct grammar **out, char *err)
{
    struct sc c;
    char *text = NULL;
    *out = NULL;
    int rc = sc_compile_text(json, len, flags, &c, &text, err);
    if (!rc) {
        char gerr[ERR_MSG_MAX];
        rc = grammar_compile_gbnf(text, strlen(text), out, gerr);
        if (rc) {
            /* name the schema location behind a generated rule s<N> */
            const char *p = strstr(gerr, "rule 's");
            unsigned id;
            const char *q = p ? strchr(p + 6, '\'') : NULL;
            if (p && q && sscanf(p, "rule 's%u'", &id) == 1 && id < c.n_rules)
                err_set(err, rc, "json schema at %s cannot be compiled: the schema there%s", c.rule_ptr[id], q + 1);
            else
                err_set(err, rc, "json schema cannot be compiled: %s", gerr);
        }
    }
    free(text);
    sc_free(&c);
    return rc;
}

int grammar_compile_json_object(unsigned flags, struct grammar **out, char *err)
{
    struct sc c = {.flags = flags};
    struct gtext t = {0};
    sc_header(&c, &t, "json-object");
    *out = NULL;
    if (t.oom) {
        gtext_free(&t);
        return err_set(err, ERR_NOMEM, "out of memory");
    }
    int rc = grammar_compile_gbnf(t.p, t.n, out, err);
    gtext_free(&t);
    return rc;
}
