/*
 * Engine tests, through both backends (cpu, scalar) where the check is about the forward pass: greedy
 * output equals llama.cpp's golden tokens (stories260K, from llama.cpp's GGUF and from our own llama2.c
 * conversion); logits equal a plain scalar reference forward pass written here (weights dequantized with
 * quant_row_to_f32, float math, textbook attention) for every weight type; batch invariance (bit-identical
 * logits alone or in any batch, any thread count); KV prefix sharing with copy on write (the backend's block
 * copy); precise errors for bad batches and a full KV cache. test_backend.c compares the backends.
 */
#include "testutil.h"

#include "core/err.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/llama2c.h"
#include "engine/gguf/model_gen.h"
#include "engine/gguf/quant.h"
#include "engine/tokenizer/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- golden greedy continuations ---- */

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void golden_check(const char *model_path, const char *golden_path, enum dtype kv_type, const char *backend)
{
    char err[ERR_MSG_MAX];
    struct model *m = model_load(model_path, err);
    if (!m)
        fail_msg("%s", err);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.kv_type = kv_type;
    ep.n_threads = 2;
    ep.backend = backend;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    json_error_t je;
    json_t *root = json_load_file(golden_path, 0, &je);
    assert_non_null(root);
    json_t *entries = json_object_get(root, "entries");
    assert_true(json_array_size(entries) >= 1);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    struct batch b;
    assert_int_equal(batch_init(&b, 512), 0);
    size_t i;
    json_t *ent;
    json_array_foreach(entries, i, ent) {
        json_t *p = json_object_get(ent, "prompt_token_ids"), *g = json_object_get(ent, "generated_token_ids");
        size_t np = json_array_size(p), ng = json_array_size(g);
        assert_true(np > 0 && ng > 0);
        engine_seq_truncate(e, 0, 0);
        batch_clear(&b);
        for (size_t k = 0; k < np; k++)
            batch_add(&b, (int32_t)json_integer_value(json_array_get(p, k)), (int32_t)k, 0, k + 1 == np);
        assert_int_equal(engine_forward(e, &b, logits, err), 0);
        for (size_t k = 0; k < ng; k++) {
            int want = (int)json_integer_value(json_array_get(g, k));
            int got = argmax(logits, m->hp.n_vocab);
            if (got != want)
                fail_msg("%s, %s backend, kv %s, prompt %zu ('%s'): generated token %zu is %d, llama.cpp gave %d",
                         model_path, backend, dtype_name(kv_type), i, json_string_value(json_object_get(ent, "prompt")),
                         k, got, want);
            batch_clear(&b);
            batch_add(&b, got, (int32_t)(np + k), 0, true);
            assert_int_equal(engine_forward(e, &b, logits, err), 0);
        }
    }
    json_decref(root);
    batch_deinit(&b);
    free(logits);
    engine_destroy(e);
    model_destroy(m);
}

static void test_golden_stories_gguf(void **state)
{
    (void)state;
    const char *model = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.gguf");
    const char *golden = TEST_SHARED_OR_SKIP("golden/stories260K_greedy.json");
    golden_check(model, golden, DTYPE_F16, "cpu");
    golden_check(model, golden, DTYPE_F32, "cpu");
    golden_check(model, golden, DTYPE_F16, "scalar");
    golden_check(model, golden, DTYPE_F32, "scalar");
}

static void test_golden_stories_llama2c(void **state)
{
    (void)state;
    const char *bin = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.bin");
    const char *tok = TEST_SHARED_OR_SKIP("models/stories260K/tok512.bin");
    const char *golden = TEST_SHARED_OR_SKIP("golden/stories260K_greedy.json");
    const char *out = test_tmp_path("stories260K-converted.gguf");
    char err[ERR_MSG_MAX];
    if (llama2c_convert(bin, tok, out, err))
        fail_msg("%s", err);
    golden_check(out, golden, DTYPE_F16, "cpu");
    golden_check(out, golden, DTYPE_F16, "scalar");
    /* the converted vocabulary tokenizes every golden prompt as llama.cpp's conversion does */
    struct model *m = model_load(out, err);
    assert_non_null(m);
    json_error_t je;
    json_t *root = json_load_file(golden, 0, &je);
    size_t i;
    json_t *ent;
    json_array_foreach(json_object_get(root, "entries"), i, ent) {
        const char *prompt = json_string_value(json_object_get(ent, "prompt"));
        json_t *want = json_object_get(ent, "prompt_token_ids");
        int32_t ids[256];
        int n = tokenizer_encode(m->tok, prompt, strlen(prompt), true, false, ids, 256);
        assert_int_equal(n, (int)json_array_size(want));
        for (int k = 0; k < n; k++)
            assert_int_equal(ids[k], json_integer_value(json_array_get(want, (size_t)k)));
    }
    json_decref(root);
    model_destroy(m);
}

/* Memory mode falls back to mapping when the file would not leave 512 MiB + 1/16 of the available memory. */
static void test_load_fits_memory(void **state)
{
    (void)state;
    const uint64_t G = (uint64_t)1 << 30, M = (uint64_t)1 << 20;
    assert_true(model_load_fits_memory(640 * M, 20 * G));
    assert_true(model_load_fits_memory(16 * G, 20 * G));     /* 20 - 0.5 - 1.25 = 18.25 GiB allowed */
    assert_false(model_load_fits_memory(19 * G, 20 * G));
    assert_false(model_load_fits_memory(100 * M, 512 * M)); /* nothing left after the reserve */
    assert_false(model_load_fits_memory(1, 0));
    assert_true(model_load_fits_memory(1 * G, 2 * G));       /* 2 - 0.5 - 0.125 = 1.375 GiB allowed */
    assert_false(model_load_fits_memory(1450 * M, 2 * G));
}

