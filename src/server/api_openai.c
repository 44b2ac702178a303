/*
 * api_openai: POST /v1/completions, POST /v1/chat/completions and GET /v1/models, in the shapes of the
 * OpenAI API so that its clients work unchanged.
 *
 * Streaming sends one SSE chunk per generated token that released text (tokens whose bytes are held back,
 * an incomplete UTF-8 sequence or a possible stop string, ride with a later chunk), a last chunk per choice
 * with its finish_reason, the usage chunk when stream_options.include_usage asks, then "data: [DONE]".
 * Text is streamed by byte offset, so bytes released only when a choice ends still reach the client.
 * With "return_token_ids": true (vLLM's name) each chunk's choice also carries token_ids, the ids of the
 * tokens whose text it completes, and the first chunk of a choice prompt_token_ids: what a router needs to
 * continue a broken stream elsewhere exactly (prompt + tokens already sent, as a token-id prompt).
 *
 * Tools (chat, tool_choice not none): the answer is generated under the tool grammar (tool_call.h) and read
 * back when its choice ends: calls become message.tool_calls (finish_reason "tool_calls"), text stays
 * content. A stream holds a tool answer's tokens back and sends, when the choice ends, one tool_calls delta
 * per call (index, id, type, function {name, arguments}) or the text as one content delta; an auto answer
 * whose first bytes show it is text (not the call marker) streams token by token like any other.
 */
#include "core/err.h"
#include "core/log.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"
#include "server/tool_call.h"

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
    if (call->chat_logprobs) {
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
    int prompt = 0, gen = 0, cached = 0, drafted = 0, accepted = 0, pred_drafted = 0, pred_accepted = 0;
    for (int i = 0; i < call->n_reqs; i++) {
        struct sched_req *r = call->reqs[i];
        if (!r)
            continue;
        struct sched_req_status st;
        sched_req_status_get(r, &st);
        prompt += r->n_prompt;
        cached += st.cached_tokens;
        gen += st.n_generated;
        drafted += st.draft_tokens;
        accepted += st.accepted_tokens;
        pred_drafted += st.prediction_draft_tokens;
        pred_accepted += st.prediction_accepted_tokens;
    }
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(gen));
    json_object_set_new(u, "total_tokens", json_integer(prompt + gen));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    /* OpenAI's predicted-output counts: tokens of the prediction fed as drafts and accepted, and fed and not
     * accepted (counted at each verify that fed them; a part of the prediction never fed, e.g. past the end
     * of the answer, counts in neither); draft_tokens / accepted_draft_tokens (wafer's) count every draft,
     * n-gram ones included */
    json_t *cd = json_object();
    json_object_set_new(cd, "accepted_prediction_tokens", json_integer(pred_accepted));
    json_object_set_new(cd, "rejected_prediction_tokens", json_integer(pred_drafted - pred_accepted));
    json_object_set_new(cd, "draft_tokens", json_integer(drafted));
    json_object_set_new(cd, "accepted_draft_tokens", json_integer(accepted));
    json_object_set_new(u, "completion_tokens_details", cd);
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
/* return_token_ids: adds to choice k's chunk the ids of its tokens [ids_sent, upto) (ch is the choice as
 * sched_req_read shows it; NULL when upto is 0), and the prompt's ids on its first chunk. */
static void add_token_ids(struct api_call *call, int k, const struct sched_choice *ch, int upto, json_t *choice)
{
    const struct sched_req *r = call->reqs[k / call->n];
    if (call->ids_sent[k] < 0) {
        json_t *p = json_array();
        for (int i = 0; i < r->n_prompt; i++)
            json_array_append_new(p, json_integer(r->prompt[i]));
        json_object_set_new(choice, "prompt_token_ids", p);
        call->ids_sent[k] = 0;
    }
    json_t *ids = json_array();
    for (; ch && call->ids_sent[k] < upto; call->ids_sent[k]++)
        json_array_append_new(ids, json_integer(ch->toks[call->ids_sent[k]].id));
    json_object_set_new(choice, "token_ids", ids);
}

/* One streamed chunk for choice index k. text may be NULL (role-only or finish chunk). With return_token_ids
 * the chunk reports the ids of ch's tokens before index ids_upto (ch NULL: none). */
