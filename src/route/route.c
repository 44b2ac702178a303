/*
 * route: wiring of `wafer route`: threads, the routing table and its reloads, and the small endpoints.
 *
 * Threads: the main thread resolves host names and parses config files (both may block), then only waits
 * for signals (blocked everywhere, taken with sigtimedwait): SIGHUP re-reads the file, a timer re-resolves
 * host names; either posts a plan (config + addresses) through one atomic pointer and wakes the I/O thread.
 * The I/O thread runs the HTTP server's epoll loop, whose epoll set also holds the router's upstream sockets
 * and timer fd (evloop.h): every request, upstream exchange, health check and table swap happens on it, so
 * the router's state needs no lock.
 *
 * A reload never drops a request: the new table replaces the old one for requests that arrive after it,
 * while each request in flight keeps a reference to the table it started with (and so its pools and
 * backends) until it ends. Backends are kept by (kind, URL, address) in a registry for the router's
 * lifetime, so health, circuit and counters of backends that stay survive the reload, and their pooled
 * connections keep being used.
 */
#include "route/route.h"

#include "core/err.h"
#include "core/log.h"
#include "core/version.h"
#include "route/route_internal.h"
#include "route/route_policy.h"
#include "route/route_observe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define ROUTE_DRAIN_MS 30000

/* Two optional strings are equal (both NULL counts). */
static bool str_eq(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }






void rt_plan_free(struct rt_plan *p)
{
    if (!p)
        return;
    if (p->urls) {
        for (int i = 0; i < p->conf->c.n_pools; i++)
            free(p->urls[i]);
        free(p->urls);
    }
    rt_conf_unref(p->conf);
    free(p);
}

static int addr_cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct sockaddr_storage));
}

/* Resolves one URL (blocking). A name that does not resolve leaves n = 0 and says so in the log. */
static void resolve_url(const char *url, struct rt_resolved *out)
{
    memset(out, 0, sizeof *out);
    if (route_url_parse(url, out->host, sizeof out->host, &out->port, out->prefix, sizeof out->prefix))
        return; /* checked with the config */
    char port[16];
    snprintf(port, sizeof port, "%d", out->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(out->host, port, &hints, &res);
    if (rc) {
        log_warn("route: backend %s: cannot resolve '%s': %s (no address in the pool for now)", url, out->host,
                 gai_strerror(rc));
        return;
    }
    struct sockaddr_storage tmp[RT_MAX_ADDRS];
    socklen_t lens[RT_MAX_ADDRS];
    int n = 0;
    for (struct addrinfo *ai = res; ai && n < RT_MAX_ADDRS; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof tmp[0])
            continue;
        struct sockaddr_storage s;
        memset(&s, 0, sizeof s);
        memcpy(&s, ai->ai_addr, ai->ai_addrlen);
        bool dup = false;
        for (int k = 0; k < n; k++)
            dup |= !memcmp(&tmp[k], &s, sizeof s);
        if (dup)
            continue;
        tmp[n] = s;
        lens[n] = ai->ai_addrlen;
        n++;
    }
    freeaddrinfo(res);
    /* Sorted, so that a DNS server rotating its answers does not look like a change. */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (addr_cmp(&tmp[j], &tmp[i]) < 0) {
                struct sockaddr_storage t = tmp[i];
                tmp[i] = tmp[j];
                tmp[j] = t;
                socklen_t l = lens[i];
                lens[i] = lens[j];
                lens[j] = l;
            }
    for (int i = 0; i < n; i++) {
        out->addr[i] = tmp[i];
        out->addr_len[i] = lens[i];
    }
    out->n = n;
}

/* A plan for conf (a reference is taken): every pool URL resolved. NULL on OOM. Main thread. */
static struct rt_plan *plan_create(struct rt_conf *conf, bool from_reload)
{
    struct rt_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->conf = rt_conf_ref(conf);
    p->from_reload = from_reload;
    const struct route_config *c = &conf->c;
    p->urls = calloc((size_t)(c->n_pools ? c->n_pools : 1), sizeof *p->urls);
    if (!p->urls)
        goto fail;
    for (int i = 0; i < c->n_pools; i++) {
        p->urls[i] = calloc((size_t)c->pools[i].n_urls, sizeof *p->urls[i]);
        if (!p->urls[i])
            goto fail;
        for (int j = 0; j < c->pools[i].n_urls; j++)
            resolve_url(c->pools[i].urls[j], &p->urls[i][j]);
    }
    return p;
fail:
    rt_plan_free(p);
    return NULL;
}

