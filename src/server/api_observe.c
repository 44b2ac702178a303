/*
 * api_observe: the observability endpoints (observe.h computes, these answer).
 *   GET /v1/alerts (and /alerts)   rules and their alerts: Prometheus's {status, data: {alerts}} plus every
 *                                  rule's state and the notification counters
 *   GET /v1/stats?window=S         the measures over the last S seconds (default 10, 1..900), totals,
 *                                  answers by kind, active alerts: what the dashboard polls
 *   GET /dashboard                 the live page (dashboard.c)
 * Open without an API key like /metrics: they show counts and latencies, never a prompt or an output.
 */
#include "core/err.h"
#include "server/api.h"
#include "server/dashboard.h"

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
    double window = 10;
    if (req->query) {
        /* window=S among the query parameters */
        for (const char *p = req->query, *end = req->query + req->query_len; p < end;) {
            const char *amp = memchr(p, '&', (size_t)(end - p));
            size_t n = amp ? (size_t)(amp - p) : (size_t)(end - p);
            if (n > 7 && n < 32 && !memcmp(p, "window=", 7)) {
                char v[32];
                memcpy(v, p + 7, n - 7);
                v[n - 7] = 0;
                char *e;
                double w = strtod(v, &e);
                if (*e || !(w >= 1 && w <= 900)) {
                    api_respond_error(srv, c, ROUTE_STATS, 400, ERR_INVALID_ARG, "window", NULL, NULL,
                                      "'window' must be a number of seconds in [1, 900], got '%s'", v);
                    return;
                }
                window = w;
            }
            p += n + 1;
        }
    }
    size_t len = 0;
    char *body = observe_stats_json(srv->obs, window, &len);
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
