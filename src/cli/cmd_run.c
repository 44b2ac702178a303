/*
 * wafer run: generate a continuation of a prompt through the server's own generation path. The prompt
 * becomes one scheduler request (engine/scheduler.h) on a scheduler of one slot, so sampling, penalties,
 * end of generation, detokenizing and stop strings are the very code /v1/completions runs, and a greedy run
 * prints exactly what the server answers for the same request.
 *
 * Threads: the scheduler's engine thread generates; this (main) thread waits on a condition variable that
 * the scheduler's notify callback signals, reads the request's new output only through
 * sched_req_status_get / sched_req_read, and streams it to stdout. SIGINT is blocked in every thread (before
 * any starts) and polled here: the first one cancels the request (exit 130 once it has stopped), a second
 * one exits at once.
 *
 * Only the generated text goes to stdout (and a final newline); logs and the speed summary go to stderr.
 */
#include "cli/cli.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/tokenizer/tokenizer.h"
#include "pull/pull.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RUN_MAX_STOP 16 /* as many stop strings as a server request may carry */

/* Reads FILE and compiles it (kind: a JSON Schema or GBNF) into *out. 0, or 2 after printing the error
 * (the compiler's position or the unsupported keyword). */
static int run_constraint_load(enum grammar_kind kind, const char *path, struct grammar_entry **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "wafer run: cannot open %s: %s\n", path, strerror(errno));
        return 2;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                fprintf(stderr, "wafer run: out of memory\n");
                return 2;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "wafer run: cannot read %s\n", path);
        return 2;
    }
    char err[ERR_MSG_MAX];
    int rc = grammar_cache_get(NULL, kind, 0, buf, len, out, err);
    free(buf);
    if (rc) {
        fprintf(stderr, "wafer run: %s: %s\n", path, err);
        return 2;
    }
    return 0;
}

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer run --model M.gguf --prompt TEXT [options]\n\n"
            "Generates a continuation of TEXT through the same generation code as `wafer serve` (a greedy run\n"
            "prints what /v1/completions answers for the same request). Generated text goes to stdout; logs and\n"
            "a speed summary to stderr. Ctrl-C stops the generation (exit status 130).\n\n"
            "  -m, --model PATH           GGUF model file (required); hf://OWNER/NAME:QUANT: a pulled model\n"
            "                             (downloaded first when missing, see wafer pull --help)\n"
            "  -p, --prompt TEXT          prompt text (required; BOS is added as the model's metadata says, and\n"
            "                             special-token text such as </s> is read as that token, as the server does)\n"
            "  -n, --max-tokens N         tokens to generate, at least 1 (default 128)\n"
            "      --stop S               stop before the text S; S is not printed (repeatable, up to %d)\n"
            "      --temperature T        0 = greedy, at most 2 (default 0.8)\n"
            "      --top-k K              (default 40; 0 = off)\n"
            "      --top-p P              (default 0.95; 1 = off)\n"
            "      --min-p P              (default 0.05; 0 = off)\n"
            "      --repeat-penalty R     (default 1.0 = off)\n"
            "      --frequency-penalty F  OpenAI's, in [-2, 2] (default 0 = off)\n"
            "      --presence-penalty F   OpenAI's, in [-2, 2] (default 0 = off)\n"
            "      --repeat-last-n N      tokens the penalties look back over (default 64; -1 = all)\n"
            "      --seed S               RNG seed (default: random)\n"
            "      --ignore-eos           keep generating past end-of-sequence tokens\n"
            "      --json-schema FILE     constrain the output to JSON valid under the JSON Schema in FILE\n"
            "      --grammar FILE         constrain the output to the GBNF grammar in FILE\n"
            "      --spec MODE            speculative decoding's drafts besides --prediction: off (default), ngram\n"
            "                             (lookup in the prompt and the text so far) or draft (--draft-model's\n"
            "                             greedy continuation); the output is the same\n"
            "      --draft-model FILE     a small GGUF with the same vocabulary that drafts tokens (--spec draft,\n"
            "                             implied by this option)\n"
            "      --prediction TEXT      the text expected (e.g. the file being edited), verified as drafts\n"
            "      --draft-max N          most drafted tokens verified per step, 0..%d (default 16; 0: off)\n"
            "      --draft-min N          shorter drafts are not verified (default 1)\n"
            "      --draft-fixed          verify every draft whole, whatever it costs (to measure the ceiling;\n"
            "                             default: lengths follow acceptance and the measured cost)\n"
            "  -t, --threads N            compute threads (default: all cores)\n"
            "  -c, --ctx-size N           context size (default: the model's, at most 4096)\n"
            "      --kv-type T            f16 (default), f32 or q8_0\n"
            "      --backend NAME         compute backend: cpu (default) or scalar (the plain reference)\n"
            "      --no-simd              portable kernels on the cpu backend\n"
            "      --mmap                 map the model file instead of reading it into memory\n"
            "                             (faster start, shared page cache, ~15%% slower generation)\n"
            "  -h, --help                 this help\n",
            RUN_MAX_STOP, SCHED_DRAFT_MAX);
}

