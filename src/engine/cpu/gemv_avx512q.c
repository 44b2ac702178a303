/*
 * gemv_avx512q: AVX-512 kernels for Q4_0 and Q8_0 weights x Q8_0 activations (see gemv.h): decode gemv and
 * prefill / batched-decode gemm. Compiled for AVX-512 by the target pragma below and handed out only when
 * gemv_cpu_has_avx512() says the CPU has it (with VNNI).
 *
 * Numerics: the block sums of kernel_ops_scalar vec_dot (kern_dot_q4_0 / kern_dot_q8_0 in kernels.c), bit for
 * bit. Per 32-element block b: S_b, the exact int32 sum of w_j x_j (Q4_0 w = nibble - 8, Q8_0 w = the signed
 * quant), c_b = d_w * d_x rounded to float, and acc = fma(float(S_b), c_b, acc) in block order from acc = 0;
 * the result is acc. The integer part may be computed any way; the float operations are exactly those, one
 * FMA per block on one chain per output (the FMA of a vector lane rounds as fmaf does).
 *
 * aux of an activation row (n elements, nb = n / 32 blocks, nb8 = nb rounded up to 8; 32-byte aligned):
 *   float dx[nb8]: the activation block scales as floats, zero past nb. Every kernel that shares this aux reads
 *   its scales there (a row-layout kernel of this file reads exactly this prefix);
 *   then per block b a 48-byte record at 4 nb8 + 48 b: int8 xq[32] (the quants, as in x), float dx (block b's
 *   scale again), int32 c4 = -8 * sum(x_b), int32 c8 = -128 * sum(x_b) (the R16 block sums' start values, see
 *   aq16_unsigned), 4 zero bytes.
 * 52 nb8 bytes. The R16 tile reads a (column, block)'s quants, start value and scale through one pointer with
 * constant displacements: with separate arrays at offsets that depend on nb, GCC kept an index per dword in
 * registers it had to reload from the stack, and the gemm was 1.2x slower (8 and 256 columns, n 2048-8192).
 * aux_bytes pads the size (TEMPORARY) to what the row-pair kernels below read, so they stay inside aux.
 *
 * The R16 kernels (gemv16, gemm16; "the R16 layout" below) are the ones the engine runs on weights read into
 * memory. The row-pair kernels (aq_tile, aq_cols, aq_gemm, aq_gemv_*: weights in GGUF rows, the gemv and gemm
 * slots) still compute the PREVIOUS numerics against the previous aux layout, so their results are not the
 * reference's (they are to be replaced by a row-layout kernel). What follows describes them as they were:
 *
 * (previous numerics) per block 8 exact int32 lanes from vpdpbusd on unsigned weights (Q8_0: w ^ 0x80; Q4_0:
 * the nibble, high nibbles left x16) started at the activation's -8 / -128 * sum4(x), then acc = fma(d_w * d_x,
 * float(lanes), acc) per block in block order, Q4_0 lanes 4-7 scaled back by an exact 1/16, then a fold. One zmm
 * holds the 8-lane accumulators of TWO weight rows (A, B) for one activation row, interleaved by dword: zmm
 * lane 2l = row A lane l, lane 2l + 1 = row B lane l. With that layout
 *   - the weights of a row pair become one zmm with one two-source dword permute (+ the AND / XOR);
 *   - the activation block must be each dword repeated twice, and its -8/-128 sum4 start values too: one
 *     permute per (column, block), shared by the tile's row pairs;
 *   - the per-block scales [s(A), s(B), s(A), s(B), ...] are one 64-bit broadcast load from a small table
 *     built per 8 blocks (one multiply of 16 weight scales, picked out of the rows interleaved by word
 *     permutes, by the doubled activation scales);
 *   - the lanes become floats without vcvtdq2ps: vpdpbusd starts every lane at the bits of M = 1.5 * 2^23, so
 *     the exact sum p of the unsigned products comes out as the float M + p, and one subtraction of the float
 *     M - c, the per-lane correction c folded in, gives float(p + c) exactly (Sterbenz).
 * gemm: tiles of AQ_RP row pairs x up to AQ_C columns held in registers, columns blocked so a block's aux stays
 * in L2 while all rows pass over it, the next row tile's weights prefetched into L2 during a row tile's last
 * column tile. A row tile with 4 or more column tiles unpacks its weights once into an L1 buffer they all
 * read (aq_cols). An odd last row runs as a pair with itself. gemv is the same tile with one column, plus a
 * prefetch along the rows.
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

/* The aux layout (see the top): after float dx[nb8], per block b an AQ_REC-byte record at
 * AQ_OFF_REC(nb8) + b * AQ_REC: int8 xq[32] (the quants), then float dx (again), int32 c4 = -8 * sum(x_b),
 * int32 c8 = -128 * sum(x_b), 4 zero bytes. */
