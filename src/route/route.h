/*
 * route: `wafer route`, a gateway in front of OpenAI-compatible servers (wafer serve, llama-server, vLLM).
 * Requests for /v1/completions and /v1/chat/completions are sent to a pool chosen by the request's model
 * (a weighted, optionally sticky split between pools), to the least-loaded available backend of it, with
 * retries and fallback before the first byte, stream resume after it, a result cache and per-key limits.
 * docs/route.md describes the behaviour and the configuration.
 */
#ifndef WAFER_ROUTE_ROUTE_H
#define WAFER_ROUTE_ROUTE_H

#include "route/route_config.h"

/* Runs the router on a checked config (route_config_check) until SIGTERM or SIGINT; SIGHUP reloads
 * cfg->source (a bad file is logged and the running config kept). Takes ownership of cfg's contents (cfg
 * is left empty). Returns the process exit status (0, or 1 when it could not start). */
int route_run(struct route_config *cfg);

#endif
