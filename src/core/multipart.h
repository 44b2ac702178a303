/*
 * multipart: a small, strict parser of multipart/form-data bodies (RFC 7578), enough for file uploads such
 * as POST /v1/files. It never copies: every part points into the body. Strict means: the body starts with the
 * first delimiter (no preamble), every line ends with CRLF, each part has a Content-Disposition "form-data"
 * header with a name, the body ends with the close delimiter (an epilogue of CRLFs only is tolerated), and
 * header blocks are bounded; anything else is ERR_FORMAT with a sentence saying what is wrong.
 */
#ifndef WAFER_CORE_MULTIPART_H
#define WAFER_CORE_MULTIPART_H

#include <stdbool.h>
#include <stddef.h>

#define MULTIPART_BOUNDARY_MAX 70 /* RFC 2046: 1..70 characters */

struct multipart_part {
    const char *name; /* the form field's name (Content-Disposition name=), not NUL-terminated */
    size_t name_len;
    const char *filename; /* filename= when present, else NULL; not NUL-terminated */
    size_t filename_len;
    const char *content_type; /* the part's Content-Type value or NULL */
    size_t content_type_len;
    const char *data; /* the part's bytes */
    size_t len;
};

/* Extracts the boundary of a Content-Type value "multipart/form-data; boundary=X" (X optionally quoted)
 * into out (MULTIPART_BOUNDARY_MAX + 1 bytes, NUL-terminated). 0, or ERR_MEDIA_TYPE when the type is not
 * multipart/form-data, ERR_FORMAT when the boundary is missing or invalid; err (ERR_MSG_MAX, may be NULL)
 * says which. */
int multipart_boundary(const char *content_type, size_t len, char *out, char *err);

/* Parses body into parts[0..*n) (at most max_parts; more is ERR_FORMAT). 0 or ERR_FORMAT with err filled. */
int multipart_parse(const char *body, size_t len, const char *boundary, struct multipart_part *parts, int max_parts,
                    int *n, char *err);

/* The first part named name, or NULL. */
const struct multipart_part *multipart_find(const struct multipart_part *parts, int n, const char *name);

#endif
