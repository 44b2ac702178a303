/*
 * gtext: a growing NUL-terminated text buffer for the GBNF the schema and regex compilers emit, with the
 * GBNF quoting rules in one place. Errors are sticky: after a failed allocation every call is a no-op and
 * oom stays set, so emitters check once at the end.
 */
#include "engine/grammar/grammar_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool gtext_reserve(struct gtext *t, size_t extra)
{
    if (t->oom)
        return false;
    if (t->n + extra + 1 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->n + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            t->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(t->p, cap);
    if (!p) {
        t->oom = true;
        return false;
    }
    t->p = p;
    t->cap = cap;
    return true;
}

void gtext_put(struct gtext *t, const char *s, size_t n)
{
    if (!gtext_reserve(t, n))
        return;
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

void gtext_puts(struct gtext *t, const char *s) { gtext_put(t, s, strlen(s)); }

void gtext_printf(struct gtext *t, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (k < 0) {
        t->oom = true;
        return;
    }
    if ((size_t)k < sizeof small) {
        gtext_put(t, small, (size_t)k);
        return;
    }
    if (!gtext_reserve(t, (size_t)k))
        return;
    va_start(ap, fmt);
    vsnprintf(t->p + t->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    t->n += (size_t)k;
}

void gtext_free(struct gtext *t)
{
    free(t->p);
    memset(t, 0, sizeof *t);
}

void gtext_gbnf_literal(struct gtext *t, const char *s, size_t n)
{
    gtext_put(t, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            gtext_put(t, e, 2);
        } else if (c == '\n') {
            gtext_put(t, "\\n", 2);
        } else if (c == '\r') {
            gtext_put(t, "\\r", 2);
        } else if (c == '\t') {
            gtext_put(t, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            gtext_printf(t, "\\x%02X", c);
        } else {
            gtext_put(t, (const char *)&s[i], 1); /* UTF-8 passes through: literals are bytes */
        }
    }
    gtext_put(t, "\"", 1);
}

void gtext_gbnf_class_char(struct gtext *t, uint32_t c)
{
    if (c == ']' || c == '[' || c == '\\' || c == '-' || c == '^' || c == '"') {
        char e[2] = {'\\', (char)c};
        gtext_put(t, e, 2);
    } else if (c < 0x20 || c == 0x7f) {
        gtext_printf(t, "\\x%02X", c);
    } else if (c < 0x80) {
        char ch = (char)c;
        gtext_put(t, &ch, 1);
    } else if (c <= 0xffff) {
        gtext_printf(t, "\\u%04X", c);
    } else {
        gtext_printf(t, "\\U%08X", c);
    }
}
