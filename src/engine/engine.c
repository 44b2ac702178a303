/*
 * engine: the llama forward pass over a ragged batch and a paged KV cache, run as ONE thread-pool job with
 * barriers between dependent ops (no fork/join per op).
 *
 * Per layer, for the T tokens of the batch (x: [T][dim] residual stream, f32):
 *   xn = rmsnorm(x) * attn_norm                         rows split over threads
 *   q, k, v = xn Wq^T (+bq), xn Wk^T (+bk), xn Wv^T (+bv)  weight rows split over threads
 *   rope(q, k); k, v -> KV blocks of each token's sequence at its position
 *   a = softmax(q K^T / sqrt(hd)) V per (token, head), online softmax over the sequence's blocks
 *   x += a Wo^T
 *   xn = rmsnorm(x) * ffn_norm;  h = silu(xn Wg^T) * (xn Wu^T);  x += h Wd^T
 * then logits = rmsnorm(x[rows asked]) * output_norm Wout^T.
 *
 * Matrix products convert their input rows once to the weight type's activation format (kernel_ops
 * vec_type) and then compute every output element with one vec_dot (or the bit-identical gemm tile) over the
 * full row: the reduction order of an element depends only on that row, never on T or on the thread split,
 * so a sequence's logits are bit-identical alone or in any batch.
 */
#include "engine/engine.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/kernels.h"
#include "engine/threadpool.h"
#include "engine/tokenizer.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Activation conversion slots: a layer's matrices use at most two activation formats (e.g. Q4_K_M mixes
 * Q4_K and Q6_K, both Q8_K; Q4_0 files keep output in Q6_K), so two slots avoid converting twice. */
#define ENGINE_ACT_SLOTS 2

struct engine_act {
    enum dtype vec_type; /* format held, or DTYPE_COUNT when empty */
    const float *src;    /* which float buffer it was converted from */
    size_t row_bytes;    /* bytes per converted row */
    uint8_t *buf;        /* [T][row_bytes] */
};

struct engine {
    const struct model *m;
    struct engine_params p;
    struct threadpool *tp;
    struct kv_pool *kv;
    struct kv_seq *seqs; /* [max_seqs] */
    float rope_theta_scale; /* base^(-2/head_dim) */
    float rope_freq_scale;  /* 1 / linear scaling factor */
    const float *rope_ff;   /* llama3 per-dimension divisors [head_dim / 2] or NULL */
    float *scratch;         /* per thread: [n_threads][n_ctx + 2 * head_dim] attention scores, rope cache, q */

    /* scratch, sized for max_batch_tokens (T) */
    float *x;    /* [T][dim] residual */
    float *xn;   /* [T][dim] normed */
    float *q;    /* [T][n_heads * head_dim] */
    float *k;    /* [T][kv_dim] */
    float *v;    /* [T][kv_dim] */
    float *att;  /* [T][n_heads * head_dim] */
    float *hg;   /* [T][ffn] */
    float *hu;   /* [T][ffn] */
    int32_t *logit_rows; /* [T] batch index of each row whose logits are wanted */
    struct engine_act act[ENGINE_ACT_SLOTS];
    size_t act_row_cap; /* bytes per row each slot can hold */

    /* the job being run */
    const struct batch *b;
    float *logits;
    int n_logits;
};

static float engine_f16_table[65536];
static pthread_once_t engine_f16_once = PTHREAD_ONCE_INIT;

static void engine_f16_table_init(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        engine_f16_table[i] = fp16_to_f32((uint16_t)i);
}

static inline float engine_f16(uint16_t h) { return engine_f16_table[h]; }

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

static const struct kernel_ops *engine_ops(const struct engine *e, enum dtype t)
{
    return e->p.force_scalar ? kernel_ops_scalar(t) : kernel_ops_get(t);
}

