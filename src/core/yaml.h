/*
 * yaml: loading a YAML document with libfyaml so that every config reader (the server's, the router's, the
 * alert rules) reports a syntax error the same way: "NAME:LINE:COLUMN: YAML syntax error: what", and never
 * prints to stderr on its own.
 */
#ifndef WAFER_CORE_YAML_H
#define WAFER_CORE_YAML_H

#include <libfyaml.h>
#include <stdbool.h>
#include <stddef.h>

/* Parses the file at path, or (path NULL) the len bytes at text. name labels messages (a file name or
 * "<string>"). Returns the document (caller frees with fy_document_destroy), or NULL with ERR_FORMAT (syntax
 * error, with its position) or ERR_NOMEM in *rc and the message in err. */
struct fy_document *yaml_load(const char *path, const char *text, size_t len, const char *name, int *rc,
                              char *err);

/* The 1-based line of a scalar node (0 for other nodes and NULL), for "file:line: key: ..." messages. */
int yaml_scalar_line(struct fy_node *n);

/* The scalar text of n as a NUL-terminated copy in buf (cap bytes); false when n is not a scalar (or is an
 * alias) or does not fit. */
bool yaml_scalar(struct fy_node *n, char *buf, size_t cap);

/* A path read from a config file: relative ones are taken from the folder of base (the file's path; NULL:
 * as given). malloc'd (caller frees); NULL on OOM. */
char *yaml_resolve_path(const char *base, const char *p);

#endif
