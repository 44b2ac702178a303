/*
 * wafer perplexity: perplexity of a model over a text, computed as llama-perplexity does so figures compare
 * directly: tokenize the whole text with the model's special tokens (BOS first), split it into
 * n_chunk = floor(n_tokens / ctx) chunks of ctx tokens, replace each chunk's first token with BOS, evaluate
 * it from an empty KV cache, and score positions i = ctx/2 .. ctx-2 by -log softmax(logits[i])[token[i+1]].
 * PPL = exp(sum / count), count = n_chunk * (ctx - ctx/2 - 1).
 */
#include "cli/cli.h"
#include "core/flags.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/tokenizer/tokenizer.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ppl_usage(FILE *f)
{
    fprintf(f, "usage: wafer perplexity --model M.gguf --file TEXT [--ctx N] [--json] [--threads N] [--backend NAME]\n\n"
               "Perplexity over non-overlapping windows of N tokens (default 512), scored on the second half of\n"
               "each window, exactly as llama-perplexity computes it. Progress on stderr; --json prints\n"
               "{\"perplexity\": X, \"tokens\": N, ...} on stdout (tokens = scored tokens).\n\n"
               "  -m, --model PATH   GGUF model\n"
               "  -f, --file PATH    text file\n"
               "  -c, --ctx N        window size (default 512)\n"
               "  -b, --batch N      tokens per forward call (default: the window, at most 512)\n"
               "  -t, --threads N    compute threads (default: all cores)\n"
               "      --kv-type T    f16 (default), f32 or q8_0\n"
               "      --backend NAME compute backend: cpu (default) or scalar (the plain reference)\n"
               "      --no-simd      portable scalar kernels\n"
               "      --mmap         map the model file instead of reading it into memory\n"
               "      --json         machine-readable result\n");
}

/* -log softmax(l)[tok], computed in double for a stable sum over many windows. */
static double ppl_nll(const float *l, int n, int tok)
{
    float mx = l[0];
    for (int i = 1; i < n; i++)
        if (l[i] > mx)
            mx = l[i];
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)l[i] - mx);
    return log(s) - ((double)l[tok] - mx);
}