static uint64_t plan_signature(const struct rt_plan *p)
{
    uint64_t h = 0;
    for (int i = 0; i < p->conf->c.n_pools; i++)
        for (int j = 0; j < p->conf->c.pools[i].n_urls; j++) {
            const struct rt_resolved *u = &p->urls[i][j];
            h = route_hash64(u->addr, sizeof u->addr[0] * (size_t)u->n, h + (uint64_t)u->n);
        }
    return h;
}



static void format_addr(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%d", ip, ntohs(a->sin_port));
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(out, cap, "[%s]:%d", ip, ntohs(a->sin6_port));
    }
}

static struct rt_backend *backend_get(struct router *r, const char *url, bool wafer, const struct rt_resolved *u,
                                      int k)
{
    for (struct rt_backend *b = r->backends; b; b = b->next)
        if (b->wafer == wafer && !strcmp(b->url, url) && b->target.addr_len == u->addr_len[k] &&
            !memcmp(&b->target.addr, &u->addr[k], u->addr_len[k]))
            return b;
    struct rt_backend *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->r = r;
    memcpy(&b->target.addr, &u->addr[k], u->addr_len[k]);
    b->target.addr_len = u->addr_len[k];
    char addr[128];
    format_addr(&u->addr[k], addr, sizeof addr);
    snprintf(b->target.name, sizeof b->target.name, "%s", addr);
    snprintf(b->url, sizeof b->url, "%s", url);
    struct in6_addr tmp;
    bool numeric = inet_pton(AF_INET, u->host, &tmp) == 1 || inet_pton(AF_INET6, u->host, &tmp) == 1;
    bool v6 = strchr(u->host, ':') != NULL;
    if (numeric)
        snprintf(b->label, sizeof b->label, "%s%.200s%s:%d", v6 ? "[" : "", u->host, v6 ? "]" : "", u->port);
    else
        snprintf(b->label, sizeof b->label, "%.200s:%d/%.64s", u->host, u->port, addr);
    snprintf(b->host_header, sizeof b->host_header, "%s%.200s%s:%d", v6 ? "[" : "", u->host, v6 ? "]" : "", u->port);
    snprintf(b->prefix, sizeof b->prefix, "%s", u->prefix);
    b->wafer = wafer;
    b->up = true;
    b->reported_load = -1;
    ev_timer_init(&b->health_timer, NULL); /* route_health.c sets the callback */
    b->next = r->backends;
    r->backends = b;
    return b;
}

/* Builds the table for plan p; old (may be NULL) lends its splits when the config is the same (a DNS
 * refresh must not undo a PUT /admin/rollout). NULL on OOM. I/O thread. */
