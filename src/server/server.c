/*
 * server: `wafer serve` wired together: the HTTP server, the model and engine, the scheduler, routing, auth,
 * and the shutdown sequence. Answering and the life of each request are api_call.c's; preparing generation
 * requests is api_prepare.c's; the endpoints are the api_*.c handlers, which only this file calls.
 *
 * Threads: the main thread loads the model and then only waits for signals (blocked everywhere, taken with
 * sigtimedwait, so no code runs in a signal handler); the I/O thread runs the epoll loop, routing and
 * streaming; a few workers (server.workers) parse, template and tokenize requests and build large answers
 * (api_call_begin, api_call_defer), so the loop never does work that grows with a request; the engine
 * thread runs the scheduler. The I/O thread never blocks on the engine or a worker: both hand results back
 * through queues and wake it (http_server_wake).
 *
 * Signals: SIGTERM and SIGINT drain and stop (server.h); SIGHUP reloads the configuration (the same flags
 * and --config file): the API keys, the log level and the alert rules change at once, and log lines say what
 * it did;
 * streams and requests in flight are untouched, and a configuration that no longer loads changes nothing.
 *
 * Routing is a fixed table (method, path) -> handler; a known path with the wrong method is 405 with Allow,
 * an unknown path 404, both in the OpenAI error shape. Auth (Bearer keys, compared in constant time) covers
 * every route but the probes (/health, /ready, /metrics) and the read-only views of observe.c (/v1/alerts,
 * /v1/stats, /dashboard); CORS preflights are answered here. The observability thread (observe.h) starts
 * before the I/O thread and stops before the scheduler goes.
 */
#include "server/server.h"

#include "core/alert.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"
#include "server/sd_notify.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---------------------------------------------------------------- SIGHUP */

/* The main thread reads the configuration again, from the same flags and --config file (API key files
 * included), and hands the result to the I/O thread, which owns what it changes (auth_ok reads the keys
 * there): srv->reload and a wake. A configuration that no longer loads changes nothing. */
static void server_request_reload(struct server *srv)
{
    struct server_config *nc = malloc(sizeof *nc);
    if (!nc) {
        log_warn("SIGHUP: out of memory; the configuration was not reloaded");
        return;
    }
    server_config_init(nc);
    char err[ERR_MSG_MAX] = "";
    int rc = server_config_from_args(nc, srv->cfg->argc, srv->cfg->argv, err);
    if (rc) {
        log_warn("SIGHUP: the configuration was not reloaded, the server keeps its settings: %s",
                 rc == 1 ? "--help" : err);
        server_config_deinit(nc);
        free(nc);
        return;
    }
    struct server_config *old = atomic_exchange(&srv->reload, nc);
    if (old) { /* a reload the I/O thread has not applied yet: the newer one replaces it */
        server_config_deinit(old);
        free(old);
    }
    http_server_wake(srv->http);
}

/* Applies a configuration read for SIGHUP (I/O thread): the API keys and the log level here, the alert rules
 * through the observability thread. */
static void server_apply_reload(struct server *srv)
{
    struct server_config *nc = atomic_exchange(&srv->reload, NULL);
    if (!nc)
        return;
    struct server_config *cfg = srv->cfg;
    int was = cfg->n_api_keys;
    for (int i = 0; i < CONFIG_MAX_LIST; i++) { /* swap: nc takes the old keys away to be freed */
        char *k = cfg->api_keys[i];
        cfg->api_keys[i] = nc->api_keys[i];
        nc->api_keys[i] = k;
    }
    cfg->n_api_keys = nc->n_api_keys;
    nc->n_api_keys = was;
    enum log_level level = log_level_get();
    if (nc->log_level)
        log_level_from_name(nc->log_level, &level);
    const char *names[] = {"error", "warn", "info", "debug"};
    const char *before = names[log_level_get()];
    log_level_set(level);
    log_write(level < LOG_INFO ? level : LOG_INFO,
              "SIGHUP: configuration reloaded: %d API key(s) (was %d)%s, log level %s (was %s), alert rules: %d; "
              "other settings take effect at the next start",
              cfg->n_api_keys, was, cfg->n_api_keys ? "" : ", auth off", names[level], before,
              nc->alerts ? nc->alerts->n_rules : 0);
    observe_reload_alerts(srv->obs, nc->alerts); /* its thread applies them and says what changed */
    nc->alerts = NULL;
    server_config_deinit(nc);
    free(nc);
}

