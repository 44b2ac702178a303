/*
 * kernels_avx2: AVX2 + FMA + F16C kernels (this file alone is compiled with -mavx2 -mfma -mf16c; nothing
 * here runs unless kernel_cpu_has_avx2() said yes).
 *
 * Every product is written once, as a register tile of NR weight rows x NC activation rows
 * (ka_tile_<type>, always inlined with constant NR/NC). vec_dot is the 1 x 1 tile and gemm is built from
 * bigger tiles plus 1-wide edges. A tile performs, for each (row, column) pair, exactly the same sequence of
 * vector operations as the 1 x 1 tile does (integer parts are exact; every float op is the same op on the
 * same operands, in the same order within each accumulator), so gemm results are bit-identical to vec_dot's
 * and the reduction order depends only on n. Loads are unaligned throughout: rows come from mmapped files at
 * any 2-byte offset.
 *
 * Quantized x Q8_0: signed bytes multiplied with _mm256_maddubs_epi16 after moving the weight's sign onto
 *   the activation (|w| * sign(w)*x), widened with madd and summed exactly over the block, then one scalar
 *   acc = fma(float(sum), d_w * d_x, acc) per block in block order: kernels.c's block-sum numerics, which the
 *   fast kernels (gemv*.c) reproduce with the blocks' sums of 8 or 16 rows in one register. These are the
 *   simple ones (vec_dot, the Q8_0 KV cache's products); a gemv_ops gemm runs prefill.
 * K-quants x Q8_K: per 32 (Q4_K) or 16 (Q6_K) elements an integer dot weighted by the sub-block scale,
 *   summed exactly in int32 lanes over the 256-element super-block and then across the lanes (the block sum),
 *   then kernels.c's scalar FMAs per super-block; the Q4_K mins and the Q6_K -32 offset come from the
 *   activation's bsums instead of per-element work.
 * Float weights: 2 independent FMA accumulators of 8 lanes (16 elements per step), then single 8-element
 *   steps into the first; a tail of fewer than 8 elements is zero-padded into one more step. The tile runs the
 *   two chains one after the other, so its activations stay in registers (gemm_float_tile.h).
 */
#include "engine/cpu/kernels.h"

#include "engine/gguf/quant.h"

#include "engine/cpu/gemm_float_tile.h"
#include "engine/cpu/gemm_tiles.h"
#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <string.h>

#define KA_INLINE static inline __attribute__((always_inline))
#define KA_MAXR 4
#define KA_MAXC 4

/* Software prefetch distance in bytes along each weight row. Decode streams weights from DRAM, and the
 * quantized loops are dense in instructions per byte, so the out-of-order window alone keeps only a few
 * cache lines in flight; measured on the reference machine (Zen 3 VM) prefetching KA_PF bytes ahead raised
 * Q4_0 from about 2.3 to 7-9 GB/s on one thread (distances 1-4 KiB tried; 2 KiB best). Prefetches never fault,
 * so running past the end of a row is harmless. */
#define KA_PF 2048
KA_INLINE void ka_prefetch(const uint8_t *p) { _mm_prefetch((const char *)p + KA_PF, _MM_HINT_T0); }

KA_INLINE float ka_hmax(__m256 v)
{
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

KA_INLINE float ka_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* ---- Q8_0 / Q4_0 weights x Q8_0 activations ---- */

/* One block pair in the block-sum numerics (kernels.c): the exact integer sum of w*x over the block, with w
 * given as |w| and w (for its sign), then acc = fma(float(sum), d_w * d_x, acc). */
KA_INLINE float ka_q8_pair(float acc, __m256i aw, __m256i sw, float dw, const struct block_q8_0 *bx)
{
    __m256i xq = _mm256_loadu_si256((const __m256i *)bx->qs);
    __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, sw));
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return __builtin_fmaf((float)_mm_cvtsi128_si32(t), dw * ka_h2f(bx->d), acc);
}

