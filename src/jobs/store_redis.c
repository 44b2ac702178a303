/*
 * store_redis: the job store in Redis, shared by any number of wafer processes on any number of hosts.
 *
 * Keys (all under "wafer:"):
 *   seq                         counter that orders files and batches
 *   file:<id>                   hash: the file's metadata          file:<id>:data   string: its bytes
 *   files                       zset seq -> file id (published files)
 *   batch:<id>                  hash: every field of the batch object, counts, final_status, error
 *   batches, active             zsets seq -> batch id: all batches, and those not yet in a final status
 *   batch:<id>:lines            stream, one entry per line (id "0-<idx+1>", fields i, c, b), consumer group "wafer"
 *   batch:<id>:results          hash idx -> "o<output line>" or "e<error line>"
 *   batch:<id>:finalizer        lock (owner's consumer name, with a lease) of the one finalizing the batch
 *   status                      hash status -> number of batches in it (wafer_batches{status})
 *
 * Lines are handed out with XREADGROUP; a worker renews its lease on each running line (XCLAIM of its own entry,
 * which resets the idle time; done in a script that first checks the entry is still its own), and XAUTOCLAIM
 * gives lines idle for longer than the lease to another worker. A result is written by a script that does
 * HSETNX on the line's index, counts it only when it was the first, and XACKs, all at once: a line computed
 * twice still appears once, and the counts always equal the results. Status changes are compare-and-set
 * scripts; the batch's creation and its end (status, files published, stream dropped) are single scripts too,
 * so a worker dying between two calls leaves nothing half-done that the next one cannot redo. What is written
 * but never published (a file's bytes, a batch's stream while it is being filled) carries an expiry that the
 * publishing script removes.
 *
 * The connection is re-established on demand: while Redis is unreachable every call fails with
 * ERR_UNAVAILABLE and a message naming the server, and the runner waits.
 */
#include "jobs/store.h"

#include "core/err.h"
#include "core/redis_url.h"

#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RD_GROUP "wafer"
#define RD_ORPHAN_TTL 86400   /* seconds an unpublished file or stream survives */
#define RD_CHUNK 1000         /* lines per pipelined round trip */
#define RD_APPEND_BYTES (8u << 20)
#define RD_CURSORS 32         /* batches whose XAUTOCLAIM scan position is remembered */

struct rd_backend {
    struct jobs_backend base;
    redisContext *c;
    char host[256];
    int port, db;
    char user[128], password[256];
    char consumer[128];
    int lease_ms;
    bool down; /* the last call could not reach Redis (so the next success is worth a log line) */
    /* where the last XAUTOCLAIM of a batch stopped: each call scans a bounded part of the pending list, so
     * starting at the head every time would never reach stale entries behind many live ones */
    struct {
        char batch[JOBS_ID_MAX];
        char cursor[48];
    } cursors[RD_CURSORS];
    int next_cursor;
};

struct rd_writer {
    char key[JOBS_ID_MAX + 32];
    int64_t bytes;
};

/* ---- scripts ---- */

/* KEYS batch, status, active, lines, results. ARGV to, ",from1,from2,", now, final_status, error_code,
 * error_message, id. Returns {applied, old status}. */
static const char rd_lua_transition[] =
    "local cur = redis.call('HGET', KEYS[1], 'status')\n"
    "if not cur then return {-1, ''} end\n"
    "if not string.find(ARGV[2], ',' .. cur .. ',', 1, true) then return {0, cur} end\n"
    "redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[3])\n"
    "if ARGV[1] == 'finalizing' then redis.call('HSET', KEYS[1], 'final_status', ARGV[4]) end\n"
    "if ARGV[1] == 'failed' then\n"
    "  redis.call('HSET', KEYS[1], 'error_code', ARGV[5], 'error_message', ARGV[6])\n"
    "  redis.call('ZREM', KEYS[3], ARGV[7])\n"
    "  redis.call('DEL', KEYS[4], KEYS[5])\n"
    "end\n"
    "redis.call('HINCRBY', KEYS[2], cur, -1)\n"
    "redis.call('HINCRBY', KEYS[2], ARGV[1], 1)\n"
    "return {1, cur}\n";

/* KEYS batch, status, active, lines, results, finalizer, files, [out hash, out data], [err hash, err data].
 * ARGV to, now, n_files, then per file: id, bytes, created_at, filename, purpose, seq, field name. */
static const char rd_lua_end[] =
    "if redis.call('HGET', KEYS[1], 'status') ~= 'finalizing' then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])\n"
    "local k = 8\n"
    "for f = 0, tonumber(ARGV[3]) - 1 do\n"
    "  local a = 4 + f * 7\n"
    "  redis.call('HSET', KEYS[k], 'id', ARGV[a], 'bytes', ARGV[a+1], 'created_at', ARGV[a+2],\n"
    "             'filename', ARGV[a+3], 'purpose', ARGV[a+4], 'seq', ARGV[a+5])\n"
    "  redis.call('PERSIST', KEYS[k+1])\n"
    "  redis.call('ZADD', KEYS[7], ARGV[a+5], ARGV[a])\n"
    "  redis.call('HSET', KEYS[1], ARGV[a+6], ARGV[a])\n"
    "  k = k + 2\n"
    "end\n"
    "redis.call('ZREM', KEYS[3], redis.call('HGET', KEYS[1], 'id'))\n"
    "redis.call('HINCRBY', KEYS[2], 'finalizing', -1)\n"
    "redis.call('HINCRBY', KEYS[2], ARGV[1], 1)\n"
    "redis.call('DEL', KEYS[4], KEYS[5], KEYS[6])\n"
    "return 1\n";

/* KEYS batch, batches, active, status, lines. ARGV id, seq, then field/value pairs. */
static const char rd_lua_create[] =
    "redis.call('HSET', KEYS[1], unpack(ARGV, 3))\n"
    "redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])\n"
    "redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])\n"
    "redis.call('HINCRBY', KEYS[4], 'in_progress', 1)\n"
    "redis.call('PERSIST', KEYS[5])\n"
    "return 1\n";

/* KEYS results, batch, lines. ARGV idx, value, "completed"|"failed", entry id. Returns 1 when the result was
 * the line's first. */
static const char rd_lua_commit[] =
    "local st = redis.call('HGET', KEYS[2], 'status')\n"
    "local applied = 0\n"
    "if (st == 'in_progress' or st == 'cancelling') and redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then\n"
    "  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)\n"
    "  applied = 1\n"
    "end\n"
    "if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('XACK', KEYS[3], '" RD_GROUP "', ARGV[4]) end\n"
    "return applied\n";