struct engine *engine_create(const struct model *m, const struct engine_params *params, char *err)
{
    const struct model_hparams *hp = &m->hp;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    pthread_once(&engine_f16_once, engine_f16_table_init);
    e->m = m;
    e->p = *params;
    struct engine_params *p = &e->p;
    if (p->n_ctx <= 0)
        p->n_ctx = hp->ctx_train;
    if (p->max_batch_tokens <= 0)
        p->max_batch_tokens = 512;
    if (p->max_seqs <= 0)
        p->max_seqs = 1;
    if (p->block_size <= 0)
        p->block_size = 16;
    if (p->kv_type != DTYPE_F32)
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
    e->kv = kv_pool_create(&kp, err);
    if (!e->kv)
        goto fail;
    e->seqs = calloc((size_t)p->max_seqs, sizeof *e->seqs);
    e->tp = threadpool_create(p->n_threads);
    if (!e->seqs || !e->tp)
        goto oom;
    p->n_threads = threadpool_size(e->tp);

    int hd = hp->head_dim;
    if (hd > 1024) {
        err_set(err, ERR_UNSUPPORTED, "head dimension %d is larger than the supported 1024", hd);
        goto fail;
    }
    e->rope_theta_scale = powf(hp->rope_base, -2.0f / (float)hd);
    e->rope_freq_scale = hp->rope_scale_factor > 0 ? 1.0f / hp->rope_scale_factor : 1.0f;
    e->rope_ff = model_rope_freqs(m);
    e->scratch = malloc((size_t)p->n_threads * ((size_t)p->n_ctx + 2 * (size_t)hd) * sizeof(float));
    if (!e->scratch)
        goto oom;

    size_t T = (size_t)p->max_batch_tokens;
    size_t q_dim = (size_t)hp->n_heads * hd, kv_dim = (size_t)hp->n_kv_heads * hd;
    e->x = malloc(T * hp->dim * sizeof(float));
    e->xn = malloc(T * hp->dim * sizeof(float));
    e->q = malloc(T * q_dim * sizeof(float));
    e->k = malloc(T * kv_dim * sizeof(float));
    e->v = malloc(T * kv_dim * sizeof(float));
    e->att = malloc(T * q_dim * sizeof(float));
    e->hg = malloc(T * hp->ffn_dim * sizeof(float));
    e->hu = malloc(T * hp->ffn_dim * sizeof(float));
    e->logit_rows = malloc(T * sizeof(int32_t));
    if (!e->x || !e->xn || !e->q || !e->k || !e->v || !e->att || !e->hg || !e->hu || !e->logit_rows)
        goto oom;
    size_t max_cols = (size_t)hp->dim;
    if ((size_t)hp->ffn_dim > max_cols)
        max_cols = hp->ffn_dim;
    if (q_dim > max_cols)
        max_cols = q_dim;
    e->act_row_cap = max_cols * 4 + 64; /* F32 is the widest activation format */
    for (int i = 0; i < ENGINE_ACT_SLOTS; i++) {
        e->act[i].vec_type = DTYPE_COUNT;
        e->act[i].buf = malloc(T * e->act_row_cap);
        if (!e->act[i].buf)
            goto oom;
    }
    /* every weight type used must have kernels */
    const struct model_weight *ws[] = {&m->output, &m->tok_embd};
    for (size_t i = 0; i < 2; i++)
        if (!engine_ops(e, ws[i]->type)) {
            err_set(err, ERR_UNSUPPORTED, "no kernels for weight type %s", dtype_name(ws[i]->type));
            goto fail;
        }
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct model_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++)
            if (!engine_ops(e, lw[i]->type)) {
                err_set(err, ERR_UNSUPPORTED, "no kernels for weight type %s", dtype_name(lw[i]->type));
                goto fail;
            }
    }
    return e;
oom:
    err_set(err, ERR_NOMEM, "out of memory creating the engine (batch of %d tokens)", p->max_batch_tokens);
fail:
    engine_destroy(e);
    return NULL;
}

