/*
 * cpu_backend: the "cpu" backend (backend.h): the llama forward pass over a ragged batch and the paged KV
 * cache, run as ONE thread-pool job with barriers between dependent ops (no fork/join per op). Weights are
 * the model's host pointers, used as they are; KV blocks live in host memory (kv_host.h).
 *
 * Per layer, for the T tokens of the batch (x: [T][dim] residual stream, f32):
 *   xn = rmsnorm(x) * attn_norm, converted to the weights' activation format   rows split over threads
 *   q, k, v = xn Wq^T (+bq), xn Wk^T (+bk), xn Wv^T (+bv)  weight rows split over threads (op_matmul)
 *   rope(q, k); k, v -> KV blocks of each token's sequence at its position
 *   a = softmax(q K^T / sqrt(hd)) V per (token, KV head), the KV head's query heads together
 *   x += a Wo^T
 *   xn = rmsnorm(x) * ffn_norm;  h = silu(xn Wg^T) * (xn Wu^T);  x += h Wd^T
 * then logits = rmsnorm(x[rows asked]) * output_norm Wout^T.
 *
 * Matrix products convert their input rows once to the weight type's activation format (kernel_ops
 * vec_type) and then compute every output element with the kernels' gemm over panels of weight rows: a
 * panel small enough to stay in cache is used for every token of the batch before the next one is read, and
 * each element is bit-identical to a vec_dot over the full row. The reduction order of an element depends
 * only on that row, never on T or on the thread split, so a sequence's logits are bit-identical alone or in
 * any batch. Attention works the same way (attn.h fixes its reduction orders): softmax is exact and in two
 * passes (max, then exp and a double sum), not online, because llama.cpp's non-flash attention rounds that
 * way (query rounded to F16 against an F16 cache, probabilities rounded to F16 before the V product).
 *
 * Kernels are chosen once at create, per weight type: the best kernel_ops and gemv_ops for this CPU
 * (AVX-512, AVX2), or the portable scalar ones with force_scalar (--no-simd).
 *
 * Barriers: an op that produces rows split by token (rmsnorm, swiglu) converts the same rows to the
 * activation format in the same thread, so the two need no barrier between them; each thread keeps its own
 * copy of which conversions the activation slots hold (all threads make the same decisions), so no thread
 * has to publish it. That leaves 10 barriers per layer.
 *
 * What lies between decode's products costs most where the threads run on different CCDs: the Zen 5 VM this is
 * measured on places its two vCPUs now on one CCD (a one-line ping-pong 80-100 ns; two threads read 50-55
 * GB/s through the CCD's one link to memory), now on two (370-400 ns; 80-87 GB/s, a link each). There a
 * barrier, the residual rows other threads wrote and the claims' words cost 4-5x as much as on one CCD
 * (docs/performance.md, stop 40): decode resets its claim words on the thread that owns them, asks for its
 * output rows for writing at each claim, and asks for a row's lines before the norm's sum runs over them.
 *
 * WAFER_PROFILE=1 in the environment makes destroy (engine_destroy) print the wall time spent in each op
 * (measured on thread 0 at the barriers, so an op's time includes waiting for the slowest thread).
 */
#include "engine/cpu/cpu_backend.h"

#include "core/clock.h"
#include "core/err.h"
#include "engine/backend.h"
#include "engine/cpu/attn.h"
#include "engine/cpu/cpu_tune.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/threadpool.h"
#include "engine/gguf/quant.h"
#include "engine/kv_host.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Activation conversion slots: a layer's matrices use at most two activation formats (e.g. Q4_K_M mixes
 * Q4_K and Q6_K, both Q8_K; Q4_0 files keep output in Q6_K), so two slots avoid converting twice. */
#define CPU_ACT_SLOTS 2

/* Matrix products per layer (q, k, v, o, gate, up, down): op_matmul's counter index is layer * this + which. */
#define CPU_MM_PER_LAYER 7

/* One thread's share of a decode product (op_matmul_decode): the units its owner has taken from the front
 * (high 32 bits) and other threads from the back (low 32), in one word so that both sides claim with one
 * compare-and-swap. A cache line each: the owner claims every chunk, the others only when they steal. */
struct cpu_take {
    _Atomic uint64_t fb;
    char pad[64 - sizeof(uint64_t)];
};

/* What an activation slot holds, as one thread knows it (each thread keeps its own copy). */
struct cpu_act {
    enum dtype vec_type; /* format held, or DTYPE_COUNT when empty */
    /* the conversion that made it: formats of one vec_type may round differently (F32, F16 and BF16 weights
     * all take F32 rows: unrounded, rounded to F16, to BF16) */
    void (*conv)(const float *src, void *dst, int64_t n);
    const float *src;    /* which float buffer it was converted from */
    size_t row_bytes;    /* bytes per converted row */
    uint8_t *buf;        /* the slot's buffer [T][row_bytes] */
    uint8_t *aux;        /* [T][aux_stride] gemv_ops prep of each row, or NULL when not prepared */
    size_t aux_stride;   /* bytes between rows of aux: this format's aux_bytes(cols), 64-aligned (<= act_aux_cap)
                          * so narrow activations touch (and keep resident) only the pages they use */
    uint8_t *aux_buf;    /* the slot's aux buffer */
};

enum cpu_op {
    OP_EMBED, OP_NORM, OP_QKV, OP_ROPE, OP_ATTN, OP_ATT_CONV, OP_WO, OP_GATE_UP, OP_SWIGLU, OP_DOWN, OP_OUTPUT,
    OP_COUNT
};

static const char *const cpu_op_names[OP_COUNT] = {
    "embed", "rmsnorm+convert", "matmul q,k,v", "rope+kv store", "attention", "convert attn out",
    "matmul wo", "matmul gate,up", "swiglu+convert", "matmul down", "output norm+matmul",
};

struct cpu_prof {
    double t[OP_COUNT]; /* seconds */
    int64_t passes, tokens;
};

/* Query tokens attended together: a tile of up to CPU_ATT_TILE consecutive tokens of one sequence (a prefill
 * chunk) reads and converts each cached K and V row once for all of them instead of once per token. 6, a
 * multiple of 3: a tile's 6 x group query rows all run in the AVX2 V accumulation's threes (with llama's 4 query
 * heads per KV head, 4 tokens' 16 rows left one to its slower single-row loop), and each cached row serves 6
 * tokens. 1B Q4_0 pp4096 on the Zen 3 (stop 53, `WAFER_PROFILE=1 wafer bench -p 4096 -n 0 -r 1 -t 2`, builds
 * alternated, 5 pairs): attention 673-775 ms a pass with 4 -> 630-721 with 6; 8 (32 rows, 2 alone) 703-820;
 * 9 and 12 level with 6 (646-663 ms), so 6, the least scratch (rows x n_ctx floats a thread) of those. */
#define CPU_ATT_TILE 6

struct cpu_backend {
    struct backend base;
    const struct model *m;
    bool layout_held;       /* holds m's weight layout (model_layout_hold), released at destroy */
    struct engine_params p; /* the engine's, with n_threads resolved */
    struct threadpool *tp;
    struct kv_host kv;      /* the KV blocks */
    float rope_theta_scale; /* base^(-2/head_dim) */
    float rope_freq_scale;  /* 1 / linear scaling factor */
    const float *rope_ff;   /* llama3 per-dimension divisors [head_dim / 2] or NULL */
    const struct attn_kernels *attn;
    const struct kernel_ops *kv_ops; /* Q8_0 kernels for a Q8_0 cache, else NULL */
    size_t kv_row_bytes;             /* one cached row (position, KV head) */
    const struct kernel_ops *ops[DTYPE_COUNT]; /* per weight type used, chosen once */
    const struct gemv_ops *gemv[DTYPE_COUNT];  /* decode kernels per weight type, or NULL: gemm */
    const char *isa[DTYPE_COUNT];              /* instruction set of ops / gemv per weight type used */
    /* per thread: [n_threads][gemv_aux_cap], a thread's decode gemv aux or its gemm16 scratch (one product at a
     * time, each call one or the other) */
    uint8_t *gemv_aux;
    size_t gemv_aux_cap;
    /* per activation format: the prep shared by the gemv_ops with a gemm for it (see gemv.h), or NULL */
    void (*act_prep[DTYPE_COUNT])(int64_t n, const void *x, void *aux);
    size_t (*act_aux_bytes[DTYPE_COUNT])(int64_t n); /* the aux_bytes that goes with act_prep */
    size_t act_aux_cap;                        /* bytes of prep output per activation row */
    uint8_t *act_aux_buf[CPU_ACT_SLOTS];       /* [T][act_aux_cap] */
    float *scratch;         /* per thread: [n_threads][scratch_floats], op_attention's tile (layout there) */
    size_t scratch_floats;
    size_t scratch_bytes;   /* everything allocated at create, for describe */