/* KEYS lines. ARGV consumer, entry id. 1: renewed; 0: the entry is no longer ours. */
static const char rd_lua_renew[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "local p = redis.call('XPENDING', KEYS[1], '" RD_GROUP "', ARGV[2], ARGV[2], 1)\n"
    "if #p == 0 or p[1][2] ~= ARGV[1] then return 0 end\n"
    "redis.call('XCLAIM', KEYS[1], '" RD_GROUP "', ARGV[1], 0, ARGV[2], 'JUSTID')\n"
    "return 1\n";

/* KEYS results, batch. ARGV idx, value, idx, value, ... Returns how many were new. */
static const char rd_lua_fill[] =
    "local added = 0\n"
    "for i = 1, #ARGV, 2 do\n"
    "  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i+1]) == 1 then added = added + 1 end\n"
    "end\n"
    "if added > 0 then redis.call('HINCRBY', KEYS[2], 'failed', added) end\n"
    "return added\n";

/* KEYS lock. ARGV owner, ms. 1: we hold it now. */
static const char rd_lua_lock[] =
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur and cur ~= ARGV[1] then return 0 end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return 1\n";

/* KEYS file hash, data, files. ARGV id, bytes, created_at, filename, purpose, seq. */
static const char rd_lua_publish[] =
    "redis.call('HSET', KEYS[1], 'id', ARGV[1], 'bytes', ARGV[2], 'created_at', ARGV[3], 'filename', ARGV[4],\n"
    "           'purpose', ARGV[5], 'seq', ARGV[6])\n"
    "redis.call('PERSIST', KEYS[2])\n"
    "redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])\n"
    "return 1\n";

/* KEYS file hash, data, files. ARGV id. */
static const char rd_lua_delete[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "redis.call('DEL', KEYS[1], KEYS[2])\n"
    "redis.call('ZREM', KEYS[3], ARGV[1])\n"
    "return 1\n";

/* ---- argv builder (binary safe, for scripts with many arguments) ---- */

struct rd_argv {
    int n, cap;
    const char **v;
    size_t *len;
    char **own; /* formatted numbers, freed with the argv */
    bool oom;
};

static void rd_argv_add(struct rd_argv *a, const char *p, size_t len, char *own)
{
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        const char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (v)
            a->v = v;
        size_t *l = v ? realloc(a->len, (size_t)cap * sizeof *l) : NULL;
        if (l)
            a->len = l;
        char **o = l ? realloc(a->own, (size_t)cap * sizeof *o) : NULL;
        if (o)
            a->own = o;
        if (!o) {
            a->oom = true;
            free(own);
            return;
        }
        a->cap = cap;
    }
    a->v[a->n] = p;
    a->len[a->n] = len;
    a->own[a->n] = own;
    a->n++;
}

static void rd_argv_str(struct rd_argv *a, const char *s) { rd_argv_add(a, s, strlen(s), NULL); }

static void rd_argv_fmt(struct rd_argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rd_argv_fmt(struct rd_argv *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        a->oom = true;
        return;
    }
    rd_argv_add(a, s, (size_t)n, s);
}

static void rd_argv_free(struct rd_argv *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->own[i]);
    free(a->v);
    free(a->len);
    free(a->own);
    memset(a, 0, sizeof *a);
}

/* ---- connection and calls ---- */

static int rd_down(struct rd_backend *b, const char *why_in, char *err)
{
    char why[160]; /* why_in may point into the context freed below */
    snprintf(why, sizeof why, "%s", why_in && *why_in ? why_in : "connection lost");
    if (b->c) {
        redisFree(b->c);
        b->c = NULL;
    }
    b->down = true;
    return err_set(err, ERR_UNAVAILABLE, "Redis at %s:%d is unreachable (%s)", b->host, b->port, why);
}

static int rd_connect(struct rd_backend *b, char *err)
{
    if (b->c)
        return 0;
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(b->host, b->port, tv);
    if (!c)
        return rd_down(b, "out of memory", err);
    if (c->err) {
        char why[160];
        snprintf(why, sizeof why, "%s", c->errstr);
        redisFree(c);
        return rd_down(b, why, err);
    }
    struct timeval io = {10, 0};
    redisSetTimeout(c, io);
    b->c = c;
    redisReply *r = NULL;
    if (b->password[0]) {
        r = b->user[0] ? redisCommand(c, "AUTH %s %s", b->user, b->password) : redisCommand(c, "AUTH %s", b->password);
        if (!r)
            return rd_down(b, c->errstr, err);
        bool bad = r->type == REDIS_REPLY_ERROR;
        char msg[160];
        snprintf(msg, sizeof msg, "%s", bad ? r->str : "");
        freeReplyObject(r);
        if (bad) {
            redisFree(b->c);
            b->c = NULL;
            return err_set(err, ERR_UNAVAILABLE, "Redis at %s:%d refused the password in the queue URL: %s", b->host,
                           b->port, msg);
        }
    }
    if (b->db) {
        r = redisCommand(c, "SELECT %d", b->db);
        if (!r)
            return rd_down(b, c->errstr, err);
        bool bad = r->type == REDIS_REPLY_ERROR;
        char msg[160];
        snprintf(msg, sizeof msg, "%s", bad ? r->str : "");
        freeReplyObject(r);
        if (bad) {
            redisFree(b->c);
            b->c = NULL;
            return err_set(err, ERR_UNAVAILABLE, "Redis at %s:%d: cannot select database %d: %s", b->host, b->port,
                           b->db, msg);
        }
    }
    b->down = false;
    return 0;
}

/* Maps an error reply to a code. Frees r. */
static int rd_reply_error(struct rd_backend *b, redisReply *r, char *err)
{
    int code = ERR_IO;
    if (!strncmp(r->str, "OOM", 3) || !strncmp(r->str, "MISCONF", 7))
        code = ERR_NO_SPACE; /* out of memory, or it cannot write its persistence files (disk full) */
    else if (!strncmp(r->str, "LOADING", 7) || !strncmp(r->str, "BUSY ", 5) || !strncmp(r->str, "MASTERDOWN", 10))
        code = ERR_UNAVAILABLE;
    err_set(err, code, "Redis at %s:%d: %s", b->host, b->port, r->str);
    freeReplyObject(r);
    return code;
}

/* Takes a reply from redisCommand/redisGetReply: 0 with *out (caller frees), or a code (err filled). */
static int rd_take(struct rd_backend *b, redisReply *r, redisReply **out, char *err)
{
    *out = NULL;
    if (!r)
        return rd_down(b, b->c && b->c->errstr[0] ? b->c->errstr : "connection lost", err);
    if (r->type == REDIS_REPLY_ERROR)
        return rd_reply_error(b, r, err);
    *out = r;
    return 0;
}

static int rd_cmd(struct rd_backend *b, redisReply **out, char *err, const char *fmt, ...)
{
    *out = NULL;
    int rc = rd_connect(b, err);
    if (rc)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(b->c, fmt, ap);
    va_end(ap);
    return rd_take(b, r, out, err);
}

