/*
 * store_common: what both stores (store_sqlite.c, store_redis.c) and the front end (jobs.c) share: status
 * names, ids, freeing records, the text of a result's error line. It sits below jobs.c, which opens the
 * stores, so no two files of the layer call each other in a circle.
 */
#include "jobs/jobs.h"
#include "jobs/store.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static const char *const jobs_status_names[JOBS_STATUS_COUNT] = {
    [JOBS_VALIDATING] = "validating", [JOBS_FAILED] = "failed",       [JOBS_IN_PROGRESS] = "in_progress",
    [JOBS_FINALIZING] = "finalizing", [JOBS_COMPLETED] = "completed", [JOBS_EXPIRED] = "expired",
    [JOBS_CANCELLING] = "cancelling", [JOBS_CANCELLED] = "cancelled",
};

const char *jobs_status_name(enum jobs_status st)
{
    return (unsigned)st < JOBS_STATUS_COUNT ? jobs_status_names[st] : "unknown";
}

int jobs_status_parse(const char *name)
{
    for (int i = 0; i < JOBS_STATUS_COUNT; i++)
        if (name && !strcmp(name, jobs_status_names[i]))
            return i;
    return -1;
}

void jobs_id_make(char *buf, size_t size, const char *prefix)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        /* getrandom on Linux >= 3.17 does not fail for <= 256 bytes; fall back to the clock all the same */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid() << 40;
        for (size_t i = 0; i < sizeof r; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            r[i] = (unsigned char)x;
        }
    }
    size_t p = (size_t)snprintf(buf, size, "%s", prefix);
    for (size_t i = 0; i < sizeof r && p + 1 < size; i++)
        buf[p++] = alnum[r[i] % 62];
    buf[p < size ? p : size - 1] = 0;
}

void jobs_batch_rec_deinit(struct jobs_batch_rec *r)
{
    free(r->metadata);
    r->metadata = NULL;
}

void jobs_batch_rec_free_array(struct jobs_batch_rec *r, int n)
{
    for (int i = 0; r && i < n; i++)
        jobs_batch_rec_deinit(&r[i]);
    free(r);
}

void jobs_line_deinit(struct jobs_line *l)
{
    free(l->custom_id);
    free(l->body);
    l->custom_id = l->body = NULL;
}

/* Deterministic per (batch, line), so a line computed twice gets the same id. */
void jobs_request_line_id(char *buf, size_t size, const char *batch_id, int64_t idx)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = batch_id; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(buf, size, "batch_req_%016llx%08llx", (unsigned long long)h, (unsigned long long)idx & 0xffffffffull);
}

char *jobs_result_error_text(const char *batch_id, int64_t idx, const char *custom_id, const char *code,
                             const char *message)
{
    char id[64];
    jobs_request_line_id(id, sizeof id, batch_id, idx);
    json_t *j = json_pack("{sssssns{ssss}}", "id", id, "custom_id", custom_id, "response", "error", "code", code,
                          "message", message);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}
