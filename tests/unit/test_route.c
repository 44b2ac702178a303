/* Tests for the router's pure parts: the config parser (the issue's example, every section, errors that name
 * file:line), the weighted split (sticky consistent hashing and smooth weighted round robin), full-jitter
 * backoff and the cooldown, the upstream response-head parser, the result cache (LRU, TTL, byte bound) and
 * the per-key limits (token buckets, constant-time lookup, headers). */
#include "testutil.h"

#include "core/err.h"
#include "core/redis_url.h"
#include "route/route_cache.h"
#include "route/route_config.h"
#include "route/route_limits.h"
#include "route/route_policy.h"
#include "route/upstream.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- config ---------------------------------------------------------------------------------------- */

static const char issue_yaml[] = "server: {host: 127.0.0.1, port: 8080}\n"          /* 1 */
                                 "pools:\n"                                           /* 2 */
                                 "  - name: stable\n"                                 /* 3 */
                                 "    backends: [http://gpu-a:8080, http://gpu-b:8080]\n"
                                 "  - name: canary\n"                                 /* 5 */
                                 "    backends: [http://gpu-c:8080]\n"
                                 "routes:\n"                                          /* 7 */
                                 "  - model: llama-3-8b            # \"*\" matches any model\n"
                                 "    split: {stable: 90, canary: 10}\n"
                                 "    fallback: [stable]\n"                           /* 10 */
                                 "    sticky: header:X-User-Id\n"
                                 "retries: {max: 2, base_ms: 25, cap_ms: 250}\n"
                                 "health: {path: /ready, interval_s: 2}\n"
                                 "cache: {max_bytes: 64MiB, ttl_s: 600}\n"
                                 "limits:\n"                                          /* 15 */
                                 "  keys:\n"
                                 "    - {key: sk-team-a, rpm: 600, tpm: 200000, concurrent: 8}\n"
                                 "    - {key: sk-internal}\n";

static void test_config_issue_example(void **state)
{
    (void)state;
    struct route_config c;
    route_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(route_config_load_string(&c, issue_yaml, strlen(issue_yaml), "r.yaml", err), 0);
    assert_int_equal(route_config_check(&c, err), 0);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.n_pools, 2);
    assert_string_equal(c.pools[0].name, "stable");
    assert_int_equal(c.pools[0].n_urls, 2);
    assert_string_equal(c.pools[0].urls[1], "http://gpu-b:8080");
    assert_true(c.pools[0].wafer);
    assert_int_equal(c.n_routes, 1);
    const struct route_rule_conf *r = &c.routes[0];
    assert_string_equal(r->model, "llama-3-8b");
    assert_int_equal(r->n_split, 2);
    assert_int_equal(r->split[0].pool, 0);
    assert_int_equal(r->split[1].pool, 1);
    assert_true(r->split[0].weight == 90 && r->split[1].weight == 10);
    assert_int_equal(r->n_fallback, 1);
    assert_int_equal(r->fallback[0].pool, 0);
    assert_int_equal(r->sticky, ROUTE_STICKY_HEADER);
    assert_string_equal(r->sticky_header, "x-user-id"); /* header names compare case-insensitively */
    assert_int_equal(c.retry_max, 2);
    assert_int_equal(c.retry_base_ms, 25);
    assert_int_equal(c.retry_cap_ms, 250);
    assert_string_equal(c.health_path, "/ready");
    assert_true(c.health_interval_s == 2);
    assert_int_equal(c.cache_max_bytes, 64 << 20);
    assert_true(c.cache_ttl_s == 600);
    assert_int_equal(c.n_keys, 2);
    assert_string_equal(c.keys[0].key, "sk-team-a");
    assert_int_equal(c.keys[0].rpm, 600);
    assert_int_equal(c.keys[0].tpm, 200000);
    assert_int_equal(c.keys[0].concurrent, 8);
    assert_int_equal(c.keys[1].rpm, 0);
    route_config_deinit(&c);
}

