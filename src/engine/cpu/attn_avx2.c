/*
 * attn_avx2: AVX2 + FMA + F16C versions of the attention kernels (compiled with -mavx2 -mfma -mf16c; only
 * handed out when kernel_cpu_has_avx2() says the CPU has them). Every float operation is the one attn.c's
 * scalar loops perform, on the same operands in the same order (explicit FMAs only, so the compiler has no
 * mul+add to contract differently), so the results are bit-identical.
 */
#include "engine/cpu/attn.h"

#include "engine/dtype.h"
#include "engine/cpu/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

#define AA_INLINE static inline __attribute__((always_inline))

AA_INLINE float aa_fold(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    a0 = _mm256_add_ps(a0, a2);
    a1 = _mm256_add_ps(a1, a3);
    a0 = _mm256_add_ps(a0, a1);
    __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

/* The 8 scores of 8 folded chain vectors v[u] (aa_fold's first three adds done): lanes folded l + l+4, then
 * (0+1) + (2+3), as the one-score fold does, with 3 hadds for all 8 instead of 2 per score; times scale, in u
 * order. */
AA_INLINE __m256 aa_fold8(const __m256 v[8], __m256 scale)
{
    __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20), _mm256_permute2f128_ps(v[0], v[1], 0x31));
    __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20), _mm256_permute2f128_ps(v[2], v[3], 0x31));
    __m256 s45 = _mm256_add_ps(_mm256_permute2f128_ps(v[4], v[5], 0x20), _mm256_permute2f128_ps(v[4], v[5], 0x31));
    __m256 s67 = _mm256_add_ps(_mm256_permute2f128_ps(v[6], v[7], 0x20), _mm256_permute2f128_ps(v[6], v[7], 0x31));
    /* h: [v0 v2 v4 v6 | v1 v3 v5 v7], each (t0 + t1) + (t2 + t3) */
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s01, s23), _mm256_hadd_ps(s45, s67));
    h = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    return _mm256_mul_ps(h, scale);
}

AA_INLINE __m256 aa_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* Rows converted per chunk: a KV block is block_size rows (16 by default); larger blocks go in chunks. */
#define AA_CHUNK 32
#define AA_MAXHD 256

/* F16 -> F32 of n * hd values (exact). */
static void aa_rows_f32(const uint16_t *h, float *f, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < count; i++)
        f[i] = _cvtsh_ss(h[i]);
}

static void aa_scores_f32(int hd, int nq, const float *q, const float *k, int n, float scale, float *s, size_t lds);

/* The keys are converted to F32 once per chunk (exact) rather than once per query head. */
static void aa_scores_f16(int hd, int nq, const float *q, const uint16_t *k, int n, float scale, float *s, size_t lds)
{
    if (hd % 32 != 0 || hd > AA_MAXHD) { /* the tail sums in double: keep the direct loop */
        int np = hd & ~31;
        for (int j = 0; j < n; j++) {
            const uint16_t *kr = k + (size_t)j * hd;
            for (int g = 0; g < nq; g++) {
                const float *qr = q + (size_t)g * hd;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int i = 0; i < np; i += 32) {
                    a0 = _mm256_fmadd_ps(aa_load_f16(kr + i), _mm256_loadu_ps(qr + i), a0);
                    a1 = _mm256_fmadd_ps(aa_load_f16(kr + i + 8), _mm256_loadu_ps(qr + i + 8), a1);
                    a2 = _mm256_fmadd_ps(aa_load_f16(kr + i + 16), _mm256_loadu_ps(qr + i + 16), a2);
                    a3 = _mm256_fmadd_ps(aa_load_f16(kr + i + 24), _mm256_loadu_ps(qr + i + 24), a3);
                }
                double sum = aa_fold(a0, a1, a2, a3);
                for (int i = np; i < hd; i++) {
                    float p = _cvtsh_ss(kr[i]) * qr[i];
                    sum += (double)p;
                }
                s[(size_t)g * lds + j] = (float)sum * scale;
            }
        }
        return;
    }
    float kf[AA_CHUNK * AA_MAXHD] __attribute__((aligned(32)));
    for (int j0 = 0; j0 < n; j0 += AA_CHUNK) {
        int m = n - j0 < AA_CHUNK ? n - j0 : AA_CHUNK;
        aa_rows_f32(k + (size_t)j0 * hd, kf, (size_t)m * hd);
        /* hd % 32 == 0: no tail, and (double)fold -> float is the fold itself, as in the scalar loop */
        aa_scores_f32(hd, nq, q, kf, m, scale, s + j0, lds);
    }
}

