/*
 * notify: grouping and deduplication (Alertmanager's dispatcher and notification log, in a few functions),
 * the three payload shapes, and the notifier thread posting the outbox with libcurl (notify.h has the
 * rules). Fingerprint sets are kept as sorted, comma-separated 16-digit hex strings, which is also how the
 * notification log stores them.
 */
#include "core/notify.h"

#include "core/alert_store.h"
#include "core/err.h"
#include "core/log.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

struct notify {
    const struct alert_config *cfg;
    struct alert_store *store;
    char *external_url;
    double *last_post; /* [n_receivers] wall time of the last post, for the rate limit */
    pthread_t thread;
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long long sent, failed_posts, dropped; /* under mu */
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct notify *notify_create(const struct alert_config *cfg, struct alert_store *store, const char *external_url)
{
    struct notify *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->cfg = cfg;
    n->store = store;
    const char *ext = cfg->external_url ? cfg->external_url : external_url ? external_url : "";
    n->external_url = strdup(ext);
    size_t len = strlen(n->external_url ? n->external_url : "");
    while (len && n->external_url[len - 1] == '/') /* generatorURL appends a path */
        n->external_url[--len] = 0;
    n->last_post = calloc((size_t)(cfg->n_receivers ? cfg->n_receivers : 1), sizeof *n->last_post);
    pthread_mutex_init(&n->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!n->external_url || !n->last_post) {
        notify_destroy(n);
        return NULL;
    }
    return n;
}

void notify_destroy(struct notify *n)
{
    if (!n)
        return;
    if (n->started) {
        pthread_mutex_lock(&n->mu);
        n->stop = true;
        pthread_cond_signal(&n->cv);
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->thread, NULL);
    }
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n->external_url);
    free(n->last_post);
    free(n);
}

/* ---------------------------------------------------------------- payloads */

static json_t *json_time(double t)
{
    char buf[32];
    alert_time_format(t, buf);
    return json_string(buf);
}

static const char *view_status(const struct alert_view *a) { return a->state == ALERT_FIRING ? "firing" : "resolved"; }

static char *generator_url(const struct notify_group *g)
{
    char *u = NULL;
    if (asprintf(&u, "%s/v1/alerts", g->external_url ? g->external_url : "") < 0)
        return NULL;
    return u;
}

/* Members of every object in objs with the same value in all (Alertmanager's commonLabels). */
static json_t *common_of(const struct notify_group *g, bool annotations)
{
    json_t *c = json_object();
    if (!g->n_alerts)
        return c;
    json_t *first = annotations ? g->alerts[0]->annotations : g->alerts[0]->labels;
    const char *k;
    json_t *v;
    json_object_foreach(first, k, v)
    {
        bool all = true;
        for (int i = 1; i < g->n_alerts && all; i++) {
            json_t *o = annotations ? g->alerts[i]->annotations : g->alerts[i]->labels;
            all = json_equal(json_object_get(o, k), v);
        }
        if (all)
            json_object_set(c, k, v);
    }
    return c;
}

static const char *group_status(const struct notify_group *g)
{
    for (int i = 0; i < g->n_alerts; i++)
        if (g->alerts[i]->state == ALERT_FIRING)
            return "firing";
    return "resolved";
}

