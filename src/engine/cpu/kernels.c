/*
 * kernels: the portable scalar kernels and the run-time choice between them and the AVX2 ones (kernel_ops_get;
 * kernels_avx2.c only defines kernels, and cpu_features.c says what the CPU has).
 *
 * Quantized dot products work like GGML's: per block an exact integer dot of the codes, scaled by the
 * product of the two block scales and added to a float sum. For Q4_0 / Q8_0 that is the numerics every kernel
 * reproduces bit for bit: acc = fmaf(float(block sum), d_w * d_x, acc) in block order, as llama.cpp's
 * repacked Q4_0 kernels accumulate (ggml-cpu-aarch64.cpp, AVX2: one fmadd of the block sums of 8 rows). The
 * K-quants (Q4_K, Q6_K) are block sums too, per 256-element super-block: the exact int32 sum S of the
 * sub-block scales times their integer dots (Q6_K with the -32 offset of its codes taken off through the
 * activation's 16-element sums, bsums), then acc = fmaf(float(S), d_w * d_x, acc); Q4_K subtracts its mins
 * the same way, M = sum of min_j times the bsums of sub-block j, acc = fmaf(-float(M), dmin_w * d_x, acc).
 * Every kernel of these types reproduces that bit for bit, whatever order its integer work takes: the
 * fast ones keep 16 rows' block sums in one register (gemv_avx512k.c) instead of 8 partial lanes per row
 * (the definition before stop 23, which cost a convert and two FMAs per lane). Float weights (F32/F16/BF16) take float activations and sum in double here: the
 * scalar path is the reference the SIMD one is tested against, so it is kept as accurate as is cheap.
 *
 * The scalar gemm just calls vec_dot per pair, which makes it bit-identical to vec_dot by construction.
 *
 * The feed-forward's SwiGLU lives here too (kernel_swiglu), with its exp written out in kernels_expf.c (glibc's
 * expf, operation for operation) so that the vector versions in kernels_avx2.c can match it bit for bit.
 */
#include "engine/cpu/kernels.h"

#include "engine/gguf/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- exp and SwiGLU ---- */

void kernel_swiglu(float *g, const float *u, int64_t n)
{
    for (int64_t i = kernel_swiglu_avx2(g, u, n); i < n; i++)
        g[i] = g[i] / (1.0f + kernel_expf(-g[i])) * u[i];
}

/* ---- activation conversion and dequantization (thin wrappers over quant.c) ---- */

static void kern_from_f32_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
/* F16 / BF16 weights: activations rounded to the weight's precision (stored as f32), as llama.cpp converts
 * them to F16 / BF16 before the product. */
static void kern_from_f32_round_f16(const float *src, void *dst, int64_t n)
{
    float *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = fp16_to_f32(f32_to_fp16(src[i]));
}

static void kern_from_f32_round_bf16(const float *src, void *dst, int64_t n)
{
    float *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = bf16_to_f32(f32_to_bf16(src[i]));
}

/* Activations for Q8_0/Q4_0 weights: rounded as llama.cpp's x86 run-time quantizer does (scale
 * 127 / amax, ties to even), which differs from the reference weight quantizer (1 / d, ties away from zero)
 * in rare ties; matching it keeps perplexities on llama.cpp's figures. */
static void kern_from_f32_q8_0(const float *src, void *dst, int64_t n)
{
    struct block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(src[j]));
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = f32_to_fp16(amax / 127.0f);
        for (int j = 0; j < QK8_0; j++)
            y[b].qs[j] = (int8_t)lrintf(src[j] * id);
    }
}
static void kern_from_f32_q8_k(const float *src, void *dst, int64_t n) { quant_row_from_f32(DTYPE_Q8_K, src, dst, n); }

