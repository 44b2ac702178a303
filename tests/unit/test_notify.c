/* Tests for notifications: the three payload shapes (Alertmanager's v4 webhook field set checked exactly),
 * deduplication and grouping against the notification log (Alertmanager's rules), the log surviving a
 * reopen of the store, and delivery by the notifier thread to a real receiver on loopback (core's HTTP
 * server in a thread) that first answers 503 with Retry-After, then 200: delivered once, in order, after
 * the wait it asked for; a receiver that refuses (400) gets no retries. */
#include "testutil.h"

#include "core/alert.h"
#include "core/alert_store.h"
#include "core/err.h"
#include "core/http.h"
#include "core/notify.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char cfg_yaml[] = "alerts:\n"
                               "  external_url: 'http://wafer.test:8080/'\n"
                               "  rules:\n"
                               "    - {name: HighTTFT, measure: ttft_p95_ms, threshold: 1000, severity: page,\n"
                               "       labels: {team: inference}, annotations: {summary: 'TTFT p95 above 1 s'}}\n"
                               "    - {name: HighErrors, measure: error_rate, threshold: 0.01, severity: page,\n"
                               "       labels: {team: inference}}\n"
                               "  receivers:\n"
                               "    - {name: ops, kind: webhook, url: 'http://127.0.0.1:1/hook', group_interval_s: 10,\n"
                               "       repeat_interval_s: 3600}\n";

/* A view by hand: rule i of cfg in state st. */
static struct alert_view make_view(const struct alert_config *cfg, int i, enum alert_state st, double fired,
                                   double resolved, uint64_t fp)
{
    const struct alert_rule *r = &cfg->rules[i];
    struct alert_view v = {.rule = r, .state = st, .value = 1234, .fired_at = fired, .active_at = fired,
                           .resolved_at = resolved, .fingerprint = fp};
    v.labels = json_object();
    json_object_set_new(v.labels, "alertname", json_string(r->name));
    json_object_set_new(v.labels, "severity", json_string(r->severity));
    for (int k = 0; k < r->labels.n; k++)
        json_object_set_new(v.labels, r->labels.key[k], json_string(r->labels.value[k]));
    v.annotations = json_object();
    for (int k = 0; k < r->annotations.n; k++)
        json_object_set_new(v.annotations, r->annotations.key[k], json_string(r->annotations.value[k]));
    return v;
}

static void free_view(struct alert_view *v)
{
    json_decref(v->labels);
    json_decref(v->annotations);
}

static void load(struct alert_config *cfg, const char *y)
{
    alert_config_init(cfg);
    char err[ERR_MSG_MAX] = "";
    int rc = alert_config_load_string(cfg, y, strlen(y), "n.yaml", err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

/* The exact key set of a JSON object, sorted and comma-joined. */
static void assert_keys(json_t *o, const char *want)
{
    const char *keys[32];
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) keys[n++] = k;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
            const char *t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
        }
    char got[512] = "";
    for (int i = 0; i < n; i++) {
        if (i)
            strcat(got, ",");
        strcat(got, keys[i]);
    }
    assert_string_equal(got, want);
}

