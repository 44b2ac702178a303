/* Tests for the kernels: scalar vec_dot against a plain double-precision dot of the decoded rows, AVX2
 * against scalar, gemm against vec_dot bit for bit, and the AVX2 activation quantizers against the scalar
 * ones byte for byte.
 *
 * Tolerance: |dot - reference| <= KERN_TOL * sum_i |w_i * x_i| (+ 1e-30). The integer block dots are exact;
 * what differs is float rounding in the per-block scaling and accumulation (at most a few hundred float
 * roundings, each <= 6e-8 relative to a partial sum bounded by sum |w x|); measured worst cases are 1.5e-7,
 * so 1e-6 is tight yet safe. */
#include "testutil.h"

#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KERN_TOL 1e-6

static const enum dtype kern_types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_Q8_0,
                                        DTYPE_Q4_0, DTYPE_Q4_K, DTYPE_Q6_K};
#define NTYPES (sizeof kern_types / sizeof kern_types[0])

static void gauss_fill(float *x, int64_t n, uint64_t *st)
{
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((test_rand_u64(st) >> 11) + 1) * (1.0 / 9007199254740993.0);
        double u2 = (test_rand_u64(st) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1));
        x[i] = (float)(r * cos(2 * M_PI * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(2 * M_PI * u2));
    }
}

/* A weight row of type t and an activation row of ops->vec_type, both from Gaussian data (the activations
 * get a few outliers, as real hidden states have), plus their decoded float versions. Caller frees. */
struct kern_case {
    int64_t n;
    void *w, *x;
    float *wf, *xf;
};

static void kern_case_make(struct kern_case *c, const struct kernel_ops *ops, int64_t n, uint64_t seed)
{
    uint64_t st = seed;
    float *tmp = malloc((size_t)n * sizeof(float));
    c->n = n;
    c->w = malloc(dtype_row_bytes(ops->type, n));
    c->x = malloc(dtype_row_bytes(ops->vec_type, n));
    c->wf = malloc((size_t)n * sizeof(float));
    c->xf = malloc((size_t)n * sizeof(float));
    assert_true(tmp && c->w && c->x && c->wf && c->xf);
    gauss_fill(tmp, n, &st);
    assert_int_equal(quant_row_from_f32(ops->type, tmp, c->w, n), 0);
    assert_int_equal(quant_row_to_f32(ops->type, c->w, c->wf, n), 0);
    gauss_fill(tmp, n, &st);
    for (int64_t i = 0; i < n; i += 97)
        tmp[i] *= 8.0f;
    ops->from_f32(tmp, c->x, n);
    assert_int_equal(quant_row_to_f32(ops->vec_type, c->x, c->xf, n), 0);
    free(tmp);
}

static void kern_case_free(struct kern_case *c)
{
    free(c->w);
    free(c->x);
    free(c->wf);
    free(c->xf);
}

/* Returns the reference dot and sets *mag to sum |w x|. */
static double kern_ref_dot(const struct kern_case *c, double *mag)
{
    double s = 0, m = 0;
    for (int64_t i = 0; i < c->n; i++) {
        s += (double)c->wf[i] * c->xf[i];
        m += fabs((double)c->wf[i] * c->xf[i]);
    }
    *mag = m;
    return s;
}

static const int64_t kern_sizes_q[] = {256, 512, 768, 1024, 2304, 4096};
static const int64_t kern_sizes_f[] = {1, 7, 8, 31, 33, 100, 256, 1000, 1023, 4096, 4100};

static void kern_sizes(enum dtype t, const int64_t **sz, size_t *count)
{
    if (dtype_block_elems(t) == 1) {
        *sz = kern_sizes_f;
        *count = sizeof kern_sizes_f / sizeof kern_sizes_f[0];
    } else {
        *sz = kern_sizes_q;
        *count = sizeof kern_sizes_q / sizeof kern_sizes_q[0];
    }
}