    /* scratch, sized for max_batch_tokens (T) */
    float *x;    /* [T][dim] residual */
    float *xn;   /* [T][dim] normed */
    float *q;    /* [T][n_heads * head_dim] */
    float *k;    /* [T][kv_dim] */
    float *v;    /* [T][kv_dim] */
    float *att;  /* [T][n_heads * head_dim] */
    float *hg;   /* [T][ffn] */
    float *hu;   /* [T][ffn] */
    float *tmp;  /* [T][dim] products added into x */
    float *rope; /* [T][head_dim] cos, sin of each token's rotation angles */
    uint8_t *act_buf[CPU_ACT_SLOTS]; /* [T][act_row_cap] */
    struct cpu_act *act; /* [n_threads][CPU_ACT_SLOTS]: each thread's view of the slots */
    int *mm_next;       /* [CPU_MM_PER_LAYER * n_layers + 1]: per matrix product of a pass, how many of its
                         * shared rows are claimed (op_matmul; atomic), zeroed before each pass */
    int mm_count;
    struct cpu_take *mm_take; /* [mm_count][n_threads]: decode's shares of each product (op_matmul_decode),
                               * zeroed before each pass */
    size_t act_row_cap; /* bytes per row each slot can hold */

    bool prof_on;
    double prof_last;
    struct cpu_prof prof[3]; /* [0] one token, [1] several sequences one token each, [2] others (prefill) */

    /* the job being run */
    const struct batch *b;
    const struct kv_seq *seqs;   /* block tables by sequence id */
    const int32_t *logit_rows;   /* [n_logits] batch index of each row whose logits are wanted */
    float *logits;
    int n_logits;
    int n_seqs_in_batch; /* sequences with tokens in b: b->n equal to it means a pure decode step */
};

static void cpu_destroy(struct backend *be);

static const struct kernel_ops *cpu_kernels(const struct cpu_backend *cb, enum dtype t)
{
    return cb->p.force_scalar ? kernel_ops_scalar(t) : kernel_ops_get(t);
}

/* The weight types whose matrices the kernels create chooses read in the R16 layout: those whose decode kernels
 * (gemv_ops_best, taken where the kernel_ops are the AVX2 ones) have R16 versions (no permutes: 1B Q4_0 decode
 * gemv 1.4x from memory, batched decode of 8 1.3x, see gemv_avx512q.c; 1B Q4_K_M decode 1.0-1.4x, see
 * gemv_avx512k.c); GGUF rows for the others. The backend's weight_layouts, and create's rule. */
static void cpu_weight_layouts(const struct engine_params *p, bool r16[DTYPE_COUNT])
{
    for (int t = 0; t < DTYPE_COUNT; t++) {
        const struct kernel_ops *ops = p->force_scalar ? NULL : kernel_ops_get((enum dtype)t);
        const struct gemv_ops *g = ops && ops == kernel_ops_avx2((enum dtype)t) ? gemv_ops_best((enum dtype)t) : NULL;
        r16[t] = g && g->gemv16 && g->gemm16;
    }
}

/* The instruction set of the kernels chosen for weight type t, for describe. */
static const char *cpu_isa_name(const struct cpu_backend *cb, enum dtype t)
{
    if (cb->p.force_scalar || cb->ops[t] != kernel_ops_avx2(t))
        return "scalar";
    const struct gemv_ops *g = cb->gemv[t];
    if (g && (g == gemv_ops_avx512q(t) || g == gemv_ops_avx512k(t)))
        return "avx512";
    return g && g == gemv_ops_avx2_vnni(t) ? "avx-vnni" : "avx2";
}

/* Allocates size bytes (64-byte aligned when align) and counts them in scratch_bytes. */
static void *cpu_alloc(struct cpu_backend *cb, size_t size, bool align)
{
    cb->scratch_bytes += size;
    return align ? aligned_alloc(64, size) : malloc(size);
}

static struct backend *cpu_create(const struct model *m, const struct engine_params *params, char *err)
{
    const struct model_hparams *hp = &m->hp;
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    cb->base.ops = &cpu_backend_ops;
    cb->m = m;
    cb->p = *params;
    cpu_tune_load_once(); /* this CPU's measured decode prefetch rules, where `wafer bench --tune` wrote them */
    struct engine_params *p = &cb->p;
    /* A model of a few MB is done in microseconds per op: splitting it only adds barrier waits (and a
     * barrier can stall for a scheduler slice when another process holds a core), so by default it runs
     * on one thread. An explicit n_threads is always honoured. */
    if (p->n_threads <= 0 && m->weight_bytes < ((size_t)8 << 20))
        p->n_threads = 1;
    cb->tp = threadpool_create(p->n_threads);
    if (!cb->tp)
        goto oom;
    p->n_threads = threadpool_size(cb->tp);

    int hd = hp->head_dim;
    if (hd > 1024) {
        err_set(err, ERR_UNSUPPORTED, "head dimension %d is larger than the supported 1024", hd);
        goto fail;
    }
    cb->rope_theta_scale = powf(hp->rope_base, -2.0f / (float)hd);
    cb->rope_freq_scale = hp->rope_scale_factor > 0 ? 1.0f / hp->rope_scale_factor : 1.0f;
    cb->rope_ff = model_rope_freqs(m);
    int group = hp->n_heads / hp->n_kv_heads;
    /* for op_attention's tile of R = CPU_ATT_TILE * group query rows: scores [R][n_ctx], queries [R][hd],
     * outputs [R][hd], a dequantized V block [block_size][hd], quantized queries [R][kv_row_bytes] */
    cb->kv_row_bytes = dtype_row_bytes(p->kv_type, hd);
    size_t att_rows = (size_t)CPU_ATT_TILE * group;
    cb->scratch_floats = att_rows * ((size_t)p->n_ctx + 2 * (size_t)hd) + (size_t)p->block_size * hd +
                        (att_rows * cb->kv_row_bytes + 3) / 4;
    cb->scratch_floats = (cb->scratch_floats + 15) & ~(size_t)15; /* keep each thread's part 64-byte aligned */
    cb->scratch = cpu_alloc(cb, (size_t)p->n_threads * cb->scratch_floats * sizeof(float), true);
    if (!cb->scratch)
        goto oom;
    cb->attn = attn_kernels_get(p->force_scalar);
    if (p->kv_type == DTYPE_Q8_0 && !(cb->kv_ops = cpu_kernels(cb, DTYPE_Q8_0))) {
        err_set(err, ERR_UNSUPPORTED, "no kernels for a q8_0 KV cache");
        goto fail;
    }

