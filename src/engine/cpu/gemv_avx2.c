/*
 * gemv_avx2: the decode matrix-vector kernels (see gemv.h) for AVX2 + FMA + F16C, and the Q4_0 / Q8_0 gemm
 * for prefill and batched decode on CPUs without AVX-512 (AMD Zen 3; Intel's client CPUs and E-core Xeons,
 * whose AVX-VNNI the R16 Q4_0 / Q8_0 kernels and the Q4_K / Q6_K gemm use: gemv_ops_avx2_vnni, below), the
 * Q4_K / Q6_K gemm in the R16 layout, and the F16 gemm on F16 activations (below: "F16 x F16 gemm"). Compiled
 * with -mavx2 -mfma -mf16c (AVX-VNNI's two instructions by inline assembly: gv_dpbusd, and vpdpwssd in
 * gvk_dot_bsums); gemv_ops_avx2 hands them out only when
 * kernel_cpu_has_avx2() says the CPU has them, gemv_ops_avx2_vnni the AVX-VNNI ones only with
 * kernel_cpu_has_avx_vnni() (gemv.c chooses).
 *
 * Each kernel reproduces the float operations of the kernel_ops vec_dot of its type exactly (kernels_avx2.c):
 *   Q8_0, Q4_0 x Q8_0: kernels.c's block sums: per 32-element block the exact int32 sum S of w * x, then
 *     acc = fma(float(S), d_w * d_x, acc) in block order. Rows in GGUF order run gemm_q8_tile.h's tile (the
 *     lanes of 8 (row, column) pairs added into one register of block sums); rows in quant.h's R16 layout,
 *     which the backend chooses when these kernels run, the gv16 tile below (8 rows per register).
 *   Q4_K, Q6_K x Q8_K: kernels.c's block sums: per 256-element super-block the exact int32 sum S,
 *     acc = fma(float(S), d_w * d_x, acc), and for Q4_K the mins' sum M, acc = fma(-float(M), dmin_w * d_x,
 *     acc), in super-block order. Rows in GGUF order sum a row's 8 partial lanes at each block's end; rows in
 *     the R16 layout (the gvk16 kernels, which the backend chooses) hold 8 rows' block sums in one register.
 *   F16 x F32: 2 chains of 8 lanes over 16-element steps, 8-element steps into chain 0, a zero-padded tail
 *     into chain 0, then chain 0 + chain 1 and the fold.
 * Integer work is free to differ (it is exact): Q4_0 multiplies the unsigned nibbles (0..15) with the
 * activation and adds -8 x the block's sum of codes, precomputed once per activation row by prep, instead of
 * moving signs around per block; scale products d_w * d_x are made 8 blocks (rows layout) or 8 rows (R16) at
 * a time.
 *
 * Prefetch: the rows of a call are one contiguous stream, and a tile of NR rows reads NR row-sized pieces of
 * it in parallel, so the prefetch pointer runs GV_PF bytes ahead of the tile's position in that stream
 * (tile start + the fraction of the tile done), one prefetch per cache line, into L2. Measured on the 2-core
 * test machine, one thread, Q8_0 from DRAM: 7.1 GB/s with kernel_ops' per-row prefetch, 12.3-12.9 GB/s like
 * this. On a Zen 4 (AMD family 0x19 with AVX-512) the R16 gemv prefetch one line in 9 (GV_PF_SPARSE). On Intel
 * and Zen 3 the Q4_0 gemv reads two groups side by side (TWIN, gv16_gemv; Zen 3 Q8_0 too) and the K-quant gemv
 * asks for each line beside its kernel's load of it (SPREAD, gvk16_tile; the lone Q4_K column spreads a block's
 * lines evenly over its steps). F16 (little work per byte) does best on AMD with the hardware prefetcher alone
 * or the NTA hint, on an Intel Xeon with every line into L1 (below).
 *
 * F16 rows per tile, by the decode rule (cpu_decode_prefetch; built in: 4 streams everywhere, prefetched into L1 on
 * Intel (EVERY), with NTA on Zen 5, without on other AMD (NONE); a tune file may choose 4 adjacent rows a tile
 * (ROWS, Intel's rule before stop 43), or any of these): the streams cut the call's rows into 4 consecutive
 * quarters, and a tile takes row i of each, so each quarter is read from start to end as one sequential stream.
 * On AMD one stream per thread was first (Zen 4, 2 threads, 1B F16, 8 rounds interleaved with llama.cpp: 1.22x
 * the speed of 4 adjacent rows, whose prefetcher follows 4 interleaved rows poorly), but one row is bound by its
 * two FMA chains' latency (32 weight bytes per 4 cycles, about what a core's share of the bandwidth needs). With
 * the weights on huge pages (core/bigmem.h), on Zen 5 against llama.cpp in the same rounds: one stream
 * 1.06-1.43x, 4 streams 1.41-1.69x, 2 streams a little below 4 (docs/performance.md, stop 9). The sums are the
 * same either way (rows are independent).
 */
#include "engine/cpu/gemv.h"

#include "engine/cpu/kernels.h"
#include "engine/gguf/quant.h"

#include "engine/cpu/gemm_float_tile.h"
#include "engine/cpu/gemm_tiles.h"
#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <string.h>

#define GV_INLINE static inline __attribute__((always_inline))
/* Prefetch distance in bytes ahead along the stream of rows. 8 KiB, not the 16 KiB measured on the first Xeon:
 * on the Zen 5 with WAFER_NO_AVX512 (2 threads, `wafer bench --stream`'s matrices, 16 / 8 / 4 KiB builds
 * alternated run by run for 10 minutes, medians of kernels / plain read where the read gave 40-60 GB/s |
 * above 80 GB/s): Q4_0 0.971 / 0.981 / 0.984 | 0.931 / 0.932 / 0.872, Q8_0 0.972 / 0.983 / 0.993 | 0.846 /
 * 0.919 / 0.930, Q4_K 0.802 / 0.923 / 0.944 | 0.829 / 0.800 / 0.777, Q6_K 0.754 / 0.836 / 0.833 | 0.706 /
 * 0.704 / 0.618 (stop 36). */
#define GV_PF (8 << 10)

/* Under the SPARSE rule (cpu_decode_prefetch; built in on AMD family 0x19) the R16 gemv prefetch one line per
 * GV_PF_SPARSE bytes, GV_PF_SPARSE_AHEAD ahead, instead of every line GV_PF ahead. Measured on a Zen 4 running these
 * kernels (WAFER_NO_AVX512=1 wafer bench --stream TYPE; shares of a plain read, every line / none / sparse): one
 * thread Q4_0 0.78 / 0.99 / 0.93, Q8_0 0.62-0.65 / 0.94-1.01 / 0.92-0.94, Q4_K 0.68-0.71 / 0.80-0.82 / 0.81, Q6_K
 * (bound by its arithmetic here) 0.63 / 0.59 / 0.57; two threads Q4_0 0.87 / 0.95 / 1.00, Q8_0 0.90 / 1.00 / 1.00,
 * Q4_K 0.86 / - / 0.97, Q6_K 0.86 / 0.88 / 0.85 (stop 26). Zen 3, the family's CPU that runs them natively, reads
 * slowest with it (cpu_features.h: its rules are TWIN and SPREAD); the Zen 5 (family 0x1a) keeps EVERY. */
#define GV_PF_SPARSE 576
#define GV_PF_SPARSE_AHEAD (4 << 10)

#define GV16_TOUCH_NB 128 /* the Q4_0 decode gemv touches its column's blocks for rows of at most this many (gv16_tile) */

/* The R16 gemv's prefetch for type t under rule r (cpu_decode_prefetch(t), read once per call by the caller):
 * *ahead bytes ahead of the stream, one line every returned bytes, or 0 (the K-quants' SPREAD rule) each
 * block's lines one beside each load of its kernel (gvk16_tile). */
GV_INLINE size_t gv16_prefetch_rule(enum dtype t, enum cpu_prefetch r, size_t *ahead)
{
    *ahead = r == CPU_PREFETCH_SPARSE ? GV_PF_SPARSE_AHEAD : GV_PF;
    if (r == CPU_PREFETCH_SPREAD && (t == DTYPE_Q4_K || t == DTYPE_Q6_K))
        return 0;
    return r == CPU_PREFETCH_SPARSE ? GV_PF_SPARSE : 64;
}

/* Prefetches [p, p + n) into L2, one cache line every step bytes. Into L2 rather than L1: an L1 prefetch holds
 * one of the core's few L1 miss buffers for a whole DRAM latency, which caps a core's bandwidth; measured with
 * two threads streaming (fraction of the read probe's bandwidth): Q4_K 69% with T0, 77-78% with T1. */
GV_INLINE void gv_prefetch(const uint8_t *p, size_t n, size_t step)
{
    for (size_t i = 0; i < n; i += step)
        _mm_prefetch((const char *)p + i, _MM_HINT_T1);
}

/* Line i of a K-quant block's gb bytes at pf, into L2, if the block has it and pf is not NULL: the K-quant
 * gemm's prefetch of the next group, one line beside each load of the block's kernel (see gvk16_tile). */
GV_INLINE void gvk16_prefetch_line(const uint8_t *pf, int i, size_t gb)
{
    if (pf && (size_t)i * 64 < gb)
        _mm_prefetch((const char *)pf + (size_t)i * 64, _MM_HINT_T1);
}



static inline float gv_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* ---- Q8_0 / Q4_0 ---- */

/* aux of a Q8_0 activation row (nb blocks, nb8 = nb rounded up to 8): float dx[nb8] (the block scales, zero past
 * nb), then int32 c4[nb8] = -8 * the block's sum of codes (Q4_0's correction: its lanes multiply the unsigned
 * nibbles, w + 8), zero past nb. */
static size_t gv_dx_floats(int64_t nb) { return (size_t)((nb + 7) & ~(int64_t)7); }

static size_t gv_aux_bytes_q4_0(int64_t n) { return 2 * gv_dx_floats(n / QK8_0) * sizeof(float); }

static void gv_prep_q4_0(int64_t n, const void *x, void *aux)
{
    const struct block_q8_0 *bx = x;
    int64_t nb = n / QK8_0, nb8 = (int64_t)gv_dx_floats(nb);
    float *dx = aux;
    int32_t *c4 = (int32_t *)(dx + nb8);
    for (int64_t b = 0; b < nb; b++) {
        int32_t sum = 0;
        for (int j = 0; j < QK8_0; j++)
            sum += bx[b].qs[j];
        dx[b] = gv_h2f(bx[b].d);
        c4[b] = -8 * sum;
    }
    for (int64_t b = nb; b < nb8; b++)
        dx[b] = 0, c4[b] = 0;
}

/* The weights of one block for the lanes: Q4_0's nibbles (0..15: the low ones in the low 16 bytes, the high
 * ones in the high 16 bytes), Q8_0's bytes. */
GV_INLINE __m256i gv_unpack(int is_q4, const uint8_t *blk)
{
    if (is_q4) {
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const struct block_q4_0 *)blk)->qs));
        return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
    }
    return _mm256_loadu_si256((const __m256i *)((const struct block_q8_0 *)blk)->qs);
}

/* The lanes of one block whose sum is the block's sum of w * x: Q4_0 the nibbles (w + 8) times x, 16 int16 lanes
 * (pairs of products, at most 2 x 15 x 128), less the block's c4 (gemm_q8_tile.h adds them up in 16 bits and
 * adds c4); Q8_0 8 int32 lanes, the weight's sign moved onto x. Q4_0 is thus one multiply instruction per
 * (row, column, block) where Q8_0 needs two (its products' pairs overflow 16 bits when added). */
GV_INLINE __m256i gv_lanes(int is_q4, __m256i u, __m256i xq)
{
    if (is_q4)
        return _mm256_maddubs_epi16(u, xq);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(xq, u)), _mm256_set1_epi16(1));
}