/* is_q4: weights are Q4_0 (nibbles - 8) instead of Q8_0. */
KA_INLINE void ka_tile_q8(int is_q4, int64_t nb, const int NR, const int NC, float *s, size_t lds,
                          const uint8_t *w, size_t ldw, const uint8_t *x, size_t ldx)
{
    float acc[KA_MAXR][KA_MAXC];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            acc[r][c] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256i q;
            float dw;
            ka_prefetch(w + (size_t)r * ldw + (size_t)b * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0)));
            if (is_q4) {
                const struct block_q4_0 *bw = (const struct block_q4_0 *)(w + (size_t)r * ldw) + b;
                /* both halves of the 16 bytes in one register, the high lane shifted right by 4 */
                q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bw->qs));
                q = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
                q = _mm256_sub_epi8(_mm256_and_si256(q, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
                dw = ka_h2f(bw->d);
            } else {
                const struct block_q8_0 *bw = (const struct block_q8_0 *)(w + (size_t)r * ldw) + b;
                q = _mm256_loadu_si256((const __m256i *)bw->qs);
                dw = ka_h2f(bw->d);
            }
            __m256i aw = _mm256_sign_epi8(q, q); /* -128 becomes 0x80 = 128 unsigned: still right */
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                acc[r][c] = ka_q8_pair(acc[r][c], aw, q, dw, (const struct block_q8_0 *)(x + (size_t)c * ldx) + b);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            s[(size_t)c * lds + r] = acc[r][c];
}

/* ---- Q4_K x Q8_K ---- */

/* [d of column 0's block b, ..., of column NC - 1's, 0...]: the Q8_K activations' scales of a tile, built in
 * registers (from a float array, a store and a wider load of the same bytes, the store's forwarding stalls). */
KA_INLINE __m128 ka_q8_k_dx(const uint8_t *x, size_t ldx, int64_t b, const int NC)
{
#define KA_DX(c) (NC > (c) ? ((const struct block_q8_k *)(x + (size_t)(c) * ldx) + b)->d : 0.0f)
    return _mm_setr_ps(KA_DX(0), KA_DX(1), KA_DX(2), KA_DX(3));
#undef KA_DX
}

/* Stores a K-quant tile's sums: row r, column c from lane c of acc[r]. */
KA_INLINE void ka_store_cols(const int NR, const int NC, const __m128 *acc, float *s, size_t lds)
{
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float v[4];
        _mm_storeu_ps(v, acc[r]);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            s[(size_t)c * lds + r] = v[c];
    }
}

KA_INLINE void ka_tile_q4_k(int64_t nb, const int NR, const int NC, float *s, size_t lds, const uint8_t *w,
                            size_t ldw, const uint8_t *x, size_t ldx)
{
    __m128 acc[KA_MAXR]; /* row r, column c in lane c */
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        acc[r] = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[KA_MAXR][8], mn[KA_MAXR][8];
        __m256i sumi[KA_MAXR][KA_MAXC];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *pw = w + (size_t)r * ldw + (size_t)b * sizeof(struct block_q4_k);
            ka_prefetch(pw);
            ka_prefetch(pw + 64);
            ka_prefetch(pw + 128);
            quant_q4_k_scales8(((const struct block_q4_k *)(w + (size_t)r * ldw) + b)->scales, sc[r], mn[r]);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                sumi[r][c] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 4; k++) { /* 64 elements: sub-blocks 2k (low nibbles) and 2k+1 (high) */
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const struct block_q4_k *bw = (const struct block_q4_k *)(w + (size_t)r * ldw) + b;
                __m256i raw = _mm256_loadu_si256((const __m256i *)(bw->qs + 32 * k));
                __m256i lo = _mm256_and_si256(raw, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                __m256i slo = _mm256_set1_epi16(sc[r][2 * k]), shi = _mm256_set1_epi16(sc[r][2 * k + 1]);
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++) {
                    const struct block_q8_k *bx = (const struct block_q8_k *)(x + (size_t)c * ldx) + b;
                    __m256i y0 = _mm256_loadu_si256((const __m256i *)(bx->qs + 64 * k));
                    __m256i y1 = _mm256_loadu_si256((const __m256i *)(bx->qs + 64 * k + 32));
                    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), slo),
                                                 _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), shi));
                    sumi[r][c] = _mm256_add_epi32(sumi[r][c], p);
                    SIMD_KEEP(sumi[r][c]); /* else GCC regroups the adds and spills */
                }
            }
        }
        __m128 dx = ka_q8_k_dx(x, ldx, b, NC);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const struct block_q4_k *bw = (const struct block_q4_k *)(w + (size_t)r * ldw) + b;
            __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn[r]));
            __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
            __m256i mm[KA_MAXC], z = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                mm[c] = _mm256_madd_epi16(
                    _mm256_loadu_si256((const __m256i *)((const struct block_q8_k *)(x + (size_t)c * ldx) + b)->bsums), mins);
            /* lane c: column c's block sums S and M; kernels.c's two fmas, four columns at once */
            __m128i S = simd_hsum4_epi32(sumi[r][0], NC > 1 ? sumi[r][1] : z, NC > 2 ? sumi[r][2] : z, NC > 3 ? sumi[r][3] : z);
            __m128i M = simd_hsum4_epi32(mm[0], NC > 1 ? mm[1] : z, NC > 2 ? mm[2] : z, NC > 3 ? mm[3] : z);
            acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(S), _mm_mul_ps(_mm_set1_ps(ka_h2f(bw->d)), dx), acc[r]);
            acc[r] = _mm_fnmadd_ps(_mm_cvtepi32_ps(M), _mm_mul_ps(_mm_set1_ps(ka_h2f(bw->dmin)), dx), acc[r]);
        }
    }
    ka_store_cols(NR, NC, acc, s, lds);
}

