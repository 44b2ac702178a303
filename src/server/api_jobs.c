/*
 * api_jobs: the Batch API in `wafer serve` (docs/jobs.md): the routes /v1/files and /v1/batches answered
 * from the job store (src/jobs), and the bridge that runs batch lines in the engine next to live traffic.
 *
 * Bridge: the runner's thread calls exec for each claimed line; exec copies the line into a queue under a
 * mutex and wakes the I/O thread, which (api_jobs_pump, from on_wake) begins a call for it
 * (api_call_begin_line): a worker prepares the same request the live endpoint would from the line's body
 * (api_completions), and the I/O thread submits it at batch priority (SCHED_PRIORITY_BATCH: admitted after
 * live requests, preempted for them). The answer (the JSON body the live endpoint would send, or its error)
 * comes back through srv->line_answer and is reported with runner_line_done. The runner's cancel (shutdown,
 * lease lost) puts the ticket in a set and wakes the I/O thread, which cancels the line's scheduler requests
 * (once its preparation is done); a cancelled line, or one the server stopped before it answered, is
 * reported RUNNER_PREEMPTED: nothing is recorded and the line runs again later.
 *
 * Batch lines never end with the server's "busy" answers: the scheduler queues batch requests outside
 * max_queue (they wait for capacity below live traffic, and never take a live request's place in the
 * queue), and a line refused anyway (503: the in-flight answer budget is spent, or the server drains) is
 * given back to the runner, which starts it again LINE_RETRY_MS later instead of recording the refusal.
 */
#include "core/err.h"
#include "core/log.h"
#include "core/multipart.h"
#include "jobs/jobs.h"
#include "jobs/runner.h"
#include "server/api.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UPLOAD_SLACK (64u << 10) /* multipart framing and the purpose field around the file */
#define LINE_RETRY_MS 250        /* a line the server was too busy to take runs again after this */

struct pending_line {
    uint64_t ticket;
    bool chat;
    char *body;
    size_t body_len;
    struct pending_line *next;
};

struct api_jobs {
    struct server *srv;
    struct jobs_store *store;
    struct runner *runner;
    pthread_mutex_t mu; /* guards the fields below */
    struct pending_line *head, *tail; /* handed over by exec, not yet started */
    uint64_t *cancels;                /* tickets the runner asked to stop */
    int n_cancels, cap_cancels;
};

/* ---------------------------------------------------------------- bridge */

static bool cancel_take_locked(struct api_jobs *j, uint64_t ticket)
{
    for (int i = 0; i < j->n_cancels; i++)
        if (j->cancels[i] == ticket) {
            j->cancels[i] = j->cancels[--j->n_cancels];
            return true;
        }
    return false;
}

/* Runner thread: queue the line for the I/O thread. */
static void jobs_exec(void *ctx, const struct runner_line *line)
{
    struct api_jobs *j = ctx;
    struct pending_line *p = calloc(1, sizeof *p);
    if (p) {
        p->body_len = strlen(line->body);
        p->body = malloc(p->body_len + 1);
    }
    if (!p || !p->body) {
        if (p)
            free(p);
        struct runner_result res = {.outcome = RUNNER_PREEMPTED};
        runner_line_done(j->runner, line->ticket, &res);
        return;
    }
    memcpy(p->body, line->body, p->body_len + 1);
    p->ticket = line->ticket;
    p->chat = !strcmp(line->endpoint, "/v1/chat/completions");
    pthread_mutex_lock(&j->mu);
    if (j->tail)
        j->tail->next = p;
    else
        j->head = p;
    j->tail = p;
    pthread_mutex_unlock(&j->mu);
    http_server_wake(j->srv->http);
}

/* Runner thread: ask the I/O thread to stop a line. */
static void jobs_cancel(void *ctx, uint64_t ticket)
{
    struct api_jobs *j = ctx;
    pthread_mutex_lock(&j->mu);
    if (j->n_cancels == j->cap_cancels) {
        int cap = j->cap_cancels ? j->cap_cancels * 2 : 16;
        uint64_t *c = realloc(j->cancels, (size_t)cap * sizeof *c);
        if (c) {
            j->cancels = c;
            j->cap_cancels = cap;
        }
    }
    if (j->n_cancels < j->cap_cancels)
        j->cancels[j->n_cancels++] = ticket;
    pthread_mutex_unlock(&j->mu);
    http_server_wake(j->srv->http);
}

