/*
 * gemv_avx512k: AVX-512 kernels for F16 weights x F32 activations (rounded to F16 precision, see kernels.c)
 * and Q4_K / Q6_K weights x Q8_K activations (see gemv.h): prefill / batched-decode gemm and decode gemv,
 * bit-identical to kernel_ops vec_dot on AVX2 (kernels_avx2.c). The functions are compiled for AVX-512 by the
 * target pragma below and handed out only when gemv_cpu_has_avx512() says the CPU has it.
 *
 * How 512-bit registers keep the AVX2 numerics: for F16, vec_dot works in 8 float lanes, and one zmm holds two
 * such independent 8-lane sets; for the K-quants, kernels.c's block sums (an exact int32 sum per super-block,
 * then scalar FMAs), which any arrangement of the integer work reproduces:
 *   K-quants (gemm, GGUF rows): each 256-bit half holds one (weight row, activation column) pair's 8 partial
 *     int32 lanes, half = column c / c+1, the weights broadcast to both halves by one broadcast load, so the
 *     nibble / 6-bit unpacking is done once for two columns; vpdpwssd (AVX512-VNNI) replaces vec_dot's madd +
 *     add. At the block's end each half's lanes are summed (ak_hsum_halves) and the FMAs run on
 *     [d_w * d_x(c) x8 | d_w * d_x(c+1) x8], the same IEEE operations in every lane of a half.
 *   K-quants (gemv, GGUF rows): half = weight row r / r+1 against the activation broadcast to both halves; the
 *     per-sub-block scales of both rows are picked into place with one vpermw each.
 *   F16 (gemm): half = vec_dot's chain 0 / chain 1 of one (weight row, activation column): vec_dot's 16-element
 *     step puts elements i..i+7 in chain 0 and i+8..i+15 in chain 1, which is exactly a zmm of 16 consecutive
 *     weights times 16 consecutive activations. The weights of a tile are converted to F32 once per chunk
 *     of AF_KC elements into a buffer that stays in L1 and is reused for every column of the cache block;
 *     activations come as F16 from aux (af_prep: exact, they are F16 values), one 32-byte load and a
 *     conversion per 16 elements. A 6-row x 4-column tile holds 24 accumulators and the 6 weight
 *     vectors, so each step is 6 + 4 loads for 24 FMAs (the pair layout it replaced, [8 of row r | 8 of
 *     row r+1] against 8 activations broadcast, needed 2 loads per 2 FMAs of a column: 1.1-1.2x slower on
 *     Zen 5). The 8-element steps and the zero-padded tail go into chain 0 (the low half, masked); the end
 *     adds the halves (vec_dot's chain 0 + chain 1) and folds. Between chunks the accumulators live in a
 *     stack buffer per column.
 *   F16 gemv: the AVX2 gemv (memory-bound already).
 *   K-quants in the R16 layout (gemv16 / gemm16, see "Q4_K and Q6_K in the R16 layout" below): 16 rows per register,
 *     one register of block sums per column; what the backend uses for decode, batched decode and prefill.
 * K-quants: a lone row or column is paired with itself and only its low half stored.
 *
 * aux: F16 keeps each activation column's whole 16-element groups as F16 (af_prep); the K-quants need none.
 *
 * Measured on the 2-core test machine (Xeon, AVX-512 with one 512-bit FMA per cycle: a pure FMA loop does
 * ~82 GFLOP/s in zmm, ~95 in ymm), one thread, engine-sized panels, 128 columns, against kernel_ops gemm:
 * F16 n 2048 ~90-100 GFLOP/s (AVX2 ~50), n 8192 ~65 (AVX2 ~44; there the activations no longer fit beside
 * the panel and stream from L3); Q4_K / Q6_K ~150 (AVX2 ~80-95). On the Zen 5 VM (two 512-bit FMAs per
 * cycle), 256 columns: F16 n 2048 165-190 GFLOP/s, n 8192 140-155 (the pair layout: 150-170 and 105-135).
 * Tile shapes were picked by measuring (F16 on Zen 5: 6 rows x 4 columns best, 5 x 5 and 4 x 6 5-10% slower,
 * 6 x 3 15% slower; chunks of 512 elements best, 256 and 1024 slower in prefill; K-quants on the Xeon: 3 x 3
 * pairs best, 4 x 2, 2 x 3, 3 x 4 within ~10%). Decode gemv from L2: Q4_K 15 -> 26 GB/s, Q6_K 18 -> 30 GB/s per core.
 */
#include "engine/cpu/gemv.h"

#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include "engine/cpu/gemm_tiles.h"
#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#define AK_INLINE static inline __attribute__((always_inline))

AK_INLINE float ak_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* [32 bytes at a | 32 bytes at b] */
AK_INLINE __m512i ak_pair256(const void *a, const void *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* [a x8 | b x8] */
AK_INLINE __m512 ak_pair_ps(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }

/* Each 256-bit half's 8 int32 lanes summed, in every lane of that half: the block sum of the half's
 * (row, column) pair (kernels.c; integer adds are exact, so the order is free). */
AK_INLINE __m512i ak_hsum_halves(__m512i v)
{
    v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
    v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
    return _mm512_add_epi32(v, _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* Stores lane 0 of each half (whose lanes all hold the same sum): lo to *s0, hi to *s1 unless s1 is NULL. */
AK_INLINE void ak_store2(__m512 v, float *s0, float *s1)
{
    *s0 = _mm512_cvtss_f32(v);
    if (s1)
        *s1 = _mm_cvtss_f32(_mm512_extractf32x4_ps(v, 2));
}

/* Columns per cache block: the activations of a block stay in cache (L2 for the K-quants, L3 for F16: AF_XB)
 * while every row tile passes over them, and the weights are read once per block. */
static int ak_col_block(size_t budget, size_t bytes_per_col, int unit, int cap)
{
    size_t cols = budget / (bytes_per_col ? bytes_per_col : 1);
    cols -= cols % (size_t)unit;
    return cols < (size_t)unit ? unit : cols > (size_t)cap ? cap : (int)cols;
}

/* Prefetch distance along the contiguous stream of a call's (gemv) or a tile's (gemm) weight rows: the tile
 * position in the stream plus AK_PF bytes, into L2 (as gemv_avx2.c does, which measured this distance). In
 * gemm it matters for batched decode, where the first column tile of a panel reads the weights from memory. */
#ifndef AK_PF
#define AK_PF (16 << 10)
#endif

AK_INLINE void ak_prefetch(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 64)
        _mm_prefetch((const char *)p + i, _MM_HINT_T1);
}

/* ---- Q4_K x Q8_K ---- */

/* vec_dot's mins vector (8 int16 pairs (m_j, m_j) per 128 bits) of a Q4_K block, in both 256-bit halves. */
AK_INLINE __m256i ak_q4_k_mins(const uint8_t mn[8])
{
    __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    return _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
}

#ifndef AK_XB
#define AK_XB (512 << 10) /* K-quant gemm: bytes of activations per column cache block */
#endif
#ifndef AK_KR
#define AK_KR 3 /* K-quant gemm tile: rows (panels are multiples of 12 rows) */
#endif
#ifndef AK_KP
#define AK_KP 3 /* K-quant gemm tile: column pairs */
#endif

/* NR weight rows x NP column pairs; xc[2p], xc[2p + 1] are the columns of pair p (equal for a lone column),
 * sc_[c] where column c's results go (NULL: not stored). */
AK_INLINE void ak_tile_q4_k(int64_t nb, const int NR, const int NP, const uint8_t *w, size_t ldw,
                            const uint8_t *const *xc, float *const *sc_)
{
    __m512 acc[AK_KR][AK_KP];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
            acc[r][p] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[AK_KR][8], mn[AK_KR][8];
        __m512i sumi[AK_KR][AK_KP];
        const struct block_q8_k *bx[2 * AK_KP];
        ak_prefetch(w + AK_PF + (size_t)b * NR * sizeof(struct block_q4_k), NR * sizeof(struct block_q4_k));
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NP; c++)
            bx[c] = (const struct block_q8_k *)xc[c] + b;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            quant_q4_k_scales8(((const struct block_q4_k *)(w + (size_t)r * ldw) + b)->scales, sc[r], mn[r]);
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++)
                sumi[r][p] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) { /* 64 elements: sub-blocks 2k (low nibbles) and 2k+1 (high) */
            __m512i y0[AK_KP], y1[AK_KP];
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                y0[p] = ak_pair256(bx[2 * p]->qs + 64 * k, bx[2 * p + 1]->qs + 64 * k);
                y1[p] = ak_pair256(bx[2 * p]->qs + 64 * k + 32, bx[2 * p + 1]->qs + 64 * k + 32);
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const struct block_q4_k *bw = (const struct block_q4_k *)(w + (size_t)r * ldw) + b;
                __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bw->qs + 32 * k)));
                __m512i lo = _mm512_and_si512(raw, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                __m512i slo = _mm512_set1_epi16(sc[r][2 * k]), shi = _mm512_set1_epi16(sc[r][2 * k + 1]);
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++) {
                    sumi[r][p] = _mm512_dpwssd_epi32(sumi[r][p], _mm512_maddubs_epi16(lo, y0[p]), slo);
                    sumi[r][p] = _mm512_dpwssd_epi32(sumi[r][p], _mm512_maddubs_epi16(hi, y1[p]), shi);
                }
            }
        }
        __m512i bs[AK_KP];
        __m512 dd[AK_KP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            bs[p] = ak_pair256(bx[2 * p]->bsums, bx[2 * p + 1]->bsums);
            dd[p] = ak_pair_ps(bx[2 * p]->d, bx[2 * p + 1]->d);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const struct block_q4_k *bw = (const struct block_q4_k *)(w + (size_t)r * ldw) + b;
            __m512i mins = _mm512_broadcast_i64x4(ak_q4_k_mins(mn[r]));
            __m512 d = _mm512_set1_ps(ak_h2f(bw->d)), dmin = _mm512_set1_ps(ak_h2f(bw->dmin));
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                __m512i mm = _mm512_madd_epi16(bs[p], mins);
                acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(d, dd[p]), _mm512_cvtepi32_ps(ak_hsum_halves(sumi[r][p])), acc[r][p]);
                acc[r][p] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dd[p]), _mm512_cvtepi32_ps(ak_hsum_halves(mm)), acc[r][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
            ak_store2(acc[r][p], sc_[2 * p] + r, sc_[2 * p + 1] ? sc_[2 * p + 1] + r : NULL);
}

/* ---- Q6_K x Q8_K ---- */

/* vpermw index giving [scale 8h+2qt x8 | scale 8h+2qt+1 x8] in both halves from the 16 int16 scales in both
 * halves: vec_dot's per-quarter scale vector. */