static int rd_cmd_argv(struct rd_backend *b, struct rd_argv *a, redisReply **out, char *err)
{
    *out = NULL;
    if (a->oom)
        return err_set(err, ERR_NOMEM, "out of memory building a Redis command");
    int rc = rd_connect(b, err);
    if (rc)
        return rc;
    redisReply *r = redisCommandArgv(b->c, a->n, a->v, a->len);
    return rd_take(b, r, out, err);
}

/* Runs a command whose reply does not matter. */
static int rd_do(struct rd_backend *b, char *err, const char *fmt, ...)
{
    int rc = rd_connect(b, err);
    if (rc)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(b->c, fmt, ap);
    va_end(ap);
    redisReply *out;
    rc = rd_take(b, r, &out, err);
    if (out)
        freeReplyObject(out);
    return rc;
}

/* Collects n pipelined replies; the first failure wins but every reply is read. out[i] may be NULL. */
static int rd_collect(struct rd_backend *b, int n, redisReply **out, char *err)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        void *r = NULL;
        if (!b->c || redisGetReply(b->c, &r) != REDIS_OK) {
            int e = rd_down(b, b->c && b->c->errstr[0] ? b->c->errstr : "connection lost", rc ? NULL : err);
            if (!rc)
                rc = e;
            for (int k = i + 1; k < n; k++)
                out[k] = NULL;
            return rc;
        }
        redisReply *rr = r;
        if (rr->type == REDIS_REPLY_ERROR) {
            int e = rd_reply_error(b, rr, rc ? NULL : err);
            if (!rc)
                rc = e;
            continue;
        }
        out[i] = rr;
    }
    return rc;
}

static void rd_free_replies(redisReply **r, int n)
{
    for (int i = 0; i < n; i++)
        if (r[i])
            freeReplyObject(r[i]);
}

static int64_t rd_ll(const redisReply *r)
{
    if (!r)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
        return strtoll(r->str, NULL, 10);
    return 0;
}

static int rd_seq(struct rd_backend *b, int64_t *seq, char *err)
{
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "INCR wafer:seq");
    if (!rc) {
        *seq = rd_ll(r);
        freeReplyObject(r);
    }
    return rc;
}

/* ---- URL and open ---- */

/* redis://[[user]:password@]HOST[:PORT][/DB], through the one parser (core/redis_url.h) */
static int rd_parse_url(struct rd_backend *b, const char *url, char *err)
{
    struct redis_url u;
    char e2[ERR_MSG_MAX];
    if (redis_url_parse(url, &u, e2))
        return err_set(err, ERR_INVALID_ARG, "queue %s", e2);
    snprintf(b->host, sizeof b->host, "%s", u.host);
    b->port = u.port;
    b->db = u.db;
    snprintf(b->user, sizeof b->user, "%s", u.user);
    snprintf(b->password, sizeof b->password, "%s", u.password);
    return 0;
}

static void rd_close(struct jobs_backend *base)
{
    struct rd_backend *b = (struct rd_backend *)base;
    if (b->c)
        redisFree(b->c);
    free(b);
}

static const struct jobs_backend_ops rd_ops;

struct jobs_backend *jobs_redis_open(const char *url, const char *consumer, int lease_ms, char *err)
{
    struct rd_backend *b = calloc(1, sizeof *b);
    if (!b) {
        err_set(err, ERR_NOMEM, "out of memory opening the job store");
        return NULL;
    }
    b->base.ops = &rd_ops;
    b->lease_ms = lease_ms;
    if (rd_parse_url(b, url, err))
        goto fail;
    if (consumer && *consumer) {
        snprintf(b->consumer, sizeof b->consumer, "%s", consumer);
    } else {
        char host[64] = "host", rnd[JOBS_ID_MAX];
        gethostname(host, sizeof host - 1);
        jobs_id_make(rnd, sizeof rnd, "");
        snprintf(b->consumer, sizeof b->consumer, "%s:%d:%.6s", host, (int)getpid(), rnd);
    }
    redisReply *r;
    if (rd_cmd(b, &r, err, "PING")) {
        size_t n = strlen(err);
        snprintf(err + n, ERR_MSG_MAX - n, "; start redis-server there, or correct the queue URL (--queue, jobs.queue)");
        goto fail;
    }
    freeReplyObject(r);
    return &b->base;
fail:
    rd_close(&b->base);
    return NULL;
}

/* ---- records ---- */

static const char *rd_field(const redisReply *h, const char *name)
{
    if (!h || h->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < h->elements; i += 2)
        if (h->element[i]->type == REDIS_REPLY_STRING && !strcmp(h->element[i]->str, name))
            return h->element[i + 1]->type == REDIS_REPLY_STRING ? h->element[i + 1]->str : NULL;
    return NULL;
}

static int64_t rd_field_ll(const redisReply *h, const char *name)
{
    const char *v = rd_field(h, name);
    return v ? strtoll(v, NULL, 10) : 0;
}

static void rd_copy(char *dst, size_t size, const char *src) { snprintf(dst, size, "%s", src ? src : ""); }

static bool rd_file_parse(const redisReply *h, struct jobs_file_rec *f)
{
    if (!h || h->type != REDIS_REPLY_ARRAY || h->elements == 0)
        return false;
    rd_copy(f->id, sizeof f->id, rd_field(h, "id"));
    f->bytes = rd_field_ll(h, "bytes");
    f->created_at = rd_field_ll(h, "created_at");
    rd_copy(f->filename, sizeof f->filename, rd_field(h, "filename"));
    rd_copy(f->purpose, sizeof f->purpose, rd_field(h, "purpose"));
    return true;
}

static bool rd_batch_parse(const redisReply *h, struct jobs_batch_rec *r)
{
    memset(r, 0, sizeof *r);
    if (!h || h->type != REDIS_REPLY_ARRAY || h->elements == 0)
        return false;
    rd_copy(r->id, sizeof r->id, rd_field(h, "id"));
    rd_copy(r->endpoint, sizeof r->endpoint, rd_field(h, "endpoint"));
    rd_copy(r->input_file_id, sizeof r->input_file_id, rd_field(h, "input_file_id"));
    rd_copy(r->completion_window, sizeof r->completion_window, rd_field(h, "completion_window"));
    int st = jobs_status_parse(rd_field(h, "status"));
    int fst = jobs_status_parse(rd_field(h, "final_status"));
    r->status = st < 0 ? JOBS_FAILED : (enum jobs_status)st;
    r->final_status = fst < 0 ? JOBS_COMPLETED : (enum jobs_status)fst;
    rd_copy(r->output_file_id, sizeof r->output_file_id, rd_field(h, "output_file_id"));
    rd_copy(r->error_file_id, sizeof r->error_file_id, rd_field(h, "error_file_id"));
    r->created_at = rd_field_ll(h, "created_at");
    r->expires_at = rd_field_ll(h, "expires_at");
    for (int s = 0; s < JOBS_STATUS_COUNT; s++) {
        char key[32];
        snprintf(key, sizeof key, "%s_at", jobs_status_name((enum jobs_status)s));
        r->at[s] = rd_field_ll(h, key);
    }
    r->total = rd_field_ll(h, "total");
    r->completed = rd_field_ll(h, "completed");
    r->failed = rd_field_ll(h, "failed");
    const char *m = rd_field(h, "metadata");
    r->metadata = m && *m ? strdup(m) : NULL;
    rd_copy(r->error_code, sizeof r->error_code, rd_field(h, "error_code"));
    rd_copy(r->error_message, sizeof r->error_message, rd_field(h, "error_message"));
    return r->id[0] != 0;
}

