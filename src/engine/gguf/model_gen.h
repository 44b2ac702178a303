/*
 * model_gen: writes a llama-family GGUF of any shape and weight format with random weights, so tests and
 * benchmarks can make the models they need on a machine that cannot download any. The vocabulary (every
 * tokenizer.* key) is copied from an existing GGUF, e.g. a vocab-only file.
 *
 * Weights are N(0, std) (norm weights 1 + N(0, 0.1)), drawn from a generator seeded per (seed, tensor, row),
 * so the file is identical for a seed whatever the thread count. Rows are generated and quantized in parallel
 * and streamed to disk one tensor at a time.
 */
#ifndef WAFER_ENGINE_MODEL_GEN_H
#define WAFER_ENGINE_MODEL_GEN_H

#include "engine/gguf/ftype.h"

#include <stdbool.h>
#include <stdint.h>

struct model_gen_params {
    const char *arch; /* "llama" or "qwen2" */
    int dim, layers, heads, kv_heads, ffn, ctx;
    const char *vocab_from; /* GGUF with tokenizer.* metadata */
    enum ftype ftype;
    bool pure; /* every matrix in the format's base type */
    bool tied; /* no output matrix */
    float std;
    float rope_base;
    uint64_t seed;
    int threads;   /* <= 0: all cores */
    bool progress; /* progress line on stderr */
};

void model_gen_params_default(struct model_gen_params *p);

/* Writes the model to path. 0 or a negative error with a message; a partial file is removed. */
int model_gen_write(const struct model_gen_params *p, const char *path, char *err);

#endif
