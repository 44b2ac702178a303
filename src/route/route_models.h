/*
 * route_models: `wafer serve` with many models (a `models:` list in the config, or --models-dir DIR).
 *
 * Design: a model manager inside the router of `wafer route`, as llama-server's router mode does it. Every
 * loaded model is one child process `wafer serve --model PATH --host 127.0.0.1 --port EPHEMERAL ...` with its
 * own slots, KV cache and crash isolation, so loading one model (reading weights, or pulling an hf:// file)
 * never stalls requests to another, and a crash takes down one model only. The front is the router: each
 * model is a pool whose single backend is its child, each name and alias a route to that pool, so requests
 * are proxied by the router's own machinery (streaming without buffering, backpressure, a client that leaves
 * closes the upstream request, metrics). Before a request goes upstream the manager holds it until its model
 * is loaded (loading it on first use when load_on_request), and counts it in flight so that the model is
 * not unloaded under it.
 *
 * Memory: a model is estimated at its file's size plus its KV budget (kv_memory, passed to the child as
 * --kv-memory so the estimate is the child's real cap). Before a load, idle models (nothing in flight)
 * are unloaded least recently used first until the loaded models fit memory_budget and max_loaded; a
 * model larger than the budget alone is refused (507); one that must wait for busy models waits (up to
 * load_timeout) and is then refused (503).
 *
 * keep_alive (Ollama's meaning): seconds a model stays loaded after its last request ends; 0 unloads it as
 * soon as it is idle; negative keeps it until evicted or unloaded by the admin API.
 *
 * docs/models.md is the reference.
 */
#ifndef WAFER_ROUTE_ROUTE_MODELS_H
#define WAFER_ROUTE_ROUTE_MODELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct route_model_conf {
    char *name;
    char *path;            /* a GGUF file or hf://OWNER/NAME:QUANT (the child pulls it when missing) */
    char **aliases;        /* [n_aliases] */
    int n_aliases;
    int max_batch_size;    /* 0: the models section default (then serve's) */
    int64_t kv_memory;     /* bytes; 0: the default (route_models_config.kv_memory) */
    int ctx_size;          /* 0: the default */
    double keep_alive;     /* seconds; used when keep_alive_set */
    bool keep_alive_set;
    bool preload;          /* loaded at start (memory allowing) rather than on its first request */
    char **args;           /* [n_args] more `wafer serve` flags for this model's child */
    int n_args;
    int line;              /* in the config file, 0 for --models-dir entries */
};

struct route_models_config {
    char *source;          /* the config file, or NULL */
    char *host;            /* the front (default 127.0.0.1:8080) */
    int port;
    int max_connections;
    int64_t max_body;
    bool log_requests;

    struct route_model_conf *models; /* [n_models] */
    int n_models;

    int64_t memory_budget; /* bytes for loaded models' weights + KV; 0: no budget */
    int max_loaded;        /* models loaded at once; 0: no limit */
    double keep_alive;     /* default 300 s; 0: unload when idle; < 0: never */
    bool load_on_request;  /* default true; false: only the admin API loads */
    double load_timeout;   /* seconds a load (or a wait for memory) may take (default 600) */
    int64_t kv_memory;     /* default KV budget per model (default 256MiB) */
    int max_batch_size;    /* child defaults; 0: serve's own */
    int ctx_size;
    int threads;

    char **admin_keys;     /* [n_admin_keys]; none: the admin API is open to loopback peers only */
    int n_admin_keys;
    char **api_keys;       /* [n_api_keys]; when any, /v1 requests need one */
    int n_api_keys;

    char *exe;             /* the wafer binary the children run; NULL: /proc/self/exe */
    /* The size of a model file, or -1 when unknown (an hf:// spec not pulled yet); set by the caller (cli
     * knows the models directory). NULL: stat() of the path. Called on the I/O thread: must not block long. */
    int64_t (*path_bytes)(const char *path);
};

/* Defaults (port 8080, keep_alive 300, load_on_request, kv_memory 256MiB). Release with _deinit. */
void route_models_config_init(struct route_models_config *c);
void route_models_config_deinit(struct route_models_config *c);

/* Applies a YAML file (or text; name is used in messages) over c. 0, or ERR_IO / ERR_FORMAT /
 * ERR_INVALID_ARG with "name:line: ..." in err. Relative model paths resolve against the file's folder. */
int route_models_config_load_file(struct route_models_config *c, const char *path, char *err);
int route_models_config_load_string(struct route_models_config *c, const char *yaml, size_t len, const char *name,
                                    char *err);

/* Adds every *.gguf file of dir as a model named after the file (without .gguf); names already configured
 * are kept as they are. 0, or ERR_IO / ERR_NOMEM with a message. */
int route_models_config_scan_dir(struct route_models_config *c, const char *dir, char *err);

/* Whether the YAML file at path has a top-level `models:` key (so `wafer serve --config` runs this mode).
 * false when it cannot be read (the server's own parser then says why). */
bool route_models_file_has_models(const char *path);

/* `wafer serve` flags in this mode (argv[0] is "serve"): --config first, then the others over it. 0, 1 when
 * --help was printed, or ERR_INVALID_ARG / ERR_IO with a message. Checks the result (route_models_config_check). */
int route_models_config_from_args(struct route_models_config *c, int argc, char **argv, char *err);
void route_models_usage(void *file);

/* Cross-checks: at least one model, names and aliases unique, every model a path. 0 or ERR_INVALID_ARG. */
int route_models_config_check(const struct route_models_config *c, char *err);

/* Runs the front and the manager until SIGTERM/SIGINT (or POST /admin/drain); the children are stopped
 * before it returns. Takes the contents of c (left empty). Returns the process exit status. */
int route_models_run(struct route_models_config *c);

/* ---- the eviction choice (pure; route_models_plan.c) ---- */

struct route_models_slot {
    int64_t bytes;       /* estimated memory */
    int64_t last_used;   /* ms; larger is more recent */
    bool resident;       /* loaded or loading: counts against the budget */
    bool busy;           /* loading, or requests in flight or waiting: cannot be evicted */
};

/* Which resident models to unload so that model `want` (not resident) fits: the least recently used idle
 * ones first, until the residents' bytes plus want's are within budget (0: none) and their count below
 * max_loaded (0: none). Returns 0 with evict[0..*n_evict) (indexes), ERR_TOO_LARGE when want alone is over
 * the budget, or ERR_UNAVAILABLE when only busy models stand in the way (nothing is chosen then). */
int route_models_plan_evict(const struct route_models_slot *s, int n, int want, int64_t budget, int max_loaded,
                            int *evict, int *n_evict);

#endif