static void test_config_more_keys(void **state)
{
    (void)state;
    static const char y[] = "pools:\n"
                            "  - {name: a, backends: http://127.0.0.1:9000/v1x/, kind: openai}\n"
                            "routes:\n"
                            "  - {model: '*', pool: a, sticky: api_key}\n"
                            "timeouts: {connect_ms: 100, header_ms: 2000, idle_ms: 300}\n"
                            "health: {eject_after: 3, cooldown_s: 0.5, cooldown_max_s: 4, timeout_ms: 50}\n"
                            "resume: {enabled: false}\n"
                            "server: {admin_key: adm, log_requests: false}\n";
    struct route_config c;
    route_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(route_config_load_string(&c, y, strlen(y), "m.yaml", err), 0);
    assert_int_equal(route_config_check(&c, err), 0);
    assert_false(c.pools[0].wafer);
    assert_int_equal(c.pools[0].n_urls, 1);
    assert_int_equal(c.routes[0].sticky, ROUTE_STICKY_API_KEY);
    assert_true(c.routes[0].split[0].weight > 0);
    assert_int_equal(c.connect_timeout_ms, 100);
    assert_int_equal(c.idle_timeout_ms, 300);
    assert_int_equal(c.eject_after, 3);
    assert_false(c.resume);
    assert_false(c.log_requests);
    assert_string_equal(c.admin_key, "adm");
    assert_int_equal(c.cache_max_bytes, 0); /* no cache section: off */
    route_config_deinit(&c);

    char host[256], prefix[256];
    int port;
    assert_int_equal(route_url_parse("http://127.0.0.1:9000/v1x/", host, sizeof host, &port, prefix, sizeof prefix), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9000);
    assert_string_equal(prefix, "/v1x");
    assert_int_equal(route_url_parse("http://[::1]:81", host, sizeof host, &port, prefix, sizeof prefix), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 81);
    assert_int_equal(route_url_parse("http://svc.ns", host, sizeof host, &port, prefix, sizeof prefix), 0);
    assert_int_equal(port, 80);
    assert_int_equal(route_url_parse("https://x:1", host, sizeof host, &port, prefix, sizeof prefix), ERR_INVALID_ARG);
    assert_int_equal(route_url_parse("http://u@x:1", host, sizeof host, &port, prefix, sizeof prefix), ERR_INVALID_ARG);
    assert_int_equal(route_url_parse("http://x:0", host, sizeof host, &port, prefix, sizeof prefix), ERR_INVALID_ARG);
    assert_int_equal(route_url_parse("http://x:70000", host, sizeof host, &port, prefix, sizeof prefix), ERR_INVALID_ARG);
    assert_int_equal(route_url_parse("http://:80", host, sizeof host, &port, prefix, sizeof prefix), ERR_INVALID_ARG);
}

/* cache.url: a shared cache in Redis, its URL parsed by the one Redis URL parser. */
static void test_config_redis_cache(void **state)
{
    (void)state;
    struct route_config c;
    route_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    const char *y = "cache: {url: 'redis://:pw@10.0.0.5:6380/2', ttl_s: 30, prefix: 'a:', timeout_ms: 50}\n";
    assert_int_equal(route_config_load_string(&c, y, strlen(y), "c.yaml", err), 0);
    assert_string_equal(c.cache_url, "redis://:pw@10.0.0.5:6380/2");
    assert_string_equal(c.cache_prefix, "a:");
    assert_int_equal(c.cache_timeout_ms, 50);
    assert_true(c.cache_ttl_s == 30);
    route_config_deinit(&c);
    struct redis_url u;
    assert_int_equal(redis_url_parse("redis://:pw@10.0.0.5:6380/2", &u, err), 0);
    assert_string_equal(u.host, "10.0.0.5");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 2);
    assert_string_equal(u.password, "pw");
    assert_string_equal(u.user, "");
    assert_int_equal(redis_url_parse("redis://cache", &u, err), 0);
    assert_int_equal(u.port, 6379);
    assert_int_equal(redis_url_parse("redis://u:p@h:1/x", &u, err), ERR_INVALID_ARG);
    assert_int_equal(redis_url_parse("rediss://h", &u, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "rediss:// (TLS) is not supported"));
    assert_int_equal(redis_url_parse("redis://:1", &u, err), ERR_INVALID_ARG);
}

