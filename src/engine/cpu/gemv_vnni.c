/*
 * gemv_vnni: Q4_0 and Q8_0 weights x Q8_0 activations with AVX-VNNI's vpdpbusd (see gemv.h), for decode
 * (gemv) and for prefill and batched decode (gemm). The functions are compiled for AVX2+FMA+F16C+AVX-VNNI
 * by the target pragma below and only handed out when gemv_cpu_has_vnni() says the CPU has all of them.
 *
 * Bit-identical to kernel_ops vec_dot (kernels_avx2.c): per 32-element block the 8 int32 lanes (lane l = sum
 * of elements 4l..4l+3 of w*x) are the same integers, then acc = fma(d_w * d_x, float(lanes), acc) in block
 * order, then the same fold. vpdpbusd multiplies unsigned by signed bytes, so the weights are made unsigned
 * and the activation's lane sums, precomputed once per activation row by prep, start the accumulator:
 *   Q8_0: u = w + 128 (w ^ 0x80), lanes = dpbusd(-128 * sum4(x), u, x)
 *   Q4_0: u = w + 8 (the nibble), lanes = dpbusd(-8 * sum4(x), u, x), except that the high nibbles (lanes
 *         4-7) are not shifted down: u = 16 * nibble there and the accumulator starts at -128 * sum4(x), so
 *         those lanes hold 16 * the true value. One AND unpacks a block. float(16 v) = 16 float(v) exactly
 *         (|v| < 2^20), and fma(s, 16 v, 16 acc) = 16 fma(s, v, acc) exactly (scaling by a power of two
 *         commutes with rounding away from the subnormal range, which these sums cannot reach: every term is
 *         a multiple of 2^-72), so lanes 4-7 of acc are 16 x vec_dot's, and one exact multiply by 1/16 before
 *         the fold gives vec_dot's result bit for bit.
 * which per (row, column, block) is one integer instruction where AVX2 needs maddubs, madd and a sign or
 * subtraction. The scale products d_w * d_x of 8 blocks are made with one multiply per (row, column).
 *
 * aux of an activation row (n elements, nb = n / 32 blocks): float dx[nb rounded up to 8], then per block
 * int32 mq4[8] = (-8 * sum4(x) in lanes 0-3, -128 * sum4(x) in lanes 4-7) and m128[8] = -128 * sum4(x).
 *
 * gemm is blocked like kernel_ops gemm: columns in groups whose activations stay in L2, and within a group
 * tiles of GN_R rows x GN_C columns held in registers, so each weight block loaded serves GN_C columns and
 * each activation block GN_R rows.
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#include "engine/cpu/gemv.h"

#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include "engine/cpu/gemm_tiles.h"
#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define GN_INLINE static inline __attribute__((always_inline))
/* gemv prefetch distance along the stream of rows, in bytes, into L2 (see gemv_avx2.c). Measured with two
 * threads streaming, as a fraction of the read probe: Q8_0 88% (T0, 12 KiB) -> 93% (T1, 24 KiB); Q4_0 ~83%
 * either way (it is bound by instructions: 22 GB/s per thread from L1). */
#define GN_PF (24 << 10)

/* Q4_0 accumulators hold lanes 4-7 times 16 (see the top of the file): undo that exactly. */
GN_INLINE __m256 gn_unscale(int is_q4, __m256 v)
{
    return is_q4 ? _mm256_mul_ps(v, _mm256_setr_ps(1, 1, 1, 1, 0.0625f, 0.0625f, 0.0625f, 0.0625f)) : v;
}

/* The F16 scales of 8 consecutive blocks (at p, p + stride, ...) as floats: one gather of the 32-bit words
 * at the block starts, their low halves packed and converted. Built from scalar loads and inserts instead, the
 * 8 scales cost more shuffle-port instructions than the block products themselves. */
GN_INLINE __m256 gn_load_scales8(const uint8_t *p, size_t stride)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)stride));
    __m256i g = _mm256_and_si256(_mm256_i32gather_epi32((const int *)p, idx, 1), _mm256_set1_epi32(0xffff));
    g = _mm256_permute4x64_epi64(_mm256_packus_epi32(g, g), 0x08); /* [g0..g3, g4..g7] in the low 128 bits */
    return _mm256_cvtph_ps(_mm256_castsi256_si128(g));
}

static inline float gn_h2f(uint16_t h) { return _cvtsh_ss(h); }

static size_t gn_dx_floats(int64_t nb) { return (size_t)((nb + 7) & ~(int64_t)7); }

static size_t gn_aux_bytes(int64_t n) { return gn_dx_floats(n / QK8_0) * sizeof(float) + (size_t)(n / QK8_0) * 64; }

static void gn_prep(int64_t n, const void *x, void *aux)
{
    const struct block_q8_0 *bx = x;
    int64_t nb = n / QK8_0;
    float *dx = aux;
    __m256i *m = (__m256i *)((uint8_t *)aux + gn_dx_floats(nb) * sizeof(float));
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++) {
        dx[b] = gn_h2f(bx[b].d);
        __m256i s4 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ones8, _mm256_loadu_si256((const __m256i *)bx[b].qs));
        __m256i m128 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 7));
        __m256i m8 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 3));
        _mm256_store_si256(m + 2 * b, _mm256_blend_epi32(m8, m128, 0xF0));
        _mm256_store_si256(m + 2 * b + 1, m128);
    }
    for (int64_t b = nb; b < (int64_t)gn_dx_floats(nb); b++)
        dx[b] = 0;
}