static char *dump(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *notify_payload_webhook(const struct notify_group *g)
{
    char *gen = generator_url(g);
    json_t *alerts = json_array();
    for (int i = 0; i < g->n_alerts; i++) {
        const struct alert_view *a = g->alerts[i];
        char fp[17];
        alert_fingerprint_format(a->fingerprint, fp);
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string(view_status(a)));
        json_object_set(o, "labels", a->labels);
        json_object_set(o, "annotations", a->annotations);
        json_object_set_new(o, "startsAt", json_time(a->fired_at));
        json_object_set_new(o, "endsAt", json_time(a->state == ALERT_FIRING ? 0 : a->resolved_at));
        json_object_set_new(o, "generatorURL", json_string(gen ? gen : ""));
        json_object_set_new(o, "fingerprint", json_string(fp));
        json_array_append_new(alerts, o);
    }
    free(gen);
    json_t *p = json_object();
    json_object_set_new(p, "receiver", json_string(g->receiver));
    json_object_set_new(p, "status", json_string(group_status(g)));
    json_object_set_new(p, "alerts", alerts);
    json_object_set(p, "groupLabels", g->group_labels);
    json_object_set_new(p, "commonLabels", common_of(g, false));
    json_object_set_new(p, "commonAnnotations", common_of(g, true));
    json_object_set_new(p, "externalURL", json_string(g->external_url ? g->external_url : ""));
    json_object_set_new(p, "version", json_string("4"));
    json_object_set_new(p, "groupKey", json_string(g->group_key));
    json_object_set_new(p, "truncatedAlerts", json_integer(0));
    return dump(p);
}

char *notify_payload_alertmanager(const struct notify_group *g)
{
    char *gen = generator_url(g);
    json_t *arr = json_array();
    for (int i = 0; i < g->n_alerts; i++) {
        const struct alert_view *a = g->alerts[i];
        json_t *o = json_object();
        json_object_set(o, "labels", a->labels);
        json_object_set(o, "annotations", a->annotations);
        json_object_set_new(o, "startsAt", json_time(a->fired_at));
        /* a firing alert stays valid for four resends (as Prometheus sends it): Alertmanager resolves it
         * by itself if we stop sending */
        json_object_set_new(o, "endsAt", json_time(a->state == ALERT_FIRING ? g->now_unix + 4 * g->resend_s
                                                                             : a->resolved_at));
        json_object_set_new(o, "generatorURL", json_string(gen ? gen : ""));
        json_array_append_new(arr, o);
    }
    free(gen);
    return dump(arr);
}

static json_t *slack_text(const char *type, const char *text)
{
    json_t *t = json_object();
    json_object_set_new(t, "type", json_string(type));
    json_object_set_new(t, "text", json_string(text));
    return t;
}

char *notify_payload_slack(const struct notify_group *g)
{
    int n_firing = 0;
    for (int i = 0; i < g->n_alerts; i++)
        n_firing += g->alerts[i]->state == ALERT_FIRING;
    /* Alertmanager's default title: [FIRING:2] <group label values> */
    char title[256];
    int off = n_firing ? snprintf(title, sizeof title, "[FIRING:%d]", n_firing)
                       : snprintf(title, sizeof title, "[RESOLVED]");
    const char *k;
    json_t *v;
    json_object_foreach(g->group_labels, k, v)
    {
        if (off < (int)sizeof title - 1)
            off += snprintf(title + off, sizeof title - (size_t)off, " %s", json_string_value(v));
    }
    json_t *blocks = json_array();
    json_t *header = json_object();
    json_object_set_new(header, "type", json_string("header"));
    char head[151]; /* Slack's limit for a header's text */
    memcpy(head, title, sizeof head - 1);
    head[sizeof head - 1] = 0;
    json_object_set_new(header, "text", slack_text("plain_text", head));
    json_array_append_new(blocks, header);
    int shown = 0;
    for (int i = 0; i < g->n_alerts && shown < 20; i++, shown++) {
        const struct alert_view *a = g->alerts[i];
        char since[32], line[2048];
        alert_time_format(a->state == ALERT_FIRING ? a->fired_at : a->resolved_at, since);
        const char *summary = json_string_value(json_object_get(a->annotations, "summary"));
        const char *desc = json_string_value(json_object_get(a->annotations, "description"));
        const char *sev = json_string_value(json_object_get(a->labels, "severity"));
        snprintf(line, sizeof line, "%s *%s*%s%s%s %s since %s\n`%s %s %g` (now %.4g)%s%s%s%s",
                 a->state == ALERT_FIRING ? ":red_circle:" : ":large_green_circle:", a->rule->name, sev ? " (" : "",
                 sev ? sev : "", sev ? ")" : "", view_status(a), since, a->rule->measure_name,
                 a->rule->op == ALERT_OP_GT ? ">" : a->rule->op == ALERT_OP_GE ? ">=" : a->rule->op == ALERT_OP_LT ? "<"
                 : a->rule->op == ALERT_OP_LE ? "<=" : a->rule->op == ALERT_OP_EQ ? "==" : "!=",
                 a->rule->threshold, a->value, summary ? "\n" : "", summary ? summary : "", desc ? "\n" : "",
                 desc ? desc : "");
        json_t *sec = json_object();
        json_object_set_new(sec, "type", json_string("section"));
        json_object_set_new(sec, "text", slack_text("mrkdwn", line));
        json_array_append_new(blocks, sec);
    }
    char foot[512];
    if (g->n_alerts > shown)
        snprintf(foot, sizeof foot, "and %d more; %s/v1/alerts", g->n_alerts - shown, g->external_url);
    else
        snprintf(foot, sizeof foot, "wafer %s/dashboard", g->external_url);
    json_t *ctx = json_object();
    json_object_set_new(ctx, "type", json_string("context"));
    json_t *els = json_array();
    json_array_append_new(els, slack_text("mrkdwn", foot));
    json_object_set_new(ctx, "elements", els);
    json_array_append_new(blocks, ctx);
    json_t *p = json_object();
    json_object_set_new(p, "text", json_string(title)); /* the notification's fallback text */
    json_object_set_new(p, "blocks", blocks);
    return dump(p);
}