static void test_payload_webhook(void **state)
{
    (void)state;
    struct alert_config cfg;
    load(&cfg, cfg_yaml);
    struct alert_view v[2] = {make_view(&cfg, 0, ALERT_FIRING, 1714564800, 0, 0x1234),
                              make_view(&cfg, 1, ALERT_RESOLVED, 1714564700, 1714564900.5, 0x99)};
    const struct alert_view *pv[2] = {&v[0], &v[1]};
    json_t *gl = json_pack("{s:s}", "team", "inference");
    struct notify_group g = {.receiver = "ops", .group_key = "{}:{team=\"inference\"}", .group_labels = gl,
                             .alerts = pv, .n_alerts = 2, .external_url = "http://wafer.test:8080", .now_unix = 1714565000};
    char *body = notify_payload_webhook(&g);
    assert_non_null(body);
    json_error_t je;
    json_t *p = json_loads(body, 0, &je);
    assert_non_null(p);
    /* Alertmanager's webhook payload (notify/webhook.Message: template.Data + version, groupKey,
     * truncatedAlerts), exactly */
    assert_keys(p, "alerts,commonAnnotations,commonLabels,externalURL,groupKey,groupLabels,receiver,status,"
                   "truncatedAlerts,version");
    assert_string_equal(json_string_value(json_object_get(p, "version")), "4");
    assert_string_equal(json_string_value(json_object_get(p, "status")), "firing"); /* one still fires */
    assert_string_equal(json_string_value(json_object_get(p, "receiver")), "ops");
    assert_string_equal(json_string_value(json_object_get(p, "groupKey")), "{}:{team=\"inference\"}");
    assert_string_equal(json_string_value(json_object_get(p, "externalURL")), "http://wafer.test:8080");
    assert_int_equal(json_integer_value(json_object_get(p, "truncatedAlerts")), 0);
    /* common labels: those equal in both alerts; alertname differs */
    json_t *cl = json_object_get(p, "commonLabels");
    assert_keys(cl, "severity,team");
    assert_keys(json_object_get(p, "commonAnnotations"), "");
    json_t *alerts = json_object_get(p, "alerts");
    assert_int_equal(json_array_size(alerts), 2);
    json_t *a0 = json_array_get(alerts, 0), *a1 = json_array_get(alerts, 1);
    assert_keys(a0, "annotations,endsAt,fingerprint,generatorURL,labels,startsAt,status");
    assert_string_equal(json_string_value(json_object_get(a0, "status")), "firing");
    assert_string_equal(json_string_value(json_object_get(a0, "startsAt")), "2024-05-01T12:00:00.000Z");
    assert_string_equal(json_string_value(json_object_get(a0, "endsAt")), "0001-01-01T00:00:00Z");
    assert_string_equal(json_string_value(json_object_get(a0, "fingerprint")), "0000000000001234");
    assert_string_equal(json_string_value(json_object_get(a0, "generatorURL")), "http://wafer.test:8080/v1/alerts");
    assert_string_equal(json_string_value(json_object_get(json_object_get(a0, "labels"), "alertname")), "HighTTFT");
    assert_string_equal(json_string_value(json_object_get(json_object_get(a0, "annotations"), "summary")),
                        "TTFT p95 above 1 s");
    assert_string_equal(json_string_value(json_object_get(a1, "status")), "resolved");
    assert_string_equal(json_string_value(json_object_get(a1, "endsAt")), "2024-05-01T12:01:40.500Z");
    json_decref(p);
    free(body);

    /* Alertmanager's API: an array of {labels, annotations, startsAt, endsAt, generatorURL}; a firing
     * alert's endsAt is four resends ahead */
    g.resend_s = 60;
    body = notify_payload_alertmanager(&g);
    p = json_loads(body, 0, &je);
    assert_true(json_is_array(p));
    assert_keys(json_array_get(p, 0), "annotations,endsAt,generatorURL,labels,startsAt");
    assert_string_equal(json_string_value(json_object_get(json_array_get(p, 0), "endsAt")), "2024-05-01T12:07:20.000Z");
    json_decref(p);
    free(body);

    /* Slack: {text, blocks}; a header block titled like Alertmanager's */
    body = notify_payload_slack(&g);
    p = json_loads(body, 0, &je);
    assert_keys(p, "blocks,text");
    assert_string_equal(json_string_value(json_object_get(p, "text")), "[FIRING:1] inference");
    json_t *blocks = json_object_get(p, "blocks");
    assert_int_equal(json_array_size(blocks), 4); /* header, two alerts, context */
    assert_string_equal(json_string_value(json_object_get(json_array_get(blocks, 0), "type")), "header");
    const char *sec = json_string_value(json_object_get(json_object_get(json_array_get(blocks, 1), "text"), "text"));
    assert_non_null(strstr(sec, "*HighTTFT* (page) firing"));
    assert_non_null(strstr(sec, "TTFT p95 above 1 s"));
    json_decref(p);
    free(body);
    json_decref(gl);
    free_view(&v[0]);
    free_view(&v[1]);
    alert_config_deinit(&cfg);
}