static void test_llama2c_truncated(void **state)
{
    (void)state;
    const char *bin = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.bin");
    const char *tok = TEST_SHARED_OR_SKIP("models/stories260K/tok512.bin");
    size_t len;
    char *data = test_read_file(bin, &len);
    assert_non_null(data);
    const char *cut = test_tmp_path("cut.bin");
    FILE *f = fopen(cut, "wb");
    fwrite(data, 1, len - 100, f);
    fclose(f);
    free(data);
    char err[ERR_MSG_MAX];
    assert_int_equal(llama2c_convert(cut, tok, test_tmp_path("cut.gguf"), err), ERR_FORMAT);
    assert_non_null(strstr(err, "the header implies"));
    /* tokenizer of the wrong vocabulary size */
    assert_int_equal(llama2c_convert(bin, bin, test_tmp_path("cut2.gguf"), err), ERR_FORMAT);
}

/* ---- a plain scalar reference forward pass ---- */

/* A dequantized weight matrix and the format its activations are rounded through before the product when
 * the reference mimics llama.cpp's quantized activations (Q8_0 for Q8_0/Q4_0, Q8_K for Q4_K/Q6_K). */
struct ref_w {
    float *w;
    enum dtype act;
};

struct ref_model {
    bool round_act; /* round activations like the engine (and llama.cpp) do */
    bool round_kv;  /* round K and V through F16 like an F16 KV cache */
    int dim, n_layers, n_heads, n_kv, hd, ffn, n_vocab;
    float eps, base;
    bool halves;
    float *embd, *out_norm;
    struct ref_w out;
    struct {
        float *an, *fn, *bq, *bk, *bv;
        struct ref_w wq, wk, wv, wo, wg, wu, wd;
    } L[8];
};

static enum dtype ref_act_type(enum dtype t)
{
    switch (t) {
    case DTYPE_F16: return DTYPE_F16;
    case DTYPE_BF16: return DTYPE_BF16;
    case DTYPE_Q8_0:
    case DTYPE_Q4_0: return DTYPE_Q8_0;
    case DTYPE_Q4_K:
    case DTYPE_Q6_K: return DTYPE_Q8_K;
    default: return DTYPE_F32;
    }
}

static float *ref_tensor_t(const struct gguf *g, const char *name, int64_t n, enum dtype *type)
{
    const struct gguf_tensor *t = gguf_tensor_find(g, name);
    if (!t)
        return NULL;
    if (type)
        *type = t->type;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    int64_t rows = n / t->ne[0];
    for (int64_t r = 0; r < rows; r++)
        assert_int_equal(quant_row_to_f32(t->type, (const uint8_t *)t->data + r * dtype_row_bytes(t->type, t->ne[0]),
                                          x + r * t->ne[0], t->ne[0]), 0);
    return x;
}

static float *ref_tensor(const struct gguf *g, const char *name, int64_t n) { return ref_tensor_t(g, name, n, NULL); }

static struct ref_w ref_weight(const struct gguf *g, const char *name, int64_t n)
{
    enum dtype t = DTYPE_F32;
    struct ref_w w;
    w.w = ref_tensor_t(g, name, n, &t);
    w.act = ref_act_type(t);
    return w;
}

static void ref_load(struct ref_model *r, const struct model *m)
{
    const struct gguf *g = m->gguf;
    const struct model_hparams *hp = &m->hp;
    r->dim = hp->dim, r->n_layers = hp->n_layers, r->n_heads = hp->n_heads, r->n_kv = hp->n_kv_heads;
    r->hd = hp->head_dim, r->ffn = hp->ffn_dim, r->n_vocab = hp->n_vocab, r->eps = hp->norm_eps;
    r->base = hp->rope_base, r->halves = hp->rope_layout == ROPE_HALVES;
    assert_true(r->n_layers <= 8);
    int q = r->n_heads * r->hd, kv = r->n_kv * r->hd;
    r->embd = ref_tensor(g, "token_embd.weight", (int64_t)r->n_vocab * r->dim);
    r->out_norm = ref_tensor(g, "output_norm.weight", r->dim);
    r->out = ref_weight(g, "output.weight", (int64_t)r->n_vocab * r->dim);
    if (!r->out.w)
        r->out = ref_weight(g, "token_embd.weight", (int64_t)r->n_vocab * r->dim);
    char n[64];
#define LT(field, suffix, count)                                                                           \
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                                         \
    r->L[l].field = ref_tensor(g, n, count);
#define LW(field, suffix, count)                                                                           \
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                                         \
    r->L[l].field = ref_weight(g, n, count);
    for (int l = 0; l < r->n_layers; l++) {
        LT(an, "attn_norm.weight", r->dim) LW(wq, "attn_q.weight", (int64_t)q * r->dim)
        LW(wk, "attn_k.weight", (int64_t)kv * r->dim) LW(wv, "attn_v.weight", (int64_t)kv * r->dim)
        LW(wo, "attn_output.weight", (int64_t)r->dim * q) LT(fn, "ffn_norm.weight", r->dim)
        LW(wg, "ffn_gate.weight", (int64_t)r->ffn * r->dim) LW(wu, "ffn_up.weight", (int64_t)r->ffn * r->dim)
        LW(wd, "ffn_down.weight", (int64_t)r->dim * r->ffn) LT(bq, "attn_q.bias", q) LT(bk, "attn_k.bias", kv)
        LT(bv, "attn_v.bias", kv)
    }
#undef LT
#undef LW
}

