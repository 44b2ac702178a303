/* Tests for the sampler (greedy, seeded draws, the truncation filters, penalties, logprobs checked against a
 * log-softmax computed here) and the stop-string matcher (matches across feeds, several and overlapping
 * stops, flushing, a small output buffer). */
#include "testutil.h"

#include "core/err.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static struct sampler *make(float temperature, uint64_t seed, int n_vocab)
{
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = temperature;
    p.seed = seed;
    struct sampler *s = sampler_create(&p, n_vocab);
    assert_non_null(s);
    return s;
}

static struct sampler *make_params(const struct sampler_params *p, int n_vocab)
{
    struct sampler *s = sampler_create(p, n_vocab);
    assert_non_null(s);
    return s;
}

static const float dist3[3] = {0.5f, 0.3f, 0.2f};

static void fill_dist3(float *l)
{
    for (int i = 0; i < 3; i++)
        l[i] = logf(dist3[i]);
}

static void test_defaults_and_validate(void **state)
{
    (void)state;
    struct sampler_params p;
    char err[ERR_MSG_MAX];
    sampler_params_default(&p);
    assert_int_equal(sampler_params_validate(&p, err), 0);
    assert_int_equal(p.repeat_last_n, 64);

    p.temperature = 3.5f;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_string_equal(err, "temperature must be between 0 and 2, got 3.5");
    p.temperature = NAN;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "temperature"));
    p.temperature = 0.0f;
    assert_int_equal(sampler_params_validate(&p, err), 0);

    p.top_p = 0.0f;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_string_equal(err, "top_p must be in (0, 1], got 0");
    p.top_p = 1.0f;
    p.top_k = -1;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "top_k must be >= 0"));
    p.top_k = 40;
    p.min_p = 1.5f;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_string_equal(err, "min_p must be between 0 and 1, got 1.5");
    p.min_p = 0.05f;
    p.repeat_penalty = 0.0f;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "repeat_penalty must be"));
    p.repeat_penalty = 1.1f;
    p.frequency_penalty = -2.5f;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_string_equal(err, "frequency_penalty must be between -2 and 2, got -2.5");
    p.frequency_penalty = 2.0f;
    p.presence_penalty = 2.01f;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "presence_penalty must be between -2 and 2"));
    p.presence_penalty = -2.0f;
    p.repeat_last_n = -2;
    assert_int_equal(sampler_params_validate(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "repeat_last_n must be >= -1"));
    p.repeat_last_n = -1;
    assert_int_equal(sampler_params_validate(&p, err), 0);

    assert_null(sampler_create(&p, 0));
}

static void test_greedy(void **state)
{
    (void)state;
    struct sampler *s = make(0.0f, 1, 6);
    float l[6] = {0.1f, 2.0f, -1.0f, 3.0f, 3.0f, 2.9f};
    assert_int_equal(sampler_sample(s, l, NULL, NULL, 0), 3); /* tie 3/4 -> lowest id */
    float l2[6] = {-5.0f, -1.0f, -1.0f, -3.0f, -2.0f, -1.0f};
    assert_int_equal(sampler_sample(s, l2, NULL, NULL, 0), 1);
    float l3[6] = {NAN, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f}; /* NaN never wins */
    assert_int_equal(sampler_sample(s, l3, NULL, NULL, 0), 1);
    sampler_destroy(s);

    /* tiny temperature is greedy whatever else is set */
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1e-7f;
    p.top_k = 3;
    p.top_p = 0.3f;
    s = make_params(&p, 6);
    for (int i = 0; i < 20; i++) {
        float l4[6] = {0.1f, 2.0f, -1.0f, 3.0f, 3.0f, 2.9f};
        assert_int_equal(sampler_sample(s, l4, NULL, NULL, 0), 3);
    }
    sampler_destroy(s);
}