char *notify_receiver_url(const struct alert_receiver *r)
{
    if (r->kind != ALERT_RECV_ALERTMANAGER)
        return strdup(r->url);
    size_t n = strlen(r->url);
    while (n && r->url[n - 1] == '/')
        n--;
    static const char suffix[] = "/api/v2/alerts";
    if (n >= sizeof suffix - 1 && !strncmp(r->url + n - (sizeof suffix - 1), suffix, sizeof suffix - 1))
        return strndup(r->url, n);
    char *u = NULL;
    return asprintf(&u, "%.*s%s", (int)n, r->url, suffix) < 0 ? NULL : u;
}

double notify_parse_retry_after(const char *v, double now_unix)
{
    while (*v == ' ')
        v++;
    char *end;
    errno = 0;
    double s = strtod(v, &end);
    if (end != v && !errno && s >= 0) {
        while (*end == ' ' || *end == '\r' || *end == '\n')
            end++;
        if (!*end)
            return s;
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *r = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!r)
        return -1;
    double t = (double)timegm(&tm) - now_unix;
    return t > 0 ? t : 0;
}

/* ---------------------------------------------------------------- planning (grouping, dedup) */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted, comma-separated fingerprints of the alerts in state st. Caller frees. */
static char *fp_set(const struct alert_view *const *as, int n, enum alert_state st)
{
    uint64_t *fps = malloc((size_t)(n ? n : 1) * sizeof *fps);
    char *s = malloc((size_t)n * 17 + 1);
    if (!fps || !s) {
        free(fps);
        free(s);
        return NULL;
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        if (as[i]->state == st)
            fps[k++] = as[i]->fingerprint;
    qsort(fps, (size_t)k, sizeof *fps, cmp_u64);
    s[0] = 0;
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        char fp[17];
        alert_fingerprint_format(fps[i], fp);
        off += (size_t)sprintf(s + off, "%s%s", i ? "," : "", fp);
    }
    free(fps);
    return s;
}

/* Whether every fingerprint of a is in b (both sorted comma lists; "" is empty). */
static bool fp_subset(const char *a, const char *b)
{
    for (const char *p = a; *p;) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (const char *q = b; *q && !found;) {
            size_t m = strcspn(q, ",");
            found = m == n && !strncmp(p, q, n);
            q += m + (q[m] == ',');
        }
        if (!found)
            return false;
        p += n + (p[n] == ',');
    }
    return true;
}

