/*
 * wafer ctl: operate a running server over HTTP: status, models, load, unload, drain. It talks to `wafer
 * serve` (one model, or models mode: docs/models.md) with libcurl directly, since the client library
 * (include/wafer/client.h) speaks the generation API and GET only; each call is one short request, no
 * retries (an operator's command says at once what happened).
 *
 * Output: readable tables by default, --json for machines (one JSON object on stdout). Errors go to stderr
 * and say what to do. Exit statuses: 0 done; 1 the server answered an error (or a load failed or timed
 * out); 2 a usage error; 3 the server could not be reached.
 */
#include "cli/cli.h"
#include "core/flags.h"

#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CTL_EXIT_ERROR 1
#define CTL_EXIT_USAGE 2
#define CTL_EXIT_UNREACHABLE 3

struct ctl {
    char url[1024];     /* without a trailing slash */
    const char *key;    /* Bearer key, or NULL */
    bool json;
    double timeout_s;
    CURL *curl;
};

struct ctl_resp {
    long status;
    char *body;
    size_t len, cap;
};

static void ctl_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer ctl [options] status\n"
            "       wafer ctl [options] models\n"
            "       wafer ctl [options] load NAME [--path FILE.gguf] [--no-wait] [--wait-timeout S]\n"
            "       wafer ctl [options] unload NAME\n"
            "       wafer ctl [options] drain\n\n"
            "Operates a running wafer serve over HTTP.\n"
            "  status   health, readiness, version, the models and their state, running / waiting requests\n"
            "  models   the models: name, state (loaded, loading, unloaded), size, last use (models mode:\n"
            "           GET /admin/models; one-model servers: GET /v1/models)\n"
            "  load     POST /admin/models/load {\"model\": NAME[, \"path\": FILE]}, then waits until it is loaded\n"
            "  unload   POST /admin/models/unload {\"model\": NAME}\n"
            "  drain    POST /admin/drain: the server stops taking work (503), finishes what is in flight, exits\n\n"
            "options:\n"
            "  -u, --url URL          server (default $WAFER_URL, else http://127.0.0.1:8080)\n"
            "      --api-key KEY      Bearer key: an admin key for load, unload, drain (default $WAFER_API_KEY)\n"
            "      --json             one JSON object on stdout instead of tables\n"
            "      --timeout S        seconds per HTTP request (default 10)\n"
            "      --path FILE        load: the model file to load it from (a configured model's new path)\n"
            "      --no-wait          load: return once the load started\n"
            "      --wait-timeout S   load: seconds to wait for it (default 600)\n"
            "  -h, --help             this help\n\n"
            "exit status: 0 done; 1 the server answered an error (or the load failed or timed out);\n"
            "             2 usage error; 3 the server could not be reached\n");
}

static size_t ctl_write(char *p, size_t size, size_t n, void *ud)
{
    struct ctl_resp *r = ud;
    size_t add = size * n;
    if (r->len + add + 1 > r->cap) {
        size_t nc = r->cap ? r->cap : 4096;
        while (nc < r->len + add + 1)
            nc *= 2;
        char *nb = realloc(r->body, nc);
        if (!nb)
            return 0;
        r->body = nb;
        r->cap = nc;
    }
    memcpy(r->body + r->len, p, add);
    r->len += add;
    r->body[r->len] = 0;
    return add;
}

/* One request. 0 with the answer in *out (body NUL-terminated; caller frees out->body), or
 * CTL_EXIT_UNREACHABLE with the reason printed. */
static int ctl_call(struct ctl *c, const char *method, const char *path, const char *body, struct ctl_resp *out)
{
    memset(out, 0, sizeof *out);
    char url[2048];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(c->timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(c->timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ctl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    struct curl_slist *hdrs = NULL;
    char auth[1100];
    if (c->key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->key);
        hdrs = curl_slist_append(hdrs, auth);
    }
    if (!strcmp(method, "POST")) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "{}");
    }
    if (hdrs)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdrs);
    if (rc != CURLE_OK) {
        free(out->body);
        out->body = NULL;
        fprintf(stderr,
                "wafer ctl: cannot reach the server at %s: %s\n"
                "  is `wafer serve` running there? Pass its address with --url URL (or set WAFER_URL).\n",
                c->url, curl_easy_strerror(rc));
        return CTL_EXIT_UNREACHABLE;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    if (!out->body && !(out->body = calloc(1, 1)))
        return CTL_EXIT_ERROR;
    return 0;
}

