/* Tests for quant.c: block layouts checked against hand-packed blocks decoded with formulas written
 * independently here, GGML's reference rounding for Q8_0/Q4_0 on hand-picked values, idempotence of
 * re-quantizing a decoded row, and the error of quantize -> dequantize on Gaussian data per type. */
#include "testutil.h"

#include "core/err.h"
#include "engine/gguf/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void gauss_fill(float *x, int64_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((test_rand_u64(&st) >> 11) + 1) * (1.0 / 9007199254740993.0); /* (0, 1] */
        double u2 = (test_rand_u64(&st) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1));
        x[i] = (float)(r * cos(2 * M_PI * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(2 * M_PI * u2));
    }
}

/* RMS(dequant(quant(x)) - x) / RMS(x) over n Gaussian values. */
static double roundtrip_rel_rms(enum dtype t, int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    void *q = malloc(dtype_row_bytes(t, n));
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(q);
    gauss_fill(x, n, seed);
    assert_int_equal(quant_row_from_f32(t, x, q, n), 0);
    assert_int_equal(quant_row_to_f32(t, q, y, n), 0);
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; i++) {
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    free(x);
    free(y);
    free(q);
    return sqrt(se / sx);
}

/* Bounds sit a little above the measured errors (printed by the test), so a regression in a quantizer's
 * search shows up. Measured on 64 Ki values: see the printed line. */
static void test_roundtrip_errors(void **state)
{
    (void)state;
    struct {
        enum dtype t;
        double bound;
    } cases[] = {
        {DTYPE_F32, 0.0},     {DTYPE_F16, 2.3e-4},   {DTYPE_BF16, 1.8e-3}, {DTYPE_Q8_0, 0.0056},
        {DTYPE_Q8_K, 0.0073}, {DTYPE_Q6_K, 0.0180}, {DTYPE_Q4_K, 0.0735}, {DTYPE_Q4_0, 0.0890},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double e = roundtrip_rel_rms(cases[i].t, 65536, 1234 + i);
        print_message("%-5s relative RMS error %.5f (bound %.5f)\n", dtype_name(cases[i].t), e, cases[i].bound);
        assert_true(e <= cases[i].bound);
    }
}

static void test_errors(void **state)
{
    (void)state;
    float x[64] = {0};
    uint8_t buf[512];
    assert_int_equal(quant_row_from_f32(DTYPE_Q4_0, x, buf, 33), ERR_INVALID_ARG);
    assert_int_equal(quant_row_from_f32(DTYPE_Q4_K, x, buf, 64), ERR_INVALID_ARG);
    assert_int_equal(quant_row_to_f32(DTYPE_Q8_0, buf, x, -32), ERR_INVALID_ARG);
    assert_int_equal(quant_row_from_f32(DTYPE_Q5_K, x, buf, 256), ERR_UNSUPPORTED);
    assert_int_equal(quant_row_to_f32(DTYPE_Q4_1, buf, x, 32), ERR_UNSUPPORTED);
    assert_int_equal(quant_row_to_f32((enum dtype)99, buf, x, 32), ERR_UNSUPPORTED);
    assert_int_equal(quant_row_from_f32(DTYPE_F16, x, buf, 0), 0);
}

static void test_q8_0_layout_and_rounding(void **state)
{
    (void)state;
    /* decode: d = 0.5 (f16 0x3800), qs = j - 16 */
    uint8_t blk[34] = {0x00, 0x38};
    for (int j = 0; j < 32; j++)
        blk[2 + j] = (uint8_t)(int8_t)(j - 16);
    float y[32];
    assert_int_equal(quant_row_to_f32(DTYPE_Q8_0, blk, y, 32), 0);
    for (int j = 0; j < 32; j++)
        assert_true(y[j] == 0.5f * (float)(j - 16));

    /* encode: amax 127 gives d = 1 exactly; ties round away from zero as GGML's roundf does */
    float x[32] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49f, -126.5f, 3.0f};
    uint8_t q[34];
    assert_int_equal(quant_row_from_f32(DTYPE_Q8_0, x, q, 32), 0);
    assert_int_equal(q[0] | q[1] << 8, 0x3c00);
    const int8_t want[8] = {127, 3, -3, 1, -1, 1, -127, 3};
    for (int j = 0; j < 8; j++)
        assert_int_equal((int8_t)q[2 + j], want[j]);
    for (int j = 8; j < 32; j++)
        assert_int_equal(q[2 + j], 0);
}