/* Alertmanager's DedupStage.needsUpdate. */
static bool needs_update(const struct alert_nlog *entry, const char *firing, const char *resolved, bool send_resolved,
                         double repeat_s, double now)
{
    if (!entry)
        return *firing != 0;
    if (!fp_subset(firing, entry->firing))
        return true;
    if (!*firing)
        return *entry->firing != 0; /* everything resolved since the last notification */
    if (send_resolved && !fp_subset(resolved, entry->resolved))
        return true;
    return now - entry->sent_at >= repeat_s;
}

static bool routed_to(const struct alert_rule *r, const char *receiver)
{
    if (!r->n_receivers)
        return true;
    for (int i = 0; i < r->n_receivers; i++)
        if (!strcmp(r->receivers[i], receiver))
            return true;
    return false;
}

/* Group labels of an alert for a receiver, and the group key {}:{a="x", b="y"} (sorted by name). */
static json_t *group_labels_of(const struct alert_receiver *r, const struct alert_view *a, char *key, size_t cap)
{
    const char *names[ALERT_MAX_LIST];
    int n = 0;
    for (int i = 0; i < r->n_group_by; i++)
        if (json_object_get(a->labels, r->group_by[i]))
            names[n++] = r->group_by[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    json_t *g = json_object();
    size_t off = (size_t)snprintf(key, cap, "{}:{");
    for (int i = 0; i < n; i++) {
        const char *v = json_string_value(json_object_get(a->labels, names[i]));
        json_object_set_new(g, names[i], json_string(v));
        if (off < cap)
            off += (size_t)snprintf(key + off, cap - off, "%s%s=\"%s\"", i ? ", " : "", names[i], v);
    }
    if (off < cap)
        snprintf(key + off, cap - off, "}");
    return g;
}

static int plan_group(struct notify *n, const struct alert_receiver *r, const char *key, json_t *glabels,
                      const struct alert_view **members, int n_members, double now)
{
    char *firing = fp_set(members, n_members, ALERT_FIRING);
    char *resolved = fp_set(members, n_members, ALERT_RESOLVED);
    if (!firing || !resolved) {
        free(firing);
        free(resolved);
        return 0;
    }
    struct alert_nlog entry;
    bool have = alert_store_nlog_get(n->store, r->name, key, &entry) == 0;
    int queued = 0;
    if (needs_update(have ? &entry : NULL, firing, resolved, r->send_resolved, r->repeat_interval_s, now)) {
        double first_fired = now;
        for (int i = 0; i < n_members; i++)
            if (members[i]->state == ALERT_FIRING && members[i]->fired_at < first_fired)
                first_fired = members[i]->fired_at;
        bool due = have ? now - entry.sent_at >= r->group_interval_s : now - first_fired >= r->group_wait_s;
        if (due) {
            /* resolved alerts go out only to receivers that want them */
            const struct alert_view **shown = malloc((size_t)n_members * sizeof *shown);
            int n_shown = 0;
            for (int i = 0; shown && i < n_members; i++)
                if (members[i]->state == ALERT_FIRING || r->send_resolved)
                    shown[n_shown++] = members[i];
            struct notify_group g = {.receiver = r->name, .group_key = key, .group_labels = glabels,
                                     .alerts = shown, .n_alerts = n_shown, .external_url = n->external_url,
                                     .now_unix = now, .resend_s = r->repeat_interval_s};
            struct alert_nlog log = {.firing = firing, .resolved = resolved, .sent_at = now};
            char *body = NULL, *url = notify_receiver_url(r);
            if (shown && n_shown)
                body = r->kind == ALERT_RECV_WEBHOOK        ? notify_payload_webhook(&g)
                       : r->kind == ALERT_RECV_ALERTMANAGER ? notify_payload_alertmanager(&g)
                                                            : notify_payload_slack(&g);
            if (shown && !n_shown) {
                /* everything resolved and this receiver does not want resolved notifications: only the log
                 * moves on, so the group is settled */
                alert_store_nlog_put(n->store, r->name, key, &log);
            } else if (body && url && alert_store_enqueue(n->store, r->name, key, url, body, now, &log) == 0) {
                queued = 1;
                log_info("alerts: %s notification for %s queued to receiver %s", group_status(&g), key, r->name);
            } else {
                log_warn("alerts: cannot queue a notification for %s to %s (out of memory or store error)", key,
                         r->name);
            }
            free(body);
            free(url);
            free(shown);
        }
    }
    if (have)
        alert_nlog_deinit(&entry);
    free(firing);
    free(resolved);
    return queued;
}

int notify_plan(struct notify *n, const struct alert_view *alerts, int n_alerts, double now)
{
    int queued = 0;
    const struct alert_view **mine = malloc((size_t)(n_alerts ? n_alerts : 1) * sizeof *mine);
    const struct alert_view **members = malloc((size_t)(n_alerts ? n_alerts : 1) * sizeof *members);
    bool *done = calloc((size_t)(n_alerts ? n_alerts : 1), sizeof *done);
    if (!mine || !members || !done)
        goto out;
    for (int ri = 0; ri < n->cfg->n_receivers; ri++) {
        const struct alert_receiver *r = &n->cfg->receivers[ri];
        int n_mine = 0;
        for (int i = 0; i < n_alerts; i++)
            if ((alerts[i].state == ALERT_FIRING || alerts[i].state == ALERT_RESOLVED) &&
                routed_to(alerts[i].rule, r->name))
                mine[n_mine++] = &alerts[i];
        memset(done, 0, (size_t)n_mine * sizeof *done);
        for (int i = 0; i < n_mine; i++) {
            if (done[i])
                continue;
            char key[1024], other[1024];
            json_t *gl = group_labels_of(r, mine[i], key, sizeof key);
            int n_members = 0;
            for (int j = i; j < n_mine; j++) {
                if (done[j])
                    continue;
                json_decref(group_labels_of(r, mine[j], other, sizeof other));
                if (!strcmp(key, other)) {
                    members[n_members++] = mine[j];
                    done[j] = true;
                }
            }
            queued += plan_group(n, r, key, gl, members, n_members, now);
            json_decref(gl);
        }
    }
out:
    free(mine);
    free(members);
    free(done);
    if (queued) {
        pthread_mutex_lock(&n->mu);
        pthread_cond_signal(&n->cv);
        pthread_mutex_unlock(&n->mu);
    }
    return queued;
}

void notify_stats_get(struct notify *n, struct notify_stats *out)
{
    pthread_mutex_lock(&n->mu);
    out->sent = n->sent;
    out->failed_posts = n->failed_posts;
    out->dropped = n->dropped;
    pthread_mutex_unlock(&n->mu);
    int p = alert_store_outbox_count(n->store, NULL);
    out->pending = p > 0 ? p : 0;
}

/* ---------------------------------------------------------------- the notifier thread */

struct post_result {
    long status;        /* HTTP status, 0 when no response */
    double retry_after; /* seconds, -1 when absent */
    char error[CURL_ERROR_SIZE];
};

static size_t post_discard(char *p, size_t size, size_t n, void *ctx) { return size * n; }

static size_t post_header(char *p, size_t size, size_t n, void *ctx)
{
    struct post_result *r = ctx;
    size_t len = size * n;
    if (len > 12 && !strncasecmp(p, "Retry-After:", 12)) {
        char v[128];
        size_t m = len - 12 < sizeof v - 1 ? len - 12 : sizeof v - 1;
        memcpy(v, p + 12, m);
        v[m] = 0;
        r->retry_after = notify_parse_retry_after(v, wall_now());
    }
    return len;
}

static void post_json(const char *url, const char *body, double timeout_s, struct post_result *r)
{
    memset(r, 0, sizeof *r);
    r->retry_after = -1;
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(r->error, sizeof r->error, "cannot create a curl handle");
        return;
    }
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "User-Agent: wafer-alerts");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, post_discard);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, post_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->error);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    else if (!r->error[0])
        snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(rc));
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

