/*
 * strbuf: growing printf buffer (see strbuf.h).
 */
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void strbuf_init(struct strbuf *b, size_t cap)
{
    b->p = malloc(cap ? cap : 1);
    b->len = 0;
    b->cap = b->p ? (cap ? cap : 1) : 0;
    b->oom = b->p == NULL;
    if (b->p)
        b->p[0] = 0;
}

void strbuf_printf(struct strbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap * 2 + (size_t)n + 1;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}
