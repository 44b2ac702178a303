/*
 * alert_store: three tables in one SQLite database (alert_store.h says what each keeps and why).
 *
 *   alert_state(rule PRIMARY KEY, state, active_at, fired_at, resolved_at, value)
 *   nlog(receiver, group_key, firing, resolved, sent_at; PRIMARY KEY (receiver, group_key))
 *   outbox(id INTEGER PRIMARY KEY AUTOINCREMENT, receiver, group_key, url, body, created, attempts, next_try)
 *
 * WAL journal with synchronous=NORMAL: a committed transaction survives the process being killed (only a
 * power cut may lose the last ones), and the evaluating thread's writes do not wait on a reader. One
 * connection, serialized by the store's mutex; the statements are few and small, so nothing is cached.
 */
#include "core/alert_store.h"

#include "core/err.h"
#include "core/log.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct alert_store {
    pthread_mutex_t mu;
    sqlite3 *db;
};

static const char alert_store_schema[] =
    "CREATE TABLE IF NOT EXISTS alert_state(rule TEXT PRIMARY KEY, state INTEGER NOT NULL, active_at REAL, "
    "fired_at REAL, resolved_at REAL, value REAL);"
    "CREATE TABLE IF NOT EXISTS nlog(receiver TEXT NOT NULL, group_key TEXT NOT NULL, firing TEXT NOT NULL, "
    "resolved TEXT NOT NULL, sent_at REAL NOT NULL, PRIMARY KEY(receiver, group_key));"
    "CREATE TABLE IF NOT EXISTS outbox(id INTEGER PRIMARY KEY AUTOINCREMENT, receiver TEXT NOT NULL, "
    "group_key TEXT NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL, created REAL NOT NULL, "
    "attempts INTEGER NOT NULL, next_try REAL NOT NULL);";

