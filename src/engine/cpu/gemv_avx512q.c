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
 * 52 nb8 bytes. The R16 gemm copies its columns' records block by block into its scratch first
 * (aq16_records_interleave), and its tile reads a (column, block)'s quants, start value and scale through one
 * pointer with constant displacements: with separate arrays at offsets that depend on nb, GCC kept an index per
 * dword in registers it had to reload from the stack, and the gemm was 1.2x slower (8 and 256 columns, n
 * 2048-8192).
 *
 * The R16 kernels (gemv16, gemm16; "the R16 layout" below) are the ones the engine runs on weights read into
 * memory. Weights in GGUF rows (a file mapped with --mmap, a matrix whose rows are not a multiple of 16) run
 * gemm_q8_tile.h's 256-bit tile (the gemv and gemm slots), as the AVX2 kernels do, with vpdpbusd for the
 * integer lanes. (Before stop 21 this file had its own row-pair kernels, two rows' 8-lane accumulators
 * interleaved in a zmm, for the 8-lane numerics; a rows tile of that numerics-bound design has no place in
 * the block-sum one, whose sums the R16 layout gives without any horizontal work.)
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#endif

#include "engine/cpu/gemv.h"

#include "engine/gguf/quant.h"

#include "engine/cpu/gemm_tiles.h"
#include "engine/cpu/simd_fold.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define AQ_INLINE static inline __attribute__((always_inline))
/* rows-layout gemv prefetch distance along the stream of rows, in bytes, into L2 */
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
/* Zen 4 (AMD family 0x19 with AVX-512) is the other way round: there a prefetch per line costs more than it
 * wins. 2 threads over the 1B model's matrices from memory (huge pages), variants alternated pass by pass:
 * none against one per line, Q4_0 1.10-1.36x (1.36x in a minute whose plain read reached 47 GB/s), Q8_0
 * 1.12-1.14x; T0 instead of T1, Q4_0 1.11x, Q8_0 0.98-1.03x; from L2 alone (no memory to hide) the loop
 * without them ran 1.2-1.35x faster, so the prefetch instructions themselves are what costs (stop 24). One
 * line per pair of blocks (Q4_0 576 bytes, Q8_0 1,088), 32 KiB ahead, against none (stop 25, same test, each
 * run the median of 20 alternations): Q4_0 1.00-1.30x, median 1.03x in 28 runs (fast-memory minutes as slow
 * ones), Q8_0 1.00-1.19x, median 1.02x in 18; one per block, or 16 KiB ahead,
 * no better; one per 4 blocks 1.0-1.05x; T0 0.97-1.04x. The hardware prefetcher fetches the lines between
 * (cpu_decode_prefetch's SPARSE). On the Zen 5 (family 0x1a, stop 32) Q8_0 gains from it too, Q4_0 does not:
 * `wafer bench --stream T -t 2`, WAFER_GEMV_PREFETCH=sparse / every alternated, kernels over a plain read,
 * Q8_0 1.01-1.16 (7 runs) / 0.80-1.00 (7), 1B Q8_0 tg128 38.3-39.9 / 25.9-28.9 tokens/s (3 pairs); Q4_0
 * 0.75-0.88 / 0.75-0.89 (7 each), tg128 70-75% / 81-83% of the probes beside (3 pairs). So Q8_0 asks
 * sparsely there and Q4_0 does not: the built-in rules of cpu_features.h. */
#ifndef AQ16_PF_SPARSE
#define AQ16_PF_SPARSE (32 << 10)
#endif

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

static size_t aq_aux_bytes(int64_t n) { return AQ_AUX16(aq_nb8(n / QK8_0)); }

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

/* ---- weights in GGUF rows (a file read through mmap, or rows not a multiple of 16): gemm_q8_tile.h ----
 * The 256-bit tile the AVX2 kernels run, with AVX512-VL's 256-bit vpdpbusd for the integer lanes: the weights
 * signed (Q4_0: nibble - 8), their magnitudes as the unsigned operand and their signs moved onto x, so no
 * correction is needed (the aux's dx prefix is all the tile reads). */

