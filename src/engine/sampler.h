/*
 * sampler: turns one position's logits into the next token, per sequence: repetition / frequency /
 * presence penalties over a window of recent tokens, then greedy (temperature 0) or top-k, top-p, min-p and
 * temperature followed by a draw from a per-sequence RNG seeded per request (same seed, same output).
 * Also stop strings: a matcher over the detokenized text that holds back a possible partial match, so a
 * stop string is never streamed to a client.
 *
 * Order of operations (as llama.cpp's default chain): penalties, top-k, top-p, min-p, temperature, draw.
 */
#ifndef WAFER_ENGINE_SAMPLER_H
#define WAFER_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sampler_params {
    float temperature;       /* 0: greedy (argmax, ties to the lowest id) */
    int top_k;               /* 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off (llama.cpp semantics: logit>0 divided, <0 multiplied) */
    int repeat_last_n;       /* window for all penalties (default 64; -1: whole history) */
    float frequency_penalty; /* 0: off (OpenAI semantics) */
    float presence_penalty;  /* 0: off */
    uint64_t seed;
};

/* OpenAI's defaults: temperature 1, top_p 1, top_k 0, min_p 0, no penalties (repeat_last_n 64), seed 0. The
 * server substitutes a random seed when a request has none. */
void sampler_params_default(struct sampler_params *p);

/* Checks ranges; 0 or ERR_INVALID_ARG with the parameter's name in err ("top_p must be in (0, 1]"). */
int sampler_params_validate(const struct sampler_params *p, char *err);

struct sampler;

/* NULL on OOM (or n_vocab <= 0). Caller frees with sampler_destroy. Allocates its per-step buffers here,
 * once (O(n_vocab)); sampling allocates nothing. The RNG is xoshiro256** seeded through splitmix64 from
 * p->seed: the same seed and the same logits give the same tokens, on every platform. Each non-greedy
 * sampler_sample call takes exactly one 64-bit draw; greedy calls take none. */
struct sampler *sampler_create(const struct sampler_params *p, int n_vocab);
void sampler_destroy(struct sampler *s);
/* Forgets the penalty history and reseeds the RNG from the params' seed (as if freshly created). */
void sampler_reset(struct sampler *s);

/* Adds a token to the penalty history (prompt tokens and generated ones). */
void sampler_accept(struct sampler *s, int32_t token);

/* OpenAI's logit_bias entry: bias is added to the token's logit before sampling (-100 bans it in practice,
 * +100 forces it wherever it is allowed). */
struct sampler_bias {
    int32_t token;
    float bias;
};

struct sampler_logprob {
    int32_t token;
    float logprob; /* natural log of the probability under the model's distribution (after penalties,
                      before temperature/truncation, as OpenAI reports) */
};

/* Picks the next token from logits[n_vocab] (modified in place). When top is not NULL, fills the n_top most
 * likely tokens with their logprobs (descending) and *chosen_logprob (may be NULL) with the chosen token's.
 * Does not call sampler_accept.
 * On return logits[] holds the penalized logits (NaN replaced by -inf): the distribution logprobs describe.
 * Ties (equal logits) rank the lower id first everywhere: greedy, top-k, top-p, logprobs. n_top beyond
 * n_vocab leaves the extra entries {-1, -INFINITY}. */
int32_t sampler_sample(struct sampler *s, float *logits, float *chosen_logprob, struct sampler_logprob *top,
                       int n_top);

/* Scores a token that is already known (a prompt token): its logprob under logits[n_vocab] as they are (no
 * penalties, temperature or truncation; logits are not modified), and the n_top most likely tokens in top
 * as sampler_sample fills them. Uses s's buffers only (no RNG draw, no history). */
float sampler_score(struct sampler *s, const float *logits, int32_t token, struct sampler_logprob *top, int n_top);

/* Stop strings over streamed text. */
struct stop_matcher {
    char **stops; /* owned copies */
    int n_stops;
    size_t max_len;
    char *held; /* text held back because it may begin a stop string */
    size_t held_len, held_cap;
    bool stopped; /* a stop string completed: later feeds emit nothing */
};

/* Copies the stop strings (empty strings ignored). 0 or ERR_NOMEM. */
int stop_matcher_init(struct stop_matcher *m, const char *const *stops, int n_stops);
void stop_matcher_deinit(struct stop_matcher *m);
/* Feeds newly generated text. Appends to out (cap bytes; returns bytes written, always <= len + held) the
 * text that can be emitted now. Sets *stopped when a stop string completed: the text before it is emitted,
 * the stop string and anything after it is dropped. The earliest match wins when several stops occur.
 * Held text is the longest suffix that is a prefix of some stop string, so it is cut only where a stop
 * string could begin. With cap >= len + held_len nothing else is held; a smaller cap emits what fits (cut
 * before a UTF-8 continuation byte) and keeps the rest held, never dropped. stopped may be NULL. */
size_t stop_matcher_feed(struct stop_matcher *m, const char *text, size_t len, char *out, size_t cap,
                         bool *stopped);
/* At the end of generation: emits what is held back (nothing after a stop); as feed, a cap smaller than
 * held_len emits what fits and keeps the rest. */
size_t stop_matcher_flush(struct stop_matcher *m, char *out, size_t cap);

#endif
