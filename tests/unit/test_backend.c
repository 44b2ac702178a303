/*
 * Backend tests (backend.h): the registry (an unknown name is refused with the available ones), describe,
 * the two backends against each other for every weight type and KV type (CPU with its portable kernels and
 * the scalar backend bit-identical; CPU with SIMD kernels and the scalar backend within a stated tolerance),
 * the weight layouts the CPU backend chooses (model_relayout: same logits, the scalar backend on either), and
 * llama-19M perplexities through both backends against llama.cpp's figures. test_engine.c runs the
 * greedy goldens, the reference forward pass, batch invariance and copy on write through both backends.
 */
#include "testutil.h"

#include "core/err.h"
#include "engine/backend.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/tokenizer/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* threads of the engines make_engine creates (relayout_check also uses 3: row ranges that do not divide
 * evenly) */
static int engine_threads = 2;

static struct engine *make_engine(const struct model *m, const char *backend, bool no_simd, enum dtype kv,
                                  int max_batch)
{
    char err[ERR_MSG_MAX];
    struct engine_params ep;
    engine_params_default(&ep);
    ep.backend = backend;
    ep.force_scalar = no_simd;
    ep.kv_type = kv;
    ep.n_threads = strcmp(backend, "scalar") ? engine_threads : 1;
    ep.max_batch_tokens = max_batch;
    struct engine *e = engine_create(m, &ep, err);
    if (!e)
        fail_msg("%s backend: %s", backend, err);
    return e;
}

/* ---- registry and describe ---- */