static void test_urls(void **state)
{
    (void)state;
    struct alert_receiver r = {.kind = ALERT_RECV_ALERTMANAGER, .url = "http://am:9093/"};
    char *u = notify_receiver_url(&r);
    assert_string_equal(u, "http://am:9093/api/v2/alerts");
    free(u);
    r.url = "http://am:9093/api/v2/alerts";
    u = notify_receiver_url(&r);
    assert_string_equal(u, "http://am:9093/api/v2/alerts");
    free(u);
    r.kind = ALERT_RECV_WEBHOOK;
    r.url = "http://h/hook/";
    u = notify_receiver_url(&r);
    assert_string_equal(u, "http://h/hook/");
    free(u);
    assert_true(notify_parse_retry_after("7", 0) == 7);
    assert_true(notify_parse_retry_after(" 2.5\r\n", 0) == 2.5);
    assert_true(notify_parse_retry_after("Wed, 01 May 2024 12:00:30 GMT", 1714564800) == 30);
    assert_true(notify_parse_retry_after("soon", 0) < 0);
}

/* The body of outbox row i (oldest first per receiver: here one receiver). */
static json_t *pending_body(struct alert_store *st, int *n_pending)
{
    struct alert_outbox_row *rows;
    int n;
    assert_int_equal(alert_store_outbox_heads(st, &rows, &n), 0);
    *n_pending = alert_store_outbox_count(st, NULL);
    json_t *b = n ? json_loads(rows[0].body, 0, NULL) : NULL;
    if (n)
        alert_store_outbox_delete(st, rows[0].id);
    alert_store_rows_free(rows, n);
    return b;
}

/* Dedup against the notification log: one notification per change, none for an unchanged group until
 * repeat_interval, one when resolved, none after; the log survives a reopen (a restart re-sends nothing). */
static void test_dedup_and_restart(void **state)
{
    (void)state;
    struct alert_config cfg;
    load(&cfg, cfg_yaml);
    const char *path = test_tmp_path("notify.sqlite");
    unlink(path);
    char err[ERR_MSG_MAX];
    struct alert_store *st = alert_store_open(path, err);
    assert_non_null(st);
    struct notify *n = notify_create(&cfg, st, NULL);
    assert_non_null(n);
    struct alert_view v = make_view(&cfg, 0, ALERT_FIRING, 1000, 0, 0xaa);
    int np;
    assert_int_equal(notify_plan(n, &v, 1, 1000), 1);
    json_t *b = pending_body(st, &np);
    assert_int_equal(np, 1);
    assert_string_equal(json_string_value(json_object_get(b, "status")), "firing");
    assert_string_equal(json_string_value(json_object_get(b, "groupKey")), "{}:{alertname=\"HighTTFT\"}");
    json_decref(b);
    /* every evaluation after: nothing new (Alertmanager 2286 was 200 of these in 10 minutes) */
    for (int t = 1005; t < 1600; t += 5)
        assert_int_equal(notify_plan(n, &v, 1, t), 0);
    /* a second rule firing is its own group (group_by alertname): notified at once */
    struct alert_view both[2] = {v, make_view(&cfg, 1, ALERT_FIRING, 1600, 0, 0xbb)};
    assert_int_equal(notify_plan(n, both, 2, 1600), 1);
    b = pending_body(st, &np);
    assert_string_equal(json_string_value(json_object_get(json_object_get(b, "groupLabels"), "alertname")),
                        "HighErrors");
    json_decref(b);
    free_view(&both[1]);
    /* repeat_interval (3600 s) passed with HighTTFT still firing: re-sent once */
    assert_int_equal(notify_plan(n, &v, 1, 4600), 1);
    json_decref(pending_body(st, &np));
    assert_int_equal(notify_plan(n, &v, 1, 4605), 0);
    notify_destroy(n);
    alert_store_close(st);

    /* restart: the log is on disk; the same firing alert is not announced again */
    st = alert_store_open(path, err);
    n = notify_create(&cfg, st, NULL);
    assert_int_equal(notify_plan(n, &v, 1, 4700), 0);
    /* resolved: one notification, after group_interval (10 s) since the last one */
    v.state = ALERT_RESOLVED;
    v.resolved_at = 4700;
    assert_int_equal(notify_plan(n, &v, 1, 4700), 1);
    b = pending_body(st, &np);
    assert_string_equal(json_string_value(json_object_get(b, "status")), "resolved");
    json_decref(b);
    for (int t = 4705; t < 5000; t += 5)
        assert_int_equal(notify_plan(n, &v, 1, t), 0);
    notify_destroy(n);
    alert_store_close(st);
    /* and after another restart, the resolved alert is not re-sent either */
    st = alert_store_open(path, err);
    n = notify_create(&cfg, st, NULL);
    assert_int_equal(notify_plan(n, &v, 1, 5000), 0);
    assert_int_equal(alert_store_outbox_count(st, NULL), 0);
    notify_destroy(n);
    alert_store_close(st);
    free_view(&v);
    alert_config_deinit(&cfg);
}