/* HGETALL of n batches, pipelined, into out[0..*got). Batches that vanished are skipped. */
static int rd_batches_load(struct rd_backend *b, redisReply *const *ids, int n, struct jobs_batch_rec *out, int *got,
                           char *err)
{
    *got = 0;
    if (n <= 0)
        return 0;
    int rc = rd_connect(b, err);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++)
        redisAppendCommand(b->c, "HGETALL wafer:batch:%s", ids[i]->str);
    redisReply **rep = calloc((size_t)n, sizeof *rep);
    if (!rep)
        return err_set(err, ERR_NOMEM, "out of memory reading batches");
    rc = rd_collect(b, n, rep, err);
    for (int i = 0; !rc && i < n; i++)
        if (rd_batch_parse(rep[i], &out[*got]))
            (*got)++;
        else
            jobs_batch_rec_deinit(&out[*got]);
    rd_free_replies(rep, n);
    free(rep);
    return rc;
}

/* ---- files ---- */

static int rd_file_write_begin(struct jobs_backend *base, const char *id, void **wp, char *err)
{
    struct rd_writer *w = calloc(1, sizeof *w);
    if (!w)
        return err_set(err, ERR_NOMEM, "out of memory writing a file");
    snprintf(w->key, sizeof w->key, "wafer:file:%s:data", id);
    *wp = w;
    return 0;
}

static int rd_file_write(struct jobs_backend *base, void *wp, const void *p, size_t n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    struct rd_writer *w = wp;
    const char *c = p;
    while (n) {
        size_t k = n > RD_APPEND_BYTES ? RD_APPEND_BYTES : n;
        int rc = rd_do(b, err, "APPEND %s %b", w->key, c, k);
        if (!rc && w->bytes == 0) /* not published yet: gone in a day unless published */
            rc = rd_do(b, err, "EXPIRE %s %d", w->key, RD_ORPHAN_TTL);
        if (rc)
            return rc;
        w->bytes += (int64_t)k;
        c += k;
        n -= k;
    }
    return 0;
}

static int rd_file_write_end(struct jobs_backend *base, void *wp, bool keep, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    struct rd_writer *w = wp;
    int rc = 0;
    if (!keep)
        rd_do(b, NULL, "DEL %s", w->key);
    free(w);
    return rc;
}

static void rd_file_discard(struct jobs_backend *base, const char *id)
{
    rd_do((struct rd_backend *)base, NULL, "DEL wafer:file:%s:data", id);
}

static int rd_file_publish(struct jobs_backend *base, const struct jobs_file_rec *f, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    int64_t seq;
    int rc = rd_seq(b, &seq, err);
    if (rc)
        return rc;
    char k1[JOBS_ID_MAX + 16], k2[JOBS_ID_MAX + 32];
    snprintf(k1, sizeof k1, "wafer:file:%s", f->id);
    snprintf(k2, sizeof k2, "wafer:file:%s:data", f->id);
    return rd_do(b, err, "EVAL %s 3 %s %s wafer:files %s %lld %lld %s %s %lld", rd_lua_publish, k1, k2, f->id,
                 (long long)f->bytes, (long long)f->created_at, f->filename, f->purpose, (long long)seq);
}

static int rd_file_get(struct jobs_backend *base, const char *id, struct jobs_file_rec *f, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "HGETALL wafer:file:%s", id);
    if (rc)
        return rc;
    bool ok = rd_file_parse(r, f);
    freeReplyObject(r);
    return ok ? 0 : err_set(err, ERR_NOT_FOUND, "No file with id '%.60s' exists.", id);
}

/* The score of member `after` in zset key, as the exclusive upper bound of a newest-first page. */
static int rd_after_bound(struct rd_backend *b, const char *key, const char *after, const char *what, char *bound,
                          size_t size, char *err)
{
    snprintf(bound, size, "+inf");
    if (!after || !*after)
        return 0;
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "ZSCORE %s %s", key, after);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return err_set(err, ERR_NOT_FOUND, "Invalid 'after': no %s with id '%.60s' exists.", what, after);
    }
    snprintf(bound, size, "(%s", r->str);
    freeReplyObject(r);
    return 0;
}

static int rd_file_list(struct jobs_backend *base, const char *purpose, const char *after, int max,
                        struct jobs_file_rec *out, int *n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *n = 0;
    char bound[64];
    int rc = rd_after_bound(b, "wafer:files", after, "file", bound, sizeof bound, err);
    /* page through newest first; with a purpose filter a page may hold fewer matches than it has files */
    while (!rc && *n < max) {
        redisReply *ids;
        rc = rd_cmd(b, &ids, err, "ZREVRANGEBYSCORE wafer:files %s -inf WITHSCORES LIMIT 0 %d", bound, 200);
        if (rc)
            break;
        size_t k = ids->elements / 2;
        if (k == 0) {
            freeReplyObject(ids);
            break;
        }
        rc = rd_connect(b, err);
        for (size_t i = 0; !rc && i < k; i++)
            redisAppendCommand(b->c, "HGETALL wafer:file:%s", ids->element[2 * i]->str);
        redisReply **rep = rc ? NULL : calloc(k, sizeof *rep);
        if (!rc && !rep)
            rc = err_set(err, ERR_NOMEM, "out of memory listing files");
        if (!rc)
            rc = rd_collect(b, (int)k, rep, err);
        for (size_t i = 0; !rc && i < k && *n < max; i++) {
            struct jobs_file_rec f;
            if (rd_file_parse(rep[i], &f) && (!purpose || !strcmp(f.purpose, purpose)))
                out[(*n)++] = f;
        }
        if (rep)
            rd_free_replies(rep, (int)k);
        free(rep);
        snprintf(bound, sizeof bound, "(%s", ids->element[2 * k - 1]->str);
        freeReplyObject(ids);
        if (k < 200)
            break;
    }
    return rc;
}

