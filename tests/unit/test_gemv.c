/*
 * gemv tests: the AVX2 decode kernels and the AVX2 gemm give outputs bit-identical to
 * kernel_ops vec_dot (and so to the gemm tiles the batched path uses) for every type they cover, for row and
 * column counts that leave every tile remainder and cross column cache blocks, block counts that are and are
 * not multiples of 8, F16 rows with tails, and extreme codes (all-max, all-min). Also checks that each result
 * is the dot product it claims (against quant_row_to_f32 in double).
 */
#include "testutil.h"

#include "engine/dtype.h"
#include "engine/cpu/gemm_tiles.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void check_ops(const struct gemv_ops *gv, enum dtype t, int64_t n, int64_t nr, uint64_t seed, int extreme)
{
    const struct kernel_ops *ops = kernel_ops_get(t);
    assert_non_null(ops);
    assert_non_null(gv);
    size_t rb = dtype_row_bytes(t, n);
    uint8_t *w = malloc(rb * (size_t)nr + 64);
    float *f = malloc(sizeof(float) * (size_t)n), *deq = malloc(sizeof(float) * (size_t)n);
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = extreme == 1 ? (i % 3 ? 1.0f : -1.0f) : extreme == 2 ? -1.0f : test_rand_f32(&seed) * (1 + (float)(r % 5));
        assert_int_equal(quant_row_from_f32(t, f, w + (size_t)r * rb, n), 0);
    }
    for (int64_t i = 0; i < n; i++)
        f[i] = extreme ? (i % 2 ? 3.0f : -3.0f) : test_rand_f32(&seed) * 2;
    uint8_t *x = malloc(dtype_row_bytes(ops->vec_type, n));
    ops->from_f32(f, x, n);
    size_t ab = gv->aux_bytes(n);
    void *aux = aligned_alloc(64, (ab + 63) & ~(size_t)63 ? (ab + 63) & ~(size_t)63 : 64);
    gv->prep(n, x, aux);
    float *want = malloc(sizeof(float) * (size_t)nr), *got = malloc(sizeof(float) * (size_t)nr);
    for (int64_t r = 0; r < nr; r++)
        ops->vec_dot(n, &want[r], w + (size_t)r * rb, x);
    gv->gemv(n, nr, got, w, rb, x, aux);
    for (int64_t r = 0; r < nr; r++)
        if (memcmp(&want[r], &got[r], sizeof(float)))
            fail_msg("%s n %lld nr %lld row %lld: gemv %.9g, vec_dot %.9g", dtype_name(t), (long long)n, (long long)nr,
                     (long long)r, got[r], want[r]);
    /* the value itself: against dequantized weights and activations, in double */
    float *xd = malloc(sizeof(float) * (size_t)n);
    assert_int_equal(quant_row_to_f32(ops->vec_type, x, xd, n), 0);
    for (int64_t r = 0; r < nr; r++) {
        assert_int_equal(quant_row_to_f32(t, w + (size_t)r * rb, deq, n), 0);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++)
            ref += (double)deq[i] * xd[i], mag += fabs((double)deq[i] * xd[i]);
        if (fabs(ref - got[r]) > 1e-4 * mag + 1e-6)
            fail_msg("%s n %lld row %lld: gemv %.9g, reference %.9g", dtype_name(t), (long long)n, (long long)r, got[r], ref);
    }
    free(w), free(f), free(deq), free(x), free(aux), free(want), free(got), free(xd);
}

static void check_type(enum dtype t, int64_t n, int64_t nr, uint64_t seed, int extreme)
{
    check_ops(gemv_ops_avx2(t), t, n, nr, seed, extreme);
}

