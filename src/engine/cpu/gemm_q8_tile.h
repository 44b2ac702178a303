/*
 * gemm_q8_tile: the one register tile of Q4_0 / Q8_0 weights (rows in GGUF order) x Q8_0 activations for the
 * 256-bit kernels: the decode gemv and the prefill / batched-decode gemm of gemv_avx2.c (integer lanes by
 * maddubs + madd) and gemv_avx512q.c's path for matrices not in R16 (256-bit
 * vpdpbusd), written once and instantiated by each file under its own instruction set.
 *
 * Numerics: kernels.c's block sums. Per (row, column, block) the exact int32 sum S of w * x over the block,
 * then acc = fma(float(S), d_w * d_x, acc) in block order; the result is acc.
 *
 * Why the tile looks like this: the integer lanes of one (row, column, block) (8 int32 whose sum is S) come
 * out of the multiply-adds in one register, and converting and scaling them there, as the 8-lane numerics
 * before did, costs a convert and an FMA per (row, column, block) on the pipes the multiplies need. Here the
 * lanes of 8 (row, column) pairs are added into one register of their 8 block sums by a tree of horizontal
 * adds (6 vphaddd, a blend, a lane swap and an add per 8 pairs, the group function below), which then takes one convert, one multiply
 * (the 8 scale products) and one FMA. The 8 slots of such a register are
 *   columns layout (NC > 1): slot 4 i + c = row 2 g + i, column c: group g is 2 rows x 4 columns;
 *   rows layout (NC == 1):   slot i = row 8 g + i: group g is 8 rows (the decode gemv).
 * Missing rows or columns of an edge tile leave their slots zero, and their results are not stored. The
 * scale products of a group and block are one multiply of a vector of the slots' d_w by one of their d_x,
 * built per 8 blocks with a transpose (rows layout: 8 rows' scales; columns layout: 4 columns' d_x).
 *
 * Include after defining, in the including file (is_q4 a constant after inlining, blk a weight block):
 *   GQ_TILE            the name of the tile function to define
 *   GQ_G               the most groups a tile has (rows layout: 8 rows per group; columns layout: 2)
 *   GQ_SCALES8(p, st)  __m256: the 8 F16 scales at p, p + st, ... as floats
 *   GQ_UNPACK(is_q4, blk)      __m256i: the block's weights as the lanes need them
 *   GQ_LANES(is_q4, u, xq)     __m256i: 8 int32 lanes of one (row, column, block) whose sum is S - corr, or
 *                              when GQ_LANES16(is_q4) is 1, 16 int16 lanes, each of magnitude at most 3840
 *                              (two products of a nibble and a code: they are then added in 16 bits)
 *   GQ_CORR(is_q4)             the int32 corr of each block, as an offset in bytes into the column's aux to
 *                              an int32 array over blocks (rounded up to 8, zero past the end), or -1: none
 *   GQ_PREFETCH(p, n)          prefetch [p, p + n) (the gemv's stream), GQ_PF its distance in bytes
 *   GQ_GR, GQ_GC               the gemm's tile (rows, columns), GQ_AUX_BYTES(n) gemv_ops aux_bytes
 * and have float dx[] (the activation's block scales, zero from nb up to nb rounded up to 8) at the start of
 * each column's aux.
 */
#ifndef GQ_TILE
#error "define GQ_TILE and the other GQ_ macros before including gemm_q8_tile.h"
#endif