/* Draws n tokens from a flat-ish 50-token distribution. */
static void draws(uint64_t seed, int32_t *out, int n)
{
    struct sampler *s = make(1.0f, seed, 50);
    for (int i = 0; i < n; i++) {
        float l[50];
        for (int j = 0; j < 50; j++)
            l[j] = (float)(j % 7) * 0.1f;
        out[i] = sampler_sample(s, l, NULL, NULL, 0);
    }
    sampler_destroy(s);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    int32_t a[50], b[50], c[50];
    draws(42, a, 50);
    draws(42, b, 50);
    draws(43, c, 50);
    assert_memory_equal(a, b, sizeof(a));
    int differ = 0;
    for (int i = 0; i < 50; i++)
        differ += a[i] != c[i];
    assert_true(differ > 10);

    /* reset reseeds: the same sequence again from the same sampler */
    struct sampler *s = make(1.0f, 42, 50);
    int32_t first[10];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 10; i++) {
            float l[50];
            for (int j = 0; j < 50; j++)
                l[j] = (float)(j % 7) * 0.1f;
            int32_t t = sampler_sample(s, l, NULL, NULL, 0);
            if (r == 0)
                first[i] = t;
            else
                assert_int_equal(t, first[i]);
        }
        sampler_reset(s);
    }
    sampler_destroy(s);
}

/* Frequencies of 20000 draws over log([0.5, 0.3, 0.2]) under p. */
static void freqs(const struct sampler_params *p, double f[3])
{
    struct sampler *s = make_params(p, 3);
    int cnt[3] = {0, 0, 0};
    const int n = 20000;
    for (int i = 0; i < n; i++) {
        float l[3];
        fill_dist3(l);
        int32_t t = sampler_sample(s, l, NULL, NULL, 0);
        assert_true(t >= 0 && t < 3);
        cnt[t]++;
    }
    for (int i = 0; i < 3; i++)
        f[i] = (double)cnt[i] / n;
    sampler_destroy(s);
}

static void test_statistics(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 7;
    double f[3];
    freqs(&p, f);
    for (int i = 0; i < 3; i++)
        assert_true(fabs(f[i] - dist3[i]) < 0.02);

    /* temperature 0.5 squares the probabilities: 25:9:4 */
    p.temperature = 0.5f;
    freqs(&p, f);
    assert_true(fabs(f[0] - 25.0 / 38) < 0.02);
    assert_true(fabs(f[1] - 9.0 / 38) < 0.02);
    assert_true(fabs(f[2] - 4.0 / 38) < 0.02);

    /* top_k 2 renormalizes over {0, 1}: 5/8, 3/8 */
    p.temperature = 1.0f;
    p.top_k = 2;
    freqs(&p, f);
    assert_true(fabs(f[0] - 0.625) < 0.02);
    assert_true(fabs(f[1] - 0.375) < 0.02);
    assert_true(f[2] == 0.0);

    /* top_p 0.8 keeps {0, 1} too (0.5 + 0.3 reaches 0.8) */
    p.top_k = 0;
    p.top_p = 0.8f;
    freqs(&p, f);
    assert_true(fabs(f[0] - 0.625) < 0.02);
    assert_true(f[2] == 0.0);

    /* min_p 0.5 keeps p >= 0.25: {0, 1} */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    freqs(&p, f);
    assert_true(fabs(f[0] - 0.625) < 0.02);
    assert_true(f[2] == 0.0);
}

static void test_truncation_to_one(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.5f;
    p.seed = 3;
    double f[3];

    p.top_p = 0.5f;
    freqs(&p, f);
    assert_true(f[0] == 1.0);

    p.top_p = 1.0f;
    p.min_p = 0.7f;
    freqs(&p, f);
    assert_true(f[0] == 1.0);

    /* top_k 1 equals greedy, ties included, on a larger random vocabulary */
    const int nv = 5000;
    p.min_p = 0.0f;
    p.top_k = 1;
    struct sampler *s = make_params(&p, nv);
    struct sampler *g = make(0.0f, 0, nv);
    float *l = malloc(nv * sizeof(float)), *l2 = malloc(nv * sizeof(float));
    assert_non_null(l);
    assert_non_null(l2);
    uint64_t rs = 11;
    for (int it = 0; it < 20; it++) {
        for (int i = 0; i < nv; i++)
            l[i] = test_rand_f32(&rs) * 10.0f;
        if (it % 2) { /* a tie at the top */
            l[4000] = 20.0f;
            l[123] = 20.0f;
        }
        memcpy(l2, l, nv * sizeof(float));
        int32_t a = sampler_sample(s, l, NULL, NULL, 0), b = sampler_sample(g, l2, NULL, NULL, 0);
        assert_int_equal(a, b);
        if (it % 2)
            assert_int_equal(a, 123);
    }
    sampler_destroy(s);
    sampler_destroy(g);
    free(l);
    free(l2);
}

/* Draws from a large vocabulary with only top_p: every token drawn must belong to the smallest prefix of the
 * sorted distribution reaching p (computed here by a full sort), and with p = 1 every token stays possible. */
