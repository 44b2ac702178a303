/*
 * wafer: entry point. Dispatches `wafer <command> ...` to the subcommand table; each subcommand owns its
 * flags and --help.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

struct cli_command {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *summary;
};

static const struct cli_command cli_commands[] = {
    {"run", cmd_run_main, "generate text from a prompt"},
    {"info", cmd_info_main, "describe a GGUF model"},
    {"perplexity", cmd_perplexity_main, "perplexity of a model over a text file (as llama-perplexity)"},
    {"convert", cmd_convert_main, "convert a llama2.c checkpoint to GGUF"},
    {"model", cmd_model_main, "make a model with random weights (model new)"},
    {"serve", cmd_serve_main, "run the OpenAI-compatible HTTP server"},
    {"alerts", cmd_alerts_main, "evaluate alert rules once against a server's /metrics (alerts check)"},
    {"quantize", cmd_quantize_main, "convert a GGUF model's weights to another type"},
    {"tokenize", cmd_tokenize_main, "print the token ids of a text"},
    {"bench", cmd_bench_main, "benchmark a model (bench) or a server (bench serve, bench compare)"},
    {NULL, NULL, NULL},
};

static void cli_usage(FILE *f)
{
    fprintf(f, "wafer: a fast LLM inference engine and server for GGUF models\n\n"
               "usage: wafer <command> [options]   (wafer <command> --help for details)\n\ncommands:\n");
    for (const struct cli_command *c = cli_commands; c->name; c++)
        fprintf(f, "  %-12s %s\n", c->name, c->summary);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        cli_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (const struct cli_command *c = cli_commands; c->name; c++)
        if (!strcmp(argv[1], c->name))
            return c->main(argc - 1, argv + 1);
    fprintf(stderr, "wafer: unknown command '%s'\n\n", argv[1]);
    cli_usage(stderr);
    return 2;
}
