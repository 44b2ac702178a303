/*
 * gemv_avx512k tests: the AVX-512 F16, Q4_K and Q6_K kernels (gemv and gemm), and the AVX2 Q4_K / Q6_K ones (gemv,
 * gemv16, gemm16; gemv_avx2.c), give outputs bit-identical to
 * kernel_ops vec_dot on AVX2 for every (weight row, activation row) pair: row counts that leave every tile
 * remainder (1..37, including lone rows paired with themselves), column counts 1..19 (lone columns, partial
 * tiles) and enough columns to cross column cache blocks, F16 lengths with 8-element steps and tails and
 * several conversion chunks, row strides larger than a row, and extreme values (all-max / all-min codes, F16
 * near its largest finite value); for Q4_K and Q6_K also the R16 kernels (gemv16 / gemm16) on the rows in
 * quant.h's R16 layout, with random bits in the codes, scales and mins. A set the CPU lacks is skipped, with a
 * message (F16: without AVX-512).
 */
#include "testutil.h"

#include "engine/dtype.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The kernel sets under test: F16 only AVX-512's (test_gemv checks AVX2's F16 gemv), the K-quants also AVX2's
 * (its R16 gemv16 / gemm16 and rows gemv) and, on a CPU with AVX-VNNI, AVX2 with AVX-VNNI's (its Q4_K). */
#define TEST_SETS 3
static const struct gemv_ops *test_set(int i, enum dtype t)
{
    if (i == 0)
        return gemv_ops_avx512k(t);
    if (t == DTYPE_F16)
        return NULL;
    return i == 1 ? gemv_ops_avx2(t) : gemv_ops_avx2_vnni(t);
}

static void ops_or_skip(enum dtype t)
{
    if ((!test_set(0, t) && !test_set(1, t)) || !kernel_ops_avx2(t)) {
        print_message("[  SKIPPED ] no %s on this CPU, or WAFER_NO_AVX512 / WAFER_NO_SIMD set\n",
                      t == DTYPE_F16 ? "AVX-512 (F/BW/VL/DQ/VNNI)" : "AVX2 + FMA + F16C");
        skip();
    }
    if (!test_set(0, t))
        print_message("    %s: no AVX-512 on this CPU: the AVX2 kernels alone\n", dtype_name(t));
}

/* A weight value: extreme 0 random, 1 alternating +-max, 2 all -max (3: random, then check() overwrites the
 * K-quants' codes and scales with random bytes). */
static float wval(int extreme, enum dtype t, int64_t i, int r, uint64_t *seed)
{
    float big = t == DTYPE_F16 ? 60000.0f : 1.0f;
    if (extreme == 1)
        return i % 3 ? big : -big;
    if (extreme == 2)
        return -big;
    return test_rand_f32(seed) * (1 + (float)(r % 5));
}

