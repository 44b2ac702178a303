/*
 * model: binds GGUF metadata and tensors to the llama graph's weights. Everything a forward pass will read is
 * checked here once (presence, shape, type, row alignment), so the forward pass never meets a surprise and
 * errors name the tensor or key at fault.
 *
 * Tensor naming (llama.cpp's): token_embd, output_norm, output (absent: tied to token_embd), rope_freqs
 * (optional Llama 3 frequency factors), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
 * ffn_gate, ffn_up, ffn_down}.weight and, for qwen2, blk.N.attn_{q,k,v}.bias. GGUF shapes list ne[0] (the
 * contiguous input dimension) first: attn_q is ne = {dim, n_heads*head_dim}, i.e. rows = output features.
 */
#include "engine/model.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/quant.h"
#include "engine/tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Float vectors that had to be converted from another type (rare: norms are normally F32) live here. */
struct model_owned {
    struct model_owned *next;
    float data[];
};

struct model_priv {
    struct model m;
    struct model_owned *owned;
    float *rope_freqs; /* owned view or NULL */
};

static const char *const model_arch_supported = "llama, mistral, qwen2";

static int model_get_u32(const struct gguf *g, const char *arch, const char *suffix, uint32_t *out, bool required,
                         char *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(g, key, out);
    if (rc == ERR_NOT_FOUND && !required)
        return 0;
    if (rc == ERR_NOT_FOUND)
        return err_set(err, ERR_FORMAT, "missing metadata key '%s'", key);
    if (rc)
        return err_set(err, ERR_FORMAT, "metadata key '%s' has the wrong type (expected an unsigned integer)", key);
    return 0;
}

static int model_get_f32(const struct gguf *g, const char *arch, const char *suffix, float *out, char *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(g, key, out);
    if (rc == ERR_NOT_FOUND)
        return 0;
    if (rc)
        return err_set(err, ERR_FORMAT, "metadata key '%s' has the wrong type (expected a float)", key);
    return 0;
}

/* Binds a 2-D weight with ne = {cols, rows}. */
static int model_bind_weight(const struct gguf *g, const char *name, int64_t cols, int64_t rows,
                             struct model_weight *w, bool optional, char *err)
{
    const struct gguf_tensor *t = gguf_tensor_find(g, name);
    if (!t) {
        if (optional)
            return ERR_NOT_FOUND;
        return err_set(err, ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->n_dims > 2 || t->ne[0] != cols || t->ne[1] != rows)
        return err_set(err, ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)cols, (long long)rows);
    if (!dtype_is_supported(t->type))
        return err_set(err, ERR_UNSUPPORTED, "tensor '%s' has weight type %s, which wafer does not support (supported: %s)",
                       name, dtype_name(t->type), dtype_supported_list());
    w->data = t->data;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->row_bytes = dtype_row_bytes(t->type, cols);
    return 0;
}

/* A float vector of n elements; converted to F32 into owned memory when stored otherwise. */
static int model_bind_vec(struct model_priv *mp, const char *name, int64_t n, const float **out, bool optional,
                          char *err)
{
    const struct gguf_tensor *t = gguf_tensor_find(mp->m.gguf, name);
    if (!t) {
        if (optional) {
            *out = NULL;
            return 0;
        }
        return err_set(err, ERR_FORMAT, "missing tensor '%s'", name);
    }
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return err_set(err, ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)n);
    if (t->type == DTYPE_F32 && ((uintptr_t)t->data & 3) == 0) {
        *out = t->data;
        return 0;
    }
    if (!dtype_is_supported(t->type))
        return err_set(err, ERR_UNSUPPORTED, "tensor '%s' has type %s, which wafer does not support (supported: %s)",
                       name, dtype_name(t->type), dtype_supported_list());
    struct model_owned *o = malloc(sizeof *o + (size_t)n * sizeof(float));
    if (!o)
        return err_set(err, ERR_NOMEM, "out of memory converting tensor '%s'", name);
    if (quant_row_to_f32(t->type, t->data, o->data, n) != 0) {
        free(o);
        return err_set(err, ERR_UNSUPPORTED, "tensor '%s': cannot convert type %s to f32", name, dtype_name(t->type));
    }
    o->next = mp->owned;
    mp->owned = o;
    *out = o->data;
    return 0;
}

