/*
 * serve_client: the libcurl multi driver. One loop starts requests (when a slot frees in closed-loop mode, or
 * when the next Poisson arrival is due), lets curl move bytes, and reaps finished transfers; curl_multi_poll
 * sleeps until a socket is ready or the next arrival, so one thread keeps hundreds of streams timed to well
 * under a millisecond. Chunks are timed inside the write callback, as soon as the SSE parser completes an
 * event, which is the moment a real client would see the token.
 *
 * Each request ends in exactly one outcome (serve.h): the transport result, the HTTP status and what the
 * SSE parser saw are combined once, in client_finish().
 *
 * Conversations (cfg->turns > 1): prompts come in groups of `turns` new user messages. A conversation holds
 * one closed-loop slot from its first turn to its last; each turn is sent as soon as the previous answer has
 * streamed, with the whole history (chat: the user and assistant messages; completions: the earlier prompts
 * and answers concatenated), which is how a chat client grows its context and what a prefix cache serves.
 * A failed turn ends its conversation: the turns after it are recorded as failed, not sent.
 */
#include "bench/serve_client.h"

#include "bench/serve_sse.h"
#include "core/clock.h"
#include "core/err.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CLIENT_ERRBODY_MAX 1024  /* bytes of a non-200 body kept for the error message */

struct client_req {
    int index;
    CURL *easy;
    char *body;
    double t_send, t_first, t_last; /* monotonic seconds: sent, first and latest content chunk */
    double t_done;                /* when data: [DONE] arrived */
    bool got_first;
    long status;                  /* 0 until the first body byte */
    struct serve_sse sse;
    char errbody[CLIENT_ERRBODY_MAX + 1];
    size_t errlen;
    bool done_seen;               /* data: [DONE] arrived */
    bool bad;                     /* the stream was malformed or carried an error event */
    bool aborted;                 /* we stopped the transfer ourselves (bad stream) */
    char bad_msg[300];
    int usage_prompt, usage_completion, usage_cached;
    int n_chunks;
    double *itl;
    int n_itl, cap_itl;
    bool capture;
    char *text;
    size_t text_len, text_cap;
    bool oom;
    char curl_err[CURL_ERROR_SIZE];
};

const char *serve_outcome_name(int outcome)
{
    static const char *names[SERVE_OUTCOME_COUNT] = {"completed", "connect", "http", "timeout", "stream", "other"};
    return outcome >= 0 && outcome < SERVE_OUTCOME_COUNT ? names[outcome] : "other";
}

void serve_request_result_clear(struct serve_request_result *r)
{
    free(r->error);
    free(r->itl_ms);
    free(r->text);
    memset(r, 0, sizeof *r);
}

static void client_set_bad(struct client_req *q, const char *msg)
{
    if (!q->bad) {
        size_t n = strlen(msg);
        n = n < sizeof q->bad_msg - 1 ? n : sizeof q->bad_msg - 1; /* a long reason is cut, never overflows */
        memcpy(q->bad_msg, msg, n);
        q->bad_msg[n] = '\0';
    }
    q->bad = true;
}

