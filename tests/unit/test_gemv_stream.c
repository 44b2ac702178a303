/*
 * gemv_stream tests (`wafer bench --stream`): on small shapes, every weight type with a decode kernel here
 * runs, one column (the gemv) and 8 (the batched gemm), reads the bytes its matrices hold, in the layout the
 * engine would give them, and reports sane figures, from memory and from cache; a type without a kernel, bad
 * shapes and a bad batch are refused with a message.
 */
#include "testutil.h"

#include "bench/gemv_stream.h"
#include "core/err.h"
#include "engine/cpu/gemv.h"
#include "engine/gguf/quant.h"

#include <math.h>
#include <string.h>

static void stream_small(enum dtype t, struct gemv_stream_opts *o)
{
    gemv_stream_opts_default(o, t);
    o->dim = 256;
    o->ffn = 512;
    o->kv_dim = 256;
    o->layers = 2;
    o->passes = 3;
    o->n_threads = 2;
}

static void test_every_type(void **state)
{
    (void)state;
    const enum dtype types[] = {DTYPE_F16, DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_K, DTYPE_Q6_K};
    int ran = 0;
    for (size_t k = 0; k < 2 * sizeof types / sizeof types[0]; k++) {
        size_t i = k / 2;
        int batch = k % 2 ? 8 : 1;
        const struct gemv_ops *g = gemv_ops_best(types[i]);
        if (!g)
            continue; /* no AVX2 here, or WAFER_NO_SIMD */
        struct gemv_stream_opts o;
        struct gemv_stream_result r;
        char err[ERR_MSG_MAX] = "";
        stream_small(types[i], &o);
        o.batch = batch;
        assert_int_equal(gemv_stream_run(&o, &r, err), 0);
        /* q, k, v, o (256 rows of 256), gate and up (512 of 256), down (256 of 512), twice */
        size_t want = 2 * ((size_t)(4 * 256 + 2 * 512) * dtype_row_bytes(types[i], 256) +
                           256 * dtype_row_bytes(types[i], 512));
        assert_int_equal(r.bytes, want);
        assert_int_equal(r.passes, 3);
        assert_int_equal(r.threads, 2);
        assert_string_equal(r.layout, g->gemv16 && quant_r16_supported(types[i]) ? "R16" : "rows");
        assert_true(r.read_gbs > 0 && r.kernel_gbs > 0);
        /* multiply-adds per weight: one per column */
        double elems = 2.0 * (4 * 256 * 256 + 2 * 512 * 256 + 256 * 512);
        assert_true(fabs(r.kernel_gmacs / r.kernel_gbs - elems * batch / (double)r.bytes) < 1e-6 * r.kernel_gmacs);
        assert_true(r.share_lo > 0 && r.share_lo <= r.share && r.share <= r.share_hi);
        /* the from-cache passes do the same arithmetic over the same row counts, counted as their calls ran */
        assert_true(r.macs == elems * batch);
        assert_true(r.cache_macs == r.macs);
        assert_true(r.cache_kib >= 64 && r.cache_kib <= 512);
        assert_true(r.cache_gbs > 0 && r.cache_gmacs > 0);
        assert_true(fabs(r.cache_gmacs / r.cache_gbs - elems * batch / (double)r.bytes) < 1e-6 * r.cache_gmacs);
        ran++;
    }
    if (!ran)
        skip();
}

static void test_refusals(void **state)
{
    (void)state;
    struct gemv_stream_opts o;
    struct gemv_stream_result r;
    char err[ERR_MSG_MAX] = "";
    stream_small(DTYPE_Q5_0, &o); /* no decode kernel anywhere */
    assert_int_equal(gemv_stream_run(&o, &r, err), ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "no decode kernel for q5_0"));
    if (!gemv_ops_best(DTYPE_Q4_0))
        skip();
    stream_small(DTYPE_Q4_0, &o);
    o.dim = 100;
    assert_int_equal(gemv_stream_run(&o, &r, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "dim 100"));
    stream_small(DTYPE_Q4_0, &o);
    o.layers = 0;
    assert_int_equal(gemv_stream_run(&o, &r, err), ERR_INVALID_ARG);
    stream_small(DTYPE_Q4_0, &o);
    o.batch = 65;
    assert_int_equal(gemv_stream_run(&o, &r, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "--batch takes 1-64 columns (got 65)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
