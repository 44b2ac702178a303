/*
 * yaml: loading a YAML document with libfyaml so that every config reader (the server's, the router's, the
 * alert rules) reports a syntax error the same way: "NAME:LINE:COLUMN: YAML syntax error: what", and never
 * prints to stderr on its own.
 */
#ifndef WAFER_CORE_YAML_H
#define WAFER_CORE_YAML_H

#include <libfyaml.h>
#include <stddef.h>

/* Parses the file at path, or (path NULL) the len bytes at text. name labels messages (a file name or
 * "<string>"). Returns the document (caller frees with fy_document_destroy), or NULL with ERR_FORMAT (syntax
 * error, with its position) or ERR_NOMEM in *rc and the message in err. */
struct fy_document *yaml_load(const char *path, const char *text, size_t len, const char *name, int *rc,
                              char *err);

#endif
