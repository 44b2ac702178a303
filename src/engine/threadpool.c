/*
 * threadpool: persistent workers for the engine's kernels.
 *
 * A job is published by bumping an atomic generation counter; workers spin on it for a short while (a
 * decode step launches one job every few milliseconds, so spinning avoids a futex wake-up per token) and
 * then sleep on a condition variable. The barrier is a sense-reversing counter, spin-only, because it is
 * crossed many times per job (between ops of a forward pass) and every participant is busy anyway.
 */
#include "engine/threadpool.h"

#include "core/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include <stdbool.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define TP_SPIN_ITERS 200000

struct threadpool {
    int n;
    pthread_t *threads; /* [n - 1]: workers 1..n-1 */
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    atomic_uint generation; /* bumped per job */
    atomic_int pending;     /* workers still running the current job */
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* barrier */
    atomic_int bar_count;
    atomic_uint bar_phase;
};

struct tp_worker_arg {
    struct threadpool *tp;
    int ith;
};

static inline void tp_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

static void *tp_worker(void *arg)
{
    struct tp_worker_arg a = *(struct tp_worker_arg *)arg;
    free(arg);
    struct threadpool *tp = a.tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&tp->stop, memory_order_acquire)) {
            if (++spins < TP_SPIN_ITERS) {
                tp_pause();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        seen = g;
        tp->fn(tp->ctx, a.ith, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
    }
}

int threadpool_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

struct threadpool *threadpool_create(int n_threads)
{
    if (n_threads <= 0)
        n_threads = threadpool_cpu_count();
    struct threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return NULL;
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    if (!tp->threads)
        goto fail;
    for (int i = 1; i < n_threads; i++) {
        struct tp_worker_arg *a = malloc(sizeof *a);
        if (a) {
            a->tp = tp;
            a->ith = i;
        }
        if (!a || pthread_create(&tp->threads[i - 1], NULL, tp_worker, a) != 0) {
            free(a);
            tp->n = i; /* workers 1..i-1 exist: destroy joins exactly those */
            threadpool_destroy(tp);
            return NULL;
        }
    }
    return tp;
fail:
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp);
    return NULL;
}

void threadpool_destroy(struct threadpool *tp)
{
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++)
        pthread_join(tp->threads[i - 1], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}

int threadpool_size(const struct threadpool *tp) { return tp->n; }

void threadpool_run(struct threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_release);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(ctx, 0, tp->n);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0)
        tp_pause();
}

void threadpool_barrier(struct threadpool *tp)
{
    if (tp->n == 1)
        return;
    unsigned phase = atomic_load_explicit(&tp->bar_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tp->bar_count, 1, memory_order_acq_rel) == tp->n - 1) {
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&tp->bar_phase, 1, memory_order_acq_rel);
        return;
    }
    while (atomic_load_explicit(&tp->bar_phase, memory_order_acquire) == phase)
        tp_pause();
}

void threadpool_split(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1)
{
    int64_t q = n / nth, r = n % nth;
    *r0 = ith * q + (ith < r ? ith : r);
    *r1 = *r0 + q + (ith < r ? 1 : 0);
}