static int rd_file_read(struct jobs_backend *base, const char *id, char **data, size_t *len, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    struct jobs_file_rec f;
    int rc = rd_file_get(base, id, &f, err);
    if (rc)
        return rc;
    redisReply *r;
    rc = rd_cmd(b, &r, err, "GET wafer:file:%s:data", id);
    if (rc)
        return rc;
    size_t n = r->type == REDIS_REPLY_STRING ? r->len : 0;
    if ((int64_t)n != f.bytes) {
        freeReplyObject(r);
        return err_set(err, ERR_IO, "the content of file %s is %zu bytes in Redis, %lld recorded", id, n,
                       (long long)f.bytes);
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        freeReplyObject(r);
        return err_set(err, ERR_NOMEM, "out of memory reading file %s", id);
    }
    if (n)
        memcpy(buf, r->str, n);
    buf[n] = 0;
    freeReplyObject(r);
    *data = buf;
    *len = n;
    return 0;
}

static int rd_file_delete(struct jobs_backend *base, const char *id, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    char k1[JOBS_ID_MAX + 16], k2[JOBS_ID_MAX + 32];
    snprintf(k1, sizeof k1, "wafer:file:%s", id);
    snprintf(k2, sizeof k2, "wafer:file:%s:data", id);
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "EVAL %s 3 %s %s wafer:files %s", rd_lua_delete, k1, k2, id);
    if (rc)
        return rc;
    int64_t ok = rd_ll(r);
    freeReplyObject(r);
    return ok ? 0 : err_set(err, ERR_NOT_FOUND, "No file with id '%.60s' exists.", id);
}

/* ---- batches ---- */

static int rd_batch_insert(struct jobs_backend *base, const struct jobs_batch_rec *rec,
                           const struct jobs_input_line *lines, int64_t n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    char stream[JOBS_ID_MAX + 32];
    snprintf(stream, sizeof stream, "wafer:batch:%s:lines", rec->id);
    int rc = rd_do(b, err, "XGROUP CREATE %s " RD_GROUP " 0 MKSTREAM", stream);
    if (!rc)
        rc = rd_do(b, err, "EXPIRE %s %d", stream, RD_ORPHAN_TTL); /* until the batch is published below */
    /* explicit ids 0-<idx+1>: a retried creation cannot add a line twice */
    for (int64_t i = 0; !rc && i < n; i += RD_CHUNK) {
        int k = (int)(n - i < RD_CHUNK ? n - i : RD_CHUNK);
        rc = rd_connect(b, err);
        for (int j = 0; !rc && j < k; j++)
            redisAppendCommand(b->c, "XADD %s 0-%lld i %lld c %s b %s", stream, (long long)(i + j + 1),
                               (long long)(i + j), lines[i + j].custom_id, lines[i + j].body);
        redisReply *rep[RD_CHUNK];
        if (!rc) {
            rc = rd_collect(b, k, rep, err);
            rd_free_replies(rep, k);
        }
    }
    int64_t seq = 0;
    if (!rc)
        rc = rd_seq(b, &seq, err);
    if (rc)
        return rc;
    struct rd_argv a = {0};
    rd_argv_str(&a, "EVAL");
    rd_argv_str(&a, rd_lua_create);
    rd_argv_str(&a, "5");
    char kb[JOBS_ID_MAX + 16];
    snprintf(kb, sizeof kb, "wafer:batch:%s", rec->id);
    rd_argv_str(&a, kb);
    rd_argv_str(&a, "wafer:batches");
    rd_argv_str(&a, "wafer:active");
    rd_argv_str(&a, "wafer:status");
    rd_argv_str(&a, stream);
    rd_argv_str(&a, rec->id);
    rd_argv_fmt(&a, "%lld", (long long)seq);
    const char *sfields[][2] = {{"id", rec->id},
                                {"endpoint", rec->endpoint},
                                {"input_file_id", rec->input_file_id},
                                {"completion_window", rec->completion_window},
                                {"status", jobs_status_name(rec->status)},
                                {"final_status", jobs_status_name(rec->final_status)},
                                {"metadata", rec->metadata ? rec->metadata : ""}};
    for (size_t i = 0; i < sizeof sfields / sizeof sfields[0]; i++) {
        rd_argv_str(&a, sfields[i][0]);
        rd_argv_str(&a, sfields[i][1]);
    }
    rd_argv_str(&a, "created_at");
    rd_argv_fmt(&a, "%lld", (long long)rec->created_at);
    rd_argv_str(&a, "expires_at");
    rd_argv_fmt(&a, "%lld", (long long)rec->expires_at);
    rd_argv_str(&a, "in_progress_at");
    rd_argv_fmt(&a, "%lld", (long long)rec->at[JOBS_IN_PROGRESS]);
    rd_argv_str(&a, "total");
    rd_argv_fmt(&a, "%lld", (long long)rec->total);
    rd_argv_str(&a, "completed");
    rd_argv_str(&a, "0");
    rd_argv_str(&a, "failed");
    rd_argv_str(&a, "0");
    rd_argv_str(&a, "seq");
    rd_argv_fmt(&a, "%lld", (long long)seq);
    redisReply *r;
    rc = rd_cmd_argv(b, &a, &r, err);
    rd_argv_free(&a);
    if (r)
        freeReplyObject(r);
    return rc;
}

static int rd_batch_get(struct jobs_backend *base, const char *id, struct jobs_batch_rec *out, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "HGETALL wafer:batch:%s", id);
    if (rc)
        return rc;
    bool ok = rd_batch_parse(r, out);
    freeReplyObject(r);
    return ok ? 0 : err_set(err, ERR_NOT_FOUND, "No batch with id '%.60s' exists.", id);
}

static int rd_batch_list(struct jobs_backend *base, const char *after, int max, struct jobs_batch_rec *out, int *n,
                         char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *n = 0;
    char bound[64];
    int rc = rd_after_bound(b, "wafer:batches", after, "batch", bound, sizeof bound, err);
    if (rc)
        return rc;
    redisReply *ids;
    rc = rd_cmd(b, &ids, err, "ZREVRANGEBYSCORE wafer:batches %s -inf LIMIT 0 %d", bound, max);
    if (rc)
        return rc;
    rc = rd_batches_load(b, (redisReply *const *)ids->element, (int)ids->elements, out, n, err);
    freeReplyObject(ids);
    return rc;
}

static int rd_batch_active(struct jobs_backend *base, struct jobs_batch_rec **out, int *n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *out = NULL;
    *n = 0;
    redisReply *ids;
    int rc = rd_cmd(b, &ids, err, "ZRANGE wafer:active 0 -1");
    if (rc)
        return rc;
    if (ids->elements) {
        *out = calloc(ids->elements, sizeof **out);
        rc = *out ? rd_batches_load(b, (redisReply *const *)ids->element, (int)ids->elements, *out, n, err)
                  : err_set(err, ERR_NOMEM, "out of memory listing batches");
    }
    freeReplyObject(ids);
    return rc;
}

