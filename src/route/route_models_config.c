/*
 * route_models_config: the settings of `wafer serve` in models mode, from a YAML file and flags. Every value
 * is checked here once; a bad file is reported as "path:line: key: what is wrong". Unknown keys are errors
 * (a typo must not silently fall back to a default). docs/models.md is the reference:
 *
 *   server:   {host, port, max_connections, max_body, log_requests, threads, ctx_size, max_batch_size, kv_memory}
 *   models:   - {name, path, aliases: [..], max_batch_size, kv_memory, ctx_size, keep_alive, preload, args: [..]}
 *   models_dir, memory_budget, max_loaded, keep_alive, load_on_request, load_timeout
 *   auth:     {admin_keys: [..], api_keys: [..]}
 */
#include "route/route_models.h"

#include "core/err.h"
#include "core/flags.h"
#include "core/yaml.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

void route_models_config_init(struct route_models_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = strdup("127.0.0.1");
    c->port = 8080;
    c->max_connections = 16384;
    c->max_body = 8 << 20;
    c->log_requests = true;
    c->keep_alive = 300;
    c->load_on_request = true;
    c->load_timeout = 600;
    c->kv_memory = 256 << 20;
}

static void list_free(char **l, int n)
{
    for (int i = 0; i < n; i++)
        free(l[i]);
    free(l);
}

static void model_free(struct route_model_conf *m)
{
    free(m->name);
    free(m->path);
    list_free(m->aliases, m->n_aliases);
    list_free(m->args, m->n_args);
}

void route_models_config_deinit(struct route_models_config *c)
{
    free(c->source);
    free(c->host);
    for (int i = 0; i < c->n_models; i++)
        model_free(&c->models[i]);
    free(c->models);
    list_free(c->admin_keys, c->n_admin_keys);
    list_free(c->api_keys, c->n_api_keys);
    free(c->exe);
    memset(c, 0, sizeof *c);
}

/* ---- scalars --------------------------------------------------------------------------------------- */

static int parse_int(const char *s, long lo, long hi, long *out)
{
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return ERR_INVALID_ARG;
    *out = v;
    return 0;
}

/* Seconds: a number, or with a unit s, m, h ("5m"); negative allowed where lo < 0. */
static int parse_seconds(const char *s, double lo, double hi, double *out)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v))
        return ERR_INVALID_ARG;
    if (!strcmp(end, "m"))
        v *= 60;
    else if (!strcmp(end, "h"))
        v *= 3600;
    else if (*end && strcmp(end, "s"))
        return ERR_INVALID_ARG;
    if (v < lo || v > hi)
        return ERR_INVALID_ARG;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on") || !strcmp(s, "1"))
        *out = true;
    else if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") || !strcmp(s, "0"))
        *out = false;
    else
        return ERR_INVALID_ARG;
    return 0;
}

static int list_add(char ***l, int *n, const char *s)
{
    char **nl = realloc(*l, (size_t)(*n + 1) * sizeof *nl);
    if (!nl)
        return ERR_NOMEM;
    *l = nl;
    if (!(nl[*n] = strdup(s)))
        return ERR_NOMEM;
    (*n)++;
    return 0;
}

/* ---- settings shared by the file and the flags ----------------------------------------------------- */

enum mk_kind { MK_STR, MK_INT, MK_BYTES, MK_SECONDS, MK_BOOL, MK_LIST };

struct mk_item {
    const char *section; /* "" for the top level */
    const char *key;
    const char *flag;
    enum mk_kind kind;
    size_t off, off2;
    double lo, hi;
    const char *help;
};

#define MOFF(f) offsetof(struct route_models_config, f)

