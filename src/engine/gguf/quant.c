/*
 * quant: scalar conversions between float rows and GGML's storage blocks (layouts in quant.h).
 *
 * Q8_0 and Q4_0 follow GGML's reference quantizers exactly (same scale formula, same rounding), so a row we
 * quantize is byte-identical to llama.cpp's. The K-quants cannot be reproduced byte for byte without copying
 * GGML's search heuristics, and need not be: any block decodes the same everywhere. Ours fit each sub-block
 * by least squares over a small grid of candidate step sizes (the idea behind GGML's make_qkx2_quants /
 * make_qx_quants), then, after the sub-block scales are rounded to their 6- or 8-bit codes, try the
 * neighbouring codes and keep the one with the smallest squared error. The error is plain (unweighted)
 * squared error: these converters serve tests and the quantize tool, not importance-weighted quantization.
 */
#include "engine/gguf/quant.h"

#include "core/err.h"

#include <float.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Round half away from zero with the result clamped to [-lim, lim]; NaN maps to -lim (fmaxf drops it). */
static inline int quant_round_clamp(float v, float lim)
{
    v = fminf(fmaxf(v, -lim), lim);
    return (int)roundf(v);
}

/* Round half to even, for the K-quant searches (values are small, so lrintf's range is never a concern). */
static inline int quant_nearest(float v) { return (int)lrintf(v); }

/* ---- Q8_0 / Q4_0: GGML's reference quantizers ---- */

static void quant_q8_0_from_f32(const float *x, struct block_q8_0 *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            y[b].qs[j] = (int8_t)quant_round_clamp(x[j] * id, 127.0f);
    }
}

static void quant_q8_0_to_f32(const struct block_q8_0 *y, float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK8_0) {
        float d = fp16_to_f32(y[b].d);
        for (int j = 0; j < QK8_0; j++)
            x[j] = d * (float)y[b].qs[j];
    }
}

static void quant_q4_0_from_f32(const float *x, struct block_q4_0 *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK4_0) {
        /* The scale takes the sign of the largest-magnitude element, which then maps to -8: the one code
         * that has no positive counterpart is spent on the extreme value. */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            /* +8.5 then truncation: round to nearest after the offset, as the reference does */
            float v0 = fminf(fmaxf(x[j] * id + 8.5f, 0.0f), 15.0f);
            float v1 = fminf(fmaxf(x[j + QK4_0 / 2] * id + 8.5f, 0.0f), 15.0f);
            y[b].qs[j] = (uint8_t)((int)v0 | ((int)v1 << 4));
        }
    }
}

static void quant_q4_0_to_f32(const struct block_q4_0 *y, float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK4_0) {
        float d = fp16_to_f32(y[b].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            x[j] = d * (float)((y[b].qs[j] & 15) - 8);
            x[j + QK4_0 / 2] = d * (float)((y[b].qs[j] >> 4) - 8);
        }
    }
}

/* ---- Q4_K ---- */

/* Least-squares fit of x[i] ~ s * L[i] - m with L[i] in [0, nmax] and m >= 0 (GGML stores a non-negative
 * min that is subtracted). Tries step sizes around (max - min) / nmax, refits (s, m) for each rounding and
 * keeps the best; returns s and sets *m_out. */
