/*
 * scalar_backend: the "scalar" reference backend, a plain forward pass in the spirit of llama2.c's run.c:
 * one thread, one token at a time through every layer, no panels, no activation slots, no thread split.
 *
 *   x = embedding(token)
 *   for each layer:
 *     xb = rmsnorm(x) * attn_norm
 *     q, k, v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv); rope(q, k)
 *     k, v -> the KV block of the token's sequence at its position
 *     for each query head: att = softmax(q K^T / sqrt(head_dim)) V over positions 0..pos
 *     x += Wo att
 *     xb = rmsnorm(x) * ffn_norm;  x += Wdown (silu(Wgate xb) * Wup xb)
 *   logits = Wout (rmsnorm(x) * output_norm)          only for tokens that ask for them
 *
 * The batch is walked in its order: a sequence's tokens come at consecutive positions, so when a token
 * attends, every earlier position of its sequence (in the cache before, or earlier in this batch) is
 * already stored in every layer. Each token is computed on its own, so the backend is batch-invariant by
 * construction.
 *
 * Numerics are llama.cpp's reference ones, as the CPU backend's (cpu_backend.c) are, so greedy output and
 * perplexities match llama.cpp's goldens:
 *   products    activations converted to the weight type's vec_type (F16/BF16 rounding, Q8_0, Q8_K), then
 *               the portable scalar kernel_ops vec_dot for each weight row;
 *   rope        angles built by repeated float multiplication theta_i = pos * base^(-2i/hd), as ggml;
 *   attention   the scalar attention kernels (attn.h): F16 cache: query rounded to F16, probabilities
 *               rounded to F16 before the V product; Q8_0 cache: query quantized to Q8_0, Q8_0 dot products,
 *               V rows dequantized; F32 cache: no rounding. Softmax exact in two passes (max, then exp and
 *               a double sum);
 *   rmsnorm     sum of squares in double.
 * With force_scalar the CPU backend uses the same kernels in the same per-element order, so the two give
 * bit-identical logits; with SIMD kernels they differ by float reassociation only (tests/unit/test_backend.c
 * states the tolerance).
 */
#include "engine/scalar/scalar_backend.h"

#include "core/err.h"
#include "engine/backend.h"
#include "engine/cpu/attn.h"
#include "engine/cpu/kernels.h"
#include "engine/kv_host.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct scalar_backend {
    struct backend base;
    const struct model *m;
    struct engine_params p;
    struct kv_host kv;
    const struct kernel_ops *ops[DTYPE_COUNT]; /* scalar kernels per weight type used */
    const struct kernel_ops *kv_ops;           /* Q8_0 kernels for a Q8_0 cache, else NULL */
    const struct attn_kernels *attn;           /* the scalar attention kernels */
    float rope_theta_scale;                    /* base^(-2/head_dim) */
    float rope_freq_scale;                     /* 1 / linear scaling factor */
    const float *rope_ff;                      /* llama3 per-dimension divisors [head_dim / 2] or NULL */
    size_t scratch_bytes;

    /* one token's activations */
    float *x;      /* [dim] residual stream */
    float *xb;     /* [dim] normed */
    float *q;      /* [n_heads * head_dim] */
    float *k;      /* [n_kv_heads * head_dim] */
    float *v;      /* [n_kv_heads * head_dim] */
    float *att;    /* [n_heads * head_dim] attention output */
    float *hg;     /* [ffn] gate */
    float *hu;     /* [ffn] up */
    float *tmp;    /* [dim] a product before it is added into x */
    float *rope;   /* [head_dim] cos, sin of each rotation angle */
    float *qr;     /* [head_dim] one head's query as the cache type wants it (F16-rounded or as is) */
    float *scores; /* [n_ctx] one head's scores, then probabilities */
    float *vrow;   /* [head_dim] one dequantized V row (Q8_0 cache) */
    uint8_t *xq;   /* [act_bytes] an activation row in a weight type's vec_type */
    uint8_t *wrow; /* [max_cols * 4] a weight row read out of the R16 layout (model_weight_row) */
    uint8_t *qq;   /* [kv row bytes] one head's query quantized to Q8_0 (Q8_0 cache) */
};

static void scalar_destroy(struct backend *be)
{
    struct scalar_backend *sb = (struct scalar_backend *)be;
    if (!sb)
        return;
    kv_host_deinit(&sb->kv);
    float *fl[] = {sb->x, sb->xb, sb->q, sb->k, sb->v, sb->att, sb->hg, sb->hu, sb->tmp, sb->rope, sb->qr,
                   sb->scores, sb->vrow};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        free(fl[i]);
    free(sb->xq);
    free(sb->wrow);
    free(sb->qq);
    free(sb);
}

