/*
 * quantize: rewrites a GGUF model with its weight matrices in another type (see quantize.h); `wafer
 * quantize` (src/cli/cmd_quantize.c) is its command line.
 *
 * All metadata is copied (general.file_type is set to llama.cpp's number for TYPE). Each tensor is converted
 * row by row through f32 (quant_row_to_f32 then quant_row_from_f32) and streamed to the writer in chunks, so
 * memory stays at one chunk however big the model is; a tensor already in its target type is copied as is
 * (requantizing would only add error). Every source type is checked before the output is created, so a model
 * we cannot convert fails at once instead of leaving half a file.
 *
 * Type choice follows llama-quantize: output.weight gets Q6_K for quantized targets unless --pure, q4_k_m
 * gives attn_v and ffn_down of "use more bits" layers Q6_K, and rows that do not divide into the target's
 * blocks fall back to a type that fits.
 */
#include "engine/gguf/quantize.h"

#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/ftype.h"
#include "engine/gguf/quant.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define QUANTIZE_CHUNK_BYTES (4u << 20) /* output bytes converted per write */

static const struct quantize_target quantize_targets[] = {
    {"f32", DTYPE_F32, 0, false},   {"f16", DTYPE_F16, 1, false},   {"bf16", DTYPE_BF16, 32, false},
    {"q8_0", DTYPE_Q8_0, 7, false}, {"q4_0", DTYPE_Q4_0, 2, false}, {"q6_k", DTYPE_Q6_K, 18, false},
    {"q4_k_m", DTYPE_Q4_K, 15, true},
};

int quantize_target_parse(const char *name, struct quantize_target *out)
{
    for (size_t i = 0; i < sizeof quantize_targets / sizeof quantize_targets[0]; i++) {
        if (!strcasecmp(name, quantize_targets[i].name)) {
            *out = quantize_targets[i];
            return 0;
        }
    }
    return ERR_INVALID_ARG;
}

const char *quantize_target_list(void) { return "f32, f16, bf16, q8_0, q4_0, q6_k, q4_k_m"; }

static bool quantize_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

bool quantize_tensor_wanted(const struct gguf_tensor *t)
{
    return quantize_ends_with(t->name, ".weight") && t->n_dims >= 2 && t->ne[1] > 1;
}

void quantize_plan(const struct gguf *g, const struct quantize_target *t, bool pure, enum dtype *types,
                   bool *fallback)
{
    int64_t n = gguf_tensor_count(g);
    int n_layers = 0;
    bool has_output = gguf_tensor_find(g, "output.weight") != NULL;
    for (int64_t i = 0; i < n; i++)
        n_layers += strstr(gguf_tensor_at(g, i)->name, "attn_v.weight") != NULL;
    for (int64_t i = 0; i < n; i++) {
        const struct gguf_tensor *x = gguf_tensor_at(g, i);
        bool fb = false;
        types[i] = quantize_tensor_wanted(x) ? ftype_tensor_type((enum ftype)t->file_type, x->name, x->n_dims, x->ne[0],
                                                                 n_layers, !has_output, pure, &fb)
                                             : x->type;
        if (fallback)
            fallback[i] = fb;
    }
}

