/*
 * regex: JSON Schema `pattern` (an ECMA-262 regular expression) to a GBNF expression, for the subset a
 * grammar can express exactly: literals, escapes (\d \D \w \W \s \S \t \n \r \v \f \0 \xHH \uHHHH \u{H..}
 * and escaped punctuation), classes with ranges and negation, `.`, groups ( ), (?: ), (?<name> ),
 * alternation, quantifiers * + ? {n} {n,} {n,m} (lazy forms are the same language), and ^ / $ at the start /
 * end of a top-level alternative. Back-references, lookahead, lookbehind and word boundaries cannot be
 * expressed and are refused by name (fail closed).
 *
 * Search semantics, as JSON Schema has them: an alternative without ^ may have anything before it, one
 * without $ anything after. Two output modes: the raw string (the validator matches decoded strings), or the
 * JSON-encoded string body the generator emits between the quotes, where each character that JSON must
 * escape (" \ and controls) becomes its escape sequence (one canonical spelling: \" \\ \n ... or \u00XX).
 */
#include "engine/grammar/grammar_impl.h"

#include "core/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGEX_MAX_NEST 64
#define REGEX_MAX_RANGES 4096

struct rx {
    const char *s;
    size_t len, pos;
    bool json;
    char *err;
    int rc;
    int nest;
};

static int rx_fail(struct rx *r, int code, const char *msg)
{
    if (!r->rc)
        r->rc = err_set(r->err, code, "pattern: %s (at offset %zu)", msg, r->pos);
    return r->rc;
}

static int rx_peek(const struct rx *r, size_t k) { return r->pos + k < r->len ? (unsigned char)r->s[r->pos + k] : -1; }

/* One UTF-8 code point from the pattern. */
static int rx_utf8(struct rx *r, uint32_t *cp)
{
    int c = rx_peek(r, 0);
    if (c < 0x80) {
        *cp = (uint32_t)c;
        r->pos++;
        return 0;
    }
    int n = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (n < 0)
        return rx_fail(r, ERR_INVALID_ARG, "invalid UTF-8");
    uint32_t v = (uint32_t)c & (0x3f >> n);
    for (int i = 1; i <= n; i++) {
        int d = rx_peek(r, (size_t)i);
        if (d < 0 || (d & 0xc0) != 0x80)
            return rx_fail(r, ERR_INVALID_ARG, "invalid UTF-8");
        v = (v << 6) | (uint32_t)(d & 0x3f);
    }
    r->pos += (size_t)n + 1;
    *cp = v;
    return 0;
}

/* ---- code point sets ---- */

struct rset {
    uint32_t r[2 * REGEX_MAX_RANGES];
    size_t n;
};

static int rset_add(struct rx *x, struct rset *s, uint32_t lo, uint32_t hi)
{
    if (s->n >= REGEX_MAX_RANGES)
        return rx_fail(x, ERR_INVALID_ARG, "character class too large");
    s->r[2 * s->n] = lo;
    s->r[2 * s->n + 1] = hi;
    s->n++;
    return 0;
}

static int rset_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void rset_normalize(struct rset *s)
{
    qsort(s->r, s->n, 2 * sizeof s->r[0], rset_cmp);
    size_t o = 0;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[2 * i], hi = s->r[2 * i + 1];
        if (o && lo <= s->r[2 * o - 1] + 1) {
            if (hi > s->r[2 * o - 1])
                s->r[2 * o - 1] = hi;
        } else {
            s->r[2 * o] = lo, s->r[2 * o + 1] = hi, o++;
        }
    }
    s->n = o;
}

static void rset_negate(struct rset *s)
{
    rset_normalize(s);
    struct rset t;
    t.n = 0;
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[2 * i] > next)
            t.r[2 * t.n] = next, t.r[2 * t.n + 1] = s->r[2 * i] - 1, t.n++;
        next = s->r[2 * i + 1] + 1;
    }
    if (next <= 0x10ffff)
        t.r[2 * t.n] = next, t.r[2 * t.n + 1] = 0x10ffff, t.n++;
    memcpy(s->r, t.r, 2 * t.n * sizeof t.r[0]);
    s->n = t.n;
}