/* acc + the sums of 4 products of u's unsigned bytes and s's signed bytes per int32 lane (vpdpbusd, AVX-VNNI's
 * VEX form), exact. By inline assembly, so that this file needs no -mavxvnni (GCC could then use the
 * instruction anywhere, in code that runs on CPUs without it); called only where kernel_cpu_has_avx_vnni(). */
GV_INLINE __m256i gv_dpbusd(__m256i acc, __m256i u, __m256i s)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
}

/* ---- Q8_0 / Q4_0 decode, prefill and batched decode: gemm_q8_tile.h's tile ----
 * The decode gemv runs 8 rows per tile (one register of block sums), the gemm GV_GR rows x GV_GC columns. */

#define GV_GR 4 /* gemm tile: rows */
#define GV_GC 4 /* gemm tile: columns */

#define GQ_TILE gv_tile_q
#define GQ_G 2
#define GQ_SCALES8(p, st) simd_f16x8_strided(p, st)
#define GQ_UNPACK(is_q4, blk) gv_unpack(is_q4, blk)
#define GQ_LANES(is_q4, u, xq) gv_lanes(is_q4, u, xq)
#define GQ_LANES16(is_q4) (is_q4)
#define GQ_CORR(is_q4) ((is_q4) ? (long)(gv_dx_floats(nb) * sizeof(float)) : -1L)
#define GQ_PREFETCH(p, n) gv_prefetch(p, n, 64)
#define GQ_PF GV_PF
#define GQ_GR GV_GR
#define GQ_GC GV_GC
#define GQ_AUX_BYTES(n) gv_aux_bytes_q4_0(n)
#include "engine/cpu/gemm_q8_tile.h"

/* ---- Q8_0 / Q4_0 in quant.h's R16 layout: 8 rows per register, no horizontal sums ----
 * A 256-bit load of an R16 dword holds that dword of 8 rows (half h of a 16-row group), so maddubs against the
 * activation's dword broadcast gives each row's products in its own 32-bit lane, and a block's sums of 8 rows
 * come out of vertical adds: Q4_0 adds its 8 maddubs (16-bit lanes of two products of a nibble and a code, at
 * most 2 x 15 x 128; 8 of them fit in 16 bits) and widens once with madd, so a (row, column, block) costs 1 +
 * 1/8 multiply instructions where the rows layout's tile needs 2 (maddubs + madd) and a share of the tree
 * that adds lanes across registers; Q8_0 (products' pairs up to 2 x 128 x 127) widens every maddubs. Then per
 * 8 rows one convert, one multiply of the scales, one FMA. Each column's adds are pinned in order (SIMD_KEEP):
 * left to GCC they were regrouped into a tree over all 48 products of a block and spilled (one Zen 5 core, 64
 * columns: Q4_0 79 -> 118 GMAC/s, Q8_0 66 -> 84; the Q4_0 tile now runs about 88% of the rate its vector
 * instructions allow, 22 per (8 rows, column, block) at about 3.3 a cycle).
 * With AVX-VNNI (the vnni tiles; kernel_cpu_has_avx_vnni) vpdpbusd adds a dword's 4 products of unsigned and
 * signed bytes into each int32 lane without saturating: Q4_0's 8 multiplies per (8 rows, column, block) go
 * straight into int32 lanes that start at c4 (no adds, no widening, no correction after: 11 instructions where
 * the maddubs form has 20), and Q8_0 multiplies its weights + 128 as unsigned bytes (one xor per 8 rows and
 * dword, shared by the tile's columns) with x into lanes that start at 16 c4 = -128 x the block's sum of codes,
 * one instruction per dword where the sign trick takes four. Same int32 sums, so the same bits. One core of
 * the Intel Xeon family 6 model 207 (WAFER_NO_AVX512=1, gemm16 over 256 rows x 2048 from L2, alternated):
 * Q4_0 8 columns 82-86 -> 113-118 GMAC/s in fast minutes (55-60 -> 71-74 in slow ones), 64 columns 56-88 ->
 * 88-114; Q8_0 8 columns 32-50 -> 62-106, 64 columns 42-52 -> 62-104; the one-column gemv Q4_0 28-30 ->
 * 30-54, Q8_0 21.5-35 -> 51-57 (docs/performance.md, stop 47). The tiles' widths stay the maddubs form's. */

#define GV16_C 6 /* gemm tile: columns (of 8 rows); with SIMD_KEEP, 4: 106, 5: 115, 6: 116-117, 7: 119-120, 8: 111-112
                   * GMAC/s (Q4_0, 64 columns), all 110-113 at 8 columns but 7 (Q8_0 8 columns: 7 gave 74, the rest 80-82) */
/* Calls of at most this many columns (batched decode) run one tile of all their columns (GV16_LOOPS with C 8)
 * instead of GV16_C and the rest: each half group's weights unpacked once, not twice. One core of the Intel
 * Xeon family 6 model 207 (WAFER_NO_AVX512; a program timing gemm16 over 256 rows x 2048 from L2, C 6 and 8
 * alternated 6 times, the fast minutes): Q4_0 8 columns 69-70 -> 76-79 GMAC/s; 16 and 64 columns, and Q8_0,
 * level (so C stays 6 for prefill, where the Zen 5 measured 8 slower). */
#define GV16_C_ONE 8

/* The gemm's tiles read their columns' records interleaved (gv16_records, in the call's scratch): block b's
 * record of column c (of the tile's NC) at (b NC + c) GV16_REC bytes, its 32 quants, the block scale dx (float)
 * and Q4_0's correction c4 (int32, see gv_dx_floats), so a tile walks one pointer with constant offsets where
 * it had three per column (24 for 8 columns, 18 for 6, more than the 16 registers: kept on the stack,
 * reloaded each block). One Xeon core as above, Q4_0 from L2: 8 columns 75 -> 87 GMAC/s (fast minutes), 43.5
 * -> 50.5 (slow); 16 columns 76-77 -> 87, 64 columns 80 -> 89-90 (the records faked by constant offsets);
 * Q8_0 level to +4%. The gemv (one column) reads the column as it is. */
#define GV16_REC 40
#define GV16_REC_DX 32 /* the record's float dx */
#define GV16_REC_C4 36 /* its int32 c4 */

/* Block b's record of column c as gv16_tile reads it: x the columns' rows (ldx bytes apart) and aux theirs
 * (ldaux apart), or with recs the records of NC columns (gv16_records). */
#define GV16_XQ(recs, NC, x, ldx, c, b)                                                                   \
    ((recs) ? (x) + ((size_t)(b) * (NC) + (c)) * GV16_REC                                                \
            : (const uint8_t *)((const struct block_q8_0 *)((x) + (size_t)(c) * (ldx)) + (b))->qs)

/* The records of nc columns (x rows ldx bytes apart, their aux ldaux apart; nb blocks each) into dst, nb nc
 * GV16_REC bytes. */
static void gv16_records(int64_t nb, int nc, const uint8_t *x, size_t ldx, const uint8_t *aux, size_t ldaux,
                         uint8_t *dst)
{
    const size_t c4off = gv_dx_floats(nb) * sizeof(float);
    for (int64_t b = 0; b < nb; b++)
        for (int c = 0; c < nc; c++, dst += GV16_REC) {
            const uint8_t *a = aux + (size_t)c * ldaux;
            memcpy(dst, ((const struct block_q8_0 *)(x + (size_t)c * ldx) + b)->qs, 32);
            memcpy(dst + GV16_REC_DX, a + (size_t)b * sizeof(float), 4);
            memcpy(dst + GV16_REC_C4, a + c4off + (size_t)b * sizeof(int32_t), 4);
        }
}

/* gv16_gemm's scratch: the records of a column block (gemm_col_block of a column's records), or of the one
 * tile's GV16_C_ONE columns if more. */
static size_t gv16_gemm_scratch(int64_t n)
{
    size_t rb = (size_t)(n / QK8_0) * GV16_REC;
    int jb = gemm_col_block(rb, GV16_C);
    return (size_t)(jb > GV16_C_ONE ? jb : GV16_C_ONE) * rb;
}

/* Q4_0's correction c4 of column c's block b, from its record (recs) or its aux (c4off bytes into it). */
GV_INLINE int32_t gv16_c4(const int recs, const int NC, const uint8_t *x, const uint8_t *aux, size_t ldaux,
                          size_t c4off, int c, int64_t b)
{
    int32_t c4;
    memcpy(&c4, recs ? GV16_XQ(1, NC, x, 0, c, b) + GV16_REC_C4 : aux + (size_t)c * ldaux + c4off + 4 * (size_t)b, 4);
    return c4;
}

/* Half h (8 rows) of block b of an R16 group (its dwords at q, its scales at hs) x NC columns (x, aux and recs
 * as gv16_tile's): acc[c] += the 8 rows' block sums times their scales, lane r row 8 h + r. */
GV_INLINE void gv16_half(int is_q4, const int vnni, int64_t nb, const int NC, const uint8_t *q, const uint8_t *hs,
                         int h, int64_t b, const int recs, const uint8_t *x, size_t ldx, const uint8_t *aux,
                         size_t ldaux, __m256 *acc)
{
    const size_t c4off = gv_dx_floats(nb) * sizeof(float);
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256i p[8];
    if (is_q4) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * k + 32 * h));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const uint8_t *xc = GV16_XQ(recs, NC, x, ldx, c, b);
                int32_t xl, xh;
                memcpy(&xl, xc + 4 * k, 4);
                memcpy(&xh, xc + 16 + 4 * k, 4);
                if (vnni) { /* int32 lanes from c4 on: no widening, no correction after */
                    if (!k)
                        p[c] = _mm256_set1_epi32(gv16_c4(recs, NC, x, aux, ldaux, c4off, c, b));
                    p[c] = gv_dpbusd(gv_dpbusd(p[c], lo, _mm256_set1_epi32(xl)), hi, _mm256_set1_epi32(xh));
                    continue;
                }
                __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
                p[c] = k ? _mm256_add_epi16(p[c], t) : t;
                SIMD_KEEP(p[c]); /* else GCC regroups the adds and spills */
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC && !vnni; c++)
            p[c] = _mm256_add_epi32(_mm256_madd_epi16(p[c], ones),
                                    _mm256_set1_epi32(gv16_c4(recs, NC, x, aux, ldaux, c4off, c, b)));
    } else {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * k + 32 * h)), av = _mm256_abs_epi8(v);
            /* AVX-VNNI: the weights + 128 as unsigned bytes times x, less 128 x the block's sum of codes
             * (= 16 c4) from the start */
            __m256i wu = _mm256_xor_si256(v, _mm256_set1_epi8(-128));
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                int32_t xk;
                memcpy(&xk, GV16_XQ(recs, NC, x, ldx, c, b) + 4 * k, 4);
                if (vnni) {
                    if (!k)
                        p[c] = _mm256_set1_epi32(16 * gv16_c4(recs, NC, x, aux, ldaux, c4off, c, b));
                    p[c] = gv_dpbusd(p[c], wu, _mm256_set1_epi32(xk));
                    continue;
                }
                __m256i t =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(_mm256_set1_epi32(xk), v)), ones);
                p[c] = k ? _mm256_add_epi32(p[c], t) : t;
                SIMD_KEEP(p[c]); /* else GCC regroups the adds and spills */
            }
        }
    }
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hs + 16 * h)));
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        float dx;
        memcpy(&dx, recs ? GV16_XQ(1, NC, x, ldx, c, b) + GV16_REC_DX
                         : aux + (size_t)c * ldaux + 4 * (size_t)b, 4);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[c]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[c]);
    }
}