static void test_q4_0_layout_and_rounding(void **state)
{
    (void)state;
    /* decode: d = 0.5; byte j holds element j (low nibble) and j + 16 (high nibble) */
    uint8_t blk[18] = {0x00, 0x38};
    for (int j = 0; j < 16; j++)
        blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    assert_int_equal(quant_row_to_f32(DTYPE_Q4_0, blk, y, 32), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 0.5f * (float)(j - 8));
        assert_true(y[j + 16] == 0.5f * (float)(7 - j));
    }

    /* encode: the signed extreme -1 maps to code 0 (d = -1/-8 = 0.125); x * 8 + 8.5 truncated */
    float x[32] = {0};
    x[0] = -1.0f;  /* 0 */
    x[1] = 0.5f;   /* 4 + 8.5 -> 12 */
    x[2] = 0.0625f; /* 0.5 + 8.5 = 9.0 -> 9 (ties go up) */
    x[3] = -0.0625f; /* -0.5 + 8.5 = 8.0 -> 8 */
    x[16] = 0.99f; /* 7.92 + 8.5 -> 16 -> clamped to 15 */
    x[17] = -0.3f; /* -2.4 + 8.5 = 6.1 -> 6 */
    uint8_t q[18];
    assert_int_equal(quant_row_from_f32(DTYPE_Q4_0, x, q, 32), 0);
    assert_int_equal(q[0] | q[1] << 8, 0x3000); /* 0.125 */
    assert_int_equal(q[2 + 0], 0 | 15 << 4);
    assert_int_equal(q[2 + 1], 12 | 6 << 4);
    assert_int_equal(q[2 + 2], 9 | 8 << 4);
    assert_int_equal(q[2 + 3], 8 | 8 << 4);
    /* a positive extreme gives a negative d: +2 maps to code 0 too */
    memset(x, 0, sizeof x);
    x[5] = 2.0f;
    assert_int_equal(quant_row_from_f32(DTYPE_Q4_0, x, q, 32), 0);
    assert_int_equal(q[0] | q[1] << 8, 0xb400); /* -0.25 */
    assert_int_equal(q[2 + 5] & 15, 0);
    assert_int_equal(q[2 + 4] & 15, 8);
}

static void test_q4_k_layout(void **state)
{
    (void)state;
    /* scales/mins packed by hand: sub-blocks 4..7 use values >= 16 so their high bits are exercised */
    const int sc[8] = {1, 2, 3, 63, 37, 20, 48, 9};
    const int mn[8] = {0, 5, 63, 1, 18, 33, 7, 60};
    const uint8_t packed[12] = {129, 66, 195, 63, 64, 133, 63, 193, 37, 20, 112, 201};
    uint8_t blk[144];
    blk[0] = 0x00, blk[1] = 0x3c; /* d = 1 */
    blk[2] = 0x00, blk[3] = 0x38; /* dmin = 0.5 */
    memcpy(blk + 4, packed, 12);
    for (int i = 0; i < 128; i++)
        blk[16 + i] = (uint8_t)(i * 7 + 3);
    float y[256];
    assert_int_equal(quant_row_to_f32(DTYPE_Q4_K, blk, y, 256), 0);
    for (int e = 0; e < 256; e++) {
        int j = e / 32, byte = 32 * (e / 64) + e % 32;
        int q = (j % 2 == 0) ? blk[16 + byte] & 15 : blk[16 + byte] >> 4;
        float want = 1.0f * (float)sc[j] * (float)q - 0.5f * (float)mn[j];
        if (y[e] != want)
            fail_msg("element %d: got %g want %g", e, y[e], want);
    }
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        quant_q4_k_scale_min(j, packed, &s, &m);
        assert_int_equal(s, sc[j]);
        assert_int_equal(m, mn[j]);
    }
}

