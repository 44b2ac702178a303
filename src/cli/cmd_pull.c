/*
 * wafer pull, wafer list, wafer rm: models from the Hugging Face hub in the local models directory
 * (src/pull/pull.h has the layout and the guarantees; docs/pull.md the protocol).
 */
#include "cli/cli.h"
#include "core/flags.h"
#include "core/err.h"
#include "pull/progress.h"
#include "pull/pull.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void pull_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer pull [options] SPEC...\n\n"
            "Downloads GGUF models from the Hugging Face hub into the models directory. SPEC is\n"
            "  OWNER/NAME:QUANT        the repo's .gguf file of that quantization (case-insensitive, e.g. :Q4_K_M)\n"
            "  OWNER/NAME/FILE.gguf    one file by its path in the repo\n"
            "  OWNER/NAME              the repo's only GGUF file, else its Q4_K_M one\n"
            "with an optional hf:// before and @REVISION after NAME (default: main). Downloads resume where an\n"
            "interrupted one stopped, are checked against the hub's sha256, and appear in the models directory\n"
            "only complete. A model already there is not downloaded again (see --force).\n\n"
            "  -d, --models-dir DIR   models directory (default: $WAFER_MODELS, else $XDG_DATA_HOME/wafer/models,\n"
            "                         else ~/.local/share/wafer/models)\n"
            "      --force            download again even when the model is there\n"
            "      --retries N        retries of a broken transfer, each resuming it (default 5)\n"
            "  -q, --quiet            no progress, only the path of each model on stdout\n"
            "  -h, --help             this help\n\n"
            "Environment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (for private and gated repos).\n"
            "Prints the local path of each model on stdout. `wafer run/serve --model hf://SPEC` pull first too.\n");
}

static int pull_dir(const char *cmd, const char *flag_dir, char *dir, size_t cap)
{
    char err[ERR_MSG_MAX];
    if (flag_dir) {
        snprintf(dir, cap, "%s", flag_dir);
        return 0;
    }
    if (pull_models_dir(dir, cap, err)) {
        fprintf(stderr, "wafer %s: %s\n", cmd, err);
        return 2;
    }
    return 0;
}

int cmd_pull_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"models-dir", required_argument, 0, 'd'}, {"force", no_argument, 0, 1},
        {"retries", required_argument, 0, 2},      {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    struct pull_opts o;
    pull_opts_default(&o);
    const char *dir_flag = NULL;
    long l;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "d:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dir_flag = optarg; break;
        case 1: o.force = true; break;
        case 2: if (flags_parse_int("pull", "--retries", optarg, 0, 100, &l)) return 2; o.retries = (int)l; break;
        case 'q': o.quiet = true; break;
        case 'h': pull_usage(stdout); return 0;
        default: pull_usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "wafer pull: name a model to pull (e.g. wafer pull owner/repo:Q4_K_M)\n\n");
        pull_usage(stderr);
        return 2;
    }
    char dir[4096];
    if (pull_dir("pull", dir_flag, dir, sizeof dir))
        return 2;
    o.models_dir = dir;
    int rc = 0;
    for (int i = optind; i < argc; i++) {
        char err[ERR_MSG_MAX], *path;
        bool fetched;
        struct hub_spec spec;
        if (hub_spec_parse(argv[i], &spec, err)) {
            fprintf(stderr, "wafer pull: %s\n", err);
            rc = 2;
            continue;
        }
        if (pull_model(argv[i], &o, &path, &fetched, err)) {
            fprintf(stderr, "wafer pull: %s\n", err);
            rc = rc ? rc : 1;
            continue;
        }
        if (!o.quiet)
            fprintf(stderr, "pull: %s %s\n", fetched ? "installed" : "already pulled (--force downloads it again):",
                    path);
        printf("%s\n", path);
        fflush(stdout);
        free(path);
    }
    return rc;
}

static void list_usage(FILE *f)
{
    fprintf(f, "usage: wafer list [-d DIR] [--json]\n\n"
               "The models in the models directory (see wafer pull --help): name (give it to wafer rm, or\n"
               "hf://NAME to run and serve), size, quantization (from the GGUF header), date pulled; and the\n"
               "interrupted downloads that the next pull resumes.\n\n"
               "  -d, --models-dir DIR   models directory\n"
               "      --json             one JSON object: {dir, models: [{name, path, size, quant, modified}], partial}\n"
               "  -h, --help             this help\n");
}