    size_t T = (size_t)p->max_batch_tokens;
    size_t q_dim = (size_t)hp->n_heads * hd, kv_dim = (size_t)hp->n_kv_heads * hd;
    cb->x = cpu_alloc(cb, T * hp->dim * sizeof(float), false);
    cb->xn = cpu_alloc(cb, T * hp->dim * sizeof(float), false);
    cb->q = cpu_alloc(cb, T * q_dim * sizeof(float), false);
    cb->k = cpu_alloc(cb, T * kv_dim * sizeof(float), false);
    cb->v = cpu_alloc(cb, T * kv_dim * sizeof(float), false);
    cb->att = cpu_alloc(cb, T * q_dim * sizeof(float), false);
    cb->hg = cpu_alloc(cb, T * hp->ffn_dim * sizeof(float), false);
    cb->hu = cpu_alloc(cb, T * hp->ffn_dim * sizeof(float), false);
    cb->tmp = cpu_alloc(cb, T * hp->dim * sizeof(float), false);
    cb->rope = cpu_alloc(cb, T * hd * sizeof(float), false);
    cb->act = calloc((size_t)p->n_threads * CPU_ACT_SLOTS, sizeof *cb->act);
    cb->mm_count = CPU_MM_PER_LAYER * hp->n_layers + 1;
    cb->mm_next = calloc((size_t)cb->mm_count, sizeof *cb->mm_next);
    cb->mm_take = aligned_alloc(64, (size_t)cb->mm_count * (size_t)p->n_threads * sizeof *cb->mm_take);
    if (!cb->x || !cb->xn || !cb->q || !cb->k || !cb->v || !cb->att || !cb->hg || !cb->hu || !cb->tmp || !cb->rope ||
        !cb->act || !cb->mm_next || !cb->mm_take)
        goto oom;
    size_t max_cols = (size_t)hp->dim;
    if ((size_t)hp->ffn_dim > max_cols)
        max_cols = hp->ffn_dim;
    if (q_dim > max_cols)
        max_cols = q_dim;
    /* F32 is the widest activation format. The buffers are 64-byte aligned, so F32 rows of a multiple of 16
     * columns start on a cache line: the AVX-512 F16 gemm loads 64 bytes at a time, and with malloc's 16-byte
     * alignment every load split across two lines (5-9% of 1B F16 prefill). */
    cb->act_row_cap = (max_cols * 4 + 64 + 63) & ~(size_t)63;
    for (int i = 0; i < CPU_ACT_SLOTS; i++) {
        cb->act_buf[i] = cpu_alloc(cb, T * cb->act_row_cap, true);
        if (!cb->act_buf[i])
            goto oom;
    }
    for (int t = 0; t < p->n_threads; t++)
        for (int i = 0; i < CPU_ACT_SLOTS; i++) {
            cb->act[t * CPU_ACT_SLOTS + i].vec_type = DTYPE_COUNT;
            cb->act[t * CPU_ACT_SLOTS + i].buf = cb->act_buf[i];
        }
    /* every weight type used must have kernels */
    const struct model_weight *ws[] = {&m->output, &m->tok_embd};
    for (size_t i = 0; i < 2; i++)
        if (!(cb->ops[ws[i]->type] = cpu_kernels(cb, ws[i]->type))) {
            err_set(err, ERR_UNSUPPORTED, "no kernels for weight type %s", dtype_name(ws[i]->type));
            goto fail;
        }
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct model_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++)
            if (!(cb->ops[lw[i]->type] = cpu_kernels(cb, lw[i]->type))) {
                err_set(err, ERR_UNSUPPORTED, "no kernels for weight type %s", dtype_name(lw[i]->type));
                goto fail;
            }
    }
    /* decode kernels and VNNI gemm (bit-identical to kernel_ops vec_dot and gemm) with their scratch */
    if (!p->force_scalar)
        for (int t = 0; t < DTYPE_COUNT; t++)
            if (cb->ops[t] && cb->ops[t] == kernel_ops_avx2((enum dtype)t) && (cb->gemv[t] = gemv_ops_best((enum dtype)t))) {
                size_t need = (cb->gemv[t]->aux_bytes((int64_t)max_cols) + 63) & ~(size_t)63;
                if (need > cb->gemv_aux_cap)
                    cb->gemv_aux_cap = need;
                /* gemm16's scratch for each row length a product of this type has */
                for (int l = 0; l < hp->n_layers && cb->gemv[t]->gemm16_scratch; l++) {
                    const struct model_layer *L = &m->layers[l];
                    const struct model_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                                       &L->w_down, &m->output};
                    for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++)
                        if (lw[i]->type == (enum dtype)t) {
                            size_t sn = (cb->gemv[t]->gemm16_scratch(lw[i]->cols) + 63) & ~(size_t)63;
                            cb->gemv_aux_cap = sn > cb->gemv_aux_cap ? sn : cb->gemv_aux_cap;
                        }
                }
                if (cb->gemv[t]->gemm && cb->gemv[t]->aux_bytes((int64_t)max_cols) > 0) {
                    cb->act_prep[cb->ops[t]->vec_type] = cb->gemv[t]->prep;
                    cb->act_aux_bytes[cb->ops[t]->vec_type] = cb->gemv[t]->aux_bytes;
                    if (need > cb->act_aux_cap)
                        cb->act_aux_cap = need;
                }
            }
    /* the weights in the layout the chosen kernels read (cpu_weight_layouts), which puts back rows a previous
     * engine on this model may have re-laid; nothing to do when the loader placed them so (engine_model_load).
     * A mapped model stays in rows. */
    bool r16[DTYPE_COUNT];
    cpu_weight_layouts(p, r16);
    int rl = model_relayout(m, r16);
    if (rl == ERR_UNAVAILABLE) {
        err_set(err, rl, "the model's weights are laid out for the kernels of another engine still running on it "
                         "(destroy that one first, or give both the same --no-simd setting)");
        goto fail;
    }
    if (rl && rl != ERR_UNSUPPORTED) {
        err_set(err, rl, "cannot lay out the weights for the kernels: %s", err_name(rl));
        goto fail;
    }
    model_layout_hold(m);
    cb->layout_held = true;
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (cb->ops[t])
            cb->isa[t] = cpu_isa_name(cb, (enum dtype)t);
    if (cb->gemv_aux_cap && !(cb->gemv_aux = cpu_alloc(cb, (size_t)p->n_threads * cb->gemv_aux_cap, true)))
        goto oom;
    for (int i = 0; i < CPU_ACT_SLOTS && cb->act_aux_cap; i++)
        if (!(cb->act_aux_buf[i] = cpu_alloc(cb, T * cb->act_aux_cap, true)))
            goto oom;
    for (int t = 0; t < p->n_threads; t++)
        for (int i = 0; i < CPU_ACT_SLOTS; i++)
            cb->act[t * CPU_ACT_SLOTS + i].aux_buf = cb->act_aux_buf[i];
    const char *prof = getenv("WAFER_PROFILE");
    cb->prof_on = prof && *prof && strcmp(prof, "0") != 0;
    return &cb->base;
oom:
    err_set(err, ERR_NOMEM, "out of memory creating the engine (batch of %d tokens)", p->max_batch_tokens);
fail:
    cpu_destroy(&cb->base);
    return NULL;
}

static void cpu_prof_print(const struct cpu_backend *cb)
{
    static const char *const kinds[3] = {"decode, one sequence", "decode, several sequences (one token each)",
                                         "prefill (several tokens of a sequence)"};
    for (int k = 0; k < 3; k++) {
        const struct cpu_prof *pr = &cb->prof[k];
        if (!pr->passes)
            continue;
        double total = 0;
        for (int i = 0; i < OP_COUNT; i++)
            total += pr->t[i];
        fprintf(stderr, "engine profile, %s: %lld passes, %lld tokens, %.1f ms per pass, %d threads\n",
                kinds[k], (long long)pr->passes,
                (long long)pr->tokens, total / (double)pr->passes * 1e3, cb->p.n_threads);
        for (int i = 0; i < OP_COUNT; i++)
            fprintf(stderr, "  %-20s %9.3f ms per pass %5.1f%%\n", cpu_op_names[i], pr->t[i] / (double)pr->passes * 1e3,
                    total > 0 ? 100 * pr->t[i] / total : 0.0);
    }
}

static void cpu_destroy(struct backend *be)
{
    struct cpu_backend *cb = (struct cpu_backend *)be;
    if (!cb)
        return;
    if (cb->prof_on)
        cpu_prof_print(cb);
    threadpool_destroy(cb->tp);
    if (cb->layout_held)
        model_layout_release(cb->m);
    kv_host_deinit(&cb->kv);
    free(cb->scratch);
    free(cb->x);
    free(cb->xn);
    free(cb->q);
    free(cb->k);
    free(cb->v);
    free(cb->att);
    free(cb->hg);
    free(cb->hu);
    free(cb->tmp);
    free(cb->rope);
    for (int i = 0; i < CPU_ACT_SLOTS; i++)
        free(cb->act_buf[i]);
    free(cb->act);
    free(cb->mm_next);
    free(cb->mm_take);
    free(cb->gemv_aux);
    for (int i = 0; i < CPU_ACT_SLOTS; i++)
        free(cb->act_aux_buf[i]);
    free(cb);
}

/* ---- ops, each called by every thread (ith of nth) inside the job ---- */

static inline int cpu_prof_kind(const struct cpu_backend *cb)
{
    return cb->b->n == 1 ? 0 : cb->b->n == cb->n_seqs_in_batch ? 1 : 2;
}

/* Thread 0 charges the time since its last mark to op k. */
static inline void cpu_mark(struct cpu_backend *cb, int ith, enum cpu_op k)
{
    if (ith != 0 || !cb->prof_on)
        return;
    double now = clock_now_s();
    cb->prof[cpu_prof_kind(cb)].t[k] += now - cb->prof_last;
    cb->prof_last = now;
}