static void ref_free(struct ref_model *r)
{
    free(r->embd), free(r->out_norm), free(r->out.w);
    for (int l = 0; l < r->n_layers; l++) {
        free(r->L[l].an), free(r->L[l].wq.w), free(r->L[l].wk.w), free(r->L[l].wv.w), free(r->L[l].wo.w);
        free(r->L[l].fn), free(r->L[l].wg.w), free(r->L[l].wu.w), free(r->L[l].wd.w);
        free(r->L[l].bq), free(r->L[l].bk), free(r->L[l].bv);
    }
}

/* Rounds activations x[n] as llama.cpp's x86 CPU backend does before a product with weights whose
 * activation format is act: F16 / BF16 rounding; Q8_0: blocks of 32, scale 127 / amax, ties to even, the
 * scale itself stored as F16; Q8_K: blocks of 256, scale -127 / (signed extreme), ties to even, clamped at 127.
 * Written here from that description, independently of the engine's kernels. */
static void ref_round_act(enum dtype act, float *x, int n)
{
    if (act == DTYPE_F16 || act == DTYPE_BF16) {
        for (int i = 0; i < n; i++)
            x[i] = act == DTYPE_F16 ? fp16_to_f32(f32_to_fp16(x[i])) : bf16_to_f32(f32_to_bf16(x[i]));
        return;
    }
    int bs = act == DTYPE_Q8_0 ? 32 : 256;
    for (int b = 0; b < n; b += bs) {
        float amax = 0, max = 0;
        for (int i = b; i < b + bs; i++)
            if (fabsf(x[i]) > amax)
                amax = fabsf(x[i]), max = x[i];
        if (amax == 0)
            continue;
        if (act == DTYPE_Q8_0) {
            float id = 127.0f / amax, d = fp16_to_f32(f32_to_fp16(amax / 127.0f));
            for (int i = b; i < b + bs; i++)
                x[i] = d * nearbyintf(x[i] * id);
        } else {
            float is = -127.0f / max;
            for (int i = b; i < b + bs; i++)
                x[i] = fminf(nearbyintf(is * x[i]), 127.0f) * (1.0f / is);
        }
    }
}

/* y = W x in double. With round_act, x is first rounded through the weight's activation format. */
static void ref_matvec(const struct ref_model *rm, struct ref_w w, const float *x, float *y, int rows, int cols)
{
    float *xr = malloc((size_t)cols * sizeof *xr);
    memcpy(xr, x, (size_t)cols * sizeof *xr);
    if (rm->round_act && w.act != DTYPE_F32)
        ref_round_act(w.act, xr, cols);
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += (double)w.w[(size_t)r * cols + c] * xr[c];
        y[r] = (float)s;
    }
    free(xr);
}

static void ref_rmsnorm(const float *x, const float *w, float *y, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = (float)(x[i] * s * w[i]);
}

static void ref_rope(float *v, int hd, int pos, float base, bool halves)
{
    for (int i = 0; i < hd / 2; i++) {
        double th = pos * pow(base, -2.0 * i / hd);
        int a = halves ? i : 2 * i, b = halves ? i + hd / 2 : 2 * i + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = (float)(x0 * cos(th) - x1 * sin(th));
        v[b] = (float)(x0 * sin(th) + x1 * cos(th));
    }
}