/* ---- Q6_K x Q8_K ---- */

KA_INLINE void ka_tile_q6_k(int64_t nb, const int NR, const int NC, float *s, size_t lds, const uint8_t *w,
                            size_t ldw, const uint8_t *x, size_t ldx)
{
    __m128 acc[KA_MAXR]; /* row r, column c in lane c */
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        acc[r] = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m2h = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++) {
        __m256i sumi[KA_MAXR][KA_MAXC];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *pw = w + (size_t)r * ldw + (size_t)b * sizeof(struct block_q6_k);
            ka_prefetch(pw);
            ka_prefetch(pw + 64);
            ka_prefetch(pw + 128);
            ka_prefetch(pw + 192);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                sumi[r][c] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++) { /* quarter: 32 elements, two groups of 16 with their own scales */
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    const struct block_q6_k *bw = (const struct block_q6_k *)(w + (size_t)r * ldw) + b;
                    __m256i ql = _mm256_loadu_si256((const __m256i *)(bw->ql + 64 * h + 32 * (qt & 1)));
                    __m256i qh = _mm256_loadu_si256((const __m256i *)(bw->qh + 32 * h));
                    __m256i lo = qt < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
                    __m256i hb = qt == 0   ? _mm256_slli_epi16(qh, 4)
                                 : qt == 1 ? _mm256_slli_epi16(qh, 2)
                                 : qt == 2 ? qh
                                           : _mm256_srli_epi16(qh, 2);
                    __m256i q = _mm256_or_si256(lo, _mm256_and_si256(hb, m2h)); /* 0..63, offset 32 */
                    const int8_t *scl = bw->scales + 8 * h + 2 * qt;
                    __m256i sv = _mm256_set_m128i(_mm_set1_epi16(scl[1]), _mm_set1_epi16(scl[0]));
#pragma GCC unroll 4
                    for (int c = 0; c < NC; c++) {
                        const struct block_q8_k *bx = (const struct block_q8_k *)(x + (size_t)c * ldx) + b;
                        __m256i y = _mm256_loadu_si256((const __m256i *)(bx->qs + 128 * h + 32 * qt));
                        sumi[r][c] = _mm256_add_epi32(sumi[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), sv));
                        SIMD_KEEP(sumi[r][c]);
                    }
                }
            }
        }
        __m128 dx = ka_q8_k_dx(x, ldx, b, NC);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const struct block_q6_k *bw = (const struct block_q6_k *)(w + (size_t)r * ldw) + b;
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)bw->scales));
            __m256i t[KA_MAXC], z = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const struct block_q8_k *bx = (const struct block_q8_k *)(x + (size_t)c * ldx) + b;
                /* the codes carry +32: subtract 32 * sum over groups of scale * group sum of x */
                __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bx->bsums), sc16);
                t[c] = _mm256_sub_epi32(sumi[r][c], _mm256_slli_epi32(off, 5));
            }
            __m128i S = simd_hsum4_epi32(t[0], NC > 1 ? t[1] : z, NC > 2 ? t[2] : z, NC > 3 ? t[3] : z);
            acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(S), _mm_mul_ps(_mm_set1_ps(ka_h2f(bw->d)), dx), acc[r]);
        }
    }
    ka_store_cols(NR, NC, acc, s, lds);
}