static const struct mk_item mk_items[] = {
    {"server", "host", "--host", MK_STR, MOFF(host), 0, 0, 0, "address to listen on (default 127.0.0.1)"},
    {"server", "port", "--port", MK_INT, MOFF(port), 0, 0, 65535, "TCP port (default 8080; 0 picks one)"},
    {"server", "max_connections", "--max-connections", MK_INT, MOFF(max_connections), 0, 1, 1000000,
     "open client connections (default 16384)"},
    {"server", "max_body", "--max-body", MK_BYTES, MOFF(max_body), 0, 1024, 1e12, "largest request body (default 8MiB)"},
    {"server", "log_requests", "--log-requests", MK_BOOL, MOFF(log_requests), 0, 0, 0,
     "one log line per request (default true)"},
    {"server", "threads", "--threads", MK_INT, MOFF(threads), 0, 0, 1024, "compute threads of each model (0: all CPUs)"},
    {"server", "ctx_size", "--ctx-size", MK_INT, MOFF(ctx_size), 0, 0, 1 << 20,
     "default context length of each model (0: the model's)"},
    {"server", "max_batch_size", "--max-batch-size", MK_INT, MOFF(max_batch_size), 0, 0, 1024,
     "default slots of each model (0: serve's default, 16)"},
    {"server", "kv_memory", "--kv-memory", MK_BYTES, MOFF(kv_memory), 0, 1 << 20, 1e15,
     "default KV cache budget of each model (default 256MiB)"},
    {"", "memory_budget", "--memory-budget", MK_BYTES, MOFF(memory_budget), 0, 0, 1e18,
     "loaded models' weights + KV; least recently used idle models are unloaded first (default 0: no budget)"},
    {"", "max_loaded", "--max-loaded", MK_INT, MOFF(max_loaded), 0, 0, 100000,
     "models loaded at once, as OLLAMA_MAX_LOADED_MODELS (default 0: no limit)"},
    {"", "keep_alive", "--keep-alive", MK_SECONDS, MOFF(keep_alive), 0, -1, 1e9,
     "seconds (or 5m, 1h) a model stays loaded after its last request; 0: unload when idle; -1: never (default 300)"},
    {"", "load_on_request", "--load-on-request", MK_BOOL, MOFF(load_on_request), 0, 0, 0,
     "load a model on its first request (default true; false: only POST /admin/models/load does)"},
    {"", "load_timeout", "--load-timeout", MK_SECONDS, MOFF(load_timeout), 0, 1, 1e7,
     "seconds a load, or a wait for memory, may take before requests get 503 (default 600)"},
    {"auth", "admin_keys", "--admin-key", MK_LIST, MOFF(admin_keys), MOFF(n_admin_keys), 0, 0,
     "key for the admin API (repeatable; none: the admin API is open to loopback clients only)"},
    {"auth", "api_keys", "--api-key", MK_LIST, MOFF(api_keys), MOFF(n_api_keys), 0, 0,
     "key /v1 requests must carry (repeatable; none: no auth)"},
};
#define MK_N ((int)(sizeof mk_items / sizeof mk_items[0]))

static int mk_apply(struct route_models_config *c, const struct mk_item *it, const char *v, const char *where,
                    char *err)
{
    void *p = (char *)c + it->off;
    switch (it->kind) {
    case MK_STR: {
        if (!*v)
            return err_set(err, ERR_INVALID_ARG, "%s: must not be empty", where);
        char *s = strdup(v);
        if (!s)
            return err_set(err, ERR_NOMEM, "out of memory");
        free(*(char **)p);
        *(char **)p = s;
        return 0;
    }
    case MK_INT: {
        long x;
        if (parse_int(v, (long)it->lo, (long)it->hi, &x))
            return err_set(err, ERR_INVALID_ARG, "%s: expected an integer in [%.0f, %.0f], got '%s'", where, it->lo,
                           it->hi, v);
        *(int *)p = (int)x;
        return 0;
    }
    case MK_BYTES: {
        int64_t x;
        if (flags_bytes_parse(v, &x) || (double)x < it->lo || (double)x > it->hi)
            return err_set(err, ERR_INVALID_ARG, "%s: expected a size such as 512MiB or 12GiB (at least %.0f bytes), got '%s'",
                           where, it->lo, v);
        *(int64_t *)p = x;
        return 0;
    }
    case MK_SECONDS: {
        double x;
        if (parse_seconds(v, it->lo, it->hi, &x))
            return err_set(err, ERR_INVALID_ARG, "%s: expected seconds (a number, or with s, m, h) in [%g, %g], got '%s'",
                           where, it->lo, it->hi, v);
        *(double *)p = x;
        return 0;
    }
    case MK_BOOL:
        if (parse_bool(v, (bool *)p))
            return err_set(err, ERR_INVALID_ARG, "%s: expected true or false, got '%s'", where, v);
        return 0;
    case MK_LIST:
        if (!*v)
            return err_set(err, ERR_INVALID_ARG, "%s: a key must not be empty", where);
        if (list_add((char ***)p, (int *)((char *)c + it->off2), v))
            return err_set(err, ERR_NOMEM, "out of memory");
        return 0;
    }
    return ERR_INTERNAL;
}

