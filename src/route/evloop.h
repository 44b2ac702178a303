/*
 * evloop: the router's timers and upstream watchers, hosted in the HTTP server's own epoll set
 * (http_server_watch_ctl): an upstream socket's events come out of the same epoll_wait as the clients', with
 * no nested loop to wake and drain. Every client connection, upstream connection and timer is handled by the
 * server's I/O thread, so nothing needs a lock.
 *
 * Timers are a binary min-heap of embedded struct ev_timer (no allocation per timer) behind one timerfd
 * that is armed for the earliest deadline (itself a watcher in the server's set). A watcher removed while a
 * batch of events is being handled gets no more events from that batch (the server forgets them), so its
 * owner may free it at once; likewise a timer cancelled while due timers run.
 *
 * Threading: I/O thread only (create and the first watchers also before the server's loop runs).
 */
#ifndef WAFER_ROUTE_EVLOOP_H
#define WAFER_ROUTE_EVLOOP_H

#include "core/http.h"

#include <stdbool.h>
#include <stdint.h>

struct evloop;

/* A file descriptor watched for epoll events; embedded in its owner, which sets fd and fn. fn gets the ready
 * events. */
struct ev_watch {
    int fd;
    uint32_t events; /* currently registered */
    bool added;
    void (*fn)(struct ev_watch *w, uint32_t events);
    struct http_watch hw; /* the server's tag (evloop's) */
};

/* A one-shot timer; embedded in its owner. idx is its heap slot, -1 while not armed. */
struct ev_timer {
    int64_t at; /* ms, CLOCK_MONOTONIC */
    int idx;
    void (*fn)(struct ev_timer *t);
};

/* Hosts the loop in server's epoll set. NULL with a message in err (ERR_MSG_MAX bytes) on failure. Caller
 * frees with evloop_destroy, after evloop_unhost. */
struct evloop *evloop_create(struct http_server *server, char *err);
/* Before the server is destroyed: leaves its epoll set. Afterwards add and mod fail (ERR_IO) and del only
 * marks the watcher removed (its fd is the owner's to close), so owners can be torn down in any order. */
void evloop_unhost(struct evloop *l);
void evloop_destroy(struct evloop *l);

/* Monotonic milliseconds (core/clock.h's clock, the timer heap's unit); latencies use clock_now_ns. */
int64_t evloop_now_ms(void);

/* Watchers: add registers w->fd for events, mod changes them (a no-op when equal), del unregisters
 * (safe when not added). 0 or ERR_IO. */
int evloop_add(struct evloop *l, struct ev_watch *w, uint32_t events);
int evloop_mod(struct evloop *l, struct ev_watch *w, uint32_t events);
void evloop_del(struct evloop *l, struct ev_watch *w);

/* Timers: init once (not armed), set (re)arms it for at_ms, cancel disarms (safe when not armed). */
void ev_timer_init(struct ev_timer *t, void (*fn)(struct ev_timer *t));
void evloop_timer_set(struct evloop *l, struct ev_timer *t, int64_t at_ms);
void evloop_timer_cancel(struct evloop *l, struct ev_timer *t);
static inline bool ev_timer_armed(const struct ev_timer *t) { return t->idx >= 0; }

#endif
