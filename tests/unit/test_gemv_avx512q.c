/*
 * Q4_0 / Q8_0 gemv_ops tests: the gemv and gemm of every kernel set the CPU has (AVX-512, AVX2) give
 * outputs bit-identical to kernel_ops vec_dot on AVX2 (itself bit-identical to the scalar block-sum reference,
 * test_kernels) for every output: random and extreme quants (max magnitude, all one sign), large and tiny (subnormal F16)
 * scales, block counts that are and are not multiples of 8 / 16, row counts leaving every row-pair and tile
 * remainder, column counts leaving every column-tile remainder and crossing column cache blocks, and strides
 * (ldw, ldx, ldaux, lds) larger than a row; the same for gemv16 / gemm16 on the rows in quant.h's R16 layout,
 * which also converts back to the rows exactly. A set the CPU lacks is skipped (and said so); all are skipped
 * without AVX2.
 */
#include "testutil.h"

#include "engine/dtype.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include <stdlib.h>
#include <string.h>

/* mode 0: quantized random floats; 1: random raw quants and scales over a wide range; 2: max-magnitude quants
 * of one sign with large scales; 3: max-magnitude quants of alternating sign with tiny (subnormal) scales */
static uint16_t rand_scale(uint64_t *seed, int mode)
{
    float m = test_rand_f32(seed);
    if (mode == 2)
        return f32_to_fp16(30000.0f + 1000.0f * m);
    if (mode == 3)
        return (uint16_t)(1 + (test_rand_u64(seed) % 1023)); /* subnormal F16 */
    static const float mags[] = {1e-6f, 1e-3f, 0.02f, 1.0f, 100.0f, 20000.0f};
    return f32_to_fp16(m * mags[test_rand_u64(seed) % 6]);
}

static void fill_weights(enum dtype t, uint8_t *row, int64_t n, uint64_t *seed, int mode, int r)
{
    int64_t nb = n / 32;
    if (mode == 0) {
        float *f = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            f[i] = test_rand_f32(seed) * (1 + (float)(r % 5));
        assert_int_equal(quant_row_from_f32(t, f, row, n), 0);
        free(f);
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        if (t == DTYPE_Q4_0) {
            struct block_q4_0 *q = (struct block_q4_0 *)row + b;
            q->d = rand_scale(seed, mode);
            for (int j = 0; j < 16; j++)
                q->qs[j] = mode == 1 ? (uint8_t)test_rand_u64(seed) : mode == 2 ? 0x00 : (j + r) % 2 ? 0xff : 0x00;
        } else {
            struct block_q8_0 *q = (struct block_q8_0 *)row + b;
            q->d = rand_scale(seed, mode);
            for (int j = 0; j < 32; j++)
                q->qs[j] = (int8_t)(mode == 1 ? (int)(test_rand_u64(seed) % 255) - 127 : mode == 2 ? -127 : (j + r) % 2 ? 127 : -127);
        }
    }
}

static void fill_act(uint8_t *row, int64_t n, uint64_t *seed, int mode, int c)
{
    int64_t nb = n / 32;
    if (mode == 0) {
        float *f = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            f[i] = test_rand_f32(seed) * (c % 4 ? 1.0f : 40.0f);
        kernel_ops_get(DTYPE_Q8_0)->from_f32(f, row, n);
        free(f);
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        struct block_q8_0 *q = (struct block_q8_0 *)row + b;
        q->d = rand_scale(seed, mode);
        for (int j = 0; j < 32; j++)
            q->qs[j] = (int8_t)(mode == 1 ? (int)(test_rand_u64(seed) % 255) - 127 : mode == 2 ? 127 : j % 3 ? -127 : 127);
    }
}

/* nr weight rows (ldw = row bytes + wpad) x nc activation rows (ldx = row bytes + 8); gemv of every column
 * and the gemm of all of them against vec_dot. */
/* The kernel sets checked, each where the CPU has it: AVX-512, AVX2 alone, AVX2 with AVX-VNNI. */
static const struct gemv_ops *(*const sets[])(enum dtype) = {gemv_ops_avx512q, gemv_ops_avx2, gemv_ops_avx2_vnni};
static const char *const set_names[] = {"avx512", "avx2", "avx-vnni"};