static void test_unknown_backend_refused(void **state)
{
    (void)state;
    const char *path = test_gen_model("reg.gguf", "llama", FTYPE_Q4_0, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.backend = "cuda";
    assert_null(engine_create(m, &ep, err));
    assert_string_equal(err, "unknown backend 'cuda' (available: cpu, scalar)");
    assert_null(backend_find("CPU"));
    assert_string_equal(backend_find(NULL)->name, "cpu");
    assert_string_equal(backend_find("scalar")->name, "scalar");
    /* the resolved parameters name the backend, the default one too */
    ep.backend = NULL;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    assert_string_equal(engine_params_get(e)->backend, "cpu");
    engine_destroy(e);
    model_destroy(m);
}

/* The kernels the CPU backend should pick for Q4_0 weights on this machine. */
static const char *expected_q4_0_isa(void)
{
    if (!kernel_cpu_has_avx2())
        return "scalar";
    if (gemv_cpu_has_avx512())
        return "avx512";
    return kernel_cpu_has_avx_vnni() ? "avx-vnni" : "avx2";
}

static void test_describe(void **state)
{
    (void)state;
    const char *path = test_gen_model("desc.gguf", "llama", FTYPE_Q4_0, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    struct backend_desc d;
    struct {
        const char *backend;
        bool no_simd;
        const char *isa;
        int threads;
    } cases[] = {{"cpu", false, expected_q4_0_isa(), 2}, {"cpu", true, "scalar", 2}, {"scalar", false, "scalar", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct engine *e = make_engine(m, cases[i].backend, cases[i].no_simd, DTYPE_F16, 32);
        const struct engine_params *p = engine_params_get(e);
        engine_describe(e, &d);
        print_message("    %s%s: %d threads, weights %zu, KV %zu, scratch %zu bytes, q4_0 %s, q8_0 %s, f32 %s\n",
                      d.name, cases[i].no_simd ? " --no-simd" : "", d.n_threads, d.weight_bytes, d.kv_bytes,
                      d.scratch_bytes, d.isa[DTYPE_Q4_0], d.isa[DTYPE_Q8_0] ? d.isa[DTYPE_Q8_0] : "-",
                      d.isa[DTYPE_F32] ? d.isa[DTYPE_F32] : "-");
        assert_string_equal(d.name, cases[i].backend);
        assert_int_equal(d.n_threads, cases[i].threads);
        assert_int_equal(p->n_threads, cases[i].threads);
        assert_int_equal(d.weight_bytes, m->weight_bytes);
        assert_int_equal(d.kv_bytes, (size_t)p->kv_blocks * kv_pool_block_bytes(kv_pool_params(engine_kv(e))));
        assert_true(d.scratch_bytes > 0);
        assert_string_equal(d.isa[DTYPE_Q4_0], cases[i].isa);
        assert_null(d.isa[DTYPE_Q4_K]); /* a type the model does not use */
        engine_destroy(e);
    }
    model_destroy(m);
}

/* ---- the backends against each other ---- */

enum { CMP_N = 24, CMP_CHUNK = 16 };

/* Logits of every position of toks[0..CMP_N) (in batches of chunk tokens: 1 decodes) into
 * out[CMP_N][n_vocab]. */
static void logits_chunked(const struct model *m, const char *backend, bool no_simd, enum dtype kv,
                           const int32_t *toks, float *out, int chunk)
{
    char err[ERR_MSG_MAX];
    struct engine *e = make_engine(m, backend, no_simd, kv, CMP_CHUNK);
    struct batch b;
    assert_int_equal(batch_init(&b, chunk), 0);
    for (int i0 = 0; i0 < CMP_N; i0 += chunk) {
        batch_clear(&b);
        for (int i = i0; i < CMP_N && i < i0 + chunk; i++)
            batch_add(&b, toks[i], i, 0, true);
        assert_int_equal(engine_forward(e, &b, out + (size_t)i0 * m->hp.n_vocab, err), 0);
    }
    batch_deinit(&b);
    engine_destroy(e);
}

/* The same, prefilled in chunks of CMP_CHUNK. */
static void logits_of(const struct model *m, const char *backend, bool no_simd, enum dtype kv, const int32_t *toks,
                      float *out)
{
    logits_chunked(m, backend, no_simd, kv, toks, out, CMP_CHUNK);
}

/* max |a - b| over the largest range (max - min) of b's rows: the error in units of the logits' spread. */
static double max_diff_rel_range(const float *a, const float *b, int rows, int n)
{
    double d = 0, range = 0;
    for (int r = 0; r < rows; r++) {
        const float *ar = a + (size_t)r * n, *br = b + (size_t)r * n;
        float lo = br[0], hi = br[0];
        for (int i = 0; i < n; i++) {
            d = fmax(d, fabs((double)ar[i] - br[i]));
            lo = fminf(lo, br[i]), hi = fmaxf(hi, br[i]);
        }
        range = fmax(range, (double)hi - lo);
    }
    return d / range;
}

/* For every weight type and KV type, on a small random network:
 *   CPU backend with its portable kernels == scalar backend, bit for bit: both run the scalar kernel_ops and
 *   attention kernels, whose per-element reduction orders do not depend on batching or threads, in the same
 *   order of operations;
 *   CPU backend with SIMD kernels ~ scalar backend: the SIMD dot products reduce in 8-lane float chains
 *   where the scalar ones sum in a different order (in double for float weights), a difference of a few
 *   float ulps per product. Where the next product rounds its input to 8 bits (Q8_0 / Q8_K activations, a
 *   Q8_0 cache) an ulp can flip one rounding step, which a random network amplifies: measured up to ~1e-2 of
 *   the logits' range (F32 / F16 / BF16 weights with an F32 or F16 cache: ~1e-6). Tolerance 3e-2 of the
 *   range (per type below), while a wrong rope, layout, scale or mask is an O(1) error. */
/* The comparison above on model m (label names it in messages) for nkv KV types. */
static void backends_compare(const struct model *m, const char *label, const enum dtype *kvs, size_t nkv, double tol)
{
    int nv = m->hp.n_vocab;
    int32_t toks[CMP_N];
    uint64_t st = 11;
    for (int i = 0; i < CMP_N; i++)
        toks[i] = (int32_t)(test_rand_u64(&st) % (uint64_t)nv);
    size_t n = (size_t)CMP_N * nv;
    float *simd = malloc(n * 4), *portable = malloc(n * 4), *scalar = malloc(n * 4);
    for (size_t k = 0; k < nkv; k++) {
        logits_of(m, "scalar", false, kvs[k], toks, scalar);
        logits_of(m, "cpu", true, kvs[k], toks, portable);
        logits_of(m, "cpu", false, kvs[k], toks, simd);
        double d = max_diff_rel_range(simd, scalar, CMP_N, nv);
        print_message("    %-8s kv %-4s cpu (simd) vs scalar: max |diff| %.2e of the logits' range (tolerance %.0e); "
                      "cpu (portable kernels) vs scalar: %s\n", label, dtype_name(kvs[k]), d, tol,
                      memcmp(portable, scalar, n * 4) ? "DIFFERENT" : "bit-identical");
        if (!(d < tol))
            fail_msg("%s, kv %s: cpu and scalar backends differ by %.3e of the logits' range (tolerance %.1e)",
                     label, dtype_name(kvs[k]), d, tol);
        if (memcmp(portable, scalar, n * 4))
            fail_msg("%s, kv %s: the cpu backend with portable kernels and the scalar backend differ (max %.3e of the "
                     "range)", label, dtype_name(kvs[k]), max_diff_rel_range(portable, scalar, CMP_N, nv));
    }
    free(simd), free(portable), free(scalar);
}

static void backends_check(enum ftype ft, double tol)
{
    char name[64];
    snprintf(name, sizeof name, "cmp-%s.gguf", ftype_name(ft));
    const char *path = test_gen_model(name, "llama", ft, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    const enum dtype kvs[] = {DTYPE_F16, DTYPE_F32, DTYPE_Q8_0};
    backends_compare(m, ftype_name(ft), kvs, 3, tol);
    model_destroy(m);
}

static void test_cmp_f32(void **s) { (void)s; backends_check(FTYPE_F32, 3e-2); }
static void test_cmp_f16(void **s) { (void)s; backends_check(FTYPE_F16, 3e-2); }
static void test_cmp_bf16(void **s) { (void)s; backends_check(FTYPE_BF16, 3e-2); }
static void test_cmp_q8_0(void **s) { (void)s; backends_check(FTYPE_Q8_0, 3e-2); }
static void test_cmp_q4_0(void **s) { (void)s; backends_check(FTYPE_Q4_0, 3e-2); }
static void test_cmp_q4_k_m(void **s) { (void)s; backends_check(FTYPE_Q4_K_M, 3e-2); }
static void test_cmp_q6_k(void **s) { (void)s; backends_check(FTYPE_Q6_K, 3e-2); }

/* F32, F16 and BF16 weights all take F32 activation rows but round them differently (none, to F16, to BF16).
 * A model mixing them within one input's products (here every layer: q F16, k BF16, v F32; gate F16, up
 * BF16) must give each product its own rounding, the scalar backend's: the CPU backend with portable
 * kernels stays bit-identical to it (sharing one conversion among them measured 2.2e-3 of the logits' range
 * off), and three conversions of one input share its two activation slots without one thread overwriting a
 * slot another still reads. */
static void test_cmp_mixed_float(void **s)
{
    (void)s;
    const char *path = test_gen_model("mixed-float.gguf", "llama", FTYPE_F16, false);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *m = model_load(path, err);
    assert_non_null(m);
    int nl = m->hp.n_layers;
    void **bufs = calloc((size_t)nl * 3, sizeof *bufs); /* the loaded weights are read-only: copies */
    for (int l = 0; l < nl; l++) {
        struct model_layer *L = &m->layers[l];
        struct model_weight *ws[] = {&L->wk, &L->w_up, &L->wv};
        for (int i = 0; i < 3; i++) {
            struct model_weight *w = ws[i];
            assert_int_equal(w->type, DTYPE_F16);
            const uint16_t *h = w->data;
            size_t count = (size_t)(w->rows * w->cols);
            if (i < 2) { /* BF16 */
                uint16_t *b = malloc(2 * count);
                for (size_t e = 0; e < count; e++)
                    b[e] = f32_to_bf16(fp16_to_f32(h[e]));
                bufs[l * 3 + i] = b, w->type = DTYPE_BF16;
            } else { /* F32 */
                float *f = malloc(4 * count);
                for (size_t e = 0; e < count; e++)
                    f[e] = fp16_to_f32(h[e]);
                bufs[l * 3 + i] = f, w->type = DTYPE_F32, w->row_bytes = 4 * (size_t)w->cols;
            }
            w->data = bufs[l * 3 + i];
        }
    }
    const enum dtype kv = DTYPE_F16;
    backends_compare(m, "mixed float", &kv, 1, 3e-2);
    model_destroy(m);
    for (int i = 0; i < nl * 3; i++)
        free(bufs[i]);
    free(bufs);
}

/* ---- weight layouts (model_relayout) ---- */

/* The CPU backend lays Q4_0 / Q8_0 / Q4_K / Q6_K weights out in R16 where its kernels read it (AVX-512), and
 * back in rows for kernels that do not; a mapped model stays in rows. Logits are the same bits either way, and
 * the scalar backend reads an R16 model's rows correctly. */
/* The layout the CPU backend gives a matrix of type t on this CPU. */
static enum weight_layout layout_for(enum dtype t)
{
    return gemv_ops_best(t) && gemv_ops_best(t)->gemv16 ? WEIGHT_R16 : WEIGHT_ROWS;
}

static void relayout_check(enum ftype ft, enum dtype t, bool tied)
{
    char name[64];
    snprintf(name, sizeof name, "relayout-%s%s.gguf", ftype_name(ft), tied ? "-tied" : "");
    const char *path = test_gen_model(name, "llama", ft, tied);
    if (!path)
        skip();
    char err[ERR_MSG_MAX];
    struct model *mem = model_load_ex(path, false, NULL, err), *mapped = model_load_ex(path, true, NULL, err);
    assert_non_null(mem);
    assert_non_null(mapped);
    assert_int_equal(mem->layers[0].wq.type, t);
    size_t n = (size_t)CMP_N * mem->hp.n_vocab;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    int32_t toks[CMP_N];
    for (int i = 0; i < CMP_N; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % mem->hp.n_vocab);
    const struct model_weight *w = &mem->layers[0].w_down; /* of type t also in Q4_K_M (layer 1's is Q6_K) */
    assert_int_equal(w->type, t);
    enum weight_layout want = layout_for(t);
    assert_int_equal(w->layout, WEIGHT_ROWS); /* as loaded */
    logits_of(mapped, "cpu", false, DTYPE_F16, toks, a);
    assert_int_equal(mapped->layers[1].w_down.layout, WEIGHT_ROWS);
    logits_of(mem, "cpu", false, DTYPE_F16, toks, b);
    assert_memory_equal(a, b, n * 4);
    /* rows split unevenly between threads (every range must still start at a group of 16), and decode */
    engine_threads = 3;
    logits_chunked(mem, "cpu", false, DTYPE_F16, toks, b, 1);
    engine_threads = 2;
    print_message("    %s: cpu backend left the matrices in %s\n", dtype_name(t),
                  w->layout == WEIGHT_R16 ? "R16" : "rows");
    assert_int_equal(w->layout, want);
    assert_int_equal(mem->layers[0].wk.layout, want);
    /* token_embd is read a row at a time: never re-laid, also when it is the output matrix too */
    assert_int_equal(mem->tok_embd.layout, WEIGHT_ROWS);
    assert_int_equal(mem->output.layout, tied ? WEIGHT_ROWS : layout_for(mem->output.type));
    assert_int_equal(mem->layers[1].w_down.layout, layout_for(mem->layers[1].w_down.type)); /* Q6_K in Q4_K_M */
    assert_memory_equal(a, b, n * 4);
    /* the scalar backend on the re-laid model and on the mapped one */
    logits_of(mem, "scalar", false, DTYPE_F16, toks, a);
    assert_int_equal(w->layout, want); /* the scalar backend reads it as it is */
    logits_of(mapped, "scalar", false, DTYPE_F16, toks, b);
    assert_memory_equal(a, b, n * 4);
    /* another engine cannot change the layout under one that computes from it */
    if (want == WEIGHT_R16) {
        struct engine *hold = make_engine(mem, "cpu", false, DTYPE_F16, CMP_CHUNK);
        struct engine_params ep;
        engine_params_default(&ep);
        ep.force_scalar = true;
        assert_null(engine_create(mem, &ep, err));
        print_message("    refused while another engine holds the layout: %s\n", err);
        assert_non_null(strstr(err, "another engine still running"));
        struct engine *same = make_engine(mem, "cpu", false, DTYPE_F16, CMP_CHUNK); /* the same kernels: fine */
        engine_destroy(same);
        engine_destroy(hold);
        assert_int_equal(w->layout, WEIGHT_R16);
    }
    /* portable kernels put the rows back (and match the scalar backend, as test_cmp_* hold) */
    logits_of(mem, "cpu", true, DTYPE_F16, toks, b);
    assert_int_equal(w->layout, WEIGHT_ROWS);
    assert_memory_equal(a, b, n * 4);
    free(a), free(b);
    model_destroy(mem);
    model_destroy(mapped);
}

static void test_relayout_q4_0(void **s) { (void)s; relayout_check(FTYPE_Q4_0, DTYPE_Q4_0, false); }
static void test_relayout_q8_0(void **s) { (void)s; relayout_check(FTYPE_Q8_0, DTYPE_Q8_0, false); }
static void test_relayout_q4_k(void **s) { (void)s; relayout_check(FTYPE_Q4_K_M, DTYPE_Q4_K, false); }
static void test_relayout_q6_k(void **s) { (void)s; relayout_check(FTYPE_Q6_K, DTYPE_Q6_K, false); }
static void test_relayout_tied(void **s) { (void)s; relayout_check(FTYPE_Q4_0, DTYPE_Q4_0, true); }

/* Matrix i of m in model_relayout's list: layer i / 7's seven, then output (i == 7 * n_layers). */
static const struct model_weight *matrix_at(const struct model *m, int i)
{
    if (i == 7 * m->hp.n_layers)
        return &m->output;
    const struct model_layer *L = &m->layers[i / 7];
    const struct model_weight *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return lw[i % 7];
}

/* engine_model_load lays the matrices out for the CPU backend's kernels while it reads the file: the same
 * bytes in the same layouts as model_relayout gives the model read in rows, before any engine exists, and the
 * same logits; with --no-simd (kernels that read rows) it leaves them in rows. */
static void placed_check(enum ftype ft, bool tied)
{
    char name[64], err[ERR_MSG_MAX];
    snprintf(name, sizeof name, "placed-%s%s.gguf", ftype_name(ft), tied ? "-tied" : "");
    const char *path = test_gen_model(name, "llama", ft, tied);
    if (!path)
        skip();
    struct engine_opts o;
    engine_opts_default(&o);
    struct model *placed = engine_model_load(path, false, &o, err), *rows = model_load_ex(path, false, NULL, err);
    struct model *mapped = model_load_ex(path, true, NULL, err);
    o.no_simd = true;
    struct model *plain = engine_model_load(path, false, &o, err);
    assert_non_null(placed), assert_non_null(rows), assert_non_null(mapped), assert_non_null(plain);
    bool r16[DTYPE_COUNT];
    for (int t = 0; t < DTYPE_COUNT; t++)
        r16[t] = layout_for((enum dtype)t) == WEIGHT_R16;
    assert_int_equal(model_relayout(rows, r16), 0);
    int n_r16 = 0, n = 7 * placed->hp.n_layers + (tied ? 0 : 1);
    for (int i = 0; i < n; i++) {
        const struct model_weight *a = matrix_at(placed, i), *b = matrix_at(rows, i), *c = matrix_at(plain, i);
        assert_int_equal(a->layout, layout_for(a->type));
        assert_int_equal(a->layout, b->layout);
        assert_int_equal(c->layout, WEIGHT_ROWS);
        n_r16 += a->layout == WEIGHT_R16;
        if (memcmp(a->data, b->data, a->row_bytes * (size_t)a->rows))
            fail_msg("%s: matrix %d placed at load differs from the same matrix re-laid after", ftype_name(ft), i);
        assert_memory_equal(c->data, matrix_at(mapped, i)->data, c->row_bytes * (size_t)c->rows);
    }
    assert_int_equal(placed->tok_embd.layout, WEIGHT_ROWS);
    assert_memory_equal(placed->tok_embd.data, mapped->tok_embd.data, placed->tok_embd.row_bytes * (size_t)placed->tok_embd.rows);
    print_message("    %s%s: %d of %d matrices placed in R16 while reading\n", ftype_name(ft), tied ? " (tied)" : "", n_r16, n);
    size_t nl = (size_t)CMP_N * placed->hp.n_vocab;
    float *a = malloc(nl * 4), *b = malloc(nl * 4);
    int32_t toks[CMP_N];
    for (int i = 0; i < CMP_N; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % placed->hp.n_vocab);
    logits_of(mapped, "cpu", false, DTYPE_F16, toks, a);
    logits_of(placed, "cpu", false, DTYPE_F16, toks, b);
    assert_memory_equal(a, b, nl * 4);
    logits_of(plain, "cpu", true, DTYPE_F16, toks, a);
    logits_of(placed, "scalar", false, DTYPE_F16, toks, b);
    assert_memory_equal(a, b, nl * 4);
    free(a), free(b);
    model_destroy(placed), model_destroy(rows), model_destroy(mapped), model_destroy(plain);
}

static void test_placed_q4_0(void **s) { (void)s; placed_check(FTYPE_Q4_0, false); }
static void test_placed_q4_k_m(void **s) { (void)s; placed_check(FTYPE_Q4_K_M, false); }
static void test_placed_q8_0_tied(void **s) { (void)s; placed_check(FTYPE_Q8_0, true); }

/* ---- perplexity against llama.cpp ---- */

/* -log softmax(l)[tok] in double. */
static double nll(const float *l, int n, int tok)
{
    float mx = l[0];
    for (int i = 1; i < n; i++)
        mx = fmaxf(mx, l[i]);
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)l[i] - mx);
    return log(s) - ((double)l[tok] - mx);
}

/* Perplexity of the model over story.txt as llama-perplexity computes it (see golden/perplexity.json):
 * windows of ctx tokens from an empty cache, first token replaced by BOS, positions ctx/2 .. ctx-2 scored. */
static double perplexity(const struct model *m, const char *backend, const char *text, int ctx)
{
    char err[ERR_MSG_MAX];
    size_t len = strlen(text);
    int32_t *toks = malloc((len + 8) * sizeof *toks);
    int n_tok = tokenizer_encode(m->tok, text, len, true, false, toks, (int)len + 8);
    assert_true(n_tok >= ctx);
    struct engine_params ep;
    engine_params_default(&ep);
    ep.backend = backend;
    ep.n_threads = 2;
    ep.n_ctx = ctx;
    ep.max_batch_tokens = ctx;
    struct engine *e = engine_create(m, &ep, err);
    assert_non_null(e);
    int nv = m->hp.n_vocab, first = ctx / 2;
    float *logits = malloc((size_t)ctx * nv * sizeof *logits);
    struct batch b;
    assert_int_equal(batch_init(&b, ctx), 0);
    double sum = 0;
    long count = 0;
    for (int k = 0; k < n_tok / ctx; k++) {
        const int32_t *w = toks + (size_t)k * ctx;
        engine_seq_truncate(e, 0, 0);
        batch_clear(&b);
        for (int i = 0; i < ctx; i++)
            batch_add(&b, i == 0 ? tokenizer_bos(m->tok) : w[i], i, 0, i >= first && i <= ctx - 2);
        assert_int_equal(engine_forward(e, &b, logits, err), 0);
        for (int i = first; i <= ctx - 2; i++, count++)
            sum += nll(logits + (size_t)(i - first) * nv, nv, w[i + 1]);
    }
    batch_deinit(&b);
    free(logits);
    free(toks);
    engine_destroy(e);
    return exp(sum / (double)count);
}

/* llama-19M (random weights, so huge perplexities: a numerical check) in a few types through both backends,
 * within the bounds tests/e2e/test_cli.py holds the CLI to: 0.1% for F16, 1% for quantized files. F16 runs
 * through the CPU backend only: the portable F16 dot product (double sums) makes it ~15 s on the scalar
 * backend, ~1 min under ASan; the scalar backend's F16 path is held bit-identical to the CPU backend's
 * portable kernels by test_cmp_f16 and to the reference forward pass by test_engine.c's test_ref_f16. */
static void test_perplexity_llama19m(void **state)
{
    (void)state;
    const char *golden = TEST_SHARED_OR_SKIP("golden/perplexity.json");
    const char *story = TEST_SHARED_OR_SKIP("golden/story.txt");
    char *text = test_read_file(story, NULL);
    assert_non_null(text);
    json_error_t je;
    json_t *root = json_load_file(golden, 0, &je);
    assert_non_null(root);
    const char *types[] = {"F16", "Q8_0", "Q4_K_M"};
    const bool on_scalar[] = {false, true, true};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char rel[128];
        snprintf(rel, sizeof rel, "models/llama-19M/llama-19M-%s.gguf", types[t]);
        double want = 0;
        int ctx = 0;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(root, "cases"), i, c) {
            if (strncmp(json_string_value(json_object_get(c, "model")), rel, strlen(rel)) == 0) {
                want = json_number_value(json_object_get(c, "ppl"));
                ctx = (int)json_integer_value(json_object_get(c, "ctx"));
            }
        }
        assert_true(want > 0 && ctx > 0);
        const char *path = TEST_SHARED_OR_SKIP(rel);
        char err[ERR_MSG_MAX];
        struct model *m = model_load(path, err);
        if (!m)
            fail_msg("%s", err);
        double tol = strcmp(types[t], "F16") == 0 ? 0.001 : 0.01;
        const char *backends[] = {"cpu", "scalar"};
        for (int k = 0; k < (on_scalar[t] ? 2 : 1); k++) {
            double got = perplexity(m, backends[k], text, ctx);
            double d = fabs(got - want) / want;
            print_message("    llama-19M-%-6s ctx %d %-6s perplexity %.4f, llama.cpp %.4f (%.3f%%, bound %.1f%%)\n",
                          types[t], ctx, backends[k], got, want, 100 * d, 100 * tol);
            if (!(d < tol))
                fail_msg("llama-19M-%s, %s backend: perplexity %.4f vs llama.cpp's %.4f (%.3f%% > %.1f%%)", types[t],
                         backends[k], got, want, 100 * d, 100 * tol);
        }
        model_destroy(m);
    }
    json_decref(root);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_backend_refused),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_cmp_f32),
        cmocka_unit_test(test_cmp_f16),
        cmocka_unit_test(test_cmp_bf16),
        cmocka_unit_test(test_cmp_q8_0),
        cmocka_unit_test(test_cmp_q4_0),
        cmocka_unit_test(test_cmp_q4_k_m),
        cmocka_unit_test(test_cmp_q6_k),
        cmocka_unit_test(test_cmp_mixed_float),
        cmocka_unit_test(test_relayout_q4_0),
        cmocka_unit_test(test_relayout_q8_0),
        cmocka_unit_test(test_relayout_q4_k),
        cmocka_unit_test(test_relayout_q6_k),
        cmocka_unit_test(test_relayout_tied),
        cmocka_unit_test(test_placed_q4_0),
        cmocka_unit_test(test_placed_q4_k_m),
        cmocka_unit_test(test_placed_q8_0_tied),
        cmocka_unit_test(test_perplexity_llama19m),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
