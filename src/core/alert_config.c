/*
 * alert_config: the `alerts:` section of a YAML config (libfyaml) into struct alert_config. Shared by
 * `wafer serve`, `wafer alerts check` and, later, `wafer route`, so it lives with the engine in core.
 *
 * Every key is checked here once: unknown keys, unknown measures, bad numbers and references to receivers
 * that do not exist are errors naming file:line and the key's path ("alerts.rules[1].measure"), never a
 * silent default. Durations take plain seconds or a unit (500ms, 30s, 5m, 1h, 1d); Prometheus's `for` is
 * accepted for `for_s`.
 */
#include "core/alert.h"

#include "core/err.h"
#include "core/yaml.h"

#include <ctype.h>
#include <errno.h>
#include <libfyaml.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALERT_MAX_WINDOW_S 86400.0

void alert_config_init(struct alert_config *c)
{
    memset(c, 0, sizeof *c);
    c->interval_s = 5;
    c->resolved_retention_s = 900;
}

static void labels_deinit(struct alert_labels *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->key[i]);
        free(l->value[i]);
    }
    l->n = 0;
}

void alert_config_deinit(struct alert_config *c)
{
    for (int i = 0; i < c->n_rules; i++) {
        struct alert_rule *r = &c->rules[i];
        free(r->name);
        free(r->measure_name);
        free(r->severity);
        labels_deinit(&r->labels);
        labels_deinit(&r->annotations);
        for (int k = 0; k < r->n_receivers; k++)
            free(r->receivers[k]);
    }
    for (int i = 0; i < c->n_receivers; i++) {
        struct alert_receiver *r = &c->receivers[i];
        free(r->name);
        free(r->url);
        for (int k = 0; k < r->n_group_by; k++)
            free(r->group_by[k]);
    }
    free(c->rules);
    free(c->receivers);
    free(c->data_dir);
    free(c->external_url);
    alert_config_init(c);
}

/* ---------------------------------------------------------------- YAML helpers */

struct acfg {
    const char *file;
    char *err;
};

static int node_line(struct fy_node *n)
{
    int line = yaml_scalar_line(n);
    if (line)
        return line;
    /* a mapping: the line of its first key */
    if (n && fy_node_is_mapping(n)) {
        void *it = NULL;
        struct fy_node_pair *p = fy_node_mapping_iterate(n, &it);
        if (p)
            return node_line(fy_node_pair_key(p));
    }
    if (n && fy_node_is_sequence(n)) {
        void *it = NULL;
        struct fy_node *e = fy_node_sequence_iterate(n, &it);
        if (e)
            return node_line(e);
    }
    return 0;
}

/* NUL-terminated copy of a scalar (caller frees), or NULL when n is not a scalar. */
static char *node_str(struct fy_node *n)
{
    if (!n || !fy_node_is_scalar(n) || fy_node_is_alias(n))
        return NULL;
    size_t len;
    const char *s = fy_node_get_scalar(n, &len);
    return s ? strndup(s, len) : NULL;
}

static int bad(struct acfg *a, struct fy_node *n, int fallback_line, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int bad(struct acfg *a, struct fy_node *n, int fallback_line, const char *path, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = node_line(n);
    return err_set(a->err, ERR_INVALID_ARG, "%s:%d: %s: %s", a->file, line ? line : fallback_line, path, msg);
}

/* "30", "30s", "500ms", "5m", "1h", "1d" -> seconds. */
static int parse_duration(const char *s, double *out)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return ERR_INVALID_ARG;
    double mul = !*end || !strcmp(end, "s") ? 1 : !strcmp(end, "ms") ? 1e-3 : !strcmp(end, "m") ? 60
               : !strcmp(end, "h") ? 3600 : !strcmp(end, "d") ? 86400 : -1;
    if (mul < 0)
        return ERR_INVALID_ARG;
    *out = v * mul;
    return 0;
}