/* malloc that counts the bytes for describe. */
static void *scalar_alloc(struct scalar_backend *sb, size_t n)
{
    sb->scratch_bytes += n;
    return malloc(n);
}

/* Records the scalar kernels for w's type; false when there are none. */
static bool scalar_use(struct scalar_backend *sb, const struct model_weight *w, char *err)
{
    if (!(sb->ops[w->type] = kernel_ops_scalar(w->type))) {
        err_set(err, ERR_UNSUPPORTED, "no kernels for weight type %s", dtype_name(w->type));
        return false;
    }
    return true;
}

static struct backend *scalar_create(const struct model *m, const struct engine_params *p, char *err)
{
    const struct model_hparams *hp = &m->hp;
    struct scalar_backend *sb = calloc(1, sizeof *sb);
    if (!sb) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    sb->base.ops = &scalar_backend_ops;
    sb->m = m;
    sb->p = *p;
    sb->p.n_threads = 1;
    if (!scalar_use(sb, &m->tok_embd, err) || !scalar_use(sb, &m->output, err))
        goto fail;
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct model_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++)
            if (!scalar_use(sb, lw[i], err))
                goto fail;
    }
    if (p->kv_type == DTYPE_Q8_0 && !(sb->kv_ops = kernel_ops_scalar(DTYPE_Q8_0))) {
        err_set(err, ERR_UNSUPPORTED, "no kernels for a q8_0 KV cache");
        goto fail;
    }
    sb->attn = attn_kernels_scalar();
    int hd = hp->head_dim;
    sb->rope_theta_scale = powf(hp->rope_base, -2.0f / (float)hd);
    sb->rope_freq_scale = hp->rope_scale_factor > 0 ? 1.0f / hp->rope_scale_factor : 1.0f;
    sb->rope_ff = model_rope_freqs(m);

    size_t q_dim = (size_t)hp->n_heads * hd, kv_dim = (size_t)hp->n_kv_heads * hd, F = sizeof(float);
    size_t max_cols = (size_t)hp->dim;
    if ((size_t)hp->ffn_dim > max_cols)
        max_cols = hp->ffn_dim;
    if (q_dim > max_cols)
        max_cols = q_dim;
    sb->x = scalar_alloc(sb, hp->dim * F);
    sb->xb = scalar_alloc(sb, hp->dim * F);
    sb->q = scalar_alloc(sb, q_dim * F);
    sb->k = scalar_alloc(sb, kv_dim * F);
    sb->v = scalar_alloc(sb, kv_dim * F);
    sb->att = scalar_alloc(sb, q_dim * F);
    sb->hg = scalar_alloc(sb, hp->ffn_dim * F);
    sb->hu = scalar_alloc(sb, hp->ffn_dim * F);
    sb->tmp = scalar_alloc(sb, hp->dim * F);
    sb->rope = scalar_alloc(sb, hd * F);
    sb->qr = scalar_alloc(sb, hd * F);
    sb->scores = scalar_alloc(sb, (size_t)p->n_ctx * F);
    sb->vrow = scalar_alloc(sb, hd * F);
    sb->xq = scalar_alloc(sb, max_cols * 4 + 64); /* F32 is the widest activation format */
    sb->wrow = scalar_alloc(sb, max_cols * 4 + 64); /* and the widest weight format */
    sb->qq = scalar_alloc(sb, dtype_row_bytes(p->kv_type, hd));
    if (!sb->x || !sb->xb || !sb->q || !sb->k || !sb->v || !sb->att || !sb->hg || !sb->hu || !sb->tmp || !sb->rope ||
        !sb->qr || !sb->scores || !sb->vrow || !sb->xq || !sb->wrow || !sb->qq) {
        err_set(err, ERR_NOMEM, "out of memory creating the scalar backend");
        goto fail;
    }
    return &sb->base;
fail:
    scalar_destroy(&sb->base);
    return NULL;
}

/* ---- the operations on one token ---- */

/* y = x / rms(x) * w over dim elements (sum of squares in double). */
static void scalar_rmsnorm(float *y, const float *x, const float *w, int dim, float eps)
{
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++)
        y[i] = x[i] * scale * w[i];
}

/* out[r] = dot(W row r, x) for every row of W: x (w->cols floats) converted once to the weight type's
 * activation format, then one vec_dot per row (each read out of the R16 layout first when a cpu backend
 * left the model so). */
static void scalar_matmul(struct scalar_backend *sb, float *out, const float *x, const struct model_weight *w)
{
    const struct kernel_ops *ops = sb->ops[w->type];
    ops->from_f32(x, sb->xq, w->cols);
    for (int64_t r = 0; r < w->rows; r++)
        ops->vec_dot(w->cols, &out[r], model_weight_row(w, r, sb->wrow), sb->xq);
}

