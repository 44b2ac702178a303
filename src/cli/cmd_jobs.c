/*
 * cmd_jobs: `wafer jobs`, a client of OpenAI's Batch API (POST/GET /v1/files, /v1/batches), so it works against
 * any server that has it, wafer or not. submit uploads a JSONL file (multipart/form-data, purpose=batch) and
 * creates the batch, and with --wait follows it with a progress bar on stderr (lines done of total, rate,
 * ETA); list, status, results and cancel do what they say. Machine-readable output goes to stdout (the batch
 * id from submit, the output file from results), everything for people to stderr.
 *
 * Exit status: 0 done (submit --wait: the batch completed), 1 a failure (the server's message is printed), 2 a
 * usage error.
 */
#include "cli/cli.h"

#include "core/clock.h"
#include "core/flags.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JC_DEFAULT_URL "http://127.0.0.1:8080"

struct jc_opts {
    char url[1024];     /* base URL without a trailing slash or /v1 */
    const char *api_key;
    const char *endpoint;
    const char *window;
    const char *output;
    const char *ids[2]; /* positional arguments */
    int n_ids;
    long limit;
    double interval;
    bool wait, errors, json;
    json_t *metadata;
};

struct jc_buf {
    char *p;
    size_t n, cap;
};

static void jc_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs <command> [options]\n\n"
               "Batch jobs through OpenAI's Batch API (/v1/files, /v1/batches) of a wafer server, or any server\n"
               "that has it.\n\n"
               "  submit FILE.jsonl [--wait]   upload the requests and start a batch; prints its id\n"
               "  list                         the latest batches\n"
               "  status ID                    where a batch is\n"
               "  results ID [-o FILE]         the output file of a finished batch (--errors: the error file)\n"
               "  cancel ID                    stop a batch; lines in flight finish\n\n"
               "common options:\n"
               "  --url URL        the server (default $WAFER_URL, else " JC_DEFAULT_URL ")\n"
               "  --api-key KEY    sent as 'Authorization: Bearer KEY' (default $WAFER_API_KEY, else\n"
               "                   $OPENAI_API_KEY)\n"
               "  -h, --help       help (also after a command)\n\n"
               "A line of FILE.jsonl is one request: {\"custom_id\": \"r1\", \"method\": \"POST\", \"url\":\n"
               "\"/v1/chat/completions\", \"body\": {...}}. docs/jobs.md has the details.\n");
}

static void jc_submit_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs submit FILE.jsonl [--url URL] [--endpoint E] [--window W] [--metadata K=V]...\n"
               "                         [--wait [--interval S]]\n\n"
               "Uploads FILE.jsonl (purpose \"batch\") and creates a batch from it; prints the batch id on stdout.\n\n"
               "  --endpoint E     /v1/chat/completions or /v1/completions (default: the url of the file's first\n"
               "                   request)\n"
               "  --window W       completion window (default 24h); lines not done by then expire\n"
               "  --metadata K=V   a metadata pair (up to 16)\n"
               "  --wait           follow the batch until it ends, with a progress bar on stderr (lines done of\n"
               "                   total, rate, ETA); exit 0 only if it completed\n"
               "  --interval S     seconds between two looks with --wait (default 1)\n"
               "  --url, --api-key as for every command (wafer jobs --help)\n");
}

static void jc_list_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs list [--limit N] [--json] [--url URL]\n\n"
               "The latest batches, newest first: id, status, lines done of total, created.\n\n"
               "  --limit N   how many (1..100, default 20)\n"
               "  --json      the server's list object as it is\n");
}

static void jc_status_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs status ID [--json] [--url URL]\n\n"
               "Where batch ID is: status, lines done of total, failed lines, files, times.\n\n"
               "  --json   the batch object as the server returns it\n");
}

static void jc_results_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs results ID [-o FILE] [--errors] [--url URL]\n\n"
               "Downloads the output file of batch ID (one JSON line per request: custom_id, response) to stdout or\n"
               "FILE.\n\n"
               "  -o, --output FILE   write to FILE instead of stdout\n"
               "  --errors            the error file instead (failed, expired or cancelled requests)\n");
}