void engine_destroy(struct engine *e)
{
    if (!e)
        return;
    threadpool_destroy(e->tp);
    if (e->seqs)
        for (int i = 0; i < e->p.max_seqs; i++)
            kv_seq_deinit(e->kv, &e->seqs[i]);
    free(e->seqs);
    kv_pool_destroy(e->kv);
    free(e->scratch);
    free(e->x);
    free(e->xn);
    free(e->q);
    free(e->k);
    free(e->v);
    free(e->att);
    free(e->hg);
    free(e->hu);
    free(e->logit_rows);
    for (int i = 0; i < ENGINE_ACT_SLOTS; i++)
        free(e->act[i].buf);
    free(e);
}

const struct model *engine_model(const struct engine *e) { return e->m; }
const struct engine_params *engine_params_get(const struct engine *e) { return &e->p; }
struct kv_pool *engine_kv(struct engine *e) { return e->kv; }
struct kv_seq *engine_seq(struct engine *e, int seq) { return &e->seqs[seq]; }
int engine_seq_len(const struct engine *e, int seq) { return e->seqs[seq].n_pos; }
void engine_seq_truncate(struct engine *e, int seq, int n_pos) { kv_seq_truncate(e->kv, &e->seqs[seq], n_pos); }

/* ---- ops, each called by every thread (ith of nth) inside the job ---- */

/* y[r] = x[r] / rms(x[r]) * w for rows r in [0, n_rows); rows indexed through idx when not NULL. */
static void op_rmsnorm(const float *x, float *y, const float *w, int n_rows, const int32_t *idx, int dim, float eps,
                       int ith, int nth)
{
    int64_t r0, r1;
    threadpool_split(n_rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + (size_t)(idx ? idx[r] : r) * dim;
        float *yr = y + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float scale = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++)
            yr[i] = xr[i] * scale * w[i];
    }
}

/* Converts x [n_rows][cols] to the activation format of w's kernels, unless a slot already holds it. Every
 * thread gets the same slot back. Ends with a barrier when it converted. */
static struct engine_act *op_act_prepare(struct engine *e, const float *x, int n_rows, int cols,
                                         const struct kernel_ops *ops, int ith, int nth)
{
    for (int i = 0; i < ENGINE_ACT_SLOTS; i++)
        if (e->act[i].vec_type == ops->vec_type && e->act[i].src == x)
            return &e->act[i];
    /* choose the slot not holding the other live conversion of x; otherwise slot 0 */
    int s = 0;
    if (e->act[0].src == x && e->act[0].vec_type != DTYPE_COUNT)
        s = 1;
    struct engine_act *a = &e->act[s];
    size_t rb = dtype_row_bytes(ops->vec_type, cols);
    int64_t r0, r1;
    threadpool_split(n_rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        ops->from_f32(x + (size_t)r * cols, a->buf + (size_t)r * rb, cols);
    threadpool_barrier(e->tp);
    /* every thread has read the old slot state above; now thread 0 updates it while others wait */
    if (ith == 0) {
        a->vec_type = ops->vec_type;
        a->src = x;
        a->row_bytes = rb;
    }
    threadpool_barrier(e->tp);
    return a;
}

/* Forgets conversions of x (its contents are about to change). Called by all threads between barriers; only
 * thread 0 writes. */
static void op_act_invalidate(struct engine *e, int ith)
{
    if (ith != 0)
        return;
    for (int i = 0; i < ENGINE_ACT_SLOTS; i++) {
        e->act[i].vec_type = DTYPE_COUNT;
        e->act[i].src = NULL;
    }
}

/* out[t][r] (=|+=) dot(W[r], act[t]) for r in this thread's share of W's rows, t < n_rows; out rows are
 * ldo floats apart. Each weight row is used for every token while it is hot in cache. */
static void op_matmul(struct engine *e, const struct model_weight *w, const struct engine_act *a, int n_rows,
                      float *out, int ldo, bool accumulate, int ith, int nth)
{
    const struct kernel_ops *ops = engine_ops(e, w->type);
    int64_t r0, r1;
    threadpool_split(w->rows, ith, nth, &r0, &r1);
    const uint8_t *wb = w->data;
    for (int64_t r = r0; r < r1; r++) {
        const void *wr = wb + (size_t)r * w->row_bytes;
        for (int t = 0; t < n_rows; t++) {
            float s;
            ops->vec_dot(w->cols, &s, wr, a->buf + (size_t)t * a->row_bytes);
            float *o = &out[(size_t)t * ldo + r];
            *o = accumulate ? *o + s : s;
        }
    }
}

/* cos/sin of each rotation angle for position pos: cs[2i] = cos, cs[2i+1] = sin, i < head_dim / 2. The
 * angle is built by repeated float multiplication (theta_i = pos * scale^i), exactly as ggml does, so the
 * rounding matches llama.cpp's. */
static void op_rope_cache(const struct engine *e, int pos, float *cs)
{
    int half = e->m->hp.head_dim / 2;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        float th = e->rope_freq_scale * (e->rope_ff ? theta / e->rope_ff[i] : theta);
        cs[2 * i] = cosf(th);
        cs[2 * i + 1] = sinf(th);
        theta *= e->rope_theta_scale;
    }
}