/* Query row qr against keys k[0 .. n8) (n8 a multiple of 8), 8 keys at a time, hd a multiple of 32. Inlined
 * with hd = 64 (llama's usual head size) the query's 8 vectors stay in registers across all keys, so each FMA
 * loads only its key vector. */
AA_INLINE void aa_scores_row8(const int hd, const float *qr, const float *k, int n8, __m256 vs, float *s)
{
    for (int j = 0; j < n8; j += 8) {
        __m256 v[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            const float *kr = k + (size_t)(j + u) * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 2
            for (int i = 0; i < hd; i += 32) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i), _mm256_loadu_ps(qr + i), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 8), _mm256_loadu_ps(qr + i + 8), a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 16), _mm256_loadu_ps(qr + i + 16), a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 24), _mm256_loadu_ps(qr + i + 24), a3);
            }
            v[u] = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
        }
        _mm256_storeu_ps(s + j, aa_fold8(v, vs));
    }
}

/* aa_fold8 for 4 chain vectors: the same adds per score ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)),
 * the 4 scores times scale in the low half. */
AA_INLINE __m128 aa_fold4(const __m256 v[4], __m256 scale)
{
    __m256 s01 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20), _mm256_permute2f128_ps(v[0], v[1], 0x31));
    __m256 s23 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20), _mm256_permute2f128_ps(v[2], v[3], 0x31));
    __m256 h = _mm256_hadd_ps(s01, s23); /* [v0 v0 v2 v2 | v1 v1 v3 v3], each (t0 + t1) and (t2 + t3) */
    h = _mm256_hadd_ps(h, h);            /* [v0 v2 v0 v2 | v1 v3 v1 v3] */
    h = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
    return _mm256_castps256_ps128(_mm256_mul_ps(h, scale));
}

/* aa_scores_row8 for hd = 64, 4 keys at a time: the query's 8 vectors, 4 chains and 4 keys' chain vectors fill
 * the 16 registers, so each FMA loads only its key vector; with 8 keys at a time (aa_scores_row8) the query
 * was reloaded for every FMA and the loads bound it (Zen 5, one core, 16 rows x 2,048 positions: 38 GMAC/s,
 * two-thirds of the FMA peak). */
AA_INLINE void aa_scores_row4_64(const float *qr, const float *k, int n4, __m256 vs, float *s)
{
    __m256 qv[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        qv[i] = _mm256_loadu_ps(qr + 8 * i);
    for (int j = 0; j < n4; j += 4) {
        __m256 v[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            const float *kr = k + (size_t)(j + u) * 64;
            const __m256 z = _mm256_setzero_ps(); /* fma(k, q, +0), not k * q: a -0 product must become +0 */
            __m256 a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kr), qv[0], z);
            __m256 a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 8), qv[1], z);
            __m256 a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 16), qv[2], z);
            __m256 a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 24), qv[3], z);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 32), qv[4], a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 40), qv[5], a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 48), qv[6], a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + 56), qv[7], a3);
            v[u] = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
        }
        _mm_storeu_ps(s + j, aa_fold4(v, vs));
    }
}

