/*
 * route_config: YAML (libfyaml document API) into struct route_config.
 *
 * The flat sections (server, retries, timeouts, health, cache, resume, dns) go through one table of keys
 * (section, key, kind, bounds), so every number is range-checked the same way and an unknown key is an
 * error that lists the known ones (a typo must not fall back to a default). pools, routes and limits are
 * lists of mappings, walked by hand. Messages carry "file:line: section.key:"; a list or mapping node has no
 * line of its own in libfyaml's document API, so it is reported at the line of the key that holds it.
 */
#include "core/alert.h"
#include "route/route_config.h"

#include "core/err.h"
#include "core/flags.h"
#include "core/redis_url.h"
#include "core/yaml.h"

#include <ctype.h>
#include <errno.h>
#include <libfyaml.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum rk_kind { RK_STR, RK_INT, RK_FLOAT, RK_BOOL, RK_BYTES, RK_PATH, RK_REDIS_URL };

struct rk_item {
    const char *section, *key;
    enum rk_kind kind;
    size_t off;
    double lo, hi;
};

#define ROFF(f) offsetof(struct route_config, f)

static const struct rk_item rk_items[] = {
    {"server", "host", RK_STR, ROFF(host), 0, 0},
    {"server", "port", RK_INT, ROFF(port), 0, 65535},
    {"server", "max_connections", RK_INT, ROFF(max_connections), 1, 1000000},
    {"server", "max_body", RK_BYTES, ROFF(max_body), 1024, 1e9},
    {"server", "admin_key", RK_STR, ROFF(admin_key), 0, 0},
    {"server", "log_requests", RK_BOOL, ROFF(log_requests), 0, 0},
    {"retries", "max", RK_INT, ROFF(retry_max), 0, 100},
    {"retries", "base_ms", RK_INT, ROFF(retry_base_ms), 0, 600000},
    {"retries", "cap_ms", RK_INT, ROFF(retry_cap_ms), 0, 600000},
    {"timeouts", "connect_ms", RK_INT, ROFF(connect_timeout_ms), 1, 600000},
    {"timeouts", "header_ms", RK_INT, ROFF(header_timeout_ms), 1, 86400000},
    {"timeouts", "idle_ms", RK_INT, ROFF(idle_timeout_ms), 1, 86400000},
    {"health", "path", RK_PATH, ROFF(health_path), 0, 0},
    {"health", "interval_s", RK_FLOAT, ROFF(health_interval_s), 0, 86400},
    {"health", "timeout_ms", RK_INT, ROFF(health_timeout_ms), 1, 600000},
    {"health", "eject_after", RK_INT, ROFF(eject_after), 0, 1000000},
    {"health", "cooldown_s", RK_FLOAT, ROFF(cooldown_s), 0.001, 86400},
    {"health", "cooldown_max_s", RK_FLOAT, ROFF(cooldown_max_s), 0.001, 86400 * 7},
    {"cache", "max_bytes", RK_BYTES, ROFF(cache_max_bytes), 0, 1e12},
    {"cache", "ttl_s", RK_FLOAT, ROFF(cache_ttl_s), 0.001, 86400 * 365},
    {"cache", "url", RK_REDIS_URL, ROFF(cache_url), 0, 0},
    {"cache", "prefix", RK_STR, ROFF(cache_prefix), 0, 0},
    {"cache", "timeout_ms", RK_INT, ROFF(cache_timeout_ms), 1, 60000},
    {"resume", "enabled", RK_BOOL, ROFF(resume), 0, 0},
    {"dns", "refresh_s", RK_FLOAT, ROFF(dns_refresh_s), 0, 86400},
};
#define RK_N ((int)(sizeof rk_items / sizeof rk_items[0]))

static const char *const rk_sections[] = {"server", "pools", "routes", "retries", "timeouts", "health",
                                          "cache", "limits", "resume", "dns"};
#define RK_N_SECTIONS ((int)(sizeof rk_sections / sizeof rk_sections[0]))

void route_config_init(struct route_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = strdup("127.0.0.1");
    c->port = 8080;
    c->max_connections = 16384;
    c->max_body = 8 << 20;
    c->log_requests = true;
    c->retry_max = 2;
    c->retry_base_ms = 25;
    c->retry_cap_ms = 250;
    c->connect_timeout_ms = 2000;
    c->header_timeout_ms = 600000;
    c->idle_timeout_ms = 60000;
    c->health_path = strdup("/ready");
    c->health_interval_s = 2;
    c->health_timeout_ms = 2000;
    c->eject_after = 5;
    c->cooldown_s = 5;
    c->cooldown_max_s = 300;
    c->cache_max_bytes = 0;
    c->cache_ttl_s = 600;
    c->cache_prefix = strdup("wafer:route:cache:");
    c->cache_timeout_ms = 100;
    c->resume = true;
    c->dns_refresh_s = 30;
}