AK_INLINE __m512i ak_q6_k_sidx(int j)
{
    return _mm512_add_epi16(_mm512_set1_epi16((short)j),
                            _mm512_set_epi64(0x0001000100010001LL, 0x0001000100010001LL, 0, 0, 0x0001000100010001LL,
                                             0x0001000100010001LL, 0, 0));
}

AK_INLINE __m512i ak_q6_k_quarter(const struct block_q6_k *bw, int h, int qt, __m512i m4, __m512i m2h)
{
    __m512i ql = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bw->ql + 64 * h + 32 * (qt & 1))));
    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bw->qh + 32 * h)));
    __m512i lo = qt < 2 ? _mm512_and_si512(ql, m4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
    __m512i hb = qt == 0   ? _mm512_slli_epi16(qh, 4)
                 : qt == 1 ? _mm512_slli_epi16(qh, 2)
                 : qt == 2 ? qh
                           : _mm512_srli_epi16(qh, 2);
    return _mm512_or_si512(lo, _mm512_and_si512(hb, m2h)); /* 0..63, offset 32 */
}

AK_INLINE void ak_tile_q6_k(int64_t nb, const int NR, const int NP, const uint8_t *w, size_t ldw,
                            const uint8_t *const *xc, float *const *sc_)
{
    __m512 acc[AK_KR][AK_KP];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
            acc[r][p] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), m2h = _mm512_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++) {
        __m512i sumi[AK_KR][AK_KP], sc16[AK_KR];
        const struct block_q8_k *bx[2 * AK_KP];
        ak_prefetch(w + AK_PF + (size_t)b * NR * sizeof(struct block_q6_k), NR * sizeof(struct block_q6_k));
#pragma GCC unroll 4
        for (int c = 0; c < 2 * NP; c++)
            bx[c] = (const struct block_q8_k *)xc[c] + b;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const struct block_q6_k *bw = (const struct block_q6_k *)(w + (size_t)r * ldw) + b;
            sc16[r] = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)bw->scales)));
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++)
                sumi[r][p] = _mm512_setzero_si512();
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++) {
                __m512i y[AK_KP];
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++)
                    y[p] = ak_pair256(bx[2 * p]->qs + 128 * h + 32 * qt, bx[2 * p + 1]->qs + 128 * h + 32 * qt);
                const __m512i sidx = ak_q6_k_sidx(8 * h + 2 * qt);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    const struct block_q6_k *bw = (const struct block_q6_k *)(w + (size_t)r * ldw) + b;
                    __m512i q = ak_q6_k_quarter(bw, h, qt, m4, m2h);
                    __m512i sv = _mm512_permutexvar_epi16(sidx, sc16[r]);
#pragma GCC unroll 4
                    for (int p = 0; p < NP; p++)
                        sumi[r][p] = _mm512_dpwssd_epi32(sumi[r][p], _mm512_maddubs_epi16(q, y[p]), sv);
                }
            }
        }
        __m512i bs[AK_KP];
        __m512 dd[AK_KP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            bs[p] = ak_pair256(bx[2 * p]->bsums, bx[2 * p + 1]->bsums);
            dd[p] = ak_pair_ps(bx[2 * p]->d, bx[2 * p + 1]->d);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const struct block_q6_k *bw = (const struct block_q6_k *)(w + (size_t)r * ldw) + b;
            __m512 d = _mm512_set1_ps(ak_h2f(bw->d));
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                /* the codes carry +32: subtract 32 * sum over groups of scale * group sum of x */
                __m512i off = _mm512_madd_epi16(bs[p], sc16[r]);
                __m512i t = _mm512_sub_epi32(sumi[r][p], _mm512_slli_epi32(off, 5));
                acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(d, dd[p]), _mm512_cvtepi32_ps(ak_hsum_halves(t)), acc[r][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++)
            ak_store2(acc[r][p], sc_[2 * p] + r, sc_[2 * p + 1] ? sc_[2 * p + 1] + r : NULL);
}

/* One K-quant tile call with the row and pair counts as constants (clamped only to keep unreachable cases
 * compilable). */
#define AK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define AK_TILE_NR(TILE, nb, nr_, NP, w, ldw, xc, sp)                                                           \
    do {                                                                                                     \
        switch (nr_) {                                                                                       \
        case 4: TILE(nb, AK_MIN(4, AK_KR), NP, w, ldw, xc, sp); break;                                      \
        case 3: TILE(nb, AK_MIN(3, AK_KR), NP, w, ldw, xc, sp); break;                                      \
        case 2: TILE(nb, AK_MIN(2, AK_KR), NP, w, ldw, xc, sp); break;                                      \
        default: TILE(nb, 1, NP, w, ldw, xc, sp); break;                                                    \
        }                                                                                                    \
    } while (0)
#define AK_TILE(TILE, nb, nr_, np_, w, ldw, xc, sp)                                                             \
    do {                                                                                                     \
        switch (np_) {                                                                                       \
        case 4: AK_TILE_NR(TILE, nb, nr_, AK_MIN(4, AK_KP), w, ldw, xc, sp); break;                         \
        case 3: AK_TILE_NR(TILE, nb, nr_, AK_MIN(3, AK_KP), w, ldw, xc, sp); break;                         \
        case 2: AK_TILE_NR(TILE, nb, nr_, AK_MIN(2, AK_KP), w, ldw, xc, sp); break;                         \
        default: AK_TILE_NR(TILE, nb, nr_, 1, w, ldw, xc, sp); break;                                       \
        }                                                                                                    \
    } while (0)

#define AK_KGEMM(name, TILE)                                                                                 \
    static void ak_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw,  \
                               const void *x, size_t ldx, const void *aux, size_t ldaux)                   \
    {                                                                                                      \
        const uint8_t *W = w, *X = x;                                                                      \
        int64_t nb = n / QK_K;                                                                             \
        int jb = ak_col_block(AK_XB, ldx, 2 * AK_KP, 1 << 20);                                                    \
        for (int j0 = 0; j0 < nc; j0 += jb) {                                                              \
            int j1 = nc - j0 < jb ? nc : j0 + jb;                                                          \
            for (int i = 0; i < nr; i += AK_KR) {                                                          \
                int nri = nr - i < AK_KR ? nr - i : AK_KR;                                                 \
                const uint8_t *wi = W + (size_t)i * ldw;                                                   \
                int j = j0;                                                                                \
                for (; j < j1; j += 2 * AK_KP) {                                                           \
                    const uint8_t *xc[2 * AK_KP];                                                          \
                    float *sp[2 * AK_KP];                                                                  \
                    int m = j1 - j < 2 * AK_KP ? j1 - j : 2 * AK_KP;                                       \
                    for (int c = 0; c < 2 * AK_KP; c++) {                                                  \
                        int cc = c < m ? c : m - 1;                                                        \
                        xc[c] = X + (size_t)(j + cc) * ldx;                                                \
                        sp[c] = c < m ? s + (size_t)(j + c) * lds + i : NULL;                              \
                    }                                                                                      \
                    AK_TILE(TILE, nb, nri, (m + 1) / 2, wi, ldw, xc, sp);                                  \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }

AK_KGEMM(q4_k, ak_tile_q4_k)
AK_KGEMM(q6_k, ak_tile_q6_k)

/* ---- F16 x F32 gemm ---- */

#define AF_R 6      /* weight rows per tile */
#define AF_C 4      /* columns per tile */
/* Bytes of activations (aux: F16) per column cache block. The weights are read again from memory for every
 * block, so for FFN down (n 8192, when the columns were 32 KiB of F32) a block that fit L2 (768 KiB, 24
 * columns) read them 11 times in a 256-token prefill; 4 MiB (from L3; AF_JB caps it at 128 columns) made that
 * product 1.20-1.27x faster on the Zen 5 (WAFER_PROFILE, 1B F16 pp512), n 2048 unchanged. The integer kernels
 * keep theirs in L2: larger blocks were slower there. */
#define AF_XB (4 << 20)
/* Elements per chunk of converted weights (multiple of 16): 6 rows x 2 KiB of F32, in L1. On Zen 4 and 5
 * (cpu_f16_gemm_whole_rows) a chunk is the whole row, up to AF_KC_MAX: saving and reloading each column tile's
 * chains at every chunk's end cost more there than the converted rows' reads from L2 (one core, 1,024 rows x
 * 256 columns: n 2048 101 -> 110 GFLOP/s, n 8192 99.5 -> 107, of the 117 one 512-bit FMA a cycle allows;
 * chunks of 256: 88-93, 1,024: 98-106; stop 26). On the Zen 5 (before whole rows existed) 512 had measured
 * best of the chunk sizes (256 and 1,024 slower); whole rows beat it there too (1B F16 pp512, 2 threads,
 * WAFER_F16_GEMM=whole / chunks alternated: 1.01-1.07x in seven pairs, median 1.035x; stop 32), so both AMD
 * families take them, and so does the Intel Xeon family 6 model 207 (the same test: 109.1 / 102.7, 108.2 / 104.7,
 * 107.4 / 102.2 tokens/s, 1.03-1.06x; stop 43). */
#define AF_KC 512
#define AF_KC_MAX 8192
#define AF_JB 128   /* most columns per cache block (the per-column chains of a block live on the stack) */

/* Converts elements [k0, k1) of F16 row a to F32 in wb; a partial last 16-element group is zero-padded (as
 * vec_dot pads its tail). */
AK_INLINE void af_convert(const uint16_t *a, int64_t k0, int64_t k1, float *wb)
{
    int64_t i = k0;
    for (; i + 16 <= k1; i += 16, wb += 16)
        _mm512_store_ps(wb, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))));
    if (i < k1) {
        uint16_t t[16] = {0};
        memcpy(t, a + i, (size_t)(k1 - i) * 2);
        _mm512_store_ps(wb, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t)));
    }
}

/* The dot product from a zmm of [chain 0 | chain 1]: vec_dot's chain 0 + chain 1, then its fold. */
AK_INLINE float af_fold(__m512 acc)
{
    return simd_fold8(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)));
}

/* Stores the dot products of an R x NC tile of [chain 0 | chain 1] accumulators (row r, column c at
 * acc[r * ldacc + c]) to s[c * lds + r]: af_fold of each, eight at a time in shuffles (simd_fold8x8: the
 * same adds on the same operands), the rest one by one. */
AK_INLINE void af_fold_tile(const int R, const int NC, const __m512 *acc, const int ldacc, float *s, size_t lds)
{
    float f[AF_R * 8]; /* f[c * R + r]: each column's rows are contiguous, as in s */
    const int nq = R * NC;
#pragma GCC unroll 8
    for (int g = 0; g + 8 <= nq; g += 8) {
        __m512 x[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) { /* x[u] = [chain 0 + chain 1 of q0 | of q1] */
            const int q0 = g + 2 * u, q1 = q0 + 1;
            __m512 a = acc[(q0 % R) * ldacc + q0 / R], b = acc[(q1 % R) * ldacc + q1 / R];
            x[u] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
        }
        _mm256_storeu_ps(f + g, simd_fold8x8(x));
    }
#pragma GCC unroll 8
    for (int q = nq & ~7; q < nq; q++)
        f[q] = af_fold(acc[(q % R) * ldacc + q / R]);
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            s[(size_t)c * lds + r] = f[c * R + r];
}

