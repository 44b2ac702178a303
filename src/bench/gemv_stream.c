/*
 * gemv_stream: the decode kernels against a plain read of the same bytes (see gemv_stream.h).
 *
 * The weights are real quantized rows (a pool of random rows per row length, quantized by quant.h and
 * copied over every matrix), so the kernels see the scales and values a model has, in the layout the engine
 * gives them (quant_r16_convert where the kernel set has R16 kernels). All the layers' matrices lie one after
 * another in one huge-page buffer, each at a 64-byte boundary, as a model's do after gguf_open_mem, so a pass
 * streams them from memory in the order decode does.
 *
 * A third pass does the kernel pass's arithmetic on weights that stay in cache (gs_job_fn), so the two kernel
 * figures separate what the arithmetic costs from what the read adds.
 *
 * Why the engine's thread pool and a barrier after each matrix: decode waits for every thread at each
 * product, and a harness that sleeps there instead (pthread barriers) measured its own wake-ups (stop 25:
 * a plain read matrix by matrix with sleeping barriers read 0.74x of one read of the whole buffer, with
 * spinning ones 0.96-0.98x).
 */
#include "bench/gemv_stream.h"

#include "bench/membw.h"
#include "core/bigmem.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/stats.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/cpu_tune.h"
#include "engine/cpu/gemv.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/threadpool.h"
#include "engine/gguf/quant.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GS_POOL 32 /* distinct quantized rows per row length */

/* From-cache passes: bytes of weights in each of a thread's two slices (one of a matrix with dim columns, one
 * with FFN columns): a quarter of the L2 the system reports (512 KiB on Zen 3, 1 MiB on Zen 4 and 5, 2 MiB on
 * the Xeon), so both slices and the activations stay there, within [64 KiB, 512 KiB]; 128 KiB where it reports
 * none. As large as that allows, because each kernel call over a slice pays its set-up again (the Q4_0 / Q8_0
 * gemm interleaves its columns' records per call: with 128 KiB slices on the Zen 5, Q4_0 at 8 columns measured
 * slower from cache than from memory). */
static size_t gs_cache_bytes(void)
{
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    size_t b = l2 > 0 ? (size_t)l2 / 4 : (size_t)128 << 10;
    b = b < ((size_t)64 << 10) ? (size_t)64 << 10 : b;
    return b > ((size_t)512 << 10) ? (size_t)512 << 10 : b;
}

struct gs_mat {
    const uint8_t *w; /* rows x row_bytes, in the kernel's layout */
    int64_t rows, cols;
    size_t row_bytes;
    const uint8_t *x; /* the activation rows for cols (vec_type): [batch][xb bytes] */
    const uint8_t *xa; /* batch > 1: their aux from prep, [batch][xab bytes] (NULL when the kernels need none) */
    size_t xb, xab;
};

struct gs_job {
    struct threadpool *tp;
    const struct gemv_ops *g;
    bool r16;
    bool read;             /* this pass: plain read instead of the kernel */
    bool cached;           /* this pass: the kernel over the thread's cache-resident slices (gs_job_fn) */
    size_t cache_bytes;    /* a slice's bytes (gs_cache_bytes) */
    _Atomic uint64_t cache_macs; /* multiply-adds the threads' kernel calls did in the last from-cache pass */
    struct gs_mat *mats;
    int n_mats;
    int batch;             /* activation columns (gemv_stream_opts) */
    float *y;              /* [batch][ldy]: the products */
    size_t ldy;            /* max rows */
    uint8_t *aux;          /* [threads][aux_stride] */
    size_t aux_stride;
    uint8_t *scratch;      /* [threads][scratch_stride]: gemm16's scratch, or NULL */
    size_t scratch_stride;
    _Atomic uint64_t sink; /* keeps the reads alive */
};

/* Thread ith's share of matrix a, in rows: whole R16 groups where the layout has them. */
static void gs_share(const struct gs_job *j, const struct gs_mat *a, int ith, int nth, int64_t *r0, int64_t *r1)
{
    int64_t unit = j->r16 ? QUANT_R16_ROWS : 1;
    threadpool_split(a->rows / unit, ith, nth, r0, r1);
    *r0 *= unit, *r1 *= unit;
}