static const uint32_t rx_space[] = {0x09, 0x0d, 0x20, 0x20, 0xa0, 0xa0, 0x1680, 0x1680, 0x2000, 0x200a,
                                    0x2028, 0x2029, 0x202f, 0x202f, 0x205f, 0x205f, 0x3000, 0x3000, 0xfeff, 0xfeff};

/* Adds a class escape (d D w W s S) to s. */
static int rset_class_escape(struct rx *x, struct rset *s, int c)
{
    struct rset t;
    t.n = 0;
    switch (c | 0x20) {
    case 'd': rset_add(x, &t, '0', '9'); break;
    case 'w':
        rset_add(x, &t, '0', '9'), rset_add(x, &t, 'A', 'Z'), rset_add(x, &t, '_', '_'), rset_add(x, &t, 'a', 'z');
        break;
    case 's':
        for (size_t i = 0; i < sizeof rx_space / sizeof rx_space[0]; i += 2)
            rset_add(x, &t, rx_space[i], rx_space[i + 1]);
        break;
    }
    if (c >= 'A' && c <= 'Z')
        rset_negate(&t);
    for (size_t i = 0; i < t.n; i++)
        if (rset_add(x, s, t.r[2 * i], t.r[2 * i + 1]))
            return x->rc;
    return 0;
}

static int rx_hex(struct rx *x, int digits, uint32_t *v)
{
    uint32_t a = 0;
    for (int i = 0; i < digits; i++) {
        int c = rx_peek(x, 0);
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
        if (d < 0)
            return rx_fail(x, ERR_INVALID_ARG, "bad hex escape");
        a = a * 16 + (uint32_t)d;
        x->pos++;
    }
    *v = a;
    return 0;
}

/* After a backslash: a single code point in *cp (returns 0), or a class escape added to set (returns 1
 * with *cp untouched; set may be NULL outside classes, then the caller builds one). */