/* R weight rows (converted chunk wb: [R][kc] floats) x NC columns over elements [k0, k1) of n; one zmm per
 * (row, column) = [vec_dot chain 0 | chain 1]. The chains of column c start from ch[c] (zero when k0 == 0)
 * and are saved back there unless this is the last chunk, where they are added (chain 0 + chain 1, vec_dot's
 * last add) and folded into s[c * lds + r]. */
AK_INLINE void af_tile(const int R, const int NC, int64_t n, int64_t k0, int64_t k1, const float *wb, size_t kc,
                       const float *const *xc, const uint16_t *const *xh, __m512 (*ch)[AF_R], float *s, size_t lds)
{
    __m512 acc[AF_R][AF_C];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[r][c] = k0 ? ch[c][r] : _mm512_setzero_ps();
    int64_t i = k0;
    const float *g = wb;
    for (; i + 16 <= k1; i += 16, g += 16) { /* vec_dot's 16-element steps: elements i..i+7 chain 0, the rest 1 */
        __m512 w[AF_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            w[r] = _mm512_load_ps(g + r * kc);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m512 x = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(xh[c] + i)));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(w[r], x, acc[r][c]);
        }
    }
    if (k1 < n) {
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                ch[c][r] = acc[r][c];
        return;
    }
    for (; i < n; i += 8, g += 8) { /* 8-element steps, then the zero-padded tail: chain 0 only */
        __mmask8 m = n - i >= 8 ? 0xff : (__mmask8)((1u << (n - i)) - 1);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m512 x = _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m, xc[c] + i));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(_mm256_load_ps(g + r * kc)), x, acc[r][c],
                                                  0x00ff);
        }
    }
    af_fold_tile(R, NC, &acc[0][0], AF_C, s, lds);
}

/* af_tile with R and NC as constants. */
#define AF_TILE_NC(R, nc_, ...)                                                                              \
    do {                                                                                                     \
        switch (nc_) {                                                                                       \
        case 4: af_tile(R, 4, __VA_ARGS__); break;                                                           \
        case 3: af_tile(R, 3, __VA_ARGS__); break;                                                           \
        case 2: af_tile(R, 2, __VA_ARGS__); break;                                                           \
        default: af_tile(R, 1, __VA_ARGS__); break;                                                          \
        }                                                                                                    \
    } while (0)
#define AF_TILE(r_, nc_, ...)                                                                                \
    do {                                                                                                     \
        switch (r_) {                                                                                        \
        case 6: AF_TILE_NC(6, nc_, __VA_ARGS__); break;                                                      \
        case 5: AF_TILE_NC(5, nc_, __VA_ARGS__); break;                                                      \
        case 4: AF_TILE_NC(4, nc_, __VA_ARGS__); break;                                                      \
        case 3: AF_TILE_NC(3, nc_, __VA_ARGS__); break;                                                      \
        case 2: AF_TILE_NC(2, nc_, __VA_ARGS__); break;                                                      \
        default: AF_TILE_NC(1, nc_, __VA_ARGS__); break;                                                     \
        }                                                                                                    \
    } while (0)

/* Few columns (batched decode, speculative verification): no weight is used often enough to pay for the
 * converted buffer, so R rows x NC columns (NC up to AF_NCOLS, all of them) run along whole rows converting
 * the weights in registers, with the same per-(row, column) chains and tail as af_tile. The rows of the next
 * row tile are prefetched, each at the point this tile has reached in its own rows. Columns: for the 16-element
 * steps xh (F16, column c at xh + c * ldxh), for the 8-element steps and the tail xc (F32), the same values. */
#define AF_NROWS 3
#define AF_NCOLS 8
AK_INLINE void af_narrow(const int R, const int NC, int64_t n, const uint8_t *w, size_t ldw, int pf_rows,
                         const float *const *xc, const uint16_t *xh, size_t ldxh, float *s, size_t lds)
{
    __m512 acc[AF_NROWS][AF_NCOLS];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[r][c] = _mm512_setzero_ps();
    const uint8_t *pf = w + (size_t)R * ldw;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if ((i & 31) == 0)
            for (int r = 0; r < pf_rows; r++)
                _mm_prefetch((const char *)(pf + (size_t)r * ldw + (size_t)i * 2), _MM_HINT_T0);
        __m512 wv[AF_NROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + (size_t)r * ldw + (size_t)i * 2)));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m512 x = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(xh + (size_t)c * ldxh + i)));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(wv[r], x, acc[r][c]);
        }
    }
    for (; i < n; i += 8) { /* 8-element steps, then the zero-padded tail: chain 0 only */
        __mmask8 m = n - i >= 8 ? 0xff : (__mmask8)((1u << (n - i)) - 1);
        __m512 wv[AF_NROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm512_castps256_ps512(
                _mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, w + (size_t)r * ldw + (size_t)i * 2)));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m512 x = _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m, xc[c] + i));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_mask3_fmadd_ps(wv[r], x, acc[r][c], 0x00ff);
        }
    }
    af_fold_tile(R, NC, &acc[0][0], AF_NCOLS, s, lds);
}

#define AF_NARROW_NC(R, nc_, ...)                                                                            \
    do {                                                                                                     \
        switch (nc_) {                                                                                       \
        case 8: af_narrow(R, 8, __VA_ARGS__); break;                                                         \
        case 7: af_narrow(R, 7, __VA_ARGS__); break;                                                         \
        case 6: af_narrow(R, 6, __VA_ARGS__); break;                                                         \
        case 5: af_narrow(R, 5, __VA_ARGS__); break;                                                         \
        case 4: af_narrow(R, 4, __VA_ARGS__); break;                                                         \
        case 3: af_narrow(R, 3, __VA_ARGS__); break;                                                         \
        case 2: af_narrow(R, 2, __VA_ARGS__); break;                                                         \
        default: af_narrow(R, 1, __VA_ARGS__); break;                                                        \
        }                                                                                                    \
    } while (0)

static void af_gemm_f16_narrow(int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w, size_t ldw,
                               const uint8_t *x, size_t ldx, const uint16_t *xh, size_t ldxh)
{
    _Static_assert(AF_NROWS == 3 && AF_NCOLS == 8, "af_narrow dispatch");
    const float *xc[AF_NCOLS];
    for (int c = 0; c < nc; c++)
        xc[c] = (const float *)(x + (size_t)c * ldx);
    for (int i = 0; i < nr; i += AF_NROWS) {
        int rows = nr - i < AF_NROWS ? nr - i : AF_NROWS;
        int next = nr - i - rows < AF_NROWS ? nr - i - rows : AF_NROWS;
        const uint8_t *wi = w + (size_t)i * ldw;
        switch (rows) {
        case 3: AF_NARROW_NC(3, nc, n, wi, ldw, next, xc, xh, ldxh, s + i, lds); break;
        case 2: AF_NARROW_NC(2, nc, n, wi, ldw, next, xc, xh, ldxh, s + i, lds); break;
        default: AF_NARROW_NC(1, nc, n, wi, ldw, next, xc, xh, ldxh, s + i, lds); break;
        }
    }
}

/* aux of an F16 gemm column: its whole 16-element groups as F16 (exact: the activations are F16 values, see
 * the top), so the products read half the bytes of the F32 row. Zen 5, one thread, 256 columns, three
 * alternations: n 2048 60-78 -> 67-88 GMAC/s, n 8192 (FFN down, whose columns stream from L3) 51-73 -> 61-80;
 * 8 columns (batched decode) read them from L1 at n 2048. Always at least 32 bytes, so cpu_backend prepares it. */
static size_t af_aux_bytes(int64_t n) { return ((size_t)(n / 16) + 1) * 32; }