AQ_INLINE __m256i aq_rows_unpack(int is_q4, const uint8_t *blk)
{
    if (is_q4) { /* the low nibbles (elements 0-15) in the low 16 bytes, the high ones (16-31) in the high 16 */
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const struct block_q4_0 *)blk)->qs));
        v = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
        return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    }
    return _mm256_loadu_si256((const __m256i *)((const struct block_q8_0 *)blk)->qs);
}

AQ_INLINE void aq_rows_prefetch(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 64)
        _mm_prefetch((const char *)p + i, _MM_HINT_T1);
}

#define AQ_ROWS_R 4 /* gemm tile: rows x columns (gemm_q8_tile.h's columns layout) */
#define AQ_ROWS_C 4

#define GQ_TILE aq_rows_tile
#define GQ_G 2
#define GQ_SCALES8(p, st) simd_f16x8_strided(p, st)
#define GQ_UNPACK(is_q4, blk) aq_rows_unpack(is_q4, blk)
#define GQ_LANES(is_q4, u, xq) _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(u), _mm256_sign_epi8(xq, u))
#define GQ_LANES16(is_q4) 0
#define GQ_CORR(is_q4) (-1L)
#define GQ_PREFETCH(p, n) aq_rows_prefetch(p, n)
#define GQ_PF AQ_PF
#define GQ_GR AQ_ROWS_R
#define GQ_GC AQ_ROWS_C
#define GQ_AUX_BYTES(n) aq_aux_bytes(n)
#include "engine/cpu/gemm_q8_tile.h"


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
#define AQ16_TOUCH_NB 128 /* the Q4_0 decode gemv touches its column's records for rows of at most this many blocks */

/* The gemm's tile: 16 rows (the group at g) x NC columns: s[c * lds + r] for r < 16. rec: the NC columns'
 * records interleaved (aq16_records_interleave): block b's record of column c at rec + (b NC + c) AQ_REC. nxt:
 * the next group, every line of it prefetched as far along as this group is read, or NULL. */
AQ_INLINE void aq16_tile(int is_q4, int64_t nb, const int NC, float *s, size_t lds, const uint8_t *g,
                         const uint8_t *rec, const uint8_t *nxt)
{
    /* a block's bytes in the group (the prefetch's step; quant.h says where its scales and dwords are) */
    const size_t gb = 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0)), nd = is_q4 ? 4 : 8;
    const size_t coff = is_q4 ? AQ_REC_C4 : AQ_REC_C8;
    __m512 acc[AQ16_CMAX];
#pragma GCC unroll 16
    for (int c = 0; c < NC; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, rec += (size_t)NC * AQ_REC) {
        const uint8_t *q = g + quant_r16_dwords(1, nd, nb, b), *hs = g + quant_r16_scales(1, nd, nb, b);
        if (nxt)
            for (size_t i = 0; i < gb; i += 64)
                _mm_prefetch((const char *)nxt + (size_t)b * gb + i, _MM_HINT_T1);
        __m512i u[8];
        aq16_unsigned(is_q4, q, u);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs));
#pragma GCC unroll 16
        for (int c = 0; c < NC; c++) {
            const uint8_t *r = rec + (size_t)c * AQ_REC;
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

/* Block b's 16 rows (dwords at q, scales dw) against the one column whose record is r: acc + float(S_b) *
 * (d_w * d_x), aq16_tile's float operations for one column (Q4_0's exact S_b added up another way). */
AQ_INLINE __m512 aq16_block1(int is_q4, const uint8_t *q, __m512 dw, const uint8_t *r, __m512 acc)
{
    int32_t c0;
    float dx;
    memcpy(&c0, r + (is_q4 ? AQ_REC_C4 : AQ_REC_C8), 4);
    memcpy(&dx, r + AQ_REC_DX, 4);
    __m512i sb;
    if (is_q4) {
        /* The high nibbles where they lie (byte & 0xf0: 16 x the nibble; vpdpbusd's 4-product sums do not
         * saturate) into a chain of their own, shifted back at the end (exact: 16 x at most 16 x 15 x 128):
         * per block 4 shifts fewer, for a shift and an add, on the one port that shifts on Intel. */
        const __m512i m = _mm512_set1_epi8(0x0f);
        __m512i lo = _mm512_set1_epi32(c0), hi = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m512i v = _mm512_loadu_si512(q + 64 * k);
            lo = aq_dot_bcast(lo, _mm512_and_si512(v, m), r + 4 * k);
            hi = aq_dot_bcast(hi, _mm512_andnot_si512(m, v), r + 16 + 4 * k);
        }
        sb = _mm512_add_epi32(lo, _mm512_srai_epi32(hi, 4));
    } else {
        __m512i u[8];
        aq16_unsigned(is_q4, q, u);
        sb = aq16_bsum(u, r, c0);
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sb), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
}

