/*
 * api_misc: the small endpoints.
 *   GET  /health      liveness: {"status":"ok"} whenever the process answers
 *   GET  /ready       readiness: 200 {"status":"ready"}, or 503 {"status":"loading"|"draining"}
 *   GET  /metrics     Prometheus text (metrics.h)
 *   POST /admin/drain the drain of SIGTERM, asked over HTTP (behind auth.admin_keys, else loopback only)
 *   POST /tokenize    {content, add_special, parse_special, with_pieces} or {messages, add_generation_prompt,
 *                     with_pieces} -> {tokens: [ids] | [{id, piece}]}
 *   POST /detokenize  {tokens: [ids]} -> {content}
 * /tokenize and /detokenize run on a worker (api_call_begin): their answers are as large as the body allows,
 * so they are bounded by server.max_response before they are built, and written with the streaming JSON
 * writer (no tree of millions of small objects to build and free).
 */
#include "core/err.h"
#include "core/json_writer.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"

#include "core/log.h"
#include "core/version.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Bytes of a /tokenize answer per token: an id with its comma, and for with_pieces the object around the
 * piece (the piece's own bytes are added; escapes are rare in pieces). */
#define API_TOKENIZE_ID_BYTES 8
#define API_TOKENIZE_PIECE_BYTES 20

void api_health(struct server *srv, struct http_conn *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string("ok"));
    json_object_set_new(o, "version", json_string(version_get()));
    json_object_set_new(o, "commit", json_string(version_commit_get()));
    api_respond_json(srv, c, ROUTE_HEALTH, 200, o);
}

void api_ready(struct server *srv, struct http_conn *c)
{
    int st = atomic_load(&srv->state);
    json_t *o = json_object();
    json_object_set_new(o, "status",
                        json_string(st == SERVER_READY ? "ready" : st == SERVER_LOADING ? "loading" : "draining"));
    api_respond_json(srv, c, ROUTE_READY, st == SERVER_READY ? 200 : 503, o);
}

static bool admin_key_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen > blen ? alen : blen; /* constant time in the key length */
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)((i < alen ? (unsigned char)a[i] : 0) ^ (i < blen ? (unsigned char)b[i] : 0));
    return diff == 0;
}

void api_drain(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    const struct server_config *cfg = srv->cfg;
    if (cfg->n_admin_keys == 0) {
        const char *peer = http_conn_peer(c);
        if (!peer || (strncmp(peer, "127.", 4) && strncmp(peer, "[::1]", 5) && strncmp(peer, "::1", 3) &&
                      strncmp(peer, "[::ffff:127.", 12))) {
            api_respond_error(srv, c, ROUTE_DRAIN, 403, ERR_AUTH, NULL, "admin_loopback_only", NULL,
                              "POST /admin/drain is open to loopback clients only when no auth.admin_keys are set");
            return;
        }
    } else {
        const struct http_header *h = http_request_header(req, "authorization");
        const char *v = h ? h->value : "";
        size_t vl = h ? h->value_len : 0;
        if (vl >= 7 && !strncasecmp(v, "Bearer ", 7))
            v += 7, vl -= 7;
        bool ok = false;
        for (int i = 0; i < cfg->n_admin_keys; i++)
            ok |= admin_key_equal(v, vl, cfg->admin_keys[i], strlen(cfg->admin_keys[i]));
        if (!ok) {
            api_respond_error(srv, c, ROUTE_DRAIN, 401, ERR_AUTH, NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                              "%s", h ? "Incorrect admin key provided"
                                      : "POST /admin/drain needs 'Authorization: Bearer <one of auth.admin_keys>'");
            return;
        }
    }
    log_info("POST /admin/drain from %s: draining as on SIGTERM", http_conn_peer(c));
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string("draining"));
    api_respond_json(srv, c, ROUTE_DRAIN, 202, o);
    kill(getpid(), SIGTERM); /* taken by server_run's signal wait: the one drain path */
}