/* NH halves (8 rows each, from half h0) of NG R16 groups (1, or 2 under the decode gemv's TWIN rule; a constant)
 * x NC columns: group g at grp + g gap, its sums at s + g sgap, s[c * lds + 8 (h0 + i) + r].
 * The columns: x and aux (their rows ldx and ldaux bytes apart), or with recs (a constant) their records at x
 * (gv16_records of exactly NC columns; aux unused). pf: NULL, or memory to prefetch into L2, pfn bytes of it at
 * each block's start (group g's at pf + g gap), one line every pfs bytes: the gemv its stream GV_PF ahead (or
 * GV_PF_SPARSE_AHEAD), a group's block's bytes a block; the gemm this tile's share of the next group
 * (gemm_prefetch_share, GV16_LOOPS). vnni (a constant): the AVX-VNNI form (kernel_cpu_has_avx_vnni only). */
GV_INLINE void gv16_tile(int is_q4, const int vnni, int64_t nb, const int NG, size_t gap, size_t sgap, const int NH,
                         const int NC, float *s, size_t lds, const uint8_t *grp, int h0, const int recs,
                         const uint8_t *x, size_t ldx, const uint8_t *aux, size_t ldaux, const uint8_t *pf, size_t pfs,
                         size_t pfn)
{
    const size_t nd = is_q4 ? 4 : 8;
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int i = 0; i < NG * NH; i++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[i][c] = _mm256_setzero_ps();
    /* The decode gemv of Q4_0 under the every-line rule touches the column's activation blocks a quarter, a
     * half and three quarters of the group ahead, into L1, as the AVX-512 gemv does its records (see
     * aq16_gemv_group in gemv_avx512q.c for why): on the Zen 5 with these kernels (stop 34, builds alternated
     * pass by pass over a 1B model's matrices from memory, 2 threads, kernels over a plain read) 0.69-0.77 ->
     * 0.79-0.85 in 7 rounds; its record and scale arrays touched as well, no better (0.79-0.83). Q8_0, not
     * measured better with them in the AVX-512 gemv, does without. And rows of more than GV16_TOUCH_NB blocks,
     * as there (whose blocks then miss L1 as often as the reads they were to spare): stop 35, these kernels on
     * a Zen 5, the 1B down product (n 8192) alone, builds alternated, kernels / plain read 0.954-0.986 with the
     * touch, 0.965-0.999 without; gate / up (n 2048) 0.973 with, 0.965-0.966 without. */
    const int touch = !recs && is_q4 && NC == 1 && pfs == 64 && nb <= GV16_TOUCH_NB;
    const int64_t t1 = nb / 4, t2 = nb / 2, t3 = nb - nb / 4; /* the touched blocks: b + t, mod nb */
    for (int64_t b = 0; b < nb; b++) {
        if (touch && !(b & 1)) { /* two lines from each pair start: the 68 bytes a step advances */
            const int64_t ts[3] = {t1, t2, t3};
#pragma GCC unroll 3
            for (int t = 0; t < 3; t++) {
                int64_t at = b + ts[t] < nb ? b + ts[t] : b + ts[t] - nb;
                const char *xr = (const char *)((const struct block_q8_0 *)x + at);
                _mm_prefetch(xr, _MM_HINT_T0);
                _mm_prefetch(xr + 64, _MM_HINT_T0);
            }
        }
#pragma GCC unroll 2
        for (int g = 0; g < NG; g++) { /* TWIN: a block of one group, then of the other */
            const uint8_t *q = grp + g * gap + quant_r16_dwords(1, nd, nb, b);
            const uint8_t *hs = grp + g * gap + quant_r16_scales(1, nd, nb, b);
            if (pf)
                gv_prefetch(pf + g * gap + (size_t)b * pfn, pfn, pfs);
#pragma GCC unroll 2
            for (int i = 0; i < NH; i++)
                gv16_half(is_q4, vnni, nb, NC, q, hs, h0 + i, b, recs, x, ldx, aux, ldaux, acc[g * NH + i]);
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 2
        for (int i = 0; i < NH; i++)
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                _mm256_storeu_ps(s + g * sgap + (size_t)c * lds + 8 * (h0 + i), acc[g * NH + i][c]);
}

/* The Q4_0 / Q8_0 decode gemv: nr rows (R16 groups at w) against one column. Under the TWIN rule two groups at a
 * time, group i beside group i + h (h: half the call's groups, rounded up), a block of each in turn, as the
 * AVX-512 gemv does (gemv_avx512q.c, aq16_gemv, says why; its pairs of blocks measured no different here). On the
 * Intel Xeon family 6 model 207 with WAFER_NO_AVX512=1 (stop 48): `wafer bench --tune` Q4_0 1.04-1.06x EVERY,
 * Q8_0 1.00; 1B Q4_0 tg64 (`wafer bench -p 0 -n 64 -r 2 -t 2`, builds alternated) with AVX2 alone 42.4-43.9 ->
 * 44.0-46.8 tokens/s (85-88% -> 86-90% of the probes beside), with AVX-VNNI 44.6-47.3 -> 46.1-49.3 (86-90% ->
 * 89-92%); Q8_0 26.2-27.4 against 26.0-27.2, so TWIN is Q4_0's rule there. One core from L2 (gemv16 over 256
 * rows x 2048) 48.9 -> 51.2 GMAC/s: the two groups share each block's activation loads. */
GV_INLINE void gv16_gemv(int is_q4, const int vnni, int64_t n, int64_t nr, float *y, const uint8_t *w, const uint8_t *x,
                         const uint8_t *aux)
{
    int64_t nb = n / QK8_0;
    const size_t gb = 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0)); /* a block's, a group */
    size_t gbytes = (size_t)nb * gb;
    const enum dtype t = is_q4 ? DTYPE_Q4_0 : DTYPE_Q8_0;
    const enum cpu_prefetch rule = cpu_decode_prefetch(t);
    size_t ahead, pfs = gv16_prefetch_rule(t, rule, &ahead);
    int64_t ng = nr / 16;
    if (rule == CPU_PREFETCH_TWIN && ng >= 2) {
        int64_t h = (ng + 1) / 2;
        for (int64_t i = 0; i < h; i++) {
            const uint8_t *g = w + (size_t)i * gbytes;
            if (i + h < ng) /* NG a constant in each call, so the accumulators stay in registers */
                gv16_tile(is_q4, vnni, nb, 2, (size_t)h * gbytes, (size_t)h * 16, 2, 1, y + i * 16, 0, g, 0, 0, x,
                          0, aux, 0, g + ahead, pfs, gb);
            else
                gv16_tile(is_q4, vnni, nb, 1, 0, 0, 2, 1, y + i * 16, 0, g, 0, 0, x, 0, aux, 0, g + ahead, pfs, gb);
        }
        return;
    }
    for (int64_t i = 0; i < ng; i++)
        gv16_tile(is_q4, vnni, nb, 1, 0, 0, 2, 1, y + i * 16, 0, w + (size_t)i * gbytes, 0, 0, x, 0, aux, 0,
                  w + (size_t)i * gbytes + ahead, pfs, gb);
}

/* The R16 gemm's loops, shared by the Q8_0 / Q4_0 and the K-quant kernels: column cache blocks of jb
 * columns, each 16-row group's two halves (8 rows each), tiles of C columns, then one tile of the last 1 to
 * C - 1 columns with their count as a constant (which keeps the accumulators in registers). TILE(NC, i, j, h,
 * g, pf, pfn) runs the tile of NC columns from j on half h of the group g of rows i..i+15, prefetching its share
 * of the next group, pfn bytes a block from pf (or NULL: gemm_prefetch_share), so that the next group arrives
 * over all of this one's tiles; the first group is asked for at the start (gemm_prefetch_first). Until stop 49
 * the first column tile of a group's first half asked for the whole next group: in batched decode (8 columns,
 * one tile a half for Q4_0 / Q8_0, two of 4 columns for the K-quants) that asked for lines at 2x / 4x the rate
 * the group was computed. On the Intel Xeon family 6 model 207 with WAFER_NO_AVX512=1 (`wafer bench --stream
 * TYPE -t 2 -b 8`, old and new builds alternated, GMAC/s from memory / from the cores' L2): Q4_0 (AVX-VNNI)
 * 187.6-193.5 / 225.7-227.6 -> 224.1 / 225.2, Q4_K 140.2-141.8 / 173.4-175.9 -> 164.8-168.5 / 161.9-170.6, Q6_K
 * 107.0-108.6 / 136.9-139.0 -> 124.5-128.4 / 131.9-135.4; 1B 8-sequence decode (`wafer bench -p 0 -n 64 -r 2
 * -t 2 --batch 8`, 3 pairs) Q4_0 with AVX-VNNI 161.9-163.8 -> 182.6-187.0 tokens/s, AVX2 alone 135.7-135.8 ->
 * 146.5-147.9, Q4_K_M 122.1-124.1 -> 141.8-146.9; pp512 level or faster (Q4_0 191.7-194.8 -> 196.1-198.4,
 * Q4_K_M 151.7-154.1 -> 155.0-155.8). */
#define GV16_LOOPS(C, jb, nr, nc, gbytes, nb, w, TILE)                                                       \
    gemm_prefetch_first((w), (gbytes));                                                                      \
    for (int j0 = 0; j0 < (nc); j0 += (jb)) {                                                                \
        int j1 = (nc) - j0 < (jb) ? (nc) : j0 + (jb), ntc = (j1 - j0 + (C) - 1) / (C); /* tiles a half */    \
        for (int i = 0; i < (nr); i += 16) {                                                                 \
            const uint8_t *g = (w) + (size_t)(i / 16) * (gbytes), *nxt = i + 16 < (nr) ? g + (gbytes) : NULL; \
            for (int h = 0; h < 2; h++) {                                                                    \
                int j = j0;                                                                                  \
                size_t pfn;                                                                                  \
                for (; j + (C) <= j1; j += (C)) {                                                            \
                    const uint8_t *pf = gemm_prefetch_share(nxt, (gbytes), h * ntc + (j - j0) / (C), 2 * ntc, \
                                                            (nb), &pfn);                                     \
                    TILE(C, i, j, h, g, pf, pfn);                                                            \
                }                                                                                            \
                const uint8_t *rn = gemm_prefetch_share(nxt, (gbytes), h * ntc + ntc - 1, 2 * ntc, (nb), &pfn); \
                _Static_assert((C) <= 8, "remainder cases: 1 to 7 columns");                                 \
                switch (j1 - j) {                                                                            \
                case 7: if (7 < (C)) TILE(7 < (C) ? 7 : 1, i, j, h, g, rn, pfn); break;                     \
                case 6: if (6 < (C)) TILE(6 < (C) ? 6 : 1, i, j, h, g, rn, pfn); break;                     \
                case 5: if (5 < (C)) TILE(5 < (C) ? 5 : 1, i, j, h, g, rn, pfn); break;                     \
                case 4: if (4 < (C)) TILE(4 < (C) ? 4 : 1, i, j, h, g, rn, pfn); break;                     \
                case 3: if (3 < (C)) TILE(3 < (C) ? 3 : 1, i, j, h, g, rn, pfn); break;                     \
                case 2: if (2 < (C)) TILE(2 < (C) ? 2 : 1, i, j, h, g, rn, pfn); break;                     \
                case 1: TILE(1, i, j, h, g, rn, pfn); break;                                                 \
                default: break;                                                                              \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }

GV_INLINE void gv16_gemm(int is_q4, const int vnni, int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w,
                         const uint8_t *x, size_t ldx, const uint8_t *aux, size_t ldaux, uint8_t *scratch)
{
    int64_t nb = n / QK8_0;
    size_t gbytes = (size_t)nb * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    const size_t rb = (size_t)nb * GV16_REC; /* a column's records */
    if (nc <= GV16_C_ONE) { /* one tile (of nc columns, the only j being 0) on the records */
        gv16_records(nb, nc, x, ldx, aux, ldaux, scratch);
#define GV16_TILE_ONE(NC, i, j, h, g, pf, pfn) \
    gv16_tile(is_q4, vnni, nb, 1, 0, 0, 1, NC, s + (i), lds, g, h, 1, scratch, 0, NULL, 0, pf, 64, pfn)
        GV16_LOOPS(GV16_C_ONE, GV16_C_ONE, nr, nc, gbytes, nb, w, GV16_TILE_ONE)
#undef GV16_TILE_ONE
        return;
    }
    /* Column blocks of jb columns, each's records interleaved tile by tile (GV16_C columns, then the rest: the
     * tiles GV16_LOOPS runs on the block) before all rows pass over them */
    int jb = gemm_col_block(rb, GV16_C);
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int m = nc - j0 < jb ? nc - j0 : jb;
        for (int j = 0; j < m; j += GV16_C)
            gv16_records(nb, m - j < GV16_C ? m - j : GV16_C, x + (size_t)(j0 + j) * ldx, ldx,
                         aux + (size_t)(j0 + j) * ldaux, ldaux, scratch + (size_t)j * rb);
        float *sj = s + (size_t)j0 * lds;
#define GV16_TILE(NC, i, j, h, g, pf, pfn) \
    gv16_tile(is_q4, vnni, nb, 1, 0, 0, 1, NC, sj + (size_t)(j) * lds + (i), lds, g, h, 1,                \
              scratch + (size_t)(j) * rb, 0, NULL, 0, pf, 64, pfn)
        GV16_LOOPS(GV16_C, m, nr, m, gbytes, nb, w, GV16_TILE)
#undef GV16_TILE
    }
}

#define GV16_FNS(name, IS_Q4, VNNI)                                                                          \
    static void gv16_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, const void *x, const void *aux) \
    {                                                                                                      \
        gv16_gemv(IS_Q4, VNNI, n, nr, y, w, x, aux);                                                       \
    }                                                                                                      \
    static void gv16_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, const void *x,  \
                                 size_t ldx, const void *aux, size_t ldaux, void *scratch)                 \
    {                                                                                                      \
        gv16_gemm(IS_Q4, VNNI, n, nr, nc, s, lds, w, x, ldx, aux, ldaux, scratch);                         \
    }