static float quant_fit_scale_min(const float *x, int n, int nmax, float *m_out)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0.0f)
        lo = 0.0f; /* the offset can only pull values down */
    if (hi <= lo) {
        *m_out = -lo;
        return 0.0f;
    }
    float best_s = (hi - lo) / (float)nmax, best_b = lo, best_err = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest((x[i] - lo) / best_s);
        l = l < 0 ? 0 : l > nmax ? nmax : l;
        float e = best_s * (float)l + lo - x[i];
        best_err += e * e;
    }
    for (int step = -4; step <= 16; step++) {
        float iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        float sl = 0, sl2 = 0, sx = 0, sxl = 0;
        int ql[QK_K];
        for (int i = 0; i < n; i++) {
            int l = quant_nearest((x[i] - lo) * iscale);
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            ql[i] = l;
            sl += (float)l;
            sl2 += (float)(l * l);
            sx += x[i];
            sxl += x[i] * (float)l;
        }
        float det = (float)n * sl2 - sl * sl;
        if (det <= 0.0f)
            continue;
        float s = ((float)n * sxl - sx * sl) / det;
        float b = (sl2 * sx - sl * sxl) / det;
        if (b > 0.0f) { /* constrained: no positive offset */
            b = 0.0f;
            s = sxl / sl2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float e = s * (float)ql[i] + b - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_b = b;
        }
    }
    /* a few alternations of re-rounding with the best fit and refitting (each step cannot increase the error
     * of the rounding it refits, and we keep the best seen) */
    for (int it = 0; it < 3 && best_s > 0.0f; it++) {
        float sl = 0, sl2 = 0, sx = 0, sxl = 0;
        int ql[QK_K];
        for (int i = 0; i < n; i++) {
            int l = quant_nearest((x[i] - best_b) / best_s);
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            ql[i] = l;
            sl += (float)l;
            sl2 += (float)(l * l);
            sx += x[i];
            sxl += x[i] * (float)l;
        }
        float det = (float)n * sl2 - sl * sl;
        if (det <= 0.0f)
            break;
        float s = ((float)n * sxl - sx * sl) / det;
        float b = (sl2 * sx - sl * sxl) / det;
        if (b > 0.0f) {
            b = 0.0f;
            s = sxl / sl2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float e = s * (float)ql[i] + b - x[i];
            err += e * e;
        }
        if (!(err < best_err))
            break;
        best_err = err;
        best_s = s;
        best_b = b;
    }
    *m_out = -best_b;
    return best_s;
}

/* Squared error of sub-block x (32 values) coded with step ds and offset dm (x ~ ds*L - dm), L rounded. */
static float quant_q4_k_sub_err(const float *x, float ds, float dm, uint8_t *L)
{
    float err = 0.0f;
    for (int i = 0; i < 32; i++) {
        int l = ds > 0.0f ? quant_nearest((x[i] + dm) / ds) : 0;
        l = l < 0 ? 0 : l > 15 ? 15 : l;
        if (L)
            L[i] = (uint8_t)l;
        float e = ds * (float)l - dm - x[i];
        err += e * e;
    }
    return err;
}

static void quant_q4_k_pack_scales(uint8_t *q, const uint8_t *sc, const uint8_t *m)
{
    memset(q, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] |= sc[j];
            q[j + 4] |= m[j];
        } else {
            q[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            q[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

static void quant_q4_k_from_f32(const float *x, struct block_q4_k *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float s[8], m[8], max_s = 0.0f, max_m = 0.0f;
        for (int j = 0; j < 8; j++) {
            s[j] = quant_fit_scale_min(x + 32 * j, 32, 15, &m[j]);
            if (s[j] < 0.0f)
                s[j] = 0.0f;
            max_s = fmaxf(max_s, s[j]);
            max_m = fmaxf(max_m, m[j]);
        }
        y[b].d = f32_to_fp16(max_s / 63.0f);
        y[b].dmin = f32_to_fp16(max_m / 63.0f);
        float d = fp16_to_f32(y[b].d), dmin = fp16_to_f32(y[b].dmin);
        uint8_t sc[8], mc[8], L[QK_K];
        for (int j = 0; j < 8; j++) {
            int ls0 = d > 0.0f ? quant_nearest(s[j] / d) : 0;
            int lm0 = dmin > 0.0f ? quant_nearest(m[j] / dmin) : 0;
            float best = FLT_MAX;
            int bls = 0, blm = 0;
            /* the codes nearest the real-valued fit are not always the best pair once both are rounded */
            for (int ls = ls0 - 1; ls <= ls0 + 1; ls++) {
                for (int lm = lm0 - 1; lm <= lm0 + 1; lm++) {
                    if (ls < 0 || ls > 63 || lm < 0 || lm > 63)
                        continue;
                    float e = quant_q4_k_sub_err(x + 32 * j, d * (float)ls, dmin * (float)lm, NULL);
                    if (e < best) {
                        best = e;
                        bls = ls;
                        blm = lm;
                    }
                }
            }
            sc[j] = (uint8_t)bls;
            mc[j] = (uint8_t)blm;
            quant_q4_k_sub_err(x + 32 * j, d * (float)bls, dmin * (float)blm, L + 32 * j);
        }
        quant_q4_k_pack_scales(y[b].scales, sc, mc);
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * k + l] = (uint8_t)(L[64 * k + l] | (L[64 * k + 32 + l] << 4));
    }
}

static void quant_q4_k_to_f32(const struct block_q4_k *y, float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float d = fp16_to_f32(y[b].d), dmin = fp16_to_f32(y[b].dmin);
        for (int k = 0; k < 4; k++) {
            uint8_t sc0, m0, sc1, m1;
            quant_q4_k_scale_min(2 * k, y[b].scales, &sc0, &m0);
            quant_q4_k_scale_min(2 * k + 1, y[b].scales, &sc1, &m1);
            float d0 = d * (float)sc0, o0 = dmin * (float)m0;
            float d1 = d * (float)sc1, o1 = dmin * (float)m1;
            const uint8_t *q = y[b].qs + 32 * k;
            for (int l = 0; l < 32; l++) {
                x[64 * k + l] = d0 * (float)(q[l] & 15) - o0;
                x[64 * k + 32 + l] = d1 * (float)(q[l] >> 4) - o1;
            }
        }
    }
}