static void split_list_free(struct route_split_conf *s, int n)
{
    for (int i = 0; i < n; i++)
        free(s[i].pool_name);
    free(s);
}

static void pools_free(struct route_config *c)
{
    for (int i = 0; i < c->n_pools; i++) {
        free(c->pools[i].name);
        for (int k = 0; k < c->pools[i].n_urls; k++)
            free(c->pools[i].urls[k]);
        free(c->pools[i].urls);
    }
    free(c->pools);
    c->pools = NULL;
    c->n_pools = 0;
}

static void routes_free(struct route_config *c)
{
    for (int i = 0; i < c->n_routes; i++) {
        struct route_rule_conf *r = &c->routes[i];
        free(r->model);
        split_list_free(r->split, r->n_split);
        split_list_free(r->fallback, r->n_fallback);
        free(r->sticky_header);
    }
    free(c->routes);
    c->routes = NULL;
    c->n_routes = 0;
}

static void keys_free(struct route_config *c)
{
    for (int i = 0; i < c->n_keys; i++)
        free(c->keys[i].key);
    free(c->keys);
    c->keys = NULL;
    c->n_keys = 0;
}

void route_config_deinit(struct route_config *c)
{
    free(c->source);
    free(c->host);
    free(c->admin_key);
    free(c->health_path);
    free(c->cache_url);
    free(c->cache_prefix);
    pools_free(c);
    routes_free(c);
    keys_free(c);
    if (c->alerts) {
        alert_config_deinit(c->alerts);
        free(c->alerts);
    }
    memset(c, 0, sizeof *c);
}

/* ---- scalars --------------------------------------------------------------------------------------- */

static int rk_apply(struct route_config *c, const struct rk_item *it, const char *v, const char *where, char *err)
{
    char *p = (char *)c + it->off;
    switch (it->kind) {
    case RK_STR:
    case RK_PATH:
    case RK_REDIS_URL: {
        if (!*v)
            return err_set(err, ERR_INVALID_ARG, "%s: must not be empty", where);
        if (it->kind == RK_PATH && v[0] != '/')
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' must be a path starting with /", where, v);
        struct redis_url u;
        char e2[ERR_MSG_MAX];
        if (it->kind == RK_REDIS_URL && redis_url_parse(v, &u, e2))
            return err_set(err, ERR_INVALID_ARG, "%s: %s", where, e2);
        char *s = strdup(v);
        if (!s)
            return ERR_NOMEM;
        free(*(char **)p);
        *(char **)p = s;
        return 0;
    }
    case RK_INT: {
        errno = 0;
        char *end;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || x < (long long)it->lo || x > (long long)it->hi)
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not an integer in [%.0f, %.0f]", where, v, it->lo,
                           it->hi);
        *(int *)p = (int)x;
        return 0;
    }
    case RK_FLOAT: {
        errno = 0;
        char *end;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x) || x < it->lo || x > it->hi)
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not a number in [%g, %g]", where, v, it->lo, it->hi);
        *(double *)p = x;
        return 0;
    }
    case RK_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on"))
            *(bool *)p = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off"))
            *(bool *)p = false;
        else
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not a boolean (true or false)", where, v);
        return 0;
    case RK_BYTES: {
        int64_t x;
        if (flags_bytes_parse(v, &x) || x < (int64_t)it->lo || (double)x > it->hi)
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not a size (bytes, or a number with K/M/G/KiB/MiB/GiB) "
                           "in [%.0f, %.0f]", where, v, it->lo, it->hi);
        *(int64_t *)p = x;
        return 0;
    }
    }
    return ERR_INTERNAL;
}

/* ---- YAML helpers ---------------------------------------------------------------------------------- */

struct rc_ctx {
    struct route_config *c;
    const char *name; /* file name for messages */
    const char *base; /* the file's path, for relative key_file paths; NULL for strings */
    char *err;
};

/* The line of a mapping: its first key's. */
static int map_line(struct fy_node *n, int dflt)
{
    if (n && fy_node_is_mapping(n)) {
        void *it = NULL;
        struct fy_node_pair *p = fy_node_mapping_iterate(n, &it);
        int l = p ? yaml_scalar_line(fy_node_pair_key(p)) : 0;
        if (l)
            return l;
    }
    int l = yaml_scalar_line(n);
    return l ? l : dflt;
}

