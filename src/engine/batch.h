/*
 * batch: the unit of work of a forward pass: a ragged list of tokens from any number of sequences, each
 * with its sequence id and position, and whether its logits are wanted. Prefill of one prompt, decode of 16
 * sequences, and chunked prefill mixed with decodes are all the same call.
 *
 * Rules (checked by engine_forward): a sequence's tokens in one batch have consecutive increasing positions
 * starting at the sequence's current length (the number of positions already in its KV cache).
 */
#ifndef WAFER_ENGINE_BATCH_H
#define WAFER_ENGINE_BATCH_H

#include <stdbool.h>
#include <stdint.h>

struct batch_token {
    int32_t token;
    int32_t pos;
    int32_t seq;
    bool logits;
};

struct batch {
    struct batch_token *tok; /* [cap] */
    int n;
    int cap;
};

/* Allocates room for cap tokens. 0 or ERR_NOMEM. Release with batch_deinit. */
int batch_init(struct batch *b, int cap);
void batch_deinit(struct batch *b);
static inline void batch_clear(struct batch *b) { b->n = 0; }
/* Appends a token; returns 0, or ERR_NO_SPACE when the batch is full. */
int batch_add(struct batch *b, int32_t token, int32_t pos, int32_t seq, bool logits);

#endif