static int rx_escape(struct rx *x, uint32_t *cp, int *class_esc)
{
    int c = rx_peek(x, 0);
    *class_esc = 0;
    if (c < 0)
        return rx_fail(x, ERR_INVALID_ARG, "pattern ends with a backslash");
    x->pos++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        *class_esc = c;
        return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'f': *cp = '\f'; return 0;
    case '0':
        if (rx_peek(x, 0) >= '0' && rx_peek(x, 0) <= '9')
            return rx_fail(x, ERR_UNSUPPORTED, "octal escapes are not supported");
        *cp = 0;
        return 0;
    case 'x': return rx_hex(x, 2, cp);
    case 'u':
        if (rx_peek(x, 0) == '{') {
            x->pos++;
            uint32_t v = 0;
            int n = 0;
            while (rx_peek(x, 0) != '}') {
                uint32_t d = 0;
                if (n++ >= 6 || rx_hex(x, 1, &d))
                    return rx_fail(x, ERR_INVALID_ARG, "bad \\u{...} escape");
                v = v * 16 + d;
            }
            x->pos++;
            if (!n || v > 0x10ffff)
                return rx_fail(x, ERR_INVALID_ARG, "bad \\u{...} escape");
            *cp = v;
            return 0;
        }
        if (rx_hex(x, 4, cp))
            return x->rc;
        if (*cp >= 0xd800 && *cp <= 0xdbff && rx_peek(x, 0) == '\\' && rx_peek(x, 1) == 'u') {
            size_t save = x->pos;
            uint32_t lo = 0;
            x->pos += 2;
            if (!rx_hex(x, 4, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
                *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
                return 0;
            }
            x->rc = 0;
            x->pos = save;
        }
        if (*cp >= 0xd800 && *cp <= 0xdfff)
            return rx_fail(x, ERR_UNSUPPORTED, "lone surrogate escapes are not supported");
        return 0;
    case 'b':
    case 'B':
        return rx_fail(x, ERR_UNSUPPORTED, "word boundaries (\\b, \\B) are not supported");
    case 'k':
        return rx_fail(x, ERR_UNSUPPORTED, "back-references (\\k<name>) are not supported");
    case 'c':
        return rx_fail(x, ERR_UNSUPPORTED, "control escapes (\\cX) are not supported");
    case 'p':
    case 'P':
        return rx_fail(x, ERR_UNSUPPORTED, "Unicode property escapes (\\p{...}) are not supported");
    default:
        if (c >= '1' && c <= '9')
            return rx_fail(x, ERR_UNSUPPORTED, "back-references (\\1 ... \\9) are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(x, ERR_INVALID_ARG, "unknown escape");
        x->pos--;
        return rx_utf8(x, cp) ? x->rc : 0; /* escaped punctuation or any other character: itself */
    }
}

/* ---- emitting ---- */

/* The canonical JSON escape of a character that must be escaped ("  \  and < 0x20), as GBNF literal text. */
static void rx_emit_json_escape(struct gtext *o, uint32_t c)
{
    char e[8];
    switch (c) {
    case '"': gtext_gbnf_literal(o, "\\\"", 2); return;
    case '\\': gtext_gbnf_literal(o, "\\\\", 2); return;
    case '\n': gtext_gbnf_literal(o, "\\n", 2); return;
    case '\r': gtext_gbnf_literal(o, "\\r", 2); return;
    case '\t': gtext_gbnf_literal(o, "\\t", 2); return;
    case '\b': gtext_gbnf_literal(o, "\\b", 2); return;
    case '\f': gtext_gbnf_literal(o, "\\f", 2); return;
    default:
        snprintf(e, sizeof e, "\\u%04x", c);
        gtext_gbnf_literal(o, e, 6);
    }
}

static bool rx_json_special(uint32_t c) { return c == '"' || c == '\\' || c < 0x20; }

static void rx_emit_char(struct rx *x, struct gtext *o, uint32_t c)
{
    if (x->json && rx_json_special(c)) {
        rx_emit_json_escape(o, c);
        return;
    }
    gtext_puts(o, "[");
    gtext_gbnf_class_char(o, c);
    gtext_puts(o, "]");
}

/* A set as GBNF: in JSON mode the characters JSON escapes become alternatives with their escapes. */
static void rx_emit_set(struct rx *x, struct gtext *o, struct rset *s)
{
    rset_normalize(s);
    gtext_puts(o, "(");
    bool any = false;
    /* raw part */
    struct gtext cls = {0};
    size_t n_raw = 0;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[2 * i], hi = s->r[2 * i + 1];
        /* in JSON mode cut out 0x00-0x1F, '"' and '\\' */
        uint32_t pieces[6][2];
        int np = 0;
        if (!x->json) {
            pieces[np][0] = lo, pieces[np][1] = hi, np++;
        } else {
            static const uint32_t keep[3][2] = {{0x20, 0x21}, {0x23, 0x5b}, {0x5d, 0x10ffff}};
            for (int k = 0; k < 3; k++) {
                uint32_t a = lo > keep[k][0] ? lo : keep[k][0], b = hi < keep[k][1] ? hi : keep[k][1];
                if (a <= b)
                    pieces[np][0] = a, pieces[np][1] = b, np++;
            }
        }
        for (int k = 0; k < np; k++) {
            gtext_gbnf_class_char(&cls, pieces[k][0]);
            if (pieces[k][1] != pieces[k][0]) {
                gtext_puts(&cls, "-");
                gtext_gbnf_class_char(&cls, pieces[k][1]);
            }
            n_raw++;
        }
    }
    if (n_raw) {
        gtext_puts(o, "[");
        gtext_put(o, cls.p, cls.n);
        gtext_puts(o, "]");
        any = true;
    }
    if (cls.oom)
        o->oom = true;
    gtext_free(&cls);
    if (x->json) {
        for (size_t i = 0; i < s->n; i++) {
            for (uint32_t c = s->r[2 * i]; c <= s->r[2 * i + 1] && c <= 0x5c; c++) {
                if (!rx_json_special(c))
                    continue;
                if (any)
                    gtext_puts(o, " | ");
                rx_emit_json_escape(o, c);
                any = true;
            }
        }
    }
    if (!any)
        gtext_puts(o, "[]"); /* matches nothing */
    gtext_puts(o, ")");
}

/* ---- parsing ---- */

static int rx_alternation(struct rx *x, struct gtext *o, bool top);

