/*
 * route_rcache: hiredis's async context driven by the router's evloop (the adapter is the five ev hooks:
 * add/del read/write set the watcher's epoll events, cleanup removes it).
 *
 * Every command sent is a struct rcmd in a FIFO with its deadline (Redis answers in order); a lookup's
 * handle is its rcmd, a store's has no callback. One timer watches the oldest deadline, the connect
 * deadline and, while disconnected, the next reconnection. A command past its deadline, an error reply or a
 * lost connection drops the connection: hiredis then calls every pending reply callback with no reply, and
 * each waiting lookup completes as unavailable. While Redis is down (the last connection failed or was
 * dropped), lookups are not queued behind a connection attempt: they bypass the cache at once, until a
 * reconnection succeeds.
 */
#include "route/route_rcache.h"

#include "core/err.h"
#include "core/log.h"
#include "core/redis_url.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#define RC_RECONNECT_MS 1000
#define RC_MAX_PENDING 10000

struct route_rcache_get {
    struct route_rcache *c;
    route_rcache_fn fn; /* NULL: a store, or a cancelled lookup */
    void *arg;
    bool store;
    int64_t deadline;
    struct route_rcache_get *prev, *next;
};

struct route_rcache {
    struct evloop *l;
    struct redis_url u;
    char *prefix;
    size_t prefix_len;
    int64_t ttl_ms;
    int timeout_ms;
    int64_t max_value;

    redisAsyncContext *ac; /* NULL: disconnected */
    bool connected;        /* the connection of ac is established */
    bool down;             /* Redis is known to be unreachable (logged once) */
    int64_t connect_deadline;
    int64_t reconnect_at;
    struct ev_watch w;
    uint32_t want;
    struct ev_timer timer;
    struct route_rcache_get *head, *tail;
    int n_pending;
    struct route_rcache_stats st;
};

static void rc_arm(struct route_rcache *c);
static void rc_connect(struct route_rcache *c);

/* ---- the hiredis adapter ----------------------------------------------------------------------------- */

static void rc_update(struct route_rcache *c)
{
    if (!c->ac)
        return;
    c->w.fd = c->ac->c.fd;
    if (evloop_mod(c->l, &c->w, c->want))
        log_warn("route: cache: cannot watch the Redis connection");
}
static void rc_add_read(void *p)
{
    struct route_rcache *c = p;
    c->want |= EPOLLIN;
    rc_update(c);
}
static void rc_del_read(void *p)
{
    struct route_rcache *c = p;
    c->want &= ~(uint32_t)EPOLLIN;
    rc_update(c);
}
static void rc_add_write(void *p)
{
    struct route_rcache *c = p;
    c->want |= EPOLLOUT;
    rc_update(c);
}
static void rc_del_write(void *p)
{
    struct route_rcache *c = p;
    c->want &= ~(uint32_t)EPOLLOUT;
    rc_update(c);
}
static void rc_cleanup(void *p)
{
    struct route_rcache *c = p;
    evloop_del(c->l, &c->w);
    c->want = 0;
}

static void rc_on_watch(struct ev_watch *w, uint32_t events)
{
    struct route_rcache *c = (struct route_rcache *)((char *)w - offsetof(struct route_rcache, w));
    redisAsyncContext *ac = c->ac;
    if (!ac)
        return;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        redisAsyncHandleRead(ac);
    if (c->ac == ac && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        redisAsyncHandleWrite(ac);
    rc_arm(c);
}

/* ---- connection state -------------------------------------------------------------------------------- */

static void rc_mark_down(struct route_rcache *c, const char *why)
{
    if (!c->down)
        log_warn("route: cache: Redis at %s:%d is unavailable (%s); requests bypass the cache until it is back",
                 c->u.host, c->u.port, why);
    c->down = true;
    c->connected = false;
    c->reconnect_at = evloop_now_ms() + RC_RECONNECT_MS;
}

/* Drops the connection: every waiting lookup completes as unavailable (hiredis runs their callbacks). */
static void rc_drop(struct route_rcache *c, const char *why)
{
    redisAsyncContext *ac = c->ac;
    if (!ac)
        return;
    c->ac = NULL;
    c->st.disconnects++;
    rc_mark_down(c, why);
    redisAsyncFree(ac);
}

static void rc_on_connect(const redisAsyncContext *ac, int status)
{
    struct route_rcache *c = ac->data;
    if (c->ac != ac)
        return;
    if (status != REDIS_OK) {
        c->ac = NULL; /* hiredis frees it after this returns */
        rc_mark_down(c, ac->errstr[0] ? ac->errstr : "cannot connect");
        return;
    }
    c->connected = true;
    if (c->down)
        log_info("route: cache: Redis at %s:%d is back; the shared cache is used again", c->u.host, c->u.port);
    c->down = false;
}

static void rc_on_disconnect(const redisAsyncContext *ac, int status)
{
    struct route_rcache *c = ac->data;
    if (c->ac != ac)
        return; /* dropped by us (or being destroyed) */
    c->ac = NULL;
    c->st.disconnects++;
    rc_mark_down(c, status == REDIS_OK ? "it closed the connection" : ac->errstr[0] ? ac->errstr : "connection lost");
}

/* ---- commands ---------------------------------------------------------------------------------------- */

static void cmd_unlink(struct route_rcache *c, struct route_rcache_get *g)
{
    if (g->prev)
        g->prev->next = g->next;
    else
        c->head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    else
        c->tail = g->prev;
    c->n_pending--;
}

static void rc_on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct route_rcache_get *g = priv;
    struct route_rcache *c = g->c;
    redisReply *r = reply;
    cmd_unlink(c, g);
    enum route_rcache_result res = ROUTE_RCACHE_UNAVAILABLE;
    const char *val = NULL;
    size_t len = 0;
    if (!r) {
        /* the connection went away with this command pending */
    } else if (r->type == REDIS_REPLY_ERROR) {
        char why[200];
        snprintf(why, sizeof why, "it answered: %.150s", r->str);
        if (g->store)
            c->st.store_errors++;
        if (c->ac == ac)
            rc_drop(c, why);
    } else if (r->type == REDIS_REPLY_STRING) {
        res = ROUTE_RCACHE_HIT;
        val = r->str;
        len = r->len;
    } else {
        res = ROUTE_RCACHE_MISS; /* nil (a miss), or OK to a store */
    }
    if (g->fn) {
        if (res == ROUTE_RCACHE_UNAVAILABLE)
            c->st.unavailable++;
        g->fn(g->arg, res, val, len);
    }
    free(g);
}

