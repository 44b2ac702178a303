/*
 * speculate: draft lookups, the acceptance estimate, the cost curve and the draft-length plan (see
 * speculate.h). Nothing here allocates after spec_cost_init; spec_plan works in fixed stack arrays.
 */
#include "engine/speculate.h"

#include "core/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_REALIGN_MAX 8     /* longest suffix of the generated tokens looked up in a prediction */
#define SPEC_SYNC_MIN 3        /* a realignment anywhere in the prediction needs this many matching tokens ... */
#define SPEC_SYNC_NEAR 4       /* ... one ending at most this many tokens past the match's length after the
                                  cursor (a small edit: a word replaced, inserted or dropped) needs one */
#define SPEC_DECAY 0.8f        /* weight of older verifies in the acceptance estimate, per verify */
#define SPEC_PROBE_ALPHA 0.7f  /* acceptance rate a probing sequence is planned with */
#define SPEC_MARGIN 0.02       /* speculate only for a gain of at least 2% over plain decoding */
#define SPEC_COST_EMA 0.3      /* weight of a new measure in the cost curve ... */
#define SPEC_COST_EMA_FAST 0.5 /* ... of one below the estimate (interference only ever adds time) */
#define SPEC_COST_EMA_SLOW 0.05 /* ... of one above 1.5x the estimate (a pass slowed by other work) */
#define SPEC_PLAN_MAX 256      /* candidates and drafted tokens spec_plan considers */

int spec_draft_prediction(const int32_t *pred, int n_pred, const int32_t *gen, int n_gen, int *cursor, int32_t *out,
                          int max)
{
    if (n_pred <= 0 || n_gen <= 0 || max <= 0)
        return 0;
    int c = *cursor;
    if (c >= 0 && c < n_pred && pred[c] == gen[n_gen - 1]) {
        c++; /* the last token continued the prediction */
    } else {
        /* realign (re-sync after an edit): the longest suffix of gen found in pred, its first occurrence
         * ending at or after the old cursor (the text goes on forward), else its first occurrence. A short
         * suffix is weak evidence (a common token matches anywhere): it realigns only near the old cursor,
         * so while the model writes text the prediction does not have, nothing is drafted rather than
         * drafts that fail; it re-syncs once SPEC_SYNC_MIN of its tokens match the prediction again. */
        c = -1;
        for (int len = n_gen < SPEC_REALIGN_MAX ? n_gen : SPEC_REALIGN_MAX; len >= 1 && c < 0; len--) {
            const int32_t *suf = gen + n_gen - len;
            bool strong = len >= SPEC_SYNC_MIN || len == n_gen;
            int first = -1;
            for (int j = len; j <= n_pred; j++) {
                if (pred[j - 1] != suf[len - 1] || memcmp(pred + j - len, suf, (size_t)len * sizeof *suf))
                    continue;
                if (first < 0)
                    first = j;
                if (j >= *cursor && (strong || j - *cursor <= len + SPEC_SYNC_NEAR)) {
                    c = j;
                    break;
                }
            }
            if (c < 0 && strong)
                c = first;
        }
        if (c < 0) {
            /* no match: the token took the place of the predicted one at the cursor, which steps over it,
             * so after an edit that replaces text by as many tokens the drafts resume at once */
            if (*cursor < n_pred)
                (*cursor)++;
            return 0;
        }
    }
    *cursor = c;
    int n = n_pred - c < max ? n_pred - c : max;
    memcpy(out, pred + c, (size_t)n * sizeof *out);
    return n;
}