static void test_q6_k_layout(void **state)
{
    (void)state;
    uint8_t blk[210];
    for (int i = 0; i < 128; i++)
        blk[i] = (uint8_t)(i * 13 + 5);
    for (int i = 0; i < 64; i++)
        blk[128 + i] = (uint8_t)(i * 29 + 1);
    for (int g = 0; g < 16; g++)
        blk[192 + g] = (uint8_t)(int8_t)(g * 9 - 70); /* negative and positive scales */
    blk[208] = 0x00, blk[209] = 0x34; /* d = 0.25 */
    float y[256];
    assert_int_equal(quant_row_to_f32(DTYPE_Q6_K, blk, y, 256), 0);
    for (int e = 0; e < 256; e++) {
        /* each half of 128 is four quarters of 32: quarter qt takes ql byte i (qt 0, 2) or i + 32 (qt 1, 3),
         * its low (qt < 2) or high nibble, and bits 2qt, 2qt+1 of qh byte i */
        int h = e / 128, r = e % 128, qt = r / 32, i = r % 32;
        int lo = blk[64 * h + i + (qt & 1) * 32];
        lo = qt < 2 ? lo & 15 : lo >> 4;
        int hi = (blk[128 + 32 * h + i] >> (2 * qt)) & 3;
        float want = 0.25f * (float)(int8_t)blk[192 + e / 16] * (float)((lo | hi << 4) - 32);
        if (y[e] != want)
            fail_msg("element %d: got %g want %g", e, y[e], want);
    }
}

/* The GGUF Q6_K block at blk with its codes as quant.h says R16 keeps them (in place): per half h and byte
 * i < 32, the codes of elements 128h + 32qt + i as dequantize_row_q6_K reads them (qt 0-3: ql[64h + i] &
 * 15, ql[64h + 32 + i] & 15, ql[64h + i] >> 4, ql[64h + 32 + i] >> 4, each with qh[32h + i]'s bits 2qt,
 * 2qt + 1 on top); codes 0-2 go to the low 6 bits of those three bytes, code 3's bit pairs to their tops. */
static void q6_k_as_r16(uint8_t *blk)
{
    struct block_q6_k *q = (struct block_q6_k *)blk;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) {
            uint8_t *by[3] = {&q->ql[64 * h + i], &q->ql[64 * h + 32 + i], &q->qh[32 * h + i]};
            int code[4];
            for (int qt = 0; qt < 4; qt++)
                code[qt] = ((*by[qt & 1] >> (qt < 2 ? 0 : 4)) & 15) | ((*by[2] >> (2 * qt)) & 3) << 4;
            for (int j = 0; j < 3; j++)
                *by[j] = (uint8_t)(code[j] | ((code[3] >> (2 * j)) & 3) << 6);
        }
}

/* quant.h's R16 layout, byte by byte, from a description written here: per type the F16 scales' and the
 * dwords' places in a GGUF block (hoff, doff) and in a group (Q6_K's with its codes re-packed, q6_k_as_r16).
 * Every byte of 16 distinct rows must land where quant.h says, the group's bytes are each written once, and
 * the dwords of Q4_0 / Q8_0 / Q6_K (32-byte scales, blocks in pairs) start on 64-byte lines but for a last
 * unpaired block; Q4_K's blocks come one after another. The first pair of a Q4_0 group is spelled out. The
 * conversion back gives the rows again. */
