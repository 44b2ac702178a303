/*
 * attn_avx512: AVX-512 versions of the attention kernels that dominate a long prefill (scores, V accumulation,
 * softmax, the F16 conversions of cached rows and of probabilities), bit-identical to attn_avx2.c and so to
 * the scalar attn.c. Compiled for AVX-512 by the target pragma below and handed out only when
 * gemv_cpu_has_avx512() says the CPU has it; the rest (F32 -> F16 stores, head sizes the wide loops do not
 * cover) is the AVX2 kernels'.
 *
 * Same operations in the same order, wider registers:
 *   scores: attn.h's 4 chains of 8 lanes over steps of 32 elements are chains 0 and 1 in one zmm (elements
 *           i..i+15 of a step) and chains 2 and 3 in another (i+16..i+31): one FMA of 16 lanes advances two
 *           chains. 8 keys are scored together and their folds run side by side in shuffles (ab_fold_*).
 *           Decode (up to 8 query rows per KV head) converts each F16 key vector in registers and uses it for
 *           four rows (ab_scores8x4_f16); more rows (a prefill tile) share one F32 copy of a chunk of keys,
 *           scored two rows at a time with both rows' queries in registers when the head size is 64
 *           (ab_scores8x2_64), else one row at a time.
 *   accum:  o[i] = fma(p_j, v_j[i], o[i]) per lane, rows j in order: 16 lanes per FMA, and four query rows at
 *           a time so that 16 independent FMA chains hide the FMA latency and each loaded V vector (F16 ones
 *           converted in registers) serves four rows.
 *   softmax: attn_exp on 16 lanes; the double sum keeps attn.h's 8 lanes and their order.
 * Arrays of vectors are only indexed by constants after unrolling (the pragmas), so they stay in registers:
 * without that GCC kept the accumulators on the stack and the V accumulation ran at a third of its speed.
 * Measured on an AMD EPYC Zen 5 (2 threads, 1B Q4_0 pp4096): see docs/performance.md.
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#include "engine/cpu/attn.h"

#include "engine/cpu/cpu_features.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

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

/* The fold of attn.h's chains, for 8 keys at a time, in four steps shared by the kernels below. With t_u =
 * a01 + a23 = [c0+c2 | c1+c3] of key u (lanes of a01 = [chain 0 | chain 1], of a23 = [chain 2 | chain 3]):
 *   x   = t_u.lo + t_u.hi (two keys per register)      8 lanes: (c0+c2) + (c1+c3)    ab_fold_pair
 *   y   = lanes l + l+4   (four keys per register)     4 lanes per key                ab_fold_quad
 *   h   = lanes 0+1, 2+3                               2 lanes per key                ab_fold_oct
 *   f   = (0+1) + (2+3)                                one value per key              ab_fold_last
 * Each add is one of the scalar fold's adds on the same operands (addition commutes exactly). */