/* ---- F32 / F16 / BF16 weights x F32 activations: gemm_float_tile.h ---- */

/* ---- vec_dot and gemm per type ---- */

/* gemm: columns in blocks whose activation rows stay in L2 (256 KiB) while every weight row tile passes over
 * them, the weight rows of a tile in L1 across the block's columns (gemm_tiles.h). */
#define KA_DEFINE(name, TILE, NR, NC, NB)                                                                  \
    static void ka_dot_##name(int64_t n, float *s, const void *w, const void *x)                         \
    {                                                                                                      \
        TILE(NB, 1, 1, s, 1, (const uint8_t *)w, 0, (const uint8_t *)x, 0);                                \
    }                                                                                                      \
    static void ka_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw, \
                               const void *x, size_t ldx)                                                  \
    {                                                                                                      \
        const uint8_t *W = w, *X = x;                                                                      \
        const int64_t nb = NB;                                                                             \
        int jb = gemm_col_block(ldx, NC);                                                                  \
        GEMM_TILES(nr, nc, jb, NR, NC, KA_GEMM_TILE, TILE)                                                 \
    }
#define KA_GEMM_TILE(TILE, R, C, i, j)                                                                     \
    TILE(nb, R, C, s + (size_t)(j) * lds + (i), lds, W + (size_t)(i) * ldw, ldw, X + (size_t)(j) * ldx, ldx)

#define KA_TILE_Q8_0(...) ka_tile_q8(0, __VA_ARGS__)
#define KA_TILE_Q4_0(...) ka_tile_q8(1, __VA_ARGS__)
#define KA_TILE_F32(...) gemm_float_tile(GFT_F32, GFT_F32, KA_PF, 0, __VA_ARGS__, NULL, NULL, 0)
#define KA_TILE_F16(...) gemm_float_tile(GFT_F16, GFT_F32, KA_PF, 0, __VA_ARGS__, NULL, NULL, 0)
#define KA_TILE_BF16(...) gemm_float_tile(GFT_BF16, GFT_F32, KA_PF, 0, __VA_ARGS__, NULL, NULL, 0)

/* Tile shapes (rows x columns), picked by measuring gemm at nc = 64 on the reference machine: for the
 * quantized types every shape from 2x4 to 4x4 was within noise of the best (3x4 keeps batches of 4 on the fast
 * path). Float weights (gemm_float_tile.h), 1B F16 with AVX2 alone on a Zen 5, 2 threads: prefill 6x2 and 4x3
 * alike (103-106 tokens/s; both chains side by side in a 3x2 tile, before, 93-95), 3x3 and 3x4 91, 5x2
 * 76-81, 2x4 63; batched decode of 8 6x2 73-74 tokens/s against 4x3's 65-66 (8 columns are 3 + 3 + 1 + 1
 * there). The backend's F16 prefill and batched decode run gemv_avx2.c's gemm on F16 activations instead (1.3-1.4x
 * this tile on a Zen 4); this one serves F32 and BF16 weights and the tests' reference. */
#define KA_QR 3
#define KA_QC 4
#define KA_KR 3
#define KA_KC 4
#define KA_FR 6
#define KA_FC 2
_Static_assert(KA_FR <= GFT_MAXR && KA_FC <= GFT_MAXC, "gemm_float_tile's accumulators hold the float tile");
KA_DEFINE(q8_0, KA_TILE_Q8_0, KA_QR, KA_QC, n / QK8_0)
KA_DEFINE(q4_0, KA_TILE_Q4_0, KA_QR, KA_QC, n / QK4_0)
KA_DEFINE(q4_k, ka_tile_q4_k, KA_KR, KA_KC, n / QK_K)
KA_DEFINE(q6_k, ka_tile_q6_k, KA_KR, KA_KC, n / QK_K)
KA_DEFINE(f32, KA_TILE_F32, KA_FR, KA_FC, n)
KA_DEFINE(f16, KA_TILE_F16, KA_FR, KA_FC, n)
KA_DEFINE(bf16, KA_TILE_BF16, KA_FR, KA_FC, n)

