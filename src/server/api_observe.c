/*
 * api_observe: the observability endpoints (observe.h computes, these answer).
 *   GET /v1/alerts (and /alerts)   rules and their alerts: Prometheus's {status, data: {alerts}} plus every
 *                                  rule's state and the notification counters
 *   GET /v1/stats?window=S         the measures over the last S seconds (default 10, 1..900), totals,
 *                                  answers by kind, active alerts: what the dashboard polls;
 *                                  &history=N adds the charted measures for each of the last N seconds
 *   GET /dashboard                 the live page (dashboard.c)
 * Open without an API key like /metrics: they show counts and latencies, never a prompt or an output.
 */
#include "core/err.h"
#include "server/api.h"
#include "server/dashboard.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void respond_text(struct server *srv, struct http_conn *c, enum api_route route, char *body, size_t len,
                         const char *type)
{
    if (!body) {
        api_respond_error(srv, c, route, 503, ERR_NOMEM, NULL, NULL, NULL, "out of memory");
        return;
    }
    char headers[512];
    snprintf(headers, sizeof headers, "%sCache-Control: no-store\r\n", api_cors_headers());
    http_respond(c, 200, type, headers, body, len);
    metrics_request(srv->metrics, api_route_name(route), 200);
}

void api_alerts(struct server *srv, struct http_conn *c)
{
    size_t len = 0;
    char *body = observe_alerts_json(srv->obs, &len);
    respond_text(srv, c, ROUTE_ALERTS, body, len, "application/json");
    free(body);
}

void api_stats(struct server *srv, struct http_conn *c, const struct http_request *req)
{
    double window = 10, history = 0;
    /* window=S and history=N among the query parameters */
    for (const char *p = req->query, *end = req->query + req->query_len; p && p < end;) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        size_t n = amp ? (size_t)(amp - p) : (size_t)(end - p);
        const char *eq = memchr(p, '=', n);
        if (eq && n < 48) {
            char key[48], v[48];
            snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
            snprintf(v, sizeof v, "%.*s", (int)(n - (size_t)(eq + 1 - p)), eq + 1);
            bool is_window = !strcmp(key, "window"), is_history = !strcmp(key, "history");
            char *e;
            double x = strtod(v, &e);
            if ((is_window && (*e || !(x >= 1 && x <= 900))) || (is_history && (*e || !(x >= 0 && x <= 900)))) {
                api_respond_error(srv, c, ROUTE_STATS, 400, ERR_INVALID_ARG, key, NULL, NULL,
                                  "'%s' must be a number of seconds in [%d, 900], got '%s'", key, is_window, v);
                return;
            }
            if (is_window)
                window = x;
            if (is_history)
                history = x;
        }
        p += n + 1;
    }
    size_t len = 0;
    char *body = observe_stats_json(srv->obs, window, (int)history, api_jobs_progress(srv), &len);
    respond_text(srv, c, ROUTE_STATS, body, len, "application/json");
    free(body);
}

void api_dashboard(struct server *srv, struct http_conn *c)
{
    size_t len;
    const char *page = dashboard_html(&len);
    char headers[512];
    snprintf(headers, sizeof headers, "%sCache-Control: no-store\r\n", api_cors_headers());
    http_respond(c, 200, "text/html; charset=utf-8", headers, page, len);
    metrics_request(srv->metrics, api_route_name(ROUTE_DASHBOARD), 200);
}
