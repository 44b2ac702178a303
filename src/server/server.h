/*
 * server: `wafer serve` put together: the HTTP server on its I/O thread, the model loaded while /ready says
 * 503, the engine and its scheduler thread, routing, auth, CORS, and the shutdown sequence.
 *
 * Shutdown (SIGTERM or SIGINT): the server stops taking generation requests (503, and /ready says 503 so
 * load balancers route elsewhere), lets the requests in flight finish for up to drain_timeout seconds, then
 * closes the listening socket and every connection, cancels what is left, and returns 0. A second signal
 * cuts the drain short.
 */
#ifndef WAFER_SERVER_SERVER_H
#define WAFER_SERVER_SERVER_H

#include "server/config.h"

/* Runs the server until a shutdown signal. Returns the process exit status: 0 after a clean shutdown,
 * 1 when the model, engine or socket could not be set up (the reason is logged). */
int server_run(struct server_config *cfg);

#endif
