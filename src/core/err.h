/*
 * err: the project's error codes and the one table that maps them to an HTTP status and an OpenAI error
 * type. Functions return 0 on success or one of these negative codes; constructors return NULL and fill a
 * caller-provided message buffer of ERR_MSG_MAX bytes with a sentence that names the bad field.
 */
#ifndef WAFER_CORE_ERR_H
#define WAFER_CORE_ERR_H

#include <stddef.h>

#define ERR_MSG_MAX 512

enum {
    ERR_OK = 0,
    ERR_NOMEM = -1,         /* allocation failed */
    ERR_IO = -2,            /* open/read/write/mmap failed */
    ERR_FORMAT = -3,        /* malformed file or payload */
    ERR_UNSUPPORTED = -4,   /* valid but not supported (architecture, weight type, ...) */
    ERR_INVALID_ARG = -5,   /* bad parameter from a user */
    ERR_CONTEXT_LENGTH = -6,/* prompt + generation longer than the context */
    ERR_NOT_FOUND = -7,     /* model, route or object does not exist */
    ERR_AUTH = -8,          /* missing or wrong API key */
    ERR_QUEUE_FULL = -9,    /* bounded queue full, retry later */
    ERR_TIMEOUT = -10,      /* deadline passed */
    ERR_CANCELLED = -11,    /* client went away or request was cancelled */
    ERR_TOO_LARGE = -12,    /* body or header over its limit */
    ERR_METHOD = -13,       /* HTTP method not allowed */
    ERR_MEDIA_TYPE = -14,   /* unsupported content type */
    ERR_UNAVAILABLE = -15,  /* loading or draining */
    ERR_NO_SPACE = -16,     /* KV cache or another pool is exhausted */
    ERR_INTERNAL = -17,     /* a bug: should never reach a user */
    ERR_COUNT_ = 18
};

/* Short stable name of a code, e.g. "format". Never NULL. */
const char *err_name(int code);

/* HTTP status for a code (400, 401, 404, ...); 500 for unknown codes. */
int err_http_status(int code);

/* OpenAI error "type" string for a code, e.g. "invalid_request_error". Never NULL. */
const char *err_openai_type(int code);

/* snprintf into buf (ERR_MSG_MAX bytes) when buf is not NULL; returns code so callers can
 * `return err_set(err, ERR_FORMAT, "...")`. */
int err_set(char *buf, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
