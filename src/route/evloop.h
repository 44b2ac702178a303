/*
 * evloop: the router's own event loop, nested in the HTTP server's. The upstream sockets and the timers of
 * the router live in one epoll set of their own whose fd the HTTP server watches (http_server_params
 * watch_fd/on_watch): when that fd turns readable the server's I/O thread calls evloop_run_once, which
 * handles what is ready without blocking. So every client connection, upstream connection and timer is
 * handled by one thread and nothing needs a lock.
 *
 * Timers are a binary min-heap of embedded struct ev_timer (no allocation per timer) behind one timerfd
 * that is armed for the earliest deadline. A watcher or timer removed while a batch of events is being
 * handled is dropped from the rest of that batch, so its owner may free it at once.
 *
 * Threading: I/O thread only (evloop_fd may be read anywhere).
 */
#ifndef WAFER_ROUTE_EVLOOP_H
#define WAFER_ROUTE_EVLOOP_H

#include <stdbool.h>
#include <stdint.h>

struct evloop;

/* A file descriptor watched for epoll events; embedded in its owner. fn gets the ready events. */
struct ev_watch {
    int fd;
    uint32_t events; /* currently registered */
    bool added;
    void (*fn)(struct ev_watch *w, uint32_t events);
};

/* A one-shot timer; embedded in its owner. idx is its heap slot, -1 while not armed. */
struct ev_timer {
    int64_t at; /* ms, CLOCK_MONOTONIC */
    int idx;
    void (*fn)(struct ev_timer *t);
};

/* NULL with a message in err (ERR_MSG_MAX bytes) on failure. Caller frees with evloop_destroy. */
struct evloop *evloop_create(char *err);
void evloop_destroy(struct evloop *l);
/* The epoll fd to hand to http_server_params.watch_fd. */
int evloop_fd(const struct evloop *l);

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

/* Handles the ready events and the due timers without blocking. */
void evloop_run_once(struct evloop *l);

#endif
