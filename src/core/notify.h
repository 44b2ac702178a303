/*
 * notify: alert notifications to receivers of kind webhook (Alertmanager's v4 webhook JSON, so any tool
 * that takes Alertmanager's payload works), alertmanager (POST /api/v2/alerts, as Prometheus does) and
 * slack (an incoming webhook: text and blocks), with Alertmanager's grouping and deduplication, a
 * persistent outbox, and bounded retries. Like alert.h it knows nothing of the server.
 *
 * Two halves on two threads, joined by the store's outbox (alert_store.h):
 *   - notify_plan (the thread that evaluates the rules): per receiver, the alerts routed to it (a rule's
 *     `receivers`, or all) are grouped by the receiver's group_by labels; a group is notified when
 *     Alertmanager's notification log says so: new firing alerts, all of them resolved, newly resolved ones
 *     (send_resolved), or repeat_interval passed with the same ones still firing; a new group waits
 *     group_wait after its first alert fired, a group already notified waits group_interval since. The
 *     payload is built then and queued with the log entry (one transaction).
 *   - the notifier thread (notify_start): posts the oldest pending notification of each receiver (in order
 *     per receiver; one receiver being down does not hold up another), at most one post per min_interval_s
 *     per receiver; a 2xx removes it; 429 and 503 wait for their Retry-After (seconds or an HTTP date; at
 *     most an hour); other failures back off 1 s, 2 s, 4 s ... up to max_backoff_s; a notification is
 *     dropped (with an error in the log) after max_attempts posts, or at once on a 4xx other than 408/429
 *     (the receiver refuses it: retrying cannot help). Never the I/O or engine thread: a slow or dead
 *     receiver slows nothing but this thread.
 * What keeps a receiver from being flooded (Alertmanager 2286: 200 posts in 10 minutes): a notification is
 * decided only on a change of the group or after repeat_interval; retries are bounded; the per-receiver
 * rate limit; and the log survives restarts, so a restart re-sends nothing already sent.
 */
#ifndef WAFER_CORE_NOTIFY_H
#define WAFER_CORE_NOTIFY_H

#include "core/alert.h"

#include <stdbool.h>
#include <stddef.h>

struct alert_store;
struct notify;

/* cfg and store must outlive the notifier. external_url is the externalURL of the payloads (and the base of
 * each alert's generatorURL) when cfg has none. NULL on OOM. */
struct notify *notify_create(const struct alert_config *cfg, struct alert_store *store, const char *external_url);
/* Stops the notifier thread (a post in flight finishes or times out first) and frees. */
void notify_destroy(struct notify *n);
/* Starts the notifier thread (needs curl_global_init done). 0 or ERR_INTERNAL. */
int notify_start(struct notify *n);

/* Decides which groups to notify now from the alerts' views (alert_engine_views) and queues their
 * payloads; wakes the notifier thread. Returns how many notifications were queued. */
int notify_plan(struct notify *n, const struct alert_view *alerts, int n_alerts, double now_unix);

/* Notifications delivered / dropped since create (for /metrics and tests). */
struct notify_stats {
    long long sent, failed_posts, dropped;
    int pending;
};
void notify_stats_get(struct notify *n, struct notify_stats *out);

/* GET /v1/alerts of a server or a router: {status: "success", data: {alerts: [the pending and firing ones, in
 * Prometheus's /api/v1/alerts shape: labels, annotations, state, activeAt, value]}, rules: [every rule with
 * its measure, op, threshold, window_s, for_s, severity, state, value, activeAt, firedAt, resolvedAt,
 * fingerprint, labels, annotations], interval_s, notifications: {sent, failed_posts, dropped, pending,
 * receivers} (only with a notifier)}. nt may be NULL. malloc'd; NULL on OOM. */
char *notify_alerts_json(struct alert_engine *e, const struct alert_config *cfg, struct notify *nt, size_t *len);

/* ---- payloads (pure; tested on their own) ---- */

/* One group as a receiver gets it. */
struct notify_group {
    const char *receiver;
    const char *group_key;        /* Alertmanager's form: {}:{alertname="HighTTFT"} */
    json_t *group_labels;         /* borrowed */
    const struct alert_view *const *alerts; /* firing and resolved alerts of the group */
    int n_alerts;
    const char *external_url;
    double now_unix;
    double resend_s;              /* alertmanager kind: a firing alert's endsAt is now + 4 * this */
};

/* Alertmanager's v4 webhook body {version, groupKey, truncatedAlerts, status, receiver, groupLabels,
 * commonLabels, commonAnnotations, externalURL, alerts[{status, labels, annotations, startsAt, endsAt,
 * generatorURL, fingerprint}]}, malloc'd; NULL on OOM. */
char *notify_payload_webhook(const struct notify_group *g);
/* The array POSTed to Alertmanager's /api/v2/alerts: [{labels, annotations, startsAt, endsAt, generatorURL}]. */
char *notify_payload_alertmanager(const struct notify_group *g);
/* Slack incoming webhook {text, blocks}: a header, then one section per alert (at most 20, then a count). */
char *notify_payload_slack(const struct notify_group *g);

/* The URL a receiver's notifications go to: an alertmanager's base URL gets /api/v2/alerts appended
 * (unless already there). Caller frees; NULL on OOM. */
char *notify_receiver_url(const struct alert_receiver *r);

/* Seconds a Retry-After header value asks to wait (delta seconds or an HTTP date relative to now_unix);
 * -1 when it is neither. */
double notify_parse_retry_after(const char *v, double now_unix);

#endif