static inline __attribute__((always_inline)) __m512 ab_fold_pair(__m512 t0, __m512 t1)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* x of keys (0, 1) and (2, 3) -> 128-bit chunk c: key c, lanes l + l+4 */
static inline __attribute__((always_inline)) __m512 ab_fold_quad(__m512 x0, __m512 x1)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* y of keys 0..3 and 4..7 -> chunk c: [key c: 0+1, 2+3, key 4+c: 0+1, 2+3] */
static inline __attribute__((always_inline)) __m512 ab_fold_oct(__m512 y0, __m512 y1)
{
    return _mm512_add_ps(_mm512_shuffle_ps(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* h of two query rows a and b -> [a's 8 scores | b's 8 scores] times scale (b = a for one row) */
static inline __attribute__((always_inline)) __m512 ab_fold_last(__m512 ha, __m512 hb, __m512 vs)
{
    /* chunk c: [a key c, a key 4+c, b key c, b key 4+c] */
    __m512 f = _mm512_add_ps(_mm512_shuffle_ps(ha, hb, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(ha, hb, _MM_SHUFFLE(3, 1, 3, 1)));
    f = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f);
    return _mm512_mul_ps(f, vs);
}

/* 8 scores [s_j .. s_j+7] of one query row qr against the keys k[0..8) (F32 rows hd apart), times scale, in
 * the order of attn.h, the fold running on all 8 keys at once. */
static inline __attribute__((always_inline)) __m256 ab_scores8(int hd, const float *qr, const float *k, __m512 vs)
{
    __m512 a01[8], a23[8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++)
        a01[u] = a23[u] = _mm512_setzero_ps();
    for (int i = 0; i < hd; i += 32) {
        __m512 q0 = _mm512_loadu_ps(qr + i), q1 = _mm512_loadu_ps(qr + i + 16);
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            a01[u] = _mm512_fmadd_ps(_mm512_loadu_ps(k + (size_t)u * hd + i), q0, a01[u]);
            a23[u] = _mm512_fmadd_ps(_mm512_loadu_ps(k + (size_t)u * hd + i + 16), q1, a23[u]);
        }
    }
    __m512 x[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++)
        x[u] = ab_fold_pair(_mm512_add_ps(a01[2 * u], a23[2 * u]), _mm512_add_ps(a01[2 * u + 1], a23[2 * u + 1]));
    __m512 h = ab_fold_oct(ab_fold_quad(x[0], x[1]), ab_fold_quad(x[2], x[3]));
    return _mm512_castps512_ps256(ab_fold_last(h, h, vs));
}

/* t[g] = a01 + a23 of four query rows q[g] (hd apart) against one F16 key row kr, converted in registers: each
 * key vector serves the four rows. */
static inline __attribute__((always_inline)) void ab_key_rows4(int hd, const float *q, const uint16_t *kr, __m512 t[4])
{
    __m512 a01[4], a23[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        a01[g] = a23[g] = _mm512_setzero_ps(); /* fma(k, q, +0), not k * q: a -0 product must become +0 */
    for (int i = 0; i < hd; i += 32) {
        __m512 k0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + i)));
        __m512 k1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + i + 16)));
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            a01[g] = _mm512_fmadd_ps(k0, _mm512_loadu_ps(q + (size_t)g * hd + i), a01[g]);
            a23[g] = _mm512_fmadd_ps(k1, _mm512_loadu_ps(q + (size_t)g * hd + i + 16), a23[g]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        t[g] = _mm512_add_ps(a01[g], a23[g]);
}

/* Scores of four query rows q[0..4) against the 8 F16 keys k[0..8) into s[g * lds + 0..8). Keys are folded
 * pair by pair as they finish, so that 4 rows' partial folds and one key's chains fit the 32 registers. */
