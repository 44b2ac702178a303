/*
 * model_gen: random-weight GGUF writer (see model_gen.h). Each tensor's rows are split among plain threads
 * started for it (fork, join): the file format layer does not use the compute backend's thread pool, and the
 * cost of starting threads is nothing next to generating and quantizing a tensor.
 */
#include "engine/gguf/model_gen.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void model_gen_params_default(struct model_gen_params *p)
{
    memset(p, 0, sizeof *p);
    p->arch = "llama";
    p->ctx = 2048;
    p->ftype = FTYPE_F32;
    p->std = 0.02f;
    p->rope_base = 10000.0f;
    p->seed = 1;
}

struct model_gen_job {
    enum dtype type;
    int64_t ne0, rows;
    size_t row_bytes;
    uint8_t *out;
    uint64_t seed;
    int tensor;
    float std, mean;
    atomic_int fail;
};

#define MODEL_GEN_MAX_THREADS 256

static uint64_t model_gen_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Standard normal pair by Box-Muller from a splitmix64 stream. */
static void model_gen_row(float *dst, int64_t n, uint64_t state, float mean, float std)
{
    for (int64_t i = 0; i < n; i += 2) {
        state = model_gen_mix(state);
        double u1 = ((state >> 11) + 1.0) * 0x1p-53;
        state = model_gen_mix(state);
        double u2 = (state >> 11) * 0x1p-53;
        double r = sqrt(-2.0 * log(u1));
        dst[i] = mean + std * (float)(r * cos(2 * M_PI * u2));
        if (i + 1 < n)
            dst[i + 1] = mean + std * (float)(r * sin(2 * M_PI * u2));
    }
}

/* Rows [rows * ith / nth, rows * (ith + 1) / nth) of the job's tensor. */
static void model_gen_share(struct model_gen_job *j, int ith, int nth)
{
    float *row = malloc((size_t)j->ne0 * sizeof *row);
    if (!row) {
        atomic_store(&j->fail, 1);
        return;
    }
    int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        model_gen_row(row, j->ne0, model_gen_mix(j->seed ^ model_gen_mix(((uint64_t)j->tensor << 40) ^ (uint64_t)r)),
                      j->mean, j->std);
        if (quant_row_from_f32(j->type, row, j->out + (size_t)r * j->row_bytes, j->ne0))
            atomic_store(&j->fail, 1);
    }
    free(row);
}

struct model_gen_thread_arg {
    struct model_gen_job *job;
    int ith, nth;
};

static void *model_gen_thread(void *p)
{
    struct model_gen_thread_arg *a = p;
    model_gen_share(a->job, a->ith, a->nth);
    return NULL;
}

/* Generates the job's tensor on nth threads, the caller being thread 0; a share whose thread could not be
 * started is done by the caller. The rows, and so the file, do not depend on nth. */
static void model_gen_run(struct model_gen_job *j, int nth)
{
    pthread_t tid[MODEL_GEN_MAX_THREADS];
    struct model_gen_thread_arg arg[MODEL_GEN_MAX_THREADS];
    bool started[MODEL_GEN_MAX_THREADS] = {false};
    for (int i = 1; i < nth; i++) {
        arg[i] = (struct model_gen_thread_arg){.job = j, .ith = i, .nth = nth};
        started[i] = pthread_create(&tid[i], NULL, model_gen_thread, &arg[i]) == 0;
    }
    model_gen_share(j, 0, nth);
    for (int i = 1; i < nth; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            model_gen_share(j, i, nth);
    }
}

static int model_gen_threads(int asked)
{
    long n = asked > 0 ? asked : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MODEL_GEN_MAX_THREADS ? MODEL_GEN_MAX_THREADS : (int)n;
}

struct model_tensor_decl {
    char name[64];
    uint32_t n_dims;
    int64_t ne[2];
    enum dtype type;
    bool is_norm;
};

