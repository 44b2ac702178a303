/*
 * route_metrics: the router's /metrics in the Prometheus text format (0.0.4). Every name starts with
 * wafer_route_. Counters live in struct router and struct rt_backend (all touched by the I/O thread only,
 * like this rendering), so no lock is needed. Backends are labelled by their label (host:port, plus the
 * address for a host name) and pool kind; backends a reload removed keep their counters (counters must not
 * go backwards) but report up = 0.
 */
#include "core/strbuf.h"
#include "route/route_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void head(struct strbuf *b, const char *name, const char *type, const char *help)
{
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(struct strbuf *b, const char *name, const char *labels, const struct rt_hist *h)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < RT_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        strbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, rt_hist_bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[RT_HIST_BUCKETS];
    strbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    strbuf_printf(b, "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
       h->sum, name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "", (unsigned long long)h->count);
}

char *rt_metrics_render(struct router *r, size_t *len)
{
    struct strbuf b;
    strbuf_init(&b, 16384);
    if (!b.p)
        return NULL;
    b.p[0] = 0;
    int64_t now = evloop_now_ms();

    head(&b, "wafer_route_requests_total", "counter", "Client requests answered by the router, by status class.");
    static const char *const cls[6] = {"", "1xx", "2xx", "3xx", "4xx", "5xx"};
    for (int k = 1; k <= 5; k++)
        strbuf_printf(&b, "wafer_route_requests_total{status=\"%s\"} %llu\n", cls[k], (unsigned long long)r->m_status[k]);
    head(&b, "wafer_route_retries_total", "counter", "Attempts repeated on a backend after a failure before the first byte.");
    strbuf_printf(&b, "wafer_route_retries_total %llu\n", (unsigned long long)r->m_retries);
    head(&b, "wafer_route_fallbacks_total", "counter", "Requests that moved on to a fallback pool.");
    strbuf_printf(&b, "wafer_route_fallbacks_total %llu\n", (unsigned long long)r->m_fallbacks);
    head(&b, "wafer_route_resumes_total", "counter", "Broken streams continued on another backend, by result.");
    strbuf_printf(&b, "wafer_route_resumes_total{result=\"ok\"} %llu\nwafer_route_resumes_total{result=\"failed\"} %llu\n",
       (unsigned long long)r->m_resumes_ok, (unsigned long long)r->m_resumes_failed);
    head(&b, "wafer_route_stream_errors_total", "counter", "Streams ended with an error event after the first byte.");
    strbuf_printf(&b, "wafer_route_stream_errors_total %llu\n", (unsigned long long)r->m_stream_errors);
    head(&b, "wafer_route_no_backend_total", "counter", "Requests answered 503 because no backend was available.");
    strbuf_printf(&b, "wafer_route_no_backend_total %llu\n", (unsigned long long)r->m_no_backend);
    head(&b, "wafer_route_cache_total", "counter", "Result cache lookups, by outcome.");
    strbuf_printf(&b, "wafer_route_cache_total{result=\"hit\"} %llu\nwafer_route_cache_total{result=\"miss\"} %llu\n"
           "wafer_route_cache_total{result=\"bypass\"} %llu\nwafer_route_cache_total{result=\"unavailable\"} %llu\n",
       (unsigned long long)r->m_cache_hits, (unsigned long long)r->m_cache_misses,
       (unsigned long long)r->m_cache_bypass, (unsigned long long)r->m_cache_unavailable);
    if (r->rcache) {
        struct route_rcache_stats rs;
        route_rcache_stats_get(r->rcache, &rs);
        head(&b, "wafer_route_cache_redis_up", "gauge", "1 while the shared cache's Redis connection is up.");
        strbuf_printf(&b, "wafer_route_cache_redis_up %d\n", rs.up ? 1 : 0);
        head(&b, "wafer_route_cache_redis_disconnects_total", "counter", "Redis connections lost or dropped.");
        strbuf_printf(&b, "wafer_route_cache_redis_disconnects_total %llu\n", (unsigned long long)rs.disconnects);
    }
    if (r->cache) {
        struct route_cache_stats st;
        route_cache_stats_get(r->cache, &st);
        head(&b, "wafer_route_cache_bytes", "gauge", "Bytes held by the result cache.");
        strbuf_printf(&b, "wafer_route_cache_bytes %lld\n", (long long)st.bytes);
        head(&b, "wafer_route_cache_entries", "gauge", "Entries in the result cache.");
        strbuf_printf(&b, "wafer_route_cache_entries %lld\n", (long long)st.entries);
        head(&b, "wafer_route_cache_evictions_total", "counter", "Entries evicted to stay within max_bytes.");
        strbuf_printf(&b, "wafer_route_cache_evictions_total %lld\n", (long long)st.evictions);
    }
    head(&b, "wafer_route_limited_total", "counter", "Requests refused by the per-key checks, by kind.");
    static const char *const lim[RT_LIM_COUNT_] = {"auth", "rpm", "tpm", "concurrent"};
    for (int k = 0; k < RT_LIM_COUNT_; k++)
        strbuf_printf(&b, "wafer_route_limited_total{kind=\"%s\"} %llu\n", lim[k], (unsigned long long)r->m_limited[k]);
    head(&b, "wafer_route_reloads_total", "counter", "Routing tables installed after SIGHUP or a DNS change.");
    strbuf_printf(&b, "wafer_route_reloads_total %llu\n", (unsigned long long)r->m_reloads);
    head(&b, "wafer_route_requests_in_flight", "gauge", "Client requests being proxied.");
    strbuf_printf(&b, "wafer_route_requests_in_flight %d\n", r->n_reqs);
    head(&b, "wafer_route_request_duration_seconds", "histogram", "Client request start to the end of its answer.");
    hist(&b, "wafer_route_request_duration_seconds", "", &r->duration);
    head(&b, "wafer_route_time_to_first_byte_seconds", "histogram",
         "Client request start to the first byte of its answer.");
    hist(&b, "wafer_route_time_to_first_byte_seconds", "", &r->ttfb);

    head(&b, "wafer_route_backend_up", "gauge", "1 when the backend may be chosen now (health checks, circuit breaker).");
    for (struct rt_backend *be = r->backends; be; be = be->next)
        strbuf_printf(&b, "wafer_route_backend_up{backend=\"%s\"} %d\n", be->label, be->in_use && rt_backend_available(be, now));
    head(&b, "wafer_route_backend_in_flight", "gauge", "Requests of this router on the backend now.");
    for (struct rt_backend *be = r->backends; be; be = be->next)
        strbuf_printf(&b, "wafer_route_backend_in_flight{backend=\"%s\"} %d\n", be->label, be->inflight);
    head(&b, "wafer_route_backend_load", "gauge", "Running + waiting requests the backend last reported (-1 unknown).");
    for (struct rt_backend *be = r->backends; be; be = be->next)
        strbuf_printf(&b, "wafer_route_backend_load{backend=\"%s\"} %lld\n", be->label, (long long)be->reported_load);
    head(&b, "wafer_route_backend_requests_total", "counter", "Attempts sent to the backend.");
    for (struct rt_backend *be = r->backends; be; be = be->next)
        strbuf_printf(&b, "wafer_route_backend_requests_total{backend=\"%s\"} %llu\n", be->label,
           (unsigned long long)be->m_requests);
    head(&b, "wafer_route_backend_responses_total", "counter", "Backend response heads, by status class.");
    for (struct rt_backend *be = r->backends; be; be = be->next)
        for (int k = 1; k <= 5; k++)
            if (be->m_responses[k])
                strbuf_printf(&b, "wafer_route_backend_responses_total{backend=\"%s\",status=\"%s\"} %llu\n", be->label,
                   cls[k], (unsigned long long)be->m_responses[k]);
    head(&b, "wafer_route_backend_errors_total", "counter", "Failed attempts on the backend, by kind.");
    static const char *const kinds[RT_ERR_COUNT_] = {"connect", "timeout", "status_5xx", "status_429", "broken",
                                                     "garbage"};
    for (struct rt_backend *be = r->backends; be; be = be->next)
        for (int k = 0; k < RT_ERR_COUNT_; k++)
            strbuf_printf(&b, "wafer_route_backend_errors_total{backend=\"%s\",kind=\"%s\"} %llu\n", be->label, kinds[k],
               (unsigned long long)be->m_errors[k]);
    head(&b, "wafer_route_backend_ejections_total", "counter", "Times the backend was ejected by the circuit breaker.");
    for (struct rt_backend *be = r->backends; be; be = be->next)
        strbuf_printf(&b, "wafer_route_backend_ejections_total{backend=\"%s\"} %llu\n", be->label,
           (unsigned long long)be->m_ejections);
    head(&b, "wafer_route_backend_response_seconds", "histogram", "Attempt start to the backend's response head.");
    for (struct rt_backend *be = r->backends; be; be = be->next) {
        char lab[400];
        snprintf(lab, sizeof lab, "backend=\"%s\"", be->label);
        hist(&b, "wafer_route_backend_response_seconds", lab, &be->ttfb);
    }
    rt_models_metrics(r, &b);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