static void af_prep(int64_t n, const void *x, void *aux)
{
    const float *f = x;
    uint16_t *h = aux;
    for (int64_t i = 0; i + 16 <= n; i += 16)
        _mm256_store_si256((__m256i *)(h + i), _mm512_cvtps_ph(_mm512_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
}

/* The gemm of more than AF_NCOLS columns in chunks of kc elements (a constant where inlined: the chunk's row
 * stride as a variable cost 1-2%), the converted chunk in wb ([AF_R][kc] floats). */
AK_INLINE void af_gemm_f16_chunks(int64_t kc, float *wb, int64_t n, int nr, int nc, float *s, size_t lds,
                                  const void *w, size_t ldw, const void *x, size_t ldx, const uint16_t *XH,
                                  size_t ldaux)
{
    __m512 ch[AF_JB][AF_R];
    const uint8_t *W = w, *X = x;
    int jb = ak_col_block(AF_XB, ldaux, AF_C, AF_JB);
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int j1 = nc - j0 < jb ? nc : j0 + jb;
        int tiles = (j1 - j0 + AF_C - 1) / AF_C;
        for (int i = 0; i < nr; i += AF_R) {
            int rows = nr - i < AF_R ? nr - i : AF_R;
            for (int64_t k0 = 0; k0 < n; k0 += kc) {
                int64_t k1 = n - k0 < kc ? n : k0 + kc;
                for (int r = 0; r < rows; r++)
                    af_convert((const uint16_t *)(W + (size_t)(i + r) * ldw), k0, k1, wb + r * kc);
                /* The weights of the next chunk (these rows' next elements, or the next tile's first) are
                 * prefetched into L2 a share per column tile: they come from memory, and for long rows (FFN
                 * down, n 8192) waiting for them cost 10-20%. */
                const uint8_t *pf = NULL;
                int pf_rows = 0;
                size_t pf_lines = 0;
                if (k1 < n) {
                    pf = W + (size_t)i * ldw + (size_t)k1 * 2;
                    pf_rows = rows;
                    pf_lines = (size_t)((n - k1 < kc ? n - k1 : kc) * 2 + 63) / 64;
                } else if (i + AF_R < nr) {
                    pf = W + (size_t)(i + AF_R) * ldw;
                    pf_rows = nr - i - AF_R < AF_R ? nr - i - AF_R : AF_R;
                    pf_lines = (size_t)((n < kc ? n : kc) * 2 + 63) / 64;
                }
                size_t pf_per = (pf_lines * (size_t)pf_rows + (size_t)tiles - 1) / (size_t)tiles;
                size_t pf_line = 0; /* the next line to prefetch: line pf_line of row pf_row */
                int pf_row = 0;
                for (int j = j0; j < j1; j += AF_C) {
                    int m = j1 - j < AF_C ? j1 - j : AF_C;
                    for (size_t q = 0; q < pf_per && pf_row < pf_rows; q++) { /* no division per line: it was 4% */
                        _mm_prefetch((const char *)(pf + (size_t)pf_row * ldw + pf_line * 64), _MM_HINT_T1);
                        if (++pf_line == pf_lines)
                            pf_line = 0, pf_row++;
                    }
                    const float *xc[AF_C];
                    const uint16_t *xh[AF_C];
                    for (int c = 0; c < m; c++) {
                        xc[c] = (const float *)(X + (size_t)(j + c) * ldx);
                        xh[c] = XH + (size_t)(j + c) * (ldaux / 2);
                    }
                    AF_TILE(rows, m, n, k0, k1, wb, (size_t)kc, xc, xh, ch + (j - j0), s + (size_t)j * lds + i, lds);
                }
            }
        }
    }
}

static void af_gemm_f16(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw, const void *x,
                        size_t ldx, const void *aux, size_t ldaux)
{
    _Static_assert(AF_C == 4 && AF_R == 6 && AF_KC % 16 == 0 && AF_KC_MAX % 16 == 0, "af_tile dispatch");
    const uint16_t *XH = aux;
    if (nc <= AF_NCOLS) {
        af_gemm_f16_narrow(n, nr, nc, s, lds, w, ldw, x, ldx, XH, ldaux / 2);
        return;
    }
    float wb[AF_R * AF_KC_MAX] __attribute__((aligned(64))); /* 192 KiB of stack; kc x 24 bytes touched */
    if (cpu_f16_gemm_whole_rows())
        af_gemm_f16_chunks(n < AF_KC_MAX ? (n + 15) / 16 * 16 : AF_KC_MAX, wb, n, nr, nc, s, lds, w, ldw, x, ldx, XH,
                           ldaux);
    else
        af_gemm_f16_chunks(AF_KC, wb, n, nr, nc, s, lds, w, ldw, x, ldx, XH, ldaux);
}

/* ---- gemv ---- */

/* The AVX2 F16 gemv (memory-bound already), looked up once: gemv_ops_avx2 runs cpuid, which in a VM traps to
 * the hypervisor and cost half the speed of L2-hot gemv calls when done per call. */
static void (*af_gemv_avx2)(int64_t, int64_t, float *, const void *, size_t, const void *, const void *);

static void af_gemv_f16(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x, const void *aux)
{
    __atomic_load_n(&af_gemv_avx2, __ATOMIC_RELAXED)(n, nr, y, w, ldw, x, aux);
}

/* Decode: weight row pairs [r | r+1] in the two halves against the activation broadcast to both. */
#define AK_GP 2 /* gemv tile: row pairs */

/* vpermw index: 16-bit lane j of half h takes lane h * 16 + (j < 8 ? a : b) of the source. */
AK_INLINE __m512i ak_idx2(int a, int b)
{
    return _mm512_set_epi16(16 + b, 16 + b, 16 + b, 16 + b, 16 + b, 16 + b, 16 + b, 16 + b, 16 + a, 16 + a, 16 + a, 16 + a,
                            16 + a, 16 + a, 16 + a, 16 + a, b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
}

/* Q4_K mins index: lane j of half h takes min j / 2 (int16 lane 8 + j / 2 of the row's [scales | mins]). */
AK_INLINE __m512i ak_q4_k_midx(void)
{
    return _mm512_set_epi16(31, 31, 30, 30, 29, 29, 28, 28, 27, 27, 26, 26, 25, 25, 24, 24, 15, 15, 14, 14, 13, 13, 12, 12,
                            11, 11, 10, 10, 9, 9, 8, 8);
}

/* [8 scales, 8 mins of row a as int16 | the same of row b], unpacked as quant_q4_k_scales8 does but in vector
 * registers (dwords a0 a1 a2 of the 12 bytes: scales 0-3 = a0 & 0x3f.., mins 0-3 = a1 & 0x3f..,
 * scales 4-7 = (a2 & 0x0f..) | (top 2 bits of a0's bytes) << 4, mins 4-7 = (a2 >> 4 & 0x0f..) | (a1's) << 4). */
AK_INLINE __m512i ak_q4_k_scm(const struct block_q4_k *ba, const struct block_q4_k *bb)
{
    /* 16 bytes from each: the 12 scale bytes and 4 of qs (ignored) */
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ba->scales)),
                                        _mm_loadu_si128((const __m128i *)bb->scales), 1);
    __m256i lo = _mm256_srlv_epi32(_mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4));
    lo = _mm256_and_si256(lo, _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f,
                                                0x3f3f3f3f, 0x0f0f0f0f));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi32(_mm256_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                                  _mm256_setr_epi32(0, 0x30303030, 0, 0x30303030, 0, 0x30303030, 0, 0x30303030));
    /* dwords now: scales 0-3, scales 4-7, mins 0-3, mins 4-7 per row */
    return _mm512_cvtepu8_epi16(_mm256_or_si256(lo, hi));
}

/* [f(a) x8 | f(b) x8] and [f(a + 1) x8 | f(b + 1) x8] of the F16 pairs at a and b (d and dmin of a Q4_K
 * block; the conversion is exact, as vec_dot's scalar one). */
AK_INLINE void ak_h2f_pairs(const uint16_t *a, const uint16_t *b, __m512 *f0, __m512 *f1)
{
    uint32_t ua, ub;
    memcpy(&ua, a, 4);
    memcpy(&ub, b, 4);
    __m512 v = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_setr_epi32((int)ua, (int)ub, 0, 0)));
    *f0 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), v);
    *f1 = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), v);
}

/* NP row pairs; row 2p + 1 of the last pair is row 2p again when lone (then y[2p + 1] is not stored). */
AK_INLINE void ak_gv_q4_k(int64_t nb, const int NP, float *y, const uint8_t *w, size_t ldw, int rows,
                          const struct block_q8_k *x)
{
    const size_t bs = sizeof(struct block_q4_k);
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 acc[AK_GP];
    const uint8_t *wr[2 * AK_GP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) {
        acc[p] = _mm512_setzero_ps();
        wr[2 * p] = w + (size_t)(2 * p) * ldw;
        wr[2 * p + 1] = w + (size_t)(2 * p + 1 < rows ? 2 * p + 1 : 2 * p) * ldw;
    }
    for (int64_t b = 0; b < nb; b++) {
        ak_prefetch(w + AK_PF + (size_t)b * (size_t)rows * bs, (size_t)rows * bs);
        const struct block_q8_k *bx = x + b;
        __m512i scm[AK_GP], sumi[AK_GP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            scm[p] = ak_q4_k_scm((const struct block_q4_k *)wr[2 * p] + b, (const struct block_q4_k *)wr[2 * p + 1] + b);
            sumi[p] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i y0 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bx->qs + 64 * k)));
            __m512i y1 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bx->qs + 64 * k + 32)));
            const __m512i ilo = ak_idx2(2 * k, 2 * k), ihi = ak_idx2(2 * k + 1, 2 * k + 1);
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                __m512i raw = ak_pair256(((const struct block_q4_k *)wr[2 * p] + b)->qs + 32 * k,
                                         ((const struct block_q4_k *)wr[2 * p + 1] + b)->qs + 32 * k);
                __m512i lo = _mm512_and_si512(raw, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(lo, y0), _mm512_permutexvar_epi16(ilo, scm[p]));
                sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(hi, y1), _mm512_permutexvar_epi16(ihi, scm[p]));
            }
        }
        __m512i bsums = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)bx->bsums));
        __m512 dx = _mm512_set1_ps(bx->d);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const struct block_q4_k *ba = (const struct block_q4_k *)wr[2 * p] + b, *bb = (const struct block_q4_k *)wr[2 * p + 1] + b;
            __m512i mm = _mm512_madd_epi16(bsums, _mm512_permutexvar_epi16(ak_q4_k_midx(), scm[p]));
            __m512 d, dmin;
            ak_h2f_pairs(&ba->d, &bb->d, &d, &dmin);
            d = _mm512_mul_ps(d, dx);
            dmin = _mm512_mul_ps(dmin, dx);
            acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ak_hsum_halves(sumi[p])), acc[p]);
            acc[p] = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(ak_hsum_halves(mm)), acc[p]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
        ak_store2(acc[p], y + 2 * p, 2 * p + 1 < rows ? y + 2 * p + 1 : NULL);
}

AK_INLINE void ak_gv_q6_k(int64_t nb, const int NP, float *y, const uint8_t *w, size_t ldw, int rows,
                          const struct block_q8_k *x)
{
    const size_t bs = sizeof(struct block_q6_k);
    const __m512i m4 = _mm512_set1_epi8(15), m2h = _mm512_set1_epi8(0x30);
    __m512 acc[AK_GP];
    const uint8_t *wr[2 * AK_GP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) {
        acc[p] = _mm512_setzero_ps();
        wr[2 * p] = w + (size_t)(2 * p) * ldw;
        wr[2 * p + 1] = w + (size_t)(2 * p + 1 < rows ? 2 * p + 1 : 2 * p) * ldw;
    }
    for (int64_t b = 0; b < nb; b++) {
        ak_prefetch(w + AK_PF + (size_t)b * (size_t)rows * bs, (size_t)rows * bs);
        const struct block_q8_k *bx = x + b;
        __m512i sc[AK_GP], sumi[AK_GP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const struct block_q6_k *ba = (const struct block_q6_k *)wr[2 * p] + b, *bb = (const struct block_q6_k *)wr[2 * p + 1] + b;
            sc[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)ba->scales))),
                                       _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)bb->scales)), 1);
            sumi[p] = _mm512_setzero_si512();
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++) {
                __m512i yv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bx->qs + 128 * h + 32 * qt)));
                const __m512i sidx = ak_idx2(8 * h + 2 * qt, 8 * h + 2 * qt + 1);
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++) {
                    const struct block_q6_k *ba = (const struct block_q6_k *)wr[2 * p] + b;
                    const struct block_q6_k *bb = (const struct block_q6_k *)wr[2 * p + 1] + b;
                    __m512i ql = ak_pair256(ba->ql + 64 * h + 32 * (qt & 1), bb->ql + 64 * h + 32 * (qt & 1));
                    __m512i qh = ak_pair256(ba->qh + 32 * h, bb->qh + 32 * h);
                    __m512i lo = qt < 2 ? _mm512_and_si512(ql, m4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                    __m512i hb = qt == 0   ? _mm512_slli_epi16(qh, 4)
                                 : qt == 1 ? _mm512_slli_epi16(qh, 2)
                                 : qt == 2 ? qh
                                           : _mm512_srli_epi16(qh, 2);
                    __m512i q = _mm512_or_si512(lo, _mm512_and_si512(hb, m2h));
                    sumi[p] = _mm512_dpwssd_epi32(sumi[p], _mm512_maddubs_epi16(q, yv), _mm512_permutexvar_epi16(sidx, sc[p]));
                }
            }
        }
        __m512i bsums = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)bx->bsums));
        __m512 dx = _mm512_set1_ps(bx->d);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const struct block_q6_k *ba = (const struct block_q6_k *)wr[2 * p] + b, *bb = (const struct block_q6_k *)wr[2 * p + 1] + b;
            __m512i off = _mm512_madd_epi16(bsums, sc[p]);
            __m512i t = _mm512_sub_epi32(sumi[p], _mm512_slli_epi32(off, 5));
            __m512 d = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_setr_epi16((short)ba->d, (short)bb->d, 0, 0, 0, 0, 0, 0)));
            d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), d);
            acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(ak_hsum_halves(t)), acc[p]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
        ak_store2(acc[p], y + 2 * p, 2 * p + 1 < rows ? y + 2 * p + 1 : NULL);
}

