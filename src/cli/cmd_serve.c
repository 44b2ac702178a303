/*
 * wafer serve: the OpenAI-compatible HTTP server. Flags and the YAML file are parsed by server/config.c
 * (docs/config.md); this file turns their errors into exit statuses and resolves an hf:// model to its
 * local file (pulled first when missing, pull/pull.h) before the server starts.
 */
#include "cli/cli.h"
#include "core/err.h"
#include "pull/pull.h"
#include "server/config.h"
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>

int cmd_serve_main(int argc, char **argv)
{
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
