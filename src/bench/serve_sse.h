/*
 * serve_sse: incremental parsing of an OpenAI streaming response. serve_sse_feed() takes the body in
 * whatever pieces the network delivers and calls back once per complete server-sent event with its data
 * (multiple data: lines joined by '\n'); serve_chunk_parse() reads one event's JSON: the streamed text
 * (choices[0].text for /v1/completions, choices[0].delta.content for chat), the usage block, an error
 * object, or the [DONE] sentinel.
 */
#ifndef WAFER_BENCH_SERVE_SSE_H
#define WAFER_BENCH_SERVE_SSE_H

#include <stdbool.h>
#include <stddef.h>

#define SERVE_SSE_MAX_EVENT (8u << 20) /* one event larger than this is a malformed stream */

struct serve_sse {
    char *line;      /* the line being assembled (no terminator yet) */
    size_t line_len, line_cap;
    char *data;      /* data of the event being assembled */
    size_t data_len, data_cap;
    bool has_data;
    bool last_cr;    /* the previous byte was '\r' (so a following '\n' ends nothing new) */
};

/* Called per event; a nonzero return stops the feed and is passed back to the caller. data is
 * NUL-terminated and valid only during the call. */
typedef int (*serve_sse_event_fn)(void *ctx, const char *data, size_t len);

void serve_sse_init(struct serve_sse *s);
void serve_sse_deinit(struct serve_sse *s);

/* Feeds n bytes. Returns 0, the callback's nonzero value, ERR_TOO_LARGE for an event over
 * SERVE_SSE_MAX_EVENT, or ERR_NOMEM. */
int serve_sse_feed(struct serve_sse *s, const char *buf, size_t n, serve_sse_event_fn fn, void *ctx);

/* End of body: delivers a last event whose blank line never came (servers that end on "data: [DONE]\n").
 * Same returns as serve_sse_feed. */
int serve_sse_finish(struct serve_sse *s, serve_sse_event_fn fn, void *ctx);

struct serve_chunk {
    bool done;              /* the data was [DONE] */
    bool is_error;          /* the event was {"error": ...} */
    char *text;             /* streamed text, owned (caller frees); NULL when the chunk had none */
    size_t text_len;
    int prompt_tokens;      /* from usage, -1 when absent */
    int completion_tokens;  /* from usage, -1 when absent */
    int cached_tokens;      /* usage.prompt_tokens_details.cached_tokens (prompt tokens a prefix cache served),
                             * -1 when absent */
    char message[200];      /* is_error: the server's message */
};

/* Parses one event's data. Returns 0, or ERR_FORMAT with a message in err (ERR_MSG_MAX bytes) when it is
 * not [DONE] and not a JSON object. Caller frees out->text. */
int serve_chunk_parse(const char *data, size_t len, struct serve_chunk *out, char *err);

#endif