/* The server's error message (OpenAI shape), or the body's start. */
static void ctl_print_error(const char *what, const struct ctl_resp *r)
{
    json_t *o = json_loads(r->body, 0, NULL);
    json_t *e = o ? json_object_get(o, "error") : NULL;
    const char *msg = e ? json_string_value(json_object_get(e, "message")) : NULL;
    fprintf(stderr, "wafer ctl: %s: HTTP %ld: %s\n", what, r->status, msg ? msg : r->body[0] ? r->body : "(no body)");
    if (r->status == 401)
        fprintf(stderr, "  pass an admin key with --api-key KEY (or set WAFER_API_KEY)\n");
    else if (r->status == 403)
        fprintf(stderr, "  with no auth.admin_keys configured the admin API answers loopback clients only\n");
    json_decref(o);
}

/* "name value" or "name{labels} value" of a Prometheus text; sums every series of name. -1 when absent. */
static double ctl_metric(const char *text, const char *name)
{
    size_t nl = strlen(name);
    double sum = 0;
    bool found = false;
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, name, nl) && (p[nl] == ' ' || p[nl] == '{')) {
            const char *v = p[nl] == '{' ? strchr(p, '}') : p + nl;
            if (v) {
                v = v[0] == '}' ? v + 1 : v;
                sum += strtod(v, NULL);
                found = true;
            }
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return found ? sum : -1;
}

static void ctl_bytes(int64_t b, char *out, size_t cap)
{
    if (b >= (int64_t)1 << 30)
        snprintf(out, cap, "%.1f GiB", (double)b / (double)(1 << 30));
    else if (b >= 1 << 20)
        snprintf(out, cap, "%.1f MiB", (double)b / (double)(1 << 20));
    else
        snprintf(out, cap, "%lld B", (long long)b);
}

static void ctl_ago(json_t *t, char *out, size_t cap)
{
    if (!json_is_integer(t)) {
        snprintf(out, cap, "never");
        return;
    }
    long long s = (long long)time(NULL) - (long long)json_integer_value(t);
    if (s < 0)
        s = 0;
    if (s < 120)
        snprintf(out, cap, "%lld s ago", s);
    else if (s < 7200)
        snprintf(out, cap, "%lld min ago", s / 60);
    else
        snprintf(out, cap, "%lld h ago", s / 3600);
}

/* The models as a JSON array of {name, state, aliases, [path, bytes, last_used, active]}: /admin/models in
 * models mode, else /v1/models (one model: loaded when the server is ready). *admin says which. NULL with
 * the exit status in *rc. */
static json_t *ctl_models_fetch(struct ctl *c, bool *admin, int *rc)
{
    struct ctl_resp r;
    *admin = false;
    if ((*rc = ctl_call(c, "GET", "/admin/models", NULL, &r)))
        return NULL;
    json_t *o = NULL;
    if (r.status == 200 && (o = json_loads(r.body, 0, NULL)) && json_is_array(json_object_get(o, "data"))) {
        free(r.body);
        *admin = true;
        json_t *d = json_incref(json_object_get(o, "data"));
        json_decref(o);
        return d;
    }
    json_decref(o);
    free(r.body); /* a one-model server (404), or models mode without admin access: the public list */
    if ((*rc = ctl_call(c, "GET", "/v1/models", NULL, &r)))
        return NULL;
    o = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    json_t *data = o ? json_object_get(o, "data") : NULL;
    if (!json_is_array(data)) {
        ctl_print_error("GET /v1/models", &r);
        free(r.body);
        json_decref(o);
        *rc = CTL_EXIT_ERROR;
        return NULL;
    }
    free(r.body);
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(data, i, m) {
        json_t *e = json_object();
        json_object_set(e, "name", json_object_get(m, "id"));
        json_t *st = json_object_get(m, "state");
        json_object_set_new(e, "state", st ? json_incref(st) : json_string("loaded"));
        json_t *al = json_object_get(m, "aliases");
        json_object_set_new(e, "aliases", al ? json_incref(al) : json_array());
        json_array_append_new(out, e);
    }
    json_decref(o);
    return out;
}