static void kern_to_f32_f32(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_F32, src, dst, n); }
static void kern_to_f32_f16(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_F16, src, dst, n); }
static void kern_to_f32_bf16(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_BF16, src, dst, n); }
static void kern_to_f32_q8_0(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_Q8_0, src, dst, n); }
static void kern_to_f32_q4_0(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_Q4_0, src, dst, n); }
static void kern_to_f32_q4_k(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_Q4_K, src, dst, n); }
static void kern_to_f32_q6_k(const void *src, float *dst, int64_t n) { quant_row_to_f32(DTYPE_Q6_K, src, dst, n); }

/* ---- float weights ---- */

static void kern_dot_f32(int64_t n, float *s, const void *w, const void *x)
{
    const float *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)a[i] * (double)b[i];
    *s = (float)sum;
}

static void kern_dot_f16(int64_t n, float *s, const void *w, const void *x)
{
    const uint16_t *a = w;
    const float *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)fp16_to_f32(a[i]) * (double)b[i];
    *s = (float)sum;
}

static void kern_dot_bf16(int64_t n, float *s, const void *w, const void *x)
{
    const uint16_t *a = w;
    const float *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)bf16_to_f32(a[i]) * (double)b[i];
    *s = (float)sum;
}

/* ---- 32-element blocks against Q8_0 ---- */

static void kern_dot_q8_0(int64_t n, float *s, const void *w, const void *x)
{
    const struct block_q8_0 *a = w, *b = x;
    float sum = 0.0f;
    for (int64_t k = 0; k < n / QK8_0; k++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++)
            sumi += a[k].qs[j] * b[k].qs[j];
        sum = fmaf((float)sumi, fp16_to_f32(a[k].d) * fp16_to_f32(b[k].d), sum);
    }
    *s = sum;
}

static void kern_dot_q4_0(int64_t n, float *s, const void *w, const void *x)
{
    const struct block_q4_0 *a = w;
    const struct block_q8_0 *b = x;
    float sum = 0.0f;
    for (int64_t k = 0; k < n / QK4_0; k++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((a[k].qs[j] & 15) - 8) * b[k].qs[j];
            sumi += ((a[k].qs[j] >> 4) - 8) * b[k].qs[j + QK4_0 / 2];
        }
        sum = fmaf((float)sumi, fp16_to_f32(a[k].d) * fp16_to_f32(b[k].d), sum);
    }
    *s = sum;
}

/* ---- K-quants against Q8_K ---- */

static void kern_dot_q4_k(int64_t n, float *s, const void *w, const void *x)
{
    const struct block_q4_k *a = w;
    const struct block_q8_k *b = x;
    float sum = 0.0f;
    for (int64_t k = 0; k < n / QK_K; k++) {
        /* |sumi| <= 8 sub-blocks * 63 * 32 * 15 * 127 < 2^31 */
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_q4_k_scale_min(j, a[k].scales, &sc, &m);
            const uint8_t *q = a[k].qs + 32 * (j / 2);
            const int8_t *y = b[k].qs + 32 * j;
            int shift = (j & 1) * 4, p = 0;
            for (int l = 0; l < 32; l++)
                p += ((q[l] >> shift) & 15) * y[l];
            sumi += sc * p;
            summ += m * (b[k].bsums[2 * j] + b[k].bsums[2 * j + 1]);
        }
        sum = fmaf((float)sumi, fp16_to_f32(a[k].d) * b[k].d, sum);
        sum = fmaf(-(float)summ, fp16_to_f32(a[k].dmin) * b[k].d, sum);
    }
    *s = sum;
}