int cmd_perplexity_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
        {"ctx", required_argument, 0, 'c'},   {"batch", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'}, {"json", no_argument, 0, 1},
        {"kv-type", required_argument, 0, 2}, {"no-simd", no_argument, 0, 3},
        {"mmap", no_argument, 0, 4},          {"backend", required_argument, 0, 5},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *file = NULL;
    long ctx = 512, threads = 0, nbatch = 0;
    bool json = false, use_mmap = false;
    struct engine_opts eo;
    engine_opts_default(&eo);
    char err[ERR_MSG_MAX];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:f:c:b:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'f': file = optarg; break;
        case 'c': if (flags_parse_int("perplexity", "--ctx", optarg, 4, 1 << 20, &ctx)) return 2; break;
        case 'b': if (flags_parse_int("perplexity", "--batch", optarg, 1, 1 << 16, &nbatch)) return 2; break;
        case 't': if (flags_parse_int("perplexity", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 1: json = true; break;
        case 2:
            if (engine_opts_set_kv_type(&eo, optarg, err)) {
                fprintf(stderr, "wafer perplexity: --kv-type: %s\n", err);
                return 2;
            }
            break;
        case 3: eo.no_simd = true; break;
        case 4: use_mmap = true; break;
        case 5:
            if (engine_opts_set_backend(&eo, optarg, err)) {
                fprintf(stderr, "wafer perplexity: --backend: %s\n", err);
                return 2;
            }
            break;
        case 'h': ppl_usage(stdout); return 0;
        default: ppl_usage(stderr); return 2;
        }
    }
    if (!model_path || !file || optind != argc) {
        fprintf(stderr, "wafer perplexity: --model and --file are required\n\n");
        ppl_usage(stderr);
        return 2;
    }
    FILE *f = fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "wafer perplexity: cannot open %s: %m\n", file);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    {
        size_t cap = 1 << 16;
        text = malloc(cap);
        size_t n;
        while (text && (n = fread(text + len, 1, cap - len, f)) > 0) {
            len += n;
            if (len == cap) {
                char *t = realloc(text, cap *= 2);
                if (!t) {
                    free(text);
                    text = NULL;
                }
                text = t;
            }
        }
    }
    fclose(f);
    if (!text) {
        fprintf(stderr, "wafer perplexity: out of memory reading %s\n", file);
        return 1;
    }

    int rc = 1;
    struct engine *e = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    struct batch b = {0};
    struct model *m = engine_model_load(model_path, use_mmap, &eo, err);
    if (!m) {
        fprintf(stderr, "wafer perplexity: %s\n", err);
        free(text);
        return 1;
    }
    int n_vocab = m->hp.n_vocab;
    if (nbatch == 0)
        nbatch = ctx < 512 ? ctx : 512;
    eo.n_threads = (int)threads;
    eo.n_ctx = (int)ctx;
    eo.max_batch_tokens = (int)nbatch;
    struct engine_params ep;
    if (engine_params_for_model(m, &eo, &ep, err) || !(e = engine_create(m, &ep, err))) {
        fprintf(stderr, "wafer perplexity: %s\n", err);
        goto out;
    }
    int n_tok = tokenizer_encode_alloc(m->tok, text, len, true, false, &toks);
    if (n_tok < 0) {
        fprintf(stderr, "wafer perplexity: cannot tokenize %s: %s\n", file, err_name(n_tok));
        goto out;
    }
    int n_chunk = n_tok / (int)ctx;
    if (n_chunk == 0) {
        fprintf(stderr, "wafer perplexity: %s has %d tokens, fewer than one window of --ctx %ld; use a smaller --ctx\n",
                file, n_tok, ctx);
        goto out;
    }
    int first = (int)ctx / 2;
    int32_t bos = tokenizer_bos(m->tok);
    log_info("perplexity: %d tokens, %d windows of %ld, scoring positions %d..%ld of each", n_tok, n_chunk, ctx, first,
             ctx - 2);
    logits = malloc((size_t)nbatch * n_vocab * sizeof *logits);
    if (!logits || batch_init(&b, (int)nbatch))
        goto oom;
    double nll = 0, t0 = clock_now_s();
    long count = 0;
    for (int k = 0; k < n_chunk; k++) {
        const int32_t *w = toks + (size_t)k * ctx;
        engine_seq_truncate(e, 0, 0);
        for (int i0 = 0; i0 < ctx; i0 += (int)nbatch) {
            batch_clear(&b);
            for (int i = i0; i < ctx && i < i0 + nbatch; i++)
                batch_add(&b, i == 0 && bos >= 0 ? bos : w[i], i, 0, i >= first && i <= ctx - 2);
            if (engine_forward(e, &b, logits, err)) {
                fprintf(stderr, "wafer perplexity: %s\n", err);
                goto out;
            }
            int row = 0;
            for (int j = 0; j < b.n; j++)
                if (b.tok[j].logits) {
                    int i = b.tok[j].pos;
                    nll += ppl_nll(logits + (size_t)row * n_vocab, n_vocab, w[i + 1]);
                    count++;
                    row++;
                }
        }
        double el = clock_now_s() - t0;
        fprintf(stderr, "[%d/%d] ppl %.4f  (%.1f tok/s, %.0f s left)\n", k + 1, n_chunk, exp(nll / count),
                (k + 1) * ctx / el, el / (k + 1) * (n_chunk - k - 1));
    }
    double ppl = exp(nll / count);
    if (json)
        printf("{\"perplexity\": %.6f, \"tokens\": %ld, \"chunks\": %d, \"ctx\": %ld, \"text_tokens\": %d}\n", ppl, count,
               n_chunk, ctx, n_tok);
    else
        printf("perplexity: %.4f over %ld scored tokens (%d windows of %ld)\n", ppl, count, n_chunk, ctx);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "wafer perplexity: out of memory\n");
out:
    batch_deinit(&b);
    free(logits);
    free(toks);
    free(text);
    engine_destroy(e);
    model_destroy(m);
    return rc;
}
