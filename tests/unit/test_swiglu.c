/*
 * SwiGLU tests: kernel_expf is glibc's expf bit for bit (a stride over every float bit pattern, and every
 * float near the thresholds of its special cases), so replacing expf by it changed no result; kernel_swiglu's
 * vector versions (AVX-512 over 16-lane steps, AVX2 over the 8-lane rest, then scalar) give exactly the scalar
 * loop's bits for values of every magnitude, NaN, infinities and the |x| >= 88 lanes the vector code hands to
 * kernel_expf, at every length up to 40 (every split between the three paths); with WAFER_NO_SIMD=1 the scalar
 * path alone gives the same bits.
 */
#include "testutil.h"

#include "engine/cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float f32_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t bits_f32(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* kernel_expf(x) against libm's expf(x); NaN results compare as NaN (payloads are not part of expf's promise). */
static void expect_expf(uint32_t b, long *checked)
{
    float x = f32_bits(b), e = kernel_expf(x), w = expf(x);
    if (isnan(w) ? !isnan(e) : bits_f32(e) != bits_f32(w))
        fail_msg("kernel_expf(%a) (bits %08x) = %a, libm expf %a", (double)x, b, (double)e, (double)w);
    (*checked)++;
}

static void test_expf_is_libm(void **state)
{
    (void)state;
    long checked = 0;
    /* a prime stride over all 2^32 patterns: every exponent, both signs, NaNs and infinities */
    for (uint64_t b = 0; b < ((uint64_t)1 << 32); b += 509)
        expect_expf((uint32_t)b, &checked);
    /* every float within 2^16 ulps of each threshold of the special cases and of the table's wrap points */
    const float edges[] = {88.0f, 0x1.62e42ep6f, -88.0f, -0x1.9fe368p6f, -0x1.9d1d9ep6f, 0.0f, -0.0f, 1.0f, -1.0f,
                           0x1p-10f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        uint32_t c = bits_f32(edges[i]);
        for (int64_t d = -(1 << 16); d <= (1 << 16); d++)
            expect_expf((uint32_t)((int64_t)c + d), &checked);
    }
    assert_true(checked > 8000000);
}

/* A value of any magnitude: random bits, some of them the special cases the vector code hands back. */
static float any_value(uint64_t *seed)
{
    uint64_t r = test_rand_u64(seed);
    switch (r % 16) {
    case 0: return f32_bits((uint32_t)(r >> 32)); /* any pattern: NaNs, infinities, subnormals, huge */
    case 1: return (r >> 8 & 1 ? 1 : -1) * (88.0f + (float)(r >> 16 & 0xffff) / 2048.0f); /* |x| in [88, 120) */
    case 2: return (r >> 8 & 1) ? INFINITY : -INFINITY;
    case 3: return NAN;
    case 4: return -103.5f; /* between glibc's two underflow thresholds */
    default: return test_rand_f32(seed) * (float)(1 << (r >> 8 & 7)); /* the usual range, |x| < 128 */
    }
}

static void check_swiglu(int64_t n, uint64_t seed, const char *what)
{
    float *g = calloc((size_t)n, sizeof(float)), *want = calloc((size_t)n, sizeof(float));
    float *u = calloc((size_t)n, sizeof(float));
    assert_non_null(g);
    assert_non_null(want);
    assert_non_null(u);
    for (int64_t i = 0; i < n; i++) {
        g[i] = any_value(&seed);
        u[i] = test_rand_f32(&seed) * 4.0f;
        want[i] = g[i] / (1.0f + kernel_expf(-g[i])) * u[i];
    }
    kernel_swiglu(g, u, n);
    for (int64_t i = 0; i < n; i++)
        if (bits_f32(g[i]) != bits_f32(want[i]))
            fail_msg("%s: kernel_swiglu n %lld, element %lld: %a, the scalar loop %a", what, (long long)n, (long long)i,
                     (double)g[i], (double)want[i]);
    free(g), free(u), free(want);
}

static void test_swiglu_simd_is_scalar(void **state)
{
    (void)state;
    if (!kernel_cpu_has_avx2())
        print_message("[  NOTE    ] no AVX2 on this CPU: only the scalar path runs\n");
    for (int64_t n = 1; n <= 40; n++) /* every split into 16-lane, 8-lane and scalar parts */
        for (uint64_t s = 0; s < 8; s++)
            check_swiglu(n, 1000 * (uint64_t)n + s, "SIMD");
    check_swiglu(8192 + 13, 7, "SIMD");
    setenv("WAFER_NO_SIMD", "1", 1);
    check_swiglu(8192 + 13, 7, "WAFER_NO_SIMD");
    assert_int_equal(kernel_swiglu_avx2(NULL, NULL, 64), 0);
    unsetenv("WAFER_NO_SIMD");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_is_libm),
        cmocka_unit_test(test_swiglu_simd_is_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