static void jc_cancel_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs cancel ID [--url URL]\n\n"
               "Cancels batch ID: no new line starts, lines in flight finish, then it is cancelled; what finished\n"
               "is in its output file.\n");
}

/* ---- HTTP ---- */

static size_t jc_on_write(char *p, size_t size, size_t n, void *arg)
{
    struct jc_buf *b = arg;
    size_t k = size * n;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + k + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np)
            return 0; /* curl reports a write error */
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, k);
    b->n += k;
    b->p[b->n] = 0;
    return k;
}

/* One request. 0 with *status and the body in out (caller frees out->p), or 1 with a message printed. */
static int jc_http(const struct jc_opts *o, const char *method, const char *path, const char *json_body,
                   curl_mime *mime, long *status, struct jc_buf *out)
{
    memset(out, 0, sizeof *out);
    CURL *e = curl_easy_init();
    if (!e) {
        fprintf(stderr, "wafer jobs: cannot start libcurl\n");
        return 1;
    }
    char url[2048], auth[1100], errbuf[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s%s", o->url, path);
    struct curl_slist *h = NULL;
    if (json_body)
        h = curl_slist_append(h, "Content-Type: application/json");
    if (o->api_key && *o->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->api_key);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (json_body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, json_body);
    else if (!strcmp(method, "POST") && !mime)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
    if (mime)
        curl_easy_setopt(e, CURLOPT_MIMEPOST, mime);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, jc_on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "wafer-jobs/1");
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    if (rc != CURLE_OK) {
        fprintf(stderr, "wafer jobs: cannot reach %s: %s (is the server running? --url sets where)\n", url,
                errbuf[0] ? errbuf : curl_easy_strerror(rc));
        free(out->p);
        out->p = NULL;
        return 1;
    }
    if (!out->p) {
        out->p = calloc(1, 1);
        if (!out->p)
            return 1;
    }
    return 0;
}

/* The JSON of a 2xx response, or NULL with the server's error printed. Frees the body. */
static json_t *jc_json(const char *what, long status, struct jc_buf *b)
{
    json_t *j = json_loadb(b->p, b->n, 0, NULL);
    if (status < 200 || status >= 300) {
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        fprintf(stderr, "wafer jobs: %s failed (HTTP %ld): %s\n", what, status,
                msg ? msg : b->n ? b->p : "no message");
        json_decref(j);
        j = NULL;
    } else if (!j) {
        fprintf(stderr, "wafer jobs: %s: the server's answer is not JSON: %.200s\n", what, b->p);
    }
    free(b->p);
    b->p = NULL;
    return j;
}

/* GET/POST path and return the JSON (NULL: printed why). */
static json_t *jc_call(const struct jc_opts *o, const char *what, const char *method, const char *path,
                       const char *body)
{
    long status = 0;
    struct jc_buf b;
    if (jc_http(o, method, path, body, NULL, &status, &b))
        return NULL;
    return jc_json(what, status, &b);
}

/* ---- rendering ---- */

static long long jc_int(const json_t *j, const char *k) { return (long long)json_integer_value(json_object_get(j, k)); }
static const char *jc_str(const json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "-";
}