static struct rt_table *table_build(struct router *r, const struct rt_plan *p, const struct rt_table *old)
{
    const struct route_config *c = &p->conf->c;
    struct rt_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->refs = 1;
    t->conf = rt_conf_ref(p->conf);
    t->pools = calloc((size_t)c->n_pools, sizeof *t->pools);
    t->routes = calloc((size_t)c->n_routes, sizeof *t->routes);
    if (!t->pools || !t->routes)
        goto fail;
    t->n_pools = c->n_pools;
    for (int i = 0; i < c->n_pools; i++) {
        struct rt_pool *pl = &t->pools[i];
        pl->name = c->pools[i].name;
        pl->wafer = c->pools[i].wafer;
        int cap = 0;
        for (int j = 0; j < c->pools[i].n_urls; j++)
            cap += p->urls[i][j].n;
        pl->b = calloc((size_t)(cap ? cap : 1), sizeof *pl->b);
        if (!pl->b)
            goto fail;
        for (int j = 0; j < c->pools[i].n_urls; j++)
            for (int k = 0; k < p->urls[i][j].n; k++) {
                struct rt_backend *b = backend_get(r, c->pools[i].urls[j], pl->wafer, &p->urls[i][j], k);
                if (!b)
                    goto fail;
                bool dup = false;
                for (int m = 0; m < pl->n; m++)
                    dup |= pl->b[m] == b;
                if (!dup)
                    pl->b[pl->n++] = b;
            }
    }
    t->n_routes = c->n_routes;
    for (int i = 0; i < c->n_routes; i++) {
        const struct route_rule_conf *rc = &c->routes[i];
        struct rt_route *rt = &t->routes[i];
        int n = rc->n_split;
        rt->model = strdup(rc->model);
        rt->pool = calloc((size_t)n, sizeof *rt->pool);
        rt->weight = calloc((size_t)n, sizeof *rt->weight);
        rt->names = calloc((size_t)n, sizeof *rt->names);
        rt->swrr = calloc((size_t)n, sizeof *rt->swrr);
        rt->fallback = calloc((size_t)(rc->n_fallback ? rc->n_fallback : 1), sizeof *rt->fallback);
        if (!rt->model || !rt->pool || !rt->weight || !rt->names || !rt->swrr || !rt->fallback)
            goto fail;
        rt->n_split = n;
        for (int k = 0; k < n; k++) {
            rt->pool[k] = rc->split[k].pool;
            rt->weight[k] = rc->split[k].weight;
            rt->names[k] = c->pools[rc->split[k].pool].name;
        }
        rt->n_fallback = rc->n_fallback;
        for (int k = 0; k < rc->n_fallback; k++)
            rt->fallback[k] = rc->fallback[k].pool;
        rt->sticky = rc->sticky;
        if (rc->sticky_header && !(rt->sticky_header = strdup(rc->sticky_header)))
            goto fail;
        /* The same config (a DNS refresh): keep the splits set at run time. */
        if (old && old->conf == p->conf)
            for (int m = 0; m < old->n_routes; m++)
                if (!strcmp(old->routes[m].model, rt->model)) {
                    const struct rt_route *o = &old->routes[m];
                    int *np = calloc((size_t)o->n_split, sizeof *np);
                    double *nw = calloc((size_t)o->n_split, sizeof *nw);
                    const char **nn = calloc((size_t)o->n_split, sizeof *nn);
                    int64_t *ns = calloc((size_t)o->n_split, sizeof *ns);
                    if (!np || !nw || !nn || !ns) {
                        free(np), free(nw), free(nn), free(ns);
                        goto fail;
                    }
                    memcpy(np, o->pool, (size_t)o->n_split * sizeof *np);
                    memcpy(nw, o->weight, (size_t)o->n_split * sizeof *nw);
                    for (int k = 0; k < o->n_split; k++)
                        nn[k] = c->pools[np[k]].name;
                    free(rt->pool), free(rt->weight), free(rt->names), free(rt->swrr);
                    rt->pool = np, rt->weight = nw, rt->names = nn, rt->swrr = ns;
                    rt->n_split = o->n_split;
                }
    }
    return t;
fail:
    rt_table_unref(t);
    return NULL;
}

/* Makes t current (I/O thread): marks which backends are in use, syncs health checks, limits and cache. */
static void table_install(struct router *r, struct rt_table *t)
{
    const struct route_config *c = &t->conf->c;
    for (struct rt_backend *b = r->backends; b; b = b->next)
        b->in_use = false;
    for (int i = 0; i < t->n_pools; i++)
        for (int k = 0; k < t->pools[i].n; k++)
            t->pools[i].b[k]->in_use = true;
    for (struct rt_backend *b = r->backends; b; b = b->next)
        if (!b->in_use)
            up_target_close_idle(r->loop, &b->target);
    if (c->n_keys || r->limits) {
        struct route_limits *nl = c->n_keys ? route_limits_create(c->keys, c->n_keys, r->limits) : NULL;
        if (c->n_keys && !nl)
            log_error("route: out of memory for the key limits (keeping the old ones)");
        else {
            if (!c->n_keys)
                route_limits_destroy(r->limits);
            r->limits = nl;
            r->limits_gen++;
        }
    }
    const struct route_config *oc = r->table ? &r->table->conf->c : NULL;
    struct route_rcache *old_rcache = NULL;
    if (!oc || oc->cache_max_bytes != c->cache_max_bytes || oc->cache_ttl_s != c->cache_ttl_s ||
        !str_eq(oc->cache_url, c->cache_url) || !str_eq(oc->cache_prefix, c->cache_prefix) ||
        oc->cache_timeout_ms != c->cache_timeout_ms) {
        route_cache_destroy(r->cache);
        r->cache = !c->cache_url && c->cache_max_bytes > 0 ? route_cache_create(c->cache_max_bytes, c->cache_ttl_s)
                                                            : NULL;
        old_rcache = r->rcache;
        r->rcache = NULL;
        if (c->cache_url) {
            char err[ERR_MSG_MAX];
            r->rcache = route_rcache_create(r->loop, c->cache_url, c->cache_prefix, c->cache_ttl_s,
                                            c->cache_timeout_ms, c->cache_max_bytes, err);
            if (!r->rcache)
                log_error("route: cache: %s (running without a cache)", err);
        }
    }
    rt_table_unref(r->table);
    r->table = t;
    /* Last: its lookups still waiting complete now (as unavailable) and go on with the new table in place. */
    route_rcache_destroy(old_rcache);
    rt_health_sync(r);
}