/* Rotates the pairs of one head vector x[head_dim] by the angles in cs. */
static void op_rope_head(const struct engine *e, float *x, const float *cs)
{
    const struct model_hparams *hp = &e->m->hp;
    int half = hp->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int i0 = hp->rope_layout == ROPE_ADJACENT ? 2 * i : i;
        int i1 = hp->rope_layout == ROPE_ADJACENT ? 2 * i + 1 : i + half;
        float a = x[i0], b = x[i1];
        x[i0] = a * c - b * s;
        x[i1] = a * s + b * c;
    }
}

/* Thread ith's scratch: [n_ctx] scores, then [2 * head_dim] for the rope cache or the rounded query. */
static float *engine_scratch(const struct engine *e, int ith)
{
    return e->scratch + (size_t)ith * ((size_t)e->p.n_ctx + 2 * (size_t)e->m->hp.head_dim);
}

static inline size_t engine_kv_offset(const struct engine *e, int kvh, int slot)
{
    return ((size_t)kvh * e->p.block_size + (size_t)slot) * e->m->hp.head_dim;
}

/* Biases, RoPE on q and k, and the k, v rows stored into each token's KV slot; tokens split over threads. */
static void op_rope_store(struct engine *e, const struct model_layer *L, int layer, int ith, int nth)
{
    const struct model_hparams *hp = &e->m->hp;
    const struct batch *b = e->b;
    int hd = hp->head_dim, q_dim = hp->n_heads * hd, kv_dim = hp->n_kv_heads * hd;
    int64_t t0, t1;
    threadpool_split(b->n, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const struct batch_token *bt = &b->tok[t];
        float *q = e->q + (size_t)t * q_dim, *k = e->k + (size_t)t * kv_dim, *v = e->v + (size_t)t * kv_dim;
        if (L->bq) {
            for (int i = 0; i < q_dim; i++)
                q[i] += L->bq[i];
            for (int i = 0; i < kv_dim; i++)
                k[i] += L->bk[i], v[i] += L->bv[i];
        }
        float *cs = engine_scratch(e, ith) + e->p.n_ctx;
        op_rope_cache(e, bt->pos, cs);
        for (int h = 0; h < hp->n_heads; h++)
            op_rope_head(e, q + (size_t)h * hd, cs);
        for (int h = 0; h < hp->n_kv_heads; h++)
            op_rope_head(e, k + (size_t)h * hd, cs);
        const struct kv_seq *s = &e->seqs[bt->seq];
        int32_t blk = s->blocks[bt->pos / e->p.block_size];
        int slot = bt->pos % e->p.block_size;
        void *kb = kv_block_k(e->kv, layer, blk), *vb = kv_block_v(e->kv, layer, blk);
        for (int h = 0; h < hp->n_kv_heads; h++) {
            size_t off = engine_kv_offset(e, h, slot);
            if (e->p.kv_type == DTYPE_F32) {
                memcpy((float *)kb + off, k + (size_t)h * hd, (size_t)hd * sizeof(float));
                memcpy((float *)vb + off, v + (size_t)h * hd, (size_t)hd * sizeof(float));
            } else {
                for (int i = 0; i < hd; i++) {
                    ((uint16_t *)kb)[off + i] = f32_to_fp16(k[(size_t)h * hd + i]);
                    ((uint16_t *)vb)[off + i] = f32_to_fp16(v[(size_t)h * hd + i]);
                }
            }
        }
    }
}