/* The weights of one block as unsigned bytes in the lane order of the activation. */
GN_INLINE __m256i gn_unsigned(int is_q4, const uint8_t *blk)
{
    if (is_q4) { /* low nibbles in lanes 0-3, high nibbles * 16 in lanes 4-7 */
        __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const struct block_q4_0 *)blk)->qs));
        return _mm256_and_si256(q, _mm256_setr_epi64x(0x0f0f0f0f0f0f0f0f, 0x0f0f0f0f0f0f0f0f, (long long)0xf0f0f0f0f0f0f0f0ull,
                                                       (long long)0xf0f0f0f0f0f0f0f0ull));
    }
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((const struct block_q8_0 *)blk)->qs), _mm256_set1_epi8((char)0x80));
}

/* ---- decode: NR rows x one activation row ---- */

GN_INLINE void gn_tile_gemv(int is_q4, int64_t nb, const int NR, float *y, const uint8_t *w, size_t ldw,
                            const struct block_q8_0 *x, const void *aux)
{
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    const float *dx = aux;
    const __m256i *m = (const __m256i *)((const uint8_t *)aux + gn_dx_floats(nb) * sizeof(float)) + (is_q4 ? 0 : 1);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        acc[r] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        for (size_t i = 0; i < 8 * NR * bb; i += 64)
            _mm_prefetch((const char *)w + GN_PF + (size_t)b * NR * bb + i, _MM_HINT_T1);
        __m256 d8 = _mm256_loadu_ps(dx + b);
        float s8[4][8] __attribute__((aligned(32))); /* broadcast per block from memory: no shuffle port */
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            _mm256_store_ps(s8[r], _mm256_mul_ps(gn_load_scales8(w + (size_t)r * ldw + (size_t)b * bb, bb), d8));
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i xq = _mm256_loadu_si256((const __m256i *)x[b + k].qs), mk = _mm256_load_si256(m + 2 * (b + k));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m256i p = _mm256_dpbusd_avx_epi32(mk, gn_unsigned(is_q4, w + (size_t)r * ldw + (size_t)(b + k) * bb), xq);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&s8[r][k]), _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
    }
    for (; b < nb; b++) {
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs), mk = _mm256_load_si256(m + 2 * b);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ldw + (size_t)b * bb;
            uint16_t dw;
            memcpy(&dw, blk, 2);
            __m256i p = _mm256_dpbusd_avx_epi32(mk, gn_unsigned(is_q4, blk), xq);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(gn_h2f(dw) * dx[b]), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        y[r] = simd_fold8(gn_unscale(is_q4, acc[r]));
}

#define GN_GEMV(name, IS_Q4, NR, QK)                                                                         \
    static void gn_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,   \
                               const void *aux)                                                            \
    {                                                                                                      \
        const uint8_t *W = w;                                                                              \
        int64_t i = 0;                                                                                     \
        for (; i + NR <= nr; i += NR)                                                                      \
            gn_tile_gemv(IS_Q4, n / QK, NR, y + i, W + (size_t)i * ldw, ldw, x, aux);                      \
        for (; i < nr; i++)                                                                                \
            gn_tile_gemv(IS_Q4, n / QK, 1, y + i, W + (size_t)i * ldw, ldw, x, aux);                       \
    }

GN_GEMV(q4_0, 1, 4, QK4_0)
GN_GEMV(q8_0, 0, 4, QK8_0)

/* ---- prefill / batched decode: NR rows x NC activation rows ---- */

#define GN_R 4
#define GN_C 2

#define GQ_TILE gn_tile_gemm
#define GQ_R GN_R
#define GQ_C GN_C
#define GQ_SCALES8(p, st) gn_load_scales8(p, st)
#define GQ_UNPACK(is_q4, blk) gn_unsigned(is_q4, blk)
#define GQ_COL(is_q4, a, b) _mm256_load_si256((const __m256i *)((a) + gn_dx_floats(nb) * sizeof(float)) + 2 * (b) + ((is_q4) ? 0 : 1))
#define GQ_LANES(is_q4, u, xq, col) _mm256_dpbusd_avx_epi32(col, u, xq)
#define GQ_FINISH(is_q4, acc) gn_unscale(is_q4, acc)
#include "engine/cpu/gemm_q8_tile.h"

#define GN_GEMM(name, IS_Q4, QK)                                                                            \
    static void gn_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw,  \
                               const void *x, size_t ldx, const void *aux, size_t ldaux)                    \
    {                                                                                                       \
        const uint8_t *W = w, *X = x, *A = aux;                                                             \
        const int64_t nb = n / QK;                                                                          \
        int jb = gemm_col_block(ldx + gn_aux_bytes(n), GN_C);                                               \
        GEMM_TILES(nr, nc, jb, GN_R, GN_C, GN_GEMM_TILE, IS_Q4)                                             \
    }
#define GN_GEMM_TILE(is_q4, R, C, i, j)                                                                     \
    gn_tile_gemm(is_q4, nb, R, C, s + (size_t)(j) * lds + (i), lds, W + (size_t)(i) * ldw, ldw,             \
                 X + (size_t)(j) * ldx, ldx, A + (size_t)(j) * ldaux, ldaux)

GN_GEMM(q4_0, 1, QK4_0)
GN_GEMM(q8_0, 0, QK8_0)

static const struct gemv_ops gn_ops[] = {
    {DTYPE_Q4_0, gn_aux_bytes, gn_prep, gn_gemv_q4_0, gn_gemm_q4_0, NULL, NULL},
    {DTYPE_Q8_0, gn_aux_bytes, gn_prep, gn_gemv_q8_0, gn_gemm_q8_0, NULL, NULL},
};

const struct gemv_ops *gemv_ops_vnni(enum dtype t)
{
    if (!gemv_cpu_has_vnni())
        return NULL;
    for (size_t i = 0; i < sizeof gn_ops / sizeof gn_ops[0]; i++)
        if (gn_ops[i].type == t)
            return &gn_ops[i];
    return NULL;
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
