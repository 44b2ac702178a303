/*
 * bench_model: `wafer bench --model M`, the engine benchmark, measured the way llama-bench measures so the
 * two can be put side by side:
 *   ppN  one sequence, N prompt tokens (random ids, BOS first) evaluated from an empty cache in forward
 *        passes of up to --ubatch tokens (default 256, the server's prefill chunk), logits of the last one
 *        only; tokens/s = N / time.
 *   tgN  one sequence, N tokens decoded one per forward pass from an empty cache (the cache is cleared
 *        before each repetition), logits every step; tokens/s = N / time.
 *   tgN xB  B sequences decoded together, one token each per forward pass; aggregate tokens/s = B*N / time.
 *   @ dD    (--depth D) ppN and tgN measured after D tokens already in the sequence's cache, as llama-bench's
 *        -d: the D tokens are evaluated once, untimed, and each repetition truncates back to them, so the
 *        figure is the cost of attending over a long context. The batched test runs from empty caches.
 *   verify  (--verify K) the cost of a speculative decoding verify pass: one sequence with 32 tokens of
 *        context evaluates 1 + k tokens in one pass (logits for each), k = 0..K, sizes interleaved within
 *        each repetition; the cost relative to one token is the median over repetitions of the ratio, and
 *        (1 + k) / cost is the ceiling of speculation with k drafted tokens all accepted.
 *   spec  (--spec SRC) speculative decoding end to end through the scheduler instead of pp/tg (bench_spec.h):
 *        greedy answers of N tokens with and without speculation, interleaved, checked equal; the median of
 *        the rounds' decode-speed ratios.
 * Each test runs once untimed first (warm-up: pages the weights in, wakes the threads), then --repeat times;
 * the report gives mean and sample standard deviation.
 *
 * Decode reads every weight matrix once per forward pass, so generation speed is also given as GB/s of
 * weights read (model weight_bytes x tokens/s) and as a share of the machine's read bandwidth, which is
 * measured in the same run by the membw probe: once before the model is loaded, and beside generation (a
 * probe before the first repetition and after each, each repetition set against the mean of the two around
 * it; the median of those shares is tg_beside_pct), because on a shared machine the bandwidth moves by 2x
 * within a minute. The probe lives in a child process (bench_probe), so its 1 GiB buffer never shows in this
 * process's peak RSS.
 *
 * `wafer bench --membw` runs only the probe; `wafer bench --stream TYPE` measures the decode kernels alone
 * against a plain read (gemv_stream.h).
 */
#include "bench/bench_model.h"

#include "bench/bench_spec.h"
#include "bench/bench_tune.h"
#include "bench/gemv_stream.h"
#include "bench/membw.h"
#include "core/flags.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/stats.h"
#include "core/sysinfo.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/engine_setup.h"
#include "engine/tokenizer/tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static void bench_model_usage(FILE *f)
{
    fprintf(f,
            "usage: wafer bench --model M.gguf [options]\n"
            "       wafer bench --membw [--threads N] [--membw-mib MIB] [--json]\n"
            "       wafer bench --stream TYPE [--batch B] [--threads N] [--repeat R] [--json]\n"
            "       wafer bench --tune [--threads N] [--repeat R] [--tune-file PATH | --no-save] [--json]\n\n"
            "Measures the engine on a GGUF model as llama-bench does: prompt processing (ppN: N tokens in\n"
            "one sequence) and generation (tgN: N tokens decoded one at a time), in tokens/s, mean +- stddev\n"
            "over repetitions after one warm-up run. Generation is also given as GB/s of weights read and as a\n"
            "share of this machine's read bandwidth, measured in the same run: before the model is loaded, and\n"
            "beside generation (each repetition against probes taken just before and after it, which counts on a\n"
            "machine whose bandwidth moves from minute to minute). --membw alone measures only the bandwidth.\n\n"
            "  -m, --model PATH      GGUF model file\n"
            "  -p, --n-prompt N      prompt tokens for ppN (default 512; 0 skips it)\n"
            "  -n, --n-gen N         generated tokens for tgN (default 128; 0 skips it)\n"
            "  -d, --depth D         measure ppN and tgN after D tokens already in the cache (llama-bench's\n"
            "                        -d: long-context cost; default 0)\n"
            "  -t, --threads N       compute threads (default: all cores)\n"
            "  -b, --batch B         also decode B sequences together and report aggregate tokens/s\n"
            "                        (default 1: no batched test)\n"
            "  -r, --repeat R        timed repetitions of each test (default 5)\n"
            "  -u, --ubatch U        prompt tokens per forward pass (default 256, as serve's prefill_chunk;\n"
            "                        the engine's buffers grow by ~170 KB per token of U for a 1B model)\n"
            "      --kv-type T       f16 (default), f32 or q8_0\n"
            "      --backend NAME    compute backend: cpu (default) or scalar (the plain reference)\n"
            "      --no-simd         portable scalar kernels\n"
            "      --mmap            map the file instead of reading it into memory (faster start, slower decode)\n"
            "      --no-membw        skip the bandwidth probe (no GB/s share in the report, no core round trip)\n"
            "      --membw           measure only the read bandwidth and the cores' round trip (a cache line\n"
            "                        between the first two CPUs and back: on an AMD EPYC it tells one CCD from two)\n"
            "      --membw-mib MIB   probe buffer size (default 1024; keep it far above the L3 cache)\n"
            "      --stream TYPE     instead of a model: the decode kernels for TYPE (f16, q8_0, q4_0, q4_k,\n"
            "                        q6_k) over a 1B model's matrices (dim 2048, FFN 8192, 16 layers) from\n"
            "                        memory, as decode runs them, alternated pass by pass with a plain read of\n"
            "                        the same bytes; reports both GB/s and the kernels' share of the read\n"
            "                        (-r passes of each, default 20); with --batch B the gemm batched\n"
            "                        decode runs on B columns instead, also as multiply-adds per second;\n"
            "                        and the same arithmetic on weights that stay in L2, so that\n"
            "                        kernels from memory / from cache says what the read costs them\n"
            "      --tune            instead of a model: measure how each decode kernel should ask for its\n"
            "                        weights on this CPU (prefetch every line, with prefetchnta, or sparsely;\n"
            "                        Q4_K and Q6_K also spread over their kernels, Q4_0, Q8_0 and Q4_K as\n"
            "                        two streams; F16 as 4 streams prefetched into L1, with prefetchnta or not\n"
            "                        at all, or as 4 adjacent rows; the 1B model's matrices from memory,\n"
            "                        -r rounds, default 10; under a minute) and save what read fastest\n"
            "                        to the tune file, which every later wafer process on the same CPU\n"
            "                        applies (results are the same bits under every rule; only the speed\n"
            "                        changes)\n"
            "      --tune-file PATH  where --tune saves (default $WAFER_TUNE_FILE, else\n"
            "                        $XDG_CACHE_HOME/wafer/tune.json, else ~/.cache/wafer/tune.json)\n"
            "      --tune-types L    --tune only these types (comma-separated: q4_0,q8_0,q4_k,q6_k,f16)\n"
            "      --no-save         --tune: print the table, write no file\n"
            "      --verify K        also time verify passes of 1 + k tokens, k = 0..K (speculative decoding's\n"
            "                        cost relative to one token; 0 = skip, the default)\n"
            "      --spec SRC        instead of pp/tg: speculative decoding end to end, greedy answers of -n\n"
            "                        tokens with and without speculation, interleaved, -r rounds, each answer\n"
            "                        checked equal; SRC: exact, half, wrong (predictions built from the model's\n"
            "                        own answer), ngram, or draft (--draft-model)\n"
            "      --draft-model F   the draft model for --spec draft (a small GGUF with the same vocabulary)\n"
            "      --draft-fixed     --spec: verify every draft whole (the ceiling; default: adaptive lengths)\n"
            "      --json            print one JSON object as the last line of stdout\n"
            "  -h, --help            this help\n\n"
            "example: wafer bench -m llama-1b-q4_0.gguf -p 512 -n 128 -t 2 -r 3 --batch 8\n");
}