/* Logits of every position of toks[0..n): out[n][n_vocab]. */
static void ref_forward(const struct ref_model *r, const int32_t *toks, int n, float *out)
{
    int D = r->dim, q_dim = r->n_heads * r->hd, kv_dim = r->n_kv * r->hd;
    float *x = calloc((size_t)n * D, 4), *xn = malloc((size_t)D * 4), *q = malloc((size_t)q_dim * 4);
    float *K = malloc((size_t)n * kv_dim * 4), *V = malloc((size_t)n * kv_dim * 4), *att = malloc((size_t)q_dim * 4);
    float *tmp = malloc((size_t)(D > r->ffn ? D : r->ffn) * 4), *g = malloc((size_t)r->ffn * 4), *u = malloc((size_t)r->ffn * 4);
    double *sc = malloc((size_t)n * sizeof(double));
    for (int t = 0; t < n; t++)
        memcpy(x + (size_t)t * D, r->embd + (size_t)toks[t] * D, (size_t)D * 4);
    for (int l = 0; l < r->n_layers; l++) {
        for (int t = 0; t < n; t++) { /* K, V of every position first (causal attention reads them) */
            ref_rmsnorm(x + (size_t)t * D, r->L[l].an, xn, D, r->eps);
            ref_matvec(r, r->L[l].wk, xn, K + (size_t)t * kv_dim, kv_dim, D);
            ref_matvec(r, r->L[l].wv, xn, V + (size_t)t * kv_dim, kv_dim, D);
            for (int i = 0; r->L[l].bk && i < kv_dim; i++)
                K[(size_t)t * kv_dim + i] += r->L[l].bk[i], V[(size_t)t * kv_dim + i] += r->L[l].bv[i];
            for (int h = 0; h < r->n_kv; h++)
                ref_rope(K + (size_t)t * kv_dim + h * r->hd, r->hd, t, r->base, r->halves);
            for (int i = 0; r->round_kv && i < kv_dim; i++) {
                K[(size_t)t * kv_dim + i] = fp16_to_f32(f32_to_fp16(K[(size_t)t * kv_dim + i]));
                V[(size_t)t * kv_dim + i] = fp16_to_f32(f32_to_fp16(V[(size_t)t * kv_dim + i]));
            }
        }
        for (int t = 0; t < n; t++) {
            float *xt = x + (size_t)t * D;
            ref_rmsnorm(xt, r->L[l].an, xn, D, r->eps);
            ref_matvec(r, r->L[l].wq, xn, q, q_dim, D);
            for (int i = 0; r->L[l].bq && i < q_dim; i++)
                q[i] += r->L[l].bq[i];
            for (int h = 0; h < r->n_heads; h++) {
                float *qh = q + h * r->hd;
                ref_rope(qh, r->hd, t, r->base, r->halves);
                for (int i = 0; r->round_kv && i < r->hd; i++) /* llama.cpp: Q in F16 against an F16 cache */
                    qh[i] = fp16_to_f32(f32_to_fp16(qh[i]));
                int kvh = h / (r->n_heads / r->n_kv);
                double mx = -1e300, sum = 0;
                for (int p = 0; p <= t; p++) {
                    double s = 0;
                    for (int i = 0; i < r->hd; i++)
                        s += (double)qh[i] * K[(size_t)p * kv_dim + kvh * r->hd + i];
                    sc[p] = s / sqrt((double)r->hd);
                    if (sc[p] > mx)
                        mx = sc[p];
                }
                for (int p = 0; p <= t; p++)
                    sum += sc[p] = exp(sc[p] - mx);
                for (int p = 0; r->round_kv && p <= t; p++) /* llama.cpp: probabilities in F16 for the V product */
                    sc[p] = fp16_to_f32(f32_to_fp16((float)(sc[p] / sum))) * sum;
                for (int i = 0; i < r->hd; i++) {
                    double a = 0;
                    for (int p = 0; p <= t; p++)
                        a += sc[p] / sum * V[(size_t)p * kv_dim + kvh * r->hd + i];
                    att[h * r->hd + i] = (float)a;
                }
            }
            ref_matvec(r, r->L[l].wo, att, tmp, D, q_dim);
            for (int i = 0; i < D; i++)
                xt[i] += tmp[i];
            ref_rmsnorm(xt, r->L[l].fn, xn, D, r->eps);
            ref_matvec(r, r->L[l].wg, xn, g, r->ffn, D);
            ref_matvec(r, r->L[l].wu, xn, u, r->ffn, D);
            for (int i = 0; i < r->ffn; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            ref_matvec(r, r->L[l].wd, g, tmp, D, r->ffn);
            for (int i = 0; i < D; i++)
                xt[i] += tmp[i];
        }
    }
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(x + (size_t)t * D, r->out_norm, xn, D, r->eps);
        ref_matvec(r, r->out, xn, out + (size_t)t * r->n_vocab, r->n_vocab, D);
    }
    free(x), free(xn), free(q), free(K), free(V), free(att), free(tmp), free(g), free(u), free(sc);
}

/* ||a - b|| / ||b|| */
static double rel_err(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / s);
}

/* Engine logits for every position of toks through two prefill chunks, compared with the reference.
 * Tolerances (relative L2 over all logits). F32 weights with an F32 cache: only summation order differs
 * (measured ~5e-7, tolerance 1e-5). Everything else rounds somewhere as llama.cpp does (activations to F16 /
 * BF16 / 8 bits before products with F16 / BF16 / quantized weights; K, V, the query and the attention
 * probabilities to F16 with an F16 cache), and the reference rounds the same way. But a value that lands
 * within float noise of a rounding boundary may round the other way, and a random network amplifies that
 * one-step difference: measured 1e-7 when no value flips, up to ~2e-2 for 8-bit and ~5e-4 for 16-bit
 * rounding when some do. Tolerances 3e-2 and 3e-3 stay far below the O(1) error of any layout, scale or
 * indexing mistake. Against a pure float reference (no rounding at all) the error is ~3%: tolerance 6e-2. */