static int model_read_hparams(struct model *m, char *err)
{
    const struct gguf *g = m->gguf;
    struct model_hparams *hp = &m->hp;
    struct gguf_str s;
    if (gguf_get_str(g, "general.architecture", &s) != 0)
        return err_set(err, ERR_FORMAT, "missing metadata key 'general.architecture'");
    if (s.len >= sizeof hp->arch)
        s.len = sizeof hp->arch - 1;
    memcpy(hp->arch, s.ptr, s.len);
    hp->arch[s.len] = 0;
    if (strcmp(hp->arch, "llama") && strcmp(hp->arch, "mistral") && strcmp(hp->arch, "qwen2"))
        return err_set(err, ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)", hp->arch,
                       model_arch_supported);
    const char *a = hp->arch;
    uint32_t dim = 0, n_layers = 0, n_heads = 0, n_kv = 0, ffn = 0, ctx = 0, key_len = 0, rope_dim = 0;
    int rc;
    if ((rc = model_get_u32(g, a, "embedding_length", &dim, true, err)) ||
        (rc = model_get_u32(g, a, "block_count", &n_layers, true, err)) ||
        (rc = model_get_u32(g, a, "attention.head_count", &n_heads, true, err)) ||
        (rc = model_get_u32(g, a, "feed_forward_length", &ffn, true, err)) ||
        (rc = model_get_u32(g, a, "context_length", &ctx, false, err)) ||
        (rc = model_get_u32(g, a, "attention.head_count_kv", &n_kv, false, err)) ||
        (rc = model_get_u32(g, a, "attention.key_length", &key_len, false, err)) ||
        (rc = model_get_u32(g, a, "rope.dimension_count", &rope_dim, false, err)))
        return rc;
    if (n_kv == 0)
        n_kv = n_heads;
    if (dim == 0 || n_layers == 0 || n_heads == 0 || ffn == 0 || dim > 65536 || n_layers > 1024 || n_heads > 1024)
        return err_set(err, ERR_FORMAT, "implausible dimensions: embedding_length %u, block_count %u, head_count %u, "
                       "feed_forward_length %u", dim, n_layers, n_heads, ffn);
    if (n_heads % n_kv != 0)
        return err_set(err, ERR_FORMAT, "head_count %u is not a multiple of head_count_kv %u", n_heads, n_kv);
    hp->head_dim = key_len ? (int)key_len : (int)(dim / n_heads);
    if (!key_len && dim % n_heads)
        return err_set(err, ERR_FORMAT, "embedding_length %u is not a multiple of head_count %u", dim, n_heads);
    if (hp->head_dim % 2)
        return err_set(err, ERR_FORMAT, "head dimension %d is odd: RoPE needs pairs", hp->head_dim);
    if (rope_dim && (int)rope_dim != hp->head_dim)
        return err_set(err, ERR_UNSUPPORTED, "partial RoPE (rope.dimension_count %u < head dimension %d) is not supported",
                       rope_dim, hp->head_dim);
    hp->dim = (int)dim;
    hp->n_layers = (int)n_layers;
    hp->n_heads = (int)n_heads;
    hp->n_kv_heads = (int)n_kv;
    hp->ffn_dim = (int)ffn;
    hp->ctx_train = ctx ? (int)ctx : 2048;
    hp->norm_eps = 1e-5f;
    hp->rope_base = 10000.0f;
    if ((rc = model_get_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err)) ||
        (rc = model_get_f32(g, a, "rope.freq_base", &hp->rope_base, err)))
        return rc;
    hp->rope_layout = strcmp(a, "qwen2") ? ROPE_ADJACENT : ROPE_HALVES;
    hp->qkv_bias = !strcmp(a, "qwen2");
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (gguf_get_str(g, key, &s) == 0 && !gguf_str_eq(s, "none")) {
        if (gguf_str_eq(s, "linear")) {
            if ((rc = model_get_f32(g, a, "rope.scaling.factor", &hp->rope_scale_factor, err)))
                return rc;
        } else if (!gguf_str_eq(s, "llama3")) {
            return err_set(err, ERR_UNSUPPORTED, "rope scaling '%.*s' is not supported (supported: none, linear, llama3)",
                           (int)s.len, s.ptr);
        }
    }
    return 0;
}