struct bench_opts {
    const char *model_path;
    long n_prompt, n_gen, threads, batch, repeat, membw_mib, ubatch, verify, depth;
    bool json, no_membw, membw_only, use_mmap, draft_fixed, repeat_set;
    const char *spec, *draft_model; /* --spec SRC, --draft-model FILE */
    const char *stream;             /* --stream TYPE */
    bool tune, no_save;             /* --tune, --no-save */
    const char *tune_file, *tune_types; /* --tune-file PATH, --tune-types LIST */
    struct engine_opts eo; /* --kv-type, --no-simd, --backend */
};

/* mean and sample standard deviation of a tokens/s series */
struct bench_stat {
    double mean, sd;
    bool valid;
};

static struct bench_stat bench_stat_of(const double *v, int n)
{
    struct bench_stat s = {0, 0, n > 0};
    for (int i = 0; i < n; i++)
        s.mean += v[i];
    if (n > 0)
        s.mean /= n;
    for (int i = 0; i < n; i++)
        s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(s.sd / (n - 1)) : 0;
    return s;
}

/* The bandwidth probe runs in a child process, forked before the model is loaded, so its buffer never counts in
 * this process's peak RSS. The child keeps its buffer and measures again on each request: once before the
 * model is loaded (the figure `--membw` alone gives) and, during generation, before the first and after every
 * repetition, so each repetition's GB/s is set against the probes taken seconds either side of it (on a
 * shared machine the bandwidth moves by 2x from minute to minute). Requests and replies go over two pipes; the
 * child exits when the request pipe closes (this process exiting, for any reason, closes it). */
#define BENCH_PROBE_PASSES 3 /* passes of each probe beside generation (about 0.1-0.3 s for 1 GiB) */

struct bench_probe {
    pid_t pid;
    int req, rep; /* request (write end), reply (read end); -1 when closed */
};

struct bench_probe_reply {
    int rc;
    struct membw_result r;
    char msg[ERR_MSG_MAX];
};

static int bench_fd_io(int fd, void *buf, size_t n, bool wr)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = wr ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        done += (size_t)k;
    }
    return 0;
}

static void bench_probe_child(const struct bench_opts *o, int req, int rep)
{
    struct bench_probe_reply res = {0};
    struct membw_probe *p = membw_probe_create((size_t)o->membw_mib << 20, (int)o->threads, res.msg);
    int passes;
    while (bench_fd_io(req, &passes, sizeof passes, false) == 0) {
        memset(&res.r, 0, sizeof res.r);
        res.rc = p ? membw_probe_run(p, passes, &res.r, res.msg) : ERR_NOMEM;
        if (bench_fd_io(rep, &res, sizeof res, true))
            break;
    }
    membw_probe_destroy(p);
    _exit(0);
}

