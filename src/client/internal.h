/*
 * client/internal.h: what the files of libwafer-client share and users do not see (the objects are built
 * with -fvisibility=hidden for the shared library, and none of these is WAFER_API). client.c runs requests;
 * jobs.c builds the Batch API on client_request.
 */
#ifndef WAFER_CLIENT_INTERNAL_H
#define WAFER_CLIENT_INTERNAL_H

#include "wafer/client.h"

#include <stddef.h>

/* A file to send as multipart/form-data: the fields "purpose" and "file" (len bytes of data, named
 * filename, type application/jsonl). The bytes are read from data for each attempt (not copied). */
struct client_upload {
    const char *purpose;
    const char *filename;
    const char *data;
    size_t len;
};

/* One request of any kind, to the end (retried as every call of the library): method "GET" or "POST";
 * json_body (NULL: none; a POST without one sends an empty body), or upload (a multipart POST) instead.
 * max_body: the largest response body taken (0: the library's default, 64 MiB). The response body, whatever
 * its status, is in out->text (out->text_len bytes, NUL-terminated); WAFER_OK only for a 2xx answer. A
 * connection error or timeout says the URL in out->error ("cannot reach URL: ..."). */
int client_request(struct wafer_client *c, const char *method, const char *path, const char *json_body,
                   const struct client_upload *upload, size_t max_body, struct wafer_result *out);

/* Sets out's status and error message (printf-style); returns the status. */
int client_fail(struct wafer_result *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Clears a result before a call (no text, token counts -1). */
void client_result_init(struct wafer_result *r);

/* ---- jobs.c: the Batch API's parsing, without a server (unit-tested) ---- */

/* Whether id may go into a URL path as it is: 1..WAFER_ID_MAX-1 bytes of letters, digits, "-", "_", ".",
 * "~", and not "." or "..". */
bool client_job_id_ok(const char *id);

/* A batch object (JSON text, len bytes) into job. 0, or -1 with why in err (cap bytes): not JSON, not an
 * object, no "id" or "status" string, an id or status too long. Missing counts and times are 0. */
int client_job_parse(const char *json, size_t len, struct wafer_job *job, char *err, size_t cap);

/* A list object ({"data": [batch, ...], "has_more"}) into *jobs (a new array, NULL when empty: free()),
 * *n and *has_more. 0, or -1 with why in err. */
int client_job_parse_list(const char *json, size_t len, struct wafer_job **jobs, int *n, bool *has_more, char *err,
                          size_t cap);

/* The "url" of the first request line of a JSONL text (blank lines skipped): a new string (free()), or
 * NULL when the first non-blank line is not JSON or has no string "url". */
char *client_jsonl_first_url(const char *data, size_t len);

#endif
