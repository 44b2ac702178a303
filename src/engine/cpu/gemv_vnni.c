/*
 * gemv_vnni: Q4_0 and Q8_0 weights x Q8_0 activations with AVX-VNNI's vpdpbusd (see gemv.h), for decode
 * (gemv) and for prefill and batched decode (gemm). The functions are compiled for AVX2+FMA+F16C+AVX-VNNI
 * by the target pragma below and only handed out when gemv_cpu_has_vnni() says the CPU has all of them.
 *
 * Bit-identical to kernel_ops vec_dot (kernels.c's block-sum numerics), through gemm_q8_tile.h's tile:
 * vpdpbusd multiplies unsigned by signed bytes, so the weights are made unsigned (Q8_0: u = w + 128 = w ^ 0x80;
 * Q4_0: u = w + 8, the nibble) and each block's sum gets the correction -128 or -8 x the activation block's
 * sum of codes, which prep computes once per activation row. Per (row, column, block) that is one integer
 * instruction where AVX2 needs maddubs, madd and a sign.
 *
 * aux of an activation row (nb blocks, nb8 = nb rounded up to 8): float dx[nb8], int32 c4[nb8] = -8 * sum(x_b),
 * int32 c8[nb8] = -128 * sum(x_b), all zero past nb.
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

static size_t gn_aux_bytes(int64_t n) { return 3 * gn_dx_floats(n / QK8_0) * sizeof(float); }

static void gn_prep(int64_t n, const void *x, void *aux)
{
    const struct block_q8_0 *bx = x;
    int64_t nb = n / QK8_0, nb8 = (int64_t)gn_dx_floats(nb);
    float *dx = aux;
    int32_t *c4 = (int32_t *)(dx + nb8), *c8 = c4 + nb8;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++)
            sum += bx[b].qs[j];
        dx[b] = _cvtsh_ss(bx[b].d);
        c4[b] = -8 * sum;
        c8[b] = -128 * sum;
    }
    for (int64_t b = nb; b < nb8; b++)
        dx[b] = 0, c4[b] = c8[b] = 0;
}

/* The weights of one block as unsigned bytes (Q4_0: the low nibbles in the low 16 bytes, the high ones in the
 * high 16, as the activation's elements 0-15 and 16-31). */
GN_INLINE __m256i gn_unsigned(int is_q4, const uint8_t *blk)
{
    if (is_q4) {
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const struct block_q4_0 *)blk)->qs));
        return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
    }
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((const struct block_q8_0 *)blk)->qs), _mm256_set1_epi8((char)0x80));
}

GN_INLINE void gn_prefetch(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 64)
        _mm_prefetch((const char *)p + i, _MM_HINT_T1);
}

/* ---- decode (8 rows per tile), prefill and batched decode (GN_R rows x GN_C columns) ---- */

#define GN_R 4
#define GN_C 4

#define GQ_TILE gn_tile_q
#define GQ_R 8
#define GQ_G 2
#define GQ_SCALES8(p, st) gn_load_scales8(p, st)
#define GQ_UNPACK(is_q4, blk) gn_unsigned(is_q4, blk)
#define GQ_LANES(is_q4, u, xq) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, xq)
#define GQ_LANES16(is_q4) 0
#define GQ_CORR(is_q4) ((long)(gn_dx_floats(nb) * sizeof(float) * ((is_q4) ? 1 : 2)))
#define GQ_PREFETCH(p, n) gn_prefetch(p, n)
#define GQ_PF GN_PF
#include "engine/cpu/gemm_q8_tile.h"

#define GN_GEMV(name, IS_Q4, QK)                                                                            \
    static void gn_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,  \
                               const void *aux)                                                           \
    {                                                                                                     \
        const uint8_t *W = w, *X = x, *A = aux;                                                           \
        const int64_t nb = n / QK;                                                                        \
        int64_t i = 0;                                                                                    \
        for (; i + 8 <= nr; i += 8)                                                                       \
            gn_tile_q(IS_Q4, nb, 8, 1, y + i, 0, W + (size_t)i * ldw, ldw, X, 0, A, 0, 1);                 \
        for (; i < nr; i++)                                                                               \
            gn_tile_q(IS_Q4, nb, 1, 1, y + i, 0, W + (size_t)i * ldw, ldw, X, 0, A, 0, 0);                 \
    }

GN_GEMV(q4_0, 1, QK4_0)
GN_GEMV(q8_0, 0, QK8_0)

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
    gn_tile_q(is_q4, nb, R, C, s + (size_t)(j) * lds + (i), lds, W + (size_t)(i) * ldw, ldw,                \
              X + (size_t)(j) * ldx, ldx, A + (size_t)(j) * ldaux, ldaux, 0)

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