GV16_FNS(q4_0, 1, 0)
GV16_FNS(q8_0, 0, 0)
GV16_FNS(q4_0_vnni, 1, 1)
GV16_FNS(q8_0_vnni, 0, 1)

/* ---- Q4_K / Q6_K x Q8_K: the integer lanes exactly as kernels_avx2.c forms them ---- */

GV_INLINE void gv_tile_q4_k(int64_t nb, const int NR, float *y, const uint8_t *w, size_t ldw,
                            const struct block_q8_k *x, const void *aux)
{
    const size_t bb = sizeof(struct block_q4_k);
    const __m256i m4 = _mm256_set1_epi8(15);
    __m128 acc = _mm_setzero_ps(); /* row r in lane r */
    for (int64_t b = 0; b < nb; b++) {
        gv_prefetch(w + GV_PF + (size_t)b * NR * bb, NR * bb, 64);
        const struct block_q8_k *bx = x + b;
        uint8_t sc[4][8], mn[4][8];
        __m256i sumi[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            quant_q4_k_scales8(((const struct block_q4_k *)(w + (size_t)r * ldw) + b)->scales, sc[r], mn[r]);
            sumi[r] = _mm256_setzero_si256();
        }
        for (int k = 0; k < 4; k++) {
            __m256i y0 = _mm256_loadu_si256((const __m256i *)(bx->qs + 64 * k));
            __m256i y1 = _mm256_loadu_si256((const __m256i *)(bx->qs + 64 * k + 32));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const struct block_q4_k *bw = (const struct block_q4_k *)(w + (size_t)r * ldw) + b;
                __m256i raw = _mm256_loadu_si256((const __m256i *)(bw->qs + 32 * k));
                __m256i lo = _mm256_and_si256(raw, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_set1_epi16(sc[r][2 * k])),
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_set1_epi16(sc[r][2 * k + 1])));
                sumi[r] = _mm256_add_epi32(sumi[r], p);
            }
        }
        __m256i bsums = _mm256_loadu_si256((const __m256i *)bx->bsums), mm[2], z = _mm256_setzero_si256();
        /* [d row 0, dmin row 0, d row 1, dmin row 1] as F16, in registers: built in a float array (a store and
         * a wider load of the same bytes: the store's forwarding stalls) the gemv took 1.4x as long */
        int32_t dm[2] = {0, 0}; /* d, dmin of a row */
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) { /* NR <= 2 */
            const struct block_q4_k *bw = (const struct block_q4_k *)(w + (size_t)r * ldw) + b;
            __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn[r]));
            mm[r] = _mm256_madd_epi16(bsums, _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16)));
            memcpy(&dm[r], &bw->d, 4);
        }
        __m128i dd = _mm_setr_epi32(dm[0], dm[1], 0, 0);
        /* [S row 0, S row 1, M row 0, M row 1]: kernels.c's two fmas for both rows at once */
        __m128i sm = simd_hsum4_epi32(sumi[0], NR > 1 ? sumi[1] : z, mm[0], NR > 1 ? mm[1] : z);
        __m128 f = _mm_cvtepi32_ps(sm), dx = _mm_set1_ps(bx->d);
        __m128 df = _mm_mul_ps(_mm_cvtph_ps(dd), dx); /* [d0 dx, dmin0 dx, d1 dx, dmin1 dx] */
        acc = _mm_fmadd_ps(f, _mm_shuffle_ps(df, df, _MM_SHUFFLE(2, 2, 2, 0)), acc);
        acc = _mm_fnmadd_ps(_mm_movehl_ps(f, f), _mm_shuffle_ps(df, df, _MM_SHUFFLE(3, 3, 3, 1)), acc);
    }
    float v[4];
    _mm_storeu_ps(v, acc);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        y[r] = v[r];
}

GV_INLINE void gv_tile_q6_k(int64_t nb, const int NR, float *y, const uint8_t *w, size_t ldw,
                            const struct block_q8_k *x, const void *aux)
{
    const size_t bb = sizeof(struct block_q6_k);
    const __m256i m4 = _mm256_set1_epi8(15), m2h = _mm256_set1_epi8(0x30);
    __m128 acc = _mm_setzero_ps(); /* row r in lane r */
    for (int64_t b = 0; b < nb; b++) {
        gv_prefetch(w + GV_PF + (size_t)b * NR * bb, NR * bb, 64);
        const struct block_q8_k *bx = x + b;
        __m256i sumi[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            sumi[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++) {
                __m256i yv = _mm256_loadu_si256((const __m256i *)(bx->qs + 128 * h + 32 * qt));
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
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q, yv), sv));
                }
            }
        }
        __m256i bsums = _mm256_loadu_si256((const __m256i *)bx->bsums), t[4], z = _mm256_setzero_si256();
        short dr[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const struct block_q6_k *bw = (const struct block_q6_k *)(w + (size_t)r * ldw) + b;
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)bw->scales));
            __m256i off = _mm256_madd_epi16(bsums, sc16);
            t[r] = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(off, 5));
            dr[r] = (short)bw->d;
        }
        /* the rows' d as F16, set in registers (not loaded: a store and a wider load of the same bytes stalls
         * the store's forwarding, 1.4x the gemv's time) */
        __m128i dh = _mm_setr_epi16(dr[0], dr[1], dr[2], dr[3], 0, 0, 0, 0);
        __m128i S = simd_hsum4_epi32(t[0], NR > 1 ? t[1] : z, NR > 2 ? t[2] : z, NR > 3 ? t[3] : z);
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(S), _mm_mul_ps(_mm_cvtph_ps(dh), _mm_set1_ps(bx->d)), acc);
    }
    float v[4];
    _mm_storeu_ps(v, acc);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        y[r] = v[r];
}

/* ---- Q4_K / Q6_K in quant.h's R16 layout: 8 rows per register, block sums ----
 * As gemv_avx512k.c's R16 kernels, with 256-bit registers and no VNNI (a Zen 3 has none): a load of an R16
 * dword at half h holds that dword of 8 rows, so maddubs against the activation's dword broadcast gives each
 * row's products in its own lanes and kernels.c's block sums come out of vertical adds.
 *   Q4_K: a sub-block's 8 dwords of nibbles (0..15) x codes: 8 maddubs added in 16 bits (pairs of products at
 *     most 2 x 15 x 128, 8 of them 30,720 < 2^15), one madd by the rows' scale (an int16 pair per dword,
 *     picked into place by one vpshufb) into S. So 1 + 1/8 multiply instructions per 32 products of a row,
 *     where the rows layout needs 2 and horizontal adds. The mins' sum M: 8 madds of (m_j, m_j) by the bsums
 *     pair j.
 *   Q6_K: codes 0..63, so two maddubs fit in 16 bits (2 x 2 x 63 x 128 = 32,256): per 16-element group
 *     2 maddubs, an add, a madd by the signed scale, twice; the codes' +32 comes off as 32 x sum_g sc_g x
 *     bsums_g (8 madds).
 * Then per 8 rows and block one convert and one FMA (Q4_K: two of each). Each column's integer chains are
 * pinned in order (SIMD_KEEP), as in the Q4_0 tile above.
 * With AVX-VNNI (the vnni tiles, gemv_ops_avx2_vnni; since stop 49) a sub-block's (Q4_K) or group's (Q6_K)
 * dwords go straight into int32 lanes by vpdpbusd, and one vpmulld by the rows' scale (an int32 per dword,
 * gvk_pick32 / gvk_pick32_s8) adds them into S; the mins' and offsets' sums take vpdpwssd. The same exact
 * int32 S, so the same bits. The lone column (decode: GVK16_GEMV) keeps the maddubs form. */

/* gemm tile: columns (of 8 rows). One Zen 5 core, n 2048 x 512 rows from L2, 8 / 64 columns, GMAC/s (noisy
 * minutes): Q4_K 2 columns 91-106 / 92-107, 3 89-111 / 98-116, 4 101-119 / 107-126; Q6_K 2 55-70 / 63-74,
 * 3 63-77 / 73-83, 4 68-87 / 86-91 (the rows layout's tiles: Q4_K 67-72, Q6_K 53-57). */
#ifndef GVK16_C
#define GVK16_C 4
#endif

/* [s, s] int16 per dword: byte j (0-3) of each dword of v, zero-extended. */
GV_INLINE __m256i gvk_pick(__m256i v, int j)
{
    const __m256i off = _mm256_setr_epi32(0, 0x00040004, 0x00080008, 0x000c000c, 0, 0x00040004, 0x00080008, 0x000c000c);
    return _mm256_shuffle_epi8(v, _mm256_add_epi32(_mm256_set1_epi32((int)(0x80008000u | (uint32_t)j * 0x10001u)), off));
}

/* s int32 per dword: byte j (0-3) of each dword of v, zero-extended (the AVX-VNNI Q4_K tile's scales). */
GV_INLINE __m256i gvk_pick32(__m256i v, int j)
{
    const __m256i off = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
    return _mm256_shuffle_epi8(v, _mm256_add_epi32(_mm256_set1_epi32((int)(0x80808000u | (uint32_t)j)), off));
}

/* s int32 per dword: byte j (0-3) of each dword of v, sign-extended (the AVX-VNNI Q6_K tile's scales). */
GV_INLINE __m256i gvk_pick32_s8(__m256i v, int j)
{
    const __m256i off = _mm256_setr_epi32(0, 0x04000000, 0x08000000, 0x0c000000, 0, 0x04000000, 0x08000000, 0x0c000000);
    __m256i c = _mm256_add_epi32(_mm256_set1_epi32((int)(0x00808080u | (uint32_t)j << 24)), off);
    return _mm256_srai_epi32(_mm256_shuffle_epi8(v, c), 24);
}

