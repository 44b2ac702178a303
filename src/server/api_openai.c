/*
 * api_openai: POST /v1/completions, POST /v1/chat/completions and GET /v1/models, in the shapes of the
 * OpenAI API so that its clients work unchanged.
 *
 * Streaming sends one SSE chunk per generated token that released text (tokens whose bytes are held back,
 * an incomplete UTF-8 sequence or a possible stop string, ride with a later chunk), a last chunk per choice
 * with its finish_reason, the usage chunk when stream_options.include_usage asks, then "data: [DONE]".
 * Text is streamed by byte offset, so bytes released only when a choice ends still reach the client.
 */
#include "core/err.h"
#include "core/log.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int token_piece(struct server *srv, int32_t id, char *buf, int cap)
{
    int n = tokenizer_token_to_piece(srv->model->tok, id, false, buf, cap);
    return n < 0 || n > cap ? 0 : n;
}

static json_t *token_bytes(const char *p, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* Appends the logprobs of token record t to the accumulating object lp (created on first use). */
static void logprobs_add(struct server *srv, struct api_call *call, const struct sched_choice *ch,
                         const struct sched_token *t, size_t text_offset, json_t **lp)
{
    char piece[256];
    int n = token_piece(srv, t->id, piece, sizeof piece);
    int n_top = call->logprobs > 0 ? call->logprobs : 0;
    if (call->route == ROUTE_CHAT) {
        if (!*lp) {
            *lp = json_object();
            json_object_set_new(*lp, "content", json_array());
        }
        json_t *e = json_object();
        json_object_set_new(e, "token", api_json_text(piece, (size_t)n));
        json_object_set_new(e, "logprob", json_real(t->logprob));
        json_object_set_new(e, "bytes", token_bytes(piece, n));
        json_t *tops = json_array();
        for (int k = 0; k < n_top && t->top_off >= 0; k++) {
            const struct sampler_logprob *s = &ch->top[t->top_off + k];
            char p2[256];
            int n2 = token_piece(srv, s->token, p2, sizeof p2);
            json_t *o = json_object();
            json_object_set_new(o, "token", api_json_text(p2, (size_t)n2));
            json_object_set_new(o, "logprob", json_real(s->logprob));
            json_object_set_new(o, "bytes", token_bytes(p2, n2));
            json_array_append_new(tops, o);
        }
        json_object_set_new(e, "top_logprobs", tops);
        json_array_append_new(json_object_get(*lp, "content"), e);
        return;
    }
    if (!*lp) {
        *lp = json_object();
        json_object_set_new(*lp, "tokens", json_array());
        json_object_set_new(*lp, "token_logprobs", json_array());
        json_object_set_new(*lp, "top_logprobs", n_top ? json_array() : json_null());
        json_object_set_new(*lp, "text_offset", json_array());
    }
    json_array_append_new(json_object_get(*lp, "tokens"), api_json_text(piece, (size_t)n));
    json_array_append_new(json_object_get(*lp, "token_logprobs"), json_real(t->logprob));
    json_array_append_new(json_object_get(*lp, "text_offset"), json_integer((json_int_t)text_offset));
    if (n_top) {
        json_t *tops = json_object();
        for (int k = 0; k < n_top && t->top_off >= 0; k++) {
            const struct sampler_logprob *s = &ch->top[t->top_off + k];
            char p2[256];
            int n2 = token_piece(srv, s->token, p2, sizeof p2);
            json_t *key = api_json_text(p2, (size_t)n2);
            json_object_set_new(tops, json_string_value(key), json_real(s->logprob));
            json_decref(key);
        }
        json_array_append_new(json_object_get(*lp, "top_logprobs"), tops);
    }
}

static json_t *usage_json(struct api_call *call)
{
    int prompt = 0, gen = 0, cached = 0;
    for (int i = 0; i < call->n_reqs; i++) {
        struct sched_req *r = call->reqs[i];
        if (!r)
            continue;
        struct sched_req_status st;
        sched_req_status_get(r, &st);
        prompt += r->n_prompt;
        cached += st.cached_tokens;
        gen += st.n_generated;
    }
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(gen));
    json_object_set_new(u, "total_tokens", json_integer(prompt + gen));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

static json_t *envelope(struct api_call *call, bool chunk)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(call->id));
    json_object_set_new(o, "object",
                        json_string(call->route == ROUTE_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                              : "text_completion"));
    json_object_set_new(o, "created", json_integer(call->created));
    json_object_set_new(o, "model", json_string(call->srv->cfg->model_name));
    json_object_set_new(o, "system_fingerprint", json_null());
    return o;
}