/* The decode gemv of NG groups (1 or 2, a constant: 16 rows at g[k], nb blocks) against one column (its aux):
 * y[k][r] for r < 16; two side by side, a pair of blocks of one and then of the other (the TWIN rule). A pair
 * of blocks a step, as quant.h stores them (the two blocks' F16 scales, 64 bytes, then their dwords: Q4_0 576
 * bytes, 9 lines; Q8_0 1,088, 17), with a lone last block when nb is odd. Prefetches, into L2 (hint): every line of
 * the pair pf bytes ahead (AQ16_PF_Q4 / AQ16_PF_Q8), or, sparse, its first line (AQ16_PF_SPARSE ahead); with nta
 * every line with prefetchnta instead (the NTA rule, cpu_decode_prefetch: one Zen 5 core read the Q4_0
 * weights at 0.96-0.97 of a plain read with it, 0.91-0.92 with T1, 0.94 with T0; 0.95 at 4 KiB, 0.91 at 16;
 * stop 39). And for Q4_0 unless sparse, the aux records a quarter, a half and three quarters of the group ahead,
 * into L1 (with nta level without them: 0.97-0.98):
 *
 * Why the aux. A column's records (48 bytes a block, 3 KiB at n 2048) are read once per group, so between two
 * reads of a record 16 rows of weights stream past (18 KiB at n 2048 for Q4_0); on the Zen 5 they do not stay
 * in L1 that long, and refilling them cost Q4_0 decode up to 15% of its speed from memory. Measured there
 * (stop 34: a program alternating builds of this file pass by pass over a 1B model's matrices from memory, 2
 * threads, kernels over a plain read of the same bytes): the records of only 16 blocks reused over and over
 * (wrong numbers, for the experiment) 0.89-0.97 where the real ones gave 0.85-0.89; prefetching the records a
 * few blocks ahead, 0.82-0.85 (so the refill itself, not its wait, seems to be what costs); touching them
 * while they are still in L1, a quarter, half and three quarters of a group ahead (6 prefetches a pair of
 * blocks), 0.95-1.01. Q8_0, whose 17 lines a pair need half the arithmetic per byte, loses with them
 * (1.22-1.27 -> 1.09-1.12), and with them the sparse prefetch loses for Q4_0 (0.84). The K-quant gemv
 * (gemv_avx512k.c) measured no different with its Q8_K rows touched so. Why pairs: one step per 9 (17) lines,
 * the scales of both blocks in one load, no per-block offsets to compute. This against aq16_tile's one block
 * a step (16 rounds): Q4_0 0.80-0.90 -> 0.85-1.01 (level in the minutes whose plain read passed 50 GB/s),
 * Q8_0 (sparse) 1.10-1.29 -> 1.23-1.47; 1B Q8_0 tg128 (`wafer bench -p 0 -n 128 -r 3 -t 2`, 3 pairs) 39.2,
 * 44.6, 42.5 -> 51.5, 47.7, 51.1 tokens/s; 1B Q4_0 tg128 level within this VM's noise (5 pairs, 54.7-67.7
 * tokens/s both).
 *
 * Only while the records are few (AQ16_TOUCH_NB): a row of 256 blocks or more has 12 KiB of them, the touches
 * then miss L1 as often as the reads they were to spare and add their fills to the weights'. Measured on a Zen
 * 5 again (stop 35, another VM whose read probe gave 52-86 GB/s; `wafer bench --stream`'s matrices one shape
 * at a time, builds alternated run by run, medians of the runs' kernels / plain read): the 1B down product
 * (n 8192) with the touch 0.91-0.92 where the plain read gave 40-80 GB/s and 0.78-0.80 above 80, without it
 * 0.96 and 0.90-0.93; n 11008 (a 7B's down) 0.88 / 0.75 with, 0.95 / 0.90 without; the products of n 2048
 * and 4096 level either way (0.90-0.98; n 4096's gate / up above 80 GB/s 0.925 with, 0.904 without). In the
 * engine, 1B Q4_0 tg128 (`wafer bench -p 0 -n 128 -r 3 -t 2`, 5 rounds alternated) 111.4-114.3 tokens/s
 * touching every product, 113.6-116.5 touching those of n <= 2048 only; its down product 2.28 -> 2.09 ms a
 * token (WAFER_PROFILE). */
