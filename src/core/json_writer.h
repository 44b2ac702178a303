/*
 * json_writer: a small streaming JSON writer. Values go straight to a FILE or into a growing heap buffer, so
 * a large document (a benchmark report, a response body) is never built as a tree first. The writer tracks
 * nesting and places commas itself; strings are escaped per RFC 8259 and any invalid UTF-8 byte becomes
 * U+FFFD, so the output always parses. Non-finite doubles are written as null (JSON has no NaN).
 *
 * Errors are sticky: after an allocation or write failure every call is a no-op and json_writer_finish()
 * returns the code. Misuse (a value where a key is due, unbalanced ends, nesting deeper than
 * JSON_WRITER_MAX_DEPTH) is a programmer error and aborts through ASSERT.
 *
 *   struct json_writer w;
 *   json_writer_init_buffer(&w, 2);
 *   json_writer_object_begin(&w);
 *   json_writer_key_int(&w, "completed", 10);
 *   json_writer_object_end(&w);
 *   char *text = json_writer_take(&w, NULL);   // caller frees
 */
#ifndef WAFER_CORE_JSON_WRITER_H
#define WAFER_CORE_JSON_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define JSON_WRITER_MAX_DEPTH 64

struct json_writer {
    FILE *file;        /* sink in file mode, NULL in buffer mode */
    char *buf;         /* buffer mode: the text so far (NUL-terminated), owned until _take or _deinit */
    size_t len, cap;
    int indent;        /* spaces per level; 0 writes compact one-line JSON */
    int depth;
    unsigned char kind[JSON_WRITER_MAX_DEPTH]; /* 'o' object or 'a' array, per open level */
    bool has_items[JSON_WRITER_MAX_DEPTH];     /* a comma is due before the next item at this level */
    bool key_pending;  /* a key was written, its value is due */
    bool done;         /* a complete top-level value was written */
    int err;           /* first error (ERR_NOMEM, ERR_IO), 0 while fine */
};

/* Writes to f (not closed by the writer). indent 0 = compact. */
void json_writer_init_file(struct json_writer *w, FILE *f, int indent);

/* Writes into a heap buffer; get it with json_writer_take(). */
void json_writer_init_buffer(struct json_writer *w, int indent);

/* Frees the buffer if it was not taken. Safe to call twice. */
void json_writer_deinit(struct json_writer *w);

/* Buffer mode: hands over the NUL-terminated text (caller frees) and its length, or NULL after an error.
 * The writer is left empty. */
char *json_writer_take(struct json_writer *w, size_t *len);

/* 0 when no error happened and the top-level value is complete; else the sticky error code, or
 * ERR_FORMAT when containers are still open. Flushes a file sink. */
int json_writer_finish(struct json_writer *w);

void json_writer_object_begin(struct json_writer *w);
void json_writer_object_end(struct json_writer *w);
void json_writer_array_begin(struct json_writer *w);
void json_writer_array_end(struct json_writer *w);

/* Inside an object: the next member's name. */
void json_writer_key(struct json_writer *w, const char *key);

void json_writer_string(struct json_writer *w, const char *s); /* NULL writes null */
void json_writer_string_n(struct json_writer *w, const char *s, size_t n);
void json_writer_int(struct json_writer *w, long long v);
void json_writer_double(struct json_writer *w, double v); /* shortest text that reads back exactly */
void json_writer_bool(struct json_writer *w, bool v);
void json_writer_null(struct json_writer *w);

/* key + value in one call. */
void json_writer_key_string(struct json_writer *w, const char *key, const char *s);
void json_writer_key_int(struct json_writer *w, const char *key, long long v);
void json_writer_key_double(struct json_writer *w, const char *key, double v);
void json_writer_key_bool(struct json_writer *w, const char *key, bool v);
void json_writer_key_null(struct json_writer *w, const char *key);

/* Appends s as a JSON string literal (with quotes) to the writer's sink without structure checks; used
 * by the functions above and handy for writing escaped text elsewhere. */
void json_writer_raw_string(struct json_writer *w, const char *s, size_t n);

#endif
