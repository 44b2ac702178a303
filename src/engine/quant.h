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

#include <stdint.h>

/* Quantizes n floats (n a multiple of the type's block size) into dst (dtype_row_bytes(t, n) bytes).
 * Supported t: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, Q8_K. Returns 0 or ERR_UNSUPPORTED. */
int quant_row_from_f32(enum dtype t, const float *src, void *dst, int64_t n);

/* Dequantizes a row of n elements of type t into dst. Same supported types. Returns 0 or ERR_UNSUPPORTED. */
int quant_row_to_f32(enum dtype t, const void *src, float *dst, int64_t n);

#endif
