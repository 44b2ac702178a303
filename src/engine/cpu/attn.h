/*
 * attn: the inner loops of attention over the paged KV cache and of storing into it, in a portable scalar
 * version, an AVX2+FMA+F16C one (attn_avx2.c) and an AVX-512 one (attn_avx512.c) that give bit-identical
 * results, so the engine's output never depends on which CPU ran it.
 *
 * Orders of the floating-point reductions, shared by both versions:
 *   scores: dot(q, k) over head_dim as ggml_vec_dot_f16 does on AVX2: 4 chains of 8 lanes fed with fused
 *           multiply-adds over steps of 32 elements, chains folded (0+2, 1+3, then 0+1), the 8 lanes folded
 *           (l + l+4, then (0+1) + (2+3)); a tail of head_dim % 32 elements is added afterwards (F16 cache:
 *           float products summed in double; F32 cache: float products summed in float). Then times scale.
 *   accum:  o[i] = fma(p_j, v_j[i], o[i]) for the cached rows j in position order.
 *   softmax: m = max(s); e_i = attn_exp(s_i - m); sum in double over 8 lanes (lane i % 8 adds e_i in index
 *           order), lanes folded ((0+4) + (2+6)) + ((1+5) + (3+7)); s_i = e_i * (float)(1 / sum).
 *           attn_exp(x), x <= 0: 0 below -87; else n = round(x log2 e) (by adding and subtracting 1.5 * 2^23
 *           in one fma), r = x - n ln2 in two fmas (Cody-Waite: ln2 split into 0x1.62e4p-1 and
 *           0x1.7f7d1cp-20), p = the degree-7 Taylor polynomial of e^r by Horner fmas, times 2^n built in the
 *           exponent bits. About 1 ulp from expf; fixed here so that scalar and SIMD agree bit for bit and a
 *           vector unit can run it (libm's expf is one call per score, a quarter of a decode at depth 4096).
 * Conversions to F16 round to nearest even, as f32_to_fp16 and the F16C instruction both do.
 */
#ifndef WAFER_ENGINE_ATTN_H
#define WAFER_ENGINE_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct attn_kernels {
    /* s[g * lds + j] = scale * dot(q[g], k[j]) for g < nq, j < n. q: [nq][hd] floats (for an F16 cache
     * already rounded to F16 values); k: [n][hd] cache rows, F16 or F32. */
    void (*scores_f16)(int hd, int nq, const float *q, const uint16_t *k, int n, float scale, float *s, size_t lds);
    void (*scores_f32)(int hd, int nq, const float *q, const float *k, int n, float scale, float *s, size_t lds);
    /* o[g][i] = fma(p[g * ldp + j], v[j][i], o[g][i]) for j = 0 .. n-1 in order, g < nq, i < hd.
     * o: [nq][hd]; v: [n][hd] cache rows. */
    void (*accum_f16)(int hd, int nq, const float *p, size_t ldp, const uint16_t *v, int n, float *o);
    void (*accum_f32)(int hd, int nq, const float *p, size_t ldp, const float *v, int n, float *o);
    /* s[0..n) = the softmax of s[0..n), in place, as defined above (n >= 1) */
    void (*softmax)(float *s, int n);
    /* y[i] = f32_to_fp16(x[i]) */
    void (*to_f16)(const float *x, uint16_t *y, int64_t n);
    /* y[i] = fp16_to_f32(f32_to_fp16(x[i])) (y may equal x) */
    void (*round_f16)(const float *x, float *y, int64_t n);
};

/* The scalar version (reference and fallback). */
const struct attn_kernels *attn_kernels_scalar(void);
/* The AVX2 version when compiled in and the CPU has AVX2+FMA+F16C (kernel_cpu_has_avx2), else NULL. */
const struct attn_kernels *attn_kernels_avx2(void);
/* The AVX-512 version (attn_avx512.c: scores, V accumulation, softmax, F16 rounding; the F16 stores AVX2's)
 * when the CPU has AVX-512 (gemv_cpu_has_avx512), else NULL. */
const struct attn_kernels *attn_kernels_avx512(void);
/* The best version for this CPU; the scalar one when force_scalar. */
const struct attn_kernels *attn_kernels_get(bool force_scalar);

#endif
