/*
 * simd_fold: the one horizontal fold of 8 float lanes that every x86 SIMD kernel ends a dot product with.
 * The kernels promise results bit-identical to kernel_ops vec_dot on AVX2 (gemv.h), and the order of this
 * fold is part of that promise: (lane l + lane l+4), then (0+2, 1+3), then the two. One definition keeps the
 * AVX2, AVX-VNNI and AVX-512 files from drifting apart.
 *
 * Declared with its own AVX target so it can be included by files built with -mavx2 or with a wider target
 * pragma (it inlines into any caller whose target includes AVX). Include only from SIMD kernel files that
 * are called after a CPU check.
 */
#ifndef WAFER_ENGINE_SIMD_FOLD_H
#define WAFER_ENGINE_SIMD_FOLD_H

#include <immintrin.h>

static inline __attribute__((always_inline, target("avx"))) float simd_fold8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

#endif
