/*
 * json_writer: see json_writer.h. One sink function (file or buffer) under a small state machine: before each
 * item we emit the separator its level needs (comma, newline and indent), and a key leaves the writer
 * waiting for exactly one value. UTF-8 is validated while escaping, so text that came from a network peer
 * can be written as is.
 */
#include "core/json_writer.h"

#include "core/err.h"
#include "core/log.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void jw_put(struct json_writer *w, const char *s, size_t n)
{
    if (w->err || n == 0)
        return;
    if (w->file) {
        if (fwrite(s, 1, n, w->file) != n)
            w->err = ERR_IO;
        return;
    }
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n + 1)
            cap *= 2;
        char *nb = realloc(w->buf, cap);
        if (!nb) {
            w->err = ERR_NOMEM;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void jw_puts(struct json_writer *w, const char *s) { jw_put(w, s, strlen(s)); }

static void jw_newline(struct json_writer *w, int depth)
{
    if (!w->indent)
        return;
    jw_put(w, "\n", 1);
    for (int i = 0; i < depth * w->indent; i++)
        jw_put(w, " ", 1);
}

void json_writer_init_file(struct json_writer *w, FILE *f, int indent)
{
    memset(w, 0, sizeof *w);
    w->file = f;
    w->indent = indent < 0 ? 0 : indent;
}

void json_writer_init_buffer(struct json_writer *w, int indent)
{
    memset(w, 0, sizeof *w);
    w->indent = indent < 0 ? 0 : indent;
}

void json_writer_deinit(struct json_writer *w)
{
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
}

char *json_writer_take(struct json_writer *w, size_t *len)
{
    char *out = NULL;
    if (!w->err && !w->file) {
        if (!w->buf)
            w->buf = calloc(1, 1);
        out = w->buf;
        if (len)
            *len = out ? w->len : 0;
        w->buf = NULL;
    } else {
        json_writer_deinit(w);
    }
    w->len = w->cap = 0;
    return out;
}

int json_writer_finish(struct json_writer *w)
{
    if (w->file && !w->err && fflush(w->file) != 0)
        w->err = ERR_IO;
    if (w->err)
        return w->err;
    return (w->depth == 0 && w->done) ? 0 : ERR_FORMAT;
}

/* Called before every value: checks the grammar and writes the separator. */
static void jw_before_value(struct json_writer *w)
{
    if (w->depth == 0) {
        ASSERT(!w->done); /* one top-level value per writer */
        return;
    }
    if (w->kind[w->depth - 1] == 'o') {
        ASSERT(w->key_pending); /* object members need a key first */
        w->key_pending = false;
        return;
    }
    if (w->has_items[w->depth - 1])
        jw_put(w, ",", 1);
    w->has_items[w->depth - 1] = true;
    jw_newline(w, w->depth);
}

static void jw_after_value(struct json_writer *w)
{
    if (w->depth == 0)
        w->done = true;
}

static void jw_open(struct json_writer *w, unsigned char kind)
{
    jw_before_value(w);
    ASSERT(w->depth < JSON_WRITER_MAX_DEPTH);
    jw_put(w, kind == 'o' ? "{" : "[", 1);
    w->kind[w->depth] = kind;
    w->has_items[w->depth] = false;
    w->depth++;
}

static void jw_close(struct json_writer *w, unsigned char kind)
{
    ASSERT(w->depth > 0 && w->kind[w->depth - 1] == kind && !w->key_pending);
    bool had = w->has_items[w->depth - 1];
    w->depth--;
    if (had)
        jw_newline(w, w->depth);
    jw_put(w, kind == 'o' ? "}" : "]", 1);
    jw_after_value(w);
}

void json_writer_object_begin(struct json_writer *w) { jw_open(w, 'o'); }
void json_writer_object_end(struct json_writer *w) { jw_close(w, 'o'); }
void json_writer_array_begin(struct json_writer *w) { jw_open(w, 'a'); }
void json_writer_array_end(struct json_writer *w) { jw_close(w, 'a'); }

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 when the bytes there are not one. */
static size_t jw_utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* overlong forms, UTF-16 surrogates and code points past U+10FFFF are not valid UTF-8 */
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void json_writer_raw_string(struct json_writer *w, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t run = 0; /* bytes at p[i - run .. i) that need no escaping */
    jw_put(w, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        const char *esc = NULL;
        char tmp[8];
        size_t adv = 1;
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80) {
            adv = jw_utf8_len(p + i, n - i);
            if (adv == 0) {
                esc = "\\ufffd";
                adv = 1;
            }
        }
        if (esc) {
            jw_put(w, (const char *)p + i - run, run);
            run = 0;
            jw_puts(w, esc);
        } else {
            run += adv;
        }
        i += adv;
    }
    jw_put(w, (const char *)p + i - run, run);
    jw_put(w, "\"", 1);
}

void json_writer_key(struct json_writer *w, const char *key)
{
    ASSERT(w->depth > 0 && w->kind[w->depth - 1] == 'o' && !w->key_pending);
    if (w->has_items[w->depth - 1])
        jw_put(w, ",", 1);
    w->has_items[w->depth - 1] = true;
    jw_newline(w, w->depth);
    json_writer_raw_string(w, key, strlen(key));
    jw_put(w, w->indent ? ": " : ":", w->indent ? 2 : 1);
    w->key_pending = true;
}

void json_writer_string_n(struct json_writer *w, const char *s, size_t n)
{
    jw_before_value(w);
    json_writer_raw_string(w, s, n);
    jw_after_value(w);
}

void json_writer_string(struct json_writer *w, const char *s)
{
    if (!s)
        json_writer_null(w);
    else
        json_writer_string_n(w, s, strlen(s));
}

void json_writer_int(struct json_writer *w, long long v)
{
    char tmp[32];
    jw_before_value(w);
    snprintf(tmp, sizeof tmp, "%lld", v);
    jw_puts(w, tmp);
    jw_after_value(w);
}

void json_writer_double(struct json_writer *w, double v)
{
    if (!isfinite(v)) {
        json_writer_null(w);
        return;
    }
    char tmp[40];
    /* the shortest of %.15g / %.16g / %.17g that reads back to the same double */
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    jw_before_value(w);
    jw_puts(w, tmp);
    jw_after_value(w);
}

void json_writer_bool(struct json_writer *w, bool v)
{
    jw_before_value(w);
    jw_puts(w, v ? "true" : "false");
    jw_after_value(w);
}

void json_writer_null(struct json_writer *w)
{
    jw_before_value(w);
    jw_puts(w, "null");
    jw_after_value(w);
}

void json_writer_key_string(struct json_writer *w, const char *key, const char *s)
{
    json_writer_key(w, key);
    json_writer_string(w, s);
}

void json_writer_key_int(struct json_writer *w, const char *key, long long v)
{
    json_writer_key(w, key);
    json_writer_int(w, v);
}

void json_writer_key_double(struct json_writer *w, const char *key, double v)
{
    json_writer_key(w, key);
    json_writer_double(w, v);
}

void json_writer_key_bool(struct json_writer *w, const char *key, bool v)
{
    json_writer_key(w, key);
    json_writer_bool(w, v);
}

void json_writer_key_null(struct json_writer *w, const char *key)
{
    json_writer_key(w, key);
    json_writer_null(w);
}