/* Sends argv; g (taken) is its FIFO entry. false when it could not be sent (g freed, nothing called). */
static bool rc_send(struct route_rcache *c, struct route_rcache_get *g, int argc, const char **argv,
                    const size_t *argvlen)
{
    g->c = c;
    g->deadline = evloop_now_ms() + c->timeout_ms;
    g->next = NULL;
    g->prev = c->tail;
    if (c->tail)
        c->tail->next = g;
    else
        c->head = g;
    c->tail = g;
    c->n_pending++;
    if (redisAsyncCommandArgv(c->ac, rc_on_reply, g, argc, argv, argvlen) != REDIS_OK) {
        cmd_unlink(c, g);
        free(g);
        return false;
    }
    rc_arm(c);
    return true;
}

static void rc_on_auth(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)priv;
    struct route_rcache *c = ac->data;
    redisReply *r = reply;
    if (r && r->type == REDIS_REPLY_ERROR && c->ac == ac) {
        char why[200];
        snprintf(why, sizeof why, "AUTH/SELECT refused: %.150s", r->str);
        rc_drop(c, why);
    }
}

static void rc_connect(struct route_rcache *c)
{
    /* An address connects without blocking; a host name is resolved here first (keep it in /etc/hosts
     * or use an address: getaddrinfo blocks the I/O thread). */
    redisAsyncContext *ac = redisAsyncConnect(c->u.host, c->u.port);
    if (!ac) {
        rc_mark_down(c, "out of memory");
        return;
    }
    if (ac->err) {
        rc_mark_down(c, ac->errstr);
        redisAsyncFree(ac);
        return;
    }
    ac->data = c;
    ac->ev.data = c;
    ac->ev.addRead = rc_add_read;
    ac->ev.delRead = rc_del_read;
    ac->ev.addWrite = rc_add_write;
    ac->ev.delWrite = rc_del_write;
    ac->ev.cleanup = rc_cleanup;
    c->ac = ac;
    c->connected = false;
    c->connect_deadline = evloop_now_ms() + (c->timeout_ms > 1000 ? c->timeout_ms : 1000);
    redisAsyncSetDisconnectCallback(ac, rc_on_disconnect);
    redisAsyncSetConnectCallback(ac, rc_on_connect); /* also asks for the first write event */
    if (c->u.password[0]) {
        if (c->u.user[0])
            redisAsyncCommand(ac, rc_on_auth, NULL, "AUTH %s %s", c->u.user, c->u.password);
        else
            redisAsyncCommand(ac, rc_on_auth, NULL, "AUTH %s", c->u.password);
    }
    if (c->u.db)
        redisAsyncCommand(ac, rc_on_auth, NULL, "SELECT %d", c->u.db);
}

/* ---- the timer --------------------------------------------------------------------------------------- */

static void rc_on_timer(struct ev_timer *t)
{
    struct route_rcache *c = (struct route_rcache *)((char *)t - offsetof(struct route_rcache, timer));
    int64_t now = evloop_now_ms();
    /* Replies may be waiting in the socket while this thread was late (a loaded machine): read them first,
     * so that only a Redis that really did not answer is taken for down. */
    if (c->ac && c->connected && c->head && c->head->deadline <= now)
        redisAsyncHandleRead(c->ac);
    if (c->ac && c->head && c->head->deadline <= now) {
        char why[96];
        snprintf(why, sizeof why, "no answer within %d ms", c->timeout_ms);
        rc_drop(c, why);
    } else if (c->ac && !c->connected && c->connect_deadline <= now) {
        rc_drop(c, "connect timed out");
    }
    if (!c->ac && c->reconnect_at <= now)
        rc_connect(c);
    rc_arm(c);
}

