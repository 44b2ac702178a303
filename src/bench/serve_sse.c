/*
 * serve_sse: a byte-at-a-time line splitter (CR, LF or CRLF end a line, as the SSE spec allows) that keeps
 * its partial line across calls, so a chunk boundary anywhere, even inside "\r\n", gives the same events.
 * Only "data" fields matter to us; "event", "id", "retry" and ":" comments are skipped. Chunk JSON is read
 * with jansson and tolerant of servers that mix shapes (a chat server sending "text", reasoning models
 * streaming delta.reasoning_content).
 */
#include "bench/serve_sse.h"

#include "core/err.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void serve_sse_init(struct serve_sse *s) { memset(s, 0, sizeof *s); }

void serve_sse_deinit(struct serve_sse *s)
{
    free(s->line);
    free(s->data);
    memset(s, 0, sizeof *s);
}

static int sse_grow(char **buf, size_t *cap, size_t need)
{
    if (need > SERVE_SSE_MAX_EVENT + 16)
        return ERR_TOO_LARGE;
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb)
        return ERR_NOMEM;
    *buf = nb;
    *cap = c;
    return 0;
}

static int sse_dispatch(struct serve_sse *s, serve_sse_event_fn fn, void *ctx)
{
    if (!s->has_data)
        return 0;
    s->has_data = false;
    size_t len = s->data_len;
    s->data_len = 0;
    s->data[len] = '\0';
    return fn(ctx, s->data, len);
}

/* One complete line: blank ends the event, "data:" appends, anything else is ignored. */
static int sse_line(struct serve_sse *s, serve_sse_event_fn fn, void *ctx)
{
    const char *l = s->line ? s->line : "";
    size_t n = s->line_len;
    s->line_len = 0;
    if (n == 0)
        return sse_dispatch(s, fn, ctx);
    const char *v;
    size_t vn;
    if (n == 4 && !memcmp(l, "data", 4)) { /* a field name alone has an empty value */
        v = "";
        vn = 0;
    } else if (n >= 5 && !memcmp(l, "data:", 5)) {
        v = l + 5;
        vn = n - 5;
        if (vn && *v == ' ') {
            v++;
            vn--;
        }
    } else {
        return 0; /* event:, id:, retry: and ": comments" do not matter here */
    }
    size_t need = s->data_len + (s->has_data ? 1 : 0) + vn + 1;
    int rc = sse_grow(&s->data, &s->data_cap, need);
    if (rc)
        return rc;
    if (s->has_data)
        s->data[s->data_len++] = '\n';
    memcpy(s->data + s->data_len, v, vn);
    s->data_len += vn;
    s->data[s->data_len] = '\0';
    s->has_data = true;
    return 0;
}

int serve_sse_feed(struct serve_sse *s, const char *buf, size_t n, serve_sse_event_fn fn, void *ctx)
{
    size_t i = 0;
    while (i < n) {
        char c = buf[i];
        if (c == '\n' && s->last_cr) { /* second half of CRLF */
            s->last_cr = false;
            i++;
            continue;
        }
        s->last_cr = false;
        if (c == '\r' || c == '\n') {
            s->last_cr = c == '\r';
            int rc = sse_line(s, fn, ctx);
            if (rc)
                return rc;
            i++;
            continue;
        }
        /* copy the run up to the next line end in one go */
        size_t j = i;
        while (j < n && buf[j] != '\r' && buf[j] != '\n')
            j++;
        int rc = sse_grow(&s->line, &s->line_cap, s->line_len + (j - i) + 1);
        if (rc)
            return rc;
        memcpy(s->line + s->line_len, buf + i, j - i);
        s->line_len += j - i;
        i = j;
    }
    return 0;
}

int serve_sse_finish(struct serve_sse *s, serve_sse_event_fn fn, void *ctx)
{
    if (s->line_len) {
        int rc = sse_line(s, fn, ctx);
        if (rc)
            return rc;
    }
    return sse_dispatch(s, fn, ctx);
}

static int chunk_usage_int(json_t *usage, const char *key)
{
    json_t *v = json_object_get(usage, key);
    if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < (1 << 30))
        return (int)json_integer_value(v);
    return -1;
}

/* The streamed text of choices[0], from whichever field this server uses. */
static const char *chunk_text(json_t *choice, size_t *len)
{
    json_t *t = json_object_get(choice, "text");
    if (!json_is_string(t)) {
        json_t *delta = json_object_get(choice, "delta");
        t = json_object_get(delta, "content");
        if (!json_is_string(t) || json_string_length(t) == 0)
            t = json_object_get(delta, "reasoning_content");
    }
    if (!json_is_string(t) || json_string_length(t) == 0)
        return NULL;
    *len = json_string_length(t);
    return json_string_value(t);
}

int serve_chunk_parse(const char *data, size_t len, struct serve_chunk *out, char *err)
{
    memset(out, 0, sizeof *out);
    out->prompt_tokens = out->completion_tokens = out->cached_tokens = -1;
    size_t a = 0, b = len;
    while (a < b && (data[a] == ' ' || data[a] == '\t'))
        a++;
    while (b > a && (data[b - 1] == ' ' || data[b - 1] == '\t'))
        b--;
    if (b - a == 6 && !memcmp(data + a, "[DONE]", 6)) {
        out->done = true;
        return 0;
    }
    json_error_t jerr;
    /* JSON_ALLOW_NUL: a token may be the byte 0, sent as \u0000 (llama-server does); text keeps its length */
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!root)
        return err_set(err, ERR_FORMAT, "bad JSON in a data line (%s at column %d): %.60s", jerr.text,
                       jerr.column, data);
    if (!json_is_object(root)) {
        json_decref(root);
        return err_set(err, ERR_FORMAT, "a data line is not a JSON object: %.60s", data);
    }
    json_t *e = json_object_get(root, "error");
    if (e && !json_is_null(e)) {
        out->is_error = true;
        json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
        snprintf(out->message, sizeof out->message, "%s",
                 json_is_string(m) ? json_string_value(m) : "error event without a message");
    }
    json_t *choices = json_object_get(root, "choices");
    if (json_is_array(choices) && json_array_size(choices) > 0) {
        size_t tl = 0;
        const char *t = chunk_text(json_array_get(choices, 0), &tl);
        if (t) {
            out->text = malloc(tl + 1);
            if (!out->text) {
                json_decref(root);
                return err_set(err, ERR_NOMEM, "out of memory");
            }
            memcpy(out->text, t, tl);
            out->text[tl] = '\0';
            out->text_len = tl;
        }
    }
    json_t *usage = json_object_get(root, "usage");
    if (json_is_object(usage)) {
        out->prompt_tokens = chunk_usage_int(usage, "prompt_tokens");
        out->completion_tokens = chunk_usage_int(usage, "completion_tokens");
        json_t *details = json_object_get(usage, "prompt_tokens_details"); /* OpenAI, vLLM, SGLang, wafer */
        if (json_is_object(details))
            out->cached_tokens = chunk_usage_int(details, "cached_tokens");
    }
    json_decref(root);
    return 0;
}
