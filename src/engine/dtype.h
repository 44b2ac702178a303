/*
 * dtype: tensor element types, numbered exactly as GGML/GGUF numbers them so that a type read from a GGUF
 * file is used as is. Quantized types store elements in blocks: `block_elems` elements take `block_bytes`
 * bytes, so a row of n elements (n a multiple of block_elems) takes n / block_elems * block_bytes bytes.
 */
#ifndef WAFER_ENGINE_DTYPE_H
#define WAFER_ENGINE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

enum dtype {
    DTYPE_F32 = 0,
    DTYPE_F16 = 1,
    DTYPE_Q4_0 = 2,
    DTYPE_Q4_1 = 3,
    DTYPE_Q5_0 = 6,
    DTYPE_Q5_1 = 7,
    DTYPE_Q8_0 = 8,
    DTYPE_Q8_1 = 9,
    DTYPE_Q2_K = 10,
    DTYPE_Q3_K = 11,
    DTYPE_Q4_K = 12,
    DTYPE_Q5_K = 13,
    DTYPE_Q6_K = 14,
    DTYPE_Q8_K = 15,
    DTYPE_IQ2_XXS = 16,
    DTYPE_IQ2_XS = 17,
    DTYPE_IQ3_XXS = 18,
    DTYPE_IQ1_S = 19,
    DTYPE_IQ4_NL = 20,
    DTYPE_IQ3_S = 21,
    DTYPE_IQ2_S = 22,
    DTYPE_IQ4_XS = 23,
    DTYPE_I8 = 24,
    DTYPE_I16 = 25,
    DTYPE_I32 = 26,
    DTYPE_I64 = 27,
    DTYPE_F64 = 28,
    DTYPE_IQ1_M = 29,
    DTYPE_BF16 = 30,
    DTYPE_TQ1_0 = 34,
    DTYPE_TQ2_0 = 35,
    DTYPE_MXFP4 = 39,
    DTYPE_COUNT = 40
};

/* Block geometry of the quantized types (elements per block). */
#define QK4_0 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* true when t names a type GGML defines (known geometry), supported by the engine or not. */
bool dtype_is_known(uint32_t t);

/* true when the engine can compute with weights of this type. */
bool dtype_is_supported(enum dtype t);

/* Lower-case name as llama.cpp prints it ("f32", "q4_k", ...); "unknown" for an unknown type. */
const char *dtype_name(enum dtype t);

/* Type from a case-insensitive name; returns 0 and sets *out, or a negative error code. */
int dtype_from_name(const char *name, enum dtype *out);

/* Elements per block and bytes per block (1 and sizeof element for plain types). 0 for unknown types. */
size_t dtype_block_elems(enum dtype t);
size_t dtype_block_bytes(enum dtype t);

/* Bytes of a row of n elements; n must be a multiple of dtype_block_elems(t) (checked by callers that read
 * files: see dtype_row_bytes_checked). */
size_t dtype_row_bytes(enum dtype t, int64_t n);

/* Comma-separated names of the weight types the engine supports, for error messages. */
const char *dtype_supported_list(void);

/* IEEE half and bfloat16 conversions (round to nearest even; NaN kept). */
float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

#endif
