/*
 * request_validate: request bodies (JSON, or a query string) -> validated generation parameters. Pure
 * functions with no server state, so they are unit-tested and fuzzed on their own (tests/fuzz).
 *
 * Every refusal fills a struct api_error naming the parameter ("temperature", "messages[2].role") with an
 * OpenAI-style sentence; the server turns it into {"error":{"message","type","param","code"}}. What cannot
 * be checked without the model (prompt length vs. the context, the model name) is checked by the server.
 */
#ifndef WAFER_SERVER_REQUEST_VALIDATE_H
#define WAFER_SERVER_REQUEST_VALIDATE_H

#include "engine/sampler.h"
#include "server/chat_template.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum api_kind {
    API_COMPLETIONS,  /* POST /v1/completions */
    API_CHAT,         /* POST /v1/chat/completions */
    API_GENERATE,     /* POST /v1/generate, GET /v1/generate_stream, items of /v1/batch_generate */
    API_TOKENIZE,     /* POST /tokenize */
    API_DETOKENIZE,   /* POST /detokenize */
};

#define REQ_MAX_N 16          /* choices per prompt */
#define REQ_MAX_STOP 16       /* stop strings */
#define REQ_MAX_STOP_LEN 256  /* bytes per stop string */
#define REQ_MAX_LOGPROBS 20   /* top logprobs */
#define REQ_MAX_PROMPTS 64    /* prompts in one completions request / items in one batch */
#define REQ_MAX_TOKENS_LIMIT (1 << 24)
#define REQ_MAX_TOOLS 128      /* tools per request (OpenAI's limit) */
#define REQ_MAX_LOGIT_BIAS 1024 /* logit_bias entries */

/* tool_choice */
enum gen_tool_choice {
    GEN_TOOLS_NONE = 0, /* no tools offered, free text (the default without tools) */
    GEN_TOOLS_AUTO,     /* text or calls, as the model decides (the default with tools) */
    GEN_TOOLS_REQUIRED, /* one or more calls */
    GEN_TOOLS_NAMED,    /* calls of tool_named only */
};

struct api_error {
    int code;            /* ERR_* (ERR_FORMAT, ERR_INVALID_ARG, ERR_UNSUPPORTED, ...) */
    char param[96];      /* offending parameter, "" when none */
    const char *oa_code; /* OpenAI "code" ("context_length_exceeded", "model_not_found") or NULL */
    char message[512];
};

/* Server-wide defaults for parameters a request leaves out. */
struct gen_defaults {
    int max_new_tokens;
    float temperature, top_p, min_p, repeat_penalty;
    int top_k;
    bool parse_special; /* prompt text: special-token text becomes special tokens (default false) */
};

/* One prompt: text, or token ids (completions accepts both). */
struct gen_prompt {
    char *text;      /* owned, or NULL */
    int32_t *tokens; /* owned, or NULL */
    int n_tokens;
};

struct gen_request {
    enum api_kind kind;
    char *model; /* owned; NULL when the request names none */

    struct gen_prompt *prompts; /* [n_prompts], owned (completions, generate, tokenize) */
    int n_prompts;
    struct chat_message *messages; /* [n_messages], strings owned (chat; tokenize with "messages") */
    int n_messages;

    int max_tokens; /* -1: not given (the server picks the default and the context's room) */
    struct sampler_params sp;
    bool seed_set;
    char **stop; /* [n_stop], owned */
    int n_stop;
    int n; /* choices per prompt */
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    int logprobs;       /* -1: none; else how many top alternatives per token (0..REQ_MAX_LOGPROBS) */
    bool chat_logprobs; /* completions with "logprobs_format": "chat" (a wafer extension): logprobs entries in
                         * chat's shape ({content: [{token, logprob, bytes, top_logprobs}]}), so wafer route
                         * can continue a chat stream through /v1/completions */
    bool echo;          /* completions: prepend the prompt to the text */
    bool return_token_ids; /* stream: chunks carry token_ids, the first prompt_token_ids (as vLLM) */
    bool ignore_eos;
    /* structured output (response_format json_object / json_schema, llama.cpp's grammar and json_schema):
     * compiled by the server, which refuses a malformed one naming constraint_param */
    int constraint_kind;          /* 0: none; else an enum grammar_kind (engine/grammar/grammar_cache.h) */
    unsigned constraint_flags;    /* GRAMMAR_SCHEMA_* (strict) */
    char *constraint_text;        /* owned: the schema as compact JSON, or the GBNF text */
    const char *constraint_param; /* the field it came from ("response_format", "grammar", "json_schema") */
    float timeout;      /* seconds this request may take (0: the server's request_timeout only) */
    bool add_special;   /* tokenize: add BOS (default true) */
    bool with_pieces;   /* tokenize: return {id, piece} objects */
    bool parse_special; /* prompt text (completions, generate, tokenize): special-token text becomes special
                         * tokens; default the server's (gen_defaults.parse_special) */
    bool add_generation_prompt; /* tokenize with messages: end with the assistant's prefix (default true) */
    int32_t *tokens;    /* detokenize input, owned */
    int n_tokens;
    char *prediction;   /* completions, chat: OpenAI's prediction.content (owned), or NULL */
    /* chat tools: tools[i].name / .json owned; tool_params[i] the function's parameters schema as compact JSON
     * (key order kept), owned, NULL when it has none (any arguments object) */
    struct chat_tool *tools;
    char **tool_params;
    int n_tools;
    int tool_choice; /* enum gen_tool_choice */
    int tool_named;  /* GEN_TOOLS_NAMED: index into tools */
    bool parallel_tool_calls; /* default true: one or more calls per answer; false: exactly one */
    struct sampler_bias *logit_bias; /* [n_logit_bias], owned: token ids checked against the vocabulary by
                                        the server */
    int n_logit_bias;
    int spec;           /* "speculation": -1 not given, else enum sched_spec (off, ngram, draft) */
};

void gen_defaults_init(struct gen_defaults *d);

/* Parses and validates body[0..len) for kind. 0 and *out filled (release with gen_request_deinit), or a
 * negative code with e filled (out is then empty; deinit is still safe). */
int request_parse(enum api_kind kind, const char *body, size_t len, const struct gen_defaults *d,
                  struct gen_request *out, struct api_error *e);

/* GET /v1/generate_stream?prompt=...&max_new_tokens=...: the query string (after '?', percent-encoded)
 * becomes the same request as POST /v1/generate with stream=true. */
int request_parse_query(const char *query, size_t len, const struct gen_defaults *d, struct gen_request *out,
                        struct api_error *e);

/* POST /v1/batch_generate {requests: [...], common_params: {...}}: each item is common_params overlaid with
 * the item's own fields, validated as /v1/generate. Returns 0 when the envelope is valid (then *items and
 * *errs have *n entries, errs[i].code != 0 marking an item that failed), or a negative code with e filled.
 * Caller frees with gen_request_batch_free. */
int request_parse_batch(const char *body, size_t len, const struct gen_defaults *d, struct gen_request **items,
                        struct api_error **errs, int *n, struct api_error *e);
void gen_request_batch_free(struct gen_request *items, struct api_error *errs, int n);

void gen_request_deinit(struct gen_request *r);

/* Fills e and returns code (helper shared with the handlers). */
int api_error_set(struct api_error *e, int code, const char *param, const char *oa_code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Decodes %XX and '+' in place; returns the new length, or -1 on a bad escape. */
int url_decode(char *s, size_t len);

#endif
