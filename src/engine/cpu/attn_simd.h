/*
 * attn_simd: the fold of 8 scores' chain vectors that the AVX2 and AVX-512 attention kernels share (attn.h
 * fixes the order; one definition keeps the two files from drifting apart). Declared with its own AVX2 target
 * so it inlines into callers built with -mavx2 or with a wider target pragma; include only from SIMD kernel
 * files that are called after a CPU check.
 */
#ifndef WAFER_ENGINE_ATTN_SIMD_H
#define WAFER_ENGINE_ATTN_SIMD_H

#include <immintrin.h>

/* The 8 scores of 8 folded chain vectors v[u] (aa_fold's first three adds done): lanes folded l + l+4, then
 * (0+1) + (2+3), as the one-score fold does, with 3 hadds for all 8 instead of 2 per score; times scale, in u
 * order. */
static inline __attribute__((always_inline, target("avx2"))) __m256 attn_simd_fold8(const __m256 v[8], __m256 scale)
{
    __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20), _mm256_permute2f128_ps(v[0], v[1], 0x31));
    __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20), _mm256_permute2f128_ps(v[2], v[3], 0x31));
    __m256 s45 = _mm256_add_ps(_mm256_permute2f128_ps(v[4], v[5], 0x20), _mm256_permute2f128_ps(v[4], v[5], 0x31));
    __m256 s67 = _mm256_add_ps(_mm256_permute2f128_ps(v[6], v[7], 0x20), _mm256_permute2f128_ps(v[6], v[7], 0x31));
    /* h: [v0 v2 v4 v6 | v1 v3 v5 v7], each (t0 + t1) + (t2 + t3) */
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s01, s23), _mm256_hadd_ps(s45, s67));
    h = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return _mm256_mul_ps(h, scale);
}

#endif