static void aa_scores_f32(int hd, int nq, const float *q, const float *k, int n, float scale, float *s, size_t lds)
{
    int np = hd & ~31;
    if (hd == 64 && n >= 4) {
        int n4 = n & ~3;
        __m256 vs = _mm256_set1_ps(scale);
        for (int g = 0; g < nq; g++)
            aa_scores_row4_64(q + (size_t)g * hd, k, n4, vs, s + (size_t)g * lds);
        if (n4 < n) /* the last n % 4 keys through the general loops below */
            aa_scores_f32(hd, nq, q, k + (size_t)n4 * hd, n - n4, scale, s + n4, lds);
        return;
    }
    int n8 = np == hd ? n & ~7 : 0; /* rows scored 8 at a time (no tail past the 32-element steps) */
    if (n8) {
        __m256 vs = _mm256_set1_ps(scale);
        for (int g = 0; g < nq; g++) {
            if (hd == 64)
                aa_scores_row8(64, q + (size_t)g * hd, k, n8, vs, s + (size_t)g * lds);
            else
                aa_scores_row8(hd, q + (size_t)g * hd, k, n8, vs, s + (size_t)g * lds);
        }
    }
    for (int j = n8; j < n; j++) {
        const float *kr = k + (size_t)j * hd;
        for (int g = 0; g < nq; g++) {
            const float *qr = q + (size_t)g * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < np; i += 32) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i), _mm256_loadu_ps(qr + i), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 8), _mm256_loadu_ps(qr + i + 8), a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 16), _mm256_loadu_ps(qr + i + 16), a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kr + i + 24), _mm256_loadu_ps(qr + i + 24), a3);
            }
            float sum = aa_fold(a0, a1, a2, a3);
            for (int i = np; i < hd; i++) {
                /* product and sum rounded separately, as in attn.c (no contraction into an FMA) */
                volatile float p = kr[i] * qr[i];
                sum += p;
            }
            s[(size_t)g * lds + j] = sum * scale;
        }
    }
}

/* 8 values of v from element i: F16 ones converted (exact), or F32 ones. */
AA_INLINE __m256 aa_load_v(const bool f16, const void *v, size_t i)
{
    return f16 ? aa_load_f16((const uint16_t *)v + i) : _mm256_loadu_ps((const float *)v + i);
}

AA_INLINE float aa_load_v1(const bool f16, const void *v, size_t i)
{
    return f16 ? _cvtsh_ss(((const uint16_t *)v)[i]) : ((const float *)v)[i];
}

/* o[g][i] accumulates over the rows j in order (the order attn.h fixes for each element); the loops keep their
 * outputs in registers across all rows instead of loading and storing them per row. What bounds them is the
 * number of independent FMA chains, not the loads: two query rows of 32 outputs (8 chains, as one row of 64)
 * measured no faster than one row, three rows of 32 (12 chains, below) 1.25x. F16 rows (f16) are converted as
 * they are loaded: through an F32 copy of each chunk (before stop 28) each V vector cost a store and a load
 * more, a quarter of the loop's time with 4 query rows (AMD Zen 4, one core). */