/* Each bad file must fail with its name, the line of the offending entry and a word about it. */
static void test_config_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {"pools:\n  - name: a\n    backends: [http://x:1]\nroutes:\n  - {model: m, pool: b}\n", "b.yaml:5: "},
        {"pools:\n  - name: a\n    backends: [http://x:1]\n    wieght: 3\n", "b.yaml:4: unknown key 'wieght'"},
        {"pools:\n  - name: a\n    backends:\n      - ftp://x\n", "b.yaml:4: pools.backends: 'ftp://x'"},
        {"retries: {max: 2, base_ms: -1}\n", "b.yaml:1: retries.base_ms: '-1'"},
        {"server:\n  port: 99999\n", "b.yaml:2: server.port"},
        {"cache: {max_bytes: lots}\n", "b.yaml:1: cache.max_bytes"},
        {"limits:\n  keys:\n    - {key: a, rpm: many}\n", "b.yaml:3: limits.keys.rpm"},
        {"routes:\n  - model: m\n    split: {a: 0}\n", "b.yaml:3: routes.split"},
        {"routes:\n  - model: m\n    sticky: cookie\n", "b.yaml:3: routes.sticky"},
        {"colour: red\n", "b.yaml:1: unknown section 'colour'"},
        {"pools: [\n", "b.yaml:"},
        {"pools:\n  - name: a\n    backends: [http://x:1]\n  - name: a\n    backends: [http://y:1]\n",
         "b.yaml:4: pools: pool 'a' is defined twice"},
        {"health: {path: ready}\n", "b.yaml:1: health.path"},
        {"cache: {url: 'http://x:6379'}\n", "b.yaml:1: cache.url: 'http://x:6379': expected redis://"},
        {"cache: {url: 'redis://x:0'}\n", "b.yaml:1: cache.url"},
        {"cache: {url: 'redis://x', timeout_ms: 0}\n", "b.yaml:1: cache.timeout_ms"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct route_config c;
        route_config_init(&c);
        char err[ERR_MSG_MAX] = "";
        int rc = route_config_load_string(&c, cases[i].yaml, strlen(cases[i].yaml), "b.yaml", err);
        if (rc == 0) {
            c.source = strdup("b.yaml");
            rc = route_config_check(&c, err);
        }
        if (rc == 0 || !strstr(err, cases[i].want))
            fail_msg("case %zu: rc %d, message '%s' lacks '%s'", i, rc, err, cases[i].want);
        route_config_deinit(&c);
    }
}

static void test_config_add_backend(void **state)
{
    (void)state;
    struct route_config c;
    route_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(route_config_add_backend(&c, "http://127.0.0.1:1", err), 0);
    assert_int_equal(route_config_add_backend(&c, "http://127.0.0.1:2", err), 0);
    assert_int_equal(route_config_add_backend(&c, "nope", err), ERR_INVALID_ARG);
    assert_int_equal(route_config_check(&c, err), 0);
    assert_int_equal(c.n_pools, 1);
    assert_int_equal(c.pools[0].n_urls, 2);
    assert_int_equal(c.n_routes, 1);
    assert_string_equal(c.routes[0].model, "*");
    route_config_deinit(&c);
}