/* One streamed chunk for choice index k. text may be NULL (role-only or finish chunk). */
static int send_chunk(struct api_call *call, int k, const char *text, size_t len, bool role, const char *finish,
                      json_t *lp)
{
    json_t *o = envelope(call, true);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(k));
    if (call->route == ROUTE_CHAT) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (text || role)
            json_object_set_new(delta, "content", api_json_text(text ? text : "", text ? len : 0));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", api_json_text(text ? text : "", text ? len : 0));
    }
    json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    if (call->include_usage)
        json_object_set_new(o, "usage", json_null());
    return api_sse_send(call->conn, o);
}

/* Where a read of request i of a call is going. */
struct read_ctx {
    struct api_call *call;
    int i;
    json_t *choices; /* respond_full: the array being filled */
};

/* Streams what is new in choice c of request i: its tokens, then its finish chunk. false when it stopped
 * for backpressure (the rest goes at the next pump, from call->sent). */
static bool stream_choice(void *ctx, int c, const struct sched_choice *ch)
{
    struct read_ctx *rc = ctx;
    struct api_call *call = rc->call;
    int k = rc->i * call->n + c;
    while (call->sent[k] < ch->n_toks) {
        if (http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
            return false;
        const struct sched_token *t = &ch->toks[call->sent[k]];
        size_t end = t->text_off + t->text_len;
        json_t *lp = NULL;
        if (call->logprobs >= 0)
            logprobs_add(call->srv, call, ch, t, call->sent_text[k], &lp);
        if (end > call->sent_text[k] || lp)
            send_chunk(call, k, ch->text + call->sent_text[k], end - call->sent_text[k], false, NULL, lp);
        if (end > call->sent_text[k])
            call->sent_text[k] = end;
        call->sent[k]++;
    }
    if (ch->finish != SCHED_RUNNING && ch->finish != SCHED_ERROR && !call->fin_sent[k]) {
        size_t rest = ch->text_len - call->sent_text[k];
        send_chunk(call, k, rest ? ch->text + call->sent_text[k] : NULL, rest, false, api_finish_name(ch->finish),
                   NULL);
        call->sent_text[k] = ch->text_len;
        call->fin_sent[k] = true;
    }
    return true;
}

/* Streams what is new. Returns false when it stopped for backpressure. */
static bool stream_progress(struct api_call *call)
{
    for (int i = 0; i < call->n_reqs; i++) {
        struct sched_req_status st;
        sched_req_status_get(call->reqs[i], &st);
        if (st.version == call->seen[i])
            continue;
        /* the read sees at least this version: a later append changes the version and is read next time */
        struct read_ctx rc = {.call = call, .i = i};
        if (!sched_req_read(call->reqs[i], stream_choice, &rc))
            return false;
        call->seen[i] = st.version;
    }
    return true;
}

static bool all_finished(struct api_call *call, int *error, char *msg, size_t msg_cap)
{
    bool done = true;
    *error = 0;
    for (int i = 0; i < call->n_reqs; i++) {
        struct sched_req_status st;
        sched_req_status_get(call->reqs[i], &st);
        done &= st.finished;
        if (st.finished && st.error && !*error) {
            *error = st.error;
            snprintf(msg, msg_cap, "%s", st.errmsg);
        }
    }
    return done;
}

/* Appends choice c of request i, whole, to the response's choices. */
static bool full_choice(void *ctx, int c, const struct sched_choice *ch)
{
    struct read_ctx *rc = ctx;
    struct api_call *call = rc->call;
    int i = rc->i;
    json_t *lp = NULL;
    size_t echo_len = call->echo_text[i] ? strlen(call->echo_text[i]) : 0;
    for (int t = 0; call->logprobs >= 0 && t < ch->n_toks; t++)
        logprobs_add(call->srv, call, ch, &ch->toks[t], echo_len + ch->toks[t].text_off, &lp);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(i * call->n + c));
    if (call->route == ROUTE_CHAT) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_object_set_new(m, "content", api_json_text(ch->text ? ch->text : "", ch->text_len));
        json_object_set_new(choice, "message", m);
    } else if (echo_len) {
        char *full = malloc(echo_len + ch->text_len + 1);
        if (full) {
            memcpy(full, call->echo_text[i], echo_len);
            if (ch->text_len)
                memcpy(full + echo_len, ch->text, ch->text_len);
            json_object_set_new(choice, "text", api_json_text(full, echo_len + ch->text_len));
            free(full);
        }
    } else {
        json_object_set_new(choice, "text", api_json_text(ch->text ? ch->text : "", ch->text_len));
    }
    json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    const char *fin = api_finish_name(ch->finish);
    json_object_set_new(choice, "finish_reason", json_string(fin ? fin : "length"));
    json_array_append_new(rc->choices, choice);
    return true;
}

