/*
 * cmd_bench: `wafer bench`. Three tools under one name: `bench serve` load-tests an OpenAI-compatible server,
 * `bench compare` puts two of its JSON results side by side, and plain `bench --model M` benchmarks the
 * engine itself (bench_model.c). This file parses and checks flags; the work is in src/bench/.
 */
#include "cli/cli.h"

#include "bench/bench_compare.h"
#include "bench/bench_model.h"
#include "bench/serve.h"
#include "bench/serve_stats.h"
#include "core/err.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer bench <tool> [options]\n\n"
            "  wafer bench serve --url URL ...     load-test an OpenAI-compatible server (TTFT, TPOT, ITL, E2E,\n"
            "                                      throughput, goodput, cost; table, --json, --html)\n"
            "  wafer bench compare A.json B.json   compare two `bench serve --json` results side by side\n"
            "  wafer bench grammar --model M       per-token mask cost of constrained decoding (JSON schemas, GBNF)\n"
            "  wafer bench --model M ...           benchmark the engine on a GGUF model (as llama-bench)\n"
            "  wafer bench --membw                 measure this machine's memory read bandwidth\n"
            "  wafer bench --stream TYPE           the decode kernels alone against a plain read of their bytes\n"
            "  wafer bench --tune                  measure how the decode kernels should read their weights on\n"
            "                                      this CPU and save it for every later run\n\n"
            "wafer bench <tool> --help shows each tool's options; docs/bench.md has a walk-through.\n");
}

static void bench_serve_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer bench serve --url URL [options]\n\n"
            "Load-tests an OpenAI-compatible server with streaming requests from one thread (libcurl multi) and\n"
            "reports TTFT, TPOT, ITL and E2E latency (mean, median, p90, p95, p99), throughput, goodput and cost.\n\n"
            "server:\n"
            "  --url URL               base URL (http://127.0.0.1:8080), .../v1, or a full .../completions URL\n"
            "  --api-key KEY           sent as 'Authorization: Bearer KEY'\n"
            "  --model NAME            model field (default: the first id from GET /v1/models)\n"
            "  --endpoint E            completions (default) or chat\n"
            "  --timeout S             per-request timeout in seconds (default 600)\n"
            "load (a comma list sweeps; give one of the two):\n"
            "  --concurrency LIST      requests kept in flight, e.g. 1,4,8 (default 1)\n"
            "  --request-rate LIST     Poisson arrivals in requests/s, e.g. 2,8 or inf (all at once)\n"
            "  --num-prompts N         requests per run (default 100, or the whole --dataset); with --turns,\n"
            "                          conversations per run\n"
            "prompts:\n"
            "  --input-len LIST        synthetic prompt length in tokens, e.g. 512,2048,8192 (default 128)\n"
            "  --output-len N          max_tokens per request (default 128)\n"
            "  --dataset FILE.jsonl    prompts from {\"prompt\": ..., \"max_tokens\": ...} lines instead\n"
            "  --seed S                seed for prompts and arrivals (default 0): same seed, same requests\n"
            "  --ignore-eos            send \"ignore_eos\": true so every answer is --output-len tokens\n"
            "  --temperature T         sampling temperature to send (default: not sent)\n"
            "  --no-calibrate          do not size synthetic prompts with the server's POST /tokenize\n"
            "  --turns N               multi-turn chat: each conversation sends N requests, each turn's prompt\n"
            "                          the history so far (earlier prompts and answers) and a new message of\n"
            "                          --input-len tokens; reports the prefix-cache hit rate (usage's\n"
            "                          cached_tokens) and TTFT per turn. Closed loop: --concurrency counts\n"
            "                          conversations in flight (default 1: single requests)\n"
            "  --reuse-prompts         send the same prompts at every load point (default: new prompts for\n"
            "                          each point, so a prefix cache cannot answer later points' prefill;\n"
            "                          a --dataset is read in consecutive slices of --num-prompts lines)\n"
            "checks and costs:\n"
            "  --slo SPEC              goodput objectives, e.g. ttft=500ms,tpot=50ms,e2e=10s (keys ttft, tpot,\n"
            "                          itl (every gap), itl_p95 (the request's p95 gap), e2e; units us, ms, s),\n"
            "                          or ITL_P95_MS[,TTFT_MS] as wafer serve's slo: section sets them (50,2000)\n"
            "  --quality FILE.jsonl    score answers to {\"prompt\", \"expected_keywords\": [...]} cases\n"
            "                          (--num-prompts 0 runs only the quality check)\n"
            "  --cost-per-hour USD     price of the server; adds cost per request and per 1M output tokens\n"
            "output:\n"
            "  --label NAME            name of this setup in reports (default: the model)\n"
            "  --json FILE             write the results as JSON (fields in docs/bench.md)\n"
            "  --detailed              the JSON also lists every request (times, ITL gaps, tokens, errors)\n"
            "  --html FILE             write a self-contained HTML report with charts\n"
            "  --no-progress           no progress bar (it is drawn only when stderr is a terminal)\n\n"
            "example:\n"
            "  wafer bench serve --url http://127.0.0.1:8080 --concurrency 1,4,16 --num-prompts 200 \\\n"
            "      --input-len 512 --output-len 128 --ignore-eos --json wafer.json --html wafer.html\n");
}