/* ---- activation quantizers (byte-identical to quant.c's) ---- */

KA_INLINE __m256 ka_abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* Activation quantizers: the same rounding as the scalar ones in kernels.c (llama.cpp's run-time rounding:
 * ties to even; Q8_0 scale 127 / amax; Q8_K scale -127 / the signed extreme), byte-identical to them. */
KA_INLINE __m256i ka_round_even_i32(__m256 v) { return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); }

KA_INLINE void ka_quant32_even(const float *x, __m256 vid, int8_t *q)
{
    __m256i i0 = ka_round_even_i32(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
    __m256i i1 = ka_round_even_i32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
    __m256i i2 = ka_round_even_i32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), vid));
    __m256i i3 = ka_round_even_i32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), vid));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
}

static void ka_from_f32_q8_0(const float *src, void *dst, int64_t n)
{
    struct block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++, src += QK8_0) {
        __m256 m = _mm256_max_ps(_mm256_max_ps(ka_abs(_mm256_loadu_ps(src)), ka_abs(_mm256_loadu_ps(src + 8))),
                                 _mm256_max_ps(ka_abs(_mm256_loadu_ps(src + 16)), ka_abs(_mm256_loadu_ps(src + 24))));
        float amax = ka_hmax(m);
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = f32_to_fp16(amax / 127.0f);
        ka_quant32_even(src, _mm256_set1_ps(id), y[b].qs);
    }
}

static void ka_from_f32_q8_k(const float *src, void *dst, int64_t n)
{
    struct block_q8_k *y = dst;
    for (int64_t b = 0; b < n / QK_K; b++, src += QK_K) {
        __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 16) {
            m0 = _mm256_max_ps(m0, ka_abs(_mm256_loadu_ps(src + j)));
            m1 = _mm256_max_ps(m1, ka_abs(_mm256_loadu_ps(src + j + 8)));
        }
        float amax = ka_hmax(_mm256_max_ps(m0, m1));
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        /* The sign of the first element reaching amax, as the scalar scan finds it (src[j] == amax || src[j] ==
         * -amax is |src[j]| == amax, NaN never equal), 8 elements a compare: the element-by-element scan took
         * 2-3% of a 1B Q4_K_M prefill (perf, Zen 5), more than the rest of the conversion. */
        float max = amax;
        __m256 va = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(ka_abs(_mm256_loadu_ps(src + j)), va, _CMP_EQ_OQ));
            if (hit) {
                max = src[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        float iscale = -127.0f / max;
        __m256 vid = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32)
            ka_quant32_even(src + j, vid, y[b].qs + j);
        /* only +128 can appear (saturated to 127 by the pack), matching the scalar MIN(127, v) */
        y[b].d = 1.0f / iscale;
        /* group sums of 16 codes: bias to unsigned, sum absolute differences against 0, remove the bias */
        for (int g = 0; g < QK_K / 16; g++) {
            __m128i q = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(y[b].qs + 16 * g)), _mm_set1_epi8((char)0x80));
            __m128i sad = _mm_sad_epu8(q, _mm_setzero_si128());
            y[b].bsums[g] = (int16_t)(_mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4) - 16 * 128);
        }
    }
}

/* F16 / BF16 weights: activations rounded to the weight's precision and kept as f32 (see kernels.c). */
static void ka_from_f32_round_f16(const float *src, void *dst, int64_t n)
{
    float *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++)
        d[i] = fp16_to_f32(f32_to_fp16(src[i]));
}

static void ka_from_f32_round_bf16(const float *src, void *dst, int64_t n)
{
    float *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
        u = _mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(u));
    }
    for (; i < n; i++)
        d[i] = bf16_to_f32(f32_to_bf16(src[i]));
}

static void ka_from_f32_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

/* ---- dequantization ---- */

static void ka_to_f32_f16(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        dst[i] = fp16_to_f32(h[i]);
}

static void ka_to_f32_bf16(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, gft_load8(GFT_BF16, h + i));
    for (; i < n; i++)
        dst[i] = bf16_to_f32(h[i]);
}