/* ---- YAML ------------------------------------------------------------------------------------------ */

struct mc_ctx {
    struct route_models_config *c;
    const char *name; /* for messages */
    const char *base; /* the file, for relative paths; NULL for text */
    char *err;
};

static int mc_err(struct mc_ctx *x, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int mc_err(struct mc_ctx *x, int line, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(x->err, ERR_INVALID_ARG, "%s:%d: %s", x->name, line, msg);
}

/* The line of a node: a scalar's, or a mapping's first key's. */
static int node_line(struct fy_node *n, int dflt)
{
    if (n && fy_node_is_mapping(n)) {
        void *it = NULL;
        struct fy_node_pair *p = fy_node_mapping_iterate(n, &it);
        int l = p ? yaml_scalar_line(fy_node_pair_key(p)) : 0;
        if (l)
            return l;
    }
    if (n && fy_node_is_sequence(n)) {
        void *it = NULL;
        struct fy_node *e = fy_node_sequence_iterate(n, &it);
        if (e)
            return node_line(e, dflt);
    }
    int l = yaml_scalar_line(n);
    return l ? l : dflt;
}

/* A scalar setting (or, for MK_LIST, a list of scalars or one scalar). */
static int mc_item(struct mc_ctx *x, const struct mk_item *it, struct fy_node *v, int kl)
{
    char val[4096], where[600];
    const char *sect = it->section;
    int vl = node_line(v, kl);
    snprintf(where, sizeof where, "%s:%d: %s%s%s", x->name, vl, sect, *sect ? "." : "", it->key);
    if (it->kind == MK_LIST) { /* the file's list replaces what was there */
        list_free(*(char ***)((char *)x->c + it->off), *(int *)((char *)x->c + it->off2));
        *(char ***)((char *)x->c + it->off) = NULL;
        *(int *)((char *)x->c + it->off2) = 0;
    }
    if (it->kind == MK_LIST && v && fy_node_is_sequence(v)) {
        void *si = NULL;
        struct fy_node *e;
        while ((e = fy_node_sequence_iterate(v, &si))) {
            snprintf(where, sizeof where, "%s:%d: %s.%s", x->name, node_line(e, vl), sect, it->key);
            if (!yaml_scalar(e, val, sizeof val))
                return err_set(x->err, ERR_INVALID_ARG, "%s: entries must be strings", where);
            int rc = mk_apply(x->c, it, val, where, x->err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!yaml_scalar(v, val, sizeof val))
        return err_set(x->err, ERR_INVALID_ARG, "%s: must be a single value (not a list, mapping or empty)", where);
    return mk_apply(x->c, it, val, where, x->err);
}

static int mc_section(struct mc_ctx *x, const char *sect, struct fy_node *map, int line)
{
    if (!map || !fy_node_is_mapping(map))
        return mc_err(x, line, "%s: must be a mapping of keys (e.g. %s: {key: value})", sect, sect);
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(map, &iter))) {
        struct fy_node *k = fy_node_pair_key(pair);
        char key[128];
        int kl = node_line(k, line);
        if (!yaml_scalar(k, key, sizeof key))
            return mc_err(x, kl, "%s: keys must be plain words", sect);
        const struct mk_item *it = NULL;
        for (int i = 0; i < MK_N; i++)
            if (!strcmp(mk_items[i].section, sect) && !strcmp(mk_items[i].key, key))
                it = &mk_items[i];
        if (!it) {
            char known[512] = "";
            for (int i = 0; i < MK_N; i++)
                if (!strcmp(mk_items[i].section, sect))
                    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "",
                             mk_items[i].key);
            return mc_err(x, kl, "unknown key '%s' in section '%s' (known: %s)", key, sect, known);
        }
        int rc = mc_item(x, it, fy_node_pair_value(pair), kl);
        if (rc)
            return rc;
    }
    return 0;
}

