/*
 * sampler: per-sequence token selection and stop-string matching.
 *
 * Penalties: the last repeat_last_n accepted tokens live in a ring (a growing array for -1). Each step
 * copies the window into a scratch buffer and sorts it, so equal tokens form runs that give each distinct
 * token's count in O(w log w) without touching n_vocab entries; the penalties are written into the caller's
 * logits, which therefore describe the distribution that logprobs report.
 *
 * Truncation never sorts the vocabulary: top-k selects the k best (a threshold pass for small k, quickselect
 * otherwise) and sorts only those; top-p without top-k first tries the sorted 64 best and otherwise runs a
 * quickselect weighted by probability to find the smallest rank-ordered prefix reaching p (O(n) expected);
 * min-p is a threshold on the logits (p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p)). The order the
 * candidates end in depends only on the logits and the params, so the draw does not depend on whether
 * logprobs were asked for. One total order ranks candidates everywhere: higher logit first, lower id first
 * among equals.
 *
 * All buffers are allocated in sampler_create (O(n_vocab), reused every step); only the -1 window grows, on
 * accept. Exponentials are float (expf is several times faster than exp at 150k per token) and their sums
 * double, so a 150k-term normalizer loses no precision. Cost at 152k candidates on this machine: about
 * 0.2 ms greedy, 0.9 ms full-vocabulary draw, +0.8 ms when logprobs are requested, 3 ms for top-p over a
 * nearly flat distribution (the worst case).
 */
#include "engine/sampler.h"

#include "core/err.h"
#include "core/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* top-p compares the cumulative probability with p less this relative tolerance: a distribution whose first
 * tokens sum to p up to float rounding (0.5 from logf(0.5)) stops there instead of keeping one more. */
#define SAMPLER_TOP_P_EPS 1e-6
#define SAMPLER_TOP_P_FIRST_CHUNK 64
#define SAMPLER_HISTORY_INITIAL 256

struct sampler_cand {
    float logit;
    int32_t id;
};

struct sampler {
    struct sampler_params p;
    int n_vocab;
    struct sampler_cand *cand; /* [n_vocab] candidates of the current step */
    /* penalty window: ring of hist_cap tokens (hist_len used, hist_head = next slot to overwrite once
     * full); hist_grow: -1 window, doubled on accept while memory allows */
    int32_t *hist;
    int32_t *hist_scratch; /* [hist_cap] sorted copy of the window */
    size_t hist_cap, hist_len, hist_head;
    bool hist_grow;
    uint64_t rng[4]; /* xoshiro256** state */
};

void sampler_params_default(struct sampler_params *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->frequency_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->seed = 0;
}