/* I/O thread: a batch line's answer. status 0: stopped before answering. */
static void jobs_line_answer(struct server *srv, uint64_t ticket, int status, const char *body, const char *request_id)
{
    struct api_jobs *j = srv->jobs;
    if (!j || !j->runner)
        return; /* runner_destroy returned: every line it started is done */
    pthread_mutex_lock(&j->mu);
    bool cancelled = cancel_take_locked(j, ticket);
    pthread_mutex_unlock(&j->mu);
    struct runner_result res = {.outcome = RUNNER_RESPONSE, .status_code = status, .body = body,
                                .request_id = request_id};
    if (cancelled || status == 0)
        res = (struct runner_result){.outcome = RUNNER_PREEMPTED};
    else if (status == 429 || status == 503) /* busy (in-flight answer budget, draining): wait, then again */
        res = (struct runner_result){.outcome = RUNNER_PREEMPTED, .retry_after_ms = LINE_RETRY_MS};
    runner_line_done(j->runner, ticket, &res);
}

void api_jobs_pump(struct server *srv)
{
    struct api_jobs *j = srv->jobs;
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    struct pending_line *p = j->head;
    j->head = j->tail = NULL;
    bool any_cancel = j->n_cancels > 0;
    pthread_mutex_unlock(&j->mu);
    while (p) {
        struct pending_line *next = p->next;
        pthread_mutex_lock(&j->mu);
        bool cancelled = cancel_take_locked(j, p->ticket);
        pthread_mutex_unlock(&j->mu);
        if (cancelled || atomic_load(&srv->state) != SERVER_READY) {
            struct runner_result res = {.outcome = RUNNER_PREEMPTED};
            runner_line_done(j->runner, p->ticket, &res);
        } else {
            /* prepared on a worker like a live request; the call takes the body */
            api_call_begin_line(srv, p->ticket, p->body, p->body_len, p->chat ? ROUTE_CHAT : ROUTE_COMPLETIONS,
                                api_completions);
            p->body = NULL;
        }
        free(p->body);
        free(p);
        p = next;
    }
    if (!any_cancel)
        return;
    for (struct api_call *call = srv->calls; call; call = call->next) {
        if (!call->batch || call->busy)
            continue; /* a worker preparing the line owns its requests: the cancel waits for the next wake */
        pthread_mutex_lock(&j->mu);
        bool hit = false;
        for (int i = 0; i < j->n_cancels && !hit; i++)
            hit = j->cancels[i] == call->ticket;
        pthread_mutex_unlock(&j->mu);
        for (int i = 0; hit && i < call->n_reqs; i++)
            if (call->reqs[i])
                scheduler_cancel(srv->sched, call->reqs[i], ERR_CANCELLED);
    }
}

/* ---------------------------------------------------------------- lifetime */

int api_jobs_start(struct server *srv)
{
    const struct server_config *cfg = srv->cfg;
    struct api_jobs *j = calloc(1, sizeof *j);
    if (!j) {
        log_error("out of memory");
        return 1;
    }
    j->srv = srv;
    pthread_mutex_init(&j->mu, NULL);
    char dir[PATH_MAX];
    if (cfg->jobs_data_dir)
        snprintf(dir, sizeof dir, "%s", cfg->jobs_data_dir);
    else
        jobs_default_data_dir(dir, sizeof dir);
    struct jobs_config jc = {.data_dir = dir,
                             .queue = cfg->jobs_queue,
                             .max_file_bytes = (uint64_t)cfg->jobs_max_file_bytes,
                             .max_lines = cfg->jobs_max_lines,
                             .lease_ms = (int)(cfg->jobs_lease * 1000)};
    struct jobs_err e;
    j->store = jobs_store_open(&jc, &e);
    if (!j->store) {
        log_error("batch jobs: %s", e.message);
        pthread_mutex_destroy(&j->mu);
        free(j);
        return 1;
    }
    srv->jobs = j;
    srv->line_answer = jobs_line_answer;
    /* Default: twice the slots. The lines beyond the slots wait in the scheduler (below every live request),
     * prepared, so a slot a line leaves is taken at the next step instead of after the result's commit, the
     * next claim and the next line's preparation (measured: 0.53x of `wafer bench serve`'s throughput with
     * one line per slot, 0.93x with two; docs/jobs.md). */
    int inflight = cfg->jobs_max_inflight < 0 ? 2 * cfg->max_batch_size : cfg->jobs_max_inflight;
    if (inflight > 0) {
        struct runner_config rc = {
            .max_inflight = inflight, .exec = jobs_exec, .cancel = jobs_cancel, .ctx = j, .handle = &j->runner};
        char err[ERR_MSG_MAX];
        if (!runner_create(j->store, &rc, err)) {
            log_error("batch jobs: cannot start the runner: %s", err);
            api_jobs_stop(srv);
            return 1;
        }
    }
    log_info("batch jobs: %s (%d lines at once%s)", jobs_store_where(j->store), inflight,
             inflight ? "" : ": this process only answers the API");
    return 0;
}

