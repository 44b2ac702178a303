/*
 * attention kernel tests: the AVX2 and AVX-512 kernels give bit-identical results to the scalar ones (scores, V
 * accumulation, F16 conversions) for head sizes with and without a tail past the 32-element steps, any
 * group size and row count; both compute what they claim (checked against a double-precision dot product);
 * the F16 conversions round exactly as f32_to_fp16 does, including ties, subnormals and overflow; the softmax
 * (with attn.h's own exp) is the same in both and close to a double-precision one.
 */
#include "testutil.h"

#include "engine/cpu/attn.h"
#include "engine/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct attn_kernels *avx2_or_skip(void)
{
    const struct attn_kernels *k = attn_kernels_avx2();
    if (!k) {
        print_message("[  SKIPPED ] no AVX2+FMA+F16C on this CPU (or WAFER_NO_SIMD set)\n");
        skip();
    }
    return k;
}

/* The SIMD kernel sets this CPU runs (AVX2, then AVX-512 where present) into ks, their names into names;
 * skips the test when there are none. */
static int simd_sets(const struct attn_kernels **ks, const char **names)
{
    int n = 0;
    if ((ks[n] = attn_kernels_avx2()))
        names[n++] = "AVX2";
    if ((ks[n] = attn_kernels_avx512()))
        names[n++] = "AVX-512";
    if (!n)
        avx2_or_skip();
    return n;
}

struct attn_case {
    int hd, nq, n;
    float *q, *kf, *vf, *p, *o;
    uint16_t *kh, *vh;
};

static void case_init(struct attn_case *c, int hd, int nq, int n, uint64_t seed)
{
    c->hd = hd, c->nq = nq, c->n = n;
    c->q = malloc(sizeof(float) * nq * hd);
    c->kf = malloc(sizeof(float) * n * hd);
    c->vf = malloc(sizeof(float) * n * hd);
    c->p = malloc(sizeof(float) * nq * n);
    c->o = malloc(sizeof(float) * nq * hd);
    c->kh = malloc(2 * (size_t)n * hd);
    c->vh = malloc(2 * (size_t)n * hd);
    for (int i = 0; i < nq * hd; i++)
        c->q[i] = fp16_to_f32(f32_to_fp16(3 * test_rand_f32(&seed)));
    for (int i = 0; i < n * hd; i++) {
        c->kf[i] = 2 * test_rand_f32(&seed);
        c->vf[i] = 2 * test_rand_f32(&seed);
        c->kh[i] = f32_to_fp16(c->kf[i]);
        c->vh[i] = f32_to_fp16(c->vf[i]);
    }
    for (int i = 0; i < nq * n; i++)
        c->p[i] = fabsf(test_rand_f32(&seed));
    for (int i = 0; i < nq * hd; i++)
        c->o[i] = test_rand_f32(&seed);
}

static void case_free(struct attn_case *c)
{
    free(c->q), free(c->kf), free(c->vf), free(c->p), free(c->o), free(c->kh), free(c->vh);
}

static void test_scores_match(void **state)
{
    (void)state;
    const struct attn_kernels *sc = attn_kernels_scalar(), *sets[2];
    const char *names[2];
    int nsets = simd_sets(sets, names);
    const int hds[] = {8, 32, 48, 64, 80, 96, 128, 256};
    /* 4: decode's query heads of one KV head; up to 8 rows the AVX-512 kernel converts the keys in registers,
     * four rows at a time (5, 7: rows left over), 16 and 24 (4- and 6-token tiles of 4 query heads per KV head:
     * cpu_backend.c's CPU_ATT_TILE) in chunks */
    const int nqs[] = {1, 2, 4, 5, 7, 8, 16, 24};
    uint64_t seed = 11;
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t b = 0; b < sizeof nqs / sizeof nqs[0] * 3; b++) {
            /* n: random (> 32: chunked), a whole KV block, a block with keys past a multiple of 8 */
            int hd = hds[a], nq = nqs[b / 3];
            int n = b % 3 == 0 ? 1 + (int)(test_rand_u64(&seed) % 40) : b % 3 == 1 ? 16 : 21;
            struct attn_case c;
            case_init(&c, hd, nq, n, seed + a * 31 + b);
            size_t lds = (size_t)n + 3;
            float *s1 = calloc((size_t)nq * lds, sizeof(float)), *s2 = calloc((size_t)nq * lds, sizeof(float));
            float scale = 1.0f / sqrtf((float)hd);
            sc->scores_f16(hd, nq, c.q, c.kh, n, scale, s1, lds);
            for (int k = 0; k < nsets; k++) {
                memset(s2, 0, sizeof(float) * nq * lds);
                sets[k]->scores_f16(hd, nq, c.q, c.kh, n, scale, s2, lds);
                if (memcmp(s1, s2, sizeof(float) * nq * lds))
                    fail_msg("scores_f16 hd %d nq %d n %d: %s differs from scalar", hd, nq, n, names[k]);
            }
            for (int g = 0; g < nq; g++)
                for (int j = 0; j < n; j++) {
                    double ref = 0;
                    for (int i = 0; i < hd; i++)
                        ref += (double)c.q[g * hd + i] * fp16_to_f32(c.kh[j * hd + i]);
                    assert_true(fabs(ref * scale - s1[g * lds + j]) < 1e-5 * hd);
                }
            sc->scores_f32(hd, nq, c.q, c.kf, n, scale, s1, lds);
            for (int k = 0; k < nsets; k++) {
                memset(s2, 0, sizeof(float) * nq * lds);
                sets[k]->scores_f32(hd, nq, c.q, c.kf, n, scale, s2, lds);
                if (memcmp(s1, s2, sizeof(float) * nq * lds))
                    fail_msg("scores_f32 hd %d nq %d n %d: %s differs from scalar", hd, nq, n, names[k]);
            }
            for (int g = 0; g < nq; g++)
                for (int j = 0; j < n; j++) {
                    double ref = 0;
                    for (int i = 0; i < hd; i++)
                        ref += (double)c.q[g * hd + i] * c.kf[j * hd + i];
                    assert_true(fabs(ref * scale - s1[g * lds + j]) < 1e-5 * hd);
                }
            free(s1), free(s2);
            case_free(&c);
        }
}