static void jc_duration(char *buf, size_t size, double s)
{
    if (!(s >= 0) || s > 1e8)
        snprintf(buf, size, "?");
    else if (s < 60)
        snprintf(buf, size, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, size, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, size, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

static void jc_time(char *buf, size_t size, long long t)
{
    if (!t) {
        snprintf(buf, size, "-");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    localtime_r(&tt, &tm);
    strftime(buf, size, "%Y-%m-%d %H:%M:%S", &tm);
}

static bool jc_final(const char *status)
{
    return !strcmp(status, "completed") || !strcmp(status, "failed") || !strcmp(status, "expired") ||
           !strcmp(status, "cancelled");
}

static void jc_print_batch(FILE *f, const json_t *b)
{
    const json_t *rc = json_object_get(b, "request_counts");
    long long total = jc_int(rc, "total"), done = jc_int(rc, "completed") + jc_int(rc, "failed");
    char created[32];
    jc_time(created, sizeof created, jc_int(b, "created_at"));
    fprintf(f, "%s  %s  %lld/%lld lines done (%lld failed)  endpoint %s  created %s\n", jc_str(b, "id"),
            jc_str(b, "status"), done, total, jc_int(rc, "failed"), jc_str(b, "endpoint"), created);
    if (json_is_string(json_object_get(b, "output_file_id")))
        fprintf(f, "  output file %s\n", jc_str(b, "output_file_id"));
    if (json_is_string(json_object_get(b, "error_file_id")))
        fprintf(f, "  error file  %s\n", jc_str(b, "error_file_id"));
    const json_t *errs = json_object_get(json_object_get(b, "errors"), "data");
    for (size_t i = 0; i < json_array_size(errs); i++)
        fprintf(f, "  error: %s: %s\n", jc_str(json_array_get(errs, i), "code"),
                jc_str(json_array_get(errs, i), "message"));
}

/* One progress line: "[#####.....] 1234/5000 lines  41.2 lines/s  ETA 1m32s  in_progress". */
static void jc_progress(bool tty, const char *status, long long done, long long total, double rate)
{
    const int width = 30;
    int fill = total > 0 ? (int)(width * (double)done / (double)total) : 0;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    char eta[32] = "?";
    if (rate > 0)
        jc_duration(eta, sizeof eta, (double)(total - done) / rate);
    fprintf(stderr, "%s[%s] %lld/%lld lines  %.1f lines/s  ETA %s  %s%s", tty ? "\r" : "", bar, done, total, rate,
            eta, status, tty ? "\033[K" : "\n");
    fflush(stderr);
}

/* ---- commands ---- */

/* The "url" of the first request in the file, as the default endpoint. */
static char *jc_first_url(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *line = NULL, *url = NULL;
    size_t cap = 0;
    while (!url && getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        if (j)
            url = json_string_value(json_object_get(j, "url")) ? strdup(json_string_value(json_object_get(j, "url")))
                                                               : NULL;
        json_decref(j);
        if (!j && strspn(line, " \t\r\n") != strlen(line))
            break; /* not JSON: the server will say which line */
    }
    free(line);
    fclose(f);
    return url;
}

static int jc_wait(const struct jc_opts *o, const char *id)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/batches/%s", id);
    bool tty = isatty(2);
    double t0 = clock_now_s(), t_last_print = 0;
    long long done0 = -1, last_done = -1;
    for (;;) {
        json_t *b = jc_call(o, "getting the batch", "GET", path, NULL);
        if (!b)
            return 1;
        const char *status = jc_str(b, "status");
        const json_t *rc = json_object_get(b, "request_counts");
        long long total = jc_int(rc, "total"), done = jc_int(rc, "completed") + jc_int(rc, "failed");
        double now = clock_now_s();
        if (done0 < 0) {
            done0 = done;
            t0 = now;
        }
        double rate = now > t0 ? (double)(done - done0) / (now - t0) : 0;
        bool final = jc_final(status);
        if (tty || done != last_done || now - t_last_print >= 30 || final) {
            jc_progress(tty, status, done, total, rate);
            t_last_print = now;
            last_done = done;
        }
        if (final) {
            if (tty)
                fputc('\n', stderr);
            jc_print_batch(stderr, b);
            int ok = !strcmp(status, "completed");
            if (!ok)
                fprintf(stderr, "wafer jobs: batch %s is %s\n", id, status);
            json_decref(b);
            return ok ? 0 : 1;
        }
        json_decref(b);
        usleep((useconds_t)(o->interval * 1e6));
    }
}

static int jc_submit(struct jc_opts *o)
{
    const char *file = o->ids[0];
    FILE *f = fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "wafer jobs submit: cannot open '%s': %s\n", file, strerror(errno));
        return 1;
    }
    fclose(f);
    char *auto_endpoint = NULL;
    const char *endpoint = o->endpoint;
    if (!endpoint) {
        auto_endpoint = jc_first_url(file);
        endpoint = auto_endpoint ? auto_endpoint : "/v1/chat/completions";
    }
    CURL *dummy = curl_easy_init(); /* curl_mime needs an easy handle to be created */
    curl_mime *mime = dummy ? curl_mime_init(dummy) : NULL;
    if (!mime) {
        fprintf(stderr, "wafer jobs submit: cannot start libcurl\n");
        curl_easy_cleanup(dummy);
        free(auto_endpoint);
        return 1;
    }
    curl_mimepart *part = curl_mime_addpart(mime);
    curl_mime_name(part, "purpose");
    curl_mime_data(part, "batch", CURL_ZERO_TERMINATED);
    part = curl_mime_addpart(mime);
    curl_mime_name(part, "file");
    const char *base = strrchr(file, '/');
    curl_mime_filedata(part, file);
    curl_mime_filename(part, base ? base + 1 : file);
    curl_mime_type(part, "application/jsonl");
    long status = 0;
    struct jc_buf buf;
    int rc = jc_http(o, "POST", "/v1/files", NULL, mime, &status, &buf);
    curl_mime_free(mime);
    curl_easy_cleanup(dummy);
    json_t *up = rc ? NULL : jc_json("uploading the file", status, &buf);
    if (!up) {
        free(auto_endpoint);
        return 1;
    }
    fprintf(stderr, "uploaded %s as %s (%lld bytes)\n", file, jc_str(up, "id"), jc_int(up, "bytes"));
    json_t *req = json_pack("{sOssss}", "input_file_id", json_object_get(up, "id"), "endpoint", endpoint,
                            "completion_window", o->window ? o->window : "24h");
    if (o->metadata)
        json_object_set(req, "metadata", o->metadata);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    json_decref(up);
    free(auto_endpoint);
    json_t *b = jc_call(o, "creating the batch", "POST", "/v1/batches", body);
    free(body);
    if (!b)
        return 1;
    char id[128];
    snprintf(id, sizeof id, "%s", jc_str(b, "id"));
    printf("%s\n", id);
    fflush(stdout);
    fprintf(stderr, "batch %s: %lld requests to %s, %s\n", id, jc_int(json_object_get(b, "request_counts"), "total"),
            jc_str(b, "endpoint"), jc_str(b, "status"));
    json_decref(b);
    return o->wait ? jc_wait(o, id) : 0;
}