bool model_load_fits_memory(uint64_t file_bytes, uint64_t mem_available)
{
    /* keep 512 MiB (and 1/16 of what is free) for the KV cache, buffers and everything else on the machine */
    uint64_t reserve = ((uint64_t)512 << 20) + mem_available / 16;
    return mem_available > reserve && file_bytes <= mem_available - reserve;
}

/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
static uint64_t model_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

struct model *model_load(const char *path, char *err) { return model_load_ex(path, false, NULL, err); }

/* Whether model_load_ex with r16 puts tensor t in the R16 layout as it reads it: one of a layer's seven
 * matrices or output (never token_embd, which is read by row), of a type r16 asks for, in whole groups of 16 rows
 * (model_relayout's rule for the matrices the model binds; a tensor this says yes to and the model then refuses
 * only fails the load). */
static bool model_r16_at_load(const bool *r16, const struct gguf_tensor *t)
{
    static const char *const mats[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    if (!r16 || !t || !r16[t->type] || !quant_r16_supported(t->type) || t->n_dims > 2 || t->ne[1] <= 0 ||
        t->ne[1] % QUANT_R16_ROWS || t->ne[2] != 1 || t->ne[3] != 1)
        return false;
    if (!strcmp(t->name, "output.weight"))
        return true;
    const char *p = t->name;
    if (strncmp(p, "blk.", 4))
        return false;
    for (p += 4; *p >= '0' && *p <= '9'; p++)
        ;
    if (p == t->name + 4 || *p++ != '.')
        return false;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        size_t n = strlen(mats[i]);
        if (!strncmp(p, mats[i], n) && !strcmp(p + n, ".weight"))
            return true;
    }
    return false;
}

/* gguf_placer for model_load_ex: ctx is the r16 array. */
static size_t model_place_unit(void *ctx, const struct gguf_tensor *t)
{
    return model_r16_at_load(ctx, t) ? QUANT_R16_ROWS * dtype_row_bytes(t->type, t->ne[0]) : 0;
}

static void model_place(void *ctx, const struct gguf_tensor *t, const void *src, void *dst, size_t n)
{
    (void)ctx;
    size_t rb = dtype_row_bytes(t->type, t->ne[0]);
    /* whole groups of a type with R16 (model_place_unit), so the conversion cannot refuse */
    (void)quant_r16_convert(t->type, src, dst, (int64_t)(n / rb), t->ne[0], true);
}

struct model *model_load_ex(const char *path, bool use_mmap, const bool *r16, char *err)
{
    struct model_priv *mp = calloc(1, sizeof *mp);
    if (!mp) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    struct model *m = &mp->m;
    char sub[ERR_MSG_MAX];
    if (!use_mmap) {
        /* Reading a file larger than the free memory into anonymous memory would end in swapping or the OOM
         * killer; mapping it lets the kernel page weights in and out. */
        struct stat st;
        uint64_t avail = model_mem_available();
        if (avail && stat(path, &st) == 0 && st.st_size > 0 && !model_load_fits_memory((uint64_t)st.st_size, avail)) {
            log_warn("%s: %.1f GB does not fit in the %.1f GB of available memory: mapping the file instead of "
                     "reading it in (decode will be slower and may page)", path, st.st_size / 1e9, avail / 1e9);
            use_mmap = true;
        }
    }
    struct gguf_placer placer = {(void *)r16, model_place_unit, model_place};
    m->gguf = use_mmap ? gguf_open(path, err) : gguf_open_mem_placed(path, r16 ? &placer : NULL, err);
    m->mapped = use_mmap;
    if (!m->gguf)
        goto fail;
    m->path = strdup(path);
    m->file_bytes = gguf_file_size(m->gguf);
    if (model_read_hparams(m, sub))
        goto fail_sub;
    struct model_hparams *hp = &m->hp;
    const struct gguf *g = m->gguf;

