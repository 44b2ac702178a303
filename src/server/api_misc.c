/*
 * api_misc: the small endpoints.
 *   GET  /health      liveness: {"status":"ok"} whenever the process answers
 *   GET  /ready       readiness: 200 {"status":"ready"}, or 503 {"status":"loading"|"draining"}
 *   GET  /metrics     Prometheus text (metrics.h)
 *   POST /tokenize    {content, add_special, with_pieces} -> {tokens: [ids] | [{id, piece}]}
 *   POST /detokenize  {tokens: [ids]} -> {content}
 */
#include "core/err.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"

#include <stdlib.h>
#include <string.h>

void api_health(struct server *srv, struct http_conn *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string("ok"));
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

void api_tokenize(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    struct gen_request g;
    struct api_error e;
    if (request_parse(API_TOKENIZE, req->body, req->body_len, &srv->defaults, &g, &e)) {
        api_respond_api_error(srv, c, ROUTE_TOKENIZE, &e);
        return;
    }
    if (!api_model_ok(srv, g.model, &e)) {
        gen_request_deinit(&g);
        api_respond_api_error(srv, c, ROUTE_TOKENIZE, &e);
        return;
    }
    const struct tokenizer *tok = srv->model->tok;
    const char *text = g.prompts[0].text;
    int32_t *ids;
    int n = tokenizer_encode_alloc(tok, text, strlen(text), g.add_special, true, &ids);
    if (n < 0) {
        gen_request_deinit(&g);
        api_respond_error(srv, c, ROUTE_TOKENIZE, 0, n, "content", NULL, NULL, "cannot tokenize: %s", err_name(n));
        return;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        if (g.with_pieces) {
            char piece[256];
            int m = tokenizer_token_to_piece(tok, ids[i], true, piece, sizeof piece);
            json_t *o = json_object();
            json_object_set_new(o, "id", json_integer(ids[i]));
            json_object_set_new(o, "piece", api_json_text(piece, m > 0 && m <= (int)sizeof piece ? (size_t)m : 0));
            json_array_append_new(arr, o);
        } else {
            json_array_append_new(arr, json_integer(ids[i]));
        }
    }
    free(ids);
    gen_request_deinit(&g);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", arr);
    api_respond_json(srv, c, ROUTE_TOKENIZE, 200, o);
}

void api_detokenize(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    struct gen_request g;
    struct api_error e;
    if (request_parse(API_DETOKENIZE, req->body, req->body_len, &srv->defaults, &g, &e)) {
        api_respond_api_error(srv, c, ROUTE_DETOKENIZE, &e);
        return;
    }
    if (!api_model_ok(srv, g.model, &e)) {
        gen_request_deinit(&g);
        api_respond_api_error(srv, c, ROUTE_DETOKENIZE, &e);
        return;
    }
    const struct tokenizer *tok = srv->model->tok;
    int n_vocab = tokenizer_n_vocab(tok);
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    struct detok_stream ds = {0};
    for (int i = 0; out && i < g.n_tokens; i++) {
        if (g.tokens[i] >= n_vocab) {
            free(out);
            int id = g.tokens[i];
            gen_request_deinit(&g);
            api_respond_error(srv, c, ROUTE_DETOKENIZE, 400, ERR_INVALID_ARG, "tokens", NULL, NULL,
                              "'tokens[%d]' = %d is outside the vocabulary [0, %d)", i, id, n_vocab);
            return;
        }
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
        api_respond_error(srv, c, ROUTE_DETOKENIZE, 503, ERR_NOMEM, NULL, NULL, NULL, "out of memory");
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", api_json_text(out, len));
    free(out);
    api_respond_json(srv, c, ROUTE_DETOKENIZE, 200, o);
}