static inline __attribute__((always_inline)) void ab_scores8x4_f16(int hd, const float *q, const uint16_t *k,
                                                                   __m512 vs, float *s, size_t lds)
{
    __m512 y[2][4], h[4];
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        __m512 x[2][4];
#pragma GCC unroll 2
        for (int pr = 0; pr < 2; pr++) {
            __m512 ta[4], tb[4];
            int u = 4 * half + 2 * pr;
            ab_key_rows4(hd, q, k + (size_t)u * hd, ta);
            ab_key_rows4(hd, q, k + (size_t)(u + 1) * hd, tb);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++)
                x[pr][g] = ab_fold_pair(ta[g], tb[g]);
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            y[half][g] = ab_fold_quad(x[0][g], x[1][g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++)
        h[g] = ab_fold_oct(y[0][g], y[1][g]);
#pragma GCC unroll 2
    for (int g = 0; g < 4; g += 2) {
        __m512 f = ab_fold_last(h[g], h[g + 1], vs);
        _mm256_storeu_ps(s + (size_t)g * lds, _mm512_castps512_ps256(f));
        _mm256_storeu_ps(s + (size_t)(g + 1) * lds, _mm512_extractf32x8_ps(f, 1));
    }
}

/* 8 scores of each of two query rows (their 64 elements in registers: q[r][c] = elements 16c .. 16c + 15 of row
 * r) against the F32 keys k[0..8) (64 apart), times scale, into sa and sb: ab_scores8's operations for head
 * size 64 (two 32-element steps), each loaded key vector serving both rows. One row at a time, a prefill
 * tile's scores loaded 9 vectors per 8 FMAs and ran at 59% of the FMA peak (60M Q4_0 pp8192, Zen 5). */
static inline __attribute__((always_inline)) void ab_scores8x2_64(const __m512 q[2][4], const float *k, __m512 vs,
                                                                  float *sa, float *sb)
{
    __m512 x[2][4];
#pragma GCC unroll 4
    for (int pr = 0; pr < 4; pr++) {
        __m512 t[2][2];
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            const float *kr = k + (size_t)(2 * pr + e) * 64;
            __m512 k0 = _mm512_loadu_ps(kr), k1 = _mm512_loadu_ps(kr + 16), k2 = _mm512_loadu_ps(kr + 32),
                   k3 = _mm512_loadu_ps(kr + 48);
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++) {
                /* chains 0-1 over elements 0-15 then 32-47, chains 2-3 over 16-31 then 48-63, from +0 */
                __m512 a01 = _mm512_fmadd_ps(k0, q[r][0], _mm512_setzero_ps());
                __m512 a23 = _mm512_fmadd_ps(k1, q[r][1], _mm512_setzero_ps());
                a01 = _mm512_fmadd_ps(k2, q[r][2], a01);
                a23 = _mm512_fmadd_ps(k3, q[r][3], a23);
                t[r][e] = _mm512_add_ps(a01, a23);
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++)
            x[r][pr] = ab_fold_pair(t[r][0], t[r][1]);
    }
    __m512 h[2];
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
        h[r] = ab_fold_oct(ab_fold_quad(x[r][0], x[r][1]), ab_fold_quad(x[r][2], x[r][3]));
    __m512 f = ab_fold_last(h[0], h[1], vs);
    _mm256_storeu_ps(sa, _mm512_castps512_ps256(f));
    _mm256_storeu_ps(sb, _mm512_extractf32x8_ps(f, 1));
}

static void ab_scores_f32(int hd, int nq, const float *q, const float *k, int n, float scale, float *s, size_t lds)
{
    /* 8 keys at a time over whole 32-element steps; the rest (a tail of keys or of head_dim) as AVX2 does it */
    int n8 = hd % 32 == 0 ? n & ~7 : 0;
    if (n8) {
        __m512 vs = _mm512_set1_ps(scale);
        int g = 0;
        if (hd == 64)
            for (; g + 2 <= nq; g += 2) {
                __m512 qv[2][4];
#pragma GCC unroll 2
                for (int r = 0; r < 2; r++)
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++)
                        qv[r][c] = _mm512_loadu_ps(q + (size_t)(g + r) * 64 + 16 * c);
                for (int j = 0; j < n8; j += 8)
                    ab_scores8x2_64(qv, k + (size_t)j * 64, vs, s + (size_t)g * lds + j, s + (size_t)(g + 1) * lds + j);
            }
        for (; g < nq; g++) {
            const float *qr = q + (size_t)g * hd;
            for (int j = 0; j < n8; j += 8)
                _mm256_storeu_ps(s + (size_t)g * lds + j, ab_scores8(hd, qr, k + (size_t)j * hd, vs));
        }
    }
    if (n8 < n)
        ab_avx2()->scores_f32(hd, nq, q, k + (size_t)n8 * hd, n - n8, scale, s + n8, lds);
}

/* The keys converted to F32 once per chunk of rows (exact), then scored as F32 rows: the conversion is shared
 * by all nq query rows. */
