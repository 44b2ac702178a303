/*
 * input: parsing and validation of a Batch API input file (JSONL, one request per line), shared by the upload
 * (structure, sizes, duplicate custom_ids) and batch creation (each line's url against the batch's endpoint).
 * Private to src/jobs/.
 */
#ifndef WAFER_JOBS_INPUT_H
#define WAFER_JOBS_INPUT_H

#include "jobs/store.h"

struct jobs_input {
    struct jobs_input_line *lines; /* [n] in file order; blank lines are skipped */
    int64_t n;
};

/* Parses data[0..len): every non-blank line a JSON object {custom_id: non-empty string, unique, method:
 * "POST", url: string (equal to endpoint when endpoint is not NULL), body: object}; at least one line, at
 * most max_lines. The first problem is reported (line numbers 1-based, counting blank lines) as ERR_FORMAT or
 * ERR_INVALID_ARG with err->code/param set. out may be NULL (validation only). */
int jobs_input_parse(const char *data, size_t len, int max_lines, const char *endpoint, struct jobs_input *out,
                     struct jobs_err *err);

void jobs_input_free(struct jobs_input *in);

#endif
