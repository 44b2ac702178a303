/*
 * gemv_avx512q: AVX-512 kernels for Q4_0 and Q8_0 weights x Q8_0 activations (see gemv.h): decode gemv and
 * prefill / batched-decode gemm, bit-identical to kernel_ops vec_dot on AVX2. Compiled for AVX-512 by the
 * target pragma below and handed out only when gemv_cpu_has_avx512() says the CPU has it (with VNNI).
 *
 * Numerics are those of gemv_vnni.c (read its header): per 32-element block 8 exact int32 lanes from vpdpbusd
 * on unsigned weights (Q8_0: w ^ 0x80; Q4_0: the nibble, high nibbles left x16) started at the activation's
 * precomputed -8 / -128 * sum4(x), then acc = fma(d_w * d_x, float(lanes), acc) per block in block order,
 * Q4_0 lanes 4-7 scaled back by an exact 1/16, then vec_dot's fold.
 *
 * 512-bit registers without changing any of that: one zmm holds the 8-lane accumulators of TWO weight rows
 * (A, B) for one activation row, interleaved by dword: zmm lane 2l = row A lane l, lane 2l + 1 = row B lane l.
 * With that layout
 *   - the weights of a row pair become one zmm with one two-source dword permute (+ the AND / XOR);
 *   - the activation block must be each dword repeated twice, and its -8/-128 sum4 start values too: prep
 *     stores them once (32 bytes each) and the tile repeats the dwords with one permute per (column, block),
 *     shared by the tile's row pairs. Storing them repeated (twice the bytes) made the tile wait on the aux
 *     stream from L2: the permutes measured 1.15-1.35x faster (Zen 5, one thread, n 2048-8192);
 *   - the per-block scales [s(A), s(B), s(A), s(B), ...] are one 64-bit broadcast load from a small table
 *     built per 8 blocks (one multiply of 16 weight scales, picked out of the rows interleaved by word
 *     permutes, by the doubled activation scales prep stored);
 *   - the lanes become floats without vcvtdq2ps (measured ~8% faster in the gemm), and without a start value
 *     per lane: vpdpbusd starts every lane at the bits of M = 1.5 * 2^23, so the exact sum p of the unsigned
 *     products comes out as the float M + p (exact for |p| < 2^22; here |p| <= 4 x 255 x 128), and one
 *     subtraction of the float M - c, prep's per-lane correction c (-8 / -128 * sum4(x), see aq_prep)
 *     folded in, gives float(p + c), the lane v, exactly (both operands are integers near M; Sterbenz);
 * so a (row pair, column, block) costs vpdpbusd + vsubps + vfmadd and nothing else, which bounds the gemm:
 * measured about 1.7x the AVX-VNNI (256-bit) gemm per core. The fold de-interleaves each zmm into the two rows'
 * 8 lanes and folds them exactly as gn_hsum does.
 *
 * aux of an activation row (n elements, nb = n / 32 blocks, nb8 = nb rounded up to 8):
 *   float dx2[2 * nb8]: the activation scale of block b at 2b and 2b + 1 (zero past nb)
 *   then the Q4_0 part, per block 64 bytes: int8 xq[32] (the quants), float mq4[8] (M + 8 * sum4(x) for lanes
 *   0-3, M + 128 * sum4(x) for lanes 4-7), then the Q8_0 part, per block 64 bytes: int8 xq[32], float m128[8]
 *   (M + 128 * sum4(x)): the subtrahends M - c above. Each kernel reads one dense stream, every
 *   byte of every line it touches (the quants are stored twice for that). 4x the activation row's own size,
 *   which the gemm's column blocks account for (the kernels read only aux, never the activation row itself).
 *
 * gemm: tiles of AQ_RP row pairs x up to AQ_C columns held in registers (each weight pair unpacked once per
 * block serves AQ_C columns; each aux load serves AQ_RP pairs: more rows per tile measured faster than more
 * columns, the aux stream from L2 being the other limit), columns blocked so a block's aux stays in L2 while
 * all rows pass over it, the next row tile's weights prefetched into L2 during a row tile's last column tile
 * (they come from memory otherwise: -12%). A row tile with 4 or more column tiles unpacks its weights once into
 * an L1 buffer they all read (aq_cols). An odd last row runs as a pair with itself. gemv is the same tile
 * with one column, plus a prefetch along the rows.
 *
 * gemv16 / gemm16 read the weights in quant.h's R16 layout instead (see "the R16 layout" below): no permutes,
 * one stream of weights, the same numerics and the same aux.
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#include "engine/cpu/gemv.h"

#include "engine/gguf/quant.h"

#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define AQ_INLINE static inline __attribute__((always_inline))
#define AQ_BLK 64 /* aux bytes per block in each part (Q4_0, Q8_0): xq, then the start values */
/* gemv prefetch distance along the stream of rows, in bytes, into L2 (as gemv_vnni.c) */
#define AQ_PF (24 << 10)
/* gemv16 prefetch distances along the stream of groups, into L2. A decode gemv computes between its loads, so
 * without prefetches one core keeps too few lines in flight; how far ahead matters most when the machine's
 * bandwidth is high. Zen 5 VM, stop 16: 1B decode, 2 threads, 16 tokens at a time between two passes of the
 * bandwidth probe, distances alternated for 60-100 rounds (a program linking libwafer.a), decode GB/s over the
 * probes' mean, medians: Q4_0 none 0.83, 4 KiB 0.87-0.94, 8 KiB 0.92-0.94; in the rounds whose probe read
 * over 50 GB/s 4 KiB 0.83, 8 KiB 0.91-0.96, 12 KiB 0.91. Q8_0 none 0.86-0.87, 4 KiB 0.93-0.94, 8 KiB 0.92,
 * 16 KiB 0.91 (earlier single comparisons, stops 12-14, had measured Q8_0 no better with one). */
