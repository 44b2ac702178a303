/*
 * alert_store: what alerting must remember across a restart, in one SQLite file (<data_dir>/alerts.sqlite,
 * or an in-memory database when there is no data_dir):
 *   - the state of each rule's alert (pending since, firing since, resolved at), so a restart neither
 *     forgets a firing alert nor announces again one that was resolved;
 *   - the notification log: per receiver and group, the fingerprints last notified as firing and as
 *     resolved and when (Alertmanager's nflog), which is what deduplication compares against;
 *   - the outbox: notifications decided but not yet delivered, with their attempts and next try.
 * Deciding to notify writes the outbox row and the log entry in one transaction, so after a kill -9 a
 * notification is either still pending (and sent after the restart) or was never decided (and is decided
 * again from the restored states), never both nor neither. Delivery is at least once: a kill between the
 * receiver's 2xx and the row's deletion sends that one notification again.
 *
 * Threads: every function takes the store's mutex (the evaluating and the notifying thread share it).
 */
#ifndef WAFER_CORE_ALERT_STORE_H
#define WAFER_CORE_ALERT_STORE_H

#include <stdint.h>

struct alert_store;

/* Opens (creating) the database at path, or an in-memory one when path is NULL. NULL with a message in
 * err (ERR_MSG_MAX) when the file cannot be opened or is not an alerts database. */
struct alert_store *alert_store_open(const char *path, char *err);
void alert_store_close(struct alert_store *s);
/* The store of an `alerts:` section: <dir>/alerts.sqlite, creating dir (one level) when missing; in memory
 * when dir is NULL. NULL with a message in err. */
struct alert_store *alert_store_open_dir(const char *dir, char *err);

/* ---- rule states ---- */
int alert_store_save_state(struct alert_store *s, const char *rule, int state, double active_at, double fired_at,
                           double resolved_at, double value);
/* Calls fn for every saved rule state. 0 or ERR_IO. */
int alert_store_load_states(struct alert_store *s,
                            void (*fn)(void *ctx, const char *rule, int state, double active_at, double fired_at,
                                       double resolved_at, double value),
                            void *ctx);

/* ---- notification log ---- */
struct alert_nlog {
    char *firing;   /* sorted fingerprints notified as firing, comma-separated ("" none); owned */
    char *resolved; /* same for resolved */
    double sent_at; /* unix seconds */
};
/* 0 and *out filled (free with alert_nlog_deinit), ERR_NOT_FOUND when the group was never notified. */
int alert_store_nlog_get(struct alert_store *s, const char *receiver, const char *group_key, struct alert_nlog *out);
void alert_nlog_deinit(struct alert_nlog *e);
/* Records entry as the group's log without notifying (a group settled silently). 0 or ERR_IO. */
int alert_store_nlog_put(struct alert_store *s, const char *receiver, const char *group_key,
                         const struct alert_nlog *entry);

/* ---- outbox ---- */
struct alert_outbox_row {
    int64_t id;
    char *receiver, *group_key, *url, *body; /* owned */
    int attempts;
    double created, next_try; /* unix seconds */
};

/* In one transaction: queues body for url under receiver and records entry as the group's log (the
 * notification counts as made from now on). 0 or ERR_IO. */
int alert_store_enqueue(struct alert_store *s, const char *receiver, const char *group_key, const char *url,
                        const char *body, double now, const struct alert_nlog *entry);
/* The oldest pending row of each receiver (delivery is in order per receiver), into a new array; *n set.
 * Free with alert_store_rows_free. 0 or ERR_IO / ERR_NOMEM. */
int alert_store_outbox_heads(struct alert_store *s, struct alert_outbox_row **rows, int *n);
void alert_store_rows_free(struct alert_outbox_row *rows, int n);
int alert_store_outbox_delete(struct alert_store *s, int64_t id);
int alert_store_outbox_retry(struct alert_store *s, int64_t id, int attempts, double next_try);
/* Pending rows (all receivers when receiver is NULL); negative on error. */
int alert_store_outbox_count(struct alert_store *s, const char *receiver);

#endif
