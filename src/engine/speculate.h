/*
 * speculate: the policy half of speculative decoding, kept free of the engine so it is tested on its own:
 * where drafted tokens come from, what a forward pass of n tokens costs on this machine (measured), and how
 * many drafted tokens each sequence verifies in a step. The scheduler (scheduler.c) does the mechanics:
 * feeding drafts, sampling every verify row, rolling back the KV of rejected tokens.
 *
 * Draft sources, both "lookup" drafts (no second model):
 *   - a prediction (OpenAI's predicted outputs: the text the client expects, e.g. the file being edited):
 *     a cursor follows the generated tokens through the prediction; after a divergence the longest suffix
 *     of the generated tokens that occurs in the prediction realigns it (an edit in the middle of a file);
 *   - n-gram prompt lookup: the longest suffix (nmax..nmin tokens) of prompt + generated that occurred
 *     before, latest occurrence first; the tokens that followed it are the draft.
 *
 * Draft lengths. A sequence whose drafted tokens are each accepted with probability a (estimated from its
 * own history, spec_accept) gains E(k) = a + a^2 + ... + a^k tokens from a k-token draft; a step of T tokens
 * costs c(T) (spec_cost: the measured time of forward passes by size). spec_plan picks the drafts that
 * maximise the expected tokens per second of the step, (n_decodes + sum E(k_i)) / c(n_decodes + sum k_i),
 * so speculation stays off where the machine is compute-bound (a batch full of decodes, or a CPU whose
 * every extra token costs as much as the first) or acceptance is low, and grows where verifying is nearly
 * free. A sequence that is off probes now and then with a short draft, at an optimistic rate, and only when
 * the measured costs say a probe is cheap. The costs are of the scheduler's decode and verify passes (every
 * token with logits); a size never measured is interpolated, or extrapolated a little past the largest
 * measured one, so drafts grow as their costs become known (the scheduler times a pass one token longer
 * than its decodes once, with a short draft, before it plans by the curve).
 */
#ifndef WAFER_ENGINE_SPECULATE_H
#define WAFER_ENGINE_SPECULATE_H

#include <stdbool.h>
#include <stdint.h>

/* Drafts up to max tokens from the prediction pred[0..n_pred) into out, given the tokens generated so far
 * gen[0..n_gen) (n_gen >= 1). *cursor (0 at the start) is the index in pred just after the last generated
 * token it matched; it is updated. When the last generated token does not continue the prediction at the
 * cursor, the longest suffix of gen (up to 8 tokens) found in pred moves the cursor after it (the first
 * occurrence at or after the old cursor, else the first): a suffix of 3 tokens or more (or all of gen)
 * anywhere, a shorter one only a few tokens past the old cursor (a small edit); with no match the cursor
 * steps over one predicted token (the generated one replaced it). Returns the tokens drafted (0: none). */
int spec_draft_prediction(const int32_t *pred, int n_pred, const int32_t *gen, int n_gen, int *cursor, int32_t *out,
                          int max);

/* Drafts up to max tokens by n-gram lookup in hist[0..n): finds the longest suffix of hist of nmax down to
 * nmin tokens that occurs earlier in hist (its latest earlier occurrence) and copies the tokens that
 * followed it. Returns the tokens drafted (0: no match). */
int spec_draft_ngram(const int32_t *hist, int n, int nmin, int nmax, int32_t *out, int max);

/* A sequence's acceptance history: per-position outcomes, older ones decayed. */
struct spec_accept {
    float hits;  /* drafted tokens accepted */
    float tries; /* drafted tokens whose fate was seen: the accepted ones and the first rejected one */
};

/* The estimated probability that a drafted token is accepted (given the ones before it were): prior (a
 * draft source's, e.g. 1/2; a client's prediction is trusted more) worth one observation, then the
 * history. */
float spec_accept_rate(const struct spec_accept *a, float prior);
/* Records a verify: accepted of the drafted tokens were accepted; rejected tells whether one was then
 * rejected (false when the draft ran out or the sequence finished first: nothing seen past it). */
void spec_accept_update(struct spec_accept *a, int accepted, bool rejected);

/* Measured cost of a forward pass by its size in tokens. */
struct spec_cost {
    double *ns; /* [n + 1]: EMA of the time of a pass of t tokens (0: never measured); index 0 unused */
    int n;
};

/* Room for passes of up to n tokens. 0 or ERR_NOMEM. */
int spec_cost_init(struct spec_cost *c, int n);
void spec_cost_deinit(struct spec_cost *c);
/* Records that a pass of t tokens took ns nanoseconds (t beyond n is ignored), into a moving average that
 * follows the lower edge of the measures: on a shared machine other work only ever adds time, so measures
 * below the estimate weigh more and outliers far above it little; a size's first measure is capped at
 * proportional to the nearest smaller measured size. */
void spec_cost_record(struct spec_cost *c, int t, double ns);
/* Fills out[1..n] with the estimated cost of a pass of t tokens: the measured one, else linear between the
 * nearest measured sizes, past the largest measured one along the slope of the last two (proportional to t
 * when only one is known, so an unmeasured machine is assumed compute-bound); made non-decreasing in t.
 * Returns false (out untouched) when nothing was measured yet. */
bool spec_cost_curve(const struct spec_cost *c, int n, double *out);

/* One sequence that could verify drafted tokens this step. */
struct spec_cand {
    float alpha; /* estimated acceptance rate (spec_accept_rate) */
    int cap;     /* drafted tokens available (and allowed: max_tokens, context) */
    bool probe;  /* off for a while: consider a short draft at an optimistic rate */
    double tok_ns; /* cost of drafting each token (a draft model's pass; 0 for lookups), in the unit of cost */
    int k;       /* out: drafted tokens to verify (0: none) */
};

/* Chooses cand[i].k for a step that decodes n_dec sequences (the candidates among them), maximising the
 * expected tokens per unit of cost; cost[1..n_dec + max_total] from spec_cost_curve, plus each drafted
 * token's tok_ns. At most max_total
 * drafted tokens in all; a candidate's k is 0 or at least draft_min (a probe's is at most
 * max(draft_min, 1)). */
void spec_plan(const double *cost, int n_dec, struct spec_cand *cand, int n_cand, int max_total, int draft_min);

#endif