int cmd_list_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"models-dir", required_argument, 0, 'd'}, {"json", no_argument, 0, 1},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    const char *dir_flag = NULL;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dir_flag = optarg; break;
        case 1: json = true; break;
        case 'h': list_usage(stdout); return 0;
        default: list_usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "wafer list: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    char dir[4096], err[ERR_MSG_MAX];
    if (pull_dir("list", dir_flag, dir, sizeof dir))
        return 2;
    struct pull_entry *es;
    int n, n_part;
    int64_t part_bytes;
    if (pull_list(dir, &es, &n, &part_bytes, &n_part, err)) {
        fprintf(stderr, "wafer list: %s\n", err);
        return 1;
    }
    if (json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) {
            char full[4400], when[32];
            snprintf(full, sizeof full, "%s/%s", dir, es[i].name);
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&es[i].mtime));
            json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:s, s:s}", "name", es[i].name, "path", full, "size",
                                                 (json_int_t)es[i].size, "quant", es[i].quant, "modified", when));
        }
        json_t *o = json_pack("{s:s, s:o, s:{s:i, s:I}}", "dir", dir, "models", arr, "partial", "count", n_part,
                              "bytes", (json_int_t)part_bytes);
        char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(o);
    } else if (n == 0) {
        printf("no models in %s (wafer pull OWNER/NAME:QUANT adds one)\n", dir);
    } else {
        size_t w = 4;
        for (int i = 0; i < n; i++)
            if (strlen(es[i].name) > w)
                w = strlen(es[i].name);
        printf("%-*s  %10s  %-8s  %s\n", (int)w, "NAME", "SIZE", "QUANT", "MODIFIED");
        for (int i = 0; i < n; i++) {
            char b[16], when[32];
            strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime(&es[i].mtime));
            printf("%-*s  %10s  %-8s  %s\n", (int)w, es[i].name, progress_bytes(es[i].size, b), es[i].quant, when);
        }
    }
    if (n_part && !json) {
        char b[16];
        printf("\n%d interrupted download%s (%s) in %s/.downloads: the next wafer pull of %s resumes it "
               "(wafer rm --partials deletes them)\n",
               n_part, n_part > 1 ? "s" : "", progress_bytes(part_bytes, b), dir, n_part > 1 ? "each" : "that model");
    }
    pull_entries_free(es, n);
    return 0;
}

static void rm_usage(FILE *f)
{
    fprintf(f, "usage: wafer rm [-d DIR] NAME...   |   wafer rm [-d DIR] --partials\n\n"
               "Removes models from the models directory. NAME is a name from wafer list (OWNER/NAME/FILE.gguf)\n"
               "or a pull spec that names one pulled file (OWNER/NAME:QUANT, hf://...).\n\n"
               "  -d, --models-dir DIR   models directory\n"
               "      --partials         remove the interrupted downloads instead\n"
               "  -h, --help             this help\n");
}

int cmd_rm_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"models-dir", required_argument, 0, 'd'}, {"partials", no_argument, 0, 1},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    const char *dir_flag = NULL;
    bool partials = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dir_flag = optarg; break;
        case 1: partials = true; break;
        case 'h': rm_usage(stdout); return 0;
        default: rm_usage(stderr); return 2;
        }
    }
    if ((optind >= argc) == !partials) {
        fprintf(stderr, "wafer rm: %s\n\n", partials ? "--partials takes no names" : "name a model to remove");
        rm_usage(stderr);
        return 2;
    }
    char dir[4096], err[ERR_MSG_MAX];
    if (pull_dir("rm", dir_flag, dir, sizeof dir))
        return 2;
    if (partials) {
        int n;
        int64_t bytes;
        char b[16];
        if (pull_remove_partials(dir, &n, &bytes, err)) {
            fprintf(stderr, "wafer rm: %s\n", err);
            return 1;
        }
        printf("removed %d interrupted download%s (%s)\n", n, n == 1 ? "" : "s", progress_bytes(bytes, b));
        return 0;
    }
    int rc = 0;
    for (int i = optind; i < argc; i++) {
        char *removed;
        if (pull_remove(dir, argv[i], &removed, err)) {
            fprintf(stderr, "wafer rm: %s\n", err);
            rc = 1;
            continue;
        }
        printf("removed %s\n", removed);
        free(removed);
    }
    return rc;
}