/* A list of strings (or one string) into l/n, replacing it. */
static int mc_strings(struct mc_ctx *x, struct fy_node *v, int line, const char *what, char ***l, int *n)
{
    list_free(*l, *n);
    *l = NULL;
    *n = 0;
    char val[4096];
    if (v && fy_node_is_sequence(v)) {
        void *si = NULL;
        struct fy_node *e;
        while ((e = fy_node_sequence_iterate(v, &si))) {
            if (!yaml_scalar(e, val, sizeof val) || !*val)
                return mc_err(x, node_line(e, line), "%s: entries must be non-empty strings", what);
            if (list_add(l, n, val))
                return err_set(x->err, ERR_NOMEM, "out of memory");
        }
        return 0;
    }
    if (!yaml_scalar(v, val, sizeof val) || !*val)
        return mc_err(x, line, "%s: expected a list of strings", what);
    return list_add(l, n, val) ? err_set(x->err, ERR_NOMEM, "out of memory") : 0;
}

static int mc_model(struct mc_ctx *x, struct fy_node *m, int line)
{
    struct route_models_config *c = x->c;
    if (!m || !fy_node_is_mapping(m))
        return mc_err(x, line, "models: each entry must be a mapping such as {name: NAME, path: FILE.gguf}");
    struct route_model_conf *nm = realloc(c->models, (size_t)(c->n_models + 1) * sizeof *nm);
    if (!nm)
        return err_set(x->err, ERR_NOMEM, "out of memory");
    c->models = nm;
    struct route_model_conf *mc = &c->models[c->n_models++];
    memset(mc, 0, sizeof *mc);
    mc->line = node_line(m, line);
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(m, &iter))) {
        struct fy_node *k = fy_node_pair_key(pair), *v = fy_node_pair_value(pair);
        char key[128], val[4096];
        int kl = node_line(k, mc->line), vl = node_line(v, kl);
        if (!yaml_scalar(k, key, sizeof key))
            return mc_err(x, kl, "models: keys must be plain words");
        bool list = !strcmp(key, "aliases") || !strcmp(key, "args");
        if (!list && !yaml_scalar(v, val, sizeof val))
            return mc_err(x, vl, "models.%s: must be a single value (not a list, mapping or empty)", key);
        if (!strcmp(key, "name") || !strcmp(key, "path")) {
            if (!*val)
                return mc_err(x, vl, "models.%s: must not be empty", key);
            char *s = !strcmp(key, "path") && strncmp(val, "hf://", 5) ? yaml_resolve_path(x->base, val) : strdup(val);
            if (!s)
                return err_set(x->err, ERR_NOMEM, "out of memory");
            char **dst = !strcmp(key, "name") ? &mc->name : &mc->path;
            free(*dst);
            *dst = s;
        } else if (!strcmp(key, "aliases")) {
            int rc = mc_strings(x, v, vl, "models.aliases", &mc->aliases, &mc->n_aliases);
            if (rc)
                return rc;
        } else if (!strcmp(key, "args")) {
            int rc = mc_strings(x, v, vl, "models.args", &mc->args, &mc->n_args);
            if (rc)
                return rc;
        } else if (!strcmp(key, "max_batch_size") || !strcmp(key, "ctx_size")) {
            long n;
            long hi = !strcmp(key, "ctx_size") ? 1 << 20 : 1024;
            if (parse_int(val, !strcmp(key, "ctx_size") ? 0 : 1, hi, &n))
                return mc_err(x, vl, "models.%s: expected an integer in [%d, %ld], got '%s'", key,
                              !strcmp(key, "ctx_size") ? 0 : 1, hi, val);
            *(!strcmp(key, "ctx_size") ? &mc->ctx_size : &mc->max_batch_size) = (int)n;
        } else if (!strcmp(key, "kv_memory")) {
            if (flags_bytes_parse(val, &mc->kv_memory) || mc->kv_memory < (1 << 20))
                return mc_err(x, vl, "models.kv_memory: expected a size such as 256MiB (at least 1MiB), got '%s'", val);
        } else if (!strcmp(key, "preload")) {
            if (parse_bool(val, &mc->preload))
                return mc_err(x, vl, "models.preload: expected true or false, got '%s'", val);
        } else if (!strcmp(key, "keep_alive")) {
            if (parse_seconds(val, -1, 1e9, &mc->keep_alive))
                return mc_err(x, vl, "models.keep_alive: expected seconds (a number, or with s, m, h) in [-1, 1e9], "
                              "got '%s'", val);
            mc->keep_alive_set = true;
        } else {
            return mc_err(x, kl, "unknown key '%s' in a models entry (known: name, path, aliases, max_batch_size, "
                          "kv_memory, ctx_size, keep_alive, preload, args)", key);
        }
    }
    if (!mc->path)
        return mc_err(x, mc->line, "models: entry %d has no path (a GGUF file or hf://OWNER/NAME:QUANT)", c->n_models);
    if (!mc->name) {
        /* the file's base name without .gguf */
        const char *b = strrchr(mc->path, '/');
        b = b ? b + 1 : mc->path;
        size_t n = strlen(b);
        if (n > 5 && !strcmp(b + n - 5, ".gguf"))
            n -= 5;
        if (!(mc->name = strndup(b, n)))
            return err_set(x->err, ERR_NOMEM, "out of memory");
    }
    return 0;
}