#ifndef AQ16_PF_Q4
#define AQ16_PF_Q4 (8 << 10)
#endif
#ifndef AQ16_PF_Q8
#define AQ16_PF_Q8 (4 << 10)
#endif
#define AQ_RP 4 /* gemm tile: row pairs */
#define AQ_C 4  /* gemm tile: columns */
/* bytes of a row tile's unpacked weights kept for all its column tiles (see aq_cols): L1 holds them beside
 * the column tile's aux (4 columns x 4.3 KiB at n 2048) */
#define AQ_WU_MAX (16u << 10)
#define AQ_GV_RP 2 /* gemv tile: row pairs (4 rows; 8 rows were 20% slower in 2-thread decode, 2 rows slower hot) */
#define AQ_PMAX 4 /* bounds of the tile arrays (RP, NC) */
#define AQ_CMAX 8
/* M = 1.5 * 2^23 and its bits: lanes are converted to float by starting them at these bits (see aq_lanes_f32) */
#define AQ_MAGIC 12582912.0f
#define AQ_MAGIC_BITS 0x4B400000

static size_t aq_nb8(int64_t nb) { return (size_t)((nb + 7) & ~(int64_t)7); }

static size_t aq_aux_bytes(int64_t n) { return aq_nb8(n / QK8_0) * 2 * sizeof(float) + (size_t)(n / QK8_0) * 2 * AQ_BLK; }

static void aq_prep(int64_t n, const void *x, void *aux)
{
    const struct block_q8_0 *bx = x;
    int64_t nb = n / QK8_0;
    size_t nb8 = aq_nb8(nb);
    float *dx2 = aux;
    uint8_t *blk = (uint8_t *)aux + nb8 * 2 * sizeof(float);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256 magic = _mm256_set1_ps(AQ_MAGIC);
    for (int64_t b = 0; b < nb; b++) {
        dx2[2 * b] = dx2[2 * b + 1] = _cvtsh_ss(bx[b].d);
        __m256i xq = _mm256_loadu_si256((const __m256i *)bx[b].qs);
        __m256i s4 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones8, xq);
        __m256i m128 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 7));
        __m256i m8 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 3));
        /* M - c: integers below 2^24, exact in float */
        __m256i mq4 = _mm256_castps_si256(_mm256_sub_ps(magic, _mm256_cvtepi32_ps(_mm256_blend_epi32(m8, m128, 0xF0))));
        m128 = _mm256_castps_si256(_mm256_sub_ps(magic, _mm256_cvtepi32_ps(m128)));
        uint8_t *o4 = blk + (size_t)b * AQ_BLK, *o8 = blk + (size_t)(nb + b) * AQ_BLK;
        _mm256_storeu_si256((__m256i *)o4, xq);
        _mm256_storeu_si256((__m256i *)(o4 + 32), mq4);
        _mm256_storeu_si256((__m256i *)o8, xq);
        _mm256_storeu_si256((__m256i *)(o8 + 32), m128);
    }
    for (size_t b = (size_t)nb; b < nb8; b++)
        dx2[2 * b] = dx2[2 * b + 1] = 0;
}

/* 8 dwords at p, each repeated twice (the row-pair interleave, see the top). */
AQ_INLINE __m512i aq_dup(const uint8_t *p)
{
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)));
}

