/*
 * kernels_expf: glibc's expf written out (see kernels.h), the one exp of the feed-forward's SwiGLU. Its own file
 * because both kernels.c (the scalar loop) and kernels_avx2.c (the special lanes of the vector loops, and the
 * table) use it, and neither may call back into the other. Compiled without SIMD flags: fma() is the library's,
 * exact on every CPU.
 */
#include "engine/cpu/kernels.h"

#include <math.h>
#include <string.h>

const uint64_t kernel_expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

static double kern_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

float kernel_expf(float x)
{
    uint32_t ix;
    memcpy(&ix, &x, sizeof ix);
    uint32_t abstop = ix >> 20 & 0x7ff;
    if (abstop >= 0x42b) { /* |x| >= 88, inf or NaN: glibc's cases, in its order */
        if (ix == 0xff800000u)
            return 0.0f;
        if (abstop >= 0x7f8)
            return x + x;
        if (x > 0x1.62e42ep6f) /* past log(FLT_MAX) */
            return INFINITY;
        if (x < -0x1.9fe368p6f) /* below log(2^-150): rounds to 0 */
            return 0.0f;
        if (x < -0x1.9d1d9ep6f) /* below log(2^-149): glibc returns 0x1.4p-75f squared, the least subnormal */
            return 0x1p-149f;
    }
    /* each fma() is one of glibc's fused operations (its FMA build contracts these and no others) */
    double xd = (double)x, invln2n = kern_f64(KERNEL_EXPF_INVLN2N), shift = kern_f64(KERNEL_EXPF_SHIFT);
    double kd = fma(invln2n, xd, shift);
    uint64_t ki;
    memcpy(&ki, &kd, sizeof ki);
    kd -= shift;
    double r = fma(invln2n, xd, -kd);
    double s = kern_f64(kernel_expf_tab[ki % 32] + (ki << 47));
    double z = fma(r, kern_f64(KERNEL_EXPF_C0), kern_f64(KERNEL_EXPF_C1));
    double r2 = r * r;
    double y = fma(r, kern_f64(KERNEL_EXPF_C2), 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}
