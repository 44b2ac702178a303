/*
 * threadpool: the engine's compute workers. Persistent pthreads spin briefly then sleep between jobs; a job
 * is one function run by every thread with its index ith in [0, nth) (the caller is thread 0), and kernels
 * split rows by ith/nth. threadpool_barrier() inside a job separates operations that depend on each other,
 * so one whole forward pass is one job with a cheap barrier between ops, not a fork/join per op.
 */
#ifndef WAFER_ENGINE_THREADPOOL_H
#define WAFER_ENGINE_THREADPOOL_H

#include <stdint.h>

struct threadpool;

/* n_threads in total (including the caller); <= 0 means the number of online CPUs. NULL on failure.
 * Caller frees with threadpool_destroy. */
struct threadpool *threadpool_create(int n_threads);
void threadpool_destroy(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);

/* Runs fn(ctx, ith, nth) on every thread and returns when all have returned. Not reentrant: one job at a
 * time, called from one thread. */
void threadpool_run(struct threadpool *tp, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* Waits until every thread of the running job has reached the barrier. Only valid inside a job; every thread
 * must call it the same number of times. */
void threadpool_barrier(struct threadpool *tp);

/* Rows [*r0, *r1) of n that thread ith of nth handles (contiguous, sizes differ by at most one). */
void threadpool_split(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1);

/* Number of online CPUs. */
int threadpool_cpu_count(void);

#endif