#define AK_GEMV(name, GV)                                                                                    \
    static void ak_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,   \
                               const void *aux)                                                            \
    {                                                                                                      \
        const uint8_t *W = w;                                                                              \
        int64_t nb = n / QK_K, i = 0;                                                                      \
        for (; i + 2 * AK_GP <= nr; i += 2 * AK_GP)                                                        \
            GV(nb, AK_GP, y + i, W + (size_t)i * ldw, ldw, 2 * AK_GP, x);                                  \
        for (; i < nr; i += 2) {                                                                           \
            int rows = nr - i < 2 ? 1 : 2;                                                                 \
            GV(nb, 1, y + i, W + (size_t)i * ldw, ldw, rows, x);                                           \
        }                                                                                                  \
    }

AK_GEMV(q4_k, ak_gv_q4_k)
AK_GEMV(q6_k, ak_gv_q6_k)

/* ---- Q4_K and Q6_K in the R16 layout (quant.h): 16 rows per register ----
 *
 * A zmm of the layout holds one dword of 16 rows: of the scales (three: the 12 packed bytes) or of qs (32).
 * kernels.c's numerics are block sums: per super-block one exact int32 S per (row, column), then one FMA
 * (two for Q4_K's mins). So one register per column holds the block sums of 16 rows, and nothing else is
 * kept per lane:
 *   Q4_K: a sub-block's 32 elements are dword l = 0..7 of its 64-element step k (low nibbles: sub-block 2k,
 *     high: 2k+1); with the activation's dword broadcast, vpdpbusd (unsigned codes 0..15 x signed bytes)
 *     adds 4 products per row into an int32 that sums the sub-block exactly (|sum| <= 32 x 15 x 128), then one
 *     vpmulld by the 16 rows' scale (picked into place from the packed bytes by one vpshufb) adds it to S. The
 *     mins term M = sum_j m_j x bsums of sub-block j comes from 8 vpdpwssd of the rows' (m_j, m_j) against the
 *     activation's bsums pair j.
 *   Q6_K: likewise per 16-element group (4 dwords; codes 0..63 with their +32 offset), scaled by its signed
 *     scale; the offset comes off as 32 x sum_g sc_g x bsums_g (8 vpdpwssd).
 * So a column costs one multiply instruction per 64 products plus one per sub-block, where the 8 partial
 * lanes of the old numerics cost two (maddubs + vpdpwssd) plus a convert and two FMAs per lane and block.
 * vpdpbusd adds in a chain: each column keeps one chain per sub-block (two per step), so the columns of a
 * tile run side by side. */

/* gemm16 tile: columns, at most (AK16_C_Q4_K / AK16_C_Q6_K, which the gemm passes as constants). One core of
 * the Zen 5, a program linking libwafer.a, n 2048 x 512 rows from L2, 8 / 64 columns, GMAC/s: Q4_K 4 columns
 * 270 / 298-306, 6 277-283 / 315-319, 8 294 / 320-330; Q6_K 4 193-197 / 235, 6 189-199 / 241, 8 240-249 /
 * 264-266 (the 8 partial lanes' kernels before: Q4_K 181 / 186-189, Q6_K 160-168 / 189-191). */
#define AK16_C 8
#ifndef AK16_C_Q4_K
#define AK16_C_Q4_K 8
#endif
#ifndef AK16_C_Q6_K
#define AK16_C_Q6_K 8
#endif
/* gemv16 prefetch distance along the stream of groups, into L2. 1B Q4_K_M decode, 2 threads (Zen 5): 2-8 KiB
 * 55-67 tok/s, 16 KiB (AK_PF, which the interleaved gemv uses) 39-41, none 38-42, the interleaved gemv 44-52;
 * one thread in a loop over 150 MB it was 1.1-1.3x the interleaved gemv at 4 and 16 KiB alike. */
#ifndef AK16_PF
#define AK16_PF (4 << 10)
#endif
/* The Q4_K gemv16's distance with the non-temporal hint (the NTA rule of cpu_decode_prefetch; Q6_K keeps AK16_PF).
 * One core of the Zen 5 (`wafer bench --stream q4_k -t 1`, alternated, kernels / plain read): 0.82-0.83 at 2.25 KiB,
 * 0.89 at 4, 0.92 at 6, 0.92-0.96 at 8, 0.88-0.92 at 10, 0.84-0.89 at 12; T1 at 8 KiB 0.86, at 4 0.81-0.87. Q6_K
 * with the hint 0.92 at 4 KiB, 0.88-0.91 at 8 (stop 39). */
#define AK16_PF_NTA_Q4_K (8 << 10)
/* How the gemv16 prefetch on Zen 4 (AMD family 0x19 with AVX-512; the SPARSE rule of cpu_decode_prefetch). Q4_K not
 * at all: 2 threads over the 1B model's matrices from memory ran 1.12-1.16x faster without (T0 instead of T1:
 * 0.99-1.02x; stop 24), and the sparse prefetch Q4_0 and Q8_0 take there (gemv_avx512q.c), one line per 576 bytes 16
 * KiB ahead, was no faster than none (0.98-1.01x in six runs, stop 25). Q6_K, read in its stored order since stop 26
 * (ak16_block_q6_k_1), one line per AK16_PF_SPARSE bytes: one thread (`wafer bench --stream q6_k -t 1`, shares of a
 * plain read) 0.73-0.86 with one line per 576 or 1,152 bytes 4-8 KiB ahead, 0.78-0.81 with none, 0.70 with every
 * line; 2 threads 0.96-1.01, 0.93-0.99, 0.92-0.94 (the GGUF order had needed every line: 0.44-0.46x without).
 * Elsewhere both prefetch every line, as measured on the Zen 5 (again in stop 32, with WAFER_GEMV_PREFETCH=every /
 * sparse alternated, kernels over a plain read: Q4_K 1.06-1.17 / 0.59-0.66, Q6_K 1.00-1.05 / 0.44-0.57). */
#define AK16_PF_SPARSE 576
/* The Q4_K gemv16 under the SPREAD rule (built in on Intel; the TWIN rule's prefetch too): its block's lines
 * AK16_PF ahead asked for one beside each load of the block's kernel, as the gemm does (ak16_tile), instead of all
 * 36 at the block's start; into L1 until stop 49, into L2 since on Intel (cpu_kquant_spread_l2; ak16_tile has the
 * figures). On the Intel Xeon family 6 model 207 (stop 43, 2 threads,
 * builds alternated): `wafer bench --tune --tune-types q4_k`, kernels / plain read, 0.96-1.00 against
 * 0.91-0.99; 1B Q4_K_M tg64 40.3-42.0 tokens/s against 36.8-39.6 in 6 of 7 pairs (85-93% of the probes beside
 * against 81-90%). On the Zen 5 it read slower than NTA (0.86-0.93 against 0.91-1.00, stop 42), so it is a
 * rule of its own. Q6_K's lone column takes it too since stop 44 (ak16_block_q6_k_1: 4 of the block's 53 lines at
 * each of its 16 steps): on the same Xeon `--tune --tune-types q6_k` 1.02-1.03x EVERY in four runs of 10-16 rounds,
 * and 1B Q4_K_M decode, whose Q6_K matrices are a quarter of its bytes, level (40.4-41.7 against 38.2-41.9
 * tokens/s, 4 pairs through tune files); built in on Intel since stop 48 (ahead in 6 of 6 decode pairs). */

/* [s, s] int16 per dword: byte j (0-3) of each dword of v (each byte below 64), zero-extended. */
AK_INLINE __m512i ak16_pick(__m512i v, int j)
{
    const __m512i off = _mm512_set4_epi32(0x000c000c, 0x00080008, 0x00040004, 0);
    __m512i c = _mm512_add_epi32(_mm512_set1_epi32((int)(0x80008000u | (uint32_t)j * 0x10001u)), off);
    return _mm512_shuffle_epi8(v, c);
}

/* Byte j (0-3) of each dword of v as an int32: zero-extended, or sign-extended when is_signed. */
AK_INLINE __m512i ak16_pick32(__m512i v, int j, const int is_signed)
{
    if (!is_signed) {
        const __m512i off = _mm512_set4_epi32((int)0x8080800c, (int)0x80808008, (int)0x80808004, (int)0x80808000);
        return _mm512_shuffle_epi8(v, _mm512_add_epi32(_mm512_set1_epi32(j), off));
    }
    const __m512i off = _mm512_set4_epi32(0x0c808080, 0x08808080, 0x04808080, 0x00808080);
    return _mm512_srai_epi32(_mm512_shuffle_epi8(v, _mm512_add_epi32(_mm512_set1_epi32(j << 24), off)), 24);
}

/* The sub-block scales (sc) and mins (mn) of 16 rows of a Q4_K block from its 12 packed bytes (a0, a1, a2: the
 * R16 dwords): sc0-3 = a0 & 63, sc4-7 = a2 & 15 | a0's top bits << 4, mn0-3 = a1 & 63, mn4-7 = a2 >> 4 & 15 |
 * a1's top bits << 4 (byte j of each dword: sub-block j in [0], j + 4 in [1]). Two helpers, so each kernel
 * unpacks the mins where it needs them. Ternary 0xf8: first | (second & third). */
AK_INLINE void ak16_q4_k_sc(__m512i a0, __m512i a2, __m512i sc[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), m6 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
    sc[0] = _mm512_and_si512(a0, m6);
    sc[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(a2, m4), _mm512_srli_epi32(a0, 2), m30, 0xf8);
}

AK_INLINE void ak16_q4_k_mn(__m512i a1, __m512i a2, __m512i mn[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), m6 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
    mn[0] = _mm512_and_si512(a1, m6);
    mn[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(a2, 4), m4), _mm512_srli_epi32(a1, 2), m30, 0xf8);
}

