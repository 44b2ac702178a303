/* Tests for the dtype table and the half/bfloat16 conversions (checked exhaustively against a plain
 * reference built from frexp/ldexp). */
#include "testutil.h"

#include "engine/dtype.h"
#include "core/err.h"

#include <math.h>
#include <string.h>

static void test_names_and_geometry(void **state)
{
    (void)state;
    enum dtype t;
    assert_int_equal(dtype_from_name("Q4_K", &t), 0);
    assert_int_equal(t, DTYPE_Q4_K);
    assert_int_equal(dtype_from_name("bf16", &t), 0);
    assert_int_equal(t, DTYPE_BF16);
    assert_int_equal(dtype_from_name("q4_k_m", &t), ERR_INVALID_ARG);
    assert_int_equal(dtype_row_bytes(DTYPE_Q4_0, 64), 36);
    assert_int_equal(dtype_row_bytes(DTYPE_Q6_K, 512), 420);
    assert_int_equal(dtype_row_bytes(DTYPE_F16, 10), 20);
    assert_true(dtype_is_supported(DTYPE_Q6_K));
    assert_false(dtype_is_supported(DTYPE_Q5_K));
    assert_false(dtype_is_known(4));
    assert_false(dtype_is_known(1000));
}

/* Reference half -> float through the definition. */
static double half_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_fp16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        double r = half_ref((uint16_t)h);
        if (isnan(r)) {
            assert_true(isnan(f));
            continue;
        }
        assert_true((double)f == r);
        assert_int_equal(f32_to_fp16(f), h);
    }
    /* rounding: halfway between 1 and 1+2^-10 rounds to even (1) */
    assert_int_equal(f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(f32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(f32_to_fp16(70000.0f), 0x7c00);
    assert_int_equal(f32_to_fp16(-1e-9f), 0x8000);
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
    /* 1 + 2^-8 is halfway: ties to even -> 1.0 */
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_geometry),
        cmocka_unit_test(test_fp16_roundtrip_exhaustive),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
