/*
 * serve_run: `wafer bench serve` from options to reports. Inputs are checked before the first request (a
 * bad dataset fails in milliseconds, not after a ten-minute sweep). Each load point of a sweep sends prompts
 * it has never sent before (synthetic ones from the seed mixed with the point's index, dataset lines from
 * the next slice of the file): a server with a prefix cache would otherwise answer later points' prompts from
 * cache and the sweep would measure the cache, not prefill. --reuse-prompts sends the same prompts at every
 * point (for cache studies). Same seed, same requests. Per-request results are reduced to a summary after
 * each run; the summary keeps the sorted samples the HTML charts need.
 *
 * With --turns T a run is --num-prompts conversations of T requests (serve_client.c sends each turn with its
 * history): T new messages per conversation are drawn like single prompts, so every turn adds --input-len
 * tokens of its own to the history.
 */
#include "bench/serve.h"

#include "bench/serve_client.h"
#include "bench/serve_prompts.h"
#include "bench/serve_report.h"
#include "bench/serve_stats.h"
#include "core/err.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct run_progress {
    int run, n_runs;
    char name[96];
};

static void run_progress_draw(void *ctx, int done, int failed, int total, double elapsed_s)
{
    const struct run_progress *p = ctx;
    int width = 30, fill = total ? done * width / total : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r\033[K[%s] %d/%d requests, %d failed, %.1f s  (run %d/%d: %s)", bar, done, total, failed,
            elapsed_s, p->run, p->n_runs, p->name);
    if (done == total)
        fprintf(stderr, "\n");
    fflush(stderr);
}

/* Derives the request URL and the server's base URL (for /v1/models and /tokenize) from --url. */
static int run_urls(const char *url, int *endpoint, char **endpoint_url, char **base_url, char *err)
{
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return err_set(err, ERR_INVALID_ARG, "--url must start with http:// or https:// (got '%s')", url);
    size_t n = strlen(url);
    while (n > 8 && url[n - 1] == '/')
        n--;
    char *u = strndup(url, n);
    if (!u)
        return err_set(err, ERR_NOMEM, "out of memory");
    static const char *const tails[] = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"};
    char *ep = NULL, *base = NULL;
    for (int t = 0; t < 4 && !ep; t++) {
        size_t tl = strlen(tails[t]);
        if (n > tl && !strcmp(u + n - tl, tails[t])) {
            ep = strdup(u);
            base = strndup(u, n - tl);
            *endpoint = t < 2 ? SERVE_ENDPOINT_CHAT : SERVE_ENDPOINT_COMPLETIONS;
        }
    }
    if (!ep) {
        if (n > 3 && !strcmp(u + n - 3, "/v1"))
            u[n -= 3] = '\0';
        const char *path = *endpoint == SERVE_ENDPOINT_CHAT ? "/v1/chat/completions" : "/v1/completions";
        ep = malloc(n + strlen(path) + 1);
        if (ep)
            sprintf(ep, "%s%s", u, path);
        base = strdup(u);
    }
    free(u);
    if (!ep || !base) {
        free(ep);
        free(base);
        return err_set(err, ERR_NOMEM, "out of memory");
    }
    *endpoint_url = ep;
    *base_url = base;
    return 0;
}

/* The first model id from GET /v1/models (caller frees), or NULL when the server does not list one. */
static char *run_lookup_model(const char *base, const char *api_key, double timeout_s)
{
    char url[2048], err[ERR_MSG_MAX];
    snprintf(url, sizeof url, "%s/v1/models", base);
    long status = 0;
    char *body = NULL;
    if (serve_client_simple(url, api_key, NULL, timeout_s < 10 ? timeout_s : 10, &status, &body, err) || status != 200) {
        free(body);
        return NULL;
    }
    json_t *o = json_loads(body, 0, NULL);
    free(body);
    json_t *id = json_object_get(json_array_get(json_object_get(o, "data"), 0), "id");
    char *model = json_is_string(id) ? strdup(json_string_value(id)) : NULL;
    json_decref(o);
    return model;
}

/* Tokens per word of our synthetic prompts, measured with llama-server's POST /tokenize; 0 when the server
 * does not offer it (or answers something implausible). */
