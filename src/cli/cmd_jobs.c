/*
 * cmd_jobs: `wafer jobs`, a client of OpenAI's Batch API (POST/GET /v1/files, /v1/batches), so it works against
 * any server that has it, wafer or not. submit uploads a JSONL file (multipart/form-data, purpose=batch) and
 * creates the batch, and with --wait follows it with a progress bar on stderr (lines done of total, rate,
 * ETA); list, status, results and cancel do what they say. Machine-readable output goes to stdout (the batch
 * id from submit, the output file from results), everything for people to stderr.
 *
 * Every request goes through libwafer-client's Batch API calls (wafer_jobs_submit, _get, _wait, _results,
 * _cancel, _list in include/wafer/client.h), so the command and the library share one implementation: the
 * same retries (408, 409, 429, 5xx and connection errors, Retry-After honoured; each retry is said on
 * stderr), timeouts and connection reuse. What is left here is the flags and the rendering (the batch, the
 * list, the progress bar from wait's callback).
 *
 * Exit status: 0 done (submit --wait: the batch completed), 1 a failure (the server's message is printed), 2 a
 * usage error.
 */
#include "cli/cli.h"

#include "core/clock.h"
#include "core/flags.h"
#include "wafer/client.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JC_DEFAULT_URL "http://127.0.0.1:8080"
#define JC_MAX_METADATA 64 /* --metadata pairs taken (the server allows 16: it says so) */

struct jc_opts {
    char url[1024];     /* base URL without a trailing slash or /v1 */
    const char *api_key;
    const char *endpoint;
    const char *window;
    const char *output;
    const char *ids[2]; /* positional arguments */
    int n_ids;
    long limit;
    double interval, timeout; /* --wait: between looks; the most (0: no limit) */
    bool wait, errors, json;
    char *metadata[2 * JC_MAX_METADATA]; /* key, value, ... (owned) */
    int n_metadata;
};

static void jc_opts_free(struct jc_opts *o)
{
    for (int i = 0; i < 2 * o->n_metadata; i++)
        free(o->metadata[i]);
    o->n_metadata = 0;
}

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
               "Requests are retried as libwafer-client retries them (connection errors, 408, 409, 429, 5xx;\n"
               "Retry-After honoured; at most 2 more attempts), each retry said on stderr.\n\n"
               "A line of FILE.jsonl is one request: {\"custom_id\": \"r1\", \"method\": \"POST\", \"url\":\n"
               "\"/v1/chat/completions\", \"body\": {...}}. docs/jobs.md has the details.\n");
}