static void router_apply_plan(struct router *r, struct rt_plan *p)
{
    struct rt_table *t = table_build(r, p, r->table);
    if (!t) {
        log_error("route: out of memory building the routing table; keeping the current one");
        r->m_reload_errors++;
        return;
    }
    int nb = 0;
    for (int i = 0; i < t->n_pools; i++)
        nb += t->pools[i].n;
    if (r->table) {
        r->m_reloads++;
        log_info("route: %s: %d pool(s), %d backend address(es), %d route(s)",
                 p->from_reload ? "config reloaded" : "backend addresses changed", t->n_pools, nb, t->n_routes);
    }
    table_install(r, t);
}




static void respond_json(struct router *r, struct http_conn *c, int status, json_t *o)
{
    char *body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    (void)r;
    if (!body) {
        http_respond(c, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    http_respond(c, status, "application/json", NULL, body, strlen(body));
    free(body);
}

/* ---- small endpoints ------------------------------------------------------------------------------- */

static bool router_any_available(struct router *r)
{
    int64_t now = evloop_now_ms();
    for (int i = 0; i < r->table->n_pools; i++)
        for (int k = 0; k < r->table->pools[i].n; k++)
            if (rt_backend_available(r->table->pools[i].b[k], now))
                return true;
    return false;
}

static void ep_ready(struct router *r, struct http_conn *c)
{
    bool ok = !r->stopping && router_any_available(r);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(r->stopping ? "draining" : ok ? "ready" : "no_backend"));
    respond_json(r, c, ok ? 200 : 503, o);
}

/* The union of the backends' /v1/models (from the health checks) and the routes' model names. */
static json_t *models_union(struct router *r)
{
    json_t *data = json_array();
    json_t *seen = json_object();
    for (int i = 0; i < r->table->n_pools; i++)
        for (int k = 0; k < r->table->pools[i].n; k++) {
            const struct rt_backend *b = r->table->pools[i].b[k];
            size_t idx;
            json_t *m;
            if (!b->models)
                continue;
            json_array_foreach(b->models, idx, m) {
                json_t *id = json_object_get(m, "id");
                if (!json_is_string(id) || json_object_get(seen, json_string_value(id)))
                    continue;
                json_object_set_new(seen, json_string_value(id), json_true());
                json_array_append(data, m);
            }
        }
    for (int i = 0; i < r->table->n_routes; i++) {
        const char *name = r->table->routes[i].model;
        if (!strcmp(name, "*") || json_object_get(seen, name))
            continue;
        json_object_set_new(seen, name, json_true());
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(name));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer(0));
        json_object_set_new(m, "owned_by", json_string("wafer-route"));
        json_array_append_new(data, m);
    }
    json_decref(seen);
    return data;
}

static void ep_models(struct router *r, struct http_conn *c, const char *one, size_t one_len)
{
    json_t *data = models_union(r);
    if (one) {
        size_t idx;
        json_t *m;
        json_array_foreach(data, idx, m) {
            const char *id = json_string_value(json_object_get(m, "id"));
            if (id && strlen(id) == one_len && !memcmp(id, one, one_len)) {
                json_incref(m);
                json_decref(data);
                respond_json(r, c, 200, m);
                return;
            }
        }
        json_decref(data);
        rt_respond_error(r, c, 404, "invalid_request_error", "model_not_found", "model", NULL,
                         "The model '%.*s' does not exist", (int)(one_len > 200 ? 200 : one_len), one);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    respond_json(r, c, 200, o);
}

static void ep_metrics(struct router *r, struct http_conn *c)
{
    size_t len = 0;
    char *text = rt_metrics_render(r, &len);
    if (!text) {
        http_respond(c, 503, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, text, len);
    free(text);
}

static bool ct_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen > blen ? alen : blen;
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned)((i < alen ? (unsigned char)a[i] : 0) ^ (i < blen ? (unsigned char)b[i] : 0));
    return diff == 0;
}

static json_t *rollout_json(const struct rt_table *t)
{
    json_t *arr = json_array();
    for (int i = 0; i < t->n_routes; i++) {
        const struct rt_route *rt = &t->routes[i];
        json_t *o = json_object(), *split = json_object(), *fb = json_array();
        for (int k = 0; k < rt->n_split; k++)
            json_object_set_new(split, t->pools[rt->pool[k]].name, json_real(rt->weight[k]));
        for (int k = 0; k < rt->n_fallback; k++)
            json_array_append_new(fb, json_string(t->pools[rt->fallback[k]].name));
        json_object_set_new(o, "model", json_string(rt->model));
        json_object_set_new(o, "split", split);
        json_object_set_new(o, "fallback", fb);
        json_object_set_new(o, "sticky", json_string(rt->sticky == ROUTE_STICKY_HEADER ? "header"
                                                     : rt->sticky == ROUTE_STICKY_API_KEY ? "api_key" : "none"));
        json_array_append_new(arr, o);
    }
    json_t *o = json_object();
    json_object_set_new(o, "routes", arr);
    return o;
}