/* gemm of nr weight rows x nc activation rows against vec_dot for every pair. */
static void check_gemm(const struct gemv_ops *gv, enum dtype t, int64_t n, int nr, int nc, uint64_t seed)
{
    const struct kernel_ops *ops = kernel_ops_get(t);
    size_t rb = dtype_row_bytes(t, n), xb = dtype_row_bytes(ops->vec_type, n) + 8; /* padded: ldx != row bytes */
    size_t ab = (gv->aux_bytes(n) + 31) & ~(size_t)31;
    uint8_t *w = malloc(rb * (size_t)nr), *x = malloc(xb * (size_t)nc);
    uint8_t *aux = aligned_alloc(32, ab ? ab * (size_t)nc : 32);
    float *f = malloc(sizeof(float) * (size_t)n);
    for (int r = 0; r < nr; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = test_rand_f32(&seed) * (1 + r % 3);
        quant_row_from_f32(t, f, w + (size_t)r * rb, n);
    }
    for (int c = 0; c < nc; c++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = test_rand_f32(&seed) * (c % 4 ? 1.0f : 40.0f);
        ops->from_f32(f, x + (size_t)c * xb, n);
        gv->prep(n, x + (size_t)c * xb, aux + (size_t)c * ab);
    }
    size_t lds = (size_t)nr + 3;
    float *s = malloc(sizeof(float) * lds * (size_t)nc);
    gv->gemm(n, nr, nc, s, lds, w, rb, x, xb, aux, ab);
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++) {
            float want;
            ops->vec_dot(n, &want, w + (size_t)r * rb, x + (size_t)c * xb);
            if (memcmp(&want, &s[(size_t)c * lds + r], sizeof(float)))
                fail_msg("%s gemm n %lld nr %d nc %d (row %d, col %d): %.9g, vec_dot %.9g", dtype_name(t), (long long)n, nr,
                         nc, r, c, s[(size_t)c * lds + r], want);
        }
    free(w), free(x), free(aux), free(f), free(s);
}

/* Every gemm of a gemv_ops set (AVX2) against vec_dot: tile edges in rows and columns, block counts
 * that are and are not multiples of 8 (the tiles take scale products 8 blocks at a time), several column cache
 * blocks. */
static void check_gemm_set(const struct gemv_ops *(*set)(enum dtype))
{
    const enum dtype ts[] = {DTYPE_Q4_0, DTYPE_Q8_0, DTYPE_F16};
    for (size_t a = 0; a < sizeof ts / sizeof ts[0]; a++) {
        const struct gemv_ops *gv = set(ts[a]);
        assert_non_null(gv->gemm);
        for (int nr = 1; nr <= 7; nr++)
            for (int nc = 1; nc <= 9; nc += 2)
                check_gemm(gv, ts[a], 32 * (3 + nr + nc), nr, nc, 7 + (uint64_t)(nr * 16 + nc));
        check_gemm(gv, ts[a], 2048, 3, 47, 5); /* several column cache blocks */
        check_gemm(gv, ts[a], 8192, 4, 40, 9);
        check_gemm(gv, ts[a], 256, 7, 8, 6);
    }
    /* the F16 gemm both ways whatever this CPU's L1 (cpu_f16_gemm_f32_panels): blocks of 8 or more tiles on
     * panels converted to F32, and on the F16 rows */
    for (int f32 = 0; f32 <= 1; f32++) {
        setenv("WAFER_F16_F32_PANELS", f32 ? "1" : "0", 1);
        /* F16 rows with an 8-element step and a tail (chain 0's end), for every tile shape and leftover column
         * count, and both decode layouts' sets (they share the gemm) */
        const int64_t ns[] = {5, 8, 13, 24, 2053, 2056, 2060};
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (int nr = 1; nr <= 7; nr += 3)
                for (int nc = 1; nc <= 9; nc++)
                    check_gemm(set(DTYPE_F16), DTYPE_F16, ns[b], nr + (int)b % 2, nc, 500 + b * 16 + (uint64_t)nc);
        /* blocks of 8 or more F16 tiles (prefill): with a tail, left-over rows and columns, rows shorter than a
         * step, rows too long for the converted panel, and longer ones (4100, 6152) */
        check_gemm(set(DTYPE_F16), DTYPE_F16, 2053, 7, 37, 11);
        check_gemm(set(DTYPE_F16), DTYPE_F16, 13, 5, 40, 12);
        check_gemm(set(DTYPE_F16), DTYPE_F16, 8200, 4, 40, 13);
        check_gemm(set(DTYPE_F16), DTYPE_F16, 4100, 7, 9, 14);
        check_gemm(set(DTYPE_F16), DTYPE_F16, 2049, 4, 8, 15);
        check_gemm(set(DTYPE_F16), DTYPE_F16, 40, 6, 90, 16);
        check_gemm(set(DTYPE_F16), DTYPE_F16, 6152, 3, 33, 17);
    }
    unsetenv("WAFER_F16_F32_PANELS");
}