static void bench_compare_usage(FILE *f)
{
    fprintf(f, "usage: wafer bench compare A.json B.json [--cost-a USD] [--cost-b USD]\n\n"
               "Prints two `wafer bench serve --json` results side by side for every load point they share\n"
               "(same concurrency or request rate and input length): throughput, latency percentiles,\n"
               "goodput and cost, with the ratio B/A and which side is better.\n\n"
               "  --cost-a USD   price per hour of A's server (overrides A's --cost-per-hour)\n"
               "  --cost-b USD   price per hour of B's server\n");
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* *out = the integer s of bench serve's option flag, in lo..hi; else says so on stderr and returns -1. */
static int parse_serve_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    long v;
    if (parse_long(s, lo, hi, &v)) {
        fprintf(stderr, "wafer bench serve: %s must be an integer in %ld..%ld, not '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* "1,4,8" -> ints in [lo, hi]. */
static int parse_int_list(const char *flag, const char *s, long lo, long hi, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (1) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        long v;
        if (len == 0 || len >= sizeof item || *n == SERVE_LIST_MAX) {
            fprintf(stderr, "wafer bench serve: %s: bad list '%s' (comma-separated integers, at most %d)\n", flag, s,
                    SERVE_LIST_MAX);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (parse_long(item, lo, hi, &v)) {
            fprintf(stderr, "wafer bench serve: %s: '%s' is not an integer in %ld..%ld\n", flag, item, lo, hi);
            return -1;
        }
        out[(*n)++] = (int)v;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

/* "2,8.5,inf" -> rates > 0 (INFINITY for inf). */
static int parse_rate_list(const char *s, double *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (1) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        double v;
        if (len == 0 || len >= sizeof item || *n == SERVE_LIST_MAX) {
            fprintf(stderr, "wafer bench serve: --request-rate: bad list '%s' (comma-separated rates, at most %d)\n",
                    s, SERVE_LIST_MAX);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (!strcmp(item, "inf")) {
            v = INFINITY;
        } else if (parse_double(item, &v) || !(v > 0) || v > 1e6) {
            fprintf(stderr, "wafer bench serve: --request-rate: '%s' is not a rate in requests/s above 0 (or inf)\n",
                    item);
            return -1;
        }
        out[(*n)++] = v;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

enum {
    OPT_URL = 1000, OPT_API_KEY, OPT_MODEL, OPT_ENDPOINT, OPT_CONCURRENCY, OPT_RATE, OPT_NUM_PROMPTS, OPT_INPUT_LEN,
    OPT_OUTPUT_LEN, OPT_DATASET, OPT_SEED, OPT_JSON, OPT_HTML, OPT_SLO, OPT_TIMEOUT, OPT_QUALITY, OPT_COST, OPT_LABEL,
    OPT_IGNORE_EOS, OPT_TEMPERATURE, OPT_NO_CALIBRATE, OPT_REUSE_PROMPTS, OPT_NO_PROGRESS, OPT_COST_A, OPT_COST_B, OPT_DETAILED,
    OPT_TURNS,
};

static int bench_serve_cli(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"url", required_argument, NULL, OPT_URL},
        {"api-key", required_argument, NULL, OPT_API_KEY},
        {"model", required_argument, NULL, OPT_MODEL},
        {"endpoint", required_argument, NULL, OPT_ENDPOINT},
        {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
        {"request-rate", required_argument, NULL, OPT_RATE},
        {"num-prompts", required_argument, NULL, OPT_NUM_PROMPTS},
        {"input-len", required_argument, NULL, OPT_INPUT_LEN},
        {"output-len", required_argument, NULL, OPT_OUTPUT_LEN},
        {"dataset", required_argument, NULL, OPT_DATASET},
        {"seed", required_argument, NULL, OPT_SEED},
        {"json", required_argument, NULL, OPT_JSON},
        {"html", required_argument, NULL, OPT_HTML},
        {"slo", required_argument, NULL, OPT_SLO},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"quality", required_argument, NULL, OPT_QUALITY},
        {"cost-per-hour", required_argument, NULL, OPT_COST},
        {"label", required_argument, NULL, OPT_LABEL},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"temperature", required_argument, NULL, OPT_TEMPERATURE},
        {"no-calibrate", no_argument, NULL, OPT_NO_CALIBRATE},
        {"reuse-prompts", no_argument, NULL, OPT_REUSE_PROMPTS},
        {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
        {"detailed", no_argument, NULL, OPT_DETAILED},
        {"turns", required_argument, NULL, OPT_TURNS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct serve_options o;
    memset(&o, 0, sizeof o);
    o.endpoint = SERVE_ENDPOINT_COMPLETIONS;
    o.output_len = 128;
    o.num_prompts = -1;
    o.turns = 1;
    o.timeout_s = 600;
    o.cost_per_hour = NAN;
    o.temperature = NAN;
    o.calibrate = true;
    o.progress = isatty(STDERR_FILENO);
    bool no_progress = false;
    char err[ERR_MSG_MAX];
    int c;
    double d;
    optind = 0; /* GNU: full re-initialisation */
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_URL: o.url = optarg; break;
        case OPT_API_KEY: o.api_key = optarg; break;
        case OPT_MODEL: o.model = optarg; break;
        case OPT_LABEL: o.label = optarg; break;
        case OPT_DATASET: o.dataset = optarg; break;
        case OPT_QUALITY: o.quality = optarg; break;
        case OPT_JSON: o.json_path = optarg; break;
        case OPT_HTML: o.html_path = optarg; break;
        case OPT_IGNORE_EOS: o.ignore_eos = true; break;
        case OPT_NO_CALIBRATE: o.calibrate = false; break;
        case OPT_REUSE_PROMPTS: o.reuse_prompts = true; break;
        case OPT_NO_PROGRESS: no_progress = true; break;
        case OPT_DETAILED: o.detailed = true; break;
        case OPT_ENDPOINT:
            if (!strcmp(optarg, "completions"))
                o.endpoint = SERVE_ENDPOINT_COMPLETIONS;
            else if (!strcmp(optarg, "chat"))
                o.endpoint = SERVE_ENDPOINT_CHAT;
            else {
                fprintf(stderr, "wafer bench serve: --endpoint must be completions or chat, not '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_CONCURRENCY:
            if (parse_int_list("--concurrency", optarg, 1, 100000, o.concurrency, &o.n_concurrency))
                return 2;
            break;
        case OPT_RATE:
            if (parse_rate_list(optarg, o.request_rate, &o.n_request_rate))
                return 2;
            break;
        case OPT_INPUT_LEN:
            if (parse_int_list("--input-len", optarg, 1, 1000000, o.input_len, &o.n_input_len))
                return 2;
            break;
        case OPT_NUM_PROMPTS:
            if (parse_serve_int("--num-prompts", optarg, 0, 10000000, &o.num_prompts))
                return 2;
            break;
        case OPT_TURNS:
            if (parse_serve_int("--turns", optarg, 1, 1000, &o.turns))
                return 2;
            break;
        case OPT_OUTPUT_LEN:
            if (parse_serve_int("--output-len", optarg, 1, 1000000, &o.output_len))
                return 2;
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (end == optarg || *end || errno || optarg[0] == '-') {
                fprintf(stderr, "wafer bench serve: --seed must be a non-negative integer, not '%s'\n", optarg);
                return 2;
            }
            o.seed = s;
            break;
        }
        case OPT_TIMEOUT:
            if (parse_double(optarg, &d) || !(d > 0) || d > 86400) {
                fprintf(stderr, "wafer bench serve: --timeout must be seconds in (0, 86400], not '%s'\n", optarg);
                return 2;
            }
            o.timeout_s = d;
            break;
        case OPT_COST:
            if (parse_double(optarg, &d) || d < 0) {
                fprintf(stderr, "wafer bench serve: --cost-per-hour must be a price in USD >= 0, not '%s'\n", optarg);
                return 2;
            }
            o.cost_per_hour = d;
            break;
        case OPT_TEMPERATURE:
            if (parse_double(optarg, &d) || d < 0 || d > 10) {
                fprintf(stderr, "wafer bench serve: --temperature must be a number in 0..10, not '%s'\n", optarg);
                return 2;
            }
            o.temperature = d;
            break;
        case OPT_SLO:
            if (serve_slo_parse(optarg, &o.slo, err)) {
                fprintf(stderr, "wafer bench serve: %s\n", err);
                return 2;
            }
            o.has_slo = true;
            break;
        case 'h':
            bench_serve_usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, "wafer bench serve: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "wafer bench serve: unknown option '%s' (see wafer bench serve --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "wafer bench serve: unexpected argument '%s' (see wafer bench serve --help)\n", argv[optind]);
        return 2;
    }
    if (!o.url) {
        fprintf(stderr, "wafer bench serve: --url is required, e.g. --url http://127.0.0.1:8080\n");
        return 2;
    }
    if (o.n_concurrency && o.n_request_rate) {
        fprintf(stderr, "wafer bench serve: give --concurrency or --request-rate, not both\n");
        return 2;
    }
    if (o.dataset && o.n_input_len) {
        fprintf(stderr, "wafer bench serve: --input-len sizes synthetic prompts; it does not apply to --dataset\n");
        return 2;
    }
    if (o.turns > 1 && o.n_request_rate) {
        fprintf(stderr, "wafer bench serve: --turns runs conversations in --concurrency slots (each turn waits for "
                        "the answer before it); --request-rate does not apply\n");
        return 2;
    }
    if (!o.n_concurrency && !o.n_request_rate) {
        o.concurrency[0] = 1;
        o.n_concurrency = 1;
    }
    if (!o.n_input_len) {
        o.input_len[0] = 128;
        o.n_input_len = 1;
    }
    if (no_progress)
        o.progress = false;
    return serve_bench_main(&o);
}

static int bench_compare_cli(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"cost-a", required_argument, NULL, OPT_COST_A},
        {"cost-b", required_argument, NULL, OPT_COST_B},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct bench_compare_options o = {.cost_a = NAN, .cost_b = NAN};
    int c;
    double d;
    optind = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_COST_A:
        case OPT_COST_B:
            if (parse_double(optarg, &d) || d < 0) {
                fprintf(stderr, "wafer bench compare: %s must be a price in USD per hour >= 0, not '%s'\n",
                        c == OPT_COST_A ? "--cost-a" : "--cost-b", optarg);
                return 2;
            }
            *(c == OPT_COST_A ? &o.cost_a : &o.cost_b) = d;
            break;
        case 'h':
            bench_compare_usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, "wafer bench compare: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "wafer bench compare: unknown option '%s'\n", argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "wafer bench compare: need two result files\n\n");
        bench_compare_usage(stderr);
        return 2;
    }
    o.a_path = argv[optind];
    o.b_path = argv[optind + 1];
    return bench_compare_main(&o);
}

int cmd_bench_main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "serve"))
        return bench_serve_cli(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "compare"))
        return bench_compare_cli(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "grammar"))
        return cmd_bench_grammar_main(argc - 1, argv + 1);
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        bench_usage(stdout);
        return 0;
    }
    if (argc < 2) {
        bench_usage(stderr);
        return 2;
    }
    /* `wafer bench --stream --help`, `--model --help`: the usage line above promises each tool's help, but
     * getopt would take "--help" as the option's value (a model path, a weight type) */
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            char *help[] = {argv[0], "--help", NULL};
            return bench_model_main(2, help);
        }
    return bench_model_main(argc, argv);
}