static double run_calibrate(const char *base, const char *api_key, double timeout_s)
{
    struct serve_prompt_set s;
    char err[ERR_MSG_MAX], url[2048];
    const int words = 256;
    if (serve_prompts_synthetic(&s, 1, words, words, 1, 12345, err))
        return 0;
    /* llama-server reads "content", vLLM "prompt"; each ignores the other */
    json_t *req = json_pack("{s:s, s:s}", "content", s.items[0].text, "prompt", s.items[0].text);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    serve_prompts_free(&s);
    if (!body)
        return 0;
    snprintf(url, sizeof url, "%s/tokenize", base);
    long status = 0;
    char *resp = NULL;
    int rc = serve_client_simple(url, api_key, body, timeout_s < 10 ? timeout_s : 10, &status, &resp, err);
    free(body);
    double ratio = 0;
    if (!rc && status == 200) {
        json_t *o = json_loads(resp, 0, NULL);
        json_t *toks = json_object_get(o, "tokens");
        if (json_is_array(toks))
            ratio = (double)json_array_size(toks) / words;
        json_decref(o);
    }
    free(resp);
    return ratio >= 0.5 && ratio <= 4 ? ratio : 0;
}

static void run_quality_free(struct serve_quality *q)
{
    if (!q)
        return;
    for (int i = 0; q->results && i < q->cases.n; i++) {
        free(q->results[i].error);
        free(q->results[i].answer);
        free(q->results[i].found);
    }
    free(q->results);
    serve_prompts_free(&q->cases);
    free(q);
}

/* Sends the quality cases (temperature 0 unless --temperature) and scores the answers. */
static int run_quality(const struct serve_options *o, struct serve_client_config cfg, struct serve_quality *q,
                       char *err)
{
    int n = q->cases.n;
    struct serve_request_result *res = calloc((size_t)n, sizeof *res);
    q->results = calloc((size_t)n, sizeof *q->results);
    if (!res || !q->results) {
        free(res);
        return err_set(err, ERR_NOMEM, "out of memory for the quality check");
    }
    cfg.capture_text = true;
    cfg.ignore_eos = false;
    cfg.turns = 1; /* each case is one question */
    cfg.temperature = isnan(o->temperature) ? 0.0 : o->temperature;
    cfg.concurrency = o->n_concurrency ? o->concurrency[0] : 1;
    cfg.request_rate = 0;
    double dur;
    int rc = serve_client_run(&cfg, q->cases.items, n, res, &dur, err);
    double sum = 0;
    for (int i = 0; !rc && i < n; i++) {
        struct serve_quality_case *c = &q->results[i];
        const struct serve_prompt *p = &q->cases.items[i];
        c->found = calloc((size_t)p->n_keywords, sizeof(bool));
        if (!c->found) {
            rc = err_set(err, ERR_NOMEM, "out of memory for the quality check");
            break;
        }
        c->outcome = res[i].outcome;
        c->error = res[i].error;
        res[i].error = NULL;
        c->answer = res[i].text;
        res[i].text = NULL;
        c->score = c->outcome == SERVE_OK ? serve_quality_score(c->answer ? c->answer : "", p, c->found) : 0;
        sum += c->score;
    }
    q->score = n ? sum / n : 0;
    for (int i = 0; i < n; i++)
        serve_request_result_clear(&res[i]);
    free(res);
    return rc;
}

