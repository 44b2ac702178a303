/*
 * store_sqlite: the embedded job store. One SQLite database in WAL mode plus the files' bytes as plain files:
 *
 *   <data_dir>/jobs.db (+ -wal, -shm)   files, batches, lines (each line's body, state and result)
 *   <data_dir>/files/<file id>          uploaded, output and error files, immutable once published
 *   <data_dir>/files/.tmp-<file id>     a file being written (removed at open: never published)
 *   <data_dir>/lock                     flock()ed by the one process that owns the dir; holds its pid
 *   <data_dir>/reserve                  1 MiB kept free: given up only to record a batch's failure when the
 *                                       disk is full; made again when space allows
 *
 * Durability: synchronous=FULL, so a committed transaction survives a power loss too, not only kill -9 (WAL with
 * NORMAL would survive kill -9 but could lose the last commits on power loss). The fsync this costs is paid once
 * per group of results, not per line: the runner commits everything that finished since its last commit in one
 * transaction, and a line takes far longer to generate than a commit takes.
 *
 * A file's bytes are written to .tmp-<id>, fsynced, renamed to <id> and the directory fsynced before the row
 * that makes it visible is inserted, so a visible file is always whole; a file without a row is left over from
 * a crash and removed at the next open (only the owner of the lock writes here, so no writer can be racing).
 *
 * Line states: 0 pending, 1 claimed (running in this process), 2 done (result committed). The lock makes this
 * process the only one running lines, so at open every claimed line is one a dead process was running: it
 * goes back to pending with its attempt count kept (it comes back marked reclaimed).
 */
#include "jobs/store.h"

#include "core/fsutil.h"
#include "core/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define SQ_RESERVE_BYTES (1 << 20)

struct sq_backend {
    struct jobs_backend base;
    sqlite3 *db;
    char dir[PATH_MAX];
    int lock_fd;
    bool resume_pending; /* the lines a dead process held are not back to pending yet (disk was full at open) */
    bool saw_full;       /* SQLite said the disk is full (read by the open, to give up the reserve and retry) */
};

struct sq_writer {
    int fd;
    char tmp[PATH_MAX + 64];
    char path[PATH_MAX + 64];
};

static const char *const sq_schema =
    "CREATE TABLE IF NOT EXISTS files ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, bytes INTEGER NOT NULL,"
    "  created_at INTEGER NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS batches ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, endpoint TEXT NOT NULL,"
    "  input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,"
    "  final_status TEXT NOT NULL, output_file_id TEXT NOT NULL DEFAULT '', error_file_id TEXT NOT NULL DEFAULT '',"
    "  created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,"
    "  in_progress_at INTEGER NOT NULL DEFAULT 0, finalizing_at INTEGER NOT NULL DEFAULT 0,"
    "  completed_at INTEGER NOT NULL DEFAULT 0, failed_at INTEGER NOT NULL DEFAULT 0,"
    "  expired_at INTEGER NOT NULL DEFAULT 0, cancelling_at INTEGER NOT NULL DEFAULT 0,"
    "  cancelled_at INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0,"
    "  failed INTEGER NOT NULL DEFAULT 0, metadata TEXT, error_code TEXT NOT NULL DEFAULT '',"
    "  error_message TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS batches_status ON batches(status, seq);"
    "CREATE TABLE IF NOT EXISTS lines ("
    "  batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL,"
    "  state INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0, result TEXT,"
    "  is_error INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, idx)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS lines_state ON lines(batch_id, state, idx);";

static const char *const sq_batch_cols =
    "id, endpoint, input_file_id, completion_window, status, final_status, output_file_id, error_file_id,"
    " created_at, expires_at, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at,"
    " cancelled_at, total, completed, failed, metadata, error_code, error_message";

/* ---- helpers ---- */

/* Removes the reserve of data dir dir; whether there was one. */
static bool sq_reserve_release(const char *dir)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/reserve", dir);
    return unlink(path) == 0;
}

static void sq_reserve_make(struct sq_backend *q)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/reserve", q->dir);
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size >= SQ_RESERVE_BYTES)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (posix_fallocate(fd, 0, SQ_RESERVE_BYTES) != 0) {
        close(fd);
        unlink(path); /* a partial reserve would hide how full the disk is */
        return;
    }
    fsync(fd);
    close(fd);
}

/* Maps a SQLite result code to ERR_* with a sentence. Disk full keeps the reserve: only the write that records a
 * batch's failure may use it (sq_batch_transition), else the next results would fill it first. */
static int sq_fail(struct sq_backend *q, int rc, const char *what, char *err)
{
    int code = ERR_IO;
    if (rc == SQLITE_FULL) {
        code = ERR_NO_SPACE;
        q->saw_full = true;
    } else if (rc == SQLITE_NOMEM) {
        code = ERR_NOMEM;
    }
    return err_set(err, code, "%s: %s (%s/jobs.db)", what, q->db ? sqlite3_errmsg(q->db) : sqlite3_errstr(rc),
                   q->dir);
}