void api_jobs_stop(struct server *srv)
{
    struct api_jobs *j = srv->jobs;
    if (!j)
        return;
    runner_destroy(j->runner); /* cancels its lines through the I/O thread, which must still run */
    j->runner = NULL;
    pthread_mutex_lock(&j->mu);
    struct pending_line *p = j->head;
    j->head = j->tail = NULL;
    pthread_mutex_unlock(&j->mu);
    while (p) {
        struct pending_line *next = p->next;
        free(p->body);
        free(p);
        p = next;
    }
    /* the I/O thread may still look at srv->jobs: keep the struct, drop the store only at exit */
}

void api_jobs_close(struct server *srv)
{
    struct api_jobs *j = srv->jobs;
    if (!j)
        return;
    api_jobs_stop(srv);
    jobs_store_close(j->store);
    free(j->cancels);
    pthread_mutex_destroy(&j->mu);
    free(j);
    srv->jobs = NULL;
}

/* ---------------------------------------------------------------- routes */

static bool path_prefix(const struct http_request *req, const char *p)
{
    size_t n = strlen(p);
    return req->path_len >= n && !memcmp(req->path, p, n) && (req->path_len == n || req->path[n] == '/');
}

bool api_jobs_path(const struct http_request *req)
{
    return path_prefix(req, "/v1/files") || path_prefix(req, "/v1/batches");
}

size_t api_jobs_body_limit(struct server *srv, const struct http_request *req)
{
    if (req->path_len == 9 && !memcmp(req->path, "/v1/files", 9) && req->method_len == 4 &&
        !memcmp(req->method, "POST", 4))
        return (size_t)srv->cfg->jobs_max_file_bytes + UPLOAD_SLACK;
    return 0;
}

static bool method_is(const struct http_request *req, const char *m)
{
    return req->method_len == strlen(m) && !memcmp(req->method, m, req->method_len);
}

static void respond_jobs_err(struct server *srv, struct http_conn *c, enum api_route route, int rc,
                             const struct jobs_err *e)
{
    int status = rc == ERR_NOT_FOUND ? 404 : err_http_status(rc);
    api_respond_error(srv, c, route, status, rc, e->param, e->code, NULL, "%s", e->message);
}

static void respond_result(struct server *srv, struct http_conn *c, enum api_route route, int rc, json_t *out,
                           const struct jobs_err *e)
{
    if (rc)
        respond_jobs_err(srv, c, route, rc, e);
    else
        api_respond_json(srv, c, route, 200, out);
}

/* Query parameter name's value into buf (not decoded: ids and numbers need none); false when absent. */
static bool query_get(const struct http_request *req, const char *name, char *buf, size_t cap)
{
    if (!req->query)
        return false;
    size_t nl = strlen(name);
    const char *q = req->query, *end = req->query + req->query_len;
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *e = amp ? amp : end;
        if ((size_t)(e - q) > nl && !memcmp(q, name, nl) && q[nl] == '=') {
            size_t vl = (size_t)(e - q) - nl - 1;
            if (vl >= cap)
                vl = cap - 1;
            memcpy(buf, q + nl + 1, vl);
            buf[vl] = 0;
            return true;
        }
        q = e + 1;
    }
    return false;
}