void api_metrics(struct server *srv, struct http_conn *c)
{
    struct metrics_gauges g;
    metrics_gauges_init(&g);
    observe_fill_gauges(srv->obs, &g);
    if (srv->sched) {
        struct sched_stats st;
        scheduler_stats(srv->sched, &st);
        g.running = st.running;
        g.waiting = st.waiting;
        g.kv_blocks_used = st.kv_blocks_used;
        g.kv_blocks_total = st.kv_blocks_total;
        g.prefix_cache_blocks = st.prefix_cache_blocks;
    }
    g.connections = http_server_connections(srv->http);
    g.ready = atomic_load(&srv->state) == SERVER_READY;
    /* count this scrape before rendering, so it sees itself */
    metrics_request(srv->metrics, "/metrics", 200);
    size_t len = 0;
    char *text = metrics_render(srv->metrics, &g, &len);
    if (!text) {
        static const char oom[] = "out of memory\n";
        http_respond(c, 503, "text/plain", api_cors_headers(), oom, sizeof oom - 1);
        return;
    }
    char *jobs = api_jobs_metrics_text(srv);
    if (jobs) {
        size_t jl = strlen(jobs);
        char *all = realloc(text, len + jl + 1);
        if (all) {
            memcpy(all + len, jobs, jl + 1);
            text = all;
            len += jl;
        }
        free(jobs);
    }
    http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", api_cors_headers(), text, len);
    free(text);
}

/* Hands the writer's JSON to the call as its 200 answer (or 500 when it failed). */
static void respond_writer(struct api_call *call, struct json_writer *w)
{
    size_t len = 0;
    char *body = json_writer_finish(w) == 0 ? json_writer_take(w, &len) : NULL;
    json_writer_deinit(w);
    api_call_respond_body(call, 200, body, len);
}