AQ_INLINE void aq16_gemv_group(int is_q4, int64_t nb, const int NG, float *const *y, const uint8_t *const *g,
                               const uint8_t *aux, size_t pf, const int sparse, const int hint)
{
    const size_t nd = is_q4 ? 4 : 8, pb = 2 * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    const uint8_t *rec0 = aux + AQ_OFF_REC(aq_nb8(nb)), *rec = rec0, *p[2] = {g[0], NG > 1 ? g[1] : g[0]};
    const int touch = is_q4 && !sparse && nb <= AQ16_TOUCH_NB;
    const int64_t t1 = nb / 4, t2 = nb / 2, t3 = nb - nb / 4; /* the touched records: b + t, mod nb */
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, p[0] += pb, p[1] += pb, rec += 2 * AQ_REC) {
        if (touch) {
            const int64_t ts[3] = {t1, t2, t3};
#pragma GCC unroll 3
            for (int t = 0; t < 3; t++) { /* 2 lines a pair: with the next pair's, every line of the records */
                int64_t at = b + ts[t] < nb ? b + ts[t] : b + ts[t] - nb;
                _mm_prefetch((const char *)rec0 + (size_t)at * AQ_REC, _MM_HINT_T0);
                _mm_prefetch((const char *)rec0 + (size_t)at * AQ_REC + 64, _MM_HINT_T0);
            }
        }
#pragma GCC unroll 2
        for (int k = 0; k < NG; k++) {
            /* the pair's first line before its first load, the others after (measured a little ahead of all
             * before) */
            gemv_prefetch_line((const char *)p[k] + pf, hint);
            __m512i sc = _mm512_loadu_si512(p[k]); /* the two blocks' 16 F16 scales each */
            if (!sparse)
                for (size_t i = 64; i < pb; i += 64)
                    gemv_prefetch_line((const char *)p[k] + pf + i, hint);
            const uint8_t *q = p[k] + 64;
            acc[k] = aq16_block1(is_q4, q, _mm512_cvtph_ps(_mm512_castsi512_si256(sc)), rec, acc[k]);
            acc[k] = aq16_block1(is_q4, q + 64 * nd, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc, 1)), rec + AQ_REC,
                                 acc[k]);
        }
    }
#pragma GCC unroll 2
    for (int k = 0; k < NG; k++) {
        if (b < nb) /* the lone last block: its 32 bytes of scales, then its dwords */
            acc[k] = aq16_block1(is_q4, p[k] + 32, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[k])), rec,
                                 acc[k]);
        _mm512_storeu_ps(y[k], acc[k]);
    }
}

/* The decode gemv of nr rows (R16 groups at w) against one column. Under the TWIN rule two groups at a time,
 * group i beside group i + h (h: half the call's groups, rounded up), a pair of blocks of each in turn: two
 * streams far apart (decode claims 2 MiB at a time under it, cpu_backend.c), which the Intel Xeon family 6
 * model 207's memory serves faster than one (docs/performance.md, stop 44: a plain read of each thread's
 * share as 2 runs, 1 KiB of each in turn, 1.07x one run front to back; 4 runs 1.10-1.14x). The 16 rows' sums
 * are the same operations either way. There (`wafer bench --stream q4_0 -t 2`, kernels / plain read)
 * 1.06-1.13 against 1.01-1.05 with one group at a time; in decode see cpu_features.h (+1.5-1.9%, medians of
 * 8 and 11 pairs; with 256 KiB claims, the two groups 126 KiB apart, level). Not tried on AMD. */
