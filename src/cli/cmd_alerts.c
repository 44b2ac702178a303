/*
 * wafer alerts check: the alert rules of a config file evaluated once against any wafer server's /metrics,
 * for cron and CI. It scrapes twice, --window seconds apart (rates and percentiles need a window),
 * evaluates every rule over that window, prints a line
 * per rule, and exits 1 when one holds, 0 when none does, 2 on a usage or config error, 3 when the server
 * cannot be scraped. A rule's for_s is not waited for (one evaluation); its condition holding is enough. Its
 * window_s is replaced by the scrape window: the text holds totals, not their history.
 */
#include "cli/cli.h"

#include "core/alert.h"
#include "core/clock.h"
#include "core/err.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void alerts_usage(FILE *f)
{
    fprintf(f, "usage: wafer alerts check --url URL --config FILE [--window SEC] [--timeout SEC]\n\n"
               "Evaluates the alert rules of FILE (its alerts: section, as in wafer serve's config) once against\n"
               "the /metrics of the wafer server at URL, and exits 1 when a rule holds (for cron). Measures over\n"
               "a window need two scrapes: they are taken --window seconds apart (default 10), and that is the\n"
               "window of every rule. A rule's for_s is not waited for.\n\n"
               "options:\n"
               "  --url URL         the server (http://host:port) or its /metrics URL\n"
               "  --config FILE     YAML with an alerts: section (docs/observability.md)\n"
               "  --window SEC      seconds between the two scrapes, 0.5 to 3600 (default 10)\n"
               "  --timeout SEC     per scrape (default 10)\n"
               "  -h, --help        this help\n\n"
               "exit status: 0 no rule holds, 1 a rule holds, 2 usage or config error, 3 the server cannot be read\n");
}

struct buf {
    char *p;
    size_t len, cap;
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct buf *b = ud;
    size_t add = size * n;
    if (b->len + add + 1 > b->cap) {
        size_t cap = (b->len + add + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np)
            return 0;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, add);
    b->len += add;
    b->p[b->len] = 0;
    return add;
}

/* GETs url into a sample. 0, or 3 with a message printed. */
static int scrape(const char *url, double timeout_s, struct alert_sample *s, struct alert_prom_bounds *bounds)
{
    struct buf b = {0};
    CURL *c = curl_easy_init();
    if (!c)
        return 3;
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    alert_sample_init(s, clock_now_ns());
    int ret = 0;
    if (rc != CURLE_OK) {
        fprintf(stderr, "wafer alerts check: cannot read %s: %s\n", url, errbuf[0] ? errbuf : curl_easy_strerror(rc));
        ret = 3;
    } else if (status != 200) {
        fprintf(stderr, "wafer alerts check: %s answered HTTP %ld\n", url, status);
        ret = 3;
    } else if (alert_sample_from_prometheus(b.p ? b.p : "", b.len, s, bounds)) {
        fprintf(stderr, "wafer alerts check: %s is not a wafer /metrics page (no wafer_ histogram)\n", url);
        ret = 3;
    }
    free(b.p);
    return ret;
}

static int alerts_check(int argc, char **argv)
{
    const char *url = NULL, *config = NULL;
    double window = 10, timeout = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            alerts_usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "wafer alerts check: %s needs a value (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        char *e;
        if (!strcmp(a, "--url"))
            url = v;
        else if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--window") && (window = strtod(v, &e), !*e && window >= 0.5 && window <= 3600))
            ;
        else if (!strcmp(a, "--timeout") && (timeout = strtod(v, &e), !*e && timeout > 0 && timeout <= 600))
            ;
        else {
            fprintf(stderr, "wafer alerts check: bad option %s %s (see --help)\n", a, v);
            return 2;
        }
    }
    if (!url || !config) {
        fprintf(stderr, "wafer alerts check: --url and --config are required (see --help)\n");
        return 2;
    }
    FILE *f = fopen(config, "rb");
    if (!f) {
        fprintf(stderr, "wafer alerts check: cannot read %s\n", config);
        return 2;
    }
    char *yaml = NULL;
    size_t ylen = 0;
    {
        struct buf b = {0};
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
            on_body(chunk, 1, n, &b);
        yaml = b.p;
        ylen = b.len;
    }
    fclose(f);
    struct alert_config cfg;
    alert_config_init(&cfg);
    char err[ERR_MSG_MAX] = "";
    int rc = alert_config_load_string(&cfg, yaml ? yaml : "", ylen, config, err);
    free(yaml);
    if (rc) {
        fprintf(stderr, "wafer alerts check: %s\n", err);
        return 2;
    }
    if (!cfg.n_rules) {
        fprintf(stderr, "wafer alerts check: %s has no alert rules\n", config);
        alert_config_deinit(&cfg);
        return 2;
    }
    char *metrics_url = NULL;
    size_t ul = strlen(url);
    if (ul >= 8 && !strcmp(url + ul - 8, "/metrics"))
        metrics_url = strdup(url);
    else if (asprintf(&metrics_url, "%s%s", url, url[ul ? ul - 1 : 0] == '/' ? "metrics" : "/metrics") < 0)
        metrics_url = NULL;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct alert_prom_bounds b0, b1;
    struct alert_sample s0, s1;
    int status = 0;
    struct alert_engine *e = alert_engine_create(&cfg, NULL, 0, (double)time(NULL));
    if (!e || !metrics_url) {
        status = 3;
    } else {
        status = scrape(metrics_url, timeout, &s0, &b0);
        if (!status) {
            alert_engine_record(e, &s0);
            usleep((useconds_t)(window * 1e6));
            status = scrape(metrics_url, timeout, &s1, &b1);
        }
    }
    int holding = 0;
    if (!status) {
        /* every rule over the scraped window: for measures over windows, the window is what was scraped */
        for (int i = 0; i < cfg.n_rules; i++) {
            struct alert_rule *r = &cfg.rules[i];
            r->window_s = window * 0.999;
            if (r->burn.short_window_s > r->window_s)
                r->burn.short_window_s = r->window_s;
            r->for_s = 0;
        }
        alert_engine_eval(e, &s1, (double)time(NULL));
        int n;
        struct alert_view *v = alert_engine_views(e, true, &n);
        for (int i = 0; i < n; i++) {
            bool holds = v[i].state == ALERT_FIRING || v[i].state == ALERT_PENDING;
            holding += holds;
            static const char *const ops[] = {">", ">=", "<", "<=", "==", "!="};
            char val[32];
            if (isnan(v[i].value))
                snprintf(val, sizeof val, "no data");
            else
                snprintf(val, sizeof val, "%.4g", v[i].value);
            printf("%-8s %-24s %s = %s (%s %g)\n", holds ? "FIRING" : "ok", v[i].rule->name, v[i].rule->measure_name,
                   val, ops[v[i].rule->op], v[i].rule->threshold);
        }
        alert_views_free(v, n);
        status = holding ? 1 : 0;
    }
    alert_engine_destroy(e);
    free(metrics_url);
    curl_global_cleanup();
    alert_config_deinit(&cfg);
    return status;
}

int cmd_alerts_main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "check"))
        return alerts_check(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        alerts_usage(stdout);
        return 0;
    }
    alerts_usage(stderr);
    return 2;
}
