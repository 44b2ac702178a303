/*
 * membw: the read-bandwidth probe (see membw.h). It runs on the engine's own thread pool, so the figure it
 * gives is what the decode loop's threads can get. Each pass is one pool job; the time of a pass is from
 * its start until the last thread finished its share, so a slow thread counts. The cores' round trip runs on
 * two threads of its own, pinned, so the figure is one core's line going to another and back.
 */
#include "bench/membw.h"

#include "core/bigmem.h"
#include "core/clock.h"
#include "core/err.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MEMBW_STREAMS 4
#define MEMBW_STEP 1024 /* bytes of one run read before the next (a multiple of 128) */

uint64_t membw_read_scalar(const void *p, size_t n)
{
    const uint64_t *w = p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a0 ^= w[i];
        a1 ^= w[i + 1];
        a2 ^= w[i + 2];
        a3 ^= w[i + 3];
    }
    return a0 ^ a1 ^ a2 ^ a3;
}

uint64_t membw_read(const void *p, size_t n)
{
    static int avx2 = -1;
    if (avx2 < 0)
        avx2 = kernel_cpu_has_avx2();
    return avx2 ? membw_read_avx2(p, n) : membw_read_scalar(p, n);
}

uint64_t membw_read_streams(const void *p, size_t n, int streams)
{
    if (streams <= 1)
        return membw_read(p, n);
    const uint8_t *b = p;
    uint64_t sum = 0;
    size_t q = n / (size_t)streams / MEMBW_STEP * MEMBW_STEP; /* bytes per run; the rest is read after */
    for (size_t off = 0; off < q; off += MEMBW_STEP)
        for (int k = 0; k < streams; k++)
            sum ^= membw_read(b + (size_t)k * q + off, MEMBW_STEP);
    return sum ^ membw_read(b + (size_t)streams * q, n - (size_t)streams * q);
}

const char *membw_loads_name(void) { return kernel_cpu_has_avx2() ? "AVX2" : "scalar"; }

struct membw_job {
    uint8_t *buf;
    size_t bytes;
    bool fill;                 /* first job: write the pages instead of reading them */
    int streams;               /* runs each thread reads side by side (1: its share front to back) */
    _Atomic uint64_t checksum; /* keeps the reads alive */
};

static void membw_job_fn(void *ctx, int ith, int nth)
{
    struct membw_job *j = ctx;
    int64_t c0, c1; /* in 4 KiB pages */
    threadpool_split((int64_t)(j->bytes / 4096), ith, nth, &c0, &c1);
    uint8_t *p = j->buf + (size_t)c0 * 4096;
    size_t n = (size_t)(c1 - c0) * 4096;
    if (j->fill) {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = (uint64_t)(p + i) * 0x9E3779B97F4A7C15ull;
            memcpy(p + i, &v, 8);
        }
        return;
    }
    atomic_fetch_xor_explicit(&j->checksum, membw_read_streams(p, n, j->streams), memory_order_relaxed);
}

static int membw_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct membw_probe {
    struct membw_job j;
    struct threadpool *tp;
};

struct membw_probe *membw_probe_create(size_t bytes, int n_threads, char *err)
{
    if (bytes == 0)
        bytes = (size_t)1 << 30;
    bytes = (bytes + 4095) & ~(size_t)4095;
    struct membw_probe *p = calloc(1, sizeof *p);
    if (!p)
        goto fail;
    p->j.bytes = bytes;
    p->j.buf = bigmem_alloc(bytes); /* huge pages, as the weights have (gguf_open_mem) */
    p->tp = threadpool_create(n_threads);
    if (!p->j.buf || !p->tp)
        goto fail;
    p->j.fill = true;
    p->j.streams = 1;
    threadpool_run(p->tp, membw_job_fn, &p->j);
    p->j.fill = false;
    threadpool_run(p->tp, membw_job_fn, &p->j); /* warm-up pass: threads awake, TLB and prefetchers settled */
    return p;
fail:
    err_set(err, ERR_NOMEM, "membw: cannot allocate a %zu MiB buffer", bytes >> 20);
    membw_probe_destroy(p);
    return NULL;
}

void membw_probe_destroy(struct membw_probe *p)
{
    if (!p)
        return;
    /* the checksum must be used or the reads could be dropped; a fill of nonzero words never XORs to a
     * value worth reporting, so it only goes through a volatile sink */
    volatile uint64_t sink = atomic_load(&p->j.checksum);
    (void)sink;
    threadpool_destroy(p->tp);
    if (p->j.buf)
        bigmem_free(p->j.buf, p->j.bytes);
    free(p);
}