/* y[r] = x[r] / rms(x[r]) * w for rows r in [r0, r1); rows of x indexed through idx when not NULL. */
static void op_rmsnorm_rows(const float *x, float *y, const float *w, int64_t r0, int64_t r1, const int32_t *idx, int dim,
                            float eps, int64_t c0, int64_t c1)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + (size_t)(idx ? idx[r] : r) * dim;
        float *yr = y + (size_t)r * dim;
        /* the row's lines asked for at once: in decode every thread reads the whole row, which the product
         * before wrote in parts on every core, and the sum's chain of dependent adds alone keeps few of its
         * loads in flight (Zen 5, 1B Q4_0, the norms' time a token, alternated: threads on one CCD 67-91 ->
         * 62-68 us; on two CCDs 111-136 -> 108-143, too few and too noisy to tell; stop 40) */
        for (int i = 0; i < dim; i += 16)
            __builtin_prefetch(xr + i, 0, 3);
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float scale = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int64_t i = c0; i < c1; i++)
            yr[i] = xr[i] * scale * w[i];
    }
}

/* Columns of a lone row (decode of one sequence) per thread, in whole CPU_COL_UNITs: QK_K elements, a whole
 * number of blocks of every activation format, so a thread converts its columns on its own. */
#define CPU_COL_UNIT 256

/* Whether a pass of n_rows rows of cols columns splits each row's columns between threads rather than its rows:
 * one row, several threads and whole units. Then this thread's columns are [*c0, *c1). A row's norm, SwiGLU and
 * conversion would otherwise run on one thread while the others wait (1B decode: 0.3 of 13 ms per token). */
static bool op_col_share(int n_rows, int cols, int ith, int nth, int64_t *c0, int64_t *c1)
{
    if (n_rows != 1 || nth == 1 || cols % CPU_COL_UNIT)
        return false;
    threadpool_split(cols / CPU_COL_UNIT, ith, nth, c0, c1);
    *c0 *= CPU_COL_UNIT, *c1 *= CPU_COL_UNIT;
    return true;
}

/* This thread's view of the activation slots. */
static inline struct cpu_act *cpu_acts(struct cpu_backend *cb, int ith) { return cb->act + (size_t)ith * CPU_ACT_SLOTS; }

/* Forgets this thread's record of conversions (their source buffers are about to change). */
static void op_act_invalidate(struct cpu_backend *cb, int ith)
{
    struct cpu_act *a = cpu_acts(cb, ith);
    for (int i = 0; i < CPU_ACT_SLOTS; i++) {
        a[i].vec_type = DTYPE_COUNT;
        a[i].src = NULL;
    }
}

/* Converts x [n_rows][cols] to the activation format of ops, unless a slot already holds that conversion.
 * This thread converts rows threadpool_split(n_rows) gives it, or a lone row's columns op_col_share gives it, so
 * x must be complete there (the caller's barrier, or what this thread wrote itself with the same split). Every
 * thread makes the same choice of slot from its own record. Ends with a barrier when it converted. */
static const struct cpu_act *op_act_prepare(struct cpu_backend *cb, const float *x, int n_rows, int cols,
                                               const struct kernel_ops *ops, int ith, int nth)
{
    struct cpu_act *acts = cpu_acts(cb, ith);
    for (int i = 0; i < CPU_ACT_SLOTS; i++)
        if (acts[i].vec_type == ops->vec_type && acts[i].conv == ops->from_f32 && acts[i].src == x)
            return &acts[i];
    /* choose the slot not holding the other live conversion of x; otherwise slot 0 */
    int s = acts[0].src == x && acts[0].vec_type != DTYPE_COUNT ? 1 : 0;
    struct cpu_act *a = &acts[s];
    /* A third conversion of x (products of one input in three formats) takes a slot that a product of x may
     * still be reading on another thread (op_matmul ends without a barrier): wait for them first. */
    if (a->vec_type != DTYPE_COUNT && a->src == x)
        threadpool_barrier(cb->tp);
    size_t rb = dtype_row_bytes(ops->vec_type, cols);
    int64_t r0, r1, c0, c1;
    threadpool_split(n_rows, ith, nth, &r0, &r1);
    void (*prep)(int64_t, const void *, void *) = n_rows > 1 ? cb->act_prep[ops->vec_type] : NULL;
    size_t as = prep ? (cb->act_aux_bytes[ops->vec_type](cols) + 63) & ~(size_t)63 : 0;
    if (op_col_share(n_rows, cols, ith, nth, &c0, &c1)) /* one row: no prep (n_rows > 1 only) */
        ops->from_f32(x + c0, a->buf + dtype_row_bytes(ops->vec_type, c0), c1 - c0);
    else
        for (int64_t r = r0; r < r1; r++) {
            ops->from_f32(x + (size_t)r * cols, a->buf + (size_t)r * rb, cols);
            if (prep)
                prep(cols, a->buf + (size_t)r * rb, a->aux_buf + (size_t)r * as);
        }
    a->aux_stride = as;
    a->vec_type = ops->vec_type;
    a->conv = ops->from_f32;
    a->src = x;
    a->row_bytes = rb;
    a->aux = prep ? a->aux_buf : NULL;
    threadpool_barrier(cb->tp);
    return a;
}

/* Normalizes rows of x (indexed through idx when not NULL) into xn and converts them for ops; rows split by
 * thread (a lone row's columns, see op_col_share), one barrier at the end. */
static const struct cpu_act *op_norm_prepare(struct cpu_backend *cb, const float *w, int n_rows, const int32_t *idx,
                                                const struct kernel_ops *ops, int ith, int nth)
{
    const struct model_hparams *hp = &cb->m->hp;
    int64_t r0, r1, c0 = 0, c1 = hp->dim;
    threadpool_split(n_rows, ith, nth, &r0, &r1);
    if (op_col_share(n_rows, hp->dim, ith, nth, &c0, &c1)) /* every thread the lone row's columns it converts */
        r0 = 0, r1 = 1;
    op_rmsnorm_rows(cb->x, cb->xn, w, r0, r1, idx, hp->dim, hp->norm_eps, c0, c1);
    op_act_invalidate(cb, ith);
    return op_act_prepare(cb, cb->xn, n_rows, hp->dim, ops, ith, nth);
}

/* Rows of a weight panel: enough to amortize a call, few enough (about 96 KiB) that the panel stays in L2
 * while every activation row of the batch passes over it. A multiple of 12 so the kernels' 2-, 3- and
 * 4-row tiles divide it. */
static int64_t cpu_panel_rows(size_t row_bytes, int n_tok, int64_t n_rows)
{
    if (n_tok <= 1)
        return n_rows > 0 ? n_rows : 1; /* decode: each weight row is used once, no reuse to protect */
    int64_t r = (int64_t)((96u << 10) / row_bytes);
    r -= r % 12;
    return r < 12 ? 12 : r;
}

/* The decode kernel for rows [r0, r1) of w against the one activation row a (its aux prepared by gv->prep
 * on this thread): out[r] = or += the product, accumulating through cb->tmp as op_matmul_rows does. */
static void op_gemv_rows(struct cpu_backend *cb, const struct model_weight *w, const struct cpu_act *a,
                         const uint8_t *aux, float *out, bool accumulate, int64_t r0, int64_t r1)
{
    const struct gemv_ops *gv = cb->gemv[w->type];
    float *dst = accumulate ? cb->tmp : out;
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    if (w->layout == WEIGHT_R16)
        gv->gemv16(w->cols, r1 - r0, dst + r0, wr, a->buf, aux);
    else
        gv->gemv(w->cols, r1 - r0, dst + r0, wr, w->row_bytes, a->buf, aux);
    if (accumulate)
        for (int64_t r = r0; r < r1; r++)
            out[r] = out[r] + dst[r];
}

/* out[t][r] (=|+=) dot(W[r], act[t]) for r in [r0, r1), t < n_rows, on thread ith: the gemv kernels for one
 * activation row, else the gemm kernels; out rows are ldo floats apart. Accumulation goes through cb->tmp
 * ([n_rows][w->rows]) so the add is x + product, the same rounding whether a row runs alone or in a batch. */