static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static void test_top_p_large_vocab(void **state)
{
    (void)state;
    const int nv = 32000;
    float *l = malloc(nv * sizeof(float)), *sorted = malloc(nv * sizeof(float));
    assert_non_null(l);
    assert_non_null(sorted);
    uint64_t rs = 5;
    for (int i = 0; i < nv; i++)
        l[i] = test_rand_f32(&rs) * 8.0f;
    memcpy(sorted, l, nv * sizeof(float));
    qsort(sorted, nv, sizeof(float), cmp_desc);
    double sum = 0.0, cum = 0.0;
    for (int i = 0; i < nv; i++)
        sum += exp(sorted[i] - sorted[0]);
    int keep = 0;
    while (cum < 0.9 * sum)
        cum += exp(sorted[keep++] - sorted[0]);
    assert_true(keep > 128); /* the filter must extend its sorted prefix several times */
    float cutoff = sorted[keep - 1];

    struct sampler_params p;
    sampler_params_default(&p);
    p.top_p = 0.9f;
    p.seed = 9;
    struct sampler *s = make_params(&p, nv);
    float *w = malloc(nv * sizeof(float));
    assert_non_null(w);
    int below = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(w, l, nv * sizeof(float));
        int32_t t = sampler_sample(s, w, NULL, NULL, 0);
        assert_true(t >= 0 && t < nv);
        assert_true(l[t] >= cutoff);
        below += l[t] < sorted[keep / 2];
    }
    assert_true(below > 0); /* the tail of the nucleus is reachable */
    sampler_destroy(s);
    free(l);
    free(sorted);
    free(w);
}

/* top_k on a vocabulary full of ties: every draw lies in the reference top-k set (logit descending, id
 * ascending among equals), and all k of them are reachable. */
static void test_top_k_ties(void **state)
{
    (void)state;
    const int nv = 3000;
    const int ks[] = {1, 5, 17, 40, 1000};
    float *l = malloc(nv * sizeof(float)), *w = malloc(nv * sizeof(float));
    int *rank = malloc(nv * sizeof(int)), *seen = malloc(nv * sizeof(int));
    assert_non_null(l);
    assert_non_null(w);
    assert_non_null(rank);
    assert_non_null(seen);
    uint64_t rs = 23;
    for (int i = 0; i < nv; i++)
        l[i] = (float)(test_rand_u64(&rs) % 8) * 0.01f; /* 8 distinct values, ~375 copies each */
    for (int i = 0; i < nv; i++) {
        rank[i] = 0;
        for (int j = 0; j < nv; j++)
            rank[i] += l[j] > l[i] || (l[j] == l[i] && j < i);
    }
    for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
        struct sampler_params p;
        sampler_params_default(&p);
        p.top_k = ks[ki];
        p.seed = ki;
        struct sampler *s = make_params(&p, nv);
        memset(seen, 0, nv * sizeof(int));
        int distinct = 0, n_draws = ks[ki] <= 40 ? 40 * ks[ki] + 100 : 3000;
        for (int it = 0; it < n_draws; it++) {
            memcpy(w, l, nv * sizeof(float));
            int32_t t = sampler_sample(s, w, NULL, NULL, 0);
            assert_true(t >= 0 && t < nv);
            assert_true(rank[t] < ks[ki]);
            distinct += !seen[t]++;
        }
        if (ks[ki] <= 40)
            assert_int_equal(distinct, ks[ki]);
        sampler_destroy(s);
    }
    /* all logits equal: top_k 5 draws only ids 0..4 */
    struct sampler_params p;
    sampler_params_default(&p);
    p.top_k = 5;
    struct sampler *s = make_params(&p, nv);
    for (int it = 0; it < 200; it++) {
        memset(w, 0, nv * sizeof(float));
        assert_true(sampler_sample(s, w, NULL, NULL, 0) < 5);
    }
    sampler_destroy(s);
    free(l);
    free(w);
    free(rank);
    free(seen);
}

/* A nucleus wider than the first sorted chunk, made of ties: exactly the 100 lowest ids of the 200 tied
 * tokens are reachable, and every one of them is drawn (a candidate lost while partitioning would not be). */
