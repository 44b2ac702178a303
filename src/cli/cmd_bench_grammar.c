/*
 * wafer bench grammar: per-token mask cost of constrained decoding. For each workload (built-in JSON schemas,
 * json_object mode and GBNF grammars, or the user's --schema / --gbnf files) it compiles the grammar once
 * and drives a matcher over the model's vocabulary with random valid continuations: uniform over the mask for
 * --free tokens, then the end token when allowed, else a random single-byte closing token (so runs finish),
 * at most --tokens per run. Every grammar_matcher_mask call is timed. Reported per workload: compile time,
 * the first matcher's setup (the per-vocabulary state classes of the shared cache), DFA states, the mask time
 * p50/p99/mean over all calls, over warm calls (served from the cache) and over cold ones (that had to
 * compute a cache entry: the one-time cost per grammar state), and for schemas how many outputs validate.
 * --emit writes every output as a JSON line, for checking with other validators (tests/e2e).
 */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/flags.h"

#include "core/err.h"
#include "core/json_writer.h"
#include "core/stats.h"
#include "core/sysinfo.h"
#include "engine/gguf/gguf.h"
#include "engine/grammar/grammar.h"
#include "engine/tokenizer/tokenizer.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BG_MAX_WORKLOADS 32

struct bg_workload {
    const char *name;
    const char *text; /* schema JSON or GBNF */
    enum { BG_SCHEMA, BG_JSON_OBJECT, BG_GBNF } kind;
    unsigned flags;
    char *owned; /* text read from a file */
};

static const struct bg_workload bg_builtin[] = {
    {"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\","
               "\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{\"type\":"
               "\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5}},\"required\":[\"name\",\"age\"]}",
     BG_SCHEMA, 0, NULL},
    {"tool-call", "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"city\"},"
                  "\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,"
                  "\"maximum\":14}},\"required\":[\"location\",\"unit\",\"days\"],\"additionalProperties\":false}",
     BG_SCHEMA, GRAMMAR_SCHEMA_STRICT, NULL},
    {"nested", "{\"type\":\"object\",\"properties\":{\"order\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":"
               "\"string\",\"format\":\"uuid\"},\"created\":{\"type\":\"string\",\"format\":\"date-time\"},\"items\":"
               "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\","
               "\"pattern\":\"^[A-Z]{3}-[0-9]{4}$\"},\"qty\":{\"type\":\"integer\",\"minimum\":1},\"price\":{\"type\":"
               "\"number\"}},\"required\":[\"sku\",\"qty\",\"price\"]},\"minItems\":1,\"maxItems\":4},\"note\":{\"type\":"
               "[\"string\",\"null\"]}},\"required\":[\"id\",\"created\",\"items\",\"note\"]}},\"required\":[\"order\"]}",
     BG_SCHEMA, 0, NULL},
    {"recursive", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"children\":"
                  "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},\"required\":[\"name\"],"
                  "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     BG_SCHEMA, 0, NULL},
    {"enum-anyof", "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"enum\":[\"red\",\"green\",\"blue\"]},{\"type\":"
                   "\"integer\",\"minimum\":-100,\"maximum\":100},{\"type\":\"null\"}]},\"maxItems\":8}",
     BG_SCHEMA, GRAMMAR_SCHEMA_COMPACT, NULL},
    {"json_object", NULL, BG_JSON_OBJECT, 0, NULL},
    {"gbnf-json", "root   ::= object\n"
                  "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
                  "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
                  "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
                  "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* "
                  "\"\\\"\" ws\n"
                  "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
                  "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
     BG_GBNF, 0, NULL},
    {"gbnf-arith", "root  ::= (expr \"=\" ws term \"\\n\")+\n"
                   "expr  ::= term ([-+*/] term)*\n"
                   "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
                   "ident ::= [a-z] [a-z0-9_]* ws\n"
                   "num   ::= [0-9]+ ws\n"
                   "ws    ::= [ \\t\\n]*\n",
     BG_GBNF, 0, NULL},
};

struct bg_opts {
    const char *model, *emit;
    long runs, tokens, free_tokens;
    uint64_t seed;
    bool json;
};

struct bg_result {
    const char *name;
    size_t states;
    double compile_ms, setup_ms;
    long tokens, runs, finished, valid, validated;
    struct stats_summary all, warm, cold;
};

static void bg_usage(FILE *f)
{
    fprintf(f, "usage: wafer bench grammar --model M [options]\n\n"
               "Measures the per-token mask cost of constrained decoding on M's vocabulary (a vocab-only GGUF is\n"
               "enough): built-in JSON schemas, json_object mode and GBNF grammars, driven with random valid\n"
               "continuations.\n\n"
               "  --model M        GGUF model or vocab file (e.g. ../shared/tokenizer/ggml-vocab-llama-spm.gguf)\n"
               "  --runs N         generations per workload (default 5; the first one fills the mask cache)\n"
               "  --tokens N       most tokens per generation (default 256)\n"
               "  --free N         tokens drawn uniformly from the mask before steering to the end (default 64)\n"
               "  --seed N         random seed (default 1)\n"
               "  --schema FILE    benchmark this JSON schema instead of the built-ins (repeatable)\n"
               "  --gbnf FILE      benchmark this GBNF grammar instead of the built-ins (repeatable)\n"
               "  --strict         compile --schema files with OpenAI strict semantics\n"
               "  --emit FILE      write every output as a JSON line {workload, kind, schema, output, finished}\n"
               "  --json           print the results as JSON\n"
               "  -h, --help       show this help\n");
}

static char *bg_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 14, n = 0;
    char *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
            } else {
                b = nb;
            }
        }
    }
    fclose(f);
    if (b)
        b[n] = 0;
    return b;
}