/* cs[2i], cs[2i+1] = cos, sin of rotation angle i at position pos (theta_i built by repeated
 * multiplication, as ggml does, so the rounding is llama.cpp's). */
static void scalar_rope_angles(const struct scalar_backend *sb, int pos, float *cs)
{
    int half = sb->m->hp.head_dim / 2;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        float th = sb->rope_freq_scale * (sb->rope_ff ? theta / sb->rope_ff[i] : theta);
        cs[2 * i] = cosf(th);
        cs[2 * i + 1] = sinf(th);
        theta *= sb->rope_theta_scale;
    }
}

/* Rotates the pairs of one head vector: adjacent elements (2i, 2i+1) for llama, halves (i, i + hd/2) for
 * the NeoX layout (qwen2). */
static void scalar_rope(const struct scalar_backend *sb, float *x, const float *cs)
{
    int half = sb->m->hp.head_dim / 2;
    bool adjacent = sb->m->hp.rope_layout == ROPE_ADJACENT;
    for (int i = 0; i < half; i++) {
        int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
        float c = cs[2 * i], s = cs[2 * i + 1];
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/* The cached K (or V) row of KV head kvh at position pos of sequence s, in layer `layer`. */
static void *scalar_kv_row(const struct scalar_backend *sb, bool value, int layer, const struct kv_seq *s, int pos,
                           int kvh)
{
    int bs = sb->p.block_size;
    int32_t blk = s->blocks[pos / bs];
    void *base = value ? kv_host_v(&sb->kv, layer, blk) : kv_host_k(&sb->kv, layer, blk);
    return kv_host_row(&sb->kv, base, kvh, pos % bs);
}

/* Stores one KV head's row x (head_dim floats) in the cache's type. */
static void scalar_kv_store(const struct scalar_backend *sb, void *row, const float *x)
{
    int hd = sb->m->hp.head_dim;
    if (sb->p.kv_type == DTYPE_F32)
        memcpy(row, x, (size_t)hd * sizeof(float));
    else if (sb->p.kv_type == DTYPE_Q8_0)
        sb->kv_ops->from_f32(x, row, hd);
    else
        sb->attn->to_f16(x, row, hd);
}

/* out[head_dim] = softmax(q K^T * scale) V for one query head over positions 0..pos of sequence s, its KV
 * head's rows read from the cache. */
static void scalar_attend(struct scalar_backend *sb, int layer, const struct kv_seq *s, int pos, int kvh,
                          const float *q, float *out)
{
    const struct attn_kernels *ak = sb->attn;
    int hd = sb->m->hp.head_dim, n_pos = pos + 1;
    enum dtype kt = sb->p.kv_type;
    float scale = 1.0f / sqrtf((float)hd), *sc = sb->scores;
    /* the query as the cache's products want it */
    if (kt == DTYPE_F16)
        ak->round_f16(q, sb->qr, hd);
    else if (kt == DTYPE_F32)
        memcpy(sb->qr, q, (size_t)hd * sizeof(float));
    else
        sb->kv_ops->from_f32(q, sb->qq, hd);
    for (int p = 0; p < n_pos; p++) {
        const void *krow = scalar_kv_row(sb, false, layer, s, p, kvh);
        if (kt == DTYPE_F16) {
            ak->scores_f16(hd, 1, sb->qr, krow, 1, scale, &sc[p], 1);
        } else if (kt == DTYPE_F32) {
            ak->scores_f32(hd, 1, sb->qr, krow, 1, scale, &sc[p], 1);
        } else {
            sb->kv_ops->vec_dot(hd, &sc[p], krow, sb->qq);
            sc[p] *= scale;
        }
    }
    ak->softmax(sc, n_pos);
    if (kt == DTYPE_F16)
        ak->round_f16(sc, sc, n_pos);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int p = 0; p < n_pos; p++) {
        const void *vrow = scalar_kv_row(sb, true, layer, s, p, kvh);
        if (kt == DTYPE_F16) {
            ak->accum_f16(hd, 1, &sc[p], 1, vrow, 1, out);
        } else if (kt == DTYPE_F32) {
            ak->accum_f32(hd, 1, &sc[p], 1, vrow, 1, out);
        } else {
            sb->kv_ops->to_f32(vrow, sb->vrow, hd);
            ak->accum_f32(hd, 1, &sc[p], 1, sb->vrow, 1, out);
        }
    }
}

/* Runs token bt through every layer, storing its K and V; writes its logits to `logits` when not NULL. */
static void scalar_token(struct scalar_backend *sb, const struct batch_token *bt, const struct kv_seq *s,
                         float *logits)
{
    const struct model *m = sb->m;
    const struct model_hparams *hp = &m->hp;
    int dim = hp->dim, hd = hp->head_dim, group = hp->n_heads / hp->n_kv_heads;
    int q_dim = hp->n_heads * hd, kv_dim = hp->n_kv_heads * hd;
    float *x = sb->x;

    sb->ops[m->tok_embd.type]->to_f32((const uint8_t *)m->tok_embd.data + (size_t)bt->token * m->tok_embd.row_bytes, x,
                                      dim);
    scalar_rope_angles(sb, bt->pos, sb->rope);
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        /* attention */
        scalar_rmsnorm(sb->xb, x, L->attn_norm, dim, hp->norm_eps);
        scalar_matmul(sb, sb->q, sb->xb, &L->wq);
        scalar_matmul(sb, sb->k, sb->xb, &L->wk);
        scalar_matmul(sb, sb->v, sb->xb, &L->wv);
        if (L->bq) {
            for (int i = 0; i < q_dim; i++)
                sb->q[i] += L->bq[i];
            for (int i = 0; i < kv_dim; i++)
                sb->k[i] += L->bk[i], sb->v[i] += L->bv[i];
        }
        for (int h = 0; h < hp->n_heads; h++)
            scalar_rope(sb, sb->q + (size_t)h * hd, sb->rope);
        for (int h = 0; h < hp->n_kv_heads; h++) {
            scalar_rope(sb, sb->k + (size_t)h * hd, sb->rope);
            scalar_kv_store(sb, scalar_kv_row(sb, false, l, s, bt->pos, h), sb->k + (size_t)h * hd);
            scalar_kv_store(sb, scalar_kv_row(sb, true, l, s, bt->pos, h), sb->v + (size_t)h * hd);
        }
        for (int h = 0; h < hp->n_heads; h++)
            scalar_attend(sb, l, s, bt->pos, h / group, sb->q + (size_t)h * hd, sb->att + (size_t)h * hd);
        scalar_matmul(sb, sb->tmp, sb->att, &L->wo);
        for (int i = 0; i < dim; i++)
            x[i] = x[i] + sb->tmp[i];
        /* feed-forward (SwiGLU) */
        scalar_rmsnorm(sb->xb, x, L->ffn_norm, dim, hp->norm_eps);
        scalar_matmul(sb, sb->hg, sb->xb, &L->w_gate);
        scalar_matmul(sb, sb->hu, sb->xb, &L->w_up);
        for (int i = 0; i < hp->ffn_dim; i++) /* kernel_swiglu's scalar loop (the reference stays scalar) */
            sb->hg[i] = sb->hg[i] / (1.0f + kernel_expf(-sb->hg[i])) * sb->hu[i];
        scalar_matmul(sb, sb->tmp, sb->hg, &L->w_down);
        for (int i = 0; i < dim; i++)
            x[i] = x[i] + sb->tmp[i];
    }
    if (logits) {
        scalar_rmsnorm(sb->xb, x, m->output_norm, dim, hp->norm_eps);
        scalar_matmul(sb, logits, sb->xb, &m->output);
    }
}

