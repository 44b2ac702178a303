/*
 * config: YAML (libfyaml document API) and flags into one struct server_config.
 *
 * Both sources go through one table of settings (section, key, flag, kind, bounds), so a key that exists
 * in YAML has the same flag spelling (`server.max_batch_size` <-> `--max-batch-size`), the same parser and
 * the same range check; messages name the YAML key with its file:line, or the flag. Unknown keys are errors
 * (a typo must not silently fall back to a default).
 */
#include "server/config.h"

#include "core/alert.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/yaml.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/scheduler.h"

#include <errno.h>
#include <libfyaml.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum cfg_kind { CK_STR, CK_PATH, CK_INT, CK_FLOAT, CK_DOUBLE, CK_SECONDS, CK_BYTES, CK_BOOL, CK_LIST, CK_KEYFILE };

struct cfg_item {
    const char *section; /* YAML section */
    const char *key;     /* YAML key inside it */
    const char *flag;    /* --flag, or NULL when YAML-only */
    enum cfg_kind kind;
    size_t off;        /* offset in struct server_config; for CK_LIST the array, count at off2 */
    size_t off2;
    double lo, hi;     /* bounds for numbers */
    const char *help;
};

#define OFF(f) offsetof(struct server_config, f)

static const struct cfg_item cfg_items[] = {
    {"model", "path", "--model", CK_PATH, OFF(model_path), 0, 0, 0,
     "GGUF model file, or hf://OWNER/NAME:QUANT (pulled first when missing; see wafer pull)"},
    {"model", "name", "--model-name", CK_STR, OFF(model_name), 0, 0, 0,
     "served model name (default: the file name without .gguf)"},
    {"model", "aliases", "--model-alias", CK_LIST, OFF(aliases), OFF(n_aliases), 0, 0,
     "another name clients may use for the model (repeatable)"},
    {"model", "chat_template", "--chat-template", CK_STR, OFF(chat_template), 0, 0, 0,
     "chat template family (llama2, llama3, chatml, mistral-v1, mistral-v3, mistral-v7, zephyr, ...)"},
    {"model", "mmap", "--mmap", CK_BOOL, OFF(use_mmap), 0, 0, 0,
     "map the file instead of reading it into memory: faster start, page cache shared, slower decode (default false)"},
    {"server", "host", "--host", CK_STR, OFF(host), 0, 0, 0, "address to listen on (default 127.0.0.1)"},
    {"server", "port", "--port", CK_INT, OFF(port), 0, 0, 65535, "TCP port (default 8080; 0 picks one)"},
    {"server", "threads", "--threads", CK_INT, OFF(threads), 0, 0, 1024, "compute threads (0: all CPUs)"},
    {"server", "backend", "--backend", CK_STR, OFF(backend), 0, 0, 0, "compute backend: cpu (default) or scalar"},
    {"server", "ctx_size", "--ctx-size", CK_INT, OFF(ctx_size), 0, 0, 1 << 20,
     "context length per sequence (0: the model's)"},
    {"server", "max_batch_size", "--max-batch-size", CK_INT, OFF(max_batch_size), 0, 1, 1024,
     "sequences decoded together (default 16; auto: as many as the slo targets allow)"},
    {"server", "kv_memory", "--kv-memory", CK_BYTES, OFF(kv_memory), 0, 0, 0,
     "KV cache budget, e.g. 512MiB (default: max-batch-size full contexts)"},
    {"server", "max_queue", "--max-queue", CK_INT, OFF(max_queue), 0, 0, 1000000,
     "requests waiting for a slot before 429 (default 64)"},
    {"server", "request_timeout", "--request-timeout", CK_SECONDS, OFF(request_timeout), 0, 0, 1e7,
     "seconds a request may take, queued or running (default 600; 0: none)"},
    {"server", "drain_timeout", "--drain-timeout", CK_SECONDS, OFF(drain_timeout), 0, 0, 1e6,
     "seconds in-flight requests get after SIGTERM (default 30)"},
    {"server", "prefill_chunk", "--prefill-chunk", CK_INT, OFF(prefill_chunk), 0, 1, 65536,
     "prompt tokens per engine step (default 256)"},
    {"server", "max_body", "--max-body", CK_BYTES, OFF(max_body), 0, 0, 0, "largest request body (default 8MiB)"},
    {"server", "max_connections", "--max-connections", CK_INT, OFF(max_connections), 0, 1, 1000000,
     "open connections (default 1024)"},
    {"server", "header_timeout", "--header-timeout", CK_SECONDS, OFF(header_timeout), 0, 0.001, 1e6,
     "seconds to receive request headers (default 10)"},
    {"server", "body_timeout", "--body-timeout", CK_SECONDS, OFF(body_timeout), 0, 0.001, 1e6,
     "seconds to receive a request body (default 30)"},
    {"server", "spec", "--spec", CK_STR, OFF(spec), 0, 0, 0,
     "speculative decoding's drafts besides a request's prediction: off (default), ngram (prompt lookup) or draft "
     "(the draft model's; the default when server.draft_model is set)"},
    {"server", "draft_model", "--draft-model", CK_PATH, OFF(draft_model_path), 0, 0, 0,
     "speculative decoding's draft model: a small GGUF with the same vocabulary (e.g. a smaller or more quantized "
     "sibling); its drafts are verified, the output is the same"},
    {"server", "draft_max", "--draft-max", CK_INT, OFF(draft_max), 0, 0, SCHED_DRAFT_MAX,
     "most drafted tokens a sequence verifies per step (default 16; 0: no speculation, predictions ignored)"},
    {"server", "draft_min", "--draft-min", CK_INT, OFF(draft_min), 0, 0, SCHED_DRAFT_MAX,
     "shorter drafts are not verified (default 1)"},
    {"server", "draft_fixed", "--draft-fixed", CK_BOOL, OFF(draft_fixed), 0, 0, 0,
     "verify every draft whole, whatever it costs (to measure the ceiling; default false: draft lengths follow "
     "acceptance and the measured cost of a pass)"},
    {"server", "log_requests", "--log-requests", CK_BOOL, OFF(log_requests), 0, 0, 0,
     "one log line per request (default true)"},
    {"server", "log_level", "--log-level", CK_STR, OFF(log_level), 0, 0, 0,
     "error, warn, info or debug (default: $WAFER_LOG, else info; SIGHUP reloads it)"},
    {"server", "workers", "--workers", CK_INT, OFF(workers), 0, 1, 64,
     "threads that parse, tokenize and build large answers off the I/O thread (default 2)"},
    {"server", "max_response", "--max-response", CK_BYTES, OFF(max_response), 0, 0, 0,
     "largest non-streaming answer, checked before work starts (default 0: 4KiB per context position, "
     "at least 4MiB)"},
    {"server", "max_inflight", "--max-inflight", CK_BYTES, OFF(max_inflight), 0, 0, 0,
     "request bodies and buffered answers held at once; past it 503 with Retry-After (default 256MiB)"},
    {"server", "parse_special", "--parse-special", CK_BOOL, OFF(parse_special), 0, 0, 0,
     "prompt text may write special tokens such as </s> (default false: they are text; requests may opt in)"},
    {"generation", "max_new_tokens", "--max-new-tokens", CK_INT, OFF(max_new_tokens), 0, 1, 1 << 20,
     "default max_tokens (default 256)"},
    {"generation", "temperature", "--temperature", CK_FLOAT, OFF(temperature), 0, 0, 2,
     "default temperature (default 0.8)"},
    {"generation", "top_p", "--top-p", CK_FLOAT, OFF(top_p), 0, 1e-9, 1, "default top_p (default 0.95)"},
    {"generation", "top_k", "--top-k", CK_INT, OFF(top_k), 0, 0, 1 << 20, "default top_k (default 40; 0: off)"},
    {"generation", "min_p", "--min-p", CK_FLOAT, OFF(min_p), 0, 0, 1, "default min_p (default 0.05)"},
    {"generation", "repeat_penalty", "--repeat-penalty", CK_FLOAT, OFF(repeat_penalty), 0, 0.01, 10,
     "default repeat penalty (default 1: off)"},
    {"auth", "api_keys", "--api-key", CK_LIST, OFF(api_keys), OFF(n_api_keys), 0, 0,
     "accepted API key (repeatable; none: no auth)"},
    {"auth", "api_key_file", "--api-key-file", CK_KEYFILE, 0, 0, 0, 0, "file with one API key per line"},
    {"auth", "admin_keys", "--admin-key", CK_LIST, OFF(admin_keys), OFF(n_admin_keys), 0, 0,
     "key for POST /admin/drain (repeatable; none: loopback clients only)"},
    {"cors", "origins", "--cors-origin", CK_LIST, OFF(cors_origins), OFF(n_cors_origins), 0, 0,
     "allowed CORS origin, or * (repeatable)"},
    {"jobs", "data_dir", "--data-dir", CK_PATH, OFF(jobs_data_dir), 0, 0, 0,
     "batch jobs' SQLite store and files (default $XDG_DATA_HOME/wafer or ~/.local/share/wafer)"},
    {"jobs", "queue", "--queue", CK_STR, OFF(jobs_queue), 0, 0, 0,
     "redis://[:password@]HOST:PORT[/DB]: keep batch jobs in Redis, shared by many servers"},
    {"jobs", "max_file_bytes", "--max-file-bytes", CK_BYTES, OFF(jobs_max_file_bytes), 0, 0, 0,
     "largest batch input file (default 200MB)"},
    {"jobs", "max_lines", "--max-batch-lines", CK_INT, OFF(jobs_max_lines), 0, 1, 10000000,
     "requests per batch input file (default 50000)"},
    {"jobs", "max_inflight", "--batch-inflight", CK_INT, OFF(jobs_max_inflight), 0, 0, 100000,
     "batch lines started at once (default: 2 x max-batch-size; 0: batch jobs off)"},
    {"jobs", "lease", "--batch-lease", CK_SECONDS, OFF(jobs_lease), 0, 0.1, 86400,
     "Redis queue: seconds a line stays with a worker that stopped renewing it (default 30)"},
    {"slo", "itl_p95_ms", "--slo-itl-p95-ms", CK_DOUBLE, OFF(slo_itl_p95_ms), 0, 0, 1e6,
     "inter-token latency p95 target: the batch size adapts to it (0: off)"},
    {"slo", "ttft_p95_ms", "--slo-ttft-p95-ms", CK_DOUBLE, OFF(slo_ttft_p95_ms), 0, 0, 1e7,
     "time-to-first-token p95 target of the batch controller (0: off)"},
    {"slo", "window_s", "--slo-window", CK_SECONDS, OFF(slo_window_s), 0, 0.5, 3600,
     "window the batch controller measures over, and waits after a change (default 10)"},
    {"slo", "min_batch_size", "--slo-min-batch-size", CK_INT, OFF(slo_min_batch), 0, 1, 1024,
     "smallest batch the controller picks (default 1)"},
    {"slo", "max_batch_size", "--slo-max-batch-size", CK_INT, OFF(slo_max_batch), 0, 1, 1024,
     "largest batch the controller picks (default: max_batch_size, or 32 with auto)"},
    {"cost", "per_hour", "--cost-per-hour", CK_DOUBLE, OFF(cost_per_hour), 0, 0, 1e6,
     "price of the machine in dollars per hour: cost per token and per request (0: off)"},
    {"energy", "rapl", "--energy-rapl", CK_BOOL, OFF(energy_rapl), 0, 0, 0,
     "read the CPUs' RAPL energy counters when readable (default true)"},
    {"energy", "watts", "--energy-watts", CK_DOUBLE, OFF(energy_watts), 0, 0, 1e6,
     "power for an estimated energy figure when RAPL is unreadable (0: none)"},
};
#define CFG_N_ITEMS ((int)(sizeof cfg_items / sizeof cfg_items[0]))