/* PUT /admin/rollout {"model": "m", "split": {"stable": 80, "canary": 20}}: the new split applies to
 * requests that arrive from now on; those in flight keep their pool. */
static void ep_rollout(struct router *r, struct http_conn *c, const struct http_request *req, bool put)
{
    const char *ak = r->table->conf->c.admin_key;
    if (ak) {
        const struct http_header *h = http_request_header(req, "authorization");
        const char *v = h ? h->value : "";
        size_t vl = h ? h->value_len : 0;
        if (vl >= 7 && !strncasecmp(v, "Bearer ", 7))
            v += 7, vl -= 7;
        if (!ct_equal(v, vl, ak, strlen(ak))) {
            r->m_limited[RT_LIM_AUTH]++;
            rt_respond_error(r, c, 401, "invalid_request_error", "invalid_api_key", NULL, NULL,
                             "the admin endpoints need 'Authorization: Bearer <server.admin_key>'");
            return;
        }
    }
    struct rt_table *t = r->table;
    if (!put) {
        respond_json(r, c, 200, rollout_json(t));
        return;
    }
    json_error_t je;
    json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
    const char *model = o ? json_string_value(json_object_get(o, "model")) : NULL;
    json_t *split = o ? json_object_get(o, "split") : NULL;
    if (!o || !json_is_object(o) || !model || !json_is_object(split) || json_object_size(split) == 0) {
        json_decref(o);
        rt_respond_error(r, c, 400, "invalid_request_error", "invalid_body", NULL, NULL,
                         "expected {\"model\": \"name\", \"split\": {\"pool\": weight, ...}}");
        return;
    }
    struct rt_route *rt = NULL;
    for (int i = 0; i < t->n_routes; i++)
        if (!strcmp(t->routes[i].model, model))
            rt = &t->routes[i];
    if (!rt) {
        rt_respond_error(r, c, 404, "invalid_request_error", "route_not_found", "model", NULL,
                         "no route for model '%s' (routes are defined in the config file)", model);
        json_decref(o); /* model points into it */
        return;
    }
    int n = (int)json_object_size(split);
    int *np = calloc((size_t)n, sizeof *np);
    double *nw = calloc((size_t)n, sizeof *nw);
    const char **nn = calloc((size_t)n, sizeof *nn);
    int64_t *ns = calloc((size_t)n, sizeof *ns);
    int k = 0;
    double total = 0;
    const char *pname;
    json_t *w;
    const char *bad = NULL;
    if (np && nw && nn && ns) {
        json_object_foreach(split, pname, w) {
            int pi = -1;
            for (int i = 0; i < t->n_pools; i++)
                if (!strcmp(t->pools[i].name, pname))
                    pi = i;
            if (pi < 0 || !json_is_number(w) || json_number_value(w) < 0 || json_number_value(w) > 1e6) {
                bad = pname;
                break;
            }
            np[k] = pi;
            nw[k] = json_number_value(w);
            nn[k] = t->pools[pi].name;
            total += nw[k];
            k++;
        }
    }
    if (!np || !nw || !nn || !ns || bad || total <= 0) {
        free(np), free(nw), free(nn), free(ns);
        if (bad)
            rt_respond_error(r, c, 400, "invalid_request_error", "invalid_split", "split", NULL,
                             "split: '%s' is not a pool with a weight in [0, 1000000]", bad);
        else
            rt_respond_error(r, c, 400, "invalid_request_error", "invalid_split", "split", NULL,
                             "split: the weights must not all be 0");
        json_decref(o);
        return;
    }
    free(rt->pool), free(rt->weight), free(rt->names), free(rt->swrr);
    rt->pool = np, rt->weight = nw, rt->names = nn, rt->swrr = ns;
    rt->n_split = n;
    char desc[512] = "";
    for (int i = 0; i < n; i++)
        snprintf(desc + strlen(desc), sizeof desc - strlen(desc), "%s%s=%g", i ? " " : "", nn[i], nw[i]);
    log_info("route: rollout for model '%s' set to %s (PUT /admin/rollout)", model, desc);
    json_decref(o);
    respond_json(r, c, 200, rollout_json(t));
}

