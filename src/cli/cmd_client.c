/*
 * wafer client: a command line on the C client library (include/wafer/client.h): generate, chat, batch and
 * get against a running server, with the library's retries, timeouts and streaming. Text goes to stdout,
 * retries (with -v) and errors to stderr; --json prints each result as a JSON object instead.
 */
#include "cli/cli.h"
#include "core/flags.h"
#include "wafer/client.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLIENT_MAX_STOP 16

static void client_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer client [options] generate PROMPT\n"
            "       wafer client [options] chat MESSAGE\n"
            "       wafer client [options] batch PROMPT...      (or --file F: one prompt per line)\n"
            "       wafer client [options] get PATH             (e.g. /ready, /v1/models: the body; exit 1 unless 2xx)\n\n"
            "Calls a wafer server (or any OpenAI-compatible one) through libwafer-client: connections kept\n"
            "alive, retries as the OpenAI SDKs do them (408, 409, 429, 5xx and connection errors; Retry-After\n"
            "honoured; a stream is never retried once it began), timeouts. Batch jobs (the Batch API) are\n"
            "`wafer jobs`, on the same library.\n\n"
            "  -u, --url URL              server (default $WAFER_URL, else http://127.0.0.1:8080)\n"
            "      --api-key KEY          Bearer key (default $WAFER_API_KEY)\n"
            "  -m, --model NAME           the request's model (default: the server's)\n"
            "  -n, --max-tokens N         (default: the server's)\n"
            "      --temperature T        0 = greedy (default: the server's)\n"
            "      --top-p P\n"
            "      --seed S\n"
            "      --stop S               stop string (repeatable, up to %d)\n"
            "      --system TEXT          chat: a system message first\n"
            "      --extra JSON           more request fields, e.g. '{\"top_k\": 40}'\n"
            "  -s, --stream               generate, chat: print the text as it is generated\n"
            "  -c, --concurrency N        batch: requests at once (default 4)\n"
            "  -f, --file F               batch: prompts, one per line\n"
            "      --retries N            (default 2)\n"
            "      --timeout S            one attempt, seconds (default 600; 0 = none)\n"
            "      --connect-timeout S    (default 10)\n"
            "      --first-byte-timeout S until the response begins (default 0 = none)\n"
            "      --json                 print each result as JSON {index, status, http_status, text,\n"
            "                             finish_reason, prompt_tokens, completion_tokens, attempts, error}\n"
            "  -v, --verbose              say on stderr when and why a request is retried\n"
            "  -h, --help                 this help\n",
            CLIENT_MAX_STOP);
}

static void client_on_retry(void *ud, int attempt, double delay_s, const char *why)
{
    (void)ud;
    fprintf(stderr, "wafer client: %s; attempt %d in %.2f s\n", why, attempt, delay_s);
}

static int client_print_chunk(void *ud, const char *text, size_t len)
{
    (void)ud;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static void client_print_json(int index, const struct wafer_result *r)
{
    json_t *o = json_pack("{s:s, s:i, s:s?, s:s, s:i, s:i, s:i, s:s}", "status", wafer_status_name(r->status),
                          "http_status", r->http_status, "text", r->text, "finish_reason", r->finish_reason,
                          "prompt_tokens", r->prompt_tokens, "completion_tokens", r->completion_tokens, "attempts",
                          r->attempts, "error", r->error);
    if (o && index >= 0)
        json_object_set_new(o, "index", json_integer(index));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(o);
}

/* Prompts of a batch file, one per line (empty lines skipped). */
static char **client_read_lines(const char *path, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char **v = NULL, *line = NULL;
    size_t cap = 0;
    int count = 0, vcap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (!len)
            continue;
        if (count == vcap) {
            vcap = vcap ? vcap * 2 : 16;
            char **nv = realloc(v, sizeof *v * (size_t)vcap);
            if (!nv)
                break;
            v = nv;
        }
        if (!(v[count] = strdup(line)))
            break;
        count++;
    }
    free(line);
    fclose(f);
    *n = count;
    return v ? v : calloc(1, sizeof *v);
}

