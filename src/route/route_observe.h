/*
 * route_observe: the router's alert rules, notifications and dashboard data (route_observe.c). Everything
 * runs on the I/O thread but the notifier's posts.
 */
#ifndef WAFER_ROUTE_ROUTE_OBSERVE_H
#define WAFER_ROUTE_ROUTE_OBSERVE_H

#include <jansson.h>
#include <stddef.h>

struct router;
struct rt_conf;
struct rt_observe;

/* Opens the alert store of conf's alerts: section (or memory), restores alert states, starts the notifier
 * when there are receivers, and arms the once-a-second sampling timer on r's loop. Takes a reference on
 * conf (the rules live as long as this). external_url: the router's own URL for notifications when
 * alerts.external_url is not set. NULL with a message in err (ERR_MSG_MAX). */
struct rt_observe *rt_observe_create(struct router *r, struct rt_conf *conf, const char *external_url, char *err);
/* Stops the timer (I/O thread, or before it starts / after it ended) and the notifier; frees. */
void rt_observe_destroy(struct rt_observe *o);
/* GET /v1/alerts (notify_alerts_json's shape). malloc'd; NULL on OOM. */
char *rt_observe_alerts_json(struct rt_observe *o, size_t *len);
/* GET /v1/stats of the router: {time, uptime_s, window_s, share_window_s, measures: {requests_per_second,
 * error_rate, e2e_p50/95/99_ms, ttft_p50/95/99_ms, running}, backends: [{backend, url, pool, up, state,
 * in_flight, load, share, requests_per_second, error_rate, requests, ejections}], answers: {2xx..5xx},
 * alerts: [pending and firing], rules}. The caller owns the result. */
json_t *rt_observe_stats(struct rt_observe *o, double window_s);

/* GET /dashboard of the router: one self-contained page polling /v1/stats (route_dashboard.c). */
const char *rt_dashboard_html(size_t *len);

#endif