/* Line i of a block's gb bytes at pf (the same block of the next group, or the gemv's SPREAD rule's block ahead),
 * with hint (GEMV_PF_T0 or GEMV_PF_T1, a constant: cpu_kquant_spread_l2), if the block has it and pf is not
 * NULL: the prefetch spread one line beside each load of the block's kernel (see ak16_tile). */
AK_INLINE void ak16_prefetch_line(const uint8_t *pf, int i, size_t gb, const int hint)
{
    if (pf && (size_t)i * 64 < gb)
        gemv_prefetch_line(pf + (size_t)i * 64, hint);
}

/* Quarter k (64 elements: sub-blocks 2k, the low nibbles, and 2k+1, the high) of a Q4_K block of 16 rows (its
 * R16 dwords at qd, their sub-block scales sc from ak16_q4_k_sc) against NC columns' blocks bx[c]: S[c] gets 16
 * times the quarter's two int32 sums times their scales. Times 16 because vpdpbusd takes the high nibbles where
 * they lie (byte & 0xf0, 16 x the nibble; no saturation in its 4-product sums) instead of shifted down, one
 * operation less per load, on the one port that shifts on Intel, and the low nibbles' scale is multiplied by 16
 * to match (a block's 16 x S is at most 16 x 8 x 63 x 32 x 15 x 128 < 2^30; ak16_q4_k_end shifts it back,
 * exactly). One core of the Xeon family 6 model 207, the lone column from L2: 48 -> 41 ns a block of 16 rows.
 * pf: the next group's block, prefetched one line per load with hint (ak16_prefetch_line), or NULL. */
AK_INLINE void ak16_q4_k_quarter(const uint8_t *qd, int k, const int NC, const struct block_q8_k *const *bx,
                                 const __m512i sc[2], __m512i S[], const uint8_t *pf, const int hint)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const uint8_t *q = qd + 3 * 64; /* after the scales' 3 dwords */
    __m512i t0[AK16_C], t1[AK16_C];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
        t0[c] = t1[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++) {
        ak16_prefetch_line(pf, 8 * k + l, 16 * sizeof(struct block_q4_k), hint);
        ak16_prefetch_line(pf, 32 + 8 * k + l, 16 * sizeof(struct block_q4_k), hint);
        __m512i raw = _mm512_loadu_si512(q + 64 * (8 * k + l));
        __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_andnot_si512(m4, raw); /* 16 x the high nibbles */
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            int32_t y0, y1;
            memcpy(&y0, bx[c]->qs + 64 * k + 4 * l, 4);
            memcpy(&y1, bx[c]->qs + 64 * k + 32 + 4 * l, 4);
            t0[c] = _mm512_dpbusd_epi32(t0[c], lo, _mm512_set1_epi32(y0));
            t1[c] = _mm512_dpbusd_epi32(t1[c], hi, _mm512_set1_epi32(y1));
        }
    }
    /* the low nibbles' scale times 16, as the high nibbles come times 16: S[c] gets 16 x the quarter's sum */
    __m512i slo = _mm512_slli_epi32(ak16_pick32(sc[k >> 1], (2 * k) & 3, 0), 4);
    __m512i shi = ak16_pick32(sc[k >> 1], (2 * k + 1) & 3, 0);
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        S[c] = _mm512_add_epi32(S[c], _mm512_add_epi32(_mm512_mullo_epi32(t0[c], slo), _mm512_mullo_epi32(t1[c], shi)));
        SIMD_KEEP(S[c]); /* else GCC regroups the adds to the end of the block, with every t live: spills */
    }
}

/* The end of a Q4_K block of 16 rows (its R16 scales at hs, dwords at qd) for NC columns: the mins against the
 * activation's bsums, and kernels.c's two FMAs of the block's sums into acc[c] (16 rows' floats); S[c] holds 16
 * times those sums (ak16_q4_k_quarter). */
AK_INLINE void ak16_q4_k_end(const uint8_t *hs, const uint8_t *qd, const int NC, const struct block_q8_k *const *bx,
                             const __m512i *S, __m512 acc[])
{
    __m512i mn[2];
    ak16_q4_k_mn(_mm512_loadu_si512(qd + 64), _mm512_loadu_si512(qd + 128), mn);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs));
    __m512 dmw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(hs + 32)));
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            int32_t bs;
            memcpy(&bs, bx[c]->bsums + 2 * j, 4);
            M = _mm512_dpwssd_epi32(M, ak16_pick(mn[j >> 2], j & 3), _mm512_set1_epi32(bs));
        }
        __m512 dx = _mm512_set1_ps(bx[c]->d);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(S[c], 4)), _mm512_mul_ps(dw, dx), acc[c]);
        acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(dmw, dx), acc[c]);
    }
}

/* One Q4_K block of 16 rows (its R16 scales at hs, dwords at qd) against NC columns' blocks bx[c]:
 * acc[c] (16 rows' floats) gets kernels.c's two FMAs of the block; pf, hint as ak16_q4_k_quarter. */
AK_INLINE void ak16_block_q4_k(const uint8_t *hs, const uint8_t *qd, const int NC, const struct block_q8_k *const *bx,
                               __m512 acc[], const uint8_t *pf, const int hint)
{
    __m512i sc[2], S[AK16_C];
    ak16_q4_k_sc(_mm512_loadu_si512(qd), _mm512_loadu_si512(qd + 128), sc);
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
        S[c] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        ak16_q4_k_quarter(qd, k, NC, bx, sc, S, pf, hint);
    ak16_q4_k_end(hs, qd, NC, bx, S, acc);
}

/* [s, s'] int16 per dword: bytes j and k (0-3) of each dword of v, sign-extended (the Q6_K scales are int8). */
AK_INLINE __m512i ak16_pick_s8(__m512i v, int j, int k)
{
    const __m512i off = _mm512_set4_epi32(0x0c000c00, 0x08000800, 0x04000400, 0);
    __m512i c = _mm512_add_epi32(_mm512_set1_epi32((int)(0x00800080u | (uint32_t)j << 8 | (uint32_t)k << 24)), off);
    return _mm512_srai_epi16(_mm512_shuffle_epi8(v, c), 8);
}

/* A Q6_K block's end for NC columns (its R16 scales at hs, dwords at q): S[c] (16 rows' sums of codes 0..63
 * times the activation) less the codes' +32, 32 x sum_g scale_g x bsums_g, then kernels.c's FMA into acc[c]. */
AK_INLINE void ak16_q6_k_end(const uint8_t *hs, const uint8_t *q, const int NC, const struct block_q8_k *const *bx,
                             const __m512i *S, __m512 *acc)
{
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs));
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        __m512i off = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            int32_t bs;
            memcpy(&bs, bx[c]->bsums + 2 * l, 4);
            __m512i sp = ak16_pick_s8(_mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(48 + (l >> 1))), (2 * l) & 3,
                                      (2 * l + 1) & 3);
            off = _mm512_dpwssd_epi32(off, sp, _mm512_set1_epi32(bs));
        }
        __m512i t = _mm512_sub_epi32(S[c], _mm512_slli_epi32(off, 5));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, _mm512_set1_ps(bx[c]->d)), acc[c]);
    }
}

/* Code 3 of R16's Q6_K triple (a, b, c) (quant.h): its bits 0-1, 2-3, 4-5 are the top two of a, b, c, moved
 * down by 16-bit shifts (the bits a shift brings in from the byte above are masked off). Ternary 0xf8:
 * first | (second & third). Codes 0-2 are the triple's low 6 bits, an AND each. On the Xeon (family 6 model
 * 207; both its 512-bit ports take vpdpbusd, so the operations' count decides, and shifts only one), one core,
 * the lone-column kernel over 256 rows x 2048 from L2: 89-90 ns a block of 16 rows with GGUF's nibbles and
 * 2-bit fields (13 operations for the four codes), 76 with these (3 + 6); 2 threads from memory (`wafer bench
 * --stream q6_k -t 2`, three pairs): kernels / plain read 0.94 -> 0.96-1.01, the 8-column gemm level
 * (0.73-0.74); 1B Q6_K tg64 29.2 -> 30.5, 30.0 -> 30.8 tokens/s in steady minutes; 1B Q4_K_M, a quarter of
 * whose bytes are Q6_K, ahead in 5 of 6 pairs, 84-91% of the probes beside (median 88.5%) against 83-89% (85%). */
AK_INLINE __m512i ak16_q6_k_code3(__m512i a, __m512i b, __m512i c)
{
    __m512i v = _mm512_and_si512(_mm512_srli_epi16(a, 6), _mm512_set1_epi8(3));
    v = _mm512_ternarylogic_epi32(v, _mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0c), 0xf8);
    return _mm512_ternarylogic_epi32(v, _mm512_srli_epi16(c, 2), _mm512_set1_epi8(0x30), 0xf8);
}

/* One Q6_K block, as ak16_block_q4_k: step (h, qt) is 32 elements, the codes of R16's triple (ql's dwords
 * 16h + l and 16h + 8 + l, qh's 32 + 8h + l: code qt, quant.h) against the activation's bytes 128h + 32qt + 4l..;
 * dwords 0-3 are group 8h + 2qt (its scale), 4-7 group 8h + 2qt + 1. The codes' +32 comes off per block as
 * 32 x sum_g scale_g x bsums_g. Its R16 scales at hs, dwords at q_ (q_ + 64k: dword k of the 16 rows). */
AK_INLINE void ak16_block_q6_k(const uint8_t *hs, const uint8_t *q_, const int NC, const struct block_q8_k *const *bx,
                               __m512 acc[], const uint8_t *pf, const int hint)
{
    const __m512i m6 = _mm512_set1_epi8(63);
    __m512i S[AK16_C];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
        S[c] = _mm512_setzero_si512();
#pragma GCC unroll 2 /* so quant_r16_q6_k_dword's places are constants: a lookup per load cost the gemm 1.3x */
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
        for (int qt = 0; qt < 4; qt++) {
            /* A pointer GCC cannot see through: else it keeps the ql / qh loads of quarter 0 live for
             * quarters 1-3 (the same addresses), which spilled dozens of registers per block. */
            const uint8_t *q = q_;
            __asm__("" : "+r"(q));
            /* scales 8h + 4(qt >> 1).. */
            __m512i sd = _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(48 + 2 * h + (qt >> 1)));
#pragma GCC unroll 2
            for (int gi = 0; gi < 2; gi++) { /* the group of dwords 4gi..4gi+3, scale 8h + 2qt + gi */
                __m512i t[AK16_C];
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++)
                    t[c] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int l = 4 * gi; l < 4 * gi + 4; l++) {
                    ak16_prefetch_line(pf, 32 * h + 8 * qt + l, 16 * sizeof(struct block_q6_k), hint);
                    const size_t k[3] = {16 * h + l, 16 * h + 8 + l, 32 + 8 * h + l}; /* the triple's dwords */
                    __m512i qv; /* 0..63 */
                    if (qt < 3)
                        qv = _mm512_and_si512(_mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(k[qt])), m6);
                    else
                        qv = ak16_q6_k_code3(_mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(k[0])),
                                             _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(k[1])),
                                             _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(k[2])));