#ifndef GQ_HELPERS
#define GQ_HELPERS
/* Transposes 8 x 8 floats in registers: v[i] lane j becomes v[j] lane i. */
static inline __attribute__((always_inline)) void gq_transpose8(__m256 v[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        v[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

#define GQ_GLUE2(a, b) a##b
#define GQ_GLUE(a, b) GQ_GLUE2(a, b)
/* For the columns layout: t[k & 3] holds the 4 columns' values of blocks k (low half) and k + 4 (high half)
 * after this, from v[c] = column c's values of 8 blocks. */
static inline __attribute__((always_inline)) void gq_transpose4x8(const __m256 v[4], __m256 t[4])
{
    __m256 a = _mm256_unpacklo_ps(v[0], v[1]), b = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 c = _mm256_unpacklo_ps(v[2], v[3]), d = _mm256_unpackhi_ps(v[2], v[3]);
    t[0] = _mm256_shuffle_ps(a, c, 0x44);
    t[1] = _mm256_shuffle_ps(a, c, 0xEE);
    t[2] = _mm256_shuffle_ps(b, d, 0x44);
    t[3] = _mm256_shuffle_ps(b, d, 0xEE);
}
#endif

/* One block's 8 slots of group g in a register of their block sums: slot i's lanes made by GQ_LANES from its
 * row's unpacked weights (unpacked here, once per row) and its column's codes, added as gq_sum8 does. */
static inline __attribute__((always_inline)) __m256i GQ_GLUE(GQ_TILE, _group)(int is_q4, const int NR, const int NC,
                                                                         int g, const uint8_t *w, size_t ldw,
                                                                         const uint8_t *x, size_t ldx, int64_t b)
{
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    const int rows = NC == 1;
    __m256i u[2], h[4];
    if (!rows)
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++)
            u[i] = 2 * g + i < NR ? GQ_UNPACK(is_q4, w + (size_t)(2 * g + i) * ldw + (size_t)b * bb) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256i l[2];
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            int i = 2 * j + e, r = rows ? 8 * g + i : 2 * g + i / 4, c = rows ? 0 : i % 4;
            if (r < NR && c < NC) {
                __m256i xq = _mm256_loadu_si256((const __m256i *)((const struct block_q8_0 *)(x + (size_t)c * ldx) + b)->qs);
                l[e] = GQ_LANES(is_q4, rows ? GQ_UNPACK(is_q4, w + (size_t)r * ldw + (size_t)b * bb) : u[i / 4], xq);
            } else {
                l[e] = _mm256_setzero_si256();
            }
        }
        h[j] = GQ_LANES16(is_q4) ? _mm256_hadd_epi16(l[0], l[1]) : _mm256_hadd_epi32(l[0], l[1]);
    }
    if (GQ_LANES16(is_q4)) {
        /* 16-bit lanes: three levels of vphaddw leave slot i's sums over each 128-bit half in word i of that
         * half (at most 16 x 3840 = 61440 / 2: each half's sum fits in 16 bits, the block's may not); the
         * words are then paired, half with half, and widened and added by one vpmaddwd */
        __m256i v = _mm256_hadd_epi16(_mm256_hadd_epi16(h[0], h[1]), _mm256_hadd_epi16(h[2], h[3]));
        v = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(v, 0xD8),
                                _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1, 8, 9, 2,
                                                 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
        return _mm256_madd_epi16(v, _mm256_set1_epi16(1));
    }
    __m256i q0 = _mm256_hadd_epi32(h[0], h[1]), q1 = _mm256_hadd_epi32(h[2], h[3]); /* [0-3 low halves | 0-3 high] */
    return _mm256_add_epi32(_mm256_blend_epi32(q0, q1, 0xF0), _mm256_permute2x128_si256(q0, q1, 0x21));
}

/* Blocks b .. b + kn - 1 (kn <= 8) of the tile into acc (see GQ_TILE). */
static inline __attribute__((always_inline)) void GQ_GLUE(GQ_TILE, _step)(int is_q4, int64_t nb, const int NR,
                                                                     const int NC, const int kn, __m256 *acc,
                                                                     const uint8_t *w, size_t ldw, const uint8_t *x,
                                                                     size_t ldx, const uint8_t *aux, size_t ldaux,
                                                                     int64_t b)
{
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    const int rows = NC == 1, ng = rows ? (NR + 7) / 8 : (NR + 1) / 2;
    const long corr = GQ_CORR(is_q4);
    /* the weight scales of kn blocks per row (zero past kn and past NR) */
    __m256 dw8[8 * GQ_G];
#pragma GCC unroll 16
    for (int r = 0; r < 8 * ng; r++) {
        if (r >= NR) {
            dw8[r] = _mm256_setzero_ps();
        } else if (kn == 8) {
            dw8[r] = GQ_SCALES8(w + (size_t)r * ldw + (size_t)b * bb, bb);
        } else {
            float t[8] = {0};
            for (int k = 0; k < kn; k++) {
                uint16_t hw;
                memcpy(&hw, w + (size_t)r * ldw + (size_t)(b + k) * bb, 2);
                t[k] = _cvtsh_ss(hw);
            }
            dw8[r] = _mm256_loadu_ps(t);
        }
    }
    __m256 dxt[4], cxt[4]; /* columns layout: the 4 columns' d_x and corr (as bits) of blocks k, k + 4 */
    float dwm[2 * GQ_G][8] __attribute__((aligned(32)));
    if (rows) {
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++)
            gq_transpose8(dw8 + 8 * g); /* dw8[8 g + k] = the group's 8 rows at block k */
    } else {
        __m256 d8[4], c8[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            d8[c] = c < NC ? _mm256_loadu_ps((const float *)(aux + (size_t)c * ldaux) + b) : _mm256_setzero_ps();
            c8[c] = c < NC && corr >= 0 ? _mm256_loadu_ps((const float *)(aux + (size_t)c * ldaux + corr) + b)
                                        : _mm256_setzero_ps();
        }
        gq_transpose4x8(d8, dxt);
        gq_transpose4x8(c8, cxt);
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++)
            _mm256_store_ps(dwm[r], dw8[r]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < kn; k++) {
        __m256 dxv;
        __m256i cxv;
        if (rows) {
            dxv = _mm256_set1_ps(((const float *)aux)[b + k]);
            cxv = corr >= 0 ? _mm256_set1_epi32(((const int32_t *)(aux + corr))[b + k]) : _mm256_setzero_si256();
        } else {
            __m256 d = dxt[k & 3], c = cxt[k & 3];
            dxv = k < 4 ? _mm256_permute2f128_ps(d, d, 0x00) : _mm256_permute2f128_ps(d, d, 0x11);
            cxv = _mm256_castps_si256(k < 4 ? _mm256_permute2f128_ps(c, c, 0x00) : _mm256_permute2f128_ps(c, c, 0x11));
        }
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            __m256i sum = GQ_GLUE(GQ_TILE, _group)(is_q4, NR, NC, g, w, ldw, x, ldx, b + k);
            __m256 dwv = rows ? dw8[8 * g + k]
                              : _mm256_set_m128(_mm_broadcast_ss(&dwm[2 * g + 1 < NR ? 2 * g + 1 : 2 * g][k]),
                                                _mm_broadcast_ss(&dwm[2 * g][k]));
            if (corr >= 0)
                sum = _mm256_add_epi32(sum, cxv);
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dwv, dxv), acc[g]);
        }
    }
}