AA_INLINE void aa_accum_rows(const bool f16, int hd, int nq, const float *p, size_t ldp, const void *v, int n, float *o)
{
    int g = 0;
    /* Rows in threes, 32 outputs at a time: 12 chains. The one-row loop's 8 chains are exactly as many as the
     * FMA's latency (4 cycles) times its throughput (2 a cycle) keep busy, with no slack: it ran at 65% of the
     * FMA peak (Zen 5, one core, 16 rows x 2,048 positions, hd 64); each V vector now feeds 3 rows. */
    if (hd % 32 == 0)
        for (; g + 3 <= nq; g += 3) {
            const float *pg = p + (size_t)g * ldp;
            float *og = o + (size_t)g * hd;
            for (int i = 0; i < hd; i += 32) {
                __m256 r[3][4];
#pragma GCC unroll 3
                for (int u = 0; u < 3; u++)
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++)
                        r[u][c] = _mm256_loadu_ps(og + (size_t)u * hd + i + 8 * c);
                for (int j = 0; j < n; j++) {
                    size_t vr = (size_t)j * hd + i;
                    __m256 w[3];
#pragma GCC unroll 3
                    for (int u = 0; u < 3; u++)
                        w[u] = _mm256_broadcast_ss(pg + (size_t)u * ldp + j);
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++) {
                        __m256 vv = aa_load_v(f16, v, vr + 8 * c);
#pragma GCC unroll 3
                        for (int u = 0; u < 3; u++)
                            r[u][c] = _mm256_fmadd_ps(w[u], vv, r[u][c]);
                    }
                }
#pragma GCC unroll 3
                for (int u = 0; u < 3; u++)
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++)
                        _mm256_storeu_ps(og + (size_t)u * hd + i + 8 * c, r[u][c]);
            }
        }
    for (; g < nq; g++) {
        const float *pg = p + (size_t)g * ldp;
        float *og = o + (size_t)g * hd;
        int i = 0;
        for (; i + 64 <= hd; i += 64) {
            __m256 r[8]; /* in registers: every index is a constant after unrolling */
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                r[c] = _mm256_loadu_ps(og + i + 8 * c);
            for (int j = 0; j < n; j++) {
                __m256 w = _mm256_broadcast_ss(pg + j);
                size_t vr = (size_t)j * hd + i;
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++)
                    r[c] = _mm256_fmadd_ps(w, aa_load_v(f16, v, vr + 8 * c), r[c]);
            }
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                _mm256_storeu_ps(og + i + 8 * c, r[c]);
        }
        for (; i + 8 <= hd; i += 8) {
            __m256 r = _mm256_loadu_ps(og + i);
            for (int j = 0; j < n; j++)
                r = _mm256_fmadd_ps(_mm256_broadcast_ss(pg + j), aa_load_v(f16, v, (size_t)j * hd + i), r);
            _mm256_storeu_ps(og + i, r);
        }
        for (; i < hd; i++) {
            float a = og[i];
            for (int j = 0; j < n; j++)
                a = __builtin_fmaf(pg[j], aa_load_v1(f16, v, (size_t)j * hd + i), a);
            og[i] = a;
        }
    }
}

static void aa_accum_f16(int hd, int nq, const float *p, size_t ldp, const uint16_t *v, int n, float *o)
{
    aa_accum_rows(true, hd, nq, p, ldp, v, n, o);
}

static void aa_accum_f32(int hd, int nq, const float *p, size_t ldp, const float *v, int n, float *o)
{
    aa_accum_rows(false, hd, nq, p, ldp, v, n, o);
}

/* attn_exp of 8 lanes (attn.h; attn.c spells out the same steps). */
AA_INLINE __m256 aa_exp8(__m256 x)
{
    const __m256 magic = _mm256_set1_ps(0x1.8p23f);
    __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), magic);
    __m256 n = _mm256_sub_ps(z, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(z), _mm256_set1_epi32(-0x4b400000 + 127)), 23);
    __m256 v = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    /* x < -87 (and -inf): 0 */
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), v);
}

static float aa_exp1(float x)
{
    float out[8];
    _mm256_storeu_ps(out, aa_exp8(_mm256_set1_ps(x)));
    return out[0];
}

static void aa_softmax(float *s, int n)
{
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + i));
    float m8[8], mx = -INFINITY;
    _mm256_storeu_ps(m8, vm);
    for (int l = 0; l < 8; l++)
        if (m8[l] > mx)
            mx = m8[l];
    for (int t = i; t < n; t++)
        if (s[t] > mx)
            mx = s[t];
    __m256 vmx = _mm256_set1_ps(mx);
    __m256d a = _mm256_setzero_pd(), b = a;
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = aa_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmx));
        _mm256_storeu_ps(s + i, e);
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double acc[8];
    _mm256_storeu_pd(acc, a);
    _mm256_storeu_pd(acc + 4, b);
    for (; i < n; i++) {
        s[i] = aa_exp1(s[i] - mx);
        acc[i % 8] += (double)s[i];
    }
    double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
    for (; i < n; i++)
        s[i] *= (float)(1.0 / sum);
}

static void aa_to_f16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

static void aa_round_f16(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++)
        y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

static const struct attn_kernels aa_kernels = {
    aa_scores_f16, aa_scores_f32, aa_accum_f16, aa_accum_f32, aa_softmax, aa_to_f16, aa_round_f16,
};

const struct attn_kernels *attn_kernels_avx2(void) { return kernel_cpu_has_avx2() ? &aa_kernels : NULL; }