#pragma GCC unroll 8
                    for (int c = 0; c < NC; c++) {
                        int32_t yv;
                        memcpy(&yv, bx[c]->qs + 128 * h + 32 * qt + 4 * l, 4);
                        t[c] = _mm512_dpbusd_epi32(t[c], qv, _mm512_set1_epi32(yv));
                    }
                }
                __m512i sg = ak16_pick32(sd, (2 * qt + gi) & 3, 1);
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) {
                    S[c] = _mm512_add_epi32(S[c], _mm512_mullo_epi32(t[c], sg));
                    SIMD_KEEP(S[c]);
                }
            }
        }
    }
    ak16_q6_k_end(hs, q_, NC, bx, S, acc);
}

/* One Q6_K block against one column (decode), as ak16_block_q6_k but reading the block once in its stored
 * order (quant_r16_q6_k_dword): per half h and sub-group gi, each step l loads the triple (ql's dwords 16h + l
 * and 16h + 8 + l, qh's 32 + 8h + l) once and feeds all four quarters qt from it, one vpdpbusd chain per
 * quarter. The same exact int32 products go into S per group (8h + 2qt + gi), so the bits equal
 * ak16_block_q6_k's, which reads the triple's dwords a quarter after another. pf: the block at the
 * decode's distance ahead, 4 of its lines prefetched with hint at each of the 16 steps (the SPREAD rule), or
 * NULL. */
AK_INLINE void ak16_block_q6_k_1(const uint8_t *hs, const uint8_t *q, const struct block_q8_k *bx, __m512 *acc,
                                  const uint8_t *pf, const int hint)
{
    const __m512i m6 = _mm512_set1_epi8(63);
    __m512i S = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        /* scales 8h.. (quarters 0, 1) and 8h + 4.. (quarters 2, 3) */
        __m512i sd0 = _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(48 + 2 * h));
        __m512i sd1 = _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(49 + 2 * h));
#pragma GCC unroll 2
        for (int gi = 0; gi < 2; gi++) {
            __m512i t[4];
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++)
                t[qt] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int l = 4 * gi; l < 4 * gi + 4; l++) {
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) /* 16 steps of 3 loads, 4 of the block's 53 lines each */
                    ak16_prefetch_line(pf, 4 * (8 * h + l) + i, 16 * sizeof(struct block_q6_k), hint);
                __m512i qa = _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(16 * h + l));
                __m512i qb = _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(16 * h + 8 + l));
                __m512i qc = _mm512_loadu_si512(q + 64 * quant_r16_q6_k_dword(32 + 8 * h + l));
                __m512i qv[4] = {_mm512_and_si512(qa, m6), _mm512_and_si512(qb, m6), _mm512_and_si512(qc, m6),
                                 ak16_q6_k_code3(qa, qb, qc)};
#pragma GCC unroll 4
                for (int qt = 0; qt < 4; qt++) {
                    int32_t yv;
                    memcpy(&yv, bx->qs + 128 * h + 32 * qt + 4 * l, 4);
                    t[qt] = _mm512_dpbusd_epi32(t[qt], qv[qt], _mm512_set1_epi32(yv));
                }
            }
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++)
                S = _mm512_add_epi32(S,
                                     _mm512_mullo_epi32(t[qt], ak16_pick32(qt < 2 ? sd0 : sd1, (2 * qt + gi) & 3, 1)));
        }
    }
    ak16_q6_k_end(hs, q, 1, &bx, &S, acc);
}

/* One Q4_K block of each of two groups of 16 rows (the TWIN rule: their R16 scales at hs[i], dwords at qd[i])
 * against one column bx, side by side: a quarter of the block (64 elements, 8 lines) of one group, then of the
 * other, so the core reads two streams 512 bytes at a time. Per group ak16_block_q4_k's steps with NC 1, so the
 * same bits. pf[i]: group i's block at the decode's distance ahead, prefetched as the
 * SPREAD rule does (a line beside each load, with hint). acc[i]: group i's 16 rows. */
AK_INLINE void ak16_block_q4_k_twin(const uint8_t *const *hs, const uint8_t *const *qd, const struct block_q8_k *bx,
                                    __m512 acc[2], const uint8_t *const *pf, const int hint)
{
    __m512i sc[2][2], S[2][1];
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        ak16_q4_k_sc(_mm512_loadu_si512(qd[g]), _mm512_loadu_si512(qd[g] + 128), sc[g]);
        S[g][0] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++)
            ak16_q4_k_quarter(qd[g], k, 1, &bx, sc[g], S[g], pf[g], hint);
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++)
        ak16_q4_k_end(hs[g], qd[g], 1, &bx, S[g], &acc[g]);
}

/* The Q4_K decode gemv of two groups of nb blocks (16 rows each at g[i], into y[i]) against the Q8_K row x,
 * side by side (ak16_block_q4_k_twin), prefetching AK16_PF ahead with hint (the spread's). */
AK_INLINE void ak16_gemv_q4_k_twin(int64_t nb, float *const *y, const uint8_t *const *g, const uint8_t *x,
                                   const int hint)
{
    const size_t gb = 16 * sizeof(struct block_q4_k);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *hs[2], *qd[2], *pf[2];
        for (int i = 0; i < 2; i++) {
            hs[i] = g[i] + quant_r16_scales(2, 35, nb, b);
            qd[i] = g[i] + quant_r16_dwords(2, 35, nb, b);
            pf[i] = g[i] + AK16_PF + (size_t)b * gb;
        }
        ak16_block_q4_k_twin(hs, qd, (const struct block_q8_k *)x + b, acc, pf, hint);
    }
    _mm512_storeu_ps(y[0], acc[0]);
    _mm512_storeu_ps(y[1], acc[1]);
}

/* 16 rows of type Q4_K or Q6_K (is_q6; the group at g) x NC columns (Q8_K rows ldx bytes apart):
 * s[c * lds + r] for r < 16. nxt: memory prefetched as far along as the group is read (gemm: the next group;
 * gemv: AK16_PF or AK16_PF_NTA_Q4_K bytes ahead), or NULL; one line every pfs bytes of it at each block's start
 * (64: every line; prefetchnta when nta, see gemv_prefetch_line),
 * or with pfs 0 (the gemm, and the gemv's SPREAD rule) every line spread over the block's loads, one beside each,
 * with hint (T0 or T1, cpu_kquant_spread_l2; at the block's start: T1 or NTA). Why spread:
 * a block's 36 (Q4_K) or 53 (Q6_K) prefetches issued together take the core's misses in flight for as long
 * as memory takes, and the tile's own loads queue behind them; the gemv's one column computes too little per
 * block for that to matter, the gemm's 8 columns enough to keep memory and arithmetic apart. Batched decode,
 * Zen 5, 2 threads, 8 columns over a 1B model's matrices from memory (`wafer bench --stream q4_k -b 8 -t 2`,
 * three rounds, before / after alternated): Q4_K 214-332 -> 334-443 GMAC/s (kernels / plain read 0.48-0.70 ->
 * 0.69-0.77), Q6_K 118-158 -> 195-253 (0.34-0.36 -> 0.56-0.61); 1B Q4_K_M tg64 x8 181-198 -> 269-287
 * tokens/s, pp512 334-353 -> 382-390. Why T0 (L1) and not T1 (L2) as everywhere else: with both cores
 * streaming (`--stream -b 8 -t 2`, four rounds, the two builds alternated) Q4_K 308-363 -> 387-430 GMAC/s,
 * Q6_K 239-289 -> 270-310; 1B Q4_K_M tg64 x8 262-289 -> 295-299 tokens/s. One thread alone (8 columns against
 * one matrix from memory in a loop) measured no difference between the two builds (Q4_K 185-247 / 217-238,
 * Q6_K 130-182 / 151-175; the same tile on 256 rows that stay in L2: 315-344, 278-280), and a build that
 * picked the hint at run time ran T0 at 1.3-1.5x its own T1 there: how the code falls, not the hint alone,
 * decides what one thread gets, which is left open. One group (18-107 KiB) ahead measured as well as or
 * better than 4-32 KiB. The AVX2 K-quant gemm keeps T1 (its run-time-hint build: Q6_K 1.25x with T0, Q4_K
 * at n 2048 0.8x), and so do the Q4_0 / Q8_0 gemm (mixed, 0.85-1.26x). (stop 33) Not prefetchnta, which the
 * Zen 5's gemv takes (the NTA rule): one core, `--stream q4_k -b 8 -t 1`, the hint chosen at run time in
 * two builds whose code differed only around that choice: NTA 331-337 GMAC/s, T1 318-324, T0 255-264 in
 * one; T0 363-366, NTA 283-291 in the other; this build's T0 291-293. How the tile's code falls (its spills
 * moved by a third between the builds) decides again, and an NTA line, in L1 only, is lost if the tile has
 * not reached it before L1 drops it, a group (18-74 KiB) later (stop 39). On the Intel Xeon family 6 model 207
 * (stop 49) L2 is first, for the 8-column gemm of batched decode and the gemv alike: `wafer bench --stream TYPE
 * -t 2 -b 8`, GMAC/s from memory, T0 / T1 alternated, Q4_K 260-275 / 291-310, Q6_K 192-203 / 209-213; the gemv
 * (`--stream q4_k -t 2`, kernels / plain read) 0.97-1.05 / 1.05-1.08; 1B Q4_K_M tg64 (`wafer bench -p 0 -n 64
 * -r 2 -t 2 --batch 8`, 4 pairs) 43.1-44.0 / 45.4-46.3 tokens/s (87-88% / 92-94% of the probes beside), 8
 * sequences 223.8-225.8 / 240.8-244.5; prefill (many column tiles) the other way, pp512 301.7-304.7 / 293.8-297.6,
 * so there the gemm keeps T0 (AK16_GEMM_FNS). So the hint is the CPU's (cpu_kquant_spread_l2): L2 on Intel, L1 on
 * AMD, whose Zen 5 measured T0 first above. */
