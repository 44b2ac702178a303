/*
 * jobs: the front end of the job store, above the two stores (store_sqlite.c, store_redis.c; the helpers they
 * share with it are in store_common.c). It does what does not depend on the store: checking what clients send
 * (sizes, input lines, endpoint, completion window, metadata) before anything is stored, rendering OpenAI's
 * objects, building output lines, and the finalization flow that turns committed results into the output and
 * error files:
 *
 *   in_progress|cancelling --transition--> finalizing (final status recorded) --lock--> fill the lines that
 *   have no result (batch_expired / batch_cancelled) --scan--> output and error files written, durable but
 *   invisible --batch_end--> completed|expired|cancelled with both files published in the same atomic step.
 *
 * Every step is idempotent, so a process dying anywhere leaves a batch that the next tick (of this process
 * after a restart, or of any other worker in Redis mode) finalizes again from the start; the files of an
 * abandoned attempt are never published and are swept by the store.
 *
 * The store's mutex is held around each public call (and one whole finalization), so the backends need no
 * locking of their own.
 */
#include "jobs/jobs.h"

#include "core/log.h"
#include "jobs/input.h"
#include "jobs/store.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define JOBS_OUT_BUF (1u << 20) /* bytes gathered before each write of an output file */

struct jobs_store {
    struct jobs_backend *b;
    pthread_mutex_t mu;
    uint64_t max_file_bytes;
    int max_lines;
    int renew_ms;
    char where[PATH_MAX + 64];
};

static const char *const jobs_endpoints[] = {"/v1/completions", "/v1/chat/completions"};

int64_t jobs_now(void) { return (int64_t)time(NULL); }

void jobs_default_data_dir(char *buf, size_t size)
{
    const char *x = getenv("XDG_DATA_HOME");
    if (x && x[0] == '/') {
        snprintf(buf, size, "%s/wafer", x);
        return;
    }
    const char *home = getenv("HOME");
    snprintf(buf, size, "%s/.local/share/wafer", home && *home ? home : ".");
}

static void jobs_err_clear(struct jobs_err *err)
{
    if (err) {
        err->message[0] = 0;
        err->code = NULL;
        err->param = NULL;
    }
}

static char *jobs_err_buf(struct jobs_err *err) { return err ? err->message : NULL; }

static int jobs_fail(struct jobs_err *err, int code, const char *oa_code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int jobs_fail(struct jobs_err *err, int code, const char *oa_code, const char *param, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->code = oa_code;
        err->param = param;
    }
    return code;
}

struct jobs_store *jobs_store_open(const struct jobs_config *cfg, struct jobs_err *err)
{
    jobs_err_clear(err);
    struct jobs_store *s = calloc(1, sizeof *s);
    if (!s) {
        jobs_fail(err, ERR_NOMEM, NULL, NULL, "out of memory opening the job store");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->max_file_bytes = cfg && cfg->max_file_bytes ? cfg->max_file_bytes : JOBS_DEFAULT_MAX_FILE_BYTES;
    s->max_lines = cfg && cfg->max_lines > 0 ? cfg->max_lines : JOBS_DEFAULT_MAX_LINES;
    const char *queue = cfg ? cfg->queue : NULL;
    if (queue && *queue) {
        if (strncmp(queue, "redis://", 8)) {
            jobs_fail(err, ERR_INVALID_ARG, NULL, NULL,
                      "queue '%s': expected redis://[:password@]HOST:PORT[/DB] (or nothing: SQLite in the data dir)",
                      queue);
            goto fail;
        }
        int lease = cfg->lease_ms > 0 ? cfg->lease_ms : JOBS_DEFAULT_LEASE_MS;
        s->renew_ms = lease / 3 > 0 ? lease / 3 : 1;
        s->b = jobs_redis_open(queue, cfg->consumer, lease, jobs_err_buf(err));
        const char *at = strrchr(queue, '@');
        snprintf(s->where, sizeof s->where, "Redis at %s", at ? at + 1 : queue + 8);
    } else {
        char dir[PATH_MAX];
        if (cfg && cfg->data_dir && *cfg->data_dir)
            snprintf(dir, sizeof dir, "%s", cfg->data_dir);
        else
            jobs_default_data_dir(dir, sizeof dir);
        s->b = jobs_sqlite_open(dir, jobs_err_buf(err));
        snprintf(s->where, sizeof s->where, "SQLite in %s", dir);
    }
    if (!s->b)
        goto fail;
    return s;
fail:
    pthread_mutex_destroy(&s->mu);
    free(s);
    return NULL;
}

void jobs_store_close(struct jobs_store *s)
{
    if (!s)
        return;
    s->b->ops->close(s->b);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const char *jobs_store_where(const struct jobs_store *s) { return s->where; }

int jobs_store_renew_ms(const struct jobs_store *s) { return s->renew_ms; }

/* ---- rendering ---- */

static json_t *jobs_file_json(const struct jobs_file_rec *f)
{
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(f->id));
    json_object_set_new(j, "object", json_string("file"));
    json_object_set_new(j, "bytes", json_integer(f->bytes));
    json_object_set_new(j, "created_at", json_integer(f->created_at));
    json_object_set_new(j, "filename", json_string(f->filename));
    json_object_set_new(j, "purpose", json_string(f->purpose));
    json_object_set_new(j, "status", json_string("processed")); /* deprecated by OpenAI, still sent */
    json_object_set_new(j, "status_details", json_null());
    return j;
}

static json_t *jobs_str_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }
static json_t *jobs_time_or_null(int64_t t) { return t ? json_integer(t) : json_null(); }

