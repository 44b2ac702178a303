/*
 * gbnf: parses llama.cpp's GBNF grammar format into the AST (grammar_impl.h), with llama.cpp's layout rules:
 * a rule is `name ::= alternatives` and ends at a newline, except inside parentheses and right after `|`;
 * `#` starts a comment up to the end of the line. Terms: "literal", [class], [^class], `.`, a rule name,
 * ( group ); postfix `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}` apply to the term before them (a whole literal
 * or group). Names are letters, digits, `-` and `_`.
 *
 * Literal bytes are kept as bytes (escapes \xHH, \uHHHH, \UHHHHHHHH are code points, written as UTF-8, as in
 * llama.cpp); classes are decoded to code point ranges, sorted and merged, negation taken over all Unicode
 * scalar values (surrogates are never matched). Every error names its line and column.
 */
#include "engine/grammar/grammar_impl.h"

#include "core/err.h"

#include <stdlib.h>
#include <string.h>

#define GBNF_MAX_NEST 256 /* nested parentheses */

struct gbnf_parser {
    const char *s;
    size_t len, pos;
    struct gast *a;
    uint32_t *names; /* open addressing: rule id + 1, 0 empty */
    size_t n_names;  /* slots, a power of two */
    size_t lc_pos;   /* gbnf_line_col's cursor: positions only grow, so counting resumes from here */
    uint32_t lc_line, lc_col;
    char *err;
    int rc;
    int nest;
};

/* ---- AST building ---- */

static bool gast_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static uint32_t gast_node_add(struct gbnf_parser *p, uint8_t kind, uint32_t a, uint32_t b, uint32_t c)
{
    struct gast *g = p->a;
    if (!gast_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) {
        p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
        return GNONE;
    }
    g->nodes[g->n_nodes] = (struct gast_node){kind, a, b, c};
    return (uint32_t)g->n_nodes++;
}

static uint32_t gast_kids_add(struct gbnf_parser *p, const uint32_t *kids, size_t n)
{
    struct gast *g = p->a;
    if (!gast_grow((void **)&g->kids, &g->cap_kids, g->n_kids + n, sizeof *g->kids)) {
        p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
        return GNONE;
    }
    memcpy(g->kids + g->n_kids, kids, n * sizeof *kids);
    uint32_t off = (uint32_t)g->n_kids;
    g->n_kids += n;
    return off;
}

void gast_free(struct gast *a)
{
    for (size_t i = 0; i < a->n_rules; i++)
        free(a->rules[i].name);
    free(a->rules);
    free(a->nodes);
    free(a->bytes);
    free(a->ranges);
    free(a->kids);
    memset(a, 0, sizeof *a);
}

/* ---- errors with positions ---- */

static void gbnf_line_col(struct gbnf_parser *p, size_t at, uint32_t *line, uint32_t *col);

static int gbnf_fail(struct gbnf_parser *p, size_t at, const char *msg, const char *detail)
{
    if (p->rc)
        return p->rc;
    uint32_t line, col;
    gbnf_line_col(p, at, &line, &col);
    if (detail)
        p->rc = err_set(p->err, ERR_INVALID_ARG, "grammar: line %u, column %u: %s '%s'", line, col, msg, detail);
    else
        p->rc = err_set(p->err, ERR_INVALID_ARG, "grammar: line %u, column %u: %s", line, col, msg);
    return p->rc;
}

/* Line and column (1-based) of byte at, counting on from the last position asked (linear overall). */
static void gbnf_line_col(struct gbnf_parser *p, size_t at, uint32_t *line, uint32_t *col)
{
    if (at < p->lc_pos || !p->lc_line)
        p->lc_pos = 0, p->lc_line = 1, p->lc_col = 1;
    for (; p->lc_pos < at && p->lc_pos < p->len; p->lc_pos++) {
        if (p->s[p->lc_pos] == '\n')
            p->lc_line++, p->lc_col = 1;
        else
            p->lc_col++;
    }
    *line = p->lc_line;
    *col = p->lc_col;
}

/* ---- lexing ---- */

static int gbnf_peek(const struct gbnf_parser *p, size_t off)
{
    return p->pos + off < p->len ? (unsigned char)p->s[p->pos + off] : -1;
}