static int get_duration(struct acfg *a, struct fy_node *v, const char *path, double lo, double hi, double *out)
{
    char *s = node_str(v);
    double x = 0;
    int rc = !s || parse_duration(s, &x) || x < lo || x > hi;
    if (rc) {
        int r = bad(a, v, 0, path, "'%s' is not a duration in [%g, %g] s (seconds, or a number with ms/s/m/h/d)",
                    s ? s : "(not a scalar)", lo, hi);
        free(s);
        return r;
    }
    free(s);
    *out = x;
    return 0;
}

static int get_number(struct acfg *a, struct fy_node *v, const char *path, double lo, double hi, double *out)
{
    char *s = node_str(v);
    char *end = NULL;
    errno = 0;
    double x = s ? strtod(s, &end) : NAN;
    if (!s || end == s || *end || errno || !isfinite(x) || x < lo || x > hi) {
        int r = bad(a, v, 0, path, "'%s' is not a number in [%g, %g]", s ? s : "(not a scalar)", lo, hi);
        free(s);
        return r;
    }
    free(s);
    *out = x;
    return 0;
}

static int get_string(struct acfg *a, struct fy_node *v, const char *path, char **out)
{
    char *s = node_str(v);
    if (!s || !*s) {
        free(s);
        return bad(a, v, 0, path, "must be a non-empty string");
    }
    free(*out);
    *out = s;
    return 0;
}

