/*
 * dtype: the table of GGML element types (name, block geometry, whether the engine computes with it) and
 * the scalar half/bfloat16 conversions every kernel and converter shares.
 */
#include "engine/dtype.h"

#include "core/err.h"

#include <string.h>
#include <strings.h>

struct dtype_row {
    const char *name;
    uint16_t block_elems;
    uint16_t block_bytes;
    bool supported;
};

static const struct dtype_row dtype_table[DTYPE_COUNT] = {
    [DTYPE_F32] = {"f32", 1, 4, true},
    [DTYPE_F16] = {"f16", 1, 2, true},
    [DTYPE_Q4_0] = {"q4_0", 32, 18, true},
    [DTYPE_Q4_1] = {"q4_1", 32, 20, false},
    [DTYPE_Q5_0] = {"q5_0", 32, 22, false},
    [DTYPE_Q5_1] = {"q5_1", 32, 24, false},
    [DTYPE_Q8_0] = {"q8_0", 32, 34, true},
    [DTYPE_Q8_1] = {"q8_1", 32, 36, false},
    [DTYPE_Q2_K] = {"q2_k", 256, 84, false},
    [DTYPE_Q3_K] = {"q3_k", 256, 110, false},
    [DTYPE_Q4_K] = {"q4_k", 256, 144, true},
    [DTYPE_Q5_K] = {"q5_k", 256, 176, false},
    [DTYPE_Q6_K] = {"q6_k", 256, 210, true},
    [DTYPE_Q8_K] = {"q8_k", 256, 292, false},
    [DTYPE_IQ2_XXS] = {"iq2_xxs", 256, 66, false},
    [DTYPE_IQ2_XS] = {"iq2_xs", 256, 74, false},
    [DTYPE_IQ3_XXS] = {"iq3_xxs", 256, 98, false},
    [DTYPE_IQ1_S] = {"iq1_s", 256, 50, false},
    [DTYPE_IQ4_NL] = {"iq4_nl", 32, 18, false},
    [DTYPE_IQ3_S] = {"iq3_s", 256, 110, false},
    [DTYPE_IQ2_S] = {"iq2_s", 256, 82, false},
    [DTYPE_IQ4_XS] = {"iq4_xs", 256, 136, false},
    [DTYPE_I8] = {"i8", 1, 1, false},
    [DTYPE_I16] = {"i16", 1, 2, false},
    [DTYPE_I32] = {"i32", 1, 4, false},
    [DTYPE_I64] = {"i64", 1, 8, false},
    [DTYPE_F64] = {"f64", 1, 8, false},
    [DTYPE_IQ1_M] = {"iq1_m", 256, 56, false},
    [DTYPE_BF16] = {"bf16", 1, 2, true},
    [DTYPE_TQ1_0] = {"tq1_0", 256, 54, false},
    [DTYPE_TQ2_0] = {"tq2_0", 256, 66, false},
    [DTYPE_MXFP4] = {"mxfp4", 32, 17, false},
};

bool dtype_is_known(uint32_t t) { return t < DTYPE_COUNT && dtype_table[t].name != NULL; }

bool dtype_is_supported(enum dtype t) { return dtype_is_known((uint32_t)t) && dtype_table[t].supported; }

const char *dtype_name(enum dtype t) { return dtype_is_known((uint32_t)t) ? dtype_table[t].name : "unknown"; }

int dtype_from_name(const char *name, enum dtype *out)
{
    for (int t = 0; t < DTYPE_COUNT; t++) {
        if (dtype_table[t].name && !strcasecmp(dtype_table[t].name, name)) {
            *out = (enum dtype)t;
            return 0;
        }
    }
    return ERR_INVALID_ARG;
}

size_t dtype_block_elems(enum dtype t) { return dtype_is_known((uint32_t)t) ? dtype_table[t].block_elems : 0; }

size_t dtype_block_bytes(enum dtype t) { return dtype_is_known((uint32_t)t) ? dtype_table[t].block_bytes : 0; }

size_t dtype_row_bytes(enum dtype t, int64_t n)
{
    return (size_t)n / dtype_table[t].block_elems * dtype_table[t].block_bytes;
}

const char *dtype_supported_list(void) { return "f32, f16, bf16, q8_0, q4_0, q4_k, q6_k"; }

float fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 | ((absx >> 13) & 0x3ff) : 0));
    if (absx >= 0x477ff000) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000) { /* result is subnormal or zero */
        if (absx < 0x33000000)
            return (uint16_t)sign;
        uint32_t mant = (absx & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(absx >> 23); /* 14..24 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx >> 13) - ((127 - 15) << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) /* nan: keep it quiet */
        return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}
