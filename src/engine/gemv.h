/*
 * gemv: matrix-vector kernels for decode (one activation row against a block of weight rows), the product
 * that decides generation speed. Decode reads every weight once per token, so these kernels are built to
 * stream weights at the memory's speed: they prefetch linearly through the contiguous block of rows they
 * are given (the kernel_ops gemm prefetches along each row, which for short rows lands inside the rows a
 * tile is already reading, and a row-major matrix is one long stream anyway), and they spend as few vector
 * instructions per weight byte as the fixed numerics allow, with per-block scale products done 8 blocks at a
 * time and, for Q4_0, unsigned nibbles against precomputed activation lane sums.
 *
 * Numerics: every output is bit-identical to kernel_ops vec_dot (and so to the gemm tiles) of the same type
 * on the same CPU: the integer parts are exact, and every float operation (per-block scale product, FMA into
 * the same 8 lanes in the same order, the final fold) is the one vec_dot performs. So a sequence decoded
 * alone (gemv) and in a batch (gemm) gets the same logits. tests/unit/test_gemv.c checks this per type.
 *
 * Only AVX2 versions exist; where they are NULL the engine uses kernel_ops gemm.
 */
#ifndef WAFER_ENGINE_GEMV_H
#define WAFER_ENGINE_GEMV_H

#include "engine/dtype.h"

#include <stddef.h>
#include <stdint.h>

struct gemv_ops {
    enum dtype type; /* weight type; the activation row is in kernel_ops_get(type)->vec_type format */
    /* Bytes of per-activation data prep writes for rows of n elements (0: none needed). */
    size_t (*aux_bytes)(int64_t n);
    /* Precomputes what gemv needs from activation row x (n elements) into aux (32-byte aligned). */
    void (*prep)(int64_t n, const void *x, void *aux);
    /* y[i] = dot(w row i, x) for i < nr; w rows are ldw bytes apart and, for the prefetch to help, contiguous
     * (ldw = row bytes). Bit-identical to kernel_ops vec_dot. aux from prep on the same x. */
    void (*gemv)(int64_t n, int64_t nr, float *y, const void *w, size_t ldw, const void *x, const void *aux);
};

/* AVX2 gemv for weight type t when compiled in and the CPU has AVX2+FMA+F16C; NULL otherwise (the type has
 * none, or the CPU lacks them, or WAFER_NO_SIMD is set). */
const struct gemv_ops *gemv_ops_avx2(enum dtype t);

#endif