static json_t *jobs_batch_json(const struct jobs_batch_rec *b)
{
    json_t *j = json_object();
    json_object_set_new(j, "id", json_string(b->id));
    json_object_set_new(j, "object", json_string("batch"));
    json_object_set_new(j, "endpoint", json_string(b->endpoint));
    if (b->error_code[0]) {
        json_t *e = json_object();
        json_object_set_new(e, "code", json_string(b->error_code));
        json_object_set_new(e, "message", json_string(b->error_message));
        json_object_set_new(e, "param", json_null());
        json_object_set_new(e, "line", json_null());
        json_t *errs = json_object();
        json_object_set_new(errs, "object", json_string("list"));
        json_object_set_new(errs, "data", json_pack("[o]", e));
        json_object_set_new(j, "errors", errs);
    } else {
        json_object_set_new(j, "errors", json_null());
    }
    json_object_set_new(j, "input_file_id", json_string(b->input_file_id));
    json_object_set_new(j, "completion_window", json_string(b->completion_window));
    json_object_set_new(j, "status", json_string(jobs_status_name(b->status)));
    json_object_set_new(j, "output_file_id", jobs_str_or_null(b->output_file_id));
    json_object_set_new(j, "error_file_id", jobs_str_or_null(b->error_file_id));
    json_object_set_new(j, "created_at", json_integer(b->created_at));
    json_object_set_new(j, "in_progress_at", jobs_time_or_null(b->at[JOBS_IN_PROGRESS]));
    json_object_set_new(j, "expires_at", jobs_time_or_null(b->expires_at));
    static const enum jobs_status later[] = {JOBS_FINALIZING, JOBS_COMPLETED, JOBS_FAILED,
                                             JOBS_EXPIRED,    JOBS_CANCELLING, JOBS_CANCELLED};
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "%s_at", jobs_status_name(later[i]));
        json_object_set_new(j, key, jobs_time_or_null(b->at[later[i]]));
    }
    json_object_set_new(j, "request_counts",
                        json_pack("{sIsIsI}", "total", (json_int_t)b->total, "completed", (json_int_t)b->completed,
                                  "failed", (json_int_t)b->failed));
    json_t *meta = b->metadata ? json_loads(b->metadata, 0, NULL) : NULL;
    json_object_set_new(j, "metadata", meta ? meta : json_null());
    return j;
}

static json_t *jobs_list_json(json_t *data, const char *first, const char *last, bool has_more)
{
    json_t *j = json_object();
    json_object_set_new(j, "object", json_string("list"));
    json_object_set_new(j, "data", data);
    json_object_set_new(j, "first_id", jobs_str_or_null(first));
    json_object_set_new(j, "last_id", jobs_str_or_null(last));
    json_object_set_new(j, "has_more", json_boolean(has_more));
    return j;
}

/* ---- files ---- */