static void test_avx2_gemm(void **state)
{
    (void)state;
    if (!gemv_ops_avx2(DTYPE_Q4_0)) {
        print_message("[  SKIPPED ] no AVX2+FMA+F16C on this CPU (or WAFER_NO_SIMD set)\n");
        skip();
    }
    check_gemm_set(gemv_ops_avx2);
}

static void skip_without_avx2(void)
{
    if (!gemv_ops_avx2(DTYPE_Q4_0)) {
        print_message("[  SKIPPED ] no AVX2+FMA+F16C on this CPU (or WAFER_NO_SIMD set)\n");
        skip();
    }
}

static void test_q4_0_q8_0(void **state)
{
    (void)state;
    skip_without_avx2();
    const enum dtype ts[] = {DTYPE_Q4_0, DTYPE_Q8_0};
    const int64_t ns[] = {32, 256, 416, 2048, 32 * 67};
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (int64_t nr = 1; nr <= 9; nr += 2)
                check_type(ts[a], ns[b], nr + (int64_t)b, 100 + a * 10 + b, 0);
    check_type(DTYPE_Q4_0, 512, 6, 1, 1);
    check_type(DTYPE_Q4_0, 512, 6, 1, 2);
    check_type(DTYPE_Q8_0, 512, 6, 1, 1);
    check_type(DTYPE_Q8_0, 512, 6, 1, 2);
}

static void test_k_quants(void **state)
{
    (void)state;
    skip_without_avx2();
    const enum dtype ts[] = {DTYPE_Q4_K, DTYPE_Q6_K};
    const int64_t ns[] = {256, 768, 2048};
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (int64_t nr = 1; nr <= 5; nr += 2)
                check_type(ts[a], ns[b], nr + (int64_t)b, 200 + a * 10 + b, 0);
    check_type(DTYPE_Q4_K, 512, 3, 1, 1);
    check_type(DTYPE_Q6_K, 512, 3, 1, 2);
}

static void test_f16(void **state)
{
    (void)state;
    skip_without_avx2();
    const int64_t ns[] = {8, 13, 16, 40, 64, 2048, 2053};
    for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
        for (int64_t nr = 1; nr <= 9; nr += 4) {
            check_type(DTYPE_F16, ns[b], nr + (int64_t)b, 300 + b, 0);
            /* both layouts whatever this CPU's vendor (4-row tiles; 4 streams: nr 9-15 gives 2-3 rows per
             * stream and 0-3 left over) */
            for (int streams = 0; streams < 2; streams++)
                check_ops(gemv_ops_avx2_f16(streams), DTYPE_F16, ns[b], nr + (int64_t)b, 400 + b, 0);
        }

}

static void test_coverage(void **state)
{
    (void)state;
    skip_without_avx2();
    /* the types decode runs most: a missing one would silently fall back to gemm */
    const enum dtype ts[] = {DTYPE_Q4_0, DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_F16};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        const struct gemv_ops *gv = gemv_ops_avx2(ts[i]);
        assert_non_null(gv);
        assert_int_equal(gv->type, ts[i]);
    }
    assert_null(gemv_ops_avx2(DTYPE_Q8_K));
}

/* gemm_prefetch_share: the tiles of a group, each asking at every block for the lines p, p + 64, .. below
 * p + pfn from its share's start (as the R16 tiles' prefetch does), ask for every line of the next group and
 * nothing outside it; at least a line a block where the group has one; at most min(nt, lines a block) tiles
 * get a share, the rest NULL, and none without a next group. */