int spec_draft_ngram(const int32_t *hist, int n, int nmin, int nmax, int32_t *out, int max)
{
    if (nmin < 1)
        nmin = 1;
    if (max <= 0)
        return 0;
    for (int len = nmax < n - 1 ? nmax : n - 1; len >= nmin; len--) {
        const int32_t *suf = hist + n - len;
        for (int j = n - 1; j >= len; j--) { /* j: end of an earlier occurrence (the suffix itself ends at n) */
            if (hist[j - 1] != suf[len - 1] || memcmp(hist + j - len, suf, (size_t)len * sizeof *suf))
                continue;
            int m = n - j < max ? n - j : max;
            memcpy(out, hist + j, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

float spec_accept_rate(const struct spec_accept *a, float prior) { return (a->hits + prior) / (a->tries + 1.0f); }

void spec_accept_update(struct spec_accept *a, int accepted, bool rejected)
{
    a->hits = a->hits * SPEC_DECAY + (float)accepted;
    a->tries = a->tries * SPEC_DECAY + (float)accepted + (rejected ? 1.0f : 0.0f);
}

int spec_cost_init(struct spec_cost *c, int n)
{
    c->n = n;
    c->ns = calloc((size_t)n + 1, sizeof *c->ns);
    return c->ns ? 0 : ERR_NOMEM;
}

void spec_cost_deinit(struct spec_cost *c)
{
    free(c->ns);
    c->ns = NULL;
    c->n = 0;
}

void spec_cost_record(struct spec_cost *c, int t, double ns)
{
    if (t < 1 || t > c->n || !(ns > 0))
        return;
    double *e = &c->ns[t];
    if (!(*e > 0)) {
        /* a first measure: never above proportional to the nearest smaller size's (more tokens cannot cost
         * more than proportionally more, but a pass that another process interrupted can) */
        for (int lo = t - 1; lo >= 1; lo--)
            if (c->ns[lo] > 0) {
                if (ns > c->ns[lo] * t / lo)
                    ns = c->ns[lo] * t / lo;
                break;
            }
        *e = ns;
        return;
    }
    double w = ns < *e ? SPEC_COST_EMA_FAST : ns > 1.5 * *e ? SPEC_COST_EMA_SLOW : SPEC_COST_EMA;
    *e = *e * (1 - w) + ns * w;
}

bool spec_cost_curve(const struct spec_cost *c, int n, double *out)
{
    int top = 0, below_top = 0; /* the largest measured size and the one before it */
    for (int t = 1; t <= c->n; t++)
        if (c->ns[t] > 0) {
            below_top = top;
            top = t;
        }
    if (!top)
        return false;
    /* past the largest measured size: along the slope of the last two, at most twice as far plus two (so
     * drafts grow step by step where nothing was measured); beyond that, never */
    double slope = below_top ? (c->ns[top] - c->ns[below_top]) / (top - below_top) : c->ns[top] / top;
    if (slope < 0)
        slope = 0;
    int lo = 0; /* largest measured size <= t */
    int hi = 0; /* smallest measured size >= t */
    for (int t = 1; t <= n; t++) {
        if (t <= c->n && c->ns[t] > 0)
            lo = t;
        if (hi < t) {
            hi = 0;
            for (int u = t; u <= c->n && u <= top; u++)
                if (c->ns[u] > 0) {
                    hi = u;
                    break;
                }
        }
        double v;
        if (lo == t)
            v = c->ns[t];
        else if (lo && hi)
            v = c->ns[lo] + (c->ns[hi] - c->ns[lo]) * (t - lo) / (hi - lo);
        else if (hi)
            v = c->ns[hi] * t / hi;
        else if (t <= 2 * top + 2)
            v = c->ns[top] + slope * (t - top);
        else
            v = INFINITY;
        out[t] = t > 1 && out[t - 1] > v ? out[t - 1] : v;
    }
    return true;
}

void spec_plan(const double *cost, int n_dec, struct spec_cand *cand, int n_cand, int max_total, int draft_min)
{
    float p[SPEC_PLAN_MAX];
    double next[SPEC_PLAN_MAX]; /* gain of the candidate's next drafted token: p^(k+1) */
    int cap[SPEC_PLAN_MAX], order[SPEC_PLAN_MAX];
    if (n_cand > SPEC_PLAN_MAX)
        n_cand = SPEC_PLAN_MAX;
    if (max_total > SPEC_PLAN_MAX)
        max_total = SPEC_PLAN_MAX;
    int probe_len = draft_min > 1 ? draft_min : 1;
    for (int i = 0; i < n_cand; i++) {
        struct spec_cand *c = &cand[i];
        c->k = 0;
        p[i] = c->probe && c->alpha < SPEC_PROBE_ALPHA ? SPEC_PROBE_ALPHA : c->alpha;
        cap[i] = c->probe && c->cap > probe_len ? probe_len : c->cap;
        next[i] = p[i];
    }
    if (n_dec < 1 || !(cost[n_dec] > 0))
        return;
    /* add drafted tokens one at a time, each to the candidate whose next token is likeliest to be accepted,
     * and keep the prefix of those additions with the best expected tokens per unit of cost */
    double e = n_dec, base = e / cost[n_dec], best = base, drafting = 0;
    int t = n_dec, len = 0, best_len = 0;
    while (len < max_total) {
        int bi = -1;
        for (int i = 0; i < n_cand; i++)
            if (cand[i].k < cap[i] && (bi < 0 || next[i] > next[bi]))
                bi = i;
        if (bi < 0)
            break;
        e += next[bi];
        next[bi] *= p[bi];
        cand[bi].k++;
        drafting += cand[bi].tok_ns;
        t++;
        order[len++] = bi;
        double r = e / (cost[t] + drafting);
        if (r > best) {
            best = r;
            best_len = len;
        }
    }
    for (int i = 0; i < n_cand; i++)
        cand[i].k = 0;
    if (best < base * (1 + SPEC_MARGIN))
        return;
    for (int j = 0; j < best_len; j++)
        cand[order[j]].k++;
    for (int i = 0; i < n_cand; i++) {
        struct spec_cand *c = &cand[i];
        if (c->k > 0 && c->probe)
            c->k = cap[i];
        if (c->k < draft_min)
            c->k = 0;
    }
}