static void test_config_key_file(void **state)
{
    (void)state;
    const char *keys = test_tmp_path("keys.txt");
    FILE *f = fopen(keys, "w");
    assert_non_null(f);
    fputs("# team keys\nsk-one\n\n  sk-two  \n", f);
    fclose(f);
    const char *cfg = test_tmp_path("route.yaml");
    f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("pools: [{name: p, backends: [http://127.0.0.1:1]}]\nroutes: [{model: '*', pool: p}]\n"
          "limits:\n  keys: [{key: sk-zero, rpm: 5}]\n  key_file: keys.txt\n", f);
    fclose(f);
    struct route_config c;
    route_config_init(&c);
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(route_config_load_file(&c, cfg, err), 0);
    assert_int_equal(route_config_check(&c, err), 0);
    assert_int_equal(c.n_keys, 3);
    assert_string_equal(c.keys[0].key, "sk-zero");
    assert_int_equal(c.keys[0].rpm, 5);
    assert_string_equal(c.keys[1].key, "sk-one");
    assert_string_equal(c.keys[2].key, "sk-two");
    assert_int_equal(c.keys[2].rpm, 0);
    route_config_deinit(&c);
    /* a missing key file names the config line */
    route_config_init(&c);
    static const char y[] = "limits:\n  key_file: /nonexistent/keys\n";
    assert_int_equal(route_config_load_string(&c, y, strlen(y), "k.yaml", err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "k.yaml:2: limits.key_file: cannot read '/nonexistent/keys'"));
    route_config_deinit(&c);
}

/* ---- split ------------------------------------------------------------------------------------------ */

static void test_sticky_shares_and_stability(void **state)
{
    (void)state;
    const char *names[2] = {"stable", "canary"};
    double w[2] = {90, 10};
    int n = 20000, canary = 0;
    int *first = malloc((size_t)n * sizeof *first);
    for (int i = 0; i < n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "user-%d", i);
        first[i] = route_pick_sticky(key, (size_t)len, names, w, 2);
        assert_true(first[i] == 0 || first[i] == 1);
        canary += first[i] == 1;
        /* the same key, the same pool */
        assert_int_equal(route_pick_sticky(key, (size_t)len, names, w, 2), first[i]);
    }
    /* 10% within 4.5 sigma (sigma = sqrt(n * 0.1 * 0.9) = 42) */
    assert_in_range(canary, 2000 - 190, 2000 + 190);
    /* growing the canary to 20%: every canary user stays, about 10% of the stable ones move over */
    double w2[2] = {80, 20};
    int moved = 0;
    for (int i = 0; i < n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "user-%d", i);
        int p = route_pick_sticky(key, (size_t)len, names, w2, 2);
        if (first[i] == 1)
            assert_int_equal(p, 1);
        moved += first[i] == 0 && p == 1;
    }
    assert_in_range(moved, 2000 - 220, 2000 + 220);
    /* a zero weight never wins; all zero: -1 */
    double w3[2] = {0, 5};
    assert_int_equal(route_pick_sticky("k", 1, names, w3, 2), 1);
    double w4[2] = {0, 0};
    assert_int_equal(route_pick_sticky("k", 1, names, w4, 2), -1);
    free(first);
}

static void test_swrr_exact(void **state)
{
    (void)state;
    double w[3] = {90, 10, 0};
    int64_t cur[3] = {0, 0, 0};
    int count[3] = {0, 0, 0};
    int run = 0, max_run = 0, last = -1;
    for (int i = 0; i < 400; i++) {
        int k = route_pick_swrr(cur, w, 3);
        count[k]++;
        run = k == last ? run + 1 : 1;
        if (k == 0 && run > max_run)
            max_run = run;
        last = k;
    }
    assert_int_equal(count[0], 360);
    assert_int_equal(count[1], 40);
    assert_int_equal(count[2], 0);
    assert_true(max_run <= 9); /* interleaved, not 360 then 40 */
    double z[2] = {0, 0};
    int64_t c2[2] = {0, 0};
    assert_int_equal(route_pick_swrr(c2, z, 2), -1);
}