struct alert_store *alert_store_open(const char *path, char *err)
{
    struct alert_store *s = calloc(1, sizeof *s);
    if (!s) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX;
    if (sqlite3_open_v2(path ? path : ":memory:", &s->db, flags, NULL) != SQLITE_OK) {
        err_set(err, ERR_IO, "cannot open the alert store '%s': %s", path ? path : ":memory:",
                s->db ? sqlite3_errmsg(s->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(s->db, 2000);
    char *msg = NULL;
    if (sqlite3_exec(s->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(s->db, alert_store_schema, NULL, NULL, &msg) != SQLITE_OK) {
        err_set(err, ERR_IO, "the alert store '%s' cannot be used: %s (move it away to start afresh)",
                path ? path : ":memory:", msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        goto fail;
    }
    return s;
fail:
    alert_store_close(s);
    return NULL;
}

struct alert_store *alert_store_open_dir(const char *dir, char *err)
{
    if (!dir)
        return alert_store_open(NULL, err);
    if (mkdir(dir, 0755) && errno != EEXIST) {
        err_set(err, ERR_IO, "alerts.data_dir: cannot create '%s': %s", dir, strerror(errno));
        return NULL;
    }
    char *db = NULL;
    if (asprintf(&db, "%s/alerts.sqlite", dir) < 0) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    struct alert_store *s = alert_store_open(db, err);
    free(db);
    return s;
}

void alert_store_close(struct alert_store *s)
{
    if (!s)
        return;
    if (s->db)
        sqlite3_close(s->db);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Runs sql with the arguments bound by fmt ('t' text, 'd' double, 'i' int64), for statements without rows.
 * Called with the mutex held. */
static int st_exec(struct alert_store *s, const char *sql, const char *fmt, ...)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
        log_warn("alert store: %s", sqlite3_errmsg(s->db));
        return ERR_IO;
    }
    va_list ap;
    va_start(ap, fmt);
    for (int i = 0; fmt[i]; i++) {
        if (fmt[i] == 't')
            sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT);
        else if (fmt[i] == 'd')
            sqlite3_bind_double(st, i + 1, va_arg(ap, double));
        else
            sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
    }
    va_end(ap);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        log_warn("alert store: %s", sqlite3_errmsg(s->db));
        return ERR_IO;
    }
    return 0;
}

int alert_store_save_state(struct alert_store *s, const char *rule, int state, double active_at, double fired_at,
                           double resolved_at, double value)
{
    pthread_mutex_lock(&s->mu);
    int rc = st_exec(s,
                     "INSERT INTO alert_state(rule, state, active_at, fired_at, resolved_at, value) "
                     "VALUES(?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(rule) DO UPDATE SET state = ?2, active_at = ?3, "
                     "fired_at = ?4, resolved_at = ?5, value = ?6",
                     "tidddd", rule, (int64_t)state, active_at, fired_at, resolved_at, value != value ? 0.0 : value);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int alert_store_load_states(struct alert_store *s,
                            void (*fn)(void *ctx, const char *rule, int state, double active_at, double fired_at,
                                       double resolved_at, double value),
                            void *ctx)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = 0;
    if (sqlite3_prepare_v2(s->db, "SELECT rule, state, active_at, fired_at, resolved_at, value FROM alert_state", -1,
                           &st, NULL) != SQLITE_OK) {
        rc = ERR_IO;
    } else {
        while (sqlite3_step(st) == SQLITE_ROW)
            fn(ctx, (const char *)sqlite3_column_text(st, 0), sqlite3_column_int(st, 1), sqlite3_column_double(st, 2),
               sqlite3_column_double(st, 3), sqlite3_column_double(st, 4), sqlite3_column_double(st, 5));
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return strdup(t ? (const char *)t : "");
}

int alert_store_nlog_get(struct alert_store *s, const char *receiver, const char *group_key, struct alert_nlog *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = ERR_NOT_FOUND;
    if (sqlite3_prepare_v2(s->db, "SELECT firing, resolved, sent_at FROM nlog WHERE receiver = ?1 AND group_key = ?2",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = ERR_IO;
    } else {
        sqlite3_bind_text(st, 1, receiver, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, group_key, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            out->firing = col_dup(st, 0);
            out->resolved = col_dup(st, 1);
            out->sent_at = sqlite3_column_double(st, 2);
            rc = out->firing && out->resolved ? 0 : ERR_NOMEM;
            if (rc)
                alert_nlog_deinit(out);
        }
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void alert_nlog_deinit(struct alert_nlog *e)
{
    free(e->firing);
    free(e->resolved);
    e->firing = e->resolved = NULL;
}

static int nlog_put_locked(struct alert_store *s, const char *receiver, const char *group_key,
                           const struct alert_nlog *entry)
{
    return st_exec(s,
                   "INSERT INTO nlog(receiver, group_key, firing, resolved, sent_at) VALUES(?1, ?2, ?3, ?4, ?5) "
                   "ON CONFLICT(receiver, group_key) DO UPDATE SET firing = ?3, resolved = ?4, sent_at = ?5",
                   "ttttd", receiver, group_key, entry->firing, entry->resolved, entry->sent_at);
}

int alert_store_nlog_put(struct alert_store *s, const char *receiver, const char *group_key,
                         const struct alert_nlog *entry)
{
    pthread_mutex_lock(&s->mu);
    int rc = nlog_put_locked(s, receiver, group_key, entry);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int alert_store_enqueue(struct alert_store *s, const char *receiver, const char *group_key, const char *url,
                        const char *body, double now, const struct alert_nlog *entry)
{
    pthread_mutex_lock(&s->mu);
    int rc = st_exec(s, "BEGIN IMMEDIATE", "");
    if (!rc)
        rc = st_exec(s,
                     "INSERT INTO outbox(receiver, group_key, url, body, created, attempts, next_try) "
                     "VALUES(?1, ?2, ?3, ?4, ?5, 0, ?5)",
                     "ttttd", receiver, group_key, url, body, now);
    if (!rc)
        rc = nlog_put_locked(s, receiver, group_key, entry);
    if (!rc)
        rc = st_exec(s, "COMMIT", "");
    if (rc)
        st_exec(s, "ROLLBACK", "");
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int alert_store_outbox_heads(struct alert_store *s, struct alert_outbox_row **rows, int *n)
{
    *rows = NULL;
    *n = 0;
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int rc = 0, cap = 0;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT id, receiver, group_key, url, body, attempts, created, next_try FROM outbox "
                           "WHERE id IN (SELECT MIN(id) FROM outbox GROUP BY receiver) ORDER BY id",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = ERR_IO;
    } else {
        while (!rc && sqlite3_step(st) == SQLITE_ROW) {
            if (*n == cap) {
                cap = cap ? cap * 2 : 8;
                struct alert_outbox_row *nr = realloc(*rows, (size_t)cap * sizeof *nr);
                if (!nr) {
                    rc = ERR_NOMEM;
                    break;
                }
                *rows = nr;
            }
            struct alert_outbox_row *r = &(*rows)[*n];
            r->id = sqlite3_column_int64(st, 0);
            r->receiver = col_dup(st, 1);
            r->group_key = col_dup(st, 2);
            r->url = col_dup(st, 3);
            r->body = col_dup(st, 4);
            r->attempts = sqlite3_column_int(st, 5);
            r->created = sqlite3_column_double(st, 6);
            r->next_try = sqlite3_column_double(st, 7);
            (*n)++;
            if (!r->receiver || !r->group_key || !r->url || !r->body)
                rc = ERR_NOMEM;
        }
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        alert_store_rows_free(*rows, *n);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

void alert_store_rows_free(struct alert_outbox_row *rows, int n)
{
    for (int i = 0; rows && i < n; i++) {
        free(rows[i].receiver);
        free(rows[i].group_key);
        free(rows[i].url);
        free(rows[i].body);
    }
    free(rows);
}

int alert_store_outbox_delete(struct alert_store *s, int64_t id)
{
    pthread_mutex_lock(&s->mu);
    int rc = st_exec(s, "DELETE FROM outbox WHERE id = ?1", "i", id);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int alert_store_outbox_retry(struct alert_store *s, int64_t id, int attempts, double next_try)
{
    pthread_mutex_lock(&s->mu);
    int rc = st_exec(s, "UPDATE outbox SET attempts = ?2, next_try = ?3 WHERE id = ?1", "iid", id, (int64_t)attempts,
                     next_try);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int alert_store_outbox_count(struct alert_store *s, const char *receiver)
{
    pthread_mutex_lock(&s->mu);
    sqlite3_stmt *st = NULL;
    int n = ERR_IO;
    if (sqlite3_prepare_v2(s->db,
                           receiver ? "SELECT COUNT(*) FROM outbox WHERE receiver = ?1" : "SELECT COUNT(*) FROM outbox",
                           -1, &st, NULL) == SQLITE_OK) {
        if (receiver)
            sqlite3_bind_text(st, 1, receiver, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW)
            n = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&s->mu);
    return n;
}