static int rd_batch_transition(struct jobs_backend *base, const char *id, unsigned from_mask, enum jobs_status to,
                               enum jobs_status final_status, int64_t now, const char *error_code,
                               const char *error_message, bool *applied, enum jobs_status *old, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *applied = false;
    char from[160] = ",";
    for (int s = 0; s < JOBS_STATUS_COUNT; s++)
        if (from_mask & JOBS_STATUS_BIT(s)) {
            strcat(from, jobs_status_name((enum jobs_status)s));
            strcat(from, ",");
        }
    char kb[JOBS_ID_MAX + 16], kl[JOBS_ID_MAX + 32], kr[JOBS_ID_MAX + 32];
    snprintf(kb, sizeof kb, "wafer:batch:%s", id);
    snprintf(kl, sizeof kl, "wafer:batch:%s:lines", id);
    snprintf(kr, sizeof kr, "wafer:batch:%s:results", id);
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "EVAL %s 5 %s wafer:status wafer:active %s %s %s %s %lld %s %s %s %s",
                    rd_lua_transition, kb, kl, kr, jobs_status_name(to), from, (long long)now,
                    jobs_status_name(final_status), error_code ? error_code : "", error_message ? error_message : "",
                    id);
    if (rc)
        return rc;
    int64_t res = r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? rd_ll(r->element[0]) : -1;
    int cur = r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING
                  ? jobs_status_parse(r->element[1]->str)
                  : -1;
    freeReplyObject(r);
    if (res < 0)
        return err_set(err, ERR_NOT_FOUND, "No batch with id '%.60s' exists.", id);
    *applied = res == 1;
    if (old)
        *old = cur < 0 ? JOBS_FAILED : (enum jobs_status)cur;
    return 0;
}

static int rd_batch_end(struct jobs_backend *base, const char *id, enum jobs_status to, const struct jobs_file_rec *out,
                        const struct jobs_file_rec *errf, int64_t now, bool *applied, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *applied = false;
    const struct jobs_file_rec *files[2] = {out, errf};
    const char *fields[2] = {"output_file_id", "error_file_id"};
    int64_t seq[2] = {0, 0};
    int nf = 0;
    for (int k = 0; k < 2; k++)
        if (files[k]) {
            int rc = rd_seq(b, &seq[k], err);
            if (rc)
                return rc;
            nf++;
        }
    struct rd_argv a = {0};
    char kb[JOBS_ID_MAX + 16], kl[JOBS_ID_MAX + 32], kr[JOBS_ID_MAX + 32], kf[JOBS_ID_MAX + 32];
    char fh[2][JOBS_ID_MAX + 16], fd[2][JOBS_ID_MAX + 32];
    snprintf(kb, sizeof kb, "wafer:batch:%s", id);
    snprintf(kl, sizeof kl, "wafer:batch:%s:lines", id);
    snprintf(kr, sizeof kr, "wafer:batch:%s:results", id);
    snprintf(kf, sizeof kf, "wafer:batch:%s:finalizer", id);
    rd_argv_str(&a, "EVAL");
    rd_argv_str(&a, rd_lua_end);
    rd_argv_fmt(&a, "%d", 7 + 2 * nf);
    rd_argv_str(&a, kb);
    rd_argv_str(&a, "wafer:status");
    rd_argv_str(&a, "wafer:active");
    rd_argv_str(&a, kl);
    rd_argv_str(&a, kr);
    rd_argv_str(&a, kf);
    rd_argv_str(&a, "wafer:files");
    for (int k = 0; k < 2; k++)
        if (files[k]) {
            snprintf(fh[k], sizeof fh[k], "wafer:file:%s", files[k]->id);
            snprintf(fd[k], sizeof fd[k], "wafer:file:%s:data", files[k]->id);
            rd_argv_str(&a, fh[k]);
            rd_argv_str(&a, fd[k]);
        }
    rd_argv_str(&a, jobs_status_name(to));
    rd_argv_fmt(&a, "%lld", (long long)now);
    rd_argv_fmt(&a, "%d", nf);
    for (int k = 0; k < 2; k++)
        if (files[k]) {
            rd_argv_str(&a, files[k]->id);
            rd_argv_fmt(&a, "%lld", (long long)files[k]->bytes);
            rd_argv_fmt(&a, "%lld", (long long)files[k]->created_at);
            rd_argv_str(&a, files[k]->filename);
            rd_argv_str(&a, files[k]->purpose);
            rd_argv_fmt(&a, "%lld", (long long)seq[k]);
            rd_argv_str(&a, fields[k]);
        }
    redisReply *r;
    int rc = rd_cmd_argv(b, &a, &r, err);
    rd_argv_free(&a);
    if (rc)
        return rc;
    *applied = rd_ll(r) == 1;
    freeReplyObject(r);
    return 0;
}

static int rd_batch_inflight(struct jobs_backend *base, const char *id, int64_t *n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *n = 0;
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "EXISTS wafer:batch:%s:lines", id);
    if (rc)
        return rc;
    bool exists = rd_ll(r) == 1;
    freeReplyObject(r);
    if (!exists)
        return 0;
    /* held = pending and renewed within the lease; entries of a dead worker do not hold a cancel back */
    rc = rd_cmd(b, &r, err, "XPENDING wafer:batch:%s:lines " RD_GROUP " - + 10000", id);
    if (rc)
        return rc;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_ARRAY && e->elements >= 3 && rd_ll(e->element[2]) < b->lease_ms)
            (*n)++;
    }
    freeReplyObject(r);
    return 0;
}

static int rd_finalize_lock(struct jobs_backend *base, const char *id, bool *owner, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "EVAL %s 1 wafer:batch:%s:finalizer %s %d", rd_lua_lock, id, b->consumer,
                    b->lease_ms * 4);
    if (rc)
        return rc;
    *owner = rd_ll(r) == 1;
    freeReplyObject(r);
    return 0;
}

/* ---- lines ---- */

static char *rd_cursor(struct rd_backend *b, const char *batch_id)
{
    for (int i = 0; i < RD_CURSORS; i++)
        if (!strcmp(b->cursors[i].batch, batch_id))
            return b->cursors[i].cursor;
    int i = b->next_cursor++ % RD_CURSORS; /* forget the oldest */
    snprintf(b->cursors[i].batch, sizeof b->cursors[i].batch, "%s", batch_id);
    snprintf(b->cursors[i].cursor, sizeof b->cursors[i].cursor, "0-0");
    return b->cursors[i].cursor;
}