static void respond_full(struct api_call *call)
{
    json_t *o = envelope(call, false);
    json_t *choices = json_array();
    for (int i = 0; i < call->n_reqs; i++) {
        struct read_ctx rc = {.call = call, .i = i, .choices = choices};
        sched_req_read(call->reqs[i], full_choice, &rc);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(call));
    api_call_respond_json(call, o);
}

static void openai_pump(struct api_call *call)
{
    int error;
    char msg[256];
    /* finished is read before the output: once every request said so, the reads below see all of it */
    bool done = all_finished(call, &error, msg, sizeof msg);
    if (call->stream) {
        if (!stream_progress(call) || !done)
            return;
        if (error)
            api_sse_send(call->conn, api_error_json(error, NULL, NULL, msg));
        else if (call->include_usage) {
            json_t *o = envelope(call, true);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(call));
            api_sse_send(call->conn, o);
        }
        api_call_stream_end(call, error ? err_http_status(error) : 200);
        return;
    }
    if (!done)
        return;
    if (error)
        api_call_respond_error(call, error, msg);
    else
        api_call_defer(call, respond_full); /* the whole answer, with its logprobs, is built on a worker */
}

/* After submission (I/O thread): a stream's headers, and for chat the first chunk of every choice (its role). */
static void openai_start(struct api_call *call)
{
    if (!call->stream)
        return;
    api_call_stream_begin(call);
    if (call->route == ROUTE_CHAT)
        for (int k = 0; k < call->n_reqs * call->n; k++)
            send_chunk(call, k, NULL, 0, true, NULL, NULL);
}