/* The lanes v = p + c as floats, exactly as vcvtdq2ps would give them (see the top): q holds the sums p of
 * the unsigned products started at the bits of M, which read as the float M + p; mc holds M - c. */
AQ_INLINE __m512 aq_lanes_f32(__m512i q, __m512 mc) { return _mm512_sub_ps(_mm512_castsi512_ps(q), mc); }

/* dpbusd of u and x started at the bits of M (see aq_lanes_f32). */
AQ_INLINE __m512i aq_dot(__m512i u, __m512i x) { return _mm512_dpbusd_epi32(_mm512_set1_epi32(AQ_MAGIC_BITS), u, x); }

/* Block k of rows A (at a) and B (at a + dab) as unsigned bytes, dword-interleaved (see the top). */
AQ_INLINE __m512i aq_unsigned(int is_q4, const uint8_t *a, ptrdiff_t dab)
{
    if (is_q4) { /* per row: low nibbles in lanes 0-3, high nibbles x16 in lanes 4-7 */
        const __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 0, 16, 1, 17, 2, 18, 3, 19);
        __m512i z = _mm512_permutex2var_epi32(_mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(a + 2))), idx,
                                              _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(a + dab + 2))));
        const __m512i mask = _mm512_setr_epi32(0x0f0f0f0f, 0x0f0f0f0f, 0x0f0f0f0f, 0x0f0f0f0f, 0x0f0f0f0f, 0x0f0f0f0f,
                                               0x0f0f0f0f, 0x0f0f0f0f, (int)0xf0f0f0f0u, (int)0xf0f0f0f0u, (int)0xf0f0f0f0u,
                                               (int)0xf0f0f0f0u, (int)0xf0f0f0f0u, (int)0xf0f0f0f0u, (int)0xf0f0f0f0u,
                                               (int)0xf0f0f0f0u);
        return _mm512_and_si512(z, mask);
    }
    const __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    __m512i z = _mm512_permutex2var_epi32(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + 2))), idx,
                                          _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + dab + 2))));
    return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
}

/* The F16 scales (each block's first 2 bytes) of the nk blocks at p, one every bb bytes, all starting in the 128
 * bytes at p, as words 2 (k0 + k) + odd of the low 256 bits (k < nk); the other words are don't-care. */
AQ_INLINE __m512i aq_scale_words(const uint8_t *p, size_t bb, int nk, int k0, int odd)
{
    uint16_t t[32] = {0};
    for (int k = 0; k < nk; k++)
        t[2 * (k0 + k) + odd] = (uint16_t)(k * (int)bb / 2);
    return _mm512_permutex2var_epi16(_mm512_loadu_si512(p), _mm512_loadu_si512(t), _mm512_loadu_si512(p + 64));
}

/* The F16 scales of 8 consecutive blocks of rows A and B (A's at a, a + bb, ...; B's dab further), as floats
 * interleaved [A0, B0, A1, B1, ...], picked out of the rows' own bytes with word permutes (the gather this
 * replaced was a third of the decode gemv's time on Zen 5). Reads only bytes of the 8 blocks: Q4_0's 8 block
 * starts lie in its first 128 bytes, Q8_0's in two runs of 128 (blocks 0-3 and 4-7). */
AQ_INLINE __m512 aq_scales16(const uint8_t *a, ptrdiff_t dab, size_t bb)
{
    const __mmask32 odd = 0xAAAAAAAAu;
    __m512i w;
    if (7 * bb + 2 <= 128) {
        w = _mm512_mask_blend_epi16(odd, aq_scale_words(a, bb, 8, 0, 0), aq_scale_words(a + dab, bb, 8, 0, 1));
    } else {
        __m512i lo = _mm512_mask_blend_epi16(odd, aq_scale_words(a, bb, 4, 0, 0), aq_scale_words(a + dab, bb, 4, 0, 1));
        __m512i hi = _mm512_mask_blend_epi16(odd, aq_scale_words(a + 4 * bb, bb, 4, 4, 0),
                                             aq_scale_words(a + dab + 4 * bb, bb, 4, 4, 1));
        w = _mm512_mask_blend_epi16(0xFFFFFF00u, lo, hi);
    }
    return _mm512_cvtph_ps(_mm512_castsi512_si256(w));
}

/* The two rows' results of an interleaved accumulator: *ya = row A, *yb = row B. */
AQ_INLINE void aq_fold(int is_q4, __m512 v, float *ya, float *yb)
{
    if (is_q4) /* lanes 4-7 of both rows (zmm lanes 8-15) hold 16 x the value */
        v = _mm512_mul_ps(v, _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, 0.0625f, 0.0625f, 0.0625f, 0.0625f, 0.0625f, 0.0625f,
                                            0.0625f, 0.0625f));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m512 d = _mm512_permutexvar_ps(even, v);
    *ya = simd_fold8(_mm512_castps512_ps256(d));
    *yb = simd_fold8(_mm512_extractf32x8_ps(d, 1));
}