static int jc_list(const struct jc_opts *o)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/batches?limit=%ld", o->limit);
    json_t *l = jc_call(o, "listing batches", "GET", path, NULL);
    if (!l)
        return 1;
    if (o->json) {
        char *s = json_dumps(l, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(l);
        return 0;
    }
    const json_t *data = json_object_get(l, "data");
    if (!json_array_size(data))
        fprintf(stderr, "no batches\n");
    else
        printf("%-34s %-12s %15s  %s\n", "ID", "STATUS", "DONE/TOTAL", "CREATED");
    for (size_t i = 0; i < json_array_size(data); i++) {
        const json_t *b = json_array_get(data, i);
        const json_t *rc = json_object_get(b, "request_counts");
        char created[32], counts[48];
        jc_time(created, sizeof created, jc_int(b, "created_at"));
        snprintf(counts, sizeof counts, "%lld/%lld", jc_int(rc, "completed") + jc_int(rc, "failed"),
                 jc_int(rc, "total"));
        printf("%-34s %-12s %15s  %s\n", jc_str(b, "id"), jc_str(b, "status"), counts, created);
    }
    json_decref(l);
    return 0;
}

static int jc_status(const struct jc_opts *o)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/batches/%s", o->ids[0]);
    json_t *b = jc_call(o, "getting the batch", "GET", path, NULL);
    if (!b)
        return 1;
    if (o->json) {
        char *s = json_dumps(b, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else {
        jc_print_batch(stdout, b);
    }
    json_decref(b);
    return 0;
}

static int jc_results(const struct jc_opts *o)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/batches/%s", o->ids[0]);
    json_t *b = jc_call(o, "getting the batch", "GET", path, NULL);
    if (!b)
        return 1;
    const char *key = o->errors ? "error_file_id" : "output_file_id";
    const char *fid = json_string_value(json_object_get(b, key));
    if (!fid) {
        const char *st = jc_str(b, "status");
        if (jc_final(st))
            fprintf(stderr, "wafer jobs results: batch %s is %s and has no %s file%s\n", o->ids[0], st,
                    o->errors ? "error" : "output",
                    o->errors ? " (no request failed)" : " (try --errors: no request succeeded)");
        else
            fprintf(stderr, "wafer jobs results: batch %s is %s; its files come when it ends (wafer jobs status %s)\n",
                    o->ids[0], st, o->ids[0]);
        json_decref(b);
        return 1;
    }
    snprintf(path, sizeof path, "/v1/files/%s/content", fid);
    json_decref(b);
    long status = 0;
    struct jc_buf buf;
    if (jc_http(o, "GET", path, NULL, NULL, &status, &buf))
        return 1;
    if (status != 200) {
        json_decref(jc_json("downloading the file", status, &buf));
        return 1;
    }
    FILE *out = o->output ? fopen(o->output, "wb") : stdout;
    if (!out) {
        fprintf(stderr, "wafer jobs results: cannot write '%s': %s\n", o->output, strerror(errno));
        free(buf.p);
        return 1;
    }
    bool ok = fwrite(buf.p, 1, buf.n, out) == buf.n;
    ok &= (o->output ? fclose(out) : fflush(out)) == 0;
    if (!ok)
        fprintf(stderr, "wafer jobs results: error writing %s: %s\n", o->output ? o->output : "stdout",
                strerror(errno));
    else if (o->output)
        fprintf(stderr, "wrote %zu bytes to %s\n", buf.n, o->output);
    free(buf.p);
    return ok ? 0 : 1;
}