static uint64_t bg_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int bg_compile(const struct bg_workload *w, struct grammar **g, char *err)
{
    switch (w->kind) {
    case BG_SCHEMA: return grammar_compile_schema(w->text, strlen(w->text), w->flags, g, err);
    case BG_JSON_OBJECT: return grammar_compile_json_object(w->flags, g, err);
    default: return grammar_compile_gbnf(w->text, strlen(w->text), g, err);
    }
}

static void bg_emit(FILE *f, const struct bg_workload *w, const char *out, size_t n, bool finished)
{
    struct json_writer jw;
    json_writer_init_file(&jw, f, 0);
    json_writer_object_begin(&jw);
    json_writer_key_string(&jw, "workload", w->name);
    json_writer_key_string(&jw, "kind", w->kind == BG_GBNF ? "gbnf" : w->kind == BG_SCHEMA ? "schema" : "json_object");
    json_writer_key_string(&jw, "schema", w->kind == BG_SCHEMA ? w->text : w->kind == BG_JSON_OBJECT ? "{\"type\":\"object\"}" : NULL);
    json_writer_key(&jw, "output");
    json_writer_string_n(&jw, out, n);
    json_writer_key_bool(&jw, "finished", finished);
    json_writer_object_end(&jw);
    json_writer_finish(&jw);
    fputc('\n', f);
}