static const char *cfg_sections[] = {"model", "server", "generation", "auth", "cors", "jobs", "alerts", "slo", "cost",
                                     "energy"};

void server_config_init(struct server_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = strdup("127.0.0.1");
    c->port = 8080;
    c->max_batch_size = 16;
    c->max_queue = 64;
    c->request_timeout = 600;
    c->drain_timeout = 30;
    c->prefill_chunk = 256;
    c->max_body = 8 << 20;
    c->max_connections = 1024;
    c->header_timeout = 10;
    c->body_timeout = 30;
    c->max_new_tokens = 256;
    c->temperature = 0.8f;
    c->top_p = 0.95f;
    c->top_k = 40;
    c->min_p = 0.05f;
    c->repeat_penalty = 1.0f;
    c->log_requests = true;
    c->jobs_max_file_bytes = 200ll << 20;
    c->jobs_max_lines = 50000;
    c->jobs_max_inflight = -1;
    c->slo_window_s = 10;
    c->energy_rapl = true;
    c->draft_max = 16;
    c->draft_min = 1;
    c->workers = 2;
    c->max_inflight = (int64_t)256 << 20;
}

static void cfg_list_clear(char **list, int *n)
{
    for (int i = 0; i < *n; i++) {
        free(list[i]);
        list[i] = NULL;
    }
    *n = 0;
}