/* group_interval holds back a change that comes too soon after the last notification; group_wait delays a
 * new group's first one; send_resolved: false settles a resolved group silently; routing by rule. */
static void test_grouping_timing(void **state)
{
    (void)state;
    static const char y[] = "alerts:\n"
                            "  rules:\n"
                            "    - {name: A, measure: running, threshold: 1, labels: {team: x}, receivers: [quiet]}\n"
                            "    - {name: B, measure: waiting, threshold: 1, labels: {team: x}}\n"
                            "  receivers:\n"
                            "    - {name: loud, kind: webhook, url: 'http://127.0.0.1:1/', group_by: [team],\n"
                            "       group_wait_s: 30, group_interval_s: 60}\n"
                            "    - {name: quiet, kind: slack, url: 'http://127.0.0.1:1/', send_resolved: false}\n";
    struct alert_config cfg;
    load(&cfg, y);
    char err[ERR_MSG_MAX];
    struct alert_store *st = alert_store_open(NULL, err);
    struct notify *n = notify_create(&cfg, st, "http://me");
    struct alert_view v[2] = {make_view(&cfg, 0, ALERT_FIRING, 100, 0, 1), make_view(&cfg, 1, ALERT_INACTIVE, 0, 0, 2)};
    /* A goes to quiet only (its rule names it); loud gets nothing from A */
    assert_int_equal(notify_plan(n, v, 2, 100), 1);
    assert_int_equal(alert_store_outbox_count(st, "quiet"), 1);
    assert_int_equal(alert_store_outbox_count(st, "loud"), 0);
    /* B fires (its rule names no receiver: both get it): quiet at once; loud's group {team=x} is new and
     * waits group_wait (30 s) */
    v[1].state = ALERT_FIRING;
    v[1].fired_at = 200;
    assert_int_equal(notify_plan(n, v, 2, 200), 1);
    assert_int_equal(alert_store_outbox_count(st, "quiet"), 2);
    assert_int_equal(notify_plan(n, v, 2, 229), 0);
    assert_int_equal(notify_plan(n, v, 2, 230), 1);
    assert_int_equal(alert_store_outbox_count(st, "loud"), 1);
    /* B resolves 10 s later: loud's group changed, but waits for group_interval (60 s) */
    v[1].state = ALERT_RESOLVED;
    v[1].resolved_at = 240;
    assert_int_equal(notify_plan(n, v, 2, 240), 0);
    assert_int_equal(notify_plan(n, v, 2, 290), 1);
    /* A resolves (B is resolved too): quiet does not want resolved notifications: nothing queued, its
     * groups are settled */
    v[0].state = ALERT_RESOLVED;
    v[0].resolved_at = 300;
    assert_int_equal(notify_plan(n, v, 2, 300), 0);
    assert_int_equal(notify_plan(n, v, 2, 400), 0);
    assert_int_equal(alert_store_outbox_count(st, "quiet"), 2);
    notify_destroy(n);
    alert_store_close(st);
    free_view(&v[0]);
    free_view(&v[1]);
    alert_config_deinit(&cfg);
}

/* ---- delivery to a real receiver ---- */

struct recv_ctx {
    struct http_server *http;
    atomic_int n_posts, n_ok;
    atomic_int fail_first; /* answer 503 Retry-After: 1 to this many posts first */
    atomic_int refuse;     /* answer 400 to everything */
    double t_first, t_ok;  /* wall times */
    char last_body[4096];
    pthread_mutex_t mu;
};

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void recv_on_request(void *ctx, struct http_conn *c, const struct http_request *req)
{
    struct recv_ctx *r = ctx;
    int k = atomic_fetch_add(&r->n_posts, 1);
    if (k == 0)
        r->t_first = wall();
    if (atomic_load(&r->refuse)) {
        http_respond(c, 400, "text/plain", NULL, "no", 2);
        return;
    }
    if (k < atomic_load(&r->fail_first)) {
        http_respond(c, 503, "text/plain", "Retry-After: 1\r\n", "busy", 4);
        return;
    }
    pthread_mutex_lock(&r->mu);
    snprintf(r->last_body, sizeof r->last_body, "%.*s", (int)req->body_len, req->body);
    pthread_mutex_unlock(&r->mu);
    r->t_ok = wall();
    atomic_fetch_add(&r->n_ok, 1);
    http_respond(c, 200, "application/json", NULL, "{}", 2);
}