static void jc_submit_usage(FILE *f)
{
    fprintf(f, "usage: wafer jobs submit FILE.jsonl [--url URL] [--endpoint E] [--window W] [--metadata K=V]...\n"
               "                         [--wait [--interval S] [--timeout S]]\n\n"
               "Uploads FILE.jsonl (purpose \"batch\") and creates a batch from it; prints the batch id on stdout.\n\n"
               "  --endpoint E     /v1/chat/completions or /v1/completions (default: the url of the file's first\n"
               "                   request)\n"
               "  --window W       completion window (default 24h); lines not done by then expire\n"
               "  --metadata K=V   a metadata pair (up to 16)\n"
               "  --wait           follow the batch until it ends, with a progress bar on stderr (lines done of\n"
               "                   total, rate, ETA); exit 0 only if it completed\n"
               "  --interval S     seconds between two looks with --wait (default 1)\n"
               "  --timeout S      with --wait: stop waiting after S seconds (exit 1; the batch goes on;\n"
               "                   default 0: no limit)\n"
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

/* ---- calls (libwafer-client) ---- */

static void jc_on_retry(void *ud, int attempt, double delay_s, const char *why)
{
    (void)ud;
    fprintf(stderr, "wafer jobs: %s; attempt %d in %.2f s\n", why, attempt, delay_s);
}

/* Says why a call failed: for an HTTP error the server's own message, as `wafer jobs` always has. */
static void jc_fail(const char *what, const struct wafer_result *r)
{
    if (r->status == WAFER_E_HTTP) {
        json_t *j = json_loadb(r->text ? r->text : "", r->text_len, 0, NULL);
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        fprintf(stderr, "wafer jobs: %s failed (HTTP %d): %s\n", what, r->http_status,
                msg ? msg : r->text_len ? r->text : "no message");
        json_decref(j);
    } else if (r->status == WAFER_E_CONNECT || r->status == WAFER_E_TIMEOUT) {
        fprintf(stderr, "wafer jobs: %s (is the server running? --url sets where)\n", r->error);
    } else {
        fprintf(stderr, "wafer jobs: %s: %s\n", what, r->error);
    }
}

/* The JSON answer of a call, indented, to stdout (--json). */
static void jc_print_json(const struct wafer_result *r)
{
    json_t *j = json_loadb(r->text ? r->text : "", r->text_len, 0, NULL);
    char *s = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    printf("%s\n", s ? s : r->text ? r->text : "");
    free(s);
    json_decref(j);
}

/* ---- rendering ---- */

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

static const char *jc_or_dash(const char *s) { return s[0] ? s : "-"; }

static void jc_print_batch(FILE *f, const struct wafer_job *b)
{
    char created[32];
    jc_time(created, sizeof created, b->created_at);
    fprintf(f, "%s  %s  %lld/%lld lines done (%lld failed)  endpoint %s  created %s\n", b->id, b->status,
            b->completed + b->failed, b->total, b->failed, jc_or_dash(b->endpoint), created);
    if (b->output_file_id[0])
        fprintf(f, "  output file %s\n", b->output_file_id);
    if (b->error_file_id[0])
        fprintf(f, "  error file  %s\n", b->error_file_id);
    for (const char *e = b->errors; *e;) { /* one "code: message" a line */
        size_t n = strcspn(e, "\n");
        fprintf(f, "  error: %.*s\n", (int)n, e);
        e += n + (e[n] == '\n');
    }
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

struct jc_watch {
    bool tty;
    double t0, t_last_print;
    long long done0, last_done;
};

/* wafer_jobs_wait's progress callback: the bar on each look (a tty), else a line when the count moved or
 * every 30 s. */
static int jc_on_progress(void *ud, const struct wafer_job *b)
{
    struct jc_watch *w = ud;
    long long done = b->completed + b->failed;
    double now = clock_now_s();
    if (w->done0 < 0) {
        w->done0 = done;
        w->t0 = now;
    }
    double rate = now > w->t0 ? (double)(done - w->done0) / (now - w->t0) : 0;
    if (w->tty || done != w->last_done || now - w->t_last_print >= 30 || b->final) {
        jc_progress(w->tty, b->status, done, b->total, rate);
        w->t_last_print = now;
        w->last_done = done;
    }
    return 0;
}

static int jc_wait(struct wafer_client *cl, const struct jc_opts *o, const char *id)
{
    struct jc_watch w = {.tty = isatty(2), .done0 = -1, .last_done = -1};
    struct wafer_job b;
    struct wafer_result r;
    if (wafer_jobs_wait(cl, id, o->interval, o->timeout, jc_on_progress, &w, &b, &r) != WAFER_OK) {
        if (w.tty && w.done0 >= 0)
            fputc('\n', stderr);
        if (r.status == WAFER_E_TIMEOUT && b.id[0]) /* --timeout passed, not a request's */
            fprintf(stderr, "wafer jobs: %s; it goes on (wafer jobs status %s)\n", r.error, id);
        else
            jc_fail("getting the batch", &r);
        wafer_result_free(&r);
        return 1;
    }
    wafer_result_free(&r);
    if (w.tty)
        fputc('\n', stderr);
    jc_print_batch(stderr, &b);
    int ok = !strcmp(b.status, "completed");
    if (!ok)
        fprintf(stderr, "wafer jobs: batch %s is %s\n", id, b.status);
    return ok ? 0 : 1;
}

static int jc_submit(struct wafer_client *cl, struct jc_opts *o)
{
    const char *file = o->ids[0];
    struct wafer_job_request req = {.path = file,
                                    .endpoint = o->endpoint,
                                    .completion_window = o->window,
                                    .metadata = (const char *const *)o->metadata,
                                    .n_metadata = o->n_metadata};
    struct wafer_job b;
    struct wafer_file up;
    struct wafer_result r;
    int rc = wafer_jobs_submit(cl, &req, &b, &up, &r);
    if (up.id[0])
        fprintf(stderr, "uploaded %s as %s (%lld bytes)\n", file, up.id, up.bytes);
    if (rc != WAFER_OK) {
        if (rc == WAFER_E_INVALID)
            fprintf(stderr, "wafer jobs submit: %s\n", r.error);
        else
            jc_fail(up.id[0] ? "creating the batch" : "uploading the file", &r);
        wafer_result_free(&r);
        return 1;
    }
    wafer_result_free(&r);
    printf("%s\n", b.id);
    fflush(stdout);
    fprintf(stderr, "batch %s: %lld requests to %s, %s\n", b.id, b.total, jc_or_dash(b.endpoint), b.status);
    return o->wait ? jc_wait(cl, o, b.id) : 0;
}

static int jc_list(struct wafer_client *cl, const struct jc_opts *o)
{
    struct wafer_job *bs;
    int n;
    struct wafer_result r;
    if (wafer_jobs_list(cl, (int)o->limit, NULL, &bs, &n, NULL, &r) != WAFER_OK) {
        jc_fail("listing batches", &r);
        wafer_result_free(&r);
        return 1;
    }
    if (o->json) {
        jc_print_json(&r);
    } else {
        if (!n)
            fprintf(stderr, "no batches\n");
        else
            printf("%-34s %-12s %15s  %s\n", "ID", "STATUS", "DONE/TOTAL", "CREATED");
        for (int i = 0; i < n; i++) {
            char created[32], counts[48];
            jc_time(created, sizeof created, bs[i].created_at);
            snprintf(counts, sizeof counts, "%lld/%lld", bs[i].completed + bs[i].failed, bs[i].total);
            printf("%-34s %-12s %15s  %s\n", bs[i].id, bs[i].status, counts, created);
        }
    }
    wafer_jobs_free(bs);
    wafer_result_free(&r);
    return 0;
}

static int jc_status(struct wafer_client *cl, const struct jc_opts *o)
{
    struct wafer_job b;
    struct wafer_result r;
    if (wafer_jobs_get(cl, o->ids[0], &b, &r) != WAFER_OK) {
        jc_fail("getting the batch", &r);
        wafer_result_free(&r);
        return 1;
    }
    if (o->json)
        jc_print_json(&r);
    else
        jc_print_batch(stdout, &b);
    wafer_result_free(&r);
    return 0;
}

static int jc_results(struct wafer_client *cl, const struct jc_opts *o)
{
    struct wafer_job b;
    struct wafer_result r;
    int rc = wafer_jobs_results(cl, o->ids[0], o->errors, &b, &r);
    if (rc == WAFER_E_NO_FILE) {
        if (b.final)
            fprintf(stderr, "wafer jobs results: batch %s is %s and has no %s file%s\n", o->ids[0], b.status,
                    o->errors ? "error" : "output",
                    o->errors ? " (no request failed)" : " (try --errors: no request succeeded)");
        else
            fprintf(stderr, "wafer jobs results: batch %s is %s; its files come when it ends (wafer jobs status %s)\n",
                    o->ids[0], b.status, o->ids[0]);
        wafer_result_free(&r);
        return 1;
    }
    if (rc != WAFER_OK) {
        jc_fail(b.id[0] ? "downloading the file" : "getting the batch", &r);
        wafer_result_free(&r);
        return 1;
    }
    FILE *out = o->output ? fopen(o->output, "wb") : stdout;
    if (!out) {
        fprintf(stderr, "wafer jobs results: cannot write '%s': %s\n", o->output, strerror(errno));
        wafer_result_free(&r);
        return 1;
    }
    bool ok = fwrite(r.text, 1, r.text_len, out) == r.text_len;
    ok &= (o->output ? fclose(out) : fflush(out)) == 0;
    if (!ok)
        fprintf(stderr, "wafer jobs results: error writing %s: %s\n", o->output ? o->output : "stdout",
                strerror(errno));
    else if (o->output)
        fprintf(stderr, "wrote %zu bytes to %s\n", r.text_len, o->output);
    wafer_result_free(&r);
    return ok ? 0 : 1;
}

static int jc_cancel(struct wafer_client *cl, const struct jc_opts *o)
{
    struct wafer_job b;
    struct wafer_result r;
    if (wafer_jobs_cancel(cl, o->ids[0], &b, &r) != WAFER_OK) {
        jc_fail("cancelling the batch", &r);
        wafer_result_free(&r);
        return 1;
    }
    jc_print_batch(stdout, &b);
    wafer_result_free(&r);
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
                     !strcmp(a, "--window") || !strcmp(a, "--metadata") || !strcmp(a, "--interval") || !strcmp(a, "--timeout") ||
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
            jc_opts_free(&o);
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
            if (o.n_metadata == JC_MAX_METADATA) {
                rc = jc_bad(cmd, "--metadata: too many pairs, at", v, usage);
                break;
            }
            char *key = strndup(v, (size_t)(eq - v)), *val = strdup(eq + 1);
            if (!key || !val) {
                free(key);
                free(val);
                fprintf(stderr, "wafer jobs: out of memory\n");
                rc = 1;
                break;
            }
            o.metadata[2 * o.n_metadata] = key;
            o.metadata[2 * o.n_metadata + 1] = val;
            o.n_metadata++;
        } else if (submit && !strcmp(a, "--wait")) {
            o.wait = true;
        } else if (submit && !strcmp(a, "--timeout")) {
            if (flags_parse_float("jobs submit", "--timeout", v, 0, 1e7, &o.timeout))
                rc = 2;
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
        jc_opts_free(&o);
        return rc;
    }
    struct wafer_client_options co;
    wafer_client_options_default(&co);
    co.base_url = o.url;
    co.api_key = o.api_key && *o.api_key ? o.api_key : NULL;
    co.on_retry = jc_on_retry;
    char err[WAFER_ERR_MAX];
    struct wafer_client *cl = wafer_client_create(&co, err);
    if (!cl) {
        fprintf(stderr, "wafer jobs: %s\n", err);
        jc_opts_free(&o);
        return 2;
    }
    switch (c) {
    case 0: rc = jc_submit(cl, &o); break;
    case 1: rc = jc_list(cl, &o); break;
    case 2: rc = jc_status(cl, &o); break;
    case 3: rc = jc_results(cl, &o); break;
    default: rc = jc_cancel(cl, &o); break;
    }
    wafer_client_destroy(cl);
    jc_opts_free(&o);
    return rc;
}
