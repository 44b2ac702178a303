/*
 * engine: the backend-agnostic half of the forward pass: parameters, the KV pool's bookkeeping and the
 * sequences' block tables, validation of a batch, all-or-nothing reservation of its KV blocks, and then one
 * call of the backend's forward (backend.h). Everything that touches the weights, the KV data or the
 * kernels is the backend's.
 *
 * Everything a pass needs is allocated at create (the validation arrays, the block tables at their
 * largest: n_ctx positions each), so engine_forward never allocates.
 */
#include "engine/engine.h"

#include "core/err.h"
#include "engine/backend.h"

#include <stdlib.h>
#include <string.h>

struct engine {
    const struct model *m;
    struct engine_params p;
    struct backend *be;
    struct kv_pool *kv;
    struct kv_seq *seqs;  /* [max_seqs] */
    int *next;            /* [max_seqs] validation: next expected position, -1 when not in the batch */
    int32_t *logit_rows;  /* [max_batch_tokens] batch index of each token whose logits are wanted */
};

void engine_params_default(struct engine_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_threads = 0;
    p->n_ctx = 0;
    p->max_batch_tokens = 512;
    p->max_seqs = 1;
    p->block_size = 16;
    p->kv_type = DTYPE_F16;
}

int engine_backend_check(const char *name, char *err)
{
    if (backend_find(name))
        return 0;
    char names[128];
    return err_set(err, ERR_INVALID_ARG, "unknown backend '%s' (available: %s)", name, backend_names(names, sizeof names));
}

/* The pool's copy on write, handed to the backend that stores the blocks. */
static void engine_kv_copy(void *ctx, int32_t dst, int32_t src)
{
    struct engine *e = ctx;
    e->be->ops->kv_copy(e->be, dst, src);
}

