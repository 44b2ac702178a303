/*
 * attn: the scalar attention kernels (see attn.h for the reduction orders they define) and the run-time
 * choice between them and the AVX2 ones. The scalar score loop spells out the 8-lane chains of the SIMD
 * version with fmaf so the two agree bit for bit.
 */
#include "engine/cpu/attn.h"

#include "engine/dtype.h"
#include "engine/cpu/kernels.h"

#include <math.h>
#include <string.h>

/* Folds 4 chains of 8 lanes into one float in the order of attn.h. */
static float attn_fold(float acc[4][8])
{
    float t[4];
    for (int l = 0; l < 8; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
        acc[0][l] += acc[1][l];
    }
    for (int l = 0; l < 4; l++)
        t[l] = acc[0][l] + acc[0][l + 4];
    return (t[0] + t[1]) + (t[2] + t[3]);
}

static void attn_scores_f16(int hd, int nq, const float *q, const uint16_t *k, int n, float scale, float *s, size_t lds)
{
    int np = hd & ~31;
    for (int j = 0; j < n; j++) {
        const uint16_t *kr = k + (size_t)j * hd;
        for (int g = 0; g < nq; g++) {
            const float *qr = q + (size_t)g * hd;
            float acc[4][8] = {{0}};
            for (int i = 0; i < np; i += 32)
                for (int c = 0; c < 4; c++)
                    for (int l = 0; l < 8; l++)
                        acc[c][l] = fmaf(fp16_to_f32(kr[i + 8 * c + l]), qr[i + 8 * c + l], acc[c][l]);
            double sum = attn_fold(acc);
            for (int i = np; i < hd; i++)
                sum += (double)(fp16_to_f32(kr[i]) * qr[i]);
            s[(size_t)g * lds + j] = (float)sum * scale;
        }
    }
}

static void attn_scores_f32(int hd, int nq, const float *q, const float *k, int n, float scale, float *s, size_t lds)
{
    int np = hd & ~31;
    for (int j = 0; j < n; j++) {
        const float *kr = k + (size_t)j * hd;
        for (int g = 0; g < nq; g++) {
            const float *qr = q + (size_t)g * hd;
            float acc[4][8] = {{0}};
            for (int i = 0; i < np; i += 32)
                for (int c = 0; c < 4; c++)
                    for (int l = 0; l < 8; l++)
                        acc[c][l] = fmaf(kr[i + 8 * c + l], qr[i + 8 * c + l], acc[c][l]);
            float sum = attn_fold(acc);
            for (int i = np; i < hd; i++) {
                float p = kr[i] * qr[i];
                sum += p;
            }
            s[(size_t)g * lds + j] = sum * scale;
        }
    }
}

static void attn_accum_f16(int hd, int nq, const float *p, size_t ldp, const uint16_t *v, int n, float *o)
{
    for (int j = 0; j < n; j++)
        for (int g = 0; g < nq; g++) {
            float w = p[(size_t)g * ldp + j];
            float *og = o + (size_t)g * hd;
            for (int i = 0; i < hd; i++)
                og[i] = fmaf(w, fp16_to_f32(v[(size_t)j * hd + i]), og[i]);
        }
}

static void attn_accum_f32(int hd, int nq, const float *p, size_t ldp, const float *v, int n, float *o)
{
    for (int j = 0; j < n; j++)
        for (int g = 0; g < nq; g++) {
            float w = p[(size_t)g * ldp + j];
            float *og = o + (size_t)g * hd;
            for (int i = 0; i < hd; i++)
                og[i] = fmaf(w, v[(size_t)j * hd + i], og[i]);
        }
}

/* attn_exp as attn.h defines it: every step the AVX2 version takes, one lane at a time. */
static float attn_exp(float x)
{
    if (x < -87.0f)
        return 0.0f;
    float z = fmaf(x, 0x1.715476p+0f, 0x1.8p23f); /* 1.5 * 2^23 + round(x log2 e) */
    float n = z - 0x1.8p23f;
    float r = fmaf(-n, 0x1.62e4p-1f, x);
    r = fmaf(-n, 0x1.7f7d1cp-20f, r);
    float p = 1.0f / 5040;
    p = fmaf(p, r, 1.0f / 720);
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t zi, e;
    float k;
    memcpy(&zi, &z, sizeof zi);
    e = (int32_t)((uint32_t)(zi - 0x4b400000 + 127) << 23); /* 2^n */
    memcpy(&k, &e, sizeof k);
    return p * k;
}

static void attn_softmax(float *s, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (s[i] > mx)
            mx = s[i];
    double acc[8] = {0};
    for (int i = 0; i < n; i++) {
        s[i] = attn_exp(s[i] - mx);
        acc[i % 8] += (double)s[i];
    }
    double sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        s[i] *= inv;
}

static void attn_to_f16(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = f32_to_fp16(x[i]);
}

static void attn_round_f16(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = fp16_to_f32(f32_to_fp16(x[i]));
}

static const struct attn_kernels attn_scalar = {
    attn_scores_f16, attn_scores_f32, attn_accum_f16, attn_accum_f32, attn_softmax, attn_to_f16, attn_round_f16,
};

const struct attn_kernels *attn_kernels_scalar(void) { return &attn_scalar; }

const struct attn_kernels *attn_kernels_get(bool force_scalar)
{
    const struct attn_kernels *k = force_scalar ? NULL : attn_kernels_avx512();
    if (!k && !force_scalar)
        k = attn_kernels_avx2();
    return k ? k : &attn_scalar;
}
