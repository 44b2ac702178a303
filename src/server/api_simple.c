/*
 * api_simple: the simple generation API for scripts that do not want the OpenAI envelope.
 *
 *   POST /v1/generate {prompt, max_new_tokens, temperature, top_p, top_k, do_sample, stop_sequences, seed}
 *        -> {text, tokens (generated ids), finish_reason, usage}; with "stream": true it streams like below.
 *   POST /v1/batch_generate {requests: [...], common_params: {...}} -> {results: [...]} in request order,
 *        each result either {text, tokens, finish_reason, usage} or {error: {...}}.
 *   GET  /v1/generate_stream?prompt=...&max_new_tokens=... -> SSE: one event {"token": {"id", "text"}} per
 *        token, a last event {"finish_reason", "generated_text", "usage"}, then "data: [DONE]".
 */
#include "core/err.h"
#include "core/log.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *usage_of(const struct sched_req *r, const struct sched_req_status *st)
{
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(st->n_generated));
    json_object_set_new(u, "total_tokens", json_integer(r->n_prompt + st->n_generated));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(st->cached_tokens));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

/* The one choice of a simple request, read under the request's lock: new token events for a stream, and the
 * result once the request finished. */
struct simple_read {
    struct api_call *call;
    const struct sched_req *r;
    const struct sched_req_status *st; /* read before the choice: when finished, the choice is final */
    bool stream;
    json_t *result; /* {text, tokens, finish_reason, usage} (finished) or the last stream event */
};

