/*
 * api_prepare: from a validated generation request to scheduler requests, shared by every generating
 * handler: the model name check, tokenizing the prompt (special tokens only where the chat template or an
 * opted-in prompt puts them), fitting it and max_tokens in the context, filling a sched_req (sampling, stop
 * strings, seed, deadline, the compiled output constraint from the server's grammar cache, the prediction's
 * tokens and n-gram drafts), and bounding the answer before any work starts.
 *
 * Everything here runs on the work pool's threads (api_call_begin, api_call_begin_line), so it touches only
 * what stays fixed while the server runs (the model, its tokenizer, the config's generation settings), the
 * grammar cache (thread-safe: one mutex around its list, compiling outside it) and the call it prepares; ids
 * come from an atomic counter.
 *
 * Answer sizes: a non-streaming answer is built whole in memory before it is sent, so its size is estimated
 * from what was asked (choices x max_tokens, and per token its text, its id for the simple API, and one
 * entry per logprob alternative) and refused with 400 past server.max_response; the estimate is also held
 * in the server's in-flight budget (server.max_inflight, shared with request bodies) until the answer went
 * out, 503 with Retry-After when it is full. A streaming answer is never held (backpressure bounds it).
 *
 * Tokenizer scratch: encoding len bytes of text takes transient memory on the worker (code points, the
 * pre-tokenizer's word bounds, SPM symbols and the merge queue): up to about API_TOKENIZE_SCRATCH_PER_BYTE
 * bytes per byte of text, some 380 MB for 7.9 MB. api_encode holds that much in the same in-flight budget
 * while it tokenizes, so bodies, answers and tokenizing together stay within server.max_inflight: 413 when a
 * text could never fit it, 503 (retry) when it is full now.
 */
#include "core/clock.h"
#include "core/err.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

bool api_model_ok(struct server *srv, const char *model, struct api_error *e)
{
    const struct server_config *cfg = srv->cfg;
    if (!model || !*model || !strcmp(model, cfg->model_name))
        return true;
    for (int i = 0; i < cfg->n_aliases; i++)
        if (!strcmp(model, cfg->aliases[i]))
            return true;
    api_error_set(e, ERR_NOT_FOUND, "model", "model_not_found",
                  "The model '%.200s' does not exist; this server serves '%s'%s (see GET /v1/models)", model,
                  cfg->model_name, cfg->n_aliases ? " and its aliases" : "");
    return false;
}

/* Bytes per generated token in an answer (an upper estimate: JSON punctuation, escaped text, floats). */
#define API_TOKEN_TEXT_BYTES 16
#define API_TOKEN_ID_BYTES 12
#define API_LOGPROB_ENTRY_BYTES 96
#define API_ANSWER_OVERHEAD 1024
/* Peak transient bytes tokenizer_encode* allocates per byte of text, on the high side: SPM vocabularies
 * (stories260K, llama-19M) measured 26 (maximum RSS of `wafer tokenize --file` on 4 MB of text, less its
 * RSS on 1 KB; the text and the ids included); BPE adds the pre-tokenizer's per-code-point arrays (flags,
 * classes, word bounds: about 20 more, counted from pretok.c's allocations, not measured). */
#define API_TOKENIZE_SCRATCH_PER_BYTE 48