AQ_INLINE void aq16_gemv(int is_q4, int64_t n, int64_t nr, float *y, const uint8_t *w, const uint8_t *aux)
{
    int64_t nb = n / QK8_0, ng = nr / 16;
    size_t gbytes = (size_t)nb * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    enum cpu_prefetch rule = cpu_decode_prefetch(is_q4 ? DTYPE_Q4_0 : DTYPE_Q8_0);
    bool sparse = rule == CPU_PREFETCH_SPARSE, nta = rule == CPU_PREFETCH_NTA;
    size_t pf = is_q4 ? AQ16_PF_Q4 : AQ16_PF_Q8;
    if (rule == CPU_PREFETCH_TWIN && ng >= 2) {
        int64_t h = (ng + 1) / 2;
        for (int64_t i = 0; i < h; i++) {
            float *ys[2] = {y + i * 16, y + (i + h) * 16};
            const uint8_t *gs[2] = {w + (size_t)i * gbytes, w + (size_t)(i + h) * gbytes};
            if (i + h < ng) /* NG a constant in each call, so the two accumulators stay in registers */
                aq16_gemv_group(is_q4, nb, 2, ys, gs, aux, pf, 0, GEMV_PF_T1);
            else
                aq16_gemv_group(is_q4, nb, 1, ys, gs, aux, pf, 0, GEMV_PF_T1);
        }
        return;
    }
    for (int64_t i = 0; i < ng; i++) {
        float *ys[1] = {y + i * 16};
        const uint8_t *gs[1] = {w + (size_t)i * gbytes};
        if (sparse) /* a call per rule so that each inlined loop has its prefetches fixed */
            aq16_gemv_group(is_q4, nb, 1, ys, gs, aux, AQ16_PF_SPARSE, 1, GEMV_PF_T1);
        else if (nta)
            aq16_gemv_group(is_q4, nb, 1, ys, gs, aux, pf, 0, GEMV_PF_NTA);
        else
            aq16_gemv_group(is_q4, nb, 1, ys, gs, aux, pf, 0, GEMV_PF_T1);
    }
}

/* gemm16: at most AQ16_C columns per tile */
#ifndef AQ16_C
#define AQ16_C 12
#endif
_Static_assert(AQ16_C >= 1 && AQ16_C <= 16 && AQ16_C <= AQ16_CMAX, "aq16_tile_k's cases");

/* aq16_tile of k columns (1 <= k <= AQ16_C) through a constant column count, so the tile keeps its accumulators
 * in registers and reads its records at constant displacements. */
AQ_INLINE void aq16_tile_k(int is_q4, int64_t nb, int k, float *s, size_t lds, const uint8_t *g, const uint8_t *rec,
                           const uint8_t *nxt)
{
#define AQ16_K(K)                                                                                            \
    case K:                                                                                                  \
        if (K <= AQ16_C)                                                                                     \
            aq16_tile(is_q4, nb, K <= AQ16_C ? K : 1, s, lds, g, rec, nxt);                                  \
        break;
    switch (k) {
        AQ16_K(16) AQ16_K(15) AQ16_K(14) AQ16_K(13) AQ16_K(12) AQ16_K(11) AQ16_K(10) AQ16_K(9) AQ16_K(8) AQ16_K(7)
        AQ16_K(6) AQ16_K(5) AQ16_K(4) AQ16_K(3) AQ16_K(2) AQ16_K(1)
    default: break;
    }
#undef AQ16_K
}

/* Columns per cache block: a block's records stay in L2 (2 MiB per core here; half of it) while every group
 * passes over them. */
static int aq16_col_block(int64_t nb)
{
    size_t cols = ((size_t)1 << 20) / ((size_t)(nb > 0 ? nb : 1) * AQ_REC);
    cols -= cols % AQ16_C;
    return cols < AQ16_C ? AQ16_C : cols > (1u << 20) ? 1 << 20 : (int)cols;
}

/* The gemm's scratch for rows of n elements: one column block's records. */
static size_t aq16_gemm_scratch(int64_t n)
{
    int64_t nb = n / QK8_0;
    return (size_t)aq16_col_block(nb) * (size_t)nb * AQ_REC;
}