static int rx_class(struct rx *x, struct gtext *o)
{
    x->pos++; /* [ */
    struct rset *s = malloc(sizeof *s);
    if (!s)
        return rx_fail(x, ERR_NOMEM, "out of memory");
    s->n = 0;
    bool negate = false;
    if (rx_peek(x, 0) == '^') {
        negate = true;
        x->pos++;
    }
    for (;;) {
        int c = rx_peek(x, 0);
        if (c < 0) {
            rx_fail(x, ERR_INVALID_ARG, "unterminated character class");
            goto done;
        }
        if (c == ']') {
            x->pos++;
            break;
        }
        uint32_t lo;
        int ce = 0;
        if (c == '\\') {
            x->pos++;
            if (rx_peek(x, 0) == 'b') { /* inside a class \b is backspace */
                x->pos++;
                lo = '\b';
            } else if (rx_peek(x, 0) == '-') {
                x->pos++;
                lo = '-';
            } else if (rx_escape(x, &lo, &ce)) {
                goto done;
            }
        } else if (rx_utf8(x, &lo)) {
            goto done;
        }
        if (ce) {
            if (rset_class_escape(x, s, ce))
                goto done;
            if (rx_peek(x, 0) == '-' && rx_peek(x, 1) != ']' && rx_peek(x, 1) >= 0) {
                rx_fail(x, ERR_UNSUPPORTED, "a range with a class escape (like [\\d-z]) is not supported");
                goto done;
            }
            continue;
        }
        uint32_t hi = lo;
        if (rx_peek(x, 0) == '-' && rx_peek(x, 1) != ']' && rx_peek(x, 1) >= 0) {
            x->pos++;
            if (rx_peek(x, 0) == '\\') {
                x->pos++;
                if (rx_escape(x, &hi, &ce))
                    goto done;
                if (ce) {
                    rx_fail(x, ERR_UNSUPPORTED, "a range with a class escape (like [a-\\d]) is not supported");
                    goto done;
                }
            } else if (rx_utf8(x, &hi)) {
                goto done;
            }
            if (hi < lo) {
                rx_fail(x, ERR_INVALID_ARG, "character range out of order");
                goto done;
            }
        }
        if (rset_add(x, s, lo, hi))
            goto done;
    }
    if (negate)
        rset_negate(s);
    /* no surrogates */
    {
        struct rset t;
        t.n = 0;
        for (size_t i = 0; i < s->n; i++) {
            uint32_t lo = s->r[2 * i], hi = s->r[2 * i + 1];
            if (lo <= 0xdfff && hi >= 0xd800) {
                if (lo < 0xd800)
                    rset_add(x, &t, lo, 0xd7ff);
                if (hi > 0xdfff)
                    rset_add(x, &t, 0xe000, hi);
            } else {
                rset_add(x, &t, lo, hi);
            }
        }
        if (x->rc)
            goto done;
        memcpy(s->r, t.r, 2 * t.n * sizeof t.r[0]);
        s->n = t.n;
    }
    rx_emit_set(x, o, s);
done:
    free(s);
    return x->rc;
}

static int rx_uint(struct rx *x, uint32_t *v)
{
    uint64_t a = 0;
    int c;
    if (!((c = rx_peek(x, 0)) >= '0' && c <= '9'))
        return rx_fail(x, ERR_INVALID_ARG, "expected a number in {n,m}");
    while ((c = rx_peek(x, 0)) >= '0' && c <= '9') {
        a = a * 10 + (uint64_t)(c - '0');
        if (a > GRAMMAR_MAX_REPEAT)
            return rx_fail(x, ERR_INVALID_ARG, "repetition count over 10000");
        x->pos++;
    }
    *v = (uint32_t)a;
    return 0;
}

/* Whether a '{' at pos starts a quantifier (ECMA treats a brace that is not one as a literal). */
static bool rx_is_quant_brace(const struct rx *x)
{
    size_t i = x->pos + 1;
    bool digit = false;
    while (i < x->len && x->s[i] >= '0' && x->s[i] <= '9')
        i++, digit = true;
    if (!digit)
        return false;
    if (i < x->len && x->s[i] == ',') {
        i++;
        while (i < x->len && x->s[i] >= '0' && x->s[i] <= '9')
            i++;
    }
    return i < x->len && x->s[i] == '}';
}