static void check_set(const struct gemv_ops *gv, enum dtype t, int64_t n, int nr, int nc, uint64_t seed, int extreme)
{
    const struct kernel_ops *ops = kernel_ops_avx2(t);
    assert_non_null(gv);
    assert_non_null(ops);
    assert_int_equal(gv->type, t);
    /* F16 keeps its columns as F16 in aux; the K-quants need none */
    size_t ab = gv->aux_bytes(n), ldaux = ab + 32 * (size_t)(1 + nc % 2); /* 32-byte aligned, padded */
    if (t == DTYPE_F16)
        assert_true(ab >= (size_t)(n / 16) * 32 && ab % 32 == 0);
    else
        assert_int_equal(ab, 0);
    uint8_t *aux = ab ? aligned_alloc(64, (ldaux * (size_t)nc + 63) & ~(size_t)63) : NULL;
    /* strides beyond the row, keeping each format's alignment (Q8_K and F32 rows hold floats) */
    size_t rb = dtype_row_bytes(t, n), ldw = rb + 18;
    size_t xb = dtype_row_bytes(ops->vec_type, n), ldx = xb + 12;
    uint8_t *w = calloc((size_t)nr, ldw), *x = calloc((size_t)nc, ldx);
    float *f = malloc(sizeof(float) * (size_t)n);
    assert_non_null(w);
    assert_non_null(x);
    assert_non_null(f);
    for (int r = 0; r < nr; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = wval(extreme, t, i, r, &seed);
        assert_int_equal(quant_row_from_f32(t, f, w + (size_t)r * ldw, n), 0);
        memset(w + (size_t)r * ldw + rb, 0xff, ldw - rb); /* padding: NaN if ever read as F16 */
        if (extreme == 3) /* K-quants: every bit pattern of the codes and (packed) scales and mins */
            for (int64_t b = 0; b < n / QK_K; b++) {
                uint8_t *blk = w + (size_t)r * ldw + (size_t)b * dtype_row_bytes(t, QK_K);
                size_t from = t == DTYPE_Q4_K ? offsetof(struct block_q4_k, scales) : 0;
                size_t to = t == DTYPE_Q4_K ? sizeof(struct block_q4_k) : offsetof(struct block_q6_k, d);
                for (size_t i = from; i < to; i++)
                    blk[i] = (uint8_t)test_rand_u64(&seed);
            }
    }
    for (int c = 0; c < nc; c++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = extreme == 1 || extreme == 2 ? (i % 2 ? 3.0f : -3.0f) * (t == DTYPE_F16 ? 10000.0f : 1.0f)
                           : test_rand_f32(&seed) * (c % 4 ? 1.0f : 40.0f);
        ops->from_f32(f, x + (size_t)c * ldx, n);
        memset(x + (size_t)c * ldx + xb, 0xff, ldx - xb); /* padding: NaN if ever read as F32 */
    }
    float *want = malloc(sizeof(float) * (size_t)nr * (size_t)nc);
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            ops->vec_dot(n, &want[(size_t)c * nr + r], w + (size_t)r * ldw, x + (size_t)c * ldx);
    /* gemv, per column, after prep as a caller does (aux: NULL when aux_bytes is 0) */
    float *y = malloc(sizeof(float) * ((size_t)nr + 1));
    for (int c = 0; c < nc; c++) {
        y[nr] = 12345.0f;
        uint8_t *ac = aux ? aux + (size_t)c * ldaux : NULL;
        gv->prep(n, x + (size_t)c * ldx, ac);
        gv->gemv(n, nr, y, w, ldw, x + (size_t)c * ldx, ac);
        assert_true(y[nr] == 12345.0f);
        for (int r = 0; r < nr; r++)
            if (memcmp(&want[(size_t)c * nr + r], &y[r], sizeof(float)))
                fail_msg("%s gemv n %lld nr %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), (long long)n, nr, r, c,
                         y[r], want[(size_t)c * nr + r]);
    }
    /* gemm, writing into a larger output whose spare entries must stay untouched (the AVX2 set has none for the
     * K-quants' rows: kernel_ops gemm, test_kernels, runs those) */
    size_t lds = (size_t)nr + 3;
    float *s = malloc(sizeof(float) * lds * (size_t)nc);
    for (size_t i = 0; i < lds * (size_t)nc; i++)
        s[i] = -7.0f;
    if (gv->gemm)
        gv->gemm(n, nr, nc, s, lds, w, ldw, x, ldx, aux, aux ? ldaux : 0);
    for (int c = 0; c < nc && gv->gemm; c++) {
        for (int r = 0; r < nr; r++)
            if (memcmp(&want[(size_t)c * nr + r], &s[(size_t)c * lds + r], sizeof(float)))
                fail_msg("%s gemm n %lld nr %d nc %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), (long long)n, nr,
                         nc, r, c, s[(size_t)c * lds + r], want[(size_t)c * nr + r]);
        for (size_t r = (size_t)nr; r < lds; r++)
            assert_true(s[(size_t)c * lds + r] == -7.0f);
    }
    /* the first nr / 16 groups of rows in quant.h's R16 layout: gemv16 and gemm16 give the same bits; the layout
     * converts back to the rows, and quant_r16_row reads each row out */
    int n16 = nr / QUANT_R16_ROWS * QUANT_R16_ROWS;
    if (gv->gemv16 && n16) {
        uint8_t *w16 = test_r16_of(t, w, ldw, n16, n);
        for (int c = 0; c < nc; c++) {
            y[n16] = 12345.0f;
            gv->gemv16(n, n16, y, w16, x + (size_t)c * ldx, NULL);
            assert_true(y[n16] == 12345.0f);
            for (int r = 0; r < n16; r++)
                if (memcmp(&want[(size_t)c * nr + r], &y[r], sizeof(float)))
                    fail_msg("%s gemv16 n %lld nr %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), (long long)n,
                             n16, r, c, y[r], want[(size_t)c * nr + r]);
        }
        for (size_t i = 0; i < lds * (size_t)nc; i++)
            s[i] = -7.0f;
        assert_null(gv->gemm16_scratch); /* else it would need one here */
        gv->gemm16(n, n16, nc, s, lds, w16, x, ldx, NULL, 0, NULL);
        for (int c = 0; c < nc; c++) {
            for (int r = 0; r < n16; r++)
                if (memcmp(&want[(size_t)c * nr + r], &s[(size_t)c * lds + r], sizeof(float)))
                    fail_msg("%s gemm16 n %lld nr %d nc %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t),
                             (long long)n, n16, nc, r, c, s[(size_t)c * lds + r], want[(size_t)c * nr + r]);
            for (size_t r = (size_t)n16; r < lds; r++)
                assert_true(s[(size_t)c * lds + r] == -7.0f);
        }
        free(w16);
    }
    free(w), free(x), free(f), free(want), free(y), free(s), free(aux);
}