static int receiver_index(const struct notify *n, const char *name)
{
    for (int i = 0; i < n->cfg->n_receivers; i++)
        if (!strcmp(n->cfg->receivers[i].name, name))
            return i;
    return -1;
}

/* Posts one row and records the outcome. */
static void deliver(struct notify *n, const struct alert_outbox_row *row, int ri)
{
    const struct alert_receiver *r = ri >= 0 ? &n->cfg->receivers[ri] : NULL;
    double timeout = r ? r->timeout_s : 5, max_backoff = r ? r->max_backoff_s : 300;
    int max_attempts = r ? r->max_attempts : 10;
    struct post_result res;
    post_json(row->url, row->body, timeout, &res);
    double now = wall_now();
    if (ri >= 0)
        n->last_post[ri] = now;
    if (res.status >= 200 && res.status < 300) {
        alert_store_outbox_delete(n->store, row->id);
        pthread_mutex_lock(&n->mu);
        n->sent++;
        pthread_mutex_unlock(&n->mu);
        log_info("alerts: notification for %s delivered to %s (%ld, attempt %d)", row->group_key, row->receiver,
                 res.status, row->attempts + 1);
        return;
    }
    int attempts = row->attempts + 1;
    char why[CURL_ERROR_SIZE + 32];
    if (res.status)
        snprintf(why, sizeof why, "HTTP %ld", res.status);
    else
        snprintf(why, sizeof why, "%s", res.error[0] ? res.error : "no response");
    bool refused = res.status >= 400 && res.status < 500 && res.status != 408 && res.status != 429;
    pthread_mutex_lock(&n->mu);
    n->failed_posts++;
    if (refused || attempts >= max_attempts)
        n->dropped++;
    pthread_mutex_unlock(&n->mu);
    if (refused || attempts >= max_attempts) {
        alert_store_outbox_delete(n->store, row->id);
        log_error("alerts: notification for %s to %s dropped after %d attempt(s): %s%s", row->group_key,
                  row->receiver, attempts, why, refused ? " (the receiver refuses it; check its URL and payload)" : "");
        return;
    }
    double wait = pow(2, attempts - 1);
    if ((res.status == 429 || res.status == 503) && res.retry_after >= 0)
        wait = res.retry_after < 3600 ? res.retry_after : 3600;
    else if (wait > max_backoff)
        wait = max_backoff;
    alert_store_outbox_retry(n->store, row->id, attempts, now + wait);
    log_warn("alerts: posting to %s failed (%s); attempt %d of %d, next in %.1f s", row->receiver, why, attempts,
             max_attempts, wait);
}