/* RP row pairs x NC columns. Pair p: rows w + 2p ldw (A) and A + dab (B; dab = ldw, or 0 for a single row).
 * Results: s[c * lds + 2p] (A), s[c * lds + 2p + 1] (B, unless dab = 0). pf: prefetch along the rows (gemv).
 * dws: the pairs' weight scales as aq_cols makes them, or NULL; wu: the pairs' blocks as aq_unsigned makes
 * them (64 bytes for block b, pair p at wu + (b RP + p) 64), or NULL. */
AQ_INLINE void aq_tile(int is_q4, int64_t nb, const int RP, const int NC, float *s, size_t lds, const uint8_t *w,
                       size_t ldw, ptrdiff_t dab, const uint8_t *aux, size_t ldaux, int pf, const uint8_t *nxt,
                       const float *dws, const uint8_t *wu)
{
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    /* this weight type's part of aux (see the top) */
    const size_t boff = aq_nb8(nb) * 2 * sizeof(float) + (is_q4 ? 0 : (size_t)nb * AQ_BLK);
    __m512 acc[AQ_PMAX][AQ_CMAX];
    double tab[AQ_PMAX][AQ_CMAX][8] __attribute__((aligned(64)));
#pragma GCC unroll 8
    for (int p = 0; p < RP; p++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[p][c] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        if (pf)
            for (size_t i = 0; i < 8 * 2 * (size_t)RP * bb; i += 64)
                _mm_prefetch((const char *)w + AQ_PF + (size_t)b * 2 * RP * bb + i, _MM_HINT_T1);
        if (nxt) /* the next row tile's weights (2 RP rows), as far along as this tile is */
#pragma GCC unroll 8
            for (int r = 0; r < 2 * RP; r++)
                for (size_t i = 0; i <= 8 * bb; i += 64)
                    _mm_prefetch((const char *)nxt + (size_t)r * ldw + (size_t)b * bb + i, _MM_HINT_T1);
        __m512 dw[AQ_PMAX];
#pragma GCC unroll 8
        for (int p = 0; p < RP; p++)
            dw[p] = dws ? _mm512_load_ps(dws + ((size_t)(b / 8) * RP + (size_t)p) * 16)
                        : aq_scales16(w + (size_t)(2 * p) * ldw + (size_t)b * bb, dab, bb);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m512 d = _mm512_loadu_ps((const float *)(aux + (size_t)c * ldaux) + 2 * b);
#pragma GCC unroll 8
            for (int p = 0; p < RP; p++)
                _mm512_store_pd(tab[p][c], _mm512_castps_pd(_mm512_mul_ps(dw[p], d)));
        }
        /* read the table back through memory: the scales are then free broadcast loads, where the compiler,
         * seeing through the stores, would otherwise extract them from registers with shuffles */
        const double(*tb)[AQ_CMAX][8] = tab;
        __asm__ volatile("" : "+r"(tb) : : "memory");
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i u[AQ_PMAX];
#pragma GCC unroll 8
            for (int p = 0; p < RP; p++)
                u[p] = wu ? _mm512_load_si512(wu + ((size_t)(b + k) * RP + (size_t)p) * 64)
                          : aq_unsigned(is_q4, w + (size_t)(2 * p) * ldw + (size_t)(b + k) * bb, dab);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const uint8_t *blk = aux + (size_t)c * ldaux + boff + (size_t)(b + k) * AQ_BLK;
                __m512i xd = aq_dup(blk);
                __m512 m = _mm512_castsi512_ps(aq_dup(blk + 32));
#pragma GCC unroll 8
                for (int p = 0; p < RP; p++) {
                    __m512i q = aq_dot(u[p], xd);
                    acc[p][c] = _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_set1_pd(tb[p][c][k])), aq_lanes_f32(q, m),
                                                acc[p][c]);
                }
            }
        }
    }
    for (; b < nb; b++) {
#pragma GCC unroll 8
        for (int p = 0; p < RP; p++) {
            const uint8_t *a = w + (size_t)(2 * p) * ldw + (size_t)b * bb;
            uint16_t ha, hb;
            memcpy(&ha, a, 2);
            memcpy(&hb, a + dab, 2);
            float fa = _cvtsh_ss(ha), fb = _cvtsh_ss(hb);
            __m512i u = aq_unsigned(is_q4, a, dab);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const uint8_t *blk = aux + (size_t)c * ldaux + boff + (size_t)b * AQ_BLK;
                float dx = ((const float *)(aux + (size_t)c * ldaux))[2 * b];
                __m512 sc = _mm512_mask_blend_ps(0xAAAA, _mm512_set1_ps(fa * dx), _mm512_set1_ps(fb * dx));
                __m512i q = aq_dot(u, aq_dup(blk));
                acc[p][c] = _mm512_fmadd_ps(sc, aq_lanes_f32(q, _mm512_castsi512_ps(aq_dup(blk + 32))), acc[p][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < RP; p++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            float ya, yb;
            aq_fold(is_q4, acc[p][c], &ya, &yb);
            s[(size_t)c * lds + 2 * p] = ya;
            if (dab)
                s[(size_t)c * lds + 2 * p + 1] = yb;
        }
}

/* ---- decode ---- */

#define AQ_GEMV(name, IS_Q4, QK)                                                                             \
    static void aq_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,   \
                               const void *aux)                                                            \
    {                                                                                                      \
        (void)x;                                                                                           \
        const uint8_t *W = w;                                                                              \
        int64_t nb = n / QK, i = 0;                                                                        \
        for (; i + 2 * AQ_GV_RP <= nr; i += 2 * AQ_GV_RP)                                                  \
            aq_tile(IS_Q4, nb, AQ_GV_RP, 1, y + i, 0, W + (size_t)i * ldw, ldw, (ptrdiff_t)ldw, aux, 0, 1, NULL, NULL, NULL);   \
        for (; i + 2 <= nr; i += 2)                                                                        \
            aq_tile(IS_Q4, nb, 1, 1, y + i, 0, W + (size_t)i * ldw, ldw, (ptrdiff_t)ldw, aux, 0, 0, NULL, NULL, NULL);          \
        if (i < nr)                                                                                        \
            aq_tile(IS_Q4, nb, 1, 1, y + i, 0, W + (size_t)i * ldw, ldw, 0, aux, 0, 0, NULL, NULL, NULL);                       \
    }

AQ_GEMV(q4_0, 1, QK4_0)
AQ_GEMV(q8_0, 0, QK8_0)

/* ---- prefill / batched decode ---- */

/* Columns per cache block: a block's aux stays in L2 (2 MiB per core here; half of it) while every row tile
 * passes over it. */
static int aq_col_block(size_t bytes_per_col)
{
    size_t cols = ((size_t)1 << 20) / (bytes_per_col ? bytes_per_col : 1);
    cols -= cols % AQ_C;
    return cols < AQ_C ? AQ_C : cols > (1u << 20) ? 1 << 20 : (int)cols;
}

/* One row tile (RP pairs at w; a single row when dab = 0) against columns j0..j1: tiles of AQ_C columns, then
 * one of the remainder. nxt: the next row tile, prefetched during the last full column tile, or the remainder
 * when there is none (NULL: none). */
AQ_INLINE void aq_cols(int is_q4, int64_t nb, const int RP, int j0, int j1, float *s, size_t lds, const uint8_t *w,
                       size_t ldw, ptrdiff_t dab, const uint8_t *aux, size_t ldaux, const uint8_t *nxt)
{
    /* the weight scales of the row tile as floats, interleaved per pair (as aq_scales16), made once for all
     * its column tiles; past 16 KiB of them each tile picks its own */
    const size_t nws = ((size_t)nb / 8) * (size_t)RP * 16;
    float wsbuf[nws <= (16u << 10) / sizeof(float) ? nws + 16 : 16] __attribute__((aligned(64)));
    const float *dws = NULL;
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    if (nws <= (16u << 10) / sizeof(float) && j1 - j0 > AQ_C) {
        for (int64_t b = 0; b + 8 <= nb; b += 8)
            for (int p = 0; p < RP; p++)
                _mm512_store_ps(wsbuf + ((size_t)(b / 8) * RP + (size_t)p) * 16,
                                aq_scales16(w + (size_t)(2 * p) * ldw + (size_t)b * bb, dab, bb));
        dws = wsbuf;
    }
    /* the row tile's weights unpacked once for all its column tiles: the permute and mask per pair and block
     * were a fifth of the tile's vector instructions (one thread: 1.0-1.14x at n 2048, 1.15-1.2x at n 8192) */
    const size_t nwu = ((size_t)nb & ~(size_t)7) * (size_t)RP * 64;
    uint8_t wubuf[nwu <= AQ_WU_MAX ? nwu + 64 : 64] __attribute__((aligned(64)));
    const uint8_t *wu = NULL;
    if (nwu <= AQ_WU_MAX && j1 - j0 >= 4 * AQ_C) { /* 2 column tiles (batched decode of 8) measured slower */
        for (int64_t b = 0; b < (nb & ~(int64_t)7); b++)
            for (int p = 0; p < RP; p++)
                _mm512_store_si512(wubuf + ((size_t)b * RP + (size_t)p) * 64,
                                   aq_unsigned(is_q4, w + (size_t)(2 * p) * ldw + (size_t)b * bb, dab));
        wu = wubuf;
    }
    int j = j0;
    for (; j + AQ_C <= j1; j += AQ_C)
        aq_tile(is_q4, nb, RP, AQ_C, s + (size_t)j * lds, lds, w, ldw, dab, aux + (size_t)j * ldaux, ldaux, 0,
                j + 2 * AQ_C > j1 ? nxt : NULL, dws, wu);
    float *sj = s + (size_t)j * lds;
    const uint8_t *aj = aux + (size_t)j * ldaux;
    /* fewer columns than a tile (a verify pass of 2-3 tokens): the remainder is the only pass over these rows,
     * so it prefetches the next row tile (without it: 2x the time of 4 columns, 1B Q4_0) */
    const uint8_t *rnxt = j == j0 ? nxt : NULL;
    _Static_assert(AQ_C <= 8 && AQ_CMAX >= 8, "remainder cases");
    switch (j1 - j) { /* constant column counts, so the tile keeps its accumulators in registers */
    case 7: if (7 < AQ_C) aq_tile(is_q4, nb, RP, 7 < AQ_C ? 7 : 1, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    case 6: if (6 < AQ_C) aq_tile(is_q4, nb, RP, 6 < AQ_C ? 6 : 1, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    case 5: if (5 < AQ_C) aq_tile(is_q4, nb, RP, 5 < AQ_C ? 5 : 1, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    case 4: if (4 < AQ_C) aq_tile(is_q4, nb, RP, 4 < AQ_C ? 4 : 1, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    case 3: aq_tile(is_q4, nb, RP, 3, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    case 2: aq_tile(is_q4, nb, RP, 2, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    case 1: aq_tile(is_q4, nb, RP, 1, sj, lds, w, ldw, dab, aj, ldaux, 0, rnxt, dws, wu); break;
    default: break;
    }
}

AQ_INLINE void aq_gemm(int is_q4, int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w, size_t ldw,
                       const uint8_t *aux, size_t ldaux)
{
    int64_t nb = n / QK8_0;
    ptrdiff_t d = (ptrdiff_t)ldw;
    int jb = aq_col_block(aq_aux_bytes(n));
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int j1 = nc - j0 < jb ? nc : j0 + jb, i = 0;
        for (; i + 2 * AQ_RP <= nr; i += 2 * AQ_RP)
            aq_cols(is_q4, nb, AQ_RP, j0, j1, s + i, lds, w + (size_t)i * ldw, ldw, d, aux, ldaux,
                    i + 4 * AQ_RP <= nr ? w + (size_t)(i + 2 * AQ_RP) * ldw : NULL);
        /* the remaining rows in one tile of 1-3 pairs (each pass over the columns reads all their aux) */
        if (nr - i >= 6)
            aq_cols(is_q4, nb, 3, j0, j1, s + i, lds, w + (size_t)i * ldw, ldw, d, aux, ldaux, NULL), i += 6;
        else if (nr - i >= 4)
            aq_cols(is_q4, nb, 2, j0, j1, s + i, lds, w + (size_t)i * ldw, ldw, d, aux, ldaux, NULL), i += 4;
        else if (nr - i >= 2)
            aq_cols(is_q4, nb, 1, j0, j1, s + i, lds, w + (size_t)i * ldw, ldw, d, aux, ldaux, NULL), i += 2;
        if (i < nr) /* an odd last row: a pair with itself */
            aq_cols(is_q4, nb, 1, j0, j1, s + i, lds, w + (size_t)i * ldw, ldw, 0, aux, ldaux, NULL);
    }
}

#define AQ_GEMM(name, IS_Q4, QK)                                                                             \
    static void aq_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw,  \
                               const void *x, size_t ldx, const void *aux, size_t ldaux)                   \
    {                                                                                                      \
        (void)x, (void)ldx; /* everything the kernel reads of the activations is in aux */                 \
        aq_gemm(IS_Q4, n, nr, nc, s, lds, w, ldw, aux, ldaux);                                             \
    }

AQ_GEMM(q4_0, 1, QK4_0)
AQ_GEMM(q8_0, 0, QK8_0)

/* ---- the R16 layout (quant.h): 16 rows per register, no permutes ----
 *
 * A zmm of the layout holds one quant dword of 16 rows, so vpdpbusd against one activation dword broadcast to
 * all lanes gives lane l of those 16 rows at once (lane l as above: Q8_0 dword l; Q4_0 dword l's low nibbles for
 * l < 4, dword l - 4's high nibbles x16 for l >= 4), started at M, less lane l's M - c (a broadcast operand).
 * Each row's 8 lane accumulators are then 8 registers (acc[l], one row per zmm lane), updated by the same
 * fma(d_w * d_x, float(lane), acc) per block as the interleaved tile, and folded vertically at the end with
 * simd_fold8's adds in its order. Per 16 rows, column and block: 8 vpdpbusd, 8 vsubps, 8 vfmadd, 16 broadcast
 * loads and one scale product; no permute, no table (one thread, Zen 5: 1B Q4_0 decode gemv 1.7-2.0x the
 * interleaved tile with the matrix in L2, 1.3-1.5x from memory at n 2048, whose rows it reads as one stream;
 * gemm of 8 columns 1.2-1.5x, of 256 1.1-1.4x; docs/performance.md, stop 12). The gemm is bound by the broadcast
 * loads and the two pipes vpdpbusd and vfmadd share: dropping the M - c operand (wrong results, timing only)
 * measured 1.3-1.4x faster, but moving the correction to the weights' side (activations + 128 as the unsigned
 * operand, one more vpdpbusd per group, block and lane for 128 * sum4(w), shared by the columns) measured the
 * same as this. */

/* aq_dot(u, the dword at x broadcast), the broadcast taken by vpdpbusd's memory operand: GCC emits a separate
 * vpbroadcastd for _mm512_set1_epi32, whose register the 3-column tile cannot spare (it spilled accumulators). */
AQ_INLINE __m512i aq_dot_bcast(__m512i u, const uint8_t *x)
{
    __m512i q = _mm512_set1_epi32(AQ_MAGIC_BITS);
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(q) : "v"(u), "m"(*(const int32_t *)x));
    return q;
}

/* Weights of lane l for the 16 rows of a block (its R16 dwords at q). */
AQ_INLINE __m512i aq16_lane(int is_q4, const uint8_t *q, int l)
{
    if (is_q4) {
        /* the high nibbles as v ^ low: one mask register fewer in the tile than v & 0xf0 (the empty asm keeps
         * GCC from turning it back into that) */
        __m512i v = _mm512_loadu_si512(q + 64 * (l & 3)), lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
        if (l < 4)
            return lo;
        __asm__("" : "+v"(lo));
        return _mm512_xor_si512(v, lo);
    }
    return _mm512_xor_si512(_mm512_loadu_si512(q + 64 * l), _mm512_set1_epi8((char)0x80));
}

/* 16 rows (the group at g) x NC columns: s[c * lds + r] for r < 16. nxt: memory prefetched as far along as
 * this group is read (gemm: the next group; gemv: AQ16_PF_Q4 / AQ16_PF_Q8 bytes ahead), or NULL. */
AQ_INLINE void aq16_tile(int is_q4, int64_t nb, const int NC, float *s, size_t lds, const uint8_t *g,
                         const uint8_t *aux, size_t ldaux, const uint8_t *nxt)
{
    /* a block's bytes in the group (the prefetch's step; quant.h says where its scales and dwords are) */
    const size_t gb = 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0)), nd = is_q4 ? 4 : 8;
    const size_t boff = aq_nb8(nb) * 2 * sizeof(float) + (is_q4 ? 0 : (size_t)nb * AQ_BLK);
    __m512 acc[AQ_CMAX][8];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++)
            acc[c][l] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = g + quant_r16_dwords(1, nd, nb, b), *hs = g + quant_r16_scales(1, nd, nb, b);
        if (nxt)
            for (size_t i = 0; i < gb; i += 64)
                _mm_prefetch((const char *)nxt + (size_t)b * gb + i, _MM_HINT_T1);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs)), d[AQ_CMAX];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            d[c] = _mm512_mul_ps(dw, _mm512_set1_ps(((const float *)(aux + (size_t)c * ldaux))[2 * b]));
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            /* Q4_0: lanes l and l + 4 come from one dword, so they go one after the other (lanes are
             * independent sums: the order between them changes no bit) */
            const int l = is_q4 ? (k >> 1) + 4 * (k & 1) : k;
            __m512i u = aq16_lane(is_q4, q, l);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const uint8_t *x = aux + (size_t)c * ldaux + boff + (size_t)b * AQ_BLK;
                float mc;
                memcpy(&mc, x + 32 + 4 * l, 4);
                __m512i q = aq_dot_bcast(u, x + 4 * l);
                acc[c][l] = _mm512_fmadd_ps(d[c], aq_lanes_f32(q, _mm512_set1_ps(mc)), acc[c][l]);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        __m512 a[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) /* Q4_0 lanes 4-7 hold 16 x the value (aq_fold) */
            a[l] = is_q4 && l >= 4 ? _mm512_mul_ps(acc[c][l], _mm512_set1_ps(0.0625f)) : acc[c][l];
        _mm512_storeu_ps(s + (size_t)c * lds, simd_fold8_r16(a));
    }
}