/* ---- Q6_K ---- */

/* Least-squares fit of x[i] ~ s * L[i] with L[i] in [-32, 31]: candidate steps map the largest-magnitude
 * value to about -32 (using the extra negative code), s is refit for each rounding. Returns s. */
static float quant_fit_scale_sym(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < 1e-30f)
        return 0.0f;
    float best_s = 0.0f, best_gain = -1.0f; /* gain = (sum x*L)^2 / sum L^2: error = sum x^2 - gain */
    for (int step = -12; step <= 8; step++) {
        float iscale = -(32.0f + 0.1f * (float)step) / max;
        float sxl = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = quant_nearest(iscale * x[i]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            sxl += x[i] * (float)l;
            sl2 += (float)(l * l);
        }
        if (sl2 > 0.0f && sxl * sxl / sl2 > best_gain) {
            best_gain = sxl * sxl / sl2;
            best_s = sxl / sl2;
        }
    }
    return best_s;
}

static float quant_q6_k_sub_err(const float *x, float ds, uint8_t *L)
{
    float err = 0.0f;
    for (int i = 0; i < 16; i++) {
        int l = ds != 0.0f ? quant_nearest(x[i] / ds) : 0;
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        if (L)
            L[i] = (uint8_t)(l + 32);
        float e = ds * (float)l - x[i];
        err += e * e;
    }
    return err;
}

static void quant_q6_k_from_f32(const float *x, struct block_q6_k *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float s[16], amax = 0.0f, max = 0.0f;
        for (int g = 0; g < 16; g++) {
            s[g] = quant_fit_scale_sym(x + 16 * g, 16);
            if (fabsf(s[g]) > amax) {
                amax = fabsf(s[g]);
                max = s[g];
            }
        }
        /* int8 scales: the largest maps to -128, like the quants themselves */
        y[b].d = f32_to_fp16(max / -128.0f);
        float d = fp16_to_f32(y[b].d);
        uint8_t L[QK_K];
        for (int g = 0; g < 16; g++) {
            int c0 = d != 0.0f ? quant_nearest(s[g] / d) : 0;
            float best = FLT_MAX;
            int bc = 0;
            for (int c = c0 - 1; c <= c0 + 1; c++) {
                if (c < -128 || c > 127)
                    continue;
                float e = quant_q6_k_sub_err(x + 16 * g, d * (float)c, NULL);
                if (e < best) {
                    best = e;
                    bc = c;
                }
            }
            y[b].scales[g] = (int8_t)bc;
            quant_q6_k_sub_err(x + 16 * g, d * (float)bc, L + 16 * g);
        }
        for (int h = 0; h < 2; h++) {
            const uint8_t *l = L + 128 * h;
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            for (int i = 0; i < 32; i++) {
                ql[i] = (uint8_t)((l[i] & 15) | ((l[i + 64] & 15) << 4));
                ql[i + 32] = (uint8_t)((l[i + 32] & 15) | ((l[i + 96] & 15) << 4));
                qh[i] = (uint8_t)((l[i] >> 4) | ((l[i + 32] >> 4) << 2) | ((l[i + 64] >> 4) << 4) |
                                  ((l[i + 96] >> 4) << 6));
            }
        }
    }
}

