/*
 * attn_avx512: AVX-512 versions of the attention kernels that dominate a long prefill (scores, V accumulation,
 * the F16 -> F32 conversion of cached rows), bit-identical to attn_avx2.c and so to the scalar attn.c. Compiled
 * for AVX-512 by the target pragma below and handed out only when gemv_cpu_has_avx512() says the CPU has it;
 * everything else (softmax, F16 rounding, head sizes the wide loops do not cover) is the AVX2 kernels'.
 *
 * Same operations in the same order, wider registers:
 *   scores: attn.h's 4 chains of 8 lanes over steps of 32 elements are chains 0 and 1 in one zmm (elements
 *           i..i+15 of a step) and chains 2 and 3 in another (i+16..i+31): one FMA of 16 lanes advances two
 *           chains. The chains fold (0+2, 1+3) as one zmm add, then (0+1) as the add of its halves, then the
 *           AVX2 kernels' 8-score fold (attn_simd.h).
 *   accum:  o[i] = fma(p_j, v_j[i], o[i]) per lane, rows j in order: 16 lanes per FMA, and two query rows at
 *           a time so that 8 independent FMA chains hide the FMA latency (with one row of 64 outputs, 4
 *           chains would leave the FMA units half idle) and each loaded V vector serves both rows.
 * Measured on an AMD EPYC Zen 5 (2 threads, 1B Q4_0 pp4096, where attention was half the time):
 * see docs/performance.md.
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#include "engine/cpu/attn.h"
#include "engine/cpu/attn_simd.h"

#include "engine/cpu/cpu_features.h"

#include <immintrin.h>

/* Rows converted per chunk, and the largest head size the chunk buffers take (as attn_avx2.c). */
#define AB_CHUNK 32
#define AB_MAXHD 256

/* The AVX2 kernels, for what this file leaves to them: set by attn_kernels_avx512() before it hands out
 * ab_kernels (asking attn_kernels_avx2() per call would read the environment every time). */
static const struct attn_kernels *ab_base;

static const struct attn_kernels *ab_avx2(void) { return __atomic_load_n(&ab_base, __ATOMIC_RELAXED); }

/* F16 -> F32 of count values (exact). */
static void ab_rows_f32(const uint16_t *h, float *f, size_t count)
{
    size_t i = 0;
    for (; i + 16 <= count; i += 16)
        _mm512_storeu_ps(f + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < count; i++)
        f[i] = _cvtsh_ss(h[i]);
}

static void ab_scores_f32(int hd, int nq, const float *q, const float *k, int n, float scale, float *s, size_t lds)
{
    /* 8 keys at a time over whole 32-element steps; the rest (a tail of keys or of head_dim) as AVX2 does it */
    int n8 = hd % 32 == 0 ? n & ~7 : 0;
    if (n8) {
        __m256 vs = _mm256_set1_ps(scale);
        for (int g = 0; g < nq; g++) {
            const float *qr = q + (size_t)g * hd;
            for (int j = 0; j < n8; j += 8) {
                __m256 v[8];
                for (int u = 0; u < 8; u++) {
                    const float *kr = k + (size_t)(j + u) * hd;
                    __m512 a01 = _mm512_setzero_ps(), a23 = a01; /* [chain 0 | chain 1], [chain 2 | chain 3] */
                    for (int i = 0; i < hd; i += 32) {
                        a01 = _mm512_fmadd_ps(_mm512_loadu_ps(kr + i), _mm512_loadu_ps(qr + i), a01);
                        a23 = _mm512_fmadd_ps(_mm512_loadu_ps(kr + i + 16), _mm512_loadu_ps(qr + i + 16), a23);
                    }
                    __m512 t = _mm512_add_ps(a01, a23); /* [0+2 | 1+3] */
                    v[u] = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
                }
                _mm256_storeu_ps(s + (size_t)g * lds + j, attn_simd_fold8(v, vs));
            }
        }
    }
    if (n8 < n)
        ab_avx2()->scores_f32(hd, nq, q, k + (size_t)n8 * hd, n - n8, scale, s + n8, lds);
}