static int client_on_event(void *ctx, const char *data, size_t len)
{
    struct client_req *q = ctx;
    if (q->done_seen)
        return 0; /* anything after [DONE] is not part of the answer */
    struct serve_chunk c;
    char err[ERR_MSG_MAX];
    if (serve_chunk_parse(data, len, &c, err)) {
        client_set_bad(q, err);
        return 1;
    }
    if (c.done) {
        q->done_seen = true;
        q->t_done = clock_now_s();
        return 0;
    }
    if (c.is_error) {
        char m[300];
        snprintf(m, sizeof m, "the server sent an error event: %.200s", c.message);
        client_set_bad(q, m);
        free(c.text);
        return 1;
    }
    if (c.text) {
        double now = clock_now_s();
        if (!q->got_first) {
            q->got_first = true;
            q->t_first = now;
        } else {
            if (q->n_itl == q->cap_itl) {
                int nc = q->cap_itl ? q->cap_itl * 2 : 64;
                double *ni = realloc(q->itl, (size_t)nc * sizeof *ni);
                if (!ni) {
                    q->oom = true;
                    free(c.text);
                    return 1;
                }
                q->itl = ni;
                q->cap_itl = nc;
            }
            q->itl[q->n_itl++] = (now - q->t_last) * 1000.0;
        }
        q->t_last = now;
        q->n_chunks++;
        if (q->capture) {
            if (q->text_len + c.text_len + 1 > q->text_cap) {
                size_t nc = q->text_cap ? q->text_cap : 256;
                while (nc < q->text_len + c.text_len + 1)
                    nc *= 2;
                char *nt = realloc(q->text, nc);
                if (!nt) {
                    q->oom = true;
                    free(c.text);
                    return 1;
                }
                q->text = nt;
                q->text_cap = nc;
            }
            memcpy(q->text + q->text_len, c.text, c.text_len);
            q->text_len += c.text_len;
            q->text[q->text_len] = '\0';
        }
        free(c.text);
    }
    if (c.prompt_tokens >= 0)
        q->usage_prompt = c.prompt_tokens;
    if (c.completion_tokens >= 0)
        q->usage_completion = c.completion_tokens;
    if (c.cached_tokens >= 0)
        q->usage_cached = c.cached_tokens;
    return 0;
}

static size_t client_on_write(char *p, size_t size, size_t nmemb, void *ud)
{
    struct client_req *q = ud;
    size_t n = size * nmemb;
    if (q->status == 0)
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
    if (q->status != 200) {
        size_t k = n < CLIENT_ERRBODY_MAX - q->errlen ? n : CLIENT_ERRBODY_MAX - q->errlen;
        memcpy(q->errbody + q->errlen, p, k);
        q->errlen += k;
        q->errbody[q->errlen] = '\0';
        return n;
    }
    int rc = serve_sse_feed(&q->sse, p, n, client_on_event, q);
    if (rc) {
        if (rc == ERR_TOO_LARGE)
            client_set_bad(q, "an event in the stream is larger than 8 MiB");
        else if (rc == ERR_NOMEM)
            q->oom = true;
        q->aborted = true;
        return 0; /* the outcome is decided; stop reading */
    }
    return n;
}

/* A conversation's history: what every later turn sends before its new user message. */
struct client_conv {
    json_t *msgs; /* chat: the user and assistant messages so far, NULL before the first answer */
    char *text;   /* completions: the earlier prompts and answers concatenated, NULL before the first answer */
    size_t len;
};

static void client_conv_clear(struct client_conv *c)
{
    json_decref(c->msgs);
    free(c->text);
    memset(c, 0, sizeof *c);
}