static void quant_q6_k_to_f32(const struct block_q6_k *y, float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float d = fp16_to_f32(y[b].d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            const int8_t *sc = y[b].scales + 8 * h;
            float *o = x + 128 * h;
            for (int i = 0; i < 32; i++) {
                int g = i / 16;
                int q0 = ((ql[i] & 15) | (((qh[i] >> 0) & 3) << 4)) - 32;
                int q1 = ((ql[i + 32] & 15) | (((qh[i] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4)) - 32;
                o[i] = d * (float)sc[g] * (float)q0;
                o[i + 32] = d * (float)sc[g + 2] * (float)q1;
                o[i + 64] = d * (float)sc[g + 4] * (float)q2;
                o[i + 96] = d * (float)sc[g + 6] * (float)q3;
            }
        }
    }
}

/* ---- Q8_K ---- */

/* Q8_K is only an activation format: quantized exactly as llama.cpp's quantize_row_q8_K_ref, which its
 * x86 CPU backend uses at run time (scale from the signed extreme, -127 / max, ties to even), so products
 * with K-quant weights round as llama.cpp's do. */
static void quant_q8_k_from_f32(const float *x, struct block_q8_k *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]), max = x[j];
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = quant_nearest(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += y[b].qs[16 * g + j];
            y[b].bsums[g] = (int16_t)sum;
        }
        y[b].d = 1.0f / iscale;
    }
}

static void quant_q8_k_to_f32(const struct block_q8_k *y, float *x, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_K)
        for (int j = 0; j < QK_K; j++)
            x[j] = y[b].d * (float)y[b].qs[j];
}

/* ---- dispatch ---- */

static int quant_check(enum dtype t, int64_t n)
{
    switch (t) {
    case DTYPE_F32: case DTYPE_F16: case DTYPE_BF16: case DTYPE_Q8_0: case DTYPE_Q4_0:
    case DTYPE_Q4_K: case DTYPE_Q6_K: case DTYPE_Q8_K:
        break;
    default:
        return ERR_UNSUPPORTED;
    }
    if (n < 0 || n % (int64_t)dtype_block_elems(t) != 0)
        return ERR_INVALID_ARG;
    return 0;
}

int quant_row_from_f32(enum dtype t, const float *src, void *dst, int64_t n)
{
    int rc = quant_check(t, n);
    if (rc)
        return rc;
    int64_t nb = n / (int64_t)dtype_block_elems(t);
    switch (t) {
    case DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = f32_to_fp16(src[i]);
        break;
    case DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = f32_to_bf16(src[i]);
        break;
    case DTYPE_Q8_0: quant_q8_0_from_f32(src, dst, nb); break;
    case DTYPE_Q4_0: quant_q4_0_from_f32(src, dst, nb); break;
    case DTYPE_Q4_K: quant_q4_k_from_f32(src, dst, nb); break;
    case DTYPE_Q6_K: quant_q6_k_from_f32(src, dst, nb); break;
    case DTYPE_Q8_K: quant_q8_k_from_f32(src, dst, nb); break;
    default: return ERR_UNSUPPORTED;
    }
    return 0;
}

int quant_row_to_f32(enum dtype t, const void *src, float *dst, int64_t n)
{
    int rc = quant_check(t, n);
    if (rc)
        return rc;
    int64_t nb = n / (int64_t)dtype_block_elems(t);
    switch (t) {
    case DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = fp16_to_f32(((const uint16_t *)src)[i]);
        break;
    case DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case DTYPE_Q8_0: quant_q8_0_to_f32(src, dst, nb); break;
    case DTYPE_Q4_0: quant_q4_0_to_f32(src, dst, nb); break;
    case DTYPE_Q4_K: quant_q4_k_to_f32(src, dst, nb); break;
    case DTYPE_Q6_K: quant_q6_k_to_f32(src, dst, nb); break;
    case DTYPE_Q8_K: quant_q8_k_to_f32(src, dst, nb); break;
    default: return ERR_UNSUPPORTED;
    }
    return 0;
}

bool quant_r16_supported(enum dtype t)
{
    return t == DTYPE_Q4_0 || t == DTYPE_Q8_0 || t == DTYPE_Q4_K || t == DTYPE_Q6_K;
}