static void test_dispatch(void **state)
{
    (void)state;
    for (size_t k = 0; k < NTYPES; k++) {
        const struct kernel_ops *o = kernel_ops_get(kern_types[k]), *s = kernel_ops_scalar(kern_types[k]);
        assert_non_null(o);
        assert_non_null(s);
        assert_int_equal(o->type, kern_types[k]);
        assert_int_equal(o->vec_type, s->vec_type);
        assert_true(o->from_f32 && o->vec_dot && o->to_f32 && o->gemm);
        if (kernel_cpu_has_avx2())
            assert_ptr_equal(o, kernel_ops_avx2(kern_types[k]));
    }
    assert_int_equal(kernel_ops_scalar(DTYPE_Q4_K)->vec_type, DTYPE_Q8_K);
    assert_int_equal(kernel_ops_scalar(DTYPE_Q4_0)->vec_type, DTYPE_Q8_0);
    assert_int_equal(kernel_ops_scalar(DTYPE_BF16)->vec_type, DTYPE_F32);
    assert_null(kernel_ops_get(DTYPE_Q5_K));
    assert_null(kernel_ops_scalar(DTYPE_Q8_K));
    assert_null(kernel_ops_avx2(DTYPE_IQ2_XS));

    /* WAFER_NO_SIMD forces the scalar path */
    const char *old = getenv("WAFER_NO_SIMD");
    char *saved = old ? strdup(old) : NULL;
    setenv("WAFER_NO_SIMD", "1", 1);
    assert_false(kernel_cpu_has_avx2());
    assert_ptr_equal(kernel_ops_get(DTYPE_Q4_0), kernel_ops_scalar(DTYPE_Q4_0));
    assert_null(kernel_ops_avx2(DTYPE_Q4_0));
    if (saved) {
        setenv("WAFER_NO_SIMD", saved, 1);
        free(saved);
    } else {
        unsetenv("WAFER_NO_SIMD");
    }
}

/* A hand-made case: Q8_0 weights all 1 (d = 1) against activations all 2 (d = 0.5): 32 * 2 * 0.5 per block. */
static void test_known_value(void **state)
{
    (void)state;
    struct block_q8_0 w[2], x[2];
    for (int b = 0; b < 2; b++) {
        w[b].d = 0x3c00;
        x[b].d = 0x3800;
        memset(w[b].qs, 1, 32);
        memset(x[b].qs, 2, 32);
    }
    w[1].qs[5] = -3; /* block 1: 31 * 2 - 6 = 56 -> 28 */
    float s = 0;
    kernel_ops_scalar(DTYPE_Q8_0)->vec_dot(64, &s, w, x);
    assert_true(s == 32.0f + 28.0f);
    kernel_ops_get(DTYPE_Q8_0)->vec_dot(64, &s, w, x);
    assert_true(s == 60.0f);
}

static void test_scalar_vs_reference(void **state)
{
    (void)state;
    for (size_t k = 0; k < NTYPES; k++) {
        const struct kernel_ops *ops = kernel_ops_scalar(kern_types[k]);
        const int64_t *sz;
        size_t nsz;
        kern_sizes(kern_types[k], &sz, &nsz);
        double worst = 0;
        for (size_t i = 0; i < nsz; i++) {
            for (uint64_t seed = 1; seed <= 4; seed++) {
                struct kern_case c;
                kern_case_make(&c, ops, sz[i], seed * 1000 + i);
                double mag, ref = kern_ref_dot(&c, &mag);
                float s = NAN;
                ops->vec_dot(c.n, &s, c.w, c.x);
                double rel = fabs(s - ref) / (mag + 1e-30);
                if (rel > worst)
                    worst = rel;
                if (!(rel <= KERN_TOL))
                    fail_msg("%s n=%lld: scalar %.9g reference %.9g (error %.3g of sum|wx|)",
                             dtype_name(kern_types[k]), (long long)c.n, s, ref, rel);
                kern_case_free(&c);
            }
        }
        print_message("%-5s scalar vs reference: worst error %.2e of sum|wx|\n", dtype_name(kern_types[k]), worst);
    }
}

#define SKIP_WITHOUT_AVX2()                                                                                 \
    do {                                                                                                   \
        if (!kernel_cpu_has_avx2()) {                                                                      \
            print_message("[  SKIPPED ] CPU lacks AVX2/FMA/F16C (or WAFER_NO_SIMD is set)\n");             \
            skip();                                                                                        \
        }                                                                                                  \
    } while (0)