    const struct gguf_tensor *te = gguf_tensor_find(g, "token_embd.weight");
    if (!te) {
        err_set(sub, ERR_FORMAT, "missing tensor 'token_embd.weight'");
        goto fail_sub;
    }
    hp->n_vocab = (int)te->ne[1];
    if (model_bind_weight(g, "token_embd.weight", hp->dim, hp->n_vocab, &m->tok_embd, false, sub) ||
        model_bind_vec(mp, "output_norm.weight", hp->dim, &m->output_norm, false, sub))
        goto fail_sub;
    int rc = model_bind_weight(g, "output.weight", hp->dim, hp->n_vocab, &m->output, true, sub);
    if (!rc && !use_mmap && model_r16_at_load(r16, gguf_tensor_find(g, "output.weight")))
        m->output.layout = WEIGHT_R16;
    if (rc == ERR_NOT_FOUND) {
        m->output = m->tok_embd;
        hp->tied_output = true;
    } else if (rc) {
        goto fail_sub;
    }
    const float *rf = NULL;
    if (model_bind_vec(mp, "rope_freqs.weight", hp->head_dim / 2, &rf, true, sub))
        goto fail_sub;
    mp->rope_freqs = (float *)rf;

    int q_dim = hp->n_heads * hp->head_dim, kv_dim = hp->n_kv_heads * hp->head_dim;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers) {
        err_set(sub, ERR_NOMEM, "out of memory");
        goto fail_sub;
    }
    size_t counts[DTYPE_COUNT] = {0};
    m->weight_bytes = m->output.row_bytes * (size_t)m->output.rows;
    for (int l = 0; l < hp->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        char name[96];
#define BIND_W(field, suffix, ncols, nrows)                                                                \
    snprintf(name, sizeof name, "blk.%d." suffix ".weight", l);                                            \
    if (model_bind_weight(g, name, ncols, nrows, &L->field, false, sub))                                  \
        goto fail_sub;                                                                                     \
    if (!use_mmap && model_r16_at_load(r16, gguf_tensor_find(g, name)))                                    \
        L->field.layout = WEIGHT_R16;                                                                      \
    counts[L->field.type]++;                                                                               \
    m->weight_bytes += L->field.row_bytes * (size_t)L->field.rows;
#define BIND_V(field, suffix, kind, n, optional)                                                           \
    snprintf(name, sizeof name, "blk.%d." suffix "." kind, l);                                             \
    if (model_bind_vec(mp, name, n, &L->field, optional, sub))                                             \
        goto fail_sub;
        BIND_V(attn_norm, "attn_norm", "weight", hp->dim, false)
        BIND_W(wq, "attn_q", hp->dim, q_dim)
        BIND_W(wk, "attn_k", hp->dim, kv_dim)
        BIND_W(wv, "attn_v", hp->dim, kv_dim)
        BIND_W(wo, "attn_output", q_dim, hp->dim)
        BIND_V(ffn_norm, "ffn_norm", "weight", hp->dim, false)
        BIND_W(w_gate, "ffn_gate", hp->dim, hp->ffn_dim)
        BIND_W(w_up, "ffn_up", hp->dim, hp->ffn_dim)
        BIND_W(w_down, "ffn_down", hp->ffn_dim, hp->dim)
        BIND_V(bq, "attn_q", "bias", q_dim, !hp->qkv_bias)
        BIND_V(bk, "attn_k", "bias", kv_dim, !hp->qkv_bias)
        BIND_V(bv, "attn_v", "bias", kv_dim, !hp->qkv_bias)
#undef BIND_W
#undef BIND_V
    }
    m->main_type = DTYPE_F32;
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (counts[t] > counts[m->main_type])
            m->main_type = (enum dtype)t;

    m->tok = tokenizer_create(g, sub);
    if (!m->tok)
        goto fail_sub;
    if (tokenizer_n_vocab(m->tok) != hp->n_vocab) {
        err_set(sub, ERR_FORMAT, "tokenizer has %d tokens but token_embd.weight has %d rows", tokenizer_n_vocab(m->tok),
                hp->n_vocab);
        goto fail_sub;
    }
    struct gguf_str s;
    if (gguf_get_str(g, "tokenizer.chat_template", &s) == 0)
        m->chat_template = gguf_str_dup(s);
    if (gguf_get_str(g, "general.name", &s) == 0 && s.len > 0) {
        m->name = gguf_str_dup(s);
    } else {
        const char *base = strrchr(path, '/');
        m->name = strdup(base ? base + 1 : path);
    }
    if (!m->path || !m->name) {
        err_set(sub, ERR_NOMEM, "out of memory");
        goto fail_sub;
    }
    return m;