/* A block of type t as R16 sees it: its bytes and elements, nh 16-bit scales at byte hoff and nd dwords at
 * byte doff of the GGUF block. */
struct quant_r16_shape {
    size_t bb, nh, hoff, doff, nd;
    int64_t qk;
};

static struct quant_r16_shape quant_r16_shape_of(enum dtype t)
{
    switch (t) {
    case DTYPE_Q4_0: return (struct quant_r16_shape){sizeof(struct block_q4_0), 1, 0, 2, 4, QK4_0};
    case DTYPE_Q8_0: return (struct quant_r16_shape){sizeof(struct block_q8_0), 1, 0, 2, 8, QK8_0};
    case DTYPE_Q4_K: return (struct quant_r16_shape){sizeof(struct block_q4_k), 2, 0, 4, 35, QK_K};
    default: return (struct quant_r16_shape){sizeof(struct block_q6_k), 1, offsetof(struct block_q6_k, d), 0, 52, QK_K};
    }
}

/* Where dword k of a block of shape sh sits among its R16 dwords (runs of 4 stay together). */
static inline __attribute__((always_inline)) size_t quant_r16_dword_at(struct quant_r16_shape sh, size_t k)
{
    return sh.nd == 52 ? quant_r16_q6_k_dword(k) : k;
}

/* dst row j, dword i = src row i, dword j for a 4 x 4 tile of dwords (rows ss and ds bytes apart): the R16
 * layout is such tiles transposed, 16 bytes at a time (1B Q4_K_M re-laid in 90 ms with 4-byte copies). */
static inline __attribute__((always_inline)) void quant_r16_t4(const uint8_t *src, size_t ss, uint8_t *dst, size_t ds)
{
#if defined(__SSE2__)
    __m128i r0 = _mm_loadu_si128((const __m128i *)src), r1 = _mm_loadu_si128((const __m128i *)(src + ss));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(src + 2 * ss));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(src + 3 * ss));
    __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3); /* dwords 0, 1 of the rows */
    __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3); /* dwords 2, 3 */
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(dst + ds), _mm_unpackhi_epi64(t0, t1));
    _mm_storeu_si128((__m128i *)(dst + 2 * ds), _mm_unpacklo_epi64(t2, t3));
    _mm_storeu_si128((__m128i *)(dst + 3 * ds), _mm_unpackhi_epi64(t2, t3));
#else
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++)
            memcpy(dst + j * ds + 4 * i, src + i * ss + 4 * j, 4);
#endif
}

/* Q6_K's codes as its R16 kernels read them (quant.h): per half h of a block and byte i < 32, the GGUF bytes
 * a = ql[64h + i], b = ql[64h + 32 + i], c = qh[32h + i] hold the 6-bit codes k0-k3 of elements
 * 128h + 32qt + i (k0 = a & 15, k1 = b & 15, k2 = a >> 4, k3 = b >> 4, each with c's bits 2qt, 2qt + 1 as its
 * top two); in R16 code qt < 3 takes the low 6 bits of byte qt of (a, b, c) and k3's bits 2qt, 2qt + 1 their
 * top 2. A bijection on the 24 bits, applied to n such triples (the arrays do not overlap), written as masks
 * and shifts so that the compiler vectorizes it: the loader runs it over every Q6_K matrix, and a first
 * version, a byte at a time, loaded 1B Q6_K in 1.0-1.1 s against 0.25-0.43 without the re-packing. */
static inline __attribute__((always_inline)) void quant_q6_k_mix(uint8_t *restrict a, uint8_t *restrict b,
                                                                uint8_t *restrict c, size_t n, bool to_r16)
{
    if (to_r16)
        for (size_t i = 0; i < n; i++) {
            uint8_t x = a[i], y = b[i], z = c[i];
            a[i] = (uint8_t)((x & 0x0f) | ((z << 4) & 0x30) | ((y << 2) & 0xc0)); /* k0 | k3's bits 0-1 */
            b[i] = (uint8_t)((y & 0x0f) | ((z << 2) & 0x30) | (y & 0xc0));        /* k1 | k3's bits 2-3 */
            c[i] = (uint8_t)((x >> 4) | (z & 0xf0));                              /* k2 | k3's bits 4-5 */
        }
    else
        for (size_t i = 0; i < n; i++) {
            uint8_t x = a[i], y = b[i], z = c[i];
            a[i] = (uint8_t)((x & 0x0f) | (z << 4));
            b[i] = (uint8_t)((y & 0x0f) | ((x >> 2) & 0x30) | (y & 0xc0));
            c[i] = (uint8_t)(((x >> 4) & 0x03) | ((y >> 2) & 0x0c) | (z & 0xf0));
        }
}

