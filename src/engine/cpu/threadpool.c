/*
 * threadpool: persistent workers for the engine's kernels.
 *
 * Every wait in here (a worker waiting for the next job, a thread waiting at a barrier, the caller waiting
 * for the workers to finish a job) spins for a short time and then sleeps on a futex. Spinning alone is fast
 * on an idle machine but collapses when the cores are shared: a spinning thread holds its core while the
 * thread it waits for is descheduled, so every barrier costs a scheduler time slice (a 5-token prompt on a
 * tiny model took 200-500 ms instead of 1 ms with two busy processes beside it). Sleeping alone costs a
 * futex wake-up per barrier. The spin budget (TP_SPIN_NS) covers the usual imbalance between threads at a
 * barrier and the gap between decode steps on a quiet machine; past it the thread yields its core.
 *
 * The pattern for each wait is the same: a 32-bit word that changes when the wait is over, and a count of
 * sleepers so the waker issues the futex wake syscall only when somebody sleeps. The sleeper increments the
 * count and re-checks the word (both sequentially consistent) before FUTEX_WAIT, and the kernel re-checks
 * it again atomically, so a change can never be missed.
 */
#include "engine/cpu/threadpool.h"

#include "core/clock.h"
#include "core/log.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define TP_SPIN_NS 100000 /* 100 us */

struct tp_word {
    atomic_uint v;
    atomic_int sleepers;
};

struct threadpool {
    int n;
    pthread_t *threads; /* [n - 1]: workers 1..n-1 */
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    struct tp_word generation; /* bumped per job */
    struct tp_word done;       /* bumped when the last worker finishes a job */
    atomic_int pending;        /* workers still running the current job */
    atomic_bool stop;
    /* barrier */
    atomic_int bar_count;
    struct tp_word bar_phase;
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

/* Returns once w->v != old (or stop is set, when stop is not NULL). */
static void tp_wait(struct tp_word *w, unsigned old, const atomic_bool *stop)
{
    int64_t t_end = 0;
    for (unsigned spins = 0;; spins++) {
        if (atomic_load_explicit(&w->v, memory_order_acquire) != old)
            return;
        if (stop && atomic_load_explicit(stop, memory_order_acquire))
            return;
        if ((spins & 63) == 63) {
            int64_t now = clock_now_ns();
            if (!t_end)
                t_end = now + TP_SPIN_NS;
            else if (now > t_end)
                break;
        }
        tp_pause();
    }
    for (;;) {
        atomic_fetch_add(&w->sleepers, 1);
        if (atomic_load(&w->v) == old && !(stop && atomic_load(stop)))
            syscall(SYS_futex, &w->v, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
        atomic_fetch_sub(&w->sleepers, 1);
        if (atomic_load_explicit(&w->v, memory_order_acquire) != old || (stop && atomic_load(stop)))
            return;
    }
}

/* Changes w->v (already done by the caller) visible to sleepers. */
static void tp_wake(struct tp_word *w)
{
    if (atomic_load(&w->sleepers) > 0)
        syscall(SYS_futex, &w->v, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *tp_worker(void *arg)
{
    struct tp_worker_arg a = *(struct tp_worker_arg *)arg;
    free(arg);
    struct threadpool *tp = a.tp;
    unsigned seen = 0;
    for (;;) {
        tp_wait(&tp->generation, seen, &tp->stop);
        if (atomic_load(&tp->stop))
            return NULL;
        seen = atomic_load_explicit(&tp->generation.v, memory_order_acquire);
        tp->fn(tp->ctx, a.ith, tp->n);
        if (atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel) == 1) {
            atomic_fetch_add(&tp->done.v, 1);
            tp_wake(&tp->done);
        }
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
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    if (!tp->threads) {
        free(tp);
        return NULL;
    }
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
}

void threadpool_destroy(struct threadpool *tp)
{
    if (!tp)
        return;
    atomic_store(&tp->stop, true);
    atomic_fetch_add(&tp->generation.v, 1);
    syscall(SYS_futex, &tp->generation.v, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    for (int i = 1; i < tp->n; i++)
        pthread_join(tp->threads[i - 1], NULL);
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
    unsigned done = atomic_load(&tp->done.v);
    atomic_store(&tp->pending, tp->n - 1);
    atomic_fetch_add(&tp->generation.v, 1); /* publishes fn, ctx and pending (seq_cst) */
    tp_wake(&tp->generation);
    fn(ctx, 0, tp->n);
    tp_wait(&tp->done, done, NULL);
}

void threadpool_barrier(struct threadpool *tp)
{
    if (tp->n == 1)
        return;
    unsigned phase = atomic_load_explicit(&tp->bar_phase.v, memory_order_acquire);
    if (atomic_fetch_add_explicit(&tp->bar_count, 1, memory_order_acq_rel) == tp->n - 1) {
        atomic_store_explicit(&tp->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add(&tp->bar_phase.v, 1);
        tp_wake(&tp->bar_phase);
        return;
    }
    tp_wait(&tp->bar_phase, phase, NULL);
}

void threadpool_split(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1)
{
    int64_t q = n / nth, r = n % nth;
    *r0 = ith * q + (ith < r ? ith : r);
    *r1 = *r0 + q + (ith < r ? 1 : 0);
}