static int mc_doc(struct mc_ctx *x, struct fy_document *doc)
{
    struct fy_node *root = fy_document_root(doc);
    if (!root)
        return 0;
    if (!fy_node_is_mapping(root))
        return mc_err(x, 1, "the top level must be a mapping (server, models, memory_budget, auth, ...)");
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(root, &iter))) {
        struct fy_node *k = fy_node_pair_key(pair), *v = fy_node_pair_value(pair);
        char key[128];
        int kl = node_line(k, 1);
        if (!yaml_scalar(k, key, sizeof key))
            return mc_err(x, kl, "section names must be plain words");
        int rc = 0;
        if (!strcmp(key, "server") || !strcmp(key, "auth")) {
            rc = mc_section(x, key, v, kl);
        } else if (!strcmp(key, "models")) {
            if (!v || !fy_node_is_sequence(v))
                return mc_err(x, kl, "models: must be a list of {name, path, ...} entries");
            void *si = NULL;
            struct fy_node *e;
            while (!rc && (e = fy_node_sequence_iterate(v, &si)))
                rc = mc_model(x, e, node_line(e, kl));
        } else if (!strcmp(key, "models_dir")) {
            char val[4096];
            if (!yaml_scalar(v, val, sizeof val) || !*val)
                return mc_err(x, kl, "models_dir: expected a folder path");
            char *dir = yaml_resolve_path(x->base, val);
            if (!dir)
                return err_set(x->err, ERR_NOMEM, "out of memory");
            rc = route_models_config_scan_dir(x->c, dir, x->err);
            free(dir);
        } else {
            const struct mk_item *it = NULL;
            for (int i = 0; i < MK_N; i++)
                if (!*mk_items[i].section && !strcmp(mk_items[i].key, key))
                    it = &mk_items[i];
            if (!it)
                return mc_err(x, kl, "unknown key '%s' (known: server, models, models_dir, memory_budget, max_loaded, "
                              "keep_alive, load_on_request, load_timeout, auth)", key);
            rc = mc_item(x, it, v, kl);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int mc_parse(struct route_models_config *c, const char *path, const char *yaml, size_t len, const char *name,
                    char *err)
{
    int rc;
    struct fy_document *doc = yaml_load(path, yaml, len, name, &rc, err);
    if (!doc)
        return rc;
    struct mc_ctx x = {c, name, path, err};
    rc = mc_doc(&x, doc);
    fy_document_destroy(doc);
    return rc;
}

int route_models_config_load_file(struct route_models_config *c, const char *path, char *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, ERR_IO, "cannot read config file '%s': %s", path, strerror(errno));
    fclose(f);
    free(c->source);
    if (!(c->source = strdup(path)))
        return err_set(err, ERR_NOMEM, "out of memory");
    return mc_parse(c, path, NULL, 0, path, err);
}

int route_models_config_load_string(struct route_models_config *c, const char *yaml, size_t len, const char *name,
                                    char *err)
{
    return mc_parse(c, NULL, yaml, len, name, err);
}

bool route_models_file_has_models(const char *path)
{
    int rc;
    char err[ERR_MSG_MAX];
    struct fy_document *doc = yaml_load(path, NULL, 0, path, &rc, err);
    if (!doc)
        return false;
    struct fy_node *root = fy_document_root(doc);
    bool has = root && fy_node_is_mapping(root) &&
               (fy_node_mapping_lookup_by_string(root, "models", 6) ||
                fy_node_mapping_lookup_by_string(root, "models_dir", 10));
    fy_document_destroy(doc);
    return has;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int route_models_config_scan_dir(struct route_models_config *c, const char *dir, char *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return err_set(err, ERR_IO, "models dir '%s': %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf") && e->d_name[0] != '.' && list_add(&names, &n, e->d_name)) {
            closedir(d);
            list_free(names, n);
            return err_set(err, ERR_NOMEM, "out of memory");
        }
    }
    closedir(d);
    if (n)
        qsort(names, (size_t)n, sizeof *names, name_cmp);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        char *name = strndup(names[i], strlen(names[i]) - 5);
        size_t pl = strlen(dir) + strlen(names[i]) + 2;
        char *path = malloc(pl);
        bool dup = false;
        for (int k = 0; name && k < c->n_models; k++)
            dup |= !strcmp(c->models[k].name, name);
        struct route_model_conf *nm = dup ? NULL : realloc(c->models, (size_t)(c->n_models + 1) * sizeof *nm);
        if (!name || !path || (!dup && !nm)) {
            free(name);
            free(path);
            rc = err_set(err, ERR_NOMEM, "out of memory");
            break;
        }
        if (dup) {
            free(name);
            free(path);
            continue;
        }
        snprintf(path, pl, "%s/%s", dir, names[i]);
        c->models = nm;
        struct route_model_conf *m = &c->models[c->n_models++];
        memset(m, 0, sizeof *m);
        m->name = name;
        m->path = path;
    }
    list_free(names, n);
    return rc;
}

