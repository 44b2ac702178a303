/*
 * workpool: one mutex, two FIFO lists (queued, done) and a condition variable for idle workers. Jobs are
 * coarse (a request's preparation, an answer to build: milliseconds to seconds), so one lock is not a point
 * of contention and keeps the ordering argument simple: a job's results are written by its worker before it
 * takes the lock to move the job to the done list, and read by the completing thread after it took the lock
 * to detach that list.
 */
#include "core/workpool.h"

#include "core/err.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define WORKPOOL_MAX_THREADS 64

struct workpool_list {
    struct workpool_job *head, *tail;
};

struct workpool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct workpool_list queued, done;
    int running;   /* jobs a worker is running now */
    int n_queued;
    bool stopping;
    void (*notify)(void *ctx);
    void *ctx;
    pthread_t threads[WORKPOOL_MAX_THREADS];
    int n_threads;
};

static void list_push(struct workpool_list *l, struct workpool_job *j)
{
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

static struct workpool_job *list_pop(struct workpool_list *l)
{
    struct workpool_job *j = l->head;
    if (j) {
        l->head = j->next;
        if (!l->head)
            l->tail = NULL;
        j->next = NULL;
    }
    return j;
}

static void *workpool_worker(void *arg)
{
    struct workpool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->queued.head && !p->stopping)
            pthread_cond_wait(&p->cv, &p->mu);
        struct workpool_job *j = list_pop(&p->queued);
        if (!j)
            break; /* stopping and nothing left to run */
        p->n_queued--;
        p->running++;
        pthread_mutex_unlock(&p->mu);
        j->run(j);
        pthread_mutex_lock(&p->mu);
        p->running--;
        list_push(&p->done, j);
        pthread_mutex_unlock(&p->mu);
        if (p->notify)
            p->notify(p->ctx);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct workpool *workpool_create(int n_threads, void (*notify)(void *ctx), void *ctx, char *err)
{
    if (n_threads < 1 || n_threads > WORKPOOL_MAX_THREADS) {
        err_set(err, ERR_INVALID_ARG, "workpool: %d threads is outside 1..%d", n_threads, WORKPOOL_MAX_THREADS);
        return NULL;
    }
    struct workpool *p = calloc(1, sizeof *p);
    if (!p) {
        err_set(err, ERR_NOMEM, "workpool: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->notify = notify;
    p->ctx = ctx;
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, workpool_worker, p)) {
            err_set(err, ERR_INTERNAL, "workpool: cannot start worker thread %d", i + 1);
            goto fail;
        }
        pthread_setname_np(p->threads[i], "wafer-work");
        p->n_threads++;
    }
    return p;
fail:
    workpool_destroy(p);
    return NULL;
}

void workpool_submit(struct workpool *p, struct workpool_job *j)
{
    pthread_mutex_lock(&p->mu);
    list_push(&p->queued, j);
    p->n_queued++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int workpool_complete(struct workpool *p)
{
    pthread_mutex_lock(&p->mu);
    struct workpool_list done = p->done;
    p->done.head = p->done.tail = NULL;
    pthread_mutex_unlock(&p->mu);
    int n = 0;
    for (struct workpool_job *j; (j = list_pop(&done)) != NULL; n++)
        j->done(j); /* may free j: list_pop already unlinked it */
    return n;
}

int workpool_pending(struct workpool *p)
{
    pthread_mutex_lock(&p->mu);
    int n = p->n_queued + p->running;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void workpool_destroy(struct workpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    workpool_complete(p);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