static void check_set(const struct gemv_ops *(*set)(enum dtype), enum dtype t, int64_t n, int nr, int nc, size_t wpad,
                      uint64_t seed, int mode)
{
    const struct gemv_ops *gv = set(t);
    const struct kernel_ops *ref = kernel_ops_avx2(t);
    assert_non_null(gv);
    assert_non_null(gv->gemm);
    assert_non_null(ref);
    assert_int_equal(gv->prep, set(t == DTYPE_Q4_0 ? DTYPE_Q8_0 : DTYPE_Q4_0)->prep); /* one prep */
    size_t rb = dtype_row_bytes(t, n), ldw = rb + wpad, xb = dtype_row_bytes(DTYPE_Q8_0, n), ldx = xb + 8;
    size_t ab = gv->aux_bytes(n), ldaux = ab + 32 * (size_t)(1 + nc % 2); /* 32-byte aligned, padded */
    assert_int_equal(ab % 32, 0);
    uint8_t *w = malloc(ldw * (size_t)nr), *x = malloc(ldx * (size_t)nc);
    uint8_t *aux = aligned_alloc(32, ldaux * (size_t)nc);
    memset(w, 0x5a, ldw * (size_t)nr);
    for (int r = 0; r < nr; r++)
        fill_weights(t, w + (size_t)r * ldw, n, &seed, mode, r);
    for (int c = 0; c < nc; c++) {
        fill_act(x + (size_t)c * ldx, n, &seed, mode, c);
        gv->prep(n, x + (size_t)c * ldx, aux + (size_t)c * ldaux);
    }
    float *want = malloc(sizeof(float) * (size_t)nr * (size_t)nc);
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            ref->vec_dot(n, &want[(size_t)c * nr + r], w + (size_t)r * ldw, x + (size_t)c * ldx);
    /* gemv, one column at a time, with a guard after the outputs */
    float *y = malloc(sizeof(float) * ((size_t)nr + 1));
    for (int c = 0; c < nc; c++) {
        y[nr] = -7.0f;
        gv->gemv(n, nr, y, w, ldw, x + (size_t)c * ldx, aux + (size_t)c * ldaux);
        assert_true(y[nr] == -7.0f);
        for (int r = 0; r < nr; r++)
            if (memcmp(&y[r], &want[(size_t)c * nr + r], sizeof(float)))
                fail_msg("%s gemv mode %d n %lld nr %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), mode,
                         (long long)n, nr, r, c, y[r], want[(size_t)c * nr + r]);
    }
    size_t lds = (size_t)nr + 5;
    float *s = malloc(sizeof(float) * lds * (size_t)nc);
    for (size_t i = 0; i < lds * (size_t)nc; i++)
        s[i] = -7.0f;
    gv->gemm(n, nr, nc, s, lds, w, ldw, x, ldx, aux, ldaux);
    for (int c = 0; c < nc; c++) {
        for (int r = 0; r < nr; r++)
            if (memcmp(&s[(size_t)c * lds + r], &want[(size_t)c * nr + r], sizeof(float)))
                fail_msg("%s gemm mode %d n %lld nr %d nc %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), mode,
                         (long long)n, nr, nc, r, c, s[(size_t)c * lds + r], want[(size_t)c * nr + r]);
        for (size_t r = (size_t)nr; r < lds; r++)
            assert_true(s[(size_t)c * lds + r] == -7.0f); /* nothing written past nr */
    }
    /* the first nr / 16 groups of rows in the R16 layout: gemv16 and gemm16 give the same bits, and the layout
     * converts back to the rows, and quant_r16_row reads each row out */
    int n16 = nr / QUANT_R16_ROWS * QUANT_R16_ROWS;
    if (n16 && gv->gemv16) {
        uint8_t *w16 = test_r16_of(t, w, ldw, n16, n);
        for (int c = 0; c < nc; c++) {
            y[n16] = -7.0f;
            gv->gemv16(n, n16, y, w16, x + (size_t)c * ldx, aux + (size_t)c * ldaux);
            assert_true(y[n16] == -7.0f);
            for (int r = 0; r < n16; r++)
                if (memcmp(&y[r], &want[(size_t)c * nr + r], sizeof(float)))
                    fail_msg("%s gemv16 mode %d n %lld nr %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), mode,
                             (long long)n, n16, r, c, y[r], want[(size_t)c * nr + r]);
        }
        for (size_t i = 0; i < lds * (size_t)nc; i++)
            s[i] = -7.0f;
        /* the scratch at exactly the size asked, so ASan sees a write past it */
        void *scratch = NULL;
        if (gv->gemm16_scratch)
            assert_int_equal(posix_memalign(&scratch, 64, gv->gemm16_scratch(n)), 0);
        gv->gemm16(n, n16, nc, s, lds, w16, x, ldx, aux, ldaux, scratch);
        free(scratch);
        for (int c = 0; c < nc; c++) {
            for (int r = 0; r < n16; r++)
                if (memcmp(&s[(size_t)c * lds + r], &want[(size_t)c * nr + r], sizeof(float)))
                    fail_msg("%s gemm16 mode %d n %lld nr %d nc %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t),
                             mode, (long long)n, n16, nc, r, c, s[(size_t)c * lds + r], want[(size_t)c * nr + r]);
            for (size_t r = (size_t)n16; r < lds; r++)
                assert_true(s[(size_t)c * lds + r] == -7.0f);
        }
        free(w16);
    }
    free(w), free(x), free(aux), free(want), free(y), free(s);
}