static int send_chunk(struct api_call *call, int k, const char *text, size_t len, bool role, const char *finish,
                      json_t *lp, const struct sched_choice *ch, int ids_upto)
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
    if (call->return_token_ids)
        add_token_ids(call, k, ch, ids_upto, choice);
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
    char err[ERR_MSG_MAX + 64]; /* a tool answer that cannot be read back ("" when none) */
    json_t *prompt_lp;          /* echo with logprobs: the prompt's part, built at choice 0, copied into each */
};

/* echo with logprobs (OpenAI's legacy shape): the prompt tokens' entries, from choice 0's scores (ptoks). The
 * first token has no logprob (null), as OpenAI's; offsets count bytes of the echoed prompt text (the space a
 * SentencePiece vocabulary puts before the first word is not in it). */
static json_t *prompt_logprobs_json(struct api_call *call, int i, const struct sched_choice *ch)
{
    const struct sched_req *r = call->reqs[i];
    int n_top = call->logprobs > 0 ? call->logprobs : 0;
    size_t echo_len = call->echo_text[i] ? strlen(call->echo_text[i]) : 0;
    json_t *lp = json_object(), *toks = json_array(), *lps = json_array(), *offs = json_array();
    json_t *tops = n_top ? json_array() : json_null();
    size_t off = 0;
    bool first_piece = true, strip = false;
    for (int k = 0; k < r->n_prompt; k++) {
        char piece[256];
        int n = token_piece(call->srv, r->prompt[k], piece, sizeof piece);
        if (first_piece && n > 0) {
            strip = piece[0] == ' ' && !(echo_len && call->echo_text[i][0] == ' ');
            first_piece = false;
            json_array_append_new(offs, json_integer(0));
            off = (size_t)n - (strip ? 1 : 0);
        } else {
            json_array_append_new(offs, json_integer((json_int_t)(off < echo_len ? off : echo_len)));
            off += (size_t)n;
        }
        json_array_append_new(toks, api_json_text(piece, (size_t)n));
        const struct sched_token *t = k > 0 && k - 1 < ch->n_ptoks ? &ch->ptoks[k - 1] : NULL;
        json_array_append_new(lps, t ? json_real(t->logprob) : json_null());
        if (!n_top)
            continue;
        if (!t || t->top_off < 0) {
            json_array_append_new(tops, json_null());
            continue;
        }
        json_t *o = json_object();
        for (int j = 0; j < n_top; j++) {
            const struct sampler_logprob *sl = &ch->top[t->top_off + j];
            char p2[256];
            int n2 = token_piece(call->srv, sl->token, p2, sizeof p2);
            json_t *key = api_json_text(p2, (size_t)n2);
            json_object_set_new(o, json_string_value(key), json_real(sl->logprob));
            json_decref(key);
        }
        json_array_append_new(tops, o);
    }
    json_object_set_new(lp, "tokens", toks);
    json_object_set_new(lp, "token_logprobs", lps);
    json_object_set_new(lp, "top_logprobs", tops);
    json_object_set_new(lp, "text_offset", offs);
    return lp;
}

/* The request id without its "chatcmpl-" prefix: tool call ids are "call_" + this + indexes. */
static const char *call_id_tail(const struct api_call *call)
{
    const char *dash = strchr(call->id, '-');
    return dash ? dash + 1 : call->id;
}

/* One chunk of choice k whose delta is delta (stolen). */
static void send_delta(struct api_call *call, int k, json_t *delta, const char *finish)
{
    json_t *o = envelope(call, true);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(k));
    json_object_set_new(choice, "delta", delta);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(o, "choices", choices);
    if (call->include_usage)
        json_object_set_new(o, "usage", json_null());
    api_sse_send(call->conn, o);
}

/* A tool answer's choice, streamed once it ended: each call as a tool_calls delta, or its text as content,
 * then the finish chunk. */
