/*
 * config: the settings of `wafer serve`, from a YAML file (libfyaml) and then command-line flags that
 * override it. Every value is range-checked here, once, so the rest of the server trusts its config. A bad
 * file is reported as "path:line: key: what is wrong", naming the key and what it accepts.
 *
 * YAML layout (docs/config.md has the full example):
 *   model:      {name, path, aliases: [..], chat_template}
 *   server:     {host, port, threads, backend, ctx_size, max_batch_size, kv_memory, max_queue, request_timeout,
 *                drain_timeout, prefill_chunk, max_body, max_connections, header_timeout, body_timeout,
 *                spec, draft_model, draft_max, draft_min, draft_fixed,
 *                log_requests, log_level, workers, max_response, max_inflight, parse_special}
 *   generation: {max_new_tokens, temperature, top_p, top_k, min_p, repeat_penalty}
 *   auth:       {api_keys: [..], api_key_file, admin_keys: [..]}
 *   cors:       {origins: [..]}
 *   alerts:     {interval_s, data_dir, rules: [..], receivers: [..]}   (core/alert.h; docs/observability.md)
 *   slo:        {itl_p95_ms, ttft_p95_ms, window_s, min_batch_size, max_batch_size}
 *   cost:       {per_hour}
 *   energy:     {rapl, watts}
 */
#ifndef WAFER_SERVER_CONFIG_H
#define WAFER_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONFIG_MAX_LIST 16

struct alert_config;

struct server_config {
    /* model */
    char *model_path;
    char *model_path_origin; /* "file.yaml:3" or "--model" (for error messages) */
    char *model_name;        /* served name; NULL: the file's base name without .gguf */
    char *aliases[CONFIG_MAX_LIST];
    int n_aliases;
    char *chat_template; /* family name override, or NULL (detect from the GGUF) */
    bool use_mmap;       /* map the file rather than read it into memory (model_load_ex) */

    /* server */
    char *host;
    int port;
    int threads;        /* compute threads; 0: one per CPU */
    char *backend;      /* engine backend name (engine_backend_check); NULL: cpu */
    int ctx_size;       /* 0: the model's training context */
    int max_batch_size; /* sequences decoded together (engine slots) */
    int64_t kv_memory;  /* bytes; 0: enough for max_batch_size full contexts */
    int max_queue;      /* waiting requests before 429 */
    double request_timeout; /* seconds from arrival to the end of the response; 0: none */
    double drain_timeout;   /* seconds in-flight requests get after SIGTERM */
    int prefill_chunk;      /* prompt tokens per engine step (chunked prefill budget) */
    int64_t max_body;       /* request body bytes -> 413 */
    int max_connections;
    double header_timeout; /* seconds */
    double body_timeout;   /* seconds */
    char *spec;            /* speculative decoding's drafts: "off", "ngram" or "draft"; NULL: "draft" when
                              draft_model_path is set, else "off" */
    char *draft_model_path; /* the draft model's GGUF, or NULL */
    int draft_max;         /* most drafted tokens per sequence and step (0: no speculation) */
    int draft_min;         /* shorter drafts are not verified */
    bool draft_fixed;      /* verify drafts whole (sched_params.draft_adaptive off) */

    /* generation defaults (requests override) */
    int max_new_tokens;
    float temperature;
    float top_p;
    int top_k;
    float min_p;
    float repeat_penalty;

    /* auth: keys accepted in "Authorization: Bearer <key>" (none: no auth) */
    char *api_keys[CONFIG_MAX_LIST];
    int n_api_keys;
    /* keys for the admin endpoints (POST /admin/drain); none: loopback clients only */
    char *admin_keys[CONFIG_MAX_LIST];
    int n_admin_keys;

    /* cors: allowed origins ("*" allows any); none: no CORS headers */
    char *cors_origins[CONFIG_MAX_LIST];
    int n_cors_origins;

    bool log_requests; /* one line per request (default true) */

    /* jobs: the Batch API's store (docs/jobs.md) */
    char *jobs_data_dir;          /* NULL: jobs_default_data_dir() */
    char *jobs_queue;             /* NULL: SQLite under the data dir; redis://...: Redis */
    int64_t jobs_max_file_bytes;  /* largest upload -> 413 (default 200 MB) */
    int jobs_max_lines;           /* requests per input file (default 50,000) */
    int jobs_max_inflight;        /* batch lines started at once; -1: 2 x max_batch_size; 0: no runner */
    double jobs_lease;            /* seconds before another worker may take a line not renewed; 0: default */
    /* observability (docs/observability.md) */
    struct alert_config *alerts; /* the alerts: section; NULL when absent */
    bool batch_auto;             /* server.max_batch_size: auto (slots: slo_max_batch, limit by the controller) */
    double slo_itl_p95_ms;        /* inter-token latency target of the batch controller; 0: none */
    double slo_ttft_p95_ms;      /* time-to-first-token target; 0: none */
    double slo_window_s;         /* the controller's window (default 10) */
    int slo_min_batch;           /* the controller's range (default 1 .. 32 for auto, else max_batch_size) */
    int slo_max_batch;
    double cost_per_hour;        /* dollars per hour of the machine; 0: no cost metrics */
    bool energy_rapl;            /* read RAPL energy counters (default true) */
    double energy_watts;         /* when RAPL is unreadable: an estimate from this power, labelled so; 0: none */
    /* reliability (docs/reliability.md) */
    char *log_level;   /* "error", "warn", "info", "debug", or NULL ($WAFER_LOG, else info) */
    int workers;       /* threads preparing requests and building answers off the I/O thread (default 2) */
    int64_t max_response; /* bytes one non-streaming answer may reach; 0: 4 KiB per context position, >= 4 MiB */
    int64_t max_inflight; /* bytes of request bodies and buffered answers held at once (default 256 MiB) */
    bool parse_special;   /* prompt text may write special tokens (default false) */

    /* the command line server_config_from_args read (not owned), to read it again on SIGHUP */
    int argc;
    char **argv;
};

/* Fills defaults (host 127.0.0.1, port 8080, max_batch_size 16, ...). Release with server_config_deinit. */
void server_config_init(struct server_config *c);
void server_config_deinit(struct server_config *c);

/* Applies a YAML file over c. 0, or ERR_IO / ERR_FORMAT / ERR_INVALID_ARG with "path:line: ..." in err.
 * A relative model.path or auth.api_key_file is resolved against the file's directory. */
int server_config_load_file(struct server_config *c, const char *path, char *err);
/* Same for YAML text (tests, fuzzing); name is used in messages. */
int server_config_load_string(struct server_config *c, const char *yaml, size_t len, const char *name,
                              char *err);

/* Parses `wafer serve` flags (argv[0] is "serve"): --config is applied first, then every other flag over
 * it. Returns 0, 1 when --help was printed (to out), or a negative code with a message in err. */
int server_config_from_args(struct server_config *c, int argc, char **argv, char *err);
void server_config_usage(void *file);

/* Cross-field checks after everything was applied (a model path is set, ...). 0 or ERR_INVALID_ARG. */
int server_config_check(const struct server_config *c, char *err);
#endif
