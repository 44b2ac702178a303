/*
 * engine_setup: the one place where a command's options become an engine. `wafer run`, `wafer perplexity`,
 * `wafer bench` and `wafer serve` each fill a struct engine_opts from their flags (or config file), with
 * their own documented defaults, then load the model (engine_model_load) and create the engine from
 * engine_params_for_model, so the default context, the backend choice and the KV cache type are decided,
 * validated and worded the same way everywhere.
 */
#ifndef WAFER_ENGINE_ENGINE_SETUP_H
#define WAFER_ENGINE_ENGINE_SETUP_H

#include "engine/dtype.h"
#include "engine/engine.h"
#include "engine/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a user may choose about an engine. Zero means "the default" for every number. */
struct engine_opts {
    const char *backend;  /* "cpu" or "scalar" (engine_backend_check); NULL: cpu. Not copied: must outlive
                             the engine */
    int n_threads;        /* compute threads; <= 0: one per online CPU */
    int n_ctx;            /* positions per sequence; 0: the model's training context, at most n_ctx_cap */
    int n_ctx_cap;        /* ceiling on that default (run and serve: 4096, so a 128k-context model does not
                             reserve a 128k KV cache unasked); 0: none. An explicit n_ctx is never capped */
    int max_seqs;         /* sequence slots; 0: 1 */
    int max_batch_tokens; /* largest forward pass; 0: 512 */
    int64_t kv_blocks;    /* KV pool in blocks; 0: from kv_bytes, else max_seqs full contexts */
    size_t kv_bytes;      /* KV budget in bytes when kv_blocks is 0; 0: max_seqs full contexts */
    enum dtype kv_type;   /* DTYPE_F16 (default), DTYPE_F32 or DTYPE_Q8_0 */
    bool no_simd;         /* the portable kernels on the cpu backend (--no-simd) */
};

/* Everything at its default (cpu backend, f16 KV cache, the model's context uncapped, one slot). */
void engine_opts_default(struct engine_opts *o);

/* Sets o->kv_type from a user's name ("f16", "f32" or "q8_0"). 0, or ERR_INVALID_ARG with
 * "expected f16, f32 or q8_0, got 'x'" in err (may be NULL). */
int engine_opts_set_kv_type(struct engine_opts *o, const char *name, char *err);
/* Sets o->backend to name (kept, not copied) after engine_backend_check. 0, or ERR_INVALID_ARG with the
 * list of known backends in err (may be NULL). */
int engine_opts_set_backend(struct engine_opts *o, const char *name, char *err);

/* model_load_ex(path, use_mmap) with the weights laid out, as the file is read, the way the backend o names
 * (with its options) will compute from them (backend_ops.weight_layouts), so its create has nothing to re-lay.
 * NULL and a message on failure; caller frees with model_destroy. */
struct model *engine_model_load(const char *path, bool use_mmap, const struct engine_opts *o, char *err);

/* Fills p for model m from o: engine_params_default, then every option, the default context resolved
 * against the model. 0, or ERR_INVALID_ARG (unknown backend or KV type) with a message in err. */
int engine_params_for_model(const struct model *m, const struct engine_opts *o, struct engine_params *p,
                            char *err);

/* Speculative decoding's draft model (sched_params.draft_engine): loads the GGUF at path (use_mmap as
 * model_load_ex) and binds it to an engine beside the target engine t, with the target's options o
 * (backend, threads, KV type) and its context, slots, pass size and KV pool size in positions, so a draft
 * can follow every sequence the target runs. The vocabularies are compared by scheduler_create. NULL and a
 * message naming the file on failure; else the engine, the model in *dm: the caller frees both
 * (engine_destroy, then model_destroy). */
struct engine *engine_create_draft(const char *path, bool use_mmap, const struct engine *t, const struct engine_opts *o,
                                   struct model **dm, char *err);

#endif