static void test_top_p_exact_set(void **state)
{
    (void)state;
    const int nv = 300;
    float l[300], w[300];
    int high_rank[300], seen[300] = {0};
    int n_high = 0;
    for (int i = 0; i < nv; i++) {
        bool high = i % 3 != 0; /* 200 scattered tokens */
        l[i] = high ? 0.0f : -40.0f;
        high_rank[i] = high ? n_high++ : -1;
    }
    assert_int_equal(n_high, 200);
    struct sampler_params p;
    sampler_params_default(&p);
    p.top_p = 0.5f;
    p.seed = 99;
    struct sampler *s = make_params(&p, nv);
    for (int it = 0; it < 20000; it++) {
        memcpy(w, l, sizeof(l));
        int32_t t = sampler_sample(s, w, NULL, NULL, 0);
        assert_true(t >= 0 && t < nv);
        assert_true(high_rank[t] >= 0 && high_rank[t] < 100);
        seen[t]++;
    }
    for (int i = 0; i < nv; i++)
        if (high_rank[i] >= 0 && high_rank[i] < 100)
            assert_true(seen[i] > 0);
    sampler_destroy(s);
}

/* Reference log-softmax in double. */
static void ref_log_softmax(const float *l, int n, double *out)
{
    double m = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++)
        sum += exp(l[i] - m);
    for (int i = 0; i < n; i++)
        out[i] = l[i] - m - log(sum);
}

static void test_logprobs(void **state)
{
    (void)state;
    const int nv = 1000;
    float *l = malloc(nv * sizeof(float)), *orig = malloc(nv * sizeof(float));
    double *ref = malloc(nv * sizeof(double));
    assert_non_null(l);
    assert_non_null(orig);
    assert_non_null(ref);
    uint64_t rs = 17;
    for (int i = 0; i < nv; i++)
        orig[i] = test_rand_f32(&rs) * 6.0f;
    orig[500] = orig[501] = 9.0f; /* tie at the top: 500 ranks first */
    ref_log_softmax(orig, nv, ref);

    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.7f;
    p.top_k = 10;
    p.seed = 1;
    struct sampler *s = make_params(&p, nv);
    struct sampler_logprob top[5];
    for (int it = 0; it < 10; it++) {
        memcpy(l, orig, nv * sizeof(float));
        float chosen_lp = 0.0f;
        int32_t t = sampler_sample(s, l, &chosen_lp, top, 5);
        assert_true(fabs(chosen_lp - ref[t]) < 1e-5);
        assert_int_equal(top[0].token, 500);
        assert_int_equal(top[1].token, 501);
        for (int i = 0; i < 5; i++) {
            assert_true(fabs(top[i].logprob - ref[top[i].token]) < 1e-5);
            if (i)
                assert_true(top[i].logprob <= top[i - 1].logprob);
        }
        /* the 5 reported are the 5 best */
        int better = 0;
        for (int i = 0; i < nv; i++)
            better += ref[i] > top[4].logprob + 1e-6;
        assert_true(better <= 4);
    }
    sampler_destroy(s);

    /* n_top beyond the vocabulary */
    s = make(0.0f, 0, 3);
    float l3[3];
    fill_dist3(l3);
    struct sampler_logprob top5[5];
    assert_int_equal(sampler_sample(s, l3, NULL, top5, 5), 0);
    assert_int_equal(top5[0].token, 0);
    assert_int_equal(top5[2].token, 2);
    assert_true(fabs(top5[2].logprob - logf(0.2f)) < 1e-5);
    assert_int_equal(top5[3].token, -1);
    assert_true(isinf(top5[4].logprob) && top5[4].logprob < 0);
    sampler_destroy(s);
    free(l);
    free(orig);
    free(ref);
}