void server_config_deinit(struct server_config *c)
{
    free(c->model_path);
    free(c->model_path_origin);
    free(c->model_name);
    free(c->chat_template);
    free(c->jobs_data_dir);
    free(c->jobs_queue);
    free(c->backend);
    free(c->spec);
    free(c->draft_model_path);
    free(c->host);
    free(c->log_level);
    cfg_list_clear(c->aliases, &c->n_aliases);
    cfg_list_clear(c->api_keys, &c->n_api_keys);
    cfg_list_clear(c->admin_keys, &c->n_admin_keys);
    cfg_list_clear(c->cors_origins, &c->n_cors_origins);
    if (c->alerts) {
        alert_config_deinit(c->alerts);
        free(c->alerts);
    }
    memset(c, 0, sizeof *c);
}

/* "30", "30s", "500ms", "2m" -> seconds. */
static int cfg_parse_seconds(const char *s, double *out)
{
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return ERR_INVALID_ARG;
    if (!*end || !strcmp(end, "s"))
        *out = v;
    else if (!strcmp(end, "ms"))
        *out = v / 1000.0;
    else if (!strcmp(end, "m"))
        *out = v * 60.0;
    else
        return ERR_INVALID_ARG;
    return 0;
}

/* Reads API keys from a file, one per line ('#' comments and blank lines ignored); appends to c. */
static int cfg_read_keyfile(struct server_config *c, const char *path, const char *where, char *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, ERR_IO, "%s: cannot read API key file '%s': %s", where, path, strerror(errno));
    char line[4096];
    int added = 0;
    while (fgets(line, sizeof line, f)) {
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strlen(s);
        while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
            s[--n] = 0;
        if (!n || s[0] == '#')
            continue;
        if (c->n_api_keys >= CONFIG_MAX_LIST) {
            fclose(f);
            return err_set(err, ERR_INVALID_ARG, "%s: more than %d API keys", where, CONFIG_MAX_LIST);
        }
        c->api_keys[c->n_api_keys++] = strdup(s);
        added++;
    }
    fclose(f);
    if (!added)
        return err_set(err, ERR_INVALID_ARG, "%s: API key file '%s' holds no key", where, path);
    return 0;
}

