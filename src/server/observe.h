/*
 * observe: what `wafer serve` knows about itself beyond /metrics, on one thread of its own (never the I/O
 * or the engine thread): once a second it takes a sample of the server's measures (metrics_sample plus
 * the scheduler's gauges, energy and cost) into the alert engine's windows; every alerts.interval_s it
 * evaluates the rules and hands the alerts to the notifier (core/notify.h, which posts from its own thread);
 * and, when an slo target is set, it steps the batch controller (slo_control.h) and applies its choice to
 * the scheduler. Readers on the I/O thread (GET /v1/alerts, /v1/stats, /metrics, the request log line)
 * only copy what the thread last sampled, under a short lock.
 *
 * Energy: RAPL when readable (energy.rapl, default on) gives wafer_energy_joules_total and tokens per joule;
 * when it is not, those are absent and the log says why once; with energy.watts set, an estimate (watts x
 * uptime) is exported under names that say "estimated", never under the measured ones.
 * Cost: cost.per_hour gives the machine's cost accrued, per million generated tokens over the last minute,
 * and per request (its generated tokens at that rate) in the request's log line.
 */
#ifndef WAFER_SERVER_OBSERVE_H
#define WAFER_SERVER_OBSERVE_H

#include <jansson.h>
#include <stddef.h>

struct server_config;
struct metrics;
struct metrics_gauges;
struct scheduler;
struct observe;

/* Opens the alert store (<alerts.data_dir>/alerts.sqlite, or memory), restores alert states, creates the
 * notifier, opens the energy meter. external_url is the server's own URL for notifications (when
 * alerts.external_url is not set). cfg and m must outlive it. NULL with a message in err (ERR_MSG_MAX). */
struct observe *observe_create(const struct server_config *cfg, struct metrics *m, const char *external_url,
                               char *err);
/* Stops both threads and frees (before the scheduler goes). */
void observe_destroy(struct observe *o);
/* Starts sampling and notifying. 0 or ERR_INTERNAL. */
int observe_start(struct observe *o);
/* Gives the scheduler once the model is loaded (any thread); its gauges and the batch controller start. */
void observe_set_scheduler(struct observe *o, struct scheduler *s);

struct alert_config;
/* SIGHUP: evaluate nc's rules (and interval_s, resolved_retention_s) from the next tick on; takes nc (NULL:
 * no rules any more). The sampling thread applies it and logs what changed; unchanged alerts keep their
 * states; receivers, data_dir and external_url stay the start's. Any thread. */
void observe_reload_alerts(struct observe *o, struct alert_config *nc);

/* Fills the observe part of g (metrics_gauges_init first). */
void observe_fill_gauges(struct observe *o, struct metrics_gauges *g);
/* GET /v1/alerts: {status, data: {alerts: [pending and firing, in Prometheus's shape]}, rules: [every rule
 * with its state], notifications: {...}}. malloc'd; NULL on OOM. */
char *observe_alerts_json(struct observe *o, size_t *len);
/* GET /v1/stats: the measures over the last window_s (the dashboard's data), totals, answers by kind,
 * active alerts; with history > 0, also the charted measures once a second over the last `history`
 * seconds ({"t": [seconds ago], name: [values]}); jobs (taken; NULL: none) becomes its "jobs" field (the
 * batch jobs' progress, api_jobs_progress). malloc'd; NULL on OOM. */
char *observe_stats_json(struct observe *o, double window_s, int history, json_t *jobs, size_t *len);
/* Dollars for a request that generated n tokens, at the machine cost per generated token over the last
 * minute; NaN when cost.per_hour is not set or nothing was generated. */
double observe_request_cost(struct observe *o, int n_generated);

#endif
