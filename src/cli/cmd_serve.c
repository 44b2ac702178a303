/*
 * wafer serve: the OpenAI-compatible HTTP server. Flags and the YAML file are parsed by server/config.c
 * (docs/config.md); this file only turns their errors into exit statuses.
 */
#include "cli/cli.h"
#include "core/err.h"
#include "server/config.h"
#include "server/server.h"

#include <stdio.h>

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
    rc = server_run(&cfg);
    server_config_deinit(&cfg);
    return rc;
}