static void test_r16_layout(void **state)
{
    (void)state;
    static const struct {
        enum dtype t;
        size_t bb, nh, hoff, nd, doff;
    } ty[] = {
        {DTYPE_Q4_0, 18, 1, 0, 4, 2},
        {DTYPE_Q8_0, 34, 1, 0, 8, 2},
        {DTYPE_Q4_K, 144, 2, 0, 35, 4},
        {DTYPE_Q6_K, 210, 1, 208, 52, 0},
    };
    /* Q6_K's run of dwords 4j..4j + 3 at each place: the scales (48-51), then per half of the block and
     * sub-group: ql, ql + 8 and qh (0-3, 8-11, 32-35; 4-7, 12-15, 36-39; 16-19, ..) */
    static const size_t q6_runs[13] = {12, 0, 2, 8, 1, 3, 9, 4, 6, 10, 5, 7, 11};
    /* Q4_0, 2 blocks: scales of block 0 at 0, of block 1 at 32, dwords of block 0 at 64, of block 1 at 320 */
    assert_int_equal(quant_r16_scales(1, 4, 2, 0), 0);
    assert_int_equal(quant_r16_scales(1, 4, 2, 1), 32);
    assert_int_equal(quant_r16_dwords(1, 4, 2, 0), 64);
    assert_int_equal(quant_r16_dwords(1, 4, 2, 1), 320);
    assert_int_equal(quant_r16_dwords(1, 4, 3, 2), 576 + 32); /* the last, alone: scales, then its dwords */
    /* Q4_K, 2 blocks: block 0's scales at 0, its dwords at 64, block 1 (scales) at 16 x 144 = 2304 */
    assert_int_equal(quant_r16_dwords(2, 35, 2, 0), 64);
    assert_int_equal(quant_r16_scales(2, 35, 2, 1), 2304);
    assert_int_equal(quant_r16_dwords(2, 35, 2, 1), 2304 + 64);
    for (size_t i = 0; i < sizeof ty / sizeof ty[0]; i++)
        for (int64_t nb = 1; nb <= 6; nb++) {
            const size_t R = QUANT_R16_ROWS, rb = ty[i].bb * (size_t)nb, gbytes = R * rb;
            int64_t cols = nb * (ty[i].t == DTYPE_Q4_K || ty[i].t == DTYPE_Q6_K ? 256 : 32);
            assert_int_equal(dtype_row_bytes(ty[i].t, cols), rb);
            uint8_t *rows = malloc(gbytes), *g = malloc(gbytes), *seen = calloc(gbytes, 1);
            assert_non_null(rows);
            assert_non_null(g);
            assert_non_null(seen);
            uint64_t st = 77 + i * 10 + (uint64_t)nb;
            for (size_t k = 0; k < gbytes; k++)
                rows[k] = (uint8_t)test_rand_u64(&st);
            assert_int_equal(quant_r16_convert(ty[i].t, rows, g, (int64_t)R, cols, true), 0);
            uint8_t *want = malloc(gbytes), *back = malloc(gbytes);
            assert_non_null(want);
            assert_non_null(back);
            memcpy(want, rows, gbytes);
            for (size_t k = 0; ty[i].t == DTYPE_Q6_K && k < gbytes; k += ty[i].bb)
                q6_k_as_r16(want + k);
            for (int64_t b = 0; b < nb; b++) {
                size_t hs = quant_r16_scales(ty[i].nh, ty[i].nd, nb, b);
                size_t qd = quant_r16_dwords(ty[i].nh, ty[i].nd, nb, b);
                bool paired = ty[i].nh == 1 && !(nb % 2 == 1 && b == nb - 1);
                if (ty[i].nh == 2 || paired)
                    assert_int_equal(qd % 64, 0);
                for (size_t r = 0; r < R; r++) {
                    const uint8_t *blk = want + r * rb + (size_t)b * ty[i].bb;
                    for (size_t h = 0; h < ty[i].nh; h++) {
                        size_t at = hs + (h * R + r) * 2;
                        assert_memory_equal(g + at, blk + ty[i].hoff + 2 * h, 2);
                        seen[at]++, seen[at + 1]++;
                    }
                    for (size_t k = 0; k < ty[i].nd; k++) {
                        size_t place = k;
                        if (ty[i].t == DTYPE_Q6_K) /* its runs of 4 dwords in decode's reading order */
                            for (size_t j = 0; j < 13; j++)
                                if (q6_runs[j] == k / 4)
                                    place = 4 * j + k % 4;
                        size_t at = qd + (place * R + r) * 4;
                        assert_memory_equal(g + at, blk + ty[i].doff + 4 * k, 4);
                        for (int j = 0; j < 4; j++)
                            seen[at + (size_t)j]++;
                    }
                }
            }
            for (size_t k = 0; k < gbytes; k++)
                assert_int_equal(seen[k], 1);
            assert_int_equal(quant_r16_convert(ty[i].t, g, back, (int64_t)R, cols, false), 0);
            assert_memory_equal(back, rows, gbytes);
            free(want);
            free(back);
            free(rows);
            free(g);
            free(seen);
        }
}

