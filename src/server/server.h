/*
 * server: `wafer serve` put together: the HTTP server on its I/O thread, the model loaded while /ready says
 * 503, the engine and its scheduler thread, routing, auth, CORS, and the shutdown sequence.
 *
 * Shutdown (SIGTERM or SIGINT): the server stops taking generation requests (503, and /ready says 503 so
 * load balancers route elsewhere), lets the requests in flight finish for up to drain_timeout seconds, then
 * closes the listening socket and every connection, cancels what is left, and returns 0. A second signal
 * cuts the drain short.
 *
 * SIGHUP reloads the configuration (the same flags and --config file): the API keys and the log level take
 * effect at once and a log line says what changed; nothing in flight is touched, and a configuration that
 * no longer loads is reported and changes nothing. SIGHUP never stops the server.
 */
#ifndef WAFER_SERVER_SERVER_H
#define WAFER_SERVER_SERVER_H

#include "server/config.h"

/* Runs the server until a shutdown signal. Returns the process exit status: 0 after a clean shutdown,
 * 1 when the model, engine or socket could not be set up (the reason is logged). */
int server_run(struct server_config *cfg);

#endif