/* limit from the query: 0 when absent; -1 when not a number in [1, max]. */
static int query_limit(const struct http_request *req, int max)
{
    char buf[32];
    if (!query_get(req, "limit", buf, sizeof buf))
        return 0;
    char *end;
    long v = strtol(buf, &end, 10);
    return *end || v < 1 || v > max ? -1 : (int)v;
}

static void files_upload(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    const struct http_header *ct = http_request_header(req, "content-type");
    char boundary[MULTIPART_BOUNDARY_MAX + 1], err[ERR_MSG_MAX];
    int rc = ct ? multipart_boundary(ct->value, ct->value_len, boundary, err) : ERR_MEDIA_TYPE;
    if (rc) {
        api_respond_error(srv, c, ROUTE_FILES, rc == ERR_MEDIA_TYPE ? 415 : 400, rc, NULL, NULL, NULL,
                          "POST /v1/files takes multipart/form-data with the fields 'purpose' and 'file': %s",
                          ct ? err : "no Content-Type");
        return;
    }
    struct multipart_part parts[8];
    int n;
    if (multipart_parse(req->body, req->body_len, boundary, parts, 8, &n, err)) {
        api_respond_error(srv, c, ROUTE_FILES, 400, ERR_FORMAT, NULL, NULL, NULL, "%s", err);
        return;
    }
    const struct multipart_part *purpose = multipart_find(parts, n, "purpose");
    const struct multipart_part *file = multipart_find(parts, n, "file");
    if (!purpose || !file) {
        api_respond_error(srv, c, ROUTE_FILES, 400, ERR_INVALID_ARG, purpose ? "file" : "purpose", NULL, NULL,
                          "Missing required parameter: '%s'", purpose ? "file" : "purpose");
        return;
    }
    char purpose_s[64], name[256];
    snprintf(purpose_s, sizeof purpose_s, "%.*s", (int)(purpose->len < 63 ? purpose->len : 63), purpose->data);
    if (file->filename)
        snprintf(name, sizeof name, "%.*s", (int)(file->filename_len < 255 ? file->filename_len : 255),
                 file->filename);
    json_t *out = NULL;
    struct jobs_err e;
    rc = jobs_file_create(srv->jobs->store, file->filename ? name : NULL, purpose_s, file->data, file->len, &out,
                          &e);
    respond_result(srv, c, ROUTE_FILES, rc, out, &e);
}

