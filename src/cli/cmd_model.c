/*
 * wafer model new: writes a llama-family GGUF of any shape and weight format with random weights, so tests
 * and benchmarks can make the models they need on a machine that cannot download any. The vocabulary
 * (every tokenizer.* key) is copied from an existing GGUF, e.g. a vocab-only file.
 *
 * Weights are N(0, std) (norm weights 1 + N(0, 0.1)), drawn from a generator seeded per (seed, tensor,
 * row), so the file is identical for a seed whatever the thread count. Rows are generated and quantized in
 * parallel and streamed to disk one tensor at a time.
 */
#include "cli/cli.h"
#include "cli/cli_common.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/ftype.h"
#include "engine/gguf.h"
#include "engine/quant.h"
#include "engine/threadpool.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void model_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer model new --dim D --layers L --heads H --ffn F --vocab-from VOCAB.gguf [options] OUT.gguf\n\n"
            "Writes a model with random weights (for tests and benchmarks).\n\n"
            "  --arch A          llama (default) or qwen2 (adds q/k/v biases)\n"
            "  --dim D           embedding size\n"
            "  --layers L        transformer blocks\n"
            "  --heads H         attention heads\n"
            "  --kv-heads K      key/value heads (default H)\n"
            "  --ffn F           feed-forward size\n"
            "  --vocab-from V    GGUF whose tokenizer.* metadata is copied (a vocab-only file works)\n"
            "  --type T          weight format: %s (default f32)\n"
            "  --pure            every matrix in the format's base type (no Q6_K output etc.)\n"
            "  --ctx N           context length (default 2048)\n"
            "  --rope-base B     RoPE base (default 10000)\n"
            "  --tied            no output matrix: token_embd is reused\n"
            "  --std S           weight standard deviation (default 0.02)\n"
            "  --seed S          (default 1)\n"
            "  --threads N       (default: all cores)\n",
            ftype_list());
}

struct model_gen_job {
    enum dtype type;
    int64_t ne0, rows;
    size_t row_bytes;
    uint8_t *out;
    uint64_t seed;
    int tensor;
    float std, mean;
    int fail;
};

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

static void model_gen_worker(void *ctx, int ith, int nth)
{
    struct model_gen_job *j = ctx;
    float *row = malloc((size_t)j->ne0 * sizeof *row);
    if (!row) {
        j->fail = 1;
        return;
    }
    int64_t r0, r1;
    threadpool_split(j->rows, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        model_gen_row(row, j->ne0, model_gen_mix(j->seed ^ model_gen_mix(((uint64_t)j->tensor << 40) ^ (uint64_t)r)),
                      j->mean, j->std);
        if (quant_row_from_f32(j->type, row, j->out + (size_t)r * j->row_bytes, j->ne0))
            j->fail = 1;
    }
    free(row);
}

struct model_tensor_decl {
    char name[64];
    uint32_t n_dims;
    int64_t ne[2];
    enum dtype type;
    bool is_norm;
};