int api_encode(struct server *srv, const char *text, size_t len, bool add_special, bool parse_special,
               const struct tok_span *plain, size_t n_plain, bool spans, int32_t **out, const char *param,
               struct api_error *e)
{
    *out = NULL;
    int64_t scratch = (int64_t)len * API_TOKENIZE_SCRATCH_PER_BYTE;
    if (len < 4096) /* small texts (nearly every prompt): not worth an atomic */
        scratch = 0;
    if (srv->inflight.limit > 0 && scratch > srv->inflight.limit)
        return api_error_set(e, ERR_TOO_LARGE, param, "input_too_large",
                             "Tokenizing this text (%zu bytes) needs about %lld bytes of working memory, more than "
                             "the server holds for all requests in flight (server.max_inflight, %lld bytes). Send "
                             "less text, or raise server.max_inflight.",
                             len, (long long)scratch, (long long)srv->inflight.limit);
    if (!budget_take(&srv->inflight, scratch))
        return api_error_set(e, ERR_UNAVAILABLE, param, "server_busy",
                             "The server holds too many large requests and answers right now (%lld of %lld bytes, "
                             "server.max_inflight); retry shortly.",
                             (long long)budget_used(&srv->inflight), (long long)srv->inflight.limit);
    const struct tokenizer *tok = srv->model->tok;
    int n = spans ? tokenizer_encode_spans(tok, text, len, add_special, plain, n_plain, out)
                  : tokenizer_encode_alloc(tok, text, len, add_special, parse_special, out);
    budget_give(&srv->inflight, scratch);
    if (n < 0)
        return api_error_set(e, n, param, NULL, "cannot tokenize '%s': %s", param, err_name(n));
    return n;
}

int32_t *api_tokenize_prompt(struct server *srv, const struct gen_prompt *p, bool parse_special, const char *param,
                             int *n_out, struct api_error *e)
{
    const struct tokenizer *tok = srv->model->tok;
    int n_vocab = tokenizer_n_vocab(tok);
    if (p->tokens) {
        for (int i = 0; i < p->n_tokens; i++)
            if (p->tokens[i] >= n_vocab) {
                api_error_set(e, ERR_INVALID_ARG, param, NULL, "'%s' holds token id %d, outside the vocabulary [0, %d)",
                              param, p->tokens[i], n_vocab);
                return NULL;
            }
        int32_t *t = malloc((size_t)(p->n_tokens ? p->n_tokens : 1) * sizeof *t);
        if (!t) {
            api_error_set(e, ERR_NOMEM, param, NULL, "out of memory");
            return NULL;
        }
        memcpy(t, p->tokens, (size_t)p->n_tokens * sizeof *t);
        *n_out = p->n_tokens;
        return t;
    }
    int32_t *t;
    int n = api_encode(srv, p->text, strlen(p->text), true, parse_special, NULL, 0, false, &t, param, e);
    if (n < 0)
        return NULL;
    *n_out = n;
    return t;
}

int32_t *api_tokenize_chat(struct server *srv, const struct chat_message *msgs, int n_msgs,
                           const struct chat_tool *tools, int n_tools, bool add_generation_prompt, int *n_out,
                           struct api_error *e)
{
    char err[ERR_MSG_MAX];
    struct tok_span *content = NULL;
    size_t n_content = 0;
    char *text = chat_template_render_tools(srv->chat, msgs, n_msgs, tools, n_tools, add_generation_prompt,
                                            srv->bos_text, srv->eos_text, &content, &n_content, err);
    if (!text) {
        api_error_set(e, ERR_INVALID_ARG, "messages", NULL, "%s", err);
        return NULL;
    }
    int32_t *t = NULL;
    int n = api_encode(srv, text, strlen(text), true, false, content, n_content, true, &t, "messages", e);
    free(text);
    free(content);
    if (n < 0)
        return NULL;
    *n_out = n;
    return t;
}