static json_t *client_message(const char *role, const char *content)
{
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* Appends a finished turn (its user message and the streamed answer). Returns 0 or ERR_NOMEM. */
static int client_conv_add(struct client_conv *c, int endpoint, const char *user, const char *answer)
{
    if (endpoint == SERVE_ENDPOINT_CHAT) {
        if (!c->msgs && !(c->msgs = json_array()))
            return ERR_NOMEM;
        if (json_array_append_new(c->msgs, client_message("user", user)) ||
            json_array_append_new(c->msgs, client_message("assistant", answer)))
            return ERR_NOMEM;
        return 0;
    }
    /* the next prompt starts with this prompt and its answer exactly, so their tokens can be reused */
    size_t ul = strlen(user), al = strlen(answer);
    char *t = realloc(c->text, c->len + ul + al + 3);
    if (!t)
        return ERR_NOMEM;
    memcpy(t + c->len, user, ul);
    memcpy(t + c->len + ul, answer, al);
    memcpy(t + c->len + ul + al, "\n\n", 3);
    c->text = t;
    c->len += ul + al + 2;
    return 0;
}

/* The request body, as the endpoint expects it: conv's history (may be NULL), then p. Caller frees. */
static char *client_body(const struct serve_client_config *cfg, const struct serve_prompt *p,
                         const struct client_conv *conv)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (cfg->model)
        json_object_set_new(o, "model", json_string(cfg->model));
    if (cfg->endpoint == SERVE_ENDPOINT_CHAT) {
        json_t *msgs = json_array();
        if (conv && conv->msgs)
            json_array_extend(msgs, conv->msgs);
        json_array_append_new(msgs, client_message("user", p->text));
        json_object_set_new(o, "messages", msgs);
    } else if (conv && conv->text) {
        size_t pl = strlen(p->text);
        char *full = malloc(conv->len + pl + 1);
        if (!full) {
            json_decref(o);
            return NULL;
        }
        memcpy(full, conv->text, conv->len);
        memcpy(full + conv->len, p->text, pl + 1);
        json_object_set_new(o, "prompt", json_string(full));
        free(full);
    } else {
        json_object_set_new(o, "prompt", json_string(p->text));
    }
    json_object_set_new(o, "max_tokens", json_integer(p->max_tokens));
    json_object_set_new(o, "stream", json_true());
    json_t *so = json_object();
    json_object_set_new(so, "include_usage", json_true());
    json_object_set_new(o, "stream_options", so);
    if (cfg->ignore_eos)
        json_object_set_new(o, "ignore_eos", json_true());
    if (!isnan(cfg->temperature))
        json_object_set_new(o, "temperature", json_real(cfg->temperature));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static void client_req_free(struct client_req *q)
{
    if (!q)
        return;
    if (q->easy)
        curl_easy_cleanup(q->easy);
    serve_sse_deinit(&q->sse);
    free(q->body);
    free(q->itl);
    free(q->text);
    free(q);
}

/* "HTTP 500: <the error message from the body, or the body's start>". */
static void client_http_message(const struct client_req *q, char *out, size_t cap)
{
    json_t *o = json_loads(q->errbody, 0, NULL);
    json_t *e = json_object_get(o, "error");
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    if (!json_is_string(m))
        m = json_object_get(o, "message");
    if (json_is_string(m)) {
        snprintf(out, cap, "HTTP %ld: %.200s", q->status, json_string_value(m));
    } else {
        char clean[161];
        size_t k = 0;
        for (size_t i = 0; i < q->errlen && k < sizeof clean - 1; i++)
            clean[k++] = (q->errbody[i] == '\n' || q->errbody[i] == '\r') ? ' ' : q->errbody[i];
        clean[k] = '\0';
        snprintf(out, cap, k ? "HTTP %ld: %s" : "HTTP %ld (empty body)", q->status, clean);
    }
    json_decref(o);
}

/* Decides the one outcome of a finished transfer and moves its measurements into r. */
static void client_finish(struct client_req *q, CURLcode res, double t0, double t_end, int approx_tokens,
                          struct serve_request_result *r)
{
    char msg[400] = "";
    int outcome = SERVE_FAIL_OTHER;
    long st = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &st);
    if (st)
        q->status = st;
    if (res == CURLE_OK && q->status == 200 && !q->bad && !q->oom) {
        if (serve_sse_finish(&q->sse, client_on_event, q) == ERR_TOO_LARGE)
            client_set_bad(q, "an event in the stream is larger than 8 MiB");
    }
    bool complete = q->status == 200 && q->done_seen && !q->bad;
    if (complete && (res == CURLE_OPERATION_TIMEDOUT || res == CURLE_PARTIAL_FILE || res == CURLE_RECV_ERROR))
        res = CURLE_OK; /* the answer was whole at [DONE]; what the connection did afterwards is not the request's */
    if (q->oom) {
        outcome = SERVE_FAIL_OTHER;
        snprintf(msg, sizeof msg, "out of memory while reading the stream");
    } else if (res == CURLE_OK || (res == CURLE_WRITE_ERROR && q->aborted)) {
        if (q->status != 200) {
            outcome = SERVE_FAIL_HTTP;
            client_http_message(q, msg, sizeof msg);
        } else if (q->bad) {
            outcome = SERVE_FAIL_STREAM;
            snprintf(msg, sizeof msg, "malformed stream: %s", q->bad_msg);
        } else if (!q->done_seen) {
            outcome = SERVE_FAIL_STREAM;
            snprintf(msg, sizeof msg, "the stream ended without data: [DONE] (after %d content chunks)", q->n_chunks);
        } else {
            outcome = SERVE_OK;
        }
    } else if (res == CURLE_COULDNT_CONNECT || res == CURLE_COULDNT_RESOLVE_HOST ||
               res == CURLE_COULDNT_RESOLVE_PROXY) {
        outcome = SERVE_FAIL_CONNECT;
        snprintf(msg, sizeof msg, "cannot connect: %s", q->curl_err[0] ? q->curl_err : curl_easy_strerror(res));
    } else if (res == CURLE_OPERATION_TIMEDOUT) {
        outcome = SERVE_FAIL_TIMEOUT;
        snprintf(msg, sizeof msg, "timed out: %s", q->curl_err[0] ? q->curl_err : curl_easy_strerror(res));
    } else if (q->status == 200) {
        /* the response started and then the transport broke: the stream was cut */
        outcome = SERVE_FAIL_STREAM;
        snprintf(msg, sizeof msg, "the stream was cut after %d content chunks: %s", q->n_chunks,
                 q->curl_err[0] ? q->curl_err : curl_easy_strerror(res));
    } else if (q->status != 0) {
        outcome = SERVE_FAIL_HTTP;
        client_http_message(q, msg, sizeof msg);
    } else {
        outcome = SERVE_FAIL_OTHER;
        snprintf(msg, sizeof msg, "%s", q->curl_err[0] ? q->curl_err : curl_easy_strerror(res));
    }

    r->outcome = outcome;
    r->http_status = (int)q->status;
    r->error = outcome == SERVE_OK ? NULL : strdup(msg);
    r->start_s = q->t_send - t0;
    r->e2e_ms = ((q->done_seen ? q->t_done : t_end) - q->t_send) * 1000.0; /* the stream ends at [DONE] */
    r->ttft_ms = NAN;
    r->n_chunks = q->n_chunks;
    if (q->got_first)
        r->ttft_ms = (q->t_first - q->t_send) * 1000.0;
    r->itl_ms = q->itl;
    r->n_itl = q->n_itl;
    q->itl = NULL;
    r->output_from_usage = q->usage_completion >= 0;
    r->output_tokens = r->output_from_usage ? q->usage_completion : q->n_chunks;
    r->input_from_usage = q->usage_prompt >= 0;
    r->input_tokens = r->input_from_usage ? q->usage_prompt : approx_tokens;
    r->cached_tokens = q->usage_cached;
    r->text = q->text;
    q->text = NULL;
}