int cmd_client_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, 0, 'u'},         {"api-key", required_argument, 0, 1},
        {"model", required_argument, 0, 'm'},       {"max-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 2},   {"top-p", required_argument, 0, 3},
        {"seed", required_argument, 0, 4},          {"stop", required_argument, 0, 5},
        {"system", required_argument, 0, 6},        {"extra", required_argument, 0, 7},
        {"stream", no_argument, 0, 's'},            {"concurrency", required_argument, 0, 'c'},
        {"file", required_argument, 0, 'f'},        {"retries", required_argument, 0, 8},
        {"timeout", required_argument, 0, 9},       {"connect-timeout", required_argument, 0, 10},
        {"first-byte-timeout", required_argument, 0, 11}, {"json", no_argument, 0, 12},
        {"verbose", no_argument, 0, 'v'},           {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    struct wafer_client_options co;
    wafer_client_options_default(&co);
    const char *env_url = getenv("WAFER_URL"), *env_key = getenv("WAFER_API_KEY");
    if (env_url && *env_url)
        co.base_url = env_url;
    co.api_key = env_key && *env_key ? env_key : NULL;
    struct wafer_params p;
    wafer_params_default(&p);
    const char *stop[CLIENT_MAX_STOP], *system = NULL, *file = NULL;
    bool stream = false, json = false;
    long l, concurrency = 4;
    double d;
    uint64_t u;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+u:m:n:sc:f:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'u': co.base_url = optarg; break;
        case 1: co.api_key = optarg; break;
        case 'm': co.model = optarg; break;
        case 'n': if (flags_parse_int("client", "--max-tokens", optarg, 1, 1 << 24, &l)) return 2; p.max_tokens = (int)l; break;
        case 2: if (flags_parse_float("client", "--temperature", optarg, 0, 2, &d)) return 2; p.temperature = d; break;
        case 3: if (flags_parse_float("client", "--top-p", optarg, 0, 1, &d)) return 2; p.top_p = d; break;
        case 4: if (flags_parse_u64("client", "--seed", optarg, &u)) return 2; p.seed = (long long)u; p.seed_set = true; break;
        case 5:
            if (p.n_stop == CLIENT_MAX_STOP) {
                fprintf(stderr, "wafer client: --stop: at most %d stop strings\n", CLIENT_MAX_STOP);
                return 2;
            }
            stop[p.n_stop++] = optarg;
            p.stop = stop;
            break;
        case 6: system = optarg; break;
        case 7: p.extra_json = optarg; break;
        case 's': stream = true; break;
        case 'c': if (flags_parse_int("client", "--concurrency", optarg, 1, 1024, &concurrency)) return 2; break;
        case 'f': file = optarg; break;
        case 8: if (flags_parse_int("client", "--retries", optarg, 0, 100, &l)) return 2; co.max_retries = (int)l; break;
        case 9: if (flags_parse_float("client", "--timeout", optarg, 0, 1e6, &d)) return 2; co.timeout_ms = (long)(d * 1e3); break;
        case 10: if (flags_parse_float("client", "--connect-timeout", optarg, 0, 1e6, &d)) return 2; co.connect_timeout_ms = (long)(d * 1e3); break;
        case 11: if (flags_parse_float("client", "--first-byte-timeout", optarg, 0, 1e6, &d)) return 2; co.first_byte_timeout_ms = (long)(d * 1e3); break;
        case 12: json = true; break;
        case 'v': co.on_retry = client_on_retry; break;
        case 'h': client_usage(stdout); return 0;
        default: client_usage(stderr); return 2;
        }
    }
    const char *verb = optind < argc ? argv[optind] : NULL;
    int n_args = argc - optind - 1;
    bool batch = verb && !strcmp(verb, "batch");
    if (!verb || (strcmp(verb, "generate") && strcmp(verb, "chat") && !batch && strcmp(verb, "get")) ||
        (!batch && n_args != 1) || (batch && (file ? n_args != 0 : n_args < 1))) {
        fprintf(stderr, "wafer client: %s\n\n",
                !verb ? "name what to do: generate, chat, batch or get" : "wrong arguments for this command");
        client_usage(stderr);
        return 2;
    }
    char err[WAFER_ERR_MAX];
    struct wafer_client *cl = wafer_client_create(&co, err);
    if (!cl) {
        fprintf(stderr, "wafer client: %s\n", err);
        return 2;
    }
    int rc = 0;
    const char *arg = argv[optind + 1];
    if (batch) {
        char **lines = NULL;
        int n = n_args;
        const char *const *prompts = (const char *const *)argv + optind + 1;
        if (file) {
            if (!(lines = client_read_lines(file, &n))) {
                fprintf(stderr, "wafer client: cannot read %s\n", file);
                wafer_client_destroy(cl);
                return 1;
            }
            prompts = (const char *const *)lines;
        }
        struct wafer_result *rs = calloc((size_t)(n ? n : 1), sizeof *rs);
        if (!rs) {
            fprintf(stderr, "wafer client: out of memory\n");
            rc = 1;
        } else {
            rc = wafer_batch_generate(cl, prompts, n, &p, (int)concurrency, rs) == WAFER_OK ? 0 : 1;
            for (int i = 0; i < n; i++) {
                if (json) {
                    client_print_json(i, &rs[i]);
                } else if (rs[i].status == WAFER_OK) {
                    printf("--- %d (%s, %d tokens)\n%s\n", i, rs[i].finish_reason, rs[i].completion_tokens,
                           rs[i].text);
                } else {
                    printf("--- %d failed\n", i);
                    fprintf(stderr, "wafer client: prompt %d: %s\n", i, rs[i].error);
                }
                wafer_result_free(&rs[i]);
            }
        }
        free(rs);
        for (int i = 0; lines && i < n; i++)
            free(lines[i]);
        free(lines);
        wafer_client_destroy(cl);
        return rc;
    }
    struct wafer_result r;
    bool live = stream && !json;
    if (!strcmp(verb, "get")) {
        wafer_get(cl, arg, &r);
    } else if (!strcmp(verb, "generate")) {
        if (stream)
            wafer_generate_stream(cl, arg, &p, live ? client_print_chunk : NULL, NULL, &r);
        else
            wafer_generate(cl, arg, &p, &r);
    } else {
        struct wafer_message msgs[2] = {{"system", system}, {"user", arg}};
        int first = system ? 0 : 1;
        if (stream)
            wafer_chat_stream(cl, msgs + first, 2 - first, &p, live ? client_print_chunk : NULL, NULL, &r);
        else
            wafer_chat(cl, msgs + first, 2 - first, &p, &r);
    }
    if (json) {
        client_print_json(-1, &r);
    } else if (live) {
        fputc('\n', stdout);
    } else if (r.text) {
        fputs(r.text, stdout);
        if (r.text_len == 0 || r.text[r.text_len - 1] != '\n')
            fputc('\n', stdout);
    }
    fflush(stdout);
    if (r.status != WAFER_OK) {
        fprintf(stderr, "wafer client: %s\n", r.error);
        rc = 1;
    }
    wafer_result_free(&r);
    wafer_client_destroy(cl);
    return rc;
}