/* Appends the entries of a stream reply ([[id, [f, v, ...]], ...]) as claimed lines. */
static int rd_lines_take(const redisReply *entries, const char *batch_id, const char *endpoint, bool reclaimed,
                         struct jobs_line *out, int max, int *n, char *err)
{
    for (size_t i = 0; entries && entries->type == REDIS_REPLY_ARRAY && i < entries->elements && *n < max; i++) {
        const redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[1]->type != REDIS_REPLY_ARRAY)
            continue; /* an entry deleted meanwhile */
        const redisReply *f = e->element[1];
        const char *idx = rd_field(f, "i"), *cid = rd_field(f, "c"), *body = rd_field(f, "b");
        if (!idx || !cid || !body)
            continue;
        struct jobs_line *l = &out[*n];
        memset(l, 0, sizeof *l);
        rd_copy(l->batch_id, sizeof l->batch_id, batch_id);
        rd_copy(l->endpoint, sizeof l->endpoint, endpoint);
        rd_copy(l->entry, sizeof l->entry, e->element[0]->str);
        l->idx = strtoll(idx, NULL, 10);
        l->custom_id = strdup(cid);
        l->body = strdup(body);
        l->reclaimed = reclaimed;
        (*n)++;
        if (!l->custom_id || !l->body)
            return err_set(err, ERR_NOMEM, "out of memory claiming lines");
    }
    return 0;
}

static int rd_lines_claim(struct jobs_backend *base, struct jobs_line *out, int max, int *n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    *n = 0;
    redisReply *ids;
    int rc = rd_cmd(b, &ids, err, "ZRANGE wafer:active 0 -1");
    if (rc)
        return rc;
    for (size_t i = 0; !rc && i < ids->elements && *n < max; i++) {
        const char *id = ids->element[i]->str;
        redisReply *h;
        rc = rd_cmd(b, &h, err, "HMGET wafer:batch:%s status endpoint", id);
        if (rc)
            break;
        bool running = h->elements == 2 && h->element[0]->type == REDIS_REPLY_STRING &&
                       !strcmp(h->element[0]->str, "in_progress") && h->element[1]->type == REDIS_REPLY_STRING;
        char endpoint[32] = "";
        if (running)
            rd_copy(endpoint, sizeof endpoint, h->element[1]->str);
        freeReplyObject(h);
        if (!running)
            continue;
        /* first the lines of workers that stopped renewing, then new ones */
        redisReply *r;
        char *cursor = rd_cursor(b, id);
        rc = rd_cmd(b, &r, err, "XAUTOCLAIM wafer:batch:%s:lines " RD_GROUP " %s %d %s COUNT %d", id, b->consumer,
                    b->lease_ms, cursor, max - *n);
        if (!rc) {
            if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2) {
                if (r->element[0]->type == REDIS_REPLY_STRING) /* "0-0" once the scan went round */
                    snprintf(cursor, 48, "%s", r->element[0]->str);
                rc = rd_lines_take(r->element[1], id, endpoint, true, out, max, n, err);
            }
            freeReplyObject(r);
        }
        if (!rc && *n < max) {
            rc = rd_cmd(b, &r, err, "XREADGROUP GROUP " RD_GROUP " %s COUNT %d STREAMS wafer:batch:%s:lines >",
                        b->consumer, max - *n, id);
            if (!rc) {
                /* [[stream, [entries]]] or nil */
                if (r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0]->type == REDIS_REPLY_ARRAY &&
                    r->element[0]->elements >= 2)
                    rc = rd_lines_take(r->element[0]->element[1], id, endpoint, false, out, max, n, err);
                freeReplyObject(r);
            }
        }
        if (rc && strstr(err ? err : "", "NOGROUP")) /* the batch ended between the two reads */
            rc = 0;
    }
    freeReplyObject(ids);
    if (rc) {
        /* what was claimed stays pending under our name and returns to another worker after the lease */
        for (int i = 0; i < *n; i++)
            jobs_line_deinit(&out[i]);
        *n = 0;
    }
    return rc;
}

static int rd_lines_commit(struct jobs_backend *base, const struct jobs_result *res, int n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    for (int i0 = 0; i0 < n; i0 += RD_CHUNK) {
        int k = n - i0 < RD_CHUNK ? n - i0 : RD_CHUNK;
        int rc = rd_connect(b, err);
        if (rc)
            return rc;
        for (int j = 0; j < k; j++) {
            const struct jobs_result *r = &res[i0 + j];
            const char *id = r->line->batch_id;
            char kr[JOBS_ID_MAX + 32], kb[JOBS_ID_MAX + 16], kl[JOBS_ID_MAX + 32], idx[24];
            snprintf(kr, sizeof kr, "wafer:batch:%s:results", id);
            snprintf(kb, sizeof kb, "wafer:batch:%s", id);
            snprintf(kl, sizeof kl, "wafer:batch:%s:lines", id);
            snprintf(idx, sizeof idx, "%lld", (long long)r->line->idx);
            redisAppendCommand(b->c, "EVAL %s 3 %s %s %s %s %s%s %s %s", rd_lua_commit, kr, kb, kl, idx,
                               r->is_error ? "e" : "o", r->text, r->is_error ? "failed" : "completed", r->line->entry);
        }
        redisReply *rep[RD_CHUNK];
        rc = rd_collect(b, k, rep, err);
        rd_free_replies(rep, k);
        if (rc)
            return rc; /* each script is atomic: a retry commits what is missing and leaves the rest */
    }
    return 0;
}

static int rd_lines_renew(struct jobs_backend *base, const struct jobs_line *lines, int n, bool *lost, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    if (n <= 0)
        return 0;
    int rc = rd_connect(b, err);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++)
        redisAppendCommand(b->c, "EVAL %s 1 wafer:batch:%s:lines %s %s", rd_lua_renew, lines[i].batch_id, b->consumer,
                           lines[i].entry);
    redisReply **rep = calloc((size_t)n, sizeof *rep);
    if (!rep)
        return err_set(err, ERR_NOMEM, "out of memory renewing leases");
    rc = rd_collect(b, n, rep, err);
    for (int i = 0; !rc && lost && i < n; i++)
        lost[i] = rd_ll(rep[i]) != 1;
    rd_free_replies(rep, n);
    free(rep);
    return rc;
}

static int rd_lines_release(struct jobs_backend *base, const struct jobs_line *lines, int n, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    if (n <= 0)
        return 0;
    int rc = rd_connect(b, err);
    if (rc)
        return rc;
    /* an idle time past the lease: the next XAUTOCLAIM of any worker takes them */
    for (int i = 0; i < n; i++)
        redisAppendCommand(b->c, "XCLAIM wafer:batch:%s:lines " RD_GROUP " %s 0 %s IDLE %lld JUSTID", lines[i].batch_id,
                           b->consumer, lines[i].entry, (long long)b->lease_ms * 10);
    redisReply **rep = calloc((size_t)n, sizeof *rep);
    if (!rep)
        return err_set(err, ERR_NOMEM, "out of memory releasing lines");
    rc = rd_collect(b, n, rep, err);
    rd_free_replies(rep, n);
    free(rep);
    return rc;
}