static int get_bool(struct acfg *a, struct fy_node *v, const char *path, bool *out)
{
    char *s = node_str(v);
    int rc = 0;
    if (s && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on")))
        *out = true;
    else if (s && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off")))
        *out = false;
    else
        rc = bad(a, v, 0, path, "'%s' is not a boolean (true or false)", s ? s : "(not a scalar)");
    free(s);
    return rc;
}

static bool label_name_ok(const char *s)
{
    if (!*s || !(isalpha((unsigned char)*s) || *s == '_'))
        return false;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_'))
            return false;
    return true;
}

/* A mapping of strings (labels, annotations). */
static int get_labels(struct acfg *a, struct fy_node *v, const char *path, bool check_names, struct alert_labels *out)
{
    labels_deinit(out);
    if (!v || !fy_node_is_mapping(v))
        return bad(a, v, 0, path, "must be a mapping of names to strings, e.g. {team: inference}");
    void *it = NULL;
    struct fy_node_pair *p;
    while ((p = fy_node_mapping_iterate(v, &it))) {
        char *k = node_str(fy_node_pair_key(p)), *val = node_str(fy_node_pair_value(p));
        if (!k || !val || (check_names && !label_name_ok(k)) || out->n >= ALERT_MAX_LABELS ||
            (check_names && (!strcmp(k, "alertname") || !strcmp(k, "severity")))) {
            char why[160];
            if (!k || !val)
                snprintf(why, sizeof why, "entries must be name: string");
            else if (out->n >= ALERT_MAX_LABELS)
                snprintf(why, sizeof why, "too many entries (at most %d)", ALERT_MAX_LABELS);
            else if (!label_name_ok(k))
                snprintf(why, sizeof why, "'%.64s' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)", k);
            else
                snprintf(why, sizeof why, "'alertname' and 'severity' are set from the rule's name and severity");
            int r = bad(a, fy_node_pair_key(p), node_line(v), path, "%s", why);
            free(k);
            free(val);
            return r;
        }
        out->key[out->n] = k;
        out->value[out->n] = val;
        out->n++;
    }
    return 0;
}

/* A list of strings, or one string. */
static int get_list(struct acfg *a, struct fy_node *v, const char *path, char **list, int *n)
{
    for (int i = 0; i < *n; i++)
        free(list[i]);
    *n = 0;
    if (v && fy_node_is_scalar(v)) {
        char *s = node_str(v);
        if (!s || !*s) {
            free(s);
            return bad(a, v, 0, path, "must be a name or a list of names");
        }
        list[(*n)++] = s;
        return 0;
    }
    if (!v || !fy_node_is_sequence(v))
        return bad(a, v, 0, path, "must be a name or a list of names");
    void *it = NULL;
    struct fy_node *e;
    while ((e = fy_node_sequence_iterate(v, &it))) {
        char *s = node_str(e);
        if (!s || !*s || *n >= ALERT_MAX_LIST) {
            free(s);
            return bad(a, e, node_line(v), path, "%s", *n >= ALERT_MAX_LIST ? "at most 16 entries" : "entries must be names");
        }
        list[(*n)++] = s;
    }
    return 0;
}

/* ---------------------------------------------------------------- rules and receivers */

static int parse_op(const char *s, enum alert_op *op)
{
    static const struct {
        const char *s;
        enum alert_op op;
    } ops[] = {{">", ALERT_OP_GT}, {">=", ALERT_OP_GE}, {"<", ALERT_OP_LT},
               {"<=", ALERT_OP_LE}, {"==", ALERT_OP_EQ}, {"!=", ALERT_OP_NE}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(s, ops[i].s)) {
            *op = ops[i].op;
            return 0;
        }
    return ERR_INVALID_ARG;
}

static int parse_rule(struct acfg *a, struct fy_node *m, int idx, struct alert_rule *r)
{
    char base[48], path[96];
    snprintf(base, sizeof base, "alerts.rules[%d]", idx);
    r->line = node_line(m);
    r->op = ALERT_OP_GT;
    r->burn.latency_hist = -1;
    r->burn.objective = 0.99;
    if (!fy_node_is_mapping(m))
        return bad(a, m, 0, base, "must be a mapping with name, measure, op, threshold, ...");
    bool has_threshold = false;
    char *latency = NULL;
    double latency_ms = 0;
    void *it = NULL;
    struct fy_node_pair *p;
    int rc = 0;
    while (!rc && (p = fy_node_mapping_iterate(m, &it))) {
        char *k = node_str(fy_node_pair_key(p));
        struct fy_node *v = fy_node_pair_value(p);
        snprintf(path, sizeof path, "%s.%s", base, k ? k : "?");
        if (!k)
            rc = bad(a, fy_node_pair_key(p), r->line, base, "keys must be plain words");
        else if (!strcmp(k, "name"))
            rc = get_string(a, v, path, &r->name);
        else if (!strcmp(k, "measure") || !strcmp(k, "expr")) {
            rc = get_string(a, v, path, &r->measure_name);
            if (!rc && alert_measure_parse(r->measure_name, &r->measure))
                rc = bad(a, v, 0, path, "unknown measure '%s' (known: %s)", r->measure_name, alert_measure_names());
        } else if (!strcmp(k, "window_s") || !strcmp(k, "window"))
            rc = get_duration(a, v, path, 0.001, ALERT_MAX_WINDOW_S, &r->window_s);
        else if (!strcmp(k, "short_window_s") || !strcmp(k, "short_window"))
            rc = get_duration(a, v, path, 0.001, ALERT_MAX_WINDOW_S, &r->burn.short_window_s);
        else if (!strcmp(k, "objective"))
            rc = get_number(a, v, path, 0.5, 0.999999, &r->burn.objective);
        else if (!strcmp(k, "latency"))
            rc = get_string(a, v, path, &latency);
        else if (!strcmp(k, "latency_ms"))
            rc = get_number(a, v, path, 1e-3, 1e7, &latency_ms);
        else if (!strcmp(k, "op")) {
            char *s = node_str(v);
            if (!s || parse_op(s, &r->op))
                rc = bad(a, v, 0, path, "'%s' is not one of >, >=, <, <=, ==, !=", s ? s : "");
            free(s);
        } else if (!strcmp(k, "threshold")) {
            rc = get_number(a, v, path, -1e300, 1e300, &r->threshold);
            has_threshold = true;
        } else if (!strcmp(k, "for_s") || !strcmp(k, "for"))
            rc = get_duration(a, v, path, 0, 7 * 86400.0, &r->for_s);
        else if (!strcmp(k, "severity"))
            rc = get_string(a, v, path, &r->severity);
        else if (!strcmp(k, "labels"))
            rc = get_labels(a, v, path, true, &r->labels);
        else if (!strcmp(k, "annotations"))
            rc = get_labels(a, v, path, false, &r->annotations);
        else if (!strcmp(k, "receivers") || !strcmp(k, "receiver"))
            rc = get_list(a, v, path, r->receivers, &r->n_receivers);
        else
            rc = bad(a, fy_node_pair_key(p), r->line, path,
                     "unknown key (known: name, measure, window_s, op, threshold, for_s, severity, labels, "
                     "annotations, receivers; burn_rate: objective, short_window_s, latency, latency_ms)");
        free(k);
    }
    if (!rc && !r->name)
        rc = bad(a, m, 0, base, "a rule needs a name");
    if (!rc && !label_name_ok(r->name))
        rc = bad(a, m, 0, base, "name '%s' must be a word ([a-zA-Z_][a-zA-Z0-9_]*), it becomes the alertname", r->name);
    if (!rc && !r->measure_name)
        rc = bad(a, m, 0, base, "rule %s needs a measure (one of: %s)", r->name, alert_measure_names());
    if (!rc && !has_threshold)
        rc = bad(a, m, 0, base, "rule %s needs a threshold", r->name);
    if (!rc && latency) {
        static const char *const hn[ALERT_H_COUNT_] = {"ttft", "itl", "e2e", "queue"};
        for (int h = 0; h < ALERT_H_COUNT_; h++)
            if (!strcmp(latency, hn[h]))
                r->burn.latency_hist = h;
        if (r->burn.latency_hist < 0 || !(latency_ms > 0))
            rc = bad(a, m, 0, base, "rule %s: latency must be ttft, itl, e2e or queue, with latency_ms > 0", r->name);
        r->burn.latency_s = latency_ms / 1e3;
    }
    if (!rc && r->measure.kind == AM_BURN_RATE) {
        if (!(r->window_s > 0))
            r->window_s = 3600;
        if (!(r->burn.short_window_s > 0))
            r->burn.short_window_s = r->window_s / 12;
        if (r->burn.short_window_s > r->window_s)
            rc = bad(a, m, 0, base, "rule %s: short_window_s (%g) is longer than window_s (%g)", r->name,
                     r->burn.short_window_s, r->window_s);
    }
    free(latency);
    return rc;
}

static int parse_receiver(struct acfg *a, struct fy_node *m, int idx, struct alert_receiver *r)
{
    char base[48], path[96];
    snprintf(base, sizeof base, "alerts.receivers[%d]", idx);
    r->send_resolved = true;
    r->group_interval_s = 30;
    r->repeat_interval_s = -1; /* by kind, below */
    r->min_interval_s = 1;
    r->timeout_s = 5;
    r->max_attempts = 10;
    r->max_backoff_s = 300;
    if (!fy_node_is_mapping(m))
        return bad(a, m, 0, base, "must be a mapping {name, kind, url, ...}");
    char *kind = NULL;
    struct fy_node *kind_node = NULL;
    void *it = NULL;
    struct fy_node_pair *p;
    int rc = 0;
    while (!rc && (p = fy_node_mapping_iterate(m, &it))) {
        char *k = node_str(fy_node_pair_key(p));
        struct fy_node *v = fy_node_pair_value(p);
        snprintf(path, sizeof path, "%s.%s", base, k ? k : "?");
        double x;
        if (!k)
            rc = bad(a, fy_node_pair_key(p), node_line(m), base, "keys must be plain words");
        else if (!strcmp(k, "name"))
            rc = get_string(a, v, path, &r->name);
        else if (!strcmp(k, "kind") || !strcmp(k, "type")) {
            rc = get_string(a, v, path, &kind);
            kind_node = v;
        } else if (!strcmp(k, "url"))
            rc = get_string(a, v, path, &r->url);
        else if (!strcmp(k, "send_resolved"))
            rc = get_bool(a, v, path, &r->send_resolved);
        else if (!strcmp(k, "group_by"))
            rc = get_list(a, v, path, r->group_by, &r->n_group_by);
        else if (!strcmp(k, "group_wait_s") || !strcmp(k, "group_wait"))
            rc = get_duration(a, v, path, 0, 86400, &r->group_wait_s);
        else if (!strcmp(k, "group_interval_s") || !strcmp(k, "group_interval"))
            rc = get_duration(a, v, path, 0, 86400, &r->group_interval_s);
        else if (!strcmp(k, "repeat_interval_s") || !strcmp(k, "repeat_interval"))
            rc = get_duration(a, v, path, 1, 30 * 86400.0, &r->repeat_interval_s);
        else if (!strcmp(k, "min_interval_s"))
            rc = get_duration(a, v, path, 0, 3600, &r->min_interval_s);
        else if (!strcmp(k, "timeout_s") || !strcmp(k, "timeout"))
            rc = get_duration(a, v, path, 0.01, 300, &r->timeout_s);
        else if (!strcmp(k, "max_backoff_s"))
            rc = get_duration(a, v, path, 0.01, 86400, &r->max_backoff_s);
        else if (!strcmp(k, "max_attempts")) {
            rc = get_number(a, v, path, 1, 1000, &x);
            r->max_attempts = (int)x;
        } else
            rc = bad(a, fy_node_pair_key(p), node_line(m), path,
                     "unknown key (known: name, kind, url, send_resolved, group_by, group_wait_s, group_interval_s, "
                     "repeat_interval_s, min_interval_s, timeout_s, max_attempts, max_backoff_s)");
        free(k);
    }
    if (!rc && !r->name)
        rc = bad(a, m, 0, base, "a receiver needs a name");
    if (!rc && !kind)
        rc = bad(a, m, 0, base, "receiver %s needs a kind (webhook, alertmanager or slack)", r->name);
    if (!rc) {
        if (!strcmp(kind, "webhook"))
            r->kind = ALERT_RECV_WEBHOOK;
        else if (!strcmp(kind, "alertmanager"))
            r->kind = ALERT_RECV_ALERTMANAGER;
        else if (!strcmp(kind, "slack"))
            r->kind = ALERT_RECV_SLACK;
        else
            rc = bad(a, kind_node, 0, base, "unknown kind '%s' (known: webhook, alertmanager, slack)", kind);
    }
    if (!rc && (!r->url || (strncmp(r->url, "http://", 7) && strncmp(r->url, "https://", 8))))
        rc = bad(a, m, 0, base, "receiver %s needs a url starting with http:// or https://", r->name);
    if (!rc && r->repeat_interval_s < 0)
        r->repeat_interval_s = r->kind == ALERT_RECV_ALERTMANAGER ? 60 : 4 * 3600;
    if (!rc && !r->n_group_by) {
        r->group_by[0] = strdup("alertname");
        r->n_group_by = r->group_by[0] ? 1 : 0;
    }
    free(kind);
    return rc;
}

int alert_config_parse(struct alert_config *c, struct fy_node *node, const char *file, const char *base, char *err)
{
    struct acfg a = {.file = file, .err = err};
    alert_config_deinit(c);
    if (!node || !fy_node_is_mapping(node))
        return bad(&a, node, 0, "alerts", "must be a mapping with interval_s, rules and receivers");
    struct fy_node *rules = NULL, *recvs = NULL;
    void *it = NULL;
    struct fy_node_pair *p;
    int rc = 0;
    while (!rc && (p = fy_node_mapping_iterate(node, &it))) {
        char *k = node_str(fy_node_pair_key(p));
        struct fy_node *v = fy_node_pair_value(p);
        char path[64];
        snprintf(path, sizeof path, "alerts.%s", k ? k : "?");
        if (!k)
            rc = bad(&a, fy_node_pair_key(p), node_line(node), "alerts", "keys must be plain words");
        else if (!strcmp(k, "interval_s") || !strcmp(k, "interval"))
            rc = get_duration(&a, v, path, 0.1, 3600, &c->interval_s);
        else if (!strcmp(k, "resolved_retention_s"))
            rc = get_duration(&a, v, path, 0, 7 * 86400.0, &c->resolved_retention_s);
        else if (!strcmp(k, "data_dir")) {
            char *s = NULL;
            rc = get_string(&a, v, path, &s);
            if (!rc) {
                free(c->data_dir);
                c->data_dir = yaml_resolve_path(base, s);
                rc = c->data_dir ? 0 : ERR_NOMEM;
            }
            free(s);
        } else if (!strcmp(k, "external_url"))
            rc = get_string(&a, v, path, &c->external_url);
        else if (!strcmp(k, "rules"))
            rules = v;
        else if (!strcmp(k, "receivers"))
            recvs = v;
        else
            rc = bad(&a, fy_node_pair_key(p), node_line(node), path,
                     "unknown key (known: interval_s, resolved_retention_s, data_dir, external_url, rules, receivers)");
        free(k);
    }
    if (!rc && rules && !fy_node_is_sequence(rules))
        rc = bad(&a, rules, node_line(node), "alerts.rules", "must be a list of rules (- name: ...)");
    if (!rc && recvs && !fy_node_is_sequence(recvs))
        rc = bad(&a, recvs, node_line(node), "alerts.receivers", "must be a list of receivers (- name: ...)");
    if (!rc && rules) {
        int n = fy_node_sequence_item_count(rules);
        c->rules = calloc((size_t)(n > 0 ? n : 1), sizeof *c->rules);
        if (!c->rules)
            rc = ERR_NOMEM;
        void *si = NULL;
        struct fy_node *e;
        while (!rc && (e = fy_node_sequence_iterate(rules, &si))) {
            rc = parse_rule(&a, e, c->n_rules, &c->rules[c->n_rules]);
            c->n_rules++; /* counted even on error, so deinit frees what it holds */
        }
    }
    if (!rc && recvs) {
        int n = fy_node_sequence_item_count(recvs);
        c->receivers = calloc((size_t)(n > 0 ? n : 1), sizeof *c->receivers);
        if (!c->receivers)
            rc = ERR_NOMEM;
        void *si = NULL;
        struct fy_node *e;
        while (!rc && (e = fy_node_sequence_iterate(recvs, &si))) {
            rc = parse_receiver(&a, e, c->n_receivers, &c->receivers[c->n_receivers]);
            c->n_receivers++;
        }
    }
    /* names unique, references resolve */
    for (int i = 0; !rc && i < c->n_rules; i++)
        for (int j = 0; !rc && j < i; j++)
            if (!strcmp(c->rules[i].name, c->rules[j].name))
                rc = err_set(err, ERR_INVALID_ARG, "%s:%d: alerts.rules[%d].name: '%s' is already the name of rule %d",
                             file, c->rules[i].line, i, c->rules[i].name, j);
    for (int i = 0; !rc && i < c->n_receivers; i++)
        for (int j = 0; !rc && j < i; j++)
            if (!strcmp(c->receivers[i].name, c->receivers[j].name))
                rc = err_set(err, ERR_INVALID_ARG, "%s: alerts.receivers[%d].name: '%s' is used twice", file, i,
                             c->receivers[i].name);
    for (int i = 0; !rc && i < c->n_rules; i++)
        for (int k = 0; !rc && k < c->rules[i].n_receivers; k++) {
            bool found = false;
            for (int j = 0; j < c->n_receivers; j++)
                found |= !strcmp(c->rules[i].receivers[k], c->receivers[j].name);
            if (!found)
                rc = err_set(err, ERR_INVALID_ARG, "%s:%d: alerts.rules[%d].receivers: no receiver is named '%s'", file,
                             c->rules[i].line, i, c->rules[i].receivers[k]);
        }
    if (rc == ERR_NOMEM)
        err_set(err, ERR_NOMEM, "out of memory reading alerts");
    if (rc)
        alert_config_deinit(c);
    return rc;
}

int alert_config_load_string(struct alert_config *c, const char *yaml, size_t len, const char *file, char *err)
{
    int rc;
    struct fy_document *doc = yaml_load(NULL, yaml, len, file, &rc, err);
    if (!doc)
        return rc;
    struct fy_node *root = fy_document_root(doc);
    struct fy_node *al = root && fy_node_is_mapping(root) ? fy_node_mapping_lookup_by_string(root, "alerts", 6) : NULL;
    if (!al) {
        alert_config_deinit(c);
        rc = err_set(err, ERR_INVALID_ARG, "%s: no top-level 'alerts:' section", file);
    } else {
        rc = alert_config_parse(c, al, file, file, err);
    }
    fy_document_destroy(doc);
    return rc;
}