/* Resolves a relative path against the directory of the config file (base may be NULL). Caller frees. */
static char *cfg_resolve_path(const char *base, const char *p)
{
    if (!strncmp(p, "hf://", 5)) /* a hub model (pulled by wafer serve), not a file next to the config */
        return strdup(p);
    return yaml_resolve_path(base, p);
}

/* Applies one scalar value to an item. where names it ("file:3: server.port" or "--port"); base is the
 * config file (for relative paths) or NULL. For CK_LIST, replace says whether to clear the list first. */
static int cfg_apply(struct server_config *c, const struct cfg_item *it, const char *v, const char *where,
                     const char *base, bool replace, char *err)
{
    char *p = (char *)c + it->off;
    switch (it->kind) {
    case CK_STR:
    case CK_PATH: {
        if (!*v)
            return err_set(err, ERR_INVALID_ARG, "%s: must not be empty", where);
        char *s = it->kind == CK_PATH ? cfg_resolve_path(base, v) : strdup(v);
        if (!s)
            return ERR_NOMEM;
        free(*(char **)p);
        *(char **)p = s;
        if (it->off == OFF(model_path)) {
            free(c->model_path_origin);
            c->model_path_origin = strdup(where);
        }
        return 0;
    }
    case CK_INT: {
        if (it->off == OFF(max_batch_size)) {
            c->batch_auto = !strcmp(v, "auto"); /* the SLO controller's choice (server_config_from_args) */
            if (c->batch_auto)
                return 0;
        }
        errno = 0;
        char *end;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno || x < (long long)it->lo || x > (long long)it->hi)
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not an integer in [%.0f, %.0f]", where, v, it->lo,
                           it->hi);
        *(int *)p = (int)x;
        return 0;
    }
    case CK_FLOAT:
    case CK_DOUBLE: {
        errno = 0;
        char *end;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x) || x < it->lo || x > it->hi)
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not a number in [%g, %g]", where, v, it->lo, it->hi);
        if (it->kind == CK_DOUBLE)
            *(double *)p = x;
        else
            *(float *)p = (float)x;
        return 0;
    }
    case CK_SECONDS: {
        double x;
        if (cfg_parse_seconds(v, &x) || x > it->hi || (x > 0 && x < it->lo) || (x == 0 && it->lo > 0))
            return err_set(err, ERR_INVALID_ARG,
                           "%s: '%s' is not a duration (seconds, or a number with s/ms/m) in [%g, %g]", where, v,
                           it->lo, it->hi);
        *(double *)p = x;
        return 0;
    }
    case CK_BYTES: {
        int64_t x;
        if (flags_bytes_parse(v, &x))
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not a size (bytes, or a number with K/M/G/KiB/MiB/GiB)",
                           where, v);
        *(int64_t *)p = x;
        return 0;
    }
    case CK_BOOL: {
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1"))
            *(bool *)p = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0"))
            *(bool *)p = false;
        else
            return err_set(err, ERR_INVALID_ARG, "%s: '%s' is not a boolean (true or false)", where, v);
        return 0;
    }
    case CK_LIST: {
        char **list = (char **)p;
        int *n = (int *)((char *)c + it->off2);
        if (replace)
            cfg_list_clear(list, n);
        if (!*v)
            return err_set(err, ERR_INVALID_ARG, "%s: must not be empty", where);
        if (*n >= CONFIG_MAX_LIST)
            return err_set(err, ERR_INVALID_ARG, "%s: more than %d entries", where, CONFIG_MAX_LIST);
        if (!(list[*n] = strdup(v)))
            return ERR_NOMEM;
        (*n)++;
        return 0;
    }
    case CK_KEYFILE: {
        char *path = cfg_resolve_path(base, v);
        if (!path)
            return ERR_NOMEM;
        int rc = cfg_read_keyfile(c, path, where, err);
        free(path);
        return rc;
    }
    }
    return ERR_INTERNAL;
}