/* check_set for every kernel set the CPU has */
static void check(enum dtype t, int64_t n, int nr, int nc, size_t wpad, uint64_t seed, int mode)
{
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (sets[i](t))
            check_set(sets[i], t, n, nr, nc, wpad, seed, mode);
}

static void skip_without_avx2(void)
{
    static int said;
    if (!gemv_ops_avx2(DTYPE_Q4_0)) {
        print_message("[  SKIPPED ] no AVX2 + FMA + F16C on this CPU (or WAFER_NO_SIMD set)\n");
        skip();
    }
    if (!said++)
        for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
            print_message("%s kernels: %s\n", set_names[i], sets[i](DTYPE_Q4_0) ? "checked" : "not on this CPU, skipped");
}

static const enum dtype types[] = {DTYPE_Q4_0, DTYPE_Q8_0};

static void test_shapes(void **state)
{
    (void)state;
    skip_without_avx2();
    static const int64_t ns[] = {32, 64, 96, 256, 2048, 2080};
    for (size_t a = 0; a < 2; a++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int nr = 1; nr <= 37; nr += (nr < 9 ? 1 : 7))
                check(types[a], ns[k], nr, 1 + (nr * 3 + (int)k) % 19, (size_t)(nr % 3) * 2, 11 + (uint64_t)(nr * 31 + (int)k), 0);
}

static void test_columns(void **state)
{
    (void)state;
    skip_without_avx2();
    for (size_t a = 0; a < 2; a++)
        for (int nc = 1; nc <= 19; nc++) {
            check(types[a], 288, 5, nc, 0, 100 + (uint64_t)nc, 0);
            check(types[a], 64, 8, nc, 4, 200 + (uint64_t)nc, 1);
        }
}

/* the R16 kernels: one to five groups of rows, every column-tile remainder, block counts below and above 8 */
static void test_r16_groups(void **state)
{
    (void)state;
    skip_without_avx2();
    static const int64_t ns[] = {32, 96, 288, 2048};
    for (size_t a = 0; a < 2; a++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int g = 1; g <= 5; g += 2)
                for (int nc = 1; nc <= 10; nc += 1 + (int)k)
                    check(types[a], ns[k], 16 * g + (nc % 3 == 1 ? 3 : 0), nc, (size_t)(nc % 2) * 2,
                          700 + (uint64_t)(g * 31 + nc), nc % 4);
    /* every lane of one group distinct: a row or dword swap in the layout shows */
    for (size_t a = 0; a < 2; a++)
        check(types[a], 64, 16, 3, 0, 800, 1);
    /* rows long enough that the gemms' column blocks (whose records they interleave) hold a few tiles: 12
     * columns at n 16384 with the AVX2 tile (20 = 12 + 8), 6 at 32768 (13 = 6 + 6 + 1) */
    for (size_t a = 0; a < 2; a++) {
        check(types[a], 16384, 16, 20, 2, 900, 0);
        check(types[a], 32768, 32, 13, 0, 901, 1);
    }
}

static void test_extremes(void **state)
{
    (void)state;
    skip_without_avx2();
    for (size_t a = 0; a < 2; a++)
        for (int mode = 1; mode <= 3; mode++) {
            check(types[a], 2080, 13, 7, 2, 300 + (uint64_t)mode, mode);
            check(types[a], 256, 37, 19, 0, 400 + (uint64_t)mode, mode);
            check(types[a], 96, 3, 2, 6, 500 + (uint64_t)mode, mode);
        }
}

static void test_column_blocks(void **state)
{
    (void)state;
    skip_without_avx2();
    /* long rows: aux per column ~100 KB, so 12 columns per cache block (the fewest) and with 29 columns three
     * blocks, the last of 5 */
    for (size_t a = 0; a < 2; a++) {
        check(types[a], 32 * 2056, 21, 11, 0, 600, 0);
        check(types[a], 32 * 2056, 37, 29, 2, 610, 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_columns),
        cmocka_unit_test(test_r16_groups),
        cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_column_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
