/*
 * serve_prompts: what `wafer bench serve` sends. Synthetic prompts are random common English words (about
 * one token per word for llama vocabularies, so a target token length becomes a word count), drawn from a
 * seeded generator so the same --seed sends the same prompts. Datasets and quality sets are JSONL files.
 */
#ifndef WAFER_BENCH_SERVE_PROMPTS_H
#define WAFER_BENCH_SERVE_PROMPTS_H

#include "bench/serve.h"

#include <stdbool.h>
#include <stdint.h>

/* n prompts of n_words random words each, max_tokens each, approx_tokens = target_tokens. Same arguments,
 * same prompts. Returns 0 or ERR_NOMEM / ERR_INVALID_ARG with a message in err. */
int serve_prompts_synthetic(struct serve_prompt_set *out, int n, int n_words, int target_tokens, int max_tokens,
                            uint64_t seed, char *err);

/* Reads a JSONL dataset: one {"prompt": "...", "max_tokens": N} per line (max_tokens optional, default
 * default_max_tokens; blank lines skipped). Returns 0, ERR_IO or ERR_FORMAT with "FILE:LINE: reason". */
int serve_prompts_load_dataset(struct serve_prompt_set *out, const char *path, int default_max_tokens, char *err);

/* Reads a JSONL quality set: {"prompt": "...", "expected_keywords": ["...", ...], "max_tokens": N}. */
int serve_prompts_load_quality(struct serve_prompt_set *out, const char *path, int default_max_tokens, char *err);

/* Copies n prompts of src starting at index first (mod src->n), cycling when src has fewer. */
int serve_prompts_take(struct serve_prompt_set *out, const struct serve_prompt_set *src, int first, int n, char *err);

void serve_prompts_free(struct serve_prompt_set *s);

/* Scores an answer against p's keywords: the fraction found (ASCII case-insensitive substring match);
 * found[i] (n_keywords entries, may be NULL) says which. 0 for a NULL answer; 1 when there are no keywords. */
double serve_quality_score(const char *answer, const struct serve_prompt *p, bool *found);

#endif