static void test_backoff_full_jitter(void **state)
{
    (void)state;
    uint64_t rng = 42;
    /* attempt n: uniform in [0, min(cap, base * 2^n)] */
    for (int attempt = 0; attempt < 8; attempt++) {
        int64_t ceil_ms = 25LL << attempt;
        if (ceil_ms > 250)
            ceil_ms = 250;
        int64_t lo = INT64_MAX, hi = -1;
        double sum = 0;
        for (int i = 0; i < 4000; i++) {
            int64_t d = route_backoff_ms(attempt, 25, 250, &rng);
            assert_true(d >= 0 && d <= ceil_ms);
            lo = d < lo ? d : lo;
            hi = d > hi ? d : hi;
            sum += (double)d;
        }
        assert_true(lo <= ceil_ms / 10);     /* reaches near 0 ... */
        assert_true(hi >= ceil_ms * 9 / 10); /* ... and near the ceiling */
        double mean = sum / 4000;
        assert_true(fabs(mean - (double)ceil_ms / 2) < (double)ceil_ms * 0.06);
    }
    assert_int_equal(route_backoff_ms(3, 0, 0, &rng), 0);
    /* cooldown: base * 2^(n-1), capped */
    assert_int_equal(route_cooldown_ms(1, 5, 300), 5000);
    assert_int_equal(route_cooldown_ms(2, 5, 300), 10000);
    assert_int_equal(route_cooldown_ms(4, 5, 300), 40000);
    assert_int_equal(route_cooldown_ms(20, 5, 300), 300000);
}

static void test_hash(void **state)
{
    (void)state;
    assert_true(route_hash64("a", 1, 0) != route_hash64("b", 1, 0));
    assert_true(route_hash64("a", 1, 0) != route_hash64("a", 1, 1));
    assert_true(route_hash64("abc", 3, 7) == route_hash64("abc", 3, 7));
    /* the top bit is balanced over similar keys */
    int ones = 0;
    for (int i = 0; i < 10000; i++) {
        char k[16];
        int n = snprintf(k, sizeof k, "k%d", i);
        ones += (int)(route_hash64(k, (size_t)n, 0) >> 63);
    }
    assert_in_range(ones, 4800, 5200);
}

/* ---- upstream head parser ---------------------------------------------------------------------------- */

static void test_parse_head(void **state)
{
    (void)state;
    struct up_response r;
    const char *a = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nxyz";
    int n = up_parse_head(a, strlen(a), &r, 0);
    assert_int_equal(n, (int)strlen(a) - 3);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    assert_true(r.keep_alive);
    assert_string_equal(r.content_type, "text/event-stream");
    assert_int_equal(r.content_length, -1);
    const char *b = "HTTP/1.1 429 Too Many\r\nretry-after: 3\r\ncontent-length: 10\r\nConnection: close\r\n\r\n";
    assert_int_equal(up_parse_head(b, strlen(b), &r, 0), (int)strlen(b));
    assert_int_equal(r.status, 429);
    assert_int_equal(r.retry_after_ms, 3000);
    assert_int_equal(r.content_length, 10);
    assert_false(r.keep_alive);
    const char *c = "HTTP/1.0 503 x\nRetry-After: Thu, 01 Jan 1970 00:00:10 GMT\n\n";
    assert_int_equal(up_parse_head(c, strlen(c), &r, 4), (int)strlen(c));
    assert_int_equal(r.retry_after_ms, 6000);
    assert_false(r.keep_alive); /* 1.0 without keep-alive */
    assert_int_equal(up_parse_head("HTTP/1.1 200 OK\r\nA: b\r\n", 24, &r, 0), 0); /* incomplete */
    assert_int_equal(up_parse_head("HELLO\r\n\r\n", 9, &r, 0), ERR_FORMAT);
    const char *d = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
    assert_int_equal(up_parse_head(d, strlen(d), &r, 0), ERR_FORMAT);
    const char *e = "HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n";
    assert_int_equal(up_parse_head(e, strlen(e), &r, 0), ERR_FORMAT);
    const char *f = "HTTP/1.1 99 OK\r\n\r\n";
    assert_int_equal(up_parse_head(f, strlen(f), &r, 0), ERR_FORMAT);
}

/* ---- cache -------------------------------------------------------------------------------------------- */

