/*
 * batch: many prompts at once with libwafer-client, two ways on one client:
 *   1. wafer_batch_generate: the library sends them concurrently (4 at a time here) and returns the results
 *      in the prompts' order, each with its own status;
 *   2. one thread per prompt, each calling wafer_generate on the same client (the client is thread-safe).
 *
 *   build/examples/batch URL PROMPT...
 *
 * Prints "i: text" per prompt for each way (greedy, 12 tokens: both ways print the same lines).
 */
#include <wafer/client.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct job {
    struct wafer_client *c;
    const struct wafer_params *p;
    const char *prompt;
    struct wafer_result r;
};

static void *run_job(void *arg)
{
    struct job *j = arg;
    wafer_generate(j->c, j->prompt, j->p, &j->r);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: batch URL PROMPT...\n");
        return 2;
    }
    struct wafer_client_options o;
    wafer_client_options_default(&o);
    o.base_url = argv[1];
    char err[WAFER_ERR_MAX];
    struct wafer_client *c = wafer_client_create(&o, err);
    if (!c) {
        fprintf(stderr, "batch: %s\n", err);
        return 2;
    }
    struct wafer_params p;
    wafer_params_default(&p);
    p.max_tokens = 12;
    p.temperature = 0;
    int n = argc - 2, failed = 0;
    const char *const *prompts = (const char *const *)argv + 2;

    struct wafer_result *rs = calloc((size_t)n, sizeof *rs);
    if (!rs)
        return 1;
    wafer_batch_generate(c, prompts, n, &p, 4, rs);
    printf("batch_generate:\n");
    for (int i = 0; i < n; i++) {
        if (rs[i].status == WAFER_OK)
            printf("%d: %s\n", i, rs[i].text);
        else
            printf("%d: error: %s\n", i, rs[i].error), failed++;
        wafer_result_free(&rs[i]);
    }
    free(rs);

    struct job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    if (!jobs || !tids)
        return 1;
    for (int i = 0; i < n; i++) {
        jobs[i] = (struct job){.c = c, .p = &p, .prompt = prompts[i]};
        pthread_create(&tids[i], NULL, run_job, &jobs[i]);
    }
    printf("threads:\n");
    for (int i = 0; i < n; i++) {
        pthread_join(tids[i], NULL);
        if (jobs[i].r.status == WAFER_OK)
            printf("%d: %s\n", i, jobs[i].r.text);
        else
            printf("%d: error: %s\n", i, jobs[i].r.error), failed++;
        wafer_result_free(&jobs[i].r);
    }
    free(jobs);
    free(tids);
    wafer_client_destroy(c);
    return failed ? 1 : 0;
}