static bool gbnf_is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when newline_ok. */
static void gbnf_space(struct gbnf_parser *p, bool newline_ok)
{
    for (;;) {
        int c = gbnf_peek(p, 0);
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n' && p->s[p->pos] != '\r')
                p->pos++;
        } else {
            return;
        }
    }
}

/* Decodes one UTF-8 code point at p->pos (strictly: no overlongs, surrogates or values past U+10FFFF). */
static int gbnf_utf8(struct gbnf_parser *p, uint32_t *cp)
{
    size_t at = p->pos;
    int c = gbnf_peek(p, 0);
    if (c < 0x80) {
        *cp = (uint32_t)c;
        p->pos++;
        return 0;
    }
    int n;
    uint32_t v, min;
    if ((c & 0xe0) == 0xc0)
        n = 1, v = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        n = 2, v = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        n = 3, v = c & 0x07, min = 0x10000;
    else
        return gbnf_fail(p, at, "invalid UTF-8 in a character class", NULL);
    for (int i = 1; i <= n; i++) {
        int d = gbnf_peek(p, (size_t)i);
        if (d < 0 || (d & 0xc0) != 0x80)
            return gbnf_fail(p, at, "invalid UTF-8 in a character class", NULL);
        v = (v << 6) | (uint32_t)(d & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return gbnf_fail(p, at, "invalid UTF-8 in a character class", NULL);
    p->pos += (size_t)n + 1;
    *cp = v;
    return 0;
}

/* Hex digits of an escape whose backslash is at at. */
static int gbnf_hex(struct gbnf_parser *p, size_t at, int digits, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int c = gbnf_peek(p, 0);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return gbnf_fail(p, p->pos, digits == 2 ? "expected 2 hex digits after \\x" : "expected hex digits in \\u or \\U escape", NULL);
        v = v * 16 + (uint32_t)d;
        p->pos++;
    }
    if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return gbnf_fail(p, at, "escape is not a Unicode scalar value (surrogate or past U+10FFFF)", NULL);
    *out = v;
    return 0;
}

/* The escape after the backslash at p->pos - 1: its code point in *v. */
static int gbnf_escape(struct gbnf_parser *p, uint32_t *v)
{
    size_t at = p->pos - 1;
    int c = gbnf_peek(p, 0);
    if (c < 0)
        return gbnf_fail(p, at, "unfinished escape at end of input", NULL);
    p->pos++;
    switch (c) {
    case 'x': return gbnf_hex(p, at, 2, v);
    case 'u': return gbnf_hex(p, at, 4, v);
    case 'U': return gbnf_hex(p, at, 8, v);
    case 'n': *v = '\n'; return 0;
    case 'r': *v = '\r'; return 0;
    case 't': *v = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.':
        *v = (uint32_t)c;
        return 0;
    default: {
        char d[3] = {'\\', (char)c, 0};
        return gbnf_fail(p, at, "unknown escape", c >= 0x20 && c < 0x7f ? d : "\\ followed by a control or non-ASCII byte");
    }
    }
}

static int gbnf_put_utf8(struct gbnf_parser *p, uint32_t cp)
{
    struct gast *g = p->a;
    if (!gast_grow((void **)&g->bytes, &g->cap_bytes, g->n_bytes + 4, 1))
        return p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
    uint8_t *o = g->bytes + g->n_bytes;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        g->n_bytes += 1;
    } else if (cp < 0x800) {
        o[0] = (uint8_t)(0xc0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3f));
        g->n_bytes += 2;
    } else if (cp < 0x10000) {
        o[0] = (uint8_t)(0xe0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (cp & 0x3f));
        g->n_bytes += 3;
    } else {
        o[0] = (uint8_t)(0xf0 | (cp >> 18));
        o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
        o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        o[3] = (uint8_t)(0x80 | (cp & 0x3f));
        g->n_bytes += 4;
    }
    return 0;
}

/* ---- terms ---- */