/* The keys are converted to F32 once per chunk (exact) rather than once per query head. */
static void ab_scores_f16(int hd, int nq, const float *q, const uint16_t *k, int n, float scale, float *s, size_t lds)
{
    if (hd % 32 != 0 || hd > AB_MAXHD) { /* the tail sums in double: the AVX2 kernel's direct loop */
        ab_avx2()->scores_f16(hd, nq, q, k, n, scale, s, lds);
        return;
    }
    float kf[AB_CHUNK * AB_MAXHD] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < n; j0 += AB_CHUNK) {
        int m = n - j0 < AB_CHUNK ? n - j0 : AB_CHUNK;
        ab_rows_f32(k + (size_t)j0 * hd, kf, (size_t)m * hd);
        /* hd % 32 == 0: no tail, and (double)fold -> float is the fold itself, as in the scalar loop */
        ab_scores_f32(hd, nq, q, kf, m, scale, s + j0, lds);
    }
}

/* Query rows g (and g + 1 when two): 64 outputs each from i, over rows j < n in order. */
static inline __attribute__((always_inline)) void ab_accum64(const int two, int hd, const float *p0, const float *p1,
                                                             const float *v, int n, float *o0, float *o1)
{
    __m512 r0[4], r1[4];
    for (int c = 0; c < 4; c++) {
        r0[c] = _mm512_loadu_ps(o0 + 16 * c);
        r1[c] = two ? _mm512_loadu_ps(o1 + 16 * c) : r0[c];
    }
    for (int j = 0; j < n; j++) {
        const float *vr = v + (size_t)j * hd;
        __m512 w0 = _mm512_set1_ps(p0[j]), w1 = two ? _mm512_set1_ps(p1[j]) : w0;
        for (int c = 0; c < 4; c++) {
            __m512 x = _mm512_loadu_ps(vr + 16 * c);
            r0[c] = _mm512_fmadd_ps(w0, x, r0[c]);
            if (two)
                r1[c] = _mm512_fmadd_ps(w1, x, r1[c]);
        }
    }
    for (int c = 0; c < 4; c++) {
        _mm512_storeu_ps(o0 + 16 * c, r0[c]);
        if (two)
            _mm512_storeu_ps(o1 + 16 * c, r1[c]);
    }
}

static void ab_accum_f32(int hd, int nq, const float *p, size_t ldp, const float *v, int n, float *o)
{
    if (hd % 64 != 0) {
        ab_avx2()->accum_f32(hd, nq, p, ldp, v, n, o);
        return;
    }
    int g = 0;
    for (; g + 2 <= nq; g += 2)
        for (int i = 0; i < hd; i += 64)
            ab_accum64(1, hd, p + (size_t)g * ldp, p + (size_t)(g + 1) * ldp, v + i, n, o + (size_t)g * hd + i,
                       o + (size_t)(g + 1) * hd + i);
    if (g < nq)
        for (int i = 0; i < hd; i += 64)
            ab_accum64(0, hd, p + (size_t)g * ldp, NULL, v + i, n, o + (size_t)g * hd + i, NULL);
}

/* Values converted to F32 once per chunk (exact), then accumulated as ab_accum_f32 does. */
static void ab_accum_f16(int hd, int nq, const float *p, size_t ldp, const uint16_t *v, int n, float *o)
{
    if (hd > AB_MAXHD || hd % 64 != 0) {
        ab_avx2()->accum_f16(hd, nq, p, ldp, v, n, o);
        return;
    }
    float vf[AB_CHUNK * AB_MAXHD] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < n; j0 += AB_CHUNK) {
        int m = n - j0 < AB_CHUNK ? n - j0 : AB_CHUNK;
        ab_rows_f32(v + (size_t)j0 * hd, vf, (size_t)m * hd);
        ab_accum_f32(hd, nq, p + j0, ldp, vf, m, o);
    }
}

static void ab_softmax(float *s, int n) { ab_avx2()->softmax(s, n); }

static void ab_to_f16(const float *x, uint16_t *y, int64_t n) { ab_avx2()->to_f16(x, y, n); }

static void ab_round_f16(const float *x, float *y, int64_t n) { ab_avx2()->round_f16(x, y, n); }

static const struct attn_kernels ab_kernels = {
    ab_scores_f16, ab_scores_f32, ab_accum_f16, ab_accum_f32, ab_softmax, ab_to_f16, ab_round_f16,
};

const struct attn_kernels *attn_kernels_avx512(void)
{
    const struct attn_kernels *base = attn_kernels_avx2();
    if (!base || !gemv_cpu_has_avx512())
        return NULL;
    __atomic_store_n(&ab_base, base, __ATOMIC_RELAXED);
    return &ab_kernels;
}

#if defined(__clang__)
#pragma clang attribute pop
#endif
