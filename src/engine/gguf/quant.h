/*
 * quant: reference (scalar, portable) conversions between rows of float and each supported storage type,
 * bit-compatible with GGML's block layouts so files quantized by llama.cpp read correctly and files we
 * write load in llama.cpp.
 *
 * Block layouts (all little endian; d/dmin are IEEE half):
 *   Q8_0  (32 elems, 34 B):  {f16 d; int8 qs[32]}                     x = d * q
 *   Q4_0  (32 elems, 18 B):  {f16 d; u8 qs[16]}   x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   Q4_K  (256 elems, 144 B): {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]} 8 sub-blocks of 32 with 6-bit
 *                              scale/min packed in scales; x = d*sc*q - dmin*m
 *   Q6_K  (256 elems, 210 B): {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}  x = d*sc*(q6 - 32)
 *   Q8_K  (256 elems, 292 B): {f32 d; int8 qs[256]; int16 bsums[16]}  (activation format for K-quants)
 *   F16, BF16, F32: plain.
 */
#ifndef WAFER_ENGINE_QUANT_H
#define WAFER_ENGINE_QUANT_H

#include "engine/dtype.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The blocks as C structs (packed by construction: every member is naturally aligned and the sizes below are
 * checked at compile time), shared by the converters and the kernels. Fields follow GGML's order. */
struct block_q8_0 {
    uint16_t d;        /* f16 scale */
    int8_t qs[QK8_0];  /* x[j] = d * qs[j] */
};
struct block_q4_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* low nibble: element j, high nibble: element j + 16; value = nibble - 8 */
};
struct block_q4_k {
    uint16_t d;                    /* f16 super-scale of the sub-block scales */
    uint16_t dmin;                 /* f16 super-scale of the sub-block mins */
    uint8_t scales[K_SCALE_SIZE];  /* 8 six-bit scales + 8 six-bit mins, see quant_q4_k_scale_min */
    uint8_t qs[QK_K / 2];          /* per 64 elements: 32 bytes, low nibbles first 32, high nibbles next 32 */
};
struct block_q6_k {
    uint8_t ql[QK_K / 2];     /* low 4 bits; per 128 elements 64 bytes: [0,32) lo = e0..31, [32,64) lo = e32..63,
                                 [0,32) hi = e64..95, [32,64) hi = e96..127 */
    uint8_t qh[QK_K / 4];     /* high 2 bits; per 128 elements 32 bytes, bit pairs 0,2,4,6 = the four quarters */
    int8_t scales[QK_K / 16]; /* one per 16 elements */
    uint16_t d;               /* f16 super-scale */
};
struct block_q8_k {
    float d;                   /* float scale */
    int8_t qs[QK_K];           /* x[j] = d * qs[j] */
    int16_t bsums[QK_K / 16];  /* sums of qs over each group of 16, for the min terms of K-quant dots */
};
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct block_q4_k) == 144, "q4_k block");
_Static_assert(sizeof(struct block_q6_k) == 210, "q6_k block");
_Static_assert(sizeof(struct block_q8_k) == 292, "q8_k block");

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K block from its 12 packed bytes: sub-blocks 0-3 keep
 * theirs in the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks 4-7 keep the low 4 bits in the nibbles
 * of byte j+4 and the high 2 bits in the top bits of bytes j-4 (scale) and j (min). */