static uint32_t gbnf_literal(struct gbnf_parser *p)
{
    size_t at = p->pos;
    p->pos++; /* opening quote */
    size_t start = p->a->n_bytes;
    for (;;) {
        int c = gbnf_peek(p, 0);
        if (c < 0) {
            gbnf_fail(p, at, "unterminated string literal", NULL);
            return GNONE;
        }
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c == '\\') {
            p->pos++;
            uint32_t v;
            if (gbnf_escape(p, &v) || gbnf_put_utf8(p, v))
                return GNONE;
        } else {
            struct gast *g = p->a;
            if (!gast_grow((void **)&g->bytes, &g->cap_bytes, g->n_bytes + 1, 1)) {
                p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
                return GNONE;
            }
            g->bytes[g->n_bytes++] = (uint8_t)c;
            p->pos++;
        }
    }
    size_t n = p->a->n_bytes - start;
    if (!n)
        return gast_node_add(p, GAST_EMPTY, 0, 0, 0);
    return gast_node_add(p, GAST_LIT, (uint32_t)start, (uint32_t)n, 0);
}

static int gbnf_range_cmp(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0;
}

/* Sorts and merges ranges[0..2n) in place; returns the new count. Surrogates are cut out. */
static size_t gbnf_ranges_normalize(uint32_t *r, size_t n)
{
    /* cut D800-DFFF out first (a range over it splits in two; the caller left room) */
    qsort(r, n, 2 * sizeof *r, gbnf_range_cmp);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (o && lo <= r[2 * o - 1] + 1) {
            if (hi > r[2 * o - 1])
                r[2 * o - 1] = hi;
        } else {
            r[2 * o] = lo;
            r[2 * o + 1] = hi;
            o++;
        }
    }
    return o;
}

/* Appends the class [lo..hi pairs] to the AST, complemented when negate, minus surrogates. */
static uint32_t gbnf_class_node(struct gbnf_parser *p, uint32_t *r, size_t n, bool negate)
{
    n = gbnf_ranges_normalize(r, n);
    /* complement or copy into a fresh list with surrogates removed: at most n + 2 ranges */
    struct gast *g = p->a;
    if (!gast_grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + 2 * (n + 2), sizeof *g->ranges)) {
        p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
        return GNONE;
    }
    uint32_t *tmp = malloc((2 * n + 4) * sizeof *tmp);
    if (!tmp) {
        p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
        return GNONE;
    }
    size_t t = 0;
    if (negate) {
        uint32_t next = 0;
        for (size_t i = 0; i < n; i++) {
            if (r[2 * i] > next)
                tmp[2 * t] = next, tmp[2 * t + 1] = r[2 * i] - 1, t++;
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10ffff)
            tmp[2 * t] = next, tmp[2 * t + 1] = 0x10ffff, t++;
    } else {
        memcpy(tmp, r, 2 * n * sizeof *r);
        t = n;
    }
    uint32_t off = (uint32_t)g->n_ranges;
    size_t o = 0;
    for (size_t i = 0; i < t; i++) {
        uint32_t lo = tmp[2 * i], hi = tmp[2 * i + 1];
        if (lo <= 0xdfff && hi >= 0xd800) { /* overlaps the surrogates */
            if (lo < 0xd800)
                g->ranges[off + 2 * o] = lo, g->ranges[off + 2 * o + 1] = 0xd7ff, o++;
            if (hi > 0xdfff)
                g->ranges[off + 2 * o] = 0xe000, g->ranges[off + 2 * o + 1] = hi, o++;
        } else {
            g->ranges[off + 2 * o] = lo, g->ranges[off + 2 * o + 1] = hi, o++;
        }
    }
    free(tmp);
    g->n_ranges += 2 * o;
    return gast_node_add(p, GAST_CLASS, off, (uint32_t)o, 0);
}