/* The kernel decode (batch 1) or batched decode runs, over n rows of a's shape at w: y[c][0..n) for each column. */
static void gs_kernel(const struct gs_job *j, const struct gs_mat *a, const uint8_t *w, int64_t n, float *y, int ith)
{
    if (j->batch > 1) {
        if (j->r16)
            j->g->gemm16(a->cols, (int)n, j->batch, y, j->ldy, w, a->x, a->xb, a->xa, a->xab,
                         j->scratch ? j->scratch + (size_t)ith * j->scratch_stride : NULL);
        else
            j->g->gemm(a->cols, (int)n, j->batch, y, j->ldy, w, a->row_bytes, a->x, a->xb, a->xa, a->xab);
        return;
    }
    uint8_t *aux = j->aux + (size_t)ith * j->aux_stride;
    j->g->prep(a->cols, a->x, aux);
    if (j->r16)
        j->g->gemv16(a->cols, n, y, w, a->x, aux);
    else
        j->g->gemv(a->cols, n, y, w, a->row_bytes, a->x, aux);
}

/* One pass over every matrix, each thread its share, a barrier after each: a plain read (j->read), the kernel,
 * or (j->cached) the kernel over the same number of rows taken from a slice that stays in the thread's L2: the
 * first j->cache_bytes of its share of layer 0's gate matrix (dim columns) or down matrix (FFN columns), again
 * and again, so the pass does the same arithmetic as the kernel's with (after the untimed first pass) no weight
 * from memory. */
static void gs_job_fn(void *ctx, int ith, int nth)
{
    struct gs_job *j = ctx;
    uint64_t sink = 0;
    for (int m = 0; m < j->n_mats; m++) {
        const struct gs_mat *a = &j->mats[m];
        int64_t r0, r1;
        gs_share(j, a, ith, nth, &r0, &r1);
        const uint8_t *w = a->w + (size_t)r0 * a->row_bytes;
        if (r1 > r0 && j->read) {
            size_t n = (size_t)(r1 - r0) * a->row_bytes;
            /* membw_read's wide loads want 32-byte alignment, which every share here has (16 rows of an
             * even row size, or whole F16 rows); the scalar loop covers anything else */
            sink ^= ((uintptr_t)w & 31) ? membw_read_scalar(w, n) : membw_read(w, n);
        } else if (r1 > r0 && j->cached) {
            const struct gs_mat *s = &j->mats[a->cols == j->mats[4].cols ? 4 : 6]; /* gate or down of layer 0 */
            int64_t s0, s1, unit = j->r16 ? QUANT_R16_ROWS : 1;
            gs_share(j, s, ith, nth, &s0, &s1);
            int64_t k = (int64_t)(j->cache_bytes / s->row_bytes) / unit * unit;
            k = k < unit ? unit : k;
            k = k < s1 - s0 ? k : s1 - s0;
            for (int64_t d = 0, n; k > 0 && d < r1 - r0; d += n) {
                n = r1 - r0 - d < k ? r1 - r0 - d : k;
                gs_kernel(j, s, s->w + (size_t)s0 * s->row_bytes, n, j->y + r0, ith); /* the same outputs each time */
                atomic_fetch_add_explicit(&j->cache_macs, (uint64_t)n * (uint64_t)s->cols * (uint64_t)j->batch,
                                          memory_order_relaxed);
            }
        } else if (r1 > r0) {
            gs_kernel(j, a, w, r1 - r0, j->y + r0, ith);
        }
        threadpool_barrier(j->tp);
    }
    atomic_fetch_xor_explicit(&j->sink, sink, memory_order_relaxed);
}

void gemv_stream_opts_default(struct gemv_stream_opts *o, enum dtype t)
{
    memset(o, 0, sizeof *o);
    o->type = t;
    o->passes = 20;
    o->dim = 2048;
    o->ffn = 8192;
    o->kv_dim = 512;
    o->layers = 16;
    o->batch = 1;
}