int sampler_params_validate(const struct sampler_params *p, char *err)
{
    /* written as !(in range) so that NaN is refused too */
    if (!(p->temperature >= 0.0f && p->temperature <= 2.0f))
        return err_set(err, ERR_INVALID_ARG, "temperature must be between 0 and 2, got %g", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return err_set(err, ERR_INVALID_ARG, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (p->top_k < 0)
        return err_set(err, ERR_INVALID_ARG, "top_k must be >= 0 (0 disables it), got %d", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(err, ERR_INVALID_ARG, "min_p must be between 0 and 1, got %g", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty))
        return err_set(err, ERR_INVALID_ARG, "repeat_penalty must be a finite number > 0 (1 disables it), got %g",
                       (double)p->repeat_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return err_set(err, ERR_INVALID_ARG, "frequency_penalty must be between -2 and 2, got %g",
                       (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return err_set(err, ERR_INVALID_ARG, "presence_penalty must be between -2 and 2, got %g",
                       (double)p->presence_penalty);
    if (p->repeat_last_n < -1)
        return err_set(err, ERR_INVALID_ARG, "repeat_last_n must be >= -1 (-1: whole history, 0: off), got %d",
                       p->repeat_last_n);
    return 0;
}

/* ---- RNG: splitmix64 expands the 64-bit seed into xoshiro256** state (never all zero) ---- */

static uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static void rng_seed(uint64_t s[4], uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s[i] = rng_splitmix64(&x);
}

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* ---- lifecycle ---- */

struct sampler *sampler_create(const struct sampler_params *p, int n_vocab)
{
    if (n_vocab <= 0)
        return NULL;
    struct sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
    if (!s->cand)
        goto fail;
    if (p->repeat_last_n > 0) {
        s->hist_cap = (size_t)p->repeat_last_n;
    } else if (p->repeat_last_n < 0) {
        s->hist_cap = SAMPLER_HISTORY_INITIAL;
        s->hist_grow = true;
    }
    if (s->hist_cap) {
        s->hist = malloc(s->hist_cap * sizeof(*s->hist));
        s->hist_scratch = malloc(s->hist_cap * sizeof(*s->hist_scratch));
        if (!s->hist || !s->hist_scratch)
            goto fail;
    }
    rng_seed(s->rng, p->seed);
    return s;
fail:
    sampler_destroy(s);
    return NULL;
}

void sampler_destroy(struct sampler *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->hist);
    free(s->hist_scratch);
    free(s);
}

void sampler_reset(struct sampler *s)
{
    s->hist_len = 0;
    s->hist_head = 0;
    rng_seed(s->rng, s->p.seed);
}

/* Doubles the -1 window. On failure the window stops growing and becomes a ring of the current size: the
 * oldest tokens then drop out of the penalties, which is logged once rather than failing generation. */
static bool sampler_history_grow(struct sampler *s)
{
    size_t cap = s->hist_cap * 2;
    int32_t *h = realloc(s->hist, cap * sizeof(*h));
    if (!h)
        goto fail;
    s->hist = h;
    int32_t *sc = realloc(s->hist_scratch, cap * sizeof(*sc));
    if (!sc)
        goto fail;
    s->hist_scratch = sc;
    s->hist_cap = cap;
    return true;
fail:
    log_warn("sampler: out of memory growing the penalty history past %zu tokens; older tokens now drop out",
             s->hist_cap);
    s->hist_grow = false;
    return false;
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (!s->hist_cap)
        return;
    if (s->hist_len == s->hist_cap && s->hist_grow)
        sampler_history_grow(s);
    if (s->hist_len < s->hist_cap) {
        s->hist[s->hist_len++] = token;
        s->hist_head = s->hist_len % s->hist_cap;
    } else {
        s->hist[s->hist_head] = token;
        s->hist_head = (s->hist_head + 1) % s->hist_cap;
    }
}

/* ---- penalties ---- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static bool sampler_has_penalties(const struct sampler *s)
{
    return s->p.repeat_penalty != 1.0f || s->p.frequency_penalty != 0.0f || s->p.presence_penalty != 0.0f;
}

/* Applies the penalties for the window to logits[n_vocab], once per distinct token. */
static void sampler_apply_penalties(struct sampler *s, float *logits)
{
    if (!s->hist_len || !sampler_has_penalties(s))
        return;
    size_t n = s->hist_len;
    memcpy(s->hist_scratch, s->hist, n * sizeof(*s->hist));
    qsort(s->hist_scratch, n, sizeof(*s->hist_scratch), cmp_i32);
    for (size_t i = 0; i < n;) {
        int32_t tok = s->hist_scratch[i];
        size_t j = i + 1;
        while (j < n && s->hist_scratch[j] == tok)
            j++;
        float count = (float)(j - i);
        i = j;
        if (tok < 0 || tok >= s->n_vocab)
            continue;
        float l = logits[tok];
        l = l > 0.0f ? l / s->p.repeat_penalty : l * s->p.repeat_penalty;
        l -= count * s->p.frequency_penalty + s->p.presence_penalty;
        logits[tok] = l;
    }
}

/* ---- candidate ordering and partial selection ---- */

/* true when a ranks before b: higher logit, then lower id (a total order: logits are never NaN here) */
static inline bool cand_before(const struct sampler_cand *a, const struct sampler_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *pa, const void *pb)
{
    const struct sampler_cand *a = pa, *b = pb;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static inline void cand_swap(struct sampler_cand *a, struct sampler_cand *b)
{
    struct sampler_cand t = *a;
    *a = *b;
    *b = t;
}

static void cand_insertion_sort(struct sampler_cand *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        struct sampler_cand x = a[i];
        size_t j = i;
        while (j > 0 && cand_before(&x, &a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* Lomuto partition of a[lo..hi) (hi - lo >= 3) around the median of its first, middle and last entries.
 * Returns the pivot's final index p: a[lo..p) rank before it, a[p+1..hi) after. */
static size_t cand_partition(struct sampler_cand *a, size_t lo, size_t hi)
{
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_before(&a[mid], &a[lo]))
        cand_swap(&a[mid], &a[lo]);
    if (cand_before(&a[last], &a[lo]))
        cand_swap(&a[last], &a[lo]);
    if (cand_before(&a[mid], &a[last]))
        cand_swap(&a[mid], &a[last]);
    struct sampler_cand pivot = a[last];
    size_t store = lo;
    for (size_t i = lo; i < last; i++)
        if (cand_before(&a[i], &pivot))
            cand_swap(&a[i], &a[store++]);
    cand_swap(&a[store], &a[last]);
    return store;
}

/* Rounds of partitioning allowed before falling back to a sort: keeps adversarial inputs O(n log n). */
static int cand_round_budget(size_t n)
{
    int budget = 8;
    for (size_t m = n; m > 1; m >>= 1)
        budget += 2;
    return budget;
}

/* Small k: one pass keeping the k best seen so far in a sorted buffer (after the first few thousand entries
 * almost every candidate fails the single comparison with the current k-th, a well-predicted branch), then
 * one pass moving everything that ranks at or before that k-th to the front. Two cheap passes beat
 * quickselect's mispredicted partitions by several times at 150k candidates. */
#define CAND_SMALL_K 128
static void cand_select_top_small(struct sampler_cand *a, size_t n, size_t k)
{
    struct sampler_cand best[CAND_SMALL_K];
    memcpy(best, a, k * sizeof(*a));
    cand_insertion_sort(best, k);
    for (size_t i = k; i < n; i++) {
        if (!cand_before(&a[i], &best[k - 1]))
            continue;
        size_t j = k - 1;
        while (j > 0 && cand_before(&a[i], &best[j - 1])) {
            best[j] = best[j - 1];
            j--;
        }
        best[j] = a[i];
    }
    struct sampler_cand kth = best[k - 1];
    size_t store = 0;
    for (size_t i = 0; i < n; i++)
        if (!cand_before(&kth, &a[i]))
            cand_swap(&a[i], &a[store++]);
    memcpy(a, best, k * sizeof(*a)); /* the same k entries, already sorted */
}

/* Rearranges a[0..n) so that a[0..k) holds the k best candidates, sorted. Small k: see above; otherwise
 * quickselect, falling back to sorting the undecided range after too many rounds. */
static void cand_select_top(struct sampler_cand *a, size_t n, size_t k)
{
    if (k > n)
        k = n;
    if (k == 0)
        return;
    if (k <= CAND_SMALL_K && n > 4 * k) {
        cand_select_top_small(a, n, k);
        return;
    }
    size_t lo = 0, hi = n; /* the k-th boundary lies in [lo, hi): everything before lo ranks before it */
    int budget = cand_round_budget(n);
    while (k < n && hi - lo > 16) {
        if (budget-- == 0) {
            qsort(a + lo, hi - lo, sizeof(*a), cand_cmp);
            lo = hi;
            break;
        }
        size_t p = cand_partition(a, lo, hi);
        if (p == k)
            break;
        if (p > k)
            hi = p;
        else
            lo = p + 1;
    }
    if (k < n && hi - lo <= 16 && lo < hi)
        cand_insertion_sort(a + lo, hi - lo);
    if (k <= 16)
        cand_insertion_sort(a, k);
    else
        qsort(a, k, sizeof(*a), cand_cmp);
}

static float cand_max_logit(const struct sampler_cand *a, size_t n, bool sorted)
{
    if (sorted)
        return a[0].logit;
    float m = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (a[i].logit > m)
            m = a[i].logit;
    return m;
}

/* Fills the candidates in id order from logits. */
static void sampler_fill_candidates(struct sampler *s, const float *logits)
{
    for (int i = 0; i < s->n_vocab; i++) {
        s->cand[i].logit = logits[i];
        s->cand[i].id = i;
    }
}

/* Mass of a[lo..hi) relative to exp(max). */
static double cand_mass(const struct sampler_cand *a, size_t lo, size_t hi, float max)
{
    double m = 0.0;
    for (size_t i = lo; i < hi; i++)
        m += expf(a[i].logit - max);
    return m;
}

/* Keeps the smallest prefix (in rank order) whose probability reaches top_p, at least one candidate; returns
 * its length, the kept candidates at the front. *sorted says whether they are in rank order afterwards.
 * Peaked distributions end inside the first sorted chunk; flat ones go on with a quickselect weighted by
 * probability (partition, then descend into the side where the target mass is crossed): O(n) expected. */
static size_t sampler_top_p(struct sampler_cand *a, size_t n, bool *sorted, float top_p)
{
    float max = cand_max_logit(a, n, *sorted);
    double sum = cand_mass(a, 0, n, max);
    double target = (double)top_p * sum * (1.0 - SAMPLER_TOP_P_EPS);
    size_t done = n;
    if (!*sorted) {
        done = n < SAMPLER_TOP_P_FIRST_CHUNK ? n : SAMPLER_TOP_P_FIRST_CHUNK;
        cand_select_top(a, n, done);
    }
    double cum = 0.0;
    for (size_t i = 0; i < done; i++) {
        cum += expf(a[i].logit - max);
        if (cum >= target) {
            *sorted = true;
            return i + 1;
        }
    }
    /* a[0..lo) is kept (mass cum); the answer's end lies in (lo, hi] */
    size_t lo = done, hi = n;
    int budget = cand_round_budget(n);
    *sorted = false;
    while (hi - lo > 16 && budget-- > 0) {
        size_t p = cand_partition(a, lo, hi);
        double before = cand_mass(a, lo, p, max);
        double pivot = expf(a[p].logit - max);
        if (cum + before >= target) {
            hi = p;
        } else if (cum + before + pivot >= target) {
            return p + 1;
        } else {
            cum += before + pivot;
            lo = p + 1;
        }
    }
    if (lo < hi) {
        qsort(a + lo, hi - lo, sizeof(*a), cand_cmp);
        for (size_t i = lo; i < hi; i++) {
            cum += expf(a[i].logit - max);
            if (cum >= target)
                return i + 1;
        }
    }
    return hi; /* rounding kept the sum just short of the target: keep everything undecided */
}

/* Keeps (in their current order) the candidates with p >= min_p * p_max. */
static size_t sampler_min_p(struct sampler_cand *a, size_t n, bool sorted, float min_p)
{
    double thresh = (double)cand_max_logit(a, n, sorted) + log((double)min_p);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if ((double)a[i].logit >= thresh)
            a[kept++] = a[i];
    return kept ? kept : 1; /* the maximum always passes; guards against rounding only */
}

static int32_t sampler_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* log-sum-exp of logits[n] in double; -inf when every logit is -inf. */
static double sampler_logsumexp(const float *logits, int n)
{
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > max)
            max = logits[i];
    if (max == -INFINITY)
        return -INFINITY;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += expf(logits[i] - max);
    return max + log(sum);
}

static float sampler_logprob_of(float logit, double lse)
{
    if (lse == -INFINITY || logit == -INFINITY)
        return -INFINITY;
    return (float)((double)logit - lse);
}

int32_t sampler_sample(struct sampler *s, float *logits, float *chosen_logprob, struct sampler_logprob *top,
                       int n_top)
{
    int n = s->n_vocab;
    for (int i = 0; i < n; i++)
        if (isnan(logits[i]))
            logits[i] = -INFINITY;
    sampler_apply_penalties(s, logits);

    double lse = 0.0;
    bool want_logprobs = chosen_logprob || (top && n_top > 0);
    if (want_logprobs)
        lse = sampler_logsumexp(logits, n);
    if (top && n_top > 0) {
        size_t k = (size_t)n_top < (size_t)n ? (size_t)n_top : (size_t)n;
        sampler_fill_candidates(s, logits);
        cand_select_top(s->cand, (size_t)n, k);
        for (size_t i = 0; i < (size_t)n_top; i++) {
            if (i < k) {
                top[i].token = s->cand[i].id;
                top[i].logprob = sampler_logprob_of(s->cand[i].logit, lse);
            } else {
                top[i].token = -1;
                top[i].logprob = -INFINITY;
            }
        }
    }

    int32_t chosen;
    float maxl = logits[sampler_argmax(logits, n)];
    if (s->p.temperature <= 1e-6f || maxl == -INFINITY) {
        chosen = sampler_argmax(logits, n);
        goto done;
    }

    sampler_fill_candidates(s, logits);
    size_t m = (size_t)n;
    bool sorted = false;
    if (s->p.top_k > 0 && (size_t)s->p.top_k < m) {
        cand_select_top(s->cand, m, (size_t)s->p.top_k);
        m = (size_t)s->p.top_k;
        sorted = true;
    }
    if (s->p.top_p < 1.0f && s->p.top_p > 0.0f && m > 1) {
        m = sampler_top_p(s->cand, m, &sorted, s->p.top_p);
    }
    if (s->p.min_p > 0.0f && m > 1)
        m = sampler_min_p(s->cand, m, sorted, s->p.min_p);

    /* temperature and softmax (weights replace the logits in the candidates), then one draw */
    float max = cand_max_logit(s->cand, m, sorted);
    float inv_t = 1.0f / s->p.temperature;
    double sum = 0.0;
    for (size_t i = 0; i < m; i++) {
        float w = expf((s->cand[i].logit - max) * inv_t);
        s->cand[i].logit = w;
        sum += w;
    }
    double u = rng_uniform(s->rng) * sum, cum = 0.0;
    chosen = s->cand[m - 1].id;
    for (size_t i = 0; i < m; i++) {
        cum += s->cand[i].logit;
        if (u < cum) {
            chosen = s->cand[i].id;
            break;
        }
    }
done:
    if (chosen_logprob)
        *chosen_logprob = sampler_logprob_of(logits[chosen], lse);
    return chosen;
}

float sampler_score(struct sampler *s, const float *logits, int32_t token, struct sampler_logprob *top, int n_top)
{
    int n = s->n_vocab;
    double lse = sampler_logsumexp(logits, n);
    if (top && n_top > 0) {
        size_t k = (size_t)n_top < (size_t)n ? (size_t)n_top : (size_t)n;
        sampler_fill_candidates(s, logits);
        cand_select_top(s->cand, (size_t)n, k);
        for (size_t i = 0; i < (size_t)n_top; i++) {
            top[i].token = i < k ? s->cand[i].id : -1;
            top[i].logprob = i < k ? sampler_logprob_of(s->cand[i].logit, lse) : -INFINITY;
        }
    }
    return token >= 0 && token < n ? sampler_logprob_of(logits[token], lse) : -INFINITY;
}

/* ---- stop strings ---- */

int stop_matcher_init(struct stop_matcher *m, const char *const *stops, int n_stops)
{
    memset(m, 0, sizeof(*m));
    if (n_stops > 0) {
        m->stops = calloc((size_t)n_stops, sizeof(*m->stops));
        if (!m->stops)
            return ERR_NOMEM;
    }
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0])
            continue;
        size_t len = strlen(stops[i]);
        m->stops[m->n_stops] = strdup(stops[i]);
        if (!m->stops[m->n_stops]) {
            stop_matcher_deinit(m);
            return ERR_NOMEM;
        }
        m->n_stops++;
        if (len > m->max_len)
            m->max_len = len;
    }
    return 0;
}

void stop_matcher_deinit(struct stop_matcher *m)
{
    for (int i = 0; i < m->n_stops; i++)
        free(m->stops[i]);
    free(m->stops);
    free(m->held);
    memset(m, 0, sizeof(*m));
}

/* Length of the longest proper suffix of buf[0..n) that begins some stop string. */
static size_t stop_matcher_partial(const struct stop_matcher *m, const char *buf, size_t n)
{
    size_t most = m->max_len ? m->max_len - 1 : 0;
    if (most > n)
        most = n;
    for (size_t k = most; k > 0; k--) {
        const char *tail = buf + n - k;
        for (int i = 0; i < m->n_stops; i++)
            if (strlen(m->stops[i]) > k && memcmp(m->stops[i], tail, k) == 0)
                return k;
    }
    return 0;
}

/* Largest count <= want that fits cap and does not end just before a UTF-8 continuation byte. */
static size_t stop_matcher_fit(const char *buf, size_t len, size_t want, size_t cap)
{
    if (want <= cap)
        return want;
    size_t n = cap;
    while (n > 0 && n < len && ((unsigned char)buf[n] & 0xC0) == 0x80)
        n--;
    return n;
}

size_t stop_matcher_feed(struct stop_matcher *m, const char *text, size_t len, char *out, size_t cap,
                         bool *stopped)
{
    if (stopped)
        *stopped = m->stopped;
    if (m->stopped || m->held_len + len == 0)
        return 0;
    /* the whole view = held + text, built in held (at most max_len - 1 + len bytes unless cap held more) */
    size_t total = m->held_len + len;
    if (total > m->held_cap) {
        size_t hc = m->held_cap ? m->held_cap : 64;
        while (hc < total)
            hc *= 2;
        char *h = realloc(m->held, hc);
        if (!h) {
            /* cannot join: emit the held text, then treat text alone (a stop spanning the join is missed) */
            log_warn("stop_matcher: out of memory joining %zu bytes", total);
            return stop_matcher_flush(m, out, cap);
        }
        m->held = h;
        m->held_cap = hc;
    }
    if (len)
        memcpy(m->held + m->held_len, text, len);
    char *buf = m->held;

    size_t match = total;
    for (int i = 0; i < m->n_stops; i++) {
        const char *p = memmem(buf, total, m->stops[i], strlen(m->stops[i]));
        if (p && (size_t)(p - buf) < match)
            match = (size_t)(p - buf);
    }
    size_t emit;
    if (match < total) {
        emit = stop_matcher_fit(buf, total, match, cap);
        if (emit)
            memcpy(out, buf, emit);
        if (emit == match) {
            m->stopped = true;
            m->held_len = 0;
            if (stopped)
                *stopped = true;
        } else {
            /* out is full before the stop: keep the rest (still containing the stop) for the next call */
            memmove(buf, buf + emit, total - emit);
            m->held_len = total - emit;
        }
        return emit;
    }
    size_t keep = stop_matcher_partial(m, buf, total);
    emit = stop_matcher_fit(buf, total, total - keep, cap);
    if (emit) {
        memcpy(out, buf, emit);
        memmove(buf, buf + emit, total - emit);
    }
    m->held_len = total - emit;
    return emit;
}

size_t stop_matcher_flush(struct stop_matcher *m, char *out, size_t cap)
{
    if (m->stopped || !m->held_len)
        return 0;
    size_t emit = stop_matcher_fit(m->held, m->held_len, m->held_len, cap);
    if (emit) {
        memcpy(out, m->held, emit);
        memmove(m->held, m->held + emit, m->held_len - emit);
        m->held_len -= emit;
    }
    return emit;
}