/* The GGUF Q6_K block at blk, its ql and qh holding R16's codes, back to GGUF's (quant_q6_k_mix). */
static void quant_q6_k_codes_back(uint8_t *blk)
{
    struct block_q6_k *q = (struct block_q6_k *)blk;
    for (size_t h = 0; h < 2; h++)
        quant_q6_k_mix(q->ql + 64 * h, q->ql + 64 * h + 32, q->qh + 32 * h, 32, false);
}

/* The 48 dwords of Q6_K codes of a block of 16 rows (row lr's GGUF block at blk + lr * row_bytes) into its R16
 * dwords at q, re-packed on the way (quant_q6_k_mix): per half h and run gi, the three 4 x 4 tiles of ql's
 * dwords 16h + 4gi.., 16h + 8 + 4gi.. and qh's 32 + 8h + 4gi.. hold the same (row, byte) triples, so they are
 * mixed between their loads and their transposes, with no pass of their own (one over the R16 block after
 * the moves took 1B Q6_K's load from 257-265 ms to 286-299). */
static inline __attribute__((always_inline)) void quant_r16_q6_k_codes(const uint8_t *blk, size_t row_bytes,
                                                                      uint8_t *q)
{
    const size_t R = QUANT_R16_ROWS;
    for (size_t lr = 0; lr < R; lr += 4)
        for (size_t h = 0; h < 2; h++)
            for (size_t gi = 0; gi < 2; gi++) {
                const size_t k[3] = {16 * h + 4 * gi, 16 * h + 8 + 4 * gi, 32 + 8 * h + 4 * gi};
                uint8_t t[3][4][16]; /* [tile][row][its 4 dwords] */
                for (size_t j = 0; j < 3; j++)
                    for (size_t r = 0; r < 4; r++)
                        memcpy(t[j][r], blk + (lr + r) * row_bytes + 4 * k[j], 16);
                for (size_t r = 0; r < 4; r++)
                    quant_q6_k_mix(t[0][r], t[1][r], t[2][r], 16, true);
                for (size_t j = 0; j < 3; j++)
                    quant_r16_t4(t[j][0], 16, q + (quant_r16_q6_k_dword(k[j]) * R + lr) * 4, 4 * R);
            }
}

/* Moves one block of row lr of a group (its GGUF bytes at blk) to or from the group's R16 bytes of that block
 * (scales at hs, dwords at q): the F16 scales and the dwords from k0 on (quant_r16_group moves the ones before
 * in 4 x 4 tiles). */
static inline __attribute__((always_inline)) void quant_r16_row_block(struct quant_r16_shape sh, uint8_t *blk,
                                                                      uint8_t *hs, uint8_t *q, size_t lr, size_t k0,
                                                                      bool to_r16)
{
    const size_t R = QUANT_R16_ROWS;
    for (size_t h = 0; h < sh.nh; h++) {
        if (to_r16)
            memcpy(hs + (h * R + lr) * 2, blk + sh.hoff + 2 * h, 2);
        else
            memcpy(blk + sh.hoff + 2 * h, hs + (h * R + lr) * 2, 2);
    }
    for (size_t k = k0; k < sh.nd; k++) {
        uint8_t *d = blk + sh.doff + 4 * k, *qs = q + (quant_r16_dword_at(sh, k) * R + lr) * 4;
        if (to_r16)
            memcpy(qs, d, 4);
        else
            memcpy(d, qs, 4);
    }
}

/* Moves group g's 16 rows (GGUF rows at plain, row_bytes apart) to or from their R16 bytes at grp. sh is a
 * constant where inlined, so the copies become moves. */