static void op_matmul_rows(struct cpu_backend *cb, const struct model_weight *w, const struct cpu_act *a, int n_rows,
                           float *out, int ldo, bool accumulate, int64_t r0, int64_t r1, int ith)
{
    const struct kernel_ops *ops = cb->ops[w->type];
    float *dst = accumulate ? cb->tmp : out;
    size_t ldd = accumulate ? (size_t)w->rows : (size_t)ldo;
    const uint8_t *wb = w->data;
    const struct gemv_ops *gv = cb->gemv[w->type];
    /* R16 weights (model_relayout at create) only where gv has kernels for them, r0 and r1 multiples of 16 */
    bool r16 = w->layout == WEIGHT_R16;
    if (n_rows == 1 && gv) {
        uint8_t *aux = cb->gemv_aux + (size_t)ith * cb->gemv_aux_cap;
        gv->prep(w->cols, a->buf, aux);
        op_gemv_rows(cb, w, a, aux, out, accumulate, r0, r1);
        return;
    }
    if (r16) { /* its prep is the act_prep of the format, so a->aux is there */
        gv->gemm16(w->cols, (int)(r1 - r0), n_rows, dst + r0, ldd, wb + (size_t)r0 * w->row_bytes, a->buf,
                   a->row_bytes, a->aux, a->aux_stride,
                   gv->gemm16_scratch ? cb->gemv_aux + (size_t)ith * cb->gemv_aux_cap : NULL);
    } else {
        /* the gemv_ops gemm when it exists and its activation aux (if it needs one) was prepared */
        bool own = gv && gv->gemm && (a->aux || gv->aux_bytes(w->cols) == 0);
        /* A gemv_ops gemm blocks columns so their activations stay in L2 while all its rows pass over them, so
         * it gets the whole range of rows: in panels it would stream every column's activations (and aux) once
         * per panel, which for long rows (FFN down) bound it (AVX-512 1B Q4_0 pp128 down: 900 -> 500 ms). */
        int64_t pr = own ? r1 - r0 : cpu_panel_rows(w->row_bytes, n_rows, r1 - r0);
        for (int64_t p = r0; p < r1; p += pr) {
            int64_t n = r1 - p < pr ? r1 - p : pr;
            if (own)
                gv->gemm(w->cols, (int)n, n_rows, dst + p, ldd, wb + (size_t)p * w->row_bytes, w->row_bytes, a->buf,
                         a->row_bytes, a->aux, a->aux_stride);
            else
                ops->gemm(w->cols, (int)n, n_rows, dst + p, ldd, wb + (size_t)p * w->row_bytes, w->row_bytes, a->buf,
                          a->row_bytes);
        }
    }
    if (accumulate)
        for (int t = 0; t < n_rows; t++) {
            float *o = out + (size_t)t * ldo;
            const float *d = dst + (size_t)t * ldd;
            for (int64_t r = r0; r < r1; r++)
                o[r] = o[r] + d[r];
        }
}

/* Decode's claim, in bytes of weights: an owner takes its share this much at a time, and what another thread
 * can take is what no claim covers yet. Not less: a claim is a locked compare-and-swap, which waits for the
 * core's loads in flight; every 64 KiB it held 0.75% of 1B Q4_0 decode's samples (`perf record -e
 * cpu-clock`, Zen 5), every 256 KiB (6 us of streaming at 40 GB/s a core) it is gone from the profile. */
#define CPU_DECODE_CHUNK (256 << 10)
/* Under the TWIN rule (the Q4_0 / Q8_0 gemv reads the two halves of each call side by side) claims are larger,
 * so the two streams are far apart: on the Intel Xeon family 6 model 207 (stop 44) the two halves of 256 KiB
 * claims decoded 1B Q4_0 no faster than one stream, of 2 MiB claims (capped at a quarter of a share below)
 * faster in 9 of 11 pairs; the larger claims alone were 1% slower. */
#define CPU_DECODE_CHUNK_TWIN (2048 << 10)

/* Asks for the lines of n floats at p in a state this core may write without asking again (prefetchw): a
 * decode product's outputs, which the norm that follows has every thread read, so they sit shared in the other
 * cores' caches, and a store to such a line waits for the other copies to be dropped (across CCDs ~0.4 us);
 * an accumulating product's scalar adds (op_gemv_rows) queued behind those stores. Asked at the claim, the
 * gemv's streaming covers the wait: on the Zen 5 with its threads on two CCDs, 1B Q4_0, the adds of wo and
 * down took 24-25 and 35-45 us a token, 12 and 24-25 with this (stop 40). */
static inline void cpu_prefetch_write(const float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
#if defined(__x86_64__) || defined(__i386__)
        __asm__ volatile("prefetchw %0" : : "m"(p[i]));
#else
        __builtin_prefetch(p + i, 1, 3);
#endif
    }
}

/* Decode (one activation row) of R16 weights w on thread ith of nth: out (=|+=) W act. Each thread streams
 * its share of the groups of 16 rows (threadpool_split: one contiguous range, which the gemv prefetch wants;
 * chunks handed out from one counter cost Q4_0 decode 7%), claiming it CPU_DECODE_CHUNK at a time from the
 * front; a thread done with its own share takes the back half of what another has not claimed, again while
 * more than a group is left. So a core that the OS or another tenant takes away for a while no longer keeps
 * the other waiting at the next barrier, and each range read is still one stream. Measured on the Zen 5
 * (stop 37, `wafer bench -p 0 -n 64 -r 2 -t 2` with a busy loop running beside, alternated with the even
 * split): 1B Q4_0 median 34.5 against 33.2 tokens/s, faster in 12 of 14 pairs (in 14 of 15 with 64 KiB
 * claims), Q4_K_M faster in 11 of 12 pairs (median +5%). On the quiet machine level (tg128 at 83-85% / 92-93%
 * of the probes beside in its fast / slow minutes either way, 15-34 runs a bucket), though the threads' waits
 * at barriers fell from 8% of their samples to 1%: decode is bound by the memory both cores share, so while
 * one waited the other had the bandwidth. Which thread computes a row never changes its value. */
static void op_matmul_decode(struct cpu_backend *cb, const struct model_weight *w, const struct cpu_act *a,
                             float *out, bool accumulate, int which, int ith, int nth)
{
    const struct gemv_ops *gv = cb->gemv[w->type];
    const int64_t g = QUANT_R16_ROWS, units = w->rows / g;
    /* CPU_DECODE_CHUNK, or a quarter of a share where that is less (small matrices: something to take back) */
    size_t claim = cpu_decode_prefetch(w->type) == CPU_PREFETCH_TWIN ? CPU_DECODE_CHUNK_TWIN : CPU_DECODE_CHUNK;
    int64_t chunk = (int64_t)(claim / ((size_t)g * w->row_bytes)), quarter = units / nth / 4;
    chunk = chunk < quarter ? chunk : quarter;
    chunk = chunk < 1 ? 1 : chunk;
    uint8_t *aux = cb->gemv_aux + (size_t)ith * cb->gemv_aux_cap;
    bool prepped = false;
    struct cpu_take *take = cb->mm_take + (size_t)which * (size_t)nth;
    for (int d = 0; d < nth; d++) {
        int v = (ith + d) % nth; /* d == 0: this thread's own share */
        int64_t s0, e0;
        threadpool_split(units, v, nth, &s0, &e0);
        for (;;) {
            uint64_t fb = atomic_load_explicit(&take[v].fb, memory_order_relaxed);
            int64_t f = (int64_t)(fb >> 32), b = (int64_t)(fb & 0xffffffffu), left = e0 - s0 - f - b, k, u0;
            if (d == 0 ? left <= 0 : left < 2)
                break;
            if (d == 0)
                k = left < chunk ? left : chunk, u0 = s0 + f;
            else
                k = left / 2, u0 = e0 - b - k;
            uint64_t to = d == 0 ? fb + ((uint64_t)k << 32) : fb + (uint64_t)k;
            if (!atomic_compare_exchange_weak_explicit(&take[v].fb, &fb, to, memory_order_relaxed,
                                                       memory_order_relaxed))
                continue;
            cpu_prefetch_write(out + u0 * g, k * g);
            if (accumulate)
                cpu_prefetch_write(cb->tmp + u0 * g, k * g);
            if (!prepped) {
                gv->prep(w->cols, a->buf, aux);
                prepped = true;
            }
            op_gemv_rows(cb, w, a, aux, out, accumulate, u0 * g, (u0 + k) * g);
        }
    }
}

/* Share of a product's rows each thread takes as one range before the rest is shared (see op_matmul); rows
 * go in multiples of CPU_MM_UNIT (every kernel's row tile divides it), R16 weights' in multiples of 2
 * CPU_MM_UNIT (groups of 16 rows). */
#define CPU_MM_FIXED 0.75
#define CPU_MM_UNIT 24