/* Creates the easy handle for prompt i (after conv's history, which may be NULL) and adds it to the multi
 * handle. capture: keep the answer's text. */
static struct client_req *client_start(const struct serve_client_config *cfg, CURLM *multi, struct curl_slist *headers,
                                       const struct serve_prompt *p, int i, const struct client_conv *conv,
                                       bool capture)
{
    struct client_req *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->index = i;
    q->usage_prompt = q->usage_completion = q->usage_cached = -1;
    q->capture = capture;
    serve_sse_init(&q->sse);
    q->body = client_body(cfg, p, conv);
    q->easy = curl_easy_init();
    if (!q->body || !q->easy)
        goto fail;
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, cfg->url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(q->body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, client_on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->curl_err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "wafer-bench/1");
    long tmo = (long)(cfg->timeout_s * 1000.0);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, tmo < 1 ? 1L : tmo);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, tmo < 1 ? 1L : tmo);
    q->t_send = clock_now_s();
    if (curl_multi_add_handle(multi, e) != CURLM_OK)
        goto fail;
    return q;
fail:
    client_req_free(q);
    return NULL;
}

static double client_exp_sample(uint64_t *s, double rate)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    double u = (double)(z >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
    return -log1p(-u) / rate;
}

/* Records requests [i, i + count) as failed without being sent (why: the reason). */
static void client_not_sent(struct serve_request_result *results, int i, int count, int turns, double start_s,
                            const char *why)
{
    for (int k = i; k < i + count; k++) {
        struct serve_request_result *r = &results[k];
        memset(r, 0, sizeof *r);
        r->outcome = SERVE_FAIL_OTHER;
        r->error = strdup(why);
        r->ttft_ms = r->e2e_ms = NAN;
        r->input_tokens = r->output_tokens = r->cached_tokens = -1;
        r->start_s = start_s;
        r->turn = k % turns;
    }
}