bool api_reserve_generation(struct api_call *call, struct api_error *e)
{
    if (call->stream)
        return true; /* sent as produced, never held whole */
    int64_t per_token = API_TOKEN_TEXT_BYTES + (call->kind == API_GENERATE ? API_TOKEN_ID_BYTES : 0);
    if (call->logprobs >= 0)
        per_token += (int64_t)API_LOGPROB_ENTRY_BYTES * (1 + call->logprobs);
    int64_t total = API_ANSWER_OVERHEAD;
    int prompts = 0, max_tokens = 0;
    for (int i = 0; i < call->n_reqs; i++) {
        const struct sched_req *r = call->reqs[i];
        if (!r)
            continue;
        prompts++;
        max_tokens = r->max_tokens > max_tokens ? r->max_tokens : max_tokens;
        total += (int64_t)r->n_choices * r->max_tokens * per_token;
        if (call->echo_text && call->echo_text[i])
            total += (int64_t)r->n_choices * (int64_t)strlen(call->echo_text[i]) * 2;
        if (r->prompt_logprobs) /* echo with logprobs: an entry per prompt token in every choice */
            total += (int64_t)r->n_choices * r->n_prompt * per_token;
    }
    char what[192];
    int n = snprintf(what, sizeof what, "%d prompt%s x %d choice%s x %d max_tokens", prompts, prompts == 1 ? "" : "s",
                     call->n, call->n == 1 ? "" : "s", max_tokens);
    if (call->logprobs >= 0 && n > 0 && (size_t)n < sizeof what)
        snprintf(what + n, sizeof what - (size_t)n, " x %d logprob entries per token", 1 + call->logprobs);
    return api_reserve_answer(call, total, what, e);
}

bool api_reserve_answer(struct api_call *call, int64_t bytes, const char *what, struct api_error *e)
{
    struct server *srv = call->srv;
    if (bytes > srv->max_response) {
        api_error_set(e, ERR_INVALID_ARG, "max_tokens", "response_too_large",
                      "This request's answer could reach about %lld bytes (%s), more than the server's limit of %lld "
                      "bytes (server.max_response). Ask for less (fewer prompts, choices, tokens or logprobs) or "
                      "stream the answer with \"stream\": true, which is sent as it is produced and never held whole.",
                      (long long)bytes, what, (long long)srv->max_response);
        return false;
    }
    if (!budget_take(&srv->inflight, bytes)) {
        api_error_set(e, ERR_UNAVAILABLE, "", "server_busy",
                      "The server holds too many large requests and answers right now (%lld of %lld bytes, "
                      "server.max_inflight); retry shortly.",
                      (long long)budget_used(&srv->inflight), (long long)srv->inflight.limit);
        return false;
    }
    call->reserved += bytes;
    return true;
}

int api_check_context(struct server *srv, int n_prompt, int max_tokens_req, int *max_tokens, struct api_error *e)
{
    int n_ctx = srv->n_ctx;
    if (n_prompt < 1)
        return api_error_set(e, ERR_INVALID_ARG, "prompt", NULL,
                             "the prompt is empty after tokenization and the model adds no BOS token");
    if (max_tokens_req > 0) {
        if ((int64_t)n_prompt + max_tokens_req > n_ctx)
            return api_error_set(e, ERR_CONTEXT_LENGTH, "max_tokens", "context_length_exceeded",
                                 "This model's maximum context length is %d tokens. However, you requested %lld "
                                 "tokens (%d in the prompt, %d for the completion). Please reduce the prompt or "
                                 "max_tokens.",
                                 n_ctx, (long long)n_prompt + max_tokens_req, n_prompt, max_tokens_req);
        *max_tokens = max_tokens_req;
        return 0;
    }
    if (n_prompt >= n_ctx)
        return api_error_set(e, ERR_CONTEXT_LENGTH, "prompt", "context_length_exceeded",
                             "This model's maximum context length is %d tokens. However, your prompt has %d "
                             "tokens, which leaves no room for a completion (%d tokens too many). Please reduce "
                             "the prompt.",
                             n_ctx, n_prompt, n_prompt - n_ctx + 1);
    int room = n_ctx - n_prompt;
    *max_tokens = srv->defaults.max_new_tokens < room ? srv->defaults.max_new_tokens : room;
    return 0;
}