static void rc_arm(struct route_rcache *c)
{
    int64_t at = 0;
    if (c->ac && c->head)
        at = c->head->deadline;
    if (c->ac && !c->connected && (!at || c->connect_deadline < at))
        at = c->connect_deadline;
    if (!c->ac)
        at = c->reconnect_at;
    if (at)
        evloop_timer_set(c->l, &c->timer, at);
    else
        evloop_timer_cancel(c->l, &c->timer);
}

/* ---- public ------------------------------------------------------------------------------------------ */

struct route_rcache *route_rcache_create(struct evloop *l, const char *url, const char *prefix, double ttl_s,
                                         int timeout_ms, int64_t max_value, char *err)
{
    struct route_rcache *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (redis_url_parse(url, &c->u, err))
        goto fail;
    c->prefix = strdup(prefix ? prefix : "");
    if (!c->prefix) {
        err_set(err, ERR_NOMEM, "out of memory");
        goto fail;
    }
    c->prefix_len = strlen(c->prefix);
    c->l = l;
    c->ttl_ms = (int64_t)(ttl_s * 1000.0);
    if (c->ttl_ms < 1)
        c->ttl_ms = 1;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 100;
    c->max_value = max_value;
    c->w.fd = -1;
    c->w.fn = rc_on_watch;
    ev_timer_init(&c->timer, rc_on_timer);
    rc_connect(c);
    rc_arm(c);
    return c;
fail:
    free(c->prefix);
    free(c);
    return NULL;
}

void route_rcache_destroy(struct route_rcache *c)
{
    if (!c)
        return;
    redisAsyncContext *ac = c->ac;
    c->ac = NULL;
    if (ac)
        redisAsyncFree(ac); /* the waiting lookups complete as unavailable */
    evloop_timer_cancel(c->l, &c->timer);
    evloop_del(c->l, &c->w);
    while (c->head) { /* not expected: hiredis ran every pending callback */
        struct route_rcache_get *g = c->head;
        cmd_unlink(c, g);
        free(g);
    }
    free(c->prefix);
    free(c);
}

/* prefix + key, malloc'd; NULL on OOM. */
static char *full_key(const struct route_rcache *c, const char *key, size_t key_len, size_t *len)
{
    char *k = malloc(c->prefix_len + key_len + 1);
    if (!k)
        return NULL;
    memcpy(k, c->prefix, c->prefix_len);
    memcpy(k + c->prefix_len, key, key_len);
    k[c->prefix_len + key_len] = 0;
    *len = c->prefix_len + key_len;
    return k;
}

struct route_rcache_get *route_rcache_get(struct route_rcache *c, const char *key, size_t key_len,
                                          route_rcache_fn fn, void *arg)
{
    if (!c->ac || (c->down && !c->connected) || c->n_pending >= RC_MAX_PENDING) {
        c->st.unavailable++;
        return NULL;
    }
    struct route_rcache_get *g = calloc(1, sizeof *g);
    size_t klen = 0;
    char *k = g ? full_key(c, key, key_len, &klen) : NULL;
    if (!k) {
        free(g);
        c->st.unavailable++;
        return NULL;
    }
    g->fn = fn;
    g->arg = arg;
    const char *argv[2] = {"GET", k};
    size_t argvlen[2] = {3, klen};
    bool ok = rc_send(c, g, 2, argv, argvlen);
    free(k);
    if (!ok) {
        c->st.unavailable++;
        return NULL;
    }
    return g;
}

void route_rcache_get_cancel(struct route_rcache_get *g)
{
    if (g)
        g->fn = NULL;
}

void route_rcache_put(struct route_rcache *c, const char *key, size_t key_len, const char *value, size_t value_len)
{
    if (!c->ac || !c->connected || c->n_pending >= RC_MAX_PENDING ||
        (c->max_value > 0 && (int64_t)value_len > c->max_value))
        return;
    struct route_rcache_get *g = calloc(1, sizeof *g);
    size_t klen = 0;
    char *k = g ? full_key(c, key, key_len, &klen) : NULL;
    if (!k) {
        free(g);
        return;
    }
    g->store = true;
    char px[32];
    int pl = snprintf(px, sizeof px, "%lld", (long long)c->ttl_ms);
    const char *argv[5] = {"SET", k, value, "PX", px};
    size_t argvlen[5] = {3, klen, value_len, 2, (size_t)pl};
    if (!rc_send(c, g, 5, argv, argvlen))
        c->st.store_errors++;
    free(k);
}

void route_rcache_stats_get(const struct route_rcache *c, struct route_rcache_stats *out)
{
    *out = c->st;
    out->up = c->ac && c->connected;
}