int serve_client_run(const struct serve_client_config *cfg, const struct serve_prompt *prompts, int n,
                     struct serve_request_result *results, double *duration_s, char *err)
{
    *duration_s = 0;
    if (n <= 0)
        return 0;
    bool closed_loop = cfg->concurrency > 0;
    if (!closed_loop && !(cfg->request_rate > 0))
        return err_set(err, ERR_INVALID_ARG, "need a concurrency or a request rate above 0");
    int turns = cfg->turns > 1 ? cfg->turns : 1;
    if (turns > 1 && (!closed_loop || n % turns))
        return err_set(err, ERR_INVALID_ARG, "conversations need a concurrency and whole groups of %d prompts", turns);
    int rc = 0, next = 0, done = 0, failed = 0, in_flight = 0;
    double *arrival = NULL;
    struct client_req **live = calloc((size_t)n, sizeof *live);
    struct client_conv *convs = turns > 1 ? calloc((size_t)(n / turns), sizeof *convs) : NULL;
    CURLM *multi = curl_multi_init();
    struct curl_slist *headers = NULL;
    if (!live || !multi || (turns > 1 && !convs)) {
        rc = err_set(err, ERR_NOMEM, "out of memory starting the run");
        goto out;
    }
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: text/event-stream");
    headers = curl_slist_append(headers, "Expect:"); /* no 100-continue round trip before long prompts */
    if (cfg->api_key) {
        size_t kl = strlen(cfg->api_key) + 32;
        char *h = malloc(kl);
        if (h) {
            snprintf(h, kl, "Authorization: Bearer %s", cfg->api_key);
            headers = curl_slist_append(headers, h);
            free(h);
        }
    }
    if (!headers) {
        rc = err_set(err, ERR_NOMEM, "out of memory starting the run");
        goto out;
    }
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long)(closed_loop ? (cfg->concurrency > 8 ? cfg->concurrency : 8) : 256));
    if (!closed_loop) {
        arrival = malloc((size_t)n * sizeof *arrival);
        if (!arrival) {
            rc = err_set(err, ERR_NOMEM, "out of memory starting the run");
            goto out;
        }
        uint64_t s = cfg->seed ^ 0x5851f42d4c957f2dull;
        double t = 0;
        for (int i = 0; i < n; i++) {
            arrival[i] = t;
            if (isfinite(cfg->request_rate))
                t += client_exp_sample(&s, cfg->request_rate);
        }
    }

    double t0 = clock_now_s(), t_last_done = t0, t_progress = 0;
    while (done < n) {
        /* start whatever is due */
        double now = clock_now_s() - t0;
        while (next < n && (closed_loop ? in_flight < cfg->concurrency : arrival[next] <= now)) {
            /* a conversation's first turn; its later turns start as the answers arrive, in the same slot */
            struct client_req *q = client_start(cfg, multi, headers, &prompts[next], next, NULL,
                                                cfg->capture_text || turns > 1);
            if (!q) {
                client_not_sent(results, next, turns, turns, now, "could not start the request (out of memory)");
                done += turns;
                failed += turns;
            } else {
                live[next] = q;
                in_flight++;
            }
            next += turns;
        }
        int running = 0;
        CURLMcode mc = curl_multi_perform(multi, &running);
        if (mc != CURLM_OK) {
            rc = err_set(err, ERR_INTERNAL, "curl_multi_perform failed: %s", curl_multi_strerror(mc));
            goto out;
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct client_req *q = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
            CURLcode res = msg->data.result;
            double t_end = clock_now_s();
            int i = q->index, t = i % turns;
            struct serve_request_result *r = &results[i];
            memset(r, 0, sizeof *r);
            /* a later turn's prompt is its history plus the new message: only usage can count it */
            client_finish(q, res, t0, t_end, t ? -1 : prompts[i].approx_tokens, r);
            r->turn = t;
            curl_multi_remove_handle(multi, q->easy);
            live[i] = NULL;
            client_req_free(q);
            done++;
            failed += r->outcome != SERVE_OK;
            t_last_done = t_end;
            struct client_req *nq = NULL;
            if (t + 1 < turns) {
                struct client_conv *conv = &convs[i / turns];
                const char *why = "not sent: an earlier turn of its conversation failed";
                if (r->outcome == SERVE_OK) {
                    why = "not sent: out of memory for the conversation's history";
                    if (!client_conv_add(conv, cfg->endpoint, prompts[i].text, r->text ? r->text : ""))
                        nq = client_start(cfg, multi, headers, &prompts[i + 1], i + 1, conv,
                                          cfg->capture_text || t + 2 < turns);
                }
                if (nq) {
                    live[i + 1] = nq; /* the conversation keeps its slot */
                } else {
                    client_not_sent(results, i + 1, turns - t - 1, turns, t_end - t0, why);
                    done += turns - t - 1;
                    failed += turns - t - 1;
                }
            }
            if (turns > 1 && !cfg->capture_text) {
                free(r->text); /* kept only as the history */
                r->text = NULL;
            }
            if (!nq) {
                if (turns > 1)
                    client_conv_clear(&convs[i / turns]);
                in_flight--;
            }
        }
        if (done >= n)
            break;
        int wait_ms = 100;
        if (closed_loop && next < n && in_flight < cfg->concurrency)
            wait_ms = 0;
        if (!closed_loop && next < n) {
            double dt = arrival[next] - (clock_now_s() - t0);
            wait_ms = dt <= 0 ? 0 : dt >= 0.1 ? 100 : (int)ceil(dt * 1000.0);
        }
        if (wait_ms > 0) {
            mc = curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
            if (mc != CURLM_OK) {
                rc = err_set(err, ERR_INTERNAL, "curl_multi_poll failed: %s", curl_multi_strerror(mc));
                goto out;
            }
        }
        double el = clock_now_s() - t0;
        if (cfg->progress && el - t_progress >= 0.1) {
            t_progress = el;
            cfg->progress(cfg->progress_ctx, done, failed, n, el);
        }
    }
    *duration_s = t_last_done - t0;
    if (cfg->progress)
        cfg->progress(cfg->progress_ctx, done, failed, n, *duration_s);