static void *notify_thread(void *arg)
{
    struct notify *n = arg;
    for (;;) {
        pthread_mutex_lock(&n->mu);
        bool stop = n->stop;
        pthread_mutex_unlock(&n->mu);
        if (stop)
            break;
        struct alert_outbox_row *rows = NULL;
        int nr = 0;
        alert_store_outbox_heads(n->store, &rows, &nr);
        double now = wall_now(), wake = now + 5;
        int pick = -1, pick_ri = -1;
        for (int i = 0; i < nr; i++) {
            int ri = receiver_index(n, rows[i].receiver);
            double due = rows[i].next_try;
            if (ri >= 0 && n->last_post[ri] + n->cfg->receivers[ri].min_interval_s > due)
                due = n->last_post[ri] + n->cfg->receivers[ri].min_interval_s;
            if (due <= now && pick < 0) {
                pick = i;
                pick_ri = ri;
            } else if (due < wake) {
                wake = due;
            }
        }
        if (pick >= 0) {
            deliver(n, &rows[pick], pick_ri);
            alert_store_rows_free(rows, nr);
            continue;
        }
        alert_store_rows_free(rows, nr);
        /* sleep until the next row is due, a new one is queued, or stop */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double dt = wake - now;
        dt = dt < 0.01 ? 0.01 : dt > 5 ? 5 : dt;
        ts.tv_sec += (time_t)dt;
        ts.tv_nsec += (long)((dt - floor(dt)) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&n->mu);
        if (!n->stop)
            pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        pthread_mutex_unlock(&n->mu);
    }
    return NULL;
}

