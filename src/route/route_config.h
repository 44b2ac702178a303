/*
 * route_config: the settings of `wafer route`, from a YAML file (libfyaml) and flags. Every value is checked
 * here once (types, ranges, pool names that routes refer to), so the router trusts its config; a bad file
 * is reported as "path:line: key: what is wrong". docs/route.md is the reference.
 *
 *   server:   {host, port, max_connections, max_body, admin_key, log_requests}
 *   pools:    - {name, backends: [http://host:port, ...], kind: wafer|openai}
 *   routes:   - {model, split: {pool: weight, ...} | pool: name, fallback: [pool, ...],
 *                sticky: header:NAME | api_key}
 *   retries:  {max, base_ms, cap_ms}
 *   timeouts: {connect_ms, header_ms, idle_ms}
 *   health:   {path, interval_s, timeout_ms, eject_after, cooldown_s, cooldown_max_s}
 *   cache:    {max_bytes, ttl_s} (max_bytes 0: off), or {url: redis://..., ttl_s, prefix, timeout_ms} (shared)
 *   limits:   {keys: [{key, rpm, tpm, concurrent}, ...], key_file}
 *   resume:   {enabled}
 *   dns:      {refresh_s}
 *   alerts:   the rules and receivers of `wafer serve` (core/alert.h), on the measures the router has:
 *             error_rate, requests_per_second, e2e_*, ttft_* (time to first byte), running (in flight),
 *             burn_rate (on errors, or on e2e / ttft latency)
 */
#ifndef WAFER_ROUTE_ROUTE_CONFIG_H
#define WAFER_ROUTE_ROUTE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct route_pool_conf {
    char *name;
    char **urls; /* [n_urls] backend base URLs, http://host:port[/prefix] */
    int n_urls;
    bool wafer;  /* kind: wafer (load from /metrics, stream resume with token ids) or openai (plain) */
    int line;
};

struct route_split_conf {
    char *pool_name;
    int pool; /* index into pools, resolved by route_config_check */
    double weight;
    int line;
};

enum route_sticky { ROUTE_STICKY_NONE, ROUTE_STICKY_HEADER, ROUTE_STICKY_API_KEY };

struct route_rule_conf {
    char *model; /* "*" matches any model */
    struct route_split_conf *split; /* [n_split] */
    int n_split;
    struct route_split_conf *fallback; /* [n_fallback], weights unused */
    int n_fallback;
    enum route_sticky sticky;
    char *sticky_header; /* lower case, for ROUTE_STICKY_HEADER */
    int line;
};

struct alert_config;

struct route_key_conf {
    char *key;
    int64_t rpm, tpm, concurrent; /* 0: unlimited */
};

struct route_config {
    char *source; /* the config file, or NULL */

    char *host;
    int port;
    int max_connections;
    int64_t max_body;
    char *admin_key; /* NULL: the admin endpoints are open */
    bool log_requests;

    struct route_pool_conf *pools;
    int n_pools;
    struct route_rule_conf *routes;
    int n_routes;

    int retry_max;     /* attempts after the first */
    int retry_base_ms; /* full-jitter backoff: sleep U(0, min(cap, base * 2^n)) */
    int retry_cap_ms;

    int connect_timeout_ms;
    int header_timeout_ms; /* request start to the response head (a non-streamed answer is generated first) */
    int idle_timeout_ms;   /* longest silence inside a response body */

    char *health_path;
    double health_interval_s; /* 0: no active checks */
    int health_timeout_ms;
    int eject_after;          /* consecutive failures that eject a backend (0: never) */
    double cooldown_s;        /* first ejection; doubles with each further one */
    double cooldown_max_s;

    int64_t cache_max_bytes; /* 0: no cache */
    double cache_ttl_s;
    char *cache_url;      /* redis://...: the cache is shared in Redis (max_bytes then caps one entry); NULL: in memory */
    char *cache_prefix;   /* Redis key prefix */
    int cache_timeout_ms; /* a Redis lookup slower than this is a miss (and Redis is taken for down) */

    struct route_key_conf *keys; /* [n_keys]; when any, only these keys are accepted */
    int n_keys;

    bool resume;
    double dns_refresh_s; /* 0: resolve host names once */

    struct alert_config *alerts; /* the alerts: section; NULL when there is none */
};

/* Defaults (port 8080, retries 2 x 25..250 ms, health /ready every 2 s, ...). Release with _deinit. */
void route_config_init(struct route_config *c);
void route_config_deinit(struct route_config *c);

/* Applies a YAML file (or text; name is used in messages) over c. 0, or ERR_IO / ERR_FORMAT /
 * ERR_INVALID_ARG with "name:line: ..." in err. Relative limits.key_file paths resolve against the file. */
int route_config_load_file(struct route_config *c, const char *path, char *err);
int route_config_load_string(struct route_config *c, const char *yaml, size_t len, const char *name, char *err);

/* Adds a backend URL to the pool "default" (created, with a route "*" to it, when missing): the --backend
 * flag. 0 or ERR_INVALID_ARG. */
int route_config_add_backend(struct route_config *c, const char *url, char *err);

/* Cross-checks after everything was applied: resolves pool names in routes, at least one pool and route,
 * URLs well formed. 0 or ERR_INVALID_ARG with the file:line of the offending entry. */
int route_config_check(struct route_config *c, char *err);

/* Splits "http://host:port/prefix" into its parts (port 80 when absent; prefix "" or "/..." without a
 * trailing slash). 0 or ERR_INVALID_ARG (https, user info, a bad port). */
int route_url_parse(const char *url, char *host, size_t host_cap, int *port, char *prefix, size_t prefix_cap);

#endif
