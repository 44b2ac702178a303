/*
 * evloop: watchers in the HTTP server's epoll set plus a timer heap behind one timerfd (see evloop.h).
 *
 * The timerfd is armed for the heap's earliest deadline only when that deadline moves earlier than what is
 * armed (or after it fired), so arming a later timer costs no system call; a timer cancelled after arming
 * makes the timerfd fire early once, which is harmless: due timers are found by looking at the heap.
 */
#include "route/evloop.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define EVLOOP_NOT_ARMED INT64_MAX

struct evloop {
    struct http_server *host; /* NULL after evloop_unhost */
    int timer_fd;
    struct ev_watch timer_watch;
    int64_t armed_at; /* deadline the timerfd is set for; EVLOOP_NOT_ARMED when none */
    struct ev_timer **heap;
    int n_heap, cap_heap;
    bool in_timers; /* running due timers: the timerfd is armed once, after them */
};

int64_t evloop_now_ms(void) { return clock_now_ns() / 1000000; }

/* ---- heap ------------------------------------------------------------------------------------------ */

static void heap_swap(struct evloop *l, int a, int b)
{
    struct ev_timer *t = l->heap[a];
    l->heap[a] = l->heap[b];
    l->heap[b] = t;
    l->heap[a]->idx = a;
    l->heap[b]->idx = b;
}

static void heap_up(struct evloop *l, int i)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (l->heap[p]->at <= l->heap[i]->at)
            break;
        heap_swap(l, p, i);
        i = p;
    }
}

static void heap_down(struct evloop *l, int i)
{
    for (;;) {
        int a = 2 * i + 1, b = a + 1, m = i;
        if (a < l->n_heap && l->heap[a]->at < l->heap[m]->at)
            m = a;
        if (b < l->n_heap && l->heap[b]->at < l->heap[m]->at)
            m = b;
        if (m == i)
            return;
        heap_swap(l, i, m);
        i = m;
    }
}

static void heap_remove(struct evloop *l, struct ev_timer *t)
{
    int i = t->idx;
    t->idx = -1;
    l->n_heap--;
    if (i == l->n_heap)
        return;
    l->heap[i] = l->heap[l->n_heap];
    l->heap[i]->idx = i;
    heap_down(l, i);
    heap_up(l, l->heap[i]->idx);
}

static void evloop_arm(struct evloop *l)
{
    int64_t want = l->n_heap ? l->heap[0]->at : EVLOOP_NOT_ARMED;
    if (want >= l->armed_at)
        return;
    struct itimerspec its = {0};
    int64_t at = want < 1 ? 1 : want; /* an all-zero it_value would disarm */
    its.it_value.tv_sec = at / 1000;
    its.it_value.tv_nsec = (at % 1000) * 1000000;
    if (timerfd_settime(l->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) < 0) {
        log_error("route: timerfd_settime failed: %s", strerror(errno));
        return;
    }
    l->armed_at = want;
}

void ev_timer_init(struct ev_timer *t, void (*fn)(struct ev_timer *t))
{
    t->at = 0;
    t->idx = -1;
    t->fn = fn;
}

void evloop_timer_set(struct evloop *l, struct ev_timer *t, int64_t at_ms)
{
    if (t->idx >= 0) {
        int64_t old = t->at;
        t->at = at_ms;
        if (at_ms < old)
            heap_up(l, t->idx);
        else
            heap_down(l, t->idx);
    } else {
        if (l->n_heap == l->cap_heap) {
            int nc = l->cap_heap ? l->cap_heap * 2 : 64;
            struct ev_timer **nh = realloc(l->heap, (size_t)nc * sizeof *nh);
            ASSERT(nh); /* a few pointers; running out here leaves no sane way on */
            l->heap = nh;
            l->cap_heap = nc;
        }
        t->at = at_ms;
        t->idx = l->n_heap++;
        l->heap[t->idx] = t;
        heap_up(l, t->idx);
    }
    if (!l->in_timers)
        evloop_arm(l);
}

void evloop_timer_cancel(struct evloop *l, struct ev_timer *t)
{
    if (t->idx >= 0)
        heap_remove(l, t);
}

/* ---- watchers -------------------------------------------------------------------------------------- */

static void evloop_on_event(struct http_watch *hw, uint32_t events)
{
    struct ev_watch *w = (struct ev_watch *)((char *)hw - offsetof(struct ev_watch, hw));
    w->fn(w, events);
}

int evloop_add(struct evloop *l, struct ev_watch *w, uint32_t events)
{
    w->hw.fn = evloop_on_event;
    if (!l->host || http_server_watch_ctl(l->host, EPOLL_CTL_ADD, w->fd, events, &w->hw) < 0)
        return ERR_IO;
    w->events = events;
    w->added = true;
    return 0;
}

int evloop_mod(struct evloop *l, struct ev_watch *w, uint32_t events)
{
    if (!w->added)
        return evloop_add(l, w, events);
    if (events == w->events)
        return 0;
    if (!l->host || http_server_watch_ctl(l->host, EPOLL_CTL_MOD, w->fd, events, &w->hw) < 0)
        return ERR_IO;
    w->events = events;
    return 0;
}

void evloop_del(struct evloop *l, struct ev_watch *w)
{
    if (!w->added)
        return;
    w->added = false;
    if (l->host) /* also forgets w in the batch being handled, so the owner may free it as soon as this returns */
        http_server_watch_ctl(l->host, EPOLL_CTL_DEL, w->fd, 0, &w->hw);
}

/* ---- timers' fd -------------------------------------------------------------------------------------- */

/* Due timers; one that re-arms itself for now runs again on the timerfd's next event, not in this loop. */
static void evloop_on_timerfd(struct ev_watch *w, uint32_t events)
{
    (void)events;
    struct evloop *l = (struct evloop *)((char *)w - offsetof(struct evloop, timer_watch));
    uint64_t n;
    while (read(l->timer_fd, &n, sizeof n) == (ssize_t)sizeof n) {
    }
    l->armed_at = EVLOOP_NOT_ARMED;
    int64_t now = evloop_now_ms();
    int budget = l->n_heap;
    l->in_timers = true;
    while (l->n_heap && l->heap[0]->at <= now && budget-- > 0) {
        struct ev_timer *t = l->heap[0];
        heap_remove(l, t);
        t->fn(t);
    }
    l->in_timers = false;
    evloop_arm(l); /* a deadline already due makes the timerfd fire at once */
}

/* ---- lifetime -------------------------------------------------------------------------------------- */

struct evloop *evloop_create(struct http_server *server, char *err)
{
    struct evloop *l = calloc(1, sizeof *l);
    if (!l) {
        err_set(err, ERR_NOMEM, "out of memory");
        return NULL;
    }
    l->host = server;
    l->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    l->armed_at = EVLOOP_NOT_ARMED;
    if (l->timer_fd < 0) {
        err_set(err, ERR_IO, "route: timerfd: %s", strerror(errno));
        goto fail;
    }
    l->timer_watch.fd = l->timer_fd;
    l->timer_watch.fn = evloop_on_timerfd;
    if (evloop_add(l, &l->timer_watch, EPOLLIN) < 0) {
        err_set(err, ERR_IO, "route: epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    return l;
fail:
    evloop_destroy(l);
    return NULL;
}

void evloop_unhost(struct evloop *l)
{
    if (!l || !l->host)
        return;
    evloop_del(l, &l->timer_watch);
    l->host = NULL;
}

void evloop_destroy(struct evloop *l)
{
    if (!l)
        return;
    evloop_unhost(l);
    if (l->timer_fd >= 0)
        close(l->timer_fd);
    free(l->heap);
    free(l);
}