#define AQ_REC 48
#define AQ_REC_DX 32
#define AQ_REC_C4 36
#define AQ_REC_C8 40
#define AQ_OFF_REC(nb8) ((nb8) * 4)
#define AQ_AUX16(nb8) ((nb8) * (4 + AQ_REC)) /* the bytes the R16 kernels read (a multiple of 32) */

/* The R16 part, padded (TEMPORARY) to what the row-pair kernels below read, so that until they are replaced
 * they read inside aux (their results are wrong with this layout; prep writes none of the padding). */
static size_t aq_aux_bytes(int64_t n)
{
    size_t nb = (size_t)(n / QK8_0), nb8 = aq_nb8((int64_t)nb), old = nb8 * 2 * sizeof(float) + nb * 2 * AQ_BLK;
    return AQ_AUX16(nb8) > old ? AQ_AUX16(nb8) : old;
}

static void aq_prep(int64_t n, const void *x, void *aux)
{
    const struct block_q8_0 *bx = x;
    int64_t nb = n / QK8_0;
    size_t nb8 = aq_nb8(nb);
    float *dx = aux;
    uint8_t *rec = (uint8_t *)aux + AQ_OFF_REC(nb8);
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++, rec += AQ_REC) {
        float d = _cvtsh_ss(bx[b].d);
        __m256i q = _mm256_loadu_si256((const __m256i *)bx[b].qs);
        /* sum(x_b) = sum(x_b + 128) - 32 * 128: the unsigned sum by vpsadbw */
        __m256i u = _mm256_sad_epu8(_mm256_xor_si256(q, bias), _mm256_setzero_si256());
        __m128i h = _mm_add_epi64(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
        int32_t sum = (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
        dx[b] = d;
        _mm256_storeu_si256((__m256i *)rec, q);
        _mm_storeu_si128((__m128i *)(rec + AQ_REC_DX), _mm_setr_epi32(_mm_cvtsi128_si32(_mm_castps_si128(_mm_set_ss(d))),
                                                                     -8 * sum, -128 * sum, 0));
    }
    for (size_t b = (size_t)nb; b < nb8; b++)
        dx[b] = 0;
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
 * all lanes adds 4 products to each of the 16 rows' int32 lanes: a block's 8 weight registers (Q8_0: its 8
 * dwords; Q4_0: its 4 dwords' low and high nibbles) against the column's 8 dwords give the 16 rows' exact block
 * sums S_b in one register, started at the column's correction (see aq16_unsigned). Then one vcvtdq2ps and one
 * FMA per (16 rows, column, block) by c_b = d_w (the block's 16 F16 scales) * d_x (broadcast): the reference's
 * operations lane by lane, no fold. Per 16 rows, column and block: 8 vpdpbusd (the broadcast their memory
 * operand), a start broadcast, vcvtdq2ps, vmulps, vfmadd; the 8 weight registers (Q8_0 8 XORs, Q4_0 4 ANDs,
 * 4 shifts, 4 ANDs) are made once per (group, block) for all the tile's columns. The previous numerics' R16
 * tile spent 8 vpdpbusd + 8 vsubps + 8 vfmadd there and 8 accumulators per column (so 3 columns per tile).
 *
 * Measured against that tile (Zen 5, one thread, old and new alternated in one program, min of 9-21 runs):
 *   gemm, Q4_0 / Q8_0: 256 columns 1.72-1.83x (n 2048 and 8192), 8 columns 1.55-1.7x, 4 columns 1.45-1.55x,
 *   3 columns 1.2-1.45x;
 *   decode gemv: from memory Q4_0 0.97-1.02x (it streams the same bytes with the same prefetch, and one thread
 *   already reads at the machine's bandwidth there), Q8_0 1.06-1.12x; from L2/L3 (n 2048, 2048 rows) 1.04-1.12x.
 * Columns per gemm tile (AQ16_C; speedup over the old tile at 256 columns, Q4_0 and Q8_0, n 2048 and 8192):
 * 4: 1.39-1.46x, 6: 1.61-1.70x, 8: 1.64-1.75x, 10: 1.67-1.82x, 12: 1.72-1.83x, 14: 1.65-1.83x, 16: 1.54-1.81x.
 * Two groups per gemv tile (two streams of weights) measured 0.6-0.9x from memory; two int32 chains of 4
 * instead of one of 8 in the gemv, no different. */

/* acc + vpdpbusd(u, the dword at x broadcast), the broadcast taken by vpdpbusd's memory operand: GCC emits a
 * separate vpbroadcastd for _mm512_set1_epi32, a register and an instruction per dword. */
AQ_INLINE __m512i aq_dot_bcast(__m512i acc, __m512i u, const uint8_t *x)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)x));
    return acc;
}

/* A block of 16 rows (its R16 dwords at q) as unsigned bytes u[k], k < 8, each against activation dword k
 * (elements 4k .. 4k + 3): Q8_0 u = w ^ 0x80 = w + 128, so a block sum starts at -128 * sum(x_b) (aux c8);
 * Q4_0 u = the nibble = w + 8, dword k's low nibbles for k < 4 (elements 4k ..) and its high nibbles shifted
 * down for k + 4 (elements 16 + 4k ..), so it starts at -8 * sum(x_b) (aux c4). */
AQ_INLINE void aq16_unsigned(int is_q4, const uint8_t *q, __m512i u[8])
{
    if (is_q4) {
        const __m512i m = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i v = _mm512_loadu_si512(q + 64 * k);
            u[k] = _mm512_and_si512(v, m);
            u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
        }
        return;
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        u[k] = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * k), _mm512_set1_epi8((char)0x80));
}