/* One alternative. top: directly in the pattern (anchors allowed at its ends; *anchored_end says whether
 * it ended with $). */
static int rx_sequence(struct rx *x, struct gtext *o, bool top, bool *anchored_end)
{
    bool any = false;
    *anchored_end = false;
    gtext_puts(o, "(");
    for (;;) {
        int c = rx_peek(x, 0);
        if (c < 0 || c == '|' || c == ')')
            break;
        struct gtext atom = {0};
        if (c == '^') {
            if (!(top && !any))
                return gtext_free(&atom), rx_fail(x, ERR_UNSUPPORTED, "'^' is only supported at the start of the pattern or of a top-level alternative");
            x->pos++;
            continue;
        } else if (c == '$') {
            x->pos++;
            int n = rx_peek(x, 0);
            if (!top || !(n < 0 || n == '|'))
                return gtext_free(&atom), rx_fail(x, ERR_UNSUPPORTED, "'$' is only supported at the end of the pattern or of a top-level alternative");
            *anchored_end = true;
            continue;
        } else if (c == '(') {
            x->pos++;
            if (rx_peek(x, 0) == '?') {
                int k = rx_peek(x, 1);
                if (k == ':') {
                    x->pos += 2;
                } else if (k == '=' || k == '!') {
                    return rx_fail(x, ERR_UNSUPPORTED, "lookahead ((?= ...), (?! ...)) is not supported");
                } else if (k == '<' && (rx_peek(x, 2) == '=' || rx_peek(x, 2) == '!')) {
                    return rx_fail(x, ERR_UNSUPPORTED, "lookbehind ((?<= ...), (?<! ...)) is not supported");
                } else if (k == '<') {
                    x->pos += 2;
                    while (rx_peek(x, 0) >= 0 && rx_peek(x, 0) != '>')
                        x->pos++;
                    if (rx_peek(x, 0) != '>')
                        return rx_fail(x, ERR_INVALID_ARG, "unterminated group name");
                    x->pos++;
                } else {
                    return rx_fail(x, ERR_UNSUPPORTED, "group modifiers (?...) other than (?: and (?<name> are not supported");
                }
            }
            if (++x->nest > REGEX_MAX_NEST)
                return rx_fail(x, ERR_INVALID_ARG, "groups nested too deeply");
            if (rx_alternation(x, &atom, false)) {
                gtext_free(&atom);
                return x->rc;
            }
            x->nest--;
            if (rx_peek(x, 0) != ')') {
                gtext_free(&atom);
                return rx_fail(x, ERR_INVALID_ARG, "missing ')'");
            }
            x->pos++;
        } else if (c == '[') {
            if (rx_class(x, &atom)) {
                gtext_free(&atom);
                return x->rc;
            }
        } else if (c == '.') {
            x->pos++;
            struct rset *s = malloc(sizeof *s);
            if (!s)
                return rx_fail(x, ERR_NOMEM, "out of memory");
            s->n = 0;
            rset_add(x, s, '\n', '\n'), rset_add(x, s, '\r', '\r'), rset_add(x, s, 0x2028, 0x2029);
            rset_add(x, s, 0xd800, 0xdfff);
            rset_negate(s);
            rx_emit_set(x, &atom, s);
            free(s);
        } else if (c == '*' || c == '+' || c == '?' || (c == '{' && rx_is_quant_brace(x))) {
            return rx_fail(x, ERR_INVALID_ARG, "quantifier without anything to repeat");
        } else if (c == ']' || c == '}' || c == '{') {
            x->pos++; /* ECMA annex B: a lone ] { } is a literal */
            rx_emit_char(x, &atom, (uint32_t)c);
        } else if (c == '\\') {
            x->pos++;
            uint32_t cp;
            int ce;
            if (rx_escape(x, &cp, &ce)) {
                gtext_free(&atom);
                return x->rc;
            }
            if (ce) {
                struct rset *s = malloc(sizeof *s);
                if (!s)
                    return rx_fail(x, ERR_NOMEM, "out of memory");
                s->n = 0;
                rset_class_escape(x, s, ce);
                rx_emit_set(x, &atom, s);
                free(s);
            } else {
                rx_emit_char(x, &atom, cp);
            }
        } else {
            uint32_t cp;
            if (rx_utf8(x, &cp)) {
                gtext_free(&atom);
                return x->rc;
            }
            if (cp >= 0xd800 && cp <= 0xdfff)
                return rx_fail(x, ERR_INVALID_ARG, "invalid UTF-8");
            rx_emit_char(x, &atom, cp);
        }
        /* quantifier */
        int q = rx_peek(x, 0);
        char qb[48] = "";
        if (q == '*' || q == '+' || q == '?') {
            x->pos++;
            qb[0] = (char)q, qb[1] = 0;
        } else if (q == '{' && rx_is_quant_brace(x)) {
            x->pos++;
            uint32_t lo, hi;
            if (rx_uint(x, &lo)) {
                gtext_free(&atom);
                return x->rc;
            }
            hi = lo;
            if (rx_peek(x, 0) == ',') {
                x->pos++;
                if (rx_peek(x, 0) == '}')
                    hi = GAST_INF;
                else if (rx_uint(x, &hi)) {
                    gtext_free(&atom);
                    return x->rc;
                }
            }
            x->pos++; /* } */
            if (hi < lo) {
                gtext_free(&atom);
                return rx_fail(x, ERR_INVALID_ARG, "numbers out of order in {n,m}");
            }
            if (hi == GAST_INF)
                snprintf(qb, sizeof qb, "{%u,}", lo);
            else
                snprintf(qb, sizeof qb, "{%u,%u}", lo, hi);
        }
        if (qb[0] && rx_peek(x, 0) == '?')
            x->pos++; /* lazy: same language */
        if (qb[0] && (rx_peek(x, 0) == '*' || rx_peek(x, 0) == '+' || rx_peek(x, 0) == '?' ||
                      (rx_peek(x, 0) == '{' && rx_is_quant_brace(x)))) {
            gtext_free(&atom);
            return rx_fail(x, ERR_INVALID_ARG, "nothing to repeat (two quantifiers in a row)");
        }
        gtext_puts(o, any ? " " : "");
        gtext_put(o, atom.p ? atom.p : "", atom.n);
        if (atom.oom)
            o->oom = true;
        gtext_puts(o, qb);
        gtext_free(&atom);
        any = true;
    }
    if (!any)
        gtext_puts(o, "\"\"");
    gtext_puts(o, ")");
    return 0;
}

