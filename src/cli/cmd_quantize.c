/*
 * wafer quantize IN.gguf OUT.gguf TYPE [--pure]: the command line of engine/gguf/quantize.h, which does the
 * conversion (type plan, streaming row conversion, atomic output).
 */
#include "cli/cli.h"
#include "core/err.h"
#include "engine/gguf/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cmd_quantize_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer quantize IN.gguf OUT.gguf TYPE [--pure]\n\n"
            "Writes a copy of a GGUF model with its weight matrices converted to TYPE.\n"
            "TYPE: %s (as llama-quantize names them).\n\n"
            "  --pure      every weight matrix in TYPE (default: output.weight in q6_k for quantized TYPEs, and\n"
            "              q4_k_m gives attn_v/ffn_down of some layers q6_k, as llama-quantize does)\n"
            "  -h, --help  this text\n\n"
            "Norms and other 1-D tensors stay as they are. Rows whose length does not divide into TYPE's blocks\n"
            "fall back to q8_0 or f16 (with a warning). Progress goes to stderr.\n",
            quantize_target_list());
}

int cmd_quantize_main(int argc, char **argv)
{
    const char *pos[3];
    int npos = 0;
    bool pure = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            cmd_quantize_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--pure")) {
            pure = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "wafer quantize: unknown option '%s'\n\n", argv[i]);
            cmd_quantize_usage(stderr);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = argv[i];
        } else {
            fprintf(stderr, "wafer quantize: unexpected argument '%s'\n\n", argv[i]);
            cmd_quantize_usage(stderr);
            return 2;
        }
    }
    if (npos != 3) {
        fprintf(stderr, "wafer quantize: expected IN.gguf OUT.gguf TYPE\n\n");
        cmd_quantize_usage(stderr);
        return 2;
    }
    struct quantize_target t;
    if (quantize_target_parse(pos[2], &t) != 0) {
        fprintf(stderr, "wafer quantize: unknown TYPE '%s' (choose one of: %s)\n", pos[2], quantize_target_list());
        return 2;
    }
    char err[ERR_MSG_MAX];
    if (quantize_file(pos[0], pos[1], &t, pure, stderr, err) != 0) {
        fprintf(stderr, "wafer quantize: %s\n", err);
        return 1;
    }
    return 0;
}