/* out[t][r] (=|+=) dot(W[r], act[t]) for every r, this thread's part of it; `which` names the product among
 * the pass's (its counters in cb->mm_next and cb->mm_take). Decode (one activation row): op_matmul_decode
 * for R16 weights; rows-layout weights (F16, F32) in one range per thread, since the AMD F16 gemv cuts each
 * call into 4 streams (gemv_avx2.c) that chunks would cut short (1B F16 tg128 read 83% of a 51 GB/s probe
 * in 64 KiB chunks, 96-102% in one range). With several rows, each thread first takes CPU_MM_FIXED / nth of
 * the rows as one range (the gemm kernels block columns per call, so fewer calls stream the activations
 * fewer times), then the rest is claimed from the shared counter, each claim 1 / nth of what is left (at
 * least a unit): a thread whose core is busy with other work takes less of it instead of the others waiting
 * for it at the next barrier (1B F16 pp512 with a busy loop on one of two cores: 1.07-1.10x; level on a
 * quiet machine), and the claims shrink towards the end, so the threads reach the barrier within a unit of
 * each other where equal chunks (4 a thread until stop 38) left them up to a chunk apart. Measured with the
 * first group's prefetch (gemm_prefetch_first), which made the smaller claims cheap, in one build switched
 * by the environment (Zen 5, 1B Q4_K_M, `wafer bench -p 0 -n 64 -r 2 -b 8 -t 2`, alternated): 8 sequences
 * 423.5 tokens/s with equal chunks and no first prefetch, 429.9-431.4 with it, 434.8-437.9 with these
 * claims (and 414.6 with claims of one unit each: a call's setup still costs); pp512 level (560.8 / 563.9).
 * Which thread computes a row never changes its value: rows are independent. */
static void op_matmul(struct cpu_backend *cb, const struct model_weight *w, const struct cpu_act *a, int n_rows,
                      float *out, int ldo, bool accumulate, int which, int ith, int nth)
{
    int64_t r0, r1;
    /* R16 weights go in whole groups of 16 rows */
    int64_t unit = w->layout == WEIGHT_R16 ? 2 * CPU_MM_UNIT : CPU_MM_UNIT;
    if (n_rows == 1 && cb->gemv[w->type] && nth > 1 && w->layout == WEIGHT_R16) {
        op_matmul_decode(cb, w, a, out, accumulate, which, ith, nth);
        return;
    }
    if ((n_rows == 1 && cb->gemv[w->type]) || nth == 1) { /* one range per thread */
        threadpool_split(w->rows, ith, nth, &r0, &r1);
        if (r1 > r0)
            op_matmul_rows(cb, w, a, n_rows, out, ldo, accumulate, r0, r1, ith);
        return;
    }
    int64_t fixed = (int64_t)((double)w->rows * CPU_MM_FIXED / nth) / unit * unit;
    if (fixed > 0)
        op_matmul_rows(cb, w, a, n_rows, out, ldo, accumulate, ith * fixed, (ith + 1) * fixed, ith);
    int64_t pool0 = fixed * nth;
    for (;;) {
        /* a claim: 1 / nth of the shared rows left, in whole units, at least one */
        int done = __atomic_load_n(&cb->mm_next[which], __ATOMIC_RELAXED);
        int64_t k;
        do {
            int64_t left = w->rows - pool0 - done;
            if (left <= 0)
                return;
            k = left / nth / unit * unit;
            k = k < unit ? unit : k;
            k = k > left ? left : k;
        } while (!__atomic_compare_exchange_n(&cb->mm_next[which], &done, done + (int)k, true, __ATOMIC_RELAXED,
                                              __ATOMIC_RELAXED));
        op_matmul_rows(cb, w, a, n_rows, out, ldo, accumulate, pool0 + done, pool0 + done + k, ith);
    }
}

/* cos/sin of each rotation angle for position pos: cs[2i] = cos, cs[2i+1] = sin, i < head_dim / 2. The
 * angle is built by repeated float multiplication (theta_i = pos * scale^i), exactly as ggml does, so the
 * rounding matches llama.cpp's. */
static void op_rope_cache(const struct cpu_backend *cb, int pos, float *cs)
{
    int half = cb->m->hp.head_dim / 2;
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        float th = cb->rope_freq_scale * (cb->rope_ff ? theta / cb->rope_ff[i] : theta);
        cs[2 * i] = cosf(th);
        cs[2 * i + 1] = sinf(th);
        theta *= cb->rope_theta_scale;
    }
}

/* Rotates the pairs of one head vector x[head_dim] by the angles in cs. */
static void op_rope_head(const struct cpu_backend *cb, float *x, const float *cs)
{
    const struct model_hparams *hp = &cb->m->hp;
    int half = hp->head_dim / 2;
    if (hp->rope_layout == ROPE_ADJACENT) {
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * c - b * s;
            x[2 * i + 1] = a * s + b * c;
        }
    } else {
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float a = x[i], b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = a * s + b * c;
        }
    }
}

/* Thread ith's attention scratch (op_attention says its layout). */
static float *cpu_scratch(const struct cpu_backend *cb, int ith) { return cb->scratch + (size_t)ith * cb->scratch_floats; }

/* Whether a pass's tokens make one attention tile (CPU_ATT_TILE or fewer: decode, a short chunk), so
 * op_attention gives KV head h of all of them to thread h % nth, and op_rope_store gives it the same heads:
 * each thread then attends over what it stored itself, with no barrier between the two. */
static bool cpu_rope_by_head(const struct cpu_backend *cb) { return cb->b->n <= CPU_ATT_TILE; }

/* Biases, RoPE on q and k, and the k, v rows stored into each token's KV slot: tokens split over threads, or,
 * when cpu_rope_by_head, KV heads (with their query heads) as op_attention deals them. */
static void op_rope_store(struct cpu_backend *cb, const struct model_layer *L, int layer, int ith, int nth)
{
    const struct model_hparams *hp = &cb->m->hp;
    const struct batch *b = cb->b;
    int hd = hp->head_dim, q_dim = hp->n_heads * hd, kv_dim = hp->n_kv_heads * hd, group = hp->n_heads / hp->n_kv_heads;
    int64_t t0, t1;
    int h0 = 0, hstep = 1; /* KV heads h0, h0 + hstep, ... */
    if (cpu_rope_by_head(cb))
        t0 = 0, t1 = b->n, h0 = ith, hstep = nth;
    else
        threadpool_split(b->n, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const struct batch_token *bt = &b->tok[t];
        float *q = cb->q + (size_t)t * q_dim, *k = cb->k + (size_t)t * kv_dim, *v = cb->v + (size_t)t * kv_dim;
        const float *cs = cb->rope + (size_t)t * hd;
        for (int h = h0; h < hp->n_kv_heads; h += hstep) {
            float *qh = q + (size_t)h * group * hd, *kh = k + (size_t)h * hd, *vh = v + (size_t)h * hd;
            if (L->bq) {
                const float *bq = L->bq + (size_t)h * group * hd, *bk = L->bk + (size_t)h * hd, *bv = L->bv + (size_t)h * hd;
                for (int i = 0; i < group * hd; i++)
                    qh[i] += bq[i];
                for (int i = 0; i < hd; i++)
                    kh[i] += bk[i], vh[i] += bv[i];
            }
            for (int g = 0; g < group; g++)
                op_rope_head(cb, qh + (size_t)g * hd, cs);
            op_rope_head(cb, kh, cs);
        }
        const struct kv_seq *s = &cb->seqs[bt->seq];
        int32_t blk = s->blocks[bt->pos / cb->p.block_size];
        int slot = bt->pos % cb->p.block_size;
        void *kb = kv_host_k(&cb->kv, layer, blk), *vb = kv_host_v(&cb->kv, layer, blk);
        for (int h = h0; h < hp->n_kv_heads; h += hstep) {
            void *kr = kv_host_row(&cb->kv, kb, h, slot), *vr = kv_host_row(&cb->kv, vb, h, slot);
            const float *ks = k + (size_t)h * hd, *vs = v + (size_t)h * hd;
            if (cb->p.kv_type == DTYPE_F32) {
                memcpy(kr, ks, (size_t)hd * sizeof(float));
                memcpy(vr, vs, (size_t)hd * sizeof(float));
            } else if (cb->p.kv_type == DTYPE_Q8_0) {
                cb->kv_ops->from_f32(ks, kr, hd);
                cb->kv_ops->from_f32(vs, vr, hd);
            } else {
                cb->attn->to_f16(ks, kr, hd);
                cb->attn->to_f16(vs, vr, hd);
            }
        }
    }
}