static void test_q8_k_format(void **state)
{
    (void)state;
    float x[512];
    gauss_fill(x, 512, 77);
    x[300] = -9.0f; /* the extreme of block 1 */
    struct block_q8_k q[2];
    assert_int_equal(quant_row_from_f32(DTYPE_Q8_K, x, q, 512), 0);
    assert_true(q[1].d == 9.0f / 127.0f);
    assert_int_equal(q[1].qs[300 - 256], -127);
    for (int b = 0; b < 2; b++) {
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += q[b].qs[16 * g + j];
            assert_int_equal(q[b].bsums[g], s);
        }
        for (int j = 0; j < 256; j++) /* each code within half a step of the value */
            assert_true(fabsf(q[b].d * q[b].qs[j] - x[256 * b + j]) <= q[b].d * 0.5f * 1.0001f);
    }
}

/* Decoding a quantized row and quantizing it again gives the same bytes: the grid is a fixed point. */
static void test_requantize_fixed_point(void **state)
{
    (void)state;
    enum dtype types[] = {DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_F16, DTYPE_BF16};
    const int64_t n = 4096;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint8_t *a = malloc(dtype_row_bytes(DTYPE_F32, n)), *b = malloc(dtype_row_bytes(DTYPE_F32, n));
    gauss_fill(x, n, 99);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        size_t rb = dtype_row_bytes(types[k], n);
        assert_int_equal(quant_row_from_f32(types[k], x, a, n), 0);
        assert_int_equal(quant_row_to_f32(types[k], a, y, n), 0);
        assert_int_equal(quant_row_from_f32(types[k], y, b, n), 0);
        if (memcmp(a, b, rb) != 0)
            fail_msg("%s: re-quantizing a decoded row changed it", dtype_name(types[k]));
    }
    free(x);
    free(y);
    free(a);
    free(b);
}

/* Degenerate blocks decode to what they encode: all zero, all equal, one spike. */
static void test_degenerate_blocks(void **state)
{
    (void)state;
    enum dtype types[] = {DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q8_K};
    float x[256], y[256];
    uint8_t q[512];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum dtype t = types[k];
        memset(x, 0, sizeof x);
        assert_int_equal(quant_row_from_f32(t, x, q, 256), 0);
        assert_int_equal(quant_row_to_f32(t, q, y, 256), 0);
        for (int i = 0; i < 256; i++)
            assert_true(y[i] == 0.0f);
        x[17] = 3.0f;
        assert_int_equal(quant_row_from_f32(t, x, q, 256), 0);
        assert_int_equal(quant_row_to_f32(t, q, y, 256), 0);
        for (int i = 0; i < 256; i++)
            if (fabsf(y[i] - x[i]) > 3.0f * 2e-3f)
                fail_msg("%s spike: element %d decodes to %g, want %g", dtype_name(t), i, y[i], x[i]);
        for (int i = 0; i < 256; i++)
            x[i] = 1.5f;
        assert_int_equal(quant_row_from_f32(t, x, q, 256), 0);
        assert_int_equal(quant_row_to_f32(t, q, y, 256), 0);
        for (int i = 0; i < 256; i++)
            if (fabsf(y[i] - 1.5f) > 1.5f * 2e-3f)
                fail_msg("%s constant: element %d decodes to %g", dtype_name(t), i, y[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_q8_0_layout_and_rounding),
        cmocka_unit_test(test_q4_0_layout_and_rounding),
        cmocka_unit_test(test_q4_k_layout),
        cmocka_unit_test(test_q6_k_layout),
        cmocka_unit_test(test_r16_layout),
        cmocka_unit_test(test_q8_k_format),
        cmocka_unit_test(test_requantize_fixed_point),
        cmocka_unit_test(test_degenerate_blocks),
        cmocka_unit_test(test_roundtrip_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