int notify_start(struct notify *n)
{
    if (pthread_create(&n->thread, NULL, notify_thread, n))
        return ERR_INTERNAL;
    n->started = true;
    return 0;
}

/* ---------------------------------------------------------------- GET /v1/alerts */

static json_t *aj_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *aj_time(double t)
{
    if (!(t > 0))
        return json_null();
    char buf[32];
    alert_time_format(t, buf);
    return json_string(buf);
}

static const char *aj_op(enum alert_op op)
{
    static const char *const names[] = {">", ">=", "<", "<=", "==", "!="};
    return names[op];
}

char *notify_alerts_json(struct alert_engine *e, const struct alert_config *cfg, struct notify *nt, size_t *len)
{
    int n;
    struct alert_view *v = alert_engine_views(e, true, &n);
    json_t *alerts = json_array(), *rules = json_array();
    for (int i = 0; i < n; i++) {
        const struct alert_view *a = &v[i];
        const struct alert_rule *r = a->rule;
        char val[48], fp[17];
        snprintf(val, sizeof val, "%g", a->value);
        alert_fingerprint_format(a->fingerprint, fp);
        if (a->state == ALERT_PENDING || a->state == ALERT_FIRING) {
            /* Prometheus's /api/v1/alerts shape */
            json_t *x = json_object();
            json_object_set(x, "labels", a->labels);
            json_object_set(x, "annotations", a->annotations);
            json_object_set_new(x, "state", json_string(alert_state_name(a->state)));
            json_object_set_new(x, "activeAt", aj_time(a->active_at));
            json_object_set_new(x, "value", json_string(val));
            json_array_append_new(alerts, x);
        }
        json_t *y = json_object();
        json_object_set_new(y, "name", json_string(r->name));
        json_object_set_new(y, "measure", json_string(r->measure_name));
        json_object_set_new(y, "op", json_string(aj_op(r->op)));
        json_object_set_new(y, "threshold", json_real(r->threshold));
        json_object_set_new(y, "window_s", json_real(r->window_s > 0 ? r->window_s : cfg->interval_s));
        json_object_set_new(y, "for_s", json_real(r->for_s));
        json_object_set_new(y, "severity", r->severity ? json_string(r->severity) : json_null());
        json_object_set_new(y, "state", json_string(alert_state_name(a->state)));
        json_object_set_new(y, "value", aj_num(a->value));
        json_object_set_new(y, "activeAt", aj_time(a->active_at));
        json_object_set_new(y, "firedAt", aj_time(a->fired_at));
        json_object_set_new(y, "resolvedAt", aj_time(a->resolved_at));
        json_object_set_new(y, "fingerprint", json_string(fp));
        json_object_set(y, "labels", a->labels);
        json_object_set(y, "annotations", a->annotations);
        json_array_append_new(rules, y);
    }
    alert_views_free(v, n);
    json_t *data = json_object();
    json_object_set_new(data, "alerts", alerts);
    json_t *root = json_object();
    json_object_set_new(root, "status", json_string("success"));
    json_object_set_new(root, "data", data);
    json_object_set_new(root, "rules", rules);
    json_object_set_new(root, "interval_s", json_real(cfg->interval_s));
    if (nt) {
        struct notify_stats ns;
        notify_stats_get(nt, &ns);
        json_t *nj = json_object();
        json_object_set_new(nj, "sent", json_integer(ns.sent));
        json_object_set_new(nj, "failed_posts", json_integer(ns.failed_posts));
        json_object_set_new(nj, "dropped", json_integer(ns.dropped));
        json_object_set_new(nj, "pending", json_integer(ns.pending));
        json_t *recv = json_array();
        for (int i = 0; i < cfg->n_receivers; i++)
            json_array_append_new(recv, json_string(cfg->receivers[i].name));
        json_object_set_new(nj, "receivers", recv);
        json_object_set_new(root, "notifications", nj);
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (s && len)
        *len = strlen(s);
    return s;
}

