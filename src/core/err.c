/*
 * err: one table from project error codes to names, HTTP statuses and OpenAI error types, so that the CLI,
 * the server and the job workers all report the same failure the same way.
 */
#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>

struct err_row {
    const char *name;
    int http_status;
    const char *openai_type;
};

static const struct err_row err_table[ERR_COUNT_] = {
    [0] = {"ok", 200, ""},
    [1] = {"out_of_memory", 503, "server_error"},
    [2] = {"io", 500, "server_error"},
    [3] = {"format", 400, "invalid_request_error"},
    [4] = {"unsupported", 400, "invalid_request_error"},
    [5] = {"invalid_argument", 400, "invalid_request_error"},
    [6] = {"context_length_exceeded", 400, "invalid_request_error"},
    [7] = {"not_found", 404, "invalid_request_error"},
    [8] = {"invalid_api_key", 401, "authentication_error"},
    [9] = {"queue_full", 429, "rate_limit_error"},
    [10] = {"timeout", 408, "timeout_error"},
    [11] = {"cancelled", 499, "cancelled"},
    [12] = {"too_large", 413, "invalid_request_error"},
    [13] = {"method_not_allowed", 405, "invalid_request_error"},
    [14] = {"unsupported_media_type", 415, "invalid_request_error"},
    [15] = {"unavailable", 503, "server_error"},
    [16] = {"no_space", 503, "server_error"},
    [17] = {"internal", 500, "server_error"},
};

static const struct err_row *err_row_get(int code)
{
    if (code > 0 || code <= -ERR_COUNT_)
        return &err_table[-ERR_INTERNAL];
    return &err_table[-code];
}

const char *err_name(int code) { return err_row_get(code)->name; }
int err_http_status(int code) { return err_row_get(code)->http_status; }
const char *err_openai_type(int code) { return err_row_get(code)->openai_type; }

int err_set(char *buf, int code, const char *fmt, ...)
{
    if (buf) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, ERR_MSG_MAX, fmt, ap);
        va_end(ap);
    }
    return code;
}