/* Asks the cache hierarchy for the KV head kvh's rows of block i + 1 of s, while attention works on block i,
 * when that block does not follow block i in memory. A head's rows are one run per block (block_size rows)
 * and the runs of consecutive blocks lie side by side (kv_host.h): the hardware prefetcher streams those, and
 * asking for them cost 7-13% of decode attention at depth 3,072 (1B Q4_0, Zen 4, stop 28). A sequence's
 * blocks need not be consecutive (a shared prefix, the end of an extent, a full pool: kvcache.c); there the
 * hardware prefetcher restarts at every block. This covers the next block only in part: with every block
 * apart (decode at depth 4,064, Zen 4, stop 29) attention took 8.1-8.3 ms a token with it, 8.3-8.5 without,
 * 4.6 with consecutive blocks, and prefetching 2-6 blocks ahead was no better; hence the pool's extents. */
static void op_prefetch_block(const struct cpu_backend *cb, const struct kv_seq *s, int i, int layer, int kvh,
                              bool value)
{
    int32_t b = s->blocks[i + 1];
    if (b == s->blocks[i] + 1)
        return;
    void *blk = value ? kv_host_v(&cb->kv, layer, b) : kv_host_k(&cb->kv, layer, b);
    const char *p = kv_host_row(&cb->kv, blk, kvh, 0);
    size_t bytes = (size_t)cb->p.block_size * cb->kv_row_bytes;
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(p + o, 0, 3);
}

/* Causal attention for every (tile, KV head) pair: the KV head's `group` query heads of every token of the
 * tile together (R = tile tokens x group query rows), so each cached row is read once for all of them, over
 * positions 0..pos of each token read block by block in position order. A tile is CPU_ATT_TILE consecutive
 * batch tokens cut where the sequence changes or positions stop following each other. Pairs are dealt to
 * threads round-robin, which balances a prefill (later tokens attend to more positions).
 * Softmax in two passes per query row (max, then exp and a double sum) as attn.h defines it.
 * Rounding by cache type:
 *   F16  as llama.cpp's non-flash attention: the query is rounded to F16 for the K products, and the
 *        normalized probabilities are rounded to F16 for the V products (attn.h fixes the sum orders).
 *   F32  no rounding.
 *   Q8_0 as llama.cpp does for a Q8_0 K: the query is quantized to Q8_0 and the products are Q8_0 dot
 *        products (kernel_ops, so SIMD and scalar builds differ as they do for Q8_0 weights); V rows are
 *        dequantized and the F32 probabilities applied. (llama.cpp can only run a quantized V in its flash
 *        attention, which uses an online softmax; this stays exact and two-pass.)
 * Each query row's result depends only on its own positions, summed in a fixed order: a score is one dot
 * product (scores past a row's own position, computed for a later token of the tile, are never read), and a
 * row's V accumulation runs over its own positions in order, so tiling and batching never change a result. */
static void op_attention(struct cpu_backend *cb, int layer, int ith, int nth)
{
    const struct model_hparams *hp = &cb->m->hp;
    const struct attn_kernels *ak = cb->attn;
    const struct batch *b = cb->b;
    int hd = hp->head_dim, q_dim = hp->n_heads * hd, n_kv = hp->n_kv_heads, group = hp->n_heads / n_kv;
    int bs = cb->p.block_size;
    size_t lds = (size_t)cb->p.n_ctx;
    float scale = 1.0f / sqrtf((float)hd);
    enum dtype kt = cb->p.kv_type;
    /* scratch: scores sc [R][n_ctx], queries qr [R][hd], outputs ot [R][hd], a V block vtmp [bs][hd], quantized
     * queries qq [R][kv_row_bytes]; R = CPU_ATT_TILE * group, row r = tile token r / group, head r % group */
    int rmax = CPU_ATT_TILE * group;
    float *sc = cpu_scratch(cb, ith), *qr = sc + (size_t)rmax * lds, *ot = qr + (size_t)rmax * hd;
    float *vtmp = ot + (size_t)rmax * hd;
    uint8_t *qq = (uint8_t *)(vtmp + (size_t)bs * hd);
    int n_tiles = (b->n + CPU_ATT_TILE - 1) / CPU_ATT_TILE;
    for (int64_t pi = ith; pi < (int64_t)n_tiles * n_kv; pi += nth) {
        int kvh = (int)(pi % n_kv);
        int tile_end = (int)(pi / n_kv) * CPU_ATT_TILE + CPU_ATT_TILE;
        if (tile_end > b->n)
            tile_end = b->n;
        /* the tile's runs: consecutive tokens of one sequence at consecutive positions */
        for (int t0 = (int)(pi / n_kv) * CPU_ATT_TILE, nt; t0 < tile_end; t0 += nt) {
            const struct batch_token *bt0 = &b->tok[t0];
            for (nt = 1; t0 + nt < tile_end && b->tok[t0 + nt].seq == bt0->seq && b->tok[t0 + nt].pos == bt0->pos + nt;
                 nt++)
                ;
            const struct kv_seq *s = &cb->seqs[bt0->seq];
            int R = nt * group;
            int n_first = bt0->pos + 1, n_last = bt0->pos + nt; /* positions attended by the first, last token */
            for (int ti = 0; ti < nt; ti++) {
                const float *q = cb->q + (size_t)(t0 + ti) * q_dim + (size_t)kvh * group * hd;
                float *qt = qr + (size_t)ti * group * hd;
                if (kt == DTYPE_F16)
                    ak->round_f16(q, qt, (int64_t)group * hd);
                else if (kt == DTYPE_F32)
                    memcpy(qt, q, (size_t)group * hd * sizeof(float));
                else
                    for (int g = 0; g < group; g++)
                        cb->kv_ops->from_f32(q + (size_t)g * hd, qq + (size_t)(ti * group + g) * cb->kv_row_bytes, hd);
            }
            for (int p0 = 0; p0 < n_last; p0 += bs) {
                int n = n_last - p0 < bs ? n_last - p0 : bs;
                const void *kb = kv_host_row(&cb->kv, kv_host_k(&cb->kv, layer, s->blocks[p0 / bs]), kvh, 0);
                if (p0 + bs < n_last)
                    op_prefetch_block(cb, s, p0 / bs, layer, kvh, false);
                if (kt == DTYPE_F16) {
                    ak->scores_f16(hd, R, qr, kb, n, scale, sc + p0, lds);
                } else if (kt == DTYPE_F32) {
                    ak->scores_f32(hd, R, qr, kb, n, scale, sc + p0, lds);
                } else {
                    cb->kv_ops->gemm(hd, n, R, sc + p0, lds, kb, cb->kv_row_bytes, qq, cb->kv_row_bytes);
                    for (int r = 0; r < R; r++)
                        for (int j = 0; j < n; j++)
                            sc[(size_t)r * lds + p0 + j] *= scale;
                }
            }
            for (int r = 0; r < R; r++) {
                int n_pos = n_first + r / group;
                float *sg = sc + (size_t)r * lds;
                ak->softmax(sg, n_pos);
                if (kt == DTYPE_F16)
                    ak->round_f16(sg, sg, n_pos);
            }
            memset(ot, 0, (size_t)R * hd * sizeof(float));
            for (int p0 = 0; p0 < n_last; p0 += bs) {
                int n = n_last - p0 < bs ? n_last - p0 : bs;
                const void *vb = kv_host_row(&cb->kv, kv_host_v(&cb->kv, layer, s->blocks[p0 / bs]), kvh, 0);
                if (p0 + bs < n_last)
                    op_prefetch_block(cb, s, p0 / bs, layer, kvh, true);
                if (kt == DTYPE_Q8_0) {
                    for (int j = 0; j < n; j++)
                        cb->kv_ops->to_f32((const uint8_t *)vb + (size_t)j * cb->kv_row_bytes, vtmp + (size_t)j * hd, hd);
                    vb = vtmp;
                }
                /* a block every token of the run attends wholly: all R rows in one call; the last blocks:
                 * each token's rows over its own positions only */
                bool whole = p0 + n <= n_first;
                for (int ti = 0; ti < (whole ? 1 : nt); ti++) {
                    int rows = whole ? R : group, cnt = whole ? n : n_first + ti - p0;
                    if (cnt <= 0)
                        continue;
                    if (cnt > n)
                        cnt = n;
                    const float *pr = sc + (size_t)ti * group * lds + p0;
                    float *o = ot + (size_t)ti * group * hd;
                    if (kt == DTYPE_F16)
                        ak->accum_f16(hd, rows, pr, lds, vb, cnt, o);
                    else
                        ak->accum_f32(hd, rows, pr, lds, vb, cnt, o);
                }
            }
            for (int ti = 0; ti < nt; ti++)
                memcpy(cb->att + (size_t)(t0 + ti) * q_dim + (size_t)kvh * group * hd, ot + (size_t)ti * group * hd,
                       (size_t)group * hd * sizeof(float));
        }
    }
}