/* Causal attention for every (token, head) pair, split over threads, over positions 0..pos of the token's
 * sequence read block by block in position order. With an F16 cache the rounding follows llama.cpp's
 * (non-flash) attention: the query is rounded to F16 for the K products, softmax is exact (max, then
 * sum in double), and the normalized probabilities are rounded to F16 for the V products. The order of every
 * sum depends only on the token's own position, so batching never changes the result. */
static void op_attention(struct engine *e, int layer, int ith, int nth)
{
    const struct model_hparams *hp = &e->m->hp;
    const struct batch *b = e->b;
    int hd = hp->head_dim, q_dim = hp->n_heads * hd, group = hp->n_heads / hp->n_kv_heads, bs = e->p.block_size;
    float scale = 1.0f / sqrtf((float)hd);
    bool f32 = e->p.kv_type == DTYPE_F32;
    float *sc = engine_scratch(e, ith), *qr = sc + e->p.n_ctx;
    int64_t p0, p1;
    threadpool_split((int64_t)b->n * hp->n_heads, ith, nth, &p0, &p1);
    for (int64_t pi = p0; pi < p1; pi++) {
        int t = (int)(pi / hp->n_heads), h = (int)(pi % hp->n_heads), kvh = h / group;
        const struct batch_token *bt = &b->tok[t];
        const struct kv_seq *s = &e->seqs[bt->seq];
        const float *q = e->q + (size_t)t * q_dim + (size_t)h * hd;
        for (int i = 0; i < hd; i++)
            qr[i] = f32 ? q[i] : engine_f16(f32_to_fp16(q[i]));
        float mx = -INFINITY;
        for (int pos = 0; pos <= bt->pos; pos++) {
            const void *kb = kv_block_k(e->kv, layer, s->blocks[pos / bs]);
            size_t off = engine_kv_offset(e, kvh, pos % bs);
            float dot = 0;
            if (f32) {
                const float *kr = (const float *)kb + off;
                for (int i = 0; i < hd; i++)
                    dot += qr[i] * kr[i];
            } else {
                const uint16_t *kr = (const uint16_t *)kb + off;
                for (int i = 0; i < hd; i++)
                    dot += qr[i] * engine_f16(kr[i]);
            }
            sc[pos] = dot * scale;
            if (sc[pos] > mx)
                mx = sc[pos];
        }
        double sum = 0;
        for (int pos = 0; pos <= bt->pos; pos++) {
            sc[pos] = expf(sc[pos] - mx);
            sum += sc[pos];
        }
        float inv = (float)(1.0 / sum);
        float *o = e->att + (size_t)t * q_dim + (size_t)h * hd;
        for (int i = 0; i < hd; i++)
            o[i] = 0;
        for (int pos = 0; pos <= bt->pos; pos++) {
            const void *vb = kv_block_v(e->kv, layer, s->blocks[pos / bs]);
            size_t off = engine_kv_offset(e, kvh, pos % bs);
            float w = sc[pos] * inv;
            if (f32) {
                const float *vr = (const float *)vb + off;
                for (int i = 0; i < hd; i++)
                    o[i] += w * vr[i];
            } else {
                const uint16_t *vr = (const uint16_t *)vb + off;
                w = engine_f16(f32_to_fp16(w));
                for (int i = 0; i < hd; i++)
                    o[i] += w * engine_f16(vr[i]);
            }
        }
    }
}

