/*
 * wafer info: what a GGUF model is (architecture, dimensions, weight types, size, tokenizer, chat template),
 * after the same validation the engine does, so a file that `info` accepts is a file `run` can load.
 */
#include "cli/cli.h"
#include "core/err.h"
#include "engine/model.h"

#include <stdio.h>
#include <string.h>

int cmd_info_main(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc == 2 ? stdout : stderr;
        fprintf(f, "usage: wafer info MODEL.gguf\n\n"
                   "Prints the model's architecture, dimensions, weight types, size, tokenizer and whether it has a\n"
                   "chat template. Exits 1 with the reason when the file cannot be loaded.\n");
        return argc == 2 ? 0 : 2;
    }
    char err[ERR_MSG_MAX];
    struct model *m = model_load(argv[1], err);
    if (!m) {
        fprintf(stderr, "wafer info: %s\n", err);
        return 1;
    }
    char buf[4096];
    model_describe(m, buf, sizeof buf);
    fputs(buf, stdout);
    model_destroy(m);
    return 0;
}