/* NR rows (w, ldw bytes apart) x NC columns (x, ldx bytes apart; their aux ldaux apart): s[c * lds + r].
 * pf: prefetch GQ_PF ahead along the stream of the tile's rows (the gemv). */
static inline __attribute__((always_inline)) void GQ_TILE(int is_q4, int64_t nb, const int NR, const int NC, float *s,
                                                          size_t lds, const uint8_t *w, size_t ldw, const uint8_t *x,
                                                          size_t ldx, const uint8_t *aux, size_t ldaux, int pf)
{
    const size_t bb = is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0);
    const int rows = NC == 1, ng = rows ? (NR + 7) / 8 : (NR + 1) / 2;
    __m256 acc[GQ_G];
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++)
        acc[g] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        if (pf)
            GQ_PREFETCH(w + GQ_PF + (size_t)b * (size_t)NR * bb, 8 * (size_t)NR * bb);
        GQ_GLUE(GQ_TILE, _step)(is_q4, nb, NR, NC, 8, acc, w, ldw, x, ldx, aux, ldaux, b);
    }
    if (b < nb)
        GQ_GLUE(GQ_TILE, _step)(is_q4, nb, NR, NC, (int)(nb - b), acc, w, ldw, x, ldx, aux, ldaux, b);
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        float t[8] __attribute__((aligned(32)));
        _mm256_store_ps(t, acc[g]);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            int r = rows ? 8 * g + i : 2 * g + i / 4, c = rows ? 0 : i % 4;
            if (r < NR && c < NC)
                s[(size_t)c * lds + r] = t[i];
        }
    }
}

/* The kernels built on the tile: <GQ_TILE>_gemv_q4_0 / _q8_0 (decode: tiles of 8 rows in the rows layout, then
 * single rows) and <GQ_TILE>_gemm_q4_0 / _q8_0 (GQ_GR rows x GQ_GC columns in gemm_tiles.h's blocking; a
 * column's activations and aux take ldx + GQ_AUX_BYTES(n) bytes), with gemv.h's gemv and gemm signatures. */
#define GQ_GEMV(name, IS_Q4, QK)                                                                            \
    static void GQ_GLUE(GQ_TILE, _gemv_##name)(int64_t n, int64_t nr, float *y, const void *w, size_t ldw,  \
                                               const void *x, const void *aux)                            \
    {                                                                                                     \
        const uint8_t *W = w, *X = x, *A = aux;                                                           \
        const int64_t nb = n / QK;                                                                        \
        int64_t i = 0;                                                                                    \
        for (; i + 8 <= nr; i += 8)                                                                       \
            GQ_TILE(IS_Q4, nb, 8, 1, y + i, 0, W + (size_t)i * ldw, ldw, X, 0, A, 0, 1);                   \
        for (; i < nr; i++)                                                                               \
            GQ_TILE(IS_Q4, nb, 1, 1, y + i, 0, W + (size_t)i * ldw, ldw, X, 0, A, 0, 0);                   \
    }
#define GQ_GEMM(name, IS_Q4, QK)                                                                            \
    static void GQ_GLUE(GQ_TILE, _gemm_##name)(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, \
                                               size_t ldw, const void *x, size_t ldx, const void *aux,    \
                                               size_t ldaux)                                              \
    {                                                                                                     \
        const uint8_t *W = w, *X = x, *A = aux;                                                           \
        const int64_t nb = n / QK;                                                                        \
        int jb = gemm_col_block(ldx + GQ_AUX_BYTES(n), GQ_GC);                                            \
        GEMM_TILES(nr, nc, jb, GQ_GR, GQ_GC, GQ_GEMM_TILE, IS_Q4)                                         \
    }
#define GQ_GEMM_TILE(is_q4, R, C, i, j)                                                                     \
    GQ_TILE(is_q4, nb, R, C, s + (size_t)(j) * lds + (i), lds, W + (size_t)(i) * ldw, ldw,                  \
            X + (size_t)(j) * ldx, ldx, A + (size_t)(j) * ldaux, ldaux, 0)

GQ_GEMV(q4_0, 1, QK4_0)
GQ_GEMV(q8_0, 0, QK8_0)
GQ_GEMM(q4_0, 1, QK4_0)
GQ_GEMM(q8_0, 0, QK8_0)