int model_gen_write(const struct model_gen_params *p, const char *out_path, char *err)
{
    const char *arch = p->arch;
    long dim = p->dim, layers = p->layers, heads = p->heads, kv_heads = p->kv_heads ? p->kv_heads : p->heads, ffn = p->ffn;
    enum ftype ft = p->ftype;
    bool tied = p->tied, pure = p->pure;
    if (strcmp(arch, "llama") && strcmp(arch, "qwen2"))
        return err_set(err, ERR_INVALID_ARG, "architecture '%s' cannot be generated (llama, qwen2)", arch);
    if (dim <= 0 || layers <= 0 || heads <= 0 || ffn <= 0 || dim % heads || heads % kv_heads || (dim / heads) % 2)
        return err_set(err, ERR_INVALID_ARG, "dim must be a multiple of heads, heads a multiple of kv_heads, and the head "
                       "size (dim/heads) even (dim %ld, heads %ld, kv_heads %ld)", dim, heads, kv_heads);
    int rc = ERR_NOMEM;
    bool started = false;
    struct gguf *vg = NULL;
    struct gguf_writer *w = NULL;
    struct model_tensor_decl *decl = NULL;
    uint8_t *buf = NULL;
    char sub[ERR_MSG_MAX];
    vg = gguf_open(p->vocab_from, sub);
    if (!vg) {
        rc = err_set(err, ERR_IO, "vocabulary: %s", sub);
        goto out;
    }
    const struct gguf_kv *tokens_kv;
    if (gguf_get_arr(vg, "tokenizer.ggml.tokens", &tokens_kv) || tokens_kv->arr_type != GGUF_TYPE_STRING) {
        rc = err_set(err, ERR_FORMAT, "%s has no tokenizer.ggml.tokens list", p->vocab_from);
        goto out;
    }
    int64_t n_vocab = (int64_t)tokens_kv->arr_len;
    long hd = dim / heads;
    w = gguf_writer_create();
    if (!w)
        goto oom;
    int n_threads = model_gen_threads(p->threads);
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    int e = 0;
    e |= gguf_writer_set_str(w, "general.architecture", arch);
    snprintf(sub, sizeof sub, "wafer random %s d%ld l%ld %s", arch, dim, layers, ftype_name(ft));
    e |= gguf_writer_set_str(w, "general.name", sub);
    e |= gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
    e |= gguf_writer_set_u32(w, "general.quantization_version", 2);
    e |= gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)p->ctx);
    e |= gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)dim);
    e |= gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)layers);
    e |= gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)ffn);
    e |= gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)heads);
    e |= gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)kv_heads);
    e |= gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    e |= gguf_writer_set_f32(w, KEY("rope.freq_base"), p->rope_base);
    e |= gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    e |= gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)n_vocab);
#undef KEY
    for (int64_t i = 0; i < gguf_kv_count(vg); i++) {
        const struct gguf_kv *kv = gguf_kv_at(vg, i);
        if (kv->key.len > 10 && !memcmp(kv->key.ptr, "tokenizer.", 10))
            e |= gguf_writer_copy_kv(w, kv);
    }
    if (e)
        goto oom;
    /* tensor list */
    int max_t = 3 + (int)layers * 12, n_t = 0;
    decl = calloc((size_t)max_t, sizeof *decl);
    if (!decl)
        goto oom;