static void ctl_models_table(json_t *models, bool admin)
{
    if (admin)
        printf("%-24s %-10s %10s  %-12s %6s  %s\n", "NAME", "STATE", "SIZE", "LAST USED", "ACTIVE", "ALIASES");
    else
        printf("%-24s %-10s  %s\n", "NAME", "STATE", "ALIASES");
    size_t i;
    json_t *m;
    json_array_foreach(models, i, m) {
        char aliases[256] = "";
        size_t k;
        json_t *a;
        json_array_foreach(json_object_get(m, "aliases"), k, a)
            snprintf(aliases + strlen(aliases), sizeof aliases - strlen(aliases), "%s%s", k ? ", " : "",
                     json_string_value(a) ? json_string_value(a) : "?");
        const char *name = json_string_value(json_object_get(m, "name"));
        const char *state = json_string_value(json_object_get(m, "state"));
        if (admin) {
            char size[32], ago[32];
            ctl_bytes(json_integer_value(json_object_get(m, "bytes")), size, sizeof size);
            ctl_ago(json_object_get(m, "last_used"), ago, sizeof ago);
            printf("%-24s %-10s %10s  %-12s %6lld  %s\n", name ? name : "?", state ? state : "?", size, ago,
                   (long long)json_integer_value(json_object_get(m, "active")), aliases[0] ? aliases : "-");
        } else {
            printf("%-24s %-10s  %s\n", name ? name : "?", state ? state : "?", aliases[0] ? aliases : "-");
        }
    }
}