static void test_penalties(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.repeat_last_n = 4;
    struct sampler *s = make_params(&p, 5);
    /* history 3 0 0 1 2 0: the window of 4 is 0 1 2 0 -> counts {0: 2, 1: 1, 2: 1} */
    int32_t hist[] = {3, 0, 0, 1, 2, 0};
    for (size_t i = 0; i < sizeof(hist) / sizeof(hist[0]); i++)
        sampler_accept(s, hist[i]);
    sampler_accept(s, 77); /* out of vocabulary: counted in the window, applied nowhere */
    /* window now 1 2 0 77: counts {0: 1, 1: 1, 2: 1} */
    float l[5] = {1.0f, -1.0f, 0.0f, 2.0f, 0.5f};
    float chosen = 0.0f;
    struct sampler_logprob top[5];
    int32_t t = sampler_sample(s, l, &chosen, top, 5);
    const float want[5] = {1.0f / 2 - 0.5f - 0.25f, -1.0f * 2 - 0.5f - 0.25f, 0.0f - 0.5f - 0.25f, 2.0f, 0.5f};
    for (int i = 0; i < 5; i++)
        assert_true(fabsf(l[i] - want[i]) < 1e-6f);
    assert_int_equal(t, 3);
    double ref[5];
    ref_log_softmax(want, 5, ref);
    assert_true(fabs(chosen - ref[3]) < 1e-5);
    for (int i = 0; i < 5; i++)
        assert_true(fabs(top[i].logprob - ref[top[i].token]) < 1e-5);
    sampler_destroy(s);

    /* counts over a window: repeats multiply the frequency penalty, repeat_penalty applies once */
    p.repeat_last_n = -1;
    s = make_params(&p, 4);
    for (int i = 0; i < 1000; i++) /* past the initial 256 so the history grows */
        sampler_accept(s, i < 3 ? 1 : 2);
    float l2[4] = {1.0f, 4.0f, 3.0f, -0.5f};
    sampler_sample(s, l2, NULL, NULL, 0);
    assert_true(fabsf(l2[0] - 1.0f) < 1e-6f);
    assert_true(fabsf(l2[1] - (2.0f - 1.5f - 0.25f)) < 1e-6f);
    assert_true(fabsf(l2[2] - (1.5f - 997 * 0.5f - 0.25f)) < 1e-3f);
    assert_true(fabsf(l2[3] + 0.5f) < 1e-6f);
    sampler_destroy(s);

    /* repeat_last_n 0: no penalties at all */
    p.repeat_last_n = 0;
    s = make_params(&p, 4);
    sampler_accept(s, 1);
    float l3[4] = {1.0f, 4.0f, 3.0f, -0.5f};
    sampler_sample(s, l3, NULL, NULL, 0);
    assert_true(l3[1] == 4.0f);
    sampler_destroy(s);

    /* a penalty flips the greedy choice */
    p.repeat_last_n = 64;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.repeat_penalty = 1.5f;
    s = make_params(&p, 3);
    sampler_accept(s, 0);
    float l4[3] = {3.0f, 2.5f, 0.0f};
    assert_int_equal(sampler_sample(s, l4, NULL, NULL, 0), 1);
    sampler_destroy(s);
}

/* ---- stop matcher ---- */

struct feed_out {
    char buf[256];
    size_t len;
    bool stopped;
};

static void feed(struct stop_matcher *m, struct feed_out *o, const char *text)
{
    bool st = false;
    size_t n = stop_matcher_feed(m, text, strlen(text), o->buf + o->len, sizeof(o->buf) - 1 - o->len, &st);
    o->len += n;
    o->buf[o->len] = 0;
    o->stopped = o->stopped || st;
}

static void flush(struct stop_matcher *m, struct feed_out *o)
{
    o->len += stop_matcher_flush(m, o->buf + o->len, sizeof(o->buf) - 1 - o->len);
    o->buf[o->len] = 0;
}

static void test_stop_across_chunks(void **state)
{
    (void)state;
    struct stop_matcher m;
    const char *stops[] = {"STOP"};
    assert_int_equal(stop_matcher_init(&m, stops, 1), 0);
    struct feed_out o = {.len = 0};
    feed(&m, &o, "Hello wor");
    assert_string_equal(o.buf, "Hello wor");
    feed(&m, &o, "ld. STOP here");
    assert_true(o.stopped);
    assert_string_equal(o.buf, "Hello world. ");
    feed(&m, &o, "more");
    flush(&m, &o);
    assert_string_equal(o.buf, "Hello world. ");
    stop_matcher_deinit(&m);

    /* the stop split over three feeds, with held text released when it stops matching */
    assert_int_equal(stop_matcher_init(&m, stops, 1), 0);
    memset(&o, 0, sizeof(o));
    feed(&m, &o, "abc ST");
    assert_string_equal(o.buf, "abc ");
    assert_int_equal(m.held_len, 2);
    feed(&m, &o, "x ST");
    assert_string_equal(o.buf, "abc STx ");
    feed(&m, &o, "O");
    assert_string_equal(o.buf, "abc STx ");
    assert_false(o.stopped);
    feed(&m, &o, "P!");
    assert_true(o.stopped);
    assert_string_equal(o.buf, "abc STx ");
    stop_matcher_deinit(&m);
}

