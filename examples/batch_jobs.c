/*
 * batch_jobs: a batch job with libwafer-client: the prompts become a JSONL of /v1/completions requests
 * (custom_id "p0", "p1", ...; greedy, 12 tokens), submitted from memory, waited for with a progress line on
 * stderr, and its output file printed.
 *
 *   build/examples/batch_jobs URL PROMPT...
 *
 * Prints the batch id on stderr, then the output file's JSONL lines on stdout (one per prompt: custom_id,
 * response.body = the completion), then the error file's lines, if any, on stderr. Exit 0 when the batch
 * completed and no line failed.
 * Build: cc batch_jobs.c $(pkg-config --cflags --libs wafer-client)   (or `make examples` in the source tree)
 */
#include <wafer/client.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* s as a JSON string (quotes included) at the end of buf; returns the new length, or 0 when it does not fit. */
static size_t put_json_string(char *buf, size_t len, size_t cap, const char *s)
{
    if (len + 2 >= cap)
        return 0;
    buf[len++] = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[8] = {0};
        if (ch == '"' || ch == '\\')
            snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", ch);
        else
            esc[0] = (char)ch;
        size_t n = strlen(esc);
        if (len + n + 2 >= cap)
            return 0;
        memcpy(buf + len, esc, n);
        len += n;
    }
    buf[len++] = '"';
    buf[len] = 0;
    return len;
}

static int on_progress(void *ud, const struct wafer_job *job)
{
    (void)ud;
    fprintf(stderr, "%s: %lld/%lld lines done\n", job->status, job->completed + job->failed, job->total);
    return 0; /* non-zero would stop waiting (the batch goes on) */
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: batch_jobs URL PROMPT...\n");
        return 2;
    }
    size_t cap = 4096;
    for (int i = 2; i < argc; i++)
        cap += 6 * strlen(argv[i]) + 200;
    char *jsonl = malloc(cap);
    if (!jsonl)
        return 1;
    size_t len = 0;
    for (int i = 2; i < argc; i++) {
        len += (size_t)snprintf(jsonl + len, cap - len,
                                "{\"custom_id\": \"p%d\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                                "\"body\": {\"max_tokens\": 12, \"temperature\": 0, \"prompt\": ", i - 2);
        if (!(len = put_json_string(jsonl, len, cap, argv[i])))
            return 1;
        len += (size_t)snprintf(jsonl + len, cap - len, "}}\n");
    }

    struct wafer_client_options o;
    wafer_client_options_default(&o);
    o.base_url = argv[1];
    char err[WAFER_ERR_MAX];
    struct wafer_client *c = wafer_client_create(&o, err);
    if (!c) {
        fprintf(stderr, "batch_jobs: %s\n", err);
        return 2;
    }
    struct wafer_job_request req = {0}; /* zero: the defaults (endpoint from the first line, window 24h) */
    req.data = jsonl;
    req.len = len;
    req.filename = "prompts.jsonl";
    const char *metadata[] = {"example", "batch_jobs"};
    req.metadata = metadata;
    req.n_metadata = 1;
    struct wafer_job job;
    struct wafer_result r;
    int rc = 1;
    if (wafer_jobs_submit(c, &req, &job, NULL, &r) != WAFER_OK) {
        fprintf(stderr, "batch_jobs: submit: %s: %s\n", wafer_status_name(r.status), r.error);
        goto out;
    }
    fprintf(stderr, "batch %s: %lld requests\n", job.id, job.total);
    wafer_result_free(&r);
    /* every 0.2 s, at most 5 minutes */
    if (wafer_jobs_wait(c, job.id, 0.2, 300, on_progress, NULL, &job, &r) != WAFER_OK) {
        fprintf(stderr, "batch_jobs: wait: %s: %s\n", wafer_status_name(r.status), r.error);
        goto out;
    }
    wafer_result_free(&r);
    if (wafer_jobs_results(c, job.id, false, &job, &r) == WAFER_OK)
        fwrite(r.text, 1, r.text_len, stdout);
    else if (r.status != WAFER_E_NO_FILE)
        fprintf(stderr, "batch_jobs: results: %s\n", r.error);
    wafer_result_free(&r);
    if (wafer_jobs_results(c, job.id, true, &job, &r) == WAFER_OK)
        fwrite(r.text, 1, r.text_len, stderr);
    rc = !strcmp(job.status, "completed") && job.failed == 0 ? 0 : 1;
out:
    wafer_result_free(&r);
    wafer_client_destroy(c);
    free(jsonl);
    return rc;
}