int membw_probe_run(struct membw_probe *p, int passes, struct membw_result *out, char *err)
{
    if (passes <= 0)
        passes = 5;
    if (passes > 1000)
        return err_set(err, ERR_INVALID_ARG, "membw: %d passes is more than the 1000 allowed", passes);
    double *gbs = malloc((size_t)passes * sizeof *gbs);
    if (!gbs)
        return err_set(err, ERR_NOMEM, "membw: out of memory");
    /* Each pass reads the buffer in both layouts and counts the faster: front to back, and as MEMBW_STREAMS
     * runs side by side per thread, which is how the F16 decode gemv reads (gemv_avx2.c) and which some CPUs
     * serve faster (Zen 5 VM: ~57 against ~62-69 GB/s), so a kernel's share of this figure is a share of the
     * best the machine gave, not of one access pattern. */
    for (int i = 0; i < passes; i++) {
        gbs[i] = 0;
        for (int layout = 0; layout < 2; layout++) {
            p->j.streams = layout ? MEMBW_STREAMS : 1;
            double t0 = clock_now_s();
            threadpool_run(p->tp, membw_job_fn, &p->j);
            double g = (double)p->j.bytes / (clock_now_s() - t0) / 1e9;
            if (g > gbs[i])
                gbs[i] = g;
        }
    }
    qsort(gbs, (size_t)passes, sizeof *gbs, membw_cmp_double);
    out->median_gbs = passes % 2 ? gbs[passes / 2] : 0.5 * (gbs[passes / 2 - 1] + gbs[passes / 2]);
    out->best_gbs = gbs[passes - 1];
    out->worst_gbs = gbs[0];
    out->passes = passes;
    out->threads = threadpool_size(p->tp);
    out->bytes = p->j.bytes;
    free(gbs);
    return 0;
}

int membw_measure(size_t bytes, int passes, int n_threads, struct membw_result *out, char *err)
{
    if (passes > 1000)
        return err_set(err, ERR_INVALID_ARG, "membw: %d passes is more than the 1000 allowed", passes);
    struct membw_probe *p = membw_probe_create(bytes, n_threads, err);
    if (!p)
        return ERR_NOMEM;
    int rc = membw_probe_run(p, passes, out, err);
    membw_probe_destroy(p);
    return rc;
}

/* ---- a cache line between two cores (membw_round_trip_ns) ---- */

#define MEMBW_RTT_RUNS 5

struct membw_rtt {
    _Alignas(64) atomic_uint line; /* the line handed back and forth: odd from the pinger, even from the echo */
    _Alignas(64) int cpu[2];
    int rounds;
    atomic_int pinned;             /* threads that pinned themselves */
    atomic_int ready;              /* threads that tried */
    double ns[MEMBW_RTT_RUNS];
};

static bool membw_pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s) == 0;
}

/* Both threads: pin, then wait until both tried; true when both are pinned. Otherwise neither plays (the
 * caller reports it): two unpinned threads could share one CPU, and each spin would last a time slice. */
static bool membw_rtt_start(struct membw_rtt *r, int who)
{
    if (membw_pin(r->cpu[who]))
        atomic_fetch_add(&r->pinned, 1);
    atomic_fetch_add(&r->ready, 1);
    while (atomic_load(&r->ready) < 2)
        sched_yield();
    return atomic_load(&r->pinned) == 2;
}

static void *membw_rtt_echo(void *arg)
{
    struct membw_rtt *r = arg;
    if (!membw_rtt_start(r, 1))
        return NULL;
    unsigned n = (unsigned)r->rounds * MEMBW_RTT_RUNS;
    for (unsigned i = 0; i < n; i++) {
        while (atomic_load_explicit(&r->line, memory_order_acquire) != 2 * i + 1)
            ;
        atomic_store_explicit(&r->line, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* The pinger's runs, each timed. */
static void membw_rtt_pings(struct membw_rtt *r)
{
    unsigned i = 0;
    for (int run = 0; run < MEMBW_RTT_RUNS; run++) {
        int64_t t0 = clock_now_ns();
        for (int k = 0; k < r->rounds; k++, i++) {
            atomic_store_explicit(&r->line, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&r->line, memory_order_acquire) != 2 * i + 2)
                ;
        }
        r->ns[run] = (double)(clock_now_ns() - t0) / r->rounds;
    }
}

static void *membw_rtt_ping(void *arg)
{
    struct membw_rtt *r = arg;
    if (membw_rtt_start(r, 0))
        membw_rtt_pings(r);
    return NULL;
}

int membw_round_trip_ns(int rounds, double *ns, char *err)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return err_set(err, ERR_INTERNAL, "cannot read this process's CPUs");
    struct membw_rtt *r = aligned_alloc(64, sizeof *r);
    if (!r)
        return err_set(err, ERR_NOMEM, "out of memory");
    memset(r, 0, sizeof *r);
    r->rounds = rounds > 0 ? rounds : 20000;
    int found = 0;
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
        if (CPU_ISSET(c, &allowed))
            r->cpu[found++] = c;
    int rc = 0;
    if (found < 2) {
        rc = err_set(err, ERR_INVALID_ARG, "a round trip between cores needs two CPUs; this process may use one");
        goto out;
    }
    pthread_t t[2];
    if (pthread_create(&t[1], NULL, membw_rtt_echo, r) != 0) {
        rc = err_set(err, ERR_INTERNAL, "cannot start a thread");
        goto out;
    }
    if (pthread_create(&t[0], NULL, membw_rtt_ping, r) != 0) {
        atomic_fetch_add(&r->ready, 1); /* the echo's partner will not come: let it see two not pinned */
        pthread_join(t[1], NULL);
        rc = err_set(err, ERR_INTERNAL, "cannot start a thread");
        goto out;
    }
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    if (atomic_load(&r->pinned) < 2) {
        rc = err_set(err, ERR_INTERNAL, "cannot pin a thread to CPU %d or %d", r->cpu[0], r->cpu[1]);
        goto out;
    }
    qsort(r->ns, MEMBW_RTT_RUNS, sizeof r->ns[0], membw_cmp_double);
    *ns = r->ns[MEMBW_RTT_RUNS / 2];
out:
    free(r);
    return rc;
}