static int ctl_models(struct ctl *c)
{
    bool admin;
    int rc;
    json_t *models = ctl_models_fetch(c, &admin, &rc);
    if (!models)
        return rc;
    if (c->json) {
        json_t *o = json_object();
        json_object_set_new(o, "models", models);
        json_dumpf(o, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(o);
    } else {
        ctl_models_table(models, admin);
        json_decref(models);
    }
    return 0;
}

static int ctl_status(struct ctl *c)
{
    struct ctl_resp health, ready, metrics;
    int rc = ctl_call(c, "GET", "/health", NULL, &health);
    if (rc)
        return rc;
    if ((rc = ctl_call(c, "GET", "/ready", NULL, &ready))) {
        free(health.body);
        return rc;
    }
    if ((rc = ctl_call(c, "GET", "/metrics", NULL, &metrics))) {
        free(health.body);
        free(ready.body);
        return rc;
    }
    bool admin = false;
    json_t *models = ctl_models_fetch(c, &admin, &rc);
    json_t *h = json_loads(health.body, 0, NULL), *rd = json_loads(ready.body, 0, NULL);
    const char *mode = json_string_value(json_object_get(h, "mode"));
    bool models_mode = mode && !strcmp(mode, "models");
    const char *mt = metrics.status == 200 ? metrics.body : "";
    double running = ctl_metric(mt, "wafer_requests_running"), waiting = ctl_metric(mt, "wafer_requests_waiting");
    double slots = ctl_metric(mt, "wafer_batch_limit"), kv_used = ctl_metric(mt, "wafer_kv_blocks_used");
    double kv_total = ctl_metric(mt, "wafer_kv_blocks_total");
    double inflight = ctl_metric(mt, "wafer_route_requests_in_flight");
    int n_loaded = 0, n_models = 0;
    size_t i;
    json_t *m;
    char loaded[512] = "";
    json_array_foreach(models, i, m) {
        n_models++;
        const char *st = json_string_value(json_object_get(m, "state"));
        if (st && !strcmp(st, "loaded")) {
            snprintf(loaded + strlen(loaded), sizeof loaded - strlen(loaded), "%s%s", n_loaded ? ", " : "",
                     json_string_value(json_object_get(m, "name")));
            n_loaded++;
        }
    }
    const char *ready_s = json_string_value(json_object_get(rd, "status"));
    if (c->json) {
        json_t *o = json_object();
        json_object_set_new(o, "url", json_string(c->url));
        json_object_set_new(o, "health", h ? json_incref(h) : json_null());
        json_object_set_new(o, "ready", json_boolean(ready.status == 200));
        json_object_set_new(o, "ready_status", ready_s ? json_string(ready_s) : json_null());
        json_object_set_new(o, "mode", json_string(models_mode ? "models" : mode ? mode : "single"));
        json_object_set_new(o, "models", models ? json_incref(models) : json_array());
        json_object_set_new(o, "loaded", json_integer(n_loaded));
        json_t *g = json_object();
        if (running >= 0)
            json_object_set_new(g, "running", json_integer((json_int_t)running));
        if (waiting >= 0)
            json_object_set_new(g, "waiting", json_integer((json_int_t)waiting));
        if (slots >= 0)
            json_object_set_new(g, "slots", json_integer((json_int_t)slots));
        if (kv_used >= 0 && kv_total >= 0) {
            json_object_set_new(g, "kv_blocks_used", json_integer((json_int_t)kv_used));
            json_object_set_new(g, "kv_blocks_total", json_integer((json_int_t)kv_total));
        }
        if (inflight >= 0)
            json_object_set_new(g, "in_flight", json_integer((json_int_t)inflight));
        json_object_set_new(o, "load", g);
        json_dumpf(o, stdout, JSON_INDENT(2));
        printf("\n");
        json_decref(o);
    } else {
        printf("%-10s %s\n", "server", c->url);
        printf("%-10s %s\n", "health", health.status == 200 ? "ok" : "failing");
        printf("%-10s %s\n", "ready", ready_s ? ready_s : ready.status == 200 ? "ready" : "not ready");
        const char *v = json_string_value(json_object_get(h, "version"));
        const char *cm = json_string_value(json_object_get(h, "commit"));
        printf("%-10s %s%s%s%s\n", "version", v ? v : "unknown", cm ? " (commit " : "", cm ? cm : "", cm ? ")" : "");
        printf("%-10s %s\n", "mode", models_mode ? "models (one child server per loaded model)" : "one model");
        printf("%-10s %d of %d loaded%s%s\n", "models", n_loaded, n_models, n_loaded ? ": " : "", loaded);
        if (running >= 0)
            printf("%-10s %.0f running, %.0f waiting, %.0f slots, KV blocks %.0f of %.0f in use\n", "load", running,
                   waiting < 0 ? 0 : waiting, slots < 0 ? 0 : slots, kv_used < 0 ? 0 : kv_used,
                   kv_total < 0 ? 0 : kv_total);
        else if (inflight >= 0)
            printf("%-10s %.0f request(s) in flight\n", "load", inflight);
        if (models) {
            printf("\n");
            ctl_models_table(models, admin);
        }
    }
    int status = health.status == 200 ? 0 : CTL_EXIT_ERROR;
    json_decref(h);
    json_decref(rd);
    json_decref(models);
    free(health.body);
    free(ready.body);
    free(metrics.body);
    return status;
}

/* The state of one model from /admin/models, or NULL. */
static json_t *ctl_model_state(struct ctl *c, const char *name, int *rc)
{
    bool admin;
    json_t *models = ctl_models_fetch(c, &admin, rc);
    if (!models)
        return NULL;
    size_t i;
    json_t *m, *found = NULL;
    json_array_foreach(models, i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n && !strcmp(n, name))
            found = json_incref(m);
    }
    json_decref(models);
    return found;
}