/* backend: "cpu" (with its portable scalar kernels when no_simd) or "scalar". */
static void reference_check(const char *path, enum dtype kv, const char *backend, bool no_simd, bool round_act,
                            double tol)
{
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    if (!m)
        fail_msg("%s", err);
    struct ref_model r;
    memset(&r, 0, sizeof r);
    r.round_act = round_act;
    r.round_kv = round_act && kv == DTYPE_F16;
    ref_load(&r, m);
    enum { N = 24 };
    int32_t toks[N];
    uint64_t st = 7;
    for (int i = 0; i < N; i++)
        toks[i] = (int32_t)(test_rand_u64(&st) % (uint64_t)m->hp.n_vocab);
    float *want = malloc((size_t)N * m->hp.n_vocab * 4), *got = malloc((size_t)N * m->hp.n_vocab * 4);
    ref_forward(&r, toks, N, want);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.kv_type = kv;
    ep.backend = backend;
    ep.force_scalar = no_simd;
    ep.n_threads = 2;
    ep.max_batch_tokens = 16;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    struct batch b;
    batch_init(&b, 16);
    int row = 0;
    for (int i0 = 0; i0 < N; i0 += 16) {
        batch_clear(&b);
        for (int i = i0; i < N && i < i0 + 16; i++)
            batch_add(&b, toks[i], i, 0, true);
        assert_int_equal(engine_forward(e, &b, got + (size_t)row * m->hp.n_vocab, err), 0);
        row += b.n;
    }
    double re = rel_err(got, want, (size_t)N * m->hp.n_vocab);
    print_message("    %-24s kv %-4s %-6s kernels %-6s activations %-7s relative error %.2e (tolerance %.0e)\n",
                  strrchr(path, '/') + 1, dtype_name(kv), backend,
                  no_simd || strcmp(backend, "scalar") == 0 ? "scalar" : "simd",
                  round_act ? "rounded" : "float", re, tol);
    if (!(re < tol))
        fail_msg("%s, %s backend: logits differ from the scalar reference by %.3e (tolerance %.1e)", path, backend, re,
                 tol);
    batch_deinit(&b);
    free(want), free(got);
    ref_free(&r);
    engine_destroy(e);
    model_destroy(m);
}

static void check_type(enum ftype ft, const char *arch, double tol_f32kv, double tol_f16kv, double tol_float_ref)
{
    char name[64];
    snprintf(name, sizeof name, "rand-%s-%s.gguf", arch, ftype_name(ft));
    const char *path = test_gen_model(name, arch, ft, false);
    if (!path) {
        print_message("[  SKIPPED ] shared stories260K.gguf (vocabulary) not found\n");
        skip();
    }
    reference_check(path, DTYPE_F32, "cpu", false, true, tol_f32kv);
    reference_check(path, DTYPE_F32, "cpu", true, true, tol_f32kv);
    reference_check(path, DTYPE_F16, "cpu", false, true, tol_f16kv);
    reference_check(path, DTYPE_F32, "cpu", false, false, tol_float_ref);
    reference_check(path, DTYPE_F32, "scalar", false, true, tol_f32kv);
    reference_check(path, DTYPE_F16, "scalar", false, true, tol_f16kv);
}

static void test_ref_f32(void **s) { (void)s; check_type(FTYPE_F32, "llama", 1e-5, 1e-3, 1e-5); }
static void test_ref_f16(void **s) { (void)s; check_type(FTYPE_F16, "llama", 3e-3, 3e-3, 2e-2); }
static void test_ref_bf16(void **s) { (void)s; check_type(FTYPE_BF16, "llama", 3e-3, 3e-3, 2e-2); }
static void test_ref_q8_0(void **s) { (void)s; check_type(FTYPE_Q8_0, "llama", 3e-2, 3e-2, 6e-2); }
static void test_ref_q4_0(void **s) { (void)s; check_type(FTYPE_Q4_0, "llama", 3e-2, 3e-2, 6e-2); }
static void test_ref_q4_k_m(void **s) { (void)s; check_type(FTYPE_Q4_K_M, "llama", 3e-2, 3e-2, 6e-2); }
static void test_ref_q6_k(void **s) { (void)s; check_type(FTYPE_Q6_K, "llama", 3e-2, 3e-2, 6e-2); }
static void test_ref_qwen2(void **s) { (void)s; check_type(FTYPE_F32, "qwen2", 1e-5, 1e-3, 1e-5); }

/* A Q8_0 KV cache against the float-KV reference: the error is the 8-bit rounding of K, V and the query
 * (measured ~1e-2 on this random network), far below the O(1) error of a layout or scale mistake. SIMD and
 * scalar paths both checked. */
static void test_ref_kv_q8_0(void **s)
{
    (void)s;
    const char *path = test_gen_model("rand-kvq8.gguf", "llama", FTYPE_F32, false);
    if (!path)
        skip();
    reference_check(path, DTYPE_Q8_0, "cpu", false, true, 5e-2);
    reference_check(path, DTYPE_Q8_0, "cpu", true, true, 5e-2);
    reference_check(path, DTYPE_Q8_0, "scalar", false, true, 5e-2);
}

static void test_ref_tied(void **s)
{
    (void)s;
    const char *path = test_gen_model("rand-tied.gguf", "llama", FTYPE_Q8_0, true);
    if (!path)
        skip();
    reference_check(path, DTYPE_F32, "cpu", false, true, 3e-2);
    reference_check(path, DTYPE_F32, "scalar", false, true, 3e-2);
}

/* ---- batch invariance ---- */

/* Runs sequence A (prefill of 11 tokens, then 6 decode steps) and records its logits at each step, either
 * alone (other_seqs = 0) or in a batch mixed with other sequences at other lengths. */