/* [s_j, s_k] int16 per dword: bytes j and k (0-3) of each dword of v, sign-extended (Q6_K's scales). */
GV_INLINE __m256i gvk_pick_s8(__m256i v, int j, int k)
{
    const __m256i off = _mm256_setr_epi32(0, 0x04000400, 0x08000800, 0x0c000c00, 0, 0x04000400, 0x08000800, 0x0c000c00);
    __m256i c = _mm256_add_epi32(_mm256_set1_epi32((int)(0x00800080u | (uint32_t)j << 8 | (uint32_t)k << 24)), off);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(v, c), 8);
}

/* sum over l of the rows' int16 pair p[l] (one per dword) times the activation's bsums pair l (bsums 2l,
 * 2l + 1): Q4_K's mins term and Q6_K's offset term of a block, per row. */
GV_INLINE __m256i gvk_dot_bsums(const int vnni, const struct block_q8_k *bx, const __m256i p[8])
{
    __m256i t = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++) {
        int32_t bs;
        memcpy(&bs, bx->bsums + 2 * l, 4);
        if (vnni) /* vpdpwssd: the madd and the add in one, the same exact sums */
            __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(t) : "x"(p[l]), "x"(_mm256_set1_epi32(bs)));
        else
            t = _mm256_add_epi32(t, _mm256_madd_epi16(p[l], _mm256_set1_epi32(bs)));
    }
    return t;
}

/* A Q4_K block's end for half h (its dwords at q, the block's R16 scales at hs) and NC columns: the mins' sum M
 * of each row from the activation's bsums, then kernels.c's two FMAs of S[c] and M into acc[c]. */
GV_INLINE void gvk16_q4_k_end(const int vnni, const uint8_t *hs, int h, const uint8_t *q, const int NC,
                              const struct block_q8_k *const *bx, const __m256i *S, __m256 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(15), m6 = _mm256_set1_epi8(63), m30 = _mm256_set1_epi8(0x30);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(q + 64)), a2 = _mm256_loadu_si256((const __m256i *)(q + 128));
    __m256i mn[2] = {_mm256_and_si256(a1, m6), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a2, 4), m4),
                                                               _mm256_and_si256(_mm256_srli_epi32(a1, 2), m30))};
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hs + 16 * h)));
    __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hs + 32 + 16 * h)));
    __m256i mp[8]; /* (m_j, m_j) */
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        mp[j] = gvk_pick(mn[j >> 2], j & 3);
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        __m256i M = gvk_dot_bsums(vnni, bx[c], mp);
        __m256 dx = _mm256_set1_ps(bx[c]->d);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[c]), _mm256_mul_ps(dw, dx), acc[c]);
        acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(dmw, dx), acc[c]);
    }
}

/* Q4_K block b of half h (8 rows) of the group at grp (nb blocks) x NC columns' blocks bx[c]: acc[c] gets
 * kernels.c's two fmas. vnni (a constant; kernel_cpu_has_avx_vnni only): each sub-block's 8 dwords go into int32
 * lanes by vpdpbusd (at most 32 x 15 x 128 a row) and one vpmulld by the rows' scale adds them into S: 10
 * instructions per (8 rows, column, sub-block) where maddubs, its 16-bit adds and the madd take 17; the same
 * exact S. */
GV_INLINE void gvk16_block_q4_k(const int vnni, const uint8_t *grp, int64_t nb, int64_t b, int h, const int NC,
                                const struct block_q8_k *const *bx, __m256 *acc, const uint8_t *pf)
{
    const uint8_t *q = grp + quant_r16_dwords(2, 35, nb, b) + 32 * h, *hs = grp + quant_r16_scales(2, 35, nb, b);
    const __m256i m4 = _mm256_set1_epi8(15), m6 = _mm256_set1_epi8(63), m30 = _mm256_set1_epi8(0x30);
    __m256i a0 = _mm256_loadu_si256((const __m256i *)q), a2 = _mm256_loadu_si256((const __m256i *)(q + 128));
    /* sub-block scales j (byte j & 3 of sc[j >> 2]), as quant_q4_k_scales8 unpacks them */
    __m256i sc[2] = {_mm256_and_si256(a0, m6),
                     _mm256_or_si256(_mm256_and_si256(a2, m4), _mm256_and_si256(_mm256_srli_epi32(a0, 2), m30))};
    __m256i S[GVK16_C], p[GVK16_C];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) { /* sub-block j: nibbles (j & 1 ? high : low) of dwords 3 + 8 (j / 2) + l */
        /* Pointers GCC cannot see through, made in order (volatile): else it keeps sub-block j's 8 loads live
         * for sub-block j + 1 (the same addresses), and hoists every activation broadcast of the block to its
         * start; both spilled dozens of registers per block. */
        const uint8_t *qj = q, *xj[GVK16_C];
        __asm__ volatile("" : "+r"(qj));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            xj[c] = (const uint8_t *)bx[c]->qs + 32 * j;
            __asm__ volatile("" : "+r"(xj[c]));
        }
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            gvk16_prefetch_line(pf, 8 * j + l, 16 * sizeof(struct block_q4_k));
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qj + 64 * (3 + 8 * (j >> 1) + l)));
            __m256i v = j & 1 ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4) : _mm256_and_si256(raw, m4);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                int32_t y;
                memcpy(&y, xj[c] + 4 * l, 4);
                if (vnni) {
                    p[c] = gv_dpbusd(l ? p[c] : _mm256_setzero_si256(), v, _mm256_set1_epi32(y));
                    continue;
                }
                __m256i t = _mm256_maddubs_epi16(v, _mm256_set1_epi32(y));
                p[c] = l ? _mm256_add_epi16(p[c], t) : t;
                SIMD_KEEP(p[c]);
            }
        }
        __m256i sp = vnni ? gvk_pick32(sc[j >> 2], j & 3) : gvk_pick(sc[j >> 2], j & 3);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            __m256i t = vnni ? _mm256_mullo_epi32(p[c], sp) : _mm256_madd_epi16(p[c], sp);
            S[c] = j ? _mm256_add_epi32(S[c], t) : t;
            SIMD_KEEP(S[c]);
        }
    }
    gvk16_q4_k_end(vnni, hs, h, q, NC, bx, S, acc);
}

/* Q4_K block b of both halves (16 rows) against one column (decode), as gvk16_block_q4_k but with each load
 * of a dword serving both nibbles (sub-blocks 2jp and 2jp + 1) and each activation broadcast both halves: 16
 * loads per 16 rows and 8 elements instead of 32. On Zen 3, which issues two 256-bit loads a cycle, the
 * per-half form was bound by its loads (about 290 a block of 16 rows beside about 570 vector operations, about
 * 145 cycles of each, 265 measured); one core from L1 / L2 26.8-27.8 -> 33.1-34.1 GB/s (stop 52). The int16
 * pair sums and their scaled int32 sums are exact and the same values in another order, and the float
 * operations are gvk16_block_q4_k's in its order, so the bits are too. pf: NULL, or a block to prefetch (into
 * L2), its 36 lines spread evenly over the 32 steps (one or two a step: on Zen 3 kernels / plain read 0.82-0.89
 * against 0.78-0.82 with two a step over the first 18). */
GV_INLINE void gvk16_block_q4_k_1(const uint8_t *grp, int64_t nb, int64_t b, const struct block_q8_k *bx,
                                  __m256 *acc0, __m256 *acc1, const uint8_t *pf)
{
    const uint8_t *q = grp + quant_r16_dwords(2, 35, nb, b), *hs = grp + quant_r16_scales(2, 35, nb, b);
    const __m256i m4 = _mm256_set1_epi8(15), m6 = _mm256_set1_epi8(63), m30 = _mm256_set1_epi8(0x30);
    __m256i S[2];
#pragma GCC unroll 4
    for (int jp = 0; jp < 4; jp++) { /* sub-blocks 2jp (low nibbles) and 2jp + 1 (high) of dwords 3 + 8jp + l */
        /* pointers GCC cannot see through, made in order, as in gvk16_block_q4_k */
        const uint8_t *qj = q, *xj = (const uint8_t *)bx->qs + 64 * jp;
        __asm__ volatile("" : "+r"(qj), "+r"(xj));
        __m256i p[2][2];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            for (int i = 9 * (8 * jp + l) / 8; i < 9 * (8 * jp + l + 1) / 8; i++)
                gvk16_prefetch_line(pf, i, 16 * sizeof(struct block_q4_k));
            int32_t y0, y1;
            memcpy(&y0, xj + 4 * l, 4);
            memcpy(&y1, xj + 32 + 4 * l, 4);
            __m256i x0 = _mm256_set1_epi32(y0), x1 = _mm256_set1_epi32(y1);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(qj + 64 * (3 + 8 * jp + l) + 32 * h));
                __m256i t0 = _mm256_maddubs_epi16(_mm256_and_si256(raw, m4), x0);
                __m256i t1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), x1);
                p[h][0] = l ? _mm256_add_epi16(p[h][0], t0) : t0;
                p[h][1] = l ? _mm256_add_epi16(p[h][1], t1) : t1;
                SIMD_KEEP(p[h][0]);
                SIMD_KEEP(p[h][1]);
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* sub-block scales 2jp, 2jp + 1 of half h (byte j & 3 of sc[j >> 2]), as gvk16_block_q4_k unpacks */
            __m256i a0 = _mm256_loadu_si256((const __m256i *)(qj + 32 * h));
            __m256i a2 = _mm256_loadu_si256((const __m256i *)(qj + 128 + 32 * h));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(a2, m4), _mm256_and_si256(_mm256_srli_epi32(a0, 2), m30));
            __m256i sc = jp < 2 ? _mm256_and_si256(a0, m6) : hi;
            __m256i t0 = _mm256_madd_epi16(p[h][0], gvk_pick(sc, (2 * jp) & 3));
            __m256i t1 = _mm256_madd_epi16(p[h][1], gvk_pick(sc, (2 * jp + 1) & 3));
            S[h] = jp ? _mm256_add_epi32(S[h], _mm256_add_epi32(t0, t1)) : _mm256_add_epi32(t0, t1);
            SIMD_KEEP(S[h]);
        }
    }
    gvk16_q4_k_end(0, hs, 0, q, 1, &bx, &S[0], acc0);
    gvk16_q4_k_end(0, hs, 1, q + 32, 1, &bx, &S[1], acc1);
}

/* A Q6_K block's end for half h and NC columns (its R16 scales at hs, dwords of the half at q): S[c] (8 rows'
 * sums of codes 0..63 times the activation) less the codes' +32, 32 x sum_g scale_g x bsums_g, then kernels.c's
 * FMA into acc[c]. */
GV_INLINE void gvk16_q6_k_end(const int vnni, const uint8_t *hs, int h, const uint8_t *q, const int NC,
                              const struct block_q8_k *const *bx, const __m256i *S, __m256 *acc)
{
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hs + 16 * h)));
    __m256i sp[8]; /* (scale 2l, scale 2l + 1) */
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++)
        sp[l] = gvk_pick_s8(_mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(48 + (l >> 1)))),
                            (2 * l) & 3, (2 * l + 1) & 3);
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) {
        __m256i t = _mm256_sub_epi32(S[c], _mm256_slli_epi32(gvk_dot_bsums(vnni, bx[c], sp), 5));
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw, _mm256_set1_ps(bx[c]->d)), acc[c]);
    }
}