static int ctl_load_unload(struct ctl *c, bool load, const char *name, const char *path, bool wait, double wait_s)
{
    json_t *b = json_object();
    json_object_set_new(b, "model", json_string(name));
    if (path)
        json_object_set_new(b, "path", json_string(path));
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    struct ctl_resp r;
    const char *ep = load ? "/admin/models/load" : "/admin/models/unload";
    int rc = ctl_call(c, "POST", ep, body, &r);
    free(body);
    if (rc)
        return rc;
    if (r.status != 200 && r.status != 202) {
        char what[64];
        snprintf(what, sizeof what, "POST %s", ep);
        ctl_print_error(what, &r);
        if (r.status == 404 && strstr(r.body, "Unknown route"))
            fprintf(stderr, "  this server runs one model; load and unload need models mode (docs/models.md)\n");
        free(r.body);
        return CTL_EXIT_ERROR;
    }
    json_t *state = json_loads(r.body, 0, NULL);
    free(r.body);
    char canon[256]; /* the model's own name (NAME may be an alias) */
    const char *cn = json_string_value(json_object_get(state, "name"));
    snprintf(canon, sizeof canon, "%s", cn ? cn : name);
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (load && wait) {
        const char *st = json_string_value(json_object_get(state, "state"));
        if (st && strcmp(st, "loading"))
            break;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 > wait_s) {
            fprintf(stderr, "wafer ctl: '%s' is still loading after %.0f s (--wait-timeout)\n", name, wait_s);
            json_decref(state);
            return CTL_EXIT_ERROR;
        }
        usleep(200000);
        json_decref(state);
        if (!(state = ctl_model_state(c, canon, &rc))) {
            if (!rc)
                fprintf(stderr, "wafer ctl: '%s' is no longer listed by the server\n", canon);
            return rc ? rc : CTL_EXIT_ERROR;
        }
    }
    const char *st = json_string_value(json_object_get(state, "state"));
    int status = 0;
    if (load && wait && (!st || strcmp(st, "loaded"))) {
        const char *le = json_string_value(json_object_get(state, "last_error"));
        fprintf(stderr, "wafer ctl: '%s' did not load (state %s)%s%s\n", name, st ? st : "?", le ? ": " : "",
                le ? le : "");
        status = CTL_EXIT_ERROR;
    }
    if (c->json) {
        json_dumpf(state, stdout, JSON_INDENT(2));
        printf("\n");
    } else if (!status) {
        printf("%s: %s\n", name, st ? st : "?");
    }
    json_decref(state);
    return status;
}

static int ctl_drain(struct ctl *c)
{
    struct ctl_resp r;
    int rc = ctl_call(c, "POST", "/admin/drain", "{}", &r);
    if (rc)
        return rc;
    if (r.status != 200 && r.status != 202) {
        ctl_print_error("POST /admin/drain", &r);
        free(r.body);
        return CTL_EXIT_ERROR;
    }
    if (c->json)
        printf("%s\n", r.body);
    else
        printf("draining: the server takes no new work, finishes what is in flight, then exits\n");
    free(r.body);
    return 0;
}

/* What the options set, wherever they appear on the line. */
struct ctl_opts {
    struct ctl *c;
    const char **url, **path;
    bool *wait;
    double *wait_s;
};

/* Applies option o (getopt_long's answer); -1 to go on, or the exit code (help, usage error). */
static int ctl_option(int o, struct ctl_opts *x)
{
    switch (o) {
    case 'u': *x->url = optarg; return -1;
    case 'k': x->c->key = optarg; return -1;
    case 'j': x->c->json = true; return -1;
    case 't': return flags_parse_float("ctl", "--timeout", optarg, 0.1, 86400, &x->c->timeout_s) ? CTL_EXIT_USAGE : -1;
    case 'p': *x->path = optarg; return -1;
    case 'n': *x->wait = false; return -1;
    case 'w': return flags_parse_float("ctl", "--wait-timeout", optarg, 0, 1e7, x->wait_s) ? CTL_EXIT_USAGE : -1;
    case 'h': ctl_usage(stdout); return 0;
    default: ctl_usage(stderr); return CTL_EXIT_USAGE;
    }
}