static int jc_cancel(const struct jc_opts *o)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/batches/%s/cancel", o->ids[0]);
    json_t *b = jc_call(o, "cancelling the batch", "POST", path, NULL);
    if (!b)
        return 1;
    jc_print_batch(stdout, b);
    json_decref(b);
    return 0;
}

/* ---- flags ---- */

static int jc_bad(const char *cmd, const char *msg, const char *arg, void (*usage)(FILE *))
{
    fprintf(stderr, "wafer jobs %s: %s%s%s%s\n\n", cmd, msg, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    usage(stderr);
    return 2;
}

static int jc_set_url(struct jc_opts *o, const char *url)
{
    snprintf(o->url, sizeof o->url, "%s", url);
    size_t n = strlen(o->url);
    while (n && o->url[n - 1] == '/')
        o->url[--n] = 0;
    if (n >= 3 && !strcmp(o->url + n - 3, "/v1"))
        o->url[n - 3] = 0;
    if (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8))
        return -1;
    return 0;
}

int cmd_jobs_main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*usage)(FILE *);
        int n_ids; /* positional arguments it takes */
    } cmds[] = {
        {"submit", jc_submit_usage, 1}, {"list", jc_list_usage, 0},     {"status", jc_status_usage, 1},
        {"results", jc_results_usage, 1}, {"cancel", jc_cancel_usage, 1},
    };
    if (argc < 2) {
        jc_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        jc_usage(stdout);
        return 0;
    }
    int c = -1;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            c = (int)i;
    if (c < 0) {
        fprintf(stderr, "wafer jobs: unknown command '%s'\n\n", argv[1]);
        jc_usage(stderr);
        return 2;
    }
    const char *cmd = cmds[c].name;
    void (*usage)(FILE *) = cmds[c].usage;
    struct jc_opts o = {.limit = 20, .interval = 1};
    const char *env_url = getenv("WAFER_URL");
    jc_set_url(&o, env_url && *env_url ? env_url : JC_DEFAULT_URL);
    o.api_key = getenv("WAFER_API_KEY");
    if (!o.api_key || !*o.api_key)
        o.api_key = getenv("OPENAI_API_KEY");
    int rc = 0;
    for (int i = 2; i < argc && !rc; i++) {
        const char *a = argv[i];
        bool takes = !strcmp(a, "--url") || !strcmp(a, "--api-key") || !strcmp(a, "--endpoint") ||
                     !strcmp(a, "--window") || !strcmp(a, "--metadata") || !strcmp(a, "--interval") ||
                     !strcmp(a, "--limit") || !strcmp(a, "-o") || !strcmp(a, "--output");
        const char *v = takes && i + 1 < argc ? argv[i + 1] : NULL;
        if (takes && !v) {
            rc = jc_bad(cmd, "missing the value of", a, usage);
            break;
        }
        if (takes)
            i++;
        bool submit = c == 0, list = c == 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            json_decref(o.metadata);
            return 0;
        } else if (!strcmp(a, "--url")) {
            if (jc_set_url(&o, v))
                rc = jc_bad(cmd, "--url: expected http://HOST:PORT, got", v, usage);
        } else if (!strcmp(a, "--api-key")) {
            o.api_key = v;
        } else if (submit && !strcmp(a, "--endpoint")) {
            if (strcmp(v, "/v1/completions") && strcmp(v, "/v1/chat/completions"))
                rc = jc_bad(cmd, "--endpoint: expected /v1/chat/completions or /v1/completions, got", v, usage);
            o.endpoint = v;
        } else if (submit && !strcmp(a, "--window")) {
            o.window = v;
        } else if (submit && !strcmp(a, "--metadata")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) {
                rc = jc_bad(cmd, "--metadata: expected KEY=VALUE, got", v, usage);
                break;
            }
            if (!o.metadata)
                o.metadata = json_object();
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(eq - v), v);
            json_object_set_new(o.metadata, key, json_string(eq + 1));
        } else if (submit && !strcmp(a, "--wait")) {
            o.wait = true;
        } else if (submit && !strcmp(a, "--interval")) {
            if (flags_parse_float("jobs submit", "--interval", v, 0.05, 3600, &o.interval))
                rc = 2;
        } else if (list && !strcmp(a, "--limit")) {
            if (flags_parse_int("jobs list", "--limit", v, 1, 100, &o.limit))
                rc = 2;
        } else if ((list || c == 2) && !strcmp(a, "--json")) {
            o.json = true;
        } else if (c == 3 && (!strcmp(a, "-o") || !strcmp(a, "--output"))) {
            o.output = v;
        } else if (c == 3 && !strcmp(a, "--errors")) {
            o.errors = true;
        } else if (a[0] == '-' && a[1]) {
            rc = jc_bad(cmd, "unknown option", a, usage);
        } else if (o.n_ids < cmds[c].n_ids) {
            o.ids[o.n_ids++] = a;
        } else {
            rc = jc_bad(cmd, "unexpected argument", a, usage);
        }
    }
    if (!rc && o.n_ids < cmds[c].n_ids)
        rc = jc_bad(cmd, c == 0 ? "missing FILE.jsonl" : "missing the batch ID", NULL, usage);
    if (rc) {
        json_decref(o.metadata);
        return rc;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "wafer jobs: cannot start libcurl\n");
        json_decref(o.metadata);
        return 1;
    }
    switch (c) {
    case 0: rc = jc_submit(&o); break;
    case 1: rc = jc_list(&o); break;
    case 2: rc = jc_status(&o); break;
    case 3: rc = jc_results(&o); break;
    default: rc = jc_cancel(&o); break;
    }
    curl_global_cleanup();
    json_decref(o.metadata);
    return rc;
}