/* Code 3 of R16's Q6_K triple (a, b, c) (quant.h): its bits 0-1, 2-3, 4-5 are the top two of a, b, c, moved
 * down by 16-bit shifts (the bits a shift brings in from the byte above are masked off); codes 0-2 are the
 * triple's low 6 bits. 11 operations for the four codes where GGUF's nibbles and 2-bit fields took 17: on the
 * Xeon (family 6 model 207) with WAFER_NO_AVX512, 2 threads (`wafer bench --stream q6_k -t 2`, three pairs),
 * the lone column from L2 44 -> 52 GB/s, from memory 0.77-0.79 -> 0.80-0.84 of a plain read. */
GV_INLINE __m256i gvk_q6_k_code3(__m256i a, __m256i b, __m256i c)
{
    __m256i v = _mm256_and_si256(_mm256_srli_epi16(a, 6), _mm256_set1_epi8(3));
    v = _mm256_or_si256(v, _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0c)));
    return _mm256_or_si256(v, _mm256_and_si256(_mm256_srli_epi16(c, 2), _mm256_set1_epi8(0x30)));
}

/* Q6_K block b of half h, as gvk16_block_q4_k: step (hq, qt) is 32 elements, code qt of R16's triple (ql's
 * dwords 16hq + l and 16hq + 8 + l, qh's 32 + 8hq + l; quant.h) against the activation's bytes
 * 128hq + 32qt + 4l..; dwords 0-3 are group 8hq + 2qt, 4-7 group 8hq + 2qt + 1. vnni (a constant; AVX-VNNI
 * only): a group's 4 dwords into int32 lanes by vpdpbusd, times its scale by one vpmulld (6 instructions per
 * 8 rows, column and group where the maddubs form takes 10); the same exact S. */
GV_INLINE void gvk16_block_q6_k(const int vnni, const uint8_t *grp, int64_t nb, int64_t b, int h, const int NC,
                                const struct block_q8_k *const *bx, __m256 *acc, const uint8_t *pf)
{
    const uint8_t *q0 = grp + quant_r16_dwords(1, 52, nb, b) + 32 * h, *hs = grp + quant_r16_scales(1, 52, nb, b);
    const __m256i m6 = _mm256_set1_epi8(63);
    __m256i S[GVK16_C], p[GVK16_C];
#pragma GCC unroll 2
    for (int hq = 0; hq < 2; hq++) {
#pragma GCC unroll 4
        for (int qt = 0; qt < 4; qt++) {
            /* pointers GCC cannot see through, made in order, as in gvk16_block_q4_k: else it keeps quarter qt's
             * ql loads live for quarter qt + 2, and hoists the activation broadcasts */
            const uint8_t *q = q0, *xq[GVK16_C];
            __asm__ volatile("" : "+r"(q));
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                xq[c] = (const uint8_t *)bx[c]->qs + 128 * hq + 32 * qt;
                __asm__ volatile("" : "+r"(xq[c]));
            }
            __m256i sd = _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(48 + 2 * hq + (qt >> 1))));
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) {
                gvk16_prefetch_line(pf, 32 * hq + 8 * qt + l, 16 * sizeof(struct block_q6_k));
                const size_t k[3] = {16 * hq + l, 16 * hq + 8 + l, 32 + 8 * hq + l}; /* the triple's dwords */
                __m256i qv; /* 0..63 */
                if (qt < 3)
                    qv = _mm256_and_si256(
                        _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(k[qt]))), m6);
                else
                    qv = gvk_q6_k_code3(_mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(k[0]))),
                                        _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(k[1]))),
                                        _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(k[2]))));
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) {
                    int32_t y;
                    memcpy(&y, xq[c] + 4 * l, 4);
                    if (vnni) {
                        p[c] = gv_dpbusd(l & 3 ? p[c] : _mm256_setzero_si256(), qv, _mm256_set1_epi32(y));
                        continue;
                    }
                    __m256i t = _mm256_maddubs_epi16(qv, _mm256_set1_epi32(y));
                    p[c] = l & 1 ? _mm256_add_epi16(p[c], t) : t;
                    SIMD_KEEP(p[c]);
                }
                if (vnni && (l & 3) == 3) { /* group 8hq + 2qt + l / 4's four dwords */
                    __m256i sp = gvk_pick32_s8(sd, (2 * qt + (l >> 2)) & 3);
#pragma GCC unroll 8
                    for (int c = 0; c < NC; c++) {
                        __m256i t = _mm256_mullo_epi32(p[c], sp);
                        S[c] = hq || qt || l > 3 ? _mm256_add_epi32(S[c], t) : t;
                        SIMD_KEEP(S[c]);
                    }
                }
                if (!vnni && (l & 1)) { /* two dwords of group 8hq + 2qt + l / 4 */
                    int g = (2 * qt + (l >> 2)) & 3;
                    __m256i sp = gvk_pick_s8(sd, g, g);
#pragma GCC unroll 8
                    for (int c = 0; c < NC; c++) {
                        __m256i t = _mm256_madd_epi16(p[c], sp);
                        S[c] = hq || qt || l > 1 ? _mm256_add_epi32(S[c], t) : t;
                        SIMD_KEEP(S[c]);
                    }
                }
            }
        }
    }
    gvk16_q6_k_end(vnni, hs, h, q0, NC, bx, S, acc);
}

/* Q6_K block b of half h against one column (decode), as gvk16_block_q6_k but reading the block once in its
 * stored order (quant_r16_q6_k_dword): each step l loads the triple (ql's dwords 16hq + l and 16hq + 8 + l,
 * qh's 32 + 8hq + l) once and feeds all four quarters qt from it. The int16 pair sums (steps l - 1 and l) and
 * their scaled int32 sums are the same operations on the same values as gvk16_block_q6_k's, so the bits are too.
 * pf: NULL, or a block to prefetch (into L2) spread over the steps: its first 4 lines (its scales and the
 * dwords' first run) at the first, then the 3 lines after those at each step, the order it is stored and read in. */
GV_INLINE void gvk16_block_q6_k_1(const uint8_t *grp, int64_t nb, int64_t b, int h, const struct block_q8_k *bx,
                                  __m256 *acc, const uint8_t *pf)
{
    const uint8_t *q = grp + quant_r16_dwords(1, 52, nb, b) + 32 * h, *hs = grp + quant_r16_scales(1, 52, nb, b);
    const __m256i m6 = _mm256_set1_epi8(63);
    __m256i S = _mm256_setzero_si256(), p[4];
#pragma GCC unroll 2
    for (int hq = 0; hq < 2; hq++) {
        /* scales 8hq.. (quarters 0, 1) and 8hq + 4.. (quarters 2, 3) */
        __m256i sd[2] = {_mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(48 + 2 * hq))),
                         _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(49 + 2 * hq)))};
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            /* A pointer GCC cannot see through, made in order (volatile), and the chains pinned (SIMD_KEEP):
             * else it hoists the block's 64 activation broadcasts to its start and regroups the int32 adds to
             * its end, and spills both (188 stores per 16-row block); one Zen 5 core over 64 rows x 2048 from
             * L2 35 -> 42-46 GB/s, 2 threads from memory 0.58 -> 0.68 of a plain read at 85 GB/s (stop 36). */
            const int8_t *xl = bx->qs + 128 * hq + 4 * l;
            __asm__ volatile("" : "+r"(xl));
            if (pf) { /* 3,360 bytes: 4 lines, 3 a step, and the last step the half line after them */
                const int st = 8 * hq + l;
                for (int i = st ? 4 + 3 * st : 0; i < (st == 15 ? 53 : 7 + 3 * st); i++)
                    gvk16_prefetch_line(pf, i, 16 * sizeof(struct block_q6_k));
            }
            __m256i qa = _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(16 * hq + l)));
            __m256i qb = _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(16 * hq + 8 + l)));
            __m256i qc = _mm256_loadu_si256((const __m256i *)(q + 64 * quant_r16_q6_k_dword(32 + 8 * hq + l)));
            __m256i qv[4] = {_mm256_and_si256(qa, m6), _mm256_and_si256(qb, m6), _mm256_and_si256(qc, m6),
                             gvk_q6_k_code3(qa, qb, qc)};
#pragma GCC unroll 4
            for (int qt = 0; qt < 4; qt++) {
                int32_t y;
                memcpy(&y, xl + 32 * qt, 4);
                __m256i t = _mm256_maddubs_epi16(qv[qt], _mm256_set1_epi32(y));
                p[qt] = l & 1 ? _mm256_add_epi16(p[qt], t) : t;
                SIMD_KEEP(p[qt]);
                if (l & 1) { /* two dwords of group 8hq + 2qt + l / 4 */
                    int g = (2 * qt + (l >> 2)) & 3;
                    S = _mm256_add_epi32(S, _mm256_madd_epi16(p[qt], gvk_pick_s8(sd[qt >> 1], g, g)));
                    SIMD_KEEP(S);
                }
            }
        }
    }
    gvk16_q6_k_end(0, hs, h, q, 1, &bx, &S, acc);
}

/* NH halves (from half h0) of the K-quant (is_q6) group at grp x NC columns: s[c * lds + 8 (h0 + i) + r].
 * pf, pfs, pfn: what to prefetch into L2, as gv16_tile, except that pfs 0 (the gemv under the SPREAD rule; pfn
 * a group's block) spreads each block's lines over its kernel's loads, one beside each, as the AVX-512 K-quant
 * gemm does (gemv_avx512k.c, ak16_tile, says why). The gemv on the Intel Xeon family 6 model 207
 * (WAFER_NO_AVX512=1, `wafer bench --stream TYPE -t 2`, three rounds alternated, stop 48), every line at the
 * block's start / spread: Q6_K 0.82-0.85 / 0.88-0.94, Q4_K 0.91 / 0.93-0.99 (into L1 instead: Q4_K 0.81-0.85,
 * Q6_K 0.87-0.94). The gemm spread its next group that way too from stop 33 (Zen 5 with WAFER_NO_AVX512, 8
 * columns from memory, `wafer bench --stream q4_k -b 8`: kernels / plain read Q4_K 0.23-0.25 -> 0.28, Q6_K
 * 0.21-0.24 -> 0.31-0.32), all of it in a group's first tile; since stop 49 each tile asks for its share of it
 * (GV16_LOOPS), a few lines at each block's start: beside the loads, a share's run-time length cost the 8-column
 * tiles from L2 Q4_K 178 -> 147 GMAC/s, Q6_K 138 -> 120 (2 threads, the Xeon). */
