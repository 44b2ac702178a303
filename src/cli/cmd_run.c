/*
 * wafer run: generate a continuation of a prompt with one sequence (a batch of one through the same
 * engine_forward the server uses). Only the generated text goes to stdout, streamed token by token through
 * the UTF-8-safe detokenizer; logs and the speed summary go to stderr.
 */
#include "cli/cli.h"
#include "core/flags.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/tokenizer/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer run --model M.gguf --prompt TEXT [options]\n\n"
            "Generates a continuation of TEXT. Generated text goes to stdout; logs and a speed summary to stderr.\n\n"
            "  -m, --model PATH         GGUF model file (required)\n"
            "  -p, --prompt TEXT        prompt text (required; BOS is added as the model's metadata says)\n"
            "  -n, --max-tokens N       tokens to generate (default 128)\n"
            "      --temperature T      0 = greedy (default 0.8)\n"
            "      --top-k K            (default 40; 0 = off)\n"
            "      --top-p P            (default 0.95; 1 = off)\n"
            "      --min-p P            (default 0.05; 0 = off)\n"
            "      --repeat-penalty R   (default 1.0 = off)\n"
            "      --seed S             RNG seed (default: random)\n"
            "  -t, --threads N          compute threads (default: all cores)\n"
            "  -c, --ctx-size N         context size (default: the model's, at most 4096)\n"
            "      --kv-type T          f16 (default), f32 or q8_0\n"
            "      --ignore-eos         keep generating past end-of-sequence tokens\n"
            "      --no-simd            use the portable scalar kernels\n"
            "      --mmap               map the model file instead of reading it into memory\n"
            "                           (faster start, shared page cache, ~15%% slower generation)\n"
            "  -h, --help               this help\n");
}