/* ---- flags ----------------------------------------------------------------------------------------- */

void route_models_usage(void *file)
{
    FILE *f = file;
    fprintf(f, "usage: wafer serve --config models.yaml        (a config with a models: list)\n"
               "       wafer serve --models-dir DIR [options]  (every DIR/*.gguf, named after its file)\n\n"
               "Serves many models from one address: requests route by their \"model\" (names and aliases); each\n"
               "loaded model runs in a child `wafer serve` on loopback with its own slots and KV cache. Models load\n"
               "on first request, unload after keep_alive idle seconds, and the least recently used idle ones make\n"
               "room under memory_budget. Admin API: GET /admin/models, POST /admin/models/load, POST\n"
               "/admin/models/unload, POST /admin/drain (see wafer ctl). docs/models.md is the reference.\n\n"
               "options:\n  %-24s %s\n  %-24s %s\n", "--config PATH", "YAML configuration file with models:",
               "--models-dir DIR", "serve every *.gguf file of DIR");
    for (int i = 0; i < MK_N; i++) {
        const struct mk_item *it = &mk_items[i];
        char left[64];
        const char *arg = it->kind == MK_BOOL ? " BOOL" : it->kind == MK_INT ? " N" : it->kind == MK_BYTES ? " SIZE"
                          : it->kind == MK_SECONDS ? " SEC" : it->kind == MK_LIST ? " KEY" : " HOST";
        snprintf(left, sizeof left, "%s%s", it->flag, arg);
        fprintf(f, "  %-24s %s\n", left, it->help);
    }
    fprintf(f, "  %-24s %s\n", "-h, --help", "this help");
}