static int rc_err(struct rc_ctx *x, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rc_err(struct rc_ctx *x, int line, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(x->err, ERR_INVALID_ARG, "%s:%d: %s", x->name, line, msg);
}

static void *grow(void *p, int n, size_t size)
{
    return realloc(p, (size_t)(n + 1) * size);
}

/* ---- flat sections --------------------------------------------------------------------------------- */

static int rc_flat_section(struct rc_ctx *x, const char *sect, struct fy_node *map, int line)
{
    if (!map || !fy_node_is_mapping(map))
        return rc_err(x, line, "%s: must be a mapping of keys (e.g. %s: {key: value})", sect, sect);
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(map, &iter))) {
        struct fy_node *k = fy_node_pair_key(pair), *v = fy_node_pair_value(pair);
        char key[128], val[4096], where[600];
        int kl = yaml_scalar_line(k);
        if (!yaml_scalar(k, key, sizeof key))
            return rc_err(x, line, "%s: keys must be plain words", sect);
        const struct rk_item *it = NULL;
        for (int i = 0; i < RK_N; i++)
            if (!strcmp(rk_items[i].section, sect) && !strcmp(rk_items[i].key, key))
                it = &rk_items[i];
        if (!it) {
            char known[512] = "";
            for (int i = 0; i < RK_N; i++)
                if (!strcmp(rk_items[i].section, sect)) {
                    if (known[0])
                        strncat(known, ", ", sizeof known - strlen(known) - 1);
                    strncat(known, rk_items[i].key, sizeof known - strlen(known) - 1);
                }
            return rc_err(x, kl, "unknown key '%s' in section '%s' (known: %s)", key, sect, known);
        }
        snprintf(where, sizeof where, "%s:%d: %s.%s", x->name, yaml_scalar_line(v) ? yaml_scalar_line(v) : kl, sect, key);
        if (!yaml_scalar(v, val, sizeof val))
            return err_set(x->err, ERR_INVALID_ARG, "%s: must be a single value (not a list, mapping or empty)",
                           where);
        int rc = rk_apply(x->c, it, val, where, x->err);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- pools ----------------------------------------------------------------------------------------- */

static int pool_add_url(struct route_config *c, struct route_pool_conf *p, const char *url)
{
    char **nu = grow(p->urls, p->n_urls, sizeof *nu);
    if (!nu)
        return ERR_NOMEM;
    p->urls = nu;
    if (!(p->urls[p->n_urls] = strdup(url)))
        return ERR_NOMEM;
    p->n_urls++;
    (void)c;
    return 0;
}

static int rc_pools(struct rc_ctx *x, struct fy_node *seq, int line)
{
    struct route_config *c = x->c;
    if (!seq || !fy_node_is_sequence(seq))
        return rc_err(x, line, "pools: must be a list of {name, backends} mappings");
    pools_free(c);
    void *si = NULL;
    struct fy_node *e;
    while ((e = fy_node_sequence_iterate(seq, &si))) {
        int el = map_line(e, line);
        if (!fy_node_is_mapping(e))
            return rc_err(x, el, "pools: each entry must be a mapping {name: ..., backends: [...]}");
        struct route_pool_conf *np = grow(c->pools, c->n_pools, sizeof *np);
        if (!np)
            return ERR_NOMEM;
        c->pools = np;
        struct route_pool_conf *p = &c->pools[c->n_pools++];
        memset(p, 0, sizeof *p);
        p->wafer = true;
        p->line = el;
        void *it = NULL;
        struct fy_node_pair *pair;
        bool have_backends = false;
        while ((pair = fy_node_mapping_iterate(e, &it))) {
            char key[64], val[1024];
            int kl = yaml_scalar_line(fy_node_pair_key(pair));
            struct fy_node *v = fy_node_pair_value(pair);
            if (!yaml_scalar(fy_node_pair_key(pair), key, sizeof key))
                return rc_err(x, el, "pools: keys must be plain words");
            if (!strcmp(key, "name")) {
                if (!yaml_scalar(v, val, sizeof val) || !val[0])
                    return rc_err(x, kl, "pools.name: must be a non-empty string");
                free(p->name);
                p->name = strdup(val);
            } else if (!strcmp(key, "kind")) {
                if (!yaml_scalar(v, val, sizeof val) || (strcmp(val, "wafer") && strcmp(val, "openai")))
                    return rc_err(x, kl, "pools.kind: must be wafer or openai");
                p->wafer = !strcmp(val, "wafer");
            } else if (!strcmp(key, "backends")) {
                have_backends = true;
                if (v && fy_node_is_sequence(v)) {
                    void *bi = NULL;
                    struct fy_node *b;
                    while ((b = fy_node_sequence_iterate(v, &bi))) {
                        int bl = yaml_scalar_line(b) ? yaml_scalar_line(b) : kl;
                        char host[256], prefix[256];
                        int port;
                        if (!yaml_scalar(b, val, sizeof val))
                            return rc_err(x, bl, "pools.backends: entries must be URLs (http://host:port)");
                        if (route_url_parse(val, host, sizeof host, &port, prefix, sizeof prefix))
                            return rc_err(x, bl, "pools.backends: '%s' is not an http://host:port URL", val);
                        if (pool_add_url(c, p, val))
                            return ERR_NOMEM;
                    }
                } else if (yaml_scalar(v, val, sizeof val)) {
                    char host[256], prefix[256];
                    int port;
                    if (route_url_parse(val, host, sizeof host, &port, prefix, sizeof prefix))
                        return rc_err(x, kl, "pools.backends: '%s' is not an http://host:port URL", val);
                    if (pool_add_url(c, p, val))
                        return ERR_NOMEM;
                } else {
                    return rc_err(x, kl, "pools.backends: must be a list of URLs");
                }
            } else {
                return rc_err(x, kl, "unknown key '%s' in a pool (known: name, backends, kind)", key);
            }
        }
        if (!p->name)
            return rc_err(x, el, "pools: an entry has no name");
        if (!have_backends || p->n_urls == 0)
            return rc_err(x, el, "pools: pool '%s' has no backends", p->name);
        for (int i = 0; i < c->n_pools - 1; i++)
            if (!strcmp(c->pools[i].name, p->name))
                return rc_err(x, el, "pools: pool '%s' is defined twice (first at line %d)", p->name,
                              c->pools[i].line);
    }
    return 0;
}

/* ---- routes ---------------------------------------------------------------------------------------- */

static int split_add(struct route_split_conf **list, int *n, const char *pool, double w, int line)
{
    struct route_split_conf *nl = grow(*list, *n, sizeof *nl);
    if (!nl)
        return ERR_NOMEM;
    *list = nl;
    struct route_split_conf *s = &nl[(*n)++];
    memset(s, 0, sizeof *s);
    s->pool_name = strdup(pool);
    s->pool = -1;
    s->weight = w;
    s->line = line;
    return s->pool_name ? 0 : ERR_NOMEM;
}

static int rc_routes(struct rc_ctx *x, struct fy_node *seq, int line)
{
    struct route_config *c = x->c;
    if (!seq || !fy_node_is_sequence(seq))
        return rc_err(x, line, "routes: must be a list of {model, split | pool, fallback, sticky} mappings");
    routes_free(c);
    void *si = NULL;
    struct fy_node *e;
    while ((e = fy_node_sequence_iterate(seq, &si))) {
        int el = map_line(e, line);
        if (!fy_node_is_mapping(e))
            return rc_err(x, el, "routes: each entry must be a mapping {model: ..., split: {...}}");
        struct route_rule_conf *nr = grow(c->routes, c->n_routes, sizeof *nr);
        if (!nr)
            return ERR_NOMEM;
        c->routes = nr;
        struct route_rule_conf *r = &c->routes[c->n_routes++];
        memset(r, 0, sizeof *r);
        r->line = el;
        void *it = NULL;
        struct fy_node_pair *pair;
        while ((pair = fy_node_mapping_iterate(e, &it))) {
            char key[64], val[1024];
            int kl = yaml_scalar_line(fy_node_pair_key(pair));
            struct fy_node *v = fy_node_pair_value(pair);
            if (!yaml_scalar(fy_node_pair_key(pair), key, sizeof key))
                return rc_err(x, el, "routes: keys must be plain words");
            if (!strcmp(key, "model")) {
                if (!yaml_scalar(v, val, sizeof val) || !val[0])
                    return rc_err(x, kl, "routes.model: must be a model name or \"*\"");
                free(r->model);
                r->model = strdup(val);
            } else if (!strcmp(key, "pool")) {
                if (!yaml_scalar(v, val, sizeof val) || !val[0])
                    return rc_err(x, kl, "routes.pool: must be a pool name");
                if (r->n_split)
                    return rc_err(x, kl, "routes: give either pool or split, not both");
                if (split_add(&r->split, &r->n_split, val, 100, kl))
                    return ERR_NOMEM;
            } else if (!strcmp(key, "split")) {
                if (r->n_split)
                    return rc_err(x, kl, "routes: give either pool or split, not both");
                if (!v || !fy_node_is_mapping(v))
                    return rc_err(x, kl, "routes.split: must be a mapping {pool: weight, ...}");
                void *wi = NULL;
                struct fy_node_pair *wp;
                double total = 0;
                while ((wp = fy_node_mapping_iterate(v, &wi))) {
                    char pn[256], wv[64];
                    int wl = yaml_scalar_line(fy_node_pair_key(wp));
                    if (!yaml_scalar(fy_node_pair_key(wp), pn, sizeof pn) || !yaml_scalar(fy_node_pair_value(wp), wv, sizeof wv))
                        return rc_err(x, wl ? wl : kl, "routes.split: entries must be pool: weight");
                    char *end;
                    errno = 0;
                    double w = strtod(wv, &end);
                    if (*end || errno || !isfinite(w) || w < 0 || w > 1e6)
                        return rc_err(x, wl, "routes.split.%s: '%s' is not a weight in [0, 1000000]", pn, wv);
                    total += w;
                    if (split_add(&r->split, &r->n_split, pn, w, wl))
                        return ERR_NOMEM;
                }
                if (r->n_split == 0 || total <= 0)
                    return rc_err(x, kl, "routes.split: the weights must not all be 0");
            } else if (!strcmp(key, "fallback")) {
                if (v && fy_node_is_sequence(v)) {
                    void *fi = NULL;
                    struct fy_node *f;
                    while ((f = fy_node_sequence_iterate(v, &fi))) {
                        if (!yaml_scalar(f, val, sizeof val) || !val[0])
                            return rc_err(x, yaml_scalar_line(f) ? yaml_scalar_line(f) : kl, "routes.fallback: entries must be pool names");
                        if (split_add(&r->fallback, &r->n_fallback, val, 0, yaml_scalar_line(f) ? yaml_scalar_line(f) : kl))
                            return ERR_NOMEM;
                    }
                } else if (yaml_scalar(v, val, sizeof val) && val[0]) {
                    if (split_add(&r->fallback, &r->n_fallback, val, 0, kl))
                        return ERR_NOMEM;
                } else {
                    return rc_err(x, kl, "routes.fallback: must be a list of pool names");
                }
            } else if (!strcmp(key, "sticky")) {
                if (!yaml_scalar(v, val, sizeof val))
                    return rc_err(x, kl, "routes.sticky: must be header:NAME or api_key");
                if (!strcmp(val, "api_key")) {
                    r->sticky = ROUTE_STICKY_API_KEY;
                } else if (!strncmp(val, "header:", 7) && val[7]) {
                    r->sticky = ROUTE_STICKY_HEADER;
                    free(r->sticky_header);
                    r->sticky_header = strdup(val + 7);
                    for (char *q = r->sticky_header; q && *q; q++)
                        *q = (char)tolower((unsigned char)*q);
                } else if (!strcmp(val, "none") || !val[0]) {
                    r->sticky = ROUTE_STICKY_NONE;
                } else {
                    return rc_err(x, kl, "routes.sticky: '%s' is not header:NAME or api_key", val);
                }
            } else {
                return rc_err(x, kl, "unknown key '%s' in a route (known: model, split, pool, fallback, sticky)", key);
            }
        }
        if (!r->model)
            return rc_err(x, el, "routes: an entry has no model (use \"*\" for any model)");
        if (!r->n_split)
            return rc_err(x, el, "routes: route for model '%s' has neither split nor pool", r->model);
        for (int i = 0; i < c->n_routes - 1; i++)
            if (!strcmp(c->routes[i].model, r->model))
                return rc_err(x, el, "routes: model '%s' is routed twice (first at line %d)", r->model,
                              c->routes[i].line);
    }
    return 0;
}

/* ---- limits ---------------------------------------------------------------------------------------- */

static int key_add(struct route_config *c, const char *key, int64_t rpm, int64_t tpm, int64_t conc)
{
    struct route_key_conf *nk = grow(c->keys, c->n_keys, sizeof *nk);
    if (!nk)
        return ERR_NOMEM;
    c->keys = nk;
    struct route_key_conf *k = &c->keys[c->n_keys++];
    k->key = strdup(key);
    k->rpm = rpm;
    k->tpm = tpm;
    k->concurrent = conc;
    return k->key ? 0 : ERR_NOMEM;
}

/* One key per line ('#' comments and blank lines skipped), no limits. */
static int rc_key_file(struct rc_ctx *x, const char *file, int line)
{
    char path[4096];
    if (file[0] != '/' && x->base && strrchr(x->base, '/'))
        snprintf(path, sizeof path, "%.*s/%s", (int)(strrchr(x->base, '/') - x->base), x->base, file);
    else
        snprintf(path, sizeof path, "%s", file);
    FILE *f = fopen(path, "r");
    if (!f)
        return rc_err(x, line, "limits.key_file: cannot read '%s': %s", path, strerror(errno));
    char buf[4096];
    int added = 0;
    while (fgets(buf, sizeof buf, f)) {
        char *s = buf;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strlen(s);
        while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
            s[--n] = 0;
        if (!n || s[0] == '#')
            continue;
        if (key_add(x->c, s, 0, 0, 0)) {
            fclose(f);
            return ERR_NOMEM;
        }
        added++;
    }
    fclose(f);
    if (!added)
        return rc_err(x, line, "limits.key_file: '%s' holds no key", path);
    return 0;
}

static int rc_limits(struct rc_ctx *x, struct fy_node *map, int line)
{
    struct route_config *c = x->c;
    if (!map || !fy_node_is_mapping(map))
        return rc_err(x, line, "limits: must be a mapping {keys: [...], key_file: path}");
    keys_free(c);
    void *it = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(map, &it))) {
        char key[64], val[1024];
        int kl = yaml_scalar_line(fy_node_pair_key(pair));
        struct fy_node *v = fy_node_pair_value(pair);
        if (!yaml_scalar(fy_node_pair_key(pair), key, sizeof key))
            return rc_err(x, line, "limits: keys must be plain words");
        if (!strcmp(key, "key_file")) {
            if (!yaml_scalar(v, val, sizeof val) || !val[0])
                return rc_err(x, kl, "limits.key_file: must be a path");
            int rc = rc_key_file(x, val, kl);
            if (rc)
                return rc;
        } else if (!strcmp(key, "keys")) {
            if (!v || !fy_node_is_sequence(v))
                return rc_err(x, kl, "limits.keys: must be a list of {key, rpm, tpm, concurrent}");
            void *si = NULL;
            struct fy_node *e;
            while ((e = fy_node_sequence_iterate(v, &si))) {
                int el = map_line(e, kl);
                if (!fy_node_is_mapping(e))
                    return rc_err(x, el, "limits.keys: each entry must be a mapping {key: ..., rpm: N}");
                char kv[1024] = "";
                int64_t lim[3] = {0, 0, 0};
                static const char *const names[3] = {"rpm", "tpm", "concurrent"};
                void *ki = NULL;
                struct fy_node_pair *kp;
                while ((kp = fy_node_mapping_iterate(e, &ki))) {
                    char kk[64];
                    int l2 = yaml_scalar_line(fy_node_pair_key(kp));
                    if (!yaml_scalar(fy_node_pair_key(kp), kk, sizeof kk) || !yaml_scalar(fy_node_pair_value(kp), val, sizeof val))
                        return rc_err(x, el, "limits.keys: entries must map words to single values");
                    if (!strcmp(kk, "key")) {
                        if (!val[0])
                            return rc_err(x, l2, "limits.keys.key: must not be empty");
                        snprintf(kv, sizeof kv, "%s", val);
                        continue;
                    }
                    int idx = -1;
                    for (int i = 0; i < 3; i++)
                        if (!strcmp(kk, names[i]))
                            idx = i;
                    if (idx < 0)
                        return rc_err(x, l2, "unknown key '%s' in limits.keys (known: key, rpm, tpm, concurrent)", kk);
                    char *end;
                    errno = 0;
                    long long n = strtoll(val, &end, 10);
                    if (!val[0] || *end || errno || n < 0 || n > 1000000000000LL)
                        return rc_err(x, l2, "limits.keys.%s: '%s' is not an integer >= 0", kk, val);
                    lim[idx] = n;
                }
                if (!kv[0])
                    return rc_err(x, el, "limits.keys: an entry has no key");
                for (int i = 0; i < c->n_keys; i++)
                    if (!strcmp(c->keys[i].key, kv))
                        return rc_err(x, el, "limits.keys: a key is listed twice");
                if (key_add(c, kv, lim[0], lim[1], lim[2]))
                    return ERR_NOMEM;
            }
        } else {
            return rc_err(x, kl, "unknown key '%s' in section 'limits' (known: keys, key_file)", key);
        }
    }
    return 0;
}