int cmd_ctl_main(int argc, char **argv)
{
    struct ctl c = {.timeout_s = 10};
    const char *url = getenv("WAFER_URL");
    c.key = getenv("WAFER_API_KEY");
    if (c.key && !*c.key)
        c.key = NULL;
    const char *path = NULL;
    bool wait = true;
    double wait_s = 600;
    struct ctl_opts set = {&c, &url, &path, &wait, &wait_s};
    static const struct option opts[] = {{"url", required_argument, NULL, 'u'},
                                         {"api-key", required_argument, NULL, 'k'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"timeout", required_argument, NULL, 't'},
                                         {"path", required_argument, NULL, 'p'},
                                         {"no-wait", no_argument, NULL, 'n'},
                                         {"wait-timeout", required_argument, NULL, 'w'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, "+u:h", opts, NULL)) != -1) {
        int rc = ctl_option(o, &set);
        if (rc >= 0)
            return rc;
    }
    /* options may also follow the command (wafer ctl load NAME --path P) */
    const char *verb = optind < argc ? argv[optind++] : NULL;
    const char *arg = NULL;
    while (optind < argc) {
        o = getopt_long(argc, argv, "+u:h", opts, NULL);
        if (o == -1) {
            if (optind >= argc)
                break;
            if (arg) {
                fprintf(stderr, "wafer ctl: unexpected argument '%s'\n", argv[optind]);
                return CTL_EXIT_USAGE;
            }
            arg = argv[optind++];
            continue;
        }
        int rc = ctl_option(o, &set);
        if (rc >= 0)
            return rc;
    }
    if (!verb) {
        fprintf(stderr, "wafer ctl: name a command: status, models, load NAME, unload NAME or drain\n\n");
        ctl_usage(stderr);
        return CTL_EXIT_USAGE;
    }
    bool needs_arg = !strcmp(verb, "load") || !strcmp(verb, "unload");
    bool known = needs_arg || !strcmp(verb, "status") || !strcmp(verb, "models") || !strcmp(verb, "drain");
    if (!known) {
        fprintf(stderr, "wafer ctl: unknown command '%s' (status, models, load, unload, drain)\n", verb);
        return CTL_EXIT_USAGE;
    }
    if (needs_arg != (arg != NULL)) {
        fprintf(stderr, needs_arg ? "wafer ctl: %s needs a model name (wafer ctl %s NAME)\n"
                                  : "wafer ctl: %s takes no argument\n", verb, verb);
        return CTL_EXIT_USAGE;
    }
    if (path && strcmp(verb, "load")) {
        fprintf(stderr, "wafer ctl: --path goes with load only\n");
        return CTL_EXIT_USAGE;
    }
    snprintf(c.url, sizeof c.url, "%s", url && *url ? url : "http://127.0.0.1:8080");
    size_t ul = strlen(c.url);
    while (ul > 0 && c.url[ul - 1] == '/')
        c.url[--ul] = 0;
    if (strncmp(c.url, "http://", 7) && strncmp(c.url, "https://", 8)) {
        fprintf(stderr, "wafer ctl: --url '%s' is not an http:// or https:// URL\n", c.url);
        return CTL_EXIT_USAGE;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) || !(c.curl = curl_easy_init())) {
        fprintf(stderr, "wafer ctl: cannot start libcurl\n");
        return CTL_EXIT_ERROR;
    }
    int rc;
    if (!strcmp(verb, "status"))
        rc = ctl_status(&c);
    else if (!strcmp(verb, "models"))
        rc = ctl_models(&c);
    else if (!strcmp(verb, "drain"))
        rc = ctl_drain(&c);
    else
        rc = ctl_load_unload(&c, !strcmp(verb, "load"), arg, path, wait, wait_s);
    curl_easy_cleanup(c.curl);
    curl_global_cleanup();
    return rc;
}