/* The types quant_row_to_f32/quant_row_from_f32 handle for weights. */
static bool quantize_convertible(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: case DTYPE_F16: case DTYPE_BF16: case DTYPE_Q8_0: case DTYPE_Q4_0: case DTYPE_Q4_K: case DTYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

static double quantize_mib(size_t n) { return (double)n / (1024.0 * 1024.0); }

/* Converts tensor x (rows of ne[0] elements in x->type) to dst type and streams it as writer tensor i. */
static int quantize_tensor(struct gguf_writer *w, int i, const struct gguf_tensor *x, enum dtype dst, const char *out,
                           char *err)
{
    if (x->type == dst)
        return gguf_writer_write_tensor(w, i, x->data, x->nbytes, err);
    int64_t ne0 = x->ne[0];
    size_t src_row = dtype_row_bytes(x->type, ne0), dst_row = dtype_row_bytes(dst, ne0);
    int64_t rows = (int64_t)(x->nbytes / src_row);
    int64_t per_chunk = (int64_t)(QUANTIZE_CHUNK_BYTES / dst_row);
    if (per_chunk < 1)
        per_chunk = 1;
    if (per_chunk > rows)
        per_chunk = rows;
    float *f = malloc((size_t)ne0 * sizeof *f);      /* [ne0] one row in f32 */
    uint8_t *buf = malloc((size_t)per_chunk * dst_row); /* [per_chunk][dst_row] converted rows */
    int rc = 0;
    if (!f || !buf) {
        rc = err_set(err, ERR_NOMEM, "%s: out of memory converting '%s'", out, x->name);
        goto done;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
        int64_t nr = rows - r0 < per_chunk ? rows - r0 : per_chunk;
        for (int64_t r = 0; r < nr; r++) {
            const uint8_t *src = (const uint8_t *)x->data + (size_t)(r0 + r) * src_row;
            if (quant_row_to_f32(x->type, src, f, ne0) != 0 ||
                quant_row_from_f32(dst, f, buf + (size_t)r * dst_row, ne0) != 0) {
                rc = err_set(err, ERR_UNSUPPORTED, "%s: cannot convert '%s' from %s to %s", out, x->name,
                             dtype_name(x->type), dtype_name(dst));
                goto done;
            }
        }
        if ((rc = gguf_writer_write_data(w, i, buf, (size_t)nr * dst_row, err)))
            goto done;
    }
done:
    free(f);
    free(buf);
    return rc;
}

int quantize_file(const char *in, const char *out, const struct quantize_target *t, bool pure, FILE *progress,
                  char *err)
{
    struct stat si, so;
    if (stat(in, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return err_set(err, ERR_INVALID_ARG, "%s: output is the input file; write to a new file", out);
    struct gguf *g = gguf_open(in, err);
    if (!g)
        return ERR_FORMAT;
    int64_t n = gguf_tensor_count(g);
    enum dtype *types = calloc((size_t)(n ? n : 1), sizeof *types);
    bool *fallback = calloc((size_t)(n ? n : 1), sizeof *fallback);
    struct gguf_writer *w = gguf_writer_create();
    bool created = false;
    int rc = 0;
    if (!types || !fallback || !w) {
        rc = err_set(err, ERR_NOMEM, "%s: out of memory", in);
        goto done;
    }
    quantize_plan(g, t, pure, types, fallback);
    /* refuse before creating anything if some tensor cannot be converted */
    for (int64_t i = 0; i < n; i++) {
        const struct gguf_tensor *x = gguf_tensor_at(g, i);
        if (x->type != types[i] && !quantize_convertible(x->type)) {
            rc = err_set(err, ERR_UNSUPPORTED, "%s: tensor %" PRId64 " ('%s') has type %s, which quantize cannot read "
                         "(it reads %s)", in, i, x->name, dtype_name(x->type), "f32, f16, bf16, q8_0, q4_0, q4_k, q6_k");
            goto done;
        }
        if (fallback[i])
            log_warn("%s: rows of %" PRId64 " elements do not divide into %s blocks of %zu; using %s", x->name,
                     x->ne[0], dtype_name(t->base), dtype_block_elems(t->base), dtype_name(types[i]));
    }
    for (int64_t i = 0; i < gguf_kv_count(g); i++)
        if ((rc = gguf_writer_copy_kv(w, gguf_kv_at(g, i))))
            goto nomem;
    if ((rc = gguf_writer_set_u32(w, "general.file_type", t->file_type)))
        goto nomem;
    if (dtype_block_elems(t->base) > 1 && (rc = gguf_writer_set_u32(w, "general.quantization_version", 2)))
        goto nomem;
    for (int64_t i = 0; i < n; i++) {
        const struct gguf_tensor *x = gguf_tensor_at(g, i);
        int k = gguf_writer_add_tensor(w, x->name, types[i], x->n_dims, x->ne);
        if (k < 0) {
            rc = err_set(err, k, "%s: cannot declare tensor '%s' as %s", out, x->name, dtype_name(types[i]));
            goto done;
        }
    }
    created = true;
    if ((rc = gguf_writer_begin(w, out, err)))
        goto done;
    size_t in_bytes = 0, out_bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        const struct gguf_tensor *x = gguf_tensor_at(g, i);
        size_t nb = dtype_row_bytes(types[i], x->ne[0]) * (x->nbytes / dtype_row_bytes(x->type, x->ne[0]));
        if (progress) {
            char shape[96];
            int o = snprintf(shape, sizeof shape, "[%" PRId64, x->ne[0]);
            for (uint32_t d = 1; d < x->n_dims; d++)
                o += snprintf(shape + o, sizeof shape - (size_t)o, ", %" PRId64, x->ne[d]);
            snprintf(shape + o, sizeof shape - (size_t)o, "]");
            fprintf(progress, "[%*" PRId64 "/%" PRId64 "] %-32s %-18s %5s -> %-5s %8.2f MiB -> %8.2f MiB\n",
                    (int)snprintf(NULL, 0, "%" PRId64, n), i + 1, n, x->name, shape, dtype_name(x->type),
                    dtype_name(types[i]), quantize_mib(x->nbytes), quantize_mib(nb));
            fflush(progress);
        }
        if ((rc = quantize_tensor(w, (int)i, x, types[i], out, err)))
            goto done;
        in_bytes += x->nbytes;
        out_bytes += nb;
    }
    if ((rc = gguf_writer_finish(w, err)))
        goto done;
    if (progress)
        fprintf(progress, "%s: %" PRId64 " tensors, %.2f MiB -> %.2f MiB of weights (%s)\n", out, n,
                quantize_mib(in_bytes), quantize_mib(out_bytes), t->name);
    goto done;
nomem:
    rc = err_set(err, rc, "%s: out of memory copying metadata", out);
done:
    gguf_writer_destroy(w);
    if (rc && created)
        unlink(out);
    free(types);
    free(fallback);
    gguf_close(g);
    return rc;
}