static int bg_run(const struct bg_opts *o, const struct bg_workload *w, const struct token_trie *t, FILE *emit,
                  struct bg_result *res)
{
    char err[ERR_MSG_MAX];
    struct grammar *g;
    memset(res, 0, sizeof *res);
    res->name = w->name;
    double t0 = clock_now_s();
    if (bg_compile(w, &g, err)) {
        fprintf(stderr, "wafer bench grammar: %s: %s\n", w->name, err);
        return 1;
    }
    res->compile_ms = (clock_now_s() - t0) * 1e3;
    res->states = grammar_n_states(g);
    int nv = token_trie_n_vocab(t);
    size_t nw = ((size_t)nv + 31) / 32;
    uint32_t *bits = malloc(nw * sizeof *bits);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed), *closers = malloc((size_t)nv * sizeof *closers);
    size_t max_masks = (size_t)(o->runs * o->tokens + o->runs);
    double *all = malloc(max_masks * sizeof *all), *warm = malloc(max_masks * sizeof *warm);
    double *cold = malloc(max_masks * sizeof *cold);
    size_t cap = 1 << 12;
    char *out = malloc(cap);
    t0 = clock_now_s();
    struct grammar_matcher *m = grammar_matcher_create(g, t, err);
    res->setup_ms = (clock_now_s() - t0) * 1e3;
    uint64_t seed = o->seed;
    size_t n_all = 0, n_warm = 0, n_cold = 0;
    int rc = 0;
    if (!bits || !allowed || !closers || !all || !warm || !cold || !out || !m) {
        fprintf(stderr, "wafer bench grammar: out of memory\n");
        rc = 1;
        goto done;
    }
    for (long run = 0; run < o->runs; run++) {
        grammar_matcher_reset(m);
        size_t len = 0;
        bool finished = false;
        for (long step = 0; step < o->tokens; step++) {
            size_t misses = grammar_matcher_cache_misses(m);
            double a = clock_now_s();
            int mrc = grammar_matcher_mask(m, bits);
            double us = (clock_now_s() - a) * 1e6;
            all[n_all++] = us;
            if (grammar_matcher_cache_misses(m) != misses)
                cold[n_cold++] = us;
            else
                warm[n_warm++] = us;
            if (mrc) {
                fprintf(stderr, "wafer bench grammar: %s: mask failed (%s)\n", w->name, err_name(mrc));
                rc = 1;
                goto done;
            }
            int n = 0, nc = 0;
            int32_t eos = -1;
            for (size_t k = 0; k < nw; k++) {
                for (uint32_t b = bits[k]; b; b &= b - 1) {
                    int32_t id = (int32_t)(k * 32 + (size_t)__builtin_ctz(b));
                    allowed[n++] = id;
                    uint32_t l;
                    const char *p = token_trie_piece(t, id, &l);
                    if (token_trie_is_eog(t, id))
                        eos = id;
                    else if (l == 1 && strchr("\"]}0123456789eflnrstu\n", p[0]))
                        closers[nc++] = id;
                }
            }
            if (!n)
                break; /* cannot happen for a compiled grammar: every prefix can be completed */
            int32_t tok = step < o->free_tokens ? allowed[bg_rand(&seed) % (uint64_t)n]
                          : eos >= 0            ? eos
                          : nc                  ? closers[bg_rand(&seed) % (uint64_t)nc]
                                                : allowed[bg_rand(&seed) % (uint64_t)n];
            if (grammar_matcher_accept(m, tok)) {
                fprintf(stderr, "wafer bench grammar: %s: a masked token was refused (a bug)\n", w->name);
                rc = 1;
                goto done;
            }
            res->tokens++;
            if (token_trie_is_eog(t, tok)) {
                finished = true;
                break;
            }
            uint32_t l;
            const char *p = token_trie_piece(t, tok, &l);
            if (len + l + 1 > cap) {
                char *no = realloc(out, cap = 2 * (len + l + 1));
                if (!no) {
                    rc = 1;
                    goto done;
                }
                out = no;
            }
            memcpy(out + len, p, l);
            len += l;
        }
        res->runs++;
        res->finished += finished;
        if (finished && w->kind != BG_GBNF) {
            const char *schema = w->kind == BG_SCHEMA ? w->text : "{\"type\":\"object\"}";
            res->validated++;
            res->valid += json_schema_validate(schema, strlen(schema), out, len, err) == 0;
        }
        if (emit)
            bg_emit(emit, w, out, len, finished);
    }
    stats_summarize(all, n_all, &res->all);
    stats_summarize(warm, n_warm, &res->warm);
    stats_summarize(cold, n_cold, &res->cold);
done:
    grammar_matcher_destroy(m);
    grammar_destroy(g);
    free(bits);
    free(allowed);
    free(closers);
    free(all);
    free(warm);
    free(cold);
    free(out);
    return rc;
}