static bool simple_read_choice(void *ctx, int c, const struct sched_choice *ch)
{
    struct simple_read *sr = ctx;
    struct api_call *call = sr->call;
    if (c > 0)
        return true; /* the simple API has one choice */
    if (sr->stream) {
        while (call->sent[0] < ch->n_toks) {
            if (http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
                return false;
            const struct sched_token *t = &ch->toks[call->sent[0]];
            size_t end = t->text_off + t->text_len;
            json_t *o = json_object(), *tok = json_object();
            json_object_set_new(tok, "id", json_integer(t->id));
            json_object_set_new(tok, "text", api_json_text(ch->text + call->sent_text[0], end - call->sent_text[0]));
            json_object_set_new(o, "token", tok);
            api_sse_send(call->conn, o);
            call->sent_text[0] = end > call->sent_text[0] ? end : call->sent_text[0];
            call->sent[0]++;
        }
    }
    if (!sr->st->finished || sr->st->error)
        return true;
    json_t *o = json_object();
    const char *fin = api_finish_name(ch->finish);
    if (sr->stream) {
        size_t rest = ch->text_len - call->sent_text[0];
        if (rest) { /* bytes released only at the end (held for a possible stop string) */
            json_t *tok = json_object();
            json_object_set_new(tok, "id", json_null());
            json_object_set_new(tok, "text", api_json_text(ch->text + call->sent_text[0], rest));
            json_object_set_new(o, "token", tok);
        }
        json_object_set_new(o, "finish_reason", json_string(fin ? fin : "length"));
        json_object_set_new(o, "generated_text", api_json_text(ch->text ? ch->text : "", ch->text_len));
    } else {
        json_object_set_new(o, "text", api_json_text(ch->text ? ch->text : "", ch->text_len));
        json_t *ids = json_array();
        for (int t = 0; t < ch->n_toks; t++)
            json_array_append_new(ids, json_integer(ch->toks[t].id));
        json_object_set_new(o, "tokens", ids);
        json_object_set_new(o, "finish_reason", json_string(fin ? fin : "length"));
    }
    json_object_set_new(o, "usage", usage_of(sr->r, sr->st));
    sr->result = o;
    return true;
}

/* {text, tokens, finish_reason, usage} or {error} of a finished request. */
static json_t *result_json(struct api_call *call, struct sched_req *r)
{
    struct sched_req_status st;
    sched_req_status_get(r, &st);
    if (st.error)
        return api_error_json(st.error, NULL, NULL, st.errmsg);
    struct simple_read sr = {.call = call, .r = r, .st = &st};
    sched_req_read(r, simple_read_choice, &sr);
    return sr.result ? sr.result : json_object();
}

static void simple_stream_pump(struct api_call *call)
{
    struct sched_req *r = call->reqs[0];
    struct sched_req_status st;
    sched_req_status_get(r, &st);
    struct simple_read sr = {.call = call, .r = r, .st = &st, .stream = true};
    if (!sched_req_read(r, simple_read_choice, &sr) || !st.finished)
        return;
    if (st.error)
        api_sse_send(call->conn, api_error_json(st.error, NULL, NULL, st.errmsg));
    else
        api_sse_send(call->conn, sr.result ? sr.result : json_object());
    api_call_stream_end(call, st.error ? err_http_status(st.error) : 200);
}

/* The answer of a finished non-streaming call, built on a worker (api_call_defer). */
static void simple_answer(struct api_call *call)
{
    if (call->route == ROUTE_GENERATE) {
        struct sched_req_status st;
        sched_req_status_get(call->reqs[0], &st);
        if (st.error)
            api_call_respond_error(call, st.error, st.errmsg);
        else
            api_call_respond_json(call, result_json(call, call->reqs[0]));
        return;
    }
    /* batch: every item in request order, each with its own result or error */
    json_t *results = json_array();
    for (int i = 0; i < call->n_reqs; i++) {
        if (!call->reqs[i]) {
            const struct api_error *e = &call->item_errs[i];
            json_array_append_new(results, api_error_json(e->code, e->param, e->oa_code, e->message));
            continue;
        }
        json_array_append_new(results, result_json(call, call->reqs[i]));
    }
    json_t *o = json_object();
    json_object_set_new(o, "results", results);
    api_call_respond_json(call, o);
}

static void simple_pump(struct api_call *call)
{
    if (call->stream) {
        simple_stream_pump(call);
        return;
    }
    for (int i = 0; i < call->n_reqs; i++) {
        if (!call->reqs[i])
            continue;
        struct sched_req_status st;
        sched_req_status_get(call->reqs[i], &st);
        if (!st.finished)
            return;
    }
    api_call_defer(call, simple_answer);
}

/* Tokenizes, checks the context and builds the scheduler request of one simple-API item. */
static struct sched_req *simple_prepare(struct server *srv, const struct gen_request *g, struct api_error *e)
{
    if (!api_model_ok(srv, g->model, e))
        return NULL;
    int n_toks = 0, max_tokens = 0;
    int32_t *toks = api_tokenize_prompt(srv, &g->prompts[0], g->parse_special, "prompt", &n_toks, e);
    if (!toks)
        return NULL;
    struct sched_req *r = NULL;
    if (api_check_context(srv, n_toks, g->max_tokens, &max_tokens, e)) {
        if (!strcmp(e->param, "max_tokens"))
            snprintf(e->param, sizeof e->param, "max_new_tokens");
    } else {
        r = api_make_sched_req(srv, g, toks, n_toks, max_tokens, e);
    }
    free(toks);
    return r;
}

static void simple_start(struct api_call *call)
{
    if (call->stream)
        api_call_stream_begin(call);
}

/* Prepares the one request of /v1/generate or /v1/generate_stream. */
static void prepare_single(struct api_call *call, struct gen_request *g)
{
    struct api_error e;
    call->kind = API_GENERATE;
    call->pump = simple_pump;
    call->start = simple_start;
    call->stream = g->stream;
    if (!api_call_set_reqs(call, 1)) {
        api_call_respond_error(call, ERR_NOMEM, "out of memory");
        return;
    }
    call->reqs[0] = simple_prepare(call->srv, g, &e);
    if (!call->reqs[0] || !api_reserve_generation(call, &e))
        api_call_fail(call, &e);
}

void api_generate(struct api_call *call)
{
    struct gen_request g;
    struct api_error e;
    if (request_parse(API_GENERATE, call->req->body, call->req->body_len, &call->srv->defaults, &g, &e)) {
        api_call_fail(call, &e);
        return;
    }
    prepare_single(call, &g);
    gen_request_deinit(&g);
}

void api_generate_stream(struct api_call *call)
{
    struct gen_request g;
    struct api_error e;
    const struct http_request *req = call->req;
    if (request_parse_query(req->query, req->query ? req->query_len : 0, &call->srv->defaults, &g, &e)) {
        api_call_fail(call, &e);
        return;
    }
    g.stream = true;
    prepare_single(call, &g);
    gen_request_deinit(&g);
}

void api_batch_generate(struct api_call *call)
{
    struct server *srv = call->srv;
    struct gen_request *items;
    struct api_error *errs, e;
    int n;
    if (request_parse_batch(call->req->body, call->req->body_len, &srv->defaults, &items, &errs, &n, &e)) {
        api_call_fail(call, &e);
        return;
    }
    call->kind = API_GENERATE;
    call->pump = simple_pump;
    if (!api_call_set_reqs(call, n)) {
        gen_request_batch_free(items, errs, n);
        api_call_respond_error(call, ERR_NOMEM, "out of memory");
        return;
    }
    call->item_errs = errs; /* the call owns the per-item errors now */
    for (int i = 0; i < n; i++) {
        if (errs[i].code)
            continue;
        if (items[i].stream) {
            api_error_set(&errs[i], ERR_UNSUPPORTED, "stream", NULL, "items of a batch cannot stream");
            continue;
        }
        call->reqs[i] = simple_prepare(srv, &items[i], &errs[i]);
        if (!call->reqs[i] && errs[i].param[0] && strncmp(errs[i].param, "requests[", 9)) {
            char p[2 * sizeof errs[i].param];
            snprintf(p, sizeof p, "requests[%d].%s", i, errs[i].param);
            size_t pl = strnlen(p, sizeof errs[i].param - 1);
            memcpy(errs[i].param, p, pl);
            errs[i].param[pl] = 0;
        }
    }
    gen_request_batch_free(items, NULL, n);
    if (!api_reserve_generation(call, &e))
        api_call_fail(call, &e);
}