static void op_swiglu(float *g, const float *u, int n_rows, int ffn, int ith, int nth)
{
    int64_t r0, r1;
    threadpool_split(n_rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        for (int i = 0; i < ffn; i++) {
            float x = g[(size_t)r * ffn + i];
            g[(size_t)r * ffn + i] = x / (1.0f + expf(-x)) * u[(size_t)r * ffn + i];
        }
}

static void op_embed(struct engine *e, int ith, int nth)
{
    const struct model *m = e->m;
    const struct kernel_ops *ops = engine_ops(e, m->tok_embd.type);
    int64_t t0, t1;
    threadpool_split(e->b->n, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++)
        ops->to_f32((const uint8_t *)m->tok_embd.data + (size_t)e->b->tok[t].token * m->tok_embd.row_bytes,
                    e->x + (size_t)t * m->hp.dim, m->hp.dim);
}

static void engine_job(void *ctx, int ith, int nth)
{
    struct engine *e = ctx;
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    struct threadpool *tp = e->tp;
    int T = e->b->n, dim = hp->dim, q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;

    op_embed(e, ith, nth);
    threadpool_barrier(tp);
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        op_rmsnorm(e->x, e->xn, L->attn_norm, T, NULL, dim, hp->norm_eps, ith, nth);
        op_act_invalidate(e, ith);
        threadpool_barrier(tp);
        const struct engine_act *a = op_act_prepare(e, e->xn, T, dim, engine_ops(e, L->wq.type), ith, nth);
        op_matmul(e, &L->wq, a, T, e->q, q_dim, false, ith, nth);
        a = op_act_prepare(e, e->xn, T, dim, engine_ops(e, L->wk.type), ith, nth);
        op_matmul(e, &L->wk, a, T, e->k, kv_dim, false, ith, nth);
        a = op_act_prepare(e, e->xn, T, dim, engine_ops(e, L->wv.type), ith, nth);
        op_matmul(e, &L->wv, a, T, e->v, kv_dim, false, ith, nth);
        threadpool_barrier(tp);
        op_rope_store(e, L, l, ith, nth);
        threadpool_barrier(tp);
        op_attention(e, l, ith, nth);
        op_act_invalidate(e, ith);
        threadpool_barrier(tp);
        a = op_act_prepare(e, e->att, T, q_dim, engine_ops(e, L->wo.type), ith, nth);
        op_matmul(e, &L->wo, a, T, e->x, dim, true, ith, nth);
        threadpool_barrier(tp);
        op_rmsnorm(e->x, e->xn, L->ffn_norm, T, NULL, dim, hp->norm_eps, ith, nth);
        op_act_invalidate(e, ith);
        threadpool_barrier(tp);
        a = op_act_prepare(e, e->xn, T, dim, engine_ops(e, L->w_gate.type), ith, nth);
        op_matmul(e, &L->w_gate, a, T, e->hg, hp->ffn_dim, false, ith, nth);
        a = op_act_prepare(e, e->xn, T, dim, engine_ops(e, L->w_up.type), ith, nth);
        op_matmul(e, &L->w_up, a, T, e->hu, hp->ffn_dim, false, ith, nth);
        threadpool_barrier(tp);
        op_swiglu(e->hg, e->hu, T, hp->ffn_dim, ith, nth);
        op_act_invalidate(e, ith);
        threadpool_barrier(tp);
        a = op_act_prepare(e, e->hg, T, hp->ffn_dim, engine_ops(e, L->w_down.type), ith, nth);
        op_matmul(e, &L->w_down, a, T, e->x, dim, true, ith, nth);
        threadpool_barrier(tp);
    }
    if (e->n_logits > 0) {
        op_rmsnorm(e->x, e->xn, m->output_norm, e->n_logits, e->logit_rows, dim, hp->norm_eps, ith, nth);
        op_act_invalidate(e, ith);
        threadpool_barrier(tp);
        const struct engine_act *a = op_act_prepare(e, e->xn, e->n_logits, dim, engine_ops(e, m->output.type), ith, nth);
        op_matmul(e, &m->output, a, e->n_logits, e->logits, hp->n_vocab, false, ith, nth);
    }
}

