/*
 * jobs_input: the Batch API input file, one JSON request per line. The whole file is checked before anything
 * is stored, so a batch never starts with a line it cannot run: the first problem is reported with its line
 * number (1-based, blank lines counted so the number matches an editor's). Duplicate custom_ids are found by
 * sorting (custom_id, line) pairs, and the duplicate reported is the one on the earliest line, so the message
 * does not depend on the sort.
 */
#include "jobs/input.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct input_id {
    const char *id; /* points into the parsed line's custom_id copy */
    int64_t line;
};

static int input_id_cmp(const void *a, const void *b)
{
    const struct input_id *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c)
        return c;
    return x->line < y->line ? -1 : x->line > y->line;
}

static bool input_blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
            return false;
    return true;
}

static int input_fail(struct jobs_err *err, int code, const char *oa_code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int input_fail(struct jobs_err *err, int code, const char *oa_code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = oa_code;
        err->param = "file";
    }
    return code;
}

/* Checks one parsed line; custom_id and body come back malloc'd. */
static int input_line_check(json_t *j, int64_t line, const char *endpoint, char **custom_id, char **body,
                            struct jobs_err *err)
{
    if (!json_is_object(j))
        return input_fail(err, ERR_FORMAT, "invalid_json_line",
                          "Line %lld is not a JSON object; each line of a batch input file is one request "
                          "{\"custom_id\", \"method\", \"url\", \"body\"}.",
                          (long long)line);
    json_t *cid = json_object_get(j, "custom_id");
    if (!json_is_string(cid) || json_string_length(cid) == 0)
        return input_fail(err, ERR_FORMAT, "invalid_custom_id",
                          "Line %lld: 'custom_id' is missing or not a non-empty string.", (long long)line);
    json_t *method = json_object_get(j, "method");
    if (!json_is_string(method) || strcmp(json_string_value(method), "POST"))
        return input_fail(err, ERR_FORMAT, "invalid_method", "Line %lld: 'method' must be \"POST\".",
                          (long long)line);
    json_t *url = json_object_get(j, "url");
    if (!json_is_string(url))
        return input_fail(err, ERR_FORMAT, "invalid_url",
                          "Line %lld: 'url' is missing or not a string (e.g. \"/v1/chat/completions\").",
                          (long long)line);
    if (endpoint && strcmp(json_string_value(url), endpoint))
        return input_fail(err, ERR_INVALID_ARG, "mismatched_url",
                          "Line %lld: url '%.200s' differs from the batch's endpoint '%s'; every request of a "
                          "batch goes to the batch's endpoint.",
                          (long long)line, json_string_value(url), endpoint);
    json_t *b = json_object_get(j, "body");
    if (!json_is_object(b))
        return input_fail(err, ERR_FORMAT, "invalid_body", "Line %lld: 'body' is missing or not a JSON object.",
                          (long long)line);
    *custom_id = strdup(json_string_value(cid));
    *body = json_dumps(b, JSON_COMPACT);
    if (!*custom_id || !*body) {
        free(*custom_id);
        free(*body);
        *custom_id = *body = NULL;
        return err_set(err ? err->message : NULL, ERR_NOMEM, "out of memory parsing line %lld", (long long)line);
    }
    return 0;
}

int jobs_input_parse(const char *data, size_t len, int max_lines, const char *endpoint, struct jobs_input *out,
                     struct jobs_err *err)
{
    struct jobs_input in = {0};
    struct input_id *ids = NULL;
    int64_t cap = 0;
    int rc = 0;
    int64_t line = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *p = data + pos;
        const char *nl = memchr(p, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - p) : len - pos;
        pos += n + (nl ? 1 : 0);
        line++;
        if (input_blank(p, n))
            continue;
        if (in.n >= max_lines) {
            rc = ERR_INVALID_ARG;
            if (err) {
                snprintf(err->message, sizeof err->message,
                         "The file has more than %d requests (line %lld is one too many); a batch holds at most "
                         "%d: split the file.",
                         max_lines, (long long)line, max_lines);
                err->code = "too_many_lines";
                err->param = "file";
            }
            goto fail;
        }
        json_error_t jerr;
        json_t *j = json_loadb(p, n, 0, &jerr);
        if (!j) {
            rc = ERR_FORMAT;
            if (err) {
                snprintf(err->message, sizeof err->message, "Line %lld is not valid JSON: %s (column %d).",
                         (long long)line, jerr.text, jerr.column);
                err->code = "invalid_json_line";
                err->param = "file";
            }
            goto fail;
        }
        if (in.n == cap) {
            cap = cap ? cap * 2 : 64;
            struct jobs_input_line *nlines = realloc(in.lines, (size_t)cap * sizeof *nlines);
            struct input_id *nids = nlines ? realloc(ids, (size_t)cap * sizeof *nids) : NULL;
            if (nlines)
                in.lines = nlines;
            if (nids)
                ids = nids;
            if (!nlines || !nids) {
                json_decref(j);
                rc = err_set(err ? err->message : NULL, ERR_NOMEM, "out of memory parsing the batch input file");
                goto fail;
            }
        }
        struct jobs_input_line *l = &in.lines[in.n];
        l->custom_id = l->body = NULL;
        rc = input_line_check(j, line, endpoint, &l->custom_id, &l->body, err);
        json_decref(j);
        if (rc)
            goto fail;
        ids[in.n].id = l->custom_id;
        ids[in.n].line = line;
        in.n++;
    }
    if (in.n == 0) {
        rc = ERR_INVALID_ARG;
        if (err) {
            snprintf(err->message, sizeof err->message,
                     "The file has no requests; a batch input file needs at least one JSONL line "
                     "{\"custom_id\", \"method\", \"url\", \"body\"}.");
            err->code = "empty_file";
            err->param = "file";
        }
        goto fail;
    }
    qsort(ids, (size_t)in.n, sizeof *ids, input_id_cmp);
    int64_t dup = -1;
    const char *dup_id = NULL;
    int64_t first = 0;
    for (int64_t i = 1; i < in.n; i++)
        if (!strcmp(ids[i].id, ids[i - 1].id) && (dup < 0 || ids[i].line < dup)) {
            dup = ids[i].line;
            dup_id = ids[i].id;
            int64_t k = i;
            while (k > 0 && !strcmp(ids[k - 1].id, ids[i].id))
                k--;
            first = ids[k].line;
        }
    if (dup >= 0) {
        rc = ERR_INVALID_ARG;
        if (err) {
            snprintf(err->message, sizeof err->message,
                     "Line %lld: custom_id '%.200s' is already used on line %lld; each custom_id must be unique "
                     "within a batch.",
                     (long long)dup, dup_id, (long long)first);
            err->code = "duplicate_custom_id";
            err->param = "file";
        }
        goto fail;
    }
    free(ids);
    if (out)
        *out = in;
    else
        jobs_input_free(&in);
    return 0;
fail:
    free(ids);
    jobs_input_free(&in);
    return rc;
}

void jobs_input_free(struct jobs_input *in)
{
    for (int64_t i = 0; i < in->n; i++) {
        free(in->lines[i].custom_id);
        free(in->lines[i].body);
    }
    free(in->lines);
    in->lines = NULL;
    in->n = 0;
}