static void *recv_thread(void *arg)
{
    http_server_run(((struct recv_ctx *)arg)->http);
    return NULL;
}

static void test_delivery(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct recv_ctx rc;
    memset(&rc, 0, sizeof rc);
    pthread_mutex_init(&rc.mu, NULL);
    atomic_store(&rc.fail_first, 1);
    struct http_server_params hp;
    http_server_params_default(&hp);
    hp.port = 0;
    hp.on_request = recv_on_request;
    hp.ctx = &rc;
    char err[ERR_MSG_MAX];
    rc.http = http_server_create(&hp, err);
    assert_non_null(rc.http);
    pthread_t tid;
    pthread_create(&tid, NULL, recv_thread, &rc);
    char y[1024];
    snprintf(y, sizeof y,
             "alerts:\n  rules:\n    - {name: A, measure: running, threshold: 1}\n    - {name: B, measure: waiting, "
             "threshold: 1}\n  receivers:\n    - {name: r, kind: webhook, url: 'http://127.0.0.1:%d/hook', "
             "min_interval_s: 0, group_interval_s: 0, max_attempts: 3}\n",
             http_server_port(rc.http));
    struct alert_config cfg;
    load(&cfg, y);
    struct alert_store *st = alert_store_open(NULL, err);
    struct notify *n = notify_create(&cfg, st, "http://me");
    assert_int_equal(notify_start(n), 0);
    double t0 = wall();
    struct alert_view v[2] = {make_view(&cfg, 0, ALERT_FIRING, t0, 0, 1), make_view(&cfg, 1, ALERT_FIRING, t0, 0, 2)};
    assert_int_equal(notify_plan(n, v, 2, t0), 2);
    /* first post 503 Retry-After: 1, then both delivered, in order, once each */
    for (int i = 0; i < 1500 && atomic_load(&rc.n_ok) < 2; i++) /* up to 15 s: a loaded machine (ASan, CI) */
        usleep(10000);
    assert_int_equal(atomic_load(&rc.n_ok), 2);
    assert_int_equal(atomic_load(&rc.n_posts), 3);
    assert_true(rc.t_ok - rc.t_first >= 0.9); /* the wait Retry-After asked for */
    pthread_mutex_lock(&rc.mu);
    assert_non_null(strstr(rc.last_body, "\"alertname\":\"B\"")); /* A first, then B */
    pthread_mutex_unlock(&rc.mu);
    struct notify_stats ns;
    /* the receiver counts a post before the notifier has read its answer and recorded it: wait for that too */
    for (int i = 0; i < 1500; i++) {
        notify_stats_get(n, &ns);
        if (ns.sent == 2 && ns.pending == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(ns.sent, 2);
    assert_int_equal(ns.failed_posts, 1);
    assert_int_equal(ns.pending, 0);
    /* a receiver that refuses (400): dropped at once, no retry storm */
    atomic_store(&rc.refuse, 1);
    v[0].state = ALERT_RESOLVED;
    v[0].resolved_at = wall();
    assert_int_equal(notify_plan(n, v, 2, wall()), 1);
    for (int i = 0; i < 1500; i++) { /* up to 15 s */
        notify_stats_get(n, &ns);
        if (ns.dropped)
            break;
        usleep(10000);
    }
    usleep(200000);
    notify_stats_get(n, &ns);
    assert_int_equal(ns.dropped, 1);
    assert_int_equal(atomic_load(&rc.n_posts), 4);
    assert_int_equal(ns.pending, 0);
    notify_destroy(n);
    alert_store_close(st);
    http_server_stop(rc.http, 0);
    pthread_join(tid, NULL);
    http_server_destroy(rc.http);
    free_view(&v[0]);
    free_view(&v[1]);
    alert_config_deinit(&cfg);
    curl_global_cleanup();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_payload_webhook),   cmocka_unit_test(test_urls),
        cmocka_unit_test(test_dedup_and_restart), cmocka_unit_test(test_grouping_timing),
        cmocka_unit_test(test_delivery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