/* Writes data as file rec->id through the backend and publishes it. */
static int jobs_file_store(struct jobs_store *s, const struct jobs_file_rec *rec, const void *data, size_t len,
                           struct jobs_err *err)
{
    struct jobs_backend *b = s->b;
    void *w = NULL;
    int rc = b->ops->file_write_begin(b, rec->id, &w, jobs_err_buf(err));
    if (rc)
        return rc;
    rc = b->ops->file_write(b, w, data, len, jobs_err_buf(err));
    int rc2 = b->ops->file_write_end(b, w, rc == 0, rc ? NULL : jobs_err_buf(err));
    if (rc || rc2)
        return rc ? rc : rc2;
    rc = b->ops->file_publish(b, rec, jobs_err_buf(err));
    if (rc)
        b->ops->file_discard(b, rec->id);
    return rc;
}

int jobs_file_create(struct jobs_store *s, const char *filename, const char *purpose, const void *data, size_t len,
                     json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    if (!purpose || strcmp(purpose, "batch"))
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_purpose", "purpose",
                         "Invalid value for 'purpose': '%s'; wafer stores only files with purpose 'batch'.",
                         purpose ? purpose : "(missing)");
    if (len > s->max_file_bytes)
        return jobs_fail(err, ERR_TOO_LARGE, "file_too_large", "file",
                         "The file is %zu bytes; the limit is %llu bytes (%.0f MB): split it into several batches.",
                         len, (unsigned long long)s->max_file_bytes, s->max_file_bytes / 1048576.0);
    if (!filename || !*filename)
        filename = "upload.jsonl";
    if (strlen(filename) >= JOBS_NAME_MAX)
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_filename", "file",
                         "The file name is %zu bytes long; the limit is %d.", strlen(filename), JOBS_NAME_MAX - 1);
    int rc = jobs_input_parse(data, len, s->max_lines, NULL, NULL, err);
    if (rc)
        return rc;
    struct jobs_file_rec rec = {0};
    jobs_id_make(rec.id, sizeof rec.id, "file-");
    rec.bytes = (int64_t)len;
    rec.created_at = jobs_now();
    snprintf(rec.filename, sizeof rec.filename, "%s", filename);
    snprintf(rec.purpose, sizeof rec.purpose, "batch");
    pthread_mutex_lock(&s->mu);
    rc = jobs_file_store(s, &rec, data, len, err);
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return rc;
    *out = jobs_file_json(&rec);
    return 0;
}

int jobs_file_get(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    struct jobs_file_rec rec;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->file_get(s->b, id, &rec, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return rc;
    *out = jobs_file_json(&rec);
    return 0;
}

int jobs_file_list(struct jobs_store *s, const char *purpose, int limit, const char *after, json_t **out,
                   struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    if (limit == 0)
        limit = 10000;
    if (limit < 1 || limit > 10000)
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_limit", "limit",
                         "Invalid value for 'limit': %d; expected 1 to 10000.", limit);
    struct jobs_file_rec *recs = malloc((size_t)(limit + 1) * sizeof *recs);
    if (!recs)
        return jobs_fail(err, ERR_NOMEM, NULL, NULL, "out of memory listing files");
    int n = 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->file_list(s->b, purpose, after, limit + 1, recs, &n, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (rc == ERR_NOT_FOUND && err)
        err->param = "after";
    if (!rc) {
        json_t *data = json_array();
        int shown = n > limit ? limit : n;
        for (int i = 0; i < shown; i++)
            json_array_append_new(data, jobs_file_json(&recs[i]));
        *out = jobs_list_json(data, shown ? recs[0].id : NULL, shown ? recs[shown - 1].id : NULL, n > limit);
    }
    free(recs);
    return rc;
}

int jobs_file_content(struct jobs_store *s, const char *id, char **data, size_t *len, struct jobs_err *err)
{
    jobs_err_clear(err);
    *data = NULL;
    *len = 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->file_read(s->b, id, data, len, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int jobs_file_delete(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->file_delete(s->b, id, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return rc;
    *out = json_pack("{sssssb}", "id", id, "object", "file", "deleted", 1);
    return 0;
}

/* ---- batches ---- */

/* "24h", or "<N>s|m|h" from 1 s to 168 h: OpenAI accepts only "24h"; shorter windows are wafer's own. */
static int jobs_window_parse(const char *w, int64_t *seconds)
{
    if (!w || !*w)
        return -1;
    char *end;
    long long v = strtoll(w, &end, 10);
    if (end == w || v <= 0 || end[0] == 0 || end[1] != 0)
        return -1;
    int64_t mul = end[0] == 's' ? 1 : end[0] == 'm' ? 60 : end[0] == 'h' ? 3600 : 0;
    if (!mul || v > 168 * 3600 / mul)
        return -1;
    *seconds = v * mul;
    return 0;
}

static int jobs_metadata_check(const json_t *meta, struct jobs_err *err)
{
    if (!meta || json_is_null(meta))
        return 0;
    if (!json_is_object(meta))
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_metadata", "metadata",
                         "Invalid 'metadata': expected an object of up to 16 string pairs.");
    if (json_object_size(meta) > 16)
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_metadata", "metadata",
                         "Invalid 'metadata': %zu pairs; at most 16 are allowed.", json_object_size(meta));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)meta, key, v)
    {
        if (strlen(key) > 64)
            return jobs_fail(err, ERR_INVALID_ARG, "invalid_metadata", "metadata",
                             "Invalid 'metadata': key '%.70s...' is longer than 64 characters.", key);
        if (!json_is_string(v) || json_string_length(v) > 512)
            return jobs_fail(err, ERR_INVALID_ARG, "invalid_metadata", "metadata",
                             "Invalid 'metadata': the value of '%s' must be a string of at most 512 characters.",
                             key);
    }
    return 0;
}