static void ab_scores_f16_chunked(int hd, int nq, const float *q, const uint16_t *k, int n, float scale, float *s,
                                  size_t lds)
{
    float kf[AB_CHUNK * AB_MAXHD] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < n; j0 += AB_CHUNK) {
        int m = n - j0 < AB_CHUNK ? n - j0 : AB_CHUNK;
        ab_rows_f32(k + (size_t)j0 * hd, kf, (size_t)m * hd);
        /* hd % 32 == 0: no tail, and (double)fold -> float is the fold itself, as in the scalar loop */
        ab_scores_f32(hd, nq, q, kf, m, scale, s + j0, lds);
    }
}

/* Up to 8 query rows (decode: one KV head's query heads) take the keys converted in registers, four rows per
 * key vector: the chunk's F32 copy cost a store and a load per key vector, more than converting it once per
 * four rows (AMD Zen 4, one core, 4 rows: 8.1-11.2 ns a position against 10.0-13.3; about as fast at 8 rows,
 * slower at 16: docs/performance.md, stop 28). The rows past a multiple of 4 and the keys past a multiple of
 * 8 go through the chunk, as does everything when there are fewer than 4 rows or 8 keys. */
static void ab_scores_f16(int hd, int nq, const float *q, const uint16_t *k, int n, float scale, float *s, size_t lds)
{
    if (hd % 32 != 0 || hd > AB_MAXHD) { /* the tail sums in double: the AVX2 kernel's direct loop */
        ab_avx2()->scores_f16(hd, nq, q, k, n, scale, s, lds);
        return;
    }
    int g4 = nq <= 8 ? nq & ~3 : 0, n8 = n & ~7;
    if (!g4 || !n8)
        g4 = n8 = 0;
    __m512 vs = _mm512_set1_ps(scale);
    for (int g = 0; g < g4; g += 4)
        for (int j = 0; j < n8; j += 8)
            ab_scores8x4_f16(hd, q + (size_t)g * hd, k + (size_t)j * hd, vs, s + (size_t)g * lds + j, lds);
    if (g4 < nq && n8)
        ab_scores_f16_chunked(hd, nq - g4, q + (size_t)g4 * hd, k, n8, scale, s + (size_t)g4 * lds, lds);
    if (n8 < n)
        ab_scores_f16_chunked(hd, nq, q, k + (size_t)n8 * hd, n - n8, scale, s + n8, lds);
}

/* nr query rows (1, 2 or 4; p and o hold them ldp and hd apart): 64 outputs each from v's column 0, over rows
 * j < n in order; v holds F16 rows when f16 (converted in registers: through an F32 copy each V vector cost a
 * store and a load more, a third of the loop's time on AMD Zen 4, stop 28), else F32 ones. With 4 rows, 16
 * independent FMA chains hide the FMA latency and each loaded V vector serves 4 FMAs. Every array here is
 * indexed by constants after unrolling, so it lives in registers. */
static inline __attribute__((always_inline)) void ab_accum64(const int nr, const bool f16, int hd, const float *p,
                                                             size_t ldp, const void *v, int n, float *o)
{
    __m512 r[4][4];
#pragma GCC unroll 4
    for (int g = 0; g < nr; g++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            r[g][c] = _mm512_loadu_ps(o + (size_t)g * hd + 16 * c);
    for (int j = 0; j < n; j++) {
        __m512 x[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            size_t e = (size_t)j * hd + 16 * c;
            x[c] = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)v + e)))
                       : _mm512_loadu_ps((const float *)v + e);
        }