/* ---------------------------------------------------------------- http callbacks */

static bool ct_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    /* constant time in the key length: no early exit on the first differing byte */
    size_t n = alen > blen ? alen : blen;
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)((i < alen ? (unsigned char)a[i] : 0) ^ (i < blen ? (unsigned char)b[i] : 0));
    return diff == 0;
}

static bool auth_ok(struct server *srv, const struct http_request *req)
{
    const struct server_config *cfg = srv->cfg;
    if (!cfg->n_api_keys)
        return true;
    const struct http_header *h = http_request_header(req, "authorization");
    if (!h)
        h = http_request_header(req, "x-api-key");
    if (!h)
        return false;
    const char *v = h->value;
    size_t vl = h->value_len;
    if (vl >= 7 && !strncasecmp(v, "Bearer ", 7)) {
        v += 7;
        vl -= 7;
    }
    while (vl && *v == ' ') {
        v++;
        vl--;
    }
    bool ok = false;
    for (int i = 0; i < cfg->n_api_keys; i++)
        ok |= ct_equal(v, vl, cfg->api_keys[i], strlen(cfg->api_keys[i]));
    return ok;
}

static bool method_is(const struct http_request *req, const char *m)
{
    return req->method_len == strlen(m) && !memcmp(req->method, m, req->method_len);
}

static bool path_is(const struct http_request *req, const char *p)
{
    return req->path_len == strlen(p) && !memcmp(req->path, p, req->path_len);
}

struct route_row {
    const char *path;
    const char *method;
    enum api_route route;
};

static const struct route_row routes[] = {
    {"/health", "GET", ROUTE_HEALTH},
    {"/ready", "GET", ROUTE_READY},
    {"/metrics", "GET", ROUTE_METRICS},
    {"/v1/models", "GET", ROUTE_MODELS},
    {"/v1/completions", "POST", ROUTE_COMPLETIONS},
    {"/completions", "POST", ROUTE_COMPLETIONS},
    {"/v1/chat/completions", "POST", ROUTE_CHAT},
    {"/chat/completions", "POST", ROUTE_CHAT},
    {"/v1/generate", "POST", ROUTE_GENERATE},
    {"/v1/batch_generate", "POST", ROUTE_BATCH},
    {"/v1/generate_stream", "GET", ROUTE_GENERATE_STREAM},
    {"/tokenize", "POST", ROUTE_TOKENIZE},
    {"/detokenize", "POST", ROUTE_DETOKENIZE},
    {"/v1/alerts", "GET", ROUTE_ALERTS},
    {"/alerts", "GET", ROUTE_ALERTS},
    {"/v1/stats", "GET", ROUTE_STATS},
    {"/dashboard", "GET", ROUTE_DASHBOARD},
    {"/admin/drain", "POST", ROUTE_DRAIN},
};

/* Routes open without an API key: probes, and the read-only operational views (no prompt or output in them). */
static bool route_is_open(enum api_route r)
{
    return r == ROUTE_HEALTH || r == ROUTE_READY || r == ROUTE_METRICS || r == ROUTE_ALERTS || r == ROUTE_STATS ||
           r == ROUTE_DASHBOARD || r == ROUTE_DRAIN; /* /admin/drain checks the admin keys itself */
}

static const struct route_row model_one_row = {"/v1/models/", "GET", ROUTE_MODEL_ONE};

static void respond_unauthorized(struct server *srv, struct http_conn *c, const struct http_request *req,
                                 enum api_route route)
{
    api_respond_error(srv, c, route, 401, ERR_AUTH, NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                      "%s", http_request_header(req, "authorization") || http_request_header(req, "x-api-key")
                                ? "Incorrect API key provided"
                                : "Missing API key: send 'Authorization: Bearer <key>'");
}