static void run_seq_a(struct engine *e, int n_vocab, bool mixed, float *out /* [7][n_vocab] */)
{
    char err[ERR_MSG_MAX];
    struct batch b;
    batch_init(&b, 64);
    float *lg = malloc((size_t)64 * n_vocab * 4);
    uint64_t st = 99;
    int32_t a_tok = 5;
    int a_pos = 0, b_pos = 0, c_pos = 0;
    for (int step = 0; step < 7; step++) {
        batch_clear(&b);
        int a_row = -1, row = 0;
        if (mixed) { /* B prefills 9 tokens then decodes; C joins at step 3 with 20 */
            int nb = step == 0 ? 9 : 1;
            for (int i = 0; i < nb; i++, b_pos++)
                batch_add(&b, (int32_t)(test_rand_u64(&st) % 500), b_pos, 1, i == nb - 1), row += i == nb - 1;
        }
        int na = step == 0 ? 11 : 1;
        for (int i = 0; i < na; i++, a_pos++) {
            bool last = i == na - 1;
            batch_add(&b, step == 0 ? (int32_t)(3 + i * 7) : a_tok, a_pos, 0, last);
            if (last)
                a_row = row++;
        }
        if (mixed && step >= 3) {
            int nc = step == 3 ? 20 : 2;
            for (int i = 0; i < nc; i++, c_pos++)
                batch_add(&b, (int32_t)(test_rand_u64(&st) % 500), c_pos, 2, true), row++;
        }
        assert_int_equal(engine_forward(e, &b, lg, err), 0);
        memcpy(out + (size_t)step * n_vocab, lg + (size_t)a_row * n_vocab, (size_t)n_vocab * 4);
        a_tok = argmax(lg + (size_t)a_row * n_vocab, n_vocab);
    }
    batch_deinit(&b);
    free(lg);
}

/* run_seq_a on an engine of m with ep and n_threads threads, created and destroyed here. */
static void run_seq_a_on(const struct model *m, struct engine_params *ep, int n_threads, bool mixed,
                         float *out /* [7][n_vocab] */)
{
    char err[ERR_MSG_MAX];
    ep->n_threads = n_threads;
    struct engine *e = engine_create(m, ep, err);
    assert_non_null(e);
    run_seq_a(e, m->hp.n_vocab, mixed, out);
    engine_destroy(e);
}

static void batch_invariance_check(const char *backend)
{
    const enum ftype types[] = {FTYPE_F32, FTYPE_Q4_0, FTYPE_Q4_K_M, FTYPE_F16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char name[64];
        snprintf(name, sizeof name, "inv-%s.gguf", ftype_name(types[ti]));
        const char *path = test_gen_model(name, "llama", types[ti], false);
        if (!path)
            skip();
        char err[ERR_MSG_MAX];
        struct model *m = model_load(path, err);
        assert_non_null(m);
        int nv = m->hp.n_vocab;
        float *alone = malloc((size_t)7 * nv * 4), *mixed = malloc((size_t)7 * nv * 4);
        struct engine_params ep;
        engine_params_default(&ep);
        ep.max_seqs = 3;
        ep.max_batch_tokens = 64;
        ep.backend = backend;
        /* every weight type with the default F16 cache; F32 weights also with a Q8_0 cache */
        for (int kv = 0; kv < (types[ti] == FTYPE_F32 ? 2 : 1); kv++) {
            ep.kv_type = kv ? DTYPE_Q8_0 : DTYPE_F16;
            run_seq_a_on(m, &ep, 1, false, alone);
            /* batched on 2 threads; alone on 3, where decode's rows go to whichever thread takes them
             * (op_matmul_decode): on this machine's 2 cores the threads take turns, so they take from each other */
            const struct {
                int threads;
                bool mixed;
                const char *what;
            } runs[] = {{2, true, "batched (2 threads)"}, {3, false, "alone on 3 threads"}};
            for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
                run_seq_a_on(m, &ep, runs[r].threads, runs[r].mixed, mixed);
                for (int s = 0; s < 7; s++)
                    if (memcmp(alone + (size_t)s * nv, mixed + (size_t)s * nv, (size_t)nv * 4))
                        fail_msg("%s, %s backend, kv %s: step %d logits differ between alone (1 thread) and %s",
                                 name, backend, dtype_name(ep.kv_type), s, runs[r].what);
            }
        }
        free(alone), free(mixed);
        model_destroy(m);
    }
}

static void test_batch_invariance(void **state)
{
    (void)state;
    batch_invariance_check("cpu");
    batch_invariance_check("scalar");
}

/* ---- prefix sharing ---- */