static void test_avx2_vs_scalar(void **state)
{
    (void)state;
    SKIP_WITHOUT_AVX2();
    for (size_t k = 0; k < NTYPES; k++) {
        const struct kernel_ops *sc = kernel_ops_scalar(kern_types[k]), *av = kernel_ops_avx2(kern_types[k]);
        assert_non_null(av);
        const int64_t *sz;
        size_t nsz;
        kern_sizes(kern_types[k], &sz, &nsz);
        double worst = 0;
        for (size_t i = 0; i < nsz; i++) {
            for (uint64_t seed = 1; seed <= 4; seed++) {
                struct kern_case c;
                kern_case_make(&c, sc, sz[i], seed * 7919 + i);
                double mag;
                kern_ref_dot(&c, &mag);
                float s1 = NAN, s2 = NAN, s3 = NAN;
                sc->vec_dot(c.n, &s1, c.w, c.x);
                av->vec_dot(c.n, &s2, c.w, c.x);
                av->vec_dot(c.n, &s3, c.w, c.x);
                assert_memory_equal(&s2, &s3, sizeof s2); /* deterministic */
                /* quantized types: one numerics definition (block sums, fmas per block), so the same bits */
                if (dtype_block_elems(kern_types[k]) > 1 && memcmp(&s1, &s2, sizeof s1))
                    fail_msg("%s n=%lld: avx2 %.9g scalar %.9g: not the same bits", dtype_name(kern_types[k]),
                             (long long)c.n, s2, s1);
                double rel = fabs((double)s1 - s2) / (mag + 1e-30);
                if (rel > worst)
                    worst = rel;
                if (!(rel <= KERN_TOL))
                    fail_msg("%s n=%lld: avx2 %.9g scalar %.9g (error %.3g of sum|wx|)", dtype_name(kern_types[k]),
                             (long long)c.n, s2, s1, rel);
                /* dequantization: identical floats */
                float *y = malloc((size_t)c.n * sizeof *y);
                av->to_f32(c.w, y, c.n);
                assert_memory_equal(y, c.wf, (size_t)c.n * sizeof *y);
                free(y);
                kern_case_free(&c);
            }
        }
        print_message("%-5s avx2 vs scalar: worst difference %.2e of sum|wx|\n", dtype_name(kern_types[k]), worst);
    }
}

/* The AVX2 activation quantizers write exactly the scalar ones' bytes. */
static void test_avx2_from_f32(void **state)
{
    (void)state;
    SKIP_WITHOUT_AVX2();
    enum dtype wt[] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_F16, DTYPE_BF16};
    const int64_t n = 4096;
    float *x = malloc(n * sizeof *x);
    uint8_t *a = malloc(dtype_row_bytes(DTYPE_F32, n) + 64), *b = malloc(dtype_row_bytes(DTYPE_F32, n) + 64);
    uint64_t st = 5;
    for (int round = 0; round < 6; round++) {
        gauss_fill(x, n, &st);
        if (round == 1) /* exact ties at x * id = k + 0.5 */
            for (int64_t i = 0; i < n; i++)
                x[i] = (i % 32 == 0) ? 127.0f : (float)((int)(x[i] * 20.0f)) + 0.5f;
        if (round == 2)
            memset(x, 0, n * sizeof *x); /* zero blocks: d = 0 */
        if (round == 3)
            for (int64_t i = 0; i < n; i++)
                x[i] *= 1e-3f * (float)(i % 7);
        if (round == 4)
            for (int64_t i = 0; i < n; i++)
                x[i] = (i % 64 == 3) ? -1e4f : x[i];
        if (round == 5) /* both signs of the extreme in a block, the first one (whose sign Q8_K keeps) varied */
            for (int64_t b = 0; b < n / 256; b++) {
                int64_t p = b * 256 + (b * 37) % 250, q = p + 1 + (b * 11) % (255 - (p - b * 256));
                x[p] = (b & 1) ? 9.0f : -9.0f;
                x[q] = -x[p];
            }
        for (size_t k = 0; k < 4; k++) {
            const struct kernel_ops *sc = kernel_ops_scalar(wt[k]), *av = kernel_ops_avx2(wt[k]);
            size_t rb = dtype_row_bytes(sc->vec_type, n);
            memset(a, 0xa5, rb);
            memset(b, 0x5a, rb);
            sc->from_f32(x, a, n);
            av->from_f32(x, b, n);
            if (memcmp(a, b, rb) != 0)
                fail_msg("%s round %d: avx2 activation bytes differ from scalar", dtype_name(sc->vec_type), round);
        }
    }
    free(x);
    free(a);
    free(b);
}

