/*
 * ftype: per-tensor type choice for whole-model formats (see ftype.h). The "more bits" layers of q4_k_m are
 * the first and last eighth of the layers plus every third layer in between, as in llama.cpp.
 */
#include "engine/gguf/ftype.h"

#include "core/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    enum ftype f;
    const char *name;
} ftype_names[] = {
    {FTYPE_F32, "f32"},   {FTYPE_F16, "f16"},       {FTYPE_BF16, "bf16"},     {FTYPE_Q8_0, "q8_0"},
    {FTYPE_Q4_0, "q4_0"}, {FTYPE_Q4_K_M, "q4_k_m"}, {FTYPE_Q6_K, "q6_k"},
};

int ftype_from_name(const char *name, enum ftype *out)
{
    for (size_t i = 0; i < sizeof ftype_names / sizeof ftype_names[0]; i++)
        if (!strcasecmp(name, ftype_names[i].name)) {
            *out = ftype_names[i].f;
            return 0;
        }
    return ERR_INVALID_ARG;
}

const char *ftype_name(enum ftype f)
{
    for (size_t i = 0; i < sizeof ftype_names / sizeof ftype_names[0]; i++)
        if (ftype_names[i].f == f)
            return ftype_names[i].name;
    return "unknown";
}

const char *ftype_list(void) { return "f32, f16, bf16, q8_0, q4_0, q4_k_m, q6_k"; }

static bool ftype_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* Layer index of "blk.N.*", or -1. */
static int ftype_layer(const char *name)
{
    if (strncmp(name, "blk.", 4))
        return -1;
    return atoi(name + 4);
}

/* A type whose block divides ne0: K-quants fall back to Q8_0, anything else to F16. */
static enum dtype ftype_fit(enum dtype t, int64_t ne0, bool *fallback)
{
    if (ne0 % (int64_t)dtype_block_elems(t) == 0)
        return t;
    if (fallback)
        *fallback = true;
    return dtype_block_elems(t) > QK8_0 && ne0 % QK8_0 == 0 ? DTYPE_Q8_0 : DTYPE_F16;
}

enum dtype ftype_tensor_type(enum ftype f, const char *name, uint32_t n_dims, int64_t ne0, int n_layers, bool tied,
                             bool pure, bool *fallback)
{
    if (fallback)
        *fallback = false;
    if (n_dims < 2)
        return DTYPE_F32;
    enum dtype base;
    switch (f) {
    case FTYPE_F32: return DTYPE_F32;
    case FTYPE_F16: return DTYPE_F16;
    case FTYPE_BF16: return DTYPE_BF16;
    case FTYPE_Q8_0: base = DTYPE_Q8_0; break;
    case FTYPE_Q4_0: base = DTYPE_Q4_0; break;
    case FTYPE_Q6_K: base = DTYPE_Q6_K; break;
    default: base = DTYPE_Q4_K; break;
    }
    if (pure)
        return ftype_fit(base, ne0, fallback);
    /* the output projection (or the tied embedding standing in for it) is the most sensitive matrix */
    bool is_output = !strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight"));
    if (is_output) {
        if (ne0 % QK_K != 0) /* llama.cpp's choice, not a fallback */
            return ftype_fit(DTYPE_Q8_0, ne0, fallback);
        return base == DTYPE_Q8_0 ? DTYPE_Q8_0 : DTYPE_Q6_K;
    }
    int layer = ftype_layer(name);
    if (f == FTYPE_Q4_K_M && layer >= 0 && (strstr(name, ".attn_v.") || strstr(name, ".ffn_down")) &&
        ftype_more_bits(layer, n_layers))
        return ftype_fit(DTYPE_Q6_K, ne0, fallback);
    return ftype_fit(base, ne0, fallback);
}
