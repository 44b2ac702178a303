/*
 * ftype: whole-model weight formats as llama.cpp names them (f32, f16, bf16, q8_0, q4_0, q4_k_m, q6_k)
 * and the rule that picks each tensor's type for a format, following llama.cpp's llama-quantize so files we
 * write have the same mix of types (and the same bytes per token) as the files users download: q4_k_m puts
 * attn_v and ffn_down of some layers and the output matrix in Q6_K, the rest in Q4_K; q4_0 keeps the output
 * matrix in Q6_K unless "pure".
 */
#ifndef WAFER_ENGINE_FTYPE_H
#define WAFER_ENGINE_FTYPE_H

#include "engine/dtype.h"

#include <stdbool.h>
#include <stdint.h>

/* Numbered as llama.cpp's LLAMA_FTYPE_* (the value of general.file_type). */
enum ftype {
    FTYPE_F32 = 0,
    FTYPE_F16 = 1,
    FTYPE_Q4_0 = 2,
    FTYPE_Q8_0 = 7,
    FTYPE_Q4_K_M = 15,
    FTYPE_Q6_K = 18,
    FTYPE_BF16 = 32,
};

/* Case-insensitive name ("Q4_K_M", "f16", ...). 0 or ERR_INVALID_ARG. */
int ftype_from_name(const char *name, enum ftype *out);
const char *ftype_name(enum ftype f);
/* "f32, f16, bf16, q8_0, q4_0, q4_k_m, q6_k" for messages. */
const char *ftype_list(void);

/* Type of one tensor of a model written in format f: the one rule `wafer model new` and `wafer quantize`
 * share. name is the GGUF tensor name, ne0 its row length, n_layers the model's layers, tied whether
 * token_embd doubles as the output matrix. 1-D tensors get F32. A type whose block does not divide ne0
 * falls back to one that does (K-quants -> q8_0, others -> f16) and sets *fallback (may be NULL). */
enum dtype ftype_tensor_type(enum ftype f, const char *name, uint32_t n_dims, int64_t ne0, int n_layers, bool tied,
                             bool pure, bool *fallback);

#endif