/* Starts the probe process (it allocates and writes its buffer, then waits). 0 or ERR_IO. */
static int bench_probe_start(const struct bench_opts *o, struct bench_probe *pr, char *err)
{
    int rq[2], rp[2];
    pr->pid = -1;
    pr->req = pr->rep = -1;
    if (pipe(rq) != 0)
        return err_set(err, ERR_IO, "membw: pipe: %s", strerror(errno));
    if (pipe(rp) != 0) {
        close(rq[0]);
        close(rq[1]);
        return err_set(err, ERR_IO, "membw: pipe: %s", strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(rq[0]), close(rq[1]), close(rp[0]), close(rp[1]);
        return err_set(err, ERR_IO, "membw: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(rq[1]);
        close(rp[0]);
        bench_probe_child(o, rq[0], rp[1]);
    }
    close(rq[0]);
    close(rp[1]);
    /* a request written after the probe process died (killed, out of memory) must fail with EPIPE and be
     * reported, not end this process by SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
    pr->pid = pid;
    pr->req = rq[1];
    pr->rep = rp[0];
    return 0;
}

/* One measurement of `passes` passes (0: membw_measure's default). 0, the probe's error, or ERR_INTERNAL when
 * the probe process is gone. */
static int bench_probe_run(struct bench_probe *pr, int passes, struct membw_result *r, char *err)
{
    struct bench_probe_reply res;
    if (pr->req < 0 || bench_fd_io(pr->req, &passes, sizeof passes, true) ||
        bench_fd_io(pr->rep, &res, sizeof res, false))
        return err_set(err, ERR_INTERNAL, "membw: the probe process died before reporting");
    if (res.rc)
        return err_set(err, res.rc, "%s", res.msg);
    *r = res.r;
    return 0;
}

static void bench_probe_stop(struct bench_probe *pr)
{
    if (pr->req >= 0)
        close(pr->req);
    if (pr->rep >= 0)
        close(pr->rep);
    pr->req = pr->rep = -1;
    if (pr->pid > 0) {
        int status;
        while (waitpid(pr->pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
    pr->pid = -1;
}

static uint64_t bench_rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct bench_ctx {
    struct model *m;
    struct engine *e;
    struct model *dm;  /* --draft-model's, or NULL */
    struct engine *de;
    struct batch b;
    float *logits; /* [batch][n_vocab] */
    int32_t bos;
    uint64_t rng;
    char err[ERR_MSG_MAX];
};

static int32_t bench_token(struct bench_ctx *c) { return (int32_t)(bench_rng_next(&c->rng) % (uint64_t)c->m->hp.n_vocab); }

/* n prompt tokens into sequence 0 at positions depth..depth+n-1, after truncating it to depth (the first
 * depth positions must hold tokens already: bench_fill); logits of the last only. Returns seconds or -1. */
static double bench_pp(struct bench_ctx *c, int n, int depth)
{
    engine_seq_truncate(c->e, 0, depth);
    double t0 = clock_now_s();
    for (int i = 0; i < n; i += c->b.cap) {
        batch_clear(&c->b);
        for (int j = i; j < n && j < i + c->b.cap; j++)
            batch_add(&c->b, j + depth == 0 && c->bos >= 0 ? c->bos : bench_token(c), depth + j, 0, j == n - 1);
        if (engine_forward(c->e, &c->b, c->logits, c->err))
            return -1;
    }
    return clock_now_s() - t0;
}

/* Sequence 0 holds depth tokens afterwards (untimed setup of --depth); 0 or -1. */
static int bench_fill(struct bench_ctx *c, int depth)
{
    engine_seq_truncate(c->e, 0, 0);
    return depth > 0 && bench_pp(c, depth, 0) < 0 ? -1 : 0;
}

/* n decode steps of n_seqs sequences (one token each per step); sequence 0 starts from depth tokens (see
 * bench_fill), the others (and sequence 0 when depth is 0) from empty caches. Returns seconds or -1. */
static double bench_tg(struct bench_ctx *c, int n, int n_seqs, int depth)
{
    for (int s = 0; s < n_seqs; s++)
        engine_seq_truncate(c->e, s, s == 0 ? depth : 0);
    double t0 = clock_now_s();
    for (int i = 0; i < n; i++) {
        batch_clear(&c->b);
        for (int s = 0; s < n_seqs; s++) {
            int pos = (s == 0 ? depth : 0) + i;
            batch_add(&c->b, pos == 0 && c->bos >= 0 ? c->bos : bench_token(c), pos, s, true);
        }
        if (engine_forward(c->e, &c->b, c->logits, c->err))
            return -1;
    }
    return clock_now_s() - t0;
}

#define BENCH_VERIFY_CTX 32

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Verify passes of 1 + k tokens, k = 0..kmax, interleaved, repeat times after one untimed round: ratio[k]
 * gets the median over repetitions of time(1 + k) / time(1). 0 or -1. */
static int bench_verify(struct bench_ctx *c, int kmax, int repeat, double *ratio)
{
    double *t = malloc((size_t)(kmax + 1) * (size_t)repeat * sizeof *t);
    double *col = malloc((size_t)repeat * sizeof *col);
    int rc = -1;
    if (!t || !col) {
        err_set(c->err, ERR_NOMEM, "out of memory");
        goto out;
    }
    engine_seq_truncate(c->e, 0, 0);
    batch_clear(&c->b);
    for (int i = 0; i < BENCH_VERIFY_CTX; i++)
        batch_add(&c->b, i == 0 && c->bos >= 0 ? c->bos : bench_token(c), i, 0, false);
    if (engine_forward(c->e, &c->b, NULL, c->err))
        goto out;
    for (int r = -1; r < repeat; r++)
        for (int k = 0; k <= kmax; k++) {
            batch_clear(&c->b);
            for (int j = 0; j <= k; j++)
                batch_add(&c->b, bench_token(c), BENCH_VERIFY_CTX + j, 0, true);
            double t0 = clock_now_s();
            if (engine_forward(c->e, &c->b, c->logits, c->err))
                goto out;
            if (r >= 0)
                t[(size_t)r * (size_t)(kmax + 1) + (size_t)k] = clock_now_s() - t0;
            engine_seq_truncate(c->e, 0, BENCH_VERIFY_CTX);
        }
    for (int k = 0; k <= kmax; k++) {
        for (int r = 0; r < repeat; r++)
            col[r] = t[(size_t)r * (size_t)(kmax + 1) + (size_t)k] / t[(size_t)r * (size_t)(kmax + 1)];
        qsort(col, (size_t)repeat, sizeof *col, bench_cmp_double);
        ratio[k] = repeat % 2 ? col[repeat / 2] : (col[repeat / 2 - 1] + col[repeat / 2]) / 2;
    }
    rc = 0;
out:
    free(t);
    free(col);
    return rc;
}

static size_t bench_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024;
}

static void bench_json_stat(json_t *o, const char *key, const char *sd_key, struct bench_stat s)
{
    json_object_set_new(o, key, s.valid ? json_real(s.mean) : json_null());
    json_object_set_new(o, sd_key, s.valid ? json_real(s.sd) : json_null());
}

static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'},   {"threads", required_argument, 0, 't'},
        {"batch", required_argument, 0, 'b'},   {"repeat", required_argument, 0, 'r'},
        {"kv-type", required_argument, 0, 1},   {"no-simd", no_argument, 0, 2},
        {"no-membw", no_argument, 0, 3},        {"membw", no_argument, 0, 4},
        {"membw-mib", required_argument, 0, 5}, {"json", no_argument, 0, 6},
        {"mmap", no_argument, 0, 7},            {"ubatch", required_argument, 0, 'u'},
        {"backend", required_argument, 0, 8},   {"verify", required_argument, 0, 9},
        {"spec", required_argument, 0, 10},     {"draft-model", required_argument, 0, 11},
        {"draft-fixed", no_argument, 0, 12},    {"depth", required_argument, 0, 'd'},
        {"stream", required_argument, 0, 13},   {"help", no_argument, 0, 'h'},
        {"tune", no_argument, 0, 14},           {"tune-file", required_argument, 0, 15},
        {"tune-types", required_argument, 0, 16}, {"no-save", no_argument, 0, 17},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->n_prompt = 512;
    o->n_gen = 128;
    o->batch = 1;
    o->repeat = 5;
    o->ubatch = 256;
    o->membw_mib = 1024;
    engine_opts_default(&o->eo);
    char err[ERR_MSG_MAX];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:b:r:u:d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'p': if (flags_parse_int("bench", "--n-prompt", optarg, 0, 1 << 20, &o->n_prompt)) return 2; break;
        case 'n': if (flags_parse_int("bench", "--n-gen", optarg, 0, 1 << 20, &o->n_gen)) return 2; break;
        case 't': if (flags_parse_int("bench", "--threads", optarg, 1, 1024, &o->threads)) return 2; break;
        case 'b': if (flags_parse_int("bench", "--batch", optarg, 1, 4096, &o->batch)) return 2; break;
        case 'r':
            if (flags_parse_int("bench", "--repeat", optarg, 1, 1000, &o->repeat))
                return 2;
            o->repeat_set = true;
            break;
        case 'u': if (flags_parse_int("bench", "--ubatch", optarg, 1, 65536, &o->ubatch)) return 2; break;
        case 'd': if (flags_parse_int("bench", "--depth", optarg, 0, 1 << 20, &o->depth)) return 2; break;
        case 1:
            if (engine_opts_set_kv_type(&o->eo, optarg, err)) {
                fprintf(stderr, "wafer bench: --kv-type: %s\n", err);
                return 2;
            }
            break;
        case 2: o->eo.no_simd = true; break;
        case 3: o->no_membw = true; break;
        case 4: o->membw_only = true; break;
        case 5: if (flags_parse_int("bench", "--membw-mib", optarg, 1, 1 << 20, &o->membw_mib)) return 2; break;
        case 6: o->json = true; break;
        case 7: o->use_mmap = true; break;
        case 8:
            if (engine_opts_set_backend(&o->eo, optarg, err)) {
                fprintf(stderr, "wafer bench: --backend: %s\n", err);
                return 2;
            }
            break;
        case 9: if (flags_parse_int("bench", "--verify", optarg, 0, 64, &o->verify)) return 2; break;
        case 10:
            if (!bench_spec_known(optarg)) {
                fprintf(stderr, "wafer bench: --spec: '%s' is not one of exact, half, wrong, ngram, draft\n", optarg);
                return 2;
            }
            o->spec = optarg;
            break;
        case 11: o->draft_model = optarg; break;
        case 12: o->draft_fixed = true; break;
        case 13: o->stream = optarg; break;
        case 14: o->tune = true; break;
        case 15: o->tune_file = optarg; break;
        case 16: o->tune_types = optarg; break;
        case 17: o->no_save = true; break;
        case 'h': bench_model_usage(stdout); return -1;
        default: bench_model_usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "wafer bench: unexpected argument '%s'\n\n", argv[optind]);
        bench_model_usage(stderr);
        return 2;
    }
    if ((o->tune_file || o->tune_types || o->no_save) && !o->tune) {
        fprintf(stderr, "wafer bench: --tune-file, --tune-types and --no-save go with --tune\n");
        return 2;
    }
    if (o->tune && (o->model_path || o->membw_only || o->stream)) {
        fprintf(stderr, "wafer bench: --tune measures the decode kernels without a model; leave out --model, --membw "
                        "and --stream\n");
        return 2;
    }
    if (o->tune && o->batch > 1) {
        fprintf(stderr, "wafer bench: --tune measures the one-row decode kernels, whose rules are what it chooses; "
                        "--batch does not apply (the batched products prefetch their own way)\n");
        return 2;
    }
    if (o->tune && o->tune_file && o->no_save) {
        fprintf(stderr, "wafer bench: --tune-file names where to save; --no-save saves nothing\n");
        return 2;
    }
    if (o->tune)
        return 0;
    if (o->stream && (o->model_path || o->membw_only)) {
        fprintf(stderr, "wafer bench: --stream measures the kernels without a model; leave out --model and --membw\n");
        return 2;
    }
    if (o->stream)
        return 0;
    if (!o->membw_only && !o->model_path) {
        fprintf(stderr, "wafer bench: --model is required (or --membw to measure only the read bandwidth, or "
                        "--stream TYPE the decode kernels alone)\n\n");
        bench_model_usage(stderr);
        return 2;
    }
    if (o->membw_only && o->no_membw) {
        fprintf(stderr, "wafer bench: --membw and --no-membw contradict each other\n");
        return 2;
    }
    if (o->spec && !strcmp(o->spec, "draft") && !o->draft_model) {
        fprintf(stderr, "wafer bench: --spec draft needs --draft-model FILE\n");
        return 2;
    }
    if (o->spec && o->n_gen < 2) {
        fprintf(stderr, "wafer bench: --spec needs -n of at least 2 (the answer's length)\n");
        return 2;
    }
    if (!o->membw_only && o->n_prompt == 0 && o->n_gen == 0 && o->verify == 0) {
        fprintf(stderr, "wafer bench: -p 0 and -n 0 leave nothing to measure\n");
        return 2;
    }
    return 0;
}

static int bench_membw_only(const struct bench_opts *o)
{
    char err[ERR_MSG_MAX];
    struct membw_result r;
    if (membw_measure((size_t)o->membw_mib << 20, 0, (int)o->threads, &r, err)) {
        fprintf(stderr, "wafer bench: %s\n", err);
        return 1;
    }
    printf("read bandwidth: %.1f GB/s median of %d passes (best %.1f, worst %.1f), %d threads, %zu MiB buffer, %s loads\n",
           r.median_gbs, r.passes, r.best_gbs, r.worst_gbs, r.threads, r.bytes >> 20,
           membw_loads_name());
    double rtt = 0;
    if (membw_round_trip_ns(0, &rtt, err) == 0)
        printf("core round trip: %.0f ns (a cache line from one core to another and back; on an AMD EPYC about 100 "
               "ns within a CCD, 350-450 across CCDs)\n", rtt);
    else
        fprintf(stderr, "wafer bench: no core round trip: %s\n", err);
    if (o->json) {
        char rt[32] = "null";
        if (rtt > 0)
            snprintf(rt, sizeof rt, "%.1f", rtt);
        printf("{\"membw_gbs\":%.3f,\"membw_best_gbs\":%.3f,\"membw_worst_gbs\":%.3f,\"threads\":%d,\"passes\":%d,"
               "\"buffer_bytes\":%zu,\"core_round_trip_ns\":%s}\n",
               r.median_gbs, r.best_gbs, r.worst_gbs, r.threads, r.passes, r.bytes, rt);
    }
    return 0;
}

/* --stream TYPE: the decode kernels against a plain read (gemv_stream.h). */
static int bench_stream_only(const struct bench_opts *o)
{
    char err[ERR_MSG_MAX], cpu[256];
    enum dtype t;
    if (dtype_from_name(o->stream, &t)) {
        fprintf(stderr, "wafer bench: --stream: '%s' is not a weight type (f16, q8_0, q4_0, q4_k, q6_k)\n", o->stream);
        return 2;
    }
    struct gemv_stream_opts so;
    struct gemv_stream_result r;
    gemv_stream_opts_default(&so, t);
    so.n_threads = (int)o->threads;
    so.batch = (int)o->batch;
    if (o->repeat_set)
        so.passes = (int)o->repeat;
    sysinfo_cpu_name(cpu, sizeof cpu);
    fprintf(stderr, "cpu: %s\nstream: %s decode kernels, %d column%s, over %d layers (dim %d, FFN %d, KV %d), writing "
                    "the weights...\n",
            cpu, dtype_name(t), so.batch, so.batch > 1 ? "s" : "", so.layers, so.dim, so.ffn, so.kv_dim);
    int rc = gemv_stream_run(&so, &r, err);
    if (rc) {
        fprintf(stderr, "wafer bench: %s\n", err);
        return rc == ERR_UNSUPPORTED || rc == ERR_INVALID_ARG ? 2 : 1;
    }
    printf("%s decode kernels (%s layout), %d column%s, %d threads, %.1f MB per pass: plain read %.1f GB/s, kernels "
           "%.1f GB/s, %.1f GMAC/s (medians of %d passes each, alternated); kernels / read %.2f (median of the pairs, "
           "%.2f-%.2f)\n", dtype_name(t), r.layout, so.batch, so.batch > 1 ? "s" : "", r.threads, r.bytes / 1e6,
           r.read_gbs, r.kernel_gbs, r.kernel_gmacs, r.passes, r.share, r.share_lo, r.share_hi);
    printf("the same arithmetic from cache (each thread's %d KiB slices, in L2): %.1f GB/s, %.1f GMAC/s; kernels "
           "from memory / from cache %.2f\n", r.cache_kib, r.cache_gbs, r.cache_gmacs, r.kernel_gmacs / r.cache_gmacs);
    if (r.decode_prefetch[0]) /* the rule the kernel passes ran under (gemv_stream_run applies the tune file) */
        fprintf(stderr, "decode prefetch: %s (%s)\n", r.decode_prefetch, r.decode_prefetch_source);
    if (o->json) {
        json_t *j = json_object();
        if (!j)
            return 1;
        json_object_set_new(j, "cpu", json_string(cpu));
        json_object_set_new(j, "type", json_string(dtype_name(t)));
        json_object_set_new(j, "layout", json_string(r.layout));
        json_object_set_new(j, "threads", json_integer(r.threads));
        json_object_set_new(j, "passes", json_integer(r.passes));
        json_object_set_new(j, "bytes_per_pass", json_integer((json_int_t)r.bytes));
        json_object_set_new(j, "read_gbs", json_real(r.read_gbs));
        json_object_set_new(j, "kernel_gbs", json_real(r.kernel_gbs));
        json_object_set_new(j, "batch", json_integer(so.batch));
        json_object_set_new(j, "kernel_gmacs", json_real(r.kernel_gmacs));
        json_object_set_new(j, "kernel_share", json_real(r.share));
        json_object_set_new(j, "kernel_share_lo", json_real(r.share_lo));
        json_object_set_new(j, "kernel_share_hi", json_real(r.share_hi));
        json_object_set_new(j, "cache_kib", json_integer(r.cache_kib));
        json_object_set_new(j, "cache_gbs", json_real(r.cache_gbs));
        json_object_set_new(j, "cache_gmacs", json_real(r.cache_gmacs));
        json_object_set_new(j, "macs_per_pass", json_real(r.macs));
        json_object_set_new(j, "cache_macs_per_pass", json_real(r.cache_macs));
        if (r.decode_prefetch[0]) {
            json_object_set_new(j, "decode_prefetch", json_string(r.decode_prefetch));
            json_object_set_new(j, "decode_prefetch_source", json_string(r.decode_prefetch_source));
        }
        char *txt = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!txt)
            return 1;
        printf("%s\n", txt);
        free(txt);
    }
    return 0;
}

int bench_model_main(int argc, char **argv)
{
    struct bench_opts o;
    int prc = bench_parse(argc, argv, &o);
    if (prc)
        return prc < 0 ? 0 : prc;
    if (o.membw_only)
        return bench_membw_only(&o);
    if (o.stream)
        return bench_stream_only(&o);
    if (o.tune) {
        struct bench_tune_opts to = {.threads = (int)o.threads, .rounds = o.repeat_set ? (int)o.repeat : 0,
                                     .path = o.tune_file, .types = o.tune_types, .save = !o.no_save, .json = o.json};
        return bench_tune_run(&to);
    }

    int rc = 1;
    struct bench_ctx c = {.rng = 0x2545F4914F6CDD1Dull, .bos = -1};
    struct membw_result bw = {0};
    struct bench_probe probe = {.pid = -1, .req = -1, .rep = -1};
    bool have_bw = false;
    double *tps = NULL, *pct = NULL;
    if (!o.no_membw) {
        if (bench_probe_start(&o, &probe, c.err) || bench_probe_run(&probe, 0, &bw, c.err)) {
            fprintf(stderr, "wafer bench: bandwidth probe failed (%s); reporting without it\n", c.err);
            bench_probe_stop(&probe);
        } else {
            have_bw = true;
        }
    }

    double t_load = clock_now_s();
    c.m = engine_model_load(o.model_path, o.use_mmap, &o.eo, c.err);
    if (!c.m) {
        fprintf(stderr, "wafer bench: %s\n", c.err);
        return 1;
    }
    const struct model_hparams *hp = &c.m->hp;
    o.eo.n_threads = (int)o.threads;
    o.eo.max_seqs = (int)o.batch;
    long longest_prompt = o.n_prompt > o.depth ? o.n_prompt : o.depth;
    o.eo.max_batch_tokens = (int)(longest_prompt > 0 && longest_prompt < o.ubatch ? longest_prompt : o.ubatch);
    if (o.batch > o.eo.max_batch_tokens)
        o.eo.max_batch_tokens = (int)o.batch;
    if (o.verify + 1 > o.eo.max_batch_tokens)
        o.eo.max_batch_tokens = (int)o.verify + 1;
    if (BENCH_VERIFY_CTX > o.eo.max_batch_tokens && o.verify)
        o.eo.max_batch_tokens = BENCH_VERIFY_CTX;
    if (o.spec) { /* the scheduler's passes: a short prompt, then decodes with up to 16 drafted tokens */
        o.n_prompt = 0;
        if (o.eo.max_batch_tokens < 64)
            o.eo.max_batch_tokens = 64;
    }
    /* a context just large enough for the longest test, as llama-bench sizes it */
    long ctx = o.depth + o.n_prompt + o.n_gen + (o.spec ? 64 : 0);
    if (o.verify && ctx < BENCH_VERIFY_CTX + o.verify + 1)
        ctx = BENCH_VERIFY_CTX + o.verify + 1;
    if (ctx < 1)
        ctx = 1;
    if (ctx > hp->ctx_train) {
        fprintf(stderr, "wafer bench: -d %ld + -p %ld + -n %ld is more than the model's context of %d\n", o.depth,
                o.n_prompt, o.n_gen, hp->ctx_train);
        goto out;
    }
    o.eo.n_ctx = (int)ctx;
    struct engine_params ep;
    if (engine_params_for_model(c.m, &o.eo, &ep, c.err)) {
        fprintf(stderr, "wafer bench: %s\n", c.err);
        goto out;
    }
    /* the KV pool holds the longest single-sequence test or the batched decode, whichever is larger */
    int64_t per_seq = (ctx + ep.block_size - 1) / ep.block_size;
    int64_t per_batch_seq = (o.n_gen + ep.block_size - 1) / ep.block_size;
    ep.kv_blocks = per_seq > per_batch_seq * o.batch ? per_seq : per_batch_seq * o.batch;
    c.e = engine_create(c.m, &ep, c.err);
    if (!c.e) {
        fprintf(stderr, "wafer bench: %s\n", c.err);
        goto out;
    }
    double load_s = clock_now_s() - t_load;
    const struct engine_params *p = engine_params_get(c.e);
    struct backend_desc desc;
    engine_describe(c.e, &desc);
    size_t kv_bytes = desc.kv_bytes;
    if (tokenizer_add_bos(c.m->tok))
        c.bos = tokenizer_bos(c.m->tok);
    c.logits = malloc((size_t)(o.batch > o.verify + 1 ? o.batch : o.verify + 1) * hp->n_vocab * sizeof(float));
    tps = malloc((size_t)o.repeat * sizeof *tps);
    pct = malloc((size_t)o.repeat * sizeof *pct);
    if (!c.logits || !tps || !pct || batch_init(&c.b, p->max_batch_tokens)) {
        fprintf(stderr, "wafer bench: out of memory\n");
        goto out;
    }
    /* the instruction set of the kernels the engine runs for the model's main weight type */
    const char *simd = desc.isa[c.m->main_type] ? desc.isa[c.m->main_type] : "scalar";
    double wgb = (double)c.m->weight_bytes / 1e9;
    char cpu[256], cpu_flags[256];
    sysinfo_cpu_name(cpu, sizeof cpu);
    sysinfo_cpu_flags(cpu_flags, sizeof cpu_flags);
    fprintf(stderr, "cpu: %s (%s)\n", cpu, cpu_flags[0] ? cpu_flags : "flags unknown");
    if (desc.decode_prefetch[0])
        fprintf(stderr, "decode prefetch: %s (%s)\n", desc.decode_prefetch, desc.decode_prefetch_source);
    fprintf(stderr, "model: %s (%s, %.1f MB file, %.1f MB of weights read per token), %d threads, %s kernels, "
                    "KV %s %.1f MiB, loaded in %.0f ms\n",
            o.model_path, dtype_name(c.m->main_type), c.m->file_bytes / 1e6, wgb * 1e3, p->n_threads, simd,
            dtype_name(p->kv_type), kv_bytes / 1048576.0, load_s * 1e3);
    if (have_bw)
        fprintf(stderr, "read bandwidth: %.1f GB/s (median of %d passes, best %.1f), %d threads\n", bw.median_gbs,
                bw.passes, bw.best_gbs, bw.threads);

    struct bench_stat pp = {0}, tg = {0}, bt = {0};
    double beside_gbs = 0, beside_pct = 0; /* the probes around the tg repetitions (0: none) */
    double rtt[2] = {0, 0};                 /* core round trip before / after them, ns (0: not measured) */
    char at[32] = ""; /* " @ d4096": the depth label llama-bench prints */
    if (o.depth)
        snprintf(at, sizeof at, " @ d%ld", o.depth);
    if ((o.n_prompt > 0 || o.n_gen > 0) && bench_fill(&c, (int)o.depth))
        goto fail_run;
    if (o.n_prompt > 0) {
        if (bench_pp(&c, (int)o.n_prompt, (int)o.depth) < 0)
            goto fail_run;
        for (int r = 0; r < o.repeat; r++) {
            double s = bench_pp(&c, (int)o.n_prompt, (int)o.depth);
            if (s < 0)
                goto fail_run;
            tps[r] = o.n_prompt / s;
        }
        pp = bench_stat_of(tps, (int)o.repeat);
        fprintf(stderr, "pp%ld%s %9.2f +- %6.2f tok/s\n", o.n_prompt, at, pp.mean, pp.sd);
    }
    if (o.n_gen > 0 && !o.spec) {
        if (bench_tg(&c, 1, 1, (int)o.depth) < 0)
            goto fail_run;
        /* the cores' round trip before and after the repetitions: on a VM whose vCPUs move between CCDs it says
         * where they ran (docs/performance.md, stop 40) */
        if (have_bw && membw_round_trip_ns(0, &rtt[0], c.err))
            rtt[0] = 0;
        /* each repetition against the mean of the probes just before and just after it */
        struct membw_result pb;
        bool probing = have_bw && bench_probe_run(&probe, BENCH_PROBE_PASSES, &pb, c.err) == 0;
        double before = probing ? pb.median_gbs : 0, probed = before;
        for (int r = 0; r < o.repeat; r++) {
            double s = bench_tg(&c, (int)o.n_gen, 1, (int)o.depth);
            if (s < 0)
                goto fail_run;
            tps[r] = o.n_gen / s;
            if (probing && bench_probe_run(&probe, BENCH_PROBE_PASSES, &pb, c.err) == 0) {
                pct[r] = 100 * tps[r] * wgb / (0.5 * (before + pb.median_gbs));
                probed += pb.median_gbs;
                before = pb.median_gbs;
            } else {
                probing = false;
            }
        }
        if (have_bw && !probing)
            fprintf(stderr, "wafer bench: bandwidth probe beside generation failed (%s)\n", c.err);
        if (rtt[0] > 0 && membw_round_trip_ns(0, &rtt[1], c.err))
            rtt[1] = 0;
        if (probing) {
            beside_gbs = probed / (double)(o.repeat + 1);
            stats_sort(pct, (size_t)o.repeat);
            beside_pct = stats_percentile_sorted(pct, (size_t)o.repeat, 50);
        }
        tg = bench_stat_of(tps, (int)o.repeat);
        fprintf(stderr, "tg%ld%s %9.2f +- %6.2f tok/s   %6.2f GB/s of weights", o.n_gen, at, tg.mean, tg.sd,
                tg.mean * wgb);
        if (have_bw)
            fprintf(stderr, " = %.0f%% of %.1f GB/s (probe before loading)", 100 * tg.mean * wgb / bw.median_gbs,
                    bw.median_gbs);
        if (beside_gbs > 0)
            fprintf(stderr, ", %.0f%% of the probes beside each repetition (%.1f GB/s on average)", beside_pct,
                    beside_gbs);
        fputc('\n', stderr);
        if (rtt[0] > 0 && rtt[1] > 0)
            fprintf(stderr, "core round trip: %.0f ns before the tg repetitions, %.0f after (a cache line from one "
                            "core to another and back)\n", rtt[0], rtt[1]);
        if (o.batch > 1) {
            if (bench_tg(&c, 1, (int)o.batch, 0) < 0)
                goto fail_run;
            for (int r = 0; r < o.repeat; r++) {
                double s = bench_tg(&c, (int)o.n_gen, (int)o.batch, 0);
                if (s < 0)
                    goto fail_run;
                tps[r] = (double)o.n_gen * o.batch / s;
            }
            bt = bench_stat_of(tps, (int)o.repeat);
            fprintf(stderr, "tg%ld x%ld %9.2f +- %6.2f tok/s aggregate (%.2fx one sequence)\n", o.n_gen, o.batch, bt.mean,
                    bt.sd, bt.mean / tg.mean);
        }
    }
    double verify[65];
    if (o.verify) {
        if (bench_verify(&c, (int)o.verify, (int)o.repeat, verify))
            goto fail_run;
        for (int k = 1; k <= o.verify; k++)
            fprintf(stderr, "verify 1+%-2d  %5.2fx the time of one token   ceiling %5.2fx tokens/s (all %d drafts accepted)\n",
                    k, verify[k], (1 + k) / verify[k], k);
    }
    struct bench_spec_result sr = {0};
    if (o.spec) {
        if (o.draft_model && !(c.de = engine_create_draft(o.draft_model, o.use_mmap, c.e, &o.eo, &c.dm, c.err)))
            goto fail_run;
        if (c.dm)
            fprintf(stderr, "draft model: %s (%s, %.1f MB of weights read per token)\n", o.draft_model,
                    dtype_name(c.dm->main_type), c.dm->weight_bytes / 1e6);
        engine_seq_truncate(c.e, 0, 0); /* the scheduler starts from empty slots (--verify left a context) */
        if (bench_spec_run(c.e, c.de, o.spec, (int)o.n_gen, (int)o.repeat, o.draft_fixed, &sr, c.err))
            goto fail_run;
        fprintf(stderr, "spec %s: %.2fx decode tokens/s (median of %d rounds' ratios; plain %.2f, speculative %.2f "
                        "tok/s), drafted %d tokens, %d accepted (%.0f%%)\n",
                o.spec, sr.ratio, sr.rounds, sr.plain_tps, sr.spec_tps, sr.drafted, sr.accepted,
                sr.drafted ? 100.0 * sr.accepted / sr.drafted : 0.0);
    }
    size_t rss = bench_peak_rss();
    fprintf(stderr, "peak RSS: %.1f MiB (file %.1f MiB + KV %.1f MiB + %.1f MiB other)\n", rss / 1048576.0,
            c.m->file_bytes / 1048576.0, kv_bytes / 1048576.0,
            ((double)rss - (double)c.m->file_bytes - (double)kv_bytes) / 1048576.0);

    /* human-readable table on stdout, then the JSON line */
    printf("| model | type | threads | test | t/s | GB/s | %% of read bw |\n|---|---|---|---|---|---|---|\n");
    const char *base = strrchr(o.model_path, '/') ? strrchr(o.model_path, '/') + 1 : o.model_path;
    if (pp.valid)
        printf("| %s | %s | %d | pp%ld%s | %.2f ± %.2f | | |\n", base, dtype_name(c.m->main_type), p->n_threads,
               o.n_prompt, at, pp.mean, pp.sd);
    if (tg.valid) {
        printf("| %s | %s | %d | tg%ld%s | %.2f ± %.2f | %.2f | ", base, dtype_name(c.m->main_type), p->n_threads,
               o.n_gen, at, tg.mean, tg.sd, tg.mean * wgb);
        if (beside_gbs > 0)
            printf("%.0f%% of %.1f beside, %.0f%% of %.1f before |\n", beside_pct, beside_gbs,
                   100 * tg.mean * wgb / bw.median_gbs, bw.median_gbs);
        else if (have_bw)
            printf("%.0f%% of %.1f |\n", 100 * tg.mean * wgb / bw.median_gbs, bw.median_gbs);
        else
            printf("|\n");
    }
    if (bt.valid)
        printf("| %s | %s | %d | tg%ld x%ld | %.2f ± %.2f | %.2f | |\n", base, dtype_name(c.m->main_type), p->n_threads,
               o.n_gen, o.batch, bt.mean, bt.sd, bt.mean / o.batch * wgb);
    for (int k = 1; k <= o.verify; k++)
        printf("| %s | %s | %d | verify 1+%d | %.2fx one token | | |\n", base, dtype_name(c.m->main_type), p->n_threads,
               k, verify[k]);
    if (o.spec)
        printf("| %s | %s | %d | spec %s tg%ld | %.2f (%.2fx plain %.2f) | | |\n", base, dtype_name(c.m->main_type),
               p->n_threads, o.spec, o.n_gen, sr.spec_tps, sr.ratio, sr.plain_tps);
    if (o.json) {
        json_t *j = json_object();
        json_object_set_new(j, "model", json_string(base));
        json_object_set_new(j, "type", json_string(dtype_name(c.m->main_type)));
        json_object_set_new(j, "model_bytes", json_integer((json_int_t)c.m->file_bytes));
        json_object_set_new(j, "weight_bytes", json_integer((json_int_t)c.m->weight_bytes));
        json_object_set_new(j, "threads", json_integer(p->n_threads));
        json_object_set_new(j, "cpu", json_string(cpu));
        json_object_set_new(j, "cpu_flags", json_string(cpu_flags));
        if (desc.decode_prefetch[0]) {
            json_object_set_new(j, "decode_prefetch", json_string(desc.decode_prefetch));
            json_object_set_new(j, "decode_prefetch_source", json_string(desc.decode_prefetch_source));
        }
        json_object_set_new(j, "simd", json_string(simd));
        json_object_set_new(j, "n_prompt", json_integer(o.n_prompt));
        json_object_set_new(j, "n_gen", json_integer(o.n_gen));
        json_object_set_new(j, "depth", json_integer(o.depth));
        json_object_set_new(j, "repeat", json_integer(o.repeat));
        bench_json_stat(j, "pp_tps", "pp_tps_sd", pp);
        bench_json_stat(j, "tg_tps", "tg_tps_sd", tg);
        json_object_set_new(j, "tg_gbs", tg.valid ? json_real(tg.mean * wgb) : json_null());
        json_object_set_new(j, "membw_gbs", have_bw ? json_real(bw.median_gbs) : json_null());
        json_object_set_new(j, "membw_best_gbs", have_bw ? json_real(bw.best_gbs) : json_null());
        json_object_set_new(j, "tg_roofline_pct",
                            have_bw && tg.valid ? json_real(100 * tg.mean * wgb / bw.median_gbs) : json_null());
        json_object_set_new(j, "membw_beside_gbs", beside_gbs > 0 ? json_real(beside_gbs) : json_null());
        json_object_set_new(j, "tg_beside_pct", beside_gbs > 0 ? json_real(beside_pct) : json_null());
        json_object_set_new(j, "core_round_trip_ns_before", rtt[0] > 0 && rtt[1] > 0 ? json_real(rtt[0]) : json_null());
        json_object_set_new(j, "core_round_trip_ns_after", rtt[0] > 0 && rtt[1] > 0 ? json_real(rtt[1]) : json_null());
        json_object_set_new(j, "batch", json_integer(o.batch));
        bench_json_stat(j, "batch_tps", "batch_tps_sd", bt);
        json_object_set_new(j, "batch_speedup", bt.valid && tg.mean > 0 ? json_real(bt.mean / tg.mean) : json_null());
        json_t *vc = json_array();
        for (int k = 0; k <= o.verify; k++)
            json_array_append_new(vc, json_real(k ? verify[k] : 1.0));
        json_object_set_new(j, "verify_cost", o.verify ? vc : (json_decref(vc), json_null()));
        if (o.spec) {
            json_t *sj = json_object();
            json_object_set_new(sj, "source", json_string(o.spec));
            json_object_set_new(sj, "speedup", json_real(sr.ratio));
            json_object_set_new(sj, "plain_tps", json_real(sr.plain_tps));
            json_object_set_new(sj, "spec_tps", json_real(sr.spec_tps));
            json_object_set_new(sj, "drafted", json_integer(sr.drafted));
            json_object_set_new(sj, "accepted", json_integer(sr.accepted));
            json_object_set_new(j, "spec", sj);
        }
        json_object_set_new(j, "kv_bytes", json_integer((json_int_t)kv_bytes));
        json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)rss));
        json_object_set_new(j, "load_ms", json_real(load_s * 1e3));
        char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
        json_decref(j);
        if (!s) {
            fprintf(stderr, "wafer bench: out of memory\n");
            goto out;
        }
        printf("%s\n", s);
        free(s);
    }
    fflush(stdout);
    rc = 0;
    goto out;
fail_run:
    fprintf(stderr, "wafer bench: %s\n", c.err);
out:
    bench_probe_stop(&probe);
    free(tps);
    free(pct);
    free(c.logits);
    batch_deinit(&c.b);
    engine_destroy(c.e);
    model_destroy(c.m);
    engine_destroy(c.de);
    model_destroy(c.dm);
    return rc;
}