AQ_INLINE void aq16_gemv(int is_q4, int64_t n, int64_t nr, float *y, const uint8_t *w, const uint8_t *aux)
{
    int64_t nb = n / QK8_0;
    size_t gbytes = (size_t)nb * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    for (int64_t i = 0; i < nr; i += 16) {
        const uint8_t *g = w + (size_t)(i / 16) * gbytes;
        aq16_tile(is_q4, nb, 1, y + i, 0, g, aux, 0, g + (is_q4 ? AQ16_PF_Q4 : AQ16_PF_Q8));
    }
}

/* gemm16 tile: columns (2 and 4 measured slower: 8 accumulators per column). The 3-column tile uses all 32
 * registers (24 accumulators, 3 scales, M, the nibble mask, a lane's weights, a temporary), which is why
 * aq16_tile goes through a Q4_0 block's lanes in pairs and broadcasts inside vpdpbusd: with lanes in order 0-7
 * and a separate broadcast GCC spilled a column's accumulators to the stack, 0.90-0.93x (Zen 5, stop 16). */
#define AQ16_C 3

AQ_INLINE void aq16_gemm(int is_q4, int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w,
                         const uint8_t *aux, size_t ldaux)
{
    int64_t nb = n / QK8_0;
    size_t gbytes = (size_t)nb * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    int jb = aq_col_block(aq_aux_bytes(n));
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int j1 = nc - j0 < jb ? nc : j0 + jb;
        for (int i = 0; i < nr; i += 16) {
            const uint8_t *g = w + (size_t)(i / 16) * gbytes, *nxt = i + 16 < nr ? g + gbytes : NULL;
            int j = j0;
            for (; j + AQ16_C <= j1; j += AQ16_C)
                aq16_tile(is_q4, nb, AQ16_C, s + (size_t)j * lds + i, lds, g, aux + (size_t)j * ldaux, ldaux,
                          j + 2 * AQ16_C > j1 ? nxt : NULL);
            _Static_assert(AQ16_C == 3, "remainder cases: 1 or 2 columns");
            float *sj = s + (size_t)j * lds + i;
            const uint8_t *aj = aux + (size_t)j * ldaux, *rn = j == j0 ? nxt : NULL;
            /* constant column counts keep the accumulators in registers */
            if (j1 - j == 2)
                aq16_tile(is_q4, nb, 2, sj, lds, g, aj, ldaux, rn);
            else if (j1 - j == 1)
                aq16_tile(is_q4, nb, 1, sj, lds, g, aj, ldaux, rn);
        }
    }
}

