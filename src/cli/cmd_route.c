/*
 * wafer route: the gateway in front of OpenAI-compatible servers (src/route/, docs/route.md). The YAML file
 * gives the whole setup; flags give the common settings for a quick start or override the file.
 */
#include "cli/cli.h"
#include "core/flags.h"
#include "core/err.h"
#include "core/log.h"
#include "core/redis_url.h"
#include "route/route.h"
#include "route/route_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void route_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer route [--config route.yaml] [--backend URL ...] [options]\n\n"
            "An OpenAI-compatible gateway: /v1/completions, /v1/chat/completions and /v1/models go to pools of\n"
            "backends (wafer serve, llama-server, vLLM) chosen by model, with weighted rollout, retries,\n"
            "fallback, stream resume, health checks, a result cache and per-key limits (docs/route.md).\n"
            "SIGHUP reloads the config file; PUT /admin/rollout changes a split at run time. The file's alerts:\n"
            "section gives alert rules on the router's own measures (docs/observability.md); GET /dashboard is a\n"
            "live page with per-backend health and traffic share, GET /v1/alerts the alerts, GET /metrics the rest.\n\noptions:\n"
            "  --config PATH          YAML configuration file\n"
            "  --backend URL          add http://host:port to the pool \"default\" (routed for any model); repeatable\n"
            "  --host HOST            address to listen on (default 127.0.0.1)\n"
            "  --port N               TCP port (default 8080; 0 picks one)\n"
            "  --retries N            attempts after the first (default 2)\n"
            "  --health-interval SEC  seconds between health checks (default 2; 0: only one at start)\n"
            "  --cache-bytes SIZE     result cache size, e.g. 64M (default 0: off)\n"
            "  --cache-url URL        share the result cache in Redis, redis://HOST:PORT[/DB], between routers\n"
            "  --log-requests BOOL    one log line per request (default true)\n"
            "  -h, --help             this help\n");
}

int cmd_route_main(int argc, char **argv)
{
    struct route_config c;
    route_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    int rc = 0;
    /* --config first, so that flags override the file wherever they appear */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            route_usage(stdout);
            route_config_deinit(&c);
            return 0;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "wafer route: --config needs a file path\n");
                route_config_deinit(&c);
                return 2;
            }
            if ((rc = route_config_load_file(&c, argv[++i], err))) {
                fprintf(stderr, "wafer route: %s\n", err);
                route_config_deinit(&c);
                return 2;
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "wafer route: %s: %s\n", a,
                    strncmp(a, "--", 2) ? "unexpected argument (see wafer route --help)" : "needs a value");
            route_config_deinit(&c);
            return 2;
        }
        const char *v = argv[++i];
        long n;
        double d;
        uint64_t u;
        if (!strcmp(a, "--backend")) {
            if ((rc = route_config_add_backend(&c, v, err)))
                break;
        } else if (!strcmp(a, "--host")) {
            free(c.host);
            c.host = strdup(v);
        } else if (!strcmp(a, "--port")) {
            if (flags_parse_int("route", a, v, 0, 65535, &n))
                goto usage;
            c.port = (int)n;
        } else if (!strcmp(a, "--retries")) {
            if (flags_parse_int("route", a, v, 0, 100, &n))
                goto usage;
            c.retry_max = (int)n;
        } else if (!strcmp(a, "--health-interval")) {
            if (flags_parse_float("route", a, v, 0, 86400, &d))
                goto usage;
            c.health_interval_s = d;
        } else if (!strcmp(a, "--cache-bytes")) {
            if (flags_parse_size("route", a, v, &u))
                goto usage;
            c.cache_max_bytes = (int64_t)u;
        } else if (!strcmp(a, "--cache-url")) {
            struct redis_url ru;
            if (redis_url_parse(v, &ru, err)) {
                fprintf(stderr, "wafer route: --cache-url: %s\n", err);
                goto usage;
            }
            free(c.cache_url);
            c.cache_url = strdup(v);
        } else if (!strcmp(a, "--log-requests")) {
            if (strcmp(v, "true") && strcmp(v, "false")) {
                fprintf(stderr, "wafer route: --log-requests: expected true or false, got '%s'\n", v);
                goto usage;
            }
            c.log_requests = !strcmp(v, "true");
        } else {
            fprintf(stderr, "wafer route: unknown option '%s' (see wafer route --help)\n", a);
            goto usage;
        }
    }
    if (!rc)
        rc = route_config_check(&c, err);
    if (rc) {
        fprintf(stderr, "wafer route: %s\n", err);
        route_config_deinit(&c);
        return 2;
    }
    rc = route_run(&c);
    route_config_deinit(&c);
    return rc;
usage:
    route_config_deinit(&c);
    return 2;
}