int jobs_batch_create(struct jobs_store *s, const json_t *request, json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    if (!json_is_object(request))
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_request", NULL,
                         "The request body must be a JSON object {input_file_id, endpoint, completion_window}.");
    const json_t *jf = json_object_get(request, "input_file_id");
    const json_t *je = json_object_get(request, "endpoint");
    const json_t *jw = json_object_get(request, "completion_window");
    const json_t *jm = json_object_get(request, "metadata");
    if (!json_is_string(jf))
        return jobs_fail(err, ERR_INVALID_ARG, "missing_required_parameter", "input_file_id",
                         "Missing required parameter: 'input_file_id' (the id of a file uploaded with purpose "
                         "'batch').");
    if (!json_is_string(je))
        return jobs_fail(err, ERR_INVALID_ARG, "missing_required_parameter", "endpoint",
                         "Missing required parameter: 'endpoint' ('/v1/completions' or '/v1/chat/completions').");
    const char *endpoint = json_string_value(je);
    bool known = false;
    for (size_t i = 0; i < sizeof jobs_endpoints / sizeof jobs_endpoints[0]; i++)
        known |= !strcmp(endpoint, jobs_endpoints[i]);
    if (!known)
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_value", "endpoint",
                         "Invalid value for 'endpoint': '%.100s'; supported values are '/v1/completions' and "
                         "'/v1/chat/completions'.",
                         endpoint);
    if (!json_is_string(jw))
        return jobs_fail(err, ERR_INVALID_ARG, "missing_required_parameter", "completion_window",
                         "Missing required parameter: 'completion_window' (\"24h\").");
    int64_t window;
    if (jobs_window_parse(json_string_value(jw), &window))
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_value", "completion_window",
                         "Invalid value for 'completion_window': '%.20s'; expected \"24h\" (or a duration such as "
                         "\"90m\", \"2h\", from 1s to 168h).",
                         json_string_value(jw));
    int rc = jobs_metadata_check(jm, err);
    if (rc)
        return rc;

    const char *fid = json_string_value(jf);
    struct jobs_file_rec frec;
    char *data = NULL;
    size_t len = 0;
    struct jobs_input in = {0};
    struct jobs_batch_rec rec = {0};
    pthread_mutex_lock(&s->mu);
    rc = s->b->ops->file_get(s->b, fid, &frec, jobs_err_buf(err));
    if (!rc && strcmp(frec.purpose, "batch"))
        rc = jobs_fail(err, ERR_INVALID_ARG, "invalid_input_file", "input_file_id",
                       "File %s has purpose '%s'; a batch's input file must have purpose 'batch'.", fid,
                       frec.purpose);
    if (!rc)
        rc = s->b->ops->file_read(s->b, fid, &data, &len, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (rc == ERR_NOT_FOUND) {
        jobs_fail(err, ERR_NOT_FOUND, "not_found", "input_file_id", "No file with id '%.60s' exists.", fid);
        goto done;
    }
    if (rc)
        goto done;
    rc = jobs_input_parse(data, len, s->max_lines, endpoint, &in, err);
    if (rc) {
        if (err)
            err->param = "input_file_id";
        goto done;
    }
    jobs_id_make(rec.id, sizeof rec.id, "batch_");
    snprintf(rec.endpoint, sizeof rec.endpoint, "%s", endpoint);
    snprintf(rec.input_file_id, sizeof rec.input_file_id, "%s", fid);
    snprintf(rec.completion_window, sizeof rec.completion_window, "%s", json_string_value(jw));
    rec.status = JOBS_IN_PROGRESS; /* validated above: the lines are ready to run */
    rec.final_status = JOBS_COMPLETED;
    rec.created_at = jobs_now();
    rec.at[JOBS_IN_PROGRESS] = rec.created_at;
    rec.expires_at = rec.created_at + window;
    rec.total = in.n;
    if (jm && json_is_object(jm) && !(rec.metadata = json_dumps(jm, JSON_COMPACT))) {
        rc = jobs_fail(err, ERR_NOMEM, NULL, NULL, "out of memory creating the batch");
        goto done;
    }
    pthread_mutex_lock(&s->mu);
    rc = s->b->ops->batch_insert(s->b, &rec, in.lines, in.n, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (!rc)
        *out = jobs_batch_json(&rec);
done:
    jobs_batch_rec_deinit(&rec);
    jobs_input_free(&in);
    free(data);
    return rc;
}

int jobs_batch_get(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    struct jobs_batch_rec rec = {0};
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->batch_get(s->b, id, &rec, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (!rc)
        *out = jobs_batch_json(&rec);
    jobs_batch_rec_deinit(&rec);
    return rc;
}

int jobs_batch_list(struct jobs_store *s, int limit, const char *after, json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    if (limit == 0)
        limit = 20;
    if (limit < 1 || limit > 100)
        return jobs_fail(err, ERR_INVALID_ARG, "invalid_limit", "limit",
                         "Invalid value for 'limit': %d; expected 1 to 100.", limit);
    struct jobs_batch_rec *recs = calloc((size_t)limit + 1, sizeof *recs);
    if (!recs)
        return jobs_fail(err, ERR_NOMEM, NULL, NULL, "out of memory listing batches");
    int n = 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->batch_list(s->b, after, limit + 1, recs, &n, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (rc == ERR_NOT_FOUND && err)
        err->param = "after";
    if (!rc) {
        json_t *data = json_array();
        int shown = n > limit ? limit : n;
        for (int i = 0; i < shown; i++)
            json_array_append_new(data, jobs_batch_json(&recs[i]));
        *out = jobs_list_json(data, shown ? recs[0].id : NULL, shown ? recs[shown - 1].id : NULL, n > limit);
    }
    for (int i = 0; i < n; i++)
        jobs_batch_rec_deinit(&recs[i]);
    free(recs);
    return rc;
}

int jobs_batch_cancel(struct jobs_store *s, const char *id, json_t **out, struct jobs_err *err)
{
    jobs_err_clear(err);
    *out = NULL;
    struct jobs_batch_rec rec = {0};
    bool applied = false;
    enum jobs_status old = JOBS_VALIDATING;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->batch_transition(s->b, id, JOBS_STATUS_BIT(JOBS_VALIDATING) | JOBS_STATUS_BIT(JOBS_IN_PROGRESS),
                                         JOBS_CANCELLING, JOBS_CANCELLED, jobs_now(), NULL, NULL, &applied, &old,
                                         jobs_err_buf(err));
    if (!rc)
        rc = s->b->ops->batch_get(s->b, id, &rec, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    if (!rc && !applied && old != JOBS_CANCELLING && old != JOBS_CANCELLED)
        rc = jobs_fail(err, ERR_INVALID_ARG, "invalid_status", NULL,
                       "Batch %s is %s; only a validating or in_progress batch can be cancelled.", id,
                       jobs_status_name(old));
    if (!rc)
        *out = jobs_batch_json(&rec);
    jobs_batch_rec_deinit(&rec);
    return rc;
}

int jobs_store_stats(struct jobs_store *s, struct jobs_stats *out, struct jobs_err *err)
{
    jobs_err_clear(err);
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->stats(s->b, out, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- lines ---- */

static int jobs_batch_fail_locked(struct jobs_store *s, const char *id, const char *code, const char *message,
                                  struct jobs_err *err);

int jobs_lines_claim(struct jobs_store *s, struct jobs_line *out, int max, int *n, struct jobs_err *err)
{
    jobs_err_clear(err);
    *n = 0;
    pthread_mutex_lock(&s->mu);
    if (max > 0)
        out[0].batch_id[0] = 0;
    int rc = s->b->ops->lines_claim(s->b, out, max, n, jobs_err_buf(err));
    if (rc == ERR_NO_SPACE && max > 0 && out[0].batch_id[0]) {
        /* the batch cannot go on: the same end as when its results do not fit (jobs_lines_commit) */
        char msg[ERR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "Claiming the next lines failed: %.300s. The batch was stopped so that nothing is half-written. Free "
                 "space and submit the batch again.",
                 err ? err->message : "no space left");
        struct jobs_err ferr;
        jobs_batch_fail_locked(s, out[0].batch_id, "disk_full", msg, &ferr);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

char *jobs_result_text(const struct jobs_line *line, int status_code, const char *request_id, const char *body_json,
                       const char *error_code, const char *error_message, bool *is_error)
{
    if (status_code <= 0) {
        *is_error = true;
        return jobs_result_error_text(line->batch_id, line->idx, line->custom_id,
                                      error_code ? error_code : "internal_error",
                                      error_message ? error_message : "The request failed without a response.");
    }
    json_t *body = body_json ? json_loads(body_json, JSON_DECODE_ANY, NULL) : json_null();
    if (!body)
        return NULL;
    char rid[JOBS_ID_MAX];
    if (!request_id || !*request_id) {
        jobs_id_make(rid, sizeof rid, "req_");
        request_id = rid;
    }
    char id[64];
    jobs_request_line_id(id, sizeof id, line->batch_id, line->idx);
    json_t *j = json_pack("{sssss{sisssO}sn}", "id", id, "custom_id", line->custom_id, "response", "status_code",
                          status_code, "request_id", request_id, "body", body, "error");
    json_decref(body);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    *is_error = status_code < 200 || status_code >= 300;
    return text;
}

/* Fails a batch that cannot go on (disk full), whatever non-final status it is in. Caller holds the mutex. */
static int jobs_batch_fail_locked(struct jobs_store *s, const char *id, const char *code, const char *message,
                                  struct jobs_err *err)
{
    bool applied;
    unsigned live = JOBS_STATUS_BIT(JOBS_VALIDATING) | JOBS_STATUS_BIT(JOBS_IN_PROGRESS) |
                    JOBS_STATUS_BIT(JOBS_CANCELLING) | JOBS_STATUS_BIT(JOBS_FINALIZING);
    int rc = s->b->ops->batch_transition(s->b, id, live, JOBS_FAILED, JOBS_FAILED, jobs_now(), code, message,
                                         &applied, NULL, jobs_err_buf(err));
    if (!rc && applied)
        log_error("jobs: batch %s failed: %s", id, message);
    else if (rc)
        log_error("jobs: batch %s should fail (%s) but the store refused: %s", id, code, err ? err->message : "");
    return rc;
}

int jobs_lines_commit(struct jobs_store *s, const struct jobs_result *res, int n, struct jobs_err *err)
{
    jobs_err_clear(err);
    if (n <= 0)
        return 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->lines_commit(s->b, res, n, jobs_err_buf(err));
    if (rc == ERR_NO_SPACE) {
        char msg[ERR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "Saving a result failed: %.300s. The batch was stopped so that nothing is half-written. Free space "
                 "and submit the batch again.",
                 err ? err->message : "no space left");
        for (int i = 0; i < n; i++) {
            bool seen = false;
            for (int k = 0; k < i && !seen; k++)
                seen = !strcmp(res[k].line->batch_id, res[i].line->batch_id);
            struct jobs_err ferr;
            if (!seen)
                jobs_batch_fail_locked(s, res[i].line->batch_id, "disk_full", msg, &ferr);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int jobs_lines_renew(struct jobs_store *s, const struct jobs_line *lines, int n, bool *lost, struct jobs_err *err)
{
    jobs_err_clear(err);
    if (n <= 0)
        return 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->lines_renew(s->b, lines, n, lost, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int jobs_lines_release(struct jobs_store *s, const struct jobs_line *lines, int n, struct jobs_err *err)
{
    jobs_err_clear(err);
    if (n <= 0)
        return 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->lines_release(s->b, lines, n, jobs_err_buf(err));
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- finalization ---- */

struct jobs_out {
    struct jobs_store *s;
    const char *batch_id;
    void *w[2];            /* writers of the output (0) and error (1) files, opened at their first line */
    char id[2][JOBS_ID_MAX];
    int64_t bytes[2], lines[2];
    char *buf[2];
    size_t len[2];
    char *err;
};

static int jobs_out_flush(struct jobs_out *o, int k)
{
    if (!o->len[k])
        return 0;
    int rc = o->s->b->ops->file_write(o->s->b, o->w[k], o->buf[k], o->len[k], o->err);
    o->len[k] = 0;
    return rc;
}

static int jobs_out_line(void *ctx, int64_t idx, const char *text, size_t len, bool is_error)
{
    struct jobs_out *o = ctx;
    int k = is_error ? 1 : 0;
    if (!o->w[k]) {
        jobs_id_make(o->id[k], sizeof o->id[k], "file-");
        int rc = o->s->b->ops->file_write_begin(o->s->b, o->id[k], &o->w[k], o->err);
        if (rc)
            return rc;
        if (!(o->buf[k] = malloc(JOBS_OUT_BUF)))
            return err_set(o->err, ERR_NOMEM, "out of memory assembling the output of batch %s", o->batch_id);
    }
    if (o->len[k] + len + 1 > JOBS_OUT_BUF) {
        int rc = jobs_out_flush(o, k);
        if (rc)
            return rc;
    }
    if (len + 1 > JOBS_OUT_BUF) {
        int rc = o->s->b->ops->file_write(o->s->b, o->w[k], text, len, o->err);
        if (!rc)
            rc = o->s->b->ops->file_write(o->s->b, o->w[k], "\n", 1, o->err);
        if (rc)
            return rc;
    } else {
        memcpy(o->buf[k] + o->len[k], text, len);
        o->buf[k][o->len[k] + len] = '\n';
        o->len[k] += len + 1;
    }
    o->bytes[k] += (int64_t)len + 1;
    o->lines[k]++;
    return 0;
}

/* Finalizes one batch into `target`. Caller holds the mutex. */
static int jobs_finalize_locked(struct jobs_store *s, const struct jobs_batch_rec *b0, enum jobs_status target,
                                int *changed, struct jobs_err *err)
{
    struct jobs_backend *b = s->b;
    char *eb = jobs_err_buf(err);
    int64_t now = jobs_now();
    if (b0->status != JOBS_FINALIZING) {
        bool applied = false;
        unsigned from = JOBS_STATUS_BIT(JOBS_VALIDATING) | JOBS_STATUS_BIT(JOBS_IN_PROGRESS) |
                        JOBS_STATUS_BIT(JOBS_CANCELLING);
        int rc = b->ops->batch_transition(b, b0->id, from, JOBS_FINALIZING, target, now, NULL, NULL, &applied, NULL,
                                          eb);
        if (rc || !applied)
            return rc;
    }
    bool owner = false;
    int rc = b->ops->finalize_lock(b, b0->id, &owner, eb);
    if (rc || !owner)
        return rc;
    struct jobs_batch_rec rec = {0};
    rc = b->ops->batch_get(b, b0->id, &rec, eb);
    if (rc)
        return rc;
    if (rec.status != JOBS_FINALIZING) { /* another worker finished it meanwhile */
        jobs_batch_rec_deinit(&rec);
        return 0;
    }
    target = rec.final_status;
    if (target == JOBS_EXPIRED)
        rc = b->ops->results_fill(b, &rec, "batch_expired",
                                  "This request could not be executed before the completion window expired.", eb);
    else if (target == JOBS_CANCELLED)
        rc = b->ops->results_fill(b, &rec, "batch_cancelled",
                                  "This request was not executed because the batch was cancelled.", eb);
    else if (rec.completed + rec.failed < rec.total) /* completed with lines missing: a bug, but lose none */
        rc = b->ops->results_fill(b, &rec, "internal_error", "The request was lost by the job store.", eb);
    struct jobs_out o = {.s = s, .batch_id = rec.id, .err = eb};
    if (!rc)
        rc = b->ops->results_scan(b, &rec, jobs_out_line, &o, eb);
    for (int k = 0; k < 2; k++)
        if (o.w[k]) {
            if (!rc)
                rc = jobs_out_flush(&o, k);
            int rc2 = b->ops->file_write_end(b, o.w[k], rc == 0, rc ? NULL : eb);
            if (!rc)
                rc = rc2;
            if (rc)
                b->ops->file_discard(b, o.id[k]);
        }
    struct jobs_file_rec f[2] = {0};
    for (int k = 0; k < 2; k++) {
        free(o.buf[k]);
        snprintf(f[k].id, sizeof f[k].id, "%s", o.id[k]);
        f[k].bytes = o.bytes[k];
        f[k].created_at = now;
        snprintf(f[k].filename, sizeof f[k].filename, "%s_%s.jsonl", rec.id, k ? "error" : "output");
        snprintf(f[k].purpose, sizeof f[k].purpose, "batch_output");
    }
    if (!rc) {
        bool applied = false;
        rc = b->ops->batch_end(b, rec.id, target, o.w[0] ? &f[0] : NULL, o.w[1] ? &f[1] : NULL, jobs_now(), &applied,
                               eb);
        if (rc || !applied)
            for (int k = 0; k < 2; k++)
                if (o.w[k])
                    b->ops->file_discard(b, o.id[k]);
        if (!rc && applied) {
            if (changed)
                (*changed)++;
            log_info("jobs: batch %s %s: %lld lines, %lld in the output file, %lld in the error file", rec.id,
                     jobs_status_name(target), (long long)rec.total, (long long)o.lines[0], (long long)o.lines[1]);
        }
    } else if (rc == ERR_NO_SPACE) {
        char msg[ERR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "Writing the output file failed: %.300s. The batch was stopped so that nothing is half-written. "
                 "Free space and submit the batch again.",
                 eb ? eb : "no space left");
        struct jobs_err ferr;
        jobs_batch_fail_locked(s, rec.id, "disk_full", msg, &ferr);
    }
    jobs_batch_rec_deinit(&rec);
    return rc;
}

int jobs_store_tick(struct jobs_store *s, int *changed, struct jobs_err *err)
{
    jobs_err_clear(err);
    if (changed)
        *changed = 0;
    struct jobs_batch_rec *act = NULL;
    int n = 0;
    pthread_mutex_lock(&s->mu);
    int rc = s->b->ops->batch_active(s->b, &act, &n, jobs_err_buf(err));
    int64_t now = jobs_now();
    for (int i = 0; !rc && i < n; i++) {
        const struct jobs_batch_rec *b = &act[i];
        enum jobs_status target = JOBS_STATUS_COUNT;
        if (b->status == JOBS_FINALIZING) {
            target = b->final_status;
        } else if (b->status == JOBS_CANCELLING) {
            int64_t inflight = 0;
            rc = s->b->ops->batch_inflight(s->b, b->id, &inflight, jobs_err_buf(err));
            if (!rc && inflight == 0)
                target = JOBS_CANCELLED;
        } else if (b->completed + b->failed >= b->total) {
            target = JOBS_COMPLETED;
        } else if (now >= b->expires_at) {
            target = JOBS_EXPIRED;
        }
        if (!rc && target != JOBS_STATUS_COUNT) {
            rc = jobs_finalize_locked(s, b, target, changed, err);
            if (rc == ERR_NO_SPACE) /* that batch failed; the others may still finish */
                rc = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    jobs_batch_rec_free_array(act, n);
    return rc;
}