static void test_cache_lru_ttl_bytes(void **state)
{
    (void)state;
    int64_t entry = 1 + 100 + ROUTE_CACHE_ENTRY_OVERHEAD; /* key "k" + 100-byte value */
    struct route_cache *c = route_cache_create(entry * 3, 10.0);
    char v[100];
    memset(v, 'x', sizeof v);
    size_t n;
    assert_null(route_cache_get(c, "a", 1, 0, &n));
    assert_int_equal(route_cache_put(c, "a", 1, v, 100, 0), 0);
    assert_int_equal(route_cache_put(c, "b", 1, v, 100, 0), 0);
    assert_int_equal(route_cache_put(c, "c", 1, v, 100, 0), 0);
    assert_non_null(route_cache_get(c, "a", 1, 1, &n)); /* a becomes most recent: b is the LRU */
    assert_int_equal(n, 100);
    assert_int_equal(route_cache_put(c, "d", 1, v, 100, 2), 0);
    assert_null(route_cache_get(c, "b", 1, 3, &n));
    assert_non_null(route_cache_get(c, "a", 1, 3, &n));
    assert_non_null(route_cache_get(c, "c", 1, 3, &n));
    assert_non_null(route_cache_get(c, "d", 1, 3, &n));
    struct route_cache_stats st;
    route_cache_stats_get(c, &st);
    assert_int_equal(st.entries, 3);
    assert_true(st.bytes <= entry * 3);
    assert_int_equal(st.evictions, 1);
    /* TTL: 10 s after the store, gone */
    assert_null(route_cache_get(c, "a", 1, 10000, &n));
    /* too large for the whole cache: refused, nothing evicted */
    char big[1000];
    memset(big, 'y', sizeof big);
    assert_int_equal(route_cache_put(c, "e", 1, big, sizeof big, 5), ERR_TOO_LARGE);
    assert_non_null(route_cache_get(c, "c", 1, 5, &n));
    /* replacing a key keeps one entry */
    assert_int_equal(route_cache_put(c, "c", 1, "new", 3, 5), 0);
    const char *got = route_cache_get(c, "c", 1, 6, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(got, "new", 3);
    /* many keys: the table grows and every key is found */
    struct route_cache *c2 = route_cache_create(1 << 24, 100);
    for (int i = 0; i < 5000; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "key%d", i);
        assert_int_equal(route_cache_put(c2, k, (size_t)kl, k, (size_t)kl, 0), 0);
    }
    for (int i = 0; i < 5000; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "key%d", i);
        got = route_cache_get(c2, k, (size_t)kl, 1, &n);
        assert_non_null(got);
        assert_memory_equal(got, k, (size_t)kl);
    }
    route_cache_destroy(c2);
    route_cache_destroy(c);
}

/* ---- limits ------------------------------------------------------------------------------------------- */