static void test_stop_multiple_and_overlap(void **state)
{
    (void)state;
    struct stop_matcher m;
    const char *stops[] = {"", "world", "lo w", "\n\n"};
    assert_int_equal(stop_matcher_init(&m, stops, 4), 0);
    assert_int_equal(m.n_stops, 3); /* the empty string is ignored */
    struct feed_out o = {.len = 0};
    feed(&m, &o, "Hello world");
    assert_true(o.stopped); /* "lo w" begins before "world": earliest match wins */
    assert_string_equal(o.buf, "Hel");
    stop_matcher_deinit(&m);

    assert_int_equal(stop_matcher_init(&m, stops, 4), 0);
    memset(&o, 0, sizeof(o));
    feed(&m, &o, "one\n");
    assert_string_equal(o.buf, "one");
    feed(&m, &o, "\ntwo");
    assert_true(o.stopped);
    assert_string_equal(o.buf, "one");
    stop_matcher_deinit(&m);

    /* "aab" with stop "ab", fed one byte at a time and at once */
    const char *ab[] = {"ab"};
    assert_int_equal(stop_matcher_init(&m, ab, 1), 0);
    memset(&o, 0, sizeof(o));
    feed(&m, &o, "a");
    assert_string_equal(o.buf, "");
    feed(&m, &o, "a");
    assert_string_equal(o.buf, "a");
    feed(&m, &o, "b");
    assert_true(o.stopped);
    assert_string_equal(o.buf, "a");
    stop_matcher_deinit(&m);
    assert_int_equal(stop_matcher_init(&m, ab, 1), 0);
    memset(&o, 0, sizeof(o));
    feed(&m, &o, "aab");
    assert_true(o.stopped);
    assert_string_equal(o.buf, "a");
    stop_matcher_deinit(&m);

    /* a suffix that is a prefix of a longer stop but not of the shorter one */
    const char *two[] = {"xyz", "yq"};
    assert_int_equal(stop_matcher_init(&m, two, 2), 0);
    memset(&o, 0, sizeof(o));
    feed(&m, &o, "axy");
    assert_string_equal(o.buf, "a");
    feed(&m, &o, "q");
    assert_true(o.stopped);
    assert_string_equal(o.buf, "ax");
    stop_matcher_deinit(&m);
}

static void test_stop_flush_and_small_out(void **state)
{
    (void)state;
    struct stop_matcher m;
    const char *stops[] = {"</s>", "END"};
    assert_int_equal(stop_matcher_init(&m, stops, 2), 0);
    struct feed_out o = {.len = 0};
    feed(&m, &o, "the </");
    assert_string_equal(o.buf, "the ");
    flush(&m, &o);
    assert_false(o.stopped);
    assert_string_equal(o.buf, "the </");
    assert_int_equal(m.held_len, 0);
    flush(&m, &o);
    assert_string_equal(o.buf, "the </");
    stop_matcher_deinit(&m);

    /* no stops: everything passes through at once */
    assert_int_equal(stop_matcher_init(&m, NULL, 0), 0);
    memset(&o, 0, sizeof(o));
    feed(&m, &o, "abc");
    feed(&m, &o, "");
    assert_string_equal(o.buf, "abc");
    stop_matcher_deinit(&m);

    /* an output buffer of 3 bytes: nothing is lost, UTF-8 is not cut, the stop is still found */
    assert_int_equal(stop_matcher_init(&m, stops, 2), 0);
    const char *text = "ab\xc3\xa9" "cdEND tail";
    char out[3], all[64];
    size_t total = 0;
    bool st = false;
    total += stop_matcher_feed(&m, text, strlen(text), out, sizeof(out), &st);
    memcpy(all, out, total);
    assert_int_equal(total, 2); /* "ab", not "ab\xc3" */
    for (int i = 0; i < 10 && !st; i++) {
        size_t n = stop_matcher_feed(&m, "", 0, out, sizeof(out), &st);
        memcpy(all + total, out, n);
        total += n;
    }
    assert_true(st);
    all[total] = 0;
    assert_string_equal(all, "ab\xc3\xa9" "cd");
    stop_matcher_deinit(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_validate),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_statistics),
        cmocka_unit_test(test_truncation_to_one),
        cmocka_unit_test(test_top_p_large_vocab),
        cmocka_unit_test(test_top_k_ties),
        cmocka_unit_test(test_top_p_exact_set),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_stop_across_chunks),
        cmocka_unit_test(test_stop_multiple_and_overlap),
        cmocka_unit_test(test_stop_flush_and_small_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