/* The records of nc columns (their aux ldaux bytes apart) into dst block by block: block b's records of the nc
 * columns one after another, at dst + (b nc + c) AQ_REC.
 *
 * Why: in each column's own aux a tile of 8-12 columns reads 8-12 streams of records, one line or two per
 * column and block; interleaved, one. Measured on the Zen 5 (stop 34, a program alternating builds of this file
 * pass by pass over a 1B model's matrices, 2 threads, the interleaving included): 8 columns from memory (batched
 * decode) Q4_0 261-361 -> 320-421 GMAC/s, Q8_0 167-246 -> 195-254 (5 rounds); 256 columns (prefill) Q4_0 401-419
 * -> 438-450, Q8_0 390-441 -> 424-500 (3 rounds). Each thread interleaves a column block once per call, which
 * those figures include (a 1B layer's seven products at 8 columns: about 0.2 MB copied a thread). */
static void aq16_records_interleave(int64_t nb, const uint8_t *aux, size_t ldaux, int nc, uint8_t *dst)
{
    size_t off = AQ_OFF_REC(aq_nb8(nb)), step = (size_t)nc * AQ_REC;
    for (int c = 0; c < nc; c++) {
        const uint8_t *src = aux + (size_t)c * ldaux + off;
        uint8_t *d = dst + (size_t)c * AQ_REC;
        for (int64_t b = 0; b < nb; b++)
            memcpy(d + (size_t)b * step, src + (size_t)b * AQ_REC, AQ_REC);
    }
}

/* Per column block, its columns' records interleaved tile by tile into scratch (aq16_gemm_scratch(n) bytes),
 * then each group against the block's columns in nt = ceil(columns / AQ16_C) tiles of as equal widths as can
 * be (13 columns: 7 + 6, not 12 + 1: the weights' unpacking is per tile), the last tile prefetching the next
 * group. */
AQ_INLINE void aq16_gemm(int is_q4, int64_t n, int nr, int nc, float *s, size_t lds, const uint8_t *w,
                         const uint8_t *aux, size_t ldaux, uint8_t *scratch)
{
    int64_t nb = n / QK8_0;
    size_t gbytes = (size_t)nb * 16 * (is_q4 ? sizeof(struct block_q4_0) : sizeof(struct block_q8_0));
    size_t tcol = (size_t)nb * AQ_REC; /* a column's records */
    int jb = aq16_col_block(nb);
    gemm_prefetch_first(w, gbytes);
    for (int j0 = 0; j0 < nc; j0 += jb) {
        int m = nc - j0 < jb ? nc - j0 : jb, nt = (m + AQ16_C - 1) / AQ16_C;
        for (int t = 0; t < nt; t++) { /* tile t's records at scratch + (ja - j0) tcol */
            int ja = j0 + m * t / nt, jz = j0 + m * (t + 1) / nt;
            aq16_records_interleave(nb, aux + (size_t)ja * ldaux, ldaux, jz - ja, scratch + (size_t)(ja - j0) * tcol);
        }
        for (int i = 0; i < nr; i += 16) {
            const uint8_t *g = w + (size_t)(i / 16) * gbytes, *nxt = i + 16 < nr ? g + gbytes : NULL;
            for (int t = 0; t < nt; t++) {
                int ja = j0 + m * t / nt, jz = j0 + m * (t + 1) / nt;
                aq16_tile_k(is_q4, nb, jz - ja, s + (size_t)ja * lds + i, lds, g, scratch + (size_t)(ja - j0) * tcol,
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
                                 size_t ldx, const void *aux, size_t ldaux, void *scratch)                 \
    {                                                                                                      \
        aq16_gemm(IS_Q4, n, nr, nc, s, lds, w, aux, ldaux, scratch);                                       \
    }

AQ16_FNS(q4_0, 1)
AQ16_FNS(q8_0, 0)

static const struct gemv_ops aq_ops[] = {
    {DTYPE_Q4_0, aq_aux_bytes, aq_prep, aq_rows_tile_gemv_q4_0, aq_rows_tile_gemm_q4_0, aq16_gemv_q4_0, aq16_gemm_q4_0,
     aq16_gemm_scratch},
    {DTYPE_Q8_0, aq_aux_bytes, aq_prep, aq_rows_tile_gemv_q8_0, aq_rows_tile_gemm_q8_0, aq16_gemv_q8_0, aq16_gemm_q8_0,
     aq16_gemm_scratch},
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