static uint32_t gbnf_class(struct gbnf_parser *p)
{
    size_t at = p->pos;
    p->pos++; /* [ */
    bool negate = false;
    if (gbnf_peek(p, 0) == '^') {
        negate = true;
        p->pos++;
    }
    uint32_t *r = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        int c = gbnf_peek(p, 0);
        if (c < 0) {
            gbnf_fail(p, at, "unterminated character class", NULL);
            goto fail;
        }
        if (c == ']') {
            p->pos++;
            break;
        }
        uint32_t lo, hi;
        size_t item = p->pos;
        if (c == '\\') {
            p->pos++;
            if (gbnf_escape(p, &lo))
                goto fail;
        } else if (gbnf_utf8(p, &lo)) {
            goto fail;
        }
        hi = lo;
        if (gbnf_peek(p, 0) == '-' && gbnf_peek(p, 1) != ']' && gbnf_peek(p, 1) >= 0) {
            p->pos++;
            if (gbnf_peek(p, 0) == '\\') {
                p->pos++;
                if (gbnf_escape(p, &hi))
                    goto fail;
            } else if (gbnf_utf8(p, &hi)) {
                goto fail;
            }
            if (hi < lo) {
                gbnf_fail(p, item, "character range is backwards (end before start)", NULL);
                goto fail;
            }
        }
        if (n + 1 > cap) {
            cap = cap ? 2 * cap : 16;
            uint32_t *q = realloc(r, (2 * cap + 4) * sizeof *r);
            if (!q) {
                p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
                goto fail;
            }
            r = q;
        }
        r[2 * n] = lo;
        r[2 * n + 1] = hi;
        n++;
    }
    uint32_t node = gbnf_class_node(p, r ? r : (uint32_t[2]){0, 0}, n, negate);
    free(r);
    return node;
fail:
    free(r);
    return GNONE;
}

static uint32_t gbnf_name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The id of rule name[0..n), created (first seen at at) when new; names are hashed, so a grammar of many
 * rules parses in linear time. */
static uint32_t gbnf_rule_id(struct gbnf_parser *p, const char *name, size_t n, size_t at)
{
    struct gast *g = p->a;
    if ((g->n_rules + 1) * 2 > p->n_names) {
        size_t ns = p->n_names ? 2 * p->n_names : 64;
        uint32_t *t = calloc(ns, sizeof *t);
        if (!t)
            goto oom;
        for (size_t i = 0; i < g->n_rules; i++) {
            size_t k = gbnf_name_hash(g->rules[i].name, strlen(g->rules[i].name)) & (ns - 1);
            while (t[k])
                k = (k + 1) & (ns - 1);
            t[k] = (uint32_t)i + 1;
        }
        free(p->names);
        p->names = t;
        p->n_names = ns;
    }
    size_t k = gbnf_name_hash(name, n) & (p->n_names - 1);
    for (; p->names[k]; k = (k + 1) & (p->n_names - 1)) {
        const char *x = g->rules[p->names[k] - 1].name;
        if (strlen(x) == n && !memcmp(x, name, n))
            return p->names[k] - 1;
    }
    if (!gast_grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules))
        goto oom;
    char *str = malloc(n + 1);
    if (!str)
        goto oom;
    memcpy(str, name, n);
    str[n] = 0;
    struct gast_rule *r = &g->rules[g->n_rules];
    r->name = str;
    r->body = GNONE;
    gbnf_line_col(p, at, &r->line, &r->col);
    p->names[k] = (uint32_t)g->n_rules + 1;
    return (uint32_t)g->n_rules++;
oom:
    p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
    return GNONE;
}

static int gbnf_uint(struct gbnf_parser *p, uint32_t *v)
{
    size_t at = p->pos;
    uint64_t x = 0;
    int c;
    if (!((c = gbnf_peek(p, 0)) >= '0' && c <= '9'))
        return gbnf_fail(p, at, "expected a number in {m,n}", NULL);
    while ((c = gbnf_peek(p, 0)) >= '0' && c <= '9') {
        x = x * 10 + (uint64_t)(c - '0');
        if (x > GRAMMAR_MAX_REPEAT)
            return gbnf_fail(p, at, "repetition count too large (the limit is 10000)", NULL);
        p->pos++;
    }
    *v = (uint32_t)x;
    return 0;
}

static uint32_t gbnf_alternates(struct gbnf_parser *p, bool nested);

