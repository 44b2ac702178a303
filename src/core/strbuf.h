/*
 * strbuf: a growing text buffer written with printf formats, for answers built piece by piece (Prometheus
 * text, reports). Errors are sticky: after an allocation failure oom is set and later writes do nothing, so a
 * caller checks once at the end.
 */
#ifndef WAFER_CORE_STRBUF_H
#define WAFER_CORE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf {
    char *p; /* [cap], NUL-terminated at len when not oom; owned: the caller frees p */
    size_t len, cap;
    bool oom;
};

/* An empty buffer of cap bytes to start with (oom set when even that fails). */
void strbuf_init(struct strbuf *b, size_t cap);
/* Appends the formatted text, growing the buffer as needed. */
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
