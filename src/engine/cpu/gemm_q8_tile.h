/*
 * gemm_q8_tile: the one register tile of Q4_0 / Q8_0 weights x Q8_0 activations for the 256-bit gemm kernels
 * (gemv_avx2.c with maddubs + madd, gemv_vnni.c with vpdpbusd), written once and instantiated by each file
 * under its own instruction set. Only the integer lanes differ between them; the float work, which fixes the
 * result, is vec_dot's (kernels_avx2.c): per (row, column, block) acc = fma(d_w * d_x, float(lanes), acc) in
 * block order, then simd_fold8. The scale products d_w * d_x are made 8 blocks at a time, one multiply per
 * (row, column), and broadcast per block from memory (a load, not a shuffle).
 *
 * Include after defining, in the including file (is_q4 a constant after inlining, blk a weight block, a the
 * column's aux as prep made it, b a block index):
 *   GQ_TILE            the name of the tile function to define
 *   GQ_R, GQ_C         the largest tile (rows, columns)
 *   GQ_SCALES8(p, st)  __m256: the 8 F16 scales at p, p + st, ... as floats
 *   GQ_UNPACK(is_q4, blk)          __m256i: the block's weights as the lanes need them
 *   GQ_COL(is_q4, a, b)            __m256i: what the lanes need from the column's aux for block b
 *   GQ_LANES(is_q4, u, xq, col)    __m256i: the 8 int32 lanes (or what GQ_FINISH makes them) of one block
 *   GQ_FINISH(is_q4, acc)          __m256: an accumulator as vec_dot's, before the fold
 * and have float dx[] (the activation's block scales) at the start of each column's aux.
 */
#ifndef GQ_TILE
#error "define GQ_TILE and the other GQ_ macros before including gemm_q8_tile.h"
#endif

static inline __attribute__((always_inline)) void GQ_TILE(int is_q4, int64_t nb, const int NR, const int NC, float *s,
                                                          size_t lds, const uint8_t *w, size_t ldw, const uint8_t *x,
                                                          size_t ldx, const uint8_t *aux, size_t ldaux)
{
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    __m256 acc[GQ_R][GQ_C];
    float sc[GQ_R][GQ_C][8] __attribute__((aligned(32))); /* d_w * d_x of 8 blocks per (row, column) */
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            acc[r][c] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256 dw8[GQ_R];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            dw8[r] = GQ_SCALES8(w + (size_t)r * ldw + (size_t)b * bb, bb);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            __m256 d8 = _mm256_loadu_ps((const float *)(aux + (size_t)c * ldaux) + b);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                _mm256_store_ps(sc[r][c], _mm256_mul_ps(dw8[r], d8));
        }
        for (int k = 0; k < 8; k++) {
            __m256i u[GQ_R];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                u[r] = GQ_UNPACK(is_q4, w + (size_t)r * ldw + (size_t)(b + k) * bb);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const struct block_q8_0 *bx = (const struct block_q8_0 *)(x + (size_t)c * ldx) + b + k;
                __m256i xq = _mm256_loadu_si256((const __m256i *)bx->qs);
                __m256i col = GQ_COL(is_q4, aux + (size_t)c * ldaux, b + k);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++)
                    acc[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[r][c][k]),
                                                _mm256_cvtepi32_ps(GQ_LANES(is_q4, u[r], xq, col)), acc[r][c]);
            }
        }
    }
    for (; b < nb; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ldw + (size_t)b * bb;
            uint16_t dwh;
            memcpy(&dwh, blk, 2);
            float dw = _cvtsh_ss(dwh);
            __m256i u = GQ_UNPACK(is_q4, blk);
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) {
                const struct block_q8_0 *bx = (const struct block_q8_0 *)(x + (size_t)c * ldx) + b;
                float dx = ((const float *)(aux + (size_t)c * ldaux))[b];
                __m256i p = GQ_LANES(is_q4, u, _mm256_loadu_si256((const __m256i *)bx->qs), GQ_COL(is_q4, aux + (size_t)c * ldaux, b));
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(p), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            s[(size_t)c * lds + r] = simd_fold8(GQ_FINISH(is_q4, acc[r][c]));
}
