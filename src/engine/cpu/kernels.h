/*
 * kernels: the per-weight-type inner loops the CPU backend is built from, selected at run time for the CPU
 * (AVX2+FMA+F16C when present, else portable scalar C). Both variants are kept and tested against each other
 * and against quant_row_to_f32 + a plain float dot.
 *
 * A matrix-vector product with weights of type T works on activations converted once per row to
 * ops->vec_type (F32 for float weights, Q8_0 for Q8_0/Q4_0, Q8_K for Q4_K/Q6_K), then calls vec_dot for each
 * weight row. Every dot product reduces in a fixed order that depends only on n, never on the batch, so the
 * same row gives bit-identical results alone or in a batch.
 */
#ifndef WAFER_ENGINE_KERNELS_H
#define WAFER_ENGINE_KERNELS_H

#include "engine/cpu/cpu_features.h"
#include "engine/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kernel_ops {
    enum dtype type;     /* weight type */
    enum dtype vec_type; /* activation format vec_dot expects */
    /* Converts n floats (multiple of vec_type's block) to vec_type: dst holds dtype_row_bytes(vec_type, n). */
    void (*from_f32)(const float *src, void *dst, int64_t n);
    /* *s = dot(w[0..n), x[0..n)); w is a row of `type`, x a row of `vec_type`. */
    void (*vec_dot)(int64_t n, float *s, const void *w, const void *x);
    /* Dequantizes a row of n elements of `type` (used for embedding lookups). */
    void (*to_f32)(const void *src, float *dst, int64_t n);
    /* Batched dot products for prefill and batched decode:
     *   s[j*lds + i] = dot(w row i, x row j)   for i < nr, j < nc
     * w rows (of `type`) are ldw bytes apart, x rows (of `vec_type`) ldx bytes apart. Each element is
     * bit-identical to vec_dot on the same pair (same per-element reduction order), so batching never changes
     * results. The AVX2 versions tile rows x columns in registers so each weight block loaded is used for
     * several activation rows; the others loop over vec_dot. Never NULL in the ops this module returns. */
    void (*gemm)(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw, const void *x,
                 size_t ldx);
};

/* The constants of glibc's expf (sysdeps/ieee754/flt-32/e_exp2f_data.c, N = 32), as bit patterns: the table
 * of 2^(i/32) with i/32 taken out of the exponent bits, N / ln 2, the cubic's coefficients (scaled), and the
 * rounding shift. Shared by kernel_expf and its vector versions. */
extern const uint64_t kernel_expf_tab[32];
#define KERNEL_EXPF_INVLN2N 0x40471547652b82feull
#define KERNEL_EXPF_C0 0x3ebc6af84b912394ull
#define KERNEL_EXPF_C1 0x3f2ebfce50fac4f3ull
#define KERNEL_EXPF_C2 0x3f962e42ff0c52d6ull
#define KERNEL_EXPF_SHIFT 0x4338000000000000ull

/* e^x exactly as glibc's expf computes it on x86-64 with FMA (Szabolcs Nagy's algorithm, glibc 2.28 and
 * later: x N / ln 2 = k + r in double, 2^(k/N) from the table, a cubic in r, one rounding to float), for
 * every float x, ranges past |x| >= 88 and NaN included (without setting errno). Written out here so the
 * scalar reference and the vector kernels compute one function whatever libm the program links; on
 * Debian 12 it equals expf bit for bit (tests/unit/test_swiglu.c), so SwiGLU results did not change when it
 * replaced expf. */
float kernel_expf(float x);

/* The SwiGLU of the feed-forward, in place: g[i] = g[i] / (1 + kernel_expf(-g[i])) * u[i] for i < n, every
 * backend's. Runs the widest vector version the CPU allows (AVX-512: 16 lanes, AVX2: 8), bit-identical to
 * the scalar loop; lanes with |g| >= 88 or NaN take kernel_expf. */
void kernel_swiglu(float *g, const float *u, int64_t n);

/* kernels_avx2.c's vector SwiGLU over a prefix of the elements: returns how many it did (0 when the CPU
 * lacks AVX2); kernel_swiglu does the rest. */
int64_t kernel_swiglu_avx2(float *g, const float *u, int64_t n);

/* Best ops for the running CPU; NULL when the type is not supported. */
const struct kernel_ops *kernel_ops_get(enum dtype t);
/* Portable scalar ops (reference and fallback); NULL when not supported. */
const struct kernel_ops *kernel_ops_scalar(enum dtype t);
/* AVX2 ops when compiled in and the CPU has AVX2+FMA+F16C; else NULL. */
const struct kernel_ops *kernel_ops_avx2(enum dtype t);

#endif