int engine_forward(struct engine *e, const struct batch *b, float *logits, char *err)
{
    const struct model_hparams *hp = &e->m->hp;
    if (b->n <= 0)
        return 0;
    if (b->n > e->p.max_batch_tokens)
        return err_set(err, ERR_INVALID_ARG, "batch of %d tokens exceeds max_batch_tokens %d", b->n, e->p.max_batch_tokens);
    /* next expected position per sequence: starts at the sequence's length */
    int *next = malloc((size_t)e->p.max_seqs * sizeof *next);
    if (!next)
        return err_set(err, ERR_NOMEM, "out of memory");
    for (int s = 0; s < e->p.max_seqs; s++)
        next[s] = -1;
    int rc = 0, n_logits = 0;
    for (int i = 0; i < b->n; i++) {
        const struct batch_token *t = &b->tok[i];
        if (t->seq < 0 || t->seq >= e->p.max_seqs) {
            rc = err_set(err, ERR_INVALID_ARG, "batch token %d: sequence id %d out of range [0, %d)", i, t->seq, e->p.max_seqs);
            goto out;
        }
        if (t->token < 0 || t->token >= hp->n_vocab) {
            rc = err_set(err, ERR_INVALID_ARG, "batch token %d: token id %d out of range [0, %d)", i, t->token, hp->n_vocab);
            goto out;
        }
        if (next[t->seq] < 0)
            next[t->seq] = e->seqs[t->seq].n_pos;
        if (t->pos != next[t->seq]) {
            rc = err_set(err, ERR_INVALID_ARG, "batch token %d: position %d, but sequence %d continues at %d", i, t->pos,
                         t->seq, next[t->seq]);
            goto out;
        }
        if (t->pos >= e->p.n_ctx) {
            rc = err_set(err, ERR_CONTEXT_LENGTH, "batch token %d: position %d is past the context size %d", i, t->pos,
                         e->p.n_ctx);
            goto out;
        }
        next[t->seq]++;
        if (t->logits)
            e->logit_rows[n_logits++] = i;
    }
    if (n_logits > 0 && !logits) {
        rc = err_set(err, ERR_INVALID_ARG, "logits requested but no output buffer given");
        goto out;
    }
    /* reserve KV for every sequence, all or nothing */
    int64_t need = 0;
    for (int s = 0; s < e->p.max_seqs; s++)
        if (next[s] >= 0)
            need += kv_seq_blocks_needed(e->kv, &e->seqs[s], next[s]);
    if (need > kv_pool_free_blocks(e->kv)) {
        rc = err_set(err, ERR_NO_SPACE, "KV cache full: batch needs %lld blocks, %lld free", (long long)need,
                     (long long)kv_pool_free_blocks(e->kv));
        goto out;
    }
    for (int s = 0; s < e->p.max_seqs; s++)
        if (next[s] >= 0 && (rc = kv_seq_reserve(e->kv, &e->seqs[s], next[s])) != 0) {
            err_set(err, rc, "cannot reserve KV blocks");
            goto out;
        }
    e->b = b;
    e->logits = logits;
    e->n_logits = n_logits;
    threadpool_run(e->tp, engine_job, e);
    e->b = NULL;
    for (int s = 0; s < e->p.max_seqs; s++)
        if (next[s] >= 0)
            e->seqs[s].n_pos = next[s];
out:
    free(next);
    return rc;
}