void api_tokenize(struct api_call *call)
{
    struct server *srv = call->srv;
    struct gen_request g;
    struct api_error e;
    if (request_parse(API_TOKENIZE, call->req->body, call->req->body_len, &srv->defaults, &g, &e)) {
        api_call_fail(call, &e);
        return;
    }
    if (!api_model_ok(srv, g.model, &e)) {
        gen_request_deinit(&g);
        api_call_fail(call, &e);
        return;
    }
    const struct tokenizer *tok = srv->model->tok;
    int32_t *ids = NULL;
    int n;
    if (g.n_messages) {
        if (srv->chat == CHAT_NONE) {
            api_error_set(&e, ERR_UNSUPPORTED, "messages", "chat_template_unavailable", "%s", srv->chat_err);
            gen_request_deinit(&g);
            api_call_fail(call, &e);
            return;
        }
        ids = api_tokenize_chat(srv, g.messages, g.n_messages, NULL, 0, g.add_generation_prompt, &n, &e);
        n = ids ? n : e.code;
    } else {
        const char *text = g.prompts[0].text;
        n = api_encode(srv, text, strlen(text), g.add_special, g.parse_special, NULL, 0, false, &ids, "content", &e);
    }
    if (n < 0) {
        gen_request_deinit(&g);
        api_call_fail(call, &e);
        return;
    }
    /* the answer's size is known before it is built: ids, and each piece as text */
    int64_t bytes = 32;
    for (int i = 0; i < n; i++) {
        bytes += API_TOKENIZE_ID_BYTES;
        if (g.with_pieces) {
            char piece[256];
            int m = tokenizer_token_to_piece(tok, ids[i], true, piece, sizeof piece);
            bytes += API_TOKENIZE_PIECE_BYTES + (m > 0 ? m : 0);
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%d tokens%s", n, g.with_pieces ? " with their pieces" : "");
    if (!api_reserve_answer(call, bytes, what, &e)) {
        snprintf(e.param, sizeof e.param, "%s", g.n_messages ? "messages" : "content");
        free(ids);
        gen_request_deinit(&g);
        api_call_fail(call, &e);
        return;
    }
    struct json_writer w;
    json_writer_init_buffer(&w, 0);
    json_writer_object_begin(&w);
    json_writer_key(&w, "tokens");
    json_writer_array_begin(&w);
    for (int i = 0; i < n; i++) {
        if (g.with_pieces) {
            char piece[256];
            int m = tokenizer_token_to_piece(tok, ids[i], true, piece, sizeof piece);
            json_writer_object_begin(&w);
            json_writer_key_int(&w, "id", ids[i]);
            json_writer_key(&w, "piece");
            json_writer_string_n(&w, piece, m > 0 && m <= (int)sizeof piece ? (size_t)m : 0);
            json_writer_object_end(&w);
        } else {
            json_writer_int(&w, ids[i]);
        }
    }
    json_writer_array_end(&w);
    json_writer_object_end(&w);
    free(ids);
    gen_request_deinit(&g);
    respond_writer(call, &w);
}

void api_detokenize(struct api_call *call)
{
    struct server *srv = call->srv;
    struct gen_request g;
    struct api_error e;
    if (request_parse(API_DETOKENIZE, call->req->body, call->req->body_len, &srv->defaults, &g, &e)) {
        api_call_fail(call, &e);
        return;
    }
    if (!api_model_ok(srv, g.model, &e)) {
        gen_request_deinit(&g);
        api_call_fail(call, &e);
        return;
    }
    const struct tokenizer *tok = srv->model->tok;
    int n_vocab = tokenizer_n_vocab(tok);
    /* the text's size first (a piece per id), so the answer is refused before it is built */
    int64_t bytes = 32;
    for (int i = 0; i < g.n_tokens; i++) {
        if (g.tokens[i] >= n_vocab) {
            api_error_set(&e, ERR_INVALID_ARG, "tokens", NULL, "'tokens[%d]' = %d is outside the vocabulary [0, %d)",
                          i, g.tokens[i], n_vocab);
            gen_request_deinit(&g);
            api_call_fail(call, &e);
            return;
        }
        char piece[256];
        int m = tokenizer_token_to_piece(tok, g.tokens[i], false, piece, sizeof piece);
        bytes += m > 0 ? m : 0;
    }
    char what[64];
    snprintf(what, sizeof what, "the text of %d tokens", g.n_tokens);
    if (!api_reserve_answer(call, bytes + bytes / 8, what, &e)) {
        snprintf(e.param, sizeof e.param, "tokens");
        gen_request_deinit(&g);
        api_call_fail(call, &e);
        return;
    }
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    struct detok_stream ds = {0};
    for (int i = 0; out && i < g.n_tokens; i++) {
        for (;;) {
            int m = tokenizer_stream_push(tok, &ds, g.tokens[i], false, out + len, (int)(cap - len));
            if (m >= 0 && (size_t)m <= cap - len) {
                len += (size_t)m;
                break;
            }
            char *no = realloc(out, cap * 2 + (size_t)(m > 0 ? m : 0));
            if (!no) {
                free(out);
                out = NULL;
                break;
            }
            out = no;
            cap = cap * 2 + (size_t)(m > 0 ? m : 0);
        }
    }
    if (out && cap - len < 8) {
        char *no = realloc(out, cap + 8);
        if (!no) {
            free(out);
            out = NULL;
        } else {
            out = no;
            cap += 8;
        }
    }
    if (out)
        len += (size_t)tokenizer_stream_flush(&ds, out + len, (int)(cap - len));
    gen_request_deinit(&g);
    if (!out) {
        api_call_respond_error(call, ERR_NOMEM, "out of memory");
        return;
    }
    struct json_writer w;
    json_writer_init_buffer(&w, 0);
    json_writer_object_begin(&w);
    json_writer_key(&w, "content");
    json_writer_string_n(&w, out, len);
    json_writer_object_end(&w);
    free(out);
    respond_writer(call, &w);
}
