/*
 * simd_fold: the one horizontal fold of 8 float lanes that every x86 SIMD kernel ends a dot product with.
 * The kernels promise results bit-identical to kernel_ops vec_dot on AVX2 (gemv.h), and the order of this
 * fold is part of that promise: (lane l + lane l+4), then (0+2, 1+3), then the two. One definition keeps the
 * AVX2 and AVX-512 files from drifting apart. Beside it, the other small helpers those files share (the
 * K-quants' horizontal integer sums, 8 blocks' F16 scales as floats).
 *
 * And SIMD_KEEP, which stops GCC from regrouping a tile's integer adds.
 *
 * Declared with its own AVX target so it can be included by files built with -mavx2 or with a wider target
 * pragma (it inlines into any caller whose target includes AVX). Include only from SIMD kernel files that
 * are called after a CPU check.
 */
#ifndef WAFER_ENGINE_SIMD_FOLD_H
#define WAFER_ENGINE_SIMD_FOLD_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* SIMD_KEEP(v): v (a vector variable) must exist in a register here. GCC's reassociation pass regroups a
 * chain of integer vector adds (p = p + t0; p = p + t1; ...) into a tree over all the products at once, and in a
 * tile of several columns that keeps dozens of products live: gemv_avx2.c's Q4_0 R16 tile of 6 columns spilled
 * 57 registers per block to the stack, and its loads and stores, not its multiplies, bound it. An empty asm
 * that takes and returns v after each add pins the chain in the order written (integer adds are exact, so
 * only the speed changes): one core of a Zen 5, thread CPU time, that tile went from 79 to 118 GMAC/s, Q8_0's
 * from 66 to 84. */
#define SIMD_KEEP(v) __asm__("" : "+v"(v))

static inline __attribute__((always_inline, target("avx"))) float simd_fold8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* simd_fold8 of 8 vectors at once, for the AVX-512 gemm tiles whose folds of 24 or 32 accumulators one by
 * one (8 dependent instructions each) were a tenth of the tile's time: x[u] = [v_2u | v_2u+1] (8 lanes
 * each); returns [simd_fold8(v_0), ..., simd_fold8(v_7)]. Each add is one of simd_fold8's on the same
 * operands (addition commutes exactly), in its order:
 *   y   = lanes l + l+4      128-bit chunk k of y[0] = vector k, of y[1] = vector 4 + k: a0 a1 a2 a3
 *   h   = a0 + a2, a1 + a3   chunk k: [vector k: 2 lanes | vector 4 + k: 2 lanes]
 *   f   = h0 + h1            chunk k: [fold k, fold 4 + k, the same again] */
static inline __attribute__((always_inline, target("avx512f"))) __m256 simd_fold8x8(const __m512 x[4])
{
    __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 h = _mm512_add_ps(_mm512_shuffle_ps(y0, y1, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(h, h, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(h, h, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_castps512_ps256(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), f));
}

/* The sums of the 8 int32 lanes of a, b, c and d, as [sum a, sum b, sum c, sum d]: the K-quants' block sums
 * (kernels.c) from 8 partial lanes, four (row, column) pairs or terms at a time. Integer adds are exact, so
 * the order is free. */
static inline __attribute__((always_inline, target("avx2"))) __m128i simd_hsum4_epi32(__m256i a, __m256i b,
                                                                                     __m256i c, __m256i d)
{
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d)); /* [a0-3 b0-3 c0-3 d0-3 | 4-7] */
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* The 8 F16 values at p, p + stride, ..., p + 7 * stride as floats: the scales of 8 consecutive blocks of a
 * quantized row (stride = the block's bytes), for kernels that multiply 8 blocks' scales at once. */
static inline __attribute__((always_inline, target("avx2,f16c"))) __m256 simd_f16x8_strided(const uint8_t *p,
                                                                                           size_t stride)
{
    uint16_t h[8];
    for (int k = 0; k < 8; k++)
        memcpy(&h[k], p + (size_t)k * stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

#endif