GV_INLINE void gvk16_tile(int is_q6, const int vnni, int64_t nb, const int NH, const int NC, float *s, size_t lds,
                          const uint8_t *grp,
                          int h0, const uint8_t *x, size_t ldx, const uint8_t *pf, size_t pfs, size_t pfn)
{
    __m256 acc[2][GVK16_C];
#pragma GCC unroll 2
    for (int i = 0; i < NH; i++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[i][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        /* spread, where the block's kernel takes it (not the lone Q6_K column's, which reads in another order) */
        const uint8_t *pfb = pf && !pfs ? pf + (size_t)b * pfn : NULL;
        if (pf && !pfb)
            gv_prefetch(pf + (size_t)b * pfn, pfn, pfs);
        const struct block_q8_k *bx[GVK16_C];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            bx[c] = (const struct block_q8_k *)(x + (size_t)c * ldx) + b;
        if (!is_q6 && NC == 1 && NH == 2) {
            gvk16_block_q4_k_1(grp, nb, b, bx[0], &acc[0][0], &acc[1][0], pfb);
            continue;
        }
#pragma GCC unroll 2
        for (int i = 0; i < NH; i++) {
            if (is_q6 && NC == 1)
                gvk16_block_q6_k_1(grp, nb, b, h0 + i, bx[0], acc[i], i ? NULL : pfb);
            else if (is_q6)
                gvk16_block_q6_k(vnni, grp, nb, b, h0 + i, NC, bx, acc[i], i ? NULL : pfb);
            else
                gvk16_block_q4_k(vnni, grp, nb, b, h0 + i, NC, bx, acc[i], i ? NULL : pfb);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < NH; i++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm256_storeu_ps(s + (size_t)c * lds + 8 * (h0 + i), acc[i][c]);
}

GV_INLINE void gvk16_gemm(int is_q6, const int vnni, int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w,
                          const uint8_t *x, size_t ldx)
{
    int64_t nb = n / QK_K;
    size_t gbytes = (size_t)nb * 16 * (is_q6 ? sizeof(struct block_q6_k) : sizeof(struct block_q4_k));
    int jb = gemm_col_block(ldx, GVK16_C);
#define GVK16_TILE(NC, i, j, h, g, pf, pfn) \
    gvk16_tile(is_q6, vnni, nb, 1, NC, s + (size_t)(j) * lds + (i), lds, g, h, x + (size_t)(j) * ldx, ldx, pf, 64, pfn)
    GV16_LOOPS(GVK16_C, jb, nr, nc, gbytes, nb, w, GVK16_TILE)
#undef GVK16_TILE
}

/* The K-quant gemv16 (one column: the maddubs form, whose chains are short; vpdpbusd's, 8 dependent
 * instructions a sub-block, ran 1B Q4_K_M decode 1-4% slower with AVX-VNNI on the Xeon family 6 model 207) and
 * gemm16 (vnni: the AVX-VNNI form). */
#define GVK16_GEMV(name, IS_Q6, BS)                                                                        \
    static void gvk16_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, const void *x, const void *aux) \
    {                                                                                                      \
        size_t gbytes = (size_t)(n / QK_K) * 16 * (BS);                                                    \
        const enum dtype t = IS_Q6 ? DTYPE_Q6_K : DTYPE_Q4_K;                                             \
        size_t ahead, pfs = gv16_prefetch_rule(t, cpu_decode_prefetch(t), &ahead);                         \
        for (int64_t i = 0; i < nr; i += 16) {                                                             \
            const uint8_t *g = (const uint8_t *)w + (size_t)(i / 16) * gbytes;                             \
            gvk16_tile(IS_Q6, 0, n / QK_K, 2, 1, y + i, 0, g, 0, x, 0, g + ahead, pfs, (BS) * 16);         \
        }                                                                                                  \
    }
#define GVK16_GEMM(name, IS_Q6, VNNI)                                                                      \
    static void gvk16_gemm_##name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, const void *x, \
                                  size_t ldx, const void *aux, size_t ldaux, void *scratch)                \
    {                                                                                                      \
        gvk16_gemm(IS_Q6, VNNI, n, nr, nc, s, lds, w, x, ldx);                                             \
    }

GVK16_GEMV(q4_k, 0, sizeof(struct block_q4_k))
GVK16_GEMV(q6_k, 1, sizeof(struct block_q6_k))
GVK16_GEMM(q4_k, 0, 0)
GVK16_GEMM(q6_k, 1, 0)
GVK16_GEMM(q4_k_vnni, 0, 1)
GVK16_GEMM(q6_k_vnni, 1, 1)

/* ---- F16 x F32 ----
 * The activation's whole 16-element steps are read from aux, where prep (this file's gv_prep_f16, or
 * gemv_avx512k.c's af_prep, which writes the same F16 values for every whole 16 elements) stored them as F16:
 * they are F16 values (kernel_ops' F16 from_f32 rounds them), so converting them back is exact and the sums
 * are those of the F32 row. Half the bytes: a 4-row tile of an 8192-element row streams 64 KiB of weights
 * between two reads of the activation, which as 32 KiB of F32 did not stay in L1 beside them. Measured on a
 * Zen 5 (stop 35, `wafer bench --stream f16`'s matrices one shape at a time, builds alternated run by run,
 * medians of kernels / plain read, where the plain read gave 80-100 GB/s / 40-60): the 1B down product (n
 * 8192) 0.843 -> 0.917 / 0.976 -> 0.996, gate / up (n 2048) 0.915 -> 0.931 / 1.006 -> 1.007, q, k, v, o level
 * (0.909 / 0.908). The 8-element step and the tail read the F32 row. */
GV_INLINE void gv_tile_f16_pf(int64_t n, const int NR, float *y, const uint8_t *w, size_t ldw, const float *x,
                              const void *aux, const size_t pfd, const int t0)
{
    const uint16_t *xh = aux;
    __m256 a0[4], a1[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        a0[r] = a1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* no software prefetch but with pfd (the streams' NTA and EVERY rules, see gv_f16_streams): F16 rows are
         * whole pages read in order, which AMD's hardware prefetcher follows (measured there: 95-97% of the read
         * probe with L2 prefetches, 100%+ without, stop 9); t0: prefetcht0, else prefetchnta */
        if (pfd && (i & 31) == 0)
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                gemv_prefetch_line((const char *)w + (size_t)r * ldw + (size_t)i * 2 + pfd,
                                   t0 ? GEMV_PF_T0 : GEMV_PF_NTA);
        __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i)));
        __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i + 8)));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint16_t *wr = (const uint16_t *)(w + (size_t)r * ldw) + i;
            a0[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wr)), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wr + 8))), x1, a1[r]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 x0 = _mm256_loadu_ps(x + i);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++)
            a0[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(w + (size_t)r * ldw) + i))),
                                    x0, a0[r]);
    }
    if (i < n) { /* tail: zero-padded copies, so the padding adds exact zeros */
        size_t rem = (size_t)(n - i);
        float xt[8] = {0};
        memcpy(xt, x + i, rem * 4);
        __m256 x0 = _mm256_loadu_ps(xt);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            uint16_t wt[8] = {0};
            memcpy(wt, (const uint16_t *)(w + (size_t)r * ldw) + i, rem * 2);
            a0[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wt)), x0, a0[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        y[r] = simd_fold8(_mm256_add_ps(a0[r], a1[r]));
}

/* gv_tile_f16_pf without prefetches: F16 x F32 of NR rows ldw bytes apart. */
GV_INLINE void gv_tile_f16(int64_t n, const int NR, float *y, const uint8_t *w, size_t ldw, const float *x,
                           const void *aux)
{
    gv_tile_f16_pf(n, NR, y, w, ldw, x, aux, 0, 0);
}

static size_t gv_aux_none(int64_t n) { return 0; }
static void gv_prep_none(int64_t n, const void *x, void *aux) {}

#define GV_DEFINE(name, TILE, NR, NB)                                                                        \
    static void gv_gemv_##name(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,   \
                               const void *aux)                                                            \
    {                                                                                                      \
        const uint8_t *W = w;                                                                              \
        int64_t i = 0;                                                                                     \
        for (; i + NR <= nr; i += NR)                                                                      \
            TILE(NB, NR, y + i, W + (size_t)i * ldw, ldw, x, aux);                                         \
        for (; i < nr; i++)                                                                                \
            TILE(NB, 1, y + i, W + (size_t)i * ldw, ldw, x, aux);                                          \
    }

GV_DEFINE(q4_k, gv_tile_q4_k, 2, n / QK_K)
GV_DEFINE(q6_k, gv_tile_q6_k, 2, n / QK_K)
GV_DEFINE(f16, gv_tile_f16, 4, n)

#define GV_STREAMS 4
/* Under the NTA rule (cpu_decode_prefetch; built in on AMD family 0x1a) each stream prefetches (prefetchnta) every
 * line GV_F16_PF_NTA bytes ahead of its position, 8 KiB ahead in all: one core of the Zen 5 (`wafer bench --stream
 * f16 -t 1`, alternated, kernels / plain read) 0.95-0.96 against 0.91 with none; 1.5 KiB a stream 0.90, 2.5
 * 0.95-0.96, 3 0.91-0.92, 4 0.85-0.86, T1 at 2 KiB 0.83-0.84 (stop 39). */
#define GV_F16_PF_NTA (2 << 10)
/* Under the EVERY rule (built in on Intel) each stream prefetches every line into L1 (prefetcht0) GV_F16_PF_T0
 * bytes ahead, 4 KiB in all. On the Intel Xeon family 6 model 207 (Emerald Rapids, 2 threads, stop 43; `wafer bench
 * --tune --tune-types f16` of builds alternated, GB/s of weights / the plain read's): ROWS (4 adjacent rows, its
 * rule before) 0.84-0.91, the streams without prefetch 0.88-0.95, with prefetcht1 0.5 KiB ahead 1.01-1.04, 0.75
 * KiB 1.01-1.02, 1 KiB 1.00-1.08, 1.5 KiB 1.00-1.01, 2 KiB 0.98-1.02, 4 KiB 0.98-0.99; 4 adjacent rows with
 * prefetcht1 4 KiB ahead 0.88, 8 KiB 0.92-0.94; prefetcht0 1 KiB 1.08-1.09; prefetchnta (the NTA rule) 0.52-0.59.
 * In decode (1B F16 tg64, alternated) prefetcht0 1 KiB read 95-102% of the probes beside, prefetcht1 87-90%, ROWS
 * 72-73%: 11.1 -> 14.1-14.95 tokens/s. */
#define GV_F16_PF_T0 (1 << 10)
/* F16 in GV_STREAMS sequential streams (see the top): rows [k h, (k + 1) h) for k < GV_STREAMS with
 * h = nr / GV_STREAMS, a tile taking row i of each (rows h * ldw bytes apart), then the nr % GV_STREAMS last
 * rows one at a time; each stream prefetched as rule says (EVERY, NTA, else none). */
static void gv_f16_streams(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,
                           const void *aux, enum cpu_prefetch rule)
{
    const uint8_t *W = w;
    int64_t h = nr / GV_STREAMS;
    for (int64_t i = 0; i < h; i++) {
        float t[GV_STREAMS];
        if (rule == CPU_PREFETCH_NTA) /* a call per rule so that each inlined loop has its prefetch fixed */
            gv_tile_f16_pf(n, GV_STREAMS, t, W + (size_t)i * ldw, (size_t)h * ldw, x, aux, GV_F16_PF_NTA, 0);
        else if (rule == CPU_PREFETCH_EVERY)
            gv_tile_f16_pf(n, GV_STREAMS, t, W + (size_t)i * ldw, (size_t)h * ldw, x, aux, GV_F16_PF_T0, 1);
        else
            gv_tile_f16(n, GV_STREAMS, t, W + (size_t)i * ldw, (size_t)h * ldw, x, aux);
        for (int k = 0; k < GV_STREAMS; k++)
            y[k * h + i] = t[k];
    }
    for (int64_t i = GV_STREAMS * h; i < nr; i++)
        gv_tile_f16(n, 1, y + i, W + (size_t)i * ldw, ldw, x, aux);
}

/* The streams with the prefetch the rule asks for (tests call it whatever the rule's order). */
static void gv_gemv_f16_streams(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x,
                                const void *aux)
{
    enum cpu_prefetch rule = cpu_decode_prefetch(DTYPE_F16);
    gv_f16_streams(n, nr, y, w, ldw, x, aux, rule == CPU_PREFETCH_ROWS ? CPU_PREFETCH_NONE : rule);
}