fail_sub:
    /* the path may be long: keep the reason whole and the path short */
    err_set(err, ERR_FORMAT, "%.200s: %.300s", path, sub);
fail:
    model_destroy(m);
    return NULL;
}

const void *model_weight_row(const struct model_weight *w, int64_t r, void *buf)
{
    if (w->layout == WEIGHT_ROWS)
        return (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    quant_r16_row(w->type, w->data, r, w->cols, buf);
    return buf;
}

/* Moves w to layout `want` in place, a group of 16 rows at a time (a group's R16 bytes lie where its rows were),
 * through a copy of the group (so the peak memory does not grow by a matrix). Its memory is writable (see
 * model_relayout). */
static int model_weight_relayout(struct model_weight *w, enum weight_layout want)
{
    size_t gbytes = QUANT_R16_ROWS * w->row_bytes;
    uint8_t *tmp = malloc(gbytes), *data = (uint8_t *)w->data;
    if (!tmp)
        return ERR_NOMEM;
    for (int64_t g = 0; g < w->rows / QUANT_R16_ROWS; g++) {
        memcpy(tmp, data + (size_t)g * gbytes, gbytes);
        /* rows % 16 and the type were checked by the caller, so the conversion cannot refuse */
        (void)quant_r16_convert(w->type, tmp, data + (size_t)g * gbytes, QUANT_R16_ROWS, w->cols, want == WEIGHT_R16);
    }
    free(tmp);
    w->layout = want;
    return 0;
}

/* A thread's share of model_relayout: matrices first, first + step, ... of the list. */
struct model_relayout_job {
    struct model_weight **ws;
    enum weight_layout *want;
    int n, first, step, rc;
};

static void *model_relayout_run(void *arg)
{
    struct model_relayout_job *j = arg;
    for (int i = j->first; i < j->n && !j->rc; i += j->step)
        j->rc = model_weight_relayout(j->ws[i], j->want[i]);
    return NULL;
}

int model_relayout(const struct model *cm, const bool r16[DTYPE_COUNT])
{
    /* the model is const to its readers; its layout is the one thing a backend may change, here */
    struct model *m = (struct model *)cm;
    int n = 7 * m->hp.n_layers + (m->hp.tied_output ? 0 : 1), nc = 0, rc = 0;
    struct model_weight **ws = malloc(sizeof *ws * (size_t)n);
    enum weight_layout *want = malloc(sizeof *want * (size_t)n);
    if (!ws || !want) {
        rc = ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < n; i++) { /* the matrices that change */
        struct model_layer *L = &m->layers[i < 7 * m->hp.n_layers ? i / 7 : 0];
        struct model_weight *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        struct model_weight *w = i < 7 * m->hp.n_layers ? lw[i % 7] : &m->output;
        enum weight_layout to =
            r16[w->type] && quant_r16_supported(w->type) && w->rows % QUANT_R16_ROWS == 0 ? WEIGHT_R16 : WEIGHT_ROWS;
        if (to != w->layout)
            ws[nc] = w, want[nc++] = to;
    }
    if (nc == 0)
        goto out;
    rc = m->layout_holders > 0 ? ERR_UNAVAILABLE : m->mapped ? ERR_UNSUPPORTED : gguf_set_writable(m->gguf, true);
    if (rc)
        goto out;
    /* two threads, each every other matrix (1B Q4_0 on a Zen 5: loading takes 100-130 ms instead of 67-83
     * without the re-layout; 140-530 when quant_r16_convert copied 4 bytes at a time) */
    struct model_relayout_job jobs[2] = {{ws, want, nc, 0, 2, 0}, {ws, want, nc, 1, 2, 0}};
    pthread_t th;
    bool two = nc > 1 && pthread_create(&th, NULL, model_relayout_run, &jobs[1]) == 0;
    if (!two)
        jobs[0].step = 1; /* this thread does them all */
    model_relayout_run(&jobs[0]);
    if (two)
        pthread_join(th, NULL);
    rc = jobs[0].rc ? jobs[0].rc : jobs[1].rc;
    (void)gguf_set_writable(m->gguf, false);
out:
    free(ws);
    free(want);
    return rc;
}

void model_layout_hold(const struct model *m) { ((struct model *)m)->layout_holders++; }

void model_layout_release(const struct model *m) { ((struct model *)m)->layout_holders--; }

void model_destroy(struct model *m)
{
    if (!m)
        return;
    struct model_priv *mp = (struct model_priv *)m;
    while (mp->owned) {
        struct model_owned *n = mp->owned->next;
        free(mp->owned);
        mp->owned = n;
    }
    if (m->tok)
        tokenizer_destroy(m->tok);
    gguf_close(m->gguf);
    free(m->layers);
    free(m->path);
    free(m->name);
    free(m->chat_template);
    free(mp);
}

const float *model_rope_freqs(const struct model *m) { return ((const struct model_priv *)m)->rope_freqs; }

int model_describe(const struct model *m, char *buf, size_t cap)
{
    const struct model_hparams *hp = &m->hp;
    size_t params = (size_t)hp->n_vocab * hp->dim * (hp->tied_output ? 1 : 2);
    size_t per_layer = (size_t)hp->dim * (hp->n_heads + 2 * hp->n_kv_heads) * hp->head_dim +
                       (size_t)hp->n_heads * hp->head_dim * hp->dim + 3 * (size_t)hp->dim * hp->ffn_dim + 2 * hp->dim;
    params += per_layer * hp->n_layers + hp->dim;
    size_t counts[DTYPE_COUNT] = {0};
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        counts[L->wq.type]++, counts[L->wk.type]++, counts[L->wv.type]++, counts[L->wo.type]++;
        counts[L->w_gate.type]++, counts[L->w_up.type]++, counts[L->w_down.type]++;
    }
    char types[256] = "";
    size_t tl = 0;
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (counts[t])
            tl += (size_t)snprintf(types + tl, sizeof types - tl, "%s%s x%zu", tl ? ", " : "", dtype_name((enum dtype)t),
                                   counts[t]);
    return snprintf(buf, cap,
                    "model:          %s\n"
                    "file:           %s (%.1f MiB)\n"
                    "architecture:   %s\n"
                    "parameters:     %.1f M\n"
                    "dimensions:     dim %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d\n"
                    "context:        %d (training)\n"
                    "rope:           base %g, %s pairs%s\n"
                    "norm eps:       %g\n"
                    "vocabulary:     %d tokens, %s tokenizer (pre: %s), bos %d, eos %d\n"
                    "weights:        %s (matrices: %s); token_embd %s, output %s%s\n"
                    "weight bytes:   %.1f MiB read per token\n"
                    "chat template:  %s\n",
                    m->name, m->path, m->file_bytes / 1048576.0, hp->arch, params / 1e6, hp->dim, hp->n_layers,
                    hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->ffn_dim, hp->ctx_train, hp->rope_base,
                    hp->rope_layout == ROPE_ADJACENT ? "adjacent" : "half-split",
                    model_rope_freqs(m) ? ", llama3 frequency factors" : (hp->rope_scale_factor > 0 ? ", linear scaling" : ""),
                    hp->norm_eps, hp->n_vocab, tokenizer_model_name(m->tok), tokenizer_pre_name(m->tok),
                    tokenizer_bos(m->tok), tokenizer_eos(m->tok), dtype_name(m->main_type), types,
                    dtype_name(m->tok_embd.type), dtype_name(m->output.type), hp->tied_output ? " (tied)" : "",
                    m->weight_bytes / 1048576.0, m->chat_template ? "present" : "absent");
}