static inline void quant_q4_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* All 8 scales and mins of a Q4_K block at once, the layout above unpacked four bytes at a time (the SIMD
 * kernels' form of quant_q4_k_scale_min). */
static inline void quant_q4_k_scales8(const uint8_t *q, uint8_t sc[8], uint8_t m[8])
{
    uint32_t a0, a1, a2, t;
    memcpy(&a0, q, 4);
    memcpy(&a1, q + 4, 4);
    memcpy(&a2, q + 8, 4);
    t = a0 & 0x3f3f3f3f;
    memcpy(sc, &t, 4);
    t = a1 & 0x3f3f3f3f;
    memcpy(m, &t, 4);
    t = (a2 & 0x0f0f0f0f) | (((a0 >> 6) & 0x03030303) << 4);
    memcpy(sc + 4, &t, 4);
    t = ((a2 >> 4) & 0x0f0f0f0f) | (((a1 >> 6) & 0x03030303) << 4);
    memcpy(m + 4, &t, 4);
}

/* Quantizes n floats (n a multiple of the type's block size) into dst (dtype_row_bytes(t, n) bytes).
 * Supported t: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q8_K. Returns 0, ERR_UNSUPPORTED for another type or
 * ERR_INVALID_ARG when n is negative or not a multiple of the block size (dst untouched then).
 * Q8_0 and Q4_0 reproduce GGML's reference quantizer byte for byte; Q4_K and Q6_K search each sub-block's
 * scale (and min) for the least squared error, like GGML's but not byte-identical to it; Q8_K uses
 * d = amax / 127 and rounds half away from zero. */
int quant_row_from_f32(enum dtype t, const float *src, void *dst, int64_t n);

/* Dequantizes a row of n elements of type t into dst. Same supported types and errors. */
int quant_row_to_f32(enum dtype t, const void *src, float *dst, int64_t n);

/*
 * The R16 layout of a Q4_0, Q8_0, Q4_K or Q6_K matrix (rows a multiple of 16): the same bytes as the GGUF rows
 * (Q6_K's bits re-packed, see below), reordered so a 512-bit register holds one 4-byte group of 16 rows and the
 * AVX-512 kernels need no permutes (see gemv_avx512q.c, gemv_avx512k.c). Group g (rows 16g .. 16g + 15) takes
 * the 16 rows' bytes at g * 16 * row_bytes. There each block (nb = cols / block elements) takes 16 x its bytes:
 * the block's F16 scales, each as 16 rows in row order, and its other bytes as dwords, q[k][r] = dword k of
 * row r's:
 *   Q4_0, Q8_0: scales uint16_t d[16]; dwords uint32_t q[Q][16], Q = 4 (Q4_0) or 8 (Q8_0): the dwords of qs
 *   Q4_K:       scales uint16_t d[16], dmin[16]; dwords uint32_t q[35][16]: the 3 of scales, then the 32 of qs
 *   Q6_K:       scales uint16_t d[16]; dwords uint32_t q[52][16]: the 32 of ql, the 16 of qh, the 4 of scales,
 *               in runs of 4 stored in the order one-column decode reads them (quant_r16_q6_k_dword), and
 *               the 6-bit codes re-packed within their bytes: per half h and byte i < 32 of a block, ql's
 *               bytes 64h + i, 64h + 32 + i and qh's 32h + i hold the codes of elements 128h + 32qt + i,
 *               qt 0-3; R16 puts code qt < 3 in the low 6 bits of the triple's byte qt and code 3's bits
 *               2qt, 2qt + 1 in its top 2, so a kernel takes codes 0-2 with one AND each and code 3 with three
 *               shifts, where GGUF's nibbles and 2-bit fields took 13 operations for the four (quant.c
 *               quant_q6_k_mix; gemv_avx512k.c ak16_q6_k_code3 says what it gained)
 * Q4_K's blocks come one after another, each its scales then its dwords. The others' scales are 32 bytes, so
 * their blocks come in pairs, 0 and 1, 2 and 3, .. (the last alone when nb is odd): the scales of the pair's
 * first block, of its second, then the dwords of its first and of its second, so the dwords start on 64-byte
 * lines in every group when nb is even (a group is then a multiple of 64 bytes). 32 bytes of scales before
 * each block's dwords put every other block's 512-bit loads across two lines: Q4_0's decode kernel 1.2x slower
 * from L2 on a Zen 5, its 8-column gemm 1.13x; all of a group's scales first, then all its dwords, read as two
 * streams, cost Q4_0 and Q8_0 decode 1.3-1.5x from memory.
 * So a matrix keeps its size, a row range starting at a multiple of 16 starts at r * row_bytes as before, and
 * the kernels read one stream. quant_r16_scales / quant_r16_dwords say where block b's bytes are.
 */
#define QUANT_R16_ROWS 16
/* Block b's scales and dwords in an R16 group of nb blocks with nh F16 scales and nd dwords per row and block:
 * byte offsets from the group's start. */
static inline size_t quant_r16_scales(size_t nh, size_t nd, int64_t nb, int64_t b)
{
    (void)nb;
    if (nh % 2 == 0) /* Q4_K: blocks one after another */
        return (size_t)b * (2 * nh + 4 * nd) * QUANT_R16_ROWS;
    return ((size_t)(b & ~(int64_t)1) * (2 * nh + 4 * nd) + (size_t)(b & 1) * 2 * nh) * QUANT_R16_ROWS;
}
static inline size_t quant_r16_dwords(size_t nh, size_t nd, int64_t nb, int64_t b)
{
    if (nh % 2 == 0)
        return ((size_t)b * (2 * nh + 4 * nd) + 2 * nh) * QUANT_R16_ROWS;
    int64_t p0 = b & ~(int64_t)1;
    size_t m = nb - p0 < 2 ? 1 : 2; /* blocks in b's pair */
    return ((size_t)p0 * (2 * nh + 4 * nd) + m * 2 * nh + (size_t)(b & 1) * 4 * nd) * QUANT_R16_ROWS;
}
/* Where dword k (0-51: ql 0-31, qh 32-47, scales 48-51) of a Q6_K block sits among the block's 52 R16 dwords.
 * Decode reads a block once, in order: the scales run, then per half h (128 elements) and sub-group gi the runs
 * of ql 16h + 4gi.., ql 16h + 8 + 4gi.. and qh 32 + 8h + 4gi.. together (each 32-element step needs one dword
 * of each). In the GGUF order (ql, then qh) those reads jumped between three places of the 3.3 KB block,
 * which the hardware prefetcher does not follow: one core read 0.70-0.76x of a plain read from memory with
 * 4 KiB software prefetch, 0.45x with 2 KiB (Zen 4, stop 26). Runs of 4 keep the repacking's 4 x 4 tiles.
 * Constant-folded where k is a constant (the kernels' unrolled loops). */
static inline size_t quant_r16_q6_k_dword(size_t k)
{
    static const unsigned char at[13] = {1, 4, 2, 5, 7, 10, 8, 11, 3, 6, 9, 12, 0}; /* run -> place */
    return (size_t)at[k / 4] * 4 + k % 4;
}
/* Whether type t has an R16 layout (Q4_0, Q8_0, Q4_K, Q6_K). */
bool quant_r16_supported(enum dtype t);
/* Converts rows x cols of type t between GGUF rows and R16 (to_r16 true: src rows -> dst R16; false: back).
 * src and dst do not overlap; rows % 16 == 0 and quant_r16_supported(t), or nothing is written and
 * ERR_INVALID_ARG is returned; else 0. */
int quant_r16_convert(enum dtype t, const void *src, void *dst, int64_t rows, int64_t cols, bool to_r16);
/* Copies row r of an R16 matrix w (cols columns) into dst in GGUF order (dtype_row_bytes(t, cols) bytes). */
void quant_r16_row(enum dtype t, const void *w, int64_t r, int64_t cols, void *dst);

#endif
