/*
 * wafer serve: the OpenAI-compatible HTTP server. Flags and the YAML file are parsed by server/config.c
 * (docs/config.md); this file turns their errors into exit statuses and resolves an hf:// model to its
 * local file (pulled first when missing, pull/pull.h) before the server starts.
 *
 * Models mode: with --models-dir DIR, or a --config file with a models: list, the command runs the model
 * manager of route/route_models.h instead (docs/models.md): one child `wafer serve` per loaded model behind
 * the router. The cli composes the two layers: it tells the manager the size of an hf:// model already in
 * the models directory (pull), since route cannot call pull; a model not pulled yet is pulled by its child.
 */
#include "cli/cli.h"
#include "core/err.h"
#include "pull/hub.h"
#include "pull/pull.h"
#include "route/route_models.h"
#include "server/config.h"
#include "server/server.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The manager's path_bytes: a file's size; an hf:// spec's local file's, -1 while it is not pulled. */
static int64_t serve_path_bytes(const char *path)
{
    char *local = NULL;
    if (!strncmp(path, "hf://", 5)) {
        char dir[4096], err[ERR_MSG_MAX];
        struct hub_spec spec;
        if (pull_models_dir(dir, sizeof dir, err) || hub_spec_parse(path + 5, &spec, err) ||
            pull_find_local(dir, &spec, &local, err))
            return -1;
        path = local;
    }
    struct stat st;
    int64_t n = stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
    free(local);
    return n;
}

/* Whether the command line asks for models mode: --models-dir, or a --config file with models:. */
static bool serve_models_mode(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--models-dir") || !strncmp(argv[i], "--models-dir=", 13))
            return true;
        const char *cfg = !strcmp(argv[i], "--config") && i + 1 < argc ? argv[i + 1]
                          : !strncmp(argv[i], "--config=", 9)          ? argv[i] + 9
                                                                        : NULL;
        if (cfg && route_models_file_has_models(cfg))
            return true;
    }
    return false;
}

static int serve_models_main(int argc, char **argv)
{
    struct route_models_config mc;
    route_models_config_init(&mc);
    char err[ERR_MSG_MAX] = "";
    int rc = route_models_config_from_args(&mc, argc, argv, err);
    if (rc == 1) {
        route_models_config_deinit(&mc);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "wafer serve: %s\n", err);
        route_models_config_deinit(&mc);
        return rc == ERR_INVALID_ARG ? 2 : 1;
    }
    mc.path_bytes = serve_path_bytes;
    return route_models_run(&mc);
}

int cmd_serve_main(int argc, char **argv)
{
    if (serve_models_mode(argc, argv))
        return serve_models_main(argc, argv);
    struct server_config cfg;
    server_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    int rc = server_config_from_args(&cfg, argc, argv, err);
    if (rc == 1) {
        server_config_deinit(&cfg);
        return 0; /* --help */
    }
    if (rc) {
        fprintf(stderr, "wafer serve: %s\n", err);
        server_config_deinit(&cfg);
        return rc == ERR_INVALID_ARG ? 2 : 1;
    }
    char *model_file; /* an hf:// model becomes its local file, pulled first when missing */
    if (pull_resolve_model(cfg.model_path, &model_file, err)) {
        fprintf(stderr, "wafer serve: %s\n", err);
        server_config_deinit(&cfg);
        return 1;
    }
    free(cfg.model_path);
    cfg.model_path = model_file;
    rc = server_run(&cfg);
    server_config_deinit(&cfg);
    return rc;
}