static int scalar_forward(struct backend *be, const struct backend_pass *pass, char *err)
{
    struct scalar_backend *sb = (struct scalar_backend *)be;
    const struct batch *b = pass->b;
    size_t n_vocab = (size_t)sb->m->hp.n_vocab;
    int k = 0; /* logits written so far */
    for (int t = 0; t < b->n; t++) {
        const struct batch_token *bt = &b->tok[t];
        float *out = bt->logits ? pass->logits + (size_t)k++ * n_vocab : NULL;
        scalar_token(sb, bt, &pass->seqs[bt->seq], out);
    }
    return 0;
}

static int scalar_kv_alloc(struct backend *be, const struct kv_pool_params *layout, char *err)
{
    return kv_host_init(&((struct scalar_backend *)be)->kv, layout, err);
}

static void scalar_kv_copy(struct backend *be, int32_t dst, int32_t src)
{
    kv_host_copy(&((struct scalar_backend *)be)->kv, dst, src);
}

static void scalar_describe(const struct backend *be, struct backend_desc *d)
{
    const struct scalar_backend *sb = (const struct scalar_backend *)be;
    memset(d, 0, sizeof *d);
    d->name = scalar_backend_ops.name;
    d->n_threads = 1;
    d->weight_bytes = sb->m->weight_bytes;
    d->kv_bytes = sb->kv.map_bytes;
    d->scratch_bytes = sb->scratch_bytes;
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (sb->ops[t])
            d->isa[t] = "scalar";
}

const struct backend_ops scalar_backend_ops = {
    .name = "scalar",
    .create = scalar_create,
    .destroy = scalar_destroy,
    .kv_alloc = scalar_kv_alloc,
    .kv_copy = scalar_kv_copy,
    .forward = scalar_forward,
    .describe = scalar_describe,
};