/* ---- alerts ---------------------------------------------------------------------------------------- */

/* Whether the router measures m: it sees requests, their status and their timing at the proxy, not the
 * backends' engines (no tokens, inter-token gaps, queues, KV cache, batch, energy or cost). */
static bool rc_alert_measure_ok(const struct alert_rule *r)
{
    switch (r->measure.kind) {
    case AM_QUANTILE:
    case AM_MEAN: return r->measure.hist == ALERT_H_E2E || r->measure.hist == ALERT_H_TTFT;
    case AM_ERROR_RATE:
    case AM_REQUESTS_PS:
    case AM_RUNNING: return true;
    case AM_BURN_RATE: return r->burn.latency_hist < 0 || r->burn.latency_hist == ALERT_H_E2E ||
                              r->burn.latency_hist == ALERT_H_TTFT;
    default: return false;
    }
}

static int rc_alerts(struct rc_ctx *x, struct fy_node *v)
{
    struct route_config *c = x->c;
    if (!c->alerts) {
        if (!(c->alerts = malloc(sizeof *c->alerts)))
            return err_set(x->err, ERR_NOMEM, "out of memory");
        alert_config_init(c->alerts);
    }
    int rc = alert_config_parse(c->alerts, v, x->name, x->base, x->err);
    if (rc)
        return rc;
    for (int i = 0; i < c->alerts->n_rules; i++) {
        const struct alert_rule *r = &c->alerts->rules[i];
        if (!rc_alert_measure_ok(r))
            return rc_err(x, r->line,
                          "alerts.rules[%d].measure: '%s' is not measured by wafer route (it has error_rate, "
                          "requests_per_second, e2e_pNN_ms, ttft_pNN_ms (time to first byte), e2e_mean_ms, "
                          "ttft_mean_ms, running, burn_rate)",
                          i, r->measure_name);
    }
    return 0;
}