/* The scheduler's notify callback signals this; the main thread waits on it between reads. */
struct run_wake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t seq; /* bumped at every notify */
};

static void run_notify(void *ctx)
{
    struct run_wake *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->seq++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* What the main thread has taken of the request's one choice. */
struct run_reader {
    size_t shown;      /* bytes of the choice's text already taken */
    char *buf;         /* the text new since the last read (not NUL-terminated) */
    size_t len, cap;
    int n_toks;
    enum sched_finish finish;
    bool oom;
};

/* sched_req_read callback: copies the new text out (the request stays locked while this runs, so no
 * writing to stdout here). */
static bool run_read_choice(void *ctx, int c, const struct sched_choice *ch)
{
    struct run_reader *rd = ctx;
    (void)c;
    rd->len = 0;
    rd->n_toks = ch->n_toks;
    rd->finish = ch->finish;
    if (ch->text_len <= rd->shown)
        return true;
    size_t n = ch->text_len - rd->shown;
    if (n > rd->cap) {
        char *nb = realloc(rd->buf, n);
        if (!nb) {
            rd->oom = true;
            return false;
        }
        rd->buf = nb;
        rd->cap = n;
    }
    memcpy(rd->buf, ch->text + rd->shown, n);
    rd->len = n;
    rd->shown = ch->text_len;
    return true;
}

/* Whether a SIGINT is pending (it is blocked in every thread, so it waits to be taken here). */
static bool run_sigint_pending(const sigset_t *set)
{
    struct timespec zero = {0, 0};
    return sigtimedwait(set, NULL, &zero) == SIGINT;
}

static const char *run_finish_name(enum sched_finish f)
{
    return f == SCHED_STOP ? "stop" : f == SCHED_LENGTH ? "length" : f == SCHED_ERROR ? "error" : "running";
}

int cmd_run_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"prompt", required_argument, 0, 'p'},
        {"max-tokens", required_argument, 0, 'n'},  {"temperature", required_argument, 0, 1},
        {"top-k", required_argument, 0, 2},         {"top-p", required_argument, 0, 3},
        {"min-p", required_argument, 0, 4},         {"repeat-penalty", required_argument, 0, 5},
        {"seed", required_argument, 0, 6},          {"threads", required_argument, 0, 't'},
        {"ctx-size", required_argument, 0, 'c'},    {"kv-type", required_argument, 0, 7},
        {"ignore-eos", no_argument, 0, 8},          {"no-simd", no_argument, 0, 9},
        {"mmap", no_argument, 0, 10},               {"stop", required_argument, 0, 11},
        {"frequency-penalty", required_argument, 0, 12}, {"presence-penalty", required_argument, 0, 13},
        {"repeat-last-n", required_argument, 0, 14}, {"backend", required_argument, 0, 15},
        {"json-schema", required_argument, 0, 16}, {"grammar", required_argument, 0, 17},
        {"spec", required_argument, 0, 18},         {"prediction", required_argument, 0, 19},
        {"draft-max", required_argument, 0, 20},    {"draft-min", required_argument, 0, 21},
        {"draft-fixed", no_argument, 0, 22},        {"draft-model", required_argument, 0, 23},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0},
    };
    const char *model_path = NULL, *prompt = NULL, *constraint_path = NULL, *prediction = NULL, *draft_model = NULL;
    bool spec_set = false; /* --spec given: --draft-model alone implies --spec draft */
    enum grammar_kind constraint_kind = 0;
    char *stop[RUN_MAX_STOP];
    int n_stop = 0;
    long max_tokens = 128, threads = 0, ctx = 0;
    bool ignore_eos = false, seeded = false, use_mmap = false;
    struct engine_opts eo;
    engine_opts_default(&eo);
    struct sched_params schp;
    sched_params_default(&schp);
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    char err[ERR_MSG_MAX];
    double d;
    long l;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': if (flags_parse_int("run", "--max-tokens", optarg, 1, 1 << 24, &max_tokens)) return 2; break;
        case 1: if (flags_parse_float("run", "--temperature", optarg, 0, 2, &d)) return 2; sp.temperature = (float)d; break;
        case 2: if (flags_parse_int("run", "--top-k", optarg, 0, 1 << 30, &l)) return 2; sp.top_k = (int)l; break;
        case 3: if (flags_parse_float("run", "--top-p", optarg, 0, 1, &d)) return 2; sp.top_p = (float)d; break;
        case 4: if (flags_parse_float("run", "--min-p", optarg, 0, 1, &d)) return 2; sp.min_p = (float)d; break;
        case 5: if (flags_parse_float("run", "--repeat-penalty", optarg, 0.01, 100, &d)) return 2; sp.repeat_penalty = (float)d; break;
        case 6: if (flags_parse_u64("run", "--seed", optarg, &sp.seed)) return 2; seeded = true; break;
        case 't': if (flags_parse_int("run", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 'c': if (flags_parse_int("run", "--ctx-size", optarg, 1, 1 << 24, &ctx)) return 2; break;
        case 7:
            if (engine_opts_set_kv_type(&eo, optarg, err)) {
                fprintf(stderr, "wafer run: --kv-type: %s\n", err);
                return 2;
            }
            break;
        case 8: ignore_eos = true; break;
        case 9: eo.no_simd = true; break;
        case 10: use_mmap = true; break;
        case 11:
            if (n_stop == RUN_MAX_STOP) {
                fprintf(stderr, "wafer run: --stop: at most %d stop strings\n", RUN_MAX_STOP);
                return 2;
            }
            if (*optarg) /* an empty stop string would stop at once; ignored, as the server does */
                stop[n_stop++] = optarg;
            break;
        case 12: if (flags_parse_float("run", "--frequency-penalty", optarg, -2, 2, &d)) return 2; sp.frequency_penalty = (float)d; break;
        case 13: if (flags_parse_float("run", "--presence-penalty", optarg, -2, 2, &d)) return 2; sp.presence_penalty = (float)d; break;
        case 14: if (flags_parse_int("run", "--repeat-last-n", optarg, -1, 1 << 20, &l)) return 2; sp.repeat_last_n = (int)l; break;
        case 15:
            if (engine_opts_set_backend(&eo, optarg, err)) {
                fprintf(stderr, "wafer run: --backend: %s\n", err);
                return 2;
            }
            break;
        case 16:
        case 17:
            if (constraint_path) {
                fprintf(stderr, "wafer run: --json-schema and --grammar: give only one\n");
                return 2;
            }
            constraint_path = optarg;
            constraint_kind = c == 16 ? GRAMMAR_KIND_SCHEMA : GRAMMAR_KIND_GBNF;
            break;
        case 18:
            if (!strcmp(optarg, "off") || !strcmp(optarg, "ngram") || !strcmp(optarg, "draft")) {
                schp.spec = !strcmp(optarg, "off") ? SCHED_SPEC_OFF
                            : !strcmp(optarg, "ngram") ? SCHED_SPEC_NGRAM : SCHED_SPEC_DRAFT;
                spec_set = true;
                break;
            }
            fprintf(stderr, "wafer run: --spec: '%s' is not a draft source (off, ngram, draft)\n", optarg);
            return 2;
        case 19: prediction = optarg; break;
        case 20: if (flags_parse_int("run", "--draft-max", optarg, 0, SCHED_DRAFT_MAX, &l)) return 2; schp.draft_max = (int)l; break;
        case 21: if (flags_parse_int("run", "--draft-min", optarg, 0, SCHED_DRAFT_MAX, &l)) return 2; schp.draft_min = (int)l; break;
        case 22: schp.draft_adaptive = false; break;
        case 23: draft_model = optarg; break;
        case 'h': run_usage(stdout); return 0;
        default: run_usage(stderr); return 2;
        }
    }
    if (!model_path || !prompt || optind != argc) {
        fprintf(stderr, "wafer run: %s\n\n", optind != argc ? "unexpected argument" : "--model and --prompt are required");
        run_usage(stderr);
        return 2;
    }
    if (schp.spec == SCHED_SPEC_DRAFT && !draft_model) {
        fprintf(stderr, "wafer run: --spec draft needs --draft-model FILE (a small GGUF with the same vocabulary)\n");
        return 2;
    }
    if (draft_model && !spec_set)
        schp.spec = SCHED_SPEC_DRAFT;
    if (!seeded)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    if (sampler_params_validate(&sp, err)) {
        fprintf(stderr, "wafer run: %s\n", err);
        return 2;
    }

    char *model_file; /* model_path, or the local file of an hf:// model (pulled when missing) */
    if (pull_resolve_model(model_path, &model_file, err)) {
        fprintf(stderr, "wafer run: %s\n", err);
        return 1;
    }
    int rc = 1;
    struct engine *e = NULL, *de = NULL; /* de: the draft model's */
    struct model *dm = NULL;
    /* the constraint is compiled before the model loads, so a bad schema fails at once */
    struct grammar_entry *constraint = NULL;
    if (constraint_path && run_constraint_load(constraint_kind, constraint_path, &constraint))
        return 2;
    struct scheduler *s = NULL;
    struct sched_req *r = NULL;
    int32_t *toks = NULL, *pred = NULL;
    struct run_reader rd = {0};
    struct run_wake wake = {.seq = 0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&wake.mu, NULL);
    pthread_cond_init(&wake.cv, &ca);
    pthread_condattr_destroy(&ca);

    double t_load = clock_now_s();
    struct model *m = engine_model_load(model_file, use_mmap, &eo, err);
    if (!m) {
        fprintf(stderr, "wafer run: %s\n", err);
        goto out;
    }
    /* SIGINT is taken by this thread alone, synchronously: block it before the compute and engine threads
     * start (they inherit the mask) */
    sigset_t sigint;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigint, NULL);

    const struct model_hparams *hp = &m->hp;
    eo.n_threads = (int)threads;
    eo.n_ctx = (int)ctx;
    eo.n_ctx_cap = 4096;
    struct engine_params ep;
    if (engine_params_for_model(m, &eo, &ep, err) || !(e = engine_create(m, &ep, err))) {
        fprintf(stderr, "wafer run: %s\n", err);
        goto out;
    }
    int n_ctx = engine_params_get(e)->n_ctx;
    log_info("loaded %s: %s, %d layers, dim %d, %s weights, %d threads, ctx %d, backend %s, in %.0f ms", m->name,
             hp->arch, hp->n_layers, hp->dim, dtype_name(m->main_type), engine_params_get(e)->n_threads, n_ctx,
             eo.backend ? eo.backend : "cpu", (clock_now_s() - t_load) * 1e3);
    if (draft_model && schp.spec == SCHED_SPEC_DRAFT) {
        if (!(de = engine_create_draft(draft_model, use_mmap, e, &eo, &dm, err))) {
            fprintf(stderr, "wafer run: %s\n", err);
            goto out;
        }
        schp.draft_engine = de;
        log_info("draft model %s (%s): %s, %d layers, dim %d, %s weights", dm->name, draft_model, dm->hp.arch,
                 dm->hp.n_layers, dm->hp.dim, dtype_name(dm->main_type));
    }

    int n_prompt = tokenizer_encode_alloc(m->tok, prompt, strlen(prompt), true, true, &toks);
    if (n_prompt < 0) {
        fprintf(stderr, "wafer run: cannot tokenize the prompt: %s\n", err_name(n_prompt));
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "wafer run: the prompt is empty after tokenization and the model adds no BOS token\n");
        goto out;
    }
    if (n_prompt + max_tokens > n_ctx) {
        fprintf(stderr, "wafer run: prompt (%d tokens) + --max-tokens (%ld) exceeds the context size %d; "
                        "lower --max-tokens or raise --ctx-size\n", n_prompt, max_tokens, n_ctx);
        goto out;
    }

    int n_pred = 0;
    if (prediction && (n_pred = tokenizer_encode_alloc(m->tok, prediction, strlen(prediction), false, false, &pred)) < 0) {
        fprintf(stderr, "wafer run: cannot tokenize the prediction: %s\n", err_name(n_pred));
        goto out;
    }

    /* one slot, prompts in chunks of the engine's whole batch, no prefix cache (nothing to share) */
    schp.max_batch_size = 1;
    schp.max_queue = 1;
    schp.prefill_chunk = engine_params_get(e)->max_batch_tokens - 1;
    schp.prefix_cache = false;
    s = scheduler_create(e, m->tok, &schp, NULL, run_notify, &wake, err);
    if (!s) {
        fprintf(stderr, "wafer run: %s\n", err);
        goto out;
    }
    if (scheduler_start(s)) {
        fprintf(stderr, "wafer run: cannot start the engine thread\n");
        goto out;
    }
    r = sched_req_create(toks, n_prompt, 1);
    if (!r || sched_req_set_stop(r, stop, n_stop) || sched_req_set_prediction(r, pred, n_pred))
        goto oom;
    r->id = 1;
    r->max_tokens = (int)max_tokens;
    r->sp = sp;
    r->ignore_eos = ignore_eos;
    r->constraint = constraint; /* the request owns it from here */
    constraint = NULL;
    r->t_arrival = clock_now_ns();
    int src = scheduler_submit(s, r);
    if (src) {
        fprintf(stderr, "wafer run: cannot submit the request: %s\n", err_name(src));
        goto out;
    }

    /* stream: snapshot the wake counter, take what is new, wait for the next notify (or 50 ms, to see a
     * Ctrl-C); the status is read before the text, so once it says finished the text read after is whole */
    struct sched_req_status st;
    bool interrupted = false;
    for (;;) {
        pthread_mutex_lock(&wake.mu);
        uint64_t seen = wake.seq;
        pthread_mutex_unlock(&wake.mu);
        sched_req_status_get(r, &st);
        if (!sched_req_read(r, run_read_choice, &rd) && rd.oom) {
            scheduler_cancel(s, r, ERR_CANCELLED);
            goto oom;
        }
        if (rd.len) {
            fwrite(rd.buf, 1, rd.len, stdout);
            fflush(stdout);
        }
        if (st.finished)
            break;
        if (run_sigint_pending(&sigint)) {
            if (interrupted) { /* a second Ctrl-C: do not wait for the engine */
                fputc('\n', stdout);
                fflush(stdout);
                _exit(130);
            }
            interrupted = true;
            scheduler_cancel(s, r, ERR_CANCELLED);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&wake.mu);
        if (wake.seq == seen)
            pthread_cond_timedwait(&wake.cv, &wake.mu, &ts);
        pthread_mutex_unlock(&wake.mu);
    }
    fputc('\n', stdout);
    fflush(stdout);
    if (st.error) {
        if (st.error == ERR_CANCELLED && interrupted) {
            fprintf(stderr, "wafer run: interrupted after %d tokens\n", rd.n_toks);
            rc = 130;
        } else {
            fprintf(stderr, "wafer run: %s\n", st.errmsg);
        }
        goto out;
    }
    /* prompt: admission to the first token (prefill and one sample); generation: the tokens after the
     * first, over the time after it */
    double t_prompt = (double)(st.t_first_token - st.t_admitted) / 1e9;
    double t_gen = (double)(st.t_finished - st.t_first_token) / 1e9;
    int n_gen = rd.n_toks;
    int n_after = n_gen > 1 ? n_gen - 1 : 0;
    fprintf(stderr, "prompt: %d tokens in %.1f ms (%.1f tok/s) | generated: %d tokens, %d after the first in %.1f ms "
                    "(%.1f tok/s) | finish: %s",
            n_prompt, t_prompt * 1e3, t_prompt > 0 ? n_prompt / t_prompt : 0.0, n_gen, n_after, t_gen * 1e3,
            t_gen > 0 ? n_after / t_gen : 0.0, run_finish_name(rd.finish));
    if (st.draft_tokens)
        fprintf(stderr, " | drafted: %d tokens, %d accepted (%.0f%%)", st.draft_tokens, st.accepted_tokens,
                100.0 * st.accepted_tokens / st.draft_tokens);
    fputc('\n', stderr);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, "wafer run: out of memory\n");
out:
    grammar_entry_unref(constraint);
    sched_req_unref(r);
    scheduler_destroy(s);
    free(rd.buf);
    free(toks);
    free(pred);
    engine_destroy(e);
    model_destroy(m);
    engine_destroy(de);
    model_destroy(dm);
    free(model_file);
    pthread_cond_destroy(&wake.cv);
    pthread_mutex_destroy(&wake.mu);
    return rc;
}