/* The 16 rows' exact block sums S_b against the activation quants at xq (32 bytes), started at c. (Two chains of
 * 4 and an add for the gemv's one column, against the one chain of 8: no different from memory or L2.) */
AQ_INLINE __m512i aq16_bsum(const __m512i u[8], const uint8_t *xq, int32_t c)
{
    __m512i s = _mm512_set1_epi32(c);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        s = aq_dot_bcast(s, u[k], xq + 4 * k);
    return s;
}

#define AQ16_CMAX 16 /* bound of the tile's column arrays */

/* 16 rows (the group at g) x NC columns: s[c * lds + r] for r < 16. nxt: memory prefetched as far along as
 * this group is read (gemm: the next group; gemv: AQ16_PF_Q4 / AQ16_PF_Q8 bytes ahead), or NULL. */
AQ_INLINE void aq16_tile(int is_q4, int64_t nb, const int NC, float *s, size_t lds, const uint8_t *g,
                         const uint8_t *aux, size_t ldaux, const uint8_t *nxt)
{
    /* a block's bytes in the group (the prefetch's step; quant.h says where its scales and dwords are) */
    const size_t gb = 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0)), nd = is_q4 ? 4 : 8;
    const uint8_t *rec = aux + AQ_OFF_REC(aq_nb8(nb)); /* block b's record of column c: rec + c ldaux + b AQ_REC */
    const size_t coff = is_q4 ? AQ_REC_C4 : AQ_REC_C8;
    __m512 acc[AQ16_CMAX];