struct engine *engine_create(const struct model *m, const struct engine_params *params, char *err)
{
    const struct model_hparams *hp = &m->hp;
    const struct backend_ops *ops = backend_find(params->backend);
    if (!ops) {
        engine_backend_check(params->backend, err);
        return NULL;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    e->m = m;
    e->p = *params;
    struct engine_params *p = &e->p;
    p->backend = ops->name;
    if (p->n_ctx <= 0)
        p->n_ctx = hp->ctx_train;
    if (p->max_batch_tokens <= 0)
        p->max_batch_tokens = 512;
    if (p->max_seqs <= 0)
        p->max_seqs = 1;
    if (p->block_size <= 0)
        p->block_size = 16;
    if (p->kv_type != DTYPE_F32 && p->kv_type != DTYPE_Q8_0)
        p->kv_type = DTYPE_F16;

    struct kv_pool_params kp = {
        .n_layers = hp->n_layers,
        .n_kv_heads = hp->n_kv_heads,
        .head_dim = hp->head_dim,
        .block_size = p->block_size,
        .type = p->kv_type,
    };
    int64_t blocks_per_seq = (p->n_ctx + p->block_size - 1) / p->block_size;
    if (p->kv_blocks > 0)
        kp.n_blocks = p->kv_blocks;
    else if (p->kv_bytes > 0)
        kp.n_blocks = (int64_t)(p->kv_bytes / kv_pool_block_bytes(&kp));
    else
        kp.n_blocks = blocks_per_seq * p->max_seqs;
    if (kp.n_blocks < 1) {
        err_set(err, ERR_INVALID_ARG, "KV budget of %zu bytes holds no block (one block of %d positions takes %zu bytes)",
                p->kv_bytes, p->block_size, kv_pool_block_bytes(&kp));
        goto fail;
    }
    p->kv_blocks = kp.n_blocks;
    e->kv = kv_pool_create(&kp, engine_kv_copy, e, err);
    if (!e->kv)
        goto fail;
    e->seqs = calloc((size_t)p->max_seqs, sizeof *e->seqs);
    e->next = malloc((size_t)p->max_seqs * sizeof *e->next);
    e->logit_rows = malloc((size_t)p->max_batch_tokens * sizeof *e->logit_rows);
    if (!e->seqs || !e->next || !e->logit_rows)
        goto oom;
    for (int s = 0; s < p->max_seqs; s++)
        if (kv_seq_init_cap(&e->seqs[s], (int)blocks_per_seq))
            goto oom;

    e->be = ops->create(m, p, err);
    if (!e->be)
        goto fail;
    if (ops->kv_alloc(e->be, &kp, err))
        goto fail;
    struct backend_desc d;
    ops->describe(e->be, &d);
    p->n_threads = d.n_threads;
    return e;
oom:
    err_set(err, ERR_NOMEM, "out of memory creating the engine (%d sequences of %d positions)", p->max_seqs, p->n_ctx);
fail:
    engine_destroy(e);
    return NULL;
}

void engine_destroy(struct engine *e)
{
    if (!e)
        return;
    if (e->be)
        e->be->ops->destroy(e->be);
    if (e->seqs)
        for (int i = 0; i < e->p.max_seqs; i++)
            kv_seq_deinit(e->kv, &e->seqs[i]);
    free(e->seqs);
    kv_pool_destroy(e->kv);
    free(e->next);
    free(e->logit_rows);
    free(e);
}

const struct model *engine_model(const struct engine *e) { return e->m; }
const struct engine_params *engine_params_get(const struct engine *e) { return &e->p; }
struct kv_pool *engine_kv(struct engine *e) { return e->kv; }
struct kv_seq *engine_seq(struct engine *e, int seq) { return &e->seqs[seq]; }
int engine_seq_len(const struct engine *e, int seq) { return e->seqs[seq].n_pos; }
void engine_seq_truncate(struct engine *e, int seq, int n_pos) { kv_seq_truncate(e->kv, &e->seqs[seq], n_pos); }

void engine_describe(const struct engine *e, struct backend_desc *d) { e->be->ops->describe(e->be, d); }

int engine_forward(struct engine *e, const struct batch *b, float *logits, char *err)
{
    const struct model_hparams *hp = &e->m->hp;
    if (b->n <= 0)
        return 0;
    if (b->n > e->p.max_batch_tokens)
        return err_set(err, ERR_INVALID_ARG, "batch of %d tokens exceeds max_batch_tokens %d", b->n, e->p.max_batch_tokens);
    /* next expected position per sequence: starts at the sequence's length */
    int *next = e->next;
    for (int s = 0; s < e->p.max_seqs; s++)
        next[s] = -1;
    int n_logits = 0;
    for (int i = 0; i < b->n; i++) {
        const struct batch_token *t = &b->tok[i];
        if (t->seq < 0 || t->seq >= e->p.max_seqs)
            return err_set(err, ERR_INVALID_ARG, "batch token %d: sequence id %d out of range [0, %d)", i, t->seq,
                           e->p.max_seqs);
        if (t->token < 0 || t->token >= hp->n_vocab)
            return err_set(err, ERR_INVALID_ARG, "batch token %d: token id %d out of range [0, %d)", i, t->token,
                           hp->n_vocab);
        if (next[t->seq] < 0)
            next[t->seq] = e->seqs[t->seq].n_pos;
        if (t->pos != next[t->seq])
            return err_set(err, ERR_INVALID_ARG, "batch token %d: position %d, but sequence %d continues at %d", i, t->pos,
                           t->seq, next[t->seq]);
        if (t->pos >= e->p.n_ctx)
            return err_set(err, ERR_CONTEXT_LENGTH, "batch token %d: position %d is past the context size %d", i, t->pos,
                           e->p.n_ctx);
        next[t->seq]++;
        if (t->logits)
            e->logit_rows[n_logits++] = i;
    }
    if (n_logits > 0 && !logits)
        return err_set(err, ERR_INVALID_ARG, "logits requested but no output buffer given");
    /* reserve KV for every sequence, all or nothing */
    int64_t need = 0;
    int n_seqs = 0;
    for (int s = 0; s < e->p.max_seqs; s++)
        if (next[s] >= 0) {
            need += kv_seq_blocks_needed(e->kv, &e->seqs[s], next[s]);
            n_seqs++;
        }
    if (need > kv_pool_free_blocks(e->kv))
        return err_set(err, ERR_NO_SPACE, "KV cache full: batch needs %lld blocks, %lld free", (long long)need,
                       (long long)kv_pool_free_blocks(e->kv));
    int rc;
    for (int s = 0; s < e->p.max_seqs; s++)
        if (next[s] >= 0 && (rc = kv_seq_reserve(e->kv, &e->seqs[s], next[s])) != 0)
            return err_set(err, rc, "cannot reserve KV blocks");
    struct backend_pass pass = {
        .b = b, .seqs = e->seqs, .logit_rows = e->logit_rows, .n_logits = n_logits, .n_seqs = n_seqs, .logits = logits,
    };
    if ((rc = e->be->ops->forward(e->be, &pass, err)) != 0)
        return rc;
    for (int s = 0; s < e->p.max_seqs; s++)
        if (next[s] >= 0)
            e->seqs[s].n_pos = next[s];
    return 0;
}