/* check_set for every kernel set of the CPU that covers t */
static void check(enum dtype t, int64_t n, int nr, int nc, uint64_t seed, int extreme)
{
    int ran = 0;
    for (int i = 0; i < TEST_SETS; i++)
        if (test_set(i, t)) {
            check_set(test_set(i, t), t, n, nr, nc, seed, extreme);
            ran++;
        }
    assert_true(ran > 0);
}

static void check_shapes(enum dtype t, const int64_t *ns, size_t nn)
{
    ops_or_skip(t);
    for (size_t b = 0; b < nn; b++) {
        /* every row remainder and column remainder for small shapes */
        for (int nr = 1; nr <= 9; nr++)
            for (int nc = 1; nc <= 11; nc += (nr % 2) + 1)
                check(t, ns[b], nr, nc, 1000 + b * 97 + (uint64_t)(nr * 31 + nc), 0);
        check(t, ns[b], 37, 19, 77 + b, 0);
        check(t, ns[b], 13, 17, 78 + b, 0);
    }
}

static void test_f16(void **state)
{
    (void)state;
    /* both ways of converting the weights (whole rows, chunks of 512), whichever this CPU takes */
    for (int chunks = 0; chunks < 2; chunks++) {
        setenv("WAFER_F16_GEMM", chunks ? "chunks" : "whole", 1);
        const int64_t ns[] = {32, 48, 8, 13, 24, 2048, 2056, 2053, 1040};
        check_shapes(DTYPE_F16, ns, sizeof ns / sizeof ns[0]);
        /* several conversion chunks with a tail (rows of up to 8,192 elements at once), and many columns (column
         * cache blocks) */
        check(DTYPE_F16, 3000, 7, 13, 5, 0);
        check(DTYPE_F16, 256, 5, 300, 6, 0);
        check(DTYPE_F16, 16384 + 24, 3, 90, 9, 0); /* a column block smaller than the column count */
        for (int e = 1; e <= 2; e++) {
            check(DTYPE_F16, 2053, 6, 7, 1, e);
            check(DTYPE_F16, 40, 5, 3, 2, e);
        }
    }
    unsetenv("WAFER_F16_GEMM");
}