static void test_limits(void **state)
{
    (void)state;
    struct route_key_conf keys[4] = {{"sk-a", 2, 1000, 0}, {"sk-b", 0, 0, 1}, {"sk-none", 0, 0, 0}, {"sk-t", 0, 1000, 0}};
    struct route_limits *l = route_limits_create(keys, 4, NULL);
    assert_int_equal(route_limits_find(l, "sk-a", 4), 0);
    assert_int_equal(route_limits_find(l, "sk-b", 4), 1);
    assert_int_equal(route_limits_find(l, "sk-none", 7), 2);
    assert_int_equal(route_limits_find(l, "sk-c", 4), -1);
    assert_int_equal(route_limits_find(l, "sk-a ", 5), -1);
    assert_int_equal(route_limits_find(l, "sk-", 3), -1);
    struct route_limit_info li;
    /* rpm 2: two admitted, the third waits 30 s for the bucket to hold one again */
    assert_true(route_limits_admit(l, 0, 100, 1000, &li));
    assert_int_equal(li.limit_requests, 2);
    assert_int_equal(li.remaining_requests, 1);
    assert_int_equal(li.remaining_tokens, 900);
    route_limits_settle(l, 0, 100, 50, 1000); /* used less: 50 come back */
    assert_true(route_limits_admit(l, 0, 100, 1000, &li));
    assert_int_equal(li.remaining_requests, 0);
    assert_int_equal(li.remaining_tokens, 850);
    assert_int_equal(li.reset_requests_ms, 60000);
    route_limits_settle(l, 0, 100, 100, 1000);
    assert_false(route_limits_admit(l, 0, 100, 1000, &li));
    assert_int_equal(li.denied, ROUTE_LIMIT_RPM);
    assert_int_equal(li.retry_after_ms, 30000);
    assert_true(route_limits_admit(l, 0, 100, 31000, &li)); /* refilled */
    route_limits_settle(l, 0, 100, 100, 31000);
    /* tpm: a reservation larger than what is left waits until the bucket refilled enough */
    assert_true(route_limits_admit(l, 3, 600, 0, &li));
    assert_int_equal(li.remaining_tokens, 400);
    assert_false(route_limits_admit(l, 3, 500, 0, &li));
    assert_int_equal(li.denied, ROUTE_LIMIT_TPM);
    assert_int_equal(li.retry_after_ms, 6000);
    assert_true(route_limits_admit(l, 3, 500, 6000, &li));
    route_limits_settle(l, 3, 600, -1, 6000);
    route_limits_settle(l, 3, 500, -1, 6000);
    /* concurrent 1 */
    assert_true(route_limits_admit(l, 1, 10, 0, &li));
    assert_false(route_limits_admit(l, 1, 10, 0, &li));
    assert_int_equal(li.denied, ROUTE_LIMIT_CONCURRENT);
    route_limits_settle(l, 1, 10, -1, 0);
    assert_true(route_limits_admit(l, 1, 10, 0, &li));
    route_limits_settle(l, 1, 10, -1, 0);
    /* no limits */
    for (int i = 0; i < 100; i++) {
        assert_true(route_limits_admit(l, 2, 1000000, 0, &li));
        route_limits_settle(l, 2, 1000000, 5, 0);
    }
    /* headers */
    struct route_limit_info h = {0};
    h.limit_requests = 600, h.remaining_requests = 599, h.reset_requests_ms = 100;
    h.limit_tokens = 200000, h.remaining_tokens = 1000, h.reset_tokens_ms = 360000;
    char buf[512];
    size_t n = 0;
    route_limits_headers(&h, buf, sizeof buf, &n);
    assert_non_null(strstr(buf, "x-ratelimit-limit-requests: 600\r\n"));
    assert_non_null(strstr(buf, "x-ratelimit-remaining-requests: 599\r\n"));
    assert_non_null(strstr(buf, "x-ratelimit-reset-requests: 100ms\r\n"));
    assert_non_null(strstr(buf, "x-ratelimit-reset-tokens: 6m0s\r\n"));
    char d[32];
    route_limits_duration(1500, d, sizeof d);
    assert_string_equal(d, "1.5s");
    /* a reload keeps the state of keys that stay */
    struct route_key_conf keys2[1] = {{"sk-b", 0, 0, 1}};
    assert_true(route_limits_admit(l, 1, 10, 0, &li));
    l = route_limits_create(keys2, 1, l);
    assert_int_equal(route_limits_find(l, "sk-a", 4), -1);
    assert_false(route_limits_admit(l, 0, 10, 0, &li)); /* still one in flight */
    route_limits_settle(l, 0, 10, -1, 0);
    route_limits_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_issue_example),
        cmocka_unit_test(test_config_more_keys),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_redis_cache),
        cmocka_unit_test(test_config_add_backend),
        cmocka_unit_test(test_config_key_file),
        cmocka_unit_test(test_sticky_shares_and_stability),
        cmocka_unit_test(test_swrr_exact),
        cmocka_unit_test(test_backoff_full_jitter),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_parse_head),
        cmocka_unit_test(test_cache_lru_ttl_bytes),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