#define AQ16_FNS(name, IS_Q4)                                                                                \
    static void aq16_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, const void *x, const void *aux) \
    {                                                                                                      \
        aq16_gemv(IS_Q4, n, nr, y, w, aux);                                                                \
    }                                                                                                      \
    static void aq16_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, const void *x,  \
                                 size_t ldx, const void *aux, size_t ldaux)                                \
    {                                                                                                      \
        aq16_gemm(IS_Q4, n, nr, nc, s, lds, w, aux, ldaux);                                                \
    }

AQ16_FNS(q4_0, 1)
AQ16_FNS(q8_0, 0)

static const struct gemv_ops aq_ops[] = {
    {DTYPE_Q4_0, aq_aux_bytes, aq_prep, aq_gemv_q4_0, aq_gemm_q4_0, aq16_gemv_q4_0, aq16_gemm_q4_0},
    {DTYPE_Q8_0, aq_aux_bytes, aq_prep, aq_gemv_q8_0, aq_gemm_q8_0, aq16_gemv_q8_0, aq16_gemm_q8_0},
};

const struct gemv_ops *gemv_ops_avx512q(enum dtype t)
{
    if (!gemv_cpu_has_avx512())
        return NULL;
    for (size_t i = 0; i < sizeof aq_ops / sizeof aq_ops[0]; i++)
        if (aq_ops[i].type == t)
            return &aq_ops[i];
    return NULL;
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