static void test_accum_match(void **state)
{
    (void)state;
    const struct attn_kernels *sc = attn_kernels_scalar(), *sets[2];
    const char *names[2];
    int nsets = simd_sets(sets, names);
    const int hds[] = {8, 12, 64, 100, 128, 200, 320};
    uint64_t seed = 5;
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (int nq = 1; nq <= 5; nq++) {
            int hd = hds[a], n = 1 + (int)(test_rand_u64(&seed) % 40);
            struct attn_case c;
            case_init(&c, hd, nq, n, seed + a * 7 + nq);
            float *o1 = malloc(sizeof(float) * nq * hd), *o2 = malloc(sizeof(float) * nq * hd);
            /* the probabilities ldp = n + 3 apart, as the engine's rows are n_ctx apart: a kernel striding by
             * n would read the wrong row */
            size_t ldp = (size_t)n + 3;
            float *pp = malloc(sizeof(float) * (size_t)nq * ldp);
            for (int g = 0; g < nq; g++)
                for (size_t j = 0; j < ldp; j++)
                    pp[(size_t)g * ldp + j] = j < (size_t)n ? c.p[g * n + (int)j] : NAN;
            for (int kind = 0; kind < 2; kind++) {
                memcpy(o1, c.o, sizeof(float) * nq * hd);
                if (kind == 0)
                    sc->accum_f16(hd, nq, pp, ldp, c.vh, n, o1);
                else
                    sc->accum_f32(hd, nq, pp, ldp, c.vf, n, o1);
                for (int k = 0; k < nsets; k++) {
                    memcpy(o2, c.o, sizeof(float) * nq * hd);
                    if (kind == 0)
                        sets[k]->accum_f16(hd, nq, pp, ldp, c.vh, n, o2);
                    else
                        sets[k]->accum_f32(hd, nq, pp, ldp, c.vf, n, o2);
                    if (memcmp(o1, o2, sizeof(float) * nq * hd))
                        fail_msg("accum_%s hd %d nq %d n %d: %s differs from scalar", kind ? "f32" : "f16", hd, nq, n,
                                 names[k]);
                }
                for (int g = 0; g < nq; g++)
                    for (int i = 0; i < hd; i++) {
                        double ref = c.o[g * hd + i];
                        for (int j = 0; j < n; j++)
                            ref += (double)c.p[g * n + j] * (kind ? c.vf[j * hd + i] : fp16_to_f32(c.vh[j * hd + i]));
                        assert_true(fabs(ref - o1[g * hd + i]) < 1e-4);
                    }
            }
            free(o1), free(o2), free(pp);
            case_free(&c);
        }
}