static void ka_to_f32_q8_0(const void *src, float *dst, int64_t n)
{
    const struct block_q8_0 *y = src;
    for (int64_t b = 0; b < n / QK8_0; b++, dst += QK8_0) {
        __m256 d = _mm256_set1_ps(ka_h2f(y[b].d));
        for (int j = 0; j < QK8_0; j += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(y[b].qs + j)));
            _mm256_storeu_ps(dst + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

static void ka_to_f32_q4_0(const void *src, float *dst, int64_t n)
{
    const struct block_q4_0 *y = src;
    for (int64_t b = 0; b < n / QK4_0; b++, dst += QK4_0) {
        __m256 d = _mm256_set1_ps(ka_h2f(y[b].d));
        __m128i raw = _mm_loadu_si128((const __m128i *)y[b].qs);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, _mm_set1_epi8(15)), _mm_set1_epi8(8));
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)), _mm_set1_epi8(8));
        _mm256_storeu_ps(dst, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
        _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
        _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
        _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
    }
}

static void ka_to_f32_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void ka_to_f32_q4_k(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_Q4_K, src, dst, n); }
static void ka_to_f32_q6_k(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_Q6_K, src, dst, n); }

static const struct kernel_ops ka_ops[] = {
    {DTYPE_F32, DTYPE_F32, ka_from_f32_f32, ka_dot_f32, ka_to_f32_f32, ka_gemm_f32},
    {DTYPE_F16, DTYPE_F32, ka_from_f32_round_f16, ka_dot_f16, ka_to_f32_f16, ka_gemm_f16},
    {DTYPE_BF16, DTYPE_F32, ka_from_f32_round_bf16, ka_dot_bf16, ka_to_f32_bf16, ka_gemm_bf16},
    {DTYPE_Q8_0, DTYPE_Q8_0, ka_from_f32_q8_0, ka_dot_q8_0, ka_to_f32_q8_0, ka_gemm_q8_0},
    {DTYPE_Q4_0, DTYPE_Q8_0, ka_from_f32_q8_0, ka_dot_q4_0, ka_to_f32_q4_0, ka_gemm_q4_0},
    {DTYPE_Q4_K, DTYPE_Q8_K, ka_from_f32_q8_k, ka_dot_q4_k, ka_to_f32_q4_k, ka_gemm_q4_k},
    {DTYPE_Q6_K, DTYPE_Q8_K, ka_from_f32_q8_k, ka_dot_q6_k, ka_to_f32_q6_k, ka_gemm_q6_k},
};

const struct kernel_ops *kernel_ops_avx2(enum dtype t)
{
    if (!kernel_cpu_has_avx2())
        return NULL;
    for (size_t i = 0; i < sizeof ka_ops / sizeof ka_ops[0]; i++)
        if (ka_ops[i].type == t)
            return &ka_ops[i];
    return NULL;
}

/* ---- SwiGLU (kernel_swiglu) ----
 * kernel_expf's operations lane by lane, in double, the floats widened 4 (AVX2) or 8 (AVX-512) at a time: the
 * same fused and plain operations on the same operands, so every lane rounds as the scalar function does. The
 * compiler must not fuse anything more (a multiply feeding an add): none of the multiplies here feeds one. Lanes
 * with |x| >= 88 or NaN (kernel_expf's special cases) are redone by kernel_expf. */

/* e^x of 4 floats widened to double (the main path of kernel_expf). */
KA_INLINE __m128 ka_expf4(__m128 x)
{
    const __m256d invln2n = _mm256_castsi256_pd(_mm256_set1_epi64x((long long)KERNEL_EXPF_INVLN2N));
    const __m256d shift = _mm256_castsi256_pd(_mm256_set1_epi64x((long long)KERNEL_EXPF_SHIFT));
    __m256d xd = _mm256_cvtps_pd(x);
    __m256d kd = _mm256_fmadd_pd(invln2n, xd, shift);
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)kernel_expf_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    __m256d z = _mm256_fmadd_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x((long long)KERNEL_EXPF_C0)),
                                _mm256_castsi256_pd(_mm256_set1_epi64x((long long)KERNEL_EXPF_C1)));
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_castsi256_pd(_mm256_set1_epi64x((long long)KERNEL_EXPF_C2)), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/* Redoes by kernel_expf the lanes of e (exps of x) set in mask: those outside its main path. */
static void ka_expf_special(const float *x, float *e, unsigned mask)
{
    for (int l = 0; mask; l++, mask >>= 1)
        if (mask & 1)
            e[l] = kernel_expf(x[l]);
}