struct sched_req *api_make_sched_req(struct server *srv, const struct gen_request *g, const int32_t *toks,
                                     int n_toks, int max_tokens, struct api_error *e)
{
    if (g->n > srv->cfg->max_batch_size) {
        api_error_set(e, ERR_INVALID_ARG, "n", NULL, "'n' = %d is larger than the server's max batch size %d", g->n,
                      srv->cfg->max_batch_size);
        return NULL;
    }
    struct sched_req *r = sched_req_create(toks, n_toks, g->n);
    if (!r || sched_req_set_stop(r, g->stop, g->n_stop)) {
        sched_req_unref(r);
        api_error_set(e, ERR_NOMEM, "", NULL, "out of memory");
        return NULL;
    }
    r->id = atomic_fetch_add(&srv->next_id, 1) + 1;
    r->max_tokens = max_tokens;
    r->sp = g->sp;
    if (!g->seed_set) {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
            seed = (uint64_t)clock_now_ns() ^ (r->id << 32);
        r->sp.seed = seed;
    }
    if (g->constraint_kind) {
        char err[ERR_MSG_MAX];
        int rc = grammar_cache_get(srv->grammars, (enum grammar_kind)g->constraint_kind, g->constraint_flags,
                                   g->constraint_text, g->constraint_text ? strlen(g->constraint_text) : 0,
                                   &r->constraint, err);
        if (rc) {
            sched_req_unref(r);
            api_error_set(e, rc == ERR_NOMEM ? ERR_NOMEM : rc == ERR_UNSUPPORTED ? ERR_UNSUPPORTED : ERR_INVALID_ARG,
                          g->constraint_param, NULL, "invalid '%s': %s", g->constraint_param, err);
            return NULL;
        }
    }
    if (g->n_logit_bias) {
        int n_vocab = tokenizer_n_vocab(srv->model->tok);
        for (int i = 0; i < g->n_logit_bias; i++)
            if (g->logit_bias[i].token >= n_vocab) {
                sched_req_unref(r);
                api_error_set(e, ERR_INVALID_ARG, "logit_bias", NULL,
                              "'logit_bias' names token id %d, outside the vocabulary [0, %d)", g->logit_bias[i].token,
                              n_vocab);
                return NULL;
            }
        if (sched_req_set_logit_bias(r, g->logit_bias, g->n_logit_bias)) {
            sched_req_unref(r);
            api_error_set(e, ERR_NOMEM, "", NULL, "out of memory");
            return NULL;
        }
    }
    r->n_logprobs = g->logprobs;
    r->prompt_logprobs = g->echo && g->logprobs >= 0 && g->kind == API_COMPLETIONS;
    r->ignore_eos = g->ignore_eos;
    if (g->spec == SCHED_SPEC_DRAFT && !srv->draft_engine) {
        sched_req_unref(r);
        api_error_set(e, ERR_INVALID_ARG, "speculation", NULL,
                      "'speculation': \"draft\" needs a draft model, and this server has none (start it with "
                      "--draft-model FILE)");
        return NULL;
    }
    if (g->spec >= 0)
        r->spec = g->spec;
    if (g->prediction && *g->prediction) {
        /* plain text (no BOS, special-token text kept as text): drafts for the tokens the model writes */
        int32_t *pt;
        int np = api_encode(srv, g->prediction, strlen(g->prediction), false, false, NULL, 0, false, &pt,
                            "prediction", e);
        if (np < 0) {
            sched_req_unref(r);
            return NULL;
        }
        int rc = sched_req_set_prediction(r, pt, np);
        free(pt);
        if (rc) {
            sched_req_unref(r);
            api_error_set(e, rc, "prediction", NULL, "cannot use 'prediction': %s", err_name(rc));
            return NULL;
        }
    }
    r->t_arrival = clock_now_ns();
    /* the request's own timeout may shorten the server's, never lengthen it */
    double timeout = srv->cfg->request_timeout;
    if (g->timeout > 0 && (timeout <= 0 || g->timeout < timeout))
        timeout = g->timeout;
    if (timeout > 0)
        r->deadline = r->t_arrival + (int64_t)(timeout * 1e9);
    return r;
}