static void on_request(void *ctx, struct http_conn *c, const struct http_request *req)
{
    struct server *srv = ctx;
    api_cors_begin(srv, req);
    const struct route_row *row = NULL;
    bool path_known = false;
    const char *one = NULL;
    size_t one_len = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (path_is(req, routes[i].path)) {
            path_known = true;
            if (method_is(req, routes[i].method) ||
                (method_is(req, "HEAD") && !strcmp(routes[i].method, "GET") &&
                 routes[i].route != ROUTE_GENERATE_STREAM)) /* HEAD never starts a generation */
                row = &routes[i];
        }
    if (!path_known && req->path_len > 11 && !memcmp(req->path, "/v1/models/", 11)) {
        path_known = true;
        one = req->path + 11;
        one_len = req->path_len - 11;
        if (method_is(req, "GET") || method_is(req, "HEAD"))
            row = &model_one_row;
    }
    if (api_jobs_path(req) && !method_is(req, "OPTIONS")) {
        if (!auth_ok(srv, req)) {
            respond_unauthorized(srv, c, req, ROUTE_FILES);
            return;
        }
        api_jobs_handle(srv, c, req);
        return;
    }
    path_known |= api_jobs_path(req);
    if (method_is(req, "OPTIONS") && path_known) {
        char h[768];
        snprintf(h, sizeof h,
                 "%sAccess-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
                 "Access-Control-Allow-Headers: Authorization, Content-Type, X-Api-Key\r\n"
                 "Access-Control-Max-Age: 600\r\n",
                 api_cors_headers());
        http_respond(c, 204, NULL, h, "", 0);
        metrics_request(srv->metrics, "other", 204);
        return;
    }
    if (!path_known) {
        api_respond_error(srv, c, ROUTE_COUNT_, 404, ERR_NOT_FOUND, NULL, "not_found", NULL,
                          "Unknown route %.*s %.*s (see docs/api.md)", (int)req->method_len, req->method,
                          (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
        return;
    }
    if (!row) {
        const char *allow = "GET, HEAD";
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
            if (path_is(req, routes[i].path) && !strcmp(routes[i].method, "POST"))
                allow = "POST";
        char h[64];
        snprintf(h, sizeof h, "Allow: %s\r\n", allow);
        api_respond_error(srv, c, ROUTE_COUNT_, 405, ERR_METHOD, NULL, "method_not_allowed", h,
                          "Method %.*s is not allowed on %.*s; use %s", (int)req->method_len, req->method,
                          (int)req->path_len, req->path, allow);
        return;
    }
    enum api_route route = row->route;
    if (!route_is_open(route) && !auth_ok(srv, req)) {
        respond_unauthorized(srv, c, req, route);
        return;
    }
    if (method_is(req, "POST")) {
        const struct http_header *ct = http_request_header(req, "content-type");
        /* JSON bodies only; curl -d labels JSON as a form, which is accepted when it is a JSON object */
        bool form_json = ct && ct->value_len >= 33 &&
                         !strncasecmp(ct->value, "application/x-www-form-urlencoded", 33) && req->body_len &&
                         req->body[0] == '{';
        if (ct && !form_json && !(ct->value_len >= 16 && !strncasecmp(ct->value, "application/json", 16)) &&
            !(ct->value_len >= 10 && !strncasecmp(ct->value, "text/plain", 10))) {
            api_respond_error(srv, c, route, 415, ERR_MEDIA_TYPE, NULL, NULL, NULL,
                              "Unsupported Content-Type '%.*s': send the body as JSON with Content-Type: "
                              "application/json",
                              (int)(ct->value_len > 100 ? 100 : ct->value_len), ct->value);
            return;
        }
    }
    int state = atomic_load(&srv->state);
    bool needs_model = !route_is_open(route) && route != ROUTE_MODELS && route != ROUTE_MODEL_ONE;
    if (needs_model && state != SERVER_READY) {
        api_respond_error(srv, c, route, 503, ERR_UNAVAILABLE, NULL, NULL, "Retry-After: 5\r\n",
                          state == SERVER_LOADING ? "the model is still loading; retry shortly"
                                                  : "the server is shutting down");
        return;
    }
    switch (route) {
    case ROUTE_HEALTH: api_health(srv, c); break;
    case ROUTE_READY: api_ready(srv, c); break;
    case ROUTE_METRICS: api_metrics(srv, c); break;
    case ROUTE_MODELS: api_models(srv, c, NULL, 0); break;
    case ROUTE_MODEL_ONE: api_models(srv, c, one, one_len); break;
    /* everything that parses a body is prepared on a worker, never here */
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT: api_call_begin(srv, c, req, route, api_completions); break;
    case ROUTE_GENERATE: api_call_begin(srv, c, req, route, api_generate); break;
    case ROUTE_BATCH: api_call_begin(srv, c, req, route, api_batch_generate); break;
    case ROUTE_GENERATE_STREAM: api_call_begin(srv, c, req, route, api_generate_stream); break;
    case ROUTE_TOKENIZE: api_call_begin(srv, c, req, route, api_tokenize); break;
    case ROUTE_DETOKENIZE: api_call_begin(srv, c, req, route, api_detokenize); break;
    /* bounded: a fixed set of rules and measures, a window of at most the kept history */
    case ROUTE_ALERTS: api_alerts(srv, c); break;
    case ROUTE_STATS: api_stats(srv, c, req); break;
    case ROUTE_DASHBOARD: api_dashboard(srv, c); break;
    case ROUTE_DRAIN: api_drain(srv, c, req); break;
    default: break;
    }
}

static void on_close(void *ctx, struct http_conn *c)
{
    (void)ctx;
    struct api_call *call = http_conn_data(c);
    if (!call)
        return;
    call->conn = NULL;
    http_conn_set_data(c, NULL);
    api_call_finish(call); /* cancels its requests: the engine drops them at its next step */
}

/* systemd's watchdog (off outside systemd): pinged by the wait loop in server_run while on_wake answers */
static struct sd_watchdog watchdog;

static void on_wake(void *ctx)
{
    struct server *srv = ctx;
    sd_watchdog_beat(&watchdog);
    server_apply_reload(srv);
    workpool_complete(srv->pool); /* prepared requests and built answers: admit and send them */
    api_jobs_pump(srv);           /* batch lines handed over: begun (prepared on a worker) or cancelled */
    for (struct api_call *call = srv->calls, *next; call; call = next) {
        next = call->next; /* pumping may finish (free) the call */
        api_call_pump(call);
    }
}

static size_t body_limit(void *ctx, const struct http_request *req) { return api_jobs_body_limit(ctx, req); }

static void on_writable(void *ctx, struct http_conn *c)
{
    (void)ctx;
    struct api_call *call = http_conn_data(c);
    if (call)
        api_call_pump(call);
}

/* Errors the HTTP layer answered itself (malformed requests, timeouts, limits): counted and logged, since
 * no handler saw them. */
static void on_http_error(void *ctx, const char *peer, int status, const char *message)
{
    struct server *srv = ctx;
    metrics_http_error(srv->metrics, status);
    log_info("http %d to %s: %s", status, peer, message);
}

/* ---------------------------------------------------------------- lifetime */

struct io_thread_arg {
    struct http_server *http;
    int rc;
};

static void *io_thread(void *arg)
{
    struct io_thread_arg *a = arg;
    a->rc = http_server_run(a->http);
    return NULL;
}

static void notify_io(void *ctx)
{
    struct server *srv = ctx;
    http_server_wake(srv->http);
}

/* Loads the model and starts the engine; messages name the config origin of a bad model path. */
static int server_load(struct server *srv)
{
    struct server_config *cfg = srv->cfg;
    char err[ERR_MSG_MAX];
    const char *origin = cfg->model_path_origin ? cfg->model_path_origin : "--model";
    int64_t t0 = clock_now_ns();
    struct engine_opts eo;
    engine_opts_default(&eo);
    eo.backend = cfg->backend;
    srv->model = engine_model_load(cfg->model_path, cfg->use_mmap, &eo, err);
    if (!srv->model) {
        log_error("%s: cannot load model '%s': %s", origin, cfg->model_path, err);
        return 1;
    }
    const struct model_hparams *hp = &srv->model->hp;
    eo.n_threads = cfg->threads;
    eo.n_ctx = cfg->ctx_size;
    eo.n_ctx_cap = 4096;
    eo.max_seqs = cfg->max_batch_size;
    eo.max_batch_tokens = cfg->prefill_chunk + cfg->max_batch_size;
    eo.kv_bytes = (size_t)cfg->kv_memory;
    struct engine_params ep;
    if (engine_params_for_model(srv->model, &eo, &ep, err) || !(srv->engine = engine_create(srv->model, &ep, err))) {
        log_error("cannot create the engine: %s", err);
        return 1;
    }
    srv->n_ctx = engine_params_get(srv->engine)->n_ctx;
    srv->max_response = cfg->max_response > 0 ? cfg->max_response : (int64_t)srv->n_ctx * 4096;
    if (srv->max_response < ((int64_t)4 << 20) && cfg->max_response <= 0)
        srv->max_response = (int64_t)4 << 20;
    const struct kv_pool_params *kp = kv_pool_params(engine_kv(srv->engine));
    int64_t per_seq = (srv->n_ctx + kp->block_size - 1) / kp->block_size;
    if (kp->n_blocks < per_seq)
        log_warn("the KV cache (%lld blocks of %d positions) holds less than one full context (%d positions); "
                 "long requests will be refused: raise --kv-memory",
                 (long long)kp->n_blocks, kp->block_size, srv->n_ctx);
    struct sched_params sp;
    sched_params_default(&sp);
    sp.max_batch_size = cfg->max_batch_size;
    sp.max_queue = cfg->max_queue;
    sp.prefill_chunk = cfg->prefill_chunk;
    const char *spec = cfg->spec ? cfg->spec : cfg->draft_model_path ? "draft" : "off";
    sp.spec = !strcmp(spec, "ngram") ? SCHED_SPEC_NGRAM : !strcmp(spec, "draft") ? SCHED_SPEC_DRAFT : SCHED_SPEC_OFF;
    if (cfg->draft_model_path) {
        int64_t td = clock_now_ns();
        if (!(srv->draft_engine = engine_create_draft(cfg->draft_model_path, cfg->use_mmap, srv->engine, &eo,
                                                      &srv->draft_model, err))) {
            log_error("server.draft_model: %s", err);
            return 1;
        }
        sp.draft_engine = srv->draft_engine;
        log_info("draft model %s: %s, %d layers, dim %d, %s weights, loaded in %.0f ms", srv->draft_model->name,
                 srv->draft_model->hp.arch, srv->draft_model->hp.n_layers, srv->draft_model->hp.dim,
                 dtype_name(srv->draft_model->main_type), (double)(clock_now_ns() - td) / 1e6);
    }
    sp.draft_max = cfg->draft_max;
    sp.draft_min = cfg->draft_min;
    sp.draft_adaptive = !cfg->draft_fixed;
    struct sched_observer obs;
    metrics_sched_observer(srv->metrics, &obs);
    srv->sched = scheduler_create(srv->engine, srv->model->tok, &sp, &obs, notify_io, srv, err);
    srv->grammars = grammar_cache_create(64);
    if (!srv->sched || !srv->grammars || scheduler_start(srv->sched)) {
        log_error("cannot start the scheduler: %s", srv->sched ? "thread creation failed" : err);
        return 1;
    }
    observe_set_scheduler(srv->obs, srv->sched);
    /* chat template: --chat-template beats the GGUF's */
    srv->chat = CHAT_NONE;
    if (cfg->chat_template) {
        if (chat_family_from_name(cfg->chat_template, &srv->chat)) {
            log_error("--chat-template: unknown template '%s' (known: %s)", cfg->chat_template, chat_family_list());
            return 1;
        }
    } else {
        srv->chat = chat_family_detect(srv->model->chat_template);
    }
    if (srv->chat == CHAT_NONE) {
        snprintf(srv->chat_err, sizeof srv->chat_err,
                 "this model has %s; start the server with --chat-template NAME (one of: %s), or use "
                 "/v1/completions",
                 srv->model->chat_template ? "a chat template wafer does not recognize"
                                           : "no chat template (tokenizer.chat_template is absent)",
                 chat_family_list());
        log_warn("chat: %s", srv->chat_err);
    }
    const struct tokenizer *tok = srv->model->tok;
    const char *bos = tokenizer_bos(tok) >= 0 ? tokenizer_token_text(tok, tokenizer_bos(tok)) : NULL;
    const char *eos = tokenizer_eos(tok) >= 0 ? tokenizer_token_text(tok, tokenizer_eos(tok)) : NULL;
    srv->bos_text = strdup(bos ? bos : "<s>");
    srv->eos_text = strdup(eos ? eos : "</s>");
    srv->created = (int64_t)time(NULL);
    struct backend_desc bd;
    engine_describe(srv->engine, &bd);
    /* the KV cache's size in the log: its pages are touched as the prefix cache fills the pool, so a
     * resident size growing up to this is expected (scripts/soak.py tells it apart from other growth) */
    log_info("model %s (%s, %d layers, dim %d, %s) %s in %.0f ms: context %d, %d slots, %lld KV blocks of %d "
             "(%.1f MiB), prefill chunk %d, %d compute threads, backend %s, chat template %s",
             cfg->model_name, hp->arch, hp->n_layers, hp->dim, dtype_name(srv->model->main_type),
             srv->model->mapped ? "mapped" : "read into memory", (double)(clock_now_ns() - t0) / 1e6, srv->n_ctx, cfg->max_batch_size, (long long)kp->n_blocks,
             kp->block_size, bd.kv_bytes / 1048576.0, cfg->prefill_chunk, engine_params_get(srv->engine)->n_threads,
             cfg->backend ? cfg->backend : "cpu", srv->chat == CHAT_NONE ? "none" : chat_family_name(srv->chat));
    return 0;
}

int server_run(struct server_config *cfg)
{
    struct server srv_s;
    memset(&srv_s, 0, sizeof srv_s);
    struct server *srv = &srv_s;
    srv->cfg = cfg;
    gen_defaults_init(&srv->defaults);
    srv->defaults.max_new_tokens = cfg->max_new_tokens;
    srv->defaults.temperature = cfg->temperature;
    srv->defaults.top_p = cfg->top_p;
    srv->defaults.top_k = cfg->top_k;
    srv->defaults.min_p = cfg->min_p;
    srv->defaults.repeat_penalty = cfg->repeat_penalty;
    srv->defaults.parse_special = cfg->parse_special;
    atomic_init(&srv->state, SERVER_LOADING);
    budget_init(&srv->inflight, cfg->max_inflight);
    enum log_level level;
    if (cfg->log_level && log_level_from_name(cfg->log_level, &level) == 0)
        log_level_set(level);
    /* Allocations from 256 KiB up (request bodies, answers, token arrays) get their own mappings, returned to
     * the system when freed, instead of a heap top that may never shrink; glibc's default threshold grows
     * after each large free, which is what kept RSS gigabytes high after one large /tokenize answer. */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    int rc = 1;

    struct stat st;
    if (stat(cfg->model_path, &st) != 0 || !S_ISREG(st.st_mode)) {
        log_error("%s: cannot open model file '%s': %s", cfg->model_path_origin ? cfg->model_path_origin : "--model",
                  cfg->model_path, errno ? strerror(errno) : "not a regular file");
        return 1;
    }
    /* Signals are taken synchronously by the main thread: block them before any thread starts. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP); /* reload, never a stop: its default action would kill the process */
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!cfg->model_name) {
        const char *base = strrchr(cfg->model_path, '/');
        base = base ? base + 1 : cfg->model_path;
        size_t n = strlen(base);
        if (n > 5 && !strcmp(base + n - 5, ".gguf"))
            n -= 5;
        cfg->model_name = strndup(base, n);
    }
    srv->metrics = metrics_create();
    if (!srv->metrics || !cfg->model_name) {
        log_error("out of memory");
        return 1;
    }
    struct http_server_params hp;
    http_server_params_default(&hp);
    hp.host = cfg->host;
    hp.port = cfg->port;
    hp.max_connections = cfg->max_connections;
    hp.max_body_bytes = (size_t)cfg->max_body;
    hp.header_timeout_ms = (int)(cfg->header_timeout * 1000);
    hp.body_timeout_ms = (int)(cfg->body_timeout * 1000);
    hp.on_request = on_request;
    hp.on_close = on_close;
    hp.on_wake = on_wake;
    hp.on_writable = on_writable;
    hp.body_limit = body_limit;
    hp.on_error = on_http_error;
    hp.body_budget = &srv->inflight;
    hp.ctx = srv;
    char err[ERR_MSG_MAX];
    srv->http = http_server_create(&hp, err);
    if (!srv->http) {
        log_error("%s", err); /* err names the address */
        metrics_destroy(srv->metrics);
        return 1;
    }
    srv->pool = workpool_create(cfg->workers, notify_io, srv, err);
    if (!srv->pool) {
        log_error("cannot start the request workers: %s", err);
        http_server_destroy(srv->http);
        metrics_destroy(srv->metrics);
        return 1;
    }
    char self_url[320];
    snprintf(self_url, sizeof self_url, "http://%s:%d", cfg->host, http_server_port(srv->http));
    srv->obs = observe_create(cfg, srv->metrics, self_url, err);
    if (!srv->obs || observe_start(srv->obs)) {
        log_error("%s", srv->obs ? "cannot start the observability thread" : err);
        observe_destroy(srv->obs);
        workpool_destroy(srv->pool);
        http_server_destroy(srv->http);
        metrics_destroy(srv->metrics);
        return 1;
    }
    struct io_thread_arg io = {.http = srv->http, .rc = 0};
    pthread_t io_tid;
    if (pthread_create(&io_tid, NULL, io_thread, &io)) {
        log_error("cannot start the I/O thread");
        workpool_destroy(srv->pool);
        observe_destroy(srv->obs);
        http_server_destroy(srv->http);
        metrics_destroy(srv->metrics);
        return 1;
    }
    log_info("listening on http://%s:%d (loading %s)", cfg->host, http_server_port(srv->http), cfg->model_path);

    bool load_failed = server_load(srv) != 0 || api_jobs_start(srv) != 0;
    if (!load_failed) {
        atomic_store(&srv->state, SERVER_READY);
        log_info("ready: http://%s:%d/v1 serves '%s'", cfg->host, http_server_port(srv->http), cfg->model_name);
        if (sd_notify_send("READY=1\nSTATUS=serving") < 0)
            log_warn("cannot send READY=1 to NOTIFY_SOCKET '%s'", getenv("NOTIFY_SOCKET"));
        sd_watchdog_init(&watchdog);
    }

    /* Wait for a signal; then drain: refuse new work, let the requests in flight finish. */
    int64_t drain_deadline = 0;
    bool stop_sent = false;
    for (;;) {
        if (load_failed && !stop_sent) {
            http_server_stop(srv->http, 0);
            stop_sent = true;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000000L};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (!stop_sent && sd_watchdog_tick(&watchdog))
            http_server_wake(srv->http); /* its on_wake beats: proof the I/O loop turns for the next ping */
        if (sig == SIGHUP && !stop_sent)
            server_request_reload(srv);
        if (sig == SIGTERM || sig == SIGINT) {
            if (atomic_load(&srv->state) != SERVER_DRAINING && !load_failed) {
                api_jobs_stop(srv); /* batch lines in flight go back to the store: they are not drained */
                atomic_store(&srv->state, SERVER_DRAINING);
                sd_notify_send("STOPPING=1");
                if (srv->sched)
                    scheduler_drain(srv->sched);
                drain_deadline = clock_now_ns() + (int64_t)(cfg->drain_timeout * 1e9);
                log_info("%s: draining %d request(s) for up to %.0f s (signal again to stop now)",
                         sig == SIGTERM ? "SIGTERM" : "SIGINT", atomic_load(&srv->n_inflight), cfg->drain_timeout);
            } else {
                drain_deadline = clock_now_ns(); /* second signal: stop now */
            }
        }
        if (stop_sent) {
            if (pthread_tryjoin_np(io_tid, NULL) == 0)
                break;
            continue;
        }
        if (atomic_load(&srv->state) == SERVER_DRAINING &&
            (atomic_load(&srv->n_inflight) == 0 || clock_now_ns() >= drain_deadline)) {
            if (atomic_load(&srv->n_inflight) > 0) {
                log_warn("drain timeout: cancelling %d request(s) still in flight", atomic_load(&srv->n_inflight));
                scheduler_cancel_all(srv->sched, ERR_UNAVAILABLE);
            }
            /* give cancelled streams a moment to be told, then close everything */
            http_server_stop(srv->http, atomic_load(&srv->n_inflight) > 0 ? 1000 : 0);
            stop_sent = true;
        }
    }
    rc = load_failed || io.rc ? 1 : 0;
    struct workpool *pool = srv->pool;
    srv->pool = NULL; /* nothing more is queued (no trim after the last calls) */
    workpool_destroy(pool); /* the work still queued runs; its calls, whose clients are gone, end */
    observe_destroy(srv->obs); /* its thread reads the scheduler */
    srv->obs = NULL;
    scheduler_destroy(srv->sched); /* before the calls go: requests still queued end with "unavailable" */
    srv->sched = NULL;
    while (srv->calls) {
        srv->calls->conn = NULL;
        api_call_finish(srv->calls);
    }
    api_jobs_close(srv);
    http_server_destroy(srv->http);
    grammar_cache_destroy(srv->grammars); /* requests hold their own references */
    engine_destroy(srv->engine);
    model_destroy(srv->model);
    engine_destroy(srv->draft_engine);
    model_destroy(srv->draft_model);
    metrics_destroy(srv->metrics);
    free(srv->bos_text);
    free(srv->eos_text);
    struct server_config *pending = atomic_exchange(&srv->reload, NULL);
    if (pending) {
        server_config_deinit(pending);
        free(pending);
    }
    log_info("stopped%s", rc ? " (with errors)" : "");
    return rc;
}