/* ---- HTTP callbacks -------------------------------------------------------------------------------- */

/* ---- observability: /v1/alerts, /v1/stats, /dashboard (route_observe.c) ------------------------------- */

static void ep_alerts(struct router *r, struct http_conn *c)
{
    size_t len = 0;
    char *body = rt_observe_alerts_json(r->observe, &len);
    if (!body) {
        http_respond(c, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    http_respond(c, 200, "application/json", "Cache-Control: no-store\r\n", body, len);
    free(body);
}

static void ep_stats(struct router *r, struct http_conn *c, const struct http_request *req)
{
    double window = 10;
    for (const char *p = req->query, *end = req->query + req->query_len; p && p < end;) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        size_t n = amp ? (size_t)(amp - p) : (size_t)(end - p);
        if (n > 7 && n < 48 && !memcmp(p, "window=", 7)) {
            char v[48], *e;
            snprintf(v, sizeof v, "%.*s", (int)(n - 7), p + 7);
            double x = strtod(v, &e);
            if (*e || !(x >= 1 && x <= 900)) {
                rt_respond_error(r, c, 400, "invalid_request_error", "invalid_value", "window", NULL,
                                 "'window' must be a number of seconds in [1, 900], got '%s'", v);
                return;
            }
            window = x;
        }
        p += n + 1;
    }
    respond_json(r, c, 200, rt_observe_stats(r->observe, window));
}

static void ep_dashboard(struct http_conn *c)
{
    size_t len;
    const char *page = rt_dashboard_html(&len);
    http_respond(c, 200, "text/html; charset=utf-8", "Cache-Control: no-store\r\n", page, len);
}

static bool path_is(const struct http_request *req, const char *p)
{
    return req->path_len == strlen(p) && !memcmp(req->path, p, req->path_len);
}

static bool method_is(const struct http_request *req, const char *m)
{
    return req->method_len == strlen(m) && !memcmp(req->method, m, req->method_len);
}

static void on_request(void *ctx, struct http_conn *c, const struct http_request *req)
{
    struct router *r = ctx;
    static const struct {
        const char *path, *allow;
    } known[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/models", "GET"},
                 {"/health", "GET"},          {"/ready", "GET"},                {"/metrics", "GET"},
                 {"/admin/rollout", "GET, PUT"}, {"/v1/alerts", "GET"}, {"/alerts", "GET"},
                 {"/v1/stats", "GET"}, {"/dashboard", "GET"}};
    bool get = method_is(req, "GET") || method_is(req, "HEAD");
    if (r->models && rt_models_request(r, c, req))
        return;
    if (path_is(req, "/v1/completions") && method_is(req, "POST"))
        rt_proxy_start(r, c, req, RT_EP_COMPLETIONS);
    else if (path_is(req, "/v1/chat/completions") && method_is(req, "POST"))
        rt_proxy_start(r, c, req, RT_EP_CHAT);
    else if (path_is(req, "/v1/models") && get)
        ep_models(r, c, NULL, 0);
    else if (req->path_len > 11 && !memcmp(req->path, "/v1/models/", 11) && get)
        ep_models(r, c, req->path + 11, req->path_len - 11);
    else if (path_is(req, "/health") && get) {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        json_object_set_new(o, "version", json_string(version_get()));
        json_object_set_new(o, "commit", json_string(version_commit_get()));
        json_object_set_new(o, "mode", json_string(r->models ? "models" : "route"));
        respond_json(r, c, 200, o);
    } else if (path_is(req, "/ready") && get)
        ep_ready(r, c);
    else if (path_is(req, "/metrics") && get)
        ep_metrics(r, c);
    else if (path_is(req, "/admin/rollout") && (get || method_is(req, "PUT")))
        ep_rollout(r, c, req, method_is(req, "PUT"));
    else if ((path_is(req, "/v1/alerts") || path_is(req, "/alerts")) && get)
        ep_alerts(r, c);
    else if (path_is(req, "/v1/stats") && get)
        ep_stats(r, c, req);
    else if (path_is(req, "/dashboard") && get)
        ep_dashboard(c);
    else {
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (path_is(req, known[i].path)) {
                char allow[64];
                snprintf(allow, sizeof allow, "Allow: %s\r\n", known[i].allow);
                rt_respond_error(r, c, 405, "invalid_request_error", "method_not_allowed", NULL, allow,
                                 "%.*s is not allowed on %s (use %s)", (int)req->method_len, req->method,
                                 known[i].path, known[i].allow);
                return;
            }
        rt_respond_error(r, c, 404, "invalid_request_error", "not_found", NULL, NULL,
                         "no route %.*s %.*s on this router", (int)req->method_len, req->method,
                         (int)(req->path_len > 200 ? 200 : req->path_len), req->path);
    }
}

static void on_close(void *ctx, struct http_conn *c)
{
    struct rt_req *q = http_conn_data(c);
    if (q)
        rt_proxy_on_close(ctx, q);
}

static void on_writable(void *ctx, struct http_conn *c)
{
    struct rt_req *q = http_conn_data(c);
    if (q)
        rt_proxy_on_writable(ctx, q);
}

static void on_wake(void *ctx)
{
    struct router *r = ctx;
    struct rt_plan *p = atomic_exchange(&r->pending, NULL);
    if (p) {
        router_apply_plan(r, p);
        rt_plan_free(p);
    }
}

/* ---- main thread ----------------------------------------------------------------------------------- */

struct io_arg {
    struct http_server *http;
    struct router *r;
    int rc;
};

static void *io_thread(void *p)
{
    struct io_arg *a = p;
    a->rc = http_server_run(a->http);
    rt_models_shutdown(a->r); /* on this thread: the children die with the thread that forked them */
    return NULL;
}

static void router_post(struct router *r, struct rt_plan *p)
{
    struct rt_plan *old = atomic_exchange(&r->pending, p);
    rt_plan_free(old);
    http_server_wake(r->http);
}

static bool conf_has_names(const struct route_config *c)
{
    for (int i = 0; i < c->n_pools; i++)
        for (int j = 0; j < c->pools[i].n_urls; j++) {
            char host[256], prefix[256];
            int port;
            struct in6_addr tmp;
            if (!route_url_parse(c->pools[i].urls[j], host, sizeof host, &port, prefix, sizeof prefix) &&
                inet_pton(AF_INET, host, &tmp) != 1 && inet_pton(AF_INET6, host, &tmp) != 1)
                return true;
        }
    return false;
}

static struct rt_conf *conf_wrap(struct route_config *cfg)
{
    struct rt_conf *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    atomic_init(&k->refs, 1);
    k->c = *cfg;
    memset(cfg, 0, sizeof *cfg);
    return k;
}

int route_run(struct route_config *cfg)
{
    return rt_run(cfg, NULL);
}

int rt_run(struct route_config *cfg, struct route_models_config *mc)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct router *r = calloc(1, sizeof *r);
    struct rt_conf *conf = conf_wrap(cfg);
    if (!r || !conf) {
        log_error("route: out of memory");
        free(r);
        rt_conf_unref(conf);
        return 1;
    }
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    r->rng = seed;
    int rc = 1;
    char err[ERR_MSG_MAX];
    const struct route_config *c = &conf->c;
    struct http_server_params hp;
    http_server_params_default(&hp);
    hp.host = c->host;
    hp.port = c->port;
    hp.max_connections = c->max_connections;
    hp.max_body_bytes = (size_t)c->max_body;
    hp.idle_timeout_ms = 120000;
    hp.on_request = on_request;
    hp.on_close = on_close;
    hp.on_wake = on_wake;
    hp.on_writable = on_writable;
    hp.ctx = r;
    r->http = http_server_create(&hp, err);
    if (!r->http) {
        log_error("route: %s", err); /* err names the address */
        goto out;
    }
    r->loop = evloop_create(r->http, err); /* upstream sockets and timers in the server's own epoll set */
    if (!r->loop) {
        log_error("%s", err);
        goto out;
    }
    struct rt_plan *plan = plan_create(conf, true);
    if (!plan) {
        log_error("route: out of memory");
        goto out;
    }
    uint64_t sig_addrs = plan_signature(plan);
    router_apply_plan(r, plan); /* before the I/O thread starts: nothing else touches r yet */
    rt_plan_free(plan);
    if (!r->table) {
        log_error("route: out of memory");
        goto out;
    }
    char ext[300];
    snprintf(ext, sizeof ext, "http://%s:%d", c->host, http_server_port(r->http));
    r->observe = rt_observe_create(r, conf, ext, err);
    if (!r->observe) {
        log_error("route: %s", err);
        goto out;
    }
    static const struct rt_models_hooks hooks = {rt_proxy_go, rt_proxy_refuse};
    if (mc && !(r->models = rt_models_create(r, mc, &hooks, err))) {
        log_error("models: %s", err);
        goto out;
    }
    /* The I/O thread allocates and frees a few KiB per request in its own arena; by default glibc gives the
     * arena's top back to the system after each burst and grows it again on the next (sysmalloc and
     * mprotect on the hot path, about a quarter of the router's user time at 1,000 requests/s) */
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_TOP_PAD, 4 << 20);
    struct io_arg io = {.http = r->http, .r = r, .rc = 0};
    pthread_t tid;
    if (pthread_create(&tid, NULL, io_thread, &io)) {
        log_error("route: cannot start the I/O thread");
        goto out;
    }
    int nb = 0;
    for (int i = 0; i < r->table->n_pools; i++)
        nb += r->table->pools[i].n;
    if (r->models)
        log_info("models: listening on http://%s:%d (%d model(s); they load on request or POST /admin/models/load)",
                 c->host, http_server_port(r->http), r->table->n_pools);
    else
        log_info("route: listening on http://%s:%d (%d pool(s), %d backend address(es), %d route(s))", c->host,
                 http_server_port(r->http), r->table->n_pools, nb, r->table->n_routes);

    bool stopping = false;
    int64_t next_dns = evloop_now_ms() + (int64_t)(conf->c.dns_refresh_s * 1000);
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            if (!stopping) {
                log_info("route: %s: draining requests in flight for up to %d s (signal again to stop now)",
                         sig == SIGTERM ? "SIGTERM" : "SIGINT", ROUTE_DRAIN_MS / 1000);
                http_server_stop(r->http, ROUTE_DRAIN_MS);
                stopping = true;
            } else {
                http_server_stop(r->http, 0);
            }
        } else if (sig == SIGHUP && !stopping) {
            if (!conf->c.source) {
                log_warn("route: SIGHUP: no config file to reload (started with flags only)");
            } else {
                struct route_config nc;
                route_config_init(&nc);
                char e2[ERR_MSG_MAX];
                int lrc = route_config_load_file(&nc, conf->c.source, e2);
                if (!lrc)
                    lrc = route_config_check(&nc, e2);
                if (lrc) {
                    log_error("route: SIGHUP: %s (keeping the running config)", e2);
                    route_config_deinit(&nc);
                } else {
                    if (nc.port != conf->c.port || strcmp(nc.host, conf->c.host))
                        log_warn("route: SIGHUP: server.host/port changes need a restart (still on %s:%d)",
                                 conf->c.host, conf->c.port);
                    struct rt_conf *k = conf_wrap(&nc);
                    struct rt_plan *p = k ? plan_create(k, true) : NULL;
                    if (!p) {
                        log_error("route: SIGHUP: out of memory");
                        route_config_deinit(&nc); /* still nc's when conf_wrap failed; empty otherwise */
                        rt_conf_unref(k);
                    } else {
                        rt_conf_unref(conf);
                        conf = rt_conf_ref(k);
                        rt_conf_unref(k);
                        sig_addrs = plan_signature(p);
                        router_post(r, p);
                    }
                }
            }
        }
        if (pthread_tryjoin_np(tid, NULL) == 0)
            break;
        if (!stopping && conf->c.dns_refresh_s > 0 && evloop_now_ms() >= next_dns) {
            next_dns = evloop_now_ms() + (int64_t)(conf->c.dns_refresh_s * 1000);
            if (conf_has_names(&conf->c)) {
                struct rt_plan *p = plan_create(conf, false);
                if (p && plan_signature(p) != sig_addrs) {
                    sig_addrs = plan_signature(p);
                    router_post(r, p);
                } else {
                    rt_plan_free(p);
                }
            }
        }
    }
    rc = io.rc ? 1 : 0;
out:
    if (r->http) {
        rt_proxy_cancel_all(r);
        for (struct rt_backend *b = r->backends; b; b = b->next)
            rt_health_stop(r, b);
        evloop_unhost(r->loop); /* what is torn down below only forgets its watchers */
        http_server_destroy(r->http);
    }
    rt_observe_destroy(r->observe); /* the I/O thread has ended: its timer goes with the loop */
    rt_plan_free(atomic_exchange(&r->pending, NULL));
    while (r->backends) {
        struct rt_backend *b = r->backends;
        r->backends = b->next;
        if (r->loop)
            up_target_close_idle(r->loop, &b->target);
        json_decref(b->models);
        free(b->probe_body);
        free(b);
    }
    rt_models_destroy(r->models); /* after the requests: they release their models */
    rt_table_unref(r->table);
    route_cache_destroy(r->cache);
    route_rcache_destroy(r->rcache);
    route_limits_destroy(r->limits);
    evloop_destroy(r->loop);
    rt_conf_unref(conf);
    free(r);
    log_info("route: stopped");
    return rc;
}