static void test_prefetch_share(void **state)
{
    (void)state;
    /* (a group's bytes a block, blocks): Q4_0 and Q8_0 at n 2048 / 8192, Q4_K, Q6_K, a group smaller than a line a
     * block */
    const size_t gbs[][2] = {{288, 64}, {288, 256}, {544, 64}, {2304, 8}, {2304, 32}, {3360, 8}, {3360, 32}, {32, 4}};
    static unsigned char lines[3360 * 32 / 64 + 1];
    for (size_t k = 0; k < sizeof gbs / sizeof gbs[0]; k++) {
        size_t gb = gbs[k][0], nb = gbs[k][1], gbytes = gb * nb, nl = (gbytes + 63) / 64;
        size_t want_k = gb / 64 ? gb / 64 : 1;
        for (int nt = 1; nt <= 60; nt++) {
            memset(lines, 0, sizeof lines);
            const unsigned char *base = (const unsigned char *)(uintptr_t)4096; /* a line-aligned group */
            int shares = 0;
            for (int ti = 0; ti < nt; ti++) {
                size_t pfn;
                assert_null(gemm_prefetch_share(NULL, gbytes, ti, nt, (long)nb, &pfn));
                const unsigned char *p = gemm_prefetch_share(base, gbytes, ti, nt, (long)nb, &pfn);
                if (!p)
                    continue;
                shares++;
                if (gb >= 64)
                    assert_true(pfn >= 64);
                for (size_t b = 0; b < nb; b++)
                    for (size_t i = 0; i < pfn; i += 64) {
                        size_t off = (size_t)(p - base) + b * pfn + i;
                        if (off < gbytes)
                            lines[off / 64] = 1;
                        else /* past the group: only the last share's rounding, less than a block's share */
                            assert_true(off < gbytes + pfn);
                    }
            }
            assert_int_equal(shares, (size_t)nt < want_k ? (size_t)nt : want_k);
            for (size_t l = 0; l < nl; l++)
                if (!lines[l])
                    fail_msg("group of %zu x %zu bytes, %d tiles: line %zu not asked for", nb, gb, nt, l);
        }
    }
}

/* gemm_prefetch_stride: the passes ask for every line of the next rows when they can, as rarely as that allows */
static void test_prefetch_stride(void **state)
{
    (void)state;
    const long steps[] = {1, 3, 8, 128, 512, 1000};
    const int passes[] = {1, 2, 4, 8, 32, 128};
    const size_t bytes[] = {1, 64, 12288, 49152, 100000};
    for (size_t a = 0; a < sizeof steps / sizeof steps[0]; a++)
        for (size_t b = 0; b < sizeof passes / sizeof passes[0]; b++)
            for (size_t c = 0; c < sizeof bytes / sizeof bytes[0]; c++) {
                long st = steps[a];
                int sh = gemm_prefetch_stride(st, passes[b], bytes[c]);
                size_t asked = (size_t)passes[b] * (size_t)(st >> sh) * 64;
                size_t more = (size_t)passes[b] * (size_t)(st >> (sh + 1)) * 64;
                assert_true(sh >= 0 && (st >> sh) > 0);
                if (sh > 0 && asked < bytes[c])
                    fail_msg("%ld steps, %d passes, %zu bytes: a line every 2^%d steps asks for %zu", st, passes[b],
                             bytes[c], sh, asked);
                if ((st >> (sh + 1)) > 0 && more >= bytes[c])
                    fail_msg("%ld steps, %d passes, %zu bytes: 2^%d steps would still ask for all", st, passes[b],
                             bytes[c], sh + 1);
            }
    /* batched decode's 8 columns of n 2048 (two tiles, four passes) over a panel of 3 F16 rows: every other step */
    assert_int_equal(gemm_prefetch_stride(2048 / 16, 4, 3 * 2048 * 2), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_0_q8_0),
        cmocka_unit_test(test_k_quants),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_coverage),
        cmocka_unit_test(test_avx2_gemm),
        cmocka_unit_test(test_prefetch_share),
        cmocka_unit_test(test_prefetch_stride),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