static int cfg_yaml_section(struct server_config *c, const char *name, const char *sect, struct fy_node *map,
                            int sect_line, const char *base, char *err)
{
    if (!fy_node_is_mapping(map))
        return err_set(err, ERR_INVALID_ARG, "%s:%d: %s: must be a mapping of keys (e.g. %s:\\n  key: value)", name,
                       sect_line, sect, sect);
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(map, &iter))) {
        struct fy_node *k = fy_node_pair_key(pair), *v = fy_node_pair_value(pair);
        char key[128], val[4096], where[512];
        int line = yaml_scalar_line(k);
        if (!yaml_scalar(k, key, sizeof key))
            return err_set(err, ERR_INVALID_ARG, "%s:%d: %s: keys must be plain words", name, sect_line, sect);
        const struct cfg_item *it = NULL;
        for (int i = 0; i < CFG_N_ITEMS; i++)
            if (!strcmp(cfg_items[i].section, sect) && !strcmp(cfg_items[i].key, key))
                it = &cfg_items[i];
        if (!it) {
            char known[512] = "";
            for (int i = 0; i < CFG_N_ITEMS; i++)
                if (!strcmp(cfg_items[i].section, sect)) {
                    if (known[0])
                        strncat(known, ", ", sizeof known - strlen(known) - 1);
                    strncat(known, cfg_items[i].key, sizeof known - strlen(known) - 1);
                }
            return err_set(err, ERR_INVALID_ARG, "%s:%d: unknown key '%s' in section '%s' (known: %s)", name, line,
                           key, sect, known);
        }
        snprintf(where, sizeof where, "%s:%d: %s.%s", name, v ? (yaml_scalar_line(v) ? yaml_scalar_line(v) : line) : line,
                 sect, key);
        if (it->kind == CK_LIST) {
            /* A list, or one scalar for a single entry. */
            int *cnt = (int *)((char *)c + it->off2);
            cfg_list_clear((char **)((char *)c + it->off), cnt);
            if (v && fy_node_is_sequence(v)) {
                void *si = NULL;
                struct fy_node *e;
                while ((e = fy_node_sequence_iterate(v, &si))) {
                    snprintf(where, sizeof where, "%s:%d: %s.%s", name, yaml_scalar_line(e) ? yaml_scalar_line(e) : line,
                             sect, key);
                    if (!yaml_scalar(e, val, sizeof val))
                        return err_set(err, ERR_INVALID_ARG, "%s: entries must be strings", where);
                    int rc = cfg_apply(c, it, val, where, base, false, err);
                    if (rc)
                        return rc;
                }
                continue;
            }
        }
        if (!yaml_scalar(v, val, sizeof val))
            return err_set(err, ERR_INVALID_ARG, "%s: must be a single value (not a list, mapping or empty)", where);
        int rc = cfg_apply(c, it, val, where, base, true, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int cfg_yaml_doc(struct server_config *c, struct fy_document *doc, const char *name, const char *base,
                        char *err)
{
    struct fy_node *root = fy_document_root(doc);
    if (!root)
        return 0; /* empty file: defaults */
    if (!fy_node_is_mapping(root))
        return err_set(err, ERR_INVALID_ARG, "%s:1: the top level must be a mapping with sections model, server, "
                                             "generation, auth, cors, alerts, slo, cost, energy", name);
    void *iter = NULL;
    struct fy_node_pair *pair;
    while ((pair = fy_node_mapping_iterate(root, &iter))) {
        struct fy_node *k = fy_node_pair_key(pair);
        char key[128];
        int line = yaml_scalar_line(k);
        if (!yaml_scalar(k, key, sizeof key))
            return err_set(err, ERR_INVALID_ARG, "%s:%d: section names must be plain words", name, line);
        bool known = false;
        for (size_t i = 0; i < sizeof cfg_sections / sizeof cfg_sections[0]; i++)
            known |= !strcmp(cfg_sections[i], key);
        if (!known)
            return err_set(err, ERR_INVALID_ARG,
                           "%s:%d: unknown section '%s' (known: model, server, generation, auth, cors, alerts, slo, "
                           "cost, energy)", name, line,
                           key);
        int rc;
        if (!strcmp(key, "alerts")) { /* its own grammar: core/alert_config.c */
            if (!c->alerts) {
                if (!(c->alerts = malloc(sizeof *c->alerts)))
                    return err_set(err, ERR_NOMEM, "out of memory");
                alert_config_init(c->alerts);
            }
            rc = alert_config_parse(c->alerts, fy_node_pair_value(pair), name, base, err);
        } else {
            rc = cfg_yaml_section(c, name, key, fy_node_pair_value(pair), line, base, err);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* Parses with a diagnostic object that collects errors, so syntax errors come back as one message with
 * the file and line instead of being printed by libfyaml. */
static int cfg_yaml_parse(struct server_config *c, const char *path, const char *yaml, size_t len,
                          const char *name, char *err)
{
    int rc;
    struct fy_document *doc = yaml_load(path, yaml, len, name, &rc, err);
    if (!doc)
        return rc;
    rc = cfg_yaml_doc(c, doc, name, path, err);
    fy_document_destroy(doc);
    return rc;
}

int server_config_load_file(struct server_config *c, const char *path, char *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, ERR_IO, "cannot read config file '%s': %s", path, strerror(errno));
    fclose(f);
    return cfg_yaml_parse(c, path, NULL, 0, path, err);
}

int server_config_load_string(struct server_config *c, const char *yaml, size_t len, const char *name, char *err)
{
    return cfg_yaml_parse(c, NULL, yaml, len, name, err);
}

/* ---- flags ---- */

void server_config_usage(void *file)
{
    FILE *f = file;
    fprintf(f, "usage: wafer serve [--config wafer.yaml] [--model PATH] [options]\n\n"
               "Runs the OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models,\n"
               "/v1/generate, /v1/batch_generate, /v1/generate_stream, /tokenize, /detokenize, /health,\n"
               "/ready, /metrics, POST /admin/drain). Flags override the YAML file (see docs/config.md).\n"
               "Many models: a config with a models: list, or --models-dir DIR (wafer serve --models-dir DIR --help;\n"
               "docs/models.md).\n\noptions:\n"
               "  %-22s %s\n", "--config PATH", "YAML configuration file");
    for (int i = 0; i < CFG_N_ITEMS; i++) {
        const struct cfg_item *it = &cfg_items[i];
        if (!it->flag)
            continue;
        char left[64];
        const char *arg = it->kind == CK_BOOL ? " BOOL" : it->kind == CK_INT ? " N" : it->kind == CK_LIST ? " S"
                          : it->kind == CK_BYTES ? " SIZE" : it->kind == CK_SECONDS ? " SEC"
                          : it->kind == CK_FLOAT || it->kind == CK_DOUBLE ? " X" : " PATH";
        if (it->kind == CK_STR || it->kind == CK_LIST)
            arg = " NAME";
        snprintf(left, sizeof left, "%s%s", it->flag, arg);
        fprintf(f, "  %-22s %s\n", left, it->help);
    }
    fprintf(f, "  %-22s %s\n", "-h, --help", "this help");
}

int server_config_from_args(struct server_config *c, int argc, char **argv, char *err)
{
    c->argc = argc; /* kept for SIGHUP, which reads everything again */
    c->argv = argv;
    /* --config first, so every flag overrides the file wherever it appears on the line. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            server_config_usage(stdout);
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
            int rc = server_config_load_file(c, val, err);
            if (rc)
                return rc;
        }
    }
    bool seen[CFG_N_ITEMS];
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
        int idx = -1;
        for (int k = 0; k < CFG_N_ITEMS; k++)
            if (cfg_items[k].flag && strlen(cfg_items[k].flag) == nlen && !strncmp(cfg_items[k].flag, a, nlen))
                idx = k;
        if (idx < 0)
            return err_set(err, ERR_INVALID_ARG, "unknown option '%s' (see wafer serve --help)", a);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return err_set(err, ERR_INVALID_ARG, "%s needs a value", cfg_items[idx].flag);
        /* A list flag replaces the file's list the first time it appears, then appends. */
        int rc = cfg_apply(c, &cfg_items[idx], v, cfg_items[idx].flag, NULL, !seen[idx], err);
        if (rc)
            return rc;
        seen[idx] = true;
    }
    if (c->batch_auto)
        c->max_batch_size = c->slo_max_batch ? c->slo_max_batch : 32;
    return server_config_check(c, err);
}

int server_config_check(const struct server_config *c, char *err)
{
    if (!c->model_path)
        return err_set(err, ERR_INVALID_ARG, "no model: pass --model PATH or set model.path in the config file");
    if (!c->host || !*c->host)
        return err_set(err, ERR_INVALID_ARG, "server.host must not be empty");
    if (c->prefill_chunk < 1 || c->max_batch_size < 1)
        return err_set(err, ERR_INVALID_ARG, "prefill_chunk and max_batch_size must be at least 1");
    for (int i = 0; i < c->n_api_keys; i++) {
        /* the key itself is never printed: it is a secret, and it may be in the logs' reach */
        const char *k = c->api_keys[i];
        size_t n = strlen(k), ws = 0;
        bool ctl = false;
        for (size_t j = 0; j < n; j++) {
            ws += k[j] == ' ' || k[j] == '\t';
            ctl |= (unsigned char)k[j] < 0x20 || k[j] == 0x7f;
        }
        if (n == 0 || ws == n)
            return err_set(err, ERR_INVALID_ARG,
                           "auth.api_keys: key %d of %d is empty or only whitespace; no client could send it, so "
                           "every request would be refused: remove it or set a real key",
                           i + 1, c->n_api_keys);
        if (ctl || k[0] == ' ' || k[0] == '\t' || k[n - 1] == ' ' || k[n - 1] == '\t')
            return err_set(err, ERR_INVALID_ARG,
                           "auth.api_keys: key %d of %d has leading or trailing whitespace or a control character; "
                           "HTTP clients cannot send it as it is: remove those characters",
                           i + 1, c->n_api_keys);
    }
    enum log_level level;
    if (c->log_level && log_level_from_name(c->log_level, &level))
        return err_set(err, ERR_INVALID_ARG, "server.log_level: '%s' is not one of error, warn, info, debug",
                       c->log_level);
    if (c->max_response != 0 && c->max_response < 65536)
        return err_set(err, ERR_INVALID_ARG, "server.max_response must be 0 (sized for the context) or at least 64KiB "
                       "(got %lld bytes)", (long long)c->max_response);
    if (c->max_inflight < c->max_body)
        return err_set(err, ERR_INVALID_ARG,
                       "server.max_inflight (%lld bytes) must be at least server.max_body (%lld bytes), or a body of "
                       "the largest allowed size could never be accepted",
                       (long long)c->max_inflight, (long long)c->max_body);
    char msg[ERR_MSG_MAX];
    if (engine_backend_check(c->backend, msg))
        return err_set(err, ERR_INVALID_ARG, "server.backend: %s", msg);
    if (c->batch_auto && !(c->slo_itl_p95_ms > 0) && !(c->slo_ttft_p95_ms > 0))
        return err_set(err, ERR_INVALID_ARG,
                       "server.max_batch_size: auto needs a latency target: set slo.itl_p95_ms (or slo.ttft_p95_ms)");
    if (c->slo_min_batch && c->slo_max_batch && c->slo_min_batch > c->slo_max_batch)
        return err_set(err, ERR_INVALID_ARG, "slo.min_batch_size (%d) is above slo.max_batch_size (%d)",
                       c->slo_min_batch, c->slo_max_batch);
    if (c->spec && strcmp(c->spec, "off") && strcmp(c->spec, "ngram") && strcmp(c->spec, "draft"))
        return err_set(err, ERR_INVALID_ARG, "server.spec: '%s' is not a draft source (off, ngram, draft)", c->spec);
    if (c->spec && !strcmp(c->spec, "draft") && !c->draft_model_path)
        return err_set(err, ERR_INVALID_ARG, "server.spec: draft needs a draft model: set server.draft_model (or "
                       "--draft-model FILE)");
    if (c->max_body < 1024)
        return err_set(err, ERR_INVALID_ARG, "server.max_body must be at least 1KiB (got %lld bytes)",
                       (long long)c->max_body);
    return 0;
}