#define ADD(nm, d0, d1, nd, norm)                                                                          \
    do {                                                                                                   \
        struct model_tensor_decl *t_ = &decl[n_t++];                                                       \
        snprintf(t_->name, sizeof t_->name, "%s", nm);                                                     \
        t_->ne[0] = d0, t_->ne[1] = d1, t_->n_dims = nd, t_->is_norm = norm;                               \
    } while (0)
    char nm[64];
    ADD("token_embd.weight", dim, n_vocab, 2, false);
    ADD("output_norm.weight", dim, 1, 1, true);
    if (!tied)
        ADD("output.weight", dim, n_vocab, 2, false);
    bool qwen = !strcmp(arch, "qwen2");
    for (long l = 0; l < layers; l++) {
#define LADD(suffix, d0, d1, nd, norm)                                                                     \
    do {                                                                                                   \
        snprintf(nm, sizeof nm, "blk.%ld.%s", l, suffix);                                                  \
        ADD(nm, d0, d1, nd, norm);                                                                         \
    } while (0)
        LADD("attn_norm.weight", dim, 1, 1, true);
        LADD("attn_q.weight", dim, heads * hd, 2, false);
        LADD("attn_k.weight", dim, kv_heads * hd, 2, false);
        LADD("attn_v.weight", dim, kv_heads * hd, 2, false);
        if (qwen) {
            LADD("attn_q.bias", heads * hd, 1, 1, false);
            LADD("attn_k.bias", kv_heads * hd, 1, 1, false);
            LADD("attn_v.bias", kv_heads * hd, 1, 1, false);
        }
        LADD("attn_output.weight", heads * hd, dim, 2, false);
        LADD("ffn_norm.weight", dim, 1, 1, true);
        LADD("ffn_gate.weight", dim, ffn, 2, false);
        LADD("ffn_up.weight", dim, ffn, 2, false);
        LADD("ffn_down.weight", ffn, dim, 2, false);
#undef LADD
    }
#undef ADD
    size_t max_bytes = 0;
    for (int i = 0; i < n_t; i++) {
        struct model_tensor_decl *t = &decl[i];
        t->type = ftype_tensor_type(ft, t->name, t->n_dims, t->ne[0], (int)layers, tied, pure, NULL);
        int idx = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
        if (idx < 0) {
            rc = err_set(err, idx, "cannot declare tensor %s", t->name);
            goto out;
        }
        size_t nb = dtype_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
        if (nb > max_bytes)
            max_bytes = nb;
    }
    buf = malloc(max_bytes);
    if (!buf)
        goto oom;
    if ((rc = gguf_writer_begin(w, out_path, err)))
        goto out;
    started = true;
    double t0 = clock_now_s();
    for (int i = 0; i < n_t; i++) {
        struct model_tensor_decl *t = &decl[i];
        struct model_gen_job job = {
            .type = t->type,
            .ne0 = t->ne[0],
            .rows = t->ne[1],
            .row_bytes = dtype_row_bytes(t->type, t->ne[0]),
            .out = buf,
            .seed = p->seed,
            .tensor = i,
            .std = t->is_norm ? 0.1f : p->std,
            .mean = t->is_norm ? 1.0f : 0.0f,
        };
        model_gen_run(&job, n_threads);
        if (atomic_load(&job.fail)) {
            rc = err_set(err, ERR_UNSUPPORTED, "cannot quantize %s to %s", t->name, dtype_name(t->type));
            goto out;
        }
        if ((rc = gguf_writer_write_tensor(w, i, buf, job.row_bytes * (size_t)job.rows, err)))
            goto out;
        if (p->progress && (i == n_t - 1 || i % 10 == 0))
            fprintf(stderr, "\r[%d/%d] %-28s %-5s %.1f s", i + 1, n_t, t->name, dtype_name(t->type), clock_now_s() - t0);
    }
    if (p->progress)
        fputc('\n', stderr);
    if ((rc = gguf_writer_finish(w, err)))
        goto out;
    log_info("wrote %s: %s, dim %ld, %ld layers, %ld heads (%ld kv), ffn %ld, vocab %lld, %s", out_path, arch, dim,
             layers, heads, kv_heads, ffn, (long long)n_vocab, ftype_name(ft));
    rc = 0;
    goto out;
oom:
    rc = err_set(err, ERR_NOMEM, "out of memory");
out:
    if (rc && started)
        unlink(out_path);
    free(buf);
    free(decl);
    gguf_writer_destroy(w);
    gguf_close(vg);
    return rc;
}
