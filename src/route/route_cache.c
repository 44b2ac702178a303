/*
 * route_cache: a chained hash table (power-of-two buckets, doubled at load 1) plus one doubly linked LRU
 * list, head = most recent. Each entry is one allocation holding its key and value, so eviction is one
 * free. Expired entries are dropped when met (a get, or the LRU tail during eviction), which is enough:
 * the byte bound holds at every moment, and stale entries cost memory only until pushed out.
 */
#include "route/route_cache.h"

#include "core/err.h"
#include "route/route_policy.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct rc_entry {
    uint64_t hash;
    size_t klen, vlen;
    int64_t expires_ms;
    struct rc_entry *hnext;
    struct rc_entry *prev, *next; /* LRU */
    char data[];                  /* key, then value */
};

struct route_cache {
    int64_t max_bytes;
    int64_t ttl_ms;
    struct rc_entry **buckets;
    size_t n_buckets;
    struct rc_entry *head, *tail;
    struct route_cache_stats st;
};

static int64_t entry_bytes(const struct rc_entry *e)
{
    return (int64_t)(e->klen + e->vlen) + ROUTE_CACHE_ENTRY_OVERHEAD;
}

struct route_cache *route_cache_create(int64_t max_bytes, double ttl_s)
{
    struct route_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max_bytes = max_bytes;
    c->ttl_ms = (int64_t)(ttl_s * 1000.0);
    c->n_buckets = 64;
    c->buckets = calloc(c->n_buckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    return c;
}

void route_cache_destroy(struct route_cache *c)
{
    if (!c)
        return;
    for (struct rc_entry *e = c->head, *nx; e; e = nx) {
        nx = e->next;
        free(e);
    }
    free(c->buckets);
    free(c);
}

static void lru_unlink(struct route_cache *c, struct rc_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(struct route_cache *c, struct rc_entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    else
        c->tail = e;
    c->head = e;
}

static void entry_remove(struct route_cache *c, struct rc_entry *e)
{
    struct rc_entry **pp = &c->buckets[e->hash & (c->n_buckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(c, e);
    c->st.bytes -= entry_bytes(e);
    c->st.entries--;
    free(e);
}

static struct rc_entry *entry_find(struct route_cache *c, uint64_t h, const char *key, size_t klen)
{
    for (struct rc_entry *e = c->buckets[h & (c->n_buckets - 1)]; e; e = e->hnext)
        if (e->hash == h && e->klen == klen && !memcmp(e->data, key, klen))
            return e;
    return NULL;
}

const char *route_cache_get(struct route_cache *c, const char *key, size_t key_len, int64_t now_ms,
                            size_t *value_len)
{
    uint64_t h = route_hash64(key, key_len, 0);
    struct rc_entry *e = entry_find(c, h, key, key_len);
    if (e && e->expires_ms <= now_ms) {
        entry_remove(c, e);
        c->st.expirations++;
        e = NULL;
    }
    if (!e) {
        c->st.misses++;
        return NULL;
    }
    lru_unlink(c, e);
    lru_push_front(c, e);
    c->st.hits++;
    *value_len = e->vlen;
    return e->data + e->klen;
}

static void cache_grow(struct route_cache *c)
{
    size_t nb = c->n_buckets * 2;
    struct rc_entry **b = calloc(nb, sizeof *b);
    if (!b)
        return; /* longer chains, still correct */
    for (struct rc_entry *e = c->head; e; e = e->next) {
        size_t i = e->hash & (nb - 1);
        e->hnext = b[i];
        b[i] = e;
    }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = nb;
}

int route_cache_put(struct route_cache *c, const char *key, size_t key_len, const char *value, size_t value_len,
                    int64_t now_ms)
{
    int64_t need = (int64_t)(key_len + value_len) + ROUTE_CACHE_ENTRY_OVERHEAD;
    if (need > c->max_bytes)
        return ERR_TOO_LARGE;
    uint64_t h = route_hash64(key, key_len, 0);
    struct rc_entry *old = entry_find(c, h, key, key_len);
    if (old)
        entry_remove(c, old);
    while (c->tail && c->st.bytes + need > c->max_bytes) {
        bool expired = c->tail->expires_ms <= now_ms;
        entry_remove(c, c->tail);
        if (expired)
            c->st.expirations++;
        else
            c->st.evictions++;
    }
    struct rc_entry *e = malloc(sizeof *e + key_len + value_len);
    if (!e)
        return ERR_NOMEM;
    e->hash = h;
    e->klen = key_len;
    e->vlen = value_len;
    e->expires_ms = now_ms + c->ttl_ms;
    memcpy(e->data, key, key_len);
    memcpy(e->data + key_len, value, value_len);
    size_t i = h & (c->n_buckets - 1);
    e->hnext = c->buckets[i];
    c->buckets[i] = e;
    lru_push_front(c, e);
    c->st.bytes += need;
    c->st.entries++;
    c->st.stores++;
    if ((size_t)c->st.entries > c->n_buckets)
        cache_grow(c);
    return 0;
}

void route_cache_stats_get(const struct route_cache *c, struct route_cache_stats *out) { *out = c->st; }
