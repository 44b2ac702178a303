/*
 * gemm_float_tile: the one register tile of float weights (F32, F16, BF16) for the 256-bit kernels: vec_dot and
 * the gemm of kernels_avx2.c (F32 activations) and the F16 gemm of gemv_avx2.c (activations kept as F16 in
 * aux: exact, they are F16 values), included by both (each compiled with -mavx2 -mfma -mf16c).
 *
 * Numerics: vec_dot's sums are 2 chains of 8 lanes (2 accumulators per (row, column), as ggml's AVX2 F16 dot):
 * chain k sums elements 16m + 8k .. 16m + 8k + 7 over the full 16-element steps in order, chain 0 then takes
 * the last 8-element step and the zero-padded tail, and the end is chain 0 + chain 1, folded (simd_fold8).
 * The chains never meet before the end, so the tile runs chain 1 over the row (or a block of it, kbl), then
 * chain 0, the other chain's sums kept aside: with one chain live it holds NR x NC accumulators and either the
 * NC activation vectors of a step (NR > NC: a weight vector at a time) or its NR weight vectors (an activation
 * vector at a time), NR + NC loads per NR x NC FMAs
 * (both chains side by side, every FMA loaded its activation: NR x (NC + 1)). Every (row, column) pair gets
 * the same operations in the same order whatever the tile's shape, so gemm equals vec_dot (the 1 x 1 tile) bit
 * for bit. The 1 x 1 tile reads its row twice, the second time from cache.
 */
#ifndef WAFER_ENGINE_GEMM_FLOAT_TILE_H
#define WAFER_ENGINE_GEMM_FLOAT_TILE_H

#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define GFT_INLINE static inline __attribute__((always_inline))
#define GFT_MAXR 6 /* the largest tile: rows x columns */
#define GFT_MAXC 4

enum { GFT_F32, GFT_F16, GFT_BF16 };