/* backend: whose block copy serves the copy on write */
static void kv_share_cow_check(const char *backend)
{
    const char *path = test_gen_model("share.gguf", "llama", FTYPE_F32, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    int nv = m->hp.n_vocab;
    struct engine_params ep;
    engine_params_default(&ep);
    ep.max_seqs = 3;
    ep.block_size = 8;
    ep.backend = backend;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    struct batch b;
    batch_init(&b, 64);
    float *l0 = malloc((size_t)nv * 4), *l1 = malloc((size_t)nv * 4), *l2 = malloc((size_t)nv * 4);
    /* seq 0: 13 tokens (block 2 partially filled) */
    for (int i = 0; i < 13; i++)
        batch_add(&b, 10 + i, i, 0, false);
    assert_int_equal(engine_forward(e, &b, NULL, err), 0);
    int64_t free_before = kv_pool_free_blocks(engine_kv(e));
    /* seq 1 shares seq 0's first 11 positions, then diverges: copy on write of the shared partial block */
    assert_int_equal(kv_seq_share(engine_kv(e), engine_seq(e, 1), engine_seq(e, 0), 11), 0);
    assert_int_equal(kv_pool_free_blocks(engine_kv(e)), free_before);
    batch_clear(&b);
    batch_add(&b, 400, 11, 1, true);
    assert_int_equal(engine_forward(e, &b, l1, err), 0);
    assert_int_equal(kv_pool_free_blocks(engine_kv(e)), free_before - 1); /* one block copied */
    /* seq 2 computes the same 12 tokens from scratch */
    batch_clear(&b);
    for (int i = 0; i < 11; i++)
        batch_add(&b, 10 + i, i, 2, false);
    batch_add(&b, 400, 11, 2, true);
    assert_int_equal(engine_forward(e, &b, l2, err), 0);
    assert_memory_equal(l1, l2, (size_t)nv * 4);
    /* seq 0 is untouched by seq 1's write: its next step equals a recomputation */
    batch_clear(&b);
    batch_add(&b, 77, 13, 0, true);
    assert_int_equal(engine_forward(e, &b, l0, err), 0);
    engine_seq_truncate(e, 2, 0);
    batch_clear(&b);
    for (int i = 0; i < 13; i++)
        batch_add(&b, 10 + i, i, 2, false);
    batch_add(&b, 77, 13, 2, true);
    assert_int_equal(engine_forward(e, &b, l2, err), 0);
    assert_memory_equal(l0, l2, (size_t)nv * 4);
    free(l0), free(l1), free(l2);
    batch_deinit(&b);
    engine_destroy(e);
    model_destroy(m);
}

static void test_kv_share_cow(void **state)
{
    (void)state;
    kv_share_cow_check("cpu");
    kv_share_cow_check("scalar");
}

/* ---- errors ---- */

static void test_forward_errors(void **state)
{
    (void)state;
    const char *path = test_gen_model("err.gguf", "llama", FTYPE_F32, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.max_seqs = 2;
    ep.max_batch_tokens = 8;
    ep.block_size = 4;
    ep.kv_blocks = 3; /* 12 positions in all */
    ep.n_ctx = 64;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    struct batch b;
    batch_init(&b, 16);
    batch_add(&b, 1, 1, 0, false); /* must start at 0 */
    assert_int_equal(engine_forward(e, &b, NULL, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "continues at 0"));
    batch_clear(&b);
    batch_add(&b, 1, 0, 5, false);
    assert_int_equal(engine_forward(e, &b, NULL, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "sequence id 5"));
    batch_clear(&b);
    batch_add(&b, 100000, 0, 0, false);
    assert_int_equal(engine_forward(e, &b, NULL, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "token id 100000"));
    batch_clear(&b);
    for (int i = 0; i < 9; i++)
        batch_add(&b, 1, i, 0, false);
    assert_int_equal(engine_forward(e, &b, NULL, err), ERR_INVALID_ARG);
    /* KV: 8 positions fit (2 blocks), then 8 more for seq 1 need 2 blocks with 1 free: refused, unchanged */
    batch_clear(&b);
    for (int i = 0; i < 8; i++)
        batch_add(&b, 1, i, 0, false);
    assert_int_equal(engine_forward(e, &b, NULL, err), 0);
    batch_clear(&b);
    for (int i = 0; i < 8; i++)
        batch_add(&b, 1, i, 1, false);
    assert_int_equal(engine_forward(e, &b, NULL, err), ERR_NO_SPACE);
    assert_int_equal(engine_seq_len(e, 1), 0);
    assert_int_equal(kv_pool_free_blocks(engine_kv(e)), 1);
    engine_seq_truncate(e, 0, 0);
    assert_int_equal(kv_pool_free_blocks(engine_kv(e)), 3);
    assert_int_equal(engine_forward(e, &b, NULL, err), 0);
    batch_deinit(&b);
    engine_destroy(e);
    model_destroy(m);
}

static void test_model_refusals(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    /* an unsupported architecture is refused with the supported list */
    struct gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "falcon");
    const char *p = test_tmp_path("falcon.gguf");
    assert_int_equal(gguf_writer_begin(w, p, err), 0);
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    assert_null(model_load(p, err));
    assert_non_null(strstr(err, "architecture 'falcon' is not supported (supported: llama"));
    /* a weight type without kernels (Q5_K) is refused with the supported types */
    const char *src = test_gen_model("for-q5.gguf", "llama", FTYPE_F32, false);
    if (!src)
        skip();
    struct gguf *g = gguf_open(src, err);
    w = gguf_writer_create();
    for (int64_t i = 0; i < gguf_kv_count(g); i++)
        gguf_writer_copy_kv(w, gguf_kv_at(g, i));
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        gguf_writer_add_tensor(w, t->name, strcmp(t->name, "blk.1.ffn_up.weight") ? t->type : DTYPE_Q5_K, t->n_dims, t->ne);
    }
    p = test_tmp_path("q5k.gguf");
    assert_int_equal(gguf_writer_begin(w, p, err), 0);
    for (int64_t i = 0; i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        size_t nb = strcmp(t->name, "blk.1.ffn_up.weight") ? t->nbytes : dtype_row_bytes(DTYPE_Q5_K, t->ne[0]) * t->ne[1];
        void *zeros = calloc(1, nb);
        assert_int_equal(gguf_writer_write_tensor(w, (int)i, strcmp(t->name, "blk.1.ffn_up.weight") ? t->data : zeros, nb, err), 0);
        free(zeros);
    }
    assert_int_equal(gguf_writer_finish(w, err), 0);
    gguf_writer_destroy(w);
    gguf_close(g);
    assert_null(model_load(p, err));
    assert_non_null(strstr(err, "blk.1.ffn_up.weight"));
    assert_non_null(strstr(err, "q5_k"));
    assert_non_null(strstr(err, "supported: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k"));
}

