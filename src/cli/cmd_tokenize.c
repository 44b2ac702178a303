/*
 * wafer tokenize: prints the token ids of a text, one line, separated by single spaces. Reads only the GGUF
 * metadata (gguf_open + tokenizer_create), so vocab-only files work.
 */
#include "cli/cli.h"

#include "core/err.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/tokenizer.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tokenize_usage(FILE *f)
{
    fprintf(f, "usage: wafer tokenize --model M (--text T | --file F) [--no-bos] [--parse-special]\n\n"
               "Prints the token ids of a text on one line, separated by spaces.\n\n"
               "  --model M          GGUF model or vocab-only file\n"
               "  --text T           the text to tokenize\n"
               "  --file F           read the text from file F (bytes as they are)\n"
               "  --no-bos           add no special tokens (default: BOS/EOS as the model's metadata says)\n"
               "  --parse-special    turn special-token text such as <|im_start|> or <s> into those tokens\n"
               "                     (default: it is tokenized as plain text)\n"
               "  -h, --help         show this help\n");
}

/* Reads a whole file; caller frees. NULL with a message on failure. */
static char *tokenize_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "wafer tokenize: cannot open '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) {
            if (ferror(f)) {
                fprintf(stderr, "wafer tokenize: error reading '%s': %s\n", path, strerror(errno));
                free(buf);
                buf = NULL;
            }
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (!buf && !ferror(f))
        fprintf(stderr, "wafer tokenize: out of memory reading '%s'\n", path);
    fclose(f);
    *len = n;
    return buf;
}

int cmd_tokenize_main(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL;
    bool no_bos = false, parse_special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--parse-special")) {
            parse_special = true;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--text") || !strcmp(a, "--file")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "wafer tokenize: %s needs a value\n\n", a);
                tokenize_usage(stderr);
                return 2;
            }
            const char **dst = !strcmp(a, "--model") ? &model : !strcmp(a, "--text") ? &text : &file;
            *dst = argv[++i];
        } else {
            fprintf(stderr, "wafer tokenize: unknown option '%s'\n\n", a);
            tokenize_usage(stderr);
            return 2;
        }
    }
    if (!model || (!text && !file) || (text && file)) {
        fprintf(stderr, "wafer tokenize: %s\n\n",
                !model ? "--model is required" : (text && file) ? "give --text or --file, not both"
                                                                : "give the text with --text or --file");
        tokenize_usage(stderr);
        return 2;
    }

    int status = 1;
    char err[ERR_MSG_MAX];
    char *data = NULL;
    int32_t *ids = NULL;
    struct tokenizer *tok = NULL;
    struct gguf *g = gguf_open(model, err);
    if (!g) {
        fprintf(stderr, "wafer tokenize: %s\n", err);
        return 1;
    }
    tok = tokenizer_create(g, err);
    if (!tok) {
        fprintf(stderr, "wafer tokenize: %s: %s\n", model, err);
        goto done;
    }
    size_t len;
    if (file) {
        if (!(data = tokenize_read_file(file, &len)))
            goto done;
        text = data;
    } else {
        len = strlen(text);
    }
    int n = tokenizer_encode_alloc(tok, text, len, !no_bos, parse_special, &ids);
    if (n < 0) {
        fprintf(stderr, "wafer tokenize: tokenizing failed: %s\n", err_name(n));
        goto done;
    }
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    status = fflush(stdout) == 0 ? 0 : 1;
done:
    free(ids);
    free(data);
    tokenizer_destroy(tok);
    gguf_close(g);
    return status;
}