/* g = silu(g) * u for this thread's rows, then those rows converted for ops (one barrier). */
static const struct cpu_act *op_swiglu_prepare(struct cpu_backend *cb, int n_rows, const struct kernel_ops *ops, int ith,
                                                  int nth)
{
    int ffn = cb->m->hp.ffn_dim;
    int64_t r0, r1, c0, c1;
    threadpool_split(n_rows, ith, nth, &r0, &r1);
    if (op_col_share(n_rows, ffn, ith, nth, &c0, &c1)) /* the columns op_act_prepare converts here */
        kernel_swiglu(cb->hg + c0, cb->hu + c0, c1 - c0);
    else
        for (int64_t r = r0; r < r1; r++)
            kernel_swiglu(cb->hg + (size_t)r * ffn, cb->hu + (size_t)r * ffn, ffn);
    op_act_invalidate(cb, ith);
    return op_act_prepare(cb, cb->hg, n_rows, ffn, ops, ith, nth);
}

/* Token embeddings and each token's RoPE angles; tokens split over threads. */
static void op_embed(struct cpu_backend *cb, int ith, int nth)
{
    const struct model *m = cb->m;
    const struct kernel_ops *ops = cb->ops[m->tok_embd.type];
    int64_t t0, t1;
    threadpool_split(cb->b->n, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        ops->to_f32((const uint8_t *)m->tok_embd.data + (size_t)cb->b->tok[t].token * m->tok_embd.row_bytes,
                    cb->x + (size_t)t * m->hp.dim, m->hp.dim);
        op_rope_cache(cb, cb->b->tok[t].pos, cb->rope + (size_t)t * m->hp.head_dim);
    }
}

static void cpu_job(void *ctx, int ith, int nth)
{
    struct cpu_backend *cb = ctx;
    const struct model *m = cb->m;
    const struct model_hparams *hp = &m->hp;
    struct threadpool *tp = cb->tp;
    int T = cb->b->n, dim = hp->dim, q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;

    /* This thread's decode shares (op_matmul_decode), reset here rather than by the caller, so that the owner's
     * claims find the line in its own cache: reset by the calling thread, every other thread's first claim of
     * each product fetched the line from that core. Nobody reads them before the barrier below. */
    for (int i = 0; i < cb->mm_count; i++)
        atomic_store_explicit(&cb->mm_take[(size_t)i * (size_t)nth + (size_t)ith].fb, 0, memory_order_relaxed);
    op_embed(cb, ith, nth);
    threadpool_barrier(tp);
    cpu_mark(cb, ith, OP_EMBED);
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        int mm = l * CPU_MM_PER_LAYER;
        const struct cpu_act *a = op_norm_prepare(cb, L->attn_norm, T, NULL, cb->ops[L->wq.type], ith, nth);
        cpu_mark(cb, ith, OP_NORM);
        op_matmul(cb, &L->wq, a, T, cb->q, q_dim, false, mm + 0, ith, nth);
        a = op_act_prepare(cb, cb->xn, T, dim, cb->ops[L->wk.type], ith, nth);
        op_matmul(cb, &L->wk, a, T, cb->k, kv_dim, false, mm + 1, ith, nth);
        a = op_act_prepare(cb, cb->xn, T, dim, cb->ops[L->wv.type], ith, nth);
        op_matmul(cb, &L->wv, a, T, cb->v, kv_dim, false, mm + 2, ith, nth);
        threadpool_barrier(tp);
        cpu_mark(cb, ith, OP_QKV);
        op_rope_store(cb, L, l, ith, nth);
        if (!cpu_rope_by_head(cb))
            threadpool_barrier(tp);
        cpu_mark(cb, ith, OP_ROPE);
        op_attention(cb, l, ith, nth);
        op_act_invalidate(cb, ith);
        threadpool_barrier(tp);
        cpu_mark(cb, ith, OP_ATTN);
        a = op_act_prepare(cb, cb->att, T, q_dim, cb->ops[L->wo.type], ith, nth);
        cpu_mark(cb, ith, OP_ATT_CONV);
        op_matmul(cb, &L->wo, a, T, cb->x, dim, true, mm + 3, ith, nth);
        threadpool_barrier(tp);
        cpu_mark(cb, ith, OP_WO);
        a = op_norm_prepare(cb, L->ffn_norm, T, NULL, cb->ops[L->w_gate.type], ith, nth);
        cpu_mark(cb, ith, OP_NORM);
        op_matmul(cb, &L->w_gate, a, T, cb->hg, hp->ffn_dim, false, mm + 4, ith, nth);
        a = op_act_prepare(cb, cb->xn, T, dim, cb->ops[L->w_up.type], ith, nth);
        op_matmul(cb, &L->w_up, a, T, cb->hu, hp->ffn_dim, false, mm + 5, ith, nth);
        threadpool_barrier(tp);
        cpu_mark(cb, ith, OP_GATE_UP);
        a = op_swiglu_prepare(cb, T, cb->ops[L->w_down.type], ith, nth);
        cpu_mark(cb, ith, OP_SWIGLU);
        op_matmul(cb, &L->w_down, a, T, cb->x, dim, true, mm + 6, ith, nth);
        threadpool_barrier(tp);
        cpu_mark(cb, ith, OP_DOWN);
    }
    if (cb->n_logits > 0) {
        const struct cpu_act *a = op_norm_prepare(cb, m->output_norm, cb->n_logits, cb->logit_rows,
                                                  cb->ops[m->output.type], ith, nth);
        op_matmul(cb, &m->output, a, cb->n_logits, cb->logits, hp->n_vocab, false, cb->mm_count - 1, ith,
                  nth);
        cpu_mark(cb, ith, OP_OUTPUT); /* no barrier: threadpool_run waits for every thread */
    }
}

static int cpu_forward(struct backend *be, const struct backend_pass *pass, char *err)
{
    struct cpu_backend *cb = (struct cpu_backend *)be;
    cb->b = pass->b;
    cb->seqs = pass->seqs;
    cb->logit_rows = pass->logit_rows;
    cb->logits = pass->logits;
    cb->n_logits = pass->n_logits;
    cb->n_seqs_in_batch = pass->n_seqs;
    if (cb->prof_on)
        cb->prof_last = clock_now_s();
    memset(cb->mm_next, 0, (size_t)cb->mm_count * sizeof *cb->mm_next); /* threadpool_run publishes it */
    threadpool_run(cb->tp, cpu_job, cb);
    if (cb->prof_on) {
        struct cpu_prof *pr = &cb->prof[cpu_prof_kind(cb)];
        pr->passes++;
        pr->tokens += cb->b->n;
    }
    cb->b = NULL;
    return 0;
}

static int cpu_kv_alloc(struct backend *be, const struct kv_pool_params *layout, char *err)
{
    return kv_host_init(&((struct cpu_backend *)be)->kv, layout, err);
}

static void cpu_kv_copy(struct backend *be, int32_t dst, int32_t src)
{
    kv_host_copy(&((struct cpu_backend *)be)->kv, dst, src);
}

static void cpu_describe(const struct backend *be, struct backend_desc *d)
{
    const struct cpu_backend *cb = (const struct cpu_backend *)be;
    memset(d, 0, sizeof *d);
    d->name = cpu_backend_ops.name;
    d->n_threads = cb->p.n_threads;
    d->weight_bytes = cb->m->weight_bytes;
    d->kv_bytes = cb->kv.map_bytes;
    d->scratch_bytes = cb->scratch_bytes;
    memcpy(d->isa, cb->isa, sizeof d->isa);
    bool gemv = false; /* decode kernels with prefetch rules run (not --no-simd's portable ones) */
    for (int t = 0; t < DTYPE_COUNT; t++)
        gemv |= cb->gemv[t] != NULL;
    if (gemv) {
        cpu_tune_describe(d->decode_prefetch, sizeof d->decode_prefetch);
        snprintf(d->decode_prefetch_source, sizeof d->decode_prefetch_source, "%s", cpu_tune_source());
    }
}

const struct backend_ops cpu_backend_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .kv_alloc = cpu_kv_alloc,
    .kv_copy = cpu_kv_copy,
    .forward = cpu_forward,
    .describe = cpu_describe,
    .weight_layouts = cpu_weight_layouts,
};