static void test_f16_conversions(void **state)
{
    (void)state;
    const struct attn_kernels *sc = attn_kernels_scalar(), *sets[2];
    const char *names[2];
    int n_sets = simd_sets(sets, names);
    enum { N = 1 << 16 };
    float *x = malloc(sizeof(float) * N), *r1 = malloc(sizeof(float) * N), *r2 = malloc(sizeof(float) * N);
    uint16_t *h1 = malloc(2 * N), *h2 = malloc(2 * N);
    uint64_t seed = 3;
    int i = 0;
    /* ties between two F16 values (normal and subnormal), the edges of the range, zero, infinity */
    for (uint32_t h = 0; h < 0x7bff && i < 4000; h += 17) {
        float a = fp16_to_f32((uint16_t)h), b = fp16_to_f32((uint16_t)(h + 1));
        x[i++] = (a + b) / 2, x[i++] = -(a + b) / 2;
    }
    const float specials[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, INFINITY, -INFINITY,
                              5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 1e-30f, 6.1035156e-5f};
    for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++)
        x[i++] = specials[k];
    /* random bit patterns over the exponents an activation can have */
    while (i < N) {
        uint32_t bits = (uint32_t)test_rand_u64(&seed);
        uint32_t e = 90 + (bits >> 24) % 60; /* 2^-37 .. 2^22 */
        bits = (bits & 0x807fffffu) | (e << 23);
        memcpy(&x[i++], &bits, 4);
    }
    sc->to_f16(x, h1, N);
    for (int k = 0; k < N; k++)
        assert_int_equal(h1[k], f32_to_fp16(x[k]));
    for (int v = 0; v < n_sets; v++) {
        const struct attn_kernels *av = sets[v];
        for (int n = N; n >= N - 17; n--) { /* lengths with every tail size of 8 and 16 lanes */
            memset(h2, 0, 2 * N);
            av->to_f16(x, h2, n);
            if (memcmp(h1, h2, 2 * (size_t)n))
                fail_msg("to_f16 (n %d): %s differs from f32_to_fp16", n, names[v]);
            av->round_f16(x, r2, n);
            sc->round_f16(x, r1, n);
            if (memcmp(r1, r2, sizeof(float) * n))
                fail_msg("round_f16 (n %d): %s differs from scalar", n, names[v]);
        }
        /* in place */
        sc->round_f16(x, r1, N);
        memcpy(r2, x, sizeof(float) * N);
        av->round_f16(r2, r2, N);
        assert_memory_equal(r1, r2, sizeof(float) * N);
    }
    free(x), free(r1), free(r2), free(h1), free(h2);
}

/* The softmax every kernel set runs: the same bits from scalar and each SIMD set for lengths around the 8-,
 * 16- and 32-lane steps and score spreads from flat to underflowing, and within 2e-7 relative (about 2 ulp)
 * of a double-precision softmax where the value is a normal float. */
static void test_softmax(void **state)
{
    (void)state;
    const struct attn_kernels *sc = attn_kernels_scalar(), *sets[2];
    const char *names[2];
    int n_sets = simd_sets(sets, names);
    const float spreads[] = {0.0f, 1.0f, 10.0f, 60.0f, 200.0f};
    uint64_t seed = 5;
    for (int n = 1; n <= 150; n += (n < 50 ? 1 : 7))
        for (size_t k = 0; k < sizeof spreads / sizeof spreads[0]; k++) {
            float *x = malloc(sizeof(float) * (size_t)n), *a = malloc(sizeof(float) * (size_t)n),
                  *b = malloc(sizeof(float) * (size_t)n);
            for (int i = 0; i < n; i++)
                x[i] = spreads[k] * test_rand_f32(&seed) + 3.0f;
            memcpy(a, x, sizeof(float) * (size_t)n);
            sc->softmax(a, n);
            for (int v = 0; v < n_sets; v++) {
                memcpy(b, x, sizeof(float) * (size_t)n);
                sets[v]->softmax(b, n);
                if (memcmp(a, b, sizeof(float) * (size_t)n))
                    fail_msg("softmax n %d spread %g: %s differs from scalar", n, spreads[k], names[v]);
            }
            /* the reference from the same float differences s_i - max the kernels exponentiate */
            float mx = -INFINITY;
            double sum = 0;
            for (int i = 0; i < n; i++)
                mx = x[i] > mx ? x[i] : mx;
            for (int i = 0; i < n; i++)
                sum += exp((double)(x[i] - mx));
            for (int i = 0; i < n; i++) {
                double ref = exp((double)(x[i] - mx)) / sum;
                if (ref > 1e-30 && fabs(a[i] - ref) > 2e-7 * ref)
                    fail_msg("softmax n %d spread %g: s[%d] = %.9g, want %.9g", n, spreads[k], i, a[i], ref);
                if (ref < 1e-38)
                    assert_true(a[i] < 1e-37f); /* underflow goes to (nearly) 0, never garbage */
            }
            free(x), free(a), free(b);
        }
}

static void test_dispatch(void **state)
{
    (void)state;
    assert_ptr_equal(attn_kernels_get(true), attn_kernels_scalar());
    const struct attn_kernels *av = attn_kernels_avx2(), *a5 = attn_kernels_avx512();
    assert_ptr_equal(attn_kernels_get(false), a5 ? a5 : av ? av : attn_kernels_scalar());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores_match),
        cmocka_unit_test(test_accum_match),
        cmocka_unit_test(test_f16_conversions),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
