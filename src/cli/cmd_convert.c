/*
 * wafer convert: converts other checkpoint formats to GGUF. Today: llama2c (Karpathy's llama2.c).
 */
#include "cli/cli.h"
#include "core/err.h"
#include "core/log.h"
#include "engine/gguf/llama2c.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int cmd_convert_main(int argc, char **argv)
{
    bool help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    if (help || argc != 5 || strcmp(argv[1], "llama2c")) {
        FILE *f = help ? stdout : stderr;
        fprintf(f, "usage: wafer convert llama2c MODEL.bin TOKENIZER.bin OUT.gguf\n\n"
                   "Converts a llama2.c checkpoint and its tokenizer (e.g. stories260K.bin + tok512.bin) to a GGUF\n"
                   "file of the llama architecture with F32 weights.\n");
        return help ? 0 : 2;
    }
    char err[ERR_MSG_MAX];
    if (llama2c_convert(argv[2], argv[3], argv[4], err)) {
        fprintf(stderr, "wafer convert: %s\n", err);
        return 1;
    }
    log_info("wrote %s", argv[4]);
    return 0;
}
