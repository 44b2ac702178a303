/*
 * engine_setup: user options -> engine_params (see engine_setup.h). Only the defaults that depend on the
 * model are resolved here (the context); every other zero is left for engine_create to resolve, so there is
 * one list of engine defaults (engine_params_default / engine_create), not two.
 */
#include "engine/engine_setup.h"

#include "core/err.h"
#include "engine/backend.h"
#include "engine/kvcache.h"


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

struct model *engine_model_load(const char *path, bool use_mmap, const struct engine_opts *o, char *err)
{
    const struct backend_ops *ops = backend_find(o->backend);
    bool r16[DTYPE_COUNT] = {false};
    if (ops && ops->weight_layouts) {
        struct engine_params p;
        engine_params_default(&p);
        p.backend = o->backend;
        p.force_scalar = o->no_simd;
        ops->weight_layouts(&p, r16);
    }
    return model_load_ex(path, use_mmap, r16, err);
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

struct engine *engine_create_draft(const char *path, bool use_mmap, const struct engine *t, const struct engine_opts *o,
                                   struct model **dm, char *err)
{
    char why[ERR_MSG_MAX] = "";
    struct engine *e = NULL;
    *dm = engine_model_load(path, use_mmap, o, why);
    if (!*dm)
        goto fail;
    const struct engine_params *tp = engine_params_get(t);
    struct engine_opts d = *o;
    d.n_ctx = tp->n_ctx;
    d.max_seqs = tp->max_seqs;
    d.max_batch_tokens = tp->max_batch_tokens;
    d.kv_blocks = kv_pool_params(engine_kv((struct engine *)t))->n_blocks; /* engine_kv only reads here */
    d.kv_bytes = 0;
    struct engine_params p;
    if (engine_params_for_model(*dm, &d, &p, why))
        goto fail;
    p.block_size = tp->block_size;
    if ((e = engine_create(*dm, &p, why)))
        return e;
fail:
    err_set(err, ERR_INVALID_ARG, "draft model %s: %s", path, why);
    model_destroy(*dm);
    *dm = NULL;
    return NULL;
}
