/*
 * quantize: converts a GGUF model's weights to another storage type, choosing per-tensor types the way
 * llama-quantize does so that our q4_k_m / q4_0 files have the same type mix as llama.cpp's. `wafer
 * quantize` (src/cli/cmd_quantize.c) is its command line; the tests check the plan and the conversion here.
 */
#ifndef WAFER_ENGINE_GGUF_QUANTIZE_H
#define WAFER_ENGINE_GGUF_QUANTIZE_H

#include "engine/dtype.h"
#include "engine/gguf/gguf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* A TYPE argument of `wafer quantize`. */
struct quantize_target {
    const char *name;   /* as typed on the command line, lower case: "q4_k_m" */
    enum dtype base;    /* type of ordinary weight matrices: Q4_K for q4_k_m */
    uint32_t file_type; /* llama.cpp's LLAMA_FTYPE number written to general.file_type */
    bool k_m;           /* the _M mix: more bits for some attn_v / ffn_down */
};

/* Looks up a type name (case-insensitive): f32, f16, bf16, q8_0, q4_0, q6_k, q4_k_m. 0 or ERR_INVALID_ARG. */
int quantize_target_parse(const char *name, struct quantize_target *out);

/* "f32, f16, bf16, q8_0, q4_0, q6_k, q4_k_m", for usage and error messages. */
const char *quantize_target_list(void);

/* true for the tensors that get converted: 2-D (ne[1] > 1) weights named "*.weight" (token_embd included);
 * norms, biases and other 1-D tensors keep their type. */
bool quantize_tensor_wanted(const struct gguf_tensor *t);

/* Fills types[i] (gguf_tensor_count(g) entries) with the type tensor i gets. Unless pure: output.weight goes
 * to Q6_K for quantized targets (Q8_0 stays Q8_0), and q4_k_m puts attn_v/ffn_down of the layers llama.cpp
 * favours (first and last eighth, every third between) in Q6_K. A row length that is not a multiple of the
 * chosen block size falls back to a type that fits (Q8_0, else F16); when fallback is not NULL, fallback[i]
 * says so. */
void quantize_plan(const struct gguf *g, const struct quantize_target *t, bool pure, enum dtype *types,
                   bool *fallback);

/* Converts in -> out (created/truncated; removed again on failure). Progress lines ("[ 3/39] name ...") go to
 * progress when it is not NULL. Returns 0 or a negative error with a message in err. */
int quantize_file(const char *in, const char *out, const struct quantize_target *t, bool pure, FILE *progress,
                  char *err);

#endif
