/*
 * route_models_run: `wafer serve` in models mode, started: the router's settings for the models (a pool
 * and routes per model) and the router run with the manager (route_models.h).
 */
#include "route/route_models.h"

#include "core/err.h"
#include "core/log.h"
#include "route/route_internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the front's config ---------------------------------------------------------------------------- */

static int add_route(struct route_config *rc, const char *model, int pool, const char *pool_name)
{
    struct route_rule_conf *nr = realloc(rc->routes, (size_t)(rc->n_routes + 1) * sizeof *nr);
    if (!nr)
        return ERR_NOMEM;
    rc->routes = nr;
    struct route_rule_conf *r = &rc->routes[rc->n_routes];
    memset(r, 0, sizeof *r);
    r->model = strdup(model);
    r->split = calloc(1, sizeof *r->split);
    rc->n_routes++;
    if (!r->model || !r->split)
        return ERR_NOMEM;
    r->n_split = 1;
    r->split[0].pool = pool;
    r->split[0].weight = 1;
    r->split[0].pool_name = strdup(pool_name);
    return r->split[0].pool_name ? 0 : ERR_NOMEM;
}

/* The router's settings for models mode: pool i (one backend, the child's address) and a route per name
 * and alias for model i; no retries, resume, health checks, breaker or DNS refresh (the manager knows
 * whether a child is there), the API keys as unlimited router keys. */
static int build_route_config(struct route_config *rc, const struct route_models_config *c, char *err)
{
    free(rc->host);
    if (!(rc->host = strdup(c->host)))
        return err_set(err, ERR_NOMEM, "out of memory");
    rc->port = c->port;
    rc->max_connections = c->max_connections;
    rc->max_body = c->max_body;
    rc->log_requests = c->log_requests;
    rc->retry_max = 0;
    rc->resume = false;
    rc->health_interval_s = 0;
    rc->eject_after = 0;
    rc->dns_refresh_s = 0;
    rc->connect_timeout_ms = 5000;
    rc->header_timeout_ms = 24 * 3600 * 1000; /* the child's own request_timeout bounds a request */
    rc->idle_timeout_ms = 600000;
    rc->pools = calloc((size_t)c->n_models, sizeof *rc->pools);
    if (!rc->pools)
        return err_set(err, ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_models; i++) {
        const struct route_model_conf *m = &c->models[i];
        struct route_pool_conf *p = &rc->pools[rc->n_pools++];
        int port = rt_models_free_port(); /* the pool's first address; each load picks a new one */
        char url[64];
        snprintf(url, sizeof url, "http://127.0.0.1:%d", port > 0 ? port : 9);
        p->name = strdup(m->name);
        p->urls = calloc(1, sizeof *p->urls);
        if (!p->name || !p->urls || !(p->urls[0] = strdup(url)))
            return err_set(err, ERR_NOMEM, "out of memory");
        p->n_urls = 1;
        p->wafer = false; /* bodies pass as they are: no token ids are asked for (no resume) */
        p->line = m->line;
        if (add_route(rc, m->name, i, m->name))
            return err_set(err, ERR_NOMEM, "out of memory");
        for (int a = 0; a < m->n_aliases; a++)
            if (add_route(rc, m->aliases[a], i, m->name))
                return err_set(err, ERR_NOMEM, "out of memory");
    }
    if (c->n_api_keys) {
        rc->keys = calloc((size_t)c->n_api_keys, sizeof *rc->keys);
        if (!rc->keys)
            return err_set(err, ERR_NOMEM, "out of memory");
        for (int i = 0; i < c->n_api_keys; i++) {
            if (!(rc->keys[i].key = strdup(c->api_keys[i])))
                return err_set(err, ERR_NOMEM, "out of memory");
            rc->n_keys++;
        }
    }
    return route_config_check(rc, err);
}

int route_models_run(struct route_models_config *c)
{
    struct route_config rc;
    route_config_init(&rc);
    char err[ERR_MSG_MAX];
    if (build_route_config(&rc, c, err)) {
        log_error("models: %s", err);
        route_config_deinit(&rc);
        route_models_config_deinit(c);
        return 1;
    }
    int status = rt_run(&rc, c);
    route_config_deinit(&rc);
    route_models_config_deinit(c); /* empty when the manager took it */
    return status;
}