void api_completions(struct api_call *call)
{
    struct server *srv = call->srv;
    bool chat = call->route == ROUTE_CHAT;
    struct gen_request g;
    struct api_error e;
    if (request_parse(chat ? API_CHAT : API_COMPLETIONS, call->req->body, call->req->body_len, &srv->defaults, &g,
                      &e)) {
        api_call_fail(call, &e);
        return;
    }
    if (!api_model_ok(srv, g.model, &e)) {
        api_call_fail(call, &e);
        gen_request_deinit(&g);
        return;
    }
    if (chat && srv->chat == CHAT_NONE) {
        api_error_set(&e, ERR_UNSUPPORTED, "messages", "chat_template_unavailable", "%s", srv->chat_err);
        api_call_fail(call, &e);
        gen_request_deinit(&g);
        return;
    }
    int n_prompts = chat ? 1 : g.n_prompts;
    if (!api_call_set_reqs(call, n_prompts)) {
        api_call_respond_error(call, ERR_NOMEM, "out of memory");
        gen_request_deinit(&g);
        return;
    }
    call->kind = chat ? API_CHAT : API_COMPLETIONS;
    call->pump = openai_pump;
    call->start = openai_start;
    call->stream = g.stream;
    call->include_usage = g.include_usage;
    call->echo = g.echo;
    call->logprobs = g.logprobs;
    call->n = g.n;
    for (int i = 0; i < n_prompts; i++) {
        const struct gen_prompt *p = chat ? NULL : &g.prompts[i];
        char param[32];
        snprintf(param, sizeof param, n_prompts > 1 ? "prompt[%d]" : chat ? "messages" : "prompt", i);
        int n_toks = 0, max_tokens = 0;
        int32_t *toks = chat ? api_tokenize_chat(srv, g.messages, g.n_messages, true, &n_toks, &e)
                             : api_tokenize_prompt(srv, p, g.parse_special, param, &n_toks, &e);
        struct sched_req *r = NULL;
        if (toks && !api_check_context(srv, n_toks, g.max_tokens, &max_tokens, &e))
            r = api_make_sched_req(srv, &g, toks, n_toks, max_tokens, &e);
        if (r && g.echo && p) {
            if (p->text) {
                call->echo_text[i] = strdup(p->text);
            } else { /* token prompt: detokenize it for the echo */
                size_t cap = (size_t)n_toks * 64 + 16, len = 0;
                char *s = malloc(cap);
                for (int k = 0; s && k < n_toks; k++) {
                    int m = tokenizer_token_to_piece(srv->model->tok, toks[k], false, s + len, (int)(cap - len - 1));
                    if (m > 0 && (size_t)m < cap - len)
                        len += (size_t)m;
                }
                if (s)
                    s[len] = 0;
                call->echo_text[i] = s;
            }
        }
        free(toks);
        if (!r) {
            api_call_fail(call, &e);
            gen_request_deinit(&g);
            return;
        }
        call->reqs[i] = r;
    }
    gen_request_deinit(&g);
    if (!api_reserve_generation(call, &e))
        api_call_fail(call, &e);
}

void api_models(struct server *srv, struct http_conn *c, const char *one, size_t one_len)
{
    const struct server_config *cfg = srv->cfg;
    const char *names[1 + CONFIG_MAX_LIST];
    int n = 0;
    names[n++] = cfg->model_name;
    for (int i = 0; i < cfg->n_aliases; i++)
        names[n++] = cfg->aliases[i];
    json_t *data = json_array();
    for (int i = 0; i < n; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(names[i]));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer(srv->created));
        json_object_set_new(m, "owned_by", json_string("wafer"));
        if (srv->model && atomic_load(&srv->state) != SERVER_LOADING) {
            json_t *meta = json_object();
            json_object_set_new(meta, "context_length", json_integer(srv->n_ctx));
            json_object_set_new(meta, "n_vocab", json_integer(srv->model->hp.n_vocab));
            json_object_set_new(meta, "architecture", json_string(srv->model->hp.arch));
            json_object_set_new(m, "meta", meta);
        }
        if (one && strlen(names[i]) == one_len && !memcmp(names[i], one, one_len)) {
            json_decref(data);
            api_respond_json(srv, c, ROUTE_MODEL_ONE, 200, m);
            return;
        }
        json_array_append_new(data, m);
    }
    if (one) {
        json_decref(data);
        api_respond_error(srv, c, ROUTE_MODEL_ONE, 404, ERR_NOT_FOUND, "model", "model_not_found",
                          NULL, "The model '%.*s' does not exist", (int)(one_len > 200 ? 200 : one_len), one);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    api_respond_json(srv, c, ROUTE_MODELS, 200, o);
}