static void files_route(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    struct jobs_store *st = srv->jobs->store;
    struct jobs_err e;
    json_t *out = NULL;
    const char *rest = req->path + 9; /* after /v1/files */
    size_t rl = req->path_len - 9;
    if (rl == 0) {
        if (method_is(req, "POST")) {
            files_upload(srv, c, req);
            return;
        }
        if (method_is(req, "GET")) {
            int limit = query_limit(req, 10000);
            char after[JOBS_ID_MAX], purpose[64];
            if (limit < 0) {
                api_respond_error(srv, c, ROUTE_FILES, 400, ERR_INVALID_ARG, "limit", NULL, NULL,
                                  "'limit' must be an integer from 1 to 10000");
                return;
            }
            bool has_after = query_get(req, "after", after, sizeof after);
            bool has_purpose = query_get(req, "purpose", purpose, sizeof purpose);
            int rc = jobs_file_list(st, has_purpose ? purpose : NULL, limit, has_after ? after : NULL, &out, &e);
            respond_result(srv, c, ROUTE_FILES, rc, out, &e);
            return;
        }
        goto bad_method;
    }
    char id[JOBS_ID_MAX];
    const char *slash = memchr(rest + 1, '/', rl - 1);
    size_t idl = slash ? (size_t)(slash - rest - 1) : rl - 1;
    bool content = slash && (size_t)(req->path + req->path_len - slash) == 8 && !memcmp(slash, "/content", 8);
    if (idl == 0 || idl >= sizeof id || (slash && !content)) {
        api_respond_error(srv, c, ROUTE_FILES, 404, ERR_NOT_FOUND, NULL, "not_found", NULL,
                          "Unknown route %.*s", (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
        return;
    }
    memcpy(id, rest + 1, idl);
    id[idl] = 0;
    if (content && method_is(req, "GET")) {
        char *data = NULL;
        size_t len = 0;
        int rc = jobs_file_content(st, id, &data, &len, &e);
        if (rc) {
            respond_jobs_err(srv, c, ROUTE_FILES, rc, &e);
            return;
        }
        http_respond(c, 200, "application/octet-stream", api_cors_headers(), data, len);
        metrics_request(srv->metrics, api_route_name(ROUTE_FILES), 200);
        free(data);
        return;
    }
    if (!content && method_is(req, "GET")) {
        int rc = jobs_file_get(st, id, &out, &e);
        respond_result(srv, c, ROUTE_FILES, rc, out, &e);
        return;
    }
    if (!content && method_is(req, "DELETE")) {
        int rc = jobs_file_delete(st, id, &out, &e);
        respond_result(srv, c, ROUTE_FILES, rc, out, &e);
        return;
    }
bad_method:
    api_respond_error(srv, c, ROUTE_FILES, 405, ERR_METHOD, NULL, "method_not_allowed", NULL,
                      "Method %.*s is not allowed on %.*s", (int)req->method_len, req->method,
                      (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
}

static void batches_route(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    struct jobs_store *st = srv->jobs->store;
    struct jobs_err e;
    json_t *out = NULL;
    const char *rest = req->path + 11; /* after /v1/batches */
    size_t rl = req->path_len - 11;
    if (rl == 0) {
        if (method_is(req, "POST")) {
            json_error_t je;
            json_t *body = json_loadb(req->body, req->body_len, 0, &je);
            if (!body || !json_is_object(body)) {
                json_decref(body);
                api_respond_error(srv, c, ROUTE_BATCHES, 400, ERR_FORMAT, NULL, "invalid_json", NULL,
                                  "The body must be a JSON object: %s", body ? "it is not an object" : je.text);
                return;
            }
            int rc = jobs_batch_create(st, body, &out, &e);
            json_decref(body);
            respond_result(srv, c, ROUTE_BATCHES, rc, out, &e);
            if (!rc && srv->jobs->runner)
                runner_wake(srv->jobs->runner);
            return;
        }
        if (method_is(req, "GET")) {
            int limit = query_limit(req, 100);
            char after[JOBS_ID_MAX];
            if (limit < 0) {
                api_respond_error(srv, c, ROUTE_BATCHES, 400, ERR_INVALID_ARG, "limit", NULL, NULL,
                                  "'limit' must be an integer from 1 to 100");
                return;
            }
            bool has_after = query_get(req, "after", after, sizeof after);
            int rc = jobs_batch_list(st, limit, has_after ? after : NULL, &out, &e);
            respond_result(srv, c, ROUTE_BATCHES, rc, out, &e);
            return;
        }
        goto bad_method;
    }
    char id[JOBS_ID_MAX];
    const char *slash = memchr(rest + 1, '/', rl - 1);
    size_t idl = slash ? (size_t)(slash - rest - 1) : rl - 1;
    bool cancel = slash && (size_t)(req->path + req->path_len - slash) == 7 && !memcmp(slash, "/cancel", 7);
    if (idl == 0 || idl >= sizeof id || (slash && !cancel)) {
        api_respond_error(srv, c, ROUTE_BATCHES, 404, ERR_NOT_FOUND, NULL, "not_found", NULL,
                          "Unknown route %.*s", (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
        return;
    }
    memcpy(id, rest + 1, idl);
    id[idl] = 0;
    if (cancel && method_is(req, "POST")) {
        int rc = jobs_batch_cancel(st, id, &out, &e);
        respond_result(srv, c, ROUTE_BATCHES, rc, out, &e);
        return;
    }
    if (!cancel && method_is(req, "GET")) {
        int rc = jobs_batch_get(st, id, &out, &e);
        respond_result(srv, c, ROUTE_BATCHES, rc, out, &e);
        return;
    }
bad_method:
    api_respond_error(srv, c, ROUTE_BATCHES, 405, ERR_METHOD, NULL, "method_not_allowed", NULL,
                      "Method %.*s is not allowed on %.*s", (int)req->method_len, req->method,
                      (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
}

void api_jobs_handle(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    enum api_route route = path_prefix(req, "/v1/files") ? ROUTE_FILES : ROUTE_BATCHES;
    if (!srv->jobs) {
        api_respond_error(srv, c, route, 503, ERR_UNAVAILABLE, NULL, NULL, "Retry-After: 5\r\n",
                          "batch jobs are not available yet; retry shortly");
        return;
    }
    if (route == ROUTE_FILES)
        files_route(srv, c, req);
    else
        batches_route(srv, c, req);
}

/* ---------------------------------------------------------------- metrics */

json_t *api_jobs_progress(struct server *srv)
{
    struct api_jobs *j = srv->jobs;
    if (!j)
        return NULL;
    struct jobs_stats js;
    struct jobs_err e;
    if (jobs_store_stats(j->store, &js, &e))
        return NULL;
    json_t *out = json_object(), *counts = json_object(), *running = json_array();
    for (int s = 0; s < JOBS_STATUS_COUNT; s++)
        json_object_set_new(counts, jobs_status_name((enum jobs_status)s), json_integer((json_int_t)js.batches[s]));
    json_object_set_new(out, "batches", counts);
    json_object_set_new(out, "queue_lines", json_integer((json_int_t)js.queue_lines));
    json_t *list = NULL;
    if (!jobs_batch_list(j->store, 50, NULL, &list, &e)) {
        size_t i;
        json_t *b;
        json_array_foreach(json_object_get(list, "data"), i, b)
        {
            const char *st = json_string_value(json_object_get(b, "status"));
            if (!st || (strcmp(st, "validating") && strcmp(st, "in_progress") && strcmp(st, "finalizing") &&
                        strcmp(st, "cancelling")))
                continue;
            json_t *rc = json_object_get(b, "request_counts");
            json_array_append_new(running, json_pack("{sOsOsOsOsOsO}", "id", json_object_get(b, "id"), "status",
                                                     json_object_get(b, "status"), "total", json_object_get(rc, "total"),
                                                     "completed", json_object_get(rc, "completed"), "failed",
                                                     json_object_get(rc, "failed"), "created_at",
                                                     json_object_get(b, "created_at")));
        }
        json_decref(list);
    }
    json_object_set_new(out, "in_progress", running);
    return out;
}

char *api_jobs_metrics_text(struct server *srv)
{
    struct api_jobs *j = srv->jobs;
    if (!j)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
#define OUT(...) (len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, __VA_ARGS__))
    struct jobs_stats js;
    struct jobs_err e;
    if (!jobs_store_stats(j->store, &js, &e)) {
        OUT("# HELP wafer_batches Batch jobs in each status (all processes sharing the store).\n"
            "# TYPE wafer_batches gauge\n");
        for (int s = 0; s < JOBS_STATUS_COUNT; s++)
            OUT("wafer_batches{status=\"%s\"} %lld\n", jobs_status_name((enum jobs_status)s),
                (long long)js.batches[s]);
        OUT("# HELP wafer_batch_queue_lines Lines of running batches no worker holds.\n"
            "# TYPE wafer_batch_queue_lines gauge\nwafer_batch_queue_lines %lld\n",
            (long long)js.queue_lines);
    }
    if (j->runner) {
        struct runner_stats rs;
        runner_stats_get(j->runner, &rs);
        OUT("# HELP wafer_batch_lines_total Batch lines this process ran, by outcome.\n"
            "# TYPE wafer_batch_lines_total counter\n"
            "wafer_batch_lines_total{outcome=\"completed\"} %llu\n"
            "wafer_batch_lines_total{outcome=\"failed\"} %llu\n"
            "wafer_batch_lines_total{outcome=\"preempted\"} %llu\n"
            "wafer_batch_lines_total{outcome=\"reclaimed\"} %llu\n",
            (unsigned long long)rs.completed, (unsigned long long)rs.failed,
            (unsigned long long)(rs.preempted + atomic_load(&srv->line_preemptions)),
            (unsigned long long)rs.reclaimed);
    }
#undef OUT
    if (len >= cap)
        len = cap - 1; /* truncated: fits easily in practice (about 1 KB) */
    buf[len] = 0;
    return buf;
}