/* A sequence of terms up to `|`, `)`, end of line (outside parentheses) or end of input. */
static uint32_t gbnf_sequence(struct gbnf_parser *p, bool nested)
{
    uint32_t *items = NULL;
    size_t n = 0, cap = 0;
    uint32_t node = GNONE;
    int n_ops = 0; /* repetition operators on the last item */
    for (;;) {
        int c = gbnf_peek(p, 0);
        size_t at = p->pos;
        uint32_t term = GNONE;
        if (c == '"') {
            term = gbnf_literal(p);
        } else if (c == '[') {
            term = gbnf_class(p);
        } else if (c == '.') {
            p->pos++;
            uint32_t all[4] = {0, 0x10ffff};
            term = gbnf_class_node(p, all, 1, false);
        } else if (c == '(') {
            if (++p->nest > GBNF_MAX_NEST) {
                gbnf_fail(p, at, "parentheses nested too deeply", NULL);
                goto done;
            }
            p->pos++;
            gbnf_space(p, true);
            term = gbnf_alternates(p, true);
            if (term == GNONE)
                goto done;
            int e = gbnf_peek(p, 0);
            if (e < 0) {
                gbnf_fail(p, at, "unclosed parenthesis", NULL);
                goto done;
            }
            if (e != ')') {
                char d[2] = {(char)e, 0};
                gbnf_fail(p, p->pos, "expected ')' to close the group, found", e >= 0x20 && e < 0x7f ? d : "a control or non-ASCII byte");
                goto done;
            }
            p->pos++;
            p->nest--;
        } else if (gbnf_is_word(c)) {
            size_t s = p->pos;
            while (gbnf_is_word(gbnf_peek(p, 0)))
                p->pos++;
            uint32_t id = gbnf_rule_id(p, p->s + s, p->pos - s, s);
            if (id != GNONE)
                term = gast_node_add(p, GAST_REF, id, 0, 0);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (!n) {
                gbnf_fail(p, at, "a repetition operator needs an item before it:", c == '{' ? "{" : (char[2]){(char)c, 0});
                goto done;
            }
            if (++n_ops > 8) {
                gbnf_fail(p, at, "too many repetition operators on one item", NULL);
                goto done;
            }
            uint32_t lo, hi;
            p->pos++;
            if (c == '*') {
                lo = 0, hi = GAST_INF;
            } else if (c == '+') {
                lo = 1, hi = GAST_INF;
            } else if (c == '?') {
                lo = 0, hi = 1;
            } else {
                gbnf_space(p, false);
                if (gbnf_peek(p, 0) == ',') {
                    lo = 0;
                } else if (gbnf_uint(p, &lo)) {
                    goto done;
                }
                gbnf_space(p, false);
                if (gbnf_peek(p, 0) == ',') {
                    p->pos++;
                    gbnf_space(p, false);
                    if (gbnf_peek(p, 0) == '}') {
                        hi = GAST_INF;
                    } else if (gbnf_uint(p, &hi)) {
                        goto done;
                    }
                } else {
                    hi = lo;
                }
                gbnf_space(p, false);
                if (gbnf_peek(p, 0) != '}') {
                    gbnf_fail(p, p->pos, "expected '}' to close the repetition {m,n}", NULL);
                    goto done;
                }
                p->pos++;
                if (hi < lo) {
                    gbnf_fail(p, at, "repetition {m,n} has n < m", NULL);
                    goto done;
                }
            }
            items[n - 1] = gast_node_add(p, GAST_REP, items[n - 1], lo, hi);
            if (items[n - 1] == GNONE)
                goto done;
            gbnf_space(p, nested);
            continue;
        } else {
            break;
        }
        if (term == GNONE)
            goto done;
        if (n + 1 > cap) {
            cap = cap ? 2 * cap : 8;
            uint32_t *q = realloc(items, cap * sizeof *q);
            if (!q) {
                p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
                goto done;
            }
            items = q;
        }
        items[n++] = term;
        n_ops = 0;
        gbnf_space(p, nested);
    }
    if (n == 0) {
        node = gast_node_add(p, GAST_EMPTY, 0, 0, 0);
    } else if (n == 1) {
        node = items[0];
    } else {
        uint32_t off = gast_kids_add(p, items, n);
        if (off != GNONE)
            node = gast_node_add(p, GAST_SEQ, off, (uint32_t)n, 0);
    }
done:
    free(items);
    return p->rc ? GNONE : node;
}