int cmd_model_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "new")) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            model_usage(stdout);
            return 0;
        }
        fprintf(stderr, "wafer model: expected the subcommand 'new'\n\n");
        model_usage(stderr);
        return 2;
    }
    argc--, argv++;
    static const struct option opts[] = {
        {"arch", required_argument, 0, 1},       {"dim", required_argument, 0, 2},
        {"layers", required_argument, 0, 3},     {"heads", required_argument, 0, 4},
        {"kv-heads", required_argument, 0, 5},   {"ffn", required_argument, 0, 6},
        {"vocab-from", required_argument, 0, 7}, {"type", required_argument, 0, 8},
        {"seed", required_argument, 0, 9},       {"ctx", required_argument, 0, 10},
        {"tied", no_argument, 0, 11},            {"std", required_argument, 0, 12},
        {"threads", required_argument, 0, 13},   {"pure", no_argument, 0, 14},
        {"rope-base", required_argument, 0, 15}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *arch = "llama", *vocab = NULL;
    long dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, ctx = 2048, threads = 0;
    uint64_t seed = 1;
    double std_ = 0.02, rope_base = 10000;
    bool tied = false, pure = false;
    enum ftype ft = FTYPE_F32;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 1:
            if (strcmp(optarg, "llama") && strcmp(optarg, "qwen2")) {
                fprintf(stderr, "wafer model new: --arch: expected llama or qwen2, got '%s'\n", optarg);
                return 2;
            }
            arch = optarg;
            break;
        case 2: if (cli_parse_int("model new", "--dim", optarg, 2, 65536, &dim)) return 2; break;
        case 3: if (cli_parse_int("model new", "--layers", optarg, 1, 1024, &layers)) return 2; break;
        case 4: if (cli_parse_int("model new", "--heads", optarg, 1, 1024, &heads)) return 2; break;
        case 5: if (cli_parse_int("model new", "--kv-heads", optarg, 1, 1024, &kv_heads)) return 2; break;
        case 6: if (cli_parse_int("model new", "--ffn", optarg, 1, 1 << 20, &ffn)) return 2; break;
        case 7: vocab = optarg; break;
        case 8:
            if (ftype_from_name(optarg, &ft)) {
                fprintf(stderr, "wafer model new: --type: unknown format '%s' (supported: %s)\n", optarg, ftype_list());
                return 2;
            }
            break;
        case 9: if (cli_parse_u64("model new", "--seed", optarg, &seed)) return 2; break;
        case 10: if (cli_parse_int("model new", "--ctx", optarg, 1, 1 << 24, &ctx)) return 2; break;
        case 11: tied = true; break;
        case 12: if (cli_parse_float("model new", "--std", optarg, 0, 100, &std_)) return 2; break;
        case 13: if (cli_parse_int("model new", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 14: pure = true; break;
        case 15: if (cli_parse_float("model new", "--rope-base", optarg, 1, 1e12, &rope_base)) return 2; break;
        case 'h': model_usage(stdout); return 0;
        default: model_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || !dim || !layers || !heads || !ffn || !vocab) {
        fprintf(stderr, "wafer model new: --dim, --layers, --heads, --ffn, --vocab-from and one OUT.gguf are required\n\n");
        model_usage(stderr);
        return 2;
    }
    const char *out_path = argv[optind];
    if (!kv_heads)
        kv_heads = heads;
    if (dim % heads || heads % kv_heads || (dim / heads) % 2) {
        fprintf(stderr, "wafer model new: --dim must be a multiple of --heads, --heads a multiple of --kv-heads, and "
                        "the head size (dim/heads) even\n");
        return 2;
    }
    char err[ERR_MSG_MAX];
    int rc = 1;
    struct gguf *vg = NULL;
    struct gguf_writer *w = NULL;
    struct threadpool *tp = NULL;
    struct model_tensor_decl *decl = NULL;
    uint8_t *buf = NULL;
    vg = gguf_open(vocab, err);
    if (!vg) {
        fprintf(stderr, "wafer model new: --vocab-from: %s\n", err);
        return 1;
    }
    const struct gguf_kv *tokens_kv;
    if (gguf_get_arr(vg, "tokenizer.ggml.tokens", &tokens_kv) || tokens_kv->arr_type != GGUF_TYPE_STRING) {
        fprintf(stderr, "wafer model new: --vocab-from %s has no tokenizer.ggml.tokens list\n", vocab);
        goto out;
    }
    int64_t n_vocab = (int64_t)tokens_kv->arr_len;
    long hd = dim / heads;
    w = gguf_writer_create();
    tp = threadpool_create((int)threads);
    if (!w || !tp)
        goto oom;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    int e = 0;
    e |= gguf_writer_set_str(w, "general.architecture", arch);
    snprintf(err, sizeof err, "wafer random %s d%ld l%ld %s", arch, dim, layers, ftype_name(ft));
    e |= gguf_writer_set_str(w, "general.name", err);
    e |= gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft);
    e |= gguf_writer_set_u32(w, "general.quantization_version", 2);
    e |= gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)ctx);
    e |= gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)dim);
    e |= gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)layers);
    e |= gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)ffn);
    e |= gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)heads);
    e |= gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)kv_heads);
    e |= gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    e |= gguf_writer_set_f32(w, KEY("rope.freq_base"), (float)rope_base);
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
#define LADD(suffix, d0, d1, nd, norm) (snprintf(nm, sizeof nm, "blk.%ld.%s", l, suffix), ADD(nm, d0, d1, nd, norm))
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
        t->type = ftype_tensor_type(ft, t->name, t->n_dims, t->ne[0], (int)layers, tied, pure);
        int idx = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
        if (idx < 0) {
            fprintf(stderr, "wafer model new: cannot declare tensor %s: %s\n", t->name, err_name(idx));
            goto out;
        }
        size_t nb = dtype_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
        if (nb > max_bytes)
            max_bytes = nb;
    }
    buf = malloc(max_bytes);
    if (!buf)
        goto oom;
    if (gguf_writer_begin(w, out_path, err)) {
        fprintf(stderr, "wafer model new: %s\n", err);
        goto out;
    }
    double t0 = cli_now();
    for (int i = 0; i < n_t; i++) {
        struct model_tensor_decl *t = &decl[i];
        struct model_gen_job job = {
            .type = t->type,
            .ne0 = t->ne[0],
            .rows = t->ne[1],
            .row_bytes = dtype_row_bytes(t->type, t->ne[0]),
            .out = buf,
            .seed = seed,
            .tensor = i,
            .std = t->is_norm ? 0.1f : (float)std_,
            .mean = t->is_norm ? 1.0f : 0.0f,
        };
        threadpool_run(tp, model_gen_worker, &job);
        if (job.fail) {
            fprintf(stderr, "wafer model new: cannot quantize %s to %s\n", t->name, dtype_name(t->type));
            goto out;
        }
        if (gguf_writer_write_tensor(w, i, buf, job.row_bytes * (size_t)job.rows, err)) {
            fprintf(stderr, "wafer model new: %s\n", err);
            goto out;
        }
        if (i == n_t - 1 || i % 10 == 0)
            fprintf(stderr, "\r[%d/%d] %-28s %-5s %.1f s", i + 1, n_t, t->name, dtype_name(t->type), cli_now() - t0);
    }
    fputc('\n', stderr);
    if (gguf_writer_finish(w, err)) {
        fprintf(stderr, "wafer model new: %s\n", err);
        goto out;
    }
    log_info("wrote %s: %s, dim %ld, %ld layers, %ld heads (%ld kv), ffn %ld, vocab %lld, %s", out_path, arch, dim,
             layers, heads, kv_heads, ffn, (long long)n_vocab, ftype_name(ft));
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "wafer model new: out of memory\n");
out:
    free(buf);
    free(decl);
    threadpool_destroy(tp);
    gguf_writer_destroy(w);
    gguf_close(vg);
    return rc;
}