/* The R16 kernels: 1-4 groups, every column remainder, random scale / min / code bits, column blocks; the
 * AVX-512 gemm's spread prefetch into L1 and into L2 (cpu_kquant_spread_l2: its own instances of the tiles). */
static void check_r16(enum dtype t)
{
    for (int hint = 0; hint < 2; hint++) {
        setenv("WAFER_SPREAD_HINT", hint ? "l2" : "l1", 1);
        check(t, 2048, 48, 8, 400 + (uint64_t)hint, 3); /* batched decode's shape: one tile of 8 columns */
        check(t, 256 * 3, 32, 13, 402 + (uint64_t)hint, 0); /* a full tile and a remainder */
    }
    unsetenv("WAFER_SPREAD_HINT");
    for (int g = 1; g <= 4; g++)
        for (int nc = 1; nc <= 9; nc++)
            check(t, 256 * (1 + (g + nc) % 4), 16 * g + nc % 3, nc, 200 + (uint64_t)(g * 7 + nc), nc % 2 ? 3 : 0);
    for (int e = 1; e <= 3; e++)
        check(t, 2048, 32, 9, 8, e);
    check(t, 256 * 60, 48, 37, 9, 3);
    /* long rows, every column remainder of a tile of up to 8 columns */
    for (int nc = 1; nc <= 17; nc++)
        check(t, 4096 + 256 * (nc % 2), 32, nc, 300 + (uint64_t)nc, nc % 2 ? 3 : 0);
}

static void test_q4_k(void **state)
{
    (void)state;
    const int64_t ns[] = {256, 512, 2048, 2304};
    check_shapes(DTYPE_Q4_K, ns, sizeof ns / sizeof ns[0]);
    check(DTYPE_Q4_K, 256 * 60, 5, 50, 4, 0); /* column cache blocks */
    for (int e = 1; e <= 2; e++)
        check(DTYPE_Q4_K, 512, 9, 7, 1, e);
    check_r16(DTYPE_Q4_K);
}

static void test_q6_k(void **state)
{
    (void)state;
    const int64_t ns[] = {256, 512, 2048, 2304};
    check_shapes(DTYPE_Q6_K, ns, sizeof ns / sizeof ns[0]);
    check(DTYPE_Q6_K, 256 * 60, 5, 50, 4, 0);
    for (int e = 1; e <= 2; e++)
        check(DTYPE_Q6_K, 512, 9, 7, 1, e);
    check_r16(DTYPE_Q6_K);
}

static void test_coverage(void **state)
{
    (void)state;
    ops_or_skip(DTYPE_F16);
    for (int i = 0; i < 2; i++) { /* both sets read the K-quants in R16 */
        assert_non_null(test_set(i, DTYPE_Q4_K)->gemm16);
        assert_non_null(test_set(i, DTYPE_Q6_K)->gemv16);
    }
    if (kernel_cpu_has_avx_vnni()) /* AVX-VNNI's Q4_K, in R16 too */
        assert_non_null(gemv_ops_avx2_vnni(DTYPE_Q4_K)->gemm16);
    const enum dtype ts[] = {DTYPE_F16, DTYPE_Q4_K, DTYPE_Q6_K};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        assert_non_null(gemv_ops_avx512k(ts[i]));
        assert_non_null(gemv_ops_avx512k(ts[i])->gemm);
    }
    /* Q4_K and Q6_K share the Q8_K activation format: one prep (F16's, for F32 activations, is its own) */
    assert_ptr_equal(gemv_ops_avx512k(DTYPE_Q4_K)->prep, gemv_ops_avx512k(DTYPE_Q6_K)->prep);
    assert_null(gemv_ops_avx512k(DTYPE_Q8_K));
    assert_null(gemv_ops_avx512k(DTYPE_F32));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_q6_k),
        cmocka_unit_test(test_coverage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
