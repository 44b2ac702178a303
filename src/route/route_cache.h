/*
 * route_cache: the router's exact result cache, in memory. Keys are opaque byte strings (the router builds
 * them from the model, the endpoint and the canonical request body); values are opaque bytes. Entries live
 * ttl_s at most, and the least recently used ones are evicted to keep the total (keys, values and a fixed
 * per-entry overhead) within max_bytes.
 *
 * Threading: one thread (the router's I/O thread).
 */
#ifndef WAFER_ROUTE_ROUTE_CACHE_H
#define WAFER_ROUTE_ROUTE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define ROUTE_CACHE_ENTRY_OVERHEAD 96 /* bytes counted per entry besides its key and value */

struct route_cache;

struct route_cache_stats {
    int64_t bytes, entries;
    int64_t hits, misses, stores, evictions, expirations;
};

/* NULL on OOM. Caller frees with route_cache_destroy. */
struct route_cache *route_cache_create(int64_t max_bytes, double ttl_s);
void route_cache_destroy(struct route_cache *c);

/* The live value for key (and it becomes the most recently used), or NULL (a miss; an expired entry is
 * dropped). The pointer is valid until the next call on c. */
const char *route_cache_get(struct route_cache *c, const char *key, size_t key_len, int64_t now_ms,
                            size_t *value_len);

/* Stores (or replaces) key -> value, evicting LRU entries as needed. 0, ERR_TOO_LARGE when the entry
 * alone exceeds max_bytes (nothing stored), or ERR_NOMEM. */
int route_cache_put(struct route_cache *c, const char *key, size_t key_len, const char *value, size_t value_len,
                    int64_t now_ms);

void route_cache_stats_get(const struct route_cache *c, struct route_cache_stats *out);

#endif