/* gemm equals vec_dot bit for bit on every element, for odd tile remainders and padded strides. */
static void check_gemm(const struct kernel_ops *ops, int64_t n, int nr, int nc, uint64_t seed)
{
    size_t wrow = dtype_row_bytes(ops->type, n), xrow = dtype_row_bytes(ops->vec_type, n);
    size_t ldw = wrow + 32 * (seed % 2), ldx = xrow + 64 * (seed % 3 == 0);
    size_t lds = (size_t)nr + (seed % 4);
    uint8_t *w = malloc(ldw * nr), *x = malloc(ldx * nc);
    float *f = malloc((size_t)n * sizeof *f), *s = malloc(lds * nc * sizeof *s);
    uint64_t st = seed;
    for (int i = 0; i < nr; i++) {
        gauss_fill(f, n, &st);
        assert_int_equal(quant_row_from_f32(ops->type, f, w + (size_t)i * ldw, n), 0);
    }
    for (int j = 0; j < nc; j++) {
        gauss_fill(f, n, &st);
        ops->from_f32(f, x + (size_t)j * ldx, n);
    }
    for (size_t i = 0; i < lds * nc; i++)
        s[i] = -12345.0f;
    ops->gemm(n, nr, nc, s, lds, w, ldw, x, ldx);
    for (int j = 0; j < nc; j++) {
        for (size_t i = 0; i < lds; i++) {
            float want;
            if (i < (size_t)nr)
                ops->vec_dot(n, &want, w + i * ldw, x + (size_t)j * ldx);
            else
                want = -12345.0f; /* padding untouched */
            if (memcmp(&want, &s[(size_t)j * lds + i], sizeof want) != 0)
                fail_msg("%s gemm n=%lld nr=%d nc=%d: s[%d][%zu] = %.9g, vec_dot %.9g", dtype_name(ops->type),
                         (long long)n, nr, nc, j, i, s[(size_t)j * lds + i], want);
        }
    }
    free(w);
    free(x);
    free(f);
    free(s);
}

static void test_gemm_matches_vec_dot(void **state)
{
    (void)state;
    uint64_t st = 42;
    for (size_t k = 0; k < NTYPES; k++) {
        const struct kernel_ops *variants[2] = {kernel_ops_scalar(kern_types[k]), kernel_ops_avx2(kern_types[k])};
        for (int v = 0; v < 2; v++) {
            if (!variants[v])
                continue;
            for (int trial = 0; trial < 12; trial++) {
                int64_t n = dtype_block_elems(kern_types[k]) == 1 ? 1 + (int64_t)(test_rand_u64(&st) % 700)
                                                                   : 256 * (1 + (int64_t)(test_rand_u64(&st) % 4));
                int nr = 1 + (int)(test_rand_u64(&st) % 9), nc = 1 + (int)(test_rand_u64(&st) % 9);
                check_gemm(variants[v], n, nr, nc, test_rand_u64(&st));
            }
            check_gemm(variants[v], 512, 9, 9, 7);
            check_gemm(variants[v], 256, 1, 1, 8);
            /* enough columns of long rows that the AVX2 gemm splits them into several cache blocks */
            check_gemm(variants[v], dtype_block_elems(kern_types[k]) == 1 ? 4100 : 4096, 4, 70, 9);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_known_value),
        cmocka_unit_test(test_scalar_vs_reference),
        cmocka_unit_test(test_avx2_vs_scalar),
        cmocka_unit_test(test_avx2_from_f32),
        cmocka_unit_test(test_gemm_matches_vec_dot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