static void kern_dot_q6_k(int64_t n, float *s, const void *w, const void *x)
{
    const struct block_q6_k *a = w;
    const struct block_q8_k *b = x;
    float sum = 0.0f;
    for (int64_t k = 0; k < n / QK_K; k++) {
        int32_t sumi = 0; /* |sumi| <= 16 * 128 * 16 * 32 * 127 < 2^31 */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = a[k].ql + 64 * h, *qh = a[k].qh + 32 * h;
            const int8_t *sc = a[k].scales + 8 * h, *y = b[k].qs + 128 * h;
            int p[8] = {0}; /* per 16-element group of this half */
            for (int i = 0; i < 32; i++) {
                int g = i / 16;
                p[g + 0] += (((ql[i] & 15) | (((qh[i] >> 0) & 3) << 4)) - 32) * y[i];
                p[g + 2] += (((ql[i + 32] & 15) | (((qh[i] >> 2) & 3) << 4)) - 32) * y[i + 32];
                p[g + 4] += (((ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4)) - 32) * y[i + 64];
                p[g + 6] += (((ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4)) - 32) * y[i + 96];
            }
            for (int g = 0; g < 8; g++)
                sumi += sc[g] * p[g];
        }
        sum = fmaf((float)sumi, fp16_to_f32(a[k].d) * b[k].d, sum);
    }
    *s = sum;
}

/* ---- gemm through vec_dot ---- */

#define KERN_GEMM_VIA_DOT(name, dot)                                                                        \
    static void name(int64_t n, int nr, int nc, float *s, size_t lds, const void *w, size_t ldw,           \
                     const void *x, size_t ldx)                                                            \
    {                                                                                                      \
        for (int j = 0; j < nc; j++)                                                                       \
            for (int i = 0; i < nr; i++)                                                                   \
                dot(n, s + (size_t)j * lds + i, (const char *)w + (size_t)i * ldw,                         \
                    (const char *)x + (size_t)j * ldx);                                                    \
    }

KERN_GEMM_VIA_DOT(kern_gemm_f32, kern_dot_f32)
KERN_GEMM_VIA_DOT(kern_gemm_f16, kern_dot_f16)
KERN_GEMM_VIA_DOT(kern_gemm_bf16, kern_dot_bf16)
KERN_GEMM_VIA_DOT(kern_gemm_q8_0, kern_dot_q8_0)
KERN_GEMM_VIA_DOT(kern_gemm_q4_0, kern_dot_q4_0)
KERN_GEMM_VIA_DOT(kern_gemm_q4_k, kern_dot_q4_k)
KERN_GEMM_VIA_DOT(kern_gemm_q6_k, kern_dot_q6_k)

static const struct kernel_ops kern_scalar_ops[] = {
    {DTYPE_F32, DTYPE_F32, kern_from_f32_f32, kern_dot_f32, kern_to_f32_f32, kern_gemm_f32},
    {DTYPE_F16, DTYPE_F32, kern_from_f32_round_f16, kern_dot_f16, kern_to_f32_f16, kern_gemm_f16},
    {DTYPE_BF16, DTYPE_F32, kern_from_f32_round_bf16, kern_dot_bf16, kern_to_f32_bf16, kern_gemm_bf16},
    {DTYPE_Q8_0, DTYPE_Q8_0, kern_from_f32_q8_0, kern_dot_q8_0, kern_to_f32_q8_0, kern_gemm_q8_0},
    {DTYPE_Q4_0, DTYPE_Q8_0, kern_from_f32_q8_0, kern_dot_q4_0, kern_to_f32_q4_0, kern_gemm_q4_0},
    {DTYPE_Q4_K, DTYPE_Q8_K, kern_from_f32_q8_k, kern_dot_q4_k, kern_to_f32_q4_k, kern_gemm_q4_k},
    {DTYPE_Q6_K, DTYPE_Q8_K, kern_from_f32_q8_k, kern_dot_q6_k, kern_to_f32_q6_k, kern_gemm_q6_k},
};

const struct kernel_ops *kernel_ops_scalar(enum dtype t)
{
    for (size_t i = 0; i < sizeof kern_scalar_ops / sizeof kern_scalar_ops[0]; i++)
        if (kern_scalar_ops[i].type == t)
            return &kern_scalar_ops[i];
    return NULL;
}

const struct kernel_ops *kernel_ops_get(enum dtype t)
{
    const struct kernel_ops *ops = kernel_ops_avx2(t);
    return ops ? ops : kernel_ops_scalar(t);
}