/* ---- document -------------------------------------------------------------------------------------- */

static int rc_doc(struct rc_ctx *x, struct fy_document *doc)
{
    struct fy_node *root = fy_document_root(doc);
    if (!root)
        return 0;
    if (!fy_node_is_mapping(root))
        return rc_err(x, 1, "the top level must be a mapping with sections server, pools, routes, ...");
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(root, &iter))) {
        char key[128];
        int line = yaml_scalar_line(fy_node_pair_key(pair));
        struct fy_node *v = fy_node_pair_value(pair);
        if (!yaml_scalar(fy_node_pair_key(pair), key, sizeof key))
            return rc_err(x, line, "section names must be plain words");
        int rc;
        if (!strcmp(key, "pools"))
            rc = rc_pools(x, v, line);
        else if (!strcmp(key, "routes"))
            rc = rc_routes(x, v, line);
        else if (!strcmp(key, "limits"))
            rc = rc_limits(x, v, line);
        else if (!strcmp(key, "alerts"))
            rc = rc_alerts(x, v);
        else {
            bool known = false;
            for (int i = 0; i < RK_N_SECTIONS; i++)
                known |= !strcmp(rk_sections[i], key);
            if (!known)
                return rc_err(x, line, "unknown section '%s' (known: server, pools, routes, retries, timeouts, "
                                       "health, cache, limits, resume, dns, alerts)", key);
            rc = rc_flat_section(x, key, v, line);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int rc_parse(struct route_config *c, const char *path, const char *yaml, size_t len, const char *name,
                    char *err)
{
    int rc;
    struct fy_document *doc = yaml_load(path, yaml, len, name, &rc, err);
    if (!doc)
        return rc;
    struct rc_ctx x = {.c = c, .name = name, .base = path, .err = err};
    rc = rc_doc(&x, doc);
    fy_document_destroy(doc);
    return rc;
}

int route_config_load_file(struct route_config *c, const char *path, char *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, ERR_IO, "cannot read config file '%s': %s", path, strerror(errno));
    fclose(f);
    free(c->source);
    c->source = strdup(path);
    return rc_parse(c, path, NULL, 0, path, err);
}

int route_config_load_string(struct route_config *c, const char *yaml, size_t len, const char *name, char *err)
{
    return rc_parse(c, NULL, yaml, len, name, err);
}

int route_config_add_backend(struct route_config *c, const char *url, char *err)
{
    char host[256], prefix[256];
    int port;
    if (route_url_parse(url, host, sizeof host, &port, prefix, sizeof prefix))
        return err_set(err, ERR_INVALID_ARG, "--backend: '%s' is not an http://host:port URL", url);
    int pi = -1;
    for (int i = 0; i < c->n_pools; i++)
        if (!strcmp(c->pools[i].name, "default"))
            pi = i;
    if (pi < 0) {
        struct route_pool_conf *np = grow(c->pools, c->n_pools, sizeof *np);
        if (!np)
            return ERR_NOMEM;
        c->pools = np;
        pi = c->n_pools++;
        memset(&c->pools[pi], 0, sizeof c->pools[pi]);
        c->pools[pi].name = strdup("default");
        c->pools[pi].wafer = true;
        bool any = false;
        for (int i = 0; i < c->n_routes; i++)
            any |= !strcmp(c->routes[i].model, "*");
        if (!any) {
            struct route_rule_conf *nr = grow(c->routes, c->n_routes, sizeof *nr);
            if (!nr)
                return ERR_NOMEM;
            c->routes = nr;
            struct route_rule_conf *r = &c->routes[c->n_routes++];
            memset(r, 0, sizeof *r);
            r->model = strdup("*");
            if (split_add(&r->split, &r->n_split, "default", 100, 0))
                return ERR_NOMEM;
        }
    }
    return pool_add_url(c, &c->pools[pi], url);
}

static int pool_index(const struct route_config *c, const char *name)
{
    for (int i = 0; i < c->n_pools; i++)
        if (!strcmp(c->pools[i].name, name))
            return i;
    return -1;
}

int route_config_check(struct route_config *c, char *err)
{
    const char *src = c->source ? c->source : "config";
    if (c->n_pools == 0)
        return err_set(err, ERR_INVALID_ARG, "no backends: give pools in the config file or --backend URL");
    if (c->n_routes == 0)
        return err_set(err, ERR_INVALID_ARG, "%s: no routes: add routes: [{model: \"*\", pool: %s}]", src,
                       c->pools[0].name);
    for (int i = 0; i < c->n_routes; i++) {
        struct route_rule_conf *r = &c->routes[i];
        for (int k = 0; k < r->n_split; k++) {
            r->split[k].pool = pool_index(c, r->split[k].pool_name);
            if (r->split[k].pool < 0)
                return err_set(err, ERR_INVALID_ARG, "%s:%d: routes: model '%s' names pool '%s', which is not defined",
                               src, r->split[k].line, r->model, r->split[k].pool_name);
            for (int j = 0; j < k; j++)
                if (r->split[j].pool == r->split[k].pool)
                    return err_set(err, ERR_INVALID_ARG, "%s:%d: routes.split: pool '%s' is listed twice", src,
                                   r->split[k].line, r->split[k].pool_name);
        }
        for (int k = 0; k < r->n_fallback; k++) {
            r->fallback[k].pool = pool_index(c, r->fallback[k].pool_name);
            if (r->fallback[k].pool < 0)
                return err_set(err, ERR_INVALID_ARG,
                               "%s:%d: routes.fallback: model '%s' names pool '%s', which is not defined", src,
                               r->fallback[k].line, r->model, r->fallback[k].pool_name);
        }
    }
    if (c->retry_cap_ms < c->retry_base_ms)
        return err_set(err, ERR_INVALID_ARG, "%s: retries.cap_ms (%d) must not be below retries.base_ms (%d)", src,
                       c->retry_cap_ms, c->retry_base_ms);
    if (c->cooldown_max_s < c->cooldown_s)
        return err_set(err, ERR_INVALID_ARG, "%s: health.cooldown_max_s must not be below health.cooldown_s", src);
    if (!c->host || !*c->host)
        return err_set(err, ERR_INVALID_ARG, "server.host must not be empty");
    return 0;
}

int route_url_parse(const char *url, char *host, size_t host_cap, int *port, char *prefix, size_t prefix_cap)
{
    if (strncmp(url, "http://", 7) != 0)
        return ERR_INVALID_ARG;
    const char *h = url + 7;
    const char *slash = strchr(h, '/');
    const char *hend = slash ? slash : h + strlen(h);
    if (memchr(h, '@', (size_t)(hend - h)))
        return ERR_INVALID_ARG;
    const char *colon = NULL;
    if (*h == '[') { /* [v6]:port */
        const char *rb = memchr(h, ']', (size_t)(hend - h));
        if (!rb)
            return ERR_INVALID_ARG;
        if ((size_t)(rb - h - 1) >= host_cap || rb == h + 1)
            return ERR_INVALID_ARG;
        memcpy(host, h + 1, (size_t)(rb - h - 1));
        host[rb - h - 1] = 0;
        colon = rb + 1 < hend && rb[1] == ':' ? rb + 1 : NULL;
        if (rb + 1 < hend && !colon)
            return ERR_INVALID_ARG;
    } else {
        colon = memchr(h, ':', (size_t)(hend - h));
        const char *he = colon ? colon : hend;
        if (he == h || (size_t)(he - h) >= host_cap)
            return ERR_INVALID_ARG;
        memcpy(host, h, (size_t)(he - h));
        host[he - h] = 0;
        for (const char *q = host; *q; q++)
            if (!isalnum((unsigned char)*q) && *q != '.' && *q != '-' && *q != '_')
                return ERR_INVALID_ARG;
    }
    *port = 80;
    if (colon) {
        long p = 0;
        const char *q = colon + 1;
        if (q == hend)
            return ERR_INVALID_ARG;
        for (; q < hend; q++) {
            if (!isdigit((unsigned char)*q))
                return ERR_INVALID_ARG;
            p = p * 10 + (*q - '0');
            if (p > 65535)
                return ERR_INVALID_ARG;
        }
        if (p < 1)
            return ERR_INVALID_ARG;
        *port = (int)p;
    }
    size_t pl = slash ? strlen(slash) : 0;
    while (pl && slash[pl - 1] == '/')
        pl--;
    if (pl >= prefix_cap)
        return ERR_INVALID_ARG;
    if (pl)
        memcpy(prefix, slash, pl);
    prefix[pl] = 0;
    for (size_t i = 0; i < pl; i++)
        if ((unsigned char)prefix[i] <= ' ' || prefix[i] == '?' || prefix[i] == '#')
            return ERR_INVALID_ARG;
    return 0;
}