int cmd_bench_grammar_main(int argc, char **argv)
{
    struct bg_opts o = {.runs = 5, .tokens = 256, .free_tokens = 64, .seed = 1};
    struct bg_workload user[BG_MAX_WORKLOADS];
    size_t n_user = 0;
    bool strict = false;
    int rc = 2;
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"runs", required_argument, 0, 'r'},
        {"tokens", required_argument, 0, 'n'}, {"free", required_argument, 0, 'f'},
        {"seed", required_argument, 0, 's'},  {"schema", required_argument, 0, 'S'},
        {"gbnf", required_argument, 0, 'G'},  {"strict", no_argument, 0, 'T'},
        {"emit", required_argument, 0, 'e'},  {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'r':
            if (flags_parse_int("bench grammar", "--runs", optarg, 1, 100000, &o.runs))
                goto out;
            break;
        case 'n':
            if (flags_parse_int("bench grammar", "--tokens", optarg, 1, 1000000, &o.tokens))
                goto out;
            break;
        case 'f':
            if (flags_parse_int("bench grammar", "--free", optarg, 0, 1000000, &o.free_tokens))
                goto out;
            break;
        case 's':
            if (flags_parse_u64("bench grammar", "--seed", optarg, &o.seed))
                goto out;
            break;
        case 'S':
        case 'G': {
            if (n_user == BG_MAX_WORKLOADS) {
                fprintf(stderr, "wafer bench grammar: at most %d --schema/--gbnf files\n", BG_MAX_WORKLOADS);
                goto out;
            }
            char *text = bg_read(optarg);
            if (!text) {
                fprintf(stderr, "wafer bench grammar: cannot read '%s'\n", optarg);
                rc = 1;
                goto out;
            }
            user[n_user++] = (struct bg_workload){optarg, text, c == 'S' ? BG_SCHEMA : BG_GBNF, 0, text};
            break;
        }
        case 'T': strict = true; break;
        case 'e': o.emit = optarg; break;
        case 'j': o.json = true; break;
        case 'h':
            bg_usage(stdout);
            rc = 0;
            goto out;
        case ':':
            fprintf(stderr, "wafer bench grammar: %s needs a value\n", argv[optind - 1]);
            goto out;
        default:
            fprintf(stderr, "wafer bench grammar: unknown option '%s'\n", argv[optind - 1]);
            goto out;
        }
    }
    if (!o.model || optind < argc) {
        fprintf(stderr, o.model ? "wafer bench grammar: unexpected argument '%s'\n\n" : "wafer bench grammar: --model is required\n\n",
                optind < argc ? argv[optind] : "");
        bg_usage(stderr);
        goto out;
    }
    for (size_t i = 0; i < n_user; i++)
        if (strict && user[i].kind == BG_SCHEMA)
            user[i].flags |= GRAMMAR_SCHEMA_STRICT;
    rc = 1;
    char err[ERR_MSG_MAX];
    struct gguf *gg = gguf_open(o.model, err);
    if (!gg) {
        fprintf(stderr, "wafer bench grammar: %s\n", err);
        goto out;
    }
    struct tokenizer *tok = tokenizer_create(gg, err);
    gguf_close(gg);
    if (!tok) {
        fprintf(stderr, "wafer bench grammar: %s\n", err);
        goto out;
    }
    double t0 = clock_now_s();
    struct token_trie *t = token_trie_create(tok, err);
    double trie_ms = (clock_now_s() - t0) * 1e3;
    tokenizer_destroy(tok);
    if (!t) {
        fprintf(stderr, "wafer bench grammar: %s\n", err);
        goto out;
    }
    FILE *emit = NULL;
    if (o.emit && !(emit = fopen(o.emit, "w"))) {
        fprintf(stderr, "wafer bench grammar: cannot write '%s'\n", o.emit);
        token_trie_destroy(t);
        goto out;
    }
    const struct bg_workload *ws = n_user ? user : bg_builtin;
    size_t n_ws = n_user ? n_user : sizeof bg_builtin / sizeof bg_builtin[0];
    struct bg_result res[BG_MAX_WORKLOADS];
    char cpu[256];
    sysinfo_cpu_name(cpu, sizeof cpu);
    if (!o.json) {
        printf("wafer bench grammar: %s, %d tokens (trie built in %.0f ms), %ld runs of at most %ld tokens, seed %llu\n"
               "CPU: %s\n\n", o.model, token_trie_n_vocab(t), trie_ms, o.runs, o.tokens, (unsigned long long)o.seed, cpu);
        printf("mask times in microseconds; warm: served from the grammar's cache; cold: computed a cache entry\n");
        printf("%-12s %6s %8s %8s %6s | %-23s | %-15s | %-22s | %s\n", "workload", "states", "compile", "setup",
               "tokens", "all p50 / p99 / mean", "warm p50 / p99", "cold n / p50 / max", "valid");
    }
    rc = 0;
    size_t done = 0;
    for (size_t i = 0; i < n_ws; i++, done++) {
        if (bg_run(&o, &ws[i], t, emit, &res[i])) {
            rc = 1;
            break;
        }
        if (!o.json) {
            char valid[32] = "-";
            if (res[i].validated)
                snprintf(valid, sizeof valid, "%ld/%ld", res[i].valid, res[i].validated);
            printf("%-12s %6zu %5.1f ms %5.1f ms %6ld | %5.1f / %6.1f / %6.1f | %5.1f / %6.1f | %4zu / %6.1f / %6.1f | %s\n",
                   res[i].name, res[i].states, res[i].compile_ms, res[i].setup_ms, res[i].tokens, res[i].all.p50,
                   res[i].all.p99, res[i].all.mean, res[i].warm.p50, res[i].warm.p99, res[i].cold.n, res[i].cold.p50,
                   res[i].cold.max, valid);
            fflush(stdout);
        }
        if (res[i].validated && res[i].valid != res[i].validated) {
            fprintf(stderr, "wafer bench grammar: %s: an output does not validate (a bug)\n", res[i].name);
            rc = 1;
        }
    }
    if (o.json) {
        struct json_writer jw;
        json_writer_init_file(&jw, stdout, 2);
        json_writer_object_begin(&jw);
        json_writer_key_string(&jw, "model", o.model);
        json_writer_key_string(&jw, "cpu", cpu);
        json_writer_key_int(&jw, "n_vocab", token_trie_n_vocab(t));
        json_writer_key_int(&jw, "runs", o.runs);
        json_writer_key_int(&jw, "max_tokens", o.tokens);
        json_writer_key_int(&jw, "seed", (long long)o.seed);
        json_writer_key(&jw, "workloads");
        json_writer_array_begin(&jw);
        for (size_t i = 0; i < done; i++) {
            json_writer_object_begin(&jw);
            json_writer_key_string(&jw, "name", res[i].name);
            json_writer_key_int(&jw, "states", (long long)res[i].states);
            json_writer_key_double(&jw, "compile_ms", res[i].compile_ms);
            json_writer_key_double(&jw, "setup_ms", res[i].setup_ms);
            json_writer_key_int(&jw, "tokens", res[i].tokens);
            json_writer_key_double(&jw, "mask_us_p50", res[i].all.p50);
            json_writer_key_double(&jw, "mask_us_p99", res[i].all.p99);
            json_writer_key_double(&jw, "mask_us_mean", res[i].all.mean);
            json_writer_key_double(&jw, "warm_us_p50", res[i].warm.p50);
            json_writer_key_double(&jw, "warm_us_p99", res[i].warm.p99);
            json_writer_key_int(&jw, "cold_masks", (long long)res[i].cold.n);
            json_writer_key_double(&jw, "cold_us_p50", res[i].cold.p50);
            json_writer_key_double(&jw, "cold_us_max", res[i].cold.max);
            json_writer_key_int(&jw, "finished", res[i].finished);
            json_writer_key_int(&jw, "validated", res[i].validated);
            json_writer_key_int(&jw, "valid", res[i].valid);
            json_writer_object_end(&jw);
        }
        json_writer_array_end(&jw);
        json_writer_object_end(&jw);
        json_writer_finish(&jw);
        printf("\n");
    }
    if (emit)
        fclose(emit);
    token_trie_destroy(t);
out:
    for (size_t i = 0; i < n_user; i++)
        free(user[i].owned);
    return rc;
}