#pragma GCC unroll 16
    for (int c = 0; c < NC; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += AQ_REC) {
        const uint8_t *q = g + quant_r16_dwords(1, nd, nb, b), *hs = g + quant_r16_scales(1, nd, nb, b);
        if (nxt)
            for (size_t i = 0; i < gb; i += 64)
                _mm_prefetch((const char *)nxt + (size_t)b * gb + i, _MM_HINT_T1);
        __m512i u[8];
        aq16_unsigned(is_q4, q, u);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs));
#pragma GCC unroll 16
        for (int c = 0; c < NC; c++) {
            const uint8_t *r = rec + (size_t)c * ldaux;
            int32_t c0;
            float dx;
            memcpy(&c0, r + coff, 4);
            memcpy(&dx, r + AQ_REC_DX, 4);
            /* c_b = d_w * d_x rounded, then acc = fma(float(S_b), c_b, acc): the reference's operations */
            __m512i sb = aq16_bsum(u, r, c0);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[c]);
        }
    }
#pragma GCC unroll 16
    for (int c = 0; c < NC; c++)
        _mm512_storeu_ps(s + (size_t)c * lds, acc[c]);
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

/* gemm16: at most AQ16_C columns per tile */
#ifndef AQ16_C
#define AQ16_C 12
#endif
_Static_assert(AQ16_C >= 1 && AQ16_C <= 16 && AQ16_C <= AQ16_CMAX, "aq16_tile_k's cases");

/* aq16_tile of k columns (1 <= k <= AQ16_C) through a constant column count, so the tile keeps its accumulators
 * in registers. */
AQ_INLINE void aq16_tile_k(int is_q4, int64_t nb, int k, float *s, size_t lds, const uint8_t *g, const uint8_t *aux,
                           size_t ldaux, const uint8_t *nxt)
{
#define AQ16_K(K)                                                                                            \
    case K:                                                                                                  \
        if (K <= AQ16_C)                                                                                     \
            aq16_tile(is_q4, nb, K <= AQ16_C ? K : 1, s, lds, g, aux, ldaux, nxt);                           \
        break;
    switch (k) {
        AQ16_K(16) AQ16_K(15) AQ16_K(14) AQ16_K(13) AQ16_K(12) AQ16_K(11) AQ16_K(10) AQ16_K(9) AQ16_K(8) AQ16_K(7)
        AQ16_K(6) AQ16_K(5) AQ16_K(4) AQ16_K(3) AQ16_K(2) AQ16_K(1)
    default: break;
    }
#undef AQ16_K
}

/* Columns per cache block: a block's aux stays in L2 (2 MiB per core here; half of it) while every group
 * passes over it. */
static int aq16_col_block(size_t bytes_per_col)
{
    size_t cols = ((size_t)1 << 20) / (bytes_per_col ? bytes_per_col : 1);
    cols -= cols % AQ16_C;
    return cols < AQ16_C ? AQ16_C : cols > (1u << 20) ? 1 << 20 : (int)cols;
}

/* Per column block, each group against the block's columns in nt = ceil(columns / AQ16_C) tiles of as equal
 * widths as can be (13 columns: 7 + 6, not 12 + 1: the weights' unpacking is per tile), the last tile
 * prefetching the next group. */
AQ_INLINE void aq16_gemm(int is_q4, int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w,
                         const uint8_t *aux, size_t ldaux)
{
    int64_t nb = n / QK8_0;
    size_t gbytes = (size_t)nb * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    int jb = aq16_col_block(AQ_AUX16(aq_nb8(nb)));
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int m = nc - j0 < jb ? nc - j0 : jb, nt = (m + AQ16_C - 1) / AQ16_C;
        for (int i = 0; i < nr; i += 16) {
            const uint8_t *g = w + (size_t)(i / 16) * gbytes, *nxt = i + 16 < nr ? g + gbytes : NULL;
            for (int t = 0; t < nt; t++) {
                int ja = j0 + m * t / nt, jz = j0 + m * (t + 1) / nt;
                aq16_tile_k(is_q4, nb, jz - ja, s + (size_t)ja * lds + i, lds, g, aux + (size_t)ja * ldaux, ldaux,
                            t == nt - 1 ? nxt : NULL);
            }
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