/* 8 lanes of SwiGLU at g, u; lanes outside kernel_expf's main path redone by it. */
KA_INLINE void ka_swiglu8(float *g, const float *u)
{
    __m256 gv = _mm256_loadu_ps(g), x = _mm256_xor_ps(gv, _mm256_set1_ps(-0.0f));
    __m256 e = _mm256_setr_m128(ka_expf4(_mm256_castps256_ps128(x)), ka_expf4(_mm256_extractf128_ps(x, 1)));
    __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    int special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
    if (special) {
        float xs[8], es[8];
        _mm256_storeu_ps(xs, x);
        _mm256_storeu_ps(es, e);
        ka_expf_special(xs, es, (unsigned)special);
        e = _mm256_loadu_ps(es);
    }
    _mm256_storeu_ps(g, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(u)));
}

/* The AVX-512 version: 16 lanes, the table in four registers (two-source permutes instead of a gather). */
__attribute__((target("avx512f,avx512dq,avx512vl"))) static int64_t ka_swiglu_avx512(float *g, const float *u, int64_t n)
{
    const __m512d invln2n = _mm512_castsi512_pd(_mm512_set1_epi64((long long)KERNEL_EXPF_INVLN2N));
    const __m512d shift = _mm512_castsi512_pd(_mm512_set1_epi64((long long)KERNEL_EXPF_SHIFT));
    const __m512d c0 = _mm512_castsi512_pd(_mm512_set1_epi64((long long)KERNEL_EXPF_C0));
    const __m512d c1 = _mm512_castsi512_pd(_mm512_set1_epi64((long long)KERNEL_EXPF_C1));
    const __m512d c2 = _mm512_castsi512_pd(_mm512_set1_epi64((long long)KERNEL_EXPF_C2));
    __m512d tab[4];
    for (int q = 0; q < 4; q++)
        tab[q] = _mm512_castsi512_pd(_mm512_loadu_si512(kernel_expf_tab + 8 * q));
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i), x = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv),
                                                                                    _mm512_set1_epi32((int)0x80000000u)));
        __m256 eh[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512d xd = _mm512_cvtps_pd(h ? _mm512_extractf32x8_ps(x, 1) : _mm512_castps512_ps256(x));
            __m512d kd = _mm512_fmadd_pd(invln2n, xd, shift);
            __m512i ki = _mm512_castpd_si512(kd);
            kd = _mm512_sub_pd(kd, shift);
            __m512d r = _mm512_fmsub_pd(invln2n, xd, kd);
            /* table entry ki % 32: bits 0-3 pick within a pair of registers, bit 4 the pair */
            __m512d lo = _mm512_permutex2var_pd(tab[0], ki, tab[1]), hi = _mm512_permutex2var_pd(tab[2], ki, tab[3]);
            __m512d t = _mm512_mask_blend_pd(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
            __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(t), _mm512_slli_epi64(ki, 47)));
            __m512d z = _mm512_fmadd_pd(r, c0, c1);
            __m512d r2 = _mm512_mul_pd(r, r);
            __m512d y = _mm512_fmadd_pd(r, c2, _mm512_set1_pd(1.0));
            y = _mm512_fmadd_pd(z, r2, y);
            eh[h] = _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
        }
        __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(eh[0]), eh[1], 1);
        __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
        __mmask16 special = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a));
        if (special) {
            float xs[16], es[16];
            _mm512_storeu_ps(xs, x);
            _mm512_storeu_ps(es, e);
            ka_expf_special(xs, es, special);
            e = _mm512_loadu_ps(es);
        }
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(u + i)));
    }
    return i;
}

int64_t kernel_swiglu_avx2(float *g, const float *u, int64_t n)
{
    if (!kernel_cpu_has_avx2())
        return 0;
    int64_t i = gemv_cpu_has_avx512() ? ka_swiglu_avx512(g, u, n) : 0;
    for (; i + 8 <= n; i += 8)
        ka_swiglu8(g + i, u + i);
    return i;
}
