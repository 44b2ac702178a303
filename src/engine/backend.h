/*
 * backend: the seam between the engine and the hardware that runs the forward pass, in the manner of ggml's
 * backend interface: an ops table per kind of device, an instance per model, and a registry by name.
 *
 * The engine (engine.c) keeps everything that does not depend on the device: parameters, validation of a
 * batch, the KV pool's metadata (block tables, reference counts, sharing, all-or-nothing reservation). A
 * backend owns what does: the weights in its memory, the storage of the KV blocks, its scratch, and the
 * forward pass itself. The scheduler and the server only see engine.h, so adding a backend changes neither.
 *
 * Life of a backend instance, as engine_create drives it:
 *   create(model, params)     places the weights (host to backend memory; host backends compute from the
 *                             model's own pointers) and sizes the scratch for max_batch_tokens
 *   kv_alloc(layout)          storage for layout->n_blocks KV blocks (kvcache.h fixes the block layout)
 *   forward(pass) ...         one ragged batch per call, its KV blocks already reserved by the engine
 *   kv_copy(dst, src) ...     when the pool copies a shared block before a write (copy on write)
 *   destroy()
 * Preemption and truncation only return blocks to the pool's free list: the backend is not told.
 *
 * Contract of forward, which the scheduler relies on: a token's logits depend only on its sequence's tokens
 * (bit-identical whether the sequence runs alone or in any batch, at any thread count). The engine has
 * validated the batch and reserved its blocks, so a host backend cannot fail; one that can (a device error)
 * returns an error code, and the engine then leaves the sequences' lengths unchanged (the reserved blocks
 * stay in their tables and serve the retry).
 *
 * Backends: "cpu" (cpu/cpu_backend.c: SIMD kernels chosen for the CPU, a thread pool, batched products) and
 * "scalar" (scalar/scalar_backend.c: a plain single-threaded reference forward pass, one token at a time).
 */
#ifndef WAFER_ENGINE_BACKEND_H
#define WAFER_ENGINE_BACKEND_H

#include "engine/batch.h"
#include "engine/dtype.h"
#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/model.h"

#include <stddef.h>
#include <stdint.h>

/* One instance of a backend. Each implementation embeds this as the first member of its own state. */
struct backend {
    const struct backend_ops *ops;
};

/* One forward pass as the engine hands it over: validated (ids in range, each sequence's tokens at
 * consecutive positions from its length, at most max_batch_tokens) and with every position's KV block
 * reserved. Token t of b writes its K and V rows to block seqs[seq].blocks[pos / block_size] at slot
 * pos % block_size, and attends to positions 0..pos of its sequence (earlier ones already in the cache or
 * earlier in the same batch). */
struct backend_pass {
    const struct batch *b;
    const struct kv_seq *seqs;  /* block tables by sequence id */
    const int32_t *logit_rows;  /* [n_logits] batch index of each token with logits = true, in batch order */
    int n_logits;
    int n_seqs;                 /* distinct sequences in b (b->n == n_seqs: a pure decode step) */
    float *logits;              /* [n_logits][n_vocab] host memory, written by forward */
};

/* What a backend instance is and holds, for reports (wafer bench, serve's start-up line). */
struct backend_desc {
    const char *name;     /* "cpu", "scalar" */
    int n_threads;        /* compute threads it runs */
    size_t weight_bytes;  /* weights it computes from (host backends: the model's own memory, not a copy) */
    size_t kv_bytes;      /* KV block storage */
    size_t scratch_bytes; /* activations and other per-pass buffers, allocated at create */
    /* instruction set of the kernels per weight type the model uses ("avx512", "avx-vnni", "avx2",
     * "scalar"); NULL for types the model does not use */
    const char *isa[DTYPE_COUNT];
    /* how its decode kernels read their weights ("q4_0 nta, q8_0 sparse, ..."; cpu_features.h) and where that
     * came from ("built-in rules", "tune file PATH"); "" where the backend has no such choice */
    char decode_prefetch[128];
    char decode_prefetch_source[640];
};

struct backend_ops {
    const char *name;
    /* An instance for model m (which outlives it) with the engine's resolved parameters: n_ctx,
     * max_batch_tokens, max_seqs, block_size, kv_type are final (n_threads <= 0: the backend chooses).
     * Places the weights and allocates the scratch. NULL and a message on failure (unsupported weight or
     * KV type, out of memory). */
    struct backend *(*create)(const struct model *m, const struct engine_params *p, char *err);
    void (*destroy)(struct backend *be);
    /* Storage for layout->n_blocks KV blocks of the layout kvcache.h describes (once, after create). 0, or
     * ERR_NOMEM with a message. */
    int (*kv_alloc)(struct backend *be, const struct kv_pool_params *layout, char *err);
    /* Copies KV block src (every layer, K and V) over block dst. */
    void (*kv_copy)(struct backend *be, int32_t dst, int32_t src);
    /* Evaluates one pass (see struct backend_pass). 0, or a negative ERR_* with a message. */
    int (*forward)(struct backend *be, const struct backend_pass *pass, char *err);
    void (*describe)(const struct backend *be, struct backend_desc *d);
    /* NULL, or the weight types create(m, p) will lay out in the R16 layout (model_relayout), for any model:
     * r16[t] set for those. Lets the loader put them so while reading the file (engine_model_load). */
    void (*weight_layouts)(const struct engine_params *p, bool r16[DTYPE_COUNT]);
};

/* The backend registered under name (NULL: "cpu"), or NULL when there is none. */
const struct backend_ops *backend_find(const char *name);
/* The registered names, comma-separated ("cpu, scalar"), written to buf (cap bytes, cut if shorter), for
 * messages. Returns buf. */
const char *backend_names(char *buf, size_t cap);

#endif