static bool stream_tool_choice(struct api_call *call, int k, const struct sched_choice *ch)
{
    if (ch->finish == SCHED_RUNNING || ch->finish == SCHED_ERROR || call->fin_sent[k])
        return true;
    if (http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
        return false;
    json_t *calls = NULL, *content = NULL;
    const char *fin = api_finish_name(ch->finish);
    call->fin_sent[k] = true;
    call->sent[k] = ch->n_toks;
    call->sent_text[k] = ch->text_len;
    if (ch->finish == SCHED_STOP) {
        char err[ERR_MSG_MAX], id[64];
        snprintf(id, sizeof id, "call_%s_%d", call_id_tail(call), k);
        if (tool_calls_parse((enum chat_tool_format)call->tool_fmt, ch->text, ch->text_len, call->tools,
                             call->tool_params, call->n_tools, id, &calls, &content, err)) {
            char msg[ERR_MSG_MAX + 64];
            snprintf(msg, sizeof msg, "tool calls: choice %d: %s", k, err);
            log_error("%s: %s", call->id, msg);
            api_sse_send(call->conn, api_error_json(ERR_INTERNAL, NULL, NULL, msg));
            return true;
        }
    }
    if (calls && json_array_size(calls)) {
        for (size_t j = 0; j < json_array_size(calls); j++) {
            json_t *tc = json_deep_copy(json_array_get(calls, j));
            json_object_set_new(tc, "index", json_integer((json_int_t)j));
            json_t *delta = json_pack("{s:[o]}", "tool_calls", tc);
            if (delta)
                send_delta(call, k, delta, NULL);
        }
        fin = "tool_calls";
        json_decref(content);
    } else if (content || ch->text_len) {
        json_t *delta = json_object();
        json_object_set_new(delta, "content", content ? content : api_json_text(ch->text, ch->text_len));
        send_delta(call, k, delta, NULL);
    }
    json_decref(calls);
    send_delta(call, k, json_object(), fin ? fin : "length");
    return true;
}

/* Streams what is new in choice c of request i: its tokens, then its finish chunk. false when it stopped
 * for backpressure (the rest goes at the next pump, from call->sent). */
static bool stream_choice(void *ctx, int c, const struct sched_choice *ch)
{
    struct read_ctx *rc = ctx;
    struct api_call *call = rc->call;
    int k = rc->i * call->n + c;
    if (call->tools_active && !call->tool_text[k]) {
        /* auto: once the answer shows it is text, it streams as any text does (nothing was sent yet) */
        if (call->tool_auto && tool_answer_is_text((enum chat_tool_format)call->tool_fmt, ch->text, ch->text_len))
            call->tool_text[k] = true;
        else
            return stream_tool_choice(call, k, ch);
    }
    while (call->sent[k] < ch->n_toks) {
        if (http_conn_pending(call->conn) >= API_BACKPRESSURE_BYTES)
            return false;
        const struct sched_token *t = &ch->toks[call->sent[k]];
        size_t end = t->text_off + t->text_len;
        json_t *lp = NULL;
        if (call->logprobs >= 0)
            logprobs_add(call->srv, call, ch, t, call->sent_text[k], &lp);
        if (end > call->sent_text[k] || lp)
            send_chunk(call, k, ch->text + call->sent_text[k], end - call->sent_text[k], false, NULL, lp, ch,
                       call->sent[k] + 1);
        if (end > call->sent_text[k])
            call->sent_text[k] = end;
        call->sent[k]++;
    }
    if (ch->finish != SCHED_RUNNING && ch->finish != SCHED_ERROR && !call->fin_sent[k]) {
        size_t rest = ch->text_len - call->sent_text[k];
        send_chunk(call, k, rest ? ch->text + call->sent_text[k] : NULL, rest, false, api_finish_name(ch->finish),
                   NULL, ch, ch->n_toks);
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
    if (call->route != ROUTE_CHAT && call->echo && call->logprobs >= 0) {
        if (c == 0) {
            json_decref(rc->prompt_lp);
            rc->prompt_lp = prompt_logprobs_json(call, i, ch);
        }
        lp = json_deep_copy(rc->prompt_lp);
    }
    for (int t = 0; call->logprobs >= 0 && t < ch->n_toks; t++)
        logprobs_add(call->srv, call, ch, &ch->toks[t], echo_len + ch->toks[t].text_off, &lp);
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(i * call->n + c));
    const char *fin = api_finish_name(ch->finish);
    if (call->route == ROUTE_CHAT) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_t *calls = NULL, *content = NULL;
        if (call->tools_active && ch->finish == SCHED_STOP) {
            char err[ERR_MSG_MAX], id[64];
            snprintf(id, sizeof id, "call_%s_%d", call_id_tail(call), i * call->n + c);
            if (tool_calls_parse((enum chat_tool_format)call->tool_fmt, ch->text, ch->text_len, call->tools,
                                 call->tool_params, call->n_tools, id, &calls, &content, err)) {
                snprintf(rc->err, sizeof rc->err, "tool calls: choice %d: %s", i * call->n + c, err);
                json_decref(m);
                json_decref(choice);
                json_decref(lp);
                return false;
            }
        }
        if (calls && json_array_size(calls)) {
            json_object_set_new(m, "content", content ? content : json_null());
            json_object_set_new(m, "tool_calls", calls);
            fin = "tool_calls";
        } else {
            json_decref(calls);
            json_object_set_new(m, "content", content ? content : api_json_text(ch->text ? ch->text : "", ch->text_len));
        }
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
        bool ok = sched_req_read(call->reqs[i], full_choice, &rc);
        json_decref(rc.prompt_lp);
        if (!ok && rc.err[0]) {
            log_error("%s: %s", call->id, rc.err);
            json_decref(o);
            json_decref(choices);
            api_call_respond_error(call, ERR_INTERNAL, rc.err);
            return;
        }
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
            send_chunk(call, k, NULL, 0, true, NULL, NULL, NULL, 0);
}

void api_completions(struct api_call *call)
{
    struct server *srv = call->srv;
    bool chat = call->route == ROUTE_CHAT;
    struct gen_request g;
    struct api_error e;
    const char *body = call->batch ? call->line : call->req->body;
    size_t body_len = call->batch ? call->line_len : call->req->body_len;
    if (request_parse(chat ? API_CHAT : API_COMPLETIONS, body, body_len, &srv->defaults, &g, &e)) {
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
    if (call->batch)
        g.stream = false; /* a batch line's result is the whole response */
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
    call->return_token_ids = g.stream && g.return_token_ids;
    call->echo = g.echo;
    call->logprobs = g.logprobs;
    call->chat_logprobs = chat || g.chat_logprobs;
    call->n = g.n;
    if (chat && g.tool_choice != GEN_TOOLS_NONE) {
        char *gbnf = NULL;
        call->tool_fmt = chat_tool_format_of(srv->chat);
        if (tool_grammar_build(call->tool_fmt, &g, &gbnf, &e)) {
            api_call_fail(call, &e);
            gen_request_deinit(&g);
            return;
        }
        g.constraint_kind = GRAMMAR_KIND_GBNF;
        g.constraint_text = gbnf;
        g.constraint_param = "tools";
        call->tools_active = true;
        call->tool_auto = g.tool_choice == GEN_TOOLS_AUTO;
    }
    for (int i = 0; i < n_prompts; i++) {
        const struct gen_prompt *p = chat ? NULL : &g.prompts[i];
        char param[32];
        snprintf(param, sizeof param, n_prompts > 1 ? "prompt[%d]" : chat ? "messages" : "prompt", i);
        int n_toks = 0, max_tokens = 0;
        int32_t *toks = chat ? api_tokenize_chat(srv, g.messages, g.n_messages, g.tool_choice ? g.tools : NULL,
                                                 g.tool_choice ? g.n_tools : 0, true, &n_toks, &e)
                             : api_tokenize_prompt(srv, p, g.parse_special, param, &n_toks, &e);
        struct sched_req *r = NULL;
        if (toks && !api_check_context(srv, n_toks, g.max_tokens, &max_tokens, &e))
            r = api_make_sched_req(srv, &g, toks, n_toks, max_tokens, &e);
        if (r && call->batch) {
            r->priority = SCHED_PRIORITY_BATCH;
            r->deadline = 0; /* a line waits below live traffic for as long as that takes: its batch's
                                completion window bounds it, not server.request_timeout */
        }
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
    if (call->tools_active) { /* the calls are read back against the tools' schemas */
        call->tools = g.tools;
        call->tool_params = g.tool_params;
        call->n_tools = g.n_tools;
        g.tools = NULL;
        g.tool_params = NULL;
        g.n_tools = 0;
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