int cmd_run_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"prompt", required_argument, 0, 'p'},
        {"max-tokens", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 1},
        {"top-k", required_argument, 0, 2},        {"top-p", required_argument, 0, 3},
        {"min-p", required_argument, 0, 4},        {"repeat-penalty", required_argument, 0, 5},
        {"seed", required_argument, 0, 6},         {"threads", required_argument, 0, 't'},
        {"ctx-size", required_argument, 0, 'c'},   {"kv-type", required_argument, 0, 7},
        {"ignore-eos", no_argument, 0, 8},         {"no-simd", no_argument, 0, 9},
        {"mmap", no_argument, 0, 10},              {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    const char *model_path = NULL, *prompt = NULL;
    long max_tokens = 128, threads = 0, ctx = 0;
    bool ignore_eos = false, no_simd = false, seeded = false, use_mmap = false;
    enum dtype kv_type = DTYPE_F16;
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    double d;
    long l;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': if (flags_parse_int("run", "--max-tokens", optarg, 0, 1 << 24, &max_tokens)) return 2; break;
        case 1: if (flags_parse_float("run", "--temperature", optarg, 0, 100, &d)) return 2; sp.temperature = (float)d; break;
        case 2: if (flags_parse_int("run", "--top-k", optarg, 0, 1 << 30, &l)) return 2; sp.top_k = (int)l; break;
        case 3: if (flags_parse_float("run", "--top-p", optarg, 0, 1, &d)) return 2; sp.top_p = (float)d; break;
        case 4: if (flags_parse_float("run", "--min-p", optarg, 0, 1, &d)) return 2; sp.min_p = (float)d; break;
        case 5: if (flags_parse_float("run", "--repeat-penalty", optarg, 0.01, 100, &d)) return 2; sp.repeat_penalty = (float)d; break;
        case 6: if (flags_parse_u64("run", "--seed", optarg, &sp.seed)) return 2; seeded = true; break;
        case 't': if (flags_parse_int("run", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 'c': if (flags_parse_int("run", "--ctx-size", optarg, 1, 1 << 24, &ctx)) return 2; break;
        case 7:
            if (dtype_from_name(optarg, &kv_type) || (kv_type != DTYPE_F16 && kv_type != DTYPE_F32 && kv_type != DTYPE_Q8_0)) {
                fprintf(stderr, "wafer run: --kv-type: expected f16, f32 or q8_0, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 8: ignore_eos = true; break;
        case 9: no_simd = true; break;
        case 10: use_mmap = true; break;
        case 'h': run_usage(stdout); return 0;
        default: run_usage(stderr); return 2;
        }
    }
    if (!model_path || !prompt || optind != argc) {
        fprintf(stderr, "wafer run: %s\n\n", optind != argc ? "unexpected argument" : "--model and --prompt are required");
        run_usage(stderr);
        return 2;
    }
    if (!seeded)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    char err[ERR_MSG_MAX];
    if (sampler_params_validate(&sp, err)) {
        fprintf(stderr, "wafer run: %s\n", err);
        return 2;
    }

    int rc = 1;
    struct engine *e = NULL;
    struct sampler *smp = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    struct batch b = {0};
    double t_load = clock_now_s();
    struct model *m = model_load_ex(model_path, use_mmap, err);
    if (!m) {
        fprintf(stderr, "wafer run: %s\n", err);
        return 1;
    }
    const struct model_hparams *hp = &m->hp;
    struct engine_params ep;
    engine_params_default(&ep);
    ep.n_threads = (int)threads;
    ep.n_ctx = ctx ? (int)ctx : (hp->ctx_train < 4096 ? hp->ctx_train : 4096);
    ep.kv_type = kv_type;
    ep.force_scalar = no_simd;
    e = engine_create(m, &ep, err);
    if (!e) {
        fprintf(stderr, "wafer run: %s\n", err);
        goto out;
    }
    log_info("loaded %s: %s, %d layers, dim %d, %s weights, %d threads, ctx %d, in %.0f ms", m->name, hp->arch,
             hp->n_layers, hp->dim, dtype_name(m->main_type), engine_params_get(e)->n_threads, ep.n_ctx,
             (clock_now_s() - t_load) * 1e3);

    size_t plen = strlen(prompt);
    int cap = (int)plen + 8;
    toks = malloc((size_t)cap * sizeof *toks);
    if (!toks)
        goto oom;
    int n_prompt = tokenizer_encode(m->tok, prompt, plen, true, false, toks, cap);
    if (n_prompt > cap) {
        int32_t *nt = realloc(toks, (size_t)n_prompt * sizeof *toks);
        if (!nt)
            goto oom;
        toks = nt;
        n_prompt = tokenizer_encode(m->tok, prompt, plen, true, false, toks, n_prompt);
    }
    if (n_prompt < 0) {
        fprintf(stderr, "wafer run: cannot tokenize the prompt: %s\n", err_name(n_prompt));
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "wafer run: the prompt is empty after tokenization and the model adds no BOS token\n");
        goto out;
    }
    if (n_prompt + max_tokens > ep.n_ctx) {
        fprintf(stderr, "wafer run: prompt (%d tokens) + --max-tokens (%ld) exceeds the context size %d; "
                        "lower --max-tokens or raise --ctx-size\n", n_prompt, max_tokens, ep.n_ctx);
        goto out;
    }
    smp = sampler_create(&sp, hp->n_vocab);
    logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    if (!smp || !logits || batch_init(&b, engine_params_get(e)->max_batch_tokens))
        goto oom;
    for (int i = 0; i < n_prompt; i++)
        sampler_accept(smp, toks[i]);

    /* prefill in chunks of the largest batch; logits only for the prompt's last token */
    double t0 = clock_now_s();
    for (int i = 0; i < n_prompt; i += b.cap) {
        batch_clear(&b);
        for (int j = i; j < n_prompt && j < i + b.cap; j++)
            batch_add(&b, toks[j], j, 0, j == n_prompt - 1);
        if (engine_forward(e, &b, logits, err)) {
            fprintf(stderr, "wafer run: %s\n", err);
            goto out;
        }
    }
    double t1 = clock_now_s();
    struct detok_stream ds = {0};
    char piece[256];
    int n_gen = 0;
    const char *finish = "length";
    while (n_gen < max_tokens) {
        int32_t tok = sampler_sample(smp, logits, NULL, NULL, 0);
        if (!ignore_eos && tokenizer_is_eog(m->tok, tok)) {
            finish = "stop";
            break;
        }
        sampler_accept(smp, tok);
        int n = tokenizer_stream_push(m->tok, &ds, tok, false, piece, sizeof piece);
        if (n > 0 && n <= (int)sizeof piece) {
            fwrite(piece, 1, (size_t)n, stdout);
            fflush(stdout);
        }
        if (++n_gen == max_tokens)
            break;
        batch_clear(&b);
        batch_add(&b, tok, n_prompt + n_gen - 1, 0, true);
        if (engine_forward(e, &b, logits, err)) {
            fprintf(stderr, "\nwafer run: %s\n", err);
            goto out;
        }
    }
    int n = tokenizer_stream_flush(&ds, piece, sizeof piece);
    if (n > 0)
        fwrite(piece, 1, (size_t)n, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = clock_now_s();
    fprintf(stderr, "prompt: %d tokens in %.1f ms (%.1f tok/s) | generated: %d tokens in %.1f ms (%.1f tok/s) | finish: %s\n",
            n_prompt, (t1 - t0) * 1e3, n_prompt / (t1 - t0), n_gen, (t2 - t1) * 1e3, n_gen / (t2 - t1), finish);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "wafer run: out of memory\n");
out:
    batch_deinit(&b);
    free(logits);
    free(toks);
    sampler_destroy(smp);
    engine_destroy(e);
    model_destroy(m);
    return rc;
}