static int sq_exec(struct sq_backend *q, const char *sql, char *err)
{
    int rc = sqlite3_exec(q->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : sq_fail(q, rc, sql, err);
}

static int sq_prep(struct sq_backend *q, sqlite3_stmt **st, const char *sql, char *err)
{
    int rc = sqlite3_prepare_v2(q->db, sql, -1, st, NULL);
    return rc == SQLITE_OK ? 0 : sq_fail(q, rc, "preparing a statement", err);
}

static int sq_begin(struct sq_backend *q, char *err) { return sq_exec(q, "BEGIN IMMEDIATE", err); }

static int sq_commit(struct sq_backend *q, char *err)
{
    int rc = sq_exec(q, "COMMIT", err);
    if (rc)
        sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

static void sq_rollback(struct sq_backend *q)
{
    if (!sqlite3_get_autocommit(q->db))
        sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
}

/* Steps a statement that returns no rows; SQLITE_DONE is success. */
static int sq_step_done(struct sq_backend *q, sqlite3_stmt *st, const char *what, char *err)
{
    int rc = sqlite3_step(st);
    return rc == SQLITE_DONE ? 0 : sq_fail(q, rc, what, err);
}

static void sq_text(char *dst, size_t size, sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, size, "%s", t ? (const char *)t : "");
}

static void sq_file_path(const struct sq_backend *q, const char *id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/files/%s", q->dir, id);
}

static int sq_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* ---- open/close ---- */

static void sq_close(struct jobs_backend *b)
{
    struct sq_backend *q = (struct sq_backend *)b;
    if (q->db)
        sqlite3_close(q->db);
    if (q->lock_fd >= 0)
        close(q->lock_fd); /* releases the flock */
    free(q);
}

/* Removes what a crash left: half-written files and files never published (no row). */
static void sq_sweep(struct sq_backend *q)
{
    char dir[PATH_MAX + 8];
    snprintf(dir, sizeof dir, "%s/files", q->dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(q->db, "SELECT 1 FROM files WHERE id = ?1", -1, &st, NULL) != SQLITE_OK)
        st = NULL;
    struct dirent *e;
    while (st && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        bool keep = false;
        if (strncmp(e->d_name, ".tmp-", 5)) {
            sqlite3_reset(st);
            sqlite3_bind_text(st, 1, e->d_name, -1, SQLITE_TRANSIENT);
            keep = sqlite3_step(st) == SQLITE_ROW;
        }
        if (!keep) {
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    sqlite3_finalize(st);
    closedir(d);
}

static const struct jobs_backend_ops sq_ops;

static struct jobs_backend *sq_open_once(const char *data_dir, bool *full, char *err)
{
    struct sq_backend *q = calloc(1, sizeof *q);
    if (!q) {
        err_set(err, ERR_NOMEM, "out of memory opening the job store");
        return NULL;
    }
    q->base.ops = &sq_ops;
    q->lock_fd = -1;
    if (strlen(data_dir) + 64 >= sizeof q->dir) {
        err_set(err, ERR_INVALID_ARG, "data dir path too long: %s", data_dir);
        goto fail;
    }
    snprintf(q->dir, sizeof q->dir, "%s", data_dir);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/files", q->dir);
    if (fs_mkdirs(path, 0700, err))
        goto fail;
    snprintf(path, sizeof path, "%s/lock", q->dir);
    q->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (q->lock_fd < 0) {
        err_set(err, ERR_IO, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (flock(q->lock_fd, LOCK_EX | LOCK_NB)) {
        char pid[32] = "";
        ssize_t n = pread(q->lock_fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        err_set(err, ERR_UNAVAILABLE,
                "the data dir %s is in use by another wafer process (pid %s); give each process its own data dir, "
                "or share batches between processes with a Redis queue",
                q->dir, pid[0] ? pid : "?");
        goto fail;
    }
    char pidline[32];
    int pl = snprintf(pidline, sizeof pidline, "%d\n", (int)getpid());
    if (ftruncate(q->lock_fd, 0) || pwrite(q->lock_fd, pidline, (size_t)pl, 0) != pl) {
        /* the pid is only for the message above; the lock itself holds */
    }
    snprintf(path, sizeof path, "%s/jobs.db", q->dir);
    int rc = sqlite3_open_v2(path, &q->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        sq_fail(q, rc, "cannot open the job database", err);
        goto fail;
    }
    sqlite3_busy_timeout(q->db, 5000);
    /* auto_vacuum before anything writes the header (journal_mode=WAL does): a finished batch's dropped lines
     * then shrink the file instead of staying as free pages */
    if (sq_exec(q, "PRAGMA auto_vacuum=FULL", err))
        goto fail;
    sqlite3_stmt *st;
    if (sq_prep(q, &st, "PRAGMA journal_mode=WAL", err))
        goto fail;
    rc = sqlite3_step(st);
    const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
    bool wal = mode && !strcasecmp(mode, "wal");
    sqlite3_finalize(st);
    if (!wal) {
        err_set(err, ERR_IO, "the job database %s cannot use WAL mode (is the data dir on a network file system?)",
                path);
        goto fail;
    }
    /* secure_delete off: dropping a finished batch's lines must not rewrite every freed page (Debian builds
     * SQLite with it on), which would need free space exactly when the disk is full */
    if (sq_exec(q, "PRAGMA synchronous=FULL", err) || sq_exec(q, "PRAGMA secure_delete=OFF", err) ||
        sq_exec(q, sq_schema, err))
        goto fail;
    /* a full disk must not keep the store from opening (the batches can still be read): put the lines back
     * before the first claim instead */
    q->resume_pending = sq_exec(q, "UPDATE lines SET state = 0 WHERE state = 1", err) != 0;
    if (q->resume_pending)
        log_warn("jobs: %s; retrying before the first line runs", err ? err : "cannot resume claimed lines");
    if (!sq_exec(q, "DELETE FROM lines WHERE batch_id IN (SELECT id FROM batches WHERE status = 'failed')", NULL))
        sq_exec(q, "PRAGMA wal_checkpoint(TRUNCATE)", NULL);
    sq_sweep(q);
    sq_reserve_make(q);
    return &q->base;
fail:
    *full = q->saw_full;
    sq_close(&q->base);
    return NULL;
}

/* A full disk must not keep the store from opening (its batches can still be read and cancelled): when SQLite
 * cannot even set up its WAL files for want of space, the reserve is given up and the open tried once more. */
struct jobs_backend *jobs_sqlite_open(const char *data_dir, char *err)
{
    bool full = false;
    struct jobs_backend *b = sq_open_once(data_dir, &full, err);
    if (!b && full && sq_reserve_release(data_dir)) {
        log_warn("jobs: the disk under %s is full; used its reserve to open the job store", data_dir);
        b = sq_open_once(data_dir, &full, err);
    }
    return b;
}

/* ---- files ---- */

static int sq_file_write_begin(struct jobs_backend *b, const char *id, void **wp, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    struct sq_writer *w = calloc(1, sizeof *w);
    if (!w)
        return err_set(err, ERR_NOMEM, "out of memory writing a file");
    snprintf(w->tmp, sizeof w->tmp, "%s/files/.tmp-%s", q->dir, id);
    sq_file_path(q, id, w->path, sizeof w->path);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (w->fd < 0) {
        int e = errno;
        free(w);
        return err_set(err, e == ENOSPC || e == EDQUOT ? ERR_NO_SPACE : ERR_IO, "cannot create %s/files/.tmp-%s: %s",
                       q->dir, id, strerror(e));
    }
    *wp = w;
    return 0;
}

static int sq_io_fail(int e, const char *what, const char *path, char *err)
{
    if (e == ENOSPC || e == EDQUOT || e == EFBIG)
        return err_set(err, ERR_NO_SPACE, "%s %s: %s", what, path, strerror(e));
    return err_set(err, ERR_IO, "%s %s: %s", what, path, strerror(e));
}

static int sq_file_write(struct jobs_backend *b, void *wp, const void *p, size_t n, char *err)
{
    struct sq_writer *w = wp;
    const char *c = p;
    while (n) {
        ssize_t k = write(w->fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return sq_io_fail(k < 0 ? errno : ENOSPC, "cannot write", w->tmp, err);
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int sq_file_write_end(struct jobs_backend *b, void *wp, bool keep, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    struct sq_writer *w = wp;
    int rc = 0;
    if (keep && fsync(w->fd))
        rc = sq_io_fail(errno, "cannot sync", w->tmp, err);
    if (close(w->fd) && keep && !rc)
        rc = sq_io_fail(errno, "cannot close", w->tmp, err);
    if (keep && !rc && rename(w->tmp, w->path))
        rc = sq_io_fail(errno, "cannot rename", w->tmp, err);
    if (keep && !rc) {
        char dir[PATH_MAX + 8];
        snprintf(dir, sizeof dir, "%s/files", q->dir);
        if (sq_fsync_dir(dir))
            rc = sq_io_fail(errno, "cannot sync", dir, err);
    }
    if (!keep || rc)
        unlink(w->tmp);
    free(w);
    return rc;
}

static void sq_file_discard(struct jobs_backend *b, const char *id)
{
    char path[PATH_MAX + 64];
    sq_file_path((struct sq_backend *)b, id, path, sizeof path);
    unlink(path);
}

static int sq_file_insert(struct sq_backend *q, const struct jobs_file_rec *f, char *err)
{
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, "INSERT INTO files (id, bytes, created_at, filename, purpose) VALUES (?1,?2,?3,?4,?5)",
                     err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, f->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, f->bytes);
    sqlite3_bind_int64(st, 3, f->created_at);
    sqlite3_bind_text(st, 4, f->filename, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, f->purpose, -1, SQLITE_STATIC);
    rc = sq_step_done(q, st, "recording a file", err);
    sqlite3_finalize(st);
    return rc;
}

static int sq_file_publish(struct jobs_backend *b, const struct jobs_file_rec *f, char *err)
{
    return sq_file_insert((struct sq_backend *)b, f, err);
}

static void sq_file_row(sqlite3_stmt *st, struct jobs_file_rec *f)
{
    sq_text(f->id, sizeof f->id, st, 0);
    f->bytes = sqlite3_column_int64(st, 1);
    f->created_at = sqlite3_column_int64(st, 2);
    sq_text(f->filename, sizeof f->filename, st, 3);
    sq_text(f->purpose, sizeof f->purpose, st, 4);
}

static int sq_file_get(struct jobs_backend *b, const char *id, struct jobs_file_rec *f, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, "SELECT id, bytes, created_at, filename, purpose FROM files WHERE id = ?1", err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW)
        sq_file_row(st, f);
    else if (s == SQLITE_DONE)
        rc = err_set(err, ERR_NOT_FOUND, "No file with id '%.60s' exists.", id);
    else
        rc = sq_fail(q, s, "reading a file", err);
    sqlite3_finalize(st);
    return rc;
}

/* seq of `after` in table (files or batches); ERR_NOT_FOUND when there is no such id. */
static int sq_after_seq(struct sq_backend *q, const char *table, const char *after, int64_t *seq, char *err)
{
    *seq = INT64_MAX;
    if (!after || !*after)
        return 0;
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT seq FROM %s WHERE id = ?1", table);
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, sql, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, after, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW)
        *seq = sqlite3_column_int64(st, 0);
    else if (s == SQLITE_DONE)
        rc = err_set(err, ERR_NOT_FOUND, "Invalid 'after': no %s with id '%.60s' exists.",
                     !strcmp(table, "files") ? "file" : "batch", after);
    else
        rc = sq_fail(q, s, "listing", err);
    sqlite3_finalize(st);
    return rc;
}

static int sq_file_list(struct jobs_backend *b, const char *purpose, const char *after, int max,
                        struct jobs_file_rec *out, int *n, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    *n = 0;
    int64_t seq;
    int rc = sq_after_seq(q, "files", after, &seq, err);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = sq_prep(q, &st,
                 "SELECT id, bytes, created_at, filename, purpose FROM files WHERE seq < ?1 AND (?2 IS NULL OR "
                 "purpose = ?2) ORDER BY seq DESC LIMIT ?3",
                 err);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, seq);
    if (purpose)
        sqlite3_bind_text(st, 2, purpose, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, max);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        sq_file_row(st, &out[(*n)++]);
    if (s != SQLITE_DONE)
        rc = sq_fail(q, s, "listing files", err);
    sqlite3_finalize(st);
    return rc;
}

static int sq_file_read(struct jobs_backend *b, const char *id, char **data, size_t *len, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    struct jobs_file_rec f;
    int rc = sq_file_get(b, id, &f, err);
    if (rc)
        return rc;
    char path[PATH_MAX + 64];
    sq_file_path(q, id, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, ERR_IO, "the content of file %s is missing (%s: %s)", id, path, strerror(errno));
    char *buf = malloc((size_t)f.bytes + 1);
    if (!buf) {
        close(fd);
        return err_set(err, ERR_NOMEM, "out of memory reading file %s (%lld bytes)", id, (long long)f.bytes);
    }
    size_t got = 0;
    while (got < (size_t)f.bytes) {
        ssize_t k = read(fd, buf + got, (size_t)f.bytes - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (got != (size_t)f.bytes) {
        free(buf);
        return err_set(err, ERR_IO, "the content of file %s is shorter than recorded (%zu of %lld bytes)", id, got,
                       (long long)f.bytes);
    }
    buf[got] = 0;
    *data = buf;
    *len = got;
    return 0;
}

static int sq_file_delete(struct jobs_backend *b, const char *id, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, "DELETE FROM files WHERE id = ?1", err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    rc = sq_step_done(q, st, "deleting a file", err);
    sqlite3_finalize(st);
    if (!rc && sqlite3_changes(q->db) == 0)
        return err_set(err, ERR_NOT_FOUND, "No file with id '%.60s' exists.", id);
    if (!rc)
        sq_file_discard(b, id); /* after the row: a crash in between leaves a file the next open sweeps */
    return rc;
}

/* ---- batches ---- */

static void sq_batch_row(sqlite3_stmt *st, struct jobs_batch_rec *r)
{
    char tmp[32];
    sq_text(r->id, sizeof r->id, st, 0);
    sq_text(r->endpoint, sizeof r->endpoint, st, 1);
    sq_text(r->input_file_id, sizeof r->input_file_id, st, 2);
    sq_text(r->completion_window, sizeof r->completion_window, st, 3);
    sq_text(tmp, sizeof tmp, st, 4);
    r->status = (enum jobs_status)jobs_status_parse(tmp);
    sq_text(tmp, sizeof tmp, st, 5);
    r->final_status = (enum jobs_status)jobs_status_parse(tmp);
    sq_text(r->output_file_id, sizeof r->output_file_id, st, 6);
    sq_text(r->error_file_id, sizeof r->error_file_id, st, 7);
    r->created_at = sqlite3_column_int64(st, 8);
    r->expires_at = sqlite3_column_int64(st, 9);
    static const enum jobs_status at_cols[] = {JOBS_IN_PROGRESS, JOBS_FINALIZING, JOBS_COMPLETED, JOBS_FAILED,
                                               JOBS_EXPIRED,     JOBS_CANCELLING, JOBS_CANCELLED};
    for (int i = 0; i < 7; i++)
        r->at[at_cols[i]] = sqlite3_column_int64(st, 10 + i);
    r->total = sqlite3_column_int64(st, 17);
    r->completed = sqlite3_column_int64(st, 18);
    r->failed = sqlite3_column_int64(st, 19);
    const unsigned char *m = sqlite3_column_text(st, 20);
    r->metadata = m ? strdup((const char *)m) : NULL;
    sq_text(r->error_code, sizeof r->error_code, st, 21);
    sq_text(r->error_message, sizeof r->error_message, st, 22);
}

static int sq_batch_insert(struct jobs_backend *b, const struct jobs_batch_rec *r, const struct jobs_input_line *lines,
                           int64_t n, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    sqlite3_stmt *st = NULL;
    rc = sq_prep(q, &st,
                 "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, final_status,"
                 " created_at, expires_at, in_progress_at, total, metadata) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
                 err);
    if (rc)
        goto fail;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->endpoint, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->input_file_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->completion_window, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, jobs_status_name(r->status), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, jobs_status_name(r->final_status), -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, r->created_at);
    sqlite3_bind_int64(st, 8, r->expires_at);
    sqlite3_bind_int64(st, 9, r->at[JOBS_IN_PROGRESS]);
    sqlite3_bind_int64(st, 10, r->total);
    if (r->metadata)
        sqlite3_bind_text(st, 11, r->metadata, -1, SQLITE_STATIC);
    rc = sq_step_done(q, st, "recording a batch", err);
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        goto fail;
    rc = sq_prep(q, &st, "INSERT INTO lines (batch_id, idx, custom_id, body) VALUES (?1,?2,?3,?4)", err);
    for (int64_t i = 0; !rc && i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, i);
        sqlite3_bind_text(st, 3, lines[i].custom_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, lines[i].body, -1, SQLITE_STATIC);
        rc = sq_step_done(q, st, "recording a batch's lines", err);
    }
    sqlite3_finalize(st);
    if (rc)
        goto fail;
    return sq_commit(q, err);
fail:
    sq_rollback(q);
    return rc;
}

static int sq_batch_query(struct sq_backend *q, const char *where, const char *bind_text, int64_t bind_int,
                          int max, struct jobs_batch_rec *out, int *n, char *err)
{
    char sql[1024];
    snprintf(sql, sizeof sql, "SELECT %s FROM batches %s", sq_batch_cols, where);
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, sql, err);
    if (rc)
        return rc;
    if (bind_text)
        sqlite3_bind_text(st, 1, bind_text, -1, SQLITE_STATIC);
    else
        sqlite3_bind_int64(st, 1, bind_int);
    sqlite3_bind_int(st, 2, max);
    int s = SQLITE_DONE;
    *n = 0;
    while (*n < max && (s = sqlite3_step(st)) == SQLITE_ROW)
        sq_batch_row(st, &out[(*n)++]);
    if (*n < max && s != SQLITE_DONE)
        rc = sq_fail(q, s, "reading batches", err);
    sqlite3_finalize(st);
    return rc;
}

static int sq_batch_get(struct jobs_backend *b, const char *id, struct jobs_batch_rec *out, char *err)
{
    int n = 0;
    int rc = sq_batch_query((struct sq_backend *)b, "WHERE id = ?1 LIMIT ?2", id, 0, 1, out, &n, err);
    if (!rc && n == 0)
        return err_set(err, ERR_NOT_FOUND, "No batch with id '%.60s' exists.", id);
    return rc;
}

static int sq_batch_list(struct jobs_backend *b, const char *after, int max, struct jobs_batch_rec *out, int *n,
                         char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    int64_t seq;
    int rc = sq_after_seq(q, "batches", after, &seq, err);
    if (rc)
        return rc;
    return sq_batch_query(q, "WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2", NULL, seq, max, out, n, err);
}

static int sq_batch_active(struct jobs_backend *b, struct jobs_batch_rec **out, int *n, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st,
                     "SELECT count(*) FROM batches WHERE status IN ('validating','in_progress','cancelling',"
                     "'finalizing')",
                     err);
    if (rc)
        return rc;
    int max = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_finalize(st);
    if (max == 0)
        return 0;
    *out = calloc((size_t)max, sizeof **out);
    if (!*out)
        return err_set(err, ERR_NOMEM, "out of memory listing batches");
    rc = sq_batch_query(q,
                        "WHERE status IN ('validating','in_progress','cancelling','finalizing') ORDER BY seq "
                        "LIMIT ?2",
                        NULL, 0, max, *out, n, err);
    return rc;
}

static int sq_batch_transition_once(struct sq_backend *q, const char *id, unsigned from_mask, enum jobs_status to,
                                    enum jobs_status final_status, int64_t now, const char *error_code,
                                    const char *error_message, bool *applied, enum jobs_status *old, char *err)
{
    *applied = false;
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = sq_prep(q, &st, "SELECT status FROM batches WHERE id = ?1", err);
    if (rc)
        goto fail;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    int cur = s == SQLITE_ROW ? jobs_status_parse((const char *)sqlite3_column_text(st, 0)) : -1;
    sqlite3_finalize(st);
    if (s == SQLITE_DONE)
        rc = err_set(err, ERR_NOT_FOUND, "No batch with id '%.60s' exists.", id);
    else if (s != SQLITE_ROW)
        rc = sq_fail(q, s, "reading a batch", err);
    if (rc)
        goto fail;
    if (old)
        *old = (enum jobs_status)cur;
    if (cur < 0 || !(from_mask & JOBS_STATUS_BIT(cur))) {
        sq_rollback(q);
        return 0;
    }
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE batches SET status = ?2, %s_at = ?3, final_status = ?4, error_code = ?5, error_message = ?6 "
             "WHERE id = ?1",
             jobs_status_name(to));
    rc = sq_prep(q, &st, sql, err);
    if (rc)
        goto fail;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, jobs_status_name(to), -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_text(st, 4, jobs_status_name(to == JOBS_FINALIZING ? final_status : to), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, error_code ? error_code : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, error_message ? error_message : "", -1, SQLITE_STATIC);
    rc = sq_step_done(q, st, "updating a batch", err);
    sqlite3_finalize(st);
    if (rc)
        goto fail;
    rc = sq_commit(q, err);
    *applied = rc == 0;
    if (!rc && to == JOBS_FAILED) {
        /* a failed batch has no output: its lines only take space. Best effort, after the status is safe: when
         * the disk is full this may not fit yet, and the next open tries again. */
        if (!sq_exec(q, "DELETE FROM lines WHERE batch_id IN (SELECT id FROM batches WHERE status = 'failed')", NULL))
            sq_exec(q, "PRAGMA wal_checkpoint(TRUNCATE)", NULL);
    }
    return rc;
fail:
    sq_rollback(q);
    return rc;
}

/* A batch that fails because the disk is full must still read as failed: when the store refuses that write for
 * want of space, the reserve is given up for it and the write tried once more. The reserve is made again once
 * the failed batch's lines are gone (or at the next finished batch or open). */
static int sq_batch_transition(struct jobs_backend *b, const char *id, unsigned from_mask, enum jobs_status to,
                               enum jobs_status final_status, int64_t now, const char *error_code,
                               const char *error_message, bool *applied, enum jobs_status *old, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    int rc = sq_batch_transition_once(q, id, from_mask, to, final_status, now, error_code, error_message, applied,
                                      old, err);
    if (rc == ERR_NO_SPACE && to == JOBS_FAILED) {
        sq_reserve_release(q->dir);
        rc = sq_batch_transition_once(q, id, from_mask, to, final_status, now, error_code, error_message, applied,
                                      old, err);
    }
    if (!rc && *applied && to == JOBS_FAILED)
        sq_reserve_make(q);
    return rc;
}

static int sq_batch_end(struct jobs_backend *b, const char *id, enum jobs_status to, const struct jobs_file_rec *out,
                        const struct jobs_file_rec *errf, int64_t now, bool *applied, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    *applied = false;
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE batches SET status = ?2, %s_at = ?3, output_file_id = ?4, error_file_id = ?5 "
             "WHERE id = ?1 AND status = 'finalizing'",
             jobs_status_name(to));
    sqlite3_stmt *st;
    rc = sq_prep(q, &st, sql, err);
    if (rc)
        goto fail;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, jobs_status_name(to), -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_text(st, 4, out ? out->id : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, errf ? errf->id : "", -1, SQLITE_STATIC);
    rc = sq_step_done(q, st, "finishing a batch", err);
    sqlite3_finalize(st);
    if (rc)
        goto fail;
    if (sqlite3_changes(q->db) == 0) {
        sq_rollback(q);
        return 0;
    }
    if (out && (rc = sq_file_insert(q, out, err)))
        goto fail;
    if (errf && (rc = sq_file_insert(q, errf, err)))
        goto fail;
    /* the output and error files now hold every result: the lines only take space */
    rc = sq_prep(q, &st, "DELETE FROM lines WHERE batch_id = ?1", err);
    if (rc)
        goto fail;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    rc = sq_step_done(q, st, "dropping a finished batch's lines", err);
    sqlite3_finalize(st);
    if (rc)
        goto fail;
    rc = sq_commit(q, err);
    *applied = rc == 0;
    if (!rc)
        sq_reserve_make(q);
    return rc;
fail:
    sq_rollback(q);
    return rc;
}

static int sq_count(struct sq_backend *q, const char *sql, const char *id, int64_t *n, char *err)
{
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, sql, err);
    if (rc)
        return rc;
    if (id)
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW)
        *n = sqlite3_column_int64(st, 0);
    else
        rc = sq_fail(q, s, "counting", err);
    sqlite3_finalize(st);
    return rc;
}