#pragma GCC unroll 4
        for (int g = 0; g < nr; g++) {
            __m512 w = _mm512_set1_ps(p[(size_t)g * ldp + j]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                r[g][c] = _mm512_fmadd_ps(w, x[c], r[g][c]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < nr; g++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(o + (size_t)g * hd + 16 * c, r[g][c]);
}

/* Rows 4, 2, then 1 at a time, each over 64 columns of v at a time (hd % 64 == 0); es: v's element size. */
static inline __attribute__((always_inline)) void ab_accum_rows(const bool f16, int hd, int nq, const float *p,
                                                                size_t ldp, const void *v, int n, float *o)
{
    size_t es = f16 ? sizeof(uint16_t) : sizeof(float);
    int g = 0;
    for (; g + 4 <= nq; g += 4)
        for (int i = 0; i < hd; i += 64)
            ab_accum64(4, f16, hd, p + (size_t)g * ldp, ldp, (const char *)v + i * es, n, o + (size_t)g * hd + i);
    for (; g + 2 <= nq; g += 2)
        for (int i = 0; i < hd; i += 64)
            ab_accum64(2, f16, hd, p + (size_t)g * ldp, ldp, (const char *)v + i * es, n, o + (size_t)g * hd + i);
    if (g < nq)
        for (int i = 0; i < hd; i += 64)
            ab_accum64(1, f16, hd, p + (size_t)g * ldp, ldp, (const char *)v + i * es, n, o + (size_t)g * hd + i);
}

static void ab_accum_f32(int hd, int nq, const float *p, size_t ldp, const float *v, int n, float *o)
{
    if (hd % 64 != 0)
        ab_avx2()->accum_f32(hd, nq, p, ldp, v, n, o);
    else
        ab_accum_rows(false, hd, nq, p, ldp, v, n, o);
}

static void ab_accum_f16(int hd, int nq, const float *p, size_t ldp, const uint16_t *v, int n, float *o)
{
    if (hd % 64 != 0)
        ab_avx2()->accum_f16(hd, nq, p, ldp, v, n, o);
    else
        ab_accum_rows(true, hd, nq, p, ldp, v, n, o);
}

/* attn_exp of 16 lanes: aa_exp8's steps (attn.h), wider. */
static inline __attribute__((always_inline)) __m512 ab_exp16(__m512 x)
{
    const __m512 magic = _mm512_set1_ps(0x1.8p23f);
    __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), magic);
    __m512 n = _mm512_sub_ps(z, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(z), _mm512_set1_epi32(-0x4b400000 + 127)), 23);
    __m512 v = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    /* x < -87 (and -inf): 0 */
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ), v);
}

/* attn.h's softmax with 16 lanes per step: the max is exact in any order; the double sum keeps attn.h's 8
 * lanes (elements i..i+7 of a step are added before i+8..i+15, so lane l still adds e_l, e_l+8, ... in
 * index order), then its fold. */
static void ab_softmax(float *s, int n)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + i));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + i + 16));
    }
    for (; i + 16 <= n; i += 16)
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + i));
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    for (; i < n; i++)
        if (s[i] > mx)
            mx = s[i];
    __m512 vmx = _mm512_set1_ps(mx);
    __m512d a = _mm512_setzero_pd();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = ab_exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vmx));
        _mm512_storeu_ps(s + i, e);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (i + 8 <= n) {
        __m256 e = _mm512_castps512_ps256(ab_exp16(_mm512_sub_ps(_mm512_zextps256_ps512(_mm256_loadu_ps(s + i)), vmx)));
        _mm256_storeu_ps(s + i, e);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(e));
        i += 8;
    }
    double acc[8];
    _mm512_storeu_pd(acc, a);
    for (; i < n; i++) {
        float e[16];
        _mm512_storeu_ps(e, ab_exp16(_mm512_set1_ps(s[i] - mx)));
        s[i] = e[0];
        acc[i % 8] += (double)s[i];
    }
    double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    float inv = (float)(1.0 / sum);
    __m512 vinv = _mm512_set1_ps(inv);
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), vinv));
    for (; i < n; i++)
        s[i] *= inv;
}

static void ab_to_f16(const float *x, uint16_t *y, int64_t n) { ab_avx2()->to_f16(x, y, n); }

static void ab_round_f16(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    if (i < n)
        ab_avx2()->round_f16(x + i, y + i, n - i);
}

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