static inline __attribute__((always_inline)) void quant_r16_group(struct quant_r16_shape sh, uint8_t *plain,
                                                                  size_t row_bytes, uint8_t *grp, int64_t nb,
                                                                  bool to_r16)
{
    const size_t R = QUANT_R16_ROWS, nd4 = sh.nd / 4 * 4;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *hs = grp + quant_r16_scales(sh.nh, sh.nd, nb, b), *q = grp + quant_r16_dwords(sh.nh, sh.nd, nb, b);
        uint8_t *blk = plain + (size_t)b * sh.bb;
        size_t k0 = 0; /* the dwords the loop below moves as they are */
        if (sh.nd == 52 && to_r16) { /* Q6_K's codes */
            quant_r16_q6_k_codes(blk + sh.doff, row_bytes, q);
            k0 = 48;
        }
        for (size_t k = k0; k < nd4; k += 4) /* q[k][lr] = dword k of row lr */
            for (size_t lr = 0; lr < R; lr += 4) {
                uint8_t *rows = blk + lr * row_bytes + sh.doff + 4 * k;
                uint8_t *qs = q + (quant_r16_dword_at(sh, k) * R + lr) * 4;
                if (to_r16)
                    quant_r16_t4(rows, row_bytes, qs, 4 * R);
                else
                    quant_r16_t4(qs, 4 * R, rows, row_bytes);
            }
        for (size_t lr = 0; lr < R; lr++)
            quant_r16_row_block(sh, blk + lr * row_bytes, hs, q, lr, nd4, to_r16);
        for (size_t lr = 0; sh.nd == 52 && !to_r16 && lr < R; lr++) /* Q6_K's codes back */
            quant_q6_k_codes_back(blk + lr * row_bytes);
    }
}

static inline __attribute__((always_inline)) void quant_r16_rows(struct quant_r16_shape sh, uint8_t *plain,
                                                                 uint8_t *r16, int64_t rows, int64_t nb, bool to_r16)
{
    size_t row_bytes = (size_t)nb * sh.bb;
    for (int64_t g = 0; g < rows / QUANT_R16_ROWS; g++)
        quant_r16_group(sh, plain + (size_t)g * QUANT_R16_ROWS * row_bytes, row_bytes,
                        r16 + (size_t)g * QUANT_R16_ROWS * row_bytes, nb, to_r16);
}

int quant_r16_convert(enum dtype t, const void *src, void *dst, int64_t rows, int64_t cols, bool to_r16)
{
    if (!quant_r16_supported(t) || rows < 0 || rows % QUANT_R16_ROWS || cols % quant_r16_shape_of(t).qk)
        return ERR_INVALID_ARG;
    uint8_t *plain = to_r16 ? (uint8_t *)src : dst, *r16 = to_r16 ? dst : (uint8_t *)src;
    int64_t nb = cols / quant_r16_shape_of(t).qk;
    /* one call per type, each with a constant shape */
    switch (t) {
    case DTYPE_Q4_0: quant_r16_rows(quant_r16_shape_of(DTYPE_Q4_0), plain, r16, rows, nb, to_r16); break;
    case DTYPE_Q8_0: quant_r16_rows(quant_r16_shape_of(DTYPE_Q8_0), plain, r16, rows, nb, to_r16); break;
    case DTYPE_Q4_K: quant_r16_rows(quant_r16_shape_of(DTYPE_Q4_K), plain, r16, rows, nb, to_r16); break;
    default: quant_r16_rows(quant_r16_shape_of(DTYPE_Q6_K), plain, r16, rows, nb, to_r16); break;
    }
    return 0;
}

void quant_r16_row(enum dtype t, const void *w, int64_t r, int64_t cols, void *dst)
{
    struct quant_r16_shape sh = quant_r16_shape_of(t);
    size_t row_bytes = dtype_row_bytes(t, cols);
    uint8_t *grp = (uint8_t *)w + (size_t)(r / QUANT_R16_ROWS) * QUANT_R16_ROWS * row_bytes;
    int64_t nb = cols / sh.qk;
    for (int64_t b = 0; b < nb; b++) {
        quant_r16_row_block(sh, (uint8_t *)dst + (size_t)b * sh.bb, grp + quant_r16_scales(sh.nh, sh.nd, nb, b),
                            grp + quant_r16_dwords(sh.nh, sh.nd, nb, b), (size_t)(r % QUANT_R16_ROWS), 0, false);
        if (t == DTYPE_Q6_K)
            quant_q6_k_codes_back((uint8_t *)dst + (size_t)b * sh.bb);
    }
}