static void rx_emit_any_star(struct rx *x, struct gtext *o)
{
    struct rset s;
    s.n = 0;
    rset_add(x, &s, 0, 0xd7ff), rset_add(x, &s, 0xe000, 0x10ffff);
    rx_emit_set(x, o, &s);
    gtext_puts(o, "*");
}

static int rx_alternation(struct rx *x, struct gtext *o, bool top)
{
    gtext_puts(o, "(");
    for (bool first = true;; first = false) {
        if (!first)
            gtext_puts(o, " | ");
        bool anchored_start = top && rx_peek(x, 0) == '^';
        gtext_puts(o, "(");
        if (top && !anchored_start) {
            rx_emit_any_star(x, o);
            gtext_puts(o, " ");
        }
        bool anchored_end;
        if (rx_sequence(x, o, top, &anchored_end))
            return x->rc;
        if (top && !anchored_end) {
            gtext_puts(o, " ");
            rx_emit_any_star(x, o);
        }
        gtext_puts(o, ")");
        if (rx_peek(x, 0) != '|')
            break;
        x->pos++;
    }
    gtext_puts(o, ")");
    return 0;
}

int regex_to_gbnf(const char *pattern, size_t len, bool json_encoded, struct gtext *out, char *err)
{
    struct rx x = {.s = pattern, .len = len, .json = json_encoded, .err = err};
    if (rx_alternation(&x, out, true))
        return x.rc;
    if (x.pos < x.len)
        return rx_fail(&x, ERR_INVALID_ARG, "unmatched ')'");
    if (out->oom)
        return err_set(err, ERR_NOMEM, "out of memory compiling a pattern");
    return 0;
}