static uint32_t gbnf_alternates(struct gbnf_parser *p, bool nested)
{
    uint32_t *alts = NULL;
    size_t n = 0, cap = 0;
    uint32_t node = GNONE;
    for (;;) {
        uint32_t s = gbnf_sequence(p, nested);
        if (s == GNONE)
            goto done;
        if (n + 1 > cap) {
            cap = cap ? 2 * cap : 4;
            uint32_t *q = realloc(alts, cap * sizeof *q);
            if (!q) {
                p->rc = err_set(p->err, ERR_NOMEM, "out of memory parsing the grammar");
                goto done;
            }
            alts = q;
        }
        alts[n++] = s;
        if (gbnf_peek(p, 0) != '|')
            break;
        p->pos++;
        gbnf_space(p, true);
    }
    if (n == 1) {
        node = alts[0];
    } else {
        uint32_t off = gast_kids_add(p, alts, n);
        if (off != GNONE)
            node = gast_node_add(p, GAST_ALT, off, (uint32_t)n, 0);
    }
done:
    free(alts);
    return p->rc ? GNONE : node;
}

static int gbnf_rule(struct gbnf_parser *p)
{
    size_t at = p->pos;
    if (!gbnf_is_word(gbnf_peek(p, 0))) {
        int c = gbnf_peek(p, 0);
        char d[2] = {(char)c, 0};
        return gbnf_fail(p, at, "expected a rule name, found", c >= 0x20 && c < 0x7f ? d : "a control or non-ASCII byte");
    }
    while (gbnf_is_word(gbnf_peek(p, 0)))
        p->pos++;
    size_t name_end = p->pos;
    uint32_t id = gbnf_rule_id(p, p->s + at, name_end - at, at);
    if (id == GNONE)
        return p->rc;
    gbnf_space(p, false);
    if (!(gbnf_peek(p, 0) == ':' && gbnf_peek(p, 1) == ':' && gbnf_peek(p, 2) == '='))
        return gbnf_fail(p, p->pos, "expected '::=' after the rule name", p->a->rules[id].name);
    struct gast_rule *r = &p->a->rules[id];
    if (r->body != GNONE)
        return gbnf_fail(p, at, "rule defined twice:", r->name);
    gbnf_line_col(p, at, &r->line, &r->col);
    p->pos += 3;
    gbnf_space(p, true);
    uint32_t body = gbnf_alternates(p, false);
    if (body == GNONE)
        return p->rc;
    p->a->rules[id].body = body;
    int c = gbnf_peek(p, 0);
    if (c == '\r') {
        p->pos += gbnf_peek(p, 1) == '\n' ? 2 : 1;
    } else if (c == '\n') {
        p->pos++;
    } else if (c == ')') {
        return gbnf_fail(p, p->pos, "unmatched ')'", NULL);
    } else if (c >= 0) {
        char d[2] = {(char)c, 0};
        return gbnf_fail(p, p->pos, "expected the end of the line after the rule, found",
                         c >= 0x20 && c < 0x7f ? d : "a control or non-ASCII byte");
    }
    gbnf_space(p, true);
    return 0;
}

int gbnf_parse(const char *text, size_t len, struct gast *a, uint32_t *root, char *err)
{
    struct gbnf_parser p = {.s = text, .len = len, .a = a, .err = err};
    if (len > GRAMMAR_MAX_TEXT)
        return err_set(err, ERR_INVALID_ARG, "grammar: %zu bytes is over the limit of %u", len, GRAMMAR_MAX_TEXT);
    gbnf_space(&p, true);
    if (p.pos >= len)
        return err_set(err, ERR_INVALID_ARG, "grammar: empty (it needs at least a 'root ::= ...' rule)");
    while (p.pos < len) {
        if (gbnf_rule(&p)) {
            free(p.names);
            return p.rc;
        }
    }
    free(p.names);
    for (size_t i = 0; i < a->n_rules; i++) {
        if (a->rules[i].body == GNONE)
            return err_set(err, ERR_INVALID_ARG, "grammar: line %u, column %u: undefined rule '%s'", a->rules[i].line,
                           a->rules[i].col, a->rules[i].name);
    }
    for (size_t i = 0; i < a->n_rules; i++) {
        if (!strcmp(a->rules[i].name, "root")) {
            *root = (uint32_t)i;
            return 0;
        }
    }
    return err_set(err, ERR_INVALID_ARG, "grammar: no 'root' rule (the start rule must be called root)");
}