AK_INLINE void ak16_tile(const int is_q6, int64_t nb, const int NC, float *s, size_t lds, const uint8_t *g,
                         const uint8_t *x, size_t ldx, const uint8_t *nxt, const size_t pfs, const int hint)
{
    const size_t gb = 16 * (is_q6 ? sizeof(struct block_q6_k) : sizeof(struct block_q4_k));
    __m512 acc[AK16_C];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        /* spread over the block's kernel */
        const uint8_t *pfb = nxt && !pfs ? nxt + (size_t)b * gb : NULL;
        if (nxt && !pfb)
            for (size_t i = 0; i < gb; i += pfs ? pfs : 64)
                gemv_prefetch_line(nxt + (size_t)b * gb + i, hint);
        const struct block_q8_k *bx[AK16_C];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            bx[c] = (const struct block_q8_k *)(x + (size_t)c * ldx) + b;
        const size_t nh = is_q6 ? 1 : 2, nd = is_q6 ? 52 : 35;
        const uint8_t *hs = g + quant_r16_scales(nh, nd, nb, b), *qd = g + quant_r16_dwords(nh, nd, nb, b);
        if (is_q6 && NC == 1)
            ak16_block_q6_k_1(hs, qd, bx[0], acc, pfb, hint);
        else if (is_q6)
            ak16_block_q6_k(hs, qd, NC, bx, acc, pfb, hint);
        else
            ak16_block_q4_k(hs, qd, NC, bx, acc, pfb, hint);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++)
        _mm512_storeu_ps(s + (size_t)c * lds, acc[c]);
}

/* ak16_tile with NC (1 .. C - 1, the last columns of a cache block) as a constant, so the accumulators stay in
 * registers. */
AK_INLINE void ak16_tile_tail(const int is_q6, const int C, int NC, int64_t nb, float *s, size_t lds,
                              const uint8_t *g, const uint8_t *x, size_t ldx, const uint8_t *nxt, const int hint)
{
#define AK16_TAIL(k)                                                                                       \
    case k:                                                                                                \
        if (C > k)                                                                                         \
            ak16_tile(is_q6, nb, k < C ? k : 1, s, lds, g, x, ldx, nxt, 0, hint);                          \
        break;
    switch (NC) {
        AK16_TAIL(7) AK16_TAIL(6) AK16_TAIL(5) AK16_TAIL(4) AK16_TAIL(3) AK16_TAIL(2) AK16_TAIL(1)
    default: break;
    }
#undef AK16_TAIL
}

/* gemm16 of a K-quant (is_q6: Q6_K, else Q4_K): tiles of C columns (C <= AK16_C). */
AK_INLINE void ak16_gemm(const int is_q6, const int C, int64_t n, int nr, int nc, float *s, size_t lds,
                         const uint8_t *W, const uint8_t *X, size_t ldx, const int hint)
{
    int64_t nb = n / QK_K;
    size_t gbytes = (size_t)nb * 16 * (is_q6 ? sizeof(struct block_q6_k) : sizeof(struct block_q4_k));
    int jb = ak_col_block(AK_XB, ldx, C, 1 << 20);
    gemm_prefetch_first(W, gbytes);
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int j1 = nc - j0 < jb ? nc : j0 + jb;
        for (int i = 0; i < nr; i += 16) {
            const uint8_t *g = W + (size_t)(i / 16) * gbytes, *nxt = i + 16 < nr ? g + gbytes : NULL;
            int j = j0;
            for (; j + C <= j1; j += C)
                ak16_tile(is_q6, nb, C, s + (size_t)j * lds + i, lds, g, X + (size_t)j * ldx, ldx,
                          j + 2 * C > j1 ? nxt : NULL, 0, hint);
            if (j < j1)
                ak16_tile_tail(is_q6, C, j1 - j, nb, s + (size_t)j * lds + i, lds, g, X + (size_t)j * ldx, ldx,
                               j == j0 ? nxt : NULL, hint);
        }
    }
}

/* gemv16 of a K-quant: one column. Q4_K under the TWIN rule: group i beside group i + h (h: half the call's
 * groups, rounded up), as the Q4_0 gemv does (gemv_avx512q.c aq16_gemv; decode claims 2 MiB at a time under
 * it, cpu_backend.c), a quarter block of each in turn. On the Xeon family 6 model 207 (stop 45) that reads
 * faster than one stream (`wafer bench --stream q4_k -t 2`, kernels / plain read 1.02-1.04 against 0.96-0.97
 * with SPREAD; a whole block, 2,304 bytes, of each in turn had given 1.01-1.03 in stop 44; `--tune`: 1.00
 * against spread's 0.97), but 1B Q4_K_M decode could not tell the two apart: faster in 10 of 19 pairs through
 * tune files (tg64 and tg128, 34.9-42.8 tokens/s either way, 83-101% of the probes beside against 85-100%),
 * after 8 of 11 with a switch in one build. So a `--tune` candidate; SPREAD stays built in. */
#define AK16_GEMV(name, IS_Q6, BS)                                                                         \
    static void ak16_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, const void *x, const void *aux) \
    {                                                                                                      \
        int64_t nb = n / QK_K, ng = nr / 16;                                                               \
        size_t gbytes = (size_t)nb * 16 * (BS);                                                            \
        enum cpu_prefetch rule = cpu_decode_prefetch(IS_Q6 ? DTYPE_Q6_K : DTYPE_Q4_K);                      \
        bool sparse = rule == CPU_PREFETCH_SPARSE, pf = IS_Q6 || !sparse, nta = rule == CPU_PREFETCH_NTA;   \
        bool spread = rule == CPU_PREFETCH_SPREAD || rule == CPU_PREFETCH_TWIN; /* pfs 0: ak16_tile spreads */ \
        size_t pfs = sparse ? AK16_PF_SPARSE : spread ? 0 : 64;                                            \
        size_t ahead = nta && !IS_Q6 ? AK16_PF_NTA_Q4_K : AK16_PF;                                         \
        const bool l2 = cpu_kquant_spread_l2(); /* the spread's hint */                                   \
        int64_t i0 = 0;                                                                                    \
        if (!IS_Q6 && rule == CPU_PREFETCH_TWIN && ng >= 2) {                                              \
            int64_t h = (ng + 1) / 2;                                                                      \
            for (int64_t i = 0; i + h < ng; i++) {                                                         \
                float *ys[2] = {y + i * 16, y + (i + h) * 16};                                             \
                const uint8_t *gs[2] = {(const uint8_t *)w + (size_t)i * gbytes,                          \
                                        (const uint8_t *)w + (size_t)(i + h) * gbytes};                    \
                if (l2)                                                                                    \
                    ak16_gemv_q4_k_twin(nb, ys, gs, x, GEMV_PF_T1);                                        \
                else                                                                                       \
                    ak16_gemv_q4_k_twin(nb, ys, gs, x, GEMV_PF_T0);                                        \
            }                                                                                              \
            i0 = ng - h; /* an odd count's middle group, alone below */                                    \
            ng = h;                                                                                        \
        }                                                                                                  \
        for (int64_t i = 16 * i0; i < 16 * ng; i += 16) {                                                  \
            const uint8_t *g = (const uint8_t *)w + (size_t)(i / 16) * gbytes;                             \
            if (nta) /* a call per hint so that each inlined loop has its prefetch fixed */                \
                ak16_tile(IS_Q6, nb, 1, y + i, 0, g, x, 0, g + ahead, pfs, GEMV_PF_NTA);                   \
            else if (spread && !l2)                                                                        \
                ak16_tile(IS_Q6, nb, 1, y + i, 0, g, x, 0, g + ahead, pfs, GEMV_PF_T0);                    \
            else                                                                                           \
                ak16_tile(IS_Q6, nb, 1, y + i, 0, g, x, 0, pf ? g + ahead : NULL, pfs, GEMV_PF_T1);        \
        }                                                                                                  \
    }

AK16_GEMV(q4_k, 0, sizeof(struct block_q4_k))
AK16_GEMV(q6_k, 1, sizeof(struct block_q6_k))

/* The K-quant gemm16s, a function per spread hint (cpu_kquant_spread_l2; each its own code, the L1 one the same
 * as before there were two: inlined side by side into one function, the L1 instance ran 1B Q4_K_M pp512 1-3.5%
 * slower on the Xeon family 6 model 207). The hint into L2 only where one tile of columns reads each group
 * (batched decode of up to 8 sequences): prefill, whose last column tile asks for the next group just before the
 * first reads it, measured 1B Q4_K_M pp512 293.8-297.6 tokens/s with it, 301.7-304.7 into L1 (same Xeon). */
#define AK16_GEMM_FNS(name, IS_Q6, C)                                                                      \
    static __attribute__((noinline)) void ak16_gemm_##name##_l1(int64_t n, int nr, int nc, float *s, size_t lds, \
                                                               const void *w, const void *x, size_t ldx)    \
    {                                                                                                      \
        ak16_gemm(IS_Q6, C, n, nr, nc, s, lds, w, x, ldx, GEMV_PF_T0);                                     \
    }                                                                                                      \
    static __attribute__((noinline)) void ak16_gemm_##name##_l2(int64_t n, int nr, int nc, float *s, size_t lds, \
                                                               const void *w, const void *x, size_t ldx)    \
    {                                                                                                      \
        ak16_gemm(IS_Q6, C, n, nr, nc, s, lds, w, x, ldx, GEMV_PF_T1);                                     \
    }                                                                                                      \
    static void ak16_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, const void *x, \
                                 size_t ldx, const void *aux, size_t ldaux, void *scratch)                 \
    {                                                                                                      \
        if (nc <= (C) && cpu_kquant_spread_l2())                                                           \
            ak16_gemm_##name##_l2(n, nr, nc, s, lds, w, x, ldx);                                           \
        else                                                                                               \
            ak16_gemm_##name##_l1(n, nr, nc, s, lds, w, x, ldx);                                           \
    }

AK16_GEMM_FNS(q4_k, 0, AK16_C_Q4_K)
AK16_GEMM_FNS(q6_k, 1, AK16_C_Q6_K)

static size_t ak_aux_none(int64_t n) { return 0; }
static void ak_prep_none(int64_t n, const void *x, void *aux) {}

static const struct gemv_ops ak_ops[] = {
    {DTYPE_F16, af_aux_bytes, af_prep, af_gemv_f16, af_gemm_f16, NULL, NULL, NULL},
    {DTYPE_Q4_K, ak_aux_none, ak_prep_none, ak_gemv_q4_k, ak_gemm_q4_k, ak16_gemv_q4_k, ak16_gemm_q4_k, NULL},
    {DTYPE_Q6_K, ak_aux_none, ak_prep_none, ak_gemv_q6_k, ak_gemm_q6_k, ak16_gemv_q6_k, ak16_gemm_q6_k, NULL},
};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const struct gemv_ops *gemv_ops_avx512k(enum dtype t)
{
    if (!gemv_cpu_has_avx512() || !gemv_ops_avx2(DTYPE_F16))
        return NULL;
    __atomic_store_n(&af_gemv_avx2, gemv_ops_avx2(DTYPE_F16)->gemv, __ATOMIC_RELAXED);
    for (size_t i = 0; i < sizeof ak_ops / sizeof ak_ops[0]; i++)
        if (ak_ops[i].type == t)
            return &ak_ops[i];
    return NULL;
}