/* engine_setup: the options every command fills, resolved once against the model. */
static void test_engine_setup(void **state)
{
    (void)state;
    const char *path = TEST_SHARED_OR_SKIP("models/stories260K/stories260K.gguf");
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    if (!m)
        fail_msg("%s", err);
    int train = m->hp.ctx_train;
    assert_true(train > 64);
    struct engine_opts o;
    struct engine_params p, def;
    engine_params_default(&def);
    engine_opts_default(&o);
    assert_int_equal(engine_params_for_model(m, &o, &p, err), 0);
    assert_int_equal(p.n_ctx, train); /* the model's context */
    assert_int_equal(p.max_seqs, def.max_seqs);
    assert_int_equal(p.max_batch_tokens, def.max_batch_tokens);
    assert_int_equal(p.block_size, def.block_size);
    assert_int_equal(p.kv_type, DTYPE_F16);
    assert_null(p.backend);
    assert_false(p.force_scalar);
    o.n_ctx_cap = 64; /* caps the default ... */
    assert_int_equal(engine_params_for_model(m, &o, &p, err), 0);
    assert_int_equal(p.n_ctx, 64);
    o.n_ctx = 4 * train; /* ... never an explicit context */
    assert_int_equal(engine_params_for_model(m, &o, &p, err), 0);
    assert_int_equal(p.n_ctx, 4 * train);
    o.n_ctx_cap = 4 * train;
    o.n_ctx = 0;
    assert_int_equal(engine_params_for_model(m, &o, &p, err), 0);
    assert_int_equal(p.n_ctx, train);
    o.n_threads = 3, o.max_seqs = 5, o.max_batch_tokens = 77, o.kv_bytes = 12345, o.kv_blocks = 9, o.no_simd = true;
    assert_int_equal(engine_opts_set_kv_type(&o, "q8_0", err), 0);
    assert_int_equal(engine_opts_set_backend(&o, "scalar", err), 0);
    assert_int_equal(engine_params_for_model(m, &o, &p, err), 0);
    assert_int_equal(p.n_threads, 3);
    assert_int_equal(p.max_seqs, 5);
    assert_int_equal(p.max_batch_tokens, 77);
    assert_int_equal(p.kv_bytes, 12345);
    assert_int_equal(p.kv_blocks, 9);
    assert_int_equal(p.kv_type, DTYPE_Q8_0);
    assert_true(p.force_scalar);
    assert_string_equal(p.backend, "scalar");
    /* bad names: refused with what is accepted, the options unchanged */
    assert_int_equal(engine_opts_set_kv_type(&o, "q4_0", err), ERR_INVALID_ARG);
    assert_string_equal(err, "expected f16, f32 or q8_0, got 'q4_0'");
    assert_int_equal(o.kv_type, DTYPE_Q8_0);
    assert_int_equal(engine_opts_set_backend(&o, "cuda", err), ERR_INVALID_ARG);
    assert_string_equal(err, "unknown backend 'cuda' (available: cpu, scalar)");
    assert_string_equal(o.backend, "scalar");
    assert_int_equal(engine_opts_set_backend(&o, "cpu", err), 0);
    assert_int_equal(engine_backend_check(NULL, err), 0);
    o.backend = "nope"; /* set directly: engine_params_for_model and engine_create refuse it too */
    assert_int_equal(engine_params_for_model(m, &o, &p, err), ERR_INVALID_ARG);
    engine_params_default(&p);
    p.backend = "nope";
    assert_null(engine_create(m, &p, err));
    assert_string_equal(err, "unknown backend 'nope' (available: cpu, scalar)");
    /* the scalar backend creates an engine */
    engine_opts_default(&o);
    assert_int_equal(engine_opts_set_backend(&o, "scalar", err), 0);
    assert_int_equal(engine_params_for_model(m, &o, &p, err), 0);
    struct engine *e = engine_create(m, &p, err);
    assert_non_null(e);
    assert_int_equal(engine_params_get(e)->n_ctx, train);
    engine_destroy(e);
    model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_stories_gguf),
        cmocka_unit_test(test_golden_stories_llama2c),
        cmocka_unit_test(test_load_fits_memory), cmocka_unit_test(test_llama2c_truncated),
        cmocka_unit_test(test_ref_f32),
        cmocka_unit_test(test_ref_f16),
        cmocka_unit_test(test_ref_bf16),
        cmocka_unit_test(test_ref_q8_0),
        cmocka_unit_test(test_ref_q4_0),
        cmocka_unit_test(test_ref_q4_k_m),
        cmocka_unit_test(test_ref_q6_k),
        cmocka_unit_test(test_ref_qwen2),
        cmocka_unit_test(test_ref_tied),
        cmocka_unit_test(test_ref_kv_q8_0),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_kv_share_cow),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_model_refusals),
        cmocka_unit_test(test_engine_setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