static int rd_results_fill(struct jobs_backend *base, const struct jobs_batch_rec *rec, const char *code,
                           const char *message, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    char kr[JOBS_ID_MAX + 32], kb[JOBS_ID_MAX + 16];
    snprintf(kr, sizeof kr, "wafer:batch:%s:results", rec->id);
    snprintf(kb, sizeof kb, "wafer:batch:%s", rec->id);
    char start[48] = "-";
    int rc = 0;
    for (;;) {
        redisReply *r;
        rc = rd_cmd(b, &r, err, "XRANGE wafer:batch:%s:lines %s + COUNT %d", rec->id, start, RD_CHUNK);
        if (rc)
            break;
        if (r->elements == 0) {
            freeReplyObject(r);
            break;
        }
        /* which of these lines still lack a result */
        rc = rd_connect(b, err);
        for (size_t i = 0; !rc && i < r->elements; i++) {
            const char *idx = rd_field(r->element[i]->element[1], "i");
            redisAppendCommand(b->c, "HEXISTS %s %s", kr, idx ? idx : "-1");
        }
        redisReply **ex = rc ? NULL : calloc(r->elements, sizeof *ex);
        if (!rc && !ex)
            rc = err_set(err, ERR_NOMEM, "out of memory finalizing batch %s", rec->id);
        if (!rc)
            rc = rd_collect(b, (int)r->elements, ex, err);
        struct rd_argv a = {0};
        rd_argv_str(&a, "EVAL");
        rd_argv_str(&a, rd_lua_fill);
        rd_argv_str(&a, "2");
        rd_argv_str(&a, kr);
        rd_argv_str(&a, kb);
        int missing = 0;
        for (size_t i = 0; !rc && i < r->elements; i++) {
            const redisReply *f = r->element[i]->element[1];
            const char *idx = rd_field(f, "i"), *cid = rd_field(f, "c");
            if (!idx || !cid || rd_ll(ex[i]) == 1)
                continue;
            char *text = jobs_result_error_text(rec->id, strtoll(idx, NULL, 10), cid, code, message);
            if (!text) {
                rc = err_set(err, ERR_NOMEM, "out of memory finalizing batch %s", rec->id);
                break;
            }
            rd_argv_str(&a, idx);
            rd_argv_fmt(&a, "e%s", text);
            free(text);
            missing++;
        }
        if (!rc && missing) {
            redisReply *fr;
            rc = rd_cmd_argv(b, &a, &fr, err);
            if (fr)
                freeReplyObject(fr);
        }
        rd_argv_free(&a);
        if (ex)
            rd_free_replies(ex, (int)r->elements);
        free(ex);
        snprintf(start, sizeof start, "(%s", r->element[r->elements - 1]->element[0]->str);
        size_t got = r->elements;
        freeReplyObject(r);
        if (rc || got < RD_CHUNK)
            break;
    }
    return rc;
}

static int rd_results_scan(struct jobs_backend *base, const struct jobs_batch_rec *rec, jobs_result_fn fn, void *ctx,
                           char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    int rc = 0;
    for (int64_t i0 = 0; !rc && i0 < rec->total; i0 += RD_CHUNK) {
        int k = (int)(rec->total - i0 < RD_CHUNK ? rec->total - i0 : RD_CHUNK);
        struct rd_argv a = {0};
        rd_argv_str(&a, "HMGET");
        rd_argv_fmt(&a, "wafer:batch:%s:results", rec->id);
        for (int j = 0; j < k; j++)
            rd_argv_fmt(&a, "%lld", (long long)(i0 + j));
        redisReply *r;
        rc = rd_cmd_argv(b, &a, &r, err);
        rd_argv_free(&a);
        if (rc)
            break;
        for (size_t j = 0; !rc && j < r->elements; j++) {
            const redisReply *v = r->element[j];
            if (v->type != REDIS_REPLY_STRING || v->len < 1)
                continue;
            rc = fn(ctx, i0 + (int64_t)j, v->str + 1, v->len - 1, v->str[0] == 'e');
        }
        freeReplyObject(r);
    }
    return rc;
}

static int rd_stats(struct jobs_backend *base, struct jobs_stats *out, char *err)
{
    struct rd_backend *b = (struct rd_backend *)base;
    redisReply *r;
    int rc = rd_cmd(b, &r, err, "HGETALL wafer:status");
    if (rc)
        return rc;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        int k = jobs_status_parse(r->element[i]->str);
        if (k >= 0)
            out->batches[k] = rd_ll(r->element[i + 1]);
    }
    freeReplyObject(r);
    /* waiting lines: not yet done and not held by a worker */
    struct jobs_batch_rec *act = NULL;
    int n = 0;
    rc = rd_batch_active(base, &act, &n, err);
    for (int i = 0; !rc && i < n; i++) {
        if (act[i].status != JOBS_IN_PROGRESS)
            continue;
        redisReply *p;
        rc = rd_cmd(b, &p, err, "XPENDING wafer:batch:%s:lines " RD_GROUP, act[i].id);
        if (rc && strstr(err ? err : "", "NOGROUP")) {
            rc = 0;
            continue;
        }
        if (rc)
            break;
        int64_t held = p->type == REDIS_REPLY_ARRAY && p->elements >= 1 ? rd_ll(p->element[0]) : 0;
        freeReplyObject(p);
        int64_t waiting = act[i].total - act[i].completed - act[i].failed - held;
        out->queue_lines += waiting > 0 ? waiting : 0;
    }
    jobs_batch_rec_free_array(act, n);
    return rc;
}

static const struct jobs_backend_ops rd_ops = {
    .close = rd_close,
    .file_write_begin = rd_file_write_begin,
    .file_write = rd_file_write,
    .file_write_end = rd_file_write_end,
    .file_discard = rd_file_discard,
    .file_publish = rd_file_publish,
    .file_get = rd_file_get,
    .file_list = rd_file_list,
    .file_read = rd_file_read,
    .file_delete = rd_file_delete,
    .batch_insert = rd_batch_insert,
    .batch_get = rd_batch_get,
    .batch_list = rd_batch_list,
    .batch_active = rd_batch_active,
    .batch_transition = rd_batch_transition,
    .batch_end = rd_batch_end,
    .batch_inflight = rd_batch_inflight,
    .finalize_lock = rd_finalize_lock,
    .lines_claim = rd_lines_claim,
    .lines_commit = rd_lines_commit,
    .lines_renew = rd_lines_renew,
    .lines_release = rd_lines_release,
    .results_fill = rd_results_fill,
    .results_scan = rd_results_scan,
    .stats = rd_stats,
};