out:
    if (live) {
        for (int i = 0; i < n; i++) {
            if (live[i]) {
                curl_multi_remove_handle(multi, live[i]->easy);
                client_req_free(live[i]);
            }
        }
    }
    free(live);
    for (int c = 0; convs && c < n / turns; c++)
        client_conv_clear(&convs[c]);
    free(convs);
    free(arrival);
    curl_slist_free_all(headers);
    if (multi)
        curl_multi_cleanup(multi);
    return rc;
}

struct client_buf {
    char *p;
    size_t len, cap;
};

static size_t client_buf_write(char *p, size_t size, size_t nmemb, void *ud)
{
    struct client_buf *b = ud;
    size_t n = size * nmemb;
    if (b->len + n + 1 > (4u << 20))
        return 0;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return 0;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

int serve_client_simple(const char *url, const char *api_key, const char *body, double timeout_s, long *status,
                        char **response, char *err)
{
    *status = 0;
    *response = NULL;
    struct client_buf b = {0};
    struct curl_slist *headers = NULL;
    char cerr[CURL_ERROR_SIZE] = "";
    char auth[1024];
    CURL *e = curl_easy_init();
    if (!e)
        return err_set(err, ERR_NOMEM, "curl_easy_init failed");
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");
    if (api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        headers = curl_slist_append(headers, auth);
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, client_buf_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000.0));
    curl_easy_setopt(e, CURLOPT_USERAGENT, "wafer-bench/1");
    CURLcode res = curl_easy_perform(e);
    int rc = 0;
    if (res != CURLE_OK) {
        rc = err_set(err, ERR_IO, "%s: %s", url, cerr[0] ? cerr : curl_easy_strerror(res));
        free(b.p);
    } else {
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
        *response = b.p ? b.p : calloc(1, 1);
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(e);
    return rc;
}