/* 8 values of format kind at p as floats (exact) */
GFT_INLINE __m256 gft_load8(int kind, const void *p)
{
    if (kind == GFT_F32)
        return _mm256_loadu_ps(p);
    __m128i h = _mm_loadu_si128(p);
    if (kind == GFT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* dst[0..n) = the n values of format kind at src as floats (exact); the last n % 8 through a zero-padded copy. */
GFT_INLINE void gft_to_f32(int kind, const void *src, float *dst, int64_t n)
{
    const size_t e = kind == GFT_F32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, gft_load8(kind, (const uint8_t *)src + (size_t)i * e));
    if (i < n) {
        uint8_t t[32] = {0};
        float f[8];
        memcpy(t, (const uint8_t *)src + (size_t)i * e, (size_t)(n - i) * e);
        _mm256_storeu_ps(f, gft_load8(kind, t));
        memcpy(dst + i, f, (size_t)(n - i) * sizeof(float));
    }
}

/* s[c * lds + r] = vec_dot(w row r, x row c) for r < NR, c < NC (constants after inlining, at most GFT_MAXR x
 * GFT_MAXC): weights of format wk ldw bytes apart, activations of format xk ldx bytes apart, n elements each.
 * kbl > 0 (a multiple of 16): the rows in blocks of kbl elements, chain 1 then chain 0 over each (each chain's
 * operations stay in its order: the same bits), so chain 0 finds in L1 the lines chain 1 brought, where over
 * whole rows (kbl 0) a tile of 3 F16 rows and 4 F16 activations at n 2048 (28 KiB) is read twice from L2 once
 * L1 cannot hold it (a Zen 3's 32 KiB, shared with its SMT sibling). One core of the AMD EPYC family 25 model 1,
 * 3 x 4 tiles of F16 rows and activations, 16 tiles at n 2048 / 4 at n 8192, GMAC/s: whole rows 28.0-29.1 /
 * 27.6-28.7, kbl 256 39.9-41.6 / 42.1-42.4, 512 43.6 / 44.7-45.4, 1024 44.8-45.1 / 44.9-45.6 (stop 51).
 * pf > 0: chain 1's passes prefetch each weight row pf bytes ahead (into L1).
 * nx: NULL, or memory (the tile's share of the rows the caller reads next, see gv_gemm_f16) that the passes ask
 * for into L2, one line every nx_mask + 1 steps of 16 elements (nx_mask + 1 a power of two), each pass from
 * where the one before stopped, none at or past nx_end. */
GFT_INLINE void gemm_float_tile(int wk, int xk, int pf, int64_t kbl, int64_t n, const int NR, const int NC, float *s,
                                size_t lds, const uint8_t *w, size_t ldw, const uint8_t *x, size_t ldx,
                                const uint8_t *nx, const uint8_t *nx_end, int64_t nx_mask)
{
    const size_t we = wk == GFT_F32 ? 4 : 2, xe = xk == GFT_F32 ? 4 : 2;
    const int64_t nfull = n / 16 * 16, bl = kbl > 0 ? kbl : nfull;
    __m256 acc[GFT_MAXR][GFT_MAXC], ch0[GFT_MAXR][GFT_MAXC], ch1[GFT_MAXR][GFT_MAXC];
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            ch0[r][c] = ch1[r][c] = _mm256_setzero_ps();
    for (int64_t kb = 0; kb < nfull; kb += bl) {
        const int64_t e = nfull - kb < bl ? nfull : kb + bl;
#pragma GCC unroll 2
        for (int k = 1; k >= 0; k--) { /* chain 1 first: chain 0 then ends with the row's tail */
#pragma GCC unroll 6
            for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++)
                    acc[r][c] = k ? ch1[r][c] : ch0[r][c];
            for (int64_t i = kb + 8 * k; i < e; i += 16) {
                if (nx && !((i >> 4) & nx_mask) && nx < nx_end) {
                    _mm_prefetch((const char *)nx, _MM_HINT_T1);
                    nx += 64;
                }
                if (NR > NC) {
                    __m256 xv[GFT_MAXC];
#pragma GCC unroll 4
                    for (int c = 0; c < NC; c++)
                        xv[c] = gft_load8(xk, x + (size_t)c * ldx + (size_t)i * xe);
#pragma GCC unroll 6
                    for (int r = 0; r < NR; r++) {
                        const uint8_t *wr = w + (size_t)r * ldw + (size_t)i * we;
                        if (pf && k == 1)
                            _mm_prefetch((const char *)wr + pf, _MM_HINT_T0);
                        __m256 wv = gft_load8(wk, wr);
#pragma GCC unroll 4
                        for (int c = 0; c < NC; c++)
                            acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
                    }
                } else {
                    __m256 wv[GFT_MAXR];
#pragma GCC unroll 6
                    for (int r = 0; r < NR; r++) {
                        const uint8_t *wr = w + (size_t)r * ldw + (size_t)i * we;
                        if (pf && k == 1)
                            _mm_prefetch((const char *)wr + pf, _MM_HINT_T0);
                        wv[r] = gft_load8(wk, wr);
                    }
#pragma GCC unroll 4
                    for (int c = 0; c < NC; c++) {
                        __m256 xv = gft_load8(xk, x + (size_t)c * ldx + (size_t)i * xe);
#pragma GCC unroll 6
                        for (int r = 0; r < NR; r++)
                            acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
                    }
                }
            }
#pragma GCC unroll 6
            for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++) {
                    if (k)
                        ch1[r][c] = acc[r][c];
                    else
                        ch0[r][c] = acc[r][c];
                }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            acc[r][c] = ch0[r][c];
    /* chain 0's end: an 8-element step, then the tail, from zero-padded copies (the padding adds exact zeros) */
    for (int64_t i = nfull; i < n; i += 8) {
        size_t rem = n - i < 8 ? (size_t)(n - i) : 8;
        __m256 xv[GFT_MAXC];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            uint8_t xt[32] = {0};
            memcpy(xt, x + (size_t)c * ldx + (size_t)i * xe, rem * xe);
            xv[c] = gft_load8(xk, xt);
        }
#pragma GCC unroll 6
        for (int r = 0; r < NR; r++) {
            uint8_t wt[32] = {0};
            memcpy(wt, w + (size_t)r * ldw + (size_t)i * we, rem * we);
            __m256 wv = gft_load8(wk, wt);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            s[(size_t)c * lds + r] = simd_fold8(_mm256_add_ps(acc[r][c], ch1[r][c]));
}

#endif