int serve_bench_main(const struct serve_options *opt)
{
    struct serve_options o = *opt;
    char err[ERR_MSG_MAX];
    int status = 0;
    char *endpoint_url = NULL, *base_url = NULL, *model = NULL;
    struct serve_prompt_set dataset = {0};
    struct serve_quality *quality = NULL;
    struct serve_report rep;
    memset(&rep, 0, sizeof rep);

    if (run_urls(o.url, &o.endpoint, &endpoint_url, &base_url, err)) {
        fprintf(stderr, "wafer bench serve: %s\n", err);
        return 2;
    }
    /* inputs first, so a bad file fails before any request */
    if (o.dataset && serve_prompts_load_dataset(&dataset, o.dataset, o.output_len, err)) {
        fprintf(stderr, "wafer bench serve: --dataset %s\n", err);
        status = 2;
        goto out;
    }
    if (o.quality) {
        quality = calloc(1, sizeof *quality);
        if (!quality || serve_prompts_load_quality(&quality->cases, o.quality, o.output_len, err)) {
            fprintf(stderr, "wafer bench serve: --quality %s\n", quality ? err : "out of memory");
            status = 2;
            goto out;
        }
        quality->path = o.quality;
    }
    int num_prompts = o.num_prompts >= 0 ? o.num_prompts : (o.dataset ? dataset.n : 100);
    int turns = o.turns > 1 ? o.turns : 1;
    if (turns > 1 && o.num_prompts < 0 && o.dataset)
        num_prompts = dataset.n / turns; /* the whole file, in whole conversations */
    if (turns > 1 && o.dataset && dataset.n < turns) {
        fprintf(stderr, "wafer bench serve: --dataset %s has %d line(s); a conversation of --turns %d needs %d\n",
                o.dataset, dataset.n, turns, turns);
        status = 2;
        goto out;
    }
    if ((long long)num_prompts * turns > 10000000) {
        fprintf(stderr, "wafer bench serve: --num-prompts %d x --turns %d is over 10,000,000 requests a run\n",
                num_prompts, turns);
        status = 2;
        goto out;
    }
    int n_requests = num_prompts * turns;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "wafer bench serve: libcurl could not initialize\n");
        status = 1;
        goto out;
    }
    model = o.model ? strdup(o.model) : run_lookup_model(base_url, o.api_key, o.timeout_s);
    rep.opt = &o;
    rep.endpoint_url = endpoint_url;
    rep.model = model;
    rep.label = o.label ? o.label : model ? model : endpoint_url;
    rep.tokens_per_word = 1.0;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(rep.started_at, sizeof rep.started_at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (!o.dataset && o.calibrate && num_prompts > 0) {
        double ratio = run_calibrate(base_url, o.api_key, o.timeout_s);
        if (ratio > 0) {
            rep.tokens_per_word = ratio;
            rep.calibrated = true;
        }
    }

    int n_lens = o.dataset ? 1 : o.n_input_len;
    int n_loads = o.n_request_rate ? o.n_request_rate : o.n_concurrency;
    int n_runs = num_prompts > 0 ? n_lens * n_loads : 0;
    rep.runs = calloc((size_t)(n_runs ? n_runs : 1), sizeof *rep.runs);
    rep.n_planned = n_runs;
    if (!rep.runs) {
        fprintf(stderr, "wafer bench serve: out of memory\n");
        status = 1;
        goto out_curl;
    }
    printf("wafer bench serve: %s (model %s, %s endpoint)\n", endpoint_url, model ? model : "not sent",
           o.endpoint == SERVE_ENDPOINT_CHAT ? "chat" : "completions");
    if (n_runs && turns > 1)
        printf("%d run%s of %d conversations x %d turns; messages: %s", n_runs, n_runs > 1 ? "s" : "", num_prompts,
               turns, o.dataset ? o.dataset : "synthetic random words");
    else if (n_runs)
        printf("%d run%s of %d requests; prompts: %s", n_runs, n_runs > 1 ? "s" : "", num_prompts,
               o.dataset ? o.dataset : "synthetic random words");
    if (n_runs && !o.dataset)
        printf(" (%.2f tokens per word%s)", rep.tokens_per_word, rep.calibrated ? ", calibrated with /tokenize" : "");
    if (n_runs)
        printf("\n");
    fflush(stdout);

    struct serve_client_config cfg = {
        .url = endpoint_url, .api_key = o.api_key, .model = model, .endpoint = o.endpoint,
        .timeout_s = o.timeout_s, .seed = o.seed, .ignore_eos = o.ignore_eos, .temperature = o.temperature,
        .turns = turns,
    };
    struct run_progress prog = {.n_runs = n_runs};
    if (o.progress) {
        cfg.progress = run_progress_draw;
        cfg.progress_ctx = &prog;
    }
    long long completed_total = 0;
    for (int li = 0; li < n_lens && n_runs; li++) {
        int input_len = o.dataset ? 0 : o.input_len[li];
        for (int k = 0; k < n_loads; k++) {
            struct serve_prompt_set prompts = {0};
            int rc, point = o.reuse_prompts ? 0 : li * n_loads + k; /* which fresh set this load point sends */
            if (o.dataset) {
                rc = serve_prompts_take(&prompts, &dataset, point * n_requests, n_requests, err);
            } else {
                int words = (int)lround(input_len / rep.tokens_per_word);
                rc = serve_prompts_synthetic(&prompts, n_requests, words < 1 ? 1 : words, input_len, o.output_len,
                                             o.seed ^ ((uint64_t)point * 0x9e3779b97f4a7c15ull), err);
            }
            if (rc) {
                fprintf(stderr, "wafer bench serve: %s\n", err);
                status = 1;
                goto out_curl;
            }
            struct serve_run *run = &rep.runs[rep.n_runs];
            run->concurrency = o.n_request_rate ? 0 : o.concurrency[k];
            run->request_rate = o.n_request_rate ? o.request_rate[k] : 0;
            run->input_len = input_len;
            run->output_len = o.dataset ? 0 : o.output_len;
            cfg.concurrency = run->concurrency;
            cfg.request_rate = run->request_rate;
            prog.run = rep.n_runs + 1;
            serve_report_run_name(run, prog.name, sizeof prog.name);
            struct serve_request_result *res = calloc((size_t)prompts.n, sizeof *res);
            double duration = 0;
            rc = res ? serve_client_run(&cfg, prompts.items, prompts.n, res, &duration, err)
                     : err_set(err, ERR_NOMEM, "out of memory for %d results", prompts.n);
            if (!rc)
                rc = serve_stats_compute(res, prompts.n, duration, o.has_slo ? &o.slo : NULL, o.cost_per_hour, &run->s,
                                         err);
            if (!rc && o.detailed) {
                run->requests = res; /* kept for the JSON's per-request list */
                run->n_requests = prompts.n;
                res = NULL;
            }
            for (int i = 0; res && i < prompts.n; i++)
                serve_request_result_clear(&res[i]);
            free(res);
            if (rc) {
                fprintf(stderr, "wafer bench serve: %s\n", err);
                serve_prompts_free(&prompts);
                status = 1;
                goto out_curl;
            }
            rep.n_runs++;
            completed_total += run->s.completed;
            serve_report_print_run(stdout, &rep, rep.n_runs - 1);
            fflush(stdout);
            serve_prompts_free(&prompts);
        }
    }
    if (rep.n_runs > 1)
        serve_report_print_sweep(stdout, &rep);
    if (quality) {
        if (run_quality(&o, cfg, quality, err)) {
            fprintf(stderr, "wafer bench serve: quality check: %s\n", err);
            status = 1;
            goto out_curl;
        }
        rep.quality = quality;
        serve_report_print_quality(stdout, quality);
        for (int i = 0; i < quality->cases.n; i++)
            completed_total += quality->results[i].outcome == SERVE_OK;
    }
    fflush(stdout);
    if (o.json_path) {
        if (serve_report_write_json(&rep, o.json_path, err)) {
            fprintf(stderr, "wafer bench serve: %s\n", err);
            status = 1;
        } else {
            fprintf(stderr, "wrote %s\n", o.json_path);
        }
    }
    if (o.html_path) {
        if (serve_report_write_html(&rep, o.html_path, err)) {
            fprintf(stderr, "wafer bench serve: %s\n", err);
            status = 1;
        } else {
            fprintf(stderr, "wrote %s\n", o.html_path);
        }
    }
    if (!status && completed_total == 0 && (rep.n_runs > 0 || quality)) {
        fprintf(stderr, "wafer bench serve: no request completed; is the server at %s up? (see the errors above)\n",
                endpoint_url);
        status = 1;
    }
out_curl:
    curl_global_cleanup();
out:
    for (int i = 0; i < rep.n_runs; i++) {
        serve_run_summary_deinit(&rep.runs[i].s);
        for (int k = 0; k < rep.runs[i].n_requests; k++)
            serve_request_result_clear(&rep.runs[i].requests[k]);
        free(rep.runs[i].requests);
    }
    free(rep.runs);
    run_quality_free(quality);
    serve_prompts_free(&dataset);
    free(endpoint_url);
    free(base_url);
    free(model);
    return status;
}
