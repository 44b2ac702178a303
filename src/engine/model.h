/*
 * model: a llama-family model loaded from GGUF and validated once: architecture, every hyperparameter, every
 * tensor's presence, shape and type. By default the file is read into memory (decode streams it faster than
 * from a mapping); it is mapped instead when asked (model_load_ex, --mmap) or when it would not fit in the
 * available memory. Either way the weights are views into that one copy of the file, read-only to every
 * reader; the one change allowed is the layout of the matrices, for a backend's kernels: put so as the file is
 * read (model_load_ex's r16) or re-laid in place at a backend's create (model_relayout), which each matrix's
 * `layout` records.
 * Supported architectures: llama (Llama 2/3, Mistral, TinyLlama, SmolLM) and qwen2 (bias on q, k, v).
 */
#ifndef WAFER_ENGINE_MODEL_H
#define WAFER_ENGINE_MODEL_H

#include "engine/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf;
struct tokenizer;

enum rope_layout {
    ROPE_ADJACENT = 0, /* rotate pairs (x[2i], x[2i+1]): llama (GGUF stores permuted q/k) */
    ROPE_HALVES = 1,   /* rotate pairs (x[i], x[i + d/2]): qwen2 ("neox" style) */
};

struct model_hparams {
    char arch[32];
    int n_vocab;
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int ffn_dim;
    int ctx_train;
    float norm_eps;
    float rope_base;
    enum rope_layout rope_layout;
    /* Linear position scaling (rope.scaling.type "linear"): positions divided by this; 0 = none. Llama 3
     * scaling comes as per-dimension factors, see model_rope_freqs(). */
    float rope_scale_factor;
    bool tied_output;
    bool qkv_bias;
};

/* How a matrix's rows lie in its memory. */
enum weight_layout {
    WEIGHT_ROWS = 0, /* GGUF's: row r at data + r * row_bytes */
    WEIGHT_R16 = 1,  /* quant.h's R16 (Q4_0, Q8_0, Q4_K, Q6_K): groups of 16 rows interleaved for the AVX-512 kernels */
};

/* A weight matrix [rows][cols] of `type`, rows * row_bytes bytes at data, laid out as `layout` says (a backend
 * may change it at create, see model_relayout; read a row with model_weight_row when it may be R16). */
struct model_weight {
    const void *data;
    enum dtype type;
    int64_t rows, cols;
    size_t row_bytes;
    enum weight_layout layout;
};

struct model_layer {
    const float *attn_norm; /* [dim] */
    struct model_weight wq; /* [n_heads*head_dim][dim] */
    struct model_weight wk; /* [n_kv_heads*head_dim][dim] */
    struct model_weight wv; /* [n_kv_heads*head_dim][dim] */
    struct model_weight wo; /* [dim][n_heads*head_dim] */
    const float *bq, *bk, *bv; /* qwen2 biases or NULL: [n_heads*head_dim], [kv_dim], [kv_dim] */
    const float *ffn_norm;     /* [dim] */
    struct model_weight w_gate; /* [ffn][dim] */
    struct model_weight w_up;   /* [ffn][dim] */
    struct model_weight w_down; /* [dim][ffn] */
};

struct model {
    struct model_hparams hp;
    struct gguf *gguf;
    struct tokenizer *tok;
    struct model_weight tok_embd; /* [n_vocab][dim] */
    const float *output_norm;     /* [dim] */
    struct model_weight output;   /* [n_vocab][dim]; equals tok_embd when tied */
    struct model_layer *layers;   /* [n_layers] */
    size_t weight_bytes;          /* bytes of every weight matrix read per token (embedding excluded) */
    size_t file_bytes;
    char *path;
    char *name; /* general.name or the file's base name */
    char *chat_template; /* tokenizer.chat_template or NULL */
    enum dtype main_type; /* most common matrix type, for display */
    bool mapped;          /* weights mapped from the file (true) or read into anonymous memory */
    int layout_holders;   /* engines computing from the weights as laid out (model_layout_hold) */
};

/* Loads and validates a model. An unsupported architecture or weight type is refused with a message listing
 * what is supported. NULL and a message on failure; caller frees with model_destroy. */
struct model *model_load(const char *path, char *err);
/* Same; use_mmap maps the file (fast to open, page cache shared between processes) instead of reading it
 * into anonymous memory as model_load does (streams about 15% faster in decode; see gguf_open_mem). r16
 * (NULL: none) names the weight types a backend will want in the R16 layout (engine_model_load asks the
 * backend): when the file is read into memory, the matrices model_relayout would re-lay for it are put in
 * that layout as they are read (their `layout` says so), which costs nothing, where re-laying them at the
 * backend's create costs a pass over them (1B Q4_0: 40 ms). A backend wanting another layout still gets it
 * from model_relayout. */
struct model *model_load_ex(const char *path, bool use_mmap, const bool *r16, char *err);
/* Whether model_load_ex reads a file of file_bytes into memory when mem_available bytes are available
 * (/proc/meminfo MemAvailable): it keeps 512 MiB + 1/16 of that free, and maps the file (with a warning)
 * otherwise. Exposed for tests. */
bool model_load_fits_memory(uint64_t file_bytes, uint64_t mem_available);
void model_destroy(struct model *m);

/* Row r of w in GGUF order: a pointer into w->data (WEIGHT_ROWS), or buf (w->row_bytes bytes) filled from
 * the R16 layout. */
const void *model_weight_row(const struct model_weight *w, int64_t r, void *buf);

/* Lays out the model's matrices as a backend's kernels read them: every layer's seven matrices and output
 * (unless tied to token_embd, which embedding lookups read by row) become WEIGHT_R16 when r16[type] and their
 * rows are a multiple of 16, WEIGHT_ROWS otherwise. The bytes move in place (the memory is made writable for
 * it), so the model keeps its size. 0; ERR_UNSUPPORTED when a matrix would change and the weights are mapped
 * from the file, ERR_UNAVAILABLE when one would change while a backend holds the layout (nothing changes in
 * either case); ERR_NOMEM. Backends call it from create (and hold the result); the next create puts back what
 * it needs. */
int model_relayout(const struct model *m, const bool r16[DTYPE_COUNT]);
/* A backend computing from the weights as they are laid out holds them (from create to destroy): while any
 * holder remains, model_relayout refuses a change with ERR_UNAVAILABLE and changes nothing. Creates and
 * destroys on one model are not concurrent (the engine's owner makes them). */
void model_layout_hold(const struct model *m);
void model_layout_release(const struct model *m);

/* Llama 3 per-dimension RoPE frequency divisors [head_dim / 2] (tensor rope_freqs.weight), or NULL. */
const float *model_rope_freqs(const struct model *m);

/* One-paragraph human description (architecture, dims, types, size, tokenizer, chat template), for
 * `wafer info`. Writes at most cap bytes; returns the length. */
int model_describe(const struct model *m, char *buf, size_t cap);

#endif
