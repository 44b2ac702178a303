/*
 * route_rcache: the router's result cache shared in Redis (cache.url), so that several routers serve each
 * other's entries. The same opaque keys and values as route_cache.h; entries expire in Redis itself
 * (SET ... PX ttl), and Redis's own maxmemory policy bounds the total.
 *
 * Everything is asynchronous on the router's event loop (hiredis's async API on an evloop watcher): a
 * lookup never blocks the I/O thread. Redis being down, slow or answering nonsense never fails a request:
 * a lookup that cannot be made or is not answered within timeout_ms comes back as "unavailable" and the
 * request goes on to a backend (the cache is bypassed); stores are dropped. One log line when Redis is lost
 * and one when it is back; while down, a reconnection is tried every second.
 *
 * Threading: the router's I/O thread only.
 */
#ifndef WAFER_ROUTE_ROUTE_RCACHE_H
#define WAFER_ROUTE_ROUTE_RCACHE_H

#include "route/evloop.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct route_rcache;
struct route_rcache_get;

/* The outcome of a lookup. */
enum route_rcache_result { ROUTE_RCACHE_HIT, ROUTE_RCACHE_MISS, ROUTE_RCACHE_UNAVAILABLE };

/* Called once per lookup (unless cancelled), never from inside route_rcache_get itself. val is the stored
 * value on a hit (valid during the call only; not NUL-terminated), else NULL. */
typedef void (*route_rcache_fn)(void *arg, enum route_rcache_result res, const char *val, size_t len);

struct route_rcache_stats {
    bool up;                                  /* connected now */
    uint64_t unavailable, store_errors, disconnects;
};

/* url: redis://[[user]:password@]HOST[:PORT][/DB] (checked by the config); prefix is put before every key;
 * max_value: values larger than this are not stored (0: no bound). Connects in the background (the first
 * lookups may find Redis unavailable). NULL with a message in err on a bad URL or OOM. Caller frees with
 * route_rcache_destroy, which calls the callbacks of lookups still waiting with ROUTE_RCACHE_UNAVAILABLE. */
struct route_rcache *route_rcache_create(struct evloop *l, const char *url, const char *prefix, double ttl_s,
                                         int timeout_ms, int64_t max_value, char *err);
void route_rcache_destroy(struct route_rcache *c);

/* Starts a lookup of key; fn(arg, ...) is called later with the outcome. NULL when Redis is known to be down
 * (nothing will be called: the caller bypasses the cache now). The handle is valid until fn is called or
 * the lookup is cancelled. */
struct route_rcache_get *route_rcache_get(struct route_rcache *c, const char *key, size_t key_len,
                                          route_rcache_fn fn, void *arg);
/* fn will not be called for g (its reply, when it comes, is dropped). */
void route_rcache_get_cancel(struct route_rcache_get *g);

/* Stores key -> value with the TTL, in the background; dropped when Redis is down or the value too large. */
void route_rcache_put(struct route_rcache *c, const char *key, size_t key_len, const char *value, size_t value_len);

void route_rcache_stats_get(const struct route_rcache *c, struct route_rcache_stats *out);

#endif
