/*
 * wafer model new: flags -> model_gen_write (see src/engine/model_gen.h).
 */
#include "cli/cli.h"
#include "core/flags.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/ftype.h"
#include "engine/gguf/model_gen.h"

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
        case 2: if (flags_parse_int("model new", "--dim", optarg, 2, 65536, &dim)) return 2; break;
        case 3: if (flags_parse_int("model new", "--layers", optarg, 1, 1024, &layers)) return 2; break;
        case 4: if (flags_parse_int("model new", "--heads", optarg, 1, 1024, &heads)) return 2; break;
        case 5: if (flags_parse_int("model new", "--kv-heads", optarg, 1, 1024, &kv_heads)) return 2; break;
        case 6: if (flags_parse_int("model new", "--ffn", optarg, 1, 1 << 20, &ffn)) return 2; break;
        case 7: vocab = optarg; break;
        case 8:
            if (ftype_from_name(optarg, &ft)) {
                fprintf(stderr, "wafer model new: --type: unknown format '%s' (supported: %s)\n", optarg, ftype_list());
                return 2;
            }
            break;
        case 9: if (flags_parse_u64("model new", "--seed", optarg, &seed)) return 2; break;
        case 10: if (flags_parse_int("model new", "--ctx", optarg, 1, 1 << 24, &ctx)) return 2; break;
        case 11: tied = true; break;
        case 12: if (flags_parse_float("model new", "--std", optarg, 0, 100, &std_)) return 2; break;
        case 13: if (flags_parse_int("model new", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 14: pure = true; break;
        case 15: if (flags_parse_float("model new", "--rope-base", optarg, 1, 1e12, &rope_base)) return 2; break;
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
    struct model_gen_params gp;
    model_gen_params_default(&gp);
    gp.arch = arch;
    gp.dim = (int)dim, gp.layers = (int)layers, gp.heads = (int)heads, gp.kv_heads = (int)kv_heads, gp.ffn = (int)ffn;
    gp.ctx = (int)ctx;
    gp.vocab_from = vocab;
    gp.ftype = ft;
    gp.pure = pure;
    gp.tied = tied;
    gp.std = (float)std_;
    gp.rope_base = (float)rope_base;
    gp.seed = seed;
    gp.threads = (int)threads;
    gp.progress = true;
    char err[ERR_MSG_MAX];
    if (model_gen_write(&gp, out_path, err)) {
        fprintf(stderr, "wafer model new: %s\n", err);
        return 1;
    }
    log_info("wrote %s: %s, dim %ld, %ld layers, %ld heads (%ld kv), ffn %ld, %s", out_path, arch, dim, layers, heads,
             kv_heads, ffn, ftype_name(ft));
    return 0;
}
