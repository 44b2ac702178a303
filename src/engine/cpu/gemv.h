/*
 * gemv: matrix-vector kernels for decode (one activation row against a block of weight rows), the product
 * that decides generation speed, and matrix-matrix kernels for prefill and batched decode of Q4_0, Q8_0
 * and F16 weights (AVX2, AVX-512) and of the K-quants (AVX-512; AVX2 in the R16 layout).
 *
 * Decode reads every weight once per token, so the gemv kernels are built to stream weights at the memory's
 * speed: they prefetch linearly through the contiguous block of rows they are given (the kernel_ops gemm
 * prefetches along each row, which for short rows lands inside the rows a tile is already reading), and they
 * spend as few vector instructions per weight byte as the fixed numerics allow (scale products 8 blocks or 8
 * rows at a time; Q4_0 as unsigned nibbles against precomputed activation block sums).
 *
 * Numerics: every output is bit-identical to kernel_ops vec_dot (and so to the kernel_ops gemm tiles) of the
 * same type on an AVX2 CPU: the integer parts are exact, and every float operation is the one vec_dot
 * performs, in its order. For Q4_0 / Q8_0 that is kernels.c's block sums (per block the exact int32 sum of
 * w * x, then acc = fma(float(sum), d_w * d_x, acc) in block order), which also equals the scalar reference
 * bit for bit; kernels may form the sums of 8 or 16 rows in one register (the R16 layout) or add the lanes of
 * 8 (row, column) pairs into one (gemm_q8_tile.h). So a sequence gets the same logits decoded alone (gemv) or
 * in a batch (gemm), on any of these CPUs. tests/unit/test_gemv.c and test_gemv_avx512q.c (every Q4_0 / Q8_0
 * set, both layouts) check this per type and per instruction set.
 */
#ifndef WAFER_ENGINE_GEMV_H
#define WAFER_ENGINE_GEMV_H

#include "engine/cpu/cpu_features.h"
#include "engine/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gemv_ops {
    enum dtype type; /* weight type; activation rows are in kernel_ops_get(type)->vec_type format */
    /* Bytes of per-activation-row data prep writes for rows of n elements (0: none needed); a multiple of 32. */
    size_t (*aux_bytes)(int64_t n);
    /* Precomputes what the kernels need from activation row x (n elements) into aux (32-byte aligned). Every
     * gemv_ops of one activation format and instruction set shares one prep, so one aux serves them all. */
    void (*prep)(int64_t n, const void *x, void *aux);
    /* y[i] = dot(w row i, x) for i < nr; w rows are ldw bytes apart and, for the prefetch to help, contiguous
     * (ldw = row bytes). aux from prep on the same x. */
    void (*gemv)(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x, const void *aux);
    /* NULL, or s[j * lds + i] = dot(w row i, x row j) for i < nr, j < nc: x rows ldx bytes apart, their aux
     * ldaux bytes apart. */
    void (*gemm)(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw, const void *x, size_t ldx,
                 const void *aux, size_t ldaux);
    /* NULL, or gemv and gemm on weights in quant.h's R16 layout (model_relayout makes it for these kernels):
     * nr a multiple of 16, w at the first row's group (row r0 of the matrix at data + r0 * row_bytes, r0 a
     * multiple of 16); x and aux as for gemv and gemm (Q4_0 / Q8_0 read only aux, the K-quants only x).
     * Results bit-identical to gemv and gemm. gemm16's scratch: gemm16_scratch(n) bytes, 64-byte aligned, for
     * this call alone (its contents are not kept), or NULL where gemm16_scratch is NULL. */
    void (*gemv16)(int64_t n, int64_t nr, float *y, const void *w, const void *x, const void *aux);
    void (*gemm16)(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, const void *x, size_t ldx,
                   const void *aux, size_t ldaux, void *scratch);
    /* NULL (gemm16 needs no scratch), or the bytes of scratch gemm16 needs for rows of n elements, whatever
     * nr and nc. */
    size_t (*gemm16_scratch)(int64_t n);
};

/* AVX2 kernels for weight type t when compiled in and the CPU has AVX2+FMA+F16C; NULL otherwise (no kernel
 * for the type, or the CPU lacks them, or WAFER_NO_SIMD is set). gemv16 and gemm16 are set for Q4_0, Q8_0,
 * Q4_K and Q6_K, gemm for Q4_0, Q8_0 and F16 (see gemv_avx2.c; F16's on activations kept as F16 in aux,
 * exact since they are F16 values); the K-quants' gemm is gemm16 (the backend lays their rows out in R16). */
const struct gemv_ops *gemv_ops_avx2(enum dtype t);
/* The AVX2 kernels' set on AVX-VNNI (gemv_avx2.c: the R16 Q4_0 / Q8_0 kernels on vpdpbusd, the rest as
 * gemv_ops_avx2's) for Q4_0 and Q8_0 when the CPU has AVX-VNNI (kernel_cpu_has_avx_vnni); NULL otherwise.
 * Results bit-identical to gemv_ops_avx2's, which stay AVX2 alone (Zen 3's) on every CPU. */
const struct gemv_ops *gemv_ops_avx2_vnni(enum dtype t);
/* The two AVX2 F16 decode kernels whatever the decode rule (gemv_ops_avx2's F16 gemv follows
 * cpu_decode_prefetch call by call, see gemv_avx2.c): streams false gives 4-row tiles, true 4 sequential
 * streams. NULL without AVX2+FMA+F16C. For tests, which check both on every CPU. */
const struct gemv_ops *gemv_ops_avx2_f16(bool streams);
/* AVX-512 kernels (512-bit registers; AVX512F/BW/VL/DQ + AVX512-VNNI) when the CPU has them: Q4_0 and Q8_0
 * in gemv_avx512q.c, F16 and the K-quants (Q4_K, Q6_K) in gemv_avx512k.c. NULL for other types or without
 * AVX-512. Same numerics contract as every gemv_ops: bit-identical to kernel_ops vec_dot on AVX2. */
const struct gemv_ops *gemv_ops_avx512q(enum dtype t);
const struct gemv_ops *gemv_ops_avx512k(enum dtype t);
/* The best of the above for this CPU, or NULL (gemv.c: the one place that chooses): AVX-512, else AVX-VNNI's,
 * else AVX2's. */
const struct gemv_ops *gemv_ops_best(enum dtype t);

#endif
