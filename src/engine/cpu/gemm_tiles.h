/*
 * gemm_tiles: the one loop nest that the x86 gemm kernels (kernels_avx2.c, gemv_avx2.c, gemv_avx512q.c) run their
 * register tiles in (the R16 gemms and the 256-bit F16 gemm's main tiles run loops of their own that also ask for the
 * next rows: gemv_avx2.c's GV16_LOOPS and gv_gemm_f16_tiles). Activation columns are taken in cache blocks, so a
 * block's activations (and aux) stay in L2 while every row tile passes over them; within a block, tiles of R weight
 * rows x C columns, then the leftover columns one at a time, then the leftover rows one at a time. Each kernel keeps
 * its own tile, whose float operations per (row, column) are the same whatever the tile's shape, so the blocking never
 * changes a result. Also the one prefetch every R16 gemm call (these files' and gemv_avx512k.c's) makes of its first
 * group of rows (gemm_prefetch_first), how the 256-bit tiles of a group share the prefetch of the next
 * (gemm_prefetch_share; the F16 gemm's passes: gemm_prefetch_stride), and the decode gemv's prefetch of a line of
 * weights ahead of its stream with the hint the decode rule chooses (gemv_prefetch_line, cpu_decode_prefetch).
 */
#ifndef WAFER_ENGINE_GEMM_TILES_H
#define WAFER_ENGINE_GEMM_TILES_H

#include <stddef.h>

/* Columns per cache block when each column takes bytes_per_col of activations and aux: 256 KiB of them,
 * a multiple of c (at least c), at most 2^20. */
static inline int gemm_col_block(size_t bytes_per_col, int c)
{
    size_t cols = ((size_t)256 << 10) / (bytes_per_col ? bytes_per_col : 1);
    if (cols < (size_t)c)
        cols = (size_t)c;
    cols -= cols % (size_t)c;
    return cols > (1u << 20) ? 1 << 20 : (int)cols;
}

/* Every line of the first bytes of w (an R16 gemm call's first group of rows) asked into L1. The tiles
 * prefetch the next group while they read one, so without this each call starts on lines that come from
 * memory one miss after another: batched decode hands a product's rows out in several calls a thread
 * (op_matmul), and one core of the Zen 5, 8 columns of Q4_K over 2048-element rows from memory, ran 1.10x /
 * 1.30x faster with it in calls of 128 / 48 rows (level in one call over all rows; stop 38). */
static inline void gemm_prefetch_first(const void *w, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 64)
        __builtin_prefetch((const char *)w + i, 0, 3);
}

/* Tile ti of the nt tiles that read an R16 group (its halves times its column tiles, in the order they run): its
 * share of the next group's gbytes at nxt, which it prefetches nb blocks a call, *pfn bytes of the share at
 * each block's start (rounded up, so the blocks cover it); returns the share's start, or NULL without nxt or
 * share. Shares of at least a line a block: the group is cut into min(nt, gbytes / (64 nb)) of them, for the
 * first tiles. Why shares and not the whole next group from one tile: the lines then arrive at the rate the
 * group is computed, not in a burst at the rate of one tile. The 256-bit tiles of 8 columns in batched decode
 * read a group in two (Q4_0, Q8_0) or four (Q4_K, Q6_K) tiles; with the next group asked for by the first
 * alone, the two cores asked for 2x or 4x their average rate, about the whole machine's bandwidth on the Intel
 * Xeon family 6 model 207 (gemv_avx2.c, GV16_LOOPS, has the figures). */
static inline const unsigned char *gemm_prefetch_share(const void *nxt, size_t gbytes, int ti, int nt, long nb,
                                                       size_t *pfn)
{
    size_t k = gbytes / ((size_t)nb * 64);
    k = k < (size_t)nt ? k : (size_t)nt;
    k = k ? k : 1;
    size_t a = gbytes * (size_t)ti / k, z = gbytes * (size_t)(ti + 1) / k;
    *pfn = (z - a + (size_t)nb - 1) / (size_t)nb;
    return nxt && (size_t)ti < k ? (const unsigned char *)nxt + a : NULL;
}

/* How often each of passes passes over the current rows, steps steps each, asks for a line of the next rows'
 * bytes: every 2^sh steps for the returned sh, the largest with which the passes still ask for all of them
 * (passes x (steps >> sh) lines >= bytes), or 0 when even every step's line falls short. Spreading the next rows
 * over every pass brings them at the rate the current ones are computed (see gemm_prefetch_share); the F16 gemm
 * of gemv_avx2.c (gv_gemm_f16_tiles) asks this way. */
static inline int gemm_prefetch_stride(long steps, int passes, size_t bytes)
{
    int sh = 0;
    while ((steps >> (sh + 1)) > 0 && (size_t)passes * (size_t)(steps >> (sh + 1)) * 64 >= bytes)
        sh++;
    return sh;
}

/* The decode gemv's prefetch of the weight line at p, ahead of the stream, with the hint the decode rule chooses
 * (a constant in the inlined loop, from cpu_decode_prefetch): GEMV_PF_T1 prefetcht1 (into L2), GEMV_PF_NTA
 * prefetchnta, GEMV_PF_T0 prefetcht0 (into L1). */
enum { GEMV_PF_T1 = 0, GEMV_PF_NTA = 1, GEMV_PF_T0 = 2 };
static inline __attribute__((always_inline)) void gemv_prefetch_line(const void *p, const int hint)
{
    if (hint == GEMV_PF_NTA)
        __builtin_prefetch(p, 0, 0);
    else if (hint == GEMV_PF_T0)
        __builtin_prefetch(p, 0, 3);
    else
        __builtin_prefetch(p, 0, 2);
}

/* Runs TILE(arg, r, c, i, j) over an nr x nc product: the tile of r rows from row i and c columns from column
 * j, r in {R, 1} and c in {C, 1} constants (so each TILE call inlines with a fixed shape), columns in blocks of
 * jb (gemm_col_block); arg is passed through (a flag or a tile macro of the caller's). */
#define GEMM_TILES(nr, nc, jb, R, C, TILE, arg)                                                              \
    for (int gt_j0 = 0; gt_j0 < (nc); gt_j0 += (jb)) {                                                     \
        int gt_j1 = (nc) - gt_j0 < (jb) ? (nc) : gt_j0 + (jb);                                             \
        int gt_i = 0;                                                                                      \
        for (; gt_i + (R) <= (nr); gt_i += (R)) {                                                          \
            int gt_j = gt_j0;                                                                              \
            for (; gt_j + (C) <= gt_j1; gt_j += (C))                                                       \
                TILE(arg, R, C, gt_i, gt_j);                                                               \
            for (; gt_j < gt_j1; gt_j++)                                                                   \
                TILE(arg, R, 1, gt_i, gt_j);                                                               \
        }                                                                                                  \
        for (; gt_i < (nr); gt_i++) {                                                                      \
            int gt_j = gt_j0;                                                                              \
            for (; gt_j + (C) <= gt_j1; gt_j += (C))                                                       \
                TILE(arg, 1, C, gt_i, gt_j);                                                               \
            for (; gt_j < gt_j1; gt_j++)                                                                   \
                TILE(arg, 1, 1, gt_i, gt_j);                                                               \
        }                                                                                                  \
    }

#endif
