/*
 * bench_spec: `wafer bench --spec SRC`, speculative decoding end to end in one process: greedy requests
 * through the scheduler on the benchmark's engine, with and without speculation, interleaved. The model's
 * own greedy answer T of n_gen tokens to a fixed prompt is taken first; then every round runs the plain
 * request and the speculative one in alternating order, checks both answers equal T token for token
 * (speculation never changes the output) and compares their decode speeds (tokens after the first over the
 * time from the first to the last). Random-weight models do not repeat their prompt, so predictions built
 * from T are how the benchmark controls acceptance:
 *   exact   prediction = T (an edit that changes nothing: the ceiling)
 *   half    prediction = T with every other chunk of 8 tokens replaced
 *   wrong   prediction = T's tokens in reverse order
 *   ngram   n-gram drafts over the prompt and the text so far
 *   draft   the draft model's drafts (draft engine required)
 */
#ifndef WAFER_BENCH_BENCH_SPEC_H
#define WAFER_BENCH_BENCH_SPEC_H

#include "engine/engine.h"

#include <stdbool.h>

struct bench_spec_result {
    double ratio;              /* median over rounds of speculative / plain decode tokens/s */
    double plain_tps, spec_tps; /* medians of the decode speeds */
    int drafted, accepted;     /* drafted and accepted tokens, all rounds */
    int rounds;
};

/* Whether name is a source bench_spec knows (exact, half, wrong, ngram, draft). */
bool bench_spec_known(const char *name);

/* Runs the comparison on engine e (m's; max_seqs >= 1, max_batch_tokens >= 33, context >= prompt + n_gen),
 * de the draft model's engine for "draft" (else NULL), draft_fixed: verify drafts whole. Prints one line per
 * round to stderr. 0, or -1 with a message in err (an answer that differs from T included). */
int bench_spec_run(struct engine *e, struct engine *de, const char *src, int n_gen, int rounds, bool draft_fixed,
                   struct bench_spec_result *out, char *err);

#endif