/* ---- F16 x F16 gemm (prefill, batched decode) ----
 *
 * The activations are F16 values (kernel_ops' F16 from_f32 rounds them), so prep stores them as F16 in aux,
 * exactly, zero-padded to a multiple of 16, and gemm_float_tile.h's tile (vec_dot's operations in its order:
 * the same bits as kernel_ops gemm) converts both operands (the weights once a panel in prefill: GH_WB_TILES):
 * 16 bytes a vector instead of 32 for an F32 activation. GH_R x GH_C holds 12 accumulators, the 3 weight
 * vectors of a step and one activation.
 * Measured on a Zen 4 running these kernels (one core, 1,024 rows x 256 columns, GFLOP/s against kernel_ops
 * gemm's 6 x 2 tile on F32 activations, the same bits): 3 x 4 97 / 73 at n 2048 and 78 / 51 at n 8192, 4 x 3
 * 105 / 74 and 76 / 54, 6 x 2 96 / 69, 5 x 2 97 / 73, 2 x 4 85 / 74; with 8 columns (batched decode) 3 x 4
 * 100 / 73. 4 x 3 led by a little at n 2048 only (1B F16 pp256, 2 threads: 3 x 4 and 4 x 3 alike), and 3 x 4
 * tiles batches of 4 and 8 whole; the 1-3 columns a multiple of 4 leaves take 6 x 2 and 6 x 1 tiles (a batch of
 * 2 ran 45 GFLOP/s in 3 x 1 tiles, 91 in 6 x 2). */
#define GH_R 3
#define GH_C 4
#define GH_R2 6 /* rows of the tiles of the last 1-3 columns */
#define GH_KBL 1024 /* elements of the blocks each tile runs its two chains over in turn (gemm_float_tile) */
/* A column block of at least GH_WB_TILES tiles (prefill) reads each panel's rows converted to F32 once (rows of
 * at most GH_WB_MAXN elements: the panel on the stack), so a tile converts only its activations: 4 conversions a
 * step where both operands took 7 (about one a cycle goes through on the Intel Xeon family 6 model 207, where the
 * 12 FMAs take 6 cycles). One core of it, 240 rows x 64 columns from L2, GMAC/s F16 / converted rows: n 2048
 * 29.8 / 34.2, n 8192 29.3 / 31.1; but with 8 or 16 columns (batched decode; n 8192's blocks of 16 columns) the
 * conversion's share cost more than it saved: n 2048 8 columns 29.6 / 25.7-27.5, n 8192 16 columns 29.4 / 27.3.
 * Only where L1 holds a tile's 3 converted rows and 4 activation rows (40 KiB at n 2048; cpu_f16_gemm_f32_panels):
 * on a Zen 3 (32 KiB) they spill to L2, and one core of the AMD EPYC family 25 model 1 (the same 96 rows x 64
 * columns, n 2048, from L2, alternated) ran 31.7-33.1 GMAC/s converted, 40.5-43.3 on the F16 rows (stop 51). */
#define GH_WB_TILES 8
#define GH_WB_MAXN 8192

static size_t gv_aux_bytes_f16(int64_t n) { return (size_t)((n + 15) / 16) * 32; }

static void gv_prep_f16(int64_t n, const void *x, void *aux)
{
    const float *f = x;
    uint16_t *h = aux;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < (n + 15) / 16 * 16; i++)
        h[i] = i < n ? _cvtss_sh(f[i], _MM_FROUND_TO_NEAREST_INT) : 0;
}

#define GH_TILE(arg, R, C, i, j)                                                                                     \
    gemm_float_tile(GFT_F16, GFT_F16, 0, GH_KBL, n, R, C, s + (size_t)(j) * lds + (i), lds, W + (size_t)(i) * ldw,  \
                    ldw, XH + (size_t)(j) * ldaux, ldaux, NULL, NULL, 0)
_Static_assert(GH_R <= GFT_MAXR && GH_C <= GFT_MAXC && GH_R2 <= GFT_MAXR, "gemm_float_tile holds the F16 tiles");

/* The F16 gemm's GH_R x GH_C tiles over nr rows and nc (a multiple of GH_C) columns, in column blocks of jb; a
 * panel of GH_R rows is read by 2 nt passes (nt tiles of GH_C columns, two chains each), each of which asks for
 * its share of the next panel (the next GH_R rows, or the call's last ones), a line every 2^sh steps: sh the
 * largest that still covers the panel. Weights from memory arrive in the first of those passes otherwise, at
 * the rate of one pass where 2 nt of them compute the panel: in batched decode (8 columns, 2 tiles) one core
 * of the Intel Xeon family 6 model 207 (WAFER_NO_AVX512, n 2048 and 8192) ran 20-21 GMAC/s from memory and 29
 * from L2; the panel asked for in one burst before its passes was no faster (the bursts queue behind the
 * core's few miss buffers); spread like this 28.5 from memory, and 29 from L2 as before. */
static void gv_gemm_f16_tiles(int64_t n, int nr, int nc, int jb, float *s, size_t lds, const uint8_t *W, size_t ldw,
                              const uint8_t *XH, size_t ldaux)
{
    const size_t pb = GH_R * ldw; /* a panel's bytes */
    const int64_t steps = n / 16;
    const uint8_t *end = W + (size_t)nr * ldw;
    float wb[GH_R * GH_WB_MAXN]; /* [GH_R][n]: the panel's rows as F32 (GH_WB_TILES) */
    const bool f32_panels = cpu_f16_gemm_f32_panels();
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int j1 = nc - j0 < jb ? nc : j0 + jb, nt = (j1 - j0) / GH_C, sh = gemm_prefetch_stride(steps, 2 * nt, pb);
        const size_t share = (size_t)(steps >> sh) * 64; /* bytes a pass asks for */
        const bool conv = nt >= GH_WB_TILES && n <= GH_WB_MAXN && f32_panels;
        int i = 0;
        for (; i + GH_R <= nr; i += GH_R) {
            const uint8_t *nx = W + (size_t)(i + GH_R) * ldw;
            if (conv) {
                for (int r = 0; r < GH_R; r++)
                    gft_to_f32(GFT_F16, W + (size_t)(i + r) * ldw, wb + (size_t)r * n, n);
                for (int j = j0, t = 0; j < j1; j += GH_C, t++)
                    gemm_float_tile(GFT_F32, GFT_F16, 0, GH_KBL, n, GH_R, GH_C, s + (size_t)j * lds + i, lds,
                                    (const uint8_t *)wb, (size_t)n * 4, XH + (size_t)j * ldaux, ldaux,
                                    nx + 2 * (size_t)t * share, end, ((int64_t)1 << sh) - 1);
                continue;
            }
            for (int j = j0, t = 0; j < j1; j += GH_C, t++)
                gemm_float_tile(GFT_F16, GFT_F16, 0, GH_KBL, n, GH_R, GH_C, s + (size_t)j * lds + i, lds,
                                W + (size_t)i * ldw, ldw, XH + (size_t)j * ldaux, ldaux, nx + 2 * (size_t)t * share,
                                end, ((int64_t)1 << sh) - 1);
        }
        for (; i < nr; i++) /* the last 1 to GH_R - 1 rows */
            for (int j = j0; j < j1; j += GH_C)
                GH_TILE(0, 1, GH_C, i, j);
    }
}

static void gv_gemm_f16(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw, const void *x,
                        size_t ldx, const void *aux, size_t ldaux)
{
    const uint8_t *W = w, *XH = aux;
    int nc4 = nc - nc % GH_C;
    gv_gemm_f16_tiles(n, nr, nc4, gemm_col_block(ldaux, GH_C), s, lds, W, ldw, XH, ldaux);
    if (nc4 < nc) { /* the last 1-3 columns: their aux stays in L1 */
        s += (size_t)nc4 * lds;
        XH += (size_t)nc4 * ldaux;
        GEMM_TILES(nr, nc - nc4, nc - nc4, GH_R2, 2, GH_TILE, 0)
    }
}

/* Q4_0's aux extends Q8_0's, so one prep (Q4_0's) serves both, as gemv.h promises. */
static const struct gemv_ops gv_ops[] = {
    {DTYPE_Q4_0, gv_aux_bytes_q4_0, gv_prep_q4_0, gv_tile_q_gemv_q4_0, gv_tile_q_gemm_q4_0, gv16_gemv_q4_0, gv16_gemm_q4_0,
     gv16_gemm_scratch},
    {DTYPE_Q8_0, gv_aux_bytes_q4_0, gv_prep_q4_0, gv_tile_q_gemv_q8_0, gv_tile_q_gemm_q8_0, gv16_gemv_q8_0, gv16_gemm_q8_0,
     gv16_gemm_scratch},
    {DTYPE_Q4_K, gv_aux_none, gv_prep_none, gv_gemv_q4_k, NULL, gvk16_gemv_q4_k, gvk16_gemm_q4_k, NULL},
    {DTYPE_Q6_K, gv_aux_none, gv_prep_none, gv_gemv_q6_k, NULL, gvk16_gemv_q6_k, gvk16_gemm_q6_k, NULL},
};

/* With AVX-VNNI: the R16 Q4_0 / Q8_0 kernels and the Q4_K / Q6_K gemm on vpdpbusd; the rest as gv_ops. */
static const struct gemv_ops gv_ops_vnni[] = {
    {DTYPE_Q4_0, gv_aux_bytes_q4_0, gv_prep_q4_0, gv_tile_q_gemv_q4_0, gv_tile_q_gemm_q4_0, gv16_gemv_q4_0_vnni,
     gv16_gemm_q4_0_vnni, gv16_gemm_scratch},
    {DTYPE_Q8_0, gv_aux_bytes_q4_0, gv_prep_q4_0, gv_tile_q_gemv_q8_0, gv_tile_q_gemm_q8_0, gv16_gemv_q8_0_vnni,
     gv16_gemm_q8_0_vnni, gv16_gemm_scratch},
    {DTYPE_Q4_K, gv_aux_none, gv_prep_none, gv_gemv_q4_k, NULL, gvk16_gemv_q4_k, gvk16_gemm_q4_k_vnni, NULL},
    {DTYPE_Q6_K, gv_aux_none, gv_prep_none, gv_gemv_q6_k, NULL, gvk16_gemv_q6_k, gvk16_gemm_q6_k_vnni, NULL},
};

/* The F16 decode gemv the rule asks for (cpu_decode_prefetch, once a call): ROWS, else the streams. */
static void gv_gemv_f16_rule(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x, const void *aux)
{
    enum cpu_prefetch rule = cpu_decode_prefetch(DTYPE_F16);
    if (rule == CPU_PREFETCH_ROWS)
        gv_gemv_f16(n, nr, y, w, ldw, x, aux);
    else
        gv_f16_streams(n, nr, y, w, ldw, x, aux, rule);
}

static const struct gemv_ops gv_ops_f16_rows = {DTYPE_F16, gv_aux_bytes_f16, gv_prep_f16, gv_gemv_f16, gv_gemm_f16,
                                                NULL, NULL, NULL};
static const struct gemv_ops gv_ops_f16_rule = {DTYPE_F16, gv_aux_bytes_f16, gv_prep_f16, gv_gemv_f16_rule,
                                                gv_gemm_f16, NULL, NULL, NULL};
static const struct gemv_ops gv_ops_f16_streams = {DTYPE_F16, gv_aux_bytes_f16, gv_prep_f16, gv_gemv_f16_streams,
                                                   gv_gemm_f16, NULL, NULL, NULL};

const struct gemv_ops *gemv_ops_avx2_f16(bool streams)
{
    if (!kernel_cpu_has_avx2())
        return NULL;
    return streams ? &gv_ops_f16_streams : &gv_ops_f16_rows;
}

const struct gemv_ops *gemv_ops_avx2(enum dtype t)
{
    if (!kernel_cpu_has_avx2())
        return NULL;
    if (t == DTYPE_F16)
        return &gv_ops_f16_rule;
    for (size_t i = 0; i < sizeof gv_ops / sizeof gv_ops[0]; i++)
        if (gv_ops[i].type == t)
            return &gv_ops[i];
    return NULL;
}

const struct gemv_ops *gemv_ops_avx2_vnni(enum dtype t)
{
    if (!kernel_cpu_has_avx_vnni())
        return NULL;
    for (size_t i = 0; i < sizeof gv_ops_vnni / sizeof gv_ops_vnni[0]; i++)
        if (gv_ops_vnni[i].type == t)
            return &gv_ops_vnni[i];
    return NULL;
}
