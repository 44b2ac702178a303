/*
 * engine_setup: user options -> engine_params (see engine_setup.h). Only the defaults that depend on the
 * model are resolved here (the context); every other zero is left for engine_create to resolve, so there is
 * one list of engine defaults (engine_params_default / engine_create), not two.
 */
#include "engine/engine_setup.h"

#include "core/err.h"

#include <string.h>

void engine_opts_default(struct engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->kv_type = DTYPE_F16;
}

int engine_opts_set_kv_type(struct engine_opts *o, const char *name, char *err)
{
    enum dtype t;
    if (!name || dtype_from_name(name, &t) || (t != DTYPE_F16 && t != DTYPE_F32 && t != DTYPE_Q8_0))
        return err_set(err, ERR_INVALID_ARG, "expected f16, f32 or q8_0, got '%s'", name ? name : "");
    o->kv_type = t;
    return 0;
}

int engine_opts_set_backend(struct engine_opts *o, const char *name, char *err)
{
    int rc = engine_backend_check(name, err);
    if (rc)
        return rc;
    o->backend = name;
    return 0;
}

int engine_params_for_model(const struct model *m, const struct engine_opts *o, struct engine_params *p,
                            char *err)
{
    int rc = engine_backend_check(o->backend, err);
    if (rc)
        return rc;
    if (o->kv_type != DTYPE_F16 && o->kv_type != DTYPE_F32 && o->kv_type != DTYPE_Q8_0)
        return err_set(err, ERR_INVALID_ARG, "KV cache type %s is not one of f16, f32, q8_0", dtype_name(o->kv_type));
    engine_params_default(p);
    p->backend = o->backend;
    p->n_threads = o->n_threads;
    p->n_ctx = o->n_ctx;
    if (p->n_ctx <= 0) {
        p->n_ctx = m->hp.ctx_train;
        if (o->n_ctx_cap > 0 && p->n_ctx > o->n_ctx_cap)
            p->n_ctx = o->n_ctx_cap;
    }
    if (o->max_seqs > 0)
        p->max_seqs = o->max_seqs;
    if (o->max_batch_tokens > 0)
        p->max_batch_tokens = o->max_batch_tokens;
    p->kv_blocks = o->kv_blocks;
    p->kv_bytes = o->kv_bytes;
    p->kv_type = o->kv_type;
    p->force_scalar = o->no_simd;
    return 0;
}
