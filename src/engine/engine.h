/*
 * engine: a model bound to a backend (backend.h: "cpu" by default, or "scalar") and to the paged KV pool
 * whose blocks the backend stores. Everything, the backend's scratch included, is allocated at creation for
 * the largest batch, so a forward pass never allocates. One thread (the engine thread) owns an engine;
 * nothing here is thread-safe.
 *
 * Sequences are slots [0, max_seqs); each has a KV block table. engine_forward evaluates a ragged batch
 * (struct batch) against those tables and writes the logits of the tokens that ask for them.
 *
 * Determinism: every backend reduces every output row in an order that depends only on that row, so a
 * sequence's logits are bit-identical alone or in any batch.
 */
#ifndef WAFER_ENGINE_ENGINE_H
#define WAFER_ENGINE_ENGINE_H

#include "engine/batch.h"
#include "engine/dtype.h"
#include "engine/kvcache.h"
#include "engine/model.h"

#include <stddef.h>
#include <stdint.h>

struct engine_params {
    int n_threads;        /* compute threads; <= 0: one per online CPU */
    int n_ctx;            /* max positions per sequence; 0: the model's training context */
    int max_batch_tokens; /* largest batch engine_forward accepts (default 512) */
    int max_seqs;         /* sequence slots (default 1) */
    int block_size;       /* positions per KV block (default 16) */
    int64_t kv_blocks;    /* pool size in blocks; 0: from kv_bytes, else max_seqs * n_ctx positions */
    size_t kv_bytes;      /* KV memory budget in bytes (used when kv_blocks is 0 and kv_bytes > 0) */
    enum dtype kv_type;   /* DTYPE_F16 (default), DTYPE_F32 or DTYPE_Q8_0 (smaller, head_dim % 32 == 0) */
    bool force_scalar;    /* cpu backend: the portable scalar kernels instead of SIMD ones (--no-simd) */
    const char *backend;  /* "cpu" (default when NULL) or "scalar"; engine_create refuses other names */
};

struct engine;
struct backend_desc; /* backend.h */

void engine_params_default(struct engine_params *p);

/* 0 when name is a backend engine_create accepts (NULL means the default, "cpu"); else ERR_INVALID_ARG with
 * a message in err (may be NULL) that lists the known names. Lets a command refuse a bad --backend before it
 * loads a model. */
int engine_backend_check(const char *name, char *err);

/* Binds m (which must outlive the engine) to the backend p->backend names, with its KV storage and scratch.
 * NULL and a message on failure (unknown backend, with the available ones; KV budget too small for one
 * block). Caller frees with engine_destroy. */
struct engine *engine_create(const struct model *m, const struct engine_params *p, char *err);
void engine_destroy(struct engine *e);

const struct model *engine_model(const struct engine *e);
/* The parameters as resolved: defaults filled in, backend named, n_threads the backend's. */
const struct engine_params *engine_params_get(const struct engine *e);
/* What runs the passes: backend name, threads, memory, kernels' instruction set per weight type. */
void engine_describe(const struct engine *e, struct backend_desc *d);
struct kv_pool *engine_kv(struct engine *e);
/* The block table of sequence seq (0 <= seq < max_seqs), for schedulers that share prefixes. */
struct kv_seq *engine_seq(struct engine *e, int seq);

/* Positions in seq's KV cache. */
int engine_seq_len(const struct engine *e, int seq);
/* Keeps the first n_pos positions of seq (0 frees all of its blocks). */
void engine_seq_truncate(struct engine *e, int seq, int n_pos);

/* Evaluates batch b. For each token with logits=true, in batch order, writes n_vocab floats to
 * logits[k * n_vocab] (k-th such token); logits may be NULL when none is asked. Reserves the KV blocks it
 * needs first: on ERR_NO_SPACE nothing was changed. Other errors: ERR_INVALID_ARG (bad seq id, token id,
 * position not equal to the sequence's length, batch larger than max_batch_tokens, position >= n_ctx),
 * with a message in err (may be NULL). */
int engine_forward(struct engine *e, const struct batch *b, float *logits, char *err);

#endif
