/*
 * jobs: batch jobs in libwafer-client (include/wafer/client.h has the contract): OpenAI's Batch API on
 * client_request, so each of its requests is pooled, timed out and retried as every call of the library.
 *
 *   submit   read the JSONL (a path is read whole into memory, so that a retried upload sends the same bytes
 *            again), POST /v1/files (multipart, purpose "batch"), then POST /v1/batches with the file's id
 *   get      GET /v1/batches/{id}                 cancel  POST /v1/batches/{id}/cancel
 *   wait     get every interval until the batch is final, telling the caller each time
 *   results  get, then GET /v1/files/{output or error file}/content
 *   list     GET /v1/batches?limit=&after=
 *
 * Ids go into URL paths as they are, so only plain tokens are taken (client_job_id_ok). The answers are
 * parsed into struct wafer_job (client_job_parse, unit-tested); the raw JSON stays in out->text for callers
 * that want every field. Nothing here keeps state between calls: thread-safe as the client is.
 */
#include "client/internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- parsing */

bool client_job_id_ok(const char *id)
{
    if (!id || !*id || strlen(id) >= WAFER_ID_MAX || !strcmp(id, ".") || !strcmp(id, ".."))
        return false;
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == '.' || *p == '~'))
            return false;
    return true;
}

/* A string field into dst ("" when absent or null). -1 when it does not fit. */
static int jobs_copy(char *dst, size_t cap, const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    dst[0] = 0;
    if (!v)
        return 0;
    if (strlen(v) >= cap)
        return -1;
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static long long jobs_int(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : json_is_real(v) ? (long long)json_real_value(v) : 0;
}

static bool jobs_final(const char *status)
{
    return !strcmp(status, "completed") || !strcmp(status, "failed") || !strcmp(status, "expired") ||
           !strcmp(status, "cancelled");
}

static int jobs_from_json(const json_t *b, struct wafer_job *job, char *err, size_t cap)
{
    memset(job, 0, sizeof *job);
    if (!json_is_object(b)) {
        snprintf(err, cap, "the batch is not a JSON object");
        return -1;
    }
    if (!json_is_string(json_object_get(b, "id")) || !json_is_string(json_object_get(b, "status"))) {
        snprintf(err, cap, "the batch object has no \"id\" or no \"status\" string");
        return -1;
    }
    static const struct {
        const char *key;
        size_t off, cap;
    } fields[] = {
        {"id", offsetof(struct wafer_job, id), WAFER_ID_MAX},
        {"status", offsetof(struct wafer_job, status), sizeof ((struct wafer_job *)0)->status},
        {"endpoint", offsetof(struct wafer_job, endpoint), sizeof ((struct wafer_job *)0)->endpoint},
        {"completion_window", offsetof(struct wafer_job, completion_window),
         sizeof ((struct wafer_job *)0)->completion_window},
        {"input_file_id", offsetof(struct wafer_job, input_file_id), WAFER_ID_MAX},
        {"output_file_id", offsetof(struct wafer_job, output_file_id), WAFER_ID_MAX},
        {"error_file_id", offsetof(struct wafer_job, error_file_id), WAFER_ID_MAX},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (jobs_copy((char *)job + fields[i].off, fields[i].cap, b, fields[i].key)) {
            snprintf(err, cap, "the batch's \"%s\" is longer than %zu bytes", fields[i].key, fields[i].cap - 1);
            return -1;
        }
    const json_t *rc = json_object_get(b, "request_counts");
    job->total = jobs_int(rc, "total");
    job->completed = jobs_int(rc, "completed");
    job->failed = jobs_int(rc, "failed");
    job->created_at = jobs_int(b, "created_at");
    job->completed_at = jobs_int(b, "completed_at");
    job->final = jobs_final(job->status);
    const json_t *errs = json_object_get(json_object_get(b, "errors"), "data");
    size_t used = 0;
    for (size_t i = 0; i < json_array_size(errs) && used + 1 < sizeof job->errors; i++) {
        const json_t *e = json_array_get(errs, i);
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        int k = snprintf(job->errors + used, sizeof job->errors - used, "%s%s: %s", used ? "\n" : "",
                         code ? code : "-", msg ? msg : "-");
        used += k > 0 ? (size_t)k : 0;
    }
    return 0;
}

int client_job_parse(const char *json, size_t len, struct wafer_job *job, char *err, size_t cap)
{
    json_error_t je;
    json_t *b = json_loadb(json ? json : "", json ? len : 0, 0, &je);
    if (!b) {
        memset(job, 0, sizeof *job);
        snprintf(err, cap, "the answer is not JSON: %s", je.text);
        return -1;
    }
    int rc = jobs_from_json(b, job, err, cap);
    json_decref(b);
    return rc;
}

int client_job_parse_list(const char *json, size_t len, struct wafer_job **jobs, int *n, bool *has_more, char *err,
                          size_t cap)
{
    *jobs = NULL;
    *n = 0;
    *has_more = false;
    json_error_t je;
    json_t *l = json_loadb(json ? json : "", json ? len : 0, 0, &je);
    const json_t *data = json_object_get(l, "data");
    if (!json_is_array(data)) {
        snprintf(err, cap, l ? "the list has no \"data\" array" : "the answer is not JSON: %s", je.text);
        json_decref(l);
        return -1;
    }
    size_t k = json_array_size(data);
    struct wafer_job *v = k ? calloc(k, sizeof *v) : NULL;
    if (k && !v) {
        snprintf(err, cap, "out of memory");
        json_decref(l);
        return -1;
    }
    for (size_t i = 0; i < k; i++) {
        char why[200];
        if (jobs_from_json(json_array_get(data, i), &v[i], why, sizeof why)) {
            snprintf(err, cap, "batch %zu of the list: %s", i, why);
            free(v);
            json_decref(l);
            return -1;
        }
    }
    *has_more = json_is_true(json_object_get(l, "has_more"));
    *jobs = v;
    *n = (int)k;
    json_decref(l);
    return 0;
}

char *client_jsonl_first_url(const char *data, size_t len)
{
    const char *p = data, *end = data + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *q = p;
        while (q < e && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        if (q < e) { /* the first line that is not blank decides */
            json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
            const char *url = json_string_value(json_object_get(j, "url"));
            char *r = url ? strdup(url) : NULL;
            json_decref(j);
            return r;
        }
        p = e + 1;
    }
    return NULL;
}

/* ---------------------------------------------------------------- calls */

/* A JSON answer into job (may be NULL): WAFER_E_PROTOCOL with why when it is not a batch. */
static int jobs_take(struct wafer_job *job, struct wafer_result *out)
{
    if (out->status != WAFER_OK || !job)
        return out->status;
    char why[200];
    if (client_job_parse(out->text, out->text_len, job, why, sizeof why))
        return client_fail(out, WAFER_E_PROTOCOL, "%s", why);
    return WAFER_OK;
}

static int jobs_bad_id(const char *what, const char *id, struct wafer_result *out)
{
    client_result_init(out);
    return client_fail(out, WAFER_E_INVALID,
                       "%s %s'%.60s' is not an id (1 to %d letters, digits, '-', '_', '.' or '~')", what,
                       id ? "" : "(null) ", id ? id : "", WAFER_ID_MAX - 1);
}

/* method on "/v1/batches/{id}" + suffix, the answer (a batch) into job. */
static int jobs_batch_call(struct wafer_client *c, const char *method, const char *id, const char *suffix,
                           struct wafer_job *job, struct wafer_result *out)
{
    if (!out)
        return WAFER_E_INVALID;
    bool ok = client_job_id_ok(id);
    char path[64 + WAFER_ID_MAX];
    if (ok) /* before job is cleared: id may be job->id */
        snprintf(path, sizeof path, "/v1/batches/%s%s", id, suffix);
    if (job)
        memset(job, 0, sizeof *job);
    if (!ok)
        return jobs_bad_id("the batch id", id, out);
    client_request(c, method, path, NULL, NULL, 0, out);
    return jobs_take(job, out);
}

int wafer_jobs_get(struct wafer_client *c, const char *id, struct wafer_job *job, struct wafer_result *out)
{
    return jobs_batch_call(c, "GET", id, "", job, out);
}

int wafer_jobs_cancel(struct wafer_client *c, const char *id, struct wafer_job *job, struct wafer_result *out)
{
    return jobs_batch_call(c, "POST", id, "/cancel", job, out);
}

int wafer_files_content(struct wafer_client *c, const char *file_id, struct wafer_result *out)
{
    if (!out)
        return WAFER_E_INVALID;
    if (!client_job_id_ok(file_id))
        return jobs_bad_id("the file id", file_id, out);
    char path[64 + WAFER_ID_MAX];
    snprintf(path, sizeof path, "/v1/files/%s/content", file_id);
    return client_request(c, "GET", path, NULL, NULL, (size_t)1 << 36, out);
}

int wafer_jobs_results(struct wafer_client *c, const char *id, bool errors, struct wafer_job *job,
                       struct wafer_result *out)
{
    struct wafer_job local;
    if (!job)
        job = &local;
    if (wafer_jobs_get(c, id, job, out) != WAFER_OK)
        return out->status;
    const char *fid = errors ? job->error_file_id : job->output_file_id;
    if (!fid[0]) {
        wafer_result_free(out);
        if (!job->final)
            return client_fail(out, WAFER_E_NO_FILE, "batch %s is %s; its files come when it ends", job->id,
                               job->status);
        return client_fail(out, WAFER_E_NO_FILE, "batch %s is %s and has no %s file (%s)", job->id, job->status,
                           errors ? "error" : "output", errors ? "no request failed" : "no request succeeded");
    }
    wafer_result_free(out); /* the batch's JSON: each call starts out afresh */
    return wafer_files_content(c, fid, out);
}

int wafer_jobs_wait(struct wafer_client *c, const char *id, double interval_s, double timeout_s,
                    wafer_job_progress_fn fn, void *ud, struct wafer_job *job, struct wafer_result *out)
{
    struct wafer_job local;
    if (!job)
        job = &local;
    if (!(interval_s > 0))
        interval_s = 1;
    if (!out)
        return WAFER_E_INVALID;
    char idc[WAFER_ID_MAX]; /* id may be job->id, which each look rewrites */
    if (!client_job_id_ok(id))
        return jobs_bad_id("the batch id", id, out);
    snprintf(idc, sizeof idc, "%s", id);
    id = idc;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (bool first = true;; first = false) {
        if (!first)
            wafer_result_free(out); /* the previous look's */
        if (wafer_jobs_get(c, id, job, out) != WAFER_OK)
            return out->status;
        if (fn && fn(ud, job))
            return job->final ? WAFER_OK : client_fail(out, WAFER_E_CANCELLED, "stopped by the progress callback");
        if (job->final)
            return WAFER_OK;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
        double nap = interval_s;
        if (timeout_s > 0) {
            if (waited >= timeout_s)
                return client_fail(out, WAFER_E_TIMEOUT, "batch %s is still %s after %.1f s (%lld/%lld lines done)",
                                   job->id, job->status, waited, job->completed + job->failed, job->total);
            if (nap > timeout_s - waited)
                nap = timeout_s - waited;
        }
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
}

int wafer_jobs_list(struct wafer_client *c, int limit, const char *after, struct wafer_job **jobs, int *n,
                    bool *has_more, struct wafer_result *out)
{
    if (!out)
        return WAFER_E_INVALID;
    if (jobs)
        *jobs = NULL;
    if (n)
        *n = 0;
    if (has_more)
        *has_more = false;
    if (!jobs || !n) {
        client_result_init(out);
        return client_fail(out, WAFER_E_INVALID, "wafer_jobs_list needs jobs and n");
    }
    if (limit > 100) {
        client_result_init(out);
        return client_fail(out, WAFER_E_INVALID, "limit %d is not in 1..100", limit);
    }
    if (after && !client_job_id_ok(after))
        return jobs_bad_id("after:", after, out);
    char path[96 + WAFER_ID_MAX];
    int k = snprintf(path, sizeof path, "/v1/batches");
    if (limit > 0)
        k += snprintf(path + k, sizeof path - (size_t)k, "?limit=%d", limit);
    if (after)
        snprintf(path + k, sizeof path - (size_t)k, "%safter=%s", limit > 0 ? "&" : "?", after);
    if (client_request(c, "GET", path, NULL, NULL, 0, out) != WAFER_OK)
        return out->status;
    bool more;
    char why[200];
    if (client_job_parse_list(out->text, out->text_len, jobs, n, &more, why, sizeof why))
        return client_fail(out, WAFER_E_PROTOCOL, "%s", why);
    if (has_more)
        *has_more = more;
    return WAFER_OK;
}

void wafer_jobs_free(struct wafer_job *jobs) { free(jobs); }

/* The whole file at path into *data (*len bytes). 0, or -1 with why in out (WAFER_E_INVALID). */
static int jobs_read_file(const char *path, char **data, size_t *len, struct wafer_result *out)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return client_fail(out, WAFER_E_INVALID, "cannot open '%.150s': %s", path, strerror(errno));
    size_t cap = 0;
    char *p = NULL;
    for (;;) {
        if (*len == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *np = realloc(p, ncap);
            if (!np) {
                free(p);
                fclose(f);
                return client_fail(out, WAFER_E_NOMEM, "out of memory reading '%.150s'", path);
            }
            p = np;
            cap = ncap;
        }
        size_t got = fread(p + *len, 1, cap - *len, f);
        *len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(p);
        *len = 0;
        return client_fail(out, WAFER_E_INVALID, "cannot read '%.150s'", path);
    }
    *data = p;
    return 0;
}

int wafer_jobs_submit(struct wafer_client *c, const struct wafer_job_request *req, struct wafer_job *job,
                      struct wafer_file *file, struct wafer_result *out)
{
    if (!out)
        return WAFER_E_INVALID;
    client_result_init(out);
    if (job)
        memset(job, 0, sizeof *job);
    if (file)
        memset(file, 0, sizeof *file);
    if (!c || !req || (!req->path && !req->data))
        return client_fail(out, WAFER_E_INVALID, "no client, or a request with neither path nor data");
    if (req->n_metadata < 0 || (req->n_metadata > 0 && !req->metadata))
        return client_fail(out, WAFER_E_INVALID, "n_metadata %d without metadata", req->n_metadata);
    char *owned = NULL, *endpoint_auto = NULL, *body = NULL;
    const char *data = req->data;
    size_t len = req->len;
    json_t *create = NULL;
    if (req->path && jobs_read_file(req->path, &owned, &len, out))
        return out->status;
    if (req->path)
        data = owned;
    const char *endpoint = req->endpoint;
    if (!endpoint)
        endpoint = (endpoint_auto = client_jsonl_first_url(data, len)) ? endpoint_auto : "/v1/chat/completions";
    const char *filename = req->filename;
    if (!filename && req->path)
        filename = strrchr(req->path, '/') ? strrchr(req->path, '/') + 1 : req->path;
    if (!filename || !*filename)
        filename = "batch.jsonl";
    struct client_upload up = {.purpose = "batch", .filename = filename, .data = data, .len = len};
    if (client_request(c, "POST", "/v1/files", NULL, &up, 0, out) != WAFER_OK)
        goto done;
    json_t *fj = json_loadb(out->text, out->text_len, 0, NULL);
    const char *fid = json_string_value(json_object_get(fj, "id"));
    if (!fid || !client_job_id_ok(fid)) {
        json_decref(fj);
        client_fail(out, WAFER_E_PROTOCOL, "the upload's answer has no usable file \"id\": %.100s",
                    out->text ? out->text : "");
        goto done;
    }
    if (file) {
        snprintf(file->id, sizeof file->id, "%s", fid);
        file->bytes = jobs_int(fj, "bytes");
        jobs_copy(file->filename, sizeof file->filename, fj, "filename");
        jobs_copy(file->purpose, sizeof file->purpose, fj, "purpose");
    }
    create = json_pack("{s:s, s:s, s:s}", "input_file_id", fid, "endpoint", endpoint, "completion_window",
                       req->completion_window ? req->completion_window : "24h");
    json_decref(fj);
    if (!create) {
        client_fail(out, WAFER_E_INVALID, "the endpoint or completion window is not valid UTF-8");
        goto done;
    }
    if (req->n_metadata > 0) {
        json_t *md = json_object();
        if (!md || json_object_set_new(create, "metadata", md))
            goto oom;
        for (int i = 0; i < req->n_metadata; i++) {
            const char *k = req->metadata[2 * i], *v = req->metadata[2 * i + 1];
            if (!k || !v || json_object_set_new(md, k, json_string(v))) {
                client_fail(out, WAFER_E_INVALID, "metadata pair %d is NULL or not valid UTF-8", i);
                goto done;
            }
        }
    }
    if (!(body = json_dumps(create, JSON_COMPACT)))
        goto oom;
    wafer_result_free(out);
    client_request(c, "POST", "/v1/batches", body, NULL, 0, out);
    jobs_take(job, out);
    goto done;
oom:
    wafer_result_free(out);
    client_fail(out, WAFER_E_NOMEM, "out of memory");
done:
    json_decref(create);
    free(body);
    free(endpoint_auto);
    free(owned);
    return out->status;
}