int route_models_config_from_args(struct route_models_config *c, int argc, char **argv, char *err)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            route_models_usage(stdout);
            return 1;
        }
        const char *val = NULL;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc)
                return err_set(err, ERR_INVALID_ARG, "--config needs a file path");
            val = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            val = argv[i] + 9;
        }
        if (val) {
            int rc = route_models_config_load_file(c, val, err);
            if (rc)
                return rc;
        }
    }
    bool seen[MK_N];
    memset(seen, 0, sizeof seen);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc && !strncmp(a, "--", 2))
            v = argv[++i];
        else
            return err_set(err, ERR_INVALID_ARG, "unknown argument '%s' (see wafer serve --models-dir DIR --help)", a);
        if (nlen == 12 && !strncmp(a, "--models-dir", 12)) {
            int rc = route_models_config_scan_dir(c, v, err);
            if (rc)
                return rc;
            continue;
        }
        int idx = -1;
        for (int k = 0; k < MK_N; k++)
            if (strlen(mk_items[k].flag) == nlen && !strncmp(mk_items[k].flag, a, nlen))
                idx = k;
        if (idx < 0)
            return err_set(err, ERR_INVALID_ARG,
                           "unknown option '%.*s' in models mode (see wafer serve --models-dir DIR --help; per-model "
                           "serve flags go in the models: entries' args)", (int)nlen, a);
        const struct mk_item *it = &mk_items[idx];
        if (it->kind == MK_LIST && !seen[idx]) { /* the flag replaces the file's list, then appends */
            char ***l = (char ***)((char *)c + it->off);
            int *n = (int *)((char *)c + it->off2);
            list_free(*l, *n);
            *l = NULL;
            *n = 0;
        }
        int rc = mk_apply(c, it, v, it->flag, err);
        if (rc)
            return rc;
        seen[idx] = true;
    }
    return route_models_config_check(c, err);
}

static bool name_ok(const char *s)
{
    if (!*s || strlen(s) > 200)
        return false;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == '"' || *p == '\\' || (unsigned char)*p == 0x7f)
            return false;
    return true;
}

int route_models_config_check(const struct route_models_config *c, char *err)
{
    if (c->n_models == 0)
        return err_set(err, ERR_INVALID_ARG, "no models: add a models: list to the config file, or pass --models-dir "
                       "DIR with .gguf files in it");
    const char *src = c->source ? c->source : "--models-dir";
    for (int i = 0; i < c->n_models; i++) {
        const struct route_model_conf *m = &c->models[i];
        if (!name_ok(m->name))
            return err_set(err, ERR_INVALID_ARG, "%s:%d: models: name '%s' must be 1 to 200 printable characters "
                           "without spaces or quotes", src, m->line, m->name);
        for (int a = -1; a < m->n_aliases; a++) {
            const char *x = a < 0 ? m->name : m->aliases[a];
            if (!name_ok(x))
                return err_set(err, ERR_INVALID_ARG, "%s:%d: models: alias '%s' of '%s' must be printable characters "
                               "without spaces or quotes", src, m->line, x, m->name);
            for (int j = 0; j <= i; j++) {
                const struct route_model_conf *o = &c->models[j];
                for (int b = -1; b < o->n_aliases; b++) {
                    if (j == i && b >= a)
                        break;
                    const char *y = b < 0 ? o->name : o->aliases[b];
                    if (!strcmp(x, y))
                        return err_set(err, ERR_INVALID_ARG, "%s:%d: models: the name '%s' is used twice (by '%s' "
                                       "and '%s'); names and aliases must be unique", src, m->line, x, o->name, m->name);
                }
            }
        }
        for (int k = 0; k < m->n_args; k++) {
            static const char *const owned[] = {"--model", "--port", "--host", "--config", "--model-name"};
            for (size_t j = 0; j < sizeof owned / sizeof owned[0]; j++) {
                size_t l = strlen(owned[j]);
                if (!strncmp(m->args[k], owned[j], l) && (m->args[k][l] == 0 || m->args[k][l] == '='))
                    return err_set(err, ERR_INVALID_ARG, "%s:%d: models.args of '%s': %s is set by the manager",
                                   src, m->line, m->name, owned[j]);
            }
        }
    }
    for (int i = 0; i < c->n_admin_keys; i++)
        if (!*c->admin_keys[i] || strchr(c->admin_keys[i], ' '))
            return err_set(err, ERR_INVALID_ARG, "auth.admin_keys: key %d is empty or has a space", i + 1);
    for (int i = 0; i < c->n_api_keys; i++)
        if (!*c->api_keys[i] || strchr(c->api_keys[i], ' '))
            return err_set(err, ERR_INVALID_ARG, "auth.api_keys: key %d is empty or has a space", i + 1);
    if (!c->host || !*c->host)
        return err_set(err, ERR_INVALID_ARG, "server.host must not be empty");
    return 0;
}