/* A uniform float in [-1, 1) from the xorshift64 state *rng (never 0). */
static float gs_rand(uint64_t *rng)
{
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
    return (float)((double)(*rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Quantizes GS_POOL random rows of n elements into pool (GS_POOL x dtype_row_bytes(t, n) bytes). */
static int gs_pool_fill(enum dtype t, int64_t n, uint8_t *pool, uint64_t *rng, char *err)
{
    float *f = malloc((size_t)n * sizeof *f);
    if (!f)
        return err_set(err, ERR_NOMEM, "stream: out of memory");
    size_t rb = dtype_row_bytes(t, n);
    int rc = 0;
    for (int i = 0; i < GS_POOL && !rc; i++) {
        for (int64_t k = 0; k < n; k++)
            f[k] = gs_rand(rng);
        rc = quant_row_from_f32(t, f, pool + (size_t)i * rb, n);
    }
    free(f);
    return rc ? err_set(err, rc, "stream: cannot quantize rows of %s", dtype_name(t)) : 0;
}

int gemv_stream_run(const struct gemv_stream_opts *o, struct gemv_stream_result *out, char *err)
{
    int rc = ERR_NOMEM;
    const struct gemv_ops *g = gemv_ops_best(o->type);
    const struct kernel_ops *ko = kernel_ops_get(o->type);
    if (!g || !ko || !g->gemv)
        return err_set(err, ERR_UNSUPPORTED, "stream: no decode kernel for %s on this CPU (F16, Q8_0, Q4_0, Q4_K "
                                             "and Q6_K have them where AVX2 is)", dtype_name(o->type));
    int dim = o->dim, ffn = o->ffn, kv = o->kv_dim, layers = o->layers, passes = o->passes > 0 ? o->passes : 20;
    int batch = o->batch > 0 ? o->batch : 1;
    if (dim <= 0 || ffn <= 0 || kv <= 0 || dim % 256 || ffn % 256 || kv % 256 || layers <= 0 || layers > 1024 ||
        passes > 10000)
        return err_set(err, ERR_INVALID_ARG, "stream: shapes must be positive multiples of 256 (dim %d, ffn %d, "
                                              "kv %d), layers 1-1024 (%d), passes at most 10000 (%d)",
                       dim, ffn, kv, layers, passes);
    if (batch > 64)
        return err_set(err, ERR_INVALID_ARG, "stream: --batch takes 1-64 columns (got %d)", batch);
    int n_rules = o->n_rules;
    if (n_rules < 0 || n_rules > GEMV_STREAM_MAX_RULES || (n_rules > 0 && batch > 1))
        return err_set(err, ERR_INVALID_ARG, "stream: 0-%d prefetch rules, with one column only (%d rules, %d columns)",
                       GEMV_STREAM_MAX_RULES, n_rules, batch);
    cpu_tune_load_once(); /* the rules decode runs on this CPU */
    for (int i = 0; i < n_rules; i++)
        if (!cpu_decode_prefetch_valid(o->type, o->rules[i]))
            return err_set(err, ERR_INVALID_ARG, "stream: the %s decode gemv has no prefetch rule '%s' on this CPU",
                           dtype_name(o->type), cpu_prefetch_name(o->rules[i]));
    if (n_rules && cpu_decode_prefetch_env())
        return err_set(err, ERR_INVALID_ARG, "stream: WAFER_GEMV_PREFETCH or WAFER_PREFETCH_NTA in the environment "
                                              "decides the prefetch rule; unset them to measure the rules");
    int saved_rule = cpu_decode_prefetch_tuned(o->type);
    bool r16 = g->gemv16 && quant_r16_supported(o->type);
    if (batch > 1 && !(r16 ? g->gemm16 != NULL : g->gemm != NULL))
        return err_set(err, ERR_UNSUPPORTED, "stream: no batched kernel for %s on this CPU", dtype_name(o->type));
    /* the 7 products of a layer: q, k, v, o, gate, up (rows x cols), down */
    const int64_t shp[7][2] = {{dim, dim}, {kv, dim}, {kv, dim}, {dim, dim}, {ffn, dim}, {ffn, dim}, {dim, ffn}};
    int n_mats = 7 * layers;
    size_t total = 0, largest = 0;
    for (int s = 0; s < 7; s++) {
        size_t b = (size_t)shp[s][0] * dtype_row_bytes(o->type, shp[s][1]);
        total += (b + 63) & ~(size_t)63;
        largest = b > largest ? b : largest;
    }
    total *= (size_t)layers;

    struct gs_job j = {.g = g, .r16 = r16, .n_mats = n_mats, .batch = batch, .cache_bytes = gs_cache_bytes()};
    uint8_t *buf = bigmem_alloc(total), *tmp = malloc(largest);
    size_t rb_dim = dtype_row_bytes(o->type, dim), rb_ffn = dtype_row_bytes(o->type, ffn);
    uint8_t *pool_dim = malloc(GS_POOL * rb_dim), *pool_ffn = malloc(GS_POOL * rb_ffn);
    /* the activation rows and their aux, [batch] of each, every row 64-byte aligned */
    enum dtype vt = ko->vec_type;
    size_t xb_dim = (dtype_row_bytes(vt, dim) + 63) & ~(size_t)63;
    size_t xb_ffn = (dtype_row_bytes(vt, ffn) + 63) & ~(size_t)63;
    size_t xab_dim = (g->aux_bytes(dim) + 63) & ~(size_t)63, xab_ffn = (g->aux_bytes(ffn) + 63) & ~(size_t)63;
    uint8_t *x_dim = aligned_alloc(64, xb_dim * (size_t)batch), *x_ffn = aligned_alloc(64, xb_ffn * (size_t)batch);
    uint8_t *xa_dim = aligned_alloc(64, xab_dim * (size_t)batch + 64);
    uint8_t *xa_ffn = aligned_alloc(64, xab_ffn * (size_t)batch + 64);
    float *xf = malloc((size_t)ffn * sizeof *xf);
    double *t_read = malloc((size_t)passes * sizeof(double)), *t_kern = malloc((size_t)passes * sizeof(double));
    double *pair = malloc((size_t)passes * sizeof(double)), *t_cache = calloc((size_t)passes, sizeof(double));
    double *t_rule = malloc((size_t)passes * GEMV_STREAM_MAX_RULES * sizeof(double)); /* [rule][pass] */
    j.mats = calloc((size_t)n_mats, sizeof *j.mats);
    j.ldy = (size_t)(ffn > dim ? ffn : dim);
    j.y = malloc(j.ldy * (size_t)batch * sizeof(float));
    j.tp = threadpool_create(o->n_threads);
    if (!buf || !tmp || !pool_dim || !pool_ffn || !x_dim || !x_ffn || !xa_dim || !xa_ffn || !xf || !t_read || !t_kern ||
        !pair || !t_cache || !t_rule || !j.mats || !j.y || !j.tp) {
        err_set(err, ERR_NOMEM, "stream: cannot allocate %.0f MB of weights and buffers", total / 1e6);
        goto out;
    }
    int nth = threadpool_size(j.tp);
    size_t ab = g->aux_bytes(ffn) > g->aux_bytes(dim) ? g->aux_bytes(ffn) : g->aux_bytes(dim);
    j.aux_stride = (ab + 63) & ~(size_t)63;
    j.aux = aligned_alloc(64, j.aux_stride * (size_t)nth + 64);
    if (r16 && g->gemm16_scratch) {
        size_t sd = g->gemm16_scratch(dim), sf = g->gemm16_scratch(ffn);
        j.scratch_stride = ((sd > sf ? sd : sf) + 63) & ~(size_t)63;
        j.scratch = aligned_alloc(64, j.scratch_stride * (size_t)nth);
    }
    if (!j.aux || (j.scratch_stride && !j.scratch)) {
        err_set(err, ERR_NOMEM, "stream: out of memory");
        goto out;
    }
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    if ((rc = gs_pool_fill(o->type, dim, pool_dim, &rng, err)) || (rc = gs_pool_fill(o->type, ffn, pool_ffn, &rng, err)))
        goto out;
    for (int c = 0; c < batch; c++) {
        for (int64_t k = 0; k < ffn; k++)
            xf[k] = gs_rand(&rng);
        ko->from_f32(xf, x_dim + (size_t)c * xb_dim, dim);
        ko->from_f32(xf, x_ffn + (size_t)c * xb_ffn, ffn);
        if (xab_dim)
            g->prep(dim, x_dim + (size_t)c * xb_dim, xa_dim + (size_t)c * xab_dim);
        if (xab_ffn)
            g->prep(ffn, x_ffn + (size_t)c * xb_ffn, xa_ffn + (size_t)c * xab_ffn);
    }

    /* every matrix: pool rows (a different order in each), then the kernel's layout */
    size_t off = 0;
    for (int m = 0; m < n_mats; m++) {
        struct gs_mat *a = &j.mats[m];
        a->rows = shp[m % 7][0];
        a->cols = shp[m % 7][1];
        a->row_bytes = a->cols == dim ? rb_dim : rb_ffn;
        a->x = a->cols == dim ? x_dim : x_ffn;
        a->xb = a->cols == dim ? xb_dim : xb_ffn;
        a->xab = a->cols == dim ? xab_dim : xab_ffn;
        a->xa = a->xab ? (a->cols == dim ? xa_dim : xa_ffn) : NULL;
        const uint8_t *pool = a->cols == dim ? pool_dim : pool_ffn;
        uint8_t *dst = buf + off;
        for (int64_t r = 0; r < a->rows; r++)
            memcpy((r16 ? tmp : dst) + (size_t)r * a->row_bytes, pool + (size_t)((r * 7 + m) % GS_POOL) * a->row_bytes,
                   a->row_bytes);
        if (r16 && (rc = quant_r16_convert(o->type, tmp, dst, a->rows, a->cols, true))) {
            err_set(err, rc, "stream: cannot lay %s out in R16 groups", dtype_name(o->type));
            goto out;
        }
        a->w = dst;
        off += ((size_t)a->rows * a->row_bytes + 63) & ~(size_t)63;
    }

    /* one untimed pass of each (threads awake, pages and TLB warm, the slices in cache), then alternated timed
     * passes: read, kernel, kernel from cache */
    for (int p = -1; p < passes; p++)
        for (int v = 0; v < (n_rules ? 1 + n_rules : 3); v++) {
            j.read = v == 0;
            j.cached = !n_rules && v == 2;
            if (n_rules && v > 0)
                cpu_decode_prefetch_set(o->type, o->rules[v - 1]);
            atomic_store(&j.cache_macs, 0);
            double t0 = clock_now_s();
            threadpool_run(j.tp, gs_job_fn, &j);
            double t = clock_now_s() - t0;
            if (p < 0)
                continue;
            if (n_rules && v > 0)
                t_rule[(size_t)(v - 1) * passes + p] = t;
            (v == 0 ? t_read : v == 1 ? t_kern : t_cache)[p] = t; /* with rules: t_kern the first rule's */
        }
    cpu_decode_prefetch_set(o->type, saved_rule);
    double bytes = 0;
    for (int m = 0; m < n_mats; m++)
        bytes += (double)j.mats[m].rows * (double)j.mats[m].row_bytes;
    for (int p = 0; p < passes; p++)
        pair[p] = t_read[p] / t_kern[p];
    struct stats_summary sp, sr, sk, sc;
    stats_summarize(pair, (size_t)passes, &sp);
    stats_summarize(t_read, (size_t)passes, &sr);
    stats_summarize(t_kern, (size_t)passes, &sk);
    stats_summarize(t_cache, (size_t)passes, &sc);
    memset(out, 0, sizeof *out);
    out->bytes = (size_t)bytes;
    out->passes = passes;
    out->threads = nth;
    out->layout = r16 ? "R16" : "rows";
    out->share = sp.p50;
    out->share_lo = sp.min;
    out->share_hi = sp.max;
    out->read_gbs = bytes / sr.p50 / 1e9;
    out->kernel_gbs = bytes / sk.p50 / 1e9;
    double macs = 0;
    for (int m = 0; m < n_mats; m++)
        macs += (double)j.mats[m].rows * (double)j.mats[m].cols * batch;
    out->kernel_gmacs = macs / sk.p50 / 1e9;
    out->macs = macs;
    out->cache_macs = (double)atomic_load(&j.cache_macs);
    out->cache_gbs = bytes / sc.p50 / 1e9;
    out->cache_gmacs = macs / sc.p50 / 1e9;
    out->cache_kib = (int)(j.cache_bytes >> 10);
    for (int i = 0; i < n_rules; i++) { /* the ratios of each round first: stats_summarize sorts what it is given */
        struct stats_summary s2;
        for (int p = 0; p < passes; p++)
            pair[p] = t_rule[p] / t_rule[(size_t)i * passes + p];
        stats_summarize(pair, (size_t)passes, &s2);
        out->rule_vs_first[i] = s2.p50;
    }
    for (int i = 0; i < n_rules; i++) {
        struct stats_summary s1;
        stats_summarize(t_rule + (size_t)i * passes, (size_t)passes, &s1);
        out->rule_gbs[i] = bytes / s1.p50 / 1e9;
    }
    if (batch == 1 && !n_rules) {
        const char *rule = cpu_prefetch_name(cpu_decode_prefetch(o->type));
        snprintf(out->decode_prefetch, sizeof out->decode_prefetch, "%s", rule);
        snprintf(out->decode_prefetch_source, sizeof out->decode_prefetch_source, "%s", cpu_tune_source());
    }
    if (n_rules) { /* no from-cache passes ran */
        out->cache_gbs = out->cache_gmacs = out->cache_macs = 0;
        out->cache_kib = 0;
    }
    rc = 0;
out:
    if (j.tp)
        threadpool_destroy(j.tp);
    volatile uint64_t keep = atomic_load(&j.sink); /* the reads' checksum, so they cannot be dropped */
    (void)keep;
    bigmem_free(buf, total);
    free(tmp);
    free(pool_dim);
    free(pool_ffn);
    free(x_dim);
    free(x_ffn);
    free(xa_dim);
    free(xa_ffn);
    free(xf);
    free(t_read);
    free(t_kern);
    free(pair);
    free(t_cache);
    free(t_rule);
    free(j.mats);
    free(j.y);
    free(j.aux);
    free(j.scratch);
    return rc;
}