static int sq_batch_inflight(struct jobs_backend *b, const char *id, int64_t *n, char *err)
{
    return sq_count((struct sq_backend *)b, "SELECT count(*) FROM lines WHERE batch_id = ?1 AND state = 1", id, n,
                    err);
}

static int sq_finalize_lock(struct jobs_backend *b, const char *id, bool *owner, char *err)
{
    *owner = true; /* one process per data dir, and the caller holds the store's mutex */
    return 0;
}

/* ---- lines ---- */

static int sq_lines_claim(struct jobs_backend *b, struct jobs_line *out, int max, int *n, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    *n = 0;
    if (q->resume_pending) {
        int rc = sq_exec(q, "UPDATE lines SET state = 0 WHERE state = 1", err);
        if (rc)
            return rc;
        q->resume_pending = false;
    }
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    sqlite3_stmt *sb = NULL, *sl = NULL, *su = NULL;
    rc = sq_prep(q, &sb, "SELECT id, endpoint FROM batches WHERE status = 'in_progress' ORDER BY seq", err);
    if (!rc)
        rc = sq_prep(q, &sl,
                     "SELECT idx, custom_id, body, attempts FROM lines WHERE batch_id = ?1 AND state = 0 ORDER BY idx "
                     "LIMIT ?2",
                     err);
    if (!rc)
        rc = sq_prep(q, &su, "UPDATE lines SET state = 1, attempts = attempts + 1 WHERE batch_id = ?1 AND idx = ?2",
                     err);
    int s = SQLITE_DONE;
    while (!rc && *n < max && (s = sqlite3_step(sb)) == SQLITE_ROW) {
        const char *bid = (const char *)sqlite3_column_text(sb, 0);
        const char *ep = (const char *)sqlite3_column_text(sb, 1);
        sqlite3_reset(sl);
        sqlite3_bind_text(sl, 1, bid, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(sl, 2, max - *n);
        int t;
        while (!rc && (t = sqlite3_step(sl)) == SQLITE_ROW) {
            struct jobs_line *l = &out[*n];
            memset(l, 0, sizeof *l);
            snprintf(l->batch_id, sizeof l->batch_id, "%s", bid);
            snprintf(l->endpoint, sizeof l->endpoint, "%s", ep);
            l->idx = sqlite3_column_int64(sl, 0);
            l->custom_id = strdup((const char *)sqlite3_column_text(sl, 1));
            l->body = strdup((const char *)sqlite3_column_text(sl, 2));
            l->reclaimed = sqlite3_column_int(sl, 3) > 0;
            snprintf(l->entry, sizeof l->entry, "%lld", (long long)l->idx);
            (*n)++;
            if (!l->custom_id || !l->body) {
                rc = err_set(err, ERR_NOMEM, "out of memory claiming lines");
                break;
            }
            sqlite3_reset(su);
            sqlite3_bind_text(su, 1, bid, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(su, 2, l->idx);
            rc = sq_step_done(q, su, "claiming a line", err);
        }
        if (!rc && t != SQLITE_DONE && t != SQLITE_ROW)
            rc = sq_fail(q, t, "reading lines", err);
    }
    if (!rc && s != SQLITE_DONE && s != SQLITE_ROW)
        rc = sq_fail(q, s, "reading batches", err);
    sqlite3_finalize(sb);
    sqlite3_finalize(sl);
    sqlite3_finalize(su);
    if (!rc)
        rc = sq_commit(q, err);
    else
        sq_rollback(q);
    if (rc) {
        for (int i = 0; i < *n; i++)
            jobs_line_deinit(&out[i]);
        *n = 0;
    }
    return rc;
}

static int sq_lines_commit(struct jobs_backend *b, const struct jobs_result *res, int n, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    sqlite3_stmt *sl = NULL, *sb = NULL;
    /* a line of a batch that is no longer running (failed, or finished by expiry/cancel) keeps what it has */
    rc = sq_prep(q, &sl,
                 "UPDATE lines SET state = 2, result = ?3, is_error = ?4 WHERE batch_id = ?1 AND idx = ?2 AND state != 2"
                 " AND EXISTS (SELECT 1 FROM batches WHERE id = ?1 AND status IN ('in_progress','cancelling'))",
                 err);
    if (!rc)
        rc = sq_prep(q, &sb,
                     "UPDATE batches SET completed = completed + (?2 = 0), failed = failed + (?2 != 0) WHERE id = ?1",
                     err);
    for (int i = 0; !rc && i < n; i++) {
        sqlite3_reset(sl);
        sqlite3_bind_text(sl, 1, res[i].line->batch_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(sl, 2, res[i].line->idx);
        sqlite3_bind_text(sl, 3, res[i].text, -1, SQLITE_STATIC);
        sqlite3_bind_int(sl, 4, res[i].is_error);
        rc = sq_step_done(q, sl, "saving a result", err);
        if (!rc && sqlite3_changes(q->db) == 1) {
            sqlite3_reset(sb);
            sqlite3_bind_text(sb, 1, res[i].line->batch_id, -1, SQLITE_STATIC);
            sqlite3_bind_int(sb, 2, res[i].is_error);
            rc = sq_step_done(q, sb, "counting a result", err);
        }
    }
    sqlite3_finalize(sl);
    sqlite3_finalize(sb);
    if (rc) {
        sq_rollback(q);
        return rc;
    }
    return sq_commit(q, err);
}

static int sq_lines_renew(struct jobs_backend *b, const struct jobs_line *lines, int n, bool *lost, char *err)
{
    for (int i = 0; lost && i < n; i++)
        lost[i] = false; /* one process per data dir: nobody else can take a line */
    return 0;
}

static int sq_lines_release(struct jobs_backend *b, const struct jobs_line *lines, int n, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = sq_prep(q, &st, "UPDATE lines SET state = 0 WHERE batch_id = ?1 AND idx = ?2 AND state = 1", err);
    for (int i = 0; !rc && i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, lines[i].batch_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, lines[i].idx);
        rc = sq_step_done(q, st, "releasing a line", err);
    }
    sqlite3_finalize(st);
    if (rc) {
        sq_rollback(q);
        return rc;
    }
    return sq_commit(q, err);
}

static int sq_results_fill(struct jobs_backend *b, const struct jobs_batch_rec *r, const char *code,
                           const char *message, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    int rc = sq_begin(q, err);
    if (rc)
        return rc;
    sqlite3_stmt *sel = NULL, *up = NULL, *cnt = NULL;
    rc = sq_prep(q, &sel, "SELECT idx, custom_id FROM lines WHERE batch_id = ?1 AND state != 2 ORDER BY idx", err);
    if (!rc)
        rc = sq_prep(q, &up, "UPDATE lines SET state = 2, result = ?3, is_error = 1 WHERE batch_id = ?1 AND idx = ?2",
                     err);
    if (!rc)
        rc = sq_prep(q, &cnt, "UPDATE batches SET failed = failed + ?2 WHERE id = ?1", err);
    /* gather first: updating rows while a SELECT walks the same index is not well defined */
    int64_t *idx = NULL;
    char **cid = NULL;
    int64_t n = 0, cap = 0;
    int s = SQLITE_DONE;
    if (!rc)
        sqlite3_bind_text(sel, 1, r->id, -1, SQLITE_STATIC);
    while (!rc && (s = sqlite3_step(sel)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            int64_t *ni = realloc(idx, (size_t)cap * sizeof *ni);
            if (ni)
                idx = ni;
            char **nc = ni ? realloc(cid, (size_t)cap * sizeof *nc) : NULL;
            if (nc)
                cid = nc;
            if (!ni || !nc) {
                rc = err_set(err, ERR_NOMEM, "out of memory finalizing batch %s", r->id);
                break;
            }
        }
        idx[n] = sqlite3_column_int64(sel, 0);
        cid[n] = strdup((const char *)sqlite3_column_text(sel, 1));
        if (!cid[n]) {
            rc = err_set(err, ERR_NOMEM, "out of memory finalizing batch %s", r->id);
            break;
        }
        n++;
    }
    if (!rc && s != SQLITE_DONE)
        rc = sq_fail(q, s, "reading lines", err);
    for (int64_t i = 0; !rc && i < n; i++) {
        char *text = jobs_result_error_text(r->id, idx[i], cid[i], code, message);
        if (!text) {
            rc = err_set(err, ERR_NOMEM, "out of memory finalizing batch %s", r->id);
            break;
        }
        sqlite3_reset(up);
        sqlite3_bind_text(up, 1, r->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(up, 2, idx[i]);
        sqlite3_bind_text(up, 3, text, -1, SQLITE_TRANSIENT);
        free(text);
        rc = sq_step_done(q, up, "saving an error line", err);
    }
    if (!rc && n) {
        sqlite3_bind_text(cnt, 1, r->id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(cnt, 2, n);
        rc = sq_step_done(q, cnt, "counting error lines", err);
    }
    for (int64_t i = 0; i < n; i++)
        free(cid[i]);
    free(cid);
    free(idx);
    sqlite3_finalize(sel);
    sqlite3_finalize(up);
    sqlite3_finalize(cnt);
    if (rc) {
        sq_rollback(q);
        return rc;
    }
    return sq_commit(q, err);
}

static int sq_results_scan(struct jobs_backend *b, const struct jobs_batch_rec *r, jobs_result_fn fn, void *ctx,
                           char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, "SELECT idx, result, is_error FROM lines WHERE batch_id = ?1 AND state = 2 ORDER BY idx",
                     err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_STATIC);
    int s;
    while (!rc && (s = sqlite3_step(st)) == SQLITE_ROW) {
        const char *text = (const char *)sqlite3_column_text(st, 1);
        int len = sqlite3_column_bytes(st, 1);
        rc = fn(ctx, sqlite3_column_int64(st, 0), text ? text : "", (size_t)len, sqlite3_column_int(st, 2) != 0);
    }
    if (!rc && s != SQLITE_DONE)
        rc = sq_fail(q, s, "reading results", err);
    sqlite3_finalize(st);
    return rc;
}

static int sq_stats(struct jobs_backend *b, struct jobs_stats *out, char *err)
{
    struct sq_backend *q = (struct sq_backend *)b;
    sqlite3_stmt *st;
    int rc = sq_prep(q, &st, "SELECT status, count(*) FROM batches GROUP BY status", err);
    if (rc)
        return rc;
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        int k = jobs_status_parse((const char *)sqlite3_column_text(st, 0));
        if (k >= 0)
            out->batches[k] = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    if (s != SQLITE_DONE)
        return sq_fail(q, s, "counting batches", err);
    return sq_count(q,
                    "SELECT count(*) FROM lines WHERE state = 0 AND batch_id IN "
                    "(SELECT id FROM batches WHERE status = 'in_progress')",
                    NULL, &out->queue_lines, err);
}

static const struct jobs_backend_ops sq_ops = {
    .close = sq_close,
    .file_write_begin = sq_file_write_begin,
    .file_write = sq_file_write,
    .file_write_end = sq_file_write_end,
    .file_discard = sq_file_discard,
    .file_publish = sq_file_publish,
    .file_get = sq_file_get,
    .file_list = sq_file_list,
    .file_read = sq_file_read,
    .file_delete = sq_file_delete,
    .batch_insert = sq_batch_insert,
    .batch_get = sq_batch_get,
    .batch_list = sq_batch_list,
    .batch_active = sq_batch_active,
    .batch_transition = sq_batch_transition,
    .batch_end = sq_batch_end,
    .batch_inflight = sq_batch_inflight,
    .finalize_lock = sq_finalize_lock,
    .lines_claim = sq_lines_claim,
    .lines_commit = sq_lines_commit,
    .lines_renew = sq_lines_renew,
    .lines_release = sq_lines_release,
    .results_fill = sq_results_fill,
    .results_scan = sq_results_scan,
    .stats = sq_stats,
};
